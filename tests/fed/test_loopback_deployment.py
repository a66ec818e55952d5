"""A real multi-process deployment on loopback (docs/flower.md, "Real deployment").

One ``flower-superlink`` and one ``flower-supernode`` per user (4 users), each SuperNode
started with node options ``user-id``, ``state-dir`` and a ``data-dir`` that holds only its
own user's impressions; ``flwr run flower/`` trains ``dp-fedavg`` through SecAgg+ with
distributed noise (every device adds its noise share before masking) for 2 rounds from a
public directory holding only ``news.tsv`` and ``roster.txt``. Midway through round 2, as
soon as one device has admitted the round (its guard recorded it), that SuperNode is
killed: the round completes with the other 3 (at most k = 1 dropout, threshold 3).

The SuperLink's processes (its ServerApp included) run with an audit hook
(:func:`sys.addaudithook`, loaded through a ``sitecustomize`` on their ``PYTHONPATH``) that
logs every file they open, so the test asserts that the server side opened the catalogue
and the roster and no behaviors file. The same ``sitecustomize`` (in every process of the
test) shortens Flower's fixed 3-second polls (a SuperNode asking the SuperLink for
messages, the ServerApp's Grid asking for replies) to 0.25 s, and the SuperExecs poll for
tasks every 0.25 s (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``): the messages, the processes and
the protocol are Flower's own; only the idle waits between polls are shorter.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the deployment needs flwr")

from privaterec.config import ModelConfig, RunConfig, TrainConfig, fed_config  # noqa: E402
from privaterec.data.mind import BEHAVIORS_FILE, load_dataset, write_split  # noqa: E402
from privaterec.data.records import MindSplit  # noqa: E402
from privaterec.data.roster import ROSTER_FILE, write_public_dir  # noqa: E402
from privaterec.data.synth import SynthConfig, write_synthetic  # noqa: E402
from privaterec.fed.device_guard import GUARD_FILE, DeviceGuard, device_events  # noqa: E402
from privaterec.fed.methods import method_from_config, resolve_run_config  # noqa: E402
from privaterec.privacy.ledger import PrivacyLedger  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TINY = ModelConfig(word_dim=8, num_heads=2, head_dim=4, attention_dim=8, title_len=6,
                   abstract_len=4, history_len=5)
POLL = 0.25
SITECUSTOMIZE = '''import importlib.abc, importlib.util, json, os, sys, time
_log = os.environ.get("PRIVATEREC_OPEN_LOG")
if _log:  # the server side: log every file opened
    def _hook(event, args, _argv=" ".join(sys.argv), _f=open(_log, "a", buffering=1)):
        if event == "open" and isinstance(args[0], (str, os.PathLike)):
            path = os.fspath(args[0])
            if path != _log:
                _f.write(json.dumps([os.getpid(), _argv, path]) + "\\n")
    sys.addaudithook(_hook)

_POLL = float(os.environ.get("PRIVATEREC_TEST_POLL", "0"))
_POLLING = ("flwr.supernode.start_client_internal", "flwr.superlink.grid.http_grid")


class _Time:  # the module's `time`, with sleeps cut to the test's poll interval
    def __getattr__(self, name):
        return getattr(time, name)

    @staticmethod
    def sleep(seconds):
        time.sleep(min(seconds, _POLL))


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in _POLLING:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        loader = spec.loader
        real_exec = loader.exec_module

        def exec_module(module):
            real_exec(module)
            module.time = _Time()
        loader.exec_module = exec_module
        return spec


if _POLL > 0:
    sys.meta_path.insert(0, _Finder())
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on port {port} after {timeout} s")


def test_four_supernodes_train_dp_fedavg_secagg_from_public_data_one_killed_midround(
        tmp_path):
    started = time.monotonic()
    marks: dict[str, float] = {}

    def mark(name: str) -> None:
        marks[name] = round(time.monotonic() - started, 1)

    write_synthetic(tmp_path / "data", SynthConfig(users=4, news=40, seed=5))
    dataset = load_dataset(tmp_path / "data")
    users = write_public_dir(tmp_path / "data", tmp_path / "public")
    assert len(users) == 4
    for uid in users:
        write_split(tmp_path / "devices" / uid / "train", MindSplit(
            news=dataset.train.news,
            behaviors=[imp for imp in dataset.train.behaviors if imp.user_id == uid]))
    config = resolve_run_config(RunConfig(
        data=str(tmp_path / "public"), model=TINY, train=TrainConfig(method="dp-fedavg"),
        fed=fed_config("dp-fedavg", rounds=2, client_fraction=1.0, noise_multiplier=1.0,
                       target_delta=1e-3, adam_tau=1e-3, engine="flower",
                       secure_aggregation="secaggplus", noise_placement="distributed",
                       max_dropouts=1)))
    config.to_yaml(tmp_path / "run.yaml")
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    opened_log = tmp_path / "server_opens.jsonl"
    port = _free_port()
    home = tmp_path / "flwr"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "lb"\n[superlink.lb]\naddress = "127.0.0.1:{port}"\n'
        f'insecure = true\n')
    src = str(REPO / "src")
    base = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "FLWR_HOME": str(home), "PYTHONPATH": f"{hook_dir}{os.pathsep}{src}",
            "PRIVATEREC_TEST_POLL": str(POLL), "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": str(POLL)}
    server_env = {**base, "PRIVATEREC_OPEN_LOG": str(opened_log)}
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str, cmd: list[str], env: dict[str, str]) -> None:
        with open(tmp_path / f"{name}.log", "wb") as log:
            procs[name] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)

    def stop(name: str) -> None:  # each in its own session: its Flower children go with it
        try:
            os.killpg(procs[name].pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    state = {uid: tmp_path / "state" / uid for uid in users}
    victim = users[0]
    out = tmp_path / "run"
    try:
        start("superlink", [str(BIN / "flower-superlink"), "--insecure", "--host",
                            "127.0.0.1", "--port", str(port), "--database",
                            str(tmp_path / "link.db")], server_env)
        for uid in users:  # they retry until the SuperLink listens
            start(f"node_{uid}", [
                str(BIN / "flower-supernode"), "--insecure", "--superlink",
                f"127.0.0.1:{port}", "--port", str(_free_port()), "--node-config",
                f"user-id='{uid}' data-dir='{tmp_path / 'devices' / uid}' "
                f"state-dir='{state[uid]}' budget=1000.0"], base)
        _wait_for_port(port, 120)
        mark("superlink listening")
        start("flwr_run", [str(BIN / "flwr"), "run", str(REPO / "flower"), "lb", "--stream",
                           "--run-config", f"public-dir='{tmp_path / 'public'}' "
                           f"out-dir='{out}' config='{tmp_path / 'run.yaml'}'"], base)
        run = procs["flwr_run"]
        guard_file = state[victim] / GUARD_FILE
        while run.poll() is None:  # kill the victim once it admitted round 2
            if guard_file.exists() and len(json.loads(guard_file.read_text())["answered"]) == 2:
                mark("victim killed")
                stop(f"node_{victim}")
                break
            time.sleep(0.02)
        run.wait(timeout=400)
        mark("run done")
    finally:
        for name in procs:
            stop(name)
        for proc in procs.values():
            proc.wait(timeout=30)
    log = (tmp_path / "flwr_run.log").read_text()
    assert run.returncode == 0 and "privaterec: run written" in log, (marks, log[-3000:])
    assert "victim killed" in marks, marks

    # dp-fedavg through SecAgg+ with the clients' noise shares trained 2 rounds of 4 clients
    privacy = json.loads((out / "privacy.json").read_text())
    release = privacy["release"]
    assert release["mode"] == "deployed" and release["population"] == 4
    assert release["central"]["trust"]["noise_placement"] == "distributed"
    assert "holds only public material" in release["trust"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert [r["clients"] for r in metrics["rounds"]] == [4, 4] and "test" not in metrics
    # round 2 lost the victim (within k = 1) and still decoded: before its masked vector
    # arrived ("1 of 4 ... dropped out"), or after it (in the sum, "0 of 4")
    assert "Node Unavailable" in log
    assert re.search(r"round 2: [01] of 4 clients dropped out of secure aggregation", log)

    # every device's ledger against the server's record of the rounds
    server = PrivacyLedger.from_dict(privacy["ledger"])
    (server_event, server_count), = server.events(users[1])
    assert server_count == 2
    method = method_from_config(config)
    (charge,) = device_events(method, 0)
    assert (charge.mechanism, charge.noise_scale, charge.sensitivity) == (
        server_event.mechanism, server_event.noise_scale, server_event.sensitivity)
    assert charge.epsilon == pytest.approx(server_event.epsilon)  # q = 1: no amplification
    # The survivors answered both rounds; the victim was killed once it had admitted
    # round 2, so whether or not its masked vector reached the sum, its ledger holds the
    # round (a device records a round before it computes the release).
    runs = set()
    for uid in users:
        guard = DeviceGuard(state[uid])
        answered = guard.answered()
        runs |= {r for r, _ in answered}
        assert [t for _, t in answered] == [0, 1], (uid, answered)
        assert guard._budget([]).events() == [(charge, 2)], uid  # one charge per round
        assert server.events(uid) == [(server_event, 2)], uid  # the server's record
    assert len(runs) == 1

    # the server side: its ServerApp process opened the catalogue and the roster (the hook
    # saw it) and no process of the SuperLink's opened a behaviors file
    opens = [json.loads(line) for line in opened_log.read_text().splitlines()]
    serverapp = [path for _, argv, path in opens if "serverapp" in argv]
    assert str(tmp_path / "public" / "news.tsv") in serverapp
    assert str(tmp_path / "public" / ROSTER_FILE) in serverapp
    assert not [path for _, _, path in opens if Path(path).name == BEHAVIORS_FILE]
