"""Tests for server-side recall: quota rounding, top-k, dedupe/refill, score space, faiss."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privaterec.errors import ConfigError
from privaterec.recall.index import (DenseIndex, ScoreSpaceIndex, allocate_quotas,
                                     merge_rankings, recall_from_scores, top_k)


@pytest.mark.parametrize("quotas, total, expected", [
    ([0.5, 0.3, 0.2], 10, [5, 3, 2]),
    ([1 / 3, 1 / 3, 1 / 3], 10, [4, 3, 3]),   # equal remainders and quotas: lower index
    ([0.45, 0.45, 0.1], 5, [2, 2, 1]),        # 2.25, 2.25, 0.5 -> the 0.5 remainder wins
    ([0.7, 0.0, 0.3], 3, [2, 0, 1]),          # 2.1, 0, 0.9
    ([2.0, 1.0, 1.0], 7, [3, 2, 2]),          # unnormalised: 3.5, 1.75, 1.75 -> the 0.75s
    ([0.4, 0.6], 0, [0, 0]),
])
def test_allocate_quotas_hand_cases(quotas, total, expected):
    assert allocate_quotas(np.array(quotas), total).tolist() == expected


def test_allocate_quotas_properties():
    rng = np.random.default_rng(0)
    for _ in range(200):
        m = int(rng.integers(1, 6))
        q = rng.dirichlet(np.ones(m)) * (rng.random(m) > 0.3)
        if q.sum() == 0:
            continue
        total = int(rng.integers(0, 500))
        counts = allocate_quotas(q, total)
        assert counts.sum() == total
        assert (np.abs(counts - q / q.sum() * total) < 1).all()
        assert (counts[q == 0] == 0).all()
    with pytest.raises(ConfigError, match="quotas"):
        allocate_quotas(np.array([0.0, 0.0]), 3)
    with pytest.raises(ConfigError, match="quotas"):
        allocate_quotas(np.array([0.5, -0.1]), 3)


def test_top_k_equals_stable_argsort_with_ties():
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 6, size=(4, 50)).astype(float)  # many ties
    for k in (0, 1, 7, 50):
        expected = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # ties: lower index
        assert np.array_equal(top_k(scores, k), expected)
    assert np.array_equal(top_k(scores[0], 5), np.argsort(-scores[0], kind="stable")[:5])
    with pytest.raises(ConfigError, match="pool of 50"):
        top_k(scores, 51)
    with pytest.raises(ConfigError, match="non-finite"):
        top_k(np.array([1.0, np.nan]), 1)


def _reference_recall(scores: np.ndarray, counts: np.ndarray) -> list[int]:
    """Brute force: full argsort per channel, channels by decreasing count, skip taken."""
    taken: list[int] = []
    for i in sorted(range(len(counts)), key=lambda i: (-counts[i], i)):
        ranking = np.argsort(-scores[i], kind="stable")
        need = counts[i]
        for item in ranking:
            if need == 0:
                break
            if item not in taken:
                taken.append(int(item))
                need -= 1
    return taken


@pytest.mark.parametrize("seed", range(5))
def test_recall_from_scores_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    m, n, total = 4, 300, 40
    base = rng.normal(size=n)
    scores = base + 0.3 * rng.normal(size=(m, n))  # correlated channels: many duplicates
    quotas = rng.dirichlet(np.ones(m))
    got = recall_from_scores(scores, quotas, total)
    assert len(got) == total and len(set(got.tolist())) == total
    assert got.tolist() == _reference_recall(scores, allocate_quotas(quotas, total))


def test_identical_channels_dedupe_and_refill():
    scores = np.array([[9.0, 8.0, 7.0, 6.0, 5.0, 4.0]] * 2)
    got = recall_from_scores(scores, np.array([0.5, 0.5]), 4)
    # channel 0 takes positions 0, 1; channel 1 skips them and takes 2, 3
    assert got.tolist() == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match="pool of 6"):
        recall_from_scores(scores, np.array([0.5, 0.5]), 7)


def test_merge_rankings_rules_and_errors():
    rankings = [np.array(["a", "b", "c"]), np.array(["b", "d", "e"]), np.array(["a", "e"])]
    # service order by count: ch1 (2), then ch0 (1), ch2 (1)
    assert merge_rankings(rankings, [1, 2, 1]).tolist() == ["b", "d", "a", "e"]
    with pytest.raises(ConfigError, match="channel 2"):
        merge_rankings([np.array([1, 2]), np.array([3]), np.array([1, 3])], [1, 1, 1])


def test_score_space_equals_d_dim_scores():
    gen = torch.Generator().manual_seed(0)
    b_, d, n = 6, 16, 200
    values = torch.randn(b_, d, generator=gen)
    news = torch.randn(n, d, generator=gen)
    alpha = torch.softmax(torch.randn(3, b_, generator=gen), dim=-1)
    index = ScoreSpaceIndex(values, news)
    assert index.score_matrix.shape == (b_, n) and len(index) == n
    direct = (alpha.double() @ values.double()) @ news.double().T  # r̂ · Rᵀ in d dims
    np.testing.assert_allclose(index.channel_scores(alpha), direct.numpy(), rtol=1e-5,
                               atol=1e-5)


def test_score_space_recall_ids_and_batches():
    rng = np.random.default_rng(3)
    b_, d, n, total = 5, 8, 120, 30
    values, news = rng.normal(size=(b_, d)), rng.normal(size=(n, d))
    ids = np.array([f"N{i}" for i in range(n)])
    index = ScoreSpaceIndex(values, news, news_ids=ids)
    alpha = rng.dirichlet(np.ones(b_), size=(2, 3)).astype(np.float32)
    quotas = np.array([[0.6, 0.4, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    batch = index.recall(alpha, quotas, total)
    assert batch.shape == (2, total)
    for u in range(2):
        scores = (alpha[u].astype(np.float64) @ values) @ news.T
        expected = _reference_recall(scores, allocate_quotas(quotas[u], total))
        assert batch[u].tolist() == ids[expected].tolist()
        assert index.recall(alpha[u], quotas[u], total).tolist() == batch[u].tolist()
        assert len(set(batch[u].tolist())) == total
    with pytest.raises(ConfigError, match="B = 5"):
        index.channel_scores(np.ones((1, 4)))


def test_faiss_exact_equals_numpy_argsort():
    rng = np.random.default_rng(4)
    news = rng.normal(size=(500, 16)).astype(np.float32)
    queries = rng.normal(size=(6, 16)).astype(np.float32)
    index = DenseIndex(news, news_ids=np.arange(1000, 1500))
    scores, ids = index.search(queries, 25)
    brute = queries.astype(np.float64) @ news.T.astype(np.float64)
    expected = np.argsort(-brute, axis=1)[:, :25]
    assert np.array_equal(ids, expected + 1000)
    np.testing.assert_allclose(scores, np.take_along_axis(brute, expected, 1), rtol=1e-5,
                               atol=1e-5)
    one_scores, one_ids = index.search(torch.from_numpy(queries[2]), 5)
    assert np.array_equal(one_ids, expected[2, :5] + 1000) and one_scores.shape == (5,)
    with pytest.raises(ConfigError, match="pool of 500"):
        index.search(queries, 501)
    with pytest.raises(ConfigError, match=r"\[n, 16\]"):
        index.search(np.ones((2, 3)), 1)


def test_faiss_hnsw_is_close_to_exact():
    rng = np.random.default_rng(5)
    news = rng.normal(size=(1000, 16)).astype(np.float32)
    queries = rng.normal(size=(20, 16)).astype(np.float32)
    exact = np.argsort(-(queries @ news.T), axis=1)[:, :10]
    hnsw = DenseIndex(news, kind="hnsw", ef_search=128)
    _, ids = hnsw.search(queries, 10)
    overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, exact)])
    assert overlap >= 0.9
    with pytest.raises(ConfigError, match="kind"):
        DenseIndex(news, kind="ivf")  # type: ignore[arg-type]
