"""Tests of ``privaterec privacy report|calibrate`` (no training: privacy.json is written here)."""

from __future__ import annotations

import json
import math

import pytest

from privaterec.cli import main
from privaterec.privacy.formulas import gaussian_sigma
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.ledger import PrivacyLedger
from privaterec.privacy.report import write_privacy_json

# σ(ε=1, δ=1e-5, Δ=1) of the analytic Gaussian mechanism, pinned in
# tests/privacy/test_formulas.py (dp_accounting and Balle & Wang Thm 8 bisection agree).
SIGMA_1_1E5 = 3.7306316348


def strict_json(text: str):
    def reject(token):
        raise AssertionError(f"non-standard JSON constant {token}")
    return json.loads(text, parse_constant=reject)


def gaussian_run(path):
    sens = 2 * 0.005
    sigma = gaussian_sigma(epsilon=1.0, delta=1e-5, sensitivity_l2=sens)
    event = PrivacyEvent(mechanism="gaussian", epsilon=1.0, delta=1e-5, noise_scale=sigma,
                         sensitivity=sens, dimension=500, phase="train")
    ledger = PrivacyLedger()
    for user, count in enumerate([2, 6, 6, 9]):
        ledger.record(f"U{user}", event, count)
    release = {"method": "dp-fedrec", "mechanism": "gaussian", "clipping": "l2",
               "clip_bound": 0.005, "noise_scale": sigma, "sensitivity_l2": sens,
               "dimension": 500, "epsilon_per_round": 1.0, "delta_per_round": 1e-5,
               "coordinate_epsilon": None, "noised_parameters": ["w"],
               "clients_per_round": 2, "client_fraction": 0.5}
    write_privacy_json(path / "privacy.json", ledger, release=release, delta=1e-5, rounds=9)
    return ledger


def test_privacy_report_text(tmp_path, capsys):
    ledger = gaussian_run(tmp_path)
    assert main(["privacy", "report", "--run", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    eps_max = ledger.report(delta=1e-5)["phases"]["total"]["epsilon_max"]
    assert "method dp-fedrec, 9 round(s) completed" in out
    assert "gaussian" in out and "l2, bound 0.005" in out
    assert f"max {eps_max:.6g}" in out and "target delta = 1e-05, PLD composition" in out


def test_privacy_report_json_and_recomposition(tmp_path, capsys):
    ledger = gaussian_run(tmp_path)
    assert main(["privacy", "report", "--run", str(tmp_path), "--json"]) == 0
    payload = strict_json(capsys.readouterr().out)
    assert "ledger" not in payload
    assert payload["report"]["phases"] == ledger.report(delta=1e-5)["phases"]
    assert main(["privacy", "report", "--run", str(tmp_path), "--json", "--delta", "1e-7",
                 "--composition", "rdp"]) == 0
    other = strict_json(capsys.readouterr().out)
    assert other["report"]["phases"] == ledger.report(delta=1e-7,
                                                      composition="rdp")["phases"]
    assert other["recomposed_from"] == {"delta": 1e-5, "composition": "pld"}


def test_privacy_report_not_private_run(tmp_path, capsys):
    ledger = PrivacyLedger()
    ledger.record_many(["a", "b"], PrivacyEvent(mechanism="none", epsilon=math.inf,
                                                phase="train"), count=4)
    write_privacy_json(tmp_path / "privacy.json", ledger,
                       release={"method": "fedrec", "mechanism": "none",
                                "epsilon_per_round": math.inf}, delta=1e-5, rounds=4)
    assert main(["privacy", "report", "--run", str(tmp_path)]) == 0
    assert "∞ (not private)" in capsys.readouterr().out
    assert main(["privacy", "report", "--run", str(tmp_path), "--json"]) == 0
    payload = strict_json(capsys.readouterr().out)
    assert payload["release"]["epsilon_per_round"] == "inf"


def test_privacy_report_missing_file_exits_2(tmp_path, capsys):
    assert main(["privacy", "report", "--run", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "privacy.json: not found" in err


def test_calibrate_laplace(capsys):
    assert main(["privacy", "calibrate", "--mechanism", "laplace", "--epsilon", "3",
                 "--sensitivity", "0.3", "--json"]) == 0
    result = strict_json(capsys.readouterr().out)
    assert result["noise_scale"] == 0.3 / 3 and result["noise_parameter"] == "b"
    assert main(["privacy", "calibrate", "--mechanism", "laplace", "--epsilon", "2",
                 "--sensitivity", "0.02"]) == 0
    assert "noise scale b     0.01  (b = S / epsilon)" in capsys.readouterr().out


def test_calibrate_gaussian(capsys):
    assert main(["privacy", "calibrate", "--mechanism", "gaussian", "--epsilon", "1",
                 "--delta", "1e-5", "--sensitivity", "1", "--json"]) == 0
    result = strict_json(capsys.readouterr().out)
    assert result["noise_scale"] == pytest.approx(SIGMA_1_1E5, rel=1e-9)
    assert result["alternatives"][0]["valid"] is False
    assert main(["privacy", "calibrate", "--mechanism", "gaussian", "--epsilon", "1",
                 "--delta", "1e-5", "--sensitivity", "2"]) == 0
    out = capsys.readouterr().out
    assert f"{2 * SIGMA_1_1E5:.6g}" in out
    assert "classical sigma" in out and "INVALID for epsilon >= 1" in out


def test_calibrate_gaussian_needs_delta(capsys):
    assert main(["privacy", "calibrate", "--mechanism", "gaussian", "--epsilon", "1",
                 "--sensitivity", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'delta'" in err and "--delta" in err


@pytest.mark.parametrize("p", [0.0, 0.2, 0.5])
def test_calibrate_dpa_laplace_runs_at_the_amplified_budget(p, capsys):
    assert main(["privacy", "calibrate", "--mechanism", "dpa", "--epsilon", "10",
                 "--padding-p", str(p), "--basis", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    eps_base = math.log((math.exp(10) - p) / (1 - p))  # PrivateRec Alg. 2 line 9
    assert out["epsilon_base"] == pytest.approx(eps_base, rel=1e-12)
    assert out["sensitivity"] == 2.0 and out["sensitivity_norm"] == "l1"  # the simplex
    assert out["noise_scale"] == pytest.approx(2.0 / eps_base, rel=1e-12)
    assert out["valid"] is True


def test_calibrate_dpa_gaussian_noise_falls_with_padding(capsys):
    scales = []
    for p in (0.0, 0.3, 0.6):
        assert main(["privacy", "calibrate", "--mechanism", "dpa", "--epsilon", "1",
                     "--delta", "1e-5", "--padding-p", str(p), "--basis", "5", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        eps_base = math.log((math.exp(1) - p) / (1 - p))
        assert out["delta_base"] == pytest.approx(1e-5 / (1 - p))
        assert out["noise_scale"] == pytest.approx(gaussian_sigma(
            epsilon=eps_base, delta=1e-5 / (1 - p), sensitivity_l2=math.sqrt(2)), rel=1e-9)
        scales.append(out["noise_scale"])
    assert scales[0] > scales[1] > scales[2]


def test_calibrate_dpa_paper_sensitivity_is_flagged_invalid(capsys):
    assert main(["privacy", "calibrate", "--mechanism", "dpa", "--epsilon", "10",
                 "--basis", "5", "--sensitivity-mode", "paper"]) == 0
    out = capsys.readouterr().out
    assert "sensitivity (L1)  1" in out and "NOT" in out


def test_calibrate_dpa_needs_basis_and_rejects_a_sensitivity(capsys):
    assert main(["privacy", "calibrate", "--mechanism", "dpa", "--epsilon", "10"]) == 2
    assert "--basis" in capsys.readouterr().err
    assert main(["privacy", "calibrate", "--mechanism", "dpa", "--epsilon", "10", "--basis",
                 "5", "--sensitivity", "1"]) == 2
    assert "sensitivity" in capsys.readouterr().err
    assert main(["privacy", "calibrate", "--mechanism", "laplace", "--epsilon", "1",
                 "--sensitivity", "1", "--padding-p", "0.2"]) == 2
