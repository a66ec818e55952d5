"""The write API: authentication, rate limit, and what an unauthenticated caller can do.

Every state-changing endpoint needs the server's bearer token (401 without, 403 with a wrong
one, 403 when writes are disabled); the server refuses to start without a token unless writes
are disabled on purpose; every other endpoint is a read that changes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from privaterec.data.records import NewsRecord
from privaterec.errors import ConfigError
from privaterec.serving import write_api
from privaterec.serving.app import PUBLIC_QUERY_ROUTES, WRITE_ROUTES, create_app
from privaterec.serving.store import article_json
from privaterec.serving.write_api import (WRITE_TOKEN_ENV, WriteLimits, read_token_file,
                                          resolve_write_token)
from privaterec.serving.writer import NewsWriter

ARTICLE = {"news_id": "W1", "category": "sports", "subcategory": "golf",
           "title": "an injected headline", "abstract": "spam"}


def _pool_state(client: TestClient) -> tuple[int, str]:
    response = client.get("/v1/pool/scores")
    return client.get("/v1/health").json()["num_news"], response.headers["etag"]


def test_a_write_without_the_token_is_401_and_changes_nothing(served_app, write_token):
    before = _pool_state(served_app)
    for headers in ({}, {"Authorization": "Basic dXNlcjpwYXNz"}, {"Authorization": "Bearer"},
                    {"Authorization": "Bearer   "}, {"Authorization": write_token}):
        response = served_app.post("/v1/news", json={"news": [ARTICLE]}, headers=headers)
        assert response.status_code == 401, headers
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert write_token not in response.text
    # the body is not even read: a malformed or oversized one gets 401 too, not 422 or 413
    assert served_app.post("/v1/news", content=b"{not json").status_code == 401
    assert served_app.post("/v1/news", content=b" " * 2_000_000).status_code == 401
    assert served_app.post("/v1/news/", json={"news": [ARTICLE]}).status_code == 401
    assert _pool_state(served_app) == before
    assert served_app.get("/v1/news/W1").status_code == 404


def test_a_wrong_token_is_403_and_the_right_one_writes(served_app, write_token, write_headers):
    before = _pool_state(served_app)
    for wrong in (write_token[:-1] + "X", write_token + "x", "x" * len(write_token),
                  write_token.upper()):
        response = served_app.post("/v1/news", json={"news": [ARTICLE]},
                                   headers={"Authorization": f"Bearer {wrong}"})
        assert response.status_code == 403 and "wrong write token" in response.text
        assert write_token not in response.text
    assert _pool_state(served_app) == before
    ok = served_app.post("/v1/news", json={"news": [ARTICLE]},
                         headers={"Authorization": f"bearer {write_token}"})  # any case
    assert ok.status_code == 200 and ok.json()["added"] == 1
    assert served_app.get("/v1/news/W1").json()["title"] == ARTICLE["title"]
    assert _pool_state(served_app)[0] == before[0] + 1


def test_the_token_is_compared_in_constant_time(served_app, write_token, monkeypatch):
    calls = []
    real = write_api.hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(write_api.hmac, "compare_digest", spy)
    served_app.post("/v1/news", json={"news": [ARTICLE]},
                    headers={"Authorization": "Bearer wrong"})
    assert calls == [(b"wrong", write_token.encode())]


def test_writes_are_403_when_disabled(served_store, serving_models, write_headers):
    with TestClient(create_app(served_store, serving_models)) as client:  # no write token
        response = client.post("/v1/news", json={"news": [ARTICLE]}, headers=write_headers)
        assert response.status_code == 403 and "disabled" in response.json()["detail"]
        assert client.post("/v1/news", json={"news": [ARTICLE]}).status_code == 403
    assert served_store.pool.get("W1") is None and len(served_store) == 110


def test_writes_are_rate_limited(served_store, serving_models, write_token, write_headers):
    now = [0.0]
    app = create_app(served_store, serving_models, write_token=write_token,
                     write_limits=WriteLimits(rate=0.5, burst=2))
    app.middleware_stack = app.build_middleware_stack()
    guard = app.middleware_stack.app  # inside Starlette's error handler, outside the rest
    assert isinstance(guard, write_api.WriteGuard)
    guard.bucket.clock = lambda: now[0]
    guard.bucket.updated = 0.0
    with TestClient(app) as client:
        def write(i: int):
            return client.post("/v1/news", json={"news": [{**ARTICLE, "news_id": f"R{i}"}]},
                               headers=write_headers)

        assert [write(i).status_code for i in range(2)] == [200, 200]
        limited = write(2)
        assert limited.status_code == 429 and limited.headers["retry-after"] == "2"
        assert client.get("/v1/news/R2").status_code == 404
        # unauthenticated requests neither pass nor spend the operator's allowance
        assert client.post("/v1/news", json={"news": [ARTICLE]}).status_code == 401
        now[0] = 2.0  # one write's worth refilled
        assert write(3).status_code == 200 and write(4).status_code == 429
        assert client.get("/v1/health").status_code == 200  # reads are not limited
    with pytest.raises(ConfigError, match="write rate"):
        WriteLimits(rate=0.0)
    with pytest.raises(ConfigError, match="burst"):
        WriteLimits(burst=0)


def test_every_endpoint_is_a_classified_read_or_a_guarded_write(served_app, write_headers,
                                                               served_store):
    """A new state-changing endpoint must be added to WRITE_ROUTES (or it fails here)."""
    app = served_app.app
    routes = {(method, route.path) for route in app.routes if isinstance(route, APIRoute)
              for method in route.methods}
    posts = {r for r in routes if r[0] not in ("GET", "HEAD")}
    assert posts == set(WRITE_ROUTES) | set(PUBLIC_QUERY_ROUTES)
    assert not set(WRITE_ROUTES) & set(PUBLIC_QUERY_ROUTES)
    # every read, with valid input, leaves the pool as it was
    before = (len(served_store), served_store.pool.version, _pool_state(served_app))
    article = article_json(served_store.pool.articles[0])
    calls = [("GET", "/v1/health", None), ("GET", "/v1/model", None),
             ("GET", "/v1/model/parameters", None), ("GET", "/v1/pool/scores", None),
             ("GET", "/v1/pool/vectors", None), ("GET", f"/v1/news/{article['news_id']}", None),
             ("POST", "/v1/recommend/privaterec", {"alpha": [0.2] * 5, "k": 3}),
             ("POST", "/v1/recommend/vdp", {"embedding": [0.1] * 16, "k": 3}),
             ("POST", "/v1/news/lookup", {"ids": [article["news_id"], "nope"]})]
    for method, path, body in calls:
        response = served_app.request(method, path, json=body, headers=write_headers)
        assert response.status_code == 200, (path, response.text)
    assert (len(served_store), served_store.pool.version, _pool_state(served_app)) == before


def test_openapi_documents_the_write_token(served_app):
    schema = served_app.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["writeToken"]["scheme"] == "bearer"
    ingest = schema["paths"]["/v1/news"]["post"]
    assert ingest["security"] == [{"writeToken": []}]
    assert {"401", "403", "429"} <= set(ingest["responses"])
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if (method.upper(), path) not in WRITE_ROUTES:
                assert "security" not in operation, (method, path)


# ----------------------------------------------------------------------- configuration
def _token_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_the_token_comes_from_a_private_file_or_the_environment(tmp_path):
    token = "k" * 40
    assert read_token_file(_token_file(tmp_path / "t", f"{token}\n")) == token
    assert resolve_write_token(tmp_path / "t", no_ingest=False, environ={}) == token
    assert resolve_write_token(None, no_ingest=False, environ={WRITE_TOKEN_ENV: token}) == token
    assert resolve_write_token(None, no_ingest=True, environ={}) is None
    cases = [
        (lambda: read_token_file(_token_file(tmp_path / "open", token, 0o644)), "chmod 600"),
        (lambda: read_token_file(_token_file(tmp_path / "short", "abc")), "at least 32"),
        (lambda: read_token_file(_token_file(tmp_path / "sp", "a b" * 20)), "without spaces"),
        (lambda: read_token_file(tmp_path / "missing"), "no such file"),
        (lambda: resolve_write_token(None, no_ingest=False, environ={}), "--no-ingest"),
        (lambda: resolve_write_token(tmp_path / "t", no_ingest=True, environ={}), "one of"),
        (lambda: resolve_write_token(tmp_path / "t", no_ingest=False,
                                     environ={WRITE_TOKEN_ENV: token}), "one write token"),
    ]
    for call, message in cases:
        with pytest.raises(ConfigError, match=message) as info:
            call()
        assert token not in str(info.value)


def test_cli_serve_refuses_to_start_writable_without_a_token(privaterec_run, tmp_path,
                                                             capsys, monkeypatch):
    from privaterec.cli import main

    monkeypatch.delenv(WRITE_TOKEN_ENV, raising=False)
    base = ["serve", "--run", str(privaterec_run), "--store", str(tmp_path / "s"),
            "--port", "0"]
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "needs a token" in err and "--no-ingest" in err and "Traceback" not in err
    assert not (tmp_path / "s").exists()  # refused before the store was created
    secret = "s" * 40
    path = _token_file(tmp_path / "token", secret, 0o640)
    assert main([*base, "--write-token-file", str(path)]) == 2
    assert "chmod 600" in capsys.readouterr().err
    assert main([*base, "--write-token-file", str(path), "--no-ingest"]) == 2
    assert "pass one of them" in capsys.readouterr().err


@pytest.mark.slow
def test_privaterec_serve_with_a_token_file_over_http(privaterec_run, serving_news_path,
                                                      tmp_path):
    """The real CLI server: writes need the token, which appears in no output."""
    import httpx

    from privaterec.serving.client import ServerProcess
    from privaterec.serving.transport import ServerError

    secret = "Zq" * 24
    token_file = _token_file(tmp_path / "token", secret + "\n")
    log = tmp_path / "serve.log"
    news = [NewsRecord("H1", "sports", "golf", "a fresh golf headline", "")]
    with ServerProcess(privaterec_run, serving_news_path, store=tmp_path / "store",
                       write_token_file=token_file, log_path=log,
                       extra_args=["--log-level", "debug"]) as server:
        anonymous = httpx.post(f"{server.url}/v1/news", json={"news": [ARTICLE]})
        assert anonymous.status_code == 401
        with pytest.raises(ServerError, match="403"):
            NewsWriter(server.url, token="x" * 40).add(news)
        with NewsWriter(server.url, token=secret) as writer:
            assert writer.add(news) == {"added": 1, "updated": 0, "num_news": 111}
            assert secret not in repr(writer)
        output = log.read_text()
        assert "writes (POST /v1/news) need the write token" in output
    assert secret not in output


def test_the_writer_waits_out_429_and_sends_batches(served_app, write_token):
    import httpx

    from privaterec.serving.schemas import MAX_NEWS_PER_REQUEST

    sent, slept = [], []

    class Limited:
        """Answers the first write with 429, then passes through to the app."""

        def __init__(self) -> None:
            self.first = True

        def request(self, method, url, **kwargs):
            sent.append((url, kwargs["headers"]["authorization"]))
            if self.first:
                self.first = False
                return httpx.Response(429, headers={"retry-after": "3"}, content=b"{}")
            return served_app.request(method, url, **kwargs)

    news = [NewsRecord(f"B{i}", "", "", f"title {i}", "")
            for i in range(MAX_NEWS_PER_REQUEST + 1)]
    writer = NewsWriter(token=write_token, transport=Limited(), sleep=slept.append)
    assert writer.add(news) == {"added": len(news), "updated": 0, "num_news": 110 + len(news)}
    assert slept == [3.0] and len(sent) == 3
    assert all(auth == f"Bearer {write_token}" for _, auth in sent)
    with pytest.raises(ConfigError, match="at least 32"):
        NewsWriter(token="short", transport=Limited())
