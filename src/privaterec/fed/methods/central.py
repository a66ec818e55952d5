"""Central DP as a wrapper around any method: DP-FedAvg (McMahan et al. 2018, issue 15).

:class:`CentralDP` wraps a client method (``dp-fedavg`` wraps :class:`~.ranking.FedRec`):
every user joins a round independently with probability q (Poisson sampling); each sampled
client computes the wrapped method's update and clips it to L2 norm C; the trusted
aggregator adds Gaussian noise of standard deviation z·C once to the sum and divides by the
expected number of clients qN: (Σ clip(Δ_u, C) + N(0, z²C²I)) / (qN). The round's release
is recorded for every user of the population (Poisson sampling amplifies for everyone,
sampled or not); the clients' clipped updates spend nothing of their own.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import torch

from privaterec.config import RunConfig, replace
from privaterec.data.clients import ClientData
from privaterec.errors import ConfigError
from privaterec.fed.methods.base import ClientMethod, RoundContext, RoundOutput
from privaterec.fed.methods.ranking import FedRec
from privaterec.fed.rng import central_noise_generator
from privaterec.fed.sampling import poisson_round
from privaterec.fed.strategies import ServerDefaults
from privaterec.fed.task import FederatedTask
from privaterec.method_settings import DPFedAvgSettings
from privaterec.privacy.calibrated import Calibration, no_noise
from privaterec.privacy.central import (calibrate_noise_multiplier, central_calibration,
                                        central_epsilon)
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.mechanisms import calibrated_noise
from privaterec.privacy.randomness import Randomness


@dataclass(frozen=True, kw_only=True)
class CentralDP(ClientMethod[FederatedTask[Any]]):
    """``inner``'s clients, clipped to L2 norm ``clip`` C, noised once on the server.

    Attributes
    ----------
    inner: the wrapped method (its inputs and its updates). clip: C.
    noise_multiplier: z. sampling_rate: q (Poisson). rounds: T (for the run's ε).
    delta: δ of the run's guarantee.
    """

    name: ClassVar[str] = "dp-fedavg"
    settings_type: ClassVar[type[DPFedAvgSettings]] = DPFedAvgSettings
    server_defaults: ClassVar[ServerDefaults] = ServerDefaults(strategy="fedadam")
    trusted_aggregator: ClassVar[bool] = True

    inner: ClientMethod[Any]
    clip: float
    noise_multiplier: float
    sampling_rate: float
    rounds: int = 1
    delta: float = 0.0

    # ---------------------------------------------------------------- configuration
    @classmethod
    def resolve(cls, config: RunConfig) -> RunConfig:
        """Also z from ``target_epsilon`` (with q = ``client_fraction`` and T = ``rounds``),
        or a given z checked against it; the report composes at the guarantee's δ.

        Raises
        ------
        ConfigError
            If ``clients_per_round`` is set (the accounting assumes Poisson sampling), or the
            given z does not reach ``target_epsilon``.
        """
        fed = config.fed
        if fed.clients_per_round is not None:
            raise ConfigError("dp-fedavg samples every user independently with probability "
                              "'fed.client_fraction' (Poisson sampling, which the accounting "
                              "assumes); 'fed.clients_per_round' does not apply")
        fed = cls.server_defaults.fill(fed)
        settings = fed.settings_as(DPFedAvgSettings)
        q, delta = fed.client_fraction, settings.target_delta
        assert q is not None  # filled by the server defaults
        if settings.noise_multiplier is None:
            assert settings.target_epsilon is not None  # DPFedAvgSettings needs one of them
            settings = replace(settings, noise_multiplier=calibrate_noise_multiplier(
                target_epsilon=settings.target_epsilon, sampling_rate=q, rounds=fed.rounds,
                delta=delta))
        elif settings.target_epsilon is not None:  # both given (a resolved config.yaml): check
            reached = central_epsilon(noise_multiplier=settings.noise_multiplier,
                                      sampling_rate=q, rounds=fed.rounds, delta=delta)
            if reached > settings.target_epsilon * (1 + 1e-6):
                raise ConfigError(f"'noise_multiplier' {settings.noise_multiplier} gives a "
                                  f"user-level epsilon of {reached:.4g} over {fed.rounds} "
                                  f"rounds at q = {q}, delta = {delta}, above "
                                  f"'target_epsilon' {settings.target_epsilon}: give only one "
                                  f"of the two")
        return replace(config, fed=replace(fed, settings=settings, report_delta=delta))

    @classmethod
    def from_config(cls, config: RunConfig) -> "CentralDP":
        """DP-FedAvg: FedRec's clients, central noise (a resolved configuration: z is set)."""
        settings = config.fed.settings_as(DPFedAvgSettings)
        fed = config.fed
        assert (settings.noise_multiplier is not None
                and fed.client_fraction is not None), "resolve the config first"
        inner = FedRec(**FedRec.common(config))
        return cls(negatives=config.train.negatives, max_samples=fed.max_client_samples,
                   inner=inner, clip=settings.clip, noise_multiplier=settings.noise_multiplier,
                   sampling_rate=fed.client_fraction, rounds=fed.rounds,
                   delta=settings.target_delta)

    @property
    def by_impressions(self) -> bool:
        return self.inner.by_impressions

    def check_client(self, data: ClientData) -> None:
        self.inner.check_client(data)

    def check_population(self, population: int) -> None:
        """δ must be below 1/N: a δ that large allows releasing a user's data outright."""
        if not self.delta < 1 / max(1, population):
            raise ConfigError(f"dp-fedavg's 'fed.target_delta' = {self.delta:g} is not below "
                              f"1/N = {1 / max(1, population):.3g} for N = {population} "
                              f"training users: a delta that large allows releasing a user's "
                              f"data outright; pass --target-delta below "
                              f"{1 / max(1, population):.3g}")

    def select(self, eligible: torch.Tensor, m: int, *, seed: int,
               round_index: int) -> list[int]:
        """Poisson sampling: each eligible user with probability q (``m`` is not used)."""
        return poisson_round(eligible, self.sampling_rate, seed=seed, round_index=round_index)

    def inputs(self, task: FederatedTask[Any], data: ClientData, *,
               generator: Randomness) -> Any:
        return self.inner.inputs(task, data, generator=generator)

    def _calibrate(self, dimension: int) -> Calibration:
        """Clip each client's update to L2 norm C; the aggregator adds the noise to the sum."""
        return no_noise(dimension=dimension, clipping="l2", clip=self.clip,
                        note=f"{self.name}: update clipped to L2 norm {self.clip}, noised "
                             f"centrally")

    def events(self, dimension: int) -> tuple[PrivacyEvent, ...]:
        """None per client: its clipped update goes to the trusted aggregator."""
        return ()

    def central_calibration(self) -> Calibration:
        """The noise the aggregator adds to the round's sum, N(0, (z·C)² I), and its event
        (calibrated once per method, cached)."""
        return _central_calibration(self)

    def central_event(self) -> PrivacyEvent:
        """The ledger event of one central-DP round, recorded for every user."""
        return self.central_calibration().event

    def population_events(self, dimension: int) -> tuple[PrivacyEvent, ...]:
        return (self.central_event(),)

    def update(self, task: FederatedTask[Any], params: torch.Tensor, inputs: Any, *,
               generator: Randomness) -> tuple[torch.Tensor, float]:
        """The wrapped method's update, clipped to L2 norm C (sent to the aggregator)."""
        update, loss = self.inner.update(task, params, inputs, generator=generator)
        clipped, _ = self.privatize(update[None], [generator])
        return clipped[0], loss

    def client_updates(self, task: FederatedTask[Any], params: torch.Tensor,
                       inputs: Sequence[Any], generators: Sequence[torch.Generator], *,
                       chunk_clients: int) -> tuple[torch.Tensor, torch.Tensor]:
        updates, losses = self.inner.client_updates(task, params, inputs, generators,
                                                    chunk_clients=chunk_clients)
        clipped, _ = self.privatize(updates, generators)
        return clipped, losses

    def round(self, task: FederatedTask[Any], params: torch.Tensor, inputs: Sequence[Any],
              generators: Sequence[torch.Generator], context: RoundContext) -> RoundOutput:
        """(Σ clip(Δ_u, C) + N(0, z²C²I)) / (qN); the noise is the simulation's seeded draw
        (:func:`~privaterec.fed.rng.central_noise_generator`)."""
        dimension = task.dimension
        total = torch.zeros(dimension)
        losses: list[float] = []
        if inputs:
            clipped, loss_t = self.client_updates(task, params, inputs, generators,
                                                  chunk_clients=context.chunk_clients)
            total = clipped.sum(0)
            losses = [float(x) for x in loss_t]
        noise = calibrated_noise((dimension,), self.central_calibration(),
                                 generator=central_noise_generator(context.seed,
                                                                   context.round_index))
        direction = (total + noise) / (self.sampling_rate * context.population)
        return RoundOutput(direction, losses, (self.central_event(),))

    def describe(self, *, dimension: int, parameters: Sequence[str], clients_per_round: int,
                 client_fraction: float) -> dict[str, Any]:
        event = self.central_event()

        def total(accountant: str, neighbours: str) -> float:
            return central_epsilon(noise_multiplier=self.noise_multiplier,
                                   sampling_rate=self.sampling_rate, rounds=self.rounds,
                                   delta=self.delta, accountant=accountant,
                                   neighbours=neighbours)
        return {
            "method": self.name, "mechanism": "gaussian",
            "aggregation": "noise added once to the sum of the sampled clients' clipped "
                           "updates (central DP), divided by the expected count qN",
            "clipping": "l2 (each client)", "clip_bound": self.clip,
            "noise_scale": event.noise_scale, "sensitivity_l2": self.clip,
            "dimension": dimension, "epsilon_per_round": event.epsilon,
            "delta_per_round": event.delta, "coordinate_epsilon": None,
            "noised_parameters": list(parameters),
            "central": {"noise_multiplier": self.noise_multiplier,
                        "sampling_rate": self.sampling_rate, "rounds": self.rounds,
                        "delta": self.delta,
                        "epsilon_run_pld": total("pld", "replace"),
                        "epsilon_run_pld_add_remove": total("pld", "add_remove"),
                        "epsilon_run_rdp_add_remove": total("rdp", "add_remove"),
                        "adjacency": "one user's data replaced (covers one click and one "
                                     "user); add/remove values for comparison only",
                        "sampling": "Poisson: every user joins a round with probability q",
                        "trust": "the server adds the noise and sees the clipped updates "
                                 "(no secure aggregation in this engine yet)"},
        }


@functools.lru_cache(maxsize=64)
def _central_calibration(method: CentralDP) -> Calibration:
    return central_calibration(noise_multiplier=method.noise_multiplier,
                               sampling_rate=method.sampling_rate, clip=method.clip,
                               delta=method.delta)


__all__ = ["CentralDP"]
