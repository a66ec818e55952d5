"""Tests for Uni-FedRec's decomposer / LDP perturbation / aggregator and their privacy events."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from privaterec.errors import ConfigError
from privaterec.privacy.ledger import PrivacyLedger, compose_events
from privaterec.privacy.samplers import SimulationNoise
from privaterec.recall.interest import (BasicInterestEmbeddings, aggregator_weights,
                                        channel_event, perturb_quotas, perturb_scores,
                                        query_events, quota_event)


def test_decompose_aggregate_score_matrix_by_hand():
    bie = BasicInterestEmbeddings(num_basis=3, dim=2)
    with torch.no_grad():
        bie.keys.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]))
        bie.values.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))
    r = torch.tensor([[0.5, -1.0]])
    torch.testing.assert_close(bie.decompose(r), torch.tensor([[0.5, -2.0, -0.5]]))
    alpha = torch.tensor([[0.2, 0.3, 0.5]])
    # 0.2·(1,2) + 0.3·(3,4) + 0.5·(5,6) = (3.6, 4.6)
    torch.testing.assert_close(bie.aggregate(alpha), torch.tensor([[3.6, 4.6]]))
    news = torch.tensor([[1.0, 0.0], [1.0, -1.0]])
    # P[j, n] = eᵛⱼ · news_n: (1,2)->(1,-1), (3,4)->(3,-1), (5,6)->(5,-1)
    torch.testing.assert_close(bie.score_matrix(news),
                               torch.tensor([[1.0, -1.0], [3.0, -1.0], [5.0, -1.0]]))
    # scores of r̂ over the news = αᵀP
    torch.testing.assert_close(alpha @ bie.score_matrix(news), bie.aggregate(alpha) @ news.T)


def test_dimension_follows_parameter():
    bie = BasicInterestEmbeddings(num_basis=7, dim=12)
    assert bie.keys.shape == (7, 12) and bie.values.shape == (7, 12)
    with pytest.raises(ConfigError, match="num_basis"):
        BasicInterestEmbeddings(num_basis=0, dim=4)


def test_clip_without_noise_is_exact():
    a = torch.tensor([-1.0, -0.2, -0.1, 0.0, 0.15, 0.2, 0.5, 7.0])
    out = perturb_scores(a, clip=0.2, noise=None)
    assert out.tolist() == pytest.approx([-0.2, -0.2, -0.1, 0.0, 0.15, 0.2, 0.2, 0.2])
    assert torch.equal(perturb_scores(a, clip=None, noise=None), a)


def test_noise_is_laplace_with_scale_lambda():
    gen = torch.Generator().manual_seed(11)
    a = torch.empty(200, 100).uniform_(-1.0, 1.0, generator=gen)
    out = perturb_scores(a, clip=0.2, noise_scale=1.2,
                         noise=SimulationNoise(torch.Generator().manual_seed(5)))
    noise = (out - a.clamp(-0.2, 0.2)).double().numpy().ravel()
    # Kolmogorov-Smirnov against Laplace(0, 1.2); a wrong scale (1.0 or 1.44) is rejected.
    assert stats.kstest(noise, stats.laplace(scale=1.2).cdf).pvalue > 1e-3
    assert stats.kstest(noise, stats.laplace(scale=1.0).cdf).pvalue < 1e-6
    assert stats.kstest(noise, stats.laplace(scale=1.44).cdf).pvalue < 1e-6
    # moments: E|X| = b, Var X = 2b² (n = 20000; tolerances ≈ 5 standard errors)
    assert abs(np.abs(noise).mean() - 1.2) < 0.05
    assert abs(noise.var() - 2 * 1.2 ** 2) < 0.25
    assert abs(noise.mean()) < 0.05


def test_noise_reproducible_and_per_row_generators():
    a = torch.randn(3, 4, 6, generator=torch.Generator().manual_seed(0))
    one = perturb_scores(a, noise=SimulationNoise(torch.Generator().manual_seed(9)))
    assert torch.equal(one, perturb_scores(a,
                                           noise=SimulationNoise(torch.Generator().manual_seed(9))))
    gens = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
    rows = perturb_scores(a, noise=SimulationNoise(gens))
    # row 1 equals a single-row call with its own generator, whatever the other rows are
    alone = perturb_scores(a[1:2], noise=SimulationNoise([torch.Generator().manual_seed(2)]))
    torch.testing.assert_close(rows[1:2], alone)
    b = a.clone()
    b[0] += 5.0
    torch.testing.assert_close(
        perturb_scores(b, noise=SimulationNoise(
            [torch.Generator().manual_seed(s) for s in (1, 2, 3)]))[1:],
        rows[1:])


def test_aggregator_weights_softmax():
    a_hat = torch.tensor([[0.0, math.log(3.0)]])
    torch.testing.assert_close(aggregator_weights(a_hat), torch.tensor([[0.25, 0.75]]))


def test_channel_event_epsilon_formula():
    e = channel_event(num_basis=30, clip=0.2, noise_scale=1.2)
    # ε = 2δB/λ_I = 2·0.2·30/1.2 = 10 (docs/privacy.md#uni-fedrec-channels-and-quotas); per
    # coordinate 2δ/λ_I = 1/3
    assert e.mechanism == "laplace" and e.phase == "serve"
    assert e.epsilon == pytest.approx(10.0)
    assert e.sensitivity == pytest.approx(12.0) and e.noise_scale == pytest.approx(1.2)
    assert e.coordinate_epsilon == pytest.approx(1 / 3) and e.dimension == 30
    other = channel_event(num_basis=10, clip=0.5, noise_scale=2.0, phase="train")
    assert other.epsilon == pytest.approx(5.0) and other.phase == "train"
    assert not channel_event(noise_scale=0.0).is_private


def test_query_events_compose():
    events = query_events(3, include_quotas=False)
    assert compose_events(events, delta=0.0, composition="basic") == pytest.approx(30.0)
    # the paper's protocol: quotas in the clear -> no finite guarantee
    clear = query_events(3)
    assert clear[1][0].mechanism == "clear_quotas" and not clear[1][0].is_private
    assert math.isinf(compose_events(clear, delta=1e-6, composition="basic"))
    noisy = query_events(3, quota_noise_scale=0.5, num_quota_slots=5)
    assert noisy[1][0].epsilon == pytest.approx(4.0) and noisy[1][0].dimension == 5
    assert compose_events(noisy, delta=0.0, composition="basic") == pytest.approx(34.0)
    # PLD of 3 Laplace releases is no worse than basic composition
    pld = compose_events(events, delta=1e-6, composition="pld")
    assert 0 < pld <= 30.0 + 1e-6
    ledger = PrivacyLedger()
    for event, count in noisy:
        ledger.record("u1", event, count)
    assert ledger.user_budget("u1", phase="serve")[0] == pytest.approx(34.0)


def test_perturb_quotas_matches_reference_and_event():
    q = torch.tensor([[0.5, 0.3, 0.2, 0.0, 0.0]])
    out, event = perturb_quotas(q, noise_scale=0.1,
                                noise=SimulationNoise(torch.Generator().manual_seed(4)))
    noise = SimulationNoise(torch.Generator().manual_seed(4)).draw(
        (1, 5), mechanism="laplace", scale=0.1)
    ref = (q + noise).clamp_min(0)
    torch.testing.assert_close(out, ref / ref.sum())
    assert event.epsilon == pytest.approx(20.0) and event.sensitivity == 2.0
    assert event.dimension == 5
    assert quota_event(noise_scale=0.1, num_slots=5) == event


def test_perturb_quotas_all_negative_falls_back_to_uniform():
    q = torch.tensor([[1.0, 0.0]])
    for seed in range(100):
        noise = SimulationNoise(torch.Generator().manual_seed(seed)).draw(
            (1, 2), mechanism="laplace", scale=50.0)
        if bool(((q + noise) < 0).all()):
            break
    else:  # pragma: no cover - probability 0.75^100
        pytest.fail("no seed with an all-negative draw")
    out, _ = perturb_quotas(q, noise_scale=50.0,
                            noise=SimulationNoise(torch.Generator().manual_seed(seed)))
    torch.testing.assert_close(out, torch.tensor([[0.5, 0.5]]))


@pytest.mark.parametrize("kwargs, match", [
    (dict(clip=0.0), "clip"), (dict(clip=-1.0), "clip"), (dict(noise_scale=-1.0), "noise"),
    (dict(num_basis=0), "num_basis"),
])
def test_invalid_privacy_parameters(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        channel_event(**kwargs)


def test_perturb_scores_rejects_bad_parameters():
    with pytest.raises(ConfigError, match="clip"):
        perturb_scores(torch.zeros(3), clip=-0.1)
    with pytest.raises(ConfigError, match="noise"):
        perturb_scores(torch.zeros(3), noise_scale=-1.0, noise=SimulationNoise(torch.Generator()))
    with pytest.raises(ConfigError, match="quota_noise_scale"):
        perturb_quotas(torch.ones(1, 2) / 2, noise_scale=0.0,
                       noise=SimulationNoise(torch.Generator()))
