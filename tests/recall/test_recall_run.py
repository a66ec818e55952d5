"""Uni-FedRec run directories end to end: `train --method unifedrec`, `evaluate --recall`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from privaterec.cli import main
from privaterec.errors import CheckpointError, ConfigError
from privaterec.privacy.report import read_privacy_json
from privaterec.runs.recall import (RecallModelConfig, RecallRunConfig, is_recall_run,
                                   load_recall_run, query_bytes)
from privaterec.config import FedConfig
from privaterec.recall.task import recall_fed_config

TINY_RANKER = """\
model:
  word_dim: 16
  num_heads: 2
  head_dim: 8
  attention_dim: 16
  history_len: 20
"""
KS = ("100", "200", "300", "400")


@pytest.fixture(scope="module")
def ranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("recall-run")
    data = root / "data"
    assert main(["data", "synth", "--out", str(data), "--users", "120", "--news", "300",
                 "--seed", "5"]) == 0
    config = root / "tiny.yaml"
    config.write_text(TINY_RANKER)
    run = root / "fedrec"
    assert main(["train", "--data", str(data), "--method", "fedrec", "--config", str(config),
                 "--rounds", "2", "--clients-per-round", "8", "--out", str(run),
                 "--no-progress"]) == 0
    return run


@pytest.fixture(scope="module")
def recall_run(ranker: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("unifedrec") / "run"
    assert main(["train", "--method", "unifedrec", "--ranker", str(ranker), "--rounds", "3",
                 "--clients-per-round", "6", "--recall-basis", "6", "--interest-noise", "0.6",
                 "--distance-threshold", "0.3", "--out", str(out), "--no-progress"]) == 0
    return out


def test_train_writes_a_loadable_run_with_its_ledger(recall_run: Path, ranker: Path) -> None:
    assert is_recall_run(recall_run) and not is_recall_run(ranker)
    run = load_recall_run(recall_run)
    assert run.ranker == ranker.resolve()
    assert run.model.num_basis == 6 and not run.model.training
    assert run.config.model.channel_epsilon == pytest.approx(2 * 0.2 * 6 / 0.6)  # 2δB/λ_I
    summary = read_privacy_json(recall_run)
    assert summary["rounds"] == 3
    assert summary["release"]["epsilon_per_round"] == pytest.approx(2 * 0.1 / 0.01)
    events = summary["ledger"]
    assert events  # every sampled client's upload is recorded
    metrics = json.loads((recall_run / "metrics.json").read_text())
    assert metrics["rounds"] == 3 and metrics["users_trained"] <= 3 * 6


def test_training_resumes_and_refuses_a_different_run(recall_run: Path, ranker: Path) -> None:
    before = (recall_run / "checkpoint.pt").read_bytes()
    assert main(["train", "--method", "unifedrec", "--ranker", str(ranker), "--rounds", "3",
                 "--clients-per-round", "6", "--recall-basis", "6", "--interest-noise", "0.6",
                 "--distance-threshold", "0.3", "--out", str(recall_run),
                 "--no-progress"]) == 0
    assert (recall_run / "checkpoint.pt").read_bytes() == before  # finished: nothing to do
    with pytest.raises(CheckpointError, match="different Uni-FedRec run"):
        from privaterec.runs.recall import train_recall_run
        train_recall_run(RecallRunConfig(ranker=str(ranker)), recall_run, progress=False)


def test_evaluate_recall_json_keys_ledger_and_bytes(recall_run: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["evaluate", "--run", str(recall_run), "--recall", "unifedrec", "--json",
                 "--no-progress"]) == 0
    result = json.loads(capsys.readouterr().out)
    for k in KS:
        assert 0.0 <= result[f"future_recall@{k}"] <= 1.0
        assert 0.0 <= result[f"history_recall@{k}"] <= 1.0
    assert 0.0 <= result["auc"] <= 1.0
    assert result["quotas_in_clear"] is True
    # each user's query: C_u channels of 2δB/λ_I = 2·0.2·6/0.6 = 4 (quotas excluded)
    assert result["query_epsilon_mean"] == pytest.approx(result["channels_mean"] * 4.0)
    assert result["query_epsilon_max"] % 4.0 == pytest.approx(0.0)
    assert result["bytes_per_query"] == pytest.approx(4 * result["channels_mean"] * 7)
    # R@K grows with K on average (more is recalled).
    assert result["future_recall@400"] >= result["future_recall@100"]
    assert "serving" not in read_privacy_json(recall_run)["release"]  # simulated: apart
    summary = read_privacy_json(Path(result["record"]))
    assert any(s["kind"] == "unifedrec-recall" for s in summary["release"]["serving"])
    capsys.readouterr()
    assert main(["privacy", "report", "--run", result["record"]]) == 0
    report = capsys.readouterr().out
    assert "clear_quotas" in report and "not private" in report and "SIMULATED" in report
    training = read_privacy_json(recall_run)["ledger"]
    # re-running the finished training leaves the run's release record as it was
    run = load_recall_run(recall_run)
    assert main(["train", "--method", "unifedrec", "--ranker", str(run.ranker), "--rounds", "3",
                 "--clients-per-round", "6", "--recall-basis", "6", "--interest-noise", "0.6",
                 "--distance-threshold", "0.3", "--out", str(recall_run),
                 "--no-progress"]) == 0
    assert read_privacy_json(recall_run)["ledger"] == training


def test_quota_noise_makes_the_query_private(recall_run: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["evaluate", "--run", str(recall_run), "--recall", "unifedrec", "--json",
                 "--quota-noise", "1.0", "--no-progress"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["quotas_in_clear"] is False
    # every slot released (M = 5 channels of 2δB/λ_I = 4) + quotas 2/λ_q = 2
    assert result["query_epsilon_max"] == pytest.approx(5 * 4.0 + 2.0)


def test_baselines_on_a_ranking_run_and_clear_errors(ranker: Path, recall_run: Path,
                                                     capsys) -> None:
    capsys.readouterr()
    assert main(["evaluate", "--run", str(ranker), "--recall", "youtubenet", "--json",
                 "--no-progress"]) == 0
    youtube = json.loads(capsys.readouterr().out)
    assert math.isinf(youtube["query_epsilon_max"]) and youtube["bytes_per_query"] == 64.0
    assert main(["evaluate", "--run", str(ranker), "--recall", "vdp", "--epsilon-serve", "5",
                 "--json", "--no-progress"]) == 0
    vdp = json.loads(capsys.readouterr().out)
    assert vdp["query_epsilon_max"] == pytest.approx(5.0)
    assert main(["evaluate", "--run", str(ranker), "--recall", "unifedrec",
                 "--no-progress"]) == 2
    assert "needs a Uni-FedRec run" in capsys.readouterr().err
    assert main(["evaluate", "--run", str(ranker), "--recall", "privaterec",
                 "--no-progress"]) == 2
    assert "basic vectors" in capsys.readouterr().err
    assert main(["evaluate", "--run", str(recall_run), "--recall", "youtubenet",
                 "--serving", "vdp", "--no-progress"]) == 2
    assert "--serving does not apply" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--model", "nrms"], "--model do not apply"),
    (["--epsilon-train", "1"], "--epsilon-train does not apply to unifedrec (its settings: "
                                "--gradient-clipping, --clip, --noise-scale)"),
    (["--strategy", "fedavg"], "sgd or fedadam"),
])
def test_train_flags_that_do_not_apply_are_refused(ranker: Path, tmp_path: Path, capsys,
                                                   argv: list[str], message: str) -> None:
    assert main(["train", "--method", "unifedrec", "--ranker", str(ranker), *argv, "--out",
                 str(tmp_path / "r")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_train_without_ranker_and_ranker_without_unifedrec(tmp_path: Path, capsys) -> None:
    assert main(["train", "--method", "unifedrec", "--out", str(tmp_path / "r")]) == 2
    assert "--ranker" in capsys.readouterr().err
    assert main(["train", "--method", "fedrec", "--ranker", "X", "--data", str(tmp_path),
                 "--out", str(tmp_path / "r")]) == 2
    assert "--ranker only applies" in capsys.readouterr().err


def test_no_bie_ablation_is_trained_and_evaluated_as_such(ranker: Path, tmp_path: Path,
                                                         capsys) -> None:
    from privaterec.runs.recall import evaluate_recall_run, train_recall_run

    config = RecallRunConfig(ranker=str(ranker), model=RecallModelConfig(num_basis=4, bie=False),
                             fed=recall_fed_config(rounds=2, clients_per_round=4))
    train_recall_run(config, tmp_path / "nobie", progress=False)
    run = load_recall_run(tmp_path / "nobie")
    assert run.model.use_bie is False
    result = evaluate_recall_run(tmp_path / "nobie", method="no-bie", progress=False)
    assert result["bytes_per_query"] == pytest.approx(4 * result["channels_mean"] * 17)
    with pytest.raises(ConfigError, match="no-BIE"):
        evaluate_recall_run(tmp_path / "nobie", method="unifedrec", progress=False)


def test_config_yaml_round_trip_and_validation(tmp_path: Path) -> None:
    config = RecallRunConfig(ranker="R", seed=3,
                             model=RecallModelConfig(num_basis=7, noise_scale=0.5),
                             fed=FedConfig(rounds=4, strategy="fedadam"))
    path = tmp_path / "recall.yaml"
    config.to_yaml(path)
    assert RecallRunConfig.from_yaml(path) == config
    assert "\n  settings:\n    clipping: l1\n    clip: 0.1\n" in path.read_text()
    assert config.resolved().fed.server_lr == 0.05 and config.fed.server_lr is None
    path.write_text("ranker: R\nfed:\n  strategy: fedavg\n")
    with pytest.raises(ConfigError, match="strategy.*'sgd' or 'fedadam'"):
        RecallRunConfig.from_yaml(path)
    path.write_text("ranker: R\nfed:\n  settings:\n    padding_p: 0.5\n")
    with pytest.raises(ConfigError, match="padding_p.*does not apply"):
        RecallRunConfig.from_yaml(path)
    path.write_text("ranker: R\ntrain:\n  clipping: none\n")  # now fed.settings.clipping
    with pytest.raises(ConfigError, match="unknown configuration key.*train.clipping"):
        RecallRunConfig.from_yaml(path)
    path.write_text("ranker: R\nmodel:\n  basis: 3\n")
    with pytest.raises(ConfigError, match="unknown configuration key.*model.basis"):
        RecallRunConfig.from_yaml(path)
    with pytest.raises(ConfigError, match="clip"):
        RecallModelConfig(clip=0.0)
    with pytest.raises(ConfigError, match="--ranker"):
        RecallRunConfig(ranker="")


def test_query_bytes() -> None:
    assert query_bytes("unifedrec", channels=2, num_basis=30, dim=128) == 4 * 2 * 31
    assert query_bytes("privaterec", channels=1, num_basis=5, dim=128) == 20
    assert query_bytes("vdp", channels=1, num_basis=0, dim=128) == 512
    assert query_bytes("no-bie", channels=3, num_basis=30, dim=128) == 4 * 3 * 129
