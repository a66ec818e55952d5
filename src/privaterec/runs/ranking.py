"""From a data directory and a run configuration to a trained, evaluated ranking run.

This is the library entry point behind ``privaterec train`` and ``privaterec evaluate`` (for
Uni-FedRec runs: :mod:`privaterec.runs.recall`):
load data → vocabularies from training news only → news feature table → client datasets →
train (centralized or popularity) → evaluate on the test split → write the run directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import torch

import yaml

from privaterec.config import FEDERATED_METHODS, RunConfig
from privaterec.data.features import NewsFeatures, build_news_features
from privaterec.data.mind import BEHAVIORS_FILE, load_dataset
from privaterec.data.records import MindDataset, MindSplit
from privaterec.data.roster import is_public_dir
from privaterec.data.text import TextVocabularies
from privaterec.errors import CheckpointError, ConfigError, DataFormatError
from privaterec.eval.basis import basis_diagnostics
from privaterec.eval.evaluate import evaluate_model
from privaterec.eval.serving import private_user_encoder
from privaterec.fed.engine import check_run, federated_job
from privaterec.fed.evaluation import (FederatedEvaluation, TestImpressions,
                                       evaluation_policy)
from privaterec.fed.methods import resolve_run_config
from privaterec.models.recommender import Recommender
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.samplers import SimulationNoise
from privaterec.runs.artifacts import WORD_VECTORS_FILE, encode_word_vectors, word_vectors_of
from privaterec.runs.directory import RunDirectory
from privaterec.runs.engines import build_engine
from privaterec.runs.ranking_setup import (PreparedData, build_run_model, load_run_model,
                                          prepare_data, prepare_public_data)
from privaterec.runs.report import release_description
from privaterec.runtime.determinism import flush_denormals
from privaterec.runtime.device import run_device
from privaterec.ondevice.release import ServingConfig, serving_event
from privaterec.training.centralized import train_centralized
from privaterec.training.popularity import PopularityModel, evaluate_popularity


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


@flush_denormals()
def train_run(config: RunConfig, out: str | Path, *, drop_missing: bool = False,
              progress: bool = True, evaluate_each_epoch: bool = False,
              grid: Any = None, seeded_rehearsal: bool = False,
              device: str | torch.device | None = None,
              eval_data: str | Path | None = None) -> dict[str, Any]:
    """Train ``config`` into the run directory ``out`` (resuming if it holds this run).

    ``device``: where the model, the rounds and the evaluation run (``"auto"``, ``"cpu"``,
    ``"cuda"``, ``"cuda:N"``; ``None``: :func:`~privaterec.runtime.device.current_device`,
    the CPU unless set; docs/gpu.md). The Flower engine trains on the CPU whatever it says.

    ``grid``: a Flower Grid to send the rounds through (a ``flwr run`` ServerApp,
    :mod:`privaterec.apps.flower_app`); ``None``: the engine ``config.fed.engine`` names.
    ``seeded_rehearsal`` (with ``grid``): seed the server's sample and noise and send the
    seed to the SuperNodes, as a simulation does, to check a deployment against the
    simulator; never with real users (:func:`privaterec.fed.flower.serve`, ``deployed``).
    ``config.data`` a server's public directory (:mod:`privaterec.data.roster`: the news
    catalogue and the roster, with ``grid`` only): the server holds no user data
    (:func:`~privaterec.runs.ranking_setup.prepare_public_data`) and evaluates only on the
    public or consented holdout ``eval_data``, or not at all.
    Returns the metrics written to ``metrics.json`` (test metrics when a test split exists).
    """
    config = resolve_run_config(config)
    train_device = run_device(device)
    public = is_public_dir(config.data)
    if public and (grid is None or config.train.method not in FEDERATED_METHODS):
        raise ConfigError(f"{config.data}: holds a roster (a deployed server's public "
                          f"directory, no user data); only a federated method on a Flower "
                          f"deployment (flwr run, run config public-dir) trains from it; "
                          f"train other runs on a data directory")
    if eval_data is not None and not public:
        raise ConfigError("eval-data (a public or consented holdout) is for a server started "
                          "with a public directory (public-dir); a server given a data "
                          "directory evaluates on its test split")
    run = RunDirectory(Path(out))
    if run.check(config):  # refuse a different run, or changed data, before loading anything
        run.check_data(config.data)
    # load and validate the data before the run directory exists: a bad --data must not
    # leave behind a run that later retries are refused by
    if public:  # the catalogue and the roster only: nothing to check of anyone's samples
        prepared = prepare_public_data(config, eval_data=eval_data, drop_missing=drop_missing)
    else:
        prepared = prepare_data(config, drop_missing=drop_missing)
        check_training_data(prepared)
    if config.train.method in FEDERATED_METHODS:
        check_run(config, prepared.train_clients)  # e.g. central DP's delta < 1/N
    with run.lock():
        return _train_locked(config, run, prepared, progress=progress,
                             evaluate_each_epoch=evaluate_each_epoch, grid=grid,
                             seeded_rehearsal=seeded_rehearsal, device=train_device,
                             eval_data=None if eval_data is None else str(eval_data))


@flush_denormals()
def evaluate_untrained(config: RunConfig, *, progress: bool = False,
                       device: str | torch.device | None = None) -> dict[str, Any]:
    """Test metrics of the initial model θ₀ of ``config``'s run, without any training.

    θ₀ is the model :func:`train_run` starts from (:func:`build_run_model`, seeded with
    ``train.seed``). It has seen no user data, so it is the ε = 0 point every private row
    must be measured against: an encoder whose untrained news vectors already carry the
    data's structure (e.g. NAML's shared category embeddings) scores above 0.5 before any
    training.

    Raises
    ------
    ConfigError
        If ``config.data`` has no ``test/`` split.
    """
    config = resolve_run_config(config)
    prepared = prepare_data(config)
    test = evaluation_split(prepared.dataset, "test")
    model = build_run_model(config, prepared).to(run_device(device))
    return _evaluate(model, test, prepared.features, config, progress=progress)


def check_training_data(prepared: PreparedData) -> None:
    """Refuse a training split without a single training sample, before anything is written.

    A sample is a clicked candidate of a labelled impression that also has a non-clicked one
    (:func:`privaterec.data.clients.build_client_dataset`); every method needs at least one.

    Raises
    ------
    DataFormatError
        Naming the training split's ``behaviors.tsv`` and what it holds.
    """
    clients = prepared.train_clients
    if clients.num_samples > 0:
        return
    split = prepared.dataset.train
    where = (split.path / BEHAVIORS_FILE if split.path is not None
             else prepared.dataset.path or "the training split")
    skipped = ", ".join(f"{count} {what.replace('_', ' ')}"
                        for what, count in clients.skipped.items() if count)
    raise DataFormatError(
        where, None,
        f"the training split has no training sample ({len(split.behaviors)} impressions of "
        f"{clients.num_users} users" + (f"; skipped: {skipped}" if skipped else "") + "); "
        f"training needs labelled impressions (candidates as NID-1/NID-0) with a clicked and "
        f"a non-clicked candidate. Check the data with 'privaterec data check'")


def _train_locked(config: RunConfig, run: RunDirectory, prepared: PreparedData, *,
                  progress: bool, evaluate_each_epoch: bool, grid: Any,
                  seeded_rehearsal: bool, device: torch.device,
                  eval_data: str | None = None) -> dict[str, Any]:
    """:func:`train_run` once the run directory's training lock is held."""
    if run.start(config, data=config.data):
        _check_vocabularies(run, prepared.vocabs)
        run.record_data(config.data)
    else:
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
    if config.fed.engine == "simulator" or config.train.method not in FEDERATED_METHODS:
        model.to(device)  # the Flower engine's devices are phones: it stays on the CPU

    def test_auc() -> dict[str, Any] | None:
        if test is None:
            return None
        result = _evaluate(model, test, prepared.features, config)
        return {"test_auc": result["auc"]}

    def validate(epoch: int, entry: dict[str, float]) -> dict[str, Any] | None:
        return test_auc() if evaluate_each_epoch else None

    if config.train.method in FEDERATED_METHODS:
        log = _train_federated(config, run, model, prepared, progress=progress,
                               evaluate=test_auc, grid=grid,
                               seeded_rehearsal=seeded_rehearsal, eval_data=eval_data)
        log_key = "rounds"
    else:
        log = train_centralized(model, prepared.train_clients, config.train,
                                checkpoint_path=run.checkpoint_path, progress=progress,
                                on_epoch_end=validate)
        log_key = "epochs"
    known = ({"server_data": "public (catalogue and roster)"}
             if prepared.train_clients.roster_only else  # a server without the samples
             {"train_samples": prepared.train_clients.num_samples,
              "skipped": prepared.train_clients.skipped})
    metrics = run.update_metrics(method=config.train.method, **{log_key: log}, **known,
                                 train_users=prepared.train_clients.num_users,
                                 train_seconds=time.perf_counter() - started)
    federated = [entry["federated_eval"] for entry in log
                 if isinstance(entry, dict) and "federated_eval" in entry]
    if federated:  # the accounted estimate of the last federated evaluation
        metrics = run.update_metrics(test_federated=federated[-1])
    if test is not None:
        result = _evaluate(model, test, prepared.features, config, progress=progress)
        metrics = run.update_metrics(test=result)
        basis = _basis_diagnostics(model, test, prepared.features, config)
        if basis is not None:
            metrics = run.update_metrics(basis=basis)
    return metrics


def _check_vocabularies(run: RunDirectory, vocabs: TextVocabularies) -> None:
    """A resumed run's ``vocab.json`` must be the one its data gives (it is never rewritten:
    the model's embedding tables are sized by it).

    Raises
    ------
    CheckpointError
        If the vocabularies differ (the training news changed since the run started).
    """
    if not run.vocab_path.exists():
        vocabs.save(run.vocab_path)  # a run interrupted before it saved them
        return
    saved = TextVocabularies.load(run.vocab_path)
    if saved != vocabs:
        raise CheckpointError(
            f"{run.vocab_path}: the run's vocabularies ({len(saved.words.tokens)} words) differ "
            f"from those of its data now ({len(vocabs.words.tokens)} words): the training news "
            f"changed since the run started. Restore the data, or train a new run with "
            f"another --out")


def _evaluate(model: Recommender, split: MindSplit, features: NewsFeatures, config: RunConfig,
              **options: Any) -> dict[str, Any]:
    """:func:`~privaterec.eval.evaluate.evaluate_model` at the run's history length and
    evaluation batch size."""
    return dict(evaluate_model(model, split, features, history_len=config.model.history_len,
                               batch_size=config.train.eval_batch_size, **options))


def _basis_diagnostics(model: Recommender, split: MindSplit, features: NewsFeatures,
                       config: RunConfig) -> dict[str, Any] | None:
    """PrivateRec's collapse diagnostics on ``split``'s users (``None`` without a basis;
    :func:`privaterec.eval.basis.basis_diagnostics`), JSON-ready."""
    found = basis_diagnostics(model, split, features, history_len=config.model.history_len,
                              batch_size=config.train.eval_batch_size)
    return None if found is None else found.to_dict()


def _train_federated(config: RunConfig, run: RunDirectory, model: Recommender,
                     prepared: PreparedData, *, progress: bool,
                     evaluate: Callable[[], dict[str, Any] | None],
                     grid: Any, seeded_rehearsal: bool,
                     eval_data: str | None = None) -> list[dict[str, Any]]:
    """Federated training with ``privacy.json`` kept current at every checkpoint; its
    release states what the server held and what it evaluated on."""
    from privaterec.privacy.report import write_privacy_json

    clients = prepared.train_clients
    job = federated_job(config, model, progress=progress)
    m = job.clients_per_round(clients)
    release = release_description(job.method, dimension=job.task.dimension,
                                  noised_parameters=job.task.parameter_names(),
                                  clients_per_round=m,
                                  client_fraction=m / max(1, clients.num_users),
                                  population=len(job.method.population(clients)),
                                  deployed=(config.fed.engine == "flower" and grid is not None
                                            and not seeded_rehearsal),
                                  public_server=clients.roster_only)
    evaluation = _federated_evaluation(config, prepared)
    release["evaluation"] = evaluation_source(prepared, eval_data, evaluation=evaluation)

    def write_privacy(state: Any) -> None:
        if evaluation is not None:
            release["federated_evaluation"] = federated_evaluation_record(
                evaluation, state.log, delta=config.fed.report_delta)
        write_privacy_json(run.privacy_path, state.ledger, release=release,
                           delta=config.fed.report_delta, rounds=state.round_index)

    engine = build_engine(config.fed.engine, run_files=run_files(run, config, model), grid=grid,
                          deployed=not seeded_rehearsal)
    state = job.train(clients, engine=engine, checkpoint_path=run.checkpoint_path,
                      progress=progress, on_evaluate=lambda t, _: evaluate(),
                      on_checkpoint=write_privacy, evaluation=evaluation)
    return list(state.log)


def _federated_evaluation(config: RunConfig, prepared: PreparedData
                          ) -> FederatedEvaluation | None:
    """The run's federated evaluation (``fed.evaluation: federated``), with the devices'
    test impressions when the simulator computes their releases in process.

    Raises
    ------
    ConfigError
        If the simulator is asked to evaluate federatedly without a test split.
    """
    policy = evaluation_policy(config.fed)
    if policy is None:
        return None
    if config.fed.engine == "flower":  # the SuperNodes hold the test impressions
        return FederatedEvaluation(policy)
    test = prepared.dataset.test
    if test is None:
        raise ConfigError(f"{config.data}: has no test/ split, so the simulated devices have "
                          f"no test impressions for --eval federated; give a directory with "
                          f"train/ and test/, or --eval server")
    return FederatedEvaluation(policy, TestImpressions(
        test, prepared.features, history_len=config.model.history_len,
        batch_size=config.train.eval_batch_size))


def federated_evaluation_record(evaluation: FederatedEvaluation,
                                log: list[dict[str, Any]], *, delta: float) -> dict[str, Any]:
    """``privacy.json``'s ``release.federated_evaluation``: the policy, how many evaluations
    ran, and the ε they cost a user asked in every one (their releases composed alone, PLD,
    at ``delta``; the ledger's totals compose them with training)."""
    from privaterec.privacy.ledger import PrivacyLedger

    policy = evaluation.policy
    count = sum(1 for entry in log if "federated_eval" in entry)
    spent = PrivacyLedger()
    spent.record("user", policy.event, count)
    return {**policy.to_dict(), "adjacency": "user", "mechanism": "gaussian",
            "evaluations": count,
            "epsilon_all_evaluations": spent.user_epsilon("user", delta=delta,
                                                          adjacency="user") if count else 0.0,
            "epsilon_delta": delta}


def evaluation_source(prepared: PreparedData, eval_data: str | None, *,
                      evaluation: FederatedEvaluation | None = None) -> str:
    """What the run evaluated on, for ``privacy.json``: federated evaluation by the devices,
    or what the server evaluated on (the public or consented holdout ``eval_data``, the
    test split of the data it was given, or nothing)."""
    if evaluation is not None:
        policy = evaluation.policy
        text = (f"federated: sampled devices (each enrolled device with probability "
                f"{policy.fraction:g}) evaluated on their own test impressions and released "
                f"clipped metric sums with Gaussian noise (epsilon = {policy.epsilon:g}, "
                f"delta = {policy.delta:g} per release, user-level; sigma = "
                f"{policy.sigma:.4g}), each release in the ledger")
        if eval_data is not None:
            text += f"; the server also evaluated on the public or consented holdout {eval_data}"
        elif prepared.dataset.test is not None:
            text += (f"; the server also evaluated on the test split of "
                     f"{prepared.dataset.path}, which it reads (a simulation, for comparison)")
        return text
    if prepared.dataset.test is None:
        return "none: the server holds no evaluation data (no eval-data holdout given)"
    if eval_data is not None:
        return f"server-side on the public or consented holdout {eval_data}"
    return (f"server-side on the test split of {prepared.dataset.path}, which the server "
            f"reads")


def run_files(run: RunDirectory, config: RunConfig,
              model: Recommender | None = None) -> dict[str, str]:
    """The run's public files a Flower device rebuilds the model from: ``config.yaml`` (the
    resolved configuration), ``vocab.json`` when the run has one, and with ``"corpus"``
    embeddings the word vectors of ``model`` (the initial model) with their SHA-256
    (:mod:`privaterec.runs.artifacts`), which devices use instead of fitting them."""
    files = {"config.yaml": yaml.safe_dump(config.to_dict(), sort_keys=False)}
    if run.vocab_path.exists():
        files["vocab.json"] = run.vocab_path.read_text()
    table = None if model is None else word_vectors_of(model)
    if config.model.embeddings == "corpus" and table is not None:
        files[WORD_VECTORS_FILE] = encode_word_vectors(table)
    return files


def evaluate_run(run_dir: str | Path, data_dir: str | Path | None = None, *,
                 split: str = "test", drop_missing: bool = False,
                 progress: bool = True, serving: ServingConfig | None = None,
                 device: str | torch.device | None = None) -> dict[str, Any]:
    """Evaluate a run directory on ``split`` of ``data_dir`` (default: the training data).

    ``device``: as in :func:`train_run` (a checkpoint trained on any device loads on any;
    with ``serving`` the simulated devices' releases run on the CPU).

    With ``serving`` every labelled impression is a private query (PrivateRec Alg. 1-2, VDP,
    or local ranking at ε_s = 0): the metrics are those of the released representations, and
    the result gets a ``serving`` block. The simulated queries' releases are recorded in the
    evaluation's own record, ``RUN/serving-evaluations/<kind>-<key>.json`` (the training
    ledger plus this evaluation; the same evaluation again replaces it), never in
    ``RUN/privacy.json``, which holds what the deployment released
    (:func:`~privaterec.privacy.report.write_serving_record`).
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
    if data_dir is None or split == "train":  # the run's data, or its training split
        run.check_data(data_dir or config.data,
                       remedy=("Evaluate other data with --data DIR --split test" if split ==
                               "test" else "--split train evaluates on the training data; "
                               "evaluate other data with --data DIR --split test"))
    dataset = load_dataset(data_dir or config.data, drop_missing=drop_missing)
    target = evaluation_split(dataset, split)
    if config.train.method == "popularity":
        return evaluate_popularity(PopularityModel.load(run.popularity_path), target)
    config, vocabs, model = load_run_model(run_dir)
    if serving is None:
        model.to(run_device(device))
    with flush_denormals():
        result = _evaluate_model_run(run, config, vocabs, model, dataset, target,
                                     progress=progress, serving=serving,
                                     record_key=evaluation_key(serving, data_dir, split,
                                                               drop_missing))
    return result


def evaluation_key(settings: Any, data_dir: str | Path | None, split: str,
                   drop_missing: bool) -> str:
    """What identifies a simulated serving evaluation: its settings (dataclasses as dicts)
    and its data (a 12-digit hash)."""
    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return dataclasses.asdict(value)
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    text = json.dumps({"settings": plain(settings),
                       "data": None if data_dir is None else str(data_dir), "split": split,
                       "drop_missing": drop_missing}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _evaluate_model_run(run: RunDirectory, config: RunConfig, vocabs: TextVocabularies,
                        model: Recommender, dataset: MindDataset, target: MindSplit, *,
                        progress: bool, serving: ServingConfig | None,
                        record_key: str = "") -> dict[str, Any]:
    features = build_news_features(dataset.all_news(), vocabs,
                                   title_len=config.model.title_len,
                                   abstract_len=config.model.abstract_len)
    if serving is None:
        plain = _evaluate(model, target, features, config, progress=progress)
        diagnostics = _basis_diagnostics(model, target, features, config)
        if diagnostics is not None:
            plain["basis"] = diagnostics
        return plain
    if serving.mode.on_device:  # the device ranks P = b·Rᵀ itself, sends nothing
        from privaterec.eval.serving import local_ranking_seams
        encoder, candidates = local_ranking_seams(model)
    else:
        encoder = private_user_encoder(
            model, features, serving,
            noise=SimulationNoise(torch.Generator().manual_seed(serving.seed)))
        candidates = None
    result = _evaluate(model, target, features, config, progress=progress,
                       user_encoder=encoder, candidate_transform=candidates)
    basis = 0 if model.basis is None else int(model.basis.size)
    event = serving_event(serving, basis_size=basis, dim=model.dim)
    queries = Counter(imp.user_id for imp in target.behaviors if imp.labels is not None)
    record = serving_record_path(run, serving, record_key)
    summary = record_serving(run, config, event, queries, serving, record)
    serve = summary["report"]["phases"]["serve"]
    total = summary["report"]["phases"]["total"]
    total_user = summary["report"].get("phases_user", {}).get("total", {})
    result["serving"] = {**dataclasses.asdict(serving), "event": event.to_dict(),
                         "queries": sum(queries.values()), "users": len(queries),
                         "bytes_per_query": 4 * serving.mode.width(basis_size=basis,
                                                                   dim=model.dim),
                         "epsilon_serve_user_max": serve["epsilon_max"],
                         "epsilon_user_max": total["epsilon_max"],
                         "epsilon_user_max_user_level": total_user.get("epsilon_max"),
                         "privacy_delta": summary["delta"], "simulated": True,
                         "record": str(record)}
    if serving.mode.on_device:
        from privaterec.eval.serving import local_download_bytes
        ids = list(dataset.all_news())
        rows = basis or model.dim
        result["serving"].update(
            bytes_per_query=0, pool_news=len(ids),
            bytes_downloaded=local_download_bytes(ids, rows, "float32"),
            bytes_downloaded_float16=local_download_bytes(ids, rows, "float16"))
    return result


SERVING_RECORDS = "serving-evaluations"
"""The run's folder of simulated serving records (one file per evaluation setting)."""


def serving_record_path(run: RunDirectory, serving: ServingConfig, key: str) -> Path:
    """``RUN/serving-evaluations/<kind>-<key>.json``: one simulated evaluation's record."""
    return run.path / SERVING_RECORDS / f"{serving.kind}-{key or 'default'}.json"


def record_serving(run: RunDirectory, config: RunConfig, event: PrivacyEvent,
                   queries: Counter[str], serving: ServingConfig,
                   record: Path) -> dict[str, Any]:
    """Write the simulated serving queries' own record ``record`` (training ledger + these
    queries); ``RUN/privacy.json`` is read, never written.

    A run without ``privacy.json`` (centralized training) gets a record whose release says
    its training is not private.
    """
    from privaterec.privacy.report import write_serving_record

    return write_serving_record(
        record, run.privacy_path, {user: [(event, count)] for user, count in queries.items()},
        {"kind": serving.kind, "epsilon": serving.epsilon, "delta": serving.delta,
         "padding_p": serving.effective_padding, "mechanism": serving.mechanism,
         "noise_scale": event.noise_scale, "sensitivity": event.sensitivity,
         "queries": sum(queries.values())},
        release_if_new={"method": config.train.method, "mechanism": "none",
                        "note": "training is not private (data collected centrally)"},
        delta_if_new=config.fed.report_delta)
