"""Atomic checkpoint files: a crash while saving never corrupts the previous checkpoint."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from privaterec.errors import CheckpointError


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` with ``torch.save`` to a temporary file, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` (tensors on CPU)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: checkpoint not found; train first with "
                              f"'privaterec train --out {path.parent}'")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a bad file
        raise CheckpointError(f"{path}: unreadable checkpoint ({exc}); delete it and "
                              f"train again") from None
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path}: not a privaterec checkpoint (no 'model' entry)")
    return state
