"""End-to-end tests of the command line on small synthetic data (no downloads)."""

import json
from pathlib import Path

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


def test_the_cli_resolves_the_demo_directory_from_the_environment(tmp_path, monkeypatch):
    from privaterec.cli import default_demo_root

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_demo_root() == tmp_path / "privaterec" / "demo"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_demo_root() == Path.home() / ".cache" / "privaterec" / "demo"


def test_demo_quick_prints_a_results_table(tmp_path, capsys):
    from privaterec.experiments.demo_summary import demo_conclusion, parse_demo_output

    assert main(["demo", "--quick", "--out", str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "| popularity |" in out and "| centralized / nrms |" in out
    # the demo ends with closing lines computed from its printed tables
    rows, recall, facts, conclusion = parse_demo_output(out)
    assert out.rstrip().splitlines()[-len(conclusion):] == conclusion
    assert conclusion == demo_conclusion(rows, recall, facts)
    assert facts.runs == str((tmp_path / "runs").resolve())
    assert {r.name for r in recall} == {"unifedrec", "youtubenet"}
    # one definition of bytes per query: 4-byte floats sent (PrivateRec B = 5, VDP d = 128)
    by_name = {r.name: r for r in rows}
    assert by_name["privaterec eps_t=10 / nrms → privaterec serving"].bytes_per_query == 20
    assert by_name["fedrec / nrms → vdp serving"].bytes_per_query == 512
    # a central-DP row, with its whole-run ε and its noise explained in a footnote
    central = [r for r in rows if r.name.startswith("dp-fedavg (central)")]
    assert len(central) == 1 and central[0].epsilon_user <= 8.0
    assert central[0].name in facts.central_noise_ratio and "- Central DP (" in out
    assert "B = 5 floats = 20 bytes per query" in out
    assert by_name["popularity"].epsilon_round == float("inf")  # ∞, the same as the README
    # ε per user at both adjacencies, in every row; the local-ranking row carries its run's
    # training only (ε_s = 0), not the DPA evaluation's queries
    assert all(r.epsilon_user_level is not None for r in rows)
    assert central[0].epsilon_user_level == central[0].epsilon_user
    base = by_name["privaterec eps_t=10 / nrms"]
    local = next(r for r in rows if "→ local ranking" in r.name)
    dpa = by_name["privaterec eps_t=10 / nrms → privaterec serving"]
    assert local.epsilon_query == 0 and local.epsilon_user == base.epsilon_user
    assert dpa.epsilon_user > base.epsilon_user


def test_privaterec_train_report_and_private_serving(synth_dir, tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_MODEL)
    run = tmp_path / "pr"
    assert main(["train", "--data", str(synth_dir), "--method", "privaterec", "--config",
                 str(config), "--privacy-mode", "paper",
                 "--epsilon-train", "5", "--padding-p", "0.3", "--basis", "4",
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
      "OUT"], "--padding-p does not apply to dp-fedrec"),
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


# --- what a new user meets ------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["train", "--data", "d", "--method", "privaterec", "--basis", "0", "--out", "o"],
    ["train", "--data", "d", "--method", "privaterec", "--basis", "1", "--out", "o"],
    ["train", "--data", "d", "--method", "privaterec", "--basis", "-1", "--out", "o"],
    ["privacy", "calibrate", "--mechanism", "dpa", "--epsilon", "1", "--basis", "1"],
])
def test_basis_below_two_is_refused_everywhere_with_one_rule(argv, capsys):
    # --basis 0 must not silently train with B = 5, nor --basis 1 be accepted
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--basis" in err and "integer >= 2" in err and "default, 5" in err


def test_basis_rule_in_the_configuration():
    from privaterec.config import ModelConfig
    from privaterec.errors import ConfigError

    assert ModelConfig(basis_size=0).basis_size == 0  # unset: privaterec uses 5
    assert ModelConfig(basis_size=2).basis_size == 2
    with pytest.raises(ConfigError, match="basis_size.*integer >= 2"):
        ModelConfig(basis_size=1)


def test_failed_train_creates_nothing_and_refusals_name_the_keys(synth_dir, tmp_path, capsys):
    # a train that fails on a missing --data leaves no config.yaml behind
    run = tmp_path / "r"
    assert main(["train", "--data", str(tmp_path / "missing"), "--method", "popularity",
                 "--out", str(run), "--no-progress"]) == 2
    assert "missing" in capsys.readouterr().err
    assert not run.exists()
    assert main(["train", "--data", str(synth_dir), "--method", "popularity", "--out",
                 str(run), "--no-progress"]) == 0
    # a different configuration in the same --out: the message names what differs
    assert main(["train", "--data", str(synth_dir), "--method", "popularity", "--seed", "7",
                 "--out", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "different configuration" in err and "train.seed: 0 in the run, 7 now" in err


def test_evaluate_an_untrained_run_says_so(tmp_path, capsys):
    from privaterec.config import RunConfig, TrainConfig
    from privaterec.runs.directory import RunDirectory

    run = tmp_path / "r"
    RunDirectory(run).start(RunConfig(data=str(tmp_path / "gone"),
                                      train=TrainConfig(method="centralized")))
    assert main(["evaluate", "--run", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "no trained model yet" in err and "checkpoint.pt" in err


def _write_behaviors(directory, bad_lines: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "news.tsv").write_text("N1\tcat\tsub\ttitle\tabstract\turl\t[]\t[]\n")
    rows = ["1\tU1\t11/11/2019 9:00:00 AM\t\tN1-1"]
    rows += [f"{i}\tU1\tnot-a-time\t\tN1-1" for i in range(2, 2 + bad_lines)]
    (directory / "behaviors.tsv").write_text("\n".join(rows) + "\n")


def test_data_check_reports_every_bad_line(tmp_path, capsys):
    # every bad line is reported, not only the first (2)
    _write_behaviors(tmp_path / "a", 3)
    assert main(["data", "check", str(tmp_path / "a"), "--json"]) == 1
    errors = json.loads(capsys.readouterr().out)["errors"]
    assert [e.split(": ")[0].rsplit(":", 1)[1] for e in errors] == ["2", "3", "4"]
    _write_behaviors(tmp_path / "b", 25)
    assert main(["data", "check", str(tmp_path / "b"), "--json"]) == 1
    errors = json.loads(capsys.readouterr().out)["errors"]
    assert len(errors) == 21 and "... and 5 more bad lines (25 in all)" in errors[-1]


def test_data_check_of_a_missing_path_is_a_user_error(tmp_path, capsys):
    # a user error exits 2, as the README promises (not 1, "INVALID")
    assert main(["data", "check", str(tmp_path / "nope")]) == 2
    assert "nope: does not exist" in capsys.readouterr().err


def test_privacy_report_of_an_unfinished_federated_run(tmp_path, capsys):
    # a privaterec run before its first checkpoint is not "centralized"
    from privaterec.config import FedConfig, RunConfig, TrainConfig
    from privaterec.runs.directory import RunDirectory

    run = tmp_path / "pr"
    RunDirectory(run).start(RunConfig(data=str(tmp_path), train=TrainConfig(method="privaterec"),
                                      fed=FedConfig(rounds=5)))
    assert main(["privacy", "report", "--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert "no round of this privaterec run has been checkpointed yet" in err
    assert "centralized" not in err
    central = tmp_path / "c"
    RunDirectory(central).start(RunConfig(data=str(tmp_path),
                                          train=TrainConfig(method="centralized")))
    assert main(["privacy", "report", "--run", str(central)]) == 2
    assert "centralized run has no privacy report" in capsys.readouterr().err


def _subparsers(parser):
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                yield from ((f"{name} {n}", s) for n, s in _subparsers(sub))


def test_train_evaluate_demo_flags_all_have_help_and_defaults(capsys):
    # every flag of train, evaluate and demo has help text and shows its default
    from privaterec.cli import build_parser

    parsers = dict(_subparsers(build_parser()))
    for name in ("train", "evaluate", "demo", "data check"):
        missing = [a.dest for a in parsers[name]._actions if not a.help]
        assert not missing, f"{name}: flags without help: {missing}"
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, default in (("--method", "centralized"), ("--model", "nrms"),
                          ("--epochs", "3"), ("--lr", "0.005"), ("--batch-size", "32")):
        assert f"(default {default})" in text.split(flag, 2)[2].split(" --", 1)[0], flag
    assert "dp-fedrec, privaterec, dp-fedavg; unset" in text
    assert "--epsilon-train EPSILON_TRAIN dp-fedrec, privaterec:" in text


@pytest.mark.parametrize("extra,message", [
    (["--adaptive-clip-quantile", "1.5"], "adaptive_clip_quantile"),
    (["--clip-lr", "0.1"], "--adaptive-clip-quantile"),
    (["--adaptive-clip-quantile", "0.5", "--clip-count-stddev", "0.4"], "--clip-count-stddev"),
    (["--adaptive-clip-quantile", "0.5", "--engine", "flower"], "--adaptive-clip-quantile"),
])
def test_adaptive_clipping_user_errors_exit_2(extra, message, synth_dir, tmp_path, capsys):
    argv = ["train", "--data", str(synth_dir), "--method", "dp-fedavg", "--noise-multiplier",
            "1", "--client-fraction", "0.2", "--rounds", "1", "--out", str(tmp_path / "o"),
            "--no-progress", *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_adaptive_clipping_logs_the_clip_and_reports_the_split(synth_dir, tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_MODEL)
    run = tmp_path / "a"
    # q = 1 keeps the accounting cheap (the subsampled PLD under replacement takes seconds)
    assert main(["train", "--data", str(synth_dir), "--config", str(config), "--method",
                 "dp-fedavg", "--noise-multiplier", "1", "--client-fraction", "1",
                 "--rounds", "2", "--adaptive-clip-quantile", "0.5", "--out", str(run),
                 "--no-progress"]) == 0
    rounds = json.loads((run / "metrics.json").read_text())["rounds"]
    assert rounds[0]["clip"] == 0.1 and rounds[1]["clip"] != 0.1  # the clip per round
    assert 0 <= rounds[0]["unclipped_fraction"] <= 1
    capsys.readouterr()
    assert main(["privacy", "report", "--run", str(run)]) == 0
    out = capsys.readouterr().out
    assert "adaptive_clipping: update_noise_multiplier" in out and "clip indicator" in out


def test_basis_line_warns_only_on_a_collapsed_attention():
    import torch

    from privaterec.cli import _basis_line
    from privaterec.models.basis import attention_diagnostics

    n, b = 20, 5
    same = torch.zeros(n, b)
    same[:, 3] = 1.0
    user = torch.randn(n, 8)
    collapsed = attention_diagnostics(same, user, user).to_dict()
    line = _basis_line(collapsed)
    assert "100% on basis vector 3" in line and "WARNING" in line and "COLLAPSED" in line
    diverse = torch.eye(b).repeat(n // b, 1)
    healthy = _basis_line(attention_diagnostics(diverse, user, user).to_dict())
    assert "WARNING" not in healthy and "spread 0.800" in healthy


# --- every method setting is a flag ---------------------------------------------------------
def _candidates(kind, f):
    """Values of the setting ``f`` of ``kind`` other than its default, as flag text."""
    from privaterec.method_settings import setting_flags

    (flag,) = [g for g in setting_flags() if g.dest == f.name and kind.method in g.methods]
    values = flag.choices or ((1, 2) if flag.type is int else (0.25, 0.5, 2.0, 1e-3))
    return flag.flags[0], [v for v in values if v != f.default]


def _example(kind, name):
    """A valid settings object of ``kind`` whose ``name`` is not its default, with up to two
    more settings changed where it needs them (e.g. dp-fedavg's clip_lr needs adaptive
    clipping and a noise), and the flags that give it."""
    import dataclasses
    import itertools

    from privaterec.errors import ConfigError

    names = [f.name for f in dataclasses.fields(kind)]
    options = {g: _candidates(kind, f) for g, f in zip(names, dataclasses.fields(kind))}
    others = [g for g in names if g != name]
    for size in range(3):
        for extra in itertools.combinations(others, size):
            keys = (name, *extra)
            for values in itertools.product(*(options[g][1] for g in keys)):
                try:
                    settings = kind(**dict(zip(keys, values)))
                except ConfigError:
                    continue
                return settings, [text for g, value in zip(keys, values)
                                  for text in (options[g][0], str(value))]
    raise AssertionError(f"no valid value of {kind.method}'s {name!r} other than its default")


def test_every_method_setting_is_a_flag_and_round_trips_through_config_yaml(tmp_path):
    # a method's settings are declared once (privaterec.method_settings): each field is a
    # flag of `train`, reaches the run's configuration and is saved under its name
    import dataclasses

    import yaml

    from privaterec.cli import build_parser, recall_config_from_args, run_config_from_args
    from privaterec.config import RunConfig
    from privaterec.method_settings import SETTINGS
    from privaterec.runs.recall import RecallRunConfig

    checked, parser = 0, build_parser()
    for method, kind in SETTINGS.items():
        for f in dataclasses.fields(kind):
            expected, flags = _example(kind, f.name)
            argv = ["train", "--data", str(tmp_path), "--out", "o", "--method", method, *flags]
            if kind.task == "recall":
                args = parser.parse_args([*argv, "--ranker", str(tmp_path)])
                config, loader = recall_config_from_args(args), RecallRunConfig.from_yaml
            else:
                args = parser.parse_args(argv)
                config, loader = run_config_from_args(args), RunConfig.from_yaml
            assert config.fed.settings == expected, (method, flags)
            path = tmp_path / f"{method}-{f.name}.yaml"
            config.to_yaml(path)
            saved = yaml.safe_load(path.read_text())["fed"]["settings"]
            assert saved[f.name] == getattr(expected, f.name), (method, f.name)
            assert loader(path) == config, (method, f.name)
            checked += 1
    assert checked == sum(len(dataclasses.fields(kind)) for kind in SETTINGS.values()) > 20


def test_a_flag_of_another_method_is_refused_naming_it(tmp_path, capsys):
    # --gradient-clipping is Uni-FedRec's: a ranking method refuses it by its flag
    assert main(["train", "--data", str(tmp_path), "--out", str(tmp_path / "o"), "--method",
                 "dp-fedrec", "--gradient-clipping", "none"]) == 2
    assert "--gradient-clipping does not apply to dp-fedrec" in capsys.readouterr().err
    # and Uni-FedRec refuses a ranking model's flag by its flag (--model sets news_encoder)
    assert main(["train", "--data", str(tmp_path), "--out", str(tmp_path / "o"), "--method",
                 "unifedrec", "--ranker", str(tmp_path), "--model", "naml"]) == 2
    assert "--model do not apply to --method unifedrec" in capsys.readouterr().err


def test_every_engine_flag_reaches_the_fed_config(tmp_path):
    # the engine's flags are generated from FedConfig's settings too
    import dataclasses

    from privaterec.cli import build_parser, run_config_from_args
    from privaterec.config import FedConfig
    from privaterec.method_settings import setting_flags

    parser, flags = build_parser(), setting_flags((FedConfig,))
    assert {f.dest for f in flags} >= {"rounds", "client_fraction", "strategy", "engine"}
    defaults = FedConfig()
    for flag in flags:
        values = flag.choices or ((1, 2) if flag.type is int else (0.25, 0.5))
        value = next(v for v in values if v != getattr(defaults, flag.dest))
        args = parser.parse_args(["train", "--data", str(tmp_path), "--out", "o", "--method",
                                  "fedrec", flag.flags[0], str(value)])
        fed = run_config_from_args(args).fed
        assert getattr(fed, flag.dest) == value, flag.flags
        assert dataclasses.replace(fed, **{flag.dest: getattr(defaults, flag.dest)}) == \
            dataclasses.replace(defaults, settings=fed.settings), flag.flags


def test_every_recall_model_flag_reaches_the_recall_configuration(tmp_path):
    # Uni-FedRec's model and training flags are generated from RecallModelConfig's and
    # RecallTrainConfig's settings, each stored under its flag's name (--interest-clip is the
    # model's clip, --clip the upload's)
    from privaterec.cli import build_parser, recall_config_from_args
    from privaterec.method_settings import setting_flags
    from privaterec.recall.task import RecallTrainConfig
    from privaterec.runs.recall_setup import RecallModelConfig

    values = {"--recall-basis": 7, "--max-channels": 3, "--distance-threshold": 0.5,
              "--cluster-method": "single", "--cluster-metric": "euclidean",
              "--interest-clip": 0.3, "--interest-noise": 0.5}
    flags = setting_flags((RecallModelConfig, RecallTrainConfig))
    assert {f.flags[0] for f in flags} == {*values, "--score-clip"}
    args = build_parser().parse_args(
        ["train", "--method", "unifedrec", "--ranker", str(tmp_path), "--out", "o", "--clip",
         "0.2", "--no-score-clip", *(str(x) for item in values.items() for x in item)])
    config = recall_config_from_args(args)
    model = {f.flags[0]: getattr(config.model, f.dest) for f in flags if f.type is not bool}
    assert model == values and config.train.score_clip is False
    assert config.fed.settings.clip == 0.2 and RecallModelConfig().clip != 0.3
