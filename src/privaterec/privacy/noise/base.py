"""What a noise mechanism is: its calibration, its draws, its float-safe release, its event.

A mechanism is one object of a subclass of :class:`NoiseMechanism`, in its own module of
this package (:mod:`.laplace`, :mod:`.gaussian`); :mod:`privaterec.privacy.noise` finds it
there. Everything that maps ε to noise or noise to ε, draws noise, or accounts it asks the
mechanism: :func:`~privaterec.privacy.calibrate.calibrate` (scale for ε),
:class:`~privaterec.privacy.events.PrivacyEvent` (ε for scale, the ``dp_accounting`` event),
:func:`~privaterec.privacy.mechanisms.calibrated_noise` (seeded draws),
:class:`~privaterec.privacy.samplers.SecureNoise` (float-safe releases on a device) and
``privaterec privacy calibrate`` (:func:`~privaterec.privacy.report.calibrate_noise`).

Draws are in float64, then cast; one generator, or one per row of a batch of releases
(row i drawn from generator i, so a client's noise comes from its own generator whichever
engine batches it).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Literal, Sequence

import torch
from dp_accounting import dp_event
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from torch import Tensor

from privaterec.errors import ConfigError

Generators = torch.Generator | Sequence[torch.Generator]
"""One generator, or one per row of a batch of releases (row i drawn from generator i)."""


def iid_noise(shape: Sequence[int], *, scale: float | Tensor, name: str,
              generator: Generators, dtype: torch.dtype, device: torch.device | str | None,
              sample: Callable[[Sequence[int], torch.Generator, torch.device], Tensor]
              ) -> Tensor:
    """``scale`` × ``sample(row shape, generator, device)`` (float64 draws of unit scale), cast
    to ``dtype``; zeros for a scale of 0. ``scale`` (its name in errors: ``name``) is a float
    ≥ 0 or a tensor broadcastable to ``shape`` (e.g. per-client ``[n, 1]``)."""
    if isinstance(scale, Tensor):
        if bool((scale < 0).any()) or not bool(torch.isfinite(scale).all()):
            raise ConfigError(f"invalid noise parameter '{name}': expected finite values >= 0")
    elif not (0 <= scale < math.inf):
        raise ConfigError(f"invalid noise parameter '{name}': got {scale!r}, expected a finite "
                          f"number >= 0")
    where = generator_device(generator, device)
    if not isinstance(scale, Tensor) and scale == 0:
        return torch.zeros(shape, dtype=dtype, device=where)
    if isinstance(scale, Tensor):
        scale = scale.to(device=where, dtype=torch.float64)
    return (per_row(shape, generator, lambda s, g: sample(s, g, where)) * scale).to(dtype)


def generator_device(generator: Generators,
                     device: torch.device | str | None) -> torch.device:
    """``device``, or the device of (the first of) ``generator``."""
    if device is not None:
        return torch.device(device)
    first = generator if isinstance(generator, torch.Generator) else next(iter(generator))
    return first.device


def per_row(shape: Sequence[int], generator: Generators,
            draw: Callable[[Sequence[int], torch.Generator], Tensor]) -> Tensor:
    """``draw(shape, generator)``, or with one generator per row, row i = ``draw(row, g_i)``."""
    if isinstance(generator, torch.Generator):
        return draw(shape, generator)
    generators = list(generator)
    if len(shape) < 1 or shape[0] != len(generators):
        raise ConfigError(f"one generator per row: got {len(generators)} generators for "
                          f"shape {tuple(shape)}")
    return torch.stack([draw(tuple(shape[1:]), g) for g in generators])


class NoiseMechanism(ABC):
    """An additive noise mechanism, i.i.d. per coordinate, of one scale parameter.

    Attributes
    ----------
    name: its name in configurations, events and reports (``"laplace"``).
    opendp: the name of OpenDP's float-safe measurement (``"make_laplace"``).
    norm: the norm of the sensitivity it is calibrated to, and of the clip that bounds it
        (``"l1"`` or ``"l2"``).
    pure: ε-DP (δ = 0) rather than (ε, δ)-DP.
    parameter: the symbol of its scale in reports (``"b"``, ``"sigma"``).
    formula: how ``privaterec privacy calibrate`` states the scale for ε.
    note: what the report says of the noise.
    """

    name: ClassVar[str]
    opendp: ClassVar[str]
    norm: ClassVar[Literal["l1", "l2"]]
    pure: ClassVar[bool]
    parameter: ClassVar[str]
    formula: ClassVar[str]
    note: ClassVar[str]

    @abstractmethod
    def scale(self, *, epsilon: float, delta: float, sensitivity: float) -> float:
        """The scale for a target (ε, δ) of one release of this ``norm`` sensitivity
        (``math.inf`` ε: 0)."""

    @abstractmethod
    def epsilon(self, *, scale: float, sensitivity: float, delta: float) -> float:
        """The ε of one release at this scale (and δ; 0 scale: ``math.inf``)."""

    @abstractmethod
    def draw(self, shape: Sequence[int], *, scale: float | Tensor, generator: Generators,
             dtype: torch.dtype = torch.float32,
             device: torch.device | str | None = None) -> Tensor:
        """Seeded i.i.d. noise of ``shape`` (simulation only; see
        :class:`~privaterec.privacy.samplers.SecureNoise` for a device)."""

    def measurement(self, dp: Any, size: int, *, scale: float, k: int) -> Any:
        """OpenDP's float-safe measurement of this noise on ``size`` floats, on the grid 2^k
        (``dp`` is ``opendp.prelude``), under the ``norm`` distance."""
        domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size)
        distance = getattr(dp, f"{self.norm}_distance")(T=float)
        return getattr(dp.m, self.opendp)(domain, distance, scale=scale, k=k)

    @abstractmethod
    def dp_event(self, noise_multiplier: float) -> dp_event.DpEvent:
        """The ``dp_accounting`` event of one release at scale / sensitivity
        ``noise_multiplier``."""

    @abstractmethod
    def pld(self, noise_multiplier: float, *, count: int, interval: float,
            sampling_rate: float | None = None) -> PrivacyLossDistribution:
        """The privacy loss distribution of ``count`` releases at ``noise_multiplier``
        (Poisson-sampled at ``sampling_rate``: under replacement of one user's data),
        discretised pessimistically at ``interval``."""

    def alternatives(self, *, epsilon: float, delta: float,
                     sensitivity: float) -> list[dict[str, Any]]:
        """Other calibrations ``privaterec privacy calibrate`` shows for comparison."""
        return []


__all__ = ["Generators", "NoiseMechanism", "generator_device", "iid_noise", "per_row"]
