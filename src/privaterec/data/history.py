"""Fixed-length click histories as rows of a news feature table.

Histories are truncated to their most recent ``history_len`` clicks, right-aligned and
left-padded with row 0 (the anonymous news r₀ of PrivateRec §3.1, see
:mod:`privaterec.data.features`); the mask is ``True`` for real clicks. This is the layout
:class:`privaterec.models.recommender.Recommender` expects.
"""

from __future__ import annotations

from typing import Sequence

import torch

from privaterec.data.features import ANONYMOUS_NEWS, NewsFeatures


def check_history_len(history_len: int) -> None:
    """Raise ``ValueError`` naming ``history_len`` unless it is a positive integer."""
    if isinstance(history_len, bool) or not isinstance(history_len, int) or history_len < 1:
        raise ValueError(f"history_len must be a positive integer, got {history_len!r}")


def history_rows(history_ids: Sequence[str], features: NewsFeatures,
                 history_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Table rows and mask of the last ``history_len`` clicks, right-aligned.

    Parameters
    ----------
    history_ids:
        Clicked news ids, oldest first (MIND order).
    features:
        The news table the rows index into.
    history_len:
        H, the fixed history length.

    Returns
    -------
    rows:
        ``LongTensor[H]``: ``rows[H-m:]`` are the rows of the last ``m = min(H, len(history))``
        clicks in their original order; the first ``H-m`` entries are row 0.
    mask:
        ``BoolTensor[H]``, ``True`` exactly where ``rows`` holds a real click.

    Raises
    ------
    KeyError
        Naming the first of the kept history ids that is not in ``features`` (only the last
        ``history_len`` ids are looked up).
    ValueError
        If ``history_len`` is not a positive integer.
    """
    check_history_len(history_len)
    kept = list(history_ids)[-history_len:] if history_ids else []
    rows = torch.full((history_len,), ANONYMOUS_NEWS, dtype=torch.long)
    mask = torch.zeros(history_len, dtype=torch.bool)
    if kept:
        rows[history_len - len(kept):] = torch.tensor(features.rows_of(kept), dtype=torch.long)
        mask[history_len - len(kept):] = True
    return rows, mask
