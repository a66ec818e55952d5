"""The API reference is generated from the docstrings (pdoc) with no broken reference.

The test builds the whole package's reference, as docs/api.md says, and fails on a pdoc
warning, on a link to a page or anchor that does not exist (save the anchors pdoc links to
but never renders: private names and inherited members), and on a Sphinx cross-reference
(``:func:`...```) in a docstring that names nothing.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import warnings
from html.parser import HTMLParser
from pathlib import Path
from types import ModuleType

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "privaterec"
ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):`~?([^`<>]+?)`")


def documented_modules() -> list[str]:
    """The package and each of its top-level modules and subpackages (pdoc recurses)."""
    import privaterec

    return ["privaterec"] + [m.name for m in pkgutil.iter_modules(privaterec.__path__,
                                                                    "privaterec.")]


def _resolve_dotted(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for j, part in enumerate(parts[i:], start=i):
            if hasattr(obj, part):
                obj = getattr(obj, part)
            else:  # a dataclass field or annotated attribute, documented but not set
                return j == len(parts) - 1 and part in getattr(obj, "__annotations__", {})
        return True
    return False


def resolves(name: str, module: ModuleType) -> bool:
    """Whether a docstring's cross-reference ``name`` names something, from ``module``."""
    if name.startswith("."):
        package = (module.__name__ if module.__file__ and module.__file__.endswith("__init__.py")
                   else module.__name__.rpartition(".")[0])
        return _resolve_dotted(importlib.util.resolve_name(name, package))
    if name.startswith("privaterec."):
        return _resolve_dotted(name)
    head, _, rest = name.partition(".")
    names = vars(module)
    if head in names:
        obj = names[head]
        for part in rest.split(".") if rest else []:
            if not hasattr(obj, part):
                return part in getattr(obj, "__annotations__", {})
            obj = getattr(obj, part)
        return True
    # a member of one of the module's classes (``:meth:`update``` in a class docstring)
    if any(isinstance(v, type) and v.__module__ == module.__name__
           and (hasattr(v, head) or head in getattr(v, "__annotations__", {}))
           for v in names.values()):
        return True
    return _resolve_dotted(name)


def docstrings(path: Path) -> list[str]:
    """Module, class, function and attribute docstrings of one file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                found.append(doc)
        elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
              and isinstance(node.value.value, str)):
            found.append(node.value.value)
    return found


@pytest.mark.slow
def test_docstring_cross_references_resolve():
    broken = []
    for path in sorted(SRC.rglob("*.py")):
        name = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
        name = name.removesuffix(".__init__")
        module = importlib.import_module(name)
        broken += [(name, ref) for doc in set(docstrings(path)) for ref in ROLE.findall(doc)
                   if not resolves(ref.strip(), module)]
    assert not broken, sorted(set(broken))


def test_the_resolver_finds_a_broken_reference():
    import privaterec.privacy.report as report

    assert resolves("~privaterec.privacy.ledger.PrivacyLedger.to_dict".lstrip("~"), report)
    assert resolves("format_privacy_report", report)
    assert resolves(".ledger", report)
    assert not resolves("PrivacyLedger.to_dict", report)  # not imported there by that name
    assert not resolves("privaterec.privacy.ledger.PrivacyLedger.no_such_method", report)
    # a reference split over two lines is not linked by pdoc: it counts as broken
    (split,) = ROLE.findall(":func:`privaterec.\n  api.train`")
    assert not resolves(split, report)


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if key == "href" and value:
                self.hrefs.append(value)
            if key == "id" and value:
                self.ids.add(value)


@pytest.mark.slow
def test_api_reference_builds_without_warnings_or_broken_links(tmp_path):
    import pdoc
    import pdoc.render

    pdoc.render.configure(docformat="numpy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(*documented_modules(), output_directory=tmp_path)
    # pdoc's own warnings (an import error, a docstring it cannot parse, a duplicate module),
    # not the deprecations of the dependencies it imports
    assert not [str(w.message) for w in caught if "pdoc" in Path(w.filename).parts
                or "privaterec" in str(w.message)]
    pages = {p.relative_to(tmp_path).as_posix(): p for p in tmp_path.rglob("*.html")}
    assert "privaterec.html" in pages and "privaterec/api.html" in pages
    parsed = {}
    for name, page in pages.items():
        links = _Links()
        links.feed(page.read_text())
        parsed[name] = links
    broken = []
    for name, links in parsed.items():
        for href in links.hrefs:
            if re.match(r"[a-z]+:", href):  # http(s), mailto: outside the site
                continue
            target, _, anchor = href.partition("#")
            if target and not target.endswith(".html"):
                continue  # a relative link inside a third-party docstring (pydantic's)
            page = _normalise((Path(name).parent / target).as_posix() if target else name)
            if page not in parsed:
                broken.append((name, href))
            elif anchor and anchor not in parsed[page].ids and not _undocumented(page, anchor):
                broken.append((name, href))
    assert not broken, broken[:20]


def _undocumented(page: str, anchor: str) -> bool:
    """Anchors pdoc links to but does not render, by design: a private name (``_Device``, a
    private base class), or an inherited member (``Recommender.state_dict`` from
    ``torch.nn.Module``; ``FedNewsRec.resolve`` from ``ClientMethod``, whose own page documents
    it)."""
    if any(part.startswith("_") for part in anchor.split(".")):
        return True
    owner, _, member = anchor.rpartition(".")
    if not owner:
        return False
    module = importlib.import_module(page.removesuffix(".html").replace("/", "."))
    cls = getattr(module, owner.split(".")[0], None)
    for part in owner.split(".")[1:]:
        cls = getattr(cls, part, None)
    if not isinstance(cls, type):
        return False
    own = vars(cls)
    return member not in own and member not in own.get("__annotations__", {})


def _normalise(path: str) -> str:
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return "/".join(parts)
