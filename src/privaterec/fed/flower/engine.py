"""The Flower engine: :class:`FlowerEngine`, the :class:`~privaterec.fed.engine.Engine` the
run layer passes to train on Flower — on a given Grid (a ``flwr run`` ServerApp,
:mod:`privaterec.apps.flower_app`), or in Flower's simulation runtime
(``flwr.simulation.run_simulation``, Ray backend, at most :data:`SIMULATION_CPUS` CPUs).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from privaterec.config import FedConfig
from privaterec.data.clients import ClientDataset
from privaterec.errors import PrivateRecError
from privaterec.fed.evaluation import FederatedEvaluation
from privaterec.fed.flower.client_app import DeviceLoader, make_client_app
from privaterec.fed.flower.server_app import ROUND_TIMEOUT, serve
from privaterec.fed.interrupt import sigint_sets, stop_grid_on
from privaterec.fed.methods.base import ClientMethod
from privaterec.fed.methods.dp_fedavg import CentralDP
from privaterec.fed.simulator import FederatedState, RoundCallback
from privaterec.fed.strategies import Strategy
from privaterec.fed.task import FederatedTask

MAX_SIMULATED_SUPERNODES = 100
"""Default number of simulated SuperNodes: one per user up to this many, else user blocks."""
SIMULATION_CPUS = 2
"""CPUs Ray may use in a simulated :class:`FlowerEngine` (one ClientApp worker per CPU)."""


class FlowerEngine:
    """Train through Flower: the same rounds as the simulator, client updates on SuperNodes.

    Parameters
    ----------
    load_device:
        How a ClientApp rebuilds the run's public task, method and its clients from the run's
        public files (:data:`DeviceLoader`).
    run_files:
        The run's public files (name → text) sent to every device before the first round.
    grid:
        A connected Grid (inside a ``flwr run`` ServerApp); ``None``: run the ServerApp and
        the ClientApps in Flower's simulation runtime (``run_simulation``, Ray backend,
        :data:`SIMULATION_CPUS` CPUs, one ClientApp worker per CPU).
    num_supernodes:
        Simulated SuperNodes (default: one per user, at most
        :data:`MAX_SIMULATED_SUPERNODES`, node ``p`` holding a contiguous block of users;
        with secure aggregation one per user whatever their number).
    deployed:
        With ``grid``: a deployment (the default; :func:`serve`), or ``False`` for a seeded
        rehearsal that equals the simulator (SuperNodes with ``os-entropy=false``; never
        with real users). Flower's simulation runtime is always seeded.
    """

    def __init__(self, load_device: DeviceLoader, run_files: Mapping[str, str], *,
                 grid: Grid | None = None, num_supernodes: int | None = None,
                 deployed: bool = True) -> None:
        self.load_device = load_device
        self.run_files = dict(run_files)
        self.grid = grid
        self.num_supernodes = num_supernodes
        self.deployed = deployed

    def train(self, task: FederatedTask[Any], clients: ClientDataset, fed: FedConfig,
              method: ClientMethod, strategy: Strategy, *, seed: int,
              checkpoint_path: str | Path | None = None,
              on_evaluate: RoundCallback | None = None,
              on_checkpoint: Callable[[FederatedState], None] | None = None,
              progress: bool = True, stop_after_rounds: int | None = None,
              checkpoint_extra: dict[str, Any] | None = None,
              evaluation: FederatedEvaluation | None = None) -> FederatedState:
        """Run :func:`~privaterec.fed.simulator.train_federated` with rounds sent to the
        SuperNodes; checkpoints, ledger and evaluation are the server's (federated
        evaluation: the SuperNodes' releases, ``evaluate`` messages). The final θ is
        loaded into the task's model; the devices' public task must be built as the
        server's (checked by fingerprint)."""
        kwargs: dict[str, Any] = dict(
            seed=seed, run_files=self.run_files, checkpoint_path=checkpoint_path,
            on_evaluate=on_evaluate, on_checkpoint=on_checkpoint, progress=progress,
            stop_after_rounds=stop_after_rounds, checkpoint_extra=checkpoint_extra,
            evaluation=evaluation)
        if self.grid is not None:
            return serve(self.grid, task, clients, fed, method, strategy,
                         deployed=self.deployed, **kwargs)
        kwargs["deployed"] = False  # a simulation: seeded like the simulator
        # Every simulated SuperNode exists from the start: the wait is only for their
        # ClientApps to answer, which is bounded like a round, not like a missing device.
        kwargs["discovery_timeout"] = ROUND_TIMEOUT

        from flwr.simulation import run_simulation

        nodes = self.num_supernodes or max(1, min(clients.num_users,
                                                  MAX_SIMULATED_SUPERNODES))
        if isinstance(method, CentralDP) and method.secure_aggregation != "none":
            nodes = self.num_supernodes or clients.num_users  # one user per SuperNode
        results: list[FederatedState] = []
        server = ServerApp()
        # Ctrl-C sets both; stop also ends the ServerApp's waits when the runtime ended
        interrupted, stop = threading.Event(), threading.Event()
        server_threads: list[threading.Thread] = []

        @server.main()
        def main(grid: Grid, context: Context) -> None:
            # Ctrl-C: every wait of the server on its grid raises (fed/interrupt.py)
            server_threads.append(threading.current_thread())
            stop_grid_on(grid, stop)
            results.append(serve(grid, task, clients, fed, method, strategy, **kwargs))

        loggers = [logging.getLogger(name) for name in ("flwr", "ray")]
        levels = [logger.level for logger in loggers]
        if not progress:  # e.g. run_simulation's deprecation notice
            loggers[0].setLevel(logging.ERROR)
        try:
            with sigint_sets(interrupted, stop):
                run_simulation(server_app=server,
                               client_app=make_client_app(self.load_device),
                               num_supernodes=nodes,
                               backend_config={
                                   "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": SIMULATION_CPUS, "num_gpus": 0,
                                                 "logging_level": "ERROR",
                                                 "log_to_driver": False}})
        except Exception:
            if not interrupted.is_set():
                raise
        finally:
            stop.set()
            for thread in server_threads:  # it leaves at its next call on the grid
                thread.join()
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)
        if interrupted.is_set():  # the rounds completed are checkpointed (train_federated)
            raise KeyboardInterrupt
        if not results:
            raise PrivateRecError("the Flower simulation ended without a trained model; see "
                                  "the Flower log above")
        return results[0]


__all__ = ["FlowerEngine", "MAX_SIMULATED_SUPERNODES", "SIMULATION_CPUS"]
