"""The downloadable news pool: a versioned binary of P = b·Rᵀ (or of R), full or incremental.

Local ranking (docs/serving.md, "Three ways to serve") moves PrivateRec Alg. 1 onto the device:
the server publishes the pool's score matrix P = b·Rᵀ ``[B, N]``
(docs/architecture.md#performance-design) — the same bytes for every user — and a device that holds
it computes α̃ᵀP itself, sending nothing about its user. For a ranker without basic vectors the
same is done with the d-dim news vectors R ``[N, d]`` (int8 with one scale per vector keeps them
small).

Wire format (little-endian)::

    b"PRPOOL\\x00\\x01"            8-byte magic
    uint32 H                    length of the header
    H bytes                     header, compact JSON (see below)
    ids                         zlib of the news ids, UTF-8, joined by "\\n"
    titles (optional)           zlib of the JSON list [[title, category], ...]
    scales (int8 only)          float32[n]: vector i is q_i · scale_i
    data                        [n, rows] of ``dtype`` (one record per news, pool order)

Header: ``format``, ``kind`` (``full`` | ``delta``), ``space`` (``scores``: the rows of Pᵀ,
``vectors``: R), ``dtype`` (``float32`` | ``float16`` | ``int8``), ``rows`` (B or d),
``count`` (n), ``model_version``, ``pool_id`` (identity of the server's store), ``version``
(the pool version this body brings the device to), ``titles`` (bool), ``hash`` (see below),
``ids_bytes``, ``titles_bytes``; a delta also has ``since`` (the version it applies to) and
``removed`` (ids to drop first). A full body holds the whole pool; a delta only the records
written after ``since`` (new and updated articles, in pool order) and the ids removed since.

Integrity: ``hash`` is :func:`content_hash` of the FULL pool at ``version`` — SHA-256 over the
descriptor (space, dtype, rows, count, model_version, pool_id, version, titles), the
uncompressed ids and titles, the scales and the data. It is independent of zlib, so a device
verifies a download, a delta applied to its state, or its on-disk cache by recomputing it, and
it is the ETag of the full download (``If-None-Match`` → 304).

Applying a delta (:func:`apply_delta`): drop the removed ids (keeping the order of the
others), replace the records of ids the device holds, append the others in the order sent.
The server keeps its pool in the same order (updates in place, new articles appended,
removals closing the gap), so the state after a delta equals a fresh full download — which the
hash proves.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from privaterec.errors import PrivateRecError

MAGIC = b"PRPOOL\x00\x01"
FORMAT = "privaterec.pool/1"
DTYPES = ("float32", "float16", "int8")
SPACES = ("scores", "vectors")
HASH_CHARS = 32
"""Hex characters of the content hash used as the ETag (128 bits)."""
ZLIB_LEVEL = 6
_NUMPY = {"float32": "<f4", "float16": "<f2", "int8": "i1"}
_ITEM = {"float32": 4, "float16": 2, "int8": 1}
_MAX_HEADER = 64 << 20


class PoolFormatError(PrivateRecError):
    """A pool body is malformed, does not match its hash, or cannot be applied."""


@dataclass(frozen=True, eq=False)
class PoolState:
    """A (full) pool as a device holds it: the records in wire precision.

    Attributes
    ----------
    space, dtype, rows, model_version, pool_id, version:
        As in the header (module docstring).
    ids:
        ``n`` news ids in pool order.
    data:
        ``[n, rows]`` records in ``dtype`` (float32, float16 or int8), read-only.
    scales:
        ``float32[n]`` per-record scales (int8 only, else ``None``).
    titles:
        ``n`` ``(title, category)`` pairs, or ``None`` when titles were not downloaded.
    """

    space: str
    dtype: str
    rows: int
    model_version: str
    pool_id: str
    version: int
    ids: tuple[str, ...]
    data: np.ndarray
    scales: np.ndarray | None = None
    titles: tuple[tuple[str, str], ...] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def __eq__(self, other: object) -> bool:
        """Same descriptor, ids, titles and records (arrays compared exactly)."""
        if not isinstance(other, PoolState):
            return NotImplemented
        same_scales = ((self.scales is None and other.scales is None) or
                       (self.scales is not None and other.scales is not None
                        and np.array_equal(self.scales, other.scales)))
        return (self.descriptor() == other.descriptor() and self.ids == other.ids
                and self.titles == other.titles and self.data.dtype == other.data.dtype
                and np.array_equal(self.data, other.data) and same_scales)

    __hash__ = None  # type: ignore[assignment]  # unhashable: __eq__ compares arrays

    def dense(self) -> np.ndarray:
        """The records as ``float32[n, rows]`` (int8: q · scale, elementwise in float32)."""
        if self.dtype == "int8":
            assert self.scales is not None
            return self.data.astype(np.float32) * self.scales[:, None]
        return self.data.astype(np.float32)

    def descriptor(self) -> dict[str, Any]:
        return {"format": FORMAT, "space": self.space, "dtype": self.dtype, "rows": self.rows,
                "count": len(self.ids), "model_version": self.model_version,
                "pool_id": self.pool_id, "version": self.version,
                "titles": self.titles is not None}


@dataclass(frozen=True)
class PoolDelta:
    """A decoded delta body: the records written after ``since`` and the ids removed."""

    since: int
    version: int
    hash: str
    removed: tuple[str, ...]
    records: PoolState  # the new/updated records only (its ``version`` is the new version)


def quantize(values: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray | None]:
    """``float32[n, rows]`` → ``(data [n, rows] in dtype, scales float32[n] | None)``.

    int8: per-record scale s = max|v| / 127 (0 for a zero record), q = round(v / s) in
    [-127, 127], so |v − q·s| ≤ s/2 elementwise. float16: elementwise rounding.

    Raises
    ------
    PoolFormatError
        float16 overflow (|v| > 65504) or non-finite input.
    """
    values = np.asarray(values, dtype=np.float32)
    if not np.isfinite(values).all():
        raise PoolFormatError("non-finite values cannot be encoded")
    if dtype == "float32":
        return np.ascontiguousarray(values), None
    if dtype == "float16":
        with np.errstate(over="ignore"):
            out = values.astype(np.float16)
        if not np.isfinite(out).all():
            raise PoolFormatError("values overflow float16 (|v| > 65504); use dtype float32")
        return out, None
    if dtype == "int8":
        peak = np.abs(values).max(axis=1) if values.size else np.zeros(len(values), np.float32)
        scales = (peak / np.float32(127.0)).astype(np.float32)
        safe = np.where(scales > 0, scales, np.float32(1.0))
        q = np.clip(np.rint(values / safe[:, None]), -127, 127).astype(np.int8)
        return q, scales
    raise PoolFormatError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")


def _ids_bytes(ids: Sequence[str]) -> bytes:
    return "\n".join(ids).encode("utf-8")


def _titles_bytes(titles: Sequence[tuple[str, str]]) -> bytes:
    return json.dumps([list(t) for t in titles], ensure_ascii=False,
                      separators=(",", ":")).encode("utf-8")


def content_hash(state: PoolState) -> str:
    """SHA-256 (hex) of the pool's content, independent of compression (module docstring)."""
    h = hashlib.sha256()
    h.update(json.dumps(state.descriptor(), sort_keys=True, separators=(",", ":")).encode())
    h.update(b"\0ids\0")
    h.update(_ids_bytes(state.ids))
    if state.titles is not None:
        h.update(b"\0titles\0")
        h.update(_titles_bytes(state.titles))
    if state.scales is not None:
        h.update(b"\0scales\0")
        h.update(np.ascontiguousarray(state.scales, dtype="<f4").tobytes())
    h.update(b"\0data\0")
    h.update(np.ascontiguousarray(state.data, dtype=_NUMPY[state.dtype]).tobytes())
    return h.hexdigest()


def etag_of(hash_hex: str) -> str:
    """The quoted ETag of a pool whose content hash is ``hash_hex``."""
    return f'"{hash_hex[:HASH_CHARS]}"'


def _encode(header: dict[str, Any], state: PoolState) -> bytes:
    ids = zlib.compress(_ids_bytes(state.ids), ZLIB_LEVEL)
    titles = (b"" if state.titles is None else
              zlib.compress(_titles_bytes(state.titles), ZLIB_LEVEL))
    head = json.dumps({**header, "ids_bytes": len(ids), "titles_bytes": len(titles)},
                      sort_keys=True, separators=(",", ":")).encode()
    parts = [MAGIC, struct.pack("<I", len(head)), head, ids, titles]
    if state.scales is not None:
        parts.append(np.ascontiguousarray(state.scales, dtype="<f4").tobytes())
    parts.append(np.ascontiguousarray(state.data, dtype=_NUMPY[state.dtype]).tobytes())
    return b"".join(parts)


def encode_full(state: PoolState, hash_hex: str | None = None) -> bytes:
    """The full-download body of ``state`` (``hash_hex``: its :func:`content_hash`, if known)."""
    header = {**state.descriptor(), "kind": "full",
              "hash": hash_hex or content_hash(state)}
    return _encode(header, state)


def encode_delta(records: PoolState, *, since: int, removed: Sequence[str],
                 hash_hex: str) -> bytes:
    """A delta body: ``records`` (written after ``since``) and the ``removed`` ids;
    ``hash_hex`` is the content hash of the full pool at ``records.version``."""
    header = {**records.descriptor(), "kind": "delta", "since": int(since),
              "removed": list(removed), "hash": hash_hex}
    return _encode(header, records)


def _take(body: bytes, offset: int, size: int, what: str) -> tuple[bytes, int]:
    if size < 0 or offset + size > len(body):
        raise PoolFormatError(f"truncated pool body ({what})")
    return body[offset:offset + size], offset + size


def decode(body: bytes) -> tuple[dict[str, Any], PoolState]:
    """Parse a full or delta body → ``(header, records)`` (hash NOT checked here).

    Raises
    ------
    PoolFormatError
        Bad magic, header, sizes or contents.
    """
    if len(body) < 12 or body[:8] != MAGIC:
        raise PoolFormatError("not a privaterec pool body (bad magic)")
    (size,) = struct.unpack("<I", body[8:12])
    if size > _MAX_HEADER:
        raise PoolFormatError("pool header too large")
    raw, offset = _take(body, 12, size, "header")
    try:
        header = json.loads(raw)
        space, dtype = str(header["space"]), str(header["dtype"])
        rows, count = int(header["rows"]), int(header["count"])
        if header.get("format") != FORMAT or space not in SPACES or dtype not in DTYPES \
                or rows < 1 or count < 0 or header.get("kind") not in ("full", "delta"):
            raise ValueError("unsupported format, space, dtype, kind or sizes")
        ids_raw, offset = _take(body, offset, int(header["ids_bytes"]), "ids")
        titles_raw, offset = _take(body, offset, int(header["titles_bytes"]), "titles")
        ids = tuple(zlib.decompress(ids_raw).decode("utf-8").split("\n")) if count else ()
        if len(ids) != count:
            raise ValueError(f"{len(ids)} ids for {count} records")
        titles = None
        if header.get("titles"):
            decoded = json.loads(zlib.decompress(titles_raw)) if count else []
            titles = tuple((str(t), str(c)) for t, c in decoded)
            if len(titles) != count:
                raise ValueError(f"{len(titles)} titles for {count} records")
        scales = None
        if dtype == "int8":
            raw_scales, offset = _take(body, offset, 4 * count, "scales")
            scales = np.frombuffer(raw_scales, dtype="<f4").astype(np.float32)
        raw_data, offset = _take(body, offset, _ITEM[dtype] * count * rows, "data")
        if offset != len(body):
            raise ValueError(f"{len(body) - offset} trailing bytes")
        data = np.frombuffer(raw_data, dtype=_NUMPY[dtype]).reshape(count, rows)
        state = PoolState(space=space, dtype=dtype, rows=rows,
                          model_version=str(header["model_version"]),
                          pool_id=str(header["pool_id"]), version=int(header["version"]),
                          ids=ids, data=data, scales=scales, titles=titles)
    except PoolFormatError:
        raise
    except (ValueError, KeyError, TypeError, zlib.error, UnicodeDecodeError) as exc:
        raise PoolFormatError(f"malformed pool body ({exc})") from None
    return header, state


def decode_full(body: bytes) -> PoolState:
    """Parse a full body and verify its content hash.

    Raises
    ------
    PoolFormatError
        Malformed, a delta, or the content does not match its hash (corrupted).
    """
    header, state = decode(body)
    if header["kind"] != "full":
        raise PoolFormatError("expected a full pool body, got a delta")
    if content_hash(state) != header.get("hash"):
        raise PoolFormatError("pool body does not match its content hash (corrupted)")
    return state


def decode_delta(body: bytes) -> PoolDelta:
    """Parse a delta body (its hash is checked once applied: :func:`apply_delta`)."""
    header, records = decode(body)
    if header["kind"] != "delta":
        raise PoolFormatError("expected a pool delta, got a full body")
    try:
        removed = tuple(str(i) for i in header["removed"])
        return PoolDelta(since=int(header["since"]), version=records.version,
                         hash=str(header["hash"]), removed=removed, records=records)
    except (KeyError, TypeError, ValueError) as exc:
        raise PoolFormatError(f"malformed pool delta ({exc})") from None


def apply_delta(state: PoolState, delta: PoolDelta) -> PoolState:
    """The pool after ``delta`` (module docstring), verified against the delta's hash.

    Raises
    ------
    PoolFormatError
        The delta does not apply to ``state`` (other version, pool, model, space or dtype) or
        the result does not match the hash (then download the full pool).
    """
    rec = delta.records
    if (delta.since != state.version or rec.pool_id != state.pool_id
            or rec.model_version != state.model_version or rec.space != state.space
            or rec.dtype != state.dtype or rec.rows != state.rows
            or (rec.titles is None) != (state.titles is None)):
        raise PoolFormatError(f"the delta (since version {delta.since}) does not apply to "
                              f"this pool (version {state.version})")
    gone = set(delta.removed)
    keep = [i for i, news_id in enumerate(state.ids) if news_id not in gone]
    ids = [state.ids[i] for i in keep]
    index = {news_id: j for j, news_id in enumerate(ids)}
    data = state.data[keep]  # copies (advanced indexing): updated in place below
    scales = None if state.scales is None else state.scales[keep]
    titles = None if state.titles is None else [state.titles[i] for i in keep]
    update_at, update_from, append_from = [], [], []
    for j, news_id in enumerate(rec.ids):
        at = index.get(news_id)
        if at is None:
            append_from.append(j)
        else:
            update_at.append(at)
            update_from.append(j)
    if update_at:
        data[update_at] = rec.data[update_from]
        if scales is not None and rec.scales is not None:
            scales[update_at] = rec.scales[update_from]
        if titles is not None and rec.titles is not None:
            for at, j in zip(update_at, update_from):
                titles[at] = rec.titles[j]
    data = np.concatenate([data, rec.data[append_from]])
    if scales is not None and rec.scales is not None:
        scales = np.concatenate([scales, rec.scales[append_from]])
    if titles is not None and rec.titles is not None:
        titles += [rec.titles[j] for j in append_from]
    ids += [rec.ids[j] for j in append_from]
    new = replace(state, version=delta.version, ids=tuple(ids), data=data, scales=scales,
                  titles=None if titles is None else tuple(titles))
    if content_hash(new) != delta.hash:
        raise PoolFormatError("the pool after the delta does not match the server's hash; "
                              "download the full pool")
    return new


__all__ = ["DTYPES", "FORMAT", "HASH_CHARS", "MAGIC", "PoolDelta", "PoolFormatError",
           "PoolState", "SPACES", "apply_delta", "content_hash", "decode", "decode_delta",
           "decode_full", "encode_delta", "encode_full", "etag_of", "quantize"]
