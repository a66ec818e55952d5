"""User-facing text points only to documentation inside the repository (issue 17)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "privaterec"


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in doc.read_text().splitlines()
            if line.startswith("#")}


def _message_strings(path: Path) -> list[str]:
    """String constants of a module that are not docstrings (messages, notes, reports).

    A string standing alone as a statement is documentation (module, class, function or
    attribute docstring); every other string may reach a user.
    """
    tree = ast.parse(path.read_text())
    docstrings = {id(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def test_messages_do_not_cite_the_design_notes():
    # "DESIGN section 4 erratum 2" meant nothing to a pip user
    offenders = [(str(p.relative_to(ROOT)), s[:80]) for p in sorted(SRC.rglob("*.py"))
                 for s in _message_strings(p) if "DESIGN" in s]
    assert not offenders, offenders


def test_links_to_docs_privacy_resolve():
    anchors = _anchors(ROOT / "docs" / "privacy.md")
    texts = [s for p in SRC.rglob("*.py") for s in _message_strings(p)]
    texts += [(ROOT / "README.md").read_text()]
    texts += [p.read_text() for p in (ROOT / "docs").glob("*.md")]
    linked = {m for t in texts for m in re.findall(r"privacy\.md#([\w\-]+)", t)}
    assert linked, "no message links to a docs/privacy.md section"
    assert linked <= anchors, sorted(linked - anchors)


def test_readme_links_stay_inside_the_repository():
    readme = (ROOT / "README.md").read_text()
    assert "../shared" not in readme.replace("`../shared/data`", "")
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target
    assert "docs/architecture.md" in readme and "docs/privacy.md" in readme
