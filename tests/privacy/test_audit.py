"""Tests of privaterec.privacy.audit: Clopper–Pearson bounds and empirical ε lower bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from privaterec.errors import ConfigError
from privaterec.privacy.audit import (
    audit_mechanism,
    clopper_pearson_interval,
    empirical_epsilon_lower_bound,
    epsilon_from_rates,
)
from privaterec.privacy.calibrate import calibrate
from privaterec.privacy.formulas import gaussian_sigma
from privaterec.privacy.mechanisms import add_noise
from privaterec.privacy.samplers import NoiseSource, SimulationNoise

TRIALS = 100_000


def sim(seed: int) -> SimulationNoise:
    return SimulationNoise(torch.Generator().manual_seed(seed))


def test_clopper_pearson_closed_forms():
    # k = 0: upper = 1 − (α/2)^{1/n}; k = n: lower = (α/2)^{1/n} (Beta(1, n) quantiles).
    lo, hi = clopper_pearson_interval(0, 10, 0.05)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 10), rel=1e-10)
    lo, hi = clopper_pearson_interval(20, 20, 0.05)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 20), rel=1e-10)
    # Standard value: k = 5, n = 10 → [0.1871, 0.8129] (R: binom.test(5, 10)$conf.int).
    lo, hi = clopper_pearson_interval(5, 10, 0.05)
    assert lo == pytest.approx(0.1871, abs=1e-4) and hi == pytest.approx(0.8129, abs=1e-4)
    lo, hi = clopper_pearson_interval(np.array([1, 3]), np.array([10, 10]), 0.1)
    assert lo.shape == (2,) and (lo < np.array([0.1, 0.3])).all() and (hi > [0.1, 0.3]).all()
    with pytest.raises(ConfigError):
        clopper_pearson_interval(11, 10)
    with pytest.raises(ConfigError, match="'alpha'"):
        clopper_pearson_interval(1, 10, alpha=0.0)


def test_clopper_pearson_coverage():
    # The upper end is a one-sided (1 − α/2) bound: P(p > upper) ≤ α/2.
    rng = np.random.default_rng(0)
    p, n = 0.03, 200
    k = rng.binomial(n, p, size=20_000)
    _, hi = clopper_pearson_interval(k, np.full_like(k, n), 0.1)
    assert (p > hi).mean() <= 0.05


def test_epsilon_from_rates():
    q = 1 / (1 + math.e)  # randomized response with ε = 1 has FPR = FNR = 1/(1 + e)
    assert epsilon_from_rates(q, q) == pytest.approx(1.0)
    assert epsilon_from_rates(0.5, 0.5) == 0.0
    assert epsilon_from_rates(0.9, 0.9) == 0.0  # a test worse than chance proves nothing
    assert epsilon_from_rates(0.1, 0.5, delta=0.1) == pytest.approx(math.log(0.4 / 0.1))


def test_empirical_bound_with_fixed_threshold():
    b = 1.0  # Laplace mechanism with ε = 1 on neighbouring inputs 0 and 1
    d = sim(1).draw((TRIALS,), mechanism="laplace", scale=b, dtype=torch.float64)
    dp = 1 + sim(2).draw((TRIALS,), mechanism="laplace", scale=b, dtype=torch.float64)
    # For t ≥ 1, ln((1 − FNR)/FPR) = ε exactly; only sampling error lowers the bound.
    eps = empirical_epsilon_lower_bound(d, dp, 1.0, alpha=0.05)
    assert 0.8 < eps <= 1.0
    eps_fn = empirical_epsilon_lower_bound(d, dp, lambda o: o > 1.0, alpha=0.05)
    assert eps_fn == eps
    with pytest.raises(ConfigError, match="threshold"):
        empirical_epsilon_lower_bound(d[:, None], dp[:, None], 1.0)


def laplace_claimed(eps: float, noise_factor: float = 1.0):
    """Laplace mechanism claiming ε for Δ₁ = 1; noise_factor < 1 simulates a calibration bug."""
    def mech(x: torch.Tensor, noise: NoiseSource) -> torch.Tensor:
        return x + noise.draw(x.shape, mechanism="laplace", scale=noise_factor / eps,
                              dtype=x.dtype)
    return mech


def test_audit_laplace_mechanism_is_consistent_with_its_claim():
    x, xp = torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)

    calibration = calibrate(mechanism="laplace", epsilon=1.0, sensitivity=1.0)

    def mech(batch, noise):
        return add_noise(batch, calibration, noise=noise)

    result = audit_mechanism(mech, x, xp, trials=TRIALS, noise=sim(3))
    assert 0.3 < result.epsilon_lower_bound <= 1.0
    assert result.n_d == result.n_d_prime == TRIALS // 2


def test_audit_catches_laplace_with_too_little_noise():
    x, xp = torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    result = audit_mechanism(laplace_claimed(1.0, noise_factor=0.1), x, xp, trials=TRIALS,
                             noise=sim(4))
    assert result.epsilon_lower_bound > 1.0  # the audit fails this mechanism
    # The same mechanism passes if it claims its true ε = 10.
    assert result.epsilon_lower_bound <= 10.0


def test_audit_gaussian_mechanism_and_broken_gaussian():
    x = torch.zeros(4, dtype=torch.float64)
    xp = x.clone()
    xp[2] = 1.0  # L2 distance 1 = sensitivity
    delta = 1e-5

    calibration = calibrate(mechanism="gaussian", epsilon=1.0, delta=delta, sensitivity=1.0,
                            dimension=4)

    def mech(batch, noise):
        return add_noise(batch, calibration, noise=noise)

    good = audit_mechanism(mech, x, xp, trials=TRIALS, noise=sim(5), delta=delta)
    assert 0.2 < good.epsilon_lower_bound <= 1.0

    sigma = gaussian_sigma(epsilon=1.0, delta=delta, sensitivity_l2=1.0) / 10

    def broken(batch, noise):
        return batch + noise.draw(batch.shape, mechanism="gaussian", scale=sigma,
                                  dtype=batch.dtype)

    bad = audit_mechanism(broken, x, xp, trials=TRIALS, noise=sim(6), delta=delta)
    assert bad.epsilon_lower_bound > 1.0


def test_audit_direction_and_validation():
    # A mechanism whose output decreases with the input: the audit picks direction "less".
    x, xp = torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)

    def flipped(batch, noise):
        return -laplace_claimed(1.0, noise_factor=0.1)(batch, noise)

    result = audit_mechanism(flipped, x, xp, trials=20_000, noise=sim(7),
                             statistic=lambda o: o[:, 0])
    assert result.direction == "less" and result.epsilon_lower_bound > 1.0
    with pytest.raises(ConfigError, match="differ"):
        audit_mechanism(laplace_claimed(1.0), x, x, trials=100, noise=sim(8))
    with pytest.raises(ConfigError, match="'trials'"):
        audit_mechanism(laplace_claimed(1.0), x, xp, trials=2, noise=sim(8))
