"""Checks of configuration values, shared by every frozen config's ``__post_init__``.

Each check raises :class:`privaterec.errors.ConfigError` naming the parameter and the
accepted values. Choice fields are typed with a ``Literal`` alias whose values are also the
tuple of accepted choices (``typing.get_args``); :func:`check_choice` returns the value
narrowed to that ``Literal``.
"""

from __future__ import annotations

import math
import numbers
from typing import NoReturn, TypeGuard, TypeVar

from privaterec.errors import ConfigError

C = TypeVar("C", bound=str)


def check(condition: bool, name: str, message: str) -> None:
    """Raise ``ConfigError("invalid configuration value '<name>': <message>")`` unless
    ``condition`` holds."""
    if not condition:
        raise ConfigError(f"invalid configuration value '{name}': {message}")


def check_choice(value: object, name: str, choices: tuple[C, ...], *,
                 kind: str = "configuration value") -> C:
    """Return ``value`` as one of ``choices`` (its ``Literal`` type), or raise ``ConfigError``
    (``"invalid <kind> '<name>': got ..., expected one of ..."``) listing them."""
    for choice in choices:
        if value == choice:
            return choice
    fail(name, value, f"one of {', '.join(choices)}", kind=kind)


def fail(name: str, value: object, expected: str, *,
         kind: str = "privacy parameter") -> NoReturn:
    """Raise ``ConfigError("invalid <kind> '<name>': got <value!r>, expected <expected>")``
    (``kind=""``: ``"invalid '<name>': ..."``)."""
    raise ConfigError(f"invalid {kind + ' ' if kind else ''}'{name}': got {value!r}, expected "
                      f"{expected}")


def check_in(value: object, name: str, low: float, high: float, expected: str, *,
             open_low: bool = False, open_high: bool = True,
             kind: str = "privacy parameter") -> None:
    """:func:`fail` unless ``value`` is a real number from ``low`` to ``high`` (excluded when
    ``open_low`` / ``open_high``; NaN fails)."""
    if not (is_real(value) and (low < value if open_low else low <= value)
            and (value < high if open_high else value <= high)):
        fail(name, value, expected, kind=kind)


def check_positive(value: float, name: str) -> None:
    """Raise ``ConfigError`` unless ``value > 0``."""
    check(value > 0, name, f"got {value!r}, expected a positive number")


def check_positive_int(value: object, name: str) -> None:
    """Raise ``ConfigError`` unless ``value`` is an ``int`` > 0."""
    check(isinstance(value, int) and value > 0, name,
          f"got {value!r}, expected a positive integer")


def is_real(value: object) -> TypeGuard[float]:
    """True when ``value`` is a real number: any ``numbers.Real`` (``int``, ``float``, numpy
    scalars; ``bool`` too). Narrows an untyped value (JSON, ``getattr``) to ``float`` for the
    comparisons that follow."""
    return isinstance(value, numbers.Real)


def is_integer(value: object) -> TypeGuard[int]:
    """True when ``value`` is an integer: any ``numbers.Integral`` (``int``, numpy integers;
    ``bool`` too). Narrows an untyped value to ``int``."""
    return isinstance(value, numbers.Integral)


def check_adaptive_clip(*, adaptive_clip_quantile: float | None, clip_lr: float | None,
                        clip_count_stddev: float | None) -> None:
    """Check the settings of DP-FedAvg's adaptive clipping (Andrew et al., NeurIPS 2021).

    Parameters
    ----------
    adaptive_clip_quantile:
        γ, the quantile of the clients' update norms the clip follows, 0 < γ < 1
        (CLI ``--adaptive-clip-quantile``); None: a fixed clip.
    clip_lr:
        η_C > 0, the clip's geometric learning rate (``--clip-lr``); None: the default.
    clip_count_stddev:
        σ_b > 0, the noise on the count of unclipped clients (``--clip-count-stddev``);
        None: the default (expected clients per round / 20).

    Raises
    ------
    ConfigError
        Naming the field, its flag and the accepted values.
    """
    if adaptive_clip_quantile is not None:
        check(is_real(adaptive_clip_quantile) and 0 < adaptive_clip_quantile < 1,
              "adaptive_clip_quantile", f"got {adaptive_clip_quantile!r}, expected a quantile "
              f"0 < gamma < 1 (--adaptive-clip-quantile; e.g. 0.5, the median update norm)")
    if clip_lr is not None:
        check(is_real(clip_lr) and 0 < clip_lr < float("inf"), "clip_lr",
              f"got {clip_lr!r}, expected a finite learning rate > 0 (--clip-lr; the "
              f"paper's 0.2)")
    if clip_count_stddev is not None:
        check(is_real(clip_count_stddev) and 0 < clip_count_stddev < float("inf"),
              "clip_count_stddev", f"got {clip_count_stddev!r}, expected a finite noise "
              f"standard deviation > 0 (--clip-count-stddev)")


MIN_NOISE_MULTIPLIER = 0.1
"""The smallest z of DP-FedAvg the accountant takes. The PLD of a Gaussian grows as 1/z²
(z = 0.1: 1.1 GB and 28 s for q = 0.02, T = 100, at ε ≈ 490; z = 1e-4 asked dp-accounting
for 3.65 TiB), and below it the guarantee is void anyway (ε in the hundreds)."""


def check_noise_multiplier(value: float, name: str = "noise_multiplier") -> None:
    """z finite and >= :data:`MIN_NOISE_MULTIPLIER`, or a :class:`ConfigError` naming ``name``."""
    check(is_real(value) and MIN_NOISE_MULTIPLIER <= value < math.inf, name,
          f"got {value!r}, expected a finite z >= {MIN_NOISE_MULTIPLIER} (below it the "
          f"accountant's memory grows as 1/z^2 and epsilon is in the hundreds); for training "
          f"without noise use --method fedrec")


__all__ = ["MIN_NOISE_MULTIPLIER", "check", "check_adaptive_clip", "check_choice", "check_in",
           "check_noise_multiplier", "check_positive", "check_positive_int", "fail", "is_integer",
           "is_real"]
