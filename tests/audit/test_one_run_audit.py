"""One-run canary estimate of a dp-fedavg training run (Andrew et al., ICLR 2024)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from privaterec.audit.one_run import (CanaryRounds, canary_vectors, estimate_from_delta,
                                      gdp_epsilon, one_run_audit)
from privaterec.config import ModelConfig, RunConfig, TrainConfig, fed_config
from privaterec.data.synth import SynthConfig, write_synthetic
from privaterec.errors import ConfigError
from privaterec.privacy.central_accounting import calibrate_noise_multiplier, central_epsilon

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = ModelConfig(word_dim=8, num_heads=2, head_dim=4, attention_dim=8, title_len=6,
                    abstract_len=4, history_len=5)


def test_gdp_epsilon_is_the_gaussian_mechanisms_epsilon():
    # one Gaussian round at q = 1 with z calibrated to epsilon 1 (replace-one: mu = 2/z)
    z = calibrate_noise_multiplier(target_epsilon=1.0, sampling_rate=1.0, rounds=1,
                                   delta=1e-5)
    assert gdp_epsilon(2 / z, 1e-5) == pytest.approx(1.0, abs=0.01)
    assert gdp_epsilon(1 / z, 1e-5) == pytest.approx(
        central_epsilon(noise_multiplier=z, sampling_rate=1.0, rounds=1, delta=1e-5,
                        neighbours="add_remove"), abs=0.01)
    assert gdp_epsilon(0.0, 1e-5) == 0.0 and gdp_epsilon(-1.0, 1e-5) == 0.0


def test_the_estimate_sees_inserted_canaries_and_nothing_in_noise():
    dim, k = 5000, 500
    vectors = canary_vectors(2 * k, dim, seed=4)
    noise = torch.randn(dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mu0, eps0, _, _ = estimate_from_delta(noise, canaries=k, seed=4, delta=1e-5)
    assert abs(mu0) < 0.25 and eps0 < 1.0
    # each inserted canary moves the delta by 0.5 noise standard deviations along itself
    signal = noise + 0.5 * vectors[:k].sum(0)
    mu1, eps1, inserted, held = estimate_from_delta(signal, canaries=k, seed=4, delta=1e-5)
    assert mu1 == pytest.approx(0.5, abs=0.15)
    assert eps1 > eps0 and inserted.mean() > held.mean()


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory):
    data = tmp_path_factory.mktemp("one_run") / "data"
    write_synthetic(data, SynthConfig(users=60, news=150, impressions_per_user=2.0,
                                      min_history=5, max_history=15, max_candidates=15,
                                      seed=0))
    return RunConfig(data=str(data / "train"), model=MODEL,
                     train=TrainConfig(method="dp-fedavg", seed=0),
                     fed=fed_config("dp-fedavg", rounds=2, client_fraction=0.5,
                                    target_epsilon=1.0, target_delta=1e-5))


def test_a_training_run_with_canaries_reports_the_estimate_next_to_the_ledger(tiny_config):
    estimate = one_run_audit(tiny_config, canaries=20)
    assert estimate.rounds == 2 and estimate.canaries == 20
    assert 0.99 < estimate.ledger_epsilon <= 1.0
    assert estimate.ledger_epsilon_add_remove < estimate.ledger_epsilon
    assert math.isfinite(estimate.epsilon) and estimate.epsilon >= 0
    assert estimate.held_out_std == pytest.approx(estimate.dimension ** -0.5, rel=0.5)


def test_canaries_join_rounds_with_probability_q_and_are_clipped_to_c(tiny_config):
    from privaterec.fed.methods import method_from_config, resolve_run_config

    method = method_from_config(resolve_run_config(tiny_config))
    inserting = CanaryRounds(**{f.name: getattr(method, f.name)
                                for f in dataclasses.fields(method)},
                             canary_count=400, canary_seed=2)
    vectors = canary_vectors(400, 2000, seed=2)
    total = inserting.canary_sum(2000, 0).double()
    # the sum of the canaries that joined: its coefficients on the (independent)
    # canaries are C for about q = half of them
    coefficients = torch.linalg.lstsq(vectors.T, total).solution
    joined = (coefficients > method.clip / 2).sum().item()
    assert 160 < joined < 240
    assert torch.allclose(coefficients[coefficients > method.clip / 2],
                          torch.tensor(method.clip, dtype=torch.float64), atol=1e-5)
    with pytest.raises(ConfigError, match="canaries"):
        CanaryRounds(**{f.name: getattr(method, f.name) for f in dataclasses.fields(method)},
                     canary_count=0)


def test_only_dp_fedavg_runs_are_audited_in_one_run(tiny_config):
    config = dataclasses.replace(tiny_config, train=TrainConfig(method="fedrec", seed=0),
                                 fed=fed_config("fedrec", rounds=1))
    with pytest.raises(ConfigError, match="dp-fedavg"):
        one_run_audit(config, canaries=5)


def test_cli_needs_a_method_or_a_run(capsys):
    from privaterec.cli import main

    assert main(["privacy", "audit", "--epsilon", "1"]) == 2
    assert "--run RUN --canaries K" in capsys.readouterr().err
