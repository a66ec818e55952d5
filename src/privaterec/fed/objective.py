"""The public model as a function of one flat parameter vector: losses and gradients.

A federated client trains the trainable parameters of the global
:class:`~privaterec.models.recommender.Recommender` (frozen pre-trained word vectors are
public and never uploaded). This module views those parameters as one flat vector
``θ ∈ R^D`` (:class:`ParamSpec`) and computes, with ``torch.func``:

* :meth:`LocalObjective.client_gradient`: one client's gradient ∇θ of its mean InfoNCE loss
  (FedNewsRec Eq. 3) — the reference every engine must reproduce;
* :meth:`LocalObjective.client_gradients`: the same for many clients at once,
  ``vmap(grad)`` over memory-bounded chunks of clients (docs/architecture.md#performance-design);
* :meth:`LocalObjective.round_gradient`: Σ_u (n_u/N) g_u, the weighted sum of the round's
  client gradients, with ONE backward pass (the gradient of the weighted sum of losses);
* :meth:`LocalObjective.local_deltas`: FedAvg's E local SGD steps per client, batched.

Client computations run the model in eval mode (no dropout), so a client update is a pure
function of (θ, data, generator): dropout would draw from torch's global generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import grad, grad_and_value

from privaterec.data.clients import ClientData, draw_candidates
from privaterec.fed.task import ModuleTask, ParamSpec, per_client_gradients
from privaterec.models.recommender import Recommender
from privaterec.privacy.dpa import relu_normalize
from privaterec.privacy.samplers import NoiseSource
from privaterec.runtime.device import module_device


class _RoundLoss(nn.Module):
    """Mean weighted InfoNCE of users ``[m, H]`` over samples ``[S, 1 + k]`` (column 0 clicked).

    With PrivateRec's basic vectors and ``attention_noise`` ``[m, B]`` the users' scoring
    vectors are ũ = Σ α̃ᵢ bᵢ with α̃ = relu_normalize(α + n) (Alg. 3 lines 14-15, 20; ReLU
    normalisation in training, §3.3); ``detach_attention`` treats α̃ as a constant input, so
    the gradient only follows the candidate path (docs/privacy.md#paper-and-strict-mode).
    """

    def __init__(self, recommender: Recommender) -> None:
        super().__init__()
        self.recommender = recommender

    def users(self, vectors: torch.Tensor, mask: torch.Tensor,
              attention_noise: torch.Tensor | None, detach_attention: bool,
              released_attention: bool = False) -> torch.Tensor:
        rec = self.recommender
        if rec.basis is None or attention_noise is None:
            return rec.encode_user(vectors, mask)
        alpha = rec.attention(vectors, mask)
        if released_attention:
            # ``attention_noise`` holds the released α̃ itself (a device's float-safe release):
            # the forward value is exactly α̃ ((α − α) + α̃ = α̃ in floating point) and the
            # gradient reaches α as through α + n.
            noisy = (alpha - alpha.detach()) + attention_noise
        else:
            noisy = alpha + attention_noise
        alpha = relu_normalize(noisy)
        if detach_attention:
            alpha = alpha.detach()
        return rec.basis.reconstruct(alpha)

    def forward(self, history: torch.Tensor, history_mask: torch.Tensor,
                candidates: torch.Tensor, sample_client: torch.Tensor, weights: torch.Tensor,
                deduplicate: bool, attention_noise: torch.Tensor | None = None,
                detach_attention: bool = False,
                released_attention: bool = False) -> torch.Tensor:
        m, h = history.shape
        s, c = candidates.shape
        rows = torch.cat([history.reshape(-1), candidates.reshape(-1)])
        vectors = self.recommender.encode_rows(rows, deduplicate=deduplicate)
        users = self.users(vectors[: m * h].reshape(m, h, -1), history_mask, attention_noise,
                           detach_attention, released_attention)
        news = vectors[m * h:].reshape(s, c, vectors.shape[-1])
        logits = torch.einsum("sd,scd->sc", users[sample_client], news)
        losses = F.cross_entropy(logits, torch.zeros(s, dtype=torch.long, device=logits.device),
                                 reduction="none")
        # A client without samples (every impression dropped by the label release) has
        # loss and gradient 0.
        return (losses * weights).sum() / weights.sum().clamp_min(torch.finfo(weights.dtype).tiny)


class _Attention(nn.Module):
    """α = attention(u) ``[m, B]`` of histories ``[m, H]`` (PrivateRec Alg. 2 line 7);
    shares the recommender (and so the parameter names) of :class:`_RoundLoss`."""

    def __init__(self, recommender: Recommender) -> None:
        super().__init__()
        self.recommender = recommender

    def forward(self, history: torch.Tensor, history_mask: torch.Tensor) -> torch.Tensor:
        rec = self.recommender
        assert rec.basis is not None
        m, h = history.shape
        vectors = rec.encode_rows(history.reshape(-1), deduplicate=False)
        return rec.attention(vectors.reshape(m, h, -1), history_mask)


@dataclass(frozen=True)
class ClientBatch:
    """Samples of m clients, padded to the largest client (padding has weight 0).

    history: ``LongTensor[m, H]``; history_mask: ``BoolTensor[m, H]``;
    candidates: ``LongTensor[m, n, 1 + k]`` (column 0 clicked); weights: ``Tensor[m, n]``
    (1 for a real sample, 0 for padding); attention_noise: PrivateRec's DPA noise
    ``Tensor[m, B]`` (``None`` for the other methods).
    """

    history: torch.Tensor
    history_mask: torch.Tensor
    candidates: torch.Tensor
    weights: torch.Tensor
    attention_noise: torch.Tensor | None = None

    @property
    def num_clients(self) -> int:
        return int(self.history.shape[0])

    def chunks(self, size: int) -> Iterator[tuple[torch.Tensor, "ClientBatch"]]:
        """Chunks of at most ``size`` clients, each trimmed to its own padding.

        Clients are grouped by their numbers of samples and history lengths (so little
        padding is computed) and every chunk drops the sample columns and the left history
        columns that none of its clients uses. Masked positions carry no weight in any user
        encoder, so trimming them does not change the result (beyond float rounding).
        Yields (``LongTensor`` indices of the chunk's clients in this batch, the chunk).
        """
        samples = (self.weights > 0).sum(1)
        lengths = self.history_mask.sum(1)
        # An empty history is encoded over all H anonymous positions (attend_all_if_empty).
        lengths = torch.where(lengths > 0, lengths, self.history.shape[1])
        order = torch.from_numpy(np.lexsort((lengths.numpy(), samples.numpy())))
        for lo in range(0, self.num_clients, size):
            idx = order[lo: lo + size]
            width = max(1, int(samples[idx].max()))
            hist = max(1, int(lengths[idx].max()))
            noise = None if self.attention_noise is None else self.attention_noise[idx]
            yield idx, ClientBatch(self.history[idx, -hist:], self.history_mask[idx, -hist:],
                                   self.candidates[idx, :width], self.weights[idx, :width],
                                   noise)

    def to(self, device: torch.device) -> "ClientBatch":
        """This batch on ``device`` (itself when it already is there)."""
        if self.history.device == device:
            return self
        noise = None if self.attention_noise is None else self.attention_noise.to(device)
        return ClientBatch(self.history.to(device), self.history_mask.to(device),
                           self.candidates.to(device), self.weights.to(device), noise)

    @classmethod
    def stack(cls, history: list[torch.Tensor], history_mask: list[torch.Tensor],
              candidates: list[torch.Tensor],
              attention_noise: list[torch.Tensor] | None = None) -> "ClientBatch":
        """Pad the per-client candidate tensors ``[n_u, 1 + k]`` to one batch.

        ``attention_noise``: optional per-client DPA noise ``[B]`` (PrivateRec).
        """
        width = max(1, max(c.shape[0] for c in candidates))
        cols = candidates[0].shape[1]
        padded = torch.zeros(len(candidates), width, cols, dtype=torch.long)
        weights = torch.zeros(len(candidates), width)
        for i, c in enumerate(candidates):
            padded[i, : c.shape[0]] = c
            weights[i, : c.shape[0]] = 1.0
        noise = None if attention_noise is None else torch.stack(attention_noise)
        return cls(torch.stack(history), torch.stack(history_mask), padded, weights, noise)


@dataclass(frozen=True)
class ClientInputs:
    """A ranking client's inputs to its gradient, after its random draws.

    history: ``LongTensor[H]`` (PrivateRec: padded positions hold row 0, the anonymous news
    r₀); history_mask: ``BoolTensor[H]``; candidates: ``LongTensor[n, 1 + k]`` with the
    (released) positive in column 0; attention_noise: PrivateRec's DPA noise ``[B]`` or None
    (None for PrivateRec on a secure source too: the device releases α̃ itself, float-safe,
    once α is computed; :mod:`privaterec.fed.methods.privaterec`).
    """

    history: torch.Tensor
    history_mask: torch.Tensor
    candidates: torch.Tensor
    attention_noise: torch.Tensor | None = None


def draw_samples(data: ClientData, *, max_samples: int, negatives: int,
                 noise: NoiseSource) -> tuple[torch.Tensor, torch.Tensor]:
    """A ranking client's draws: chosen sample indices ``[n]`` (at most ``max_samples``, a
    random subset when it has more) and their candidates ``[n, 1 + k]`` (k = ``negatives``
    non-clicked news per click), in this order on ``noise``."""
    n = data.num_samples
    if n > max_samples:
        chosen = noise.permutation(n)[: max_samples].sort().values
    else:
        chosen = torch.arange(n)
    return chosen, draw_candidates(data.positives[chosen], data.negatives[chosen],
                                   data.negative_counts[chosen], negatives=negatives,
                                   noise=noise)


class LocalObjective(ModuleTask):
    """Losses and gradients of the global model's trainable parameters θ ∈ R^D.

    Parameters
    ----------
    model:
        The global recommender with its news table attached. It is put in eval mode (no
        dropout, see the module docstring); its own parameters are the initial θ.
    """

    def __init__(self, model: Recommender) -> None:
        model.eval()
        model.prepare_news_table()  # before reading supports_vmap (PLM: needs the table)
        self.model = model
        self.device = module_device(model)
        """Where θ, the model and the round's computation live (the model's device)."""
        super().__init__(_RoundLoss(model), prefix="recommender")
        self._attention_module = _Attention(model)
        self.supports_vmap = bool(getattr(model.news_encoder, "supports_vmap", True))

    # -- parameters (θ's layout, parameters(), load(), parameter_names(): ModuleTask) ---------
    @property
    def basis_size(self) -> int:
        """B, the number of PrivateRec basic vectors of the model (0 without)."""
        basis = self.model.basis
        return 0 if basis is None else int(basis.size)

    def pretrained_mask(self) -> torch.Tensor:
        """``BoolTensor[D]``: the coordinates of θ fine-tuned from a pre-trained model."""
        pretrained = set(self.model.pretrained_parameter_names())
        return torch.cat([torch.full((n,), name in pretrained, device=self.device)
                          for name, n in zip(self.parameter_names(), self.spec.numels)])

    def public_state(self) -> dict[str, torch.Tensor]:
        """The model's tensors outside θ (frozen parameters and buffers)."""
        return self._model_public_state()

    # -- the task protocol (privaterec.fed.task.FederatedTask) --------------------------------
    def client_inputs(self, data: ClientData, *, max_samples: int, negatives: int,
                      noise: NoiseSource) -> ClientInputs:
        """A client's history and the candidates of its drawn samples (:func:`draw_samples`)."""
        _, candidates = draw_samples(data, max_samples=max_samples, negatives=negatives,
                                     noise=noise)
        return ClientInputs(data.history, data.history_mask, candidates)

    @staticmethod
    def batch(inputs: Sequence[ClientInputs], *,
              with_noise: bool = False) -> ClientBatch:
        """The clients' inputs padded to one :class:`ClientBatch` (``with_noise``: with
        their DPA noise)."""
        noise: list[torch.Tensor] | None = None
        if with_noise:
            noise = []
            for x in inputs:
                if x.attention_noise is None:
                    raise ValueError("a client's inputs carry no DPA noise (drawn on a secure "
                                     "source, which releases alpha itself): batch them "
                                     "without with_noise")
                noise.append(x.attention_noise)
        return ClientBatch.stack([x.history for x in inputs], [x.history_mask for x in inputs],
                                 [x.candidates for x in inputs], noise)

    def gradient(self, flat: torch.Tensor, inputs: ClientInputs) -> tuple[torch.Tensor, float]:
        """:meth:`client_gradient` of one client's inputs."""
        return self.client_gradient(flat, inputs.history, inputs.history_mask,
                                    inputs.candidates)

    def gradients(self, flat: torch.Tensor, inputs: Sequence[ClientInputs], *,
                  chunk_clients: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`client_gradients` of the clients' inputs."""
        return self.client_gradients(flat, self.batch(inputs), chunk_clients=chunk_clients)

    # -- losses ----------------------------------------------------------------------------
    def _client_loss(self, flat: torch.Tensor, history: torch.Tensor, mask: torch.Tensor,
                     candidates: torch.Tensor, weights: torch.Tensor,
                     attention_noise: torch.Tensor | None = None,
                     detach_attention: bool = False,
                     released_attention: bool = False) -> torch.Tensor:
        """One client's mean loss: history ``[H]``, mask ``[H]``, candidates ``[n, 1+k]``,
        optional DPA noise ``[B]`` (or, with ``released_attention``, the released α̃)."""
        owner = torch.zeros(candidates.shape[0], dtype=torch.long, device=candidates.device)
        noise = None if attention_noise is None else attention_noise[None]
        return self._call(flat, history[None], mask[None], candidates, owner, weights, False,
                          noise, detach_attention, released_attention)

    def attention(self, flat: torch.Tensor, history: torch.Tensor,
                  mask: torch.Tensor) -> torch.Tensor:
        """α ``[B]`` of one client's history ``[H]`` at θ = ``flat`` (no gradient): the value a
        device releases with DPA (PrivateRec Alg. 2 lines 6-9)."""
        keep = int(mask.sum()) or int(mask.shape[0])
        history, mask = history.to(self.device), mask.to(self.device)
        with torch.no_grad():
            alpha = self._call(flat, history[None, -keep:], mask[None, -keep:],
                               module=self._attention_module)
        return alpha[0]

    # -- gradients -------------------------------------------------------------------------
    def client_gradient(self, flat: torch.Tensor, history: torch.Tensor, mask: torch.Tensor,
                        candidates: torch.Tensor, *,
                        attention_noise: torch.Tensor | None = None,
                        split_history: bool = False,
                        released_attention: bool = False) -> tuple[torch.Tensor, float]:
        """∇θ of one client's mean InfoNCE loss (FedNewsRec Eq. 3) and the loss.

        Parameters
        ----------
        flat: θ ``[D]``. history: ``LongTensor[H]``. mask: ``BoolTensor[H]``.
        candidates: ``LongTensor[n, 1 + k]``, clicked news in column 0.
        attention_noise: PrivateRec's DPA noise ``[B]`` (the model needs basic vectors).
        split_history: return ``[2, D]``: the candidate-path gradient (α̃ held constant) and
            the history-path rest (PrivateRec strict mode, docs/privacy.md#paper-and-strict-mode).
        released_attention: ``attention_noise`` holds the released α̃ ``[B]`` instead of the
            noise (a device's float-safe release, :meth:`attention`); same gradient.

        Returns
        -------
        (``Tensor[D]`` or ``Tensor[2, D]``, loss)
        """
        history, mask = history.to(self.device), mask.to(self.device)
        candidates = candidates.to(self.device)
        if attention_noise is not None:
            attention_noise = attention_noise.to(self.device)
        weights = torch.ones(candidates.shape[0], device=self.device)
        # Left padding carries no weight (see ClientBatch.chunks), except in an empty history.
        keep = int(mask.sum()) or int(mask.shape[0])
        fn = self._split_grad if split_history else grad_and_value(self._client_loss)
        g, loss = fn(flat, history[-keep:], mask[-keep:], candidates, weights, attention_noise,
                     False, released_attention)
        return g, float(loss)

    def _split_grad(self, flat: torch.Tensor, history: torch.Tensor, mask: torch.Tensor,
                    candidates: torch.Tensor, weights: torch.Tensor,
                    attention_noise: torch.Tensor | None, detach_attention: bool = False,
                    released_attention: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``[2, D]``: (candidate-path gradient, history-path gradient) and the loss."""
        full, loss = grad_and_value(self._client_loss)(flat, history, mask, candidates,
                                                       weights, attention_noise, False,
                                                       released_attention)
        candidate_path = grad(self._client_loss)(flat, history, mask, candidates, weights,
                                                 attention_noise, True, released_attention)
        return torch.stack([candidate_path, full - candidate_path]), loss

    def client_gradients(self, flat: torch.Tensor, batch: ClientBatch, *,
                         chunk_clients: int = 16,
                         split_history: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-client gradients ``[m, D]`` (``[m, 2, D]`` with ``split_history``, see
        :meth:`client_gradient`) and losses ``[m]`` of a padded batch of clients.

        Batched with ``vmap(grad)`` over chunks of ``chunk_clients`` clients (memory bound:
        one chunk's activations); encoders whose ``supports_vmap`` is false (``plm`` with a
        fine-tuned MiniLM layer: a loop is as fast there, with less memory) take one
        :meth:`client_gradient` per client.
        """
        shape = (2, self.dimension) if split_history else (self.dimension,)
        fn = self._split_grad if split_history else grad_and_value(self._client_loss)
        return self._per_client(fn, flat, batch, chunk_clients, shape)

    def _per_client(self, fn: Callable[..., tuple[torch.Tensor, torch.Tensor]],
                    flat: torch.Tensor, batch: ClientBatch, chunk_clients: int,
                    shape: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``fn`` per client of ``batch`` (:func:`~privaterec.fed.task.per_client_gradients`
        over :meth:`ClientBatch.chunks`)."""
        noise_dim = None if batch.attention_noise is None else 0
        chunks = ((part, (chunk.history, chunk.history_mask, chunk.candidates, chunk.weights,
                          chunk.attention_noise))
                  for part, chunk in ((p, c.to(self.device))
                                      for p, c in batch.chunks(chunk_clients)))
        return per_client_gradients(fn, flat, chunks, num_clients=batch.num_clients,
                                    shape=shape, in_dims=(0, 0, 0, 0, noise_dim),
                                    vectorize=self.supports_vmap)

    def round_gradient(self, flat: torch.Tensor, batch: ClientBatch, *,
                       uniform_clients: bool = False) -> tuple[torch.Tensor, float]:
        """Σ_u (n_u/N) g_u and the mean loss, with one backward pass
        (docs/architecture.md#performance-design).

        The weighted sum of client gradients, weights n_u/N (FedNewsRec Eq. 6), is the
        gradient of the mean loss over all the round's samples, so the round costs one
        forward and one backward over its samples; the news of the round are encoded once.
        Per-client inputs (PrivateRec's padded histories, DPA noise, released labels) are
        part of the batch, so PrivateRec's paper mode also takes this path.

        ``uniform_clients``: (1/m) Σ_u g_u instead (a private method's server weighs every
        client equally; a client without samples contributes 0): each sample is weighted
        1/n_u.
        """
        batch = batch.to(self.device)
        real = batch.weights > 0
        sample_client = torch.arange(batch.num_clients,
                                     device=self.device)[:, None].expand_as(real)[real]
        candidates = batch.candidates[real]
        if candidates.shape[0] == 0:
            return torch.zeros_like(flat), 0.0
        weights = torch.ones(candidates.shape[0], device=self.device)
        scale = 1.0
        if uniform_clients:
            per_client = real.sum(1)
            weights = 1.0 / per_client[sample_client].float()
            scale = int((per_client > 0).sum()) / batch.num_clients
        flat = flat.detach().requires_grad_(True)
        loss = self._call(flat, batch.history, batch.history_mask, candidates, sample_client,
                          weights, True, batch.attention_noise, False)
        (g,) = torch.autograd.grad(loss, flat)
        return (g * scale if scale != 1.0 else g), float(loss.detach())

    def local_deltas(self, flat: torch.Tensor, batch: ClientBatch, *, steps: int, lr: float,
                     chunk_clients: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
        """FedAvg's client work: E = ``steps`` full-batch SGD steps at ``lr`` per client.

        Returns the pseudo-gradients θ − θ_u^(E) ``[m, D]`` (so a server step subtracts them,
        McMahan et al. 2017; Reddi et al. 2020 Alg. 2) and the clients' losses before the
        first step ``[m]``.
        """
        def local(theta: torch.Tensor, history: torch.Tensor, mask: torch.Tensor,
                  candidates: torch.Tensor, weights: torch.Tensor,
                  attention_noise: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
            start = theta
            first_loss = torch.zeros((), device=theta.device)
            for step in range(steps):
                g, loss = grad_and_value(self._client_loss)(theta, history, mask, candidates,
                                                            weights, attention_noise)
                if step == 0:
                    first_loss = loss
                theta = theta - lr * g
            return start - theta, first_loss

        return self._per_client(local, flat, batch, chunk_clients, (self.dimension,))


__all__ = ["ClientBatch", "ClientInputs", "LocalObjective", "ParamSpec", "draw_samples"]
