"""Noise calibration and privacy-budget arithmetic (pure math on floats).

Everything here maps privacy parameters to noise parameters or budgets to budgets; nothing
draws randomness or touches tensors. Conventions (docs/privacy.md):

* ``epsilon=math.inf`` means "no privacy": the calibrated noise scale is 0.
* Sensitivities are those of one release with respect to the adjacency the caller
  protects (e.g. substitution of one history item for PrivateRec's DPA, whole-update
  replacement for FedNewsRec's local DP).
* Invalid parameters raise :class:`privaterec.errors.ConfigError` naming the parameter.

References
----------
Balle & Wang, "Improving the Gaussian Mechanism for Differential Privacy: Analytical
Calibration and Optimal Denoising", ICML 2018 (arXiv:1805.06530).
Dwork & Roth, "The Algorithmic Foundations of Differential Privacy", 2014, Thm 3.6, A.1.
PrivateRec (``papers/privaterec.md``) Algorithms 2-3; FedNewsRec (``papers/fednewsrec.txt``)
Eq. 4-5 and Section 3.3.
"""

from __future__ import annotations

import math
import numbers
from typing import Literal, get_args

from privaterec.validators import check_in, fail

SensitivityMode = Literal["true", "paper"]
"""DPA's sensitivity: the simplex's (``true``) or the paper's S = θ (``paper``, NOT valid)."""
SENSITIVITY_MODES: tuple[SensitivityMode, ...] = get_args(SensitivityMode)
Composition = Literal["basic", "pld", "rdp"]
"""How a user's releases compose into one (ε, δ)
(:func:`privaterec.privacy.ledger.compose_events`)."""
COMPOSITIONS: tuple[Composition, ...] = get_args(Composition)

PAPER_SENSITIVITY_WARNING = (
    "DPA noise calibrated with the paper's sensitivity theta (PrivateRec Alg. 2 line 1); "
    "the attention vector lies on the probability simplex, whose L1 sensitivity is 2 and "
    "L2 sensitivity is sqrt(2), so the stated (epsilon, delta) guarantee does NOT hold "
    "(docs/privacy.md#dpa-sensitivity)."
)


def _check_epsilon(epsilon: float, name: str = "epsilon") -> None:
    check_in(epsilon, name, 0, math.inf, "a number > 0 (math.inf means no noise)",
             open_low=True, open_high=False)


def _check_delta(delta: float, name: str = "delta", *, allow_zero: bool = False) -> None:
    check_in(delta, name, 0, 1, "a number in [0, 1)" if allow_zero else "a number in (0, 1)",
             open_low=not allow_zero)


def laplace_scale(*, epsilon: float, sensitivity_l1: float) -> float:
    """Scale b of the Laplace mechanism: b = Δ₁ / ε (Dwork & Roth Thm 3.6).

    Parameters
    ----------
    epsilon:
        Target ε > 0; ``math.inf`` gives 0 (no noise).
    sensitivity_l1:
        L1 sensitivity Δ₁ ≥ 0 of the released vector.

    Returns
    -------
    float
        The Laplace scale b (density ``exp(-|x|/b) / 2b`` per coordinate).
    """
    _check_epsilon(epsilon)
    check_in(sensitivity_l1, "sensitivity_l1", 0, math.inf, "a finite number >= 0")
    if math.isinf(epsilon):
        return 0.0
    return sensitivity_l1 / epsilon


def gaussian_sigma(*, epsilon: float, delta: float, sensitivity_l2: float) -> float:
    """Standard deviation σ of the analytic Gaussian mechanism (Balle & Wang 2018).

    σ is the smallest value with
    Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ) ≤ δ  (Balle & Wang Thm 8, the exact condition),
    computed by :func:`dp_accounting.get_sigma_gaussian` (a root finder on that condition
    for Δ = 1, scaled by Δ). Valid for every ε > 0, unlike :func:`classical_gaussian_sigma`.

    Parameters
    ----------
    epsilon:
        Target ε > 0; ``math.inf`` gives 0.
    delta:
        Target δ in (0, 1).
    sensitivity_l2:
        L2 sensitivity Δ₂ ≥ 0.

    Returns
    -------
    float
        σ for noise N(0, σ² I).
    """
    _check_epsilon(epsilon)
    _check_delta(delta)
    check_in(sensitivity_l2, "sensitivity_l2", 0, math.inf, "a finite number >= 0")
    if math.isinf(epsilon) or sensitivity_l2 == 0:
        return 0.0
    try:
        from dp_accounting import get_sigma_gaussian
    except ImportError as exc:  # pragma: no cover - dp-accounting is a declared extra
        raise ImportError(
            "gaussian_sigma needs the 'dp-accounting' package: pip install 'privaterec[privacy]'"
        ) from exc
    return float(sensitivity_l2 * get_sigma_gaussian(float(epsilon), float(delta), tol=1e-12))


def classical_gaussian_sigma(*, epsilon: float, delta: float, sensitivity_l2: float,
                             allow_invalid: bool = False) -> float:
    """The classical σ = Δ₂ √(2 ln(1.25/δ)) / ε (Dwork & Roth Thm A.1). For comparison only.

    The classical bound is proved only for ε < 1; for ε ≥ 1 it does not give
    (ε, δ)-DP in general (Balle & Wang 2018, Sec. 2). It is what PrivateRec Alg. 2 line 9
    uses. Calibrate real releases with :func:`gaussian_sigma`.

    Parameters
    ----------
    epsilon, delta, sensitivity_l2:
        As in :func:`gaussian_sigma`.
    allow_invalid:
        Return the formula's value for ε ≥ 1 instead of raising (to reproduce the paper).

    Raises
    ------
    ConfigError
        If ε ≥ 1 and ``allow_invalid`` is false.
    """
    _check_epsilon(epsilon)
    _check_delta(delta)
    check_in(sensitivity_l2, "sensitivity_l2", 0, math.inf, "a finite number >= 0")
    if epsilon >= 1 and not allow_invalid:
        fail("epsilon", epsilon, "< 1 for the classical Gaussian bound (it is invalid for "
              "epsilon >= 1); use gaussian_sigma (analytic) or pass allow_invalid=True")
    if math.isinf(epsilon):
        return 0.0
    return sensitivity_l2 * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def amplified_budget(*, epsilon: float, delta: float, padding_p: float) -> tuple[float, float]:
    """Base budget (ε′, δ′) to run the mechanism at so that padding yields (ε, δ).

    ε′ = ln((e^ε − p)/(1 − p)), δ′ = δ/(1 − p)  (PrivateRec Alg. 2 line 9;
    docs/privacy.md#padding-amplification). Inverse of :func:`padding_amplification`. Adjacency:
    substitution of one item of the fixed-length (truncated) history; each item is independently
    replaced by the public anonymous news r₀ with probability p.

    Parameters
    ----------
    epsilon:
        Target ε > 0 after amplification (``math.inf`` → ``math.inf``).
    delta:
        Target δ in [0, 1); δ′ must stay < 1.
    padding_p:
        Padding probability p in [0, 1); p = 0 returns (ε, δ) unchanged.

    Returns
    -------
    tuple[float, float]
        (ε′, δ′) with ε′ ≥ ε and δ′ ≥ δ.
    """
    _check_epsilon(epsilon)
    _check_delta(delta, allow_zero=True)
    check_in(padding_p, "padding_p", 0, 1, "a probability in [0, 1)")
    p = float(padding_p)
    delta_base = delta / (1.0 - p)
    if delta_base >= 1:
        fail("delta", delta, f"< 1 - padding_p = {1 - p!r} so that delta/(1-p) < 1")
    if math.isinf(epsilon):
        return math.inf, delta_base
    # (e^ε − p)/(1 − p) = e^ε (1 − p e^{−ε})/(1 − p) and 1 − p e^{−ε} = (1 − p) − p·expm1(−ε),
    # so ε′ = ε + log1p(−p·expm1(−ε)/(1 − p)): no overflow for large ε, no cancellation for small.
    eps_base = epsilon + math.log1p(-p * math.expm1(-epsilon) / (1.0 - p))
    return eps_base, delta_base


def padding_amplification(*, epsilon_base: float, delta_base: float,
                          padding_p: float) -> tuple[float, float]:
    """Guarantee (ε, δ) of an (ε′, δ′)-DP mechanism run on a randomly padded history.

    ε = ln(1 + (1 − p)(e^{ε′} − 1)), δ = (1 − p) δ′ (docs/privacy.md#padding-amplification: the
    padded item is a neighbour of both histories, as in amplification by subsampling under
    substitution).

    Parameters
    ----------
    epsilon_base:
        ε′ > 0 of the base mechanism (``math.inf`` → ``math.inf``).
    delta_base:
        δ′ in [0, 1).
    padding_p:
        Padding probability p in [0, 1).

    Returns
    -------
    tuple[float, float]
        (ε, δ) with ε ≤ ε′.
    """
    _check_epsilon(epsilon_base, "epsilon_base")
    _check_delta(delta_base, "delta_base", allow_zero=True)
    check_in(padding_p, "padding_p", 0, 1, "a probability in [0, 1)")
    p = float(padding_p)
    delta = (1.0 - p) * delta_base
    if math.isinf(epsilon_base):
        return math.inf, delta
    # 1 + (1 − p)(e^{ε′} − 1) = e^{ε′} (1 + p·expm1(−ε′)); stable for small and large ε′.
    return epsilon_base + math.log1p(p * math.expm1(-epsilon_base)), delta


def dpa_sensitivity(norm: Literal["l1", "l2"] = "l2",
                    mode: SensitivityMode = "true", *, theta: float = 1.0) -> float:
    """Sensitivity of PrivateRec's attention vector α (DPA, Alg. 2 lines 7-9).

    Parameters
    ----------
    norm:
        ``"l1"`` (Laplace calibration) or ``"l2"`` (Gaussian calibration).
    mode:
        ``"true"``: α, α′ are softmax outputs on the probability simplex, so the L1
        sensitivity is 2 and the L2 sensitivity is √2 (docs/privacy.md#dpa-sensitivity).
        ``"paper"``: the paper's S = θ. NOT a valid DP guarantee; any report made with it
        must include :data:`PAPER_SENSITIVITY_WARNING` (mark the events ``valid=False``).
    theta:
        The paper's clipping norm θ, used only with ``mode="paper"`` (Alg. 2 sets S = θ).

    Returns
    -------
    float
    """
    if norm not in ("l1", "l2"):
        fail("norm", norm, "'l1' or 'l2'")
    if mode == "true":
        return 2.0 if norm == "l1" else math.sqrt(2.0)
    if mode == "paper":
        check_in(theta, "theta", 0, math.inf, "a finite number > 0", open_low=True)
        return float(theta)
    fail("mode", mode, "'true' or 'paper'")


def fednewsrec_coordinate_epsilon(*, clip_bound: float, noise_scale: float) -> float:
    """FedNewsRec's stated budget ε = 2δ/λ (Sec. 3.3) — per coordinate only.

    With element-wise clipping to [−δ, δ] (Eq. 4) one coordinate changes by at most 2δ, so
    Laplace noise of scale λ (Eq. 5) gives 2δ/λ for ONE coordinate. Never report it alone:
    the whole update costs :func:`fednewsrec_update_epsilon`
    (docs/privacy.md#fednewsrecs-epsilon-is-per-coordinate).

    Parameters
    ----------
    clip_bound:
        δ > 0 of Eq. 4 (the paper uses 0.005).
    noise_scale:
        λ > 0 of Eq. 5 (the paper uses 0.015); λ = ∞ gives ε = 0.
    """
    check_in(clip_bound, "clip_bound", 0, math.inf, "a finite number > 0", open_low=True)
    check_in(noise_scale, "noise_scale", 0, math.inf, "a number >= 0", open_high=False)
    if noise_scale == 0:
        return math.inf
    return 2.0 * clip_bound / noise_scale


def fednewsrec_update_epsilon(*, clip_bound: float, noise_scale: float, dimension: int) -> float:
    """Laplace guarantee of a whole FedNewsRec update of D coordinates: ε = 2δD/λ.

    The L1 sensitivity of an element-wise clipped D-dim update is 2δD
    (docs/privacy.md#fednewsrecs-epsilon-is-per-coordinate).

    Parameters
    ----------
    clip_bound, noise_scale:
        As in :func:`fednewsrec_coordinate_epsilon`.
    dimension:
        D ≥ 1, the number of uploaded (noised) coordinates.
    """
    if not (isinstance(dimension, numbers.Integral) and dimension >= 1):
        fail("dimension", dimension, "an integer >= 1")
    per_coordinate = fednewsrec_coordinate_epsilon(clip_bound=clip_bound, noise_scale=noise_scale)
    return per_coordinate * int(dimension)
