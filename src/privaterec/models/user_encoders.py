"""User encoders Θ_U: clicked-news vectors → user vector (FedNewsRec §3.1; NRMS, NAML, LSTUR).

Every encoder is an ``nn.Module`` with ``forward(news_vectors: Tensor[b, H, d],
mask: BoolTensor[b, H]) -> Tensor[b, d]``. Histories are right-aligned (most recent click
last) and left-padded with the anonymous news r₀; ``mask`` is ``True`` for real clicks.
Masked positions cannot influence the output, except in a row whose mask is all ``False``:
that row is treated as if every position were real (they all hold r₀), so its output is
finite. Rows are encoded independently of each other.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from privaterec.config import ModelConfig
from privaterec.models.layers import (AdditiveAttention, MaskedGRU, MultiHeadSelfAttention,
                                      attend_all_if_empty)
from privaterec.models.news_encoders import project


class NRMSUserEncoder(nn.Module):
    """NRMS user encoder: multi-head self-attention over clicked news → dropout → additive
    attention.

    Parameters
    ----------
    dim:
        Size d of news and user vectors; must equal ``num_heads * head_dim``.
    num_heads, head_dim, attention_dim, dropout:
        Layer sizes and dropout probability.
    """

    def __init__(self, dim: int, *, num_heads: int, head_dim: int, attention_dim: int,
                 dropout: float) -> None:
        super().__init__()
        if num_heads * head_dim != dim:
            raise ValueError(f"num_heads * head_dim = {num_heads * head_dim} must equal the "
                             f"news vector size {dim}")
        self.dim = dim
        self.self_attention = MultiHeadSelfAttention(dim, num_heads, head_dim)
        self.dropout = nn.Dropout(dropout)
        self.pooling = AdditiveAttention(dim, attention_dim)

    def forward(self, news_vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        mask = attend_all_if_empty(mask)
        x = self.dropout(self.self_attention(news_vectors, mask))
        return self.pooling(x, mask)


class NAMLUserEncoder(nn.Module):
    """NAML user encoder: additive attention over the clicked-news vectors.

    Parameters
    ----------
    dim:
        Size d of news and user vectors.
    attention_dim:
        Hidden size of the additive attention.
    """

    def __init__(self, dim: int, *, attention_dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.pooling = AdditiveAttention(dim, attention_dim)

    def forward(self, news_vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.pooling(news_vectors, attend_all_if_empty(mask))


class LSTURUserEncoder(nn.Module):
    """LSTUR user encoder without user-ID embeddings (FedNewsRec §3.1: IDs of users who
    never train cannot be learned): a GRU over the history in click order, initial state 0;
    masked (padding) steps keep the state; the user vector is the final state projected to d
    (identity when ``gru_dim == d``).

    Parameters
    ----------
    dim:
        Size d of news and user vectors.
    gru_dim:
        GRU state size.
    """

    def __init__(self, dim: int, *, gru_dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.gru = MaskedGRU(dim, gru_dim)
        self.projection = project(gru_dim, dim)

    def forward(self, news_vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.projection(self.gru(news_vectors, attend_all_if_empty(mask)))


class FedNewsRecUserEncoder(nn.Module):
    """FedNewsRec user model (§3.1, Fig. 2).

    Long-term interest: multi-head self-attention over the whole history → dropout →
    additive attention. Short-term interest: a GRU over the last ``short_term_len`` clicks
    (masked steps keep the state), final state projected to d. The two vectors are combined
    by an additive attention into the user vector.

    Parameters
    ----------
    dim:
        Size d of news and user vectors; must equal ``num_heads * head_dim``.
    num_heads, head_dim, attention_dim, gru_dim, dropout:
        Layer sizes and dropout probability.
    short_term_len:
        Number of most recent positions fed to the GRU.
    """

    def __init__(self, dim: int, *, num_heads: int, head_dim: int, attention_dim: int,
                 gru_dim: int, short_term_len: int, dropout: float) -> None:
        super().__init__()
        if num_heads * head_dim != dim:
            raise ValueError(f"num_heads * head_dim = {num_heads * head_dim} must equal the "
                             f"news vector size {dim}")
        self.dim = dim
        self.short_term_len = short_term_len
        self.self_attention = MultiHeadSelfAttention(dim, num_heads, head_dim)
        self.dropout = nn.Dropout(dropout)
        self.long_term_pooling = AdditiveAttention(dim, attention_dim)
        self.gru = MaskedGRU(dim, gru_dim)
        self.short_term_projection = project(gru_dim, dim)
        self.combine = AdditiveAttention(dim, attention_dim)

    def forward(self, news_vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        mask = attend_all_if_empty(mask)
        long_term = self.long_term_pooling(
            self.dropout(self.self_attention(news_vectors, mask)), mask)
        recent = slice(max(news_vectors.shape[-2] - self.short_term_len, 0), None)
        short_term = self.short_term_projection(
            self.gru(news_vectors[..., recent, :], mask[..., recent]))
        return self.combine(torch.stack([long_term, short_term], dim=-2))


USER_ENCODER_BUILDERS: dict[str, Callable[[ModelConfig], nn.Module]] = {
    "nrms": lambda c: NRMSUserEncoder(c.news_dim, num_heads=c.num_heads, head_dim=c.head_dim,
                                      attention_dim=c.attention_dim, dropout=c.dropout),
    "naml": lambda c: NAMLUserEncoder(c.news_dim, attention_dim=c.attention_dim),
    "lstur": lambda c: LSTURUserEncoder(c.news_dim, gru_dim=c.gru_dim),
    "fednewsrec": lambda c: FedNewsRecUserEncoder(
        c.news_dim, num_heads=c.num_heads, head_dim=c.head_dim, attention_dim=c.attention_dim,
        gru_dim=c.gru_dim, short_term_len=c.short_term_len, dropout=c.dropout),
}
"""Every user encoder's builder by its name (``ModelConfig.user_encoder``'s choices)."""
