"""Local ranking: pool download size, incremental sync, on-device ranking, load.

Usage::

    python benchmarks/local_ranking.py [--pool 100000] [--devices 100] [--cycles 5]
        [--queries 500] [--run RUN] [--work DIR] [--out FILE]
    python benchmarks/local_ranking.py --smoke   # 500 news, 3 devices, one cycle of 50 news

One core: the script pins numpy/torch to one thread before importing them, and the server
runs in its own process (``privaterec.serving.server.serve``, what ``privaterec serve`` runs).

1. **Pool.** ``--pool`` articles with MIND-like ids (``N`` + a random 1-6 digit number,
   shuffled) and titles drawn from the run's vocabulary; news vectors are random Gaussians
   (the benchmark of ``serving_load.py --vectors random``: sizes and speeds do not depend on
   the values). The run defaults to a freshly written, untrained PrivateRec NRMS run (B = 5,
   the default d): nothing here depends on the weights.
2. **Download sizes** of ``GET /v1/pool/scores`` in float32, float16 and int8 (bytes of the
   body: header, zlib ids, records), without and with titles, and of ``/v1/pool/vectors``
   int8; the raw matrix alone (N·B·4 and N·B·2) for reference.
3. **Sync after ingestion**: ``--cycles`` times, 1,000 news are POSTed to ``/v1/news`` (the
   server encodes them) and the delta since the previous version is downloaded in each
   dtype; median bytes. Every delta is applied to the device's copy and checked against the
   server's content hash (and the final state against a fresh download).
4. **On-device ranking** with the SDK's :class:`LocalRankingDevice` (float32 download):
   ``--queries`` random α on the simplex, time of ``device.scores(α)`` + ``top_k_positions``
   (k = 10) per query, median and p95; the top-10 of every query is compared with the
   server's exact float32 ranking (``POST /v1/recommend/privaterec`` with the same α) — and,
   for float16, how many top-10 lists are identical. ``recommend()`` end to end (encoding a
   50-news history with the downloaded model, no sync) is timed too.
5. **Load**: ``--devices`` concurrent devices (asyncio + httpx, one connection each), each
   cycle: all download the full pool (float16) at once; conditional requests with the
   ETag they hold (must be 304 with an empty body); 1,000 news ingested; all sync the delta
   at once (applied and hash-checked); conditional again (304). Errors = any other status,
   a 304 with a body, a hash mismatch or a transport failure after one retry (a GET whose
   keep-alive connection the server closed is retried once, as :class:`LocalRankingDevice`
   does). Retries are counted separately and must be zero: each device pools its connection
   with the SDK's keep-alive expiry, which the server's keep-alive timeout exceeds. The exit
   status is 1 when a load request failed, was retried, or a 304 had a body.

Results are printed and written as JSON to ``benchmarks/results/local_ranking.json``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving_load import (build_store, start_server, synth_articles, wait_ready,  # noqa: E402
                          write_token_file)

RESULTS = Path(__file__).resolve().parent / "results" / "local_ranking.json"
INGEST = 1000
TARGETS = {"download_f32_bytes": 2_000_000, "download_f16_bytes": 1_000_000,
           "sync_1000_bytes": 25_000, "rank_ms": 5.0}


def untrained_run(work: Path) -> Path:
    """A PrivateRec NRMS run (default sizes, B = 5) with random weights, written as
    ``privaterec train`` writes one."""
    from privaterec.config import ModelConfig, RunConfig, TrainConfig
    from privaterec.data.features import build_vocabularies
    from privaterec.data.synth import SynthConfig, generate
    from privaterec.models.factory import build_recommender
    from privaterec.runtime.checkpoint import save_checkpoint
    from privaterec.runs.directory import RunDirectory

    path = work / "run"
    if (path / "checkpoint.pt").exists():
        return path
    news = list(generate(SynthConfig(users=50, news=2000, seed=0)).all_news().values())
    run = RunDirectory(path)
    config = RunConfig(data=str(work / "data"), model=ModelConfig(basis_size=5),
                       train=TrainConfig(method="privaterec"))
    run.start(config)
    vocabs = build_vocabularies(news, min_count=1)
    vocabs.save(run.vocab_path)
    torch.manual_seed(0)
    save_checkpoint(run.checkpoint_path,
                    {"model": build_recommender(config.model, vocabs).state_dict(), "epoch": 0})
    return path


def mind_ids(n: int, rng: np.random.Generator, *, exclude: set[str] = frozenset()) -> list[str]:
    """``n`` distinct MIND-like ids: ``N`` + a random number below 10⁶, shuffled."""
    out: list[str] = []
    seen = set(exclude)
    while len(out) < n:
        for x in rng.integers(1, 1_000_000, size=2 * (n - len(out))).tolist():
            news_id = f"N{x}"
            if news_id not in seen:
                seen.add(news_id)
                out.append(news_id)
                if len(out) == n:
                    break
    return out


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


# ----------------------------------------------------------------------------- phases
def download_sizes(http: Any) -> dict[str, Any]:
    from privaterec.ondevice.pool_format import decode_full

    out: dict[str, Any] = {}
    for space, dtype, titles in (("scores", "float32", False), ("scores", "float16", False),
                                 ("scores", "int8", False), ("scores", "float32", True),
                                 ("scores", "float16", True), ("vectors", "int8", False),
                                 ("vectors", "float32", False)):
        t = time.perf_counter()
        r = http.get(f"/v1/pool/{space}", params={"dtype": dtype,
                                                  "titles": str(titles).lower()})
        seconds = time.perf_counter() - t
        r.raise_for_status()
        state = decode_full(r.content)
        key = f"{space}_{dtype}{'_titles' if titles else ''}"
        out[key] = {"bytes": len(r.content), "records": len(state), "rows": state.rows,
                    "first_request_s": seconds}
    return out


WRITE_TOKEN: dict[str, str] = {}  # "token": the server's write token (set in main)


def ingest(http: Any, vocabs: Any, n: int, *, seed: int, taken: set[str]) -> list[str]:
    """POST ``n`` new articles through the write API (the SDK's NewsWriter, with the token)."""
    from privaterec.serving.writer import NewsWriter

    articles = synth_articles(vocabs, n, seed=seed)
    ids = mind_ids(n, np.random.default_rng(seed), exclude=taken)
    taken.update(ids)
    NewsWriter(token=WRITE_TOKEN["token"], transport=http).add(
        [dataclasses.replace(a, news_id=i) for a, i in zip(articles, ids)])
    return ids


def sync_phase(http: Any, vocabs: Any, cycles: int, taken: set[str]) -> dict[str, Any]:
    from privaterec.ondevice.pool_format import apply_delta, decode_delta, decode_full

    states = {d: decode_full(http.get("/v1/pool/scores", params={"dtype": d}).content)
              for d in ("float32", "float16", "int8")}
    sizes: dict[str, list[int]] = {d: [] for d in states}
    for cycle in range(cycles):
        ingest(http, vocabs, INGEST, seed=1000 + cycle, taken=taken)
        for dtype, state in states.items():
            r = http.get("/v1/pool/scores/delta", params={"since": state.version,
                                                          "pool_id": state.pool_id,
                                                          "dtype": dtype})
            r.raise_for_status()
            delta = decode_delta(r.content)
            assert len(delta.records) == INGEST, len(delta.records)
            states[dtype] = apply_delta(state, delta)  # raises on a hash mismatch
            sizes[dtype].append(len(r.content))
    identical = {d: states[d] == decode_full(http.get("/v1/pool/scores",
                                                      params={"dtype": d}).content)
                 for d in states}
    return {"news_per_sync": INGEST, "cycles": cycles,
            "delta_bytes_median": {d: median(v) for d, v in sizes.items()},
            "delta_bytes": sizes, "state_after_syncs_equals_fresh_download": identical}


def ranking_phase(url: str, queries: int, http: Any) -> dict[str, Any]:
    from privaterec.serving.client import LocalRankingDevice
    from privaterec.serving.store import top_k_positions

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    alphas = rng.dirichlet(np.full(5, 0.5), size=queries).astype(np.float32)
    out: dict[str, Any] = {}
    for dtype in ("float32", "float16"):
        with LocalRankingDevice(url, dtype=dtype, titles="none") as device:
            device.sync()
            ids = device.pool.ids
            device.scores(alphas[0])  # builds the scoring matrix once
            times, same = [], 0
            for i, alpha in enumerate(alphas):
                t = time.perf_counter()
                top = top_k_positions(device.scores(alpha), 10)
                times.append((time.perf_counter() - t) * 1e3)
                served = http.post("/v1/recommend/privaterec",
                                   json={"alpha": [float(a) for a in alpha], "k": 10}).json()
                same += [ids[p] for p in top.tolist()] == [x["news_id"]
                                                           for x in served["items"]]
            entry = {"rank_ms_median": median(times), "rank_ms_p95": percentile(times, 95),
                     "queries": queries, "identical_top10": same}
            if dtype == "float32":
                history = [dataclasses.replace(a, news_id=f"H{i}")
                           for i, a in enumerate(synth_articles(device.model.vocabs, 50,
                                                                seed=7))]
                device.recommend(history, k=10, sync=False)
                e2e = []
                for _ in range(20):
                    t = time.perf_counter()
                    device.recommend(history, k=10, sync=False)
                    e2e.append((time.perf_counter() - t) * 1e3)
                entry["recommend_ms_median_incl_history_encoding"] = median(e2e)
            out[dtype] = entry
    return out


async def load_phase(url: str, http: Any, vocabs: Any, devices: int, cycles: int,
                     taken: set[str]) -> dict[str, Any]:
    import httpx

    from privaterec.ondevice.pool_format import (apply_delta, content_hash, decode_delta,
                                                decode_full, etag_of)

    from privaterec.serving.transport import CLIENT_KEEPALIVE_EXPIRY_S

    # one connection per device, kept for reuse as long as the SDK keeps one
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1,
                          keepalive_expiry=CLIENT_KEEPALIVE_EXPIRY_S)
    clients = [httpx.AsyncClient(base_url=url, timeout=120.0, limits=limits)
               for _ in range(devices)]
    errors: list[str] = []
    retries: list[str] = []
    lat: dict[str, list[float]] = {"full": [], "304": [], "delta": []}
    wall: dict[str, list[float]] = {"full": [], "304": [], "delta": []}
    not_modified_body_bytes = 0
    states: list[Any] = [None] * devices

    async def one(kind: str, i: int) -> None:
        nonlocal not_modified_body_bytes
        client, state = clients[i], states[i]
        params: dict[str, Any] = {"dtype": "float16"}
        headers = {}
        path = "/v1/pool/scores"
        if kind != "full":
            headers["If-None-Match"] = etag_of(content_hash(state))
        if kind == "delta":
            path += "/delta"
            params.update(since=state.version, pool_id=state.pool_id)
        t = time.perf_counter()
        for attempt in (0, 1):  # a GET is retried once on a closed connection, as the SDK does
            try:
                r = await client.get(path, params=params, headers=headers)
                break
            except httpx.TransportError as exc:
                if attempt:
                    errors.append(f"{kind}: {type(exc).__name__}")
                    return
                retries.append(f"{kind}: {type(exc).__name__}")
        lat[kind].append((time.perf_counter() - t) * 1e3)
        try:
            if kind == "304":
                not_modified_body_bytes += len(r.content)
                if r.status_code != 304 or r.content:
                    errors.append(f"304 expected, got {r.status_code} ({len(r.content)} B)")
            elif r.status_code != 200:
                errors.append(f"{kind}: HTTP {r.status_code}")
            elif kind == "full":
                states[i] = decode_full(r.content)
            else:
                states[i] = apply_delta(state, decode_delta(r.content))
        except Exception as exc:  # noqa: BLE001 - every failure is counted
            errors.append(f"{kind}: {type(exc).__name__}: {exc}")

    async def wave(kind: str) -> None:
        t = time.perf_counter()
        await asyncio.gather(*(one(kind, i) for i in range(devices)))
        wall[kind].append(time.perf_counter() - t)

    try:
        for cycle in range(cycles):
            await wave("full")
            await wave("304")
            await asyncio.to_thread(ingest, http, vocabs, INGEST, seed=5000 + cycle,
                                    taken=taken)
            await wave("delta")
            await wave("304")
    finally:
        for client in clients:
            await client.aclose()
    return {"devices": devices, "cycles": cycles, "errors": len(errors),
            "error_examples": errors[:5], "retried_once": len(retries),
            "retry_examples": sorted(set(retries))[:5],
            "requests": {k: len(v) for k, v in lat.items()},
            "latency_ms_median": {k: median(v) for k, v in lat.items() if v},
            "latency_ms_p99": {k: percentile(v, 99) for k, v in lat.items() if v},
            "wave_s_median": {k: median(v) for k, v in wall.items() if v},
            "not_modified_body_bytes_total": not_modified_body_bytes}


def main(argv: list[str] | None = None) -> int:
    import httpx

    from privaterec.serving.bundle import ServingModels
    from privaterec.serving.client import free_port

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pool", type=int, default=100_000)
    parser.add_argument("--devices", type=int, default=100)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--run", default=None)
    parser.add_argument("--work", default=None)
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--smoke", action="store_true",
                        help="a pool of 500 news, 3 devices, one cycle ingesting 50 news, 5 "
                             "queries, everything in a temporary directory")
    args = parser.parse_args(argv)
    if args.smoke:
        from _smoke import smoke_dir

        global INGEST
        INGEST = 50
        args.pool, args.devices, args.cycles, args.queries = 500, 3, 1, 5
        args.work = str(smoke_dir("local_ranking"))
        args.out = str(Path(args.work) / "local_ranking.json")
    work = Path(args.work or tempfile.mkdtemp(prefix="local-ranking-"))
    work.mkdir(parents=True, exist_ok=True)
    run = Path(args.run) if args.run else untrained_run(work)
    models = ServingModels.from_run(run)
    rng = np.random.default_rng(0)
    articles = [dataclasses.replace(a, news_id=i) for a, i in
                zip(synth_articles(models.vocabs, args.pool, seed=0), mind_ids(args.pool, rng))]
    taken = {a.news_id for a in articles}
    store = work / "store"
    info = build_store(models, articles, store, vectors="random", sample=1000, seed=0)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    token_file, WRITE_TOKEN["token"] = write_token_file(work)
    server = start_server(run, store, port, work / "server.log", token_file=token_file)
    result: dict[str, Any] = {"pool": args.pool, "basis_size": models.basis_size,
                              "dim": models.dim, "store": info,
                              "machine": {"python": platform.python_version(),
                                          "cpus": os.cpu_count(),
                                          "load_avg_before": os.getloadavg()}}
    try:
        wait_ready(url, server, work / "server.log", timeout=600)
        with httpx.Client(base_url=url, timeout=600) as http:
            print("download sizes ...", file=sys.stderr)
            result["download"] = download_sizes(http)
            result["raw_matrix_bytes"] = {"float32": 4 * 5 * args.pool,
                                          "float16": 2 * 5 * args.pool}
            print("on-device ranking ...", file=sys.stderr)
            result["ranking"] = ranking_phase(url, args.queries, http)
            print("sync after ingestion ...", file=sys.stderr)
            result["sync"] = sync_phase(http, models.vocabs, args.cycles, taken)
            print("load ...", file=sys.stderr)
            result["load"] = asyncio.run(load_phase(url, http, models.vocabs, args.devices,
                                                    args.cycles, taken))
    finally:
        server.terminate()
        server.wait(timeout=30)
    d = result["download"]
    result["targets"] = {
        "download_f32_le_2MB": d["scores_float32"]["bytes"] <= TARGETS["download_f32_bytes"],
        "download_f16_le_1MB": d["scores_float16"]["bytes"] <= TARGETS["download_f16_bytes"],
        "sync_1000_f32_le_25KB": result["sync"]["delta_bytes_median"]["float32"]
        <= TARGETS["sync_1000_bytes"],
        "rank_le_5ms": result["ranking"]["float32"]["rank_ms_median"] <= TARGETS["rank_ms"],
        "identical_top10_f32": result["ranking"]["float32"]["identical_top10"]
        == args.queries,
        "load_no_errors": result["load"]["errors"] == 0,
        "load_no_retries": result["load"]["retried_once"] == 0,
        "not_modified_no_body": result["load"]["not_modified_body_bytes_total"] == 0}
    text = json.dumps(result, indent=2)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    load_ok = result["targets"]["load_no_errors"] and result["targets"]["load_no_retries"]
    return 0 if load_ok and result["targets"]["not_modified_no_body"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
