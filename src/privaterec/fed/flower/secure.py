"""SecAgg+ glue: the mask generator both sides use, and one secure-summation session.

Flower's SecAgg+ (``secaggplus_mod`` on the client,
:class:`flwr.server.workflow.SecAggPlusWorkflow` on the server) expands its mask seeds with a 32-bit-seeded Mersenne
Twister; :func:`install_mask_prg` swaps in :func:`mask_prg` (SHAKE-256 over the whole seed).
:func:`secure_sum` runs one session over a Grid and returns only the decoded sum.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import math
from typing import Any, Mapping, Sequence, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.common import FitIns, FitRes, Parameters, parameters_to_ndarrays
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy as LegacyStrategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.serverapp import Grid

from privaterec.errors import PrivateRecError
from privaterec.fed.flower.messages import reply_error
from privaterec.fed.secagg import SecAggRound

MASK_PRG = "shake256"
"""The PRG that expands SecAgg+'s mask seeds here (server and devices must agree)."""


def mask_prg(seed: bytes, num_range: int,
             dimensions_list: list[tuple[int, ...]]) -> list[np.ndarray]:
    """SecAgg+'s masks from the whole 256-bit ``seed``: SHAKE-256 output, 8 bytes per value,
    reduced mod ``num_range`` (a power of two: exactly uniform on [0, num_range)).

    Flower 1.41's ``pseudo_rand_gen`` XORs the seed's 32-bit words into one 32-bit seed of
    NumPy's Mersenne Twister: every mask then has at most 2^32 possible values, and the
    Mersenne Twister is not a cryptographic PRG, so a server could search the seeds of a
    client's pairwise masks. :func:`install_mask_prg` replaces it in both of Flower's
    SecAgg+ modules (client mod and server workflow) with this XOF; a device checks that
    the server does too (``secagg-prg`` in the round's configuration).
    """
    if num_range & (num_range - 1) or not 1 < num_range <= 2 ** 62:
        raise PrivateRecError(f"SecAgg+ modulus {num_range} is not a power of two")
    sizes = [math.prod(d) for d in dimensions_list]
    stream = hashlib.shake_256(b"privaterec-secaggplus-mask" + seed).digest(8 * sum(sizes))
    values = (np.frombuffer(stream, dtype="<u8") & np.uint64(num_range - 1)).astype(np.int64)
    out, start = [], 0
    for shape, size in zip(dimensions_list, sizes):
        out.append(values[start:start + size].reshape(shape))
        start += size
    return out


SECAGGPLUS_MODULES = ("flwr.client.mod.secure_aggregation.secaggplus_mod",
                      "flwr.server.workflow.secure_aggregation.secaggplus_workflow")
"""Flower's modules that expand mask seeds (each imported ``pseudo_rand_gen`` by name; the
packages' attributes of the same names are functions, so they are looked up as modules)."""


def install_mask_prg() -> None:
    """Make both of Flower's SecAgg+ modules expand mask seeds with :func:`mask_prg`.

    Called explicitly by every entry point that runs SecAgg+ (the ClientApp of
    :func:`~privaterec.fed.flower.client_app.make_client_app` and the server's
    :func:`secure_sum`); idempotent. Flower's modules look ``pseudo_rand_gen`` up as a module
    global when they expand a seed, so this sets that global.
    """
    for name in SECAGGPLUS_MODULES:
        setattr(importlib.import_module(name), "pseudo_rand_gen", mask_prg)


def mask_prg_installed() -> bool:
    """Whether both of Flower's SecAgg+ modules expand mask seeds with :func:`mask_prg`."""
    return all(getattr(importlib.import_module(name), "pseudo_rand_gen", None) is mask_prg
               for name in SECAGGPLUS_MODULES)


class _SecureSumStrategy(LegacyStrategy):
    """The legacy strategy :class:`SecAggPlusWorkflow` drives: it sends each node its FitIns
    and keeps the decoded aggregate (SecAgg+ hands every result the same, the mean)."""

    def __init__(self, grid: Grid, fitins: Mapping[int, FitIns]) -> None:
        self.grid, self.fitins = grid, dict(fitins)
        self.aggregate: tuple[np.ndarray, int] | None = None

    def initialize_parameters(self, client_manager: Any) -> Parameters | None:
        return None

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: Any) -> list[tuple[Any, FitIns]]:
        return [(GridClientProxy(node, self.grid, 0), ins) for node, ins in self.fitins.items()]

    def aggregate_fit(self, server_round: int, results: list[tuple[Any, FitRes]],
                      failures: list[Any]) -> tuple[Parameters | None, dict[str, Any]]:
        if results:
            (mean,) = parameters_to_ndarrays(results[0][1].parameters)
            self.aggregate = (np.asarray(mean, dtype=np.float64), len(results))
        return None, {}

    def configure_evaluate(self, server_round: int, parameters: Parameters,
                           client_manager: Any) -> list[tuple[Any, Any]]:
        return []

    def aggregate_evaluate(self, server_round: int, results: list[Any],
                           failures: list[Any]) -> tuple[float | None, dict[str, Any]]:
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters) -> None:
        return None


class _ErrorLog:
    """A Grid that forwards everything and keeps the reasons of the replies that failed."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.errors: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grid, name)

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> Any:
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        self.errors += [reply_error(r) for r in replies if r.has_error()]
        return replies


def secure_sum(grid: Grid, plan: SecAggRound, nodes: Sequence[int],
               fitins: Mapping[int, FitIns], *, round_index: int,
               timeout: float | None) -> tuple[torch.Tensor, int]:
    """One SecAgg+ session: the sum ``[D]`` (float64) of the vectors the ``nodes`` compute
    from their ``fitins`` (:func:`~privaterec.fed.flower.client_app.client_secure_fit`), and
    how many were summed.

    The server sees the clients' public keys, encrypted key shares, masked vectors and mask
    shares, and decodes only the sum (of at least ``plan.threshold`` clients).

    Raises
    ------
    PrivateRecError
        If the session halts (more than ``plan.max_dropouts`` clients dropped out or
        failed; their reasons are in the message).
    """
    install_mask_prg()
    log = _ErrorLog(grid)
    logged = cast(Grid, log)  # a Grid in everything but its class
    strategy = _SecureSumStrategy(logged, {n: fitins[n] for n in nodes})
    context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(),
                                    run_config={}), strategy=strategy)
    context.state[MAIN_CONFIGS_RECORD] = ConfigRecord({"current_round": round_index + 1})
    context.state[MAIN_PARAMS_RECORD] = ArrayRecord()
    workflow = SecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=plan.threshold,
                                  max_weight=1.0, clipping_range=plan.clipping_range,
                                  quantization_range=plan.quantization_range,
                                  modulus_range=plan.modulus, timeout=timeout)
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    flwr_logger.setLevel(max(level, logging.WARNING))  # four INFO lines per round otherwise
    try:
        workflow(logged, context)
    finally:
        flwr_logger.setLevel(level)
    if strategy.aggregate is None:
        raise PrivateRecError(
            f"round {round_index + 1}: secure aggregation of {plan.clients} clients halted: "
            f"more than {plan.max_dropouts} dropped out or failed (threshold "
            f"{plan.threshold}; --max-dropouts sets how many a round tolerates)"
            + (f": {'; '.join(log.errors[:3])}" if log.errors else ""))
    mean, summed = strategy.aggregate
    if summed < plan.threshold:  # SecAgg+ cannot unmask with fewer; refuse all the same
        raise PrivateRecError(f"round {round_index + 1}: only {summed} of {plan.clients} "
                              f"vectors in the sum, below the threshold {plan.threshold}")
    if log.errors:
        logging.getLogger("privaterec").warning(
            "round %d: %d of %d clients dropped out of secure aggregation (at most %d "
            "allowed): %s", round_index + 1, plan.clients - summed, plan.clients,
            plan.max_dropouts, "; ".join(log.errors[:3]))
    # SecAgg+ returns the mean over the summed vectors (each weighted Q/Q = 1).
    return torch.from_numpy(mean * summed), summed


__all__ = ["MASK_PRG", "SECAGGPLUS_MODULES", "install_mask_prg", "mask_prg",
           "mask_prg_installed", "secure_sum"]
