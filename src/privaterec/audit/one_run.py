"""One-run empirical privacy estimate of a whole DP-FedAvg training run.

Andrew, Kairouz, Oh, Oprea, McMahan & Suriyakumar, ICLR 2024, "One-shot empirical privacy
estimation for federated learning": K canary clients, each with a fixed random unit vector
c_i ``[D]`` drawn isotropically and independently of the data, take part in training like
users (each joins each round with probability q, Poisson sampling) and send the clipped
update C·c_i; after training, the cosines of the final model delta θ_0 − θ_T (the server
steps against the aggregated update, so a canary's update points along it) with the K
inserted canaries and with K held-out canaries (drawn the same way, never inserted) are two
samples. Held out, a cosine is about N(0, 1/D); inserted, it is shifted by the canary's
signal. Fitting a Gaussian to each, μ̂ = (mean_in − mean_out)/std_out is the Gaussian-DP
parameter of one canary's participation in the whole run, and the estimate is the ε of
μ̂-GDP at the run's δ (Dong, Roth & Su 2022). One canary added or removed is the add/remove
relation: the estimate is compared with the ledger's add/remove ε of the run (and its
replace-one ε, the guarantee it reports, which is larger).

The estimate is not a bound: it is what a well-placed observer of the final model would
measure, with no confidence interval, for canaries that are the worst case in norm (exactly
C) but random in direction. The canaries run through the method's real round (their sum is
added to the clients' clipped sum before the division by qN, which is the same as adding it
before the aggregator's noise: the round is linear there), and through the server's real
optimizer.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privaterec.config import RunConfig
from privaterec.errors import ConfigError
from privaterec.fed.methods.base import RoundContext, RoundOutput
from privaterec.fed.methods.dp_fedavg import CentralDP
from privaterec.validators import fail


def canary_vectors(count: int, dimension: int, *, seed: int) -> torch.Tensor:
    """``count`` random unit vectors ``[count, D]`` (isotropic: normalised Gaussians),
    float64, from ``seed`` alone (never from the data)."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(count, dimension, generator=g, dtype=torch.float64)
    return v / torch.linalg.vector_norm(v, dim=1, keepdim=True)


@dataclass(frozen=True, kw_only=True)
class CanaryRounds(CentralDP):
    """DP-FedAvg with ``canary_count`` canary clients inserted (module docstring): in round
    t, canary i joins with probability q (a generator seeded by (``canary_seed``, t)) and
    adds C·c_i to the round's clipped sum."""

    canary_count: int = 0
    canary_seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.adaptive is not None or self.clip_space != "parameters":
            raise ConfigError("the one-run canary audit inserts canaries into dp-fedavg with "
                              "a fixed --clip in parameter space only (no "
                              "--adaptive-clip-quantile, --clip-space parameters)")
        if self.canary_count < 1:
            fail("canaries", self.canary_count, "an int >= 1", kind="audit parameter")

    def canary_sum(self, dimension: int, round_index: int) -> torch.Tensor:
        """Σ C·c_i ``[D]`` float32 over the canaries that join round ``round_index``."""
        g = torch.Generator().manual_seed(self.canary_seed * 1_000_003 + round_index)
        joined = torch.rand(self.canary_count, generator=g, dtype=torch.float64) \
            < self.sampling_rate
        vectors = canary_vectors(self.canary_count, dimension, seed=self.canary_seed)
        return (self.clip * vectors[joined].sum(0)).to(torch.float32)

    def round(self, task: Any, params: torch.Tensor, inputs: Any, sources: Any,
              context: RoundContext) -> RoundOutput:
        """The real round (:meth:`CentralDP.round`), with the canaries' sum over qN added
        to its direction: the same as adding their clipped updates to the clients' sum."""
        out = super().round(task, params, inputs, sources, context)
        extra = self.canary_sum(task.dimension, context.round_index)
        return dataclasses.replace(
            out, direction=out.direction + extra / (self.sampling_rate * context.population))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The ε of μ-GDP at δ: the root of Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) = δ (Dong, Roth
    & Su 2022, Cor. 2.13); 0 for μ ≤ 0."""
    from scipy import optimize, stats

    if not mu > 0:
        return 0.0

    def excess(eps: float) -> float:
        return float(stats.norm.cdf(-eps / mu + mu / 2)
                     - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta)

    if excess(0.0) <= 0:
        return 0.0
    hi = 1.0
    while excess(hi) > 0:
        hi *= 2
    return float(optimize.brentq(excess, 0.0, hi))


@dataclass(frozen=True)
class OneRunEstimate:
    """The one-run estimate and the run's ledger ε (module docstring).

    ``mu``: μ̂; ``epsilon``: the estimate at ``delta``; ``ledger_epsilon``: the run's
    replace-one ε (what ``privacy.json`` reports), ``ledger_epsilon_add_remove`` its
    add/remove ε (the relation one canary is audited under); the cosines' means and standard
    deviations.
    """

    canaries: int
    rounds: int
    sampling_rate: float
    noise_multiplier: float
    noise_factor: float
    dimension: int
    delta: float
    mu: float
    epsilon: float
    ledger_epsilon: float
    ledger_epsilon_add_remove: float
    inserted_mean: float
    inserted_std: float
    held_out_mean: float
    held_out_std: float


def estimate_from_delta(model_delta: torch.Tensor, *, canaries: int, seed: int,
                        delta: float) -> tuple[float, float, np.ndarray, np.ndarray]:
    """(μ̂, ε̂, inserted cosines ``[K]``, held-out cosines ``[K]``) of a final model delta
    ``[D]``: the inserted canaries are the first K of :func:`canary_vectors` (``seed``), the
    held-out ones the next K (drawn the same way, never inserted)."""
    vectors = canary_vectors(2 * canaries, model_delta.numel(), seed=seed)
    d = model_delta.detach().to(torch.float64).reshape(-1)
    cos = (vectors @ d / torch.linalg.vector_norm(d).clamp_min(1e-300)).numpy()
    inserted, held = cos[:canaries], cos[canaries:]
    mu = float((inserted.mean() - held.mean()) / max(held.std(ddof=1), 1e-300))
    return mu, gdp_epsilon(mu, delta), inserted, held


def one_run_audit(config: RunConfig, *, canaries: int, canary_seed: int = 1,
                  noise_factor: float = 1.0, progress: bool = False) -> OneRunEstimate:
    """Train ``config`` (dp-fedavg on the simulator) with ``canaries`` canary clients and
    estimate its ε from the final model alone (module docstring).

    ``noise_factor``: scale the aggregator's noise by this factor (a broken variant, e.g.
    0.25 for a 4× cut; :func:`~privaterec.audit.broken.scaled_gaussian_noise`) while the
    ledger keeps the calibrated claim.

    Raises
    ------
    ConfigError
        If the run is not dp-fedavg with a fixed clip in parameter space on the simulator.
    """
    from contextlib import nullcontext

    from privaterec.audit import broken
    from privaterec.fed.engine import federated_job
    from privaterec.fed.methods import resolve_run_config
    from privaterec.privacy.central_accounting import central_epsilon
    from privaterec.runs.ranking_setup import build_run_model, prepare_data
    from privaterec.runtime.determinism import flush_denormals

    config = resolve_run_config(config)
    if config.train.method != "dp-fedavg" or config.fed.engine != "simulator":
        raise ConfigError(f"the one-run canary audit trains dp-fedavg on the simulator, got "
                          f"--method {config.train.method} --engine {config.fed.engine}")
    with flush_denormals():
        prepared = prepare_data(config)
        model = build_run_model(config, prepared)
        job = federated_job(config, model, progress=progress)
        method = job.method
        assert isinstance(method, CentralDP)
        inserting = CanaryRounds(**{f.name: getattr(method, f.name)
                                    for f in dataclasses.fields(method)},
                                 canary_count=canaries, canary_seed=canary_seed)
        job = dataclasses.replace(job, method=inserting)
        theta0 = job.task.parameters().clone()
        context = (broken.scaled_gaussian_noise(noise_factor) if noise_factor != 1.0
                   else nullcontext())
        with context:
            state = job.train(prepared.train_clients, progress=progress)
        # the server steps against the direction (θ ← θ − step(ḡ)): the canaries' updates
        # point along θ₀ − θ_T
        model_delta = theta0 - job.task.parameters()
    mu, eps, inserted, held = estimate_from_delta(model_delta, canaries=canaries,
                                                  seed=canary_seed, delta=method.delta)
    rounds = int(state.round_index)

    def ledger(neighbours: str) -> float:
        return central_epsilon(noise_multiplier=method.noise_multiplier,
                               sampling_rate=method.sampling_rate, rounds=rounds,
                               delta=method.delta, neighbours=neighbours)

    return OneRunEstimate(
        canaries=canaries, rounds=rounds, sampling_rate=method.sampling_rate,
        noise_multiplier=method.noise_multiplier, noise_factor=noise_factor,
        dimension=int(model_delta.numel()), delta=method.delta, mu=mu, epsilon=eps,
        ledger_epsilon=ledger("replace"), ledger_epsilon_add_remove=ledger("add_remove"),
        inserted_mean=float(inserted.mean()), inserted_std=float(inserted.std(ddof=1)),
        held_out_mean=float(held.mean()), held_out_std=float(held.std(ddof=1)))


def one_run_audit_of(run_dir: str | Path, *, canaries: int, canary_seed: int = 1,
                     progress: bool = False) -> OneRunEstimate:
    """:func:`one_run_audit` of a run directory's configuration (``RUN/config.yaml``): the
    run is trained again, from the same seed, with the canaries inserted."""
    from privaterec.runs.directory import RunDirectory

    config = RunDirectory(Path(run_dir)).config()
    return one_run_audit(config, canaries=canaries, canary_seed=canary_seed,
                         progress=progress)


__all__ = ["CanaryRounds", "OneRunEstimate", "canary_vectors", "estimate_from_delta",
           "gdp_epsilon", "one_run_audit", "one_run_audit_of"]
