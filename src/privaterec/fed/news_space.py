"""Per-client clipping in news-vector space: DP-FedSGD with one shared news-encoder pass.

A ranking client's gradient (FedNewsRec Eq. 3, one step) has two parts:

* the user side g_U = ∂L_u/∂Θ_U (user encoder, PrivateRec's basis and attention), and
* the news-encoder part Σ_n J_nᵀ v_{u,n}, where r_n = Θ_N(x_n) is news n's vector,
  J_n = ∂r_n/∂Θ_N its Jacobian and v_{u,n} = ∂L_u/∂r_n the cotangent of r_n in the
  client's loss (summed over every position where n occurs in its history and candidates).

Clipping the parameter gradient needs one news-encoder backward pass per (client, news)
pair to get each client's norm (BENCHMARKS.md, "Central-DP round cost"). This module clips
the vector the news-encoder part is computed *from* instead:

    w_u = [g_U ; (v_{u,n})_{n ∈ P}] ∈ R^{D_U + |P|·d},   P = every row of the news table,

whose norm needs no news-encoder backward pass. The aggregator adds N(0, z²C²) to every
coordinate of Σ_u clip(w_u, C) (the Gaussian mechanism, L2 sensitivity C per user, as
DP-FedAvg) and turns the noised cotangents Ṽ ``[|P|, d]`` into the news-encoder gradient
with ONE backward pass over the public table, Σ_n J_nᵀ Ṽ_n: post-processing of the release
by public functions (θ is public, the news table is public), so it costs no ε.

The per-client work left is the user side only (``vmap`` over clients of the user encoder
on the already-encoded news vectors), so a round costs about one non-private round:
the news of the round encoded once without gradient, the user side per client, the
table encoded once with its backward pass.

On the Flower engine each device computes its own clip(w_u, C) (a round of one client) and
uploads it through SecAgg+ as one vector of D_U + |P|·d coordinates (:meth:`pack`), so the
server decodes the same clipped sum the simulator forms.

This is a different mechanism from parameter-space DP-FedAvg: one gradient per client
(FedSGD: a multi-step local update does not factor this way), a different clipping
geometry (‖g_U‖² + Σ_n ‖v_{u,n}‖² ≤ C² instead of ‖g‖ ≤ C), and noise on the cotangent of
every news of the table (mapped through the Jacobians) instead of on every parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import grad_and_value, vmap

from privaterec.fed.objective import ClientBatch, LocalObjective
from privaterec.models.recommender import Recommender
from privaterec.privacy.mechanisms import clip_factor

NEWS_ENCODER_PREFIX = "news_encoder."
"""θ's parameters whose names start with this are Θ_N (the rest: the user side Θ_U)."""

USER_SIDE_CHUNK = 128
"""Clients per ``vmap`` call of the user side: it runs on news vectors, not on words, so a
chunk needs far less memory than a per-client gradient through the news encoder."""


class _UserSideLoss(nn.Module):
    """One client's mean weighted InfoNCE from its news vectors: history ``[H, d]``, mask
    ``[H]``, candidates ``[n, 1 + k, d]`` (column 0 clicked), weights ``[n]``."""

    def __init__(self, recommender: Recommender) -> None:
        super().__init__()
        self.recommender = recommender

    def forward(self, history: torch.Tensor, mask: torch.Tensor, candidates: torch.Tensor,
                weights: torch.Tensor) -> torch.Tensor:
        user = self.recommender.encode_user(history[None], mask[None])[0]  # [d]
        logits = torch.einsum("d,scd->sc", user, candidates)
        losses = F.cross_entropy(logits, torch.zeros(logits.shape[0], dtype=torch.long,
                                                     device=logits.device),
                                 reduction="none")
        return (losses * weights).sum() / weights.sum().clamp_min(
            torch.finfo(weights.dtype).tiny)


class _EncodeRows(nn.Module):
    """Θ_N on news-table rows ``[n]`` → ``[n, d]`` (shares the recommender's names)."""

    def __init__(self, recommender: Recommender) -> None:
        super().__init__()
        self.recommender = recommender

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.recommender.encode_rows(rows, deduplicate=False)


@dataclass(frozen=True)
class NewsSpaceSum:
    """The clipped sums of one round, before noise.

    user: ``Tensor[D]``, Σ_u c_u g_U (zero on Θ_N's coordinates). news: ``Tensor[P, d]``,
    Σ_u c_u v_{u,n} per row n of the news table. norms: ``Tensor[m]``, ‖w_u‖ before
    clipping. losses: ``Tensor[m]``, each client's loss.
    """

    user: torch.Tensor
    news: torch.Tensor
    norms: torch.Tensor
    losses: torch.Tensor


class NewsSpaceClipping:
    """The per-client part of the mechanism on a :class:`LocalObjective`: a round's clients
    at once (the simulator) or one client (a device, whose upload is :meth:`pack`'s vector).

    Parameters
    ----------
    objective: the ranking task; its model's news table is the pool P (public).
    """

    def __init__(self, objective: LocalObjective) -> None:
        self.objective = objective
        model = objective.model
        if getattr(model.news_encoder, "encode_table", None) is not None:
            raise ValueError("clipping in news-vector space needs a news encoder that "
                             "encodes table rows directly (not the PLM encoder's table "
                             "cache)")
        self._user_loss = _UserSideLoss(model)
        self._encode = _EncodeRows(model)
        self.device = objective.device
        news = torch.cat([torch.full((n,), name.startswith(NEWS_ENCODER_PREFIX),
                                     device=self.device)
                          for name, n in zip(objective.parameter_names(),
                                             objective.spec.numels)])
        self.news_mask = news
        """``BoolTensor[D]``: Θ_N's coordinates of θ."""
        assert model.features is not None
        self.pool_size = len(model.features)
        self.dim = model.dim

    @property
    def release_dimension(self) -> int:
        """D_U + |P|·d, the coordinates of one client's clipped vector (and of the noise)."""
        return int((~self.news_mask).sum()) + self.pool_size * self.dim

    def pack(self, user: torch.Tensor, news: torch.Tensor) -> torch.Tensor:
        """The release vector ``Tensor[D_U + P·d]`` of (``user`` ``[D]``, read on Θ_U's
        coordinates; ``news`` ``[P, d]``): Θ_U's coordinates in θ's order, then the table's
        rows. One client's upload (a device under SecAgg+) and the noise share this layout."""
        return torch.cat([user[~self.news_mask], news.reshape(-1)])

    def unpack(self, vector: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(``Tensor[D]``: the user-side part on Θ_U's coordinates, 0 on Θ_N's;
        ``Tensor[P, d]``) of a release vector ``[D_U + P·d]`` (:meth:`pack`'s inverse)."""
        if vector.shape != (self.release_dimension,):
            raise ValueError(f"a news-vector release has {self.release_dimension} "
                             f"coordinates, got shape {tuple(vector.shape)}")
        user_coords = ~self.news_mask
        d_user = int(user_coords.sum())
        user = torch.zeros(user_coords.shape[0], dtype=vector.dtype, device=vector.device)
        user[user_coords] = vector[:d_user]
        return user, vector[d_user:].reshape(self.pool_size, self.dim)

    def _client_fn(self, flat: torch.Tensor, history: torch.Tensor, mask: torch.Tensor,
                   candidates: torch.Tensor, weights: torch.Tensor
                   ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        def loss(theta: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
            return self.objective._call(theta, h, mask, c, weights, module=self._user_loss)
        return grad_and_value(loss, argnums=(0, 1, 2))(flat, history, candidates)

    def clipped_sum(self, flat: torch.Tensor, batch: ClientBatch, *, clip: float,
                    chunk_clients: int = USER_SIDE_CHUNK) -> NewsSpaceSum:
        """Σ_u clip(w_u, C) of a round's clients (module docstring).

        Parameters
        ----------
        flat: θ ``[D]``. batch: the round's clients (m). clip: C (keyword).
        chunk_clients: clients per ``vmap`` call (memory: the user side of a chunk).
        """
        m = batch.num_clients
        device = flat.device
        user_total = torch.zeros_like(flat)
        news_total = torch.zeros(self.pool_size, self.dim, device=device)
        norms = torch.zeros(m, device=device)
        losses = torch.zeros(m, device=device)
        if m == 0:
            return NewsSpaceSum(user_total, news_total, norms, losses)
        real = batch.weights > 0
        used = torch.unique(torch.cat([batch.history.reshape(-1),
                                       batch.candidates[real].reshape(-1)])).to(device)
        with torch.no_grad():
            vectors = torch.zeros(self.pool_size, self.dim, device=device)
            vectors[used] = self.objective._call(flat, used, module=self._encode)
        per_client = vmap(self._client_fn, in_dims=(None, 0, 0, 0, 0))
        user_coords = ~self.news_mask
        for index, chunk in batch.chunks(chunk_clients):
            index, chunk = index.to(device), chunk.to(device)
            c, h = chunk.history.shape
            (g, v_hist, v_cand), loss = per_client(
                flat, vectors[chunk.history], chunk.history_mask, vectors[chunk.candidates],
                chunk.weights)
            g_user = g[:, user_coords]                                   # [c, D_U]
            rows = torch.cat([chunk.history, chunk.candidates.reshape(c, -1)], 1)  # [c, L]
            cot = torch.cat([v_hist, v_cand.reshape(c, -1, self.dim)], 1)          # [c, L, d]
            owner = torch.arange(c, device=device)[:, None].expand_as(rows)
            keys, inverse = torch.unique(owner * self.pool_size + rows, return_inverse=True)
            pair_v = torch.zeros(int(keys.shape[0]), self.dim, device=device).index_add_(
                0, inverse.reshape(-1), cot.reshape(-1, self.dim))        # [pairs, d]
            pair_owner = keys // self.pool_size
            pair_row = keys % self.pool_size
            # The norm in float64, then clip_l2's factor: exact norms ≤ C in float32.
            squared = (g_user.double() ** 2).sum(1).index_add_(
                0, pair_owner, (pair_v.double() ** 2).sum(1))
            norm = squared.sqrt()
            factor = clip_factor(norm, clip).to(g_user.dtype)           # [c]
            user_total[user_coords] += (factor[:, None] * g_user).sum(0)
            news_total.index_add_(0, pair_row, factor[pair_owner, None] * pair_v)
            norms[index] = norm.to(norms.dtype)
            losses[index] = loss.detach()
        return NewsSpaceSum(user_total, news_total, norms, losses)

    def news_encoder_gradient(self, flat: torch.Tensor, cotangents: torch.Tensor,
                              *, chunk_rows: int = 4096) -> torch.Tensor:
        """Σ_n J_nᵀ Ṽ_n ``Tensor[D]`` (zero outside Θ_N) for cotangents ``[P, d]``: one
        forward and backward pass of Θ_N over the news table, ``chunk_rows`` rows at a time
        (post-processing of the release: θ and the table are public)."""
        theta = flat.detach().requires_grad_(True)
        total = torch.zeros_like(flat)
        for lo in range(0, self.pool_size, chunk_rows):
            rows = torch.arange(lo, min(lo + chunk_rows, self.pool_size), device=flat.device)
            encoded = self.objective._call(theta, rows, module=self._encode)
            (g,) = torch.autograd.grad(encoded, theta, grad_outputs=cotangents[rows])
            total += g
        total[~self.news_mask] = 0.0
        return total

    def direction(self, flat: torch.Tensor, user: torch.Tensor,
                  news: torch.Tensor) -> torch.Tensor:
        """θ's direction ``Tensor[D]`` from (noised) sums: ``user`` on Θ_U's coordinates,
        the news-encoder gradient of ``news`` ``[P, d]`` on Θ_N's."""
        out = self.news_encoder_gradient(flat, news)
        out[~self.news_mask] = user[~self.news_mask]
        return out


__all__ = ["NEWS_ENCODER_PREFIX", "NewsSpaceClipping", "NewsSpaceSum", "USER_SIDE_CHUNK"]
