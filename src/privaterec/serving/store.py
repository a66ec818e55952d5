"""The served news pool: articles in SQLite, news vectors and score matrices beside them.

A store directory holds

* ``news.sqlite`` (stdlib ``sqlite3``, WAL) — table ``news`` (pool position, news id,
  category, subcategory, title, abstract, slot) and table ``meta`` (encoder version, d, the
  score spaces and their bases' digest, file generation, committed slot count);
* ``vectors.g<G>.f32`` — news vectors R, raw little-endian float32 rows of d, one per slot;
* ``scores-<space>.g<G>.f32`` — for each score space (``privaterec``: the basic vectors b;
  ``recall``: Uni-FedRec's value embeddings eᵛ) the rows of Pᵀ = R·bᵀ, B floats per slot.

The score matrices P = b·Rᵀ ``[B, N]`` are the server side of PrivateRec Alg. 1 in the B-dim
score space (docs/architecture.md#performance-design): the scores of ũ = Σ α̃ᵢ bᵢ are ũ·Rᵀ = α̃ᵀP.

Atomic ingestion (log-structured): new vectors are *appended* to the files at slots beyond the
committed count and fsynced, then one SQLite transaction inserts/updates the articles (an
updated article points at its new slot) and advances the committed count. That commit is the
only switch: a failure before it truncates the files back, a crash before it leaves a tail
that the next open discards, so the previous pool is always intact. Dead slots (of updated
articles) are compacted into a new file generation when they outnumber the live ones; a
generation switch (compaction, a new news encoder, new bases) is also one SQLite commit.

In memory the pool is an immutable :class:`NewsPool` snapshot; ingestion builds the next one
and swaps the reference, so concurrent readers see the old or the new pool, never a mix.
A store directory is used by one process at a time (``store.lock``).

Versions (local ranking, :mod:`privaterec.ondevice.pool_format`): every committed change of the
pool's content advances ``pool_version`` (meta) by one, in the same SQLite transaction; each
article stores the version its current record was written at and removed ids are kept as
tombstones (table ``removed``), so a device at version v can be sent only what changed since
v. Compaction keeps the version (same content); a re-encode or new bases rewrite every record
at a new version that also becomes ``base_version`` (older devices then need the full pool).
``pool_id`` (random, made once) names the store, so versions of different stores never mix.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sqlite3
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from privaterec.data.records import NewsRecord
from privaterec.errors import PrivateRecError

FORMAT_VERSION = 1
INGEST_BATCH = 1000

Encoder = Callable[[Sequence[NewsRecord]], np.ndarray]
"""Articles → ``float32[n, d]`` news vectors (the ranker's news encoder Θ_N)."""

POOL_FIELDS = ("news_id", "category", "subcategory", "title", "abstract")
"""The fields of a :class:`~privaterec.data.records.NewsRecord` the pool keeps (the columns
of table ``news``) and the API serves; in the pool the others (url, entities) are empty."""


class StoreError(PrivateRecError):
    """A news store cannot be opened or written (the message names the directory)."""


def pool_record(record: NewsRecord) -> NewsRecord:
    """``record`` as the pool keeps it: its :data:`POOL_FIELDS`, the other fields empty."""
    return NewsRecord(record.news_id, record.category, record.subcategory, record.title,
                      record.abstract)


def article_json(record: NewsRecord) -> dict[str, str]:
    """The API's article object: the :data:`POOL_FIELDS` of ``record``."""
    return {name: getattr(record, name) for name in POOL_FIELDS}


@dataclass(frozen=True)
class IngestResult:
    """What one :meth:`NewsStore.upsert` did."""

    added: int
    updated: int
    num_news: int


SAMPLE_SIZE = 1024
"""Scores sampled (evenly strided) to guess a top-k threshold on large pools."""


def top_k_positions(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest of ``scores`` ``[N]``, best first, ties by lower position.

    Always the exact ranking ``sorted(range(N), key=lambda i: (-scores[i], i))[:k]``.
    ``scores`` must be finite and 1 ≤ k ≤ N.

    Large pools (N ≥ 4·``SAMPLE_SIZE``, k ≤ N/64): a threshold t is guessed from an evenly
    strided sample of the scores (its j-th largest, j chosen so that ≈ 3k + 3·stride scores
    should reach it), the candidates ``scores >= t`` are found in one vectorised pass and
    ranked. This is exact whenever at least k scores reach t: the k-th largest score is
    then ≥ t, so every member of the top k — ties at the k-th value included — is a
    candidate. Otherwise (an unlucky or adversarial sample), and for small pools,
    ``np.argpartition`` then a sort of the k selected, the lowest positions winning a tie
    at the partition boundary. The sampled path reads the N scores once with no
    partitioning, several times cheaper than ``argpartition`` for k ≪ N.
    """
    n = scores.shape[0]
    if k >= n:
        chosen = np.arange(n)
        return chosen[np.lexsort((chosen, -scores))]
    if n >= 4 * SAMPLE_SIZE and k <= n // 64:
        stride = n // SAMPLE_SIZE
        sample = scores[::stride]
        j = min(sample.size, 3 * k // stride + 3)
        threshold = np.partition(sample, sample.size - j)[sample.size - j]
        candidates = np.flatnonzero(scores >= threshold)
        if k <= candidates.size <= max(64 * k, n // 16):
            values = scores[candidates]
            if candidates.size > 4 * k:  # keep the k best (and every tie at the k-th value)
                kth = np.partition(values, candidates.size - k)[candidates.size - k]
                keep = values >= kth
                candidates, values = candidates[keep], values[keep]
            return candidates[np.lexsort((candidates, -values))[:k]]
    chosen = np.argpartition(scores, n - k)[n - k:]
    values = scores[chosen]
    threshold = values.min()
    if np.count_nonzero(scores == threshold) != np.count_nonzero(values == threshold):
        above = chosen[values > threshold]
        tied = np.flatnonzero(scores == threshold)[:k - above.size]
        chosen = np.concatenate([above, tied])
    return chosen[np.lexsort((chosen, -scores[chosen]))]


class NewsPool:
    """An immutable snapshot of the pool (never mutated after construction).

    Attributes
    ----------
    articles:
        ``N`` articles in pool order (position ``i`` ↔ column ``i`` of every matrix).
    positions:
        News id → position.
    vectors:
        ``float32[N, d]`` news vectors R (read-only).
    scores:
        Space name → ``float32[B, N]`` score matrix P = b·Rᵀ (read-only, C-contiguous).
    version:
        The pool version (monotone; see the module docstring).
    versions:
        ``int64[N]``: the version each article's record was written at (read-only).
    pool_id:
        The store's identity.
    base_version:
        Oldest version a device may sync from incrementally.
    removed:
        Tombstones ``(version, news_id)`` of removed articles, oldest first.
    cache:
        Encodings of this snapshot (downloads), filled lazily by the server.
    """

    def __init__(self, articles: Sequence[NewsRecord], vectors: np.ndarray,
                 scores: Mapping[str, np.ndarray],
                 positions: dict[str, int] | None = None, *, version: int = 0,
                 versions: np.ndarray | None = None, pool_id: str = "",
                 base_version: int = 0,
                 removed: Sequence[tuple[int, str]] = ()) -> None:
        self.articles: tuple[NewsRecord, ...] = tuple(articles)
        self.positions = (positions if positions is not None else
                          {a.news_id: i for i, a in enumerate(self.articles)})
        self.vectors = _frozen(vectors)
        self.scores = {name: _frozen(np.ascontiguousarray(p)) for name, p in scores.items()}
        self.version = int(version)
        versions = (np.full(len(self.articles), self.version, np.int64) if versions is None
                    else np.asarray(versions, dtype=np.int64))
        versions.flags.writeable = False
        self.versions = versions
        self.pool_id = pool_id
        self.base_version = int(base_version)
        self.removed: tuple[tuple[int, str], ...] = tuple(removed)
        self.cache: dict[object, object] = {}

    def __len__(self) -> int:
        return len(self.articles)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def get(self, news_id: str) -> NewsRecord | None:
        position = self.positions.get(news_id)
        return None if position is None else self.articles[position]

    def space_scores(self, space: str, weights: np.ndarray) -> np.ndarray:
        """Scores in the B-dim score space: ``weights [..., B]`` → ``float32[..., N]`` (α̃ᵀP)."""
        return np.asarray(weights, dtype=np.float32) @ self.scores[space]

    def dense_scores(self, user: np.ndarray) -> np.ndarray:
        """Exact d-dim inner products u·Rᵀ: ``[d]`` → ``float32[N]`` (VDP)."""
        return self.vectors @ np.asarray(user, dtype=np.float32)


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.asarray(array, dtype=np.float32)
    array.flags.writeable = False
    return array


def basis_digest(bases: Mapping[str, np.ndarray]) -> str:
    """SHA-256 of the score spaces' names, shapes and float32 values."""
    h = hashlib.sha256()
    for name in sorted(bases):
        b = np.ascontiguousarray(bases[name], dtype=np.float32)
        h.update(name.encode())
        h.update(repr(b.shape).encode())
        h.update(b.tobytes())
    return h.hexdigest()


def _space_scores(vectors: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """Pᵀ rows ``float32[n, B]`` = R·bᵀ, computed in float64."""
    return (vectors.astype(np.float64) @ basis.astype(np.float64).T).astype(np.float32)


class NewsStore:
    """A persistent, thread-safe news pool (see the module docstring for the layout).

    Parameters
    ----------
    path:
        The store directory (created if missing).
    dim:
        d, the size of the news vectors.
    encoder_version:
        Identity of the news encoder that produced the vectors (e.g. the ranker's model
        version). Opening a store written with another encoder re-encodes every article.
    bases:
        Score spaces: name → ``[B, d]`` basis (``privaterec``: b, ``recall``: eᵛ).
    encode:
        The news encoder (needed to ingest without explicit vectors and to re-encode).
    compact_min_slots:
        Dead slots (left by updated articles) are compacted away once they outnumber both
        the live articles and this number.

    Raises
    ------
    StoreError
        The directory is in use by another process, or holds a store of another format or
        dimension that cannot be re-encoded (no ``encode``).
    """

    _pool: NewsPool
    """The current snapshot, replaced (never mutated) under ``_lock``."""
    _db: sqlite3.Connection
    """The SQLite connection; deleted by :meth:`close`."""

    def __init__(self, path: str | Path, *, dim: int, encoder_version: str,
                 bases: Mapping[str, np.ndarray] | None = None,
                 encode: Encoder | None = None, compact_min_slots: int = 1024) -> None:
        self.path = Path(path)
        self.compact_min_slots = compact_min_slots
        self.dim = int(dim)
        self.encoder_version = encoder_version
        self.bases = {name: np.ascontiguousarray(b, dtype=np.float32)
                      for name, b in (bases or {}).items()}
        for name, b in self.bases.items():
            if b.ndim != 2 or b.shape[1] != self.dim:
                raise StoreError(f"score space {name!r}: basis has shape {b.shape}, expected "
                                 f"[B, {self.dim}]")
        self._encode = encode
        self._lock = threading.Lock()
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.path / "store.lock", "a+")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            raise StoreError(f"{self.path}: the news store is in use by another process "
                             f"(another 'privaterec serve'?); stop it or pass another "
                             f"--store") from None
        try:
            self._db = sqlite3.connect(self.path / "news.sqlite", check_same_thread=False,
                                       isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._open()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------------ public
    @property
    def pool(self) -> NewsPool:
        """The current snapshot (read it once per request)."""
        return self._pool

    def __len__(self) -> int:
        return len(self._pool)

    def get(self, news_id: str) -> NewsRecord | None:
        return self._pool.get(news_id)

    def upsert(self, articles: Sequence[NewsRecord],
               vectors: np.ndarray | None = None) -> IngestResult:
        """Add new articles and update existing ones (by news id), atomically.

        Parameters
        ----------
        articles:
            Distinct news ids; the pool keeps their :data:`POOL_FIELDS` (:func:`pool_record`).
        vectors:
            Their ``[n, d]`` news vectors; default: the store's encoder.

        Returns
        -------
        :class:`IngestResult`. The new articles are servable when this returns; on any
        exception the pool (in memory and on disk) is the previous one.
        """
        articles = [pool_record(a) for a in articles]
        ids = [a.news_id for a in articles]
        if len(set(ids)) != len(ids):
            raise ValueError("upsert: the articles must have distinct news ids")
        if not articles:
            return IngestResult(0, 0, len(self._pool))
        with self._lock:
            if vectors is None:
                if self._encode is None:
                    raise StoreError(f"{self.path}: no news encoder to encode new articles")
                vectors = self._encode(articles)
            vectors = self._check_vectors(vectors, len(articles))
            result = self._upsert_locked(articles, vectors)
            if self._slots - len(self._pool) > max(len(self._pool), self.compact_min_slots):
                self._rewrite(self._pool.vectors)
            return result

    def remove(self, news_ids: Iterable[str]) -> int:
        """Remove articles by id, atomically (unknown ids are ignored); return how many.

        The others keep their order (positions close the gap); the removal is a new pool
        version whose tombstones tell syncing devices to drop the ids.
        """
        with self._lock:
            pool = self._pool
            gone = {i for i in news_ids if i in pool.positions}
            if not gone:
                return 0
            keep = np.asarray([p for p, a in enumerate(pool.articles)
                               if a.news_id not in gone], dtype=np.int64)
            version = pool.version + 1
            articles = [pool.articles[p] for p in keep.tolist()]
            ordered = sorted(gone, key=pool.positions.__getitem__)
            with self._transaction() as db:
                db.executemany("DELETE FROM news WHERE news_id = ?", [(i,) for i in ordered])
                db.execute("UPDATE news SET position = -1 - position")
                db.executemany("UPDATE news SET position = ? WHERE position = ?",
                               [(new, -1 - int(old)) for new, old in enumerate(keep.tolist())])
                db.executemany("INSERT INTO removed (news_id, version) VALUES (?, ?)",
                               [(i, version) for i in ordered])
                self._set_meta(pool_version=version)
            self._pool = NewsPool(articles, pool.vectors[keep],
                                  {name: p[:, keep] for name, p in pool.scores.items()},
                                  version=version, versions=pool.versions[keep],
                                  pool_id=pool.pool_id, base_version=pool.base_version,
                                  removed=pool.removed + tuple((version, i) for i in ordered))
            return len(gone)

    def add_missing(self, articles: Iterable[NewsRecord], *,
                    batch_size: int = INGEST_BATCH) -> int:
        """Upsert the articles whose id is not in the pool yet (batches of ``batch_size``,
        each atomic); return how many were added."""
        pending = [a for a in articles if a.news_id not in self._pool.positions]
        unique = list({a.news_id: a for a in pending}.values())
        for start in range(0, len(unique), batch_size):
            self.upsert(unique[start:start + batch_size])
        return len(unique)

    def close(self) -> None:
        db = getattr(self, "_db", None)
        if db is not None:
            db.close()
            del self._db
        if not self._lock_file.closed:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()

    def __enter__(self) -> "NewsStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------ files
    def _file(self, kind: str, generation: int) -> Path:
        return self.path / f"{kind}.g{generation}.f32"

    def _kinds(self) -> dict[str, int]:
        """File kind → floats per slot."""
        return {"vectors": self.dim, **{f"scores-{name}": int(b.shape[0])
                                        for name, b in self.bases.items()}}

    def _rows(self, vectors: np.ndarray) -> dict[str, np.ndarray]:
        return {"vectors": vectors, **{f"scores-{name}": _space_scores(vectors, b)
                                       for name, b in self.bases.items()}}

    def _check_vectors(self, vectors: np.ndarray, n: int) -> np.ndarray:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.shape != (n, self.dim):
            raise StoreError(f"news vectors have shape {vectors.shape}, expected ({n}, "
                             f"{self.dim})")
        if not np.isfinite(vectors).all():
            raise StoreError("the news encoder produced non-finite vectors")
        return vectors

    # ------------------------------------------------------------------------ open
    def _meta(self) -> dict[str, str]:
        return dict(self._db.execute("SELECT key, value FROM meta").fetchall())

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One SQLite write transaction: committed at the end, rolled back on any exception."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _set_meta(self, **values: object) -> None:
        self._db.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                             [(k, str(v)) for k, v in values.items()])

    def _open(self) -> None:
        with self._transaction() as db:
            db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            db.execute("CREATE TABLE IF NOT EXISTS news (position INTEGER PRIMARY KEY, "
                       "news_id TEXT NOT NULL UNIQUE, category TEXT NOT NULL, "
                       "subcategory TEXT NOT NULL, title TEXT NOT NULL, abstract TEXT NOT NULL, "
                       "slot INTEGER NOT NULL UNIQUE)")
            columns = {row[1] for row in db.execute("PRAGMA table_info(news)").fetchall()}
            if "version" not in columns:  # stores written before pool versions
                db.execute("ALTER TABLE news ADD COLUMN version INTEGER NOT NULL DEFAULT 0")
            db.execute("CREATE TABLE IF NOT EXISTS removed (news_id TEXT NOT NULL, "
                       "version INTEGER NOT NULL)")
            meta = self._meta()
            if not meta:
                self._set_meta(format=FORMAT_VERSION, dim=self.dim,
                               encoder_version=self.encoder_version,
                               spaces=json.dumps(self._kinds(), sort_keys=True),
                               basis_digest=basis_digest(self.bases), generation=0, slots=0)
                meta = self._meta()
            if "pool_id" not in meta:
                self._set_meta(pool_id=uuid.uuid4().hex[:16], pool_version=0, base_version=0)
                meta = self._meta()
        if int(meta["format"]) != FORMAT_VERSION:
            raise StoreError(f"{self.path}: news store format {meta['format']}, this version "
                             f"reads format {FORMAT_VERSION}; use another --store")
        self._generation = int(meta["generation"])
        self._slots = int(meta["slots"])
        articles, slots, versions = self._read_articles()
        removed = self._db.execute("SELECT version, news_id FROM removed "
                                   "ORDER BY version, rowid").fetchall()

        def snapshot(vectors: np.ndarray, scores: Mapping[str, np.ndarray]) -> NewsPool:
            return NewsPool(articles, vectors, scores, version=int(meta["pool_version"]),
                            versions=versions, pool_id=meta["pool_id"],
                            base_version=int(meta["base_version"]),
                            removed=[(int(v), str(i)) for v, i in removed])

        self._remove_stale_files()
        same_encoder = (meta["encoder_version"] == self.encoder_version
                        and int(meta["dim"]) == self.dim)
        vectors = self._read_rows("vectors", self.dim, slots) if same_encoder else None
        new_content = True  # re-encoded vectors, or the same vectors in new score spaces
        if vectors is None:
            if not articles:
                vectors = np.zeros((0, self.dim), np.float32)
            elif self._encode is None:
                raise StoreError(f"{self.path}: the stored news vectors were computed by "
                                 f"another news encoder (or are damaged) and no encoder was "
                                 f"given to re-encode them")
            else:
                vectors = self._encode(articles)
            vectors = self._check_vectors(vectors, len(articles))
        elif (meta["spaces"] == json.dumps(self._kinds(), sort_keys=True)
                and meta["basis_digest"] == basis_digest(self.bases)):
            scores = {name: self._read_rows(f"scores-{name}", int(b.shape[0]), slots)
                      for name, b in self.bases.items()}
            readable = {name: rows.T for name, rows in scores.items() if rows is not None}
            if len(readable) == len(scores):
                self._pool = snapshot(vectors, readable)
                return
            new_content = False  # a damaged score file: the same matrices, recomputed
        self._pool = snapshot(vectors, {})
        self._rewrite(vectors, new_content=new_content)

    def _read_articles(self) -> tuple[list[NewsRecord], np.ndarray, np.ndarray]:
        rows = self._db.execute("SELECT news_id, category, subcategory, title, abstract, slot, "
                                "version FROM news ORDER BY position").fetchall()
        articles = [NewsRecord(*row[:5]) for row in rows]
        return (articles, np.asarray([row[5] for row in rows], dtype=np.int64),
                np.asarray([row[6] for row in rows], dtype=np.int64))

    def _read_rows(self, kind: str, width: int, slots: np.ndarray) -> np.ndarray | None:
        """Rows ``slots`` of a file of the current generation, or ``None`` if it is damaged.

        An uncommitted tail (a crash between append and commit) is cut off here.
        """
        path = self._file(kind, self._generation)
        committed = self._slots * width * 4
        if not path.exists():
            return None if self._slots else np.zeros((0, width), np.float32)
        size = path.stat().st_size
        if size < committed:
            return None
        if size > committed:
            with open(path, "r+b") as handle:
                handle.truncate(committed)
        data = np.fromfile(path, dtype="<f4", count=self._slots * width)
        data = data.reshape(self._slots, width)
        if slots.size and (slots.max() >= self._slots or slots.min() < 0):
            return None
        rows = data[slots].astype(np.float32)
        return rows if np.isfinite(rows).all() else None

    def _remove_stale_files(self) -> None:
        for path in self.path.glob("*.g*.f32"):
            if not path.name.endswith(f".g{self._generation}.f32"):
                path.unlink(missing_ok=True)
        for path in self.path.glob("*.tmp"):
            path.unlink(missing_ok=True)

    # ------------------------------------------------------------------------ write
    def _fsync_directory(self) -> None:
        """Make new file names durable before the SQLite commit that refers to them."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _append(self, rows: Mapping[str, np.ndarray], start: int) -> None:
        created = False
        for kind, width in self._kinds().items():
            path = self._file(kind, self._generation)
            created = created or not path.exists()
            with open(path, "r+b" if path.exists() else "w+b") as handle:
                handle.seek(start * width * 4)
                handle.write(np.ascontiguousarray(rows[kind], dtype="<f4").tobytes())
                handle.truncate()
                handle.flush()
                os.fsync(handle.fileno())
        if created:
            self._fsync_directory()

    def _truncate(self, slots: int) -> None:
        for kind, width in self._kinds().items():
            path = self._file(kind, self._generation)
            if path.exists():
                with open(path, "r+b") as handle:
                    handle.truncate(slots * width * 4)

    def _commit_rows(self, inserts: list[tuple], updates: list[tuple], slots: int,
                     version: int) -> None:
        """One SQLite transaction: insert/update articles (written at ``version``), advance
        the committed slots and the pool version."""
        with self._transaction() as db:
            db.executemany("INSERT INTO news (position, news_id, category, subcategory, "
                           "title, abstract, slot, version) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                           [(*row, version) for row in inserts])
            # new slots are beyond every committed slot, so UNIQUE(slot) holds throughout
            db.executemany("UPDATE news SET category = ?, subcategory = ?, title = ?, "
                           "abstract = ?, slot = ?, version = ? WHERE position = ?",
                           [(*row[:5], version, row[5]) for row in updates])
            self._set_meta(slots=slots, pool_version=version)

    def _upsert_locked(self, articles: list[NewsRecord], vectors: np.ndarray) -> IngestResult:
        pool = self._pool
        start = self._slots
        rows = self._rows(vectors)
        new_articles = list(pool.articles)
        positions = dict(pool.positions)
        inserts: list[tuple] = []
        updates: list[tuple] = []
        added_rows: list[int] = []
        updated_rows: list[tuple[int, int]] = []  # (position, row in batch)
        for j, article in enumerate(articles):
            slot = start + j
            position = positions.get(article.news_id)
            if position is None:
                position = len(new_articles)
                positions[article.news_id] = position
                new_articles.append(article)
                inserts.append((position, article.news_id, article.category,
                                article.subcategory, article.title, article.abstract, slot))
                added_rows.append(j)
            else:
                new_articles[position] = article
                updates.append((article.category, article.subcategory, article.title,
                                article.abstract, slot, position))
                updated_rows.append((position, j))
        # the next snapshot, built before anything is written
        version = pool.version + 1
        new_vectors = np.concatenate([pool.vectors, vectors[added_rows]])
        new_scores = {name: np.concatenate([pool.scores[name],
                                            rows[f"scores-{name}"][added_rows].T], axis=1)
                      for name in self.bases}
        new_versions = np.concatenate([pool.versions,
                                       np.full(len(added_rows), version, np.int64)])
        if updated_rows:
            at = np.asarray([p for p, _ in updated_rows])
            src = np.asarray([j for _, j in updated_rows])
            new_vectors[at] = vectors[src]
            for name in self.bases:
                new_scores[name][:, at] = rows[f"scores-{name}"][src].T
            new_versions[at] = version
        snapshot = NewsPool(new_articles, new_vectors, new_scores, positions, version=version,
                            versions=new_versions, pool_id=pool.pool_id,
                            base_version=pool.base_version, removed=pool.removed)
        self._append(rows, start)
        try:
            self._commit_rows(inserts, updates, start + len(articles), version)
        except BaseException:
            self._truncate(start)
            raise
        self._slots = start + len(articles)
        self._pool = snapshot
        return IngestResult(len(inserts), len(updates), len(snapshot))

    def _rewrite(self, vectors: np.ndarray, *, new_content: bool = False) -> None:
        """Write a new file generation holding ``vectors`` (pool order) and their score
        matrices, switch to it in one commit, delete the old generation.

        ``new_content`` (re-encoded vectors or new bases): every record is rewritten at a new
        pool version, which becomes the base version (incremental syncs from before it are
        refused). Otherwise (compaction, recomputed matrices) the version is unchanged.
        """
        pool = self._pool
        version, base = pool.version, pool.base_version
        if new_content:
            version = base = pool.version + 1
        generation = self._generation + 1
        rows = self._rows(vectors)
        written = []
        try:
            for kind in self._kinds():
                path = self._file(kind, generation)
                written.append(path)
                with open(path, "wb") as handle:
                    handle.write(np.ascontiguousarray(rows[kind], dtype="<f4").tobytes())
                    handle.flush()
                    os.fsync(handle.fileno())
            self._fsync_directory()
            with self._transaction() as db:
                db.execute("UPDATE news SET slot = -1 - position")
                db.execute("UPDATE news SET slot = position")
                if new_content:
                    db.execute("UPDATE news SET version = ?", (version,))
                self._set_meta(generation=generation, slots=len(vectors), dim=self.dim,
                               pool_version=version, base_version=base,
                               encoder_version=self.encoder_version,
                               spaces=json.dumps(self._kinds(), sort_keys=True),
                               basis_digest=basis_digest(self.bases))
        except BaseException:
            for path in written:
                path.unlink(missing_ok=True)
            raise
        self._generation = generation
        self._slots = len(vectors)
        self._remove_stale_files()
        self._pool = NewsPool(pool.articles, vectors,
                              {name: rows[f"scores-{name}"].T for name in self.bases},
                              pool.positions, version=version,
                              versions=(np.full(len(pool), version, np.int64) if new_content
                                        else pool.versions),
                              pool_id=pool.pool_id, base_version=base, removed=pool.removed)


def read_articles(path: str | Path) -> list[NewsRecord]:
    """The articles of a MIND ``news.tsv`` file, or of a data directory (``news.tsv`` of the
    train and test splits, train first; see :func:`privaterec.data.mind.split_directories`),
    as the pool keeps them (:func:`pool_record`)."""
    from privaterec.data.mind import NEWS_FILE, read_news, split_directories

    path = Path(path)
    if path.is_file():
        return [pool_record(r) for r in read_news(path).values()]
    news: dict[str, NewsRecord] = {}
    dirs = split_directories(path)
    for directory in (dirs["train"], dirs["test"]):
        if directory is not None and (directory / NEWS_FILE).exists():
            for news_id, record in read_news(directory / NEWS_FILE).items():
                news.setdefault(news_id, record)
    if not news:
        raise StoreError(f"{path}: no {NEWS_FILE} found (pass a news.tsv file or a MIND data "
                         f"directory)")
    return [pool_record(r) for r in news.values()]


__all__ = ["Encoder", "INGEST_BATCH", "POOL_FIELDS", "IngestResult", "NewsPool", "NewsStore",
           "StoreError", "article_json", "basis_digest", "pool_record", "read_articles",
           "top_k_positions"]
