"""The package's import layers (docs/architecture.md, "Layers").

Every module of ``src/privaterec`` is parsed with :mod:`ast` and its imports collected:
module-level and function-local ones alike (a local import hides a dependency from import
time, not from the design), ``TYPE_CHECKING`` blocks and ``importlib.import_module("...")``
with a literal name included. The checks:

* every module belongs to exactly one declared layer (:data:`LAYERS`), and every declared
  name still exists;
* no import cycle between modules;
* no module imports from a layer above its own, nor breaks a rule of :data:`FORBIDDEN`
  (``models/`` never imports ``privacy/``; ``serving/``, the production server and device
  SDK, never imports the offline evaluation ``eval/``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "privaterec"

# Lowest first. Every layer is whole folders (or top-level modules): no module is declared
# apart from the folder that holds it. A name covers that module, or that package and
# everything below it. The root name covers ``privaterec/__init__`` only. A module may import
# from its own layer and the layers below it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("privaterec.version", "privaterec.errors", "privaterec.validators",
              "privaterec.files")),
    # pure calibration math, the noise mechanisms, randomness sources, ledger, reports
    ("privacy", ("privaterec.privacy",)),
    # the configuration names the mechanisms of privacy/noise/ and checks against them
    ("config", ("privaterec.method_settings", "privaterec.config")),
    ("data", ("privaterec.data",)),
    ("models", ("privaterec.models",)),
    # what a device computes and downloads: its release of one query, the pool's wire
    # format; the offline evaluation simulates the devices with them
    ("device", ("privaterec.ondevice",)),
    ("eval", ("privaterec.eval",)),
    # checkpoints, determinism; centralized training, popularity
    ("training", ("privaterec.runtime", "privaterec.training")),
    ("fed", ("privaterec.fed",)),
    ("recall", ("privaterec.recall",)),
    # train / evaluate a run directory; the end-to-end audit runs the real client updates
    ("orchestration", ("privaterec.runs", "privaterec.audit")),
    ("serving", ("privaterec.serving",)),
    ("experiments", ("privaterec.experiments",)),
    # the only modules that read argv and the environment, and print; the `flwr run` app
    ("apps", ("privaterec.cli", "privaterec.apps")),
    # the public Python API: the package root re-exports it; it imports the layers below
    # inside its functions, so `import privaterec` loads no model code
    ("api", (ROOT, "privaterec.api")),
)

# (importer, imported, why): modules under the first name never import modules under the
# second, whatever their layers.
FORBIDDEN: tuple[tuple[str, str, str], ...] = (
    ("privaterec.models", "privaterec.privacy",
     "models never draw privacy noise: the engines apply the mechanisms "
     "(docs/architecture.md#seams)"),
    ("privaterec.serving", "privaterec.eval",
     "the production server and device SDK do not depend on the offline evaluation"),
)

@dataclass(frozen=True)
class Import:
    """One import of ``target`` (a module of the package) by ``source``, at ``line``."""

    source: str
    target: str
    line: int

    def where(self, src: Path) -> str:
        path = src.joinpath(*self.source.split("."))
        file = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        return f"{file.relative_to(src)}:{self.line}"


def find_modules(src: Path, root: str = ROOT) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` file of package ``root`` under ``src``."""
    modules = {}
    for path in sorted((src / root).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest existing module prefix of dotted ``name`` (``pkg.mod.attr`` → ``pkg.mod``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def find_imports(src: Path, root: str = ROOT) -> tuple[dict[str, Path], list[Import]]:
    """The modules of ``root`` and every import between two of them (self-imports dropped)."""
    modules = find_modules(src, root)
    found: list[Import] = []
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                # ``from pkg import mod`` imports the module pkg.mod when there is one
                names = [f"{base}.{alias.name}" for alias in node.names] or [base]
            elif (isinstance(node, ast.Call) and node.args
                  and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str)
                  and getattr(node.func, "attr", getattr(node.func, "id", None))
                  == "import_module"):
                names = [node.args[0].value]
            for name in names:
                if name == root or name.startswith(root + "."):
                    target = _resolve(name, modules)
                    if target is not None and target != module:
                        found.append(Import(module, target, node.lineno))
    return modules, found


def layer_index(module: str, layers=LAYERS) -> int | None:
    """Index in ``layers`` of the longest declared name covering ``module`` (None: none)."""
    best: tuple[int, int] | None = None
    for index, (_, names) in enumerate(layers):
        for name in names:
            covers = module == name or (name != ROOT and module.startswith(name + "."))
            if covers and (best is None or len(name) > best[0]):
                best = (len(name), index)
    return None if best is None else best[1]


def import_cycles(imports: list[Import]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan), i.e. every set
    of modules that import each other in a cycle."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.source, set()).add(imp.target)
        graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[frozenset[str]] = []

    def visit(node: str) -> None:  # recursion depth <= number of modules (~100)
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _under(module: str, name: str) -> bool:
    return module == name or module.startswith(name + ".")


def layer_violations(imports: list[Import], layers=LAYERS,
                     forbidden=FORBIDDEN) -> list[Import]:
    """Imports from a layer above the importer's, or that a rule of ``forbidden`` names."""
    bad = []
    for imp in imports:
        source, target = layer_index(imp.source, layers), layer_index(imp.target, layers)
        if source is None or target is None:
            continue  # reported by test_every_module_has_a_layer
        if target > source or any(_under(imp.source, a) and _under(imp.target, b)
                                   for a, b, _ in forbidden):
            bad.append(imp)
    return bad


def _describe(imp: Import, src: Path = SRC) -> str:
    names = [name for name, _ in LAYERS]
    source, target = layer_index(imp.source), layer_index(imp.target)
    rules = [why for a, b, why in FORBIDDEN if _under(imp.source, a) and _under(imp.target, b)]
    return (f"{imp.source} ({names[source] if source is not None else '?'}) imports "
            f"{imp.target} ({names[target] if target is not None else '?'}) at "
            f"{imp.where(src)}" + "".join(f" [{why}]" for why in rules))


def _report(imports: list[Import]) -> str:
    return "\n".join(sorted({_describe(i) for i in imports}))


def _cycle_report(cycle: frozenset[str], imports: list[Import]) -> str:
    inside = [i for i in imports if i.source in cycle and i.target in cycle]
    return f"cycle among {sorted(cycle)}:\n{_report(inside)}"


@pytest.fixture(scope="module")
def package() -> tuple[dict[str, Path], list[Import]]:
    return find_imports(SRC)


def test_every_module_has_a_layer_and_every_declared_name_exists(package) -> None:
    modules, _ = package
    undeclared = [m for m in modules if layer_index(m) is None]
    assert not undeclared, (f"declare the layer of {undeclared} in LAYERS "
                            f"(tests/test_import_layers.py) and in docs/architecture.md")
    declared = [name for _, names in LAYERS for name in names]
    assert len(declared) == len(set(declared)), "a name is declared in two layers"
    stale = [name for name in declared if name not in modules]
    assert not stale, f"LAYERS names modules that no longer exist: {stale}"


def test_no_import_cycle(package) -> None:
    _, imports = package
    cycles = import_cycles(imports)
    assert not cycles, "\n".join(_cycle_report(c, imports) for c in cycles)


def test_no_module_imports_from_a_layer_above_its_own(package) -> None:
    _, imports = package
    bad = layer_violations(imports)
    assert not bad, _report(bad)


# --- the checker itself, on a package written for the test ------------------------------

def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_checker_finds_local_relative_and_dynamic_imports_cycles_and_upward_ones(
        tmp_path: Path) -> None:
    _write(tmp_path / ROOT, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from privaterec.high import b  # hidden local import\n",
        "high/__init__.py": "",
        "high/b.py": "from ..low import a\nfrom privaterec.low.a import f as g\n",
        "high/c.py": "import importlib\nm = importlib.import_module('privaterec.high.b')\n",
        "high/d.py": "from privaterec import low\nimport os\n",
    })
    modules, imports = find_imports(tmp_path)
    assert set(modules) == {ROOT, "privaterec.low", "privaterec.low.a", "privaterec.high",
                            "privaterec.high.b", "privaterec.high.c", "privaterec.high.d"}
    edges = {(i.source, i.target, i.line) for i in imports}
    assert edges == {("privaterec.low.a", "privaterec.high.b", 2),
                     ("privaterec.high.b", "privaterec.low.a", 1),
                     ("privaterec.high.b", "privaterec.low.a", 2),
                     ("privaterec.high.c", "privaterec.high.b", 2),
                     ("privaterec.high.d", "privaterec.low", 1)}
    assert import_cycles(imports) == [frozenset({"privaterec.low.a", "privaterec.high.b"})]
    layers = (("low", ("privaterec.low",)), ("high", ("privaterec.high",)))
    assert [(i.source, i.target) for i in layer_violations(imports, layers, ())] == \
        [("privaterec.low.a", "privaterec.high.b")]
    # a forbidden pair is reported whatever the layers
    rule = ("privaterec.high.d", "privaterec.low", "no reason")
    assert [(i.source, i.target) for i in layer_violations(imports, layers, (rule,))] == \
        [("privaterec.high.d", "privaterec.low"), ("privaterec.low.a", "privaterec.high.b")]


def test_layer_of_a_module_is_its_longest_declared_name() -> None:
    names = [name for name, _ in LAYERS]
    assert names[layer_index("privaterec.runs.ranking")] == "orchestration"
    assert names[layer_index("privaterec.audit.runner")] == "orchestration"
    assert names[layer_index("privaterec.privacy.ledger")] == "privacy"
    assert names[layer_index("privaterec.runtime.checkpoint")] == "training"
    assert names[layer_index("privaterec.ondevice.release")] == "device"
    assert names[layer_index("privaterec.serving.store")] == "serving"
    assert names[layer_index(ROOT)] == "api"
    assert names[layer_index("privaterec.version")] == "base"
    assert layer_index("privaterec.somewhere_new") is None  # the root covers itself only


# --- the documented table ---------------------------------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def documented_layers(text: str) -> list[tuple[str, set[str]]]:
    """The rows ``| # | layer | modules | ... |`` of the "Layers" table of docs/architecture.md,
    as (layer, dotted names): ``errors.py`` → ``privaterec.errors``, ``privacy/`` →
    ``privaterec.privacy``, ``__init__.py`` → ``privaterec``."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].isdigit():
            continue
        names = set()
        for path in re.findall(r"`([\w/]+(?:\.py|/))`", cells[2]):
            parts = path.removesuffix("/").removesuffix(".py").split("/")
            names.add(ROOT if parts == ["__init__"] else ".".join([ROOT, *parts]))
        rows.append((cells[1], names))
    return rows


def test_docs_layer_table_is_the_tests() -> None:
    """docs/architecture.md's layer table lists LAYERS, in order, with the same modules."""
    documented = documented_layers(DOC.read_text())
    declared = [(name, set(names)) for name, names in LAYERS]
    assert documented == declared


def test_documented_layers_reads_paths_as_module_names() -> None:
    text = ("| # | layer | modules | what |\n|---|---|---|---|\n"
            "| 0 | base | `__init__.py`, `errors.py` | x |\n"
            "| 1 | mixed | `ondevice/release.py` and `audit/` (text) | `y.py` |\n")
    assert documented_layers(text) == [
        ("base", {ROOT, "privaterec.errors"}),
        ("mixed", {"privaterec.ondevice.release", "privaterec.audit"})]
