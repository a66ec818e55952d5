"""Building blocks shared by the news and user encoders (NRMS, NAML, FedNewsRec §3.1).

Every layer here is written so that

* masking is exact: a masked position gets attention weight exactly 0, so its content cannot
  change the output;
* a row whose mask is entirely ``False`` never produces NaN: :func:`attend_all_if_empty`
  turns it into an all-``True`` row (the convention of the whole package: an empty title or
  an empty history attends over its padding, which holds e₀ or the anonymous news r₀);
* rows of a batch are independent (no batch statistics);
* forward passes are ``torch.func`` friendly: no in-place ops on inputs, no Python control
  flow on tensor values, no ``.item()``.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn


@contextmanager
def eval_mode(module: object) -> Iterator[None]:
    """Put an ``nn.Module`` in eval mode (no dropout) for the block, then restore its mode;
    anything else (``None``, a plain callable) is left as it is."""
    if not isinstance(module, nn.Module):
        yield
        return
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def attend_all_if_empty(mask: torch.Tensor) -> torch.Tensor:
    """Return ``mask`` with every all-``False`` row (last dimension) replaced by all ``True``.

    Parameters
    ----------
    mask:
        ``BoolTensor[..., L]``; ``True`` marks positions that may be attended.

    Returns
    -------
    ``BoolTensor[..., L]`` in which each row has at least one ``True``. Rows that already had
    one are unchanged.
    """
    return mask | ~mask.any(dim=-1, keepdim=True)


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dimension restricted to ``mask``.

    Masked scores are replaced (not offset) by the most negative finite value, so a masked
    position gets weight exactly 0 whatever its score, and an all-masked row (which callers
    avoid with :func:`attend_all_if_empty`) degrades to a uniform distribution instead of NaN.

    Parameters
    ----------
    scores: ``Tensor[..., L]``. mask: ``BoolTensor`` broadcastable to ``scores``, or ``None``.
    """
    if mask is None:
        return torch.softmax(scores, dim=-1)
    floor = torch.finfo(scores.dtype).min
    return torch.softmax(torch.where(mask, scores, torch.full_like(scores, floor)), dim=-1)


class NewsEncoderModule(nn.Module):
    """Base class of the news encoders Θ_N (:class:`~privaterec.models.recommender.NewsEncoder`):
    ``forward(features)`` with each feature of leading shape ``[n]`` → ``Tensor[n, dim]``."""

    dim: int
    """d, the size of the news vectors."""


class AdditiveAttention(nn.Module):
    """Additive (attentive-pooling) attention, NRMS/NAML/FedNewsRec §3.1.

    aᵢ = qᵀ tanh(W xᵢ + v), αᵢ = softmax(a)ᵢ over unmasked positions, output Σᵢ αᵢ xᵢ.

    Parameters
    ----------
    in_dim:
        Size of the input vectors xᵢ (and of the output).
    attention_dim:
        Size of the hidden projection W xᵢ.
    """

    def __init__(self, in_dim: int, attention_dim: int) -> None:
        super().__init__()
        self.projection = nn.Linear(in_dim, attention_dim)
        self.query = nn.Linear(attention_dim, 1, bias=False)

    def weights(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attention weights ``Tensor[..., L]`` for ``x: Tensor[..., L, in_dim]``.

        ``mask: BoolTensor[..., L]`` (``True`` = attend); all-``False`` rows attend everything.
        """
        scores = self.query(torch.tanh(self.projection(x))).squeeze(-1)
        if mask is not None:
            mask = attend_all_if_empty(mask)
        return masked_softmax(scores, mask)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Pool ``x: Tensor[..., L, in_dim]`` → ``Tensor[..., in_dim]``."""
        alpha = self.weights(x, mask)
        return torch.einsum("...l,...ld->...d", alpha, x)


class MultiHeadSelfAttention(nn.Module):
    """Batch-first multi-head self-attention with masked keys (Vaswani et al. 2017; NRMS).

    As in NRMS there is no output projection: the output is the concatenation of the heads,
    of size ``num_heads * head_dim``. Query positions are never masked (their outputs are
    ignored downstream by the masked pooling); key positions with ``mask == False`` get
    weight exactly 0. A row with no attendable key attends to all keys.

    Parameters
    ----------
    in_dim:
        Size of the input vectors.
    num_heads, head_dim:
        Number and size of the heads; the output size is ``num_heads * head_dim``.
    """

    def __init__(self, in_dim: int, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.out_dim = num_heads * head_dim
        self.query = nn.Linear(in_dim, self.out_dim)
        self.key = nn.Linear(in_dim, self.out_dim)
        self.value = nn.Linear(in_dim, self.out_dim)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        # [b, L, h*k] -> [b, h, L, k]
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(-3, -2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x: Tensor[b, L, in_dim]``, ``mask: BoolTensor[b, L]`` → ``Tensor[b, L, h*k]``."""
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)  # [b, h, L, L]
        key_mask = None
        if mask is not None:
            key_mask = attend_all_if_empty(mask)[..., None, None, :]  # [b, 1, 1, L]
        attn = masked_softmax(scores, key_mask)
        out = attn @ v  # [b, h, L, k]
        return out.transpose(-3, -2).flatten(-2)


class WordEmbedding(nn.Module):
    """Word embeddings with a separate, always-trainable padding embedding e₀.

    Token 0 (``<pad>``) maps to the parameter ``pad`` = e₀, which PrivateRec §3.2.3/§3.3 trains
    (the anonymous news r₀ = Θ_N(all-padding title) is a function of it). Every other token
    maps to its row of ``weight``, which is frozen (``requires_grad=False``) when ``freeze``
    is true — pre-trained vectors are public data, and freezing keeps the dimension of DP
    noise down (docs/architecture.md#performance-design). Row 0 of ``weight`` is unused (kept at
    0).

    Trainable parameters are those with ``requires_grad``; a frozen table is still a
    parameter (so it is saved in the ``state_dict`` and moved by ``.to``).

    Initialisation: ``weight`` from ``pretrained`` when given, else N(0, 0.1²) from the
    global torch RNG; e₀ ~ N(0, s²) with s the standard deviation of the token table
    (0.1 for random tables).

    Parameters
    ----------
    num_tokens:
        Vocabulary size V (including ``<pad>`` and ``<unk>``).
    dim:
        Embedding size; must match ``pretrained.shape[1]`` when ``pretrained`` is given.
    pretrained:
        Optional ``Tensor[V, dim]`` initial table (row 0 is ignored).
    freeze:
        Whether the token table (not e₀) is frozen.
    init_std:
        Standard deviation of a random table (and of e₀ when there is no pre-trained table).
    """

    def __init__(self, num_tokens: int, dim: int, *, pretrained: torch.Tensor | None = None,
                 freeze: bool = True, init_std: float = 0.1) -> None:
        super().__init__()
        if pretrained is not None:
            if tuple(pretrained.shape) != (num_tokens, dim):
                raise ValueError(f"pretrained embeddings have shape {tuple(pretrained.shape)}, "
                                 f"expected ({num_tokens}, {dim})")
            table = pretrained.detach().clone().float()
            std = float(table[1:].std()) if num_tokens > 2 else init_std
        else:
            table = torch.randn(num_tokens, dim) * init_std
            std = init_std
        table[0] = 0.0
        self.num_tokens = num_tokens
        self.dim = dim
        self.weight = nn.Parameter(table, requires_grad=not freeze)
        self.pad = nn.Parameter(torch.randn(dim) * std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens: LongTensor[...]`` → ``Tensor[..., dim]`` (token 0 → e₀)."""
        looked_up = F.embedding(tokens, self.weight)
        return torch.where((tokens == 0).unsqueeze(-1), self.pad, looked_up)


class TextCNN(nn.Module):
    """1-D convolution over word vectors with "same" zero padding, then ReLU (NAML, FedNewsRec).

    ``forward(x: Tensor[b, L, in_dim]) → Tensor[b, L, filters]``. Padding tokens are part of
    the input (they hold e₀, PrivateRec Fig. 3); positions beyond the sequence are zeros.
    """

    def __init__(self, in_dim: int, filters: int, window: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_dim, filters, window, padding="same")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x.transpose(-1, -2))).transpose(-1, -2)


class MaskedGRU(nn.Module):
    """A GRU (Cho et al. 2014, PyTorch gate convention) whose masked steps keep the state.

    hₜ = GRUCell(xₜ, hₜ₋₁) where ``mask[:, t]`` is true, else hₜ = hₜ₋₁; h₀ = 0. With
    left-padded histories this equals running the GRU on the real clicks only. Written as an
    explicit loop over time of batched matrix products (input projections for all steps are
    computed at once), so it works under ``torch.func.vmap``/``grad`` and rows are independent.

    Parameters
    ----------
    in_dim, hidden_dim:
        Input and state sizes.
    """

    def __init__(self, in_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.hidden_dim = hidden_dim
        self.input_proj = nn.Linear(in_dim, 3 * hidden_dim)
        self.hidden_proj = nn.Linear(hidden_dim, 3 * hidden_dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x: Tensor[b, T, in_dim]``, ``mask: BoolTensor[b, T]`` → final state ``Tensor[b, hidden]``."""
        gates_x = self.input_proj(x)  # [b, T, 3h]
        h = x.new_zeros(*x.shape[:-2], self.hidden_dim)
        for t in range(x.shape[-2]):
            gx_r, gx_z, gx_n = gates_x[..., t, :].chunk(3, dim=-1)
            gh_r, gh_z, gh_n = self.hidden_proj(h).chunk(3, dim=-1)
            r = torch.sigmoid(gx_r + gh_r)
            z = torch.sigmoid(gx_z + gh_z)
            n = torch.tanh(gx_n + r * gh_n)
            h_new = (1 - z) * n + z * h
            h = torch.where(mask[..., t, None], h_new, h)
        return h
