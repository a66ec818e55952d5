"""The Laplace mechanism: b = Δ₁/ε, pure ε-DP (Dwork & Roth 2014, Thm 3.6)."""

from __future__ import annotations

import functools
import math
from typing import Sequence

import torch
from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.privacy_accountant import NeighboringRelation
from torch import Tensor

from privaterec.privacy.formulas import laplace_scale
from privaterec.privacy.noise.base import NoiseMechanism


class Laplace(NoiseMechanism):
    """Laplace(0, b) per coordinate, calibrated to the L1 sensitivity."""

    name = "laplace"
    opendp = "make_laplace"
    norm = "l1"
    pure = True
    parameter = "b"
    formula = "b = S / epsilon"
    note = "pure epsilon-DP: Laplace(b) noise per coordinate (Dwork & Roth Thm 3.6)"

    def scale(self, *, epsilon: float, delta: float, sensitivity: float) -> float:
        return laplace_scale(epsilon=epsilon, sensitivity_l1=sensitivity)

    def epsilon(self, *, scale: float, sensitivity: float, delta: float = 0.0) -> float:
        return math.inf if scale == 0 else sensitivity / scale

    def _sample(self, shape: Sequence[int], generator: torch.Generator,
                device: torch.device) -> Tensor:
        """E₁ − E₂ with E = −log(1 − U), U ~ Uniform[0, 1) from ``torch.rand`` (the difference
        of two Exp(1) variables is Laplace(0, 1)), in float64 (a float32 inverse-CDF would
        truncate the tail at about 17 scales)."""
        u1 = torch.rand(shape, generator=generator, dtype=torch.float64, device=device)
        u2 = torch.rand(shape, generator=generator, dtype=torch.float64, device=device)
        return torch.log1p(-u2) - torch.log1p(-u1)

    def dp_event(self, noise_multiplier: float) -> dp_event.DpEvent:
        return dp_event.LaplaceDpEvent(noise_multiplier=noise_multiplier)

    def pld(self, noise_multiplier: float, *, count: int, interval: float,
            sampling_rate: float | None = None) -> pld_lib.PrivacyLossDistribution:
        return _laplace_pld(noise_multiplier, sampling_rate, interval).self_compose(count)


@functools.lru_cache(maxsize=256)
def _laplace_pld(noise_multiplier: float, sampling_rate: float | None,
                 interval: float) -> pld_lib.PrivacyLossDistribution:
    """One Laplace release's PLD (cached: a report composes the same event for many counts,
    and building the PLD costs more than composing it; PLDs are immutable)."""
    if sampling_rate is None:
        return pld_lib.from_laplace_mechanism(noise_multiplier,
                                              value_discretization_interval=interval)
    return pld_lib.from_laplace_mechanism(
        noise_multiplier, sampling_prob=sampling_rate, value_discretization_interval=interval,
        neighboring_relation=NeighboringRelation.REPLACE_ONE)


MECHANISM = Laplace()

__all__ = ["Laplace", "MECHANISM"]
