"""Where every random number of a federated run comes from.

Randomness is a pure function of (seed, round, client): the server's draws of round t come
from :func:`round_noise`, client u's draws in round t from :func:`client_noise`, each a
:class:`~privaterec.privacy.samplers.SimulationNoise` of its own seeded stream. A run
resumed from a checkpoint at round t therefore continues with exactly the streams of an
uninterrupted run, and the in-process simulator and the Flower engine draw the same numbers.
In a real deployment a device draws nothing from these: it uses
:class:`~privaterec.privacy.samplers.SecureNoise` (OS CSPRNG, float-safe noise), so the
server cannot know a client's noise (the Flower ClientApp does so on a node holding a real
user, node option ``user-id``).
"""

from __future__ import annotations

import numpy as np
import torch

from privaterec.privacy.samplers import SimulationNoise

_SERVER, _CLIENT, _CENTRAL_NOISE, _EVAL_SAMPLE, _EVAL_CLIENT = 0, 1, 2, 3, 4


def _derived_seed(*words: int) -> int:
    """A 63-bit seed mixing ``words`` (numpy SeedSequence hashing; no correlations)."""
    state = np.random.SeedSequence([int(w) for w in words]).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))


def _stream(*words: int) -> SimulationNoise:
    """The seeded source of the stream named by ``words`` (simulation only)."""
    return SimulationNoise(torch.Generator().manual_seed(_derived_seed(*words)))


def round_noise(seed: int, round_index: int) -> SimulationNoise:
    """The server's source of round ``round_index`` (client sampling)."""
    return _stream(seed, _SERVER, round_index)


def client_noise(seed: int, round_index: int, client: int) -> SimulationNoise:
    """Client ``client``'s source in round ``round_index`` (samples, negatives, noise)."""
    return _stream(seed, _CLIENT, round_index, client)


def aggregator_noise(seed: int, round_index: int) -> SimulationNoise:
    """The aggregator's source of round ``round_index`` in a simulated central-DP run (the
    noise on the sum). Simulation only: a deployed aggregator draws from the OS CSPRNG."""
    return _stream(seed, _CENTRAL_NOISE, round_index)


def evaluation_noise(seed: int, round_index: int) -> SimulationNoise:
    """The server's source of the federated evaluation after round ``round_index`` (who is
    asked), apart from the training rounds' streams. Simulation only."""
    return _stream(seed, _EVAL_SAMPLE, round_index)


def evaluation_client_noise(seed: int, round_index: int, client: int) -> SimulationNoise:
    """Client ``client``'s source in the federated evaluation after round ``round_index``
    (its release's noise). Simulation only."""
    return _stream(seed, _EVAL_CLIENT, round_index, client)
