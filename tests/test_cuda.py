"""The CUDA device against the CPU: one round of each method, a run end to end (docs/gpu.md).

Skipped where PyTorch sees no GPU; ``benchmarks/gpu_check.sh`` runs it on a GPU machine.
``PRIVATEREC_CUDA_TEST_TARGET=cpu`` runs the same checks with the CPU as the "other" device
(CPU against CPU), which checks this module itself on a machine without a GPU.

Tolerances: with TF32 matmuls off, a round's aggregate on CUDA agrees with the CPU's within
1e-4 of its norm (float32 sums in another order, cuBLAS's kernels); with TF32 on (the
default of ``--device cuda``) within 2e-2. The seeded noise is the same numbers on both
(drawn on the CPU from the same generators).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from typing import Any

import pytest
import torch

from privaterec.config import ModelConfig, RunConfig, TrainConfig, fed_config, replace
from privaterec.data.clients import build_client_dataset
from privaterec.data.features import build_news_features, build_vocabularies
from privaterec.data.synth import SynthConfig, generate
from privaterec.fed.methods import method_from_config, resolve_run_config
from privaterec.fed.objective import LocalObjective
from privaterec.fed.sampling import eligible_clients, sample_round
from privaterec.fed.simulator import simulate_round
from privaterec.models.factory import build_recommender

TARGET = os.environ.get("PRIVATEREC_CUDA_TEST_TARGET", "cuda")
pytestmark = pytest.mark.skipif(TARGET == "cuda" and not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (PyTorch sees none)")

TINY = ModelConfig(word_dim=16, num_heads=2, head_dim=8, attention_dim=16, title_len=8,
                   abstract_len=4, history_len=8, cnn_filters=16, gru_dim=16)
TIGHT, TF32_TOLERANCE = 1e-4, 2e-2

METHODS: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    # (id, method, fed changes, model changes)
    ("fedrec", "fedrec", {}, {}),
    ("fedrec-fedavg", "fedrec", {"local_steps": 2, "local_lr": 0.1}, {}),
    ("fednewsrec", "fednewsrec", {}, {}),
    ("dp-fedrec-laplace", "dp-fedrec", {"epsilon_train": 2.0, "clip": 0.1}, {}),
    ("dp-fedrec-gaussian", "dp-fedrec",
     {"epsilon_train": 2.0, "clip": 0.1, "noise": "gaussian", "delta_train": 1e-5}, {}),
    ("dp-fedavg", "dp-fedavg", {"noise_multiplier": 1.0, "client_fraction": 0.5,
                                "clip": 0.05}, {}),
    ("dp-fedavg-adaptive", "dp-fedavg",
     {"noise_multiplier": 1.0, "client_fraction": 0.5, "clip": 0.05,
      "adaptive_clip_quantile": 0.5, "clip_count_stddev": 1.0}, {}),
    ("dp-fedavg-news-vectors", "dp-fedavg",
     {"noise_multiplier": 1.0, "client_fraction": 0.5, "clip": 0.05,
      "clip_space": "news_vectors"}, {}),
    ("privaterec-paper", "privaterec", {"epsilon_train": 2.0, "padding_p": 0.5,
                                        "privacy_mode": "paper"}, {"basis_size": 3}),
    ("privaterec-strict", "privaterec", {"epsilon_train": 2.0, "padding_p": 0.5,
                                         "clip": 0.05, "privacy_mode": "strict"},
     {"basis_size": 3}),
]


@pytest.fixture(scope="module")
def data():
    dataset = generate(SynthConfig(users=40, news=150, seed=1, min_history=1, max_history=8))
    vocabs = build_vocabularies(dataset.train.news.values())
    features = build_news_features(dataset.all_news(), vocabs, title_len=TINY.title_len,
                                   abstract_len=TINY.abstract_len)
    clients = build_client_dataset(dataset.train, features, history_len=TINY.history_len)
    return vocabs, features, clients


@pytest.fixture
def tf32(request):
    """Set TF32 matmuls for the test (``request.param``), restore afterwards."""
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = request.param
    yield request.param
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def _round(data, method_name, fed, model_changes, device, *, seed=3):
    vocabs, features, clients = data
    model_config = replace(TINY, **model_changes)
    config = resolve_run_config(RunConfig(data="unused", model=model_config,
                                          train=TrainConfig(method=method_name),
                                          fed=fed_config(method_name, **fed)))
    method = method_from_config(config)
    torch.manual_seed(0)
    model = build_recommender(model_config, vocabs, features)
    theta0 = LocalObjective(copy.deepcopy(model)).parameters()
    g = torch.Generator().manual_seed(1)
    theta = theta0 + 0.05 * torch.randn(theta0.shape, generator=g)  # away from the init
    task = LocalObjective(model.to(device))
    population = method.population(clients)
    selected = (method.select(population, 12, seed=seed, round_index=1)
                if method_name == "dp-fedavg" else
                sample_round(eligible_clients(clients, by_impressions=method.by_impressions),
                             12, seed=seed, round_index=1))
    result = simulate_round(task, theta.to(device), clients, selected, method, seed=seed,
                            round_index=1, chunk_clients=5, server_state=method.server_state()
                            or None)
    assert result.direction.device.type == torch.device(device).type
    return result


@pytest.mark.parametrize("tf32", [False], indirect=True)
@pytest.mark.parametrize("name,method,fed,model", METHODS, ids=[m[0] for m in METHODS])
def test_one_round_agrees_with_the_cpu(name, method, fed, model, data, tf32):
    cpu = _round(data, method, fed, model, "cpu")
    other = _round(data, method, fed, model, TARGET)
    difference = float((other.direction.cpu() - cpu.direction).norm())
    scale = max(float(cpu.direction.norm()), 1e-12)
    assert difference <= TIGHT * scale, f"{name}: relative difference {difference / scale:.3g}"
    assert cpu.direction.abs().max() > 0
    assert other.events == cpu.events and other.population_events == cpu.population_events
    if cpu.server_state is not None:  # adaptive clipping: the next clip
        assert other.server_state == pytest.approx(cpu.server_state, rel=1e-6)


@pytest.mark.parametrize("tf32", [True], indirect=True)
def test_tf32_rounds_stay_within_the_stated_tolerance(data, tf32):
    _, method, fed, model = METHODS[5]  # dp-fedavg
    cpu = _round(data, method, fed, model, "cpu")
    other = _round(data, method, fed, model, TARGET)
    difference = float((other.direction.cpu() - cpu.direction).norm())
    assert difference <= TF32_TOLERANCE * float(cpu.direction.norm())


def test_train_evaluate_and_resume_across_devices(tmp_path, capsys):
    """``train --device cuda``, then evaluate the checkpoint on the CPU and on the GPU; a
    second identical GPU run gives the same numbers (deterministic algorithms); Uni-FedRec's
    recall training and centralized training run on the GPU too."""
    from privaterec.cli import main

    synth = tmp_path / "synth"
    assert main(["data", "synth", "--out", str(synth), "--users", "80", "--news", "300",
                 "--seed", "2"]) == 0
    config = tmp_path / "tiny.yaml"
    config.write_text("model:\n  word_dim: 16\n  num_heads: 2\n  head_dim: 8\n"
                      "  attention_dim: 16\n  history_len: 10\n  title_len: 8\n"
                      "  abstract_len: 4\n")
    common = ["--data", str(synth), "--config", str(config), "--rounds", "3",
              "--no-progress", "--json", "--device", TARGET]
    capsys.readouterr()
    metrics = []
    for name in ("a", "b"):
        assert main(["train", "--method", "dp-fedavg", "--target-epsilon", "8",
                     "--client-fraction", "0.3", *common, "--out", str(tmp_path / name)]) == 0
        metrics.append(json.loads(capsys.readouterr().out)["test"])
    assert metrics[0]["auc"] == metrics[1]["auc"]
    for device in ("cpu", TARGET):
        assert main(["evaluate", "--run", str(tmp_path / "a"), "--json", "--no-progress",
                     "--device", device]) == 0
        evaluated = json.loads(capsys.readouterr().out)
        assert evaluated["auc"] == pytest.approx(metrics[0]["auc"], abs=1e-3)
    assert main(["train", "--method", "fedrec", "--clients-per-round", "10", *common,
                 "--out", str(tmp_path / "ranker")]) == 0
    capsys.readouterr()
    assert main(["train", "--method", "unifedrec", "--ranker", str(tmp_path / "ranker"),
                 "--rounds", "2", "--no-progress", "--json", "--device", TARGET,
                 "--out", str(tmp_path / "recall")]) == 0
    assert main(["train", "--method", "centralized", "--epochs", "1", "--data", str(synth),
                 "--config", str(config), "--no-progress", "--json", "--device", TARGET,
                 "--out", str(tmp_path / "central")]) == 0


def test_a_gpu_checkpoint_loads_on_the_cpu(data, tmp_path):
    """The Flower engine and the device SDK run on the CPU: a checkpoint written on the GPU
    loads there (checkpoints hold CPU tensors; every load maps to the CPU)."""
    from privaterec.fed.simulator import FederatedState
    from privaterec.runtime.checkpoint import load_checkpoint, save_checkpoint

    vocabs, features, _ = data
    torch.manual_seed(0)
    model = build_recommender(TINY, vocabs, features).to(TARGET)
    task = LocalObjective(model)
    state = FederatedState(params=task.parameters(),
                           strategy_state={"m": torch.zeros(task.dimension, device=TARGET)})
    save_checkpoint(tmp_path / "c.pt", state.to_checkpoint(task, "fedrec"))
    loaded = load_checkpoint(tmp_path / "c.pt")
    assert loaded["params"].device.type == "cpu"
    assert all(t.device.type == "cpu" for t in loaded["model"].values())
    cpu_model = build_recommender(TINY, vocabs, features)
    cpu_model.load_state_dict(loaded["model"])
    torch.testing.assert_close(LocalObjective(cpu_model).parameters(), loaded["params"])
    raw = torch.load(tmp_path / "c.pt", map_location="cpu", weights_only=False)
    assert dataclasses.is_dataclass(state) and raw["round"] == 0
