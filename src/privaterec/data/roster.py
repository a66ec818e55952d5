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
enrols the users, and never by the server.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from privaterec.data.mind import BEHAVIORS_FILE, NEWS_FILE, read_behaviors, split_directories
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


__all__ = ["ROSTER_FILE", "is_public_dir", "read_roster", "write_public_dir", "write_roster"]
