"""The HTTP API: results pinned to exact computations, bad input → 4xx, ingestion, restarts."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from fastapi.testclient import TestClient

from privaterec.config import RunConfig
from privaterec.data.records import NewsRecord
from privaterec.data.text import TextVocabularies
from privaterec.models.factory import build_recommender
from privaterec.recall.index import ScoreSpaceIndex, allocate_quotas
from privaterec.runs.recall import RecallModelConfig
from privaterec.serving.app import NO_BASIS, NO_RECALL, create_app
from privaterec.serving.bundle import ServingModels
from privaterec.serving.download import load_parameters
from privaterec.serving.server import build_service, open_store
from privaterec.serving.store import pool_record


def exact_ranking(vectors: np.ndarray, user: np.ndarray, k: int) -> list[int]:
    """Positions of the k best float64 inner products, ties by position."""
    scores = vectors.astype(np.float64) @ user.astype(np.float64)
    return np.lexsort((np.arange(scores.size), -scores))[:k].tolist()


def pool_vectors(models: ServingModels, news) -> np.ndarray:
    """The news vectors computed independently of the store (Θ_N on the articles)."""
    return models.encode_news([pool_record(r) for r in news])


def errors_of(response) -> list[dict]:
    body = response.json()
    assert set(body) == {"detail"}
    return body["detail"]


# ---------------------------------------------------------------------------- model info
def test_health_and_model_describe_the_run(served_app: TestClient, serving_models, serving_news):
    health = served_app.get("/v1/health").json()
    assert health == {"status": "ok", "num_news": len(serving_news),
                      "model_version": serving_models.model_version}
    info = served_app.get("/v1/model").json()
    assert info["basis_size"] == 5 and info["dim"] == 16 and info["recall"] is None
    assert info["method"] == "privaterec" and info["news_encoder"] == "nrms"
    assert info["num_news"] == len(serving_news)
    assert info["parameters_url"] == "/v1/model/parameters"
    assert "alpha" in info["privacy_note"]


def test_model_version_is_the_checkpoint_digest(privaterec_run: Path, serving_models):
    import hashlib
    digest = hashlib.sha256((privaterec_run / "checkpoint.pt").read_bytes()).hexdigest()
    assert serving_models.model_version == digest[:12]


def test_parameters_rebuild_the_model_without_the_ledger(served_app: TestClient,
                                                         privaterec_run: Path, serving_news):
    response = served_app.get("/v1/model/parameters")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/octet-stream"
    payload = load_parameters(response.content, "/v1/model/parameters")
    assert set(payload) == {"config_yaml", "vocab_json", "state_dict", "model_version"}
    config = RunConfig.from_yaml(_write(privaterec_run.parent / "c.yaml",
                                        payload["config_yaml"]))
    vocabs = TextVocabularies.load(_write(privaterec_run.parent / "v.json",
                                          payload["vocab_json"]))
    model = build_recommender(config.model, vocabs)
    model.load_state_dict(payload["state_dict"])  # strict: exactly the model's parameters
    model.eval()
    models = ServingModels(config, vocabs, model)
    ref = ServingModels.from_run(privaterec_run)
    articles = [pool_record(r) for r in serving_news[:7]]
    np.testing.assert_array_equal(models.encode_news(articles), ref.encode_news(articles))
    np.testing.assert_array_equal(models.basis, ref.basis)
    assert served_app.get("/v1/model/recall-parameters").status_code == 404


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ------------------------------------------------------------------------- recommending
def test_privaterec_ranks_like_exact_scoring_of_u_tilde(served_app: TestClient, serving_models,
                                                        serving_news):
    vectors = pool_vectors(serving_models, serving_news)
    b = serving_models.basis
    rng = np.random.default_rng(0)
    for alpha in rng.dirichlet(np.ones(5), size=20):
        alpha = alpha / alpha.sum()
        response = served_app.post("/v1/recommend/privaterec",
                                   json={"alpha": alpha.tolist(), "k": 15})
        assert response.status_code == 200
        body = response.json()
        assert body["model_version"] == serving_models.model_version
        u_tilde = alpha @ b.astype(np.float64)  # server side of PrivateRec Alg. 1, exactly
        want = exact_ranking(vectors, u_tilde, 15)
        assert [item["news_id"] for item in body["items"]] == \
            [serving_news[i].news_id for i in want]
        np.testing.assert_allclose([item["score"] for item in body["items"]],
                                   vectors[want].astype(np.float64) @ u_tilde, rtol=1e-5,
                                   atol=1e-6)
        first = serving_news[want[0]]
        assert body["items"][0]["title"] == first.title
        assert body["items"][0]["category"] == first.category


def test_vdp_ranks_by_exact_inner_product(served_app: TestClient, serving_models, serving_news):
    vectors = pool_vectors(serving_models, serving_news)
    user = np.random.default_rng(1).standard_normal(16)
    body = served_app.post("/v1/recommend/vdp",
                           json={"embedding": user.tolist(), "k": len(serving_news)}).json()
    assert [item["news_id"] for item in body["items"]] == \
        [serving_news[i].news_id for i in exact_ranking(vectors, user, len(serving_news))]


def test_integers_are_numbers_and_k_defaults(served_app: TestClient):
    body = served_app.post("/v1/recommend/privaterec", json={"alpha": [1, 0, 0, 0, 0]}).json()
    assert len(body["items"]) == 10


# ---------------------------------------------------------------------------- bad input
GOOD = {"alpha": [0.2] * 5, "k": 3}
BAD_PRIVATEREC = [
    ({"alpha": [0.25] * 4, "k": 3}, ["body", "alpha"], "at least 5"),
    ({"alpha": [0.2] * 6, "k": 3}, ["body", "alpha"], "at most 5"),
    ({"alpha": [0.5, 0.5, 0.5, -0.5, 0.0], "k": 3}, ["body", "alpha"], "negative"),
    ({"alpha": [0.3] * 5, "k": 3}, ["body", "alpha"], "sum to 1"),
    ({"alpha": [0.2] * 5, "k": 0}, ["body", "k"], "greater than or equal to 1"),
    ({"alpha": [0.2] * 5, "k": 1001}, ["body", "k"], "less than or equal to 1000"),
    ({"alpha": [0.2] * 5, "k": 111}, ["body", "k"], "exceeds the number of news"),
    ({"alpha": [0.2] * 5, "k": 2.5}, ["body", "k"], "valid integer"),
    ({"alpha": [0.2] * 5, "k": True}, ["body", "k"], "valid integer"),
    ({"alpha": [0.2] * 5, "k": "3"}, ["body", "k"], "valid integer"),
    ({"alpha": ["0.2"] * 5, "k": 3}, ["body", "alpha", 0], "valid number"),
    ({"alpha": [True] + [0.0] * 4, "k": 3}, ["body", "alpha", 0], "valid number"),
    ({"alpha": 0.2, "k": 3}, ["body", "alpha"], "valid list"),
    ({"alpha": [[0.2]] * 5, "k": 3}, ["body", "alpha", 0], "valid number"),
    ({"alpha": [0.2] * 5, "k": 3, "user": "u1"}, ["body", "user"], "Extra inputs"),
    ({"k": 3}, ["body", "alpha"], "Field required"),
    ({"alpha": [0.2] * 4 + [10 ** 400], "k": 3}, ["body", "alpha", 4], "valid number"),
]


@pytest.mark.parametrize("body, loc, message", BAD_PRIVATEREC)
def test_bad_privaterec_queries_are_422_naming_the_field(served_app: TestClient, body, loc,
                                                         message):
    response = served_app.post("/v1/recommend/privaterec", json=body)
    assert response.status_code == 422
    errors = errors_of(response)
    assert any(e["loc"] == loc and message in e["msg"] for e in errors), errors
    assert all(set(e) == {"loc", "msg", "type"} for e in errors)  # no echoed input


RAW_BODIES = [
    b'{"alpha": [NaN, 0.25, 0.25, 0.25, 0.25], "k": 3}',
    b'{"alpha": [Infinity, 0, 0, 0, 0], "k": 3}',
    b'{"alpha": [-Infinity, 0, 0, 0, 1], "k": 3}',
    b'{"alpha": [1e999, 0, 0, 0, 0], "k": 3}',
    b'{"alpha": [0.2, 0.2, 0.2, 0.2, 0.2], "k": 3',
    b'{"alpha": [0.2, 0.2, 0.2, 0.2, 0.2], "k": 3}}',
    b"[0.2, 0.2, 0.2, 0.2, 0.2]",
    b'"alpha"',
    b"null",
    b"",
    b"\xff\xfe\x00garbage",
    b"[" * 100_000,
    b'{"alpha": [0.2, 0.2, 0.2, 0.2, 0.2], "k": 3, "alpha": "twice"}',
]


@pytest.mark.parametrize("raw", RAW_BODIES, ids=range(len(RAW_BODIES)))
def test_malformed_and_non_finite_json_is_a_4xx(served_app: TestClient, raw: bytes):
    response = served_app.post("/v1/recommend/privaterec", content=raw,
                               headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500
    assert "detail" in response.json()


def test_non_json_content_type_is_a_4xx(served_app: TestClient):
    response = served_app.post("/v1/recommend/privaterec", content=json.dumps(GOOD),
                               headers={"content-type": "text/plain"})
    assert response.status_code == 422


def test_vdp_rejects_wrong_length_and_overflow(served_app: TestClient):
    short = served_app.post("/v1/recommend/vdp", json={"embedding": [0.1] * 15, "k": 3})
    assert short.status_code == 422 and errors_of(short)[0]["loc"] == ["body", "embedding"]
    huge = served_app.post("/v1/recommend/vdp", json={"embedding": [1e300] * 16, "k": 3})
    assert huge.status_code == 422 and "overflow" in errors_of(huge)[0]["msg"]
    big = served_app.post("/v1/recommend/vdp", json={"embedding": [3e38] * 16, "k": 3})
    assert big.status_code == 422


def test_oversized_bodies_get_413(served_store, serving_models, write_token, write_headers):
    app = create_app(served_store, serving_models, max_body_bytes=2_000,
                     write_token=write_token)
    with TestClient(app) as client:
        news = {"news": [{"news_id": f"B{i}", "title": "x" * 100} for i in range(30)]}
        response = client.post("/v1/news", json=news, headers=write_headers)
        assert response.status_code == 413 and "2000 bytes" in response.json()["detail"]

        def chunks():  # no Content-Length: streamed, counted by the server
            for _ in range(10):
                yield b" " * 500

        response = client.post("/v1/recommend/privaterec", content=chunks(),
                               headers={"content-type": "application/json"})
        assert response.status_code == 413
        small = client.post("/v1/recommend/privaterec", json=GOOD)
        assert small.status_code == 200
    assert len(served_store) == 110


def test_no_basis_and_no_recall_are_404_with_a_message(serving_news, tmp_path: Path,
                                                       serving_model_config,
                                                       ranking_run_writer):
    import dataclasses
    run = ranking_run_writer(tmp_path / "fedrec", serving_news,
                             dataclasses.replace(serving_model_config, basis_size=0),
                             method="fedrec")
    models = ServingModels.from_run(run)
    store = open_store(models, tmp_path / "store")
    store.upsert(serving_news[:20])
    with TestClient(create_app(store, models)) as client:
        response = client.post("/v1/recommend/privaterec", json=GOOD)
        assert response.status_code == 404 and response.json()["detail"] == NO_BASIS
        recall = client.post("/v1/recall/unifedrec",
                             json={"channels": [{"weights": [1.0], "quota": 1}], "total": 3})
        assert recall.status_code == 404 and recall.json()["detail"] == NO_RECALL
        assert client.get("/v1/model").json()["basis_size"] == 0
        vdp = client.post("/v1/recommend/vdp", json={"embedding": [0.0] * 16, "k": 3})
        assert vdp.status_code == 200
    store.close()


def test_no_payload_is_logged_or_echoed(served_app: TestClient, caplog, capsys):
    marker = 0.123456789
    alpha = [marker, 0.2, 0.2, 0.2, 1 - marker - 0.6]
    with caplog.at_level(logging.DEBUG):
        ok = served_app.post("/v1/recommend/privaterec", json={"alpha": alpha, "k": 3})
        bad = served_app.post("/v1/recommend/privaterec",
                              json={"alpha": alpha[:4], "k": 3})
        sum_bad = served_app.post("/v1/recommend/privaterec",
                                  json={"alpha": [marker] * 5, "k": 3})
    assert ok.status_code == 200 and bad.status_code == 422 and sum_bad.status_code == 422
    captured = capsys.readouterr()
    for text in (caplog.text, captured.out, captured.err, bad.text, sum_bad.text):
        assert "0.12345" not in text


# ---------------------------------------------------------------------------- ingestion
NEW = [{"news_id": "X-1", "category": "sports", "subcategory": "tennis",
        "title": "an unseen headline with zzzunknownzzz words", "abstract": "fresh"},
       {"news_id": "X-2", "title": "second new article"}]


def test_ingested_news_are_servable_at_once_and_persist(served_store, serving_models,
                                                        serving_news, tmp_path: Path,
                                                        write_token, write_headers):
    with TestClient(create_app(served_store, serving_models,
                               write_token=write_token)) as client:
        response = client.post("/v1/news", json={"news": NEW}, headers=write_headers)
        assert response.json() == {"added": 2, "updated": 0, "num_news": len(serving_news) + 2}
        assert client.get("/v1/news/X-2").json() == {
            "news_id": "X-2", "category": "", "subcategory": "",
            "title": "second new article", "abstract": ""}
        # servable: its score is α·b·Θ_N(article), exactly as for the other news
        vector = serving_models.encode_news([NewsRecord(**NEW[0])])[0]
        alpha = np.asarray([0.1, 0.2, 0.3, 0.15, 0.25])
        n = len(serving_news) + 2
        items = client.post("/v1/recommend/privaterec",
                            json={"alpha": alpha.tolist(), "k": n}).json()["items"]
        score = {item["news_id"]: item["score"] for item in items}
        assert len(score) == n
        np.testing.assert_allclose(score["X-1"], vector @ (alpha @ serving_models.basis),
                                   rtol=1e-5, atol=1e-6)
        update = client.post("/v1/news", json={"news": [{**NEW[1], "title": "changed"}]},
                             headers=write_headers)
        assert update.json() == {"added": 0, "updated": 1, "num_news": n}
    served_store.close()
    with open_store(serving_models, served_store.path) as store:  # a restarted server
        with TestClient(create_app(store, serving_models)) as client:
            assert client.get("/v1/news/X-2").json()["title"] == "changed"
            assert client.get("/v1/health").json()["num_news"] == n
            assert client.get("/v1/news/X-3").status_code == 404


@pytest.mark.parametrize("news, message", [
    ([], "at least 1"),
    ([{"news_id": "a b", "title": "t"}], "pattern"),
    ([{"news_id": "", "title": "t"}], "at least 1"),
    ([{"news_id": "x", "title": "t"}, {"news_id": "x", "title": "u"}], "repeats"),
    ([{"news_id": "x"}], "Field required"),
    ([{"news_id": "x", "title": 5}], "valid string"),
    ([{"news_id": "x", "title": "t", "url": "http://"}], "Extra inputs"),
    ([{"news_id": "x", "title": "\ud800"}], "unicode"),
    ([{"news_id": "x", "title": "t" * 2001}], "at most 2000"),
    ([{"news_id": f"x{i}", "title": "t"} for i in range(1001)], "at most 1000"),
])
def test_bad_ingestion_is_422_and_changes_nothing(served_app: TestClient, news, message,
                                                  write_headers):
    raw = json.dumps({"news": news})  # ASCII: a lone surrogate is sent as the escape \ud800
    response = served_app.post("/v1/news", content=raw,
                               headers={"content-type": "application/json", **write_headers})
    assert response.status_code == 422
    assert any(message in e["msg"] for e in errors_of(response)), errors_of(response)
    assert served_app.get("/v1/health").json()["num_news"] == 110


def test_concurrent_http_queries_and_ingestion(served_app: TestClient, serving_models,
                                               write_headers):
    failures: list = []

    def query(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(15):
            alpha = rng.dirichlet(np.ones(5))
            r = served_app.post("/v1/recommend/privaterec",
                                json={"alpha": (alpha / alpha.sum()).tolist(), "k": 20})
            if r.status_code != 200 or len(r.json()["items"]) != 20:
                failures.append(r.text)

    def ingest(w: int) -> None:
        for j in range(4):
            news = [{"news_id": f"T{w}-{j}-{i}", "title": f"thread {w} news {i}"}
                    for i in range(5)]
            r = served_app.post("/v1/news", json={"news": news}, headers=write_headers)
            if r.status_code != 200:
                failures.append(r.text)

    threads = [threading.Thread(target=query, args=(s,)) for s in range(3)]
    threads += [threading.Thread(target=ingest, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert served_app.get("/v1/health").json()["num_news"] == 110 + 2 * 4 * 5


# ------------------------------------------------------------------------------- recall
@pytest.fixture
def recall_app(recall_service):
    models, store = recall_service
    with TestClient(create_app(store, models)) as client:
        yield client, models


def test_recall_follows_quotas_and_the_score_space_index(recall_app, serving_news):
    client, models = recall_app
    info = client.get("/v1/model").json()
    assert info["method"] == "unifedrec"
    assert info["recall"] == {"basis_size": 6, "dim": 16, "max_channels": 3,
                              "parameters_url": "/v1/model/recall-parameters"}
    rng = np.random.default_rng(3)
    weights = rng.dirichlet(np.ones(6), size=2)
    weights /= weights.sum(axis=1, keepdims=True)
    quotas = [3.0, 1.0]
    body = client.post("/v1/recall/unifedrec", json={
        "channels": [{"weights": w.tolist(), "quota": q} for w, q in zip(weights, quotas)],
        "total": 30}).json()
    candidates = body["candidates"]
    ids = [c["news_id"] for c in candidates]
    vectors = pool_vectors(models, serving_news)
    index = ScoreSpaceIndex(models.recall_values, vectors,
                            [r.news_id for r in serving_news])
    assert ids == index.recall(weights, np.asarray(quotas), 30).tolist()
    counts = allocate_quotas(np.asarray(quotas), 30)
    assert [sum(c["channel"] == i for c in candidates) for i in range(2)] == counts.tolist()
    row = {r.news_id: i for i, r in enumerate(serving_news)}
    for c in candidates[:5]:
        np.testing.assert_allclose(c["vector"], vectors[row[c["news_id"]]], rtol=1e-6)
        assert c["abstract"] == serving_news[row[c["news_id"]]].abstract
    lean = client.post("/v1/recall/unifedrec", json={
        "channels": [{"weights": weights[0].tolist(), "quota": 1e308},
                     {"weights": weights[1].tolist(), "quota": 1e308}],
        "total": 10, "include_vectors": False}).json()["candidates"]
    assert len(lean) == 10 and all(c["vector"] is None for c in lean)


@pytest.mark.parametrize("body, message", [
    ({"channels": [], "total": 5}, "at least 1"),
    ({"channels": [{"weights": [1 / 6] * 6, "quota": 1}] * 4, "total": 5}, "at most 3"),
    ({"channels": [{"weights": [1 / 6] * 6, "quota": 0}], "total": 5}, "positive sum"),
    ({"channels": [{"weights": [1 / 6] * 6, "quota": -1}], "total": 5}, "greater than"),
    ({"channels": [{"weights": [0.2] * 5, "quota": 1}], "total": 5}, "at least 6"),
    ({"channels": [{"weights": [0.5] * 6, "quota": 1}], "total": 5}, "sum to 1"),
    ({"channels": [{"weights": [1 / 6] * 6, "quota": 1}], "total": 0}, "greater than"),
    ({"channels": [{"weights": [1 / 6] * 6, "quota": 1}], "total": 500}, "exceeds"),
])
def test_bad_recall_queries_are_422(recall_app, body, message):
    client, _ = recall_app
    response = client.post("/v1/recall/unifedrec", json=body)
    assert response.status_code == 422
    assert any(message in e["msg"] for e in errors_of(response)), errors_of(response)


def test_recall_parameters_rebuild_the_recall_model(recall_app, recall_model):
    client, models = recall_app
    payload = load_parameters(client.get("/v1/model/recall-parameters").content,
                              "/v1/model/recall-parameters")
    assert payload["model_version"] == models.model_version != models.ranker_version
    config = RecallModelConfig(**yaml.safe_load(payload["recall_yaml"]))
    rebuilt = config.build(16)
    rebuilt.load_state_dict(payload["state_dict"])
    for name, tensor in recall_model.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[name], tensor)


# ------------------------------------------------------------------------------ service
def test_build_service_ingests_news_once_and_reuses_the_store(privaterec_run: Path,
                                                              serving_news_path: Path,
                                                              tmp_path: Path, write_token,
                                                              write_headers):
    service = build_service(privaterec_run, serving_news_path, store_path=tmp_path / "s",
                            write_token=write_token)
    assert service.added == 110
    with TestClient(service.app) as client:
        client.post("/v1/news", json={"news": NEW}, headers=write_headers)
    service.close()
    again = build_service(privaterec_run, serving_news_path, store_path=tmp_path / "s")
    assert again.added == 0 and len(again.store) == 112
    again.close()
    from privaterec.serving.store import StoreError
    with pytest.raises(StoreError, match="empty"):
        build_service(privaterec_run, None, store_path=tmp_path / "empty")


def test_cli_serve_refuses_an_empty_store_and_a_bad_run(privaterec_run: Path, tmp_path: Path,
                                                        capsys):
    from privaterec.cli import main

    assert main(["serve", "--run", str(privaterec_run), "--store", str(tmp_path / "s"),
                 "--port", "0", "--no-ingest"]) == 2
    assert "news pool is empty; pass --news" in capsys.readouterr().err
    assert main(["serve", "--run", str(tmp_path / "nope"), "--news",
                 str(tmp_path / "x.tsv"), "--no-ingest"]) == 2
    assert "not a run directory" in capsys.readouterr().err
