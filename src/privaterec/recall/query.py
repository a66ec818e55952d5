"""A Uni-FedRec query's protected upload (Uni-FedRec §3.4), released around the recall model.

The model (:class:`~privaterec.recall.model.UniFedRecRecall`) computes the clipped
decomposition scores of each interest channel and the quotas
(:meth:`~privaterec.recall.model.UniFedRecRecall.query_scores`); this module adds the Laplace(λ_I)
noise of the scores (Eq. 2) and, optionally, of the quotas, with the callers' generators, and
states the query's privacy events (:func:`~privaterec.recall.interest.query_events`). The model
itself draws no noise.

Shapes: b users, M channel slots, B basic interests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from privaterec.errors import ConfigError
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.mechanisms import add_noise
from privaterec.privacy.samplers import NoiseSource
from privaterec.recall.interest import channel_calibration, perturb_quotas, query_events
from privaterec.recall.model import UniFedRecRecall


@dataclass(frozen=True)
class RecallQuery:
    """What the clients of a batch upload for recall (Uni-FedRec §3.4), one row per user.

    Attributes
    ----------
    alpha:
        ``Tensor[b, M, B]`` protected decomposition weights αᵢ (rows of unreleased slots are
        the softmax of pure noise or uniform and carry quota 0).
    quotas:
        ``Tensor[b, M]`` quotas (noised if requested).
    released:
        ``BoolTensor[b, M]`` which slots are uploaded (the user's C channels; every slot when
        the quotas are noised).
    events:
        Per user, the ``(PrivacyEvent, count)`` pairs of this query (:func:`query_events`).
    """

    alpha: Tensor
    quotas: Tensor
    released: Tensor
    events: list[list[tuple[PrivacyEvent, int]]]


@torch.no_grad()
def release_query(model: UniFedRecRecall, news_vectors: Tensor, mask: Tensor, *,
                  noise: NoiseSource | None, quota_noise_scale: float | None = None,
                  quota_noise: NoiseSource | None = None) -> RecallQuery:
    """The protected upload of each user of a batch (Uni-FedRec §3.4) and its events.

    Paper protocol (default): each user uploads αᵢ of its C channels and the quotas in
    the clear; events = C channel releases + a non-private quota release. With
    ``quota_noise_scale`` every one of the M slots is uploaded (unused slots: clipped
    score 0 + noise) with Laplace-noised quotas, so C is hidden; events = M channel
    releases + one quota release of ε = 2/λ_q.

    Parameters
    ----------
    model:
        The recall model (with basic interest embeddings and a clip δ); λ_I is its
        ``noise_scale``.
    news_vectors, mask:
        ``[b, H, d]``, ``[b, H]``.
    noise:
        Randomness of the decomposition scores' Laplace noise (seeded: one generator, or one
        per user); ``None``: no noise (events then have ε = ∞).
    quota_noise_scale, quota_noise:
        λ_q and its randomness (both or neither).

    Returns
    -------
    :class:`RecallQuery`.
    """
    if (quota_noise_scale is None) != (quota_noise is None):
        raise ConfigError("pass both 'quota_noise_scale' and 'quota_noise' or neither")
    scores, batch = model.query_scores(news_vectors, mask)  # clipped, [b, M, B]
    assert model.clip is not None
    noise_scale = model.noise_scale if noise is not None else 0.0
    channel = channel_calibration(num_basis=model.num_basis, clip=model.clip,
                                  noise_scale=noise_scale)
    noisy = scores if noise is None else add_noise(scores, channel, noise=noise)
    alpha = model.weights(noisy)
    quotas = batch.quotas
    if quota_noise_scale is None:
        released = batch.valid
    else:
        assert quota_noise is not None
        quotas, _ = perturb_quotas(quotas, noise_scale=quota_noise_scale, noise=quota_noise)
        released = torch.ones_like(batch.valid)
    events = [query_events(int(n), num_basis=model.num_basis, clip=model.clip,
                           noise_scale=noise_scale, quota_noise_scale=quota_noise_scale,
                           num_quota_slots=int(n))
              for n in released.sum(dim=-1).tolist()]
    return RecallQuery(alpha=alpha, quotas=quotas, released=released, events=events)


__all__ = ["RecallQuery", "release_query"]
