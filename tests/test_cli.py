"""End-to-end tests of the command line on small synthetic data (no downloads)."""

import json

import pytest

from privaterec.cli import main

TINY_MODEL = """\
model:
  word_dim: 16
  num_heads: 2
  head_dim: 8
  attention_dim: 16
  cnn_filters: 16
  gru_dim: 16
  history_len: 20
train:
  epochs: 1
  batch_size: 64
"""


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    assert main(["data", "synth", "--out", str(out), "--users", "150", "--news", "500",
                 "--seed", "3"]) == 0
    return out


def test_data_check_valid_json(synth_dir, capsys):
    assert main(["data", "check", str(synth_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is True
    assert report["train"]["users"] > 0 and report["test"]["impressions"] > 0


def test_data_check_invalid_exits_1(tmp_path, capsys):
    (tmp_path / "news.tsv").write_text("N1\tcat\tsub\ttitle\tabstract\turl\t[]\t[]\n")
    (tmp_path / "behaviors.tsv").write_text("1\tU1\tnot-a-time\t\tN1-1\n")
    assert main(["data", "check", str(tmp_path)]) == 1
    assert "behaviors.tsv:1" in capsys.readouterr().out


def test_train_evaluate_round_trip_and_determinism(synth_dir, tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_MODEL)
    runs = []
    for name in ("a", "b"):
        run = tmp_path / name
        assert main(["train", "--data", str(synth_dir), "--method", "centralized",
                     "--model", "nrms", "--config", str(config), "--out", str(run),
                     "--no-progress", "--seed", "5"]) == 0
        runs.append(run)
    capsys.readouterr()
    assert {p.name for p in runs[0].iterdir()} >= {"config.yaml", "checkpoint.pt",
                                                    "metrics.json", "vocab.json"}
    trained = json.loads((runs[0] / "metrics.json").read_text())["test"]
    assert main(["evaluate", "--run", str(runs[0]), "--data", str(synth_dir), "--json",
                 "--no-progress"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    for key in ("auc", "mrr", "ndcg@5", "ndcg@10", "impressions"):
        assert evaluated[key] == pytest.approx(trained[key], abs=1e-9)
    again = json.loads((runs[1] / "metrics.json").read_text())["test"]
    assert again["auc"] == trained["auc"]  # same seed, same numbers


def test_checkpoint_holds_model_state_dict(synth_dir, tmp_path):
    import torch
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_MODEL)
    run = tmp_path / "r"
    assert main(["train", "--data", str(synth_dir), "--model", "naml", "--config",
                 str(config), "--out", str(run), "--no-progress"]) == 0
    state = torch.load(run / "checkpoint.pt", weights_only=False)
    assert any(k.startswith("news_encoder.") for k in state["model"])


def test_popularity_method(synth_dir, tmp_path, capsys):
    run = tmp_path / "pop"
    assert main(["train", "--data", str(synth_dir), "--method", "popularity", "--out",
                 str(run), "--json", "--no-progress"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert 0.0 <= metrics["test"]["auc"] <= 1.0
    assert 0.0 <= metrics["test"]["cold_candidates_share"] <= 1.0


def test_user_errors_exit_2_with_a_message(tmp_path, capsys):
    assert main(["train", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "nope" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  heads: 3\n")
    assert main(["train", "--data", str(tmp_path), "--config", str(bad), "--out",
                 str(tmp_path / "r")]) == 2
    assert "model.heads" in capsys.readouterr().err


def test_resume_refuses_a_different_configuration(synth_dir, tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_MODEL)
    run = tmp_path / "r"
    args = ["train", "--data", str(synth_dir), "--config", str(config), "--out", str(run),
            "--no-progress"]
    assert main(args) == 0
    assert main(args + ["--lr", "0.5"]) == 2
    assert "different configuration" in capsys.readouterr().err


def test_demo_quick_prints_a_results_table(tmp_path, capsys):
    assert main(["demo", "--quick", "--out", str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "| popularity |" in out and "| centralized / nrms |" in out


def test_privaterec_train_report_and_private_serving(synth_dir, tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_MODEL)
    run = tmp_path / "pr"
    assert main(["train", "--data", str(synth_dir), "--method", "privaterec", "--config",
                 str(config), "--epsilon-train", "5", "--padding-p", "0.3", "--basis", "4",
                 "--rounds", "2", "--clients-per-round", "5", "--out", str(run),
                 "--no-progress"]) == 0
    saved = (run / "config.yaml").read_text()
    assert "basis_size: 4" in saved and "padding_p: 0.3" in saved
    assert "privacy_mode: paper" in saved
    capsys.readouterr()
    assert main(["privacy", "report", "--run", str(run)]) == 0
    report = capsys.readouterr().out
    assert "NOT covered" in report and "user_encoder" in report
    assert main(["evaluate", "--run", str(run), "--serving", "privaterec", "--epsilon-serve",
                 "2", "--json", "--no-progress"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["serving"]["kind"] == "privaterec"
    assert result["serving"]["bytes_per_query"] == 16  # B = 4 floats
    assert result["serving"]["event"]["sensitivity"] == 2.0
    assert main(["evaluate", "--run", str(run), "--serving", "privaterec", "--epsilon-serve",
                 "2", "--normalization", "relu", "--json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["serving"]["normalization"] == "relu"
    assert main(["evaluate", "--run", str(run), "--serving", "vdp", "--epsilon-serve", "2",
                 "--no-progress"]) == 0
    assert "bytes sent per query" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["evaluate", "--run", "RUN", "--epsilon-serve", "1"], "--serving"),
    (["train", "--data", "DATA", "--method", "dp-fedrec", "--padding-p", "0.5", "--out",
      "OUT"], "padding_p"),
    (["train", "--data", "DATA", "--method", "privaterec", "--privacy-mode", "paper",
      "--clip", "0.1", "--out", "OUT"], "strict"),
])
def test_privaterec_user_errors_exit_2(argv, message, synth_dir, tmp_path, capsys):
    argv = [str(synth_dir) if a == "DATA" else str(tmp_path / "o") if a == "OUT"
            else str(tmp_path / "r") if a == "RUN" else a for a in argv]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_train_flags_set_the_plm_depth_and_learning_rate():
    from privaterec.cli import build_parser, run_config_from_args

    args = build_parser().parse_args(["train", "--data", "d", "--out", "o", "--model", "plm",
                                      "--plm-layers", "0", "--plm-lr", "1e-4"])
    config = run_config_from_args(args)
    assert config.model.plm_trainable_layers == 0 and config.train.plm_lr == 1e-4
    defaults = run_config_from_args(build_parser().parse_args(["train", "--data", "d",
                                                               "--out", "o"]))
    assert defaults.model.plm_trainable_layers == 1 and defaults.train.plm_lr == 3e-5
