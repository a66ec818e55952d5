"""Private serving evaluated offline (PrivateRec Alg. 1-2, VDP §3.2.1): the device-side user
encoders, their privacy events, and the recording of every query in the run's ledger."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
import torch

from privaterec.config import ModelConfig, RunConfig, TrainConfig, fed_config
from privaterec.data.features import build_news_features, build_vocabularies
from privaterec.data.synth import SynthConfig, generate, write_synthetic
from privaterec.errors import ConfigError
from privaterec.eval.serving import private_user_encoder
from privaterec.ondevice.release import ServingConfig, serving_event
from privaterec.models.factory import build_recommender
from privaterec.privacy.formulas import amplified_budget
from privaterec.privacy.report import read_privacy_json
from privaterec.privacy.samplers import SimulationNoise
from privaterec.runs.ranking import evaluate_run, train_run

TINY = ModelConfig(word_dim=8, num_heads=2, head_dim=4, attention_dim=8, title_len=6,
                   abstract_len=4, history_len=5)
SYNTH = SynthConfig(users=60, news=150, seed=3, impressions_per_user=2, min_history=5,
                    max_history=15, max_candidates=15)


@pytest.fixture(scope="module")
def model_and_features():
    dataset = generate(SYNTH)
    vocabs = build_vocabularies(dataset.train.news.values())
    features = build_news_features(dataset.all_news(), vocabs, title_len=6, abstract_len=4)
    torch.manual_seed(0)
    model = build_recommender(ModelConfig(**{**TINY.__dict__, "basis_size": 3}), vocabs,
                              features).eval()
    plain = build_recommender(TINY, vocabs, features).eval()
    return model, plain, features


def _history(model, features, n=5, h=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(1, len(features), (n, h), generator=g)
    with torch.no_grad():
        vectors = model.encode_rows(rows)
    mask = torch.ones(n, h, dtype=torch.bool)
    mask[0, :3] = False
    return vectors, mask


def test_none_and_infinite_epsilon_are_the_model_itself(model_and_features):
    model, _, features = model_and_features
    vectors, mask = _history(model, features)
    with torch.no_grad():
        expected = model.encode_user(vectors, mask)
        for kind in ("none", "privaterec"):
            enc = private_user_encoder(model, features, ServingConfig(kind=kind),
                                       noise=SimulationNoise(torch.Generator()))
            torch.testing.assert_close(enc(vectors, mask), expected)
        vdp = private_user_encoder(model, features, ServingConfig(kind="vdp", vdp_clip=0.5),
                                   noise=SimulationNoise(torch.Generator()))(vectors, mask)
    # VDP at ε = ∞ only L1-clips: same direction, norm ≤ θ.
    assert bool((vdp.abs().sum(-1) <= 0.5 + 1e-6).all())
    torch.testing.assert_close(vdp / vdp.norm(dim=-1, keepdim=True),
                               expected / expected.norm(dim=-1, keepdim=True))


@pytest.mark.parametrize("mechanism, delta", [("laplace", 0.0), ("gaussian", 1e-5)])
def test_vdp_user_encoder_draws_what_vdp_release_draws(model_and_features, mechanism, delta):
    """The offline VDP runs the device's function (the vdp mode's release); with a
    seeded generator it equals the reference mechanism privacy.dpa.vdp_release bitwise."""
    from privaterec.privacy.dpa import vdp_calibration, vdp_release

    model, _, features = model_and_features
    vectors, mask = _history(model, features)
    config = ServingConfig(kind="vdp", epsilon=1.5, delta=delta, vdp_clip=0.5,
                           mechanism=mechanism)
    with torch.no_grad():
        got = private_user_encoder(model, features, config,
                                   noise=SimulationNoise(torch.Generator().manual_seed(4))
                                  )(vectors, mask)
        user = model.encode_user(vectors, mask)
        calibration = vdp_calibration(clip=0.5, epsilon=1.5, delta=delta, mechanism=mechanism,
                                      dimension=model.dim)
        want = vdp_release(user, calibration,
                           noise=SimulationNoise(torch.Generator().manual_seed(4)))
    assert not torch.equal(got, user)
    assert torch.equal(got, want)


def test_privaterec_release_lies_in_the_span_of_b_and_is_noisy(model_and_features):
    model, _, features = model_and_features
    vectors, mask = _history(model, features)
    config = ServingConfig(kind="privaterec", epsilon=1.0, padding_p=0.5)
    with torch.no_grad():
        out = private_user_encoder(model, features, config,
                                   noise=SimulationNoise(torch.Generator().manual_seed(1))
                                  )(vectors, mask)
        again = private_user_encoder(model, features, config,
                                     noise=SimulationNoise(torch.Generator().manual_seed(1))
                                    )(vectors, mask)
        clean = model.encode_user(vectors, mask)
    torch.testing.assert_close(out, again)  # seeded
    assert not torch.allclose(out, clean)
    b = model.basis.weight.detach()
    coef = torch.linalg.lstsq(b.T, out.T).solution.T  # ũ = α̃ b with α̃ on the simplex
    torch.testing.assert_close(coef @ b, out, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(coef.sum(-1), torch.ones(len(out)), rtol=1e-4, atol=1e-4)
    assert bool((coef > -1e-4).all())


def test_privaterec_serving_needs_basic_vectors(model_and_features):
    _, plain, features = model_and_features
    with pytest.raises(ConfigError, match="basic vectors"):
        private_user_encoder(plain, features, ServingConfig(kind="privaterec", epsilon=1.0),
                             noise=SimulationNoise(torch.Generator()))


def test_serving_events():
    pr = serving_event(ServingConfig(kind="privaterec", epsilon=2.0, padding_p=0.5),
                       basis_size=5, dim=64)
    eps_base, _ = amplified_budget(epsilon=2.0, delta=0.0, padding_p=0.5)
    assert pr.phase == "serve" and pr.epsilon == 2.0 and pr.sensitivity == 2.0
    assert pr.noise_scale == pytest.approx(2.0 / eps_base) and pr.dimension == 5
    vdp = serving_event(ServingConfig(kind="vdp", epsilon=2.0, vdp_clip=0.001),
                        basis_size=5, dim=64)
    assert vdp.sensitivity == pytest.approx(0.002) and vdp.noise_scale == pytest.approx(0.001)
    assert vdp.dimension == 64
    # No padding without noise: ε_s = ∞ applies none.
    assert ServingConfig(kind="privaterec", padding_p=0.5).effective_padding == 0.0
    assert not serving_event(ServingConfig(kind="none"), basis_size=0, dim=8).is_private


@pytest.mark.parametrize("kwargs,match", [
    ({"kind": "dpa"}, "serving"),
    ({"epsilon": 0.0}, "epsilon_serve"),
    ({"padding_p": 1.0}, "padding_p"),
    ({"delta": 1e-5}, "delta_serve"),
    ({"mechanism": "gaussian"}, "delta_serve"),
    ({"normalization": "sigmoid"}, "normalization"),
])
def test_serving_config_validation(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ServingConfig(**kwargs)


def test_evaluate_run_records_every_query_in_the_ledger(tmp_path):
    data = tmp_path / "data"
    write_synthetic(data, SYNTH)
    config = RunConfig(data=str(data), model=TINY, train=TrainConfig(method="privaterec"),
                       fed=fed_config("privaterec", rounds=2, epsilon_train=5.0,
                                      clients_per_round=5))
    run = tmp_path / "run"
    train_run(config, run, progress=False)
    before = read_privacy_json(run)["report"]["phases"]["serve"]["num_users"]
    assert before == 0
    training = (run / "privacy.json").read_bytes()
    result = evaluate_run(run, progress=False,
                          serving=ServingConfig(kind="privaterec", epsilon=1.0))
    assert (run / "privacy.json").read_bytes() == training  # the release record is untouched
    summary = read_privacy_json(Path(result["serving"]["record"]))
    from privaterec.data.mind import load_dataset
    test = load_dataset(str(data)).test
    queries = Counter(i.user_id for i in test.behaviors if i.labels is not None)
    serve = summary["report"]["phases"]["serve"]
    assert serve["num_users"] == len(queries)
    assert serve["releases_max"] == max(queries.values())
    assert serve["basic_epsilon_max"] == pytest.approx(max(queries.values()) * 1.0)
    assert result["serving"]["queries"] == sum(queries.values())
    assert result["serving"]["bytes_per_query"] == 4 * 5  # B = 5 floats
    assert summary["release"]["serving"][0]["kind"] == "privaterec"
    assert summary["release"]["serving"][0]["simulated"] is True
    assert "SIMULATED" in summary["release"]["simulated_serving"]
    assert 0.0 <= result["auc"] <= 1.0 and math.isfinite(result["auc"])
    # the record composes training and this evaluation
    train = read_privacy_json(run)["report"]["phases"]["total"]["epsilon_max"]
    assert result["serving"]["epsilon_user_max"] == summary["report"]["phases"]["total"][
        "epsilon_max"] >= train


def test_identical_serving_evaluations_do_not_accumulate(tmp_path, capsys):
    """Two identical offline evaluations leave one record with one evaluation's ε; the run's
    privacy.json (the deployment's release record) never holds simulated queries."""
    data = tmp_path / "data"
    write_synthetic(data, SYNTH)
    config = RunConfig(data=str(data), model=TINY, train=TrainConfig(method="privaterec"),
                       fed=fed_config("privaterec", rounds=2, epsilon_train=5.0,
                                      clients_per_round=5))
    run = tmp_path / "run"
    train_run(config, run, progress=False)
    training = read_privacy_json(run)
    serving = ServingConfig(kind="privaterec", epsilon=2.0)
    first = evaluate_run(run, progress=False, serving=serving)
    second = evaluate_run(run, progress=False, serving=serving)
    assert first["serving"]["record"] == second["serving"]["record"]
    for key in ("epsilon_serve_user_max", "epsilon_user_max"):
        assert second["serving"][key] == first["serving"][key]
    record = read_privacy_json(Path(second["serving"]["record"]))
    assert len(record["release"]["serving"]) == 1
    from privaterec.data.mind import load_dataset
    test = load_dataset(str(data)).test
    queries = Counter(i.user_id for i in test.behaviors if i.labels is not None)
    serve = record["report"]["phases"]["serve"]
    assert serve["releases_max"] == max(queries.values())  # one evaluation's queries
    assert serve["basic_epsilon_max"] == pytest.approx(max(queries.values()) * 2.0)
    after = read_privacy_json(run)
    assert after["report"] == training["report"]  # ε per user unchanged, no serve phase
    assert after["report"]["phases"]["serve"]["num_users"] == 0
    assert "serving" not in after["release"]
    from privaterec.cli import main
    assert main(["privacy", "report", "--run", second["serving"]["record"]]) == 0
    assert "SIMULATED serving" in capsys.readouterr().out
    other = evaluate_run(run, progress=False, serving=ServingConfig(kind="local"))
    assert other["serving"]["record"] != first["serving"]["record"]  # its own record
    assert other["serving"]["epsilon_user_max"] == after["report"]["phases"]["total"][
        "epsilon_max"]  # local ranking adds nothing to training
