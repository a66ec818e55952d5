"""Local ranking: pool download, ETag/304, incremental sync, the on-device ranker.

The server is the real app over a store of the 110 synthetic articles (``served_app``); the
device talks to it through the ``TestClient`` transport.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from privaterec.data.records import NewsRecord
from privaterec.serving.app import create_app
from privaterec.serving.bundle import ServingModels
from privaterec.serving.client import LocalRankingDevice
from privaterec.ondevice.pool_format import (PoolFormatError, apply_delta, content_hash,
                                            decode, decode_delta, decode_full, encode_full,
                                            etag_of, quantize)
from privaterec.serving.store import article_json, top_k_positions


def new_articles(prefix: str, n: int) -> list[NewsRecord]:
    return [NewsRecord(f"{prefix}{i}", "sports", "golf", f"golf open round {i} {prefix}",
                       "players at the open") for i in range(n)]


def full(client: TestClient, space: str = "scores", **params: str):
    return client.get(f"/v1/pool/{space}", params=params)


# ----------------------------------------------------------------------------- server
def test_full_download_is_the_pool_with_its_hash_as_etag(served_app, served_store):
    response = full(served_app)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/octet-stream"
    state = decode_full(response.content)  # verifies the content hash
    pool = served_store.pool
    assert response.headers["etag"] == etag_of(content_hash(state))
    assert int(response.headers["x-pool-version"]) == pool.version == state.version
    assert state.ids == tuple(a.news_id for a in pool.articles)
    np.testing.assert_array_equal(state.data, pool.scores["privaterec"].T)  # float32: exact
    assert len(response.content) < 4 * 5 * len(pool) + 1200  # P plus ids and header


def test_conditional_request_is_304_without_a_body(served_app):
    first = full(served_app, dtype="float16")
    etag = first.headers["etag"]
    again = served_app.get("/v1/pool/scores", params={"dtype": "float16"},
                           headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    assert again.headers["etag"] == etag
    other = served_app.get("/v1/pool/scores", params={"dtype": "float16"},
                           headers={"If-None-Match": '"0123"'})
    assert other.status_code == 200 and other.content == first.content


def ingest(client, token: str, articles) -> None:
    """POST ``articles`` through the write API of ``served_app`` (its test token)."""
    from privaterec.serving.writer import NewsWriter

    NewsWriter(token=token, transport=client).add(articles)


def test_ingestion_changes_the_etag_and_advances_the_version(served_app, write_token):
    before = full(served_app)
    ingest(served_app, write_token, new_articles("x", 2))
    after = served_app.get("/v1/pool/scores", headers={"If-None-Match": before.headers["etag"]})
    assert after.status_code == 200 and after.headers["etag"] != before.headers["etag"]
    assert int(after.headers["x-pool-version"]) == int(before.headers["x-pool-version"]) + 1


def test_delta_holds_only_new_columns_and_removed_ids(served_app, served_store, write_token):
    start = full(served_app)
    state = decode_full(start.content)
    ingest(served_app, write_token, new_articles("n", 3))
    served_store.remove([state.ids[4]])
    response = served_app.get("/v1/pool/scores/delta",
                              params={"since": state.version, "pool_id": state.pool_id})
    assert response.status_code == 200
    delta = decode_delta(response.content)
    assert delta.records.ids == ("n0", "n1", "n2") and delta.removed == (state.ids[4],)
    assert len(response.content) < len(start.content) / 4
    updated = apply_delta(state, delta)
    assert updated == decode_full(full(served_app).content)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
@pytest.mark.parametrize("titles", ["false", "true"])
def test_state_after_sync_equals_a_fresh_download(served_app, served_store, dtype, titles,
                                                  write_token):
    params = {"dtype": dtype, "titles": titles}
    state = decode_full(full(served_app, **params).content)
    # new, updated (in place), removed, removed-then-re-added
    ingest(served_app, write_token, new_articles("a", 4))
    changed = NewsRecord(state.ids[0], "news", "world", "a completely new title", "")
    served_store.upsert([changed])
    served_store.remove([state.ids[1], "a2"])
    served_store.upsert([NewsRecord(state.ids[1], "news", "us", "back again", "")])
    ingest(served_app, write_token, new_articles("b", 2))
    response = served_app.get("/v1/pool/scores/delta",
                              params={"since": state.version, "pool_id": state.pool_id,
                                      **params})
    synced = apply_delta(state, decode_delta(response.content))
    fresh = decode_full(full(served_app, **params).content)
    assert synced == fresh  # ids, order, records, scales, titles, version
    np.testing.assert_array_equal(synced.data, fresh.data)
    assert content_hash(synced) == content_hash(fresh)
    assert synced.ids[0] == state.ids[0] and synced.ids[-3:] == (state.ids[1], "b0", "b1")


def test_bad_versions_get_4xx(served_app, served_store):
    state = decode_full(full(served_app).content)
    url = "/v1/pool/scores/delta"
    assert served_app.get(url, params={"since": state.version + 1,
                                       "pool_id": state.pool_id}).status_code == 409
    assert served_app.get(url, params={"since": 0, "pool_id": "abc123"}).status_code == 410
    for params in ({"since": -1, "pool_id": state.pool_id}, {"since": "x", "pool_id": "a"},
                   {"pool_id": state.pool_id}, {"since": 0, "pool_id": "not hex!"},
                   {"since": 0, "pool_id": state.pool_id, "dtype": "float64"}):
        response = served_app.get(url, params=params)
        assert response.status_code == 422, params
    assert served_app.get("/v1/pool/other").status_code == 422
    assert served_app.get("/v1/pool/scores", params={"dtype": "int4"}).status_code == 422
    nothing = served_app.get(url, params={"since": state.version, "pool_id": state.pool_id})
    assert nothing.status_code == 200 and decode_delta(nothing.content).records.ids == ()


def test_versions_are_persistent_and_a_reencode_refuses_older_deltas(served_store, tmp_path,
                                                                      serving_models):
    from privaterec.serving.server import open_store

    served_store.upsert(new_articles("p", 2))
    version, pool_id, path = served_store.pool.version, served_store.pool.pool_id, \
        served_store.path
    served_store.close()
    with open_store(serving_models, path) as again:
        assert (again.pool.version, again.pool.pool_id) == (version, pool_id)
        assert again.pool.versions.max() == version
    # another encoder: every record is rewritten at a new base version
    from privaterec.serving.store import NewsStore
    with NewsStore(path, dim=serving_models.dim, encoder_version="other",
                   bases=serving_models.score_bases(),
                   encode=serving_models.encode_news) as other:
        assert other.pool.version == other.pool.base_version == version + 1
        app = TestClient(create_app(other, serving_models))
        old = app.get("/v1/pool/scores/delta", params={"since": version, "pool_id": pool_id})
        assert old.status_code == 410


def test_vectors_space_serves_any_ranker_and_int8_is_close(served_app, served_store):
    state = decode_full(full(served_app, "vectors", dtype="int8").content)
    vectors = served_store.pool.vectors
    assert state.data.dtype == np.int8 and state.rows == vectors.shape[1]
    error = np.abs(state.dense() - vectors)
    assert (error <= state.scales[:, None] / 2 + 1e-7).all()  # round to nearest
    assert (np.abs(state.data).max(axis=1) == 127).all()  # the scale uses the full range


def test_quantize_int8_of_a_zero_vector_and_float16_overflow():
    q, s = quantize(np.zeros((2, 3), np.float32), "int8")
    assert (q == 0).all() and (s == 0).all()
    with pytest.raises(PoolFormatError, match="float16"):
        quantize(np.full((1, 2), 1e6, np.float32), "float16")


def test_corrupted_bodies_are_refused():
    from privaterec.ondevice.pool_format import PoolState
    state = PoolState("scores", "float32", 2, "m", "ab", 3, ("a", "b"),
                      np.arange(4, dtype=np.float32).reshape(2, 2))
    body = encode_full(state)
    assert decode_full(body) == state
    flipped = bytearray(body)
    flipped[-1] ^= 0x40
    with pytest.raises(PoolFormatError, match="content hash"):
        decode_full(bytes(flipped))
    for bad in (body[:-3], b"junk" + body, body + b"x"):
        with pytest.raises(PoolFormatError):
            decode(bad)


# ----------------------------------------------------------------------------- device
@pytest.fixture
def history(serving_news: list[NewsRecord]) -> list[NewsRecord]:
    return serving_news[3:9]


def test_local_topk_equals_the_servers_exact_ranking(served_app, history):
    device = LocalRankingDevice(transport=served_app)
    items = device.recommend(history, k=20)
    alpha = device.user_weights(history)
    served = served_app.post("/v1/recommend/privaterec",
                             json={"alpha": [float(a) for a in alpha], "k": 20}).json()
    assert [i["news_id"] for i in items] == [i["news_id"] for i in served["items"]]
    assert [i["title"] for i in items] == [i["title"] for i in served["items"]]
    np.testing.assert_array_equal([i["score"] for i in items],
                                  np.float32([i["score"] for i in served["items"]]))
    # with the model's own α (not the server's): the exact, noise-free PrivateRec scores
    model = device.model.model
    vectors, mask, _ = device.model.history_tensors(history)
    u = model.encode_user(vectors, mask)[0].detach().numpy()
    pool = decode_full(full(served_app, "vectors").content)
    exact = pool.data.astype(np.float64) @ u.astype(np.float64)
    assert [pool.ids[p] for p in top_k_positions(exact, 5)] == [i["news_id"] for i in items[:5]]


def test_device_sends_nothing_user_dependent_and_its_ledger_says_so(served_app, history):
    device = LocalRankingDevice(transport=served_app, titles="pool")
    calls: list[tuple[str, str]] = []
    real = served_app.request

    def spy(method, url, **kwargs):
        calls.append((method, str(url)))
        return real(method, url, **kwargs)

    served_app.request = spy  # type: ignore[method-assign]
    try:
        device.recommend(history, k=5)
        device.recommend(history[:2], k=5)
    finally:
        served_app.request = real  # type: ignore[method-assign]
    assert all(method == "GET" and "/v1/pool/scores" in url for method, url in calls)
    assert device.bytes_sent == 0 and device.spent() == 0.0
    events = device.ledger.events("device")
    assert len(events) == 1 and events[0][1] == 2
    event = events[0][0]
    assert (event.epsilon, event.phase) == (0.0, "serve") and "synced" in event.note
    assert device.last_sync["kind"] == "not-modified"


def test_title_lookup_modes_reveal_what_they_send(served_app, history):
    lookup = LocalRankingDevice(transport=served_app, titles="lookup")
    items = lookup.recommend(history, k=3)
    assert lookup.last_query["sent"]["lookup"] == [i["news_id"] for i in items]
    assert all(i["title"] for i in items) and math.isinf(lookup.spent())
    notes = [e.note for e, _ in lookup.ledger.events("device")]
    assert any(items[0]["news_id"] in n for n in notes)
    decoys = LocalRankingDevice(transport=served_app, titles="decoys", decoys=7,
                                decoy_rng=random.Random(1))
    ranked = decoys.recommend(history, k=3)
    sent = decoys.last_query["sent"]["lookup"]
    assert len(sent) == 10 and len(set(sent)) == 10
    assert {i["news_id"] for i in ranked} <= set(sent)
    assert [i["title"] for i in ranked] == [i["title"] for i in items]


def test_device_syncs_incrementally_and_matches_a_fresh_device(served_app, served_store,
                                                              history, write_token):
    device = LocalRankingDevice(transport=served_app, dtype="float16")
    device.sync()
    assert device.last_sync["kind"] == "full"
    ingest(served_app, write_token, new_articles("s", 5))
    served_store.remove([device.pool.ids[2]])
    device.recommend(history, k=4)
    assert device.last_sync["kind"] == "delta" and device.last_sync["records"] == 5
    fresh = LocalRankingDevice(transport=served_app, dtype="float16")
    fresh.sync()
    assert device.pool == fresh.pool
    assert device.rank(history, 10) == fresh.rank(history, 10)


def test_restart_reads_the_cache_and_a_corrupted_cache_is_downloaded_again(
        served_app, history, tmp_path: Path):
    with LocalRankingDevice(transport=served_app, cache_dir=tmp_path) as device:
        first = device.recommend(history, k=5)
    cached = next(tmp_path.glob("pool-scores-float32*.bin"))
    again = LocalRankingDevice(transport=served_app, cache_dir=tmp_path)
    assert again.last_sync["kind"] == "cache"
    assert again.recommend(history, k=5) == first
    assert again.last_sync["kind"] == "not-modified" and again.bytes_downloaded == 0
    assert len(again.ledger.events("device")) == 1  # the ledger survived: 2 rankings
    assert again.ledger.events("device")[0][1] == 2
    data = bytearray(cached.read_bytes())
    data[-7] ^= 0x01  # one flipped bit in the matrix
    cached.write_bytes(bytes(data))
    damaged = LocalRankingDevice(transport=served_app, cache_dir=tmp_path)
    assert damaged.last_sync["kind"] == "cache-rejected" and damaged.pool is None
    assert damaged.recommend(history, k=5) == first
    assert damaged.last_sync["kind"] == "full" and damaged.bytes_downloaded > 0
    assert decode_full(cached.read_bytes()) == damaged.pool


def test_int8_vectors_path_for_a_ranker_without_basis(serving_news, serving_model_config,
                                                       ranking_run_writer, tmp_path, history):
    from dataclasses import replace

    from privaterec.serving.server import open_store

    run = ranking_run_writer(tmp_path / "run", serving_news,
                             replace(serving_model_config, basis_size=0), method="fedrec")
    models = ServingModels.from_run(run)
    with open_store(models, tmp_path / "store") as store:
        store.upsert(serving_news)
        client = TestClient(create_app(store, models))
        assert full(client, "scores").status_code == 404
        exact = LocalRankingDevice(transport=client, dtype="float32")
        int8 = LocalRankingDevice(transport=client, dtype="int8")
        assert exact.space == int8.space == "vectors"
        top = exact.recommend(history, k=10)
        u = exact.user_weights(history)
        served = client.post("/v1/recommend/vdp",
                             json={"embedding": [float(x) for x in u], "k": 10}).json()
        assert [i["news_id"] for i in top] == [i["news_id"] for i in served["items"]]
        quantised = int8.recommend(history, k=10)
        assert int8.pool.data.dtype == np.int8
        bound = np.abs(u).sum() * int8.pool.scales.max() / 2  # |Δscore| ≤ Σ|u_j|·s/2
        reference = {i["news_id"]: i["score"] for i in exact.recommend(history, k=110)}
        assert all(abs(i["score"] - reference[i["news_id"]]) <= bound + 1e-6
                   for i in quantised)
        assert len({i["news_id"] for i in quantised} & {i["news_id"] for i in top}) >= 7


def test_a_get_on_a_connection_closed_while_idle_is_retried_once(served_app, history):
    import httpx

    class Flaky:
        """Fails the next pool request once, as a keep-alive connection the server closed."""

        def __init__(self) -> None:
            self.fail = 0

        def request(self, method, url, **kwargs):
            if self.fail and "/v1/pool/" in str(url):
                self.fail -= 1
                raise httpx.RemoteProtocolError("Server disconnected without a response")
            return served_app.request(method, url, **kwargs)

    flaky = Flaky()
    device = LocalRankingDevice(transport=flaky)
    flaky.fail = 1
    device.sync()
    assert device.last_sync["kind"] == "full"
    flaky.fail = 2  # fails twice: the error reaches the caller
    from privaterec.serving.transport import ServerError
    with pytest.raises(ServerError, match="could not reach"):
        device.sync()
