"""Atomic checkpoint files: a crash while saving never corrupts the previous checkpoint."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from privaterec.errors import CheckpointError
from privaterec.files import write_atomic


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` with ``torch.save`` atomically (:func:`~privaterec.files.write_atomic`)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_atomic(Path(path), buffer.getvalue())


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
