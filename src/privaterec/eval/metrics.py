"""Ranking metrics of news recommendation: AUC, MRR, nDCG@k (per impression) and recall@K.

AUC, MRR and nDCG@k follow MIND's official evaluation script (Wu et al., "MIND: A Large-scale
Dataset for News Recommendation", ACL 2020; ``evaluate.py`` of the MIND competition), where each
metric is computed per impression and then averaged over impressions. Recall@K is the
Uni-FedRec recall metric (``papers/uni-fedrec.md`` §4): the share of a user's relevant news
(future clicks for utility, history clicks for leakage) among the top K recalled news.

Ties
----
* :func:`auc` is tie-aware: it is the Mann–Whitney statistic with average ranks, so a tied
  (positive, negative) pair counts one half. This equals scikit-learn's ``roc_auc_score``,
  which the official scorer calls.
* :func:`mrr` and :func:`ndcg` reproduce the official scorer exactly, including its tie
  handling: candidates are ordered by ``np.argsort(scores)[::-1]`` with numpy's default sort
  kind. Tied candidates are therefore ordered as numpy's default (not guaranteed stable) argsort
  leaves them, reversed; for small arrays this puts the *later* of two tied candidates first.
  The value with ties depends on the candidate order and numpy's sort implementation, exactly
  as the official scorer's does. Untied scores give a well-defined value.

Labels are binary (0 = shown and not clicked, 1 = clicked); scores are finite reals, higher
meaning more likely clicked.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
from scipy.stats import rankdata

NDCG_CUTOFFS = (5, 10)


def _check_impression(labels: Sequence[int] | np.ndarray,
                      scores: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validate one impression; return ``(labels int64[n], scores float64[n])``."""
    y = np.asarray(labels)
    s = np.asarray(scores, dtype=np.float64)
    if y.ndim != 1 or s.ndim != 1:
        raise ValueError(f"labels and scores must be 1-D, got shapes {y.shape} and {s.shape}")
    if y.shape != s.shape:
        raise ValueError(f"labels and scores differ in length: {y.shape[0]} labels, "
                         f"{s.shape[0]} scores")
    if y.size == 0:
        raise ValueError("empty impression: labels and scores must hold at least one candidate")
    if not np.isin(y, (0, 1)).all():
        bad = y[~np.isin(y, (0, 1))][0]
        raise ValueError(f"labels must be 0 or 1, got {bad!r}")
    if not np.isfinite(s).all():
        raise ValueError("scores must be finite (got NaN or infinity); check the model output")
    return y.astype(np.int64), s


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")


def _auc(y: np.ndarray, s: np.ndarray) -> float:
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        kind = "positive" if n_pos == 0 else "negative"
        raise ValueError(f"AUC is undefined for an impression without any {kind} label "
                         f"({y.size} candidates, all labelled {1 if n_neg == 0 else 0})")
    ranks = rankdata(s)  # average ranks: ties share the mean rank
    u = float(ranks[y == 1].sum()) - n_pos * (n_pos + 1) / 2.0
    return u / (n_pos * n_neg)


def _ranked_labels(y: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Labels in descending score order, with the official scorer's tie-breaking."""
    order = np.argsort(s)[::-1]
    return np.take(y, order)


def _require_positive(y: np.ndarray, metric: str) -> None:
    if y.sum() == 0:
        raise ValueError(f"{metric} is undefined for an impression without any clicked "
                         f"candidate ({y.size} candidates, all labelled 0)")


def _mrr_ranked(ranked: np.ndarray) -> float:
    rr = ranked / (np.arange(ranked.size) + 1)
    return float(rr.sum() / ranked.sum())


def _dcg_ranked(ranked: np.ndarray, k: int) -> float:
    top = ranked[:k]
    gains = 2.0 ** top - 1.0
    discounts = np.log2(np.arange(top.size) + 2)
    return float(np.sum(gains / discounts))


def _ndcg_ranked(y: np.ndarray, ranked: np.ndarray, k: int) -> float:
    # The ideal ordering sorts the labels by themselves, as dcg_score(y_true, y_true, k) does.
    ideal = _dcg_ranked(_ranked_labels(y, y.astype(np.float64)), k)
    return _dcg_ranked(ranked, k) / ideal


def auc(labels: Sequence[int] | np.ndarray, scores: Sequence[float] | np.ndarray) -> float:
    """Area under the ROC curve of one impression (ties count one half).

    Computed as the Mann–Whitney U statistic with average ranks, in O(n log n):
    ``AUC = (Σ_{i: y_i=1} rank(s_i) − P(P+1)/2) / (P·N)`` with P positives and N negatives.
    This is the probability that a random clicked candidate scores higher than a random
    non-clicked one, counting ties one half.

    Parameters
    ----------
    labels:
        ``[n]`` 0/1 click labels.
    scores:
        ``[n]`` finite scores.

    Raises
    ------
    ValueError
        If the impression has a single class (no clicked or no non-clicked candidate), if
        shapes differ, labels are not 0/1, or scores are not finite.
    """
    y, s = _check_impression(labels, scores)
    return _auc(y, s)


def mrr(labels: Sequence[int] | np.ndarray, scores: Sequence[float] | np.ndarray) -> float:
    """Mean reciprocal rank of the clicked candidates of one impression (MIND's ``mrr_score``).

    ``order = argsort(scores)[::-1]``, ``y = labels[order]``,
    ``MRR = Σ_i y_i / (i+1) / Σ_i y_i``. See the module docstring for ties.

    Parameters
    ----------
    labels, scores:
        As in :func:`auc`: ``[n]`` 0/1 click labels (with at least one 1), ``[n]`` finite scores.

    Raises
    ------
    ValueError
        If no candidate is clicked (the official scorer would divide by zero), or on invalid
        input.
    """
    y, s = _check_impression(labels, scores)
    _require_positive(y, "MRR")
    return _mrr_ranked(_ranked_labels(y, s))


def ndcg(labels: Sequence[int] | np.ndarray, scores: Sequence[float] | np.ndarray,
         k: int) -> float:
    """nDCG@k of one impression (MIND's ``ndcg_score``).

    ``DCG@k(y, s) = Σ_{i<k} (2^{y_(i)} − 1) / log2(i + 2)`` over the labels sorted by
    descending score; ``nDCG@k = DCG@k(labels, scores) / DCG@k(labels, labels)``. See the
    module docstring for ties.

    Parameters
    ----------
    labels, scores:
        As in :func:`mrr`.
    k:
        Cut-off (positive integer; a cut-off beyond ``n`` uses all candidates).

    Raises
    ------
    ValueError
        If no candidate is clicked (the ideal DCG is 0), if ``k`` is not a positive integer,
        or on invalid input.
    """
    _check_k(k)
    y, s = _check_impression(labels, scores)
    _require_positive(y, "nDCG")
    return _ndcg_ranked(y, _ranked_labels(y, s), k)


def recall_at_k(relevant_ids: Iterable[str], ranked_ids: Sequence[str], k: int) -> float:
    """Recall@K: ``|relevant ∩ top-k(ranked)| / |relevant|`` (Uni-FedRec §4).

    Both sides are treated as sets of ids (duplicates count once).

    Parameters
    ----------
    relevant_ids:
        The relevant news ids (e.g. a user's future clicks); must not be empty.
    ranked_ids:
        Recalled news ids, best first; only the first ``k`` are considered.
    k:
        Cut-off (positive integer).

    Raises
    ------
    ValueError
        If ``relevant_ids`` is empty (recall is undefined: leave such users out and count
        them), or ``k`` is not a positive integer.
    """
    _check_k(k)
    relevant = set(relevant_ids)
    if not relevant:
        raise ValueError("recall@K is undefined for an empty set of relevant ids; "
                         "leave such users out of the average")
    top = set(list(ranked_ids)[:k])
    return len(relevant & top) / len(relevant)


def impression_metrics(labels: Sequence[int] | np.ndarray,
                       scores: Sequence[float] | np.ndarray) -> list[float] | None:
    """``[AUC, MRR, nDCG@5, nDCG@10]`` of one impression (each as :func:`auc`, :func:`mrr`,
    :func:`ndcg`), or ``None`` when it lacks a clicked or a non-clicked candidate (AUC is
    then undefined). Validates the impression once."""
    y, s = _check_impression(labels, scores)
    if not 0 < int(y.sum()) < y.size:
        return None
    ranked = _ranked_labels(y, s)
    return [_auc(y, s), _mrr_ranked(ranked), *(_ndcg_ranked(y, ranked, k)
                                                for k in NDCG_CUTOFFS)]


ImpressionPair = tuple[Sequence[int] | np.ndarray, Sequence[float] | np.ndarray]
"""``(labels [n], scores [n])`` of one impression."""


def evaluate_impressions(pairs: Iterable[ImpressionPair]) -> dict[str, float | int]:
    """Average AUC, MRR, nDCG@5 and nDCG@10 over impressions, as MIND's official scorer does.

    Every metric is computed per impression and averaged with equal weight per impression.
    AUC is averaged over the impressions holding both classes; single-class impressions (all
    clicked or none clicked) are left out of AUC and counted. MRR and nDCG are averaged over the
    impressions with at least one click; impressions without any click are left out and counted.
    (On MIND every labelled impression has a click and at least one non-click, so all counts
    coincide.) An average over no impression is ``nan``.

    Parameters
    ----------
    pairs:
        Iterable of ``(labels [n_i], scores [n_i])``, one per impression.

    Returns
    -------
    dict with keys ``auc``, ``mrr``, ``ndcg@5``, ``ndcg@10`` (floats), ``impressions`` (all
    impressions), ``auc_impressions`` (impressions with both classes),
    ``single_class_impressions`` (impressions left out of AUC) and ``no_positive_impressions``
    (impressions without a click, left out of MRR/nDCG).

    Raises
    ------
    ValueError
        If ``pairs`` is empty or an impression is invalid (the message gives its position).
    """
    aucs: list[float] = []
    mrrs: list[float] = []
    ndcgs: dict[int, list[float]] = {k: [] for k in NDCG_CUTOFFS}
    count = single_class = no_positive = 0
    for position, (labels, scores) in enumerate(pairs):
        try:
            y, s = _check_impression(labels, scores)
        except ValueError as exc:
            raise ValueError(f"impression #{position}: {exc}") from None
        count += 1
        n_pos = int(y.sum())
        if 0 < n_pos < y.size:
            aucs.append(_auc(y, s))
        else:
            single_class += 1
        if n_pos == 0:
            no_positive += 1
            continue
        ranked = _ranked_labels(y, s)
        mrrs.append(_mrr_ranked(ranked))
        for k in NDCG_CUTOFFS:
            ndcgs[k].append(_ndcg_ranked(y, ranked, k))
    if count == 0:
        raise ValueError("no impression to evaluate (is the split empty or unlabelled?)")

    def mean(values: list[float]) -> float:
        return float(np.mean(values)) if values else math.nan

    result: dict[str, float | int] = {"auc": mean(aucs), "mrr": mean(mrrs)}
    for k in NDCG_CUTOFFS:
        result[f"ndcg@{k}"] = mean(ndcgs[k])
    result.update(impressions=count, auc_impressions=len(aucs),
                  single_class_impressions=single_class, no_positive_impressions=no_positive)
    return result
