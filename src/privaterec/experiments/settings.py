"""The demo's training budget and data set, which the paper experiments start from.

Kept below :mod:`privaterec.experiments.demo` and :mod:`privaterec.experiments.common` so that
both read the same values without importing each other.
"""

from __future__ import annotations

from privaterec.data.synth import SynthConfig

DEMO_ROUNDS = 300  # FedAdam/SGD rounds at r = 2% (about 6 passes over the samples)


def demo_synth_config(quick: bool) -> SynthConfig:
    """The embedded default synthetic data set (a smaller one with ``quick``)."""
    return SynthConfig(users=400, news=800, seed=0) if quick else SynthConfig(seed=0)


__all__ = ["DEMO_ROUNDS", "demo_synth_config"]
