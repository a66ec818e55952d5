"""Private training side by side on the default synthetic data: local DP vs central DP.

Trains (or reuses, per run directory) each row for the given seeds and prints a table of
test AUC with the privacy each run's ledger reports, at both adjacencies:

* FedRec (no privacy), DP-FedRec at ε_t = 10 per round (local DP), PrivateRec paper and
  strict mode at ε_t = 10 (with the label release that is blind to the clicks);
* DP-FedAvg (central, user-level DP; Poisson sampling q = 0.02, clip 0.1, 300 rounds) at a
  user-level ε of 8 and 1 for the whole run (δ = 1e-5 < 1/N);
* PrivateRec's B = 5 model trained with DP-FedAvg at ε = 8, evaluated without serving noise.

Usage::

    python benchmarks/private_training.py --out /tmp/ptrain --seeds 0 [1 2] [--rows ...]
    python benchmarks/private_training.py --smoke   # every row: tiny data and model, 2 rounds

Results are saved to ``benchmarks/results/private_training.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from privaterec.config import ModelConfig, RunConfig, TrainConfig, fed_config
from privaterec.experiments.common import resolve_data
from privaterec.privacy.report import read_privacy_json
from privaterec.runs.ranking import train_run

ROUNDS = 300
ROWS = {
    "fedrec": ("FedRec (no privacy)", "dp-fedrec", {"epsilon_train": math.inf}, 0),
    "dp-fedrec-10": ("DP-FedRec, local, eps_t = 10 / round", "dp-fedrec",
                     {"epsilon_train": 10.0}, 0),
    "privaterec-paper-10": ("PrivateRec paper mode, eps_t = 10 / round", "privaterec",
                            {"epsilon_train": 10.0, "privacy_mode": "paper"}, 0),
    "privaterec-strict-10": ("PrivateRec strict mode, eps_t = 10 / round", "privaterec",
                             {"epsilon_train": 10.0, "privacy_mode": "strict"}, 0),
    "dp-fedavg-8": ("DP-FedAvg, central, user-level eps = 8 (run)", "dp-fedavg",
                    {"target_epsilon": 8.0}, 0),
    "dp-fedavg-1": ("DP-FedAvg, central, user-level eps = 1 (run)", "dp-fedavg",
                    {"target_epsilon": 1.0}, 0),
    "privaterec-central-8": ("PrivateRec model (B = 5) by DP-FedAvg, eps = 8 (run)",
                             "dp-fedavg", {"target_epsilon": 8.0}, 5),
}


def _config(data: str, method: str, fed: dict, basis: int, seed: int, *,
            rounds: int = ROUNDS, model: ModelConfig | None = None) -> RunConfig:
    model = ModelConfig(news_encoder="nrms") if model is None else model
    return RunConfig(data=data, model=replace(model, basis_size=basis),
                     train=TrainConfig(method=method, seed=seed),
                     fed=fed_config(method, rounds=rounds, **fed))


def _privacy(run: Path) -> dict:
    summary = read_privacy_json(run / "privacy.json")
    report = summary["report"]
    user = report.get("phases_user", {}).get("train", {})
    return {"delta": summary["delta"],
            "epsilon_click": report["phases"]["train"]["epsilon_max"],
            "epsilon_user": user.get("epsilon_max"),
            "valid": not any("does NOT hold" in w for w in report.get("warnings", []))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--results", type=Path,
                        default=Path(__file__).parent / "results" / "private_training")
    parser.add_argument("--smoke", action="store_true",
                        help="every row on tiny synthetic data with a tiny model, 2 rounds, "
                             "the central rows at ε = 0.1 (quick to calibrate), everything in "
                             "a temporary directory")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rounds, model = ROUNDS, None
    if args.smoke:
        from _smoke import smoke_data, smoke_dir, smoke_model

        args.out = smoke_dir("private_training")
        args.results = args.out / "private_training"
        data, rounds, model = str(smoke_data(users=60, news=150)), 2, smoke_model()
    elif args.out is None:
        parser.error("--out is required (or --smoke)")
    else:
        data = resolve_data(args.out, None, quick=False, progress=True)
    records = []
    for key in args.rows:
        label, method, fed, basis = ROWS[key]
        if args.smoke and "target_epsilon" in fed:
            fed = {**fed, "target_epsilon": 0.1}
        for seed in args.seeds:
            run = args.out / "runs" / key / f"seed{seed}"
            start = time.perf_counter()
            metrics = train_run(_config(data, method, fed, basis, seed, rounds=rounds,
                                        model=model), run, progress=False)
            seconds = time.perf_counter() - start
            record = {"row": key, "label": label, "seed": seed,
                      "auc": metrics["test"]["auc"], "seconds": round(seconds, 1),
                      **_privacy(run)}
            records.append(record)
            print(json.dumps(record), file=sys.stderr, flush=True)
    lines = ["| row | seeds | test AUC (mean ± std) | ε click-level (run) | ε user-level (run) "
             "| δ |", "|---|---|---|---|---|---|"]
    for key in args.rows:
        rows = [r for r in records if r["row"] == key]
        aucs = [r["auc"] for r in rows]
        spread = f" ± {statistics.stdev(aucs):.4f}" if len(aucs) > 1 else ""
        first = rows[0]

        def eps(value: float | None, valid: bool) -> str:
            if value is None:
                return "-"
            text = "∞" if math.isinf(value) else f"{value:.3g}"
            return text if valid else f"{text} (not valid)"

        lines.append(f"| {first['label']} | {len(rows)} | {statistics.mean(aucs):.4f}{spread} "
                     f"| {eps(first['epsilon_click'], first['valid'])} "
                     f"| {eps(first['epsilon_user'], first['valid'])} | {first['delta']:g} |")
    table = "\n".join(lines)
    print(table)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.with_suffix(".json").write_text(json.dumps(records, indent=1))
    args.results.with_suffix(".md").write_text(table + "\n")


if __name__ == "__main__":
    main()
