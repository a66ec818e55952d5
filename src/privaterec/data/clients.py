"""Per-user client datasets: each user's history and training samples, packed as tensors.

A *client* is one user (FedNewsRec §3.2). Its data are the last H clicks of its history and
its training samples: each clicked candidate of each impression, paired with k non-clicked
candidates of the same impression (k = 4; drawn with replacement when the impression has
fewer than k; FedNewsRec §3.1). Samples are stored sorted by user so a client's samples are one
contiguous slice, which the federated simulator relies on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from privaterec.data.features import NewsFeatures
from privaterec.data.history import history_rows
from privaterec.data.records import MindSplit
from privaterec.privacy.samplers import NoiseSource


@dataclass
class ClientDataset:
    """All clients of a split.

    Attributes
    ----------
    user_ids: ``U`` user ids; user ``u`` is row ``u`` of the tensors below.
    history: ``LongTensor[U, H]`` feature rows of the last H clicks, right-aligned, left-padded
        with row 0 (the anonymous news). history_mask: ``BoolTensor[U, H]``.
    sample_user: ``LongTensor[S]`` owner of each sample, non-decreasing.
    positives: ``LongTensor[S]`` feature row of the clicked candidate.
    negatives: ``LongTensor[S, M]`` feature rows of the impression's non-clicked candidates
        (M = largest count; padded with 0). negative_counts: ``LongTensor[S]`` (≥ 1).
    impression_size: ``LongTensor[S]`` number of candidates C of the sample's impression.
    offsets: ``LongTensor[U + 1]``: samples of user ``u`` are ``offsets[u]:offsets[u+1]``.
    skipped: counts of what could not become a sample (e.g. impressions without a
        non-clicked candidate), reported, never silent.
    impression_rows: ``LongTensor[I, C]`` feature rows of every displayed news of each
        impression that produced samples (padded with 0); impression_clicks: ``BoolTensor[I,
        C]`` which of them were clicked; impression_counts: ``LongTensor[I]``;
        impression_offsets: ``LongTensor[U + 1]``: impressions of user ``u`` are
        ``impression_offsets[u]:impression_offsets[u+1]``. Every labelled impression, whatever
        its clicks (none or all included). PrivateRec's label release draws its candidates
        from whole impressions (:mod:`privaterec.privacy.labels`); ``None`` when the dataset
        was built by hand (each sample then counts as a one-click impression, and the label
        guarantee does not hold: the number of releases follows the number of clicks).
    """

    user_ids: list[str]
    history: torch.Tensor
    history_mask: torch.Tensor
    sample_user: torch.Tensor
    positives: torch.Tensor
    negatives: torch.Tensor
    negative_counts: torch.Tensor
    impression_size: torch.Tensor
    offsets: torch.Tensor
    skipped: dict[str, int]
    impression_rows: torch.Tensor | None = None
    impression_clicks: torch.Tensor | None = None
    impression_counts: torch.Tensor | None = None
    impression_offsets: torch.Tensor | None = None
    roster_only: bool = False

    @property
    def num_users(self) -> int:
        return len(self.user_ids)

    @property
    def num_samples(self) -> int:
        return int(self.positives.shape[0])

    def samples_per_user(self) -> torch.Tensor:
        """``LongTensor[U]``: number of training samples |B_u| of each client."""
        return self.offsets[1:] - self.offsets[:-1]

    def impressions_per_user(self) -> torch.Tensor:
        """``LongTensor[U]``: labelled impressions of each client (its samples when the
        dataset was built without impressions)."""
        if self.impression_offsets is None:
            return self.samples_per_user()
        return self.impression_offsets[1:] - self.impression_offsets[:-1]

    def draw_candidates(self, *, negatives: int, noise: NoiseSource,
                        samples: torch.Tensor | None = None) -> torch.Tensor:
        """Candidates ``LongTensor[s, 1 + k]`` with the clicked news in column 0.

        The k non-clicked news are drawn from the sample's impression without replacement
        when it has at least k, with replacement otherwise (see :func:`draw_candidates`).

        Parameters
        ----------
        negatives: k. generator: the only source of randomness.
        samples: ``LongTensor[s]`` sample indices (default: all samples).
        """
        idx = torch.arange(self.num_samples) if samples is None else samples
        return draw_candidates(self.positives[idx], self.negatives[idx],
                               self.negative_counts[idx], negatives=negatives,
                               noise=noise)

    def client(self, user: int) -> "ClientData":
        """The data that client (user index) ``user`` holds on its device."""
        lo, hi = int(self.offsets[user]), int(self.offsets[user + 1])
        impressions: dict[str, torch.Tensor] = {}
        if (self.impression_rows is not None and self.impression_clicks is not None
                and self.impression_counts is not None and self.impression_offsets is not None):
            a, b = int(self.impression_offsets[user]), int(self.impression_offsets[user + 1])
            impressions = {"impression_rows": self.impression_rows[a:b],
                           "impression_clicks": self.impression_clicks[a:b],
                           "impression_counts": self.impression_counts[a:b]}
        return ClientData(index=user, user_id=self.user_ids[user],
                          history=self.history[user], history_mask=self.history_mask[user],
                          positives=self.positives[lo:hi], negatives=self.negatives[lo:hi],
                          negative_counts=self.negative_counts[lo:hi],
                          impression_size=self.impression_size[lo:hi], **impressions)


@dataclass(frozen=True)
class ClientData:
    """What one client (user) holds: its history and its training samples.

    Attributes
    ----------
    index: the user's row in its :class:`ClientDataset`. user_id: the user id.
    history: ``LongTensor[H]``; history_mask: ``BoolTensor[H]``.
    positives: ``LongTensor[n]``; negatives: ``LongTensor[n, M]``; negative_counts:
        ``LongTensor[n]``; impression_size: ``LongTensor[n]`` (as in :class:`ClientDataset`).
    """

    index: int
    user_id: str
    history: torch.Tensor
    history_mask: torch.Tensor
    positives: torch.Tensor
    negatives: torch.Tensor
    negative_counts: torch.Tensor
    impression_size: torch.Tensor
    impression_rows: torch.Tensor | None = None
    impression_clicks: torch.Tensor | None = None
    impression_counts: torch.Tensor | None = None

    @property
    def num_samples(self) -> int:
        return int(self.positives.shape[0])

    def impressions(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(rows [I, C], clicks [I, C], counts [I])`` of this client's impressions.

        Built by hand without impressions, each sample counts as one impression holding its
        clicked news and its non-clicked pool (exact for one-click impressions).
        """
        if (self.impression_rows is not None and self.impression_clicks is not None
                and self.impression_counts is not None):
            return self.impression_rows, self.impression_clicks, self.impression_counts
        rows = torch.cat([self.positives[:, None], self.negatives], dim=1)
        counts = 1 + self.negative_counts
        clicks = torch.zeros_like(rows, dtype=torch.bool)
        clicks[:, 0] = True
        clicks &= torch.arange(rows.shape[1]) < counts[:, None]
        return rows, clicks, counts


def draw_candidates(positives: torch.Tensor, pool: torch.Tensor, counts: torch.Tensor, *,
                    negatives: int, noise: NoiseSource) -> torch.Tensor:
    """Candidates ``LongTensor[s, 1 + k]``: each clicked news followed by k non-clicked ones.

    Parameters
    ----------
    positives: ``LongTensor[s]`` clicked rows. pool: ``LongTensor[s, M]`` the impressions'
        non-clicked rows (padded). counts: ``LongTensor[s]`` valid entries of ``pool`` (≥ 1).
    negatives: k, drawn without replacement when an impression has at least k, with
        replacement otherwise (FedNewsRec §3.1).
    noise: the only source of randomness (a seeded generator, or a device's secure
        source: :class:`~privaterec.privacy.samplers.NoiseSource`).
    """
    s, m = pool.shape
    keys = noise.uniform((s, m), dtype=torch.float32)
    keys = keys.masked_fill(torch.arange(m) >= counts[:, None], 2.0)
    without = keys.argsort(dim=1)[:, :negatives] if negatives <= m else None
    with_repl = (noise.uniform((s, negatives), dtype=torch.float32)
                 * counts[:, None]).long().clamp(max=m - 1)
    if without is None:
        choice = with_repl
    else:
        choice = torch.where((counts >= negatives)[:, None], without, with_repl)
    return torch.cat([positives[:, None], pool.gather(1, choice)], dim=1)


def roster_clients(user_ids: Sequence[str], *, history_len: int) -> ClientDataset:
    """The clients a deployed server knows: the roster of enrolled user ids, ``U`` rows with
    no sample, an empty history ``[U, H]`` and no impression (``roster_only``), so that
    whom a round samples cannot depend on anyone's data (docs/privacy.md#threat-model)."""
    users = len(user_ids)
    empty = torch.zeros(0, dtype=torch.long)
    return ClientDataset(
        user_ids=list(user_ids),
        history=torch.zeros(users, history_len, dtype=torch.long),
        history_mask=torch.zeros(users, history_len, dtype=torch.bool),
        sample_user=empty, positives=empty, negatives=torch.zeros(0, 1, dtype=torch.long),
        negative_counts=empty, impression_size=empty,
        offsets=torch.zeros(users + 1, dtype=torch.long), skipped={},
        impression_rows=torch.zeros(0, 1, dtype=torch.long),
        impression_clicks=torch.zeros(0, 1, dtype=torch.bool), impression_counts=empty,
        impression_offsets=torch.zeros(users + 1, dtype=torch.long), roster_only=True)


def build_client_dataset(split: MindSplit, features: NewsFeatures, *,
                         history_len: int) -> ClientDataset:
    """Pack a labelled split into per-user client data.

    A user's history is the history field of the user's latest impression in the split
    (MIND histories are the clicks before the logged period), truncated to its last
    ``history_len`` clicks.

    Raises
    ------
    KeyError
        If a referenced news id is not in ``features`` (load data with ``drop_missing`` to
        remove dangling references first).
    """
    by_user: dict[str, list] = {}
    for imp in split.behaviors:
        by_user.setdefault(imp.user_id, []).append(imp)
    user_ids = sorted(by_user)
    histories, masks = [], []
    sample_user, positives, negs, sizes = [], [], [], []
    imp_user: list[int] = []
    imp_rows: list[list[int]] = []
    imp_clicks: list[list[bool]] = []
    skipped = {"unlabelled_impressions": 0, "impressions_without_click": 0,
               "impressions_without_non_click": 0}
    for u, user in enumerate(user_ids):
        impressions = sorted(by_user[user], key=lambda imp: imp.time)
        rows, mask = history_rows(impressions[-1].history, features, history_len)
        histories.append(rows)
        masks.append(mask)
        for imp in impressions:
            if imp.labels is None:
                skipped["unlabelled_impressions"] += 1
                continue
            # Every labelled impression is kept for PrivateRec's label release, whatever its
            # clicks (its "no click drawn" class covers none or all clicked): dropping one by
            # its clicks would make what a device releases depend on them.
            imp_user.append(u)
            imp_rows.append(features.rows_of(list(imp.candidates)))
            imp_clicks.append([y == 1 for y in imp.labels])
            clicked = [c for c, y in zip(imp.candidates, imp.labels) if y == 1]
            others = [c for c, y in zip(imp.candidates, imp.labels) if y == 0]
            if not clicked:
                skipped["impressions_without_click"] += 1
                continue
            if not others:
                skipped["impressions_without_non_click"] += 1
                continue
            other_rows = features.rows_of(others)
            for row in features.rows_of(clicked):
                sample_user.append(u)
                positives.append(row)
                negs.append(other_rows)
                sizes.append(len(imp.candidates))
    width = max((len(n) for n in negs), default=1)
    negatives = torch.zeros(len(negs), width, dtype=torch.long)
    for i, n in enumerate(negs):
        negatives[i, : len(n)] = torch.tensor(n, dtype=torch.long)
    sample_user_t = torch.tensor(sample_user, dtype=torch.long)
    counts = torch.bincount(sample_user_t, minlength=len(user_ids))
    offsets = torch.zeros(len(user_ids) + 1, dtype=torch.long)
    offsets[1:] = counts.cumsum(0)
    imp_width = max((len(r) for r in imp_rows), default=1)
    impression_rows = torch.zeros(len(imp_rows), imp_width, dtype=torch.long)
    impression_clicks = torch.zeros(len(imp_rows), imp_width, dtype=torch.bool)
    for i, (r, c) in enumerate(zip(imp_rows, imp_clicks)):
        impression_rows[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        impression_clicks[i, : len(c)] = torch.tensor(c, dtype=torch.bool)
    imp_counts_per_user = torch.bincount(torch.tensor(imp_user, dtype=torch.long),
                                         minlength=len(user_ids))
    impression_offsets = torch.zeros(len(user_ids) + 1, dtype=torch.long)
    impression_offsets[1:] = imp_counts_per_user.cumsum(0)
    return ClientDataset(
        user_ids=user_ids,
        history=torch.stack(histories) if histories else torch.zeros(0, history_len,
                                                                     dtype=torch.long),
        history_mask=torch.stack(masks) if masks else torch.zeros(0, history_len,
                                                                  dtype=torch.bool),
        sample_user=sample_user_t,
        positives=torch.tensor(positives, dtype=torch.long),
        negatives=negatives,
        negative_counts=torch.tensor([len(n) for n in negs], dtype=torch.long),
        impression_size=torch.tensor(sizes, dtype=torch.long),
        offsets=offsets,
        skipped=skipped,
        impression_rows=impression_rows,
        impression_clicks=impression_clicks,
        impression_counts=torch.tensor([len(r) for r in imp_rows], dtype=torch.long),
        impression_offsets=impression_offsets,
    )
