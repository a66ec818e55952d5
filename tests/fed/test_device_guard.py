"""Devices that enforce their own guarantee against a malicious server.

Each device is a real-device node (node option ``user-id``: OS CSPRNG, its own state
directory with a persistent ledger, a finite budget and the policy pinned at enrolment),
driven through the ClientApp's own handlers over the in-process :class:`LocalGrid` of
``tests/fed/test_secagg.py`` (messages serialized as Flower transports them, a node's
exception turned into an error reply as Flower reports it). A malicious server repeats a
round, sends a plain message under a SecAgg+ policy, changes ε (z) or the clip, or keeps
asking after the budget is spent: every device refuses, logs why, records nothing, and
what it sends back is an error reason with no array and none of the update's bytes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("flwr", reason="the Flower engine needs flwr")

from flwr.app import (Array, ArrayRecord, ConfigRecord, Context, Message,  # noqa: E402
                      MessageType, RecordDict)
from flwr.common.serde import message_to_proto  # noqa: E402
from test_secagg import SEED, LocalGrid, _collect_replies, _config  # noqa: E402

from privaterec.config import RunConfig, TrainConfig, fed_config  # noqa: E402
from privaterec.errors import PrivateRecError  # noqa: E402
from privaterec.fed.device_guard import (DeviceGuard, RoundRefused,  # noqa: E402
                                         device_events, privacy_policy)
from privaterec.fed.flower import client_app, messages, server_app  # noqa: E402
from privaterec.fed.methods import method_from_config, resolve_run_config  # noqa: E402
from privaterec.fed.objective import LocalObjective  # noqa: E402
from privaterec.models.factory import build_recommender  # noqa: E402
from privaterec.privacy.ledger import compose_events  # noqa: E402
from privaterec.runs.ranking import prepare_data  # noqa: E402

pytestmark = pytest.mark.usefixtures("flower_task_identity")  # Flower's message stamps


class Devices:
    """One real-device node per user of ``config``, each with its own state directory."""

    def __init__(self, config: RunConfig, tmp_path: Path, **node: Any) -> None:
        self.config = config
        self.prepared = prepare_data(config)
        self.clients = self.prepared.train_clients
        self.method = method_from_config(config)
        self.device = client_app.Device.of(self.new_task(), self.method, self.clients)
        self.loader = lambda spec: self.device  # what load_device rebuilds on the device
        self.state = {1000 + u: tmp_path / f"device-{u}" for u in range(self.clients.num_users)}
        nodes = {n: {"user-id": self.clients.user_ids[n - 1000], "state-dir": str(d),
                     "run-dir": str(tmp_path), **node} for n, d in self.state.items()}

        def handler(message: Message, context: Context) -> Message:
            if message.metadata.message_type == MessageType.QUERY:
                return client_app.client_query(self.loader, message, context)
            return client_app.handle_train(self.loader, message, context)

        self.grid = LocalGrid(handler, nodes)
        self.owner = server_app.discover_nodes(self.grid, self.clients, messages.run_record({}))

    def new_task(self) -> LocalObjective:
        torch.manual_seed(SEED)
        return LocalObjective(build_recommender(self.config.model, self.prepared.vocabs,
                                                self.prepared.features))

    def guard(self, node: int) -> DeviceGuard:
        return DeviceGuard(self.state[node])

    def secure_round(self, users: list[int], t: int) -> Any:
        task = self.new_task()
        round_fn = server_app._secure_round_fn(
            self.grid, task, self.clients, self.owner, self.method, self.device.fingerprint,
            seed=SEED, timeout=60.0, deployed=True)
        return round_fn(task.parameters(), users, t)

    def plain_message(self, user: int, t: int, fingerprint: str | None = None) -> Message:
        """A plain train message as :func:`server_app._round_fn` builds it."""
        theta = ArrayRecord({"theta": Array(self.new_task().parameters().numpy())})
        return Message(RecordDict({"global": theta, "config": ConfigRecord({
            "round": t, "deployed": True,
            "fingerprint": fingerprint or self.device.fingerprint,
            "users": [self.clients.user_ids[user]], "user-indices": [user]})}),
            dst_node_id=self.owner[user], message_type=MessageType.TRAIN, group_id=str(t))


def _refusals(replies: list[Message], reason: str) -> None:
    """Every reply is an error naming ``reason``; what was sent holds no array at all."""
    assert replies
    for reply in replies:
        assert reply.has_error() and not reply.has_content()
        assert reason in reply.error.reason and "nothing was released" in reply.error.reason
        sent = message_to_proto(reply).SerializeToString()  # the bytes the server receives
        assert len(sent) < 2_000  # the reason and the message metadata, nothing else


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory):
    from privaterec.data.synth import SynthConfig, write_synthetic
    path = tmp_path_factory.mktemp("guard") / "data"
    write_synthetic(path, SynthConfig(users=8, news=60, seed=5))
    return path


def _dp_fedrec(data_dir: Path, epsilon_train: float = 1.0) -> RunConfig:
    from test_secagg import TINY
    return resolve_run_config(RunConfig(
        data=str(data_dir), model=TINY, train=TrainConfig(method="dp-fedrec", seed=SEED),
        fed=fed_config("dp-fedrec", rounds=2, clients_per_round=4, engine="flower",
                       epsilon_train=epsilon_train, clip=0.005)))


def test_a_local_dp_device_answers_a_round_once(data_dir, tmp_path, caplog):
    """dp-fedrec: a server asking the same (run, round) again gets a refusal, not a second
    noised release to average; the next round is answered and charged once."""
    d = Devices(_dp_fedrec(data_dir), tmp_path, budget=100.0)
    node = d.owner[0]
    first = d.grid.send_and_receive([d.plain_message(0, 0)])
    assert not first[0].has_error() and first[0].has_content()
    assert len(message_to_proto(first[0]).SerializeToString()) > 4 * d.device.task.dimension
    with caplog.at_level(logging.WARNING, logger="privaterec"):
        again = d.grid.send_and_receive([d.plain_message(0, 0) for _ in range(3)])
    _refusals(again, "already answered that round")
    assert "refused round 1 of run 1" in caplog.text
    assert not d.grid.send_and_receive([d.plain_message(0, 1)])[0].has_error()
    guard = d.guard(node)
    assert guard.answered() == [(1, 0), (1, 1)]
    (event,) = device_events(d.method, d.device.task.dimension)
    budget_events = guard._budget([]).events()
    assert budget_events == [(event, 2)]  # two releases charged, the refusals none


def test_a_plain_message_under_a_secagg_policy_is_refused(data_dir, tmp_path, caplog):
    d = Devices(_config(data_dir), tmp_path, budget=1e3)
    with caplog.at_level(logging.WARNING, logger="privaterec"):
        replies = d.grid.send_and_receive([d.plain_message(u, 0) for u in range(3)])
    _refusals(replies, "asked for a plain (unmasked) update")
    assert caplog.text.count("plain (unmasked) update") >= 3
    for node in d.state:
        assert d.guard(node).answered() == [] and d.guard(node).spent() == 0.0


def test_a_repeated_secure_round_is_refused_by_every_device(data_dir, tmp_path):
    d = Devices(_config(data_dir), tmp_path, budget=1e3)
    users = list(range(d.clients.num_users))
    d.secure_round(users, 0)
    assert len(_collect_replies(d.grid)) == len(users)  # every device sent its masked vector
    d.grid.replies.clear()
    with pytest.raises(PrivateRecError, match="secure aggregation of .* halted"):
        d.secure_round(users, 0)  # the same round again
    assert _collect_replies(d.grid) == []  # no masked vector the second time
    refused = [r for r in d.grid.replies if r.has_error()]
    assert len(refused) == len(users)
    _refusals(refused, "already answered that round")
    for node in d.state:
        assert d.guard(node).answered() == [(1, 0)]


@pytest.mark.parametrize("change", [{"noise_multiplier": 2.0}, {"clip": 0.2}])
def test_a_changed_policy_is_refused(data_dir, tmp_path, change):
    """The device enrolled under one policy; the server re-sends the run with another ε (z)
    or clip, which the device rebuilds and whose fingerprint matches the server's: the
    guard still refuses, at enrolment and at every round."""
    d = Devices(_config(data_dir), tmp_path, budget=1e3)
    pinned = d.guard(1000).policy
    assert pinned == privacy_policy(d.method)
    changed = method_from_config(_config(data_dir, **change))
    d.method = changed  # the server runs it
    d.device = client_app.Device.of(d.new_task(), changed, d.clients)  # the device rebuilds
    client_app._DEVICE_CACHE.clear()  # as new run files would (the cache key is their stat)
    replies = d.grid.send_and_receive(
        [Message(RecordDict({"run": messages.run_record({})}), dst_node_id=n,
                 message_type=MessageType.QUERY) for n in d.state])
    _refusals(replies, "departs from the one this device enrolled with")
    key = next(iter(change))
    assert f"{key}: {pinned[key]} -> {change[key]!r}" in replies[0].error.reason
    with pytest.raises(PrivateRecError, match="halted"):
        d.secure_round(list(range(d.clients.num_users)), 0)
    _refusals([r for r in d.grid.replies if r.has_error() and "departs" in r.error.reason],
              "departs")
    assert _collect_replies(d.grid) == []
    assert all(d.guard(n).answered() == [] and d.guard(n).policy == pinned for n in d.state)


def test_a_device_refuses_once_its_budget_is_spent(data_dir, tmp_path):
    config = _config(data_dir)
    method = method_from_config(config)
    (event,) = device_events(method, 0)
    one = compose_events([(event, 1)], delta=1e-6)
    two = compose_events([(event, 2)], delta=1e-6)
    assert two > one
    d = Devices(config, tmp_path, budget=(one + two) / 2)  # one participation fits, not two
    users = list(range(d.clients.num_users))
    d.secure_round(users, 0)
    d.grid.replies.clear()
    with pytest.raises(PrivateRecError, match="halted"):
        d.secure_round(users, 1)
    _refusals([r for r in d.grid.replies if r.has_error()], "privacy budget is spent")
    assert _collect_replies(d.grid) == []
    for node in d.state:
        assert d.guard(node).answered() == [(1, 0)]
        assert d.guard(node).spent() == pytest.approx(one)


def test_a_device_budget_must_be_finite(tmp_path):
    with pytest.raises(PrivateRecError, match="finite"):
        DeviceGuard(tmp_path, budget=float("inf"))
    with pytest.raises(RoundRefused, match="departs"):
        guard = DeviceGuard(tmp_path)
        guard.enrol({"method": "dp-fedavg", "clip": "0.1"})
        guard.enrol({"method": "dp-fedavg", "clip": "0.2"})


def test_a_local_dp_device_refuses_a_changed_epsilon_and_a_spent_budget(data_dir, tmp_path,
                                                                         caplog):
    """dp-fedrec over plain messages (each a release of its own, no SecAgg+ around it): the
    server changes ε, then keeps asking once the budget is spent; every refusal reaches the
    server as an error reason without a byte of the update, and charges nothing."""
    config = _dp_fedrec(data_dir)
    prepared = prepare_data(config)
    method = method_from_config(config)
    dimension = LocalObjective(build_recommender(config.model, prepared.vocabs,
                                                 prepared.features)).dimension
    (event,) = device_events(method, dimension)
    one, two = (compose_events([(event, n)], delta=0.0) for n in (1, 2))
    assert two > one
    d = Devices(config, tmp_path, budget=(one + two) / 2)  # one release fits, not two
    node = d.owner[0]
    pinned = d.guard(node).policy
    changed = method_from_config(_dp_fedrec(data_dir, epsilon_train=2.0))
    assert pinned is not None and pinned != privacy_policy(changed)
    enrolled = d.device
    d.method = changed  # the server runs ε = 2; the device rebuilds it from the run files
    d.device = client_app.Device.of(d.new_task(), changed, d.clients)
    client_app._DEVICE_CACHE.clear()
    with caplog.at_level(logging.WARNING, logger="privaterec"):
        _refusals(d.grid.send_and_receive([d.plain_message(0, 0)]),
                  "departs from the one this device enrolled with")
        assert d.guard(node).answered() == [] and d.guard(node).spent() == 0.0
        d.method, d.device = method, enrolled  # the pinned policy again: one release fits
        client_app._DEVICE_CACHE.clear()
        first = d.grid.send_and_receive([d.plain_message(0, 0)])
        assert not first[0].has_error() and first[0].has_content()
        _refusals(d.grid.send_and_receive([d.plain_message(0, t) for t in (1, 2)]),
                  "privacy budget is spent")
    assert caplog.text.count("privacy budget is spent") == 2
    assert d.guard(node).answered() == [(1, 0)]
    assert d.guard(node).spent() == pytest.approx(one)
