"""Uni-FedRec basic interest embeddings, decomposer, LDP perturbation and aggregator (§3.2).

* Decomposer: aᵢⱼ = rᵢ · eᵏⱼ, the score of interest rᵢ on the key of the j-th of B basic
  interest embeddings (BIE).
* Perturbation (Eq. 2): âᵢⱼ = f_δ(aᵢⱼ) + n, f_δ = clamp to [−δ, δ], n ~ Laplace(0, λ_I).
* Aggregator (Eq. 3): αᵢ = softmax(âᵢ), r̂ᵢ = Σⱼ αᵢⱼ eᵛⱼ. The client uploads αᵢ (§3.4,
  footnote 4), the server rebuilds r̂ᵢ.

Privacy (docs/privacy.md#uni-fedrec-channels-and-quotas). One channel releases the B clipped scores
plus Laplace noise. Each clipped coordinate lies in [−δ, δ], so for ANY two histories (whatever the
adjacency)
the L1 distance of the clipped score vectors is at most 2δB: the release is ε = 2δB/λ_I-DP
(the paper's 2δ/λ_I is per coordinate). αᵢ is post-processing of âᵢ. The C channels of a
query are C such releases and compose; C itself and the quotas qᵢ depend on the history and
are, in the paper, sent in the clear (no guarantee): :func:`query_events` reports them as a
non-private event unless they are noised with :func:`perturb_quotas`. To hide C, release a
fixed number of channels (e.g. ``max_channels``, unused slots carrying pure noise) and
account for that many.

Defaults are the paper's (§4.1): B = 30, δ = 0.2, λ_I = 1.2, so ε = 10 per channel.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor, nn

from privaterec.errors import ConfigError
from privaterec.privacy.calibrate import (SIMPLEX_SENSITIVITY_L1, Calibration, clipped_release,
                                           no_noise, simplex_release)
from privaterec.privacy.events import Phase, PrivacyEvent
from privaterec.privacy.mechanisms import clip_elementwise
from privaterec.privacy.samplers import NoiseSource

DEFAULT_NUM_BASIS = 30
DEFAULT_CLIP = 0.2
DEFAULT_NOISE_SCALE = 1.2

QUOTA_SENSITIVITY_L1 = SIMPLEX_SENSITIVITY_L1
"""L1 sensitivity of the quota vector: quotas are non-negative and sum to 1, so any two quota
vectors (padded to the same length) differ by at most 2 in L1 — valid even though replacing
one click can change the whole clustering."""

CHANNEL_NOTE = ("Uni-FedRec interest channel: B decomposition scores clipped to [-delta, delta] "
                "+ Laplace(lambda_I)")

CLEAR_QUOTAS_NOTE = ("Uni-FedRec quotas (and hence the number of channels) sent in the clear "
                     "(Eq. 4): no DP guarantee")


def _check_nonneg(value: float, name: str) -> None:
    if not (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and 0 <= value < math.inf):
        raise ConfigError(f"invalid privacy parameter '{name}': got {value!r}, expected a "
                          f"finite number >= 0")


def _check_positive(value: float, name: str) -> None:
    _check_nonneg(value, name)
    if not value > 0:
        raise ConfigError(f"invalid privacy parameter '{name}': got {value!r}, expected > 0")


class BasicInterestEmbeddings(nn.Module):
    """B trainable key/value pairs (eᵏⱼ, eᵛⱼ) of size d shared by all users (§3.2, BIE).

    Initialisation: both tables i.i.d. N(0, 1/d) from the global torch RNG (rows of norm ≈ 1),
    so that initial decomposition scores of unit-scale interests fall inside [−δ, δ].

    Parameters
    ----------
    num_basis:
        B ≥ 1 (paper: 30).
    dim:
        d, the size of the interest and news vectors (paper: 256; must match the model).
    """

    def __init__(self, num_basis: int = DEFAULT_NUM_BASIS, dim: int = 256) -> None:
        super().__init__()
        if not (isinstance(num_basis, int) and num_basis >= 1):
            raise ConfigError(f"invalid 'num_basis' (B): got {num_basis!r}, expected an int >= 1")
        if not (isinstance(dim, int) and dim >= 1):
            raise ConfigError(f"invalid 'dim': got {dim!r}, expected an int >= 1")
        self.num_basis = num_basis
        self.dim = dim
        self.keys = nn.Parameter(torch.randn(num_basis, dim) / math.sqrt(dim))
        self.values = nn.Parameter(torch.randn(num_basis, dim) / math.sqrt(dim))

    def decompose(self, interests: Tensor) -> Tensor:
        """aᵢⱼ = rᵢ · eᵏⱼ: ``[..., d]`` → ``[..., B]``."""
        return interests @ self.keys.T

    def aggregate(self, alpha: Tensor) -> Tensor:
        """r̂ᵢ = Σⱼ αᵢⱼ eᵛⱼ (Eq. 3): ``[..., B]`` → ``[..., d]``."""
        return alpha @ self.values

    def score_matrix(self, news: Tensor) -> Tensor:
        """P = eᵛ Rᵀ ``[B, N]`` for news vectors R ``[N, d]``: r̂ᵢ·R = αᵢᵀP
        (docs/architecture.md#performance-design)."""
        return self.values @ news.T


def perturb_scores(scores: Tensor, *, clip: float | None = DEFAULT_CLIP,
                   noise_scale: float = DEFAULT_NOISE_SCALE,
                   noise: NoiseSource | None = None) -> Tensor:
    """âᵢⱼ = f_δ(aᵢⱼ) + Laplace(0, λ_I) (Uni-FedRec Eq. 2).

    Parameters
    ----------
    scores:
        ``Tensor[..., B]`` decomposition scores a.
    clip:
        δ > 0 (``None``: no clipping — then no privacy guarantee, e.g. noise-free training
        as in the official code).
    noise_scale:
        λ_I ≥ 0, the Laplace scale b (density e^{−|x|/b}/2b).
    noise:
        Randomness (seeded: one generator, or one per row of ``scores``); ``None``: no noise.

    Returns
    -------
    ``Tensor[..., B]`` (differentiable w.r.t. ``scores`` inside the clip range).
    """
    out = scores
    if clip is not None:
        _check_positive(clip, "clip")
        out = clip_elementwise(out, clip)
    if noise is not None:
        _check_nonneg(noise_scale, "noise_scale")
        out = noise.release(out, mechanism="laplace", scale=noise_scale)
    return out


def aggregator_weights(perturbed_scores: Tensor) -> Tensor:
    """αᵢ = softmax(âᵢ) over the B scores (Eq. 3): ``[..., B]`` → ``[..., B]``."""
    return torch.softmax(perturbed_scores, dim=-1)


def channel_event(*, num_basis: int = DEFAULT_NUM_BASIS, clip: float = DEFAULT_CLIP,
                  noise_scale: float = DEFAULT_NOISE_SCALE,
                  phase: Phase = "serve") -> PrivacyEvent:
    """The privacy event of ONE channel's release (B clipped scores + Laplace(λ_I)).

    Laplace mechanism with L1 sensitivity Δ₁ = 2δB, noise scale λ_I, so ε = 2δB/λ_I
    (docs/privacy.md#uni-fedrec-channels-and-quotas); ``coordinate_epsilon`` records the paper's
    per-coordinate 2δ/λ_I. ``noise_scale = 0`` gives a non-private event (ε = ∞).
    """
    return channel_calibration(num_basis=num_basis, clip=clip, noise_scale=noise_scale,
                               phase=phase).event


def channel_calibration(*, num_basis: int = DEFAULT_NUM_BASIS, clip: float = DEFAULT_CLIP,
                        noise_scale: float = DEFAULT_NOISE_SCALE,
                        phase: Phase = "serve") -> Calibration:
    """ONE channel's release, calibrated: B scores clipped to [−δ, δ] element-wise plus
    Laplace(λ_I) (:func:`~privaterec.privacy.calibrate.clipped_release`: Δ₁ = 2δB)."""
    if not (isinstance(num_basis, int) and num_basis >= 1):
        raise ConfigError(f"invalid 'num_basis' (B): got {num_basis!r}, expected an int >= 1")
    _check_positive(clip, "clip")
    _check_nonneg(noise_scale, "noise_scale")
    return clipped_release(clipping="elementwise", clip=clip, dimension=num_basis,
                           noise_scale=noise_scale, phase=phase, note=CHANNEL_NOTE)


def quota_event(*, noise_scale: float | None, num_slots: int,
                phase: Phase = "serve") -> PrivacyEvent:
    """The event of releasing the quota vector (``num_slots`` = its padded length).

    ``noise_scale=None``: quotas in the clear, a non-private event (ε = ∞,
    mechanism ``"clear_quotas"``). Otherwise Laplace with Δ₁ = 2
    (:data:`QUOTA_SENSITIVITY_L1`), ε = 2/λ_q.
    """
    if not (isinstance(num_slots, int) and num_slots >= 1):
        raise ConfigError(f"invalid 'num_slots': got {num_slots!r}, expected an int >= 1")
    if noise_scale is None:
        return no_noise(mechanism="clear_quotas", dimension=num_slots, phase=phase,
                        note=CLEAR_QUOTAS_NOTE).event
    _check_nonneg(noise_scale, "quota_noise_scale")
    return simplex_release(noise_scale=noise_scale, dimension=num_slots, phase=phase,
                           note="Uni-FedRec quotas + Laplace, L1 sensitivity 2 (simplex)").event


def query_events(num_channels: int, *, num_basis: int = DEFAULT_NUM_BASIS,
                 clip: float = DEFAULT_CLIP, noise_scale: float = DEFAULT_NOISE_SCALE,
                 quota_noise_scale: float | None = None, num_quota_slots: int | None = None,
                 include_quotas: bool = True,
                 phase: Phase = "serve") -> list[tuple[PrivacyEvent, int]]:
    """Events of one Uni-FedRec query with C channels, as ``(event, count)`` pairs.

    The C channel releases compose (``(channel_event, C)``; basic composition gives
    C·2δB/λ_I). With ``include_quotas`` the quota release is appended: noised
    (:func:`quota_event` with ``quota_noise_scale``) or, by default, in the clear (ε = ∞ —
    the honest account of the paper's protocol). The pairs feed
    :func:`privaterec.privacy.ledger.compose_events` or ``PrivacyLedger.record(u, e, count)``.

    Parameters
    ----------
    num_channels:
        C ≥ 1 channels released (use the fixed number released, e.g. ``max_channels``, if C is
        hidden by padding).
    num_basis, clip, noise_scale:
        B, δ, λ_I.
    quota_noise_scale:
        λ_q of :func:`perturb_quotas`, or ``None`` for quotas in the clear.
    num_quota_slots:
        Length of the released quota vector (default ``num_channels``).
    include_quotas:
        Whether to append the quota event.
    phase:
        ``"serve"`` (default) or ``"train"``.
    """
    if not (isinstance(num_channels, int) and num_channels >= 1):
        raise ConfigError(f"invalid 'num_channels': got {num_channels!r}, expected an int >= 1")
    events = [(channel_event(num_basis=num_basis, clip=clip, noise_scale=noise_scale,
                             phase=phase), num_channels)]
    if include_quotas:
        slots = num_channels if num_quota_slots is None else num_quota_slots
        events.append((quota_event(noise_scale=quota_noise_scale, num_slots=slots,
                                   phase=phase), 1))
    return events


def perturb_quotas(quotas: Tensor, *, noise_scale: float, noise: NoiseSource,
                   phase: Phase = "serve") -> tuple[Tensor, PrivacyEvent]:
    """Laplace noise on the quota vector, then projection back to the simplex.

    q̃ = max(q + Laplace(λ_q), 0) / Σ max(·, 0); a row whose clamped sum is 0 becomes
    uniform (the fallback does not look at the data). Sensitivity Δ₁ = 2 (quotas lie on the
    simplex), so the release is 2/λ_q-DP; the projection is post-processing. Noise goes to
    every slot, used or not, so the number of channels is hidden too when a fixed number of
    slots is released.

    Parameters
    ----------
    quotas:
        ``Tensor[..., M]`` quota vectors (rows sum to 1; unused slots 0).
    noise_scale:
        λ_q > 0.
    noise:
        Randomness (seeded: one generator, or one per row).
    phase:
        Recorded in the event.

    Returns
    -------
    tuple[Tensor, PrivacyEvent]
        ``Tensor[..., M]`` noisy quotas summing to 1 per row, and the event of ONE row.
    """
    _check_positive(noise_scale, "quota_noise_scale")
    noisy = noise.release(quotas, mechanism="laplace", scale=noise_scale)
    clamped = noisy.clamp_min(0.0)
    total = clamped.sum(dim=-1, keepdim=True)
    uniform = torch.full_like(clamped, 1.0 / quotas.shape[-1])
    out = torch.where(total > 0, clamped / total.clamp_min(torch.finfo(total.dtype).tiny),
                      uniform)
    return out, quota_event(noise_scale=noise_scale, num_slots=int(quotas.shape[-1]),
                            phase=phase)


__all__ = ["BasicInterestEmbeddings", "CHANNEL_NOTE", "CLEAR_QUOTAS_NOTE", "DEFAULT_CLIP",
           "DEFAULT_NOISE_SCALE", "DEFAULT_NUM_BASIS", "QUOTA_SENSITIVITY_L1", "aggregator_weights",
           "channel_calibration", "channel_event",
           "perturb_quotas", "perturb_scores", "query_events", "quota_event"]
