"""The one generic recommender: news encoder Θ_N, user encoder Θ_U, dot-product click score.

FedNewsRec §3.1 / PrivateRec §3.1: ŷ = uᵀr. Histories are right-aligned row indices into a
:class:`~privaterec.data.features.NewsFeatures` table, left-padded with row 0 (the anonymous
news r₀); ``history_mask`` is ``True`` for real clicks.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch
from torch import nn

from privaterec.data.features import NewsFeatures
from privaterec.models.basis import BasicVectors
from privaterec.models.layers import NewsEncoderModule, eval_mode


class NewsEncoder(Protocol):
    """Θ_N: ``forward(features)`` with each feature of leading shape ``[n]`` → ``Tensor[n, d]``."""

    dim: int

    def __call__(self, features: dict[str, torch.Tensor]) -> torch.Tensor: ...


class UserEncoder(Protocol):
    """Θ_U: ``forward(news_vectors[b, H, d], mask[b, H])`` → ``Tensor[b, d]``.

    A row whose mask is all ``False`` must still produce a finite vector (encoders then attend
    over all positions, which hold the anonymous news).
    """

    def __call__(self, news_vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor: ...


_TensorVersions = tuple[tuple[torch.Tensor, int], ...]


def _same_versions(a: _TensorVersions, b: _TensorVersions) -> bool:
    """The same tensor objects (held, so their ids cannot be reused) at the same versions."""
    return len(a) == len(b) and all(x is y and u == v for (x, u), (y, v) in zip(a, b))


class Recommender(nn.Module):
    """Θ_N + Θ_U + dot product, reading news features from an attached table.

    Parameters
    ----------
    news_encoder, user_encoder:
        ``nn.Module`` instances following :class:`NewsEncoder` / :class:`UserEncoder`.
    features:
        The news table to read rows from; replace it with :meth:`attach` (e.g. to evaluate
        on another data directory). It is not part of the ``state_dict``.
    basis:
        PrivateRec's basic vectors b (:class:`~privaterec.models.basis.BasicVectors`). With a
        basis, the user vector used for scoring is ũ = Σ αᵢ bᵢ with α = :meth:`attention`
        (the noise-free PrivateRec model, ε_t = ε_s = ∞); :meth:`interest` gives the raw u.
    """

    def __init__(self, news_encoder: NewsEncoderModule, user_encoder: nn.Module,
                 features: NewsFeatures | None = None,
                 basis: BasicVectors | None = None) -> None:
        super().__init__()
        self.news_encoder = news_encoder
        self.user_encoder = user_encoder
        self.basis = basis
        self.features: NewsFeatures | None = None
        # c of centered attention, kept while no tensor it depends on changes (evaluation
        # and serving call attention once per batch or query with the same parameters)
        self._reference_cache: tuple[_TensorVersions, torch.Tensor] | None = None
        if features is not None:
            self.attach(features)

    @property
    def dim(self) -> int:
        return int(self.news_encoder.dim)

    def attach(self, features: NewsFeatures) -> None:
        """Use ``features`` as the news table for row indices (moved to the model's
        device; the model's :meth:`to` moves an attached table with it)."""
        self.features = features.to(self._device())

    def _device(self) -> torch.device:
        for tensor in self.parameters():
            return tensor.device
        return torch.device("cpu")

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor],
               recurse: bool = True) -> "Recommender":
        """``nn.Module._apply`` (``to``, ``cuda``, ``cpu``), then the attached table follows
        the parameters' device."""
        out = super()._apply(fn, recurse)
        if self.features is not None:
            self.features = self.features.to(self._device())
        return out

    def encode_features(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        """Θ_N on raw features with leading shape ``[n]`` → ``Tensor[n, d]``."""
        return self.news_encoder(features)

    def encode_rows(self, rows: torch.Tensor, *, deduplicate: bool = True) -> torch.Tensor:
        """Θ_N on table rows of any shape ``S`` → ``Tensor[S, d]``.

        With ``deduplicate`` each distinct row is encoded once (``torch.unique``); without,
        every row is encoded, which works under ``torch.func.vmap`` (per-client gradients).
        """
        if not deduplicate:
            return self._encode_table_rows(rows.reshape(-1)).reshape(*rows.shape, -1)
        unique, inverse = torch.unique(rows.reshape(-1), return_inverse=True)
        return self._encode_table_rows(unique)[inverse].reshape(*rows.shape, -1)

    def _encode_table_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows [n]`` → ``[n, d]``, via the encoder's ``encode_table`` if it has one."""
        if self.features is None:
            raise RuntimeError("no news table attached: call Recommender.attach(features)")
        encode_table = getattr(self.news_encoder, "encode_table", None)
        if encode_table is not None:
            return encode_table(self.features, rows)
        return self.news_encoder(self.features.select(rows))

    def pretrained_parameter_names(self) -> list[str]:
        """Trained parameters fine-tuned from a pre-trained model (PLM-NR's MiniLM layers).

        Names as in ``named_parameters()``; empty for encoders trained from scratch.
        """
        names = getattr(self.news_encoder, "pretrained_parameter_names", None)
        return [] if names is None else [f"news_encoder.{n}" for n in names()]

    def prepare_news_table(self, *, progress: bool = False) -> None:
        """Let the news encoder precompute what it can for the attached table (training).

        Encoders with a ``prepare_table(features)`` method (PLM-NR: the frozen MiniLM layers,
        :meth:`~privaterec.models.plm_encoder.PLMNewsEncoder.prepare_table`) run it once, so
        that :meth:`encode_rows` then only runs what is trained, also inside ``torch.func``
        transforms. A no-op for the other encoders and without an attached table.
        """
        prepare = getattr(self.news_encoder, "prepare_table", None)
        if prepare is not None and self.features is not None:
            prepare(self.features, progress=progress)

    def interest(self, history_vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The raw user vector u = Θ_U: ``[b, H, d]``, ``[b, H]`` → ``[b, d]``."""
        return self.user_encoder(history_vectors, mask)

    def encode_user(self, history_vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The user vector scored against news: u, or ũ = Σ αᵢ bᵢ with a basis → ``[b, d]``."""
        if self.basis is None:
            return self.user_encoder(history_vectors, mask)
        return self.basis.reconstruct(self.attention(history_vectors, mask))

    def attention(self, history_vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """α ``[b, B]`` of histories ``[b, H, d]``, ``[b, H]`` (PrivateRec Alg. 2 line 7).

        ``dot`` attention: softmax(u·bᵀ/√d). ``centered``: softmax(s·cos(u − c, bᵢ)) with c
        = :meth:`reference_user`. Every consumer of α (training, DPA release, serving, local
        ranking, diagnostics) computes it here.
        """
        basis = self.basis
        if basis is None:
            raise RuntimeError("the model has no basic vectors (ModelConfig.basis_size = 0)")
        user = self.user_encoder(history_vectors, mask)
        if basis.centered:
            user = user - self.reference_user()
        return basis.attention(user)

    def reference_user(self) -> torch.Tensor:
        """c = Θ_U(r̄, …, r̄) ``[d]``: the user vector of a history of H copies of the mean
        news vector r̄ of the basis's reference news (``centered`` attention).

        It estimates the component every user vector shares (the mean user vector), which
        otherwise dominates u and gives every user the same α (docs/privaterec.md,
        "Collapse of the basis attention"). Computed in eval mode (no dropout) and without gradient: a constant
        function of the current parameters and public news, reading no user's data. Inside
        ``torch.func.vmap`` it does not depend on the mapped inputs, so it runs once per call.
        """
        basis = self.basis
        if basis is None or basis.reference is None:
            raise RuntimeError("reference_user needs centered basis attention")
        reference = basis.reference
        key = self._reference_key() if not torch.is_grad_enabled() else None
        cached = self._reference_cache
        if key is not None and cached is not None and _same_versions(cached[0], key):
            return cached[1]
        with eval_mode(self), torch.no_grad():
            mean_news = self.news_encoder(reference.features()).mean(0)  # [d]
            history = mean_news.expand(1, reference.length, mean_news.shape[-1])
            mask = torch.ones(1, reference.length, dtype=torch.bool, device=history.device)
            center = self.user_encoder(history, mask)[0]
        center = center.detach()
        if key is not None:
            self._reference_cache = (key, center)
        return center

    def _reference_key(self) -> _TensorVersions | None:
        """Identity and in-place version of every tensor c depends on (the encoders'
        parameters and buffers, the reference news), or None where they cannot be read
        (tensors wrapped by ``torch.func`` transforms): then c is recomputed."""
        tensors = [*self.news_encoder.parameters(), *self.news_encoder.buffers(),
                   *self.user_encoder.parameters(), *self.user_encoder.buffers()]
        assert self.basis is not None and self.basis.reference is not None
        tensors += list(self.basis.reference.buffers())
        try:
            if any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors):
                return None
            return tuple((t, t._version) for t in tensors)
        except RuntimeError:
            return None

    @staticmethod
    def score(user: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Click scores ``uᵀr``: ``[b, d]`` × ``[b, C, d]`` → ``[b, C]``."""
        return torch.einsum("bd,bcd->bc", user, candidates)

    def forward(self, history: torch.Tensor, history_mask: torch.Tensor,
                candidates: torch.Tensor) -> torch.Tensor:
        """Click logits for ``candidates``.

        Parameters
        ----------
        history: ``LongTensor[b, H]`` table rows. history_mask: ``BoolTensor[b, H]``.
        candidates: ``LongTensor[b, C]`` table rows.

        Returns
        -------
        ``Tensor[b, C]`` logits.
        """
        rows = torch.cat([history, candidates], dim=1)
        vectors = self.encode_rows(rows)
        h = history.shape[1]
        user = self.encode_user(vectors[:, :h], history_mask)
        return self.score(user, vectors[:, h:])
