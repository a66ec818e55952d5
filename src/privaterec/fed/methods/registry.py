"""The registry of the federated ranking methods: a run configuration → its method.

Each method class owns its configuration: its settings (``settings_type``, read from
``FedConfig.settings``), its defaults of the engine settings a configuration leaves open
(``server_defaults``), its rules (``resolve``) and how it is built (``from_config``). Adding a
method is an entry in :data:`METHODS`, not a branch here or in the engine.
"""

from __future__ import annotations

from typing import Any, Protocol

from privaterec.config import RunConfig
from privaterec.errors import ConfigError
from privaterec.fed.methods.base import ClientMethod
from privaterec.fed.methods.dp_fedavg import CentralDP
from privaterec.fed.methods.privaterec import PrivateRec
from privaterec.fed.methods.ranking import DPFedRec, FedNewsRec, FedRec
from privaterec.fed.strategies import ServerDefaults
from privaterec.method_settings import MethodSettings


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


METHODS: dict[str, RunMethod] = {
    cls.name: cls for cls in (FedRec, FedNewsRec, DPFedRec, PrivateRec, CentralDP)}
"""Every federated ranking method: its name → its class."""


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


__all__ = ["METHODS", "RunMethod", "method_from_config", "resolve_run_config"]
