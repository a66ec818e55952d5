"""Private serving evaluated offline (PrivateRec Alg. 1-2, §3.2.1).

Each labelled test impression is one recommendation query: the device computes its user
representation from its history and releases it under ε_s, the server scores the impression's
candidates with it. :func:`private_user_encoder` returns the device side as the
``user_encoder`` seam of :func:`privaterec.eval.evaluate.score_impressions`, for any mode of
:data:`privaterec.ondevice.release.SERVING_MODES`: its release, then what the server scores,
the device SDK's own computation (:meth:`~privaterec.ondevice.release.ServingMode.release`).
Local ranking (``local``) sends nothing: the device holds the pool's score matrix P = b·Rᵀ
(or, without basic vectors, the news vectors R) and ranks with its exact α (or u);
:func:`local_ranking_seams` scores candidates as the device does. Every query is one
release; :func:`privaterec.ondevice.release.serving_event` is its privacy event.
"""

from __future__ import annotations

import numpy as np
import torch

from privaterec.data.features import ANONYMOUS_NEWS, NewsFeatures
from privaterec.errors import ConfigError
from privaterec.eval.evaluate import CandidateTransform, UserEncoderFn
from privaterec.models.recommender import Recommender
from privaterec.ondevice.release import ServingConfig
from privaterec.privacy.samplers import NoiseSource


def private_user_encoder(model: Recommender, features: NewsFeatures, config: ServingConfig, *,
                         noise: NoiseSource) -> UserEncoderFn:
    """The device side of one query batch: ``(vectors [b, H, d], mask [b, H]) -> ũ [b, d]``.

    Parameters
    ----------
    model:
        The trained recommender (``privaterec`` serving needs its basic vectors).
    features:
        The news table; row 0 (all-padding title) gives the anonymous news r₀ = Θ_N(e₀…e₀).
    config:
        The serving mechanism.
    noise:
        Randomness of the simulated devices (padding and noise), used batch after batch.

    Raises
    ------
    ConfigError
        ``privaterec`` serving of a model without basic vectors.
    """
    mode = config.mode
    if mode.on_device:
        raise ConfigError(f"{mode.name} serving scores candidates on the device: use "
                          f"local_ranking_seams(model)")
    if mode.needs_basis and model.basis is None:
        raise ConfigError(f"serving {mode.name!r} needs a model with basic vectors: train it "
                          f"with --method privaterec (or --basis B); use --serving vdp or "
                          f"none for this run")
    with torch.no_grad():  # r₀ = Θ_N(all-padding news), for a mode that pads
        r0 = (model.encode_features(features.select(torch.tensor([ANONYMOUS_NEWS])))[0]
              if mode.padded else torch.zeros(0))

    def release(vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return mode.server_user(model, mode.release(model, r0, vectors, mask, config, noise))
    return release


def _store_scores(vectors: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """Rows of Pᵀ = R·bᵀ ``[n, B]``, in float64 then float32, as the server's store computes
    them (:func:`privaterec.serving.store._space_scores`)."""
    return (vectors.double() @ basis.double().T).float()


def local_ranking_seams(model: Recommender) -> tuple[UserEncoderFn, CandidateTransform]:
    """The ``user_encoder`` and ``candidate_transform`` seams of
    :func:`privaterec.eval.evaluate.score_impressions` for local ranking.

    With basic vectors: the device's exact α = attention(u) ``[b, B]`` (no padding, no
    noise) against the candidates' columns of P = b·Rᵀ ``[C, B]`` (float64 → float32, like the
    downloaded matrix), so a score is α·P_c. Without: u ``[b, d]`` against the float32 news
    vectors. Nothing is sent: each query's event is
    :func:`~privaterec.ondevice.release.serving_event` of ``local``.
    """
    basis = model.basis
    if basis is None:
        return model.encode_user, lambda vectors: vectors
    weight = basis.weight.detach()

    def alpha(vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return model.attention(vectors, mask)

    return alpha, lambda vectors: _store_scores(vectors, weight)


def local_download_bytes(news_ids: list[str], rows: int, dtype: str = "float32") -> int:
    """Bytes of the full pool download (:mod:`privaterec.ondevice.pool_format`) of a pool
    of ``news_ids`` with ``rows`` floats per news (B, or d without a basis): the records are
    raw, so only the ids' compression and a few header bytes vary."""
    from privaterec.ondevice.pool_format import PoolState, encode_full, quantize

    data, scales = quantize(np.zeros((len(news_ids), rows), np.float32), dtype)
    state = PoolState(space="scores", dtype=dtype, rows=rows, model_version="0" * 12,
                      pool_id="0" * 16, version=1, ids=tuple(news_ids), data=data,
                      scales=scales)
    return len(encode_full(state, "0" * 64))


__all__ = ["local_download_bytes", "local_ranking_seams", "private_user_encoder"]
