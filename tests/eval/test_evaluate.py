"""Evaluation loop: equals a naive per-impression computation, encodes each news once."""

from __future__ import annotations

import random
from datetime import datetime

import numpy as np
import pytest
import torch
from torch import nn

from privaterec.data.features import NewsFeatures
from privaterec.data.history import history_rows
from privaterec.data.records import Impression, MindSplit
from privaterec.errors import DataFormatError
from privaterec.eval.evaluate import evaluate_model, score_impressions
from privaterec.eval.metrics import evaluate_impressions
from privaterec.models.recommender import Recommender

VOCAB, TITLE_LEN, DIM, NUM_NEWS, H = 40, 6, 8, 30, 5
T0 = datetime(2019, 11, 14, 9, 0, 0)


class CountingNewsEncoder(nn.Module):
    """Mean of non-padding word embeddings → linear → tanh, with dropout (off in eval mode).

    Records the ``news_index`` of every row it encodes (the test table sets it to the row).
    """

    def __init__(self) -> None:
        super().__init__()
        self.dim = DIM
        self.embedding = nn.Embedding(VOCAB, DIM, padding_idx=0)
        self.proj = nn.Linear(DIM, DIM)
        self.dropout = nn.Dropout(0.5)
        self.seen: list[torch.Tensor] = []

    def forward(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        self.seen.append(features["news_index"].clone())
        title = features["title"]  # [n, L]
        words = self.dropout(self.embedding(title))  # [n, L, d]
        count = (title != 0).sum(dim=1, keepdim=True).clamp(min=1)
        return torch.tanh(self.proj(words.sum(dim=1) / count))  # [n, d]


class PositionalAttentionUser(nn.Module):
    """Masked additive attention with a per-position bias (so alignment matters)."""

    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Parameter(torch.randn(DIM))
        self.position = nn.Parameter(torch.randn(H))
        self.out = nn.Linear(DIM, DIM)

    def forward(self, vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logits = vectors @ self.query + self.position[-vectors.shape[1]:]  # [b, H]
        any_real = mask.any(dim=1, keepdim=True)
        logits = logits.masked_fill(~mask & any_real, float("-inf"))
        weights = torch.softmax(logits, dim=1)
        return self.out((weights.unsqueeze(-1) * vectors).sum(dim=1))  # [b, d]


def make_features() -> NewsFeatures:
    gen = torch.Generator().manual_seed(1)
    title = torch.randint(1, VOCAB, (NUM_NEWS, TITLE_LEN), generator=gen)
    title[:, 4:] = torch.where(torch.rand(NUM_NEWS, 2, generator=gen) < 0.5, 0, title[:, 4:])
    title[0] = 0  # row 0: the anonymous all-padding news
    return NewsFeatures(
        news_ids=["<pad>", *(f"N{i}" for i in range(1, NUM_NEWS))], title=title,
        abstract=torch.zeros(NUM_NEWS, 3, dtype=torch.long),
        category=torch.zeros(NUM_NEWS, dtype=torch.long),
        subcategory=torch.zeros(NUM_NEWS, dtype=torch.long),
        news_index=torch.arange(NUM_NEWS))


def make_split() -> MindSplit:
    """23 labelled impressions over N1..N28 (incl. single-class ones), 1 unlabelled on N29."""
    rng = random.Random(7)
    pool = [f"N{i}" for i in range(1, NUM_NEWS - 1)]
    behaviors = []
    for i in range(23):
        history = tuple(rng.sample(pool, rng.randint(0, 12)))
        candidates = tuple(rng.sample(pool, rng.randint(2, 8)))
        labels = [rng.randint(0, 1) for _ in candidates]
        if i == 3:
            labels = [0] * len(candidates)
        if i == 4:
            labels = [1] * len(candidates)
        behaviors.append(Impression(str(i + 1), f"U{i % 6}", T0, history, candidates,
                                    tuple(labels)))
    behaviors.insert(10, Impression("u", "U9", T0, ("N29",), ("N29", "N1"), None))
    return MindSplit(news={}, behaviors=behaviors)


def make_model() -> Recommender:
    torch.manual_seed(3)
    return Recommender(CountingNewsEncoder(), PositionalAttentionUser())


def naive_pairs(model: Recommender, split: MindSplit, features: NewsFeatures):
    """Reference: Recommender.forward on one impression at a time."""
    model.attach(features)
    model.eval()
    pairs = []
    with torch.no_grad():
        for imp in split.behaviors:
            if imp.labels is None:
                continue
            rows, mask = history_rows(imp.history, features, H)
            cands = torch.tensor(features.rows_of(imp.candidates))
            logits = model(rows[None], mask[None], cands[None])[0]
            pairs.append((np.array(imp.labels), logits.numpy()))
    return pairs


@pytest.fixture
def setup():
    return make_model(), make_split(), make_features()


def test_history_rows_right_aligned_and_truncated():
    features = make_features()
    rows, mask = history_rows(["N3", "N1", "N7"], features, 5)
    assert rows.tolist() == [0, 0, 3, 1, 7] and rows.dtype == torch.long
    assert mask.tolist() == [False, False, True, True, True] and mask.dtype == torch.bool
    rows, mask = history_rows(["N3", "N1", "N7"], features, 2)
    assert rows.tolist() == [1, 7] and mask.tolist() == [True, True]
    rows, mask = history_rows((), features, 3)
    assert rows.tolist() == [0, 0, 0] and mask.tolist() == [False, False, False]
    # Only the kept (most recent) ids are looked up.
    assert history_rows(["ghost", "N2"], features, 1)[0].tolist() == [2]
    with pytest.raises(KeyError, match="ghost"):
        history_rows(["N2", "ghost"], features, 2)
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError, match="history_len must be a positive integer"):
            history_rows(["N2"], features, bad)


def test_evaluate_model_equals_naive_reference(setup):
    model, split, features = setup
    model.train()
    result = evaluate_model(model, split, features, history_len=H, batch_size=4)
    assert model.training and model.news_encoder.dropout.training  # mode restored

    scored = score_impressions(model, split, features, history_len=H, batch_size=4)
    reference = naive_pairs(model, split, features)
    assert scored.unlabelled_impressions == 1
    assert scored.impression_ids == [str(i) for i in range(1, 24)]
    assert len(scored.pairs) == len(reference) == 23
    for (labels, scores), (ref_labels, ref_scores) in zip(scored.pairs, reference):
        np.testing.assert_array_equal(labels, ref_labels)
        np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-6)

    expected = evaluate_impressions(reference)
    for key in ("auc", "mrr", "ndcg@5", "ndcg@10"):
        assert result[key] == pytest.approx(expected[key], abs=1e-6)
    assert result["impressions"] == 23
    assert result["single_class_impressions"] == expected["single_class_impressions"] >= 2
    assert result["no_positive_impressions"] == expected["no_positive_impressions"] >= 1
    assert result["unlabelled_impressions"] == 1


@pytest.mark.parametrize("batch_size", [1, 4, 256])
def test_each_used_news_row_encoded_once(setup, batch_size):
    model, split, features = setup
    score_impressions(model, split, features, history_len=H, batch_size=batch_size)
    seen = model.news_encoder.seen
    assert all(len(chunk) <= batch_size for chunk in seen)
    rows = torch.cat(seen).tolist()
    assert len(rows) == len(set(rows))  # no row encoded twice

    used = set()
    for imp in split.behaviors:
        if imp.labels is not None:
            used.update(features.rows_of(imp.candidates))
            used.update(features.rows_of(imp.history[-H:]))
            if len(imp.history) < H:
                used.add(0)
    assert set(rows) == used
    assert features.row["N29"] not in used  # only in the unlabelled impression


def test_scores_do_not_depend_on_batch_size(setup):
    model, split, features = setup
    one = score_impressions(model, split, features, history_len=H, batch_size=1)
    many = score_impressions(model, split, features, history_len=H, batch_size=256)
    for (_, a), (_, b) in zip(one.pairs, many.pairs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_user_transform_seam(setup):
    model, split, features = setup
    base = score_impressions(model, split, features, history_len=H)
    shapes = []

    def double(user: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(user.shape))
        return 2 * user

    doubled = score_impressions(model, split, features, history_len=H, batch_size=10,
                                user_transform=double)
    assert shapes == [(10, DIM), (10, DIM), (3, DIM)]
    for (_, a), (_, b) in zip(base.pairs, doubled.pairs):
        np.testing.assert_allclose(b, 2 * a, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="user_transform must return a tensor of shape"):
        score_impressions(model, split, features, history_len=H,
                          user_transform=lambda u: u[:, :2])


def test_history_transform_seam(setup):
    model, split, features = setup
    zeroed = score_impressions(model, split, features, history_len=H,
                               history_transform=lambda v, m: (torch.zeros_like(v), m))
    # With all-zero clicked vectors every user vector is the output layer's bias.
    user = model.user_encoder.out.bias.detach()
    model.eval()
    for imp, (_, scores) in zip([b for b in split.behaviors if b.labels], zeroed.pairs):
        with torch.no_grad():
            cands = model.encode_features(features.select(
                torch.tensor(features.rows_of(imp.candidates))))
        np.testing.assert_allclose(scores, (cands @ user).numpy(), rtol=1e-5, atol=1e-6)


def test_missing_news_is_a_clear_error(setup):
    model, split, features = setup
    split.behaviors.append(Impression("x", "U1", T0, ("N1", "ghost1"), ("N2", "ghost2"), (1, 0)))
    with pytest.raises(DataFormatError, match=r"2 news ids used by 1 impressions are not in "
                                              r"the news feature table \(e.g. ghost1, ghost2\)"):
        evaluate_model(model, split, features, history_len=H)
    # A missing id outside the kept history window is never needed.
    split.behaviors[-1] = Impression("x", "U1", T0, ("ghost1",) + ("N1",) * H, ("N2", "N3"),
                                     (1, 0))
    assert evaluate_model(model, split, features, history_len=H)["impressions"] == 24


def test_invalid_inputs(setup):
    model, split, features = setup
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        evaluate_model(model, split, features, history_len=H, batch_size=0)
    with pytest.raises(ValueError, match="history_len must be a positive integer"):
        evaluate_model(model, split, features, history_len=0)
    bad = MindSplit(news={}, behaviors=[Impression("b", "U", T0, (), ("N1", "N2"), (1,))])
    with pytest.raises(DataFormatError, match="impression 'b' has 2 candidates and 1 labels"):
        evaluate_model(model, bad, features, history_len=H)
    unlabelled = MindSplit(news={}, behaviors=[Impression("u", "U", T0, (), ("N1",), None)])
    with pytest.raises(ValueError, match=r"no labelled impression .*1 unlabelled"):
        evaluate_model(model, unlabelled, features, history_len=H)


def test_progress_bars(setup, capsys):
    model, split, features = setup
    evaluate_model(model, split, features, history_len=H, progress=True)
    err = capsys.readouterr().err
    assert "encoding news" in err and "scoring impressions" in err
