"""Uni-FedRec interest channels: hierarchical clustering of a user's clicks (§3.2, Eq. 4).

The global self-attention outputs ``g₁ … g_H`` of a user's clicked news are split into
interest clusters ℋ₁ … ℋ_C by agglomerative hierarchical clustering (Johnson 1967): clusters
are merged "until the average distances between any two clusters are larger than a given
threshold d_c" (Uni-FedRec §3.2). With ``method="average"`` (UPGMA, the default) this is
exactly ``scipy.cluster.hierarchy.fcluster(linkage(...), d_c, criterion="distance")``: every
merge at height ≤ d_c is performed, none above. The quota of channel i is
qᵢ = |ℋᵢ| / Σⱼ |ℋⱼ| (Eq. 4).

Rules chosen here (the paper does not state them):

* **Metric / method.** Defaults ``metric="cosine"``, ``method="average"`` (the paper's
  "average distances"); both configurable. The official code used Ward linkage on Euclidean
  distances (``method="ward", metric="euclidean"``). Cosine distance to an all-zero vector is
  undefined; it is taken to be 1 (orthogonal).
* **At most ``max_channels`` (5) channels.** If the threshold leaves more clusters,
  ``overflow="merge"`` (default) cuts the same dendrogram at the lowest height that leaves at
  most ``max_channels`` clusters (``fcluster(..., max_channels, criterion="maxclust")``; with
  tied merge heights this may give fewer). ``overflow="single"`` instead puts the whole
  history in one channel, as the official training code does.
* **Canonical channel order.** Channels are numbered by decreasing size, ties broken by the
  earliest history position, so the result depends only on the partition.
* **Only real clicks are clustered.** Padding positions (``mask == False``) get channel −1.
* **One real click:** one channel of size 1. **No real click** (empty history): one channel
  over all (anonymous-news) positions, with ``counts = [H]`` and quota 1 — the package-wide
  convention that an empty history attends over its padding. A history array with no
  position at all (H = 0) is rejected.

Each user is clustered on its own, so a user's channels never depend on other users.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, TypedDict, get_args

import numpy as np
import torch
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import pdist

from privaterec.errors import ConfigError
from privaterec.validators import check_choice, fail, is_integer, is_real

MAX_CHANNELS = 5
"""Default maximum number of interest channels (the official Uni-FedRec code)."""

DEFAULT_DISTANCE_THRESHOLD = 1.0
"""d_c = 1 (Uni-FedRec §4.1)."""

LinkageMethod = Literal["single", "complete", "average", "weighted", "centroid", "median",
                        "ward"]
"""``scipy.cluster.hierarchy.linkage`` methods."""
LINKAGE_METHODS: tuple[LinkageMethod, ...] = get_args(LinkageMethod)
_EUCLIDEAN_ONLY = ("centroid", "median", "ward")

DistanceMetric = Literal["braycurtis", "canberra", "chebyshev", "cityblock", "correlation",
                         "cosine", "dice", "euclidean", "hamming", "jaccard", "jensenshannon",
                         "mahalanobis", "minkowski", "rogerstanimoto", "russellrao",
                         "seuclidean", "sokalsneath", "sqeuclidean", "yule"]
"""``scipy.spatial.distance.pdist`` metrics (their canonical names)."""
DISTANCE_METRICS: tuple[DistanceMetric, ...] = get_args(DistanceMetric)

Overflow = Literal["merge", "single"]
OVERFLOWS: tuple[Overflow, ...] = get_args(Overflow)


class ClusterOptions(TypedDict):
    """The clustering keywords of :func:`cluster_batch` (a recall model's settings)."""

    distance_threshold: float
    method: LinkageMethod
    metric: DistanceMetric
    max_channels: int
    overflow: Overflow


@dataclass(frozen=True)
class Channels:
    """One user's interest channels.

    Attributes
    ----------
    assignment:
        ``int64[H]``: channel index in ``[0, C)`` of each history position, −1 for padding
        positions (all positions are channel 0 for an empty history).
    counts:
        ``int64[C]``: |ℋᵢ|, in decreasing order.
    """

    assignment: np.ndarray
    counts: np.ndarray

    @property
    def num_channels(self) -> int:
        """C, the number of channels (≥ 1)."""
        return int(self.counts.shape[0])

    @property
    def quotas(self) -> np.ndarray:
        """``float64[C]``: qᵢ = |ℋᵢ| / Σⱼ |ℋⱼ| (Uni-FedRec Eq. 4)."""
        return channel_quotas(self.counts)


@dataclass(frozen=True)
class ChannelBatch:
    """Channels of a batch of users, padded to ``max_channels`` (M) slots.

    Attributes
    ----------
    channel_ids:
        ``LongTensor[b, H]``: channel of each history position, −1 for padding.
    counts:
        ``LongTensor[b, M]``: |ℋᵢ| per slot, 0 for unused slots.
    quotas:
        ``Tensor[b, M]`` (float32): qᵢ per slot, 0 for unused slots; each row sums to 1.
    """

    channel_ids: torch.Tensor
    counts: torch.Tensor
    quotas: torch.Tensor

    @property
    def num_channels(self) -> torch.Tensor:
        """``LongTensor[b]``: C per user."""
        return (self.counts > 0).sum(dim=-1)

    @property
    def valid(self) -> torch.Tensor:
        """``BoolTensor[b, M]``: which slots hold a channel."""
        return self.counts > 0


def channel_quotas(counts: np.ndarray | torch.Tensor) -> np.ndarray:
    """qᵢ = |ℋᵢ| / Σⱼ |ℋⱼ| (Uni-FedRec Eq. 4).

    Parameters
    ----------
    counts:
        ``[C]`` non-negative channel sizes with a positive sum.

    Returns
    -------
    ``float64[C]`` summing to 1.
    """
    c = np.asarray(counts.detach().cpu() if isinstance(counts, torch.Tensor) else counts,
                   dtype=np.float64)
    if c.ndim != 1 or c.size == 0 or (c < 0).any() or not c.sum() > 0:
        raise ConfigError(f"channel counts must be a non-empty 1-D array of non-negative "
                          f"numbers with a positive sum, got {c.tolist()!r}")
    return c / c.sum()


def check_cluster_params(distance_threshold: float, method: str, metric: str,
                         max_channels: int, overflow: str) -> None:
    """Raise :class:`ConfigError` naming the first invalid clustering parameter."""
    if not (is_real(distance_threshold) and 0 <= distance_threshold < math.inf):
        raise ConfigError(f"invalid 'distance_threshold' (d_c): got {distance_threshold!r}, "
                          f"expected a finite number >= 0")
    if method not in LINKAGE_METHODS:
        raise ConfigError(f"invalid linkage 'method': got {method!r}, expected one of "
                          f"{LINKAGE_METHODS}")
    if metric not in DISTANCE_METRICS:
        raise ConfigError(f"invalid clustering 'metric': got {metric!r}, expected one of "
                          f"{DISTANCE_METRICS}")
    if method in _EUCLIDEAN_ONLY and metric != "euclidean":
        raise ConfigError(f"linkage method {method!r} requires metric='euclidean', got "
                          f"{metric!r}")
    if not (is_integer(max_channels) and not isinstance(max_channels, bool) and max_channels >= 1):
        fail("max_channels", max_channels, "an int >= 1", kind="")
    if overflow not in ("merge", "single"):
        raise ConfigError(f"invalid 'overflow': got {overflow!r}, expected 'merge' or 'single'")


def cluster_options(*, distance_threshold: float, method: str, metric: str, max_channels: int,
                    overflow: str) -> ClusterOptions:
    """The keywords of :func:`cluster_batch`, checked by :func:`check_cluster_params` (its
    errors) and narrowed to their ``Literal`` types."""
    check_cluster_params(distance_threshold, method, metric, max_channels, overflow)
    return ClusterOptions(distance_threshold=distance_threshold,
                          method=check_choice(method, "method", LINKAGE_METHODS),
                          metric=check_choice(metric, "metric", DISTANCE_METRICS),
                          max_channels=max_channels,
                          overflow=check_choice(overflow, "overflow", OVERFLOWS))


def _as_numpy(x: np.ndarray | torch.Tensor, dtype: type) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


def _canonical(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Relabel cluster labels by decreasing size, ties by first position → (labels, counts)."""
    uniq, first, inverse, counts = np.unique(labels, return_index=True, return_inverse=True,
                                             return_counts=True)
    order = np.lexsort((first, -counts))  # primary: -counts, secondary: first position
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[inverse].astype(np.int64), counts[order].astype(np.int64)


def cluster_labels(vectors: np.ndarray | torch.Tensor, *,
                   distance_threshold: float = DEFAULT_DISTANCE_THRESHOLD,
                   method: LinkageMethod = "average", metric: DistanceMetric = "cosine",
                   max_channels: int = MAX_CHANNELS,
                   overflow: Overflow = "merge") -> np.ndarray:
    """Flat cluster labels of n ≥ 1 vectors (canonical order, see the module docstring).

    Parameters
    ----------
    vectors:
        ``[n, d]`` real clicks' context vectors gⱼ.
    distance_threshold, method, metric, max_channels, overflow:
        As in :func:`cluster_history`.

    Returns
    -------
    ``int64[n]`` labels in ``[0, C)``, C ≤ ``max_channels``.
    """
    check_cluster_params(distance_threshold, method, metric, max_channels, overflow)
    x = _as_numpy(vectors, np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ConfigError(f"expected vectors of shape [n >= 1, d], got {x.shape}")
    if not np.isfinite(x).all():
        raise ConfigError("cannot cluster non-finite history vectors (NaN or inf)")
    if x.shape[0] == 1:
        return np.zeros(1, dtype=np.int64)
    try:
        dist = pdist(x, metric=metric)
    except ValueError as exc:
        raise ConfigError(f"invalid clustering 'metric' {metric!r}: {exc}") from exc
    dist = np.where(np.isfinite(dist), dist, 1.0)  # cosine to a zero vector: 1 (orthogonal)
    tree = linkage(dist, method=method)
    labels = fcluster(tree, t=distance_threshold, criterion="distance")
    if np.unique(labels).size > max_channels:
        if overflow == "single":
            labels = np.ones_like(labels)
        else:
            labels = fcluster(tree, t=max_channels, criterion="maxclust")
    return _canonical(labels)[0]


def cluster_history(vectors: np.ndarray | torch.Tensor,
                    mask: np.ndarray | torch.Tensor | None = None, *,
                    distance_threshold: float = DEFAULT_DISTANCE_THRESHOLD,
                    method: LinkageMethod = "average", metric: DistanceMetric = "cosine",
                    max_channels: int = MAX_CHANNELS,
                    overflow: Overflow = "merge") -> Channels:
    """Split one user's history into interest channels (Uni-FedRec §3.2).

    Parameters
    ----------
    vectors:
        ``[H, d]`` global self-attention outputs g of the history positions.
    mask:
        ``bool[H]``, ``True`` for real clicks (default: all real).
    distance_threshold:
        d_c ≥ 0: merges at average-linkage height ≤ d_c are performed (paper default 1).
    method, metric:
        ``scipy.cluster.hierarchy.linkage`` method and ``scipy.spatial.distance.pdist``
        metric.
    max_channels:
        Upper bound on C (default 5).
    overflow:
        ``"merge"`` (cut the dendrogram to ``max_channels`` clusters) or ``"single"`` (one
        channel), applied when d_c leaves more than ``max_channels`` clusters.

    Returns
    -------
    :class:`Channels` (deterministic: a function of the inputs only).
    """
    x = _as_numpy(vectors, np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ConfigError(f"expected history vectors of shape [H >= 1, d], got {x.shape}")
    m = np.ones(x.shape[0], dtype=bool) if mask is None else _as_numpy(mask, bool)
    if m.shape != (x.shape[0],):
        raise ConfigError(f"history mask has shape {m.shape}, expected ({x.shape[0]},)")
    check_cluster_params(distance_threshold, method, metric, max_channels, overflow)
    if not m.any():  # empty history: one channel over the anonymous positions
        return Channels(np.zeros(x.shape[0], dtype=np.int64),
                        np.array([x.shape[0]], dtype=np.int64))
    labels = cluster_labels(x[m], distance_threshold=distance_threshold, method=method,
                            metric=metric, max_channels=max_channels, overflow=overflow)
    assignment = np.full(x.shape[0], -1, dtype=np.int64)
    assignment[m] = labels
    return Channels(assignment, np.bincount(labels).astype(np.int64))


def cluster_batch(vectors: torch.Tensor, mask: torch.Tensor, *,
                  distance_threshold: float = DEFAULT_DISTANCE_THRESHOLD,
                  method: LinkageMethod = "average", metric: DistanceMetric = "cosine",
                  max_channels: int = MAX_CHANNELS,
                  overflow: Overflow = "merge") -> ChannelBatch:
    """:func:`cluster_history` for each user of a batch, padded to ``max_channels`` slots.

    Parameters
    ----------
    vectors:
        ``Tensor[b, H, d]`` context vectors g (gradients are not tracked).
    mask:
        ``BoolTensor[b, H]``, ``True`` for real clicks.
    distance_threshold, method, metric, max_channels, overflow:
        As in :func:`cluster_history`.

    Returns
    -------
    :class:`ChannelBatch` on the device of ``vectors``. Row u depends only on row u.
    """
    if vectors.ndim != 3 or mask.shape != vectors.shape[:2]:
        raise ConfigError(f"expected vectors [b, H, d] and mask [b, H], got "
                          f"{tuple(vectors.shape)} and {tuple(mask.shape)}")
    b, h = mask.shape
    ids = np.full((b, h), -1, dtype=np.int64)
    counts = np.zeros((b, max_channels), dtype=np.int64)
    x = vectors.detach().cpu().double().numpy()
    m = mask.detach().cpu().numpy().astype(bool)
    for u in range(b):
        ch = cluster_history(x[u], m[u], distance_threshold=distance_threshold, method=method,
                             metric=metric, max_channels=max_channels, overflow=overflow)
        ids[u] = ch.assignment
        counts[u, :ch.num_channels] = ch.counts
    quotas = counts / counts.sum(axis=1, keepdims=True)
    device = vectors.device
    return ChannelBatch(torch.from_numpy(ids).to(device), torch.from_numpy(counts).to(device),
                        torch.from_numpy(quotas).to(device=device, dtype=torch.float32))


__all__ = ["Channels", "ChannelBatch", "ClusterOptions", "DEFAULT_DISTANCE_THRESHOLD",
           "DISTANCE_METRICS", "DistanceMetric", "LINKAGE_METHODS", "LinkageMethod",
           "MAX_CHANNELS", "OVERFLOWS", "Overflow", "channel_quotas", "check_cluster_params",
           "cluster_batch", "cluster_history", "cluster_labels", "cluster_options"]
