"""Uni-FedRec §4 analogues: Tables 2-4 and Fig. 5, mean ± std over seeds.

``privaterec experiment unifedrec [--quick]`` runs, for each seed, on a synthetic data set
whose news pool holds at least 5,000 news (:data:`RECALL_SYNTH`; the default embedded data
set has 3,000):

1. the ranking models: FedRec (NRMS, DP-FedRec ε_t = ∞) — the ranker of the Uni-FedRec,
   no-BIE and YoutubeNet rows and the model VDP serves — and PrivateRec ε_t = 10 (paper
   mode), whose basic vectors serve the PrivateRec row;
2. the recall models on the FedRec ranker's news vectors (``train --method unifedrec``):
   **Uni-FedRec** with the paper's LDP training (L1 clip θ = 0.1, Laplace λ_g = 0.01, so
   ε = 20 per round) and serving noise (δ = 0.2, λ_I = 1.2: ε = 2δB/λ_I = 10 per channel);
   **Uni-FedRec without LDP training** (λ_g = 0; serving still at λ_I); and the **no-BIE**
   ablation (a model trained, also without LDP, without basic interest embeddings: its
   channel interests are sent as they are). Every recall model clusters at d_c = 0.5
   (cosine; 1.0 gives one channel per user here), clips its decomposition scores to
   [−δ, δ] in training as in serving, and learns a public aggregator scale s
   (α = softmax(s·â), post-processing of the release; without it the clipped scores
   cannot weight two basic interests more than e^{2δ} apart);
3. the recall evaluations (:func:`privaterec.runs.recall.evaluate_recall_run`): every test
   user queries once; R@100…400 of its future clicks (utility, Table 2) and of the clicks
   its query encoded (leakage, Table 3), the AUC of ranking R = 400 recalled candidates
   with the ranker (Table 4), and the λ_I sweep of Fig. 5.

The baselines go through the same metrics: YoutubeNet (the mean clicked-news vector, sent
in the clear), PrivateRec serving (B = 5 floats at ε_s = 10) and VDP (d floats at
ε_s = 10, FedRec model), both searched exactly over the pool. Evaluation queries of this
experiment are simulated and not recorded in the runs' ledgers (``record=False``); the
ε each query spends is reported instead.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from privaterec.config import FedConfig
from privaterec.data.synth import SynthConfig, write_synthetic
from privaterec.experiments.common import (SCALE, TRAIN_EPSILON, RunSpec, Stopwatch,
                                           Summary, check_seeds, checkpoint_stamp,
                                           ensure_run, format_summary, log,
                                           markdown_table, run_dir, summarize, write_csv,
                                           write_text)
from privaterec.recall.evaluate import RECALL_KS
from privaterec.runs.recall import (RecallModelConfig, RecallRunConfig, evaluate_recall_run,
                                   is_recall_run, train_recall_run)
from privaterec.recall.task import RecallTrainConfig, recall_fed_config
from privaterec.files import write_atomic
from privaterec.ondevice.release import ServingConfig

RECALL_SYNTH = SynthConfig(news=6000, seed=0)
"""Data of the experiment: the demo's synthetic generator with a 6,000-news pool."""
QUICK_SYNTH = SynthConfig(users=400, news=1200, seed=0)

MODEL = "nrms"
RANKER = RunSpec("dp-fedrec", math.inf)
PRIVATE_RANKER = RunSpec("privaterec", TRAIN_EPSILON, privacy_mode="paper")
SERVE_EPSILON = 10.0  # ε_s of the PrivateRec and VDP rows
INTEREST_NOISES = (0.075, 0.15, 0.3, 0.6, 1.2, 2.4)  # λ_I of Fig. 5 (paper default 1.2)
QUICK_INTEREST_NOISES = (0.3, 1.2)

RECALL_ROUNDS = 1000
LDP_RECALL_ROUNDS = 300  # the LDP upload's noise dominates: its loss stays at ln 5 (docs)
QUICK_RECALL_ROUNDS = 30
RECALL_CLIENTS = 100  # clients per round of the recall model's training
DISTANCE_THRESHOLD = 0.5  # d_c (cosine, average linkage): 1.0 gives one channel per user


def recall_train_config(*, ldp: bool, quick: bool) -> tuple[FedConfig, RecallTrainConfig]:
    """Training of the recall rows (the engine's settings, recall's own): FedAdam with the
    paper's LDP upload (``ldp``) or none."""
    rounds = QUICK_RECALL_ROUNDS if quick else (LDP_RECALL_ROUNDS if ldp else RECALL_ROUNDS)
    train = RecallTrainConfig(negative_source="pool", score_clip=True)
    fed = recall_fed_config(rounds=rounds, clients_per_round=RECALL_CLIENTS,
                            strategy="fedadam", server_lr=0.003,
                            **({} if ldp else {"clipping": "none", "noise_scale": 0.0}))
    return fed, train


@dataclass(frozen=True)
class RecallVariant:
    """A trained recall model of the experiment."""

    slug: str
    label: str
    ldp: bool
    bie: bool = True

    def run_config(self, ranker: Path, *, seed: int, quick: bool) -> RecallRunConfig:
        fed, train = recall_train_config(ldp=self.ldp, quick=quick)
        return RecallRunConfig(
            ranker=str(ranker), seed=seed,
            model=RecallModelConfig(distance_threshold=DISTANCE_THRESHOLD, bie=self.bie,
                                    aggregator_scale=self.bie),
            fed=fed, train=train)


UNIFEDREC = RecallVariant("unifedrec", "Uni-FedRec", ldp=True)
UNIFEDREC_NO_LDP = RecallVariant("unifedrec-noldp", "Uni-FedRec (no LDP training)", ldp=False)
NO_BIE = RecallVariant("no-bie", "No-BIE ablation (no LDP training)", ldp=False, bie=False)
VARIANTS = (UNIFEDREC, UNIFEDREC_NO_LDP, NO_BIE)


@dataclass(frozen=True)
class Row:
    """One row of Tables 2-4: which run is queried how."""

    key: str
    label: str
    method: str  # --recall method
    run: str  # "unifedrec", "unifedrec-noldp", "no-bie", "ranker", "private-ranker"
    serve_noise: bool = True
    interest_noise: float | None = None
    serving: ServingConfig | None = None


ROWS = (
    Row("unifedrec", "Uni-FedRec (λ_I = 1.2)", "unifedrec", "unifedrec"),
    Row("unifedrec-noldp", "Uni-FedRec, no LDP training (λ_I = 1.2)", "unifedrec",
        "unifedrec-noldp"),
    Row("unifedrec-clear", "Uni-FedRec, no LDP training, no serving noise (ε = ∞)",
        "unifedrec", "unifedrec-noldp", serve_noise=False),
    Row("no-bie", "No-BIE, no LDP training (channel interests in the clear)", "no-bie",
        "no-bie"),
    Row("youtubenet", "YoutubeNet (mean clicked-news vector, clear)", "youtubenet", "ranker"),
    Row("privaterec", f"PrivateRec serving (ε_s = {SERVE_EPSILON:g}, p = 0.5)", "privaterec",
        "private-ranker", serving=ServingConfig(kind="privaterec", epsilon=SERVE_EPSILON)),
    Row("vdp", f"VDP on FedRec (ε_s = {SERVE_EPSILON:g})", "vdp", "ranker",
        serving=ServingConfig(kind="vdp", epsilon=SERVE_EPSILON)),
)


def recall_data(out: Path, data: str | None, *, quick: bool, progress: bool) -> str:
    """The data directory: ``data`` or the synthetic set with a ≥ 5,000-news pool."""
    if data is not None:
        return str(Path(data).resolve())
    path = (Path(out) / "data" / ("synth-recall-quick" if quick else "synth-recall")).resolve()
    if not (path / "test" / "behaviors.tsv").exists():
        log(f"synthesising data into {path} ...", progress=progress)
        write_synthetic(path, QUICK_SYNTH if quick else RECALL_SYNTH)
    return str(path)


def _cached(path: Path, key: dict[str, Any], compute: Callable[[], dict[str, Any]]
            ) -> dict[str, Any]:
    """``compute()`` unless ``path`` holds its result for the same ``key``."""
    if path.exists():
        entry = json.loads(path.read_text())
        if entry.get("key") == json.loads(json.dumps(key, default=str)):
            return entry["result"]
    result = compute()
    write_atomic(path, json.dumps({"key": key, "result": result}, indent=2, default=str))
    return result


class _Seed:
    """Everything of one seed: its trained runs and cached evaluations."""

    def __init__(self, out: Path, data: str, seed: int, quick: bool, progress: bool) -> None:
        self.out, self.data, self.seed, self.quick, self.progress = (out, data, seed, quick,
                                                                     progress)
        self.runs: dict[str, Path] = {}
        self.ranker_metrics: dict[str, Any] = {}

    def train(self) -> None:
        for name, spec in (("ranker", RANKER), ("private-ranker", PRIVATE_RANKER)):
            path = run_dir(self.out, MODEL, spec, self.seed, quick=self.quick)
            log(f"[seed {self.seed}] ranker {spec.slug}", progress=self.progress)
            metrics = ensure_run(path, spec.run_config(data=self.data, model=MODEL,
                                                       seed=self.seed, quick=self.quick),
                                 progress=self.progress)
            self.runs[name] = path
            self.ranker_metrics[name] = metrics["test"]
        base = Path(self.out) / ("recall-runs-quick" if self.quick else "recall-runs")
        for variant in VARIANTS:
            path = base / variant.slug / f"seed{self.seed}"
            config = variant.run_config(self.runs["ranker"], seed=self.seed, quick=self.quick)
            log(f"[seed {self.seed}] recall model {variant.slug}", progress=self.progress)
            if not (is_recall_run(path) and (path / "metrics.json").exists()
                    and RecallRunConfig.from_yaml(path / "recall.yaml")
                    == dataclasses.replace(config, data=self.data).resolved()):
                train_recall_run(dataclasses.replace(config, data=self.data), path,
                                 progress=self.progress)
            self.runs[variant.slug] = path

    def evaluate(self, row: Row) -> dict[str, Any]:
        run = self.runs[row.run]
        serving = (None if row.serving is None
                   else dataclasses.replace(row.serving, seed=self.seed))
        key = {"method": row.method, "serve_noise": row.serve_noise,
               "interest_noise": row.interest_noise, "seed": self.seed,
               "serving": None if serving is None else dataclasses.asdict(serving),
               "checkpoint": checkpoint_stamp(run)}
        cache = run / "recall-evaluations" / f"{row.key}.json"
        return _cached(cache, key, lambda: evaluate_recall_run(
            run, method=row.method, seed=self.seed, serve_noise=row.serve_noise,
            interest_noise=row.interest_noise, serving=serving, record=False,
            progress=self.progress))


def _summaries(results: Sequence[dict[str, Any]], keys: Sequence[str]) -> dict[str, Summary]:
    return {k: summarize(float(r[k]) for r in results) for k in keys}


def _cell(summary: Summary) -> str:
    return format_summary(summary, scale=SCALE, digits=2)


def run_unifedrec(out: Path, *, data: str | None = None, seeds: Sequence[int] = (0, 1, 2),
                  quick: bool = False, progress: bool = True) -> dict[str, Any]:
    """Uni-FedRec Tables 2-4 and Fig. 5 (λ_I sweep): markdown, CSV and PNG in ``out``.

    Returns
    -------
    dict
        ``markdown`` (path of ``unifedrec.md``), ``table`` (its text), ``rows`` (per row its
        summaries), ``sweep`` (Fig. 5 points) and ``png``.
    """
    out = Path(out)
    seeds = check_seeds(seeds)
    watch = Stopwatch()
    data_dir = recall_data(out, data, quick=quick, progress=progress)
    contexts = [_Seed(out, data_dir, seed, quick, progress) for seed in seeds]
    for ctx in contexts:
        ctx.train()
    metric_keys = ([f"future_recall@{k}" for k in RECALL_KS]
                   + [f"history_recall@{k}" for k in RECALL_KS] + ["auc"])
    rows_out: list[dict[str, Any]] = []
    csv_rows: list[dict[str, Any]] = []
    for row in ROWS:
        log(f"[{watch}] evaluating {row.key}", progress=progress)
        results = [ctx.evaluate(row) for ctx in contexts]
        summaries = _summaries(results, metric_keys)
        info = results[0]
        rows_out.append({"row": row, "summaries": summaries,
                         "epsilon": info["query_epsilon_max"],
                         "quotas_in_clear": info["quotas_in_clear"],
                         "bytes": summarize(float(r["bytes_per_query"]) for r in results),
                         "pool": info["pool_size"]})
        csv_rows.append({"row": row.key, "label": row.label, "n_seeds": len(results),
                         "epsilon_per_query_max": info["query_epsilon_max"],
                         "quotas_in_clear": info["quotas_in_clear"],
                         "bytes_per_query_mean": rows_out[-1]["bytes"].mean,
                         **{f"{k}_mean": s.mean for k, s in summaries.items()},
                         **{f"{k}_std": s.std for k, s in summaries.items()}})
    sweep = _interest_noise_sweep(contexts, quick=quick, progress=progress)
    ranker_auc = summarize(ctx.ranker_metrics["ranker"]["auc"] for ctx in contexts)
    markdown = _markdown(rows_out, sweep, ranker_auc, data_dir, seeds, quick)
    md_path = write_text(out / "unifedrec.md", markdown)
    columns = list(csv_rows[0])
    write_csv(out / "unifedrec_tables.csv", csv_rows, columns)
    write_csv(out / "unifedrec_fig5_interest_noise.csv", sweep,
              list(sweep[0]) if sweep else ["interest_noise"])
    png = _plot_sweep(out / "unifedrec_fig5_interest_noise.png", sweep)
    log(f"[{watch}] done", progress=progress)
    return {"markdown": md_path, "table": markdown, "rows": rows_out, "sweep": sweep,
            "png": png, "data": data_dir}


def _interest_noise_sweep(contexts: Sequence[_Seed], *, quick: bool,
                          progress: bool) -> list[dict[str, Any]]:
    points = []
    for noise in (QUICK_INTEREST_NOISES if quick else INTEREST_NOISES):
        row = Row(f"unifedrec_lambda-{noise:g}", f"λ_I = {noise:g}", "unifedrec",
                  "unifedrec-noldp", interest_noise=noise)
        log(f"evaluating {row.key}", progress=progress)
        results = [ctx.evaluate(row) for ctx in contexts]
        s = _summaries(results, ["future_recall@100", "history_recall@100",
                                 "future_recall@400", "history_recall@400", "auc"])
        points.append({"interest_noise": noise,
                       "channel_epsilon": RecallModelConfig(noise_scale=noise).channel_epsilon,
                       "n_seeds": len(results),
                       **{f"{k}_mean": v.mean for k, v in s.items()},
                       **{f"{k}_std": v.std for k, v in s.items()}})
    return points


def _plot_sweep(path: Path, sweep: Sequence[dict[str, Any]]) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 4.6), layout="constrained")
    FigureCanvasAgg(figure)
    ax = figure.add_subplot(1, 1, 1)
    xs = [p["interest_noise"] for p in sweep]
    for key, label in (("future_recall@100", "R@100 of future clicks (utility)"),
                       ("history_recall@100", "R@100 of history clicks (leakage)")):
        ax.errorbar(xs, [p[f"{key}_mean"] * SCALE for p in sweep],
                    yerr=[(p[f"{key}_std"] or 0.0) * SCALE for p in sweep], marker="o",
                    capsize=3, label=label)
    ax.set_xscale("log")
    ax.set_xticks(xs, [f"{p['interest_noise']:g}\n(ε={p['channel_epsilon']:g})" for p in sweep])
    ax.set_xlabel("λ_I (ε per channel = 2δB/λ_I, δ = 0.2, B = 30)")
    ax.set_ylabel(f"recall (×{SCALE:g})")
    ax.set_title("Uni-FedRec Fig. 5 analogue: serving noise λ_I")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    return path


def _markdown(rows: Sequence[dict[str, Any]], sweep: Sequence[dict[str, Any]],
              ranker_auc: Summary, data: str, seeds: Sequence[int], quick: bool) -> str:
    ks = RECALL_KS

    def eps(r: dict[str, Any]) -> str:
        value = r["epsilon"]
        text = "∞ (clear)" if math.isinf(value) else f"{value:g}"
        return text + (" + clear quotas" if r["quotas_in_clear"] else "")

    table2 = markdown_table(
        ["method", *[f"R@{k}" for k in ks], "ε per query", "bytes per query"],
        [[r["row"].label, *[_cell(r["summaries"][f"future_recall@{k}"]) for k in ks], eps(r),
          f"{r['bytes'].mean:.0f}"] for r in rows])
    table3 = markdown_table(
        ["method", *[f"R@{k}" for k in ks]],
        [[r["row"].label, *[_cell(r["summaries"][f"history_recall@{k}"]) for k in ks]]
         for r in rows])
    table4 = markdown_table(
        ["method", "AUC of ranking R = 400 recalled (×100)"],
        [[r["row"].label, _cell(r["summaries"]["auc"])] for r in rows]
        + [["Ranker alone over the impression (no recall stage)", _cell(ranker_auc)]])
    fig5 = markdown_table(
        ["λ_I", "ε per channel", "future R@100", "history R@100", "future R@400",
         "history R@400", "AUC (R = 400)"],
        [[f"{p['interest_noise']:g}", f"{p['channel_epsilon']:g}",
          *[format_summary(Summary(p[f"{k}_mean"], p[f"{k}_std"], p["n_seeds"], ()),
                           scale=SCALE, digits=2)
            for k in ("future_recall@100", "history_recall@100", "future_recall@400",
                      "history_recall@400", "auc")]] for p in sweep])
    pool = rows[0]["pool"] if rows else 0
    lines = [
        "# Uni-FedRec experiments (Uni-FedRec §4 analogues)", "",
        f"- Data: `{data}` (test split; news pool of {pool} news = every news of the data "
        f"set); seeds {', '.join(map(str, seeds))}{' (--quick)' if quick else ''}.",
        "- Rankers: NRMS FedRec (DP-FedRec ε_t = ∞) and PrivateRec ε_t = 10 (paper mode). "
        "Recall models trained on the FedRec ranker's news vectors with FedAdam, "
        f"{QUICK_RECALL_ROUNDS if quick else RECALL_ROUNDS} rounds (LDP training: "
        f"{QUICK_RECALL_ROUNDS if quick else LDP_RECALL_ROUNDS}) of {RECALL_CLIENTS} "
        "clients, pool negatives (K_r = 4) from the training split's news, d_c = 0.5, "
        "scores clipped to [−δ, δ] in training, learned aggregator scale; LDP training = "
        "L1 clip θ = 0.1 + Laplace λ_g = 0.01 (ε = 20 per round and client).",
        "- Recall ×100, mean ± sample std over seeds. ε per query: Uni-FedRec composes its C "
        "channels (2δB/λ_I each; max over users shown); quotas are sent in the clear (no "
        "guarantee) as in the paper.", "",
        "## Table 2 analogue: recall of future clicks (utility, higher is better)", "",
        table2, "",
        "## Table 3 analogue: recall of the query's history clicks (leakage, lower is "
        "better)", "", table3, "",
        "## Table 4 analogue: end-to-end ranking AUC over R = 400 recalled candidates", "",
        table4, "",
        "## Fig. 5 analogue: serving noise λ_I (the model trained without LDP)", "", fig5,
        "",
        "![fig5](unifedrec_fig5_interest_noise.png)", ""]
    return "\n".join(lines)


__all__ = ["INTEREST_NOISES", "RECALL_SYNTH", "ROWS", "VARIANTS", "recall_train_config",
           "run_unifedrec"]
