"""Worst-case canary audits of what the Flower ClientApp really returns.

The canary games of :mod:`~privaterec.audit.canary` call the method's upload function
directly. Here the upload comes out of the deployed ClientApp's own handler,
:func:`privaterec.fed.flower.client_app.client_train` (the ``train`` handler a SuperNode
runs for a plain round): a ``train`` :class:`~flwr.app.Message` built as the ServerApp builds
it (θ, the round, the public fingerprint, the requested users and their indices, the seed of
a simulation or ``deployed``), a node :class:`~flwr.app.Context`, and the handler's reply
message taken apart as the server takes it apart — the ``updates`` array ``[k, D]``, the
``result`` record (users, privacy events, and for a method that sends metadata the sample
counts) and the ``metrics`` record. No network is involved; the handler, its message
parsing, its checks, its per-user randomness (``client_noise(seed, round, user)`` on a
simulated partition, :class:`~privaterec.privacy.samplers.SecureNoise` with the node option
``os-entropy``) and its reply packaging are the deployed code.

**Batching.** One ``train`` message may ask a node for many users; the handler loops over
them, each with its own noise source. A message asking for the canary user ``runs`` times under
``runs`` distinct user indices is therefore ``runs`` independent rounds of that user's
reply, computed by one handler call.

**The canaries** are those of :mod:`~privaterec.audit.canary`: a
:class:`~privaterec.audit.canary.CanaryObjective` device task, whose every client update is
s·u whatever the data, so the method's real clipping makes the released update exactly
±C·u. Two devices run the same ClientApp code, one whose user's update is +C·u (D) and one
whose user's is −C·u (D′): one user's data replaced (the adjacency of the claim).

* ``dp-fedrec``: local DP, the reply
  itself is the release. u is one coordinate e_j, so DP-FedRec's L1 (Laplace) or L2
  (Gaussian) clip gives ±θ·e_j and the pair is exactly the mechanism's worst case (a shift
  of 2θ on one coordinate: Laplace(2θ/ε) is tight there). The statistic is the reply's
  projection on e_j, fixed before any run: a monotone function of the likelihood ratio
  for both mechanisms (Laplace: the ratio is non-decreasing in x_j, and the other
  coordinates have the same law on both sides).
* ``dp-fedavg`` (central DP, fixed clip): the reply is the clipped update, in the clear to
  the trusted aggregator; the audit checks that every reply row is exactly ±C·u and that the
  reply carries nothing else that differs between D and D′, then plays the canary game of
  :func:`~privaterec.audit.canary.play` on the aggregator's real noise with the sums the
  ClientApp returned.

Every non-payload field of the reply (privacy events, counts, losses, the user list aside)
must be the same on D and D′: one that differs would tell them apart whatever the noise, and
the audit reports it as a violation (``reply_fields_differ``).
"""

from __future__ import annotations

import json
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from privaterec.audit.canary import CANARY_SCALE, CanaryGame, CanaryObjective, CanarySide
from privaterec.audit.distinguisher import fixed_statistic_bound
from privaterec.audit.runner import PairAudit, claimed_budget
from privaterec.audit.targets import TINY_MODEL, fed_run_config
from privaterec.audit.world import BASE_USER, AuditWorld, make_world
from privaterec.errors import ConfigError

FLOWER_SEED = 11
"""The simulated partition's ``seed`` of the audited rounds (its per-user sources are
``client_noise(seed, round, user)``)."""
USER_ID = "canary-user"


@dataclass(frozen=True)
class Replies:
    """What the server takes out of one ClientApp reply of ``k`` users: the payloads
    ``[k, D]`` float64 and every other field, per user, as a JSON string."""

    payloads: np.ndarray
    other: tuple[str, ...]


def _device(method: Any, world: AuditWorld, *, direction: torch.Tensor, scale: float) -> Any:
    """A ClientApp :class:`~privaterec.fed.flower.client_app.Device` whose task is the
    canary objective (update s·u) and whose one user holds the audit world's base user."""
    from privaterec.data.clients import build_client_dataset
    from privaterec.data.records import Impression, MindSplit
    from privaterec.fed.flower.client_app import Device
    from privaterec.models.factory import build_recommender
    from privaterec.audit.world import _START

    from datetime import timedelta

    torch.manual_seed(0)
    task = CanaryObjective(build_recommender(TINY_MODEL, world.vocabs, world.features),
                           direction=direction, scale=scale)
    behaviors = [Impression(impression_id=f"I{i}", user_id=USER_ID,
                            time=_START + timedelta(minutes=i), history=BASE_USER.history,
                            candidates=cands, labels=tuple(int(c in clicked) for c in cands))
                 for i, (cands, clicked) in enumerate(BASE_USER.impressions)]
    clients = build_client_dataset(MindSplit(news=world.news, behaviors=behaviors),
                                   world.features, history_len=world.history_len)
    return Device.of(task, method, clients)


@contextmanager
def _task_identity() -> Iterator[None]:
    """Flower stamps every message with the running task's identity, which its runtimes
    set (the ServerApp's run, node 0); set here as they would, and restored after."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


@_task_identity()
def client_app_replies(device: Any, *, runs: int, round_index: int, first_user: int = 0,
                       secure: bool = False, seed: int = FLOWER_SEED) -> Replies:
    """``runs`` rounds of the device's user through the ClientApp's ``train`` handler
    (:func:`~privaterec.fed.flower.client_app.client_train`) in one message (module
    docstring): user indices ``first_user`` … ``first_user + runs − 1``; ``secure``: the
    node draws from :class:`~privaterec.privacy.samplers.SecureNoise` (node option
    ``os-entropy``, a deployed server's message without a seed) instead of its seeded
    partition stream."""
    from flwr.app import (Array, ArrayRecord, ConfigRecord, Context, Message, MessageType,
                          RecordDict)

    from privaterec.fed.flower.client_app import client_train
    from privaterec.fed.flower.messages import field_record, field_values, seed_entry

    theta = device.task.parameters().detach().numpy()
    config = ConfigRecord({"round": round_index, **seed_entry(seed, secure),
                           "fingerprint": device.fingerprint,
                           "users": [USER_ID] * runs,
                           "user-indices": list(range(first_user, first_user + runs))})
    message = Message(RecordDict({"global": ArrayRecord({"theta": Array(theta)}),
                                  "config": config}),
                      dst_node_id=1, message_type=MessageType.TRAIN, group_id=str(round_index))
    with tempfile.TemporaryDirectory(prefix="privaterec-audit-node-") as run_dir:
        node: dict[str, bool | float | int | str] = {
            "partition-id": 0, "num-partitions": 1, "run-dir": run_dir, "os-entropy": secure}
        context = Context(run_id=1, node_id=1, node_config=node, state=RecordDict(),
                          run_config={})
        reply = client_train(lambda spec: device, message, context)
    content = reply.content
    payloads = np.asarray(field_record(content, "updates", ArrayRecord)["payloads"].numpy(),
                          dtype=np.float64)
    users = field_values(field_record(content, "result", ConfigRecord), "users", str)
    if users != [USER_ID] * runs or payloads.shape[0] != runs:
        raise ConfigError(f"the ClientApp's reply holds {payloads.shape[0]} payloads for "
                          f"users {users[:3]}..., expected {runs} of {USER_ID!r}")
    # every other field, per user (a list of one item per user), or as a whole
    per_user: list[dict[str, Any]] = [{} for _ in range(runs)]
    for name, record in content.items():
        for key, values in dict(record).items():
            if (name, key) in (("updates", "payloads"), ("result", "users")):
                continue
            for i in range(runs):
                per_user[i][f"{name}.{key}"] = (values[i] if isinstance(values, list)
                                                and len(values) == runs else repr(values))
    return Replies(payloads, tuple(json.dumps(u, sort_keys=True) for u in per_user))


def _unit_coordinate(dimension: int, index: int) -> torch.Tensor:
    u = torch.zeros(dimension)
    u[index] = 1.0
    return u


@dataclass(frozen=True)
class FlowerGame:
    """A ClientApp canary pair: the two devices (D: +C·u, D′: −C·u), the statistic's
    direction ``[D]``, the claim and its table note."""

    method_name: str
    d0: Any
    d1: Any
    direction: np.ndarray
    claimed_epsilon: float
    claimed_delta: float
    note: str


def flower_game(method: str, world: AuditWorld | None = None, *, epsilon: float,
                noise: str = "laplace", delta: float = 1e-5, coordinate: int = 0) -> FlowerGame:
    """The ClientApp canary pair of a local-DP method (``dp-fedrec``, module docstring)
    with ``noise`` ``laplace`` or ``gaussian``; u = e_``coordinate``."""
    from privaterec.fed.methods import method_from_config
    from privaterec.fed.methods.ranking import DPFedRec
    from privaterec.models.factory import build_recommender

    if method != "dp-fedrec":
        raise ConfigError(f"invalid audit parameter 'method' for the ClientApp's local-DP "
                          f"canary: got {method!r}, expected 'dp-fedrec' (central DP: "
                          f"flower_canary_games)")
    world = make_world() if world is None else world
    config = fed_run_config("dp-fedrec", mode="-", epsilon=epsilon, noise=noise, delta=delta)
    client = method_from_config(config)
    assert isinstance(client, DPFedRec)
    dimension = sum(p.numel() for p in build_recommender(
        TINY_MODEL, world.vocabs, world.features).parameters() if p.requires_grad)
    u = _unit_coordinate(dimension, coordinate)
    big = CANARY_SCALE * client.clip
    d0 = _device(client, world, direction=u, scale=-big)
    d1 = _device(client, world, direction=u, scale=big)
    claim = claimed_budget(client.events(dimension), "user")
    note = (f"D = {dimension}, {client.clipping.upper()} clip {client.clip:g} along e_"
            f"{coordinate}, {noise}")
    return FlowerGame("dp-fedrec", d0, d1, u.double().numpy(), claim.epsilon, claim.delta, note)


def _other_fields_differ(a: Replies, b: Replies) -> bool:
    return set(a.other) != set(b.other)


def play_flower(game: FlowerGame, *, runs: int, alpha: float = 0.05,
                secure: bool = False, seed: int = FLOWER_SEED) -> PairAudit:
    """The ClientApp canary game: ``runs`` replies per side (half select the threshold of
    the projection on u, half test,
    :func:`~privaterec.audit.distinguisher.fixed_statistic_bound`); a non-payload field that differs between the sides makes the
    bound infinite (the reply names the user whatever the noise)."""
    if not (isinstance(runs, int) and runs >= 16):
        raise ConfigError(f"invalid audit parameter 'runs': got {runs!r}, expected an int >= 16")
    half = runs // 2
    parts: list[np.ndarray] = []
    replies: list[Replies] = []
    for part, n in ((0, half), (1, runs - half)):  # select, test: other rounds
        for side, device in enumerate((game.d0, game.d1)):
            r = client_app_replies(device, runs=n, round_index=part, secure=secure,
                                   first_user=side * runs, seed=seed)
            replies.append(r)
            parts.append(r.payloads @ game.direction)
    result = fixed_statistic_bound((parts[0], parts[1]), (parts[2], parts[3]),
                                   name="projection of the reply on u", alpha=alpha,
                                   delta=game.claimed_delta)
    if _other_fields_differ(replies[0], replies[1]):
        result = replace(result, epsilon_lower_bound=float("inf"),
                         statistic="a non-payload field of the reply differs")
    return PairAudit(method=game.method_name, mode="client_app" + ("-deployed" if secure
                                                                   else ""),
                     adjacency="replace", pair="canary +C u vs -C u (ClientApp reply)",
                     description=f"one user's data replaced ({game.note})",
                     claimed_epsilon=game.claimed_epsilon, claimed_delta=game.claimed_delta,
                     claim_valid=True, claim_source="the reply's privacy events (user)",
                     runs=runs, result=result)


def flower_canary_games(world: AuditWorld | None = None, *, epsilon: float,
                        delta: float = 1e-5, runs: int = 16,
                        adjacencies: Sequence[str] = ("replace", "add-remove")
                        ) -> list[CanaryGame]:
    """dp-fedavg's canary games (:func:`~privaterec.audit.canary.canary_games`) with each
    side's pre-noise sum taken from ``runs`` ClientApp replies of the canary user instead
    of the upload function: every reply row must be the same ±C·u (to 1e-5) and its other
    fields the same on both sides, else :class:`ConfigError`."""
    from privaterec.audit.canary import NORM_TOLERANCE, _unit, canary_games

    world = make_world() if world is None else world
    games = canary_games("dp-fedavg", world, epsilon=epsilon, delta=delta,
                         adjacencies=adjacencies)
    aggregator = games[0].aggregator
    dimension = games[0].d1.total.numel()
    u = _unit(dimension, 0)
    big = CANARY_SCALE * aggregator.clip
    sides = {}
    for name, scale in (("+C u", big), ("-C u", -big)):
        device = _device(aggregator, world, direction=u, scale=scale)
        r = client_app_replies(device, runs=runs, round_index=0)
        rows = torch.from_numpy(r.payloads)
        if not torch.all(rows == rows[0]):
            raise ConfigError("the ClientApp's replies of the canary differ between rounds: "
                              "the clipped update is not deterministic")
        norm = float(torch.linalg.vector_norm(rows[0]))
        if abs(norm - aggregator.clip) > NORM_TOLERANCE * aggregator.clip:
            raise ConfigError(f"the ClientApp's canary reply has norm {norm:.6g}, not the "
                              f"clip {aggregator.clip:g}")
        sides[name] = (rows[0].to(torch.float32), r)
    if set(sides["+C u"][1].other) != set(sides["-C u"][1].other):
        raise ConfigError("a non-payload field of the ClientApp's reply differs between the "
                          "canaries: the reply names the user whatever the noise")
    out = []
    for game in games:
        def swap(side: CanarySide) -> CanarySide:
            if side.name == "no client":
                return side
            total, _ = sides[side.name]
            if not torch.allclose(total, side.total, atol=1e-6):
                raise ConfigError(f"the ClientApp's {side.name} reply is not the upload "
                                  f"function's")
            return replace(side, total=total)
        out.append(replace(game, d0=swap(game.d0), d1=swap(game.d1),
                           pair=game.pair + " (ClientApp reply)"))
    return out


__all__ = ["FlowerGame", "Replies", "client_app_replies",
           "flower_canary_games", "flower_game", "play_flower"]
