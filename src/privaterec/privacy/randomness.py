"""Every random draw of a client round, from a seeded generator or from a deployed source.

A client's round draws samples, candidates, padding, labels and noise. In simulation these
come from its seeded ``torch.Generator`` (:func:`~privaterec.fed.rng.client_generator`), so
both engines draw the same numbers; on a real device (a Flower SuperNode holding a user's
data) they must come from the operating system's CSPRNG and the noise must be float-safe
(docs/serving.md#randomness-on-devices). The functions below take one
:class:`~privaterec.privacy.samplers.NoiseSource`:

* a :class:`~privaterec.privacy.samplers.SimulationNoise` wrapping the seeded generator:
  exactly the torch calls the simulation always made, bit for bit;
* a :class:`~privaterec.privacy.samplers.SecureNoise`: CSPRNG uniforms and integers, and
  float-safe Laplace/Gaussian releases.

The split is explicit: :func:`is_secure` says which path a draw takes.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from privaterec.privacy.calibrate import Calibration
from privaterec.privacy.mechanisms import add_noise, apply_clip
from privaterec.privacy.samplers import NoiseSource, SimulationNoise


def _generator(source: NoiseSource) -> torch.Generator | None:
    """The one seeded generator of a :class:`SimulationNoise`; ``None`` for a secure source."""
    if not isinstance(source, NoiseSource):
        raise TypeError(f"expected a NoiseSource, got {type(source).__name__}: wrap a seeded "
                        f"torch.Generator in SimulationNoise (simulation only), or use "
                        f"SecureNoise on a device")
    if not isinstance(source, SimulationNoise):
        return None
    if not isinstance(source.generator, torch.Generator):
        raise TypeError(f"{source!r} holds one generator per row; a client's draws take one")
    return source.generator


def _seeded(source: NoiseSource) -> torch.Generator:
    g = _generator(source)
    if g is None:
        raise TypeError(f"{source!r} is a secure source: it has no seeded generator")
    return g


def is_secure(source: NoiseSource) -> bool:
    """Whether draws from ``source`` are fit for a deployed release (OS CSPRNG, float-safe)."""
    return _generator(source) is None and source.secure


def rand(source: NoiseSource, shape: Sequence[int], *,
         dtype: torch.dtype = torch.float32) -> Tensor:
    """Uniforms in [0, 1) of ``shape`` (``torch.rand`` with the generator in simulation)."""
    g = _generator(source)
    if g is not None:
        return torch.rand(tuple(shape), generator=g, dtype=dtype)
    u = source.uniform(tuple(shape))  # float64 on 53 bits
    if dtype == torch.float64:
        return u
    # Keep as many bits as the dtype's significand holds, so the value stays < 1 after the
    # cast (float32: 24, bfloat16: 8, float16: 11).
    bits = {torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}[dtype]
    return (torch.floor(u * 2.0 ** bits) / 2.0 ** bits).to(dtype)


def randperm(source: NoiseSource, n: int) -> Tensor:
    """A uniform random permutation of ``range(n)`` (``LongTensor[n]``)."""
    g = _generator(source)
    if g is not None:
        return torch.randperm(n, generator=g)
    return torch.argsort(source.uniform((n,)))


def randint(source: NoiseSource, low: int, high: int, shape: Sequence[int]) -> Tensor:
    """Integers uniform in [low, high) of ``shape`` (int64)."""
    g = _generator(source)
    if g is not None:
        return torch.randint(low, high, tuple(shape), generator=g)
    return low + source.randint(high - low, tuple(shape))


def release_rows(x: Tensor, calibration: Calibration, sources: Sequence[NoiseSource]) -> Tensor:
    """Row i of ``x`` (e.g. ``[m, D]``, one client's update per row) clipped and noised as
    ``calibration`` says, its noise from ``sources[i]``.

    Seeded generators: one batched clip, then one
    :func:`~privaterec.privacy.mechanisms.add_noise` (row i's noise drawn from generator i,
    exactly the simulation's draws). Any secure source
    (a device): the clipped row is released by its source, float-safe.

    Raises
    ------
    ValueError
        If there is not one source per row.
    """
    if len(sources) != x.shape[0]:
        raise ValueError(f"need one generator per client: {len(sources)} for "
                         f"{x.shape[0]} updates")
    clipped = apply_clip(x, calibration)
    if not calibration.noisy:
        return clipped
    if not any(is_secure(s) for s in sources):
        return add_noise(clipped, calibration,
                         noise=SimulationNoise([_seeded(s) for s in sources]))
    if not calibration.event.is_private:
        return clipped
    return torch.stack([add_noise(row, calibration, noise=source)
                        for row, source in zip(clipped, sources)])


__all__ = ["is_secure", "rand", "randint", "randperm", "release_rows"]
