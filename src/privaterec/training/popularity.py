"""Popularity baseline: rank candidates by their number of clicks in the training impressions.

A non-personalised reference point for the news recommenders (the "most popular" baseline of
news recommendation benchmarks, e.g. EB-NeRD's). It is fitted on training impressions only:

* ``clicks[n]``: how often news ``n`` was clicked as a candidate of a labelled training
  impression (history clicks are not counted: they predate the training period);
* ``shown[n]``: how often ``n`` was shown as a candidate of any training impression.

The score is ``clicks[n] + shown[n] / (1 + max_m shown[m])``: the click count decides, and the
exposure count, scaled into ``[0, 1)``, only breaks ties between news with equal clicks (a
news promoted more often ranks higher). News never shown in training score 0. No recency is
modelled, which is why :func:`cold_candidates_share` is reported alongside the metrics: cold
candidates are exactly the ones this baseline cannot rank.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Container, Iterable, Mapping, Sequence

import numpy as np

from privaterec.data.records import Impression, MindSplit
from privaterec.errors import CheckpointError
from privaterec.eval.metrics import evaluate_impressions

_FORMAT = "privaterec-popularity"
_VERSION = 1


class PopularityModel:
    """Click and exposure counts per news id, from training impressions.

    Parameters
    ----------
    clicks:
        News id → number of clicks (non-negative integers).
    shown:
        News id → number of times shown as a candidate (non-negative integers).
    """

    def __init__(self, clicks: Mapping[str, int], shown: Mapping[str, int]) -> None:
        for name, table in (("clicks", clicks), ("shown", shown)):
            for news_id, count in table.items():
                if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                    raise ValueError(f"{name}[{news_id!r}] must be a non-negative integer, "
                                     f"got {count!r}")
        self.clicks: dict[str, int] = dict(clicks)
        self.shown: dict[str, int] = dict(shown)
        self._scale = 1.0 / (1 + max(self.shown.values(), default=0))

    @classmethod
    def fit(cls, train_split: MindSplit) -> PopularityModel:
        """Count clicks (labelled impressions) and exposures (all impressions) of a split."""
        clicks: Counter[str] = Counter()
        shown: Counter[str] = Counter()
        for imp in train_split.behaviors:
            shown.update(imp.candidates)
            clicks.update(imp.clicked)
        return cls(clicks, shown)

    @property
    def known_news(self) -> frozenset[str]:
        """News ids shown at least once in training."""
        return frozenset(self.shown)

    def score(self, candidates: Sequence[str]) -> np.ndarray:
        """Scores ``float64[len(candidates)]``: clicks + exposure tie-break (module docstring)."""
        return np.array([self.clicks.get(n, 0) + self.shown.get(n, 0) * self._scale
                         for n in candidates], dtype=np.float64)

    def save(self, path: str | Path) -> None:
        """Write the counts to a JSON file."""
        payload = {"format": _FORMAT, "version": _VERSION, "clicks": self.clicks,
                   "shown": self.shown}
        Path(path).write_text(json.dumps(payload, sort_keys=True), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> PopularityModel:
        """Read a model written by :meth:`save`.

        Raises
        ------
        CheckpointError
            If the file is missing, not JSON, or not a popularity model of this version.
        """
        path = Path(path)
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CheckpointError(f"{path}: popularity model file not found") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{path}: not a JSON popularity model ({exc})") from None
        if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
            raise CheckpointError(f"{path}: not a popularity model (expected "
                                  f"\"format\": \"{_FORMAT}\")")
        if payload.get("version") != _VERSION:
            raise CheckpointError(f"{path}: popularity model version {payload.get('version')!r} "
                                  f"is not supported (expected {_VERSION})")
        try:
            return cls(payload["clicks"], payload["shown"])
        except (KeyError, AttributeError, ValueError) as exc:
            raise CheckpointError(f"{path}: invalid popularity model: {exc}") from None


def cold_candidates_share(impressions: Iterable[Impression], known_news: Container[str]) -> float:
    """Share of candidate slots whose news id is not in ``known_news``.

    Counted per occurrence: a cold news shown in three impressions counts three times, so the
    value is the fraction of the ranking work spent on news a training-count model has never
    seen (the cold-start share of EB-NeRD figures). With ``known_news`` = the news shown in the
    training impressions (:attr:`PopularityModel.known_news`) it is the share of test
    candidates never seen in training.

    Raises
    ------
    ValueError
        If the impressions hold no candidate.
    """
    total = cold = 0
    for imp in impressions:
        total += len(imp.candidates)
        cold += sum(1 for n in imp.candidates if n not in known_news)
    if total == 0:
        raise ValueError("cold_candidates_share: the impressions hold no candidate")
    return cold / total


def evaluate_popularity(model: PopularityModel, split: MindSplit) -> dict[str, float | int]:
    """MIND metrics of the popularity baseline over the labelled impressions of ``split``.

    Returns
    -------
    The keys of :func:`~privaterec.eval.metrics.evaluate_impressions`, plus
    ``unlabelled_impressions`` (skipped) and ``cold_candidates_share`` (over the labelled
    impressions, see :func:`cold_candidates_share`).

    Raises
    ------
    ValueError
        If the split has no labelled impression.
    """
    labelled = [imp for imp in split.behaviors if imp.labels is not None]
    if not labelled:
        where = split.path if split.path is not None else "<in-memory split>"
        raise ValueError(f"{where}: no labelled impression to evaluate")
    pairs = [(np.asarray(imp.labels), model.score(imp.candidates)) for imp in labelled]
    result = evaluate_impressions(pairs)
    result["unlabelled_impressions"] = len(split.behaviors) - len(labelled)
    result["cold_candidates_share"] = cold_candidates_share(labelled, model.known_news)
    return result
