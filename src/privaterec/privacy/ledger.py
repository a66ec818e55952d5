"""The per-user privacy ledger and the composition of privacy events (docs/privacy.md#the-ledger).

Every release of one user is described by a :class:`~privaterec.privacy.events.PrivacyEvent`
(its own module, :mod:`privaterec.privacy.events`, re-exported here; a release's calibration,
:mod:`privaterec.privacy.calibrate`, states it). The :class:`PrivacyLedger` stores, per
user, how many times each distinct event happened (a multiset, so 10^5 users x 10^3 rounds
cost a few integers per user, not 10^8 objects), and composes them at a target δ with

* ``"basic"``: sum of the events' ε and δ (Dwork & Roth Thm 3.16) — an upper bound;
* ``"pld"``: privacy loss distributions (Meiser & Mohammadi 2018; Koskela et al. 2020;
  ``dp_accounting.pld``), tight up to a pessimistic 1e-4 discretisation (multisets of plain
  Gaussian releases are composed exactly in closed form instead);
* ``"rdp"``: Rényi DP (Mironov 2017) via ``dp_accounting.rdp.RdpAccountant``.

What an event means to the accountants (Laplace and Gaussian pairs, randomized response,
generic (ε, δ) pairs) is stated once, in :mod:`privaterec.privacy.events`
(:meth:`PrivacyEvent.to_dp_event`).

Users whose event multisets coincide are composed once (results are cached), so ε for
10^4 users costs one composition per distinct multiset.

Very large per-release ε (e.g. a whole FedNewsRec update, ε = 2δD/λ ≈ 10^5): a release with
ε > :data:`PLD_MAX_EPSILON` is composed by basic composition under ``"pld"`` and ``"rdp"``
too (its (ε, δ) is added to the PLD/RDP ε of the other releases, which are composed at the
remaining δ). There PLD/RDP are no tighter than Σε (k·ε − O(1)) and ``dp_accounting``
overflows or returns ∞; :meth:`PrivacyLedger.report` lists such releases under ``notes``.
The PLD grid is also coarsened to ``1e-4·max ε`` when that exceeds the configured interval,
so its size (and time) does not grow with ε; the result stays a pessimistic upper bound and
is never above basic composition (the smaller of the two valid bounds is returned).
"""

from __future__ import annotations

import functools
import math
import numbers
import statistics
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from dp_accounting import dp_event, get_epsilon_gaussian
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from privaterec.errors import CheckpointError, ConfigError, PrivacyBudgetExceeded
# The event and its vocabulary live in privacy/events.py; re-exported here for callers that
# import them with the ledger.
from privaterec.privacy.events import (ADJACENCIES, ADJACENCY_TEXT, DATA_PARTS, PHASES,
                                       Adjacency, DataPart, EpsilonDeltaDpEvent, Phase,
                                       PrivacyEvent)
from privaterec.privacy.formulas import COMPOSITIONS, Composition
from privaterec.privacy.noise import MECHANISMS
from privaterec.validators import check_in

UserId = str | int

_FORMAT = "privaterec.privacy_ledger"
_VERSION = 1
_REL_TOL = 1e-9

PLD_MAX_EPSILON = 50.0
"""Releases with a larger ε are composed by basic composition under every composition."""
_PLD_RELATIVE_INTERVAL = 1e-4


def adjacency_view(events: EventCounts, adjacency: Adjacency) -> list[list[tuple[PrivacyEvent, int]]]:
    """The groups of events whose composition bounds a total under ``adjacency``.

    ``"user"``: one group, every event at its user-level guarantee (everything composes).
    ``"click"``: one group per part of the data a single click can lie in — the history, or
    one impression's labels; a click changes one of them, so the total is the largest
    group's composition. Events that read ``"all"`` belong to every group.
    """
    if adjacency == "user":
        return [[(e.at_adjacency("user"), c) for e, c in events]]
    if adjacency != "click":
        raise ConfigError(f"invalid adjacency {adjacency!r}; expected one of {ADJACENCIES}")
    parts = sorted({e.data for e, _ in events if e.data != "all"})
    if not parts:
        return [list(events)]
    return [[(e, c) for e, c in events if e.data in (part, "all")] for part in parts]


# ---------------------------------------------------------------------------------------------
# Composition of a multiset of events
# ---------------------------------------------------------------------------------------------

EventCounts = Sequence[tuple[PrivacyEvent, int]]


def basic_composition(events: EventCounts) -> tuple[float, float]:
    """(Σ count·ε, Σ count·δ) — basic composition (Dwork & Roth Thm 3.16)."""
    eps = math.fsum(e.epsilon * c for e, c in events if c)
    dlt = math.fsum(e.delta * c for e, c in events if c)
    if any(math.isinf(e.epsilon) for e, c in events if c):
        eps = math.inf
    return eps, min(dlt, 1.0)


@functools.lru_cache(maxsize=256)
def _approximate_dp_pld(epsilon: float, delta: float,
                        interval: float) -> pld_lib.PrivacyLossDistribution:
    """The PLD of an (ε, δ) release (cached, as above)."""
    params = pld_common.DifferentialPrivacyParameters(epsilon, delta)
    return pld_lib.from_privacy_parameters(params, value_discretization_interval=interval)


@functools.lru_cache(maxsize=1024)
def _pld_of(event: PrivacyEvent, count: int,
            interval: float) -> pld_lib.PrivacyLossDistribution | None:
    """Self-composed PLD of ``count`` copies of ``event``; None for a no-op (cached: a
    report composes the same events and counts for each adjacency and phase)."""
    dp = event.to_dp_event()
    if isinstance(dp, dp_event.NoOpDpEvent):
        return None
    if isinstance(dp, (dp_event.RandomizedResponseDpEvent, EpsilonDeltaDpEvent)):
        return _approximate_dp_pld(event.epsilon, event.delta, interval).self_compose(count)
    assert event.noise_multiplier is not None  # an unpadded noise event (to_dp_event)
    return MECHANISMS[event.mechanism].pld(event.noise_multiplier, count=count,
                                           interval=interval, sampling_rate=event.sampling_rate)


def _rdp_curve(events: EventCounts, orders: np.ndarray) -> np.ndarray:
    additive = rdp_lib.RdpAccountant(orders, NeighboringRelation.ADD_OR_REMOVE_ONE)
    pure = rdp_lib.RdpAccountant(orders, NeighboringRelation.REPLACE_ONE)
    for event, count in events:
        dp = event.to_dp_event()
        if isinstance(dp, EpsilonDeltaDpEvent):
            raise ConfigError(
                f"composition='rdp' cannot account the approximate-DP event {event.mechanism!r} "
                f"(epsilon={event.epsilon}, delta={event.delta}, padding_p={event.padding_p}); "
                f"use composition='pld' or 'basic'")
        if isinstance(dp, dp_event.PoissonSampledDpEvent):
            raise ConfigError(
                "composition='rdp' has no bound for a Poisson-sampled Gaussian (central DP) "
                "under replacement, the adjacency of the ledger's totals; use "
                "composition='pld' or 'basic'")
        target = pure if isinstance(dp, dp_event.RandomizedResponseDpEvent) else additive
        target.compose(dp, count)
    return additive.rdp + pure.rdp


def compose_events(events: EventCounts, *, delta: float, composition: Composition = "pld",
                   value_discretization_interval: float = 1e-4,
                   rdp_orders: Sequence[float] | None = None) -> float:
    """ε at target ``delta`` of the composition of ``count`` copies of each event.

    Parameters
    ----------
    events:
        Pairs (event, count ≥ 0).
    delta:
        Target δ in [0, 1). For ``"basic"`` the result is Σε when Σδ ≤ ``delta`` and ∞
        otherwise (basic composition cannot certify a smaller δ).
    composition:
        ``"basic"``, ``"pld"`` or ``"rdp"`` (module docstring).
    value_discretization_interval:
        PLD discretisation (pessimistic: the result is an upper bound).
    rdp_orders:
        RDP orders (default: ``dp_accounting``'s).

    Returns
    -------
    float
        ε ≥ 0 (``math.inf`` when some release is not private).
    """
    if composition not in COMPOSITIONS:
        raise ConfigError(f"invalid composition {composition!r}; expected one of {COMPOSITIONS}")
    check_in(delta, "delta", 0, 1, "[0, 1)")
    events = [(e, int(c)) for e, c in events if c]
    if not events:
        return 0.0
    if any(not e.is_private for e, _ in events):
        return math.inf
    if composition == "basic" or delta == 0:
        # At δ = 0 only pure events compose to a finite ε, and then exactly to Σε: the
        # worst-case privacy loss of each (Laplace, randomized response) is attained with
        # positive probability, so the sum is attained too. PLD/RDP would return ∞ at δ = 0
        # (truncated tails, Rényi conversion).
        if delta == 0 and any(e.delta > 0 or not getattr(MECHANISMS.get(e.mechanism), "pure", True)
                              for e, _ in events):
            return math.inf
        eps, total_delta = basic_composition(events)
        return eps if total_delta <= delta * (1 + _REL_TOL) else math.inf
    large = [(e, c) for e, c in events if e.epsilon > PLD_MAX_EPSILON]
    if large:
        # Basic composition of the large releases with the PLD/RDP composition of the rest,
        # which gets the δ the large ones leave (module docstring).
        large_eps, large_delta = basic_composition(large)
        if large_delta > delta * (1 + _REL_TOL):
            return math.inf
        rest = [(e, c) for e, c in events if e.epsilon <= PLD_MAX_EPSILON]
        return large_eps + compose_events(
            rest, delta=max(0.0, delta - large_delta), composition=composition,
            value_discretization_interval=value_discretization_interval, rdp_orders=rdp_orders)
    if composition == "pld":
        dps = [e.to_dp_event() for e, _ in events]
        if all(isinstance(d, dp_event.GaussianDpEvent) for d in dps):
            # Gaussian releases compose exactly into one Gaussian with multiplier
            # (Σ count/s²)^{-1/2}; its ε is exact (Balle & Wang 2018), no discretisation.
            mu2 = math.fsum(c / d.noise_multiplier**2 for (_, c), d in zip(events, dps))
            return float(get_epsilon_gaussian(1.0 / math.sqrt(mu2), delta))
        interval = max(value_discretization_interval,
                       _PLD_RELATIVE_INTERVAL * max(e.epsilon for e, _ in events))
        total = None
        for event, count in events:
            pld = _pld_of(event, count, interval)
            if pld is not None:
                total = pld if total is None else total.compose(pld)
        eps = 0.0 if total is None else float(total.get_epsilon_for_delta(delta))
        basic_eps, basic_delta = basic_composition(events)
        return basic_eps if basic_delta <= delta * (1 + _REL_TOL) and basic_eps < eps else eps
    orders = np.asarray(rdp_orders if rdp_orders is not None else rdp_lib.DEFAULT_RDP_ORDERS,
                        dtype=float)
    return float(rdp_lib.compute_epsilon(orders, _rdp_curve(events, orders), delta)[0])


# ---------------------------------------------------------------------------------------------
# The ledger
# ---------------------------------------------------------------------------------------------

Signature = tuple[tuple[int, int], ...]


class PrivacyLedger:
    """Per-user, per-phase record of privacy events, composed on demand
    (docs/privacy.md#the-ledger).

    Storage: a table of distinct events plus, per user, ``{event id: count}``.

    Parameters
    ----------
    value_discretization_interval:
        PLD discretisation used by ``composition="pld"``.
    rdp_orders:
        Orders used by ``composition="rdp"`` (default: ``dp_accounting``'s).
    """

    def __init__(self, *, value_discretization_interval: float = 1e-4,
                 rdp_orders: Sequence[float] | None = None) -> None:
        check_in(value_discretization_interval, "value_discretization_interval", 0, 1,
                 "a number in (0, 1)", open_low=True, kind="ledger setting")
        self.value_discretization_interval: float = float(value_discretization_interval)
        self.rdp_orders: list[float] | None = (None if rdp_orders is None
                                               else [float(o) for o in rdp_orders])
        self._events: list[PrivacyEvent] = []
        self._event_ids: dict[PrivacyEvent, int] = {}
        self._users: dict[UserId, dict[int, int]] = {}
        self._cache: dict[tuple[Signature, float, Composition, Adjacency], float] = {}

    # -- recording ------------------------------------------------------------------------
    def _event_id(self, event: PrivacyEvent) -> int:
        if not isinstance(event, PrivacyEvent):
            raise TypeError(f"expected a PrivacyEvent, got {type(event).__name__}")
        eid = self._event_ids.get(event)
        if eid is None:
            eid = len(self._events)
            self._events.append(event)
            self._event_ids[event] = eid
        return eid

    @staticmethod
    def _check_user(user_id: UserId) -> None:
        if isinstance(user_id, bool) or not isinstance(user_id, (str, int)):
            raise TypeError(f"user_id must be a str or int, got {user_id!r}")

    def record(self, user_id: UserId, event: PrivacyEvent, count: int = 1) -> None:
        """Record ``count`` releases of ``event`` by ``user_id`` (phase is ``event.phase``)."""
        self.record_many((user_id,), event, count)

    def record_many(self, user_ids: Iterable[UserId], event: PrivacyEvent, count: int = 1) -> None:
        """Record the same event ``count`` times for each user (e.g. one federated round)."""
        if not (isinstance(count, numbers.Integral) and count >= 0):
            raise ConfigError(f"invalid 'count': got {count!r}, expected an integer >= 0")
        count = int(count)
        if count == 0:
            return
        user_ids = list(user_ids)
        for user_id in user_ids:  # validate all first: a failed call records nothing
            self._check_user(user_id)
        eid = self._event_id(event)
        users = self._users
        for user_id in user_ids:
            per_user = users.get(user_id)
            if per_user is None:
                users[user_id] = {eid: count}
            else:
                per_user[eid] = per_user.get(eid, 0) + count

    # -- inspection -----------------------------------------------------------------------
    @property
    def users(self) -> list[UserId]:
        """Users with at least one recorded event, in first-record order."""
        return list(self._users)

    def __len__(self) -> int:
        return len(self._users)

    def __contains__(self, user_id: object) -> bool:
        return user_id in self._users

    def events(self, user_id: UserId, *,
               phase: Phase | None = None) -> list[tuple[PrivacyEvent, int]]:
        """The user's distinct events and their counts (empty for an unknown user)."""
        return [(self._events[eid], c) for eid, c in self._signature(user_id, phase)]

    def _signature(self, user_id: UserId, phase: Phase | None) -> Signature:
        if phase is not None and phase not in PHASES:
            raise ConfigError(f"invalid phase {phase!r}; expected None, 'train' or 'serve'")
        per_user = self._users.get(user_id, {})
        return tuple(sorted((eid, c) for eid, c in per_user.items()
                            if phase is None or self._events[eid].phase == phase))

    # -- composition ----------------------------------------------------------------------
    def _compose_signature(self, signature: Signature, delta: float, composition: Composition,
                           adjacency: Adjacency = "click") -> float:
        key = (signature, float(delta), composition, adjacency)
        cached = self._cache.get(key)
        if cached is None:
            cached = max((compose_events(
                group, delta=delta, composition=composition,
                value_discretization_interval=self.value_discretization_interval,
                rdp_orders=self.rdp_orders)
                for group in adjacency_view([(self._events[eid], c) for eid, c in signature],
                                            adjacency)), default=0.0)
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[key] = cached
        return cached

    def _groups(self, user_ids: Iterable[UserId],
                phase: Phase | None) -> dict[Signature, list[UserId]]:
        groups: dict[Signature, list[UserId]] = {}
        for user_id in user_ids:
            groups.setdefault(self._signature(user_id, phase), []).append(user_id)
        return groups

    def user_epsilon(self, user_id: UserId, *, delta: float, phase: Phase | None = None,
                     composition: Composition = "pld", adjacency: Adjacency = "click") -> float:
        """ε of everything ``user_id`` released (in ``phase``, or all phases) at target δ.

        ``adjacency``: ``"click"`` (one click of the user changes; the default) or ``"user"``
        (the user's whole data changes), see :func:`adjacency_view`.

        ``"basic"`` returns Σε when Σδ ≤ ``delta`` and ∞ otherwise; see
        :meth:`user_budget` for the (Σε, Σδ) pair. Unknown users have ε = 0. See
        :func:`compose_events` for the compositions.
        """
        return self._compose_signature(self._signature(user_id, phase), delta, composition,
                                       adjacency)

    def user_budget(self, user_id: UserId, *, phase: Phase | None = None) -> tuple[float, float]:
        """Basic-composition pair (Σε, Σδ) of the user's releases."""
        return basic_composition(self.events(user_id, phase=phase))

    def epsilons(self, *, delta: float, phase: Phase | None = None,
                 composition: Composition = "pld",
                 user_ids: Iterable[UserId] | None = None,
                 adjacency: Adjacency = "click") -> dict[UserId, float]:
        """ε per user, composing each distinct event multiset once.

        Parameters
        ----------
        user_ids:
            Users to evaluate (default: every user with an event in ``phase``).
        """
        skip_empty = user_ids is None
        groups = self._groups(self._users if user_ids is None else user_ids, phase)
        out: dict[UserId, float] = {}
        for signature, members in groups.items():
            if skip_empty and not signature:
                continue
            eps = self._compose_signature(signature, delta, composition, adjacency)
            for user_id in members:
                out[user_id] = eps
        return out

    def spend(self, user_id: UserId, event: PrivacyEvent, *, epsilon_cap: float, delta: float,
              composition: Composition = "pld", count: int = 1,
              adjacency: Adjacency = "click") -> float:
        """Record the release only if the user's total ε (all phases) stays ≤ ``epsilon_cap``
        (under ``adjacency``).

        Returns the new total ε; raises :class:`PrivacyBudgetExceeded` (recording nothing)
        otherwise. Re-sending a cached release is post-processing: do not call this for it.
        """
        self._check_user(user_id)
        if not (isinstance(count, numbers.Integral) and count >= 1):
            raise ConfigError(f"invalid 'count': got {count!r}, expected an integer >= 1")
        eid = self._event_id(event)
        merged = dict(self._users.get(user_id, {}))
        merged[eid] = merged.get(eid, 0) + int(count)
        eps = self._compose_signature(tuple(sorted(merged.items())), delta, composition,
                                      adjacency)
        if eps > epsilon_cap * (1 + 1e-12):
            raise PrivacyBudgetExceeded(
                f"user {user_id!r}: this {event.phase} release ({event.mechanism}, "
                f"epsilon={event.epsilon:g}) would raise the total epsilon to {eps:.4g} at "
                f"delta={delta:g} ({composition} composition), above the cap "
                f"epsilon_cap={epsilon_cap:g}; the release was refused")
        self.record(user_id, event, count)
        return eps

    # -- reporting ------------------------------------------------------------------------
    def report(self, *, delta: float, composition: Composition = "pld") -> dict[str, Any]:
        """Summary at target δ: per-phase and total ε over users, mechanisms, warnings.

        Returns
        -------
        dict
            ``composition``, ``delta``, ``num_users``; ``phases[train|serve|total]`` with
            ``num_users``, ``epsilon_max``, ``epsilon_median``, ``epsilon_mean`` (``composition``),
            ``basic_epsilon_max`` and ``basic_delta_max`` (basic composition, an upper bound)
            and ``releases_max``; ``mechanisms``: each distinct event with its number of users
            and releases; ``warnings``: guarantees that do not hold or are partial;
            ``notes``: releases composed by basic composition because their ε exceeds
            :data:`PLD_MAX_EPSILON` (module docstring).
        """
        phases = self._phase_totals(delta, composition, "click")
        phases_user = self._phase_totals(delta, composition, "user")
        users_per_event = [0] * len(self._events)
        releases_per_event = [0] * len(self._events)
        for per_user in self._users.values():
            for eid, c in per_user.items():
                users_per_event[eid] += 1
                releases_per_event[eid] += c
        mechanisms = [{**e.to_dict(), "users": users_per_event[i],
                       "releases": releases_per_event[i]} for i, e in enumerate(self._events)]
        warnings = []
        for i, e in enumerate(self._events):
            if not users_per_event[i]:
                continue
            releases = f"{releases_per_event[i]} {e.phase} '{e.mechanism}' releases"
            note = f": {e.note}" if e.note else ""
            if not e.valid:
                warnings.append(f"the stated guarantee of {releases} does NOT hold (reported "
                                f"epsilon is not a valid DP bound){note}")
            if not e.is_private:
                warnings.append(f"{releases} are not private (epsilon = inf){note}")
            elif not e.at_adjacency("user").is_private:
                warnings.append(f"{releases} are private for one click but NOT for a whole "
                                f"user (user-level epsilon = inf){note}")
        notes = [f"{releases_per_event[i]} {e.phase} '{e.mechanism}' releases with epsilon = "
                 f"{e.epsilon:.6g} > {PLD_MAX_EPSILON:g} per release are composed by basic "
                 f"composition ({composition} is no tighter at such epsilon)"
                 for i, e in enumerate(self._events)
                 if composition != "basic" and users_per_event[i] and e.is_private
                 and e.epsilon > PLD_MAX_EPSILON]
        return {"composition": composition, "delta": delta, "num_users": len(self._users),
                "adjacency": {"phases": "click", "phases_user": "user",
                              "click": ADJACENCY_TEXT["click"], "user": ADJACENCY_TEXT["user"]},
                "phases": phases, "phases_user": phases_user, "mechanisms": mechanisms,
                "warnings": warnings, "notes": notes}

    def _phase_totals(self, delta: float, composition: Composition,
                      adjacency: Adjacency) -> dict[str, Any]:
        phases: dict[str, Any] = {}
        named: tuple[tuple[str, Phase | None], ...] = (("train", "train"), ("serve", "serve"),
                                                       ("total", None))
        for name, phase in named:
            values: list[float] = []
            basic_eps: list[float] = []
            basic_delta: list[float] = []
            releases: list[int] = []
            for signature, members in self._groups(self._users, phase).items():
                if not signature:
                    continue
                eps = self._compose_signature(signature, delta, composition, adjacency)
                events = [(self._events[i], c) for i, c in signature]
                pairs = [basic_composition(g) for g in adjacency_view(events, adjacency)]
                values += [eps] * len(members)
                basic_eps.append(max(p[0] for p in pairs))
                basic_delta.append(max(p[1] for p in pairs))
                releases.append(sum(c for _, c in signature))
            phases[name] = {
                "adjacency": adjacency,
                "num_users": len(values),
                "epsilon_max": max(values, default=0.0),
                "epsilon_median": float(statistics.median(values)) if values else 0.0,
                "epsilon_mean": float(np.mean(values)) if values else 0.0,
                "basic_epsilon_max": max(basic_eps, default=0.0),
                "basic_delta_max": max(basic_delta, default=0.0),
                "releases_max": max(releases, default=0),
            }
        return phases

    # -- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (for checkpoints); :meth:`from_dict` restores it exactly."""
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "value_discretization_interval": self.value_discretization_interval,
            "rdp_orders": self.rdp_orders,
            "events": [e.to_dict() for e in self._events],
            "records": [[u, [[eid, c] for eid, c in per_user.items()]]
                        for u, per_user in self._users.items()],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyLedger:
        """Restore a ledger written by :meth:`to_dict`.

        Raises
        ------
        CheckpointError
            If ``data`` is not a privacy ledger of a supported version or is inconsistent.
        """
        if not isinstance(data, Mapping) or data.get("format") != _FORMAT:
            raise CheckpointError(f"not a privacy ledger: expected 'format': {_FORMAT!r}")
        if data.get("version") != _VERSION:
            raise CheckpointError(f"unsupported privacy ledger version {data.get('version')!r}; "
                                  f"this privaterec reads version {_VERSION}")
        try:
            ledger = cls(value_discretization_interval=data["value_discretization_interval"],
                         rdp_orders=data["rdp_orders"])
            for raw in data["events"]:
                ledger._event_id(PrivacyEvent.from_dict(raw))
            if len(ledger._events) != len(data["events"]):
                raise CheckpointError("privacy ledger lists the same event twice")
            for user_id, rows in data["records"]:
                ledger._check_user(user_id)
                if user_id in ledger._users:
                    raise CheckpointError(f"privacy ledger lists user {user_id!r} twice")
                per_user: dict[int, int] = {}
                for eid, count in rows:
                    if not (0 <= eid < len(ledger._events)) or count < 1 or eid in per_user:
                        raise CheckpointError(f"privacy ledger: bad record [{eid}, {count}] "
                                              f"for user {user_id!r}")
                    per_user[int(eid)] = int(count)
                ledger._users[user_id] = per_user
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"malformed privacy ledger: {exc}") from exc
        return ledger

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PrivacyLedger):
            return NotImplemented
        return (self.value_discretization_interval == other.value_discretization_interval
                and self.rdp_orders == other.rdp_orders
                and self._as_multisets() == other._as_multisets())

    def _as_multisets(self) -> dict[UserId, dict[PrivacyEvent, int]]:
        return {u: {self._events[eid]: c for eid, c in per_user.items()}
                for u, per_user in self._users.items()}

    __hash__ = None  # type: ignore[assignment]  # unhashable: mutable, __eq__ by content
