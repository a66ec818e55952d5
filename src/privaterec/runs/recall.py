"""Uni-FedRec run directories: ``privaterec train --method unifedrec --ranker RUN``.

A Uni-FedRec run trains the recall model (Uni-FedRec §3.2–3.5) on the news vectors of an
already trained ranking run (``--ranker``, any neural model trained by the other methods;
Uni-FedRec §3.3 footnote 3: the recall model reuses the ranker's news encoder). The
directory holds

* ``recall.yaml`` — :class:`RecallRunConfig` (ranker path, data, seed, model, training);
* ``checkpoint.pt`` — the federated state (θ, strategy state, ledger, log) and the model's
  ``state_dict`` under ``model``; training resumes from it;
* ``privacy.json`` — the ledger of the training uploads (and of evaluation queries, phase
  ``serve``) with its report;
* ``metrics.json`` — training summary.

:func:`load_recall_run` rebuilds the trained model; :func:`is_recall_run` tells the two kinds
of run directory apart (:class:`~privaterec.runs.directory.RunDirectory` names the files of
both).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privaterec.errors import CheckpointError, ConfigError, DataFormatError
from privaterec.ondevice.release import QUERY_MODES, SERVING_MODES, ServingConfig, serving_event
from privaterec.recall.interest import CHANNEL_NOTE, channel_event
from privaterec.recall.model import UniFedRecRecall
from privaterec.runtime.device import run_device
from privaterec.runs.directory import RunDirectory
from privaterec.runs.report import SIMULATION_TRUST
from privaterec.runs.recall_setup import (HEAD_DIM, METHOD, RECALL_CONFIG_FILE, REPORT_DELTA,
                                          RankerNews, RecallModelConfig, RecallRunConfig,
                                          RecallSetup, load_ranker_news, recall_setup)


@dataclass
class RecallRun:
    """A trained Uni-FedRec run: its directory, configuration and recall model (eval mode)."""

    directory: RunDirectory
    config: RecallRunConfig
    model: UniFedRecRecall

    @property
    def ranker(self) -> Path:
        """The ranking run directory (relative paths resolve against the working directory)."""
        return Path(self.config.ranker)

    @property
    def checkpoint_path(self) -> Path:
        """The run's ``checkpoint.pt`` (its recall model's ``state_dict`` under ``model``)."""
        return self.directory.checkpoint_path


def is_recall_run(path: str | Path) -> bool:
    """Whether ``path`` is a Uni-FedRec run directory (holds ``recall.yaml``)."""
    return RunDirectory(Path(path)).is_recall


def load_recall_run(path: str | Path) -> RecallRun:
    """Rebuild the trained recall model of a Uni-FedRec run directory.

    Raises
    ------
    CheckpointError
        If the directory is not a trained Uni-FedRec run or its files do not match.
    """
    from privaterec.runtime.checkpoint import load_checkpoint

    run = RunDirectory(Path(path))
    if not run.is_recall:
        raise CheckpointError(f"{run.path}: not a Uni-FedRec run (no {RECALL_CONFIG_FILE}); "
                              f"train one with `privaterec train --method unifedrec --ranker "
                              f"RUN --out {run.path}`")
    config = RecallRunConfig.from_yaml(run.recall_config_path)
    checkpoint = run.checkpoint_path
    if not checkpoint.exists():
        raise CheckpointError(f"{checkpoint}: missing; the run has not trained yet (run "
                              f"`privaterec train --method unifedrec` into {run.path})")
    state = load_checkpoint(checkpoint)
    try:
        model = config.model.build(int(state["model"]["interest.values"].shape[1]))
        model.load_state_dict(state["model"])
    except (KeyError, RuntimeError, ConfigError) as exc:
        raise CheckpointError(f"{checkpoint}: does not match the recall model of "
                              f"{run.recall_config_path} ({exc})") from None
    model.eval()
    return RecallRun(run, config, model)


def train_recall_run(config: RecallRunConfig, out: str | Path, *, progress: bool = True,
                     drop_missing: bool = False,
                     device: str | torch.device | None = None) -> dict[str, Any]:
    """Train the recall model of ``config`` into the run directory ``out`` (resumable).

    ``device``: where the recall model and its rounds run (as in
    :func:`privaterec.runs.ranking.train_run`; the Flower engine stays on the CPU).

    The news vectors are the ranker's encodings of every news of the data set (train and
    test splits); the clients are the training split's users (histories and clicks as rows
    of that table). Returns the summary written to ``metrics.json``.

    Raises
    ------
    CheckpointError
        If ``out`` holds a different run.
    """
    from privaterec.data.mind import load_dataset
    from privaterec.fed.engine import check_sampling
    from privaterec.fed.sampling import eligible_clients
    from privaterec.privacy.report import write_privacy_json
    from privaterec.recall.task import train_recall
    from privaterec.runs.engines import build_engine

    run = RunDirectory(Path(out))
    ranker_config = RunDirectory(Path(config.ranker)).config()
    data = config.data or ranker_config.data
    config = dataclasses.replace(config, data=data).resolved()
    if run.check(config):  # raises if it holds another run
        run.check_data(data)
        if run.metrics_path.exists():
            # Finished: nothing to train, and privacy.json may hold recorded queries since.
            return run.read_metrics()
    # load (and validate) the data and the ranker before the run directory exists
    dataset = load_dataset(data, drop_missing=drop_missing)
    setup = recall_setup(config, dataset, progress=progress)
    eligible = len(eligible_clients(setup.clients))
    if eligible == 0:
        raise DataFormatError(
            dataset.train.path or data, None,
            f"the training split has no user with a training click "
            f"({len(dataset.train.behaviors)} impressions): nothing to train the recall model "
            f"on. Training needs labelled impressions (candidates as NID-1/NID-0); check the "
            f"data with 'privaterec data check'")
    check_sampling(config.fed, eligible)
    if config.fed.engine == "simulator":
        setup.model.to(run_device(device))
    with run.lock():
        run.start(config, data=data)
        run.record_data(data)
        engine = build_engine(config.fed.engine, run_files={
            RECALL_CONFIG_FILE: run.recall_config_path.read_text()})
        state = train_recall(setup.model, setup.vectors, setup.clients, config.fed,
                             config.train, seed=config.seed, pool_rows=setup.pool_rows,
                             engine=engine, checkpoint_path=run.checkpoint_path,
                             progress=progress)
        release = recall_release(config)
        write_privacy_json(run.privacy_path, state.ledger, release=release,
                           delta=config.fed.report_delta, rounds=state.round_index)
        losses = [entry["loss"] for entry in state.log if "loss" in entry]
        metrics = {"method": METHOD, "rounds": state.round_index,
                   "first_loss": losses[0] if losses else math.nan,
                   "last_loss": losses[-1] if losses else math.nan,
                   "train_epsilon_per_round": release["epsilon_per_round"],
                   "users_trained": len(state.ledger.users)}
        run.metrics_path.write_text(json.dumps(metrics, indent=2))
        return metrics


def recall_release(config: RecallRunConfig) -> dict[str, Any]:
    """The ``release`` block of ``privacy.json``: what each training upload and query sends
    (the method's description, :meth:`~privaterec.recall.task.UniFedRecLDP.describe`, and
    the serving queries')."""
    description = config.method().describe(dimension=1, parameters=[], clients_per_round=0,
                                           client_fraction=0.0)
    return {**description, "mode": "simulation", "trust": SIMULATION_TRUST,
            "serving_channel_epsilon": config.model.channel_epsilon,
            "serving_note": ("each query releases C channels of B clipped scores + "
                             "Laplace(lambda_I), 2*delta*B/lambda_I each, composed over the C "
                             "channels; the quotas (and C) are sent in the clear unless quota "
                             "noise is on")}


def record_recall_queries(run: RecallRun, ledger_events: dict[str, list], *,
                          description: dict[str, Any], record: Path) -> dict[str, Any]:
    """Write the simulated evaluation queries' releases (user → [(event, count)]) to their own
    record ``record`` (the run's training ledger plus these queries); ``RUN/privacy.json`` is
    read, never written (:func:`~privaterec.privacy.report.write_serving_record`)."""
    from privaterec.privacy.report import write_serving_record

    return write_serving_record(record, run.directory.privacy_path, ledger_events, description,
                                release_if_new=recall_release(run.config),
                                delta_if_new=REPORT_DELTA)


def query_bytes(method: str, *, channels: float, num_basis: int, dim: int) -> float:
    """Bytes one query sends (4-byte floats): Uni-FedRec C·(B + 1), PrivateRec B, no-BIE
    C·(d + 1), YoutubeNet and VDP d; ``channels`` may be a mean over users."""
    if method == "unifedrec":
        return 4.0 * channels * (num_basis + 1)
    if method == "no-bie":
        return 4.0 * channels * (dim + 1)
    mode = SERVING_MODES.get(method)
    return 4.0 * (dim if mode is None else mode.width(basis_size=num_basis, dim=dim))


def evaluate_recall_run(run_dir: str | Path, *, method: str, data: str | Path | None = None,
                        split: str = "test", seed: int = 0, serve_noise: bool = True,
                        quota_noise_scale: float | None = None,
                        interest_noise: float | None = None,
                        serving: ServingConfig | None = None,
                        ks: tuple[int, ...] | None = None, auc_recall_size: int | None = None,
                        record: bool = True, drop_missing: bool = False,
                        progress: bool = True) -> dict[str, Any]:
    """Recall metrics of a run (``privaterec evaluate --run RUN --recall METHOD``).

    Parameters
    ----------
    run_dir:
        A Uni-FedRec run (every method; the ranking model is its ranker) or a ranking run
        (``youtubenet``, ``privaterec``, ``vdp``).
    method:
        ``unifedrec``, ``no-bie``, ``youtubenet``, ``privaterec`` or ``vdp``
        (:func:`~privaterec.recall.evaluate.evaluate_recall`).
    data, split:
        Data directory (default: the run's) and the split whose users query.
    seed:
        Seeds the simulated devices' noise.
    serve_noise, quota_noise_scale:
        Uni-FedRec's score noise (``False``: noise-free ablation) and optional quota noise.
    interest_noise:
        Uni-FedRec: serve with this λ_I instead of the trained model's (the λ_I sweep of
        Uni-FedRec Fig. 5).
    serving:
        ``privaterec`` / ``vdp``: the device's mechanism (ε_s, p, ...).
    record:
        Record the simulated queries' releases (phase ``serve``) in the evaluation's own
        record ``RUN/serving-evaluations/<kind>-<key>.json`` (replaced by the same evaluation
        again; never in ``RUN/privacy.json``): the Uni-FedRec run's for ``unifedrec``, the
        ranking run's for ``privaterec`` / ``vdp``. The clear-text baselines (``youtubenet``,
        ``no-bie``) are never recorded.

    Returns
    -------
    The metrics of :func:`~privaterec.recall.evaluate.evaluate_recall` without the per-user
    events, plus ``query_epsilon_mean`` / ``query_epsilon_max`` (basic composition of each
    user's query, quotas excluded), ``quotas_in_clear``, ``bytes_per_query`` and ``run``.
    """
    from collections import Counter

    from privaterec.data.mind import load_dataset
    from privaterec.eval.serving import private_user_encoder
    from privaterec.privacy.samplers import SimulationNoise
    from privaterec.recall.evaluate import (AUC_RECALL_SIZE, RECALL_KS, RECALL_METHODS,
                                            evaluate_recall)
    from privaterec.runs.ranking import (SERVING_RECORDS, evaluation_key, record_serving,
                                         serving_record_path)

    recall_method = next((m for m in RECALL_METHODS if m == method), None)
    if recall_method is None:
        raise ConfigError(f"invalid --recall method {method!r}; expected one of "
                          f"{', '.join(RECALL_METHODS)}")
    recall = load_recall_run(run_dir) if is_recall_run(run_dir) else None
    if recall is None and method in ("unifedrec", "no-bie"):
        raise ConfigError(f"--recall {method} needs a Uni-FedRec run: {run_dir} is a ranking "
                          f"run (train one with `privaterec train --method unifedrec --ranker "
                          f"{run_dir}`)")
    if interest_noise is not None:
        if recall is None or method != "unifedrec":
            raise ConfigError("--interest-noise applies to --recall unifedrec of a Uni-FedRec "
                              "run only")
        if not (isinstance(interest_noise, (int, float)) and 0 <= interest_noise < math.inf):
            raise ConfigError(f"invalid privacy parameter 'interest_noise' (lambda_I): got "
                              f"{interest_noise!r}, expected a finite number >= 0")
        recall.model.noise_scale = float(interest_noise)
    ranker_dir = recall.ranker if recall is not None else Path(run_dir)
    ranker_run = RunDirectory(ranker_dir)
    ranker_config = ranker_run.config()
    data_dir = data or (recall.config.data if recall is not None else ranker_config.data)
    if data is None or split == "train":  # the run's data, or its training split
        owner = recall.directory if recall is not None else ranker_run
        owner.check_data(data_dir, remedy=(
            "Evaluate other data with --data DIR --split test" if split == "test" else
            "--split train evaluates on the training data; evaluate other data with --data "
            "DIR --split test"))
    dataset = load_dataset(data_dir, drop_missing=drop_missing)
    target = dataset.test if split == "test" else dataset.train
    if target is None:
        raise ConfigError(f"{data_dir}: has no {split} split to evaluate recall on")
    ranker = load_ranker_news(ranker_dir, dataset.all_news(), progress=progress)
    dim = int(ranker.vectors.shape[-1])
    user_encoder = user_events = None
    if recall_method in QUERY_MODES:
        serving = serving or ServingConfig(kind=recall_method)
        if serving.kind != method:
            raise ConfigError(f"--recall {method} needs serving kind {method!r}, got "
                              f"{serving.kind!r}")
        user_encoder = private_user_encoder(
            ranker.model, ranker.features, serving,
            noise=SimulationNoise(torch.Generator().manual_seed(seed)))
        basis = ranker.model.basis
        event = serving_event(serving, basis_size=0 if basis is None else basis.size, dim=dim)
        user_events = [(event, 1)]
    result = evaluate_recall(
        target, ranker.features, ranker.vectors, method=recall_method,
        history_len=ranker.history_len, model=None if recall is None else recall.model,
        ks=ks or RECALL_KS, ranker=ranker.model,
        auc_recall_size=auc_recall_size or AUC_RECALL_SIZE, seed=seed,
        serve_noise=serve_noise, quota_noise_scale=quota_noise_scale, progress=progress,
        user_encoder=user_encoder, user_events=user_events)
    events = result.pop("events")  # user id → [(event, count)] of its query
    assert isinstance(events, dict)
    epsilons = [sum(e.epsilon * c for e, c in pairs if e.mechanism != "clear_quotas")
                for pairs in events.values()]
    channels = [sum(c for e, c in pairs if e.note.startswith(CHANNEL_NOTE))
                for pairs in events.values()]
    num_basis = (recall.model.num_basis if method == "unifedrec" and recall is not None
                 else (ranker.model.basis.size if ranker.model.basis is not None else 0))
    mean_channels = float(np.mean(channels)) if channels else 0.0
    if method == "no-bie":
        mean_channels = float(np.mean([sum(e.dimension for e, _ in pairs) / (dim or 1)
                                       for pairs in events.values()]))
    result.update(
        run=str(run_dir), split=split,
        query_epsilon_mean=float(np.mean(epsilons)) if epsilons else math.nan,
        query_epsilon_max=float(np.max(epsilons)) if epsilons else math.nan,
        quotas_in_clear=method == "unifedrec" and quota_noise_scale is None,
        channels_mean=mean_channels if method in ("unifedrec", "no-bie") else 1.0,
        bytes_per_query=query_bytes(method, channels=mean_channels, num_basis=num_basis,
                                    dim=dim))
    key = evaluation_key({"recall": method, "serving": serving, "seed": seed,
                          "serve_noise": serve_noise, "quota_noise_scale": quota_noise_scale,
                          "interest_noise": interest_noise}, data, split, drop_missing)
    if record and method == "unifedrec" and recall is not None:
        path = recall.directory.path / SERVING_RECORDS / f"unifedrec-recall-{key}.json"
        result["record"] = str(path)
        record_recall_queries(recall, events, record=path, description={
            "kind": "unifedrec-recall", "clip": recall.model.clip,
            "noise_scale": recall.model.noise_scale if serve_noise else 0.0,
            "channel_epsilon": channel_event(
                num_basis=recall.model.num_basis, clip=recall.config.model.clip,
                noise_scale=recall.model.noise_scale if serve_noise else 0.0).epsilon,
            "quota_noise_scale": quota_noise_scale, "queries": len(events),
            "note": "quotas sent in the clear (no guarantee)" if quota_noise_scale is None
            else "quotas noised"})
    elif record and method in QUERY_MODES and serving is not None:
        assert user_events is not None
        path = serving_record_path(ranker_run, serving, f"recall-{key}")
        result["record"] = str(path)
        record_serving(ranker_run, ranker_config, user_events[0][0],
                       Counter({user: 1 for user in events}), serving, path)
    return result


__all__ = ["RECALL_CONFIG_FILE", "RankerNews", "RecallModelConfig", "RecallRun",
           "RecallRunConfig", "RecallSetup", "load_ranker_news", "recall_setup",
           "evaluate_recall_run", "is_recall_run", "load_recall_run", "query_bytes",
           "recall_release", "record_recall_queries", "train_recall_run"]
