"""The federated methods: their defaults and what a client does to its update before upload.

* ``fedrec`` — plain federated learning (no clipping, no noise, ε = ∞).
* ``fednewsrec`` — FedNewsRec Eq. 4-5: clip every coordinate of the client's gradient to
  [−δ, δ] and add Laplace(λ) to every coordinate; server: weighted SGD (Eq. 6-7). Paper
  defaults r = 2%, η = 0.5, δ = 0.005, λ = 0.015. The paper's ε = 2δ/λ is per coordinate;
  the whole D-dim update is 2δD/λ-DP (DESIGN §4 erratum 6) and the ledger records that.
* ``dp-fedrec`` — PrivateRec §4's baseline: clip the whole update to norm θ (L1 for
  Laplace, L2 for Gaussian) and add noise calibrated to ε_t per round (Δ = 2θ for
  replacement of a client's data; Gaussian with the analytic calibration, erratum 3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from privaterec.config import FedConfig, RunConfig, replace
from privaterec.errors import ConfigError
from privaterec.privacy.calibration import fednewsrec_coordinate_epsilon
from privaterec.privacy.ledger import PrivacyEvent
from privaterec.privacy.mechanisms import (clip_elementwise, clip_l1, clip_l2,
                                           gaussian_mechanism,
                                           laplace_mechanism, laplace_noise)

# Defaults a method gives to the FedConfig fields left at None.
# FedAdam's τ: 1e-6 for raw updates (fedrec; smaller τ turns rounding-level coordinates into
# full steps); 1e-10 for dp-fedrec, whose L1-clipped updates are ~θ/D ≈ 5e-8 per coordinate
# (τ = 1e-6 made its server step a vanishing SGD step; BENCHMARKS.md).
METHOD_DEFAULTS: dict[str, dict[str, Any]] = {
    "fedrec": {"strategy": "fedadam", "client_fraction": 0.02, "adam_tau": 1e-6},
    "fednewsrec": {"strategy": "sgd", "client_fraction": 0.02, "clip": 0.005,
                   "noise_scale": 0.015, "adam_tau": 1e-6},
    "dp-fedrec": {"strategy": "fedadam", "client_fraction": 0.02, "clip": 0.005,
                  "adam_tau": 1e-10},
}
# Server learning rate of each strategy when fed.server_lr is None: FedNewsRec's η = 0.5,
# FedAvg's model averaging (1.0), FedAdam 1e-2 (measured on the synthetic data, BENCHMARKS.md).
STRATEGY_LR = {"sgd": 0.5, "fedavg": 1.0, "fedadam": 1e-2}


def resolve_run_config(config: RunConfig) -> RunConfig:
    """Fill the federated settings a method leaves to its defaults (no-op for others).

    Raises
    ------
    ConfigError
        If a setting does not apply to the method (e.g. ``noise_scale`` for ``dp-fedrec``,
        whose noise follows from ``epsilon_train``).
    """
    method = config.train.method
    if method not in METHOD_DEFAULTS:
        return config
    fed = config.fed
    changes = {k: v for k, v in METHOD_DEFAULTS[method].items() if getattr(fed, k) is None}
    if fed.server_lr is None:
        changes["server_lr"] = STRATEGY_LR[changes.get("strategy", fed.strategy)]
    if method != "fednewsrec" and fed.noise_scale is not None:
        raise ConfigError(f"'fed.noise_scale' applies to fednewsrec only; {method} "
                          f"calibrates its noise from epsilon_train")
    if method == "fedrec" and fed.clip is not None:
        raise ConfigError("'fed.clip' does not apply to fedrec (no clipping); use dp-fedrec")
    return replace(config, fed=replace(fed, **changes))


@dataclass(frozen=True)
class ClientMethod:
    """What a client does in a round, fully resolved.

    Attributes
    ----------
    name: the method. negatives: k sampled non-clicked news per click.
    max_samples: samples per round cap. local_steps, local_lr: FedAvg's E and local η.
    clipping: ``none``, ``elementwise``, ``l1`` or ``l2``; clip: δ or θ.
    noise: ``none``, ``laplace`` or ``gaussian``; noise_scale: FedNewsRec's λ.
    epsilon, delta: DP-FedRec's per-round (ε_t, δ_t).
    """

    name: str
    negatives: int
    max_samples: int
    local_steps: int = 1
    local_lr: float = 0.05
    clipping: str = "none"
    clip: float | None = None
    noise: str = "none"
    noise_scale: float | None = None
    epsilon: float = math.inf
    delta: float = 0.0

    @classmethod
    def from_config(cls, config: RunConfig) -> "ClientMethod":
        """The client method of a resolved run configuration."""
        fed, name = config.fed, config.train.method
        common = dict(name=name, negatives=config.train.negatives,
                      max_samples=fed.max_client_samples, local_steps=fed.local_steps,
                      local_lr=fed.local_lr)
        if name == "fedrec":
            return cls(**common)
        if name == "fednewsrec":
            return cls(**common, clipping="elementwise", clip=fed.clip, noise="laplace",
                       noise_scale=fed.noise_scale)
        if name == "dp-fedrec":
            clipping = "l1" if fed.noise == "laplace" else "l2"
            return cls(**common, clipping=clipping, clip=fed.clip, noise=fed.noise,
                       epsilon=fed.epsilon_train,
                       delta=0.0 if fed.noise == "laplace" else fed.delta_train)
        raise ConfigError(f"method {name!r} is not a federated method")

    @property
    def per_client_release(self) -> bool:
        """Whether each client clips or noises its own update (needs per-client gradients)."""
        return self.clipping != "none" or self.noise != "none"

    def release(self, *, dimension: int, noised_parameters: Sequence[str],
                clients_per_round: int, client_fraction: float) -> dict[str, Any]:
        """Description of one client's per-round release, for ``privacy.json``."""
        event = self.event(dimension)
        out: dict[str, Any] = {
            "method": self.name, "mechanism": self.noise, "clipping": self.clipping,
            "clip_bound": self.clip, "noise_scale": event.noise_scale,
            "dimension": dimension, "epsilon_per_round": event.epsilon,
            "delta_per_round": event.delta, "coordinate_epsilon": event.coordinate_epsilon,
            "noised_parameters": list(noised_parameters),
            "clients_per_round": clients_per_round, "client_fraction": client_fraction,
        }
        key = "sensitivity_l2" if self.noise == "gaussian" else "sensitivity_l1"
        out[key] = event.sensitivity
        return out

    def event(self, dimension: int) -> PrivacyEvent:
        """The privacy event of one client's upload in one round (without drawing noise)."""
        _, event = privatize(torch.zeros(1, dimension), self, [torch.Generator()],
                             draw_noise=False)
        return event


def privatize(updates: torch.Tensor, method: ClientMethod,
              generators: Sequence[torch.Generator], *,
              draw_noise: bool = True) -> tuple[torch.Tensor, PrivacyEvent]:
    """Clip and noise each client's update before upload (FedNewsRec Eq. 4-5; DP-FedRec).

    Parameters
    ----------
    updates:
        ``Tensor[m, D]``, row i is client i's gradient (or FedAvg pseudo-gradient).
    method:
        The resolved client method.
    generators:
        One generator per row: client i's noise comes from its own generator (on a real
        device, its own entropy), so every engine draws the same noise for the same client.
        Clipping and calibration are batched; only the noise draws visit the clients.
    draw_noise:
        ``False`` returns the clipped updates and the event without drawing noise.

    Returns
    -------
    (``Tensor[m, D]`` released updates, the :class:`PrivacyEvent` of ONE client's release)
    """
    if len(generators) != updates.shape[0]:
        raise ValueError(f"need one generator per client: {len(generators)} for "
                         f"{updates.shape[0]} updates")
    dimension = int(updates.shape[1])
    if method.clipping == "none":
        event = PrivacyEvent(mechanism="none", epsilon=math.inf, phase="train",
                             dimension=dimension, note=f"{method.name}: raw update")
        return updates, event
    assert method.clip is not None
    if method.clipping == "elementwise":
        clipped = clip_elementwise(updates, method.clip)
        assert method.noise_scale is not None
        scale = method.noise_scale
        sensitivity = 2.0 * method.clip * dimension
        event = PrivacyEvent(
            mechanism="laplace", epsilon=sensitivity / scale, noise_scale=scale,
            sensitivity=sensitivity, dimension=dimension, phase="train",
            coordinate_epsilon=fednewsrec_coordinate_epsilon(clip_bound=method.clip,
                                                             noise_scale=scale),
            note="FedNewsRec Eq. 4-5: element-wise clip to [-delta, delta], Laplace(lambda) "
                 "per coordinate; epsilon covers the whole update (2*delta*D/lambda)")
        if not draw_noise:
            return clipped, event
        return clipped + laplace_noise(clipped.shape, scale=scale, generator=generators,
                                       dtype=clipped.dtype), event
    clip = clip_l1 if method.clipping == "l1" else clip_l2
    clipped = clip(updates, method.clip, dim=-1)
    sensitivity = 2.0 * method.clip
    note = (f"DP-FedRec: {method.clipping.upper()} clip to {method.clip}, "
            f"sensitivity 2*theta per client update")
    # One call: calibrated once for the round, row i's noise drawn from client i's generator.
    if method.noise == "laplace":
        noised, event = laplace_mechanism(clipped, epsilon=method.epsilon,
                                          sensitivity_l1=sensitivity, generator=generators,
                                          batched=True, note=note)
    else:
        noised, event = gaussian_mechanism(clipped, epsilon=method.epsilon,
                                           delta=method.delta, sensitivity_l2=sensitivity,
                                           generator=generators, batched=True, note=note)
    return (noised if draw_noise else clipped), event
