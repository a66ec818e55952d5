"""The Flower engine (docs/flower.md): federated training over Flower's Message API.

This is the only module that imports ``flwr``, and it is only a transport: it runs the same
rounds as the in-process simulator for any task and method
(:class:`~privaterec.fed.task.FederatedTask`, :class:`~privaterec.fed.methods.base.
ClientMethod`), but each client update is computed by a Flower ``ClientApp`` on the
SuperNode that holds the client's data:

* **server** (:func:`serve`, run inside a ServerApp): runs
  :func:`privaterec.fed.simulator.train_federated` with a round function that sends the
  global θ (``ArrayRecord``) and the round's user list (``ConfigRecord``; with the seed in a
  simulation or seeded rehearsal, with only the mark ``deployed`` from a deployed server) to
  the SuperNodes holding the round's sampled users, collects their replies, sorts them by user
  index and aggregates them with :func:`privaterec.fed.strategies.aggregate`. The server
  strategy, the privacy ledger, checkpoints and evaluation stay in ``train_federated``.
* **ClientApp** (:func:`make_client_app`, ``@app.train()``): for each requested user it calls
  :func:`privaterec.fed.client.client_update` — the same function the simulator's reference
  round calls — with ``client_generator(seed, round, user)`` in a simulation, or on a real
  device (node option ``user-id``, or ``os-entropy = true``) with
  :class:`~privaterec.privacy.samplers.SecureNoise` (OS CSPRNG, float-safe releases), and
  replies with what :meth:`~privaterec.fed.update.ClientUpdate.sent` holds: the payloads
  ``[k, D]`` (plus the numbers of samples and the losses for a method that sends them) and
  the privacy events (:meth:`PrivacyEvent.to_dict` as JSON; non-finite floats are strings).

Users and SuperNodes: a SuperNode holds one user (node option ``user-id``, a real device)
or, in a simulation, the contiguous block of users ``[p·U/P, (p+1)·U/P)`` where ``p`` is its
``partition-id`` and ``P`` its ``num-partitions`` (one user per node when ``P = U``).

Before the first round the server sends every node a ``query`` message with the run's
public files (e.g. ``config.yaml`` and ``vocab.json``, or ``recall.yaml``, as text, kept in
the node's ``Context.state``) and asks which users it holds. A ClientApp rebuilds what it
needs itself with the :data:`DeviceLoader` it was made with (Ray workers are separate
processes, nothing is pickled through globals): the run layer's loader
(:func:`privaterec.runs.engines.load_device`) reads the files and the device's data and
initialises the public task exactly as the server did. A device can pin its own files with
the node option ``run-dir`` instead. The server sends a fingerprint of the public task and
of the client method with θ; a device whose rebuilt task or method differs refuses the
round with a message saying so. The rebuilt device is cached per worker process.

**Secure aggregation** (central DP, ``dp-fedavg`` with ``secure_aggregation =
"secaggplus"``): a round's clients send their clipped updates through Flower's SecAgg+
(``secaggplus_mod`` on the client, :class:`flwr.server.workflow.SecAggPlusWorkflow` on the
server, run by :func:`secure_sum` inside the same round function), so the server decodes
only their sum; the quantisation, threshold, modulus and noise shares are
:mod:`privaterec.fed.secagg`'s. One user per SuperNode (each sends one masked vector).
The server then adds the noise (``central``; seeded by
:func:`~privaterec.fed.rng.central_noise_generator` in a simulation or seeded rehearsal,
float-safe from the OS CSPRNG when deployed) or the clients already added their shares
(``distributed``).

:class:`FlowerEngine` is the :class:`~privaterec.fed.engine.Engine` the run layer passes to
train on Flower: on a given Grid (a ``flwr run`` ServerApp, :mod:`privaterec.apps.
flower_app`), or in Flower's simulation runtime (``flwr.simulation.run_simulation``, Ray
backend, at most 2 CPUs).
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

import hashlib  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Mapping, Sequence, TypeVar, cast  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from flwr.app import (Array, ArrayRecord, ConfigRecord, Context, Message,  # noqa: E402
                      MessageType, MetricRecord, RecordDict)
from flwr.client.mod import secaggplus_mod  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.common import (Code, FitIns, FitRes, Parameters, Status,  # noqa: E402
                         ndarrays_to_parameters, parameters_to_ndarrays)
from flwr.common.secure_aggregation.secaggplus_constants import (  # noqa: E402
    RECORD_KEY_CONFIGS, RECORD_KEY_STATE)
from flwr.compat.common import recorddict_compat as compat  # noqa: E402
from flwr.server.compat.grid_client_proxy import GridClientProxy  # noqa: E402
from flwr.server.compat.legacy_context import LegacyContext  # noqa: E402
from flwr.server.strategy import Strategy as LegacyStrategy  # noqa: E402
from flwr.server.workflow import SecAggPlusWorkflow  # noqa: E402
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402

from privaterec.config import FedConfig, replace  # noqa: E402
from privaterec.data.clients import ClientDataset  # noqa: E402
from privaterec.errors import CheckpointError, ConfigError, PrivateRecError  # noqa: E402
from privaterec.fed.client import client_update  # noqa: E402
from privaterec.fed.methods.base import ClientMethod  # noqa: E402
from privaterec.fed.methods.central import CentralDP  # noqa: E402
from privaterec.fed.rng import central_noise_generator, client_generator  # noqa: E402
from privaterec.fed.secagg import SecAggRound  # noqa: E402
from privaterec.fed.sampling import eligible_clients  # noqa: E402
from privaterec.fed.simulator import (FederatedState, RoundCallback,  # noqa: E402
                                      RoundResult, train_federated)
from privaterec.fed.strategies import Strategy, aggregate  # noqa: E402
from privaterec.fed.task import FederatedTask  # noqa: E402
from privaterec.fed.update import ClientUpdate  # noqa: E402
from privaterec.privacy.events import PrivacyEvent  # noqa: E402
from privaterec.privacy.samplers import SecureNoise  # noqa: E402
from privaterec.runtime.checkpoint import load_checkpoint  # noqa: E402
from privaterec.runtime.determinism import (deterministic_algorithms,  # noqa: E402
                                            flush_denormals)

MAX_SIMULATED_SUPERNODES = 100
"""Default number of simulated SuperNodes: one per user up to this many, else user blocks."""
SIMULATION_CPUS = 2
"""CPUs Ray may use in a simulated :class:`FlowerEngine` (one ClientApp worker per CPU)."""
DISCOVERY_TIMEOUT = 120.0
"""Seconds a deployed server (``flwr run``) waits for SuperNodes holding every training user
to connect. A simulated :class:`FlowerEngine` starts its SuperNodes itself, so it waits for
their first replies as long as for a round's (:data:`ROUND_TIMEOUT`): on a loaded machine
the simulated nodes' first replies (each ClientApp loads its device) can take minutes."""
ROUND_TIMEOUT = 3600.0
"""Seconds the server waits for the replies of one round."""


# ============================================================================ records
# Flower types a RecordDict's records as ``ArrayRecord | MetricRecord | ConfigRecord`` and a
# record's values as a union of scalars and lists. What arrives is what this module sent;
# these accessors check it and name the field when it is not.
_Record = TypeVar("_Record", ArrayRecord, MetricRecord, ConfigRecord)
_Item = TypeVar("_Item", int, float, str)


def _record(content: RecordDict, key: str, kind: type[_Record]) -> _Record:
    """The record ``content[key]``, checked to be a ``kind``."""
    record = content[key]
    if not isinstance(record, kind):
        raise PrivateRecError(f"Flower message: record {key!r} is a {type(record).__name__}, "
                              f"expected a {kind.__name__}")
    return record


def _value(record: Mapping[str, object], key: str, kind: type[_Item]) -> _Item:
    """The scalar ``record[key]``, checked to be a ``kind``."""
    value = record[key]
    if not isinstance(value, kind):
        raise PrivateRecError(f"Flower message: {key!r} is {value!r}, expected a "
                              f"{kind.__name__}")
    return value


def _values(record: Mapping[str, object], key: str, kind: type[_Item]) -> list[_Item]:
    """The list ``record[key]``, checked to hold ``kind`` items only."""
    value = record[key]
    if not isinstance(value, list):
        raise PrivateRecError(f"Flower message: {key!r} is a {type(value).__name__}, "
                              f"expected a list of {kind.__name__}")
    items: list[_Item] = []
    for item in value:
        if not isinstance(item, kind):
            raise PrivateRecError(f"Flower message: {key!r} holds {item!r}, expected a list "
                                  f"of {kind.__name__}")
        items.append(item)
    return items


# ====================================================================== SecAgg+ masks
MASK_PRG = "shake256"
"""The PRG that expands SecAgg+'s mask seeds here (server and devices must agree)."""


def mask_prg(seed: bytes, num_range: int,
             dimensions_list: list[tuple[int, ...]]) -> list[np.ndarray]:
    """SecAgg+'s masks from the whole 256-bit ``seed``: SHAKE-256 output, 8 bytes per value,
    reduced mod ``num_range`` (a power of two: exactly uniform on [0, num_range)).

    Flower 1.41's ``pseudo_rand_gen`` XORs the seed's 32-bit words into one 32-bit seed of
    NumPy's Mersenne Twister: every mask then has at most 2^32 possible values, and the
    Mersenne Twister is not a cryptographic PRG, so a server could search the seeds of a
    client's pairwise masks. This module replaces it in both of Flower's SecAgg+ modules
    (client mod and server workflow) with this XOF; a device checks that the server does
    too (``secagg-prg`` in the round's configuration).
    """
    if num_range & (num_range - 1) or not 1 < num_range <= 2 ** 62:
        raise PrivateRecError(f"SecAgg+ modulus {num_range} is not a power of two")
    sizes = [math.prod(d) for d in dimensions_list]
    stream = hashlib.shake_256(b"privaterec-secaggplus-mask" + seed).digest(8 * sum(sizes))
    values = (np.frombuffer(stream, dtype="<u8") & np.uint64(num_range - 1)).astype(np.int64)
    out, start = [], 0
    for shape, size in zip(dimensions_list, sizes):
        out.append(values[start:start + size].reshape(shape))
        start += size
    return out


SECAGGPLUS_MODULES = ("flwr.client.mod.secure_aggregation.secaggplus_mod",
                      "flwr.server.workflow.secure_aggregation.secaggplus_workflow")
"""Flower's modules that expand mask seeds (each imported ``pseudo_rand_gen`` by name; the
packages' attributes of the same names are functions, so they are looked up as modules)."""
for _name in SECAGGPLUS_MODULES:
    setattr(importlib.import_module(_name), "pseudo_rand_gen", mask_prg)


# ============================================================================ client side
_RUN_RECORD = "privaterec-run"
"""Key of the node state (``Context.state``) holding the run's public configuration."""


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
        if _RUN_RECORD not in context.state:
            raise ConfigError("this SuperNode has not received the run's configuration (the "
                              "server's query message); start it with --node-config "
                              "\"run-dir='/path/to/run'\" (a directory holding the run's "
                              "config.yaml and vocab.json) or restart the run")
        record = _record(context.state, _RUN_RECORD, ConfigRecord)
        files = dict(zip(_values(record, "names", str), _values(record, "texts", str)))
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

    @classmethod
    def of(cls, task: FederatedTask[Any], method: ClientMethod,
           clients: ClientDataset) -> "Device":
        return cls(task, method, clients, public_fingerprint(task, method),
                   {uid: u for u, uid in enumerate(clients.user_ids)})


DeviceLoader = Callable[[ClientSpec], Device]
"""Rebuilds a run's public task, method and this device's clients from a
:class:`ClientSpec` (the run layer's :func:`privaterec.runs.engines.load_device`)."""

_DEVICE_CACHE: dict[tuple[Any, ...], Device] = {}


PUBLIC_FILES = ("config.yaml", "vocab.json", "recall.yaml")
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


def _client_query(load: DeviceLoader, message: Message, context: Context) -> Message:
    """Keep the run's public files; reply with the ids of the users held here."""
    run = _record(message.content, "run", ConfigRecord)
    context.state[_RUN_RECORD] = ConfigRecord({"names": _values(run, "names", str),
                                               "texts": _values(run, "texts", str)})
    device = _load_device(load, ClientSpec.resolve(context))
    users = _held_users(device, context.node_config)
    return Message(RecordDict({"users": ConfigRecord({"ids": users})}), reply_to=message)


def _client_train(load: DeviceLoader, message: Message, context: Context) -> Message:
    """Compute the requested users' updates with :func:`client_update`."""
    device = _load_device(load, ClientSpec.resolve(context))
    config = _record(message.content, "config", ConfigRecord)
    if _value(config, "fingerprint", str) != device.fingerprint:
        raise ConfigError(
            "this device's public model or client method differs from the server's (the "
            "frozen parameters, θ's layout or the clipping/noise settings do not match): "
            "give the SuperNode the run's public files (config.yaml and vocab.json), and "
            "build the server's model as the run layer does (torch.manual_seed(seed) first)")
    theta = torch.from_numpy(np.array(
        _record(message.content, "global", ArrayRecord)["theta"].numpy(),
        dtype=np.float32, copy=True))
    if theta.numel() != device.task.dimension:
        raise ConfigError(f"received θ of dimension {theta.numel()}, the device's model has "
                          f"{device.task.dimension}")
    round_index = _value(config, "round", int)
    user_ids = _values(config, "users", str)
    held = set(_held_users(device, context.node_config))
    # A real device (node option user-id) draws everything from the OS CSPRNG with
    # float-safe noise (SecureNoise): with (seed, round, user) seeding the server could
    # subtract the noise. Simulated partitions are seeded so that engines can be compared;
    # the node option os-entropy=true forces the secure source there too. A deployed
    # server sends no seed, and a node without the OS source refuses its rounds.
    secure = _secure_source(context, config)
    seed = _value(config, "seed", int) if secure is None else 0
    payloads: list[torch.Tensor] = []
    counts: list[int] = []
    losses: list[float] = []
    events: list[str] = []
    with deterministic_algorithms(), flush_denormals():  # as the simulator computes
        for user_id, user in zip(user_ids, _values(config, "user-indices", int)):
            if user_id not in held:
                raise PrivateRecError(f"the server asked this SuperNode for user "
                                      f"{user_id!r}, which it does not hold")
            data = device.clients.client(device.index[user_id])
            generator = (secure if secure is not None
                         else client_generator(seed, round_index, int(user)))
            update = client_update(device.task, theta, data, device.method,
                                   generator=generator)
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


def _os_entropy(context: Context) -> bool:
    """Whether this node draws from the OS CSPRNG (a real device, or ``os-entropy``)."""
    return bool(context.node_config.get("os-entropy",
                                        bool(context.node_config.get("user-id", ""))))


def _secure_source(context: Context, config: Mapping[str, Any]) -> SecureNoise | None:
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


def _seed_entry(seed: int, deployed: bool) -> dict[str, int | bool]:
    """What a round's configuration says of the randomness: a simulation sends its seed
    (every node's draws are seeded by (seed, round, user), as on the simulator); a deployed
    server sends none, only that it is deployed (:func:`_secure_source`)."""
    return {"deployed": True} if deployed else {"seed": seed}


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


def _client_secure_fit(load: DeviceLoader, message: Message, context: Context) -> Message:
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
    secure = _secure_source(context, config)
    source = (secure if secure is not None
              else client_generator(int(config["seed"]), int(config["round"]), user))
    with deterministic_algorithms(), flush_denormals():  # as the simulator computes
        data = device.clients.client(device.index[user_id])
        if method.has_update(data):
            payload = client_update(device.task, theta, data, method,
                                    generator=source).sent()["payload"]
        else:  # sampled without a training sample: a zero update, so that the round's plan
            # and (distributed noise) its noise shares do not depend on this user's data
            payload = torch.zeros(method.release_dimension(device.task))
        vector = plan.client_vector(payload, source)
    fitres = FitRes(status=Status(code=Code.OK, message=""),
                    parameters=ndarrays_to_parameters([vector.numpy()]), num_examples=1,
                    metrics={})
    return Message(compat.fitres_to_recorddict(fitres, keep_input=False), reply_to=message)


def _client_train_message(load: DeviceLoader, message: Message, context: Context) -> Message:
    """A ``train`` message: a SecAgg+ stage (its config record present) goes through
    ``secaggplus_mod`` around :func:`_client_secure_fit`; any other is a plain round."""
    if RECORD_KEY_CONFIGS in message.content.config_records:
        return secaggplus_mod(message, context,
                              lambda m, c: _client_secure_fit(load, m, c))
    return _client_train(load, message, context)


def make_client_app(load_device: DeviceLoader) -> ClientApp:
    """The ClientApp: ``query`` (which users a node holds) and ``train`` (their updates, or
    a SecAgg+ stage); ``load_device`` rebuilds the run's public task, method and the
    device's clients."""
    app = ClientApp()

    @app.query()
    def query(message: Message, context: Context) -> Message:
        return _client_query(load_device, message, context)

    @app.train()
    def train(message: Message, context: Context) -> Message:
        return _client_train_message(load_device, message, context)

    return app


# ============================================================================ server side
def public_fingerprint(task: FederatedTask[Any], method: ClientMethod) -> str:
    """SHA-256 of θ's layout, the task's public tensors and the client method.

    Server and devices compare it before a round: they must run the same public task
    (frozen word vectors, fixed news vectors, ... are not part of θ) and the same
    clipping/noise.
    """
    digest = hashlib.sha256()
    digest.update(repr((task.spec.names, task.spec.shapes, method)).encode())
    for name, tensor in sorted(task.public_state().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def _reply_error(reply: Message) -> str:
    return f"SuperNode {reply.metadata.src_node_id}: {reply.error.reason}"


def run_record(files: Mapping[str, str]) -> ConfigRecord:
    """The run's public files sent to every SuperNode (name → text, e.g. ``config.yaml``
    and ``vocab.json``; a missing ``vocab.json``: devices rebuild the vocabularies from
    their data)."""
    return ConfigRecord({"names": list(files), "texts": list(files.values())})


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
                    raise PrivateRecError(_reply_error(reply))
                node = reply.metadata.src_node_id
                for uid in _values(_record(reply.content, "users", ConfigRecord), "ids", str):
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
    result = _record(reply.content, "result", ConfigRecord)
    payloads = torch.from_numpy(np.array(
        _record(reply.content, "updates", ArrayRecord)["payloads"].numpy(),
        dtype=np.float32, copy=True))
    users = _values(result, "users", str)
    with_metadata = "num-examples" in result
    if with_metadata != method.sends_metadata:
        raise PrivateRecError(
            f"SuperNode {reply.metadata.src_node_id} "
            + ("sent its clients' sample counts and losses, which a private method's client "
               "must not release" if with_metadata else
               "did not send the sample counts and losses that its method aggregates with"))
    counts = _values(result, "num-examples", int) if with_metadata else [0] * len(users)
    losses = (_values(_record(reply.content, "metrics", MetricRecord), "loss", float)
              if with_metadata else [math.nan] * len(users))
    index = {clients.user_ids[u]: u for u in expected}
    updates: dict[int, ClientUpdate] = {}
    rows = zip(users, counts, _values(result, "events", str), losses)
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


def _round_fn(grid: Grid, clients: ClientDataset, owner: Mapping[int, int],
              method: ClientMethod, fingerprint: str, *, seed: int, timeout: float,
              deployed: bool) -> Callable[[torch.Tensor, list[int], int], RoundResult]:
    expected_samples = clients.samples_per_user().clamp(max=method.max_samples)
    with_update = set(eligible_clients(clients, by_impressions=method.by_impressions).tolist())

    def round_fn(params: torch.Tensor, selected: list[int], t: int) -> RoundResult:
        expected_events = method.events(int(params.numel()))
        # Each update reaches the server on its own here, so a sampled user without a
        # training sample (central DP's population, rehearsals only) is not asked: a zero
        # update would add nothing. Its events are still the method's, in ``selected``'s
        # order (central DP's: none).
        asked = sorted(u for u in selected if u in with_update)
        by_node: dict[int, list[int]] = {}
        for u in asked:
            by_node.setdefault(owner[u], []).append(u)
        theta = ArrayRecord({"theta": Array(params.detach().float().contiguous().numpy())})
        messages = [
            Message(RecordDict({
                "global": theta,
                "config": ConfigRecord({
                    "round": t, **_seed_entry(seed, deployed), "fingerprint": fingerprint,
                    "users": [clients.user_ids[u] for u in users], "user-indices": users}),
            }), dst_node_id=node, message_type=MessageType.TRAIN, group_id=str(t))
            for node, users in by_node.items()]
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
                           [updates[u].privacy_events if u in updates else expected_events
                            for u in selected])

    return round_fn


class _SecureSumStrategy(LegacyStrategy):
    """The legacy strategy :class:`SecAggPlusWorkflow` drives: it sends each node its FitIns
    and keeps the decoded aggregate (SecAgg+ hands every result the same, the mean)."""

    def __init__(self, grid: Grid, fitins: Mapping[int, FitIns]) -> None:
        self.grid, self.fitins = grid, dict(fitins)
        self.aggregate: tuple[np.ndarray, int] | None = None

    def initialize_parameters(self, client_manager: Any) -> Parameters | None:
        return None

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: Any) -> list[tuple[Any, FitIns]]:
        return [(GridClientProxy(node, self.grid, 0), ins) for node, ins in self.fitins.items()]

    def aggregate_fit(self, server_round: int, results: list[tuple[Any, FitRes]],
                      failures: list[Any]) -> tuple[Parameters | None, dict[str, Any]]:
        if results:
            (mean,) = parameters_to_ndarrays(results[0][1].parameters)
            self.aggregate = (np.asarray(mean, dtype=np.float64), len(results))
        return None, {}

    def configure_evaluate(self, server_round: int, parameters: Parameters,
                           client_manager: Any) -> list[tuple[Any, Any]]:
        return []

    def aggregate_evaluate(self, server_round: int, results: list[Any],
                           failures: list[Any]) -> tuple[float | None, dict[str, Any]]:
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters) -> None:
        return None


class _ErrorLog:
    """A Grid that forwards everything and keeps the reasons of the replies that failed."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.errors: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grid, name)

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> Any:
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        self.errors += [_reply_error(r) for r in replies if r.has_error()]
        return replies


def secure_sum(grid: Grid, plan: SecAggRound, nodes: Sequence[int],
               fitins: Mapping[int, FitIns], *, round_index: int,
               timeout: float | None) -> tuple[torch.Tensor, int]:
    """One SecAgg+ session: the sum ``[D]`` (float64) of the vectors the ``nodes`` compute
    from their ``fitins`` (:func:`_client_secure_fit`), and how many were summed.

    The server sees the clients' public keys, encrypted key shares, masked vectors and mask
    shares, and decodes only the sum (of at least ``plan.threshold`` clients).

    Raises
    ------
    PrivateRecError
        If the session halts (more than ``plan.max_dropouts`` clients dropped out or
        failed; their reasons are in the message).
    """
    log = _ErrorLog(grid)
    logged = cast(Grid, log)  # a Grid in everything but its class
    strategy = _SecureSumStrategy(logged, {n: fitins[n] for n in nodes})
    context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(),
                                    run_config={}), strategy=strategy)
    context.state[MAIN_CONFIGS_RECORD] = ConfigRecord({"current_round": round_index + 1})
    context.state[MAIN_PARAMS_RECORD] = ArrayRecord()
    workflow = SecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=plan.threshold,
                                  max_weight=1.0, clipping_range=plan.clipping_range,
                                  quantization_range=plan.quantization_range,
                                  modulus_range=plan.modulus, timeout=timeout)
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    flwr_logger.setLevel(max(level, logging.WARNING))  # four INFO lines per round otherwise
    try:
        workflow(logged, context)
    finally:
        flwr_logger.setLevel(level)
    if strategy.aggregate is None:
        raise PrivateRecError(
            f"round {round_index + 1}: secure aggregation of {plan.clients} clients halted: "
            f"more than {plan.max_dropouts} dropped out or failed (threshold "
            f"{plan.threshold}; --max-dropouts sets how many a round tolerates)"
            + (f": {'; '.join(log.errors[:3])}" if log.errors else ""))
    mean, summed = strategy.aggregate
    if summed < plan.threshold:  # SecAgg+ cannot unmask with fewer; refuse all the same
        raise PrivateRecError(f"round {round_index + 1}: only {summed} of {plan.clients} "
                              f"vectors in the sum, below the threshold {plan.threshold}")
    if log.errors:
        logging.getLogger("privaterec").warning(
            "round %d: %d of %d clients dropped out of secure aggregation (at most %d "
            "allowed): %s", round_index + 1, plan.clients - summed, plan.clients,
            plan.max_dropouts, "; ".join(log.errors[:3]))
    # SecAgg+ returns the mean over the summed vectors (each weighted Q/Q = 1).
    return torch.from_numpy(mean * summed), summed


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
        total = torch.zeros(release_dimension)
        if plan is not None:  # else too few clients to hide each one: none is asked
            nodes = [owner[u] for u in users]
            if len(set(nodes)) != len(nodes):
                raise PrivateRecError("secure aggregation needs one user per SuperNode "
                                      "(each node sends one masked vector); start one "
                                      "SuperNode per user")
            theta = ndarrays_to_parameters([params.detach().float().contiguous().numpy()])
            fitins = {node: FitIns(theta, {"round": t, **_seed_entry(seed, deployed),
                                           "fingerprint": fingerprint,
                                           "user": clients.user_ids[u], "user-index": u,
                                           "clients": plan.clients, "secagg-prg": MASK_PRG})
                      for node, u in zip(nodes, users)}
            summed, _ = secure_sum(grid, plan, nodes, fitins, round_index=t,
                                   timeout=timeout)
            total = summed.to(torch.float32)
        if not method.distributed:
            total = total + method.central_noise(
                release_dimension, server_noise if server_noise is not None
                else central_noise_generator(seed, t))
        direction = (method.direction_from_release(task, params, total)
                     / (method.sampling_rate * population))
        return RoundResult(direction, None, None, [method.events(dimension)] * len(users),
                           population_events=(method.central_event(),))

    return round_fn


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
          deployed: bool = True) -> FederatedState:
    """The ServerApp's work on a connected ``grid``: discover nodes, then train.

    Parameters: see :meth:`FlowerEngine.train`; ``run_files`` are the run's public files
    sent to the devices (:func:`run_record`); ``discovery_timeout`` and ``round_timeout``
    bound the waits for SuperNodes (:func:`discover_nodes`) and for a round's replies.
    ``deployed``: a deployment: who takes part in each round and central DP's noise on
    the sum come from the OS CSPRNG, the rounds carry no seed, and every node must draw
    from the OS CSPRNG too (:func:`_secure_source`); the run is checkpointed every round (a
    resume re-runs the rounds after the last checkpoint, with fresh draws the ledger would
    miss) and a checkpoint records the mode, which a resume must match. ``False``: a
    simulation, seeded like the simulator (equal to it).
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
    return train_federated(task, clients, fed, method, strategy, seed=seed, round_fn=round_fn,
                           checkpoint_path=checkpoint_path, on_evaluate=on_evaluate,
                           on_checkpoint=on_checkpoint, progress=progress,
                           stop_after_rounds=stop_after_rounds,
                           checkpoint_extra=checkpoint_extra,
                           sampling_source=SecureNoise() if deployed else None)


class FlowerEngine:
    """Train through Flower: the same rounds as the simulator, client updates on SuperNodes.

    Parameters
    ----------
    load_device:
        How a ClientApp rebuilds the run's public task, method and its clients from the run's
        public files (:data:`DeviceLoader`).
    run_files:
        The run's public files (name → text) sent to every device before the first round.
    grid:
        A connected Grid (inside a ``flwr run`` ServerApp); ``None``: run the ServerApp and
        the ClientApps in Flower's simulation runtime (``run_simulation``, Ray backend,
        :data:`SIMULATION_CPUS` CPUs, one ClientApp worker per CPU).
    num_supernodes:
        Simulated SuperNodes (default: one per user, at most
        :data:`MAX_SIMULATED_SUPERNODES`, node ``p`` holding a contiguous block of users;
        with secure aggregation one per user whatever their number).
    deployed:
        With ``grid``: a deployment (the default; :func:`serve`), or ``False`` for a seeded
        rehearsal that equals the simulator (SuperNodes with ``os-entropy=false``; never
        with real users). Flower's simulation runtime is always seeded.
    """

    def __init__(self, load_device: DeviceLoader, run_files: Mapping[str, str], *,
                 grid: Grid | None = None, num_supernodes: int | None = None,
                 deployed: bool = True) -> None:
        self.load_device = load_device
        self.run_files = dict(run_files)
        self.grid = grid
        self.num_supernodes = num_supernodes
        self.deployed = deployed

    def train(self, task: FederatedTask[Any], clients: ClientDataset, fed: FedConfig,
              method: ClientMethod, strategy: Strategy, *, seed: int,
              checkpoint_path: str | Path | None = None,
              on_evaluate: RoundCallback | None = None,
              on_checkpoint: Callable[[FederatedState], None] | None = None,
              progress: bool = True, stop_after_rounds: int | None = None,
              checkpoint_extra: dict[str, Any] | None = None) -> FederatedState:
        """Run :func:`~privaterec.fed.simulator.train_federated` with rounds sent to the
        SuperNodes; checkpoints, ledger and evaluation are the server's. The final θ is
        loaded into the task's model; the devices' public task must be built as the
        server's (checked by fingerprint)."""
        kwargs: dict[str, Any] = dict(
            seed=seed, run_files=self.run_files, checkpoint_path=checkpoint_path,
            on_evaluate=on_evaluate, on_checkpoint=on_checkpoint, progress=progress,
            stop_after_rounds=stop_after_rounds, checkpoint_extra=checkpoint_extra)
        if self.grid is not None:
            return serve(self.grid, task, clients, fed, method, strategy,
                         deployed=self.deployed, **kwargs)
        kwargs["deployed"] = False  # a simulation: seeded like the simulator
        # Every simulated SuperNode exists from the start: the wait is only for their
        # ClientApps to answer, which is bounded like a round, not like a missing device.
        kwargs["discovery_timeout"] = ROUND_TIMEOUT

        from flwr.simulation import run_simulation

        nodes = self.num_supernodes or max(1, min(clients.num_users,
                                                  MAX_SIMULATED_SUPERNODES))
        if isinstance(method, CentralDP) and method.secure_aggregation != "none":
            nodes = self.num_supernodes or clients.num_users  # one user per SuperNode
        results: list[FederatedState] = []
        server = ServerApp()

        @server.main()
        def main(grid: Grid, context: Context) -> None:
            results.append(serve(grid, task, clients, fed, method, strategy, **kwargs))

        flwr_logger = logging.getLogger("flwr")
        level = flwr_logger.level
        if not progress:  # e.g. run_simulation's deprecation notice
            flwr_logger.setLevel(logging.ERROR)
        try:
            run_simulation(server_app=server, client_app=make_client_app(self.load_device),
                           num_supernodes=nodes,
                           backend_config={
                               "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                               "init_args": {"num_cpus": SIMULATION_CPUS, "num_gpus": 0,
                                             "logging_level": "ERROR",
                                             "log_to_driver": False}})
        finally:
            flwr_logger.setLevel(level)
        if not results:
            raise PrivateRecError("the Flower simulation ended without a trained model; see "
                                  "the Flower log above")
        return results[0]


__all__ = ["ClientSpec", "Device", "DeviceLoader", "FlowerEngine", "MASK_PRG",
           "discover_nodes", "make_client_app", "mask_prg", "public_fingerprint",
           "run_record", "secure_sum", "serve"]
