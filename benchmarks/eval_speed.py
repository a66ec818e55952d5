"""Time to evaluate 10k impressions with the default nrms model (each news encoded once).

Usage::

    python benchmarks/eval_speed.py [--impressions 10000] [--repeats 3] [--smoke]

Evaluation cost does not depend on the trained weights, so the model is freshly initialised.
Prints JSON and saves ``benchmarks/results/eval_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impressions", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny data, 1 repeat, results to a temporary directory")
    args = parser.parse_args()
    users, news = 4000, 12000
    out = Path(__file__).resolve().parent / "results" / "eval_speed.json"
    if args.smoke:
        from _smoke import smoke_dir

        users, news, args.impressions, args.repeats = 100, 400, 200, 1
        out = smoke_dir("eval_speed") / "eval_speed.json"
    with tempfile.TemporaryDirectory() as tmp:
        # all days but the first go to test so that the test split is large
        config = SynthConfig(users=users, news=news, days=8, test_days=5,
                             impressions_per_user=5.0, seed=0)
        write_synthetic(tmp, config)
        prepared = prepare_data(RunConfig(data=tmp, model=ModelConfig()))
        test = prepared.dataset.test
        test = replace(test, behaviors=test.behaviors[: args.impressions])
        torch.manual_seed(0)
        model = build_recommender(ModelConfig(), prepared.vocabs, prepared.features)
        seconds, result = [], {}
        for _ in range(args.repeats):
            started = time.perf_counter()
            result = evaluate_model(model, test, prepared.features, history_len=50)
            seconds.append(time.perf_counter() - started)
    report = {"command": " ".join(sys.argv), "impressions": result["impressions"],
              "candidates": sum(len(i.candidates) for i in test.behaviors),
              "seconds_median": statistics.median(seconds), "seconds": seconds,
              "torch_threads": torch.get_num_threads()}
    print(json.dumps(report, indent=2))
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
