"""Federated evaluation: ranking metrics computed on the devices, released clipped and noised.

A server that holds only public data (docs/privacy.md#threat-model) cannot read anyone's test
impressions. Instead each sampled device scores its own labelled test impressions with the
global model and releases one vector of five numbers (docs/privacy.md#federated-evaluation):

    v_u = w_u · (Σ AUC, Σ MRR, Σ nDCG@5, Σ nDCG@10, n_u),   w_u = min(1, K / n_u)

over its n_u *evaluable* impressions (labelled, with a clicked and a non-clicked candidate:
every metric is defined on them; MIND's metrics per impression, Wu et al., ACL 2020). Each
metric lies in [0, 1], so every coordinate of v_u lies in [0, K], whatever the data: the
per-user clip K (``clip``; K = 1 releases the user's mean metrics and a count of 1) bounds
the L2 sensitivity under replacement of one user's whole data by Δ₂ = K·√5. A device
without an evaluable impression releases the zero vector, of the same shape and noise, so
who answers does not depend on anyone's clicks. Each release adds N(0, σ²) per coordinate,
σ calibrated to (ε, δ) at Δ₂ by the analytic Gaussian mechanism
(:func:`~privaterec.privacy.calibrate.calibrate`); on a device the noise comes from the OS
CSPRNG, float-safe (:class:`~privaterec.privacy.samplers.SecureNoise`), in a simulation
from the device's seeded generator.

The server sums the n releases it received, S = Σ ṽ_u, and reports metric_j = S_j / S_5:
the mean over the evaluable impressions with each user's weight capped at K impressions
(K ≥ every user's n_u: the per-impression mean of a server-side evaluation of the same
impressions). Each sum carries noise N(0, nσ²), so the estimate's standard deviation is
about σ·√(n(1 + metric_j²)) / S_5 (delta method).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Mapping, Sequence

import numpy as np
import torch

from privaterec.eval.metrics import NDCG_CUTOFFS, impression_metrics
from privaterec.privacy.calibrate import Calibration, calibrate
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.samplers import NoiseSource
from privaterec.validators import check_in, fail

METRICS: tuple[str, ...] = ("auc", "mrr", *(f"ndcg@{k}" for k in NDCG_CUTOFFS))
"""The metrics a device releases, in the order of its vector (then the count)."""
DIMENSION = len(METRICS) + 1
"""Coordinates of one release: the metric sums and the count."""


@dataclass(frozen=True)
class EvaluationPolicy:
    """What one federated evaluation releases, and what it costs each sampled user.

    Attributes
    ----------
    epsilon, delta:
        (ε, δ) of one device's release in one evaluation, under replacement of the user's
        whole data (user-level: the release reads the test impressions and the history).
    clip:
        K, the most impressions one user's release counts (its weight is min(1, K/n_u));
        the L2 sensitivity is K·√5.
    fraction:
        q, the probability that an enrolled device is asked in an evaluation (each
        independently; 1: every device).
    """

    epsilon: float = 1.0
    delta: float = 1e-6
    clip: float = 1.0
    fraction: float = 1.0

    def __post_init__(self) -> None:
        check_in(self.epsilon, "eval_epsilon", 0, math.inf, "a finite number > 0",
                 open_low=True)
        check_in(self.delta, "eval_delta", 0, 1, "a number in (0, 1)", open_low=True,
                 open_high=True)
        check_in(self.clip, "eval_clip", 0, math.inf, "a finite number > 0", open_low=True)
        check_in(self.fraction, "eval_fraction", 0, 1, "a probability in (0, 1]",
                 open_low=True, open_high=False)

    @property
    def sensitivity(self) -> float:
        """Δ₂ = K·√5: two users' vectors in [0, K]^5 differ by at most this in L2."""
        return self.clip * math.sqrt(DIMENSION)

    @cached_property
    def calibration(self) -> Calibration:
        """The Gaussian noise of one release and its ledger event (user-level)."""
        return calibrate(mechanism="gaussian", epsilon=self.epsilon, delta=self.delta,
                         sensitivity=self.sensitivity, dimension=DIMENSION, phase="train",
                         data="all", note=(
                             f"federated evaluation: a device's clipped metric sums and "
                             f"count (each user's weight capped at {self.clip:g} "
                             f"impressions, L2 sensitivity {self.sensitivity:.4g}) plus "
                             f"Gaussian noise; one user's whole data replaced"))

    @property
    def sigma(self) -> float:
        """σ of the noise on each coordinate of one release."""
        return self.calibration.scale

    @property
    def event(self) -> PrivacyEvent:
        """The ledger event of one device's release in one evaluation."""
        return self.calibration.event

    def to_dict(self) -> dict[str, float]:
        return {"epsilon": self.epsilon, "delta": self.delta, "clip": self.clip,
                "fraction": self.fraction, "sigma": self.sigma,
                "sensitivity": self.sensitivity}


ImpressionPair = tuple[np.ndarray, np.ndarray]
"""``(labels int[C], scores float[C])`` of one impression."""


def evaluable(labels: np.ndarray) -> bool:
    """Whether an impression has a clicked and a non-clicked candidate (every metric is
    defined on it)."""
    positives = int(np.sum(labels))
    return 0 < positives < len(labels)


def device_vector(pairs: Iterable[ImpressionPair], *, clip: float) -> torch.Tensor:
    """One device's clipped metric vector ``float64[5]`` (module docstring), before noise.

    Parameters
    ----------
    pairs:
        The device's labelled test impressions (labels, scores); those without both a
        clicked and a non-clicked candidate are left out.
    clip:
        K: the vector is scaled by min(1, K/n) so that every coordinate is in [0, K].
    """
    sums = np.zeros(DIMENSION, dtype=np.float64)
    for labels, scores in pairs:
        values = impression_metrics(labels, scores)
        if values is None:  # not evaluable
            continue
        sums[:-1] += values
        sums[-1] += 1.0
    count = sums[-1]
    if count > clip:
        sums *= clip / count
    return torch.from_numpy(np.clip(sums, 0.0, clip))


def release(vector: torch.Tensor, policy: EvaluationPolicy, source: NoiseSource
            ) -> torch.Tensor:
    """``vector`` ``[5]`` (clipped by :func:`device_vector`) plus the policy's Gaussian noise
    from ``source`` (float-safe from the OS CSPRNG with
    :class:`~privaterec.privacy.samplers.SecureNoise`)."""
    if vector.shape != (DIMENSION,):
        fail("vector", tuple(vector.shape), f"a vector of {DIMENSION} coordinates")
    clipped = vector.to(torch.float64).clamp(0.0, policy.clip)
    return source.release_gaussian(clipped, sigma=policy.sigma)


@dataclass(frozen=True)
class EvaluationResult:
    """The server's estimate from one federated evaluation.

    Attributes
    ----------
    metrics: each metric's estimate S_j / S_5 (``nan`` when the noised count is ≤ 0).
    std: each estimate's standard deviation from the noise (delta method at the estimate).
    count: S_5, the noised number of evaluable impressions (capped at K per user).
    devices: n, the devices whose releases were summed.
    sigma: σ of one release's noise; the sums carry σ·√n.
    """

    metrics: dict[str, float]
    std: dict[str, float]
    count: float
    devices: int
    sigma: float

    def to_dict(self) -> dict[str, object]:
        return {**self.metrics, "std": dict(self.std), "count": self.count,
                "devices": self.devices, "sigma": self.sigma}


def aggregate(released: torch.Tensor, *, sigma: float) -> EvaluationResult:
    """The estimate from the releases ``[n, 5]`` of one evaluation (module docstring).

    ``sigma``: σ of each release's noise (0 for the noiseless reference,
    :func:`reference`)."""
    if released.ndim != 2 or released.shape[1] != DIMENSION:
        fail("released", tuple(released.shape), f"a [n, {DIMENSION}] tensor")
    n = int(released.shape[0])
    sums = released.to(torch.float64).sum(0).tolist() if n else [0.0] * DIMENSION
    count = float(sums[-1])
    sum_std = sigma * math.sqrt(n)
    metrics: dict[str, float] = {}
    std: dict[str, float] = {}
    for j, name in enumerate(METRICS):
        value = sums[j] / count if count > 0 else math.nan
        metrics[name] = value
        std[name] = (sum_std * math.sqrt(1.0 + value * value) / count
                     if count > 0 else math.nan)
    return EvaluationResult(metrics, std, count, n, float(sigma))


def reference(vectors: Sequence[torch.Tensor] | torch.Tensor) -> EvaluationResult:
    """The noiseless estimate from the same devices' clipped vectors: what a server holding
    their test impressions computes with the same per-user clip."""
    stacked = (torch.stack(list(vectors)) if not isinstance(vectors, torch.Tensor)
               else vectors)
    if stacked.numel() == 0:
        stacked = torch.zeros(0, DIMENSION, dtype=torch.float64)
    return aggregate(stacked, sigma=0.0)


def pairs_by_user(user_ids: Sequence[str], pairs: Sequence[ImpressionPair]
                  ) -> Mapping[str, list[ImpressionPair]]:
    """Group scored impressions (in the order of ``user_ids``, one owner per impression)."""
    grouped: dict[str, list[ImpressionPair]] = {}
    for uid, pair in zip(user_ids, pairs, strict=True):
        grouped.setdefault(uid, []).append(pair)
    return grouped


__all__ = ["DIMENSION", "EvaluationPolicy", "EvaluationResult", "METRICS", "aggregate",
           "device_vector", "evaluable", "pairs_by_user", "reference", "release"]
