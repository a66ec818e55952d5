"""What a noise mechanism is: its calibration, its draws, its float-safe release, its event.

A mechanism is one object of a subclass of :class:`NoiseMechanism`, in its own module of
this package (:mod:`.laplace`, :mod:`.gaussian`); :mod:`privaterec.privacy.noise` finds it
there. Everything that maps ε to noise or noise to ε, draws noise, or accounts it asks the
mechanism: :func:`~privaterec.privacy.calibrate.calibrate` (scale for ε),
:class:`~privaterec.privacy.events.PrivacyEvent` (ε for scale, the ``dp_accounting`` event),
:class:`~privaterec.privacy.samplers.SimulationNoise` (seeded draws),
:class:`~privaterec.privacy.samplers.SecureNoise` (float-safe releases on a device) and
``privaterec privacy calibrate`` (:func:`~privaterec.privacy.report.calibrate_noise`).

A mechanism's seeded draw is one unit-scale float64 sample (:meth:`NoiseMechanism._sample`);
:class:`~privaterec.privacy.samplers.SimulationNoise` scales it, casts it and draws it per row.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Literal, Sequence

import torch
from dp_accounting import dp_event
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from torch import Tensor


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
    def _sample(self, shape: Sequence[int], generator: torch.Generator,
                device: torch.device) -> Tensor:
        """Seeded float64 noise of unit scale and ``shape`` on ``device`` (simulation only:
        :class:`~privaterec.privacy.samplers.SimulationNoise` draws through it)."""

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


__all__ = ["NoiseMechanism"]
