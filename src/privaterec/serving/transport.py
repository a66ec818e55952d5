"""HTTP between a device and the serving API: transport, JSON bodies, server errors.

The SDK talks to the server through any object with httpx's ``request(method, url,
content=..., headers=...)`` (:class:`Transport`): by default an ``httpx.Client`` (keep-alive)
on ``base_url``, in tests e.g. FastAPI's ``TestClient(app)``. :class:`HttpSession` sends the
requests, turns error statuses into :class:`ServerError` with the server's ``detail`` and
records the size of the last request body (``bytes_sent``: what left the device).
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping, Protocol, Self

import httpx

from privaterec.errors import ConfigError, PrivateRecError

CLIENT_KEEPALIVE_EXPIRY_S = 5.0
"""Seconds the SDK's HTTP client keeps an idle connection for reuse: well below the server's
keep-alive timeout (``privaterec.serving.server.KEEP_ALIVE_TIMEOUT_S``), so the device never
reuses a connection the server is closing."""


def client_limits() -> httpx.Limits:
    """The SDK's connection pool: httpx's defaults with :data:`CLIENT_KEEPALIVE_EXPIRY_S`."""
    return httpx.Limits(max_connections=100, max_keepalive_connections=20,
                        keepalive_expiry=CLIENT_KEEPALIVE_EXPIRY_S)


class ServerError(PrivateRecError):
    """The server answered a request with an error status (or unreadable content).

    Attributes
    ----------
    status: the HTTP status (0 when the server could not be reached).
    detail: the server's ``detail`` message, or the raw text.
    """

    def __init__(self, method: str, url: str, status: int, detail: Any) -> None:
        self.status = status
        self.detail = detail
        what = "could not reach the server" if status == 0 else f"HTTP {status}"
        super().__init__(f"{method} {url}: {what}: {detail}")


class ModelChangedError(ServerError):
    """The server now serves another model than the one the device downloaded.

    The release already sent was computed for the old basis; call ``device.refresh()`` to
    download the new model and query again (the cache of the old model is not reused).
    """


class Transport(Protocol):
    """What the SDK needs from an HTTP client: httpx's ``Client.request`` signature."""

    def request(self, method: str, url: str, *, content: bytes | None = None,
                headers: Mapping[str, str] | None = None) -> Any: ...


class HttpSession:
    """JSON/bytes requests through a :class:`Transport`, recording the last request body.

    Parameters
    ----------
    base_url:
        The server (used only when ``transport`` is ``None``).
    transport:
        An httpx-compatible client; default ``httpx.Client(base_url)``, closed by :meth:`close`.
    timeout:
        Seconds per request of the default transport.
    """

    def __init__(self, base_url: str | None, transport: Transport | None, timeout: float) -> None:
        self._owned: httpx.Client | None = None  # the default client, closed by close()
        if transport is None:
            if not base_url:
                raise ConfigError("pass the server's base_url (e.g. 'http://127.0.0.1:8000') "
                                  "or a transport")
            self._owned = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout,
                                       limits=client_limits())
            transport = self._owned
        self.transport: Transport = transport
        self.bytes_sent = 0

    def close(self) -> None:
        if self._owned is not None:
            self._owned.close()

    def send_raw(self, method: str, path: str, content: bytes | None,
                 headers: Mapping[str, str] | None) -> Any:
        """The response to one request, whatever its status (:class:`ServerError` with
        status 0 when the server could not be reached)."""
        if content is not None:
            self.bytes_sent = len(content)
        try:
            return self.transport.request(method, path, content=content, headers=headers)
        except httpx.TransportError as exc:
            raise ServerError(method, path, 0, f"{type(exc).__name__}: {exc}") from None

    def _send(self, method: str, path: str, content: bytes | None) -> Any:
        headers = {"content-type": "application/json"} if content is not None else None
        return raise_for_status(self.send_raw(method, path, content, headers), method, path)

    def get_json(self, path: str) -> dict[str, Any]:
        return json_of(self._send("GET", path, None), "GET", path)

    def get_bytes(self, path: str) -> bytes:
        return bytes(self._send("GET", path, None).content)

    def post_json(self, path: str, body: bytes) -> dict[str, Any]:
        self.bytes_sent = len(body)
        return json_of(self._send("POST", path, body), "POST", path)


def raise_for_status(response: Any, method: str, path: str) -> Any:
    """``response``, or a :class:`ServerError` with the server's ``detail`` when its status is
    400 or more."""
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail", response.text)
        except (ValueError, AttributeError):
            detail = response.text
        raise ServerError(method, path, response.status_code, detail)
    return response


def json_of(response: Any, method: str, path: str) -> dict[str, Any]:
    """The JSON object of ``response`` (:class:`ServerError` if it is not one)."""
    try:
        data = response.json()
    except ValueError:
        raise ServerError(method, path, response.status_code,
                          f"expected JSON, got {response.content[:80]!r}") from None
    if not isinstance(data, dict):
        raise ServerError(method, path, response.status_code, f"expected a JSON object, got "
                          f"{type(data).__name__}")
    return data


def json_floats(values: Iterable[float]) -> list[float]:
    """Floats with 9 significant digits: exact for float32, about half the JSON of repr().

    Raises
    ------
    ValueError
        A non-finite value (never sent).
    """
    out = []
    for v in values:
        x = float(f"{float(v):.9g}")
        if not math.isfinite(x):
            raise ValueError(f"refusing to send a non-finite value {x!r}")
        out.append(x)
    return out


def json_body(payload: Mapping[str, Any]) -> bytes:
    """The compact JSON bytes the SDK sends (no spaces), as counted by ``bytes_sent``."""
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()


class HttpClient:
    """A client of the server over one :class:`HttpSession` (``_http``); used as a context
    manager, it closes the session on exit."""

    _http: HttpSession

    def close(self) -> None:
        """Close the default transport (a transport passed in is the caller's)."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["CLIENT_KEEPALIVE_EXPIRY_S", "HttpClient", "HttpSession", "ModelChangedError",
           "ServerError", "Transport", "client_limits", "json_body", "json_floats", "json_of",
           "raise_for_status"]
