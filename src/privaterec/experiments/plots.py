"""Matplotlib helpers shared by the experiment figures (Agg backend, no pyplot state).

* :class:`Curve` — one plotted line of AUC summaries (its ``inf`` point drawn apart);
* :func:`plot_curves` — error-bar lines, ``inf`` points as dashed horizontal lines;
* :func:`new_figure`, :func:`set_log_x`, :func:`save_png`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from privaterec.experiments.common import SCALE, Summary


@dataclass
class Curve:
    """One plotted line: x values with the AUC summary at each (x may be ``inf``)."""

    label: str
    points: list[tuple[float, Summary]] = field(default_factory=list)

    def finite(self) -> list[tuple[float, Summary]]:
        return [(x, s) for x, s in self.points if math.isfinite(x)]

    def at_infinity(self) -> Summary | None:
        return next((s for x, s in self.points if math.isinf(x)), None)


def plot_curves(ax: Any, curves: Sequence[Curve], *, infinity_label: str,
                colors: Sequence[str] | None = None) -> None:
    """Error-bar lines of the finite points (metrics × :data:`SCALE`); ``inf`` as a dashed
    line of the same colour (``colors``: one per curve, default ``C0``, ``C1``, ...)."""
    for index, curve in enumerate(curves):
        color = colors[index] if colors is not None else f"C{index}"
        finite = curve.finite()
        if finite:
            xs = [x for x, _ in finite]
            ys = [s.mean * SCALE for _, s in finite]
            errs = [(s.std or 0.0) * SCALE for _, s in finite]
            ax.errorbar(xs, ys, yerr=errs if any(errs) else None, marker="o", capsize=3,
                        color=color, label=curve.label)
        top = curve.at_infinity()
        if top is not None:
            ax.axhline(top.mean * SCALE, linestyle="--", color=color,
                       label=f"{curve.label}, {infinity_label} = ∞")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def new_figure(columns: int = 1, *, width: float = 6.4,
               height: float = 4.6) -> tuple[Any, list[Any]]:
    """A figure with ``columns`` side-by-side axes (each ``width`` × ``height`` inches)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width * columns, height), layout="constrained")
    FigureCanvasAgg(figure)  # Agg backend without touching pyplot's global state
    axes = [figure.add_subplot(1, columns, i + 1) for i in range(columns)]
    return figure, axes


def set_log_x(ax: Any, values: Sequence[float]) -> None:
    """Log-scale x axis with one plain tick per finite positive value (two or more)."""
    finite = sorted({v for v in values if math.isfinite(v) and v > 0})
    if len(finite) >= 2:
        from matplotlib.ticker import FixedLocator, NullLocator
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator(finite))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([f"{v:g}" for v in finite])


def save_png(figure: Any, path: Path, *, dpi: int = 120) -> Path:
    """Write ``figure`` to ``path`` as PNG, creating parent directories."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    return path


__all__ = ["Curve", "new_figure", "plot_curves", "save_png", "set_log_x"]
