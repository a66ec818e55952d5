"""Signal against noise in a DP-FedAvg round: why central DP needs a population.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/central_dp_signal.py --data DATA [--rounds 6]
        [--target-epsilon 8 --budget-rounds 100] [--embeddings random|corpus]
        [--save benchmarks/results/<name>.json]
    python benchmarks/central_dp_signal.py --smoke   # tiny data and model, one round, seconds

Trains ``dp-fedavg`` (NRMS, the defaults: q = 0.02, C = 0.1, FedAdam) on ``DATA`` for a few
rounds, with the z that ``--target-epsilon`` calibrates for a run of ``--budget-rounds``
rounds (the noise of such a run's rounds), and, in each round, before the noise is added, measures on the clients' updates:

* the median L2 norm of the unclipped updates Δ_u and the share clipped at C;
* ‖Σ_u clip(Δ_u, C)‖, the signal the round releases;
* E‖N(0, z²C² I_D)‖ ≈ z·C·√D, the noise added to that sum, and their ratio;
* the alignment ‖mean_u Δ_u/‖Δ_u‖‖: 1 if every client pushes the same way, ≈ 1/√m if
  the m directions are unrelated.

The ratio noise/signal scales as z·√D / (m·alignment): for a fixed ε, m = qN grows with the
population while z changes little, which is what the table of ``experiment central-dp``
shows. The run itself is the library's (``train_run``); the measurement wraps
``CentralDP.round`` and leaves its result unchanged.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from privaterec.config import ModelConfig, RunConfig, TrainConfig, fed_config
from privaterec.fed.methods.dp_fedavg import CentralDP
from privaterec.privacy.central_accounting import calibrate_noise_multiplier
from privaterec.runs.ranking import train_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--target-epsilon", type=float, default=8.0)
    parser.add_argument("--budget-rounds", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--embeddings", default="random",
                        help="NRMS word vectors: random (default) or corpus (fitted on the "
                             "news texts)")
    parser.add_argument("--save", default=None)
    parser.add_argument("--data", default=None,
                        help="a MIND-format data set (train/ and test/)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny synthetic data and model, one round at q = 0.2 and ε = 0.1, "
                             "no evaluation, results to a temporary directory")
    args = parser.parse_args()
    model = ModelConfig(news_encoder="nrms", embeddings=args.embeddings)
    q = CentralDP.server_defaults.client_fraction  # dp-fedavg's default q
    if args.smoke:
        from _smoke import smoke_data, smoke_dir, smoke_model

        args.data = str(smoke_data(users=60, news=150) / "train")  # no test/: no evaluation
        # a small ε: a large z, whose privacy-loss distribution is quick to compose
        args.rounds, args.budget_rounds, args.target_epsilon, q = 1, 1, 0.1, 0.2
        args.save = str(smoke_dir("central_dp_signal") / "central_dp_signal.json")
        model = smoke_model(embeddings=args.embeddings)
    elif args.data is None:
        parser.error("--data is required (or --smoke)")
    rows: list[dict[str, float]] = []
    measured_round = CentralDP.round

    def round_with_measurement(self, task, params, inputs, generators, context):  # type: ignore[no-untyped-def]
        if not inputs:  # a Poisson round that sampled nobody
            return measured_round(self, task, params, inputs, generators, context)
        updates, _ = self.inner.client_updates(task, params, inputs, generators,
                                                chunk_clients=context.chunk_clients)
        norms = updates.norm(dim=1)
        clipped, _ = self.privatize(updates, generators)
        signal = float(clipped.sum(0).norm())
        noise = self.noise_multiplier * self.clip * updates.shape[1] ** 0.5
        row = {"round": context.round_index, "clients": len(inputs),
               "median_update_norm": float(norms.median()),
               "clipped_share": float((norms > self.clip).float().mean()),
               "signal_norm": signal, "noise_norm": noise, "noise_over_signal": noise / signal,
               "alignment": float((updates / norms[:, None]).mean(0).norm()),
               "dimension": int(updates.shape[1]), "z": self.noise_multiplier}
        rows.append(row)
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in row.items()), flush=True)
        return measured_round(self, task, params, inputs, generators, context)

    CentralDP.round = round_with_measurement  # type: ignore[method-assign]
    z = calibrate_noise_multiplier(target_epsilon=args.target_epsilon, sampling_rate=q,
                                   rounds=args.budget_rounds, delta=1e-5)
    config = RunConfig(data=args.data,
                       model=model,
                       train=TrainConfig(method="dp-fedavg", seed=args.seed),
                       fed=fed_config("dp-fedavg", rounds=args.rounds, client_fraction=q,
                                      noise_multiplier=z))
    with tempfile.TemporaryDirectory() as out:
        train_run(config, Path(out) / "run", progress=False)
    summary = {k: statistics.median(r[k] for r in rows)
               for k in ("clients", "median_update_norm", "clipped_share", "signal_norm",
                         "noise_norm", "noise_over_signal", "alignment")}
    print("median over rounds:", json.dumps(summary))
    if args.save:
        Path(args.save).write_text(json.dumps({"data": args.data, "rounds": rows,
                                               "embeddings": args.embeddings,
                                               "median": summary,
                                               "target_epsilon": args.target_epsilon,
                                               "budget_rounds": args.budget_rounds, "z": z},
                                              indent=2))


if __name__ == "__main__":
    main()
