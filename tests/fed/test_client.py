"""The client update: its candidates, its generator discipline, and what it uploads."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from privaterec.data.clients import ClientData
from privaterec.fed.client import ClientUpdate, client_candidates, client_update
from privaterec.fed.methods import ClientMethod, FedNewsRec, FedRec
from privaterec.fed.rng import client_noise
from privaterec.privacy.samplers import SimulationNoise


def seeded(seed: int) -> SimulationNoise:
    return SimulationNoise(torch.Generator().manual_seed(seed))


def _hand_made_client(n: int = 8) -> ClientData:
    """Sample i clicked row 100 + i; its impression has 1 + i % 6 non-clicked rows
    1000·(i+1) + j (padding with 0 beyond)."""
    counts = torch.tensor([1 + i % 6 for i in range(n)])
    negatives = torch.zeros(n, 6, dtype=torch.long)
    for i in range(n):
        negatives[i, : counts[i]] = 1000 * (i + 1) + torch.arange(int(counts[i]))
    return ClientData(index=0, user_id="U-hand", history=torch.tensor([0, 0, 3, 4, 5]),
                      history_mask=torch.tensor([False, False, True, True, True]),
                      positives=100 + torch.arange(n), negatives=negatives,
                      negative_counts=counts, impression_size=counts + 1)


def _method(**changes) -> ClientMethod:
    return dataclasses.replace(FedRec(negatives=4, max_samples=64),
                               **changes)


def _check_candidates(data: ClientData, candidates: torch.Tensor, k: int) -> list[int]:
    """Each row: a clicked news then k non-clicked news of the same impression."""
    samples = []
    for row in candidates.tolist():
        i = row[0] - 100
        pool = data.negatives[i, : data.negative_counts[i]].tolist()
        assert set(row[1:]) <= set(pool)
        if len(pool) >= k:
            assert len(set(row[1:])) == k  # without replacement when the pool allows
        samples.append(i)
    return samples


def test_candidates_use_every_sample_when_under_the_cap():
    data = _hand_made_client()
    cands = client_candidates(data, _method(), noise=seeded(0))
    assert cands.shape == (8, 5)
    assert _check_candidates(data, cands, 4) == list(range(8))


def test_candidates_subsample_at_most_max_samples():
    data = _hand_made_client()
    seen = set()
    for seed in range(5):
        cands = client_candidates(data, _method(max_samples=3),
                                  noise=seeded(seed))
        samples = _check_candidates(data, cands, 4)
        assert len(samples) == 3 and samples == sorted(set(samples))  # distinct, in order
        seen.add(tuple(samples))
    assert len(seen) > 1  # the subset is random


def test_candidates_are_a_function_of_the_generator():
    data = _hand_made_client()
    draw = lambda seed: client_candidates(data, _method(max_samples=5),  # noqa: E731
                                          noise=seeded(seed))
    assert torch.equal(draw(3), draw(3))
    assert not torch.equal(draw(3), draw(4))


def test_client_update_follows_the_documented_generator_order(make_objective, clients):
    """(1) subsample, (2) negatives, (3) noise — all from the client's one generator."""
    objective = make_objective("nrms")
    theta = objective.parameters()
    method = FedNewsRec(negatives=4, max_samples=3, clip=0.005, noise_scale=0.015)
    data = clients.client(0)  # 9 samples > max_samples
    update = client_update(objective, theta, data, method, noise=client_noise(5, 2, 0))

    generator = client_noise(5, 2, 0)
    candidates = client_candidates(data, method, noise=generator)
    grad, loss = objective.client_gradient(theta, data.history, data.history_mask, candidates)
    expected, event = method.privatize(grad[None], [generator])
    assert isinstance(update, ClientUpdate)
    assert torch.equal(update.payload, expected[0])
    assert update.num_examples == 3 and candidates.shape[0] == 3
    assert update.privacy_events == (event,) and event == method.event(objective.dimension)
    assert update.metrics["loss"] == pytest.approx(loss)


def test_num_examples_is_the_number_of_samples_used(make_objective, clients):
    objective = make_objective("nrms")
    theta = objective.parameters()
    counts = clients.samples_per_user()
    for u in (0, 6, 13):
        for cap in (2, 64):
            update = client_update(objective, theta, clients.client(u),
                                   _method(max_samples=cap), noise=client_noise(0, 0, u))
            assert update.num_examples == min(int(counts[u]), cap)


def test_fedrec_uploads_the_plain_gradient(make_objective, clients, perturb):
    objective = make_objective("nrms")
    theta = perturb(objective)
    data = clients.client(3)
    update = client_update(objective, theta, data, _method(), noise=client_noise(1, 0, 3))
    candidates = client_candidates(data, _method(), noise=client_noise(1, 0, 3))
    grad, _ = objective.client_gradient(theta, data.history, data.history_mask, candidates)
    assert torch.equal(update.payload, grad)
    assert not update.privacy_events[0].is_private


def test_fedavg_client_runs_local_sgd_steps(make_objective, clients, perturb):
    objective = make_objective("nrms")
    theta = perturb(objective)
    before_model = objective.parameters()
    theta_copy = theta.clone()
    data = clients.client(12)
    method = _method(local_steps=3, local_lr=0.2)
    update = client_update(objective, theta, data, method, noise=client_noise(0, 4, 12))
    candidates = client_candidates(data, method, noise=client_noise(0, 4, 12))
    local = theta.clone()
    first_loss = None
    for _ in range(3):
        g, loss = objective.client_gradient(local, data.history, data.history_mask, candidates)
        first_loss = loss if first_loss is None else first_loss
        local = local - 0.2 * g
    torch.testing.assert_close(update.payload, theta - local, rtol=1e-4, atol=1e-7)
    assert update.metrics["loss"] == pytest.approx(first_loss, rel=1e-5)
    assert torch.equal(theta, theta_copy)  # the global θ is not modified
    assert torch.equal(objective.parameters(), before_model)


def test_a_client_without_samples_sends_a_noised_zero(make_objective):
    """Every method samples from the roster: a sampled client whose impressions have no
    click sends a release of the same shape as any client's, the noise alone (FedNewsRec's
    Laplace of scale λ on a zero update), with the same events and no sample."""
    objective = make_objective("nrms")
    data = dataclasses.replace(_hand_made_client(), positives=torch.zeros(0, dtype=torch.long),
                               negatives=torch.zeros(0, 6, dtype=torch.long),
                               negative_counts=torch.zeros(0, dtype=torch.long),
                               impression_size=torch.zeros(0, dtype=torch.long))
    method = FedNewsRec(negatives=4, max_samples=3, clip=0.005, noise_scale=0.015)
    update = client_update(objective, objective.parameters(), data, method,
                           noise=client_noise(0, 0, 7))
    noise, _ = method.privatize(torch.zeros(1, objective.dimension),
                                [client_noise(0, 0, 7)])
    assert torch.equal(update.payload, noise[0]) and update.payload.shape == (objective.dimension,)
    assert float(update.payload.abs().mean()) == pytest.approx(0.015, rel=0.1)  # E|Laplace| = λ
    assert update.num_examples == 0 and update.privacy_events == method.events(objective.dimension)
    assert update.sent().keys() == {"payload"}
    fedrec = client_update(objective, objective.parameters(), data, _method(),
                           noise=SimulationNoise(torch.Generator()))
    assert fedrec.weight == 0.0 and not bool(fedrec.payload.any())  # fedrec weighs it 0
