"""Plain records of the MIND format (docs/data.md), shared by readers, writers and generators.

``news.tsv`` columns: news id, category, subcategory, title, abstract, url, title entities,
abstract entities. ``behaviors.tsv`` columns: impression id, user id, time
(``MM/DD/YYYY HH:MM:SS AM``), space-separated history, space-separated ``NID-label``
candidates (labels may be absent in unlabeled test sets).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

MIND_TIME_FORMAT = "%m/%d/%Y %I:%M:%S %p"


@dataclass(frozen=True)
class NewsRecord:
    """One row of ``news.tsv``."""

    news_id: str
    category: str = ""
    subcategory: str = ""
    title: str = ""
    abstract: str = ""
    url: str = ""
    title_entities: str = "[]"
    abstract_entities: str = "[]"


@dataclass(frozen=True)
class Impression:
    """One row of ``behaviors.tsv``: a user's history and one impression of candidates.

    ``labels`` is ``None`` for an unlabeled impression, else one 0/1 label per candidate.
    """

    impression_id: str
    user_id: str
    time: datetime
    history: tuple[str, ...]
    candidates: tuple[str, ...]
    labels: tuple[int, ...] | None

    @property
    def clicked(self) -> tuple[str, ...]:
        """Candidates with label 1 (empty when unlabeled)."""
        if self.labels is None:
            return ()
        return tuple(n for n, y in zip(self.candidates, self.labels) if y == 1)


@dataclass
class MindSplit:
    """One directory holding ``news.tsv`` and ``behaviors.tsv``.

    ``news`` keeps the file order; ``path`` is the directory it was read from (if any).
    """

    news: dict[str, NewsRecord]
    behaviors: list[Impression]
    path: Path | None = None
    dropped: dict[str, int] = field(default_factory=dict)


@dataclass
class MindDataset:
    """A data directory: either one split (``train`` only) or ``train/`` and ``test/``."""

    train: MindSplit
    test: MindSplit | None
    path: Path | None = None

    def all_news(self) -> dict[str, NewsRecord]:
        """Union of the news of both splits (train order first)."""
        news = dict(self.train.news)
        if self.test is not None:
            for news_id, record in self.test.news.items():
                news.setdefault(news_id, record)
        return news
