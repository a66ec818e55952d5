"""``privaterec demo``: the whole story on the embedded synthetic data set, in minutes.

Synthesises (and caches) the default synthetic data, trains each method of the demo table,
evaluates it on the test split and returns the results (:class:`DemoResult`): its tables and
the closing lines computed from them (:mod:`privaterec.experiments.demo_summary`), which
``privaterec demo`` prints.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privaterec.config import FedConfig, ModelConfig, RunConfig, TrainConfig, fed_config
from privaterec.data.mind import load_dataset
from privaterec.data.synth import write_synthetic
from privaterec.experiments.demo_recall import RecallDemo, run_recall_demo
from privaterec.experiments.demo_summary import (DemoFacts, DemoRow, chance_auc_se,
                                                 demo_conclusion, format_main_footnotes,
                                                 format_main_table, format_recall_footnote)
from privaterec.experiments.settings import DEMO_ROUNDS, demo_synth_config
from privaterec.runs.ranking import evaluate_run, train_run
from privaterec.serving.release import ServingConfig


@dataclass(frozen=True)
class DemoEntry:
    """One row of the demo table."""

    name: str
    model: ModelConfig
    train: TrainConfig
    fed: FedConfig = FedConfig()
    serve: tuple[ServingConfig, ...] = ()


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
                                 fed_config("dp-fedrec", rounds=rounds, epsilon_train=eps),
                                 serve=vdp if math.isinf(eps) else ()))
    entries.append(DemoEntry(
        "privaterec eps_t=10 / nrms", nrms, TrainConfig(method="privaterec"),
        fed_config("privaterec", rounds=rounds, epsilon_train=10.0),
        serve=(ServingConfig(kind="privaterec", epsilon=DEMO_SERVE_EPSILON),
               ServingConfig(kind="local"))))
    return entries


@dataclass(frozen=True)
class DemoResult:
    """What the demo computed.

    Attributes
    ----------
    rows: the ranking table's rows (one per trained method and serving evaluation).
    facts: what the footnotes and closing lines cite (test impressions, chance band, noise,
        clients per round, the recall pool, where the runs are).
    delta: δ of the federated runs' user-level ε (``None`` without a private run).
    recall: the Uni-FedRec part (its text and table rows).
    http: one private PrivateRec query over HTTP (:func:`http_query`).
    """

    rows: tuple[DemoRow, ...]
    facts: DemoFacts
    delta: float | None
    recall: RecallDemo
    http: dict[str, Any]

    def text(self) -> str:
        """What ``privaterec demo`` prints, in order: the ranking table with its footnotes,
        the Uni-FedRec recall part, the private query over HTTP, and the closing lines
        ("What this shows:") computed from the tables by
        :func:`~privaterec.experiments.demo_summary.demo_conclusion`."""
        rows = list(self.rows)
        return "\n".join([format_main_table(rows), "",
                          format_main_footnotes(self.facts, delta=self.delta),
                          self.recall.text, format_recall_footnote(self.facts),
                          format_http_query(self.http), "",
                          "\n".join(demo_conclusion(rows, self.recall.rows, self.facts))])


def run_demo(root: str | Path, *, quick: bool = False, progress: bool = True) -> DemoResult:
    """Run the demo in ``root`` (synthetic data, runs and the serving store go there).

    Returns its results; :meth:`DemoResult.text` is what ``privaterec demo`` prints.
    """
    root = Path(root)
    synth = demo_synth_config(quick)
    data_dir = root / ("synth-quick" if quick else "synth-default")
    if not (data_dir / "test" / "behaviors.tsv").exists():
        print(f"synthesising data into {data_dir} ...", file=sys.stderr)
        write_synthetic(data_dir, synth)
    else:
        print(f"using cached synthetic data in {data_dir}", file=sys.stderr)
    rows: list[DemoRow] = []
    noise: dict[str, float] = {}
    clients_per_round = 0
    delta: float | None = None
    for entry in demo_entries(quick):
        run_dir = root / "runs" / run_dir_name(entry.name)
        shutil.rmtree(run_dir, ignore_errors=True)  # the demo always trains afresh
        config = RunConfig(data=str(data_dir.resolve()), model=entry.model, train=entry.train,
                           fed=entry.fed)
        print(f"training {entry.name} ...", file=sys.stderr)
        started = time.perf_counter()
        metrics = train_run(config, run_dir, progress=progress)
        privacy = _privacy_columns(run_dir)
        rows.append(_row(entry.name, metrics["test"], privacy, time.perf_counter() - started))
        if privacy.get("noise_ratio") is not None:
            noise[entry.name] = privacy["noise_ratio"]
        clients_per_round = privacy.get("clients_per_round") or clients_per_round
        delta = privacy.get("privacy_delta", delta)
        for serving in entry.serve:
            started = time.perf_counter()
            result = evaluate_run(run_dir, progress=False, serving=serving)
            rows.append(_row(_serving_label(entry.name, serving, result), result,
                             _privacy_columns(run_dir), time.perf_counter() - started,
                             epsilon_query=0.0 if serving.kind == "local" else serving.epsilon,
                             bytes_per_query=result["serving"]["bytes_per_query"]))
    test = load_dataset(data_dir).test
    assert test is not None  # the demo's synthetic data set has a test split
    count, se = chance_auc_se(imp.labels for imp in test.behaviors if imp.labels is not None)
    recall = run_recall_demo(root, root / "runs" / "fedrec-nrms", quick=quick,
                             progress=progress)
    facts = DemoFacts(impressions=count, chance_se=se, noise_ratio=noise,
                      clients_per_round=clients_per_round, runs=_home(root / "runs"),
                      recall_pool=recall.pool, recall_users=recall.users)
    http = http_query(root / "runs" / "privaterec_eps_t=10-nrms", data_dir, root)
    return DemoResult(tuple(rows), facts, delta, recall, http)


def run_dir_name(name: str) -> str:
    """The run directory of a demo row: ``dp-fedrec eps_t=10 / nrms`` → ``dp-fedrec_eps_t=10-nrms``."""
    return name.replace(" / ", "-").replace(" ", "_")


def _home(path: Path) -> str:
    """``path`` with the home directory written ``~`` (the same text on every machine)."""
    path = path.resolve()
    try:
        return "~/" + str(path.relative_to(Path.home().resolve()))
    except ValueError:
        return str(path)


def _row(name: str, metrics: dict[str, Any], privacy: dict[str, Any], seconds: float, *,
         epsilon_query: float | None = None, bytes_per_query: int | None = None) -> DemoRow:
    return DemoRow(name=name, auc=metrics["auc"], mrr=metrics["mrr"],
                   ndcg5=metrics["ndcg@5"], ndcg10=metrics["ndcg@10"],
                   epsilon_round=_inf(privacy.get("epsilon_round")),
                   epsilon_query=epsilon_query, bytes_per_query=bytes_per_query,
                   epsilon_user=_inf(privacy.get("epsilon_user_max")),
                   paper_mode=bool(privacy.get("epsilon_invalid")), seconds=seconds)


def _inf(value: float | None) -> float:
    """No ε recorded (centralized, popularity): no guarantee, ∞."""
    return math.inf if value is None else float(value)


def _serving_label(name: str, serving: ServingConfig, result: dict[str, Any]) -> str:
    """The demo row of a serving evaluation; local ranking names the bytes it downloads."""
    if serving.kind == "local":  # nothing is sent per query: the pool is downloaded once
        return (f"{name} → local ranking, ε_s = 0 (↓ "
                f"{result['serving']['bytes_downloaded']} B pool)")
    return f"{name} → {serving.kind} serving"


def http_query(run_dir: Path, data_dir: Path, root: Path) -> dict[str, Any]:
    """One private PrivateRec query over HTTP to a ``privaterec serve`` the demo starts
    (:func:`privaterec.serving.client.demo_query`: what the device sent and received)."""
    from privaterec.serving.client import demo_query

    print("starting privaterec serve on loopback ...", file=sys.stderr)
    store = root / "serving-store"
    shutil.rmtree(store, ignore_errors=True)
    return demo_query(run_dir, data_dir, epsilon=DEMO_SERVE_EPSILON, store=store)


def format_http_query(result: dict[str, Any]) -> str:
    """The demo's lines about the query of :func:`http_query`."""
    alpha = ", ".join(f"{a:.4f}" for a in result["sent"]["alpha"])
    lines = ["", f"Private query over HTTP ({result['url']}, model {result['model_version']}):",
             f"- the device read {len(result['history'])} news (kept on the device); it sent "
             f"only α̃ = [{alpha}] (B = {result['basis_size']} floats = "
             f"{4 * result['basis_size']} bytes per query; the JSON request body is "
             f"{result['bytes_sent']} bytes) at ε_s = {DEMO_SERVE_EPSILON:g}; its "
             f"device ledger now holds ε = {result['epsilon_spent']:g}",
             "- the server returned:", "", "| rank | news | category | score | title |",
             "|---|---|---|---|---|"]
    for rank, item in enumerate(result["received"][:5], start=1):
        lines.append(f"| {rank} | {item['news_id']} | {item['category']} | "
                     f"{item['score']:.4f} | {item['title'][:60]} |")
    return "\n".join(lines)


def _privacy_columns(run_dir: Path) -> dict[str, Any]:
    """Per-round ε, the ledger's per-user total ε and the upload noise of a federated run.

    ``noise_ratio`` is E‖noise‖₁ of one upload over the largest ‖update‖₁ its clipping
    allows: D·b/θ (L1 clipping to θ, Laplace scale b per coordinate) or b/δ (element-wise
    clipping to δ). Runs whose uploads are not clipped and noised have none.
    """
    path = run_dir / "privacy.json"
    if not path.exists():
        return {}
    from privaterec.privacy.report import read_privacy_json
    summary = read_privacy_json(path)
    total = summary["report"]["phases"]["total"]
    release = summary["release"]
    invalid = any("does NOT hold" in w for w in summary["report"].get("warnings", []))
    ratio = None
    if (release.get("mechanism") == "laplace" and release.get("clip_bound")
            and release.get("noise_scale")):
        b, clip, dim = release["noise_scale"], release["clip_bound"], release["dimension"]
        if release.get("clipping") == "l1":
            ratio = dim * b / clip
        elif release.get("clipping") == "elementwise":
            ratio = b / clip
    return {"epsilon_round": release.get("epsilon_per_round"),
            "epsilon_user_max": total["epsilon_max"], "privacy_delta": summary["delta"],
            "epsilon_invalid": invalid, "noise_ratio": ratio,
            "clients_per_round": release.get("clients_per_round")}
