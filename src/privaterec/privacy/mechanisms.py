"""Clipping, calibrated noise and randomized response on tensors (docs/privacy.md).

Every random draw comes from an explicit
:class:`~privaterec.privacy.samplers.NoiseSource`; the global torch RNG is never used. The
noise is the calibration's mechanism's (:mod:`privaterec.privacy.noise`): a seeded
:class:`~privaterec.privacy.samplers.SimulationNoise` draws it in float64, then casts it, and
as for any floating-point implementation its textbook guarantee ignores rounding effects
(Mironov, CCS 2012); a device's :class:`~privaterec.privacy.samplers.SecureNoise` releases
float-safe.

Shapes are free: functions work elementwise or over the dimensions named by ``dim``, so a
batch of clients ``x[n_clients, D]`` is clipped and noised in one call (one row = one
client's release). A release's clipping and noise scale come calibrated, once, in a
:class:`~privaterec.privacy.calibrate.Calibration` (clip first, so that its sensitivity
holds, then add its noise: :func:`clip_and_noise`); the functions here never map ε to a
scale.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from privaterec.errors import ConfigError
from privaterec.privacy.calibrate import Calibration
from privaterec.privacy.events import Phase, PrivacyEvent
from privaterec.privacy.samplers import NoiseSource, SimulationNoise

Dims = int | Sequence[int] | None


def _dims(x: Tensor, dim: Dims) -> tuple[int, ...]:
    if dim is None:
        if x.ndim < 2:
            raise ConfigError("dim=None clips each x[i] over all its dimensions and needs a "
                              f"tensor with >= 2 dimensions, got shape {tuple(x.shape)}; "
                              "use dim=-1 for a single vector")
        return tuple(range(1, x.ndim))
    return (dim,) if isinstance(dim, int) else tuple(dim)


def _check_bound(bound: float | Tensor) -> None:
    if isinstance(bound, Tensor):
        if bool((bound < 0).any()):
            raise ConfigError("invalid clipping 'bound': expected values >= 0")
    elif not (bound >= 0):
        raise ConfigError(f"invalid clipping 'bound': got {bound!r}, expected a number >= 0")


CLIP_MARGIN = 2.0 ** -22
"""Relative margin of the clip: a slice is scaled to norm ≤ C·(1 − 2^−22), its norm taken in
float64, so that the float32 product (two roundings of ≤ 2^−24 each: the factor and each
coordinate) still has exact norm ≤ C, the sensitivity the accountant assumes."""


def clip_factor(norms: Tensor, bound: float | Tensor) -> Tensor:
    """min(1, C·(1 − 2^−22)/‖x‖) for float64 ``norms`` (:data:`CLIP_MARGIN`): the scale that
    clips a vector of that norm to an exact norm ≤ C once applied in float32 or float64."""
    tiny = torch.finfo(norms.dtype).tiny
    return torch.clamp(bound * (1.0 - CLIP_MARGIN) / norms.clamp_min(tiny), max=1.0)


def _clip_norm(x: Tensor, bound: float | Tensor, dim: Dims, ord: float) -> Tensor:
    _check_bound(bound)
    if x.dtype not in (torch.float32, torch.float64):
        raise ConfigError(f"clipping needs float32 or float64 values, got {x.dtype}: the "
                          f"exact norm bound (CLIP_MARGIN) does not hold for narrower floats; "
                          f"cast the update first")
    norms = torch.linalg.vector_norm(x, ord=ord, dim=_dims(x, dim), keepdim=True,
                                     dtype=torch.float64)
    return x * clip_factor(norms, bound).to(x.dtype)


def clip_l2(x: Tensor, bound: float | Tensor, *, dim: Dims = -1) -> Tensor:
    """Scale each slice to L2 norm ≤ ``bound``: x · min(1, bound·(1 − 2^−22)/‖x‖₂), the norm
    in float64 (:data:`CLIP_MARGIN`); unchanged if inside that slightly smaller ball.

    Parameters
    ----------
    x:
        Tensor, e.g. per-client updates ``[n_clients, D]``.
    bound:
        Clipping norm C ≥ 0 (float, or a tensor broadcastable to the kept-dim norms).
    dim:
        Dimension(s) that make up one vector (default: the last); ``None`` = every dimension
        except the first (each ``x[i]`` is one vector, e.g. ``[n_clients, *param_shape]``).

    Returns
    -------
    Tensor
        Same shape as ``x``; exact norms ≤ C (:data:`CLIP_MARGIN`: a slice whose norm is
        within 2^−22 of C, or above it, is scaled to C·(1 − 2^−22)).
    """
    return _clip_norm(x, bound, dim, 2.0)


def clip_l1(x: Tensor, bound: float | Tensor, *, dim: Dims = -1) -> Tensor:
    """Scale each slice to L1 norm ≤ ``bound`` (see :func:`clip_l2` for ``dim``)."""
    return _clip_norm(x, bound, dim, 1.0)


def clip_elementwise(x: Tensor, bound: float | Tensor) -> Tensor:
    """Clamp every coordinate to [−bound, bound] (FedNewsRec Eq. 4's clip(g, δ))."""
    _check_bound(bound)
    if isinstance(bound, Tensor):
        return torch.maximum(torch.minimum(x, bound), -bound)
    return torch.clamp(x, -bound, bound)


def apply_clip(x: Tensor, calibration: Calibration, *, dim: Dims = -1) -> Tensor:
    """``x`` clipped as ``calibration`` says (L1/L2 ball over ``dim``, or every coordinate);
    unchanged without clipping. Rows of ``x`` (e.g. ``[n_clients, D]``) are clipped apart."""
    bound = calibration.clip
    if calibration.clipping == "none":
        return x
    assert bound is not None
    if calibration.clipping == "elementwise":
        return clip_elementwise(x, bound)
    if calibration.clipping == "l1":
        return clip_l1(x, bound, dim=dim)
    return clip_l2(x, bound, dim=dim)


def calibrated_noise(shape: Sequence[int], calibration: Calibration, *, noise: NoiseSource,
                     dtype: torch.dtype = torch.float32,
                     device: torch.device | str | None = None) -> Tensor:
    """The noise of ``calibration`` (its mechanism's draw at its scale), zeros without.

    Parameters
    ----------
    shape:
        Output shape, e.g. ``[m, B]``: m releases of B coordinates.
    calibration:
        The release's :class:`~privaterec.privacy.calibrate.Calibration` (its scale).
    noise:
        The randomness (:meth:`~privaterec.privacy.samplers.NoiseSource.draw`; a
        :class:`~privaterec.privacy.samplers.SimulationNoise` of one generator per row
        draws row i from generator i).
    dtype, device:
        Of the noise.
    """
    if calibration.noisy:
        return noise.draw(shape, mechanism=calibration.mechanism, scale=calibration.scale,
                          dtype=dtype, device=device)
    return torch.zeros(tuple(shape), dtype=dtype, device=device)


def add_noise(x: Tensor, calibration: Calibration, *, noise: NoiseSource) -> Tensor:
    """``x`` + the noise of ``calibration`` (same shape and dtype); ``x`` itself without noise.

    ``x`` must already be clipped (:func:`apply_clip`) so that the calibration's sensitivity
    holds. The release is ``noise``'s
    (:meth:`~privaterec.privacy.samplers.NoiseSource.release`): float-safe from a device's
    :class:`~privaterec.privacy.samplers.SecureNoise`; from a seeded
    :class:`~privaterec.privacy.samplers.SimulationNoise`, drawn on its generators' device
    and moved to ``x``'s, row i from generator i with one generator per row.
    """
    if not calibration.noisy:
        return x
    return noise.release(x, mechanism=calibration.mechanism, scale=calibration.scale)


def clip_and_noise(x: Tensor, calibration: Calibration, *, noise: NoiseSource) -> Tensor:
    """One release per row of ``x``: clipped, then noised, as ``calibration`` says
    (e.g. ``[n_clients, D]`` updates; :func:`apply_clip` then :func:`add_noise`)."""
    return add_noise(apply_clip(x, calibration), calibration, noise=noise)


def release_rows(x: Tensor, calibration: Calibration, sources: Sequence[NoiseSource]) -> Tensor:
    """Row i of ``x`` (e.g. ``[m, D]``, one client's update per row) clipped and noised as
    ``calibration`` says, its noise from ``sources[i]``.

    Seeded sources: one batched clip, then one :func:`add_noise` from a
    :class:`~privaterec.privacy.samplers.SimulationNoise` of their generators (row i drawn
    from generator i, exactly the simulation's draws). Any other source (a device's
    :class:`~privaterec.privacy.samplers.SecureNoise`): the clipped row is released by its
    source, float-safe.

    Raises
    ------
    ValueError
        If there is not one source per row.
    """
    if len(sources) != x.shape[0]:
        raise ValueError(f"need one generator per client: {len(sources)} for "
                         f"{x.shape[0]} updates")
    clipped = apply_clip(x, calibration)
    if not calibration.noisy:
        return clipped
    seeded = [s.generator for s in sources
              if isinstance(s, SimulationNoise) and isinstance(s.generator, torch.Generator)]
    if len(seeded) == len(sources):
        return add_noise(clipped, calibration, noise=SimulationNoise(seeded))
    if not calibration.event.is_private:
        return clipped
    return torch.stack([add_noise(row, calibration, noise=source)
                        for row, source in zip(clipped, sources)])


def randomized_response(labels: Tensor, *, epsilon: float, num_classes: int,
                        noise: NoiseSource,
                        phase: Phase = "train") -> tuple[Tensor, PrivacyEvent]:
    """k-ary randomized response on integer labels (Warner 1965; Kairouz et al. 2016).

    Each label is kept with probability e^ε/(e^ε + k − 1) and otherwise replaced by one of
    the k − 1 other classes uniformly, which is ε-DP for a change of that label.

    Parameters
    ----------
    labels:
        Integer tensor with values in [0, k), any shape.
    epsilon:
        ε > 0 per label (``math.inf``: labels returned unchanged).
    num_classes:
        k ≥ 2.
    noise:
        Randomness.

    Returns
    -------
    tuple[Tensor, PrivacyEvent]
        Perturbed labels (same shape/dtype) and the event of one label's release.
    """
    if not (isinstance(num_classes, int) and num_classes >= 2):
        raise ConfigError(f"invalid 'num_classes': got {num_classes!r}, expected an int >= 2")
    if labels.numel() and (bool((labels < 0).any()) or bool((labels >= num_classes).any())):
        raise ConfigError(f"labels must lie in [0, num_classes={num_classes})")
    if not (epsilon > 0):
        raise ConfigError(f"invalid privacy parameter 'epsilon': got {epsilon!r}, expected > 0")
    event = PrivacyEvent(mechanism="randomized_response", epsilon=epsilon, phase=phase,
                         note=f"{num_classes}-ary, epsilon per label")
    if math.isinf(epsilon):
        return labels.clone(), event
    # P(keep) = e^ε/(e^ε + k − 1) = 1/(1 + (k − 1)e^{−ε}).
    keep_prob = 1.0 / (1.0 + (num_classes - 1) * math.exp(-epsilon))
    u = noise.uniform(labels.shape).to(labels.device)
    shift = (1 + noise.randint(num_classes - 1, labels.shape)).to(labels.device, labels.dtype)
    other = (labels + shift) % num_classes
    return torch.where(u < keep_prob, labels, other), event
