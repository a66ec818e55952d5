"""PrivateRec's label release (privacy/labels.py; docs/privacy.md#label-privacy).

The published DPL always put the clicked news in the candidate set, so the set named the
click (ε = ∞). These tests pin the replacement: candidates drawn blind to the clicks, (k+2)-ary
randomized response on which was clicked, and an upload that depends on the clicks only
through the released label.
"""

from __future__ import annotations

import math

import pytest
import torch

from privaterec.privacy.audit import clopper_pearson_interval
from privaterec.privacy.samplers import SimulationNoise
from privaterec.privacy.labels import (draw_positions, keep_probability, label_event,
                                       release_labels)


def seeded(seed: int) -> SimulationNoise:
    return SimulationNoise(torch.Generator().manual_seed(seed))


def _impressions(clicked: list[int], count: int = 12, width: int = 12):
    clicks = torch.zeros(len(clicked), width, dtype=torch.bool)
    for i, c in enumerate(clicked):
        clicks[i, c] = True
    return clicks, torch.full((len(clicked),), count)


def test_positions_are_uniform_and_blind_to_the_clicks():
    counts = torch.tensor([12] * 4000 + [3] * 4000)
    pos = draw_positions(counts, size=5, noise=seeded(0))
    big, small = pos[:4000], pos[4000:]
    # Without replacement in an impression of 12: 5 distinct positions, each position drawn
    # with probability 5/12.
    assert all(len(set(r)) == 5 for r in big.tolist())
    freq = torch.bincount(big.flatten(), minlength=12).double() / 4000
    assert torch.allclose(freq, torch.full((12,), 5 / 12, dtype=torch.float64), atol=0.03)
    # With replacement where the impression has fewer than 5 news.
    assert int(small.max()) <= 2


def test_randomized_response_keeps_the_truth_at_the_stated_rate():
    eps, size, n = 1.0, 5, 20000
    # Every position clicked: the true class is always a drawn position.
    clicks = torch.ones(n, size, dtype=torch.bool)
    counts = torch.full((n,), size)
    pos, released = release_labels(clicks, counts, size=size, epsilon=eps,
                                   noise=seeded(1))
    none_rate = float((released == size).double().mean())
    # P(output = "none" | truth is a position) = 1/(e^ε + size).
    expected_none = 1 / (math.exp(eps) + size)
    assert none_rate == pytest.approx(expected_none, abs=4 * math.sqrt(expected_none / n))
    assert keep_probability(epsilon=eps, size=size) == pytest.approx(
        math.exp(eps) / (math.exp(eps) + size))


def test_infinite_epsilon_releases_the_true_click():
    clicks, counts = _impressions([3] * 200)
    pos, released = release_labels(clicks, counts, size=5, epsilon=math.inf,
                                   noise=seeded(2))
    drew = (pos == 3).any(dim=1)
    assert bool((released[~drew] == 5).all())
    assert bool((pos[drew].gather(1, released[drew, None]) == 3).all())


def test_label_release_audit_lower_bound_stays_below_epsilon():
    """Empirical audit of the whole release (positions and label) for one impression's clicks:
    the click on news 0 vs news 1; the strongest event is "news 0 drawn and labelled"."""
    eps, n = 1.0, 40000
    outs = []
    for clicked, seed in ((0, 3), (1, 4)):
        clicks, counts = _impressions([clicked] * n)
        pos, released = release_labels(clicks, counts, size=5, epsilon=eps,
                                       noise=seeded(seed))
        labelled = torch.where(released < 5, pos.gather(1, released.clamp(max=4)[:, None])[:, 0],
                               torch.full((n,), -1))
        outs.append(int((labelled == 0).sum()))
    lo_a = clopper_pearson_interval(outs[0], n, alpha=0.05)[0]  # one-sided 97.5% each
    hi_b = clopper_pearson_interval(outs[1], n, alpha=0.05)[1]
    lower_bound = math.log(lo_a / hi_b)
    assert 0 < lower_bound <= eps


def test_label_event_states_click_and_user_level_epsilon():
    event = label_event(epsilon=2.0, size=5, max_impressions=50)
    assert event.data == "labels" and event.epsilon == 2.0
    assert event.at_adjacency("user").epsilon == 100.0
