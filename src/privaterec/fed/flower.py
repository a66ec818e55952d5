"""The Flower engine (DESIGN §2, §7): federated training over Flower's Message API.

This is the only module that imports ``flwr``. It runs the same round as the in-process
simulator, but each client update is computed by a Flower ``ClientApp`` on the SuperNode
that holds the client's data:

* **ServerApp** (``@app.main()``): runs :func:`privaterec.fed.simulator.train_federated`
  with a round function that sends the global θ (``ArrayRecord``) and the round's seed and
  user list (``ConfigRecord``) to the SuperNodes holding the round's sampled users, collects
  their replies, sorts them by user index and aggregates them with
  :func:`privaterec.fed.strategies.aggregate`. The server strategy, the privacy ledger,
  checkpoints and evaluation stay in ``train_federated``.
* **ClientApp** (``@app.train()``): for each requested user it calls
  :func:`privaterec.fed.client.client_update` — the same function the simulator's reference
  round calls — with ``client_generator(seed, round, user)`` in a simulation, or on a real
  device (node option ``user-id``, or ``os-entropy = true``) with
  :class:`~privaterec.privacy.samplers.SecureNoise` (OS CSPRNG, float-safe releases), and
  replies with what :meth:`~privaterec.fed.client.ClientUpdate.sent` holds: the payloads
  ``[k, D]`` (plus the numbers of samples and the losses for ``fedrec`` only) and the
  privacy events (:meth:`PrivacyEvent.to_dict` as JSON; non-finite floats are strings).

Users and SuperNodes: a SuperNode holds one user (node option ``user-id``, a real device)
or, in a simulation, the contiguous block of users ``[p·U/P, (p+1)·U/P)`` where ``p`` is its
``partition-id`` and ``P`` its ``num-partitions`` (one user per node when ``P = U``).

Before the first round the server sends every node a ``query`` message with the run's
public configuration (``config.yaml`` and ``vocab.json`` as text, kept in the node's
``Context.state``) and asks which users it holds. A ClientApp rebuilds what it needs
itself (Ray workers are separate processes, nothing is pickled through globals): its data
(the run's ``data``, or the node option ``data-dir``) and the public model, initialised
like :mod:`privaterec.training.pipeline` does (``torch.manual_seed(train.seed)`` then
``build_recommender``) so that frozen parameters (e.g. random frozen word vectors, which
are not part of θ) agree with the server's. A device can pin its own configuration with
the node option ``run-dir`` instead. The server sends a fingerprint of the public model and
of the client method with θ; a device whose rebuilt model or method differs refuses the
round with a message saying so. The rebuilt objective is cached per worker process.

Entry points:

* :func:`train_with_flower` — called by :func:`privaterec.fed.engine.train_federated_run`
  for ``fed.engine = "flower"``: runs the ServerApp and ClientApp in Flower's simulation
  runtime (``flwr.simulation.run_simulation``, Ray backend, at most 2 CPUs).
* ``server_app`` / ``client_app`` — the Flower App behind ``flwr run flower/`` (see
  ``flower/pyproject.toml`` and ``docs/flower.md``): the ServerApp trains a run directory
  like ``privaterec train`` (:func:`privaterec.training.pipeline.train_run`) with its rounds
  sent through the SuperLink's Grid.
"""

from __future__ import annotations

import os

# Flower and Ray phone home by default (telemetry, update check, usage statistics); a
# training run must not send traffic anywhere but to its own nodes. Set these variables
# to another value before importing privaterec.fed.flower to opt in.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # silences a FutureWarning

import contextvars  # noqa: E402
import hashlib  # noqa: E402
import math  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Mapping, Sequence  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from flwr.app import (Array, ArrayRecord, ConfigRecord, Context, Message,  # noqa: E402
                      MessageType, MetricRecord, RecordDict)
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402

from privaterec.config import FEDERATED_METHODS, RunConfig, replace  # noqa: E402
from privaterec.data.clients import ClientDataset  # noqa: E402
from privaterec.errors import ConfigError, PrivateRecError  # noqa: E402
from privaterec.fed.client import ClientUpdate, client_update  # noqa: E402
from privaterec.fed.methods import ClientMethod, resolve_run_config  # noqa: E402
from privaterec.fed.objective import LocalObjective  # noqa: E402
from privaterec.fed.rng import client_generator  # noqa: E402
from privaterec.fed.simulator import (FederatedState, RoundCallback,  # noqa: E402
                                      RoundResult, eligible_clients, train_federated)
from privaterec.fed.strategies import Strategy, aggregate  # noqa: E402
from privaterec.privacy.events import PrivacyEvent  # noqa: E402
from privaterec.privacy.samplers import SecureNoise  # noqa: E402
from privaterec.training.determinism import (deterministic_algorithms,  # noqa: E402
                                             flush_denormals)

MAX_SIMULATED_SUPERNODES = 100
"""Default number of simulated SuperNodes: one per user up to this many, else user blocks."""
SIMULATION_CPUS = 2
"""CPUs Ray may use in :func:`train_with_flower` (one ClientApp worker per CPU)."""
DISCOVERY_TIMEOUT = 120.0
"""Seconds the server waits for SuperNodes holding every training user to connect."""
ROUND_TIMEOUT = 3600.0
"""Seconds the server waits for the replies of one round."""

_ACTIVE_GRID: contextvars.ContextVar[Grid | None] = contextvars.ContextVar(
    "privaterec_flower_grid", default=None)


# ============================================================================ client side
_RUN_RECORD = "privaterec-run"
"""Key of the node state (``Context.state``) holding the run's public configuration."""


@dataclass(frozen=True)
class ClientSpec:
    """Where a ClientApp finds the public pieces of a run (paths local to the device).

    Attributes
    ----------
    run_dir: directory with the run's ``config.yaml`` and (optionally) ``vocab.json``;
        without ``vocab.json`` the vocabularies are rebuilt from the training news, as
        :func:`privaterec.training.pipeline.prepare_data` does.
    data_dir: the device's data directory (MIND layout); ``""``: the run's ``data``.
    """

    run_dir: str
    data_dir: str = ""

    @classmethod
    def resolve(cls, context: Context) -> "ClientSpec":
        """Node options ``run-dir`` and ``data-dir``, else what the server sent.

        A device that does not take the run's configuration (clipping and noise included)
        from the server pins its own with the node option ``run-dir``.
        """
        node = context.node_config
        data_dir = str(node.get("data-dir", ""))
        if node.get("run-dir", ""):
            return cls(run_dir=str(node["run-dir"]), data_dir=data_dir)
        if _RUN_RECORD not in context.state:
            raise ConfigError("this SuperNode has not received the run's configuration (the "
                              "server's query message); start it with --node-config "
                              "\"run-dir='/path/to/run'\" (a directory holding the run's "
                              "config.yaml and vocab.json) or restart the run")
        record = context.state[_RUN_RECORD]
        return cls(run_dir=str(_materialize(str(record["config-yaml"]),
                                            str(record["vocab-json"]))), data_dir=data_dir)


_SCRATCH: list[tempfile.TemporaryDirectory] = []


def _materialize(config_yaml: str, vocab_json: str) -> Path:
    """Write the run's config.yaml (and vocab.json) to this process's scratch directory."""
    if not _SCRATCH:
        _SCRATCH.append(tempfile.TemporaryDirectory(prefix="privaterec-device-"))
    digest = hashlib.sha256(f"{config_yaml}\0{vocab_json}".encode()).hexdigest()[:16]
    run_dir = Path(_SCRATCH[0].name) / digest
    if not run_dir.exists():
        tmp = run_dir.with_suffix(".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "config.yaml").write_text(config_yaml)
        if vocab_json:
            (tmp / "vocab.json").write_text(vocab_json)
        tmp.rename(run_dir)
    return run_dir


@dataclass
class _Device:
    """What a device rebuilt from a :class:`ClientSpec`: model, method and its data."""

    objective: LocalObjective
    method: ClientMethod
    clients: ClientDataset
    fingerprint: str
    index: dict[str, int]


_DEVICE_CACHE: dict[tuple[Any, ...], _Device] = {}


def _file_key(path: Path) -> tuple[str, int, int]:
    if not path.exists():
        return (str(path), -1, -1)
    stat = path.stat()
    return (str(path), stat.st_mtime_ns, stat.st_size)


def _load_device(spec: ClientSpec) -> _Device:
    """Rebuild the run's public model and this device's clients (cached per process)."""
    run_dir = Path(spec.run_dir)
    config_path, vocab_path = run_dir / "config.yaml", run_dir / "vocab.json"
    key = (_file_key(config_path), _file_key(vocab_path), spec.data_dir)
    if key in _DEVICE_CACHE:
        return _DEVICE_CACHE[key]
    from privaterec.data.text import TextVocabularies
    from privaterec.training.pipeline import build_run_model, prepare_data

    if not config_path.exists():
        raise ConfigError(f"{config_path}: not found; the SuperNode's run-dir must hold the "
                          f"run's config.yaml (and vocab.json)")
    config = resolve_run_config(RunConfig.from_yaml(config_path))
    if spec.data_dir:
        config = replace(config, data=spec.data_dir)
    vocabs = TextVocabularies.load(vocab_path) if vocab_path.exists() else None
    # A run that trained must have loaded its data; dropping dangling references is then a
    # no-op or what the run did (load_dataset raises on them otherwise).
    prepared = prepare_data(config, drop_missing=True, vocabs=vocabs)
    # The public model exactly as privaterec.training.pipeline.train_run initialises it.
    model = build_run_model(config, prepared)
    objective = LocalObjective(model)
    method = ClientMethod.from_config(config)
    clients = prepared.train_clients
    device = _Device(objective, method, clients, public_fingerprint(objective, method),
                     {uid: u for u, uid in enumerate(clients.user_ids)})
    _DEVICE_CACHE.clear()  # one run per worker at a time
    _DEVICE_CACHE[key] = device
    return device


def _held_users(device: _Device, node_config: Mapping[str, Any]) -> list[str]:
    """The user ids this SuperNode holds (``user-id``, else its partition's user block)."""
    if node_config.get("user-id", ""):
        user = str(node_config["user-id"])
        if user not in device.index:
            raise ConfigError(f"node option user-id={user!r}: this device's data has no "
                              f"training impression of that user")
        return [user]
    if "partition-id" not in node_config:
        raise ConfigError("this SuperNode has neither a 'user-id' nor a 'partition-id' "
                          "node option; start it with --node-config \"user-id='U123'\"")
    p = int(node_config["partition-id"])
    parts = int(node_config.get("num-partitions", 1))
    users = device.clients.user_ids
    lo, hi = p * len(users) // parts, (p + 1) * len(users) // parts
    return list(users[lo:hi])


def _client_query(message: Message, context: Context) -> Message:
    """Keep the run's public configuration; reply with the ids of the users held here."""
    run = message.content["run"]
    context.state[_RUN_RECORD] = ConfigRecord({"config-yaml": str(run["config-yaml"]),
                                               "vocab-json": str(run["vocab-json"])})
    device = _load_device(ClientSpec.resolve(context))
    users = _held_users(device, context.node_config)
    return Message(RecordDict({"users": ConfigRecord({"ids": users})}), reply_to=message)


def _client_train(message: Message, context: Context) -> Message:
    """Compute the requested users' updates with :func:`client_update`."""
    device = _load_device(ClientSpec.resolve(context))
    config = message.content["config"]
    if str(config["fingerprint"]) != device.fingerprint:
        raise ConfigError(
            "this device's public model or client method differs from the server's (the "
            "frozen parameters, θ's layout or the clipping/noise settings do not match): "
            "give the SuperNode the run's config.yaml and vocab.json, and build the "
            "server's model with torch.manual_seed(train.seed) before build_recommender")
    theta = torch.from_numpy(np.array(message.content["global"]["theta"].numpy(),
                                      dtype=np.float32, copy=True))
    if theta.numel() != device.objective.dimension:
        raise ConfigError(f"received θ of dimension {theta.numel()}, the device's model has "
                          f"{device.objective.dimension}")
    seed, round_index = int(config["seed"]), int(config["round"])
    held = set(_held_users(device, context.node_config))
    # A real device (node option user-id) draws everything from the OS CSPRNG with
    # float-safe noise (SecureNoise): with (seed, round, user) seeding the server could
    # subtract the noise. Simulated partitions are seeded so that engines can be compared;
    # the node option os-entropy=true forces the secure source there too.
    os_entropy = bool(context.node_config.get("os-entropy",
                                              bool(context.node_config.get("user-id", ""))))
    secure = SecureNoise() if os_entropy else None
    payloads, counts, losses, events = [], [], [], []
    with deterministic_algorithms(), flush_denormals():  # as the simulator computes
        for user_id, user in zip(config["users"], config["user-indices"]):
            if user_id not in held:
                raise PrivateRecError(f"the server asked this SuperNode for user "
                                      f"{user_id!r}, which it does not hold")
            data = device.clients.client(device.index[user_id])
            generator = (secure if secure is not None
                         else client_generator(seed, round_index, int(user)))
            update = client_update(device.objective, theta, data, device.method,
                                   generator=generator)
            sent = update.sent()  # a private method sends its released update only
            payloads.append(sent["payload"])
            if device.method.sends_metadata:
                counts.append(int(sent["num_examples"]))
                losses.append(float(sent["loss"]))
            events.append(json.dumps([e.to_dict() for e in update.privacy_events]))
    result = {"users": list(config["users"]), "events": events}
    records: dict[str, Any] = {
        "updates": ArrayRecord({"payloads": Array(torch.stack(payloads).detach().numpy())})}
    if device.method.sends_metadata:
        result["num-examples"] = counts
        records["metrics"] = MetricRecord({"loss": losses})
    records["result"] = ConfigRecord(result)
    return Message(RecordDict(records), reply_to=message)


def make_client_app() -> ClientApp:
    """The ClientApp: ``query`` (which users a node holds) and ``train`` (their updates)."""
    app = ClientApp()

    @app.query()
    def query(message: Message, context: Context) -> Message:
        return _client_query(message, context)

    @app.train()
    def train(message: Message, context: Context) -> Message:
        return _client_train(message, context)

    return app


# ============================================================================ server side
def public_fingerprint(objective: LocalObjective, method: ClientMethod) -> str:
    """SHA-256 of θ's layout, the model's frozen tensors and the client method.

    Server and devices compare it before a round: they must run the same public model
    (frozen word vectors are not part of θ) and the same clipping/noise.
    """
    digest = hashlib.sha256()
    digest.update(repr((objective.spec.names, objective.spec.shapes, method)).encode())
    trainable = set(objective.parameter_names())
    for name, tensor in sorted(objective.model.state_dict().items()):
        if name in trainable:
            continue
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def _reply_error(reply: Message) -> str:
    return f"SuperNode {reply.metadata.src_node_id}: {reply.error.reason}"


def run_record(config: RunConfig, vocab_path: str | Path | None = None) -> ConfigRecord:
    """The run's public configuration sent to every SuperNode: ``config.yaml`` and
    ``vocab.json`` as text (``""``: devices rebuild the vocabularies from their data)."""
    vocab = Path(vocab_path) if vocab_path is not None else None
    return ConfigRecord({
        "config-yaml": yaml.safe_dump(config.to_dict(), sort_keys=False),
        "vocab-json": vocab.read_text() if vocab is not None and vocab.exists() else ""})


def discover_nodes(grid: Grid, clients: ClientDataset, run: ConfigRecord, *,
                   timeout: float = DISCOVERY_TIMEOUT,
                   by_impressions: bool = False) -> dict[int, int]:
    """Map every eligible user index to the SuperNode holding it (``query`` messages).

    Sends each newly connected node the run's public configuration ``run``
    (:func:`run_record`) and asks which users it holds, until every user with a training
    sample is held by a node.

    Raises
    ------
    PrivateRecError
        If a node fails, two nodes claim the same user, or some users are still not held
        by any node after ``timeout`` seconds.
    """
    index = {uid: u for u, uid in enumerate(clients.user_ids)}
    needed = {int(u) for u in eligible_clients(clients, by_impressions=by_impressions)}
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
                    raise PrivateRecError(_reply_error(reply))
                node = reply.metadata.src_node_id
                for uid in reply.content["users"]["ids"]:
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
        raise PrivateRecError(_reply_error(reply))
    result = reply.content["result"]
    payloads = torch.from_numpy(np.array(reply.content["updates"]["payloads"].numpy(),
                                         dtype=np.float32, copy=True))
    users = list(result["users"])
    with_metadata = "num-examples" in result
    if with_metadata != method.sends_metadata:
        raise PrivateRecError(
            f"SuperNode {reply.metadata.src_node_id} "
            + ("sent its clients' sample counts and losses, which a private method's client "
               "must not release" if with_metadata else
               "did not send the sample counts and losses that fedrec aggregates with"))
    counts = list(result["num-examples"]) if with_metadata else [0] * len(users)
    losses = list(reply.content["metrics"]["loss"]) if with_metadata else [math.nan] * len(users)
    index = {clients.user_ids[u]: u for u in expected}
    updates: dict[int, ClientUpdate] = {}
    for row, (uid, n, events, loss) in enumerate(zip(users, counts, result["events"], losses)):
        if uid not in index:
            raise PrivateRecError(f"SuperNode {reply.metadata.src_node_id} replied for "
                                  f"user {uid!r}, which it was not asked for")
        updates[index[uid]] = ClientUpdate(
            payload=payloads[row], num_examples=int(n),
            privacy_events=tuple(PrivacyEvent.from_dict(e) for e in json.loads(events)),
            metrics={"loss": float(loss)}, weight=method.aggregation_weight(int(n)),
            sends_metadata=with_metadata)
    return updates


def _round_fn(grid: Grid, clients: ClientDataset, owner: Mapping[int, int],
              method: ClientMethod, fingerprint: str, *, seed: int,
              timeout: float) -> Callable[[torch.Tensor, list[int], int], RoundResult]:
    expected_samples = clients.samples_per_user().clamp(max=method.max_samples)

    def round_fn(params: torch.Tensor, selected: list[int], t: int) -> RoundResult:
        expected_events = method.events(int(params.numel()))
        by_node: dict[int, list[int]] = {}
        for u in sorted(selected):
            by_node.setdefault(owner[u], []).append(u)
        theta = ArrayRecord({"theta": Array(params.detach().float().contiguous().numpy())})
        messages = [
            Message(RecordDict({
                "global": theta,
                "config": ConfigRecord({
                    "round": t, "seed": seed, "fingerprint": fingerprint,
                    "users": [clients.user_ids[u] for u in users], "user-indices": users}),
            }), dst_node_id=node, message_type=MessageType.TRAIN, group_id=str(t))
            for node, users in by_node.items()]
        replies = list(grid.send_and_receive(messages, timeout=timeout))
        updates: dict[int, ClientUpdate] = {}
        for reply in replies:
            updates.update(_parse_reply(reply, by_node.get(reply.metadata.src_node_id, []),
                                        clients, method))
        missing = sorted(set(selected) - updates.keys())
        if missing:
            raise PrivateRecError(f"round {t + 1}: {len(missing)} of {len(selected)} clients "
                                  f"did not reply within {timeout:.0f} s "
                                  f"(e.g. user {clients.user_ids[missing[0]]!r})")
        ordered = [updates[u] for u in sorted(selected)]
        for u, update in zip(sorted(selected), ordered):
            if (method.sends_metadata
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
        return RoundResult(aggregate(ordered),
                           [x.num_examples for x in ordered] if known else None,
                           [float(x.metrics["loss"]) for x in ordered] if known else None,
                           [x.privacy_events for x in ordered])

    return round_fn


def serve(grid: Grid, config: RunConfig, objective: LocalObjective, clients: ClientDataset,
          method: ClientMethod, strategy: Strategy, *,
          checkpoint_path: str | Path | None = None,
          on_evaluate: RoundCallback | None = None,
          on_checkpoint: Callable[[FederatedState], None] | None = None,
          progress: bool = True, stop_after_rounds: int | None = None,
          discovery_timeout: float = DISCOVERY_TIMEOUT,
          round_timeout: float = ROUND_TIMEOUT) -> FederatedState:
    """The ServerApp's work on a connected ``grid``: discover nodes, then train.

    Parameters: see :func:`train_with_flower`; ``discovery_timeout`` and ``round_timeout``
    bound the waits for SuperNodes (:func:`discover_nodes`) and for a round's replies. The
    devices receive ``config`` and, when ``checkpoint_path`` lies in a run directory, its
    ``vocab.json``.
    """
    vocab = Path(checkpoint_path).parent / "vocab.json" if checkpoint_path else None
    owner = discover_nodes(grid, clients, run_record(config, vocab), timeout=discovery_timeout,
                           by_impressions=method.is_privaterec)
    fingerprint = public_fingerprint(objective, method)
    round_fn = _round_fn(grid, clients, owner, method, fingerprint, seed=config.train.seed,
                         timeout=round_timeout)
    return train_federated(objective, clients, config.fed, method, strategy,
                           seed=config.train.seed, round_fn=round_fn,
                           checkpoint_path=checkpoint_path, on_evaluate=on_evaluate,
                           on_checkpoint=on_checkpoint, progress=progress,
                           stop_after_rounds=stop_after_rounds)


def train_with_flower(config: RunConfig, objective: LocalObjective, clients: ClientDataset,
                      method: ClientMethod, strategy: Strategy, *,
                      checkpoint_path: str | Path | None = None,
                      on_evaluate: RoundCallback | None = None,
                      on_checkpoint: Callable[[FederatedState], None] | None = None,
                      progress: bool = True, stop_after_rounds: int | None = None,
                      num_supernodes: int | None = None) -> FederatedState:
    """Train through Flower: the same rounds as the simulator, client updates on SuperNodes.

    Inside a ``flwr run`` ServerApp (see ``server_app``) the rounds go through that run's
    Grid. Otherwise the ServerApp and ClientApp run in Flower's simulation runtime
    (``run_simulation``, Ray backend, :data:`SIMULATION_CPUS` CPUs, one ClientApp worker
    per CPU). The ClientApps rebuild the model and their data from ``config`` and, when
    ``checkpoint_path`` lies in a run directory, its ``vocab.json`` (sent to each node
    once); the server's public model must be initialised as
    :func:`privaterec.training.pipeline.train_run` does (checked by fingerprint).

    Parameters
    ----------
    config: the resolved run configuration (its ``data``, ``model``, ``train``, ``fed``).
    objective, clients, method, strategy: as for
        :func:`privaterec.fed.simulator.train_federated`; the final θ is loaded into
        ``objective.model``.
    checkpoint_path, on_evaluate, on_checkpoint, progress, stop_after_rounds: passed to
        ``train_federated`` (checkpoints, ledger and evaluation are the server's).
    num_supernodes: simulated SuperNodes (default: one per user, at most
        :data:`MAX_SIMULATED_SUPERNODES`; node ``p`` holds a contiguous block of users).

    Returns
    -------
    The final :class:`FederatedState`.
    """
    kwargs: dict[str, Any] = dict(checkpoint_path=checkpoint_path, on_evaluate=on_evaluate,
                                  on_checkpoint=on_checkpoint, progress=progress,
                                  stop_after_rounds=stop_after_rounds)
    grid = _ACTIVE_GRID.get()
    if grid is not None:
        return serve(grid, config, objective, clients, method, strategy, **kwargs)

    from flwr.simulation import run_simulation

    nodes = num_supernodes or max(1, min(clients.num_users, MAX_SIMULATED_SUPERNODES))
    results: list[FederatedState] = []
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        results.append(serve(grid, config, objective, clients, method, strategy, **kwargs))

    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    if not progress:  # e.g. run_simulation's deprecation notice
        flwr_logger.setLevel(logging.ERROR)
    try:
        run_simulation(server_app=server, client_app=client_app, num_supernodes=nodes,
                       backend_config={
                           "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                           "init_args": {"num_cpus": SIMULATION_CPUS, "num_gpus": 0,
                                         "logging_level": "ERROR", "log_to_driver": False}})
    finally:
        flwr_logger.setLevel(level)
    if not results:
        raise PrivateRecError("the Flower simulation ended without a trained model; see "
                              "the Flower log above")
    return results[0]


# ====================================================================== `flwr run` app
def run_config_from_flower(run_config: Mapping[str, Any]) -> tuple[RunConfig, Path, bool]:
    """The run configuration, run directory and ``drop_missing`` of a ``flwr run``.

    Keys (``[tool.flwr.app.config]`` in ``flower/pyproject.toml``, overridden by
    ``--run-config``): ``data-dir`` and ``out-dir`` (absolute paths, required), ``config``
    (a privaterec YAML, optional), ``method``, ``rounds``, ``clients-per-round``,
    ``seed``, ``eval-every`` (``""``, ``0`` or ``-1``: keep the YAML's value or the
    default), ``drop-missing``.

    Raises
    ------
    ConfigError
        If a path is missing or relative, or the method is not federated.
    """
    paths = {}
    for key in ("data-dir", "out-dir"):
        value = str(run_config.get(key, ""))
        if not value or not Path(value).is_absolute():
            raise ConfigError(f"run config '{key}' must be an absolute path, got {value!r}; "
                              f"pass --run-config \"{key}='/abs/path'\" to flwr run")
        paths[key] = value
    yaml_path = str(run_config.get("config", ""))
    config = RunConfig.from_yaml(yaml_path) if yaml_path else RunConfig()
    train: dict[str, Any] = {}
    fed: dict[str, Any] = {}
    if str(run_config.get("method", "")):
        train["method"] = str(run_config["method"])
    if int(run_config.get("seed", -1)) != -1:
        train["seed"] = int(run_config["seed"])
    if int(run_config.get("rounds", 0)) != 0:
        fed["rounds"] = int(run_config["rounds"])
    if int(run_config.get("clients-per-round", 0)) != 0:
        fed["clients_per_round"] = int(run_config["clients-per-round"])
    if int(run_config.get("eval-every", -1)) != -1:
        fed["eval_every"] = int(run_config["eval-every"])
    config = replace(config, data=paths["data-dir"], train=replace(config.train, **train),
                     fed=replace(config.fed, engine="flower", **fed))
    if config.train.method not in FEDERATED_METHODS:
        raise ConfigError(f"run config 'method' must be one of {', '.join(FEDERATED_METHODS)}"
                          f" (got {config.train.method!r}); pass --run-config "
                          f"\"method='fednewsrec'\" or set train.method in the YAML")
    return (resolve_run_config(config), Path(paths["out-dir"]),
            bool(run_config.get("drop-missing", False)))


server_app = ServerApp()


@server_app.main()
def _flwr_run_main(grid: Grid, context: Context) -> None:
    """``flwr run flower/``: train the run directory ``out-dir`` like ``privaterec train``."""
    from privaterec.training.pipeline import train_run

    config, out, drop_missing = run_config_from_flower(context.run_config)
    token = _ACTIVE_GRID.set(grid)
    try:
        metrics = train_run(config, out, drop_missing=drop_missing, progress=False)
    finally:
        _ACTIVE_GRID.reset(token)
    test = metrics.get("test") or {}
    summary = ", ".join(f"{k}={v:.4f}" for k, v in test.items() if isinstance(v, float))
    logging.getLogger("flwr").info("privaterec: run written to %s %s", out, summary)


client_app = make_client_app()

__all__ = ["ClientSpec", "client_app", "discover_nodes", "make_client_app",
           "public_fingerprint", "run_config_from_flower", "run_record", "serve",
           "server_app", "train_with_flower"]
