"""PrivateRec's basic vectors: attention on the simplex, reconstruction, batch independence,
centered attention and the collapse diagnostics."""

from __future__ import annotations

import math

import pytest
import torch

from privaterec.models.basis import BasicVectors, ReferenceNews, attention_diagnostics

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
    # Scores in the B-dim score space equal the d-dim scores
    # (docs/architecture.md#performance-design).
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


# -- centered attention (the collapse fix; docs/privaterec.md, "Collapse of the basis attention") -------------------

def _reference(count: int = 3, length: int = 4) -> ReferenceNews:
    return ReferenceNews(count, title_len=5, abstract_len=2, length=length)


def test_basis_attention_options_are_checked():
    with pytest.raises(ValueError, match="basis attention"):
        BasicVectors(B, D, attention="cosine")
    with pytest.raises(ValueError, match="scale"):
        BasicVectors(B, D, attention="centered", scale=0.0, reference=_reference())
    with pytest.raises(ValueError, match="reference"):
        BasicVectors(B, D, attention="centered")
    with pytest.raises(ValueError, match="reference"):
        BasicVectors(B, D, attention="dot", reference=_reference())


def test_centered_logits_are_scaled_cosines_bounded_by_s():
    torch.manual_seed(3)
    basis = BasicVectors(B, D, attention="centered", scale=2.5, reference=_reference())
    x = torch.randn(7, D)
    logits = basis.logits(x).detach()
    expected = 2.5 * torch.nn.functional.cosine_similarity(
        x[:, None, :], basis.weight.detach()[None], dim=-1)
    torch.testing.assert_close(logits, expected)
    # Unlike u·bᵀ/√d, the logits do not grow with the input's norm: α cannot saturate.
    torch.testing.assert_close(basis.logits(1000 * x).detach(), logits)
    assert float(logits.abs().max()) <= 2.5 + 1e-6
    uniform = basis.attention(torch.zeros(2, D)).detach()  # a zero input: the uniform α
    torch.testing.assert_close(uniform, torch.full((2, B), 1 / B))


def test_reference_rows_are_real_and_evenly_spaced():
    rows = ReferenceNews.rows(101, 4)
    assert rows.tolist() == [1, 26, 51, 76]
    assert ReferenceNews.rows(3, 5).tolist() == [1, 2, 1, 2, 1]  # fewer news than K: repeat
    ref = _reference(count=2)
    with pytest.raises(ValueError, match="title"):
        ref.fill({"title": torch.zeros(3, 5, dtype=torch.long)})


# -- collapse diagnostics --------------------------------------------------------------------

def test_diagnostics_flag_identical_one_hot_attention_as_collapsed():
    n = 50
    alpha = torch.zeros(n, B)
    alpha[:, 2] = 1.0  # every user on basic vector 2: the collapse of seed 0
    user = torch.randn(n, D) * 0.01 + 5.0
    d = attention_diagnostics(alpha, user, alpha @ torch.randn(B, D))
    assert d.collapsed
    assert d.argmax_share == 1.0 and d.argmax_counts == (0, 0, n, 0)
    assert d.entropy_mean == pytest.approx(0.0, abs=1e-9) and d.max_weight_mean == 1.0
    assert d.spread == pytest.approx(0.0, abs=1e-12)
    assert d.common_share > 0.99  # the users' u are nearly the same vector
    assert d.user_norm_mean == pytest.approx(5.0 * math.sqrt(D), rel=0.01)
    # the same α for everyone, even a soft one, is collapsed too: every ũ is the same
    soft = torch.softmax(torch.tensor([2.0, 1.0, 0.0, -1.0]), -1).expand(n, B)
    assert attention_diagnostics(soft, user, soft @ torch.randn(B, D)).collapsed


def test_diagnostics_pass_a_healthy_attention():
    g = torch.Generator().manual_seed(4)
    n = 200
    alpha = torch.softmax(3 * torch.randn(n, B, generator=g), -1)
    user = torch.randn(n, D, generator=g)
    d = attention_diagnostics(alpha, user, alpha @ torch.randn(B, D, generator=g),
                              attention_input=user - user.mean(0))
    assert not d.collapsed and d.spread > 0.3
    assert sum(d.argmax_counts) == n and d.argmax_share < 0.5
    assert 0 < d.entropy_ratio < 1 and d.common_share == pytest.approx(0.0, abs=1e-9)
    assert set(d.to_dict()) >= {"entropy_mean", "argmax_share", "spread", "user_norm_mean",
                                "user_norm_max", "scored_norm_mean", "collapsed"}
    with pytest.raises(ValueError):
        attention_diagnostics(alpha[:0], user[:0], user[:0])
    with pytest.raises(ValueError):
        attention_diagnostics(alpha, user, user[:, :2])
