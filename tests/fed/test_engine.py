"""Federated training end to end: ``privaterec train --method fedrec|fednewsrec|dp-fedrec``,
``privaterec privacy report`` and ``privaterec evaluate`` on a tiny synthetic data set."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch

from privaterec.cli import main
from privaterec.config import RunConfig, TrainConfig
from privaterec.method_settings import FedRecSettings
from privaterec.data.synth import write_synthetic
from privaterec.fed.simulator import eligible_clients, sample_round
from privaterec.privacy.formulas import gaussian_sigma
from privaterec.runtime.checkpoint import load_checkpoint
from privaterec.runs.ranking import load_run_model, prepare_data


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, synth_config) -> Path:
    path = tmp_path_factory.mktemp("fed-data")
    write_synthetic(path, synth_config)
    return path


@pytest.fixture(scope="module")
def base_config(tmp_path_factory, tiny_model_config) -> Path:
    path = tmp_path_factory.mktemp("fed-config") / "tiny.yaml"
    RunConfig(model=tiny_model_config, train=TrainConfig(eval_batch_size=64)).to_yaml(path)
    return path


def _train(data_dir: Path, config: Path, out: Path, *flags: str) -> int:
    return main(["train", "--data", str(data_dir), "--config", str(config), "--out", str(out),
                 "--no-progress", *flags])


@pytest.fixture(scope="module")
def fednewsrec_run(tmp_path_factory, data_dir, base_config) -> Path:
    out = tmp_path_factory.mktemp("runs") / "fednewsrec"
    assert _train(data_dir, base_config, out, "--method", "fednewsrec", "--rounds", "3",
                  "--clients-per-round", "4") == 0
    return out


def _dimension(run: Path) -> int:
    """D counted independently: the trainable parameters of the run's model."""
    _, _, model = load_run_model(run)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_fednewsrec_run_directory(fednewsrec_run):
    for name in ("config.yaml", "vocab.json", "checkpoint.pt", "metrics.json", "privacy.json"):
        assert (fednewsrec_run / name).exists(), name
    config = RunConfig.from_yaml(fednewsrec_run / "config.yaml")
    fed = config.fed
    assert config.train.method == "fednewsrec"
    # every value used is stated: the method's defaults were filled in
    assert (fed.rounds, fed.clients_per_round, fed.strategy, fed.server_lr, fed.settings.clip,
            fed.settings.noise_scale, fed.client_fraction) == (3, 4, "sgd", 0.5, 0.005, 0.015,
                                                               0.02)
    assert "\n  settings:\n    clip: 0.005\n    noise_scale: 0.015\n" in \
        (fednewsrec_run / "config.yaml").read_text()
    metrics = json.loads((fednewsrec_run / "metrics.json").read_text())
    assert metrics["method"] == "fednewsrec"
    assert [e["round"] for e in metrics["rounds"]] == [1, 2, 3]
    assert all(e["clients"] == 4 and e["samples"] > 0 and math.isfinite(e["loss"])
               for e in metrics["rounds"])
    assert 0.0 <= metrics["test"]["auc"] <= 1.0
    checkpoint = load_checkpoint(fednewsrec_run / "checkpoint.pt")
    assert checkpoint["round"] == 3 and checkpoint["method"] == "fednewsrec"
    assert checkpoint["params"].numel() == _dimension(fednewsrec_run)


def test_fednewsrec_privacy_json_accounts_every_release(fednewsrec_run):
    summary = json.loads((fednewsrec_run / "privacy.json").read_text())
    d = _dimension(fednewsrec_run)
    release = summary["release"]
    update_eps, coordinate_eps = 2 * 0.005 * d / 0.015, 2 * 0.005 / 0.015
    assert release["dimension"] == d
    assert release["epsilon_per_round"] == pytest.approx(update_eps)
    assert release["coordinate_epsilon"] == pytest.approx(coordinate_eps)
    assert summary["rounds"] == 3 and summary["checks"] == []
    # replay the server's sampling independently of the run
    config = RunConfig.from_yaml(fednewsrec_run / "config.yaml")
    clients = prepare_data(config).train_clients
    eligible = eligible_clients(clients)
    taken = Counter(u for t in range(3)
                    for u in sample_round(eligible, 4, seed=config.train.seed, round_index=t))
    train = summary["report"]["phases"]["train"]
    assert train["num_users"] == len(taken)
    assert train["releases_max"] == max(taken.values())
    assert train["basic_epsilon_max"] == pytest.approx(max(taken.values()) * update_eps)


def test_privacy_report_shows_both_fednewsrec_epsilons(fednewsrec_run, capsys):
    d = _dimension(fednewsrec_run)
    assert main(["privacy", "report", "--run", str(fednewsrec_run)]) == 0
    out = capsys.readouterr().out
    assert "method fednewsrec, 3 round(s) completed" in out
    assert f"{2 * 0.005 * d / 0.015:.6g}" in out and "2*clip*D/lambda" in out
    assert f"{2 * 0.005 / 0.015:.6g}" in out and "per-coordinate" in out
    assert main(["privacy", "report", "--run", str(fednewsrec_run), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["release"]["epsilon_per_round"] == pytest.approx(2 * 0.005 * d / 0.015)


def test_evaluate_a_federated_run(fednewsrec_run, capsys):
    assert main(["evaluate", "--run", str(fednewsrec_run), "--json", "--no-progress"]) == 0
    result = json.loads(capsys.readouterr().out)
    metrics = json.loads((fednewsrec_run / "metrics.json").read_text())
    # the checkpoint holds the final federated model: same metrics as at the end of training
    assert result["auc"] == pytest.approx(metrics["test"]["auc"], abs=1e-9)
    assert result["impressions"] == metrics["test"]["impressions"] > 0


def test_federated_flags_with_a_centralized_method_exit_2(data_dir, base_config, tmp_path,
                                                          capsys):
    out = tmp_path / "run"
    assert _train(data_dir, base_config, out, "--method", "centralized", "--rounds", "3",
                  "--clip", "0.1") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--clip, --rounds only apply to federated methods" in err
    assert "--method centralized" in err
    assert not (out / "config.yaml").exists()


def test_noise_scale_with_dp_fedrec_exits_2(data_dir, base_config, tmp_path, capsys):
    assert _train(data_dir, base_config, tmp_path / "run", "--method", "dp-fedrec",
                  "--noise-scale", "0.1") == 2
    assert ("--noise-scale does not apply to dp-fedrec (its settings: --clip, --noise, "
            "--epsilon-train, --delta-train)") in capsys.readouterr().err


def test_dp_fedrec_gaussian_run(data_dir, base_config, tmp_path):
    out = tmp_path / "run"
    assert _train(data_dir, base_config, out, "--method", "dp-fedrec", "--noise", "gaussian",
                  "--epsilon-train", "2", "--delta", "1e-5", "--clip", "0.01", "--rounds", "2",
                  "--clients-per-round", "3") == 0
    fed = RunConfig.from_yaml(out / "config.yaml").fed
    assert (fed.strategy, fed.server_lr, fed.settings.noise, fed.settings.epsilon_train,
            fed.settings.delta_train) == ("fedadam", 0.01, "gaussian", 2.0, 1e-5)
    release = json.loads((out / "privacy.json").read_text())["release"]
    assert (release["mechanism"], release["clipping"]) == ("gaussian", "l2")
    assert release["epsilon_per_round"] == 2.0 and release["delta_per_round"] == 1e-5
    assert release["sensitivity_l2"] == pytest.approx(0.02)
    assert release["noise_scale"] == pytest.approx(
        gaussian_sigma(epsilon=2.0, delta=1e-5, sensitivity_l2=0.02), rel=1e-9)


def test_fedrec_fedavg_run_and_rerun_resumes(data_dir, base_config, tmp_path, capsys):
    out = tmp_path / "run"
    flags = ("--method", "fedrec", "--strategy", "fedavg", "--local-steps", "2", "--rounds",
             "2", "--clients-per-round", "3")
    assert _train(data_dir, base_config, out, *flags) == 0
    fed = RunConfig.from_yaml(out / "config.yaml").fed
    assert (fed.strategy, fed.server_lr, fed.local_steps, fed.settings) == \
        ("fedavg", 1.0, 2, FedRecSettings())
    params = load_checkpoint(out / "checkpoint.pt")["params"]
    capsys.readouterr()
    assert main(["privacy", "report", "--run", str(out)]) == 0
    assert "not private" in capsys.readouterr().out
    # the same command again: the finished run is resumed, not retrained (no round runs,
    # so the checkpoint is not rewritten)
    written = (out / "checkpoint.pt").stat().st_mtime_ns
    assert _train(data_dir, base_config, out, *flags) == 0
    assert (out / "checkpoint.pt").stat().st_mtime_ns == written
    assert torch.equal(load_checkpoint(out / "checkpoint.pt")["params"], params)
    metrics = json.loads((out / "metrics.json").read_text())
    assert [e["round"] for e in metrics["rounds"]] == [1, 2]
