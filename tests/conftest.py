"""Shared fixtures: tiny hand-made MIND splits (no downloads, no shared data needed)."""

from __future__ import annotations

import os
import random
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
import torch

from privaterec.data.records import Impression, MindSplit, NewsRecord

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TEST_SEED = int(os.environ.get("PRIVATEREC_TEST_SEED", "0"))
"""Seed of the global RNGs before every test; ``PRIVATEREC_TEST_SEED=N pytest`` runs the
suite from other draws, which finds tests that pass only by luck of the seed."""


@pytest.fixture(autouse=True)
def _seed_global_rngs() -> None:
    """Every test starts from the same global RNG state (torch, numpy, random).

    A test's outcome must not depend on which tests ran before it (or on -k / -x / xdist
    order). Tests that need other draws seed their own generators; module fixtures that seed
    again run after this one and take precedence.
    """
    random.seed(TEST_SEED)
    np.random.seed(TEST_SEED)
    torch.manual_seed(TEST_SEED)


def make_news(n: int) -> dict[str, NewsRecord]:
    topics = ["sports", "finance", "music"]
    return {f"N{i}": NewsRecord(f"N{i}", topics[i % 3], f"{topics[i % 3]}-sub",
                                f"{topics[i % 3]} headline number {i}", f"abstract {i}")
            for i in range(1, n + 1)}


@pytest.fixture
def tiny_split() -> MindSplit:
    """Three users, five impressions, news N1..N12."""
    news = make_news(12)
    t0 = datetime(2019, 11, 11, 9, 0, 0)
    rows = [
        ("1", "U1", 0, ("N1", "N2"), ("N3", "N4", "N5"), (1, 0, 0)),
        ("2", "U1", 1, ("N1", "N2"), ("N6", "N7"), (0, 1)),
        ("3", "U2", 2, (), ("N8", "N9", "N10", "N11"), (1, 1, 0, 0)),
        ("4", "U3", 3, ("N4",), ("N12", "N1"), (1, 1)),  # no non-clicked: skipped
        ("5", "U2", 4, ("N3",), ("N5", "N6"), (0, 1)),
    ]
    behaviors = [Impression(i, u, t0 + timedelta(hours=h), hist, cands, labels)
                 for i, u, h, hist, cands, labels in rows]
    return MindSplit(news=news, behaviors=behaviors)


@pytest.fixture
def one_thread():
    """One intra-op thread: on two cores shared with other jobs, two threads make tiny
    kernels up to 100x slower (spinning workers); results do not depend on it. Modules of
    tiny models use it for every test (``pytestmark = pytest.mark.usefixtures(...)``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
