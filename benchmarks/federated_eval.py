"""Federated evaluation against server-side evaluation of the same model and impressions.

Usage::

    python benchmarks/federated_eval.py [--users 2000] [--rounds 300] [--repeats 200]
    python benchmarks/federated_eval.py --smoke

Writes a synthetic population (``privaterec data synth``), trains one ``fedrec`` run on the
simulator with ``--eval federated`` (its ledger and ``privacy.json`` hold the accounted
evaluation; the default NRMS, 2% of the users per round, as ``benchmarks/federated.py``),
then evaluates the trained model on the enrolled users' test impressions:

* **server-side**: every metric averaged over the evaluable impressions (a click and a
  non-click), as a server holding the impressions would (``evaluate_model``'s scores), and
  the users' mean (each user's metrics averaged first);
* **federated**: ``--repeats`` independent federated evaluations, every enrolled device
  asked: each device's clipped vector (:func:`privaterec.eval.federated.device_vector`,
  computed once: θ is fixed) plus seeded Gaussian noise at the policy's σ (one draw for
  all devices per repeat), aggregated by :func:`privaterec.eval.federated.aggregate`, at
  each ε of ``--epsilons`` and two clips: K = the largest per-user count (the estimand is
  the server-side per-impression mean) and K = 1 (the users' mean).

For each it reports the first repeat's difference from the server-side value, the accounted
standard deviation of the estimate (σ·√(n(1 + m²))/count), and the empirical standard
deviation over the repeats. Prints a Markdown table and saves
``benchmarks/results/federated_eval.{json,md}`` (``--smoke``: a temporary directory).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _smoke import smoke_dir  # noqa: E402

from privaterec.config import ModelConfig, RunConfig, TrainConfig, fed_config  # noqa: E402
from privaterec.data.mind import load_dataset  # noqa: E402
from privaterec.data.synth import SynthConfig, write_synthetic  # noqa: E402
from privaterec.eval.evaluate import score_impressions  # noqa: E402
from privaterec.eval.federated import (METRICS, EvaluationPolicy, aggregate,  # noqa: E402
                                       device_vector, evaluable)
from privaterec.eval.metrics import evaluate_impressions  # noqa: E402
from privaterec.privacy.samplers import SimulationNoise  # noqa: E402
from privaterec.runs.ranking import train_run  # noqa: E402
from privaterec.runs.ranking_setup import load_run_model, prepare_data  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SMALL = ModelConfig(word_dim=32, num_heads=4, head_dim=8, attention_dim=32, title_len=12,
                    abstract_len=8, history_len=20)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=2000)
    parser.add_argument("--news", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 8.0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, temporary output")
    args = parser.parse_args(argv)
    if args.smoke:
        args.users, args.news, args.rounds, args.repeats = 60, 200, 1, 5
    out = smoke_dir("federated-eval") if args.smoke else RESULTS
    work = Path(tempfile.mkdtemp(prefix="privaterec-federated-eval-"))  # data and run
    started = time.perf_counter()

    write_synthetic(work / "data", SynthConfig(users=args.users, news=args.news,
                                               seed=args.seed))
    model_config = SMALL if args.smoke else ModelConfig()
    config = RunConfig(data=str(work / "data"), model=model_config,
                       train=TrainConfig(method="fedrec", seed=args.seed),
                       fed=fed_config("fedrec", rounds=args.rounds, client_fraction=0.02,
                                      evaluation="federated",
                                      eval_epsilon=max(args.epsilons)))
    metrics = train_run(config, work / "run", progress=False)
    trained = time.perf_counter() - started

    # The enrolled users' labelled test impressions, scored once with the trained model.
    _, _, model = load_run_model(work / "run")
    prepared = prepare_data(config)
    enrolled = set(prepared.train_clients.user_ids)
    test = load_dataset(work / "data").test
    assert test is not None
    own = [imp for imp in test.behaviors if imp.user_id in enrolled and imp.labels is not None]
    split = type(test)(news=test.news, behaviors=own, path=test.path)
    scored = score_impressions(model, split, prepared.features,
                               history_len=model_config.history_len)
    by_user: dict[str, list] = {}
    for imp, pair in zip(own, scored.pairs):
        by_user.setdefault(imp.user_id, []).append(pair)
    users = sorted(enrolled)  # every enrolled device is asked (fraction 1)
    pairs = [p for p in scored.pairs if evaluable(p[0])]
    per_impression = evaluate_impressions(pairs)
    means = [device_vector(by_user.get(u, []), clip=1.0) for u in users]
    has = [v for v in means if float(v[-1]) > 0]
    user_mean = {m: float(np.mean([float(v[j]) for v in has])) for j, m in enumerate(METRICS)}
    max_count = max(sum(1 for p in ps if evaluable(p[0])) for ps in by_user.values())

    rows = []
    for epsilon in args.epsilons:
        for clip, reference, what in ((float(max_count), per_impression, "per impression"),
                                      (1.0, user_mean, "per user")):
            policy = EvaluationPolicy(epsilon=epsilon, delta=1e-6, clip=clip)
            # Each device's clipped vector once (θ is fixed), then per repeat every device's
            # Gaussian noise at the policy's σ (one seeded draw of [n, 5] per repeat: the
            # simulator's noise, drawn in one call) and the server's aggregate.
            vectors = torch.stack([device_vector(by_user.get(uid, []), clip=clip)
                                   for uid in users])
            estimates = []
            for r in range(args.repeats):
                noise = SimulationNoise(torch.Generator().manual_seed(1000 * args.seed + r))
                released = noise.release_gaussian(vectors, sigma=policy.sigma)
                estimates.append(aggregate(released, sigma=policy.sigma))
            first = estimates[0]
            for m in METRICS:
                values = [e.metrics[m] for e in estimates]
                rows.append({
                    "epsilon": epsilon, "clip": clip, "estimand": what, "metric": m,
                    "server_side": reference[m], "federated_first": first.metrics[m],
                    "difference": first.metrics[m] - reference[m],
                    "accounted_std": first.std[m],
                    "empirical_std": (float(np.nanstd(values, ddof=1))
                                      if len(values) > 1 else None),
                    "undefined": int(np.isnan(values).sum()),
                    "within_4_std": abs(first.metrics[m] - reference[m]) <= 4 * first.std[m],
                    "sigma": policy.sigma, "devices": first.devices,
                    "count": sum(1 for p in pairs) if clip >= max_count else len(has)})
    result = {"users": args.users, "enrolled": len(users),
              "evaluable_impressions": len(pairs), "users_with_test": len(has),
              "max_impressions_per_user": max_count, "rounds": args.rounds,
              "repeats": args.repeats, "train_seconds": trained,
              "command": " ".join(["python", "benchmarks/federated_eval.py", *sys.argv[1:]]),
              "run_test_federated": metrics.get("test_federated"),
              "run_privacy_evaluation": json.loads((work / "run" / "privacy.json").read_text()
                                                   )["release"].get("federated_evaluation"),
              "run_test_server": {k: metrics["test"][k] for k in ("auc", "mrr", "ndcg@5",
                                                                   "ndcg@10", "impressions")},
              "seconds": time.perf_counter() - started, "python": platform.python_version(),
              "rows": rows}
    lines = [f"Federated vs server-side evaluation: {len(users)} enrolled users, "
             f"{len(pairs)} evaluable test impressions ({len(has)} users, at most "
             f"{max_count} each), fedrec after {args.rounds} rounds; {args.repeats} repeats",
             "", "| ε | K | estimand | metric | server-side | federated (1st) | difference "
             "| accounted std | empirical std |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        emp = "" if row["empirical_std"] is None else f"{row['empirical_std']:.4f}"
        lines.append(f"| {row['epsilon']:g} | {row['clip']:g} | {row['estimand']} | "
                     f"{row['metric']} | {row['server_side']:.4f} | "
                     f"{row['federated_first']:.4f} | {row['difference']:+.4f} | "
                     f"{row['accounted_std']:.4f} | {emp} |")
    text = "\n".join(lines)
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "federated_eval.json").write_text(json.dumps(result, indent=1))
    (out / "federated_eval.md").write_text(text + "\n")
    bad = [r for r in rows if not r["within_4_std"]]
    print(f"{len(bad)} of {len(rows)} first estimates are more than 4 accounted std from the "
          f"server-side value")
    return 0


if __name__ == "__main__":
    sys.exit(main())
