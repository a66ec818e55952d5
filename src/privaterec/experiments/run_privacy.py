"""What a training run's ledger says about its privacy, for the experiment tables.

:func:`ledger_epsilon` reads ``RUN/privacy.json``: the largest and the median per-user total
of the training phase at user-level adjacency (one user's data replaced), the largest at
one-click adjacency, and whether every recorded guarantee holds. :func:`epsilon_cell` prints
it, with the reason when a total is ∞.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from privaterec.privacy.report import read_privacy_json


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


def short_epsilon(info: LedgerEpsilon) -> str:
    """The user-level ε of a legend entry (max over users)."""
    if not info.valid:
        return "∞ (stated ε does not hold)"
    if math.isinf(info.user_max) and math.isfinite(info.click_max):
        return "∞ (one click only)"
    return format_large(info.user_max)


__all__ = ["LedgerEpsilon", "combine_ledgers", "epsilon_cell", "format_large", "ledger_epsilon",
           "short_epsilon"]
