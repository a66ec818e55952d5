"""Adaptive clipping for central DP: the clip follows a quantile of the update norms, privately.

Andrew, Thakkar, McMahan & Ramaswamy, "Differentially Private Learning with Adaptive
Clipping" (NeurIPS 2021), Alg. 1-2 with the geometric update. In round t every sampled
client i clips its update Δ_i to the round's clip C_t and also reports the centred indicator
b_i − ½ ∈ {−½, +½}, b_i = 1[‖Δ_i‖₂ ≤ C_t]. The aggregator releases two Gaussian sums,

* Σ clip(Δ_i, C_t) + N(0, (z_Δ·C_t)² I)   (the update, as in DP-FedAvg), and
* Σ (b_i − ½)      + N(0, σ_b²)           (the count of unclipped clients, centred),

estimates the unclipped fraction b̃ = clamp((Σ(b_i − ½) + N(0, σ_b²)) / (qN) + ½, 0, 1)
and moves the clip geometrically towards the target quantile γ:
C_{t+1} = C_t · exp(−η_C (b̃ − γ)). b̃ and C_{t+1} are post-processing of the release, so
the clip is public server state.

Accounting (the paper's split, checked here for the ledger's adjacency). Divide each coordinate
by its noise scale: one user's contribution becomes (clip(Δ)/(z_Δ C_t), (b − ½)/σ_b) under
unit isotropic noise, a vector of L2 norm at most √(z_Δ⁻² + (2σ_b)⁻²) — because the
indicator is centred, ±½ — around the origin, where an absent user sits. That is exactly
DP-FedAvg's release with noise multiplier z, each contribution in a ball of radius 1/z,

    z⁻² = z_Δ⁻² + (2σ_b)⁻²,   i.e.   z_Δ = (z⁻² − (2σ_b)⁻²)^(−½),

for add/remove-one **and** for replace-one (the ledger's adjacency: two contributions in that
ball differ by at most 2/z, the update by 2C_t and the indicator by 1, and
``dp_accounting``'s replace-one Poisson-sampled Gaussian assumes exactly contributions in a
ball centred on the absent user). So ``--target-epsilon`` calibrates z as for a fixed clip
and the run's ε is unchanged; the indicator's share of the budget is paid by z_Δ > z. The
centring matters under Poisson sampling: uncentred bits {0, 1} would put a contribution up
to √(z_Δ⁻² + σ_b⁻²) from the origin. A split needs σ_b > z/2 (else the indicator alone
spends more than z allows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from privaterec.errors import ConfigError
from privaterec.privacy.central_accounting import central_round_event
from privaterec.privacy.events import PrivacyEvent
from privaterec.validators import check_adaptive_clip, check_in

COUNT_STDDEV_PER_CLIENT = 0.05
"""σ_b's default: the expected number of clients per round m / 20 (the paper's choice)."""

DEFAULT_CLIP_LR = 0.2
"""η_C of DP-FedAvg's adaptive clipping: the paper's learning rate of the geometric update
(Andrew et al., NeurIPS 2021)."""


def update_noise_multiplier(*, noise_multiplier: float, count_stddev: float) -> float:
    """z_Δ = (z⁻² − (2σ_b)⁻²)^(−½): the update's noise multiplier when the indicator count
    gets noise σ_b and the pair must equal one Gaussian release of multiplier z.

    Raises
    ------
    ConfigError
        If σ_b ≤ z/2 (no split exists: the indicator alone would exceed the budget).
    """
    check_in(noise_multiplier, "noise_multiplier", 0, math.inf, "a finite number > 0",
             open_low=True)
    check_in(count_stddev, "clip_count_stddev", 0, math.inf, "a finite number > 0",
             open_low=True)
    rest = noise_multiplier ** -2 - (2 * count_stddev) ** -2
    if not count_stddev > noise_multiplier / 2 or rest <= 0:
        raise ConfigError(f"adaptive clipping: the noise on the count of unclipped clients "
                          f"sigma_b = {count_stddev:g} ('fed.settings.clip_count_stddev', "
                          f"--clip-count-stddev) must exceed z/2 = {noise_multiplier / 2:g} for "
                          f"noise multiplier z = {noise_multiplier:g}: the count alone would "
                          f"spend the whole budget; pass a larger --clip-count-stddev (the "
                          f"paper's default is the expected clients per round / 20)")
    return rest ** -0.5


def equivalent_noise_multiplier(*, update_noise_multiplier: float,
                                count_stddev: float) -> float:
    """z = (z_Δ⁻² + (2σ_b)⁻²)^(−½): the single Gaussian release the pair is equivalent to
    (the inverse of :func:`update_noise_multiplier`)."""
    return (update_noise_multiplier ** -2 + (2 * count_stddev) ** -2) ** -0.5


def clip_indicators(updates: torch.Tensor, clip: float) -> torch.Tensor:
    """The clients' centred indicators b_i − ½, ``Tensor[m]`` float64 of ±½.

    Parameters
    ----------
    updates:
        ``Tensor[m, D]``, the clients' updates before clipping.
    clip:
        C_t; b_i = 1 when ‖Δ_i‖₂ ≤ C_t (the update passes the L2 clip unchanged, except
        within the clip's relative margin 2^−22 of C_t, where it is scaled by at most that).
    """
    norms = torch.linalg.vector_norm(updates, ord=2, dim=-1)
    return (norms <= clip).to(torch.float64) - 0.5


@dataclass(frozen=True, kw_only=True)
class AdaptiveClipping:
    """The public settings of adaptive clipping (module docstring).

    Attributes
    ----------
    target_quantile: γ, 0 < γ < 1. learning_rate: η_C > 0.
    count_stddev: σ_b; ``None``: the expected clients per round m / 20.
    """

    target_quantile: float
    learning_rate: float = DEFAULT_CLIP_LR
    count_stddev: float | None = None

    def __post_init__(self) -> None:
        check_adaptive_clip(adaptive_clip_quantile=self.target_quantile,
                            clip_lr=self.learning_rate, clip_count_stddev=self.count_stddev)

    def count_noise(self, expected_clients: float) -> float:
        """σ_b for ``expected_clients`` m per round (the given one, or m / 20)."""
        if self.count_stddev is not None:
            return float(self.count_stddev)
        return COUNT_STDDEV_PER_CLIENT * float(expected_clients)

    def noise_split(self, noise_multiplier: float, expected_clients: float
                    ) -> tuple[float, float]:
        """(z_Δ, σ_b): the update's noise multiplier and the count's noise, for a round
        equivalent to one Gaussian release of multiplier ``noise_multiplier``."""
        sigma_b = self.count_noise(expected_clients)
        return (update_noise_multiplier(noise_multiplier=noise_multiplier,
                                        count_stddev=sigma_b), sigma_b)

    @staticmethod
    def unclipped_fraction(noisy_count: float, expected_clients: float) -> float:
        """b̃ = clamp(noisy Σ(b_i − ½) / (qN) + ½, 0, 1) (post-processing)."""
        return min(1.0, max(0.0, noisy_count / expected_clients + 0.5))

    def next_clip(self, clip: float, unclipped_fraction: float) -> float:
        """C_{t+1} = C_t · exp(−η_C (b̃ − γ)): the clip grows when fewer than γ of the
        clients were unclipped and shrinks when more were."""
        return float(clip * math.exp(-self.learning_rate
                                     * (unclipped_fraction - self.target_quantile)))

    def describe(self) -> str:
        return (f"adaptive clipping (Andrew et al. 2021): the clip C_t follows the "
                f"{self.target_quantile:g} quantile of the update norms, C_t+1 = C_t * "
                f"exp(-{self.learning_rate:g} (b - {self.target_quantile:g})) from the noised "
                f"fraction b of unclipped clients")


def adaptive_round_event(*, noise_multiplier: float, sampling_rate: float, delta: float,
                         adaptive: AdaptiveClipping) -> PrivacyEvent:
    """The ledger event of one adaptive-clipping round, the same every round.

    The update noise z_Δ·C_t and the count noise σ_b together are the Poisson-sampled
    Gaussian of multiplier z (module docstring), so the event is DP-FedAvg's with noise and
    sensitivity in units of the round's clip C_t (sensitivity 1, noise scale z): the clip
    changes from round to round, the event does not.
    """
    return central_round_event(
        noise_multiplier=noise_multiplier, sampling_rate=sampling_rate, clip=1.0, delta=delta,
        note=(f"central DP (DP-FedAvg) with {adaptive.describe()}: Poisson sampling q = "
              f"{sampling_rate:g}; the update noise z_D*C_t on the sum of the clipped updates "
              f"and the noise sigma_b on the sum of the centred indicators b - 1/2 are one "
              f"Gaussian release of noise multiplier z = {noise_multiplier:g} "
              f"(z^-2 = z_D^-2 + (2 sigma_b)^-2; noise and sensitivity in units of C_t); one "
              f"user's data replaced (covers one click and one user); the noise adder sees "
              f"the clipped updates and the indicators, or their sums"))


__all__ = ["AdaptiveClipping", "COUNT_STDDEV_PER_CLIENT", "DEFAULT_CLIP_LR",
           "adaptive_round_event", "clip_indicators", "equivalent_noise_multiplier",
           "update_noise_multiplier"]
