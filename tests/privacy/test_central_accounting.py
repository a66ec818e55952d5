"""Central (user-level) DP accounting: DP-FedAvg's Poisson-sampled Gaussian."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privaterec.errors import ConfigError
from privaterec.privacy.audit import clopper_pearson_interval
from privaterec.privacy.central_accounting import (calibrate_noise_multiplier, central_epsilon,
                                        central_round_event)
from privaterec.privacy.ledger import PrivacyLedger, compose_events


SIGMA_1 = 3.7306316348159374  # analytic Gaussian, (1, 1e-5) at sensitivity 1


def test_unsampled_round_is_the_analytic_gaussian():
    """q = 1, T = 1 is the Gaussian mechanism: Balle & Wang (2018)'s analytic calibration
    gives sigma = 3.7306 for (1, 1e-5) at sensitivity 1 (pinned in test_formulas). Added
    or removed, one user moves the sum by C; replaced, by 2C, so replacement needs 2 sigma."""
    add_remove = central_epsilon(noise_multiplier=SIGMA_1, sampling_rate=1.0, rounds=1,
                                 delta=1e-5, neighbours="add_remove")
    assert add_remove == pytest.approx(1.0, abs=2e-3)
    replace = central_epsilon(noise_multiplier=2 * SIGMA_1, sampling_rate=1.0, rounds=1,
                              delta=1e-5)
    assert replace == pytest.approx(1.0, abs=2e-3)
    # T Gaussian rounds with multiplier z compose exactly to one with z/sqrt(T).
    eps4 = central_epsilon(noise_multiplier=4 * SIGMA_1, sampling_rate=1.0, rounds=4,
                           delta=1e-5)
    assert eps4 == pytest.approx(1.0, abs=2e-3)


def test_sampling_amplifies_and_rdp_is_looser_than_pld():
    kw = dict(noise_multiplier=1.0, rounds=20, delta=1e-5)
    pld = central_epsilon(sampling_rate=0.02, neighbours="add_remove", **kw)
    rdp = central_epsilon(sampling_rate=0.02, accountant="rdp", neighbours="add_remove", **kw)
    full = central_epsilon(sampling_rate=1.0, neighbours="add_remove", **kw)
    assert pld < rdp < full
    # Replacement costs more than add/remove; RDP has no replacement bound to offer.
    assert central_epsilon(sampling_rate=0.02, **kw) > pld
    with pytest.raises(ConfigError, match="replacement"):
        central_epsilon(sampling_rate=0.02, accountant="rdp", **kw)
    assert central_epsilon(noise_multiplier=2.0, sampling_rate=0.02, rounds=20,
                           delta=1e-5) < pld


def test_calibrated_noise_reaches_the_target_and_no_less_noise_would():
    z = calibrate_noise_multiplier(target_epsilon=4.0, sampling_rate=0.05, rounds=20,
                                   delta=1e-5)
    assert central_epsilon(noise_multiplier=z, sampling_rate=0.05, rounds=20,
                           delta=1e-5) <= 4.0
    assert central_epsilon(noise_multiplier=z * 0.99, sampling_rate=0.05, rounds=20,
                           delta=1e-5) > 4.0


@pytest.mark.parametrize("kwargs,match", [
    (dict(target_epsilon=0.0), "target_epsilon"),
    (dict(target_epsilon=1.0, sampling_rate=0.0), "sampling_rate"),
    (dict(target_epsilon=1.0, delta=1.0), "delta"),
])
def test_bad_parameters_name_themselves(kwargs, match):
    args = dict(sampling_rate=0.1, rounds=10, delta=1e-5) | kwargs
    with pytest.raises(ConfigError, match=match):
        calibrate_noise_multiplier(**args)


def test_noise_multiplier_below_the_floor_is_a_clear_error_not_a_huge_allocation():
    """z = 1e-4 once asked dp-accounting for 3.65 TiB; below MIN_NOISE_MULTIPLIER the
    accountant, the settings and the CLI refuse z with a message naming it."""
    from privaterec.method_settings import DPFedAvgSettings
    from privaterec.validators import MIN_NOISE_MULTIPLIER

    for z in (1e-4, MIN_NOISE_MULTIPLIER / 2):
        with pytest.raises(ConfigError, match="'noise_multiplier'.*z >= 0.1"):
            central_epsilon(noise_multiplier=z, sampling_rate=0.02, rounds=100, delta=1e-5)
        with pytest.raises(ConfigError, match="'noise_multiplier'.*--method fedrec"):
            DPFedAvgSettings(noise_multiplier=z)
    assert DPFedAvgSettings(noise_multiplier=MIN_NOISE_MULTIPLIER).noise_multiplier == 0.1
    # A target epsilon above what the floor gives is met by the floor (its epsilon is lower).
    z = calibrate_noise_multiplier(target_epsilon=1e4, sampling_rate=1.0, rounds=1, delta=1e-5)
    assert z == MIN_NOISE_MULTIPLIER
    assert central_epsilon(noise_multiplier=z, sampling_rate=1.0, rounds=1, delta=1e-5) < 1e4


def test_ledger_composes_the_round_event_as_the_accountant_does():
    event = central_round_event(noise_multiplier=1.0, sampling_rate=0.05, clip=0.1,
                                delta=1e-5)
    assert event.sampling_rate == 0.05 and event.noise_scale == pytest.approx(0.1)
    direct = central_epsilon(noise_multiplier=1.0, sampling_rate=0.05, rounds=50, delta=1e-5)
    assert compose_events([(event, 50)], delta=1e-5) == pytest.approx(direct, rel=1e-3)
    with pytest.raises(ConfigError, match="replacement"):  # RDP cannot: refused, not wrong
        compose_events([(event, 50)], delta=1e-5, composition="rdp")
    ledger = PrivacyLedger()
    ledger.record_many(["a", "b"], event, count=50)
    restored = PrivacyLedger.from_dict(ledger.to_dict())
    assert restored == ledger
    # User-level and one-click totals coincide: the sum covers any change of a user.
    assert ledger.user_epsilon("a", delta=1e-5, adjacency="user") == pytest.approx(
        ledger.user_epsilon("a", delta=1e-5))


def test_empirical_audit_of_one_sampled_gaussian_round():
    """Distinguishing game on one round: the target user's clipped update (norm C, on one
    coordinate) is in the sum with probability q, or absent. A threshold test's
    Clopper-Pearson lower bound on epsilon stays below the claimed epsilon."""
    q, z, clip, n = 0.5, 1.0, 1.0, 200_000
    rng = np.random.default_rng(0)
    present = clip * (rng.random(n) < q) + rng.normal(0, z * clip, n)
    absent = rng.normal(0, z * clip, n)
    delta = 1e-5
    claimed = central_epsilon(noise_multiplier=z, sampling_rate=q, rounds=1, delta=delta)
    best = 0.0
    for t in np.linspace(0.5, 3.5, 13):
        tp, fp = int((present > t).sum()), int((absent > t).sum())
        lo = clopper_pearson_interval(tp, n, alpha=0.05 / 13)[0]
        hi = clopper_pearson_interval(fp, n, alpha=0.05 / 13)[1]
        if lo > delta:
            best = max(best, math.log((lo - delta) / hi))
    assert 0.1 < best <= claimed
