"""Central against local DP (privaterec.experiments.central_dp, ``experiment central-dp``)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import privaterec.experiments.central_dp as central_dp
import privaterec.experiments.central_dp_rows as central_dp_rows
import privaterec.experiments.common as common
import privaterec.experiments.populations as populations
import privaterec.runs.ranking as pipeline
from privaterec.cli import main
from privaterec.config import replace
from privaterec.data.synth import SynthConfig
from privaterec.errors import ConfigError
from privaterec.experiments.central_dp import run_central_dp
from privaterec.experiments.central_dp_rows import plan_rows
from privaterec.experiments.populations import population_config, population_paths
from privaterec.experiments.run_privacy import LedgerEpsilon, epsilon_cell
from privaterec.experiments.common import RunSpec, run_dir
from privaterec.fed.methods import CentralDP
from privaterec.privacy.central_accounting import central_epsilon
from privaterec.privacy.report import read_privacy_json
from privaterec.runs.directory import RunDirectory
from privaterec.runs.ranking_setup import load_run_model

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = SynthConfig(users=60, news=150, impressions_per_user=2.0, min_history=5, max_history=15,
                   max_candidates=15, seed=0)
ARGS: dict[str, Any] = {"users": (60, 80), "seeds": (0,), "epsilons": (1.0, math.inf),
                        "quick": True, "progress": False}
CLI_ARGS = ["--quick", "--users", "60", "80", "--seeds", "0", "--epsilons", "1", "inf",
            "--no-progress"]
SMALL = ["untrained", "dp-fedavg_eps-1", "fedrec", "dp-fedrec_eps-10", "fednewsrec",
         "privaterec_eps-10_paper_B5", "privaterec_eps-10_strict_B5",
         "dp-fedavg_eps-1_B5+local", "dp-fedavg_eps-1_B5+dpa-10"]


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _tiny(patch: pytest.MonkeyPatch) -> None:
    """A 60-user data set as the quick default, one training round per run, DPA serving at
    ε_s = 10 only (each serving evaluation recomposes the run's ledger)."""
    patch.setattr(populations, "demo_synth_config", lambda quick: TINY)
    patch.setattr(common, "QUICK_ROUNDS", 1)
    patch.setattr(central_dp_rows, "SERVE_EPSILONS", (10.0,))


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("central") / "out"
    with pytest.MonkeyPatch.context() as patch:
        _tiny(patch)
        return out, run_central_dp(out, **ARGS)


def _run(out: Path, users: int, row: dict[str, str]) -> Path:
    root = out if users == 60 else out / f"users-{users}"
    return root / "runs-quick" / "nrms" / row["row"].split("+")[0] / "seed0"


def test_writes_table_csv_and_figure(experiment: tuple[Path, dict[str, Any]]) -> None:
    out, result = experiment
    assert (out / "central_dp.md").read_text().strip() == result["table"].strip()
    assert (out / "central_dp.png").read_bytes()[:8] == PNG_MAGIC
    rows = read_csv(out / "central_dp.csv")
    assert [(r["users"], r["row"]) for r in rows] == \
        [("60", s) for s in SMALL] + [("80", "untrained"), ("80", "dp-fedavg_eps-1"),
                                      ("80", "fedrec")]
    assert len(read_csv(out / "central_dp_runs.csv")) == len(rows)  # one seed each
    # each population has its own data set (the default size shares table1's) and run cache
    assert (out / "data" / "synth-quick" / "test" / "behaviors.tsv").exists()
    assert (out / "data" / "synth-quick-80" / "test" / "behaviors.tsv").exists()
    for row in rows:
        run = _run(out, int(row["users"]), row)
        assert row["n_seeds"] == "1" and row["auc_std"] == ""
        if row["row"] == "untrained":  # its cached evaluation, not a run
            assert float(row["auc_mean"]) == json.loads(
                (run / central_dp.UNTRAINED_FILE).read_text())["test"]["auc"]
            assert not (run / "metrics.json").exists()
        elif row["serving"] == "":  # numbers from the runs
            assert float(row["auc_mean"]) == json.loads(
                (run / "metrics.json").read_text())["test"]["auc"]
    assert RunDirectory(_run(out, 80, rows[-1])).config().data.endswith("synth-quick-80")
    # local ranking sends nothing and ranks exactly: the metrics of the run itself
    local = next(r for r in rows if r["row"].endswith("+local"))
    assert local["epsilon_serve"] == "0.0"
    metrics = json.loads((_run(out, 60, local) / "metrics.json").read_text())["test"]
    assert float(local["auc_mean"]) == pytest.approx(metrics["auc"], abs=1e-12)
    table = result["table"]
    assert "| 60 | NRMS | FedRec (no privacy) |" in table and "q = 0.02" in table
    assert "FedRec and DP-FedAvg only" in table  # the 80-user population has no LDP rows
    assert "| Users | Model | ε = 0 (untrained θ₀) | ε = 1 | ε = ∞ (FedRec) |" in table


def test_untrained_row_is_the_initial_model_of_the_runs(
        experiment: tuple[Path, dict[str, Any]]) -> None:
    """ε = 0: the seeded θ₀ the FedRec run starts from, evaluated without training."""
    out, result = experiment
    by_row = {(r["users"], r["row"]): r for r in result["rows"]}
    untrained, fedrec = by_row[(60, "untrained")], by_row[(60, "fedrec")]
    config = RunDirectory(_run(out, 60, {"row": "fedrec"})).config()
    again = pipeline.evaluate_untrained(config)
    assert untrained["auc_mean"] == again["auc"]
    assert (untrained["epsilon_user_max"], untrained["method"]) == (0.0, "untrained")
    # θ₀ is the run's seeded start: another seed is another model, training changes it
    other = pipeline.evaluate_untrained(replace(config, train=replace(config.train, seed=1)))
    assert other["auc"] != again["auc"] and fedrec["auc_mean"] != untrained["auc_mean"]


def test_user_level_epsilon_is_the_ledger_total(
        experiment: tuple[Path, dict[str, Any]]) -> None:
    out, result = experiment
    rows = read_csv(out / "central_dp.csv")
    for row in rows:
        if row["row"] == "untrained":  # no training, no release
            assert float(row["epsilon_user_max"]) == 0.0
            continue
        report = read_privacy_json(_run(out, int(row["users"]), row))["report"]
        user = report["phases_user"]["train"]
        assert float(row["epsilon_user_max"]) == user["epsilon_max"]
        assert float(row["epsilon_user_median"]) == user["epsilon_median"]
        assert float(row["delta"]) == 1e-5
    by_row = {(r["users"], r["row"]): r for r in rows}
    dp_fedrec = by_row[("60", "dp-fedrec_eps-10")]
    assert 0 < float(dp_fedrec["epsilon_user_max"]) < math.inf
    paper = by_row[("60", "privaterec_eps-10_paper_B5")]
    strict = by_row[("60", "privaterec_eps-10_strict_B5")]
    assert paper["epsilon_valid"] == "False" and strict["epsilon_valid"] == "True"
    assert strict["epsilon_user_max"] == "inf" and strict["epsilon_click_max"] != "inf"
    lines = {line.split(" | ")[2]: line for line in result["table"].splitlines()
             if line.startswith("| 60 | NRMS |")}
    assert "does not hold" in lines["PrivateRec (paper mode) (local DP)"]
    assert "one click" in lines["PrivateRec (strict mode) (local DP)"]
    assert "∞ (no noise)" in lines["FedRec (no privacy)"]


def test_central_epsilon_is_at_most_the_target(
        experiment: tuple[Path, dict[str, Any]]) -> None:
    out, _ = experiment
    central = [r for r in read_csv(out / "central_dp.csv") if r["method"] == "dp-fedavg"]
    assert len(central) == 4  # ε = 1 at 60 and 80 users, and the PrivateRec model's 2 rows
    for row in central:
        target, reached = float(row["target_epsilon"]), float(row["epsilon_user_max"])
        assert 0.9 * target < reached <= target
        z = float(row["noise_multiplier"])
        assert reached == pytest.approx(central_epsilon(
            noise_multiplier=z, sampling_rate=0.02, rounds=1, delta=1e-5), rel=1e-3)
        assert float(row["ledger_users"]) > 0.9 * int(row["users"])  # every training user


def test_rerun_trains_and_evaluates_nothing(experiment: tuple[Path, dict[str, Any]],
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out, result = experiment
    _tiny(monkeypatch)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a finished run or evaluation must be reused")

    monkeypatch.setattr(pipeline, "train_run", refuse)
    monkeypatch.setattr(pipeline, "evaluate_run", refuse)
    monkeypatch.setattr(pipeline, "evaluate_untrained", refuse)
    served = run_dir(out, "nrms", RunSpec("dp-fedavg", basis_size=5, target_epsilon=1.0), 0,
                     quick=True) / "privacy.json"
    ledger = served.read_bytes()
    assert run_central_dp(out, **ARGS)["rows"] == result["rows"]
    assert main(["experiment", "central-dp", "--out", str(out), *CLI_ARGS]) == 0
    assert capsys.readouterr().out == result["table"] + "\n"
    assert served.read_bytes() == ledger  # serving not recorded twice
    # a subset of the sizes is a table of its own, from the same runs
    small = run_central_dp(out, **{**ARGS, "users": (60,)})
    assert [r["row"] for r in small["rows"]] == SMALL


def test_report_only_tables_whatever_finished(experiment: tuple[Path, dict[str, Any]],
                                              monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    out, result = experiment
    _tiny(monkeypatch)
    monkeypatch.setattr(pipeline, "train_run", None)  # report_only must not need them
    monkeypatch.setattr(pipeline, "evaluate_run", None)
    monkeypatch.setattr(pipeline, "evaluate_untrained", None)
    partial = run_central_dp(out, **{**ARGS, "users": (60, 80, 100), "seeds": (0, 1)},
                             report_only=True)
    assert [(r["users"], r["row"], r["n_seeds"]) for r in partial["rows"]] == \
        [(r["users"], r["row"], 1) for r in result["rows"]]
    assert "100 users: no data set yet" in partial["missing"]
    assert "60 users / nrms / fedrec / seed 1" in partial["missing"]
    assert not (out / "data" / "synth-quick-100").exists()  # nothing synthesised
    assert "Not finished (" in partial["table"]
    # Every pivot cell has one of the two seeds asked, and says so; the full run's do not.
    def pivot_cells(table: str) -> list[str]:
        pivot = table.split("(DP-FedAvg; ∞: FedRec):")[1].split("All rows:")[0]
        return [c.strip() for line in pivot.strip().splitlines()[2:]
                for c in line.strip("|").split("|")[2:] if c.strip() != "–"]
    assert pivot_cells(partial["table"])
    assert all(c.endswith("(n = 1)") for c in pivot_cells(partial["table"]))
    assert not any("(n = " in c for c in pivot_cells(result["table"]))
    empty = run_central_dp(tmp_path / "fresh", **ARGS, report_only=True)
    assert empty["rows"] == [] and (tmp_path / "fresh" / "central_dp.png").exists()


@pytest.mark.parametrize("changes, message", [
    ({"epsilons": (0.0, 1.0)}, "'epsilons'"),
    ({"epsilons": (1.0, 1.0)}, "'epsilons'"),
    ({"epsilons": ()}, "'epsilons'"),
    ({"users": (1,)}, "'users'"),
    ({"users": (60, 60)}, "'users'"),
    ({"ldp_users": (90,)}, "'ldp_users': \\[90\\] not among --users"),
    ({"data": "/nonexistent"}, "--users and --ldp-users"),
    ({"client_fraction": 0.0}, "'client_fraction'"),
    ({"client_fraction": 1.5}, "'client_fraction'"),
    ({"rounds": 0}, "'rounds'"),
    ({"models": ("bert",)}, "'models'"),
    ({"seeds": (0, 0)}, "'seeds'"),
])
def test_bad_arguments_fail_before_anything_runs(changes: dict[str, Any], message: str,
                                                 tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message):
        run_central_dp(tmp_path, **{**ARGS, **changes})
    assert not (tmp_path / "data").exists()


def test_cli_rejects_central_dp_flags_elsewhere(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "table1", "--out", str(tmp_path), "--users", "60",
                 "--report-only"]) == 2
    assert "--users, --report-only apply to 'experiment central-dp' only" in \
        capsys.readouterr().err
    assert main(["experiment", "central-dp", "--out", str(tmp_path), "--epsilons", "-1"]) == 2
    assert "'epsilons'" in capsys.readouterr().err


def test_plan_rows_and_run_names() -> None:
    central = plan_rows((1.0, 8.0, math.inf), ldp=False)
    assert [r.key for r in central] == ["untrained", "dp-fedavg_eps-1", "dp-fedavg_eps-8",
                                        "fedrec"]
    full = plan_rows((8.0, 1.0), ldp=True, client_fraction=0.05, rounds=50)
    assert [r.key for r in full] == [
        "untrained", "dp-fedavg_eps-1_q-0.05_T-50", "dp-fedavg_eps-8_q-0.05_T-50",
        "dp-fedrec_eps-10_q-0.05_T-50", "fednewsrec_q-0.05_T-50",
        "privaterec_eps-10_paper_B5_q-0.05_T-50", "privaterec_eps-10_strict_B5_q-0.05_T-50",
        "dp-fedavg_eps-8_B5_q-0.05_T-50+local", "dp-fedavg_eps-8_B5_q-0.05_T-50+dpa-1",
        "dp-fedavg_eps-8_B5_q-0.05_T-50+dpa-10"]
    assert [r.group for r in plan_rows((math.inf,), ldp=True)] == \
        ["untrained", "central"] + ["ldp"] * 4
    assert full[0].spec.run_config(data="/d", model="naml", seed=3, quick=False).model == \
        plan_rows((math.inf,), ldp=False)[1].spec.run_config(
            data="/d", model="naml", seed=3, quick=False).model  # θ₀ of the FedRec run
    config = full[1].spec.run_config(data="/d", model="naml", seed=3, quick=False)
    assert (config.train.method, config.fed.settings.target_epsilon, config.fed.client_fraction,
            config.fed.rounds, config.train.seed) == ("dp-fedavg", 1.0, 0.05, 50, 3)
    assert full[-1].spec.run_config(data="/d", model="nrms", seed=0,
                                    quick=False).model.basis_size == 5
    # the default q stays out of the run names: table1's runs are reused
    assert central_dp.CLIENT_FRACTION == CentralDP.server_defaults.client_fraction
    assert population_paths(Path("/o"), 2000, quick=False) == \
        (Path("/o/data/synth-default"), Path("/o"))
    assert population_paths(Path("/o"), 20000, quick=False) == \
        (Path("/o/data/synth-20000"), Path("/o/users-20000"))
    assert population_config(50000, quick=False) == \
        SynthConfig(seed=0, users=50000)  # same click model and news count


def test_run_spec_validates_the_new_methods() -> None:
    assert RunSpec("dp-fedavg", target_epsilon=8.0).label == "DP-FedAvg (central)"
    assert RunSpec("fednewsrec").slug == "fednewsrec"
    for bad in ({"method": "dp-fedavg"}, {"method": "fedrec", "target_epsilon": 1.0},
                {"method": "dp-fedavg", "target_epsilon": math.inf},
                {"method": "fedrec", "epsilon_train": 10.0},
                {"method": "fedrec", "basis_size": 5},
                {"method": "dp-fedavg", "target_epsilon": 1.0, "privacy_mode": "strict"},
                {"method": "centralized", "rounds": 5},
                {"method": "fedrec", "client_fraction": 2.0},
                {"method": "fedrec", "rounds": 0}):
        with pytest.raises(ConfigError):
            RunSpec(**bad)


def test_epsilon_cells() -> None:
    def info(user: float, median: float, click: float, valid: bool = True) -> LedgerEpsilon:
        return LedgerEpsilon(user, median, click, valid, 1e-5, 100)

    assert epsilon_cell(info(7.9954, 7.9954, 7.9954)) == "7.995"
    assert epsilon_cell(info(150.0, 60.0, 150.0)) == "150 / 60"
    assert epsilon_cell(info(912000.0, 364800.0, 912000.0)) == "912,000 / 364,800"
    assert epsilon_cell(info(math.inf, math.inf, 150.0)).startswith("∞ (one click: 150")
    assert epsilon_cell(info(math.inf, math.inf, math.inf)) == "∞ (no noise)"
    assert "does not hold" in epsilon_cell(info(math.inf, math.inf, 150.0, valid=False))


def test_empty_ldp_users_gives_central_rows_only(tmp_path: Path) -> None:
    from privaterec.experiments.populations import make_populations
    sizes = (60, 80)
    default = make_populations(tmp_path, None, sizes, None, default_users=sizes, quick=True)
    assert [p.ldp for p in default] == [True, False]
    none = make_populations(tmp_path, None, sizes, (), default_users=sizes, quick=True)
    assert [p.ldp for p in none] == [False, False]
    assert main(["experiment", "central-dp", "--out", str(tmp_path), "--users", "60",
                 "--ldp-users", "--report-only", "--quick", "--no-progress"]) == 0


def test_a_model_variant_runs_with_its_word_vectors(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _tiny(monkeypatch)
    result = run_central_dp(tmp_path, **{**ARGS, "users": (60,)}, ldp_users=(),
                            models=("nrms+corpus",))
    rows = read_csv(Path(result["csv"]))
    assert {r["model"] for r in rows} == {"nrms+corpus"}
    assert [r["row"] for r in rows] == ["untrained", "dp-fedavg_eps-1", "fedrec"]
    fedrec = tmp_path / "runs-quick" / "nrms+corpus" / "fedrec" / "seed0"
    assert RunDirectory(fedrec).config().model.embeddings == "corpus"
    trained = torch.load(fedrec / "checkpoint.pt", weights_only=False)["model"]
    _, _, reloaded = load_run_model(fedrec)  # the checkpoint fills the vectors
    key = "news_encoder.embedding.weight"
    assert reloaded.state_dict()[key].abs().sum() > 0
    assert torch.equal(reloaded.state_dict()[key], trained[key])
    assert "| 60 | NRMS + corpus word vectors |" in result["table"]
    assert "`corpus` vectors are fitted on the texts of the training news" in result["table"]
    assert "no ε is charged" in result["table"]


def test_news_vector_clipping_gets_its_own_dp_fedavg_rows(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    planned = plan_rows((1.0, math.inf), ldp=True, clip_spaces=("parameters", "news_vectors"))
    assert [r.key for r in planned if r.group == "central"] == [
        "dp-fedavg_eps-1", "dp-fedavg_eps-1_news-space", "fedrec"]
    news = next(r for r in planned if r.key == "dp-fedavg_eps-1_news-space")
    assert news.label == "DP-FedAvg (central), clipped in news-vector space"
    config = news.spec.run_config(data="/d", model="nrms", seed=0, quick=False)
    assert config.fed.settings.clip_space == "news_vectors"
    # the PrivateRec model stays clipped in parameter space
    assert all(r.spec.clip_space == "parameters" for r in planned if r.group == "privaterec")
    with pytest.raises(ConfigError, match="clip_space"):
        RunSpec("fedrec", clip_space="news_vectors")
    with pytest.raises(ConfigError, match="clip_spaces"):
        run_central_dp(tmp_path / "bad", **ARGS, clip_spaces=("weights",))

    _tiny(monkeypatch)
    result = run_central_dp(tmp_path, **{**ARGS, "users": (60,)}, ldp_users=(),
                            clip_spaces=("parameters", "news_vectors"))
    rows = read_csv(Path(result["csv"]))
    assert [r["row"] for r in rows] == ["untrained", "dp-fedavg_eps-1",
                                        "dp-fedavg_eps-1_news-space", "fedrec"]
    run = tmp_path / "runs-quick" / "nrms" / "dp-fedavg_eps-1_news-space" / "seed0"
    assert RunDirectory(run).config().fed.settings.clip_space == "news_vectors"
    # both rows have the same accounted ε: the same mechanism on another vector
    epsilons = {r["row"]: float(r["epsilon_user_max"]) for r in rows
                if r["row"].startswith("dp-fedavg")}
    assert epsilons["dp-fedavg_eps-1"] == pytest.approx(epsilons["dp-fedavg_eps-1_news-space"])
    pivot = result["table"].split("All rows:")[0]
    assert "| DP-FedAvg clips |" in pivot
    assert "| 60 | NRMS | news-vector cotangents |" in pivot
    assert "Clipped in news-vector space" in result["table"]
    alone = run_central_dp(tmp_path, **{**ARGS, "users": (60,)}, ldp_users=(),
                           clip_spaces=("news_vectors",), report_only=True)
    assert "| 60 | NRMS | news-vector cotangents |" in alone["table"]  # the column stays
    default = run_central_dp(tmp_path, **{**ARGS, "users": (60,)}, ldp_users=(),
                             report_only=True)
    assert "DP-FedAvg clips" not in default["table"]


def test_privaterec_rows_once_per_number_of_basic_vectors(tmp_path: Path) -> None:
    planned = plan_rows((1.0, 8.0, math.inf), ldp=True, privaterec_bases=(5, 20))
    private = [r for r in planned if r.group == "privaterec"]
    assert [r.key for r in private] == [
        "dp-fedavg_eps-8_B5+local", "dp-fedavg_eps-8_B5+dpa-1", "dp-fedavg_eps-8_B5+dpa-10",
        "dp-fedavg_eps-8_B20+local", "dp-fedavg_eps-8_B20+dpa-1", "dp-fedavg_eps-8_B20+dpa-10"]
    assert private[3].label == "PrivateRec (B = 20) by DP-FedAvg + local ranking"
    config = private[3].spec.run_config(data="/d", model="nrms", seed=0, quick=False)
    assert config.model.basis_size == 20 and config.fed.settings.target_epsilon == 8.0
    assert [r.key for r in plan_rows((1.0, math.inf), ldp=True) if r.group == "privaterec"
            ][0] == "dp-fedavg_eps-1_B5+local"  # the default B stays the paper's 5
    for bad in ((1,), (True,), (2.5,)):
        with pytest.raises(ConfigError, match="privaterec_bases"):
            run_central_dp(tmp_path / "bad", **ARGS, privaterec_bases=bad)
