"""The server side of the Flower engine: node discovery and the round functions a ServerApp
runs inside :func:`privaterec.fed.simulator.train_federated`.

:func:`serve` (run inside a ServerApp) discovers the SuperNodes holding the users a round may
sample (:func:`discover_nodes`), then trains with a round function that sends the global θ
(``ArrayRecord``) and the round's user list (``ConfigRecord``; with the seed in a simulation
or seeded rehearsal, with only the mark ``deployed`` from a deployed server) to the
SuperNodes holding the round's sampled users, collects their replies, sorts them by user
index and aggregates them with :func:`privaterec.fed.strategies.aggregate`. The server
strategy, the privacy ledger, checkpoints and evaluation stay in ``train_federated``.

Central DP (``dp-fedavg`` with ``secure_aggregation = "secaggplus"``) sums the clipped
updates through SecAgg+ (:func:`privaterec.fed.flower.secure.secure_sum`), so the server
decodes only their sum; it then adds the noise (``central``; seeded by
:func:`~privaterec.fed.rng.aggregator_noise` in a simulation or seeded rehearsal,
float-safe from the OS CSPRNG when deployed) or the clients already added their shares
(``distributed``).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from flwr.app import (Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord,
                      RecordDict)
from flwr.common import FitIns, ndarrays_to_parameters
from flwr.serverapp import Grid

from privaterec.config import FedConfig, replace
from privaterec.data.clients import ClientDataset
from privaterec.errors import CheckpointError, PrivateRecError
from privaterec.eval.federated import DIMENSION as EVAL_DIMENSION
from privaterec.fed.evaluation import EvaluateFn, FederatedEvaluation
from privaterec.fed.flower.messages import (field_record, field_values, public_fingerprint,
                                            reply_error, run_record, seed_entry)
from privaterec.fed.flower.secure import MASK_PRG, secure_sum
from privaterec.fed.methods.base import ClientMethod
from privaterec.fed.methods.dp_fedavg import CentralDP
from privaterec.fed.rng import aggregator_noise
from privaterec.fed.sampling import eligible_clients
from privaterec.fed.simulator import (FederatedState, RoundCallback, RoundResult,
                                      train_federated)
from privaterec.fed.strategies import Strategy, aggregate
from privaterec.fed.task import FederatedTask
from privaterec.fed.update import ClientUpdate
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.samplers import SecureNoise
from privaterec.runtime.checkpoint import load_checkpoint

DISCOVERY_TIMEOUT = 120.0
"""Seconds a deployed server (``flwr run``) waits for SuperNodes holding every training user
to connect. A simulated :class:`~privaterec.fed.flower.engine.FlowerEngine` starts its
SuperNodes itself, so it waits for their first replies as long as for a round's
(:data:`ROUND_TIMEOUT`): on a loaded machine the simulated nodes' first replies (each
ClientApp loads its device) can take minutes."""
ROUND_TIMEOUT = 3600.0
"""Seconds the server waits for the replies of one round."""


def discover_nodes(grid: Grid, clients: ClientDataset, run: ConfigRecord, *,
                   timeout: float = DISCOVERY_TIMEOUT,
                   by_impressions: bool = False,
                   population: torch.Tensor | None = None) -> dict[int, int]:
    """Map every user a round may sample to the SuperNode holding it (``query`` messages).

    Sends each newly connected node the run's public configuration ``run``
    (:func:`run_record`) and asks which users it holds, until every user of ``population``
    (the method's :meth:`~privaterec.fed.methods.base.ClientMethod.population`; default the
    users with a training sample, or labelled impression with ``by_impressions``) is held by
    a node.

    Raises
    ------
    PrivateRecError
        If a node fails, two nodes claim the same user, or some users are still not held
        by any node after ``timeout`` seconds.
    """
    index = {uid: u for u, uid in enumerate(clients.user_ids)}
    if population is None:
        population = eligible_clients(clients, by_impressions=by_impressions)
    needed = {int(u) for u in population}
    owner: dict[int, int] = {}
    asked: set[int] = set()
    deadline = time.monotonic() + timeout
    while True:
        new = [n for n in grid.get_node_ids() if n not in asked]
        if new:
            asked.update(new)
            messages = [Message(RecordDict({"run": run}), dst_node_id=n,
                                message_type=MessageType.QUERY) for n in new]
            replies = grid.send_and_receive(messages,
                                            timeout=max(1.0, deadline - time.monotonic()))
            for reply in replies:
                if reply.has_error():
                    raise PrivateRecError(reply_error(reply))
                node = reply.metadata.src_node_id
                held = field_record(reply.content, "users", ConfigRecord)
                for uid in field_values(held, "ids", str):
                    u = index.get(str(uid))
                    if u is None:
                        continue  # a user without training data on the server
                    if u in owner and owner[u] != node:
                        raise PrivateRecError(f"user {uid!r} is held by two SuperNodes "
                                              f"({owner[u]} and {node})")
                    owner[u] = node
        if needed <= owner.keys():
            return owner
        if time.monotonic() > deadline:
            raise PrivateRecError(
                f"{len(needed - owner.keys())} of {len(needed)} training users are held by "
                f"no connected SuperNode after {timeout:.0f} s ({len(asked)} nodes "
                f"connected); start a SuperNode for each user (node option user-id) or, in "
                f"a simulation, give it at least one node")
        time.sleep(0.2)


def _parse_reply(reply: Message, expected: Sequence[int], clients: ClientDataset,
                 method: ClientMethod) -> dict[int, ClientUpdate]:
    """The updates in one SuperNode's reply, keyed by user index."""
    if reply.has_error():
        raise PrivateRecError(reply_error(reply))
    result = field_record(reply.content, "result", ConfigRecord)
    payloads = torch.from_numpy(np.array(
        field_record(reply.content, "updates", ArrayRecord)["payloads"].numpy(),
        dtype=np.float32, copy=True))
    users = field_values(result, "users", str)
    with_metadata = "num-examples" in result
    if with_metadata != method.sends_metadata:
        raise PrivateRecError(
            f"SuperNode {reply.metadata.src_node_id} "
            + ("sent its clients' sample counts and losses, which a private method's client "
               "must not release" if with_metadata else
               "did not send the sample counts and losses that its method aggregates with"))
    counts = field_values(result, "num-examples", int) if with_metadata else [0] * len(users)
    losses = (field_values(field_record(reply.content, "metrics", MetricRecord), "loss", float)
              if with_metadata else [math.nan] * len(users))
    index = {clients.user_ids[u]: u for u in expected}
    updates: dict[int, ClientUpdate] = {}
    rows = zip(users, counts, field_values(result, "events", str), losses)
    for row, (uid, n, events, loss) in enumerate(rows):
        if uid not in index:
            raise PrivateRecError(f"SuperNode {reply.metadata.src_node_id} replied for "
                                  f"user {uid!r}, which it was not asked for")
        updates[index[uid]] = ClientUpdate(
            payload=payloads[row], num_examples=int(n),
            privacy_events=tuple(PrivacyEvent.from_dict(e) for e in json.loads(events)),
            metrics={"loss": float(loss)}, weight=method.aggregation_weight(int(n)),
            sends_metadata=with_metadata)
    return updates


def _messages(params: torch.Tensor, by_node: Mapping[int, list[int]], clients: ClientDataset,
              t: int, fingerprint: str, *, seed: int, deployed: bool, message_type: str,
              group_id: str) -> list[Message]:
    """One message per SuperNode for round ``t``: the global θ ``[D]``, the run's public
    fingerprint, the seed (simulated partitions only) and the users asked of that node."""
    theta = ArrayRecord({"theta": Array(params.detach().float().contiguous().numpy())})
    return [
        Message(RecordDict({
            "global": theta,
            "config": ConfigRecord({
                "round": t, **seed_entry(seed, deployed), "fingerprint": fingerprint,
                "users": [clients.user_ids[u] for u in users], "user-indices": users}),
        }), dst_node_id=node, message_type=message_type, group_id=group_id)
        for node, users in by_node.items()]


def _round_fn(grid: Grid, clients: ClientDataset, owner: Mapping[int, int],
              method: ClientMethod, fingerprint: str, *, seed: int, timeout: float,
              deployed: bool) -> Callable[[torch.Tensor, list[int], int], RoundResult]:
    expected_samples = clients.samples_per_user().clamp(max=method.max_samples)
    # A server holding only the roster (clients.roster_only) knows no one's samples: it asks
    # every sampled user, and a device without a sample sends its idle release.
    with_update = set(range(clients.num_users) if clients.roster_only else
                      eligible_clients(clients, by_impressions=method.by_impressions).tolist())

    def round_fn(params: torch.Tensor, selected: list[int], t: int) -> RoundResult:
        expected_events = method.events(int(params.numel()))
        # Every sampled user is asked: one without a training sample sends a noised zero
        # update (client_update). Only central DP's (a rehearsal without secure aggregation:
        # each update reaches the server on its own) is not asked: a zero update would add
        # nothing to the sum; its events are still the method's (none).
        asked = sorted(u for u in selected
                       if u in with_update or not method.trusted_aggregator)
        by_node: dict[int, list[int]] = {}
        for u in asked:
            by_node.setdefault(owner[u], []).append(u)
        messages = _messages(params, by_node, clients, t, fingerprint, seed=seed,
                             deployed=deployed, message_type=MessageType.TRAIN,
                             group_id=str(t))
        replies = list(grid.send_and_receive(messages, timeout=timeout))
        updates: dict[int, ClientUpdate] = {}
        for reply in replies:
            updates.update(_parse_reply(reply, by_node.get(reply.metadata.src_node_id, []),
                                        clients, method))
        missing = sorted(set(asked) - updates.keys())
        if missing:
            raise PrivateRecError(f"round {t + 1}: {len(missing)} of {len(asked)} clients "
                                  f"did not reply within {timeout:.0f} s "
                                  f"(e.g. user {clients.user_ids[missing[0]]!r})")
        ordered = [updates[u] for u in asked]
        for u, update in zip(asked, ordered):
            if (method.sends_metadata and not clients.roster_only
                    and update.num_examples != int(expected_samples[u])):
                raise PrivateRecError(
                    f"round {t + 1}: user {clients.user_ids[u]!r} used {update.num_examples} "
                    f"samples, the server's data says {int(expected_samples[u])}: the device "
                    f"and the server do not hold the same training data")
            if update.privacy_events != expected_events:
                raise PrivateRecError(f"round {t + 1}: user {clients.user_ids[u]!r} reported "
                                      f"privacy events {update.privacy_events} but the run's "
                                      f"method releases {expected_events}")
        known = method.sends_metadata  # a private method's server learns neither
        trained = [x for x in ordered if x.num_examples > 0]  # fedrec: its idle ones weigh 0
        summed = [x for x in ordered if x.weight > 0]
        return RoundResult(aggregate(summed) if summed else torch.zeros(int(params.numel())),
                           [x.num_examples for x in trained] if known else None,
                           [float(x.metrics["loss"]) for x in trained] if known else None,
                           [updates[u].privacy_events if u in updates else expected_events
                            for u in selected])

    return round_fn


def _secure_round_fn(grid: Grid, task: FederatedTask[Any], clients: ClientDataset,
                     owner: Mapping[int, int], method: CentralDP, fingerprint: str, *,
                     seed: int, timeout: float, deployed: bool
                     ) -> Callable[[torch.Tensor, list[int], int], RoundResult]:
    """Central DP's round over SecAgg+: (decoded sum [+ the server's noise]) / (qN); with
    ``clip_space`` news_vectors the decoded sum is the clients' news-vector releases, which
    the server turns into θ's direction (:meth:`CentralDP.direction_from_release`)."""
    population = len(method.population(clients))
    release_dimension = method.release_dimension(task)
    server_noise = SecureNoise() if deployed else None

    def round_fn(params: torch.Tensor, selected: list[int], t: int) -> RoundResult:
        dimension = int(params.numel())
        users = sorted(selected)
        plan = method.secure_round(len(users))
        total = torch.zeros(release_dimension, dtype=torch.float64)
        if plan is not None:  # else too few clients to hide each one: none is asked
            nodes = [owner[u] for u in users]
            if len(set(nodes)) != len(nodes):
                raise PrivateRecError("secure aggregation needs one user per SuperNode "
                                      "(each node sends one masked vector); start one "
                                      "SuperNode per user")
            theta = ndarrays_to_parameters([params.detach().float().contiguous().numpy()])
            fitins = {node: FitIns(theta, {"round": t, **seed_entry(seed, deployed),
                                           "fingerprint": fingerprint,
                                           "user": clients.user_ids[u], "user-index": u,
                                           "clients": plan.clients, "secagg-prg": MASK_PRG})
                      for node, u in zip(nodes, users)}
            total, _ = secure_sum(grid, plan, nodes, fitins, round_index=t,
                                  timeout=timeout)
        if method.distributed:
            total = total.to(torch.float32)  # the clients' noise shares are in the sum
        elif server_noise is not None:  # deployed: the float64 sum itself, float-safe
            total = method.release_sum(total, server_noise)
        else:  # a simulation or seeded rehearsal: the simulator's draw, bit for bit
            total = total.to(torch.float32) + method.central_noise(
                release_dimension, aggregator_noise(seed, t))
        direction = (method.direction_from_release(task, params, total)
                     / (method.sampling_rate * population))
        return RoundResult(direction, None, None, [method.events(dimension)] * len(users),
                           population_events=(method.central_event(),))

    return round_fn


def _evaluate_fn(grid: Grid, clients: ClientDataset, owner: Mapping[int, int],
                 evaluation: FederatedEvaluation, fingerprint: str, *, seed: int,
                 timeout: float, deployed: bool) -> EvaluateFn:
    """Federated evaluation over the Grid: each asked user's SuperNode gets θ in an
    ``evaluate`` message and replies with its release
    (:func:`~privaterec.fed.flower.client_app.client_evaluate`); the server checks that
    every asked user answered once, with the run's event, and returns the releases in the
    order asked."""
    expected = evaluation.policy.event

    def evaluate(params: torch.Tensor, asked: list[int], t: int) -> torch.Tensor:
        by_node: dict[int, list[int]] = {}
        for u in asked:
            if u not in owner:
                raise PrivateRecError(f"federated evaluation: user {clients.user_ids[u]!r} "
                                      f"is held by no connected SuperNode")
            by_node.setdefault(owner[u], []).append(u)
        messages = _messages(params, by_node, clients, t, fingerprint, seed=seed,
                             deployed=deployed, message_type=MessageType.EVALUATE,
                             group_id=f"eval-{t}")
        rows: dict[int, torch.Tensor] = {}
        index = {clients.user_ids[u]: u for u in asked}
        for reply in grid.send_and_receive(messages, timeout=timeout):
            if reply.has_error():
                raise PrivateRecError(reply_error(reply))
            node = reply.metadata.src_node_id
            result = field_record(reply.content, "result", ConfigRecord)
            released = torch.from_numpy(np.array(
                field_record(reply.content, "releases", ArrayRecord)["releases"].numpy(),
                dtype=np.float64, copy=True))
            users = field_values(result, "users", str)
            events = field_values(result, "events", str)
            if (tuple(released.shape) != (len(users), EVAL_DIMENSION)
                    or len(events) != len(users)):
                raise PrivateRecError(f"SuperNode {node}: {tuple(released.shape)} evaluation "
                                      f"releases for {len(users)} users")
            for row, (uid, event) in enumerate(zip(users, events)):
                user = index.get(uid)
                if user is None or owner[user] != node or user in rows:
                    raise PrivateRecError(f"SuperNode {node} sent an evaluation release for "
                                          f"user {uid!r}, which it was not asked for")
                got = tuple(PrivacyEvent.from_dict(e) for e in json.loads(event))
                if got != (expected,):
                    raise PrivateRecError(f"evaluation after round {t + 1}: user {uid!r} "
                                          f"reported privacy events {got}, the run's "
                                          f"evaluation releases {expected}")
                rows[user] = released[row]
        missing = [u for u in asked if u not in rows]
        if missing:
            raise PrivateRecError(f"evaluation after round {t + 1}: {len(missing)} of "
                                  f"{len(asked)} devices did not reply within {timeout:.0f} s "
                                  f"(e.g. user {clients.user_ids[missing[0]]!r})")
        return (torch.stack([rows[u] for u in asked]) if asked
                else torch.zeros(0, EVAL_DIMENSION, dtype=torch.float64))

    return evaluate


def serve(grid: Grid, task: FederatedTask[Any], clients: ClientDataset, fed: FedConfig,
          method: ClientMethod, strategy: Strategy, *, seed: int,
          run_files: Mapping[str, str],
          checkpoint_path: str | Path | None = None,
          on_evaluate: RoundCallback | None = None,
          on_checkpoint: Callable[[FederatedState], None] | None = None,
          progress: bool = True, stop_after_rounds: int | None = None,
          checkpoint_extra: dict[str, Any] | None = None,
          discovery_timeout: float = DISCOVERY_TIMEOUT,
          round_timeout: float = ROUND_TIMEOUT,
          deployed: bool = True,
          evaluation: FederatedEvaluation | None = None) -> FederatedState:
    """The ServerApp's work on a connected ``grid``: discover nodes, then train.

    Parameters: see :meth:`~privaterec.fed.flower.engine.FlowerEngine.train`; ``run_files``
    are the run's public files sent to the devices (:func:`run_record`);
    ``discovery_timeout`` and ``round_timeout`` bound the waits for SuperNodes
    (:func:`discover_nodes`) and for a round's replies. ``deployed``: a deployment: who
    takes part in each round and central DP's noise on the sum come from the OS CSPRNG, the
    rounds carry no seed, and every node must draw from the OS CSPRNG too
    (:func:`~privaterec.fed.flower.client_app.secure_source`); the run is checkpointed every
    round (a resume re-runs the rounds after the last checkpoint, with fresh draws the
    ledger would miss) and a checkpoint records the mode, which a resume must match.
    ``False``: a simulation, seeded like the simulator (equal to it). ``evaluation``:
    federated evaluation, asked of the SuperNodes (:func:`_evaluate_fn`).
    """
    if deployed:  # e.g. central DP only through secure aggregation (the run layer checks
        method.check_engine("flower")  # too; benchmarks time the other path in simulation)
    if checkpoint_path is not None and Path(checkpoint_path).exists():
        written = bool(load_checkpoint(checkpoint_path).get("deployed", False))
        if written != deployed:
            raise CheckpointError(
                f"{checkpoint_path}: written by a {'deployed' if written else 'seeded'} run, "
                f"resumed as a {'deployed' if deployed else 'seeded'} one (seeded-rehearsal "
                f"changed); train into a new out-dir")
    if deployed:  # fresh draws: a resume must not replay rounds the ledger has not recorded
        fed = replace(fed, checkpoint_every=1)
    checkpoint_extra = {**(checkpoint_extra or {}), "deployed": deployed}
    owner = discover_nodes(grid, clients, run_record(run_files), timeout=discovery_timeout,
                           population=method.population(clients))
    fingerprint = public_fingerprint(task, method)
    if isinstance(method, CentralDP) and method.secure_aggregation != "none":
        round_fn = _secure_round_fn(grid, task, clients, owner, method, fingerprint, seed=seed,
                                    timeout=round_timeout, deployed=deployed)
    else:
        round_fn = _round_fn(grid, clients, owner, method, fingerprint, seed=seed,
                             timeout=round_timeout, deployed=deployed)
    evaluate_fn = (None if evaluation is None else
                   _evaluate_fn(grid, clients, owner, evaluation, fingerprint, seed=seed,
                                timeout=round_timeout, deployed=deployed))
    return train_federated(task, clients, fed, method, strategy, seed=seed, round_fn=round_fn,
                           checkpoint_path=checkpoint_path, on_evaluate=on_evaluate,
                           on_checkpoint=on_checkpoint, progress=progress,
                           stop_after_rounds=stop_after_rounds,
                           checkpoint_extra=checkpoint_extra,
                           sampling_source=SecureNoise() if deployed else None,
                           evaluation=evaluation, evaluate_fn=evaluate_fn)


__all__ = ["DISCOVERY_TIMEOUT", "ROUND_TIMEOUT", "discover_nodes", "serve"]
