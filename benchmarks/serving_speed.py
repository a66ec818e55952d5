"""Per-query cost of PrivateRec serving in the B-dim score space vs exact d-dim scoring.

Usage::

    python benchmarks/serving_speed.py [--pool 100000] [--basis 5] [--dim 128] [--k 10]
                                       [--queries 500] [--run RUN]

For the same ũ = Σ α̃ᵢ bᵢ (PrivateRec Alg. 1), three ways to get the top-k news of a pool R
``[N, d]``, timed side by side (each query runs all of them, interleaved) and compared by
median over ``--queries`` queries:

* **score space** (what ``privaterec serve`` does, docs/architecture.md#performance-design): scores
  α̃ᵀP with the precomputed P = b·Rᵀ ``[B, N]`` (:meth:`NewsPool.space_scores`), then the exact
  top-k (:func:`top_k_positions`: ``np.argpartition`` + sort of the k, ties by position);
* **exact d-dim, numpy**: ũ = α̃·b, scores R·ũ (float32 matmul), the same top-k code;
* **exact d-dim, faiss** ``IndexFlatIP`` search of ũ (scoring and top-k fused), if installed.

Reported ratios: ``speedup`` (end to end: scoring + top-k, numpy vs numpy: the top-k step
costs both sides the same), ``speedup_scoring_only`` (the matmuls alone) and
``speedup_vs_faiss`` (end to end vs faiss), under two side-by-side schedules (blocks of
``--block`` queries per method — the headline — or all methods for every query, see the
report's ``notes``). ``identical_rankings``: the score-space top-k equals
the exact float64 ranking of ũ·Rᵀ for every query (also reported against the float32 numpy and
faiss rankings). Speed does not depend on the values, so R and b are seeded Gaussians (with
``--run`` b comes from a trained run and d is its size). Saves
``benchmarks/results/serving/serving_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from privaterec.data.records import NewsRecord
from privaterec.serving.store import NewsPool, top_k_positions


def median_ms(values: list[float]) -> float:
    return 1e3 * statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", type=int, default=100_000, help="N news in the pool")
    parser.add_argument("--basis", type=int, default=5, help="B basic vectors")
    parser.add_argument("--dim", type=int, default=128, help="d (NRMS default: 8 x 16)")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--block", type=int, default=25, help="queries per method per block")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run", default=None, help="take b (and d) from this trained run")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" /
                                             "serving" / "serving_speed.json"))
    parser.add_argument("--smoke", action="store_true",
                        help="a 2,000-news pool, 20 queries, results to a temporary directory")
    args = parser.parse_args()
    if args.smoke:
        from _smoke import smoke_dir

        args.pool, args.queries, args.warmup, args.block = 2000, 20, 2, 5
        args.out = str(smoke_dir("serving_speed") / "serving_speed.json")
    rng = np.random.default_rng(args.seed)
    if args.run:
        from privaterec.serving.bundle import ServingModels
        basis = ServingModels.from_run(args.run).basis
        if basis is None:
            sys.exit(f"{args.run}: the model has no basic vectors")
        args.basis, args.dim = basis.shape
    else:
        basis = rng.standard_normal((args.basis, args.dim)).astype(np.float32)
    vectors = (rng.standard_normal((args.pool, args.dim)) / np.sqrt(args.dim)).astype(
        np.float32)
    p = (basis.astype(np.float64) @ vectors.astype(np.float64).T).astype(np.float32)
    articles = [NewsRecord(f"N{i}") for i in range(args.pool)]
    pool = NewsPool(articles, vectors, {"privaterec": p})
    index = None
    try:
        import faiss
        index = faiss.IndexFlatIP(args.dim)
        index.add(vectors)
        faiss_threads = faiss.omp_get_max_threads()
    except ImportError:
        faiss_threads = None
    alphas = rng.dirichlet(np.ones(args.basis), size=args.queries + args.warmup)
    alphas = (alphas / alphas.sum(axis=1, keepdims=True)).astype(np.float32)

    clock = time.perf_counter

    def space(alpha: np.ndarray) -> tuple[np.ndarray, float, float]:
        t0 = clock()
        scores = pool.space_scores("privaterec", alpha)  # α̃ᵀP
        t1 = clock()
        top = top_k_positions(scores, args.k)
        return top, t1 - t0, clock() - t0

    def dense(alpha: np.ndarray) -> tuple[np.ndarray, float, float]:
        t0 = clock()
        scores = pool.dense_scores(alpha @ basis)  # ũ = α̃·b, then R·ũ
        t1 = clock()
        top = top_k_positions(scores, args.k)
        return top, t1 - t0, clock() - t0

    def flat(alpha: np.ndarray) -> tuple[np.ndarray, float, float]:
        t0 = clock()
        _, found = index.search((alpha @ basis)[None, :], args.k)
        elapsed = clock() - t0
        return found[0], elapsed, elapsed

    methods = {"space": space, "dense": dense}
    if index is not None:
        methods["faiss"] = flat
    # Two schedules, both side by side: "blocks" runs --block queries of one method, then of
    # the next (each method's arrays stay in cache, as in a server that answers only that
    # kind of query); "alternating" runs the methods one after the other for every query
    # (the d-dim scan evicts P and the scores from the cache before each score-space query).
    timings = {schedule: {name: ([], []) for name in methods}
               for schedule in ("blocks", "alternating")}
    tops: dict[str, list[np.ndarray]] = {name: [None] * len(alphas) for name in methods}
    names = list(methods)
    for start in range(0, len(alphas), args.block):
        block = range(start, min(start + args.block, len(alphas)))
        order = names if (start // args.block) % 2 == 0 else names[::-1]
        for name in order:
            for q in block:
                top, scoring, total = methods[name](alphas[q])
                tops[name][q] = top
                if q >= args.warmup:
                    timings["blocks"][name][0].append(scoring)
                    timings["blocks"][name][1].append(total)
    for q, alpha in enumerate(alphas):
        for name in (names if q % 2 == 0 else names[::-1]):
            top, scoring, total = methods[name](alpha)
            if q >= args.warmup:
                timings["alternating"][name][0].append(scoring)
                timings["alternating"][name][1].append(total)
    mismatch = {"exact_float64": 0, "dense_float32": 0, "faiss": 0}
    for q, alpha in enumerate(alphas):
        exact = vectors.astype(np.float64) @ (alpha.astype(np.float64) @
                                              basis.astype(np.float64))
        want = np.lexsort((np.arange(exact.size), -exact))[:args.k]
        mismatch["exact_float64"] += int(not np.array_equal(tops["space"][q], want))
        mismatch["dense_float32"] += int(not np.array_equal(tops["space"][q],
                                                            tops["dense"][q]))
        if "faiss" in tops:
            mismatch["faiss"] += int(not np.array_equal(tops["space"][q], tops["faiss"][q]))

    def summary(schedule: str) -> dict:
        t = timings[schedule]
        ms = {f"{name}_{part}": median_ms(values[i])
              for name, values in t.items() for i, part in enumerate(("scoring", "total"))}
        return {
            "speedup": ms["dense_total"] / ms["space_total"],
            "speedup_scoring_only": ms["dense_scoring"] / ms["space_scoring"],
            "speedup_vs_faiss": (ms["faiss_total"] / ms["space_total"]
                                 if "faiss_total" in ms else None),
            "ms_per_query_median": {
                "score_space_scoring": ms["space_scoring"],
                "score_space_top_k": ms["space_total"] - ms["space_scoring"],
                "score_space_end_to_end": ms["space_total"],
                "dense_numpy_scoring": ms["dense_scoring"],
                "dense_numpy_end_to_end": ms["dense_total"],
                "dense_faiss_flat_end_to_end": ms.get("faiss_total")}}

    blocks, alternating = summary("blocks"), summary("alternating")
    report = {
        "command": " ".join(sys.argv), "pool_size": args.pool, "B": args.basis,
        "d": args.dim, "k": args.k, "queries": args.queries,
        "basis_from": args.run or "seeded Gaussian",
        "speedup": blocks["speedup"],
        "speedup_scoring_only": blocks["speedup_scoring_only"],
        "speedup_vs_faiss": blocks["speedup_vs_faiss"],
        "identical_rankings": mismatch["exact_float64"] == 0,
        "ranking_mismatches": mismatch,
        "ms_per_query_median": blocks["ms_per_query_median"],
        "alternating": alternating,
        "notes": (f"speedup = end to end (scoring + exact top-k with the same top-k code on "
                  f"both sides), speedup_scoring_only = the matmuls alone (B*N vs d*N "
                  f"multiply-adds), speedup_vs_faiss = end to end vs faiss IndexFlatIP; "
                  f"headline figures from the 'blocks' schedule (blocks of {args.block} "
                  f"queries per method, alternating order), 'alternating' = every query runs "
                  f"all methods in turn (cold caches for the score space); one process, one "
                  f"query at a time; identical_rankings: score-space top-k == exact float64 "
                  f"top-k of u~ R^T for every query"),
        "threads": {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                    "faiss_omp": faiss_threads},
        "load_average_1min": os.getloadavg()[0],
        "numpy": np.__version__,
    }
    print(json.dumps(report, indent=2))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
