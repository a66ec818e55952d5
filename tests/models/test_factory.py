"""Tests for privaterec.models.factory: model selection, embeddings, seeding, torch.func."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from privaterec.config import ModelConfig
from privaterec.data.features import build_news_features, build_vocabularies
from privaterec.data.records import NewsRecord
from privaterec.errors import ConfigError
from privaterec.models import news_encoders as ne
from privaterec.models import user_encoders as ue
from privaterec.models.factory import build_recommender, vocabulary_kind
from privaterec.models.recommender import Recommender

NEWS = [NewsRecord(f"N{i}", ["sports", "politics", "food"][i % 3], f"sub{i % 4}",
                   f"the king met the queen about {w} on day {i}", f"abstract {w}")
        for i, w in enumerate(["banana", "football", "election", "music", "weather", "trade"])]

TINY = dict(word_dim=6, num_heads=2, head_dim=4, attention_dim=5, cnn_filters=5, gru_dim=6,
            short_term_len=3, category_dim=3, title_len=8, abstract_len=6, dropout=0.1)


def _setup(**changes):
    config = ModelConfig(**{**TINY, **changes})
    vocabs = build_vocabularies(NEWS, kind=vocabulary_kind(config))
    features = build_news_features(NEWS, vocabs, title_len=config.title_len,
                                   abstract_len=config.abstract_len)
    return config, vocabs, features


def test_vocabulary_kind() -> None:
    assert vocabulary_kind(ModelConfig()) == "word"
    assert vocabulary_kind(ModelConfig(embeddings="glove50")) == "word"
    assert vocabulary_kind(ModelConfig(news_encoder="plm")) == "wordpiece"
    assert vocabulary_kind(ModelConfig(news_encoder="nrms", embeddings="minilm")) == "wordpiece"


@pytest.mark.parametrize("news,user,news_cls,user_cls", [
    ("nrms", None, ne.NRMSNewsEncoder, ue.NRMSUserEncoder),
    ("naml", None, ne.NAMLNewsEncoder, ue.NAMLUserEncoder),
    ("fednewsrec", None, ne.FedNewsRecNewsEncoder, ue.FedNewsRecUserEncoder),
    ("id", None, ne.IDNewsEncoder, ue.NRMSUserEncoder),
    ("nrms", "lstur", ne.NRMSNewsEncoder, ue.LSTURUserEncoder),
    ("naml", "fednewsrec", ne.NAMLNewsEncoder, ue.FedNewsRecUserEncoder),
])
def test_build_recommender_selects_encoders_and_runs(news, user, news_cls, user_cls) -> None:
    config, vocabs, features = _setup(news_encoder=news, user_encoder=user)
    torch.manual_seed(0)
    model = build_recommender(config, vocabs, features)
    assert isinstance(model, Recommender)
    assert isinstance(model.news_encoder, news_cls) and isinstance(model.user_encoder, user_cls)
    assert model.dim == config.news_dim == 8 and model.features is features
    history = torch.tensor([[0, 0, 1, 2], [0, 0, 0, 0]])
    logits = model(history, history != 0, torch.tensor([[3, 4, 5], [6, 1, 2]]))
    assert logits.shape == (2, 3) and torch.isfinite(logits).all()


def test_every_declared_encoder_has_its_builder() -> None:
    # a news (user) encoder is its class and its builder in models/news_encoders.py
    # (user_encoders.py), and its name in the configuration's choices; the factory has no list
    from privaterec.config import NEWS_ENCODERS, USER_ENCODERS

    assert tuple(ne.NEWS_ENCODER_BUILDERS) == NEWS_ENCODERS
    assert tuple(ue.USER_ENCODER_BUILDERS) == USER_ENCODERS


def test_vocabulary_sizes_come_from_vocabs() -> None:
    config, vocabs, _ = _setup(news_encoder="naml")
    model = build_recommender(config, vocabs)
    enc = model.news_encoder
    assert enc.embedding.weight.shape == (len(vocabs.words), 6)
    assert enc.category_view.embedding.num_embeddings == len(vocabs.categories)
    assert enc.subcategory_view.embedding.num_embeddings == len(vocabs.subcategories)
    config, vocabs, _ = _setup(news_encoder="id")
    model = build_recommender(config, vocabs)
    assert model.news_encoder.embedding.num_embeddings == len(vocabs.news_ids) == len(NEWS) + 2


def test_construction_is_deterministic_given_the_global_seed() -> None:
    config, vocabs, _ = _setup(news_encoder="fednewsrec")
    states = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        states.append(build_recommender(config, vocabs).state_dict())
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert not all(torch.equal(states[0][k], states[2][k]) for k in states[0])


def test_frozen_embeddings_and_trainable_e0() -> None:
    config, vocabs, _ = _setup()
    emb = build_recommender(config, vocabs).news_encoder.embedding
    assert not emb.weight.requires_grad and emb.pad.requires_grad
    config, vocabs, _ = _setup(freeze_embeddings=False)
    assert build_recommender(config, vocabs).news_encoder.embedding.weight.requires_grad


def test_glove_embeddings_bring_their_own_size() -> None:
    from privaterec.data.embeddings import load_pretrained

    config, vocabs, features = _setup(embeddings="glove50", word_dim=None)
    assert config.resolved_word_dim == 50
    torch.manual_seed(0)
    model = build_recommender(config, vocabs, features)
    emb = model.news_encoder.embedding
    assert emb.dim == 50 and emb.weight.shape == (len(vocabs.words), 50)
    table, coverage = load_pretrained("glove50", vocabs.words)
    king = vocabs.words.index("king")
    assert torch.equal(emb.weight[king], table[king])
    assert coverage > 0.9
    logits = model(torch.tensor([[1, 2]]), torch.tensor([[True, True]]), torch.tensor([[3, 4]]))
    assert torch.isfinite(logits).all()


def test_minilm_embeddings_need_wordpiece_vocabulary() -> None:
    config = ModelConfig(**{**TINY, "word_dim": None}, embeddings="minilm")
    word_vocabs = build_vocabularies(NEWS, kind="word")
    with pytest.raises(ConfigError, match="needs a 'wordpiece' vocabulary"):
        build_recommender(config, word_vocabs)
    vocabs = build_vocabularies(NEWS, kind="wordpiece")
    emb = build_recommender(config, vocabs).news_encoder.embedding
    assert emb.dim == 384


def test_plm_needs_wordpiece_vocabulary() -> None:
    config = ModelConfig(**TINY, news_encoder="plm")
    with pytest.raises(ConfigError, match="needs a 'wordpiece' vocabulary"):
        build_recommender(config, build_vocabularies(NEWS, kind="word"))


# ------------------------------------------------------- per-client gradients (torch.func)

def _client_batch(features, g: torch.Generator):
    """Two "clients": history rows [2, H], masks (different padding), candidate rows [2, C]."""
    history = torch.tensor([[0, 0, 3, 1, 4], [0, 0, 0, 0, 0]])
    mask = history != 0
    candidates = torch.randint(1, len(features), (2, 3), generator=g)
    return (features.select(history), mask, features.select(candidates),
            torch.tensor([0, 2]))


def _strip(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


@pytest.mark.parametrize("news,user", [("nrms", None), ("fednewsrec", None),
                                       ("naml", "lstur")])
def test_per_client_gradients_with_vmap_grad(news, user) -> None:
    config, vocabs, features = _setup(news_encoder=news, user_encoder=user)
    torch.manual_seed(0)
    model = build_recommender(config, vocabs).eval()
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    frozen = {k: v.detach() for k, v in model.named_parameters() if not v.requires_grad}
    hist, mask, cand, labels = _client_batch(features, torch.Generator().manual_seed(1))

    def loss(p, hist, m, cand, label):
        """InfoNCE of one client: hist features [H, ...], m [H], cand features [C, ...]."""
        state = {**p, **frozen}
        news_params = _strip(state, "news_encoder.")
        h = torch.func.functional_call(model.news_encoder, news_params, (hist,))
        c = torch.func.functional_call(model.news_encoder, news_params, (cand,))
        u = torch.func.functional_call(model.user_encoder, _strip(state, "user_encoder."),
                                       (h[None], m[None]))
        logits = Recommender.score(u, c[None])[0]
        return nn.functional.cross_entropy(logits[None], label[None])

    per_client = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0, 0, 0))(
        params, hist, mask, cand, labels)
    names = list(params)
    for i in range(2):
        leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        direct = loss(leaves, {k: v[i] for k, v in hist.items()}, mask[i],
                      {k: v[i] for k, v in cand.items()}, labels[i])
        grads = torch.autograd.grad(direct, [leaves[k] for k in names], allow_unused=True)
        for name, g in zip(names, grads):
            expected = torch.zeros_like(params[name]) if g is None else g
            assert torch.allclose(per_client[name][i], expected, atol=1e-6), name
    # client 2's history is empty (all r0): its gradient reaches the trained e0
    pad = "news_encoder.embedding.pad"
    assert per_client[pad][1].abs().sum() > 0
    assert not torch.allclose(per_client[pad][0], per_client[pad][1])


def test_corpus_embeddings_are_fitted_on_the_training_news_only() -> None:
    from privaterec.data.corpus_vectors import corpus_word_vectors

    config, vocabs, features = _setup(embeddings="corpus")
    table = build_recommender(config, vocabs, features).news_encoder.embedding.weight
    expected = corpus_word_vectors(torch.cat([features.title, features.abstract], dim=1)[1:],
                                   len(vocabs.words), config.resolved_word_dim)
    assert not table.requires_grad and torch.equal(table.detach()[1:], expected[1:])
    # a news outside the training vocabulary (news_index 1: unseen) does not enter the fit
    unseen = build_news_features([*NEWS, NewsRecord("T1", "sports", "sub0", "king football",
                                                   "queen trade")], vocabs,
                                 title_len=config.title_len, abstract_len=config.abstract_len)
    assert int(unseen.news_index[-1]) == 1
    again = build_recommender(config, vocabs, unseen).news_encoder.embedding.weight
    assert torch.equal(again, table)


def test_corpus_embeddings_without_features_are_a_placeholder_a_checkpoint_fills() -> None:
    config, vocabs, features = _setup(embeddings="corpus")
    trained = build_recommender(config, vocabs, features)
    with pytest.raises(ConfigError, match="fitted on the news texts"):
        build_recommender(config, vocabs)
    rebuilt = build_recommender(config, vocabs, for_checkpoint=True)
    assert torch.equal(rebuilt.news_encoder.embedding.weight[1:],
                       torch.zeros(len(vocabs.words) - 1, config.resolved_word_dim))
    rebuilt.load_state_dict(trained.state_dict())
    assert torch.equal(rebuilt.news_encoder.embedding.weight,
                       trained.news_encoder.embedding.weight)
