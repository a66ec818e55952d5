"""The fingerprint of the data a run trained on (``RUN/data.json``).

A run directory records, when its training starts, the size, modification time and SHA-256
of every file of its data set (``news.tsv`` and ``behaviors.tsv`` of each split,
:func:`privaterec.data.mind.split_directories`). Resuming the run, or evaluating it on "its"
data, first compares the data set as it is now with that record and refuses other data,
naming every file that changed: a run must not continue, or report, on data it did not
train on (docs/architecture.md, "Run directory").

The comparison is cheap: a file whose size and modification time (in ns) are those recorded
is taken as unchanged without reading it; any other file is hashed, so a copy or a ``touch``
with the same content still matches.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from privaterec.data.mind import BEHAVIORS_FILE, NEWS_FILE, split_directories
from privaterec.data.roster import ROSTER_FILE, is_public_dir
from privaterec.files import write_atomic

FINGERPRINT_VERSION = 1
_CHUNK = 1 << 20


@dataclass(frozen=True)
class FileState:
    """One data file as recorded: ``size`` in bytes, ``mtime_ns``, ``sha256`` (hex)."""

    size: int
    mtime_ns: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "mtime_ns": self.mtime_ns, "sha256": self.sha256}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def data_files(data: str | Path) -> dict[str, Path]:
    """The files of the data set ``data`` a run reads, by their path relative to ``data``
    (``train/news.tsv``, ..., or ``news.tsv`` for a single split; ``news.tsv`` and
    ``roster.txt`` for a deployed server's public directory, :mod:`privaterec.data.roster`).

    Raises
    ------
    DataFormatError
        If ``data`` is not a MIND data directory.
    """
    root = Path(data)
    files: dict[str, Path] = {}
    if is_public_dir(root):  # a deployed server's catalogue and roster, no behaviors
        return {name: root / name for name in (NEWS_FILE, ROSTER_FILE)}
    found = split_directories(root)
    for directory in (found["train"], found["test"]):
        if directory is None:
            continue
        for name in (NEWS_FILE, BEHAVIORS_FILE):
            path = directory / name
            files[path.relative_to(root).as_posix()] = path
    return files


def fingerprint(data: str | Path) -> dict[str, Any]:
    """The fingerprint of the data set ``data`` (hashes every file once), JSON-ready:
    ``{"version": 1, "files": {relative path: FileState fields}}``."""
    files: dict[str, Any] = {}
    for name, path in data_files(data).items():
        if path.is_file():
            stat = path.stat()
            files[name] = FileState(stat.st_size, stat.st_mtime_ns, _sha256(path)).to_dict()
    return {"version": FINGERPRINT_VERSION, "files": files}


def differences(recorded: Mapping[str, Any], data: str | Path) -> list[str]:
    """What differs between the data set ``data`` now and a recorded fingerprint: one line
    per file (changed content, missing now, new), empty when it is the same data.

    A file whose size and modification time match the record is not read.
    """
    old: Mapping[str, Any] = recorded.get("files", {})
    now = {name: path for name, path in data_files(data).items() if path.is_file()}
    changes: list[str] = []
    for name in sorted(old.keys() | now.keys()):
        if name not in now:
            changes.append(f"{name} is missing now")
            continue
        if name not in old:
            changes.append(f"{name} is new (the run trained without it)")
            continue
        state, stat = old[name], now[name].stat()
        if stat.st_size == state["size"] and stat.st_mtime_ns == state["mtime_ns"]:
            continue  # the fast path: same size and time, taken as the same file
        if stat.st_size != state["size"]:
            changes.append(f"{name} has {stat.st_size} bytes, the run trained on "
                           f"{state['size']}")
        elif _sha256(now[name]) != state["sha256"]:
            changes.append(f"{name}'s content changed (same size, {stat.st_size} bytes)")
    return changes


def read_fingerprint(path: Path) -> dict[str, Any] | None:
    """The fingerprint saved at ``path`` (``None`` when there is none: a run written before
    runs recorded their data)."""
    if not path.is_file():
        return None
    return dict(json.loads(path.read_text()))


def write_fingerprint(path: Path, data: str | Path) -> None:
    """Record the fingerprint of ``data`` at ``path`` (written atomically)."""
    write_atomic(path, json.dumps(fingerprint(data), indent=2, sort_keys=True))


__all__ = ["FileState", "data_files", "differences", "fingerprint", "read_fingerprint",
           "write_fingerprint"]
