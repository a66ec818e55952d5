"""Trade-off figures 4-7 (privaterec.experiments.tradeoff)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

import privaterec.experiments.common as common
import privaterec.experiments.tradeoff as tradeoff
from privaterec.experiments.common import RunSpec, Summary, run_dir
from privaterec.experiments.tradeoff import (FIGURES, PADDINGS, Curve, padding_noise_scales,
                                             run_tradeoff)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_padding_noise_scales_match_the_amplification_formula() -> None:
    rows = padding_noise_scales([1.0, 5.0, 10.0], PADDINGS)
    assert len(rows) == 3 * 10
    for row in rows:
        eps, p = row["epsilon_serve"], row["padding_p"]
        eps_base = math.log((math.exp(eps) - p) / (1 - p))  # docs/privacy.md#padding-amplification
        assert row["epsilon_base"] == pytest.approx(eps_base, rel=1e-12)
        assert row["noise_scale"] == pytest.approx(2.0 / eps_base, rel=1e-12)  # Δ₁ = 2
    # Hand-computed points: p = 0 is plain Laplace 2/ε; ε = 1, p = 0.5: 2 / ln(2e - 1).
    by_key = {(r["epsilon_serve"], r["padding_p"]): r["noise_scale"] for r in rows}
    assert by_key[(10.0, 0.0)] == pytest.approx(0.2)
    assert by_key[(1.0, 0.5)] == pytest.approx(2 / math.log(2 * math.e - 1))
    for eps in (1.0, 5.0, 10.0):  # more padding, less noise; more so for small ε_s
        scales = [by_key[(eps, p)] for p in PADDINGS]
        assert all(a > b for a, b in zip(scales, scales[1:]))
    assert by_key[(1.0, 0.9)] / by_key[(1.0, 0.0)] < by_key[(10.0, 0.9)] / by_key[(10.0, 0.0)]


def test_curve_separates_infinity() -> None:
    curve = Curve("c", [(1.0, Summary(0.5, None, 1, (0.5,))),
                        (math.inf, Summary(0.7, None, 1, (0.7,)))])
    assert [x for x, _ in curve.finite()] == [1.0]
    assert curve.at_infinity() is not None and curve.at_infinity().mean == 0.7
    assert Curve("empty").at_infinity() is None


def test_tradeoff_end_to_end(tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(common, "QUICK_ROUNDS", 1)
    monkeypatch.setattr(tradeoff, "QUICK_SERVING_EPSILONS", (10.0, math.inf))
    monkeypatch.setattr(tradeoff, "QUICK_PADDINGS", (0.0, 0.5))
    monkeypatch.setattr(tradeoff, "QUICK_TRAIN_EPSILONS", (10.0, math.inf))
    monkeypatch.setattr(tradeoff, "QUICK_BASIS_SIZES", (5,))
    out = tmp_path / "out"
    result = run_tradeoff(out, data=str(tiny_data), model="nrms", seeds=(0,), quick=True,
                          progress=False)
    assert capsys.readouterr().out == "" and "Fig. 7" in result["table"]  # the CLI prints it
    assert (out / "tradeoff.md").exists()
    for name in FIGURES:
        assert (out / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
        assert result["figures"][name]["csv"] == out / f"{name}.csv"

    def auc(name: str, **match: str) -> float:
        rows = [r for r in read_csv(out / f"{name}.csv")
                if all(r[k] == v for k, v in match.items())]
        assert len(rows) == 1, (name, match)
        assert rows[0]["n_seeds"] == "1" and rows[0]["auc_std"] == ""
        return float(rows[0]["auc_mean"])

    def trained_auc(spec: RunSpec) -> float:
        path = run_dir(out, "nrms", spec, 0, quick=True) / "metrics.json"
        return json.loads(path.read_text())["test"]["auc"]

    private = RunSpec("privaterec", 10.0)
    fedrec = RunSpec("dp-fedrec")
    # ε = ∞ points are the runs' own (noise-free) test AUCs: PrivateRec's ũ = Σ αᵢ bᵢ and a
    # positively rescaled (clipped) FedRec user vector rank every impression the same.
    assert auc("fig4_serving_epsilon", method="PrivateRec", epsilon_serve="inf") == \
        pytest.approx(trained_auc(private), abs=1e-12)
    assert auc("fig4_serving_epsilon", method="VDP", epsilon_serve="inf") == \
        pytest.approx(trained_auc(fedrec), abs=1e-9)
    # The same PrivateRec serving evaluation (ε_s = 10, p = 0.5) in Figs. 4 and 5.
    assert auc("fig4_serving_epsilon", method="PrivateRec", epsilon_serve="10.0") == \
        auc("fig5_padding", panel="auc", padding_p="0.5")
    assert auc("fig6_train_epsilon", method="PrivateRec", epsilon_train="10.0") == \
        trained_auc(private) == auc("fig7_basis", basis_size="5")
    assert auc("fig6_train_epsilon", method="DP-FedRec", epsilon_train="inf") == \
        trained_auc(fedrec)
    assert auc("fig6_train_epsilon", method="PrivateRec", epsilon_train="inf") == \
        trained_auc(RunSpec("privaterec", math.inf))
    noise = [r for r in read_csv(out / "fig5_padding.csv") if r["panel"] == "noise_scale"]
    assert [float(r["noise_scale"]) for r in noise] == \
        [r["noise_scale"] for r in padding_noise_scales()]


def test_every_basis_size_of_fig7_is_a_valid_configuration():
    """Fig. 7's B grid must pass ModelConfig's rule (B >= 2): with B = 1 the full
    ``experiment tradeoff`` would fail after Fig. 6."""
    from privaterec.config import ModelConfig

    for size in tradeoff.BASIS_SIZES + tradeoff.QUICK_BASIS_SIZES:
        ModelConfig(basis_size=size)  # raises ConfigError for an invalid B
