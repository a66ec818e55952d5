"""The vectorized simulator: sampling, rounds equal to the sequential reference, training,
resumption and the privacy ledger."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import pytest
import torch
from scipy import stats

from privaterec.privacy.samplers import SimulationNoise
from privaterec.config import FedConfig
from privaterec.errors import TrainingDivergedError
from privaterec.data.clients import build_client_dataset
from privaterec.fed.client import client_candidates
from privaterec.fed.methods import FedRec, method_from_config
from privaterec.fed.objective import ClientBatch
from privaterec.fed.simulator import (clients_per_round, eligible_clients, sample_round,
                                      sequential_round, simulate_round, train_federated)
from privaterec.fed.strategies import build_strategy
from privaterec.runtime.checkpoint import load_checkpoint

NO_SAMPLE_USERS = (5, 17, 30)


@pytest.fixture(scope="module")
def sparse_clients(fed_data):
    """The synthetic clients with three users whose impressions have no click (no sample)."""
    users = sorted({imp.user_id for imp in fed_data.dataset.train.behaviors})
    silent = {users[i] for i in NO_SAMPLE_USERS}
    behaviors = [dataclasses.replace(imp, labels=tuple(0 for _ in imp.candidates))
                 if imp.user_id in silent else imp for imp in fed_data.dataset.train.behaviors]
    split = dataclasses.replace(fed_data.dataset.train, behaviors=behaviors)
    clients = build_client_dataset(split, fed_data.features, history_len=5)
    assert clients.num_users == 40 and clients.user_ids == users
    return clients


# ------------------------------------------------------------------------------ sampling
def test_eligible_clients_have_a_sample(sparse_clients):
    eligible = eligible_clients(sparse_clients).tolist()
    assert eligible == [u for u in range(40) if u not in NO_SAMPLE_USERS]


@pytest.mark.parametrize("fed,eligible,expected", [
    (FedConfig(client_fraction=0.1), 40, 4),
    (FedConfig(client_fraction=0.02), 40, 1),   # round(0.8) = 1
    (FedConfig(client_fraction=0.01), 40, 1),   # round(0.4) = 0 -> at least 1
    (FedConfig(client_fraction=0.26), 37, 10),  # r * eligible users = 9.62
    (FedConfig(client_fraction=1.0), 37, 37),
    (FedConfig(client_fraction=0.1, clients_per_round=7), 40, 7),  # override
    (FedConfig(clients_per_round=100), 37, 37),  # at most every eligible user
])
def test_clients_per_round(fed, eligible, expected):
    assert clients_per_round(fed, eligible) == expected


def test_sample_round_is_seeded_distinct_sorted_and_eligible(sparse_clients):
    eligible = eligible_clients(sparse_clients)
    rounds = [sample_round(eligible, 6, seed=4, round_index=t) for t in range(50)]
    for selected in rounds:
        assert len(selected) == 6 and len(set(selected)) == 6
        assert selected == sorted(selected)
        assert not set(selected) & set(NO_SAMPLE_USERS)
    assert rounds[7] == sample_round(eligible, 6, seed=4, round_index=7)
    assert len({tuple(r) for r in rounds}) == 50  # rounds differ
    assert rounds[7] != sample_round(eligible, 6, seed=5, round_index=7)  # seeds differ
    assert sample_round(eligible, 37, seed=0, round_index=0) == eligible.tolist()


def test_sample_round_is_uniform_over_eligible_users(sparse_clients):
    eligible = eligible_clients(sparse_clients)
    counts = Counter(u for t in range(600)
                     for u in sample_round(eligible, 5, seed=1, round_index=t))
    assert set(counts) == set(eligible.tolist())
    observed = [counts[u] for u in eligible.tolist()]
    assert stats.chisquare(observed).pvalue > 1e-3  # expected 600·5/37 each


# ------------------------------------------------------------- simulate == sequential
CASES = {
    "fedrec": ("fedrec", {}),
    "fednewsrec": ("fednewsrec", {}),
    "dp-fedrec-laplace": ("dp-fedrec", {"epsilon_train": 1.0, "clip": 0.01}),
    "dp-fedrec-gaussian": ("dp-fedrec", {"epsilon_train": 1.0, "clip": 0.01,
                                         "noise": "gaussian"}),
    "dp-fedrec-inf": ("dp-fedrec", {"clip": 0.01}),
    "fedavg-3-steps": ("fedrec", {"strategy": "fedavg", "local_steps": 3, "local_lr": 0.1}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_simulate_round_equals_sequential_round(case, make_objective, clients, run_config,
                                                perturb):
    method_name, fed = CASES[case]
    config = run_config(method_name, max_client_samples=3, **fed)
    method = method_from_config(config)
    objective = make_objective("nrms")
    theta = perturb(objective)
    selected = sample_round(eligible_clients(clients), 8, seed=9, round_index=2)
    fast = simulate_round(objective, theta, clients, selected, method, seed=9, round_index=2,
                          chunk_clients=3)
    slow = sequential_round(objective, theta, clients, selected, method, seed=9, round_index=2)
    torch.testing.assert_close(fast.direction, slow.direction, rtol=1e-4, atol=1e-6)
    assert fast.num_examples == slow.num_examples
    assert fast.num_examples == [min(3, int(clients.samples_per_user()[u])) for u in selected]
    assert fast.events == slow.events == [method.events(objective.dimension)] * 8
    n = torch.tensor(fast.num_examples, dtype=torch.float64)
    mean_fast = float((n * torch.tensor(fast.losses, dtype=torch.float64)).sum() / n.sum())
    mean_slow = float((n * torch.tensor(slow.losses, dtype=torch.float64)).sum() / n.sum())
    assert mean_fast == pytest.approx(mean_slow, rel=1e-5)
    if method.per_client_release or method.local_steps > 1:
        assert fast.losses == pytest.approx(slow.losses, rel=1e-5)
    assert fast.direction.abs().max() > 0


@pytest.mark.parametrize("method_name", ["fedrec", "fednewsrec"])
def test_round_with_the_empty_history_user(method_name, make_objective, clients,
                                           client_method):
    """User 6 has an empty history, which the GRU of the fednewsrec user encoder reads over
    all H anonymous positions: the one-backward round, the vmapped chunks and the
    one-client reference must all compute that same model."""
    method = client_method(method_name)
    objective = make_objective("fednewsrec")
    theta = objective.parameters()
    fast = simulate_round(objective, theta, clients, [2, 6, 9], method, seed=0, round_index=0,
                          chunk_clients=2)
    slow = sequential_round(objective, theta, clients, [2, 6, 9], method, seed=0, round_index=0)
    torch.testing.assert_close(fast.direction, slow.direction, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------------------ training
def _train(make_objective, clients, run_config, method_name, *, seed=0, model_seed=0,
           checkpoint=None, stop=None, crash_at=None, model_changes=None, **fed):
    config = run_config(method_name, seed=seed, **fed)
    objective = make_objective("nrms", seed=model_seed, **(model_changes or {}))
    method = method_from_config(config)
    round_fn = None
    if crash_at is not None:
        def round_fn(params, selected, t):
            if t == crash_at:
                raise KeyboardInterrupt  # killed during round t + 1
            return simulate_round(objective, params, clients, selected, method, seed=seed,
                                  round_index=t, chunk_clients=config.fed.chunk_clients)
    state = train_federated(objective, clients, config.fed, method,
                            build_strategy(config.fed), seed=seed, checkpoint_path=checkpoint,
                            progress=False, stop_after_rounds=stop, round_fn=round_fn)
    return state, objective, config


def _full_loss(objective, clients, params):
    users = list(range(clients.num_users))
    method = FedRec(negatives=4, max_samples=64)
    generator = SimulationNoise(torch.Generator().manual_seed(123))
    candidates = [client_candidates(clients.client(u), method, noise=generator)
                  for u in users]
    batch = ClientBatch.stack([clients.history[u] for u in users],
                              [clients.history_mask[u] for u in users], candidates)
    return objective.round_gradient(params, batch)[1]


def test_fedrec_training_lowers_the_loss(make_objective, clients, run_config):
    trainable = {"freeze_embeddings": False}
    initial_params = make_objective("nrms", **trainable).parameters()  # same seed, same θ₀
    state, objective, _ = _train(make_objective, clients, run_config, "fedrec", rounds=30,
                                 clients_per_round=20, server_lr=0.03, model_changes=trainable)
    initial = _full_loss(objective, clients, initial_params)
    final = _full_loss(objective, clients, state.params)
    assert initial == pytest.approx(math.log(5), rel=0.02)  # ≈ chance with 1 + 4 candidates
    assert final < 0.85 * initial
    losses = [e["loss"] for e in state.log]
    assert len(losses) == 30
    assert sum(losses[-5:]) < sum(losses[:5])
    assert torch.equal(objective.parameters(), state.params)  # final θ loaded in the model


RESUME = dict(rounds=6, checkpoint_every=2, clients_per_round=6, max_client_samples=4)


def _assert_same_state(a, b):
    assert a.round_index == b.round_index
    assert torch.equal(a.params, b.params)
    assert a.strategy_state.keys() == b.strategy_state.keys()
    assert all(torch.equal(a.strategy_state[k], b.strategy_state[k]) for k in a.strategy_state)
    assert a.ledger == b.ledger
    assert a.log == b.log


@pytest.mark.parametrize("method_name", ["fedrec", "fednewsrec"])
@pytest.mark.parametrize("interruption", ["stop-at-checkpoint", "stop-between-checkpoints",
                                          "killed-between-checkpoints"])
def test_resumed_run_is_bitwise_equal_to_an_uninterrupted_run(
        method_name, interruption, make_objective, clients, run_config, tmp_path):
    reference, _, config = _train(make_objective, clients, run_config, method_name, **RESUME)
    assert config.fed.strategy == ("fedadam" if method_name == "fedrec" else "sgd")
    ckpt = tmp_path / "checkpoint.pt"
    kwargs = dict(checkpoint=ckpt, **RESUME)
    if interruption == "stop-at-checkpoint":
        _train(make_objective, clients, run_config, method_name, stop=2, **kwargs)
        assert load_checkpoint(ckpt)["round"] == 2
    elif interruption == "stop-between-checkpoints":
        _train(make_objective, clients, run_config, method_name, stop=3, **kwargs)
        assert load_checkpoint(ckpt)["round"] == 3
        _train(make_objective, clients, run_config, method_name, stop=1, **kwargs)
        assert load_checkpoint(ckpt)["round"] == 4
    else:  # no checkpoint is written when killed: rounds 5.. are redone from round 4's
        with pytest.raises(KeyboardInterrupt):
            _train(make_objective, clients, run_config, method_name, crash_at=4, **kwargs)
        assert load_checkpoint(ckpt)["round"] == 4
    resumed, objective, _ = _train(make_objective, clients, run_config, method_name, **kwargs)
    _assert_same_state(resumed, reference)
    assert [e["round"] for e in resumed.log] == [1, 2, 3, 4, 5, 6]
    assert torch.equal(objective.parameters(), reference.params)
    saved = load_checkpoint(ckpt)
    assert saved["round"] == 6 and torch.equal(saved["params"], reference.params)


def test_resume_takes_the_whole_model_from_the_checkpoint(make_objective, clients, run_config,
                                                          tmp_path):
    """The checkpoint holds the model's state_dict, frozen word vectors included: a run
    resumed with a differently initialised model must still continue the saved run."""
    reference, _, _ = _train(make_objective, clients, run_config, "fedrec", **RESUME)
    ckpt = tmp_path / "checkpoint.pt"
    _train(make_objective, clients, run_config, "fedrec", checkpoint=ckpt, stop=2, **RESUME)
    resumed, objective, _ = _train(make_objective, clients, run_config, "fedrec", model_seed=99,
                                   checkpoint=ckpt, **RESUME)
    _assert_same_state(resumed, reference)


def test_checkpoints_are_written_every_n_rounds_and_at_the_end(make_objective, clients,
                                                               run_config, tmp_path):
    config = run_config("fedrec", rounds=5, checkpoint_every=2, clients_per_round=3)
    objective = make_objective("nrms")
    seen = []
    train_federated(objective, clients, config.fed, method_from_config(config),
                    build_strategy(config.fed), seed=0, checkpoint_path=tmp_path / "c.pt",
                    on_checkpoint=lambda state: seen.append(state.round_index), progress=False)
    assert seen == [2, 4, 5]
    saved = load_checkpoint(tmp_path / "c.pt")
    assert saved["method"] == "fedrec" and saved["round"] == 5
    objective.load(saved["params"])
    state_dict = objective.model.state_dict()
    assert all(torch.equal(saved["model"][k], state_dict[k]) for k in state_dict)


def test_ledger_has_one_event_per_user_and_round_taken_part(make_objective, clients,
                                                            run_config):
    rounds, m, cap = 5, 6, 4
    state, objective, config = _train(make_objective, clients, run_config, "fednewsrec",
                                      rounds=rounds, clients_per_round=m,
                                      max_client_samples=cap)
    eligible = eligible_clients(clients)
    participation = Counter()
    counts = clients.samples_per_user()
    for t in range(rounds):
        selected = sample_round(eligible, m, seed=0, round_index=t)
        participation.update(selected)
        entry = state.log[t]
        assert (entry["round"], entry["clients"]) == (t + 1, m)
        assert entry["samples"] == sum(min(cap, int(counts[u])) for u in selected)
    d = objective.dimension
    per_round = 2 * 0.005 * d / 0.015  # FedNewsRec ε of a whole update: 2δD/λ
    event = method_from_config(config).event(d)
    assert event.epsilon == pytest.approx(per_round)
    assert sorted(state.ledger.users) == sorted(clients.user_ids[u] for u in participation)
    assert len(state.ledger.users) < clients.num_users  # someone never took part
    for u, count in participation.items():
        user = clients.user_ids[u]
        assert state.ledger.events(user) == [(event, count)]
        assert state.ledger.user_epsilon(user, delta=1e-5, composition="basic") == \
            pytest.approx(count * per_round)
    assert max(participation.values()) > 1  # composition over rounds was exercised


def test_fedrec_ledger_records_non_private_releases(make_objective, clients, run_config):
    state, _, _ = _train(make_objective, clients, run_config, "fedrec", rounds=2,
                         clients_per_round=4)
    users = state.ledger.users
    assert 4 <= len(users) <= 8
    assert all(math.isinf(state.ledger.user_epsilon(u, delta=1e-5)) for u in users)


def test_evaluation_callback_sees_the_current_parameters(make_objective, clients, run_config):
    config = run_config("fedrec", rounds=5, eval_every=2, clients_per_round=3)
    objective = make_objective("nrms")
    calls = []

    def evaluate(t, state):
        assert torch.equal(objective.parameters(), state.params)
        calls.append(t)
        return {"score": float(t)}

    state = train_federated(objective, clients, config.fed, method_from_config(config),
                            build_strategy(config.fed), seed=0, on_evaluate=evaluate,
                            progress=False)
    assert calls == [2, 4]
    assert [e.get("score") for e in state.log] == [None, 2.0, None, 4.0, None]


def test_training_is_seeded_and_leaves_the_global_rng_alone(make_objective, clients,
                                                            run_config):
    fed = dict(rounds=3, clients_per_round=4)
    torch.manual_seed(5)
    expected = torch.rand(3)
    a, _, _ = _train(make_objective, clients, run_config, "fednewsrec", **fed)
    b, _, _ = _train(make_objective, clients, run_config, "fednewsrec", **fed)
    assert torch.equal(a.params, b.params)
    c, _, _ = _train(make_objective, clients, run_config, "fednewsrec", seed=1, **fed)
    assert not torch.equal(a.params, c.params)

    config = run_config("fednewsrec", **fed)
    objective = make_objective("nrms")  # building a model draws from the global RNG ...
    torch.manual_seed(5)
    train_federated(objective, clients, config.fed, method_from_config(config),
                    build_strategy(config.fed), seed=0, progress=False)
    assert torch.equal(torch.rand(3), expected)  # ... training does not


def test_divergence_raises_a_clear_error_and_keeps_the_last_checkpoint(
        make_objective, clients, run_config, tmp_path):
    checkpoint = tmp_path / "checkpoint.pt"
    with pytest.raises(TrainingDivergedError, match=r"diverged in round \d+.*--server-lr"):
        _train(make_objective, clients, run_config, "fedrec", rounds=40, clients_per_round=10,
               strategy="sgd", server_lr=1e12, checkpoint_every=1, checkpoint=checkpoint)
    saved = load_checkpoint(checkpoint)  # the last finite state, never a NaN one
    assert bool(torch.isfinite(saved["params"]).all())
