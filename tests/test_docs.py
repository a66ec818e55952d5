"""User-facing text points only to documentation inside the repository."""

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
    # the design notes are not in the package: a pip user cannot follow a citation of them
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


def _repository_texts() -> list[tuple[Path, str]]:
    """Every source, test, benchmark script and document of the repository."""
    paths = [*SRC.rglob("*.py"), *(ROOT / "tests").rglob("*.py"),
             *(ROOT / "benchmarks").glob("*.py"), *(ROOT / "docs").glob("*.md"),
             *(ROOT / "benchmarks" / "results").rglob("*.md"),
             ROOT / "README.md", ROOT / "BENCHMARKS.md"]
    return [(p, p.read_text()) for p in sorted(paths)]


def test_nothing_cites_the_design_notes():
    # docstrings and comments too: the design notes are not in the repository
    pattern = re.compile(r"DESIGN\s*(§|section|erratum|errata)")
    offenders = [(str(p.relative_to(ROOT)), i + 1) for p, text in _repository_texts()
                 for i, line in enumerate(text.splitlines()) if pattern.search(line)]
    assert not offenders, offenders


def test_citations_of_the_docs_resolve():
    # "docs/privacy.md#padding-amplification" in a docstring must name a real section
    cited: set[tuple[str, str]] = set()
    for _, text in _repository_texts():
        cited |= set(re.findall(r"docs/(\w+)\.md(?:#([\w\-]+))?", text))
    assert ("privacy", "padding-amplification") in cited
    for doc, anchor in sorted(cited):
        path = ROOT / "docs" / f"{doc}.md"
        assert path.exists(), f"docs/{doc}.md"
        if anchor:
            assert anchor in _anchors(path), f"docs/{doc}.md#{anchor}"


def test_code_and_docs_carry_no_development_history():
    # an issue number or a commit hash means nothing to a reader of the package
    pattern = re.compile(r"\b(issue|session|hole|bug) ?#?\d+|\bcommit [0-9a-f]{7,40}\b", re.I)
    offenders = [(str(p.relative_to(ROOT)), i + 1) for p, text in _repository_texts()
                 if p.name not in ("README.md", "BENCHMARKS.md") and "results" not in p.parts
                 for i, line in enumerate(text.splitlines()) if pattern.search(line)]
    assert not offenders, offenders


def test_benchmarks_open_with_a_summary_whose_links_resolve():
    text = (ROOT / "BENCHMARKS.md").read_text()
    summary = text[text.index("## Summary"):text.index("\n## ", text.index("## Summary") + 3)]
    assert text.index("## Summary") < text.index("\n## ", 0) + 2  # the first section
    assert "| figure | value | command | date |" in summary
    rows = [line for line in summary.splitlines() if line.startswith("| [")]
    assert len(rows) >= 10
    anchors = _anchors(ROOT / "BENCHMARKS.md")
    linked = re.findall(r"\]\(#([^)]+)\)", summary)
    assert len(linked) == len(rows) and set(linked) <= anchors, set(linked) - anchors
