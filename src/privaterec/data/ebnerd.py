"""Convert EB-NeRD (Ekstra Bladet News Recommendation Dataset) parquet files to MIND format.

EB-NeRD (RecSys Challenge 2024) stores one split as ``behaviors.parquet`` (one row per
impression: ``impression_id``, ``impression_time``, ``user_id``, ``article_ids_inview`` and
``article_ids_clicked`` lists) and ``history.parquet`` (one row per user: the user's clicks
*before* the behaviors period, ``article_id_fixed`` with ``impression_time_fixed``). The
article text lives in a separate ``articles.parquet`` (in the official layout one level above
``train/``), which the shared demo data does not include.

Mapping (docs/data.md), every deviation counted in the returned report, never silent:

- **history**: the user's ``history.parquet`` clicks in chronological order (stable sort by
  ``impression_time_fixed``; repeated reads are kept, as MIND keeps them), optionally only the
  last ``max_history``. Every impression of a user carries the same history, as in MIND. Users
  without a history row get an empty history (counted).
- **candidates**: ``article_ids_inview`` in their order; label 1 if the article is in
  ``article_ids_clicked``. Repeated in-view ids are kept once; repeated clicked ids count as
  one click (both counted). A clicked article that is not in view is, by default
  (``clicked_not_inview="add"``), appended as a positive candidate (a click is the strongest
  signal there is and losing it would bias the labels); ``"drop"`` ignores such clicks
  instead. Either way they are counted. An impression left without candidates is dropped
  (counted).
- **ids**: article, user and impression ids are written as their decimal integers.
- **time**: ``impression_time`` as wall-clock time in MIND format, truncated to the second
  (counted when a fraction was lost).
- **news.tsv**: one row per article referenced by any written history or candidate, sorted by
  id, so the output passes :func:`~privaterec.data.mind.read_split` without missing
  references. Without ``articles`` the rows are *ID-only*: category, subcategory, title,
  abstract and url are empty and the entity columns ``[]`` (use the ``id`` news encoder).
  With ``articles`` the text comes from ``title``, ``subtitle`` (abstract), ``category_str``
  (else ``category``), ``subcategory`` (first element if it is a list) and ``url``; articles
  missing from that file stay ID-only (counted).
- **temporal split**: with ``test_days = d`` (default 1), the boundary is the last impression
  time minus ``d`` days; impressions strictly after it go to ``test/``, the rest to
  ``train/``, both with the full ``news.tsv``. ``test_days=None`` writes one split directly
  into ``out_dir``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from privaterec.data.mind import BEHAVIORS_FILE, NEWS_FILE, write_split
from privaterec.data.records import Impression, MindSplit, NewsRecord
from privaterec.errors import ConfigError, DataFormatError

__all__ = ["convert_ebnerd", "read_articles"]

_BEHAVIOR_COLUMNS = ("impression_id", "impression_time", "user_id", "article_ids_inview",
                     "article_ids_clicked")
_HISTORY_COLUMNS = ("user_id", "article_id_fixed")


def _read_parquet(path: Path, required: Iterable[str],
                  optional: Iterable[str] = ()) -> pd.DataFrame:
    """Read the needed columns of a parquet file into a pandas DataFrame."""
    import pyarrow.parquet as pq

    if not path.is_file():
        raise DataFormatError(path, None, "file not found (an EB-NeRD split directory holds "
                              "behaviors.parquet and history.parquet)")
    try:
        names = pq.read_schema(path).names
    except Exception as exc:  # pyarrow raises several types for non-parquet input
        raise DataFormatError(path, None, f"cannot read as parquet: {exc}") from None
    missing = [c for c in required if c not in names]
    if missing:
        raise DataFormatError(path, None, f"missing column(s) {', '.join(missing)}; the file "
                              f"has {', '.join(names)}")
    columns = [*required, *(c for c in optional if c in names)]
    return pq.read_table(path, columns=columns).to_pandas()


def _id(value: Any, path: Path, what: str) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        raise DataFormatError(path, None, f"a row has no {what}")
    return str(int(value))


def _read_history(path: Path, max_history: int | None, report: dict[str, Any]
                  ) -> dict[str, tuple[str, ...]]:
    frame = _read_parquet(path, _HISTORY_COLUMNS, ("impression_time_fixed",))
    has_time = "impression_time_fixed" in frame.columns
    times_col = frame["impression_time_fixed"] if has_time else [None] * len(frame)
    histories: dict[str, tuple[str, ...]] = {}
    truncated = 0
    for user, articles, times in zip(frame["user_id"], frame["article_id_fixed"], times_col):
        uid = _id(user, path, "user_id")
        if uid in histories:
            raise DataFormatError(path, None, f"user {uid} has more than one history row")
        ids = np.asarray(articles if articles is not None else [], dtype=np.int64)
        if has_time and times is not None and len(ids):
            order = np.argsort(np.asarray(times, dtype="datetime64[us]"), kind="stable")
            ids = ids[order]
        if max_history is not None and len(ids) > max_history:
            truncated += len(ids) - max_history
            ids = ids[len(ids) - max_history:]
        histories[uid] = tuple(str(a) for a in ids.tolist())
    report["dropped"]["history_references_beyond_max_history"] = truncated
    return histories


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, tuple, np.ndarray)):
        return _text(value[0]) if len(value) else ""
    if isinstance(value, float):
        if np.isnan(value):
            return ""
        if value.is_integer():
            return str(int(value))
    return str(value)


def read_articles(path: str | Path) -> dict[str, NewsRecord]:
    """Read an EB-NeRD ``articles.parquet`` into MIND news records keyed by article id.

    Uses ``article_id`` (required) and, when present, ``title``, ``subtitle`` (else
    ``abstract``) as abstract, ``category_str`` (else ``category``), ``subcategory_str`` (else
    the first element of ``subcategory``) and ``url``. Missing values become empty strings.
    """
    path = Path(path)
    optional = ("title", "subtitle", "abstract", "category_str", "category", "subcategory_str",
                "subcategory", "url")
    frame = _read_parquet(path, ("article_id",), optional)
    cols = set(frame.columns)

    def column(*names: str) -> list[Any]:
        for name in names:
            if name in cols:
                return frame[name].tolist()
        return [None] * len(frame)

    records: dict[str, NewsRecord] = {}
    for aid, title, abstract, category, subcategory, url in zip(
            frame["article_id"].tolist(), column("title"), column("subtitle", "abstract"),
            column("category_str", "category"), column("subcategory_str", "subcategory"),
            column("url")):
        news_id = _id(aid, path, "article_id")
        if news_id in records:
            raise DataFormatError(path, None, f"article_id {news_id} appears more than once")
        records[news_id] = NewsRecord(news_id, _text(category), _text(subcategory),
                                      _text(title), _text(abstract), _text(url))
    return records


def _prepare_out_dir(out: Path, split: bool, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out_dir {out} is a file; pass a directory")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise ConfigError(f"out_dir {out} is not empty; pass an empty or new directory, or "
                              "overwrite=True (--overwrite) to replace the MIND files in it")
        other = [out / NEWS_FILE, out / BEHAVIORS_FILE] if split else [out / "train",
                                                                       out / "test"]
        stale = [p for p in other if p.exists()]
        if stale:
            raise ConfigError(f"out_dir {out} holds {', '.join(p.name for p in stale)} from a "
                              "different layout, which would make the output ambiguous; "
                              "remove it or choose another directory")
    out.mkdir(parents=True, exist_ok=True)


def convert_ebnerd(src_dir: str | Path, out_dir: str | Path, *,
                   articles: str | Path | None = None, test_days: int | None = 1,
                   max_history: int | None = None, clicked_not_inview: str = "add",
                   overwrite: bool = False) -> dict[str, Any]:
    """Convert one EB-NeRD split directory to MIND format (see the module docstring).

    Parameters
    ----------
    src_dir:
        Directory holding ``behaviors.parquet`` and ``history.parquet``.
    out_dir:
        Output directory: ``train/`` and ``test/`` (temporal split) or, with
        ``test_days=None``, ``news.tsv`` and ``behaviors.tsv`` directly.
    articles:
        Optional ``articles.parquet`` for titles, abstracts and categories.
    test_days:
        Length in days of the test window at the end of the period (``None``: no split).
    max_history:
        Keep only the last ``max_history`` history clicks of each user (``None``: all).
    clicked_not_inview:
        ``"add"`` (append clicked articles missing from the in-view list as positive
        candidates) or ``"drop"`` (ignore those clicks).
    overwrite:
        Allow writing into a non-empty ``out_dir`` (replaces the MIND files there).

    Returns
    -------
    dict
        ``source``, ``output``, ``articles_file``, written totals (``impressions``, ``users``,
        ``articles``, ``clicks``, ``candidates``, ``history_references`` summed over users),
        ``source_impressions``, ``clicked_not_in_inview`` (found), ``added`` and ``dropped``
        counts, ``users_without_history``, ``impressions_without_click``,
        ``articles_with_text``/``articles_without_text`` and ``split`` (boundary and sizes, or
        ``None``).
    """
    if clicked_not_inview not in ("add", "drop"):
        raise ConfigError(f"clicked_not_inview must be 'add' or 'drop', got {clicked_not_inview!r}")
    if test_days is not None and not test_days > 0:
        raise ConfigError(f"test_days must be a positive number of days or None, got {test_days!r}")
    if max_history is not None and (not isinstance(max_history, int) or max_history < 0):
        raise ConfigError(f"max_history must be a non-negative integer or None, got "
                          f"{max_history!r}")
    src, out = Path(src_dir), Path(out_dir)
    if not src.is_dir():
        raise DataFormatError(src, None, "is not a directory; pass the EB-NeRD split directory "
                              "holding behaviors.parquet and history.parquet")
    report: dict[str, Any] = {
        "source": str(src), "output": str(out),
        "articles_file": str(articles) if articles is not None else None,
        "added": {"clicked_not_in_inview": 0},
        "dropped": {"clicked_not_in_inview": 0, "duplicate_clicks": 0, "duplicate_inview": 0,
                    "impressions_without_candidates": 0, "subsecond_times_truncated": 0},
    }
    added, dropped = report["added"], report["dropped"]

    behaviors_path = src / "behaviors.parquet"
    frame = _read_parquet(behaviors_path, _BEHAVIOR_COLUMNS)
    histories = _read_history(src / "history.parquet", max_history, report)
    text = read_articles(articles) if articles is not None else {}

    impressions: list[Impression] = []
    seen_ids: set[str] = set()
    not_inview = 0
    for iid, when, user, inview, clicked in zip(
            frame["impression_id"].tolist(), frame["impression_time"],
            frame["user_id"].tolist(), frame["article_ids_inview"],
            frame["article_ids_clicked"]):
        impression_id = _id(iid, behaviors_path, "impression_id")
        if impression_id in seen_ids:
            raise DataFormatError(behaviors_path, None,
                                  f"impression_id {impression_id} appears more than once")
        seen_ids.add(impression_id)
        if when is None or when != when:  # None or NaT
            raise DataFormatError(behaviors_path, None,
                                  f"impression {impression_id} has no impression_time")
        time: datetime = when.to_pydatetime() if hasattr(when, "to_pydatetime") else when
        if time.microsecond:
            dropped["subsecond_times_truncated"] += 1
            time = time.replace(microsecond=0)
        uid = _id(user, behaviors_path, "user_id")
        view = [str(a) for a in (inview.tolist() if inview is not None else [])]
        candidates = list(dict.fromkeys(view))
        dropped["duplicate_inview"] += len(view) - len(candidates)
        clicks_raw = [str(a) for a in (clicked.tolist() if clicked is not None else [])]
        clicks = list(dict.fromkeys(clicks_raw))
        dropped["duplicate_clicks"] += len(clicks_raw) - len(clicks)
        in_view = set(candidates)
        outside = [a for a in clicks if a not in in_view]
        not_inview += len(outside)
        if outside:
            if clicked_not_inview == "add":
                candidates.extend(outside)
                added["clicked_not_in_inview"] += len(outside)
            else:
                dropped["clicked_not_in_inview"] += len(outside)
        if not candidates:
            dropped["impressions_without_candidates"] += 1
            continue
        positive = set(clicks)
        impressions.append(Impression(impression_id, uid, time, histories.get(uid, ()),
                                      tuple(candidates),
                                      tuple(1 if a in positive else 0 for a in candidates)))
    report["source_impressions"] = len(frame)
    report["clicked_not_in_inview"] = not_inview

    users = {imp.user_id for imp in impressions}
    referenced: set[str] = set()
    for uid in users:
        referenced.update(histories.get(uid, ()))
    for imp in impressions:
        referenced.update(imp.candidates)
    news = {a: text.get(a, NewsRecord(a)) for a in sorted(referenced, key=int)}
    with_text = sum(1 for a in referenced if a in text)
    report.update(
        impressions=len(impressions), users=len(users), articles=len(news),
        clicks=sum(sum(imp.labels or ()) for imp in impressions),
        candidates=sum(len(imp.candidates) for imp in impressions),
        history_references=sum(len(histories.get(uid, ())) for uid in users),
        users_without_history=sum(1 for uid in users if uid not in histories),
        impressions_without_click=sum(1 for imp in impressions if 1 not in (imp.labels or ())),
        articles_with_text=with_text, articles_without_text=len(news) - with_text,
    )

    if test_days is None:
        _prepare_out_dir(out, split=False, overwrite=overwrite)
        write_split(out, MindSplit(news, impressions))
        report["split"] = None
        return report
    if not impressions:
        raise DataFormatError(behaviors_path, None, "no impression to split")
    last = max(imp.time for imp in impressions)
    first = min(imp.time for imp in impressions)
    boundary = last - timedelta(days=test_days)
    train = [imp for imp in impressions if imp.time <= boundary]
    test = [imp for imp in impressions if imp.time > boundary]
    if not train:
        raise ConfigError(f"test_days={test_days} leaves no training impressions: the data span "
                          f"{first.isoformat()} .. {last.isoformat()}; use fewer test days")
    _prepare_out_dir(out, split=True, overwrite=overwrite)
    write_split(out / "train", MindSplit(news, train))
    write_split(out / "test", MindSplit(news, test))
    report["split"] = {
        "test_days": test_days,
        "boundary": boundary.isoformat(),
        "rule": "test = impressions after boundary = last impression time - test_days days",
        "train_impressions": len(train), "test_impressions": len(test),
        "train_users": len({imp.user_id for imp in train}),
        "test_users": len({imp.user_id for imp in test}),
        "train_time": [first.isoformat(), max(imp.time for imp in train).isoformat()],
        "test_time": [min(imp.time for imp in test).isoformat(), last.isoformat()],
    }
    return report
