"""Bounded load test of private serving over HTTP on loopback, plus bytes per query.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/serving_load.py --run RUN \
        [--rate 500] [--duration 20] [--pool 100000] [--concurrency 8] \
        [--endpoint privaterec|vdp] [--vectors encoded|random] [--repeat N] [--work DIR]
        [--out FILE]
    python benchmarks/serving_load.py --smoke   # a tiny run and pool, 1 s at 50 req/s

What it does, in order (all numbers go to one JSON, printed and saved under
``benchmarks/results/serving/``):

1. Loads the run with the server's own loader (``ServingModels.from_run``) — a PrivateRec
   ranking run (B basic vectors, d as trained). Without ``--run`` a small PrivateRec run is
   trained on synthetic data first (a minute or two).
2. Synthesises ``--pool`` news articles (titles and abstracts drawn from the run's
   vocabulary) and times the ranker's news encoder on them: a sample first
   (``encode_sample``, extrapolated), then the whole pool (``encode_full_pool_s``).
3. Builds the news store through the store API (``NewsStore.upsert``) with the encoded
   vectors (``--vectors encoded``, the default) or, to skip the full encoding, random vectors
   drawn to match the mean and per-dimension spread of the encoded sample
   (``--vectors random``). The output says which. Query cost does not depend on the values:
   the server scores α̃ᵀP over P [B, N].
4. Starts the server in a separate process (``privaterec.serving.server.serve`` = what
   ``privaterec serve`` runs: uvicorn, no access log) on a free loopback port.
5. Measures bytes per query as the JSON bodies the SDK devices really send: PrivateRec α̃
   (B floats), VDP (d floats), Uni-FedRec channels (C × B_r weights + quotas; with the
   served recall model if the run has one, else a paper-default recall model B_r = 30 over
   the same news vectors — labelled).
6. Open-loop load at a fixed ``--rate`` for ``--duration`` seconds after a short warm-up:
   request i is due at t0 + i/rate and is sent by the next free connection of a pool of
   ``--concurrency`` keep-alive HTTP/1.1 connections (asyncio + uvloop, raw sockets:
   the generator shares the 2 cores with the server, so it is kept lean). Latency is
   measured from the *due* time (so a late generator or a queue shows up in it; wrk2's
   coordinated-omission correction) and, separately, from the actual send.

Reported per measured run (``--repeat``): throughput (completed / wall time of the measured
window), p50/p90/p99/max latency, errors (non-200 answers, wrong result sizes, connection
failures), how late the generator was, the CPU seconds used by the server and by the
generator, the load average before the run, and whether the issue's target (≥ 500 req/s,
p99 < 50 ms, zero errors, 100k news) was met. The machine's 2 cores are shared with other
jobs: the load average is part of the result.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

RESULTS = Path(__file__).resolve().parent / "results" / "serving"
TARGET = {"rate": 500.0, "p99_ms": 50.0, "errors": 0}


# ------------------------------------------------------------------------------ the run
def tiny_run(work: Path, *, smoke: bool = False) -> Path:
    """Train a small PrivateRec run (NRMS, B = 5, d = 128) on synthetic data; ``smoke``: a
    tiny model on 60 users for 2 rounds (seconds)."""
    from privaterec.config import ModelConfig, RunConfig, TrainConfig, fed_config
    from privaterec.data.synth import SynthConfig, write_synthetic
    from privaterec.runs.ranking import train_run

    run = work / "run"
    if (run / "checkpoint.pt").exists():
        return run
    data = work / "data"
    model, users, news, rounds = ModelConfig(basis_size=5), 300, 600, 5
    if smoke:
        from _smoke import smoke_model

        model, users, news, rounds = smoke_model(basis_size=5), 60, 150, 2
    write_synthetic(data, SynthConfig(users=users, news=news, seed=0))
    config = RunConfig(data=str(data), model=model, train=TrainConfig(method="privaterec"),
                       fed=fed_config("privaterec", rounds=rounds, epsilon_train=10.0,
                                      clients_per_round=16))
    train_run(config, run, progress=False)
    return run


# ------------------------------------------------------------------------------ the pool
def synth_articles(vocabs: Any, n: int, *, seed: int) -> list:
    """``n`` articles whose text is drawn from the run's vocabulary (quick: numpy only)."""
    from privaterec.data.records import NewsRecord

    rng = np.random.default_rng(seed)
    words = np.asarray(vocabs.words.tokens[2:] or ["news"])
    categories = vocabs.categories.tokens[2:] or ["news"]
    subcategories = vocabs.subcategories.tokens[2:] or ["general"]
    title_words = rng.integers(0, len(words), size=(n, 10))
    abstract_words = rng.integers(0, len(words), size=(n, 20))
    cats = rng.integers(0, len(categories), size=n)
    subs = rng.integers(0, len(subcategories), size=n)
    return [NewsRecord(f"L{i}", categories[cats[i]], subcategories[subs[i]],
                       " ".join(words[title_words[i]]), " ".join(words[abstract_words[i]]))
            for i in range(n)]


def build_store(models: Any, articles: list, path: Path, *, vectors: str,
                sample: int, seed: int) -> dict[str, Any]:
    """Fill the store at ``path``; return the encoding and ingestion timings."""
    from privaterec.serving.server import open_store

    n = len(articles)
    sample = min(sample, n)
    t = time.perf_counter()
    encoded = models.encode_news(articles[:sample])
    per_news = (time.perf_counter() - t) / sample
    info: dict[str, Any] = {"encode_sample": sample, "encode_ms_per_news": per_news * 1e3,
                            "encode_full_pool_s_estimate": per_news * n}
    if vectors == "encoded":
        t = time.perf_counter()
        rest = models.encode_news(articles[sample:]) if sample < n else encoded[:0]
        info["encode_full_pool_s"] = time.perf_counter() - t + per_news * sample
        pool_vectors = np.concatenate([encoded, rest])
    else:
        rng = np.random.default_rng(seed)
        mean, std = encoded.mean(0), encoded.std(0) + 1e-6
        pool_vectors = (mean + std * rng.standard_normal((n, encoded.shape[1]))).astype(
            np.float32)
    store = open_store(models, path)
    try:
        t = time.perf_counter()
        step = 10_000
        for lo in range(0, n, step):
            store.upsert(articles[lo:lo + step], pool_vectors[lo:lo + step])
        info["ingest_s"] = time.perf_counter() - t
        info["num_news"] = len(store)
    finally:
        store.close()
    info["vectors"] = ("encoded with the run's news encoder" if vectors == "encoded" else
                       "random Gaussian with the mean and per-dimension std of "
                       f"{sample} encoded articles (store API NewsStore.upsert)")
    return info


# ---------------------------------------------------------------------------- the server
def start_server(run: Path, store: Path, port: int, log: Path,
                 token_file: Path | None = None) -> subprocess.Popen:
    """``serve`` in a subprocess; writes need the token in ``token_file`` (none: disabled)."""
    code = ("import sys; from privaterec.serving.server import serve; "
            "serve(sys.argv[1], None, host='127.0.0.1', port=int(sys.argv[2]), "
            "store_path=sys.argv[3], write_token_file=sys.argv[4] or None, "
            "no_ingest=not sys.argv[4])")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-c", code, str(run), str(port), str(store),
                                 "" if token_file is None else str(token_file)],
                                stdout=out, stderr=subprocess.STDOUT, env=env)


def write_token_file(work: Path) -> tuple[Path, str]:
    """A fresh random write token in ``work/write-token`` (mode 600): (path, token)."""
    import secrets

    token = secrets.token_urlsafe(32)
    path = work / "write-token"
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return path, token


def wait_ready(url: str, process: subprocess.Popen, log: Path, timeout: float) -> dict:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        try:
            r = httpx.get(url + "/v1/health", timeout=2.0)
            if r.status_code == 200:
                return r.json()
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    process.terminate()
    raise SystemExit(f"server not ready after {timeout} s:\n{log.read_text()[-3000:]}")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------- bytes per query
def bytes_per_query(url: str, models: Any, articles: list, *, queries: int,
                    seed: int) -> dict[str, Any]:
    """Body sizes of real SDK queries (PrivateRec, VDP, Uni-FedRec) for random histories."""
    from privaterec.privacy.samplers import SimulationNoise
    from privaterec.serving.client import (PrivateRecDevice, UniFedRecDevice, VDPDevice,
                                           json_body)

    rng = np.random.default_rng(seed)
    h = models.config.model.history_len
    histories = [[articles[i] for i in rng.choice(len(articles), size=h, replace=False)]
                 for _ in range(queries)]
    out: dict[str, Any] = {"queries": queries, "history_len": h, "k": 10,
                           "basis_size": models.basis_size, "dim": models.dim}
    # One simulated device plays many users to measure body sizes: seeded simulation noise,
    # no budget or re-release limit, state in a temporary directory (never a real device's).
    state = tempfile.mkdtemp(prefix="serving-load-devices-")
    sim = dict(insecure_simulation_noise=SimulationNoise(torch.Generator().manual_seed(seed)),
               budget=math.inf, max_fresh_releases=None)
    noise = sim["insecure_simulation_noise"]
    with PrivateRecDevice(url, epsilon=1.0, cache_dir=f"{state}/privaterec", **sim) as device:
        sizes = []
        for history in histories:
            device.recommend(history, k=10)
            sizes.append(device.bytes_sent)
        out["privaterec"] = {"floats": models.basis_size, "bytes_mean": statistics.mean(sizes),
                             "bytes_max": max(sizes), "example": device.last_query["sent"]}
    with VDPDevice(url, epsilon=1.0, clip=0.001, cache_dir=f"{state}/vdp", **sim) as device:
        sizes = []
        for history in histories:
            device.recommend(history, k=10)
            sizes.append(device.bytes_sent)
        out["vdp"] = {"floats": models.dim, "bytes_mean": statistics.mean(sizes),
                      "bytes_max": max(sizes)}
    total = 100
    if models.recall is not None:
        with UniFedRecDevice(url, total=total, cache_dir=f"{state}/unifedrec",
                             **sim) as device:
            sizes, channels = [], []
            for history in histories:
                device.recommend(history, k=10)
                sizes.append(device.bytes_sent)
                channels.append(len(device.last_query["sent"]["channels"]))
            source = "the served Uni-FedRec recall model (SDK UniFedRecDevice over HTTP)"
            b_r = models.recall.num_basis
    else:
        # No recall model in this run: the same body the SDK would send, computed with a
        # randomly initialised paper-default recall model (B_r = 30, δ = 0.2, λ_I = 1.2,
        # at most 5 channels) over the ranker's news vectors of the same histories.
        from privaterec.recall.query import release_query
        from privaterec.runs.recall import RecallModelConfig
        from privaterec.serving.client import fetch_model

        torch.manual_seed(seed)
        recall = RecallModelConfig().build(models.dim).eval()
        device_model = fetch_model(url)
        sizes, channels, hidden = [], [], []
        for history in histories:
            vectors, mask, _ = device_model.history_tensors(history)
            for quota_noise, sizes_of in ((None, sizes), (1.0, hidden)):
                q = release_query(recall, vectors, mask, noise=noise,
                                  quota_noise_scale=quota_noise,
                                  quota_noise=None if quota_noise is None else noise)
                sent = [{"weights": [float(f"{w:.9g}") for w in q.alpha[0, i].tolist()],
                         "quota": float(f"{float(q.quotas[0, i]):.9g}")}
                        for i in range(q.alpha.shape[1]) if bool(q.released[0, i])]
                sizes_of.append(len(json_body({"channels": sent, "total": total,
                                               "include_vectors": True})))
                if quota_noise is None:
                    channels.append(len(sent))
        out["unifedrec_hidden_channels"] = {
            "note": "all M = 5 channel slots released with Laplace-noised quotas "
                    "(quota_noise_scale), so the number of channels is hidden",
            "floats": 5 * (recall.num_basis + 1), "bytes_mean": statistics.mean(hidden),
            "bytes_max": max(hidden)}
        source = ("computed offline: the SDK's JSON body for a randomly initialised "
                  "paper-default recall model (the run has no recall model)")
        b_r = recall.num_basis
    out["unifedrec"] = {"source": source, "basis_size": b_r, "total": total,
                        "channels_mean": statistics.mean(channels),
                        "channels_max": max(channels), "floats_mean":
                        statistics.mean(c * (b_r + 1) for c in channels),
                        "bytes_mean": statistics.mean(sizes), "bytes_max": max(sizes)}
    return out


# ------------------------------------------------------------------------ load generator
def make_bodies(endpoint: str, models: Any, count: int, seed: int) -> list[bytes]:
    """Query bodies as devices send them: α̃ on the simplex (B) or a d-dim embedding."""
    from privaterec.serving.client import json_body

    rng = np.random.default_rng(seed)
    if endpoint == "privaterec":
        alphas = rng.dirichlet(np.ones(models.basis_size), size=count).astype(np.float32)
        return [json_body({"alpha": [float(f"{a:.9g}") for a in row], "k": 10})
                for row in alphas]
    users = (rng.standard_normal((count, models.dim)) * 1e-3).astype(np.float32)
    return [json_body({"embedding": [float(f"{a:.9g}") for a in row], "k": 10})
            for row in users]


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = None
    chunked = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if length is not None:
        return status, await reader.readexactly(length)
    if chunked:
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                return status, b"".join(parts)
            parts.append(data[:-2])
    raise ValueError("response without Content-Length or chunked encoding")


async def run_load(host: str, port: int, path: str, bodies: list[bytes], *, rate: float,
                   duration: float, concurrency: int, k: int) -> dict[str, Any]:
    """Open-loop fixed-rate load; returns raw per-request timings."""
    requests = [(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(b)}\r\n\r\n"
                 ).encode() + b for b in bodies]
    total = int(round(rate * duration))
    due = np.empty(total)
    sent = np.full(total, np.nan)
    done = np.full(total, np.nan)
    status = np.zeros(total, dtype=np.int32)
    errors: list[str] = []
    next_index = 0
    clock = time.perf_counter  # uvloop's loop.time() has 1 ms resolution
    t0 = clock() + 0.2

    async def worker() -> None:
        nonlocal next_index
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while True:
                i = next_index
                if i >= total:
                    return
                next_index += 1
                t_due = t0 + i / rate
                due[i] = t_due
                delay = t_due - clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                sent[i] = clock()
                try:
                    writer.write(requests[i % len(requests)])
                    code, body = await _read_response(reader)
                except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    errors.append(f"request {i}: {type(exc).__name__}: {exc}")
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, port)
                    continue
                done[i] = clock()
                status[i] = code
                if code == 200 and i % 50 == 0:  # spot-check the answers' content
                    if len(json.loads(body)["items"]) != k:
                        status[i] = -1
        finally:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"due": due, "sent": sent, "done": done, "status": status, "errors": errors,
            "t0": t0}


def summarize(raw: dict[str, Any], *, rate: float, duration: float) -> dict[str, Any]:
    due, sent, done, status = raw["due"], raw["sent"], raw["done"], raw["status"]
    ok = (status == 200) & np.isfinite(done)
    latency = (done - due)[ok] * 1e3
    service = (done - sent)[ok] * 1e3
    lag = (sent - due)[np.isfinite(sent)] * 1e3
    finished = done[np.isfinite(done)]
    wall = float(finished.max() - raw["t0"]) if finished.size else math.nan
    pct = (lambda a, q: float(np.percentile(a, q)) if a.size else math.nan)
    return {
        "requests": int(due.size), "completed_ok": int(ok.sum()),
        "errors": int(due.size - ok.sum()), "error_examples": raw["errors"][:5],
        "non_200": {str(c): int((status == c).sum()) for c in np.unique(status[~ok])
                    if c not in (0,)},
        "wall_s": wall, "throughput_rps": float(ok.sum() / wall) if wall > 0 else math.nan,
        "offered_rps": rate, "duration_s": duration,
        "latency_ms": {"p50": pct(latency, 50), "p90": pct(latency, 90),
                       "p99": pct(latency, 99), "max": float(latency.max())
                       if latency.size else math.nan, "mean": float(latency.mean())
                       if latency.size else math.nan},
        "service_latency_ms": {"p50": pct(service, 50), "p99": pct(service, 99)},
        "generator_lag_ms": {"p50": pct(lag, 50), "p99": pct(lag, 99),
                             "max": float(lag.max()) if lag.size else math.nan},
    }


def load_phase(host: str, port: int, endpoint: str, bodies: list[bytes], *, rate: float,
               duration: float, concurrency: int) -> dict[str, Any]:
    try:
        import uvloop
        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
        loop_name = "uvloop"
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        runner = asyncio.Runner()
        loop_name = "asyncio"
    path = f"/v1/recommend/{endpoint}"
    with runner:
        raw = runner.run(run_load(host, port, path, bodies, rate=rate, duration=duration,
                                  concurrency=concurrency, k=10))
    out = summarize(raw, rate=rate, duration=duration)
    out["generator"] = (f"{loop_name}, {concurrency} keep-alive HTTP/1.1 connections, raw "
                        f"sockets, open loop (latency from the due time)")
    return out


def meets_target(load: dict[str, Any], args: argparse.Namespace) -> dict[str, bool]:
    """The issue's figure: ≥ 500 req/s sustained, p99 < 50 ms, zero errors, 100k news."""
    return {"throughput": load["throughput_rps"] >= 0.99 * TARGET["rate"]
            and args.rate >= TARGET["rate"],
            "p99": load["latency_ms"]["p99"] < TARGET["p99_ms"],
            "errors": load["errors"] == TARGET["errors"],
            "pool": args.pool >= 100_000}


# -------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default=None, help="PrivateRec run directory (default: train "
                        "a small one in --work)")
    parser.add_argument("--rate", type=float, default=500.0, help="requests per second")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds measured")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring")
    parser.add_argument("--repeat", type=int, default=1, help="measured runs (the machine is "
                        "shared: report the spread)")
    parser.add_argument("--pool", type=int, default=100_000, help="news in the pool")
    parser.add_argument("--concurrency", type=int, default=8, help="connections")
    parser.add_argument("--endpoint", choices=("privaterec", "vdp"), default="privaterec")
    parser.add_argument("--vectors", choices=("encoded", "random"), default="encoded")
    parser.add_argument("--encode-sample", type=int, default=2000)
    parser.add_argument("--bytes-queries", type=int, default=20)
    parser.add_argument("--work", default=None, help="scratch directory (default: temporary)")
    parser.add_argument("--out", default=None, help="JSON file (default: benchmarks/results/"
                        "serving/load_<endpoint>_<rate>.json)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny trained run, a pool of 300 news, 1 s at 50 req/s after "
                             "0.5 s of warm-up, everything in a temporary directory")
    args = parser.parse_args(argv)
    if args.smoke:
        from _smoke import smoke_dir

        args.run, args.work = None, str(smoke_dir("serving_load"))
        args.pool, args.rate, args.duration, args.warmup, args.repeat = 300, 50.0, 1.0, 0.5, 1
        args.encode_sample, args.bytes_queries = 100, 3
        args.out = str(Path(args.work) / "load.json")

    from privaterec.serving.bundle import ServingModels
    from privaterec.serving.client import free_port

    torch.set_num_threads(1)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="serving-load-"))
    work.mkdir(parents=True, exist_ok=True)
    run = Path(args.run) if args.run else tiny_run(work, smoke=args.smoke)
    result: dict[str, Any] = {
        "benchmark": "serving_load", "run": str(run), "endpoint": args.endpoint,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "loadavg_before": os.getloadavg(),
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "work")},
        "target": TARGET}
    models = ServingModels.from_run(run)
    result["model"] = {"model_version": models.model_version, "method": models.method,
                       "basis_size": models.basis_size, "dim": models.dim}
    if args.endpoint == "privaterec" and not models.basis_size:
        raise SystemExit(f"{run}: no basic vectors; pass a PrivateRec run or --endpoint vdp")
    t = time.perf_counter()
    articles = synth_articles(models.vocabs, args.pool, seed=args.seed)
    result["pool"] = {"size": args.pool, "synthesis_s": time.perf_counter() - t}
    store = work / "store"
    if store.exists():
        import shutil
        shutil.rmtree(store)
    result["pool"].update(build_store(models, articles, store, vectors=args.vectors,
                                      sample=args.encode_sample, seed=args.seed))

    port = free_port()
    log = work / "server.log"
    url = f"http://127.0.0.1:{port}"
    t = time.perf_counter()
    server = start_server(run, store, port, log)
    try:
        health = wait_ready(url, server, log, timeout=300)
        result["server"] = {"startup_s": time.perf_counter() - t, "health": health,
                            "process": "privaterec.serving.server.serve (uvicorn, 1 worker, "
                                       "no access log), separate process"}
        if health["num_news"] != args.pool:
            raise SystemExit(f"server pool has {health['num_news']} news, expected {args.pool}")
        result["bytes_per_query"] = bytes_per_query(url, models, articles,
                                                    queries=args.bytes_queries, seed=args.seed)
        bodies = make_bodies(args.endpoint, models, 1000, args.seed)
        if args.warmup > 0:
            load_phase("127.0.0.1", port, args.endpoint, bodies, rate=args.rate,
                       duration=args.warmup, concurrency=args.concurrency)
        runs = []
        for _ in range(args.repeat):
            cpu_server = cpu_seconds(server.pid)
            cpu_self = time.process_time()
            loadavg = os.getloadavg()
            load = load_phase("127.0.0.1", port, args.endpoint, bodies, rate=args.rate,
                              duration=args.duration, concurrency=args.concurrency)
            load["cpu_s"] = {"server": cpu_seconds(server.pid) - cpu_server,
                             "generator": time.process_time() - cpu_self}
            load["cpu_ms_per_request"] = {k: 1e3 * v / max(1, load["completed_ok"])
                                          for k, v in load["cpu_s"].items()}
            load["loadavg_before"] = loadavg
            load["meets_target"] = meets_target(load, args)
            runs.append(load)
        result["runs"] = runs
        result["machine"]["loadavg_after"] = os.getloadavg()
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
    result["summary"] = {
        "runs": len(runs),
        "throughput_rps": [round(r["throughput_rps"], 1) for r in runs],
        "p50_ms": [round(r["latency_ms"]["p50"], 2) for r in runs],
        "p99_ms": [round(r["latency_ms"]["p99"], 2) for r in runs],
        "errors": [r["errors"] for r in runs],
        "runs_meeting_target": sum(all(r["meets_target"].values()) for r in runs)}
    out = Path(args.out) if args.out else RESULTS / f"load_{args.endpoint}_{int(args.rate)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=float))
    print(json.dumps(result, indent=2, default=float))
    print(f"saved {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
