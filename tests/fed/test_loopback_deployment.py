"""A real multi-process deployment on loopback (docs/flower.md, "Real deployment").

One ``flower-superlink`` and one ``flower-supernode`` per user (4 users), each SuperNode
started with node options ``user-id`` and a ``data-dir`` that holds only its own user's
impressions; ``flwr run flower/`` trains ``dp-fedrec`` for 2 rounds from a public
directory holding only ``news.tsv`` and ``roster.txt``. The SuperLink's processes (its
ServerApp included) run with an audit hook (:func:`sys.addaudithook`, loaded through a
``sitecustomize`` on their ``PYTHONPATH`` only) that logs every file they open, so the test
asserts that the server side opened the catalogue and the roster and no behaviors file.

It takes about 2 minutes on a loaded 2-core machine (each message starts a
``flwr-clientapp`` process that imports torch), so it runs only when
``PRIVATEREC_LOOPBACK=1`` is set.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the deployment needs flwr")

from privaterec.data.mind import BEHAVIORS_FILE, load_dataset, write_split  # noqa: E402
from privaterec.data.records import MindSplit  # noqa: E402
from privaterec.data.roster import ROSTER_FILE, write_public_dir  # noqa: E402
from privaterec.data.synth import SynthConfig, write_synthetic  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("PRIVATEREC_LOOPBACK") != "1",
                       reason="a 2-minute multi-process deployment; set PRIVATEREC_LOOPBACK=1"),
]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HOOK = '''import json, os, sys
_log = os.environ.get("PRIVATEREC_OPEN_LOG")
if _log:
    def _hook(event, args, _argv=" ".join(sys.argv), _f=open(_log, "a", buffering=1)):
        if event == "open" and isinstance(args[0], (str, os.PathLike)):
            path = os.fspath(args[0])
            if path != _log:
                _f.write(json.dumps([os.getpid(), _argv, path]) + "\\n")
    sys.addaudithook(_hook)
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_superlink_and_four_supernodes_train_from_public_data_only(tmp_path):
    write_synthetic(tmp_path / "data", SynthConfig(users=4, news=40, seed=5))
    dataset = load_dataset(tmp_path / "data")
    users = write_public_dir(tmp_path / "data", tmp_path / "public")
    for uid in users:
        write_split(tmp_path / "devices" / uid / "train", MindSplit(
            news=dataset.train.news,
            behaviors=[imp for imp in dataset.train.behaviors if imp.user_id == uid]))
    (tmp_path / "run.yaml").write_text(
        "model: {word_dim: 8, num_heads: 2, head_dim: 4, attention_dim: 8, title_len: 6, "
        "abstract_len: 4, history_len: 5}\ntrain: {method: dp-fedrec}\n"
        "fed: {settings: {epsilon_train: 1.0}}\n")
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    opened_log = tmp_path / "server_opens.jsonl"
    port = _free_port()
    home = tmp_path / "flwr"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "lb"\n[superlink.lb]\naddress = "127.0.0.1:{port}"\n'
        f'insecure = true\n')
    src = str(REPO / "src")
    base = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "FLWR_HOME": str(home), "PYTHONPATH": src}
    server_env = {**base, "PYTHONPATH": f"{hook_dir}{os.pathsep}{src}",
                  "PRIVATEREC_OPEN_LOG": str(opened_log)}
    procs: list[subprocess.Popen[bytes]] = []

    def start(cmd: list[str], env: dict[str, str], log: str) -> None:
        procs.append(subprocess.Popen(cmd, env=env, stdout=open(tmp_path / log, "wb"),
                                      stderr=subprocess.STDOUT, start_new_session=True))

    try:
        start([str(BIN / "flower-superlink"), "--insecure", "--host", "127.0.0.1",
               "--port", str(port), "--database", str(tmp_path / "link.db")],
              server_env, "superlink.log")
        time.sleep(3)
        for uid in users:
            start([str(BIN / "flower-supernode"), "--insecure", "--superlink",
                   f"127.0.0.1:{port}", "--port", str(_free_port()), "--node-config",
                   f"user-id='{uid}' data-dir='{tmp_path / 'devices' / uid}' "
                   f"state-dir='{tmp_path / 'state' / uid}' budget=1000.0"],
                  base, f"node_{uid}.log")
        out = tmp_path / "run"
        run = subprocess.run(
            [str(BIN / "flwr"), "run", str(REPO / "flower"), "lb", "--stream",
             "--run-config", f"public-dir='{tmp_path / 'public'}' out-dir='{out}' "
             f"config='{tmp_path / 'run.yaml'}' method='dp-fedrec' rounds=2 "
             f"clients-per-round=2 seed=3"],
            env=base, capture_output=True, text=True, timeout=400)
    finally:
        for proc in procs:  # each in its own session: its Flower children go with it
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in procs:
            proc.wait(timeout=30)
    assert run.returncode == 0 and "privaterec: run written" in run.stdout + run.stderr, \
        (run.stdout + run.stderr)[-3000:]

    release = json.loads((out / "privacy.json").read_text())["release"]
    assert release["mode"] == "deployed" and release["population"] == 4
    assert "holds only public material" in release["trust"]
    assert release["evaluation"].startswith("none")
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["rounds"]) == 2 and "test" not in metrics
    # every device answered each of its rounds once, 2 users x 2 rounds in all
    answered = [json.loads((tmp_path / "state" / uid / "federated_device.json").read_text())
                ["answered"] for uid in users
                if (tmp_path / "state" / uid / "federated_device.json").exists()]
    assert sum(len(a) for a in answered) == 4
    # the server side: its ServerApp process opened the catalogue and the roster (the hook
    # saw it) and no process of the SuperLink's opened a behaviors file
    opens = [json.loads(line) for line in opened_log.read_text().splitlines()]
    serverapp = [path for _, argv, path in opens if "serverapp" in argv]
    assert str(tmp_path / "public" / "news.tsv") in serverapp
    assert str(tmp_path / "public" / ROSTER_FILE) in serverapp
    assert not [path for _, _, path in opens if Path(path).name == BEHAVIORS_FILE]
