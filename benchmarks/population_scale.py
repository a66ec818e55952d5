"""The simulator's per-round work outside the model at a million users (docs/gpu.md).

Usage::

    python benchmarks/population_scale.py [--users 1000000 --clients 10000] [--smoke]

A ``ClientDataset`` of ``--users`` users built directly as tensors (histories of 50 rows,
3 samples of 8 non-clicked candidates per user; no MIND files), then what every round does
on the CPU whatever the device: sampling ``--clients`` clients (``sample_round``) or
q = clients / users (``poisson_round``), drawing those clients' inputs (``clients.client(u)``
and each client's seeded generator, the ranking task's ``client_inputs``), and central DP's
ledger update of every user (``PrivacyLedger.record_many``). Prints seconds and peak RSS;
saves nothing. ``--smoke``: 2,000 users and 100 clients.
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from privaterec.data.clients import ClientDataset
from privaterec.fed.objective import LocalObjective
from privaterec.fed.rng import client_noise
from privaterec.fed.sampling import poisson_round, roster, sample_round
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.ledger import PrivacyLedger

H, S_PER, M, NEWS = 50, 3, 8, 160_000


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def synthetic_clients(users: int, *, seed: int = 0) -> ClientDataset:
    """``users`` users as tensors: random histories of H news and S_PER samples each."""
    g = torch.Generator().manual_seed(seed)
    samples = users * S_PER
    return ClientDataset(user_ids=[f"U{i}" for i in range(users)],
                         history=torch.randint(1, NEWS, (users, H), generator=g),
                         history_mask=torch.ones(users, H, dtype=torch.bool),
                         sample_user=torch.arange(users).repeat_interleave(S_PER),
                         positives=torch.randint(1, NEWS, (samples,), generator=g),
                         negatives=torch.randint(1, NEWS, (samples, M), generator=g),
                         negative_counts=torch.full((samples,), M),
                         impression_size=torch.full((samples,), M + 1),
                         offsets=torch.arange(0, samples + 1, S_PER), skipped={})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--smoke", action="store_true",
                        help="2,000 users and 100 clients (seconds); prints only")
    args = parser.parse_args()
    if args.smoke:
        args.users, args.clients = 2_000, 100
    t = time.perf_counter()
    ds = synthetic_clients(args.users)
    print(f"dataset of {args.users:,} users {time.perf_counter() - t:.1f} s, "
          f"maxrss {_maxrss_mb():.0f} MB")
    pop = roster(ds)
    t = time.perf_counter()
    selected = sample_round(pop, args.clients, seed=0, round_index=1)
    a = time.perf_counter() - t
    t = time.perf_counter()
    poisson = poisson_round(pop, args.clients / args.users, seed=0, round_index=1)
    b = time.perf_counter() - t
    print(f"sample_round {args.clients:,} of {args.users:,}: {a:.3f} s; poisson_round "
          f"q={args.clients / args.users:g}: {b:.3f} s ({len(poisson)} clients)")
    t = time.perf_counter()
    # the ranking task's client_inputs; it reads no model, so no objective is built
    for u in selected:
        LocalObjective.client_inputs(None, ds.client(u), max_samples=64,  # type: ignore[arg-type]
                                     negatives=4, noise=client_noise(0, 1, u))
    c = time.perf_counter() - t
    print(f"inputs of {len(selected):,} clients: {c:.2f} s "
          f"({1e3 * c / len(selected):.2f} ms per client)")
    ledger = PrivacyLedger()
    ids = [ds.user_ids[int(u)] for u in pop]
    event = PrivacyEvent(mechanism="gaussian", epsilon=0.1, delta=1e-9, phase="train",
                         note="probe", noise_scale=1.0, sensitivity=1.0)
    t = time.perf_counter()
    ledger.record_many(ids, event)
    d1 = time.perf_counter() - t
    t = time.perf_counter()
    ledger.record_many(ids, event)
    d2 = time.perf_counter() - t
    print(f"ledger.record_many of {len(ids):,} users: first {d1:.2f} s, next round {d2:.2f} s")
    print(f"maxrss {_maxrss_mb():.0f} MB")


if __name__ == "__main__":
    main()
