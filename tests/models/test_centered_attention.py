"""Centered basis attention α = softmax(s·cos(u − c, bᵢ)) on a built recommender.

c = Θ_U(r̄, …, r̄) is computed from the model and its public reference news: it must equal
that formula, carry no gradient, ignore dropout, be batch independent and be part of the
``state_dict`` (so a loaded model computes the same α). docs/privaterec.md, "Collapse of the basis attention".
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from privaterec.config import ModelConfig
from privaterec.data.features import build_news_features, build_vocabularies
from privaterec.data.records import NewsRecord
from privaterec.models.basis import REFERENCE_NEWS, ReferenceNews
from privaterec.models.factory import build_recommender, vocabulary_kind

pytestmark = pytest.mark.usefixtures("one_thread")

NEWS = [NewsRecord(f"N{i}", ["sports", "politics", "food"][i % 3], f"sub{i % 4}",
                   f"the {w} met {v} about day {i}", f"abstract {w}")
        for i, (w, v) in enumerate(zip(["king", "queen", "team", "market", "band", "storm",
                                         "court", "chef"],
                                        ["fans", "banks", "stars", "rain", "voters", "cooks",
                                         "judges", "crowds"]))]
TINY = ModelConfig(word_dim=6, num_heads=2, head_dim=4, attention_dim=5, title_len=8,
                   abstract_len=6, history_len=4, dropout=0.3, basis_size=3)
H, D = TINY.history_len, TINY.news_dim


@pytest.fixture
def setup():
    vocabs = build_vocabularies(NEWS, kind=vocabulary_kind(TINY))
    features = build_news_features(NEWS, vocabs, title_len=TINY.title_len,
                                   abstract_len=TINY.abstract_len)
    torch.manual_seed(0)
    model = build_recommender(TINY, vocabs, features)
    return vocabs, features, model


def _histories(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    vectors = torch.randn(n, H, D, generator=g)
    lengths = torch.randint(0, H + 1, (n,), generator=g)
    mask = torch.arange(H)[None, :] >= (H - lengths)[:, None]
    return vectors, mask


def test_reference_is_filled_from_the_table_and_saved(setup):
    vocabs, features, model = setup
    reference = model.basis.reference
    rows = ReferenceNews.rows(len(features), REFERENCE_NEWS)
    assert torch.equal(reference.title, features.title[rows])
    assert torch.equal(reference.category, features.category[rows])
    assert {f"basis.reference.{k}" for k in ("title", "abstract", "category", "subcategory",
                                             "news_index")} <= set(model.state_dict())
    # A model built without the table (a checkpoint being loaded) gets it from the state.
    torch.manual_seed(1)
    loaded = build_recommender(TINY, vocabs)
    assert not torch.equal(loaded.basis.reference.title, reference.title)
    loaded.load_state_dict(model.state_dict())
    loaded.eval()
    model.eval()
    g = torch.Generator().manual_seed(5)
    vectors, mask = _histories(4, g)
    torch.testing.assert_close(loaded.attention(vectors, mask), model.attention(vectors, mask))


def test_attention_is_the_scaled_cosine_of_u_minus_the_reference_user(setup):
    _, _, model = setup
    model.eval()
    g = torch.Generator().manual_seed(1)
    vectors, mask = _histories(5, g)
    with torch.no_grad():
        mean_news = model.news_encoder(model.basis.reference.features()).mean(0)
        center = model.user_encoder(mean_news.expand(1, H, D), torch.ones(1, H, dtype=bool))[0]
        torch.testing.assert_close(model.reference_user(), center)
        u = model.user_encoder(vectors, mask)
        cos = F.cosine_similarity((u - center)[:, None], model.basis.weight[None], dim=-1)
        expected = torch.softmax(TINY.basis_scale * cos, -1)
        torch.testing.assert_close(model.attention(vectors, mask), expected)
        torch.testing.assert_close(model.encode_user(vectors, mask),
                                   expected @ model.basis.weight)


def test_reference_user_ignores_dropout_and_restores_the_mode(setup):
    _, _, model = setup
    model.eval()
    expected = model.reference_user()
    model.train()
    for _ in range(3):  # dropout would draw a different c every call
        torch.testing.assert_close(model.reference_user(), expected)
    assert model.training and model.news_encoder.training


class _EncodeUser(torch.nn.Module):
    """``encode_user`` as a module's forward, for ``functional_call``."""

    def __init__(self, rec: torch.nn.Module) -> None:
        super().__init__()
        self.rec = rec

    def forward(self, vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.rec.encode_user(vectors, mask)


def test_no_gradient_flows_through_the_reference_user(setup):
    _, _, model = setup
    model.eval()
    g = torch.Generator().manual_seed(2)
    vectors, mask = _histories(3, g)
    center = model.reference_user()
    params = {k: v.detach() for k, v in model.named_parameters()}
    wrapper = _EncodeUser(model)

    def model_loss(p):
        named = {f"rec.{k}": v for k, v in p.items()}
        return functional_call(wrapper, named, (vectors, mask)).square().sum()

    def constant_center_loss(p):  # the same computation with c a constant
        user_params = {k[len("user_encoder."):]: v for k, v in p.items()
                       if k.startswith("user_encoder.")}
        u = functional_call(model.user_encoder, user_params, (vectors, mask))
        b = p["basis.weight"]
        cos = F.normalize(u - center, dim=-1) @ F.normalize(b, dim=-1).T
        return (torch.softmax(TINY.basis_scale * cos, -1) @ b).square().sum()

    got = grad(model_loss)(params)
    want = grad(constant_center_loss)(params)
    for name, value in got.items():
        expected = want.get(name, torch.zeros_like(value))
        torch.testing.assert_close(value, expected, msg=name)
    # The news encoder reaches this loss only through c: it gets no gradient at all.
    news = [k for k in got if k.startswith("news_encoder.")]
    assert news and all(float(got[k].abs().max()) == 0.0 for k in news)


def test_centered_attention_is_batch_independent_and_vmaps(setup):
    _, _, model = setup
    model.eval()
    g = torch.Generator().manual_seed(3)
    vectors, mask = _histories(6, g)
    keep = [0, 2, 5]
    with torch.no_grad():
        base = model.attention(vectors, mask)[keep]
        for _ in range(3):
            other, other_mask = _histories(6, g)
            other = other * 4
            other[keep], other_mask[keep] = vectors[keep], mask[keep]
            torch.testing.assert_close(model.attention(other, other_mask)[keep], base)
        per_row = vmap(lambda v, m: model.attention(v[None], m[None])[0])(vectors, mask)
    torch.testing.assert_close(per_row, model.attention(vectors, mask).detach())


def test_reference_user_is_reused_until_a_tensor_it_depends_on_changes(setup):
    """c is computed once while evaluating or serving (no gradient), and again as soon as a
    parameter or the reference news changes in place (an optimiser step, load_state_dict)."""
    _, _, model = setup
    with torch.no_grad():
        first = model.reference_user()
        assert model.reference_user() is first  # reused
        with torch.enable_grad():
            torch.testing.assert_close(model.reference_user(), first)  # recomputed, equal
            assert model.reference_user() is not first
        for weight in model.user_encoder.parameters():
            weight.mul_(1.5)
        changed = model.reference_user()
        assert not torch.allclose(changed, first)
        model.basis.reference.title.fill_(0)
        again = model.reference_user()
        assert not torch.allclose(again, changed) and model.reference_user() is again
        weight.mul_(1.0)  # a new version with equal values: recomputed all the same
        assert model.reference_user() is not again
