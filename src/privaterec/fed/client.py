"""The client update: the one function that computes what a device uploads (DESIGN §2).

``client_update(objective, θ, client data, method, generator)`` → :class:`ClientUpdate`.
The vectorized simulator computes exactly this for many clients at once (same generator
use, batched gradients) and the Flower ClientApp calls it directly on the device.

A client's generator is used in a fixed order: (1) choose at most ``max_samples`` of its
samples, (2) draw k non-clicked candidates per sample; PrivateRec (Alg. 2-3) instead chooses
at most ``max_samples`` of its impressions and then draws (3) the behaviour padding of its
history, (4) the DPA noise on α, (5) the label release of its impressions
(:mod:`privaterec.privacy.labels`: candidates drawn blind to the clicks, randomized response
on which was clicked); last (6) the noise on its gradient (FedNewsRec, DP-FedRec, PrivateRec
strict).

What a client sends (:meth:`ClientUpdate.sent`) is its released update only, for every
private method: its loss and its number of samples are private data (an unaccounted release)
and the server weighs every client's update equally. Only ``fedrec``, which releases its raw
gradient anyway, also sends them (FedNewsRec Eq. 6's weights).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from privaterec.data.clients import ClientData, draw_candidates
from privaterec.errors import ConfigError
from privaterec.fed.methods import ClientMethod, privatize, privatize_history
from privaterec.fed.objective import ClientBatch, LocalObjective
from privaterec.privacy.dpa import dpa_noise, pad_history, padding_mask, permute_columns
from privaterec.privacy.labels import release_labels
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.randomness import (Randomness, as_source, is_secure, randperm,
                                          seeded_generator)


@dataclass(frozen=True)
class ClientUpdate:
    """What one client uploads in one round, and what it spent.

    Attributes
    ----------
    payload: ``Tensor[D]``: the clipped/noised gradient (FedSGD) or pseudo-gradient θ − θ_u
        (FedAvg, E > 1). Strategies subtract it.
    num_examples: |B_u|, the number of samples used (kept on the device by private methods).
    privacy_events: the releases this upload spent (for the user's ledger; a function of the
        public run configuration only, the same for every client and round).
    metrics: e.g. ``{"loss": mean loss before the update}`` (kept on the device by private
        methods; the simulator logs it as a simulation-only diagnostic).
    weight: the update's weight in the server's mean (``num_examples`` for ``fedrec``, else 1;
        :meth:`~privaterec.fed.methods.ClientMethod.aggregation_weight`).
    sends_metadata: whether ``num_examples`` and the loss are part of what the client sends.
    """

    payload: torch.Tensor
    num_examples: int
    privacy_events: tuple[PrivacyEvent, ...]
    metrics: dict[str, Any] = field(default_factory=dict)
    weight: float = 1.0
    sends_metadata: bool = False

    def sent(self) -> dict[str, Any]:
        """Everything the client transmits to the server (besides its public events).

        ``{"payload": Tensor[D]}``, plus ``num_examples`` and ``loss`` for a method that sends
        metadata (``fedrec``). The Flower ClientApp sends exactly this; the end-to-end
        privacy audit distinguishes neighbours on exactly this.
        """
        out: dict[str, Any] = {"payload": self.payload}
        if self.sends_metadata:
            out["num_examples"] = self.num_examples
            out["loss"] = float(self.metrics["loss"])
        return out


def _draw_samples(data: ClientData, method: ClientMethod, *,
                  generator: Randomness) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps (1)-(2): chosen sample indices ``[n]`` and their candidates ``[n, 1 + k]``."""
    n = data.num_samples
    if n > method.max_samples:
        chosen = randperm(generator, n)[: method.max_samples].sort().values
    else:
        chosen = torch.arange(n)
    return chosen, draw_candidates(data.positives[chosen], data.negatives[chosen],
                                   data.negative_counts[chosen], negatives=method.negatives,
                                   generator=generator)


def client_candidates(data: ClientData, method: ClientMethod, *,
                      generator: Randomness) -> torch.Tensor:
    """Steps (1)-(2) of a client round: its samples' candidates ``LongTensor[n, 1 + k]``.

    A client with more than ``method.max_samples`` samples uses a random subset of that size.
    """
    return _draw_samples(data, method, generator=generator)[1]


@dataclass(frozen=True)
class ClientInputs:
    """A client's inputs to its gradient after steps (1)-(5) of the module docstring.

    history: ``LongTensor[H]`` (PrivateRec: padded positions hold row 0, the anonymous news
    r₀); history_mask: ``BoolTensor[H]``; candidates: ``LongTensor[n, 1 + k]`` with the
    released positive in column 0; attention_noise: DPA noise ``[B]`` or None (None for
    PrivateRec on a secure source too: the device releases α̃ itself, float-safe, once α is
    computed: :func:`client_update`).
    """

    history: torch.Tensor
    history_mask: torch.Tensor
    candidates: torch.Tensor
    attention_noise: torch.Tensor | None = None


def client_inputs(data: ClientData, method: ClientMethod, *, basis_size: int,
                  generator: Randomness) -> ClientInputs:
    """Steps (1)-(5) of a client round (PrivateRec Alg. 2 lines 2-5 and 9, Alg. 3 16-18).

    Parameters
    ----------
    data: the client's data. method: the resolved client method.
    basis_size: B of the model (PrivateRec; ignored by the other methods).
    generator: the client's generator, or its device's secure source.
    """
    if not method.is_privaterec:
        _, candidates = _draw_samples(data, method, generator=generator)
        return ClientInputs(data.history, data.history_mask, candidates)
    if basis_size < 1:
        raise ConfigError("privaterec needs a model with basic vectors (ModelConfig."
                          "basis_size >= 1; resolve_run_config sets 5)")
    rows, clicks, counts = data.impressions()
    n = rows.shape[0]
    if n > method.max_samples:
        chosen = randperm(generator, n)[: method.max_samples].sort().values
        rows, clicks, counts = rows[chosen], clicks[chosen], counts[chosen]
    pad = padding_mask(data.history_mask, padding_p=method.padding_p, generator=generator)
    history = pad_history(data.history, pad)
    noise: torch.Tensor | None = None
    if not is_secure(generator):
        noise = dpa_noise((1, basis_size), method.dpa_calibration(),
                          generator=seeded_generator(generator))[0]
    size = method.label_candidates
    positions, released = release_labels(clicks, counts, size=size, epsilon=method.epsilon,
                                         generator=generator)
    keep = released < size
    candidates = permute_columns(rows.gather(1, positions)[keep], released[keep])
    return ClientInputs(history, data.history_mask, candidates, noise)


def _released_attention(objective: LocalObjective, params: torch.Tensor,
                        inputs: ClientInputs, method: ClientMethod,
                        source: Randomness) -> torch.Tensor:
    """A device's float-safe DPA release α̃ = α + noise ``[B]`` (Alg. 2 lines 6-9), drawn from
    its secure source at the calibration of the method's DPA event."""
    alpha = objective.attention(params, inputs.history, inputs.history_mask)
    scale = method.dpa_calibration().scale
    noise = as_source(source)
    if method.noise == "gaussian":
        return noise.release_gaussian(alpha, sigma=scale)
    return noise.release_laplace(alpha, scale=scale)


def client_update(objective: LocalObjective, params: torch.Tensor, data: ClientData,
                  method: ClientMethod, *, generator: Randomness) -> ClientUpdate:
    """One client's round (FedNewsRec Eq. 3-5; DP-FedRec; PrivateRec Alg. 3 lines 14-21).

    PrivateRec uploads the gradient of the loss on ũ = Σ α̃ᵢ bᵢ (raw in paper mode; in strict
    mode the history-path part clipped and noised, DESIGN §4 erratum 4).

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
        The client's only source of randomness: its seeded generator in simulation, or on a
        real device a secure source (:class:`~privaterec.privacy.samplers.SecureNoise`: OS
        CSPRNG, float-safe releases; :mod:`privaterec.privacy.randomness`).

    Raises
    ------
    ValueError
        If the client has no training sample.
    """
    if method.is_privaterec:
        if data.impressions()[0].shape[0] == 0:
            raise ValueError(f"client {data.user_id!r} has no labelled impression")
    elif data.num_samples == 0:
        raise ValueError(f"client {data.user_id!r} has no training sample")
    inputs = client_inputs(data, method, basis_size=objective.basis_size, generator=generator)
    candidates = inputs.candidates
    n = int(candidates.shape[0])
    common = dict(num_examples=n, weight=method.aggregation_weight(n),
                  sends_metadata=method.sends_metadata)
    if method.is_privaterec:
        # A client whose label release dropped every impression computes a zero gradient
        # (and, in strict mode, still releases the noised history part): its upload has the
        # same form as anyone's.
        strict = method.privacy_mode == "strict"
        released = inputs.attention_noise is None
        attention = (_released_attention(objective, params, inputs, method, generator)
                     if released else inputs.attention_noise)
        grad, loss = objective.client_gradient(params, inputs.history, inputs.history_mask,
                                               candidates, attention_noise=attention,
                                               split_history=strict,
                                               released_attention=released)
        events = method.events(objective.dimension)
        if not strict:
            return ClientUpdate(payload=grad, privacy_events=events, metrics={"loss": loss},
                                **common)
        noised, _ = privatize_history(grad[1][None], method, [generator])
        return ClientUpdate(payload=grad[0] + noised[0], privacy_events=events,
                            metrics={"loss": loss}, **common)
    if method.local_steps == 1:
        grad, loss = objective.client_gradient(params, inputs.history, inputs.history_mask,
                                               candidates)
        update = grad[None]
    else:
        batch = ClientBatch.stack([inputs.history], [inputs.history_mask], [candidates])
        update, losses = objective.local_deltas(params, batch, steps=method.local_steps,
                                                lr=method.local_lr)
        loss = float(losses[0])
    released, event = privatize(update, method, [generator])
    # Central DP: the clipped update goes to the trusted aggregator; the round's release is
    # the noised sum, recorded for the whole population (method.central_event()).
    events = method.events(objective.dimension) if method.is_central else (event,)
    return ClientUpdate(payload=released[0], privacy_events=events, metrics={"loss": loss},
                        **common)
