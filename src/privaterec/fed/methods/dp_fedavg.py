"""Central DP as a wrapper around any method: DP-FedAvg (McMahan et al. 2018).

:class:`CentralDP` wraps a client method (``dp-fedavg`` wraps :class:`~.ranking.FedRec`):
every user joins a round independently with probability q (Poisson sampling); each sampled
client computes the wrapped method's update and clips it to L2 norm C; the trusted
aggregator adds Gaussian noise of standard deviation z·C once to the sum and divides by the
expected number of clients qN: (Σ clip(Δ_u, C) + N(0, z²C²I)) / (qN). The round's release
is recorded for every user of the population (Poisson sampling amplifies for everyone,
sampled or not); the clients' clipped updates spend nothing of their own.

On the Flower engine the clipped updates go through SecAgg+ (``secure_aggregation =
"secaggplus"``, :mod:`privaterec.fed.secagg`): the server sees only their sum, and either
adds the noise to it (``noise_placement = "central"``) or each client adds its share
before masking (``"distributed"``, guaranteed when at most ``max_dropouts`` clients drop).

With ``adaptive`` (:class:`~privaterec.privacy.adaptive_clip.AdaptiveClipping`; Andrew et
al. 2021) the clip is server state: round t runs with C_t
(:meth:`CentralDP.at_server_state`), each client also sends its centred clip indicator
b − ½, the aggregator noises the sum of the updates with z_Δ·C_t and the sum of the
indicators with σ_b (together one Gaussian release of multiplier z), and moves the clip
towards the target quantile of the update norms.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import torch

from privaterec.config import RunConfig, replace
from privaterec.data.clients import ClientData, ClientDataset
from privaterec.errors import ConfigError, PrivateRecError
from privaterec.fed.methods.base import ClientMethod, RoundContext, RoundOutput
from privaterec.fed.methods.ranking import FedRec
from privaterec.fed.news_space import USER_SIDE_CHUNK, NewsSpaceClipping
from privaterec.fed.objective import LocalObjective
from privaterec.fed.rng import aggregator_noise
from privaterec.fed.sampling import poisson_round
from privaterec.fed.secagg import SecAggRound, min_clients, plan_round
from privaterec.fed.strategies import ServerDefaults
from privaterec.fed.task import FederatedTask
from privaterec.method_settings import DPFedAvgSettings, check_secure_aggregation
from privaterec.privacy.adaptive_clip import (AdaptiveClipping, adaptive_round_event,
                                              clip_indicators, update_noise_multiplier)
from privaterec.privacy.calibrate import Calibration, no_noise
from privaterec.privacy.central_accounting import (calibrate_noise_multiplier, central_calibration,
                                        central_epsilon)
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.mechanisms import calibrated_noise
from privaterec.privacy.samplers import NoiseSource, SimulationNoise

CLIP_INDICATOR = "clip_indicator"
"""The name of adaptive clipping's centred indicator b − ½ in what a client sends."""



def _simulation_only(source: NoiseSource, what: str) -> None:
    """Raise unless ``source`` is a simulation's seeded noise (a deployed server's noise goes
    through :meth:`CentralDP.release_sum`, float-safe)."""
    if not isinstance(source, SimulationNoise):
        raise PrivateRecError(
            f"CentralDP.{what} draws a simulation's seeded noise; a deployed server's noise "
            f"goes through CentralDP.release_sum (float-safe)")

def expected_clients(sampling_rate: float, population: int) -> int:
    """m, the expected number of clients per round, max(1, round(qN)) (at most N): the
    default count noise σ_b = m / 20 (the same m the run reports as clients per round)."""
    return max(1, min(population, round(sampling_rate * population)))


@dataclass(frozen=True, kw_only=True)
class CentralDP(ClientMethod[FederatedTask[Any]]):
    """``inner``'s clients, clipped to L2 norm ``clip`` C, noised once on the server.

    Attributes
    ----------
    inner: the wrapped method (its inputs and its updates). clip: C (with ``adaptive``: the
    clip of the round this method runs, the initial clip C_0 as built from the config).
    noise_multiplier: z. sampling_rate: q (Poisson). rounds: T (for the run's ε).
    delta: δ of the run's guarantee. adaptive: adaptive clipping's settings (None: fixed C).
    secure_aggregation, noise_placement, max_dropouts: how the sum is formed (Flower engine
        only; see the group of fields below).
    """

    name: ClassVar[str] = DPFedAvgSettings.method
    settings_type: ClassVar[type[DPFedAvgSettings]] = DPFedAvgSettings
    server_defaults: ClassVar[ServerDefaults] = ServerDefaults(strategy="fedadam")
    trusted_aggregator: ClassVar[bool] = True
    enrols_every_user: ClassVar[bool] = True  # :meth:`population`

    inner: ClientMethod[Any]
    clip: float
    noise_multiplier: float
    sampling_rate: float
    rounds: int = 1
    delta: float = 0.0
    adaptive: AdaptiveClipping | None = None
    # --- Secure aggregation (Flower engine only; fed/secagg.py). ---------------------
    # secure_aggregation: "none" (the server sees each clipped update: simulator) or
    #   "secaggplus" (Flower's SecAgg+: the server sees only the sum).
    # noise_placement: "central" (the server adds N(0, z²C²) to the sum) or "distributed"
    #   (each of the n sampled clients adds N(0, z²C²/(n - k)) before masking).
    # max_dropouts: k, the dropouts a round tolerates; SecAgg+'s threshold is n - k, so the
    #   sum decodes only if at least n - k clients' vectors (and noise shares) are in it.
    secure_aggregation: str = "none"
    noise_placement: str = "central"
    max_dropouts: int = 0
    # clip_space: "parameters" (each client's update is clipped and noised) or
    #   "news_vectors" (its user-side gradient and news-vector cotangents are; the server
    #   forms the news-encoder gradient, fed/news_space.py).
    clip_space: str = "parameters"

    def __post_init__(self) -> None:
        check_secure_aggregation(secure_aggregation=self.secure_aggregation,
                                 noise_placement=self.noise_placement,
                                 max_dropouts=self.max_dropouts,
                                 adaptive=self.adaptive is not None)
        if self.clip_space == "news_vectors":
            if self.adaptive is not None:
                raise ConfigError("'clip_space' news_vectors (--clip-space) runs with a fixed "
                                  "--clip only: drop --adaptive-clip-quantile")
            if getattr(self.inner, "local_steps", 1) != 1:
                raise ConfigError("'clip_space' news_vectors (--clip-space) clips one "
                                  "gradient per client (a multi-step local update does not "
                                  "factor through the news vectors): pass --local-steps 1, "
                                  "or --clip-space parameters")

    @property
    def distributed(self) -> bool:
        """Whether the clients add the noise (in shares) instead of the server."""
        return self.noise_placement == "distributed"

    def secure_round(self, clients: int) -> SecAggRound | None:
        """The SecAgg+ parameters of a round of ``clients`` sampled clients, or ``None`` when
        the round has too few to hide each one (fewer than 2k + 1, or 2): then no client is
        asked and the round releases the noise alone (:mod:`privaterec.fed.secagg`)."""
        if clients < min_clients(self.max_dropouts):
            return None
        return plan_round(clients=clients, max_dropouts=self.max_dropouts, clip=self.clip,
                          sigma=self.noise_multiplier * self.clip,
                          distributed=self.distributed)

    def central_noise(self, dimension: int, source: NoiseSource) -> torch.Tensor:
        """The aggregator's seeded noise N(0, (z·C)² I) ``[dimension]`` (float32) of a
        simulation: ``calibrated_noise``'s draw from ``source``, a seeded
        :class:`~privaterec.privacy.samplers.SimulationNoise`
        (:func:`~privaterec.fed.rng.aggregator_noise`), added to the sum by the
        caller. Not float-safe, and so never a deployed release: a deployed server noises the
        sum itself with :meth:`release_sum` (:func:`float_safe_sum_release`).

        Raises
        ------
        PrivateRecError
            If ``source`` is not a :class:`~privaterec.privacy.samplers.SimulationNoise`.
        """
        _simulation_only(source, "central_noise")
        return calibrated_noise((dimension,), self.central_calibration(), noise=source)

    def release_sum(self, total: torch.Tensor, source: NoiseSource) -> torch.Tensor:
        """The aggregator's release of the round's clipped sum ``total`` ``[R]``: the sum plus
        N(0, (z·C)² I), float32.

        With a seeded :class:`~privaterec.privacy.samplers.SimulationNoise` (a simulation):
        ``total + central_noise(R, source)``, bit for
        bit the simulator's draw. With a deployed server's
        :class:`~privaterec.privacy.samplers.SecureNoise`: :func:`float_safe_sum_release` of
        the float64 sum (the mechanism sees the sum and rounds it to its public grid itself,
        so the low bits of the release carry nothing of it;
        docs/privacy.md#deployed-central-noise), then cast to float32 (post-processing).
        """
        if isinstance(source, SimulationNoise):  # drawn on the CPU, moved to the sum's device
            return total + self.central_noise(int(total.shape[0]), source).to(total.device)
        return float_safe_sum_release(total, sigma=self.central_calibration().scale,
                                      source=source).to(torch.float32)

    # ---------------------------------------------------------------- configuration
    @classmethod
    def resolve(cls, config: RunConfig) -> RunConfig:
        """Also z from ``target_epsilon`` (with q = ``client_fraction`` and T = ``rounds``),
        or a given z checked against it; the report composes at the guarantee's δ. With
        adaptive clipping, a given σ_b is checked against z (its default m / 20 depends on
        the population and is checked when the run starts, :meth:`check_population`).

        Raises
        ------
        ConfigError
            If ``clients_per_round`` is set (the accounting assumes Poisson sampling), the
            given z does not reach ``target_epsilon``, or σ_b ≤ z/2.
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
        if settings.clip_space == "news_vectors" and config.model.news_encoder == "plm":
            raise ConfigError("--clip-space news_vectors needs a news encoder that encodes "
                              "the news table's rows directly; the plm encoder reads its "
                              "frozen layers' cache: use --clip-space parameters")
        if settings.adaptive_clip_quantile is not None and settings.clip_count_stddev is not None:
            assert settings.noise_multiplier is not None
            update_noise_multiplier(noise_multiplier=settings.noise_multiplier,
                                    count_stddev=settings.clip_count_stddev)
        return replace(config, fed=replace(fed, settings=settings, report_delta=delta))

    @classmethod
    def from_config(cls, config: RunConfig) -> "CentralDP":
        """DP-FedAvg: FedRec's clients, central noise, with or without adaptive clipping (a
        resolved configuration: z is set)."""
        settings = config.fed.settings_as(DPFedAvgSettings)
        fed = config.fed
        assert (settings.noise_multiplier is not None
                and fed.client_fraction is not None), "resolve the config first"
        adaptive = None
        if settings.adaptive_clip_quantile is not None:
            assert settings.clip_lr is not None  # the settings state their default
            adaptive = AdaptiveClipping(target_quantile=settings.adaptive_clip_quantile,
                                        learning_rate=settings.clip_lr,
                                        count_stddev=settings.clip_count_stddev)
        inner = FedRec(**FedRec.common(config))
        return cls(negatives=config.train.negatives, max_samples=fed.max_client_samples,
                   inner=inner, clip=settings.clip, noise_multiplier=settings.noise_multiplier,
                   sampling_rate=fed.client_fraction, rounds=fed.rounds,
                   delta=settings.target_delta, adaptive=adaptive,
                   secure_aggregation=settings.secure_aggregation,
                   noise_placement=settings.noise_placement,
                   max_dropouts=settings.max_dropouts, clip_space=settings.clip_space)

    @property
    def by_impressions(self) -> bool:
        return self.inner.by_impressions

    def population(self, clients: ClientDataset) -> torch.Tensor:
        """Every training user: N (the divisor qN, δ < 1/N) and who is sampled must not
        depend on anyone's data, and under replacement a user whose new data has no training
        sample is still enrolled. Sampled, such a user takes part with a zero update: it
        counts in adaptive clipping's unclipped count and in the SecAgg+ round's plan (with
        its noise share under distributed noise), so no release changes shape with it."""
        return torch.arange(clients.num_users)

    def check_client(self, data: ClientData) -> None:
        self.inner.check_client(data)

    def check_population(self, population: int) -> None:
        """δ must be below 1/N: a δ that large allows releasing a user's data outright; with
        adaptive clipping, the count noise σ_b (its default m / 20 depends on N) must exceed
        z/2."""
        if not self.delta < 1 / max(1, population):
            raise ConfigError(f"dp-fedavg's 'fed.settings.target_delta' = {self.delta:g} is "
                              f"not below 1/N = {1 / max(1, population):.3g} for N = {population} "
                              f"training users: a delta that large allows releasing a user's "
                              f"data outright; pass --target-delta below "
                              f"{1 / max(1, population):.3g}")
        if self.secure_aggregation != "none":
            k = self.max_dropouts
            if population < min_clients(k):
                raise ConfigError(f"secure aggregation with --max-dropouts {k} needs rounds "
                                  f"of at least {min_clients(k)} clients, but there are "
                                  f"only {population} training users")
            # The largest possible round (every user sampled): its quantisation and share.
            plan_round(clients=population, max_dropouts=k, clip=self.clip,
                       sigma=self.noise_multiplier * self.clip, distributed=self.distributed)
        self.noise_split(expected_clients(self.sampling_rate, max(1, population)))

    def check_engine(self, engine: str) -> None:
        """Adaptive clipping runs on the simulator only: its clip is server state that the
        Flower engine's rounds do not carry. On Flower central DP runs through secure
        aggregation only, and secure aggregation on Flower only."""
        if self.adaptive is not None and engine != "simulator":
            raise ConfigError(f"--adaptive-clip-quantile "
                              f"('fed.settings.adaptive_clip_quantile', dp-fedavg's adaptive "
                              f"clipping) runs on the simulator engine "
                              f"only: the round's clip is server state that the {engine} "
                              f"engine does not send to its clients yet; use --engine "
                              f"simulator, or a fixed --clip without --adaptive-clip-quantile")
        if engine == "flower" and self.secure_aggregation == "none":
            raise ConfigError(f"{self.name} (central DP) on Flower runs through secure "
                              f"aggregation only: pass --secure-aggregation secaggplus (the "
                              f"server then sees only the sum), or use --engine simulator")
        if self.secure_aggregation != "none" and engine != "flower":
            raise ConfigError("--secure-aggregation secaggplus runs on the Flower engine only "
                              "(the simulator has no server to hide the updates from): pass "
                              "--engine flower, or --secure-aggregation none")

    # ------------------------------------------------------------------ server state
    def server_state(self) -> dict[str, float]:
        """Adaptive clipping: ``{"clip": C}``, the clip of this method's round (C_0 as built);
        none for a fixed clip."""
        return {} if self.adaptive is None else {"clip": float(self.clip)}

    def at_server_state(self, state: Mapping[str, float]) -> CentralDP:
        """This method with the round's clip C_t (adaptive clipping; itself otherwise)."""
        if self.adaptive is None or float(state["clip"]) == self.clip:
            return self
        return dataclasses.replace(self, clip=float(state["clip"]))

    def noise_split(self, expected: int) -> tuple[float, float | None]:
        """(noise multiplier of the update's sum, σ_b of the indicators' sum or None) for m =
        ``expected`` clients per round: (z, None) for a fixed clip, (z_Δ, σ_b) adaptive.

        Raises
        ------
        ConfigError
            If σ_b ≤ z/2 (:func:`~privaterec.privacy.adaptive_clip.update_noise_multiplier`).
        """
        if self.adaptive is None:
            return self.noise_multiplier, None
        return self.adaptive.noise_split(self.noise_multiplier, expected)

    def select(self, eligible: torch.Tensor, m: int, *, seed: int, round_index: int,
               source: NoiseSource | None = None) -> list[int]:
        """Poisson sampling: each eligible user with probability q (``m`` is not used);
        seeded in a simulation, from ``source`` (the OS CSPRNG) on a deployed server."""
        return poisson_round(eligible, self.sampling_rate, seed=seed, round_index=round_index,
                             source=source)

    def inputs(self, task: FederatedTask[Any], data: ClientData, *,
               noise: NoiseSource) -> Any:
        return self.inner.inputs(task, data, noise=noise)

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
        (calibrated once per method, cached). With adaptive clipping the event is the
        equivalent single release in units of the round's clip (noise z, sensitivity 1; the
        same every round) and the noises are drawn by :meth:`noised_sums`."""
        return _central_calibration(self)

    def central_event(self) -> PrivacyEvent:
        """The ledger event of one central-DP round, recorded for every user."""
        return self.central_calibration().event

    def population_events(self, dimension: int) -> tuple[PrivacyEvent, ...]:
        return (self.central_event(),)

    def update(self, task: FederatedTask[Any], params: torch.Tensor, inputs: Any, *,
               noise: NoiseSource) -> tuple[torch.Tensor, float]:
        """The wrapped method's update, clipped to L2 norm C (sent to the aggregator)."""
        payload, loss, _ = self.release(task, params, inputs, noise=noise)
        return payload, loss

    def release(self, task: FederatedTask[Any], params: torch.Tensor, inputs: Any, *,
                noise: NoiseSource) -> tuple[torch.Tensor, float, dict[str, float]]:
        """The clipped update ``Tensor[D]``, the loss and, with adaptive clipping, the
        centred clip indicator b − ½ (``clip_indicator``), all sent to the aggregator.

        With ``clip_space`` news_vectors the payload is instead clip(w_u, C)
        ``Tensor[D_U + P·d]`` (:meth:`~privaterec.fed.news_space.NewsSpaceClipping.pack`'s
        layout): the user-side gradient and the cotangents of every news of the table, a
        device's upload to SecAgg+ (:meth:`direction_from_release` turns the sum into θ's
        direction).
        """
        if self.clip_space == "news_vectors":
            space = self._news_space(task)
            sums = space.clipped_sum(params, space.objective.batch([inputs]), clip=self.clip)
            return space.pack(sums.user, sums.news), float(sums.losses[0]), {}
        update, loss = self.inner.update(task, params, inputs, noise=noise)
        clipped, _ = self.privatize(update[None], [noise])
        reports = ({} if self.adaptive is None else
                   {CLIP_INDICATOR: float(clip_indicators(update[None], self.clip)[0])})
        return clipped[0], loss, reports

    def client_updates(self, task: FederatedTask[Any], params: torch.Tensor,
                       inputs: Sequence[Any], sources: Sequence[NoiseSource], *,
                       chunk_clients: int) -> tuple[torch.Tensor, torch.Tensor]:
        updates, losses = self.inner.client_updates(task, params, inputs, sources,
                                                    chunk_clients=chunk_clients)
        clipped, _ = self.privatize(updates, sources)
        return clipped, losses

    def round(self, task: FederatedTask[Any], params: torch.Tensor, inputs: Sequence[Any],
              sources: Sequence[NoiseSource], context: RoundContext) -> RoundOutput:
        """(Σ clip(Δ_u, C) + N(0, z²C²I)) / (qN); the noise is the simulation's seeded draw
        (:func:`~privaterec.fed.rng.aggregator_noise`). With adaptive clipping, also
        the noised indicator count and the next clip (:meth:`aggregate`)."""
        if self.clip_space == "news_vectors":
            return self._news_space_round(task, params, inputs, context)
        dimension = task.dimension
        total = torch.zeros(dimension, device=params.device)
        indicator_sum = 0.0
        losses: list[float] = []
        if inputs:
            updates, loss_t = self.inner.client_updates(task, params, inputs, sources,
                                                        chunk_clients=context.chunk_clients)
            clipped, _ = self.privatize(updates, sources)
            total = clipped.sum(0)
            if self.adaptive is not None:
                indicator_sum = float(clip_indicators(updates, self.clip).sum())
            losses = [float(x) for x in loss_t]
        if self.adaptive is not None:  # an idle client's zero update is unclipped: +½ each
            indicator_sum += 0.5 * context.idle_clients
        return self.aggregate(total, indicator_sum, population=context.population,
                              noise=aggregator_noise(context.seed, context.round_index),
                              losses=losses)

    def _news_space_round(self, task: FederatedTask[Any], params: torch.Tensor,
                          inputs: Sequence[Any], context: RoundContext) -> RoundOutput:
        """``clip_space`` news_vectors: :meth:`news_space_release`, then the server's one
        backward pass through the news encoder
        (:meth:`~privaterec.fed.news_space.NewsSpaceClipping.direction`), over qN. The
        release is the same Gaussian mechanism as :meth:`round`'s (sensitivity C, noise
        z·C): the ledger event is the same."""
        space = self._news_space(task)
        user, news, losses = self._news_space_release(
            space, params, inputs, chunk_clients=context.chunk_clients,
            noise=aggregator_noise(context.seed, context.round_index))
        direction = space.direction(params, user, news)
        direction /= self.sampling_rate * context.population
        return RoundOutput(direction, losses, (self.central_event(),))

    @staticmethod
    def _news_space(task: FederatedTask[Any]) -> NewsSpaceClipping:
        if not isinstance(task, LocalObjective):
            raise ConfigError("--clip-space news_vectors applies to the ranking task only")
        try:
            return NewsSpaceClipping(task)
        except ValueError as error:
            raise ConfigError(f"--clip-space news_vectors: {error}; use --clip-space "
                              f"parameters") from error

    def news_space_release(self, task: FederatedTask[Any], params: torch.Tensor,
                           inputs: Sequence[Any], *, noise: NoiseSource,
                           chunk_clients: int = 16
                           ) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
        """The aggregator's release of one ``clip_space`` news_vectors round.

        Each client's w_u = [g_U ; (v_{u,n})_{n ∈ table}] is clipped to L2 norm C and summed
        (:meth:`~privaterec.fed.news_space.NewsSpaceClipping.clipped_sum`); N(0, (z·C)²) is
        added to every coordinate (:meth:`release_sum`: seeded in a simulation, float-safe
        from a :class:`~privaterec.privacy.samplers.SecureNoise`).

        Returns
        -------
        (``Tensor[D]``: the noised user-side sum on Θ_U's coordinates, 0 on Θ_N's;
        ``Tensor[P, d]``: the noised cotangent sum per news of the table; the clients'
        losses)
        """
        return self._news_space_release(self._news_space(task), params, inputs,
                                        noise=noise, chunk_clients=chunk_clients)

    def _news_space_release(self, space: NewsSpaceClipping, params: torch.Tensor,
                            inputs: Sequence[Any], *, noise: NoiseSource,
                            chunk_clients: int
                            ) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
        """:meth:`news_space_release` on an already built ``space`` (one per round)."""
        if inputs:
            sums = space.clipped_sum(params, space.objective.batch(inputs), clip=self.clip,
                                     chunk_clients=max(chunk_clients, USER_SIDE_CHUNK))
            total = space.pack(sums.user, sums.news)
            losses = [float(x) for x in sums.losses]
        else:
            total, losses = torch.zeros(space.release_dimension, device=params.device), []
        user, news = space.unpack(self.release_sum(total, noise))
        return user, news, losses

    def release_dimension(self, task: FederatedTask[Any]) -> int:
        """Coordinates of one client's release (and of the noise on the sum): D, or
        D_U + P·d with ``clip_space`` news_vectors."""
        if self.clip_space == "news_vectors":
            return self._news_space(task).release_dimension
        return task.dimension

    def direction_from_release(self, task: FederatedTask[Any], params: torch.Tensor,
                               noised_sum: torch.Tensor) -> torch.Tensor:
        """θ's direction ``Tensor[D]`` (before the division by qN) from the noised sum of
        the clients' releases ``[release_dimension]``: the sum itself, or with
        ``clip_space`` news_vectors the user-side part plus the news-encoder gradient of
        the noised cotangents (the server's backward pass over the public table:
        post-processing)."""
        if self.clip_space != "news_vectors":
            return noised_sum
        space = self._news_space(task)
        user, news = space.unpack(noised_sum)
        return space.direction(params, user, news)

    def noised_sums(self, total: torch.Tensor, indicator_sum: float, *, population: int,
                    noise: NoiseSource) -> tuple[torch.Tensor, float | None]:
        """The aggregator's release of one round: the sum of the clipped updates plus
        N(0, (z·C)² I) ``Tensor[D]`` (z_Δ·C_t with adaptive clipping) and, with adaptive
        clipping, the sum of the centred indicators plus N(0, σ_b²) (else None).

        Parameters
        ----------
        total: ``Tensor[D]``, Σ clip(Δ_u, C). indicator_sum: Σ (b_u − ½) (ignored without
        adaptive clipping). population: N (public), for the default σ_b. noise: the
        aggregator's source (a simulation's :class:`~privaterec.privacy.samplers.SimulationNoise`);
        the update's noise is drawn first, then the count's (:meth:`noised_rounds` of one
        round).
        """
        totals, counts = self.noised_rounds(
            total.reshape(1, -1), torch.tensor([float(indicator_sum)], dtype=torch.float64),
            population=population, noise=noise)
        return totals.reshape(total.shape), None if counts is None else float(counts[0])

    def noised_rounds(self, totals: torch.Tensor, indicator_sums: torch.Tensor, *,
                      population: int, noise: NoiseSource
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`noised_sums` of ``n`` independent rounds at once (the audit's batched
        rounds; docs/privacy.md#worst-case-canaries): ``totals`` ``Tensor[n, D]``,
        ``indicator_sums`` ``Tensor[n]``; returns the noised sums ``Tensor[n, D]`` and, with
        adaptive clipping, the noised indicator sums ``Tensor[n]`` float64 (else None). The
        n·D update noises are drawn first (one draw), then the n count noises; for n = 1
        these are exactly :meth:`noised_sums`' draws."""
        _simulation_only(noise, "noised_rounds")
        if self.adaptive is None:
            drawn = self.central_noise(int(totals.numel()), noise)
            return totals + drawn.reshape(totals.shape).to(totals.device), None
        z_update, sigma_b = self.noise_split(expected_clients(self.sampling_rate,
                                                              max(1, population)))
        assert sigma_b is not None
        drawn = noise.draw((int(totals.numel()),), mechanism="gaussian",
                           scale=z_update * self.clip, name="sigma")
        count_noise = noise.draw((int(totals.shape[0]),), mechanism="gaussian", scale=sigma_b,
                                 dtype=torch.float64, name="sigma")
        return (totals + drawn.reshape(totals.shape).to(totals.device),
                indicator_sums.to(torch.float64) + count_noise)

    def aggregate(self, total: torch.Tensor, indicator_sum: float, *, population: int,
                  noise: NoiseSource, losses: list[float] | None = None
                  ) -> RoundOutput:
        """The round's output from the clients' sums: the noised sum over qN, and with
        adaptive clipping the next clip C_{t+1} (``server_state``) and, in ``metrics``, the
        clip C_t used and the noised fraction b̃ of unclipped clients (post-processing)."""
        noisy_total, noisy_count = self.noised_sums(total, indicator_sum,
                                                    population=population, noise=noise)
        expected = self.sampling_rate * population
        direction = noisy_total / expected
        events = (self.central_event(),)
        if self.adaptive is None or noisy_count is None:
            return RoundOutput(direction, list(losses or []), events)
        fraction = self.adaptive.unclipped_fraction(noisy_count, expected)
        return RoundOutput(direction, list(losses or []), events,
                           server_state={"clip": self.adaptive.next_clip(self.clip, fraction)},
                           metrics={"clip": float(self.clip), "unclipped_fraction": fraction})

    def event_note(self) -> str:
        """The ledger note of a round under secure aggregation (``""``: the default note of
        :func:`~privaterec.privacy.central_accounting.central_round_event`, the server sees the
        clipped updates)."""
        news_space = self.clip_space == "news_vectors"
        if news_space and self.secure_aggregation == "none":
            return (f"central DP (DP-FedSGD, clipped in news-vector space): Poisson sampling "
                    f"q = {self.sampling_rate:g}, each client's user-side gradient and "
                    f"news-vector cotangents clipped to L2 norm {self.clip:g} together, "
                    f"Gaussian noise z = {self.noise_multiplier:g} on every coordinate of "
                    f"the sum (the user side and every news of the table); the server sees "
                    f"the clipped vectors; one user's data replaced (covers one click and "
                    f"one user)")
        if self.secure_aggregation == "none":
            return ""
        algorithm = ("DP-FedSGD, clipped in news-vector space" if news_space
                     else "DP-FedAvg")
        clipped = ("each client's [user-side gradient ; cotangents of the news vectors of "
                   "every news of the table] clipped to L2 norm" if news_space
                   else "updates clipped to L2 norm")
        common = (f"Poisson sampling q = {self.sampling_rate:g}, {clipped} "
                  f"{self.clip:g} and rounded toward zero onto SecAgg+'s grid (norm still <= "
                  f"{self.clip:g}), summed by SecAgg+ (the server sees only the sum of the "
                  f"clients that did not drop out, at most {self.max_dropouts})")
        if not self.distributed:
            return (f"central DP ({algorithm}) with secure aggregation: {common}; the server "
                    f"adds Gaussian noise z = {self.noise_multiplier:g} to the sum; one "
                    f"user's data replaced (covers one click and one user)")
        return (f"distributed DP ({algorithm}) with secure aggregation: {common}; each of the "
                f"n sampled clients adds N(0, (z C)^2/(n - {self.max_dropouts})), z = "
                f"{self.noise_multiplier:g}, before masking, so the sum carries noise of "
                f"std >= z C when at most {self.max_dropouts} clients drop out (SecAgg+'s "
                f"threshold n - {self.max_dropouts} refuses to decode otherwise); rounding "
                f"and SecAgg+'s range clip put the release within total variation 1.2e-38 "
                f"per coordinate and client of the accounted Gaussian mechanism; one user's "
                f"data replaced (covers one click and one user)")

    def describe(self, *, dimension: int, parameters: Sequence[str], clients_per_round: int,
                 client_fraction: float) -> dict[str, Any]:
        """Not here: DP-FedAvg's release block, with its trust model and adaptive clipping,
        is written by :func:`privaterec.runs.report.central_dp_release` (the reports' layer);
        :func:`privaterec.runs.report.release_description` calls it."""
        raise NotImplementedError("DP-FedAvg is described by "
                                  "privaterec.runs.report.central_dp_release")


def float_safe_sum_release(total: torch.Tensor, *, sigma: float,
                           source: NoiseSource) -> torch.Tensor:
    """A deployed aggregator's Gaussian release of a sum: ``total`` ``[R]`` + N(0, σ² I),
    float-safe, as float64 ``[R]``.

    The sum itself (as float64) goes through ``source.release_gaussian``: OpenDP's discrete
    Gaussian on the public grid 2^k (:class:`~privaterec.privacy.samplers.SecureNoise`,
    Canonne, Kamath & Steinke 2020), which rounds its input to the grid and adds integer
    multiples of 2^k, so every output is a multiple of 2^k whatever the sum. Drawing the
    noise at zero and adding it to the sum in floating point instead lets the output's low
    bits tell sums apart (Mironov, CCS 2012; docs/privacy.md#deployed-central-noise).

    Parameters
    ----------
    total: ``Tensor[R]``, the decoded sum of the clipped updates.
    sigma: σ = z·C (the calibration's scale).
    source: a secure source (the OS CSPRNG).

    Raises
    ------
    PrivateRecError
        If ``source`` is not secure (a seeded source is a simulation: use
        :meth:`CentralDP.central_noise`).
    """
    if not getattr(source, "secure", False):
        raise PrivateRecError("float_safe_sum_release is a deployed release: it needs a secure "
                              "source (SecureNoise), got a seeded one")
    return source.release_gaussian(total.detach().to(torch.float64), sigma=sigma)


@functools.lru_cache(maxsize=64)
def _central_calibration(method: CentralDP) -> Calibration:
    if method.adaptive is not None:
        return Calibration(event=adaptive_round_event(
            noise_multiplier=method.noise_multiplier, sampling_rate=method.sampling_rate,
            delta=method.delta, adaptive=method.adaptive))
    return central_calibration(noise_multiplier=method.noise_multiplier,
                               sampling_rate=method.sampling_rate, clip=method.clip,
                               delta=method.delta, note=method.event_note())


__all__ = ["CLIP_INDICATOR", "CentralDP", "expected_clients", "float_safe_sum_release"]
