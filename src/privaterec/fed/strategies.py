"""Server strategies: pure math from (θ, state, the round's updates) to the next θ.

Every client uploads a *descent direction* g_u (a gradient, or FedAvg's pseudo-gradient
θ − θ_u). The server aggregates them weighted by the clients' numbers of samples,
ḡ = Σ_u n_u g_u / Σ_u n_u (FedNewsRec Eq. 6), and steps:

* :class:`WeightedSGD` — θ ← θ − η ḡ (FedNewsRec Eq. 7);
* :class:`FedAvg` — θ ← θ − η_s ḡ with clients running E local steps (McMahan et al.
  2017; η_s = 1 is plain model averaging);
* :class:`FedAvgM` — FedAvg with server momentum (Hsu et al. 2019): m ← β m + ḡ,
  θ ← θ − η_s m; DP-FedAvg's server optimiser in McMahan et al. 2018 (β = 0.9);
* :class:`FedAdam` — Reddi et al. 2020 (Adaptive Federated Optimization), Alg. 2 with
  Δ = −ḡ: m ← β₁m + (1−β₁)Δ, v ← β₂v + (1−β₂)Δ², θ ← θ + η m/(√v + τ) (no bias
  correction, as in the paper); PrivateRec Alg. 3 line 9 aggregates with it.

The simulator and the Flower ServerApp both call these functions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol, Sequence

import torch

from privaterec.config import FedConfig, Strategy as StrategyName
from privaterec.errors import ConfigError
from privaterec.fed.update import ClientUpdate

State = dict[str, torch.Tensor]


def weighted_mean(payloads: torch.Tensor, num_examples: torch.Tensor) -> torch.Tensor:
    """ḡ = Σ n_u g_u / Σ n_u: payloads ``[m, D]``, weights n_u ``[m]`` → ``[D]``.

    n_u is the number of samples for ``fedrec`` (FedNewsRec Eq. 6) and 1 for a private
    method (the server must not depend on a private count; ``ClientUpdate.weight``).
    """
    if payloads.shape[0] == 0:
        raise ValueError("cannot aggregate an empty round")
    weights = num_examples.to(payloads.device, payloads.dtype)
    if bool((weights <= 0).any()):
        raise ValueError("every client update needs num_examples > 0")
    return (weights / weights.sum()) @ payloads


def aggregate(updates: Sequence[ClientUpdate]) -> torch.Tensor:
    """Weighted mean of the updates' payloads (weights: their ``weight``)."""
    if not updates:
        raise ValueError("cannot aggregate an empty round")
    return weighted_mean(torch.stack([u.payload for u in updates]),
                         torch.tensor([u.weight for u in updates]))


class Strategy(Protocol):
    """Server optimiser on the flat parameter vector θ ``[D]``."""

    def init_state(self, params: torch.Tensor) -> State: ...

    def step(self, params: torch.Tensor, state: State,
             direction: torch.Tensor) -> tuple[torch.Tensor, State]: ...


@dataclass(frozen=True)
class WeightedSGD:
    """θ ← θ − η ḡ (FedNewsRec Eq. 7)."""

    lr: float

    def init_state(self, params: torch.Tensor) -> State:
        return {}

    def step(self, params: torch.Tensor, state: State,
             direction: torch.Tensor) -> tuple[torch.Tensor, State]:
        return params - self.lr * direction, state


@dataclass(frozen=True)
class FedAvg(WeightedSGD):
    """FedAvg's server step θ ← θ − η_s ḡ on the clients' pseudo-gradients θ − θ_u."""

    lr: float = 1.0


@dataclass(frozen=True)
class FedAvgM:
    """FedAvg with server momentum (Hsu et al. 2019, FedAvgM; McMahan et al. 2018 use it for
    DP-FedAvg): m ← β m + ḡ, θ ← θ − η m (heavy ball). Noise on ḡ moves θ in proportion to
    its size, where FedAdam's per-coordinate normalisation gives a coordinate that carries
    only noise a step of about η."""

    lr: float = 1.0
    momentum: float = 0.9

    def init_state(self, params: torch.Tensor) -> State:
        return {"m": torch.zeros_like(params)}

    def step(self, params: torch.Tensor, state: State,
             direction: torch.Tensor) -> tuple[torch.Tensor, State]:
        m = self.momentum * state["m"] + direction
        return params - self.lr * m, {"m": m}


@dataclass(frozen=True)
class FedAdam:
    """FedAdam (Reddi et al. 2020, Alg. 2), with Δ = −ḡ.

    ``lr`` is η, a float or a per-coordinate ``Tensor[D]`` (see :func:`with_pretrained_lr`).
    """

    lr: float | torch.Tensor
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-6

    def init_state(self, params: torch.Tensor) -> State:
        return {"m": torch.zeros_like(params), "v": torch.zeros_like(params)}

    def step(self, params: torch.Tensor, state: State,
             direction: torch.Tensor) -> tuple[torch.Tensor, State]:
        delta = -direction
        m = self.beta1 * state["m"] + (1 - self.beta1) * delta
        v = self.beta2 * state["v"] + (1 - self.beta2) * delta * delta
        return params + self.lr * m / (v.sqrt() + self.tau), {"m": m, "v": v}


def with_pretrained_lr(strategy: Strategy, pretrained: torch.Tensor, lr: float) -> Strategy:
    """``strategy`` with step size ``lr`` on the coordinates ``pretrained`` (``BoolTensor[D]``).

    Only FedAdam, whose step moves a coordinate by about η, takes a per-coordinate η (PLM-NR's
    fine-tuned MiniLM layers at ``TrainConfig.plm_lr``); other strategies, and a mask with
    no coordinate set, return ``strategy`` unchanged.
    """
    if not isinstance(strategy, FedAdam) or not bool(pretrained.any()):
        return strategy
    rates = torch.full(pretrained.shape, float(strategy.lr), device=pretrained.device)
    rates[pretrained] = lr
    return replace(strategy, lr=rates)


STRATEGY_LR: dict[StrategyName, float] = {"sgd": 0.5, "fedavg": 1.0, "fedavgm": 1.0,
                                          "fedadam": 1e-2}
"""Each strategy's own server learning rate: FedNewsRec's η = 0.5, FedAvg's model averaging
(1.0), FedAdam 1e-2 (measured on the synthetic data, BENCHMARKS.md)."""


@dataclass(frozen=True)
class ServerDefaults:
    """A method's defaults of the engine's settings it leaves open (``FedConfig``'s ``None``).

    Attributes
    ----------
    strategy: the server's optimiser. client_fraction: r (the papers' 2%).
    adam_tau: FedAdam's τ (1e-6 for raw updates, where a smaller τ turns rounding-level
        coordinates into full steps).
    server_lr: η whatever the strategy; ``None``: the strategy's own (:data:`STRATEGY_LR`).
    """

    strategy: StrategyName
    client_fraction: float = 0.02
    adam_tau: float = 1e-6
    server_lr: float | None = None

    def fill(self, fed: FedConfig) -> FedConfig:
        """``fed`` with every engine setting left at ``None`` set to its default here."""
        strategy = fed.strategy if fed.strategy is not None else self.strategy
        lr = self.server_lr if self.server_lr is not None else STRATEGY_LR[strategy]
        return replace(fed, strategy=strategy,
                       client_fraction=_default(fed.client_fraction, self.client_fraction),
                       adam_tau=_default(fed.adam_tau, self.adam_tau),
                       server_lr=_default(fed.server_lr, lr))


def _default(value: float | None, default: float) -> float:
    return default if value is None else value


def build_strategy(fed: FedConfig) -> Strategy:
    """The strategy of a resolved :class:`FedConfig`."""
    if fed.strategy is None or fed.server_lr is None:
        raise ConfigError("fed.strategy and fed.server_lr must be resolved first "
                          "(privaterec.fed.methods.resolve_run_config)")
    if fed.strategy == "sgd":
        return WeightedSGD(lr=fed.server_lr)
    if fed.strategy == "fedavg":
        return FedAvg(lr=fed.server_lr)
    if fed.strategy == "fedavgm":
        return FedAvgM(lr=fed.server_lr, momentum=fed.server_momentum)
    if fed.adam_tau is None:
        raise ConfigError("fed.adam_tau must be resolved first "
                          "(privaterec.fed.methods.resolve_run_config)")
    return FedAdam(lr=fed.server_lr, beta1=fed.adam_beta1, beta2=fed.adam_beta2,
                   tau=fed.adam_tau)
