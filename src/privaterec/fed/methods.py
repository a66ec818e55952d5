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

import functools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from privaterec.config import FedConfig, RunConfig, replace
from privaterec.errors import ConfigError
from privaterec.privacy.calibrated import Calibration, clipped_release, no_noise
from privaterec.privacy.central import (calibrate_noise_multiplier, central_calibration,
                                        central_epsilon)
from privaterec.privacy.dpa import dpa_calibration
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.labels import candidate_set_event, label_event
from privaterec.privacy.ledger import adjacency_view, basic_composition
from privaterec.privacy.randomness import Randomness, release_rows

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
        changes["server_lr"] = STRATEGY_LR[changes.get("strategy", fed.strategy)]
    central = ("noise_multiplier", "target_epsilon", "target_delta")
    if method != "dp-fedavg" and any(getattr(fed, k) is not None for k in central):
        raise ConfigError(f"'fed.noise_multiplier', 'fed.target_epsilon' and "
                          f"'fed.target_delta' apply to dp-fedavg (central DP) only, not "
                          f"{method}")
    if method == "dp-fedavg":
        changes.update(_resolve_central(fed, changes))
        # The report composes at the guarantee's own delta.
        changes["report_delta"] = (fed.target_delta if fed.target_delta is not None
                                   else changes["target_delta"])
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
    padding_p: float = 0.0
    privacy_mode: str = "paper"
    sensitivity_mode: str = "true"
    history_budget: float = 0.5
    noise_multiplier: float | None = None
    sampling_rate: float | None = None
    rounds: int = 1

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
        if name == "privaterec":
            strict = fed.privacy_mode == "strict"
            clipping = ("l1" if fed.noise == "laplace" else "l2") if strict else "none"
            return cls(**common, clipping=clipping, clip=fed.clip if strict else None,
                       noise=fed.noise, epsilon=fed.epsilon_train,
                       delta=0.0 if fed.noise == "laplace" else fed.delta_train,
                       # Padding only buys amplification: none without noise (ε_t = ∞).
                       padding_p=(float(fed.padding_p or 0.0)
                                  if math.isfinite(fed.epsilon_train) else 0.0),
                       privacy_mode=fed.privacy_mode,
                       sensitivity_mode=fed.sensitivity_mode,
                       history_budget=fed.history_budget)
        if name == "dp-fedavg":
            assert fed.noise_multiplier is not None and fed.client_fraction is not None
            return cls(**common, clipping="l2", clip=fed.clip, noise="none",
                       delta=float(fed.target_delta or 0.0),
                       noise_multiplier=fed.noise_multiplier,
                       sampling_rate=fed.client_fraction, rounds=fed.rounds)
        raise ConfigError(f"method {name!r} is not a federated method")

    @property
    def is_privaterec(self) -> bool:
        return self.name == "privaterec"

    @property
    def is_central(self) -> bool:
        """Central DP (DP-FedAvg): clients clip, the aggregator noises the sum once."""
        return self.noise_multiplier is not None

    def central_event(self) -> PrivacyEvent:
        """The ledger event of one central-DP round, recorded for every user."""
        return self.central_calibration().event

    def central_calibration(self) -> Calibration:
        """Central DP: the noise the aggregator adds to the round's sum, and its event."""
        return _central_calibration(self)

    def calibration(self, dimension: int) -> Calibration:
        """How one client's D-dim update is released (clip, noise, event), calibrated once
        per (method, D) (:func:`update_calibration`)."""
        return update_calibration(self, dimension)

    def dpa_calibration(self) -> Calibration:
        """PrivateRec: the calibration of DPA's noise on α (:func:`privaterec_dpa_calibration`)."""
        return privaterec_dpa_calibration(self)

    def history_calibration(self, dimension: int) -> Calibration:
        """PrivateRec strict: the calibration of the history-path gradient
        (:func:`history_calibration`)."""
        return history_calibration(self, dimension)

    @property
    def sends_metadata(self) -> bool:
        """Whether a client also sends its loss and number of samples (only ``fedrec``,
        whose upload is not private anyway; a private method's client sends its released
        update only: a count or a loss would be an unaccounted release)."""
        return self.name == "fedrec"

    def aggregation_weight(self, num_examples: int) -> float:
        """The weight of a client's update in the server's mean: its number of samples
        (FedNewsRec Eq. 6) when that number is sent, else 1 (a private method's server must
        not depend on a private count)."""
        return float(num_examples) if self.sends_metadata else 1.0

    @property
    def label_candidates(self) -> int:
        """Candidates per impression of PrivateRec's label release (1 + k)."""
        return 1 + self.negatives

    @property
    def per_client_release(self) -> bool:
        """Whether each client clips or noises its own update (needs per-client gradients)."""
        if self.is_privaterec:
            return self.privacy_mode == "strict"
        return self.clipping != "none" or self.noise != "none"

    def budget_split(self) -> tuple[tuple[float, float], tuple[float, float] | None]:
        """PrivateRec: ((ε, δ) of DPA, (ε, δ) of the history-path gradient or None).

        Paper mode gives DPA the whole (ε_t, δ_t). Strict mode spends the share
        ``history_budget`` on the history-path gradient and the rest on DPA; both read the
        history, so they compose to (ε_t, δ_t) per round. The label release
        (:mod:`privaterec.privacy.labels`) acts on the clicks of the impressions, a disjoint
        part of the data, at ε_t: everything else depends on those clicks only through it
        (parallel composition for one click; the ledger composes the parts separately).
        """
        if self.privacy_mode != "strict":
            return (self.epsilon, self.delta), None
        f = self.history_budget
        return ((self.epsilon * (1 - f), self.delta * (1 - f)),
                (self.epsilon * f, self.delta * f))

    def events(self, dimension: int) -> tuple[PrivacyEvent, ...]:
        """All events of one client's round (PrivateRec: DPA [+ history gradient]).

        Central DP: none per client (its clipped update goes to the trusted aggregator); the
        round's release is :meth:`central_event`, recorded for the whole population.
        """
        if self.is_privaterec:
            return privaterec_train_events(self, dimension=dimension)
        if self.is_central:
            return ()
        return (self.event(dimension),)

    def round_epsilon(self, dimension: int, adjacency: str) -> tuple[float, float]:
        """(ε, δ) of one client's round under ``adjacency`` by basic composition (the
        ledger composes the run more tightly)."""
        round_events = self.events(dimension) + ((self.central_event(),) if self.is_central
                                                 else ())
        events = [(e, 1) for e in round_events]
        pairs = [basic_composition(g) for g in adjacency_view(events, adjacency)]  # type: ignore[arg-type]
        return max(p[0] for p in pairs), max(p[1] for p in pairs)

    def release(self, *, dimension: int, noised_parameters: Sequence[str],
                clients_per_round: int, client_fraction: float) -> dict[str, Any]:
        """Description of one client's per-round release, for ``privacy.json``."""
        out = self._release(dimension=dimension, noised_parameters=noised_parameters,
                            clients_per_round=clients_per_round, client_fraction=client_fraction)
        out["epsilon_per_round_user"], out["delta_per_round_user"] = self.round_epsilon(
            dimension, "user")
        out["sends"] = ("released update, sample count, loss" if self.sends_metadata
                        else "released update only")
        return out

    def _release(self, *, dimension: int, noised_parameters: Sequence[str],
                 clients_per_round: int, client_fraction: float) -> dict[str, Any]:
        if self.is_central:
            return self._central_release(dimension=dimension, parameters=noised_parameters)
        if self.is_privaterec:
            return self._privaterec_release(dimension=dimension,
                                            parameters=noised_parameters,
                                            clients_per_round=clients_per_round,
                                            client_fraction=client_fraction)
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

    def _central_release(self, *, dimension: int, parameters: Sequence[str]) -> dict[str, Any]:
        assert self.noise_multiplier is not None and self.sampling_rate is not None
        event = self.central_event()
        def total(accountant: str, neighbours: str) -> float:
            assert self.noise_multiplier is not None and self.sampling_rate is not None
            return central_epsilon(noise_multiplier=self.noise_multiplier,
                                   sampling_rate=self.sampling_rate, rounds=self.rounds,
                                   delta=self.delta, accountant=accountant,
                                   neighbours=neighbours)
        return {
            "method": self.name, "mechanism": "gaussian",
            "aggregation": "noise added once to the sum of the sampled clients' clipped "
                           "updates (central DP), divided by the expected count qN",
            "clipping": "l2 (each client)", "clip_bound": self.clip,
            "noise_scale": event.noise_scale, "sensitivity_l2": self.clip,
            "dimension": dimension, "epsilon_per_round": event.epsilon,
            "delta_per_round": event.delta, "coordinate_epsilon": None,
            "noised_parameters": list(parameters),
            "central": {"noise_multiplier": self.noise_multiplier,
                        "sampling_rate": self.sampling_rate, "rounds": self.rounds,
                        "delta": self.delta,
                        "epsilon_run_pld": total("pld", "replace"),
                        "epsilon_run_pld_add_remove": total("pld", "add_remove"),
                        "epsilon_run_rdp_add_remove": total("rdp", "add_remove"),
                        "adjacency": "one user's data replaced (covers one click and one "
                                     "user); add/remove values for comparison only",
                        "sampling": "Poisson: every user joins a round with probability q",
                        "trust": "the server adds the noise and sees the clipped updates "
                                 "(no secure aggregation in this engine yet)"},
        }

    def _privaterec_release(self, *, dimension: int, parameters: Sequence[str],
                            clients_per_round: int, client_fraction: float) -> dict[str, Any]:
        uncovered = uncovered_groups(parameters)
        events = self.events(dimension)
        dpa = events[0]
        (eps_dpa, delta_dpa), history = self.budget_split()
        out: dict[str, Any] = {
            "method": self.name, "privacy_mode": self.privacy_mode,
            "mechanism": self.noise, "clipping": self.clipping, "clip_bound": self.clip,
            "dimension": dimension, "epsilon_per_round": self.epsilon,
            "delta_per_round": self.delta, "coordinate_epsilon": None,
            "noise_scale": dpa.noise_scale,
            "dpa": {"epsilon": eps_dpa, "delta": delta_dpa, "padding_p": self.padding_p,
                    "sensitivity_mode": self.sensitivity_mode,
                    "sensitivity": dpa.sensitivity, "noise_scale": dpa.noise_scale,
                    "valid": dpa.valid},
            "labels": {"epsilon": self.epsilon, "candidates": self.label_candidates,
                       "max_impressions": self.max_samples,
                       "note": f"{self.label_candidates} candidates drawn uniformly from each "
                               f"impression independently of the clicks, "
                               f"{self.label_candidates + 1}-ary randomized response on which "
                               f"was clicked (or none); epsilon per impression's clicks"},
            "candidate_sets": "the candidate-path gradient reveals which displayed news were "
                              "drawn (not which were clicked): public for one-click "
                              "adjacency, not private for user-level adjacency",
            "uncovered_parameters": uncovered if self.privacy_mode == "paper" else [],
            "noised_parameters": list(parameters) if history else [],
            "clients_per_round": clients_per_round, "client_fraction": client_fraction,
        }
        if history is not None:
            out["history_gradient"] = {"epsilon": history[0], "delta": history[1],
                                       "clip_bound": self.clip,
                                       "noise_scale": events[1].noise_scale,
                                       "sensitivity": events[1].sensitivity}
        return out

    def event(self, dimension: int) -> PrivacyEvent:
        """The privacy event of one client's upload in one round."""
        return self.calibration(dimension).event


def uncovered_groups(parameters: Sequence[str]) -> list[str]:
    """Module groups of the parameters that get a history-path gradient, e.g.
    ``["basis (5x64)", "news_encoder (12 tensors)", "user_encoder (6 tensors)"]``.

    Every trainable parameter does: Θ_N encodes the clicked news (and e₀ → r₀), Θ_U reads
    them, and b enters α.
    """
    groups: dict[str, int] = {}
    for name in parameters:
        groups[name.split(".")[0]] = groups.get(name.split(".")[0], 0) + 1
    return [f"{g} ({n} tensors)" for g, n in sorted(groups.items())]


PAPER_MODE_NOTE = (
    "PrivateRec paper mode (Alg. 3 as published): epsilon covers alpha~ (DPA) and the "
    "positive label (DPL), but the uploaded gradient of every trainable parameter (news "
    "encoder and e0 on the clicked news, user encoder, basic vectors through alpha) also "
    "flows through the raw history and is NOT covered "
    "(docs/privacy.md#paper-and-strict-mode); use "
    "privacy_mode='strict'")


def privaterec_train_events(method: ClientMethod, *, dimension: int
                            ) -> tuple[PrivacyEvent, ...]:
    """The per-round events of one PrivateRec client, without drawing noise.

    DPA's release of α̃ (padding-amplified; reads the history), in strict mode the noised
    history-path gradient (reads the history), the label release (reads the clicks of the
    impressions, :mod:`privaterec.privacy.labels`) and the candidate sets the unnoised
    candidate-path gradient reveals (public for one click, not private for a whole user).
    Under one-click adjacency the history events and the label event bound disjoint data, so
    a round costs max(ε_DPA + ε_hist, ε_label) = ε_t; the ledger composes them that way.
    """
    _, history = method.budget_split()
    dpa = method.dpa_calibration().event
    if method.privacy_mode == "paper" and dpa.is_private:
        note = PAPER_MODE_NOTE if dpa.valid else f"{dpa.note}; {PAPER_MODE_NOTE}"
        dpa = replace(dpa, valid=False, note=note)
    labels = ((label_event(epsilon=method.epsilon, size=method.label_candidates,
                           max_impressions=method.max_samples), candidate_set_event())
              if math.isfinite(method.epsilon) else
              (PrivacyEvent(mechanism="none", epsilon=math.inf, phase="train", data="labels",
                            note="labels released without protection (epsilon_train = inf)"),))
    if history is None:
        return (dpa, *labels)
    return (dpa, method.history_calibration(dimension).event, *labels)


@functools.lru_cache(maxsize=64)
def privaterec_dpa_calibration(method: ClientMethod) -> Calibration:
    """PrivateRec's DPA noise on α in training (Alg. 2 line 9) at DPA's share of (ε_t, δ_t)
    (:meth:`ClientMethod.budget_split`), padding-amplified; reads the history. Calibrated once
    per method (cached)."""
    (eps, delta), _ = method.budget_split()
    return dpa_calibration(epsilon=eps, delta=delta, padding_p=method.padding_p,
                           mechanism=method.noise,  # type: ignore[arg-type]
                           sensitivity=method.sensitivity_mode,  # type: ignore[arg-type]
                           data="history")


@functools.lru_cache(maxsize=64)
def history_calibration(method: ClientMethod, dimension: int) -> Calibration:
    """PrivateRec strict mode: the history-path gradient ``[D]`` clipped (L1 + Laplace or
    L2 + analytic Gaussian) at the strict share of (ε_t, δ_t), sensitivity 2·clip
    (replacement of one history item changes the clipped gradient by at most twice the
    bound; DESIGN §4 erratum 4). Calibrated once per (method, D) (cached)."""
    _, history = method.budget_split()
    assert history is not None and method.clip is not None
    eps, delta = history
    note = (f"PrivateRec strict: history-path gradient, {method.clipping.upper()} clip to "
            f"{method.clip}, sensitivity 2*clip")
    return clipped_release(clipping=_noise_clipping(method), clip=method.clip,
                           dimension=dimension, epsilon=eps, delta=delta, note=note,
                           data="history")


def _noise_clipping(method: ClientMethod) -> Any:
    """The L1 clip goes with Laplace noise, the L2 clip with Gaussian noise."""
    expected = {"laplace": "l1", "gaussian": "l2"}.get(method.noise)
    if method.clipping != expected:
        raise ConfigError(f"{method.name}: clipping {method.clipping!r} does not match noise "
                          f"{method.noise!r} (l1 with laplace, l2 with gaussian)")
    return method.clipping


@functools.lru_cache(maxsize=64)
def update_calibration(method: ClientMethod, dimension: int) -> Calibration:
    """How one client's D-dim update is released (FedNewsRec Eq. 4-5; DP-FedRec), once per
    (method, D) (cached).

    * no clipping (``fedrec``, PrivateRec's upload): the raw update, ε = ∞;
    * element-wise clip to [−δ, δ] + Laplace(λ) (FedNewsRec): ε = 2δD/λ for the whole update,
      2δ/λ per coordinate (DESIGN §4 erratum 6);
    * L1 or L2 clip to θ + noise calibrated to ε_t with Δ = 2θ (DP-FedRec);
    * L2 clip without local noise (DP-FedAvg: the aggregator noises the sum,
      :meth:`ClientMethod.central_calibration`).
    """
    if method.clipping == "none":
        return no_noise(dimension=dimension, note=f"{method.name}: raw update")
    assert method.clip is not None
    if method.clipping == "elementwise":
        assert method.noise_scale is not None
        return clipped_release(
            clipping="elementwise", clip=method.clip, dimension=dimension,
            noise_scale=method.noise_scale,
            note="FedNewsRec Eq. 4-5: element-wise clip to [-delta, delta], Laplace(lambda) "
                 "per coordinate; epsilon covers the whole update (2*delta*D/lambda)")
    if method.noise == "none":  # central DP: the aggregator adds the noise to the sum
        return no_noise(dimension=dimension, clipping=method.clipping,  # type: ignore[arg-type]
                        clip=method.clip,
                        note=f"{method.name}: update clipped to L2 norm {method.clip}, noised "
                             f"centrally")
    note = (f"DP-FedRec: {method.clipping.upper()} clip to {method.clip}, "
            f"sensitivity 2*theta per client update")
    return clipped_release(clipping=_noise_clipping(method), clip=method.clip,
                           dimension=dimension, epsilon=method.epsilon, delta=method.delta,
                           note=note)


@functools.lru_cache(maxsize=64)
def _central_calibration(method: ClientMethod) -> Calibration:
    assert method.noise_multiplier is not None and method.sampling_rate is not None
    assert method.clip is not None
    return central_calibration(noise_multiplier=method.noise_multiplier,
                               sampling_rate=method.sampling_rate, clip=method.clip,
                               delta=method.delta)


def privatize_history(updates: torch.Tensor, method: ClientMethod,
                      generators: Sequence[Randomness]) -> tuple[torch.Tensor, PrivacyEvent]:
    """PrivateRec strict mode: clip and noise each client's history-path gradient ``[m, D]``
    (:func:`history_calibration`); row i's noise from ``generators[i]`` (a seeded generator,
    or a device's secure source)."""
    calibration = method.history_calibration(int(updates.shape[1]))
    return release_rows(updates, calibration, generators), calibration.event


def privatize(updates: torch.Tensor, method: ClientMethod,
              generators: Sequence[Randomness]) -> tuple[torch.Tensor, PrivacyEvent]:
    """Clip and noise each client's update before upload (FedNewsRec Eq. 4-5; DP-FedRec).

    Parameters
    ----------
    updates:
        ``Tensor[m, D]``, row i is client i's gradient (or FedAvg pseudo-gradient).
    method:
        The resolved client method; its calibration (:meth:`ClientMethod.calibration`) is
        computed once per (method, D).
    generators:
        One generator per row: client i's noise comes from its own generator (on a real
        device, its own secure source), so every engine draws the same noise for the same
        client. Clipping is batched; only the noise draws visit the clients.

    Returns
    -------
    (``Tensor[m, D]`` released updates, the :class:`PrivacyEvent` of ONE client's release)
    """
    if len(generators) != updates.shape[0]:
        raise ValueError(f"need one generator per client: {len(generators)} for "
                         f"{updates.shape[0]} updates")
    calibration = method.calibration(int(updates.shape[1]))
    return release_rows(updates, calibration, generators), calibration.event
