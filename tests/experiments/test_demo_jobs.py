"""The demo's job runner: dependencies, priorities, and the same results on 1 or 2 workers."""

from __future__ import annotations

import operator

import pytest

from privaterec.experiments.demo import _Job, _run_jobs


def _jobs() -> list[_Job]:
    return [_Job("a", operator.add, (1, 2), priority=2),
            _Job("b", operator.mul, (3, 4), after=("a",), priority=0),
            _Job("c", operator.sub, (9, 4), priority=1)]


def test_one_worker_runs_in_priority_order_once_dependencies_are_done():
    order = [name for name, _ in _run_jobs(_jobs(), 1)]
    # b has the highest priority but waits for a; c goes first, then a, then b
    assert order == ["c", "a", "b"]


@pytest.mark.parametrize("workers", [1, 2])
def test_every_job_runs_once_with_its_result_after_its_dependencies(workers):
    finished = list(_run_jobs(_jobs(), workers))
    assert dict(finished) == {"a": 3, "b": 12, "c": 5} and len(finished) == 3
    names = [name for name, _ in finished]
    assert names.index("a") < names.index("b")


def test_a_failing_job_raises():
    jobs = [_Job("bad", operator.truediv, (1, 0))]
    with pytest.raises(ZeroDivisionError):
        list(_run_jobs(jobs, 2))
