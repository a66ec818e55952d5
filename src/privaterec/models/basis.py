"""PrivateRec's public basic vectors b and the interest decomposition (PrivateRec §3.2.2).

Alg. 2 line 7: α = softmax(u·bᵀ/√d) decomposes the user vector u ∈ R^d into B attention
weights over B trained basic vectors b ∈ R^{B×d}; Alg. 1 line 3 / Alg. 3 line 15: the server
(or the loss) reconstructs ũ = Σᵢ α̃ᵢ bᵢ. The noise on α lives in
:mod:`privaterec.privacy.dpa`; this module is only the deterministic model part.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

_NORM_EPS = 1e-12


BASIS_ATTENTIONS = ("dot", "centered")
"""How α is computed from u and b (``ModelConfig.basis_attention``; docs/privaterec.md,
"Collapse of the basis attention"):

* ``dot`` — softmax(u·bᵀ/√d), Alg. 2 line 7 as published;
* ``centered`` — softmax(s·cos(u − c, bᵢ)), where c = Θ_U(r̄, …, r̄) is the user vector of a
  reference history made of the mean news vector r̄ of :data:`REFERENCE_NEWS` public news
  (:class:`ReferenceNews`), computed from the current model without gradient, and s is a
  fixed scale (``ModelConfig.basis_scale``)."""

REFERENCE_NEWS = 256
"""K, the number of public news of the reference history of ``centered`` attention."""

FEATURE_NAMES = ("title", "abstract", "category", "subcategory", "news_index")
"""The news features a reference news stores (those of
:meth:`privaterec.data.features.NewsFeatures.tensors`)."""


class ReferenceNews(nn.Module):
    """The features of K public news, as buffers: the reference of ``centered`` attention.

    They are part of the model's ``state_dict`` (public, as every news of the pool; nothing
    in them depends on a user), so the centre c is a function of the model alone, the same
    on the server, on every device and at evaluation. Until :meth:`fill` they hold K
    anonymous (all-padding) news.

    Parameters
    ----------
    count:
        K ≥ 1.
    title_len, abstract_len:
        Token lengths of the title and abstract features.
    length:
        H, the length of the reference history (the model's history length).
    """

    def __init__(self, count: int, *, title_len: int, abstract_len: int,
                 length: int) -> None:
        super().__init__()
        if count < 1 or length < 1:
            raise ValueError(f"reference news count and history length must be >= 1, got "
                             f"{count} and {length}")
        self.count = count
        self.length = length
        shapes = {"title": (count, title_len), "abstract": (count, abstract_len),
                  "category": (count,), "subcategory": (count,), "news_index": (count,)}
        for name in FEATURE_NAMES:
            self.register_buffer(name, torch.zeros(shapes[name], dtype=torch.long))

    @staticmethod
    def rows(table_size: int, count: int) -> torch.Tensor:
        """K evenly spaced real rows of a news table of ``table_size`` rows (row 0, the
        anonymous news, excluded; rows repeat when the table has fewer than K news)."""
        real = max(1, table_size - 1)
        return 1 + (torch.arange(count) * real) // count if real >= count \
            else 1 + torch.arange(count) % real

    def fill(self, features: dict[str, torch.Tensor]) -> None:
        """Copy ``features`` (each ``[K, ...]``, e.g. ``NewsFeatures.select(rows)``) in."""
        for name in FEATURE_NAMES:
            buffer = getattr(self, name)
            value = features[name]
            if value.shape != buffer.shape:
                raise ValueError(f"reference feature {name!r}: expected shape "
                                 f"{tuple(buffer.shape)}, got {tuple(value.shape)}")
            buffer.copy_(value)

    def features(self) -> dict[str, torch.Tensor]:
        """Feature name → ``[K, ...]``, the input of a news encoder."""
        return {name: getattr(self, name) for name in FEATURE_NAMES}


class BasicVectors(nn.Module):
    """B trainable basic vectors of size d (default B = 5, PrivateRec §4).

    Parameters
    ----------
    size:
        B ≥ 1.
    dim:
        d, the size of user and news vectors.
    attention:
        ``dot`` (published) or ``centered`` (:data:`BASIS_ATTENTIONS`).
    scale:
        s of ``centered`` attention: the logits s·cos(u − c, bᵢ) lie in [−s, s].
    reference:
        The reference news of ``centered`` attention (required for it, unused by ``dot``).
    """

    def __init__(self, size: int, dim: int, *, attention: str = "dot",
                 scale: float = 5.0, reference: ReferenceNews | None = None) -> None:
        super().__init__()
        if size < 1:
            raise ValueError(f"basis size must be >= 1, got {size}")
        if attention not in BASIS_ATTENTIONS:
            raise ValueError(f"basis attention must be one of {BASIS_ATTENTIONS}, got "
                             f"{attention!r}")
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise ValueError(f"basis attention scale must be a positive number, got {scale!r}")
        if (attention == "centered") != (reference is not None):
            raise ValueError("centered basis attention needs reference news (and dot "
                             "attention takes none)")
        self.size = size
        self.dim = dim
        self.kind = attention
        self.scale = float(scale)
        self.weight = nn.Parameter(torch.randn(size, dim))
        self.reference = reference

    @property
    def centered(self) -> bool:
        """Whether α is computed from u − c (``centered`` attention)."""
        return self.kind == "centered"

    def logits(self, user: torch.Tensor) -> torch.Tensor:
        """Attention logits ``[..., d]`` → ``[..., B]``: u·bᵀ/√d (``dot``), or s·cos(x, bᵢ)
        of the already centred x = u − c (``centered``; a zero x gives zero logits)."""
        if self.kind == "dot":
            return user @ self.weight.T / math.sqrt(self.dim)
        x = F.normalize(user, dim=-1, eps=_NORM_EPS)
        b = F.normalize(self.weight, dim=-1, eps=_NORM_EPS)
        return self.scale * (x @ b.T)

    def attention(self, user: torch.Tensor) -> torch.Tensor:
        """α = softmax(:meth:`logits`): ``[..., d]`` → ``[..., B]`` (Alg. 2 line 7).

        For ``centered`` attention ``user`` must already be u − c: use
        :meth:`privaterec.models.recommender.Recommender.attention`, which centres.
        """
        return torch.softmax(self.logits(user), dim=-1)

    def reconstruct(self, alpha: torch.Tensor) -> torch.Tensor:
        """ũ = Σᵢ αᵢ bᵢ: ``[..., B]`` → ``[..., d]`` (Alg. 1 line 3, Alg. 3 line 15)."""
        return alpha @ self.weight

    def score_matrix(self, news: torch.Tensor) -> torch.Tensor:
        """P = b·Rᵀ ``[B, C]`` for news vectors R ``[C, d]``: scores of α̃ are α̃ᵀP
        (docs/architecture.md#performance-design)."""
        return self.weight @ news.T


# Collapse thresholds of :func:`attention_diagnostics` (docs/privaterec.md, "Collapse of the basis attention").
COLLAPSE_SPREAD = 0.1
"""α spread (mean total-variation distance of the users' α from their mean) below which the
users' attention is called collapsed: less than a tenth of a user's attention differs from
the average user's, so every user gets nearly the same ũ. Measured on the default synthetic
data: 0.0001 for the collapsed seed 0 (one-hot), 0.06 for the near-uniform α of DP-FedAvg,
0.23 for healthy models (BENCHMARKS.md)."""


@dataclass(frozen=True)
class AttentionDiagnostics:
    """How the users' basis attention α is spread (PrivateRec's collapse; docs/privaterec.md).

    Attributes
    ----------
    users: n, the users measured. basis_size: B.
    entropy_mean: mean Shannon entropy of α in nats (ln B for the uniform α, 0 for one-hot).
    entropy_ratio: ``entropy_mean / ln B``.
    max_weight_mean: mean of max_i αᵢ (1 for one-hot α).
    argmax_share: fraction of users whose largest αᵢ is the most common one.
    argmax_counts: users per basis vector that is their argmax, ``[B]``.
    spread: mean over users of the total-variation distance ½‖α − ᾱ‖₁ to the mean α ᾱ
        (0 when every user has the same α, whatever it is).
    common_share: ‖x̄‖² / mean ‖x‖² of the attention's input x (u for ``dot`` attention,
        u − c for ``centered``): the share of its energy every user has in common (1 when
        all users' x are the same; the cause of the collapse, docs/privaterec.md).
    user_norm_mean, user_norm_max: ‖u‖ of the user encoder's output.
    scored_norm_mean, scored_norm_max: ‖ũ‖ of the scored vector ũ = Σ αᵢ bᵢ.
    collapsed: ``spread < COLLAPSE_SPREAD``: every user gets nearly the same ũ, so the
        ranking is the same for everyone (popularity-like).
    """

    users: int
    basis_size: int
    entropy_mean: float
    entropy_ratio: float
    max_weight_mean: float
    argmax_share: float
    argmax_counts: tuple[int, ...]
    spread: float
    common_share: float
    user_norm_mean: float
    user_norm_max: float
    scored_norm_mean: float
    scored_norm_max: float
    collapsed: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``argmax_counts`` as a list)."""
        out = asdict(self)
        out["argmax_counts"] = list(self.argmax_counts)
        return out


def attention_diagnostics(alpha: torch.Tensor, user: torch.Tensor, scored: torch.Tensor, *,
                          attention_input: torch.Tensor | None = None
                          ) -> AttentionDiagnostics:
    """Collapse statistics of n users' attention.

    Parameters
    ----------
    alpha:
        ``[n, B]`` rows on the simplex (α = :meth:`BasicVectors.attention` of u).
    user:
        ``[n, d]`` the raw user vectors u.
    scored:
        ``[n, d]`` the scored vectors ũ = Σ αᵢ bᵢ.
    attention_input:
        ``[n, d]`` what the attention compares with b (u − c for ``centered``); default u.

    Raises
    ------
    ValueError
        If the shapes disagree or n = 0.
    """
    if alpha.dim() != 2 or user.dim() != 2 or scored.shape != user.shape \
            or alpha.shape[0] != user.shape[0]:
        raise ValueError(f"expected alpha [n, B], user and scored [n, d]; got "
                         f"{tuple(alpha.shape)}, {tuple(user.shape)}, {tuple(scored.shape)}")
    n, size = alpha.shape
    if n == 0:
        raise ValueError("attention_diagnostics needs at least one user")
    a = alpha.detach().double()
    entropy = -(a * torch.log(a.clamp_min(1e-300))).sum(-1)
    counts = torch.bincount(a.argmax(-1), minlength=size)
    spread = 0.5 * (a - a.mean(0, keepdim=True)).abs().sum(-1).mean()
    x = (user if attention_input is None else attention_input).detach().double()
    if x.shape != user.shape:
        raise ValueError(f"attention_input must have the shape of user {tuple(user.shape)}, "
                         f"got {tuple(x.shape)}")
    energy = float((x * x).sum(-1).mean())
    common = float(x.mean(0).square().sum()) / energy if energy > 0 else 1.0
    user_norm = user.detach().double().norm(dim=-1)
    scored_norm = scored.detach().double().norm(dim=-1)
    log_b = math.log(size) if size > 1 else 1.0
    return AttentionDiagnostics(
        users=n, basis_size=size, entropy_mean=float(entropy.mean()),
        entropy_ratio=float(entropy.mean()) / log_b,
        max_weight_mean=float(a.max(-1).values.mean()),
        argmax_share=float(counts.max()) / n,
        argmax_counts=tuple(int(c) for c in counts), spread=float(spread),
        common_share=common,
        user_norm_mean=float(user_norm.mean()), user_norm_max=float(user_norm.max()),
        scored_norm_mean=float(scored_norm.mean()), scored_norm_max=float(scored_norm.max()),
        collapsed=bool(float(spread) < COLLAPSE_SPREAD))


__all__ = ["BASIS_ATTENTIONS", "COLLAPSE_SPREAD", "FEATURE_NAMES", "REFERENCE_NEWS",
           "AttentionDiagnostics", "BasicVectors", "ReferenceNews", "attention_diagnostics"]
