"""Shared fixture of the experiment tests: a tiny synthetic data set."""

from __future__ import annotations

from pathlib import Path

import pytest

from privaterec.data.synth import SynthConfig, write_synthetic


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "data"
    write_synthetic(path, SynthConfig(users=60, news=150, impressions_per_user=2.0,
                                      min_history=5, max_history=15, max_candidates=15, seed=0))
    return path
