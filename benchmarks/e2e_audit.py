"""End-to-end privacy audit of every method's real client update (issue 13).

Usage::

    python benchmarks/e2e_audit.py [--runs 1000] [--epsilons 1 10] [--seed 0]

Audits fedrec, fednewsrec, dp-fedrec, privaterec (paper and strict modes) and unifedrec at
each ε under click and user adjacency (every neighbouring pair of
:mod:`privaterec.privacy.e2e_audit.world`), prints a markdown table and saves
``benchmarks/results/e2e_audit.md`` and ``.json``. The same as
``privaterec privacy audit --method ... --mode paper strict --adjacency click user
--epsilon E --runs N``. Exits 1 if a lower bound exceeds a valid claim.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch

from privaterec.privacy.e2e_audit import format_table, run_audit

RESULTS = Path(__file__).resolve().parent / "results"
TARGETS = [("fedrec", "strict"), ("fednewsrec", "strict"), ("dp-fedrec", "strict"),
           ("privaterec", "paper"), ("privaterec", "strict"), ("unifedrec", "strict")]


def _safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)
    if isinstance(x, dict):
        return {k: _safe(v) for k, v in x.items()}
    return x


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 10.0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    audits, seconds = [], {}
    start = time.perf_counter()
    for epsilon in args.epsilons:
        for method, mode in TARGETS:
            t0 = time.perf_counter()
            for adjacency in ("click", "user"):
                audits += run_audit(method, adjacency=adjacency, epsilon=epsilon, mode=mode,
                                    runs=args.runs, seed=args.seed)
            key = f"{method}/{mode}/eps={epsilon:g}"
            seconds[key] = round(time.perf_counter() - t0, 1)
            print(f"{key}: {seconds[key]} s", file=sys.stderr, flush=True)
    total = time.perf_counter() - start
    by_epsilon = []
    for epsilon in args.epsilons:
        rows = [a for a, e in zip(audits, _epsilons(audits, args)) if e == epsilon]
        by_epsilon.append(f"### Configured per-round ε = {epsilon:g}\n\n{format_table(rows)}")
    command = (f"python benchmarks/e2e_audit.py --runs {args.runs} --epsilons "
               f"{' '.join(f'{e:g}' for e in args.epsilons)} --seed {args.seed}")
    text = (f"# End-to-end privacy audit ({command})\n\n"
            f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
            f"{total:.0f} s in all\n\n" + "\n\n".join(by_epsilon) + "\n")
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "e2e_audit.md").write_text(text)
    (RESULTS / "e2e_audit.json").write_text(json.dumps({
        "command": command, "seconds": seconds, "total_seconds": round(total, 1),
        "audits": [dict(_safe(a.to_dict()), configured_epsilon=e)
                   for a, e in zip(audits, _epsilons(audits, args))]}, indent=2))
    return 1 if any(a.violated for a in audits) else 0


def _epsilons(audits, args) -> list[float]:
    """The configured ε of each audit, in the order they were run."""
    per = len(audits) // len(args.epsilons)
    return [args.epsilons[i // per] for i in range(len(audits))]


if __name__ == "__main__":
    sys.exit(main())
