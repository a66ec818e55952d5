"""The audit's tiny world: a news table, one client's data and its neighbours.

Neighbouring client datasets are built the way real ones are, from MIND-format records
through :func:`~privaterec.data.clients.build_client_dataset`, so a neighbour is exactly
what a device would hold. Adjacencies (stated per pair, :class:`NeighbourPair`):

* ``click`` — one click of the user changes:
  ``history``: one history click substituted at the same position (the last one) by a
  news that appears nowhere else in the user's data;
  ``label``: which candidate of a single-click impression was clicked;
  ``label-2click``: one of the two clicks of a two-click impression moved to another
  candidate of that impression.
* ``user`` — the whole user's data (history and impressions) replaced:
  ``one-impression``: a user with one history click and one impression of C = k + 1
  candidates, by another such user on other news (the gradients of small users are
  concentrated on few coordinates, which is where additive noise that is too small shows);
  ``other-count``: the base user by a user with another number of samples and a shorter
  history.

The base user has a full history of H = 5 clicks and three impressions: a single-click
impression of C = 8 candidates (C − 1 = 7 > k = 4, so a candidate set that always holds the
click is visible), a two-click impression of C = 7 and a single-click impression of
C = k + 1 = 5 — 4 training samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Sequence

from privaterec.data.clients import ClientData, build_client_dataset
from privaterec.data.features import NewsFeatures, build_news_features, build_vocabularies
from privaterec.data.records import Impression, MindSplit, NewsRecord
from privaterec.data.text import TextVocabularies
from privaterec.privacy.events import ADJACENCIES, Adjacency
from privaterec.validators import check_choice

HISTORY_LEN = 5
NUM_NEWS = 40
_START = datetime(2020, 1, 1)


@dataclass(frozen=True)
class UserRecord:
    """One user's raw data: history news ids and impressions ``(candidates, clicked)``."""

    history: tuple[str, ...]
    impressions: tuple[tuple[tuple[str, ...], frozenset[str]], ...]


@dataclass(frozen=True)
class NeighbourPair:
    """Two neighbouring client datasets under ``adjacency`` (``name`` says which change)."""

    adjacency: Adjacency
    name: str
    description: str
    d0: ClientData
    d1: ClientData

    @property
    def label(self) -> str:
        """``"click: history"`` etc., for tables."""
        return f"{self.adjacency}: {self.name}"


@dataclass(frozen=True)
class AuditWorld:
    """The news table shared by every neighbour: records, vocabularies and features."""

    news: dict[str, NewsRecord]
    vocabs: TextVocabularies
    features: NewsFeatures
    history_len: int = HISTORY_LEN

    def client(self, user: UserRecord) -> ClientData:
        """The :class:`ClientData` a device holding ``user``'s records would have."""
        behaviors = [Impression(impression_id=f"I{i}", user_id="audit-user",
                                time=_START + timedelta(minutes=i), history=user.history,
                                candidates=cands,
                                labels=tuple(int(c in clicked) for c in cands))
                     for i, (cands, clicked) in enumerate(user.impressions)]
        split = MindSplit(news=self.news, behaviors=behaviors)
        clients = build_client_dataset(split, self.features, history_len=self.history_len)
        return clients.client(0)


def _nid(i: int) -> str:
    return f"N{i:02d}"


def make_world(*, num_news: int = NUM_NEWS, history_len: int = HISTORY_LEN) -> AuditWorld:
    """A table of ``num_news`` news with one-word titles (id encoders ignore the text)."""
    news = {_nid(i): NewsRecord(news_id=_nid(i), category=f"c{i % 3}",
                                subcategory=f"s{i % 5}", title=f"word{i} title",
                                abstract=f"abstract{i}")
            for i in range(1, num_news + 1)}
    vocabs = build_vocabularies(news.values())
    features = build_news_features(news, vocabs, title_len=4, abstract_len=4)
    return AuditWorld(news, vocabs, features, history_len)


def _ids(*numbers: int) -> tuple[str, ...]:
    return tuple(_nid(i) for i in numbers)


BASE_USER = UserRecord(
    history=_ids(1, 2, 3, 4, 5),
    impressions=(
        (_ids(6, 7, 8, 9, 10, 11, 12, 13), frozenset(_ids(6))),
        (_ids(14, 15, 16, 17, 18, 19, 20), frozenset(_ids(14, 15))),
        (_ids(21, 22, 23, 24, 25), frozenset(_ids(21))),
    ))


SMALL_USER = UserRecord(history=_ids(1), impressions=(
    (_ids(6, 7, 8, 9, 10), frozenset(_ids(6))),))
OTHER_USER = UserRecord(history=_ids(27), impressions=(
    (_ids(30, 31, 32, 33, 34), frozenset(_ids(30))),))


def _replace_impression(user: UserRecord, index: int, clicked: Sequence[int]) -> UserRecord:
    impressions = list(user.impressions)
    impressions[index] = (impressions[index][0], frozenset(_ids(*clicked)))
    return UserRecord(user.history, tuple(impressions))


def neighbour_pairs(world: AuditWorld, adjacency: str) -> list[NeighbourPair]:
    """The neighbouring pairs audited under ``adjacency`` (module docstring)."""
    check_choice(adjacency, "adjacency", ADJACENCIES, kind="audit parameter")
    base = world.client(BASE_USER)
    if adjacency == "click":
        history = UserRecord(_ids(1, 2, 3, 4, 26), BASE_USER.impressions)
        return [
            NeighbourPair("click", "history", "last history click N05 -> N26", base,
                          world.client(history)),
            NeighbourPair("click", "label", "single-click impression: click N06 -> N07",
                          base, world.client(_replace_impression(BASE_USER, 0, [7]))),
            NeighbourPair("click", "label-2click",
                          "two-click impression: click N15 -> N16", base,
                          world.client(_replace_impression(BASE_USER, 1, [14, 16]))),
        ]
    return [
        NeighbourPair("user", "one-impression",
                      "one-impression user (1 history click, C = k + 1) replaced by another "
                      "on other news", world.client(SMALL_USER), world.client(OTHER_USER)),
        NeighbourPair("user", "other-count",
                      "the 4-sample user replaced by a one-impression user on other news",
                      base, world.client(OTHER_USER)),
    ]


__all__ = ["ADJACENCIES", "AuditWorld", "BASE_USER", "NeighbourPair", "UserRecord",
           "make_world", "neighbour_pairs"]
