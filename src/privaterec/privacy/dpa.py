"""PrivateRec's private user representation: behaviour padding, DPA and VDP.

Pure functions of tensors plus an explicit
:class:`~privaterec.privacy.samplers.NoiseSource` (docs/architecture.md#seams); the
model parts (basic vectors b, the attention α on the simplex, ``Recommender.attention``) live in
:mod:`privaterec.models`, and the engines compose the two.

* :func:`padding_mask` — Alg. 2 lines 2-5: each real history item is replaced by the
  anonymous news r₀ with probability p.
* :func:`dpa_calibration` / :func:`dpa_noise` — Alg. 2 line 9 with docs/privacy.md#dpa-sensitivity
  to #gaussian-calibration: noise on α calibrated (once) with the TRUE sensitivity of the simplex
  (L1 = 2, L2 = √2) at the padding-amplified budget ε′ = ln((e^ε − p)/(1 − p)), δ′ = δ/(1 − p);
  Laplace (δ = 0) or analytic Gaussian.
  ``sensitivity="paper"`` (S = θ = 1) reproduces the paper and marks the event invalid.
* :func:`softplus_normalize` (serving, Alg. 2 line 10) and :func:`relu_normalize` (training,
  §3.3, guarded against an all-zero sum: docs/privacy.md#relu-normalisation).
* :func:`vdp_calibration` / :func:`vdp_release` — §3.2.1's baseline: clip the d-dim user
  vector to θ, add noise calibrated to ε_s with Δ = 2θ.
* :func:`permute_columns` — puts the candidate the label release labels positive
  (:mod:`privaterec.privacy.labels`, which replaces Alg. 3 lines 16-18: their candidate set
  always holds the clicked news, docs/privaterec.md) into the loss's label column.

Alg. 2 line 8's clipping α/max(1, ‖α‖₂) is the identity on the simplex (‖α‖₂ ≤ ‖α‖₁ = 1),
so it is omitted.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from privaterec.errors import ConfigError
from privaterec.privacy.calibrate import Calibration, calibrate, clipped_release
from privaterec.privacy.events import DataPart, Phase
from privaterec.privacy.formulas import SensitivityMode, dpa_sensitivity
from privaterec.privacy.mechanisms import add_noise, clip_and_noise
from privaterec.privacy.noise import noise_mechanism
from privaterec.privacy.samplers import NoiseSource
from privaterec.validators import check_in


PAPER_MODE_NOTE = ("sensitivity='paper' (S = theta): NOT a valid DP guarantee; alpha lies on "
                   "the simplex, whose true sensitivity is L1 = 2 / L2 = sqrt(2)")


def padding_mask(mask: Tensor, *, padding_p: float, noise: NoiseSource) -> Tensor:
    """Which history positions are replaced by the anonymous news r₀ (Alg. 2 lines 2-5).

    Parameters
    ----------
    mask:
        ``BoolTensor[m, H]`` (or ``[H]``), ``True`` for a real click.
    padding_p:
        p in [0, 1): each real click is independently replaced with probability p.
    noise:
        The randomness: seeded (one generator, or one per row of ``mask``), or a device's
        secure source.

    Returns
    -------
    ``BoolTensor`` of ``mask``'s shape, ``True`` where the click is replaced by r₀ (never on
    positions that hold no click).
    """
    check_in(padding_p, "padding_p", 0, 1, "a probability in [0, 1)")
    if padding_p == 0:
        return torch.zeros_like(mask, dtype=torch.bool)
    return (noise.uniform(mask.shape) < padding_p) & mask


def pad_history(rows: Tensor, pad: Tensor, *, anonymous_row: int = 0) -> Tensor:
    """Replace the padded positions of history rows by the anonymous news row (r₀, row 0).

    ``rows``: ``LongTensor[..., H]`` feature-table rows; ``pad``: ``BoolTensor`` of the same
    shape from :func:`padding_mask`. The mask of real clicks is unchanged: a padded click is
    still a history position, holding the public news r₀ (PrivateRec Fig. 3).
    """
    return torch.where(pad, torch.full_like(rows, anonymous_row), rows)


def dpa_calibration(*, epsilon: float, delta: float = 0.0, padding_p: float = 0.0,
                    mechanism: str = "laplace", sensitivity: SensitivityMode = "true",
                    phase: Phase = "train", dimension: int = 1,
                    data: DataPart = "all") -> Calibration:
    """The calibration of DPA's noise on α (PrivateRec Alg. 2 line 9), once per run or query
    configuration.

    Corrected as docs/privacy.md#dpa-sensitivity to #gaussian-calibration: calibrated with the
    simplex sensitivity (L1 = 2 for Laplace, L2 = √2 for the analytic Gaussian) at the amplified
    budget (ε′, δ′) of :func:`~privaterec.privacy.formulas.amplified_budget`.

    Parameters
    ----------
    epsilon, delta:
        Target (ε, δ) of one release after amplification; ε = ∞ gives zero noise (event not
        private). Laplace needs δ = 0; Gaussian needs δ in (0, 1).
    padding_p:
        The padding probability the caller applies with :func:`padding_mask`.
    mechanism:
        ``"laplace"`` or ``"gaussian"``.
    sensitivity:
        ``"true"`` (default) or ``"paper"`` (S = θ = 1; the event is marked ``valid=False``).
    phase:
        ``"train"`` or ``"serve"``.
    dimension:
        Coordinates recorded in the event (B for a query; the training ledger records 1).
    data:
        The part of the user's data the release reads, recorded in the event (training:
        ``"history"``).

    Returns
    -------
    :class:`~privaterec.privacy.calibrate.Calibration` of ONE row's release (the noise is
    added to α itself: no clipping).
    """
    check_in(padding_p, "padding_p", 0, 1, "a probability in [0, 1)")
    norm = noise_mechanism(mechanism).norm
    valid = sensitivity == "true"
    note = ("PrivateRec DPA: noise on the B attention weights, simplex sensitivity, "
            "padding-amplified budget" if valid else PAPER_MODE_NOTE)
    return calibrate(mechanism=mechanism, epsilon=epsilon, delta=delta,
                     sensitivity=dpa_sensitivity(norm, mode=sensitivity), dimension=dimension,
                     phase=phase, padding_p=padding_p, valid=valid, note=note, data=data)


def dpa_noise(shape: Sequence[int], calibration: Calibration, *, noise: NoiseSource,
              dtype: torch.dtype = torch.float32) -> Tensor:
    """DPA noise ``Tensor[m, B]`` for m attention vectors α (one release per row), at the
    scale of ``calibration`` (:func:`dpa_calibration`).

    Parameters
    ----------
    shape:
        ``(m, B)``: m releases (clients or queries) of B coordinates.
    calibration:
        From :func:`dpa_calibration`.
    noise:
        The randomness (seeded: one generator, or one per row).
    dtype:
        Of the noise (drawn in float64, then cast).
    """
    if len(shape) != 2:
        raise ConfigError(f"dpa_noise needs a shape (m, B), got {tuple(shape)}")
    return add_noise(torch.zeros(tuple(shape), dtype=dtype), calibration, noise=noise)


def softplus_normalize(x: Tensor) -> Tensor:
    """α̃ᵢ = softplus(xᵢ)/Σⱼ softplus(xⱼ) over the last dimension (Alg. 2 line 10, serving).

    Computed as softmax(log softplus(x)) so that a row whose coordinates are all very
    negative (softplus underflows to 0, e.g. under large noise at small ε) gets its limit
    softmax(x) instead of 0/0: log softplus(x) = x + log1p(−x/2 + …) → x as x → −∞.
    """
    log_softplus = torch.where(x < -20, x, torch.log(F.softplus(x.clamp_min(-20))))
    return torch.softmax(log_softplus, dim=-1)


def relu_normalize(x: Tensor) -> Tensor:
    """α̃ᵢ = relu(xᵢ)/Σⱼ relu(xⱼ) (PrivateRec §3.3, training), uniform where the sum is 0.

    docs/privacy.md#relu-normalisation: when every coordinate of a row is ≤ 0 the paper's formula
    divides by zero; such a row falls back to the uniform vector 1/B (no gradient flows through
    it).
    """
    r = torch.relu(x)
    total = r.sum(dim=-1, keepdim=True)
    safe = torch.where(total > 0, total, torch.ones_like(total))
    uniform = torch.full_like(r, 1.0 / x.shape[-1])
    return torch.where(total > 0, r / safe, uniform)


def simplex_project(x: Tensor) -> Tensor:
    """α̃ = argmin over the probability simplex of ‖α̃ − x‖₂, over the last dimension.

    The Euclidean projection (Held, Wolfe & Crowder 1974; Duchi et al. 2008, Fig. 1): with u
    the coordinates sorted in decreasing order and ρ the largest j such that
    uⱼ − (Σ_{i≤j} uᵢ − 1)/j > 0, θ = (Σ_{i≤ρ} uᵢ − 1)/ρ and α̃ = max(x − θ, 0). A serving-side
    alternative to :func:`softplus_normalize` (docs/privaterec.md): it keeps no
    floor on the small coordinates, and it is post-processing of the noised release, so it
    costs no ε. ``[..., B]`` → ``[..., B]``.
    """
    u, _ = torch.sort(x, dim=-1, descending=True)
    cumulative = torch.cumsum(u, dim=-1) - 1.0
    index = torch.arange(1, x.shape[-1] + 1, dtype=x.dtype, device=x.device)
    support = (u - cumulative / index) > 0  # always true at j = 1
    rho = support.to(torch.int64).cumsum(dim=-1).argmax(dim=-1, keepdim=True)  # last True
    theta = cumulative.gather(-1, rho) / (rho + 1).to(x.dtype)
    return torch.clamp_min(x - theta, 0.0)


def vdp_calibration(*, clip: float, epsilon: float, delta: float = 0.0,
                    mechanism: str = "laplace", dimension: int,
                    phase: Phase = "serve") -> Calibration:
    """VDP's calibration (PrivateRec §3.2.1): clip the user vector to norm θ, add noise.

    Laplace: L1 clip, Δ₁ = 2θ; Gaussian: L2 clip, Δ₂ = 2θ, analytic calibration
    (docs/privacy.md#gaussian-calibration).

    Parameters
    ----------
    clip:
        θ > 0 (the paper's serving baseline uses 0.001).
    epsilon, delta, mechanism, phase:
        As in :func:`dpa_calibration`.
    dimension:
        d, the size of the user vector.
    """
    norm = noise_mechanism(mechanism).norm
    check_in(clip, "clip", 0, math.inf, "a finite number > 0", open_low=True)
    note = f"VDP: {norm.upper()} clip of the user vector to {clip}"
    return clipped_release(clipping=norm, clip=clip, mechanism=mechanism,
                           dimension=dimension, epsilon=epsilon, delta=delta, phase=phase,
                           note=note)


def vdp_release(user: Tensor, calibration: Calibration, *, noise: NoiseSource) -> Tensor:
    """VDP (PrivateRec §3.2.1): each user vector clipped to norm θ plus calibrated noise.

    Parameters
    ----------
    user:
        ``Tensor[m, d]`` user vectors (one release per row).
    calibration:
        From :func:`vdp_calibration`.
    noise:
        The randomness (seeded: one generator, or one per row; float-safe on a device).

    Returns
    -------
    ``Tensor[m, d]`` released vectors.
    """
    return clip_and_noise(user, calibration, noise=noise)


def permute_columns(candidates: Tensor, chosen: Tensor) -> Tensor:
    """Swap column ``chosen[i]`` of row i into column 0 (the label column of the loss).

    ``candidates``: ``LongTensor[n, 1 + k]``; ``chosen``: ``LongTensor[n]``. Returns a new
    tensor where column 0 holds the news the label release labelled positive.
    """
    out = candidates.clone()
    rows = torch.arange(candidates.shape[0])
    out[rows, 0] = candidates[rows, chosen]
    out[rows, chosen] = candidates[:, 0]
    return out


__all__ = ["PAPER_MODE_NOTE", "SensitivityMode", "dpa_calibration", "dpa_noise",
           "vdp_calibration", "pad_history", "padding_mask", "permute_columns", "relu_normalize",
           "simplex_project", "softplus_normalize", "vdp_release"]
