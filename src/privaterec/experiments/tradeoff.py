"""PrivateRec §4 Figures 4-7: privacy-utility trade-offs, as PNG + CSV + markdown.

* **Fig. 4** ``fig4_serving_epsilon`` — test AUC vs the serving budget ε_s: PrivateRec serving
  of the PrivateRec ε_t = 10 run vs VDP serving of the DP-FedRec ε_t = ∞ (FedRec) run.
* **Fig. 5** ``fig5_padding`` — left: the Laplace scale DPA needs, b = Δ₁/ε′ with the simplex
  sensitivity Δ₁ = 2 and the padding-amplified budget ε′ = ln((e^{ε_s} − p)/(1 − p))
  (docs/privacy.md#dpa-sensitivity, #padding-amplification; pure calibration), vs the padding
  probability p for several ε_s;
  right: serving AUC vs p at ε_s = 10 for the PrivateRec ε_t = 10 run.
* **Fig. 6** ``fig6_train_epsilon`` — test AUC (ε_s = ∞) vs the training budget ε_t,
  PrivateRec vs DP-FedRec.
* **Fig. 7** ``fig7_basis`` — test AUC (ε_t = 10, ε_s = ∞) vs the number of basic vectors B.

Runs come from (or go to) the run cache shared with Tables 1-2
(:mod:`privaterec.experiments.common`). ε = ∞ is drawn as a dashed horizontal line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from privaterec.experiments.common import (SCALE, SERVE_PADDING, TRAIN_EPSILON,
                                           ExperimentMethod, RunSpec, Stopwatch, Summary,
                                           check_models, check_seeds,
                                           format_epsilon, format_summary, log, markdown_table,
                                           model_label, over_seeds, resolve_data, training_budget,
                                           write_csv, write_text)
from privaterec.experiments.plots import Curve, new_figure, plot_curves, save_png, set_log_x
from privaterec.privacy.dpa import dpa_calibration
from privaterec.ondevice.release import ServingConfig

INF = math.inf
PADDING_SERVE_EPSILON = 10.0  # ε_s of Fig. 5 (right)

SERVING_EPSILONS = (0.1, 1.0, 5.0, 10.0, 20.0, 50.0, INF)
QUICK_SERVING_EPSILONS = (1.0, 10.0, INF)
PADDINGS = tuple(round(0.1 * i, 1) for i in range(10))  # 0, 0.1, ..., 0.9
QUICK_PADDINGS = (0.0, 0.5, 0.9)
NOISE_EPSILONS = (1.0, 5.0, 10.0)  # ε_s curves of Fig. 5 (left); calibration only
TRAIN_EPSILONS = (1.0, 10.0, INF)  # the paper adds 5 and 20 (each point: 2 methods x seeds runs)
QUICK_TRAIN_EPSILONS = (1.0, 10.0, INF)
BASIS_SIZES = (2, 3, 5, 10, 20)  # B >= 2: with B = 1, α = softmax of one logit is always 1
QUICK_BASIS_SIZES = (3, 5)

PRIVATEREC_RUN = RunSpec("privaterec", TRAIN_EPSILON, privacy_mode="paper")
FEDREC_RUN = RunSpec("dp-fedrec", INF)

FIGURES = ("fig4_serving_epsilon", "fig5_padding", "fig6_train_epsilon", "fig7_basis")
_AUC_LABEL = f"test AUC (×{SCALE:g})"


def padding_noise_scales(epsilons: Sequence[float] = NOISE_EPSILONS,
                         paddings: Sequence[float] = PADDINGS) -> list[dict[str, float]]:
    """Laplace scale DPA needs for ε_s per query, for each padding probability p (Fig. 5 left).

    b = Δ₁ / ε′ with Δ₁ = 2 (L1 sensitivity of the simplex, docs/privacy.md#dpa-sensitivity) and
    ε′ = ln((e^{ε_s} − p)/(1 − p)) (the budget amplified by padding,
    docs/privacy.md#padding-amplification).

    Returns
    -------
    list of dict
        One row per (ε_s, p): ``epsilon_serve``, ``padding_p``, ``epsilon_base`` (ε′),
        ``noise_scale`` (b).
    """
    rows = []
    for eps in epsilons:
        for p in paddings:
            calibration = dpa_calibration(epsilon=eps, padding_p=p, phase="serve")
            # ε′, the base budget the noise runs at, is what a whole history pays (user level)
            rows.append({"epsilon_serve": float(eps), "padding_p": float(p),
                         "epsilon_base": calibration.user_epsilon,
                         "noise_scale": calibration.scale})
    return rows


def _point_rows(figure: str, x_name: str, curves: Sequence[tuple[str, str, Curve]],
                **extra: Any) -> list[dict[str, Any]]:
    rows = []
    for method, run, curve in curves:
        for x, s in curve.points:
            rows.append({"figure": figure, "method": method, "run": run, x_name: x, **extra,
                         "auc_mean": s.mean, "auc_std": s.std, "n_seeds": s.n,
                         "auc_values": list(s.values)})
    return rows


def _point_table(x_header: str, x_name: str, rows: Sequence[dict[str, Any]],
                 x_format: Any = format_epsilon) -> str:
    cells = []
    for row in rows:
        s = Summary(row["auc_mean"], row["auc_std"], row["n_seeds"], tuple(row["auc_values"]))
        cells.append([row["method"], x_format(row[x_name]), format_summary(s), str(s.n)])
    return markdown_table(["Method", x_header, _AUC_LABEL, "n"], cells)


_AUC_COLUMNS = ["auc_mean", "auc_std", "n_seeds", "auc_values"]


@dataclass
class _Context:
    """What every figure needs: where runs live and how to get a point's AUC summary."""

    out: Path
    data: str
    model: str
    seeds: tuple[int, ...]
    quick: bool
    progress: bool
    watch: Stopwatch = field(default_factory=Stopwatch)

    @property
    def label(self) -> str:
        return model_label(self.model)

    def auc(self, spec: RunSpec, serving: ServingConfig | None, what: str) -> Summary:
        """AUC over the seeds of ``spec`` (its training metrics, or under ``serving``)."""
        log(f"[tradeoff {self.watch}] {what}", progress=self.progress)
        _, summaries = over_seeds(self.out, self.data, self.model, spec, self.seeds,
                                  quick=self.quick, progress=self.progress, serving=serving)
        return summaries["auc"]


def _fig4(ctx: _Context) -> tuple[dict[str, Any], list[str]]:
    """Serving AUC vs ε_s: PrivateRec serving vs VDP."""
    epsilons = QUICK_SERVING_EPSILONS if ctx.quick else SERVING_EPSILONS
    private, vdp = Curve("PrivateRec serving (ε_t = 10)"), Curve("VDP serving (FedRec, ε_t = ∞)")
    for eps in epsilons:
        private.points.append((eps, ctx.auc(PRIVATEREC_RUN, ServingConfig(
            kind="privaterec", epsilon=eps, padding_p=SERVE_PADDING),
            f"fig4 PrivateRec serving ε_s={format_epsilon(eps)}")))
        vdp.points.append((eps, ctx.auc(FEDREC_RUN, ServingConfig(kind="vdp", epsilon=eps),
                                        f"fig4 VDP serving ε_s={format_epsilon(eps)}")))
    fig, (ax,) = new_figure()
    plot_curves(ax, [private, vdp], infinity_label="ε_s")
    set_log_x(ax, epsilons)
    ax.set(xlabel="serving budget ε_s per query (log scale)", ylabel=_AUC_LABEL,
           title=f"Fig. 4: private serving, {ctx.label} (PrivateRec p = {SERVE_PADDING:g})")
    rows = _point_rows("fig4", "epsilon_serve", [("PrivateRec", PRIVATEREC_RUN.slug, private),
                                                 ("VDP", FEDREC_RUN.slug, vdp)])
    entry = _save(ctx.out, "fig4_serving_epsilon", fig, rows,
                  ["figure", "method", "run", "epsilon_serve", *_AUC_COLUMNS])
    return entry, ["## Fig. 4: test AUC vs serving budget ε_s", "",
                   "PrivateRec serving of the PrivateRec ε_t = 10 run (B = 5, padding p = "
                   f"{SERVE_PADDING:g}) vs VDP serving of the DP-FedRec ε_t = ∞ (FedRec) run.",
                   "", _point_table("ε_s", "epsilon_serve", rows), "",
                   "![fig4](fig4_serving_epsilon.png)", ""]


def _fig5(ctx: _Context) -> tuple[dict[str, Any], list[str]]:
    """Left: DPA noise scale vs p (calibration); right: serving AUC vs p."""
    noise = padding_noise_scales(NOISE_EPSILONS, PADDINGS)
    paddings = QUICK_PADDINGS if ctx.quick else PADDINGS
    padded = Curve(f"PrivateRec serving, ε_s = {PADDING_SERVE_EPSILON:g}")
    for p in paddings:
        padded.points.append((p, ctx.auc(PRIVATEREC_RUN, ServingConfig(
            kind="privaterec", epsilon=PADDING_SERVE_EPSILON, padding_p=p),
            f"fig5 PrivateRec serving p={p:g}")))
    fig, (left, right) = new_figure(columns=2)
    for index, eps in enumerate(NOISE_EPSILONS):
        points = [r for r in noise if r["epsilon_serve"] == eps]
        left.plot([r["padding_p"] for r in points], [r["noise_scale"] for r in points],
                  marker="o", color=f"C{index}", label=f"ε_s = {eps:g}")
    left.set_yscale("log")
    from matplotlib.ticker import FuncFormatter
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    left.yaxis.set_major_formatter(plain)
    left.yaxis.set_minor_formatter(plain)
    left.grid(True, alpha=0.3)
    left.legend(fontsize=8)
    left.set(xlabel="padding probability p", ylabel="Laplace noise scale b = 2 / ε′ (log)",
             title="DPA noise needed per query")
    plot_curves(right, [padded], infinity_label="p")
    right.set(xlabel="padding probability p", ylabel=_AUC_LABEL,
              title=f"Serving AUC vs p, {ctx.label} (PrivateRec ε_t = 10)")
    fig.suptitle("Fig. 5: privacy amplification by behaviour padding")
    auc_rows = _point_rows("fig5", "padding_p", [("PrivateRec", PRIVATEREC_RUN.slug, padded)],
                           panel="auc", epsilon_serve=PADDING_SERVE_EPSILON)
    rows = [{"figure": "fig5", "panel": "noise_scale", "method": "DPA calibration",
             "run": "", **r} for r in noise] + auc_rows
    entry = _save(ctx.out, "fig5_padding", fig, rows,
                  ["figure", "panel", "method", "run", "epsilon_serve", "padding_p",
                   "epsilon_base", "noise_scale", *_AUC_COLUMNS])
    noise_cells = [[f"{eps:g}"] + [f"{r['noise_scale']:.4g}" for r in noise
                                   if r["epsilon_serve"] == eps] for eps in NOISE_EPSILONS]
    return entry, ["## Fig. 5: behaviour padding", "",
                   "Left: Laplace scale b = 2/ε′ of DPA per query, ε′ = ln((e^ε_s − p)/(1 − p)) "
                   "(simplex sensitivity 2, padding-amplified budget; calibration only).", "",
                   markdown_table(["ε_s", *[f"p = {p:g}" for p in PADDINGS]], noise_cells),
                   "", f"Right: PrivateRec serving at ε_s = {PADDING_SERVE_EPSILON:g} of the "
                   "PrivateRec ε_t = 10 run.", "",
                   _point_table("p", "padding_p", auc_rows, x_format=lambda p: f"{p:g}"), "",
                   "![fig5](fig5_padding.png)", ""]


def _fig6(ctx: _Context) -> tuple[dict[str, Any], list[str]]:
    """Training AUC (ε_s = ∞) vs ε_t: PrivateRec vs DP-FedRec."""
    epsilons = QUICK_TRAIN_EPSILONS if ctx.quick else TRAIN_EPSILONS
    methods: tuple[tuple[str, ExperimentMethod, Curve], ...] = (
        ("PrivateRec", "privaterec", Curve("PrivateRec (paper mode)")),
        ("DP-FedRec", "dp-fedrec", Curve("DP-FedRec")))
    rows: list[dict[str, Any]] = []
    for eps in epsilons:
        for name, method, curve in methods:
            spec = RunSpec(method, eps)
            curve.points.append((eps, ctx.auc(spec, None,
                                              f"fig6 {name} ε_t={format_epsilon(eps)}")))
    for name, method, curve in methods:
        rows += [{**row, "run": RunSpec(method, row["epsilon_train"]).slug}
                 for row in _point_rows("fig6", "epsilon_train", [(name, "", curve)])]
    fig, (ax,) = new_figure()
    plot_curves(ax, [curve for _, _, curve in methods], infinity_label="ε_t")
    set_log_x(ax, epsilons)
    ax.set(xlabel="training budget ε_t per round (log scale)", ylabel=_AUC_LABEL,
           title=f"Fig. 6: private training, {ctx.label} (ε_s = ∞)")
    entry = _save(ctx.out, "fig6_train_epsilon", fig, rows,
                  ["figure", "method", "run", "epsilon_train", *_AUC_COLUMNS])
    return entry, ["## Fig. 6: test AUC vs training budget ε_t (ε_s = ∞)", "",
                   _point_table("ε_t", "epsilon_train", rows), "",
                   "![fig6](fig6_train_epsilon.png)", ""]


def _fig7(ctx: _Context) -> tuple[dict[str, Any], list[str]]:
    """Training AUC (ε_t = 10, ε_s = ∞) vs the number of basic vectors B."""
    sizes = QUICK_BASIS_SIZES if ctx.quick else BASIS_SIZES
    curve = Curve(f"PrivateRec (ε_t = {TRAIN_EPSILON:g}, ε_s = ∞)")
    for size in sizes:
        spec = RunSpec("privaterec", TRAIN_EPSILON, basis_size=size)
        curve.points.append((float(size), ctx.auc(spec, None, f"fig7 PrivateRec B={size}")))
    fig, (ax,) = new_figure()
    plot_curves(ax, [curve], infinity_label="B")
    set_log_x(ax, [float(b) for b in sizes])
    ax.set(xlabel="number of basic vectors B (log scale)", ylabel=_AUC_LABEL,
           title=f"Fig. 7: basic vectors, {ctx.label}")
    rows = _point_rows("fig7", "basis_size", [("PrivateRec", "", curve)])
    for row in rows:
        row["basis_size"] = int(row["basis_size"])
        row["run"] = RunSpec("privaterec", TRAIN_EPSILON, basis_size=row["basis_size"]).slug
    entry = _save(ctx.out, "fig7_basis", fig, rows,
                  ["figure", "method", "run", "basis_size", *_AUC_COLUMNS])
    return entry, ["## Fig. 7: test AUC vs number of basic vectors B (ε_t = 10, ε_s = ∞)", "",
                   _point_table("B", "basis_size", rows, x_format=str), "",
                   "![fig7](fig7_basis.png)", ""]


_FIGURE_BUILDERS = {"fig4_serving_epsilon": _fig4, "fig5_padding": _fig5,
                    "fig6_train_epsilon": _fig6, "fig7_basis": _fig7}


def run_tradeoff(out: Path, *, data: str | None = None, model: str = "nrms",
                 seeds: Sequence[int] = (0, 1, 2), quick: bool = False,
                 progress: bool = True) -> dict[str, Any]:
    """PrivateRec Figures 4-7 for one model: PNGs, CSVs and ``tradeoff.md`` in ``out``.

    Parameters
    ----------
    out:
        Output directory (run cache shared with :func:`~privaterec.experiments.paper.run_table1`).
    data:
        MIND-format directory with ``train/`` and ``test/``; ``None``: the demo's synthetic data.
    model:
        News encoder of every run.
    seeds:
        Training seeds; each plotted point is the mean ± std over them (serving noise is
        seeded with the run's seed).
    quick:
        Fewer points per curve (``QUICK_*`` grids) and the quick training budget.
    progress:
        Progress lines and bars on stderr.

    Returns
    -------
    dict
        ``markdown`` (path of ``tradeoff.md``), ``table`` (its text) and ``figures``: per
        figure name its ``png`` and ``csv`` paths and plotted ``points`` (the CSV's rows).
    """
    out = Path(out)
    (model,) = check_models([model])
    ctx = _Context(out, resolve_data(out, data, quick=quick, progress=progress), model,
                   check_seeds(seeds), quick, progress)
    figures: dict[str, dict[str, Any]] = {}
    sections: list[str] = []
    for name in FIGURES:
        figures[name], section = _FIGURE_BUILDERS[name](ctx)
        sections += section
    rounds, _ = training_budget(quick)
    header = [f"# Trade-offs (PrivateRec §4, Figs. 4-7): {ctx.label}", "",
              f"- Data: `{ctx.data}` (test split); federated runs: {rounds} rounds"
              f"{' (--quick)' if quick else ''}; seeds {', '.join(map(str, ctx.seeds))}.",
              f"- Test AUC ×{SCALE:g}, mean ± sample std (ddof = 1) over seeds; n = number of "
              "seeds (n = 1: no std). ε = ∞ is drawn as a dashed line.",
              "- Budgets are per query (ε_s) and per round and client (ε_t), Laplace, δ = 0; "
              "PrivateRec runs in paper mode (the history-path gradient is not covered by ε_t: "
              "docs/privacy.md#paper-and-strict-mode).", ""]
    markdown = "\n".join(header + sections)
    md_path = write_text(out / "tradeoff.md", markdown)
    return {"markdown": md_path, "table": markdown, "figures": figures, "data": ctx.data}


def _save(out: Path, name: str, figure: Any, rows: list[dict[str, Any]],
          columns: Sequence[str]) -> dict[str, Any]:
    png = save_png(figure, out / f"{name}.png")
    csv_path = write_csv(out / f"{name}.csv", rows, columns)
    return {"png": png, "csv": csv_path, "points": rows}


__all__ = ["BASIS_SIZES", "FIGURES", "NOISE_EPSILONS", "PADDINGS", "QUICK_BASIS_SIZES",
           "QUICK_PADDINGS", "QUICK_SERVING_EPSILONS", "QUICK_TRAIN_EPSILONS",
           "SERVING_EPSILONS", "TRAIN_EPSILONS", "padding_noise_scales", "run_tradeoff"]
