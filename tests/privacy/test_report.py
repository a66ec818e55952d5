"""Tests of privaterec.privacy.report (privacy.json of a federated run, calibration reports)."""

from __future__ import annotations

import json
import math
import re
import time

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from privaterec.errors import CheckpointError, ConfigError
from privaterec.privacy import ledger as ledger_mod
from privaterec.privacy.formulas import gaussian_sigma
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.ledger import PrivacyLedger, compose_events
from privaterec.privacy.report import (
    COMPOSITIONS,
    NOT_PRIVATE,
    calibrate_noise,
    format_epsilon,
    format_privacy_report,
    read_privacy_json,
    recompose_privacy_summary,
    write_privacy_json,
)

# σ(ε=1, δ=1e-5, Δ=1) of the analytic Gaussian mechanism, pinned in test_formulas.py
# (dp_accounting and an independent bisection on Balle & Wang 2018 Thm 8 agree).
SIGMA_1_1E5 = 3.7306316348

D = 150_000
CLIP, LAMBDA = 0.005, 0.015


def strict_json(text: str):
    """json.loads that rejects the non-standard Infinity/NaN tokens."""
    def reject(token):
        raise AssertionError(f"non-standard JSON constant {token}")
    return json.loads(text, parse_constant=reject)


def fednewsrec_event(dimension: int = D) -> PrivacyEvent:
    sens = 2 * CLIP * dimension
    return PrivacyEvent(mechanism="laplace", epsilon=sens / LAMBDA, noise_scale=LAMBDA,
                        sensitivity=sens, dimension=dimension, phase="train",
                        coordinate_epsilon=2 * CLIP / LAMBDA)


def fednewsrec_release(dimension: int = D, **extra) -> dict:
    sens = 2 * CLIP * dimension
    return {"method": "fednewsrec", "mechanism": "laplace", "clipping": "elementwise",
            "clip_bound": CLIP, "noise_scale": LAMBDA, "sensitivity_l1": sens,
            "dimension": dimension, "epsilon_per_round": sens / LAMBDA, "delta_per_round": 0.0,
            "coordinate_epsilon": 2 * CLIP / LAMBDA, "noised_parameters": ["a.weight", "b.bias"],
            "clients_per_round": 40, "client_fraction": 0.02, **extra}


def laplace_event(eps: float, sens: float = 0.02) -> PrivacyEvent:
    return PrivacyEvent(mechanism="laplace", epsilon=eps, noise_scale=sens / eps,
                        sensitivity=sens, dimension=100, phase="train")


def gaussian_event(eps: float = 1.0, delta: float = 1e-5, sens: float = 0.01) -> PrivacyEvent:
    return PrivacyEvent(mechanism="gaussian", epsilon=eps, delta=delta, dimension=100,
                        noise_scale=gaussian_sigma(epsilon=eps, delta=delta, sensitivity_l2=sens),
                        sensitivity=sens, phase="train")


def ledger_with(event: PrivacyEvent, counts) -> PrivacyLedger:
    ledger = PrivacyLedger()
    for user, count in enumerate(counts):
        ledger.record(f"U{user}", event, int(count))
    return ledger


# --- privacy.json ----------------------------------------------------------------------------

def test_round_trip_keeps_infinity_as_strict_json(tmp_path):
    event = PrivacyEvent(mechanism="none", epsilon=math.inf, phase="train", dimension=10)
    ledger = ledger_with(event, [3, 1, 2])
    release = {"method": "fedrec", "mechanism": "none", "clipping": "none",
               "epsilon_per_round": math.inf, "delta_per_round": 0.0, "dimension": 10,
               "noised_parameters": [], "clients_per_round": 3, "client_fraction": 1.0}
    path = tmp_path / "run" / "privacy.json"
    written = write_privacy_json(path, ledger, release=release, delta=1e-5, rounds=3)
    raw = strict_json(path.read_text())
    assert raw["format"] == "privaterec.privacy" and raw["version"] == 1
    assert raw["release"]["epsilon_per_round"] == "inf"
    assert raw["report"]["phases"]["total"]["epsilon_max"] == "inf"
    assert PrivacyLedger.from_dict(raw["ledger"]) == ledger
    back = read_privacy_json(tmp_path / "run")  # the run directory works too
    assert back == written
    assert back["release"]["epsilon_per_round"] == math.inf
    assert back["report"]["phases"]["train"]["epsilon_max"] == math.inf
    assert back["rounds"] == 3 and back["delta"] == 1e-5 and back["composition"] == "pld"
    text = format_privacy_report(back)
    assert re.search(rf"epsilon per round +{re.escape(NOT_PRIVATE)}", text)
    assert "are not private" in text  # the ledger's warning
    assert list(tmp_path.joinpath("run").iterdir()) == [path]  # no temporary file left


def test_write_replaces_existing_file(tmp_path):
    path = tmp_path / "privacy.json"
    ledger = ledger_with(laplace_event(1.0), [1])
    write_privacy_json(path, ledger, release={"method": "dp-fedrec", "mechanism": "laplace"},
                       delta=1e-5, rounds=1)
    ledger.record("U0", laplace_event(1.0))
    write_privacy_json(path, ledger, release={"method": "dp-fedrec", "mechanism": "laplace"},
                       delta=1e-5, rounds=2)
    back = read_privacy_json(path)
    assert back["rounds"] == 2 and back["report"]["phases"]["train"]["releases_max"] == 2


def test_report_values_equal_ledger_report(tmp_path):
    counts = [1, 5, 5, 12, 20, 3]
    ledger = ledger_with(laplace_event(1.0), counts)
    ledger.record("U9", gaussian_event(), 4)
    summary = write_privacy_json(tmp_path / "privacy.json", ledger,
                                 release={"method": "dp-fedrec", "mechanism": "laplace",
                                          "epsilon_per_round": 1.0},
                                 delta=1e-5, rounds=20, composition="pld")
    expected = ledger.report(delta=1e-5, composition="pld")
    assert summary["report"]["phases"] == expected["phases"]
    assert summary["report"]["warnings"] == expected["warnings"] == []
    total = summary["report"]["phases"]["total"]
    eps = [ledger.user_epsilon(u, delta=1e-5) for u in ledger.users]
    assert total["epsilon_max"] == max(eps) and total["num_users"] == 7
    assert total["epsilon_median"] == float(np.median(eps))
    assert total["basic_epsilon_max"] == 20.0 and total["releases_max"] == 20
    assert summary["checks"] == []  # epsilon_per_round matches a recorded event
    text = format_privacy_report(read_privacy_json(tmp_path / "privacy.json"))
    assert f"max {max(eps):.6g}, median {float(np.median(eps)):.6g} (pld)" in text
    assert "users who spent budget   7" in text and "releases per user        max 20" in text
    assert "max epsilon 20, max delta 4e-05 (sums over releases" in text


def test_a_delta_not_below_one_over_n_is_flagged(tmp_path):
    ledger = ledger_with(laplace_event(1.0), [1, 5, 5, 12])  # N = 4 users
    release = {"method": "dp-fedrec", "mechanism": "laplace", "epsilon_per_round": 1.0}
    fine = write_privacy_json(tmp_path / "privacy.json", ledger, release=release,
                              delta=0.2, rounds=20, composition="pld")
    assert fine["checks"] == []  # 0.2 < 1/4
    summary = recompose_privacy_summary(fine, delta=0.25)
    assert any("not below 1/N = 0.25 for N = 4, the users of the ledger" in c
               for c in summary["checks"])
    assert "not below 1/N" in format_privacy_report(summary)


def test_the_delta_check_uses_the_stated_population(tmp_path):
    """A local-DP ledger holds only the users sampled so far: N is the run's population
    when the release states it (``population``), which can be larger or smaller."""
    ledger = ledger_with(laplace_event(1.0), [1, 5, 5, 12])  # 4 users seen so far
    release = {"method": "dp-fedrec", "mechanism": "laplace", "epsilon_per_round": 1.0,
               "population": 10}
    summary = write_privacy_json(tmp_path / "privacy.json", ledger, release=release,
                                 delta=0.2, rounds=20, composition="pld")
    assert any("not below 1/N = 0.1 for N = 10, the run's population" in c
               for c in summary["checks"])  # 0.2 < 1/4, yet not below 1/10
    assert recompose_privacy_summary(summary, delta=0.05)["checks"] == []
    for wrong in (2, True, 10.0):  # fewer than the ledger holds, or not an integer
        stated = write_privacy_json(tmp_path / "privacy.json", ledger,
                                    release={**release, "population": wrong}, delta=0.25,
                                    rounds=20, composition="pld")
        assert any("for N = 4, the users of the ledger" in c for c in stated["checks"])


def test_fednewsrec_reports_coordinate_and_update_epsilon(tmp_path):
    dim = 1000
    coordinate = 2 * 0.005 / 0.015          # 2δ/λ, computed here independently
    update = 2 * 0.005 * dim / 0.015        # 2δD/λ
    ledger = ledger_with(fednewsrec_event(dim), [2, 3])
    summary = write_privacy_json(tmp_path / "privacy.json", ledger,
                                 release=fednewsrec_release(dim), delta=1e-5, rounds=3)
    text = format_privacy_report(summary)
    lines = text.splitlines()
    [per_round] = [ln for ln in lines if "epsilon per round" in ln]
    [per_coord] = [ln for ln in lines if "per-coordinate eps" in ln]
    assert f"{update:.6g}" in per_round and "THIS is the guarantee" in per_round
    assert f"D = {dim}" in per_round
    assert f"{coordinate:.6g}" in per_coord and "NOT a guarantee" in per_coord
    assert summary["checks"] == []
    # A release whose stated epsilons disagree with 2δ/λ and 2δD/λ is flagged.
    bad = fednewsrec_release(dim, coordinate_epsilon=0.5, epsilon_per_round=coordinate)
    flagged = write_privacy_json(tmp_path / "bad.json", ledger, release=bad, delta=1e-5,
                                 rounds=3)
    assert any("coordinate_epsilon=0.5" in c for c in flagged["checks"])
    assert any("matches no recorded train event" in c for c in flagged["checks"])
    assert "WARNINGS:" in format_privacy_report(flagged)


def test_uncovered_parameters_and_extra_keys_are_shown(tmp_path):
    ledger = ledger_with(laplace_event(1.0), [1, 2])
    release = {"method": "privaterec", "mechanism": "laplace", "epsilon_per_round": 1.0,
               "uncovered_parameters": ["user_encoder.attention.w", "basis"],
               "privacy_mode": "paper", "shape": (2, 3)}
    summary = write_privacy_json(tmp_path / "privacy.json", ledger, release=release,
                                 delta=1e-5, rounds=2)
    text = format_privacy_report(read_privacy_json(tmp_path / "privacy.json"))
    head = text.splitlines()[:6]
    assert any("NOT covered" in ln for ln in head)
    assert any(ln.strip() == "!!   user_encoder.attention.w" for ln in head)
    assert "privacy_mode" in text and "paper" in text and "[2, 3]" in text
    assert summary["release"]["shape"] == [2, 3]


def test_recompose_at_other_delta_and_composition(tmp_path):
    ledger = ledger_with(laplace_event(0.5), [4, 8, 8])
    write_privacy_json(tmp_path / "privacy.json", ledger,
                       release={"method": "dp-fedrec", "mechanism": "laplace"},
                       delta=1e-5, rounds=8)
    stored = read_privacy_json(tmp_path / "privacy.json")
    assert recompose_privacy_summary(stored) == stored
    assert recompose_privacy_summary(stored, delta=1e-5, composition="pld") == stored
    other = recompose_privacy_summary(stored, delta=1e-7, composition="rdp")
    expected = ledger.report(delta=1e-7, composition="rdp")
    assert other["report"]["phases"] == expected["phases"]
    assert other["delta"] == 1e-7 and other["composition"] == "rdp"
    assert other["recomposed_from"] == {"delta": 1e-5, "composition": "pld"}
    assert other["report"]["phases"]["total"]["epsilon_max"] > \
        stored["report"]["phases"]["total"]["epsilon_max"]  # smaller δ, RDP: larger ε
    assert "recomposed from the stored ledger" in format_privacy_report(other)


def test_read_errors_name_the_file(tmp_path):
    with pytest.raises(CheckpointError, match="no such run directory"):
        read_privacy_json(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="privacy.json: not found.*federated"):
        read_privacy_json(tmp_path)
    path = tmp_path / "privacy.json"
    path.write_text('{"format": "privaterec.privacy", "version": 1, ')
    with pytest.raises(CheckpointError, match="privacy.json: unreadable or corrupt"):
        read_privacy_json(tmp_path)
    path.write_text('{"format": "something.else"}')
    with pytest.raises(CheckpointError, match="not a privaterec privacy report"):
        read_privacy_json(path)
    path.write_text('{"format": "privaterec.privacy", "version": 99}')
    with pytest.raises(CheckpointError, match="version 99"):
        read_privacy_json(path)
    ledger = ledger_with(laplace_event(1.0), [1])
    write_privacy_json(path, ledger, release={"method": "dp-fedrec", "mechanism": "laplace"},
                       delta=1e-5, rounds=1)
    raw = json.loads(path.read_text())
    raw["ledger"]["records"][0][1] = [[7, 1]]  # an event id that does not exist
    path.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"privacy.json: privacy ledger: bad record"):
        read_privacy_json(path)


def test_write_validates_inputs(tmp_path):
    ledger = ledger_with(laplace_event(1.0), [1])
    with pytest.raises(ConfigError, match="lacks the keys"):
        write_privacy_json(tmp_path / "p.json", ledger, release={"method": "x"}, delta=1e-5,
                           rounds=1)
    with pytest.raises(ConfigError, match="'delta'"):
        write_privacy_json(tmp_path / "p.json", ledger,
                           release={"method": "x", "mechanism": "laplace"}, delta=1.5, rounds=1)
    with pytest.raises(ConfigError, match="composition"):
        write_privacy_json(tmp_path / "p.json", ledger,
                           release={"method": "x", "mechanism": "laplace"}, delta=1e-5,
                           rounds=1, composition="advanced")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="release.bad"):
        write_privacy_json(tmp_path / "p.json", ledger,
                           release={"method": "x", "mechanism": "laplace", "bad": object()},
                           delta=1e-5, rounds=1)
    assert not (tmp_path / "p.json").exists()


def test_compositions_match_the_ledger():
    assert COMPOSITIONS == ledger_mod.COMPOSITIONS


def test_format_epsilon():
    assert format_epsilon(math.inf) == format_epsilon("inf") == "∞ (not private)"
    assert format_epsilon(1.23456789) == "1.23457"


# --- composition at fednewsrec / dp-fedrec scale (performance requirement) -------------------

def test_fednewsrec_scale_report_is_fast_and_uses_basic_composition(tmp_path):
    event = fednewsrec_event()              # ε = 2·0.005·150000/0.015 = 1e5 per release
    counts = np.random.default_rng(0).integers(1, 16, size=2000)
    ledger = ledger_with(event, counts)
    start = time.process_time()
    summary = write_privacy_json(tmp_path / "privacy.json", ledger,
                                 release=fednewsrec_release(), delta=1e-5, rounds=750)
    text = format_privacy_report(read_privacy_json(tmp_path / "privacy.json"))
    assert time.process_time() - start < 2.0
    total = summary["report"]["phases"]["total"]
    assert total["epsilon_max"] == 1e5 * counts.max() == total["basic_epsilon_max"]
    assert total["epsilon_median"] == 1e5 * float(np.median(counts))
    notes = summary["report"]["notes"]
    assert len(notes) == 1 and f"{int(counts.sum())} train 'laplace' releases" in notes[0]
    assert "composed by basic composition" in text


def test_large_epsilon_releases_compose_basic_plus_pld_of_the_rest():
    big, small = fednewsrec_event(), laplace_event(0.3)
    mixed = compose_events([(big, 2), (small, 10)], delta=1e-5, composition="pld")
    assert mixed == pytest.approx(2 * big.epsilon + compose_events([(small, 10)], delta=1e-5),
                                  rel=1e-12)
    assert mixed < 2 * big.epsilon + 10 * 0.3
    # An approximate-DP large release uses up its δ; the rest gets what is left.
    big_gauss = gaussian_event(eps=60.0, delta=4e-6)
    gauss = gaussian_event(eps=1.0, delta=1e-6)
    value = compose_events([(big_gauss, 1), (gauss, 5)], delta=1e-5, composition="pld")
    assert value == pytest.approx(60.0 + compose_events([(gauss, 5)], delta=6e-6), rel=1e-9)
    assert compose_events([(big_gauss, 3)], delta=1e-5, composition="pld") == math.inf
    assert compose_events([(big_gauss, 2)], delta=1e-5, composition="rdp") == 120.0


def test_coarsened_pld_grid_stays_within_its_error_bound():
    # ε = 10 per release: the grid is 1e-4·ε = 1e-3 instead of 1e-4, so 20 releases may add
    # at most 20·1e-3 to the fine-grid (pessimistic) value, and never exceed basic composition.
    event = laplace_event(10.0)
    fine = pld_lib.from_laplace_mechanism(
        0.1, value_discretization_interval=1e-4).self_compose(20).get_epsilon_for_delta(1e-5)
    value = compose_events([(event, 20)], delta=1e-5, composition="pld")
    assert fine - 1e-9 <= value <= fine + 20 * 1e-3
    assert value < 200.0


@pytest.mark.parametrize("event,max_releases", [
    (laplace_event(1.0), 20), (laplace_event(10.0), 20), (gaussian_event(), 20)])
def test_dp_fedrec_scale_report_is_fast(event, max_releases):
    counts = np.arange(2000) % max_releases + 1  # every count 1..20 occurs: 20 compositions
    ledger = ledger_with(event, counts)
    start = time.process_time()
    report = ledger.report(delta=1e-5)
    assert time.process_time() - start < 2.0
    total = report["phases"]["total"]
    assert total["epsilon_max"] == compose_events([(event, max_releases)], delta=1e-5)
    assert total["epsilon_max"] < total["basic_epsilon_max"] or event.delta > 0
    assert report["notes"] == []


# --- calibration -----------------------------------------------------------------------------

def test_calibrate_laplace_is_sensitivity_over_epsilon():
    result = calibrate_noise("laplace", epsilon=3.0, sensitivity=0.3)
    assert result["noise_scale"] == 0.3 / 3.0 and result["noise_parameter"] == "b"
    assert result["sensitivity_norm"] == "l1" and result["delta"] == 0.0
    assert any("ignored" in n for n in
               calibrate_noise("laplace", epsilon=1.0, sensitivity=1.0, delta=1e-5)["notes"])


def test_calibrate_gaussian_pinned_and_classical_labelled():
    result = calibrate_noise("gaussian", epsilon=1.0, delta=1e-5, sensitivity=1.0)
    assert result["noise_scale"] == pytest.approx(SIGMA_1_1E5, rel=1e-9)
    [classical] = result["alternatives"]
    assert classical["value"] == pytest.approx(math.sqrt(2 * math.log(1.25e5)), rel=1e-12)
    assert classical["valid"] is False and "INVALID" in classical["remark"]
    small = calibrate_noise("gaussian", epsilon=0.5, delta=1e-5, sensitivity=2.0)
    assert small["alternatives"][0]["valid"] is True
    assert small["noise_scale"] < small["alternatives"][0]["value"]


def test_calibrate_errors():
    with pytest.raises(ConfigError, match="'delta'.*--delta"):
        calibrate_noise("gaussian", epsilon=1.0, sensitivity=1.0)
    with pytest.raises(ConfigError, match="'sensitivity'"):
        calibrate_noise("laplace", epsilon=1.0)
    with pytest.raises(ConfigError, match="invalid mechanism 'vdp'"):
        calibrate_noise("vdp", epsilon=1.0, sensitivity=2.0)


def test_nested_release_blocks_print_one_row_per_leaf_never_a_dict(tmp_path):
    """Central DP's SecAgg+ trust block is a dict inside ``central``: each of its entries is
    a labelled row (it used to print as one raw Python dict)."""
    ledger = ledger_with(gaussian_event(), [1, 1])
    trust = {"secure_aggregation": "secaggplus (Flower's SecAgg+)",
             "threat_model": "honest-but-curious server", "max_dropouts": 2,
             "reconstruction": {"threshold": "n - 2", "shares": 5}}
    release = {"method": "dp-fedavg", "mechanism": "gaussian", "epsilon_per_round": 1.0,
               "central": {"rounds": 3, "trust": trust}}
    write_privacy_json(tmp_path / "privacy.json", ledger, release=release, delta=1e-5,
                       rounds=3)
    text = format_privacy_report(read_privacy_json(tmp_path / "privacy.json"))
    assert "{'" not in text and "{\"" not in text
    rows = {line.strip().split("  ")[0]: line for line in text.splitlines()}
    assert any(k.startswith("central: trust: threat_model") for k in rows)
    assert "honest-but-curious server" in text
    assert any(k.startswith("central: trust: reconstruction: threshold") for k in rows)
    assert any(k.startswith("central: rounds") for k in rows)
