"""``privaterec serve``: load a run, open (or build) the news store, run uvicorn.

The store (default ``RUN/serving-store``) survives restarts: articles ingested through the API
stay, and ``--news`` only adds the articles whose id the store does not hold yet (each batch
of 1000 atomically). A store built with another news encoder is re-encoded on open.

uvicorn runs without an access log: the server keeps no record of queries.

The write API (``POST /v1/news``) needs a bearer token (:mod:`.write_api`): ``serve`` refuses
to start without one unless writes are disabled on purpose (``no_ingest``).

Keep-alive: uvicorn closes a connection idle for :data:`KEEP_ALIVE_TIMEOUT_S`; the SDK's
clients drop theirs after ``privaterec.serving.transport.CLIENT_KEEPALIVE_EXPIRY_S``, well
before. A client never reuses a connection the server may be closing at that moment, which
would fail the request with "server disconnected" (a race that busy devices and servers make
likely when both timeouts are equal, as uvicorn's and httpx's defaults of 5 s are).
"""

from __future__ import annotations

import errno
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fastapi import FastAPI

from privaterec.errors import ConfigError
from privaterec.serving.app import DEFAULT_MAX_BODY_BYTES, create_app
from privaterec.serving.bundle import ServingModels
from privaterec.serving.store import NewsStore, StoreError, read_articles
from privaterec.serving.write_api import WriteLimits, resolve_write_token

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
STORE_DIR = "serving-store"
KEEP_ALIVE_TIMEOUT_S = 30
"""Seconds uvicorn keeps an idle connection open: 25 s more than the SDK's clients reuse one
(uvicorn's default of 5 s equals httpx's default pool expiry, so both raced)."""


@dataclass
class Service:
    """A ready-to-run service: the app, its store and models, and what startup ingested."""

    app: FastAPI
    store: NewsStore
    models: ServingModels
    added: int

    def close(self) -> None:
        self.store.close()


def default_store_path(run: str | Path) -> Path:
    return Path(run) / STORE_DIR


def open_store(models: ServingModels, path: str | Path) -> NewsStore:
    """The news store at ``path`` for ``models`` (score spaces b and eᵛ, the ranker's
    news encoder)."""
    return NewsStore(path, dim=models.dim, encoder_version=models.ranker_version,
                     bases=models.score_bases(), encode=models.encode_news)


def build_service(run: str | Path, news: str | Path | None = None, *,
                  store_path: str | Path | None = None,
                  max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                  write_token: str | None = None, write_limits: WriteLimits = WriteLimits(),
                  progress: Callable[[str], None] | None = None) -> Service:
    """Load ``run``, open the store, add the articles of ``news`` that it lacks.

    ``write_token`` and ``write_limits`` are those of :func:`~.app.create_app` (``None``:
    writes disabled).

    Raises
    ------
    StoreError
        The store is in use, or it is empty and no ``news`` was given.
    """
    say = progress or (lambda message: None)
    models = ServingModels.from_run(run)
    store = open_store(models, store_path or default_store_path(run))
    try:
        added = 0
        if news is not None:
            articles = read_articles(news)
            say(f"news: {len(articles)} articles in {news}, encoding the new ones")
            added = store.add_missing(articles)
        if len(store) == 0:
            raise StoreError(f"{store.path}: the news pool is empty; pass --news with a "
                             f"news.tsv file or a MIND data directory")
        app = create_app(store, models, max_body_bytes=max_body_bytes,
                         write_token=write_token, write_limits=write_limits)
    except BaseException:
        store.close()
        raise
    return Service(app, store, models, added)


def serve(run: str | Path, news: str | Path | None = None, *, host: str = DEFAULT_HOST,
          port: int = DEFAULT_PORT, store_path: str | Path | None = None,
          max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, log_level: str = "warning",
          write_token_file: str | Path | None = None, no_ingest: bool = False,
          write_limits: WriteLimits = WriteLimits()) -> None:
    """Serve ``run`` over HTTP until interrupted (see the module docstring).

    Parameters
    ----------
    run:
        A ranking run or a Uni-FedRec run directory.
    news:
        A ``news.tsv`` file or a MIND data directory (train and test ``news.tsv``).
    host, port:
        Where to listen (default loopback only).
    store_path:
        The news store directory (default ``RUN/serving-store``).
    max_body_bytes:
        Larger request bodies get 413.
    log_level:
        uvicorn's log level (the access log is always off).
    write_token_file, no_ingest:
        The write API's token (a file readable by its owner only; else
        ``$PRIVATEREC_WRITE_TOKEN``), or writes disabled: one of them is required
        (:func:`~.write_api.resolve_write_token`).
    write_limits:
        The write API's rate limit.

    Raises
    ------
    ConfigError
        No write token and no ``no_ingest`` (checked before anything is loaded).
    """
    import uvicorn

    write_token = resolve_write_token(write_token_file, no_ingest=no_ingest)

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    listener = bind(host, port)  # before anything else: a busy port fails at once
    port = int(listener.getsockname()[1])  # the port bound (--port 0: one the OS chose)
    try:
        service = build_service(run, news, store_path=store_path,
                                max_body_bytes=max_body_bytes, write_token=write_token,
                                write_limits=write_limits, progress=say)
    except BaseException:
        listener.close()
        raise
    try:
        say(f"serving {len(service.store)} news ({service.added} added now) with model "
            f"{service.models.model_version} ({service.models.method}, B = "
            f"{service.models.basis_size}, d = {service.models.dim}) on http://{host}:{port}"
            f" — store {service.store.path}; writes (POST /v1/news) "
            + ("need the write token" if write_token is not None else "disabled"))
        config = uvicorn_config(service.app, host=host, port=port, log_level=log_level)
        server = uvicorn.Server(config)
        server.run(sockets=[listener])
        if not server.started:
            raise StoreError(f"could not serve on {host}:{port} (is the port in use? pass "
                             f"another --port)")
    finally:
        listener.close()
        service.close()


def uvicorn_config(app: FastAPI, *, host: str, port: int, log_level: str = "warning") -> Any:
    """The ``uvicorn.Config`` :func:`serve` runs: no access log, no ``Server`` header, no
    WebSocket protocol (the API has none), idle connections kept :data:`KEEP_ALIVE_TIMEOUT_S`."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, access_log=False, log_level=log_level,
                          server_header=False, ws="none",
                          timeout_keep_alive=KEEP_ALIVE_TIMEOUT_S)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` for uvicorn.

    Raises
    ------
    ConfigError
        If the address cannot be bound (the port is in use, the host is not local, ...),
        naming it and what to pass instead.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        reason = ("the port is in use by another process" if exc.errno == errno.EADDRINUSE
                  else exc.strerror or str(exc))
        raise ConfigError(f"cannot serve on {host}:{port}: {reason}; pass another --port "
                          f"(or --host)") from None


__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "KEEP_ALIVE_TIMEOUT_S", "STORE_DIR", "Service",
           "bind", "build_service", "default_store_path", "open_store", "serve",
           "uvicorn_config"]
