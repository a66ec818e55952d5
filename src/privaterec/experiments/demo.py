"""``privaterec demo``: the whole story on the embedded synthetic data set, in minutes.

Synthesises (and caches) the default synthetic data, trains each method of the demo table,
evaluates it on the test split and prints a results table.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privaterec.config import FedConfig, ModelConfig, RunConfig, TrainConfig
from privaterec.data.synth import SynthConfig, write_synthetic
from privaterec.eval.serving import ServingConfig
from privaterec.training.pipeline import evaluate_run, train_run


@dataclass(frozen=True)
class DemoEntry:
    """One row of the demo table."""

    name: str
    model: ModelConfig
    train: TrainConfig
    fed: FedConfig = FedConfig()
    serve: tuple[ServingConfig, ...] = ()


DEMO_ROUNDS = 300  # FedAdam/SGD rounds at r = 2% (about 6 passes over the samples)
DEMO_SERVE_EPSILON = 10.0  # ε_s per query of the demo's private serving rows


def demo_entries(quick: bool) -> list[DemoEntry]:
    """The methods the demo trains: baselines, then federated and private ones (nrms)."""
    epochs = 1 if quick else 3
    rounds = 20 if quick else DEMO_ROUNDS
    nrms = ModelConfig(news_encoder="nrms")
    entries = [
        DemoEntry("popularity", ModelConfig(), TrainConfig(method="popularity")),
        DemoEntry("centralized / nrms", nrms, TrainConfig(method="centralized", epochs=epochs)),
        DemoEntry("fedrec / nrms", nrms, TrainConfig(method="fedrec"), FedConfig(rounds=rounds)),
        DemoEntry("fednewsrec / nrms", nrms, TrainConfig(method="fednewsrec"),
                  FedConfig(rounds=rounds)),
    ]
    vdp = (ServingConfig(kind="vdp", epsilon=DEMO_SERVE_EPSILON),)
    for eps in (1.0, 10.0, float("inf")):
        entries.append(DemoEntry(f"dp-fedrec eps_t={eps:g} / nrms", nrms,
                                 TrainConfig(method="dp-fedrec"),
                                 FedConfig(rounds=rounds, epsilon_train=eps),
                                 serve=vdp if math.isinf(eps) else ()))
    entries.append(DemoEntry(
        "privaterec eps_t=10 / nrms", nrms, TrainConfig(method="privaterec"),
        FedConfig(rounds=rounds, epsilon_train=10.0),
        serve=(ServingConfig(kind="privaterec", epsilon=DEMO_SERVE_EPSILON),
               ServingConfig(kind="local"))))
    return entries


def demo_synth_config(quick: bool) -> SynthConfig:
    """The embedded default synthetic data set (a smaller one with ``quick``)."""
    return SynthConfig(users=400, news=800, seed=0) if quick else SynthConfig(seed=0)


def default_demo_root() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "privaterec" / "demo"


def run_demo(*, out: str | Path | None = None, quick: bool = False,
             progress: bool = True) -> int:
    """Run the demo; print a markdown results table. Returns the process exit code."""
    root = Path(out) if out is not None else default_demo_root()
    synth = demo_synth_config(quick)
    data_dir = root / ("synth-quick" if quick else "synth-default")
    if not (data_dir / "test" / "behaviors.tsv").exists():
        print(f"synthesising data into {data_dir} ...", file=sys.stderr)
        write_synthetic(data_dir, synth)
    else:
        print(f"using cached synthetic data in {data_dir}", file=sys.stderr)
    rows: list[tuple[str, dict[str, Any], float]] = []
    for entry in demo_entries(quick):
        run_dir = root / "runs" / entry.name.replace(" / ", "-").replace(" ", "_")
        shutil.rmtree(run_dir, ignore_errors=True)  # the demo always trains afresh
        config = RunConfig(data=str(data_dir.resolve()), model=entry.model, train=entry.train,
                           fed=entry.fed)
        print(f"training {entry.name} ...", file=sys.stderr)
        started = time.perf_counter()
        metrics = train_run(config, run_dir, progress=progress)
        rows.append((entry.name, {**metrics["test"], **_privacy_columns(run_dir)},
                     time.perf_counter() - started))
        for serving in entry.serve:
            started = time.perf_counter()
            result = evaluate_run(run_dir, progress=False, serving=serving)
            info = result["serving"]
            rows.append((_serving_label(entry.name, serving, result), {
                **result, **_privacy_columns(run_dir), "epsilon_query": 0.0 if serving.kind == "local" else serving.epsilon,
                "bytes_per_query": info["bytes_per_query"]}, time.perf_counter() - started))
    print(format_demo_table(rows))
    from privaterec.experiments.demo_recall import run_recall_demo
    print(run_recall_demo(root, root / "runs" / "fedrec-nrms", quick=quick, progress=progress))
    print(http_demo(root / "runs" / "privaterec_eps_t=10-nrms", data_dir, root))
    return 0


def _serving_label(name: str, serving: ServingConfig, result: dict[str, Any]) -> str:
    """The demo row of a serving evaluation; local ranking names the bytes it downloads."""
    if serving.kind == "local":  # nothing is sent per query: the pool is downloaded once
        return (f"{name} → local ranking, ε_s = 0 (↓ "
                f"{result['serving']['bytes_downloaded']} B pool)")
    return f"{name} → {serving.kind} serving"


def http_demo(run_dir: Path, data_dir: Path, root: Path) -> str:
    """One private PrivateRec query over HTTP to a ``privaterec serve`` the demo starts."""
    from privaterec.serving.client import demo_query

    print("starting privaterec serve on loopback ...", file=sys.stderr)
    store = root / "serving-store"
    shutil.rmtree(store, ignore_errors=True)
    result = demo_query(run_dir, data_dir, epsilon=DEMO_SERVE_EPSILON, store=store)
    alpha = ", ".join(f"{a:.4f}" for a in result["sent"]["alpha"])
    lines = ["", f"Private query over HTTP ({result['url']}, model {result['model_version']}):",
             f"- the device read {len(result['history'])} news (kept on the device); it sent "
             f"only α̃ = [{alpha}] (B = {result['basis_size']} floats, "
             f"{result['bytes_sent']} bytes of JSON) at ε_s = {DEMO_SERVE_EPSILON:g}; its "
             f"device ledger now holds ε = {result['epsilon_spent']:g}",
             "- the server returned:", "", "| rank | news | category | score | title |",
             "|---|---|---|---|---|"]
    for rank, item in enumerate(result["received"][:5], start=1):
        lines.append(f"| {rank} | {item['news_id']} | {item['category']} | "
                     f"{item['score']:.4f} | {item['title'][:60]} |")
    return "\n".join(lines)


def _privacy_columns(run_dir: Path) -> dict[str, Any]:
    """Per-round ε and the ledger's per-user total ε of a federated run (if any)."""
    path = run_dir / "privacy.json"
    if not path.exists():
        return {}
    from privaterec.privacy.report import read_privacy_json
    summary = read_privacy_json(path)
    total = summary["report"]["phases"]["total"]
    invalid = any("does NOT hold" in w for w in summary["report"].get("warnings", []))
    return {"epsilon_round": summary["release"].get("epsilon_per_round"),
            "epsilon_user_max": total["epsilon_max"], "privacy_delta": summary["delta"],
            "epsilon_invalid": invalid}


def _eps(value: float | None) -> str:
    if value is None:
        return "∞"
    return "∞" if math.isinf(value) else f"{value:.3g}"


def format_demo_table(rows: list[tuple[str, dict[str, Any], float]]) -> str:
    lines = ["| method | test AUC | MRR | nDCG@5 | nDCG@10 | ε_t per round | ε_s per query "
             "| ε per user (max) | seconds |", "|---|---|---|---|---|---|---|---|---|"]
    for name, m, seconds in rows:
        query = ("–" if "epsilon_query" not in m else
                 f"{_eps(m['epsilon_query'])} ({m['bytes_per_query']} B sent)")
        lines.append(f"| {name} | {m['auc']:.4f} | {m['mrr']:.4f} | {m['ndcg@5']:.4f} | "
                     f"{m['ndcg@10']:.4f} | {_eps(m.get('epsilon_round'))} | {query} | "
                     f"{_eps(m.get('epsilon_user_max'))}{' †' if m.get('epsilon_invalid') else ''}"
                     f" | {seconds:.0f} |")
    impressions = rows[0][1]["impressions"] if rows else 0
    delta = next((m["privacy_delta"] for _, m, _ in rows if "privacy_delta" in m), None)
    lines.append(f"\n{impressions} test impressions. ε per user: the privacy ledger's total "
                 f"over all rounds and queries (PLD composition"
                 f"{f' at δ = {delta:g}' if delta else ''}); "
                 f"fednewsrec's ε is for the whole update (2δD/λ), not per coordinate — see "
                 f"'privaterec privacy report --run RUN'. ∞: no formal guarantee. †: PrivateRec "
                 f"paper mode (Alg. 3 as published): ε covers α̃ and the labels, NOT the "
                 f"uploaded gradient's history path (privacy report names the parameters).")
    return "\n".join(lines)
