"""The device side of the Flower engine: the ClientApp a SuperNode runs.

* ``query`` (:func:`client_query`): keeps the run's public files (e.g. ``config.yaml`` and
  ``vocab.json``, or ``recall.yaml``, as text, in the node's ``Context.state``) and replies
  with the ids of the users this node holds.
* ``evaluate`` (:func:`client_evaluate`): federated evaluation: each requested user's
  clipped metric sums over its own test impressions plus the run's Gaussian noise
  (:func:`privaterec.fed.evaluation.device_release`), from the OS CSPRNG on a real device.
* ``train`` (:func:`handle_train`): a plain round (:func:`client_train`) calls
  :func:`privaterec.fed.client.client_update` for each requested user — the same function
  the simulator's reference round calls — with ``client_noise(seed, round, user)`` in a
  simulation, or on a real device (node option ``user-id``, or ``os-entropy = true``) with
  :class:`~privaterec.privacy.samplers.SecureNoise` (OS CSPRNG, float-safe releases), and
  replies with what :meth:`~privaterec.fed.update.ClientUpdate.sent` holds: the payloads
  ``[k, D]`` (plus the numbers of samples and the losses for a method that sends them) and
  the privacy events (:meth:`~privaterec.privacy.events.PrivacyEvent.to_dict` as JSON). A SecAgg+ stage goes through
  ``secaggplus_mod`` around :func:`client_secure_fit`, which hands the mod the user's
  clipped update on SecAgg+'s grid (plus its noise share with distributed noise).

A ClientApp rebuilds what it needs itself with the :data:`DeviceLoader` it was made with
(Ray workers are separate processes, nothing is pickled through globals); the rebuilt
device is cached per worker process. A device compares the server's public fingerprint
(:func:`~privaterec.fed.flower.messages.public_fingerprint`) with its own before a round.

Users and SuperNodes: a SuperNode holds one user (node option ``user-id``, a real device)
or, in a simulation, the contiguous block of users ``[p·U/P, (p+1)·U/P)`` where ``p`` is its
``partition-id`` and ``P`` its ``num-partitions`` (one user per node when ``P = U``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch
from flwr.app import (Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord,
                      RecordDict)
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import (Code, FitRes, Status, ndarrays_to_parameters,
                         parameters_to_ndarrays)
from flwr.common.secure_aggregation.secaggplus_constants import (RECORD_KEY_CONFIGS,
                                                                 RECORD_KEY_STATE)
from flwr.compat.common import recorddict_compat as compat

from privaterec.data.clients import ClientDataset
from privaterec.errors import ConfigError, PrivateRecError
from privaterec.eval.federated import EvaluationPolicy
from privaterec.fed.client import client_update
from privaterec.fed.evaluation import TestImpressions, device_release, score_users
from privaterec.fed.device_guard import (DeviceGuard, RoundRefused, device_events,
                                         privacy_policy, secure_aggregation_required)
from privaterec.fed.flower.messages import (RUN_RECORD, field_record, field_value,
                                            field_values, public_fingerprint)
from privaterec.fed.flower.secure import MASK_PRG, install_mask_prg
from privaterec.fed.methods.base import ClientMethod
from privaterec.fed.methods.dp_fedavg import CentralDP
from privaterec.fed.rng import client_noise, evaluation_client_noise
from privaterec.fed.secagg import SecAggRound
from privaterec.fed.task import FederatedTask
from privaterec.ondevice.budget import DEFAULT_DEVICE_BUDGET, default_state_dir
from privaterec.models.recommender import Recommender
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.samplers import SecureNoise
from privaterec.runtime.determinism import deterministic_algorithms, flush_denormals

@dataclass(frozen=True)
class ClientSpec:
    """Where a ClientApp finds the public pieces of a run (paths local to the device).

    Attributes
    ----------
    run_dir: directory with the run's public files (``config.yaml`` and optionally
        ``vocab.json`` of a ranking run, ``recall.yaml`` of a Uni-FedRec run).
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
        if RUN_RECORD not in context.state:
            raise ConfigError("this SuperNode has not received the run's configuration (the "
                              "server's query message); start it with --node-config "
                              "\"run-dir='/path/to/run'\" (a directory holding the run's "
                              "config.yaml and vocab.json) or restart the run")
        record = field_record(context.state, RUN_RECORD, ConfigRecord)
        files = dict(zip(field_values(record, "names", str), field_values(record, "texts", str)))
        return cls(run_dir=str(_materialize(files)), data_dir=data_dir)


_SCRATCH: list[tempfile.TemporaryDirectory] = []


def _materialize(files: Mapping[str, str]) -> Path:
    """Write the run's public files (name → text) to this process's scratch directory."""
    if not _SCRATCH:
        _SCRATCH.append(tempfile.TemporaryDirectory(prefix="privaterec-device-"))
    digest = hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()[:16]
    run_dir = Path(_SCRATCH[0].name) / digest
    if not run_dir.exists():
        tmp = run_dir.with_suffix(".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (tmp / Path(name).name).write_text(text)
        tmp.rename(run_dir)
    return run_dir


@dataclass
class Device:
    """What a device rebuilt from a :class:`ClientSpec`: the public task, the client
    method, its clients, their fingerprint and an index user id → row."""

    task: FederatedTask[Any]
    method: ClientMethod
    clients: ClientDataset
    fingerprint: str
    index: dict[str, int]
    evaluation: EvaluationPolicy | None = None
    """The run's federated evaluation policy, from the device's own copy of the run
    configuration (``None``: the run has none, and the device refuses to evaluate)."""
    test: TestImpressions | None = None
    """The device's own test impressions (``None``: it has none, and releases noise around
    the zero vector when asked)."""

    @classmethod
    def of(cls, task: FederatedTask[Any], method: ClientMethod, clients: ClientDataset, *,
           evaluation: EvaluationPolicy | None = None,
           test: TestImpressions | None = None) -> "Device":
        return cls(task, method, clients, public_fingerprint(task, method),
                   {uid: u for u, uid in enumerate(clients.user_ids)}, evaluation, test)


DeviceLoader = Callable[[ClientSpec], Device]
"""Rebuilds a run's public task, method and this device's clients from a
:class:`ClientSpec` (the run layer's :func:`privaterec.runs.engines.load_device`)."""

_DEVICE_CACHE: dict[tuple[Any, ...], Device] = {}


PUBLIC_FILES = ("config.yaml", "vocab.json", "recall.yaml", "word_vectors.json")
"""The run-directory files a device's rebuilt task depends on (its cache key)."""


def _file_key(path: Path) -> tuple[str, int, int]:
    if not path.exists():
        return (str(path), -1, -1)
    stat = path.stat()
    return (str(path), stat.st_mtime_ns, stat.st_size)


def _load_device(load: DeviceLoader, spec: ClientSpec) -> Device:
    """``load(spec)``, cached per process while the run's public files do not change."""
    run_dir = Path(spec.run_dir)
    key = (tuple(_file_key(run_dir / name) for name in PUBLIC_FILES), spec.data_dir, load)
    if key in _DEVICE_CACHE:
        return _DEVICE_CACHE[key]
    device = load(spec)
    _DEVICE_CACHE.clear()  # one run per worker at a time
    _DEVICE_CACHE[key] = device
    return device


def _held_users(device: Device, node_config: Mapping[str, Any]) -> list[str]:
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


def client_query(load: DeviceLoader, message: Message, context: Context) -> Message:
    """Keep the run's public files; reply with the ids of the users held here."""
    run = field_record(message.content, "run", ConfigRecord)
    context.state[RUN_RECORD] = ConfigRecord({"names": field_values(run, "names", str),
                                               "texts": field_values(run, "texts", str)})
    device = _load_device(load, ClientSpec.resolve(context))
    users = _held_users(device, context.node_config)
    guard = device_guard(context)
    if guard is not None:  # a real device pins the run's privacy policy at enrolment
        guard.enrol(privacy_policy(device.method, device.evaluation))
    return Message(RecordDict({"users": ConfigRecord({"ids": users})}), reply_to=message)


def device_guard(context: Context) -> DeviceGuard | None:
    """The guard of a real device (node option ``user-id``), ``None`` for a simulated
    partition: its state directory is the node option ``state-dir`` (default: the serving
    SDK's, :func:`~privaterec.ondevice.budget.default_state_dir`, so that training and
    serving releases compose in one ledger), its budget the node options ``budget`` (ε,
    default :data:`~privaterec.ondevice.budget.DEFAULT_DEVICE_BUDGET`) and ``budget-delta``.
    """
    node = context.node_config
    if not node.get("user-id", ""):
        return None
    state_dir = str(node.get("state-dir", "")) or str(default_state_dir())
    delta = node.get("budget-delta", None)
    return DeviceGuard(state_dir, budget=float(node.get("budget", DEFAULT_DEVICE_BUDGET)),
                       budget_delta=None if delta is None else float(delta))


def _admit(context: Context, device: Device, run: int, round_index: int, *,
           users: int, secure_message: bool, kind: str = "train") -> None:
    """Refuse a plain message under a SecAgg+ policy (every node), and let a real device's
    guard admit the round (:meth:`DeviceGuard.admit`) before any release is computed.
    ``kind`` ``"evaluate"``: a federated evaluation, whose release is noised on the device
    (a plain message is its protocol) and charged as the run's evaluation event."""
    required = secure_aggregation_required(device.method) and kind == "train"
    if required and not secure_message:
        logging.getLogger("privaterec").warning(
            "privaterec node %s: refused round %d of run %d: a plain (unmasked) update was "
            "asked for under a SecAgg+ policy; nothing was released", context.node_id,
            round_index + 1, run)
        raise RoundRefused(f"this device refused round {round_index + 1} of run {run}: the "
                           f"policy sends updates through SecAgg+ only, and the server asked "
                           f"for a plain (unmasked) update; nothing was released")
    guard = device_guard(context)
    if guard is None:
        return
    if kind == "evaluate":
        assert device.evaluation is not None  # client_evaluate refuses a run without one
        events: tuple[PrivacyEvent, ...] = (device.evaluation.event,)
    else:
        events = device_events(device.method, device.task.dimension)
    guard.admit(run=run, round_index=round_index,
                policy=privacy_policy(device.method, device.evaluation),
                secure_message=secure_message, secure_required=required,
                events=[(e, users) for e in events], kind=kind)


def _request(device: Device, message: Message, context: Context
             ) -> tuple[ConfigRecord, torch.Tensor, int, list[str]]:
    """A ``train`` or ``evaluate`` message's configuration, global θ ``[D]``, round and asked
    users, checked against this device (same public model, θ's dimension, users it holds).

    Raises
    ------
    ConfigError
        If the server's public model or θ's dimension differs from the device's.
    PrivateRecError
        If the server asks for a user this SuperNode does not hold.
    """
    config = field_record(message.content, "config", ConfigRecord)
    if field_value(config, "fingerprint", str) != device.fingerprint:
        raise ConfigError(
            "this device's public model or client method differs from the server's (the "
            "frozen parameters, θ's layout or the clipping/noise settings do not match): "
            "give the SuperNode the run's public files (config.yaml and vocab.json), and "
            "build the server's model as the run layer does (torch.manual_seed(seed) first)")
    theta = torch.from_numpy(np.array(
        field_record(message.content, "global", ArrayRecord)["theta"].numpy(),
        dtype=np.float32, copy=True))
    if theta.numel() != device.task.dimension:
        raise ConfigError(f"received θ of dimension {theta.numel()}, the device's model has "
                          f"{device.task.dimension}")
    user_ids = field_values(config, "users", str)
    held = set(_held_users(device, context.node_config))
    for user_id in user_ids:
        if user_id not in held:
            raise PrivateRecError(f"the server asked this SuperNode for user {user_id!r}, "
                                  f"which it does not hold")
    return config, theta, field_value(config, "round", int), user_ids


def client_train(load: DeviceLoader, message: Message, context: Context) -> Message:
    """Compute the requested users' updates with :func:`client_update`."""
    device = _load_device(load, ClientSpec.resolve(context))
    config, theta, round_index, user_ids = _request(device, message, context)
    _admit(context, device, context.run_id, round_index, users=len(user_ids),
           secure_message=False)
    # A real device (node option user-id) draws everything from the OS CSPRNG with
    # float-safe noise (SecureNoise): with (seed, round, user) seeding the server could
    # subtract the noise. Simulated partitions are seeded so that engines can be compared;
    # the node option os-entropy=true forces the secure source there too. A deployed
    # server sends no seed, and a node without the OS source refuses its rounds.
    secure = secure_source(context, config)
    seed = field_value(config, "seed", int) if secure is None else 0
    payloads: list[torch.Tensor] = []
    counts: list[int] = []
    losses: list[float] = []
    events: list[str] = []
    with deterministic_algorithms(), flush_denormals():  # as the simulator computes
        for user_id, user in zip(user_ids, field_values(config, "user-indices", int)):
            data = device.clients.client(device.index[user_id])
            noise = (secure if secure is not None
                     else client_noise(seed, round_index, int(user)))
            update = client_update(device.task, theta, data, device.method, noise=noise)
            sent = update.sent()  # a private method sends its released update only
            payloads.append(sent["payload"])
            if device.method.sends_metadata:
                counts.append(int(sent["num_examples"]))
                losses.append(float(sent["loss"]))
            events.append(json.dumps([e.to_dict() for e in update.privacy_events]))
    result = ConfigRecord({"users": user_ids, "events": events})
    records: dict[str, ArrayRecord | MetricRecord | ConfigRecord] = {
        "updates": ArrayRecord({"payloads": Array(torch.stack(payloads).detach().numpy())})}
    if device.method.sends_metadata:
        result["num-examples"] = counts
        records["metrics"] = MetricRecord({"loss": losses})
    records["result"] = result
    return Message(RecordDict(records), reply_to=message)


def client_evaluate(load: DeviceLoader, message: Message, context: Context) -> Message:
    """Federated evaluation: each requested user's release (its clipped metric sums over
    its own test impressions with θ, plus the noise of the device's own evaluation policy;
    :func:`~privaterec.fed.evaluation.device_release`), after the guard admitted it."""
    device = _load_device(load, ClientSpec.resolve(context))
    config, theta, round_index, user_ids = _request(device, message, context)
    policy = device.evaluation
    if policy is None:
        raise RoundRefused("this device refused a federated evaluation: its run "
                           "configuration has none (fed.evaluation is not 'federated'); "
                           "nothing was released")
    model = device.task.model
    if not isinstance(model, Recommender):
        raise ConfigError("federated evaluation needs a ranking run's model")
    _admit(context, device, context.run_id, round_index, users=len(user_ids),
           secure_message=False, kind="evaluate")
    secure = secure_source(context, config)
    seed = field_value(config, "seed", int) if secure is None else 0
    with deterministic_algorithms(), flush_denormals():
        device.task.load(theta)
        scored = ({} if device.test is None else score_users(model, device.test, user_ids))
        rows = [device_release(scored.get(user_id, []), policy,
                               secure if secure is not None else
                               evaluation_client_noise(seed, round_index, int(user)))
                for user_id, user in zip(user_ids, field_values(config, "user-indices", int))]
    event = json.dumps([policy.event.to_dict()])
    return Message(RecordDict({
        "releases": ArrayRecord({"releases": Array(torch.stack(rows).numpy())}),
        "result": ConfigRecord({"users": user_ids, "events": [event] * len(user_ids)})}),
        reply_to=message)


def _os_entropy(context: Context) -> bool:
    """Whether this node draws from the OS CSPRNG (a real device, or ``os-entropy``)."""
    return bool(context.node_config.get("os-entropy",
                                        bool(context.node_config.get("user-id", ""))))


def secure_source(context: Context, config: Mapping[str, Any]) -> SecureNoise | None:
    """The OS CSPRNG for this node's draws, or ``None`` for a simulated partition (whose
    draws are seeded by the round's ``seed``).

    Raises
    ------
    ConfigError
        If a deployed server (``deployed`` in the round's configuration: it sends no seed)
        asks a node that has no OS source: its releases would be seeded, and whoever knows
        the seed could subtract their noise.
    """
    if _os_entropy(context):
        return SecureNoise()
    if config.get("deployed"):
        raise ConfigError("a deployed server sent this round, and this SuperNode draws its "
                          "noise from a seeded simulation stream (node option os-entropy is "
                          "false, or it has no user-id): start it with "
                          "--node-config 'user-id=\"...\"' (or os-entropy=true); a "
                          "simulation is seeded: pass --run-config 'seeded-rehearsal=true' "
                          "to flwr run")
    return None


def _secure_plan(method: ClientMethod, clients: int) -> SecAggRound:
    """The device's own SecAgg+ plan for a round of ``clients`` (it must be the server's)."""
    if not isinstance(method, CentralDP) or method.secure_aggregation == "none":
        raise ConfigError("the server runs secure aggregation but this device's method does "
                          "not (its config.yaml has fed.settings.secure_aggregation: none)")
    plan = method.secure_round(clients)
    if plan is None:
        raise PrivateRecError(f"the server ran secure aggregation with {clients} clients, "
                              f"fewer than the method allows")
    return plan


def _check_session(plan: SecAggRound, context: Context) -> None:
    """The SecAgg+ session the server set up must be the device's plan: same grid, range,
    modulus, client count, shares held by every client and threshold (else the accounting
    would not hold)."""
    state = context.state.config_records[RECORD_KEY_STATE]
    expected = {"sample_num": plan.clients, "share_num": plan.clients,
                "threshold": plan.threshold,
                "clipping_range": plan.clipping_range,
                "target_range": plan.quantization_range, "mod_range": plan.modulus,
                "max_weight": 1.0}
    got = {key: state.get(key) for key in expected}
    if got != expected:
        raise ConfigError(f"the server's SecAgg+ parameters {got} differ from this device's "
                          f"plan {expected} for the round's {plan.clients} clients")


def client_secure_fit(load: DeviceLoader, message: Message, context: Context) -> Message:
    """SecAgg+'s collect stage calls this: the user's clipped update on SecAgg+'s grid (plus
    its noise share with distributed noise), as a ``FitRes`` that ``secaggplus_mod`` masks;
    the plaintext never leaves the device (the mod clears it from the reply)."""
    device = _load_device(load, ClientSpec.resolve(context))
    fitins = compat.recorddict_to_fitins(message.content, keep_input=True)
    config = fitins.config
    if config.get("fingerprint") != device.fingerprint:
        raise ConfigError("this device's public model or client method differs from the "
                          "server's (the frozen parameters, θ's layout or the clipping/noise/"
                          "secure-aggregation settings do not match)")
    arrays = parameters_to_ndarrays(fitins.parameters)
    theta = torch.from_numpy(np.array(arrays[0], dtype=np.float32, copy=True))
    if theta.numel() != device.task.dimension:
        raise ConfigError(f"received θ of dimension {theta.numel()}, the device's model has "
                          f"{device.task.dimension}")
    user_id, user = str(config["user"]), int(config["user-index"])
    if user_id not in _held_users(device, context.node_config):
        raise PrivateRecError(f"the server asked this SuperNode for user {user_id!r}, which "
                              f"it does not hold")
    if config.get("secagg-prg") != MASK_PRG:
        raise ConfigError(f"the server expands SecAgg+'s mask seeds with "
                          f"{config.get('secagg-prg')!r}, this device with {MASK_PRG!r}: "
                          f"run the same privaterec on both")
    method = device.method
    plan = _secure_plan(method, int(config["clients"]))
    assert isinstance(method, CentralDP)  # _secure_plan refuses any other method
    _check_session(plan, context)
    _admit(context, device, context.run_id, int(config["round"]), users=1,
           secure_message=True)
    secure = secure_source(context, config)
    source = (secure if secure is not None
              else client_noise(int(config["seed"]), int(config["round"]), user))
    with deterministic_algorithms(), flush_denormals():  # as the simulator computes
        data = device.clients.client(device.index[user_id])
        if method.has_update(data):
            payload = client_update(device.task, theta, data, method,
                                    noise=source).sent()["payload"]
        else:  # sampled without a training sample: a zero update, so that the round's plan
            # and (distributed noise) its noise shares do not depend on this user's data
            payload = torch.zeros(method.release_dimension(device.task))
        vector = plan.client_vector(payload, source)
    fitres = FitRes(status=Status(code=Code.OK, message=""),
                    parameters=ndarrays_to_parameters([vector.numpy()]), num_examples=1,
                    metrics={})
    return Message(compat.fitres_to_recorddict(fitres, keep_input=False), reply_to=message)


def handle_train(load: DeviceLoader, message: Message, context: Context) -> Message:
    """A ``train`` message: a SecAgg+ stage (its config record present) goes through
    ``secaggplus_mod`` around :func:`client_secure_fit`; any other is a plain round."""
    if RECORD_KEY_CONFIGS in message.content.config_records:
        install_mask_prg()  # the mod expands mask seeds with mask_prg
        return secaggplus_mod(message, context,
                              lambda m, c: client_secure_fit(load, m, c))
    return client_train(load, message, context)


def make_client_app(load_device: DeviceLoader) -> ClientApp:
    """The ClientApp: ``query`` (which users a node holds), ``train`` (their updates, or
    a SecAgg+ stage) and ``evaluate`` (their federated evaluation releases);
    ``load_device`` rebuilds the run's public task, method and the device's clients."""
    install_mask_prg()
    app = ClientApp()

    @app.query()
    def query(message: Message, context: Context) -> Message:
        return client_query(load_device, message, context)

    @app.train()
    def train(message: Message, context: Context) -> Message:
        return handle_train(load_device, message, context)

    @app.evaluate()
    def evaluate(message: Message, context: Context) -> Message:
        return client_evaluate(load_device, message, context)

    return app


__all__ = ["ClientSpec", "Device", "DeviceLoader", "PUBLIC_FILES", "client_evaluate",
           "client_query", "client_secure_fit", "client_train", "handle_train", "make_client_app",
           "secure_source"]
