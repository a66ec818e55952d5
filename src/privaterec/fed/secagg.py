"""Central DP's clipped updates summed by secure aggregation: the numbers (no ``flwr`` here).

With ``--secure-aggregation secaggplus`` (Flower engine), DP-FedAvg's clients send their
clipped updates through Flower's SecAgg+ (Bonawitz et al., CCS 2017; Bell et al., CCS
2020): each client turns its vector into integers, adds pairwise and private masks modulo a
power of two M, and the server learns only the sum of the vectors of the clients that did
not drop out. This module fixes, per round, what the client sends and what it is worth:

* **Quantisation.** SecAgg+ maps each coordinate y ∈ [−c, c] (``clipping_range`` c, a
  power of two) to the integer (y + c)·Q/(2c) ∈ [0, Q] (``quantization_range`` Q = 2^b) by
  stochastic rounding, after clipping y to [−c, c]. The client first puts its clipped
  update x (‖x‖₂ ≤ C) on that grid itself, **rounding every coordinate toward zero** to a
  multiple of the step s = 2c/Q (:meth:`SecAggRound.quantize`): |q_j| ≤ |x_j|, so
  ‖q‖₂ ≤ ‖x‖₂ ≤ C and the sensitivity of the sum stays C (2C under replacement), exactly
  as accounted. Grid values are exact in float64 (c and Q are powers of two), so SecAgg+'s
  own rounding has nothing left to round and its clip to [−c, c] never acts (c ≥ C ≥ |q_j|).
  The decoded sum differs from the simulator's float sum by less than 2·s per client and
  coordinate (:meth:`SecAggRound.tolerance`).
* **No wraparound.** The n vectors' integers sum to at most n·Q per coordinate (and the
  weights SecAgg+ prepends, Q each, to n·Q), so the modulus is the smallest power of two
  M > n·Q; Flower documents M ≤ 2^32, so b is the largest bit count ≤ :data:`MAX_BITS`
  with n·2^b < 2^32 (:func:`plan_round` raises if n is too large for
  :data:`MIN_BITS` bits).
* **Threshold and dropouts.** Every sampled client shares its secrets with all the others
  (SecAgg+ with ``num_shares`` = all) and the reconstruction threshold is t = n − k for at
  most k = ``max_dropouts`` dropouts: the server can unmask the sum only when at least t
  clients answer the unmasking stage, all of whose masked vectors are in the sum. A round
  needs n ≥ 2k + 1 clients (t > n/2, the threshold SecAgg's security proofs assume) and at
  least 2; a round with fewer sampled clients asks none of them (its release is the noise
  alone).
* **Distributed noise.** With ``--noise-placement distributed`` each of the n sampled
  clients adds its share N(0, σ²/(n − k)) (σ = z·C) before masking, so the sum of the at
  least n − k shares that survive carries variance ≥ σ² (:meth:`SecAggRound.share_sigma`).
  The share is rounded to the grid *after* the update is (the update is already a grid
  value, so the client sends q + round(share)): the decoded sum is Σ q_i + Σ round(n_i), a
  data-independent noise added to a sum of sensitivity C. With the share's σ at least
  :data:`MIN_SHARE_STEPS` steps, Σ round(n_i) has, up to a total-variation distance below
  10^−300 per coordinate (Poisson summation: the aliasing terms are exp(−π²σ_s²/2) with
  σ_s ≥ 16 steps), the law of round(G + W) with G ~ N(0, Σσ_i²) and W independent of G, so
  the release is a post-processing of the Gaussian mechanism with σ² ≥ z²C². c is chosen
  so that the noisy coordinate stays inside [−c, c] unless a share exceeds
  :data:`TAIL_SIGMAS` of its σ (probability erfc(13/√2) ≈ 1.2·10^−38 per coordinate and
  client; :meth:`SecAggRound.tail_bound`), where SecAgg+'s clip would act. The run is
  within total variation η = Σ_rounds n·D·1.2·10^−38 of the accounted mechanism, which adds
  (1 + e^ε)·η to δ (reported, far below any δ one would choose).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from privaterec.config import NOISE_PLACEMENTS, SECURE_AGGREGATIONS
from privaterec.errors import ConfigError
from privaterec.privacy.samplers import NoiseSource

MAX_MODULUS_BITS = 32
"""Flower's SecAgg+ documents ``modulus_range`` ≤ 2^32."""
MAX_BITS = 24
"""Largest quantisation: Q = 2^24 levels over [−c, c]."""
MIN_BITS = 8
"""Smallest quantisation accepted (fewer levels make the grid too coarse to train)."""
TAIL_SIGMAS = 13.0
"""Distributed noise: c leaves room for a share of 13 standard deviations."""
MIN_SHARE_STEPS = 16.0
"""Distributed noise: a share's σ must be at least 16 grid steps (lattice argument)."""


def _pow2_at_least(x: float) -> float:
    """The smallest power of two ≥ x (x > 0), as a float (exact)."""
    return 2.0 ** math.ceil(math.log2(x))


def min_clients(max_dropouts: int) -> int:
    """Fewest sampled clients a SecAgg+ round runs with: n ≥ 2k + 1 (t = n − k > n/2), ≥ 2."""
    return max(2, 2 * max_dropouts + 1)


def quantization_bits(n: int) -> int:
    """b: the largest bit count ≤ :data:`MAX_BITS` with n·2^b < 2^32 (no wraparound).

    Raises
    ------
    ConfigError
        If n clients leave fewer than :data:`MIN_BITS` bits.
    """
    bits = min(MAX_BITS, MAX_MODULUS_BITS - max(1, n).bit_length())  # n < 2^bit_length
    if bits < MIN_BITS:
        raise ConfigError(f"secure aggregation of {n} clients in one round leaves {bits} "
                          f"quantisation bits under SecAgg+'s modulus 2^32 (at least "
                          f"{MIN_BITS} needed): lower --client-fraction")
    return bits


@dataclass(frozen=True)
class SecAggRound:
    """The SecAgg+ parameters of one round and what the client does to its vector.

    Attributes
    ----------
    clients: n, the sampled clients asked. max_dropouts: k. clip: C.
    sigma: σ = z·C, the standard deviation of the noise on the sum.
    distributed: each client adds its share of the noise (else the server adds it).
    bits: b (Q = 2^b). clipping_range: c (power of two). modulus: M (power of two).
    """

    clients: int
    max_dropouts: int
    clip: float
    sigma: float
    distributed: bool
    bits: int
    clipping_range: float
    modulus: int

    @property
    def quantization_range(self) -> int:
        """Q = 2^b: SecAgg+ maps [−c, c] to [0, Q]."""
        return 2 ** self.bits

    @property
    def step(self) -> float:
        """s = 2c/Q, the grid step (a power of two)."""
        return 2 * self.clipping_range / self.quantization_range

    @property
    def threshold(self) -> int:
        """t = n − k: shares needed to unmask; the sum decodes only with ≥ t survivors."""
        return self.clients - self.max_dropouts

    @property
    def share_sigma(self) -> float:
        """σ/√(n − k): one client's share of the noise (0 for central noise)."""
        return self.sigma / math.sqrt(self.threshold) if self.distributed else 0.0

    def tolerance(self) -> float:
        """Per coordinate, |decoded sum − Σ x_i| < this (noise aside): 2·s per client."""
        return 2 * self.step * self.clients

    def tail_bound(self, dimension: int) -> float:
        """Probability that SecAgg+'s clip to [−c, c] acts on some coordinate of some
        client's noisy vector in this round (0 for central noise; union bound)."""
        if not self.distributed:
            return 0.0
        room = self.clipping_range - self.clip - self.step / 2
        return min(1.0, self.clients * dimension
                   * math.erfc(room / (math.sqrt(2) * self.share_sigma)))

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """The clipped update ``x`` ``[D]`` on the grid, each coordinate rounded toward zero
        (float64, exact multiples of s): ‖q‖₂ ≤ ‖x‖₂, and ≤ C (checked in float64; the clip
        already bounds ‖x‖₂ by C exactly, :data:`~privaterec.privacy.mechanisms.CLIP_MARGIN`,
        so the loop that moves coordinates one more step toward zero is a guard for an
        ``x`` clipped elsewhere)."""
        x64 = x.detach().to(torch.float64)
        q = torch.trunc(x64 / self.step) * self.step
        while float(torch.linalg.vector_norm(q)) > self.clip:
            q = torch.where(q.abs() >= self.step, q - torch.sign(q) * self.step, q)
        return q

    def client_vector(self, x: torch.Tensor, source: NoiseSource) -> torch.Tensor:
        """What the client hands to SecAgg+ (float64 ``[D]``, grid values): its quantised
        clipped update, plus its rounded noise share drawn from ``source`` (the OS CSPRNG
        via :class:`~privaterec.privacy.samplers.SecureNoise` on a device, float-safe; the
        client's seeded generator in simulation) with distributed noise."""
        q = self.quantize(x)
        if not self.distributed:
            return q
        share = source.release_gaussian(torch.zeros_like(q),
                                                   sigma=self.share_sigma)
        return q + torch.round(share.to(torch.float64) / self.step) * self.step

    def check(self) -> None:
        """Refuse a round whose noise share is too fine for the lattice argument.

        Raises
        ------
        ConfigError
            If the share's σ is below :data:`MIN_SHARE_STEPS` grid steps.
        """
        if self.distributed and self.share_sigma < MIN_SHARE_STEPS * self.step:
            raise ConfigError(
                f"distributed noise: a client's share sigma {self.share_sigma:.3g} is below "
                f"{MIN_SHARE_STEPS:g} quantisation steps ({self.step:.3g}) with "
                f"{self.clients} clients per round; raise --noise-multiplier or lower "
                f"--client-fraction")


def plan_round(*, clients: int, max_dropouts: int, clip: float, sigma: float,
               distributed: bool) -> SecAggRound:
    """The SecAgg+ parameters of a round of ``clients`` sampled clients.

    c is the smallest power of two ≥ C (central noise) or ≥ C + 13·σ_share (distributed);
    b from :func:`quantization_bits`; M the smallest power of two > n·Q.

    Raises
    ------
    ConfigError
        If n < :func:`min_clients`, b < :data:`MIN_BITS` or the share is too fine.
    """
    if clients < min_clients(max_dropouts):
        raise ConfigError(f"secure aggregation with at most {max_dropouts} dropouts needs "
                          f"at least {min_clients(max_dropouts)} clients in a round, got "
                          f"{clients}")
    bits = quantization_bits(clients)
    share = sigma / math.sqrt(clients - max_dropouts) if distributed else 0.0
    c = _pow2_at_least(clip + TAIL_SIGMAS * share)
    while distributed and c - clip - c / 2 ** bits < TAIL_SIGMAS * share:
        c *= 2  # room for the tail after the half step
    modulus = 2 ** (clients * 2 ** bits).bit_length()
    plan = SecAggRound(clients=clients, max_dropouts=max_dropouts, clip=clip, sigma=sigma,
                       distributed=distributed, bits=bits, clipping_range=c, modulus=modulus)
    plan.check()
    return plan


__all__ = ["MAX_BITS", "MIN_BITS", "MIN_SHARE_STEPS", "NOISE_PLACEMENTS",
           "SECURE_AGGREGATIONS", "SecAggRound", "TAIL_SIGMAS", "min_clients",
           "plan_round", "quantization_bits"]
