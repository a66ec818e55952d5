"""Every benchmark in ``benchmarks/`` runs end to end with ``--smoke`` (tiny sizes, results
to a temporary directory), so a benchmark that rots fails the suite.

A script still without ``--smoke`` is listed in :data:`PENDING`; its test is skipped with
that reason, and :func:`test_pending_lists_exactly_the_scripts_without_smoke` keeps the list
true (adding ``--smoke`` to a script means removing it from the list).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))

PENDING: frozenset[str] = frozenset()
"""Scripts without a ``--smoke`` setting yet."""

NOT_YET: dict[str, str] = {}
"""Scripts whose ``--smoke`` does not yet meet the rules above, and why."""


def _has_smoke(name: str) -> bool:
    return '"--smoke"' in (BENCHMARKS / name).read_text()


def test_pending_lists_exactly_the_scripts_without_smoke():
    assert PENDING <= set(SCRIPTS), sorted(PENDING - set(SCRIPTS))
    assert {name for name in SCRIPTS if not _has_smoke(name)} == PENDING
    assert set(NOT_YET) <= set(SCRIPTS) - PENDING


def _results_snapshot() -> dict[str, float]:
    results = BENCHMARKS / "results"
    return {str(p.relative_to(results)): p.stat().st_mtime for p in results.rglob("*")
            if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_smoke(name, tmp_path):
    if name in PENDING:
        pytest.skip(f"benchmarks/{name} has no --smoke setting yet")
    if name in NOT_YET:
        pytest.skip(f"benchmarks/{name}: {NOT_YET[name]}")
    before = _results_snapshot()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TMPDIR": str(tmp_path),
           "HOME": str(tmp_path)}  # caches (~/.cache/privaterec/bench) stay in tmp_path
    done = subprocess.run([sys.executable, str(BENCHMARKS / name), "--smoke"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert _results_snapshot() == before, "a --smoke run wrote to benchmarks/results"
