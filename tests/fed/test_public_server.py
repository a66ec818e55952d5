"""A deployed server that holds no user data (docs/flower.md, docs/privacy.md#threat-model).

The ServerApp's work (:func:`privaterec.runs.ranking.train_run` with a Flower Grid) runs
from a public directory holding only the news catalogue and the roster
(:mod:`privaterec.data.roster`); every device is a SuperNode with node option ``user-id``
whose data directory holds only its own user's impressions. The grid delivers each message
in process through Flower's wire format; every file opened is recorded with the side that
opened it, so the tests assert that the server side never opens a behaviors file (other
than an explicit ``eval-data`` holdout).
"""

from __future__ import annotations

import builtins
import dataclasses
import io
import json
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("flwr", reason="the Flower engine needs flwr")

from flwr.app import Context, Error, Message, MessageType, RecordDict  # noqa: E402
from flwr.common.serde import message_from_proto, message_to_proto  # noqa: E402

from privaterec.apps.flower_app import (check_server_data,  # noqa: E402
                                        eval_data_from_flower)
from privaterec.config import ModelConfig, RunConfig, TrainConfig, fed_config  # noqa: E402
from privaterec.data.mind import (BEHAVIORS_FILE, load_dataset, write_split)  # noqa: E402
from privaterec.data.records import MindSplit  # noqa: E402
from privaterec.data.roster import (ROSTER_FILE, read_roster,  # noqa: E402
                                    write_public_dir)
from privaterec.data.synth import SynthConfig, write_synthetic  # noqa: E402
from privaterec.errors import ConfigError, DataFormatError  # noqa: E402
from privaterec.fed.flower import client_app  # noqa: E402
from privaterec.privacy.report import format_privacy_report, read_privacy_json  # noqa: E402
from privaterec.runs.engines import load_device  # noqa: E402
from privaterec.runs.ranking import train_run  # noqa: E402

TINY = ModelConfig(word_dim=8, num_heads=2, head_dim=4, attention_dim=8, title_len=6,
                   abstract_len=4, history_len=5)
USERS, SEED = 8, 3


def _wire(message: Message) -> Message:
    return message_from_proto(message_to_proto(message))


class DeviceGrid:
    """A Grid whose SuperNodes each hold one user (node options ``user-id``, ``data-dir``,
    ``state-dir``), run in process; ``on_device`` is set while a device handles a message,
    so that the files it opens are told apart from the server's."""

    def __init__(self, nodes: dict[int, dict[str, Any]]) -> None:
        self.contexts = {n: Context(run_id=1, node_id=n, node_config=cfg, state=RecordDict(),
                                    run_config={}) for n, cfg in nodes.items()}
        self.on_device = threading.local()

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> list[Message]:
        out = []
        for message in messages:
            received = _wire(message)
            context = self.contexts[message.metadata.dst_node_id]
            self.on_device.node = context.node_id
            try:
                if received.metadata.message_type == MessageType.QUERY:
                    reply = client_app.client_query(load_device, received, context)
                elif received.metadata.message_type == MessageType.EVALUATE:
                    # through the ClientApp, so that its evaluate handler is the one called
                    reply = client_app.make_client_app(load_device)(received, context)
                else:
                    reply = client_app.handle_train(load_device, received, context)
            except Exception as error:  # noqa: BLE001 - the node's failure, as Flower has it
                reply = Message(Error(code=0, reason=repr(error)), reply_to=received)
            finally:
                self.on_device.node = None
            out.append(_wire(reply))
        return out


pytestmark = pytest.mark.usefixtures("flower_task_identity")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory):
    """``(public dir, holdout dir, {user: own data dir})`` from one synthetic data set."""
    root = tmp_path_factory.mktemp("public")
    write_synthetic(root / "data", SynthConfig(users=USERS, news=60, seed=5))
    dataset = load_dataset(root / "data")
    users = write_public_dir(root / "data", root / "public")
    holdout = root / "holdout"
    assert dataset.test is not None
    write_split(holdout, dataset.test)
    own = {}
    for uid in users:  # each device: the catalogue and its own user's impressions only
        own[uid] = root / "devices" / uid
        write_split(own[uid] / "train", MindSplit(
            news=dataset.train.news,
            behaviors=[imp for imp in dataset.train.behaviors if imp.user_id == uid]))
    return root / "public", holdout, own


def _opens(monkeypatch: pytest.MonkeyPatch, grid: DeviceGrid) -> list[tuple[str, Path]]:
    """Record every file opened, as (``server`` or ``device``, path)."""
    opened: list[tuple[str, Path]] = []
    real_open, real_io_open = builtins.open, io.open

    def record(file: Any) -> None:
        if isinstance(file, (str, Path)):
            side = "device" if getattr(grid.on_device, "node", None) else "server"
            opened.append((side, Path(file)))

    def spy_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        record(file)
        return real_open(file, *args, **kwargs)

    def spy_io_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        record(file)
        return real_io_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(io, "open", spy_io_open)
    return opened


def _config(public: Path, method: str) -> RunConfig:
    settings: dict[str, Any] = {"clients_per_round": 4}
    if method == "dp-fedrec":
        settings["epsilon_train"] = 1.0
    if method == "dp-fedavg":  # central DP through SecAgg+, Poisson-sampled from the roster
        settings = dict(client_fraction=0.5, noise_multiplier=1.0, target_delta=1e-3,
                        adam_tau=1e-3, secure_aggregation="secaggplus")
    return RunConfig(data=str(public), model=TINY, train=TrainConfig(method=method, seed=SEED),
                     fed=fed_config(method, rounds=2, engine="flower", **settings))


def _grid(own: dict[str, Path], state: Path) -> DeviceGrid:
    return DeviceGrid({100 + i: {"user-id": uid, "data-dir": str(path),
                                 "state-dir": str(state / uid), "budget": 1e4}
                       for i, (uid, path) in enumerate(sorted(own.items()))})


@pytest.mark.parametrize("method", ["dp-fedrec", "fednewsrec", "dp-fedavg"])
def test_the_server_trains_from_the_catalogue_and_roster_and_opens_no_behaviors(
        deployment, tmp_path, monkeypatch, method):
    public, _, own = deployment
    assert sorted(p.name for p in public.iterdir()) == ["news.tsv", ROSTER_FILE]
    grid = _grid(own, tmp_path / "state")
    opened = _opens(monkeypatch, grid)
    out = tmp_path / "run"
    metrics = train_run(_config(public, method), out, progress=False, grid=grid)
    monkeypatch.undo()

    server = [p for side, p in opened if side == "server"]
    device = [p for side, p in opened if side == "device"]
    assert not [p for p in server if p.name == BEHAVIORS_FILE], "the server read behaviors"
    assert public / "news.tsv" in server and public / ROSTER_FILE in server
    # the devices did train, each from its own user's data directory
    assert {p.parent.parent for p in device if p.name == BEHAVIORS_FILE} == set(own.values())
    assert len(metrics["rounds"]) == 2 and "test" not in metrics
    assert "train_samples" not in metrics and metrics["train_users"] == USERS
    release = json.loads((out / "privacy.json").read_text())["release"]
    assert release["population"] == USERS  # the roster, whatever anyone clicked
    assert release["mode"] == "deployed"
    assert "holds only public material" in release["trust"]
    assert release["evaluation"].startswith("none")
    report = format_privacy_report(read_privacy_json(out / "privacy.json"))
    assert "Evaluation: none: the server holds no evaluation data" in report
    assert sorted(json.loads((out / "data.json").read_text())["files"]) == [
        "news.tsv", ROSTER_FILE]


def test_eval_data_is_the_only_behaviors_file_the_server_opens(deployment, tmp_path,
                                                               monkeypatch):
    public, holdout, own = deployment
    grid = _grid(own, tmp_path / "state")
    opened = _opens(monkeypatch, grid)
    out = tmp_path / "run"
    metrics = train_run(_config(public, "dp-fedrec"), out, progress=False, grid=grid,
                        eval_data=holdout)
    monkeypatch.undo()
    server_behaviors = {p for side, p in opened if side == "server" and p.name == BEHAVIORS_FILE}
    assert server_behaviors == {holdout / BEHAVIORS_FILE}
    assert 0.0 <= metrics["test"]["auc"] <= 1.0
    release = json.loads((out / "privacy.json").read_text())["release"]
    assert release["evaluation"] == f"server-side on the public or consented holdout {holdout}"


def test_a_public_directory_is_refused_outside_a_deployment_and_checked(deployment, tmp_path):
    public, holdout, _ = deployment
    with pytest.raises(ConfigError, match="holds a roster"):
        train_run(_config(public, "dp-fedrec"), tmp_path / "run", progress=False)
    data = public.parent / "data"
    config = RunConfig(data=str(data), model=TINY, train=TrainConfig(method="dp-fedrec"),
                       fed=fed_config("dp-fedrec", rounds=1, engine="flower"))
    with pytest.raises(ConfigError, match="eval-data"):
        train_run(config, tmp_path / "run2", progress=False, grid=object(),
                  eval_data=holdout)
    bad = tmp_path / "roster.txt"
    bad.write_text("U1\nU2\nU1\n")
    with pytest.raises(DataFormatError, match="repeats line 1"):
        read_roster(bad)
    assert read_roster(public / ROSTER_FILE) == sorted(own_ids(public))


def own_ids(public: Path) -> list[str]:
    data = load_dataset(public.parent / "data")
    return list({imp.user_id for imp in data.train.behaviors})


def test_public_dir_refuses_a_directory_holding_behaviors(deployment, tmp_path):
    public, _, _ = deployment
    target = tmp_path / "pub"
    target.mkdir()
    shutil.copyfile(public / "news.tsv", target / BEHAVIORS_FILE)
    with pytest.raises(DataFormatError, match="no user data"):
        write_public_dir(public.parent / "data", target)


def test_a_deployed_flwr_run_server_is_refused_user_data(tmp_path):
    with pytest.raises(ConfigError, match="public-dir"):
        check_server_data({"data-dir": str(tmp_path)})
    check_server_data({"data-dir": str(tmp_path), "seeded-rehearsal": True})  # a simulation
    check_server_data({"public-dir": str(tmp_path)})
    assert eval_data_from_flower({"eval-data": ""}) is None
    assert eval_data_from_flower({"eval-data": str(tmp_path)}) == tmp_path
    with pytest.raises(ConfigError, match="absolute"):
        eval_data_from_flower({"eval-data": "holdout"})


def test_privaterec_is_refused_by_a_server_holding_only_the_roster(deployment, tmp_path):
    public, _, own = deployment
    with pytest.raises(ConfigError, match="method 'privaterec' samples from the users with "
                                          "a labelled impression, which a server holding "
                                          "only the roster"):
        train_run(_config(public, "privaterec"), tmp_path / "run", progress=False,
                  grid=_grid(own, tmp_path / "state"))


def test_the_public_dir_command_writes_the_catalogue_and_roster(deployment, tmp_path, capsys):
    from privaterec.cli import main

    public, _, own = deployment
    assert main(["data", "public-dir", str(public.parent / "data"), "--out",
                 str(tmp_path / "pub"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["users"] == USERS
    assert (tmp_path / "pub" / "news.tsv").read_bytes() == (public / "news.tsv").read_bytes()
    assert read_roster(tmp_path / "pub" / ROSTER_FILE) == sorted(own)
    (tmp_path / "held").mkdir()
    (tmp_path / "held" / BEHAVIORS_FILE).write_text("")
    assert main(["data", "public-dir", str(public.parent / "data"), "--out",
                 str(tmp_path / "held")]) == 2  # a user error: the directory holds user data


def test_the_device_dirs_command_gives_each_user_only_their_own_impressions(deployment,
                                                                          tmp_path, capsys):
    from privaterec.cli import main

    public, _, own = deployment
    data = load_dataset(public.parent / "data")
    assert main(["data", "device-dirs", str(public.parent / "data"), "--out",
                 str(tmp_path / "dev"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["users"] == USERS
    assert sorted(p.name for p in (tmp_path / "dev").iterdir()) == sorted(own)
    assert data.test is not None
    for uid in own:
        device = load_dataset(tmp_path / "dev" / uid)
        assert device.train.behaviors == [i for i in data.train.behaviors if i.user_id == uid]
        assert device.train.news.keys() == data.train.news.keys()
        mine = [i for i in data.test.behaviors if i.user_id == uid]
        assert (device.test.behaviors if device.test is not None else []) == mine
    assert main(["data", "device-dirs", str(public.parent / "data"), "--out",
                 str(tmp_path / "dev")]) == 2  # a user error: written already


def test_devices_use_the_shipped_corpus_vectors_after_checking_their_hash(
        deployment, tmp_path, monkeypatch):
    from privaterec.models import factory
    from privaterec.runs import artifacts

    public, _, own = deployment
    grid = _grid(own, tmp_path / "state")
    fit = factory.corpus_word_vectors
    fitted_on: list[str] = []

    def spy_fit(*args: Any, **kwargs: Any) -> Any:
        fitted_on.append("device" if getattr(grid.on_device, "node", None) else "server")
        return fit(*args, **kwargs)

    monkeypatch.setattr(factory, "corpus_word_vectors", spy_fit)
    config = _config(public, "dp-fedrec")
    config = dataclasses.replace(config, model=dataclasses.replace(TINY, embeddings="corpus"))
    metrics = train_run(config, tmp_path / "run", progress=False, grid=grid)
    assert len(metrics["rounds"]) == 2  # the devices' public fingerprint matched the server's
    assert fitted_on == ["server"]  # fitted once, by the server; no device fitted them

    table = torch.randn(5, 3)
    text = artifacts.encode_word_vectors(table)
    assert torch.equal(artifacts.decode_word_vectors(text), table)
    record = json.loads(text)
    record["data"] = record["data"][:-8] + ("A" * 8 if record["data"][-8:] != "A" * 8
                                            else "B" * 8)
    with pytest.raises(ConfigError, match="hash to"):
        artifacts.decode_word_vectors(json.dumps(record))


def test_federated_evaluation_by_devices_that_hold_their_own_test_impressions(
        deployment, tmp_path, monkeypatch):
    """evaluation: federated on a server that holds only the catalogue and the roster: the
    devices score their own test impressions and send clipped, noised sums from the OS
    CSPRNG; every asked user's release is in the ledger and in its device's own budget,
    and a device answers each evaluation once."""
    from privaterec.fed.device_guard import DeviceGuard, RoundRefused

    public, _, own = deployment
    dataset = load_dataset(public.parent / "data")
    assert dataset.test is not None
    devices = {}
    for uid, path in own.items():  # the device's own training and test impressions
        devices[uid] = tmp_path / "devices" / uid
        shutil.copytree(path, devices[uid])
        write_split(devices[uid] / "test", MindSplit(
            news=dataset.test.news,
            behaviors=[imp for imp in dataset.test.behaviors if imp.user_id == uid]))
    grid = _grid(devices, tmp_path / "state")
    opened = _opens(monkeypatch, grid)
    config = _config(public, "dp-fedrec")
    config = dataclasses.replace(config, fed=dataclasses.replace(
        config.fed, evaluation="federated", eval_epsilon=4.0, eval_every=1, rounds=1))
    out = tmp_path / "run"
    metrics = train_run(config, out, progress=False, grid=grid)
    monkeypatch.undo()
    assert not [p for side, p in opened if side == "server" and p.name == BEHAVIORS_FILE]
    assert {p.parent.parent for side, p in opened
            if side == "device" and p.name == BEHAVIORS_FILE and p.parent.name == "test"
            } == set(devices.values())
    estimate = metrics["test_federated"]
    assert estimate["devices"] == USERS and "test" not in metrics
    assert [e["round"] for e in metrics["rounds"] if "federated_eval" in e] == [1]
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["release"]["evaluation"].startswith("federated")
    assert privacy["release"]["federated_evaluation"]["evaluations"] == 1
    report = format_privacy_report(read_privacy_json(out / "privacy.json"))
    assert "Evaluation: federated" in report and "federated evaluations run: 1" in report
    uid = sorted(devices)[0]
    guard = DeviceGuard(tmp_path / "state" / uid, budget=1e4)
    assert guard.answered_evaluations() == [(1, 0)]
    charged = [e for e, _ in guard._budget([]).events() if "federated evaluation" in e.note]
    assert len(charged) == 1 and charged[0].epsilon == 4.0
    # asked again for the same evaluation, the device refuses and releases nothing
    policy = guard.policy
    assert policy is not None and policy["evaluation.epsilon"] == "4.0"
    with pytest.raises(RoundRefused, match="already answered"):
        guard.admit(run=1, round_index=0, policy=policy, secure_message=False,
                    secure_required=False, events=[], kind="evaluate")
