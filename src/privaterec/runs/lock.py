"""One training at a time per run directory: the lock file ``RUN/train.lock``.

:func:`run_lock` takes an exclusive ``fcntl.flock`` on ``RUN/train.lock`` and writes the
holder's process id into it. A second training into the same directory fails at once with a
:class:`~privaterec.errors.CheckpointError` naming that process. The kernel releases a
``flock`` when its holder exits, however it exits, so a lock file left behind by a killed
process (a stale lock: its PID is dead) is simply taken over; on a clean exit the holder
removes the file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from typing import Iterator

from privaterec.errors import CheckpointError

LOCK_FILE = "train.lock"


def _holder(path: Path) -> str:
    """The process id written in the lock file (``"?"`` when unreadable)."""
    try:
        return path.read_text().strip() or "?"
    except OSError:
        return "?"


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold the training lock of ``run_dir`` (created if needed) for the ``with`` block.

    Raises
    ------
    CheckpointError
        If another process holds it; the message names that process's id.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            raise CheckpointError(
                f"{run_dir}: another training into this run directory is running (process "
                f"{_holder(path)}, lock file {path}); wait for it to finish or stop it, or "
                f"train into another --out") from None
        # The holder before us may have removed the file between our open and our lock:
        # then we locked a file no one else sees; take the one at the path instead.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        os.close(fd)


__all__ = ["LOCK_FILE", "run_lock"]
