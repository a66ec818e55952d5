"""The device's privacy account: ledger, budget cap, re-release limit, release cache
(docs/privacy.md#the-ledger).

A device accounts for one user (:data:`DEVICE_USER`) in a
:class:`~privaterec.privacy.ledger.PrivacyLedger`. :meth:`DeviceBudget.spend` records a
release only if the composed total ε stays within the cap and the history has not been
released too often lately, else raises :class:`~privaterec.errors.PrivacyBudgetExceeded`
(:class:`ReleaseLimitExceeded`) recording nothing — devices call it before anything is sent.
Re-sending the release cached for an unchanged (truncated) history is post-processing: it
costs nothing and records no event; :func:`release_key` is that cache's key.

Defaults (docs/serving.md#the-device-sdk):

* **Finite budget.** ``cap`` = :data:`DEFAULT_DEVICE_BUDGET` = 10: total ε of everything the
  device ever releases, all models and queries (10 one-ε queries, or 20 at ε = 0.5). Pure-DP
  (Laplace) devices compose at δ = 0 (the exact sum of ε); Gaussian devices at
  :data:`DEFAULT_GAUSSIAN_DELTA` = 1e-6 unless given. Pass ``math.inf`` to record only.
* **Persistent, locked state.** The ledger, the release cache and the re-release log live in
  one JSON file (``device_state.json``). Every read-check-write runs under an exclusive
  ``fcntl.flock`` on ``device_state.json.lock``, so two processes (or two device objects) of
  one user cannot both pass the cap on a stale copy of the ledger (POSIX only).
* **Re-release limit.** The server controls ``model_version``: every new version changes the
  cache key and forces a fresh (charged) release of an unchanged history, so a server could
  drain the budget and average many releases of one history. At most ``max_fresh_releases``
  (default :data:`DEFAULT_MAX_FRESH_RELEASES` = 2) fresh releases of the same truncated
  history are made per ``release_window`` seconds (default 24 h), whatever the model or
  parameters; beyond that the query is refused (nothing sent) until the window has passed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import time
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from privaterec.data.records import NewsRecord
from privaterec.errors import CheckpointError, ConfigError, PrivacyBudgetExceeded
from privaterec.files import write_atomic
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.ledger import Composition, PrivacyLedger, compose_events
from privaterec.validators import check_in, fail

DEVICE_USER = "device"
"""The ledger's user id: a device accounts for one user."""

STATE_FILE = "device_state.json"
"""File name of the device state (ledger + release cache) in a device's ``cache_dir``."""

DEFAULT_DEVICE_BUDGET = 10.0
"""Default cap on a device's total ε (all releases, all models)."""

DEFAULT_GAUSSIAN_DELTA = 1e-6
"""Default target δ of a Gaussian device's total (Laplace devices use δ = 0)."""

DEFAULT_MAX_FRESH_RELEASES = 2
"""Default number of fresh releases of one history per :data:`DEFAULT_RELEASE_WINDOW`."""

DEFAULT_RELEASE_WINDOW = 86_400.0
"""Default window (seconds) of the re-release limit: one day."""

STATE_DIR_ENV = "PRIVATEREC_DEVICE_DIR"
"""Environment variable overriding :func:`default_state_dir`."""

_RELEASE_CACHE_SIZE = 32
_FRESH_LOG_SIZE = 512  # histories whose fresh-release times are kept
_FRESH_LOG_AGE = 30 * 86_400.0  # times older than this are dropped
_STATE_FORMAT = "privaterec.device_state"

Events = list[tuple[PrivacyEvent, int]]


class ReleaseLimitExceeded(PrivacyBudgetExceeded):
    """The same history was freshly released ``max_fresh_releases`` times in the window."""


def default_state_dir() -> Path:
    """Where a device keeps its state when no ``cache_dir`` is given.

    ``$PRIVATEREC_DEVICE_DIR`` if set, else ``$XDG_STATE_HOME/privaterec/device``, else
    ``~/.local/state/privaterec/device``: per OS user, persistent, and not a cache directory
    (cleaning caches must not reset a privacy budget). One OS user = one device user.
    """
    override = os.environ.get(STATE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_STATE_HOME")
    root = Path(base).expanduser() if base else Path.home() / ".local" / "state"
    return root / "privaterec" / "device"


def _lock_file(path: Path) -> Path:
    """The lock file next to the state file ``path``."""
    return path.with_name(path.name + ".lock")


def _check_limit(max_fresh_releases: int | None, release_window: float) -> None:
    if max_fresh_releases is not None and (isinstance(max_fresh_releases, bool)
                                           or not isinstance(max_fresh_releases, int)
                                           or max_fresh_releases < 1):
        fail("max_fresh_releases", max_fresh_releases, "an int >= 1 (None: no limit)", kind="")
    check_in(release_window, "release_window", 0, math.inf, "a finite number of seconds > 0",
             open_low=True, kind="")


class DeviceBudget:
    """The device's ledger (one user) with a cap on the total ε and a re-release limit.

    Parameters
    ----------
    cap:
        Largest total ε (all phases) at target ``delta`` (default
        :data:`DEFAULT_DEVICE_BUDGET`); ``math.inf``: record only.
    delta:
        Target δ of the composition (0 for pure-DP Laplace releases: the exact Σε).
    composition:
        ``"pld"`` (default), ``"rdp"`` or ``"basic"`` (:func:`compose_events`).
    path:
        JSON file the ledger, the release cache and the re-release log are kept in, re-read
        under an exclusive lock before every check so that several device objects or
        processes of one user share it. ``None`` keeps them in memory only (devices always
        pass a path).
    max_fresh_releases:
        Fresh releases allowed per history (:func:`history_digest`) per ``release_window``
        (default :data:`DEFAULT_MAX_FRESH_RELEASES`; ``None``: no limit).
    release_window:
        Seconds (default :data:`DEFAULT_RELEASE_WINDOW`, one day).
    clock:
        Wall-clock seconds (default :func:`time.time`; persisted across restarts).
    """

    def __init__(self, *, cap: float = DEFAULT_DEVICE_BUDGET, delta: float = 0.0,
                 composition: Composition = "pld", path: str | Path | None = None,
                 max_fresh_releases: int | None = DEFAULT_MAX_FRESH_RELEASES,
                 release_window: float = DEFAULT_RELEASE_WINDOW,
                 clock: Callable[[], float] = time.time) -> None:
        check_in(cap, "budget", 0, math.inf, "a number > 0 (math.inf: no cap)", open_low=True,
                 open_high=False)
        check_in(delta, "budget_delta", 0, 1, "a number in [0, 1)")
        _check_limit(max_fresh_releases, release_window)
        self.cap = float(cap)
        self.delta = float(delta)
        self.composition: Composition = composition
        self.path = None if path is None else Path(path)
        self.max_fresh_releases = max_fresh_releases
        self.release_window = float(release_window)
        self.clock = clock
        self.ledger = PrivacyLedger()
        self.releases: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.fresh: OrderedDict[str, list[float]] = OrderedDict()
        with self._locked():
            self._load()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Exclusive ``flock`` on :func:`_lock_file` for one read-check-write (no-op in memory)."""
        if self.path is None:
            yield
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            handle = open(_lock_file(self.path), "a+")  # noqa: SIM115
        except OSError as exc:
            raise ConfigError(f"cannot keep the device's privacy ledger in {self.path.parent} "
                              f"({exc.strerror}): pass cache_dir=<a writable directory, one per "
                              f"user>, or set ${STATE_DIR_ENV}") from None
        with handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        try:
            state = json.loads(self.path.read_text())
            if state.get("format") != _STATE_FORMAT:
                raise ValueError(f"'format' is not {_STATE_FORMAT!r}")
            self.ledger = PrivacyLedger.from_dict(state["ledger"])
            self.releases = OrderedDict(state.get("releases", {}))
            self.fresh = OrderedDict((k, [float(t) for t in v])
                                     for k, v in state.get("fresh", {}).items())
        except (ValueError, KeyError, TypeError, CheckpointError) as exc:
            raise CheckpointError(f"{self.path}: unreadable device state ({exc}); it holds "
                                  f"this device's privacy ledger: restore it, or delete it "
                                  f"only if you accept losing the record of past releases"
                                  ) from None

    def save(self) -> None:
        """Write the ledger, release cache and re-release log atomically (no-op in memory).

        Callers hold the lock (:meth:`spend`, :meth:`cache`).
        """
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        state = {"format": _STATE_FORMAT, "ledger": self.ledger.to_dict(),
                 "releases": dict(self.releases), "fresh": dict(self.fresh)}
        write_atomic(self.path, json.dumps(state))

    def events(self) -> Events:
        """The device's distinct events and their counts."""
        return self.ledger.events(DEVICE_USER)

    def spent(self, *, delta: float | None = None) -> float:
        """Total ε of every recorded release at target δ (default: the budget's δ)."""
        with self._locked():
            self._load()
        return self.ledger.user_epsilon(DEVICE_USER, delta=self.delta if delta is None
                                        else delta, composition=self.composition)

    def fresh_releases(self, history: str) -> int:
        """Fresh releases of ``history`` (:func:`history_digest`) within the window."""
        now = self.clock()
        return sum(1 for t in self.fresh.get(history, []) if now - t < self.release_window)

    def _check_fresh(self, history: str) -> None:
        if self.max_fresh_releases is None:
            return
        recent = self.fresh_releases(history)
        if recent >= self.max_fresh_releases:
            raise ReleaseLimitExceeded(
                f"this history was already released {recent} times in the last "
                f"{self.release_window / 3600:g} h (max_fresh_releases="
                f"{self.max_fresh_releases}): a new release of it is refused and nothing was "
                f"sent. Each model change on the server (model_version) forces a fresh "
                f"release of an unchanged history; the limit stops a server from draining the "
                f"budget or averaging many releases of one history. Query again after the "
                f"window, or raise max_fresh_releases / shorten release_window")

    def _log_fresh(self, history: str) -> None:
        now = self.clock()
        times = [t for t in self.fresh.pop(history, []) if now - t < _FRESH_LOG_AGE]
        self.fresh[history] = [*times, now]
        while len(self.fresh) > _FRESH_LOG_SIZE:
            self.fresh.popitem(last=False)

    def spend(self, events: Events, *, history: str | None = None) -> float:
        """Record ``events`` if the cap and the re-release limit hold, else raise.

        Load, check and record run under the state file's lock: of two processes racing
        for the last of the budget, one passes and the other raises.

        Parameters
        ----------
        events:
            ``(event, count)`` pairs of one query.
        history:
            :func:`history_digest` of the released history (checked against and logged in
            the re-release limit); ``None``: not limited.

        Returns
        -------
        The new total ε (``nan`` when the cap is infinite: nothing is composed).

        Raises
        ------
        ReleaseLimitExceeded
            ``history`` was freshly released ``max_fresh_releases`` times in the window.
        PrivacyBudgetExceeded
            The releases would exceed the cap. Nothing is recorded either way.
        """
        with self._locked():
            self._load()  # another device object or process of this user may have spent
            if history is not None:
                self._check_fresh(history)
            if math.isinf(self.cap):
                total = math.nan  # not composed: nothing to check
            else:
                merged: dict[PrivacyEvent, int] = {}
                for event, count in [*self.events(), *events]:
                    merged[event] = merged.get(event, 0) + count
                total = compose_events(list(merged.items()), delta=self.delta,
                                       composition=self.composition)
                if total > self.cap * (1 + 1e-12):
                    described = ", ".join(f"{c} x {e.mechanism} (epsilon={e.epsilon:g})"
                                          for e, c in events)
                    raise PrivacyBudgetExceeded(
                        f"this query's release ({described}) would raise the device's total "
                        f"epsilon to {total:.4g} at delta={self.delta:g} ({self.composition} "
                        f"composition), above its budget={self.cap:g}; nothing was sent. "
                        f"Re-sending a cached release (unchanged history) is still free")
            for event, count in events:
                self.ledger.record(DEVICE_USER, event, count)
            if history is not None:
                self._log_fresh(history)
            self.save()
        return total

    def cached(self, key: str) -> dict[str, Any] | None:
        """The cached release under ``key`` (:func:`release_key`), or ``None``."""
        with self._locked():
            self._load()
        return self.releases.get(key)

    def cache(self, key: str, entry: dict[str, Any]) -> None:
        """Keep ``entry`` under ``key`` (the 32 most recent releases are kept) and save."""
        with self._locked():
            self._load()
            self.releases[key] = entry
            self.releases.move_to_end(key)
            while len(self.releases) > _RELEASE_CACHE_SIZE:
                self.releases.popitem(last=False)
            self.save()


def _digest_history(h: Any, history: Sequence[NewsRecord]) -> None:
    for n in history:
        h.update(json.dumps([n.news_id, n.category, n.subcategory, n.title, n.abstract]).encode())


def history_digest(history: Sequence[NewsRecord]) -> str:
    """Digest of a (truncated) history alone, the key of the re-release limit (never sent)."""
    h = hashlib.sha256(b"privaterec.history")
    _digest_history(h, history)
    return h.hexdigest()


def release_key(kind: str, model_version: str, params: Mapping[str, Any],
                history: Sequence[NewsRecord]) -> str:
    """Digest of what a release depends on (kept on the device; never sent).

    Parameters
    ----------
    kind:
        The release's kind (``privaterec``, ``vdp``, ``unifedrec``).
    model_version:
        The model the release was computed with.
    params:
        The privacy parameters of the release.
    history:
        The truncated history released (all text fields enter the digest).
    """
    h = hashlib.sha256()
    h.update(json.dumps([kind, model_version, sorted(params.items())], default=str).encode())
    _digest_history(h, history)
    return h.hexdigest()


__all__ = ["DEFAULT_DEVICE_BUDGET", "DEFAULT_GAUSSIAN_DELTA", "DEFAULT_MAX_FRESH_RELEASES",
           "DEFAULT_RELEASE_WINDOW", "DEVICE_USER", "DeviceBudget", "Events",
           "ReleaseLimitExceeded", "STATE_DIR_ENV", "STATE_FILE", "default_state_dir",
           "history_digest", "release_key"]
