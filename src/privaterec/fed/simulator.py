"""Federated training loop and the vectorized in-process simulator (the default engine).

Per round t (FedNewsRec §3.2; PrivateRec Alg. 3; Uni-FedRec §3.5): the server samples the
round's clients (:meth:`~privaterec.fed.methods.base.ClientMethod.select`, seeded by
(seed, t)), each sampled client computes its update
(:func:`privaterec.fed.client.client_update`), the server aggregates them and steps its
strategy; every release goes into the privacy ledger; the test split is evaluated every N
rounds. Everything here is typed against the task protocol
(:class:`~privaterec.fed.task.FederatedTask`) and the method hooks: ranking and recall
train through the same loop.

:func:`simulate_round` computes the round's updates in process without a Python loop over
clients in the compute (the method's :meth:`~privaterec.fed.methods.base.ClientMethod.round`:
one backward pass when nothing is clipped per client, else per-client ``vmap(grad)`` in
chunks, clipped in one batched call, each client's noise from its own generator).
:func:`sequential_round` is the reference it must equal (one ``client_update`` per client).
:func:`train_federated` runs the loop for any engine given its round function (the Flower
ServerApp passes one that messages the devices).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from tqdm.auto import tqdm

from privaterec.config import FedConfig
from privaterec.data.clients import ClientDataset
from privaterec.errors import (CheckpointError, ConfigError, PrivateRecError,
                               TrainingDivergedError)
from privaterec.eval.federated import DIMENSION as EVAL_DIMENSION
from privaterec.eval.federated import aggregate as aggregate_evaluation
from privaterec.fed.client import client_update
from privaterec.fed.evaluation import (EvaluateFn, FederatedEvaluation, evaluation_sample,
                                       local_evaluate_fn)
from privaterec.fed.interrupt import RoundInterrupted
from privaterec.fed.methods.base import ClientMethod, RoundContext, RoundOutput
from privaterec.fed.rng import client_noise
from privaterec.fed.sampling import (clients_per_round, eligible_clients, poisson_round,
                                     sample_round)
from privaterec.fed.strategies import State, Strategy, aggregate
from privaterec.fed.task import FederatedTask
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.ledger import PrivacyLedger
from privaterec.privacy.samplers import NoiseSource
from privaterec.runtime.checkpoint import load_checkpoint, save_checkpoint
from privaterec.runtime.determinism import deterministic_algorithms, flush_denormals


@dataclass
class RoundResult:
    """A round's aggregate: direction ḡ ``[D]``, and per client its samples, loss, events.

    ``events`` has one entry per selected client, in the order of ``selected``;
    ``num_examples`` and ``losses`` one per client that computed an update (a central-DP
    client without a training sample takes part with a zero update and has neither).
    They are what the server knows: a private method's clients do not send them
    (:meth:`~privaterec.fed.update.ClientUpdate.sent`), so the Flower engine leaves them
    ``None``; the simulator computes them as a simulation-only diagnostic.
    """

    direction: torch.Tensor
    num_examples: list[int] | None
    losses: list[float] | None
    events: list[tuple[PrivacyEvent, ...]]
    population_events: tuple[PrivacyEvent, ...] = ()
    """Central DP: the round's release, recorded for every user of the population (Poisson
    sampling amplifies for everyone, sampled or not)."""
    server_state: dict[str, float] | None = None
    """The method's server state for the next round (None: unchanged; adaptive clipping's
    next clip)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Public values of the round for the log (adaptive clipping: the clip used and the
    noised fraction of unclipped clients)."""


RoundFn = Callable[..., RoundResult]
"""``round_fn(params, selected, round_index)`` → :class:`RoundResult`; for a method with
server state (:meth:`~privaterec.fed.methods.base.ClientMethod.server_state`, adaptive
clipping) the loop also passes ``server_state=`` (the simulator's round function takes it;
the Flower engine refuses such a method, :meth:`ClientMethod.check_engine`)."""


# ------------------------------------------------------------------------------- rounds
def simulate_round(task: FederatedTask[Any], params: torch.Tensor, clients: ClientDataset,
                   selected: Sequence[int], method: ClientMethod, *, seed: int,
                   round_index: int, chunk_clients: int = 16,
                   server_state: Mapping[str, float] | None = None) -> RoundResult:
    """All updates of one round, vectorized; equal to :func:`sequential_round` up to rounding.

    Each client's own random draws (its method's inputs, from its own generator), then the
    method's batched round (:meth:`~privaterec.fed.methods.base.ClientMethod.round`).

    Parameters
    ----------
    task, params: the model and the global θ ``[D]``.
    clients: all clients; ``selected`` the user indices of this round (with central DP they
        may include users without a training sample: they add a zero update).
    method: what clients do. seed, round_index: select the clients' generators.
    chunk_clients: clients per ``vmap`` chunk (memory bound).
    server_state: the method's server state in this round (default: its initial state).
    """
    if server_state is not None:
        method = method.at_server_state(server_state)
    # A sampled user without a training sample (every method samples from the roster) takes
    # part with a zero update: it has no inputs. Central DP's round counts it
    # (``idle_clients``); a local method's client releases a noised zero (idle_release),
    # which enters the uniform mean like any release.
    data = {u: clients.client(u) for u in selected}
    active = [u for u in selected if method.has_update(data[u])]
    taking_part = set(active)
    idle = [u for u in selected if u not in taking_part]
    local_idle = bool(idle) and not method.trusted_aggregator
    sources = [client_noise(seed, round_index, u) for u in active]
    inputs = [method.inputs(task, data[u], noise=g) for u, g in zip(active, sources)]
    population = len(method.population(clients))
    context = RoundContext(seed=seed, round_index=round_index, chunk_clients=chunk_clients,
                           population=population,  # public N
                           idle_clients=len(selected) - len(active))
    if active or not local_idle:
        out = method.round(task, params, inputs, sources, context)
    else:
        out = RoundOutput(torch.zeros(task.dimension, device=params.device), [])
    direction = out.direction
    if local_idle and not method.sends_metadata:  # (fedrec weighs a client by its samples: 0)
        released = method.idle_release(task.dimension, [client_noise(seed, round_index, u)
                                                        for u in idle])
        direction = (direction * len(active) + released.sum(0).to(direction.device)
                     ) / len(selected)
    counts = [method.num_examples(x) for x in inputs]
    events = method.events(task.dimension)
    return RoundResult(direction, counts, out.losses, [events] * len(selected),
                       population_events=out.population_events,
                       server_state=out.server_state, metrics=dict(out.metrics))


def sequential_round(task: FederatedTask[Any], params: torch.Tensor, clients: ClientDataset,
                     selected: Sequence[int], method: ClientMethod, *, seed: int,
                     round_index: int,
                     server_state: Mapping[str, float] | None = None) -> RoundResult:
    """The reference: one :func:`client_update` per client, then :func:`aggregate`
    (``events`` per selected client; samples and losses of the clients with an update)."""
    if server_state is not None:
        method = method.at_server_state(server_state)
    data = {u: clients.client(u) for u in selected}
    # A local method's client without a training sample sends a noised zero (client_update);
    # central DP's adds a zero update to the sum, which its round counts.
    updates = {u: client_update(task, params, data[u], method,
                                noise=client_noise(seed, round_index, u))
               for u in selected
               if method.has_update(data[u]) or not method.trusted_aggregator}
    summed = [x for x in updates.values() if x.weight > 0]  # fedrec weighs an idle one 0
    done = [updates[u] for u in selected if u in updates and method.has_update(data[u])]
    return RoundResult(aggregate(summed) if summed
                       else torch.zeros(task.dimension, device=params.device),
                       [u.num_examples for u in done],
                       [float(u.metrics["loss"]) for u in done],
                       [updates[u].privacy_events if u in updates
                        else method.events(task.dimension) for u in selected])


# ------------------------------------------------------------------------------ training
@dataclass
class FederatedState:
    """Everything a checkpoint holds: θ, strategy state, next round, ledger, log, and the
    method's server state (adaptive clipping: the next round's clip)."""

    params: torch.Tensor
    strategy_state: State
    round_index: int = 0
    ledger: PrivacyLedger = field(default_factory=PrivacyLedger)
    log: list[dict[str, Any]] = field(default_factory=list)
    server_state: dict[str, float] = field(default_factory=dict)

    def to_checkpoint(self, task: FederatedTask[Any], method: str) -> dict[str, Any]:
        task.load(self.params)
        # On the CPU whatever the training device, so any machine loads it.
        out = {"model": {k: v.cpu() for k, v in task.model.state_dict().items()},
               "params": self.params.cpu(),
               "strategy_state": {k: v.cpu() for k, v in self.strategy_state.items()},
               "round": self.round_index,
               "ledger": self.ledger.to_dict(), "log": self.log, "method": method,
               "rng": {"derived_from": "(seed, round, client)",
                       "next_round": self.round_index}}
        if self.server_state:  # a method without server state writes the same file as before
            out["server_state"] = dict(self.server_state)
        return out

    @classmethod
    def from_checkpoint(cls, state: dict[str, Any]) -> "FederatedState":
        return cls(params=state["params"], strategy_state=state["strategy_state"],
                   round_index=int(state["round"]),
                   ledger=PrivacyLedger.from_dict(state["ledger"]), log=list(state["log"]),
                   server_state={str(k): float(v)
                                 for k, v in state.get("server_state", {}).items()})


RoundCallback = Callable[[int, "FederatedState"], dict[str, Any] | None]


@deterministic_algorithms()
@flush_denormals()
def train_federated(task: FederatedTask[Any], clients: ClientDataset, fed: FedConfig,
                    method: ClientMethod, strategy: Strategy, *, seed: int,
                    round_fn: RoundFn | None = None,
                    checkpoint_path: str | Path | None = None,
                    on_evaluate: RoundCallback | None = None,
                    on_checkpoint: Callable[[FederatedState], None] | None = None,
                    progress: bool = True,
                    stop_after_rounds: int | None = None,
                    checkpoint_extra: dict[str, Any] | None = None,
                    sampling_source: NoiseSource | None = None,
                    evaluation: FederatedEvaluation | None = None,
                    evaluate_fn: EvaluateFn | None = None) -> FederatedState:
    """Run ``fed.rounds`` rounds from θ = the model's parameters; resume from a checkpoint.

    Parameters
    ----------
    task: the model (its parameters are the initial θ; the final θ is loaded into it).
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
    sampling_source: where a deployed server draws who takes part in a round (the OS
        CSPRNG, :class:`~privaterec.privacy.samplers.SecureNoise`); ``None``: seeded by
        (seed, round), a simulation (:meth:`ClientMethod.select`).
    evaluation: federated evaluation (:mod:`privaterec.fed.evaluation`): after every
        ``fed.eval_every`` rounds and after the last round, a sample of the roster releases
        clipped, noised metric sums; each asked user's release is recorded in the ledger and
        the estimate logged (``federated_eval``). evaluate_fn: computes the releases
        (default: in process from ``evaluation.local``, the simulator; the Flower ServerApp
        passes one that asks the SuperNodes).
    """
    if evaluation is not None and evaluate_fn is None:
        if evaluation.local is None:
            raise ConfigError("federated evaluation on the simulator needs the devices' test "
                              "impressions (a test split)")
        evaluate_fn = local_evaluate_fn(task, clients.user_ids, evaluation.local,
                                        evaluation.policy, seed=seed)
    if round_fn is None:
        def round_fn(params: torch.Tensor, selected: list[int], t: int, *,
                     server_state: Mapping[str, float] | None = None) -> RoundResult:
            return simulate_round(task, params, clients, selected, method, seed=seed,
                                  round_index=t, chunk_clients=fed.chunk_clients,
                                  server_state=server_state)
    if checkpoint_path is not None and Path(checkpoint_path).exists():
        saved = load_checkpoint(checkpoint_path)
        task.model.load_state_dict(saved["model"])  # frozen parameters too
        state = FederatedState.from_checkpoint(saved)
        device = task.parameters().device  # the checkpoint's tensors are on the CPU
        state.params = state.params.to(device)
        state.strategy_state = {k: v.to(device) for k, v in state.strategy_state.items()}
        missing = sorted(set(method.server_state()) - set(state.server_state))
        if missing:
            raise CheckpointError(f"{checkpoint_path}: the checkpoint lacks the server state "
                                  f"{missing} that {method.name} carries from round to round "
                                  f"(written by a run without it); train into a new --out "
                                  f"directory")
    else:
        params = task.parameters()
        state = FederatedState(params=params, strategy_state=strategy.init_state(params),
                               server_state=method.server_state())
    population = method.population(clients)
    population_ids = [clients.user_ids[int(u)] for u in population]  # central DP's ledger rows
    m = clients_per_round(fed, len(population))

    def checkpoint() -> None:
        if checkpoint_path is not None:
            save_checkpoint(checkpoint_path, {**state.to_checkpoint(task, method.name),
                                              **(checkpoint_extra or {})})
        if on_checkpoint is not None:
            on_checkpoint(state)

    rounds_run = 0
    bar = tqdm(total=fed.rounds, initial=state.round_index, disable=not progress,
               desc=f"{method.name} rounds", unit="round", leave=False)
    while state.round_index < fed.rounds:
        t = state.round_index
        # Every sampled user takes part; one without a training sample (central DP samples
        # every user, whatever their data) with a zero update (the round function's part).
        selected = method.select(population, m, seed=seed, round_index=t,
                                 source=sampling_source)
        try:
            result = (round_fn(state.params, selected, t,
                               server_state=dict(state.server_state))
                      if state.server_state else round_fn(state.params, selected, t))
        except RoundInterrupted:  # Ctrl-C while the clients computed (fed/interrupt.py)
            if rounds_run and state.round_index % fed.checkpoint_every:
                checkpoint()  # the rounds completed since the last checkpoint
            raise
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
        if result.server_state is not None:
            state.server_state = dict(result.server_state)
        by_event: dict[PrivacyEvent, list[str]] = {}
        for u, client_events in zip(selected, result.events):
            for event in client_events:
                by_event.setdefault(event, []).append(clients.user_ids[u])
        for event, users in by_event.items():
            state.ledger.record_many(users, event)
        for event in result.population_events:
            state.ledger.record_many(population_ids, event)
        entry: dict[str, Any] = {"round": t + 1, "clients": len(selected), **result.metrics}
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
            task.load(state.params)
            entry.update(on_evaluate(state.round_index, state) or {})
        if evaluation is not None and evaluate_fn is not None and (
                last or (fed.eval_every and state.round_index % fed.eval_every == 0)):
            entry["federated_eval"] = _evaluate_federated(
                state, clients, evaluation, evaluate_fn, seed=seed, round_index=t,
                source=sampling_source)
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
    task.load(state.params)
    return state


def _evaluate_federated(state: FederatedState, clients: ClientDataset,
                        evaluation: FederatedEvaluation, evaluate_fn: EvaluateFn, *,
                        seed: int, round_index: int,
                        source: NoiseSource | None) -> dict[str, Any]:
    """One federated evaluation of θ after round ``round_index``: ask a sample of the
    roster, record each asked user's release in the ledger, return the estimate."""
    policy = evaluation.policy
    asked = evaluation_sample(clients.num_users, policy.fraction, seed=seed,
                              round_index=round_index, source=source)
    released = evaluate_fn(state.params, asked, round_index)
    if tuple(released.shape) != (len(asked), EVAL_DIMENSION):
        raise PrivateRecError(f"federated evaluation: {tuple(released.shape)} releases for "
                          f"{len(asked)} asked devices")
    state.ledger.record_many([clients.user_ids[u] for u in asked], policy.event)
    return aggregate_evaluation(released, sigma=policy.sigma).to_dict()


__all__ = ["FederatedState", "RoundCallback", "RoundFn", "RoundResult", "clients_per_round",
           "eligible_clients", "poisson_round", "sample_round", "sequential_round",
           "simulate_round", "train_federated"]
