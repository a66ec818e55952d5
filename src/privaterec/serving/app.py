"""The HTTP API (FastAPI): private recommendation, Uni-FedRec recall, news ingestion.

Endpoints (JSON; OpenAPI at ``/openapi.json``): ``GET /v1/health``, ``GET /v1/model``,
``GET /v1/model/parameters`` and ``/v1/model/recall-parameters`` (``torch.save`` bytes),
``POST /v1/recommend/privaterec`` (α̃ → top-k, PrivateRec Alg. 1 in the B-dim score space:
scores α̃ᵀP with P = b·Rᵀ precomputed, docs/architecture.md#performance-design), ``POST
/v1/recommend/vdp`` (a noised d-dim user vector → exact inner products over R, PrivateRec §3.2.1),
``POST /v1/recall/unifedrec`` (per-channel weights and quotas → R candidates, Uni-FedRec §3.4 Eq.
4, scores αᵢᵀP_r in the value embeddings' score space), ``POST /v1/news`` (ingest, the
operator's write API) and ``GET /v1/news/{news_id}``.

Local ranking (:mod:`~privaterec.ondevice.pool_format`): ``GET /v1/pool/{space}`` downloads the
whole pool — P = b·Rᵀ (``scores``) or R (``vectors``) in float32, float16 or int8 — with its
content hash as ETag (``If-None-Match`` → 304, no body);
``GET /v1/pool/{space}/delta?since=V&pool_id=…`` sends only what changed since version V;
``POST /v1/news/lookup`` returns articles by id (title lookups of a local-ranking device,
possibly with decoys).

Bad input never produces a 5xx: bodies are validated by :mod:`.schemas` (422 with
``{"detail": [{"loc", "msg", "type"}]}``, without echoing the input), bodies larger than
``max_body_bytes`` get 413 before they are parsed, unknown model parts answer 404 with a
message. Nothing here logs or stores a query payload.

Security (docs/serving.md#security): every endpoint but :data:`~.write_api.WRITE_ROUTES` is a
public read — it changes nothing on the server and answers from public data (the public model,
the news pool). :data:`PUBLIC_QUERY_ROUTES` lists the POSTs among them (queries with a
body). A write needs the server's bearer token (:class:`~.write_api.WriteGuard`, outside every
other layer: 401/403/429 before the body is read).

Concurrency: query handlers are ``async`` (short numpy work on the event loop, no thread
hop); ingestion runs in the thread pool and swaps the store's immutable pool snapshot, which
each query reads exactly once.
"""

# No ``from __future__ import annotations``: FastAPI must see the per-app request models
# (built in create_app) as real annotation objects, not as names to resolve globally.
import json
from typing import TYPE_CHECKING, Any, Callable, Literal

import numpy as np
from fastapi import FastAPI, Header, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from privaterec.version import __version__
from privaterec.data.records import NewsRecord
from privaterec.ondevice.release import SERVING_MODES, ServingMode
from privaterec.serving import schemas
from privaterec.serving.bundle import ServingModels
from privaterec.serving.pool_download import VersionError, delta_pool, full_pool
from privaterec.ondevice.pool_format import PoolFormatError
from privaterec.serving.store import NewsPool, NewsStore, article_json, top_k_positions
from privaterec.serving.write_api import (WRITE_ROUTES, ASGIApp, Message, Receive, Scope, Send,
                                          WriteGuard, WriteLimits, reject)

DEFAULT_MAX_BODY_BYTES = 1_000_000
NO_BASIS = ("this model has no basic vectors; train with --method privaterec to serve "
            "PrivateRec queries")
NO_RECALL = ("this server has no Uni-FedRec recall model; serve a Uni-FedRec run "
             "(privaterec train --method unifedrec --ranker RUN)")

Responses = dict[int | str, dict[str, Any]]
"""The ``responses=`` of a FastAPI route: extra status codes documented in OpenAPI."""


def json_response(payload: Any, status_code: int = 200) -> Response:
    """A compact JSON response (``NaN``/``Infinity`` are never written)."""
    body = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
    return Response(content=body, status_code=status_code, media_type="application/json")


def _invalid(field: str, message: str) -> HTTPException:
    """A 422 shaped like FastAPI's validation errors."""
    return HTTPException(status_code=422, detail=[{"loc": ["body", field], "msg": message,
                                                   "type": "value_error"}])


def _check_count(value: int, pool: NewsPool, field: str) -> int:
    if len(pool) == 0:
        raise _invalid(field, "the news pool is empty; ingest news with POST /v1/news first")
    if value > len(pool):
        raise _invalid(field, f"{field} = {value} exceeds the number of news in the pool "
                              f"({len(pool)})")
    return value


def etag_matches(header: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header matches ``etag`` (weak comparison, ``*``)."""
    if not header:
        return False
    for tag in header.split(","):
        tag = tag.strip()
        if tag == "*" or tag.removeprefix("W/") == etag:
            return True
    return False


def _finite_or_422(scores: np.ndarray, field: str) -> np.ndarray:
    if not np.isfinite(scores).all():
        raise _invalid(field, f"{field} is too large to score (float32 overflow); send a "
                              f"clipped vector")
    return scores


class BodyLimit:
    """Pure ASGI middleware: 413 for request bodies larger than ``max_bytes``.

    A declared ``Content-Length`` is checked before anything is read; a body without one
    (chunked) is buffered up to the limit and replayed to the application.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                length = value
                break
        if length is not None:
            try:
                size = int(length)
            except ValueError:
                await self._reject(send, 400, "invalid Content-Length header")
                return
            if size > self.max_bytes:
                await self._reject(send, 413, self._message())
                return
            await self.app(scope, receive, send)
            return
        if scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message], receive), send)
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                await self._reject(send, 413, self._message())
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], receive), send)

    def _message(self) -> str:
        return f"request body larger than {self.max_bytes} bytes"

    @staticmethod
    async def _reject(send: Send, status: int, detail: str) -> None:
        await reject(send, status, detail, [(b"connection", b"close")])


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


def _validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    """Pydantic errors as ``{loc, msg, type}`` (no ``input``: payloads are not echoed)."""
    errors = []
    for error in exc.errors():
        msg = str(error.get("msg", "invalid value"))
        ctx = error.get("ctx") or {}
        if error.get("type") == "json_invalid" and "error" in ctx:
            msg = f"{msg}: {ctx['error']}"
        errors.append({"loc": [p if isinstance(p, (str, int)) else str(p)
                               for p in error.get("loc", ())],
                       "msg": msg, "type": str(error.get("type", "value_error"))})
    return errors


PUBLIC_QUERY_ROUTES: frozenset[tuple[str, str]] = frozenset({
    ("POST", "/v1/recommend/privaterec"), ("POST", "/v1/recommend/vdp"),
    ("POST", "/v1/recall/unifedrec"), ("POST", "/v1/news/lookup")})
"""POSTs that only read: a private query or an article lookup (nothing is stored)."""

ERRORS: Responses = {400: {"model": schemas.ErrorResponse, "description": "Unreadable request"},
          404: {"model": schemas.ErrorResponse, "description": "Not found"},
          413: {"model": schemas.ErrorResponse, "description": "Request body too large"}}


WRITE_ERRORS: Responses = {
    401: {"model": schemas.ErrorResponse,
          "description": "No 'Authorization: Bearer TOKEN' header (the write API needs the "
                         "server's write token)"},
    403: {"model": schemas.ErrorResponse,
          "description": "Wrong write token, or writes are disabled on this server"},
    429: {"model": schemas.ErrorResponse,
          "description": "Too many writes (rate limit); see Retry-After"}}


def create_app(store: NewsStore, models: ServingModels, *,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, write_token: str | None = None,
               write_limits: WriteLimits = WriteLimits()) -> FastAPI:
    """The FastAPI application serving ``models`` over the pool of ``store``.

    Parameters
    ----------
    store:
        The news pool; its score spaces must include ``privaterec`` when the ranker has
        basic vectors and ``recall`` when ``models`` has a recall model.
    models:
        The served models.
    max_body_bytes:
        Larger request bodies are refused with 413.
    write_token:
        The bearer token of the write API (``POST /v1/news``); ``None`` disables writes
        (403). Compared in constant time, never logged.
    write_limits:
        The write API's rate limit.
    """
    if models.basis is not None and "privaterec" not in store.bases:
        raise ValueError("the store has no 'privaterec' score space for the model's basis")
    if models.recall is not None and "recall" not in store.bases:
        raise ValueError("the store has no 'recall' score space for the recall model")
    if store.dim != models.dim:
        raise ValueError(f"store has d = {store.dim}, the model d = {models.dim}")
    recall = models.recall
    bodies = schemas.request_models(
        basis_size=models.basis_size, dim=models.dim,
        recall_basis_size=0 if recall is None else int(recall.num_basis),
        max_channels=5 if recall is None else int(recall.max_channels))
    if TYPE_CHECKING:  # the per-app bodies subclass these (same fields, exact lengths)
        from privaterec.serving.schemas import RecallQueryBody as RecallQuery
    else:  # FastAPI reads the annotations: the per-app bodies carry the vector lengths
        RecallQuery = bodies.recall
    version = models.model_version

    app = FastAPI(title="privaterec", version=__version__,
                  description="Private news recommendation (PrivateRec, Uni-FedRec, VDP).")
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    # added last, so outermost: a write is authenticated before its body is read
    app.add_middleware(WriteGuard, token=write_token, limits=write_limits)

    @app.exception_handler(RequestValidationError)
    async def _on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _validation_errors(exc)}, status_code=422)

    @app.exception_handler(Exception)
    async def _on_error(request: Request, exc: Exception) -> JSONResponse:
        # deliberately generic: an exception text could quote a payload
        return JSONResponse({"detail": "internal server error"}, status_code=500)

    def items(pool: NewsPool, positions: np.ndarray, scores: np.ndarray) -> list[dict]:
        articles = pool.articles
        return [{"news_id": articles[p].news_id, "title": articles[p].title,
                 "category": articles[p].category, "score": s}
                for p, s in zip(positions.tolist(), scores[positions].tolist())]

    @app.get("/v1/health", response_model=schemas.HealthResponse, responses=ERRORS)
    async def health() -> Response:
        return json_response({"status": "ok", "num_news": len(store.pool),
                              "model_version": version})

    @app.get("/v1/model", response_model=schemas.ModelInfo, responses=ERRORS)
    async def model_info() -> Response:
        return json_response({**models.info(), "num_news": len(store.pool)})

    octet: Responses = {200: {"content": {"application/octet-stream": {}},
                   "description": "torch.save bytes"}}

    @app.get("/v1/model/parameters", response_class=Response, responses={**ERRORS, **octet})
    def parameters() -> Response:
        return Response(models.parameters_payload, media_type="application/octet-stream",
                        headers={"ETag": f'"{version}"'})

    @app.get("/v1/model/recall-parameters", response_class=Response,
             responses={**ERRORS, **octet})
    def recall_parameters() -> Response:
        payload = models.recall_parameters_payload
        if payload is None:
            raise HTTPException(404, NO_RECALL)
        return Response(payload, media_type="application/octet-stream",
                        headers={"ETag": f'"{version}"'})

    def recommend(mode: ServingMode, query: schemas.QueryBody) -> Response:
        """A ranking query of ``mode``: score its release over the pool, return the top k."""
        if mode.needs_basis and models.basis is None:
            raise HTTPException(404, NO_BASIS)
        pool = store.pool
        k = _check_count(query.k, pool, "k")
        with np.errstate(over="ignore", invalid="ignore"):
            values = np.asarray(getattr(query, mode.field), dtype=np.float64).astype(np.float32)
            scores = (pool.space_scores(mode.score_space, values) if mode.score_space
                      else pool.dense_scores(values))
        _finite_or_422(scores, mode.field)
        top = top_k_positions(scores, k)
        return json_response({"model_version": version, "items": items(pool, top, scores)})

    def route(mode: ServingMode, body: type[schemas.QueryBody]) -> Callable[..., Any]:
        async def handler(query: Any) -> Response:
            return recommend(mode, query)
        handler.__annotations__["query"] = body  # FastAPI reads the body model from it
        return handler

    for name, body in bodies.query.items():  # one endpoint per serving mode that sends
        app.post(SERVING_MODES[name].endpoint, response_model=schemas.RecommendResponse,
                 responses=ERRORS, name=f"recommend_{name}")(route(SERVING_MODES[name], body))

    if recall is not None:
        from privaterec.recall.index import allocate_quotas, merge_rankings

    @app.post("/v1/recall/unifedrec", response_model=schemas.RecallResponse,
              responses=ERRORS)
    async def recall_unifedrec(query: RecallQuery) -> Response:
        if recall is None:
            raise HTTPException(404, NO_RECALL)
        pool = store.pool
        total = _check_count(query.total, pool, "total")
        channels = query.channels
        weights = np.asarray([c.weights for c in channels], dtype=np.float32)
        quotas = np.asarray([c.quota for c in channels], dtype=np.float64)
        quotas = quotas / quotas.max()  # scale-free; avoids overflow of huge quotas
        scores = pool.space_scores("recall", weights)  # [M, N] = α_i P_r (Eq. 4)
        _finite_or_422(scores, "channels")
        counts = allocate_quotas(quotas, total)
        rankings = [top_k_positions(scores[i], total) if counts[i] else
                    np.empty(0, np.int64) for i in range(len(channels))]
        positions = np.asarray(merge_rankings(rankings, counts), dtype=np.int64)
        order = np.lexsort((np.arange(counts.size), -counts))  # merge_rankings' service order
        channel_of = np.repeat(order, counts[order])
        vectors = (pool.vectors[positions].tolist()
                   if query.include_vectors else [None] * len(positions))
        articles = pool.articles
        candidates = [{"news_id": articles[p].news_id, "title": articles[p].title,
                       "category": articles[p].category,
                       "subcategory": articles[p].subcategory,
                       "abstract": articles[p].abstract, "channel": c, "vector": v}
                      for p, c, v in zip(positions.tolist(), channel_of.tolist(), vectors)]
        return json_response({"model_version": version, "candidates": candidates})

    @app.post("/v1/news", response_model=schemas.IngestResponse,
              responses={**ERRORS, **WRITE_ERRORS},
              openapi_extra={"security": [{"writeToken": []}]},
              summary="Add or update articles (the operator's write API: bearer token)")
    def ingest(request: schemas.IngestRequest) -> Response:
        articles = [NewsRecord(**item.model_dump()) for item in request.news]
        result = store.upsert(articles)
        return json_response({"added": result.added, "updated": result.updated,
                              "num_news": result.num_news})

    PoolSpace = Literal["scores", "vectors"]
    PoolDtype = Literal["float32", "float16", "int8"]
    binary: Responses = {200: {"content": {"application/octet-stream": {}},
                    "description": "A privaterec pool body (privaterec.ondevice.pool_format): "
                                   "magic, JSON header, zlib ids (and titles), int8 scales, "
                                   "[n, rows] records. Headers: ETag (content hash of the "
                                   "full pool), X-Pool-Version, X-Pool-Id."},
              304: {"description": "Not Modified: If-None-Match holds the current ETag; no "
                                   "body."}}
    dtype_doc = "float32 (exact), float16, or int8 with one float32 scale per record"
    titles_doc = "also send every article's title and category (zlib)"

    def _pool_response(space: str, dtype: str, titles: bool, if_none_match: str | None,
                       body: Callable[[NewsPool], bytes] | None = None) -> Response:
        """The full pool's headers and body (or ``body(pool)``), or 304 when
        ``If-None-Match`` holds the full pool's ETag."""
        if space == "scores" and models.basis is None:
            raise HTTPException(404, NO_BASIS + " (download space 'vectors' instead)")
        pool = store.pool
        try:
            full = full_pool(pool, space=space, dtype=dtype, titles=titles,
                             model_version=version)
        except PoolFormatError as exc:
            raise _invalid("dtype", str(exc)) from None
        headers = {"ETag": full.etag, "X-Pool-Version": str(pool.version),
                   "X-Pool-Id": full.state.pool_id, "Cache-Control": "no-cache"}
        if etag_matches(if_none_match, full.etag):
            return Response(status_code=304, headers=headers)
        content = full.body if body is None else body(pool)
        return Response(content, media_type="application/octet-stream", headers=headers)

    @app.get("/v1/pool/{space}", response_class=Response, responses={**ERRORS, **binary},
             summary="Download the whole news pool (local ranking)")
    def pool_download(space: PoolSpace,
                      dtype: PoolDtype = Query("float32", description=dtype_doc),
                      titles: bool = Query(False, description=titles_doc),
                      if_none_match: str | None = Header(None)) -> Response:
        """The pool's score matrix P = b·Rᵀ (``scores``: the rows of Pᵀ, B per news; needs
        basic vectors) or its d-dim news vectors (``vectors``: any ranker), the same bytes for
        every device. A device that holds it ranks locally and sends nothing about its user.
        Conditional: ``If-None-Match`` with the current ETag → 304 without a body."""
        return _pool_response(space, dtype, titles, if_none_match)

    @app.get("/v1/pool/{space}/delta", response_class=Response,
             responses={**ERRORS, **binary,
                        409: {"model": schemas.ErrorResponse,
                              "description": "since is after the pool's version"},
                        410: {"model": schemas.ErrorResponse,
                              "description": "since is before the base version, or pool_id "
                                             "names another store: download the full pool"}},
             summary="Incremental sync of the news pool since a version")
    def pool_delta(space: PoolSpace,
                   since: int = Query(..., ge=0, le=2 ** 62,
                                      description="the pool version the device holds"),
                   pool_id: str = Query(..., min_length=1, max_length=64,
                                        pattern=r"^[0-9a-f]+$",
                                        description="X-Pool-Id of the device's pool"),
                   dtype: PoolDtype = Query("float32", description=dtype_doc),
                   titles: bool = Query(False, description=titles_doc),
                   if_none_match: str | None = Header(None)) -> Response:
        """Only the records written after ``since`` (new and updated news, in pool order) and
        the ids removed since. The body's ``hash`` is the content hash of the full pool after
        it, which the device checks on its updated state. ``If-None-Match`` with the current
        ETag (nothing changed) → 304 without a body."""

        def delta(pool: NewsPool) -> bytes:
            try:
                return delta_pool(pool, since=since, pool_id=pool_id, space=space, dtype=dtype,
                                  titles=titles, model_version=version)
            except VersionError as exc:
                raise HTTPException(exc.status, exc.message) from None

        return _pool_response(space, dtype, titles, if_none_match, delta)

    @app.post("/v1/news/lookup", response_model=schemas.LookupResponse, responses=ERRORS)
    async def lookup_news(request: schemas.LookupRequest) -> Response:
        """Articles by id (1..1000 ids; unknown ids are listed in ``missing``)."""
        pool = store.pool
        found, missing = [], []
        for news_id in request.ids:
            article = pool.get(news_id)
            if article is None:
                missing.append(news_id)
            else:
                found.append(article_json(article))
        return json_response({"news": found, "missing": missing})

    @app.get("/v1/news/{news_id}", response_model=schemas.Article, responses=ERRORS)
    async def get_news(news_id: str) -> Response:
        article = store.pool.get(news_id)
        if article is None:
            raise HTTPException(404, "unknown news id; it is not in the news pool")
        return json_response(article_json(article))

    _document_write_security(app)
    return app


def _document_write_security(app: FastAPI) -> None:
    """Declare the write token in the OpenAPI schema (``components.securitySchemes``)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            schema.setdefault("components", {}).setdefault("securitySchemes", {})[
                "writeToken"] = {"type": "http", "scheme": "bearer",
                                 "description": "the operator's write token (privaterec "
                                                "serve --write-token-file)"}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the schema


__all__ = ["BodyLimit", "DEFAULT_MAX_BODY_BYTES", "NO_BASIS", "NO_RECALL",
           "PUBLIC_QUERY_ROUTES", "WRITE_ROUTES", "create_app", "etag_matches",
           "json_response"]
