"""End-to-end privacy audit of every method's real client update.

Usage::

    python benchmarks/e2e_audit.py [--runs 1000] [--epsilons 1 10] [--seed 0]
    python benchmarks/e2e_audit.py --broken [--runs 1000]

Audits fedrec, fednewsrec, dp-fedrec, privaterec (paper and strict modes) and unifedrec at
each ε under click and user adjacency (every neighbouring pair of
:mod:`privaterec.audit.world`), prints a markdown table and saves
``benchmarks/results/e2e_audit.md`` and ``.json``. The same as
``privaterec privacy audit --method ... --mode paper strict --adjacency click user
--epsilon E --runs N``. Exits 1 if a lower bound exceeds a valid claim.

``--broken`` audits the known-broken variants of :mod:`privaterec.audit.broken`
at ε = 1 instead (each must exceed its claim) and saves ``e2e_audit_broken.md``/``.json``.

``--canary`` runs the worst-case canary audits of the central-DP methods at claimed ε = 1
(:mod:`privaterec.audit.canary`) with their power (the smallest noise cut caught) and, with
``--repeats R``, the false-alarm count of R audits of each correct method (seeds 0 … R−1);
``--methods`` picks the methods, ``--canary-runs`` the rounds per side (default per method),
``--smoke``: dp-fedavg's canary audit at 20,000 rounds, to a temporary directory. Saves
``e2e_audit_canary*.md``/``.json``.
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

from privaterec.audit import broken, format_table, run_audit
from privaterec.audit.canary import (CANARY_METHODS, DEFAULT_CANARY_RUNS, canary_games,
                                     format_power, play, run_canary_audit)
from privaterec.audit.runner import PairAudit

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
    parser.add_argument("--broken", action="store_true",
                        help="audit the known-broken variants instead")
    parser.add_argument("--canary", action="store_true",
                        help="worst-case canary audits of central DP, with their power")
    parser.add_argument("--methods", nargs="+", default=list(CANARY_METHODS))
    parser.add_argument("--canary-runs", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=0,
                        help="--canary: also count false alarms over this many seeds")
    parser.add_argument("--no-power", action="store_true",
                        help="--canary: skip the broken variants")
    parser.add_argument("--smoke", action="store_true",
                        help="the canary audit of dp-fedavg at 20,000 rounds per side, results "
                             "to a temporary directory: checks that it runs")
    args = parser.parse_args()
    if args.smoke:
        args.canary, args.methods, args.repeats = True, ["dp-fedavg"], min(args.repeats, 2)
    if args.broken:
        return run_broken(args)
    if args.canary:
        return run_canary(args)
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


BROKEN = [  # (variant, context, method, mode, adjacency, pair)
    ("published DPL (click always in the candidate set)", broken.published_dpl, "privaterec",
     "strict", "click", "label"),
    ("Laplace noise 10x smaller than calibrated", lambda: broken.scaled_noise(0.1),
     "dp-fedrec", "strict", "user", "one-impression"),
    ("Laplace noise 10x smaller than calibrated", lambda: broken.scaled_noise(0.1),
     "unifedrec", "strict", "user", "one-impression"),
    ("reply carries the raw loss", broken.reply_with_loss, "dp-fedrec", "strict", "user",
     "one-impression"),
    ("central noise 100x smaller than calibrated (news-vector clipping)",
     lambda: broken.scaled_gaussian_noise(0.01), "dp-fedavg-news", "strict", "user",
     "one-impression"),
    ("noise on the news the round touched only (news-vector clipping)",
     broken.noise_on_touched_news_only, "dp-fedavg-news", "strict", "click", "history"),
]


def run_broken(args: argparse.Namespace) -> int:
    """Audit each broken variant at ε = 1 on its pair; exit 1 unless all are caught."""
    rows: list[tuple[str, PairAudit]] = []
    for variant, context, method, mode, adjacency, name in BROKEN:
        with context():
            audits = run_audit(method, adjacency=adjacency, epsilon=1.0, mode=mode,
                               runs=args.runs, seed=args.seed)
        rows.append((variant, next(a for a in audits if a.pair == name)))
    command = f"python benchmarks/e2e_audit.py --broken --runs {args.runs} --seed {args.seed}"
    lines = [f"# Broken variants ({command})", "",
             "| variant | method | neighbours | claimed ε | lower bound | margin | test | "
             "caught |", "|---|---|---|---|---|---|---|---|"]
    for variant, a in rows:
        r = a.result
        lines.append(f"| {variant} | {a.method} | {a.adjacency}: {a.pair} | "
                     f"{a.claimed_epsilon:g} | {r.epsilon_lower_bound:.2f} | "
                     f"{r.epsilon_lower_bound - a.claimed_epsilon:+.2f} | {r.statistic}; FPR "
                     f"{r.false_positive_rate:.3f}, FNR {r.false_negative_rate:.3f} | "
                     f"{'yes' if a.violated else 'NO'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "e2e_audit_broken.md").write_text(text)
    (RESULTS / "e2e_audit_broken.json").write_text(json.dumps({
        "command": command, "audits": [dict(_safe(a.to_dict()), variant=v) for v, a in rows]},
        indent=2))
    return 0 if all(a.violated for _, a in rows) else 1


def run_canary(args: argparse.Namespace) -> int:
    """Canary audits with power, and false alarms over ``--repeats`` seeds (module doc)."""
    runs_of = {m: (20_000 if args.smoke else args.canary_runs or DEFAULT_CANARY_RUNS[m])
               for m in args.methods}
    repeats = min(args.repeats, 2) if args.smoke else args.repeats
    suffix = "_smoke" if args.smoke else ("" if len(args.methods) == len(CANARY_METHODS)
                                          else "_" + "_".join(args.methods))
    command = ("python benchmarks/e2e_audit.py --canary"
               + (" --smoke" if args.smoke else "")
               + f" --methods {' '.join(args.methods)}"
               + (f" --canary-runs {args.canary_runs}" if args.canary_runs else "")
               + (f" --repeats {args.repeats}" if args.repeats else "")
               + (" --no-power" if args.no_power else "") + f" --seed {args.seed}")
    audits, alarms, seconds = [], [], {}
    for method in args.methods:
        t0 = time.perf_counter()
        if not args.no_power:
            audits += run_canary_audit(method, epsilon=1.0, runs=runs_of[method],
                                       seed=args.seed, power=True)
        for game in canary_games(method, epsilon=1.0) if repeats else []:
            bounds = [play(game, runs=runs_of[method], seed=s).epsilon_lower_bound
                      for s in range(repeats)]
            alarms.append({"method": method, "neighbours": f"{game.adjacency}: {game.pair}",
                           "claimed_epsilon": game.claimed_epsilon, "runs": runs_of[method],
                           "repeats": repeats,
                           "false_alarms": sum(b > game.claimed_epsilon for b in bounds),
                           "max_bound": max(bounds), "bounds": bounds})
        seconds[method] = round(time.perf_counter() - t0, 1)
        print(f"{method}: {seconds[method]} s", file=sys.stderr, flush=True)
    lines = [f"# Worst-case canary audits of central DP ({command})", "",
             f"torch {torch.__version__}, claimed epsilon = 1 (replace-one), delta = 1e-5", ""]
    if audits:
        lines += [format_power(audits), ""]
    if alarms:
        lines += ["| method | neighbours | claimed ε | runs | correct audits | false alarms | "
                  "largest bound |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {a['method']} | {a['neighbours']} | {a['claimed_epsilon']:.3g} | "
                  f"{a['runs']} | {a['repeats']} | {a['false_alarms']} | "
                  f"{a['max_bound']:.3f} |" for a in alarms]
    text = "\n".join(lines) + "\n"
    print(text)
    results = RESULTS
    if args.smoke:  # a smoke run's numbers mean nothing: never into benchmarks/results
        from _smoke import smoke_dir
        results = smoke_dir("e2e_audit")
    results.mkdir(exist_ok=True)
    (results / f"e2e_audit_canary{suffix}.md").write_text(text)
    (results / f"e2e_audit_canary{suffix}.json").write_text(json.dumps({
        "command": command, "seconds": seconds,
        "audits": [dict(_safe(c.audit.to_dict()), detected_cut=c.detected_cut,
                        cuts=list(c.cuts)) for c in audits],
        "false_alarms": alarms}, indent=2))
    return 1 if any(c.audit.violated for c in audits) or any(a["false_alarms"]
                                                             for a in alarms) else 0


def _epsilons(audits, args) -> list[float]:
    """The configured ε of each audit, in the order they were run."""
    per = len(audits) // len(args.epsilons)
    return [args.epsilons[i // per] for i in range(len(audits))]


if __name__ == "__main__":
    sys.exit(main())
