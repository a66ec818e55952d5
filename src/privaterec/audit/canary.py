"""Worst-case canary audits of central DP: a client clipped to exactly C along a known u.

The natural neighbours of :mod:`~privaterec.audit.world` differ by far less than the
mechanism's sensitivity (their clipped updates are close), so a release with too little
noise can pass their audit. The worst case of the Gaussian mechanism is a user whose clipped
update is exactly ±C·u along a known unit direction u (Nasr et al., USENIX Security 2023,
"Tight auditing of differentially private machine learning"):

* ``replace`` — the round's only client is the canary +C·u on D and −C·u on D′ (one user's
  data replaced, the adjacency the ledger's ε states): the released sums are
  N(±C·u, σ²I), σ = z·C, so the projection on u is a Gaussian shift of μ = 2C/σ = 2/z;
* ``add-remove`` — the canary +C·u on D′ and no client on D: μ = C/σ = 1/z, against the
  ledger's add/remove ε of the same round (``central_epsilon(..., neighbours="add_remove")``).

By Neyman–Pearson the optimal test of two Gaussians with known means is a threshold on the
likelihood ratio, here the projection Σᵢ (m₁ − m₀)ᵢ xᵢ / σᵢ² of the release x on the
difference of the two noiseless releases m₀, m₁ weighted by the claimed noise variances σᵢ²
(with adaptive clipping the clip-indicator sum is one more coordinate). The statistic is
fixed before any noisy run; half of the runs choose its threshold, the other half give the
Clopper–Pearson bound (:func:`~privaterec.audit.distinguisher.fixed_statistic_bound`).

The canary is a real client through the real method code:

* ``dp-fedavg``, ``dp-fedavg-adaptive`` (clipped in parameter space): a
  :class:`CanaryObjective`, a :class:`~privaterec.fed.objective.LocalObjective` whose loss is
  s·⟨u, θ⟩ whatever the data, so the wrapped FedRec client's update (its gradient, or with E
  local steps E·lr times it) is s·u; :func:`~privaterec.fed.client.client_update` clips it
  (:meth:`~privaterec.fed.methods.dp_fedavg.CentralDP.release`) to exactly C·u for |s| large
  (and, adaptive, reports its clip indicator b − ½ = −½), −C·u for s < 0. Adaptive clipping's
  replace pair puts the second canary just inside the clip (norm (1 − η)C, b − ½ = +½), so the
  indicator sums differ by 1 as well: μ = 2/z up to η.
* ``dp-fedavg-news`` (clipped in news-vector space): the one-impression user of the audit
  world, whose news-space vector w_u is longer than C, so its real clipped upload
  (:meth:`~privaterec.fed.methods.dp_fedavg.CentralDP.release`, ``clip_space`` news_vectors)
  has norm exactly C along u = w_u/‖w_u‖; only ``add-remove`` (a loss cannot be negated
  there, so −C·u has no client); its draws (samples, negatives) are drawn once.

Each side's pre-noise sum is computed once (the canary's update is a constant) and the
aggregator's real batched release
:meth:`~privaterec.fed.methods.dp_fedavg.CentralDP.noised_rounds` (the code of
:meth:`~privaterec.fed.methods.dp_fedavg.CentralDP.noised_sums`, which is its one-round
case) noises ``runs`` copies of it, and of the clip-indicator sum, in one call: ``runs``
independent rounds, so a million runs take seconds. The norms are checked: an upload whose
norm is not C (to 1e-5) stops the audit.

The Gaussian mechanism's guarantee holds for every value of the clipped update, so fixing the
canary's own draws audits exactly the claim the accounting makes.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from privaterec.audit.distinguisher import DistinguisherResult, fixed_statistic_bound
from privaterec.audit.runner import PairAudit, claimed_budget
from privaterec.audit.targets import TINY_MODEL, central_method, sent_fields
from privaterec.audit.world import BASE_USER, SMALL_USER, AuditWorld, make_world
from privaterec.config import ModelConfig
from privaterec.errors import ConfigError
from privaterec.fed.objective import LocalObjective
from privaterec.privacy.samplers import NoiseSource, SimulationNoise

CANARY_METHODS = ("dp-fedavg", "dp-fedavg-adaptive", "dp-fedavg-news")
CANARY_ADJACENCIES = ("replace", "add-remove")
DEFAULT_CANARY_RUNS = dict.fromkeys(CANARY_METHODS, 200_000)
"""Runs per side (half select, half test): 10⁵ test runs detect a 2× noise cut at claimed
ε = 1 under replacement and add/remove alike (docs/privacy.md#power-of-the-audit)."""
CANARY_SCALE = 1e3
"""|s|·‖u‖ / C of the clipped canaries: the update is 1000 C long before clipping."""
INSIDE = 1e-3
"""η: adaptive clipping's inside canary has norm (1 − η)·C."""
CHUNK = 20_000
"""Runs noised per call (memory: CHUNK × D floats)."""
NORM_TOLERANCE = 1e-5


class CanaryObjective(LocalObjective):
    """The ranking task with every client's loss replaced by s·⟨u, θ⟩.

    Its gradient is s·u ``Tensor[D]`` at every θ and for every client's data, so a client of
    any ranking method computes the update s·u (FedAvg with E local SGD steps at lr:
    E·lr·s·u) through its real code; ``u`` is a unit vector ``Tensor[D]``.
    """

    def __init__(self, model: Any, *, direction: torch.Tensor, scale: float) -> None:
        super().__init__(model)
        if direction.shape != (self.dimension,):
            raise ValueError(f"the canary direction must be [D = {self.dimension}], got "
                             f"{tuple(direction.shape)}")
        self.direction = direction / torch.linalg.vector_norm(direction)
        self.scale = float(scale)

    def _client_loss(self, flat: torch.Tensor, history: torch.Tensor, mask: torch.Tensor,
                     candidates: torch.Tensor, weights: torch.Tensor,
                     attention_noise: torch.Tensor | None = None,
                     detach_attention: bool = False,
                     released_attention: bool = False) -> torch.Tensor:
        return self.scale * torch.dot(self.direction.to(flat.dtype), flat)


@dataclass(frozen=True)
class CanarySide:
    """One side of a canary pair: the round's pre-noise sum ``total`` ``Tensor[D]`` and
    indicator sum, and what the client sent (None: no client in the round)."""

    name: str
    total: torch.Tensor
    indicator: float
    norm: float


@dataclass(frozen=True)
class CanaryGame:
    """A canary pair of one method: the aggregator, the two sides, the claimed noise scales
    (``sigma`` of the sum's coordinates, ``sigma_count`` of the indicator sum or None), the
    claim (ε, δ) for the pair's adjacency and a note for the table."""

    method_name: str
    adjacency: str
    pair: str
    description: str
    aggregator: Any
    d0: CanarySide
    d1: CanarySide
    sigma: float
    sigma_count: float | None
    claimed_epsilon: float
    claimed_delta: float
    note: str

    def statistic_weights(self) -> tuple[torch.Tensor, float]:
        """The likelihood-ratio weights (m₁ − m₀)/σ² of the sum ``[D]`` and of the count."""
        w = (self.d1.total - self.d0.total).to(torch.float64) / self.sigma ** 2
        wc = 0.0 if self.sigma_count is None else \
            (self.d1.indicator - self.d0.indicator) / self.sigma_count ** 2
        return w, wc


def _unit(dimension: int, seed: int) -> torch.Tensor:
    u = torch.randn(dimension, generator=torch.Generator().manual_seed(seed),
                    dtype=torch.float64).to(torch.float32)
    return u / torch.linalg.vector_norm(u)


def _sent(objective: Any, params: torch.Tensor, method: Any, data: Any,
          seed: int) -> tuple[torch.Tensor, float]:
    """The canary client's real upload (payload ``[D]``, clip indicator b − ½ or 0)."""
    from privaterec.fed.client import client_update
    from privaterec.fed.methods.dp_fedavg import CLIP_INDICATOR

    update = client_update(objective, params, data, method,
                           noise=SimulationNoise(torch.Generator().manual_seed(seed)))
    sent = sent_fields(update)
    return sent["payload"].detach().to(torch.float32), float(sent.get(CLIP_INDICATOR, 0.0))


def _check_norm(name: str, payload: torch.Tensor, expected: float) -> float:
    norm = float(torch.linalg.vector_norm(payload.to(torch.float64)))
    if abs(norm - expected) > NORM_TOLERANCE * expected:
        raise ConfigError(f"the {name} canary's upload has norm {norm:.6g}, not "
                          f"{expected:.6g}: it is not the worst case the audit needs")
    return norm


def canary_games(method: str, world: AuditWorld | None = None, *, epsilon: float,
                 delta: float = 1e-5, model: ModelConfig = TINY_MODEL, seed: int = 0,
                 adjacencies: Sequence[str] = CANARY_ADJACENCIES,
                 secure_aggregation: str | None = None) -> list[CanaryGame]:
    """The canary pairs of a central-DP ``method`` (module docstring).

    ``secure_aggregation``: ``"central"`` or ``"distributed"`` builds the method for
    Flower's SecAgg+ with that noise placement (play it with ``view="secagg"``,
    :func:`noised_statistics`).

    Raises
    ------
    ConfigError
        For a method without canaries, or a canary whose upload is not exactly C long.
    """
    from privaterec.fed.methods.dp_fedavg import expected_clients
    from privaterec.models.factory import build_recommender
    from privaterec.privacy.central_accounting import central_epsilon

    if method not in CANARY_METHODS:
        raise ConfigError(f"invalid audit parameter 'method' for canaries: got {method!r}, "
                          f"expected one of {', '.join(CANARY_METHODS)}")
    for adjacency in adjacencies:
        if adjacency not in CANARY_ADJACENCIES:
            raise ConfigError(f"invalid canary adjacency {adjacency!r}, expected one of "
                              f"{', '.join(CANARY_ADJACENCIES)}")
    world = make_world() if world is None else world
    adaptive, news = method == "dp-fedavg-adaptive", method == "dp-fedavg-news"
    _, aggregator = central_method(adaptive=adaptive, news=news, epsilon=epsilon,
                                   delta=delta, model=model, placement=secure_aggregation)
    clip = aggregator.clip
    z_sum, sigma_b = aggregator.noise_split(expected_clients(1.0, 1))
    sigma = z_sum * clip
    z = aggregator.noise_multiplier
    event = aggregator.central_event()
    replace_claim = claimed_budget([event], "user")
    add_remove = central_epsilon(noise_multiplier=z, sampling_rate=1.0, rounds=1, delta=delta,
                                 neighbours="add_remove")
    data = world.client(SMALL_USER if news else BASE_USER)
    torch.manual_seed(0)
    recommender = build_recommender(model, world.vocabs, world.features)
    games: list[CanaryGame] = []
    if news:
        objective = LocalObjective(recommender)
        payload, _ = _sent(objective, objective.parameters(), aggregator, data, seed)
        plus = CanarySide("+C u", payload, 0.0, _check_norm("news-space", payload, clip))
        note = (f"the one-impression user, news-space norm > C, clipped to C = {clip:g}; "
                f"release D_U + P d = {payload.numel()}, z = {z:.4g}")
    else:
        base = LocalObjective(recommender)
        u = _unit(base.dimension, seed)
        params = base.parameters()

        def side(name: str, scale: float) -> CanarySide:
            objective = CanaryObjective(recommender, direction=u, scale=scale)
            payload, indicator = _sent(objective, params, aggregator, data, seed)
            return CanarySide(name, payload, indicator, float(torch.linalg.vector_norm(
                payload.to(torch.float64))))

        # the raw update's length per unit of s (the inner method's steps and learning
        # rate), measured on an update well inside the clip
        probe = 1e-3 * clip
        per_unit = side("probe", probe).norm / probe if adaptive else None
        big = CANARY_SCALE * clip
        plus = side("+C u", big)
        _check_norm("+C u", plus.total, clip)
        if not torch.allclose(plus.total / clip, u, atol=1e-5):
            raise ConfigError("the +C u canary's upload is not along u")
        note = (f"D = {base.dimension}, clip {clip:g}, z = {z:.4g}"
                + (f", z_update = {z_sum:.4g}, sigma_b = {sigma_b:.4g}" if adaptive else ""))
        if "replace" in adjacencies:
            if adaptive:
                assert per_unit is not None
                minus = side("-(1-eta)C u", -(1 - INSIDE) * clip / per_unit)
                _check_norm("inside", minus.total, (1 - INSIDE) * clip)
                if not (plus.indicator == -0.5 and minus.indicator == 0.5):
                    raise ConfigError("the adaptive canaries' clip indicators are not -1/2 "
                                      f"and +1/2: {plus.indicator}, {minus.indicator}")
                label = "canary +C u (clipped) vs -(1-eta)C u (inside the clip)"
            else:
                minus = side("-C u", -big)
                _check_norm("-C u", minus.total, clip)
                label = "canary +C u vs -C u"
            games.append(CanaryGame(method, "replace", label, "one user's data replaced: the "
                                    "canary's update negated", aggregator, minus, plus, sigma,
                                    sigma_b, replace_claim.epsilon, replace_claim.delta, note))
    if "add-remove" in adjacencies:  # news space: sigma_b is None (a fixed clip)
        absent = CanarySide("no client", torch.zeros_like(plus.total), 0.0, 0.0)
        games.append(CanaryGame(method, "add-remove", "canary +C u vs no client",
                                "the canary user present or absent", aggregator, absent, plus,
                                sigma, sigma_b, add_remove, delta, note))
    return games


VIEWS = ("simulator", "deployed", "secagg", "secagg-deployed")
SECAGG_OTHERS = 2
"""Clients with a zero update in every audited SecAgg+ round, besides the canary (two, so
that a round without the canary still has SecAgg+'s minimum of two clients)."""


def _secagg_view(agg: Any, side: CanarySide, n: int, source: Any) -> torch.Tensor:
    """What the server decodes from ``n`` SecAgg+ rounds of the canary (clipped update
    ``side.total`` ``[R]``; absent when ``side.norm`` is 0) and :data:`SECAGG_OTHERS` clients
    with a zero update, then releases: ``[n, R]`` float64.

    Each client hands SecAgg+ :meth:`~privaterec.fed.secagg.SecAggRound.client_vector`: its
    quantised update plus (distributed noise) its rounded noise share, for the round's plan
    (:meth:`~privaterec.fed.methods.dp_fedavg.CentralDP.secure_round`); the masks cancel in
    the decoded sum (``tests/fed/test_secagg.py`` checks it on real SecAgg+ rounds to 1e-12),
    which is Σ of the vectors. ``client_vector(x) = quantize(x) + client_vector(0)`` (the
    share does not depend on x), so the n rounds' shares come from one ``client_vector`` call
    on n·R zeros per client. With central noise the server then adds its noise
    (:meth:`~privaterec.fed.methods.dp_fedavg.CentralDP.release_sum`)."""
    present = side.norm > 0
    plan = agg.secure_round(SECAGG_OTHERS + int(present))
    assert plan is not None
    dim = side.total.numel()
    view = torch.zeros(n * dim, dtype=torch.float64)
    if present:
        view = view + plan.quantize(side.total).repeat(n)
    if plan.distributed:
        for _ in range(SECAGG_OTHERS + int(present)):
            view = view + plan.client_vector(torch.zeros(n * dim), source)
        return view.reshape(n, dim)
    return agg.release_sum(view, source).to(torch.float64).reshape(n, dim)


def noised_statistics(game: CanaryGame, side: CanarySide, runs: int, *,
                      noise: NoiseSource, view: str = "simulator") -> np.ndarray:
    """The likelihood-ratio statistic of ``runs`` rounds of ``side`` ``[runs]`` float64: the
    aggregator's real :meth:`~privaterec.fed.methods.dp_fedavg.CentralDP.noised_sums` on
    ``runs`` copies of the pre-noise sum (a simulation's seeded noise), or with ``secure`` a
    deployed server's :meth:`~privaterec.fed.methods.dp_fedavg.CentralDP.release_sum` from
    :class:`~privaterec.privacy.samplers.SecureNoise` (the OS CSPRNG, float-safe: not
    reproducible, and about 10⁵ coordinates a second). ``view``: ``"simulator"``
    (seeded ``noised_sums``), ``"deployed"`` (``release_sum`` from SecureNoise),
    ``"secagg"`` / ``"secagg-deployed"`` (the server's view of a SecAgg+ round,
    :func:`_secagg_view`, with seeded or SecureNoise noise and shares)."""
    if view not in VIEWS:
        raise ConfigError(f"invalid canary view {view!r}, expected one of {', '.join(VIEWS)}")
    w, wc = game.statistic_weights()
    agg = game.aggregator
    out = []
    source = noise
    if view in ("deployed", "secagg-deployed"):
        from privaterec.privacy.samplers import SecureNoise

        source = SecureNoise()
    if view != "simulator" and agg.adaptive is not None:
        raise ConfigError("adaptive clipping runs on the simulator only: its canary audit "
                          "has no deployed or SecAgg+ view")
    if view.startswith("secagg") and agg.secure_aggregation == "none":
        raise ConfigError("the SecAgg+ view needs a game built with secure_aggregation")
    for n in (min(CHUNK, runs - start) for start in range(0, runs, CHUNK)):
        if view.startswith("secagg"):
            out.append(_secagg_view(agg, side, n, source) @ w)
        elif view == "deployed":
            noisy = agg.release_sum(side.total.repeat(n), source)
            out.append(noisy.reshape(n, -1).to(torch.float64) @ w)
        else:  # n rounds in one call of the aggregator's batched release
            noisy, counts = agg.noised_rounds(
                side.total.repeat(n, 1), torch.full((n,), side.indicator, dtype=torch.float64),
                population=1, noise=source)
            stat = noisy.to(torch.float64) @ w
            out.append(stat if counts is None else stat + wc * counts)
    return torch.cat(out).numpy()


def play(game: CanaryGame, *, runs: int, seed: int = 0, alpha: float = 0.05,
         view: str = "simulator") -> PairAudit:
    """The canary game: ``runs`` rounds per side (half select the threshold, half test);
    ``view``: which release (:func:`noised_statistics`)."""
    if not (isinstance(runs, int) and runs >= 16):
        raise ConfigError(f"invalid audit parameter 'runs': got {runs!r}, expected an int >= 16")
    from privaterec.audit.runner import _noise

    half = runs // 2
    parts = []
    for part in (1, 2):  # select, test: independent generators
        for index, side in enumerate((game.d0, game.d1)):
            noise = _noise(seed, 0x0CA7A27, part, index)
            parts.append(noised_statistics(game, side, half if part == 1 else runs - half,
                                           noise=noise, view=view))
    result = fixed_statistic_bound((parts[0], parts[1]), (parts[2], parts[3]),
                                   name="canary likelihood ratio", alpha=alpha,
                                   delta=game.claimed_delta)
    return PairAudit(method=game.method_name, mode=view,
                     adjacency=game.adjacency,
                     pair=game.pair, description=f"{game.description} ({game.note})",
                     claimed_epsilon=game.claimed_epsilon, claimed_delta=game.claimed_delta,
                     claim_valid=True, claim_source=("ledger event (replace)" if
                                                     game.adjacency == "replace" else
                                                     "central_epsilon add_remove"),
                     runs=runs, result=result)


POWER_FACTORS = (0.5, 0.25, 0.125, 0.0625)


@dataclass(frozen=True)
class CanaryAudit:
    """A canary pair's audit and its power: ``detected_cut`` the smallest noise cut (2 for
    σ/2, ...) of :data:`POWER_FACTORS` the same audit catches (None: none of them), and the
    bounds of the broken variants in ``cuts`` (cut → lower bound)."""

    audit: PairAudit
    detected_cut: float | None = None
    cuts: tuple[tuple[float, float], ...] = ()


def audit_power(game: CanaryGame, *, runs: int, seed: int = 0,
                alpha: float = 0.05, factors: Sequence[float] = POWER_FACTORS,
                view: str = "simulator") -> CanaryAudit:
    """The canary audit of the correct method, then of its broken variants with the noise
    scaled by each of ``factors`` (:func:`~privaterec.audit.broken.scaled_gaussian_noise`;
    the deployed views: :func:`~privaterec.audit.broken.scaled_secure_noise`; distributed
    noise: :func:`~privaterec.audit.broken.scaled_noise_shares`), stopping at the first one
    caught (no ``factors``: the audit alone)."""
    from privaterec.audit import broken

    audit = play(game, runs=runs, seed=seed, alpha=alpha, view=view)
    cuts = []
    detected = None
    for factor in factors:
        if getattr(game.aggregator, "distributed", False) and view.startswith("secagg"):
            variant: AbstractContextManager[None] = broken.scaled_noise_shares(factor)
        elif view in ("deployed", "secagg-deployed"):
            variant = broken.scaled_secure_noise(factor)
        else:
            variant = broken.scaled_gaussian_noise(factor)
        with variant:
            result = play(game, runs=runs, seed=seed, alpha=alpha, view=view)
        cuts.append((1 / factor, result.epsilon_lower_bound))
        if result.violated:
            detected = 1 / factor
            break
    return CanaryAudit(audit, detected, tuple(cuts))


def run_canary_audit(method: str, *, epsilon: float, runs: int | None = None,
                     seed: int = 0, alpha: float = 0.05, power: bool = False,
                     adjacencies: Sequence[str] = CANARY_ADJACENCIES,
                     world: AuditWorld | None = None, view: str = "simulator",
                     noise_placement: str = "central") -> list[CanaryAudit]:
    """The canary audits of a central-DP method (with ``power``: and its power) on
    ``view`` (:func:`noised_statistics`; the SecAgg+ views with ``noise_placement``)."""
    world = make_world() if world is None else world
    games = canary_games(method, world, epsilon=epsilon, adjacencies=adjacencies,
                         secure_aggregation=(noise_placement if view.startswith("secagg")
                                             else None))
    runs = DEFAULT_CANARY_RUNS[method] if runs is None else runs
    return [audit_power(game, runs=runs, seed=seed, alpha=alpha, view=view,
                        factors=POWER_FACTORS if power else ()) for game in games]


def format_power(audits: Sequence[CanaryAudit]) -> str:
    """A markdown table of canary audits: claim, bound, ceiling, verdict, power."""
    lines = ["| method | neighbours | claimed ε | lower bound (95%) | ceiling | runs | verdict | "
             "smallest noise cut caught |", "|---|---|---|---|---|---|---|---|"]
    for c in audits:
        a = c.audit
        if c.cuts:
            tried = ", ".join(f"{cut:g}x: {bound:.2f}" for cut, bound in c.cuts)
            power = (f"{c.detected_cut:g}x ({tried})" if c.detected_cut is not None
                     else f"none up to {c.cuts[-1][0]:g}x ({tried})")
        else:
            power = "not measured (--power)"
        lines.append(f"| {a.method} | {a.adjacency}: {a.pair} | {a.claimed_epsilon:.3g} | "
                     f"{a.epsilon_lower_bound:.3f} | {a.result.ceiling:.2f} | {a.runs} | "
                     f"{a.verdict} | {power} |")
    return "\n".join(lines)


def gaussian_power(*, mu: float, claimed_epsilon: float, n: int, delta: float = 0.0,
                   alpha: float = 0.05) -> float:
    """The bound an audit with ``n`` test runs per side expects on a Gaussian shift of
    ``mu`` (the best threshold, at the expected counts): the planning formula of
    docs/privacy.md#power-of-the-audit."""
    from scipy import stats

    from privaterec.privacy.audit import clopper_pearson_interval, epsilon_from_rates

    del claimed_epsilon  # the bound does not depend on the claim; kept for the call sites
    t = np.linspace(-2.0, mu + 8.0, 2001)
    fp = np.floor(stats.norm.sf(t) * n)
    fn = np.floor(stats.norm.cdf(t - mu) * n)
    _, fpr = clopper_pearson_interval(fp, np.full_like(fp, n), alpha)
    _, fnr = clopper_pearson_interval(fn, np.full_like(fn, n), alpha)
    return float(np.max(epsilon_from_rates(fpr, fnr, delta)))


def runs_needed(*, mu: float, claimed_epsilon: float, delta: float = 0.0,
                alpha: float = 0.05, limit: int = 10 ** 9) -> int:
    """The fewest test runs per side whose expected bound on a Gaussian shift ``mu``
    exceeds ``claimed_epsilon`` (bisection on :func:`gaussian_power`); ``limit`` if none."""
    lo, hi = 2, 2
    while gaussian_power(mu=mu, claimed_epsilon=claimed_epsilon, n=hi, delta=delta,
                         alpha=alpha) <= claimed_epsilon:
        lo, hi = hi, hi * 2
        if hi > limit:
            return limit
    while hi - lo > max(1, lo // 100):
        mid = (lo + hi) // 2
        if gaussian_power(mu=mu, claimed_epsilon=claimed_epsilon, n=mid, delta=delta,
                          alpha=alpha) > claimed_epsilon:
            hi = mid
        else:
            lo = mid
    return hi


__all__ = ["CANARY_ADJACENCIES", "CANARY_METHODS", "CanaryAudit", "CanaryGame",
           "CanaryObjective", "CanarySide", "DEFAULT_CANARY_RUNS", "POWER_FACTORS",
           "audit_power", "canary_games", "format_power", "gaussian_power",
           "noised_statistics", "play", "run_canary_audit", "runs_needed", "VIEWS"]
