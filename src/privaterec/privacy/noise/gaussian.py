"""The Gaussian mechanism, analytic calibration (Balle & Wang, ICML 2018): (ε, δ)-DP."""

from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import torch
from dp_accounting import dp_event, get_epsilon_gaussian
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.privacy_accountant import NeighboringRelation
from torch import Tensor

from privaterec.privacy.formulas import classical_gaussian_sigma, gaussian_sigma
from privaterec.privacy.noise.base import NoiseMechanism


class Gaussian(NoiseMechanism):
    """N(0, σ²) per coordinate, calibrated to the L2 sensitivity at (ε, δ)."""

    name = "gaussian"
    opendp = "make_gaussian"
    norm = "l2"
    pure = False
    parameter = "sigma"
    formula = "analytic Gaussian mechanism (Balle & Wang 2018, Thm 8)"
    note = ("noise N(0, sigma^2) per coordinate (analytic calibration: "
            "docs/privacy.md#gaussian-calibration)")

    def scale(self, *, epsilon: float, delta: float, sensitivity: float) -> float:
        return gaussian_sigma(epsilon=epsilon, delta=delta, sensitivity_l2=sensitivity)

    def epsilon(self, *, scale: float, sensitivity: float, delta: float) -> float:
        return float(get_epsilon_gaussian(scale / sensitivity, delta)) if scale else float("inf")

    def _sample(self, shape: Sequence[int], generator: torch.Generator,
                device: torch.device) -> Tensor:
        return torch.randn(shape, generator=generator, dtype=torch.float64, device=device)

    def dp_event(self, noise_multiplier: float) -> dp_event.DpEvent:
        return dp_event.GaussianDpEvent(noise_multiplier=noise_multiplier)

    def pld(self, noise_multiplier: float, *, count: int, interval: float,
            sampling_rate: float | None = None) -> pld_lib.PrivacyLossDistribution:
        if sampling_rate is not None:
            # Replace-one, the adjacency of every ledger total (a sampled user's clipped
            # update may change by up to twice the clip).
            return _sampled_gaussian_pld(noise_multiplier, sampling_rate,
                                         interval).self_compose(count)
        # k Gaussian releases with multiplier s compose exactly to one with s/√k.
        return pld_lib.from_gaussian_mechanism(noise_multiplier / math.sqrt(count),
                                               value_discretization_interval=interval)

    def alternatives(self, *, epsilon: float, delta: float,
                     sensitivity: float) -> list[dict[str, Any]]:
        """The classical σ (Dwork & Roth Thm A.1), valid for ε < 1 only."""
        valid = epsilon < 1
        return [{"name": "classical sigma", "value": classical_gaussian_sigma(
                     epsilon=epsilon, delta=delta, sensitivity_l2=sensitivity,
                     allow_invalid=True), "valid": valid,
                 "formula": "S * sqrt(2 ln(1.25/delta)) / epsilon (Dwork & Roth Thm A.1)",
                 "remark": "for comparison only" if valid else
                           "INVALID for epsilon >= 1 (no DP guarantee); for comparison only"}]


@functools.lru_cache(maxsize=256)
def _sampled_gaussian_pld(noise_multiplier: float, sampling_prob: float,
                          interval: float) -> pld_lib.PrivacyLossDistribution:
    """One Poisson-sampled Gaussian release's PLD under replace-one (cached: a report
    composes the same event for many counts; PLDs are immutable)."""
    return pld_lib.from_gaussian_mechanism(
        noise_multiplier, sampling_prob=sampling_prob, value_discretization_interval=interval,
        neighboring_relation=NeighboringRelation.REPLACE_ONE)


MECHANISM = Gaussian()

__all__ = ["Gaussian", "MECHANISM"]
