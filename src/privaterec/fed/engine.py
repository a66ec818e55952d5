"""One entry point for federated training, whatever the engine (DESIGN §2).

Builds the pieces every engine shares — the model as a function of θ
(:class:`~privaterec.fed.objective.LocalObjective`), the client method and the server
strategy — and runs them on the vectorized simulator or on Flower.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from privaterec.config import RunConfig
from privaterec.data.clients import ClientDataset
from privaterec.errors import ConfigError
from privaterec.fed.methods import ClientMethod, resolve_run_config
from privaterec.fed.objective import LocalObjective
from privaterec.fed.simulator import (FederatedState, RoundCallback, clients_per_round,
                                      eligible_clients, train_federated)
from privaterec.fed.strategies import build_strategy, with_pretrained_lr
from privaterec.models.recommender import Recommender

CheckpointCallback = Callable[[FederatedState, dict[str, Any]], None]


def check_run(config: RunConfig, clients: ClientDataset) -> None:
    """Refuse a federated run whose settings cannot hold for these training users, before
    anything is trained or written (central DP: δ must be below 1/N; simulator only).

    Raises
    ------
    ConfigError
        Naming the setting and what to pass instead.
    """
    config = resolve_run_config(config)
    method = ClientMethod.from_config(config)
    if not method.is_central:
        return
    if config.fed.engine == "flower":
        raise ConfigError("dp-fedavg (central DP) runs on the simulator only for now: on "
                          "Flower the server's noise on the sum and secure aggregation are "
                          "not wired yet; use --engine simulator")
    population = len(eligible_clients(clients))
    if not method.delta < 1 / max(1, population):
        raise ConfigError(f"dp-fedavg's 'fed.target_delta' = {method.delta:g} is not below "
                          f"1/N = {1 / max(1, population):.3g} for N = {population} training "
                          f"users: a delta that large allows releasing a user's data "
                          f"outright; pass --target-delta below {1 / max(1, population):.3g}")


def train_federated_run(config: RunConfig, model: Recommender, clients: ClientDataset, *,
                        checkpoint_path: str | Path | None = None, progress: bool = True,
                        on_evaluate: RoundCallback | None = None,
                        on_checkpoint: CheckpointCallback | None = None,
                        stop_after_rounds: int | None = None) -> FederatedState:
    """Train ``model`` federatedly as ``config`` says; the final θ is loaded into ``model``.

    Parameters
    ----------
    config: a run configuration of a federated method (resolved here if needed).
    model: the global model with the training news table attached; its parameters are θ₀.
    clients: the training users.
    on_checkpoint: called with the state and the release description (for ``privacy.json``).
    Other parameters: see :func:`privaterec.fed.simulator.train_federated`.
    """
    config = resolve_run_config(config)
    fed = config.fed
    model.prepare_news_table(progress=progress)  # PLM: frozen MiniLM layers, once (tqdm)
    objective = LocalObjective(model)
    method = ClientMethod.from_config(config)
    strategy = with_pretrained_lr(build_strategy(fed), objective.pretrained_mask(),
                                  config.train.plm_lr)
    check_run(config, clients)
    m = clients_per_round(fed, len(eligible_clients(clients,
                                                    by_impressions=method.is_privaterec)))
    release = method.release(dimension=objective.dimension,
                             noised_parameters=objective.parameter_names(),
                             clients_per_round=m,
                             client_fraction=m / max(1, clients.num_users))

    def checkpointed(state: FederatedState) -> None:
        if on_checkpoint is not None:
            on_checkpoint(state, release)

    if fed.engine == "flower":
        from privaterec.fed.flower import train_with_flower
        return train_with_flower(config, objective, clients, method, strategy,
                                 checkpoint_path=checkpoint_path, on_evaluate=on_evaluate,
                                 on_checkpoint=checkpointed, progress=progress,
                                 stop_after_rounds=stop_after_rounds)
    return train_federated(objective, clients, fed, method, strategy, seed=config.train.seed,
                           checkpoint_path=checkpoint_path, on_evaluate=on_evaluate,
                           on_checkpoint=checkpointed, progress=progress,
                           stop_after_rounds=stop_after_rounds)
