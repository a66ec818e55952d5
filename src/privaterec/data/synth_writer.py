"""Streaming MIND writer for simulated data: behaviors written chunk by chunk (docs/data.md).

Building every :class:`~privaterec.data.records.Impression` of the population in memory and
writing them with :func:`privaterec.data.mind.write_dataset` lets those Python objects, not the
simulation, dominate time and memory at MIND-small scale (50,000 users, 250,000 impressions).
This module writes the same bytes from the simulator's arrays as they are produced: memory holds one chunk
of impressions plus O(users + news) arrays (histories, per-news flags), never the data set.

The output is byte-identical to ``write_dataset(out, generate(config))`` (tests pin it):
impression ids count the written impressions from 1 in time order, a split's ``news.tsv`` lists
the news its behaviors reference (histories and candidates) in pool order, both split
directories are always written. The returned summary equals
:func:`privaterec.data.synth.summarize` of the generated data set.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from privaterec.data.mind import BEHAVIORS_FILE, NEWS_FILE, _check_id, format_time, write_news
from privaterec.data.records import NewsRecord

__all__ = ["ImpressionChunk", "Histories", "corpus_summary", "write_streaming"]

SPLITS = ("train", "test")


@dataclass(frozen=True)
class Histories:
    """Every user's history as one CSR array.

    ``rows[offsets[u]:offsets[u + 1]]`` are the news rows of user row ``u``'s history, in
    publication order. Shapes: ``offsets`` ``int64[users + 1]``, ``rows`` ``int64[total]``.
    """

    offsets: np.ndarray
    rows: np.ndarray

    def of(self, user: int) -> np.ndarray:
        """``int64[L_u]``: the history of user row ``user``."""
        return self.rows[self.offsets[user]:self.offsets[user + 1]]

    @property
    def lengths(self) -> np.ndarray:
        """``int64[users]``: history lengths."""
        return np.diff(self.offsets)


@dataclass(frozen=True)
class ImpressionChunk:
    """A time-ordered block of kept impressions (each has >= 2 candidates).

    ``seconds`` ``float[R]`` (since the start of the logged period), ``users`` ``int[R]`` (user
    rows), ``rows`` ``int[R, K]`` and ``labels`` ``bool[R, K]`` (candidate news rows and clicks;
    only the first ``sizes[i]`` columns of row ``i`` are used), ``sizes`` ``int[R]``.
    """

    seconds: np.ndarray
    users: np.ndarray
    rows: np.ndarray
    labels: np.ndarray
    sizes: np.ndarray


class _SplitStats:
    """Running statistics of one split, as :func:`privaterec.data.synth.summarize` reports."""

    def __init__(self, n_users: int, n_news: int) -> None:
        self.impressions = 0
        self.clicks = 0
        self.candidates = 0
        self.candidates_min: int | None = None
        self.candidates_max: int | None = None
        self.users = np.zeros(n_users, dtype=bool)
        self.news = np.zeros(n_news, dtype=bool)

    def add(self, users: np.ndarray, rows: np.ndarray, labels: np.ndarray,
            sizes: np.ndarray) -> None:
        if len(users) == 0:
            return
        valid = np.arange(rows.shape[1])[None, :] < sizes[:, None]
        self.impressions += len(users)
        self.clicks += int((labels & valid).sum())
        self.candidates += int(sizes.sum())
        low, high = int(sizes.min()), int(sizes.max())
        self.candidates_min = low if self.candidates_min is None else min(self.candidates_min,
                                                                          low)
        self.candidates_max = high if self.candidates_max is None else max(self.candidates_max,
                                                                           high)
        self.users[users] = True
        self.news[rows[valid]] = True

    def summary(self) -> dict[str, Any]:
        # Same arithmetic as summarize(): an empty split counts as one impression of size 0.
        count = max(self.impressions, 1)
        return {
            "impressions": self.impressions,
            "users": int(self.users.sum()),
            "news": int(self.news.sum()),
            "clicks": self.clicks,
            "candidates_mean": round(self.candidates / count, 2),
            "candidates_min": self.candidates_min or 0,
            "candidates_max": self.candidates_max or 0,
            "clicks_per_impression_mean": round(self.clicks / count, 3),
        }


def write_streaming(out_dir: str | Path, records: Sequence[NewsRecord],
                    user_ids: Sequence[str], histories: Histories,
                    chunks: Iterable[ImpressionChunk], *, start: datetime,
                    split_at: float) -> dict[str, Any]:
    """Write ``out_dir/{train,test}/{news,behaviors}.tsv`` from simulated arrays.

    Parameters
    ----------
    out_dir:
        Data-set directory (``train/`` and ``test/`` are created).
    records:
        The news pool in row order (``n_news`` records; ids already assigned).
    user_ids:
        ``users`` user ids by row.
    histories:
        Every user's history (news rows).
    chunks:
        Kept impressions in time order (consumed once).
    start:
        Wall-clock time of second 0 of the logged period.
    split_at:
        Impressions at ``seconds >= split_at`` go to ``test``, earlier ones to ``train``.

    Returns
    -------
    dict
        The keys and values of :func:`privaterec.data.synth.summarize` of the written data.

    Raises
    ------
    ValueError
        A news id that is empty or holds whitespace (the MIND format cannot represent it).
    """
    out = Path(out_dir)
    n_news, n_users = len(records), len(user_ids)
    dirs = {name: out / name for name in SPLITS}
    for directory in dirs.values():
        directory.mkdir(parents=True, exist_ok=True)
    news_ids = [_check_id("news id", r.news_id, str(dirs["train"] / NEWS_FILE))
                for r in records]
    # Candidate tokens "NID-0" / "NID-1", indexed [label, news row].
    tokens = np.empty((2, n_news), dtype=object)
    tokens[0] = [f"{n}-0" for n in news_ids]
    tokens[1] = [f"{n}-1" for n in news_ids]
    stats = {name: _SplitStats(n_users, n_news) for name in SPLITS}
    handles = {name: open(dirs[name] / BEHAVIORS_FILE, "w", encoding="utf-8", newline="\n")
               for name in SPLITS}
    written = 0
    try:
        for chunk in chunks:
            is_test = chunk.seconds >= split_at
            shown = tokens[chunk.labels.astype(np.intp), chunk.rows]
            lines: dict[str, list[str]] = {name: [] for name in SPLITS}
            for i in range(len(chunk.users)):
                written += 1
                user = int(chunk.users[i])
                history = " ".join([news_ids[r] for r in histories.of(user).tolist()])
                candidates = " ".join(shown[i, :chunk.sizes[i]].tolist())
                time = format_time(start + timedelta(seconds=int(chunk.seconds[i])))
                lines["test" if is_test[i] else "train"].append(
                    f"{written}\t{user_ids[user]}\t{time}\t{history}\t{candidates}\n")
            for name, mask in (("train", ~is_test), ("test", is_test)):
                handles[name].write("".join(lines[name]))
                stats[name].add(chunk.users[mask], chunk.rows[mask], chunk.labels[mask],
                                chunk.sizes[mask])
    finally:
        for handle in handles.values():
            handle.close()

    # Histories are referenced by every split the user appears in.
    lengths = histories.lengths
    for name in SPLITS:
        stats[name].news[histories.rows[np.repeat(stats[name].users, lengths)]] = True
        write_news(dirs[name] / NEWS_FILE,
                   (records[i] for i in np.flatnonzero(stats[name].news).tolist()))
    return _summary(records, histories, stats)


def corpus_summary(news: Sequence[NewsRecord], users: int,
                   history_lengths: np.ndarray) -> dict[str, Any]:
    """The whole data set's keys of :func:`~privaterec.data.synth.summarize`: sizes, history
    length quantiles (``history_lengths``: one per user) and mean title and abstract lengths."""
    from privaterec.data.text import tokenize

    titles = np.array([len(tokenize(r.title)) for r in news] or [0])
    abstracts = np.array([len(tokenize(r.abstract)) for r in news] or [0])
    return {
        "users": users,
        "news": len(news),
        "categories": len({r.category for r in news}),
        "subcategories": len({r.subcategory for r in news}),
        "history_length_quantiles": {q: float(np.quantile(history_lengths, q / 100))
                                     for q in (0, 10, 50, 90, 100)},
        "title_length_mean": round(float(titles.mean()), 2),
        "abstract_length_mean": round(float(abstracts.mean()), 2),
    }


def _summary(records: Sequence[NewsRecord], histories: Histories,
             stats: dict[str, _SplitStats]) -> dict[str, Any]:
    out: dict[str, Any] = {name: stats[name].summary() for name in SPLITS}
    train_users, test_users = stats["train"].users, stats["test"].users
    out["test_users_seen_in_train"] = round(int((train_users & test_users).sum())
                                            / max(int(test_users.sum()), 1), 3)
    seen = train_users | test_users
    used = [records[i]
            for i in np.flatnonzero(stats["train"].news | stats["test"].news).tolist()]
    history = histories.lengths[seen] if seen.any() else np.array([0])
    out.update(corpus_summary(used, int(seen.sum()), history))
    return out
