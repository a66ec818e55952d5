"""The serving modes and the device-side release of one query (PrivateRec Alg. 1-2, §3.2.1).

What a device computes and sends for one recommendation query, shared by the device SDK
(:mod:`privaterec.serving.device`) and the offline evaluation that simulates the devices
(:mod:`privaterec.eval.serving`):

* :data:`SERVING_MODES` — every serving mode, declared once as a :class:`ServingMode`: the
  CLI's ``--serving`` and ``--recall`` choices, :class:`ServingConfig`'s checks, the offline
  evaluation, the device SDK and the server's query endpoints all read it
  (docs/architecture.md, "How to add a serving mode");
* :class:`ServingConfig` — a mode and its parameters (ε_s, δ_s, padding p, mechanism);
* :func:`serving_event` — the privacy event of one query under a configuration;
* :func:`dpa_release` — Alg. 2 on a batch of clicked-news vectors: pad each clicked news to
  r₀ with probability p, u = Θ_U(history), α = attention(u), α̃ = normalised α + DPA
  noise at the amplified budget (true simplex sensitivity); the server computes
  ũ = Σ α̃ᵢ bᵢ (Alg. 1 line 3);
* :func:`vdp_user_release` — VDP (§3.2.1) on a batch of user vectors: each clipped to θ
  plus noise with Δ = 2θ.

A release draws from one :class:`~privaterec.privacy.samplers.NoiseSource`: a device's
``SecureNoise`` or a simulation's ``SimulationNoise(generator)``. ε_s = ∞ means no noise (and
no padding: padding only buys amplification). Every query is one release.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from privaterec.config import SENSITIVITY_MODES, NoiseKind, SensitivityMode, _check, _check_choice
from privaterec.errors import ConfigError
from privaterec.models.recommender import Recommender
from privaterec.privacy.calibrate import Calibration, no_noise
from privaterec.privacy.dpa import (dpa_calibration, relu_normalize, simplex_project,
                                    softplus_normalize, vdp_calibration)
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.mechanisms import add_noise, clip_and_noise
from privaterec.privacy.noise import noise_mechanism
from privaterec.privacy.samplers import NoiseSource, SimulationNoise

LOCAL_NOTE = ("local ranking: the device ranks the downloaded pool itself; nothing "
              "user-dependent is sent (the server sees only that the device synced the pool)")


Normalization = Literal["softplus", "relu", "simplex"]
NORMALIZATIONS: tuple[Normalization, ...] = get_args(Normalization)
_NORMALIZERS = {"softplus": softplus_normalize, "relu": relu_normalize,
                "simplex": simplex_project}


class ServingMode:
    """One serving mode, an object of a subclass listed in :data:`SERVING_MODES`.

    Declared by its class attributes: ``name`` (the ``--serving`` value) and ``help``;
    ``sends``, what one query sends (``""``: nothing); the server's ``endpoint`` and the JSON
    ``field`` of the release (``""``: no request per query); ``score_space``, the server's
    score space it is scored in (``""``: the d-dim news vectors); whether the release lies on
    the ``simplex``, ``needs_basis`` (basic vectors), is ``padded`` (padding p),
    ``takes_epsilon`` (``False``: nothing sent, ε_s = 0) or is ranked ``on_device``;
    ``cache_params``, the release-cache keys and the :class:`ServingConfig` fields they hold.
    Its accounting is :meth:`calibration` (the event of one query, with its adjacency).
    """

    name = help = sends = endpoint = field = score_space = ""
    simplex = needs_basis = padded = on_device = False
    takes_epsilon = True
    cache_params: tuple[tuple[str, str], ...] = ()

    def calibration(self, config: ServingConfig, *, basis_size: int, dim: int) -> Calibration:
        """How one query is released under ``config``: its noise and its privacy event."""
        raise NotImplementedError

    def width(self, *, basis_size: int, dim: int) -> int:
        """Floats one query sends: d unless the mode says otherwise."""
        return dim

    def release(self, model: Recommender, anonymous: torch.Tensor, vectors: torch.Tensor,
                mask: torch.Tensor, config: ServingConfig, source: NoiseSource) -> torch.Tensor:
        """The device's release ``Tensor[m, width]`` of a batch of histories (``vectors
        [m, H, d]``, ``mask [m, H]``; ``anonymous``: r₀ ``[d]``), every draw from ``source``."""
        raise ConfigError(f"{self.name} serving sends nothing per query: {self.help}")

    def server_user(self, model: Recommender, released: torch.Tensor) -> torch.Tensor:
        """The user vector ``Tensor[m, d]`` the server scores with a release ``[m, width]``."""
        return released


class NoServing(ServingMode):
    name = "none"
    help = "the model's user vector, sent in the clear (not private)"
    sends = "u [d], in the clear"

    def calibration(self, config: ServingConfig, *, basis_size: int, dim: int) -> Calibration:
        return no_noise(phase="serve", dimension=max(1, dim),
                        note="user vector sent in the clear")

    def release(self, model: Recommender, anonymous: torch.Tensor, vectors: torch.Tensor,
                mask: torch.Tensor, config: ServingConfig, source: NoiseSource) -> torch.Tensor:
        return model.encode_user(vectors, mask)


class PrivateRecServing(ServingMode):
    name = "privaterec"
    help = ("PrivateRec Alg. 1-2: alpha over the basic vectors with padding and DPA noise "
            "at --epsilon-serve")
    sends = "α̃ [B] on the simplex"
    endpoint, field, score_space = "/v1/recommend/privaterec", "alpha", "privaterec"
    simplex = needs_basis = padded = True
    cache_params = (("epsilon", "epsilon"), ("delta", "delta"), ("padding_p", "padding_p"),
                    ("mechanism", "mechanism"), ("normalization", "normalization"))

    def calibration(self, config: ServingConfig, *, basis_size: int, dim: int) -> Calibration:
        return dpa_calibration(epsilon=config.epsilon, delta=config.delta,
                               padding_p=config.effective_padding, mechanism=config.mechanism,
                               sensitivity=config.sensitivity_mode, phase="serve",
                               dimension=max(1, basis_size))

    def width(self, *, basis_size: int, dim: int) -> int:
        return basis_size

    def release(self, model: Recommender, anonymous: torch.Tensor, vectors: torch.Tensor,
                mask: torch.Tensor, config: ServingConfig, source: NoiseSource) -> torch.Tensor:
        return dpa_release(model, anonymous, vectors, mask, config, noise=source).released

    def server_user(self, model: Recommender, released: torch.Tensor) -> torch.Tensor:
        assert model.basis is not None
        return model.basis.reconstruct(released)


class VDPServing(ServingMode):
    name = "vdp"
    help = "PrivateRec §3.2.1's baseline: the user vector clipped to --vdp-clip, plus noise"
    sends = "u [d], clipped to θ, plus noise"
    endpoint, field = "/v1/recommend/vdp", "embedding"
    cache_params = (("epsilon", "epsilon"), ("delta", "delta"), ("clip", "vdp_clip"),
                    ("mechanism", "mechanism"))

    def calibration(self, config: ServingConfig, *, basis_size: int, dim: int) -> Calibration:
        return vdp_calibration(clip=config.vdp_clip, epsilon=config.epsilon,
                               delta=config.delta, mechanism=config.mechanism,
                               dimension=max(1, dim), phase="serve")

    def release(self, model: Recommender, anonymous: torch.Tensor, vectors: torch.Tensor,
                mask: torch.Tensor, config: ServingConfig, source: NoiseSource) -> torch.Tensor:
        return vdp_user_release(model.encode_user(vectors, mask), config, noise=source)


class LocalServing(ServingMode):
    name = "local"
    help = ("local ranking: the device ranks the downloaded score matrix itself and sends "
            "nothing (epsilon_s = 0)")
    takes_epsilon, on_device = False, True

    def calibration(self, config: ServingConfig, *, basis_size: int, dim: int) -> Calibration:
        return no_noise(epsilon=0.0, phase="serve", note=LOCAL_NOTE)


SERVING_MODES: dict[str, ServingMode] = {m.name: m for m in (
    NoServing(), PrivateRecServing(), VDPServing(), LocalServing())}
"""Name → serving mode: the one declaration of the serving modes."""

SERVING_KINDS: tuple[str, ...] = tuple(SERVING_MODES)
"""The modes' names: the choices of ``--serving``."""

QUERY_MODES: tuple[str, ...] = tuple(n for n, m in SERVING_MODES.items() if m.endpoint)
"""The modes whose release the server searches, one request per query (``--recall`` too)."""


@dataclass(frozen=True)
class ServingConfig:
    """How a device releases its user representation per query.

    Attributes
    ----------
    kind: a mode of :data:`SERVING_MODES`: ``none``, ``privaterec``, ``vdp`` or ``local``.
    epsilon: ε_s of one query (``inf``: no noise; ``local`` takes no ε).
    delta: δ_s (0 with Laplace; in (0, 1) with Gaussian).
    padding_p: PrivateRec's padding probability p (ignored by ``vdp`` and ``none``).
    mechanism: ``laplace`` or ``gaussian``.
    sensitivity_mode: DPA's ``true`` or ``paper`` (invalid, reproduction only) sensitivity.
    vdp_clip: VDP's clipping norm θ (the paper's serving baseline uses 0.001).
    seed: seed of the evaluation's generator (the simulated devices' randomness).
    normalization: how the device maps the noised α + n back to the simplex: ``softplus``
        (Alg. 2 line 10, the default), ``relu`` (the guarded ReLU normalisation that
        training uses, §3.3) or ``simplex`` (the Euclidean projection onto the simplex,
        :func:`~privaterec.privacy.dpa.simplex_project`). All are post-processing: the
        guarantee is the same.
    """

    kind: str = "none"
    epsilon: float = math.inf
    delta: float = 0.0
    padding_p: float = 0.5
    mechanism: NoiseKind = "laplace"
    sensitivity_mode: SensitivityMode = "true"
    vdp_clip: float = 0.001
    seed: int = 0
    normalization: Normalization = "softplus"

    def __post_init__(self) -> None:
        _check_choice(self.kind, "serving", SERVING_KINDS)
        mode = self.mode
        noise = noise_mechanism(self.mechanism, "serving mechanism")
        _check_choice(self.sensitivity_mode, "sensitivity_mode", SENSITIVITY_MODES)
        _check_choice(self.normalization, "serving normalization", NORMALIZATIONS)
        _check(self.epsilon > 0, "epsilon_serve", f"got {self.epsilon!r}, expected > 0")
        _check(mode.takes_epsilon or math.isinf(self.epsilon), "epsilon_serve",
               f"got {self.epsilon!r}; {mode.help}, adding no noise: drop --epsilon-serve")
        _check(0 <= self.padding_p < 1, "padding_p",
               f"got {self.padding_p!r}, expected a probability 0 <= p < 1")
        _check(0 < self.vdp_clip < math.inf, "vdp_clip",
               f"got {self.vdp_clip!r}, expected a finite number > 0")
        if noise.pure:
            _check(self.delta == 0, "delta_serve",
                   f"got {self.delta!r}; {self.mechanism} is pure DP: use 0 or --noise gaussian")
        else:
            _check(0 < self.delta < 1, "delta_serve",
                   f"got {self.delta!r}, expected 0 < delta < 1 for the {self.mechanism} "
                   f"mechanism")

    @property
    def mode(self) -> ServingMode:
        """The serving mode ``kind`` names."""
        return SERVING_MODES[self.kind]

    @property
    def effective_padding(self) -> float:
        """p actually applied: 0 unless a padded mode (PrivateRec) with finite ε_s."""
        if not self.mode.padded or math.isinf(self.epsilon):
            return 0.0
        return self.padding_p


@functools.lru_cache(maxsize=32)
def serving_calibration(config: ServingConfig, *, basis_size: int, dim: int) -> Calibration:
    """How one query is released under ``config`` (its noise and event), calibrated once per
    configuration (cached).

    ``basis_size``: B (``privaterec``); ``dim``: d, the size of the user vector.
    """
    return config.mode.calibration(config, basis_size=basis_size, dim=dim)


def serving_event(config: ServingConfig, *, basis_size: int, dim: int) -> PrivacyEvent:
    """The privacy event of one query under ``config`` (:func:`serving_calibration`)."""
    return serving_calibration(config, basis_size=basis_size, dim=dim).event


@dataclass(frozen=True)
class DpaRelease:
    """One batch of PrivateRec releases (Alg. 2), with its intermediate values.

    Attributes
    ----------
    alpha: ``Tensor[m, B]`` α = attention(u) of the padded histories (never released).
    noise: ``Tensor[m, B]`` the DPA noise n added before normalisation.
    released: ``Tensor[m, B]`` α̃ = normalise(α + n) (α itself when ε = ∞).
    padded: ``BoolTensor[m, H]`` positions replaced by r₀.
    event: the :class:`PrivacyEvent` of ONE row's release.
    """

    alpha: torch.Tensor
    noise: torch.Tensor
    released: torch.Tensor
    padded: torch.Tensor
    event: PrivacyEvent


@torch.no_grad()
def dpa_release(model: Recommender, anonymous: torch.Tensor, vectors: torch.Tensor,
                mask: torch.Tensor, config: ServingConfig, *, noise: NoiseSource) -> DpaRelease:
    """PrivateRec Alg. 2 on clicked-news vectors: padding, α, DPA noise, normalisation.

    The device computation of one query batch, shared by the offline evaluation
    (:func:`~privaterec.eval.serving.private_user_encoder`, whose output is
    ``basis.reconstruct(released)``) and the device SDK
    (:class:`privaterec.serving.device.PrivateRecDevice`): the same random draws in the same
    order (padding first, then the noise), so both agree exactly for the same source state.

    Parameters
    ----------
    model:
        A recommender with basic vectors (``model.basis``), in eval mode.
    anonymous:
        ``Tensor[d]`` r₀ = Θ_N(all-padding news), row 0 of every news table.
    vectors:
        ``Tensor[m, H, d]`` clicked-news vectors (right-aligned histories).
    mask:
        ``BoolTensor[m, H]`` real clicks.
    config:
        ``ServingConfig(kind="privaterec", epsilon=ε_s, delta, padding_p, mechanism,
        normalization)``; its sensitivity mode must be ``"true"`` on a device.
    noise:
        Every draw's source (padding first, then the noise): ``SecureNoise()`` on a device
        (OS CSPRNG, float-safe release of α + n), ``SimulationNoise(generator)`` in a
        simulation (:mod:`privaterec.privacy.samplers`).

    Returns
    -------
    :class:`DpaRelease`.

    Raises
    ------
    ConfigError
        The model has no basic vectors, or ``config`` is not a ``privaterec`` configuration.
    """
    if config.kind != "privaterec":
        raise ConfigError(f"dpa_release needs ServingConfig(kind='privaterec'), got "
                          f"kind={config.kind!r}")
    basis = model.basis
    if basis is None:
        raise ConfigError("this model has no basic vectors; train with --method privaterec")
    p = config.effective_padding
    # Alg. 2 lines 2-5 (as padding_mask: one float64 uniform per position; none when p = 0).
    pad = (noise.uniform(mask.shape) < p) & mask if p > 0 else torch.zeros_like(mask)
    if p > 0:
        vectors = torch.where(pad[..., None], anonymous.expand_as(vectors), vectors)
    alpha = model.attention(vectors, mask)
    calibration = serving_calibration(config, basis_size=int(alpha.shape[-1]), dim=0)
    event = calibration.event
    if config.epsilon == math.inf:
        return DpaRelease(alpha=alpha, noise=torch.zeros_like(alpha), released=alpha,
                          padded=pad, event=event)
    noisy = add_noise(alpha, calibration, noise=noise)  # DPA does not clip: α is on the simplex
    normalize = _NORMALIZERS[config.normalization]
    return DpaRelease(alpha=alpha, noise=noisy - alpha, released=normalize(noisy), padded=pad,
                      event=event)


def vdp_user_release(user: torch.Tensor, config: ServingConfig, *,
                     noise: NoiseSource) -> torch.Tensor:
    """VDP (PrivateRec §3.2.1) of user vectors ``Tensor[m, d]``, one release per row: each
    clipped to θ plus noise calibrated to ε_s (L1 clip + Laplace(2θ/ε_s), or L2 clip + the
    analytic Gaussian of Δ₂ = 2θ); ``Tensor[m, d]``. With ``SimulationNoise(g)`` it draws what
    :func:`privaterec.privacy.dpa.vdp_release` draws with ``g``."""
    if config.kind != "vdp":
        raise ConfigError(f"vdp_user_release needs ServingConfig(kind='vdp'), got "
                          f"kind={config.kind!r}")
    calibration = serving_calibration(config, basis_size=0, dim=int(user.shape[-1]))
    return clip_and_noise(user, calibration, noise=noise)


__all__ = ["LOCAL_NOTE", "QUERY_MODES", "SERVING_KINDS", "SERVING_MODES", "DpaRelease",
           "ServingConfig", "ServingMode", "dpa_release", "serving_calibration",
           "serving_event", "vdp_user_release"]
