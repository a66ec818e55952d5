"""Federated methods next to centralized training, on the synthetic data or EB-NeRD.

Usage::

    python benchmarks/federated.py synth  [--seeds 0 1 2] [--rounds 300]
    python benchmarks/federated.py ebnerd [--seeds 0 1 2] [--rounds 300]
    python benchmarks/federated.py --smoke   # every synth row: tiny data and model, 2 rounds

Rows (synth, nrms): centralized; fedrec; fednewsrec with the paper's defaults (r = 2%,
η = 0.5, δ = 0.005, λ = 0.015); dp-fedrec at ε_t ∈ {1, 10, ∞} (Laplace, θ = 0.005).
EB-NeRD (``id`` encoder): centralized, fedrec, dp-fedrec ε_t = 10. Every row is trained and
evaluated in this one run. Each private row reports the ledger's per-round ε and per-user
total ε (max and median over users, PLD composition at δ = 1e-5, from ``privacy.json``).
Prints a markdown table; saves ``benchmarks/results/federated_<dataset>.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

from privaterec.config import FedConfig, ModelConfig, RunConfig, TrainConfig, fed_config
from privaterec.data.ebnerd import convert_ebnerd
from privaterec.data.synth import SynthConfig, write_synthetic
from privaterec.privacy.report import read_privacy_json
from privaterec.runs.ranking import train_run

RESULTS = Path(__file__).resolve().parent / "results"
INF = math.inf


def rows_for(dataset: str, rounds: int, model: ModelConfig | None = None
             ) -> list[tuple[str, ModelConfig, str, FedConfig]]:
    """The rows of ``dataset`` (module docstring); ``model``: NRMS (synth) or ``id``."""
    if model is None:
        model = ModelConfig(news_encoder="nrms" if dataset == "synth" else "id")
    fed = FedConfig(rounds=rounds)
    rows = [("centralized", model, "centralized", FedConfig()),
            ("fedrec", model, "fedrec", fed)]
    if dataset == "synth":
        rows.append(("fednewsrec (paper defaults)", model, "fednewsrec", fed))
        rows.append(("fednewsrec lambda=0.0015 (10x less noise)", model, "fednewsrec",
                     fed_config("fednewsrec", rounds=rounds, noise_scale=0.0015)))
        epsilons = [1.0, 10.0, INF]
    else:
        epsilons = [10.0]
    for eps in epsilons:
        rows.append((f"dp-fedrec eps_t={eps:g}", model, "dp-fedrec",
                     fed_config("dp-fedrec", rounds=rounds, epsilon_train=eps)))
    return rows


def privacy_summary(run_dir: Path) -> dict:
    if not (run_dir / "privacy.json").exists():
        return {}
    summary = read_privacy_json(run_dir / "privacy.json")
    total = summary["report"]["phases"]["total"]
    release = summary["release"]
    return {"epsilon_per_round": release["epsilon_per_round"],
            "coordinate_epsilon": release.get("coordinate_epsilon"),
            "user_epsilon_max": total["epsilon_max"],
            "user_epsilon_median": total["epsilon_median"],
            "releases_max": total["releases_max"], "delta": summary["delta"],
            "composition": summary["report"]["composition"]}


def fmt(x: float | None) -> str:
    if x is None:
        return "–"
    return "∞" if math.isinf(x) else f"{x:.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", nargs="?", choices=["synth", "ebnerd"], default="synth")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--src", default=str(Path(__file__).resolve().parents[2] / "shared"
                                              / "data" / "ebnerd-demo" / "train"))
    parser.add_argument("--smoke", action="store_true",
                        help="every synth row on tiny synthetic data with a tiny model: one "
                             "seed, 2 rounds (centralized: 1 epoch), results to a temporary "
                             "directory")
    args = parser.parse_args()
    results_dir, synth, model, epochs = RESULTS, SynthConfig(seed=0), None, None
    if args.smoke:
        from _smoke import smoke_dir, smoke_model

        args.dataset, args.seeds, args.rounds, epochs = "synth", [0], 2, 1
        results_dir, synth = smoke_dir("federated"), SynthConfig(users=60, news=150, seed=0)
        model = smoke_model()
    results_dir.mkdir(exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.dataset == "synth":
            data = work / "synth"
            write_synthetic(data, synth)
        else:
            data = work / "ebnerd"
            convert_ebnerd(args.src, data, test_days=1, max_history=50)
        for name, row_model, method, fed in rows_for(args.dataset, args.rounds, model):
            runs = []
            for seed in args.seeds:
                train = TrainConfig(method=method, seed=seed)
                if epochs is not None:
                    train = TrainConfig(method=method, seed=seed, epochs=epochs)
                config = RunConfig(data=str(data), model=row_model, train=train, fed=fed)
                run_dir = work / "runs" / f"{name}-{seed}".replace(" ", "_")
                started = time.perf_counter()
                metrics = train_run(config, run_dir, progress=False)
                runs.append({**metrics["test"], "seconds": time.perf_counter() - started,
                             "privacy": privacy_summary(run_dir)})
                print(f"{name} seed {seed}: auc {runs[-1]['auc']:.4f} "
                      f"({runs[-1]['seconds']:.0f} s) {runs[-1]['privacy']}",
                      file=sys.stderr, flush=True)
            results.append({"name": name, "method": method, "fed": fed.__dict__, "runs": runs})
    lines = ["| method | test AUC (mean ± std) | per-round ε | per-user ε max / median "
             "(PLD, δ=1e-5) | seconds/run |", "|---|---|---|---|---|"]
    for row in results:
        aucs = [r["auc"] for r in row["runs"]]
        sd = statistics.stdev(aucs) if len(aucs) > 1 else 0.0
        p = row["runs"][0]["privacy"]
        per_round = fmt(p.get("epsilon_per_round")) if p else "–"
        if p.get("coordinate_epsilon") is not None:
            per_round += f" (per coordinate {fmt(p['coordinate_epsilon'])})"
        users = f"{fmt(p['user_epsilon_max'])} / {fmt(p['user_epsilon_median'])}" if p else "–"
        seconds = statistics.median(r["seconds"] for r in row["runs"])
        lines.append(f"| {row['name']} | {statistics.mean(aucs):.4f} ± {sd:.4f} | {per_round} "
                     f"| {users} | {seconds:.0f} |")
    table = "\n".join(lines)
    print(table)
    out = results_dir / f"federated_{args.dataset}.json"
    out.write_text(json.dumps({"command": " ".join(sys.argv), "results": results,
                               "table": table}, indent=2, default=str))
    print(f"saved {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
