"""Signal and noise of one central-DP round, clipped in parameter space or in news-vector space.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/news_space_noise.py --data DATA [--clients 1000]
        [--embeddings corpus] [--noise-multiplier 0.5508] [--clip 0.1]
        [--save benchmarks/results/news_space_noise.json]
    python benchmarks/news_space_noise.py --smoke   # tiny data and model, 8 clients, seconds

One round's clients (``sample_round``, seed 0) of ``DATA``, NRMS at its seeded θ₀, FedRec's
inputs (4 negatives, at most 64 samples). For each clipping space, the norm of the clipped
sum the round releases (the signal, before the noise), split into the user side Θ_U and the
news encoder Θ_N, and the norm of the noise the round adds, mapped to the parameters:

* parameter space (``dp-fedavg``): Σ_u clip(∇θ L_u, C) and N(0, z²C² I_D);
* news-vector space (``--clip-space news_vectors``, :mod:`privaterec.fed.news_space`): the
  server's direction from Σ_u clip(w_u, C), and from one draw of N(0, z²C²) on every
  coordinate of the release (the news-encoder part is Σ_n J_nᵀ ξ_n over the whole table).

Also the cosine of each signal with the unclipped sum Σ_u ∇θ L_u.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from privaterec.config import ModelConfig, RunConfig
from privaterec.fed.news_space import NewsSpaceClipping
from privaterec.fed.objective import LocalObjective
from privaterec.fed.rng import client_noise
from privaterec.fed.simulator import eligible_clients, sample_round
from privaterec.models.factory import build_recommender
from privaterec.runs.ranking import prepare_data


def _split(vector: torch.Tensor, news: torch.Tensor) -> dict[str, float]:
    return {"total": float(vector.norm()), "user_side": float(vector[~news].norm()),
            "news_encoder": float(vector[news].norm())}


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


def measure(data: str, *, clients: int, embeddings: str, noise_multiplier: float,
            clip: float, seed: int = 0, model: ModelConfig | None = None) -> dict[str, Any]:
    """One round's signal and noise norms (module docstring); ``model``: NRMS by default."""
    model_config = (ModelConfig(news_encoder="nrms") if model is None else model)
    model_config = replace(model_config, embeddings=embeddings)
    prepared = prepare_data(RunConfig(data=data, model=model_config))
    torch.manual_seed(seed)
    objective = LocalObjective(build_recommender(model_config, prepared.vocabs,
                                                 prepared.features))
    theta = objective.parameters()
    population = prepared.train_clients
    selected = sample_round(eligible_clients(population), clients, seed=seed, round_index=0)
    inputs = [objective.client_inputs(population.client(u), max_samples=64, negatives=4,
                                      noise=client_noise(seed, 0, u))
              for u in selected]
    batch = objective.batch(inputs)
    space = NewsSpaceClipping(objective)
    news = space.news_mask
    sigma = noise_multiplier * clip

    grads, _ = objective.client_gradients(theta, batch)
    unclipped = grads.sum(0)
    norms = grads.norm(dim=1)
    parameter_signal = (grads * (clip / norms).clamp(max=1.0)[:, None]).sum(0)
    generator = torch.Generator().manual_seed(1)
    parameter_noise = sigma * torch.randn(objective.dimension, generator=generator)

    sums = space.clipped_sum(theta, batch, clip=clip)
    news_signal = space.direction(theta, sums.user, sums.news)
    user_noise = torch.zeros_like(theta)
    user_noise[~news] = sigma * torch.randn(int((~news).sum()), generator=generator)
    cotangent_noise = sigma * torch.randn(space.pool_size, space.dim, generator=generator)
    news_noise = space.direction(theta, user_noise, cotangent_noise)

    def row(signal: torch.Tensor, noise: torch.Tensor, client_norms: torch.Tensor
            ) -> dict[str, Any]:
        return {"median_client_norm": float(client_norms.median()),
                "clipped_share": float((client_norms > clip).float().mean()),
                "signal": _split(signal, news), "noise": _split(noise, news),
                "noise_over_signal": float(noise.norm() / signal.norm()),
                "cosine_with_unclipped_sum": _cosine(signal, unclipped)}

    return {"data": data, "clients": len(selected), "embeddings": embeddings,
            "noise_multiplier": noise_multiplier, "clip": clip,
            "parameters_D": objective.dimension, "user_side_D_U": int((~news).sum()),
            "news_in_table": space.pool_size, "news_dim": space.dim,
            "release_dimension_news_space": space.release_dimension,
            "parameters": row(parameter_signal, parameter_noise, norms),
            "news_vectors": row(news_signal, news_noise, sums.norms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--embeddings", default="corpus")
    parser.add_argument("--noise-multiplier", type=float, default=0.55078125,
                        help="z (default: what target epsilon 8 gives at q = 0.02, T = 100)")
    parser.add_argument("--clip", type=float, default=0.1)
    parser.add_argument("--save", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny synthetic data and model, 8 clients, results to a "
                             "temporary directory")
    args = parser.parse_args()
    model = None
    if args.smoke:
        from _smoke import smoke_data, smoke_dir, smoke_model

        args.data, args.clients = str(smoke_data(users=60, news=150)), 8
        args.save, model = smoke_dir("news_space_noise") / "news_space_noise.json", smoke_model()
    elif args.data is None:
        parser.error("--data is required (or --smoke)")
    result = measure(args.data, clients=args.clients, embeddings=args.embeddings,
                     noise_multiplier=args.noise_multiplier, clip=args.clip, model=model)
    print(json.dumps(result, indent=2))
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps(result, indent=2))
        print(f"saved {args.save}")


if __name__ == "__main__":
    main()
