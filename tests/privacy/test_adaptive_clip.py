"""Adaptive clipping's accounting: the noise split and its equivalence to one Gaussian
(Andrew, Thakkar, McMahan & Ramaswamy, NeurIPS 2021)."""

from __future__ import annotations

import math

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation

from privaterec.errors import ConfigError
from privaterec.privacy.adaptive_clip import (AdaptiveClipping, adaptive_round_event,
                                              clip_indicators, equivalent_noise_multiplier,
                                              update_noise_multiplier)
from privaterec.privacy.central_accounting import central_round_event


def test_the_noise_split_is_pinned_and_inverts():
    # z = 1, sigma_b = 2: z_update = (1 - 1/16)^(-1/2) = 4/sqrt(15).
    assert update_noise_multiplier(noise_multiplier=1.0, count_stddev=2.0) == pytest.approx(
        4 / math.sqrt(15), rel=1e-12)
    # The paper's default sigma_b = m/20 at m = 100 expected clients, z = 1: 1/sqrt(0.99).
    assert update_noise_multiplier(noise_multiplier=1.0, count_stddev=5.0) == pytest.approx(
        1.0050378152592121, rel=1e-12)
    for z in (0.3, 1.0, 7.5):
        for share in (0.51, 0.75, 3.0):
            sigma_b = share * z
            z_update = update_noise_multiplier(noise_multiplier=z, count_stddev=sigma_b)
            assert z_update > z
            assert equivalent_noise_multiplier(update_noise_multiplier=z_update,
                                               count_stddev=sigma_b) == pytest.approx(z)
            # One user's contribution divided by the noise scales: the update at norm C over
            # z_update*C and the centred indicator 1/2 over sigma_b lie within 1/z of the
            # origin (where an absent user sits): DP-FedAvg's release at multiplier z.
            assert math.hypot(1 / z_update, 0.5 / sigma_b) == pytest.approx(1 / z)


@pytest.mark.parametrize("sigma_b", [0.5, 0.2, 0.0, -1.0, math.inf])
def test_a_count_noise_that_cannot_be_split_is_refused(sigma_b):
    with pytest.raises(ConfigError, match="clip_count_stddev|clip-count-stddev"):
        update_noise_multiplier(noise_multiplier=1.0, count_stddev=sigma_b)


@pytest.mark.parametrize("neighbours", [NeighboringRelation.REPLACE_ONE,
                                        NeighboringRelation.ADD_OR_REMOVE_ONE])
def test_the_two_gaussian_releases_compose_to_one_of_multiplier_z(neighbours):
    """The identity checked by the accountant itself (q = 1): the update's Gaussian at z_update
    composed with the count's Gaussian has the epsilon of one Gaussian at z. In
    dp_accounting's units (add/remove sensitivity 1, replace 2) the centred indicator, of
    add/remove sensitivity 1/2, is a Gaussian of multiplier sigma_b / (1/2) = 2 sigma_b."""
    z, sigma_b, delta = 1.3, 1.0, 1e-5
    z_update = update_noise_multiplier(noise_multiplier=z, count_stddev=sigma_b)

    def epsilon(event: dp_event.DpEvent) -> float:
        accountant = pld_privacy_accountant.PLDAccountant(neighbours,
                                                          value_discretization_interval=1e-3)
        return float(accountant.compose(event).get_epsilon(delta))

    pair = epsilon(dp_event.ComposedDpEvent([dp_event.GaussianDpEvent(z_update),
                                             dp_event.GaussianDpEvent(2 * sigma_b)]))
    single = epsilon(dp_event.GaussianDpEvent(z))
    assert pair == pytest.approx(single, rel=5e-3)
    # Without the count's share (the update noised at z and the count on top) it costs more.
    assert epsilon(dp_event.ComposedDpEvent([dp_event.GaussianDpEvent(z),
                                             dp_event.GaussianDpEvent(2 * sigma_b)])) > 1.1 * single


def test_the_ledger_event_is_dp_fedavgs_in_units_of_the_clip():
    adaptive = AdaptiveClipping(target_quantile=0.5)
    event = adaptive_round_event(noise_multiplier=1.2, sampling_rate=0.05, delta=1e-5,
                                 adaptive=adaptive)
    assert event.sensitivity == 1.0 and event.noise_scale == pytest.approx(1.2)
    fixed = central_round_event(noise_multiplier=1.2, sampling_rate=0.05, clip=0.1, delta=1e-5)
    assert event.epsilon == fixed.epsilon
    # What the accountants compose is the fixed clip's release exactly (so PLD's T-round
    # total is central_epsilon's, tests/privacy/test_central_accounting.py).
    assert event.to_dp_event() == fixed.to_dp_event()
    assert "adaptive clipping" in event.note and "indicators" in event.note


def test_indicators_and_the_geometric_update():
    updates = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0], [6.0, 8.0]])
    assert clip_indicators(updates, 5.0).tolist() == [0.5, 0.5, 0.5, -0.5]  # norm 5 <= 5
    assert clip_indicators(updates, 0.1).dtype == torch.float64
    adaptive = AdaptiveClipping(target_quantile=0.8, learning_rate=0.2)
    assert adaptive.learning_rate == 0.2 and adaptive.count_noise(60) == pytest.approx(3.0)
    assert AdaptiveClipping(target_quantile=0.5, count_stddev=1.5).count_noise(60) == 1.5
    # b = gamma: unchanged; all clipped (b = 0): grows by exp(0.2 * 0.8); clamped to [0, 1].
    assert adaptive.next_clip(0.1, 0.8) == pytest.approx(0.1)
    assert adaptive.next_clip(0.1, 0.0) == pytest.approx(0.1 * math.exp(0.16))
    assert adaptive.unclipped_fraction(-100.0, 10.0) == 0.0
    assert adaptive.unclipped_fraction(100.0, 10.0) == 1.0
    assert adaptive.unclipped_fraction(2.0, 10.0) == pytest.approx(0.7)


@pytest.mark.parametrize("changes,match", [
    (dict(target_quantile=1.0), "adaptive_clip_quantile"),
    (dict(target_quantile=0.0), "adaptive_clip_quantile"),
    (dict(target_quantile=0.5, learning_rate=0.0), "clip_lr"),
    (dict(target_quantile=0.5, count_stddev=-1.0), "clip_count_stddev"),
])
def test_bad_settings_name_themselves(changes, match):
    with pytest.raises(ConfigError, match=match):
        AdaptiveClipping(**changes)
