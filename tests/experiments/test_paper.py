"""Tables 1-2 (privaterec.experiments.paper) and the shared helpers (experiments.common)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

import privaterec.experiments.common as common
import privaterec.runs.ranking as pipeline
from privaterec.cli import main
from privaterec.config import ModelConfig, RunConfig, TrainConfig, fed_config
from privaterec.errors import ConfigError
from privaterec.experiments.common import (RunSpec, Summary, check_models, check_seeds,
                                           ensure_run, finished_metrics, format_summary,
                                           markdown_table, model_label, parse_model, run_dir,
                                           serve_run, summarize, write_csv)
from privaterec.experiments.paper import TABLE1_ROWS, TABLE2_ROWS, run_table1, run_table2
from privaterec.fed.methods import resolve_run_config
from privaterec.ondevice.release import ServingConfig
from privaterec.privacy.report import read_privacy_json


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


# --- aggregation and formatting -------------------------------------------------------------

def test_summarize_mean_and_sample_std() -> None:
    s = summarize([0.5, 0.6, 0.7])
    assert s.mean == pytest.approx(0.6)
    assert s.std == pytest.approx(0.1)  # ddof = 1: sqrt((0.01 + 0 + 0.01) / 2)
    assert s.n == 3 and s.values == (0.5, 0.6, 0.7)
    two = summarize([1.0, 4.0])
    assert two.std == pytest.approx(math.sqrt(4.5))  # population std would be 1.5


def test_summarize_single_value_has_no_std_and_empty_raises() -> None:
    s = summarize([0.61])
    assert (s.mean, s.std, s.n) == (0.61, None, 1)
    with pytest.raises(ValueError):
        summarize([])


def test_format_summary_scales_and_rounds() -> None:
    assert format_summary(Summary(0.61374, 0.00221, 3, ())) == "61.37 ± 0.22"
    assert format_summary(Summary(0.61374, None, 1, ())) == "61.37"
    assert format_summary(Summary(0.5, 0.01, 2, ()), scale=1.0, digits=4) == "0.5000 ± 0.0100"


def test_markdown_table_exact_and_validated() -> None:
    text = markdown_table(["a", "b"], [[1, "x|y"], ["2", 3.5]])
    assert text == "| a | b |\n|---|---|\n| 1 | x\\|y |\n| 2 | 3.5 |"
    with pytest.raises(ValueError, match="2 cells"):
        markdown_table(["a"], [[1, 2]])


def test_write_csv_round_trip(tmp_path: Path) -> None:
    rows = [{"name": "r1", "eps": math.inf, "std": None, "value": 0.1 + 0.2, "seeds": [0, 1]},
            {"name": "r2", "eps": 10.0, "value": 1e-17}]
    path = write_csv(tmp_path / "sub" / "t.csv", rows, ["name", "eps", "std", "value", "seeds"])
    back = read_csv(path)
    assert back[0] == {"name": "r1", "eps": "inf", "std": "", "value": repr(0.1 + 0.2),
                       "seeds": "0 1"}
    assert float(back[0]["value"]) == 0.1 + 0.2  # exact round trip
    assert float(back[0]["eps"]) == math.inf
    assert back[1] == {"name": "r2", "eps": "10.0", "std": "", "value": "1e-17", "seeds": ""}
    with pytest.raises(ValueError, match="not in the header"):
        write_csv(tmp_path / "bad.csv", [{"x": 1}], ["y"])


# --- run specs and the run cache ------------------------------------------------------------

def test_experiment_methods_come_from_the_method_registry() -> None:
    # centralized and every federated ranking method (method_settings.SETTINGS); a budget
    # epsilon_train for the methods whose settings have one
    from privaterec.method_settings import RANKING_METHODS

    assert common.EXPERIMENT_METHODS == ("centralized", *RANKING_METHODS)
    assert common._EPSILON_TRAIN_METHODS == ("dp-fedrec", "privaterec")
    with pytest.raises(ConfigError, match="epsilon_train applies to dp-fedrec and privaterec"):
        RunSpec("fedrec", 1.0)


def test_run_cache_layout(tmp_path: Path) -> None:
    assert run_dir(tmp_path, "nrms", RunSpec("dp-fedrec", 10.0), 2, quick=False) == \
        tmp_path / "runs" / "nrms" / "dp-fedrec_eps-10" / "seed2"
    assert run_dir(tmp_path, "plm", RunSpec("centralized"), 0, quick=True) == \
        tmp_path / "runs-quick" / "plm" / "centralized" / "seed0"
    assert RunSpec("dp-fedrec").slug == "dp-fedrec_eps-inf"
    assert RunSpec("privaterec", 10.0).slug == "privaterec_eps-10_paper_B5"
    assert RunSpec("privaterec", 10.0, basis_size=5).slug == "privaterec_eps-10_paper_B5"
    assert RunSpec("privaterec", 0.5, "strict", basis_size=3).slug == \
        "privaterec_eps-0.5_strict_B3"
    slugs = [spec.slug for spec in TABLE1_ROWS]
    assert len(set(slugs)) == len(slugs) == 5
    # Table 2 serves Table 1's runs: same cache entries.
    assert {row.run.slug for row in TABLE2_ROWS} <= set(slugs)


def test_run_spec_configs_follow_the_budget_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "ROUNDS", 7)
    monkeypatch.setattr(common, "EPOCHS", 2)
    monkeypatch.setattr(common, "QUICK_ROUNDS", 3)
    central = RunSpec("centralized").run_config(data="/d", model="naml", seed=4, quick=False)
    assert central.train == TrainConfig(method="centralized", epochs=2, seed=4)
    assert central.model.news_encoder == "naml" and central.model.basis_size == 0
    strict = RunSpec("privaterec", 10.0, "strict").run_config(data="/d", model="nrms", seed=1,
                                                               quick=True)
    assert strict.fed.rounds == 3 and strict.fed.settings.epsilon_train == 10.0
    assert strict.fed.settings.privacy_mode == "strict" and strict.model.basis_size == 5
    assert strict.train.method == "privaterec" and strict.train.seed == 1
    dp = RunSpec("dp-fedrec", 1.0).run_config(data="/d", model="nrms", seed=0, quick=False)
    assert dp.fed.rounds == 7 and dp.fed.settings.epsilon_train == 1.0


def test_run_spec_and_argument_validation() -> None:
    with pytest.raises(ConfigError, match="experiment method"):
        RunSpec("popularity")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="privaterec only"):
        RunSpec("dp-fedrec", 10.0, basis_size=3)
    with pytest.raises(ConfigError, match="epsilon_train"):
        RunSpec("dp-fedrec", 0.0)
    assert check_seeds([2, 0]) == (2, 0)
    for bad in ([], [0, 0], [-1], [True]):
        with pytest.raises(ConfigError, match="'seeds'"):
            check_seeds(bad)
    assert check_models(["nrms", "plm"]) == ("nrms", "plm")
    assert check_models(["nrms", "nrms+corpus"]) == ("nrms", "nrms+corpus")
    for bad_models in ([], ["nrms", "nrms"], ["bert"], ["nrms+word2vec"], ["bert+corpus"],
                       ["nrms+"], ["nrms+random"], ["plm+corpus"], ["id+corpus"]):
        with pytest.raises(ConfigError, match="'models'"):
            check_models(bad_models)


def test_a_model_variant_names_its_word_vectors() -> None:
    assert parse_model("naml") == ("naml", None)
    assert parse_model("nrms+corpus") == ("nrms", "corpus")
    assert model_label("nrms") == "NRMS"
    assert model_label("nrms+corpus") == "NRMS + corpus word vectors"
    plain = RunSpec("fedrec").run_config(data="d", model="nrms", seed=0, quick=True)
    variant = RunSpec("fedrec").run_config(data="d", model="nrms+corpus", seed=0, quick=True)
    assert plain.model.embeddings == "random" and variant.model.embeddings == "corpus"
    assert variant.model.news_encoder == "nrms"
    assert run_dir(Path("o"), "nrms+corpus", RunSpec("fedrec"), 0, quick=True) != \
        run_dir(Path("o"), "nrms", RunSpec("fedrec"), 0, quick=True)


def _fake_finished_run(path: Path, config: RunConfig, auc: float) -> None:
    path.mkdir(parents=True)
    resolve_run_config(config).to_yaml(path / "config.yaml")
    (path / "checkpoint.pt").write_bytes(b"x")
    (path / "metrics.json").write_text(json.dumps({"test": {"auc": auc}}))


def test_finished_run_is_reused_without_training(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    config = RunConfig(data="/data", model=ModelConfig(), train=TrainConfig(method="dp-fedrec"),
                       fed=fed_config("dp-fedrec", rounds=3, epsilon_train=10.0))
    path = tmp_path / "run"
    assert finished_metrics(path, config) is None
    _fake_finished_run(path, config, 0.625)

    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("train_run must not be called for a finished run")

    monkeypatch.setattr(pipeline, "train_run", no_training)
    assert ensure_run(path, config, progress=False)["test"]["auc"] == 0.625
    other = RunConfig(data="/data", model=ModelConfig(), train=TrainConfig(method="dp-fedrec"),
                      fed=fed_config("dp-fedrec", rounds=4, epsilon_train=10.0))
    assert finished_metrics(path, other) is None
    (path / "metrics.json").write_text(json.dumps({"train_seconds": 1.0}))  # unfinished
    assert finished_metrics(path, config) is None


def test_serving_evaluations_are_cached_per_checkpoint(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run"
    path.mkdir()
    (path / "checkpoint.pt").write_bytes(b"v1")
    calls: list[ServingConfig] = []

    def fake_evaluate(run: Path, *, progress: bool, serving: ServingConfig) -> dict:
        calls.append(serving)
        return {"auc": 0.5 + len(calls) / 100, "serving": {"bytes_per_query": 20}}

    monkeypatch.setattr(pipeline, "evaluate_run", fake_evaluate)
    serving = ServingConfig(kind="privaterec", epsilon=10.0, seed=1)
    first = serve_run(path, serving, progress=False)
    assert serve_run(path, serving, progress=False) == first and len(calls) == 1
    serve_run(path, ServingConfig(kind="privaterec", epsilon=10.0, seed=2), progress=False)
    serve_run(path, ServingConfig(kind="vdp", epsilon=10.0, seed=1), progress=False)
    assert len(calls) == 3
    (path / "checkpoint.pt").write_bytes(b"retrained")  # a new checkpoint invalidates
    assert serve_run(path, serving, progress=False)["auc"] == pytest.approx(0.54)
    assert len(calls) == 4


# --- end to end on a tiny data set ----------------------------------------------------------

def test_tables_end_to_end(tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(common, "QUICK_ROUNDS", 1)
    monkeypatch.setattr(common, "QUICK_EPOCHS", 1)
    out = tmp_path / "out"
    t1 = run_table1(out, data=str(tiny_data), models=("nrms",), seeds=(0,), quick=True,
                    progress=False)
    assert capsys.readouterr().out == ""  # experiments return their tables; the CLI prints
    assert "Table 1" in t1["table"] and "PrivateRec (strict mode)" in t1["table"]
    assert (out / "table1.md").read_text().strip() == t1["table"].strip()
    rows = read_csv(out / "table1.csv")
    assert [r["row"] for r in rows] == [spec.slug for spec in TABLE1_ROWS]
    for row, spec in zip(rows, TABLE1_ROWS):
        metrics = json.loads((run_dir(out, "nrms", spec, 0, quick=True)
                              / "metrics.json").read_text())
        assert float(row["auc_mean"]) == metrics["test"]["auc"]  # numbers from the runs
        assert row["auc_std"] == "" and row["n_seeds"] == "1"
    table_rows = [line for line in t1["table"].splitlines() if line.startswith("| NRMS")]
    assert len(table_rows) == 5 and not any("±" in line for line in table_rows)  # n = 1
    assert len(read_csv(out / "table1_runs.csv")) == 5

    t2 = run_table2(out, data=str(tiny_data), models=("nrms",), seeds=(0,), quick=True,
                    progress=False)
    assert capsys.readouterr().out == "" and "Table 2" in t2["table"]
    rows2 = read_csv(out / "table2.csv")
    assert [(r["row"], r["serving"]) for r in rows2] == \
        [(r.run.slug, r.serving) for r in TABLE2_ROWS]
    # 4 bytes per float: d = 8 heads x 16 = 128 floats for VDP, B = 5 for PrivateRec; local
    # ranking sends nothing and downloads the pool's B x N score matrix instead.
    assert [r["bytes_per_query"] for r in rows2[:3]] == ["512", "512", "20"]
    assert [r["bytes_per_query"] for r in t2["rows"]] == [512, 512, 20, 0]
    assert rows2[3]["bytes_per_query"].startswith("0 (↓ ") and rows2[3]["epsilon_serve"] == "0.0"
    # local ranking (ε_s = 0) has exactly the metrics of the same run served without noise
    assert rows2[3]["auc_mean"] == rows[TABLE1_ROWS.index(TABLE2_ROWS[3].run)]["auc_mean"]
    private = run_dir(out, "nrms", TABLE2_ROWS[2].run, 0, quick=True)
    ledger = (private / "privacy.json").read_bytes()
    assert "serving" not in json.loads(ledger)["release"]  # simulated: kept apart
    records = sorted((private / "serving-evaluations").glob("*.json"))
    served = [read_privacy_json(r)["release"]["serving"] for r in records]
    assert sorted((s[0]["kind"], s[0]["epsilon"]) for s in served) == \
        [("local", float("inf")), ("privaterec", 10.0)]

    again = run_table2(out, data=str(tiny_data), models=("nrms",), seeds=(0,), quick=True,
                       progress=False)
    assert again["rows"] == t2["rows"]
    assert (private / "privacy.json").read_bytes() == ledger  # not recorded twice
    # the CLI prints the table the experiment returns (every run and evaluation cached here)
    assert main(["experiment", "table2", "--out", str(out), "--data", str(tiny_data),
                 "--models", "nrms", "--seeds", "0", "--quick", "--no-progress"]) == 0
    assert capsys.readouterr().out == t2["table"] + "\n"
    assert (private / "privacy.json").read_bytes() == ledger
