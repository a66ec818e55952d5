"""The registry of federated methods: their defaults, their rules and how a run
configuration becomes a :class:`~privaterec.fed.methods.base.ClientMethod`.

Adding a method is an addition here (its builder and defaults), not a branch in the engine.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from privaterec.config import FedConfig, RunConfig, replace
from privaterec.errors import ConfigError
from privaterec.fed.methods.base import ClientMethod
from privaterec.fed.methods.central import CentralDP
from privaterec.fed.methods.privaterec import PrivateRec, PrivateRecStrict
from privaterec.fed.methods.ranking import DPFedRec, FedNewsRec, FedRec
from privaterec.privacy.adaptive_clip import (DEFAULT_CLIP_LR, AdaptiveClipping,
                                              update_noise_multiplier)
from privaterec.privacy.central import calibrate_noise_multiplier, central_epsilon

# DP-FedAvg's clip norm C of a client's update (central DP, issue 15); see BENCHMARKS.md.
DP_FEDAVG_CLIP = 0.1
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
    "privaterec": {"strategy": "fedadam", "client_fraction": 0.02, "adam_tau": 1e-6,
                   "padding_p": 0.5},
    "dp-fedavg": {"strategy": "fedadam", "client_fraction": 0.02, "clip": DP_FEDAVG_CLIP,
                  "adam_tau": 1e-6, "target_delta": 1e-5},
}
# PrivateRec strict mode's clip bound C of the history-path gradient (DESIGN §4 erratum 4).
# Its signal-to-noise ratio, C against Laplace noise of L1 norm 2CD/ε, does not depend on C,
# but the noise it adds to the raw candidate-path gradient grows with C: a small C is better
# (measured: 0.5349 test AUC at C = 1e-4 vs 0.5172 at DP-FedRec's 0.005; BENCHMARKS.md).
PRIVATEREC_STRICT_CLIP = 1e-4
# PrivateRec's number of basic vectors B when the model configuration leaves it at 0 (§4).
PRIVATEREC_BASIS = 5
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
        strategy = changes.get("strategy", fed.strategy)
        assert strategy is not None  # every method has a default strategy
        changes["server_lr"] = STRATEGY_LR[strategy]
    central = ("noise_multiplier", "target_epsilon", "target_delta")
    if method != "dp-fedavg" and any(getattr(fed, k) is not None for k in central):
        raise ConfigError(f"'fed.noise_multiplier', 'fed.target_epsilon' and "
                          f"'fed.target_delta' apply to dp-fedavg (central DP) only, not "
                          f"{method}")
    adaptive = ("adaptive_clip_quantile", "clip_lr", "clip_count_stddev")
    if method != "dp-fedavg" and any(getattr(fed, k) is not None for k in adaptive):
        raise ConfigError(f"'fed.adaptive_clip_quantile', 'fed.clip_lr' and "
                          f"'fed.clip_count_stddev' (adaptive clipping) apply to dp-fedavg "
                          f"(central DP) only, not {method}")
    if method != "dp-fedavg" and (fed.secure_aggregation != "none"
                                  or fed.noise_placement != "central" or fed.max_dropouts):
        raise ConfigError(f"'fed.secure_aggregation', 'fed.noise_placement' and "
                          f"'fed.max_dropouts' apply to dp-fedavg (central DP) only, not "
                          f"{method}")
    if method == "dp-fedavg":
        changes.update(_resolve_central(fed, changes))
        changes.update(_resolve_adaptive_clip(fed, changes))
        # The report composes at the guarantee's own delta.
        changes["report_delta"] = (fed.target_delta if fed.target_delta is not None
                                   else changes["target_delta"])
    if method == "fednewsrec" and fed.noise_scale == 0:
        raise ConfigError("'fed.noise_scale' of fednewsrec must be > 0 (its epsilon is "
                          "2*clip*D/noise_scale); use fedrec for no noise")
    if method != "fednewsrec" and fed.noise_scale is not None:
        raise ConfigError(f"'fed.noise_scale' applies to fednewsrec only; {method} "
                          f"calibrates its noise from epsilon_train")
    if method == "fedrec" and fed.clip is not None:
        raise ConfigError("'fed.clip' does not apply to fedrec (no clipping); use dp-fedrec")
    model = config.model
    if method == "privaterec":
        if fed.privacy_mode == "paper" and fed.clip is not None:
            raise ConfigError("'fed.clip' applies to privaterec only with privacy_mode "
                              "'strict' (the clip of the history-path gradient)")
        if fed.privacy_mode == "strict" and fed.clip is None:
            changes["clip"] = PRIVATEREC_STRICT_CLIP
        if fed.local_steps != 1:
            raise ConfigError("privaterec uploads one gradient per round (Alg. 3); "
                              "'fed.local_steps' must be 1")
        if model.basis_size == 0:
            model = replace(model, basis_size=PRIVATEREC_BASIS)
    elif fed.padding_p is not None:
        raise ConfigError(f"'fed.padding_p' applies to privaterec only, not {method}")
    return replace(config, model=model, fed=replace(fed, **changes))


def _resolve_central(fed: FedConfig, changes: dict[str, Any]) -> dict[str, Any]:
    """DP-FedAvg's settings: z from ``target_epsilon`` (or as given), q = client_fraction."""
    if fed.clients_per_round is not None:
        raise ConfigError("dp-fedavg samples every user independently with probability "
                          "'fed.client_fraction' (Poisson sampling, which the accounting "
                          "assumes); 'fed.clients_per_round' does not apply")
    if fed.noise_multiplier is None and fed.target_epsilon is None:
        raise ConfigError("dp-fedavg needs 'fed.target_epsilon' (the user-level epsilon of the "
                          "whole run; CLI --target-epsilon) or 'fed.noise_multiplier' (z; CLI "
                          "--noise-multiplier)")
    if fed.epsilon_train != math.inf or fed.noise_scale is not None:
        raise ConfigError("dp-fedavg's noise follows from --target-epsilon or "
                          "--noise-multiplier; 'fed.epsilon_train' and 'fed.noise_scale' do "
                          "not apply")
    out: dict[str, Any] = {}
    q = fed.client_fraction if fed.client_fraction is not None else changes["client_fraction"]
    delta = fed.target_delta if fed.target_delta is not None else changes["target_delta"]
    if fed.noise_multiplier is None:
        assert fed.target_epsilon is not None
        out["noise_multiplier"] = calibrate_noise_multiplier(
            target_epsilon=fed.target_epsilon, sampling_rate=q, rounds=fed.rounds, delta=delta)
    elif fed.target_epsilon is not None:  # both given (e.g. a resolved config.yaml): check
        reached = central_epsilon(noise_multiplier=fed.noise_multiplier, sampling_rate=q,
                                  rounds=fed.rounds, delta=delta)
        if reached > fed.target_epsilon * (1 + 1e-6):
            raise ConfigError(f"'fed.noise_multiplier' {fed.noise_multiplier} gives a user-level "
                              f"epsilon of {reached:.4g} over {fed.rounds} rounds at q = {q}, "
                              f"delta = {delta}, above 'fed.target_epsilon' "
                              f"{fed.target_epsilon}: give only one of the two")
    return out



def _resolve_adaptive_clip(fed: FedConfig, changes: dict[str, Any]) -> dict[str, Any]:
    """Adaptive clipping's settings: η_C's default; σ_b, when given, checked against z
    (its default m / 20 depends on the population and is checked when the run starts,
    :meth:`~privaterec.fed.methods.central.CentralDP.check_population`)."""
    if fed.adaptive_clip_quantile is None:
        given = [k for k in ("clip_lr", "clip_count_stddev") if getattr(fed, k) is not None]
        if given:
            raise ConfigError(f"{', '.join(repr('fed.' + k) for k in given)} (CLI "
                              f"{', '.join('--' + k.replace('_', '-') for k in given)}) apply "
                              f"to adaptive clipping only: pass --adaptive-clip-quantile too "
                              f"(e.g. 0.5), or drop them for a fixed --clip")
        return {}
    if fed.clip_count_stddev is not None:
        z = fed.noise_multiplier if fed.noise_multiplier is not None else changes[
            "noise_multiplier"]
        update_noise_multiplier(noise_multiplier=z, count_stddev=fed.clip_count_stddev)
    return {"clip_lr": DEFAULT_CLIP_LR} if fed.clip_lr is None else {}


MethodBuilder = Callable[[RunConfig], ClientMethod]


def _common(config: RunConfig) -> dict[str, Any]:
    fed = config.fed
    return dict(negatives=config.train.negatives, max_samples=fed.max_client_samples,
                local_steps=fed.local_steps, local_lr=fed.local_lr)


def _fedrec(config: RunConfig) -> ClientMethod:
    return FedRec(**_common(config))


def _fednewsrec(config: RunConfig) -> ClientMethod:
    fed = config.fed
    assert fed.clip is not None and fed.noise_scale is not None, "resolve the config first"
    return FedNewsRec(**_common(config), clip=fed.clip, noise_scale=fed.noise_scale)


def _dp_fedrec(config: RunConfig) -> ClientMethod:
    fed = config.fed
    assert fed.clip is not None, "resolve the config first"
    return DPFedRec(**_common(config), clip=fed.clip, noise=fed.noise,
                    epsilon=fed.epsilon_train,
                    delta=0.0 if fed.noise == "laplace" else fed.delta_train)


def _privaterec(config: RunConfig) -> ClientMethod:
    fed = config.fed
    common = dict(**_common(config), noise=fed.noise, epsilon=fed.epsilon_train,
                  delta=0.0 if fed.noise == "laplace" else fed.delta_train,
                  # Padding only buys amplification: none without noise (ε_t = ∞).
                  padding_p=(float(fed.padding_p or 0.0)
                             if math.isfinite(fed.epsilon_train) else 0.0),
                  sensitivity_mode=fed.sensitivity_mode)
    if fed.privacy_mode == "strict":
        assert fed.clip is not None, "resolve the config first"
        return PrivateRecStrict(**common, clip=fed.clip, history_budget=fed.history_budget)
    return PrivateRec(**common)


def _dp_fedavg(config: RunConfig) -> ClientMethod:
    fed = config.fed
    assert (fed.noise_multiplier is not None and fed.client_fraction is not None
            and fed.clip is not None), "resolve the config first"
    adaptive = None
    if fed.adaptive_clip_quantile is not None:
        assert fed.clip_lr is not None, "resolve the config first"
        adaptive = AdaptiveClipping(target_quantile=fed.adaptive_clip_quantile,
                                    learning_rate=fed.clip_lr,
                                    count_stddev=fed.clip_count_stddev)
    return CentralDP(negatives=config.train.negatives, max_samples=fed.max_client_samples,
                     inner=_fedrec(config), clip=fed.clip,
                     noise_multiplier=fed.noise_multiplier,
                     sampling_rate=fed.client_fraction, rounds=fed.rounds,
                     delta=float(fed.target_delta or 0.0), adaptive=adaptive,
                     secure_aggregation=fed.secure_aggregation,
                     noise_placement=fed.noise_placement, max_dropouts=fed.max_dropouts)


METHODS: dict[str, MethodBuilder] = {
    "fedrec": _fedrec, "fednewsrec": _fednewsrec, "dp-fedrec": _dp_fedrec,
    "privaterec": _privaterec, "dp-fedavg": _dp_fedavg,
}
"""Every federated ranking method: its name → its builder from a resolved RunConfig."""


def method_from_config(config: RunConfig) -> ClientMethod:
    """The client method of a resolved run configuration.

    Raises
    ------
    ConfigError
        If the configuration's method is not a federated method.
    """
    name = config.train.method
    if name not in METHODS:
        raise ConfigError(f"method {name!r} is not a federated method")
    return METHODS[name](config)


__all__ = ["DP_FEDAVG_CLIP", "METHODS", "METHOD_DEFAULTS", "PRIVATEREC_BASIS",
           "PRIVATEREC_STRICT_CLIP", "STRATEGY_LR", "method_from_config", "resolve_run_config"]
