"""Synthetic MIND-format data with a planted structure that content models can learn
(docs/data.md).

Generative model
----------------
*Time.* A logged period of ``days`` days starting at ``start_date`` 00:00, preceded by
``history_days`` days of *pre-period*. The last ``test_days`` days of the logged period form
the test split; everything before is train (a temporal split, like MIND).

*News.* ``news`` items are published uniformly over the ``history_days + days`` days, each alive
(shown in impressions) for a lifetime of ``min_lifetime``..``max_lifetime`` days. Each news has
a topic (= MIND category, with a readable name; topic shares mildly Zipf-skewed), a subtopic
(= subcategory; ``subtopics_per_topic`` per topic) and a latent popularity
``log π_n ~ N(0, popularity_sigma²)`` (lognormal popularity, so click counts are heavy-tailed).

*Text.* Every topic has its own vocabulary of ``topic_vocab`` pronounceable pseudo-words,
every subtopic a smaller one of ``subtopic_vocab`` words, and ``filler_vocab`` filler words
are shared by all news. A title has ``≈ title_length`` words (an abstract
``≈ abstract_length``): each word is a filler word with probability ``title_noise``, otherwise
a subtopic word with probability ``subtopic_share`` and a topic word else; inside each
vocabulary words are drawn with Zipf(1) frequencies. Word identity therefore carries the topic/subtopic signal that
a content model (NRMS, NAML, ...) can learn, diluted by the filler words.

*Users.* User ``u`` has sparse topic preferences ``θ_u ~ Dirichlet(topic_concentration · 1)``
(a small concentration gives 1–3 main topics) and, inside each topic ``t``, subtopic preferences
``φ_{u,t} ~ Dirichlet(subtopic_concentration · 1)``. The affinity of ``u`` to news ``n`` of
topic ``t`` and subtopic ``s`` is the log-probability of that (topic, subtopic) cell, mixed with
a small uniform background interest ``ε`` (so every cell keeps a finite affinity)::

    affinity(u, n) = log((1 - ε) θ_{u,t} φ_{u,t,s} + ε / cells)

*Clicks.* A multinomial-logit (random-utility) choice model, position-free::

    utility(u, n) = affinity_weight · affinity(u, n) + popularity_weight · log π_n
    clicked = top-k of utility + noise_scale · Gumbel noise

i.e. Plackett–Luce sampling without replacement from ``softmax(utility / noise_scale)``.

*Histories.* As in MIND, a user's history is the set of clicks made *before* the logged period:
``L_u`` (log-uniform in ``min_history..max_history``) news drawn by the same choice model from
all pre-period news whose lifetime ended before the period starts, listed in publication order.
The history is constant across the user's impressions, in both splits (MIND-like); a
candidate is therefore never in the history.

*Impressions.* Each user has ``1 + Poisson(impressions_per_user - 1)`` impressions at uniform
random times of the logged period. An impression shows ``min_candidates..max_candidates``
(uniform) news drawn uniformly among the news alive at that time, in random order; 1 of them
is clicked, 2 with probability ``two_click_prob`` (always leaving ≥ 1 non-clicked).

With ``news_pool`` (``--news-from news.tsv``) real news replace the synthetic ones: topics are
the real categories, subtopics the real (category, subcategory) pairs, the text is kept, and
only publication times, lifetimes, popularity, users and clicks are simulated.

Calibration (default config, seed 0, test split; mean per-impression AUC): oracle (true
noise-free utility) 0.936, affinity-only oracle (the ceiling of a text-only model, which cannot
see the latent popularity) 0.899, category counts of the history 0.819, TF-IDF cosine of
history and candidate titles 0.756, raw bag-of-words cosine 0.717, popularity = train click
count 0.571. Raise ``affinity_weight`` or lower ``noise_scale`` / ``title_noise`` for an easier
task.

Scale. :func:`write_synthetic` streams the behaviors to disk chunk by chunk
(:mod:`privaterec.data.synth_writer`), so memory holds O(users × (cells + history)) numbers
plus one chunk, never the data set's Python objects or a users × news matrix: 50,000 users
(MIND-small's population) take about 12 s and 160 MB, with 50,000 news too about 80 s and
210 MB (``benchmarks/synth_scale.py``, BENCHMARKS.md). The work that remains grows as
users × news: every history draws one Gumbel variate per pre-period news, every impression
one uniform key per alive news; both draws are kept so that every config's output stays
byte-identical to the files pinned by the tests.

References: the MIND dataset (Wu et al., ACL 2020) for the format and the temporal split;
McFadden's multinomial logit / the Gumbel-max trick for the choice model.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from privaterec.data.records import (
    Impression,
    MindDataset,
    MindSplit,
    NewsRecord,
)
from privaterec.data.synth_writer import (Histories, ImpressionChunk, corpus_summary,
                                          write_streaming)
from privaterec.errors import ConfigError

__all__ = ["SYNTH_FLAG_HELP", "SYNTH_PRESETS", "SynthConfig", "format_synth_summary",
           "generate", "write_synthetic", "summarize", "TOPIC_NAMES"]

SYNTH_PRESETS: dict[str, dict[str, int]] = {
    # MIND-small's population (Wu et al., ACL 2020): 50,000 users, 51,282 news.
    "mind-small": {"users": 50_000, "news": 51_000},
}
"""Named population sizes of ``data synth --preset`` (:class:`SynthConfig` fields; flags
given next to it override them)."""

SECONDS_PER_DAY = 86_400

# Readable topic names (MIND-small's categories first); topics beyond these are "topicK".
TOPIC_NAMES = ("news", "sports", "finance", "lifestyle", "health", "foodanddrink", "travel",
               "autos", "weather", "entertainment", "music", "movies", "tv", "video", "kids",
               "games", "science", "technology", "politics", "education")

_ONSETS = ("b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
           "z", "br", "cr", "dr", "fr", "gr", "pr", "tr", "st", "sh", "ch", "th", "pl", "bl",
           "cl", "sl")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ea")
_CODAS = ("", "", "", "n", "r", "s", "l", "m", "t")
_ZIPF_EXPONENT = 1.0
_BACKGROUND_INTEREST = 0.05  # ε of the affinity
_TOPIC_SHARE_EXPONENT = 0.5  # topic k gets a share ∝ 1 / (k + 1) ** 0.5 of the news


@dataclass(frozen=True)
class SynthConfig:
    """Parameters of the synthetic generator; validated on construction.

    Sizes: ``users``, ``news`` (total, pre-period included), ``topics``,
    ``subtopics_per_topic``, ``days`` (logged period, test included), ``test_days``,
    ``history_days`` (pre-period that histories are drawn from).

    Calibration knobs (see the module docstring for the model): ``affinity_weight``,
    ``popularity_weight``, ``noise_scale`` (Gumbel scale of the click noise),
    ``topic_concentration`` and ``subtopic_concentration`` (Dirichlet concentrations of user
    preferences, small = sparse), ``title_noise`` (fraction of filler words in titles and
    abstracts), ``subtopic_share`` (fraction of non-filler words from the subtopic vocabulary),
    ``popularity_sigma`` (spread of the lognormal latent popularity).

    Raises
    ------
    ConfigError
        Naming the parameter, when a value is out of range.
    """

    users: int = 2000
    news: int = 3000
    topics: int = 12
    days: int = 8
    test_days: int = 1
    seed: int = 0
    subtopics_per_topic: int = 4
    history_days: int = 7
    impressions_per_user: float = 5.0
    min_candidates: int = 10
    max_candidates: int = 40
    two_click_prob: float = 0.2
    min_history: int = 10
    max_history: int = 50
    min_lifetime: int = 1
    max_lifetime: int = 3
    title_length: float = 10.0
    abstract_length: float = 25.0
    topic_vocab: int = 40
    subtopic_vocab: int = 12
    filler_vocab: int = 500
    affinity_weight: float = 1.5
    popularity_weight: float = 0.8
    noise_scale: float = 1.0
    topic_concentration: float = 0.2
    subtopic_concentration: float = 0.5
    title_noise: float = 0.2
    subtopic_share: float = 0.4
    popularity_sigma: float = 1.2
    start_date: str = "2019-11-09"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "start_date":
                try:
                    date.fromisoformat(value)
                except (TypeError, ValueError):
                    _fail(f.name, f"got {value!r}, expected a date string YYYY-MM-DD")
            elif f.type == "int":
                if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                    _fail(f.name, f"got {value!r}, expected an integer")
            elif isinstance(value, bool) or not isinstance(value, (int, float, np.number)) \
                    or not math.isfinite(value):
                _fail(f.name, f"got {value!r}, expected a finite number")
        for name in ("users", "news", "topics", "subtopics_per_topic", "days", "test_days",
                     "history_days", "min_history", "min_lifetime", "topic_vocab",
                     "subtopic_vocab", "filler_vocab"):
            _require(self, getattr(self, name) >= 1, name, "expected an integer >= 1")
        _require(self, self.seed >= 0, "seed", "expected an integer >= 0")
        _require(self, self.test_days < self.days, "test_days",
                 f"expected fewer than days={self.days} so that a train period remains")
        _require(self, self.min_candidates >= 2, "min_candidates",
                 "expected >= 2 (an impression needs a clicked and a non-clicked candidate)")
        _require(self, self.max_candidates >= self.min_candidates, "max_candidates",
                 f"expected >= min_candidates={self.min_candidates}")
        _require(self, self.max_history >= self.min_history, "max_history",
                 f"expected >= min_history={self.min_history}")
        _require(self, self.max_lifetime >= self.min_lifetime, "max_lifetime",
                 f"expected >= min_lifetime={self.min_lifetime}")
        _require(self, self.impressions_per_user >= 1, "impressions_per_user",
                 "expected a mean >= 1 (every user has at least one impression)")
        for name in ("title_length", "abstract_length"):
            _require(self, getattr(self, name) >= 1, name, "expected a mean length >= 1 word")
        for name in ("noise_scale", "topic_concentration", "subtopic_concentration"):
            _require(self, getattr(self, name) > 0, name, "expected a positive number")
        for name in ("affinity_weight", "popularity_weight", "popularity_sigma"):
            _require(self, getattr(self, name) >= 0, name, "expected a number >= 0")
        for name in ("two_click_prob", "title_noise", "subtopic_share"):
            _require(self, 0 <= getattr(self, name) <= 1, name, "expected a probability in [0, 1]")
        _require(self, self.title_noise < 1, "title_noise",
                 "expected < 1 (titles made only of filler words carry no topic signal)")


def _fail(name: str, message: str) -> None:
    raise ConfigError(f"invalid configuration value '{name}' of SynthConfig: {message}")


def _require(config: "SynthConfig", condition: bool, name: str, expectation: str) -> None:
    if not condition:
        _fail(name, f"got {getattr(config, name)!r}, {expectation}")


# --------------------------------------------------------------------------------------------
# Latent state
# --------------------------------------------------------------------------------------------

@dataclass
class _Latent:
    """The hidden variables of one simulation (used by tests and diagnostics).

    ``affinity[u, c]``: affinity of user row ``u`` to (topic, subtopic) cell ``c``;
    ``news_cell[n]`` and ``log_popularity[n]`` per news row; ``news_ids[n]``; ``user_ids[u]``.
    """

    config: SynthConfig
    user_ids: list[str]
    news_ids: list[str]
    news_cell: np.ndarray
    cell_topic: np.ndarray
    log_popularity: np.ndarray
    affinity: np.ndarray
    publish: np.ndarray
    expire: np.ndarray
    user_row: dict[str, int] = field(default_factory=dict)
    news_row: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.user_row = {u: i for i, u in enumerate(self.user_ids)}
        self.news_row = {n: i for i, n in enumerate(self.news_ids)}

    def utility(self, user_rows: np.ndarray, news_rows: np.ndarray) -> np.ndarray:
        """Noise-free click utility of news rows for user rows (broadcast shapes)."""
        c = self.config
        return (c.affinity_weight * self.affinity[user_rows, self.news_cell[news_rows]]
                + c.popularity_weight * self.log_popularity[news_rows])


# --------------------------------------------------------------------------------------------
# Pseudo-words and text
# --------------------------------------------------------------------------------------------

def _pseudo_words(count: int, rng: np.random.Generator) -> list[str]:
    """``count`` distinct pronounceable pseudo-words (2–3 consonant-vowel syllables)."""
    words: dict[str, None] = {}
    while len(words) < count:
        n = 2 * (count - len(words)) + 16
        syllables = rng.integers(2, 4, size=n)
        onset = rng.integers(0, len(_ONSETS), size=(n, 3))
        vowel = rng.integers(0, len(_VOWELS), size=(n, 3))
        coda = rng.integers(0, len(_CODAS), size=(n, 3))
        for i in range(n):
            word = "".join(_ONSETS[onset[i, j]] + _VOWELS[vowel[i, j]] + _CODAS[coda[i, j]]
                           for j in range(syllables[i]))
            if word not in words and word not in TOPIC_NAMES:
                words[word] = None
                if len(words) == count:
                    break
    return list(words)


def _zipf(size: int) -> np.ndarray:
    weights = 1.0 / np.arange(1, size + 1) ** _ZIPF_EXPONENT
    return weights / weights.sum()


def _lengths(mean: float, count: int, rng: np.random.Generator) -> np.ndarray:
    """Text lengths of mean ``mean``: ``b + Poisson(mean - b)`` with ``b = min(3, ⌊mean⌋)``."""
    base = min(3, int(mean))
    return base + rng.poisson(mean - base, size=count)


class _Lexicon:
    """Topic, subtopic and filler vocabularies as one word list with offsets."""

    def __init__(self, config: SynthConfig, rng: np.random.Generator) -> None:
        t, s = config.topics, config.subtopics_per_topic
        n_topic, n_sub = t * config.topic_vocab, t * s * config.subtopic_vocab
        self.words = _pseudo_words(n_topic + n_sub + config.filler_vocab + t * s, rng)
        self.topic_offset = 0
        self.subtopic_offset = n_topic
        self.filler_offset = n_topic + n_sub
        self.names = self.words[n_topic + n_sub + config.filler_vocab:]
        self.config = config

    def sample(self, topic: np.ndarray, subtopic: np.ndarray, lengths: np.ndarray,
               rng: np.random.Generator) -> list[list[str]]:
        """Word lists of texts of the given topic/subtopic rows and lengths."""
        c = self.config
        owner = np.repeat(np.arange(len(lengths)), lengths)
        total = int(lengths.sum())
        source = rng.random(total)
        topic_index = rng.choice(c.topic_vocab, size=total, p=_zipf(c.topic_vocab))
        sub_index = rng.choice(c.subtopic_vocab, size=total, p=_zipf(c.subtopic_vocab))
        filler_index = rng.choice(c.filler_vocab, size=total, p=_zipf(c.filler_vocab))
        cell = topic[owner] * c.subtopics_per_topic + subtopic[owner]
        word = self.topic_offset + topic[owner] * c.topic_vocab + topic_index
        is_sub = source >= c.title_noise + (1 - c.title_noise) * (1 - c.subtopic_share)
        word = np.where(is_sub, self.subtopic_offset + cell * c.subtopic_vocab + sub_index, word)
        word = np.where(source < c.title_noise, self.filler_offset + filler_index, word)
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        return [[self.words[w] for w in word[bounds[i]:bounds[i + 1]]]
                for i in range(len(lengths))]


def _sentence(words: list[str], end: str = "") -> str:
    if not words:
        return ""
    return " ".join([words[0].capitalize(), *words[1:]]) + end


# --------------------------------------------------------------------------------------------
# Simulation
# --------------------------------------------------------------------------------------------

def _dirichlet_rows(rows: int, groups: np.ndarray, concentration: float,
                    rng: np.random.Generator) -> np.ndarray:
    """``[rows, len(groups)]``: per row, one Dirichlet(concentration) draw inside each group.

    Drawn as normalised Gamma variates (robust for concentrations ≪ 1); ``groups[c]`` is the
    group of column ``c``.
    """
    gamma = rng.standard_gamma(concentration, size=(rows, len(groups))) + 1e-300
    sums = np.zeros((rows, int(groups.max()) + 1))
    np.add.at(sums.T, groups, gamma.T)
    return gamma / sums[:, groups]


def _synthetic_news(config: SynthConfig, rng: np.random.Generator
                    ) -> tuple[list[NewsRecord], np.ndarray, np.ndarray, list[str]]:
    """Synthetic news records (ids assigned later) with cell/topic arrays and topic names."""
    c = config
    names = [TOPIC_NAMES[k] if k < len(TOPIC_NAMES) else f"topic{k}" for k in range(c.topics)]
    lexicon = _Lexicon(c, rng)
    share = 1.0 / np.arange(1, c.topics + 1) ** _TOPIC_SHARE_EXPONENT
    topic = rng.choice(c.topics, size=c.news, p=share / share.sum())
    subtopic = rng.integers(0, c.subtopics_per_topic, size=c.news)
    titles = lexicon.sample(topic, subtopic, _lengths(c.title_length, c.news, rng), rng)
    abstracts = lexicon.sample(topic, subtopic, _lengths(c.abstract_length, c.news, rng), rng)
    cells = topic * c.subtopics_per_topic + subtopic
    records = [
        NewsRecord(news_id="", category=names[topic[i]],
                   subcategory=names[topic[i]] + lexicon.names[cells[i]],
                   title=_sentence(titles[i]), abstract=_sentence(abstracts[i], "."))
        for i in range(c.news)
    ]
    cell_topic = np.repeat(np.arange(c.topics), c.subtopics_per_topic)
    return records, cells, cell_topic, names


def _real_news(pool: Mapping[str, NewsRecord]
               ) -> tuple[list[NewsRecord], np.ndarray, np.ndarray, list[str]]:
    """Real news with cells = distinct (category, subcategory) pairs, topics = categories."""
    records = list(pool.values())
    topics: dict[str, int] = {}
    cells: dict[tuple[str, str], int] = {}
    cell_topic: list[int] = []
    news_cell = np.empty(len(records), dtype=np.int64)
    for i, record in enumerate(records):
        t = topics.setdefault(record.category, len(topics))
        key = (record.category, record.subcategory)
        if key not in cells:
            cells[key] = len(cells)
            cell_topic.append(t)
        news_cell[i] = cells[key]
    return records, news_cell, np.asarray(cell_topic, dtype=np.int64), list(topics)


def _prepare(config: SynthConfig, news_pool: Mapping[str, NewsRecord] | None
             ) -> tuple[list[NewsRecord], _Latent, np.random.Generator]:
    """News records (in row = publication order), the latent state and the random stream.

    Draws everything but the histories and impressions; the stream is returned positioned
    for :func:`_histories` then :func:`_impression_chunks` (the order fixes the output).
    """
    c = config
    rng = np.random.default_rng(c.seed)
    if news_pool is None:
        records, news_cell, cell_topic, _ = _synthetic_news(c, rng)
    else:
        if len(news_pool) < 2:
            raise ConfigError("invalid news pool: --news-from needs at least 2 news, got "
                              f"{len(news_pool)}")
        records, news_cell, cell_topic, _ = _real_news(news_pool)
    n_news, n_cells = len(records), len(cell_topic)

    # Publication times (seconds relative to the start of the logged period). News rows are
    # put in publication order (synthetic ids N1, N2, ... follow it; real ids are kept).
    span = (c.history_days + c.days) * SECONDS_PER_DAY
    publish_raw = rng.random(n_news) * span - c.history_days * SECONDS_PER_DAY
    order = np.argsort(publish_raw, kind="stable")
    publish, news_cell = publish_raw[order], news_cell[order]
    records = [records[i] for i in order]
    if news_pool is None:
        records = [replace(r, news_id=f"N{i + 1}", url=f"https://example.org/synth/N{i + 1}.html")
                   for i, r in enumerate(records)]
    lifetime = rng.integers(c.min_lifetime, c.max_lifetime + 1, size=n_news) * SECONDS_PER_DAY
    expire = publish + lifetime
    log_pop = rng.normal(0.0, c.popularity_sigma, size=n_news)

    # Users: sparse topic preferences, subtopic preferences inside each topic.
    # Shapes [users, topics] and [users, cells]: O(users × cells), never O(users × news).
    n_topics = int(cell_topic.max()) + 1
    theta = _dirichlet_rows(c.users, np.zeros(n_topics, dtype=np.int64), c.topic_concentration,
                            rng)
    phi = _dirichlet_rows(c.users, cell_topic, c.subtopic_concentration, rng)
    cell_prob = theta[:, cell_topic] * phi
    affinity = np.log((1 - _BACKGROUND_INTEREST) * cell_prob + _BACKGROUND_INTEREST / n_cells)

    user_ids = [f"U{u + 1}" for u in range(c.users)]
    latent = _Latent(c, user_ids, [r.news_id for r in records], news_cell, cell_topic, log_pop,
                     affinity, publish, expire)
    return records, latent, rng


def _start(config: SynthConfig) -> datetime:
    return datetime.combine(date.fromisoformat(config.start_date), datetime.min.time())


def _split_at(config: SynthConfig) -> float:
    return float((config.days - config.test_days) * SECONDS_PER_DAY)


def _simulate(config: SynthConfig, news_pool: Mapping[str, NewsRecord] | None = None
              ) -> tuple[MindDataset, _Latent]:
    c = config
    records, latent, rng = _prepare(c, news_pool)
    histories = _histories(latent, rng)
    start, split_at = _start(c), _split_at(c)
    train: list[Impression] = []
    test: list[Impression] = []
    user_ids, news_ids = latent.user_ids, latent.news_ids
    k = 0
    for chunk in _impression_chunks(latent, rng):
        for i in range(len(chunk.users)):
            seconds, user, size = chunk.seconds[i], int(chunk.users[i]), chunk.sizes[i]
            k += 1
            imp = Impression(impression_id=str(k), user_id=user_ids[user],
                             time=start + timedelta(seconds=int(seconds)),
                             history=tuple(news_ids[r] for r in histories.of(user)),
                             candidates=tuple(news_ids[r] for r in chunk.rows[i, :size]),
                             labels=tuple(int(y) for y in chunk.labels[i, :size]))
            (test if seconds >= split_at else train).append(imp)
    dataset = MindDataset(train=MindSplit(_referenced(records, train), train),
                          test=MindSplit(_referenced(records, test), test))
    return dataset, latent


def _histories(latent: _Latent, rng: np.random.Generator) -> Histories:
    """Per user, the rows of the news clicked before the logged period (publication order).

    Each user's ``L_u`` clicks are the top ``L_u`` of utility + Gumbel noise over the pool of
    news expired before the period (Plackett–Luce without replacement). Users are processed
    in chunks of about 2·10⁶ (user, news) pairs, so memory is bounded whatever the population;
    the random stream is consumed chunk by chunk in user order.
    """
    c = latent.config
    pool = np.flatnonzero(latent.expire <= 0)
    if len(pool) < c.min_history:
        _fail("history_days", f"only {len(pool)} news expire before the logged period, fewer "
                              f"than min_history={c.min_history}; raise news or history_days, "
                              f"or lower min_history")
    lengths = np.exp(rng.uniform(np.log(c.min_history), np.log(c.max_history + 1),
                                 size=c.users)).astype(np.int64).clip(c.min_history, c.max_history)
    lengths = np.minimum(lengths, len(pool))
    longest = int(lengths.max())
    parts: list[np.ndarray] = []
    chunk = max(1, 2_000_000 // len(pool))
    sentinel = len(latent.news_ids)
    # latent.utility(rows[:, None], pool[None, :]), term by term (same floats), gathering
    # through the [rows, cells] affinity block instead of a 2-D fancy index.
    pool_cell = latent.news_cell[pool]
    pool_popularity = c.popularity_weight * latent.log_popularity[pool]
    for lo in range(0, c.users, chunk):
        rows = np.arange(lo, min(lo + chunk, c.users))
        noisy = rng.gumbel(size=(len(rows), len(pool)))
        noisy *= c.noise_scale
        affinity = np.take(c.affinity_weight * latent.affinity[rows], pool_cell, axis=1)
        noisy += affinity + pool_popularity
        top = _smallest(np.negative(noisy, out=noisy), longest)  # the largest noisy utilities
        keep = np.arange(longest)[None, :] < lengths[rows][:, None]
        chosen = np.where(keep, pool[top], sentinel)
        chosen.sort(axis=1)  # publication order; the sentinel (not chosen) goes last
        parts.append(chosen[keep])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return Histories(offsets=offsets, rows=np.concatenate(parts))


def _smallest(values: np.ndarray, k: int) -> np.ndarray:
    """``int[R, k]``: column indices of the ``k`` smallest values of each row, smallest first.

    ``values`` is ``float[R, N]`` with ``k <= N``. Equal to a full ``argpartition`` followed
    by a sort of the selected values (up to exact ties, which continuous random values do not
    produce), at a fraction of its cost for ``k ≪ N``: the ``k``-th smallest value of the
    first ``m = max(8k, 2√(kN))`` columns bounds the ``k``-th smallest of the row from above,
    so only the values below that bound (≈ kN/m per row for exchangeable columns) are
    sorted; ``m`` balances the two partitions (measured fastest among N/16, N/8, 4k, 8k).
    """
    rows, n = values.shape
    m = max(8 * k, int(2 * math.sqrt(k * n)))
    if 2 * m >= n:
        return _smallest_exact(values, k)
    bound = np.partition(values[:, :m], k - 1, axis=1)[:, k - 1]
    flat = np.flatnonzero(values <= bound[:, None])  # >= k per row, row-major
    row = flat // n
    counts = np.bincount(row, minlength=rows)
    width = int(counts.max())
    slot = np.arange(len(flat)) - np.repeat(np.cumsum(counts) - counts, counts)
    position = row * width + slot  # [row, slot] in a [rows, width] array, padded with inf
    below = np.full(rows * width, np.inf)
    below[position] = values.ravel()[flat]
    column = np.zeros(rows * width, dtype=np.int64)
    column[position] = flat - row * n
    below, column = below.reshape(rows, width), column.reshape(rows, width)
    return np.take_along_axis(column, _smallest_exact(below, k), axis=1)


def _smallest_exact(values: np.ndarray, k: int) -> np.ndarray:
    """:func:`_smallest` by a full ``argpartition`` and a sort of the ``k`` selected."""
    rows, n = values.shape
    top = np.argpartition(values, k - 1, axis=1)[:, :k] if k < n \
        else np.tile(np.arange(n), (rows, 1))
    order = np.argsort(np.take_along_axis(values, top, axis=1), axis=1, kind="stable")
    return np.take_along_axis(top, order, axis=1)


def _impression_chunks(latent: _Latent, rng: np.random.Generator
                       ) -> Iterator[ImpressionChunk]:
    """Impressions in time order, as blocks of at most 256 (only those with >= 2 candidates).

    Each impression shows ``min_candidates..max_candidates`` news drawn uniformly among those
    alive at its time, and clicks the top 1 (or 2) of utility + Gumbel noise. Memory per block
    is O(256 × news alive in the block's time window).
    """
    c = latent.config
    counts = 1 + rng.poisson(c.impressions_per_user - 1, size=c.users)
    owner = np.repeat(np.arange(c.users), counts)
    seconds = np.floor(rng.random(len(owner)) * c.days * SECONDS_PER_DAY)
    order = np.lexsort((np.arange(len(owner)), seconds))
    owner, seconds = owner[order], seconds[order]
    sizes = rng.integers(c.min_candidates, c.max_candidates + 1, size=len(owner))
    two = rng.random(len(owner)) < c.two_click_prob

    chunk = 256
    for lo in range(0, len(owner), chunk):
        sl = slice(lo, min(lo + chunk, len(owner)))
        t = seconds[sl]
        cols = np.flatnonzero((latent.publish <= t.max()) & (latent.expire > t.min()))
        alive = (latent.publish[cols][None, :] <= t[:, None]) & \
                (latent.expire[cols][None, :] > t[:, None])
        keys = np.where(alive, rng.random(alive.shape), 2.0)
        k_max = min(c.max_candidates, len(cols))
        if k_max == 0:
            continue
        top = _smallest(keys, k_max)  # alive news in random order (keys < 1) come first
        k = np.minimum(sizes[sl], alive.sum(axis=1))
        valid = np.arange(k_max)[None, :] < k[:, None]
        rows = cols[top]
        users = owner[sl]
        utility = latent.utility(users[:, None], rows)
        noisy = np.where(valid, utility + c.noise_scale * rng.gumbel(size=utility.shape),
                         -np.inf)
        rank = np.argsort(np.argsort(-noisy, axis=1, kind="stable"), axis=1, kind="stable")
        n_clicks = np.where(two[sl] & (k >= 3), 2, 1)
        labels = (rank < n_clicks[:, None]) & valid
        kept = k >= 2  # too few news alive for a clicked and a non-clicked candidate
        yield ImpressionChunk(seconds=t[kept], users=users[kept], rows=rows[kept],
                              labels=labels[kept], sizes=k[kept])


def _referenced(records: list[NewsRecord], behaviors: list[Impression]
                ) -> dict[str, NewsRecord]:
    """The news referenced (history or candidate) by ``behaviors``, in pool order."""
    used: set[str] = set()
    for imp in behaviors:
        used.update(imp.history)
        used.update(imp.candidates)
    return {r.news_id: r for r in records if r.news_id in used}


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------

def generate(config: SynthConfig, news_pool: Mapping[str, NewsRecord] | None = None
             ) -> MindDataset:
    """Simulate a MIND-format dataset (deterministic given ``config.seed``).

    Parameters
    ----------
    config:
        Sizes, calibration knobs and seed (:class:`SynthConfig`).
    news_pool:
        Optional real news (``news id -> NewsRecord``, e.g. a MIND ``news.tsv``): their text,
        categories and subcategories are kept; ``config.news``, ``topics``,
        ``subtopics_per_topic`` and the vocabulary sizes are then ignored.

    Returns
    -------
    MindDataset
        ``train`` = impressions of the first ``days - test_days`` days, ``test`` = the last
        ``test_days`` days, both time-ordered; each split's ``news`` holds exactly the news its
        behaviors reference (histories and candidates), in publication order.
    """
    return _simulate(config, news_pool)[0]


def summarize(dataset: MindDataset) -> dict[str, Any]:
    """Summary statistics of a dataset: sizes, clicks, candidates, history and title lengths."""
    splits = {"train": dataset.train, "test": dataset.test}
    out: dict[str, Any] = {}
    all_news = dataset.all_news()
    users: set[str] = set()
    for name, split in splits.items():
        if split is None:
            continue
        behaviors = split.behaviors
        users.update(b.user_id for b in behaviors)
        cands = np.array([len(b.candidates) for b in behaviors] or [0])
        clicks = np.array([sum(b.labels or ()) for b in behaviors] or [0])
        out[name] = {
            "impressions": len(behaviors),
            "users": len({b.user_id for b in behaviors}),
            "news": len(split.news),
            "clicks": int(clicks.sum()),
            "candidates_mean": round(float(cands.mean()), 2),
            "candidates_min": int(cands.min()),
            "candidates_max": int(cands.max()),
            "clicks_per_impression_mean": round(float(clicks.mean()), 3),
        }
    history = np.array([len(h) for h in {b.user_id: b.history for s in splits.values()
                                          if s is not None for b in s.behaviors}.values()]
                       or [0])
    if dataset.test is not None:
        train_users = {b.user_id for b in dataset.train.behaviors}
        test_users = {b.user_id for b in dataset.test.behaviors}
        out["test_users_seen_in_train"] = round(len(test_users & train_users)
                                                / max(len(test_users), 1), 3)
    out.update(corpus_summary(list(all_news.values()), len(users), history))
    return out


def write_synthetic(out_dir: str | Path, config: SynthConfig,
                    news_pool: Mapping[str, NewsRecord] | None = None, *,
                    overwrite: bool = True) -> dict[str, Any]:
    """Generate a dataset and write ``out_dir/train`` and ``out_dir/test`` in MIND format.

    ``overwrite=False`` refuses an ``out_dir`` that exists and is not empty (``privaterec
    data synth`` without ``--overwrite``): runs trained on the data set there would no longer
    match it.

    Each split directory holds ``news.tsv`` (the news its behaviors reference) and
    ``behaviors.tsv``. Same config (seed included) → byte-identical files, the same bytes as
    ``write_dataset(out_dir, generate(config, news_pool))``; the behaviors are streamed, so
    memory does not grow with the data set (see the module docstring).

    Returns
    -------
    dict
        :func:`summarize` of the dataset, plus ``"config"`` and ``"path"``.
    """
    out = Path(out_dir)
    if not overwrite and out.exists() and (not out.is_dir() or any(out.iterdir())):
        held = (sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir())
                if out.is_dir() else [])
        raise ConfigError(f"{out}: exists and is not empty"
                          + (f" (holds {', '.join(held[:5])})" if held else " (a file)")
                          + "; pass --overwrite to replace the data set there (runs trained "
                            "on it will then refuse to resume), or choose another --out")
    c = config
    records, latent, rng = _prepare(c, news_pool)
    histories = _histories(latent, rng)
    summary = write_streaming(out, records, latent.user_ids, histories,
                              _impression_chunks(latent, rng), start=_start(c),
                              split_at=_split_at(c))
    summary["config"] = asdict(config)
    summary["news_from"] = "synthetic" if news_pool is None else "pool"
    summary["path"] = str(out)
    return summary


def _flag_help() -> dict[str, str]:
    d = SynthConfig()
    return {"users": f"number of users (default {d.users})",
            "news": f"number of news articles, those published before the logged period "
                    f"included (default {d.news})",
            "topics": f"number of topics, each with {d.subtopics_per_topic} subtopics "
                      f"(default {d.topics})",
            "days": f"days of logged impressions; the last {d.test_days} form test/ "
                    f"(default {d.days})",
            "seed": f"random seed: the same seed writes the same files (default {d.seed})"}


SYNTH_FLAG_HELP: dict[str, str] = _flag_help()
"""``privaterec data synth``'s integer flags → help text stating the default."""


def format_synth_summary(summary: Mapping[str, Any]) -> str:
    """:func:`write_synthetic`'s summary as text for people: one line per fact, a table of
    the splits, the settings as ``name=value`` (never a Python dict)."""
    source = ("synthetic news" if summary.get("news_from") == "synthetic" else
              "news from --news-from")
    lines = [f"wrote {summary['path']} ({source})",
             f"users: {summary['users']}, news: {summary['news']}, categories: "
             f"{summary['categories']}, subcategories: {summary['subcategories']}"]
    splits = [(name, summary[name]) for name in ("train", "test")
              if isinstance(summary.get(name), Mapping)]
    if splits:
        keys = list(dict.fromkeys(k for _, split in splits for k in split))
        width = max(len(k) for k in keys) + 2
        lines.append("")
        lines.append(" " * width + "".join(name.rjust(10) for name, _ in splits))
        for key in keys:
            lines.append(key.ljust(width) + "".join(
                _plain(split.get(key, "-")).rjust(10) for _, split in splits))
        lines.append("")
    if "test_users_seen_in_train" in summary:
        lines.append(f"test users seen in train: "
                     f"{100 * float(summary['test_users_seen_in_train']):.1f}%")
    quantiles = summary.get("history_length_quantiles")
    if isinstance(quantiles, Mapping):
        names = {0: "min", 50: "median", 100: "max"}
        lines.append("history length: " + ", ".join(
            f"{names.get(int(q), f'p{int(q)}')} {_plain(v)}" for q, v in quantiles.items()))
    for key, label in (("title_length_mean", "mean title length (words)"),
                       ("abstract_length_mean", "mean abstract length (words)")):
        if key in summary:
            lines.append(f"{label}: {_plain(summary[key])}")
    config = summary.get("config")
    if isinstance(config, Mapping):
        lines.append("settings: " + " ".join(f"{k}={_plain(v)}" for k, v in config.items()))
    return "\n".join(lines)


def _plain(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(_plain(v) for v in value)
    if isinstance(value, Mapping):
        return ",".join(f"{k}:{_plain(v)}" for k, v in value.items())
    return str(value)
