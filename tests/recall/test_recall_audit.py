"""Empirical privacy audits of Uni-FedRec's mechanisms (Clopper–Pearson lower bounds on ε).

Each audit runs the library's mechanism on a worst-case neighbouring pair and checks that the
lower bound stays at or below the ε the ledger records; a broken variant (the paper's
per-coordinate reading, or no clipping) must exceed it, so the audits can fail.
"""

from __future__ import annotations

import torch

from privaterec.privacy.samplers import NoiseSource, SimulationNoise
from privaterec.privacy.audit import audit_mechanism
from privaterec.recall.interest import channel_event, perturb_quotas, perturb_scores
from privaterec.recall.task import UniFedRecLDP

F64 = torch.float64
ALPHA = 0.05
TRIALS = 100_000


def sim(seed: int) -> SimulationNoise:
    return SimulationNoise(torch.Generator().manual_seed(seed))


def laplace_llr(centre: float):
    """Σⱼ |yⱼ − c| − |yⱼ + c|: the likelihood-ratio statistic of product Laplace noise around
    −c·1 (D) and +c·1 (D′); rounded so float rounding cannot leak (see test_dpa.py)."""
    def statistic(y: torch.Tensor) -> torch.Tensor:
        y = y.reshape(y.shape[0], -1)
        return torch.round(((y + centre).abs() - (y - centre).abs()).sum(-1), decimals=6)
    return statistic


def test_channel_release_audit_below_two_delta_b_over_lambda():
    delta, num_basis, eps = 0.5, 2, 1.0
    lam = 2 * delta * num_basis / eps  # ε = 2δB/λ_I (docs/privacy.md#uni-fedrec-channels-and-quotas)
    assert channel_event(num_basis=num_basis, clip=delta, noise_scale=lam).epsilon == eps
    x = torch.full((num_basis,), -5.0, dtype=F64)  # clipped to −δ·1
    xp = torch.full((num_basis,), 5.0, dtype=F64)  # clipped to +δ·1: L1 distance 2δB

    def release(batch: torch.Tensor, noise: NoiseSource) -> torch.Tensor:
        return perturb_scores(batch, clip=delta, noise_scale=lam, noise=noise)

    result = audit_mechanism(release, x, xp, trials=TRIALS, noise=sim(1), alpha=ALPHA,
                             statistic=laplace_llr(delta))
    assert 0.6 < result.epsilon_lower_bound <= eps


def test_channel_release_with_the_papers_per_coordinate_noise_exceeds_its_claim():
    # The paper's 2δ/λ_I: noise λ = 2δ/ε for a claimed ε — valid per coordinate only.
    delta, num_basis, eps = 0.5, 4, 1.0
    lam = 2 * delta / eps

    def release(batch: torch.Tensor, noise: NoiseSource) -> torch.Tensor:
        return perturb_scores(batch, clip=delta, noise_scale=lam, noise=noise)

    x = torch.full((num_basis,), -5.0, dtype=F64)
    result = audit_mechanism(release, x, -x, trials=TRIALS, noise=sim(2), alpha=ALPHA,
                             statistic=laplace_llr(delta))
    assert result.epsilon_lower_bound > eps


def test_unclipped_scores_exceed_the_claimed_epsilon():
    delta, num_basis, eps = 0.5, 2, 1.0
    lam = 2 * delta * num_basis / eps

    def release(batch: torch.Tensor, noise: NoiseSource) -> torch.Tensor:
        return perturb_scores(batch, clip=None, noise_scale=lam, noise=noise)

    x = torch.full((num_basis,), -2.0, dtype=F64)
    result = audit_mechanism(release, x, -x, trials=TRIALS, noise=sim(3), alpha=ALPHA)
    assert result.epsilon_lower_bound > eps


def test_quota_noise_audit_below_two_over_lambda():
    eps = 1.0
    lam = 2.0 / eps  # quotas on the simplex: L1 sensitivity 2
    q = torch.tensor([1.0, 0.0], dtype=F64)
    qp = torch.tensor([0.0, 1.0], dtype=F64)

    def release(batch: torch.Tensor, noise: NoiseSource) -> torch.Tensor:
        out, event = perturb_quotas(batch, noise_scale=lam, noise=noise)
        assert event.epsilon == eps
        return out

    result = audit_mechanism(release, q, qp, trials=TRIALS, noise=sim(4), alpha=ALPHA)
    # post-processing (clamp + renormalise) only loses information: a loose but valid bound
    assert 0.3 < result.epsilon_lower_bound <= eps


def test_recall_upload_audit_below_two_theta_over_lambda():
    theta, lam = 0.1, 0.2
    method = UniFedRecLDP(negatives=4, max_samples=64, clip=theta, noise_scale=lam)
    eps = method.event(2).epsilon
    assert eps == 2 * theta / lam
    x = torch.tensor([-3.0, 0.0], dtype=F64)  # L1-clipped to (−θ, 0)
    xp = torch.tensor([3.0, 0.0], dtype=F64)  # to (+θ, 0): L1 distance 2θ

    def upload(batch: torch.Tensor, noise: NoiseSource) -> torch.Tensor:
        released, _ = method.privatize(batch, [noise] * batch.shape[0])
        return released

    result = audit_mechanism(upload, x, xp, trials=20_000, noise=sim(5), alpha=ALPHA,
                             statistic=lambda y: torch.round(
                                 (y[:, 0] + theta).abs() - (y[:, 0] - theta).abs(),
                                 decimals=6))
    assert 0.6 < result.epsilon_lower_bound <= eps
