"""A release calibrated once: its clipping, its noise scale and the event it implies.

A :class:`Calibration` is built once per run (or once per serving configuration) from the
privacy parameters — a target ε (and δ), or a given noise scale — and then handed to the
code that releases data: the mechanisms (:mod:`privaterec.privacy.mechanisms`) clip and noise
with it, the ledger records its :attr:`Calibration.event`. Nothing downstream maps ε to a
noise scale again, and nobody runs a mechanism to learn what it would spend.

Every ε becomes a noise scale in :func:`calibrate` (target ε → scale, through the pure math
of :mod:`privaterec.privacy.formulas`) or in :func:`calibrate_scale` (given Laplace scale
→ ε). The helpers below them only choose the sensitivity of a release:

* :func:`clipped_release` — a clipped vector plus noise, under replacement of the data it
  reads: Δ = 2·clip for an L1 or L2 clip (DP-FedRec, PrivateRec strict's history-path
  gradient, VDP, Uni-FedRec's L1-clipped upload), Δ₁ = 2·clip·D for an element-wise clip
  (FedNewsRec Eq. 4-5, Uni-FedRec's channels and element-wise upload;
  docs/privacy.md#fednewsrecs-epsilon-is-per-coordinate, #uni-fedrec-channels-and-quotas);
* :func:`simplex_release` — a vector on the probability simplex plus Laplace noise
  (Δ₁ = 2: Uni-FedRec's quotas);
* :func:`no_noise` — a release without noise (ε = ∞, or ε = 0 when nothing is sent).

Shapes do not appear here: this module is pure math on floats (no tensors, no randomness).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Literal

from privaterec.errors import ConfigError
from privaterec.privacy.events import DataPart, Phase, PrivacyEvent
from privaterec.privacy.formulas import amplified_budget
from privaterec.privacy.noise import MECHANISMS, NOISE_KINDS, NoiseMechanism, noise_mechanism
from privaterec.validators import check_in, fail

Clipping = Literal["none", "l1", "l2", "elementwise"]
CLIPPINGS = ("none", "l1", "l2", "elementwise")

SIMPLEX_SENSITIVITY_L1 = 2.0
"""L1 diameter of the probability simplex: two non-negative vectors that each sum to 1 differ
by at most 2 in L1 (all mass on one coordinate against all mass on another)."""


def _check_clip(clipping: str, clip: float | None) -> None:
    if clipping not in CLIPPINGS:
        fail("clipping", clipping, f"one of {CLIPPINGS}")
    if clipping == "none":
        if clip is not None:
            fail("clip", clip, "None without clipping")
    else:
        check_in(clip, "clip", 0, math.inf, "a finite number > 0", open_low=True)


@dataclass(frozen=True)
class Calibration:
    """One kind of release, calibrated: how it clips, how much noise it adds, what it spends.

    Attributes
    ----------
    event:
        The :class:`PrivacyEvent` of ONE release (one client's upload, one row of a batch,
        one query): ε/δ under one-click adjacency, ``epsilon_user``/``delta_user`` under
        user-level adjacency (:attr:`user_epsilon`), the noise scale and the sensitivity.
    clipping:
        ``"none"``, ``"l1"``, ``"l2"`` (each release's vector scaled into the ball) or
        ``"elementwise"`` (every coordinate clamped), applied before the noise.
    clip:
        The clip bound (θ, or δ for element-wise clipping); ``None`` without clipping.

    The noise is Laplace or Gaussian (``event.mechanism``) of scale :attr:`scale` (the
    Laplace b or the Gaussian σ; 0: no noise), or none for any other mechanism.
    """

    event: PrivacyEvent
    clipping: Clipping = "none"
    clip: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.event, PrivacyEvent):
            fail("event", self.event, "a PrivacyEvent")
        _check_clip(self.clipping, self.clip)
        if self.clip is not None:
            object.__setattr__(self, "clip", float(self.clip))
        if self.noisy and not math.isfinite(self.scale):
            fail("noise_scale", self.event.noise_scale, "a finite number >= 0")

    @property
    def noise(self) -> NoiseMechanism | None:
        """The noise mechanism of the release (``None``: no noise is drawn)."""
        return MECHANISMS.get(self.event.mechanism)

    @property
    def noisy(self) -> bool:
        """Whether the release adds Laplace or Gaussian noise (possibly of scale 0: ε = ∞)."""
        return self.noise is not None

    @property
    def mechanism(self) -> str:
        """The noise mechanism's name (``"laplace"``, ...) or ``"none"`` (no noise)."""
        return self.event.mechanism if self.noisy else "none"

    @property
    def scale(self) -> float:
        """The Laplace scale b or the Gaussian σ of the noise (0 without noise)."""
        return float(self.event.noise_scale or 0.0) if self.noisy else 0.0

    @property
    def epsilon(self) -> float:
        """ε of one release under one-click adjacency."""
        return self.event.epsilon

    @property
    def delta(self) -> float:
        """δ of one release under one-click adjacency."""
        return self.event.delta

    @property
    def user_epsilon(self) -> float:
        """ε of one release under user-level adjacency (the user's data replaced)."""
        return self.event.at_adjacency("user").epsilon


def calibrate(*, mechanism: str, epsilon: float, delta: float = 0.0,
              sensitivity: float, dimension: int = 1, phase: Phase = "train",
              padding_p: float = 0.0, clipping: Clipping = "none", clip: float | None = None,
              valid: bool = True, note: str = "", data: DataPart = "all") -> Calibration:
    """The noise for a target (ε, δ): the one place a release's ε becomes a noise scale.

    Laplace: b = Δ₁/ε′ (Dwork & Roth Thm 3.6); Gaussian: the analytic σ (Balle & Wang 2018),
    both at the base budget (ε′, δ′) of
    :func:`~privaterec.privacy.formulas.amplified_budget` when the caller pads the
    history with probability ``padding_p`` (PrivateRec Alg. 2;
    docs/privacy.md#padding-amplification, #gaussian-calibration).

    Parameters
    ----------
    mechanism:
        A noise mechanism (:mod:`privaterec.privacy.noise`): ``"laplace"`` (pure DP:
        ``delta`` must be 0) or ``"gaussian"`` (δ in (0, 1)).
    epsilon, delta:
        Target (ε, δ) of ONE release after amplification; ε = ∞ gives scale 0 (the event is
        then not private).
    sensitivity:
        L1 (Laplace) or L2 (Gaussian) sensitivity of one release, for the adjacency the
        caller protects.
    dimension:
        Coordinates of one release (recorded in the event).
    phase, padding_p, valid, note, data:
        Copied into the event (``valid=False`` for the paper's DPA sensitivity).
    clipping, clip:
        How the release is clipped before the noise (what makes ``sensitivity`` hold).

    Returns
    -------
    Calibration
    """
    noise = noise_mechanism(mechanism)
    if noise.pure and delta != 0:
        fail("delta", delta, f"0: the {mechanism} mechanism is pure DP (pass delta=0 or "
              "mechanism='gaussian')")
    eps_base, delta_base = amplified_budget(epsilon=epsilon, delta=delta, padding_p=padding_p)
    scale = noise.scale(epsilon=eps_base, delta=delta_base, sensitivity=sensitivity)
    event = PrivacyEvent(mechanism=mechanism, epsilon=epsilon, delta=delta, noise_scale=scale,
                         sensitivity=sensitivity, dimension=dimension, phase=phase,
                         padding_p=padding_p, valid=valid, note=note, data=data)
    return Calibration(event=event, clipping=clipping, clip=clip)


def calibrate_scale(*, noise_scale: float, sensitivity: float, mechanism: str = "laplace",
                    delta: float = 0.0, dimension: int = 1, phase: Phase = "train",
                    clipping: Clipping = "none", clip: float | None = None,
                    coordinate_epsilon: float | None = None, note: str = "",
                    data: DataPart = "all") -> Calibration:
    """A release at a given noise scale: the mechanism's ε for it (at ``delta``; Laplace:
    ε = Δ₁/λ, ∞ for λ = 0).

    For the methods whose papers fix the noise scale rather than ε (FedNewsRec's λ,
    Uni-FedRec's λ_I, λ_g, λ_q). Parameters as in :func:`calibrate`; ``coordinate_epsilon``
    is the paper's per-coordinate ε, reported next to the release's ε
    (docs/privacy.md#fednewsrecs-epsilon-is-per-coordinate).
    """
    check_in(noise_scale, "noise_scale", 0, math.inf, "a finite number >= 0")
    epsilon = noise_mechanism(mechanism).epsilon(scale=noise_scale, sensitivity=sensitivity,
                                                 delta=delta)
    event = PrivacyEvent(mechanism=mechanism, epsilon=epsilon, delta=delta,
                         noise_scale=float(noise_scale), sensitivity=sensitivity,
                         dimension=dimension, phase=phase,
                         coordinate_epsilon=coordinate_epsilon, note=note, data=data)
    return Calibration(event=event, clipping=clipping, clip=clip)


def clipped_release(*, clipping: Literal["l1", "l2", "elementwise"], clip: float,
                    dimension: int, epsilon: float | None = None, delta: float = 0.0,
                    noise_scale: float | None = None, mechanism: str | None = None,
                    phase: Phase = "train", note: str = "",
                    data: DataPart = "all") -> Calibration:
    """A clipped D-dim vector plus noise, under replacement of the data it reads.

    Two clipped vectors differ by at most Δ = 2·clip (L1 or L2 ball of radius clip) or, with
    an element-wise clip to [−clip, clip], Δ₁ = 2·clip·D (FedNewsRec Eq. 4;
    docs/privacy.md#fednewsrecs-epsilon-is-per-coordinate). The noise is ``mechanism``'s, whose
    norm must be the clip's (an element-wise clip's is L1); by default Laplace for an L1 or
    element-wise clip, the analytic Gaussian for an L2 clip. Give the target ``epsilon`` (and
    ``delta`` for Gaussian), or the Laplace ``noise_scale`` (then ε = Δ₁/λ and, for an
    element-wise clip, the per-coordinate 2·clip/λ is recorded too).

    Parameters
    ----------
    clipping, clip:
        ``"l1"``, ``"l2"`` or ``"elementwise"``, and the bound (θ or δ) > 0.
    dimension:
        D ≥ 1, the coordinates of one release.
    epsilon, delta, noise_scale:
        Exactly one of ``epsilon`` (target, per release) and ``noise_scale``.
    mechanism:
        The noise mechanism (:mod:`privaterec.privacy.noise`); ``None``: the default above.
    phase, note, data:
        Copied into the event.
    """
    _check_clip(clipping, clip)
    if clipping not in ("l1", "l2", "elementwise"):  # an untyped caller's "none"
        fail("clipping", clipping, "'l1', 'l2' or 'elementwise'")
    if (epsilon is None) == (noise_scale is None):
        raise ConfigError("give exactly one of 'epsilon' (target) and 'noise_scale' (given "
                          "Laplace scale) for a clipped release")
    if not (isinstance(dimension, numbers.Integral) and dimension >= 1):
        fail("dimension", dimension, "an integer >= 1")
    sensitivity = 2.0 * clip * dimension if clipping == "elementwise" else 2.0 * clip
    norm = "l2" if clipping == "l2" else "l1"
    mechanism = mechanism or ("gaussian" if norm == "l2" else "laplace")
    if noise_mechanism(mechanism).norm != norm:
        fail("mechanism", mechanism, f"a mechanism calibrated to the {norm.upper()} norm of "
              f"a {clipping!r} clip")
    if noise_scale is not None:
        if clipping == "l2":
            fail("clipping", clipping, "'l1' or 'elementwise' with a Laplace noise_scale")
        coordinate = None
        if clipping == "elementwise":
            coordinate = math.inf if noise_scale == 0 else 2.0 * clip / noise_scale
        return calibrate_scale(noise_scale=noise_scale, sensitivity=sensitivity,
                               mechanism=mechanism, dimension=dimension, phase=phase,
                               clipping=clipping, clip=clip, coordinate_epsilon=coordinate,
                               note=note, data=data)
    assert epsilon is not None
    return calibrate(mechanism=mechanism, epsilon=epsilon, delta=delta, sensitivity=sensitivity,
                     dimension=dimension, phase=phase, clipping=clipping, clip=clip, note=note,
                     data=data)


def simplex_release(*, noise_scale: float, dimension: int, phase: Phase = "serve",
                    note: str = "", data: DataPart = "all") -> Calibration:
    """A vector on the probability simplex plus Laplace(λ): Δ₁ = 2, ε = 2/λ (∞ for λ = 0).

    The sensitivity holds for any change of the data (:data:`SIMPLEX_SENSITIVITY_L1`).
    """
    return calibrate_scale(noise_scale=noise_scale, sensitivity=SIMPLEX_SENSITIVITY_L1,
                           dimension=dimension, phase=phase, note=note, data=data)


def no_noise(*, mechanism: str = "none", epsilon: float = math.inf, dimension: int = 1,
             phase: Phase = "train", clipping: Clipping = "none", clip: float | None = None,
             note: str = "", data: DataPart = "all") -> Calibration:
    """A release without noise: ε = ∞ (sent as is, e.g. ``fedrec``'s gradient), or ε = 0
    when nothing user-dependent is sent (local ranking). ``mechanism`` names it in reports
    (``"none"``, ``"clear_quotas"``, ...; not ``"laplace"``/``"gaussian"``)."""
    if mechanism in MECHANISMS:
        fail("mechanism", mechanism, f"a mechanism without noise (not one of {NOISE_KINDS})")
    event = PrivacyEvent(mechanism=mechanism, epsilon=epsilon, dimension=dimension,
                         phase=phase, note=note, data=data)
    return Calibration(event=event, clipping=clipping, clip=clip)


__all__ = ["CLIPPINGS", "Calibration", "Clipping", "SIMPLEX_SENSITIVITY_L1",
           "calibrate", "calibrate_scale", "clipped_release", "no_noise", "simplex_release"]
