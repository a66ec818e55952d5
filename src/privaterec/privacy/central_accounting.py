"""Central (user-level) DP for federated training: DP-FedAvg's accounting and calibration.

DP-FedAvg (McMahan et al., ICLR 2018): each round every user joins independently with
probability q (Poisson sampling), each sampled user's update is clipped to L2 norm C, and
Gaussian noise N(0, z²C²) is added once to the **sum** of the clipped updates. Adding or
removing one user's data changes that sum by at most C, so one round is the Poisson-sampled
Gaussian mechanism with noise multiplier z, and T rounds compose it T times. The
accountants of ``dp_accounting`` compose it tightly: privacy loss distributions (PLD, the
default) or Rényi DP (RDP, for comparison; Mironov, Talwar & Zhang 2019).

Adjacency: **one user's data replaced** (``REPLACE_ONE``: a sampled user's clipped update
may change by up to 2C), the adjacency of every other total in the ledger, so one click or
one user's whole data changed are both covered; every user of the population gets the
guarantee whether or not it was sampled. The add/remove-one ε (the adjacency DP-FedAvg
papers usually state) and RDP's add/remove bound are reported next to it for comparison
only (``dp_accounting`` has no RDP bound for a Poisson-sampled Gaussian under replacement).
The denominator qN uses the population size N, which is public (the number of enrolled
users). Trust model: the party that adds the noise (the server, or the clients jointly with
distributed noise) sees the clipped updates or their sum.
"""

from __future__ import annotations

import logging
import math
from functools import lru_cache

from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant

from privaterec.errors import ConfigError
from privaterec.privacy.calibrate import Calibration
from privaterec.privacy.events import PrivacyEvent
from privaterec.validators import MIN_NOISE_MULTIPLIER, check_in, check_noise_multiplier

ACCOUNTANTS = ("pld", "rdp")


def _check(*, noise_multiplier: float | None = None, sampling_rate: float, rounds: int,
           delta: float) -> None:
    if noise_multiplier is not None:
        check_noise_multiplier(noise_multiplier)
    if not (0 < sampling_rate <= 1):
        raise ConfigError(f"invalid 'sampling_rate' q: got {sampling_rate!r}, expected "
                          f"0 < q <= 1 (the fraction of users sampled per round)")
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ConfigError(f"invalid 'rounds': got {rounds!r}, expected an integer >= 1")
    check_in(delta, "delta", 0, 1, "0 < delta < 1 (below 1/N for N users)", open_low=True)


def _round_event(noise_multiplier: float, sampling_rate: float) -> dp_event.DpEvent:
    gaussian = dp_event.GaussianDpEvent(noise_multiplier=noise_multiplier)
    if sampling_rate == 1:
        return gaussian
    return dp_event.PoissonSampledDpEvent(sampling_probability=sampling_rate, event=gaussian)


NEIGHBOURS = {"replace": NeighboringRelation.REPLACE_ONE,
              "add_remove": NeighboringRelation.ADD_OR_REMOVE_ONE}


@lru_cache(maxsize=256)
def central_epsilon(*, noise_multiplier: float, sampling_rate: float, rounds: int,
                    delta: float, accountant: str = "pld",
                    value_discretization_interval: float = 1e-4,
                    neighbours: str = "replace") -> float:
    """User-level ε after ``rounds`` rounds of DP-FedAvg at target ``delta``.

    Parameters
    ----------
    noise_multiplier:
        z: the noise on the sum has standard deviation z·C.
    sampling_rate:
        q, each user's probability of joining a round (Poisson sampling).
    rounds:
        T.
    delta:
        Target δ (choose δ < 1/N for N users).
    accountant:
        ``"pld"`` (tight up to its discretisation, default) or ``"rdp"``.
        Results are cached (a pure function of its arguments).
    value_discretization_interval:
        PLD grid (pessimistic: a coarser grid gives a larger, still valid ε).
    neighbours:
        ``"replace"`` (one user's data replaced: the guarantee the ledger reports) or
        ``"add_remove"`` (comparison only); RDP supports ``"add_remove"`` only.
    """
    _check(noise_multiplier=noise_multiplier, sampling_rate=sampling_rate, rounds=rounds,
           delta=delta)
    if neighbours not in NEIGHBOURS:
        raise ConfigError(f"invalid neighbours {neighbours!r}; expected one of "
                          f"{tuple(NEIGHBOURS)}")
    event = dp_event.SelfComposedDpEvent(_round_event(noise_multiplier, sampling_rate), rounds)
    if accountant == "pld":
        acc = pld_privacy_accountant.PLDAccountant(
            NEIGHBOURS[neighbours],
            value_discretization_interval=value_discretization_interval)
    elif accountant == "rdp":
        if neighbours != "add_remove":
            raise ConfigError("the RDP accountant has no bound for a Poisson-sampled Gaussian "
                              "under replacement; use accountant='pld' (or "
                              "neighbours='add_remove' for a comparison)")
        acc = rdp_privacy_accountant.RdpAccountant(
            neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE)
    else:
        raise ConfigError(f"invalid accountant {accountant!r}; expected one of {ACCOUNTANTS}")
    absl = logging.getLogger("absl")  # RDP drops orders it cannot evaluate, with a warning
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        return float(acc.compose(event).get_epsilon(delta))
    finally:
        absl.setLevel(level)


def calibrate_noise_multiplier(*, target_epsilon: float, sampling_rate: float, rounds: int,
                               delta: float, accountant: str = "pld",
                               tolerance: float = 5e-3) -> float:
    """The smallest z (to ``tolerance``, relative) whose T-round user-level ε ≤ the target.

    Bisection on z (ε falls as z grows) under replace-one adjacency (PLD); the returned z
    satisfies the target (it is the upper end of the final bracket).

    z is at least :data:`MIN_NOISE_MULTIPLIER`; a target above its ε gets that z (and the
    run reports its lower ε).

    Raises
    ------
    ConfigError
        If the target is not positive and finite.
    """
    check_in(target_epsilon, "target_epsilon", 0, math.inf, "a finite number > 0", open_low=True)
    _check(sampling_rate=sampling_rate, rounds=rounds, delta=delta)

    def eps(z: float) -> float:
        # A 10x coarser PLD grid than the report's: pessimistic, so the z found also meets
        # the target on the report's finer grid.
        # (RDP: add/remove only, for comparisons.)
        return central_epsilon(noise_multiplier=z, sampling_rate=sampling_rate, rounds=rounds,
                               delta=delta, accountant=accountant,
                               value_discretization_interval=1e-3,
                               neighbours="replace" if accountant == "pld" else "add_remove")

    lo, hi = 0.5, 1.0
    while lo > MIN_NOISE_MULTIPLIER and eps(lo) <= target_epsilon:  # bracket from below
        lo, hi = max(lo / 2, MIN_NOISE_MULTIPLIER), lo
    if lo == MIN_NOISE_MULTIPLIER and eps(lo) <= target_epsilon:
        return lo  # the smallest z the accountant takes meets the target (ε is then lower)
    while eps(hi) > target_epsilon:
        lo, hi = hi, hi * 2
        if hi > 1e6:
            raise ConfigError(f"no noise multiplier below 1e6 reaches epsilon "
                              f"{target_epsilon} (q = {sampling_rate}, T = {rounds}, "
                              f"delta = {delta})")
    while hi - lo > tolerance * hi:
        mid = (lo + hi) / 2
        if eps(mid) > target_epsilon:
            lo = mid
        else:
            hi = mid
    return hi


@lru_cache(maxsize=64)
def central_round_event(*, noise_multiplier: float, sampling_rate: float, clip: float,
                        delta: float, note: str = "") -> PrivacyEvent:
    """The ledger event of one DP-FedAvg round, recorded for every user of the population.

    ``epsilon``/``delta`` hold one round's guarantee at ``delta`` (for basic composition
    only); the PLD and RDP accountants compose the Poisson-sampled Gaussian itself.
    """
    one_round = central_epsilon(noise_multiplier=noise_multiplier, sampling_rate=sampling_rate,
                                rounds=1, delta=delta)
    return PrivacyEvent(
        mechanism="gaussian", epsilon=one_round, delta=delta,
        noise_scale=noise_multiplier * clip, sensitivity=clip, dimension=1, phase="train",
        sampling_rate=sampling_rate, data="all",
        note=note or (f"central DP (DP-FedAvg): Poisson sampling q = {sampling_rate:g}, "
                      f"updates clipped to L2 norm {clip:g}, Gaussian noise z = "
                      f"{noise_multiplier:g} on the sum; one user's data replaced (covers one "
                      f"click and one user); the noise adder sees the clipped updates or "
                      f"their sum"))


def central_calibration(*, noise_multiplier: float, sampling_rate: float, clip: float,
                        delta: float, note: str = "") -> Calibration:
    """The noise the aggregator adds to one round's sum, N(0, (z·C)² I), and its event
    (:func:`central_round_event`; ``note``: its trust model when not the default one),
    calibrated once per run.

    The clients' clip to L2 norm C is their own calibration; this one noises the sum (no
    clipping of its own).
    """
    return Calibration(event=central_round_event(noise_multiplier=noise_multiplier,
                                                 sampling_rate=sampling_rate, clip=clip,
                                                 delta=delta, note=note))


__all__ = ["ACCOUNTANTS", "NEIGHBOURS", "calibrate_noise_multiplier", "central_calibration",
           "central_epsilon", "central_round_event"]
