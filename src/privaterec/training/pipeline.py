"""From a data directory and a run configuration to a trained, evaluated run directory.

This is the library entry point behind ``privaterec train`` and ``privaterec evaluate``:
load data → vocabularies from training news only → news feature table → client datasets →
train (centralized or popularity) → evaluate on the test split → write the run directory.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from privaterec.config import FEDERATED_METHODS, RunConfig
from privaterec.fed.methods import resolve_run_config
from privaterec.data.clients import ClientDataset, build_client_dataset
from privaterec.data.features import NewsFeatures, build_news_features, build_vocabularies
from privaterec.data.mind import load_dataset
from privaterec.data.records import MindDataset, MindSplit
from privaterec.data.text import TextVocabularies
from privaterec.errors import CheckpointError, ConfigError
from privaterec.eval.evaluate import evaluate_model
from privaterec.eval.serving import private_user_encoder
from privaterec.models.factory import build_recommender, vocabulary_kind
from privaterec.models.recommender import Recommender
from privaterec.privacy.events import PrivacyEvent
from privaterec.serving.release import ServingConfig, serving_event
from privaterec.training.centralized import train_centralized
from privaterec.training.checkpoint import load_checkpoint
from privaterec.training.determinism import flush_denormals
from privaterec.training.popularity import PopularityModel, evaluate_popularity
from privaterec.training.run import RunDirectory


@dataclass
class PreparedData:
    """A loaded dataset with its vocabularies, news table and training clients."""

    dataset: MindDataset
    vocabs: TextVocabularies
    features: NewsFeatures
    train_clients: ClientDataset


def prepare_data(config: RunConfig, *, drop_missing: bool = False,
                 vocabs: TextVocabularies | None = None) -> PreparedData:
    """Load ``config.data`` and build everything a trainer needs.

    Vocabularies come from the training split's news only (DESIGN §4 erratum 9) unless
    ``vocabs`` (e.g. those of a trained run) are given.
    """
    dataset = load_dataset(config.data, drop_missing=drop_missing)
    model = config.model
    if vocabs is None:
        vocabs = build_vocabularies(dataset.train.news.values(), kind=vocabulary_kind(model),
                                    min_count=model.min_word_count)
    features = build_news_features(dataset.all_news(), vocabs, title_len=model.title_len,
                                   abstract_len=model.abstract_len)
    clients = build_client_dataset(dataset.train, features, history_len=model.history_len)
    return PreparedData(dataset, vocabs, features, clients)


def build_run_model(config: RunConfig, prepared: PreparedData) -> Recommender:
    """The run's initial model: seeded with ``train.seed``, news table attached.

    Every engine builds it this way, so frozen parameters that are not trained (e.g. random
    frozen word vectors) are the same on the server and on every device.
    """
    torch.manual_seed(config.train.seed)
    return build_recommender(config.model, prepared.vocabs, prepared.features)


def evaluation_split(dataset: MindDataset, split: str) -> MindSplit:
    """The ``train`` or ``test`` split of a dataset, with a clear error when absent."""
    if split == "train":
        return dataset.train
    if split == "test":
        if dataset.test is None:
            raise ConfigError(f"{dataset.path}: has no test/ split; evaluate with "
                              f"--split train or give a directory with train/ and test/")
        return dataset.test
    raise ConfigError(f"invalid split {split!r}; expected 'train' or 'test'")


def train_run(config: RunConfig, out: str | Path, *, drop_missing: bool = False,
              progress: bool = True, evaluate_each_epoch: bool = False) -> dict[str, Any]:
    """Train ``config`` into the run directory ``out`` (resuming if it holds this run).

    Returns the metrics written to ``metrics.json`` (test metrics when a test split exists).
    """
    with flush_denormals():
        return _train_run(resolve_run_config(config), out, drop_missing=drop_missing,
                          progress=progress, evaluate_each_epoch=evaluate_each_epoch)


def _train_run(config: RunConfig, out: str | Path, *, drop_missing: bool, progress: bool,
               evaluate_each_epoch: bool) -> dict[str, Any]:
    run = RunDirectory(Path(out))
    run.check(config)  # refuse a different run before loading anything
    # load and validate the data before the run directory exists: a bad --data must not
    # leave behind a run that later retries are refused by
    prepared = prepare_data(config, drop_missing=drop_missing)
    if config.train.method in FEDERATED_METHODS:
        from privaterec.fed.engine import check_run
        check_run(config, prepared.train_clients)  # e.g. central DP's delta < 1/N
    run.start(config)
    prepared.vocabs.save(run.vocab_path)
    test = prepared.dataset.test
    started = time.perf_counter()
    if config.train.method == "popularity":
        popularity = PopularityModel.fit(prepared.dataset.train)
        popularity.save(run.popularity_path)
        metrics = run.update_metrics(method="popularity",
                                     train_seconds=time.perf_counter() - started)
        if test is not None:
            metrics = run.update_metrics(test=evaluate_popularity(popularity, test))
        return metrics

    model = build_run_model(config, prepared)

    def test_auc() -> dict[str, Any] | None:
        if test is None:
            return None
        result = evaluate_model(model, test, prepared.features,
                                history_len=config.model.history_len,
                                batch_size=config.train.eval_batch_size)
        return {"test_auc": result["auc"]}

    def validate(epoch: int, entry: dict[str, float]) -> dict[str, Any] | None:
        return test_auc() if evaluate_each_epoch else None

    if config.train.method in FEDERATED_METHODS:
        log = _train_federated(config, run, model, prepared, progress=progress,
                               evaluate=test_auc)
        log_key = "rounds"
    else:
        log = train_centralized(model, prepared.train_clients, config.train,
                                checkpoint_path=run.checkpoint_path, progress=progress,
                                on_epoch_end=validate)
        log_key = "epochs"
    metrics = run.update_metrics(method=config.train.method, **{log_key: log},
                                 train_samples=prepared.train_clients.num_samples,
                                 train_users=prepared.train_clients.num_users,
                                 skipped=prepared.train_clients.skipped,
                                 train_seconds=time.perf_counter() - started)
    if test is not None:
        result = evaluate_model(model, test, prepared.features,
                                history_len=config.model.history_len,
                                batch_size=config.train.eval_batch_size, progress=progress)
        metrics = run.update_metrics(test=result)
    return metrics


def _train_federated(config: RunConfig, run: RunDirectory, model: Recommender,
                     prepared: PreparedData, *, progress: bool,
                     evaluate: Callable[[], dict[str, Any] | None]) -> list[dict[str, Any]]:
    """Federated training (fedrec, fednewsrec, dp-fedrec) with ``privacy.json`` kept current."""
    from privaterec.fed.engine import train_federated_run
    from privaterec.privacy.report import write_privacy_json

    def write_privacy(state: Any, release: dict[str, Any]) -> None:
        write_privacy_json(run.privacy_path, state.ledger, release=release,
                           delta=config.fed.report_delta, rounds=state.round_index)

    state = train_federated_run(config, model, prepared.train_clients,
                                checkpoint_path=run.checkpoint_path, progress=progress,
                                on_evaluate=lambda t, _: evaluate(),
                                on_checkpoint=write_privacy)
    return list(state.log)


def load_run_model(run_dir: str | Path) -> tuple[RunConfig, TextVocabularies, Recommender]:
    """Rebuild a trained model from its run directory (no news table attached)."""
    run = RunDirectory(Path(run_dir))
    config = run.config()
    if config.train.method == "popularity":
        raise CheckpointError(f"{run.path}: a popularity run has no neural model")
    vocabs = TextVocabularies.load(run.vocab_path)
    model = build_recommender(config.model, vocabs)
    state = load_checkpoint(run.checkpoint_path)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise CheckpointError(f"{run.checkpoint_path}: does not match the model in "
                              f"{run.config_path} ({exc})") from None
    model.eval()
    return config, vocabs, model


def evaluate_run(run_dir: str | Path, data_dir: str | Path | None = None, *,
                 split: str = "test", drop_missing: bool = False,
                 progress: bool = True, serving: ServingConfig | None = None) -> dict[str, Any]:
    """Evaluate a run directory on ``split`` of ``data_dir`` (default: the training data).

    With ``serving`` every labelled impression is a private query (PrivateRec Alg. 1-2, or
    VDP): the metrics are those of the released representations, the result gets a
    ``serving`` block, and the queries' releases are recorded, per user, in the run's
    privacy ledger (``RUN/privacy.json``, phase ``serve``).
    """
    run = RunDirectory(Path(run_dir))
    config = run.config()
    # the run's own files first: an unfinished run is reported as such, not by its data path
    model_file = (run.popularity_path if config.train.method == "popularity"
                  else run.checkpoint_path)
    if not model_file.exists():
        raise CheckpointError(f"{run.path}: has no trained model yet ({model_file.name} is "
                              f"missing): its training never reached a checkpoint; run "
                              f"'privaterec train --out {run.path}' with the same options to "
                              f"train it")
    dataset = load_dataset(data_dir or config.data, drop_missing=drop_missing)
    target = evaluation_split(dataset, split)
    if config.train.method == "popularity":
        return evaluate_popularity(PopularityModel.load(run.popularity_path), target)
    config, vocabs, model = load_run_model(run_dir)
    with flush_denormals():
        return _evaluate_model_run(run, config, vocabs, model, dataset, target,
                                   progress=progress, serving=serving)


def _evaluate_model_run(run: RunDirectory, config: RunConfig, vocabs: TextVocabularies,
                        model: Recommender, dataset: MindDataset, target: MindSplit, *,
                        progress: bool, serving: ServingConfig | None) -> dict[str, Any]:
    features = build_news_features(dataset.all_news(), vocabs,
                                   title_len=config.model.title_len,
                                   abstract_len=config.model.abstract_len)
    if serving is None:
        return evaluate_model(model, target, features, history_len=config.model.history_len,
                              batch_size=config.train.eval_batch_size, progress=progress)
    if serving.kind == "local":  # issue 16: the device ranks P = b·Rᵀ itself, sends nothing
        from privaterec.eval.serving import local_ranking_seams
        encoder, candidates = local_ranking_seams(model)
    else:
        encoder = private_user_encoder(model, features, serving,
                                       generator=torch.Generator().manual_seed(serving.seed))
        candidates = None
    result: dict[str, Any] = dict(evaluate_model(
        model, target, features, history_len=config.model.history_len,
        batch_size=config.train.eval_batch_size, progress=progress, user_encoder=encoder,
        candidate_transform=candidates))
    basis = 0 if model.basis is None else int(model.basis.size)
    event = serving_event(serving, basis_size=basis, dim=model.dim)
    queries = Counter(imp.user_id for imp in target.behaviors if imp.labels is not None)
    summary = record_serving(run, config, event, queries, serving)
    serve = summary["report"]["phases"]["serve"]
    result["serving"] = {**dataclasses.asdict(serving), "event": event.to_dict(),
                         "queries": sum(queries.values()), "users": len(queries),
                         "bytes_per_query": 4 * (basis if serving.kind == "privaterec"
                                                 else model.dim),
                         "epsilon_serve_user_max": serve["epsilon_max"],
                         "privacy_delta": summary["delta"]}
    if serving.kind == "local":
        from privaterec.eval.serving import local_download_bytes
        ids = list(dataset.all_news())
        rows = basis or model.dim
        result["serving"].update(
            bytes_per_query=0, pool_news=len(ids),
            bytes_downloaded=local_download_bytes(ids, rows, "float32"),
            bytes_downloaded_float16=local_download_bytes(ids, rows, "float16"))
    return result


def record_serving(run: RunDirectory, config: RunConfig, event: PrivacyEvent,
                   queries: Counter[str], serving: ServingConfig) -> dict[str, Any]:
    """Add the serving queries' releases to the run's ledger and rewrite ``privacy.json``.

    A run without ``privacy.json`` (centralized training) gets one whose release says its
    training is not private.
    """
    from privaterec.privacy.report import record_queries

    return record_queries(
        run.privacy_path, {user: [(event, count)] for user, count in queries.items()},
        {"kind": serving.kind, "epsilon": serving.epsilon, "delta": serving.delta,
         "padding_p": serving.effective_padding, "mechanism": serving.mechanism,
         "noise_scale": event.noise_scale, "sensitivity": event.sensitivity,
         "queries": sum(queries.values())},
        release_if_new={"method": config.train.method, "mechanism": "none",
                        "note": "training is not private (data collected centrally)"},
        delta_if_new=config.fed.report_delta)
