"""Uni-FedRec server-side recall over a 100k-news pool: B-dim score space vs faiss in d dims.

Usage::

    python benchmarks/recall_speed.py [--pool 100000] [--dim 256 128] [--channels 3 1 5]
        [--queries 300] [--total 400] [--threads 1] [--no-hnsw]

Figure: "Recall over a 100k-news pool: >= 200 queries/s on this machine in the B-dim
score space, reported against faiss exact search in d dims, measured side by side".

For every (d, C) configuration one query is C channels: protected weights αᵢ ``[C, B]`` from
the library's :class:`~privaterec.recall.model.UniFedRecRecall` (``protected_weights``:
softmax of clipped decomposition scores + Laplace(λ_I) noise, Uni-FedRec Eq. 2-3) and random
quotas qᵢ (Dirichlet(1)). The query is served, end to end (quotas -> counts, scores, per-channel
top-k, dedupe-and-refill merge), by

(a) ``score_space``: :meth:`ScoreSpaceIndex.recall` — αᵢᵀP with P = eᵛRᵀ ``[B, N]``
(docs/architecture.md#performance-design); (b) ``faiss_flat``: the server rebuilds r̂ᵢ = αᵢ eᵛ
    (``BasicInterestEmbeddings.aggregate``) and searches the d-dim pool exactly
    (:class:`DenseIndex`, ``faiss.IndexFlatIP``), one batched call for the C channels with k = max
    Rᵢ (each channel's quota), merged by :func:`merge_rankings` exactly like (a); if duplicates
    across channels leave a channel short, the query is searched again with k = R (counted in
    ``refills``);
(c) ``faiss_hnsw`` (optional): the same with ``faiss.IndexHNSWFlat`` (approximate).

The methods run interleaved (query by query, rotating order) so that machine noise hits them
alike; per-query wall times are reported as medians and queries/s = 1/median. Agreement:
fraction of queries for which (a) and (b) return the same ordered list / the same set; at the
first disagreement of a query both lists are choosing the same channel's best news not yet
taken, so the float64 scores of the two news chosen tell whether it is a float tie
(``max_relative_gap_at_mismatch``). The pool vectors are random (speed does not depend on
content); the BIE values are the model's initial ones (seeded).

Prints JSON and saves ``benchmarks/results/unifedrec/recall_speed.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import os
import sys


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", type=int, default=100_000, help="news in the pool (N)")
    parser.add_argument("--dim", type=int, nargs="+", default=[256, 128],
                        help="news vector sizes d (paper 256; NRMS as trained here 128)")
    parser.add_argument("--basis", type=int, default=30, help="B basic interest embeddings")
    parser.add_argument("--total", type=int, default=400, help="R news recalled per query")
    parser.add_argument("--channels", type=int, nargs="+", default=[3, 1, 5],
                        help="C channels per query (one configuration each)")
    parser.add_argument("--queries", type=int, default=300, help="timed queries per config")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1,
                        help="OMP/BLAS/torch/faiss threads (set before numpy is imported)")
    parser.add_argument("--no-hnsw", dest="hnsw", action="store_false",
                        help="skip the faiss HNSW variant")
    parser.add_argument("--ef-search", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--note", default="Measured with one thread per library; another "
                        "long training job was using one of the 2 cores at the same time.")
    parser.add_argument("--out", default=None, help="JSON output path")
    parser.add_argument("--smoke", action="store_true",
                        help="a 2,000-news pool, d = 64, C = 2, 10 queries, no HNSW, results "
                             "to a temporary directory")
    args = parser.parse_args()
    if args.smoke:
        from _smoke import smoke_dir

        args.pool, args.dim, args.channels, args.queries, args.warmup = 2000, [64], [2], 10, 2
        args.hnsw, args.out = False, str(smoke_dir("recall_speed") / "recall_speed.json")
    return args


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:  # thread pools are sized when numpy / torch / faiss load
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = str(ARGS.threads)

import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import faiss  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from privaterec.errors import ConfigError  # noqa: E402
from privaterec.privacy.samplers import SimulationNoise  # noqa: E402
from privaterec.recall.index import (DenseIndex, ScoreSpaceIndex, allocate_quotas,  # noqa: E402
                                     merge_rankings, recall_from_scores)
from privaterec.recall.model import UniFedRecRecall  # noqa: E402


def machine_info(threads: int) -> dict:
    info: dict = {"nproc": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(),
                  "platform": platform.platform(), "python": platform.python_version(),
                  "numpy": np.__version__, "torch": torch.__version__,
                  "faiss": faiss.__version__, "requested_threads": threads,
                  "torch_threads": torch.get_num_threads(),
                  "faiss_omp_threads": faiss.omp_get_max_threads(),
                  "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS",
                                                         "OPENBLAS_NUM_THREADS")}}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f
                                if ln.startswith("model name")), None)
    except OSError:
        info["cpu"] = None
    try:
        from threadpoolctl import threadpool_info
        info["blas"] = [{k: p.get(k) for k in ("internal_api", "num_threads", "version")}
                        for p in threadpool_info()]
    except ImportError:
        info["blas"] = None
    return info


def make_queries(model: UniFedRecRecall, num: int, channels: int,
                 rng: np.random.Generator, generator: torch.Generator
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``alpha float32[num, C, B]`` (model.protected_weights with noise), ``quotas [num, C]``."""
    interests = torch.randn(num, channels, model.dim, generator=generator) / model.dim ** 0.5
    with torch.no_grad():
        noise = SimulationNoise(generator).draw((num, channels, model.num_basis),
                                                mechanism="laplace", scale=model.noise_scale)
        alpha = model.protected_weights(interests, score_noise=noise)
    quotas = rng.dirichlet(np.ones(channels), size=num)
    return alpha.numpy().astype(np.float32), quotas


def dense_recall(model: UniFedRecRecall, index: DenseIndex, alpha: np.ndarray,
                 quotas: np.ndarray, total: int) -> tuple[np.ndarray, bool]:
    """(b)/(c): r̂ = α eᵛ, one batched faiss search (k = max quota), same merge as (a).

    Returns the recalled ids and whether a k = R re-search was needed.
    """
    counts = allocate_quotas(quotas, total)
    with torch.no_grad():
        protected = model.interest.aggregate(torch.from_numpy(alpha)).numpy()
    _, ids = index.search(protected, int(counts.max()))
    try:
        return merge_rankings(list(ids), counts), False
    except ConfigError:  # duplicates across channels left a channel short: search deeper
        _, ids = index.search(protected, total)
        return merge_rankings(list(ids), counts), True


def first_mismatch_gap(a: np.ndarray, b: np.ndarray, counts: np.ndarray,
                       exact_scores: np.ndarray) -> float:
    """Relative float64 score gap between the two news chosen at the first disagreement."""
    p = int(np.flatnonzero(a != b)[0])
    order = np.lexsort((np.arange(counts.size), -counts))  # merge service order
    ends = np.cumsum(counts[order])
    channel = int(order[np.searchsorted(ends, p, side="right")])
    s = exact_scores[channel]
    return float(abs(s[a[p]] - s[b[p]]) / np.abs(s).max())


def summary(seconds: list[float]) -> dict:
    med = statistics.median(seconds)
    return {"median_ms": 1e3 * med, "p90_ms": 1e3 * float(np.percentile(seconds, 90)),
            "queries_per_s": 1.0 / med, "queries_per_s_mean": len(seconds) / sum(seconds)}


def profile_score_space(index: ScoreSpaceIndex, alpha: np.ndarray, quotas: np.ndarray,
                        total: int, repeats: int = 50) -> dict:
    """Median split of (a) into αᵀP and the top-k + merge part (same first queries)."""
    matmul, select = [], []
    for i in range(min(repeats, len(alpha))):
        t0 = time.perf_counter()
        scores = index.channel_scores(alpha[i])
        t1 = time.perf_counter()
        recall_from_scores(scores, quotas[i], total)
        t2 = time.perf_counter()
        matmul.append(t1 - t0)
        select.append(t2 - t1)
    return {"channel_scores_median_ms": 1e3 * statistics.median(matmul),
            "topk_and_merge_median_ms": 1e3 * statistics.median(select)}


def run_dim(args: argparse.Namespace, dim: int) -> dict:
    torch.manual_seed(args.seed)
    heads = dim // 16
    model = UniFedRecRecall(dim, num_heads=heads, head_dim=16, num_basis=args.basis).eval()
    rng = np.random.default_rng(args.seed)
    pool = (rng.standard_normal((args.pool, dim)) / dim ** 0.5).astype(np.float32)
    values = model.interest.values.detach()
    builds = {}
    t0 = time.perf_counter()
    score_index = ScoreSpaceIndex(values, pool)
    builds["score_space_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    flat = DenseIndex(pool, kind="flat")
    builds["faiss_flat_s"] = time.perf_counter() - t0
    hnsw = None
    if args.hnsw:
        t0 = time.perf_counter()
        hnsw = DenseIndex(pool, kind="hnsw", ef_search=args.ef_search)
        builds["faiss_hnsw_s"] = time.perf_counter() - t0
    exact_p = values.double().numpy() @ pool.astype(np.float64).T  # float64 reference P

    configs = []
    for channels in args.channels:
        generator = torch.Generator().manual_seed(args.seed * 1000 + channels)
        n = args.warmup + args.queries
        alpha, quotas = make_queries(model, n, channels, rng, generator)
        methods = {"score_space": lambda i: score_index.recall(alpha[i], quotas[i], args.total),
                   "faiss_flat": lambda i: dense_recall(model, flat, alpha[i], quotas[i],
                                                        args.total)}
        if hnsw is not None:
            methods["faiss_hnsw"] = lambda i: dense_recall(model, hnsw, alpha[i], quotas[i],
                                                           args.total)
        names = list(methods)
        times: dict[str, list[float]] = {m: [] for m in names}
        outputs: dict[str, list[np.ndarray]] = {m: [] for m in names}
        refills = {m: 0 for m in names if m != "score_space"}
        for i in range(n):
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:  # rotate who goes first
                t0 = time.perf_counter()
                out = methods[name](i)
                elapsed = time.perf_counter() - t0
                if name != "score_space":
                    out, refilled = out
                    refills[name] += int(refilled and i >= args.warmup)
                if i >= args.warmup:
                    times[name].append(elapsed)
                    outputs[name].append(np.asarray(out))
        a_out, b_out = outputs["score_space"], outputs["faiss_flat"]
        same_order = [bool(np.array_equal(x, y)) for x, y in zip(a_out, b_out)]
        same_set = [set(x.tolist()) == set(y.tolist()) for x, y in zip(a_out, b_out)]
        gaps = []
        for j, ok in enumerate(same_order):
            if not ok:
                q = args.warmup + j
                counts = allocate_quotas(quotas[q], args.total)
                exact = alpha[q].astype(np.float64) @ exact_p
                gaps.append(first_mismatch_gap(a_out[j], b_out[j], counts, exact))
        result = {"channels": channels, "queries": args.queries,
                  **{name: summary(times[name]) for name in names},
                  "ratio_score_space_over_faiss_flat_qps":
                      summary(times["score_space"])["queries_per_s"]
                      / summary(times["faiss_flat"])["queries_per_s"],
                  "identical_ordered_fraction": float(np.mean(same_order)),
                  "identical_set_fraction": float(np.mean(same_set)),
                  "mean_overlap_fraction": float(np.mean(
                      [len(set(x.tolist()) & set(y.tolist())) / args.total
                       for x, y in zip(a_out, b_out)])),
                  "max_relative_gap_at_mismatch": max(gaps) if gaps else None,
                  "refills": refills,
                  "score_space_profile": profile_score_space(
                      score_index, alpha[args.warmup:], quotas[args.warmup:], args.total)}
        if hnsw is not None:
            result["ratio_score_space_over_faiss_hnsw_qps"] = (
                summary(times["score_space"])["queries_per_s"]
                / summary(times["faiss_hnsw"])["queries_per_s"])
            result["hnsw_overlap_with_exact"] = float(np.mean(
                [len(set(x.tolist()) & set(y.tolist())) / args.total
                 for x, y in zip(a_out, outputs["faiss_hnsw"])]))
        configs.append(result)
        print(json.dumps({"dim": dim, **{k: v for k, v in result.items()
                                         if k != "score_space_profile"}}), file=sys.stderr)
    return {"dim": dim, "build_seconds": builds, "configs": configs}


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    load_before = os.getloadavg()
    started = time.perf_counter()
    runs = [run_dim(args, dim) for dim in args.dim]
    report = {"command": " ".join(["python"] + sys.argv),
              "figure": "Recall over a 100k-news pool: >= 200 queries/s in the B-dim score "
                        "space, against faiss exact search in d dims, side by side",
              "pool": args.pool, "basis": args.basis, "total": args.total,
              "ef_search": args.ef_search if args.hnsw else None, "seed": args.seed,
              "quotas": "Dirichlet(1) over the C channels",
              "pool_vectors": "random N(0, 1/d) (speed does not depend on content)",
              "timing": "interleaved per query, rotating order; queries_per_s = 1/median",
              "note": args.note, "machine": machine_info(args.threads),
              "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
              "wall_seconds": time.perf_counter() - started, "runs": runs}
    print(json.dumps(report, indent=2))
    out = Path(args.out) if args.out else \
        Path(__file__).resolve().parent / "results" / "unifedrec" / "recall_speed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main(ARGS)
