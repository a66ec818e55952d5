"""Statistics and validation of MIND-format data (docs/data.md; ``privaterec data check``).

:func:`dataset_statistics` describes a loaded split or data set, :func:`format_statistics`
renders it as a text table and :func:`check_dataset` validates a directory, computing the
statistics even when the data are invalid because of references to missing news (then the
reference coverage is exactly what the user needs to see).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import numpy as np

from privaterec.data.mind import (
    BEHAVIORS_FILE,
    NEWS_FILE,
    apply_missing_policy,
    read_behaviors,
    read_news,
    split_directories,
)
from privaterec.data.records import Impression, MindDataset, MindSplit
from privaterec.errors import DataFormatError, MissingNewsError

__all__ = ["split_statistics", "reference_coverage", "dataset_statistics", "format_statistics",
           "check_dataset"]


def _ratio(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def reference_coverage(news: Iterable[str], behaviors: Iterable[Impression]) -> dict[str, Any]:
    """How many news references of ``behaviors`` (histories and candidates) resolve in ``news``.

    Returns
    -------
    dict
        ``referenced_news`` (distinct ids referenced), ``present_news`` (of those, in
        ``news``), ``news_coverage`` (their ratio), ``references`` (all references, counted with
        repetition), ``resolved_references`` and ``reference_coverage`` (their ratio). Ratios
        are ``None`` when nothing is referenced.
    """
    known = news if isinstance(news, (set, frozenset, dict)) else set(news)
    referenced: set[str] = set()
    references = resolved = 0
    # id(history) -> (history, resolved references): histories shared between impressions
    # (one tuple per user, see read_behaviors) are counted once; the tuple is kept alive in the
    # value so that its id cannot be reused by another object.
    history_resolved: dict[int, tuple[tuple[str, ...], int]] = {}
    for imp in behaviors:
        cached = history_resolved.get(id(imp.history))
        if cached is None:
            referenced.update(imp.history)
            cached = history_resolved[id(imp.history)] = (
                imp.history, sum(1 for n in imp.history if n in known))
        references += len(imp.history) + len(imp.candidates)
        resolved += cached[1]
        referenced.update(imp.candidates)
        resolved += sum(1 for n in imp.candidates if n in known)
    present = sum(1 for n in referenced if n in known)
    return {
        "referenced_news": len(referenced),
        "present_news": present,
        "news_coverage": _ratio(present, len(referenced)),
        "references": references,
        "resolved_references": resolved,
        "reference_coverage": _ratio(resolved, references),
    }


def split_statistics(split: MindSplit) -> dict[str, Any]:
    """Statistics of one split.

    Returns
    -------
    dict
        ``users`` (distinct), ``news`` (rows of news.tsv), ``impressions``,
        ``labelled_impressions``, ``clicks``, ``candidates`` (all candidate slots),
        ``clicks_per_impression`` (mean over labelled impressions, ``None`` if none),
        ``candidates_per_impression``, ``impressions_without_click`` (labelled ones),
        ``history_length`` (over impressions: ``min``, ``p25``, ``p50``, ``p75``, ``max``,
        ``mean``; quantiles by linear interpolation as ``numpy.quantile``), ``empty_histories``
        (impressions with an empty history), ``time`` (``first``/``last`` impression time, ISO
        8601), ``coverage`` (see :func:`reference_coverage`) and ``dropped`` (see
        :func:`~privaterec.data.mind.apply_missing_policy`).
    """
    behaviors = split.behaviors
    n = len(behaviors)
    labelled = [imp.labels for imp in behaviors if imp.labels is not None]
    clicks = sum(sum(labels) for labels in labelled)
    candidates = sum(len(imp.candidates) for imp in behaviors)
    lengths = np.array([len(imp.history) for imp in behaviors], dtype=np.float64)
    history: dict[str, float | None]
    time: dict[str, str | None]
    if n:
        q = np.quantile(lengths, [0.0, 0.25, 0.5, 0.75, 1.0])
        history = {"min": int(q[0]), "p25": float(q[1]), "p50": float(q[2]),
                   "p75": float(q[3]), "max": int(q[4]), "mean": float(lengths.mean())}
        times = [imp.time for imp in behaviors]
        time = {"first": min(times).isoformat(), "last": max(times).isoformat()}
    else:
        history = dict.fromkeys(("min", "p25", "p50", "p75", "max", "mean"))
        time = {"first": None, "last": None}
    return {
        "users": len({imp.user_id for imp in behaviors}),
        "news": len(split.news),
        "impressions": n,
        "labelled_impressions": len(labelled),
        "clicks": clicks,
        "candidates": candidates,
        "clicks_per_impression": _ratio(clicks, len(labelled)),
        "candidates_per_impression": _ratio(candidates, n),
        "impressions_without_click": sum(1 for labels in labelled if 1 not in labels),
        "history_length": history,
        "empty_histories": int((lengths == 0).sum()),
        "time": time,
        "coverage": reference_coverage(split.news, behaviors),
        "dropped": dict(split.dropped),
    }


def _overlap(train: MindSplit, test: MindSplit) -> dict[str, Any]:
    train_users = {imp.user_id for imp in train.behaviors}
    train_seen: set[str] = set()
    for imp in train.behaviors:
        train_seen.update(imp.history)
        train_seen.update(imp.candidates)
    test_users = {imp.user_id for imp in test.behaviors}
    test_cands = [n for imp in test.behaviors for n in imp.candidates]
    distinct = set(test_cands)
    users_seen = len(test_users & train_users)
    news_seen = len(distinct & train_seen)
    refs_seen = sum(1 for n in test_cands if n in train_seen)
    return {
        "test_users": len(test_users),
        "test_users_seen_in_train": users_seen,
        "test_users_seen_in_train_share": _ratio(users_seen, len(test_users)),
        "test_candidate_news": len(distinct),
        "test_candidate_news_seen_in_train": news_seen,
        "test_candidate_news_seen_in_train_share": _ratio(news_seen, len(distinct)),
        "test_candidate_references_seen_in_train_share": _ratio(refs_seen, len(test_cands)),
    }


def dataset_statistics(data: MindDataset | MindSplit) -> dict[str, Any]:
    """Statistics of a split, or of a data set split by split plus train/test overlap.

    Parameters
    ----------
    data:
        A :class:`MindSplit` (returns :func:`split_statistics`) or a :class:`MindDataset`.

    Returns
    -------
    dict
        For a data set: ``{"train": ..., "test": ... or None, "overlap": ... or None}``.
        ``overlap`` counts test users who also appear in train behaviors and the share of test
        candidate news (distinct, and counted per reference) that appear anywhere in train
        behaviors (history or candidates), i.e. are not cold-start items.
    """
    if isinstance(data, MindSplit):
        return split_statistics(data)
    test = data.test
    return {
        "train": split_statistics(data.train),
        "test": split_statistics(test) if test is not None else None,
        "overlap": _overlap(data.train, test) if test is not None else None,
    }


# ----------------------------------------------------------------------------- formatting
def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _pct(part: Any, whole: Any, ratio: Any) -> str:
    if ratio is None:
        return "-"
    return f"{100 * ratio:.2f}% ({part:,}/{whole:,})"


def _split_rows(s: dict[str, Any] | None) -> list[tuple[str, str]]:
    if s is None:
        return []
    h, c = s["history_length"], s["coverage"]
    rows = [
        ("users", _fmt(s["users"])),
        ("news (news.tsv rows)", _fmt(s["news"])),
        ("impressions", _fmt(s["impressions"])),
        ("labelled impressions", _fmt(s["labelled_impressions"])),
        ("clicks", _fmt(s["clicks"])),
        ("candidates", _fmt(s["candidates"])),
        ("clicks / impression", _fmt(s["clicks_per_impression"])),
        ("candidates / impression", _fmt(s["candidates_per_impression"])),
        ("impressions without click", _fmt(s["impressions_without_click"])),
        ("history length min/p25/p50/p75/max",
         "/".join(_fmt(h[k]) for k in ("min", "p25", "p50", "p75", "max"))),
        ("history length mean", _fmt(h["mean"])),
        ("empty histories", _fmt(s["empty_histories"])),
        ("first impression", _fmt(s["time"]["first"])),
        ("last impression", _fmt(s["time"]["last"])),
        ("referenced news in news.tsv", _pct(c["present_news"], c["referenced_news"],
                                             c["news_coverage"])),
        ("references resolved", _pct(c["resolved_references"], c["references"],
                                     c["reference_coverage"])),
    ]
    for key, value in s.get("dropped", {}).items():
        rows.append((f"dropped {key.replace('_', ' ')}", _fmt(value)))
    return rows


def format_statistics(stats: dict[str, Any]) -> str:
    """Render :func:`dataset_statistics` (or :func:`check_dataset`'s report) as a text table."""
    lines: list[str] = []
    if "path" in stats:
        lines.append(f"data: {stats['path']}")
    if "train" in stats:
        columns = [("train", stats.get("train")), ("test", stats.get("test"))]
        columns = [(name, s) for name, s in columns if s is not None]
    else:
        columns = [("split", stats)]
    if columns:
        tables = [dict(_split_rows(s)) for _, s in columns]
        keys = list(dict.fromkeys(k for t in tables for k in t))
        width = max(len(k) for k in keys) + 2
        cols = [max([len(name)] + [len(t.get(k, "-")) for k in keys]) + 2
                for (name, _), t in zip(columns, tables)]
        lines.append(" " * width + "".join(name.rjust(w) for (name, _), w in zip(columns, cols)))
        for k in keys:
            lines.append(k.ljust(width) + "".join(t.get(k, "-").rjust(w)
                                                  for t, w in zip(tables, cols)))
    overlap = stats.get("overlap")
    if overlap:
        lines.append("")
        lines.append("test users seen in train: " + _pct(
            overlap["test_users_seen_in_train"], overlap["test_users"],
            overlap["test_users_seen_in_train_share"]))
        lines.append("test candidate news seen in train: " + _pct(
            overlap["test_candidate_news_seen_in_train"], overlap["test_candidate_news"],
            overlap["test_candidate_news_seen_in_train_share"]))
        share = overlap["test_candidate_references_seen_in_train_share"]
        lines.append("test candidate references seen in train: "
                     + ("-" if share is None else f"{100 * share:.2f}%"))
    for title in ("errors", "warnings"):
        items = stats.get(title) or []
        if items:
            lines.append("")
            lines.append(f"{title}:")
            lines.extend(f"  - {item}" for item in items)
    if "valid" in stats:
        lines.append("")
        lines.append("VALID" if stats["valid"] else "INVALID")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- checking
MAX_ERRORS_PER_FILE = 20
"""``data check`` lists at most this many bad lines of a file, then counts the rest."""


def _report_line_errors(bad: list[DataFormatError], errors: list[str]) -> None:
    """Append the first :data:`MAX_ERRORS_PER_FILE` bad lines and the count of the rest."""
    errors.extend(str(e) for e in bad[:MAX_ERRORS_PER_FILE])
    if len(bad) > MAX_ERRORS_PER_FILE:
        errors.append(f"{bad[0].path}: ... and {len(bad) - MAX_ERRORS_PER_FILE} more bad "
                      f"lines ({len(bad)} in all)")


def _check_split(name: str, directory: Path, drop_missing: bool, errors: list[str],
                 warnings: list[str]) -> tuple[dict[str, Any] | None, MindSplit | None]:
    for file in (NEWS_FILE, BEHAVIORS_FILE):
        if not (directory / file).is_file():
            errors.append(str(DataFormatError(directory / file, None, "file not found: a MIND "
                                              f"split directory needs {NEWS_FILE} and "
                                              f"{BEHAVIORS_FILE}")))
            return None, None
    news_errors: list[DataFormatError] = []
    behavior_errors: list[DataFormatError] = []
    try:  # every bad line of both files is reported, not only the first
        news = read_news(directory / NEWS_FILE, errors=news_errors)
        behaviors = read_behaviors(directory / BEHAVIORS_FILE, errors=behavior_errors)
    except DataFormatError as exc:
        errors.append(str(exc))
        return None, None
    _report_line_errors(news_errors, errors)
    _report_line_errors(behavior_errors, errors)
    if news_errors or behavior_errors:
        return None, None
    raw = MindSplit(news, behaviors, directory)
    try:
        split = apply_missing_policy(raw, drop_missing=drop_missing)
    except MissingNewsError as exc:
        errors.append(str(exc))
        split = raw
    stats = split_statistics(split)
    # Coverage always describes the files as written (before any --drop-missing).
    stats["coverage"] = reference_coverage(news, behaviors)
    if split.dropped.get("impressions"):
        warnings.append(f"{name}: dropped {split.dropped['impressions']} impressions and "
                        f"{split.dropped['clicks']} clicks that referenced missing news")
    if stats["impressions_without_click"]:
        warnings.append(f"{name}: {stats['impressions_without_click']} labelled impressions "
                        "have no clicked candidate")
    if stats["impressions"] == 0 and name == "train":
        errors.append(str(DataFormatError(directory / BEHAVIORS_FILE, None,
                                          "the training split has no impressions: there is "
                                          "nothing to train on")))
    elif stats["impressions"] == 0:
        warnings.append(f"{name}: no impressions")
    if name == "train" and stats["impressions"] and stats["labelled_impressions"] == 0:
        warnings.append("train: no impression is labelled; training needs NID-0/NID-1 labels")
    return stats, split


def check_dataset(path: str | Path, *, drop_missing: bool = False) -> tuple[bool, dict[str, Any]]:
    """Validate a MIND data directory and describe it (``privaterec data check PATH``).

    Parameters
    ----------
    path:
        A data-set directory (one split, or ``train/`` and ``test/``).
    drop_missing:
        Treat references to news missing from ``news.tsv`` as droppable (valid) rather than as
        an error; see :func:`~privaterec.data.mind.apply_missing_policy`.

    Returns
    -------
    (valid, report)
        ``report`` has ``path``, ``drop_missing``, ``valid``, ``errors`` (messages naming file
        and line; empty when valid), ``warnings``, and the statistics of
        :func:`dataset_statistics` (``train``, ``test``, ``overlap``) for every split that
        could be parsed. Statistics are computed even when references are missing; then (and
        with ``drop_missing``) ``coverage`` describes the files as written, the other numbers
        the data as they would be loaded.
    """
    errors: list[str] = []
    warnings: list[str] = []
    report: dict[str, Any] = {"path": str(path), "drop_missing": drop_missing}
    dirs: dict[str, Path | None] = {}
    try:
        found = split_directories(path)
        dirs = {"train": found["train"], "test": found["test"]}
    except DataFormatError as exc:
        errors.append(str(exc))
    stats: dict[str, Any] = {"train": None, "test": None}
    splits: dict[str, MindSplit | None] = {"train": None, "test": None}
    for name in ("train", "test"):
        directory = dirs.get(name)
        if directory is not None:
            stats[name], splits[name] = _check_split(name, directory, drop_missing, errors,
                                                     warnings)
    report["train"], report["test"] = stats["train"], stats["test"]
    report["overlap"] = None
    train, test = splits["train"], splits["test"]
    if train is not None and test is not None:
        report["overlap"] = _overlap(train, test)
        if train.behaviors and test.behaviors:
            last_train = max(imp.time for imp in train.behaviors)
            first_test = min(imp.time for imp in test.behaviors)
            if first_test < last_train:
                warnings.append(f"test impressions start ({first_test.isoformat()}) before "
                                f"train impressions end ({last_train.isoformat()}): not a "
                                "temporal split")
    valid = not errors
    report.update(valid=valid, errors=errors, warnings=warnings)
    return valid, report

