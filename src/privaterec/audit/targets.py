"""The audited client updates: each method's REAL upload function on a tiny model.

A :class:`Target` wraps the function a device runs in one round —
:func:`privaterec.fed.client.client_update` (the one both engines call, for FedRec,
FedNewsRec, DP-FedRec, PrivateRec and Uni-FedRec's recall model with
:class:`privaterec.recall.task.UniFedRecLDP`) — as ``upload(data, noise) -> Release``: everything the
server receives (:func:`sent_fields`) and the privacy events the client records.

The models are tiny so that thousands of uploads take seconds: a 1-d ``id`` news encoder
with NAML's additive-attention user encoder (FedRec, FedNewsRec, DP-FedRec: D = 45;
PrivateRec adds B = 5 basic vectors), and a Uni-FedRec recall model over fixed random 2-d
news vectors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch

from privaterec.config import FederatedMethod, ModelConfig, RunConfig, TrainConfig, fed_config
from privaterec.data.clients import ClientData
from privaterec.errors import ConfigError
from privaterec.audit.world import AuditWorld
from privaterec.method_settings import PRIVACY_MODES, SETTINGS
from privaterec.privacy.calibrate import clipped_release
from privaterec.privacy.samplers import NoiseSource
from privaterec.validators import check_choice, fail

if TYPE_CHECKING:
    from privaterec.recall.task import UniFedRecLDP

METHODS: tuple[str, ...] = (*SETTINGS, "dp-fedavg-adaptive", "dp-fedavg-news")
"""The audited clients: every federated method, and dp-fedavg with adaptive clipping and with
``clip_space`` news_vectors."""
MODES = PRIVACY_MODES
FEDNEWSREC_CLIP = 0.005  # FedNewsRec's δ (its default)
RECALL_CLIP = 0.1  # Uni-FedRec's θ (its default)
# dp-fedavg-adaptive: the count's noise sigma_b = this share of z (the count then takes
# 1/1.5² = 44% of the budget: z_update = 1.34 z). The audit runs at dp-fedavg's default clip
# 0.1, between the tiny model's update norms of the one-impression pair (0.130 and 0.085 at
# theta_0), so the two users' clip indicators differ.
CENTRAL_COUNT_SHARE = 0.75

# d = 1: an additive-noise release is only as distinguishable as its signal is concentrated,
# and a 1-d id encoder puts each news on one coordinate (measured: noise 10x too small for
# DP-FedRec at claimed epsilon 1 gave a lower bound of 3.0 with d = 1, 2.2 with d = 4).
# PrivateRec's basis attention is the published dot product here: at d = 1, cos(u − c, bᵢ)
# is ±1, so the centered attention is a step function of u whose gradient vanishes, and
# paper mode's raw history-path gradient (the leak the audit must see) would be hidden.
# :data:`CENTERED_MODEL` audits the default centered attention at d = 2. The mechanisms
# audited (DPA on α in the simplex, the label release, the gradient) are the same for both.
TINY_MODEL = ModelConfig(news_encoder="id", user_encoder="naml", num_heads=1, head_dim=1,
                         attention_dim=1, title_len=4, abstract_len=4, history_len=5,
                         word_dim=4, dropout=0.0, basis_attention="dot")
CENTERED_MODEL = ModelConfig(news_encoder="id", user_encoder="naml", num_heads=1, head_dim=2,
                             attention_dim=1, title_len=4, abstract_len=4, history_len=5,
                             word_dim=4, dropout=0.0, basis_attention="centered")


@dataclass(frozen=True)
class Release:
    """One upload: ``sent`` maps every field the server receives to its value (tensors,
    numbers, strings); ``events`` are the client's privacy events for it."""

    sent: Mapping[str, Any]
    events: tuple[Any, ...]


Upload = Callable[[ClientData, NoiseSource], Release]


@dataclass(frozen=True)
class Target:
    """An audited client: its name, mode (``"-"`` when the method has none), upload."""

    method: str
    mode: str
    upload: Upload
    note: str = ""


def sent_fields(update: Any) -> dict[str, Any]:
    """Everything the server receives from a :class:`~privaterec.fed.client.ClientUpdate`.

    ``update.sent()`` when the update defines it (the client's own statement of what it
    transmits: payload and every metadata field); otherwise the payload, ``num_examples``
    and ``metrics["loss"]`` (what the engines transmit).
    """
    sent = getattr(update, "sent", None)
    if callable(sent):
        return dict(sent())
    out: dict[str, Any] = {"payload": update.payload, "num_examples": update.num_examples}
    if "loss" in getattr(update, "metrics", {}):
        out["loss"] = update.metrics["loss"]
    return out


def _release(update: Any) -> Release:
    return Release(sent_fields(update), tuple(update.privacy_events))


def fed_run_config(method: FederatedMethod, *, mode: str, epsilon: float, noise: str = "laplace",
                   delta: float = 1e-5, dimension: int | None = None,
                   model: ModelConfig = TINY_MODEL) -> RunConfig:
    """The resolved run configuration of a federated method at per-round budget ε.

    FedNewsRec has no ε parameter: its λ is the one that makes the whole D-dim update ε-DP,
    λ = 2δD/ε, as its calibration computes it (needs ``dimension`` D).
    """
    from privaterec.fed.methods import resolve_run_config

    fed: dict[str, Any] = {}
    if method == "fednewsrec":
        if dimension is None:
            raise ConfigError("fednewsrec's audit needs the model dimension D")
        fed = {"clip": FEDNEWSREC_CLIP, "noise_scale": clipped_release(
            clipping="elementwise", clip=FEDNEWSREC_CLIP, dimension=dimension,
            epsilon=epsilon).scale}
    elif method in ("dp-fedrec", "privaterec"):
        fed = {"epsilon_train": epsilon, "noise": noise, "delta_train": delta}
        if method == "privaterec":
            fed["privacy_mode"] = mode
    elif method == "dp-fedavg":  # one round at q = 1: its epsilon is the round's
        fed = {"target_epsilon": epsilon, "target_delta": delta, "rounds": 1,
               "client_fraction": 1.0}
    config = RunConfig(data="unused", model=model, train=TrainConfig(method=method, seed=0),
                       fed=fed_config(method, **fed))
    return resolve_run_config(config)


def central_method(*, epsilon: float, delta: float, model: ModelConfig, adaptive: bool = False,
                   news: bool = False, placement: str | None = None) -> tuple[RunConfig, Any]:
    """dp-fedavg's resolved run configuration at the round's ε (one round at q = 1,
    :func:`fed_run_config`) and its aggregator (a
    :class:`~privaterec.fed.methods.dp_fedavg.CentralDP`): with ``adaptive``, adaptive
    clipping (quantile 0.5, count noise :data:`CENTRAL_COUNT_SHARE` · z); with ``news``,
    clipped in news-vector space; with ``placement``, over SecAgg+ with that noise placement."""
    from privaterec.config import replace
    from privaterec.fed.methods import method_from_config, resolve_run_config
    from privaterec.fed.methods.dp_fedavg import CentralDP
    from privaterec.method_settings import DPFedAvgSettings

    config = fed_run_config("dp-fedavg", mode="-", epsilon=epsilon, delta=delta, model=model)
    settings = config.fed.settings_as(DPFedAvgSettings)
    if adaptive:
        z = settings.noise_multiplier
        assert z is not None
        settings = replace(settings, adaptive_clip_quantile=0.5,
                           clip_count_stddev=CENTRAL_COUNT_SHARE * z)
    if news:
        settings = replace(settings, clip_space="news_vectors")
    if placement is not None:
        settings = replace(settings, secure_aggregation="secaggplus",
                           noise_placement=placement, max_dropouts=0)
    config = resolve_run_config(replace(config, fed=replace(config.fed, settings=settings)))
    method = method_from_config(config)
    assert isinstance(method, CentralDP)
    return config, method


def _news_space_target(world: AuditWorld, *, epsilon: float, delta: float,
                       model: ModelConfig) -> Target:
    """dp-fedavg with ``clip_space`` news_vectors: the aggregator's real release of one
    round at q = 1 from the audited user's inputs alone
    (:meth:`~privaterec.fed.methods.dp_fedavg.CentralDP.news_space_release`): the noised
    user-side sum and the noised news-vector cotangents of every news of the table, before
    the server's backward pass (which is post-processing)."""
    from privaterec.fed.news_space import NewsSpaceClipping
    from privaterec.fed.objective import LocalObjective
    from privaterec.models.factory import build_recommender

    config, method = central_method(epsilon=epsilon, delta=delta, model=model, news=True)
    torch.manual_seed(0)
    objective = LocalObjective(build_recommender(config.model, world.vocabs, world.features))
    params = objective.parameters()
    user_coords = ~NewsSpaceClipping(objective).news_mask
    events = method.population_events(objective.dimension)

    def upload(data: ClientData, noise: NoiseSource) -> Release:
        inputs = method.inputs(objective, data, noise=noise)
        user, news, _ = method.news_space_release(objective, params, [inputs], noise=noise)
        return Release({"payload": torch.cat([user[user_coords], news.reshape(-1)])}, events)

    note = (f"D_U = {int(user_coords.sum())} user-side coordinates + "
            f"{len(world.features)} news x d = {model.num_heads * model.head_dim}, one round "
            f"at q = 1, clip {method.clip:g}, z = {method.noise_multiplier:.4g}")
    return Target("dp-fedavg-news", "-", upload, note=note)


def _central_target(world: AuditWorld, *, adaptive: bool, epsilon: float, delta: float,
                    model: ModelConfig) -> Target:
    """dp-fedavg's round release (module docstring): the audited user's real clipped update
    (and, with adaptive clipping, its clip indicator) through the aggregator's real noise."""
    from privaterec.fed.client import client_update
    from privaterec.fed.methods.dp_fedavg import CLIP_INDICATOR
    from privaterec.fed.objective import LocalObjective
    from privaterec.models.factory import build_recommender

    config, method = central_method(epsilon=epsilon, delta=delta, model=model,
                                    adaptive=adaptive)
    torch.manual_seed(0)
    objective = LocalObjective(build_recommender(config.model, world.vocabs, world.features))
    params = objective.parameters()
    events = method.population_events(objective.dimension)

    def upload(data: ClientData, noise: NoiseSource) -> Release:
        sent = sent_fields(client_update(objective, params, data, method, noise=noise))
        total, count = method.noised_sums(sent["payload"], float(sent.get(CLIP_INDICATOR, 0.0)),
                                          population=1, noise=noise)
        out: dict[str, Any] = {"payload": total}
        if count is not None:
            out["clip_count"] = count
        return Release(out, events)

    z_update, sigma_b = method.noise_split(1)
    note = (f"D = {objective.dimension}, one round at q = 1, clip {method.clip:g}, z = "
            f"{method.noise_multiplier:.4g}"
            + (f", z_update = {z_update:.4g}, sigma_b = {sigma_b:.4g}" if adaptive else ""))
    return Target("dp-fedavg-adaptive" if adaptive else "dp-fedavg", "-", upload, note=note)


def _federated_target(method: FederatedMethod, world: AuditWorld, *, mode: str, epsilon: float,
                      noise: str, delta: float, model: ModelConfig) -> Target:
    from privaterec.fed.client import client_update
    from privaterec.fed.methods import method_from_config
    from privaterec.fed.objective import LocalObjective
    from privaterec.models.factory import build_recommender

    def objective_for(config: RunConfig) -> LocalObjective:
        torch.manual_seed(0)
        return LocalObjective(build_recommender(config.model, world.vocabs, world.features))

    config = fed_run_config(method, mode=mode, epsilon=epsilon, noise=noise, delta=delta,
                            dimension=1, model=model)
    objective = objective_for(config)
    if method == "fednewsrec":
        config = fed_run_config(method, mode=mode, epsilon=epsilon, noise=noise, delta=delta,
                                dimension=objective.dimension, model=model)
    client = method_from_config(config)
    params = objective.parameters()

    def upload(data: ClientData, noise: NoiseSource) -> Release:
        return _release(client_update(objective, params, data, client, noise=noise))

    return Target(method, mode if method == "privaterec" else "-", upload,
                  note=f"D = {objective.dimension}")


def recall_config(*, epsilon: float) -> UniFedRecLDP:
    """Uni-FedRec's LDP client method at per-round ε: L1 clip θ, λ_g = 2θ/ε (its calibration)."""
    from privaterec.recall.task import UniFedRecLDP

    return UniFedRecLDP(negatives=4, max_samples=64, clipping="l1", clip=RECALL_CLIP,
                        noise_scale=clipped_release(clipping="l1", clip=RECALL_CLIP,
                                                    dimension=1, epsilon=epsilon).scale)


def _recall_target(world: AuditWorld, *, epsilon: float) -> Target:
    from privaterec.fed.client import client_update
    from privaterec.recall.model import UniFedRecRecall
    from privaterec.recall.task import RecallTask

    dim = 2
    torch.manual_seed(0)
    model = UniFedRecRecall(dim, num_heads=1, head_dim=dim, attention_dim=1, num_basis=2,
                            max_channels=2, distance_threshold=0.5)
    vectors = torch.randn(len(world.features), dim, generator=torch.Generator().manual_seed(0))
    vectors[0] = 0
    task = RecallTask(model, vectors)
    method = recall_config(epsilon=epsilon)
    params = task.parameters()

    def upload(data: ClientData, noise: NoiseSource) -> Release:
        return _release(client_update(task, params, data, method, noise=noise))

    return Target("unifedrec", "-", upload, note=f"recall model, D = {task.dimension}")


def make_target(method: str, world: AuditWorld, *, mode: str = "strict", epsilon: float,
                noise: str = "laplace", delta: float = 1e-5,
                model: ModelConfig | None = None) -> Target:
    """The audited client of ``method`` (``mode``: PrivateRec's ``paper`` or ``strict``).

    ``model``: the federated methods' architecture (default :data:`TINY_MODEL`); ``noise``,
    ``delta``: DP-FedRec's and PrivateRec's mechanism and its δ (Gaussian only).

    Raises
    ------
    ConfigError
        For an unknown method or mode, or ε ≤ 0.
    """
    audited = check_choice(method, "method", METHODS, kind="audit parameter")
    if mode not in MODES:
        raise ConfigError(f"invalid audit parameter 'mode': got {mode!r}, expected 'paper' "
                          f"or 'strict'")
    if not (isinstance(epsilon, (int, float)) and epsilon > 0):
        fail("epsilon", epsilon, "a number > 0", kind="audit parameter")
    epsilon, model = float(epsilon), TINY_MODEL if model is None else model
    if audited == "unifedrec":
        return _recall_target(world, epsilon=epsilon)
    if audited == "dp-fedavg-news":
        return _news_space_target(world, epsilon=epsilon, delta=delta, model=model)
    if audited == "dp-fedavg" or audited == "dp-fedavg-adaptive":
        return _central_target(world, adaptive=audited == "dp-fedavg-adaptive",
                               epsilon=epsilon, delta=delta, model=model)
    return _federated_target(audited, world, mode=mode, epsilon=epsilon, noise=noise,
                             delta=delta, model=model)


__all__ = ["CENTERED_MODEL", "CENTRAL_COUNT_SHARE", "METHODS", "MODES", "Release",
           "Target", "TINY_MODEL", "Upload", "central_method", "fed_run_config", "make_target", "recall_config",
           "sent_fields"]
