"""Centralized baselines on the default synthetic data and on the EB-NeRD demo.

Usage::

    python benchmarks/centralized.py synth  [--seeds 0 1 2] [--epochs 3]
    python benchmarks/centralized.py ebnerd [--src ../shared/data/ebnerd-demo/train]

Prints a markdown table and saves ``benchmarks/results/centralized_<dataset>.json``.
Every row is trained and evaluated in this one run (side by side, same machine state).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from privaterec.config import ModelConfig, RunConfig, TrainConfig
from privaterec.data.ebnerd import convert_ebnerd
from privaterec.data.synth import SynthConfig, write_synthetic
from privaterec.runs.ranking import train_run

RESULTS = Path(__file__).resolve().parent / "results"
SYNTH_ROWS = [
    ("popularity", ModelConfig(), "popularity"),
    ("nrms", ModelConfig(news_encoder="nrms"), "centralized"),
    ("naml", ModelConfig(news_encoder="naml"), "centralized"),
    ("fednewsrec", ModelConfig(news_encoder="fednewsrec"), "centralized"),
    ("nrms news + lstur user", ModelConfig(news_encoder="nrms", user_encoder="lstur"),
     "centralized"),
]
EBNERD_ROWS = [
    ("popularity", ModelConfig(news_encoder="id"), "popularity"),
    ("id + nrms user", ModelConfig(news_encoder="id"), "centralized"),
]


def run_rows(data: Path, rows, seeds: list[int], epochs: int, work: Path) -> list[dict]:
    results = []
    for name, model, method in rows:
        per_seed = []
        for seed in seeds:
            config = RunConfig(data=str(data), model=model,
                               train=TrainConfig(method=method, epochs=epochs, seed=seed))
            started = time.perf_counter()
            metrics = train_run(config, work / f"{name}-{seed}".replace(" ", "_"),
                                progress=False)
            per_seed.append({**metrics["test"], "seconds": time.perf_counter() - started})
            print(f"{name} seed {seed}: auc {per_seed[-1]['auc']:.4f} "
                  f"({per_seed[-1]['seconds']:.0f} s)", file=sys.stderr, flush=True)
        results.append({"name": name, "method": method, "seeds": seeds, "runs": per_seed})
    return results


def summarise(results: list[dict]) -> str:
    lines = ["| model | test AUC (mean ± std over seeds) | MRR | nDCG@5 | nDCG@10 | impressions |"
             " seconds/run |", "|---|---|---|---|---|---|---|"]
    for row in results:
        def stat(key: str) -> str:
            values = [r[key] for r in row["runs"]]
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            return f"{statistics.mean(values):.4f} ± {sd:.4f}"
        seconds = statistics.median(r["seconds"] for r in row["runs"])
        lines.append(f"| {row['name']} | {stat('auc')} | {stat('mrr')} | {stat('ndcg@5')} | "
                     f"{stat('ndcg@10')} | {row['runs'][0]['impressions']} | {seconds:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", nargs="?", choices=["synth", "ebnerd"], default="synth")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=TrainConfig().epochs)
    parser.add_argument("--src", default=str(Path(__file__).resolve().parents[2] / "shared"
                                              / "data" / "ebnerd-demo" / "train"))
    parser.add_argument("--smoke", action="store_true",
                        help="tiny synthetic data, the first two rows with a tiny model, one seed, "
                             "one epoch, "
                             "results to a temporary directory")
    args = parser.parse_args()
    results_dir, synth = RESULTS, SynthConfig(seed=0)
    if args.smoke:
        from _smoke import smoke_dir

        args.dataset, args.seeds, args.epochs = "synth", [0], 1
        results_dir, synth = smoke_dir("centralized"), SynthConfig(users=120, news=400, seed=0)
    results_dir.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        extra: dict = {}
        if args.dataset == "synth":
            data = work / "synth"
            extra["synth"] = write_synthetic(data, synth)
            rows = SYNTH_ROWS
            if args.smoke:  # popularity and nrms, the model tiny
                from _smoke import smoke_model

                rows = [(name, smoke_model(news_encoder=model.news_encoder,
                                           user_encoder=model.user_encoder), method)
                        for name, model, method in SYNTH_ROWS[:2]]
        else:
            data = work / "ebnerd"
            extra["conversion"] = convert_ebnerd(args.src, data, test_days=1, max_history=50)
            rows = EBNERD_ROWS
        results = run_rows(data, rows, args.seeds, args.epochs, work / "runs")
    table = summarise(results)
    if args.dataset == "ebnerd":
        cold = results[0]["runs"][0]["cold_candidates_share"]
        table += (f"\n\nShare of test candidate impressions whose news never appears in a "
                  f"training impression (news cold start): {cold:.3f}")
    print(table)
    out = results_dir / f"centralized_{args.dataset}.json"
    out.write_text(json.dumps({"command": " ".join(sys.argv), "results": results,
                               "table": table, **extra}, indent=2, default=str))
    print(f"saved {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
