"""A generic, strong distinguisher between two sets of uploads, and its ε lower bound.

Uploads on two neighbouring datasets D and D′ (every number the server received, flattened
into one row ``[p]`` per run) come in three disjoint sets of runs:

1. *learn* runs fit about 40 candidate statistics — every metadata column on its own;
   projections of the upload on the difference of the means (raw and divided by the
   variances); Laplace likelihood ratios around the per-coordinate medians; the 8
   coordinates, absolute values of coordinates and zero indicators whose means differ most;
   signed sums of the 16 most different absolute values and zero indicators; the L1 and L2
   norms. The learn runs may be *paired* (run i on D and on D′ with the same generator
   seed: common random numbers), so that noise drawn alike cancels in ``x1 − x0`` and the
   difference of the means — often a few 1e-5 per coordinate under noise of 1e-3 — is
   estimated from a few hundred runs; the learn runs never enter the bound;
2. *select* runs (independent) choose each statistic's best threshold and direction, and
   the best statistic (largest Clopper–Pearson bound on them);
3. *test* runs (independent): the chosen test — fixed before these runs are looked at —
   gives false-positive and false-negative counts, and

   ε_lb = max{ ln((1 − δ − FNR⁺)/FPR⁺), ln((1 − δ − FPR⁺)/FNR⁺), 0 }

   where FPR⁺ and FNR⁺ are one-sided Clopper–Pearson upper bounds, each at level α/2
   (:func:`~privaterec.privacy.audit.clopper_pearson_interval` with ``alpha``), so ε_lb is a
   lower bound on the ε of any (ε, δ)-DP release with probability ≥ 1 − α (Kairouz, Oh &
   Viswanath 2015; Jagielski, Ullman & Oprea 2020; Nasr et al. 2021).

With n test runs per side even a perfect test gives at most ``ceiling`` =
ln((1 − δ − u)/u), u = 1 − (α/2)^{1/n} (≈ 4.9 for n = 500): an audit cannot refute a
claim above its ceiling.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence, SupportsIndex

import numpy as np

from privaterec.errors import ConfigError
from privaterec.privacy.audit import clopper_pearson_interval, epsilon_from_rates

TOP_COORDINATES = 8
GROUP_SIZE = 16

Statistic = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class DistinguisherResult:
    """The chosen test and its bound on the test runs.

    statistic: name of the chosen statistic; direction ``"greater"`` says D′ when the
    statistic exceeds ``threshold``, ``"less"`` when below. Rates are measured on the
    ``n_test`` test runs per side; ``fpr_upper``/``fnr_upper`` are their one-sided
    Clopper–Pearson bounds at level α/2; ``selection_bound`` is the (optimistic) bound the
    test had on the select runs.
    """

    epsilon_lower_bound: float
    statistic: str
    threshold: float
    direction: str
    false_positive_rate: float
    false_negative_rate: float
    fpr_upper: float
    fnr_upper: float
    n_test: int
    ceiling: float
    selection_bound: float
    alpha: float
    delta: float


def bound_ceiling(n: int, *, alpha: float = 0.05, delta: float = 0.0) -> float:
    """The largest ε lower bound ``n`` test runs per side can give (no error at all)."""
    _, upper = clopper_pearson_interval(0, n, alpha)
    return float(epsilon_from_rates(upper, upper, delta))


@lru_cache(maxsize=64)
def _cp_upper(n: int, alpha: float) -> np.ndarray:
    """One-sided (level α/2) Clopper–Pearson upper bounds of k/n for k = 0 … n."""
    _, upper = clopper_pearson_interval(np.arange(n + 1), np.full(n + 1, n), alpha)
    return np.asarray(upper, dtype=float)


def _bounds(fp: np.ndarray, n0: int, fn: np.ndarray, n1: int, alpha: float,
            delta: float) -> np.ndarray:
    fpr_u = _cp_upper(n0, alpha)[fp.astype(int)]
    fnr_u = _cp_upper(n1, alpha)[fn.astype(int)]
    return np.asarray(epsilon_from_rates(fpr_u, fnr_u, delta), dtype=float).reshape(-1)


def best_threshold(s0: np.ndarray, s1: np.ndarray, *, alpha: float,
                   delta: float) -> tuple[float, float, str]:
    """(bound, threshold, direction) of the best threshold test on scalars ``s0``, ``s1``.

    Thresholds are the midpoints between consecutive distinct pooled values (and beyond the
    ends); among thresholds with the best bound the middle one is taken, so a clean gap is
    split in its middle.
    """
    values = np.unique(np.concatenate([s0, s1]))
    if values.size == 1 or not np.all(np.isfinite(values)):
        finite = values[np.isfinite(values)]
        if finite.size <= 1:
            return 0.0, float(finite[0]) if finite.size else 0.0, "greater"
        values = finite
    mids = np.concatenate([[values[0] - 1.0], (values[:-1] + values[1:]) / 2,
                           [values[-1] + 1.0]])
    a0, a1 = np.sort(s0), np.sort(s1)
    best = (-1.0, 0.0, "greater")
    # "greater": says D′ when s > t: FP = #(s0 > t), FN = #(s1 <= t); "less" mirrored.
    above0 = a0.size - np.searchsorted(a0, mids, side="right")
    above1 = a1.size - np.searchsorted(a1, mids, side="right")
    for direction, fp, fn in (("greater", above0, a1.size - above1),
                              ("less", a0.size - above0, above1)):
        eps = _bounds(fp.astype(float), a0.size, fn.astype(float), a1.size, alpha, delta)
        top = float(eps.max())
        if top > best[0]:
            where = np.flatnonzero(eps >= top - 1e-12)
            best = (top, float(mids[where[where.size // 2]]), direction)
    return best


def _floor(values: np.ndarray) -> float:
    positive = values[values > 0]
    return float(1e-6 * np.median(positive)) if positive.size else 1.0


def _column(j: SupportsIndex) -> Statistic:
    return lambda x: x[:, j]


def _abs_column(j: SupportsIndex) -> Statistic:
    return lambda x: np.abs(x[:, j])


def _is_zero(j: SupportsIndex) -> Statistic:
    return lambda x: (x[:, j] == 0) * 1.0


def _projection(w: np.ndarray) -> Statistic:
    return lambda x: x @ w


def _abs_projection(group: np.ndarray, w: np.ndarray) -> Statistic:
    return lambda x: np.abs(x[:, group]) @ w


def _zeros_projection(group: np.ndarray, w: np.ndarray) -> Statistic:
    return lambda x: (x[:, group] == 0) @ w


def _laplace_llr(c0: np.ndarray, c1: np.ndarray, scale: np.ndarray) -> Statistic | None:
    keep = c0 != c1
    if not keep.any():
        return None
    a, b, sc = c0[keep], c1[keep], scale[keep] + _floor(scale)
    return lambda x: ((np.abs(x[:, keep] - a) - np.abs(x[:, keep] - b)) / sc).sum(1)


def candidate_statistics(l0: np.ndarray, l1: np.ndarray,
                         names: Sequence[str], metadata: Sequence[int], *,
                         paired: bool = False) -> list[tuple[str, Statistic]]:
    """The candidate statistics learned on the learn runs ``l0``, ``l1`` ``[r, p]``.

    ``names`` name the p columns; ``metadata`` are the column indices of scalar fields
    (everything sent besides the payload), each of which is a statistic of its own.
    ``paired``: row i of ``l0`` and of ``l1`` used the same generator seed (module doc).
    """
    stats: list[tuple[str, Statistic]] = []
    for j in metadata:
        stats.append((names[j], _column(j)))
    m0, m1 = l0.mean(0), l1.mean(0)
    v0, v1 = l0.var(0), l1.var(0)
    diff = m1 - m0
    var = v0 + v1
    floor = _floor(var)
    med0, med1 = np.median(l0, 0), np.median(l1, 0)
    scale = (np.abs(l0 - med0).mean(0) + np.abs(l1 - med1).mean(0)) / 2
    if paired:
        # Coordinates where the neighbours' outputs differ at all, and by how much on average.
        moved = (l1 != l0).any(0)
        pdiff = np.where(moved, (l1 - l0).mean(0), 0.0)
        stats.append(("paired mean-difference projection", _projection(pdiff)))
        stats.append(("paired variance-weighted projection",
                      _projection(pdiff / (var + floor))))
        llr = _laplace_llr(med0, med0 + pdiff, scale)
        if llr is not None:
            stats.append(("paired Laplace likelihood ratio", llr))
    stats.append(("mean-difference projection", _projection(diff)))
    stats.append(("variance-weighted projection", _projection(diff / (var + floor))))
    llr = _laplace_llr(med0, med1, scale)
    if llr is not None:
        stats.append(("Laplace likelihood ratio", llr))
    sd = np.sqrt(var / 2)
    score = np.abs(diff) / (sd + floor)
    for j in np.argsort(-score, kind="stable")[:TOP_COORDINATES]:
        if score[j] > 0:
            stats.append((f"coordinate {names[j]}", _column(j)))
    a0, a1 = np.abs(l0), np.abs(l1)
    adiff = a1.mean(0) - a0.mean(0)
    asd = np.sqrt((a0.var(0) + a1.var(0)) / 2)
    ascore = np.abs(adiff) / (asd + _floor(asd))
    order = np.argsort(-ascore, kind="stable")
    for j in order[:TOP_COORDINATES]:
        if ascore[j] > 0:
            stats.append((f"|coordinate {names[j]}|", _abs_column(j)))
    group = order[:GROUP_SIZE][ascore[order[:GROUP_SIZE]] > 0]
    if group.size:
        w = np.sign(adiff[group]) / (asd[group] + _floor(asd))
        stats.append(("signed sum of |coordinates|", _abs_projection(group, w)))
    z0, z1 = (l0 == 0).mean(0), (l1 == 0).mean(0)
    zdiff = z1 - z0
    zorder = np.argsort(-np.abs(zdiff), kind="stable")
    zgroup = zorder[:GROUP_SIZE][np.abs(zdiff[zorder[:GROUP_SIZE]]) > 0]
    for j in zgroup[:TOP_COORDINATES]:
        stats.append((f"coordinate {names[j]} == 0", _is_zero(j)))
    if zgroup.size:
        stats.append(("signed count of zeros",
                      _zeros_projection(zgroup, np.sign(zdiff[zgroup]))))
    stats.append(("L1 norm", lambda x: np.abs(x).sum(1)))
    stats.append(("L2 norm", lambda x: np.sqrt((x * x).sum(1))))
    return stats


def distinguish(learn: tuple[np.ndarray, np.ndarray], select: tuple[np.ndarray, np.ndarray],
                test: tuple[np.ndarray, np.ndarray], names: Sequence[str], *,
                metadata: Sequence[int] = (), paired: bool = False, alpha: float = 0.05,
                delta: float = 0.0) -> DistinguisherResult:
    """Learn, select and test a distinguisher of D and D′ (module docstring).

    Parameters
    ----------
    learn, select, test:
        ``(x0, x1)``, each ``[r, p]`` float64: uploads on D and on D′, one run per row, in
        three disjoint sets of runs (select and test independent of everything else; each
        set ≥ 2 runs per side).
    names:
        The p column names (e.g. ``payload[17]``, ``num_examples``).
    metadata:
        Indices of the scalar (non-payload) columns.
    paired:
        Whether the learn runs are paired (same seed on D and D′).
    alpha:
        Miscoverage of the bound (α/2 for each rate).
    delta:
        The δ of the claim audited.

    Returns
    -------
    DistinguisherResult
    """
    if not (0 < alpha < 1):
        raise ConfigError(f"invalid audit parameter 'alpha': got {alpha!r}, expected (0, 1)")
    if not (0 <= delta < 1):
        raise ConfigError(f"invalid audit parameter 'delta': got {delta!r}, expected [0, 1)")
    parts = []
    for part in (learn, select, test):
        x0, x1 = part
        if x0.ndim != 2 or x1.ndim != 2 or x0.shape[1] != len(names) or \
                x1.shape[1] != len(names) or min(x0.shape[0], x1.shape[0]) < 2:
            raise ConfigError(f"uploads must be [r >= 2, p] arrays with p = {len(names)} "
                              f"names, got {x0.shape} and {x1.shape}")
        parts.append(tuple(np.nan_to_num(x.astype(np.float64), nan=0.0, posinf=1e300,
                                         neginf=-1e300) for x in (x0, x1)))
    (l0, l1), (s0, s1), (e0, e1) = parts
    if paired and l0.shape != l1.shape:
        raise ConfigError("paired learn runs need the same number of runs on D and D'")
    stats = candidate_statistics(l0, l1, names, metadata, paired=paired)
    chosen = (-1.0, "", 0.0, "greater", stats[0][1])
    with np.errstate(all="ignore"):
        for name, fn in stats:
            bound, threshold, direction = best_threshold(fn(s0), fn(s1), alpha=alpha,
                                                         delta=delta)
            if bound > chosen[0]:
                chosen = (bound, name, threshold, direction, fn)
        selection_bound, name, threshold, direction, fn = chosen
        t0, t1 = fn(e0), fn(e1)
    return _tested(t0, t1, name=name, threshold=threshold, direction=direction,
                   selection_bound=selection_bound, alpha=alpha, delta=delta)


def _tested(t0: np.ndarray, t1: np.ndarray, *, name: str, threshold: float, direction: str,
            selection_bound: float, alpha: float, delta: float) -> DistinguisherResult:
    """The bound of a threshold test chosen on the selection runs, measured on the test
    runs' statistics ``t0`` ``[n0]`` (world 0) and ``t1`` ``[n1]`` (world 1): Clopper–Pearson
    upper limits of its error rates at level ``alpha``, turned into ε at ``delta``."""
    says0 = t0 > threshold if direction == "greater" else t0 < threshold
    says1 = t1 > threshold if direction == "greater" else t1 < threshold
    n0, n1 = t0.size, t1.size
    fp, fn_count = int(says0.sum()), int(n1 - says1.sum())
    _, fpr_u = clopper_pearson_interval(fp, n0, alpha)
    _, fnr_u = clopper_pearson_interval(fn_count, n1, alpha)
    return DistinguisherResult(
        epsilon_lower_bound=float(epsilon_from_rates(fpr_u, fnr_u, delta)), statistic=name,
        threshold=threshold, direction=direction, false_positive_rate=fp / n0,
        false_negative_rate=fn_count / n1, fpr_upper=float(fpr_u), fnr_upper=float(fnr_u),
        n_test=min(n0, n1), ceiling=bound_ceiling(min(n0, n1), alpha=alpha, delta=delta),
        selection_bound=float(selection_bound), alpha=alpha, delta=delta)


FIXED_THRESHOLDS = 1024


def _strict_threshold(s0: np.ndarray, s1: np.ndarray, *, alpha: float,
                      delta: float) -> tuple[float, float, str]:
    """(strict bound, threshold, direction) of the best quantile threshold
    (:func:`fixed_statistic_bound`)."""
    pooled = np.concatenate([s0, s1])
    cand = np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, FIXED_THRESHOLDS)))
    level = alpha / (2 * cand.size)
    best = (-1.0, float(cand[0]), "greater")
    a0, a1 = np.sort(s0), np.sort(s1)
    above0 = a0.size - np.searchsorted(a0, cand, side="right")
    above1 = a1.size - np.searchsorted(a1, cand, side="right")
    below0 = np.searchsorted(a0, cand, side="left")
    below1 = np.searchsorted(a1, cand, side="left")
    # "greater": says D' when s > t: FP = #(s0 > t), FN = #(s1 <= t); "less": s < t
    for direction, fp, fn in (("greater", above0, a1.size - above1),
                              ("less", below0, a1.size - below1)):
        _, fpr_u = clopper_pearson_interval(fp.astype(float), np.full(cand.size, a0.size),
                                            level)
        _, fnr_u = clopper_pearson_interval(fn.astype(float), np.full(cand.size, a1.size),
                                            level)
        eps = np.asarray(epsilon_from_rates(fpr_u, fnr_u, delta), dtype=float).reshape(-1)
        i = int(np.argmax(eps))
        if eps[i] > best[0]:
            best = (float(eps[i]), float(cand[i]), direction)
    return best


def fixed_statistic_bound(select: tuple[np.ndarray, np.ndarray],
                          test: tuple[np.ndarray, np.ndarray], *, name: str,
                          alpha: float = 0.05, delta: float = 0.0) -> DistinguisherResult:
    """The bound of one statistic fixed in advance (e.g. a canary's likelihood ratio):
    the select runs ``(s0, s1)`` ``[r]`` choose its threshold and direction among
    :data:`FIXED_THRESHOLDS` quantiles of the pooled select runs, each scored at the
    Bonferroni-strict level α/(2 × candidates) (a plain maximum picks a far-tail threshold
    whose handful of counts looked lucky on the select runs and bounds far less on the test
    runs: the winner's curse), the independent test runs ``(t0, t1)`` give the rates and the
    Clopper–Pearson bound (module docstring)."""
    if not (0 < alpha < 1):
        raise ConfigError(f"invalid audit parameter 'alpha': got {alpha!r}, expected (0, 1)")
    s0, s1 = (np.asarray(x, dtype=np.float64).reshape(-1) for x in select)
    t0, t1 = (np.asarray(x, dtype=np.float64).reshape(-1) for x in test)
    if min(s0.size, s1.size, t0.size, t1.size) < 2:
        raise ConfigError("fixed_statistic_bound needs at least 2 runs per side and part")
    selection_bound, threshold, direction = _strict_threshold(s0, s1, alpha=alpha, delta=delta)
    return _tested(t0, t1, name=name, threshold=threshold, direction=direction,
                   selection_bound=selection_bound, alpha=alpha, delta=delta)



__all__ = ["DistinguisherResult", "best_threshold", "bound_ceiling", "candidate_statistics",
           "fixed_statistic_bound",
           "distinguish"]
