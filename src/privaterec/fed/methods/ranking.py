"""The ranking methods that clip and noise a whole update: FedRec, FedNewsRec, DP-FedRec.

* :class:`FedRec` — plain federated learning (no clipping, no noise, ε = ∞).
* :class:`FedNewsRec` — FedNewsRec Eq. 4-5: clip every coordinate of the client's gradient
  to [−δ, δ] and add Laplace(λ) to every coordinate; server: weighted SGD (Eq. 6-7). Paper
  defaults r = 2%, η = 0.5, δ = 0.005, λ = 0.015. The paper's ε = 2δ/λ is per coordinate;
  the whole D-dim update is 2δD/λ-DP (docs/privacy.md#fednewsrecs-epsilon-is-per-coordinate) and
  the ledger records that.
* :class:`DPFedRec` — PrivateRec §4's baseline: clip the whole update to norm θ (L1 for
  Laplace, L2 for Gaussian) and add noise calibrated to ε_t per round (Δ = 2θ for
  replacement of a client's data; Gaussian with the analytic calibration,
  docs/privacy.md#gaussian-calibration).

They train :class:`~privaterec.fed.objective.LocalObjective` (the ranking task), whose
clients may also run E > 1 local SGD steps (FedAvg) and whose unprivatized rounds take one
backward pass (:meth:`RankingMethod.round`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Self, Sequence

import torch

from privaterec.config import NoiseKind, RunConfig, replace
from privaterec.fed.methods.base import ClientMethod, RoundContext, RoundOutput
from privaterec.fed.objective import ClientBatch, ClientInputs, LocalObjective
from privaterec.fed.strategies import ServerDefaults
from privaterec.method_settings import DPFedRecSettings, FedNewsRecSettings, FedRecSettings
from privaterec.privacy.calibrate import Calibration, Clipping, clipped_release, no_noise
from privaterec.privacy.noise import MECHANISMS, noise_mechanism
from privaterec.privacy.samplers import NoiseSource


@dataclass(frozen=True, kw_only=True)
class RankingMethod(ClientMethod[LocalObjective]):
    """A method of the ranking task: its clients' updates are gradients, or with
    ``local_steps`` E > 1 FedAvg's pseudo-gradients θ − θ_u after E SGD steps at
    ``local_lr``."""

    local_steps: int = 1
    local_lr: float = 0.05

    # ---------------------------------------------------------------- configuration
    @classmethod
    def resolve(cls, config: RunConfig) -> RunConfig:
        """``config`` with the method's defaults of the open engine settings filled in
        (:attr:`server_defaults`) and its rules between them and its settings checked.

        Raises
        ------
        ConfigError
            Naming a setting that does not hold for the method.
        """
        return replace(config, fed=cls.server_defaults.fill(config.fed))

    @classmethod
    def from_config(cls, config: RunConfig) -> Self:
        """The method of a resolved run configuration (:meth:`resolve`)."""
        return cls(**cls.common(config))

    @staticmethod
    def common(config: RunConfig) -> dict[str, Any]:
        """The settings every ranking method takes from the engine's and training's."""
        fed = config.fed
        return dict(negatives=config.train.negatives, max_samples=fed.max_client_samples,
                    local_steps=fed.local_steps, local_lr=fed.local_lr)

    @property
    def clipping(self) -> Clipping:
        """How a client clips its update (reports; the calibration applies it)."""
        return "none"

    @property
    def noise(self) -> str:
        """The noise mechanism a client adds to its update, or ``"none"`` (reports)."""
        return "none"

    def update(self, task: LocalObjective, params: torch.Tensor,
               inputs: ClientInputs, *, noise: NoiseSource) -> tuple[torch.Tensor, float]:
        if self.local_steps == 1:
            grad, loss = task.client_gradient(params, inputs.history, inputs.history_mask,
                                              inputs.candidates)
            update = grad[None]
        else:
            batch = ClientBatch.stack([inputs.history], [inputs.history_mask],
                                      [inputs.candidates])
            update, losses = task.local_deltas(params, batch, steps=self.local_steps,
                                               lr=self.local_lr)
            loss = float(losses[0])
        released, _ = self.privatize(update, [noise])
        return released[0], loss

    def raw_updates(self, task: LocalObjective, params: torch.Tensor, batch: ClientBatch,
                    chunk_clients: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-client updates ``[m, D]`` (gradients, or FedAvg pseudo-gradients when
        ``local_steps`` > 1) and losses ``[m]`` of a batch of clients, before privatizing."""
        if self.local_steps == 1:
            return task.client_gradients(params, batch, chunk_clients=chunk_clients)
        return task.local_deltas(params, batch, steps=self.local_steps, lr=self.local_lr,
                                 chunk_clients=chunk_clients)

    def client_updates(self, task: LocalObjective, params: torch.Tensor,
                       inputs: Sequence[ClientInputs], sources: Sequence[NoiseSource],
                       *, chunk_clients: int) -> tuple[torch.Tensor, torch.Tensor]:
        updates, losses = self.raw_updates(task, params, task.batch(inputs), chunk_clients)
        released, _ = self.privatize(updates, sources)
        return released, losses

    def round(self, task: LocalObjective, params: torch.Tensor,
              inputs: Sequence[ClientInputs], sources: Sequence[NoiseSource],
              context: RoundContext) -> RoundOutput:
        """Without per-client clipping or noise, one backward pass gives the round's
        weighted gradient (:meth:`LocalObjective.round_gradient`); otherwise per-client
        gradients are clipped and noised."""
        if not self.per_client_release and self.local_steps == 1:
            direction, loss = task.round_gradient(params, task.batch(inputs),
                                                  uniform_clients=not self.sends_metadata)
            return RoundOutput(direction, [loss] * len(inputs))  # no per-client losses
        return super().round(task, params, inputs, sources, context)

    def describe(self, *, dimension: int, parameters: Sequence[str], clients_per_round: int,
                 client_fraction: float) -> dict[str, Any]:
        event = self.event(dimension)
        out: dict[str, Any] = {
            "method": self.name, "mechanism": self.noise, "clipping": self.clipping,
            "clip_bound": getattr(self, "clip", None), "noise_scale": event.noise_scale,
            "dimension": dimension, "epsilon_per_round": event.epsilon,
            "delta_per_round": event.delta, "coordinate_epsilon": event.coordinate_epsilon,
            "noised_parameters": list(parameters),
            "clients_per_round": clients_per_round, "client_fraction": client_fraction,
        }
        norm = MECHANISMS[self.noise].norm if self.noise in MECHANISMS else "l1"
        out[f"sensitivity_{norm}"] = event.sensitivity
        return out


@dataclass(frozen=True, kw_only=True)
class FedRec(RankingMethod):
    """Plain federated learning: raw updates, weighted by the clients' sample counts."""

    name: ClassVar[str] = FedRecSettings.method
    settings_type: ClassVar[type[FedRecSettings]] = FedRecSettings
    server_defaults: ClassVar[ServerDefaults] = ServerDefaults(strategy="fedadam")

    @property
    def sends_metadata(self) -> bool:
        """Its upload is not private anyway: it also sends its count and loss (FedNewsRec
        Eq. 6's weights)."""
        return True

    @property
    def per_client_release(self) -> bool:
        return False

    def _calibrate(self, dimension: int) -> Calibration:
        """The raw update, ε = ∞."""
        return no_noise(dimension=dimension, note=f"{self.name}: raw update")


@dataclass(frozen=True, kw_only=True)
class FedNewsRec(RankingMethod):
    """FedNewsRec Eq. 4-5: element-wise clip to [−δ, δ] (``clip``), Laplace(λ)
    (``noise_scale``) per coordinate."""

    name: ClassVar[str] = FedNewsRecSettings.method
    settings_type: ClassVar[type[FedNewsRecSettings]] = FedNewsRecSettings
    server_defaults: ClassVar[ServerDefaults] = ServerDefaults(strategy="sgd")

    clip: float
    noise_scale: float

    @classmethod
    def from_config(cls, config: RunConfig) -> Self:
        settings = config.fed.settings_as(FedNewsRecSettings)
        return cls(**cls.common(config), clip=settings.clip, noise_scale=settings.noise_scale)

    @property
    def clipping(self) -> Literal["elementwise"]:
        return "elementwise"

    @property
    def noise(self) -> Literal["laplace"]:
        return "laplace"

    def _calibrate(self, dimension: int) -> Calibration:
        """ε = 2δD/λ for the whole update, 2δ/λ per coordinate
        (docs/privacy.md#fednewsrecs-epsilon-is-per-coordinate)."""
        return clipped_release(
            clipping="elementwise", clip=self.clip, dimension=dimension,
            noise_scale=self.noise_scale,
            note="FedNewsRec Eq. 4-5: element-wise clip to [-delta, delta], Laplace(lambda) "
                 "per coordinate; epsilon covers the whole update (2*delta*D/lambda)")


@dataclass(frozen=True, kw_only=True)
class DPFedRec(RankingMethod):
    """DP-FedRec: L1 clip + Laplace or L2 clip + analytic Gaussian at (ε_t, δ_t) per round,
    sensitivity 2θ (``clip``)."""

    name: ClassVar[str] = DPFedRecSettings.method
    settings_type: ClassVar[type[DPFedRecSettings]] = DPFedRecSettings
    # FedAdam's τ far below the per-coordinate size of its L1-clipped updates, θ/D ≈ 5e-8
    # (τ = 1e-6 made its server step a vanishing SGD step; BENCHMARKS.md).
    server_defaults: ClassVar[ServerDefaults] = ServerDefaults(strategy="fedadam",
                                                               adam_tau=1e-10)

    clip: float
    noise: NoiseKind = "laplace"
    epsilon: float = math.inf
    delta: float = 0.0

    def __post_init__(self) -> None:
        noise_mechanism(self.noise, "noise")

    @classmethod
    def from_config(cls, config: RunConfig) -> Self:
        """δ_t applies to Gaussian noise only (a Laplace release is pure ε-DP: δ = 0)."""
        settings = config.fed.settings_as(DPFedRecSettings)
        return cls(**cls.common(config), clip=settings.clip, noise=settings.noise,
                   epsilon=settings.epsilon_train,
                   delta=0.0 if noise_mechanism(settings.noise).pure else settings.delta_train)

    @property
    def clipping(self) -> Literal["l1", "l2"]:
        return noise_mechanism(self.noise).norm

    def _calibrate(self, dimension: int) -> Calibration:
        """Noise calibrated to ε_t (and δ_t) with Δ = 2θ (replacement of a client's data)."""
        note = (f"DP-FedRec: {self.clipping.upper()} clip to {self.clip}, "
                f"sensitivity 2*theta per client update")
        return clipped_release(clipping=self.clipping, clip=self.clip, mechanism=self.noise,
                               dimension=dimension, epsilon=self.epsilon, delta=self.delta,
                               note=note)


__all__ = ["DPFedRec", "FedNewsRec", "FedRec", "RankingMethod"]
