"""Tests of privaterec.privacy.noise: the registry of noise mechanisms and its users.

A mechanism is one module of ``privacy/noise/``; calibration, events, the ledger, seeded and
secure draws and ``privaterec privacy calibrate`` all ask the registry, so a mechanism that is
registered is used everywhere without another change (docs/architecture.md, "How to add a
noise mechanism").
"""

from __future__ import annotations

import math
import pkgutil

import pytest
import torch
from dp_accounting import dp_event

import privaterec.privacy.noise as noise_package
from privaterec.errors import ConfigError
from privaterec.privacy.calibrate import calibrate, clipped_release
from privaterec.privacy.ledger import compose_events
from privaterec.privacy.mechanisms import calibrated_noise
from privaterec.privacy.noise import MECHANISMS, NOISE_KINDS, noise_mechanism
from privaterec.privacy.noise.laplace import Laplace
from privaterec.privacy.report import calibrate_noise
from privaterec.privacy.samplers import SimulationNoise


def test_every_module_of_the_package_registers_its_mechanism():
    modules = {m.name for m in pkgutil.iter_modules(noise_package.__path__)} - {"base"}
    assert {type(m).__module__.rpartition(".")[2] for m in MECHANISMS.values()} == modules
    assert NOISE_KINDS[0] == "laplace" and set(NOISE_KINDS) == set(MECHANISMS)
    with pytest.raises(ConfigError, match="'noise'.*'uniform'.*'laplace'"):
        noise_mechanism("uniform", "noise")


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_scale_for_epsilon_and_epsilon_for_scale_are_inverse(name):
    noise = MECHANISMS[name]
    delta = 0.0 if noise.pure else 1e-5
    for epsilon in (0.3, 1.0, 4.0):
        scale = noise.scale(epsilon=epsilon, delta=delta, sensitivity=2.0)
        assert scale > 0
        assert noise.epsilon(scale=scale, sensitivity=2.0, delta=delta) == pytest.approx(
            epsilon, rel=1e-6)
    assert noise.scale(epsilon=math.inf, delta=delta, sensitivity=2.0) == 0.0
    assert noise.epsilon(scale=0.0, sensitivity=2.0, delta=delta) == math.inf


class _TwiceLaplace(Laplace):
    """A test mechanism: Laplace noise calibrated as if the sensitivity were doubled."""

    name = "twice_laplace"

    def scale(self, *, epsilon: float, delta: float, sensitivity: float) -> float:
        return super().scale(epsilon=epsilon, delta=delta, sensitivity=2 * sensitivity)

    def epsilon(self, *, scale: float, sensitivity: float, delta: float = 0.0) -> float:
        return super().epsilon(scale=scale, sensitivity=2 * sensitivity, delta=delta)


def test_a_registered_mechanism_is_used_by_calibration_events_ledger_and_draws(monkeypatch):
    monkeypatch.setitem(MECHANISMS, "twice_laplace", _TwiceLaplace())
    twice = calibrate(mechanism="twice_laplace", epsilon=1.0, sensitivity=0.5)
    plain = calibrate(mechanism="laplace", epsilon=1.0, sensitivity=0.5)
    assert twice.scale == 2 * plain.scale == 1.0 and twice.noisy
    # The event's ε is checked against the mechanism's ε for its scale, and its
    # dp_accounting event is the mechanism's.
    assert isinstance(twice.event.to_dp_event(), dp_event.LaplaceDpEvent)
    assert compose_events([(twice.event, 3)], delta=0.0) == pytest.approx(3.0)
    draws = calibrated_noise((4, 3), twice, noise=SimulationNoise(torch.Generator().manual_seed(1)))
    expected = SimulationNoise(torch.Generator().manual_seed(1)).draw((4, 3), mechanism="laplace",
                                                                      scale=1.0)
    assert torch.equal(draws, expected)
    released = SimulationNoise(torch.Generator().manual_seed(1)).release(
        torch.zeros(4, 3), mechanism="twice_laplace", scale=twice.scale)
    assert torch.equal(released, expected)
    assert calibrate_noise("twice_laplace", epsilon=1.0, sensitivity=0.5)["noise_scale"] == 1.0
    assert clipped_release(clipping="l1", clip=0.25, dimension=3, epsilon=1.0,
                           mechanism="twice_laplace").scale == 1.0


def test_a_clipped_release_refuses_a_mechanism_of_another_norm():
    with pytest.raises(ConfigError, match="'mechanism'.*L1 norm"):
        clipped_release(clipping="l1", clip=1.0, dimension=2, epsilon=1.0, delta=1e-5,
                        mechanism="gaussian")
