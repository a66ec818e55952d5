"""PrivateRec's collapse on a tiny synthetic set: the diagnostics see it, centering fixes it.

With the published α = softmax(u·bᵀ/√d) every user's u is nearly the same vector (the
common component holds > 99% of its energy), so every user gets the same α from the first
round and keeps it; centered attention compares u − c, where c estimates that common part,
and stays diverse while training, in every training mode. docs/privaterec.md, "Collapse of the basis attention".
"""

from __future__ import annotations

import math

import pytest

from privaterec.config import ModelConfig, RunConfig, TrainConfig, fed_config, replace
from privaterec.data.synth import SynthConfig, write_synthetic
from privaterec.eval.basis import basis_diagnostics
from privaterec.fed.engine import federated_job
from privaterec.fed.methods import resolve_run_config
from privaterec.runs.ranking import evaluate_run, train_run
from privaterec.runs.ranking_setup import build_run_model, prepare_data
from privaterec.training.centralized import train_centralized

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ModelConfig(word_dim=8, num_heads=2, head_dim=4, attention_dim=8, title_len=6,
                   abstract_len=4, history_len=5, basis_size=5)
SYNTH = SynthConfig(users=60, news=150, seed=3, impressions_per_user=2, min_history=5,
                    max_history=15, max_candidates=15)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("collapse") / "data"
    write_synthetic(path, SYNTH)
    return str(path)


# Every training mode of a PrivateRec model (FedConfig changes; None: centralized).
MODES = {
    "paper": dict(epsilon_train=10.0, clients_per_round=10, privacy_mode="paper"),
    "strict": dict(epsilon_train=10.0, clients_per_round=10, privacy_mode="strict"),
    "noise-free": dict(epsilon_train=math.inf, clients_per_round=10, privacy_mode="paper"),
    "dp-fedavg": dict(noise_multiplier=0.6, client_fraction=0.2, target_delta=1e-3),
    "centralized": None,
}


def _config(data: str, attention: str, mode: str = "paper", *, rounds: int = 10) -> RunConfig:
    fed = MODES[mode]
    if fed is None:
        return RunConfig(data=data, model=replace(TINY, basis_attention=attention),
                         train=TrainConfig(method="centralized", epochs=1))
    method = "dp-fedavg" if mode == "dp-fedavg" else "privaterec"
    return resolve_run_config(RunConfig(
        data=data, model=replace(TINY, basis_attention=attention),
        train=TrainConfig(method=method), fed=fed_config(method, rounds=rounds, **fed)))


def _diagnostics(data: str, attention: str, mode: str, tmp_path):
    """(diagnostics at initialisation, after training in ``mode``) over the training users."""
    config = _config(data, attention, mode)
    prepared = prepare_data(config)
    model = build_run_model(config, prepared)

    def measure():
        return basis_diagnostics(model, prepared.dataset.train, prepared.features,
                                 history_len=config.model.history_len)

    before = measure()
    if config.train.method == "centralized":
        train_centralized(model, prepared.train_clients, config.train,
                          checkpoint_path=tmp_path / "checkpoint.pt", progress=False)
    else:
        federated_job(config, model, progress=False).train(prepared.train_clients,
                                                           progress=False)
    return before, measure()


@pytest.mark.parametrize("mode", ["paper", "centralized"])
def test_published_attention_is_collapsed_and_the_diagnostics_say_so(data, mode, tmp_path):
    before, after = _diagnostics(data, "dot", mode, tmp_path)
    for d in (before, after):
        # every user has (nearly) the same α; near-uniform here, so its argmax is noise
        assert d.collapsed and d.spread < 0.01
        assert d.common_share > 0.99
        assert d.users == 57  # training users with a labelled impression


@pytest.mark.parametrize("mode", list(MODES))
def test_centered_attention_stays_diverse_in_every_training_mode(data, mode, tmp_path):
    before, after = _diagnostics(data, "centered", mode, tmp_path)
    for d in (before, after):
        assert not d.collapsed and d.spread > 0.15
        assert d.common_share < 0.7 and d.argmax_share < 0.8
        assert 0.0 < d.entropy_ratio < 0.99


def test_runs_report_the_diagnostics(data, tmp_path):
    run = tmp_path / "run"
    metrics = train_run(_config(data, "centered", "noise-free", rounds=2), run,
                        progress=False)
    basis = metrics["basis"]
    assert basis["users"] > 0 and basis["basis_size"] == 5
    assert set(basis) >= {"entropy_mean", "argmax_share", "spread", "common_share",
                          "user_norm_mean", "user_norm_max", "scored_norm_mean", "collapsed"}
    evaluated = evaluate_run(run, progress=False)
    assert evaluated["basis"] == basis  # the same model and test users
    assert evaluated["auc"] == metrics["test"]["auc"]
    plain = train_run(RunConfig(data=data, model=replace(TINY, basis_size=0),
                                train=TrainConfig(method="fedrec"),
                                fed=fed_config("fedrec", rounds=1, clients_per_round=5)),
                      tmp_path / "fedrec", progress=False)
    assert "basis" not in plain
