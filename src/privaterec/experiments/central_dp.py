"""Central against local DP at population scale (docs/experiments.md): ``experiment central-dp``.

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
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from privaterec.config import RunConfig, replace
from privaterec.errors import ConfigError
from privaterec.experiments.central_dp_report import caption, pivot_table, plot, rows_table
from privaterec.experiments.central_dp_rows import (LDP_EPSILON, PRIVATEREC_BASIS,
                                                    RECORD_COLUMNS, RUN_COLUMNS,
                                                    SERVE_EPSILONS, SERVE_PADDING, Row,
                                                    RowResult, SeedResult, central_settings,
                                                    plan_rows, row_setting)
from privaterec.experiments.common import (METRICS, RunSpec, Stopwatch, cached_serving,
                                           check_models, check_seeds, ensure_run,
                                           finished_metrics, log, run_dir, serve_run,
                                           serving_key, training_budget, write_csv,
                                           write_text)
from privaterec.experiments.populations import Population, make_populations, synthesize
from privaterec.experiments.run_privacy import LedgerEpsilon, epsilon_cell, ledger_epsilon
from privaterec.fed.methods import resolve_run_config
from privaterec.fed.methods.dp_fedavg import CentralDP
from privaterec.method_settings import CLIP_SPACES, ClipSpace
from privaterec.runs.directory import RunDirectory
from privaterec.validators import check_choice, fail

INF = math.inf
NAME = "central_dp"  # output files: central_dp.md, .csv, _runs.csv, .png
UNTRAINED_FILE = "untrained.json"  # the cached evaluation of an untrained θ₀
EPSILONS = (1.0, 2.0, 4.0, 8.0, INF)  # user-level ε of the whole run (∞: FedRec)
QUICK_EPSILONS = (1.0, 8.0, INF)
USERS = (2000, 20000, 50000)
MODELS = ("nrms", "naml")
QUICK_MODELS = ("nrms",)
CLIENT_FRACTION = CentralDP.server_defaults.client_fraction  # the default r (q for dp-fedavg)


# --- running ---------------------------------------------------------------------------------

def caption_settings(spec: RunSpec, *, model: str, quick: bool) -> dict[str, Any]:
    """:func:`central_settings` of the DP-FedAvg runs of ``spec``'s q and T, resolved with
    a placeholder z (nothing is calibrated; z itself is read from each run)."""
    config = spec.run_config(data="-", model=model, seed=0, quick=quick)
    placeholder = replace(config, fed=replace(config.fed, settings=replace(
        config.fed.settings, target_epsilon=None, noise_multiplier=1.0)))
    return central_settings(resolve_run_config(placeholder))


@dataclass
class _Runner:
    """Runs (or, with ``report_only``, only reads) one seed of a row at a time, with
    progress lines; remembers what has not finished."""

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
        what = f"{population.label} users / {model} / {row.key} / seed {seed}"
        if row.group == "untrained":
            return self.untrained_result(path.parent.parent / "untrained" / f"seed{seed}",
                                         config, seed, what)
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

    def untrained_result(self, path: Path, config: RunConfig, seed: int,
                         what: str) -> SeedResult | None:
        """The untrained θ₀ of ``config``'s run, evaluated once and cached in ``path``
        (keyed on the data, the model and the seed); it releases nothing (ε = 0)."""
        resolved = resolve_run_config(config)
        key = json.loads(json.dumps({"data": resolved.data, "seed": resolved.train.seed,
                                     "model": dataclasses.asdict(resolved.model)}))
        cache = path / UNTRAINED_FILE
        cached = json.loads(cache.read_text()) if cache.exists() else None
        result = cached["test"] if cached is not None and cached.get("key") == key else None
        if result is None and self.report_only:
            self.missing.append(what)
            return None
        if result is None:
            log(f"[central-dp {self.watch} {self.done}/{self.total}] {what}: evaluating "
                f"{path}", progress=self.progress)
            from privaterec.runs.ranking import evaluate_untrained
            metrics = evaluate_untrained(resolved, progress=self.progress)
            result = {m: metrics[m] for m in METRICS}
            write_text(cache, json.dumps({"key": key, "test": result}, indent=2))
        log(f"  AUC {result['auc']:.4f} untrained", progress=self.progress
            and not self.report_only)
        nothing = LedgerEpsilon(user_max=0.0, user_median=0.0, click_max=0.0, valid=True,
                                delta=0.0, population=0)
        return SeedResult(seed, result, nothing, resolved, path)


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


# --- entry point -----------------------------------------------------------------------------

def run_central_dp(out: Path, *, data: str | None = None, users: Sequence[int] | None = None,
                   ldp_users: Sequence[int] | None = None,
                   models: Sequence[str] | None = None, seeds: Sequence[int] = (0, 1, 2),
                   epsilons: Sequence[float] | None = None,
                   client_fraction: float | None = None, rounds: int | None = None,
                   clip_spaces: Sequence[str] | None = None,
                   privaterec_bases: Sequence[int] | None = None,
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
    clip_spaces:
        What the DP-FedAvg rows clip, one set of rows per value: ``parameters`` (default)
        and/or ``news_vectors`` (:mod:`privaterec.fed.news_space`).
    privaterec_bases:
        B of the PrivateRec central-trained rows, one set of rows per value (default
        :data:`PRIVATEREC_BASIS`; integers ≥ 2).
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
        fail("client_fraction", client_fraction, "0 < q <= 1", kind="")
    budget, _ = training_budget(quick)
    if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int)
                               or rounds < 1):
        raise ConfigError(f"invalid 'rounds': got {rounds!r}, expected an integer >= 1")
    spaces: tuple[ClipSpace, ...] = tuple(
        check_choice(space, "clip_spaces", CLIP_SPACES)
        for space in dict.fromkeys(clip_spaces or ("parameters",)))
    bases = tuple(dict.fromkeys(privaterec_bases or (PRIVATEREC_BASIS,)))
    for basis in bases:
        if isinstance(basis, bool) or not isinstance(basis, int) or basis < 2:
            fail("privaterec_bases", basis, "integers >= 2 (B basic vectors)", kind="")
    populations = make_populations(out, data, users, ldp_users, default_users=USERS,
                                   quick=quick)
    # The defaults stay out of the run names, so the runs of table1 are reused.
    q = None if client_fraction in (None, CLIENT_FRACTION) else client_fraction
    t = None if rounds in (None, budget) else rounds
    plans = [(p, plan_rows(eps, ldp=p.ldp, client_fraction=q, rounds=t,
                           clip_spaces=spaces, privaterec_bases=bases))
             for p in populations]
    settings = caption_settings(RunSpec("dp-fedavg", target_epsilon=1.0, client_fraction=q,
                                        rounds=t), model=models_[0], quick=quick)
    runner = _Runner(quick, report_only, progress)
    runner.total = sum(len(rows) for _, rows in plans) * len(models_) * len(seeds_)
    results: list[RowResult] = []
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
                    results.append(RowResult(population, model, row,
                                             row_setting(row, seed_results[0].config),
                                             seed_results))
    sections = ["## Central DP against local DP: test AUC against user-level ε", "",
                "Central rows by target ε (DP-FedAvg; ∞: FedRec):", "",
                pivot_table(results, eps, seeds=len(seeds_)), "", "All rows:", "", rows_table(results), "",
                *[f"- {n}" for n in caption(populations, results, settings, seeds=seeds_,
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
    png = plot(out / f"{NAME}.png", results, models_, populations, eps)
    return {"markdown": write_text(out / f"{NAME}.md", markdown),
            "csv": write_csv(out / f"{NAME}.csv", records, RECORD_COLUMNS),
            "runs_csv": write_csv(out / f"{NAME}_runs.csv", run_rows, RUN_COLUMNS),
            "png": png, "table": markdown, "rows": records, "missing": list(runner.missing)}


__all__ = ["CLIENT_FRACTION", "EPSILONS", "LDP_EPSILON", "MODELS", "PRIVATEREC_BASIS",
           "QUICK_EPSILONS", "QUICK_MODELS", "SERVE_EPSILONS", "SERVE_PADDING", "USERS",
           "caption_settings", "check_epsilons", "run_central_dp"]
