"""What every benchmark's ``--smoke`` setting shares: tiny data and a throwaway output folder.

``--smoke`` runs a benchmark end to end at the smallest sizes that still exercise its code,
so the test suite (``tests/benchmarks/test_smoke.py``) notices when a benchmark rots. Its
numbers mean nothing and go to a temporary directory, never to ``benchmarks/results``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path


def smoke_dir(name: str) -> Path:
    """A fresh temporary directory for one smoke run's outputs."""
    return Path(tempfile.mkdtemp(prefix=f"privaterec-{name}-smoke-"))


def smoke_data(users: int = 120, news: int = 400, seed: int = 0) -> Path:
    """A tiny synthetic MIND-format data set (``train/``, ``test/``) in a temporary directory."""
    from privaterec.data.synth import SynthConfig, write_synthetic

    out = smoke_dir("data") / "synth"
    write_synthetic(out, SynthConfig(users=users, news=news, seed=seed))
    return out


def smoke_model(**overrides):  # -> privaterec.config.ModelConfig
    """A tiny NRMS (16-d words, 2 heads of 8, titles of 8, histories of 10): seconds per run."""
    from dataclasses import replace

    from privaterec.config import ModelConfig

    return replace(ModelConfig(word_dim=16, num_heads=2, head_dim=8, attention_dim=16,
                               title_len=8, abstract_len=4, history_len=10), **overrides)
