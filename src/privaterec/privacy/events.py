"""What one release spends: :class:`PrivacyEvent` (docs/privacy.md#the-ledger).

Every mechanism and every calibration (:mod:`privaterec.privacy.calibrate`) describes one
release of one user's data by a :class:`PrivacyEvent`: its mechanism, its (ε, δ) under
one-click adjacency and under user-level adjacency, its noise scale and sensitivity, which
part of the data it reads. The ledger (:mod:`privaterec.privacy.ledger`) stores and composes
them; this module holds the event alone, so that mechanisms and calibrations do not import
the accountant.

What an event means to the accountants (:meth:`PrivacyEvent.to_dp_event`):

* Laplace / Gaussian without padding: the exact additive-noise pair, with noise multiplier
  ``noise_scale / sensitivity`` (``LaplaceDpEvent`` / ``GaussianDpEvent``). The sensitivity
  is the caller's, for the caller's adjacency, so the pair is (noise, Δ + noise).
* any other pure ε event (exponential mechanism, DPL, randomized response, padded Laplace):
  binary randomized response with the same ε, which dominates every ε-DP mechanism
  (Kairouz, Oh & Viswanath 2015) — ``RandomizedResponseDpEvent`` under ``REPLACE_ONE``.
* any other (ε, δ) event (e.g. a padded Gaussian, docs/privacy.md#padding-amplification): the
  generic (ε, δ) dominating pair (:class:`EpsilonDeltaDpEvent`; PLD ``from_privacy_parameters``),
  which RDP cannot represent.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, Mapping, NoReturn

import attr
from dp_accounting import dp_event

from privaterec.errors import CheckpointError, ConfigError
from privaterec.privacy.formulas import amplified_budget, padding_amplification
from privaterec.privacy.noise import MECHANISMS
from privaterec.validators import fail, is_real

PHASES = ("train", "serve")

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

_REL_TOL = 1e-9
_FLOAT_FIELDS = ("epsilon", "delta", "noise_scale", "sensitivity", "padding_p",
                 "coordinate_epsilon", "epsilon_user", "delta_user", "sampling_rate")


@attr.s(frozen=True, slots=True, auto_attribs=True)
class EpsilonDeltaDpEvent(dp_event.DpEvent):
    """A mechanism known only to be (ε, δ)-DP (``dp_accounting`` has no such event).

    Composed by the ledger through its worst-case privacy loss distribution
    (``pld.privacy_loss_distribution.from_privacy_parameters``); ``dp_accounting``'s own
    accountants report it as unsupported.
    """

    epsilon: float
    delta: float


def _fail(name: str, value: object, expected: str) -> NoReturn:
    fail(name, value, expected, kind="privacy event field")


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
        Optional per-coordinate ε (FedNewsRec's 2δ/λ,
        docs/privacy.md#fednewsrecs-epsilon-is-per-coordinate), reported next to the vector ε,
        never instead of it.
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
    (``epsilon_user``). See :meth:`~privaterec.privacy.ledger.PrivacyLedger.user_epsilon` for how
    totals compose under each adjacency (docs/privacy.md).
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
            if value is not None and not (is_real(value) and value >= 0):
                _fail(name, value, "None or a number >= 0")
        if self.sampling_rate is not None and not (
                isinstance(self.sampling_rate, numbers.Real) and 0 < self.sampling_rate <= 1
                and self.mechanism in MECHANISMS and self.padding_p == 0):
            _fail("sampling_rate", self.sampling_rate, "None, or q in (0, 1] on an "
                  "unpadded noise event ('gaussian')")
        # Normalise numeric types so equal events hash equally (np.float64(1) == 1.0 anyway).
        for name in _FLOAT_FIELDS:
            if getattr(self, name) is not None:
                object.__setattr__(self, name, float(getattr(self, name)))
        object.__setattr__(self, "dimension", int(self.dimension))
        object.__setattr__(self, "valid", bool(self.valid))
        if self.mechanism in MECHANISMS:
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
        noise = MECHANISMS[self.mechanism]
        if not noise.pure and self.noise_scale > 0 and self.delta <= 0:
            _fail("delta", self.delta, f"> 0 for a {self.mechanism!r} event")
        if noise.pure:  # ε is the scale's, amplified by the padding
            base = noise.epsilon(scale=self.noise_scale, sensitivity=self.sensitivity, delta=0.0)
            expected = base
            if self.padding_p > 0 and math.isfinite(base):
                expected = padding_amplification(epsilon_base=base, delta_base=0.0,
                                                  padding_p=self.padding_p)[0]
            if not math.isclose(self.epsilon, expected, rel_tol=_REL_TOL, abs_tol=1e-12):
                _fail("epsilon", self.epsilon,
                      f"{expected!r} = sensitivity/noise_scale (amplified by padding_p="
                      f"{self.padding_p}) for a {self.mechanism!r} event")

    def at_adjacency(self, adjacency: Adjacency) -> PrivacyEvent:
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
        return replace_event(self, epsilon=eps, delta=dlt, padding_p=0.0, epsilon_user=None,
                              delta_user=None)

    @property
    def noise_multiplier(self) -> float | None:
        """``noise_scale / sensitivity`` for noise mechanisms, else None."""
        if self.mechanism not in MECHANISMS:
            return None
        assert self.noise_scale is not None and self.sensitivity is not None
        return self.noise_scale / self.sensitivity

    @property
    def is_private(self) -> bool:
        """False when the release has no finite guarantee (ε = ∞ or zero noise)."""
        if math.isinf(self.epsilon):
            return False
        return not (self.mechanism in MECHANISMS and self.noise_scale == 0)

    def to_dp_event(self) -> dp_event.DpEvent:
        """The ``dp_accounting`` event that this release is accounted as (module docstring)."""
        if not self.is_private:
            return dp_event.NonPrivateDpEvent()
        if self.epsilon == 0 and self.delta == 0:
            return dp_event.NoOpDpEvent()
        if self.padding_p == 0 and self.noise_multiplier is not None:
            event = MECHANISMS[self.mechanism].dp_event(self.noise_multiplier)
            if self.sampling_rate is None:
                return event
            return dp_event.PoissonSampledDpEvent(sampling_probability=self.sampling_rate,
                                                  event=event)
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
        # Untyped JSON values: the constructor checks every field (``__post_init__``).
        values: dict[str, Any] = {k: float(v) if k in _FLOAT_FIELDS and v is not None
                                  else v for k, v in data.items()}
        return cls(**values)


def replace_event(event: PrivacyEvent, **changes: Any) -> PrivacyEvent:
    values = {f.name: getattr(event, f.name) for f in fields(PrivacyEvent)}
    values.update(changes)
    return PrivacyEvent(**values)


def _encode_float(x: float) -> float | str:
    return x if math.isfinite(x) else repr(x)  # 'inf', '-inf', 'nan'


__all__ = ["ADJACENCIES", "ADJACENCY_TEXT", "Adjacency", "DATA_PARTS", "DataPart",
           "EpsilonDeltaDpEvent", "PHASES", "Phase", "PrivacyEvent",
           "replace_event"]
