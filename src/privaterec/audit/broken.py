"""Known-broken variants of the real client code, to check that the audit can fail.

Each is a context manager that patches the library for its duration (simulation only):

* :func:`published_dpl` — PrivateRec's label release replaced by the published DP label
  permutation's candidate set (Alg. 3 line 16): a clicked news always in the set (slot 0),
  the other slots drawn from the non-clicked news, randomized response on the label. The set
  itself then names the click (docs/privacy.md#label-privacy).
* :func:`scaled_noise` — every Laplace draw ``factor`` times its calibrated scale while the
  events still claim the calibrated ε (e.g. 0.1: noise 10x too small).
* :func:`reply_with_loss` — the client's reply also carries its raw training loss.
* :func:`private_reply_with_metadata` — a private method's Flower ClientApp reply also
  carries each user's loss and sample count (``ClientMethod.sends_metadata`` true).
* :func:`scaled_gaussian_noise` — every Gaussian draw (central DP's noise on the sum and on
  the clip count included) ``factor`` times its calibrated scale.
* :func:`scaled_secure_noise` — every float-safe Gaussian (or, with ``mechanism``, Laplace)
  release of :class:`~privaterec.privacy.samplers.SecureNoise` (a deployed server's central
  noise, a device's local noise) at ``factor`` × its scale.
* :func:`scaled_noise_shares` — distributed noise: every client's SecAgg+ noise share at
  ``factor`` × its σ.
* :func:`unnoised_clip_count` — central DP's aggregator releases the count of unclipped
  clients (adaptive clipping) without its noise.
* :func:`noise_on_touched_news_only` — central DP clipped in news-vector space noises only
  the rows of the news the round's clients touched (the others released as exact zeros).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager
from typing import Any, Iterator

import torch
from torch import Tensor

from privaterec.privacy.samplers import NoiseSource, SecureNoise, SimulationNoise


def published_dpl_labels(clicks: Tensor, counts: Tensor, *, size: int, epsilon: float,
                         noise: NoiseSource) -> tuple[Tensor, Tensor]:
    """Drop-in for :func:`privaterec.privacy.labels.release_labels` with the published
    candidate set: positions ``[n, size]`` with a clicked position in slot 0 and ``size − 1``
    non-clicked ones, and the label kept in slot 0 with probability e^ε/(e^ε + size − 1)."""
    from privaterec.privacy.labels import keep_probability

    n, width = clicks.shape
    clicked = clicks.float().argmax(dim=1)
    keys = noise.uniform((n, width))
    keys = keys.masked_fill(clicks | (torch.arange(width) >= counts[:, None]), 2.0)
    positions = torch.cat([clicked[:, None], keys.argsort(dim=1)[:, : size - 1]], dim=1)
    keep = keep_probability(epsilon=epsilon, size=size - 1)
    u = noise.uniform((n,))
    other = 1 + noise.randint(size - 1, (n,))
    return positions, torch.where(u < keep, torch.zeros(n, dtype=torch.long), other)


@contextmanager
def _patched(module: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


@contextmanager
def published_dpl() -> Iterator[None]:
    """PrivateRec clients use :func:`published_dpl_labels` (module docstring)."""
    import privaterec.fed.methods.privaterec as privaterec_client

    with _patched(privaterec_client, "release_labels", published_dpl_labels):
        yield


@contextmanager
def _scaled(cls: Any, method: str, factor: float, scaled: str) -> Iterator[None]:
    """``cls.method`` (a draw or release taking ``mechanism=`` and ``scale=``) at ``factor`` ×
    the scale for the mechanism ``scaled``, unchanged for the others."""
    original = getattr(cls, method)

    def draw(self: Any, x: Any, *, mechanism: str, scale: Any, **kwargs: Any) -> Tensor:
        factor_here = factor if mechanism == scaled else 1.0
        return original(self, x, mechanism=mechanism, scale=scale * factor_here, **kwargs)

    with _patched(cls, method, draw):
        yield


def scaled_noise(factor: float) -> AbstractContextManager[None]:
    """Every seeded Laplace draw (:meth:`~privaterec.privacy.samplers.SimulationNoise.draw`:
    the mechanisms and Uni-FedRec's recall upload) at ``factor`` × scale."""
    return _scaled(SimulationNoise, "draw", factor, "laplace")


@contextmanager
def reply_with_loss() -> Iterator[None]:
    """:meth:`~privaterec.fed.update.ClientUpdate.sent` also returns ``metrics["loss"]``."""
    from privaterec.fed.update import ClientUpdate

    sent = ClientUpdate.sent

    def with_loss(self: ClientUpdate) -> dict[str, Any]:
        return {**sent(self), "loss": float(self.metrics["loss"])}

    with _patched(ClientUpdate, "sent", with_loss):
        yield


def scaled_gaussian_noise(factor: float) -> AbstractContextManager[None]:
    """Every seeded Gaussian draw (the mechanisms and central DP's aggregator) at ``factor``
    × σ."""
    return _scaled(SimulationNoise, "draw", factor, "gaussian")


def scaled_secure_noise(factor: float, mechanism: str = "gaussian") -> AbstractContextManager[None]:
    """:meth:`~privaterec.privacy.samplers.SecureNoise.release` of ``mechanism`` noise at
    ``factor`` × its scale (the deployed noise)."""
    return _scaled(SecureNoise, "release", factor, mechanism)


@contextmanager
def private_reply_with_metadata() -> Iterator[None]:
    """Every client method's ``sends_metadata`` is true: the Flower ClientApp's reply of a
    private method also carries each user's loss and number of samples."""
    from privaterec.fed.methods.base import ClientMethod

    with _patched(ClientMethod, "sends_metadata", property(lambda self: True)):
        yield


@contextmanager
def scaled_noise_shares(factor: float) -> Iterator[None]:
    """:attr:`~privaterec.fed.secagg.SecAggRound.share_sigma` at ``factor`` × its value (distributed noise)."""
    from privaterec.fed.secagg import SecAggRound

    original = SecAggRound.share_sigma

    def share_sigma(self: SecAggRound) -> float:
        return float(original.fget(self)) * factor  # type: ignore[attr-defined]  # a property read on the class is the property

    with _patched(SecAggRound, "share_sigma", property(share_sigma)):
        yield


@contextmanager
def unnoised_clip_count() -> Iterator[None]:
    """:meth:`~privaterec.fed.methods.dp_fedavg.CentralDP.noised_sums` returns the exact sum of
    the clip indicators."""
    from privaterec.fed.methods.dp_fedavg import CentralDP

    original = CentralDP.noised_sums

    def exact_count(self: CentralDP, total: Tensor, indicator_sum: float,
                    **kwargs: Any) -> tuple[Tensor, float | None]:
        noisy_total, noisy_count = original(self, total, indicator_sum, **kwargs)
        return noisy_total, None if noisy_count is None else float(indicator_sum)

    with _patched(CentralDP, "noised_sums", exact_count):
        yield


@contextmanager
def noise_on_touched_news_only() -> Iterator[None]:
    """:meth:`~privaterec.fed.methods.dp_fedavg.CentralDP.news_space_release` zeroes the noised
    cotangent of every news no client of the round touched: a data-dependent pool, so which
    rows are zero names the news of the users' histories and candidates."""
    from privaterec.fed.methods.dp_fedavg import CentralDP
    from privaterec.fed.news_space import NewsSpaceClipping

    original = CentralDP.news_space_release

    def touched_only(self: CentralDP, task: Any, params: Tensor, inputs: Any,
                     **kwargs: Any) -> tuple[Tensor, Tensor, list[float]]:
        user, news, losses = original(self, task, params, inputs, **kwargs)
        if not inputs:
            return user, torch.zeros_like(news), losses
        clean = NewsSpaceClipping(task).clipped_sum(params, task.batch(inputs), clip=self.clip)
        return user, news * (clean.news.abs().sum(1) > 0)[:, None], losses

    with _patched(CentralDP, "news_space_release", touched_only):
        yield


__all__ = ["noise_on_touched_news_only", "private_reply_with_metadata", "published_dpl",
           "published_dpl_labels", "reply_with_loss", "scaled_gaussian_noise",
           "scaled_noise", "scaled_noise_shares", "scaled_secure_noise", "unnoised_clip_count"]
