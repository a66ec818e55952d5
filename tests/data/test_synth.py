"""Tests of the synthetic MIND generator (DESIGN §8): format, determinism, temporal split,
statistics, planted structure and the proxy AUCs (oracle > content > popularity)."""

from __future__ import annotations

import math
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from privaterec.data.mind import load_dataset, read_news
from privaterec.data.records import MindDataset
from privaterec.data.synth import (
    SynthConfig,
    _oracle_scores,
    _simulate,
    generate,
    summarize,
    write_synthetic,
)
from privaterec.data.text import tokenize
from privaterec.errors import ConfigError

SMALL = SynthConfig(users=150, news=500, topics=5, subtopics_per_topic=3, days=5, test_days=1,
                    history_days=5, seed=3)
MIND_FRAGMENT_NEWS = Path("/work/shared/data/mind-fragments/news.tsv")


# ------------------------------------------------------------------------------- proxies
def _auc(labels, scores) -> float:
    """Rank-based AUC (Mann-Whitney U), ties counted 1/2."""
    labels = np.asarray(labels)
    scores = np.asarray(scores, dtype=float)
    pos, neg = scores[labels == 1], scores[labels == 0]
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(pos) * len(neg)))


def _mean_auc(behaviors, score) -> float:
    """MIND's AUC: mean over impressions of the per-impression AUC."""
    return float(np.mean([_auc(b.labels, score(b)) for b in behaviors]))


def _popularity_auc(dataset: MindDataset) -> float:
    """Score = number of clicks of the news in the train split (0 when unseen)."""
    clicks = Counter(n for b in dataset.train.behaviors for n in b.clicked)
    return _mean_auc(dataset.test.behaviors, lambda b: [clicks[n] for n in b.candidates])


def _cosine(a: Counter, b: Counter) -> float:
    dot = sum(v * b[k] for k, v in a.items())
    norm = math.sqrt(sum(v * v for v in a.values()) * sum(v * v for v in b.values()))
    return dot / norm if norm else 0.0


def _content_auc(dataset: MindDataset) -> float:
    """Score = cosine of the candidate's title bag of words and the user's history titles'."""
    news = dataset.all_news()
    bags = {n: Counter(tokenize(r.title)) for n, r in news.items()}
    users: dict[str, Counter] = {}

    def score(b):
        if b.user_id not in users:
            users[b.user_id] = sum((bags[h] for h in b.history), Counter())
        return [_cosine(bags[n], users[b.user_id]) for n in b.candidates]

    return _mean_auc(dataset.test.behaviors, score)


def test_auc_helper_matches_hand_computed_values():
    assert _auc([1, 0, 0], [0.9, 0.5, 0.1]) == 1.0
    assert _auc([1, 0, 0], [0.5, 0.9, 0.1]) == 0.5
    assert _auc([0, 1, 1, 0], [0.1, 0.1, 0.3, 0.4]) == pytest.approx((0.5 + 0 + 1 + 0) / 4)


# ------------------------------------------------------------------------------- config
def test_default_config_is_valid():
    config = SynthConfig()
    assert (config.users, config.news, config.days, config.test_days) == (2000, 3000, 8, 1)


@pytest.mark.parametrize("kwargs, name", [
    ({"users": 0}, "users"),
    ({"news": -5}, "news"),
    ({"users": 2.5}, "users"),
    ({"topics": True}, "topics"),
    ({"days": 3, "test_days": 3}, "test_days"),
    ({"min_candidates": 1}, "min_candidates"),
    ({"min_candidates": 20, "max_candidates": 10}, "max_candidates"),
    ({"min_history": 30, "max_history": 20}, "max_history"),
    ({"min_lifetime": 0}, "min_lifetime"),
    ({"impressions_per_user": 0.5}, "impressions_per_user"),
    ({"noise_scale": 0.0}, "noise_scale"),
    ({"topic_concentration": -1.0}, "topic_concentration"),
    ({"affinity_weight": float("nan")}, "affinity_weight"),
    ({"popularity_weight": -0.1}, "popularity_weight"),
    ({"title_noise": 1.0}, "title_noise"),
    ({"two_click_prob": 1.5}, "two_click_prob"),
    ({"start_date": "2019-13-01"}, "start_date"),
    ({"seed": -1}, "seed"),
])
def test_invalid_config_names_the_parameter(kwargs, name):
    with pytest.raises(ConfigError, match=f"'{name}'"):
        SynthConfig(**kwargs)


def test_too_few_news_for_histories_is_a_config_error():
    with pytest.raises(ConfigError, match="history_days"):
        generate(SynthConfig(users=5, news=20, history_days=1, days=2))


# ------------------------------------------------------------------------------- determinism
def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.tsv"))}


def test_same_seed_gives_byte_identical_files_and_another_seed_does_not(tmp_path):
    write_synthetic(tmp_path / "a", SMALL)
    write_synthetic(tmp_path / "b", SMALL)
    write_synthetic(tmp_path / "c", SynthConfig(**{**SMALL.__dict__, "seed": 4}))
    a, b, c = _files(tmp_path / "a"), _files(tmp_path / "b"), _files(tmp_path / "c")
    assert set(a) == {"train/news.tsv", "train/behaviors.tsv", "test/news.tsv",
                      "test/behaviors.tsv"}
    assert a == b
    assert a["train/behaviors.tsv"] != c["train/behaviors.tsv"]


def test_written_files_read_back_to_the_generated_dataset(tmp_path):
    summary = write_synthetic(tmp_path, SMALL)
    expected = generate(SMALL)
    loaded = load_dataset(tmp_path)
    for name in ("train", "test"):
        got, want = getattr(loaded, name), getattr(expected, name)
        assert got.behaviors == want.behaviors
        assert got.news == want.news
        assert summary[name]["impressions"] == len(want.behaviors)
    first = (tmp_path / "train" / "behaviors.tsv").read_text().splitlines()[0].split("\t")
    assert len(first) == 5
    assert datetime.strptime(first[2], "%m/%d/%Y %I:%M:%S %p") == expected.train.behaviors[0].time


# ------------------------------------------------------------------------------- structure
def test_temporal_split():
    data = generate(SMALL)
    start = datetime(2019, 11, 9)
    boundary = start + timedelta(days=SMALL.days - SMALL.test_days)
    train_times = [b.time for b in data.train.behaviors]
    test_times = [b.time for b in data.test.behaviors]
    assert train_times and test_times
    assert max(train_times) < boundary <= min(test_times)
    assert min(train_times) >= start and max(test_times) < start + timedelta(days=SMALL.days)
    assert train_times == sorted(train_times) and test_times == sorted(test_times)
    ids = [int(b.impression_id) for b in data.train.behaviors + data.test.behaviors]
    assert ids == list(range(1, len(ids) + 1))


def test_every_referenced_news_is_present_and_only_those():
    data = generate(SMALL)
    for split in (data.train, data.test):
        referenced = {n for b in split.behaviors for n in (*b.history, *b.candidates)}
        assert referenced == set(split.news)


def test_impressions_and_histories_follow_the_stated_shapes():
    config = SynthConfig(**{**SMALL.__dict__, "two_click_prob": 0.3})
    data, latent = _simulate(config)
    behaviors = data.train.behaviors + data.test.behaviors
    sizes = np.array([len(b.candidates) for b in behaviors])
    clicks = np.array([sum(b.labels) for b in behaviors])
    assert sizes.min() >= config.min_candidates and sizes.max() <= config.max_candidates
    assert set(clicks) == {1, 2}
    # two clicks with probability 0.3 (binomial standard error ≈ 0.01 for ~750 impressions)
    assert abs((clicks == 2).mean() - 0.3) < 0.05
    assert all(len(set(b.candidates)) == len(b.candidates) for b in behaviors)

    start = datetime(2019, 11, 9)
    histories: dict[str, tuple[str, ...]] = {}
    for b in behaviors:
        assert histories.setdefault(b.user_id, b.history) == b.history  # constant per user
        assert config.min_history <= len(b.history) <= config.max_history
        assert not set(b.history) & set(b.candidates)
        seconds = (b.time - start).total_seconds()
        for n in b.candidates:  # every candidate is alive when shown
            row = latent.news_row[n]
            assert latent.publish[row] <= seconds < latent.expire[row]
        for n in b.history:  # histories are clicks from before the logged period
            assert latent.expire[latent.news_row[n]] <= 0
        publish = [latent.publish[latent.news_row[n]] for n in b.history]
        assert publish == sorted(publish)
    assert len(histories) == config.users  # every user has at least one impression
    lifetimes = (latent.expire - latent.publish) / 86_400
    assert set(np.round(lifetimes).astype(int)) == {1, 2, 3}


def test_summary_statistics_of_a_small_config_are_in_range():
    summary = summarize(generate(SMALL))
    assert summary["users"] == SMALL.users
    assert summary["categories"] == SMALL.topics
    assert summary["subcategories"] == SMALL.topics * SMALL.subtopics_per_topic
    assert abs(summary["title_length_mean"] - SMALL.title_length) < 1.0
    assert abs(summary["abstract_length_mean"] - (SMALL.abstract_length + 1)) < 1.5  # + "."
    impressions = summary["train"]["impressions"] + summary["test"]["impressions"]
    assert 0.8 * SMALL.impressions_per_user < impressions / SMALL.users \
        < 1.2 * SMALL.impressions_per_user
    assert 23 <= summary["train"]["candidates_mean"] <= 27  # uniform on 10..40
    assert 1.1 <= summary["train"]["clicks_per_impression_mean"] <= 1.3  # 1 + 0.2
    quantiles = summary["history_length_quantiles"]
    assert quantiles[0] >= 10 and quantiles[100] <= 50 and 15 <= quantiles[50] <= 28
    assert summary["test_users_seen_in_train"] > 0.9


def test_topics_and_subtopics_have_their_own_vocabularies():
    # Without filler words, title words of different categories are disjoint; with only
    # subtopic words, those of different subcategories are disjoint too.
    for kwargs, key in (({"title_noise": 0.0}, "category"),
                        ({"title_noise": 0.0, "subtopic_share": 1.0}, "subcategory")):
        data = generate(SynthConfig(**{**SMALL.__dict__, **kwargs}))
        words: dict[str, set[str]] = {}
        for record in data.all_news().values():
            words.setdefault(getattr(record, key), set()).update(tokenize(record.title))
        groups = list(words.values())
        assert len(groups) > 1
        for i, a in enumerate(groups):
            for b in groups[i + 1:]:
                assert not a & b
    # With the default title noise, ≈ 20% of title words are shared filler words.
    data = generate(SMALL)
    categories_of: dict[str, set[str]] = {}
    tokens = []
    for record in data.all_news().values():
        for token in tokenize(record.title):
            categories_of.setdefault(token, set()).add(record.category)
            tokens.append(token)
    shared = np.mean([len(categories_of[t]) > 1 for t in tokens])
    assert 0.12 < shared < 0.21


def test_popularity_is_skewed():
    data = generate(SynthConfig(users=1000, news=1500, seed=1))
    clicks = Counter(n for b in data.train.behaviors for n in b.clicked)
    counts = np.sort(np.array(list(clicks.values())))[::-1]
    top_decile_share = counts[: len(counts) // 10].sum() / counts.sum()
    assert top_decile_share > 0.25  # uniform clicks would give ≈ 0.1 (MIND-like skew)


def test_clicks_follow_the_softmax_choice_model():
    # For a one-click multinomial-logit choice with p = softmax(utility / noise_scale), the
    # expected probability of the clicked item is E[Σ p_i²]. A wrong temperature (e.g. the
    # noise scale ignored) breaks the equality.
    config = SynthConfig(users=600, news=1200, two_click_prob=0.0, noise_scale=1.5, seed=2)
    data, latent = _simulate(config)
    clicked_p, expected_p, wrong_p = [], [], []
    for b in data.train.behaviors:
        utility = _oracle_scores(latent, b)
        for temperature, out in ((config.noise_scale, None), (1.0, wrong_p)):
            p = np.exp((utility - utility.max()) / temperature)
            p /= p.sum()
            if out is None:
                clicked_p.append(p[b.labels.index(1)])
                expected_p.append((p * p).sum())
            else:
                out.append(p[b.labels.index(1)] - (p * p).sum())
    assert abs(np.mean(clicked_p) - np.mean(expected_p)) < 0.01
    assert abs(np.mean(wrong_p)) > 0.02


def test_without_affinity_content_carries_no_signal():
    # Clicks uniformly random among the candidates: no score can beat chance. (Popularity is
    # switched off too: with few very popular news, topic and popularity can correlate by
    # chance, which moves a content score's AUC away from 0.5 at the level of news.)
    config = SynthConfig(users=600, news=1200, affinity_weight=0.0, popularity_weight=0.0,
                         seed=5)
    assert abs(_content_auc(generate(config)) - 0.5) < 0.03


def test_proxy_aucs_are_ordered_oracle_content_popularity():
    config = SynthConfig(users=1000, news=1500, seed=0)
    data, latent = _simulate(config)
    oracle = _mean_auc(data.test.behaviors, lambda b: _oracle_scores(latent, b))
    content = _content_auc(data)
    popularity = _popularity_auc(data)
    assert 0.88 <= oracle <= 0.97
    assert oracle > content + 0.1
    assert content >= 0.68
    assert content > popularity + 0.05
    assert popularity >= 0.5


# ------------------------------------------------------------------------------- real news
@pytest.mark.skipif(not MIND_FRAGMENT_NEWS.exists(), reason="mind-fragments not available")
def test_news_pool_mode_uses_the_real_news(tmp_path):
    pool = read_news(MIND_FRAGMENT_NEWS)
    config = SynthConfig(users=200, seed=7)
    data, latent = _simulate(config, news_pool=pool)
    for split in (data.train, data.test):
        assert split.behaviors
        for news_id, record in split.news.items():
            assert record == pool[news_id]  # text, categories, ids kept
        referenced = {n for b in split.behaviors for n in (*b.history, *b.candidates)}
        assert referenced == set(split.news)
    # affinity cells are the real (category, subcategory) pairs
    assert latent.affinity.shape[1] == len({(r.category, r.subcategory) for r in pool.values()})
    assert max(b.time for b in data.train.behaviors) < min(b.time for b in data.test.behaviors)
    write_synthetic(tmp_path / "a", config, news_pool=pool)
    write_synthetic(tmp_path / "b", config, news_pool=pool)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    oracle = _mean_auc(data.test.behaviors, lambda b: _oracle_scores(latent, b))
    assert oracle > 0.8


def test_news_pool_needs_two_news():
    with pytest.raises(ConfigError, match="news"):
        generate(SMALL, news_pool={})
