"""Local ranking: the device downloads the whole pool and ranks it itself (ε_s = 0).

PrivateRec's basic vectors make the scores of every news a B×N matrix P = b·Rᵀ
(docs/architecture.md#performance-design), the same bytes for every user.
:class:`LocalRankingDevice` keeps a copy of P in sync (``GET /v1/pool/scores``, then deltas since
its version, :mod:`~privaterec.ondevice.pool_format`), computes α = attention(u) from its own
history with the downloaded model — exactly, without padding or noise — and ranks α·P on the device
(PrivateRec Alg. 1 moved to the device). For a ranker without basic vectors it syncs the d-dim news
vectors R instead (``vectors``; int8 with per-vector scales keeps them small) and ranks u·Rᵀ.

What the server learns: that this device downloaded (or synced) the pool, and when — a
request that does not depend on the user. Titles: ``titles="pool"`` (default) downloads every
title with the pool, so nothing else is sent; ``"lookup"`` asks ``POST /v1/news/lookup`` for
the k results only, which reveals them (they depend on the history); ``"decoys"`` mixes the k
results with random other ids in one shuffled lookup (plausible deniability, no DP
guarantee); ``"none"`` returns ids and scores only. The device's ledger records one ε = 0
event per ranking (phase ``serve``) and, for a lookup, a non-private event (ε = ∞) whose note
names the ids sent.

With ``cache_dir`` the model parameters, the pool (its full encoding, verified by its content
hash on every start: a corrupted file is detected and downloaded again) and the ledger
survive restarts.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from privaterec.data.records import NewsRecord
from privaterec.errors import CheckpointError, ConfigError
from privaterec.files import write_atomic
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.ledger import PrivacyLedger
from privaterec.serving.device_common import MAX_K, DeviceBase, check_count, check_history
from privaterec.ondevice.pool_format import (DTYPES, PoolFormatError, PoolState, apply_delta,
                                            decode_delta, decode_full, encode_full, etag_of,
                                            content_hash)
from privaterec.serving.store import top_k_positions
from privaterec.serving.transport import (ModelChangedError, ServerError, Transport, json_body,
                                          raise_for_status)
from privaterec.validators import check_choice, fail

LOCAL_USER = "device"
"""The ledger's user id (a device accounts for one user)."""
LEDGER_FILE = "local_ledger.json"
TITLE_MODES = ("pool", "lookup", "decoys", "none")
_CHUNK = 16384  # records per block when scoring int8 vectors

RANKING_NOTE = ("local ranking: the pool was ranked on the device; nothing user-dependent "
                "was sent (the server saw only that this device synced the pool)")


def ranking_event() -> PrivacyEvent:
    """The ledger event of one local ranking: ε = 0, phase ``serve``."""
    return PrivacyEvent(mechanism="none", epsilon=0.0, phase="serve", note=RANKING_NOTE)


def lookup_event(ids: Sequence[str], results: int) -> PrivacyEvent:
    """A title lookup of ``ids`` (``results`` of them are recommendations): not private."""
    decoys = len(ids) - results
    return PrivacyEvent(
        mechanism="none", epsilon=math.inf, phase="serve", dimension=max(1, len(ids)),
        note=(f"title lookup sent news ids {', '.join(ids)} ({results} recommended"
              f"{f' + {decoys} decoys, shuffled' if decoys else ''}): they depend on the "
              f"user's history, so the server learns them (decoys give no DP guarantee)"))


class LocalRankingDevice(DeviceBase):
    """A device that ranks the whole pool locally and sends nothing about its user.

    Parameters
    ----------
    base_url:
        The server, e.g. ``"http://127.0.0.1:8000"`` (or pass ``transport``).
    dtype:
        Precision of the download: ``float32`` (exact: the same top-k as the server's float32
        ranking), ``float16`` (half the bytes) or ``int8`` (per-record scale).
    space:
        ``"scores"`` (P = b·Rᵀ, B per news; needs a model with basic vectors), ``"vectors"``
        (R, d per news; any ranker) or ``"auto"`` (scores when the model has a basis).
    titles:
        ``"pool"``, ``"lookup"``, ``"decoys"`` or ``"none"`` (module docstring).
    decoys:
        Random other ids per lookup with ``titles="decoys"``.
    decoy_rng:
        Randomness of the decoys (default ``random.SystemRandom()``, the OS CSPRNG).
    cache_dir:
        Keeps the parameters, the pool and the ledger across restarts.
    transport, timeout:
        An httpx-compatible client (default ``httpx.Client(base_url)``), seconds per request.

    Attributes
    ----------
    bytes_downloaded:
        Response bytes of every pool request (full bodies and deltas) so far.
    last_sync, last_query:
        What the last sync did (``kind``: ``cache``, ``full``, ``delta``, ``not-modified``)
        and what the last query sent and returned.
    """

    def __init__(self, base_url: str | None = None, *, dtype: str = "float32",
                 space: str = "auto", titles: str = "pool", decoys: int = 20,
                 decoy_rng: random.Random | None = None, cache_dir: str | Path | None = None,
                 transport: Transport | None = None, timeout: float = 30.0) -> None:
        check_choice(dtype, "dtype", DTYPES, kind="")
        if space not in ("auto", "scores", "vectors"):
            fail("space", space, "'auto', 'scores' or 'vectors'", kind="")
        check_choice(titles, "titles", TITLE_MODES, kind="")
        if isinstance(decoys, bool) or not isinstance(decoys, int) or not 0 <= decoys <= 999:
            fail("decoys", decoys, "an integer in [0, 999]", kind="")
        self.dtype = dtype
        self.titles = titles
        self.decoys = decoys
        self.decoy_rng = decoy_rng if decoy_rng is not None else random.SystemRandom()
        super().__init__(base_url, cache_dir=cache_dir, transport=transport, timeout=timeout)
        self.ledger = self._load_ledger()
        self.bytes_downloaded = 0
        self.last_sync: dict[str, Any] | None = None
        self.last_query: dict[str, Any] | None = None
        self._requested_space = space
        self._state: PoolState | None = None
        self._matrix: np.ndarray | None = None
        self.refresh()
        self._state = self._load_cached_pool()

    # ------------------------------------------------------------------ model
    def _check_info(self, info: Mapping[str, Any]) -> None:
        """Choose the pool's space for the served model (``auto``: scores with a basis)."""
        space = self._requested_space
        if space == "auto":
            space = "scores" if info.get("basis_size") else "vectors"
        if space == "scores" and not info.get("basis_size"):
            raise ConfigError(f"the server's model {info.get('model_version')!r} has no basic "
                              f"vectors: use space='vectors' (or 'auto')")
        self.space = space

    @property
    def pool(self) -> PoolState | None:
        """The pool the device holds (``None`` before the first sync)."""
        return self._state

    @property
    def bytes_sent(self) -> int:
        """Bytes of user-dependent data the last query sent (title lookups only)."""
        return 0 if self.last_query is None else int(self.last_query["bytes_sent"])

    def spent(self) -> float:
        """Total ε this device released: 0, or ∞ after a title lookup."""
        return self.ledger.user_epsilon(LOCAL_USER, delta=0.0) \
            if LOCAL_USER in self.ledger.users else 0.0

    # ------------------------------------------------------------------ files
    def _pool_path(self) -> Path | None:
        if self.cache_dir is None:
            return None
        suffix = "-titles" if self.titles == "pool" else ""
        return self.cache_dir / f"pool-{self.space}-{self.dtype}{suffix}.bin"

    def _load_cached_pool(self) -> PoolState | None:
        """The pool saved by an earlier run, if it is intact and for the current model.

        A file whose content does not match its hash (corrupted, truncated) is deleted and
        recorded in ``last_sync`` (``kind``: ``cache-rejected``); the next sync downloads."""
        path = self._pool_path()
        if path is None or not path.exists():
            return None
        try:
            state = decode_full(path.read_bytes())
        except PoolFormatError as exc:
            path.unlink(missing_ok=True)
            self.last_sync = {"kind": "cache-rejected", "reason": str(exc), "bytes": 0}
            return None
        if state.model_version != self.model_version or state.space != self.space \
                or state.dtype != self.dtype:
            return None
        self.last_sync = {"kind": "cache", "bytes": 0, "version": state.version}
        return state

    def _save_pool(self, state: PoolState) -> None:
        path = self._pool_path()
        if path is not None:
            write_atomic(path, encode_full(state))

    def _load_ledger(self) -> PrivacyLedger:
        path = None if self.cache_dir is None else self.cache_dir / LEDGER_FILE
        if path is None or not path.exists():
            return PrivacyLedger()
        try:
            return PrivacyLedger.from_dict(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError, CheckpointError) as exc:
            raise CheckpointError(f"{path}: unreadable device ledger ({exc}); restore it, or "
                                  f"delete it only if you accept losing the record of past "
                                  f"releases") from None

    def _record(self, events: Sequence[PrivacyEvent]) -> None:
        for event in events:
            self.ledger.record(LOCAL_USER, event)
        if self.cache_dir is not None:
            write_atomic(self.cache_dir / LEDGER_FILE, json.dumps(self.ledger.to_dict()))

    # ------------------------------------------------------------------ sync
    def _get(self, path: str, etag: str | None) -> Any:
        """An (idempotent) GET, retried once when the connection failed — e.g. a keep-alive
        connection the server closed while the device was idle."""
        headers = {"If-None-Match": etag} if etag else None
        try:
            response = self._http.send_raw("GET", path, None, headers)
        except ServerError:  # the server could not be reached: once more
            response = self._http.send_raw("GET", path, None, headers)
        self.bytes_downloaded += len(response.content)
        return response

    def _query(self) -> str:
        titles = "true" if self.titles == "pool" else "false"
        return f"dtype={self.dtype}&titles={titles}"

    def _download_full(self) -> PoolState:
        url = f"/v1/pool/{self.space}?{self._query()}"
        response = raise_for_status(self._get(url, None), "GET", url)
        try:
            state = decode_full(bytes(response.content))
        except PoolFormatError as exc:
            raise ServerError("GET", url, response.status_code, str(exc)) from None
        if response.headers.get("etag") not in (None, etag_of(content_hash(state))):
            raise ServerError("GET", url, response.status_code, "ETag does not match the "
                                                                 "body's content hash")
        self.last_sync = {"kind": "full", "bytes": len(response.content),
                          "version": state.version}
        return state

    def _delta(self, state: PoolState) -> PoolState | None:
        """``state`` brought up to date by a delta, or ``None`` if a full download is needed."""
        url = (f"/v1/pool/{self.space}/delta?since={state.version}&pool_id={state.pool_id}"
               f"&{self._query()}")
        response = self._get(url, etag_of(content_hash(state)))
        if response.status_code == 304:
            self.last_sync = {"kind": "not-modified", "bytes": len(response.content),
                              "version": state.version}
            return state
        if response.status_code in (409, 410):
            return None
        raise_for_status(response, "GET", url)
        try:
            delta = decode_delta(bytes(response.content))
            if delta.records.model_version != state.model_version:
                return None
            new = apply_delta(state, delta)
        except PoolFormatError:
            return None  # e.g. a hash mismatch: start again from a full download
        self.last_sync = {"kind": "delta", "bytes": len(response.content),
                          "version": new.version, "records": len(delta.records),
                          "removed": len(delta.removed)}
        return new

    def sync(self) -> PoolState:
        """Bring the pool up to date: a conditional delta (304 when nothing changed), or the
        full download the first time, after a model change, or when a delta cannot apply.

        Raises
        ------
        ModelChangedError
            The pool belongs to a model other than the one announced by ``/v1/model``.
        ServerError
            The server refused a request or sent an unreadable body.
        """
        state = self._state
        if state is not None and state.model_version != self.model_version:
            state = None  # the pool of an older model: start afresh
        new = None if state is None else self._delta(state)
        if new is None:
            new = self._download_full()
            if new.model_version != self.model_version:
                self.refresh()
                if new.model_version != self.model_version:
                    raise ModelChangedError("GET", f"/v1/pool/{self.space}", 200,
                                            f"the pool is for model {new.model_version!r}, "
                                            f"the server announces {self.model_version!r}")
        if new is not state:
            self._state = new
            self._matrix = None
            self._save_pool(new)
        return new

    # ------------------------------------------------------------------ ranking
    @torch.no_grad()
    def user_weights(self, history: Sequence[NewsRecord]) -> np.ndarray:
        """What the device scores the pool with, computed from its own history (never sent):
        α (:meth:`~privaterec.models.recommender.Recommender.attention`) ``float32[B]`` for ``scores``, u ``float32[d]`` for ``vectors``."""
        items = check_history(history)
        vectors, mask, _ = self._model.history_tensors(items)
        model = self._model.model
        if self.space == "scores":
            assert model.basis is not None
            weights = model.attention(vectors, mask)[0]
        else:
            weights = model.encode_user(vectors, mask)[0]
        return weights.detach().cpu().numpy().astype(np.float32)

    def _scoring_matrix(self) -> np.ndarray:
        state = self._require_pool()
        if self._matrix is None:
            if self.space == "scores":
                self._matrix = np.ascontiguousarray(state.dense().T)  # P [B, N]
            else:
                self._matrix = (state.data if state.dtype == "int8"
                                else np.ascontiguousarray(state.data.astype(np.float32)))
        return self._matrix

    def _require_pool(self) -> PoolState:
        if self._state is None:
            raise ConfigError("the device holds no pool yet: call sync() (or recommend() "
                              "with sync=True) first")
        return self._state

    def scores(self, weights: np.ndarray) -> np.ndarray:
        """Scores of every news of the pool ``float32[N]``: α·P (``scores``) or R·u."""
        matrix = self._scoring_matrix()
        w = np.asarray(weights, dtype=np.float32)
        if self.space == "scores":
            return w @ matrix  # the server's own computation (NewsPool.space_scores)
        state = self._require_pool()
        if state.dtype != "int8":
            return matrix @ w
        assert state.scales is not None
        out = np.empty(len(state), dtype=np.float32)
        for lo in range(0, len(state), _CHUNK):
            block = matrix[lo:lo + _CHUNK].astype(np.float32)
            out[lo:lo + _CHUNK] = (block @ w) * state.scales[lo:lo + _CHUNK]
        return out

    def rank(self, history: Sequence[NewsRecord], k: int = 10) -> list[tuple[str, float]]:
        """The top ``k`` ``(news_id, score)`` of the pool the device holds, best first, ties
        by pool order (:func:`~privaterec.serving.store.top_k_positions`). No request."""
        state = self._require_pool()
        k = check_count(k, "k", min(MAX_K, len(state)),
                        why="at most 1000 and the pool's size")
        scores = self.scores(self.user_weights(history))
        top = top_k_positions(scores, k)
        return [(state.ids[p], float(scores[p])) for p in top.tolist()]

    def recommend(self, history: Sequence[NewsRecord], k: int = 10, *,
                  sync: bool = True) -> list[dict[str, Any]]:
        """Top-``k`` news for this user, ranked on the device.

        Parameters
        ----------
        history:
            The news this user read, oldest first (only the last H are used).
        k:
            Number of results (1 ≤ k ≤ min(1000, N)).
        sync:
            Sync the pool first (one conditional request; 304 when unchanged).

        Returns
        -------
        ``{"news_id", "title", "category", "score"}`` best first (title and category
        ``None`` with ``titles="none"``).
        """
        started = time.perf_counter()
        if sync or self._state is None:
            self.sync()
        ranked = self.rank(history, k)
        ids = [news_id for news_id, _ in ranked]
        meta, sent = self._titles(ids)
        events = [ranking_event()]
        if sent:
            events.append(lookup_event(sent, len(ids)))
        self._record(events)
        items = [{"news_id": news_id, "title": meta.get(news_id, (None, None))[0],
                  "category": meta.get(news_id, (None, None))[1], "score": score}
                 for news_id, score in ranked]
        state = self._require_pool()
        self.last_query = {"sent": {"lookup": sent} if sent else None,
                           "bytes_sent": len(json_body({"ids": sent})) if sent else 0,
                           "pool_version": state.version, "sync": dict(self.last_sync or {}),
                           "items": items, "model_version": self.model_version,
                           "seconds": time.perf_counter() - started}
        return items

    def _titles(self, ids: list[str]) -> tuple[dict[str, tuple[str, str]], list[str]]:
        """``(news_id → (title, category), ids sent to the server)``."""
        state = self._require_pool()
        if self.titles == "none":
            return {}, []
        if self.titles == "pool":
            assert state.titles is not None
            position = {news_id: i for i, news_id in enumerate(state.ids)} \
                if len(ids) > 64 else None
            out = {}
            for news_id in ids:
                i = position[news_id] if position is not None else state.ids.index(news_id)
                out[news_id] = state.titles[i]
            return out, []
        sent = list(ids)
        if self.titles == "decoys" and self.decoys:
            chosen = set(ids)
            others = [i for i in range(len(state)) if state.ids[i] not in chosen]
            picks = self.decoy_rng.sample(others, min(self.decoys, len(others)))
            sent += [state.ids[i] for i in picks]
            self.decoy_rng.shuffle(sent)
        response = self._http.post_json("/v1/news/lookup", json_body({"ids": sent}))
        found = {str(a["news_id"]): (str(a.get("title", "")), str(a.get("category", "")))
                 for a in response.get("news", [])}
        return {i: found[i] for i in ids if i in found}, sent


__all__ = ["LEDGER_FILE", "LOCAL_USER", "LocalRankingDevice", "RANKING_NOTE", "TITLE_MODES",
           "lookup_event", "ranking_event"]
