"""The Flower App of privaterec: ``flwr run flower/`` trains a run directory like
``privaterec train``, with every client update computed by a Flower ClientApp on the
SuperNode holding the user (``flower/pyproject.toml``, docs/flower.md).

* ``server_app`` — trains the run directory ``out-dir`` with
  :func:`privaterec.runs.ranking.train_run` from ``public-dir`` (the news catalogue and
  the roster only; evaluation on the ``eval-data`` holdout or none), passing the SuperLink's Grid explicitly (the
  rounds go through :class:`privaterec.fed.flower.FlowerEngine` on that Grid);
* ``client_app`` — :func:`privaterec.fed.flower.make_client_app` with the run layer's
  device loader (:func:`privaterec.runs.engines.load_device`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from privaterec.config import FEDERATED_METHODS, RunConfig, fed_with_changes, replace
from privaterec.errors import ConfigError
from privaterec.fed.flower.client_app import make_client_app
from privaterec.fed.methods import resolve_run_config
from privaterec.runs.engines import load_device
from privaterec.runs.ranking import train_run


_FLOWER_KEYS: dict[str, tuple[str, type, Any]] = {
    "method": ("train", str, ""), "seed": ("train", int, -1), "rounds": ("fed", int, 0),
    "clients-per-round": ("fed", int, 0), "eval-every": ("fed", int, -1),
    "secure-aggregation": ("fed", str, ""), "noise-placement": ("fed", str, ""),
    "max-dropouts": ("fed", int, -1), "evaluation": ("fed", str, ""),  # server | federated
    "eval-epsilon": ("fed", float, 0), "eval-clip": ("fed", float, 0),
    "eval-fraction": ("fed", float, 0)}
"""The run-config keys of :func:`run_config_from_flower` that set a configuration key:
key → (``train`` or ``fed``, its type, the value that leaves the configuration's)."""


def run_config_from_flower(run_config: Mapping[str, Any]) -> tuple[RunConfig, Path, bool]:
    """The run configuration, run directory and ``drop_missing`` of a ``flwr run``.

    Keys (``[tool.flwr.app.config]`` in ``flower/pyproject.toml``, overridden by
    ``--run-config``): ``out-dir`` and one of ``public-dir`` (a public directory holding
    only the news catalogue and the roster, :mod:`privaterec.data.roster`: the server holds
    no user data) or ``data-dir`` (a data directory the server reads, for a rehearsal on
    public data) (absolute paths, required), ``config``
    (a privaterec YAML, optional), ``method``, ``rounds``, ``clients-per-round``,
    ``seed``, ``eval-every``, and for ``dp-fedavg`` ``secure-aggregation``,
    ``noise-placement`` and ``max-dropouts``, ``evaluation`` (``federated``: the devices
    evaluate, docs/privacy.md#federated-evaluation) with ``eval-epsilon``, ``eval-clip``
    and ``eval-fraction`` (``""``, ``0`` or ``-1``: keep the YAML's value or the default),
    ``drop-missing``. The ServerApp also reads ``seeded-rehearsal``
    (:func:`~privaterec.runs.ranking.train_run`).

    Raises
    ------
    ConfigError
        If a path is missing or relative, or the method is not federated.
    """
    paths = {}
    public, data = str(run_config.get("public-dir", "")), str(run_config.get("data-dir", ""))
    if public and data:
        raise ConfigError("run config: give public-dir (the catalogue and roster: the server "
                          "holds no user data) or data-dir, not both")
    for key in ("public-dir" if public else "data-dir", "out-dir"):
        value = str(run_config.get(key, ""))
        if not value or not Path(value).is_absolute():
            raise ConfigError(f"run config '{key}' must be an absolute path, got {value!r}; "
                              f"pass --run-config \"{key}='/abs/path'\" to flwr run")
        paths[key] = value
    yaml_path = str(run_config.get("config", ""))
    config = RunConfig.from_yaml(yaml_path) if yaml_path else RunConfig()
    train: dict[str, Any] = {}
    fed: dict[str, Any] = {}
    for key, (section, kind, unset) in _FLOWER_KEYS.items():
        value = kind(run_config.get(key, unset))
        if value != unset:
            (train if section == "train" else fed)[key.replace("-", "_")] = value
    method = train.get("method", config.train.method)
    if method not in FEDERATED_METHODS:
        raise ConfigError(f"run config 'method' must be one of {', '.join(FEDERATED_METHODS)}"
                          f" (got {method!r}); pass --run-config "
                          f"\"method='fednewsrec'\" or set train.method in the YAML")
    config = replace(config, data=paths.get("public-dir") or paths["data-dir"],
                     train=replace(config.train, **train),
                     fed=fed_with_changes(config.fed, method, {"engine": "flower", **fed}))
    return (resolve_run_config(config), Path(paths["out-dir"]),
            bool(run_config.get("drop-missing", False)))


def eval_data_from_flower(run_config: Mapping[str, Any]) -> Path | None:
    """The run-config key ``eval-data``: the absolute path of a public or consented
    holdout the server evaluates on (with ``public-dir``); ``None`` when empty.

    Raises
    ------
    ConfigError
        If the path is relative.
    """
    value = str(run_config.get("eval-data", ""))
    if not value:
        return None
    if not Path(value).is_absolute():
        raise ConfigError(f"run config 'eval-data' must be an absolute path, got {value!r}")
    return Path(value)


def check_server_data(run_config: Mapping[str, Any]) -> None:
    """Refuse a deployed server that would read user data: ``data-dir`` (a data directory
    with the users' impressions) only with ``seeded-rehearsal = true``, a simulation or a
    check against the simulator on public data; a deployment gives ``public-dir``
    (docs/privacy.md#threat-model).

    Raises
    ------
    ConfigError
        For ``data-dir`` without ``seeded-rehearsal = true``.
    """
    if str(run_config.get("data-dir", "")) and not seeded_rehearsal(run_config):
        raise ConfigError("run config 'data-dir' gives the server the users' impressions; a "
                          "deployed server holds public data only: write its public "
                          "directory with `privaterec data public-dir DATA --out DIR` and "
                          "pass \"public-dir='/abs/DIR'\" (add eval-data='/abs/HOLDOUT' to "
                          "evaluate on a public or consented holdout), or add "
                          "seeded-rehearsal=true for a simulation on public data")


def seeded_rehearsal(run_config: Mapping[str, Any]) -> bool:
    """The run-config key ``seeded-rehearsal``: ``true`` only as a boolean (TOML ``true``).

    Raises
    ------
    ConfigError
        For any other value than a boolean (e.g. the string ``'false'``, which ``bool()``
        would read as true and so seed a deployment).
    """
    value = run_config.get("seeded-rehearsal", False)
    if not isinstance(value, bool):
        raise ConfigError(f"run config 'seeded-rehearsal' must be true or false (unquoted), "
                          f"got {value!r}")
    return value


server_app = ServerApp()


@server_app.main()
def _flwr_run_main(grid: Grid, context: Context) -> None:
    """``flwr run flower/``: train the run directory ``out-dir`` like ``privaterec train``."""
    check_server_data(context.run_config)
    config, out, drop_missing = run_config_from_flower(context.run_config)
    metrics = train_run(config, out, drop_missing=drop_missing, progress=False, grid=grid,
                        seeded_rehearsal=seeded_rehearsal(context.run_config),
                        eval_data=eval_data_from_flower(context.run_config))
    test = metrics.get("test") or {}
    summary = ", ".join(f"{k}={v:.4f}" for k, v in test.items() if isinstance(v, float))
    logging.getLogger("flwr").info("privaterec: run written to %s %s", out, summary)


client_app = make_client_app(load_device)

__all__ = ["check_server_data", "client_app", "eval_data_from_flower", "run_config_from_flower", "seeded_rehearsal",
           "server_app"]
