"""DP-FedAvg on the engine: Poisson sampling, clipped updates, one Gaussian draw on the sum,
every user of the population accounted."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from privaterec.privacy.samplers import SimulationNoise
from privaterec.config import RunConfig, TrainConfig, fed_config, replace
from privaterec.data.clients import ClientDataset
from privaterec.errors import ConfigError, PrivateRecError
from privaterec.fed.client import client_update
from privaterec.fed.engine import train_federated_run
from privaterec.fed.methods.dp_fedavg import CentralDP
from privaterec.fed.methods import method_from_config, resolve_run_config
from privaterec.fed.objective import LocalObjective
from privaterec.fed.rng import aggregator_noise, client_noise
from privaterec.fed.simulator import eligible_clients, poisson_round, simulate_round
from privaterec.privacy.audit import empirical_epsilon_lower_bound
from privaterec.privacy.central_accounting import central_epsilon


def _central(run_config, **changes):
    return method_from_config(run_config("dp-fedavg", **{"noise_multiplier": 1.0,
                                                              "client_fraction": 0.25,
                                                              "clip": 0.05, **changes}))


def test_configuration_rules():
    train = TrainConfig(method="dp-fedavg")
    with pytest.raises(ConfigError, match="target_epsilon"):
        RunConfig(data="x", train=train)
    base = RunConfig(data="x", train=train, fed=fed_config("dp-fedavg", noise_multiplier=1.0))
    with pytest.raises(ConfigError, match="Poisson"):
        resolve_run_config(replace(base, fed=replace(base.fed, clients_per_round=5)))
    with pytest.raises(ConfigError, match="dp-fedrec"):
        resolve_run_config(RunConfig(data="x", train=TrainConfig(method="dp-fedrec"),
                                     fed=fed_config("dp-fedrec", noise_multiplier=1.0)))
    resolved = resolve_run_config(replace(base, fed=fed_config(
        "dp-fedavg", target_epsilon=8.0, rounds=20, client_fraction=0.1)))
    z = resolved.fed.settings.noise_multiplier
    assert z is not None
    assert resolved.fed.report_delta == resolved.fed.settings.target_delta == 1e-5
    assert central_epsilon(noise_multiplier=z, sampling_rate=0.1, rounds=20,
                           delta=1e-5) <= 8.0
    assert resolve_run_config(resolved) == resolved  # a resolved config.yaml re-resolves


def test_poisson_sampling_rate(clients):
    eligible = eligible_clients(clients)
    sizes = [len(poisson_round(eligible, 0.25, seed=0, round_index=t)) for t in range(400)]
    n = len(eligible)
    mean = sum(sizes) / len(sizes)
    assert mean == pytest.approx(0.25 * n, abs=4 * math.sqrt(0.25 * 0.75 * n / 400))
    assert len(set(sizes)) > 3  # the count varies: it is not a fixed-size sample


def test_round_is_the_noised_sum_of_clipped_updates_over_qn(make_objective, clients,
                                                            run_config):
    objective = make_objective("nrms", seed=0)
    theta = objective.parameters()
    method = _central(run_config)
    population = len(eligible_clients(clients))
    selected = [1, 4, 7]
    result = simulate_round(objective, theta, clients, selected, method, seed=3,
                            round_index=2)
    payloads = [client_update(objective, theta, clients.client(u), method,
                              noise=client_noise(3, 2, u)).payload for u in selected]
    assert all(float(p.double().norm()) <= 0.05 for p in payloads)  # clipped to C, exactly
    noise = aggregator_noise(3, 2).draw((objective.dimension,), mechanism="gaussian",
                                        scale=1.0 * 0.05)
    expected = (torch.stack(payloads).sum(0) + noise) / (0.25 * population)
    torch.testing.assert_close(result.direction, expected, rtol=1e-4, atol=1e-7)
    assert result.events == [(), (), ()]
    assert result.population_events == (method.central_event(),)


def test_empty_round_releases_noise_of_the_calibrated_scale(make_objective, clients,
                                                            run_config):
    objective = make_objective("nrms", seed=0)
    method = _central(run_config)
    population = len(eligible_clients(clients))
    result = simulate_round(objective, objective.parameters(), clients, [], method, seed=0,
                            round_index=0)
    sigma = 1.0 * 0.05 / (0.25 * population)
    d = objective.dimension
    assert float(result.direction.double().std()) == pytest.approx(sigma, rel=5 / math.sqrt(d))


def _silent_clients(fed_data, strip_clicks) -> tuple[ClientDataset, int]:
    """The clients with user 1's clicks removed (no training sample), and that user's index."""
    train = fed_data.dataset.train
    silent = sorted({imp.user_id for imp in train.behaviors})[1]
    clients = strip_clicks(train, fed_data.features, silent,
                           history_len=int(fed_data.clients.history.shape[1]))
    return clients, clients.user_ids.index(silent)


def test_the_population_is_every_training_user_whatever_their_data(fed_data, make_model,
                                                                  run_config, strip_clicks):
    """N, the sample and the ledger must not depend on anyone's data (one user's data
    replaced): a user whose impressions have no click is counted in N (the divisor qN),
    sampled and accounted; sampled, they take part with a zero update."""
    clients, index = _silent_clients(fed_data, strip_clicks)
    assert index not in eligible_clients(clients).tolist()
    config = run_config("dp-fedavg", noise_multiplier=2.0, client_fraction=0.5, clip=0.05,
                        rounds=3, target_delta=1e-3)
    method = method_from_config(config)
    population = method.population(clients)
    assert population.tolist() == list(range(clients.num_users))
    sampled_in = [t for t in range(3) if index in method.select(population, 0, seed=0,
                                                                round_index=t)]
    assert sampled_in  # the silent user is drawn in some round of this seed
    state = train_federated_run(config, make_model("nrms", seed=0), clients, progress=False)
    assert sorted(state.ledger.users) == sorted(clients.user_ids)
    objective = LocalObjective(make_model("nrms", seed=0))
    empty = simulate_round(objective, objective.parameters(), clients, [], method, seed=0,
                           round_index=1)  # the noise alone, over qN with N every user
    noise = aggregator_noise(0, 1).draw((objective.dimension,), mechanism="gaussian",
                                        scale=2.0 * 0.05)
    torch.testing.assert_close(empty.direction, noise / (0.5 * clients.num_users),
                               rtol=1e-6, atol=0.0)


def test_adaptive_clipping_counts_a_sampled_user_without_a_sample(fed_data, make_model,
                                                                   run_config, strip_clicks,
                                                                   monkeypatch):
    """Replaced by data without a training sample, a sampled user takes part with a zero
    update, which is unclipped: the release's count must include its +½ (else the count
    would move by ½ with that user's data, beyond what the accounting allows for)."""
    clients, index = _silent_clients(fed_data, strip_clicks)
    config = run_config("dp-fedavg", noise_multiplier=2.0, client_fraction=0.5, clip=0.05,
                        rounds=3, target_delta=1e-3, adaptive_clip_quantile=0.5,
                        clip_count_stddev=3.0)
    method = method_from_config(config)
    assert isinstance(method, CentralDP)
    objective = LocalObjective(make_model("nrms", seed=0))
    params = objective.parameters()
    n = clients.num_users
    out = simulate_round(objective, params, clients, [index], method, seed=0, round_index=1)
    expected = method.aggregate(torch.zeros(objective.dimension), 0.5, population=n,
                                noise=aggregator_noise(0, 1))
    assert out.metrics == expected.metrics
    torch.testing.assert_close(out.direction, expected.direction, rtol=0.0, atol=0.0)
    absent = method.aggregate(torch.zeros(objective.dimension), 0.0, population=n,
                              noise=aggregator_noise(0, 1))
    assert out.metrics["unclipped_fraction"] != absent.metrics["unclipped_fraction"]
    assert out.server_state != absent.server_state  # the count reaches the next clip
    # Training: the loop hands the round every sampled user, the idle one included.
    seen: list[tuple[int, int]] = []
    real_round = CentralDP.round

    def spy(self, task, params, inputs, generators, context):
        seen.append((context.round_index, context.idle_clients))
        return real_round(self, task, params, inputs, generators, context)

    monkeypatch.setattr(CentralDP, "round", spy)
    state = train_federated_run(config, make_model("nrms", seed=0), clients, progress=False)
    population = method.population(clients)
    sampled = [method.select(population, 0, seed=0, round_index=t) for t in range(3)]
    assert any(index in s for s in sampled)  # the idle user is drawn in some round
    assert seen == [(t, int(index in s)) for t, s in enumerate(sampled)]
    assert [e["clients"] for e in state.log] == [len(s) for s in sampled]


def test_training_accounts_every_user_of_the_population(fed_data, clients, make_model,
                                                        run_config):
    config = replace(run_config("dp-fedavg", noise_multiplier=2.0, client_fraction=0.2,
                                clip=0.05, rounds=3, target_delta=1e-3))
    state = train_federated_run(config, make_model("nrms", seed=0), clients, progress=False)
    eligible = [clients.user_ids[int(u)] for u in eligible_clients(clients)]
    assert sorted(state.ledger.users) == sorted(eligible)  # sampled or not
    eps = state.ledger.user_epsilon(eligible[0], delta=1e-3, adjacency="user")
    assert eps == pytest.approx(central_epsilon(noise_multiplier=2.0, sampling_rate=0.2,
                                                rounds=3, delta=1e-3), rel=1e-3)
    # delta must be below 1/N; the Flower engine is refused without secure aggregation.
    with pytest.raises(ConfigError, match="1/N"):
        train_federated_run(replace(config, fed=replace(
            config.fed, settings=replace(config.fed.settings, target_delta=0.5),
            report_delta=0.5)),
                            make_model("nrms", seed=0), clients, progress=False)
    with pytest.raises(ConfigError, match="simulator"):
        train_federated_run(replace(config, fed=replace(config.fed, engine="flower")),
                            make_model("nrms", seed=0), clients, progress=False)


def test_a_refused_central_run_creates_no_run_directory(tmp_path, fed_data):
    """dp-fedavg's rule: a delta >= 1/N is refused before the run exists."""
    from privaterec.data.mind import write_dataset
    from privaterec.runs.ranking import train_run
    data = tmp_path / "data"
    write_dataset(data, fed_data.dataset)
    config = RunConfig(data=str(data), train=TrainConfig(method="dp-fedavg"),
                       fed=fed_config("dp-fedavg", rounds=1, noise_multiplier=1.0,
                                      target_delta=0.5))
    with pytest.raises(ConfigError, match="1/N"):
        train_run(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def _audit_round(method, *, sign: float, trials: int, offset: int) -> np.ndarray:
    """The released coordinate of one round of the real code, ``trials`` times: Poisson
    sampling (:meth:`CentralDP.select`), each sampled client's update clipped
    (:meth:`privatize`), then :meth:`aggregate`'s noise and division by qN. User 0's raw
    update is ``sign`` · 5 (clipped to ±C); the other users' are 0."""
    population = torch.arange(4)
    out = np.empty(trials)
    for trial in range(trials):
        sampled = method.select(population, 0, seed=offset + trial, round_index=0)
        raw = torch.tensor([[sign * 5.0] if u == 0 else [0.0] for u in sampled])
        clipped, _ = method.privatize(raw.reshape(len(sampled), 1),
                                      [SimulationNoise(torch.Generator()) for _ in sampled])
        total = clipped.sum(0) if len(sampled) else torch.zeros(1)
        generator = torch.Generator().manual_seed(offset + trial)
        out[trial] = float(method.aggregate(total, 0.0, population=4,
                                            noise=SimulationNoise(generator)).direction[0])
    return out


def test_audit_of_the_real_round_at_q_below_one(run_config, monkeypatch):
    """End-to-end distinguishing game on the engine's own round at q = 0.5 (user 0's data
    replaced: update +C or -C, each sampled with probability q): the Clopper-Pearson lower
    bound on epsilon stays below the ledger's per-round epsilon, and the test has power; the
    same round with its noise 10x too small is caught above the claim."""
    method = method_from_config(run_config("dp-fedavg", noise_multiplier=1.0,
                                           client_fraction=0.5, clip=0.05,
                                           target_delta=1e-5))
    event = method.central_event()
    claimed = central_epsilon(noise_multiplier=1.0, sampling_rate=0.5, rounds=1, delta=1e-5)
    assert event.epsilon == pytest.approx(claimed, rel=1e-9)  # the ledger's per-round claim
    threshold = 0.5 * 0.05 / (0.5 * 4)  # fixed before any draw: half of C, over qN
    trials = 10_000

    def bound() -> float:
        minus = _audit_round(method, sign=-1.0, trials=trials, offset=0)
        plus = _audit_round(method, sign=+1.0, trials=trials, offset=trials)
        return empirical_epsilon_lower_bound(minus, plus, threshold, alpha=0.05,
                                             delta=event.delta or 0.0)

    honest = bound()
    assert 0.5 < honest <= claimed, (honest, claimed)
    central_noise = CentralDP.central_noise
    monkeypatch.setattr(CentralDP, "central_noise",
                        lambda self, d, source: central_noise(self, d, source) / 10)
    assert bound() > claimed


def test_deployed_central_noise_is_float_safe(run_config):
    """Mironov's low-bit test on the deployed aggregator's release of a sum (σ = z·C = 0.05):
    among outputs with |y| < 2^-5, the share that is not a multiple of 2^-27 must not tell
    a sum of 0 from a sum of 0.1. Noise drawn at zero and added to the sum in float32 gives
    about 0.77 at 0 and exactly 0 at 0.1 (0.1's float32 spacing is 2^-27); the float-safe
    release (OpenDP's discrete Gaussian on the float64 sum) gives about the same share at
    both."""
    from privaterec.privacy.samplers import SecureNoise

    method = _central(run_config)
    assert method.central_calibration().scale == pytest.approx(0.05)
    source = SecureNoise()

    def fine_share(value: float) -> float:
        y = method.release_sum(torch.full((20_000,), value), source)
        assert y.dtype == torch.float32
        window = y.abs() < 2.0 ** -5
        fine = window & (y * 2.0 ** 27 != torch.round(y * 2.0 ** 27))
        assert int(window.sum()) > 500  # ~9,400 at 0 and ~1,600 at 0.1
        return float(fine.sum() / window.sum())

    at_zero, at_tenth = fine_share(0.0), fine_share(0.1)
    assert 0.6 < at_zero < 0.95 and 0.6 < at_tenth < 0.95, (at_zero, at_tenth)
    assert abs(at_zero - at_tenth) < 0.1
    with pytest.raises(PrivateRecError, match="release_sum"):
        method.central_noise(4, source)  # the zero-draw is a simulation's only


@pytest.mark.parametrize("method_name, settings", [
    ("dp-fedrec", {"epsilon_train": 2.0, "clip": 0.005}),
    ("fednewsrec", {}),
])
def test_who_takes_part_does_not_depend_on_clicks_for_local_dp(fed_data, make_model,
                                                              run_config, strip_clicks,
                                                              method_name, settings):
    """Removing a user's only clicks changes neither the population (privacy.json's N), nor
    who is sampled, nor the ledger: local-DP methods sample from the roster too, and the
    user, sampled, sends the noise alone (a release of the same shape)."""
    clients, index = _silent_clients(fed_data, strip_clicks)
    assert index not in eligible_clients(clients).tolist()  # no training sample left
    config = run_config(method_name, clients_per_round=30, rounds=3, **settings)
    method = method_from_config(config)
    assert method.population(clients).tolist() == method.population(fed_data.clients).tolist()
    assert method.population(clients).tolist() == list(range(clients.num_users))
    states = [train_federated_run(config, make_model("nrms", seed=0), c, progress=False)
              for c in (fed_data.clients, clients)]
    full, silent = (s.ledger for s in states)
    assert sorted(full.users) == sorted(silent.users)
    assert clients.user_ids[index] in silent.users  # sampled: accounted like anyone
    assert all(full.events(u) == silent.events(u) for u in full.users)
    assert [e["clients"] for e in states[0].log] == [e["clients"] for e in states[1].log]
    assert bool(torch.isfinite(states[1].params).all())
