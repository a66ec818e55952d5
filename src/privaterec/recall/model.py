"""The Uni-FedRec privacy-preserving recall model (Uni-FedRec §3.2, §3.4).

Client side, for one user with clicked-news vectors h₁ … h_H (from the ranking model's news
encoder, §3.3 footnote 3):

1. global self-attention: g = MHSA(h) (Vaswani et al. 2017; no output projection, as NRMS);
2. interest channels ℋ₁ … ℋ_C: hierarchical clustering of g (:mod:`.channels`), quotas
   qᵢ = |ℋᵢ|/Σ|ℋⱼ| (Eq. 4);
3. cluster-wise attention (Eq. 1): rᵢ = Σⱼ γⱼ gⱼ over j ∈ ℋᵢ, γ = softmax(Att(g)), Att a
   two-layer dense network (:class:`~privaterec.models.layers.AdditiveAttention`, hidden 128),
   shared by all channels as in the official code;
4. decomposer / perturbation / aggregator (:mod:`.interest`, Eq. 2-3): αᵢ = softmax(f_δ(rᵢ·eᵏ)
   + Laplace(λ_I)), r̂ᵢ = Σⱼ αᵢⱼ eᵛⱼ.

Training (Eq. 5-6, docs/privacy.md#uni-fedrec-channels-and-quotas): unified score z = Σᵢ qᵢ (d ·
r̂ᵢ) of a candidate news vector d, loss InfoNCE over 1 clicked + K_r = 4 non-clicked news (Eq. 6 as
printed lacks the −log; :func:`info_nce` is the standard loss). Noise in training is optional (pass
the score noise as an input); it is a regulariser there — what a client uploads during training is
its gradient, whose privacy is the federated engine's business.

The model draws no privacy noise and emits no privacy event: noise enters as an input
(``score_noise``), and a query's protected upload, its noise and its events are released
around the model by :func:`privaterec.recall.query.release_query`.

Shapes: b users, H history positions (right-aligned, left-padded; ``mask`` True for real
clicks), d news size, M = ``max_channels`` channel slots, B basic interests, K candidates.
Channel slots beyond a user's C have quota 0. Clustering is not differentiable and runs on
detached vectors with numpy/scipy, one user at a time (:meth:`UniFedRecRecall.channels`);
:meth:`UniFedRecRecall.forward` takes its result as tensors, so a forward pass with given
channels is ``torch.func`` friendly (vmap/grad over users) and rows never interact.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privaterec.errors import ConfigError
from privaterec.validators import check_in
from privaterec.models.layers import AdditiveAttention, MultiHeadSelfAttention, attend_all_if_empty
from privaterec.recall.channels import (DEFAULT_DISTANCE_THRESHOLD, MAX_CHANNELS, ChannelBatch,
                                        ClusterOptions, Overflow, cluster_batch,
                                        cluster_options)
from privaterec.recall.interest import (DEFAULT_CLIP, DEFAULT_NOISE_SCALE, DEFAULT_NUM_BASIS,
                                        BasicInterestEmbeddings, aggregator_weights,
                                        perturb_scores)

NUM_NEGATIVES = 4
"""K_r, non-clicked news per clicked one in the recall loss (Uni-FedRec §4.1)."""


def unified_score(protected: Tensor, quotas: Tensor, candidates: Tensor) -> Tensor:
    """z = Σᵢ qᵢ (d · r̂ᵢ) (Uni-FedRec Eq. 5).

    Parameters
    ----------
    protected:
        ``Tensor[b, M, d]`` protected interests r̂.
    quotas:
        ``Tensor[b, M]`` (0 for unused slots).
    candidates:
        ``Tensor[b, K, d]`` candidate news vectors.

    Returns
    -------
    ``Tensor[b, K]``.
    """
    per_channel = torch.einsum("...md,...kd->...mk", protected, candidates)
    return torch.einsum("...m,...mk->...k", quotas, per_channel)


def info_nce(logits: Tensor, target: Tensor | None = None, *,
             reduction: Literal["mean", "sum", "none"] = "mean") -> Tensor:
    """InfoNCE loss −log softmax(z)[positive] (Oord et al. 2018;
    docs/privacy.md#uni-fedrec-channels-and-quotas).

    Parameters
    ----------
    logits:
        ``Tensor[b, 1 + K_r]`` unified scores.
    target:
        ``LongTensor[b]`` index of the clicked news (default: column 0).
    reduction:
        ``"mean"`` (default, as the package's objective), ``"sum"`` (Eq. 6's Σ over
        behaviours) or ``"none"`` (``Tensor[b]``).
    """
    if target is None:
        target = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    return F.cross_entropy(logits, target, reduction=reduction)


class UniFedRecRecall(nn.Module):
    """Uni-FedRec recall model Θ_r (user side + basic interest embeddings).

    Parameters
    ----------
    dim:
        d, size of news vectors (paper 256); must equal ``num_heads * head_dim``.
    num_heads, head_dim:
        Global self-attention heads (paper 16 × 16).
    attention_dim:
        Hidden size of the cluster-wise attention network (paper 128).
    num_basis:
        B basic interest embeddings (paper 30), of size ``dim``.
    clip:
        δ of Eq. 2 (paper 0.2), applied in every forward pass; ``None`` disables clipping
        (the official code trains without it; serving then needs it, see
        :meth:`query_scores`).
    noise_scale:
        λ_I of Eq. 2 (paper 1.2): the scale of the score noise the query release
        (:func:`privaterec.recall.query.release_query`) and noisy training draw.
    max_channels:
        M, the maximum number of channels (default 5).
    distance_threshold, method, metric, overflow:
        Clustering parameters (:func:`~privaterec.recall.channels.cluster_history`).
    aggregator_scale:
        Learn a public scale s > 0 of the aggregator: αᵢ = softmax(s·âᵢ) instead of
        softmax(âᵢ) (Eq. 3). It is applied on the device after the noise, so it is
        post-processing of the release (same ε); it lets the clipped scores, which lie in
        [−δ, δ], express sharper weights than e^{2δ} between two basic interests.
    use_bie:
        ``False`` builds the no-BIE ablation (Uni-FedRec Table 3): the unified score uses the
        channel interests rᵢ directly (no decomposer, perturbation or aggregator), so the
        model is trained for exact d-dim search of rᵢ.
    """

    def __init__(self, dim: int = 256, *, num_heads: int = 16, head_dim: int = 16,
                 attention_dim: int = 128, num_basis: int = DEFAULT_NUM_BASIS,
                 clip: float | None = DEFAULT_CLIP, noise_scale: float = DEFAULT_NOISE_SCALE,
                 max_channels: int = MAX_CHANNELS,
                 distance_threshold: float = DEFAULT_DISTANCE_THRESHOLD,
                 method: str = "average", metric: str = "cosine",
                 overflow: Overflow = "merge", use_bie: bool = True,
                 aggregator_scale: bool = False) -> None:
        super().__init__()
        self.use_bie = bool(use_bie)
        self.log_scale = nn.Parameter(torch.zeros(())) if aggregator_scale else None
        if num_heads * head_dim != dim:
            raise ConfigError(f"num_heads * head_dim = {num_heads * head_dim} must equal the "
                              f"news vector size dim = {dim}")
        if clip is not None:
            check_in(clip, "clip", 0, math.inf, "> 0 or None", open_low=True, open_high=False)
        check_in(noise_scale, "noise_scale", 0, math.inf, ">= 0", open_high=False)
        options = cluster_options(distance_threshold=distance_threshold, method=method,
                                  metric=metric, max_channels=max_channels, overflow=overflow)
        self.dim = dim
        self.clip = clip
        self.noise_scale = noise_scale
        self.max_channels = max_channels
        self.cluster_options: ClusterOptions = options
        self.self_attention = MultiHeadSelfAttention(dim, num_heads, head_dim)
        self.channel_attention = AdditiveAttention(dim, attention_dim)
        self.interest = BasicInterestEmbeddings(num_basis, dim)

    @property
    def num_basis(self) -> int:
        return self.interest.num_basis

    def weights(self, perturbed_scores: Tensor) -> Tensor:
        """The aggregator's αᵢ = softmax(s·âᵢ) (s = 1 without ``aggregator_scale``)."""
        if self.log_scale is None:
            return aggregator_weights(perturbed_scores)
        return aggregator_weights(perturbed_scores * self.log_scale.exp())

    # -- user side ------------------------------------------------------------------------
    def context(self, news_vectors: Tensor, mask: Tensor) -> Tensor:
        """Global self-attention g: ``[b, H, d]``, ``[b, H]`` → ``[b, H, d]``.

        Padding keys are ignored; an empty history attends over its (anonymous) positions.
        """
        return self.self_attention(news_vectors, attend_all_if_empty(mask))

    @torch.no_grad()
    def channels(self, news_vectors: Tensor, mask: Tensor) -> ChannelBatch:
        """Interest channels of each user (clustering of g, one user at a time)."""
        return cluster_batch(self.context(news_vectors, mask), mask, **self.cluster_options)

    def interests(self, context: Tensor, channel_ids: Tensor) -> Tensor:
        """Cluster-wise attention (Eq. 1): ``g[b, H, d]``, ``channel_ids[b, H]`` → ``r[b, M, d]``.

        Slot i pools the positions with ``channel_ids == i``; an unused slot pools every
        position (finite, ignored downstream: quota 0).
        """
        slots = torch.arange(self.max_channels, device=channel_ids.device)
        member = channel_ids.unsqueeze(-2) == slots[:, None]  # [b, M, H]
        x = context.unsqueeze(-3).expand(*member.shape, context.shape[-1])
        return self.channel_attention(x, member)

    def protected_weights(self, interests: Tensor, *, score_noise: Tensor | None = None,
                          score_clip: bool = True) -> Tensor:
        """α = softmax(f_δ(r·eᵏ) + n): ``[b, M, d]`` → ``[b, M, B]`` (Eq. 2-3).

        f_δ clips the decomposition scores to [−δ, δ] (none when ``clip`` is None or
        ``score_clip`` is false). ``score_noise``: the Laplace(λ_I) noise n ``[b, M, B]``
        drawn by the caller (the model draws no noise;
        :func:`privaterec.recall.query.release_query`); ``None``: none.
        """
        scores = perturb_scores(self.interest.decompose(interests),
                                clip=self.clip if score_clip else None, noise=None)
        return self.weights(scores if score_noise is None else scores + score_noise)

    def forward(self, news_vectors: Tensor, mask: Tensor, candidates: Tensor,
                channel_ids: Tensor | None = None, quotas: Tensor | None = None, *,
                score_noise: Tensor | None = None, score_clip: bool = True) -> Tensor:
        """Unified recall scores z of the candidates (Eq. 5).

        Parameters
        ----------
        news_vectors:
            ``Tensor[b, H, d]`` clicked-news vectors.
        mask:
            ``BoolTensor[b, H]``.
        candidates:
            ``Tensor[b, K, d]`` candidate news vectors (training: clicked first, then K_r
            non-clicked).
        channel_ids, quotas:
            ``LongTensor[b, H]`` and ``Tensor[b, M]`` from :meth:`channels`; computed here
            when omitted (then not ``torch.func`` traceable).
        score_noise, score_clip:
            ``Tensor[b, M, B]`` noise added to the clipped decomposition scores (training with
            noise; drawn by the caller, the model draws none; ``None``: none), and whether
            they are clipped (:meth:`protected_weights`).

        Returns
        -------
        ``Tensor[b, K]`` logits.
        """
        if (channel_ids is None) != (quotas is None):
            raise ConfigError("pass both channel_ids and quotas (from model.channels()) or "
                              "neither")
        if channel_ids is None:
            batch = self.channels(news_vectors, mask)
            channel_ids, quotas = batch.channel_ids, batch.quotas
        assert quotas is not None
        r = self.interests(self.context(news_vectors, mask), channel_ids)
        if not self.use_bie:
            return unified_score(r, quotas.to(r.dtype), candidates)
        alpha = self.protected_weights(r, score_noise=score_noise, score_clip=score_clip)
        return unified_score(self.interest.aggregate(alpha), quotas.to(alpha.dtype), candidates)

    # -- serving --------------------------------------------------------------------------
    @torch.no_grad()
    def query_scores(self, news_vectors: Tensor, mask: Tensor) -> tuple[Tensor, ChannelBatch]:
        """What a query releases before its noise (Uni-FedRec §3.4): the clipped decomposition
        scores ``[b, M, B]`` of each channel slot (unused slots: 0) and the channels.

        Raises
        ------
        ConfigError
            The model has no basic interest embeddings (no-BIE ablation) or no clip.
        """
        if not self.use_bie:
            raise ConfigError("this recall model was trained without basic interest "
                              "embeddings (no-BIE ablation): it has no protected query; "
                              "evaluate it with --recall no-bie")
        if self.clip is None:
            raise ConfigError("serving needs clipped decomposition scores: build the model "
                              "with clip=delta (e.g. 0.2), not clip=None")
        batch = self.channels(news_vectors, mask)
        r = self.interests(self.context(news_vectors, mask), batch.channel_ids)
        scores = self.interest.decompose(r)
        scores = torch.where(batch.valid.unsqueeze(-1), scores, torch.zeros_like(scores))
        return perturb_scores(scores, clip=self.clip, noise=None), batch


__all__ = ["NUM_NEGATIVES", "UniFedRecRecall", "info_nce", "unified_score"]
