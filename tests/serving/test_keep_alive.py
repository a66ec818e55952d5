"""Keep-alive: a device never reuses a connection the server is closing.

uvicorn closes a connection after it has been idle for ``timeout_keep_alive`` (5 s by
default); httpx reuses a pooled connection idle for less than ``keepalive_expiry`` (5 s by
default). With equal timeouts, a device that takes a pooled connection just before its expiry
and writes a moment later (a busy device; or a server that armed its timer before the device
finished reading the previous response) sends into a connection the server has just closed:
``RemoteProtocolError: Server disconnected without sending a response``. The server now keeps
idle connections :data:`KEEP_ALIVE_TIMEOUT_S` (30 s), far beyond the SDK's
:data:`CLIENT_KEEPALIVE_EXPIRY_S` (5 s).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

import httpcore
import httpx

from privaterec.serving.client import free_port
from privaterec.serving.server import KEEP_ALIVE_TIMEOUT_S, uvicorn_config
from privaterec.serving.transport import (CLIENT_KEEPALIVE_EXPIRY_S, HttpSession,
                                          client_limits)

LAG_S = 0.6  # between taking a pooled connection and writing to it (a busy device)


def test_the_server_keeps_idle_connections_well_beyond_the_sdk():
    assert client_limits().keepalive_expiry == CLIENT_KEEPALIVE_EXPIRY_S
    assert KEEP_ALIVE_TIMEOUT_S >= CLIENT_KEEPALIVE_EXPIRY_S + 20
    session = HttpSession("http://127.0.0.1:1", None, 1.0)
    try:  # the SDK's own client pools with these limits
        assert session._owned is not None
        assert session._owned._transport._pool._keepalive_expiry == CLIENT_KEEPALIVE_EXPIRY_S
    finally:
        session.close()


@contextmanager
def served(app) -> Iterator[str]:
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn_config(app, host="127.0.0.1", port=port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


class LaggingStream(httpcore.NetworkStream):
    """A TCP stream whose next write waits ``lag`` seconds first."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self.inner = inner
        self.lag = 0.0

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if self.lag:
            time.sleep(self.lag)
            self.lag = 0.0
        self.inner.write(buffer, timeout)

    def close(self) -> None:
        self.inner.close()

    def start_tls(self, *args, **kwargs):  # pragma: no cover - plain HTTP here
        return self.inner.start_tls(*args, **kwargs)

    def get_extra_info(self, info: str):
        return self.inner.get_extra_info(info)


class LaggingBackend(httpcore.SyncBackend):
    def __init__(self) -> None:
        self.streams: list[LaggingStream] = []

    def connect_tcp(self, *args, **kwargs) -> LaggingStream:
        stream = LaggingStream(super().connect_tcp(*args, **kwargs))
        self.streams.append(stream)
        return stream


def test_a_connection_reused_just_before_the_sdk_expiry_is_still_open(served_app):
    """The SDK's pool reuses a connection idle for just under its expiry and writes LAG_S
    later: the server must still hold it (failed with uvicorn's default 5 s timeout)."""
    backend = LaggingBackend()
    limits = client_limits()
    transport = httpx.HTTPTransport(limits=limits)
    transport._pool = httpcore.ConnectionPool(
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry, network_backend=backend)
    retries = 0
    with served(served_app.app) as url, \
            httpx.Client(base_url=url, transport=transport) as client:
        assert client.get("/v1/health").status_code == 200
        time.sleep(CLIENT_KEEPALIVE_EXPIRY_S - 0.3)  # still reusable for the device
        for stream in backend.streams:
            stream.lag = LAG_S
        try:
            response = client.get("/v1/health")
        except httpx.TransportError:
            retries += 1
            response = client.get("/v1/health")
        assert response.status_code == 200
    assert len(backend.streams) == 1  # the idle connection was reused ...
    assert retries == 0  # ... and the server had not closed it
