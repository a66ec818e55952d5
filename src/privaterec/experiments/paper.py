"""PrivateRec §4 Tables 1-2: private training and private serving, mean ± std over seeds.

* **Table 1** (training, ε_s = ∞): Centralized; DP-FedRec ε_t = ∞ (= FedRec); DP-FedRec
  ε_t = 10; PrivateRec ε_t = 10 in ``paper`` mode (Alg. 3 as published) and, as an extra
  row, in ``strict`` mode (docs/privacy.md#paper-and-strict-mode: the history-path gradient is
  clipped and noised too).
* **Table 2** (serving at ε_s = 10 per query): DP-FedRec ε_t = ∞ and ε_t = 10 served with
  VDP (§3.2.1), PrivateRec ε_t = 10 served with PrivateRec (Alg. 1-2, padding p = 0.5), plus
  the bytes each query sends.

Every number comes from a run trained (or reused from the run cache, see
:mod:`privaterec.experiments.common`) and evaluated on the data set's test split; metrics
are printed ×100 like the paper's tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

from privaterec.fed.methods import method_from_config, resolve_run_config
from privaterec.experiments.common import (DIGITS, METRIC_LABELS, METRICS, SCALE,
                                           SERVE_PADDING, TRAIN_EPSILON, RunSpec, Stopwatch, Summary, check_models,
                                           check_seeds, format_epsilon, format_summary, log,
                                           markdown_table, metric_columns, model_label, over_seeds,
                                           resolve_data, training_budget, write_csv,
                                           write_text)
from privaterec.ondevice.release import ServingConfig

SERVE_EPSILON = 10.0  # ε_s of Table 2

CENTRALIZED = RunSpec("centralized")
FEDREC = RunSpec("dp-fedrec", math.inf)
DP_FEDREC = RunSpec("dp-fedrec", TRAIN_EPSILON)
PRIVATEREC = RunSpec("privaterec", TRAIN_EPSILON, privacy_mode="paper")
PRIVATEREC_STRICT = RunSpec("privaterec", TRAIN_EPSILON, privacy_mode="strict")

TABLE1_ROWS: tuple[RunSpec, ...] = (CENTRALIZED, FEDREC, DP_FEDREC, PRIVATEREC,
                                    PRIVATEREC_STRICT)


@dataclass(frozen=True)
class ServedRow:
    """A Table 2 row: a trained configuration and the mechanism serving it."""

    run: RunSpec
    serving: Literal["vdp", "privaterec", "local"]  # local: ranked on the device, ε_s = 0

    @property
    def label(self) -> str:
        if self.serving == "local":
            return f"{self.run.label} + local ranking"
        serving = "VDP" if self.serving == "vdp" else f"PrivateRec (p = {SERVE_PADDING:g})"
        return f"{self.run.label} + {serving} serving"

    def serving_config(self) -> ServingConfig:
        """The serving mechanism (its seed is replaced by each run's seed)."""
        if self.serving == "local":
            return ServingConfig(kind="local")
        return ServingConfig(kind=self.serving, epsilon=SERVE_EPSILON, padding_p=SERVE_PADDING)


TABLE2_ROWS: tuple[ServedRow, ...] = (ServedRow(FEDREC, "vdp"), ServedRow(DP_FEDREC, "vdp"),
                                      ServedRow(PRIVATEREC, "privaterec"),
                                      ServedRow(PRIVATEREC, "local"))

_METRIC_HEADERS = [f"{METRIC_LABELS[m]} (×{SCALE:g})" for m in METRICS]


def _train_epsilon_cell(spec: RunSpec) -> str:
    return "-" if spec.method == "centralized" else format_epsilon(spec.epsilon_train)


def round_epsilons(spec: RunSpec) -> tuple[float, float, bool] | None:
    """ε per round and client of a row at one-click and at user-level adjacency (basic
    composition of the client's events), and whether the events' guarantees hold (False for
    PrivateRec's paper mode: its history-path gradient is uploaded unnoised); ``None`` for
    centralized. None of these rows' per-round ε depends on the model's dimension."""
    if spec.method == "centralized":
        return None
    config = resolve_run_config(spec.run_config(data="-", model="nrms", seed=0, quick=True))
    method = method_from_config(config)
    valid = all(e.valid for e in method.events(1))
    return (method.round_epsilon(1, "click")[0], method.round_epsilon(1, "user")[0], valid)


def _adjacency_cells(spec: RunSpec) -> list[str]:
    eps = round_epsilons(spec)
    if eps is None:
        return ["-", "-"]
    click, user, valid = eps
    if not valid:  # the stated ε does not cover the whole upload
        return [f"∞ (claimed {format_epsilon(click)})", format_epsilon(math.inf)]
    return [format_epsilon(click), format_epsilon(user)]


ADJACENCY_NOTE = (
    "ε/round is what one client's upload costs per round at each adjacency "
    "(docs/privacy.md): **click** = one history click substituted or one impression's "
    "clicks changed; **user** = the user's whole data replaced. Methods are compared at the "
    "same adjacency: PrivateRec's candidate-path gradient reveals which displayed news were "
    "drawn, so it is not private for a whole user (∞), while DP-FedRec's clipped, noised "
    "update covers any change of the user's data.")


def _metric_cells(summaries: dict[str, Summary]) -> list[str]:
    return [format_summary(summaries[m], scale=SCALE, digits=DIGITS) for m in METRICS]


def _seed_rows(table: str, model: str, spec: RunSpec, seeds: Sequence[int],
               results: Sequence[dict[str, Any]], **extra: Any) -> list[dict[str, Any]]:
    return [{"table": table, "model": model, "row": spec.slug, "seed": seed,
             **extra, **{m: r[m] for m in METRICS}} for seed, r in zip(seeds, results)]


def _common_notes(data: str, seeds: Sequence[int], quick: bool) -> list[str]:
    rounds, epochs = training_budget(quick)
    return [f"Data: `{data}` (test split). Federated runs: {rounds} rounds; centralized: "
            f"{epochs} epoch{'' if epochs == 1 else 's'}{' (--quick)' if quick else ''}.",
            f"Test metrics ×{SCALE:g}, mean ± sample std (ddof = 1) over seeds "
            f"{', '.join(map(str, seeds))}; n = number of seeds (n = 1: no std)."]


def _summary_record(model: str, spec: RunSpec, seeds: Sequence[int],
                    summaries: dict[str, Summary], **extra: Any) -> dict[str, Any]:
    return {"model": model, "row": spec.slug, "method": spec.method,
            "epsilon_train": spec.epsilon_train if spec.method != "centralized" else None,
            "privacy_mode": spec.privacy_mode if spec.method == "privaterec" else None,
            "basis_size": spec.basis or None, **extra, "n_seeds": len(seeds),
            "seeds": list(seeds), **metric_columns(summaries)}


def _columns(extra: Sequence[str]) -> list[str]:
    return (["model", "row", "method", "epsilon_train", "privacy_mode", "basis_size", *extra,
             "n_seeds", "seeds"] + [f"{m}_{s}" for m in METRICS for s in ("mean", "std")])


@dataclass
class _Table:
    """A table's inputs, checked, and what it collects row by row before it is written."""

    out: Path
    models: tuple[str, ...]
    seeds: tuple[int, ...]
    data_dir: str
    watch: Stopwatch = field(default_factory=Stopwatch)
    cells: list[list[str]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    seed_rows: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def start(cls, out: Path, *, data: str | None, models: Sequence[str],
              seeds: Sequence[int], quick: bool, progress: bool) -> "_Table":
        """Check ``models`` and ``seeds``; resolve (or generate) the data set under ``out``."""
        out = Path(out)
        models, seeds = check_models(models), check_seeds(seeds)
        return cls(out, tuple(models), tuple(seeds),
                   resolve_data(out, data, quick=quick, progress=progress))

    def write(self, name: str, markdown: str, columns: list[str],
              run_columns: list[str]) -> dict[str, Any]:
        """``out/NAME.md``, ``out/NAME.csv`` and ``out/NAME_runs.csv``; the result dict of
        :func:`run_table1`."""
        md_path = write_text(self.out / f"{name}.md", markdown)
        csv_path = write_csv(self.out / f"{name}.csv", self.records, columns)
        runs_path = write_csv(self.out / f"{name}_runs.csv", self.seed_rows, run_columns)
        return {"markdown": md_path, "csv": csv_path, "runs_csv": runs_path,
                "table": markdown, "rows": self.rows, "data": self.data_dir}


def run_table1(out: Path, *, data: str | None = None,
               models: Sequence[str] = ("nrms", "naml", "plm"),
               seeds: Sequence[int] = (0, 1, 2), quick: bool = False,
               progress: bool = True) -> dict[str, Any]:
    """PrivateRec Table 1: test metrics of each training method at ε_s = ∞.

    Trains (or reuses from ``out/runs``) every row × model × seed, then writes
    ``out/table1.md``, ``out/table1.csv`` (raw mean/std per metric) and
    ``out/table1_runs.csv`` (every seed's raw metrics); returns the markdown table (``table``).

    Parameters
    ----------
    out:
        Output directory (also holds the run cache and, without ``data``, the synthetic data).
    data:
        MIND-format directory with ``train/`` and ``test/``; ``None``: the demo's synthetic
        data set.
    models:
        News encoders (``nrms``, ``naml``, ``plm``, ...).
    seeds:
        Training seeds; every row is trained once per seed.
    quick:
        Smaller synthetic data and training budget
        (:data:`~privaterec.experiments.common.QUICK_ROUNDS`,
        :data:`~privaterec.experiments.common.QUICK_EPOCHS`).
    progress:
        Progress lines and bars on stderr.

    Returns
    -------
    dict
        ``markdown``/``csv``/``runs_csv`` paths, ``table`` (the markdown text) and ``rows``
        (per row: model, slug, label, seeds and each metric's mean/std/n/values).
    """
    tab = _Table.start(out, data=data, models=models, seeds=seeds, quick=quick,
                       progress=progress)
    out, seeds, data_dir = tab.out, tab.seeds, tab.data_dir
    for model in tab.models:
        for spec in TABLE1_ROWS:
            log(f"[table1 {tab.watch}] {model} / {spec.slug}", progress=progress)
            results, summaries = over_seeds(out, data_dir, model, spec, seeds, quick=quick,
                                            progress=progress)
            tab.cells.append([model_label(model), _train_epsilon_cell(spec),
                              *_adjacency_cells(spec), spec.label,
                              *_metric_cells(summaries), str(len(seeds))])
            tab.records.append(_summary_record(model, spec, seeds, summaries))
            tab.seed_rows += _seed_rows("table1", model, spec, seeds, results)
            tab.rows.append({"model": model, "row": spec.slug, "label": spec.label,
                             "seeds": list(seeds),
                             "metrics": {m: s.to_dict() for m, s in summaries.items()}})
    table = markdown_table(["Model", "ε_t", "ε/round (click)", "ε/round (user)", "Method",
                            *_METRIC_HEADERS, "n"], tab.cells)
    notes = _common_notes(data_dir, seeds, quick) + [ADJACENCY_NOTE, 
        "ε_s = ∞: the model's own user vector (PrivateRec: ũ = Σ αᵢ bᵢ without noise). "
        "ε_t is per round and per client (Laplace mechanism, δ = 0); DP-FedRec ε_t = ∞ is "
        "FedRec (no noise). '-': data collected centrally.",
        "PrivateRec (paper mode) follows Alg. 3 as published: the gradient of the user and "
        "news encoders through the history path is uploaded without noise and is NOT "
        "covered by ε_t (docs/privacy.md#paper-and-strict-mode). PrivateRec (strict "
        "mode), an extra row not "
        "in the paper, clips and noises that gradient too, so ε_t covers the whole upload."]
    markdown = "\n".join(["## Table 1: private training (ε_s = ∞)", "", table, "",
                          *[f"- {n}" for n in notes]])
    return tab.write("table1", markdown, _columns([]),
                     ["table", "model", "row", "seed", *METRICS])


def run_table2(out: Path, *, data: str | None = None,
               models: Sequence[str] = ("nrms", "naml", "plm"),
               seeds: Sequence[int] = (0, 1, 2), quick: bool = False,
               progress: bool = True) -> dict[str, Any]:
    """PrivateRec Table 2: test metrics under private serving at ε_s = 10 per query.

    Reuses (or trains) Table 1's runs and evaluates each with its serving mechanism, seeded
    with the run's seed; every evaluation's simulated queries are recorded in its own
    ``RUN/serving-evaluations/*.json``, never in the run's ``privacy.json`` (repeated calls
    reuse ``RUN/serving/*.json``). Writes ``out/table2.md``,
    ``out/table2.csv`` and ``out/table2_runs.csv``; returns the markdown table (``table``).

    Parameters and return value as in :func:`run_table1`; each row also has
    ``bytes_per_query`` (4 bytes per float sent: B for PrivateRec, d for VDP).
    """
    tab = _Table.start(out, data=data, models=models, seeds=seeds, quick=quick,
                       progress=progress)
    out, seeds, data_dir = tab.out, tab.seeds, tab.data_dir
    for model in tab.models:
        for served in TABLE2_ROWS:
            spec = served.run
            log(f"[table2 {tab.watch}] {model} / {spec.slug} + {served.serving} serving",
                progress=progress)
            results, summaries = over_seeds(out, data_dir, model, spec, seeds, quick=quick,
                                            progress=progress,
                                            serving=served.serving_config())
            sizes = sorted({int(r["serving"]["bytes_per_query"]) for r in results})
            size = sizes[0] if len(sizes) == 1 else None
            size_cell = str(size) if size is not None else "/".join(map(str, sizes))
            local = served.serving == "local"
            if local:  # nothing is sent per query; the pool is downloaded instead
                down = sorted({int(r["serving"]["bytes_downloaded"]) for r in results})
                size_cell = f"0 (↓ {'/'.join(map(str, down))} B pool)"
            tab.cells.append([model_label(model), _train_epsilon_cell(spec),
                              "0" if local else format_epsilon(SERVE_EPSILON), served.label,
                              *_metric_cells(summaries), size_cell, str(len(seeds))])
            extra = {"serving": served.serving, "epsilon_serve": 0.0 if local else SERVE_EPSILON,
                     "padding_p": SERVE_PADDING if served.serving == "privaterec" else None,
                     "bytes_per_query": size_cell}
            tab.records.append(_summary_record(model, spec, seeds, summaries, **extra))
            tab.seed_rows += _seed_rows("table2", model, spec, seeds, results,
                                        serving=served.serving)
            tab.rows.append({"model": model, "row": spec.slug, "serving": served.serving,
                             "label": served.label, "seeds": list(seeds),
                             "bytes_per_query": size if size is not None else sizes,
                             "metrics": {m: s.to_dict() for m, s in summaries.items()}})
    table = markdown_table(["Model", "ε_t", "ε_s", "Method", *_METRIC_HEADERS,
                            "bytes / query", "n"], tab.cells)
    notes = _common_notes(data_dir, seeds, quick) + [
        f"ε_s = {SERVE_EPSILON:g} per query, Laplace (δ = 0); each labelled test impression is "
        "one query, and the serving noise is seeded with the run's seed.",
        "VDP (§3.2.1): the d-dim user vector is L1-clipped to θ = 0.001 and noised with "
        "Δ₁ = 2θ; it sends d floats. PrivateRec (Alg. 1-2): padding p = "
        f"{SERVE_PADDING:g}, Laplace noise on the B attention weights with the simplex "
        "sensitivity Δ₁ = 2 (docs/privacy.md#dpa-sensitivity) at the padding-amplified "
        "budget (docs/privacy.md#padding-amplification); it sends B floats. bytes / query = 4 × floats sent (float32).",
        "Local ranking (docs/serving.md#three-ways-to-serve): the device downloads the pool's "
        "score matrix P = b·Rᵀ once (float32: ↓ bytes for this test pool, then deltas as news "
        "arrive), ranks it with its exact α and sends nothing, so ε_s = 0 and the metrics "
        "are those of serving without noise.",
        "Per-user serving ε composes over that user's queries: see "
        "'privaterec privacy report --run RUN'."]
    markdown = "\n".join([f"## Table 2: private serving (ε_s = {SERVE_EPSILON:g})", "", table,
                          "", *[f"- {n}" for n in notes]])
    return tab.write("table2", markdown,
                     _columns(["serving", "epsilon_serve", "padding_p", "bytes_per_query"]),
                     ["table", "model", "row", "serving", "seed", *METRICS])


__all__ = ["CENTRALIZED", "DP_FEDREC", "FEDREC", "PRIVATEREC", "PRIVATEREC_STRICT",
           "SERVE_EPSILON", "SERVE_PADDING", "ServedRow", "TABLE1_ROWS", "TABLE2_ROWS",
           "TRAIN_EPSILON", "run_table1", "run_table2"]
