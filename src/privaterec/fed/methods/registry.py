"""The registry of the federated methods: a run configuration → its method.

Each method class owns its configuration: its settings (``settings_type``, read from
``FedConfig.settings``), its defaults of the engine settings a configuration leaves open
(``server_defaults``), its rules (``resolve``) and how it is built (``from_config``). The
registry finds every class of this package's modules that declares its own
``settings_type``: adding a method is its settings (:mod:`privaterec.method_settings`) and
its class in a module here, not an entry here or a branch in the engine.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any, Protocol, cast

from privaterec.config import RunConfig
from privaterec.errors import ConfigError
from privaterec.fed.methods.base import ClientMethod
from privaterec.fed.strategies import ServerDefaults
from privaterec.method_settings import SETTINGS, MethodSettings


class RunMethod(Protocol):
    """A method class as the registry sees it: the class object, its class attributes and
    class methods."""

    @property
    def name(self) -> str: ...

    @property
    def settings_type(self) -> type[MethodSettings]: ...

    @property
    def server_defaults(self) -> ServerDefaults: ...

    def resolve(self, config: RunConfig) -> RunConfig: ...

    def from_config(self, config: RunConfig) -> ClientMethod[Any]: ...


def _method_classes() -> dict[str, type[ClientMethod[Any]]]:
    """Every method class of this package's modules by its name, in the order of
    :data:`~privaterec.method_settings.SETTINGS`: a class that declares its own
    ``settings_type`` (a subclass such as ``PrivateRecStrict`` inherits its parent's).

    Raises
    ------
    TypeError
        If a declared method has no class or two, or a class's name is not its settings'.
    """
    found: dict[str, list[type[ClientMethod[Any]]]] = {}
    for name in sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])):
        module = importlib.import_module(f"{__package__}.{name}")
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, ClientMethod)
                    and "settings_type" in vars(value) and value.__module__ == module.__name__):
                found.setdefault(value.settings_type.method, []).append(value)
    wrong = {m: c for m, c in found.items() if len(c) != 1 or c[0].name != m}
    if set(found) != set(SETTINGS) or wrong:
        raise TypeError(f"every method of privaterec.method_settings.SETTINGS needs one class "
                        f"of its name in privaterec.fed.methods: declared {sorted(SETTINGS)}, "
                        f"found {sorted(found)}{f', wrong {wrong}' if wrong else ''}")
    return {method: found[method][0] for method in SETTINGS}


CLASSES: dict[str, type[ClientMethod[Any]]] = _method_classes()
"""Every federated method: its name → its class (Uni-FedRec's included)."""

METHODS: dict[str, RunMethod] = {
    name: cast(RunMethod, cls) for name, cls in CLASSES.items()
    if cls.settings_type.task == "ranking"}
"""Every federated ranking method: its name → its class (built from a run configuration)."""


def resolve_run_config(config: RunConfig) -> RunConfig:
    """Fill the settings a method leaves to its defaults (no-op for a method that is not
    federated), so that a saved configuration states every value used.

    Raises
    ------
    ConfigError
        If a setting does not hold for the method (e.g. ``local_steps`` > 1 for privaterec).
    """
    method = METHODS.get(config.train.method)
    return config if method is None else method.resolve(config)


def method_from_config(config: RunConfig) -> ClientMethod[Any]:
    """The client method of a resolved run configuration.

    Raises
    ------
    ConfigError
        If the configuration's method is not a federated method.
    """
    name = config.train.method
    if name not in METHODS:
        raise ConfigError(f"method {name!r} is not a federated method")
    return METHODS[name].from_config(config)


__all__ = ["CLASSES", "METHODS", "RunMethod", "method_from_config", "resolve_run_config"]
