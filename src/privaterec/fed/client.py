"""The client update: the one function that computes what a device uploads (DESIGN §2).

``client_update(objective, θ, client data, method, generator)`` → :class:`ClientUpdate`.
The vectorized simulator computes exactly this for many clients at once (same generator
use, batched gradients) and the Flower ClientApp calls it directly on the device.

A client's generator is used in a fixed order: (1) choose at most ``max_samples`` of its
samples, (2) draw k non-clicked candidates per sample, (3) draw its noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from privaterec.data.clients import ClientData, draw_candidates
from privaterec.fed.methods import ClientMethod, privatize
from privaterec.fed.objective import ClientBatch, LocalObjective
from privaterec.privacy.ledger import PrivacyEvent


@dataclass(frozen=True)
class ClientUpdate:
    """What one client uploads in one round, and what it spent.

    Attributes
    ----------
    payload: ``Tensor[D]``: the clipped/noised gradient (FedSGD) or pseudo-gradient θ − θ_u
        (FedAvg, E > 1). Strategies subtract it.
    num_examples: |B_u|, the number of samples used (the aggregation weight, Eq. 6).
    privacy_events: the releases this upload spent (for the user's ledger).
    metrics: e.g. ``{"loss": mean loss before the update}``.
    """

    payload: torch.Tensor
    num_examples: int
    privacy_events: tuple[PrivacyEvent, ...]
    metrics: dict[str, Any] = field(default_factory=dict)


def client_candidates(data: ClientData, method: ClientMethod, *,
                      generator: torch.Generator) -> torch.Tensor:
    """Steps (1)-(2) of a client round: its samples' candidates ``LongTensor[n, 1 + k]``.

    A client with more than ``method.max_samples`` samples uses a random subset of that size.
    """
    n = data.num_samples
    if n > method.max_samples:
        chosen = torch.randperm(n, generator=generator)[: method.max_samples].sort().values
    else:
        chosen = torch.arange(n)
    return draw_candidates(data.positives[chosen], data.negatives[chosen],
                           data.negative_counts[chosen], negatives=method.negatives,
                           generator=generator)


def client_update(objective: LocalObjective, params: torch.Tensor, data: ClientData,
                  method: ClientMethod, *, generator: torch.Generator) -> ClientUpdate:
    """One client's round (FedNewsRec Eq. 3-5; PrivateRec Alg. 3 without DPA/DPL).

    Parameters
    ----------
    objective:
        The public model architecture (:class:`LocalObjective`).
    params:
        The global θ ``Tensor[D]`` received from the server.
    data:
        The client's own history and samples (never leaves the device).
    method:
        Clipping, noise and local-training settings.
    generator:
        The client's only source of randomness.

    Raises
    ------
    ValueError
        If the client has no training sample.
    """
    if data.num_samples == 0:
        raise ValueError(f"client {data.user_id!r} has no training sample")
    candidates = client_candidates(data, method, generator=generator)
    if method.local_steps == 1:
        grad, loss = objective.client_gradient(params, data.history, data.history_mask,
                                               candidates)
        update = grad[None]
    else:
        batch = ClientBatch.stack([data.history], [data.history_mask], [candidates])
        update, losses = objective.local_deltas(params, batch, steps=method.local_steps,
                                                lr=method.local_lr)
        loss = float(losses[0])
    released, event = privatize(update, method, [generator])
    return ClientUpdate(payload=released[0], num_examples=int(candidates.shape[0]),
                        privacy_events=(event,), metrics={"loss": loss})
