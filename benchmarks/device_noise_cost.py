"""Device-side cost of a release: SecureNoise (CSPRNG, float-safe) vs SimulationNoise (seeded).

Usage::

    python benchmarks/device_noise_cost.py [--repeats-small 300] [--repeats-large 7]

Times one release ``x + noise`` of

* B = 5 coordinates (a PrivateRec serving query: α̃ of 5 basic vectors), and
* D = 91,000 coordinates (a federated upload of that size),

with Laplace and Gaussian noise, through :class:`privaterec.privacy.samplers.SecureNoise`
(OpenDP's float-safe discrete noise on a public grid, CSPRNG bits; with its default thread
count and with one thread) and :class:`~privaterec.privacy.samplers.SimulationNoise` (torch's
seeded float samplers). Each cell is the median over ``--repeats-*`` runs (the machine may be
shared: medians, plus min and max). It also times the device's whole fresh PrivateRec release
(:func:`privaterec.ondevice.release.dpa_release`: padding, user encoder, attention, noise,
normalisation; a small random NRMS model, H = 50, B = 5, d = 64) with both sources, and a
cache hit (the cached α̃ is re-sent without any of that), to size the timing difference
docs/serving.md discusses.

Prints a table and saves ``benchmarks/results/device_noise_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from privaterec.privacy.samplers import SecureNoise, SimulationNoise

OUT = Path(__file__).resolve().parent / "results" / "device_noise_cost.json"


def timed(fn: Callable[[], object], repeats: int) -> dict[str, float]:
    """Median, min and max wall time (seconds) of ``fn`` over ``repeats`` runs (1 warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "repeats": repeats}


def noise_cells(repeats_small: int, repeats_large: int) -> list[dict]:
    sources = {"SecureNoise": SecureNoise(),
               "SecureNoise (1 thread)": SecureNoise(workers=1),
               "SimulationNoise": SimulationNoise(torch.Generator().manual_seed(0))}
    rows = []
    for dim, repeats in ((5, repeats_small), (91_000, repeats_large)):
        x = torch.rand(dim)  # float32, as a device's α or update
        for mechanism in ("laplace", "gaussian"):
            for name, source in sources.items():
                if name == "SecureNoise (1 thread)" and dim == 5:
                    continue  # identical to the default: short vectors are one call
                if mechanism == "laplace":
                    def run(s=source) -> object:
                        return s.release_laplace(x, scale=2.0)
                else:
                    def run(s=source) -> object:
                        return s.release_gaussian(x, sigma=2.0)
                cell = timed(run, repeats)
                rows.append({"dim": dim, "mechanism": mechanism, "source": name, **cell})
                print(f"  {dim:>6} {mechanism:<8} {name:<24} {cell['median_s'] * 1e3:10.3f} ms",
                      flush=True)
    return rows


def device_release_cells(repeats: int) -> list[dict]:
    """Whole fresh PrivateRec release (dpa_release) and a cache-hit lookup, both sources."""
    from privaterec.config import ModelConfig
    from privaterec.data.features import build_news_features, build_vocabularies
    from privaterec.data.synth import SynthConfig, generate
    from privaterec.ondevice.release import ServingConfig, dpa_release
    from privaterec.models.factory import build_recommender
    from privaterec.ondevice.budget import DeviceBudget, release_key

    model_config = ModelConfig(news_encoder="nrms", word_dim=64, num_heads=4, head_dim=16,
                               attention_dim=32, title_len=20, abstract_len=8, history_len=50,
                               basis_size=5, dropout=0.0)
    dataset = generate(SynthConfig(users=20, news=200, seed=3))
    pool = list(dataset.all_news().values())
    vocabs = build_vocabularies(dataset.train.news.values())
    features = build_news_features(pool, vocabs, title_len=20, abstract_len=8)
    torch.manual_seed(0)
    model = build_recommender(model_config, vocabs, features).eval()
    history = pool[:50]
    with torch.no_grad():
        vectors = model.encode_rows(torch.arange(1, 51))[None]  # the device's encoded history
        r0 = model.encode_rows(torch.tensor([0]))[0]
    mask = torch.ones(1, 50, dtype=torch.bool)
    config = ServingConfig(kind="privaterec", epsilon=1.0, padding_p=0.5)
    rows = []
    for name, noise in (("SecureNoise", SecureNoise()),
                        ("SimulationNoise", SimulationNoise(torch.Generator().manual_seed(0)))):
        cell = timed(lambda n=noise: dpa_release(model, r0, vectors, mask, config, noise=n),
                     repeats)
        rows.append({"what": "fresh PrivateRec release (dpa_release, H=50, B=5, d=64)",
                     "source": name, **cell})
        print(f"  fresh release {name:<16} {cell['median_s'] * 1e3:10.3f} ms", flush=True)
    budget = DeviceBudget(path=None)
    key = release_key("privaterec", "v1", {"epsilon": 1.0}, history)
    budget.cache(key, {"values": [0.2] * 5})

    def hit() -> object:
        return budget.cached(release_key("privaterec", "v1", {"epsilon": 1.0}, history))

    cell = timed(hit, repeats)
    rows.append({"what": "cache hit (release key + lookup, in memory)", "source": "-", **cell})
    print(f"  cache hit {'':<20} {cell['median_s'] * 1e3:10.3f} ms", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats-small", type=int, default=300,
                        help="runs per B = 5 cell and per whole-release cell")
    parser.add_argument("--repeats-large", type=int, default=7, help="runs per 91k cell")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--smoke", action="store_true",
                        help="2 runs per cell, results to a temporary directory")
    args = parser.parse_args()
    if args.smoke:
        from _smoke import smoke_dir

        args.repeats_small, args.repeats_large = 2, 1
        args.out = smoke_dir("device_noise_cost") / "device_noise_cost.json"
    torch.set_num_threads(1)
    print("noise release (median):", flush=True)
    noise = noise_cells(args.repeats_small, args.repeats_large)
    print("device release (median):", flush=True)
    device = device_release_cells(args.repeats_small)
    ratios = []
    for dim in (5, 91_000):
        for mechanism in ("laplace", "gaussian"):
            cells = {r["source"]: r["median_s"] for r in noise
                     if r["dim"] == dim and r["mechanism"] == mechanism}
            ratios.append({"dim": dim, "mechanism": mechanism,
                           "secure_over_simulation":
                               cells["SecureNoise"] / cells["SimulationNoise"]})
    result = {"noise": noise, "ratios": ratios, "device_release": device,
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                          "torch_threads": torch.get_num_threads(),
                          "load_average_1min": os.getloadavg()[0],
                          "secure_noise_workers": SecureNoise().workers}}
    print("\n| D | noise | SecureNoise | SecureNoise (1 thread) | SimulationNoise | ratio |")
    print("|---|---|---|---|---|---|")
    for r in ratios:
        cells = {c["source"]: c["median_s"] for c in noise
                 if c["dim"] == r["dim"] and c["mechanism"] == r["mechanism"]}
        one = cells.get("SecureNoise (1 thread)")
        print(f"| {r['dim']:,} | {r['mechanism']} | {cells['SecureNoise'] * 1e3:.3f} ms | "
              f"{'-' if one is None else f'{one * 1e3:.3f} ms'} | "
              f"{cells['SimulationNoise'] * 1e3:.3f} ms | {r['secure_over_simulation']:.0f}x |")
    for r in device:
        print(f"- {r['what']}, {r['source']}: {r['median_s'] * 1e3:.3f} ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
