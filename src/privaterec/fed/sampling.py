"""Who takes part in a round: the roster, the eligible users and the round's sample
(docs/architecture.md#seams).

In a simulation, client sampling of round t is a function of (seed, t) only
(:func:`~privaterec.fed.rng.round_noise`), so a resumed run and every engine sample the
same clients. A deployed server passes ``source`` (the OS CSPRNG,
:class:`~privaterec.privacy.samplers.SecureNoise`): whoever knows the run's seed (it is in the
public ``config.yaml``)
must not be able to tell who was sampled, or central DP's amplification by sampling would not
hold against them.
"""

from __future__ import annotations

import torch

from privaterec.config import FedConfig
from privaterec.data.clients import ClientDataset
from privaterec.fed.rng import round_noise
from privaterec.privacy.samplers import NoiseSource


def roster(clients: ClientDataset) -> torch.Tensor:
    """Indices of every enrolled user ``LongTensor[U]``, whatever their data: the population
    rounds sample from, so that who takes part does not depend on anyone's clicks."""
    return torch.arange(clients.num_users)


def eligible_clients(clients: ClientDataset, *, by_impressions: bool = False) -> torch.Tensor:
    """Indices of the users with at least one training sample.

    ``by_impressions`` (PrivateRec): with at least one labelled impression instead, whatever
    its clicks — who takes part must not depend on the clicks the label release protects.
    """
    counts = clients.impressions_per_user() if by_impressions else clients.samples_per_user()
    return torch.nonzero(counts > 0).flatten()


def clients_per_round(fed: FedConfig, num_eligible: int) -> int:
    """m = ``clients_per_round`` or max(1, round(r · users)), at most the number of users."""
    if fed.clients_per_round is not None:
        return min(fed.clients_per_round, num_eligible)
    assert fed.client_fraction is not None, "resolve the FedConfig first"
    return max(1, min(num_eligible, round(fed.client_fraction * num_eligible)))


def poisson_round(eligible: torch.Tensor, q: float, *, seed: int, round_index: int,
                  source: NoiseSource | None = None) -> list[int]:
    """Each eligible user independently with probability q (DP-FedAvg's Poisson sampling);
    the number of clients varies from round to round.

    Seeded by (seed, round) in a simulation; with ``source`` (a deployed server's OS CSPRNG)
    the uniforms are ``source.uniform`` (j·2^−53 for 53 random bits j, so each user is
    taken with probability ⌈q·2^53⌉/2^53, q to within 2^−53).
    """
    noise = round_noise(seed, round_index) if source is None else source
    u = noise.uniform([len(eligible)])
    return sorted(int(x) for x in eligible[u < q])


def sample_round(eligible: torch.Tensor, m: int, *, seed: int, round_index: int,
                 source: NoiseSource | None = None) -> list[int]:
    """m distinct clients for round ``round_index`` (without replacement), sorted: seeded in
    a simulation, a uniformly random permutation from ``source`` (the OS CSPRNG) when
    deployed."""
    noise = round_noise(seed, round_index) if source is None else source
    order = noise.permutation(len(eligible))
    return sorted(int(u) for u in eligible[order[:m]])


__all__ = ["clients_per_round", "eligible_clients", "poisson_round", "roster", "sample_round"]
