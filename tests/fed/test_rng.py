"""Randomness of a federated run is a pure function of (seed, round, client)."""

from __future__ import annotations

import numpy as np
import torch

from privaterec.fed.rng import client_noise, round_noise
from privaterec.privacy.samplers import SimulationNoise


def _draw(source: SimulationNoise) -> torch.Tensor:
    return source.uniform((8,), dtype=torch.float32)


def _seed(source: SimulationNoise) -> int:
    assert isinstance(source.generator, torch.Generator)
    return source.generator.initial_seed()


def test_same_coordinates_same_stream():
    assert torch.equal(_draw(round_noise(3, 5)), _draw(round_noise(3, 5)))
    assert torch.equal(_draw(client_noise(3, 5, 17)), _draw(client_noise(3, 5, 17)))


def test_every_coordinate_changes_the_stream():
    base = _draw(client_noise(3, 5, 17))
    for other in (client_noise(4, 5, 17), client_noise(3, 6, 17),
                  client_noise(3, 5, 18), round_noise(3, 5)):
        assert not torch.equal(_draw(other), base)
    assert not torch.equal(_draw(round_noise(3, 5)), _draw(round_noise(3, 6)))
    assert not torch.equal(_draw(round_noise(3, 5)), _draw(round_noise(4, 5)))


def test_seeds_are_distinct_over_many_coordinates():
    seeds = {_seed(client_noise(0, t, u)) for t in range(20) for u in range(50)}
    seeds |= {_seed(round_noise(0, t)) for t in range(20)}
    assert len(seeds) == 20 * 50 + 20
    assert all(0 <= s < 2 ** 63 for s in seeds)


def test_seeds_mix_the_coordinates_with_seed_sequence():
    # Independent check of the derivation: numpy's SeedSequence hash of the words
    # (seed, stream, round[, client]) with stream 0 = server, 1 = client.
    state = np.random.SeedSequence([11, 1, 2, 7]).generate_state(2, dtype=np.uint32)
    assert _seed(client_noise(11, 2, 7)) == (int(state[0]) << 31) ^ int(state[1])
    state = np.random.SeedSequence([11, 0, 2]).generate_state(2, dtype=np.uint32)
    assert _seed(round_noise(11, 2)) == (int(state[0]) << 31) ^ int(state[1])


def test_streams_do_not_touch_the_global_generator():
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    _draw(client_noise(0, 0, 0))
    _draw(round_noise(0, 0))
    assert torch.equal(torch.rand(4), expected)
