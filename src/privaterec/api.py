"""The Python API: train a private news recommender, report its privacy, evaluate, serve it.

Everything here is a thin front to the functions the command line runs
(:mod:`privaterec.runs`, :mod:`privaterec.privacy.report`, :mod:`privaterec.serving`), so a
run trained here is the same directory, with the same files, as one of ``privaterec train``:

>>> import privaterec
>>> run = privaterec.train("my-data", out="runs/dp", method="dp-fedavg",
...                        target_epsilon=1.0, rounds=20)            # doctest: +SKIP
>>> print(privaterec.privacy_report(run))                            # doctest: +SKIP

Privacy is one argument, as when Opacus makes a training loop private in one call: the
``method`` and its keyword settings choose the mechanism and the budget, and ε becomes noise
inside the library, once (docs/architecture.md#where-ε-becomes-noise). ``dp-fedavg`` wraps
the plain federated update in central, user-level DP, as Flower's DP strategy wrappers do
(docs/privacy.md#central-dp-dp-fedavg).

This module imports nothing heavy at import time: ``import privaterec`` stays fast, and the
command line's ``--help`` does not load torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from privaterec.errors import ConfigError

if TYPE_CHECKING:
    from privaterec.config import RunConfig
    from privaterec.privacy.ledger import Composition
    from privaterec.serving.server import Service

PathLike = str | Path


@dataclass(frozen=True)
class Run:
    """A trained run directory (``config.yaml``, ``checkpoint.pt``, ``metrics.json``,
    ``privacy.json``); usable wherever a path is expected (``os.PathLike``).

    Attributes
    ----------
    path: the run directory.
    """

    path: Path

    def __fspath__(self) -> str:
        return str(self.path)

    @property
    def config(self) -> RunConfig:
        """The run's configuration, every value used stated (``config.yaml``)."""
        from privaterec.runs.directory import RunDirectory

        return RunDirectory(self.path).config()

    @property
    def metrics(self) -> dict[str, Any]:
        """``metrics.json``: the training log and, when the data has a test split, ``test``
        (AUC, MRR, nDCG@5, nDCG@10 over the test impressions)."""
        data: dict[str, Any] = json.loads((self.path / "metrics.json").read_text())
        return data


@dataclass(frozen=True)
class PrivacyReport:
    """What a run's releases cost, composed per user (``RUN/privacy.json``).

    ``str(report)`` is the text ``privaterec privacy report`` prints.

    Attributes
    ----------
    summary: the composed ``privacy.json`` (its ``release``, ``report``, ``checks``, ...).
    """

    summary: Mapping[str, Any]

    @property
    def delta(self) -> float:
        """The δ at which every ε of the report is stated."""
        return float(self.summary["report"]["delta"])

    @property
    def epsilon(self) -> float:
        """The largest total ε of one user at :attr:`delta`, training and serving composed,
        at user-level adjacency (one user's whole data replaced)."""
        return float(self.summary["report"]["phases_user"]["total"]["epsilon_max"])

    def __str__(self) -> str:
        from privaterec.privacy.report import format_privacy_report

        return format_privacy_report(self.summary)


def _path(value: PathLike | Run) -> Path:
    return value.path if isinstance(value, Run) else Path(value)


def synthesize(out: PathLike, *, users: int = 2000, news: int = 3000, seed: int = 0) -> Path:
    """Write a synthetic MIND-format data set (``out/train``, ``out/test``; docs/data.md).

    Parameters
    ----------
    out: the directory to write.
    users, news: the population and the news catalogue.
    seed: same seed, byte-identical files.

    Returns
    -------
    Path
        ``out``.
    """
    from privaterec.data.synth import SynthConfig, write_synthetic

    write_synthetic(out, SynthConfig(users=users, news=news, seed=seed))
    return Path(out)


def run_config(data: PathLike, *, method: str = "dp-fedavg",
               **settings: Any) -> RunConfig:
    """The configuration :func:`train` runs, without running it.

    ``settings`` are configuration keys, named as in ``config.yaml`` (and as the flags of
    ``privaterec train`` without ``--``): a field of the model (``news_encoder``, or
    ``model`` for short; ``basis_size``, ...), of training (``seed``, ``epochs``, ...), of the
    federated engine (``rounds``, ``client_fraction``, ``strategy``, ...) or of the method's
    own settings (:mod:`privaterec.method_settings`, e.g. dp-fedavg's ``target_epsilon``,
    ``clip``, ``target_delta``). A key that applies to none of them is refused, naming the
    method's keys.

    Raises
    ------
    ConfigError
        An unknown key, an invalid value, or a method's missing privacy parameter.
    """
    from privaterec.config import (FEDERATED_METHODS, FedConfig, ModelConfig, RunConfig,
                                   TrainConfig, fed_with_changes)

    if method == "unifedrec":
        raise ConfigError("method 'unifedrec' trains a recall model on top of a ranking run: "
                          "use `privaterec train --method unifedrec --ranker RUN` "
                          "(docs/unifedrec.md)")
    changes = dict(settings)
    if "model" in changes:
        changes["news_encoder"] = changes.pop("model")
    model_keys = {f.name for f in dataclasses.fields(ModelConfig)}
    train_keys = {f.name for f in dataclasses.fields(TrainConfig)}
    model = {k: changes.pop(k) for k in list(changes) if k in model_keys}
    train = {k: changes.pop(k) for k in list(changes) if k in train_keys}
    if changes and method not in FEDERATED_METHODS:
        raise ConfigError(f"{', '.join(sorted(changes))}: only federated methods "
                          f"({', '.join(FEDERATED_METHODS)}) take them, not {method!r}")
    fed = (fed_with_changes(FedConfig(), method, changes)
           if method in FEDERATED_METHODS else FedConfig())
    return RunConfig(data=str(Path(data).resolve()), model=ModelConfig(**model),
                     train=TrainConfig(**{**train, "method": method}), fed=fed)


def train(data: PathLike, *, out: PathLike, method: str = "dp-fedavg", progress: bool = False,
          drop_missing: bool = False, **settings: Any) -> Run:
    """Train a news recommender on MIND-format ``data`` into the run directory ``out``.

    Parameters
    ----------
    data: a MIND-format directory (``train/`` and, for test metrics, ``test/``;
        docs/data.md).
    out: the run directory (resumed if it holds the same run).
    method: ``dp-fedavg`` (central, user-level DP at ``target_epsilon``), ``privaterec``,
        ``dp-fedrec``, ``fednewsrec`` (local DP), ``fedrec`` (federated, no DP),
        ``centralized`` or ``popularity`` (no DP): README.md, "Methods".
    progress: progress lines on stderr.
    drop_missing: drop references to news absent from ``news.tsv`` instead of refusing.
    settings: configuration keys (:func:`run_config`), e.g. ``target_epsilon=1.0,
        rounds=20``.

    Returns
    -------
    Run
        The trained run; ``run.metrics["test"]`` holds the test metrics.
    """
    from privaterec.runs.ranking import train_run

    config = run_config(data, method=method, **settings)
    train_run(config, out, drop_missing=drop_missing, progress=progress)
    return Run(Path(out))


def evaluate(run: PathLike | Run, *, data: PathLike | None = None, split: str = "test",
             serving: str = "none", epsilon: float = math.inf, delta: float = 0.0,
             padding_p: float = 0.5, seed: int = 0, progress: bool = False) -> dict[str, Any]:
    """Test metrics of a run, optionally through private serving.

    Parameters
    ----------
    run: a run directory.
    data: the data to evaluate on (default: the run's training data set).
    split: ``test`` or ``train``.
    serving: ``none`` (the model's own user vectors), ``privaterec`` (each query a device's
        DPA release at ``epsilon``, PrivateRec Alg. 1-2), ``vdp`` (a noised user vector,
        PrivateRec §3.2.1) or ``local`` (the device ranks the downloaded pool itself and
        sends nothing: ε_s = 0; docs/serving.md#three-ways-to-serve).
    epsilon, delta, padding_p: one query's ε_s, δ_s and PrivateRec's padding probability.
    seed: the simulated devices' randomness (a simulation: seeded noise).
    progress: progress lines on stderr.

    Returns
    -------
    dict
        ``auc``, ``mrr``, ``ndcg@5``, ``ndcg@10``, ... and with ``serving`` a ``serving``
        block; the queries' releases are recorded in the run's ``privacy.json``.
    """
    from privaterec.ondevice.release import ServingConfig
    from privaterec.runs.ranking import evaluate_run

    config = None
    if serving != "none":
        config = ServingConfig(kind=serving, epsilon=epsilon, delta=delta,
                               padding_p=padding_p, seed=seed)
    return evaluate_run(_path(run), data, split=split, progress=progress, serving=config)


def privacy_report(run: PathLike | Run, *, delta: float | None = None,
                   composition: Composition | None = None) -> PrivacyReport:
    """The run's privacy report: every release composed per user (docs/privacy.md).

    Parameters
    ----------
    run: a run directory.
    delta: the target δ (default: the run's ``report_delta``).
    composition: ``pld`` (default), ``rdp`` or ``basic``.
    """
    from privaterec.privacy.report import read_privacy_json, recompose_privacy_summary

    summary = read_privacy_json(_path(run))
    return PrivacyReport(recompose_privacy_summary(summary, delta=delta,
                                                   composition=composition))


@contextmanager
def service(run: PathLike | Run, *, news: PathLike | None = None,
            store: PathLike | None = None, write_token: str | None = None) -> Iterator[Service]:
    """The serving API of ``run`` in this process, for tests and for embedding.

    Yields a :class:`privaterec.serving.server.Service`: ``service.app`` is the FastAPI
    application (run it with uvicorn, or call it through ``fastapi.testclient.TestClient``,
    which the device SDK accepts as ``transport``); the store is closed on exit. Needs the
    ``serve`` extra. ``privaterec serve`` runs the same service over HTTP (docs/serving.md).

    Parameters
    ----------
    run: a ranking run (or a Uni-FedRec run) directory.
    news: a ``news.tsv`` or a MIND directory whose articles the pool lacks.
    store: the news store directory (default ``RUN/serving-store``).
    write_token: the bearer token ``POST /v1/news`` needs (``None``: writes are refused).
    """
    from privaterec.serving.server import build_service

    built = build_service(_path(run), news, store_path=store, write_token=write_token)
    try:
        yield built
    finally:
        built.close()


def serve(run: PathLike | Run, *, news: PathLike | None = None, host: str = "127.0.0.1",
          port: int = 8000, write_token_file: PathLike | None = None,
          no_ingest: bool = False) -> None:
    """Serve ``run`` over HTTP until interrupted, as ``privaterec serve`` does.

    Parameters
    ----------
    run: a ranking run (or a Uni-FedRec run) directory.
    news: a ``news.tsv`` or a MIND directory whose articles the pool lacks.
    host, port: where to listen (default: loopback only).
    write_token_file, no_ingest: the write API's token (a file readable by its owner only;
        else ``$PRIVATEREC_WRITE_TOKEN``), or no write API at all; one is required
        (docs/serving.md).
    """
    from privaterec.serving.server import serve as serve_http

    serve_http(_path(run), news, host=host, port=port, write_token_file=write_token_file,
               no_ingest=no_ingest)


__all__ = ["PrivacyReport", "Run", "evaluate", "privacy_report", "run_config", "serve",
           "service", "synthesize", "train"]
