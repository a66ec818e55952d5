"""PrivateRec's basic vectors: attention on the simplex, reconstruction, batch independence."""

from __future__ import annotations

import math

import pytest
import torch

from privaterec.models.basis import BasicVectors

B, D = 4, 6


def test_attention_is_a_softmax_on_the_simplex():
    torch.manual_seed(0)
    basis = BasicVectors(B, D)
    u = torch.randn(7, D) * 3
    alpha = basis.attention(u)
    assert alpha.shape == (7, B)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(7))
    b = basis.weight.detach()
    logits = u @ b.T / math.sqrt(D)  # Alg. 2 line 7
    torch.testing.assert_close(alpha, torch.softmax(logits, -1))


def test_reconstruct_and_score_matrix_agree():
    torch.manual_seed(1)
    basis = BasicVectors(B, D)
    alpha = torch.softmax(torch.randn(5, B), -1)
    news = torch.randn(9, D)
    u = basis.reconstruct(alpha)
    torch.testing.assert_close(u, alpha @ basis.weight)
    # Scores in the B-dim score space equal the d-dim scores (DESIGN §6).
    torch.testing.assert_close(alpha @ basis.score_matrix(news), u @ news.T)


def test_batch_independent():
    torch.manual_seed(2)
    basis = BasicVectors(B, D)
    u = torch.randn(6, D)
    keep = [0, 3, 5]
    base = basis.reconstruct(basis.attention(u))[keep]
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        other = torch.randn(6, D, generator=g) * 10
        other[keep] = u[keep]
        torch.testing.assert_close(basis.reconstruct(basis.attention(other))[keep], base)


def test_invalid_size():
    with pytest.raises(ValueError, match="basis size"):
        BasicVectors(0, D)
