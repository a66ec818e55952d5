"""Shared machinery of the paper experiments (PrivateRec §4): runs, caches, aggregation, output.

* :class:`RunSpec` — one trained configuration of a table row or a curve point (method, ε_t,
  privacy mode, B; DP-FedAvg's target ε; r and T when not the defaults);
  :meth:`RunSpec.run_config` turns it into a :class:`RunConfig` for a model and a seed, with
  the round / epoch budget of :func:`training_budget`.
* The **run cache** is the directory layout ``OUT/runs/<model>/<row>/seed<k>`` (``runs-quick``
  with ``--quick``): a finished run there is reused instead of retrained, so Table 2 and the
  trade-off figures reuse Table 1's runs. :func:`ensure_run` trains or reuses;
  :func:`serve_run` evaluates a run under a private serving mechanism and caches the result
  inside the run directory (``RUN/serving/<key>.json``), so a repeated evaluation is neither
  recomputed nor recorded twice in the run's privacy ledger; :func:`cached_serving` reads
  that cache without computing.
* :func:`summarize` / :func:`format_summary` — mean ± sample standard deviation over seeds.
* :func:`markdown_table`, :func:`write_csv`, :func:`write_text` — the output files.
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from privaterec.config import (EMBEDDINGS, FEDERATED_METHODS, NEWS_ENCODERS, PRIVACY_MODES,
                               Embeddings, FedConfig, Method, ModelConfig, NewsEncoder,
                               PrivacyMode, RunConfig, TrainConfig)
from privaterec.config import fed_config as flat_fed_config
from privaterec.data.synth import write_synthetic
from privaterec.errors import ConfigError
from privaterec.files import write_atomic
from privaterec.eval.federated import METRICS
from privaterec.experiments.settings import DEMO_ROUNDS, demo_synth_config
from privaterec.fed.methods import PRIVATEREC_BASIS, resolve_run_config
from privaterec.method_settings import CLIP_SPACES, ClipSpace, settings_type
from privaterec.runs.directory import RunDirectory
from privaterec.ondevice.release import ServingConfig
from privaterec.validators import check_choice, fail

# Training budget of every experiment run: the ONE place to change it.
ROUNDS = DEMO_ROUNDS  # federated rounds (FedAdam at r = 2%)
QUICK_ROUNDS = 20
EPOCHS = 3  # centralized epochs
QUICK_EPOCHS = 1

METRIC_LABELS = {"auc": "AUC", "mrr": "MRR", "ndcg@5": "nDCG@5", "ndcg@10": "nDCG@10"}
MODEL_LABELS = {"nrms": "NRMS", "naml": "NAML", "plm": "PLM-NR (frozen MiniLM)",
                "fednewsrec": "FedNewsRec", "id": "ID"}
# Per-model settings of the experiment runs (the other models use the library defaults).
# PLM-NR keeps all six MiniLM-L6 layers frozen and trains e₀, the projection and the user
# encoder: per-client gradients of a fine-tuned top layer (D = 1.9 M) cost 7.5 s per
# DP-FedRec round and 13 s in strict mode, i.e. ~8 hours for Tables 1-2 over 3 seeds on 2
# cores, against 25 minutes frozen (BENCHMARKS.md). Its centralized Adam lr is 1e-3:
# at the default 5e-3 the training loss stalls higher (1.56 against 1.45 after one epoch).
MODEL_SETTINGS: dict[str, dict[str, Any]] = {"plm": {"plm_trainable_layers": 0}}
MODEL_LR: dict[str, float] = {"plm": 1e-3}
# A model of the experiments is a news encoder, optionally with other word vectors than the
# default: "<news encoder>+<embeddings>", e.g. "nrms+corpus" (its runs are cached apart).
VARIANT_SEPARATOR = "+"
WORDLESS_ENCODERS = ("plm", "id")  # news encoders without word vectors of their own choice
EMBEDDING_LABELS = {"corpus": "corpus word vectors", "glove50": "GloVe 50-d",
                    "minilm": "MiniLM word pieces", "random": "random word vectors"}
ExperimentMethod = Method
EXPERIMENT_METHODS: tuple[str, ...] = ("centralized", *FEDERATED_METHODS)
# Methods whose per-round budget is ε_t (their setting ``epsilon_train``); the others take none.
_EPSILON_TRAIN_METHODS = tuple(m for m in FEDERATED_METHODS
                               if "epsilon_train" in settings_type(m).field_names())
# How a DP-FedAvg row's label names its clipping (parameters: the default, unnamed).
CLIP_SPACE_LABELS = {"parameters": "", "news_vectors": ", clipped in news-vector space"}
SCALE = 100.0  # metrics are printed ×100, as in the paper's tables
TRAIN_EPSILON = 10.0  # ε_t of the private runs of Tables 1-2 and Figs. 4-7 (one run cache)
SERVE_PADDING = 0.5  # PrivateRec serving's padding probability p (Table 2, Fig. 4, central-dp)
DIGITS = 2


def training_budget(quick: bool) -> tuple[int, int]:
    """``(federated rounds, centralized epochs)`` of the experiment runs (read at call time)."""
    return (QUICK_ROUNDS, QUICK_EPOCHS) if quick else (ROUNDS, EPOCHS)


def format_epsilon(value: float, *, markdown: bool = True) -> str:
    """ε for tables and names: ``∞`` (``inf`` outside markdown) or the shortest ``%g`` form."""
    if math.isinf(value):
        return "∞" if markdown else "inf"
    return f"{value:g}"


@dataclass(frozen=True)
class RunSpec:
    """One trained configuration of the experiments (independent of model and seed).

    Attributes
    ----------
    method: ``centralized``, ``fedrec``, ``fednewsrec``, ``dp-fedrec``, ``privaterec`` or
        ``dp-fedavg`` (central, user-level DP).
    epsilon_train: ε_t per round (``inf``: no noise); ``dp-fedrec`` and ``privaterec`` only.
    privacy_mode: PrivateRec's ``paper`` or ``strict`` mode
        (docs/privacy.md#paper-and-strict-mode).
    basis_size: number of basic vectors B: PrivateRec's (0: the default, 5), or the PrivateRec
        model trained by ``dp-fedavg`` (0: no basic vectors).
    target_epsilon: ``dp-fedavg`` only (required): the user-level ε of the whole run, from
        which z is calibrated.
    client_fraction: the sampling rate r (q, Poisson, for ``dp-fedavg``) of a federated run;
        ``None``: the method's default.
    rounds: T of a federated run; ``None``: :func:`training_budget`'s.
    clip_space: ``dp-fedavg`` only: ``parameters`` (each client's gradient clipped, the
        default) or ``news_vectors`` (its user-side gradient and news-vector cotangents,
        :mod:`privaterec.fed.news_space`).
    """

    method: ExperimentMethod
    epsilon_train: float = math.inf
    privacy_mode: PrivacyMode = "paper"
    basis_size: int = 0
    target_epsilon: float | None = None
    client_fraction: float | None = None
    rounds: int | None = None
    clip_space: ClipSpace = "parameters"

    def __post_init__(self) -> None:
        check_choice(self.clip_space, "clip_space", CLIP_SPACES)
        if self.clip_space != "parameters" and self.method != "dp-fedavg":
            raise ConfigError(f"clip_space applies to dp-fedavg only, not {self.method}")
        if self.method not in EXPERIMENT_METHODS:
            raise ConfigError(f"invalid experiment method {self.method!r}; expected one of "
                              f"{', '.join(EXPERIMENT_METHODS)}")
        check_choice(self.privacy_mode, "privacy_mode", PRIVACY_MODES)
        if not self.epsilon_train > 0:
            fail("epsilon_train", self.epsilon_train, "> 0 (inf: no noise)", kind="")
        if self.method not in _EPSILON_TRAIN_METHODS and self.epsilon_train != math.inf:
            raise ConfigError(f"epsilon_train applies to {' and '.join(_EPSILON_TRAIN_METHODS)}"
                              f" only, not {self.method}")
        if self.privacy_mode != "paper" and self.method != "privaterec":
            raise ConfigError(f"privacy_mode applies to privaterec only, not {self.method}")
        if self.basis_size and self.method not in ("privaterec", "dp-fedavg"):
            raise ConfigError(f"basis_size applies to privaterec only (and to the PrivateRec "
                              f"model trained by dp-fedavg), not {self.method}")
        if (self.method == "dp-fedavg") != (self.target_epsilon is not None):
            raise ConfigError("target_epsilon is required by dp-fedavg and applies to it only "
                              f"(method {self.method}, target_epsilon {self.target_epsilon!r})")
        if self.target_epsilon is not None and not 0 < self.target_epsilon < math.inf:
            raise ConfigError(f"invalid 'target_epsilon': got {self.target_epsilon!r}, expected "
                              f"a finite number > 0 (FedRec is the ε = ∞ point)")
        if self.method == "centralized" and (self.client_fraction is not None
                                             or self.rounds is not None):
            raise ConfigError("client_fraction and rounds apply to federated methods only")
        if self.client_fraction is not None and not 0 < self.client_fraction <= 1:
            fail("client_fraction", self.client_fraction, "0 < r <= 1", kind="")
        if self.rounds is not None and (isinstance(self.rounds, bool)
                                        or not isinstance(self.rounds, int) or self.rounds < 1):
            fail("rounds", self.rounds, "an integer >= 1", kind="")

    @property
    def basis(self) -> int:
        """B actually used (0: a model without basic vectors)."""
        if self.method == "privaterec":
            return self.basis_size or PRIVATEREC_BASIS
        return self.basis_size if self.method == "dp-fedavg" else 0

    @property
    def slug(self) -> str:
        """Directory name of the row: ``centralized``, ``fedrec``, ``dp-fedrec_eps-10``,
        ``privaterec_eps-10_paper_B5``, ``dp-fedavg_eps-8`` (``_B5`` for the PrivateRec
        model), with ``_q-<r>`` / ``_T-<rounds>`` when they are not the defaults."""
        eps = format_epsilon(self.epsilon_train, markdown=False)
        base: str
        if self.method in ("centralized", "fedrec", "fednewsrec"):
            base = self.method
        elif self.method == "dp-fedrec":
            base = f"dp-fedrec_eps-{eps}"
        elif self.method == "privaterec":
            base = f"privaterec_eps-{eps}_{self.privacy_mode}_B{self.basis}"
        else:
            assert self.target_epsilon is not None
            base = f"dp-fedavg_eps-{self.target_epsilon:g}" + (
                f"_B{self.basis}" if self.basis else "") + (
                "_news-space" if self.clip_space == "news_vectors" else "")
        if self.client_fraction is not None:
            base += f"_q-{self.client_fraction:g}"
        if self.rounds is not None:
            base += f"_T-{self.rounds}"
        return base

    @property
    def label(self) -> str:
        """Human-readable name for tables and legends."""
        if self.method == "centralized":
            return "Centralized"
        if self.method in ("fedrec", "fednewsrec"):
            return settings_type(self.method).title
        if self.method == "dp-fedrec":
            return "DP-FedRec" if self.epsilon_train < math.inf else "DP-FedRec (= FedRec)"
        if self.method == "dp-fedavg":
            return ("DP-FedAvg (central)" if not self.basis else
                    f"PrivateRec model (B = {self.basis}) by DP-FedAvg"
                    ) + CLIP_SPACE_LABELS[self.clip_space]
        return f"PrivateRec ({self.privacy_mode} mode)"

    def run_config(self, *, data: str, model: str, seed: int, quick: bool) -> RunConfig:
        """The :class:`RunConfig` of this row for ``model`` and ``seed``."""
        rounds, epochs = training_budget(quick)
        encoder, embeddings = parse_model(model)
        model_config = ModelConfig(news_encoder=encoder, basis_size=self.basis,
                                   **MODEL_SETTINGS.get(encoder, {}))
        if embeddings is not None:
            model_config = replace(model_config, embeddings=embeddings)
        if self.method == "centralized":
            train = TrainConfig(method="centralized", epochs=epochs, seed=seed,
                                lr=MODEL_LR.get(encoder, TrainConfig.lr))
            return RunConfig(data=data, model=model_config, train=train)
        return RunConfig(data=data, model=model_config,
                         train=TrainConfig(method=self.method, seed=seed),
                         fed=self.fed_config(rounds=self.rounds or rounds))

    def fed_config(self, *, rounds: int) -> FedConfig:
        """The federated settings of this row: the ONE place that maps a row's knobs to
        configuration fields (T, r, and each method's own privacy parameter)."""
        settings: dict[str, Any] = {"rounds": rounds}
        if self.client_fraction is not None:
            settings["client_fraction"] = self.client_fraction
        if self.method in _EPSILON_TRAIN_METHODS:
            settings["epsilon_train"] = self.epsilon_train
        if self.method == "privaterec":
            settings["privacy_mode"] = self.privacy_mode
        if self.method == "dp-fedavg":
            settings["target_epsilon"] = self.target_epsilon
            if self.clip_space != "parameters":
                settings["clip_space"] = self.clip_space
        return flat_fed_config(self.method, **settings)


def run_dir(out: Path, model: str, spec: RunSpec, seed: int, *, quick: bool) -> Path:
    """Run-cache location ``out/runs[-quick]/<model>/<row slug>/seed<k>``."""
    return Path(out) / ("runs-quick" if quick else "runs") / model / spec.slug / f"seed{seed}"


def log(message: str, *, progress: bool) -> None:
    """One progress line on stderr (when ``progress``)."""
    if progress:
        print(message, file=sys.stderr, flush=True)


def resolve_data(out: Path, data: str | None, *, quick: bool, progress: bool) -> str:
    """The absolute data directory of the experiments.

    ``data`` given: that MIND-format directory (must hold ``train/`` and ``test/``).
    ``None``: the demo's embedded synthetic data set, synthesised once into
    ``out/data/synth-quick`` or ``out/data/synth-default``.

    Raises
    ------
    ConfigError
        If ``data`` has no ``test/behaviors.tsv`` (the experiments report test metrics).
    """
    if data is not None:
        path = Path(data).resolve()
        if not (path / "test" / "behaviors.tsv").exists():
            raise ConfigError(f"{path}: the experiments need a test split; expected "
                              f"{path / 'test' / 'behaviors.tsv'} (make one with "
                              f"'privaterec data synth' or 'privaterec data convert')")
        return str(path)
    path = (Path(out) / "data" / ("synth-quick" if quick else "synth-default")).resolve()
    if not (path / "test" / "behaviors.tsv").exists():
        log(f"synthesising data into {path} ...", progress=progress)
        write_synthetic(path, demo_synth_config(quick))
    return str(path)


def finished_metrics(path: Path, config: RunConfig) -> dict[str, Any] | None:
    """The metrics of a finished run of ``config`` in ``path``, or ``None``.

    Finished: ``config.yaml`` equals the resolved ``config``, ``metrics.json`` holds test
    metrics (written only after training ended) and the checkpoint exists.
    """
    run = RunDirectory(path)
    if not (run.config_path.exists() and run.checkpoint_path.exists()):
        return None
    if run.config() != resolve_run_config(config):
        return None
    metrics = run.read_metrics()
    return metrics if "test" in metrics else None


def ensure_run(path: Path, config: RunConfig, *, progress: bool) -> dict[str, Any]:
    """Train ``config`` into ``path`` unless a finished run is already there; its metrics.

    A different configuration in ``path`` raises :class:`~privaterec.errors.CheckpointError`
    (from :func:`~privaterec.runs.ranking.train_run`), an unfinished one resumes.
    """
    cached = finished_metrics(path, config)
    if cached is not None:
        return cached
    from privaterec.runs.ranking import train_run
    return train_run(config, path, progress=progress)


def serving_key(serving: ServingConfig) -> str:
    """File name (without ``.json``) of a serving evaluation in the run's serving cache."""
    return (f"{serving.kind}_eps-{format_epsilon(serving.epsilon, markdown=False)}"
            f"_delta-{serving.delta:g}_p-{serving.effective_padding:g}_{serving.mechanism}"
            f"_{serving.sensitivity_mode}_clip-{serving.vdp_clip:g}_seed-{serving.seed}")


def checkpoint_stamp(path: Path) -> list[int]:
    """(mtime ns, size) of a run's ``checkpoint.pt``: cached evaluations are keyed on it."""
    stat = RunDirectory(path).checkpoint_path.stat()
    return [stat.st_mtime_ns, stat.st_size]


def cached_serving(path: Path, serving: ServingConfig) -> dict[str, Any] | None:
    """The cached result of :func:`serve_run` for ``serving`` on the run's current
    checkpoint, or ``None`` (nothing is computed)."""
    cache = Path(path) / "serving" / f"{serving_key(serving)}.json"
    if not (cache.exists() and RunDirectory(path).checkpoint_path.exists()):
        return None
    entry = json.loads(cache.read_text())
    return entry["result"] if entry.get("checkpoint") == checkpoint_stamp(path) else None


def serve_run(path: Path, serving: ServingConfig, *, progress: bool) -> dict[str, Any]:
    """Test metrics of the run in ``path`` under private serving ``serving`` (cached).

    Calls :func:`~privaterec.runs.ranking.evaluate_run` (which records the simulated
    queries' releases in ``RUN/serving-evaluations/``) unless ``RUN/serving/<key>.json`` holds the result
    of the same evaluation of the same checkpoint.
    """
    cached = cached_serving(path, serving)
    if cached is not None:
        return cached
    cache = Path(path) / "serving" / f"{serving_key(serving)}.json"
    stamp = checkpoint_stamp(path)
    from privaterec.runs.ranking import evaluate_run
    result = evaluate_run(path, progress=progress, serving=serving)
    write_atomic(cache, json.dumps({"checkpoint": stamp, "serving": asdict(serving),
                                    "result": result}, indent=2, default=str))
    return result


@dataclass(frozen=True)
class Summary:
    """Mean and sample standard deviation (ddof = 1) of one number over seeds.

    ``std`` is ``None`` when only one value exists (n = 1).
    """

    mean: float
    std: float | None
    n: int
    values: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "std": self.std, "n": self.n, "values": list(self.values)}


def summarize(values: Iterable[float]) -> Summary:
    """Mean ± sample std (ddof = 1 for n ≥ 2; no std for n = 1) of ``values``.

    Raises
    ------
    ValueError
        If ``values`` is empty.
    """
    data = np.asarray([float(v) for v in values], dtype=np.float64)
    if data.size == 0:
        raise ValueError("summarize needs at least one value")
    std = float(np.std(data, ddof=1)) if data.size >= 2 else None
    return Summary(float(np.mean(data)), std, int(data.size), tuple(float(v) for v in data))


def format_summary(summary: Summary, *, scale: float = SCALE, digits: int = DIGITS) -> str:
    """``"61.37 ± 0.22"`` (values × ``scale``), or ``"61.37"`` when n = 1."""
    mean = f"{summary.mean * scale:.{digits}f}"
    if summary.std is None:
        return mean
    return f"{mean} ± {summary.std * scale:.{digits}f}"


def summarize_metrics(results: Sequence[Mapping[str, Any]],
                      metrics: Sequence[str] = METRICS) -> dict[str, Summary]:
    """Per-metric :class:`Summary` over several runs' metric dicts (one per seed)."""
    return {name: summarize(r[name] for r in results) for name in metrics}


def metric_columns(summaries: Mapping[str, Summary],
                   metrics: Sequence[str] = METRICS) -> dict[str, Any]:
    """CSV columns ``<metric>_mean`` / ``<metric>_std`` (raw values, std empty for n = 1)."""
    row: dict[str, Any] = {}
    for name in metrics:
        row[f"{name}_mean"] = summaries[name].mean
        row[f"{name}_std"] = summaries[name].std
    return row


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table (``|`` in cells escaped).

    Raises
    ------
    ValueError
        If a row does not have one cell per header.
    """
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row {list(row)!r} has {len(row)} cells, expected "
                             f"{len(headers)}")
    lines = ["| " + " | ".join(_cell(h) for h in headers) + " |",
             "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "inf" if value == math.inf else ("-inf" if value == -math.inf else repr(value))
    if isinstance(value, (list, tuple)):
        return " ".join(_csv_value(v) for v in value)
    return str(value)


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> Path:
    """Write ``rows`` to ``path`` as CSV with header ``columns``.

    Floats are written exactly (``repr``), ``inf`` as ``inf``, ``None`` as an empty cell,
    sequences space-separated.

    Raises
    ------
    ValueError
        If a row has a key that is not in ``columns``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for row in rows:
            extra = sorted(set(row) - set(columns))
            if extra:
                raise ValueError(f"{path}: row has columns {extra} not in the header")
            writer.writerow([_csv_value(row.get(c)) for c in columns])
    return path


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` (with a final newline) to ``path``, creating parent directories."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")
    return path


def run_metrics(out: Path, data: str, model: str, spec: RunSpec, seed: int, *, quick: bool,
                progress: bool, serving: ServingConfig | None = None) -> dict[str, Any]:
    """Test metrics of ``spec`` / ``model`` / ``seed``: trained (or reused) and evaluated.

    ``serving`` ``None``: the training run's own test metrics (ε_s = ∞). Otherwise the run
    is evaluated under ``serving`` with its ``seed`` replaced by the run's seed, and the
    result (with its ``serving`` block) is returned.
    """
    path = run_dir(out, model, spec, seed, quick=quick)
    config = spec.run_config(data=data, model=model, seed=seed, quick=quick)
    watch = Stopwatch()
    cached = finished_metrics(path, config) is not None
    log(f"  {'reusing' if cached else 'training'} {path}", progress=progress)
    metrics = ensure_run(path, config, progress=progress)
    if serving is None:
        result = dict(metrics["test"])
    else:
        serving = replace(serving, seed=seed)
        log(f"  serving {serving_key(serving)}", progress=progress)
        result = serve_run(path, serving, progress=progress)
    log(f"  done in {watch}: AUC {result['auc']:.4f}", progress=progress)
    return result


def over_seeds(out: Path, data: str, model: str, spec: RunSpec, seeds: Sequence[int], *,
               quick: bool, progress: bool, serving: ServingConfig | None = None
               ) -> tuple[list[dict[str, Any]], dict[str, Summary]]:
    """:func:`run_metrics` for every seed; the per-seed results and their summaries."""
    results = [run_metrics(out, data, model, spec, seed, quick=quick, progress=progress,
                           serving=serving) for seed in seeds]
    return results, summarize_metrics(results)


def check_seeds(seeds: Sequence[int]) -> tuple[int, ...]:
    """Validated seeds: a non-empty sequence of distinct integers >= 0.

    Raises
    ------
    ConfigError
        Naming the parameter ``seeds``.
    """
    values = tuple(seeds)
    if not values or any(isinstance(s, bool) or not isinstance(s, (int, np.integer))
                         or s < 0 for s in values) or len(set(values)) != len(values):
        fail("seeds", list(values), "one or more distinct integers >= 0", kind="")
    return tuple(int(s) for s in values)


def parse_model(model: str) -> tuple[NewsEncoder, Embeddings | None]:
    """The news encoder and word vectors of an experiment model name: ``"nrms"`` →
    ``("nrms", None)`` (the default vectors), ``"nrms+corpus"`` → ``("nrms", "corpus")``.

    Raises
    ------
    ConfigError
        Naming the part that is not a news encoder or an embedding kind.
    """
    encoder, separator, embeddings = model.partition(VARIANT_SEPARATOR)
    checked = check_choice(encoder, "news_encoder", NEWS_ENCODERS)
    if not separator:
        return checked, None
    if checked in WORDLESS_ENCODERS:
        raise ConfigError(f"invalid model {model!r}: the {checked} news encoder does not use "
                          f"word vectors")
    vectors = check_choice(embeddings, "embeddings", EMBEDDINGS)
    if vectors == ModelConfig.embeddings:
        raise ConfigError(f"invalid model {model!r}: {vectors} word vectors are the default; "
                          f"name the model {checked!r}")
    return checked, vectors


def model_label(model: str) -> str:
    """Human-readable name of an experiment model, e.g. ``NRMS + corpus word vectors``."""
    encoder, embeddings = parse_model(model)
    label = MODEL_LABELS.get(encoder, encoder)
    return label if embeddings is None else f"{label} + {EMBEDDING_LABELS[embeddings]}"


def check_models(models: Sequence[str]) -> tuple[str, ...]:
    """Validated model names, non-empty and distinct: news encoders, optionally
    ``<news encoder>+<embeddings>`` (:func:`parse_model`).

    Raises
    ------
    ConfigError
        Naming the parameter ``models``.
    """
    values = tuple(models)
    bad = []
    for m in values:
        try:
            parse_model(m)
        except ConfigError:
            bad.append(m)
    if not values or bad or len(set(values)) != len(values):
        raise ConfigError(f"invalid 'models': got {list(values)!r}, expected one or more "
                          f"distinct news encoders among {', '.join(NEWS_ENCODERS)}, each "
                          f"optionally with '+<word vectors>' ({', '.join(EMBEDDINGS)}), "
                          f"e.g. nrms+corpus")
    return values


class Stopwatch:
    """Elapsed seconds since construction (for progress lines)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __str__(self) -> str:
        return f"{time.perf_counter() - self.start:.0f}s"


__all__ = ["CLIP_SPACE_LABELS", "DIGITS", "EPOCHS", "EXPERIMENT_METHODS", "ExperimentMethod",
           "METRICS", "METRIC_LABELS", "MODEL_LABELS", "QUICK_EPOCHS", "QUICK_ROUNDS", "ROUNDS",
           "RunSpec", "SCALE", "SERVE_PADDING", "Stopwatch", "Summary", "TRAIN_EPSILON",
           "cached_serving", "check_models", "check_seeds", "ensure_run", "finished_metrics",
           "format_epsilon", "format_summary", "log", "markdown_table", "metric_columns", "model_label", "over_seeds", "parse_model",
           "resolve_data", "run_dir", "run_metrics", "serve_run", "serving_key", "summarize",
           "summarize_metrics", "training_budget", "write_csv", "write_text"]
