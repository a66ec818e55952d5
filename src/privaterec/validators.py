"""Checks of configuration values, shared by every frozen config's ``__post_init__``.

Each check raises :class:`privaterec.errors.ConfigError` naming the parameter and the
accepted values. Choice fields are typed with a ``Literal`` alias whose values are also the
tuple of accepted choices (``typing.get_args``); :func:`check_choice` returns the value
narrowed to that ``Literal``.
"""

from __future__ import annotations

import numbers
from typing import TypeGuard, TypeVar

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
    raise ConfigError(f"invalid {kind} '{name}': got {value!r}, expected one of "
                      f"{', '.join(choices)}")


def check_positive(value: float, name: str) -> None:
    """Raise ``ConfigError`` unless ``value > 0``."""
    check(value > 0, name, f"got {value!r}, expected a positive number")


def is_real(value: object) -> TypeGuard[float]:
    """True when ``value`` is a real number: any ``numbers.Real`` (``int``, ``float``, numpy
    scalars; ``bool`` too). Narrows an untyped value (JSON, ``getattr``) to ``float`` for the
    comparisons that follow."""
    return isinstance(value, numbers.Real)


def is_integer(value: object) -> TypeGuard[int]:
    """True when ``value`` is an integer: any ``numbers.Integral`` (``int``, numpy integers;
    ``bool`` too). Narrows an untyped value to ``int``."""
    return isinstance(value, numbers.Integral)


__all__ = ["check", "check_choice", "check_positive", "is_integer", "is_real"]
