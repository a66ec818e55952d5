"""Label privacy for PrivateRec's training samples: which displayed news the user clicked.

Replaces the published DP label permutation (PrivateRec Alg. 3 lines 16-18), whose candidate
set always holds the clicked news: the set itself then names the click, so the upload is not
DP for the label at any ε (docs/privacy.md, "Label privacy"). Here the release of one
impression is

1. ``size`` candidate positions drawn uniformly from the impression's displayed news,
   **independently of the clicks** (without replacement when the impression has at least
   ``size`` news, with replacement otherwise);
2. the true class t: a uniformly chosen clicked position among the drawn ones, or the extra
   class ``size`` ("no click drawn") when none of them was clicked — so impressions with
   several clicks are handled;
3. (size + 1)-ary randomized response on t: t̃ = t with probability e^ε/(e^ε + size), else one
   of the other ``size`` classes uniformly (Warner 1965; Kairouz et al. 2016).

The device trains on the drawn candidates with the news at t̃ labelled positive and drops the
impression when t̃ = ``size``. Everything it uploads depends on the clicks only through t̃,
so the whole release is ε-DP for **any change of the clicks of one impression** (the news
displayed fixed): for every output o, P(o | y) = Σ_t P(t | y, S)·RR(o | t) lies within a
factor e^ε of P(o | y') because every RR(o | t) does. A user's impressions are disjoint data,
so per round the clicks of one impression cost ε and all of a user's ``n`` impressions cost
n·ε (user level, before counting what the displayed news themselves reveal).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from privaterec.errors import ConfigError
from privaterec.privacy.events import Phase, PrivacyEvent
from privaterec.privacy.samplers import NoiseSource


def _check(size: int, epsilon: float) -> None:
    if not (isinstance(size, int) and size >= 2):
        raise ConfigError(f"invalid label candidate set size: got {size!r}, expected an int "
                          f">= 2 (1 + the number of negatives)")
    if not (epsilon > 0):
        raise ConfigError(f"invalid privacy parameter 'epsilon' of the label release: got "
                          f"{epsilon!r}, expected > 0 (math.inf: labels unprotected)")


def keep_probability(*, epsilon: float, size: int) -> float:
    """P(t̃ = t) = e^ε/(e^ε + size) of the (size + 1)-ary randomized response."""
    _check(size, epsilon)
    if math.isinf(epsilon):
        return 1.0
    return 1.0 / (1.0 + size * math.exp(-epsilon))


def draw_positions(counts: Tensor, *, size: int, noise: NoiseSource) -> Tensor:
    """Uniform candidate positions ``LongTensor[n, size]`` in each impression, label-blind.

    ``counts``: ``LongTensor[n]`` number of displayed news of each impression (≥ 1). Without
    replacement where ``counts >= size``, with replacement elsewhere.
    """
    n = counts.shape[0]
    width = max(int(counts.max()) if n else 1, size)
    keys = noise.uniform((n, width))
    keys = keys.masked_fill(torch.arange(width) >= counts[:, None], 2.0)
    without = keys.argsort(dim=1)[:, :size]
    with_repl = (noise.uniform((n, size))
                 * counts[:, None]).long().clamp(max=width - 1)
    return torch.where((counts >= size)[:, None], without, with_repl)


def release_labels(clicks: Tensor, counts: Tensor, *, size: int, epsilon: float,
                   noise: NoiseSource) -> tuple[Tensor, Tensor]:
    """The label release of n impressions (module docstring, steps 1-3).

    Parameters
    ----------
    clicks:
        ``BoolTensor[n, C]``: which displayed news of each impression were clicked (padded
        with False beyond ``counts``).
    counts:
        ``LongTensor[n]``: displayed news per impression (≥ 1).
    size:
        Candidates per impression (1 + k negatives in training).
    epsilon:
        ε of one impression's release (> 0; ``math.inf``: t̃ = t).
    noise:
        The client's seeded source (simulation) or its device's secure source
        (:class:`~privaterec.privacy.samplers.NoiseSource`) — the draws are the only randomness.

    Returns
    -------
    (``LongTensor[n, size]`` drawn positions, ``LongTensor[n]`` released class t̃ in
    [0, size]; ``size`` means "no click drawn": drop the impression)
    """
    _check(size, epsilon)
    n = clicks.shape[0]
    positions = draw_positions(counts, size=size, noise=noise)
    drawn_clicked = clicks.gather(1, positions.clamp(max=clicks.shape[1] - 1)) & (
        positions < counts[:, None])
    # t: a uniformly chosen clicked slot (random keys, largest among clicked), else `size`.
    keys = noise.uniform((n, size))
    keys = keys.masked_fill(~drawn_clicked, -1.0)
    truth = torch.where(drawn_clicked.any(dim=1), keys.argmax(dim=1),
                        torch.full((n,), size, dtype=torch.long))
    keep = keep_probability(epsilon=epsilon, size=size)
    u = noise.uniform((n,))
    shift = 1 + noise.randint(size, (n,))
    other = (truth + shift) % (size + 1)
    released = torch.where(u < keep, truth, other)
    return positions, released


def label_event(*, epsilon: float, size: int, max_impressions: int,
                phase: Phase = "train") -> PrivacyEvent:
    """The event of one client's label releases in one round.

    One click (the clicks of one impression) costs ``epsilon``; a whole user costs
    ``max_impressions``·ε (the client releases at most that many impressions per round).
    """
    _check(size, epsilon)
    return PrivacyEvent(
        mechanism="randomized_response", epsilon=epsilon, phase=phase, data="labels",
        epsilon_user=epsilon * max_impressions,
        note=f"label release: {size} candidates drawn uniformly from each impression "
             f"independently of the clicks, {size + 1}-ary randomized response on which "
             f"one was clicked (or none); epsilon per impression's clicks, at most "
             f"{max_impressions} impressions per round")


def candidate_set_event(*, phase: Phase = "train") -> PrivacyEvent:
    """The displayed news an unprotected gradient reveals (PrivateRec's candidate path).

    Public under one-click adjacency (the news displayed are fixed), not private under
    user-level adjacency (they are the user's impressions).
    """
    return PrivacyEvent(
        mechanism="candidate_sets", epsilon=0.0, epsilon_user=math.inf, phase=phase,
        data="labels",
        note="the candidate-path gradient is uploaded unnoised: it reveals which news were "
             "drawn from the user's impressions (displayed news), not which were clicked; "
             "public for one-click adjacency, NOT private for user-level adjacency")


__all__ = ["candidate_set_event", "draw_positions", "keep_probability", "label_event",
           "release_labels"]
