"""End to end: the real server (uvicorn on a loopback port) queried through the device SDK.

The server is S1's ``privaterec.serving.server``: ``build_service`` + uvicorn in a thread, and
the ``privaterec serve`` command in a subprocess (through ``demo_query``). The devices talk to
it over TCP with their default httpx transport. Fixtures ``privaterec_run``, ``serving_news``,
``serving_news_path``, ``serving_models`` and ``recall_model`` come from conftest.py.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from typing import Iterator

import httpx
import numpy as np
import pytest
import torch
import uvicorn

from privaterec.errors import PrivacyBudgetExceeded
from privaterec.serving.client import (PrivateRecDevice, ServerError, UniFedRecDevice,
                                       VDPDevice, demo_query, free_port, json_body)


@contextlib.contextmanager
def uvicorn_thread(app) -> Iterator[str]:
    """Run ``app`` with uvicorn on a free loopback port in a thread; yield its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, access_log=False,
                                           log_level="warning", lifespan="off", ws="none"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def service(privaterec_run, serving_news_path, tmp_path):
    from privaterec.serving.server import build_service

    service = build_service(privaterec_run, serving_news_path, store_path=tmp_path / "store")
    yield service
    service.close()


def exact_scores(service, alpha: list[float]) -> dict[str, float]:
    """Alg. 1 computed here in float64: ũ = Σ α̃ᵢ bᵢ, scores ũ·r of every pool news."""
    pool = service.store.pool
    vectors = service.models.encode_news(pool.articles).astype(np.float64)
    user = np.asarray(alpha) @ service.models.basis.astype(np.float64)
    return {a.news_id: float(s) for a, s in zip(pool.articles, vectors @ user)}


def assert_top_k(items: list[dict], scores: dict[str, float], k: int) -> None:
    """``items`` are k news with the k best exact scores, best first (float32 tolerance)."""
    assert len(items) == k
    got = [scores[i["news_id"]] for i in items]
    tol = 1e-5 * max(abs(s) for s in scores.values())
    assert [i["score"] for i in items] == pytest.approx(got, abs=tol)
    assert all(a >= b - tol for a, b in zip(got, got[1:]))
    others = [s for n, s in scores.items() if n not in {i["news_id"] for i in items}]
    assert max(others) <= min(got) + tol


def test_private_query_over_http(service, serving_news, tmp_path):
    history = serving_news[:8]
    with uvicorn_thread(service.app) as url:
        device = PrivateRecDevice(url, epsilon=1.0, padding_p=0.5, budget=2.0,
                                  cache_dir=tmp_path / "privaterec-device")
        assert device.model_version == service.models.model_version
        items = device.recommend(history, k=5)
        sent = device.last_query["sent"]
        assert set(sent) == {"alpha", "k"} and len(sent["alpha"]) == 5
        assert device.bytes_sent == len(json_body(sent))
        assert_top_k(items, exact_scores(service, sent["alpha"]), 5)
        assert device.recommend(history, k=3)[:3] == items[:3]  # cached α̃: same answer, free
        device.recommend(serving_news[8:12], k=5)
        assert device.spent() == pytest.approx(2.0)
        with pytest.raises(PrivacyBudgetExceeded):
            device.recommend(serving_news[12:20], k=5)
        # The server answers bad input with 4xx, surfaced as ServerError with its detail.
        with pytest.raises(ServerError, match="422"):
            device._http.post_json("/v1/recommend/privaterec", b'{"alpha": [1, 0], "k": 5}')
        vdp = VDPDevice(url, epsilon=1.0, clip=0.5, cache_dir=tmp_path / "vdp-device")
        assert len(vdp.recommend(history, k=4)) == 4
        assert vdp.bytes_sent > 5 * device.bytes_sent  # d = 16 floats vs B = 5
        device.close()
        vdp.close()


def test_unifedrec_device_over_http(serving_models, recall_model, serving_news, tmp_path):
    from privaterec.serving.app import create_app
    from privaterec.serving.bundle import ServingModels
    from privaterec.serving.server import open_store

    models = ServingModels(serving_models.config, serving_models.vocabs, serving_models.ranker,
                           recall=recall_model)
    store = open_store(models, tmp_path / "store")
    try:
        store.upsert(serving_news)
        with uvicorn_thread(create_app(store, models)) as url:
            device = UniFedRecDevice(url, total=30, budget=math.inf)  # quotas in the clear
            history = serving_news[20:30]
            top = device.recommend(history, k=8)
            sent = device.last_query["sent"]
            assert set(sent) == {"channels", "total", "include_vectors"}
            assert 1 <= len(sent["channels"]) <= 3 and device.last_query["received"] == 30
            assert all(len(c["weights"]) == 6 for c in sent["channels"])
            # The device ranked the candidates with the ranker: scores are uᵀr, best first.
            vectors, mask, _ = device.model.history_tensors(history)
            with torch.no_grad():
                user = serving_models.ranker.encode_user(vectors, mask)[0].numpy()
            news = models.encode_news([store.get(t["news_id"]) for t in top])
            assert [t["score"] for t in top] == pytest.approx((news @ user).tolist(),
                                                              rel=1e-4, abs=1e-5)
            assert [t["score"] for t in top] == sorted((t["score"] for t in top), reverse=True)
            device.close()
    finally:
        store.close()


def test_demo_query_runs_privaterec_serve_and_queries_it(privaterec_run, serving_news_path,
                                                        serving_news, tmp_path):
    # demo_query starts `privaterec serve` in a subprocess (ServerProcess), queries, stops it.
    result = demo_query(privaterec_run, serving_news_path, epsilon=2.0, k=10,
                        store=tmp_path / "store")
    sent = result["sent"]
    assert set(sent) == {"alpha", "k"} and len(sent["alpha"]) == result["basis_size"] == 5
    assert result["bytes_sent"] == len(json_body(sent))
    assert result["epsilon_spent"] == pytest.approx(2.0)
    assert result["history"] == [n.news_id for n in serving_news[:10]]  # the TSV's first 10
    assert not any(news_id in json_body(sent).decode() for news_id in result["history"])
    assert len(result["received"]) == 10
    assert {i["news_id"] for i in result["received"]} <= {n.news_id for n in serving_news}
    with pytest.raises(httpx.TransportError):  # the server was stopped
        httpx.get(result["url"] + "/v1/health", timeout=1.0)
