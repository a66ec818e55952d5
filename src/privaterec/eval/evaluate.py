"""Offline evaluation of a :class:`~privaterec.models.recommender.Recommender` on a MIND split.

Every distinct news the split uses is encoded once (docs/architecture.md#performance-design: "cache
news vectors during evaluation"), users are encoded in batches from the cached vectors, and each
candidate's score is the dot product ŷ = uᵀr (FedNewsRec §3.1, PrivateRec §3.1). Metrics are MIND's
per-impression AUC, MRR, nDCG@5 and nDCG@10 (:func:`privaterec.eval.metrics.evaluate_impressions`).

Two seams let private serving plug in without re-implementing the loop:

* ``history_transform(vectors [b, H, d], mask [b, H]) -> (vectors, mask)`` acts on the clicked
  news vectors before the user encoder (e.g. PrivateRec's random behavior padding, Alg. 2);
* ``user_transform(user [b, d]) -> [b, d]`` replaces the user vector before scoring (e.g. the
  VDP baseline's clipped noisy u, or PrivateRec's ũ = Σ α̃ᵢ bᵢ).

Both default to the identity. A third seam, ``user_encoder(vectors [b, H, d], mask [b, H])
-> [b, d]``, replaces the model's user encoder altogether (private serving, where the device
releases a noisy representation: :mod:`privaterec.eval.serving`). They run under
``torch.no_grad()``; a seam that draws randomness must carry its own ``NoiseSource``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from privaterec.data.features import ANONYMOUS_NEWS, NewsFeatures
from privaterec.data.history import check_history_len, history_rows
from privaterec.data.records import Impression, MindSplit
from privaterec.errors import DataFormatError
from privaterec.eval.metrics import evaluate_impressions
from privaterec.models.layers import eval_mode
from privaterec.models.recommender import Recommender

UserTransform = Callable[[torch.Tensor], torch.Tensor]
"""``user [b, d] -> user' [b, d]``, applied to each batch of user vectors before scoring."""

HistoryTransform = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""``(vectors [b, H, d], mask [b, H]) -> (vectors', mask')`` before the user encoder."""

UserEncoderFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(vectors [b, H, d], mask [b, H]) -> user [b, d]``, in place of ``model.encode_user``."""

CandidateTransform = Callable[[torch.Tensor], torch.Tensor]
"""``news [U, d] -> news' [U, D]``: the candidates' vectors in the space the user vectors of
``user_encoder`` live in (local ranking: the columns of P = b·Rᵀ, D = B)."""

_MAX_EXAMPLES = 5


@dataclass
class ScoredImpressions:
    """Per-impression scores of the labelled impressions of a split, in file order.

    Attributes
    ----------
    impression_ids:
        Id of each scored impression.
    pairs:
        ``(labels int64[C_i], scores float32[C_i])`` per impression, candidates in file order;
        the input of :func:`~privaterec.eval.metrics.evaluate_impressions`.
    unlabelled_impressions:
        Impressions of the split without labels; they are skipped.
    """

    impression_ids: list[str]
    pairs: list[tuple[np.ndarray, np.ndarray]]
    unlabelled_impressions: int


def _where(split: MindSplit) -> str:
    return str(split.path) if split.path is not None else "<in-memory split>"


def _check_coverage(split: MindSplit, impressions: list[Impression], features: NewsFeatures,
                    history_len: int) -> None:
    """Raise a clear error if a kept history item or a candidate is not in ``features``."""
    known = features.row
    missing: dict[str, None] = {}
    affected = 0
    for imp in impressions:
        absent = [n for n in (*imp.history[-history_len:], *imp.candidates) if n not in known]
        if absent:
            affected += 1
            missing.update(dict.fromkeys(absent))
    if missing:
        examples = ", ".join(list(missing)[:_MAX_EXAMPLES])
        raise DataFormatError(
            _where(split), None,
            f"{len(missing)} news ids used by {affected} impressions are not in the news "
            f"feature table (e.g. {examples}). Build the features from news covering this "
            f"split (e.g. build_news_features(dataset.all_news(), ...)), or read the data "
            f"with --drop-missing to drop the references.")


def _check_labelled(split: MindSplit, imp: Impression) -> None:
    assert imp.labels is not None
    if not imp.candidates or len(imp.labels) != len(imp.candidates):
        raise DataFormatError(
            _where(split), None,
            f"impression {imp.impression_id!r} has {len(imp.candidates)} candidates and "
            f"{len(imp.labels)} labels; every labelled impression needs one label per "
            f"candidate and at least one candidate")


def _encode_news(model: Recommender, features: NewsFeatures, rows: torch.Tensor,
                 batch_size: int, progress: bool) -> torch.Tensor:
    """Θ_N of each of ``rows`` (distinct table rows, ``[U]``) once → ``Tensor[U, d]``."""
    chunks = []
    device = next(iter(model.parameters()), torch.zeros(0)).device  # the CPU without any
    table = features.to(device)  # one copy of the table, not one per batch
    for chunk in tqdm(rows.split(batch_size), desc="encoding news", unit="batch",
                      disable=not progress):
        chunks.append(model.encode_features(table.select(chunk.to(device))))
    return torch.cat(chunks)


def score_impressions(model: Recommender, split: MindSplit, features: NewsFeatures, *,
                      history_len: int, batch_size: int = 256, progress: bool = False,
                      user_transform: UserTransform | None = None,
                      history_transform: HistoryTransform | None = None,
                      user_encoder: UserEncoderFn | None = None,
                      candidate_transform: CandidateTransform | None = None
                      ) -> ScoredImpressions:
    """Click scores ŷ = uᵀr of every candidate of every labelled impression of ``split``.

    The model is put in eval mode (and restored afterwards) and run under ``torch.no_grad()``.
    Each distinct news row the split uses (kept history items, candidates, and row 0 if some
    history is shorter than ``history_len``) is encoded once, ``batch_size`` rows at a time.
    Users are then encoded ``batch_size`` impressions at a time from the cached vectors:
    history = last ``history_len`` clicks, right-aligned, left-padded with row 0
    (:func:`privaterec.data.history.history_rows`).

    Parameters
    ----------
    model:
        The recommender; its attached table is not used (``features`` is).
    split:
        The impressions to score; unlabelled impressions are skipped and counted.
    features:
        News table covering every kept history item and candidate of the split.
    history_len:
        H, the number of most recent clicks the user encoder sees.
    batch_size:
        News rows per news-encoder call and impressions per user-encoder call.
    progress:
        Show tqdm progress bars.
    user_transform, history_transform, user_encoder:
        Optional seams (see the module docstring); identity / ``model.encode_user`` when
        ``None``.

    Raises
    ------
    DataFormatError
        If a kept history item or a candidate is not in ``features`` (the message counts and
        names them), or a labelled impression has no candidates or mismatched labels.
    ValueError
        If ``history_len`` or ``batch_size`` is not a positive integer, or a transform returns
        a wrongly shaped tensor.
    """
    check_history_len(history_len)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    labelled = [imp for imp in split.behaviors if imp.labels is not None]
    unlabelled = len(split.behaviors) - len(labelled)
    for imp in labelled:
        _check_labelled(split, imp)
    _check_coverage(split, labelled, features, history_len)
    if not labelled:
        return ScoredImpressions([], [], unlabelled)

    # Table rows of every history (right-aligned) and of every candidate (flattened).
    histories = [history_rows(imp.history, features, history_len) for imp in labelled]
    hist_rows = torch.stack([rows for rows, _ in histories])  # [n, H]
    hist_mask = torch.stack([mask for _, mask in histories])  # [n, H]
    counts = torch.tensor([len(imp.candidates) for imp in labelled])  # [n]
    cand_rows = torch.tensor(features.rows_of([n for imp in labelled for n in imp.candidates]),
                             dtype=torch.long)  # [Σ C_i]
    offsets = np.concatenate([[0], np.cumsum(counts.numpy())])

    used = torch.unique(torch.cat([hist_rows[hist_mask], cand_rows]))
    if not bool(hist_mask.all()):
        used = torch.unique(torch.cat([used, torch.tensor([ANONYMOUS_NEWS])]))
    compact = torch.full((len(features),), -1, dtype=torch.long)
    compact[used] = torch.arange(used.numel())

    # Scores and labels go into two preallocated flat arrays, and each impression's pair is a
    # view of them: one small score buffer per impression, kept alive between the freed
    # per-batch torch temporaries, fragmented the heap (RSS grew ~175 KB per impression on
    # 31k impressions; BENCHMARKS.md "Evaluation memory").
    all_scores = np.empty(int(offsets[-1]), dtype=np.float32)  # [Σ C_i]
    all_labels = np.fromiter((label for imp in labelled for label in imp.labels or ()),
                             dtype=np.int64, count=int(offsets[-1]))  # [Σ C_i]
    with eval_mode(model), torch.no_grad():
        cache = _encode_news(model, features, used, batch_size, progress)  # [U, d]
        scored = cache if candidate_transform is None else candidate_transform(cache)
        device = cache.device  # the model's: the users are scored there too
        hist_idx = compact[hist_rows].to(device)
        cand_idx = compact[cand_rows].to(device)
        hist_mask, counts = hist_mask.to(device), counts.to(device)
        n = len(labelled)
        bar = tqdm(total=n, desc="scoring impressions", unit="imp", disable=not progress)
        for start in range(0, n, batch_size):
            end = min(start + batch_size, n)
            vectors = cache[hist_idx[start:end]]  # [b, H, d]
            mask = hist_mask[start:end]  # [b, H]
            if history_transform is not None:
                vectors, mask = history_transform(vectors, mask)
            encode = model.encode_user if user_encoder is None else user_encoder
            user = encode(vectors, mask)  # [b, d]
            if user_transform is not None:
                transformed = user_transform(user)
                if transformed.shape != user.shape:
                    raise ValueError(f"user_transform must return a tensor of shape "
                                     f"{tuple(user.shape)}, got {tuple(transformed.shape)}")
                user = transformed
            owners = torch.repeat_interleave(torch.arange(end - start, device=device),
                                             counts[start:end])
            cands = scored[cand_idx[offsets[start]:offsets[end]]]  # [Σ C_i, d or D]
            all_scores[offsets[start]:offsets[end]] = (user[owners] * cands).sum(dim=-1).cpu()
            bar.update(end - start)
        bar.close()
    pairs = [(all_labels[offsets[i]:offsets[i + 1]], all_scores[offsets[i]:offsets[i + 1]])
             for i in range(len(labelled))]
    return ScoredImpressions([imp.impression_id for imp in labelled], pairs, unlabelled)


def evaluate_model(model: Recommender, split: MindSplit, features: NewsFeatures, *,
                   history_len: int, batch_size: int = 256, progress: bool = False,
                   user_transform: UserTransform | None = None,
                   history_transform: HistoryTransform | None = None,
                   user_encoder: UserEncoderFn | None = None,
                   candidate_transform: CandidateTransform | None = None
                   ) -> dict[str, float | int]:
    """MIND metrics of ``model`` over all labelled impressions of ``split``.

    Scores with :func:`score_impressions` (same parameters) and averages per impression with
    :func:`~privaterec.eval.metrics.evaluate_impressions`.

    Returns
    -------
    The keys of :func:`~privaterec.eval.metrics.evaluate_impressions` (``auc``, ``mrr``,
    ``ndcg@5``, ``ndcg@10``, ``impressions``, ``auc_impressions``,
    ``single_class_impressions``, ``no_positive_impressions``) plus ``unlabelled_impressions``
    (skipped).

    Raises
    ------
    ValueError
        If the split has no labelled impression, and as :func:`score_impressions`.
    """
    scored = score_impressions(model, split, features, history_len=history_len,
                               batch_size=batch_size, progress=progress,
                               user_transform=user_transform,
                               history_transform=history_transform,
                               user_encoder=user_encoder,
                               candidate_transform=candidate_transform)
    if not scored.pairs:
        raise ValueError(f"{_where(split)}: no labelled impression to evaluate "
                         f"({scored.unlabelled_impressions} unlabelled impressions skipped)")
    result = evaluate_impressions(scored.pairs)
    result["unlabelled_impressions"] = scored.unlabelled_impressions
    return result
