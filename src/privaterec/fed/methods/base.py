"""What every federated method is: a small class with the same few hooks
(docs/architecture.md#seams).

A method says what a client does in a round with a task's gradients
(:class:`~privaterec.fed.task.FederatedTask`):

* :meth:`ClientMethod.inputs` — the client's own random draws (samples, negatives, ...);
* :meth:`ClientMethod.privatize` — what it does to its update before upload (clip, noise);
* :meth:`ClientMethod.events` — the privacy events one client's upload spends (for the
  ledger; a function of the public settings only);
* :meth:`ClientMethod.describe` — its public settings, for ``privacy.json``
  (:func:`privaterec.runs.report.release_description` builds the report's block).

The engine calls :meth:`ClientMethod.update` (one client: the reference every engine must
reproduce) and :meth:`ClientMethod.round` (a round's clients at once, vectorized); their
defaults compute the task's gradients and privatize them. Methods never branch on another
method's name: what differs is a subclass (or, for central DP, a wrapper).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Mapping, Sequence, TypeVar

import torch

from privaterec.data.clients import ClientData, ClientDataset
from privaterec.errors import ConfigError
from privaterec.fed.sampling import eligible_clients, roster, sample_round
from privaterec.fed.strategies import ServerDefaults, weighted_mean
from privaterec.fed.task import FederatedTask
from privaterec.method_settings import MethodSettings
from privaterec.privacy.calibrate import Calibration
from privaterec.privacy.events import Adjacency, PrivacyEvent
from privaterec.privacy.ledger import adjacency_view, basic_composition
from privaterec.privacy.mechanisms import release_rows
from privaterec.privacy.samplers import NoiseSource

TaskT = TypeVar("TaskT", bound="FederatedTask[Any]")
"""The task a method trains (the ranking methods: ``LocalObjective``; Uni-FedRec's:
``RecallTask``; a method for any task: ``FederatedTask[Any]``)."""


@dataclass(frozen=True)
class RoundContext:
    """The public facts of one round a method's vectorized :meth:`ClientMethod.round` may use.

    seed, round_index: select the round's generators (:mod:`privaterec.fed.rng`).
    chunk_clients: clients per ``vmap`` chunk. population: N, the number of eligible users
    (central DP divides its noised sum by qN). idle_clients: sampled users without a
    training sample (:meth:`ClientMethod.has_update` is false), who take part with a zero
    update: they are not in the round's inputs, and a method whose release counts the
    participants (adaptive clipping's unclipped count) counts them.
    """

    seed: int
    round_index: int
    chunk_clients: int = 16
    population: int = 0
    idle_clients: int = 0


@dataclass(frozen=True)
class RoundOutput:
    """A round's aggregate direction ḡ ``[D]`` and the clients' losses (a simulation-only
    diagnostic), and the releases recorded for every user of the population (central DP).

    ``server_state``: the method's server state for the next round (``None``: unchanged;
    adaptive clipping's next clip, :meth:`ClientMethod.server_state`). ``metrics``: public
    values of the round for the run's log (e.g. the clip in use and the noised fraction of
    unclipped clients: post-processing of the round's release).
    """

    direction: torch.Tensor
    losses: list[float]
    population_events: tuple[PrivacyEvent, ...] = ()
    server_state: dict[str, float] | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ClientMethod(ABC, Generic[TaskT]):
    """What a client does in a round, fully resolved (a frozen, public description), for
    the tasks of type ``TaskT``.

    A method owns its configuration: ``settings_type``, the class of its settings in
    ``FedConfig.settings`` (:mod:`privaterec.method_settings`), and ``server_defaults``, its
    defaults of the engine's settings a configuration leaves open (strategy, sampling
    fraction, server η, FedAdam's τ). A method of the ranking task is built from a run
    configuration by its ``from_config`` (:mod:`privaterec.fed.methods.registry`).

    Attributes
    ----------
    negatives: k sampled non-clicked news per click. max_samples: samples per round cap.
    """

    name: ClassVar[str] = ""
    settings_type: ClassVar[type[MethodSettings]]
    server_defaults: ClassVar[ServerDefaults]
    trusted_aggregator: ClassVar[bool] = False
    """Whether the server sees the clipped updates and adds the noise (central DP)."""

    negatives: int
    max_samples: int

    # ---------------------------------------------------------------- participation
    @property
    def by_impressions(self) -> bool:
        """Whether who takes part is decided by labelled impressions (PrivateRec) rather than
        by training samples (:func:`~privaterec.fed.sampling.eligible_clients`)."""
        return False

    def population(self, clients: ClientDataset) -> torch.Tensor:
        """``LongTensor``: the users a round samples from, and N of the method's accounting:
        the roster, every enrolled user whatever their clicks (who takes part must not
        depend on the data a release protects; a sampled user without a training sample
        sends a release of the same shape, :meth:`idle_release`). With
        :attr:`by_impressions` (PrivateRec), the users with a labelled impression
        (:func:`~privaterec.fed.sampling.eligible_clients`), which does not depend on
        their clicks either."""
        if self.by_impressions:
            if clients.roster_only:
                raise ConfigError(
                    f"method {self.name!r} samples from the users with a labelled "
                    "impression, which a server holding only the roster (public-dir) cannot "
                    "know: it runs on Flower only as a simulation or seeded rehearsal "
                    "(data-dir with seeded-rehearsal=true); deploy a method that samples the "
                    "roster (dp-fedrec, fednewsrec, dp-fedavg)")
            return eligible_clients(clients, by_impressions=True)
        return roster(clients)

    def check_client(self, data: ClientData) -> None:
        """Raise ``ValueError`` if the client cannot take part (no training sample)."""
        if data.num_samples == 0:
            raise ValueError(f"client {data.user_id!r} has no training sample")

    enrols_every_user: ClassVar[bool] = True
    """Whether :meth:`population` holds users whatever their data: a sampled user without a
    training sample then takes part with a zero update (noised like any client's release,
    :meth:`idle_release`; central DP: a zero vector in the sum)."""

    def has_update(self, data: ClientData) -> bool:
        """Whether the client computes an update (:meth:`check_client` passes); ``False``: a
        client without a training sample, of a method that :attr:`enrols_every_user`, which
        takes part with a zero update (:attr:`RoundContext.idle_clients`).

        Raises
        ------
        ValueError
            From :meth:`check_client`, if the client cannot take part and the method samples
            only the users who can.
        """
        try:
            self.check_client(data)
        except ValueError:
            if self.enrols_every_user:
                return False
            raise
        return True

    def check_population(self, population: int) -> None:
        """Refuse settings that cannot hold for ``population`` training users (none here).

        Raises
        ------
        ConfigError
            Naming the setting and what to pass instead.
        """

    def check_engine(self, engine: str) -> None:
        """Refuse an engine this method's settings cannot run on (none here).

        Raises
        ------
        ConfigError
            Naming the setting and what to pass instead.
        """

    def select(self, eligible: torch.Tensor, m: int, *, seed: int, round_index: int,
               source: NoiseSource | None = None) -> list[int]:
        """The round's clients: m of the eligible users, without replacement (seeded; from
        ``source``, the OS CSPRNG, on a deployed server)."""
        return sample_round(eligible, m, seed=seed, round_index=round_index, source=source)

    # ------------------------------------------------------------------ server state
    def server_state(self) -> dict[str, float]:
        """The public state the server carries from round to round for this method, as it
        starts (checkpointed with θ; none by default; adaptive clipping: the clip)."""
        return {}

    def at_server_state(self, state: Mapping[str, float]) -> ClientMethod[TaskT]:
        """This method as its clients run it in a round whose server state is ``state``
        (itself by default; adaptive clipping: with the round's clip)."""
        return self

    @property
    def sends_metadata(self) -> bool:
        """Whether a client also sends its loss and number of samples (only a method whose
        upload is not private anyway; a private method's client sends its released update
        only: a count or a loss would be an unaccounted release)."""
        return False

    def aggregation_weight(self, num_examples: int) -> float:
        """The weight of a client's update in the server's mean: its number of samples
        (FedNewsRec Eq. 6) when that number is sent, else 1 (a private method's server must
        not depend on a private count)."""
        return float(num_examples) if self.sends_metadata else 1.0

    @property
    def per_client_release(self) -> bool:
        """Whether each client clips or noises its own update (needs per-client gradients)."""
        return True

    # -------------------------------------------------------------------- the hooks
    def inputs(self, task: TaskT, data: ClientData, *, noise: NoiseSource) -> Any:
        """The client's inputs after its own random draws (the task's, by default)."""
        return task.client_inputs(data, max_samples=self.max_samples,
                                  negatives=self.negatives, noise=noise)

    def calibration(self, dimension: int) -> Calibration:
        """How one client's D-dim update is released (clip, noise, event), calibrated once
        per (method, D) (cached)."""
        return _calibration(self, dimension)

    @abstractmethod
    def _calibrate(self, dimension: int) -> Calibration:
        """:meth:`calibration`, computed (the cache calls it once per (method, D))."""

    def privatize(self, updates: torch.Tensor,
                  sources: Sequence[NoiseSource]) -> tuple[torch.Tensor, PrivacyEvent]:
        """Clip and noise each client's update before upload, as :meth:`calibration` says.

        Parameters
        ----------
        updates:
            ``Tensor[m, D]``, row i is client i's gradient (or FedAvg pseudo-gradient).
        sources:
            One per row: client i's noise comes from its own generator (on a real device,
            its own secure source, :class:`~privaterec.privacy.samplers.SecureNoise`), so
            every engine draws the same noise for the same client. Clipping is batched;
            only the noise draws visit the clients.

        Returns
        -------
        (``Tensor[m, D]`` released updates, the :class:`PrivacyEvent` of ONE client's release)
        """
        if len(sources) != updates.shape[0]:
            raise ValueError(f"need one generator per client: {len(sources)} for "
                             f"{updates.shape[0]} updates")
        calibration = self.calibration(int(updates.shape[1]))
        return release_rows(updates, calibration, sources), calibration.event

    def idle_release(self, dimension: int,
                     sources: Sequence[NoiseSource]) -> torch.Tensor:
        """The releases ``Tensor[k, D]`` of k sampled users without a training sample: a
        zero update released as any client's (:meth:`privatize`: clipped, then noised from
        each user's own source), so that what the server receives, and the ledger, have the
        same shape whether or not the user has data."""
        return self.privatize(torch.zeros(len(sources), dimension), sources)[0]

    def event(self, dimension: int) -> PrivacyEvent:
        """The privacy event of one client's upload in one round."""
        return self.calibration(dimension).event

    def events(self, dimension: int) -> tuple[PrivacyEvent, ...]:
        """All events of one client's round (recorded under the client's id)."""
        return (self.event(dimension),)

    def population_events(self, dimension: int) -> tuple[PrivacyEvent, ...]:
        """Events of one round recorded for every eligible user, sampled or not (central
        DP's round release); none for a local method."""
        return ()

    def round_epsilon(self, dimension: int, adjacency: Adjacency) -> tuple[float, float]:
        """(ε, δ) of one client's round under ``adjacency`` by basic composition (the
        ledger composes the run more tightly)."""
        round_events = self.events(dimension) + self.population_events(dimension)
        events = [(e, 1) for e in round_events]
        pairs = [basic_composition(g) for g in adjacency_view(events, adjacency)]
        return max(p[0] for p in pairs), max(p[1] for p in pairs)

    @abstractmethod
    def describe(self, *, dimension: int, parameters: Sequence[str], clients_per_round: int,
                 client_fraction: float) -> dict[str, Any]:
        """The method's release, described for ``privacy.json`` (its method-specific part;
        :func:`privaterec.runs.report.release_description` adds what every method shares).

        Parameters
        ----------
        dimension: D. parameters: the names of θ's parameters (the noised ones).
        clients_per_round, client_fraction: the round's public sampling.
        """

    # ------------------------------------------------------------------ computation
    def num_examples(self, inputs: Any) -> int:
        """|B_u|: the number of samples in a client's inputs."""
        return int(inputs.candidates.shape[0])

    def update(self, task: TaskT, params: torch.Tensor, inputs: Any, *,
               noise: NoiseSource) -> tuple[torch.Tensor, float]:
        """One client's released update ``Tensor[D]`` and its loss (the reference)."""
        grad, loss = task.gradient(params, inputs)
        released, _ = self.privatize(grad[None], [noise])
        return released[0], loss

    def release(self, task: TaskT, params: torch.Tensor, inputs: Any, *,
                noise: NoiseSource) -> tuple[torch.Tensor, float, dict[str, float]]:
        """One client's upload: :meth:`update` and the scalars it sends next to it (none by
        default; adaptive clipping: the centred clip indicator), each covered by an
        accounted release."""
        payload, loss = self.update(task, params, inputs, noise=noise)
        return payload, loss, {}

    def client_updates(self, task: TaskT, params: torch.Tensor,
                       inputs: Sequence[Any], sources: Sequence[NoiseSource], *,
                       chunk_clients: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The released updates ``Tensor[m, D]`` and losses ``Tensor[m]`` of a round's
        clients, vectorized (equal to one :meth:`update` per client up to rounding)."""
        updates, losses = task.gradients(params, inputs, chunk_clients=chunk_clients)
        released, _ = self.privatize(updates, sources)
        return released, losses

    def round(self, task: TaskT, params: torch.Tensor, inputs: Sequence[Any],
              sources: Sequence[NoiseSource], context: RoundContext) -> RoundOutput:
        """A round's aggregate: the weighted mean of :meth:`client_updates`."""
        released, losses = self.client_updates(task, params, inputs, sources,
                                               chunk_clients=context.chunk_clients)
        weights = torch.tensor([self.aggregation_weight(self.num_examples(x)) for x in inputs])
        return RoundOutput(weighted_mean(released, weights), [float(x) for x in losses])


@functools.lru_cache(maxsize=64)
def _calibration(method: ClientMethod[Any], dimension: int) -> Calibration:
    return method._calibrate(dimension)


__all__ = ["ClientMethod", "RoundContext", "RoundOutput", "TaskT"]
