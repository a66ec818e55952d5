"""Memory of evaluating a large test split: RSS growth while scoring N impressions.

Usage::

    python benchmarks/eval_memory.py [--impressions 30000] [--save PATH] [--smoke]

Builds a synthetic data set whose test split has at least N impressions, evaluates a freshly
initialised NRMS on the first N, and reports the process RSS before and after
``evaluate_model`` and the peak (``ru_maxrss``). Prints JSON and saves it
(default ``benchmarks/results/eval_memory.json``).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from privaterec.config import ModelConfig, RunConfig
from privaterec.data.synth import SynthConfig, write_synthetic
from privaterec.eval.evaluate import evaluate_model
from privaterec.models.factory import build_recommender
from privaterec.runs.ranking import prepare_data


def _rss_mb() -> float:
    """Current resident set size in MB (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impressions", type=int, default=30_000)
    parser.add_argument("--save", default=str(Path(__file__).resolve().parent / "results"
                                              / "eval_memory.json"))
    parser.add_argument("--smoke", action="store_true",
                        help="tiny data, results to a temporary directory")
    args = parser.parse_args()
    users, news = 12000, 6000
    if args.smoke:
        from _smoke import smoke_dir

        users, news, args.impressions = 100, 400, 200
        args.save = str(smoke_dir("eval_memory") / "eval_memory.json")
    with tempfile.TemporaryDirectory() as tmp:
        config = SynthConfig(users=users, news=news, days=8, test_days=5,
                             impressions_per_user=5.0, seed=0)
        write_synthetic(tmp, config)
        prepared = prepare_data(RunConfig(data=tmp, model=ModelConfig()))
        test = prepared.dataset.test
        test = replace(test, behaviors=test.behaviors[: args.impressions])
        torch.manual_seed(0)
        model = build_recommender(ModelConfig(), prepared.vocabs, prepared.features)
        before = _rss_mb()
        started = time.perf_counter()
        result = evaluate_model(model, test, prepared.features, history_len=50)
        seconds = time.perf_counter() - started
        after = _rss_mb()
    report = {"command": " ".join(sys.argv), "impressions": result["impressions"],
              "auc": result["auc"], "seconds": seconds, "rss_before_mb": before,
              "rss_after_mb": after, "rss_growth_mb": after - before,
              "rss_growth_kb_per_impression": (after - before) * 1024 / result["impressions"],
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    print(json.dumps(report, indent=2))
    Path(args.save).parent.mkdir(parents=True, exist_ok=True)
    Path(args.save).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
