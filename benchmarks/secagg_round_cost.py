"""Per-round time of central DP on Flower with SecAgg+ against the plain Flower path.

Usage::

    python benchmarks/secagg_round_cost.py [--users 40] [--client-fraction 0.5] [--rounds 4]
    python benchmarks/secagg_round_cost.py --smoke   # SecAgg+ only: 4 users, one round,
                                                     # in process (no Ray)

Writes synthetic data with ``--users`` users (under ``--out``, default
``/tmp/privaterec-secagg-cost``), builds the default model, and trains ``dp-fedavg``
(z = 1) on Flower's Ray simulation runtime with one SuperNode per user twice, with the same
seed and hence the same Poisson-sampled clients: once through SecAgg+
(``--secure-aggregation secaggplus``) and once through the plain Flower round (the clipped
updates sent as they are; the run layer refuses that configuration, the engine is called
directly to time the transport alone). Prints and saves, per round, the number of clients
and the wall time of the engine's round function (``benchmarks/results/
secagg_round_cost.json``). The first round also pays start-up costs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from privaterec.config import RunConfig, TrainConfig, fed_config
from privaterec.data.synth import SynthConfig, write_synthetic
from privaterec.fed import flower
from privaterec.fed.flower import server_app
from privaterec.fed.methods import method_from_config, resolve_run_config
from privaterec.fed.objective import LocalObjective
from privaterec.fed.strategies import build_strategy
from privaterec.models.factory import build_recommender
from privaterec.runs.engines import load_device
from privaterec.runs.ranking import prepare_data

RESULTS = Path(__file__).parent / "results" / "secagg_round_cost.json"


def _timed_round_functions(per_round: list[tuple[int, float]]) -> None:
    """Wrap the engine's two round-function builders to time every round."""
    for name in ("_round_fn", "_secure_round_fn"):
        build = getattr(server_app, name)

        def wrapped(*args: Any, _build: Any = build, **kwargs: Any) -> Any:
            round_fn = _build(*args, **kwargs)

            def timed(params: torch.Tensor, selected: list[int], t: int) -> Any:
                start = time.perf_counter()
                result = round_fn(params, selected, t)
                per_round.append((len(selected), round(time.perf_counter() - start, 3)))
                return result
            return timed
        setattr(server_app, name, wrapped)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=40)
    parser.add_argument("--client-fraction", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", default="/tmp/privaterec-secagg-cost")
    parser.add_argument("--smoke", action="store_true",
                        help="the SecAgg+ run only, on an in-process grid (the same ServerApp "
                             "rounds, ClientApp and SecAgg+ stages, without Ray's start-up): "
                             "4 users, one round of all of them, a tiny model, everything in "
                             "a temporary directory")
    args = parser.parse_args()
    results, model, paths = RESULTS, RunConfig(data=".").model, ("none", "secaggplus")
    if args.smoke:
        from _smoke import smoke_dir, smoke_model

        args.users, args.client_fraction, args.rounds = 4, 1.0, 1
        args.out, model = str(smoke_dir("secagg_round_cost")), smoke_model()
        # the plain Flower round, and SecAgg+ on Ray, are what tests/fed/test_flower.py runs
        paths = ("secaggplus",)
        results = Path(args.out) / "secagg_round_cost.json"
    out = Path(args.out)
    data = out / "data"
    if not data.exists():
        write_synthetic(data, SynthConfig(users=args.users, news=200, seed=5))
    per_round: list[tuple[int, float]] = []
    _timed_round_functions(per_round)
    times: dict[str, Any] = {}
    for secure in paths:
        config = resolve_run_config(RunConfig(
            data=str(data), model=model, train=TrainConfig(method="dp-fedavg", seed=0),
            fed=fed_config("dp-fedavg", rounds=args.rounds,
                           client_fraction=args.client_fraction, noise_multiplier=1.0,
                           target_delta=1e-3 / args.users, engine="flower",
                           secure_aggregation=secure)))
        prepared = prepare_data(config)
        torch.manual_seed(0)
        task = LocalObjective(build_recommender(config.model, prepared.vocabs,
                                                prepared.features))
        run_dir = out / secure
        run_dir.mkdir(parents=True, exist_ok=True)
        config.to_yaml(run_dir / "config.yaml")
        run_files = {"config.yaml": (run_dir / "config.yaml").read_text()}
        if args.smoke:  # seeded like the simulation runtime
            from _smoke import InProcessGrid

            grid = InProcessGrid(flower.make_client_app(load_device), nodes=args.users)
            engine = flower.FlowerEngine(load_device, run_files, grid=grid, deployed=False)
        else:
            engine = flower.FlowerEngine(load_device, run_files, num_supernodes=args.users)
        per_round.clear()
        engine.train(task, prepared.train_clients, config.fed, method_from_config(config),
                     build_strategy(config.fed), seed=0, progress=False)
        times[secure] = {"dimension": task.dimension, "rounds": list(per_round)}
        print(secure, times[secure], flush=True)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps({"users": args.users,
                                   "client_fraction": args.client_fraction,
                                   "per_round_seconds": times}, indent=1))


if __name__ == "__main__":
    main()
