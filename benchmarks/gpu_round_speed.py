"""Clients per second of a federated round on the CPU and on a CUDA GPU (docs/gpu.md).

Usage::

    python benchmarks/gpu_round_speed.py [--devices cpu cuda] [--clients 1000 10000]
        [--cpu-clients 50] [--models default published] [--users 50000] [--repeats 3]
        [--out results.json]
    python benchmarks/gpu_round_speed.py --smoke     # a tiny setting, seconds

For each device, model and number m of clients per round, on one synthetic population
(``SynthConfig(users=--users)``, 3,000 news, generated in memory), two rounds over the same
m clients (``sample_round``, seed 0) and the same round index:

* ``fedrec``: the non-private round, one forward and one backward pass over the round's
  samples with each news encoded once (``LocalObjective.round_gradient``);
* ``dp-fedavg``: central DP, per-client gradients by ``vmap(grad)`` in chunks of
  ``--chunk`` clients (16 on the CPU, the engine's default), each clipped to L2 norm C,
  summed, one Gaussian draw (``CentralDP.round``).

Each round is split in two timed phases: ``inputs_s``, drawing every client's samples and
negatives from its seeded CPU generator and packing them (the same calls as
``simulate_round``; always on the CPU), and ``compute_s``, the method's round on the device
(``torch.cuda.synchronize`` before the clock stops). ``round_s`` is their sum and
``clients_per_s`` = m / ``round_s``; ``compute_clients_per_s`` = m / ``compute_s``. One
untimed round of each first (CUDA's kernels load, dp-accounting calibrates once), then the
median of ``--repeats``.

Models: ``default`` is ``ModelConfig()`` (NRMS, 8 heads of 16, 64-d random frozen word
vectors, titles of 16); ``published`` is the ``nrms-published`` preset (300-d corpus word
vectors, 20 heads of 20, additive attention 200, titles of 30). The CPU measures
``--cpu-clients`` clients per round instead of each m (a DP round of 1,000 clients takes
minutes on a few cores; its clients per second hardly depend on m). A setting that runs out
of GPU memory is recorded as ``"error": "out of memory"``.

Prints JSON (and writes it to ``--out``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from typing import Any, Callable

import torch

from privaterec.config import (ModelConfig, RunConfig, TrainConfig, fed_config, model_preset,
                               replace)
from privaterec.data.clients import ClientDataset, build_client_dataset
from privaterec.data.features import build_news_features, build_vocabularies
from privaterec.data.synth import SynthConfig, generate
from privaterec.fed.methods import ClientMethod, method_from_config, resolve_run_config
from privaterec.fed.methods.base import RoundContext
from privaterec.fed.objective import LocalObjective
from privaterec.fed.rng import client_noise
from privaterec.fed.sampling import eligible_clients, sample_round
from privaterec.models.factory import build_recommender
from privaterec.runtime.determinism import deterministic_algorithms, flush_denormals
from privaterec.runtime.device import resolve_device

SMOKE_MODEL = ModelConfig(word_dim=16, num_heads=2, head_dim=8, attention_dim=16,
                          title_len=8, abstract_len=4, history_len=10)


def model_config(name: str, smoke: bool) -> ModelConfig:
    """``default`` or ``published`` (the ``nrms-published`` preset); tiny with ``smoke``."""
    if smoke:
        return SMOKE_MODEL if name == "default" else replace(
            SMOKE_MODEL, embeddings="corpus", word_dim=24, num_heads=3, head_dim=8,
            title_len=12)
    return ModelConfig() if name == "default" else model_preset("nrms-published")


def population(users: int, news: int, model: ModelConfig) -> tuple[Any, Any, ClientDataset]:
    """The synthetic data set's vocabularies, news table and training clients."""
    dataset = generate(SynthConfig(users=users, news=news, seed=0))
    vocabs = build_vocabularies(dataset.train.news.values())
    features = build_news_features(dataset.all_news(), vocabs, title_len=model.title_len,
                                   abstract_len=model.abstract_len)
    clients = build_client_dataset(dataset.train, features, history_len=model.history_len)
    return vocabs, features, clients


def method_of(name: str, users: int, m: int) -> ClientMethod:
    """``fedrec``, or ``dp-fedavg`` at z = 1.0, C = 0.05, q = m / N."""
    fed = ({} if name == "fedrec" else
           {"noise_multiplier": 1.0, "clip": 0.05, "client_fraction": m / users,
            "target_delta": 1.0 / (10 * users)})
    config = RunConfig(data="unused", train=TrainConfig(method=name),
                       fed=fed_config(name, rounds=100, **fed))
    return method_from_config(resolve_run_config(config))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_round(task: LocalObjective, params: torch.Tensor, clients: ClientDataset,
               selected: list[int], method: ClientMethod, *, chunk: int,
               device: torch.device) -> dict[str, float]:
    """One round as ``simulate_round`` computes it, its two phases timed."""
    started = time.perf_counter()
    data = {u: clients.client(u) for u in selected}
    generators = [client_noise(0, 1, u) for u in selected]
    inputs = [method.inputs(task, data[u], noise=g) for u, g in zip(selected, generators)]
    drawn = time.perf_counter()
    context = RoundContext(seed=0, round_index=1, chunk_clients=chunk,
                           population=clients.num_users)
    out = method.round(task, params, inputs, generators, context)
    float(out.direction.norm())  # the result is used, not only queued
    _sync(device)
    done = time.perf_counter()
    return {"inputs_s": drawn - started, "compute_s": done - drawn, "round_s": done - started}


def measure(device: torch.device, model_name: str, model: ModelConfig, data: tuple[Any, ...],
            m: int, *, repeats: int, chunk: int) -> list[dict[str, Any]]:
    """The fedrec and dp-fedavg rounds of ``m`` clients on ``device`` (median of repeats)."""
    vocabs, features, clients = data
    torch.manual_seed(0)
    recommender = build_recommender(model, vocabs, features).to(device)
    task = LocalObjective(recommender)
    params = task.parameters()
    eligible = eligible_clients(clients)
    selected = sample_round(eligible, min(m, len(eligible)), seed=0, round_index=1)
    rows = []
    for name in ("fedrec", "dp-fedavg"):
        row: dict[str, Any] = {"device": str(device), "model": model_name,
                               "dimension": task.dimension, "clients": len(selected),
                               "method": name, "chunk_clients": chunk}
        method = method_of(name, clients.num_users, len(selected))
        try:
            time_round(task, params, clients, selected, method, chunk=chunk, device=device)
            runs = [time_round(task, params, clients, selected, method, chunk=chunk,
                               device=device) for _ in range(repeats)]
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            row["error"] = "out of memory"
            rows.append(row)
            continue
        for key in ("inputs_s", "compute_s", "round_s"):
            row[key] = statistics.median(r[key] for r in runs)
        row["clients_per_s"] = row["clients"] / row["round_s"]
        row["compute_clients_per_s"] = row["clients"] / row["compute_s"]
        if device.type == "cuda":
            row["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
            torch.cuda.reset_peak_memory_stats(device)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    for row in rows:
        if row["method"] == "dp-fedavg" and "round_s" in row:
            plain = next(r for r in rows if r["method"] == "fedrec")
            if "round_s" in plain:
                row["dp_over_plain_round"] = row["round_s"] / plain["round_s"]
                row["dp_over_plain_compute"] = row["compute_s"] / plain["compute_s"]
    del task, recommender, params
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def run(args: argparse.Namespace, emit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    devices = [resolve_device(d) for d in args.devices]
    results: list[dict[str, Any]] = []
    setup: dict[str, float] = {}
    for model_name in args.models:
        model = model_config(model_name, args.smoke)
        started = time.perf_counter()
        data = population(args.users, args.news, model)
        setup[model_name] = time.perf_counter() - started
        for device in devices:
            counts = args.clients if device.type == "cuda" else [args.cpu_clients]
            chunk = args.chunk if device.type == "cuda" else args.cpu_chunk
            for m in counts:
                results.extend(measure(device, model_name, model, data, m,
                                       repeats=args.repeats if device.type == "cuda"
                                       else args.cpu_repeats, chunk=chunk))
    out = {"benchmark": "gpu_round_speed", "smoke": args.smoke, "users": args.users,
           "news": args.news, "setup_s": setup, "torch": torch.__version__,
           "cuda": torch.version.cuda,
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
           "cpu_threads": torch.get_num_threads(), "machine": platform.machine(),
           "tf32": torch.backends.cuda.matmul.allow_tf32, "rows": results}
    emit(out)
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    parser.add_argument("--devices", nargs="+", default=default_devices)
    parser.add_argument("--clients", nargs="+", type=int, default=[1000, 10000],
                        help="clients per round on CUDA")
    parser.add_argument("--cpu-clients", type=int, default=50,
                        help="clients per round on the CPU")
    parser.add_argument("--models", nargs="+", choices=["default", "published"],
                        default=["default", "published"])
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--news", type=int, default=3000)
    parser.add_argument("--chunk", type=int, default=256, help="clients per vmap chunk (CUDA)")
    parser.add_argument("--cpu-chunk", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu-repeats", type=int, default=1)
    parser.add_argument("--smoke", action="store_true",
                        help="300 users, 20 clients per round, tiny models: seconds")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.smoke:
        args.users, args.news, args.clients, args.cpu_clients = 300, 400, [20], 20
        args.repeats = args.cpu_repeats = 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)

    def emit(out: dict[str, Any]) -> None:
        text = json.dumps(out, indent=2)
        print(text)
        if args.out:
            with open(args.out, "w") as handle:
                handle.write(text + "\n")

    with deterministic_algorithms(), flush_denormals():
        run(args, emit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
