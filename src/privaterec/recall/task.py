"""Uni-FedRec's recall model as a federated task, and its LDP upload (Uni-FedRec §3.5).

The recall model trains on the same engine as the ranking methods
(:func:`privaterec.fed.simulator.train_federated`, the simulator or Flower):
:class:`RecallTask` is its :class:`~privaterec.fed.task.FederatedTask` and
:class:`~privaterec.fed.methods.unifedrec.UniFedRecLDP` its method. The engine's
settings (rounds, sampling, server strategy, samples per client) are a
:class:`~privaterec.config.FedConfig` whose ``settings`` are the upload's
(:class:`~privaterec.method_settings.UniFedRecSettings`: clipping, θ, λ_g);
:func:`resolve_recall_fed` fills Uni-FedRec's defaults of the engine's settings.
:class:`RecallTrainConfig` holds what only the recall task has.

Per round t the server samples a fraction r of the users that have a training click (seeded
by (seed, t)). Each sampled client u, with its own source (seeded by (seed, t, u),
:func:`privaterec.fed.rng.client_noise`):

1. keeps at most ``max_client_samples`` of its training clicks (random subset when it has
   more);
2. draws K_r = 4 negatives per click — ``negative_source="impression"``: non-clicked news of
   the same impression (the paper: "displayed to but not clicked by this user");
   ``"pool"``: uniformly from a news pool (any pool news other than the click itself);
3. optionally (``score_noise``) draws the Laplace(λ_I) noise of the decomposition scores
   (Eq. 2), so that training sees what serving sends;
4. computes g_u = ∇θ of its mean InfoNCE loss on the unified score z = Σᵢ qᵢ d·r̂ᵢ (Eq. 5-6
   with −log, docs/privacy.md#uni-fedrec-channels-and-quotas), channels clustered from θ's own
   self-attention outputs;
5. clips g_u and adds Laplace(λ_g) noise per coordinate (Eq. 8) and uploads it.

The server averages the uploads (Eq. 9: weighted by their numbers of samples when the
upload is not private, equally otherwise) and steps
:class:`~privaterec.fed.strategies.WeightedSGD` (θ ← θ − ω ḡ, the paper) or FedAdam.

Clipping (Eq. 8's f_θ, θ = 0.1, λ_g = 0.01 by default). ``clipping="l1"`` (default): scale g_u
to ‖g_u‖₁ ≤ θ. Any two clipped gradients differ by at most 2θ in L1, so the upload is the
Laplace mechanism with Δ₁ = 2θ: ε = 2θ/λ_g = 20 per round, for the whole vector — the
paper's stated bound (§3.6) holds for this reading. ``clipping="elementwise"``: clamp every
coordinate to [−θ, θ] as FedNewsRec (Qi et al. 2020, which the paper follows); then
Δ₁ = 2θD and ε = 2θD/λ_g (the paper's 2θ/λ_g is per coordinate,
docs/privacy.md#fednewsrecs-epsilon-is-per-coordinate; both are recorded). ``clipping="none"``
uploads the raw gradient (no guarantee; needs λ_g = 0). Each upload's
:class:`~privaterec.privacy.events.PrivacyEvent` goes into the run's
:class:`~privaterec.privacy.ledger.PrivacyLedger` under the user's id (phase ``train``).

News vectors are fixed inputs ``[N, d]``: row i is the ranking model's news encoding of row i
of the :class:`~privaterec.data.features.NewsFeatures` table (Uni-FedRec §3.3, footnote 3;
:func:`privaterec.recall.news.encode_news_table`). Histories and samples are rows of that
table (:class:`~privaterec.data.clients.ClientDataset`).

Vectorization (docs/architecture.md#performance-design): the random draws (1-3) and the clustering
(scipy, not traceable) run per client outside ``torch.func``; the gradients of a round come from
the shared chunked ``vmap(grad)`` (:func:`~privaterec.fed.task.per_client_gradients`); clipping is
one batched call and each client's noise comes from its own generator.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import torch
from torch import Tensor, nn
from torch.func import grad_and_value

from privaterec.config import FedConfig, fed_with_changes, replace
from privaterec.data.clients import ClientData, ClientDataset, draw_candidates
from privaterec.errors import CheckpointError, ConfigError
from privaterec.fed.engine import Engine, SimulatorEngine, check_engine
from privaterec.fed.methods.unifedrec import UniFedRecLDP
from privaterec.fed.sampling import eligible_clients
from privaterec.fed.simulator import FederatedState
from privaterec.fed.strategies import build_strategy
from privaterec.fed.task import ModuleTask, per_client_gradients
from privaterec.method_settings import UniFedRecSettings, setting
from privaterec.privacy.samplers import NoiseSource, SimulationNoise
from privaterec.recall.channels import ChannelBatch, cluster_batch
from privaterec.recall.model import NUM_NEGATIVES, UniFedRecRecall, info_nce
from privaterec.runtime.checkpoint import load_checkpoint
from privaterec.runtime.device import module_device
from privaterec.validators import fail, is_integer

NegativeSource = Literal["impression", "pool"]

CHECKPOINT_KIND = "unifedrec-recall"
METHOD = UniFedRecSettings.method

RECALL_ROUNDS = 200
"""Default rounds of a recall run (the paper converges in ≤ 200, Fig. 7)."""
RECALL_STRATEGIES = ("sgd", "fedadam")  # the server strategies of recall training
# Engine settings of the ranking methods that recall training does not read.
_RANKING_ONLY = {"local_steps": 1, "eval_every": 0}
# Fields that change what a run computes: a checkpoint only resumes under the same values.
_RESULT_FIELDS = ("fed.client_fraction", "fed.clients_per_round", "fed.server_lr",
                  "fed.strategy", "fed.adam_beta1", "fed.adam_beta2", "fed.adam_tau",
                  "fed.max_client_samples", "fed.settings.clip", "fed.settings.noise_scale",
                  "fed.settings.clipping", "train.negatives", "train.negative_source",
                  "train.score_clip", "train.score_noise")
# Where a checkpoint written before the upload's settings moved to fed.settings kept them.
_LEGACY_RESULT_FIELDS = {"fed.clip": "fed.settings.clip",
                         "fed.noise_scale": "fed.settings.noise_scale",
                         "train.clipping": "fed.settings.clipping"}


def _fail(name: str, value: object, expected: str) -> None:
    fail(name, value, expected, kind="recall training parameter")


@dataclass(frozen=True)
class RecallTrainConfig:
    """What only recall-model training has (the engine's settings are a FedConfig).

    Attributes
    ----------
    negatives:
        K_r negatives per click (paper 4).
    negative_source:
        ``"impression"`` (the click's impression's non-clicked news, the paper; drawn without
        replacement when it has ≥ K_r, else with replacement) or ``"pool"`` (uniform with
        replacement from the pool rows given to :class:`RecallTask`, excluding the click).
    score_clip:
        Clip decomposition scores to [−δ, δ] in training as in serving (model's ``clip``);
        ``False`` trains on unclipped scores (the official code's choice: clipping stops the
        gradient to everything upstream of saturated scores).
    score_noise:
        Add Laplace(λ_I) noise to the decomposition scores in training (model's
        ``noise_scale``). The noise is drawn from the client's generator; it is a training
        regulariser, not a release (the upload is the gradient).

    The upload's privacy (clipping, θ, λ_g) is the method's: ``fed.settings``
    (:class:`~privaterec.method_settings.UniFedRecSettings`).
    """

    negatives: int = NUM_NEGATIVES
    negative_source: NegativeSource = "impression"
    score_clip: bool = setting(True, "clip decomposition scores in training as in serving")
    score_noise: bool = False

    def __post_init__(self) -> None:
        if not (is_integer(self.negatives) and not isinstance(self.negatives, bool)
                and self.negatives >= 1):
            _fail("negatives", self.negatives, "an integer >= 1")
        if self.negative_source not in ("impression", "pool"):
            _fail("negative_source", self.negative_source, "'impression' or 'pool'")
        for name in ("score_clip", "score_noise"):
            if not isinstance(getattr(self, name), bool):
                _fail(name, getattr(self, name), "True or False")


def recall_fed_config(**changes: Any) -> FedConfig:
    """A recall run's FedConfig: :data:`RECALL_ROUNDS` rounds unless ``changes`` say so;
    ``changes`` are flat (engine settings and the upload's, e.g. ``clip``)."""
    base = FedConfig(rounds=RECALL_ROUNDS, settings=UniFedRecSettings())
    return fed_with_changes(base, METHOD, changes)


def resolve_recall_fed(fed: FedConfig) -> FedConfig:
    """Fill Uni-FedRec's defaults of the engine's settings
    (:attr:`UniFedRecLDP.server_defaults`; the upload's settings default to
    :class:`~privaterec.method_settings.UniFedRecSettings`) and check its rules.

    Raises
    ------
    ConfigError
        If a setting does not apply to recall training or the strategy is not ``sgd`` or
        ``fedadam``.
    """
    if fed.settings is None:
        fed = replace(fed, settings=UniFedRecSettings())
    fed.settings_as(UniFedRecSettings)
    fed = UniFedRecLDP.server_defaults.fill(fed)
    given = [k for k, v in _RANKING_ONLY.items() if getattr(fed, k) != v]
    if given:
        raise ConfigError(f"'fed.{given[0]}' does not apply to Uni-FedRec's recall training")
    if not (fed.server_lr is not None and fed.server_lr < math.inf):
        raise ConfigError(f"invalid 'fed.server_lr' of Uni-FedRec's recall training: got "
                          f"{fed.server_lr!r}, expected a finite number > 0")
    if fed.strategy not in RECALL_STRATEGIES:
        raise ConfigError(f"invalid 'fed.strategy' of Uni-FedRec's recall training: got "
                          f"{fed.strategy!r}, expected {' or '.join(map(repr, RECALL_STRATEGIES))}")
    return fed


# -------------------------------------------------------------------------------- the task
class _RecallLoss(nn.Module):
    """The recall model as one traceable function (wrapped for ``functional_call``)."""

    def __init__(self, model: UniFedRecRecall) -> None:
        super().__init__()
        self.model = model

    def forward(self, vectors: Tensor, mask: Tensor, channel_ids: Tensor | None = None,
                quotas: Tensor | None = None, candidates: Tensor | None = None,
                weights: Tensor | None = None, score_noise: Tensor | None = None,
                score_clip: bool = True) -> Tensor:
        """Context ``[b, H, d]`` when only (vectors, mask) are given, else the weighted mean
        InfoNCE of b = 1 user: candidates ``[n, 1 + K, d]``, weights ``[n]``."""
        if candidates is None:
            return self.model.context(vectors, mask)
        assert channel_ids is not None and quotas is not None and weights is not None
        n, c, d = candidates.shape
        logits = self.model(vectors, mask, candidates.reshape(1, n * c, d), channel_ids, quotas,
                            score_noise=score_noise, score_clip=score_clip).reshape(n, c)
        losses = info_nce(logits, reduction="none")
        return (losses * weights).sum() / weights.sum()


@dataclass(frozen=True)
class RecallClientInputs:
    """A client's inputs after its random draws (steps 1-3 of the module docstring).

    history: ``LongTensor[H]`` table rows; history_mask: ``BoolTensor[H]``;
    candidates: ``LongTensor[n, 1 + K_r]`` rows, the click in column 0;
    score_noise: ``Tensor[M, B]`` Laplace(λ_I) noise, or ``None``.
    """

    history: Tensor
    history_mask: Tensor
    candidates: Tensor
    score_noise: Tensor | None = None


class RecallTask(ModuleTask):
    """The recall model's parameters θ ∈ R^D over fixed news vectors, as a federated task.

    Parameters
    ----------
    model:
        The recall model (architecture + initial θ); put in eval mode.
    news_vectors:
        ``Tensor[N, d]`` news vectors of the table rows that histories and samples index.
    pool_rows:
        ``LongTensor[P]`` rows negatives are drawn from with ``negative_source="pool"``
        (default: every row but row 0, the anonymous news).
    options:
        Negatives, clipped scores and score noise (:class:`RecallTrainConfig`).
    """

    def __init__(self, model: UniFedRecRecall, news_vectors: Tensor, *,
                 pool_rows: Tensor | None = None,
                 options: RecallTrainConfig | None = None) -> None:
        if news_vectors.ndim != 2 or news_vectors.shape[1] != model.dim:
            raise ConfigError(f"news_vectors must be [N, d={model.dim}] (the recall model's "
                              f"dim), got {tuple(news_vectors.shape)}")
        if not bool(torch.isfinite(news_vectors).all()):
            raise ConfigError("news_vectors contain NaN or inf")
        model.eval()
        self.model = model
        self.device = module_device(model)
        """Where θ, the model, the news vectors and the round's computation live."""
        self.options = options or RecallTrainConfig()
        self.news_vectors = news_vectors.detach().float().to(self.device)
        n = news_vectors.shape[0]
        pool = torch.arange(1, n) if pool_rows is None else torch.as_tensor(pool_rows).long()
        if pool.ndim != 1 or pool.numel() < 2 or bool((pool < 0).any() | (pool >= n).any()):
            raise ConfigError(f"pool_rows must be >= 2 distinct rows in [0, {n}) of the news "
                              f"table, got {pool.numel()} rows")
        self.pool_rows = pool
        super().__init__(_RecallLoss(model), prefix="model")

    # -- parameters (θ's layout, parameters(), load(), parameter_names(): ModuleTask) ---------
    @property
    def score_shape(self) -> tuple[int, int]:
        """(M, B): channel slots × basic interests."""
        return (self.model.max_channels, self.model.num_basis)

    def pretrained_mask(self) -> Tensor:
        """No coordinate of the recall model is pre-trained: ``BoolTensor[D]`` of False."""
        return torch.zeros(self.dimension, dtype=torch.bool, device=self.device)

    def public_state(self) -> dict[str, Tensor]:
        """The model's frozen tensors, the news vectors and the pool rows."""
        return {**self._model_public_state(), "news_vectors": self.news_vectors,
                "pool_rows": self.pool_rows}

    # -- losses ----------------------------------------------------------------------------
    @torch.no_grad()
    def channels(self, flat: Tensor, history: Tensor, mask: Tensor) -> ChannelBatch:
        """Interest channels under θ of histories ``LongTensor[b, H]`` (rows), ``[b, H]``."""
        history, mask = history.to(self.device), mask.to(self.device)
        context = self._call(flat.detach(), self.news_vectors[history], mask)
        return cluster_batch(context, mask, **self.model.cluster_options)

    def client_loss(self, flat: Tensor, history: Tensor, mask: Tensor, channel_ids: Tensor,
                    quotas: Tensor, candidates: Tensor, weights: Tensor,
                    score_noise: Tensor | None = None, score_clip: bool = True) -> Tensor:
        """One client's mean InfoNCE (Eq. 5-6): history rows ``[H]``, mask ``[H]``, channel
        ids ``[H]``, quotas ``[M]``, candidate rows ``[n, 1 + K]``, weights ``[n]``,
        score noise ``[M, B]``."""
        noise = None if score_noise is None else score_noise[None]
        return self._call(flat, self.news_vectors[history][None], mask[None],
                          channel_ids[None], quotas[None], self.news_vectors[candidates],
                          weights, noise, score_clip)

    # -- the task protocol -----------------------------------------------------------------
    def client_inputs(self, data: ClientData, *, max_samples: int, negatives: int,
                      noise: NoiseSource) -> RecallClientInputs:
        """Steps 1-3 of a client round, in this order on ``noise``: the sample subset,
        the ``negatives`` negatives per click, the score noise (module docstring)."""
        n = data.num_samples
        if n == 0:
            raise ValueError(f"client {data.user_id!r} has no training click")
        if n > max_samples:
            chosen = noise.permutation(n)[: max_samples].sort().values
        else:
            chosen = torch.arange(n)
        positives = data.positives[chosen]
        if self.options.negative_source == "impression":
            candidates = draw_candidates(positives, data.negatives[chosen],
                                         data.negative_counts[chosen],
                                         negatives=negatives, noise=noise)
        else:
            pool = self.pool_rows
            idx = noise.randint(pool.numel(), (positives.shape[0], negatives))
            rows = pool[idx]
            rows = torch.where(rows == positives[:, None], pool[(idx + 1) % pool.numel()],
                               rows)
            candidates = torch.cat([positives[:, None], rows], dim=1)
        score_noise = None
        if self.options.score_noise and self.model.noise_scale > 0:
            # A regulariser, not a release: a secure device seeds a generator from its source.
            source = (noise if not noise.secure else SimulationNoise(
                torch.Generator().manual_seed(int(noise.randint(2**62, ())))))
            score_noise = source.draw(self.score_shape, mechanism="laplace",
                                      scale=self.model.noise_scale)
        return RecallClientInputs(data.history, data.history_mask, candidates, score_noise)

    def gradient(self, flat: Tensor, inputs: RecallClientInputs) -> tuple[Tensor, float]:
        """∇θ of one client's loss ``[D]`` and the loss (no ``vmap``: the reference)."""
        batch = self.channels(flat, inputs.history[None], inputs.history_mask[None])
        weights = torch.ones(inputs.candidates.shape[0], device=self.device)
        noise = None if inputs.score_noise is None else inputs.score_noise.to(self.device)
        g, loss = grad_and_value(self.client_loss)(
            flat, inputs.history.to(self.device), inputs.history_mask.to(self.device),
            batch.channel_ids[0], batch.quotas[0], inputs.candidates.to(self.device), weights,
            noise, self.options.score_clip)
        return g, float(loss)

    def gradients(self, flat: Tensor, inputs: Sequence[RecallClientInputs], *,
                  chunk_clients: int = 16) -> tuple[Tensor, Tensor]:
        """Per-client gradients ``[m, D]`` and losses ``[m]``
        (:func:`~privaterec.fed.task.per_client_gradients` over chunks of clients in order).

        Clients of a chunk are padded to its largest number of samples (weight 0, row 0);
        their channels are clustered per chunk, outside ``vmap``.
        """
        with_noise = inputs[0].score_noise is not None if inputs else False
        return per_client_gradients(
            grad_and_value(self.client_loss), flat, self._chunks(flat, inputs, chunk_clients),
            num_clients=len(inputs), shape=(self.dimension,),
            in_dims=(0, 0, 0, 0, 0, 0, 0 if with_noise else None, None))

    def _chunks(self, flat: Tensor, inputs: Sequence[RecallClientInputs],
                chunk_clients: int) -> Any:
        m = len(inputs)
        with_noise = inputs[0].score_noise is not None if m else False
        for lo in range(0, m, chunk_clients):
            part = inputs[lo: lo + chunk_clients]
            history = torch.stack([x.history for x in part]).to(self.device)
            mask = torch.stack([x.history_mask for x in part]).to(self.device)
            batch = self.channels(flat, history, mask)
            width = max(x.candidates.shape[0] for x in part)
            cands = torch.zeros(len(part), width, part[0].candidates.shape[1], dtype=torch.long)
            weights = torch.zeros(len(part), width)
            for i, x in enumerate(part):
                cands[i, : x.candidates.shape[0]] = x.candidates
                weights[i, : x.candidates.shape[0]] = 1.0
            noise = (torch.stack([x.score_noise for x in part if x.score_noise is not None])
                     if with_noise else None)
            yield (torch.arange(lo, lo + len(part)),
                   (history, mask, batch.channel_ids, batch.quotas, cands.to(self.device),
                    weights.to(self.device), None if noise is None else noise.to(self.device),
                    self.options.score_clip))


# ----------------------------------------------------------------------------- training
def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _check_resumable(saved: dict[str, Any], config: dict[str, Any], seed: int,
                     dimension: int, path: Path) -> None:
    if saved.get("kind") != CHECKPOINT_KIND:
        raise CheckpointError(f"{path}: not a recall-model checkpoint (kind "
                              f"{saved.get('kind')!r}); use another --out path")
    if tuple(saved["params"].shape) != (dimension,):
        raise CheckpointError(f"{path}: holds {tuple(saved['params'].shape)} parameters, the "
                              f"recall model has ({dimension},); use another --out path")
    old, new = _flat(saved.get("config", {})), _flat(config)
    old = {_LEGACY_RESULT_FIELDS.get(k, k): v for k, v in old.items()}
    changed = [k for k in _RESULT_FIELDS if old.get(k) != new[k]]
    if saved.get("seed") != seed:
        changed.insert(0, "seed")
    if changed:
        raise CheckpointError(f"{path}: cannot resume with different {', '.join(changed)}; "
                              f"use the checkpoint's settings or another --out path")


def train_recall(model: UniFedRecRecall, news_vectors: Tensor, clients: ClientDataset,
                 fed: FedConfig, train: RecallTrainConfig | None = None, *, seed: int,
                 pool_rows: Tensor | None = None, engine: Engine | None = None,
                 checkpoint_path: str | Path | None = None, progress: bool = True,
                 on_round: Callable[[int, FederatedState], dict[str, Any] | None] | None = None,
                 stop_after_rounds: int | None = None) -> FederatedState:
    """Federated LDP training of the recall model (Uni-FedRec §3.5); resumable.

    Parameters
    ----------
    model:
        The recall model; its parameters are the initial θ, and the final θ is loaded in it.
    news_vectors:
        ``Tensor[N, d]`` fixed news vectors of the table rows
        (:func:`~privaterec.recall.news.encode_news_table`).
    clients:
        Training users: histories and train-split clicks as table rows
        (:func:`~privaterec.data.clients.build_client_dataset`). Users without a click are
        never sampled.
    fed:
        Rounds, sampling, server strategy, θ (``clip``), λ_g (``noise_scale``), samples per
        client (resolved here with :func:`resolve_recall_fed`).
    train:
        Recall's own settings (:class:`RecallTrainConfig`).
    seed:
        The run's seed: client sampling of round t and client u's draws in round t are
        functions of (seed, t) and (seed, t, u) only (:mod:`privaterec.fed.rng`).
    pool_rows:
        Pool for ``negative_source="pool"`` (default: all rows but row 0).
    engine:
        Where the rounds run (default: the simulator; ``fed.engine = "flower"`` needs the
        Flower engine passed in).
    checkpoint_path:
        Saved every ``fed.checkpoint_every`` rounds and at the end (θ, strategy state,
        round, ledger, log); when it exists, training resumes from it and ends with exactly
        the parameters of an uninterrupted run.
    progress:
        tqdm bar over rounds.
    on_round:
        Called after each round with θ loaded in ``model``; its dict is merged into the log.
    stop_after_rounds:
        Stop after this many rounds of this call (checkpointing first).

    Returns
    -------
    :class:`~privaterec.fed.simulator.FederatedState` (``ledger`` holds one event per user
    per round it took part in).
    """
    train = train or RecallTrainConfig()
    fed = replace(resolve_recall_fed(fed), eval_every=0 if on_round is None else 1)
    task = RecallTask(model, news_vectors, pool_rows=pool_rows, options=train)
    method = UniFedRecLDP.of(fed, train)
    config = {"fed": dataclasses.asdict(fed), "train": dataclasses.asdict(train)}
    path = None if checkpoint_path is None else Path(checkpoint_path)
    if path is not None and path.exists():
        _check_resumable(load_checkpoint(path), config, seed, task.dimension, path)
    if len(eligible_clients(clients)) == 0:
        raise ConfigError("no client has a training click: nothing to train the recall model "
                          "on (check the training split's labels)")
    check_engine(method, clients, engine=fed.engine)
    if engine is None:
        if fed.engine != "simulator":
            raise ConfigError(f"fed.engine = {fed.engine!r} needs its engine passed in "
                              f"(privaterec.runs.engines.build_engine)")
        engine = SimulatorEngine()
    return engine.train(task, clients, fed, method, build_strategy(fed), seed=seed,
                        checkpoint_path=path, on_evaluate=on_round, progress=progress,
                        stop_after_rounds=stop_after_rounds,
                        checkpoint_extra={"kind": CHECKPOINT_KIND, "config": config,
                                          "seed": seed})


__all__ = ["CHECKPOINT_KIND", "RECALL_ROUNDS", "RECALL_STRATEGIES", "RecallClientInputs",
           "RecallTask", "RecallTrainConfig", "UniFedRecLDP", "recall_fed_config",
           "resolve_recall_fed", "train_recall"]
