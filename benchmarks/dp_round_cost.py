"""Cost of a central-DP round against the non-private round on the same clients.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/dp_round_cost.py [--repeats 3] [--model nrms]
    python benchmarks/dp_round_cost.py --smoke   # tiny data and model, 8 clients, seconds

Two settings, each in one process, side by side:

* ``large``: 1,000 clients per round on a 50,000-user synthetic set (``--large-data``;
  made with ``write_synthetic(SynthConfig(users=50000))``, what ``privaterec data synth
  --users 50000`` runs, when missing);
* ``small``: 40 clients per round on the default 2,000-user synthetic set.

In each, one fixed set of clients (``sample_round``, seed 0) and the same round index, so
both methods draw the same samples and candidates: a ``fedrec`` round (one forward and one
backward pass over the round's samples, the news encoded once:
``LocalObjective.round_gradient``) and a ``dp-fedavg`` round (``CentralDP`` around FedRec:
per-client gradients, each clipped to L2 norm C, summed, Gaussian noise). Both are timed
through ``simulate_round`` (inputs drawn, round aggregated), alternately, ``--repeats``
times after one untimed round of each (dp-fedavg's first round calibrates its noise with
dp-accounting, once per run); the ratio is of the medians. The machine may be shared: the ratio, measured in one
process on the same clients, is the figure to read.

A fourth round, ``dp-fedavg-news``, is central DP clipped in news-vector space
(``--clip-space news_vectors``, :mod:`privaterec.fed.news_space`): each client clips its
user-side gradient and the cotangents of its news vectors, the aggregator noises every
coordinate (the user side and every news of the table) and forms the news-encoder gradient
with one backward pass over the table.

A third round, ``fedrec-per-client``, is non-private FedAvg computed the way a device
computes it: each client's own gradient (the same ``vmap`` per-client path as dp-fedavg),
averaged, with no clipping and no noise. dp-fedavg against it is the cost of the clipping and
the noise alone (what Opacus' ~1.2x measures for per-sample clipping); fedrec against it is
what the simulator saves by encoding each news once for all clients, which no deployment can
do (each device encodes its own news).

Also reported, to show where a DP round's time goes: the per-client gradients alone
(``LocalObjective.client_gradients``, once), the number of (client, news) pairs a
per-client gradient must backpropagate through the news encoder, and the number of distinct
news the non-private round encodes.

Prints JSON and saves ``benchmarks/results/dp_round_cost.json`` (``--save``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from privaterec.config import ModelConfig, RunConfig, TrainConfig, fed_config
from privaterec.data.synth import SynthConfig, write_synthetic
from privaterec.fed.methods import method_from_config, resolve_run_config
from privaterec.fed.methods.ranking import FedRec
from privaterec.fed.objective import LocalObjective
from privaterec.fed.rng import client_noise
from privaterec.fed.simulator import eligible_clients, sample_round, simulate_round
from privaterec.models.factory import build_recommender
from privaterec.runs.ranking import prepare_data

RESULTS = Path(__file__).resolve().parent / "results"
CACHE = Path.home() / ".cache/privaterec/bench"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PerClientFedRec(FedRec):
    """FedRec whose round computes every client's gradient separately (the device path)
    instead of one backward pass over the round with shared news encodings."""

    @property
    def per_client_release(self) -> bool:
        return True


def _data(path: Path, users: int) -> Path:
    if not (path / "train" / "behaviors.tsv").exists():
        write_synthetic(path, SynthConfig(users=users, seed=0))
    return path


def _timed(fn: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def measure(data: Path, clients_per_round: int, *, model_name: str, repeats: int,
            noise_multiplier: float, model: ModelConfig | None = None) -> dict[str, Any]:
    """Median seconds of a fedrec and a dp-fedavg round on the same clients (``model``: the
    default ``ModelConfig`` with ``model_name``'s news encoder unless given)."""
    model_config = ModelConfig(news_encoder=model_name) if model is None else model
    started = time.perf_counter()
    prepared = prepare_data(RunConfig(data=str(data), model=model_config))
    prepare_seconds = time.perf_counter() - started
    clients = prepared.train_clients
    torch.manual_seed(0)
    model = build_recommender(model_config, prepared.vocabs, prepared.features)
    objective = LocalObjective(model)
    params = objective.parameters()
    eligible = eligible_clients(clients)
    population = len(eligible)
    selected = sample_round(eligible, clients_per_round, seed=0, round_index=0)

    def method(name: str, **fed: Any) -> Any:
        config = RunConfig(data=str(data), model=model_config, train=TrainConfig(method=name),
                           fed=fed_config(name, **fed))
        return method_from_config(resolve_run_config(config))
    fedrec = method("fedrec", clients_per_round=clients_per_round)
    per_client = PerClientFedRec(**{f.name: getattr(fedrec, f.name)
                                    for f in dataclasses.fields(fedrec)})
    dp = method("dp-fedavg", noise_multiplier=noise_multiplier,
                client_fraction=clients_per_round / population,
                target_delta=0.1 / population)
    dp_news = method("dp-fedavg", noise_multiplier=noise_multiplier,
                     client_fraction=clients_per_round / population,
                     target_delta=0.1 / population, clip_space="news_vectors")

    # The work a per-client gradient does that the fedrec round shares.
    inputs = [fedrec.inputs(objective, clients.client(u), noise=client_noise(0, 0, u))
              for u in selected]
    batch = objective.batch(inputs)
    real = batch.weights > 0
    m, h = batch.history.shape
    owner = torch.cat([torch.arange(m)[:, None].expand(m, h)[batch.history_mask],
                       torch.arange(m)[:, None].expand_as(real)[real]
                       .repeat_interleave(batch.candidates.shape[2])])
    rows = torch.cat([batch.history[batch.history_mask], batch.candidates[real].reshape(-1)])
    pairs = int(torch.unique(owner * (int(rows.max()) + 1) + rows).numel())
    distinct_news = int(torch.unique(torch.cat([batch.history.reshape(-1),
                                                batch.candidates[real].reshape(-1)])).numel())

    # One untimed round of each first: dp-fedavg calibrates its noise (dp-accounting, once
    # per run and cached), which is not the per-round cost.
    rounds = (("fedrec", fedrec), ("fedrec-per-client", per_client), ("dp-fedavg", dp),
              ("dp-fedavg-news", dp_news))
    outputs = {name: simulate_round(objective, params, clients, selected, m_, seed=0,
                                    round_index=0) for name, m_ in rounds}
    shared_vs_per_client = float((outputs["fedrec-per-client"].direction
                                  - outputs["fedrec"].direction).abs().max())
    times: dict[str, list[float]] = {name: [] for name, _ in rounds}
    for r in range(repeats):
        for name, m_ in rounds:
            _, seconds = _timed(lambda: simulate_round(objective, params, clients, selected, m_,
                                                       seed=0, round_index=0))
            times[name].append(seconds)
        print(f"  repeat {r}: " + ", ".join(f"{name} {times[name][-1]:.2f} s"
                                            for name, _ in rounds), flush=True)
    _, gradient_seconds = _timed(lambda: objective.client_gradients(params, batch))
    fed_median = statistics.median(times["fedrec"])
    per_client_median = statistics.median(times["fedrec-per-client"])
    dp_median = statistics.median(times["dp-fedavg"])
    news_median = statistics.median(times["dp-fedavg-news"])
    return {
        "data": str(data), "population": population, "clients_per_round": len(selected),
        "model": model_name, "parameters_D": objective.dimension, "repeats": repeats,
        "samples": int(real.sum()), "client_news_pairs": pairs,
        "distinct_news": distinct_news, "clip": dp.clip, "noise_multiplier": noise_multiplier,
        "fedrec_seconds": times["fedrec"], "dp_fedavg_seconds": times["dp-fedavg"],
        "fedrec_median_seconds": fed_median, "dp_fedavg_median_seconds": dp_median,
        "ratio_dp_over_fedrec": dp_median / fed_median,
        "fedrec_per_client_seconds": times["fedrec-per-client"],
        "fedrec_per_client_median_seconds": per_client_median,
        "ratio_dp_over_fedrec_per_client": dp_median / per_client_median,
        "ratio_fedrec_per_client_over_fedrec": per_client_median / fed_median,
        "dp_fedavg_news_seconds": times["dp-fedavg-news"],
        "dp_fedavg_news_median_seconds": news_median,
        "ratio_dp_news_over_fedrec": news_median / fed_median,
        "fedrec_per_client_max_abs_difference_from_fedrec": shared_vs_per_client,
        "per_client_gradients_seconds_once": gradient_seconds,
        "prepare_data_seconds": prepare_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="nrms")
    parser.add_argument("--large-data", type=Path, default=CACHE / "synth-50k")
    parser.add_argument("--large-clients", type=int, default=1000)
    parser.add_argument("--small-data", type=Path, default=CACHE / "synth-default")
    parser.add_argument("--small-clients", type=int, default=40)
    parser.add_argument("--noise-multiplier", type=float, default=1.0)
    parser.add_argument("--only", choices=("large", "small"), default=None)
    parser.add_argument("--save", type=Path, default=RESULTS / "dp_round_cost.json")
    parser.add_argument("--smoke", action="store_true",
                        help="the small setting only, on tiny synthetic data with a tiny "
                             "model: 8 clients, one repeat, z = 5 (quick to account), results "
                             "to a temporary directory")
    args = parser.parse_args()
    model = None
    settings = {"small": (args.small_data, 2000, args.small_clients),
                "large": (args.large_data, 50000, args.large_clients)}
    if args.smoke:
        from _smoke import smoke_data, smoke_dir, smoke_model

        settings = {"small": (smoke_data(users=60, news=150), 60, 8)}
        args.repeats, args.noise_multiplier, model = 1, 5.0, smoke_model()
        args.save = smoke_dir("dp_round_cost") / "dp_round_cost.json"
    result: dict[str, Any] = {"torch_threads": torch.get_num_threads(), "settings": {}}
    for name, (path, users, m) in settings.items():
        if args.only not in (None, name):
            continue
        data = _data(path, users)
        print(f"{name}: {m} clients per round on {data}", flush=True)
        result["settings"][name] = measure(data, m, model_name=args.model,
                                           repeats=args.repeats,
                                           noise_multiplier=args.noise_multiplier,
                                           model=model)
        print(json.dumps(result["settings"][name], indent=2), flush=True)
    args.save.parent.mkdir(parents=True, exist_ok=True)
    args.save.write_text(json.dumps(result, indent=2))
    print(f"saved {args.save}")


if __name__ == "__main__":
    main()
