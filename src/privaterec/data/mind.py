"""Reading, validating and writing MIND-format data (docs/data.md).

A *split* is a directory with ``news.tsv`` and ``behaviors.tsv``; a *data set* directory is
either one split (``news.tsv`` and ``behaviors.tsv`` directly inside: train only) or holds
``train/`` and, optionally, ``test/`` split subdirectories.

``news.tsv`` has 8 tab-separated columns: news id, category, subcategory, title, abstract, url,
title entities, abstract entities. ``behaviors.tsv`` has 5: impression id, user id, time
(``M/D/YYYY H:MM:SS AM``, see :data:`~privaterec.data.records.MIND_TIME_FORMAT`; zero-padded
fields are accepted too), space-separated history, space-separated candidates. Candidates are
either all ``NID-label`` with label 0/1 (a labelled impression) or all bare ``NID`` (unlabelled,
as in the MIND test set); a token containing ``-`` is read as labelled, so an unlabelled news
id must not contain ``-``.

Readers check every line and raise :class:`~privaterec.errors.DataFormatError` naming the file,
the 1-based line and what is wrong. Blank lines are skipped; a UTF-8 byte-order mark and CRLF
line ends are accepted. News ids referenced by behaviors but absent from ``news.tsv`` are an
error (:class:`~privaterec.errors.MissingNewsError`) unless ``drop_missing=True``, which drops
the references and reports what was dropped in :attr:`MindSplit.dropped`.

Writers produce exactly what the readers read back. Text fields cannot hold the separators,
so writers replace tab, carriage return and newline characters inside text fields by a space;
ids (news, impression, user) containing whitespace are rejected instead, since changing an id
would change the data. Times are written at one-second resolution (MIND has no fractions of a
second; they are truncated) as wall-clock time, without time zone.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, TypedDict, TypeVar

from privaterec.data.records import (
    Impression,
    MindDataset,
    MindSplit,
    NewsRecord,
)
from privaterec.errors import DataFormatError, MissingNewsError

__all__ = [
    "NEWS_FILE",
    "BEHAVIORS_FILE",
    "NEWS_COLUMNS",
    "BEHAVIORS_COLUMNS",
    "DROPPED_KEYS",
    "read_news",
    "read_behaviors",
    "write_news",
    "write_behaviors",
    "format_time",
    "parse_time",
    "missing_references",
    "apply_missing_policy",
    "read_split",
    "write_split",
    "SplitDirectories",
    "split_directories",
    "load_dataset",
    "write_dataset",
]

logger = logging.getLogger(__name__)
R = TypeVar("R")

NEWS_FILE = "news.tsv"
BEHAVIORS_FILE = "behaviors.tsv"
NEWS_COLUMNS = ("news_id", "category", "subcategory", "title", "abstract", "url",
                "title_entities", "abstract_entities")
BEHAVIORS_COLUMNS = ("impression_id", "user_id", "time", "history", "candidates")
#: Keys of :attr:`MindSplit.dropped`, filled by :func:`read_split`.
DROPPED_KEYS = ("missing_news_ids", "history_references", "candidate_references", "clicks",
                "impressions")

_TIME_HINT = "MM/DD/YYYY HH:MM:SS AM|PM (e.g. 11/9/2019 8:36:57 AM)"
_FIELD_BREAKS = str.maketrans({"\t": " ", "\n": " ", "\r": " "})


# ----------------------------------------------------------------------------- low level
def _lines(path: Path, errors: list[DataFormatError] | None = None
           ) -> Iterator[tuple[int, str]]:
    """Yield ``(line number, text without line end)``; skips blank lines.

    Lines end only at ``\\n`` (a lone ``\\r`` inside a field does not split a line). With
    ``errors``, a line that is not UTF-8 is recorded there and skipped instead of raising.
    """
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        raise DataFormatError(path, None, "file not found") from None
    except IsADirectoryError:
        raise DataFormatError(path, None, "is a directory, expected a file") from None
    with handle:
        for lineno, raw in enumerate(handle, start=1):
            if raw.endswith(b"\n"):
                raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                error = DataFormatError(path, lineno, f"not valid UTF-8 text ({exc.reason} at "
                                        f"byte {exc.start} of the line)")
                if errors is None:
                    raise error from None
                errors.append(error)
                continue
            yield lineno, line


def _records(path: Path, errors: list[DataFormatError] | None,
             parse: Callable[[int, str], R]) -> Iterator[R]:
    """Yield ``parse(line number, line)`` for each line of ``path``; with ``errors``, a line
    that raises :class:`DataFormatError` is recorded there and skipped instead of raising."""
    for lineno, line in _lines(path, errors):
        try:
            yield parse(lineno, line)
        except DataFormatError as exc:
            if errors is None:
                raise
            errors.append(exc)


def _has_space(text: str) -> bool:
    return len(text.split()) != 1 or text.strip() != text


def parse_time(value: str) -> datetime:
    """Parse a MIND time ``M/D/YYYY H:MM:SS AM`` (12-hour clock); raise ``ValueError`` if bad.

    Equivalent to ``datetime.strptime(value, MIND_TIME_FORMAT)`` for well-formed values but
    about three times faster, which matters for the 150k lines of MIND-small.
    """
    try:
        date, clock, half = value.split(" ")
        month, day, year = date.split("/")
        hour, minute, second = clock.split(":")
        if (len(year) != 4 or not 1 <= len(month) <= 2 or not 1 <= len(day) <= 2
                or not 1 <= len(hour) <= 2 or len(minute) != 2 or len(second) != 2):
            raise ValueError(value)
        h = int(hour)
        half = half.upper()
        if not 1 <= h <= 12 or half not in ("AM", "PM"):
            raise ValueError(value)
        h = h % 12 + (12 if half == "PM" else 0)
        return datetime(int(year), int(month), int(day), h, int(minute), int(second))
    except (ValueError, TypeError):
        raise ValueError(f"time {value!r} is not in the MIND format {_TIME_HINT}") from None


def format_time(time: datetime) -> str:
    """Format a time like MIND does: ``11/9/2019 8:36:57 AM`` (no zero padding, no fraction)."""
    hour = time.hour % 12 or 12
    half = "AM" if time.hour < 12 else "PM"
    return (f"{time.month}/{time.day}/{time.year:04d} {hour}:{time.minute:02d}:"
            f"{time.second:02d} {half}")


# ----------------------------------------------------------------------------- news.tsv
def read_news(path: str | Path, *, errors: list[DataFormatError] | None = None
              ) -> dict[str, NewsRecord]:
    """Read and validate a MIND ``news.tsv``.

    Parameters
    ----------
    path:
        The file.
    errors:
        If given, every bad line is appended here (as its :class:`DataFormatError`) and
        skipped, so one pass finds all of them (``data check``); otherwise the first raises.

    Returns
    -------
    dict
        News id → :class:`NewsRecord`, in file order.

    Raises
    ------
    DataFormatError
        A line without exactly 8 tab-separated columns, an empty news id or one containing
        whitespace, or a news id that appears twice (both line numbers are named).
    """
    path = Path(path)
    first_line: dict[str, int] = {}
    records = _records(path, errors, lambda lineno, line: _news_line(path, lineno, line,
                                                                     first_line))
    return {record.news_id: record for record in records}


def _news_line(path: Path, lineno: int, line: str, first_line: dict[str, int]) -> NewsRecord:
    """One validated ``news.tsv`` line (``first_line``: news id → line, updated)."""
    fields = line.split("\t")
    if len(fields) != 8:
        raise DataFormatError(
            path, lineno, f"expected 8 tab-separated columns ({', '.join(NEWS_COLUMNS)}), "
            f"found {len(fields)}")
    news_id = fields[0]
    if not news_id:
        raise DataFormatError(path, lineno, "empty news id in column 1")
    if _has_space(news_id):
        raise DataFormatError(path, lineno, f"news id {news_id!r} contains whitespace")
    if news_id in first_line:
        raise DataFormatError(path, lineno, f"duplicate news id {news_id!r}: first on line "
                              f"{first_line[news_id]}, again on line {lineno}")
    first_line[news_id] = lineno
    return NewsRecord(*fields)


def _clean(text: str) -> str:
    return text.translate(_FIELD_BREAKS)


def _check_id(kind: str, value: str, where: str) -> str:
    if not value or _has_space(value):
        raise ValueError(f"cannot write {where}: {kind} {value!r} is empty or contains "
                         f"whitespace, which the MIND format cannot represent")
    return value


def write_news(path: str | Path, news: Mapping[str, NewsRecord] | Iterable[NewsRecord]) -> None:
    """Write news records as a MIND ``news.tsv`` (inverse of :func:`read_news`).

    Tab, newline and carriage-return characters inside text fields become spaces. Raises
    ``ValueError`` for a news id that is empty or contains whitespace.
    """
    path = Path(path)
    records = news.values() if isinstance(news, Mapping) else news
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        for r in records:
            _check_id("news id", r.news_id, str(path))
            handle.write("\t".join((r.news_id, _clean(r.category), _clean(r.subcategory),
                                    _clean(r.title), _clean(r.abstract), _clean(r.url),
                                    _clean(r.title_entities), _clean(r.abstract_entities))))
            handle.write("\n")


# ----------------------------------------------------------------------------- behaviors.tsv
def _parse_candidates(path: Path, lineno: int, field: str
                      ) -> tuple[tuple[str, ...], tuple[int, ...] | None]:
    tokens = field.split()
    if not tokens:
        raise DataFormatError(path, lineno, "empty candidate list in column 5 (every impression "
                              "needs at least one candidate)")
    if all(len(t) > 2 and (t.endswith("-1") or t.endswith("-0")) for t in tokens):
        return (tuple(t[:-2] for t in tokens), tuple(1 if t[-1] == "1" else 0 for t in tokens))
    if not any("-" in t for t in tokens):
        return tuple(tokens), None
    # Diagnose: a bad label, or labelled and unlabelled candidates mixed.
    labelled = [t for t in tokens if "-" in t]
    for t in labelled:
        news_id, _, label = t.rpartition("-")
        if not news_id:
            raise DataFormatError(path, lineno, f"candidate {t!r} has an empty news id")
        if label not in ("0", "1"):
            raise DataFormatError(path, lineno, f"candidate {t!r} has label {label!r}; "
                                  f"expected NID-0 or NID-1")
    bare = next(t for t in tokens if "-" not in t)
    raise DataFormatError(path, lineno, f"candidates mix labelled (e.g. {labelled[0]!r}) and "
                          f"unlabelled (e.g. {bare!r}) tokens; label all (NID-0/NID-1) or none")


def read_behaviors(path: str | Path, *, errors: list[DataFormatError] | None = None
                   ) -> list[Impression]:
    """Read and validate a MIND ``behaviors.tsv``.

    Parameters
    ----------
    path, errors:
        As in :func:`read_news`.

    Returns
    -------
    list of Impression
        In file order. ``labels`` is ``None`` for an impression whose candidates carry no label.

    Raises
    ------
    DataFormatError
        Not exactly 5 columns, empty or duplicate impression id, empty user id, a time not in
        MIND format, an empty candidate list, a bad label (``N1-2``, ``N1-x``) or labelled and
        unlabelled candidates mixed in one line. The message names the line and the value.
    """
    path = Path(path)
    first_line: dict[str, int] = {}
    # A user's history repeats on each of their impressions: share one tuple per distinct
    # history string (less memory, and lets checks skip histories they have already seen).
    histories: dict[str, tuple[str, ...]] = {}
    return list(_records(path, errors, lambda lineno, line: _behavior_line(
        path, lineno, line, first_line, histories)))


def _behavior_line(path: Path, lineno: int, line: str, first_line: dict[str, int],
                   histories: dict[str, tuple[str, ...]]) -> Impression:
    """One validated ``behaviors.tsv`` line (``first_line``, ``histories`` updated)."""
    fields = line.split("\t")
    if len(fields) != 5:
        raise DataFormatError(
            path, lineno, f"expected 5 tab-separated columns ({', '.join(BEHAVIORS_COLUMNS)}"
            f"), found {len(fields)}")
    impression_id, user_id, time_text, history, candidates = fields
    if not impression_id or _has_space(impression_id):
        raise DataFormatError(path, lineno, f"impression id {impression_id!r} is empty or "
                              "contains whitespace")
    if impression_id in first_line:
        raise DataFormatError(path, lineno, f"duplicate impression id {impression_id!r}: "
                              f"first on line {first_line[impression_id]}, again on line "
                              f"{lineno}")
    first_line[impression_id] = lineno
    if not user_id or _has_space(user_id):
        raise DataFormatError(path, lineno, f"user id {user_id!r} is empty or contains "
                              "whitespace")
    try:
        time = parse_time(time_text)
    except ValueError as exc:
        raise DataFormatError(path, lineno, str(exc)) from None
    cands, labels = _parse_candidates(path, lineno, candidates)
    hist = histories.get(history)
    if hist is None:
        hist = histories[history] = tuple(history.split())
    return Impression(impression_id, user_id, time, hist, cands, labels)


def write_behaviors(path: str | Path, behaviors: Iterable[Impression]) -> None:
    """Write impressions as a MIND ``behaviors.tsv`` (inverse of :func:`read_behaviors`).

    Times are written by :func:`format_time` (seconds resolution). Raises ``ValueError`` for an
    id containing whitespace, an impression without candidates, or labels whose number differs
    from the number of candidates or that are not 0/1.
    """
    path = Path(path)
    where = str(path)
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        for imp in behaviors:
            _check_id("impression id", imp.impression_id, where)
            _check_id("user id", imp.user_id, where)
            if not imp.candidates:
                raise ValueError(f"cannot write {where}: impression {imp.impression_id!r} has "
                                 "no candidates")
            if imp.labels is None:
                if any("-" in n for n in imp.candidates):
                    raise ValueError(f"cannot write {where}: unlabelled impression "
                                     f"{imp.impression_id!r} has a candidate id containing '-', "
                                     "which would be read back as NID-label")
                cands = " ".join(imp.candidates)
            else:
                if len(imp.labels) != len(imp.candidates) or any(y not in (0, 1)
                                                                 for y in imp.labels):
                    raise ValueError(f"cannot write {where}: impression {imp.impression_id!r} "
                                     "needs one 0/1 label per candidate")
                cands = " ".join(f"{n}-{int(y)}" for n, y in zip(imp.candidates, imp.labels))
            if len(cands.split()) != len(imp.candidates) or not all(imp.candidates):
                raise ValueError(f"cannot write {where}: impression {imp.impression_id!r} has "
                                 "an empty candidate id or one containing whitespace")
            history = " ".join(imp.history)
            if len(history.split()) != len(imp.history):
                raise ValueError(f"cannot write {where}: impression {imp.impression_id!r} has "
                                 "an empty history id or one containing whitespace")
            handle.write(f"{imp.impression_id}\t{imp.user_id}\t{format_time(imp.time)}\t"
                         f"{history}\t{cands}\n")


# ----------------------------------------------------------------------------- splits
def missing_references(news: Mapping[str, NewsRecord] | set[str],
                       behaviors: Iterable[Impression]) -> tuple[list[str], int]:
    """News ids referenced by ``behaviors`` but absent from ``news``.

    Returns
    -------
    (missing, affected)
        Distinct missing ids in order of first reference, and the number of impressions that
        reference at least one of them.
    """
    missing: dict[str, None] = {}
    affected = 0
    # id(history) -> (history, references missing news); histories shared between
    # impressions are checked once. The tuple is kept in the value so its id stays unique.
    history_hit: dict[int, tuple[tuple[str, ...], bool]] = {}
    for imp in behaviors:
        cached = history_hit.get(id(imp.history))
        if cached is None:
            hit = False
            for n in imp.history:
                if n not in news:
                    missing[n] = None
                    hit = True
            history_hit[id(imp.history)] = (imp.history, hit)
        else:
            hit = cached[1]
        for n in imp.candidates:
            if n not in news:
                missing[n] = None
                hit = True
        affected += hit
    return list(missing), affected


def apply_missing_policy(split: MindSplit, *, drop_missing: bool = False) -> MindSplit:
    """Check that every news id referenced by ``split.behaviors`` is in ``split.news``.

    Parameters
    ----------
    split:
        A split as read from its files (``split.path`` names the directory, if any).
    drop_missing:
        ``False`` (default): raise :class:`MissingNewsError` when references are missing.
        ``True``: drop the missing references from histories and candidates. An impression is
        dropped whole when no candidate is left, or when it is labelled, had at least one
        click, and every clicked candidate was dropped (nothing left to learn from or to
        evaluate). Labelled impressions that never had a click are kept as they are.

    Returns
    -------
    MindSplit
        A new split whose ``dropped`` holds, for :data:`DROPPED_KEYS`: distinct missing news
        ids, history references dropped, candidate references dropped, clicks dropped (clicked
        candidates among the dropped candidate references) and impressions dropped. All zero
        when nothing is missing. A warning is logged when anything was dropped.
    """
    behaviors_path = (split.path / BEHAVIORS_FILE) if split.path is not None else BEHAVIORS_FILE
    missing, affected = missing_references(split.news, split.behaviors)
    dropped = dict.fromkeys(DROPPED_KEYS, 0)
    if not missing:
        return MindSplit(split.news, list(split.behaviors), split.path, dropped)
    if not drop_missing:
        raise MissingNewsError(behaviors_path, len(missing), missing[:5], affected)
    news = split.news
    dropped["missing_news_ids"] = len(missing)
    kept: list[Impression] = []
    filtered: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {}  # as in missing_references
    for imp in split.behaviors:
        cached = filtered.get(id(imp.history))
        if cached is None:
            cached = filtered[id(imp.history)] = (imp.history,
                                                  tuple(n for n in imp.history if n in news))
        history = cached[1]
        dropped["history_references"] += len(imp.history) - len(history)
        keep = [i for i, n in enumerate(imp.candidates) if n in news]
        dropped["candidate_references"] += len(imp.candidates) - len(keep)
        labels = None
        if imp.labels is not None:
            labels = tuple(imp.labels[i] for i in keep)
            clicks_before = sum(imp.labels)
            dropped["clicks"] += clicks_before - sum(labels)
        if not keep or (labels is not None and clicks_before > 0 and sum(labels) == 0):
            dropped["impressions"] += 1
            continue
        if len(keep) == len(imp.candidates) and len(history) == len(imp.history):
            kept.append(imp)
        else:
            kept.append(Impression(imp.impression_id, imp.user_id, imp.time, history,
                                   tuple(imp.candidates[i] for i in keep), labels))
    logger.warning("%s: dropped references to %d news ids missing from news.tsv: %s",
                   behaviors_path, len(missing),
                   ", ".join(f"{k}={v}" for k, v in dropped.items()))
    return MindSplit(news, kept, split.path, dropped)


def read_split(directory: str | Path, *, drop_missing: bool = False) -> MindSplit:
    """Read one split directory holding ``news.tsv`` and ``behaviors.tsv``.

    Parameters
    ----------
    directory:
        The split directory.
    drop_missing:
        See :func:`apply_missing_policy`: by default references to news absent from
        ``news.tsv`` raise :class:`MissingNewsError` (naming ``behaviors.tsv``, the number of
        distinct missing ids, up to five examples and the number of affected impressions);
        with ``True`` they are dropped and counted in ``split.dropped``.

    Raises
    ------
    DataFormatError
        The directory or one of the two files does not exist, or a line is malformed.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise DataFormatError(directory, None, "is not a directory; a MIND split is a directory "
                              f"holding {NEWS_FILE} and {BEHAVIORS_FILE}")
    for name in (NEWS_FILE, BEHAVIORS_FILE):
        if not (directory / name).is_file():
            raise DataFormatError(directory / name, None,
                                  f"file not found: a MIND split directory needs {NEWS_FILE} "
                                  f"and {BEHAVIORS_FILE}")
    news = read_news(directory / NEWS_FILE)
    behaviors = read_behaviors(directory / BEHAVIORS_FILE)
    return apply_missing_policy(MindSplit(news, behaviors, directory),
                                drop_missing=drop_missing)


def write_split(directory: str | Path, split: MindSplit) -> None:
    """Write ``news.tsv`` and ``behaviors.tsv`` of one split into ``directory`` (created)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_news(directory / NEWS_FILE, split.news)
    write_behaviors(directory / BEHAVIORS_FILE, split.behaviors)


class SplitDirectories(TypedDict):
    """The split directories of a data set (:func:`split_directories`)."""

    train: Path
    test: Path | None


def split_directories(path: str | Path) -> SplitDirectories:
    """The split directories of a data-set directory: ``{"train": dir, "test": dir or None}``.

    A directory holding ``news.tsv`` or ``behaviors.tsv`` is a single (train) split;
    otherwise it must hold a ``train/`` subdirectory and may hold ``test/``.

    Raises
    ------
    DataFormatError
        ``path`` is not a directory or has neither layout (the message lists what it holds).
    """
    path = Path(path)
    if not path.exists():
        raise DataFormatError(path, None, "does not exist")
    if not path.is_dir():
        raise DataFormatError(path, None, "is a file; pass the data directory that holds "
                              f"{NEWS_FILE} and {BEHAVIORS_FILE} (or train/ and test/)")
    if (path / NEWS_FILE).exists() or (path / BEHAVIORS_FILE).exists():
        return {"train": path, "test": None}
    if (path / "train").is_dir():
        test = path / "test"
        return {"train": path / "train", "test": test if test.is_dir() else None}
    found = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    shown = ", ".join(found[:10]) + (", ..." if len(found) > 10 else "") if found else "nothing"
    raise DataFormatError(path, None, f"is not a MIND data directory: expected {NEWS_FILE} and "
                          f"{BEHAVIORS_FILE} directly inside, or train/ and test/ "
                          f"subdirectories that hold them; found {shown}")


def load_dataset(path: str | Path, *, drop_missing: bool = False) -> MindDataset:
    """Load a data-set directory (see :func:`split_directories` for the two layouts).

    ``drop_missing`` applies to each split (see :func:`read_split`); each split resolves its
    references against its own ``news.tsv``.
    """
    dirs = split_directories(path)
    train = read_split(dirs["train"], drop_missing=drop_missing)
    test_dir = dirs["test"]
    test = read_split(test_dir, drop_missing=drop_missing) if test_dir is not None else None
    return MindDataset(train=train, test=test, path=Path(path))


def write_dataset(path: str | Path, dataset: MindDataset) -> None:
    """Write ``path/train/`` and, when the data set has one, ``path/test/``."""
    path = Path(path)
    write_split(path / "train", dataset.train)
    if dataset.test is not None:
        write_split(path / "test", dataset.test)
