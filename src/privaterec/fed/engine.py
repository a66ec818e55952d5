"""One entry point for federated training, whatever the engine (docs/architecture.md#seams).

:func:`train_federated_run` builds what every engine shares for a ranking run — the model
as a function of θ (:class:`~privaterec.fed.objective.LocalObjective`), the client method
and the server strategy — and runs them on an :class:`Engine`: the vectorized simulator
(:class:`SimulatorEngine`, the default) or Flower (``privaterec.fed.flower.FlowerEngine``,
passed in by the caller that chose it). Any task trains the same way through
:meth:`Engine.train`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from privaterec.config import FedConfig, RunConfig
from privaterec.data.clients import ClientDataset
from privaterec.errors import ConfigError
from privaterec.fed.evaluation import FederatedEvaluation
from privaterec.fed.methods import ClientMethod, method_from_config, resolve_run_config
from privaterec.fed.objective import LocalObjective
from privaterec.fed.sampling import clients_per_round
from privaterec.fed.simulator import FederatedState, RoundCallback, train_federated
from privaterec.fed.strategies import Strategy, build_strategy, with_pretrained_lr
from privaterec.fed.task import FederatedTask
from privaterec.models.recommender import Recommender

CheckpointCallback = Callable[[FederatedState], None]


class Engine(Protocol):
    """Runs a federated training job: the rounds of ``fed`` for ``task`` and ``method``.

    The simulator computes the clients' updates in process; Flower
    (:class:`privaterec.fed.flower.FlowerEngine`) sends them to the SuperNodes holding the
    clients. Both run :func:`~privaterec.fed.simulator.train_federated`'s loop.
    """

    def train(self, task: FederatedTask[Any], clients: ClientDataset, fed: FedConfig,
              method: ClientMethod, strategy: Strategy, *, seed: int,
              checkpoint_path: str | Path | None = None,
              on_evaluate: RoundCallback | None = None,
              on_checkpoint: CheckpointCallback | None = None, progress: bool = True,
              stop_after_rounds: int | None = None,
              checkpoint_extra: dict[str, Any] | None = None,
              evaluation: FederatedEvaluation | None = None) -> FederatedState: ...


class SimulatorEngine:
    """The vectorized in-process simulator: its :meth:`train` is
    :func:`~privaterec.fed.simulator.train_federated` itself, whose rounds are
    :func:`~privaterec.fed.simulator.simulate_round`."""

    train = staticmethod(train_federated)


def check_engine(method: ClientMethod, clients: ClientDataset, *, engine: str) -> None:
    """Refuse a federated run whose settings cannot hold for these training users, before
    anything is trained or written (central DP: δ below 1/N; the method's own rules,
    :meth:`~privaterec.fed.methods.base.ClientMethod.check_engine`: central DP runs on
    Flower only through secure aggregation, which runs on Flower only).

    Raises
    ------
    ConfigError
        Naming the setting and what to pass instead.
    """
    method.check_engine(engine)
    method.check_population(len(method.population(clients)))


def check_sampling(fed: FedConfig, population: int) -> None:
    """Refuse ``clients_per_round`` above the ``population`` a round samples from (it would
    be cut to the population silently, and the saved configuration would state a number no
    round used).

    Raises
    ------
    ConfigError
        Naming both numbers.
    """
    if fed.clients_per_round is not None and fed.clients_per_round > population:
        raise ConfigError(f"'fed.clients_per_round' (--clients-per-round) is "
                          f"{fed.clients_per_round}, but only {population} training users can "
                          f"take part in a round: pass at most {population}, or "
                          f"--client-fraction")


def check_run(config: RunConfig, clients: ClientDataset) -> None:
    """:func:`check_engine` and :func:`check_sampling` of a ranking run configuration."""
    config = resolve_run_config(config)
    method = method_from_config(config)
    check_engine(method, clients, engine=config.fed.engine)
    check_sampling(config.fed, len(method.population(clients)))


@dataclass
class FederatedJob:
    """What a ranking run trains federatedly: the task, the client method, the server
    strategy and the resolved settings (:func:`federated_job`)."""

    config: RunConfig
    task: LocalObjective
    method: ClientMethod
    strategy: Strategy

    def clients_per_round(self, clients: ClientDataset) -> int:
        """m, the clients sampled per round (the expected count for Poisson sampling)."""
        return clients_per_round(self.config.fed, len(self.method.population(clients)))

    def train(self, clients: ClientDataset, *, engine: Engine | None = None,
              checkpoint_path: str | Path | None = None, progress: bool = True,
              on_evaluate: RoundCallback | None = None,
              on_checkpoint: CheckpointCallback | None = None,
              stop_after_rounds: int | None = None,
              evaluation: FederatedEvaluation | None = None) -> FederatedState:
        """Run the job on ``engine`` (default: the simulator; ``fed.engine = "flower"``
        needs the Flower engine passed in); ``evaluation``: federated evaluation
        (:func:`~privaterec.fed.simulator.train_federated`)."""
        fed = self.config.fed
        check_engine(self.method, clients, engine=fed.engine)
        if engine is None:
            if fed.engine != "simulator":
                raise ConfigError(f"fed.engine = {fed.engine!r} needs its engine passed in "
                                  f"(privaterec.runs.engines.build_engine)")
            engine = SimulatorEngine()
        return engine.train(self.task, clients, fed, self.method, self.strategy,
                            seed=self.config.train.seed, checkpoint_path=checkpoint_path,
                            on_evaluate=on_evaluate, on_checkpoint=on_checkpoint,
                            progress=progress, stop_after_rounds=stop_after_rounds,
                            evaluation=evaluation)


def federated_job(config: RunConfig, model: Recommender, *,
                  progress: bool = True) -> FederatedJob:
    """The :class:`FederatedJob` of a ranking run configuration (resolved here if needed).

    ``model``: the global model with the training news table attached; its parameters are
    θ₀ and the final θ is loaded into it.
    """
    config = resolve_run_config(config)
    method = method_from_config(config)
    model.prepare_news_table(progress=progress)  # PLM: frozen MiniLM layers, once (tqdm)
    task = LocalObjective(model)
    strategy = with_pretrained_lr(build_strategy(config.fed), task.pretrained_mask(),
                                  config.train.plm_lr)
    return FederatedJob(config, task, method, strategy)


def train_federated_run(config: RunConfig, model: Recommender, clients: ClientDataset, *,
                        engine: Engine | None = None,
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
    engine: where the rounds run (default: the simulator).
    Other parameters: see :func:`privaterec.fed.simulator.train_federated`.
    """
    config = resolve_run_config(config)
    check_engine(method_from_config(config), clients, engine=config.fed.engine)
    return federated_job(config, model, progress=progress).train(
        clients, engine=engine, checkpoint_path=checkpoint_path, progress=progress,
        on_evaluate=on_evaluate, on_checkpoint=on_checkpoint,
        stop_after_rounds=stop_after_rounds)


__all__ = ["CheckpointCallback", "Engine", "FederatedJob", "SimulatorEngine", "check_engine",
           "check_run", "federated_job", "train_federated_run"]
