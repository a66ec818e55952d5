"""Tokenizer and vocabularies, built from training news only
(docs/privacy.md#data-used-for-tuning-and-vocabularies).

Index conventions used by every model:

* token 0 is the padding token (its embedding e₀ is trained, PrivateRec §3.3), token 1 is
  the unknown token;
* category/subcategory 0 is padding, 1 is unknown.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from privaterec.errors import CheckpointError

PAD, UNK = 0, 1
PAD_TOKEN, UNK_TOKEN = "<pad>", "<unk>"
_TOKEN_RE = re.compile(r"[\w]+|[^\w\s]", re.UNICODE)


def tokenize(text: str) -> list[str]:
    """Lower-case word/punctuation tokenizer (NRMS/NAML preprocessing).

    >>> tokenize("Trump's wall, again!")
    ['trump', "'", 's', 'wall', ',', 'again', '!']
    """
    return _TOKEN_RE.findall(text.lower())


@dataclass
class Vocabulary:
    """A token ↔ index map with ``<pad>`` = 0 and ``<unk>`` = 1."""

    tokens: list[str] = field(default_factory=lambda: [PAD_TOKEN, UNK_TOKEN])

    def __post_init__(self) -> None:
        if self.tokens[:2] != [PAD_TOKEN, UNK_TOKEN]:
            raise ValueError("a Vocabulary must start with <pad>, <unk>")
        self._index = {t: i for i, t in enumerate(self.tokens)}

    @classmethod
    def build(cls, texts: Iterable[Sequence[str]], *, min_count: int = 1) -> "Vocabulary":
        """Vocabulary of the tokens seen at least ``min_count`` times, most frequent first."""
        counts: Counter[str] = Counter()
        for tokens in texts:
            counts.update(tokens)
        kept = sorted((t for t, c in counts.items() if c >= min_count and t not in
                       (PAD_TOKEN, UNK_TOKEN)), key=lambda t: (-counts[t], t))
        return cls([PAD_TOKEN, UNK_TOKEN, *kept])

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: str) -> bool:
        return token in self._index

    def index(self, token: str) -> int:
        return self._index.get(token, UNK)

    def encode(self, tokens: Sequence[str], length: int) -> list[int]:
        """Indices of the first ``length`` tokens, right-padded with ``<pad>``."""
        ids = [self._index.get(t, UNK) for t in tokens[:length]]
        return ids + [PAD] * (length - len(ids))


_VOCABULARIES = ("words", "categories", "subcategories", "news_ids")  # vocab.json's order


@dataclass
class TextVocabularies:
    """Everything needed to turn news records into model inputs, saved in a run directory.

    ``kind`` is ``"word"`` (our tokenizer) or ``"wordpiece"`` (the MiniLM tokenizer, used by
    the ``plm`` encoder and ``minilm`` embeddings; then ``words`` maps our compact token
    indices to MiniLM wordpiece strings). ``news_ids`` is the news-ID vocabulary of the
    ``id`` encoder (news seen in training; others map to ``<unk>``).
    """

    kind: str
    words: Vocabulary
    categories: Vocabulary
    subcategories: Vocabulary
    news_ids: Vocabulary

    def to_json(self) -> str:
        """The JSON text of ``vocab.json`` (:meth:`save`; :meth:`from_json` reads it)."""
        return json.dumps({"kind": self.kind,
                           **{name: getattr(self, name).tokens for name in _VOCABULARIES}})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> "TextVocabularies":
        """The vocabularies of :meth:`to_json`'s text, or a :class:`CheckpointError` naming
        ``where`` (the file or download it came from)."""
        try:
            raw = json.loads(text)
            return cls(kind=raw["kind"],
                       **{name: Vocabulary(raw[name]) for name in _VOCABULARIES})
        except (KeyError, ValueError, TypeError) as exc:
            raise CheckpointError(f"{where}: corrupt vocabulary file ({exc})") from None

    @classmethod
    def load(cls, path: str | Path) -> "TextVocabularies":
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"{path}: vocabulary file missing; is this a run "
                                  f"directory written by 'privaterec train'?")
        return cls.from_json(path.read_bytes(), str(path))
