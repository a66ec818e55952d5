"""Central against local DP at population scale (issue 15, item 4): ``experiment central-dp``.

Test AUC against the **user-level ε of the whole training run** (one user's data replaced;
δ stated), per model and population size:

* **central rows** — DP-FedAvg (``dp-fedavg``: Poisson sampling at rate q, each update clipped
  to L2 norm C, Gaussian noise once on the sum) with z calibrated by ``--target-epsilon E``
  for every E in ``epsilons`` (under the ledger's replacement adjacency), and FedRec as the
  ε = ∞ point;
* **local-DP rows** (at the ``ldp_users`` sizes) — DP-FedRec at ε_t = 10 per round, FedNewsRec
  (paper defaults), PrivateRec paper and strict mode at ε_t = 10; their per-user total is
  composed over the rounds each user took part in;
* **PrivateRec central-trained** (at the ``ldp_users`` sizes) — the PrivateRec model (B = 5)
  trained by DP-FedAvg at the largest finite ε, served by local ranking (ε_s = 0) and by DPA
  at ε_s ∈ {1, 10} per query (padding p = 0.5).

Every ε in the table is read from the run's ledger (``RUN/privacy.json``): the largest and
the median per-user total of the training phase at user-level adjacency. A guarantee that
does not hold, or holds for one click only, is printed as ∞ with the reason.

Each population size has its own synthetic data set (the embedded default
:class:`~privaterec.data.synth.SynthConfig` with ``users`` changed: same click model, same
news count), synthesised once under ``OUT/data``; the default size shares the data and the
run cache of ``experiment table1`` (``OUT/runs``), the others cache their runs under
``OUT/users-<N>/runs``. A rerun reuses every finished run and serving evaluation; with
``report_only`` nothing is trained or evaluated and the table shows what has finished.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

from privaterec.config import PrivacyMode, RunConfig, replace
from privaterec.data.synth import SynthConfig, write_synthetic
from privaterec.errors import ConfigError
from privaterec.experiments.common import (METRICS, MODEL_LABELS, SCALE, ExperimentMethod,
                                           RunSpec, Stopwatch, Summary, cached_serving,
                                           check_models, check_seeds, ensure_run,
                                           finished_metrics, format_epsilon, format_summary,
                                           log, markdown_table, metric_columns, resolve_data,
                                           run_dir, serve_run, serving_key,
                                           summarize_metrics, training_budget, write_csv,
                                           write_text)
from privaterec.experiments.plots import new_figure, save_png, set_log_x
from privaterec.experiments.settings import demo_synth_config
from privaterec.fed.methods import resolve_run_config
from privaterec.privacy.report import read_privacy_json
from privaterec.runs.directory import RunDirectory
from privaterec.serving.release import ServingConfig

INF = math.inf
NAME = "central_dp"  # output files: central_dp.md, .csv, _runs.csv, .png
EPSILONS = (1.0, 2.0, 4.0, 8.0, INF)  # user-level ε of the whole run (∞: FedRec)
QUICK_EPSILONS = (1.0, 8.0, INF)
USERS = (2000, 20000, 50000)
MODELS = ("nrms", "naml")
QUICK_MODELS = ("nrms",)
LDP_EPSILON = 10.0  # ε_t per round of the local-DP rows
SERVE_EPSILONS = (1.0, 10.0)  # DPA serving of the PrivateRec central-trained model
SERVE_PADDING = 0.5
PRIVATEREC_BASIS = 5
CLIENT_FRACTION = 0.02  # the federated methods' default r (q for dp-fedavg)

Group = Literal["central", "ldp", "privaterec"]


# --- what is run -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    """One table row: a trained configuration (:class:`RunSpec`), optionally served.

    ``group``: ``central`` (FedRec and DP-FedAvg: the curve), ``ldp`` (local DP) or
    ``privaterec`` (the PrivateRec model trained by DP-FedAvg, served).
    """

    group: Group
    spec: RunSpec
    serving: ServingConfig | None = None

    @property
    def key(self) -> str:
        """Unique name of the row: the run's slug, plus the serving mechanism."""
        if self.serving is None:
            return self.spec.slug
        if self.serving.kind == "local":
            return f"{self.spec.slug}+local"
        return f"{self.spec.slug}+dpa-{format_epsilon(self.serving.epsilon, markdown=False)}"

    @property
    def label(self) -> str:
        spec = self.spec
        if spec.method == "fedrec":
            return "FedRec (no privacy)"
        if spec.method == "dp-fedavg" and self.group == "central":
            return "DP-FedAvg (central)"
        if self.group == "ldp":
            return f"{spec.label} (local DP)"
        assert self.serving is not None
        served = ("local ranking" if self.serving.kind == "local"
                  else f"DPA serving (p = {self.serving.padding_p:g})")
        return f"PrivateRec (B = {spec.basis}) by DP-FedAvg + {served}"

    @property
    def epsilon_serve(self) -> float | None:
        """ε_s per query (0: local ranking sends nothing); ``None``: not served."""
        if self.serving is None:
            return None
        return 0.0 if self.serving.kind == "local" else self.serving.epsilon


def plan_rows(epsilons: Sequence[float], *, ldp: bool, client_fraction: float | None = None,
              rounds: int | None = None) -> list[Row]:
    """The rows of one population: FedRec and DP-FedAvg at every finite ε of ``epsilons``;
    with ``ldp`` also the local-DP rows and the PrivateRec central-trained rows (trained at
    the largest finite ε, none if there is no finite ε)."""
    def spec(method: ExperimentMethod, epsilon_train: float = INF,
             privacy_mode: PrivacyMode = "paper", **more: Any) -> RunSpec:
        return RunSpec(method, epsilon_train, privacy_mode, client_fraction=client_fraction,
                       rounds=rounds, **more)

    finite = sorted(e for e in epsilons if math.isfinite(e))
    rows = [Row("central", spec("dp-fedavg", target_epsilon=e)) for e in finite]
    if any(math.isinf(e) for e in epsilons):
        rows.append(Row("central", spec("fedrec")))
    if not ldp:
        return rows
    rows += [Row("ldp", spec("dp-fedrec", LDP_EPSILON)), Row("ldp", spec("fednewsrec")),
             Row("ldp", spec("privaterec", LDP_EPSILON, "paper")),
             Row("ldp", spec("privaterec", LDP_EPSILON, "strict"))]
    if finite:
        model = spec("dp-fedavg", basis_size=PRIVATEREC_BASIS, target_epsilon=finite[-1])
        rows.append(Row("privaterec", model, ServingConfig(kind="local")))
        rows += [Row("privaterec", model, ServingConfig(kind="privaterec", epsilon=e,
                                                        padding_p=SERVE_PADDING))
                 for e in SERVE_EPSILONS]
    return rows


@dataclass(frozen=True)
class Population:
    """One population size: its data set and run cache root.

    ``users``: the synthetic data's ``users`` (``None``: a ``--data`` directory).
    """

    users: int | None
    data: str
    root: Path
    ldp: bool
    synth: SynthConfig | None = None

    @property
    def label(self) -> str:
        return f"{self.users:,}" if self.users is not None else Path(self.data).name


def population_config(users: int, *, quick: bool) -> SynthConfig:
    """The synthetic data set of a population: the embedded default (``quick``: the small
    one) with ``users`` changed, so the click model and the news count are the same."""
    return dataclasses.replace(demo_synth_config(quick), users=users)


def population_paths(out: Path, users: int, *, quick: bool) -> tuple[Path, Path]:
    """``(data directory, run cache root)`` of a population.

    The default size uses ``OUT/data/synth-default`` (``synth-quick``) and ``OUT`` — the data
    and runs of ``experiment table1``; another size ``OUT/data/synth[-quick]-<users>`` and
    ``OUT/users-<users>``.
    """
    out = Path(out)
    prefix = "synth-quick" if quick else "synth"
    if population_config(users, quick=quick) == demo_synth_config(quick):
        return (out / "data" / ("synth-quick" if quick else "synth-default")).resolve(), out
    return (out / "data" / f"{prefix}-{users}").resolve(), out / f"users-{users}"


def synthesize(path: Path, config: SynthConfig, *, progress: bool) -> None:
    """Write ``config``'s data set to ``path`` unless it is there (written to a sibling
    directory first and renamed, so an interrupted synthesis is never taken for data)."""
    if (path / "test" / "behaviors.tsv").exists():
        return
    log(f"synthesising {config.users:,} users, {config.news:,} news into {path} ...",
        progress=progress)
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    write_synthetic(partial, config)
    shutil.rmtree(path, ignore_errors=True)
    partial.rename(path)


# --- what a run's ledger says ----------------------------------------------------------------

@dataclass(frozen=True)
class LedgerEpsilon:
    """A training run's privacy, from its ``privacy.json`` (training phase only).

    ``user_max`` / ``user_median``: the largest and the median per-user total at user-level
    adjacency (one user's data replaced); ``click_max``: the largest at one-click adjacency;
    ``valid``: every recorded training release's stated guarantee holds; ``population``: users
    in the ledger (every training user for DP-FedAvg, the sampled ones otherwise);
    ``clients_per_round``: the release's fixed count (``None`` for Poisson sampling).
    """

    user_max: float
    user_median: float
    click_max: float
    valid: bool
    delta: float
    population: int
    clients_per_round: int | None = None


def ledger_epsilon(path: Path) -> LedgerEpsilon:
    """The training privacy of the run in ``path`` (see :class:`LedgerEpsilon`).

    Raises
    ------
    CheckpointError
        If the run has no readable ``privacy.json``.
    """
    summary = read_privacy_json(Path(path))
    report = summary["report"]
    user, click = report["phases_user"]["train"], report["phases"]["train"]
    valid = all(m["valid"] for m in report["mechanisms"]
                if m["phase"] == "train" and m["users"])
    per_round = summary["release"].get("clients_per_round")
    return LedgerEpsilon(user_max=float(user["epsilon_max"]),
                         user_median=float(user["epsilon_median"]),
                         click_max=float(click["epsilon_max"]), valid=valid,
                         delta=float(summary["delta"]), population=int(user["num_users"]),
                         clients_per_round=int(per_round) if per_round is not None else None)


def combine_ledgers(values: Sequence[LedgerEpsilon]) -> LedgerEpsilon:
    """Over seeds: the largest maximum, the median of the medians, valid only if all are."""
    return LedgerEpsilon(user_max=max(v.user_max for v in values),
                         user_median=statistics.median(v.user_median for v in values),
                         click_max=max(v.click_max for v in values),
                         valid=all(v.valid for v in values),
                         delta=max(v.delta for v in values),
                         population=max(v.population for v in values),
                         clients_per_round=values[0].clients_per_round)


def format_large(value: float) -> str:
    """ε for the table: ``∞``, 4 significant digits below 1,000, thousands separators above."""
    if math.isinf(value):
        return "∞"
    return f"{value:,.0f}" if value >= 1000 else f"{value:.4g}"


def epsilon_cell(info: LedgerEpsilon) -> str:
    """The user-level ε of a row: ``max / median`` over users, or ∞ with its reason."""
    if not info.valid:
        return "∞ (the stated guarantee does not hold: raw gradient uploaded)"
    if math.isinf(info.user_max):
        if math.isfinite(info.click_max):
            return f"∞ (one click: {format_large(info.click_max)}; the user's data is not covered)"
        return "∞ (no noise)"
    if math.isclose(info.user_max, info.user_median, rel_tol=1e-9):
        return format_large(info.user_max)
    return f"{format_large(info.user_max)} / {format_large(info.user_median)}"


# --- running ---------------------------------------------------------------------------------

@dataclass
class SeedResult:
    """One seed of a row: its test metrics and its training run's privacy."""

    seed: int
    metrics: dict[str, Any]
    ledger: LedgerEpsilon
    config: RunConfig  # the run's resolved configuration (its config.yaml)
    path: Path

    @property
    def noise_multiplier(self) -> float | None:
        """z of a DP-FedAvg run (``None`` for the other methods)."""
        if self.config.train.method != "dp-fedavg":
            return None
        return central_settings(self.config)["noise_multiplier"]


def central_settings(config: RunConfig) -> dict[str, Any]:
    """What the caption states of a resolved DP-FedAvg configuration: q, T, δ, C and z (the
    one place that reads these fields)."""
    fed = config.fed
    return {"client_fraction": fed.client_fraction, "rounds": fed.rounds,
            "delta": fed.target_delta, "clip": fed.clip,
            "noise_multiplier": fed.noise_multiplier}


def caption_settings(spec: RunSpec, *, model: str, quick: bool) -> dict[str, Any]:
    """:func:`central_settings` of the DP-FedAvg runs of ``spec``'s q and T, resolved with
    a placeholder z (nothing is calibrated; z itself is read from each run)."""
    config = spec.run_config(data="-", model=model, seed=0, quick=quick)
    placeholder = replace(config, fed=replace(config.fed, target_epsilon=None,
                                              noise_multiplier=1.0))
    return central_settings(resolve_run_config(placeholder))


@dataclass
class _Runner:
    out: Path
    seeds: tuple[int, ...]
    quick: bool
    report_only: bool
    progress: bool
    total: int = 0
    done: int = 0
    missing: list[str] = field(default_factory=list)
    watch: Stopwatch = field(default_factory=Stopwatch)

    def seed_result(self, population: Population, model: str, row: Row,
                    seed: int) -> SeedResult | None:
        """Train (or reuse) and evaluate one seed of ``row``; ``None`` if ``report_only``
        and it has not finished."""
        self.done += 1
        spec = row.spec
        path = run_dir(population.root, model, spec, seed, quick=self.quick)
        config = spec.run_config(data=population.data, model=model, seed=seed,
                                 quick=self.quick)
        what = (f"{population.label} users / {model} / {row.key} / seed {seed}")
        finished = finished_metrics(path, config)
        serving = (dataclasses.replace(row.serving, seed=seed)
                   if row.serving is not None else None)
        if self.report_only:
            result = (cached_serving(path, serving) if serving is not None and finished
                      else finished["test"] if finished else None)
            if result is None:
                self.missing.append(what)
                return None
        else:
            log(f"[central-dp {self.watch} {self.done}/{self.total}] {what}: "
                f"{'reusing' if finished else 'training'} {path}", progress=self.progress)
            metrics = finished or ensure_run(path, config, progress=self.progress)
            if serving is None:
                result = metrics["test"]
            else:
                log(f"  serving {serving_key(serving)}", progress=self.progress)
                result = serve_run(path, serving, progress=self.progress)
        ledger = ledger_epsilon(path)
        log(f"  AUC {result['auc']:.4f}, user-level ε {epsilon_cell(ledger)}",
            progress=self.progress and not self.report_only)
        return SeedResult(seed, {m: result[m] for m in METRICS}, ledger,
                          RunDirectory(path).config(), path)


# --- checks ----------------------------------------------------------------------------------

def check_epsilons(epsilons: Sequence[float]) -> tuple[float, ...]:
    """Validated user-level ε: one or more distinct values > 0 (``inf``: FedRec).

    Raises
    ------
    ConfigError
        Naming the parameter ``epsilons``.
    """
    values = tuple(float(e) for e in epsilons)
    if not values or any(not e > 0 for e in values) or len(set(values)) != len(values):
        raise ConfigError(f"invalid 'epsilons': got {list(epsilons)!r}, expected one or more "
                          f"distinct numbers > 0 (inf: FedRec, the no-privacy point)")
    return tuple(sorted(values))


def check_users(users: Sequence[int], name: str = "users") -> tuple[int, ...]:
    """Validated population sizes: distinct integers >= 2, in increasing order.

    Raises
    ------
    ConfigError
        Naming the parameter.
    """
    values = tuple(users)
    if not values or any(isinstance(u, bool) or not isinstance(u, int) or u < 2
                         for u in values) or len(set(values)) != len(values):
        raise ConfigError(f"invalid '{name}': got {list(values)!r}, expected one or more "
                          f"distinct integers >= 2 (synthetic users)")
    return tuple(sorted(values))


def _populations(out: Path, data: str | None, users: Sequence[int] | None,
                 ldp_users: Sequence[int] | None, *, quick: bool) -> list[Population]:
    if data is not None:
        if users is not None or ldp_users is not None:
            raise ConfigError("--users and --ldp-users make synthetic populations; with "
                              "--data the population is that data set: drop them")
        path = resolve_data(out, data, quick=quick, progress=False)
        return [Population(None, path, out, ldp=True)]
    sizes = check_users(users if users is not None else
                        ((demo_synth_config(True).users,) if quick else USERS))
    ldp = check_users(ldp_users, "ldp_users") if ldp_users is not None else sizes[:1]
    extra = sorted(set(ldp) - set(sizes))
    if extra:
        raise ConfigError(f"invalid 'ldp_users': {extra} not among --users {list(sizes)}; "
                          f"the local-DP rows run at some of the population sizes")
    populations = []
    for size in sizes:
        data_dir, root = population_paths(out, size, quick=quick)
        populations.append(Population(size, str(data_dir), root, ldp=size in ldp,
                                      synth=population_config(size, quick=quick)))
    return populations


# --- output ----------------------------------------------------------------------------------

_AUC_HEADER = f"test AUC (×{SCALE:g})"


def _row_setting(row: Row, config: RunConfig) -> str:
    """The row's privacy knob, from its resolved configuration."""
    spec, fed = row.spec, config.fed
    if spec.method == "fedrec":
        return "no clipping, no noise"
    if spec.method == "dp-fedavg":
        text = f"target ε = {spec.target_epsilon:g} for the run"
        if row.serving is not None:
            text += ("; ε_s = 0 (the device ranks, sends nothing)"
                     if row.serving.kind == "local" else
                     f"; ε_s = {row.serving.epsilon:g} per query")
        return text
    if spec.method == "fednewsrec":
        return f"clip δ = {fed.clip:g} per coordinate, Laplace λ = {fed.noise_scale:g}"
    return f"ε_t = {spec.epsilon_train:g} per round"


@dataclass
class _RowResult:
    population: Population
    model: str
    row: Row
    setting: str
    seeds: list[SeedResult]

    @property
    def summaries(self) -> dict[str, Summary]:
        return summarize_metrics([s.metrics for s in self.seeds])

    @property
    def ledger(self) -> LedgerEpsilon:
        return combine_ledgers([s.ledger for s in self.seeds])

    @property
    def noise_multiplier(self) -> float | None:
        values = {s.noise_multiplier for s in self.seeds}
        return values.pop() if len(values) == 1 else None

    def record(self) -> dict[str, Any]:
        spec, ledger = self.row.spec, self.ledger
        return {"users": self.population.users, "data": self.population.data,
                "model": self.model, "group": self.row.group, "row": self.row.key,
                "label": self.row.label, "method": spec.method,
                "target_epsilon": spec.target_epsilon,
                "epsilon_train": spec.epsilon_train if spec.method in ("dp-fedrec",
                                                                        "privaterec") else None,
                "privacy_mode": spec.privacy_mode if spec.method == "privaterec" else None,
                "basis_size": spec.basis or None,
                "serving": self.row.serving.kind if self.row.serving else None,
                "epsilon_serve": self.row.epsilon_serve,
                "padding_p": (self.row.serving.padding_p if self.row.serving
                              and self.row.serving.kind == "privaterec" else None),
                "noise_multiplier": self.noise_multiplier,
                "epsilon_user_max": ledger.user_max, "epsilon_user_median": ledger.user_median,
                "epsilon_click_max": ledger.click_max, "epsilon_valid": ledger.valid,
                "delta": ledger.delta, "ledger_users": ledger.population,
                "n_seeds": len(self.seeds), "seeds": [s.seed for s in self.seeds],
                **metric_columns(self.summaries)}


RECORD_COLUMNS = ["users", "data", "model", "group", "row", "label", "method",
                  "target_epsilon", "epsilon_train", "privacy_mode", "basis_size", "serving",
                  "epsilon_serve", "padding_p", "noise_multiplier", "epsilon_user_max",
                  "epsilon_user_median", "epsilon_click_max", "epsilon_valid", "delta",
                  "ledger_users", "n_seeds", "seeds"] + [f"{m}_{s}" for m in METRICS
                                                         for s in ("mean", "std")]
RUN_COLUMNS = ["users", "model", "row", "seed", "run", "noise_multiplier", "epsilon_user_max",
               "epsilon_user_median", "epsilon_valid", *METRICS]


def _table(results: Sequence[_RowResult]) -> str:
    cells = []
    for r in results:
        ledger = r.ledger
        z = f" (z = {r.noise_multiplier:.4g})" if r.noise_multiplier is not None else ""
        eps_s = r.row.epsilon_serve
        cells.append([r.population.label, MODEL_LABELS.get(r.model, r.model), r.row.label,
                      r.setting + z, epsilon_cell(ledger),
                      "-" if eps_s is None else format_epsilon(eps_s),
                      format_summary(r.summaries["auc"]), str(len(r.seeds))])
    return markdown_table(["Users", "Model", "Method", "Setting", "user-level ε of training "
                           "(max / median over users)", "ε_s / query", _AUC_HEADER, "n"],
                          cells)


def _pivot(results: Sequence[_RowResult], epsilons: Sequence[float]) -> str:
    """AUC of the central rows by target ε (∞: FedRec), one line per population and model."""
    lines: dict[tuple[str, str], dict[float, str]] = {}
    for r in results:
        if r.row.group != "central":
            continue
        eps = r.row.spec.target_epsilon if r.row.spec.target_epsilon is not None else INF
        key = (r.population.label, MODEL_LABELS.get(r.model, r.model))
        lines.setdefault(key, {})[eps] = format_summary(r.summaries["auc"])
    cells = [[users, model, *[values.get(e, "–") for e in epsilons]]
             for (users, model), values in lines.items()]
    return markdown_table(["Users", "Model", *[f"ε = {format_epsilon(e)}"
                                               + (" (FedRec)" if math.isinf(e) else "")
                                               for e in epsilons]], cells)


def _caption(populations: Sequence[Population], results: Sequence[_RowResult],
             settings: dict[str, Any], *, seeds: Sequence[int], quick: bool) -> list[str]:
    q, rounds, delta, clip = (settings[k] for k in ("client_fraction", "rounds", "delta",
                                                    "clip"))
    notes = [f"Central rows: DP-FedAvg with Poisson sampling at q = {q:g} per round, T = "
             f"{rounds} rounds{' (--quick)' if quick else ''}, updates clipped to L2 norm "
             f"C = {clip:g}, Gaussian noise z·C once on the sum, FedAdam; z calibrated by "
             f"`--target-epsilon` for the whole run at δ = {delta:g} under replacement (one "
             f"user's data replaced, the ledger's adjacency; PLD accountant). ε = ∞ is FedRec "
             f"(r = {q:g}, no clipping, no noise)."]
    for population in populations:
        ledgers = [s.ledger for r in results if r.population is population
                   for s in r.seeds]
        central = [s.ledger for r in results if r.population is population
                   and r.row.spec.method == "dp-fedavg" for s in r.seeds]
        fixed = [v.clients_per_round for v in ledgers if v.clients_per_round]
        text = f"{population.label} users (`{population.data}`): "
        if central:
            n = max(v.population for v in central)
            text += (f"N = {n:,} training users, δ = {central[0].delta:g} "
                     f"({'<' if central[0].delta < 1 / n else 'NOT <'} 1/N), "
                     f"{q * n:,.0f} expected clients per round (qN)")
        else:
            text += "no DP-FedAvg run finished (N not read from a ledger)"
        if fixed:
            text += (f"; FedRec and the local-DP rows sample {min(fixed):,} clients per round "
                     f"without replacement")
        text += ("; local-DP and PrivateRec rows run here." if population.ldp
                 else "; FedRec and DP-FedAvg only (the local-DP rows run at `--ldp-users`).")
        notes.append(text)
    notes += [
        f"Local-DP rows: each upload is noised on the device (DP-FedRec and PrivateRec at "
        f"ε_t = {LDP_EPSILON:g} per round, FedNewsRec at its paper defaults); the ε shown is "
        "each user's total over the rounds it took part in, at user-level adjacency, as the "
        "ledger composes it (max / median over users; the max over seeds). PrivateRec's "
        "candidate-path gradient reveals which displayed news were drawn, so no total covers "
        "a whole user (∞); paper mode also uploads the history-path gradient raw, so its "
        "stated guarantee does not hold at all.",
        f"PrivateRec by DP-FedAvg: the PrivateRec model (B = {PRIVATEREC_BASIS}) trained by "
        "DP-FedAvg at the largest finite target ε (its training ε is the one shown), then "
        "served by local ranking (the device downloads the pool's score matrix and sends "
        f"nothing: ε_s = 0) or by DPA (padding p = {SERVE_PADDING:g}, Laplace on the B "
        "weights, ε_s per query; serving ε composes over a user's queries: "
        "`privaterec privacy report --run RUN`).",
        f"Test AUC ×{SCALE:g}, mean ± sample std (ddof = 1) over the seeds that finished "
        f"(asked: {', '.join(map(str, seeds))}); n = number of seeds (n = 1: no std). "
        "z is the noise multiplier each DP-FedAvg run calibrated."]
    return notes


def _short_epsilon(info: LedgerEpsilon) -> str:
    """The user-level ε of a legend entry (max over users)."""
    if not info.valid:
        return "∞ (stated ε does not hold)"
    if math.isinf(info.user_max) and math.isfinite(info.click_max):
        return "∞ (one click only)"
    return format_large(info.user_max)


_LDP_COLORS = {"dp-fedrec": "C6", "fednewsrec": "C7", "paper": "C8", "strict": "C9"}
_SERVE_MARKERS = {"local": "s", "dpa-1": "v", "dpa-10": "^"}


def _plot(path: Path, results: Sequence[_RowResult], models: Sequence[str],
          populations: Sequence[Population], epsilons: Sequence[float]) -> Path:
    """One panel per model: DP-FedAvg AUC against the ledger's user-level ε per population
    (FedRec dashed), the local-DP rows dotted, PrivateRec central-trained as markers."""
    figure, axes = new_figure(columns=len(models), width=6.8, height=7.0)
    colors = {id(p): f"C{i % 6}" for i, p in enumerate(populations)}
    for ax, model in zip(axes, models):
        mine = [r for r in results if r.model == model]
        for population in populations:
            color = colors[id(population)]
            rows = [r for r in mine if r.population is population]
            curve = sorted(((r.ledger.user_max, r.summaries["auc"]) for r in rows
                            if r.row.group == "central" and r.row.spec.method == "dp-fedavg"),
                           key=lambda p: p[0])
            if curve:
                ax.errorbar([x for x, _ in curve], [s.mean * SCALE for _, s in curve],
                            yerr=[(s.std or 0.0) * SCALE for _, s in curve], marker="o",
                            capsize=3, color=color,
                            label=f"DP-FedAvg, {population.label} users")
            for r in rows:
                auc = r.summaries["auc"].mean * SCALE
                spec = r.row.spec
                if spec.method == "fedrec":
                    ax.axhline(auc, linestyle="--", color=color,
                               label=f"FedRec (ε = ∞), {population.label} users")
                elif r.row.group == "ldp":
                    ax.axhline(auc, linestyle=":", linewidth=1.5,
                               color=_LDP_COLORS.get(spec.privacy_mode
                                                     if spec.method == "privaterec"
                                                     else spec.method, "k"),
                               label=f"{r.row.label}, {population.label} users: user ε "
                                     f"{_short_epsilon(r.ledger)}")
                elif r.row.group == "privaterec":
                    assert r.row.serving is not None
                    served = r.row.key.rsplit("+", 1)[1]
                    name = ("local ranking (ε_s = 0)" if served == "local"
                            else f"DPA ε_s = {format_epsilon(r.row.serving.epsilon)}")
                    ax.plot([r.ledger.user_max], [auc], linestyle="none",
                            marker=_SERVE_MARKERS.get(served, "D"), color=color,
                            markersize=8, label=f"PrivateRec by DP-FedAvg + {name}, "
                                                f"{population.label} users")
        if mine:
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=1)
        else:
            ax.text(0.5, 0.5, "no finished runs", ha="center", va="center",
                    transform=ax.transAxes)
        set_log_x(ax, [e for e in epsilons if math.isfinite(e)])
        ax.grid(True, alpha=0.3)
        ax.set(xlabel="user-level ε of the whole training run (ledger; log scale)",
               ylabel=_AUC_HEADER, title=f"Central vs local DP: {MODEL_LABELS.get(model, model)}")
    return save_png(figure, path)


# --- entry point -----------------------------------------------------------------------------

def run_central_dp(out: Path, *, data: str | None = None, users: Sequence[int] | None = None,
                   ldp_users: Sequence[int] | None = None,
                   models: Sequence[str] | None = None, seeds: Sequence[int] = (0, 1, 2),
                   epsilons: Sequence[float] | None = None,
                   client_fraction: float | None = None, rounds: int | None = None,
                   quick: bool = False, report_only: bool = False,
                   progress: bool = True) -> dict[str, Any]:
    """Central DP against local DP: writes ``OUT/central_dp.{md,csv,png}`` and
    ``OUT/central_dp_runs.csv``.

    Parameters
    ----------
    out:
        Output directory; it also holds the data sets and the run cache.
    data:
        A MIND-format directory with ``train/`` and ``test/`` (one population); ``None``:
        synthetic populations of ``users`` users.
    users:
        Population sizes (default 2,000, 20,000 and 50,000; ``quick``: the small data set's
        400).
    ldp_users:
        The sizes that also get the local-DP and PrivateRec rows (default: the smallest).
    models:
        News encoders (default NRMS and NAML; ``quick``: NRMS).
    seeds:
        Training seeds.
    epsilons:
        User-level ε of the DP-FedAvg runs (``inf``: FedRec); default 1, 2, 4, 8, ∞
        (``quick``: 1, 8, ∞).
    client_fraction:
        r / q of every federated run (default 0.02).
    rounds:
        T of every federated run (default the experiments' budget: 300, ``quick`` 20).
    quick:
        The small synthetic data set and the quick budget (smoke tests).
    report_only:
        Train and evaluate nothing: the table holds the finished runs and cached serving
        evaluations (a missing population data set is not synthesised).
    progress:
        Progress lines and bars on stderr.

    Returns
    -------
    dict
        ``markdown``, ``csv``, ``runs_csv``, ``png`` (paths), ``table`` (the markdown text),
        ``rows`` (one record per table row, as in the CSV) and ``missing`` (the runs or
        evaluations that have not finished, with ``report_only``).

    Raises
    ------
    ConfigError
        On invalid arguments, before anything runs.
    """
    out = Path(out)
    models_ = check_models(models if models is not None else
                           (QUICK_MODELS if quick else MODELS))
    seeds_ = check_seeds(seeds)
    eps = check_epsilons(epsilons if epsilons is not None else
                         (QUICK_EPSILONS if quick else EPSILONS))
    if client_fraction is not None and not 0 < client_fraction <= 1:
        raise ConfigError(f"invalid 'client_fraction': got {client_fraction!r}, expected "
                          f"0 < q <= 1")
    budget, _ = training_budget(quick)
    if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int)
                               or rounds < 1):
        raise ConfigError(f"invalid 'rounds': got {rounds!r}, expected an integer >= 1")
    populations = _populations(out, data, users, ldp_users, quick=quick)
    # The defaults stay out of the run names, so the runs of table1 are reused.
    q = None if client_fraction in (None, CLIENT_FRACTION) else client_fraction
    t = None if rounds in (None, budget) else rounds
    plans = [(p, plan_rows(eps, ldp=p.ldp, client_fraction=q, rounds=t)) for p in populations]
    settings = caption_settings(RunSpec("dp-fedavg", target_epsilon=1.0, client_fraction=q,
                                        rounds=t), model=models_[0], quick=quick)
    runner = _Runner(out, seeds_, quick, report_only, progress)
    runner.total = sum(len(rows) for _, rows in plans) * len(models_) * len(seeds_)
    results: list[_RowResult] = []
    for population, rows in plans:
        if population.synth is not None:
            if report_only and not (Path(population.data) / "test" / "behaviors.tsv").exists():
                runner.missing.append(f"{population.label} users: no data set yet")
                continue
            if not report_only:
                synthesize(Path(population.data), population.synth, progress=progress)
        for model in models_:
            for row in rows:
                seed_results = [r for r in (runner.seed_result(population, model, row, seed)
                                            for seed in seeds_) if r is not None]
                if seed_results:
                    results.append(_RowResult(population, model, row,
                                              _row_setting(row, seed_results[0].config),
                                              seed_results))
    sections = ["## Central DP against local DP: test AUC against user-level ε", "",
                "Central rows by target ε (DP-FedAvg; ∞: FedRec):", "",
                _pivot(results, eps), "", "All rows:", "", _table(results), "",
                *[f"- {n}" for n in _caption(populations, results, settings, seeds=seeds_,
                                              quick=quick)]]
    if runner.missing:
        sections += ["", f"Not finished ({len(runner.missing)}; rerun without "
                         "`--report-only` to run them):", "",
                     *[f"- {m}" for m in runner.missing]]
    sections += ["", f"![central-dp]({NAME}.png)"]
    markdown = "\n".join(sections)
    records = [r.record() for r in results]
    run_rows = [{"users": r.population.users, "model": r.model, "row": r.row.key,
                 "seed": s.seed, "run": str(s.path), "noise_multiplier": s.noise_multiplier,
                 "epsilon_user_max": s.ledger.user_max,
                 "epsilon_user_median": s.ledger.user_median,
                 "epsilon_valid": s.ledger.valid, **s.metrics}
                for r in results for s in r.seeds]
    png = _plot(out / f"{NAME}.png", results, models_, populations, eps)
    return {"markdown": write_text(out / f"{NAME}.md", markdown),
            "csv": write_csv(out / f"{NAME}.csv", records, RECORD_COLUMNS),
            "runs_csv": write_csv(out / f"{NAME}_runs.csv", run_rows, RUN_COLUMNS),
            "png": png, "table": markdown, "rows": records, "missing": list(runner.missing)}


__all__ = ["CLIENT_FRACTION", "EPSILONS", "LDP_EPSILON", "LedgerEpsilon", "MODELS",
           "PRIVATEREC_BASIS", "Population", "QUICK_EPSILONS", "QUICK_MODELS", "Row",
           "SERVE_EPSILONS", "SERVE_PADDING", "USERS", "check_epsilons", "check_users",
           "combine_ledgers", "epsilon_cell", "ledger_epsilon", "plan_rows",
           "population_config", "population_paths", "run_central_dp", "synthesize"]
