"""Server-side recall over a news pool (Uni-FedRec §3.2 "News Recall", §3.4;
docs/architecture.md#performance-design).

Score space (docs/architecture.md#performance-design). A protected interest r̂ᵢ = Σⱼ αᵢⱼ eᵛⱼ lies
in the span of the B value embeddings, so its scores over a pool R ``[N, d]`` are r̂ᵢ·Rᵀ = αᵢᵀP
with P = eᵛ Rᵀ ``[B, N]``
precomputed once per pool: B·N multiply-adds per channel instead of d·N, and the server never
needs r̂ᵢ at all (:class:`ScoreSpaceIndex`).

Quotas → counts (:func:`allocate_quotas`): Rᵢ = qᵢ·R (Eq. 4) is rounded by the largest
remainder method (Hamilton): ⌊qᵢR⌋ each, then one more to the channels with the largest
fractional parts (ties: larger qᵢ, then lower channel index) until Σ Rᵢ = R exactly.

Merging channels (:func:`merge_rankings`): channels are served in decreasing order of Rᵢ
(ties: lower index); each takes its best-scored news that no earlier channel took, until it
has Rᵢ. The result has exactly R distinct news whenever the pool holds ≥ R news (a channel
skips at most R − Rᵢ taken news, so its top R always suffice). The official code instead took
int(qᵢR) − 1 per channel and refilled from the largest channel; this rule keeps each channel
at exactly its quota.

Ties in scores are broken by the lower pool position (deterministic; :func:`top_k`).

The d-dim baseline search (YoutubeNet's average user vector, VDP's noised user vector) uses
faiss (:class:`DenseIndex`): exact inner-product search (``IndexFlatIP``) by default, or HNSW
(``IndexHNSWFlat``, approximate).
"""

from __future__ import annotations

import numbers
from typing import Literal, Sequence

import faiss
import numpy as np
import torch

from privaterec.errors import ConfigError

ArrayLike = np.ndarray | torch.Tensor


def _np(x: ArrayLike, dtype: type = np.float32) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(x, dtype=dtype)


def _check_total(total: int, pool: int) -> int:
    if not (isinstance(total, numbers.Integral) and not isinstance(total, bool) and total >= 0):
        raise ConfigError(f"invalid recall size 'total' (R): got {total!r}, expected an int >= 0")
    if total > pool:
        raise ConfigError(f"cannot recall R = {total} distinct news from a pool of {pool}; "
                          f"use R <= {pool}")
    return int(total)


def allocate_quotas(quotas: ArrayLike, total: int) -> np.ndarray:
    """Integer Rᵢ with Σ Rᵢ = R from quotas qᵢ (largest remainder method).

    Parameters
    ----------
    quotas:
        ``[M]`` non-negative quotas with a positive sum (normalised here).
    total:
        R ≥ 0.

    Returns
    -------
    ``int64[M]``; channels with qᵢ = 0 get 0.
    """
    q = _np(quotas, np.float64)
    if not (isinstance(total, numbers.Integral) and total >= 0):
        raise ConfigError(f"invalid recall size 'total' (R): got {total!r}, expected an int >= 0")
    if q.ndim != 1 or q.size == 0 or not np.isfinite(q).all() or (q < 0).any() \
            or not q.sum() > 0:
        raise ConfigError(f"quotas must be a non-empty 1-D array of finite non-negative numbers "
                          f"with a positive sum, got {q.tolist()!r}")
    exact = q / q.sum() * total
    counts = np.floor(exact).astype(np.int64)
    remaining = int(total - counts.sum())
    if remaining > 0:
        frac = exact - counts
        order = np.lexsort((np.arange(q.size), -q, -frac))  # largest frac, larger q, lower i
        order = order[q[order] > 0]
        counts[order[:remaining]] += 1
    return counts


def top_k(scores: ArrayLike, k: int) -> np.ndarray:
    """Positions of the k largest scores of each row, best first, ties by lower position.

    Parameters
    ----------
    scores:
        ``[N]`` or ``[M, N]`` finite scores.
    k:
        0 ≤ k ≤ N.

    Returns
    -------
    ``int64[k]`` or ``int64[M, k]``. Exact (argpartition + a sort of the k selected).
    """
    s = _np(scores, np.float64)
    single = s.ndim == 1
    s = np.atleast_2d(s)
    if s.ndim != 2:
        raise ConfigError(f"scores must be [N] or [M, N], got shape {s.shape}")
    n = s.shape[1]
    k = _check_total(k, n)
    if not np.isfinite(s).all():
        raise ConfigError("cannot rank non-finite scores (NaN or inf)")
    out = np.empty((s.shape[0], k), dtype=np.int64)
    if k:
        for i, row in enumerate(s):
            threshold = np.partition(row, n - k)[n - k]  # the k-th largest value
            above = np.flatnonzero(row > threshold)
            tied = np.flatnonzero(row == threshold)[:k - above.size]
            chosen = np.concatenate([above, tied])
            out[i] = chosen[np.lexsort((chosen, -row[chosen]))]
    return out[0] if single else out


def merge_rankings(rankings: Sequence[ArrayLike], counts: ArrayLike) -> np.ndarray:
    """Merge per-channel rankings into R = Σ counts distinct items (dedupe and refill).

    Channels are served in decreasing ``counts`` (ties: lower index); channel i takes the
    first ``counts[i]`` items of ``rankings[i]`` not taken before.

    Parameters
    ----------
    rankings:
        M arrays of item ids (or positions), best first, each without repeats.
    counts:
        ``[M]`` non-negative integers Rᵢ.

    Returns
    -------
    ``[R]`` distinct items, grouped by channel in service order.
    """
    c = _np(counts, np.int64)
    if c.ndim != 1 or len(rankings) != c.size or (c < 0).any():
        raise ConfigError(f"need one ranking per channel and non-negative counts, got "
                          f"{len(rankings)} rankings and counts {c.tolist()!r}")
    taken: set = set()
    out: list = []
    for i in np.lexsort((np.arange(c.size), -c)):
        need = int(c[i])
        if need == 0:
            continue
        got = 0
        ranking = rankings[i]
        if isinstance(ranking, torch.Tensor):
            ranking = ranking.detach().cpu().numpy()
        for item in np.asarray(ranking).tolist():
            if item in taken:
                continue
            taken.add(item)
            out.append(item)
            got += 1
            if got == need:
                break
        if got < need:
            raise ConfigError(f"channel {int(i)} ranks only {got} news not recalled by other "
                              f"channels, but its quota is {need}; pass longer rankings")
    return np.asarray(out)


def recall_from_scores(channel_scores: ArrayLike, quotas: ArrayLike, total: int) -> np.ndarray:
    """R distinct pool positions from per-channel scores and quotas (Uni-FedRec Eq. 4).

    Parameters
    ----------
    channel_scores:
        ``[M, N]`` scores of each channel over the pool.
    quotas:
        ``[M]`` quotas (unused/unreleased channels: 0).
    total:
        R ≤ N.

    Returns
    -------
    ``int64[R]`` distinct positions in ``[0, N)``.
    """
    s = _np(channel_scores, np.float64)
    if s.ndim != 2:
        raise ConfigError(f"channel_scores must be [M, N], got shape {s.shape}")
    total = _check_total(total, s.shape[1])
    counts = allocate_quotas(quotas, total)
    if counts.size != s.shape[0]:
        raise ConfigError(f"{counts.size} quotas for {s.shape[0]} channels")
    rankings = [top_k(s[i], total) if counts[i] else np.empty(0, np.int64)
                for i in range(s.shape[0])]
    return merge_rankings(rankings, counts).astype(np.int64)


class ScoreSpaceIndex:
    """A news pool in the B-dim score space of the value embeddings
    (docs/architecture.md#performance-design).

    Parameters
    ----------
    values:
        ``[B, d]`` value embeddings eᵛ (``model.interest.values``).
    news_vectors:
        ``[N, d]`` pool news vectors R.
    news_ids:
        ``[N]`` ids returned by :meth:`recall` (default: positions 0 … N−1).

    Attributes
    ----------
    score_matrix:
        ``float32[B, N]``: P = eᵛ Rᵀ (computed in float64, stored in float32).
    """

    def __init__(self, values: ArrayLike, news_vectors: ArrayLike,
                 news_ids: Sequence | np.ndarray | None = None) -> None:
        v, r = _np(values, np.float64), _np(news_vectors, np.float64)
        if v.ndim != 2 or r.ndim != 2 or v.shape[1] != r.shape[1]:
            raise ConfigError(f"values [B, d] and news_vectors [N, d] must share d, got "
                              f"{v.shape} and {r.shape}")
        self.score_matrix = np.ascontiguousarray((v @ r.T).astype(np.float32))
        self.news_ids = np.arange(r.shape[0]) if news_ids is None else np.asarray(news_ids)
        if self.news_ids.shape != (r.shape[0],):
            raise ConfigError(f"news_ids has shape {self.news_ids.shape}, expected "
                              f"({r.shape[0]},)")

    @property
    def num_basis(self) -> int:
        return int(self.score_matrix.shape[0])

    def __len__(self) -> int:
        return int(self.score_matrix.shape[1])

    def channel_scores(self, alpha: ArrayLike) -> np.ndarray:
        """αᵀP: ``[..., B]`` → ``float32[..., N]`` (= r̂·Rᵀ)."""
        a = _np(alpha)
        if a.shape[-1] != self.num_basis:
            raise ConfigError(f"alpha has {a.shape[-1]} weights, the index has B = "
                              f"{self.num_basis} basic interests")
        return a @ self.score_matrix

    def recall(self, alpha: ArrayLike, quotas: ArrayLike, total: int) -> np.ndarray:
        """R recalled news ids for one user (``alpha [M, B]``, ``quotas [M]``) → ``[R]``,
        or for a batch (``[b, M, B]``, ``[b, M]``) → ``[b, R]``; see the module docstring."""
        a, q = _np(alpha), _np(quotas, np.float64)
        if a.ndim == 2:
            return self.news_ids[recall_from_scores(self.channel_scores(a), q, total)]
        if a.ndim != 3 or q.shape != a.shape[:2]:
            raise ConfigError(f"expected alpha [M, B] with quotas [M], or [b, M, B] with "
                              f"[b, M]; got {a.shape} and {q.shape}")
        scores = self.channel_scores(a)
        return np.stack([self.news_ids[recall_from_scores(scores[u], q[u], total)]
                         for u in range(a.shape[0])]) if a.shape[0] else \
            np.empty((0, total), dtype=self.news_ids.dtype)


IndexKind = Literal["flat", "hnsw"]


class DenseIndex:
    """Inner-product search over d-dim news vectors with faiss (YoutubeNet / VDP baselines).

    Parameters
    ----------
    news_vectors:
        ``[N, d]`` pool vectors (stored as float32).
    news_ids:
        ``[N]`` ids returned by :meth:`search` (default: positions).
    kind:
        ``"flat"``: exact search (``faiss.IndexFlatIP``); ``"hnsw"``: approximate
        (``faiss.IndexHNSWFlat`` with inner-product metric).
    hnsw_m, ef_construction, ef_search:
        HNSW graph degree and build/search beam widths (ignored for ``"flat"``).
    """

    def __init__(self, news_vectors: ArrayLike, news_ids: Sequence | np.ndarray | None = None,
                 *, kind: IndexKind = "flat", hnsw_m: int = 32, ef_construction: int = 40,
                 ef_search: int = 64) -> None:
        x = _np(news_vectors)
        if x.ndim != 2 or x.shape[0] == 0:
            raise ConfigError(f"news_vectors must be [N >= 1, d], got shape {x.shape}")
        if not np.isfinite(x).all():
            raise ConfigError("news_vectors contain NaN or inf")
        d = x.shape[1]
        self.index: faiss.Index
        if kind == "flat":
            self.index = faiss.IndexFlatIP(d)
        elif kind == "hnsw":
            for name, value in (("hnsw_m", hnsw_m), ("ef_construction", ef_construction),
                                ("ef_search", ef_search)):
                if not (isinstance(value, int) and value >= 1):
                    raise ConfigError(f"invalid '{name}': got {value!r}, expected an int >= 1")
            hnsw = faiss.IndexHNSWFlat(d, hnsw_m, faiss.METRIC_INNER_PRODUCT)
            hnsw.hnsw.efConstruction = ef_construction
            hnsw.hnsw.efSearch = ef_search
            self.index = hnsw
        else:
            raise ConfigError(f"invalid index 'kind': got {kind!r}, expected 'flat' or 'hnsw'")
        self.kind = kind
        self.index.add(x)
        self.news_ids = np.arange(x.shape[0]) if news_ids is None else np.asarray(news_ids)
        if self.news_ids.shape != (x.shape[0],):
            raise ConfigError(f"news_ids has shape {self.news_ids.shape}, expected "
                              f"({x.shape[0]},)")

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def search(self, queries: ArrayLike, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k news by inner product.

        Parameters
        ----------
        queries:
            ``[d]`` or ``[n, d]`` user vectors.
        k:
            1 ≤ k ≤ N.

        Returns
        -------
        ``(scores float32[n, k], ids [n, k])`` best first (``[k]`` each for a single query).
        """
        q = _np(queries)
        single = q.ndim == 1
        q = np.atleast_2d(q)
        if q.ndim != 2 or q.shape[1] != self.index.d:
            raise ConfigError(f"queries must be [n, {self.index.d}], got shape {q.shape}")
        k = _check_total(k, len(self))
        if k == 0:
            raise ConfigError("invalid 'k': got 0, expected >= 1")
        scores, positions = self.index.search(q, k)
        if (positions < 0).any():  # HNSW may return fewer than k results
            raise ConfigError(f"the {self.kind} index returned fewer than k = {k} results; "
                              f"increase ef_search")
        ids = self.news_ids[positions]
        return (scores[0], ids[0]) if single else (scores, ids)


__all__ = ["DenseIndex", "ScoreSpaceIndex", "allocate_quotas", "merge_rankings",
           "recall_from_scores", "top_k"]
