"""Shared fixtures of the serving tests (also used by the SDK tests).

* ``serving_news`` / ``serving_news_path`` — 110 synthetic articles (the synthetic generator's
  topic-coherent titles) and their MIND ``news.tsv``;
* ``privaterec_run`` — a tiny PrivateRec ranking run directory written the way
  ``privaterec train`` writes one (``config.yaml``, ``vocab.json``, ``checkpoint.pt`` with the
  ``state_dict`` under ``model``), with random weights: NRMS, d = 16, B = 5 basic vectors;
* ``serving_models`` — :class:`ServingModels` loaded from that run;
* ``serving_model_config`` / ``ranking_run_writer`` — its ModelConfig and the function that
  writes such a run (for variants, e.g. without a basis);
* ``served_store`` — a fresh :class:`NewsStore` (per test) holding the 110 articles;
* ``served_app`` — a FastAPI ``TestClient`` over that store, whose write API takes
  ``write_token`` (send the ``write_headers`` fixture) with a rate limit high enough for
  tests;
* ``recall_model`` — a random Uni-FedRec recall model over the run's 16-dim news vectors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import torch
from fastapi.testclient import TestClient

from privaterec.config import ModelConfig, RunConfig, TrainConfig
from privaterec.data.features import build_vocabularies
from privaterec.data.mind import write_news
from privaterec.data.records import NewsRecord
from privaterec.data.synth import SynthConfig, generate
from privaterec.models.factory import build_recommender
from privaterec.runtime.checkpoint import save_checkpoint
from privaterec.runs.directory import RunDirectory

SERVING_MODEL = ModelConfig(news_encoder="nrms", word_dim=16, num_heads=2, head_dim=8,
                            attention_dim=8, title_len=8, abstract_len=8, history_len=10,
                            dropout=0.0, basis_size=5)
NUM_SERVING_NEWS = 120  # news generated (the synthetic data set keeps 110 of them)
WRITE_TOKEN = "test-write-token-0123456789abcdefghijklmnop"
WRITE_HEADERS = {"Authorization": f"Bearer {WRITE_TOKEN}"}


@pytest.fixture(autouse=True)
def _device_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's devices keep their default state (ledger) in its own temporary directory.

    Without ``cache_dir`` a device persists its ledger in the user's state directory
    (``$PRIVATEREC_DEVICE_DIR``); tests must neither read nor spend from the real one.
    """
    path = tmp_path / "device-state"
    monkeypatch.setenv("PRIVATEREC_DEVICE_DIR", str(path))
    return path


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """One intra-op thread (two shared cores; tiny kernels only get slower with more)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def write_token() -> str:
    """The write token of ``served_app`` (and of the tests' other write-enabled apps)."""
    return WRITE_TOKEN


@pytest.fixture(scope="session")
def write_headers() -> dict[str, str]:
    """``Authorization: Bearer`` with :data:`WRITE_TOKEN`."""
    return dict(WRITE_HEADERS)


@pytest.fixture(scope="session")
def serving_news() -> list[NewsRecord]:
    dataset = generate(SynthConfig(users=20, news=NUM_SERVING_NEWS, topics=4, seed=7,
                                   min_history=1, max_history=5))
    return list(dataset.all_news().values())


@pytest.fixture(scope="session")
def serving_news_path(serving_news: list[NewsRecord],
                      tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("serving-news") / "news.tsv"
    write_news(path, serving_news)
    return path


def write_ranking_run(path: Path, news: list[NewsRecord], model_config: ModelConfig, *,
                      seed: int = 0, method: str = "privaterec") -> Path:
    """A run directory as ``privaterec train`` leaves it, with untrained (random) weights."""
    run = RunDirectory(path)
    config = RunConfig(data=str(path / "data"), model=model_config,
                       train=TrainConfig(method=method, seed=seed))
    run.start(config)
    vocabs = build_vocabularies(news, min_count=1)
    vocabs.save(run.vocab_path)
    torch.manual_seed(seed)
    model = build_recommender(model_config, vocabs)
    save_checkpoint(run.checkpoint_path, {"model": model.state_dict(), "epoch": 0})
    return path


@pytest.fixture(scope="session")
def serving_model_config() -> ModelConfig:
    """The tiny PrivateRec architecture of ``privaterec_run``."""
    return SERVING_MODEL


@pytest.fixture(scope="session")
def ranking_run_writer():
    """:func:`write_ranking_run` (``path, news, model_config, *, seed, method`` → path)."""
    return write_ranking_run


@pytest.fixture(scope="session")
def privaterec_run(serving_news: list[NewsRecord],
                   tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny PrivateRec ranking run directory (B = 5, d = 16, random weights)."""
    return write_ranking_run(tmp_path_factory.mktemp("privaterec-run") / "run", serving_news,
                             SERVING_MODEL)


@pytest.fixture(scope="session")
def serving_models(privaterec_run: Path):
    from privaterec.serving.bundle import ServingModels

    return ServingModels.from_run(privaterec_run)


def _open_pool(models, news: list[NewsRecord], path: Path):
    from privaterec.serving.server import open_store

    store = open_store(models, path)
    store.upsert(news)
    return store


@pytest.fixture
def served_store(serving_models, serving_news: list[NewsRecord], tmp_path: Path):
    store = _open_pool(serving_models, serving_news, tmp_path / "store")
    yield store
    store.close()


@pytest.fixture
def recall_service(serving_models, recall_model, serving_news: list[NewsRecord],
                   tmp_path: Path):
    """``(models, store)``: the PrivateRec run plus the Uni-FedRec recall model, and a store
    holding the 110 articles in both score spaces."""
    from privaterec.serving.bundle import ServingModels

    models = ServingModels(serving_models.config, serving_models.vocabs,
                           serving_models.ranker, recall=recall_model)
    store = _open_pool(models, serving_news, tmp_path / "recall-store")
    yield models, store
    store.close()


@pytest.fixture
def served_app(served_store, serving_models) -> Iterator[TestClient]:
    """A ``TestClient`` of the app serving ``privaterec_run`` over the 110 articles."""
    from privaterec.serving.app import create_app
    from privaterec.serving.write_api import WriteLimits

    app = create_app(served_store, serving_models, write_token=WRITE_TOKEN,
                     write_limits=WriteLimits(rate=1e6, burst=10_000))
    with TestClient(app) as client:
        yield client


@pytest.fixture(scope="session")
def recall_model():
    """A random Uni-FedRec recall model over 16-dim news vectors (B_r = 6, M = 3)."""
    from privaterec.runs.recall import RecallModelConfig

    torch.manual_seed(11)
    return RecallModelConfig(num_basis=6, attention_dim=8, max_channels=3).build(
        SERVING_MODEL.news_dim).eval()
