"""News encoders Θ_N: news features → ``Tensor[n, d]`` (FedNewsRec §3.1; NRMS, NAML, PLM-NR).

Every encoder is an ``nn.Module`` with attribute ``dim`` (= d) and
``forward(features) -> Tensor[n, d]``, where ``features`` is the dict returned by
:meth:`privaterec.data.features.NewsFeatures.select`: ``title [n, Lt]``, ``abstract [n, La]``
(token ids, 0 = ``<pad>``, 1 = ``<unk>``), ``category [n]``, ``subcategory [n]``,
``news_index [n]``.

Padding semantics (PrivateRec §3.2.3, Fig. 3): padding tokens are embedded as the trainable
vector e₀ and are masked out of every attention, except in a title that is entirely padding,
which attends over all its positions. Hence the anonymous news r₀ = Θ_N(feature row 0) is a
finite, trainable function of e₀. Rows are encoded independently of each other (eval mode).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from privaterec.config import ModelConfig
from privaterec.data.text import TextVocabularies
from privaterec.models.layers import (AdditiveAttention, MultiHeadSelfAttention,
                                      NewsEncoderModule, TextCNN, WordEmbedding,
                                      attend_all_if_empty)
from privaterec.models.plm_encoder import PLMNewsEncoder, load_minilm


def project(in_dim: int, out_dim: int) -> nn.Module:
    """A linear map to ``out_dim``, or the identity when the sizes already agree."""
    return nn.Identity() if in_dim == out_dim else nn.Linear(in_dim, out_dim)


def token_mask(tokens: torch.Tensor) -> torch.Tensor:
    """Attention mask of a token sequence: non-padding tokens, or every token if all pad.

    ``tokens: LongTensor[n, L]`` → ``BoolTensor[n, L]``.
    """
    return attend_all_if_empty(tokens != 0)


class NRMSNewsEncoder(NewsEncoderModule):
    """NRMS news encoder (Wu et al. 2019): title → embeddings → dropout → multi-head
    self-attention → dropout → additive attention → ``d = num_heads * head_dim``.

    Parameters
    ----------
    embedding:
        The :class:`WordEmbedding` (it owns e₀).
    num_heads, head_dim:
        Self-attention shape; d = ``num_heads * head_dim``.
    attention_dim:
        Hidden size of the additive attention.
    dropout:
        Dropout probability on word vectors and on the self-attention output.
    cnn:
        ``(filters, window)`` of a CNN between the word vectors and the self-attention,
        followed by dropout (:class:`FedNewsRecNewsEncoder`); ``None``: none (NRMS).
    """

    def __init__(self, embedding: WordEmbedding, *, num_heads: int, head_dim: int,
                 attention_dim: int, dropout: float, cnn: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.embedding = embedding
        self.dropout = nn.Dropout(dropout)
        self.cnn = None if cnn is None else TextCNN(embedding.dim, *cnn)
        self.self_attention = MultiHeadSelfAttention(embedding.dim if cnn is None else cnn[0],
                                                     num_heads, head_dim)
        self.dim = self.self_attention.out_dim
        self.pooling = AdditiveAttention(self.dim, attention_dim)

    def forward(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        title = features["title"]
        mask = token_mask(title)
        x = self.dropout(self.embedding(title))
        if self.cnn is not None:
            x = self.dropout(self.cnn(x))
        x = self.dropout(self.self_attention(x, mask))
        return self.pooling(x, mask)


class FedNewsRecNewsEncoder(NRMSNewsEncoder):
    """FedNewsRec news model (§3.1, Fig. 1): title → word embeddings → CNN (local contexts)
    → multi-head self-attention (long-range contexts) → additive attention → d.

    Dropout follows each of the first three layers, as in the authors' code.

    Parameters
    ----------
    cnn_filters, cnn_window:
        Number of convolution filters and window size ("same" padding).
    embedding, num_heads, head_dim, attention_dim, dropout:
        As in :class:`NRMSNewsEncoder`.
    """

    def __init__(self, embedding: WordEmbedding, *, cnn_filters: int, cnn_window: int,
                 num_heads: int, head_dim: int, attention_dim: int, dropout: float) -> None:
        super().__init__(embedding, num_heads=num_heads, head_dim=head_dim,
                         attention_dim=attention_dim, dropout=dropout,
                         cnn=(cnn_filters, cnn_window))


class _TextView(nn.Module):
    """One NAML text view: CNN → dropout → additive attention → projection to d."""

    def __init__(self, in_dim: int, *, filters: int, window: int, attention_dim: int,
                 dim: int, dropout: float) -> None:
        super().__init__()
        self.cnn = TextCNN(in_dim, filters, window)
        self.dropout = nn.Dropout(dropout)
        self.pooling = AdditiveAttention(filters, attention_dim)
        self.projection = project(filters, dim)

    def forward(self, embedded: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.projection(self.pooling(self.dropout(self.cnn(embedded)), mask))


class _CategoryView(nn.Module):
    """One NAML category view: embedding → dense layer with ReLU to d (index 0 is trainable)."""

    def __init__(self, num_categories: int, category_dim: int, dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(num_categories, category_dim)
        self.dense = nn.Linear(category_dim, dim)

    def forward(self, category: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.dense(self.embedding(category)))


class NAMLNewsEncoder(NewsEncoderModule):
    """NAML news encoder (Wu et al. 2019, attentive multi-view learning).

    Four views, each of size d: title (CNN + additive attention), abstract (its own CNN +
    additive attention; the word embeddings are shared), category and subcategory
    (embedding → dense + ReLU). The news vector is a view-level additive attention over them.

    Parameters
    ----------
    embedding:
        The shared :class:`WordEmbedding` (it owns e₀).
    num_categories, num_subcategories:
        Sizes of the category vocabularies (0 = padding, 1 = unknown).
    dim:
        Output size d.
    cnn_filters, cnn_window, attention_dim, category_dim, dropout:
        Layer sizes and dropout probability.
    """

    def __init__(self, embedding: WordEmbedding, *, num_categories: int,
                 num_subcategories: int, dim: int, cnn_filters: int, cnn_window: int,
                 attention_dim: int, category_dim: int, dropout: float) -> None:
        super().__init__()
        self.dim = dim
        self.embedding = embedding
        self.dropout = nn.Dropout(dropout)
        self.title_view = _TextView(embedding.dim, filters=cnn_filters, window=cnn_window,
                                    attention_dim=attention_dim, dim=dim, dropout=dropout)
        self.abstract_view = _TextView(embedding.dim, filters=cnn_filters, window=cnn_window,
                                       attention_dim=attention_dim, dim=dim, dropout=dropout)
        self.category_view = _CategoryView(num_categories, category_dim, dim)
        self.subcategory_view = _CategoryView(num_subcategories, category_dim, dim)
        self.view_attention = AdditiveAttention(dim, attention_dim)

    def forward(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        title, abstract = features["title"], features["abstract"]
        views = torch.stack([
            self.title_view(self.dropout(self.embedding(title)), token_mask(title)),
            self.abstract_view(self.dropout(self.embedding(abstract)), token_mask(abstract)),
            self.category_view(features["category"]),
            self.subcategory_view(features["subcategory"]),
        ], dim=-2)  # [n, 4, d]
        return self.view_attention(views)


class IDNewsEncoder(NewsEncoderModule):
    """One trainable vector per news id, for data without text (EB-NeRD without articles).

    Reads ``features["news_index"]``: index 0 is the anonymous/padding news (its vector is
    r₀), index 1 is the shared vector of every news unseen in training, the rest are the
    training news. Initialised N(0, 0.1²).

    Parameters
    ----------
    num_news_ids:
        Size of the news-id vocabulary (``len(TextVocabularies.news_ids)``).
    dim:
        Output size d.
    """

    def __init__(self, num_news_ids: int, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.embedding = nn.Embedding(num_news_ids, dim)
        nn.init.normal_(self.embedding.weight, std=0.1)

    def forward(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.embedding(features["news_index"])


NEWS_ENCODER_BUILDERS: dict[str, Callable[[ModelConfig, TextVocabularies,
                                            Callable[[], WordEmbedding]], NewsEncoderModule]] = {
    "nrms": lambda c, vocabs, words: NRMSNewsEncoder(words(), num_heads=c.num_heads,
        head_dim=c.head_dim, attention_dim=c.attention_dim, dropout=c.dropout),
    "naml": lambda c, vocabs, words: NAMLNewsEncoder(
        words(), num_categories=len(vocabs.categories), num_subcategories=len(vocabs.subcategories),
        dim=c.news_dim, cnn_filters=c.cnn_filters, cnn_window=c.cnn_window,
        attention_dim=c.attention_dim, category_dim=c.category_dim, dropout=c.dropout),
    "fednewsrec": lambda c, vocabs, words: FedNewsRecNewsEncoder(
        words(), cnn_filters=c.cnn_filters, cnn_window=c.cnn_window, num_heads=c.num_heads,
        head_dim=c.head_dim, attention_dim=c.attention_dim, dropout=c.dropout),
    "plm": lambda c, vocabs, words: PLMNewsEncoder(
        vocabs.words, dim=c.news_dim, trainable_layers=c.plm_trainable_layers, dropout=c.dropout),
    "id": lambda c, vocabs, words: IDNewsEncoder(len(vocabs.news_ids), c.news_dim),
}
"""Every news encoder's builder by its name (:data:`privaterec.config.NEWS_ENCODERS`): ``(config,
vocabularies, words)``; ``words()`` builds the word embedding (it draws: called when read)."""

__all__ = ["FedNewsRecNewsEncoder", "IDNewsEncoder", "NAMLNewsEncoder", "NEWS_ENCODER_BUILDERS",
           "NRMSNewsEncoder", "PLMNewsEncoder", "load_minilm", "project", "token_mask"]
