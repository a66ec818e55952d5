"""Tests for Uni-FedRec interest channels: hand-computed clustering, naive UPGMA, quotas."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from privaterec.errors import ConfigError
from privaterec.recall.channels import (DISTANCE_METRICS, LINKAGE_METHODS, channel_quotas,
                                        cluster_batch, cluster_history, cluster_labels)


def _angles(*degrees: float) -> np.ndarray:
    rad = np.deg2rad(np.asarray(degrees, dtype=np.float64))
    return np.stack([np.cos(rad), np.sin(rad)], axis=1)


def _partition(labels: np.ndarray) -> set[frozenset[int]]:
    return {frozenset(np.flatnonzero(labels == c).tolist()) for c in np.unique(labels)}


def _naive_upgma(x: np.ndarray, *, threshold: float, max_clusters: int) -> set[frozenset[int]]:
    """Textbook average linkage on cosine distance: merge the closest pair (mean pairwise
    distance) while it is <= threshold; then keep merging while > max_clusters clusters."""
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    dist = 1.0 - unit @ unit.T
    clusters = [[i] for i in range(len(x))]

    def avg(a: list[int], b: list[int]) -> float:
        return float(np.mean([dist[i, j] for i in a for j in b]))

    while len(clusters) > 1:
        pairs = [(avg(clusters[i], clusters[j]), i, j)
                 for i in range(len(clusters)) for j in range(i + 1, len(clusters))]
        best, i, j = min(pairs)
        if best > threshold and len(clusters) <= max_clusters:
            break
        clusters[i] = clusters[i] + clusters[j]
        del clusters[j]
    return {frozenset(c) for c in clusters}


# Five clicks at 0°, 20°, 90°, 110°, 200° in the plane (cosine distance 1 − cos Δθ):
#   d(0°,20°) = d(90°,110°) = 1 − cos 20° = 0.0603          (merged first)
#   avg({0°,20°}, {90°,110°}) = (1 + 1.342 + 0.658 + 1)/4 = 1.000
#   avg({90°,110°}, 200°) = (1.342 + 1)/2 = 1.171;  avg({0°,20°}, 200°) = (1.940 + 2)/2 = 1.970
#   avg({0°,20°,90°,110°}, 200°) = (1.940 + 2 + 1.342 + 1)/4 = 1.571
HAND = _angles(0, 20, 90, 110, 200)


@pytest.mark.parametrize("threshold, expected_assignment, expected_counts", [
    (0.5, [0, 0, 1, 1, 2], [2, 2, 1]),      # stops above 0.0603: three clusters
    (1.05, [0, 0, 0, 0, 1], [4, 1]),        # the 1.000 merge happens, 1.571 does not
    (1.6, [0, 0, 0, 0, 0], [5]),            # everything merges
    (0.01, [0, 1, 2, 3, 4], [1, 1, 1, 1, 1]),  # nothing merges (5 = max_channels)
])
def test_hand_computed_example(threshold, expected_assignment, expected_counts):
    # Two padding positions in front (right-aligned history) hold arbitrary vectors.
    vectors = np.concatenate([np.array([[5.0, -3.0], [0.1, 0.2]]), HAND])
    mask = np.array([False, False, True, True, True, True, True])
    ch = cluster_history(vectors, mask, distance_threshold=threshold)
    assert ch.assignment.tolist() == [-1, -1] + expected_assignment
    assert ch.counts.tolist() == expected_counts
    assert ch.num_channels == len(expected_counts)
    np.testing.assert_allclose(ch.quotas, np.array(expected_counts) / 5)


def test_hand_example_quotas():
    ch = cluster_history(HAND, distance_threshold=0.5)
    np.testing.assert_allclose(ch.quotas, [0.4, 0.4, 0.2])
    np.testing.assert_allclose(channel_quotas(np.array([3, 2, 1])), [0.5, 1 / 3, 1 / 6])
    np.testing.assert_allclose(channel_quotas(torch.tensor([1, 1])), [0.5, 0.5])


def test_too_many_clusters_are_merged_with_maxclust():
    # Seven directions 360/7° apart: with d_c = 0.01 nothing merges (7 > 5 channels), so the
    # dendrogram is cut at 5 clusters. Naive UPGMA continued to 5 clusters is the reference.
    x = _angles(*(k * 360 / 7 + 3 * k * k for k in range(7)))  # uneven: no tied merges
    labels = cluster_labels(x, distance_threshold=0.01, max_channels=5)
    assert labels.max() + 1 == 5
    assert _partition(labels) == _naive_upgma(x, threshold=0.01, max_clusters=5)
    single = cluster_labels(x, distance_threshold=0.01, max_channels=5, overflow="single")
    assert single.tolist() == [0] * 7


@pytest.mark.parametrize("seed", range(6))
def test_matches_naive_average_linkage(seed):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(3, 6))
    x = np.concatenate([c + 0.6 * rng.normal(size=(4, 6)) for c in centers])
    for threshold in (0.3, 0.8):
        labels = cluster_labels(x, distance_threshold=threshold, max_channels=5)
        assert _partition(labels) == _naive_upgma(x, threshold=threshold, max_clusters=5)


def test_canonical_order_and_determinism():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.normal(size=(1, 4)) + 10 * np.eye(4)[i % 3]
                        for i in range(10)])
    ch = cluster_history(x, distance_threshold=0.3)
    counts = ch.counts.tolist()
    assert counts == sorted(counts, reverse=True) and sum(counts) == 10
    again = cluster_history(x.copy(), distance_threshold=0.3)
    assert np.array_equal(ch.assignment, again.assignment)
    # Order of the clicks does not change the partition (no tied distances here).
    perm = rng.permutation(10)
    permuted = cluster_history(x[perm], distance_threshold=0.3)
    # permuted position p holds original click perm[p]
    assert {frozenset(perm[list(s)].tolist()) for s in _partition(permuted.assignment)} \
        == _partition(ch.assignment)


def test_one_click_and_empty_history():
    x = np.arange(12, dtype=float).reshape(4, 3)
    one = cluster_history(x, np.array([False, False, False, True]))
    assert one.assignment.tolist() == [-1, -1, -1, 0] and one.counts.tolist() == [1]
    empty = cluster_history(x, np.zeros(4, dtype=bool))
    assert empty.assignment.tolist() == [0, 0, 0, 0] and empty.counts.tolist() == [4]
    np.testing.assert_allclose(empty.quotas, [1.0])
    with pytest.raises(ConfigError, match="H >= 1"):
        cluster_history(np.zeros((0, 3)))


def test_zero_vectors_and_identical_vectors():
    x = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    # cosine distance to the zero vector is taken as 1: merged only when d_c >= 1
    assert cluster_labels(x, distance_threshold=0.5).tolist() == [1, 0, 0]
    assert cluster_labels(x, distance_threshold=1.0).tolist() == [0, 0, 0]


def test_ward_euclidean_like_official_code():
    x = np.array([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.0, 5.2]])
    labels = cluster_labels(x, distance_threshold=1.0, method="ward", metric="euclidean")
    assert labels.tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize("kwargs, match", [
    (dict(distance_threshold=-1.0), "distance_threshold"),
    (dict(distance_threshold=math.inf), "distance_threshold"),
    (dict(method="ward", metric="cosine"), "euclidean"),
    (dict(method="bogus"), "method"),
    (dict(max_channels=0), "max_channels"),
    (dict(overflow="drop"), "overflow"),
    (dict(metric="no-such-metric"), "metric"),
])
def test_invalid_parameters(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        cluster_labels(HAND, **kwargs)


def test_every_accepted_metric_and_method_is_one_scipy_runs():
    # the Literal types the configs validate against must not admit a name scipy rejects
    x = np.array([[0.0, 1, 1], [1, 0, 1], [1, 1, 0], [1, 1, 1], [0, 0, 1], [0, 1, 0]])
    for metric in DISTANCE_METRICS:
        assert cluster_labels(x, metric=metric).shape == (6,), metric
    for method in LINKAGE_METHODS:
        metric = "euclidean" if method in ("centroid", "median", "ward") else "cosine"
        assert cluster_labels(x, method=method, metric=metric).shape == (6,), method


def test_non_finite_vectors_rejected():
    with pytest.raises(ConfigError, match="non-finite"):
        cluster_labels(np.array([[0.0, np.nan], [1.0, 0.0]]))


def test_cluster_batch_rows_match_single_users_and_are_independent():
    gen = torch.Generator().manual_seed(0)
    b, h, d = 4, 6, 3
    vectors = torch.randn(b, h, d, generator=gen)
    mask = torch.stack([torch.arange(h) >= h - n for n in (6, 3, 1, 0)])
    batch = cluster_batch(vectors, mask, distance_threshold=0.4, max_channels=5)
    assert batch.channel_ids.shape == (b, h) and batch.quotas.shape == (b, 5)
    for u in range(b):
        ch = cluster_history(vectors[u], mask[u], distance_threshold=0.4)
        assert batch.channel_ids[u].tolist() == ch.assignment.tolist()
        c = ch.num_channels
        assert batch.counts[u, :c].tolist() == ch.counts.tolist()
        assert batch.counts[u, c:].tolist() == [0] * (5 - c)
        np.testing.assert_allclose(batch.quotas[u, :c].numpy(), ch.quotas, rtol=1e-6)
        assert int(batch.num_channels[u]) == c
    torch.testing.assert_close(batch.quotas.sum(1), torch.ones(b))
    # row 0 unchanged whatever the other rows hold
    other_v = torch.randn(b, h, d, generator=gen) * 4
    other_m = torch.rand(b, h, generator=gen) > 0.5
    other_v[0], other_m[0] = vectors[0], mask[0]
    again = cluster_batch(other_v, other_m, distance_threshold=0.4)
    assert torch.equal(again.channel_ids[0], batch.channel_ids[0])
    assert torch.equal(again.quotas[0], batch.quotas[0])
