"""Collapse diagnostics of PrivateRec's basis attention over the users of a split.

PrivateRec's α = softmax(u·bᵀ/√d) (Alg. 2 line 7) can collapse: every user's α becomes the
same (one-hot) vector, every user gets the same ũ = Σ αᵢ bᵢ and the ranking degenerates to
popularity (docs/privaterec.md, "Collapse of the basis attention"). :func:`basis_diagnostics` measures it on the
users of a split, with their histories as the evaluation sees them, and
:func:`privaterec.runs.ranking.train_run` writes it to ``metrics.json`` (``test.basis``).
"""

from __future__ import annotations

import torch

from privaterec.data.features import NewsFeatures
from privaterec.data.history import history_rows
from privaterec.data.records import MindSplit
from privaterec.models.layers import eval_mode
from privaterec.models.basis import AttentionDiagnostics, attention_diagnostics
from privaterec.models.recommender import Recommender


def basis_diagnostics(model: Recommender, split: MindSplit, features: NewsFeatures, *,
                      history_len: int, batch_size: int = 256) -> AttentionDiagnostics | None:
    """:func:`~privaterec.models.basis.attention_diagnostics` of the split's users.

    One history per distinct user: that of the user's last labelled impression (the
    last ``history_len`` clicks, as :func:`~privaterec.eval.evaluate.score_impressions`
    reads it). The model runs in eval mode under ``torch.no_grad()``, ``batch_size`` users
    at a time. Returns ``None`` for a model without basic vectors or a split without
    labelled impressions.
    """
    basis = model.basis
    if basis is None:
        return None
    last: dict[str, list[str]] = {}
    for imp in split.behaviors:
        if imp.labels is not None:
            last[imp.user_id] = list(imp.history)
    if not last:
        return None
    histories = [history_rows(h, features, history_len) for h in last.values()]
    rows = torch.stack([r for r, _ in histories])  # [n, H]
    mask = torch.stack([m for _, m in histories])  # [n, H]
    alphas, users, inputs, scored = [], [], [], []
    with eval_mode(model), torch.no_grad():
        center = model.reference_user() if basis.centered else None
        used, inverse = torch.unique(rows, return_inverse=True)  # each news encoded once
        device = next(iter(model.parameters()), torch.zeros(0)).device
        table = features.to(device)
        cache = torch.cat([model.encode_features(table.select(chunk.to(device)))
                           for chunk in used.split(batch_size)])  # [U, d]
        inverse, mask = inverse.to(device), mask.to(device)
        for start in range(0, rows.shape[0], batch_size):
            idx, m = inverse[start: start + batch_size], mask[start: start + batch_size]
            u = model.interest(cache[idx], m)  # [b, d]
            alpha = model.attention(cache[idx], m)  # [b, B]
            alphas.append(alpha)
            users.append(u)
            inputs.append(u if center is None else u - center)
            scored.append(basis.reconstruct(alpha))
    return attention_diagnostics(torch.cat(alphas).cpu(), torch.cat(users).cpu(),
                                 torch.cat(scored).cpu(), attention_input=torch.cat(inputs).cpu())


__all__ = ["basis_diagnostics"]
