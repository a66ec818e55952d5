"""``privaterec demo``: the whole story on the embedded synthetic data set, in minutes.

Synthesises (and caches) the default synthetic data, trains each method of the demo table,
evaluates it on the test split and returns the results (:class:`DemoResult`): its tables and
the closing lines computed from them (:mod:`privaterec.experiments.demo_summary`), which
``privaterec demo`` prints.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import shutil
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from privaterec.config import FedConfig, ModelConfig, RunConfig, TrainConfig, fed_config
from privaterec.data.mind import load_dataset
from privaterec.data.synth import write_synthetic
from privaterec.experiments.common import training_budget
from privaterec.experiments.demo_recall import RecallDemo, run_recall_demo
from privaterec.experiments.demo_summary import (DemoFacts, DemoRow, chance_auc_se,
                                                 demo_conclusion, format_main_footnotes,
                                                 format_main_table, format_recall_footnote)
from privaterec.experiments.settings import demo_synth_config
from privaterec.runs.ranking import evaluate_run, train_run
from privaterec.runtime.device import current_device, set_current_device
from privaterec.ondevice.release import ServingConfig


@dataclass(frozen=True)
class DemoEntry:
    """One row of the demo table."""

    name: str
    model: ModelConfig
    train: TrainConfig
    fed: FedConfig = FedConfig()
    serve: tuple[ServingConfig, ...] = ()


DEMO_SERVE_EPSILON = 10.0  # ε_s per query of the demo's private serving rows
DEMO_CENTRAL_EPSILON = 8.0  # the central-DP row's user-level ε for the whole run


def demo_entries(quick: bool) -> list[DemoEntry]:
    """The methods the demo trains, in table order: baselines, then the private ones (nrms).

    The private rows: FedNewsRec and DP-FedRec (local DP on every upload), DP-FedAvg
    (central, user-level DP on the sum of the sampled clients' clipped updates, ε for the
    whole run) and PrivateRec. Private serving: VDP on the FedRec model, and
    PrivateRec's B-float release and zero-ε local ranking on the PrivateRec model.
    """
    rounds, epochs = training_budget(quick)
    nrms = ModelConfig(news_encoder="nrms")
    vdp = (ServingConfig(kind="vdp", epsilon=DEMO_SERVE_EPSILON),)
    return [
        DemoEntry("popularity", ModelConfig(), TrainConfig(method="popularity")),
        DemoEntry("fedrec / nrms", nrms, TrainConfig(method="fedrec"),
                  fed_config("fedrec", rounds=rounds), serve=vdp),
        DemoEntry("centralized / nrms", nrms, TrainConfig(method="centralized", epochs=epochs)),
        DemoEntry("fednewsrec / nrms", nrms, TrainConfig(method="fednewsrec"),
                  fed_config("fednewsrec", rounds=rounds)),
        DemoEntry("dp-fedrec eps_t=10 / nrms", nrms, TrainConfig(method="dp-fedrec"),
                  fed_config("dp-fedrec", rounds=rounds, epsilon_train=10.0)),
        DemoEntry(f"dp-fedavg (central) eps={DEMO_CENTRAL_EPSILON:g} / nrms", nrms,
                  TrainConfig(method="dp-fedavg"),
                  fed_config("dp-fedavg", rounds=rounds, target_epsilon=DEMO_CENTRAL_EPSILON)),
        DemoEntry("privaterec eps_t=10 / nrms", nrms, TrainConfig(method="privaterec"),
                  fed_config("privaterec", rounds=rounds, epsilon_train=10.0,
                             privacy_mode="paper"),
                  serve=(ServingConfig(kind="privaterec", epsilon=DEMO_SERVE_EPSILON),
                         ServingConfig(kind="local"))),
    ]


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
        return "\n".join([format_main_table(list(self.rows)), self.text_after_table()])

    def text_after_table(self) -> str:
        """What follows the ranking table (``privaterec demo`` prints the table's rows as
        they come, then this)."""
        rows = list(self.rows)
        return "\n".join(["", format_main_footnotes(self.facts, delta=self.delta),
                          self.recall.text, format_recall_footnote(self.facts),
                          format_http_query(self.http), "",
                          "\n".join(demo_conclusion(rows, self.recall.rows, self.facts))])


# Which job starts first when a worker is free: the longest first (the recall model needs the
# fedrec run), so that two workers finish together; rows are printed in table order.
_START_ORDER = ("fedrec", "popularity", "recall", "fednewsrec", "centralized", "dp-fedrec",
                "dp-fedavg", "privaterec")


def default_jobs() -> int:
    """Worker processes of ``privaterec demo``: one per core, at most 4."""
    return max(1, min(4, os.cpu_count() or 1))


def run_demo(root: str | Path, *, quick: bool = False, progress: bool = True,
             jobs: int = 1, on_row: Callable[[DemoRow], None] | None = None) -> DemoResult:
    """Run the demo in ``root`` (synthetic data, runs and the serving store go there).

    Parameters
    ----------
    quick:
        A smaller data set and fewer rounds (a smoke test).
    progress:
        Progress bars (with ``jobs`` = 1; parallel workers print one line per job instead).
    jobs:
        Worker processes: each row's training (and the recall model) is one job; with
        ``jobs`` > 1 each worker runs torch on cpu_count // jobs threads. Every run is seeded
        on its own, so the order jobs run in does not change a result; the thread count may
        change the last float digits.
    on_row:
        Called with each table row, in table order, as soon as it and the rows above it are
        done (``privaterec demo`` prints them as they come).

    Returns its results; :meth:`DemoResult.text` is what ``privaterec demo`` prints.
    """
    if not (isinstance(jobs, int) and jobs >= 1):
        raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
    root = Path(root)
    synth = demo_synth_config(quick)
    data_dir = root / ("synth-quick" if quick else "synth-default")
    if not (data_dir / "test" / "behaviors.tsv").exists():
        print(f"synthesising data into {data_dir} ...", file=sys.stderr)
        write_synthetic(data_dir, synth)
    else:
        print(f"using cached synthetic data in {data_dir}", file=sys.stderr)
    entries = demo_entries(quick)
    fedrec_run = root / "runs" / run_dir_name("fedrec / nrms")
    jobs_ = [_Job(entry.name, _train_entry, (entry, str(data_dir.resolve()), str(root),
                                              progress and jobs == 1),
                  priority=_start_priority(entry.name))
             for entry in entries]
    jobs_.append(_Job("recall", _train_recall, (str(root), str(fedrec_run), quick,
                                                progress and jobs == 1),
                      after=("fedrec / nrms",), priority=_start_priority("recall")))
    results: dict[str, Any] = {}
    printed = 0
    rows: list[DemoRow] = []
    for name, result in _run_jobs(jobs_, jobs):
        results[name] = result
        while printed < len(entries) and entries[printed].name in results:
            for row in results[entries[printed].name][0]:
                rows.append(row)
                if on_row is not None:
                    on_row(row)
            printed += 1
    noise: dict[str, float] = {}
    central: dict[str, float] = {}
    clients_per_round = 0
    delta: float | None = None
    for entry in entries:
        privacy = results[entry.name][1]
        if privacy.get("noise_ratio") is not None:
            noise[entry.name] = privacy["noise_ratio"]
        if privacy.get("central_ratio") is not None:
            central[entry.name] = privacy["central_ratio"]
        clients_per_round = privacy.get("clients_per_round") or clients_per_round
        delta = privacy.get("privacy_delta", delta)
    test = load_dataset(data_dir).test
    assert test is not None  # the demo's synthetic data set has a test split
    count, se = chance_auc_se(imp.labels for imp in test.behaviors if imp.labels is not None)
    recall: RecallDemo = results["recall"]
    facts = DemoFacts(impressions=count, chance_se=se, noise_ratio=noise,
                      central_noise_ratio=central,
                      clients_per_round=clients_per_round, runs=_home(root / "runs"),
                      recall_pool=recall.pool, recall_users=recall.users)
    http = http_query(root / "runs" / "privaterec_eps_t=10-nrms", data_dir, root)
    return DemoResult(tuple(rows), facts, delta, recall, http)


@dataclass(frozen=True)
class _Job:
    """One unit of the demo's work: ``function(*args)`` once the jobs ``after`` are done."""

    name: str
    function: Callable[..., Any]
    args: tuple[Any, ...]
    after: tuple[str, ...] = ()
    priority: int = 0


def _start_priority(name: str) -> int:
    """The position of the demo job ``name`` in :data:`_START_ORDER`."""
    return next(i for i, key in enumerate(_START_ORDER) if name.startswith(key))


def _run_jobs(jobs: list[_Job], workers: int) -> Iterator[tuple[str, Any]]:
    """Run ``jobs`` on ``workers`` processes (in this process when 1), a job starting once
    its ``after`` jobs are done, the lowest :attr:`_Job.priority` first; yields
    ``(name, result)`` as each finishes."""
    waiting = sorted(jobs, key=lambda job: job.priority)
    done: set[str] = set()

    def ready() -> _Job | None:
        job = next((j for j in waiting if done.issuperset(j.after)), None)
        if job is not None:
            waiting.remove(job)
        return job

    if workers == 1:
        while (job := ready()) is not None:
            done.add(job.name)
            yield job.name, job.function(*job.args)
        return
    threads = max(1, (os.cpu_count() or 1) // workers)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                             initargs=(threads, str(current_device()))) as pool:
        running: dict[Future[Any], tuple[str, float]] = {}
        while waiting or running:
            while len(running) < workers and (job := ready()) is not None:
                print(f"started {job.name}", file=sys.stderr, flush=True)
                running[pool.submit(job.function, *job.args)] = (job.name, time.perf_counter())
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                name, started = running.pop(future)
                result = future.result()  # a failed job raises here; the pool is shut down
                print(f"finished {name} in {time.perf_counter() - started:.0f} s",
                      file=sys.stderr, flush=True)
                done.add(name)
                yield name, result


def _init_worker(threads: int, device: str = "cpu") -> None:
    import torch

    torch.set_num_threads(threads)
    set_current_device(device)  # the parent's --device (a spawned worker starts on the CPU)


def _train_entry(entry: DemoEntry, data_dir: str, root: str,
                 progress: bool) -> tuple[list[DemoRow], dict[str, Any]]:
    """Train ``entry`` afresh, evaluate it and its serving rows: (its rows, its privacy
    columns)."""
    run_dir = Path(root) / "runs" / run_dir_name(entry.name)
    shutil.rmtree(run_dir, ignore_errors=True)  # the demo always trains afresh
    config = RunConfig(data=data_dir, model=entry.model, train=entry.train, fed=entry.fed)
    if progress:
        print(f"training {entry.name} ...", file=sys.stderr)
    started = time.perf_counter()
    metrics = train_run(config, run_dir, progress=progress)
    privacy = _privacy_columns(run_dir)
    rows = [_row(entry.name, metrics["test"], privacy, time.perf_counter() - started)]
    for serving in entry.serve:
        started = time.perf_counter()
        result = evaluate_run(run_dir, progress=False, serving=serving)
        # the run's training plus this evaluation's queries only (its own record)
        rows.append(_row(_serving_label(entry.name, serving, result), result,
                         _privacy_columns(Path(result["serving"]["record"])),
                         time.perf_counter() - started,
                         epsilon_query=0.0 if serving.kind == "local" else serving.epsilon,
                         bytes_per_query=result["serving"]["bytes_per_query"]))
    return rows, privacy


def _train_recall(root: str, ranker: str, quick: bool, progress: bool) -> RecallDemo:
    return run_recall_demo(Path(root), Path(ranker), quick=quick, progress=progress)


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
                   epsilon_user_level=_inf(privacy.get("epsilon_user_level_max")),
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
    """Per-round ε, the ledger's per-user totals (click- and user-level) and the upload noise
    of a federated run (``run_dir``: the run, or a privacy record file such as a serving
    evaluation's).

    ``noise_ratio`` is E‖noise‖₁ of one upload over the largest ‖update‖₁ its clipping
    allows: D·b/θ (L1 clipping to θ, Laplace scale b per coordinate) or b/δ (element-wise
    clipping to δ). Runs whose uploads are not clipped and noised have none.
    """
    path = run_dir if run_dir.suffix == ".json" else run_dir / "privacy.json"
    if not path.exists():
        return {}
    from privaterec.privacy.report import read_privacy_json
    summary = read_privacy_json(path)
    total = summary["report"]["phases"]["total"]
    total_user = summary["report"].get("phases_user", {}).get("total", {})
    release = summary["release"]
    invalid = any("does NOT hold" in w for w in summary["report"].get("warnings", []))
    ratio = central_ratio = None
    if release.get("central") and release.get("clip_bound") and release.get("clients_per_round"):
        # E‖N(0, σ²I_D)‖₂ ≈ σ√D against the largest sum m·C of m clipped updates
        central_ratio = (release["noise_scale"] * math.sqrt(release["dimension"])
                         / (release["clients_per_round"] * release["clip_bound"]))
    elif (release.get("mechanism") == "laplace" and release.get("clip_bound")
            and release.get("noise_scale")):
        b, clip, dim = release["noise_scale"], release["clip_bound"], release["dimension"]
        if release.get("clipping") == "l1":
            ratio = dim * b / clip
        elif release.get("clipping") == "elementwise":
            ratio = b / clip
    return {"epsilon_round": release.get("epsilon_per_round"),
            "epsilon_user_max": total["epsilon_max"],
            "epsilon_user_level_max": total_user.get("epsilon_max"),
            "privacy_delta": summary["delta"],
            "epsilon_invalid": invalid, "noise_ratio": ratio, "central_ratio": central_ratio,
            "clients_per_round": release.get("clients_per_round")}
