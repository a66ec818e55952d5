"""Federated training loop and the vectorized in-process simulator (the default engine).

Per round t (FedNewsRec §3.2; PrivateRec Alg. 3): the server samples a fraction r of the
training users without replacement (:func:`sample_round`, seeded by (seed, t)), each
sampled client computes its update (:func:`privaterec.fed.client.client_update`), the server
aggregates them weighted by their numbers of samples and steps its strategy; every release
goes into the privacy ledger; the test split is evaluated every N rounds.

:func:`simulate_round` computes the round's updates in process without a Python loop over
clients in the compute: with no per-client clipping/noise one backward pass gives the
weighted gradient; otherwise per-client gradients come from ``vmap(grad)`` in chunks, are
clipped in one batched call, and each client's noise is drawn from its own generator.
:func:`sequential_round` is the reference it must equal (one ``client_update`` per client).
:func:`train_federated` runs the loop for any engine given its round function (the Flower
ServerApp passes one that messages the devices).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from tqdm.auto import tqdm

from privaterec.config import FedConfig
from privaterec.data.clients import ClientDataset
from privaterec.errors import TrainingDivergedError
from privaterec.fed.client import client_inputs, client_update
from privaterec.fed.methods import ClientMethod, privatize, privatize_history
from privaterec.fed.objective import ClientBatch, LocalObjective
from privaterec.fed.rng import central_noise_generator, client_generator, round_generator
from privaterec.fed.strategies import State, Strategy, aggregate, weighted_mean
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.ledger import PrivacyLedger
from privaterec.privacy.mechanisms import calibrated_noise
from privaterec.training.checkpoint import load_checkpoint, save_checkpoint
from privaterec.training.determinism import deterministic_algorithms, flush_denormals


@dataclass
class RoundResult:
    """A round's aggregate: direction ḡ ``[D]``, and per client its samples, loss, events.

    ``num_examples`` and ``losses`` are what the server knows: a private method's clients do
    not send them (:meth:`~privaterec.fed.client.ClientUpdate.sent`), so the Flower engine
    leaves them ``None``; the simulator computes them as a simulation-only diagnostic.
    """

    direction: torch.Tensor
    num_examples: list[int] | None
    losses: list[float] | None
    events: list[tuple[PrivacyEvent, ...]]
    population_events: tuple[PrivacyEvent, ...] = ()
    """Central DP: the round's release, recorded for every user of the population (Poisson
    sampling amplifies for everyone, sampled or not)."""


RoundFn = Callable[[torch.Tensor, list[int], int], RoundResult]


# ----------------------------------------------------------------------------- sampling
def eligible_clients(clients: ClientDataset, *, by_impressions: bool = False) -> torch.Tensor:
    """Indices of the users with at least one training sample.

    ``by_impressions`` (PrivateRec): with at least one labelled impression instead, whatever
    its clicks — who takes part must not depend on the clicks the label release protects.
    """
    counts = clients.impressions_per_user() if by_impressions else clients.samples_per_user()
    return torch.nonzero(counts > 0).flatten()


def clients_per_round(fed: FedConfig, num_eligible: int) -> int:
    """m = ``clients_per_round`` or max(1, round(r · users)), at most the number of users."""
    if fed.clients_per_round is not None:
        return min(fed.clients_per_round, num_eligible)
    assert fed.client_fraction is not None, "resolve the FedConfig first"
    return max(1, min(num_eligible, round(fed.client_fraction * num_eligible)))


def poisson_round(eligible: torch.Tensor, q: float, *, seed: int,
                  round_index: int) -> list[int]:
    """Each eligible user independently with probability q (DP-FedAvg's Poisson sampling,
    seeded by (seed, round)); the number of clients varies from round to round."""
    u = torch.rand(len(eligible), generator=round_generator(seed, round_index),
                   dtype=torch.float64)
    return sorted(int(x) for x in eligible[u < q])


def sample_round(eligible: torch.Tensor, m: int, *, seed: int, round_index: int) -> list[int]:
    """m distinct clients for round ``round_index`` (seeded, without replacement), sorted."""
    order = torch.randperm(len(eligible), generator=round_generator(seed, round_index))
    return sorted(int(u) for u in eligible[order[:m]])


# ------------------------------------------------------------------------------- rounds
def simulate_round(objective: LocalObjective, params: torch.Tensor, clients: ClientDataset,
                   selected: Sequence[int], method: ClientMethod, *, seed: int,
                   round_index: int, chunk_clients: int = 16) -> RoundResult:
    """All updates of one round, vectorized; equal to :func:`sequential_round` up to rounding.

    Parameters
    ----------
    objective, params: the model and the global θ ``[D]``.
    clients: all clients; ``selected`` the user indices of this round.
    method: what clients do. seed, round_index: select the clients' generators.
    chunk_clients: clients per ``vmap`` chunk (memory bound).
    """
    if method.is_central:
        return central_round(objective, params, clients, selected, method, seed=seed,
                             round_index=round_index, chunk_clients=chunk_clients,
                             population=len(eligible_clients(clients)))  # public N
    generators = [client_generator(seed, round_index, u) for u in selected]
    # Each client's own random draws (steps 1-5 of client_update), then batched compute.
    inputs = [client_inputs(clients.client(u), method, basis_size=objective.basis_size,
                            generator=g) for u, g in zip(selected, generators)]
    noise = ([x.attention_noise for x in inputs] if method.is_privaterec else None)
    batch = ClientBatch.stack([x.history for x in inputs], [x.history_mask for x in inputs],
                              [x.candidates for x in inputs], noise)
    counts = torch.tensor([x.candidates.shape[0] for x in inputs])
    weights = torch.tensor([method.aggregation_weight(int(n)) for n in counts])
    events = method.events(objective.dimension)
    if not method.per_client_release and method.local_steps == 1:
        direction, loss = objective.round_gradient(params, batch,
                                                   uniform_clients=not method.sends_metadata)
        losses = [loss] * len(selected)  # per-client losses are not computed on this path
    elif method.is_privaterec:  # strict: candidate path raw, history path clipped + noised
        split, loss_t = objective.client_gradients(params, batch, chunk_clients=chunk_clients,
                                                   split_history=True)
        noised, _ = privatize_history(split[:, 1], method, generators)
        direction = weighted_mean(split[:, 0] + noised, weights)
        losses = [float(x) for x in loss_t]
    else:
        updates, loss_t = _client_updates(objective, params, batch, method, chunk_clients)
        released, _ = privatize(updates, method, generators)
        direction = weighted_mean(released, weights)
        losses = [float(x) for x in loss_t]
    return RoundResult(direction, counts.tolist(), losses, [events] * len(selected))


def _client_updates(objective: LocalObjective, params: torch.Tensor, batch: ClientBatch,
                    method: ClientMethod, chunk_clients: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-client updates ``[m, D]`` (gradients, or FedAvg pseudo-gradients when
    ``local_steps`` > 1) and losses ``[m]`` of a batch of clients."""
    if method.local_steps == 1:
        return objective.client_gradients(params, batch, chunk_clients=chunk_clients)
    return objective.local_deltas(params, batch, steps=method.local_steps, lr=method.local_lr,
                                  chunk_clients=chunk_clients)


def central_round(objective: LocalObjective, params: torch.Tensor, clients: ClientDataset,
                  selected: Sequence[int], method: ClientMethod, *, seed: int,
                  round_index: int, chunk_clients: int = 16,
                  population: int) -> RoundResult:
    """One DP-FedAvg round (McMahan et al. 2018): (Σ clip(Δ_u, C) + N(0, z²C²I)) / (qN).

    Each sampled client computes its update (gradient, or FedAvg pseudo-gradient) and clips it
    to L2 norm C (:func:`privatize` with no local noise); the aggregator adds Gaussian noise
    of standard deviation z·C once to the sum and divides by the expected number of clients
    qN (a fixed denominator, so the noise calibration holds whatever the sampled count).
    The noise here is the simulation's seeded draw (:func:`central_noise_generator`).
    """
    assert method.noise_multiplier is not None and method.sampling_rate is not None
    assert method.clip is not None
    dimension = objective.dimension
    total = torch.zeros(dimension)
    counts: list[int] = []
    losses: list[float] = []
    if selected:
        generators = [client_generator(seed, round_index, u) for u in selected]
        inputs = [client_inputs(clients.client(u), method, basis_size=objective.basis_size,
                                generator=g) for u, g in zip(selected, generators)]
        batch = ClientBatch.stack([x.history for x in inputs], [x.history_mask for x in inputs],
                                  [x.candidates for x in inputs])
        updates, loss_t = _client_updates(objective, params, batch, method, chunk_clients)
        clipped, _ = privatize(updates, method, generators)
        total = clipped.sum(0)
        counts = [int(x.candidates.shape[0]) for x in inputs]
        losses = [float(x) for x in loss_t]
    noise = calibrated_noise((dimension,), method.central_calibration(),
                             generator=central_noise_generator(seed, round_index))
    direction = (total + noise) / (method.sampling_rate * population)
    return RoundResult(direction, counts, losses, [()] * len(selected),
                       population_events=(method.central_event(),))


def sequential_round(objective: LocalObjective, params: torch.Tensor, clients: ClientDataset,
                     selected: Sequence[int], method: ClientMethod, *, seed: int,
                     round_index: int) -> RoundResult:
    """The reference: one :func:`client_update` per client, then :func:`aggregate`."""
    updates = [client_update(objective, params, clients.client(u), method,
                             generator=client_generator(seed, round_index, u))
               for u in selected]
    return RoundResult(aggregate(updates), [u.num_examples for u in updates],
                       [float(u.metrics["loss"]) for u in updates],
                       [u.privacy_events for u in updates])


# ------------------------------------------------------------------------------ training
@dataclass
class FederatedState:
    """Everything a checkpoint holds: θ, strategy state, next round, ledger, log."""

    params: torch.Tensor
    strategy_state: State
    round_index: int = 0
    ledger: PrivacyLedger = field(default_factory=PrivacyLedger)
    log: list[dict[str, Any]] = field(default_factory=list)

    def to_checkpoint(self, objective: LocalObjective, method: str) -> dict[str, Any]:
        objective.load(self.params)
        return {"model": objective.model.state_dict(), "params": self.params,
                "strategy_state": self.strategy_state, "round": self.round_index,
                "ledger": self.ledger.to_dict(), "log": self.log, "method": method,
                "rng": {"derived_from": "(seed, round, client)",
                        "next_round": self.round_index}}

    @classmethod
    def from_checkpoint(cls, state: dict[str, Any]) -> "FederatedState":
        return cls(params=state["params"], strategy_state=state["strategy_state"],
                   round_index=int(state["round"]),
                   ledger=PrivacyLedger.from_dict(state["ledger"]), log=list(state["log"]))


RoundCallback = Callable[[int, "FederatedState"], dict[str, Any] | None]



def train_federated(objective: LocalObjective, clients: ClientDataset, fed: FedConfig,
                    method: ClientMethod, strategy: Strategy, *, seed: int,
                    round_fn: RoundFn | None = None,
                    checkpoint_path: str | Path | None = None,
                    on_evaluate: RoundCallback | None = None,
                    on_checkpoint: Callable[[FederatedState], None] | None = None,
                    progress: bool = True,
                    stop_after_rounds: int | None = None,
                    checkpoint_extra: dict[str, Any] | None = None) -> FederatedState:
    """Run ``fed.rounds`` rounds from θ = the model's parameters; resume from a checkpoint.

    Parameters
    ----------
    objective: the model (its parameters are the initial θ; the final θ is loaded into it).
    clients: the training users. fed: rounds, sampling, evaluation/checkpoint periods.
    method, strategy: client and server behaviour. seed: the run's seed.
    round_fn: computes one round (default :func:`simulate_round`); another engine (Flower)
        passes its own.
    checkpoint_path: saved every ``fed.checkpoint_every`` rounds and at the end; a run
        resumed from it ends with exactly the parameters of an uninterrupted run.
    on_evaluate: called every ``fed.eval_every`` rounds with θ loaded in the model; its dict
        is logged. on_checkpoint: called after each checkpoint (e.g. to
        write ``privacy.json``).
    stop_after_rounds: stop after this many rounds of this call (tests of resumption).
    checkpoint_extra: entries added to every checkpoint (e.g. what a resume must match).
    """
    if round_fn is None:
        def round_fn(params: torch.Tensor, selected: list[int], t: int) -> RoundResult:
            return simulate_round(objective, params, clients, selected, method, seed=seed,
                                  round_index=t, chunk_clients=fed.chunk_clients)
    with deterministic_algorithms(), flush_denormals():
        return _train(objective, clients, fed, method, strategy, seed=seed, round_fn=round_fn,
                      checkpoint_path=checkpoint_path, on_evaluate=on_evaluate,
                      on_checkpoint=on_checkpoint, progress=progress,
                      stop_after_rounds=stop_after_rounds,
                      checkpoint_extra=checkpoint_extra or {})


def _train(objective: LocalObjective, clients: ClientDataset, fed: FedConfig,
           method: ClientMethod, strategy: Strategy, *, seed: int, round_fn: RoundFn,
           checkpoint_path: str | Path | None, on_evaluate: RoundCallback | None,
           on_checkpoint: Callable[[FederatedState], None] | None, progress: bool,
           stop_after_rounds: int | None, checkpoint_extra: dict[str, Any]) -> FederatedState:
    if checkpoint_path is not None and Path(checkpoint_path).exists():
        saved = load_checkpoint(checkpoint_path)
        objective.model.load_state_dict(saved["model"])  # frozen parameters too
        state = FederatedState.from_checkpoint(saved)
    else:
        params = objective.parameters()
        state = FederatedState(params=params, strategy_state=strategy.init_state(params))
    eligible = eligible_clients(clients, by_impressions=method.is_privaterec)
    population_ids = [clients.user_ids[int(u)] for u in eligible]  # central DP's ledger rows
    m = clients_per_round(fed, len(eligible))

    def checkpoint() -> None:
        if checkpoint_path is not None:
            save_checkpoint(checkpoint_path,
                            {**state.to_checkpoint(objective, method.name), **checkpoint_extra})
        if on_checkpoint is not None:
            on_checkpoint(state)

    rounds_run = 0
    bar = tqdm(total=fed.rounds, initial=state.round_index, disable=not progress,
               desc=f"{method.name} rounds", unit="round", leave=False)
    while state.round_index < fed.rounds:
        t = state.round_index
        if method.is_central:
            assert method.sampling_rate is not None
            selected = poisson_round(eligible, method.sampling_rate, seed=seed, round_index=t)
        else:
            selected = sample_round(eligible, m, seed=seed, round_index=t)
        result = round_fn(state.params, selected, t)
        params, strategy_state = strategy.step(state.params, state.strategy_state,
                                               result.direction)
        if not bool(torch.isfinite(params).all()):
            last_saved = state.round_index - state.round_index % fed.checkpoint_every
            raise TrainingDivergedError(
                f"federated training diverged in round {t + 1}: the parameters became NaN or "
                f"infinite (last checkpoint: round {last_saved}); lower the server learning "
                f"rate (--server-lr, now {getattr(strategy, 'lr', '?')}) and train into a new "
                f"--out directory")
        state.params, state.strategy_state = params, strategy_state
        by_event: dict[PrivacyEvent, list[str]] = {}
        for u, client_events in zip(selected, result.events):
            for event in client_events:
                by_event.setdefault(event, []).append(clients.user_ids[u])
        for event, users in by_event.items():
            state.ledger.record_many(users, event)
        for event in result.population_events:
            state.ledger.record_many(population_ids, event)
        entry: dict[str, Any] = {"round": t + 1, "clients": len(selected)}
        if result.num_examples is not None and result.losses is not None:
            n = sum(result.num_examples)
            entry["samples"] = n
            entry["loss"] = (sum(l * k for l, k in zip(result.losses, result.num_examples)) / n
                             if n else float("nan"))
        state.round_index = t + 1
        rounds_run += 1
        last = state.round_index == fed.rounds
        if (on_evaluate is not None and fed.eval_every
                and state.round_index % fed.eval_every == 0):
            objective.load(state.params)
            entry.update(on_evaluate(state.round_index, state) or {})
        state.log.append(entry)
        bar.update(1)
        if "loss" in entry:
            bar.set_postfix(loss=f"{entry['loss']:.4f}")
        stopping = stop_after_rounds is not None and rounds_run >= stop_after_rounds
        if last or stopping or state.round_index % fed.checkpoint_every == 0:
            checkpoint()
        if stopping:
            break
    bar.close()
    objective.load(state.params)
    return state
