"""The device's privacy account: ledger, budget cap and release cache (DESIGN §5).

A device accounts for one user (:data:`DEVICE_USER`) in a
:class:`~privaterec.privacy.ledger.PrivacyLedger`. :meth:`DeviceBudget.spend` records a
release only if the composed total ε stays within the cap, else raises
:class:`~privaterec.errors.PrivacyBudgetExceeded` recording nothing — devices call it before
anything is sent. Re-sending the release cached for an unchanged (truncated) history is
post-processing: it costs nothing and records no event; :func:`release_key` is that cache's
key. With a ``path`` the ledger and the cache are kept in one JSON file (``device_state.json``
in a device's ``cache_dir``) and survive restarts.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, Mapping, Sequence

from privaterec.data.records import NewsRecord
from privaterec.errors import CheckpointError, ConfigError, PrivacyBudgetExceeded
from privaterec.privacy.ledger import Composition, PrivacyEvent, PrivacyLedger, compose_events

DEVICE_USER = "device"
"""The ledger's user id: a device accounts for one user."""

STATE_FILE = "device_state.json"
"""File name of the device state (ledger + release cache) in a device's ``cache_dir``."""

_RELEASE_CACHE_SIZE = 32
_STATE_FORMAT = "privaterec.device_state"

Events = list[tuple[PrivacyEvent, int]]


class DeviceBudget:
    """The device's ledger (one user) with a cap on the total ε (DESIGN §5).

    Parameters
    ----------
    cap:
        Largest total ε (all phases) at target ``delta``; ``math.inf``: record only.
    delta:
        Target δ of the composition (0 for pure-DP Laplace releases: the exact Σε).
    composition:
        ``"pld"`` (default), ``"rdp"`` or ``"basic"`` (:func:`compose_events`).
    path:
        Optional JSON file the ledger (and the release cache) is kept in; re-read before
        every spend so that several device objects of one user share it.
    """

    def __init__(self, *, cap: float = math.inf, delta: float = 0.0,
                 composition: Composition = "pld", path: str | Path | None = None) -> None:
        if not (isinstance(cap, (int, float)) and cap > 0):
            raise ConfigError(f"invalid privacy parameter 'budget': got {cap!r}, expected a "
                              f"number > 0 (math.inf: no cap)")
        if not (isinstance(delta, (int, float)) and 0 <= delta < 1):
            raise ConfigError(f"invalid privacy parameter 'budget_delta': got {delta!r}, "
                              f"expected a number in [0, 1)")
        self.cap = float(cap)
        self.delta = float(delta)
        self.composition: Composition = composition
        self.path = None if path is None else Path(path)
        self.ledger = PrivacyLedger()
        self.releases: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._load()

    def _load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        try:
            state = json.loads(self.path.read_text())
            if state.get("format") != _STATE_FORMAT:
                raise ValueError(f"'format' is not {_STATE_FORMAT!r}")
            self.ledger = PrivacyLedger.from_dict(state["ledger"])
            self.releases = OrderedDict(state.get("releases", {}))
        except (ValueError, KeyError, TypeError, CheckpointError) as exc:
            raise CheckpointError(f"{self.path}: unreadable device state ({exc}); it holds "
                                  f"this device's privacy ledger: restore it, or delete it "
                                  f"only if you accept losing the record of past releases"
                                  ) from None

    def save(self) -> None:
        """Write the ledger and release cache atomically (no-op without ``path``)."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        state = {"format": _STATE_FORMAT, "ledger": self.ledger.to_dict(),
                 "releases": dict(self.releases)}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.path)

    def events(self) -> Events:
        """The device's distinct events and their counts."""
        return self.ledger.events(DEVICE_USER)

    def spent(self, *, delta: float | None = None) -> float:
        """Total ε of every recorded release at target δ (default: the budget's δ)."""
        return self.ledger.user_epsilon(DEVICE_USER, delta=self.delta if delta is None
                                        else delta, composition=self.composition)

    def spend(self, events: Events) -> float:
        """Record ``events`` if the new total ε stays ≤ the cap, else raise (recording nothing).

        Returns
        -------
        The new total ε (``nan`` when the cap is infinite: nothing is composed).

        Raises
        ------
        PrivacyBudgetExceeded
            The releases would exceed the cap; nothing is recorded.
        """
        self._load()  # another device object of this user may have spent meanwhile
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
                    f"composition), above its budget={self.cap:g}; nothing was sent. Re-sending "
                    f"a cached release (unchanged history) is still free")
        for event, count in events:
            self.ledger.record(DEVICE_USER, event, count)
        self.save()
        return total

    def cached(self, key: str) -> dict[str, Any] | None:
        """The cached release under ``key`` (:func:`release_key`), or ``None``."""
        return self.releases.get(key)

    def cache(self, key: str, entry: dict[str, Any]) -> None:
        """Keep ``entry`` under ``key`` (the 32 most recent releases are kept) and save."""
        self.releases[key] = entry
        self.releases.move_to_end(key)
        while len(self.releases) > _RELEASE_CACHE_SIZE:
            self.releases.popitem(last=False)
        self.save()


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
    for n in history:
        h.update(json.dumps([n.news_id, n.category, n.subcategory, n.title, n.abstract]).encode())
    return h.hexdigest()


__all__ = ["DEVICE_USER", "DeviceBudget", "Events", "STATE_FILE", "release_key"]
