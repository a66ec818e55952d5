"""The news store: persistence, atomic ingestion, thread safety, exact top-k in score space."""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privaterec.data.mind import write_news
from privaterec.data.records import NewsRecord
from privaterec.serving.store import (NewsStore, StoreError, article_json, pool_record,
                                      read_articles, top_k_positions)

D, B = 8, 3


@functools.lru_cache(maxsize=None)
def vector_of(news_id: str, version: int = 0) -> np.ndarray:
    """A deterministic vector per (id, version): lets readers check any snapshot row."""
    seed = int.from_bytes(news_id.encode(), "little") % (2 ** 32) + 7919 * version
    return np.random.default_rng(seed).standard_normal(D).astype(np.float32)


def articles(ids, title: str = "t") -> list[NewsRecord]:
    return [NewsRecord(i, "cat", "sub", f"{title} {i}", "abstract") for i in ids]


def encoder(version: int = 0):
    calls = []

    def encode(batch):
        calls.append(len(batch))
        return np.stack([vector_of(a.news_id, version) for a in batch])

    encode.calls = calls  # type: ignore[attr-defined]
    return encode


@pytest.fixture
def basis() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((B, D)).astype(np.float32)


def open_store(path: Path, basis: np.ndarray, version: str = "v1", encode=None) -> NewsStore:
    return NewsStore(path, dim=D, encoder_version=version, bases={"privaterec": basis},
                     encode=encode or encoder())


def current_file(path: Path, kind: str) -> Path:
    """The store's file of ``kind`` (one generation exists between operations)."""
    (found,) = path.glob(f"{kind}.g*.f32")
    return found


def expected_scores(basis: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    return (basis.astype(np.float64) @ vectors.astype(np.float64).T).astype(np.float32)


def check_consistent(pool, basis: np.ndarray, version_of=lambda news_id: 0) -> None:
    """Every row of a snapshot matches its article (no torn pool)."""
    n = len(pool)
    assert pool.vectors.shape == (n, D) and pool.scores["privaterec"].shape == (B, n)
    assert len(pool.positions) == n
    assert all(pool.positions[a.news_id] == i for i, a in enumerate(pool.articles))
    want = [vector_of(a.news_id, version_of(a)) for a in pool.articles]
    np.testing.assert_array_equal(pool.vectors, np.stack(want) if want else
                                  np.zeros((0, D), np.float32))
    np.testing.assert_allclose(pool.scores["privaterec"], expected_scores(basis, pool.vectors),
                               rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------- top-k
@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=40), st.data())
def test_top_k_is_the_exact_ranking_with_ties_by_position(values, data):
    scores = np.asarray(values, dtype=np.float32)  # many ties
    k = data.draw(st.integers(1, len(values)))
    want = sorted(range(len(values)), key=lambda i: (-values[i], i))[:k]
    assert top_k_positions(scores, k).tolist() == want


@pytest.mark.parametrize("kind", ["gaussian", "few values", "ascending", "descending",
                                  "tied maximum", "tie block"])
def test_top_k_large_pool_matches_full_sort(kind: str):
    """The sampled-threshold path (large pools) and its fallback are exact, whatever the
    order and ties of the scores."""
    rng = np.random.default_rng(len(kind))
    n = 20_000
    scores = rng.standard_normal(n).astype(np.float32)
    if kind == "few values":
        scores = rng.integers(-3, 4, n).astype(np.float32)
    elif kind == "ascending":
        scores = np.sort(scores)
    elif kind == "descending":
        scores = np.sort(scores)[::-1].copy()
    elif kind == "tied maximum":
        scores[rng.integers(0, n, n // 3)] = scores.max()
    elif kind == "tie block":
        scores[rng.integers(0, n, 500)] = np.sort(scores)[-300]
    for k in (1, 7, 10, 100, 312, 2000):
        want = np.lexsort((np.arange(n), -scores))[:k]
        np.testing.assert_array_equal(top_k_positions(scores, k), want)


def test_score_space_ranking_equals_exact_d_dim_ranking(tmp_path: Path):
    """α̃ᵀP (P = b·Rᵀ, float32) ranks like the exact float64 ũ·Rᵀ with ũ = Σ α̃ᵢ bᵢ."""
    rng = np.random.default_rng(2)
    b = rng.standard_normal((5, 64)).astype(np.float32)
    vectors = rng.standard_normal((5000, 64)).astype(np.float32)
    ids = [f"N{i}" for i in range(5000)]
    with NewsStore(tmp_path, dim=64, encoder_version="x", bases={"privaterec": b}) as store:
        store.upsert(articles(ids), vectors=vectors)
        pool = store.pool
        for alpha in rng.dirichlet(np.ones(5) * 0.5, size=50):
            fast = pool.space_scores("privaterec", alpha)
            exact = vectors.astype(np.float64) @ (alpha @ b.astype(np.float64))
            np.testing.assert_allclose(fast, exact, rtol=1e-4, atol=1e-4)
            want = np.lexsort((np.arange(exact.size), -exact))[:100]
            np.testing.assert_array_equal(top_k_positions(fast, 100), want)


# ------------------------------------------------------------------------ persistence
def test_upsert_serves_and_survives_restart(tmp_path: Path, basis: np.ndarray):
    with open_store(tmp_path, basis) as store:
        result = store.upsert(articles(["a", "b", "c"]))
        assert (result.added, result.updated, result.num_news) == (3, 0, 3)
        check_consistent(store.pool, basis)
        assert store.get("b") == articles(["b"])[0]
        assert store.get("zzz") is None
    encode = encoder()
    with open_store(tmp_path, basis, encode=encode) as again:
        assert [a.news_id for a in again.pool.articles] == ["a", "b", "c"]
        assert again.get("c").title == "t c"
        check_consistent(again.pool, basis)
        assert encode.calls == []  # vectors were read, not recomputed


def test_update_keeps_position_and_replaces_vector(tmp_path: Path, basis: np.ndarray):
    with open_store(tmp_path, basis) as store:
        store.upsert(articles(["a", "b", "c"]))
        new = NewsRecord("b", "cat2", "sub2", "new title", "new abstract")
        result = store.upsert([new, NewsRecord("d", title="d")],
                              vectors=np.stack([vector_of("b", 1), vector_of("d")]))
        assert (result.added, result.updated, result.num_news) == (1, 1, 4)
        version = lambda a: 1 if a.news_id == "b" else 0  # noqa: E731
        check_consistent(store.pool, basis, version)
        assert store.pool.positions["b"] == 1 and store.get("b") == new
    with open_store(tmp_path, basis) as again:
        check_consistent(again.pool, basis, version)
        assert again.get("b") == new


def test_the_pool_keeps_the_served_fields_of_a_record(tmp_path: Path, basis: np.ndarray):
    # the pool stores news_id, category, subcategory, title and abstract (its SQLite
    # columns); a record's url and entities are dropped on the way in, so what a reader gets
    # is the same before and after a restart
    full = NewsRecord("a", "cat", "sub", "title", "abstract", url="https://example.org/a",
                      title_entities='[{"Label": "x"}]', abstract_entities='[{"Label": "y"}]')
    served = NewsRecord("a", "cat", "sub", "title", "abstract")
    assert pool_record(full) == served
    assert article_json(full) == {"news_id": "a", "category": "cat", "subcategory": "sub",
                                  "title": "title", "abstract": "abstract"}
    seen = []

    def encode(batch):
        seen.extend(batch)
        return np.stack([vector_of(a.news_id) for a in batch])

    with open_store(tmp_path, basis, encode=encode) as store:
        store.upsert([full])
        assert store.get("a") == served
        assert seen == [served]  # the encoder sees the record the pool keeps
    with open_store(tmp_path, basis) as again:
        assert again.get("a") == served


def test_failed_commit_leaves_the_previous_pool(tmp_path: Path, basis: np.ndarray,
                                                monkeypatch: pytest.MonkeyPatch):
    store = open_store(tmp_path, basis)
    store.upsert(articles(["a", "b"]))
    before = store.pool
    size = current_file(tmp_path, "vectors").stat().st_size

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(store, "_commit_rows", broken)
    with pytest.raises(OSError, match="disk full"):
        store.upsert(articles(["c", "a"], title="changed"))
    assert store.pool is before  # readers never saw a partial ingest
    assert current_file(tmp_path, "vectors").stat().st_size == size  # appended rows removed
    monkeypatch.undo()
    store.upsert(articles(["e"]))
    store.close()
    with open_store(tmp_path, basis) as again:
        assert [a.news_id for a in again.pool.articles] == ["a", "b", "e"]
        assert again.get("a").title == "t a"
        check_consistent(again.pool, basis)


def test_crash_between_append_and_commit_is_discarded_on_open(tmp_path: Path,
                                                               basis: np.ndarray):
    with open_store(tmp_path, basis) as store:
        store.upsert(articles(["a", "b"]))
    # what a crash after the append and before the SQLite commit leaves behind
    for kind in ("vectors", "scores-privaterec"):
        with open(current_file(tmp_path, kind), "ab") as handle:
            handle.write(np.full(3 * D, np.nan, np.float32).tobytes())
    unfinished = tmp_path / "vectors.g99.f32"
    unfinished.write_bytes(b"garbage of an unfinished compaction")
    with open_store(tmp_path, basis) as again:
        check_consistent(again.pool, basis)
        assert len(again) == 2
        assert not unfinished.exists()
        again.upsert(articles(["c"]))
        check_consistent(again.pool, basis)


def test_new_encoder_reencodes_and_new_basis_rescores(tmp_path: Path, basis: np.ndarray):
    with open_store(tmp_path, basis) as store:
        store.upsert(articles(["a", "b"]))
    reencode = encoder(version=3)
    with open_store(tmp_path, basis, version="v2", encode=reencode) as store:
        assert reencode.calls == [2]
        check_consistent(store.pool, basis, lambda a: 3)
    other = np.ones((B + 1, D), np.float32)

    def no_encoding(batch):
        raise AssertionError("a new basis must not re-encode the news")

    with NewsStore(tmp_path, dim=D, encoder_version="v2", bases={"privaterec": other},
                   encode=no_encoding) as store:
        np.testing.assert_allclose(store.pool.scores["privaterec"],
                                   expected_scores(other, store.pool.vectors), rtol=1e-6)
    with NewsStore(tmp_path, dim=D, encoder_version="v2", bases={"privaterec": other}) as store:
        assert len(store) == 2


def test_damaged_store_without_encoder_is_a_clear_error(tmp_path: Path, basis: np.ndarray):
    with open_store(tmp_path, basis) as store:
        store.upsert(articles(["a", "b"]))
    current_file(tmp_path, "vectors").write_bytes(b"")  # lost the vectors
    with pytest.raises(StoreError, match="re-encode"):
        NewsStore(tmp_path, dim=D, encoder_version="v1", bases={"privaterec": basis})
    with open_store(tmp_path, basis) as store:  # with an encoder it rebuilds them
        check_consistent(store.pool, basis)


def test_damaged_score_file_is_recomputed_from_the_vectors(tmp_path: Path,
                                                           basis: np.ndarray):
    with open_store(tmp_path, basis) as store:
        store.upsert(articles(["a", "b"]))
        vectors = store.pool.vectors.copy()
    current_file(tmp_path, "scores-privaterec").write_bytes(b"")  # lost the score rows

    def no_encoding(batch):
        raise AssertionError("intact vectors must not be re-encoded")

    with NewsStore(tmp_path, dim=D, encoder_version="v1", bases={"privaterec": basis},
                   encode=no_encoding) as again:
        np.testing.assert_array_equal(again.pool.vectors, vectors)
        check_consistent(again.pool, basis)


def test_compaction_bounds_the_files(tmp_path: Path, basis: np.ndarray):
    with NewsStore(tmp_path, dim=D, encoder_version="v1", bases={"privaterec": basis},
                   encode=encoder(), compact_min_slots=16) as store:
        store.upsert(articles([f"n{i}" for i in range(10)]))
        for round_ in range(12):  # 120 updates of 10 news: dead slots get compacted
            store.upsert(articles([f"n{i}" for i in range(10)], title=f"r{round_}"))
            assert store._slots - len(store) <= 16 + 10
            check_consistent(store.pool, basis)
        assert len(list(tmp_path.glob("vectors.g*.f32"))) == 1
        assert current_file(tmp_path, "vectors").stat().st_size <= (16 + 20) * D * 4
    with open_store(tmp_path, basis) as again:
        assert again.get("n3").title == "r11 n3"
        check_consistent(again.pool, basis)


def test_one_process_per_store(tmp_path: Path, basis: np.ndarray):
    with open_store(tmp_path, basis):
        with pytest.raises(StoreError, match="in use"):
            open_store(tmp_path, basis)
    open_store(tmp_path, basis).close()  # released on close


def test_rejects_repeated_ids_and_bad_vectors(tmp_path: Path, basis: np.ndarray):
    with open_store(tmp_path, basis) as store:
        with pytest.raises(ValueError, match="distinct"):
            store.upsert(articles(["a", "a"]))
        with pytest.raises(StoreError, match="shape"):
            store.upsert(articles(["a"]), vectors=np.zeros((1, D + 1)))
        with pytest.raises(StoreError, match="non-finite"):
            store.upsert(articles(["a"]), vectors=np.full((1, D), np.nan))
        assert len(store) == 0


# ------------------------------------------------------------------------ concurrency
def test_concurrent_ingestion_and_queries_never_see_a_torn_pool(tmp_path: Path,
                                                                basis: np.ndarray):
    """Writers add and update news from several threads while readers score snapshots."""
    store = open_store(tmp_path, basis)
    store.upsert(articles([f"s{i}" for i in range(50)]))
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(w: int) -> None:
        try:
            for j in range(15):
                new = [f"w{w}-{j}-{i}" for i in range(4)]
                store.upsert(articles(new + [f"s{(w * 15 + j) % 50}"], title=f"w{w}"))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def reader() -> None:
        try:
            while not stop.is_set():
                pool = store.pool
                check_consistent(pool, basis)
                alpha = np.full(B, 1.0 / B)
                scores = pool.space_scores("privaterec", alpha)
                top = top_k_positions(scores, min(5, len(pool)))
                exact = pool.vectors.astype(np.float64) @ (alpha @ basis.astype(np.float64))
                assert np.argmax(exact) == top[0]
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    readers = [threading.Thread(target=reader) for _ in range(2)]
    writers = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert errors == []
    assert len(store) == 50 + 3 * 15 * 4
    final = store.pool
    store.close()
    with open_store(tmp_path, basis) as again:
        assert again.pool.articles == final.articles
        np.testing.assert_array_equal(again.pool.vectors, final.vectors)


# ---------------------------------------------------------------------------- files
def test_read_articles_from_tsv_and_mind_directory(tmp_path: Path, serving_news):
    write_news(tmp_path / "one.tsv", serving_news[:5])
    assert [a.news_id for a in read_articles(tmp_path / "one.tsv")] == \
        [r.news_id for r in serving_news[:5]]
    (tmp_path / "mind" / "train").mkdir(parents=True)
    (tmp_path / "mind" / "test").mkdir()
    write_news(tmp_path / "mind" / "train" / "news.tsv", serving_news[:4])
    write_news(tmp_path / "mind" / "test" / "news.tsv", serving_news[2:7])
    got = read_articles(tmp_path / "mind")
    assert [a.news_id for a in got] == [r.news_id for r in serving_news[:7]]
    assert got[0] == pool_record(serving_news[0])
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match="not a MIND data directory"):
        read_articles(tmp_path / "empty")
