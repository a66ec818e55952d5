"""The operator's write API: a bearer token, compared in constant time, and a rate limit.

The serving API has two audiences (docs/serving.md#security). Devices use the public read
API: model download, private queries, pool downloads and article lookups; none of it
changes the server's state. The operator uses the write API (:data:`WRITE_ROUTES`, today
``POST /v1/news``), which changes the news pool that every device ranks and downloads. A
write needs ``Authorization: Bearer TOKEN`` with the token the server was started with.

:class:`WriteGuard` is pure ASGI middleware that answers a write request before its body is
read:

* no write token configured (``privaterec serve --no-ingest``): 403, writes are disabled;
* no ``Authorization: Bearer`` header: 401 with ``WWW-Authenticate: Bearer``;
* a wrong token: 403 (``hmac.compare_digest``: the time taken does not depend on how much
  of the token matched);
* more writes than the token bucket allows: 429 with ``Retry-After``.

The token is never logged, echoed or stored by the server. :func:`resolve_write_token` reads
it from a file readable by its owner only, or from :data:`WRITE_TOKEN_ENV`.
"""

from __future__ import annotations

import hmac
import json
import math
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, MutableMapping

from privaterec.errors import ConfigError

WRITE_TOKEN_ENV = "PRIVATEREC_WRITE_TOKEN"
MIN_TOKEN_LENGTH = 32
WRITE_ROUTES: frozenset[tuple[str, str]] = frozenset({("POST", "/v1/news")})
"""(method, path) of every state-changing endpoint; all other endpoints are read-only."""
TOKEN_HINT = ("python -c 'import secrets; print(secrets.token_urlsafe(32))' > PATH && "
              "chmod 600 PATH")
REALM = 'Bearer realm="privaterec-write"'

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class WriteLimits:
    """Limits of the write API.

    Attributes
    ----------
    rate: writes per second allowed on average (token bucket refill rate).
    burst: writes allowed at once (bucket size).
    """

    rate: float = 2.0
    burst: int = 10

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ConfigError(f"write rate = {self.rate!r}: must be a positive number of "
                              f"writes per second")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise ConfigError(f"write burst = {self.burst!r}: must be an integer >= 1")


def check_token(token: str, *, source: str) -> str:
    """``token`` if it is usable as a bearer token, else :class:`ConfigError`.

    A usable token has at least :data:`MIN_TOKEN_LENGTH` characters, all printable ASCII
    without spaces (it travels in an HTTP header). The message names ``source``, never the
    token.
    """
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(f"{source}: the write token has {len(token)} characters; use a "
                          f"random token of at least {MIN_TOKEN_LENGTH} (e.g. {TOKEN_HINT})")
    if not all(33 <= ord(c) <= 126 for c in token):
        raise ConfigError(f"{source}: the write token must be printable ASCII without "
                          f"spaces (it is sent in an HTTP header); e.g. {TOKEN_HINT}")
    return token


def read_token_file(path: str | Path) -> str:
    """The write token in ``path`` (one line; surrounding whitespace is ignored).

    Raises
    ------
    ConfigError
        The file is missing or unreadable, readable by group or others (POSIX), or does not
        hold a usable token (:func:`check_token`).
    """
    file = Path(path).expanduser()
    try:
        info = file.stat()
        text = file.read_text(encoding="ascii")
    except FileNotFoundError:
        raise ConfigError(f"--write-token-file {file}: no such file; create one with "
                          f"{TOKEN_HINT}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--write-token-file {file}: unreadable ({type(exc).__name__}); "
                          f"it must hold one ASCII token") from None
    if os.name == "posix" and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"--write-token-file {file}: readable by other users (mode "
                          f"{stat.S_IMODE(info.st_mode):o}); run 'chmod 600 {file}'")
    return check_token(text.strip(), source=f"--write-token-file {file}")


def resolve_write_token(token_file: str | Path | None, *, no_ingest: bool,
                        environ: Mapping[str, str] | None = None) -> str | None:
    """The server's write token, or ``None`` when writes are disabled on purpose.

    Parameters
    ----------
    token_file:
        ``--write-token-file``: a file, readable by its owner only, holding the token.
    no_ingest:
        ``--no-ingest``: serve a fixed pool; every write is refused with 403.
    environ:
        Where :data:`WRITE_TOKEN_ENV` is looked up (default ``os.environ``).

    Raises
    ------
    ConfigError
        Neither a token nor ``no_ingest`` (a server would otherwise accept writes from
        anyone), or contradictory options.
    """
    env_token = (os.environ if environ is None else environ).get(WRITE_TOKEN_ENV)
    if no_ingest:
        if token_file is not None:
            raise ConfigError("--no-ingest disables the write API; --write-token-file would "
                              "enable it: pass one of them")
        return None
    if token_file is not None:
        if env_token:
            raise ConfigError(f"both --write-token-file and ${WRITE_TOKEN_ENV} are set: pass "
                              f"one write token")
        return read_token_file(token_file)
    if env_token:
        return check_token(env_token.strip(), source=f"${WRITE_TOKEN_ENV}")
    raise ConfigError(f"the write API (POST /v1/news) needs a token: pass --write-token-file "
                      f"PATH (create it with {TOKEN_HINT}) or set ${WRITE_TOKEN_ENV}; or pass "
                      f"--no-ingest to serve the pool as it is, with writes disabled")


class TokenBucket:
    """A thread-safe token bucket: :meth:`take` → 0 when allowed, else seconds to wait."""

    def __init__(self, limits: WriteLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        self.tokens = float(limits.burst)
        self.updated = clock()
        self._lock = threading.Lock()

    def take(self) -> float:
        with self._lock:
            now = self.clock()
            self.tokens = min(float(self.limits.burst),
                              self.tokens + (now - self.updated) * self.limits.rate)
            self.updated = now
            if self.tokens >= 1.0:
                self.tokens -= 1.0
                return 0.0
            return (1.0 - self.tokens) / self.limits.rate


def _bearer(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, credentials = bytes(value).strip().partition(b" ")
            if scheme.lower() == b"bearer" and credentials.strip():
                return credentials.strip()
            return None
    return None


class WriteGuard:
    """Pure ASGI middleware guarding :data:`WRITE_ROUTES` (see the module docstring).

    Parameters
    ----------
    app:
        The application.
    token:
        The write token; ``None`` disables every write (403).
    limits:
        The write rate limit.
    routes:
        The guarded (method, path) pairs; a path matches with or without a trailing ``/``.
    clock:
        Monotonic seconds (for tests of the rate limit).
    """

    def __init__(self, app: ASGIApp, token: str | None, limits: WriteLimits = WriteLimits(),
                 routes: frozenset[tuple[str, str]] = WRITE_ROUTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self._token = None if token is None else token.encode("ascii")
        self.routes = routes
        self.bucket = TokenBucket(limits, clock)

    def is_write(self, scope: Scope) -> bool:
        path = str(scope.get("path", ""))
        path = path.rstrip("/") or "/"
        return (str(scope.get("method", "")).upper(), path) in self.routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.is_write(scope):
            await self.app(scope, receive, send)
            return
        if self._token is None:
            await reject(send, 403, "writes are disabled on this server (started with "
                                     "--no-ingest)")
            return
        given = _bearer(scope)
        if given is None:
            await reject(send, 401, "the write API needs 'Authorization: Bearer TOKEN' with "
                                     "the server's write token",
                          [(b"www-authenticate", REALM.encode())])
            return
        if not hmac.compare_digest(given, self._token):
            await reject(send, 403, "wrong write token")
            return
        wait = self.bucket.take()
        if wait > 0:
            await reject(send, 429, f"too many writes: at most {self.bucket.limits.rate:g} "
                                     f"per second (bursts of {self.bucket.limits.burst}); "
                                     f"retry later",
                          [(b"retry-after", str(max(1, math.ceil(wait))).encode())])
            return
        await self.app(scope, receive, send)


async def reject(send: Send, status: int, detail: str,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """Answer with ``status`` and the JSON body ``{"detail": detail}`` (plus ``headers``)."""
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


__all__ = ["MIN_TOKEN_LENGTH", "REALM", "TokenBucket", "WRITE_ROUTES", "WRITE_TOKEN_ENV",
           "WriteGuard", "WriteLimits", "check_token", "read_token_file", "reject",
           "resolve_write_token"]
