"""Federated methods: configuration defaults, ClientMethod, and privatize (clip + noise).

The noise tests are statistical with fixed seeds (deterministic); each one also checks that
its statistic would reject a wrong scale, so it cannot pass vacuously. The audits use
:mod:`privaterec.privacy.audit` (Clopper–Pearson lower bounds on ε) on the real release
function and on deliberately broken variants, which they must catch.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pytest
import torch
from scipy import stats

import privaterec.privacy.calibrate as calibrated
import privaterec.privacy.noise.gaussian as gaussian_mechanism
from privaterec.config import FedConfig, ModelConfig, RunConfig, TrainConfig, fed_config
from privaterec.errors import ConfigError
from privaterec.fed.methods import (METHODS, ClientMethod, DPFedRec, FedNewsRec, FedRec,
                                    method_from_config, resolve_run_config)
from privaterec.method_settings import (SETTINGS, DPFedRecSettings, FedNewsRecSettings,
                                        FedRecSettings, settings_type)
from privaterec.runs.report import release_description
from privaterec.fed.rng import client_noise
from privaterec.privacy.audit import audit_mechanism
from privaterec.privacy.formulas import gaussian_sigma
from privaterec.privacy.mechanisms import apply_clip
from privaterec.privacy.samplers import NoiseSource, SimulationNoise

DELTA_CLIP, LAMBDA = 0.005, 0.015  # FedNewsRec's δ and λ
FEDNEWSREC = FedNewsRec(negatives=4, max_samples=64, clip=DELTA_CLIP, noise_scale=LAMBDA)


def _dp_fedrec(noise: str, *, clip: float = 0.01, epsilon: float = 1.0,
               delta: float = 1e-5) -> ClientMethod:
    return DPFedRec(negatives=4, max_samples=64, clip=clip, noise=noise,
                    epsilon=epsilon, delta=0.0 if noise == "laplace" else delta)


def _generators(m: int, seed: int = 0) -> list[SimulationNoise]:
    return [client_noise(seed, 0, u) for u in range(m)]


def _updates(m: int, d: int, scale: float, seed: int = 0) -> torch.Tensor:
    return scale * torch.randn(m, d, generator=torch.Generator().manual_seed(seed))


def _clipped(updates: torch.Tensor, method: ClientMethod):
    """The clipped updates (no noise) and the event of one client's release."""
    calibration = method.calibration(int(updates.shape[1]))
    return apply_clip(updates, calibration), calibration.event


@pytest.fixture
def cached_gaussian_calibration(monkeypatch):
    """Calibrate σ once per (ε, δ, Δ) (the analytic calibration takes ~1 ms; a method's
    calibration is cached, but the broken variants of the audits are new methods). Values
    are unchanged."""
    monkeypatch.setattr(gaussian_mechanism, "gaussian_sigma", functools.lru_cache(gaussian_sigma))


# ------------------------------------------------------------------------ configuration
def _resolved(method: str, **fed) -> FedConfig:
    config = RunConfig(data="x", model=ModelConfig(), train=TrainConfig(method=method),
                       fed=fed_config(method, **fed))
    return resolve_run_config(config).fed


def test_fednewsrec_defaults_are_the_papers():
    fed = _resolved("fednewsrec")
    assert (fed.strategy, fed.server_lr, fed.settings.clip, fed.settings.noise_scale,
            fed.client_fraction) == ("sgd", 0.5, 0.005, 0.015, 0.02)


def test_fedrec_and_dp_fedrec_defaults():
    fed = _resolved("fedrec")
    assert (fed.strategy, fed.server_lr, fed.client_fraction, fed.settings) == \
        ("fedadam", 1e-2, 0.02, FedRecSettings())
    fed = _resolved("dp-fedrec", epsilon_train=2.0)
    assert (fed.strategy, fed.server_lr, fed.settings.clip, fed.client_fraction,
            fed.settings.epsilon_train) == ("fedadam", 1e-2, 0.005, 0.02, 2.0)


def test_explicit_values_win_and_server_lr_follows_the_strategy():
    fed = _resolved("fedrec", strategy="fedavg", client_fraction=0.5)
    assert (fed.strategy, fed.server_lr, fed.client_fraction) == ("fedavg", 1.0, 0.5)
    fed = _resolved("fednewsrec", strategy="fedadam", server_lr=0.3, clip=0.01)
    assert (fed.strategy, fed.server_lr, fed.settings.clip, fed.settings.noise_scale) == \
        ("fedadam", 0.3, 0.01, 0.015)


def test_non_federated_methods_are_left_alone():
    config = RunConfig(data="x", train=TrainConfig(method="centralized"))
    assert resolve_run_config(config) == config
    assert config.fed.settings is None


@pytest.mark.parametrize("method,fed,name", [
    ("dp-fedrec", {"noise_scale": 0.1}, "noise_scale"),
    ("fedrec", {"noise_scale": 0.1}, "noise_scale"),
    ("fedrec", {"clip": 0.1}, "clip"),
])
def test_settings_that_do_not_apply_are_rejected(method, fed, name):
    with pytest.raises(ConfigError, match=f"'fed.{name}' does not apply to {method}"):
        _resolved(method, **fed)


def test_each_method_class_declares_its_settings_and_defaults():
    """The registry's classes read the settings class of their own name; every federated
    method's settings construct with real defaults (dp-fedavg needs its ε or z)."""
    for name, cls in METHODS.items():
        assert cls.settings_type is settings_type(name) and cls.name == name
        assert cls.server_defaults.strategy in ("sgd", "fedadam")
    for name, kind in SETTINGS.items():
        if name == "dp-fedavg":
            with pytest.raises(ConfigError, match="target_epsilon"):
                kind()
            continue
        assert all(getattr(kind(), f) is not None for f in kind.field_names()
                   if not (name == "privaterec" and f == "clip")), name


@pytest.mark.parametrize("name,value", [
    ("rounds", 0), ("client_fraction", 0.0), ("client_fraction", 1.5),
    ("clients_per_round", 0), ("strategy", "adam"), ("server_lr", -1.0), ("local_steps", 0),
    ("local_lr", 0.0), ("max_client_samples", 0),
    ("chunk_clients", 0), ("eval_every", -1), ("checkpoint_every", 0), ("report_delta", 0.0),
    ("adam_beta1", 1.0), ("adam_beta2", -0.1), ("adam_tau", 0.0), ("engine", "spark"),
])
def test_fed_config_errors_name_the_parameter(name, value):
    with pytest.raises(ConfigError, match=f"'{name}'"):
        FedConfig(**{name: value})


@pytest.mark.parametrize("kind,name,value", [
    (FedNewsRecSettings, "clip", 0.0), (FedNewsRecSettings, "noise_scale", -0.1),
    (FedNewsRecSettings, "noise_scale", 0.0), (DPFedRecSettings, "epsilon_train", 0.0),
    (DPFedRecSettings, "delta_train", 1.0), (DPFedRecSettings, "noise", "uniform"),
])
def test_method_settings_errors_name_the_parameter(kind, name, value):
    with pytest.raises(ConfigError, match=f"'{name}'"):
        kind(**{name: value})


def test_run_config_with_fed_round_trips_through_yaml(tmp_path):
    config = RunConfig(data="/data/x", model=ModelConfig(news_encoder="naml"),
                       train=TrainConfig(method="dp-fedrec", seed=3),
                       fed=FedConfig(rounds=7, clients_per_round=5, strategy="fedadam",
                                     server_lr=0.02, local_steps=2,
                                     settings=DPFedRecSettings(clip=0.1,
                                                               epsilon_train=math.inf,
                                                               noise="gaussian",
                                                               delta_train=1e-6)))
    path = tmp_path / "config.yaml"
    config.to_yaml(path)
    text = path.read_text()
    assert ".inf" in text  # YAML's infinity, not a string
    assert "  settings:\n    clip: 0.1\n    noise: gaussian\n" in text
    loaded = RunConfig.from_yaml(path)
    assert loaded == config
    assert math.isinf(loaded.fed.settings.epsilon_train)


def test_yaml_settings_errors_name_the_file_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  method: dp-fedrec\nfed:\n  settings:\n    noise_scale: 0.1\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*'fed\.settings\.noise_scale' does not "
                                          r"apply to dp-fedrec.*'fed\.settings\.clip'"):
        RunConfig.from_yaml(path)
    path.write_text("train:\n  method: dp-fedrec\nfed:\n  settings:\n    clip: -1\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*dp-fedrec's settings.*'clip'"):
        RunConfig.from_yaml(path)
    path.write_text("train:\n  method: fedrec\nfed:\n  settings: 3\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*'fed\.settings' must be a mapping"):
        RunConfig.from_yaml(path)
    with pytest.raises(ConfigError, match="dp-fedrec's, but train.method is 'fedrec'"):
        RunConfig(train=TrainConfig(method="fedrec"), fed=FedConfig(settings=DPFedRecSettings()))


def test_yaml_fed_errors_name_the_file_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  method: fednewsrec\nfed:\n  rounds: 0\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*'rounds'"):
        RunConfig.from_yaml(path)
    path.write_text("fed:\n  lambda: 0.1\n")
    with pytest.raises(ConfigError, match=r"fed\.lambda"):
        RunConfig.from_yaml(path)


# ------------------------------------------------------------------------- ClientMethod
def test_client_method_from_config(run_config):
    fnr = method_from_config(run_config("fednewsrec", max_client_samples=7))
    assert (fnr.clipping, fnr.clip, fnr.noise, fnr.noise_scale, fnr.max_samples,
            fnr.negatives) == ("elementwise", 0.005, "laplace", 0.015, 7, 4)
    assert fnr.per_client_release
    lap = method_from_config(run_config("dp-fedrec", epsilon_train=2.0, clip=0.1))
    assert (lap.clipping, lap.noise, lap.epsilon, lap.delta, lap.clip) == \
        ("l1", "laplace", 2.0, 0.0, 0.1)
    gau = method_from_config(run_config("dp-fedrec", epsilon_train=2.0, noise="gaussian",
                                              delta_train=1e-6))
    assert (gau.clipping, gau.noise, gau.epsilon, gau.delta) == ("l2", "gaussian", 2.0, 1e-6)
    plain = method_from_config(run_config("fedrec", local_steps=3, local_lr=0.2))
    assert (plain.clipping, plain.noise, plain.local_steps, plain.local_lr) == \
        ("none", "none", 3, 0.2)
    assert not plain.per_client_release
    with pytest.raises(ConfigError, match="not a federated method"):
        method_from_config(RunConfig(train=TrainConfig(method="centralized")))


# ---------------------------------------------------------------------------- clipping
def test_fednewsrec_clips_every_coordinate_before_the_noise():
    updates = _updates(4, 3000, 0.01)
    clipped, event = _clipped(updates, FEDNEWSREC)
    assert clipped.abs().max() <= DELTA_CLIP
    assert (updates.abs() > DELTA_CLIP).float().mean() > 0.3  # clipping was exercised
    assert torch.equal(clipped, updates.clamp(-DELTA_CLIP, DELTA_CLIP))
    released, event_noised = FEDNEWSREC.privatize(updates, _generators(4))
    assert event_noised == event
    # the noise is added to the clipped update: released − clip(g) is pure Laplace(λ), so
    # its median absolute value is λ·ln 2 whatever g was.
    residual = (released - updates.clamp(-DELTA_CLIP, DELTA_CLIP)).double()
    assert residual.abs().median().item() == pytest.approx(LAMBDA * math.log(2), rel=0.03)


@pytest.mark.parametrize("noise,ord", [("laplace", 1), ("gaussian", 2)])
def test_dp_fedrec_clips_each_update_norm(noise, ord):
    theta = 0.5
    updates = torch.cat([_updates(3, 40, 1.0), _updates(2, 40, 1e-4, seed=1)])
    method = _dp_fedrec(noise, clip=theta)
    clipped, _ = _clipped(updates, method)
    norms = torch.linalg.vector_norm(clipped, ord=ord, dim=1)
    before = torch.linalg.vector_norm(updates, ord=ord, dim=1)
    assert bool((before[:3] > theta).all()) and bool((before[3:] < theta).all())
    assert norms[:3].tolist() == pytest.approx([theta] * 3, rel=1e-5)  # scaled to θ ...
    for i in range(3):  # ... in the same direction
        torch.testing.assert_close(clipped[i] / norms[i], updates[i] / before[i])
    assert torch.equal(clipped[3:], updates[3:])  # inside the ball: unchanged
    assert bool((norms <= theta * (1 + 1e-6)).all())


# ------------------------------------------------------------------------------- noise
def test_fednewsrec_noise_is_laplace_with_scale_lambda():
    m, d = 8, 5000
    updates = _updates(m, d, 0.01)
    released, _ = FEDNEWSREC.privatize(updates, _generators(m))
    noise = (released - updates.clamp(-DELTA_CLIP, DELTA_CLIP)).double().flatten().numpy()
    # Laplace(λ): E|X| = λ, Var X = 2λ²
    assert np.mean(np.abs(noise)) == pytest.approx(LAMBDA, rel=0.03)
    assert np.var(noise) == pytest.approx(2 * LAMBDA ** 2, rel=0.05)
    assert abs(np.mean(noise)) < 5 * LAMBDA * math.sqrt(2 / noise.size)
    assert stats.kstest(noise, stats.laplace(scale=LAMBDA).cdf).pvalue > 1e-3
    assert stats.kstest(noise, stats.laplace(scale=1.1 * LAMBDA).cdf).pvalue < 1e-3
    assert stats.kstest(noise, stats.norm(scale=LAMBDA * math.sqrt(2)).cdf).pvalue < 1e-3


def test_dp_fedrec_laplace_scale_is_two_theta_over_epsilon():
    theta, eps, m, d = 0.01, 2.0, 8, 4000
    method = _dp_fedrec("laplace", clip=theta, epsilon=eps)
    updates = _updates(m, d, 0.01)
    clipped, event = _clipped(updates, method)
    released, _ = method.privatize(updates, _generators(m))
    b = 2 * theta / eps
    assert event.noise_scale == pytest.approx(b, rel=1e-12)
    assert (event.mechanism, event.epsilon, event.delta, event.sensitivity) == \
        ("laplace", eps, 0.0, pytest.approx(2 * theta))
    noise = (released - clipped).double().flatten().numpy()
    assert np.mean(np.abs(noise)) == pytest.approx(b, rel=0.03)
    assert stats.kstest(noise, stats.laplace(scale=b).cdf).pvalue > 1e-3
    assert stats.kstest(noise, stats.laplace(scale=1.1 * b).cdf).pvalue < 1e-3


def test_dp_fedrec_gaussian_sigma_is_the_analytic_calibration(cached_gaussian_calibration):
    theta, eps, delta, m, d = 0.01, 1.0, 1e-5, 8, 4000
    method = _dp_fedrec("gaussian", clip=theta, epsilon=eps, delta=delta)
    updates = _updates(m, d, 0.01)
    clipped, event = _clipped(updates, method)
    released, _ = method.privatize(updates, _generators(m))
    sigma = gaussian_sigma(epsilon=eps, delta=delta, sensitivity_l2=2 * theta)
    # Balle & Wang 2018 Thm 8 holds with equality at the calibrated σ (Δ = 2θ).
    big_delta = 2 * theta
    a, c = big_delta / (2 * sigma), eps * sigma / big_delta
    assert stats.norm.cdf(a - c) - math.exp(eps) * stats.norm.cdf(-a - c) == \
        pytest.approx(delta, rel=1e-3)
    assert event.noise_scale == pytest.approx(sigma, rel=1e-12)
    assert (event.mechanism, event.epsilon, event.delta, event.sensitivity) == \
        ("gaussian", eps, delta, pytest.approx(2 * theta))
    noise = (released - clipped).double().flatten().numpy()
    assert np.std(noise) == pytest.approx(sigma, rel=0.03)
    assert stats.kstest(noise, stats.norm(scale=sigma).cdf).pvalue > 1e-3
    assert stats.kstest(noise, stats.norm(scale=1.1 * sigma).cdf).pvalue < 1e-3


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_dp_fedrec_without_budget_clips_but_adds_no_noise(noise):
    method = _dp_fedrec(noise, clip=0.5, epsilon=math.inf)
    updates = _updates(3, 50, 1.0)
    released, event = method.privatize(updates, _generators(3))
    clipped, _ = _clipped(updates, method)
    assert torch.equal(released, clipped)
    ord = 1 if noise == "laplace" else 2
    assert torch.linalg.vector_norm(released, ord=ord, dim=1).tolist() == \
        pytest.approx([0.5] * 3, rel=1e-5)
    assert math.isinf(event.epsilon) and not event.is_private


def test_fedrec_releases_the_raw_update():
    method = FedRec(negatives=4, max_samples=64)
    updates = _updates(3, 20, 1.0)
    released, event = method.privatize(updates, _generators(3))
    assert torch.equal(released, updates)
    assert event.mechanism == "none" and math.isinf(event.epsilon) and not event.is_private


# ------------------------------------------------------------------------------ events
def test_fednewsrec_event_states_both_epsilons():
    d = 1234
    _, event = FEDNEWSREC.privatize(torch.zeros(2, d), _generators(2))
    assert event.epsilon == pytest.approx(2 * 0.005 * 1234 / 0.015, rel=1e-12)  # 2δD/λ
    assert event.coordinate_epsilon == pytest.approx(2 * 0.005 / 0.015, rel=1e-12)  # 2δ/λ
    assert (event.mechanism, event.noise_scale, event.dimension, event.phase) == \
        ("laplace", 0.015, 1234, "train")
    assert event.sensitivity == pytest.approx(2 * 0.005 * 1234)
    assert FEDNEWSREC.event(d) == event


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_dp_fedrec_event_is_the_per_round_budget(noise, cached_gaussian_calibration):
    method = _dp_fedrec(noise, clip=0.2, epsilon=0.7, delta=1e-6)
    _, event = method.privatize(_updates(3, 10, 1.0), _generators(3))
    assert event.epsilon == 0.7 and event.dimension == 10
    assert event.delta == (0.0 if noise == "laplace" else 1e-6)
    assert method.event(10) == event


def test_release_description(run_config):
    method = method_from_config(run_config("fednewsrec"))
    release = release_description(method, dimension=300, noised_parameters=["a", "b"],
                                  clients_per_round=4, client_fraction=0.1)
    assert release["epsilon_per_round"] == pytest.approx(2 * 0.005 * 300 / 0.015)
    assert release["coordinate_epsilon"] == pytest.approx(2 * 0.005 / 0.015)
    assert release["sensitivity_l1"] == pytest.approx(2 * 0.005 * 300)
    assert (release["clip_bound"], release["noise_scale"], release["clients_per_round"],
            release["noised_parameters"]) == (0.005, 0.015, 4, ["a", "b"])


# ---------------------------------------------------------------- noise per client
@pytest.mark.parametrize("method", [FEDNEWSREC, _dp_fedrec("laplace"), _dp_fedrec("gaussian")],
                         ids=["fednewsrec", "laplace", "gaussian"])
def test_noise_comes_from_each_clients_own_generator(method, cached_gaussian_calibration):
    users = [3, 8, 21, 30]
    same = torch.full((4, 50), 1e-3)  # identical updates
    released, _ = method.privatize(same, [client_noise(7, 2, u) for u in users])
    for i in range(4):
        for j in range(i):
            assert not torch.allclose(released[i], released[j])
    again, _ = method.privatize(same, [client_noise(7, 2, u) for u in users])
    assert torch.equal(again, released)
    # client 21's release does not depend on who else is in the batch
    alone, _ = method.privatize(same[:1], [client_noise(7, 2, 21)])
    assert torch.equal(alone[0], released[2])
    other_round, _ = method.privatize(same[:1], [client_noise(7, 3, 21)])
    assert not torch.allclose(other_round[0], released[2])


def test_one_generator_per_client_is_required():
    with pytest.raises(ValueError, match="one generator per client"):
        FEDNEWSREC.privatize(torch.zeros(3, 4), _generators(2))


def test_gaussian_noise_is_calibrated_once_per_round_not_once_per_client(monkeypatch):
    """σ is the same for every client of a round: privatize must not re-run the (~1 ms)
    analytic calibration for each of the m clients (docs/architecture.md#performance-design: no
    per-client Python work
    beyond drawing each client's noise)."""
    import dp_accounting

    calls = []
    original = dp_accounting.get_sigma_gaussian

    def counting(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(dp_accounting, "get_sigma_gaussian", counting)
    method = _dp_fedrec("gaussian", epsilon=1.2345)  # a budget no other test calibrates
    method.privatize(_updates(50, 10, 1.0), _generators(50))
    assert 1 <= len(calls) <= 2


def test_a_method_is_calibrated_once_not_per_round_or_per_event(monkeypatch):
    """The calibration of a method's release is built once (per method and D) and reused
    by every round's privatize and every event; nothing runs a mechanism to learn it."""
    calls = []
    original = calibrated.calibrate

    def counting(**kwargs):
        calls.append(kwargs)
        return original(**kwargs)

    monkeypatch.setattr(calibrated, "calibrate", counting)
    method = _dp_fedrec("gaussian", epsilon=1.3579)  # a budget no other test calibrates
    for round_index in range(3):
        released, event = method.privatize(_updates(4, 10, 1.0, seed=round_index),
                                           _generators(4, seed=round_index))
        assert event == method.event(10) == method.events(10)[0]
        assert release_description(method, dimension=10, noised_parameters=["a"],
                                   clients_per_round=4,
                                   client_fraction=0.1)["noise_scale"] == event.noise_scale
    assert len(calls) == 1 and calls[0]["epsilon"] == 1.3579 and calls[0]["dimension"] == 10


# ------------------------------------------------------------------------------ audits
def _release_fn(method: ClientMethod):
    """Mechanism for the audit: each row of ``inputs`` is one client's update."""

    def release(inputs: torch.Tensor, noise: NoiseSource) -> torch.Tensor:
        return method.privatize(inputs, [noise] * inputs.shape[0])[0]

    return release


# Neighbouring updates: one coordinate far beyond the clip bound, +big vs −big.
X, X_PRIME = torch.tensor([1.0, 0.0]), torch.tensor([-1.0, 0.0])


def _audit(method: ClientMethod, x: torch.Tensor, x_prime: torch.Tensor, *, trials: int,
           delta: float = 0.0) -> float:
    noise = SimulationNoise(torch.Generator().manual_seed(0))
    return audit_mechanism(_release_fn(method), x, x_prime, trials=trials, delta=delta,
                           noise=noise).epsilon_lower_bound


@pytest.mark.parametrize("case", ["fednewsrec", "laplace", "gaussian"])
def test_audit_lower_bound_respects_the_claimed_epsilon(case, cached_gaussian_calibration):
    if case == "fednewsrec":  # D = 1: ε = 2δ/λ
        method, x, x_prime, delta = FEDNEWSREC, X[:1], X_PRIME[:1], 0.0
    else:
        method, x, x_prime = _dp_fedrec(case, clip=0.01, epsilon=1.0), X, X_PRIME
        delta = method.delta
    claimed = method.event(x.numel()).epsilon
    if case == "fednewsrec":
        assert claimed == pytest.approx(2 * DELTA_CLIP / LAMBDA)
    lower = _audit(method, x, x_prime, trials=16000, delta=delta)
    assert lower <= claimed
    if case == "gaussian":  # finite samples see little of an (ε, δ) Gaussian's budget
        assert lower > 0
    else:  # pure Laplace: the tails spend the whole ε; the noise is not over-calibrated
        assert lower > 0.5 * claimed


@pytest.mark.parametrize("case", ["fednewsrec-noise", "fednewsrec-no-clip", "laplace",
                                  "gaussian"])
def test_audit_detects_a_broken_release(case, cached_gaussian_calibration):
    if case == "fednewsrec-noise":  # noise 10x too small
        honest, x, x_prime = FEDNEWSREC, X[:1], X_PRIME[:1]
        broken = dataclasses.replace(FEDNEWSREC, noise_scale=LAMBDA / 10)
    elif case == "fednewsrec-no-clip":  # clipping forgotten (bound far above the update)
        honest, x, x_prime = FEDNEWSREC, X[:1], X_PRIME[:1]
        broken = dataclasses.replace(FEDNEWSREC, clip=10.0)
    else:  # noise calibrated to 10x the claimed ε
        honest, x, x_prime = _dp_fedrec(case, clip=0.01, epsilon=1.0), X, X_PRIME
        broken = dataclasses.replace(honest, epsilon=10.0)
    claimed = honest.event(x.numel()).epsilon
    lower = _audit(broken, x, x_prime, trials=4000, delta=honest.event(x.numel()).delta)
    assert lower > 2 * claimed


@pytest.mark.parametrize("method, tau", [("fedrec", 1e-6), ("fednewsrec", 1e-6),
                                         ("dp-fedrec", 1e-10)])
def test_fedadam_tau_defaults_per_method_and_explicit_value_wins(method, tau):
    resolved = resolve_run_config(RunConfig(train=TrainConfig(method=method)))
    assert resolved.fed.adam_tau == tau
    explicit = resolve_run_config(RunConfig(train=TrainConfig(method=method),
                                            fed=fed_config(method, adam_tau=1e-3)))
    assert explicit.fed.adam_tau == 1e-3
