"""`privaterec experiment unifedrec`: tables, CSV, PNG and caching on tiny data."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from privaterec.experiments import common, unifedrec
from privaterec.privacy.report import read_privacy_json


@pytest.fixture
def small_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "QUICK_ROUNDS", 2)
    monkeypatch.setattr(unifedrec, "QUICK_RECALL_ROUNDS", 2)
    monkeypatch.setattr(unifedrec, "RECALL_CLIENTS", 4)
    monkeypatch.setattr(unifedrec, "QUICK_INTEREST_NOISES", (0.6, 2.4))


def test_experiment_writes_tables_figure_and_reuses_its_runs(
        tiny_data: Path, tmp_path: Path, small_budget: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "exp"
    result = unifedrec.run_unifedrec(out, data=str(tiny_data), seeds=(0, 1), quick=True,
                                     progress=False)
    text = (out / "unifedrec.md").read_text()
    for title in ("Table 2 analogue", "Table 3 analogue", "Table 4 analogue",
                  "Fig. 5 analogue"):
        assert title in text
    assert (out / "unifedrec_fig5_interest_noise.png").stat().st_size > 1000
    with open(out / "unifedrec_tables.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["row"] for r in rows] == [row.key for row in unifedrec.ROWS]
    by_key = {r["row"]: r for r in rows}
    assert all(r["n_seeds"] == "2" for r in rows)
    # honest accounting: Uni-FedRec's query ε = C channels × 2δB/λ_I = C × 10, quotas clear
    assert float(by_key["unifedrec"]["epsilon_per_query_max"]) % 10.0 == pytest.approx(0.0)
    assert by_key["unifedrec"]["quotas_in_clear"] == "True"
    assert by_key["youtubenet"]["epsilon_per_query_max"] == "inf"
    assert float(by_key["privaterec"]["epsilon_per_query_max"]) == pytest.approx(10.0)
    assert float(by_key["privaterec"]["bytes_per_query_mean"]) == 20.0  # B = 5 floats
    for r in rows:
        for k in (100, 200, 300, 400):
            assert 0.0 <= float(r[f"future_recall@{k}_mean"]) <= 1.0
    sweep = result["sweep"]
    assert [p["interest_noise"] for p in sweep] == [0.6, 2.4]
    assert [p["channel_epsilon"] for p in sweep] == pytest.approx([20.0, 5.0])  # 2·0.2·30/λ
    # the experiment never writes its simulated queries into the runs' ledgers
    summary = read_privacy_json(out / "recall-runs-quick" / "unifedrec" / "seed0")
    assert "serving" not in summary["release"]

    # a second call trains and evaluates nothing
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("cached runs and evaluations must be reused")

    monkeypatch.setattr(unifedrec, "train_recall_run", forbidden)
    monkeypatch.setattr(unifedrec, "evaluate_recall_run", forbidden)
    again = unifedrec.run_unifedrec(out, data=str(tiny_data), seeds=(0, 1), quick=True,
                                    progress=False)
    assert again["table"] == result["table"]
