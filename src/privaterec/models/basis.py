"""PrivateRec's public basic vectors b and the interest decomposition (PrivateRec §3.2.2).

Alg. 2 line 7: α = softmax(u·bᵀ/√d) decomposes the user vector u ∈ R^d into B attention
weights over B trained basic vectors b ∈ R^{B×d}; Alg. 1 line 3 / Alg. 3 line 15: the server
(or the loss) reconstructs ũ = Σᵢ α̃ᵢ bᵢ. The noise on α lives in
:mod:`privaterec.privacy.dpa`; this module is only the deterministic model part.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class BasicVectors(nn.Module):
    """B trainable basic vectors of size d (default B = 5, PrivateRec §4).

    Parameters
    ----------
    size:
        B ≥ 1.
    dim:
        d, the size of user and news vectors.
    """

    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        if size < 1:
            raise ValueError(f"basis size must be >= 1, got {size}")
        self.size = size
        self.dim = dim
        self.weight = nn.Parameter(torch.randn(size, dim))

    def attention(self, user: torch.Tensor) -> torch.Tensor:
        """α = softmax(u·bᵀ/√d): ``[..., d]`` → ``[..., B]`` (Alg. 2 line 7)."""
        return torch.softmax(user @ self.weight.T / math.sqrt(self.dim), dim=-1)

    def reconstruct(self, alpha: torch.Tensor) -> torch.Tensor:
        """ũ = Σᵢ αᵢ bᵢ: ``[..., B]`` → ``[..., d]`` (Alg. 1 line 3, Alg. 3 line 15)."""
        return alpha @ self.weight

    def score_matrix(self, news: torch.Tensor) -> torch.Tensor:
        """P = b·Rᵀ ``[B, C]`` for news vectors R ``[C, d]``: scores of α̃ are α̃ᵀP (DESIGN §6)."""
        return self.weight @ news.T


__all__ = ["BasicVectors"]
