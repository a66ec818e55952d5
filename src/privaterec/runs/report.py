"""The ``release`` block of ``privacy.json``: a method's description plus what every method
shares (its user-level ε per round and what its clients send).

Methods describe themselves (:meth:`~privaterec.fed.methods.base.ClientMethod.describe`,
their events); this module, outside the engine, turns that into the report's block. DP-FedAvg's
block, with its accountants, trust model and adaptive clipping, is written here
(:func:`central_dp_release`).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Sequence

from privaterec.fed.methods.base import ClientMethod
from privaterec.fed.methods.dp_fedavg import CentralDP
from privaterec.fed.news_space import NEWS_ENCODER_PREFIX
from privaterec.fed.secagg import TAIL_SIGMAS, min_clients
from privaterec.privacy.adaptive_clip import equivalent_noise_multiplier
from privaterec.privacy.central_accounting import central_epsilon


SIMULATION_TRUST = ("simulation: noise seeded from config.yaml; not a guarantee against "
                    "whoever holds it")
"""What ``privacy.json`` says of a simulated run's ε (the simulator, Flower's simulation
runtime, a seeded rehearsal): anyone holding the run's seed regenerates every draw."""


def trust_model(method: ClientMethod, *, deployed: bool,
                public_server: bool = False) -> dict[str, str]:
    """The run's ``mode`` and ``trust`` for ``privacy.json``: whose randomness the ε rests on
    and whom it holds against (docs/privacy.md#threat-model). ``public_server``: the server
    was started with a public directory (the catalogue and the roster, no user data)."""
    if not deployed:
        return {"mode": "simulation", "trust": SIMULATION_TRUST}
    if isinstance(method, CentralDP):
        against = ("against the server: see central.trust (it picks the sample, so "
                   "amplification by sampling does not hold against it)")
    elif method.sends_metadata:
        against = "against the server: none (fedrec's updates are not private)"
    else:
        against = ("against the server: each client's own release, epsilon_per_round per "
                   "round it takes part in (local DP; the server sees each release)")
    return {"mode": "deployed", "trust": (
        "deployed (Flower): every client release drawn on its device from the OS CSPRNG "
        "with float-safe noise; the sample (and central DP's noise) drawn by the server "
        "from its OS CSPRNG; a device started with user-id pins the run's privacy policy, "
        "answers each round once and keeps a finite budget; " + against + ". " + (
            "The server process holds only public material: the news catalogue, the run "
            "configuration and the roster of enrolled user ids (and an explicit public or "
            "consented eval-data holdout, if given); it opens no user's behaviors. Not "
            "covered: " if public_server else
            "Not covered: the server process reads the training and test splits it is "
            "given (sampling, evaluation), so against whoever runs it the guarantee holds "
            "only if that data is public (start it with public-dir instead); ")
        + "the server sees when each device answers and the roster")}


def release_description(method: ClientMethod, *, dimension: int,
                        noised_parameters: Sequence[str], clients_per_round: int,
                        client_fraction: float, population: int | None = None,
                        deployed: bool = False, public_server: bool = False
                        ) -> dict[str, Any]:
    """Description of one client's per-round release, for ``privacy.json``.

    Parameters
    ----------
    method: the run's client method. dimension: D.
    noised_parameters: the names of θ's parameters.
    clients_per_round, client_fraction: the round's public sampling (m and m / users).
    population: N, the users the rounds sample from (written as ``population``; the report's
        δ < 1/N check uses it rather than the users the ledger has seen so far).
    deployed: a deployment (``mode`` and ``trust``: :func:`trust_model`); default a
        simulation, whose noise is seeded. public_server: the server held only public
        material (:func:`trust_model`).
    """
    describe = method.describe
    if isinstance(method, CentralDP):
        describe = functools.partial(central_dp_release, method)
    out = describe(dimension=dimension, parameters=noised_parameters,
                   clients_per_round=clients_per_round, client_fraction=client_fraction)
    out["epsilon_per_round_user"], out["delta_per_round_user"] = method.round_epsilon(
        dimension, "user")
    if population is not None:
        out["population"] = int(population)
    out.update(trust_model(method, deployed=deployed, public_server=public_server))
    if "sends" not in out:  # a method whose client sends more says so itself
        out["sends"] = ("released update, sample count, loss" if method.sends_metadata
                        else "released update only")
    return out


def central_dp_release(method: CentralDP, *, dimension: int, parameters: Sequence[str],
                       clients_per_round: int, client_fraction: float) -> dict[str, Any]:
    """DP-FedAvg's release for ``privacy.json``; with adaptive clipping also its
    ``adaptive_clipping`` block (the noise split for m = ``clients_per_round``, the
    expected clients per round)."""
    event = method.central_event()

    def total(accountant: str, neighbours: str) -> float:
        return central_epsilon(noise_multiplier=method.noise_multiplier,
                               sampling_rate=method.sampling_rate, rounds=method.rounds,
                               delta=method.delta, accountant=accountant,
                               neighbours=neighbours)
    central: dict[str, Any] = {
        "noise_multiplier": method.noise_multiplier, "sampling_rate": method.sampling_rate,
        "rounds": method.rounds, "delta": method.delta,
        "epsilon_run_pld": total("pld", "replace"),
        "epsilon_run_pld_add_remove": total("pld", "add_remove"),
        "epsilon_run_rdp_add_remove": total("rdp", "add_remove"),
        "adjacency": "one user's data replaced (covers one click and one user); "
                     "add/remove values for comparison only",
        "sampling": "Poisson: every user joins a round with probability q",
        "trust": (_secure_trust(method, dimension) if method.secure_aggregation != "none" else
                  "the server adds the noise and sees the clipped updates (no secure "
                  "aggregation; --secure-aggregation secaggplus on the Flower engine "
                  "hides them)")}
    out: dict[str, Any] = {
        "method": method.name, "mechanism": "gaussian",
        "aggregation": "noise added once to the sum of the sampled clients' clipped "
                       "updates (central DP), divided by the expected count qN",
        "clipping": "l2 (each client)", "clip_bound": method.clip,
        "noise_scale": event.noise_scale, "sensitivity_l2": method.clip,
        "sensitivity_note": "sensitivity_l2 is each user's norm bound C: one user added "
                            "or removed moves the sum by at most C, one user's data "
                            "replaced by at most 2C (the accountant's REPLACE_ONE "
                            "neighbouring relation, which the epsilon_run values use)",
        "dimension": dimension, "epsilon_per_round": event.epsilon,
        "delta_per_round": event.delta, "coordinate_epsilon": None,
        "noised_parameters": list(parameters),
        "clients_per_round": clients_per_round, "client_fraction": client_fraction,
        "central": central, "clip_space": method.clip_space,
    }
    if method.clip_space == "news_vectors":
        out["clipping"] = ("l2 (each client) of [user-side gradient ; cotangents of the "
                           "news vectors of every news of the table] (clip_space "
                           "news_vectors)")
        out["aggregation"] = (
            "noise N(0, (z C)^2) on every coordinate of the sum of the clipped vectors "
            "(the user-side parameters and d per news of the table), divided by qN; the "
            "server turns the noised news-vector cotangents into the news-encoder "
            "gradient with one backward pass over the public table (post-processing)")
        out["dimension"] = None  # not D: the user side plus d per news of the table
        out["noised_parameters"] = [
            *(p for p in parameters if not p.startswith(NEWS_ENCODER_PREFIX)),
            "the cotangents of the news vectors (d per news of the table)"]
        out["clipped_vector"] = ("the user-side parameters + (news in the table) x d "
                                 "coordinates; the news encoder's "
                                 f"{sum(p.startswith(NEWS_ENCODER_PREFIX) for p in parameters)}"
                                 " parameters get their gradient from the noised "
                                 "cotangents by the server's backward pass")
    if method.adaptive is None:
        return out
    z_update, sigma_b = method.noise_split(max(1, clients_per_round))
    assert sigma_b is not None
    out.update(
        clipping="l2 (each client), adaptive: round t clips to C_t (server state, "
                 "logged per round as 'clip'); clip_bound is the initial C_0",
        noise_scale=event.noise_scale, sensitivity_l2=event.sensitivity)
    out["sends"] = ("clipped update and clip indicator b - 1/2, to the trusted "
                    "aggregator")
    out["central"]["trust"] = (
        "the server adds the noise and sees each client's clipped update and its clip "
        "indicator b - 1/2 (adaptive clipping runs on the simulator, without secure "
        "aggregation)")
    out["adaptive_clipping"] = {
        "paper": "Andrew, Thakkar, McMahan & Ramaswamy, NeurIPS 2021 (geometric update)",
        "target_quantile": method.adaptive.target_quantile,
        "clip_learning_rate": method.adaptive.learning_rate,
        "initial_clip": method.clip,
        "expected_clients_per_round": max(1, clients_per_round),
        "count_stddev": sigma_b,
        "count_stddev_default": method.adaptive.count_stddev is None,
        "update_noise_multiplier": z_update,
        "equivalent_noise_multiplier": equivalent_noise_multiplier(
            update_noise_multiplier=z_update, count_stddev=sigma_b),
        "update_noise": "N(0, (z_update * C_t)^2) on the sum of the clipped updates",
        "count_noise": "N(0, count_stddev^2) on the sum of the centred indicators "
                       "b - 1/2, b = 1[norm of the update <= C_t]",
        "split": "z^-2 = z_update^-2 + (2 count_stddev)^-2: the two sums are one "
                 "Gaussian release of noise multiplier z (each user's contribution, "
                 "divided by the noise scales, lies within 1/z of the origin), under "
                 "replacement and add/remove alike",
        "noise_units": "the event's noise_scale and sensitivity_l2 are in units of C_t",
        "clip_update": "C_t+1 = C_t * exp(-clip_learning_rate * (b - target_quantile)), "
                       "b = clamp(noised indicator sum / qN + 1/2, 0, 1): "
                       "post-processing, so the clip is public",
    }
    return out

def _secure_trust(method: CentralDP, dimension: int) -> dict[str, Any]:
    """The secure-aggregation block of ``describe``: protocol, threat model, noise
    placement with its dropout assumption, quantisation, and what the server learns."""
    k = method.max_dropouts
    per_share = math.erfc(TAIL_SIGMAS / math.sqrt(2))
    out: dict[str, Any] = {
        "secure_aggregation": "secaggplus (Flower's SecAgg+: pairwise and private masks "
                              "modulo M; every sampled client shares its secrets with "
                              "all the others)",
        "threat_model": f"honest-but-curious server colluding with fewer than n - {k} "
                        f"of the round's n clients: the server learns only the sum of "
                        f"the surviving clients' quantised vectors; each client's "
                        f"individual update stays hidden from it",
        "noise_placement": method.noise_placement,
        "max_dropouts": k,
        "reconstruction_threshold": f"n - {k} (all n clients hold shares)",
        "min_clients_per_round": min_clients(k),
        "rounds_below_min_clients": "no client is asked; the round releases the noise "
                                    "alone (central) or nothing (distributed)",
        "quantisation": "each coordinate rounded toward zero onto the grid of step "
                        "s = 2c/2^b (c >= C a power of two, b <= 24 bits with "
                        "n 2^b < 2^32 = SecAgg+'s largest modulus M): the L2 norm stays "
                        "<= C, so the sensitivity is C, exactly as accounted; the "
                        "modulus M > n 2^b rules out wraparound",
        "guarantee": "the ledger's epsilon is the sum's: against anyone who sees the "
                     "released models (and the noised sums) but not who was sampled",
    }
    if method.distributed:
        out["noise"] = (f"each of the n sampled clients adds N(0, (z C)^2/(n - {k})) "
                        f"before masking (OS CSPRNG, float-safe, on a device); the sum "
                        f"carries variance >= (z C)^2 when dropouts + clients colluding "
                        f"with the server <= {k} (SecAgg+'s threshold bounds the dropouts; "
                        f"a colluder's own share is known to the server)")
        out["total_variation_per_coordinate_and_client"] = per_share
        coordinates = (f"D = {dimension}" if method.clip_space == "parameters" else
                       "(D_U + P d) coordinates of the news-vector release")
        out["total_variation_bound_run"] = (
            f"eta <= {method.rounds} rounds x n clients x {coordinates} x "
            f"{per_share:.3g}: the run is (epsilon, delta + (1 + e^epsilon) eta)-DP")
        out["against_the_server"] = (
            "the server picks the sampled clients, so Poisson amplification does not "
            "hold against it: each round a user takes part in is the Gaussian "
            "mechanism with noise multiplier z on its own (sensitivity 2C under "
            f"replacement): epsilon {_epsilon_unsampled(method):.4g} at delta "
            f"{method.delta:g} per participation, composed over the participations "
            f"(epsilon_against_the_server)")
        expected = max(1, math.ceil(method.sampling_rate * method.rounds))
        out["epsilon_against_the_server"] = {
            "delta": method.delta,
            "per_participation": _epsilon_unsampled(method),
            "expected_participations": expected,
            "at_expected_participations": _epsilon_unsampled(method, expected),
            "if_sampled_every_round": _epsilon_unsampled(method, method.rounds),
            "note": "Gaussian mechanism with multiplier z per participation, composed "
                    "(PLD, one user's data replaced); the server decides how often a user "
                    "takes part: a device's budget bounds it"}
    else:
        out["noise"] = ("the server adds N(0, (z C)^2) to the decoded sum (OS CSPRNG, "
                        "float-safe, when deployed)")
        out["against_the_server"] = ("the server adds the noise: it knows the noiseless "
                                     "sum of the round's clipped updates (no individual "
                                     "update)")
    return out

def _epsilon_unsampled(method: CentralDP, rounds: int = 1) -> float:
    """ε at δ of ``rounds`` unsampled rounds (q = 1), replace-one: the guarantee against a
    server that knows who took part."""
    return central_epsilon(noise_multiplier=method.noise_multiplier, sampling_rate=1.0,
                           rounds=rounds, delta=method.delta)


__all__ = ["SIMULATION_TRUST", "central_dp_release", "release_description", "trust_model"]
