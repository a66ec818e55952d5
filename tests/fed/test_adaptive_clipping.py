"""DP-FedAvg with adaptive clipping (Andrew, Thakkar, McMahan & Ramaswamy, NeurIPS 2021):
the clip tracks a quantile of the update norms, both noises have their calibrated scales,
the round's release is audited, the clip is checkpointed."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from privaterec.config import RunConfig, TrainConfig, fed_config, replace
from privaterec.errors import ConfigError
from privaterec.fed.client import client_update
from privaterec.fed.engine import train_federated_run
from privaterec.fed.methods import FedRec, method_from_config, resolve_run_config
from privaterec.fed.methods.dp_fedavg import CLIP_INDICATOR, CentralDP, expected_clients
from privaterec.fed.rng import aggregator_noise, client_noise
from privaterec.fed.simulator import eligible_clients, simulate_round, train_federated
from privaterec.fed.strategies import build_strategy
from privaterec.method_settings import DPFedAvgSettings
from privaterec.privacy.adaptive_clip import AdaptiveClipping, clip_indicators
from privaterec.privacy.audit import audit_mechanism
from privaterec.privacy.central_accounting import central_epsilon
from privaterec.privacy.samplers import NoiseSource, SimulationNoise
from privaterec.privacy.report import build_privacy_summary, format_privacy_report
from privaterec.runs.report import release_description
from privaterec.runtime.checkpoint import load_checkpoint

ADAPTIVE = dict(noise_multiplier=1.0, client_fraction=0.25, clip=0.05,
                adaptive_clip_quantile=0.5, clip_count_stddev=1.0)


def central(*, clip: float = 0.3, z: float = 1.0, q: float = 0.1, quantile: float = 0.5,
            lr: float = 0.2, sigma_b: float | None = 0.6) -> CentralDP:
    return CentralDP(negatives=4, max_samples=64, inner=FedRec(negatives=4, max_samples=64),
                     clip=clip, noise_multiplier=z, sampling_rate=q, rounds=1, delta=1e-5,
                     adaptive=AdaptiveClipping(target_quantile=quantile, learning_rate=lr,
                                               count_stddev=sigma_b))


# ------------------------------------------------------------------------ configuration
def test_configuration_rules_and_defaults(run_config):
    fixed = method_from_config(run_config("dp-fedavg", noise_multiplier=1.0))
    assert fixed.adaptive is None and fixed.server_state() == {}  # off by default
    method = method_from_config(run_config("dp-fedavg", **ADAPTIVE))
    assert method.adaptive == AdaptiveClipping(target_quantile=0.5, learning_rate=0.2,
                                               count_stddev=1.0)
    assert method.server_state() == {"clip": 0.05}
    assert method.at_server_state({"clip": 0.2}).clip == 0.2
    assert method.at_server_state({"clip": 0.05}) is method
    train = TrainConfig(method="dp-fedavg")
    for fed, match in [
        (dict(noise_multiplier=1.0, clip_lr=0.1), "--adaptive-clip-quantile"),
        (dict(noise_multiplier=1.0, clip_count_stddev=3.0), "--adaptive-clip-quantile"),
        (dict(noise_multiplier=1.0, adaptive_clip_quantile=0.5, clip_count_stddev=0.5),
         "--clip-count-stddev"),
    ]:
        with pytest.raises(ConfigError, match=match):
            resolve_run_config(RunConfig(data="x", train=train,
                                         fed=fed_config("dp-fedavg", **fed)))
    resolved = resolve_run_config(RunConfig(data="x", train=train, fed=fed_config(
        "dp-fedavg", noise_multiplier=1.0, adaptive_clip_quantile=0.5)))
    assert resolved.fed.settings.clip_lr == 0.2  # the saved config states the default
    with pytest.raises(ConfigError, match="does not apply to dp-fedrec"):
        resolve_run_config(RunConfig(data="x", train=TrainConfig(method="dp-fedrec"),
                                     fed=fed_config("dp-fedrec", adaptive_clip_quantile=0.5)))


@pytest.mark.parametrize("field,value", [
    ("adaptive_clip_quantile", 1.5), ("adaptive_clip_quantile", 0.0),
    ("adaptive_clip_quantile", math.nan), ("clip_lr", 0.0), ("clip_lr", math.inf),
    ("clip_count_stddev", -1.0),
])
def test_bad_values_are_refused_with_their_name(field, value):
    with pytest.raises(ConfigError, match=field):
        DPFedAvgSettings(noise_multiplier=1.0, **{"adaptive_clip_quantile": 0.5, field: value})


def test_flower_and_a_count_noise_too_small_for_the_population_are_refused(clients, make_model,
                                                                         run_config):
    config = run_config("dp-fedavg", rounds=1, **ADAPTIVE)
    with pytest.raises(ConfigError, match="--adaptive-clip-quantile.*simulator"):
        train_federated_run(replace(config, fed=replace(config.fed, engine="flower")),
                            make_model("nrms"), clients, progress=False)
    # The default sigma_b = m/20: m = round(0.25 * 40) = 10 clients, sigma_b = 0.5 = z/2.
    default = run_config("dp-fedavg", rounds=1, **{**ADAPTIVE, "clip_count_stddev": None})
    assert expected_clients(0.25, len(eligible_clients(clients))) == 10
    with pytest.raises(ConfigError, match="--clip-count-stddev"):
        train_federated_run(default, make_model("nrms"), clients, progress=False)


# ------------------------------------------------------------------------------- a round
def test_clients_send_their_indicator_and_the_round_noises_both_sums(make_objective, clients,
                                                                     run_config):
    objective = make_objective("nrms", seed=0)
    theta = objective.parameters()
    selected = [1, 4, 9, 20]
    grads = torch.stack([objective.gradient(theta, FedRec(negatives=4, max_samples=64).inputs(
        objective, clients.client(u), noise=client_noise(3, 2, u)))[0]
        for u in selected])
    norms = grads.norm(dim=1).sort().values
    clip = float(norms[1] + norms[2]) / 2  # two clients clipped, two not (none at the edge)
    method = method_from_config(run_config("dp-fedavg", **ADAPTIVE)).at_server_state(
        {"clip": clip})
    population = len(eligible_clients(clients))
    result = simulate_round(objective, theta, clients, selected, method, seed=3,
                            round_index=2)
    updates = [client_update(objective, theta, clients.client(u), method,
                             noise=client_noise(3, 2, u)) for u in selected]
    indicators = [u.sent()[CLIP_INDICATOR] for u in updates]
    assert indicators == clip_indicators(grads, clip).tolist()
    assert sorted(set(indicators)) == [-0.5, 0.5]
    assert all(float(u.payload.norm()) <= clip * (1 + 1e-5) for u in updates)
    z_update, sigma_b = method.noise_split(expected_clients(0.25, population))
    aggregator = aggregator_noise(3, 2)  # the update's noise first, then the count's
    noise = aggregator.draw((objective.dimension,), mechanism="gaussian", scale=z_update * clip)
    count_noise = float(aggregator.draw((1,), mechanism="gaussian", scale=sigma_b,
                                       dtype=torch.float64)[0])
    expected = 0.25 * population
    torch.testing.assert_close(result.direction,
                               (torch.stack([u.payload for u in updates]).sum(0) + noise)
                               / expected, rtol=1e-4, atol=1e-7)
    fraction = min(1.0, max(0.0, (sum(indicators) + count_noise) / expected + 0.5))
    assert result.metrics == {"clip": clip, "unclipped_fraction": pytest.approx(fraction)}
    assert result.server_state == {"clip": pytest.approx(clip * math.exp(-0.2 * (fraction
                                                                                  - 0.5)))}
    assert result.population_events == (method.central_event(),)
    assert result.events == [()] * len(selected)  # the clients spend nothing of their own


def test_both_noises_have_their_calibrated_scales():
    """KS tests at a strict level, each with the power to reject a wrong scale: the update's
    noise is z_update * C (not the unsplit z * C), the count's is sigma_b."""
    method = central(clip=0.3, z=1.0, sigma_b=0.6)  # the count takes 69% of the budget
    z_update, sigma_b = method.noise_split(10)
    assert z_update == pytest.approx((1 - 1 / 1.44) ** -0.5) and sigma_b == 0.6
    noise = SimulationNoise(torch.Generator().manual_seed(0))
    total, _ = method.noised_sums(torch.zeros(50_000), 0.0, population=100, noise=noise)
    x = total.double().numpy()
    assert stats.kstest(x / (z_update * 0.3), "norm").pvalue > 1e-3
    assert stats.kstest(x / (1.0 * 0.3), "norm").pvalue < 1e-6
    counts = np.array([method.noised_sums(torch.zeros(1), 0.0, population=100,
                                          noise=noise)[1] for _ in range(12_000)])
    assert stats.kstest(counts / sigma_b, "norm").pvalue > 1e-3
    assert stats.kstest(counts / (1.15 * sigma_b), "norm").pvalue < 1e-6


@pytest.mark.parametrize("quantile,start", [(0.2, 1e2), (0.5, 1e-3), (0.9, 1e-3)])
def test_the_clip_tracks_the_target_quantile_of_the_norms(quantile, start):
    """Norms ~ lognormal(0, 1), whose gamma quantile is exp(Phi^-1(gamma)); from a clip 1000x
    off, 300 rounds of 200 expected clients (sigma_b = m/20 = 10) bring it there (the step
    is at most a factor exp(0.2 * gamma) up or exp(0.2 * (1 - gamma)) down per round)."""
    method = central(clip=start, q=0.25, quantile=quantile, sigma_b=None)
    rng = np.random.default_rng(1)
    state, clips = method.server_state(), []
    for t in range(300):
        round_method = method.at_server_state(state)
        norms = torch.from_numpy(rng.lognormal(0.0, 1.0, size=rng.binomial(800, 0.25)))
        indicator_sum = float(clip_indicators(norms[:, None], round_method.clip).sum())
        out = round_method.aggregate(torch.zeros(1), indicator_sum, population=800,
                                     noise=SimulationNoise(torch.Generator().manual_seed(t)))
        assert out.server_state is not None
        state = out.server_state
        clips.append(out.metrics["clip"])
    target = math.exp(stats.norm.ppf(quantile))
    assert abs(np.mean(np.log(clips[-100:])) - math.log(target)) < 0.1
    assert abs(math.log(clips[0]) - math.log(target)) > 5  # it came from far away


def test_empirical_audit_of_one_round_stays_below_its_claim():
    """Distinguishing game on the aggregator's real release of one round at q = 1: the
    target's clipped update C and indicator +1/2, against -C and -1/2 (one user replaced,
    the worst case). The likelihood-ratio statistic weighs each sum by its noise variance;
    the Clopper-Pearson bound stays below the claimed epsilon, and sees the count: released
    without its noise, the same game exceeds the claim."""
    clip, z, sigma_b = 1.0, 4.0, 2.4
    method = central(clip=clip, z=z, q=1.0, sigma_b=sigma_b)
    z_update, _ = method.noise_split(1)
    claimed = method.central_event().epsilon
    assert claimed == pytest.approx(central_epsilon(noise_multiplier=z, sampling_rate=1.0,
                                                    rounds=1, delta=1e-5))
    x, x_prime = torch.tensor([clip, 0.5]), torch.tensor([-clip, -0.5])
    weights = (x_prime - x).double() / torch.tensor([(z_update * clip) ** 2, sigma_b ** 2])

    def release(exact_count: bool):
        def mechanism(batch: torch.Tensor, noise: NoiseSource) -> torch.Tensor:
            rows = []
            for row in batch:
                total, count = method.noised_sums(row[:1], float(row[1]), population=1,
                                                  noise=noise)
                rows.append([float(total[0]), float(row[1]) if exact_count else count])
            return torch.tensor(rows, dtype=torch.float64)
        return mechanism

    def audit(exact_count: bool, statistic):
        return audit_mechanism(release(exact_count), x, x_prime, trials=8_000,
                               noise=SimulationNoise(torch.Generator().manual_seed(5)),
                               delta=1e-5, statistic=statistic).epsilon_lower_bound

    def count_only(out: torch.Tensor) -> torch.Tensor:
        return -out[:, 1]

    honest = audit(False, lambda out: out @ weights)
    assert 0.3 < honest <= claimed
    assert audit(True, count_only) > claimed


# -------------------------------------------------------------------------------- a run
def _train(make_objective, clients, run_config, *, checkpoint=None, stop=None,
           crash_at=None, **fed):
    config = run_config("dp-fedavg", **{**ADAPTIVE, "rounds": 6, "checkpoint_every": 2,
                                        "max_client_samples": 4, **fed})
    objective = make_objective("nrms", seed=0)
    method = method_from_config(config)
    round_fn = None
    if crash_at is not None:
        def round_fn(params, selected, t, *, server_state=None):
            if t == crash_at:
                raise KeyboardInterrupt  # killed during round t + 1
            return simulate_round(objective, params, clients, selected, method, seed=0,
                                  round_index=t, server_state=server_state)
    return train_federated(objective, clients, config.fed, method, build_strategy(config.fed),
                           seed=0, checkpoint_path=checkpoint, progress=False,
                           stop_after_rounds=stop, round_fn=round_fn), method


@pytest.mark.parametrize("interruption", ["stopped", "killed"])
def test_a_resumed_run_equals_an_uninterrupted_one(interruption, make_objective, clients,
                                                   run_config, tmp_path):
    reference, method = _train(make_objective, clients, run_config)
    clips = [entry["clip"] for entry in reference.log]
    assert clips[0] == 0.05 and len(set(clips)) == 6  # the clip moves every round
    assert reference.server_state["clip"] not in clips  # the next round's clip
    ckpt = tmp_path / "checkpoint.pt"
    if interruption == "stopped":
        _train(make_objective, clients, run_config, checkpoint=ckpt, stop=3)
        assert load_checkpoint(ckpt)["server_state"] == {"clip": clips[3]}
    else:
        with pytest.raises(KeyboardInterrupt):
            _train(make_objective, clients, run_config, checkpoint=ckpt, crash_at=4)
        assert load_checkpoint(ckpt)["server_state"] == {"clip": clips[4]}
    resumed, _ = _train(make_objective, clients, run_config, checkpoint=ckpt)
    assert torch.equal(resumed.params, reference.params)
    assert all(torch.equal(resumed.strategy_state[k], reference.strategy_state[k])
               for k in reference.strategy_state)
    assert resumed.ledger == reference.ledger and resumed.log == reference.log
    assert resumed.server_state == reference.server_state
    # Adaptive clipping spends what the fixed clip does: the run's epsilon is z's.
    user = reference.ledger.users[0]
    assert reference.ledger.user_epsilon(user, delta=1e-5, adjacency="user") == pytest.approx(
        central_epsilon(noise_multiplier=1.0, sampling_rate=0.25, rounds=6, delta=1e-5),
        rel=1e-3)
    assert len(reference.ledger.users) == len(eligible_clients(clients))


def test_privacy_report_states_the_split_and_the_trust_model(run_config):
    method = method_from_config(run_config("dp-fedavg", rounds=6, **{**ADAPTIVE,
                                                                      "clip_count_stddev": None}))
    release = release_description(method, dimension=10, noised_parameters=["w"],
                                  clients_per_round=60, client_fraction=0.25)
    block = release["adaptive_clipping"]
    z_update, sigma_b = method.noise_split(60)  # the split the rounds use at m = 60
    assert block["count_stddev"] == sigma_b == pytest.approx(3.0)
    assert block["update_noise_multiplier"] == z_update
    assert block["equivalent_noise_multiplier"] == pytest.approx(1.0)
    assert block["initial_clip"] == 0.05 and block["target_quantile"] == 0.5
    assert "clip indicator" in release["central"]["trust"]
    assert release["sends"].startswith("clipped update and clip indicator")
    assert "replaced" in release["central"]["adjacency"]
    from privaterec.privacy.ledger import PrivacyLedger
    ledger = PrivacyLedger()
    ledger.record_many(["a", "b"], method.central_event(), count=3)
    text = format_privacy_report(build_privacy_summary(ledger, release=release, delta=1e-5,
                                                       rounds=3))
    assert "adaptive_clipping: update_noise_multiplier" in text
    assert "adaptive_clipping: count_stddev" in text
    assert "WARNINGS" not in text
