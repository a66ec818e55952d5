"""Ctrl-C while the rounds run in other threads and processes (Flower's simulation): it stops
within seconds, with the completed rounds checkpointed, exit status 130 and no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from privaterec.fed.interrupt import RoundInterrupted, sigint_sets, stop_grid_on
from privaterec.fed.methods import method_from_config
from privaterec.fed.simulator import simulate_round, train_federated
from privaterec.fed.strategies import build_strategy
from privaterec.runtime.checkpoint import load_checkpoint

RESUME = dict(rounds=6, checkpoint_every=2, clients_per_round=6, max_client_samples=4)


def _train(make_objective, clients, run_config, *, checkpoint=None, interrupt_at=None):
    config = run_config("fedrec", **RESUME)
    objective = make_objective("nrms")
    method = method_from_config(config)

    def round_fn(params, selected, t):
        if t == interrupt_at:
            raise RoundInterrupted("interrupted")  # Ctrl-C while round t + 1 ran
        return simulate_round(objective, params, clients, selected, method, seed=0,
                              round_index=t, chunk_clients=config.fed.chunk_clients)

    return train_federated(objective, clients, config.fed, method,
                           build_strategy(config.fed), seed=0, checkpoint_path=checkpoint,
                           progress=False, round_fn=round_fn)


def test_an_interrupted_round_checkpoints_the_completed_ones_and_resumes_bitwise(
        make_objective, clients, run_config, tmp_path):
    reference = _train(make_objective, clients, run_config)
    ckpt = tmp_path / "checkpoint.pt"
    with pytest.raises(RoundInterrupted):
        _train(make_objective, clients, run_config, checkpoint=ckpt, interrupt_at=3)
    assert load_checkpoint(ckpt)["round"] == 3  # not only round 2's periodic checkpoint
    resumed = _train(make_objective, clients, run_config, checkpoint=ckpt)
    assert resumed.round_index == reference.round_index == 6
    assert torch.equal(resumed.params, reference.params)
    assert resumed.ledger == reference.ledger and resumed.log == reference.log


class _Grid:
    def __init__(self) -> None:
        self.calls = 0

    def push_messages(self, messages):
        self.calls += 1
        return []

    def pull_messages(self, ids):
        self.calls += 1
        return []

    def get_node_ids(self):
        self.calls += 1
        return [1]


def test_a_stopped_grid_raises_from_every_call():
    grid, stop = _Grid(), threading.Event()
    stop_grid_on(grid, stop)
    assert grid.get_node_ids() == [1] and grid.pull_messages([]) == []
    stop.set()
    for call in (grid.get_node_ids, lambda: grid.pull_messages([]),
                 lambda: grid.push_messages([])):
        with pytest.raises(RoundInterrupted):
            call()
    assert grid.calls == 2


def test_sigint_sets_the_events_instead_of_raising():
    first, second = threading.Event(), threading.Event()
    before = signal.getsignal(signal.SIGINT)
    with sigint_sets(first, second, quiet=()):
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while not first.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
    assert first.is_set() and second.is_set()
    assert signal.getsignal(signal.SIGINT) is before


TINY = """\
model:
  word_dim: 8
  num_heads: 2
  head_dim: 4
  attention_dim: 8
  title_len: 6
  abstract_len: 4
  history_len: 5
fed:
  checkpoint_every: 1
"""


@pytest.mark.slow
def test_ctrl_c_on_the_flower_engine_stops_checkpointed_with_exit_130(tmp_path):
    """Ctrl-C in a terminal: SIGINT to the whole process group (the Ray workers too)."""
    pytest.importorskip("flwr", reason="the Flower engine needs flwr[simulation]")
    from privaterec.cli import main

    data, config, out = tmp_path / "data", tmp_path / "tiny.yaml", tmp_path / "run"
    assert main(["data", "synth", "--out", str(data), "--users", "12", "--news", "60",
                 "--seed", "5"]) == 0
    config.write_text(TINY)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from privaterec.cli import main; sys.exit(main())",
         "train", "--data", str(data), "--config", str(config), "--method", "fedrec",
         "--engine", "flower", "--rounds", "1000", "--clients-per-round", "3", "--out",
         str(out), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (out / "checkpoint.pt").exists():
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "no round in 300 s"
            time.sleep(0.2)
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=90)
        stopped = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = err.decode()
    assert proc.returncode == 130, text
    assert "Traceback" not in text and "Error" not in text, text
    assert "interrupted; rerun the same command" in text
    assert stopped < 60, stopped
    saved = load_checkpoint(out / "checkpoint.pt")
    assert 1 <= saved["round"] < 1000
    assert not (out / "train.lock").exists()
