"""Randomness for releases: deployed (:class:`SecureNoise`) vs simulated (:class:`SimulationNoise`).

A release is only as private as its randomness. Two sources implement one abstract type
(:class:`NoiseSource`), and the split between them is explicit:

* :class:`SecureNoise` — for anything that leaves a real device (the serving SDK, a Flower
  ClientApp on a user's machine). Every bit comes from the operating system's CSPRNG, so no
  seed exists that a server could replay (a device seeded with
  ``torch.Generator().manual_seed(0)`` would draw noise the server could regenerate and subtract).
  Laplace and Gaussian releases are **float-safe**: they go through OpenDP's ``make_laplace``
  / ``make_gaussian`` on ``vector_domain(atom_domain(T=float))``, which round the input to a
  public grid of spacing 2^k and add discrete Laplace / discrete Gaussian noise on that grid
  (Canonne, Kamath & Steinke 2020), sampled exactly from cryptographically secure bits
  (OpenSSL's ``RAND_bytes``, which the PyPI wheel of OpenDP links). Every output is a
  multiple of 2^k whatever the input, so the low-order bits of the output cannot reveal the
  input as they do for textbook floating-point Laplace (Mironov, CCS 2012).
* :class:`SimulationNoise` — for simulation, experiments and tests only: fast seeded torch
  samplers (each mechanism's seeded sample, ``torch.rand``, ``torch.randint``) on one
  ``torch.Generator``, or one per row of a batch. Reproducible, hence not private against
  anyone who knows the seed, and not float-safe. Never use it for a deployed release.

Grid (the ``k`` of OpenDP): for a release of ``d`` coordinates at noise scale ``s`` (Laplace
b or Gaussian σ) the grid is 2^k with ``k = floor(log2(s / d)) − 40`` (:func:`grid_exponent`,
clamped to float64's smallest exponent −1074). Rounding the input to the grid can move
neighbouring inputs apart by at most d·2^k (L1) or √d·2^k (L2); OpenDP's privacy map counts
this, and with this grid it adds at most d·2^k/b ≤ 2^−40 ≈ 9.1e−13 to the ε of a Laplace
release (and less than that, relatively, to a Gaussian release's ρ) — far below the ledger's
precision; the tests check it against OpenDP's map. The grid is public (a function of the
scale and the dimension only). The cost of a release does not depend on ``k`` (measured:
``benchmarks/device_noise_cost.py``).

Interface (both sources): ``release(x, *, mechanism, scale)`` (``release_laplace(x, *,
scale)``, ``release_gaussian(x, *, sigma)``) returns the released value x + noise (it takes
the value so that the float-safe mechanism sees the input: it rounds x itself);
``draw(shape, *, mechanism, scale)`` returns the noise alone (the release of zeros);
``uniform(shape, dtype=float64)`` returns uniforms in [0, 1) (padding, candidate draws);
``randint(high, shape)`` returns int64 in [0, high); ``permutation(n)`` a random order of
``range(n)``.
Releases are elementwise: each coordinate of ``x`` gets independent noise, so a batch
``x[m, D]`` is m independent releases. The mechanisms do not clip: clip first so that the
sensitivity you account for holds.
"""

from __future__ import annotations

import math
import os
import secrets
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any, Callable, ClassVar, Sequence

import numpy as np
import torch
from torch import Tensor

from privaterec.errors import ConfigError
from privaterec.privacy.noise import noise_mechanism

GRID_MARGIN_BITS = 40
"""The grid is 2^−40 times finer than scale/d: rounding adds ≤ 2^−40 to a Laplace ε."""

MIN_GRID_EXPONENT = -1074
"""Smallest ``k`` (float64's smallest subnormal is 2^−1074)."""

SIMULATED_NOTE = ("SIMULATED release: seeded SimulationNoise, not a deployed device release "
                  "(the seed's holder can regenerate the noise)")
"""Note a device appends to its ledger events when it runs on :class:`SimulationNoise`."""

_CHUNK = 16_384  # coordinates per OpenDP call when a release is split across threads
_UNIFORM_BITS = 53


def _shape(shape: Sequence[int] | int) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in dims):
        raise ConfigError(f"invalid 'shape': got {shape!r}, expected non-negative ints")
    return dims


def _check_scale(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 <= value < math.inf:
        raise ConfigError(f"invalid noise parameter '{name}': got {value!r}, expected a finite "
                          f"number >= 0")
    return float(value)


def _check_high(high: int) -> int:
    if isinstance(high, bool) or not isinstance(high, int) or not 1 <= high <= 2 ** 62:
        raise ConfigError(f"invalid 'high': got {high!r}, expected an int in [1, 2**62]")
    return high


def grid_exponent(scale: float, dim: int) -> int:
    """``k`` of the public grid 2^k for a release of ``dim`` coordinates at noise ``scale``.

    ``k = floor(log2(scale / dim)) − 40`` (≥ −1074), so that rounding to the grid moves a
    Laplace release's ε by at most dim·2^k/scale ≤ 2^−40.

    Parameters
    ----------
    scale:
        Laplace b or Gaussian σ, > 0.
    dim:
        Number of coordinates released, ≥ 1.
    """
    if not 0 < scale < math.inf:
        raise ConfigError(f"invalid noise parameter 'scale': got {scale!r}, expected a finite "
                          f"number > 0")
    return max(MIN_GRID_EXPONENT, math.floor(math.log2(scale / max(1, dim))) - GRID_MARGIN_BITS)


class NoiseSource(ABC):
    """The one randomness type a mechanism takes (see the module docstring): its two kinds
    are :class:`SecureNoise` (deployed) and :class:`SimulationNoise` (seeded).

    ``secure`` is ``True`` only for sources fit for a deployed release (:class:`SecureNoise`).
    """

    secure: ClassVar[bool] = False

    @abstractmethod
    def release(self, x: Tensor, *, mechanism: str, scale: float | Tensor,
                name: str = "scale") -> Tensor:
        """``x`` + i.i.d. noise of ``mechanism`` (:mod:`privaterec.privacy.noise`) at
        ``scale`` per coordinate (same shape and dtype; ``name``: the scale's, in errors)."""

    def draw(self, shape: Sequence[int], *, mechanism: str, scale: float | Tensor,
             dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
             name: str = "scale") -> Tensor:
        """I.i.d. noise of ``mechanism`` at ``scale`` (a float ≥ 0, or a tensor broadcastable
        to ``shape``, e.g. per-client ``[n, 1]``) of ``shape``, ``dtype`` and ``device``: the
        release of zeros. To release a value, use :meth:`release` (float-safe on a device)."""
        return self.release(torch.zeros(tuple(shape), dtype=dtype, device=device),
                            mechanism=mechanism, scale=scale, name=name)

    def release_laplace(self, x: Tensor, *, scale: float | Tensor) -> Tensor:
        """``x`` + i.i.d. Laplace(0, ``scale``) per coordinate (same shape and dtype)."""
        return self.release(x, mechanism="laplace", scale=scale)

    def release_gaussian(self, x: Tensor, *, sigma: float | Tensor) -> Tensor:
        """``x`` + i.i.d. N(0, ``sigma``²) per coordinate (same shape and dtype)."""
        return self.release(x, mechanism="gaussian", scale=sigma, name="sigma")

    @abstractmethod
    def uniform(self, shape: Sequence[int], dtype: torch.dtype = torch.float64) -> Tensor:
        """Uniforms in [0, 1) of ``shape`` and ``dtype`` (a float type)."""

    @abstractmethod
    def randint(self, high: int, shape: Sequence[int]) -> Tensor:
        """Int64 uniform in [0, ``high``) of ``shape``."""

    def permutation(self, n: int) -> Tensor:
        """A uniformly random permutation of ``range(n)`` (``LongTensor[n]``): the order of
        ``n`` float64 uniforms."""
        return torch.argsort(self.uniform((n,)))


class SimulationNoise(NoiseSource):
    """Seeded torch randomness, for simulation and tests only (NOT for a deployed release).

    Draws a mechanism's seeded unit sample (float64, scaled, then cast), ``torch.rand``,
    ``torch.randint`` and ``torch.randperm`` with ``generator``. Anyone who knows the seed can
    regenerate every draw, and the float samplers are not float-safe (Mironov 2012).

    Parameters
    ----------
    generator:
        The seeded ``torch.Generator``, or one per row of a batch of releases: row i of every
        draw (``shape[0]`` rows) comes from generator i, so a client's noise comes from its
        own generator whichever engine batches it.
    """

    def __init__(self, generator: torch.Generator | Sequence[torch.Generator]) -> None:
        rows = (generator,) if isinstance(generator, torch.Generator) else \
            tuple(generator) if isinstance(generator, Sequence) else ()
        if not rows or not all(isinstance(g, torch.Generator) for g in rows):
            raise ConfigError(f"SimulationNoise needs a torch.Generator or a sequence of them, "
                              f"got {type(generator).__name__}")
        self.generator = generator if isinstance(generator, torch.Generator) else rows
        self._device = rows[0].device  # where the draws are made unless told otherwise

    def __repr__(self) -> str:
        return "SimulationNoise(<seeded torch.Generator>)"

    def _rows(self, shape: Sequence[int],
              draw: Callable[[Sequence[int], torch.Generator], Tensor]) -> Tensor:
        """``draw(shape, generator)``, or with one generator per row, row i =
        ``draw(shape[1:], generator i)``."""
        if isinstance(self.generator, torch.Generator):
            return draw(shape, self.generator)
        if len(shape) < 1 or shape[0] != len(self.generator):
            raise ConfigError(f"one generator per row: got {len(self.generator)} generators "
                              f"for shape {tuple(shape)}")
        return torch.stack([draw(tuple(shape[1:]), g) for g in self.generator])

    def draw(self, shape: Sequence[int], *, mechanism: str, scale: float | Tensor,
             dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
             name: str = "scale") -> Tensor:
        """``scale`` × the mechanism's seeded unit sample (float64, then cast to ``dtype``),
        on ``device`` (default: the generators'); zeros for a scale of 0."""
        sample = noise_mechanism(mechanism)._sample
        if isinstance(scale, Tensor):
            if bool((scale < 0).any()) or not bool(torch.isfinite(scale).all()):
                raise ConfigError(f"invalid noise parameter '{name}': expected finite values "
                                  f">= 0")
        elif not (0 <= scale < math.inf):
            raise ConfigError(f"invalid noise parameter '{name}': got {scale!r}, expected a "
                              f"finite number >= 0")
        where = self._device if device is None else torch.device(device)
        if not isinstance(scale, Tensor) and scale == 0:
            return torch.zeros(tuple(shape), dtype=dtype, device=where)
        if isinstance(scale, Tensor):
            scale = scale.to(device=where, dtype=torch.float64)
        return (self._rows(shape, lambda s, g: sample(s, g, where)) * scale).to(dtype)

    def release(self, x: Tensor, *, mechanism: str, scale: float | Tensor,
                name: str = "scale") -> Tensor:
        """``x`` + :meth:`draw` of ``x.shape`` in ``x.dtype``, drawn on the generators' device
        and moved to ``x``'s (the same numbers wherever ``x`` lives, docs/gpu.md)."""
        return x + self.draw(x.shape, mechanism=mechanism, scale=scale, dtype=x.dtype,
                             name=name).to(x.device)

    def uniform(self, shape: Sequence[int], dtype: torch.dtype = torch.float64) -> Tensor:
        """``torch.rand(shape, generator=..., dtype=dtype)`` (per row with several)."""
        return self._rows(_shape(shape), lambda s, g: torch.rand(s, generator=g, dtype=dtype))

    def randint(self, high: int, shape: Sequence[int]) -> Tensor:
        """``torch.randint(0, high, shape, generator=...)`` (int64; per row with several)."""
        high = _check_high(high)
        return self._rows(_shape(shape), lambda s, g: torch.randint(0, high, s, generator=g))

    def permutation(self, n: int) -> Tensor:
        """``torch.randperm(n, generator=...)`` (one generator)."""
        if not isinstance(self.generator, torch.Generator):
            raise ConfigError("a permutation draws from one generator, not one per row")
        return torch.randperm(n, generator=self.generator)


def _pass_gradient(x: Tensor, released: Tensor) -> Tensor:
    """``released`` with the gradient of x + noise w.r.t. ``x``; its value is unchanged.

    ``x − x.detach()`` is exactly 0 in value, so adding it keeps every output on the grid.
    """
    if not (isinstance(x, Tensor) and x.requires_grad):
        return released
    return released + (x - x.detach())


@lru_cache(maxsize=1)
def _opendp() -> Any:
    try:
        import opendp.prelude as dp
    except ImportError:  # pragma: no cover - opendp is a core dependency
        raise ConfigError("SecureNoise needs the 'opendp' package (pip install 'opendp>=0.16')"
                          ) from None
    dp.enable_features("contrib")  # make_laplace / make_gaussian are in OpenDP's contrib set
    return dp


@lru_cache(maxsize=256)
def _measurement(kind: str, size: int, scale: float, k: int) -> Any:
    """OpenDP's float-safe measurement of mechanism ``kind`` on ``size`` coordinates."""
    return noise_mechanism(kind).measurement(_opendp(), size, scale=scale, k=k)


class SecureNoise(NoiseSource):
    """Randomness for deployed releases: the OS CSPRNG and float-safe samplers.

    Laplace/Gaussian releases are OpenDP's ``make_laplace`` / ``make_gaussian`` on float
    vectors (discrete noise on the public grid 2^k of :func:`grid_exponent`, CSPRNG bits);
    uniforms are 53 random bits from :func:`secrets.token_bytes` per float; integers are
    rejection-sampled from random bits (unbiased). Nothing is seeded: two instances, or one
    instance after a restart, never replay a stream.

    Parameters
    ----------
    workers:
        Threads a long release is split over (OpenDP releases the GIL; each coordinate is an
        independent release, so splitting changes nothing but the wall time). Default:
        ``min(4, os.cpu_count())``.
    """

    secure = True

    def __init__(self, *, workers: int | None = None) -> None:
        if workers is None:
            workers = max(1, min(4, os.cpu_count() or 1))
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"invalid 'workers': got {workers!r}, expected an int >= 1")
        self.workers = workers

    def __repr__(self) -> str:
        return f"SecureNoise(workers={self.workers})"

    # -- float-safe releases ------------------------------------------------------------
    def _release(self, kind: str, x: Tensor, scale: float | Tensor, name: str) -> Tensor:
        if not isinstance(x, Tensor):
            raise ConfigError(f"release_{kind} needs a Tensor, got {type(x).__name__}")
        if isinstance(scale, Tensor):
            return self._release_per_scale(kind, x, scale, name)
        scale = _check_scale(scale, name)
        if scale == 0 or x.numel() == 0:
            return x.clone()
        values = x.detach().to(device="cpu", dtype=torch.float64).reshape(-1).numpy()
        if not np.isfinite(values).all():
            raise ConfigError(f"release_{kind}: the value to release has non-finite entries "
                              f"(NaN or inf); clip it to a finite range first")
        k = grid_exponent(scale, values.size)
        chunks = [values] if values.size <= _CHUNK or self.workers == 1 else \
            np.array_split(values, math.ceil(values.size / _CHUNK))

        def run(chunk: np.ndarray) -> list[float]:
            return _measurement(kind, int(chunk.size), scale, k)(chunk.tolist())

        if len(chunks) == 1:
            out = run(chunks[0])
        else:
            with ThreadPoolExecutor(min(self.workers, len(chunks))) as pool:
                out = [v for part in pool.map(run, chunks) for v in part]
        released = torch.tensor(out, dtype=torch.float64).reshape(x.shape)
        return released.to(device=x.device, dtype=x.dtype)

    def _release_per_scale(self, kind: str, x: Tensor, scale: Tensor, name: str) -> Tensor:
        """Coordinates grouped by their scale (e.g. per-client ``[n, 1]``), one release each."""
        try:
            scales = scale.detach().to(device="cpu", dtype=torch.float64).expand(x.shape)
        except RuntimeError:
            raise ConfigError(f"'{name}' of shape {tuple(scale.shape)} does not broadcast to "
                              f"the released shape {tuple(x.shape)}") from None
        out = x.detach().clone()
        flat_x, flat_s, flat_out = out.reshape(-1).clone(), scales.reshape(-1), out.view(-1)
        for value in torch.unique(flat_s).tolist():
            where = (flat_s == value).nonzero().squeeze(-1).to(x.device)
            flat_out[where] = self._release(kind, flat_x[where], float(value), name)
        return out

    def release(self, x: Tensor, *, mechanism: str, scale: float | Tensor,
                name: str = "scale") -> Tensor:
        """The released value of ``x`` with the noise of ``mechanism`` per coordinate,
        float-safe: OpenDP's measurement (e.g. discrete Laplace, or the discrete Gaussian,
        which at this resolution has the continuous Gaussian's privacy up to OpenDP's
        rounding term; Canonne, Kamath & Steinke 2020).

        Parameters
        ----------
        x:
            Any shape, finite values (clipped by the caller to its sensitivity).
        mechanism:
            A noise mechanism's name (:mod:`privaterec.privacy.noise`).
        scale:
            Its scale ≥ 0 (0: ``x`` returned unchanged), or a tensor broadcastable to ``x``
            (e.g. per-client ``[n, 1]``): the coordinates of each distinct scale are one
            release, on the grid of their own count.
        name:
            The scale's name in error messages.

        The released value carries the gradient of ``x`` (d/dx = identity, as for
        ``x + noise``) while its value stays exactly OpenDP's output.

        Returns
        -------
        Tensor
            Shape and dtype of ``x``: OpenDP's output (a multiple of 2^k,
            k = :func:`grid_exponent` (scale, x.numel())), cast to ``x.dtype``
            (post-processing).
        """
        noise_mechanism(mechanism)
        return _pass_gradient(x, self._release(mechanism, x, scale, name))

    # -- uniforms and integers ---------------------------------------------------------
    def uniform(self, shape: Sequence[int], dtype: torch.dtype = torch.float64) -> Tensor:
        """Uniforms in [0, 1): j·2^−53 with j uniform on 53 CSPRNG bits, in float64; in a
        narrower ``dtype``, rounded down to as many bits as its significand holds (float32:
        24, float16: 11, bfloat16: 8), so that the value stays < 1 after the cast."""
        dims = _shape(shape)
        n = math.prod(dims)
        bits = np.frombuffer(secrets.token_bytes(8 * n), dtype=np.uint64) >> np.uint64(11)
        u = torch.from_numpy(bits.astype(np.float64) * 2.0 ** -_UNIFORM_BITS).reshape(dims)
        if dtype == torch.float64:
            return u
        kept = {torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}[dtype]
        return (torch.floor(u * 2.0 ** kept) / 2.0 ** kept).to(dtype)

    def randint(self, high: int, shape: Sequence[int]) -> Tensor:
        """Int64 uniform in [0, ``high``): rejection sampling of ⌈log2 high⌉-bit integers."""
        high = _check_high(high)
        dims = _shape(shape)
        n = math.prod(dims)
        mask = np.uint64((1 << max(1, (high - 1).bit_length())) - 1)
        out = np.empty(0, dtype=np.uint64)
        while out.size < n:  # each draw is accepted with probability > 1/2
            need = 2 * (n - out.size) + 8
            draws = np.frombuffer(secrets.token_bytes(8 * need), dtype=np.uint64) & mask
            out = np.concatenate([out, draws[draws < np.uint64(high)]])
        return torch.from_numpy(out[:n].astype(np.int64)).reshape(dims)


def laplace_release_epsilon(*, sensitivity_l1: float, scale: float, dim: int) -> float:
    """ε of :meth:`SecureNoise.release_laplace` per OpenDP's privacy map (rounding included).

    Parameters
    ----------
    sensitivity_l1:
        Δ₁ of the released vector.
    scale, dim:
        The release's b and number of coordinates.
    """
    scale = _check_scale(scale, "scale")
    return float(_measurement("laplace", dim, scale, grid_exponent(scale, dim))
                 .map(float(sensitivity_l1)))


def gaussian_release_rho(*, sensitivity_l2: float, sigma: float, dim: int) -> float:
    """ρ (zero-concentrated DP) of :meth:`SecureNoise.release_gaussian` per OpenDP's map."""
    sigma = _check_scale(sigma, "sigma")
    return float(_measurement("gaussian", dim, sigma, grid_exponent(sigma, dim))
                 .map(float(sensitivity_l2)))


__all__ = ["GRID_MARGIN_BITS", "MIN_GRID_EXPONENT", "NoiseSource", "SIMULATED_NOTE",
           "SecureNoise", "SimulationNoise", "gaussian_release_rho", "grid_exponent",
           "laplace_release_epsilon"]
