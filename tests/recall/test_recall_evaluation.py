"""Recall evaluation: recalled sets, recall@K by hand and by brute force, leakage, AUC, events."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import numpy as np
import pytest
import torch

from privaterec.data.features import NewsFeatures
from privaterec.data.records import Impression, MindSplit, NewsRecord
from privaterec.errors import ConfigError
from privaterec.recall.evaluate import (evaluate_recall, query_generator, recall_users,
                                    recalled_sets)
from privaterec.privacy.ledger import PrivacyLedger
from privaterec.recall.model import UniFedRecRecall

T0 = datetime(2019, 11, 15, 9, 0, 0)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def table(n: int) -> NewsFeatures:
    """A news table with rows 0 (anonymous), N1 … N{n-1}; only the id → row map matters."""
    zeros = torch.zeros(n, dtype=torch.long)
    return NewsFeatures(["<pad>", *[f"N{i}" for i in range(1, n)]], title=zeros[:, None],
                        abstract=zeros[:, None], category=zeros, subcategory=zeros,
                        news_index=zeros)


def split_of(rows: list[tuple[str, int, tuple, tuple, tuple]], n: int) -> MindSplit:
    news = {f"N{i}": NewsRecord(f"N{i}", "c", "s", f"t{i}", "") for i in range(1, n)}
    behaviors = [Impression(str(i), user, T0 + timedelta(hours=h), hist, cands, labels)
                 for i, (user, h, hist, cands, labels) in enumerate(rows)]
    return MindSplit(news=news, behaviors=behaviors)


class MeanRanker(torch.nn.Module):
    """A ranking model whose user vector is the mean of the real clicks (with a dropout
    that would scramble the scores if the evaluation did not switch to eval mode)."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = torch.nn.Dropout(0.9)

    def encode_user(self, vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.unsqueeze(-1).float()
        return self.drop((vectors * m).sum(1) / m.sum(1).clamp_min(1))


# ------------------------------------------------------------------------ recalled sets
def test_recalled_sets_by_hand():
    rankings = [np.array([10, 11, 12, 13, 14]), np.array([11, 20, 21, 22, 23])]
    # R = 5: quotas 0.6/0.4 -> 3 and 2; channel 0 first takes 10, 11, 12; channel 1 skips 11.
    # R = 3: 1.8/1.2 -> 1 + 1 = 2, the remaining one to the larger remainder (0.8): 2 and 1.
    # R = 1: 0.6/0.4 -> 0 and 0, the remainder to channel 0.
    five, three, one = recalled_sets(rankings, np.array([0.6, 0.4]), [5, 3, 1])
    assert five.tolist() == [10, 11, 12, 20, 21]
    assert three.tolist() == [10, 11, 20]
    assert one.tolist() == [10]
    # the larger channel is served first even when listed second
    (out,) = recalled_sets(rankings[::-1], np.array([0.4, 0.6]), [5])
    assert out.tolist() == [10, 11, 12, 20, 21]


# --------------------------------------------------------------- recall@K by hand (YoutubeNet)
VECTORS = torch.tensor([[0.0, 0.0],    # row 0, anonymous
                        [1.0, 0.0],    # N1
                        [0.0, 0.8],    # N2
                        [2.0, 2.0],    # N3
                        [1.0, -1.0],   # N4
                        [0.1, 0.3],    # N5
                        [-1.0, -1.0]])  # N6


def hand_split() -> MindSplit:
    return split_of([
        # user A: history N1, N2 -> mean (0.5, 0.4); scores N3 1.8, N1 0.5, N2 0.32,
        # N5 0.17, N4 0.1, N6 -0.9. Future clicks N3, N4.
        ("A", 0, ("N1", "N2"), ("N3", "N4", "N6"), (1, 1, 0)),
        # user B: history N6 -> scores N6 2, N4 0, N5 -0.4, N2 -0.8, N1 -1, N3 -4. Clicks N5.
        ("B", 1, ("N6",), ("N5", "N1"), (1, 0)),
        ("A", 2, ("N1", "N2", "N4"), ("N2", "N6"), (0, 0)),  # later, no click: single class
    ], 7)


def test_youtubenet_recall_at_k_by_hand():
    ledger = PrivacyLedger()
    ranker = MeanRanker().train()
    out = evaluate_recall(hand_split(), table(7), VECTORS, method="youtubenet", history_len=3,
                          ks=(1, 2, 3, 5), ranker=ranker, auc_recall_size=2, ledger=ledger)
    assert ranker.training  # restored
    # A: recalled N3 | N3 N1 | N3 N1 N2 | + N5 N4; B: N6 | N6 N4 | + N5 | + N2 N1
    assert out["future_recall@1"] == pytest.approx((1 / 2 + 0) / 2)
    assert out["future_recall@2"] == pytest.approx((1 / 2 + 0) / 2)
    assert out["future_recall@3"] == pytest.approx((1 / 2 + 1) / 2)
    assert out["future_recall@5"] == pytest.approx(1.0)
    assert out["history_recall@1"] == pytest.approx((0 + 1) / 2)
    assert out["history_recall@2"] == pytest.approx((1 / 2 + 1) / 2)
    assert out["history_recall@3"] == pytest.approx(1.0)
    # AUC with R = 2. A's first impression: only N3 recalled -> N3 1.8 above the tied
    # N4/N6: pairs (N3, N6) = 1, (N4, N6) = 1/2 -> 0.75. B: N6, N4 recalled, neither
    # candidate -> all tied -> 0.5. A's second impression has no click: left out.
    assert out["auc"] == pytest.approx((0.75 + 0.5) / 2)
    assert (out["auc_impressions"], out["single_class_impressions"]) == (2, 1)
    # R = 6 (the whole pool): plain ranker AUC. A: N3 1.8, N4 0.1 > N6 -0.9; B: N5 -0.4 >
    # N1 -1 -> both 1 (a dropout left on would zero the user vectors and tie everything).
    whole = evaluate_recall(hand_split(), table(7), VECTORS, method="youtubenet",
                            history_len=3, ks=(1,), ranker=ranker, auc_recall_size=6)
    assert whole["auc"] == 1.0
    assert (out["users"], out["future_users"], out["history_users"]) == (2, 2, 2)
    assert out["pool_size"] == 6
    for user in ("A", "B"):
        ((event, count),) = out["events"][user]
        assert count == 1 and not event.is_private and event.dimension == 2
        assert ledger.events(user) == out["events"][user]


def test_relevant_news_outside_the_pool_are_dropped_and_counted():
    pool = torch.tensor([1, 2, 3, 5, 6])  # N4 not in the pool
    out = evaluate_recall(hand_split(), table(7), VECTORS, method="youtubenet", history_len=3,
                          ks=(1, 3), pool_rows=pool)
    # A's future clicks in the pool: N3 only (recalled first). B: without N4 the ranking is
    # N6 2, N5 -0.4, N2 -0.8, ... so N5 is second.
    assert out["future_outside_pool"] == 1
    assert out["future_recall@1"] == pytest.approx((1 + 0) / 2)
    assert out["future_recall@3"] == pytest.approx((1 + 1) / 2)
    assert math.isnan(out["auc"])


def test_recall_users_groups_by_user_with_the_earliest_history():
    users = recall_users(hand_split(), table(7), history_len=3)
    assert users.user_ids == ["A", "B"]
    assert users.history[0].tolist() == [0, 1, 2] and users.history_mask[0].tolist() == [
        False, True, True]
    assert users.future[0].tolist() == [3, 4] and users.future[1].tolist() == [5]
    assert len(users.impressions[0]) == 2


# ---------------------------------------------------------------- exact search = brute force
def random_problem(users: int = 30, news: int = 60, d: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    vectors = torch.from_numpy(rng.normal(size=(news + 1, d)).astype(np.float32))
    rows = []
    for u in range(users):
        hist = tuple(f"N{i}" for i in rng.choice(np.arange(1, news + 1),
                                                 size=int(rng.integers(0, 6)), replace=False))
        cands = tuple(f"N{i}" for i in rng.choice(np.arange(1, news + 1), size=6,
                                                  replace=False))
        rows.append((f"U{u:02d}", u, hist, cands, (1, 1, 0, 0, 0, 0)))
    return vectors, split_of(rows, news + 1), table(news + 1)


def brute_force(scores: np.ndarray, relevant: list[np.ndarray], ks) -> dict[int, float]:
    """Mean over users with relevant news of |top-K ∩ relevant| / |relevant| (pool = rows
    1..N, argsort in float64)."""
    out = {}
    for k in ks:
        values = []
        for s, rel in zip(scores, relevant):
            if rel.size:
                top = np.argsort(-s, kind="stable")[:k] + 1
                values.append(np.isin(rel, top).mean())
        out[k] = float(np.mean(values))
    return out


def test_youtubenet_exact_search_equals_numpy_brute_force():
    vectors, split, features = random_problem()
    users = recall_users(split, features, history_len=4)
    v = vectors.double().numpy()
    means = []
    for rows, mask in zip(users.history.numpy(), users.history_mask.numpy()):
        means.append(v[rows[mask]].mean(0) if mask.any() else v[rows].mean(0))
    scores = np.stack(means) @ v[1:].T
    histories = [np.unique(r[m]) for r, m in zip(users.history.numpy(),
                                                  users.history_mask.numpy())]
    ks = (1, 5, 10, 30)
    out = evaluate_recall(split, features, vectors, method="youtubenet", history_len=4, ks=ks,
                          batch_size=7)
    future = brute_force(scores, users.future, ks)
    history = brute_force(scores, histories, ks)
    for k in ks:
        assert out[f"future_recall@{k}"] == pytest.approx(future[k], abs=1e-12)
        assert out[f"history_recall@{k}"] == pytest.approx(history[k], abs=1e-12)
    assert out["history_users"] == sum(h.size > 0 for h in histories) < out["users"]


def make_model(**kwargs) -> UniFedRecRecall:
    torch.manual_seed(0)
    options = dict(num_heads=2, head_dim=4, attention_dim=5, num_basis=6, max_channels=1)
    options.update(kwargs)
    return UniFedRecRecall(8, **options).eval()


def test_single_channel_methods_equal_brute_force():
    vectors, split, features = random_problem(seed=1)
    model = make_model()
    users = recall_users(split, features, history_len=4)
    h = vectors[users.history]
    with torch.no_grad():
        ids = model.channels(h, users.history_mask).channel_ids
        r = model.interests(model.context(h, users.history_mask), ids)[:, 0]  # [U, d]
        alpha = torch.softmax((r @ model.interest.keys.T).clamp(-0.2, 0.2), dim=-1)
        r_hat = alpha @ model.interest.values
    ks = (1, 5, 20)
    pool = vectors[1:].double().numpy()
    for method, user_vectors in (("no-bie", r), ("unifedrec", r_hat)):
        out = evaluate_recall(split, features, vectors, method=method, model=model,
                              history_len=4, ks=ks, serve_noise=False)
        expected = brute_force(user_vectors.double().numpy() @ pool.T, users.future, ks)
        for k in ks:
            assert out[f"future_recall@{k}"] == pytest.approx(expected[k], abs=1e-12), method


# ------------------------------------------------------------------- Uni-FedRec queries
def test_history_recall_is_one_when_the_pool_is_recalled_entirely():
    vectors, split, features = random_problem(users=12, news=25, seed=2)
    model = make_model(max_channels=3, distance_threshold=0.5)
    pool_rows = torch.arange(1, 26)
    out = evaluate_recall(split, features, vectors, method="unifedrec", model=model,
                          history_len=5, ks=(3, 25, 40), pool_rows=pool_rows, seed=4)
    assert out["history_recall@25"] == 1.0 and out["history_recall@40"] == 1.0
    assert out["future_recall@25"] == 1.0 and out["future_recall@40"] == 1.0
    assert out["history_recall@3"] < 1.0
    assert out["history_users"] == sum(1 for imp in split.behaviors if imp.history)


def test_unifedrec_events_and_seeded_queries():
    vectors, split, features = random_problem(users=10, news=40, seed=3)
    model = make_model(max_channels=3, distance_threshold=0.5)
    ks = (5, 10)
    first = evaluate_recall(split, features, vectors, method="unifedrec", model=model,
                            history_len=5, ks=ks, seed=1)
    again = evaluate_recall(split, features, vectors, method="unifedrec", model=model,
                            history_len=5, ks=ks, seed=1, batch_size=3)
    assert math.isnan(first["auc"])  # no ranker
    assert {k: v for k, v in first.items() if k not in ("events", "auc")} == \
        {k: v for k, v in again.items() if k not in ("events", "auc")}
    clean = evaluate_recall(split, features, vectors, method="unifedrec", model=model,
                            history_len=5, ks=ks, serve_noise=False)
    channels = model.channels(vectors[recall_users(split, features, history_len=5).history],
                              recall_users(split, features, history_len=5).history_mask)
    for u, user in enumerate(sorted(first["events"])):
        (channel, count), (quota, one) = first["events"][user]
        assert count == int(channels.num_channels[u]) and one == 1
        assert channel.epsilon == pytest.approx(2 * 0.2 * 6 / 1.2)
        assert not quota.is_private  # quotas in the clear (the paper)
        assert not clean["events"][user][0][0].is_private
    noised = evaluate_recall(split, features, vectors, method="unifedrec", model=model,
                             history_len=5, ks=ks, quota_noise_scale=0.5)
    (channel, count), (quota, _) = noised["events"]["U00"]
    assert count == 3 and quota.epsilon == pytest.approx(4.0)
    g1, g2 = query_generator(1, 3), query_generator(1, 3)
    assert torch.equal(torch.rand(4, generator=g1), torch.rand(4, generator=g2))
    assert not torch.equal(torch.rand(4, generator=query_generator(1, 3)),
                           torch.rand(4, generator=query_generator(1, 4)))


def test_invalid_arguments():
    vectors, split, features = random_problem(users=3, news=10)
    with pytest.raises(ConfigError, match="method"):
        evaluate_recall(split, features, vectors, method="octopus", history_len=3)
    with pytest.raises(ConfigError, match="model"):
        evaluate_recall(split, features, vectors, method="unifedrec", history_len=3)
    with pytest.raises(ConfigError, match="ks"):
        evaluate_recall(split, features, vectors, method="youtubenet", history_len=3, ks=(0,))
    with pytest.raises(ConfigError, match="news_vectors"):
        evaluate_recall(split, features, vectors[:5], method="youtubenet", history_len=3)
    with pytest.raises(ConfigError, match="pool_rows"):
        evaluate_recall(split, features, vectors, method="youtubenet", history_len=3,
                        pool_rows=torch.tensor([1, 1, 2]))
