"""Each federated method's own settings: one frozen, validated dataclass per method.

A run's :class:`~privaterec.config.FedConfig` holds the engine's settings (rounds, sampling,
the server's strategy, chunking, cadence, engine) and, in ``settings``, the settings of the
run's method: one of the classes below, chosen by the method's name (:func:`settings_type`).
Every field has a real default; a class validates its own fields and the rules between them
on construction, and raises :class:`~privaterec.errors.ConfigError` naming the field.

The method classes of :mod:`privaterec.fed.methods` (and Uni-FedRec's
:class:`~privaterec.recall.task.UniFedRecLDP`) declare the class they read
(``settings_type``) and are built from it (``from_config``). These dataclasses live here, in
the configuration layer, so that a ``config.yaml`` is read and checked without importing the
engine.

====================  ==============================  ==========================================
method                settings                        method class
====================  ==============================  ==========================================
``fedrec``            :class:`FedRecSettings`         ``fed.methods.ranking.FedRec``
``fednewsrec``        :class:`FedNewsRecSettings`     ``fed.methods.ranking.FedNewsRec``
``dp-fedrec``         :class:`DPFedRecSettings`       ``fed.methods.ranking.DPFedRec``
``privaterec``        :class:`PrivateRecSettings`     ``fed.methods.privaterec.PrivateRec``
``dp-fedavg``         :class:`DPFedAvgSettings`       ``fed.methods.dp_fedavg.CentralDP``
``unifedrec``         :class:`UniFedRecSettings`      ``recall.task.UniFedRecLDP``
====================  ==============================  ==========================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import ClassVar, Literal, get_args

from privaterec.errors import ConfigError
from privaterec.privacy.adaptive_clip import DEFAULT_CLIP_LR
from privaterec.privacy.formulas import SENSITIVITY_MODES, SensitivityMode
from privaterec.privacy.noise import NOISE_KINDS
from privaterec.validators import (check, check_adaptive_clip, check_choice,
                                   check_noise_multiplier, check_positive)

NoiseKind = str
"""A noise mechanism's name: one of :data:`NOISE_KINDS` (:mod:`privaterec.privacy.noise`)."""
PrivacyMode = Literal["paper", "strict"]
GradientClipping = Literal["l1", "elementwise", "none"]
SecureAggregation = Literal["none", "secaggplus"]
NoisePlacement = Literal["central", "distributed"]
ClipSpace = Literal["parameters", "news_vectors"]

PRIVACY_MODES: tuple[PrivacyMode, ...] = get_args(PrivacyMode)
GRADIENT_CLIPPINGS: tuple[GradientClipping, ...] = get_args(GradientClipping)
SECURE_AGGREGATIONS: tuple[SecureAggregation, ...] = get_args(SecureAggregation)
NOISE_PLACEMENTS: tuple[NoisePlacement, ...] = get_args(NoisePlacement)
CLIP_SPACES: tuple[ClipSpace, ...] = get_args(ClipSpace)

PRIVATEREC_STRICT_CLIP = 1e-4
"""PrivateRec strict mode's clip bound C of the history-path gradient
(docs/privacy.md#paper-and-strict-mode). Its signal-to-noise ratio, C against Laplace noise of L1
norm 2CD/ε, does not depend on C, but the noise it adds to the raw candidate-path gradient grows
with C: a small C is better
(measured: 0.5349 test AUC at C = 1e-4 vs 0.5172 at DP-FedRec's 0.005; BENCHMARKS.md)."""


def _check_delta(value: float, name: str, hint: str = "") -> None:
    check(0 < value < 1, name, f"got {value!r}, expected 0 < delta < 1{hint}")


def check_secure_aggregation(*, secure_aggregation: str, noise_placement: str,
                             max_dropouts: int, adaptive: bool) -> None:
    """Check DP-FedAvg's secure aggregation group (the Flower engine's SecAgg+).

    Parameters
    ----------
    secure_aggregation: ``none`` or ``secaggplus``. noise_placement: ``central`` or
    ``distributed`` (the clients add the noise in shares; needs secure aggregation).
    max_dropouts: k >= 0, the dropouts a round tolerates (needs secure aggregation).
    adaptive: whether adaptive clipping is on (it does not run with secure aggregation yet).

    Raises
    ------
    ConfigError
        Naming the field and what to pass instead.
    """
    check_choice(secure_aggregation, "secure_aggregation", SECURE_AGGREGATIONS)
    check_choice(noise_placement, "noise_placement", NOISE_PLACEMENTS)
    check(isinstance(max_dropouts, int) and not isinstance(max_dropouts, bool)
          and max_dropouts >= 0, "max_dropouts",
          f"got {max_dropouts!r}, expected an integer >= 0")
    if secure_aggregation == "none" and (noise_placement != "central" or max_dropouts):
        raise ConfigError("'noise_placement' distributed and 'max_dropouts' need secure "
                          "aggregation (--secure-aggregation secaggplus, Flower engine)")
    if adaptive and secure_aggregation != "none":
        raise ConfigError("adaptive clipping (--adaptive-clip-quantile) does not run with "
                          "secure aggregation yet: its clip indicators and the round's "
                          "clip would need a secure sum and server state of their own; "
                          "use a fixed --clip")


@dataclass(frozen=True, kw_only=True)
class MethodSettings:
    """The settings of one federated method (a subclass per method; this base has none).

    ``method`` names the method (``TrainConfig.method``, or ``unifedrec``).
    """

    method: ClassVar[str] = ""

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The names of its settings, in declaration order."""
        return tuple(f.name for f in fields(cls))


@dataclass(frozen=True, kw_only=True)
class FedRecSettings(MethodSettings):
    """FedRec: plain federated learning, raw updates (no setting of its own)."""

    method: ClassVar[str] = "fedrec"


@dataclass(frozen=True, kw_only=True)
class FedNewsRecSettings(MethodSettings):
    """FedNewsRec (Qi et al. 2020, Eq. 4-5): element-wise clip to [−δ, δ] and Laplace(λ) per
    coordinate; the paper's δ = 0.005 and λ = 0.015.

    Attributes
    ----------
    clip: δ, the element-wise bound. noise_scale: λ, the Laplace scale (> 0: the whole D-dim
        update is 2δD/λ-DP; use ``fedrec`` for no noise).
    """

    method: ClassVar[str] = "fednewsrec"

    clip: float = 0.005
    noise_scale: float = 0.015

    def __post_init__(self) -> None:
        check_positive(self.clip, "clip")
        check(0 < self.noise_scale < math.inf, "noise_scale",
              f"got {self.noise_scale!r}; fednewsrec's noise_scale must be > 0 and finite "
              f"(its epsilon is 2*clip*D/noise_scale); use fedrec for no noise")


@dataclass(frozen=True, kw_only=True)
class DPFedRecSettings(MethodSettings):
    """DP-FedRec (PrivateRec §4's baseline): clip a client's whole update to norm θ and noise
    it at (ε_t, δ_t) per round.

    Attributes
    ----------
    clip: θ, the L1 (Laplace) or L2 (Gaussian) norm bound.
    noise: ``laplace`` (L1 clipping) or ``gaussian`` (L2 clipping, analytic calibration).
    epsilon_train: ε_t per round of one client's upload (``inf``: no noise).
    delta_train: δ_t per round (Gaussian only; Laplace releases are pure ε-DP).
    """

    method: ClassVar[str] = "dp-fedrec"

    clip: float = 0.005
    noise: NoiseKind = "laplace"
    epsilon_train: float = math.inf
    delta_train: float = 1e-5

    def __post_init__(self) -> None:
        check_positive(self.clip, "clip")
        check_choice(self.noise, "noise", NOISE_KINDS)
        check_positive(self.epsilon_train, "epsilon_train")
        _check_delta(self.delta_train, "delta_train")


@dataclass(frozen=True, kw_only=True)
class PrivateRecSettings(MethodSettings):
    """PrivateRec (Alg. 2-3): DPA on the user's attention, the label release, and in strict
    mode the history-path gradient clipped and noised too.

    Attributes
    ----------
    privacy_mode: ``strict`` (the default: the history-path gradient is clipped to ``clip``
        and noised too, so the stated guarantee holds; docs/privacy.md#paper-and-strict-mode)
        or ``paper`` (Alg. 3 as published, for reproducing the published tables: the
        history-path gradient is uploaded raw and is not covered, so the stated ε is not a
        guarantee).
    noise: DPA's mechanism, ``laplace`` or ``gaussian``.
    epsilon_train, delta_train: (ε_t, δ_t) per round (δ_t: Gaussian only; ε_t = inf: no noise).
    padding_p: behaviour padding probability p (Alg. 2; it only buys amplification, so a run
        without noise pads nothing).
    sensitivity_mode: DPA's ``true`` simplex sensitivity, or ``paper`` (S = 1, NOT a valid
        guarantee; reproduction only).
    clip: strict mode's bound C of the history-path gradient (default
        :data:`PRIVATEREC_STRICT_CLIP`); ``None`` in paper mode, which clips nothing.
    history_budget: strict mode's share of ε_t (and δ_t) spent on the history-path gradient;
        DPA gets the rest, so one round's upload is (ε_t, δ_t)-DP for the history.
    """

    method: ClassVar[str] = "privaterec"

    privacy_mode: PrivacyMode = "strict"
    noise: NoiseKind = "laplace"
    epsilon_train: float = math.inf
    delta_train: float = 1e-5
    padding_p: float = 0.5
    sensitivity_mode: SensitivityMode = "true"
    clip: float | None = None
    history_budget: float = 0.5

    def __post_init__(self) -> None:
        check_choice(self.privacy_mode, "privacy_mode", PRIVACY_MODES)
        check_choice(self.noise, "noise", NOISE_KINDS)
        check_positive(self.epsilon_train, "epsilon_train")
        _check_delta(self.delta_train, "delta_train")
        check(0 <= self.padding_p < 1, "padding_p",
              f"got {self.padding_p!r}, expected a probability 0 <= p < 1")
        check_choice(self.sensitivity_mode, "sensitivity_mode", SENSITIVITY_MODES)
        check(0 < self.history_budget < 1, "history_budget",
              f"got {self.history_budget!r}, expected 0 < share < 1")
        if self.privacy_mode == "paper":
            if self.clip is not None:
                raise ConfigError("'clip' applies to privaterec only with privacy_mode "
                                  "'strict' (the clip of the history-path gradient)")
        elif self.clip is None:  # strict mode's default bound, stated in the saved config
            object.__setattr__(self, "clip", PRIVATEREC_STRICT_CLIP)
        else:
            check_positive(self.clip, "clip")


@dataclass(frozen=True, kw_only=True)
class DPFedAvgSettings(MethodSettings):
    """DP-FedAvg (McMahan et al. 2018): central, user-level DP. Every user joins a round with
    probability q (``FedConfig.client_fraction``); each sampled update is clipped to L2 norm
    C and the server adds Gaussian noise of standard deviation z·C to the sum.

    Attributes
    ----------
    clip: C (see BENCHMARKS.md for 0.1).
    noise_multiplier: z. ``None``: calibrated from ``target_epsilon`` when the run is resolved
        (:func:`privaterec.fed.methods.resolve_run_config`), so a saved configuration states it.
    target_epsilon: the user-level ε of the whole run (``None``: z is given and the report
        states the ε it reaches). One of the two is required; with both, z must reach it.
    target_delta: δ of the run's guarantee (it must be below 1/N for N training users).
    adaptive_clip_quantile, clip_lr, clip_count_stddev: adaptive clipping (Andrew et al.,
        NeurIPS 2021), one group: the clip starts at ``clip`` and follows the quantile
        γ = ``adaptive_clip_quantile`` of the clients' update norms (``None``: a fixed clip),
        with geometric learning rate η_C = ``clip_lr`` (default :data:`DEFAULT_CLIP_LR`,
        stated once adaptive clipping is on) and noise σ_b = ``clip_count_stddev`` on the
        count of unclipped clients (``None``: the expected clients per round / 20, which
        depends on the population); the run's ε is unchanged (docs/privacy.md).
    secure_aggregation, noise_placement, max_dropouts: the Flower engine only, one group
        (:func:`check_secure_aggregation`): ``secaggplus`` sums the clipped updates with
        Flower's SecAgg+ so the server sees only the sum (``none``: it sees each one); the
        noise is added to the sum by the server (``central``) or in shares by the clients
        before masking (``distributed``); ``max_dropouts`` k: SecAgg+'s threshold is n − k,
        so a sum decodes only with at least n − k of the n sampled clients (and their noise
        shares) in it.
    clip_space: what each client clips and the aggregator noises. ``parameters`` (default):
        the gradient (DP-FedAvg). ``news_vectors``: the user-side gradient and the
        cotangents of the news vectors of the whole news table, turned into the
        news-encoder gradient by the server with one shared backward pass
        (:mod:`privaterec.fed.news_space`; the simulator, or Flower through SecAgg+; one
        local step, fixed clip).
    """

    method: ClassVar[str] = "dp-fedavg"

    clip: float = 0.1
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    target_delta: float = 1e-5
    adaptive_clip_quantile: float | None = None
    clip_lr: float | None = None
    clip_count_stddev: float | None = None
    secure_aggregation: SecureAggregation = "none"
    noise_placement: NoisePlacement = "central"
    max_dropouts: int = 0
    clip_space: ClipSpace = "parameters"

    def __post_init__(self) -> None:
        check_positive(self.clip, "clip")
        check_choice(self.clip_space, "clip_space", CLIP_SPACES)
        if self.clip_space == "news_vectors" and self.adaptive_clip_quantile is not None:
            raise ConfigError("'clip_space' news_vectors (--clip-space) runs with a fixed "
                              "--clip only: drop --adaptive-clip-quantile, or use "
                              "--clip-space parameters")
        if self.noise_multiplier is not None:
            check_noise_multiplier(self.noise_multiplier)
        if self.target_epsilon is not None:
            check_positive(self.target_epsilon, "target_epsilon")
        _check_delta(self.target_delta, "target_delta", " (below 1/N)")
        if self.noise_multiplier is None and self.target_epsilon is None:
            raise ConfigError("dp-fedavg needs 'target_epsilon' (the user-level epsilon of the "
                              "whole run; CLI --target-epsilon) or 'noise_multiplier' (z; CLI "
                              "--noise-multiplier)")
        check_adaptive_clip(adaptive_clip_quantile=self.adaptive_clip_quantile,
                            clip_lr=self.clip_lr, clip_count_stddev=self.clip_count_stddev)
        if self.adaptive_clip_quantile is None:
            given = [k for k in ("clip_lr", "clip_count_stddev") if getattr(self, k) is not None]
            if given:
                raise ConfigError(f"{', '.join(repr(k) for k in given)} (CLI "
                                  f"{', '.join('--' + k.replace('_', '-') for k in given)}) "
                                  f"apply to adaptive clipping only: pass "
                                  f"--adaptive-clip-quantile too (e.g. 0.5), or drop them for "
                                  f"a fixed --clip")
        elif self.clip_lr is None:  # the default learning rate, stated in the saved config
            object.__setattr__(self, "clip_lr", DEFAULT_CLIP_LR)
        check_secure_aggregation(secure_aggregation=self.secure_aggregation,
                                 noise_placement=self.noise_placement,
                                 max_dropouts=self.max_dropouts,
                                 adaptive=self.adaptive_clip_quantile is not None)


@dataclass(frozen=True, kw_only=True)
class UniFedRecSettings(MethodSettings):
    """Uni-FedRec's LDP upload of the recall model's gradient (Eq. 8; §4.1's θ = 0.1,
    λ_g = 0.01).

    Attributes
    ----------
    clipping: ``l1`` (scale the gradient to L1 norm θ: ε = 2θ/λ_g per round), ``elementwise``
        (clamp every coordinate to [−θ, θ] as FedNewsRec: ε = 2θD/λ_g) or ``none`` (the raw
        gradient: no guarantee, needs λ_g = 0).
    clip: θ. noise_scale: λ_g, the Laplace scale per coordinate (0: no noise).
    """

    method: ClassVar[str] = "unifedrec"

    clipping: GradientClipping = "l1"
    clip: float = 0.1
    noise_scale: float = 0.01

    def __post_init__(self) -> None:
        check_choice(self.clipping, "clipping", GRADIENT_CLIPPINGS)
        check_positive(self.clip, "clip")
        check(0 <= self.noise_scale < math.inf, "noise_scale",
              f"got {self.noise_scale!r}, expected a finite number >= 0")
        if self.clipping == "none" and self.noise_scale:
            raise ConfigError(f"invalid 'noise_scale' {self.noise_scale!r} with clipping "
                              f"'none': expected 0 (noise on an unbounded gradient gives no "
                              f"guarantee; use clipping 'l1')")


SETTINGS: dict[str, type[MethodSettings]] = {
    cls.method: cls for cls in (FedRecSettings, FedNewsRecSettings, DPFedRecSettings,
                                PrivateRecSettings, DPFedAvgSettings, UniFedRecSettings)}
"""Every federated method's name → its settings class (from the classes' ``method``)."""

LEGACY_FLAT_KEYS: frozenset[str] = frozenset({
    "clip", "noise_scale", "epsilon_train", "delta_train", "noise", "padding_p",
    "privacy_mode", "sensitivity_mode", "history_budget", "noise_multiplier",
    "target_epsilon", "target_delta", "adaptive_clip_quantile", "clip_lr",
    "clip_count_stddev", "secure_aggregation", "noise_placement", "max_dropouts"})
"""The method settings that earlier versions kept as flat ``fed.*`` keys of one FedConfig
(:func:`privaterec.config.fed_from_mapping` reads such files)."""


def settings_type(method: str) -> type[MethodSettings]:
    """The settings class of the federated method ``method``.

    Raises
    ------
    ConfigError
        If ``method`` is not a federated method.
    """
    try:
        return SETTINGS[method]
    except KeyError:
        raise ConfigError(f"method {method!r} is not a federated method (federated: "
                          f"{', '.join(SETTINGS)})") from None


__all__ = ["DPFedAvgSettings", "DPFedRecSettings", "FedNewsRecSettings", "FedRecSettings",
           "CLIP_SPACES", "ClipSpace", "DEFAULT_CLIP_LR", "GRADIENT_CLIPPINGS",
           "GradientClipping", "NOISE_PLACEMENTS",
           "NoisePlacement", "SECURE_AGGREGATIONS", "SecureAggregation",
           "check_secure_aggregation", "LEGACY_FLAT_KEYS", "MethodSettings",
           "NOISE_KINDS", "NoiseKind", "PRIVACY_MODES", "PRIVATEREC_STRICT_CLIP",
           "PrivacyMode", "PrivateRecSettings", "SENSITIVITY_MODES", "SETTINGS",
           "SensitivityMode", "UniFedRecSettings", "settings_type"]
