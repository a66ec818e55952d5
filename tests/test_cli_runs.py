"""What a careless or hostile user can do to a run directory and its data, from the command
line: change the data under a run, train twice into one directory, train on an empty split,
close the output pipe, serve on a busy port, pass contradictory flags."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from privaterec.cli import main

TINY = """\
model:
  word_dim: 16
  num_heads: 2
  head_dim: 8
  attention_dim: 16
  cnn_filters: 16
  gru_dim: 16
  history_len: 10
train:
  epochs: 1
  batch_size: 64
"""

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs-data") / "data"
    assert main(["data", "synth", "--out", str(out), "--users", "60", "--news", "200",
                 "--seed", "2"]) == 0
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("runs-config") / "tiny.yaml"
    path.write_text(TINY)
    return path


def _train(data: Path, tiny: Path, out: Path, *extra: str) -> int:
    return main(["train", "--data", str(data), "--config", str(tiny), "--out", str(out),
                 "--no-progress", *extra])


def _fedrec(data: Path, tiny: Path, out: Path, *extra: str) -> int:
    return _train(data, tiny, out, "--method", "fedrec", "--rounds", "2",
                  "--clients-per-round", "4", *extra)


def _files(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run.iterdir())}


# ------------------------------------------------------------------ data under a run
def test_data_synth_refuses_to_overwrite_a_data_set(tmp_path, capsys):
    out = tmp_path / "d"
    args = ["data", "synth", "--out", str(out), "--users", "20", "--news", "60"]
    assert main(args + ["--seed", "1"]) == 0
    before = (out / "train" / "behaviors.tsv").read_bytes()
    capsys.readouterr()
    assert main(args + ["--seed", "2"]) == 2
    err = capsys.readouterr().err
    assert "--overwrite" in err and "not empty" in err and "Traceback" not in err
    assert (out / "train" / "behaviors.tsv").read_bytes() == before
    assert main(args + ["--seed", "2", "--overwrite"]) == 0
    assert (out / "train" / "behaviors.tsv").read_bytes() != before


def test_changed_data_is_refused_naming_the_file_and_the_run_is_untouched(data, tiny,
                                                                          tmp_path, capsys):
    own = tmp_path / "data"
    shutil.copytree(data, own)
    run = tmp_path / "run"
    assert _fedrec(own, tiny, run) == 0
    assert (run / "data.json").is_file()
    saved = _files(run)
    # the same content with a new modification time is the same data: it resumes
    behaviors = own / "train" / "behaviors.tsv"
    os.utime(behaviors, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert _fedrec(own, tiny, run) == 0
    saved = _files(run)
    capsys.readouterr()
    # half of the training users' impressions removed
    lines = behaviors.read_text().splitlines(keepends=True)
    behaviors.write_text("".join(lines[: len(lines) // 2]))
    assert _fedrec(own, tiny, run) == 2
    err = capsys.readouterr().err
    assert "train/behaviors.tsv" in err and "not the data this run trained on" in err
    assert "Traceback" not in err
    assert _files(run) == saved  # nothing rewritten: vocab.json, config.yaml, ...
    # evaluating on the run's own (changed) data, or on "training" data, is refused too
    assert main(["evaluate", "--run", str(run), "--no-progress"]) == 2
    assert "train/behaviors.tsv" in capsys.readouterr().err
    assert main(["evaluate", "--run", str(run), "--data", str(own), "--split", "train",
                 "--no-progress"]) == 2
    assert "--split train" in capsys.readouterr().err
    # other data, asked for explicitly, is evaluated
    assert main(["evaluate", "--run", str(run), "--data", str(own), "--no-progress"]) == 0
    assert _files(run) == saved


def test_recall_evaluation_on_changed_data_is_refused(data, tiny, tmp_path, capsys):
    own = tmp_path / "data"
    shutil.copytree(data, own)
    run = tmp_path / "run"
    assert _fedrec(own, tiny, run) == 0
    behaviors = own / "test" / "behaviors.tsv"
    behaviors.write_text("".join(behaviors.read_text().splitlines(keepends=True)[:-3]))
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run), "--recall", "youtubenet",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "test/behaviors.tsv" in err and "Traceback" not in err


def test_changed_news_of_a_run_without_a_fingerprint_keep_its_vocabularies(data, tiny,
                                                                            tmp_path, capsys):
    """A run written before runs recorded their data: its vocab.json is never rewritten."""
    own = tmp_path / "data"
    shutil.copytree(data, own)
    run = tmp_path / "run"
    assert _fedrec(own, tiny, run) == 0
    (run / "data.json").unlink()
    news = own / "train" / "news.tsv"
    rows = [line.split("\t") for line in news.read_text().splitlines()]
    for row in rows[:5]:
        row[3] += " brandnewtoken"  # a word the run's vocabulary does not have
    news.write_text("".join("\t".join(row) + "\n" for row in rows))
    saved = _files(run)
    capsys.readouterr()
    assert _fedrec(own, tiny, run) == 2
    err = capsys.readouterr().err
    assert "vocab.json" in err and "Traceback" not in err
    assert _files(run) == saved


def test_a_replaced_vocab_json_is_named_as_the_cause(data, tiny, tmp_path, capsys):
    """evaluate of a model whose vocab.json was replaced (as earlier versions did) names
    vocab.json, not the basis attention."""
    other = tmp_path / "other"
    assert main(["data", "synth", "--out", str(other), "--users", "30", "--news", "90",
                 "--seed", "9"]) == 0
    run, donor = tmp_path / "run", tmp_path / "donor"
    assert _fedrec(data, tiny, run) == 0
    assert _fedrec(other, tiny, donor) == 0
    shutil.copy(donor / "vocab.json", run / "vocab.json")
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run), "--data", str(data), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "vocab.json" in err and "basis_attention" not in err
    assert "news_encoder.embedding.weight" in err


# ----------------------------------------------------------------------------- lock
_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, str(os.getpid()).encode())
print("locked", flush=True)
time.sleep(60)
"""


def test_a_second_training_into_one_run_directory_names_the_holder(data, tiny, tmp_path,
                                                                    capsys):
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run / "train.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        assert _fedrec(data, tiny, run) == 2
        err = capsys.readouterr().err
        assert f"process {holder.pid}" in err and "another training" in err
        assert not (run / "config.yaml").exists()
    finally:
        holder.kill()
        holder.wait()
    # the holder is dead: its lock file is stale, and the next training takes it over
    assert (run / "train.lock").read_text() == str(holder.pid)
    assert _fedrec(data, tiny, run) == 0
    assert not (run / "train.lock").exists()  # removed by its holder on exit


def test_run_lock_is_exclusive_within_a_process(tmp_path):
    from privaterec.errors import CheckpointError
    from privaterec.runs.lock import run_lock

    with run_lock(tmp_path):
        assert (tmp_path / "train.lock").read_text().strip() == str(os.getpid())
        with pytest.raises(CheckpointError, match=f"process {os.getpid()}"):
            with run_lock(tmp_path):
                pass
    with run_lock(tmp_path):  # released
        pass


# ----------------------------------------------------------------- empty training split
@pytest.fixture(scope="module")
def empty_train(data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("empty") / "data"
    shutil.copytree(data, out)
    (out / "train" / "behaviors.tsv").write_text("")
    return out


@pytest.mark.parametrize("method,extra", [
    ("centralized", []), ("popularity", []), ("fedrec", ["--rounds", "1"]),
    ("fednewsrec", ["--rounds", "1"]), ("dp-fedrec", ["--rounds", "1"]),
    ("privaterec", ["--rounds", "1"]),
    ("dp-fedavg", ["--rounds", "1", "--target-epsilon", "4"]),
])
def test_an_empty_training_split_is_one_clear_error_for_every_method(
        method, extra, empty_train, tiny, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(empty_train, tiny, out, "--method", method, *extra) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "no training sample" in err
    assert "train/behaviors.tsv" in err and "Traceback" not in err
    assert not out.exists()  # nothing written


def test_unifedrec_on_an_empty_training_split_writes_nothing(data, empty_train, tiny,
                                                               tmp_path, capsys):
    ranker = tmp_path / "ranker"
    assert _fedrec(data, tiny, ranker) == 0
    out = tmp_path / "recall"
    assert main(["train", "--method", "unifedrec", "--ranker", str(ranker), "--data",
                 str(empty_train), "--rounds", "1", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "training split" in err and "Traceback" not in err
    assert not out.exists()


def test_data_check_does_not_call_an_empty_training_split_valid(empty_train, capsys):
    assert main(["data", "check", str(empty_train)]) == 1
    out = capsys.readouterr().out
    assert "INVALID" in out and "no impressions" in out


# ------------------------------------------------------------------------ smaller ones
def test_a_closed_output_pipe_is_not_a_traceback(data):
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, "-c",
                             "import sys; from privaterec.cli import main; sys.exit(main())",
                             "data", "check", str(data), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before anything is written (`| head -0`)
    err = proc.stderr.read().decode()
    assert proc.wait() == 141
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception" not in err


def test_serve_on_a_busy_port_exits_2_without_claiming_to_serve(data, tiny, tmp_path,
                                                                 capsys):
    pytest.importorskip("uvicorn")
    run = tmp_path / "run"
    assert _fedrec(data, tiny, run) == 0
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        capsys.readouterr()
        assert main(["serve", "--run", str(run), "--news", str(data), "--no-ingest",
                     "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert "serving" not in err and f"127.0.0.1:{port}" in err and "in use" in err
    assert not (run / "serving-store").exists()


def test_clients_per_round_above_the_population_is_refused(data, tiny, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(data, tiny, out, "--method", "fedrec", "--rounds", "1",
                  "--clients-per-round", "100000") == 2
    err = capsys.readouterr().err
    assert "--clients-per-round" in err and "100000" in err and "training users can take part" in err
    assert not out.exists()


@pytest.mark.parametrize("flags", [
    ["--method", "dp-fedavg", "--target-epsilon", "4", "--noise-multiplier", "1"],
    ["--method", "fedrec", "--client-fraction", "0.5", "--clients-per-round", "3"],
])
def test_contradictory_flags_are_refused(flags, data, tiny, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(data, tiny, out, "--rounds", "1", *flags) == 2
    err = capsys.readouterr().err
    assert flags[2] in err and flags[4] in err and "only one" in err
    assert not out.exists()


def test_a_flag_replaces_its_alternative_from_the_configuration(tmp_path):
    """--target-epsilon over a saved config.yaml (which states the calibrated z) clears that
    z, so it is calibrated again; it does not run with the old z beside the new target."""
    from privaterec.cli import build_parser, run_config_from_args
    from privaterec.config import RunConfig, TrainConfig, fed_config
    from privaterec.fed.methods import resolve_run_config

    config = RunConfig(data=str(tmp_path), train=TrainConfig(method="dp-fedavg"),
                       fed=fed_config("dp-fedavg", rounds=5, client_fraction=0.1,
                                      target_epsilon=4.0))
    saved = tmp_path / "config.yaml"
    resolve_run_config(config).to_yaml(saved)
    assert RunConfig.from_yaml(saved).fed.settings.noise_multiplier is not None
    parser = build_parser()
    args = parser.parse_args(["train", "--config", str(saved), "--target-epsilon", "8",
                              "--out", str(tmp_path / "o")])
    settings = run_config_from_args(args).fed.settings
    assert settings.target_epsilon == 8.0 and settings.noise_multiplier is None
    args = parser.parse_args(["train", "--config", str(saved), "--noise-multiplier", "2",
                              "--out", str(tmp_path / "o")])
    settings = run_config_from_args(args).fed.settings
    assert settings.target_epsilon is None and settings.noise_multiplier == 2.0


# ------------------------------------------------------------------ PrivateRec's default
def test_privaterec_defaults_to_strict_mode_and_warns_when_paper_mode_is_asked(
        data, tiny, tmp_path, capsys):
    common = ["--method", "privaterec", "--epsilon-train", "5", "--rounds", "1",
              "--clients-per-round", "3"]
    assert _train(data, tiny, tmp_path / "default", *common) == 0
    assert "privacy_mode: strict" in (tmp_path / "default" / "config.yaml").read_text()
    assert "WARNING" not in capsys.readouterr().err
    assert main(["privacy", "report", "--run", str(tmp_path / "default")]) == 0
    assert "NOT covered" not in capsys.readouterr().out
    assert _train(data, tiny, tmp_path / "paper", *common, "--privacy-mode", "paper") == 0
    assert "privacy_mode: paper" in (tmp_path / "paper" / "config.yaml").read_text()
    err = capsys.readouterr().err
    assert "WARNING: --privacy-mode paper" in err and "NOT a guarantee" in err
