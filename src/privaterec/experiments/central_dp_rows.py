"""``experiment central-dp``: what is run (:class:`Row`, :func:`plan_rows`) and what a row
holds once run (:class:`SeedResult`, :class:`RowResult`, the CSV records).

The rows of one population (docs/experiments.md):

* **untrained** — the seeded initial model θ₀ of each seed, evaluated without training: it
  uses no user data (ε = 0), so it is the floor a private row's AUC is measured against;
* **central** — DP-FedAvg at every finite target ε (the user-level ε of the whole run), and
  FedRec as the ε = ∞ point;
* **ldp** — DP-FedRec and PrivateRec paper / strict mode at ε_t = 10 per round, FedNewsRec
  at its paper defaults;
* **privaterec** — the PrivateRec model (B = 5 by default, or each B of
  ``privaterec_bases``) trained by DP-FedAvg at the largest finite ε, served by local
  ranking (ε_s = 0) and by DPA at ε_s ∈ :data:`SERVE_EPSILONS`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

from privaterec.config import PrivacyMode, RunConfig
from privaterec.method_settings import ClipSpace, DPFedAvgSettings, FedNewsRecSettings
from privaterec.experiments.common import (METRICS, SERVE_PADDING, ExperimentMethod, RunSpec,
                                           Summary, format_epsilon, metric_columns,
                                           summarize_metrics)
from privaterec.experiments.populations import Population
from privaterec.fed.methods import PRIVATEREC_BASIS
from privaterec.experiments.run_privacy import LedgerEpsilon, combine_ledgers
from privaterec.ondevice.release import ServingConfig

LDP_EPSILON = 10.0  # ε_t per round of the local-DP rows
SERVE_EPSILONS = (1.0, 10.0)  # DPA serving of the PrivateRec central-trained model

Group = Literal["untrained", "central", "ldp", "privaterec"]


@dataclass(frozen=True)
class Row:
    """One table row: a trained configuration (:class:`RunSpec`), optionally served.

    ``group``: ``untrained`` (the initial model of ``spec``'s run, not trained), ``central``
    (FedRec and DP-FedAvg: the curve), ``ldp`` (local DP) or ``privaterec`` (the PrivateRec
    model trained by DP-FedAvg, served).
    """

    group: Group
    spec: RunSpec
    serving: ServingConfig | None = None

    @property
    def key(self) -> str:
        """Unique name of the row: the run's slug, plus the serving mechanism."""
        if self.group == "untrained":
            return "untrained"
        if self.serving is None:
            return self.spec.slug
        if self.serving.kind == "local":
            return f"{self.spec.slug}+local"
        return f"{self.spec.slug}+dpa-{format_epsilon(self.serving.epsilon, markdown=False)}"

    @property
    def label(self) -> str:
        spec = self.spec
        if self.group == "untrained":
            return "Untrained θ₀ (no training, ε = 0)"
        if spec.method == "fedrec":
            return "FedRec (no privacy)"
        if spec.method == "dp-fedavg" and self.group == "central":
            return spec.label
        if self.group == "ldp":
            return f"{spec.label} (local DP)"
        assert self.serving is not None
        served = ("local ranking" if self.serving.kind == "local"
                  else f"DPA serving (p = {self.serving.padding_p:g})")
        return f"PrivateRec (B = {spec.basis}) by DP-FedAvg + {served}"

    @property
    def epsilon_serve(self) -> float | None:
        """ε_s per query (0: local ranking sends nothing); ``None``: not served."""
        if self.serving is None:
            return None
        return 0.0 if self.serving.kind == "local" else self.serving.epsilon


def plan_rows(epsilons: Sequence[float], *, ldp: bool, client_fraction: float | None = None,
              rounds: int | None = None,
              clip_spaces: Sequence[ClipSpace] = ("parameters",),
              privaterec_bases: Sequence[int] = (PRIVATEREC_BASIS,)) -> list[Row]:
    """The rows of one population: the untrained model, FedRec and DP-FedAvg at every finite
    ε of ``epsilons`` (once per clipping of ``clip_spaces``); with ``ldp`` also the local-DP
    rows and the PrivateRec central-trained rows, once per number of basic vectors B of
    ``privaterec_bases`` (trained at the largest finite ε, none if there is no finite ε;
    clipped in parameter space)."""
    def spec(method: ExperimentMethod, epsilon_train: float = math.inf,
             privacy_mode: PrivacyMode = "paper", **more: Any) -> RunSpec:
        return RunSpec(method, epsilon_train, privacy_mode, client_fraction=client_fraction,
                       rounds=rounds, **more)

    finite = sorted(e for e in epsilons if math.isfinite(e))
    rows = [Row("untrained", spec("fedrec"))]  # θ₀ of the FedRec run: the same model
    rows += [Row("central", spec("dp-fedavg", target_epsilon=e, clip_space=space))
             for space in clip_spaces for e in finite]
    if any(math.isinf(e) for e in epsilons):
        rows.append(Row("central", spec("fedrec")))
    if not ldp:
        return rows
    rows += [Row("ldp", spec("dp-fedrec", LDP_EPSILON)), Row("ldp", spec("fednewsrec")),
             Row("ldp", spec("privaterec", LDP_EPSILON, "paper")),
             Row("ldp", spec("privaterec", LDP_EPSILON, "strict"))]
    for basis in privaterec_bases if finite else ():
        model = spec("dp-fedavg", basis_size=basis, target_epsilon=finite[-1])
        rows.append(Row("privaterec", model, ServingConfig(kind="local")))
        rows += [Row("privaterec", model, ServingConfig(kind="privaterec", epsilon=e,
                                                        padding_p=SERVE_PADDING))
                 for e in SERVE_EPSILONS]
    return rows


@dataclass
class SeedResult:
    """One seed of a row: its test metrics and its training run's privacy."""

    seed: int
    metrics: dict[str, Any]
    ledger: LedgerEpsilon
    config: RunConfig  # the run's resolved configuration (its config.yaml)
    path: Path

    @property
    def noise_multiplier(self) -> float | None:
        """z of a DP-FedAvg run (``None`` for the other methods)."""
        if self.config.train.method != "dp-fedavg":
            return None
        return central_settings(self.config)["noise_multiplier"]


def central_settings(config: RunConfig) -> dict[str, Any]:
    """What the caption states of a resolved DP-FedAvg configuration: q, T, δ, C and z (the
    one place that reads these fields)."""
    fed = config.fed
    settings = fed.settings_as(DPFedAvgSettings)
    return {"client_fraction": fed.client_fraction, "rounds": fed.rounds,
            "delta": settings.target_delta, "clip": settings.clip,
            "noise_multiplier": settings.noise_multiplier}


def row_setting(row: Row, config: RunConfig) -> str:
    """The row's privacy knob, from its resolved configuration."""
    spec = row.spec
    if row.group == "untrained":
        return "the seeded initial model, evaluated without training (uses no user data)"
    if spec.method == "fedrec":
        return "no clipping, no noise"
    if spec.method == "dp-fedavg":
        text = f"target ε = {spec.target_epsilon:g} for the run"
        if row.serving is not None:
            text += ("; ε_s = 0 (the device ranks, sends nothing)"
                     if row.serving.kind == "local" else
                     f"; ε_s = {row.serving.epsilon:g} per query")
        return text
    if spec.method == "fednewsrec":
        settings = config.fed.settings_as(FedNewsRecSettings)
        return (f"clip δ = {settings.clip:g} per coordinate, Laplace λ = "
                f"{settings.noise_scale:g}")
    return f"ε_t = {spec.epsilon_train:g} per round"


@dataclass
class RowResult:
    """One table row's results: the seeds that finished."""

    population: Population
    model: str
    row: Row
    setting: str  # the row's privacy knob (row_setting)
    seeds: list[SeedResult]

    @property
    def summaries(self) -> dict[str, Summary]:
        return summarize_metrics([s.metrics for s in self.seeds])

    @property
    def ledger(self) -> LedgerEpsilon:
        return combine_ledgers([s.ledger for s in self.seeds])

    @property
    def noise_multiplier(self) -> float | None:
        values = {s.noise_multiplier for s in self.seeds}
        return values.pop() if len(values) == 1 else None

    def record(self) -> dict[str, Any]:
        spec, ledger = self.row.spec, self.ledger
        return {"users": self.population.users, "data": self.population.data,
                "model": self.model, "group": self.row.group, "row": self.row.key,
                "label": self.row.label,
                "method": "untrained" if self.row.group == "untrained" else spec.method,
                "target_epsilon": spec.target_epsilon,
                "epsilon_train": spec.epsilon_train if spec.method in ("dp-fedrec",
                                                                        "privaterec") else None,
                "privacy_mode": spec.privacy_mode if spec.method == "privaterec" else None,
                "basis_size": spec.basis or None,
                "serving": self.row.serving.kind if self.row.serving else None,
                "epsilon_serve": self.row.epsilon_serve,
                "padding_p": (self.row.serving.padding_p if self.row.serving
                              and self.row.serving.kind == "privaterec" else None),
                "noise_multiplier": self.noise_multiplier,
                "epsilon_user_max": ledger.user_max, "epsilon_user_median": ledger.user_median,
                "epsilon_click_max": ledger.click_max, "epsilon_valid": ledger.valid,
                "delta": ledger.delta, "ledger_users": ledger.population,
                "n_seeds": len(self.seeds), "seeds": [s.seed for s in self.seeds],
                **metric_columns(self.summaries)}


RECORD_COLUMNS = ["users", "data", "model", "group", "row", "label", "method",
                  "target_epsilon", "epsilon_train", "privacy_mode", "basis_size", "serving",
                  "epsilon_serve", "padding_p", "noise_multiplier", "epsilon_user_max",
                  "epsilon_user_median", "epsilon_click_max", "epsilon_valid", "delta",
                  "ledger_users", "n_seeds", "seeds"] + [f"{m}_{s}" for m in METRICS
                                                         for s in ("mean", "std")]
RUN_COLUMNS = ["users", "model", "row", "seed", "run", "noise_multiplier", "epsilon_user_max",
               "epsilon_user_median", "epsilon_valid", *METRICS]


__all__ = ["Group", "LDP_EPSILON", "PRIVATEREC_BASIS", "RECORD_COLUMNS", "RUN_COLUMNS", "Row",
           "RowResult", "SERVE_EPSILONS", "SERVE_PADDING", "SeedResult", "central_settings",
           "plan_rows", "row_setting"]
