"""Tests of privaterec.privacy.formulas (pure math)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from privaterec.errors import ConfigError
from privaterec.privacy.formulas import (
    PAPER_SENSITIVITY_WARNING,
    amplified_budget,
    classical_gaussian_sigma,
    dpa_sensitivity,
    fednewsrec_coordinate_epsilon,
    fednewsrec_update_epsilon,
    gaussian_sigma,
    laplace_scale,
    padding_amplification,
)


# --- independent reference: Balle & Wang 2018, Theorem 8 (exact Gaussian condition) --------

def bw_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """δ(σ, ε) = Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ)  (Balle & Wang 2018, Thm 8)."""
    a = sensitivity / (2 * sigma)
    b = epsilon * sigma / sensitivity
    return float(stats.norm.cdf(a - b) - math.exp(epsilon) * stats.norm.cdf(-a - b))


def bw_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest σ with bw_delta ≤ δ, by bisection in log σ (δ(σ) is decreasing)."""
    lo, hi = math.log(1e-4), math.log(1e5)
    for _ in range(200):
        mid = (lo + hi) / 2
        if bw_delta(math.exp(mid), epsilon, sensitivity) > delta:
            lo = mid
        else:
            hi = mid
    return math.exp(hi)


def test_laplace_scale_is_sensitivity_over_epsilon():
    assert laplace_scale(epsilon=0.5, sensitivity_l1=2.0) == pytest.approx(4.0, rel=1e-15)
    assert laplace_scale(epsilon=3.0, sensitivity_l1=0.3) == pytest.approx(0.1, rel=1e-15)
    assert laplace_scale(epsilon=math.inf, sensitivity_l1=2.0) == 0.0


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_laplace_scale_rejects_bad_epsilon(bad):
    with pytest.raises(ConfigError, match="'epsilon'"):
        laplace_scale(epsilon=bad, sensitivity_l1=1.0)


def test_laplace_scale_rejects_negative_sensitivity():
    with pytest.raises(ConfigError, match="'sensitivity_l1'"):
        laplace_scale(epsilon=1.0, sensitivity_l1=-1.0)


def test_gaussian_sigma_pinned_value():
    # σ(ε=1, δ=1e-5, Δ=1) of the analytic Gaussian mechanism = 3.73063163...; the value is
    # what dp_accounting 0.6.0 `get_sigma_gaussian(1, 1e-5)` returns and what the independent
    # bisection on Balle & Wang (2018) Thm 8 above gives. The classical bound gives 4.8448.
    assert gaussian_sigma(epsilon=1.0, delta=1e-5, sensitivity_l2=1.0) == pytest.approx(
        3.7306316348, rel=1e-9)
    assert bw_sigma(1.0, 1e-5) == pytest.approx(3.7306316348, rel=1e-9)


@pytest.mark.parametrize("epsilon,delta,sens", [(0.1, 1e-5, 1.0), (0.5, 1e-6, 2.0),
                                                (1.0, 1e-3, math.sqrt(2)), (4.0, 1e-5, 0.3),
                                                (10.0, 1e-8, 1.0)])
def test_gaussian_sigma_matches_independent_balle_wang(epsilon, delta, sens):
    sigma = gaussian_sigma(epsilon=epsilon, delta=delta, sensitivity_l2=sens)
    assert sigma == pytest.approx(bw_sigma(epsilon, delta, sens), rel=1e-7)
    # σ satisfies the exact condition and is (nearly) the smallest such σ.
    assert bw_delta(sigma, epsilon, sens) <= delta * (1 + 1e-6)
    assert bw_delta(sigma * 0.999, epsilon, sens) > delta


@pytest.mark.parametrize("epsilon", [0.05, 0.3, 0.9])
def test_analytic_sigma_smaller_than_classical(epsilon):
    for delta in (1e-3, 1e-5, 1e-8):
        analytic = gaussian_sigma(epsilon=epsilon, delta=delta, sensitivity_l2=1.0)
        classical = classical_gaussian_sigma(epsilon=epsilon, delta=delta, sensitivity_l2=1.0)
        assert classical == pytest.approx(math.sqrt(2 * math.log(1.25 / delta)) / epsilon)
        assert analytic < classical


def test_classical_sigma_rejected_for_large_epsilon_and_really_invalid():
    with pytest.raises(ConfigError, match="'epsilon'"):
        classical_gaussian_sigma(epsilon=1.0, delta=1e-5, sensitivity_l2=1.0)
    # With allow_invalid the formula is returned, and at ε = 10 it is too small: the exact
    # δ of that σ at ε = 10 exceeds the target 1e-5 (why docs/privacy.md#gaussian-calibration
    # forbids it).
    sigma = classical_gaussian_sigma(epsilon=10.0, delta=1e-5, sensitivity_l2=1.0,
                                     allow_invalid=True)
    assert bw_delta(sigma, 10.0) > 1e-5
    assert sigma < gaussian_sigma(epsilon=10.0, delta=1e-5, sensitivity_l2=1.0)


def test_gaussian_sigma_edge_cases_and_validation():
    assert gaussian_sigma(epsilon=math.inf, delta=1e-5, sensitivity_l2=1.0) == 0.0
    assert gaussian_sigma(epsilon=1.0, delta=1e-5, sensitivity_l2=0.0) == 0.0
    for bad in (0.0, 1.0, -1e-5):
        with pytest.raises(ConfigError, match="'delta'"):
            gaussian_sigma(epsilon=1.0, delta=bad, sensitivity_l2=1.0)
    with pytest.raises(ConfigError, match="'epsilon'"):
        gaussian_sigma(epsilon=0.0, delta=1e-5, sensitivity_l2=1.0)


@pytest.mark.parametrize("epsilon,delta,p", list(itertools.product(
    [0.01, 0.5, 1.0, 3.0, 8.0], [0.0, 1e-6, 1e-3], [0.0, 0.1, 0.5, 0.9])))
def test_amplification_formulas_and_round_trip(epsilon, delta, p):
    eps_base, delta_base = amplified_budget(epsilon=epsilon, delta=delta, padding_p=p)
    # The direct formulas of docs/privacy.md#padding-amplification / PrivateRec Alg. 2 line 9.
    assert eps_base == pytest.approx(math.log((math.exp(epsilon) - p) / (1 - p)), rel=1e-12)
    assert delta_base == pytest.approx(delta / (1 - p), rel=1e-15, abs=0)
    assert eps_base >= epsilon
    eps_back, delta_back = padding_amplification(epsilon_base=eps_base, delta_base=delta_base,
                                                 padding_p=p)
    assert eps_back == pytest.approx(epsilon, rel=1e-12)
    assert delta_back == pytest.approx(delta, rel=1e-12, abs=1e-300)
    assert math.log(1 + (1 - p) * (math.exp(eps_base) - 1)) == pytest.approx(eps_back, rel=1e-12)


def test_amplification_identity_at_p0_and_strict_gain():
    assert amplified_budget(epsilon=0.7, delta=1e-5, padding_p=0.0) == (0.7, 1e-5)
    assert padding_amplification(epsilon_base=0.7, delta_base=1e-5, padding_p=0.0) == (0.7, 1e-5)
    eps, _ = padding_amplification(epsilon_base=2.0, delta_base=0.0, padding_p=0.3)
    assert eps < 2.0


def test_amplification_stable_for_extreme_epsilon():
    eps_base, _ = amplified_budget(epsilon=1000.0, delta=0.0, padding_p=0.5)
    assert eps_base == pytest.approx(1000.0 + math.log(2.0), rel=1e-14)  # e^ε ≫ p
    eps, _ = padding_amplification(epsilon_base=1000.0, delta_base=0.0, padding_p=0.5)
    assert eps == pytest.approx(1000.0 - math.log(2.0), rel=1e-14)
    eps_base, _ = amplified_budget(epsilon=1e-12, delta=0.0, padding_p=0.5)
    assert eps_base == pytest.approx(2e-12, rel=1e-6)  # ε′ ≈ ε/(1 − p) for small ε
    assert amplified_budget(epsilon=math.inf, delta=0.0, padding_p=0.2)[0] == math.inf


def test_amplification_validation():
    with pytest.raises(ConfigError, match="'padding_p'"):
        amplified_budget(epsilon=1.0, delta=0.0, padding_p=1.0)
    with pytest.raises(ConfigError, match="'padding_p'"):
        padding_amplification(epsilon_base=1.0, delta_base=0.0, padding_p=-0.1)
    with pytest.raises(ConfigError, match="'delta'"):
        amplified_budget(epsilon=1.0, delta=0.6, padding_p=0.5)  # δ′ = 1.2


def test_dpa_sensitivity_true_values_are_simplex_diameters():
    assert dpa_sensitivity("l1") == 2.0
    assert dpa_sensitivity("l2") == pytest.approx(math.sqrt(2.0), rel=1e-15)
    # Independent check: softmax vectors live on the simplex; vertices attain the bound and
    # random pairs never exceed it.
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=5.0, size=(2, 2000, 16))
    a = np.exp(logits - logits.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    assert np.abs(a[0] - a[1]).sum(-1).max() <= 2.0
    assert np.linalg.norm(a[0] - a[1], axis=-1).max() <= math.sqrt(2.0)
    e = np.eye(16)
    assert np.abs(e[0] - e[1]).sum() == 2.0
    assert np.linalg.norm(e[0] - e[1]) == pytest.approx(math.sqrt(2.0))


def test_dpa_sensitivity_paper_mode_and_validation():
    assert dpa_sensitivity("l2", "paper") == 1.0
    assert dpa_sensitivity("l1", "paper", theta=0.5) == 0.5
    assert "NOT" in PAPER_SENSITIVITY_WARNING
    with pytest.raises(ConfigError, match="'norm'"):
        dpa_sensitivity("linf")
    with pytest.raises(ConfigError, match="'mode'"):
        dpa_sensitivity("l2", "loose")


def test_fednewsrec_epsilons_per_coordinate_and_per_update():
    # Paper settings (FedNewsRec Sec. 4.1): δ = 0.005, λ = 0.015 → 2δ/λ = 2/3 per coordinate.
    per_coordinate = fednewsrec_coordinate_epsilon(clip_bound=0.005, noise_scale=0.015)
    assert per_coordinate == pytest.approx(2 / 3)
    assert fednewsrec_update_epsilon(clip_bound=0.005, noise_scale=0.015,
                                     dimension=1_000_000) == pytest.approx(2 / 3 * 1e6)
    assert fednewsrec_coordinate_epsilon(clip_bound=0.005, noise_scale=0.0) == math.inf
    with pytest.raises(ConfigError, match="'dimension'"):
        fednewsrec_update_epsilon(clip_bound=0.005, noise_scale=0.015, dimension=0)
