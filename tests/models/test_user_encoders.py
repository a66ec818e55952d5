"""Tests for the user encoders: masks honoured, empty histories, batch independence."""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from torch import nn

from privaterec.models.user_encoders import (FedNewsRecUserEncoder, LSTURUserEncoder,
                                             NAMLUserEncoder, NRMSUserEncoder)

D, H = 8, 7

BUILDERS: dict[str, Callable[[], nn.Module]] = {
    "nrms": lambda: NRMSUserEncoder(D, num_heads=2, head_dim=4, attention_dim=5, dropout=0.2),
    "naml": lambda: NAMLUserEncoder(D, attention_dim=5),
    "lstur": lambda: LSTURUserEncoder(D, gru_dim=6),
    "fednewsrec": lambda: FedNewsRecUserEncoder(D, num_heads=2, head_dim=4, attention_dim=5,
                                                gru_dim=6, short_term_len=3, dropout=0.2),
}


def _left_padded(lengths: list[int]) -> torch.Tensor:
    """Right-aligned history masks with the given numbers of real clicks."""
    return torch.stack([torch.arange(H) >= H - n for n in lengths])


def assert_batch_independent(encoder: nn.Module, vectors: torch.Tensor, mask: torch.Tensor,
                             keep: list[int], trials: int = 3) -> None:
    """Rows ``keep`` encode identically whatever the other rows (vectors and masks) hold."""
    encoder.eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        base = encoder(vectors, mask)[keep]
        for _ in range(trials):
            v, m = torch.randn(vectors.shape, generator=g) * 3, _left_padded(
                torch.randint(0, H + 1, (vectors.shape[0],), generator=g).tolist())
            v[keep], m[keep] = vectors[keep], mask[keep]
            assert torch.allclose(encoder(v, m)[keep], base, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_shape_and_finite(name: str) -> None:
    enc = BUILDERS[name]()
    out = enc(torch.randn(4, H, D), _left_padded([0, 1, 4, H]))
    assert out.shape == (4, D) and torch.isfinite(out).all()


@pytest.mark.parametrize("name", list(BUILDERS))
def test_batch_independent(name: str) -> None:
    assert_batch_independent(BUILDERS[name](), torch.randn(6, H, D),
                             _left_padded([0, 2, H, 4, 1, 5]), keep=[0, 2, 4, 5])


@pytest.mark.parametrize("name", list(BUILDERS))
def test_masked_positions_do_not_influence_output(name: str) -> None:
    enc = BUILDERS[name]().eval()
    vectors = torch.randn(3, H, D)
    mask = _left_padded([2, 5, 1])
    changed = torch.where(mask.unsqueeze(-1), vectors, torch.randn(3, H, D) * 10)
    with torch.no_grad():
        assert torch.allclose(enc(vectors, mask), enc(changed, mask), atol=1e-6)
    vectors.requires_grad_(True)
    enc(vectors, mask).sum().backward()
    assert torch.all(vectors.grad[~mask] == 0)
    assert vectors.grad[mask].abs().sum() > 0


@pytest.mark.parametrize("name", list(BUILDERS))
def test_empty_history_attends_over_anonymous_news(name: str) -> None:
    # an all-False row behaves like an all-True row: every position holds r0
    enc = BUILDERS[name]().eval()
    r0 = torch.randn(D)
    vectors = r0.expand(2, H, D).clone()
    vectors.requires_grad_(True)
    out = enc(vectors, _left_padded([0, 0]))
    assert torch.isfinite(out).all()
    assert torch.allclose(out, enc(vectors, _left_padded([H, H])))
    (grad,) = torch.autograd.grad(out.sum(), vectors)
    assert grad.abs().sum() > 0  # r0 (hence e0) receives gradient through empty histories


@pytest.mark.parametrize("name", list(BUILDERS))
def test_order_sensitivity(name: str) -> None:
    # Attention-only encoders are permutation invariant over real clicks; the GRU-based ones
    # depend on click order.
    enc = BUILDERS[name]().eval()
    vectors = torch.randn(1, H, D)
    mask = _left_padded([H])
    reversed_ = vectors.flip(1)
    with torch.no_grad():
        same = torch.allclose(enc(vectors, mask), enc(reversed_, mask), atol=1e-5)
    assert same == (name in ("nrms", "naml"))


def test_naml_user_encoder_matches_hand_computation() -> None:
    enc = NAMLUserEncoder(D, attention_dim=5)
    vectors = torch.randn(1, H, D)
    mask = _left_padded([3])
    W, b, q = enc.pooling.projection.weight, enc.pooling.projection.bias, enc.pooling.query.weight[0]
    real = vectors[0, H - 3:]
    alpha = torch.softmax(torch.tanh(real @ W.T + b) @ q, 0)
    assert torch.allclose(enc(vectors, mask)[0], alpha @ real, atol=1e-6)


def test_lstur_equals_torch_gru_on_real_clicks() -> None:
    enc = LSTURUserEncoder(D, gru_dim=6)
    ref = nn.GRU(D, 6, batch_first=True)
    with torch.no_grad():
        ref.weight_ih_l0.copy_(enc.gru.input_proj.weight)
        ref.bias_ih_l0.copy_(enc.gru.input_proj.bias)
        ref.weight_hh_l0.copy_(enc.gru.hidden_proj.weight)
        ref.bias_hh_l0.copy_(enc.gru.hidden_proj.bias)
    vectors = torch.randn(2, H, D)
    out = enc(vectors, _left_padded([4, H]))
    for i, n in enumerate((4, H)):
        state = ref(vectors[i:i + 1, H - n:])[1][0, 0]
        assert torch.allclose(out[i], enc.projection(state), atol=1e-6)


def test_lstur_identity_projection_when_sizes_agree() -> None:
    enc = LSTURUserEncoder(D, gru_dim=D)
    assert isinstance(enc.projection, nn.Identity)
    vectors = torch.randn(1, H, D)
    mask = _left_padded([H])
    assert torch.equal(enc(vectors, mask), enc.gru(vectors, mask))


def test_fednewsrec_short_term_gru_reads_only_recent_clicks() -> None:
    enc = BUILDERS["fednewsrec"]().eval()
    seen = []
    enc.gru.register_forward_hook(lambda module, args, out: seen.append(args))
    vectors = torch.randn(2, H, D)
    mask = _left_padded([H, 2])
    out = enc(vectors, mask)
    (gru_in, gru_mask), = seen
    assert torch.equal(gru_in, vectors[:, -3:]) and torch.equal(gru_mask, mask[:, -3:])
    # the combination is an additive attention over [long-term, short-term]
    long_term = enc.long_term_pooling(enc.self_attention(vectors, mask), mask)
    short_term = enc.short_term_projection(enc.gru(vectors[:, -3:], mask[:, -3:]))
    stacked = torch.stack([long_term, short_term], 1)
    alpha = enc.combine.weights(stacked)
    assert torch.allclose(out, (alpha.unsqueeze(-1) * stacked).sum(1), atol=1e-6)
    assert ((alpha > 0) & (alpha < 1)).all()


def test_user_encoders_reject_inconsistent_sizes() -> None:
    with pytest.raises(ValueError, match="must equal the news vector size"):
        NRMSUserEncoder(10, num_heads=2, head_dim=4, attention_dim=5, dropout=0.0)
    with pytest.raises(ValueError, match="must equal the news vector size"):
        FedNewsRecUserEncoder(10, num_heads=2, head_dim=4, attention_dim=5, gru_dim=4,
                              short_term_len=3, dropout=0.0)
