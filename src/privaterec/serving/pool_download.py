"""Server side of the pool download: encode a :class:`~privaterec.serving.store.NewsPool`
snapshot as a full body or as a delta since a version (:mod:`~privaterec.ondevice.pool_format`).

Encodings are memoised on the immutable snapshot (``pool.cache``), so the N records are
quantised, hashed and compressed once per snapshot and dtype however many devices download
them; a new snapshot (ingestion) starts afresh. Deltas are memoised per ``since`` too (up to
:data:`MAX_CACHED_DELTAS` per snapshot): devices syncing together mostly share a version.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from privaterec.ondevice.pool_format import (PoolState, content_hash, encode_delta, encode_full,
                                            etag_of, quantize)
from privaterec.serving.store import NewsPool

MAX_CACHED_DELTAS = 64
SCORE_SPACE = "privaterec"
"""The store's score space whose matrix P = b·Rᵀ is served as ``scores``."""

_lock = threading.Lock()


class VersionError(Exception):
    """A delta cannot be served: ``status`` 409 (a version the server never had) or 410
    (older than the base version, or another store: download the full pool)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class FullPool:
    """One snapshot encoded in one space and dtype."""

    state: PoolState
    hash: str
    body: bytes

    @property
    def etag(self) -> str:
        return etag_of(self.hash)


def _records(pool: NewsPool, space: str) -> np.ndarray:
    if space == "scores":
        return pool.scores[SCORE_SPACE].T  # rows of Pᵀ: [N, B]
    return pool.vectors  # [N, d]


def full_pool(pool: NewsPool, *, space: str, dtype: str, titles: bool,
              model_version: str) -> FullPool:
    """The full download of ``pool`` (memoised on the snapshot).

    Raises
    ------
    privaterec.ondevice.pool_format.PoolFormatError
        The records do not fit ``dtype`` (float16 overflow).
    """
    key = ("full", space, dtype, titles, model_version)
    cached = pool.cache.get(key)
    if cached is None:
        with _lock:
            cached = pool.cache.get(key)
            if cached is None:
                values = _records(pool, space)
                data, scales = quantize(values, dtype)
                state = PoolState(
                    space=space, dtype=dtype, rows=int(values.shape[1]),
                    model_version=model_version, pool_id=pool.pool_id, version=pool.version,
                    ids=tuple(a.news_id for a in pool.articles), data=data, scales=scales,
                    titles=(tuple((a.title, a.category) for a in pool.articles) if titles
                            else None))
                digest = content_hash(state)
                cached = FullPool(state, digest, encode_full(state, digest))
                pool.cache[key] = cached
    assert isinstance(cached, FullPool)
    return cached


def delta_pool(pool: NewsPool, *, since: int, pool_id: str, space: str, dtype: str,
               titles: bool, model_version: str) -> bytes:
    """The delta body bringing a device at version ``since`` of store ``pool_id`` to ``pool``.

    Raises
    ------
    VersionError
        409 for a version after the pool's, 410 for another store or a version before the
        base version (the device must download the full pool).
    """
    if pool_id != pool.pool_id:
        raise VersionError(410, "this pool_id is not the server's pool (the store was "
                                "replaced); download the full pool")
    if since > pool.version:
        raise VersionError(409, f"since = {since} is after the pool's version "
                                f"{pool.version}; download the full pool")
    if since < pool.base_version:
        raise VersionError(410, f"since = {since} is older than the base version "
                                f"{pool.base_version} (the pool was re-encoded); download "
                                f"the full pool")
    key = ("delta", space, dtype, titles, model_version, since)
    cached = pool.cache.get(key)
    if isinstance(cached, bytes):
        return cached
    full = full_pool(pool, space=space, dtype=dtype, titles=titles,
                     model_version=model_version)
    state = full.state
    changed = np.flatnonzero(pool.versions > since)
    records = PoolState(
        space=space, dtype=dtype, rows=state.rows, model_version=model_version,
        pool_id=pool.pool_id, version=pool.version,
        ids=tuple(state.ids[i] for i in changed.tolist()), data=state.data[changed],
        scales=None if state.scales is None else state.scales[changed],
        titles=(None if state.titles is None else
                tuple(state.titles[i] for i in changed.tolist())))
    removed = [news_id for version, news_id in pool.removed if version > since]
    body = encode_delta(records, since=since, removed=removed, hash_hex=full.hash)
    if sum(1 for k in pool.cache if isinstance(k, tuple) and k[0] == "delta") \
            < MAX_CACHED_DELTAS:
        pool.cache[key] = body
    return body


__all__ = ["FullPool", "MAX_CACHED_DELTAS", "SCORE_SPACE", "VersionError", "delta_pool",
           "full_pool"]
