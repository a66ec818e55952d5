"""Fixtures shared by the model tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def minilm_offline(monkeypatch_module):
    """MiniLM from local files only, on one intra-op thread.

    MiniLM batches in these tests are tiny: one thread avoids thread-barrier stalls (10-100x
    slowdowns measured) when the two cores are shared with other processes.
    """
    monkeypatch_module.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch_module.setenv("TRANSFORMERS_OFFLINE", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
