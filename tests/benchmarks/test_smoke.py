"""Every benchmark in ``benchmarks/`` runs end to end with ``--smoke`` (tiny sizes, results
to a temporary directory), so a benchmark that rots fails the suite.

A script still without ``--smoke`` is listed in :data:`PENDING`; its test is skipped with
that reason, and :func:`test_pending_lists_exactly_the_scripts_without_smoke` keeps the list
true (adding ``--smoke`` to a script means removing it from the list).

The smokes run in one subprocess (``smoke_runner.py``: each script as ``python
benchmarks/NAME --smoke`` would run it, the process's state put back between scripts), which
pays the import of torch and privaterec once instead of once per script; every script keeps
its own test, which reports that script's outcome. Under pytest-xdist each test runs its
script alone (a worker cannot know which smokes it will be given).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
RUNNER = Path(__file__).with_name("smoke_runner.py")
TIMEOUT = 600
"""Seconds one script may run (the runner's own limit is the same)."""
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


def _selected_smokes(session: pytest.Session) -> list[str]:
    """The scripts whose smoke test this session runs, in order (none pending or not yet)."""
    names = [item.callspec.params["name"] for item in session.items
             if getattr(item, "originalname", None) == "test_benchmark_smoke"]
    return [name for name in names if name not in PENDING and name not in NOT_YET]


def _run_smokes(names: list[str], workdir: Path) -> dict[str, dict[str, Any]]:
    """Run the scripts' smokes in one ``smoke_runner.py`` subprocess: each one's outcome
    (one the runner never reached says why the runner stopped)."""
    outcomes_file = workdir / "outcomes.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TMPDIR": str(workdir),
           "HOME": str(workdir)}  # caches (~/.cache/privaterec/bench) stay in workdir
    try:
        done = subprocess.run([sys.executable, str(RUNNER), str(outcomes_file), str(workdir),
                               *names], cwd=workdir, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT * len(names) + 120)
        runner = f"runner exit code {done.returncode}: {done.stderr[-3000:]}"
    except subprocess.TimeoutExpired as expired:
        runner = f"runner timed out: {expired.stderr!r}"[-3000:]
    outcomes = json.loads(outcomes_file.read_text()) if outcomes_file.exists() else {}
    return {name: outcomes.get(name, {"ok": False, "results_written": [], "output_tail": "",
                                      "error": f"the runner never reached it; {runner}"})
            for name in names}


@pytest.fixture(scope="module")
def smoke_batch(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The outcomes of one runner over every smoke this session selected (empty under
    pytest-xdist: each test then runs its own)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return {}
    names = _selected_smokes(request.session)
    if not names:
        return {}
    return _run_smokes(names, tmp_path_factory.mktemp("smokes"))


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_smoke(name, smoke_batch, tmp_path):
    if name in PENDING:
        pytest.skip(f"benchmarks/{name} has no --smoke setting yet")
    if name in NOT_YET:
        pytest.skip(f"benchmarks/{name}: {NOT_YET[name]}")
    outcome = smoke_batch.get(name) or _run_smokes([name], tmp_path)[name]
    assert outcome["ok"], (outcome["error"], outcome["output_tail"])
    assert not outcome["results_written"], (
        f"a --smoke run wrote to benchmarks/results: {outcome['results_written']}")
