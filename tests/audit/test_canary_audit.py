"""Worst-case canary audits of central DP (docs/privacy.md#worst-case-canaries).

A canary client's real upload is clipped to exactly C along a known direction; the
likelihood-ratio test on the aggregator's real release must pass every correct method and
catch its noise cut by 2x at claimed epsilon = 1.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from privaterec.audit import broken
from privaterec.audit.canary import (CanaryObjective, canary_games, gaussian_power, play,
                                     runs_needed)
from privaterec.audit.distinguisher import fixed_statistic_bound
from privaterec.audit.world import BASE_USER, make_world
from privaterec.privacy.samplers import SimulationNoise

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# Runs per side (half of them test runs): enough to catch a 2x noise cut (module docstring
# of privaterec.audit.canary; docs/privacy.md#power-of-the-audit).
RUNS = {("dp-fedavg", "replace"): 200_000, ("dp-fedavg", "add-remove"): 400_000,
        ("dp-fedavg-news", "add-remove"): 400_000, ("dp-fedavg-adaptive", "replace"): 200_000,
        ("dp-fedavg-adaptive", "add-remove"): 400_000}
CASES = list(RUNS)


@pytest.fixture(scope="module")
def world():
    return make_world()


def game(world, method: str, adjacency: str):
    return next(g for g in canary_games(method, world, epsilon=1.0, adjacencies=[adjacency]))


@pytest.mark.parametrize("method", ["dp-fedavg", "dp-fedavg-adaptive", "dp-fedavg-news"])
def test_the_canary_upload_is_clipped_to_exactly_c(world, method):
    for g in canary_games(method, world, epsilon=1.0):
        clip = g.aggregator.clip
        for side in (g.d0, g.d1):
            norm = float(torch.linalg.vector_norm(side.total.double()))
            assert norm == pytest.approx(side.norm)
            if side.name == "no client":
                assert norm == 0
            elif "inside" in g.pair and side is g.d0:
                assert norm == pytest.approx(0.999 * clip, rel=1e-5)
                assert side.indicator == 0.5  # inside the clip: b = 1
            else:
                assert norm == pytest.approx(clip, rel=1e-5)
        if g.adjacency == "replace" and method == "dp-fedavg":  # +C u against -C u
            assert torch.allclose(g.d0.total, -g.d1.total)


def test_the_canary_objective_has_the_same_gradient_everywhere(world):
    from privaterec.audit.targets import TINY_MODEL
    from privaterec.models.factory import build_recommender

    model = build_recommender(TINY_MODEL, world.vocabs, world.features)
    u = torch.randn(sum(p.numel() for p in model.parameters() if p.requires_grad))
    objective = CanaryObjective(model, direction=u, scale=-3.0)
    unit = u / u.norm()
    for seed in range(2):
        theta = torch.randn(objective.dimension, generator=torch.Generator().manual_seed(seed))
        data = world.client(BASE_USER)
        g, _ = objective.client_gradient(theta, data.history, data.history_mask,
                                         torch.zeros(1, 5, dtype=torch.long))
        assert torch.allclose(g, -3.0 * unit, atol=1e-6)


@pytest.mark.parametrize("method", ["dp-fedavg", "dp-fedavg-adaptive"])
def test_the_batched_rounds_are_the_one_round_release(world, method):
    """The audit noises n rounds in one call of CentralDP.noised_rounds: for n = 1 it draws
    exactly what noised_sums (the engine's release) draws, and its n count noises are
    independent N(0, sigma_b^2)."""
    g = game(world, method, "replace")
    agg = g.aggregator
    one = agg.noised_sums(g.d1.total, g.d1.indicator, population=1,
                          noise=SimulationNoise(torch.Generator().manual_seed(5)))
    total, count = agg.noised_rounds(g.d1.total[None],
                                     torch.tensor([g.d1.indicator], dtype=torch.float64),
                                     population=1,
                                     noise=SimulationNoise(torch.Generator().manual_seed(5)))
    assert torch.equal(one[0], total[0])
    assert one[1] == (None if count is None else float(count[0]))
    n = 20_000
    totals, counts = agg.noised_rounds(torch.zeros(n, g.d1.total.numel()),
                                       torch.zeros(n, dtype=torch.float64), population=1,
                                       noise=SimulationNoise(torch.Generator().manual_seed(6)))
    z_update, sigma_b = agg.noise_split(1)
    assert float(totals.std()) == pytest.approx(z_update * agg.clip, rel=0.01)
    if sigma_b is None:
        assert counts is None
    else:
        assert float(counts.std()) == pytest.approx(sigma_b, rel=0.03)
        assert abs(float(np.corrcoef(counts[:-1], counts[1:])[0, 1])) < 0.03


@pytest.mark.parametrize("method,adjacency", CASES)
def test_a_correct_central_release_passes_the_canary_audit(world, method, adjacency):
    result = play(game(world, method, adjacency), runs=RUNS[method, adjacency], seed=3)
    assert not result.violated, result.to_dict()
    assert result.claimed_epsilon == pytest.approx(1.0 if adjacency == "replace" else 0.468,
                                                   abs=2e-3)


@pytest.mark.parametrize("method,adjacency", CASES)
def test_central_noise_cut_by_two_is_caught_at_claimed_epsilon_one(world, method, adjacency):
    with broken.scaled_gaussian_noise(0.5):
        result = play(game(world, method, adjacency), runs=RUNS[method, adjacency], seed=3)
    assert result.violated, result.to_dict()


def test_fixed_statistic_bound_holds_at_its_confidence():
    # mu-GDP with mu = 0.5 is (eps, 1e-5)-DP for eps = 2.03: the 95% bound stays below it
    rng = np.random.default_rng(0)
    bounds = []
    for _ in range(20):
        x = [rng.normal(shift, 1.0, 20_000) for shift in (0.0, 0.5, 0.0, 0.5)]
        bounds.append(fixed_statistic_bound((x[0], x[1]), (x[2], x[3]), name="projection",
                                            delta=1e-5).epsilon_lower_bound)
    assert max(bounds) < 2.03
    assert min(bounds) > 0.5  # and it finds the shift
    assert fixed_statistic_bound((x[0], x[0][::-1]), (x[2], x[2][::-1]),
                                 name="none").epsilon_lower_bound == 0.0


def test_the_planning_formula_matches_the_gaussian_runs_needed():
    # a 2x noise cut at claimed epsilon 1 (replace): mu = 2 * 0.268
    mu = 2 * 0.26805
    n = runs_needed(mu=mu, claimed_epsilon=1.0, delta=1e-5)
    assert 5_000 < n < 20_000
    assert gaussian_power(mu=mu, claimed_epsilon=1.0, n=n, delta=1e-5) > 1.0
    assert gaussian_power(mu=mu / 2, claimed_epsilon=1.0, n=10 ** 6, delta=1e-5) < 1.0
    assert math.isfinite(n)


def test_cli_reports_the_canary_audit_next_to_the_natural_pairs(capsys):
    from privaterec.cli import main

    code = main(["privacy", "audit", "--method", "dp-fedavg", "--adjacency", "user",
                 "--epsilon", "1", "--runs", "32", "--canary-runs", "20000"])
    out = capsys.readouterr().out
    assert code == 0
    assert "| dp-fedavg | - | user: one-impression |" in out
    assert "| dp-fedavg | replace: canary +C u vs -C u | 0.999 |" in out
    assert "| dp-fedavg | add-remove: canary +C u vs no client | 0.468 |" in out


def test_cli_exits_one_when_the_canary_catches_a_noise_cut(capsys):
    from privaterec.cli import main

    with broken.scaled_gaussian_noise(0.25):
        code = main(["privacy", "audit", "--method", "dp-fedavg", "--adjacency", "user",
                     "--epsilon", "1", "--runs", "32", "--canary-runs", "20000"])
    assert code == 1
    assert "FAIL" in capsys.readouterr().out


# ------------------------------------------------------------------ deployed paths
@pytest.mark.slow
def test_the_deployed_central_noise_passes_and_an_8x_cut_is_caught(world):
    """The same game on a deployed server's float-safe central noise
    (``CentralDP.release_sum`` from SecureNoise, the OS CSPRNG: not reproducible, about 10⁴
    coordinates a second here). 500 test runs per side: expected bounds 0.05 correct and
    3.3 with the noise cut 8x (a 4x cut expects 1.37, too close to the claim for a test
    that cannot be seeded)."""
    g = game(world, "dp-fedavg", "replace")
    assert not play(g, runs=1000, view="deployed").violated
    with broken.scaled_secure_noise(0.125):
        result = play(g, runs=1000, view="deployed")
    assert result.violated, result.to_dict()


def test_the_secagg_view_with_central_noise_is_the_simulators_and_catches_a_2x_cut(world):
    g = next(iter(canary_games("dp-fedavg", world, epsilon=1.0, adjacencies=["replace"],
                               secure_aggregation="central")))
    correct = play(g, runs=100_000, seed=3, view="secagg")
    assert not correct.violated
    with broken.scaled_gaussian_noise(0.5):
        cut = play(g, runs=100_000, seed=3, view="secagg")
    assert cut.violated, cut.to_dict()


@pytest.mark.slow
def test_distributed_noise_shares_cut_by_two_are_caught_on_the_secagg_view(world):
    """Distributed noise: the server's view is the sum of the clients' SecAgg+ vectors
    (quantised updates plus noise shares); shares 2x too small are caught."""
    g = next(iter(canary_games("dp-fedavg", world, epsilon=1.0, adjacencies=["replace"],
                               secure_aggregation="distributed")))
    assert g.aggregator.distributed
    assert not play(g, runs=100_000, seed=3, view="secagg").violated
    with broken.scaled_noise_shares(0.5):
        cut = play(g, runs=100_000, seed=3, view="secagg")
    assert cut.violated, cut.to_dict()


def test_the_secagg_view_is_refused_without_secure_aggregation(world):
    from privaterec.errors import ConfigError

    with pytest.raises(ConfigError, match="secure_aggregation"):
        play(game(world, "dp-fedavg", "replace"), runs=100, view="secagg")
    with pytest.raises(ConfigError, match="simulator only"):
        play(game(world, "dp-fedavg-adaptive", "replace"), runs=100, view="deployed")


def test_cli_audits_the_secagg_view_with_distributed_noise(capsys):
    from privaterec.cli import main

    code = main(["privacy", "audit", "--method", "dp-fedavg", "--adjacency", "user",
                 "--epsilon", "1", "--runs", "32", "--canary-runs", "4000",
                 "--canary-view", "secagg", "--noise-placement", "distributed", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    assert '"mode": "secagg"' in out and '"pair": "canary +C u vs -C u"' in out
