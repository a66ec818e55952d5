"""The client update: the one function that computes what a device uploads
(docs/architecture.md#seams).

``client_update(task, θ, client data, method, noise)`` → :class:`ClientUpdate`. The
vectorized simulator computes exactly this for many clients at once (same draws,
batched gradients) and the Flower ClientApp calls it directly on the device.

A client's noise source is drawn from in a fixed order: first its method's draws of its inputs
(:meth:`~privaterec.fed.methods.base.ClientMethod.inputs`: which samples, which negatives;
PrivateRec also its padding, its DPA noise and its label release), last the noise on its
update (:meth:`~privaterec.fed.methods.base.ClientMethod.privatize`).

What a client sends (:meth:`ClientUpdate.sent`) is its released update only, for every
private method: its loss and its number of samples are private data (an unaccounted release)
and the server weighs every client's update equally. Only a method whose upload is not
private anyway (``fedrec``) also sends them (FedNewsRec Eq. 6's weights).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from privaterec.data.clients import ClientData
from privaterec.fed.methods.base import ClientMethod
from privaterec.fed.objective import draw_samples
from privaterec.fed.task import FederatedTask
from privaterec.fed.update import ClientUpdate
from privaterec.privacy.samplers import NoiseSource


def client_candidates(data: ClientData, method: ClientMethod, *,
                      noise: NoiseSource) -> torch.Tensor:
    """A ranking client's first draws: its samples' candidates ``LongTensor[n, 1 + k]``.

    A client with more than ``method.max_samples`` samples uses a random subset of that size.
    """
    return draw_samples(data, max_samples=method.max_samples, negatives=method.negatives,
                        noise=noise)[1]


def client_update(task: FederatedTask[Any], params: torch.Tensor, data: ClientData,
                  method: ClientMethod, *, noise: NoiseSource) -> ClientUpdate:
    """One client's round (FedNewsRec Eq. 3-5; DP-FedRec; PrivateRec Alg. 3 lines 14-21;
    Uni-FedRec §3.5): its inputs, its update, what it sends and spends.

    Parameters
    ----------
    task:
        The public model (:class:`~privaterec.fed.task.FederatedTask`).
    params:
        The global θ ``Tensor[D]`` received from the server.
    data:
        The client's own history and samples (never leaves the device).
    method:
        What the client does (:class:`~privaterec.fed.methods.base.ClientMethod`).
    noise:
        The client's only source of randomness: its seeded generator in simulation, or on a
        real device a secure source (:class:`~privaterec.privacy.samplers.SecureNoise`: OS
        CSPRNG, float-safe releases).

    A sampled client without a training sample (every method samples from the roster)
    sends :meth:`~privaterec.fed.methods.base.ClientMethod.idle_release`: a noised zero
    update of the same shape, with the same privacy events and no sample.

    Raises
    ------
    ValueError
        If the client has no training sample and the method samples only users who have
        one.
    """
    if not method.has_update(data):
        payload = method.idle_release(task.dimension, [noise])[0].to(params.device)
        return ClientUpdate(payload=payload, num_examples=0,
                            privacy_events=method.events(task.dimension),
                            metrics={"loss": math.nan}, weight=method.aggregation_weight(0),
                            sends_metadata=method.sends_metadata)
    inputs = method.inputs(task, data, noise=noise)
    n = method.num_examples(inputs)
    payload, loss, reports = method.release(task, params, inputs, noise=noise)
    return ClientUpdate(payload=payload, num_examples=n,
                        privacy_events=method.events(task.dimension), metrics={"loss": loss},
                        weight=method.aggregation_weight(n),
                        sends_metadata=method.sends_metadata, reports=reports)


__all__ = ["ClientUpdate", "client_candidates", "client_update"]
