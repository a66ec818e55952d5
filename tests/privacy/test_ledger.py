"""Tests of privaterec.privacy.ledger: events, composition, ledger, serialisation."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from scipy import stats

from privaterec.errors import CheckpointError, ConfigError, PrivacyBudgetExceeded
from privaterec.privacy.ledger import (
    EpsilonDeltaDpEvent,
    PrivacyEvent,
    PrivacyLedger,
    compose_events,
)

SIGMA_1_1E5 = 3.7306316348159374  # analytic Gaussian σ(ε=1, δ=1e-5), see test_formulas


def lap(eps: float, *, phase: str = "train", sensitivity: float = 1.0, **kw) -> PrivacyEvent:
    return PrivacyEvent(mechanism="laplace", epsilon=eps, noise_scale=sensitivity / eps,
                        sensitivity=sensitivity, phase=phase, **kw)


def gauss(sigma: float, eps: float = 1.0, delta: float = 1e-5,
          phase: str = "train") -> PrivacyEvent:
    return PrivacyEvent(mechanism="gaussian", epsilon=eps, delta=delta, noise_scale=sigma,
                        sensitivity=1.0, phase=phase)


# --- independent references -------------------------------------------------------------------

def bisect_epsilon(delta_of, delta: float, hi: float) -> float:
    lo = 0.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if delta_of(mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def rr_k_fold_epsilon(eps0: float, k: int, delta: float) -> float:
    """Exact ε(δ) of k-fold binary randomized response with ε0 (Kairouz et al. 2015):
    privacy loss ε0(k − 2j), j ~ Binomial(k, 1/(1+e^ε0)); δ(ε) = E[(1 − e^{ε−L})_+]."""
    j = np.arange(k + 1)
    p = stats.binom.pmf(j, k, 1 / (1 + math.exp(eps0)))
    loss = eps0 * (k - 2 * j)
    return bisect_epsilon(lambda e: np.sum(p * np.clip(-np.expm1(e - loss), 0, None)), delta,
                          k * eps0)


def laplace_k_fold_bracket(eps0: float, k: int, delta: float, h: float = 2e-5,
                           cells: int = 100_000) -> tuple[float, float]:
    """Lower/upper bounds on ε(δ) of k Laplace(1/ε0) releases (sensitivity 1), from an own
    discretisation of the privacy loss L(x) = ε0(|x−1| − |x|) under x ~ Lap(0, 1/ε0)
    (atoms +ε0 w.p. 1/2 and −ε0 w.p. e^{−ε0}/2, continuous in between), rounded down / up to
    a grid of width h and composed k times by FFT."""
    b = 1 / eps0
    xs = np.linspace(0.0, 1.0, cells + 1)
    mass = np.diff(1 - 0.5 * np.exp(-xs / b))
    m = int(math.ceil(eps0 / h)) + 1
    out = []
    for loss, up in ((eps0 * (1 - 2 * xs[1:]), False), (eps0 * (1 - 2 * xs[:-1]), True)):
        idx = (np.ceil(loss / h - 1e-9) if up else np.floor(loss / h + 1e-9)).astype(int) + m
        pmf = np.zeros(2 * m + 1)
        np.add.at(pmf, idx, mass)
        pmf[round(eps0 / h) + m] += 0.5
        pmf[-round(eps0 / h) + m] += 0.5 * math.exp(-eps0)
        size = 1 << int(math.ceil(math.log2(k * 2 * m + 1)))
        full = np.clip(np.fft.irfft(np.fft.rfft(pmf, size) ** k, size)[:k * 2 * m + 1], 0, None)
        values = (np.arange(full.size) - k * m) * h

        def delta_of(e, full=full, values=values):
            sel = values > e
            return np.sum(full[sel] * -np.expm1(e - values[sel]))

        out.append(bisect_epsilon(delta_of, delta, k * eps0))
    return out[0], out[1]


def gaussian_exact_epsilon(sigma: float, delta: float) -> float:
    """ε of N(0,σ²) vs N(1,σ²) at δ (Balle & Wang 2018 Thm 8), by bisection."""
    def delta_of(e):
        return stats.norm.cdf(0.5 / sigma - e * sigma) - math.exp(e) * stats.norm.cdf(
            -0.5 / sigma - e * sigma)
    return bisect_epsilon(delta_of, delta, 100.0)


# --- events ------------------------------------------------------------------------------------

def test_event_to_dp_event_mapping():
    assert lap(0.5).to_dp_event() == dp_event.LaplaceDpEvent(noise_multiplier=2.0)
    assert gauss(2.0).to_dp_event() == dp_event.GaussianDpEvent(noise_multiplier=2.0)
    ex = PrivacyEvent(mechanism="exponential", epsilon=0.3, phase="train")
    assert ex.to_dp_event() == dp_event.RandomizedResponseDpEvent(
        noise_parameter=2 / (1 + math.exp(0.3)), num_buckets=2)
    approx = PrivacyEvent(mechanism="epsilon_delta", epsilon=0.3, delta=1e-6, phase="serve")
    assert approx.to_dp_event() == EpsilonDeltaDpEvent(epsilon=0.3, delta=1e-6)
    assert isinstance(lap(math.inf).to_dp_event(), dp_event.NonPrivateDpEvent)
    nothing = PrivacyEvent(mechanism="exponential", epsilon=0.0, phase="train")
    assert isinstance(nothing.to_dp_event(), dp_event.NoOpDpEvent)


def test_event_validation():
    with pytest.raises(ConfigError, match="'epsilon'"):
        PrivacyEvent(mechanism="laplace", epsilon=1.0, noise_scale=2.0, sensitivity=1.0,
                     phase="train")  # Δ/b = 0.5, not 1
    with pytest.raises(ConfigError, match="'phase'"):
        PrivacyEvent(mechanism="exponential", epsilon=1.0, phase="eval")
    with pytest.raises(ConfigError, match="'delta'"):
        PrivacyEvent(mechanism="exponential", epsilon=1.0, delta=1.0, phase="train")
    with pytest.raises(ConfigError, match="noise_scale/sensitivity"):
        PrivacyEvent(mechanism="gaussian", epsilon=1.0, delta=1e-5, phase="train")
    with pytest.raises(ConfigError, match="'delta'"):
        PrivacyEvent(mechanism="gaussian", epsilon=1.0, noise_scale=1.0, sensitivity=1.0,
                     phase="train")
    assert lap(0.5) == lap(0.5) and hash(lap(0.5)) == hash(lap(np.float64(0.5)))


# --- composition --------------------------------------------------------------------------------

def test_single_laplace_gives_its_epsilon():
    assert compose_events([(lap(0.7), 1)], delta=0.0, composition="pld") == 0.7
    assert compose_events([(lap(0.7), 1)], delta=0.0, composition="rdp") == 0.7
    # Through the PLD machinery at a tiny δ (pessimistic grid of 1e-4).
    assert compose_events([(lap(0.7), 1)], delta=1e-10, composition="pld") == pytest.approx(
        0.7, abs=2e-4)
    # A Gaussian has no finite ε at δ = 0.
    assert compose_events([(gauss(SIGMA_1_1E5), 1)], delta=0.0, composition="pld") == math.inf


def test_k_laplace_basic_pld_rdp_pinned():
    k, eps0, delta = 100, 0.1, 1e-5
    events = [(lap(eps0), k)]
    basic = compose_events(events, delta=delta, composition="basic")
    pld = compose_events(events, delta=delta, composition="pld")
    rdp = compose_events(events, delta=delta, composition="rdp")
    assert basic == pytest.approx(k * eps0)
    lo, hi = laplace_k_fold_bracket(eps0, k, delta)
    assert hi - lo < 2e-4 and lo == pytest.approx(4.2203, abs=1e-3)
    assert lo - 1e-9 <= pld <= hi + 1e-3  # PLD is pessimistic on a 1e-4 grid
    # Laplace is dominated by randomized response with the same ε (exact, independent).
    assert pld < rr_k_fold_epsilon(eps0, k, delta)
    # Advanced composition (Dwork, Rothblum & Vadhan 2010) is a looser upper bound.
    advanced = math.sqrt(2 * k * math.log(1 / delta)) * eps0 + k * eps0 * math.expm1(eps0)
    assert pld < rdp < advanced < basic


def test_pure_epsilon_events_compose_like_randomized_response():
    ex = PrivacyEvent(mechanism="exponential", epsilon=0.5, phase="train")
    exact = rr_k_fold_epsilon(0.5, 20, 1e-5)
    assert exact == pytest.approx(9.8594, abs=1e-3)
    pld = compose_events([(ex, 20)], delta=1e-5, composition="pld")
    assert pld == pytest.approx(exact, abs=1e-6)
    assert compose_events([(ex, 20)], delta=1e-5, composition="rdp") >= exact


def test_gaussian_pld_is_exact_and_rdp_matches_mironov():
    k, delta = 50, 1e-5
    events = [(gauss(SIGMA_1_1E5), k)]
    exact = gaussian_exact_epsilon(SIGMA_1_1E5 / math.sqrt(k), delta)  # k Gaussians = σ/√k
    assert exact == pytest.approx(9.3590, abs=1e-3)
    assert compose_events(events, delta=delta, composition="pld") == pytest.approx(exact, abs=1e-7)
    # Mixed with another mechanism the Gaussian goes through the discretised PLD.
    mixed = compose_events(events + [(lap(1e-3), 1)], delta=delta, composition="pld")
    assert exact < mixed < exact + 5e-3
    # RDP of the Gaussian mechanism is α/(2σ²) per release (Mironov 2017, Prop. 7); converted
    # with Canonne, Kamath & Steinke 2020 Prop. 12 over dp_accounting's default orders.
    orders = np.array([1 + x / 10 for x in range(1, 100)] + list(range(11, 64))
                      + [128, 256, 512, 1024], dtype=float)
    rdp = k * orders / (2 * SIGMA_1_1E5**2)
    conv = rdp + np.log1p(-1 / orders) - np.log(delta * orders) / (orders - 1)
    mironov = rdp + math.log(1 / delta) / (orders - 1)  # Mironov 2017 Prop. 3 (looser)
    value = compose_events(events, delta=delta, composition="rdp")
    assert value == pytest.approx(conv[orders > 1.01].min(), rel=1e-9)
    assert exact < value <= mironov.min()
    # basic composition cannot certify δ = 1e-5 after 50 releases at δ = 1e-5 each.
    assert compose_events(events, delta=delta, composition="basic") == math.inf
    assert compose_events(events, delta=k * delta, composition="basic") == pytest.approx(k * 1.0)


def test_pld_agrees_with_dp_accounting_accountant():
    events = [(lap(0.2), 30), (gauss(2.0), 10), (lap(0.05, sensitivity=3.0), 7)]
    acc = pld_privacy_accountant.PLDAccountant()
    for e, c in events:
        acc.compose(e.to_dp_event(), c)
    assert compose_events(events, delta=1e-6, composition="pld") == pytest.approx(
        acc.get_epsilon(1e-6), rel=1e-6)


def test_approximate_dp_events_pld_and_rdp_rejects():
    approx = PrivacyEvent(mechanism="epsilon_delta", epsilon=0.8, delta=1e-7, phase="serve")
    single = compose_events([(approx, 1)], delta=1e-6, composition="pld")
    assert single == pytest.approx(0.8, abs=2e-4)
    assert compose_events([(approx, 1)], delta=1e-8, composition="pld") == math.inf
    with pytest.raises(ConfigError, match="composition='rdp'"):
        compose_events([(approx, 1)], delta=1e-6, composition="rdp")
    with pytest.raises(ConfigError, match="composition"):
        compose_events([(approx, 1)], delta=1e-6, composition="advanced")  # type: ignore[arg-type]


# --- the ledger ----------------------------------------------------------------------------------

def test_ledger_records_compactly_and_per_phase():
    ledger = PrivacyLedger()
    train, serve = lap(0.1), lap(0.5, phase="serve")
    users = list(range(10_000))
    for _ in range(100):
        ledger.record_many(users, train)
    ledger.record("alice", serve, count=3)
    ledger.record(7, serve)
    assert len(ledger) == 10_001 and "alice" in ledger and 7 in ledger
    assert ledger.events(7, phase="train") == [(train, 100)]
    assert ledger.events(7) == [(train, 100), (serve, 1)]
    assert len(ledger.to_dict()["events"]) == 2  # two distinct events stored once
    assert ledger.user_epsilon(7, delta=0.0, composition="basic") == pytest.approx(10.5)
    assert ledger.user_epsilon(7, delta=0.0, phase="serve") == pytest.approx(0.5)
    assert ledger.user_epsilon("alice", delta=0.0, phase="train") == 0.0
    assert ledger.user_epsilon("bob", delta=1e-5, composition="pld") == 0.0
    assert ledger.user_budget("alice") == (pytest.approx(1.5), 0.0)
    with pytest.raises(TypeError):
        ledger.record(1.5, train)  # type: ignore[arg-type]


def test_ledger_epsilons_groups_users_and_is_fast():
    ledger = PrivacyLedger()
    rng = np.random.default_rng(0)
    event = lap(0.1)
    rounds = rng.integers(1, 41, size=10_000)  # 40 distinct multisets over 10^4 users
    for r in range(1, 41):
        ledger.record_many([int(u) for u in np.flatnonzero(rounds == r)], event, count=r)
    start = time.perf_counter()
    eps = ledger.epsilons(delta=1e-5, composition="pld")
    elapsed = time.perf_counter() - start
    assert len(eps) == 10_000 and elapsed < 2.5
    for u in (0, 17, 9999):
        assert eps[u] == pytest.approx(
            compose_events([(event, int(rounds[u]))], delta=1e-5, composition="pld"))
    assert max(eps.values()) == pytest.approx(compose_events([(event, 40)], delta=1e-5))


def test_report_contents_and_warnings():
    ledger = PrivacyLedger()
    ledger.record_many(["a", "b", "c"], lap(0.2), count=5)
    ledger.record("a", lap(0.3, phase="serve"), count=2)
    paper = PrivacyEvent(mechanism="gaussian", epsilon=1.0, delta=1e-5, noise_scale=4.84,
                         sensitivity=1.0, phase="serve", valid=False,
                         note="DPA with the paper's sensitivity")
    ledger.record("b", paper)
    report = ledger.report(delta=1e-5, composition="pld")
    json.dumps(report)
    assert report["composition"] == "pld" and report["num_users"] == 3
    train = report["phases"]["train"]
    assert train["num_users"] == 3 and train["basic_epsilon_max"] == pytest.approx(1.0)
    assert train["epsilon_max"] == pytest.approx(ledger.user_epsilon("c", delta=1e-5,
                                                                     composition="pld"))
    assert train["epsilon_median"] == train["epsilon_max"]  # identical users
    serve = report["phases"]["serve"]
    assert serve["num_users"] == 2 and serve["basic_delta_max"] == 1e-5
    total = report["phases"]["total"]
    assert total["epsilon_max"] == pytest.approx(max(
        ledger.user_epsilon(u, delta=1e-5, composition="pld") for u in "abc"))
    assert total["releases_max"] == 7
    mech = {(m["mechanism"], m["phase"], m["epsilon"]): m for m in report["mechanisms"]}
    assert mech[("laplace", "train", 0.2)]["users"] == 3
    assert mech[("laplace", "train", 0.2)]["releases"] == 15
    assert len(report["warnings"]) == 1 and "does NOT hold" in report["warnings"][0]
    assert "paper's sensitivity" in report["warnings"][0]


def test_spend_enforces_cap():
    ledger = PrivacyLedger()
    for _ in range(3):
        ledger.spend("u", lap(0.3), epsilon_cap=1.0, delta=0.0)
    with pytest.raises(PrivacyBudgetExceeded, match="epsilon_cap=1"):
        ledger.spend("u", lap(0.3), epsilon_cap=1.0, delta=0.0)
    assert ledger.events("u") == [(lap(0.3), 3)]  # the refused release was not recorded


def test_spend_with_pld_admits_more_releases_than_basic():
    event = lap(0.05)
    accepted = {}
    for composition in ("basic", "pld"):
        ledger = PrivacyLedger()
        with pytest.raises(PrivacyBudgetExceeded):
            for _ in range(200):
                ledger.spend("u", event, epsilon_cap=1.0, delta=1e-5, composition=composition)
        accepted[composition] = ledger.events("u")[0][1]
    assert accepted["basic"] == 20
    n = accepted["pld"]
    assert n > 20
    assert compose_events([(event, n)], delta=1e-5) <= 1.0 < compose_events([(event, n + 1)],
                                                                             delta=1e-5)


def test_round_trip_json_exact():
    ledger = PrivacyLedger(value_discretization_interval=2e-4)
    ledger.record_many(["u1", 2, "u3"], lap(0.25), count=4)
    ledger.record(2, gauss(SIGMA_1_1E5, phase="serve"))
    ledger.record("u3", lap(math.inf, phase="serve"))
    ledger.record("u1", PrivacyEvent(mechanism="laplace", epsilon=0.5, noise_scale=4.0,
                                     sensitivity=2.0, dimension=400, phase="train",
                                     coordinate_epsilon=0.00125, note="fednewsrec"))
    text = json.dumps(ledger.to_dict(), allow_nan=False)  # strict JSON, inf encoded
    restored = PrivacyLedger.from_dict(json.loads(text))
    assert restored == ledger
    assert restored.to_dict() == ledger.to_dict()
    assert restored.users == ["u1", 2, "u3"]
    assert restored.user_epsilon("u3", delta=1e-5) == math.inf
    assert restored.user_epsilon("u1", delta=1e-5, composition="pld") == \
        ledger.user_epsilon("u1", delta=1e-5, composition="pld")
    other = PrivacyLedger.from_dict(json.loads(text))
    other.record("u1", lap(0.25))
    assert other != ledger


def test_from_dict_rejects_malformed():
    good = PrivacyLedger()
    good.record("a", lap(1.0))
    data = good.to_dict()
    with pytest.raises(CheckpointError, match="not a privacy ledger"):
        PrivacyLedger.from_dict({"events": []})
    with pytest.raises(CheckpointError, match="version"):
        PrivacyLedger.from_dict({**data, "version": 99})
    with pytest.raises(CheckpointError, match="bad record"):
        PrivacyLedger.from_dict({**data, "records": [["a", [[5, 1]]]]})
    with pytest.raises(CheckpointError, match="malformed"):
        PrivacyLedger.from_dict({**data, "events": [{"mechanism": "laplace", "epsilon": 1.0,
                                                     "phase": "train"}]})
