"""Evaluation of recall models: future/history recall@K and end-to-end AUC (Uni-FedRec §4).

Users and queries. The test users are the users of the split's impressions. A user's query is
built once, from the history of the user's earliest impression in the split (its last
``history_len`` clicks), and serves all its impressions: re-sending the same protected upload
for an unchanged history is post-processing (docs/privacy.md#the-ledger), so each user spends one
query's events. Uni-FedRec queries draw their Laplace noise from a per-user generator seeded by
(``seed``, user index) (:func:`query_generator`).

Methods (one function, :func:`evaluate_recall`):

* ``"unifedrec"`` — the paper's protocol (§3.4): the client uploads protected channel weights
  α̃ᵢ and quotas qᵢ (:func:`~privaterec.recall.query.release_query`); the server
  scores the pool in the B-dim score space (:class:`~privaterec.recall.index.ScoreSpaceIndex`).
* ``"no-bie"`` — ablation without basic interest embeddings: the channel interests rᵢ
  (Eq. 1) are sent as they are and the pool is searched exactly in d dims
  (:class:`~privaterec.recall.index.DenseIndex`), same channels and quotas.
* ``"youtubenet"`` — Covington et al. 2016: one user vector, the mean of the clicked news
  vectors (over all history positions for an empty history), exact d-dim search.
* ``"privaterec"`` and ``"vdp"`` — private single-vector serving of a ranking model used as
  recall (PrivateRec Alg. 1-2, and its VDP baseline): the device's released user vector
  (``user_encoder``, e.g. :func:`privaterec.eval.serving.private_user_encoder`) is searched
  exactly in d dims; each query spends ``user_events``.

Recalled list at K (the definition behind R@K). For each K the server recalls R = K news with
the method's own allocation, exactly as it would serve a request for K candidates: channel i
gets Rᵢ = qᵢ·K by the largest-remainder rule (:func:`~privaterec.recall.index.allocate_quotas`)
and takes its Rᵢ best-scored pool news not taken by a channel served before it (channels in
decreasing Rᵢ; :func:`~privaterec.recall.index.merge_rankings`). For one channel
(YoutubeNet) this is the top-K of its ranking. The sets are not nested in K in general (the
rounding of qᵢ·K changes with K). K larger than the pool recalls the whole pool.

Metrics (averages over users with equal weight):

* ``future_recall@K`` — |recalled_K ∩ F_u| / |F_u|, F_u = the distinct news the user clicked
  in the split's labelled impressions (utility, Table 2);
* ``history_recall@K`` — the same with F_u = the distinct real clicks of the query's history
  (what was encoded in the upload): leakage, lower is better (Table 3).

Relevant news outside the pool can never be recalled: they are dropped from F_u (counted in
``future_outside_pool`` / ``history_outside_pool``) and users left with an empty set are left
out of that average (``future_users`` / ``history_users`` say how many count).

End-to-end AUC (Table 4). The server recalls R = ``auc_recall_size`` (400) news; the client
ranks them with the ranking model (score uᵀd, u = ranker user vector of the same history).
For each labelled impression of the user with both classes, a candidate that was recalled
gets its ranker score and a candidate that was not gets a score below every recalled one
(all non-recalled candidates tie): AUC = P(clicked ranked above non-clicked), ties one half,
averaged over impressions as MIND does. A clicked candidate the recall stage missed can never
be displayed, so it counts as ranked last; if nothing of the impression is recalled its AUC
is 0.5. Without a ranker ``auc`` is ``nan``.

Privacy. ``events`` maps each user to the ``(PrivacyEvent, count)`` pairs of its query:
Uni-FedRec's C channel releases and its quota release
(:func:`~privaterec.recall.interest.query_events`); the baselines send d-dim vectors in the
clear (one non-private event). With ``ledger`` they are also recorded there (phase
``serve``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from privaterec.data.features import NewsFeatures
from privaterec.data.history import check_history_len, history_rows
from privaterec.data.records import MindSplit
from privaterec.errors import ConfigError, DataFormatError
from privaterec.models.layers import eval_mode
from privaterec.eval.metrics import auc as impression_auc
from privaterec.eval.metrics import recall_at_k
from privaterec.models.layers import attend_all_if_empty
from privaterec.ondevice.release import QUERY_MODES
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.ledger import PrivacyLedger
from privaterec.privacy.samplers import SimulationNoise
from privaterec.recall import RECALL_METHODS
from privaterec.recall.index import (DenseIndex, ScoreSpaceIndex, allocate_quotas,
                                     merge_rankings, top_k)
from privaterec.recall.model import UniFedRecRecall
from privaterec.recall.query import release_query
from privaterec.validators import fail

RECALL_KS = (100, 200, 300, 400)
"""The cut-offs of Uni-FedRec Tables 2-3."""

AUC_RECALL_SIZE = 400
"""R of the end-to-end evaluation (Uni-FedRec §4.3)."""

UserEncoder = Callable[[Tensor, Tensor], Tensor]

_QUERY_STREAM = 2  # distinct from fed.rng's server (0) and client (1) streams

EventList = list[tuple[PrivacyEvent, int]]


class Ranker(Protocol):
    """The client's ranking model: a user encoder over clicked-news vectors."""

    def encode_user(self, history_vectors: Tensor, mask: Tensor) -> Tensor: ...


def query_generator(seed: int, user_index: int) -> torch.Generator:
    """The generator of user ``user_index``'s evaluation query (a function of both only)."""
    state = np.random.SeedSequence([int(seed), _QUERY_STREAM, int(user_index)]).generate_state(
        2, dtype=np.uint32)
    return torch.Generator().manual_seed(int((int(state[0]) << 31) ^ int(state[1])))


@dataclass(frozen=True)
class RecallUsers:
    """The test users of a split, as table rows.

    Attributes
    ----------
    user_ids: ``U`` ids, sorted.
    history: ``LongTensor[U, H]`` rows of the query history (earliest impression's history,
        last H clicks, right-aligned, left-padded with row 0); history_mask: ``BoolTensor[U, H]``.
    future: per user, ``int64[n_u]`` distinct rows of the news it clicked in the split.
    impressions: per user, its labelled impressions as ``(candidate rows int64[C],
        labels int64[C])``, in time order.
    """

    user_ids: list[str]
    history: Tensor
    history_mask: Tensor
    future: list[np.ndarray]
    impressions: list[list[tuple[np.ndarray, np.ndarray]]]

    @property
    def num_users(self) -> int:
        return len(self.user_ids)


def recall_users(split: MindSplit, features: NewsFeatures, *, history_len: int) -> RecallUsers:
    """Group a split's impressions by user (see :class:`RecallUsers`).

    Raises
    ------
    DataFormatError
        If a kept history item or a candidate is not in ``features``.
    """
    check_history_len(history_len)
    by_user: dict[str, list] = {}
    for imp in split.behaviors:
        by_user.setdefault(imp.user_id, []).append(imp)
    where = str(split.path) if split.path is not None else "<in-memory split>"
    user_ids = sorted(by_user)
    histories, masks, future, impressions = [], [], [], []
    for user in user_ids:
        imps = sorted(by_user[user], key=lambda imp: imp.time)
        try:
            rows, mask = history_rows(imps[0].history, features, history_len)
            labelled = [(np.asarray(features.rows_of(imp.candidates), dtype=np.int64),
                         np.asarray(imp.labels, dtype=np.int64))
                        for imp in imps if imp.labels is not None]
        except KeyError as exc:
            raise DataFormatError(where, None, f"user {user!r}: {exc.args[0]}; build the news "
                                  f"table from news covering this split or read the data "
                                  f"with --drop-missing") from None
        for cands, labels in labelled:
            if cands.shape != labels.shape:
                raise DataFormatError(where, None, f"user {user!r} has an impression with "
                                      f"{cands.size} candidates and {labels.size} labels")
        histories.append(rows)
        masks.append(mask)
        clicked = [c[y == 1] for c, y in labelled]
        future.append(np.unique(np.concatenate(clicked)) if clicked
                      else np.empty(0, dtype=np.int64))
        impressions.append(labelled)
    empty = torch.zeros(0, history_len, dtype=torch.long)
    return RecallUsers(user_ids,
                       torch.stack(histories) if histories else empty,
                       torch.stack(masks) if masks else empty.bool(), future, impressions)


def recalled_sets(rankings: Sequence[np.ndarray], quotas: np.ndarray,
                  sizes: Sequence[int]) -> list[np.ndarray]:
    """The recalled items for each recall size R (module docstring, "Recalled list at K").

    Parameters
    ----------
    rankings:
        Per channel, its items best first (at least ``max(sizes)`` of them).
    quotas:
        ``[C]`` channel quotas (positive sum).
    sizes:
        Recall sizes R.

    Returns
    -------
    Per size, ``[R]`` distinct items (grouped by channel in service order).
    """
    q = np.asarray(quotas, dtype=np.float64)
    return [merge_rankings(list(rankings), allocate_quotas(q, int(r))) for r in sizes]


def _fraction(relevant: np.ndarray, recalled: np.ndarray) -> float:
    return recall_at_k(relevant.tolist(), recalled.tolist(), max(1, recalled.size))


@dataclass
class _RecallTally:
    """Recall@K of one kind of relevant news (future clicks, or the history) over the users:
    the sum of each user's fraction recalled, the users counted, the news outside the pool."""

    sums: dict[int, float]
    users: int = 0
    outside: int = 0

    def add(self, relevant: np.ndarray, in_pool: np.ndarray,
            recalled: dict[int, np.ndarray]) -> None:
        """One user's ``relevant`` news ids; ``recalled[k]``: its recalled set for cut-off k
        (a user with no relevant news in the pool does not count)."""
        kept = relevant[in_pool[relevant]]
        self.outside += relevant.size - kept.size
        if kept.size:
            self.users += 1
            for k in self.sums:
                self.sums[k] += _fraction(kept, recalled[k])

    def means(self, name: str) -> dict[str, float]:
        """``{f"{name}_recall@{k}": mean}`` (NaN when no user counted)."""
        return {f"{name}_recall@{k}": total / self.users if self.users else math.nan
                for k, total in self.sums.items()}


def _clear_event(dimension: int, what: str) -> EventList:
    return [(PrivacyEvent(mechanism="none", epsilon=math.inf, dimension=max(1, dimension),
                          phase="serve", note=f"{what} sent in the clear (no guarantee)"), 1)]


def _check_ks(ks: Sequence[int], auc_recall_size: int) -> tuple[int, ...]:
    ks = tuple(ks)
    if not ks or any(isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1
                     for k in ks):
        fail("ks", ks, "positive integers", kind="recall cut-offs")
    if isinstance(auc_recall_size, bool) or not isinstance(auc_recall_size, int) \
            or auc_recall_size < 1:
        fail("auc_recall_size", auc_recall_size, "an int >= 1", kind="")
    return tuple(int(k) for k in ks)


@torch.no_grad()
def evaluate_recall(split: MindSplit, features: NewsFeatures, news_vectors: Tensor, *,
                    method: str, history_len: int,
                    model: UniFedRecRecall | None = None, ks: Sequence[int] = RECALL_KS,
                    pool_rows: Tensor | np.ndarray | None = None,
                    ranker: Ranker | None = None, auc_recall_size: int = AUC_RECALL_SIZE,
                    seed: int = 0, serve_noise: bool = True,
                    quota_noise_scale: float | None = None,
                    ledger: PrivacyLedger | None = None, batch_size: int = 256,
                    progress: bool = False, user_encoder: UserEncoder | None = None,
                    user_events: EventList | None = None) -> dict[str, object]:
    """Recall@K of future and history clicks, end-to-end AUC and query events of a method.

    Parameters
    ----------
    split:
        Test impressions (users, their histories, labelled candidates).
    features:
        The news table: maps news ids to the rows of ``news_vectors``.
    news_vectors:
        ``Tensor[N, d]`` fixed news vectors (the ranking model's news encoder).
    method:
        ``"unifedrec"``, ``"no-bie"`` (both need ``model``) or ``"youtubenet"``.
    history_len:
        H, the query history length.
    model:
        The trained :class:`~privaterec.recall.model.UniFedRecRecall`.
    ks:
        Cut-offs K (default 100, 200, 300, 400).
    pool_rows:
        Table rows of the news pool (default: every row but row 0).
    ranker:
        The client's ranking model for ``auc`` (``encode_user``); ``None``: ``auc`` is nan.
    auc_recall_size:
        R recalled for the AUC (default 400).
    seed:
        Seeds the per-user query generators (:func:`query_generator`).
    serve_noise:
        Uni-FedRec: add the Laplace(λ_I) noise of Eq. 2 (``False``: noise-free ablation, the
        events then say ε = ∞).
    quota_noise_scale:
        Uni-FedRec: λ_q of Laplace noise on the quotas (``None``: quotas in the clear, the
        paper).
    ledger:
        If given, each user's query events are recorded in it.
    batch_size:
        Users per query batch.
    progress:
        tqdm bar over users.
    user_encoder, user_events:
        ``"privaterec"`` / ``"vdp"``: the device's release ``(vectors [b, H, d], mask [b, H])
        -> [b, d]`` and the events of one query.

    Returns
    -------
    dict with ``future_recall@K`` and ``history_recall@K`` for each K, ``auc``,
    ``users``, ``future_users``, ``history_users``, ``future_outside_pool``,
    ``history_outside_pool``, ``auc_impressions``, ``single_class_impressions``,
    ``pool_size``, ``method`` and ``events`` (user id → list of (PrivacyEvent, count)).
    """
    if method not in RECALL_METHODS:
        raise ConfigError(f"invalid recall 'method': got {method!r}, expected one of "
                          f"{RECALL_METHODS}")
    if method in ("unifedrec", "no-bie") and model is None:
        raise ConfigError(f"method {method!r} needs the trained recall model (model=...)")
    if method in QUERY_MODES and (user_encoder is None or user_events is None):
        raise ConfigError(f"method {method!r} needs the device's release (user_encoder=...) "
                          f"and its events (user_events=...)")
    ks = _check_ks(ks, auc_recall_size)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"invalid 'batch_size': got {batch_size!r}, expected an int >= 1")
    vectors_table = news_vectors.detach().float()
    n = vectors_table.shape[0]
    if vectors_table.ndim != 2 or n != len(features):
        raise ConfigError(f"news_vectors must be [N, d] with N = {len(features)} rows of the "
                          f"news table, got {tuple(news_vectors.shape)}")
    pool = (np.arange(1, n) if pool_rows is None
            else np.asarray(torch.as_tensor(pool_rows).cpu(), dtype=np.int64))
    if pool.ndim != 1 or pool.size == 0 or np.unique(pool).size != pool.size \
            or (pool < 0).any() or (pool >= n).any():
        raise ConfigError(f"pool_rows must be distinct rows in [0, {n}) of the news table")
    in_pool = np.zeros(n, dtype=bool)
    in_pool[pool] = True
    size_of = {k: min(k, pool.size) for k in ks}
    auc_size = min(auc_recall_size, pool.size)
    sizes = sorted(set(size_of.values()) | ({auc_size} if ranker is not None else set()))
    pool_vectors = vectors_table[torch.from_numpy(pool)]
    index: ScoreSpaceIndex | DenseIndex
    if method == "unifedrec":
        assert model is not None
        model.eval()
        index = ScoreSpaceIndex(model.interest.values.detach(), pool_vectors)
    else:
        index = DenseIndex(pool_vectors)
    users = recall_users(split, features, history_len=history_len)
    longest = max(sizes)
    future_tally = _RecallTally({k: 0.0 for k in ks})
    history_tally = _RecallTally({k: 0.0 for k in ks})
    aucs: list[float] = []
    single_class = 0
    events: dict[str, EventList] = {}
    bar = tqdm(total=users.num_users, desc=f"recall ({method})", unit="user",
               disable=not progress)
    with eval_mode(ranker):  # no dropout in the ranker (nor in a user encoder of its model)
        for start in range(0, users.num_users, batch_size):
            stop = min(start + batch_size, users.num_users)
            rows = users.history[start:stop]
            mask = users.history_mask[start:stop]
            vectors = vectors_table[rows]  # [b, H, d]
            per_user: list[tuple[list[np.ndarray], np.ndarray]] = []
            batch_events: list[EventList] = []
            if method == "unifedrec":
                assert model is not None
                noise = SimulationNoise([query_generator(seed, u) for u in range(start, stop)])
                query = release_query(model, vectors, mask, noise=noise if serve_noise else None,
                                      quota_noise_scale=quota_noise_scale,
                                      quota_noise=None if quota_noise_scale is None else noise)
                for i in range(stop - start):
                    released = query.released[i]
                    assert isinstance(index, ScoreSpaceIndex)
                    scores = index.channel_scores(query.alpha[i][released])  # [C, P]
                    per_user.append((list(top_k(scores, longest)),
                                     query.quotas[i][released].double().numpy()))
                batch_events = query.events
            elif method == "no-bie":
                assert model is not None
                channels = model.channels(vectors, mask)
                interests = model.interests(model.context(vectors, mask), channels.channel_ids)
                for i in range(stop - start):
                    valid = channels.valid[i]
                    assert isinstance(index, DenseIndex)
                    _, positions = index.search(interests[i][valid], longest)
                    per_user.append((list(positions), channels.quotas[i][valid].double().numpy()))
                    batch_events.append(_clear_event(int(valid.sum()) * vectors.shape[-1],
                                                     "no-bie: channel interests r_i and quotas"))
            else:
                if method == "youtubenet":
                    attend = attend_all_if_empty(mask).unsqueeze(-1).to(vectors.dtype)
                    user_vectors = (vectors * attend).sum(1) / attend.sum(1)
                    query_events = _clear_event(vectors.shape[-1],
                                                "youtubenet: mean clicked-news vector")
                else:
                    assert user_encoder is not None and user_events is not None
                    user_vectors = user_encoder(vectors, mask)
                    query_events = list(user_events)
                assert isinstance(index, DenseIndex)
                _, positions = index.search(user_vectors, longest)
                positions = np.atleast_2d(positions)
                for i in range(stop - start):
                    per_user.append(([positions[i]], np.ones(1)))
                    batch_events.append(query_events)
            ranker_users = None
            if ranker is not None:
                ranker_users = ranker.encode_user(vectors, mask)  # [b, d]
            for i, (rankings, quotas) in enumerate(per_user):
                u = start + i
                recalled = dict(zip(sizes, (pool[s] for s in recalled_sets(rankings, quotas,
                                                                              sizes))))
                events[users.user_ids[u]] = batch_events[i]
                at_k = {k: recalled[size_of[k]] for k in ks}
                clicks = np.unique(users.history[u][users.history_mask[u]].numpy())
                future_tally.add(users.future[u], in_pool, at_k)
                history_tally.add(clicks, in_pool, at_k)
                if ranker_users is not None:
                    shown = recalled[auc_size]
                    for cands, labels in users.impressions[u]:
                        if labels.sum() in (0, labels.size):
                            single_class += 1
                            continue
                        scores = (vectors_table[torch.from_numpy(cands)]
                                  @ ranker_users[i]).double().numpy()
                        hit = np.isin(cands, shown)
                        floor = scores[hit].min() - 1.0 if hit.any() else 0.0
                        aucs.append(impression_auc(labels, np.where(hit, scores, floor)))
            bar.update(stop - start)
    bar.close()
    result: dict[str, object] = {**future_tally.means("future"),
                                  **history_tally.means("history")}
    result.update(auc=float(np.mean(aucs)) if aucs else math.nan, users=users.num_users,
                  future_users=future_tally.users, history_users=history_tally.users,
                  future_outside_pool=future_tally.outside,
                  history_outside_pool=history_tally.outside,
                  auc_impressions=len(aucs), single_class_impressions=single_class,
                  pool_size=int(pool.size), method=method)
    if ledger is not None:
        for user, pairs in events.items():
            for event, count in pairs:
                ledger.record(user, event, count)
    result["events"] = events
    return result


__all__ = ["AUC_RECALL_SIZE", "RECALL_KS", "RECALL_METHODS", "Ranker", "RecallUsers",
           "UserEncoder",
           "evaluate_recall", "query_generator", "recall_users", "recalled_sets"]
