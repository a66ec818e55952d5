"""The noise mechanisms, one module each: the registry every calibration, draw and event uses.

A module of this package that defines ``MECHANISM`` (a
:class:`~privaterec.privacy.noise.base.NoiseMechanism`) adds it: its name is then accepted by
``calibrate``, the methods' ``noise`` settings, the CLI's ``--noise``, the ledger and
``privaterec privacy calibrate`` (docs/architecture.md, "How to add a noise mechanism").
"""

from __future__ import annotations

import importlib
import pkgutil

from privaterec.errors import ConfigError
from privaterec.privacy.noise.base import NoiseMechanism

MECHANISMS: dict[str, NoiseMechanism] = {}
"""Name → mechanism, in the order of the modules' names."""

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base"):
    _mechanism = importlib.import_module(f"{__name__}.{_module}").MECHANISM
    MECHANISMS[_mechanism.name] = _mechanism

NOISE_KINDS: tuple[str, ...] = tuple(sorted(MECHANISMS, key=lambda n: n != "laplace"))
"""The mechanisms' names, the default (``laplace``) first: the choices of ``--noise``."""


def noise_mechanism(name: str, what: str = "mechanism") -> NoiseMechanism:
    """The mechanism called ``name``; :class:`ConfigError` naming ``what`` otherwise."""
    try:
        return MECHANISMS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"invalid '{what}': got {name!r}, expected one of "
                          f"{', '.join(repr(n) for n in NOISE_KINDS)}") from None


__all__ = ["MECHANISMS", "NOISE_KINDS", "NoiseMechanism", "noise_mechanism"]
