"""Each federated method's own settings: one frozen, validated dataclass per method.

A run's :class:`~privaterec.config.FedConfig` holds the engine's settings (rounds, sampling,
the server's strategy, chunking, cadence, engine) and, in ``settings``, the settings of the
run's method: one of the classes below, chosen by the method's name (:func:`settings_type`).
Every field has a real default; a class validates its own fields and the rules between them
on construction, and raises :class:`~privaterec.errors.ConfigError` naming the field.

The method classes of :mod:`privaterec.fed.methods` declare the class they read
(``settings_type``) and are built from it; the registry finds them there
(:data:`privaterec.fed.methods.registry.CLASSES`). These dataclasses live here, in
the configuration layer, so that a ``config.yaml`` is read and checked without importing the
engine.

A method is declared here once: :data:`SETTINGS` (its settings classes by name) is the list
of the federated methods that ``config.py`` (``train.method``'s choices), the CLI
(``--method``) and the registry of method classes derive theirs from. Each field is a
:func:`setting`: its key in ``config.yaml`` (``fed.settings.<field>``) is its name, and its
command-line flag (``--`` and the name with dashes unless given) and help are declared with it;
``privaterec train``'s method flags are generated from them (:func:`setting_flags`), and
its help is the field's documentation.
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, NamedTuple, Sequence, get_args

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


_NOISE_HELP = "laplace (L1 clipping) or gaussian (L2, analytic)"
_EPSILON_TRAIN_HELP = "per-round epsilon of a client's upload (inf: no noise)"
_DELTA_TRAIN_HELP = "per-round delta, with gaussian noise (laplace is pure epsilon-DP)"


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


def setting(default: Any, help: str, *, flag: str | None = None,
            aliases: tuple[str, ...] = (), choices: tuple[str, ...] | None = None) -> Any:
    """A field of a method's settings with its command-line flag.

    Parameters
    ----------
    default: the field's default (a real one: every setting has a default).
    help: the flag's help, without the default (it is appended unless ``None``).
    flag: the flag (default ``--`` and the field's name with dashes); aliases: other flags.
    choices: the accepted values of a ``str`` field (a ``Literal`` field's are its type's).
    """
    return field(default=default, metadata={"help": help, "flag": flag, "aliases": aliases,
                                            "choices": choices})


@dataclass(frozen=True, kw_only=True)
class MethodSettings:
    """The settings of one federated method (a subclass per method; this base has none).

    ``method`` names the method (``TrainConfig.method``, or ``unifedrec``); ``task`` is the
    model it trains: ``ranking`` (``train.method`` of a :class:`~privaterec.config.RunConfig`)
    or ``recall`` (Uni-FedRec's recall model); ``title`` heads its flags in ``train --help``.
    """

    method: ClassVar[str] = ""
    task: ClassVar[Literal["ranking", "recall"]] = "ranking"
    title: ClassVar[str] = ""

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The names of its settings, in declaration order."""
        return tuple(f.name for f in fields(cls))


@dataclass(frozen=True, kw_only=True)
class FedRecSettings(MethodSettings):
    """FedRec: plain federated learning, raw updates (no setting of its own)."""

    method: ClassVar[str] = "fedrec"
    title: ClassVar[str] = "FedRec"


@dataclass(frozen=True, kw_only=True)
class FedNewsRecSettings(MethodSettings):
    """FedNewsRec (Qi et al. 2020, Eq. 4-5): element-wise clip to [−δ, δ] and Laplace(λ) per
    coordinate; the paper's δ = 0.005 and λ = 0.015.
    """

    method: ClassVar[str] = "fednewsrec"
    title: ClassVar[str] = "FedNewsRec"

    clip: float = setting(0.005, "element-wise bound delta")
    noise_scale: float = setting(0.015, "Laplace scale lambda > 0 (the D-dim update is "
                                        "2*delta*D/lambda-DP; fedrec for no noise)")

    def __post_init__(self) -> None:
        check_positive(self.clip, "clip")
        check(0 < self.noise_scale < math.inf, "noise_scale",
              f"got {self.noise_scale!r}; fednewsrec's noise_scale must be > 0 and finite "
              f"(its epsilon is 2*clip*D/noise_scale); use fedrec for no noise")


@dataclass(frozen=True, kw_only=True)
class DPFedRecSettings(MethodSettings):
    """DP-FedRec (PrivateRec §4's baseline): clip a client's whole update to norm θ and noise
    it at (ε_t, δ_t) per round.
    """

    method: ClassVar[str] = "dp-fedrec"
    title: ClassVar[str] = "DP-FedRec"

    clip: float = setting(0.005, "L1 (laplace) or L2 (gaussian) norm bound theta")
    noise: NoiseKind = setting("laplace", _NOISE_HELP, choices=NOISE_KINDS)
    epsilon_train: float = setting(math.inf, _EPSILON_TRAIN_HELP)
    delta_train: float = setting(1e-5, _DELTA_TRAIN_HELP, aliases=("--delta",))

    def __post_init__(self) -> None:
        check_positive(self.clip, "clip")
        check_choice(self.noise, "noise", NOISE_KINDS)
        check_positive(self.epsilon_train, "epsilon_train")
        _check_delta(self.delta_train, "delta_train")


@dataclass(frozen=True, kw_only=True)
class PrivateRecSettings(MethodSettings):
    """PrivateRec (Alg. 2-3): DPA on the user's attention, the label release, and in strict
    mode the history-path gradient clipped and noised too.
    """

    method: ClassVar[str] = "privaterec"
    title: ClassVar[str] = "PrivateRec"

    privacy_mode: PrivacyMode = setting(
        "strict", "strict: the history-path gradient is clipped and noised too, so epsilon "
                  "is a guarantee; paper: Alg. 3 as published, to reproduce its tables (that "
                  "gradient is uploaded raw: NOT a guarantee, user-level epsilon = inf)")
    noise: NoiseKind = setting("laplace", _NOISE_HELP, choices=NOISE_KINDS)
    epsilon_train: float = setting(math.inf, _EPSILON_TRAIN_HELP)
    delta_train: float = setting(1e-5, _DELTA_TRAIN_HELP, aliases=("--delta",))
    padding_p: float = setting(0.5, "behaviour padding probability p (Alg. 2; it only buys "
                                      "amplification: a run without noise pads nothing)")
    sensitivity_mode: SensitivityMode = setting(
        "true", "DPA sensitivity: true (simplex) or paper (invalid, reproduction only)")
    clip: float | None = setting(None, f"strict mode: bound C of the history-path gradient "
                                       f"(default {PRIVATEREC_STRICT_CLIP:g}; paper mode "
                                       f"clips nothing)")
    history_budget: float = setting(
        0.5, "strict mode: share of epsilon_t (and delta_t) for the history-path gradient; "
             "DPA gets the rest")

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
    """

    method: ClassVar[str] = "dp-fedavg"
    title: ClassVar[str] = ("central DP, user-level DP-FedAvg: Poisson sampling at rate "
                            "--client-fraction, each update clipped to L2 norm --clip, "
                            "Gaussian noise on the sum")

    clip: float = setting(0.1, "L2 norm bound C of each update")
    noise_multiplier: float | None = setting(
        None, "z: noise std z*clip on the sum (instead of --target-epsilon; the report gives "
              "the epsilon; unset: calibrated from --target-epsilon and saved in the run's "
              "configuration)")
    target_epsilon: float | None = setting(
        None, "user-level epsilon of the whole run; the noise multiplier is calibrated from "
              "it (PLD accountant)")
    target_delta: float = setting(1e-5, "delta of the run's guarantee (must be < 1/N)")
    adaptive_clip_quantile: float | None = setting(
        None, "adaptive clipping (Andrew et al. 2021): the clip starts at --clip and follows "
              "this quantile of the update norms, e.g. 0.5 (default: off, a fixed clip); the "
              "run's epsilon is unchanged, the count's noise is taken from the update's")
    clip_lr: float | None = setting(None, f"adaptive clipping: geometric learning rate of "
                                          f"the clip (default {DEFAULT_CLIP_LR:g})")
    clip_count_stddev: float | None = setting(
        None, "adaptive clipping: noise std on the count of unclipped clients, > z/2 "
              "(default: expected clients per round / 20)")
    secure_aggregation: SecureAggregation = setting(
        "none", "--engine flower only: secaggplus sums the clipped updates with Flower's "
                "SecAgg+, so the server sees only the sum (none: it sees each update)")
    noise_placement: NoisePlacement = setting(
        "central", "with secaggplus: central (the server adds the noise to the sum) or "
                   "distributed (each client adds its share before masking)")
    max_dropouts: int = setting(
        0, "with secaggplus: k clients a round may lose; the sum decodes only with at least "
           "n - k of the n sampled clients (and their noise shares) in it")
    clip_space: ClipSpace = setting(
        "parameters", "what a client clips: parameters (its gradient) or news_vectors (its "
                      "user-side gradient and the cotangents of the news vectors; the server "
                      "forms the news-encoder gradient in one shared pass: a round costs about "
                      "a non-private one; --local-steps 1, fixed --clip; on Flower through "
                      "SecAgg+, each device then uploads D_U + (news in the table) x d "
                      "coordinates)")

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
    """

    method: ClassVar[str] = "unifedrec"
    task: ClassVar[Literal["ranking", "recall"]] = "recall"
    title: ClassVar[str] = "Uni-FedRec"

    clipping: GradientClipping = setting(
        "l1", "how uploads are clipped to theta (--clip): l1 (epsilon = 2*theta/lambda_g per "
              "round), elementwise (every coordinate to [-theta, theta]: 2*theta*D/lambda_g) "
              "or none (no guarantee; needs --noise-scale 0)",
        flag="--gradient-clipping")
    clip: float = setting(0.1, "theta of the upload's clipping")
    noise_scale: float = setting(0.01, "lambda_g, the Laplace scale per coordinate of the "
                                       "upload (0: no noise)")

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
"""Every federated method's name → its settings class (from the classes' ``method``): the one
list of the federated methods."""

RANKING_METHODS: tuple[str, ...] = tuple(m for m, s in SETTINGS.items() if s.task == "ranking")
"""The federated methods that train the ranking model (``train.method`` of a run)."""


class SettingFlag(NamedTuple):
    """The command-line flag of the setting ``dest`` of one or more ``methods``: its
    ``flags`` (the first, then aliases), the ``type`` and ``choices`` of its value, and its
    ``help`` (each method's meaning and default)."""

    dest: str
    flags: tuple[str, ...]
    type: type
    choices: tuple[str, ...] | None
    help: str
    methods: tuple[str, ...]


def setting_flags(kinds: Sequence[type[Any]] | None = None) -> tuple[SettingFlag, ...]:
    """The flag of every :func:`setting` of the dataclasses ``kinds`` (default: every
    method's settings, :data:`SETTINGS`, whose every field is one), in declaration order; a
    setting of several methods (e.g. ``clip``) is one flag whose help gives each method's
    meaning. The help ends with the default unless it is ``None`` or the help names one.

    Raises
    ------
    TypeError
        If a method's field is not a setting, or two methods declare a setting of one name
        with different flags or types.
    """
    declared: dict[str, list[tuple[str, Any, Any]]] = {}
    for kind in SETTINGS.values() if kinds is None else kinds:
        hints = typing.get_type_hints(kind)
        for f in fields(kind):
            if "help" in f.metadata:
                declared.setdefault(f.name, []).append((getattr(kind, "method", ""), f,
                                                        hints[f.name]))
            elif kinds is None:
                raise TypeError(f"{kind.__name__}.{f.name} has no command-line flag: declare "
                                f"it with setting(default, help)")
    flags = []
    for name, entries in declared.items():
        forms = {(_flags(name, f), *_value_type(name, hint, f)) for _, f, hint in entries}
        if len(forms) != 1:
            raise TypeError(f"the setting {name!r} has different flags or types: {forms}")
        ((names, kind, choices),) = forms
        texts: dict[str, list[str]] = {}
        for method, f, _ in entries:
            text, default = f.metadata["help"], f.default
            if default is not None and "default" not in text:
                text += f" (default {f'{default:g}' if isinstance(default, float) else default})"
            texts.setdefault(text, []).append(method)
        help = (next(iter(texts)) if len(entries) == 1 else
                "; ".join(f"{', '.join(methods)}: {text}" for text, methods in texts.items()))
        flags.append(SettingFlag(name, names, kind, choices, help,
                                 tuple(method for method, _, _ in entries)))
    return tuple(flags)


def _flags(name: str, f: Any) -> tuple[str, ...]:
    return (f.metadata.get("flag") or "--" + name.replace("_", "-"),
            *f.metadata.get("aliases", ()))


def _value_type(name: str, hint: Any, f: Any) -> tuple[type, tuple[str, ...] | None]:
    """The type of a setting's command-line value (``None`` stripped) and its choices."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [a for a in get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is Literal:
        return str, get_args(hint)
    if hint in (float, int, bool, str):  # a bool is a --flag/--no-flag pair
        return hint, f.metadata.get("choices")
    raise TypeError(f"the setting {name!r} has no command-line form ({hint!r}): declare a "
                    f"float, an int, a bool, a str or a Literal")


def setting_flag(name: str, kinds: Sequence[type[Any]] | None = None) -> str:
    """The command-line flag of the setting ``name`` of ``kinds`` (default: the methods';
    ``clipping`` → ``--gradient-clipping``), or ``--`` and ``name`` with dashes for any other
    key."""
    for flag in setting_flags(kinds):
        if flag.dest == name:
            return flag.flags[0]
    return "--" + name.replace("_", "-")


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
           "PrivacyMode", "PrivateRecSettings", "RANKING_METHODS", "SENSITIVITY_MODES",
           "SETTINGS", "SensitivityMode", "SettingFlag", "UniFedRecSettings", "setting",
           "setting_flag", "setting_flags", "settings_type"]
