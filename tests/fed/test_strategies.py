"""Server strategies and aggregation, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from privaterec.config import FedConfig
from privaterec.errors import ConfigError
from privaterec.fed.client import ClientUpdate
from privaterec.fed.strategies import (FedAdam, FedAvg, FedAvgM, WeightedSGD, aggregate, build_strategy,
                                       weighted_mean, with_pretrained_lr)
from privaterec.privacy.events import PrivacyEvent

EVENT = PrivacyEvent(mechanism="none", epsilon=math.inf, phase="train")


def _update(payload, n: int) -> ClientUpdate:
    # Weighted by its sample count, as fedrec's server does (a private method's weight is 1).
    return ClientUpdate(payload=torch.as_tensor(payload, dtype=torch.float64), num_examples=n,
                        privacy_events=(EVENT,), weight=n, sends_metadata=True)


def test_weighted_mean_two_clients_by_hand():
    payloads = torch.tensor([[1.0, 2.0], [3.0, -4.0]], dtype=torch.float64)
    # (1*[1, 2] + 3*[3, -4]) / 4 = [10/4, -10/4]
    out = weighted_mean(payloads, torch.tensor([1, 3]))
    assert out.tolist() == [2.5, -2.5]
    assert aggregate([_update([1.0, 2.0], 1), _update([3.0, -4.0], 3)]).tolist() == [2.5, -2.5]


def test_aggregation_is_invariant_to_client_order():
    generator = torch.Generator().manual_seed(0)
    payloads = torch.randn(7, 11, generator=generator, dtype=torch.float64)
    counts = torch.randint(1, 20, (7,), generator=generator)
    reference = weighted_mean(payloads, counts)
    updates = [_update(p, int(n)) for p, n in zip(payloads, counts)]
    for seed in range(3):
        perm = torch.randperm(7, generator=generator)
        torch.testing.assert_close(weighted_mean(payloads[perm], counts[perm]), reference)
        torch.testing.assert_close(aggregate([updates[i] for i in perm]), reference)
    expected = sum(float(n) * p for n, p in zip(counts, payloads)) / float(counts.sum())
    torch.testing.assert_close(reference, expected)


def test_duplicated_client_equals_doubled_weight():
    a, b = [0.5, -1.0, 2.0], [4.0, 1.0, -3.0]
    twice = aggregate([_update(a, 3), _update(a, 3), _update(b, 5)])
    doubled = aggregate([_update(a, 6), _update(b, 5)])
    torch.testing.assert_close(twice, doubled)
    # and the weights really are the numbers of examples: (6a + 5b)/11
    torch.testing.assert_close(doubled, (6 * torch.tensor(a, dtype=torch.float64)
                                         + 5 * torch.tensor(b, dtype=torch.float64)) / 11)


@pytest.mark.parametrize("counts", [[0, 2], [3, -1]])
def test_non_positive_weights_are_rejected(counts):
    with pytest.raises(ValueError, match="num_examples > 0"):
        weighted_mean(torch.ones(2, 3), torch.tensor(counts))
    with pytest.raises(ValueError, match="num_examples > 0"):
        aggregate([_update([1.0], counts[0]), _update([2.0], counts[1])])


def test_empty_round_is_rejected():
    with pytest.raises(ValueError, match="empty round"):
        aggregate([])
    with pytest.raises(ValueError, match="empty round"):
        weighted_mean(torch.zeros(0, 3), torch.zeros(0))


def test_weighted_sgd_and_fedavg_steps():
    theta = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    g = torch.tensor([0.2, 0.4, -1.0], dtype=torch.float64)
    sgd = WeightedSGD(lr=0.5)
    new, state = sgd.step(theta, sgd.init_state(theta), g)
    assert new.tolist() == [0.9, -2.2, 1.0] and state == {}
    assert theta.tolist() == [1.0, -2.0, 0.5]  # inputs are not modified
    # FedAvg with η_s = 1 on pseudo-gradients θ − θ_u is model averaging of the θ_u.
    client_models = [torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64),
                     torch.tensor([3.0, -1.0, 0.0], dtype=torch.float64)]
    direction = aggregate([_update(theta - client_models[0], 1),
                           _update(theta - client_models[1], 2)])
    averaged, _ = FedAvg().step(theta, {}, direction)
    torch.testing.assert_close(averaged, (client_models[0] + 2 * client_models[1]) / 3)
    assert FedAvg().lr == 1.0


def test_fedadam_two_steps_by_hand():
    """Reddi et al. 2020 Alg. 2 (no bias correction), Δ = −ḡ, in plain Python floats."""
    lr, b1, b2, tau = 0.1, 0.9, 0.99, 1e-3
    theta = [1.0, -0.5, 0.25]
    grads = [[0.4, -0.2, 0.0], [-0.1, 0.3, 0.05]]
    m, v, x = [0.0] * 3, [0.0] * 3, list(theta)
    expected = []
    for g in grads:
        for i in range(3):
            delta = -g[i]
            m[i] = b1 * m[i] + (1 - b1) * delta
            v[i] = b2 * v[i] + (1 - b2) * delta ** 2
            x[i] = x[i] + lr * m[i] / (math.sqrt(v[i]) + tau)
        expected.append((list(x), list(m), list(v)))
    # first step by hand: m = 0.1Δ, v = 0.01Δ², x += 0.1·0.1Δ/(0.1|Δ| + τ)
    assert expected[0][0][0] == pytest.approx(1.0 + 0.1 * (-0.04) / (0.04 + 1e-3))
    assert expected[0][0][2] == 0.25  # zero gradient: no move

    strategy = FedAdam(lr=lr, beta1=b1, beta2=b2, tau=tau)
    params = torch.tensor(theta, dtype=torch.float64)
    state = strategy.init_state(params)
    assert torch.equal(state["m"], torch.zeros(3, dtype=torch.float64))
    assert torch.equal(state["v"], torch.zeros(3, dtype=torch.float64))
    for g, (x_ref, m_ref, v_ref) in zip(grads, expected):
        params, state = strategy.step(params, state, torch.tensor(g, dtype=torch.float64))
        assert params.tolist() == pytest.approx(x_ref, rel=1e-12, abs=1e-15)
        assert state["m"].tolist() == pytest.approx(m_ref, rel=1e-12, abs=1e-15)
        assert state["v"].tolist() == pytest.approx(v_ref, rel=1e-12, abs=1e-15)


def test_fedavgm_two_steps_by_hand():
    strategy = FedAvgM(lr=2.0, momentum=0.5)
    params = torch.tensor([1.0, -1.0])
    state = strategy.init_state(params)
    params, state = strategy.step(params, state, torch.tensor([0.5, 1.0]))
    # m = 0.5·0 + g = [0.5, 1]; θ = [1, -1] - 2·m = [0, -3]
    assert torch.allclose(state["m"], torch.tensor([0.5, 1.0]))
    assert torch.allclose(params, torch.tensor([0.0, -3.0]))
    params, state = strategy.step(params, state, torch.tensor([1.0, -1.0]))
    # m = 0.5·[0.5, 1] + [1, -1] = [1.25, -0.5]; θ = [0, -3] - 2·m = [-2.5, -2]
    assert torch.allclose(state["m"], torch.tensor([1.25, -0.5]))
    assert torch.allclose(params, torch.tensor([-2.5, -2.0]))


@pytest.mark.parametrize("momentum", [-0.1, 1.0])
def test_server_momentum_is_checked(momentum):
    with pytest.raises(ConfigError, match="server_momentum"):
        FedConfig(server_momentum=momentum)


def test_fedadam_does_not_modify_its_inputs():
    strategy = FedAdam(lr=0.1)
    params = torch.ones(3)
    state = strategy.init_state(params)
    snapshot = {k: v.clone() for k, v in state.items()}
    strategy.step(params, state, torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(params, torch.ones(3))
    assert all(torch.equal(state[k], snapshot[k]) for k in state)


@pytest.mark.parametrize("strategy,lr,expected", [
    ("sgd", 0.5, WeightedSGD(lr=0.5)),
    ("fedavg", 0.8, FedAvg(lr=0.8)),
    ("fedavgm", 2.0, FedAvgM(lr=2.0, momentum=0.7)),
    ("fedadam", 0.01, FedAdam(lr=0.01, beta1=0.8, beta2=0.95, tau=1e-4)),
])
def test_build_strategy(strategy, lr, expected):
    fed = FedConfig(strategy=strategy, server_lr=lr, adam_beta1=0.8, adam_beta2=0.95,
                    adam_tau=1e-4, server_momentum=0.7)
    built = build_strategy(fed)
    assert type(built) is type(expected) and built == expected


@pytest.mark.parametrize("fed", [FedConfig(), FedConfig(strategy="sgd"), FedConfig(server_lr=0.1)])
def test_build_strategy_needs_a_resolved_config(fed):
    with pytest.raises(ConfigError, match="resolve_run_config"):
        build_strategy(fed)


def test_with_pretrained_lr_gives_fedadam_a_per_coordinate_step():
    # PLM-NR's fine-tuned MiniLM coordinates step at TrainConfig.plm_lr, the rest at η
    strategy = FedAdam(lr=0.1, tau=1e-3)
    mask = torch.tensor([False, True, True, False])
    mixed = with_pretrained_lr(strategy, mask, 1e-4)
    assert mixed.lr.tolist() == pytest.approx([0.1, 1e-4, 1e-4, 0.1])
    params = torch.tensor([1.0, -2.0, 0.5, 3.0])
    direction = torch.tensor([0.3, -0.2, 0.1, -0.4])
    stepped, _ = mixed.step(params, mixed.init_state(params), direction)
    fast, _ = strategy.step(params, strategy.init_state(params), direction)
    slow, _ = FedAdam(lr=1e-4, tau=1e-3).step(params, strategy.init_state(params), direction)
    assert torch.equal(stepped, torch.where(mask, slow, fast))
    # SGD-type strategies have one lr; a mask without coordinates changes nothing
    assert with_pretrained_lr(WeightedSGD(lr=0.1), mask, 1e-4) == WeightedSGD(lr=0.1)
    assert with_pretrained_lr(strategy, torch.zeros(4, dtype=torch.bool), 1e-4) is strategy
