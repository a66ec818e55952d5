"""Speed of federated PLM-NR rounds with per-client gradients: precomputed table vs reference.

Usage::

    python benchmarks/plm_round_speed.py --data DIR [--rounds 3] [--layers 0 1]
    python benchmarks/plm_round_speed.py --smoke   # DP-FedRec, tiny data, one round

For each number of fine-tuned MiniLM layers and each method whose clients clip and noise
their own gradient (DP-FedRec at ε_t = 10, PrivateRec strict mode at ε_t = 10), one
``simulate_round`` per round index (40 clients at r = 2% on the default synthetic data),
side by side in one process:

* ``table``: the library's path: the frozen MiniLM layers precomputed once for the whole
  news table (:meth:`PLMNewsEncoder.prepare_table`), per-client gradients through the
  trainable top only (``vmap`` with no trained layer, a loop otherwise);
* ``table, other batching``: the same path with the other choice of ``vmap`` or loop (the
  library picks ``vmap`` only when no MiniLM layer is fine-tuned);
* ``reference``: ``cache_frozen=False`` and a per-client loop, i.e. all six MiniLM layers
  forward and backward for every client: what every per-client gradient cost before the
  table existed (``torch.func`` transforms bypassed the frozen-prefix cache).

Both paths must give the same round update (the max abs difference is printed; the noise is
identical by construction). Prints JSON and saves ``benchmarks/results/plm_round_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from privaterec.config import ModelConfig, RunConfig, TrainConfig, fed_config
from privaterec.fed.methods import ClientMethod, method_from_config, resolve_run_config
from privaterec.fed.objective import LocalObjective
from privaterec.fed.simulator import (clients_per_round, eligible_clients, sample_round,
                                      simulate_round)
from privaterec.runs.ranking import build_run_model, prepare_data

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = {"dp-fedrec eps 10": ("dp-fedrec", "paper", 0),
           "privaterec strict eps 10": ("privaterec", "strict", 5)}


def _rounds(objective: LocalObjective, prepared, method: ClientMethod, rounds: int,
            per_round: int) -> tuple[list[float], list[torch.Tensor]]:
    eligible = eligible_clients(prepared.train_clients)
    theta = objective.parameters()
    seconds, updates = [], []
    for t in range(rounds):
        selected = sample_round(eligible, per_round, seed=0, round_index=t)
        started = time.perf_counter()
        result = simulate_round(objective, theta, prepared.train_clients, selected, method,
                                seed=0, round_index=t)
        seconds.append(time.perf_counter() - started)
        updates.append(result.direction)
    return seconds, updates


def measure(data: str, layers: int, name: str, rounds: int,
            model: ModelConfig | None = None) -> dict:
    """One row: ``layers`` fine-tuned MiniLM layers, method ``name`` (:data:`METHODS`);
    ``model``: the default ``ModelConfig`` unless given (its news encoder becomes ``plm``)."""
    method_name, mode, basis = METHODS[name]
    config = resolve_run_config(RunConfig(
        data=data, model=replace(ModelConfig() if model is None else model, news_encoder="plm",
                                 plm_trainable_layers=layers, basis_size=basis),
        train=TrainConfig(method=method_name, seed=0),
        fed=fed_config(method_name, rounds=rounds, epsilon_train=10.0,
                       **({"privacy_mode": mode} if method_name == "privaterec" else {}))))
    prepared = prepare_data(config)
    model = build_run_model(config, prepared)
    started = time.perf_counter()
    objective = LocalObjective(model)  # prepares the table
    prepare_seconds = time.perf_counter() - started
    method = method_from_config(config)
    per_round = clients_per_round(config.fed, len(eligible_clients(prepared.train_clients)))
    fast, fast_updates = _rounds(objective, prepared, method, rounds, per_round)
    vmapped = objective.supports_vmap
    objective.supports_vmap = not vmapped  # the other batching of the same table path
    other, other_updates = _rounds(objective, prepared, method, rounds, per_round)
    model.news_encoder.cache_frozen = False
    objective.supports_vmap = False
    slow, slow_updates = _rounds(objective, prepared, method, rounds, per_round)
    model.news_encoder.cache_frozen = True
    diff = max(float((a - b).abs().max()) for a, b in
               zip(fast_updates + other_updates, slow_updates + slow_updates))
    scale = max(float(b.abs().max()) for b in slow_updates)
    return {"layers": layers, "method": name, "dimension": objective.dimension,
            "clients_per_round": per_round, "table_vmap": vmapped,
            "table_prepare_seconds": round(prepare_seconds, 2),
            "table_seconds": [round(s, 3) for s in fast],
            "table_other_batching_seconds": [round(s, 3) for s in other],
            "reference_seconds": [round(s, 3) for s in slow],
            "table_median": round(statistics.median(fast), 3),
            "reference_median": round(statistics.median(slow), 3),
            "speedup": round(statistics.median(slow) / statistics.median(fast), 1),
            "max_abs_update_difference": diff, "max_abs_update": scale}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None, help="MIND-format data directory")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--smoke", action="store_true",
                        help="DP-FedRec with one fine-tuned layer only, on tiny synthetic "
                             "data with a small model (titles of 8 word pieces, histories of "
                             "10), one round, one thread, results to a temporary directory")
    args = parser.parse_args()
    results_dir, model, methods = RESULTS, None, list(METHODS)
    if args.smoke:
        from _smoke import smoke_data, smoke_dir, smoke_model

        # one fine-tuned layer: the loop, and vmap as the other batching
        args.data, args.rounds, args.layers = str(smoke_data(users=60, news=150)), 1, [1]
        results_dir, model = smoke_dir("plm_round_speed"), smoke_model()
        # PrivateRec encodes its K reference news through MiniLM per client: seconds each
        methods = ["dp-fedrec eps 10"]
        torch.set_num_threads(1)  # tiny MiniLM batches stall on thread barriers
    elif args.data is None:
        parser.error("--data is required (or --smoke)")
    results = []
    for layers in args.layers:
        for name in methods:
            row = measure(args.data, layers, name, args.rounds, model)
            print(json.dumps(row), flush=True)
            assert math.isfinite(row["max_abs_update_difference"])
            results.append(row)
    results_dir.mkdir(exist_ok=True)
    (results_dir / "plm_round_speed.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
