"""Metrics pinned to hand-computed values and to independent brute-force references."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privaterec.eval.metrics import auc, evaluate_impressions, mrr, ndcg, recall_at_k

LOG2_3 = math.log2(3)


def brute_force_auc(labels, scores) -> float:
    """P(score of a positive > score of a negative), ties one half, by counting all pairs."""
    pos = [s for y, s in zip(labels, scores) if y == 1]
    neg = [s for y, s in zip(labels, scores) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


# Transcription of MIND's official evaluate.py (used only to check tie-breaking parity).
def mind_dcg_score(y_true, y_score, k=10):
    order = np.argsort(y_score)[::-1]
    y_true = np.take(y_true, order[:k])
    gains = 2 ** y_true - 1
    discounts = np.log2(np.arange(len(y_true)) + 2)
    return np.sum(gains / discounts)


def mind_ndcg_score(y_true, y_score, k=10):
    return mind_dcg_score(y_true, y_score, k) / mind_dcg_score(y_true, y_true, k)


def mind_mrr_score(y_true, y_score):
    order = np.argsort(y_score)[::-1]
    y_true = np.take(y_true, order)
    rr_score = y_true / (np.arange(len(y_true)) + 1)
    return np.sum(rr_score) / np.sum(y_true)


# labels [1,0,0,1], scores [.9,.8,.3,.5]: descending order is y = 1,0,1,0.
LABELS = [1, 0, 0, 1]
SCORES = [0.9, 0.8, 0.3, 0.5]
NDCG_ALL = (1 + 1 / 2) / (1 + 1 / LOG2_3)  # DCG = 1/log2(2) + 1/log2(4); ideal 1 + 1/log2(3)


def test_hand_computed_values():
    # Pairs (pos, neg): (.9,.8) (.9,.3) (.5,.3) won, (.5,.8) lost.
    assert auc(LABELS, SCORES) == pytest.approx(3 / 4)
    assert mrr(LABELS, SCORES) == pytest.approx((1 / 1 + 1 / 3) / 2)
    assert ndcg(LABELS, SCORES, 10) == pytest.approx(NDCG_ALL)
    assert ndcg(LABELS, SCORES, 4) == pytest.approx(NDCG_ALL)
    assert ndcg(LABELS, SCORES, 2) == pytest.approx(1 / (1 + 1 / LOG2_3))
    assert ndcg(LABELS, SCORES, 1) == pytest.approx(1.0)


def test_auc_ties_count_half():
    assert auc([1, 0], [0.5, 0.5]) == 0.5
    # (.5 vs .5) half, (.5 vs .1) win, (.2 vs .5) loss, (.2 vs .1) win → 2.5 / 4.
    assert auc([1, 0, 1, 0], [0.5, 0.5, 0.2, 0.1]) == pytest.approx(0.625)
    assert auc([1, 1, 0, 0], [3, 3, 3, 3]) == 0.5


def test_auc_single_class_raises():
    with pytest.raises(ValueError, match="without any positive"):
        auc([0, 0, 0], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="without any negative"):
        auc([1, 1], [0.1, 0.2])


def test_mrr_ndcg_without_click_raise():
    with pytest.raises(ValueError, match="MRR is undefined"):
        mrr([0, 0], [0.1, 0.2])
    with pytest.raises(ValueError, match="nDCG is undefined"):
        ndcg([0, 0], [0.1, 0.2], 5)


@pytest.mark.parametrize("labels, scores, message", [
    ([1, 0], [0.1], "differ in length"),
    ([], [], "empty impression"),
    ([1, 2], [0.1, 0.2], "must be 0 or 1"),
    ([1, 0], [0.1, float("nan")], "finite"),
    ([[1, 0]], [[0.1, 0.2]], "1-D"),
])
def test_invalid_input(labels, scores, message):
    with pytest.raises(ValueError, match=message):
        auc(labels, scores)


@pytest.mark.parametrize("k", [0, -1, 2.5, True])
def test_invalid_k(k):
    with pytest.raises(ValueError, match="k must be a positive integer"):
        ndcg([1, 0], [0.2, 0.1], k)
    with pytest.raises(ValueError, match="k must be a positive integer"):
        recall_at_k(["a"], ["a"], k)


def test_ties_follow_official_scorer():
    # numpy's default argsort keeps small tied arrays in index order; reversing puts the
    # later tied candidate first, so the clicked first candidate ranks second.
    assert mrr([1, 0], [0.5, 0.5]) == 0.5
    assert ndcg([1, 0], [0.5, 0.5], 1) == 0.0
    labels = np.array([0, 1, 0, 1, 0, 0])
    scores = np.array([0.3, 0.3, 0.3, 0.1, 0.3, 0.1])
    assert mrr(labels, scores) == pytest.approx(mind_mrr_score(labels, scores))
    for k in (1, 2, 5, 10):
        assert ndcg(labels, scores, k) == pytest.approx(mind_ndcg_score(labels, scores, k))


impressions = st.integers(min_value=2, max_value=30).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 1), min_size=n, max_size=n).filter(lambda y: 0 < sum(y) < n),
        st.one_of(
            st.lists(st.integers(-3, 3).map(float), min_size=n, max_size=n),  # many ties
            st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=n, max_size=n),
        ),
    ))


@settings(max_examples=200, deadline=None)
@given(impressions)
def test_auc_matches_brute_force_and_antisymmetry(impression):
    labels, scores = impression
    value = auc(labels, scores)
    assert value == pytest.approx(brute_force_auc(labels, scores), abs=1e-12)
    assert auc(labels, [-s for s in scores]) == pytest.approx(1 - value, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(impressions)
def test_mrr_ndcg_match_official_scorer(impression):
    labels, scores = np.array(impression[0]), np.array(impression[1])
    assert mrr(labels, scores) == pytest.approx(mind_mrr_score(labels, scores))
    for k in (5, 10):
        assert ndcg(labels, scores, k) == pytest.approx(mind_ndcg_score(labels, scores, k))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=30, unique=True),
       st.data())
def test_single_click_rank_formulas(scores, data):
    # With one click and distinct scores: rank = 1 + #candidates scoring higher,
    # MRR = 1/rank, nDCG@k = 1/log2(rank+1) if rank <= k else 0.
    clicked = data.draw(st.integers(0, len(scores) - 1))
    labels = [int(i == clicked) for i in range(len(scores))]
    rank = 1 + sum(s > scores[clicked] for s in scores)
    assert mrr(labels, scores) == pytest.approx(1 / rank)
    for k in (1, 3, 5, 10):
        expected = 1 / math.log2(rank + 1) if rank <= k else 0.0
        assert ndcg(labels, scores, k) == pytest.approx(expected)


def test_perfect_ranking_scores_one():
    labels = [0, 1, 1, 0, 1]
    assert mrr(labels, labels) == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)
    assert ndcg(labels, [0.1, 0.9, 0.8, 0.2, 0.7], 2) == 1.0
    assert auc(labels, [0.1, 0.9, 0.8, 0.2, 0.7]) == 1.0


def test_recall_at_k():
    ranked = ["x", "a", "y", "b", "c"]
    assert recall_at_k(["a", "b", "c"], ranked, 1) == 0.0
    assert recall_at_k(["a", "b", "c"], ranked, 2) == pytest.approx(1 / 3)
    assert recall_at_k(["a", "b", "c"], ranked, 4) == pytest.approx(2 / 3)
    assert recall_at_k(["a", "b", "c"], ranked, 100) == 1.0
    assert recall_at_k(["a", "a", "z"], ranked, 2) == 0.5  # duplicates count once
    assert recall_at_k(iter(["b"]), ranked, 4) == 1.0
    with pytest.raises(ValueError, match="empty set of relevant ids"):
        recall_at_k([], ranked, 3)


def test_evaluate_impressions_averages_per_impression():
    pairs = [
        (LABELS, SCORES),
        ([1, 1], [0.1, 0.2]),  # all clicked: no AUC; ranked y = 1,1
        ([0, 0, 0], [0.3, 0.2, 0.1]),  # no click: only counted
        ([0, 1, 0, 0, 0, 0, 0], [7, 1, 6, 5, 4, 3, 2]),  # click ranked 7th of 7
    ]
    result = evaluate_impressions(iter(pairs))
    assert set(result) == {"auc", "mrr", "ndcg@5", "ndcg@10", "impressions", "auc_impressions",
                           "single_class_impressions", "no_positive_impressions"}
    assert result["auc"] == pytest.approx((0.75 + 0.0) / 2)
    assert result["mrr"] == pytest.approx((2 / 3 + (1 + 1 / 2) / 2 + 1 / 7) / 3)
    assert result["ndcg@5"] == pytest.approx((NDCG_ALL + 1.0 + 0.0) / 3)
    assert result["ndcg@10"] == pytest.approx((NDCG_ALL + 1.0 + 1 / 3) / 3)  # 1/log2(8)
    assert (result["impressions"], result["auc_impressions"],
            result["single_class_impressions"], result["no_positive_impressions"]) == (4, 2, 2, 1)


def test_evaluate_impressions_edge_cases():
    result = evaluate_impressions([([1], [0.3]), ([0], [0.1])])
    assert math.isnan(result["auc"]) and result["auc_impressions"] == 0
    assert result["mrr"] == 1.0 and result["no_positive_impressions"] == 1
    with pytest.raises(ValueError, match="no impression to evaluate"):
        evaluate_impressions([])
    with pytest.raises(ValueError, match="impression #1: .*differ in length"):
        evaluate_impressions([(LABELS, SCORES), ([1, 0], [0.1])])
