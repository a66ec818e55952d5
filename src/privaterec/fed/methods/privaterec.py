"""PrivateRec's training client (PrivateRec Alg. 2-3): paper mode and strict mode.

A client chooses at most ``max_samples`` of its labelled impressions, pads its history
(behaviour padding, Alg. 2 lines 2-5), releases its attention α̃ = α + DPA noise (lines 6-9,
:mod:`privaterec.privacy.dpa`) and its labels (:mod:`privaterec.privacy.labels`:
candidates drawn blind to the clicks, randomized response on which was clicked), and
uploads the gradient of the loss on ũ = Σ α̃ᵢ bᵢ:

* :class:`PrivateRec` (``privacy_mode = "paper"``, Alg. 3 as published): the gradient is
  uploaded raw; its history path is NOT covered (docs/privacy.md#paper-and-strict-mode).
* :class:`PrivateRecStrict` (``"strict"``, docs/privacy.md#paper-and-strict-mode): the history-path
  part of the gradient is clipped to ``clip`` and noised at the share ``history_budget`` of
  (ε_t, δ_t); DPA gets the rest, so a round is (ε_t, δ_t)-DP for the history.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Sequence

import torch

from privaterec.config import (SENSITIVITY_MODES, NoiseKind, PrivacyMode,
                               RunConfig, SensitivityMode, replace)
from privaterec.data.clients import ClientData
from privaterec.errors import ConfigError
from privaterec.fed.methods.base import RoundContext, RoundOutput
from privaterec.fed.methods.ranking import RankingMethod
from privaterec.fed.objective import ClientInputs, LocalObjective
from privaterec.fed.strategies import ServerDefaults, weighted_mean
from privaterec.method_settings import PrivateRecSettings
from privaterec.privacy.calibrate import Calibration, clipped_release, no_noise
from privaterec.privacy.dpa import (dpa_calibration, dpa_noise, pad_history, padding_mask,
                                    permute_columns)
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.labels import candidate_set_event, label_event, release_labels
from privaterec.privacy.mechanisms import add_noise
from privaterec.privacy.noise import noise_mechanism
from privaterec.privacy.samplers import NoiseSource
from privaterec.validators import check_choice

PAPER_MODE_NOTE = (
    "PrivateRec paper mode (Alg. 3 as published): epsilon covers alpha~ (DPA) and the "
    "positive label (DPL), but the uploaded gradient of every trainable parameter (news "
    "encoder and e0 on the clicked news, user encoder, basic vectors through alpha) also "
    "flows through the raw history and is NOT covered "
    "(docs/privacy.md#paper-and-strict-mode); use "
    "privacy_mode='strict'")
PRIVATEREC_BASIS = 5
"""PrivateRec's number of basic vectors B when the model configuration leaves it at 0 (§4)."""


@dataclass(frozen=True, kw_only=True)
class PrivateRec(RankingMethod):
    """PrivateRec paper mode: DPA on α, the label release, the raw gradient.

    Attributes
    ----------
    noise: ``laplace`` or ``gaussian`` (DPA's mechanism). epsilon, delta: (ε_t, δ_t) per
    round. padding_p: behaviour padding p (0 without noise: padding only buys
    amplification). sensitivity_mode: DPA's ``true`` sensitivity or the paper's.
    """

    name: ClassVar[str] = PrivateRecSettings.method
    settings_type: ClassVar[type[PrivateRecSettings]] = PrivateRecSettings
    server_defaults: ClassVar[ServerDefaults] = ServerDefaults(strategy="fedadam")
    privacy_mode: ClassVar[PrivacyMode] = "paper"

    noise: NoiseKind = "laplace"
    epsilon: float = math.inf
    delta: float = 0.0
    padding_p: float = 0.0
    sensitivity_mode: SensitivityMode = "true"

    def __post_init__(self) -> None:
        noise_mechanism(self.noise, "noise")
        check_choice(self.sensitivity_mode, "sensitivity_mode", SENSITIVITY_MODES)

    # ---------------------------------------------------------------- configuration
    @classmethod
    def resolve(cls, config: RunConfig) -> RunConfig:
        """Also B = :data:`PRIVATEREC_BASIS` basic vectors when the model leaves it at 0, and
        one gradient per round (Alg. 3)."""
        if config.fed.local_steps != 1:
            raise ConfigError("privaterec uploads one gradient per round (Alg. 3); "
                              "'fed.local_steps' must be 1")
        config = super().resolve(config)
        if config.model.basis_size == 0:
            config = replace(config, model=replace(config.model, basis_size=PRIVATEREC_BASIS))
        return config

    @classmethod
    def from_config(cls, config: RunConfig) -> "PrivateRec":
        """Paper mode's :class:`PrivateRec` or strict mode's :class:`PrivateRecStrict`. The
        padding only buys amplification: none without noise (ε_t = ∞)."""
        settings = config.fed.settings_as(PrivateRecSettings)
        common = dict(**cls.common(config), noise=settings.noise,
                      epsilon=settings.epsilon_train,
                      delta=0.0 if noise_mechanism(settings.noise).pure else settings.delta_train,
                      padding_p=(float(settings.padding_p)
                                 if math.isfinite(settings.epsilon_train) else 0.0),
                      sensitivity_mode=settings.sensitivity_mode)
        if settings.privacy_mode == "strict":
            assert settings.clip is not None  # strict mode's settings always have their clip
            return PrivateRecStrict(**common, clip=settings.clip,
                                    history_budget=settings.history_budget)
        return PrivateRec(**common)

    @property
    def by_impressions(self) -> bool:
        """Who takes part is decided by labelled impressions (the label release needs one)."""
        return True

    @property
    def per_client_release(self) -> bool:
        return False

    @property
    def label_candidates(self) -> int:
        """Candidates per impression of PrivateRec's label release (1 + k)."""
        return 1 + self.negatives

    def budget_split(self) -> tuple[tuple[float, float], tuple[float, float] | None]:
        """((ε, δ) of DPA, (ε, δ) of the history-path gradient or None).

        Paper mode gives DPA the whole (ε_t, δ_t). Strict mode spends the share
        ``history_budget`` on the history-path gradient and the rest on DPA; both read the
        history, so they compose to (ε_t, δ_t) per round. The label release
        (:mod:`privaterec.privacy.labels`) acts on the clicks of the impressions, a disjoint
        part of the data, at ε_t: everything else depends on those clicks only through it
        (parallel composition for one click; the ledger composes the parts separately).
        """
        return (self.epsilon, self.delta), None

    # ------------------------------------------------------------------------ hooks
    def check_client(self, data: ClientData) -> None:
        if data.impressions()[0].shape[0] == 0:
            raise ValueError(f"client {data.user_id!r} has no labelled impression")

    def inputs(self, task: LocalObjective, data: ClientData, *,
               noise: NoiseSource) -> ClientInputs:
        return self.draw_inputs(data, basis_size=task.basis_size, noise=noise)

    def draw_inputs(self, data: ClientData, *, basis_size: int,
                    noise: NoiseSource) -> ClientInputs:
        """Alg. 2 lines 2-5 and 9, Alg. 3 lines 16-18: the chosen impressions, the padded
        history, the DPA noise on α ``[B]`` (B = ``basis_size``; None on a secure source: the
        device releases α̃ itself, :meth:`update`) and the released labels, in this order on
        ``noise``."""
        if basis_size < 1:
            raise ConfigError("privaterec needs a model with basic vectors (ModelConfig."
                              "basis_size >= 1; resolve_run_config sets 5)")
        rows, clicks, counts = data.impressions()
        n = rows.shape[0]
        if n > self.max_samples:
            chosen = noise.permutation(n)[: self.max_samples].sort().values
            rows, clicks, counts = rows[chosen], clicks[chosen], counts[chosen]
        pad = padding_mask(data.history_mask, padding_p=self.padding_p, noise=noise)
        history = pad_history(data.history, pad)
        attention_noise: torch.Tensor | None = None
        if not noise.secure:
            attention_noise = dpa_noise((1, basis_size), self.dpa_calibration(), noise=noise)[0]
        size = self.label_candidates
        positions, released = release_labels(clicks, counts, size=size, epsilon=self.epsilon,
                                             noise=noise)
        keep = released < size
        candidates = permute_columns(rows.gather(1, positions)[keep], released[keep])
        return ClientInputs(history, data.history_mask, candidates, attention_noise)

    def _calibrate(self, dimension: int) -> Calibration:
        """Paper mode uploads the gradient raw (its releases are DPA's and the labels')."""
        return no_noise(dimension=dimension, note=f"{self.name}: raw update")

    def dpa_calibration(self) -> Calibration:
        """The calibration of DPA's noise on α in training (Alg. 2 line 9) at DPA's share of
        (ε_t, δ_t) (:meth:`budget_split`), padding-amplified; reads the history. Calibrated
        once per method (cached)."""
        return _dpa_calibration(self)

    def events(self, dimension: int) -> tuple[PrivacyEvent, ...]:
        """DPA's release of α̃ [, the noised history gradient], the label release and the
        candidate sets (:func:`privaterec_train_events`)."""
        return privaterec_train_events(self, dimension=dimension)

    # ------------------------------------------------------------------ computation
    def released_attention(self, task: LocalObjective, params: torch.Tensor,
                           inputs: ClientInputs, source: NoiseSource) -> torch.Tensor:
        """A device's float-safe DPA release α̃ = α + noise ``[B]`` (Alg. 2 lines 6-9), drawn
        from its secure source at the calibration of the method's DPA event."""
        alpha = task.attention(params, inputs.history, inputs.history_mask)
        return add_noise(alpha, self.dpa_calibration(), noise=source)

    def _gradient(self, task: LocalObjective, params: torch.Tensor, inputs: ClientInputs,
                  noise: NoiseSource, *, split: bool) -> tuple[torch.Tensor, float]:
        # A client whose label release dropped every impression computes a zero gradient
        # (and, in strict mode, still releases the noised history part): its upload has the
        # same form as anyone's.
        released = inputs.attention_noise is None
        attention = (self.released_attention(task, params, inputs, noise)
                     if released else inputs.attention_noise)
        return task.client_gradient(params, inputs.history, inputs.history_mask,
                                    inputs.candidates, attention_noise=attention,
                                    split_history=split, released_attention=released)

    def update(self, task: LocalObjective, params: torch.Tensor,
               inputs: ClientInputs, *, noise: NoiseSource) -> tuple[torch.Tensor, float]:
        """The gradient of the loss on ũ = Σ α̃ᵢ bᵢ (Alg. 3 lines 14-21), uploaded raw."""
        return self._gradient(task, params, inputs, noise, split=False)

    def round(self, task: LocalObjective, params: torch.Tensor,
              inputs: Sequence[ClientInputs], sources: Sequence[NoiseSource],
              context: RoundContext) -> RoundOutput:
        """One backward pass: the DPA noise and released labels are part of the batch."""
        batch = task.batch(inputs, with_noise=True)
        direction, loss = task.round_gradient(params, batch, uniform_clients=True)
        return RoundOutput(direction, [loss] * len(inputs))

    def describe(self, *, dimension: int, parameters: Sequence[str], clients_per_round: int,
                 client_fraction: float) -> dict[str, Any]:
        uncovered = uncovered_groups(parameters)
        events = self.events(dimension)
        dpa = events[0]
        (eps_dpa, delta_dpa), history = self.budget_split()
        out: dict[str, Any] = {
            "method": self.name, "privacy_mode": self.privacy_mode,
            "mechanism": self.noise, "clipping": self.clipping,
            "clip_bound": getattr(self, "clip", None),
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
                                       "clip_bound": getattr(self, "clip", None),
                                       "noise_scale": events[1].noise_scale,
                                       "sensitivity": events[1].sensitivity}
        return out


@dataclass(frozen=True, kw_only=True)
class PrivateRecStrict(PrivateRec):
    """PrivateRec strict mode: the history-path gradient clipped to ``clip`` (L1 for
    Laplace, L2 for Gaussian) and noised at the share ``history_budget`` of (ε_t, δ_t)."""

    privacy_mode: ClassVar[PrivacyMode] = "strict"

    clip: float
    history_budget: float = 0.5

    @property
    def clipping(self) -> Literal["l1", "l2"]:
        return noise_mechanism(self.noise).norm

    @property
    def per_client_release(self) -> bool:
        return True

    def budget_split(self) -> tuple[tuple[float, float], tuple[float, float] | None]:
        f = self.history_budget
        return ((self.epsilon * (1 - f), self.delta * (1 - f)),
                (self.epsilon * f, self.delta * f))

    def _calibrate(self, dimension: int) -> Calibration:
        """Its privatize acts on the history-path gradient ``[D]``: L1 clip + Laplace or L2
        clip + analytic Gaussian at the strict share of (ε_t, δ_t), sensitivity 2·clip
        (replacement of one history item changes the clipped gradient by at most twice the
        bound; docs/privacy.md#paper-and-strict-mode)."""
        _, history = self.budget_split()
        assert history is not None
        eps, delta = history
        note = (f"PrivateRec strict: history-path gradient, {self.clipping.upper()} clip to "
                f"{self.clip}, sensitivity 2*clip")
        return clipped_release(clipping=self.clipping, clip=self.clip, mechanism=self.noise,
                               dimension=dimension, epsilon=eps, delta=delta, note=note,
                               data="history")

    def update(self, task: LocalObjective, params: torch.Tensor,
               inputs: ClientInputs, *, noise: NoiseSource) -> tuple[torch.Tensor, float]:
        """The candidate-path gradient raw plus the history-path gradient privatized."""
        grad, loss = self._gradient(task, params, inputs, noise, split=True)
        noised, _ = self.privatize(grad[1][None], [noise])
        return grad[0] + noised[0], loss

    def round(self, task: LocalObjective, params: torch.Tensor,
              inputs: Sequence[ClientInputs], sources: Sequence[NoiseSource],
              context: RoundContext) -> RoundOutput:
        """Per-client split gradients: candidate path raw, history path clipped + noised."""
        batch = task.batch(inputs, with_noise=True)
        split, loss_t = task.client_gradients(params, batch,
                                              chunk_clients=context.chunk_clients,
                                              split_history=True)
        noised, _ = self.privatize(split[:, 1], sources)
        weights = torch.tensor([self.aggregation_weight(int(x.candidates.shape[0]))
                                for x in inputs])
        return RoundOutput(weighted_mean(split[:, 0] + noised, weights),
                           [float(x) for x in loss_t])


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


def privaterec_train_events(method: PrivateRec, *, dimension: int
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
    return (dpa, method.event(dimension), *labels)  # strict: the history-path gradient's


@functools.lru_cache(maxsize=64)
def _dpa_calibration(method: PrivateRec) -> Calibration:
    (eps, delta), _ = method.budget_split()
    return dpa_calibration(epsilon=eps, delta=delta, padding_p=method.padding_p,
                           mechanism=method.noise, sensitivity=method.sensitivity_mode,
                           data="history")


__all__ = ["PAPER_MODE_NOTE", "PRIVATEREC_BASIS", "PrivateRec", "PrivateRecStrict", "privaterec_train_events",
           "uncovered_groups"]
