"""Worst-case canary audits of the device SDK's release of one query.

The devices are the SDK's own (VDPDevice, PrivateRecDevice) over the served app, with a
canary model: its user vector (VDP) is -big e_0 on a one-click history and +big e_0 on a
two-click one, or its attention (PrivateRec) e_0 and e_1; the SDK's release path (the
history tensors, the model, the release with the device's noise source: ``_draw``, what a
fresh query sends once its budget is charged) must pass at its claimed epsilon and be
caught with its noise cut 2x (privaterec.audit.device_release).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from privaterec.audit import broken
from privaterec.audit.device_release import (CANARY_SCALE, ReleaseGame, play_release,
                                             vdp_game)
from privaterec.ondevice.release import ServingConfig
from privaterec.privacy.samplers import SimulationNoise
from privaterec.serving.device import PrivateRecDevice, VDPDevice

RUNS = 400  # releases per side (half test): the Laplace worst case at claimed epsilon 1
# expects about 0.6 correct and 1.4 with its noise cut 2x


def _canary_vdp(device: VDPDevice) -> VDPDevice:
    """The served model's user encoder replaced by the canary's: ±big·e_0 by history size."""
    dim = device.model.model.dim

    def encode_user(vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        sign = torch.where(mask.sum(1) >= 2, 1.0, -1.0)[:, None]
        u = torch.zeros(vectors.shape[0], dim)
        u[:, 0] = CANARY_SCALE * device.config.vdp_clip
        return sign * u

    device.model.model.encode_user = encode_user  # type: ignore[method-assign]
    return device


def _canary_privaterec(device: PrivateRecDevice) -> PrivateRecDevice:
    """The served model's attention replaced by the canary's: e_0 or e_1 by history size."""
    basis = device.basis_size

    def attention(vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        index = (mask.sum(1) >= 2).long()
        return torch.nn.functional.one_hot(index, basis).to(vectors.dtype)

    device.model.model.attention = attention  # type: ignore[method-assign]
    return device


def _sdk_game(device, histories, direction: np.ndarray, method: str, *,
              log: bool = False) -> ReleaseGame:
    """``log``: the statistic reads the log of the release (post-processing): on PrivateRec's
    softplus-normalised α̃, log α̃₁ − log α̃₀ = log softplus(x₁) − log softplus(x₀) does not
    depend on the normalising sum."""
    def release(side: int, n: int) -> np.ndarray:
        rows = torch.stack([device._draw(histories[side]) for _ in range(n)]).double()
        return (rows.log() if log else rows).numpy()

    event = device._event()
    return ReleaseGame(method, release, direction, float(event.epsilon), float(event.delta),
                       f"the SDK's {type(device).__name__} with a canary model")


def _options(seed: int) -> dict:
    return dict(epsilon=1.0, budget=math.inf, max_fresh_releases=None,
                insecure_simulation_noise=SimulationNoise(torch.Generator().manual_seed(seed)))


@pytest.fixture
def histories(serving_news):
    return serving_news[:1], serving_news[:2]


def test_the_sdk_sends_what_its_draw_computes(served_app, histories, tmp_path):
    """A fresh query's release is the audited ``_draw`` (same seeded source: same values)."""
    sent = _canary_vdp(VDPDevice(transport=served_app, clip=0.001, cache_dir=tmp_path / "a",
                                 **_options(3)))
    drawn = _canary_vdp(VDPDevice(transport=served_app, clip=0.001, cache_dir=tmp_path / "b",
                                  **_options(3)))
    value, cached = sent.release(histories[1])
    assert not cached
    assert np.allclose(value, drawn._draw(histories[1]).tolist(), rtol=0, atol=1e-7)
    assert abs(value[0]) > 0 and len(value) == sent.model.model.dim


def test_the_vdp_sdk_release_passes_and_its_noise_cut_by_two_is_caught(served_app, histories,
                                                                        tmp_path):
    device = _canary_vdp(VDPDevice(transport=served_app, clip=0.001, cache_dir=tmp_path,
                                   **_options(0)))
    direction = np.eye(device.model.model.dim)[0]
    game = _sdk_game(device, histories, direction, "vdp (SDK)")
    correct = play_release(game, runs=RUNS)
    assert correct.claimed_epsilon == 1.0 and not correct.violated, correct.to_dict()
    with broken.scaled_noise(0.5):
        cut = play_release(game, runs=RUNS)
    assert cut.violated, cut.to_dict()


def test_the_privaterec_sdk_release_passes_and_its_noise_cut_is_caught(served_app, histories,
                                                                       tmp_path):
    """PrivateRec's α̃ (softplus-normalised, no padding): through the SDK's ``_draw``, 400
    releases per side catch a 4x noise cut; its release function ``dpa_release`` batched
    (the same call with the history tensors repeated, 20,000 releases per side) catches
    a 2x cut (through the normalisation, 200 test runs gave 0.85 for a 2x cut)."""
    from privaterec.ondevice.release import dpa_release

    device = _canary_privaterec(PrivateRecDevice(transport=served_app, padding_p=0.0,
                                                 cache_dir=tmp_path, **_options(1)))
    direction = np.zeros(device.basis_size)
    direction[[0, 1]] = -1.0, 1.0
    game = _sdk_game(device, histories, direction, "privaterec (SDK)", log=True)
    correct = play_release(game, runs=RUNS)
    assert correct.claimed_epsilon == 1.0 and not correct.violated, correct.to_dict()
    with broken.scaled_noise(0.25):
        cut = play_release(game, runs=RUNS)
    assert cut.violated, cut.to_dict()

    tensors = [device.model.history_tensors(h) for h in histories]

    def batched(side: int, n: int) -> np.ndarray:
        vectors, mask, r0 = tensors[side]
        out = dpa_release(device.model.model, r0, vectors.repeat(n, 1, 1), mask.repeat(n, 1),
                          device.config, noise=device.noise)
        return out.released.double().log().numpy()

    fast = ReleaseGame("privaterec (dpa_release)", batched, direction, 1.0, 0.0, "batched")
    assert not play_release(fast, runs=20_000).violated
    with broken.scaled_noise(0.5):
        cut2 = play_release(fast, runs=20_000)
    assert cut2.violated, cut2.to_dict()


@pytest.mark.parametrize("mechanism,delta,runs", [("laplace", 0.0, 2_000),
                                                  ("gaussian", 1e-5, 200_000)])
def test_the_batched_vdp_release_passes_and_its_noise_cut_by_two_is_caught(mechanism, delta,
                                                                           runs):
    config = ServingConfig(kind="vdp", epsilon=1.0, delta=delta, mechanism=mechanism,
                           vdp_clip=0.001)
    g = torch.Generator().manual_seed(2)
    game = vdp_game(config, dim=16, noise=lambda: SimulationNoise(g))
    assert not play_release(game, runs=runs).violated
    cut = broken.scaled_noise(0.5) if mechanism == "laplace" else \
        broken.scaled_gaussian_noise(0.5)
    with cut:
        assert play_release(game, runs=runs).violated


@pytest.mark.slow
def test_the_deployed_vdp_release_from_secure_noise():
    """SecureNoise (float-safe discrete Laplace, the device default; not seeded, about 10^4
    coordinates a second): a correct release passes, its noise cut 4x is caught. The
    Laplace worst case is tight, so an unseeded correct release is checked at 99.9%
    confidence (a false alarm at most once in 1,000 runs of the suite)."""
    from privaterec.privacy.samplers import SecureNoise

    config = ServingConfig(kind="vdp", epsilon=1.0, mechanism="laplace", vdp_clip=0.001)
    game = vdp_game(config, dim=16, noise=SecureNoise)
    assert not play_release(game, runs=400, alpha=1e-3).violated
    with broken.scaled_secure_noise(0.25, mechanism="laplace"):
        assert play_release(game, runs=400).violated
