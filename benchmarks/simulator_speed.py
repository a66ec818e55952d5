"""Speed of the vectorized federated simulator, measured side by side in one process.

Usage::

    python benchmarks/simulator_speed.py [--clients 200] [--repeats 3] [--model nrms] [--smoke]

Two ratios on the default synthetic data (nrms unless ``--model``):

* ``speedup``: fednewsrec (per-client clipping and Laplace noise) with ``--clients`` clients
  per round — the sequential loop (one ``client_update`` per client, the reference) over the
  vectorized ``simulate_round`` (vmap(grad) in chunks), after checking both give the same
  aggregate (max abs difference printed; noise is identical by construction);
* ``speedup_vs_conventional_loop``: the same, against the loop one writes without this
  library (per client: load θ into the ``nn.Module``, ordinary forward, ``backward()``,
  read ``.grad``, clip, noise);
* ``fedrec_over_centralized``: one fedrec round (one backward pass + FedAdam step) over one
  centralized Adam step on exactly the same samples and candidates.

Timings are medians over ``--repeats`` rounds (different client samples each). Prints JSON
and saves ``benchmarks/results/simulator_speed.json`` (``--smoke``: tiny data, 4 clients, one
repeat, saved to a temporary directory).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

from privaterec.config import FedConfig, ModelConfig, RunConfig, TrainConfig
from privaterec.data.synth import SynthConfig, write_synthetic
from privaterec.fed.client import client_candidates
from privaterec.fed.methods import ClientMethod, method_from_config, resolve_run_config
from privaterec.fed.objective import LocalObjective
from privaterec.fed.simulator import eligible_clients, sample_round, sequential_round, simulate_round
from privaterec.fed.rng import client_noise
from privaterec.fed.strategies import build_strategy, weighted_mean
from privaterec.models.factory import build_recommender
from privaterec.training.centralized import info_nce_loss
from privaterec.runtime.determinism import deterministic_algorithms
from privaterec.runs.ranking import prepare_data

RESULTS = Path(__file__).resolve().parent / "results"


def _timed(fn):
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def conventional_round(model, objective: LocalObjective, params: torch.Tensor, clients,
                       selected, method: ClientMethod, *, seed: int,
                       round_index: int) -> torch.Tensor:
    """The loop one writes without this library: per client, load θ into the nn.Module, run
    its ordinary forward on the client's samples (user vector per sample), ``backward()``,
    read ``.grad``, then clip and noise (same generators, same draws)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    payloads, counts = [], []
    for u in selected:
        generator = client_noise(seed, round_index, u)
        data = clients.client(u)
        candidates = client_candidates(data, method, noise=generator)
        objective.load(params)
        model.zero_grad(set_to_none=True)
        n = candidates.shape[0]
        logits = model(data.history.expand(n, -1), data.history_mask.expand(n, -1), candidates)
        info_nce_loss(logits).backward()
        grad = torch.cat([p.grad.reshape(-1) for p in trainable])
        released, _ = method.privatize(grad[None], [generator])
        payloads.append(released[0])
        counts.append(n)
    return weighted_mean(torch.stack(payloads), torch.tensor(counts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=200, help="clients per round")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="nrms")
    parser.add_argument("--data", default=None, help="data directory (default: synthesised)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny data and model, 4 clients, 1 repeat, results to a temporary "
                             "directory")
    args = parser.parse_args()
    results = RESULTS
    if args.smoke:
        from _smoke import smoke_data, smoke_dir

        args.clients, args.repeats, args.data = 4, 1, str(smoke_data())
        results = smoke_dir("simulator_speed")

    data = Path(args.data) if args.data else Path.home() / ".cache/privaterec/bench/synth-default"
    if not (data / "test" / "behaviors.tsv").exists():
        write_synthetic(data, SynthConfig(seed=0))
    model_config = ModelConfig(news_encoder=args.model)
    if args.smoke:
        from _smoke import smoke_model

        model_config = smoke_model(news_encoder=args.model)
    base = RunConfig(data=str(data), model=model_config,
                     train=TrainConfig(method="fednewsrec"),
                     fed=FedConfig(clients_per_round=args.clients))
    prepared = prepare_data(base)
    clients = prepared.train_clients
    torch.manual_seed(0)
    model = build_recommender(base.model, prepared.vocabs, prepared.features)
    objective = LocalObjective(model)
    params = objective.parameters()
    eligible = eligible_clients(clients)

    noisy = method_from_config(resolve_run_config(base))
    # the engine's settings of the same rounds, fedrec's own settings (its defaults)
    plain_config = resolve_run_config(RunConfig(
        data=base.data, model=base.model, train=TrainConfig(method="fedrec"),
        fed=dataclasses.replace(base.fed, settings=None)))
    plain = method_from_config(plain_config)
    strategy = build_strategy(plain_config.fed)

    vec_times, seq_times, max_diffs, fed_times, cen_times, samples = [], [], [], [], [], []
    conv_times, conv_diffs = [], []
    with deterministic_algorithms():
        for t in range(args.repeats):
            selected = sample_round(eligible, args.clients, seed=0, round_index=t)
            vec, tv = _timed(lambda: simulate_round(objective, params, clients, selected, noisy,
                                                    seed=0, round_index=t))
            seq, ts = _timed(lambda: sequential_round(objective, params, clients, selected,
                                                      noisy, seed=0, round_index=t))
            conv, tm = _timed(lambda: conventional_round(model, objective, params, clients,
                                                         selected, noisy, seed=0,
                                                         round_index=t))
            conv_diffs.append(float((conv - seq.direction).abs().max()))
            conv_times.append(tm)
            vec_times.append(tv)
            seq_times.append(ts)
            max_diffs.append(float((vec.direction - seq.direction).abs().max()))
            assert vec.num_examples == seq.num_examples and vec.events == seq.events
            assert torch.allclose(vec.direction, seq.direction, atol=1e-6, rtol=1e-5), \
                f"vectorized and sequential rounds differ by {max_diffs[-1]}"

            # fedrec round vs centralized step on the same samples and candidates.
            state = strategy.init_state(params)

            def fed_round():
                result = simulate_round(objective, params, clients, selected, plain, seed=0,
                                        round_index=t)
                return strategy.step(params, state, result.direction)
            _, tf = _timed(fed_round)
            candidates = [client_candidates(clients.client(u), plain,
                                            noise=client_noise(0, t, u))
                          for u in selected]
            users = torch.cat([torch.full((c.shape[0],), u) for u, c in zip(selected, candidates)])
            cands = torch.cat(candidates)
            trainable = [p for p in model.parameters() if p.requires_grad]
            optimizer = torch.optim.Adam(trainable, lr=5e-3)
            snapshot = [p.detach().clone() for p in trainable]

            def centralized_step():
                logits = model(clients.history[users], clients.history_mask[users], cands)
                loss = info_nce_loss(logits)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            _, tc = _timed(centralized_step)
            with torch.no_grad():
                for p, s in zip(trainable, snapshot):
                    p.copy_(s)
            fed_times.append(tf)
            cen_times.append(tc)
            samples.append(int(cands.shape[0]))
            print(f"round {t}: conventional loop {tm:.2f} s (max diff {conv_diffs[-1]:.2e}); "
                  f"fednewsrec vectorized {tv:.2f} s, sequential {ts:.2f} s "
                  f"(max diff {max_diffs[-1]:.2e}); fedrec round {tf:.3f} s, centralized "
                  f"step {tc:.3f} s over {cands.shape[0]} samples", flush=True)

    result = {
        "model": args.model, "clients_per_round": args.clients, "repeats": args.repeats,
        "parameters_D": objective.dimension, "samples_per_round": samples,
        "fednewsrec_vectorized_seconds": vec_times, "fednewsrec_sequential_seconds": seq_times,
        "max_abs_difference": max(max_diffs),
        "speedup": statistics.median(seq_times) / statistics.median(vec_times),
        "conventional_loop_seconds": conv_times,
        "conventional_max_abs_difference": max(conv_diffs),
        "speedup_vs_conventional_loop": statistics.median(conv_times) / statistics.median(vec_times),
        "fedrec_round_seconds": fed_times, "centralized_step_seconds": cen_times,
        "fedrec_over_centralized": statistics.median(fed_times) / statistics.median(cen_times),
        "torch_threads": torch.get_num_threads(),
    }
    results.mkdir(parents=True, exist_ok=True)
    (results / "simulator_speed.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
