"""One-run empirical ε of a whole dp-fedavg training run (Andrew et al., ICLR 2024).

Usage::

    python benchmarks/one_run_audit.py [--users 300] [--rounds 20] [--q 0.1] [--canaries 1000]
    python benchmarks/one_run_audit.py --smoke

Writes a synthetic data set (``privaterec.data.synth``), then trains dp-fedavg on the
simulator at ε ∈ {1, 8} and at ε = 1 with the aggregator's noise cut 4× (a broken variant:
the ledger keeps claiming ε = 1), each with K canary clients
(:func:`privaterec.audit.one_run.one_run_audit`), and prints the estimate next to the
ledger's ε, with μ̂'s standard error and the ε of μ̂ ± 1.96 se (the estimate's own spread:
it is not a bound). Saves ``benchmarks/results/one_run_audit.md`` and ``.json`` (another
``--users`` U or ``--canaries`` K: ``one_run_audit_Uusers_Kcanaries.*``; ``--smoke``: a
temporary directory).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

from privaterec.audit.one_run import gdp_epsilon, one_run_audit
from privaterec.config import ModelConfig, RunConfig, TrainConfig, fed_config
from privaterec.data.synth import SynthConfig, write_synthetic

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = ModelConfig(word_dim=8, num_heads=2, head_dim=4, attention_dim=8, title_len=6,
                    abstract_len=4, history_len=5)
CASES = ((1.0, 1.0), (8.0, 1.0), (1.0, 0.25))  # (claimed epsilon, noise factor)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--q", type=float, default=0.1)
    parser.add_argument("--canaries", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true",
                        help="60 users, 3 rounds, 50 canaries: checks that it runs")
    args = parser.parse_args()
    if args.smoke:
        args.users, args.rounds, args.canaries = 60, 3, 50
    torch.set_num_threads(1)
    rows = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        write_synthetic(data, SynthConfig(users=args.users, news=max(150, 2 * args.users),
                                          seed=args.seed))
        for epsilon, factor in CASES:
            config = RunConfig(
                data=str(data / "train"), model=MODEL,
                train=TrainConfig(method="dp-fedavg", seed=args.seed),
                fed=fed_config("dp-fedavg", rounds=args.rounds, client_fraction=args.q,
                               target_epsilon=epsilon, target_delta=1e-5))
            t0 = time.perf_counter()
            estimate = one_run_audit(config, canaries=args.canaries, noise_factor=factor)
            # μ̂'s standard error (two independent sample means over the held-out std) and
            # the ε of μ̂ ± 1.96 se: how far the estimate itself may be off (not a bound)
            se = math.sqrt(estimate.inserted_std ** 2 / args.canaries
                           + estimate.held_out_std ** 2 / args.canaries) / estimate.held_out_std
            rows.append(dict(dataclasses.asdict(estimate), claimed_epsilon=epsilon,
                             mu_se=se,
                             epsilon_interval=[gdp_epsilon(estimate.mu - 1.96 * se, 1e-5),
                                               gdp_epsilon(estimate.mu + 1.96 * se, 1e-5)],
                             seconds=round(time.perf_counter() - t0, 1)))
            print(rows[-1], file=sys.stderr, flush=True)
    command = ("python benchmarks/one_run_audit.py" + (" --smoke" if args.smoke else
               f" --users {args.users} --rounds {args.rounds} --q {args.q} "
               f"--canaries {args.canaries} --seed {args.seed}"))
    lines = [f"# One-run canary estimate of dp-fedavg ({command})", "",
             f"{args.users} synthetic users, T = {args.rounds} rounds, q = {args.q}, "
             f"K = {args.canaries} inserted + {args.canaries} held-out canaries, delta = 1e-5, "
             f"{time.perf_counter() - start:.0f} s in all", "",
             "| configured ε | noise | z | D | μ̂ ± se | one-run ε estimate | ε at μ̂ ± 1.96 se | "
             "ledger ε (replace) | ledger ε (add/remove) | cos inserted | cos held out |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        noise = "calibrated" if r["noise_factor"] == 1.0 else f"cut {1 / r['noise_factor']:g}x"
        lines.append(f"| {r['claimed_epsilon']:g} | {noise} | {r['noise_multiplier']:.3g} | "
                     f"{r['dimension']} | {r['mu']:.3f} ± {r['mu_se']:.3f} | {r['epsilon']:.3f} | "
                     f"{r['epsilon_interval'][0]:.2f}–{r['epsilon_interval'][1]:.2f} | "
                     f"{r['ledger_epsilon']:.3f} | {r['ledger_epsilon_add_remove']:.3f} | "
                     f"{r['inserted_mean']:.4f} ± {r['inserted_std']:.4f} | "
                     f"{r['held_out_mean']:.4f} ± {r['held_out_std']:.4f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.smoke:  # a smoke run's numbers mean nothing: never into benchmarks/results
        from _smoke import smoke_dir
        results = smoke_dir("one_run_audit")
    else:
        results = RESULTS
    results.mkdir(exist_ok=True)
    stem = ("one_run_audit" + ("" if args.users == 300 else f"_{args.users}users")
            + ("" if args.canaries == 1000 else f"_{args.canaries}canaries"))
    (results / f"{stem}.md").write_text(text)
    (results / f"{stem}.json").write_text(json.dumps({"command": command, "rows": rows},
                                                     indent=2))
    print(f"saved {results / (stem + '.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
