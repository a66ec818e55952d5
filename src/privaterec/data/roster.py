"""The public directory of a deployed server: the news catalogue and the roster.

A deployed Flower server (``flwr run`` with ``public-dir``, docs/flower.md) holds no user
data (docs/privacy.md#threat-model). Its directory holds only

* ``news.tsv`` — the public news catalogue (MIND format,
  :func:`~privaterec.data.mind.read_news`), from which the server fits the vocabularies it ships to the devices;
* ``roster.txt`` — the ids of the enrolled devices' users, one per line, sorted: who
  rounds sample from (:func:`privaterec.data.clients.roster_clients`). It says who is
  enrolled and nothing of what anyone clicked.

:func:`write_public_dir` writes both from a data set's training split (the
``privaterec data public-dir`` command); the behaviors file is read there, by whoever
enrols the users, and never by the server. :func:`write_device_dirs` writes the other side
of the same split for a rehearsal on one machine: one data directory per user, holding that
user's impressions only (``privaterec data device-dirs``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from privaterec.data.mind import (BEHAVIORS_FILE, NEWS_FILE, load_dataset, read_behaviors,
                                  split_directories, write_split)
from privaterec.data.records import Impression, MindSplit
from privaterec.errors import DataFormatError

ROSTER_FILE = "roster.txt"
"""The roster's file name in a server's public directory."""


def read_roster(path: str | Path) -> list[str]:
    """The user ids of a roster file, in file order.

    Raises
    ------
    DataFormatError
        If the file is missing, empty, or a line is blank, holds whitespace or repeats an id
        (naming the line).
    """
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(path, None, "not found; write it with `privaterec data "
                              "public-dir DATA OUT` (one enrolled user id per line)")
    ids: list[str] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        uid = line.strip("\r")
        if not uid or any(c.isspace() for c in uid):
            raise DataFormatError(path, lineno, f"expected one user id without whitespace, "
                                  f"got {line!r}")
        if uid in seen:
            raise DataFormatError(path, lineno, f"user id {uid!r} repeats line {seen[uid]}")
        seen[uid] = lineno
        ids.append(uid)
    if not ids:
        raise DataFormatError(path, None, "holds no user id; a server needs at least one "
                              "enrolled user")
    return ids


def write_roster(path: str | Path, user_ids: list[str]) -> None:
    """Write ``user_ids`` (sorted, one per line) to ``path``."""
    Path(path).write_text("".join(f"{uid}\n" for uid in sorted(set(user_ids))),
                          encoding="utf-8")


def is_public_dir(path: str | Path) -> bool:
    """Whether ``path`` is a server's public directory (it holds a roster)."""
    return (Path(path) / ROSTER_FILE).is_file()


def write_public_dir(data: str | Path, out: str | Path) -> list[str]:
    """Write a server's public directory ``out`` from the data set ``data``: its training
    split's ``news.tsv`` copied as is, and the roster of the users of its ``behaviors.tsv``.

    Returns the roster's user ids.

    Raises
    ------
    DataFormatError
        If ``data`` is not a MIND data directory or ``out`` holds a behaviors file.
    """
    train = split_directories(data)["train"]
    users = sorted({imp.user_id for imp in read_behaviors(train / BEHAVIORS_FILE)})
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if (out / BEHAVIORS_FILE).exists():
        raise DataFormatError(out, None, "holds behaviors.tsv; a server's public directory "
                              "must hold no user data: choose an empty directory")
    shutil.copyfile(train / NEWS_FILE, out / NEWS_FILE)
    write_roster(out / ROSTER_FILE, users)
    return users


def write_device_dirs(data: str | Path, out: str | Path) -> dict[str, Path]:
    """Write one device data directory per user of the data set ``data`` under ``out``.

    ``out/<user id>/train/`` holds the training split's ``news.tsv`` and the user's own
    training impressions; ``out/<user id>/test/`` (when ``data`` has a test split and the
    user has test impressions) the test split's ``news.tsv`` and the user's own test
    impressions. Each is a SuperNode's ``data-dir`` (docs/flower.md, "Real deployment").

    Returns the user ids (of the training split) and their directories.

    Raises
    ------
    DataFormatError
        If ``data`` is not a MIND data directory, a user id cannot name a directory, or
        ``out`` already holds a device directory.
    """
    dataset = load_dataset(data)
    out = Path(out)
    users = sorted({imp.user_id for imp in dataset.train.behaviors})
    for uid in users:
        if uid in (".", "..") or "/" in uid or "\\" in uid:
            raise DataFormatError(Path(data), None, f"user id {uid!r} cannot name a "
                                  f"device directory")
        if (out / uid).exists():
            raise DataFormatError(out / uid, None, "exists; write the device directories "
                                  "into a new directory")
    train: dict[str, list[Impression]] = {}
    for imp in dataset.train.behaviors:
        train.setdefault(imp.user_id, []).append(imp)
    test: dict[str, list[Impression]] = {}
    for imp in dataset.test.behaviors if dataset.test is not None else []:
        test.setdefault(imp.user_id, []).append(imp)
    dirs: dict[str, Path] = {}
    for uid in users:
        dirs[uid] = out / uid
        write_split(dirs[uid] / "train", MindSplit(news=dataset.train.news,
                                                   behaviors=train[uid]))
        if dataset.test is not None and uid in test:
            write_split(dirs[uid] / "test", MindSplit(news=dataset.test.news,
                                                      behaviors=test[uid]))
    return dirs


__all__ = ["ROSTER_FILE", "is_public_dir", "read_roster", "write_device_dirs",
           "write_public_dir", "write_roster"]
