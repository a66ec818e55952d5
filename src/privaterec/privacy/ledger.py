"""Privacy events and the per-user privacy ledger (DESIGN §5).

Every mechanism call returns a :class:`PrivacyEvent` describing one release of one user.
The :class:`PrivacyLedger` stores, per user, how many times each distinct event happened
(a multiset, so 10^5 users x 10^3 rounds cost a few integers per user, not 10^8 objects),
and composes them at a target δ with

* ``"basic"``: sum of the events' ε and δ (Dwork & Roth Thm 3.16) — an upper bound;
* ``"pld"``: privacy loss distributions (Meiser & Mohammadi 2018; Koskela et al. 2020;
  ``dp_accounting.pld``), tight up to a pessimistic 1e-4 discretisation (multisets of plain
  Gaussian releases are composed exactly in closed form instead);
* ``"rdp"``: Rényi DP (Mironov 2017) via ``dp_accounting.rdp.RdpAccountant``.

What an event means to the accountants (:meth:`PrivacyEvent.to_dp_event`):

* Laplace / Gaussian without padding: the exact additive-noise pair, with noise multiplier
  ``noise_scale / sensitivity`` (``LaplaceDpEvent`` / ``GaussianDpEvent``). The sensitivity
  is the caller's, for the caller's adjacency, so the pair is (noise, Δ + noise).
* any other pure ε event (exponential mechanism, DPL, randomized response, padded Laplace):
  binary randomized response with the same ε, which dominates every ε-DP mechanism
  (Kairouz, Oh & Viswanath 2015) — ``RandomizedResponseDpEvent`` under ``REPLACE_ONE``.
* any other (ε, δ) event (e.g. a padded Gaussian, DESIGN §4 erratum 2): the generic
  (ε, δ) dominating pair (:class:`EpsilonDeltaDpEvent`; PLD ``from_privacy_parameters``),
  which RDP cannot represent.

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

import math
import numbers
import statistics
from dataclasses import asdict, dataclass, fields
from typing import Any, Iterable, Literal, Mapping, Sequence

import attr
import numpy as np
from dp_accounting import dp_event, get_epsilon_gaussian
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from privaterec.errors import CheckpointError, ConfigError, PrivacyBudgetExceeded
from privaterec.privacy.calibration import amplified_budget, padding_amplification

PHASES = ("train", "serve")
COMPOSITIONS = ("basic", "pld", "rdp")
NOISE_MECHANISMS = ("laplace", "gaussian")

Phase = Literal["train", "serve"]
DataPart = Literal["history", "labels", "all"]
Adjacency = Literal["click", "user"]
DATA_PARTS = ("history", "labels", "all")
ADJACENCIES = ("click", "user")
ADJACENCY_TEXT = {
    "click": "one click: one history click substituted at its position, or the clicks of "
             "one impression changed (the news displayed fixed)",
    "user": "one user: the user's whole data (history and impressions) replaced",
}
Composition = Literal["basic", "pld", "rdp"]
UserId = str | int

_FORMAT = "privaterec.privacy_ledger"
_VERSION = 1
_REL_TOL = 1e-9

PLD_MAX_EPSILON = 50.0
"""Releases with a larger ε are composed by basic composition under every composition."""
_PLD_RELATIVE_INTERVAL = 1e-4


@attr.s(frozen=True, slots=True, auto_attribs=True)
class EpsilonDeltaDpEvent(dp_event.DpEvent):
    """A mechanism known only to be (ε, δ)-DP (``dp_accounting`` has no such event).

    Composed by the ledger through its worst-case privacy loss distribution
    (``pld.privacy_loss_distribution.from_privacy_parameters``); ``dp_accounting``'s own
    accountants report it as unsupported.
    """

    epsilon: float
    delta: float


def _fail(name: str, value: object, expected: str) -> None:
    raise ConfigError(f"invalid privacy event field '{name}': got {value!r}, expected {expected}")


@dataclass(frozen=True, kw_only=True)
class PrivacyEvent:
    """One release of one user's data, as spent by a mechanism call.

    Parameters
    ----------
    mechanism:
        ``"laplace"``, ``"gaussian"``, ``"exponential"``, ``"randomized_response"``,
        ``"epsilon_delta"`` or another descriptive name (non-noise mechanisms are accounted
        through their (ε, δ)).
    epsilon:
        ε ≥ 0 this single release satisfies w.r.t. the protected adjacency (``math.inf``: not
        private). For Laplace it must equal ``sensitivity / noise_scale`` (after padding
        amplification when ``padding_p > 0``).
    delta:
        δ in [0, 1) of this release (0 for pure mechanisms).
    noise_scale:
        Laplace scale b or Gaussian σ (required for ``"laplace"`` / ``"gaussian"``).
    sensitivity:
        L1 (Laplace) or L2 (Gaussian) sensitivity the noise was calibrated to.
    dimension:
        Number of released coordinates (documentation; ε already covers the whole release).
    phase:
        ``"train"`` or ``"serve"``.
    note:
        Free text for reports (e.g. which parameters a paper-mode gradient leaves uncovered).
    padding_p:
        Random behaviour-padding probability p (PrivateRec Alg. 2); when > 0 the noise ran at
        the base budget and ``epsilon``/``delta`` are the amplified guarantee.
    coordinate_epsilon:
        Optional per-coordinate ε (FedNewsRec's 2δ/λ, DESIGN §4 erratum 6), reported next to
        the vector ε, never instead of it.
    valid:
        False when the stated guarantee does not hold (e.g. ``dpa_sensitivity(mode="paper")``);
        every report then carries a warning.
    data:
        Which part of the user's data the release reads: ``"history"`` (the clicked news
        before the logged period), ``"labels"`` (which candidates of the impressions were
        clicked, given the displayed news), or ``"all"`` (anything of the user's).
    epsilon_user, delta_user:
        The (ε, δ) of this release for **user-level** adjacency (the user's whole data
        replaced); ``None``: the same as ``epsilon``/``delta`` (the mechanism's sensitivity
        already covers any change of the data it reads, e.g. a clipped update).
    sampling_rate:
        Central DP (DP-FedAvg): the Poisson sampling rate q of a ``"gaussian"`` release on
        the sum of the sampled users' clipped updates; PLD composes it as the
        Poisson-subsampled Gaussian under replacement of one user's data (RDP cannot), and
        ``epsilon``/``delta`` are one round's guarantee at the run's target δ (used by basic
        composition only).

    Adjacency. ``epsilon``/``delta`` are the guarantee for **one click**: one history click
    substituted at its position, or the clicks of one impression changed (the news displayed
    are fixed). Padding amplification (``padding_p``) holds for that substitution only; a
    whole history replaced, or a click added to a short history, pays the base ε′
    (``epsilon_user``). See :meth:`PrivacyLedger.user_epsilon` for how totals compose under
    each adjacency (docs/privacy.md).
    """

    mechanism: str
    epsilon: float
    delta: float = 0.0
    noise_scale: float | None = None
    sensitivity: float | None = None
    dimension: int = 1
    phase: Phase
    note: str = ""
    padding_p: float = 0.0
    coordinate_epsilon: float | None = None
    valid: bool = True
    data: DataPart = "all"
    epsilon_user: float | None = None
    delta_user: float | None = None
    sampling_rate: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.mechanism, str) and self.mechanism):
            _fail("mechanism", self.mechanism, "a non-empty string")
        if not (isinstance(self.epsilon, numbers.Real) and self.epsilon >= 0):
            _fail("epsilon", self.epsilon, "a number >= 0 (math.inf: not private)")
        if not (isinstance(self.delta, numbers.Real) and 0 <= self.delta < 1):
            _fail("delta", self.delta, "a number in [0, 1)")
        if self.phase not in PHASES:
            _fail("phase", self.phase, "'train' or 'serve'")
        if not (isinstance(self.dimension, numbers.Integral) and self.dimension >= 1):
            _fail("dimension", self.dimension, "an integer >= 1")
        if not (isinstance(self.padding_p, numbers.Real) and 0 <= self.padding_p < 1):
            _fail("padding_p", self.padding_p, "a probability in [0, 1)")
        if not isinstance(self.note, str):
            _fail("note", self.note, "a string")
        if self.data not in DATA_PARTS:
            _fail("data", self.data, f"one of {DATA_PARTS}")
        if self.epsilon_user is not None and not (isinstance(self.epsilon_user, numbers.Real)
                                                  and self.epsilon_user >= self.epsilon):
            _fail("epsilon_user", self.epsilon_user, "None or a number >= epsilon (a user-level "
                  "guarantee cannot be stronger than the one-click guarantee)")
        if self.delta_user is not None and not (isinstance(self.delta_user, numbers.Real)
                                                and self.delta <= self.delta_user < 1):
            _fail("delta_user", self.delta_user, "None or a number in [delta, 1)")
        for name in ("noise_scale", "sensitivity", "coordinate_epsilon"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, numbers.Real) and value >= 0):
                _fail(name, value, "None or a number >= 0")
        # Normalise numeric types so equal events hash equally (np.float64(1) == 1.0 anyway).
        for name in ("epsilon", "delta", "padding_p"):
            object.__setattr__(self, name, float(getattr(self, name)))
        for name in ("noise_scale", "sensitivity", "coordinate_epsilon", "epsilon_user",
                     "delta_user"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, float(getattr(self, name)))
        object.__setattr__(self, "dimension", int(self.dimension))
        object.__setattr__(self, "valid", bool(self.valid))
        if self.sampling_rate is not None:
            if not (isinstance(self.sampling_rate, numbers.Real) and 0 < self.sampling_rate <= 1
                    and self.mechanism == "gaussian" and self.padding_p == 0):
                _fail("sampling_rate", self.sampling_rate, "None, or q in (0, 1] on an "
                      "unpadded 'gaussian' event")
            object.__setattr__(self, "sampling_rate", float(self.sampling_rate))
        if self.mechanism in NOISE_MECHANISMS:
            self._check_noise_fields()
        if self.padding_p > 0 and self.epsilon_user is None and math.isfinite(self.epsilon):
            # Amplification holds for one substituted click; any other change of the history
            # pays the base budget the noise was calibrated to.
            base_eps, base_delta = amplified_budget(epsilon=self.epsilon, delta=self.delta,
                                                    padding_p=self.padding_p)
            object.__setattr__(self, "epsilon_user", float(base_eps))
            object.__setattr__(self, "delta_user", float(base_delta))

    def _check_noise_fields(self) -> None:
        if self.noise_scale is None or self.sensitivity is None or self.sensitivity <= 0:
            _fail("noise_scale/sensitivity", (self.noise_scale, self.sensitivity),
                  f"both set (sensitivity > 0) for a {self.mechanism!r} event")
        if self.mechanism == "gaussian" and self.noise_scale > 0 and self.delta <= 0:
            _fail("delta", self.delta, "> 0 for a Gaussian event")
        if self.mechanism == "laplace":
            base = math.inf if self.noise_scale == 0 else self.sensitivity / self.noise_scale
            expected = base
            if self.padding_p > 0 and math.isfinite(base):
                expected = padding_amplification(epsilon_base=base, delta_base=0.0,
                                                  padding_p=self.padding_p)[0]
            if not math.isclose(self.epsilon, expected, rel_tol=_REL_TOL, abs_tol=1e-12):
                _fail("epsilon", self.epsilon,
                      f"{expected!r} = sensitivity/noise_scale (amplified by padding_p="
                      f"{self.padding_p}) for a Laplace event")

    def at_adjacency(self, adjacency: Adjacency) -> "PrivacyEvent":
        """This release seen under ``adjacency`` (``"click"``: itself).

        Under ``"user"`` the event carries its user-level (ε, δ) and no padding amplification
        (the noise was calibrated to the base budget, which is what a whole-history change
        pays), so the accountants compose the base mechanism.
        """
        if adjacency == "click":
            return self
        if adjacency != "user":
            raise ConfigError(f"invalid adjacency {adjacency!r}; expected one of {ADJACENCIES}")
        if self.epsilon_user is None and self.delta_user is None and self.padding_p == 0:
            return self
        eps = self.epsilon if self.epsilon_user is None else self.epsilon_user
        dlt = self.delta if self.delta_user is None else self.delta_user
        return _replace_event(self, epsilon=eps, delta=dlt, padding_p=0.0, epsilon_user=None,
                              delta_user=None)

    @property
    def noise_multiplier(self) -> float | None:
        """``noise_scale / sensitivity`` for noise mechanisms, else None."""
        if self.mechanism not in NOISE_MECHANISMS:
            return None
        assert self.noise_scale is not None and self.sensitivity is not None
        return self.noise_scale / self.sensitivity

    @property
    def is_private(self) -> bool:
        """False when the release has no finite guarantee (ε = ∞ or zero noise)."""
        if math.isinf(self.epsilon):
            return False
        return not (self.mechanism in NOISE_MECHANISMS and self.noise_scale == 0)

    def to_dp_event(self) -> dp_event.DpEvent:
        """The ``dp_accounting`` event that this release is accounted as (module docstring)."""
        if not self.is_private:
            return dp_event.NonPrivateDpEvent()
        if self.epsilon == 0 and self.delta == 0:
            return dp_event.NoOpDpEvent()
        if self.padding_p == 0 and self.mechanism == "laplace":
            return dp_event.LaplaceDpEvent(noise_multiplier=self.noise_multiplier)
        if self.sampling_rate is not None:
            return dp_event.PoissonSampledDpEvent(
                sampling_probability=self.sampling_rate,
                event=dp_event.GaussianDpEvent(noise_multiplier=self.noise_multiplier))
        if self.padding_p == 0 and self.mechanism == "gaussian":
            return dp_event.GaussianDpEvent(noise_multiplier=self.noise_multiplier)
        if self.delta == 0:
            # Binary randomized response keeps its input w.p. e^ε/(1+e^ε):
            # noise_parameter p with 1 - p/2 = e^ε/(1+e^ε), i.e. p = 2/(1+e^ε).
            return dp_event.RandomizedResponseDpEvent(
                noise_parameter=2.0 / (1.0 + math.exp(self.epsilon)), num_buckets=2)
        return EpsilonDeltaDpEvent(epsilon=self.epsilon, delta=self.delta)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict (non-finite floats as strings); inverse of :meth:`from_dict`."""
        return {k: _encode_float(v) if isinstance(v, float) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyEvent:
        """Rebuild an event written by :meth:`to_dict`."""
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise CheckpointError(f"privacy event has unknown fields {sorted(unknown)}; "
                                  f"expected a subset of {sorted(names)}")
        float_fields = ("epsilon", "delta", "noise_scale", "sensitivity", "padding_p",
                        "coordinate_epsilon", "epsilon_user", "delta_user", "sampling_rate")
        values = {k: _decode_float(v) if k in float_fields and v is not None else v
                  for k, v in data.items()}
        return cls(**values)


def _replace_event(event: PrivacyEvent, **changes: Any) -> PrivacyEvent:
    values = {f.name: getattr(event, f.name) for f in fields(PrivacyEvent)}
    values.update(changes)
    return PrivacyEvent(**values)


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


def _encode_float(x: float) -> float | str:
    return x if math.isfinite(x) else repr(x)  # 'inf', '-inf', 'nan'


def _decode_float(x: float | str) -> float:
    return float(x)


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


def _pld_of(event: PrivacyEvent, count: int,
            interval: float) -> pld_lib.PrivacyLossDistribution | None:
    """Self-composed PLD of ``count`` copies of ``event``; None for a no-op."""
    dp = event.to_dp_event()
    if isinstance(dp, dp_event.NoOpDpEvent):
        return None
    if isinstance(dp, dp_event.LaplaceDpEvent):
        return pld_lib.from_laplace_mechanism(
            dp.noise_multiplier, value_discretization_interval=interval).self_compose(count)
    if isinstance(dp, dp_event.PoissonSampledDpEvent):
        assert isinstance(dp.event, dp_event.GaussianDpEvent)
        # Replace-one, the adjacency of every ledger total (a sampled user's clipped update
        # may change by up to twice the clip).
        return pld_lib.from_gaussian_mechanism(
            dp.event.noise_multiplier, sampling_prob=dp.sampling_probability,
            value_discretization_interval=interval,
            neighboring_relation=NeighboringRelation.REPLACE_ONE).self_compose(count)
    if isinstance(dp, dp_event.GaussianDpEvent):
        # k Gaussian releases with multiplier s compose exactly to one with s/√k.
        return pld_lib.from_gaussian_mechanism(
            dp.noise_multiplier / math.sqrt(count), value_discretization_interval=interval)
    if isinstance(dp, (dp_event.RandomizedResponseDpEvent, EpsilonDeltaDpEvent)):
        params = pld_common.DifferentialPrivacyParameters(event.epsilon, event.delta)
        return pld_lib.from_privacy_parameters(
            params, value_discretization_interval=interval).self_compose(count)
    raise AssertionError(f"unexpected dp event {dp!r}")  # pragma: no cover


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
    if not (isinstance(delta, numbers.Real) and 0 <= delta < 1):
        raise ConfigError(f"invalid privacy parameter 'delta': got {delta!r}, expected [0, 1)")
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
        if delta == 0 and any(e.delta > 0 or e.mechanism == "gaussian" for e, _ in events):
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
    """Per-user, per-phase record of privacy events, composed on demand (DESIGN §5).

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
        if not (isinstance(value_discretization_interval, numbers.Real)
                and 0 < value_discretization_interval < 1):
            raise ConfigError("invalid ledger setting 'value_discretization_interval': got "
                              f"{value_discretization_interval!r}, expected a number in (0, 1)")
        self.value_discretization_interval = float(value_discretization_interval)
        self.rdp_orders = None if rdp_orders is None else [float(o) for o in rdp_orders]
        self._events: list[PrivacyEvent] = []
        self._event_ids: dict[PrivacyEvent, int] = {}
        self._users: dict[UserId, dict[int, int]] = {}
        self._cache: dict[tuple[Signature, float, str], float] = {}

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
    def _compose_signature(self, signature: Signature, delta: float, composition: str,
                           adjacency: Adjacency = "click") -> float:
        key = (signature, float(delta), composition, adjacency)
        cached = self._cache.get(key)
        if cached is None:
            cached = max((compose_events(
                group, delta=delta,
                composition=composition,  # type: ignore[arg-type]
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
            if not e.valid and users_per_event[i]:
                warnings.append(f"the stated guarantee of {releases_per_event[i]} {e.phase} "
                                f"'{e.mechanism}' releases does NOT hold (reported epsilon is "
                                f"not a valid DP bound){': ' + e.note if e.note else ''}")
            if not e.is_private and users_per_event[i]:
                warnings.append(f"{releases_per_event[i]} {e.phase} '{e.mechanism}' releases "
                                f"are not private (epsilon = inf)"
                                f"{': ' + e.note if e.note else ''}")
            elif (users_per_event[i] and e.is_private
                  and not e.at_adjacency("user").is_private):
                warnings.append(f"{releases_per_event[i]} {e.phase} '{e.mechanism}' releases "
                                f"are private for one click but NOT for a whole user "
                                f"(user-level epsilon = inf){': ' + e.note if e.note else ''}")
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
        for name, phase in (("train", "train"), ("serve", "serve"), ("total", None)):
            values: list[float] = []
            basic_eps: list[float] = []
            basic_delta: list[float] = []
            releases: list[int] = []
            groups = self._groups(self._users, phase)  # type: ignore[arg-type]
            for signature, members in groups.items():
                if not signature:
                    continue
                eps = self._compose_signature(signature, delta, composition, adjacency)
                events = [(self._events[i], c) for i, c in signature]
                pairs = [basic_composition(g) for g in adjacency_view(events, adjacency)]
                b_eps = max(p[0] for p in pairs)
                b_delta = max(p[1] for p in pairs)
                n = len(members)
                values += [eps] * n
                basic_eps.append(b_eps)
                basic_delta.append(b_delta)
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

    __hash__ = None  # type: ignore[assignment]
