"""Worst-case canary audits of a device's release of one query (PrivateRec §3.2.1, Alg. 2).

A serving device sends, per query, a privatised summary of its user's history
(:mod:`privaterec.ondevice.release`): VDP's user vector clipped to θ plus noise with
sensitivity 2θ (:func:`~privaterec.ondevice.release.vdp_user_release`), or PrivateRec's
attention weights α on the simplex plus DPA noise
(:func:`~privaterec.ondevice.release.dpa_release`, L1 sensitivity 2). Both guarantees hold for every model the server ships, so
the worst case is a *canary model*: one whose user vector (VDP) is ±big·e₀ whatever the
news, clipped by the real release to exactly ±θ·e₀ — a shift of 2θ on one coordinate, the
whole sensitivity — or whose attention (PrivateRec, no padding) is e₀ on one history and e₁
on the other — an L1 shift of 2, the whole simplex sensitivity. Both sensitivities cover any
change of the history, so the pair is one user's history replaced, and the claim is the
query's event (:func:`~privaterec.ondevice.release.serving_event`).

:func:`vdp_game` plays it on VDP's release of user vectors itself
(:func:`~privaterec.ondevice.release.vdp_user_release`, which the ``vdp`` serving mode runs
after the user encoder), batched (``runs`` rows in one call, each row an independent release from the device's noise source:
:class:`~privaterec.privacy.samplers.SecureNoise` on a device,
:class:`~privaterec.privacy.samplers.SimulationNoise` in a simulation); the device SDK's
own release path (:class:`privaterec.serving.device.VDPDevice` and ``PrivateRecDevice``,
their ``_draw``: the history tensors, the serving mode's ``release`` on the model with the
device's noise source, what a fresh query sends after its budget is charged) is played through
:class:`ReleaseGame` with a release callable, by ``tests/serving/test_device_release_audit.py``
(the SDK is a layer above this package).

The statistic is fixed before any run: the released vector's projection on the difference of
the two noiseless releases (VDP: coordinate 0, monotone in the Laplace and Gaussian
likelihood ratios; PrivateRec: α̃₁ − α̃₀ after the device's normalisation, post-processing);
half the runs choose its threshold, half give the Clopper–Pearson bound
(:func:`~privaterec.audit.distinguisher.fixed_statistic_bound`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from privaterec.audit.distinguisher import fixed_statistic_bound
from privaterec.audit.runner import PairAudit
from privaterec.errors import ConfigError
from privaterec.ondevice.release import ServingConfig, serving_event, vdp_user_release
from privaterec.privacy.samplers import NoiseSource

CANARY_SCALE = 1e3
"""|user vector| / θ of VDP's canary before the clip."""

Release = Callable[[int, int], np.ndarray]
"""``release(side, n)``: ``n`` independent releases ``[n, k]`` of side 0 (D) or 1 (D′)."""


@dataclass(frozen=True)
class ReleaseGame:
    """A device-release canary pair: ``release`` (:data:`Release`), the statistic's
    ``direction`` ``[k]``, the claim of one query and a note for the table."""

    method: str
    release: Release
    direction: np.ndarray
    claimed_epsilon: float
    claimed_delta: float
    note: str


def play_release(game: ReleaseGame, *, runs: int, alpha: float = 0.05) -> PairAudit:
    """``runs`` releases per side (half select, half test; module docstring)."""
    if not (isinstance(runs, int) and runs >= 16):
        raise ConfigError(f"invalid audit parameter 'runs': got {runs!r}, expected an int >= 16")
    half = runs // 2
    stats = [np.asarray(game.release(side, n), dtype=np.float64) @ game.direction
             for n in (half, runs - half) for side in (0, 1)]
    result = fixed_statistic_bound((stats[0], stats[1]), (stats[2], stats[3]),
                                   name="projection of the release on the canary's shift",
                                   alpha=alpha, delta=game.claimed_delta)
    return PairAudit(method=game.method, mode="device", adjacency="user",
                     pair="canary: the worst-case pair of releases",
                     description=game.note, claimed_epsilon=game.claimed_epsilon,
                     claimed_delta=game.claimed_delta, claim_valid=True,
                     claim_source="serving_event (one query)", runs=runs, result=result)


def vdp_canary_users(config: ServingConfig, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The canary model's user vectors ``[d]`` of D and D′: ∓ :data:`CANARY_SCALE` ·θ·e₀."""
    u = torch.zeros(dim)
    u[0] = CANARY_SCALE * config.vdp_clip
    return -u, u


def vdp_game(config: ServingConfig, *, dim: int,
             noise: Callable[[], NoiseSource]) -> ReleaseGame:
    """VDP's canary pair on the release of the user vector itself (module docstring),
    ``n`` releases per call from a fresh ``noise()`` source."""
    if config.kind != "vdp":
        raise ConfigError(f"vdp_game needs ServingConfig(kind='vdp'), got {config.kind!r}")
    users = vdp_canary_users(config, dim)

    def release(side: int, n: int) -> np.ndarray:
        out = vdp_user_release(users[side].repeat(n, 1), config, noise=noise())
        return out.detach().to(torch.float64).numpy()

    event = serving_event(config, basis_size=0, dim=dim)
    direction = np.zeros(dim)
    direction[0] = 1.0
    return ReleaseGame("vdp", release, direction, float(event.epsilon), float(event.delta),
                       f"user vector ±{CANARY_SCALE:g}θ e_0 clipped to θ = "
                       f"{config.vdp_clip:g}, d = {dim}, {config.mechanism}")


__all__ = ["CANARY_SCALE", "Release", "ReleaseGame", "play_release", "vdp_canary_users",
           "vdp_game"]
