"""Shared fixtures of the federated-engine tests: tiny synthetic clients and tiny models.

Everything is small enough that the whole ``tests/fed`` suite runs in well under a minute
on two shared cores: 40 synthetic users (188 training samples, 2-9 per user), 150 news,
histories of 1-5 clicks (H = 5) and one user with an empty history (as in MIND), models
with a few hundred to a few thousand trainable parameters.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

import pytest
import torch

from privaterec.privacy.samplers import SimulationNoise
from privaterec.config import ModelConfig, RunConfig, TrainConfig, fed_config, replace
from privaterec.data.clients import ClientDataset, build_client_dataset
from privaterec.data.features import NewsFeatures, build_news_features, build_vocabularies
from privaterec.data.records import MindDataset, MindSplit
from privaterec.data.synth import SynthConfig, generate
from privaterec.data.text import TextVocabularies
from privaterec.fed.client import client_candidates
from privaterec.fed.methods import ClientMethod, FedRec, method_from_config, resolve_run_config
from privaterec.fed.objective import ClientBatch, LocalObjective
from privaterec.models.factory import build_recommender
from privaterec.models.recommender import Recommender

TINY_MODEL = ModelConfig(word_dim=8, num_heads=2, head_dim=4, attention_dim=8, title_len=6,
                         abstract_len=4, history_len=5, cnn_filters=8, gru_dim=8,
                         category_dim=4, short_term_len=3)
SYNTH = SynthConfig(users=40, news=150, seed=1, min_history=1, max_history=8)
EMPTY_HISTORY_USER = 6  # index of the user whose history is emptied in ``fed_data``


@dataclass(frozen=True)
class FedData:
    """The tiny synthetic data set, its vocabularies, news table and training clients."""

    dataset: MindDataset
    vocabs: TextVocabularies
    features: NewsFeatures
    clients: ClientDataset


@pytest.fixture(autouse=True)
def _fed_tests_on_one_thread(one_thread: None) -> None:
    """Every federated test runs on one intra-op thread (tests/conftest.py: one_thread)."""


@pytest.fixture(scope="session")
def tiny_model_config() -> ModelConfig:
    return TINY_MODEL


@pytest.fixture(scope="session")
def synth_config() -> SynthConfig:
    return SYNTH


@pytest.fixture(scope="session")
def fed_data() -> FedData:
    dataset = generate(SYNTH)
    users = sorted({imp.user_id for imp in dataset.train.behaviors})
    empty = users[EMPTY_HISTORY_USER]
    dataset.train = dataclasses.replace(dataset.train, behaviors=[
        dataclasses.replace(imp, history=()) if imp.user_id == empty else imp
        for imp in dataset.train.behaviors])
    vocabs = build_vocabularies(dataset.train.news.values())
    features = build_news_features(dataset.all_news(), vocabs, title_len=TINY_MODEL.title_len,
                                   abstract_len=TINY_MODEL.abstract_len)
    clients = build_client_dataset(dataset.train, features, history_len=TINY_MODEL.history_len)
    assert not clients.history_mask[EMPTY_HISTORY_USER].any()
    return FedData(dataset, vocabs, features, clients)


@pytest.fixture(scope="session")
def clients(fed_data: FedData) -> ClientDataset:
    return fed_data.clients


@pytest.fixture(scope="session")
def make_model(fed_data: FedData) -> Callable[..., Recommender]:
    """``make_model(news_encoder="nrms", user_encoder=None, seed=0, **model_changes)``."""

    def make(news_encoder: str = "nrms", user_encoder: str | None = None, seed: int = 0,
             **changes: object) -> Recommender:
        config = replace(TINY_MODEL, news_encoder=news_encoder, user_encoder=user_encoder,
                         **changes)
        torch.manual_seed(seed)
        return build_recommender(config, fed_data.vocabs, fed_data.features)

    return make


@pytest.fixture(scope="session")
def make_objective(make_model: Callable[..., Recommender]) -> Callable[..., LocalObjective]:
    """``make_objective(news_encoder="nrms", ...)``: a :class:`LocalObjective` of a tiny model."""

    def make(*args: object, **kwargs: object) -> LocalObjective:
        return LocalObjective(make_model(*args, **kwargs))

    return make


@pytest.fixture(scope="session")
def run_config() -> Callable[..., RunConfig]:
    """``run_config(method, seed=0, **fed_changes)``: a resolved federated RunConfig."""

    def make(method: str, *, seed: int = 0, **fed_changes: object) -> RunConfig:
        fed = fed_config(method, **fed_changes)  # the engine's and the method's settings
        config = RunConfig(data="unused", model=TINY_MODEL,
                           train=TrainConfig(method=method, seed=seed), fed=fed)
        return resolve_run_config(config)

    return make


@pytest.fixture(scope="session")
def client_method(run_config: Callable[..., RunConfig]) -> Callable[..., ClientMethod]:
    """``client_method(method, **fed_changes)``: the ClientMethod of a resolved config."""

    def make(method: str, **fed_changes: object) -> ClientMethod:
        return method_from_config(run_config(method, **fed_changes))

    return make


@pytest.fixture(scope="session")
def client_batch(clients: ClientDataset) -> Callable[..., tuple[ClientBatch, list[torch.Tensor]]]:
    """``client_batch(users, seed=0, negatives=4)``: candidates of ``users`` and their batch.

    Every sample of each user is used (no subsampling), so clients differ in their number
    of samples and the batch is padded.
    """

    def make(users: Sequence[int], *, seed: int = 0,
             negatives: int = 4) -> tuple[ClientBatch, list[torch.Tensor]]:
        method = FedRec(negatives=negatives, max_samples=10**6)
        generator = SimulationNoise(torch.Generator().manual_seed(seed))
        candidates = [client_candidates(clients.client(u), method, noise=generator)
                      for u in users]
        batch = ClientBatch.stack([clients.history[u] for u in users],
                                  [clients.history_mask[u] for u in users], candidates)
        return batch, candidates

    return make


def without_clicks(split: MindSplit, features: NewsFeatures, user_id: str, *,
                   history_len: int) -> ClientDataset:
    """The training clients of ``split`` with ``user_id``'s impressions stripped of their
    clicks: that user keeps their history and impressions but has no training sample (one
    user's data replaced, as central DP's adjacency allows)."""
    behaviors = [dataclasses.replace(imp, labels=tuple(0 for _ in imp.labels))
                 if imp.user_id == user_id and imp.labels is not None else imp
                 for imp in split.behaviors]
    clients = build_client_dataset(dataclasses.replace(split, behaviors=behaviors), features,
                                   history_len=history_len)
    assert int(clients.samples_per_user()[clients.user_ids.index(user_id)]) == 0
    return clients


def perturbed(objective: LocalObjective, scale: float = 0.05, seed: int = 0) -> torch.Tensor:
    """θ₀ + noise: gradients are checked away from the initialisation too."""
    generator = torch.Generator().manual_seed(seed)
    theta = objective.parameters()
    return theta + scale * torch.randn(theta.shape, generator=generator)


@pytest.fixture(scope="session")
def perturb() -> Callable[..., torch.Tensor]:
    return perturbed


@pytest.fixture(scope="session")
def strip_clicks() -> Callable[..., ClientDataset]:
    return without_clicks



@pytest.fixture
def flower_task_identity():
    """Flower stamps messages with the running task's identity (set by its runtimes); the
    in-process Flower tests set one and restore Flower's afterwards."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved
