"""Federated training of the Uni-FedRec recall model with LDP gradients (Uni-FedRec §3.5).

Per round t the server samples a fraction r of the users that have a training click (seeded
by (seed, t), :func:`privaterec.fed.simulator.sample_round`). Each sampled client u, with
its own generator (seeded by (seed, t, u), :func:`privaterec.fed.rng.client_generator`):

1. keeps at most ``max_samples`` of its training clicks (random subset when it has more);
2. draws K_r = 4 negatives per click — ``negative_source="impression"``: non-clicked news of
   the same impression (the paper: "displayed to but not clicked by this user");
   ``"pool"``: uniformly from a news pool (any pool news other than the click itself);
3. optionally (``score_noise``) draws the Laplace(λ_I) noise of the decomposition scores
   (Eq. 2), so that training sees what serving sends;
4. computes g_u = ∇θ of its mean InfoNCE loss on the unified score z = Σᵢ qᵢ d·r̂ᵢ (Eq. 5-6
   with −log, DESIGN §4 erratum 7), channels clustered from θ's own self-attention outputs;
5. clips g_u and adds Laplace(λ_g) noise per coordinate (Eq. 8) and uploads it.

The server averages the uploads weighted by their numbers of samples (Eq. 9) and steps
:class:`~privaterec.fed.strategies.WeightedSGD` (θ ← θ − ω ḡ, the paper) or FedAdam.

Clipping (Eq. 8's f_θ, θ = 0.1, λ_g = 0.01 by default). ``clipping="l1"`` (default): scale g_u
to ‖g_u‖₁ ≤ θ. Any two clipped gradients differ by at most 2θ in L1, so the upload is the
Laplace mechanism with Δ₁ = 2θ: ε = 2θ/λ_g = 20 per round, for the whole vector — the
paper's stated bound (§3.6) holds for this reading. ``clipping="elementwise"``: clamp every
coordinate to [−θ, θ] as FedNewsRec (Qi et al. 2020, which the paper follows); then
Δ₁ = 2θD and ε = 2θD/λ_g (the paper's 2θ/λ_g is per coordinate, DESIGN §4 erratum 6; both
are recorded). ``clipping="none"`` uploads the raw gradient (no guarantee; needs λ_g = 0).
Each upload's :class:`~privaterec.privacy.ledger.PrivacyEvent` goes into the run's
:class:`~privaterec.privacy.ledger.PrivacyLedger` under the user's id (phase ``train``).

News vectors are fixed inputs ``[N, d]``: row i is the ranking model's news encoding of row i
of the :class:`~privaterec.data.features.NewsFeatures` table (Uni-FedRec §3.3, footnote 3;
:func:`encode_news_table`, :func:`load_ranker_news`). Histories and samples are rows of that
table (:class:`~privaterec.data.clients.ClientDataset`).

Vectorization (DESIGN §6): the random draws (1-3) and the clustering (scipy, not traceable)
run per client outside ``torch.func``; the gradients of a round are computed with
``vmap(grad)`` over chunks of ``chunk_clients`` clients; clipping is one batched call and
each client's noise comes from its own generator. :func:`recall_client_update` computes the
same upload for one client without ``vmap`` (the reference the round must equal).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap
from tqdm.auto import tqdm

from privaterec.data.clients import ClientData, ClientDataset, draw_candidates
from privaterec.data.features import NewsFeatures
from privaterec.errors import CheckpointError, ConfigError
from privaterec.fed.client import ClientUpdate
from privaterec.fed.objective import ParamSpec
from privaterec.fed.rng import client_generator
from privaterec.config import FedConfig
from privaterec.fed.simulator import (FederatedState, RoundResult, eligible_clients,
                                       train_federated)
from privaterec.fed.strategies import FedAdam, Strategy, WeightedSGD, weighted_mean
from privaterec.models.recommender import Recommender
from privaterec.privacy.calibrated import Calibration, clipped_release, no_noise
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.mechanisms import clip_elementwise, clip_l1, laplace_noise
from privaterec.recall.channels import ChannelBatch, cluster_batch
from privaterec.recall.interest import perturb_scores
from privaterec.recall.model import NUM_NEGATIVES, UniFedRecRecall, unified_score
from privaterec.training.checkpoint import load_checkpoint

Clipping = Literal["l1", "elementwise", "none"]
NegativeSource = Literal["impression", "pool"]
StrategyName = Literal["sgd", "fedadam"]

CHECKPOINT_KIND = "unifedrec-recall"

# Fields that change what a run computes: a checkpoint only resumes under the same values.
_RESULT_FIELDS = ("client_fraction", "clients_per_round", "lr", "strategy", "adam_beta1",
                  "adam_beta2", "adam_tau", "negatives", "negative_source", "max_samples",
                  "score_clip", "score_noise", "clipping", "clip", "noise_scale")


def _fail(name: str, value: object, expected: str) -> None:
    raise ConfigError(f"invalid recall training parameter '{name}': got {value!r}, "
                      f"expected {expected}")


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class RecallTrainConfig:
    """Settings of federated recall-model training (defaults: Uni-FedRec §4.1).

    Attributes
    ----------
    rounds:
        Federated rounds (the paper converges in ≤ 200, Fig. 7).
    client_fraction:
        r, the fraction of eligible users sampled per round (paper 2%); at least one.
    clients_per_round:
        Fixed number of clients per round instead of ``client_fraction`` (``None``: use r).
    lr:
        Server learning rate ω (paper 0.05).
    strategy:
        ``"sgd"`` (θ ← θ − ω ḡ, the paper) or ``"fedadam"`` (Reddi et al. 2020) with
        ``adam_beta1``, ``adam_beta2``, ``adam_tau``.
    negatives:
        K_r negatives per click (paper 4).
    negative_source:
        ``"impression"`` (the click's impression's non-clicked news, the paper; drawn without
        replacement when it has ≥ K_r, else with replacement) or ``"pool"`` (uniform with
        replacement from the pool rows given to :class:`RecallObjective`, excluding the click).
    max_samples:
        A client uses at most this many clicks per round (random subset, its generator).
    score_clip:
        Clip decomposition scores to [−δ, δ] in training as in serving (model's ``clip``);
        ``False`` trains on unclipped scores (the official code's choice: clipping stops the
        gradient to everything upstream of saturated scores).
    score_noise:
        Add Laplace(λ_I) noise to the decomposition scores in training (model's
        ``noise_scale``). The noise is drawn from the client's generator; it is a training
        regulariser, not a release (the upload is the gradient).
    chunk_clients:
        Clients per ``vmap`` chunk (memory bound).
    checkpoint_every:
        Rounds between checkpoints (and always at the end).

    Keyword-only privacy parameters
    -------------------------------
    clipping:
        ``"l1"`` (default), ``"elementwise"`` or ``"none"`` (module docstring).
    clip:
        θ > 0 (paper 0.1).
    noise_scale:
        λ_g ≥ 0, Laplace scale per coordinate (paper 0.01); 0 = no noise (ε = ∞).
    """

    rounds: int = 200
    client_fraction: float = 0.02
    clients_per_round: int | None = None
    lr: float = 0.05
    strategy: StrategyName = "sgd"
    adam_beta1: float = 0.9
    adam_beta2: float = 0.99
    adam_tau: float = 1e-6
    negatives: int = NUM_NEGATIVES
    negative_source: NegativeSource = "impression"
    max_samples: int = 64
    score_clip: bool = True
    score_noise: bool = False
    chunk_clients: int = 16
    checkpoint_every: int = 10
    _: KW_ONLY
    clipping: Clipping = "l1"
    clip: float = 0.1
    noise_scale: float = 0.01

    def __post_init__(self) -> None:
        for name in ("rounds", "negatives", "max_samples", "chunk_clients", "checkpoint_every"):
            value = getattr(self, name)
            if not (_is_int(value) and value >= 1):
                _fail(name, value, "an integer >= 1")
        if not (_is_real(self.client_fraction) and 0 < self.client_fraction <= 1):
            _fail("client_fraction", self.client_fraction, "a number in (0, 1]")
        if self.clients_per_round is not None and not (_is_int(self.clients_per_round)
                                                       and self.clients_per_round >= 1):
            _fail("clients_per_round", self.clients_per_round, "None or an integer >= 1")
        if not (_is_real(self.lr) and 0 < self.lr < math.inf):
            _fail("lr", self.lr, "a finite number > 0")
        if self.strategy not in ("sgd", "fedadam"):
            _fail("strategy", self.strategy, "'sgd' or 'fedadam'")
        for name in ("adam_beta1", "adam_beta2"):
            value = getattr(self, name)
            if not (_is_real(value) and 0 <= value < 1):
                _fail(name, value, "a number in [0, 1)")
        if not (_is_real(self.adam_tau) and self.adam_tau > 0):
            _fail("adam_tau", self.adam_tau, "a number > 0")
        if self.negative_source not in ("impression", "pool"):
            _fail("negative_source", self.negative_source, "'impression' or 'pool'")
        for name in ("score_clip", "score_noise"):
            if not isinstance(getattr(self, name), bool):
                _fail(name, getattr(self, name), "True or False")
        if self.clipping not in ("l1", "elementwise", "none"):
            _fail("clipping", self.clipping, "'l1', 'elementwise' or 'none'")
        if not (_is_real(self.clip) and 0 < self.clip < math.inf):
            _fail("clip", self.clip, "a finite number > 0 (theta)")
        if not (_is_real(self.noise_scale) and 0 <= self.noise_scale < math.inf):
            _fail("noise_scale", self.noise_scale, "a finite number >= 0 (lambda_g)")
        if self.clipping == "none" and self.noise_scale > 0:
            _fail("noise_scale", self.noise_scale,
                  "0 with clipping='none' (noise on an unbounded gradient gives no guarantee; "
                  "use clipping='l1')")

    def upload_event(self, dimension: int) -> PrivacyEvent:
        """The privacy event of ONE client's upload of a D-dim gradient (module docstring)."""
        return self.upload_calibration(dimension).event

    def upload_calibration(self, dimension: int) -> Calibration:
        """ONE client's upload of a D-dim gradient, calibrated (module docstring): Laplace at
        the given λ_g on the clipped gradient (Δ₁ = 2θ for an L1 clip, 2θD element-wise)."""
        if not (_is_int(dimension) and dimension >= 1):
            _fail("dimension", dimension, "an integer >= 1")
        lam = float(self.noise_scale)
        if self.clipping == "none":
            return no_noise(dimension=dimension, note="Uni-FedRec recall: raw gradient, no "
                                                      "clipping or noise (no guarantee)")
        if self.clipping == "l1":
            note = (f"Uni-FedRec Eq. 8: recall gradient L1-clipped to theta={self.clip}, "
                    f"Laplace(lambda_g={lam}) per coordinate; L1 sensitivity 2*theta, so "
                    f"epsilon = 2*theta/lambda_g per round for the whole update")
        else:
            note = (f"Uni-FedRec Eq. 8 read as FedNewsRec's element-wise clip to [-theta, "
                    f"theta] (theta={self.clip}) + Laplace(lambda_g={lam}): epsilon = "
                    f"2*theta*D/lambda_g for the whole update (2*theta/lambda_g per coordinate)")
        return clipped_release(clipping=self.clipping, clip=self.clip, dimension=dimension,
                               noise_scale=lam, note=note)

    def strategy_object(self) -> Strategy:
        """The server strategy (:class:`WeightedSGD` or :class:`FedAdam`)."""
        if self.strategy == "sgd":
            return WeightedSGD(lr=self.lr)
        return FedAdam(lr=self.lr, beta1=self.adam_beta1, beta2=self.adam_beta2,
                       tau=self.adam_tau)

    def clients_in_round(self, num_eligible: int) -> int:
        """m = ``clients_per_round`` or max(1, round(r · eligible)), at most ``num_eligible``."""
        if self.clients_per_round is not None:
            return min(self.clients_per_round, num_eligible)
        return max(1, min(num_eligible, round(self.client_fraction * num_eligible)))


# ------------------------------------------------------------------------------ news vectors
@torch.no_grad()
def encode_news_table(model: Recommender, features: NewsFeatures, *, batch_size: int = 256,
                      progress: bool = False) -> Tensor:
    """Every row of ``features`` through the ranking model's news encoder → ``Tensor[N, d]``.

    Row 0 (the anonymous all-padding news) is encoded too, so history padding has a vector.
    The model is put in eval mode and restored afterwards.
    """
    if not (_is_int(batch_size) and batch_size >= 1):
        _fail("batch_size", batch_size, "an integer >= 1")
    was_training = model.training
    model.eval()
    try:
        rows = torch.arange(len(features))
        chunks = [model.encode_features(features.select(chunk))
                  for chunk in tqdm(rows.split(batch_size), desc="encoding news",
                                    unit="batch", disable=not progress)]
    finally:
        model.train(was_training)
    return torch.cat(chunks).detach().float()


@dataclass
class RankerNews:
    """A trained ranking model with its news table and the table's news vectors.

    Attributes
    ----------
    model: the ranker (eval mode). features: news table built with the run's vocabularies.
    vectors: ``Tensor[N, d]``, :func:`encode_news_table` of ``features``.
    history_len: the run's H.
    """

    model: Recommender
    features: NewsFeatures
    vectors: Tensor
    history_len: int


def load_ranker_news(run_dir: str | Path, news: Any, *, batch_size: int = 256,
                     progress: bool = False) -> RankerNews:
    """Load a trained ranking run (``--ranker RUN``) and encode ``news`` with it.

    Parameters
    ----------
    run_dir:
        A run directory written by ``privaterec train`` (neural model).
    news:
        The news records to encode (e.g. ``dataset.all_news()``), as accepted by
        :func:`~privaterec.data.features.build_news_features`.
    """
    from privaterec.data.features import build_news_features
    from privaterec.training.pipeline import load_run_model

    config, vocabs, model = load_run_model(run_dir)
    features = build_news_features(news, vocabs, title_len=config.model.title_len,
                                   abstract_len=config.model.abstract_len)
    vectors = encode_news_table(model, features, batch_size=batch_size, progress=progress)
    return RankerNews(model, features, vectors, config.model.history_len)


# -------------------------------------------------------------------------------- objective
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
        model = self.model
        context = model.context(vectors, mask)
        if candidates is None:
            return context
        assert channel_ids is not None and quotas is not None and weights is not None
        interests = model.interests(context, channel_ids)
        n, c, d = candidates.shape
        if not model.use_bie:  # no-BIE ablation: r_i scored directly
            logits = unified_score(interests, quotas.to(interests.dtype),
                                   candidates.reshape(1, n * c, d)).reshape(n, c)
            losses = F.cross_entropy(logits, torch.zeros(n, dtype=torch.long),
                                     reduction="none")
            return (losses * weights).sum() / weights.sum()
        scores = model.interest.decompose(interests)
        scores = perturb_scores(scores, clip=model.clip if score_clip else None,
                                generator=None)
        if score_noise is not None:
            scores = scores + score_noise
        protected = model.interest.aggregate(model.weights(scores))  # [1, M, d]
        logits = unified_score(protected, quotas.to(protected.dtype),
                               candidates.reshape(1, n * c, d)).reshape(n, c)
        losses = F.cross_entropy(logits, torch.zeros(n, dtype=torch.long), reduction="none")
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


class RecallObjective:
    """Loss and gradients of the recall model's parameters θ ∈ R^D over fixed news vectors.

    Parameters
    ----------
    model:
        The recall model (architecture + initial θ); put in eval mode.
    news_vectors:
        ``Tensor[N, d]`` news vectors of the table rows that histories and samples index.
    pool_rows:
        ``LongTensor[P]`` rows negatives are drawn from with ``negative_source="pool"``
        (default: every row but row 0, the anonymous news).
    """

    def __init__(self, model: UniFedRecRecall, news_vectors: Tensor, *,
                 pool_rows: Tensor | None = None) -> None:
        if news_vectors.ndim != 2 or news_vectors.shape[1] != model.dim:
            raise ConfigError(f"news_vectors must be [N, d={model.dim}] (the recall model's "
                              f"dim), got {tuple(news_vectors.shape)}")
        if not bool(torch.isfinite(news_vectors).all()):
            raise ConfigError("news_vectors contain NaN or inf")
        model.eval()
        self.model = model
        self.news_vectors = news_vectors.detach().float()
        n = news_vectors.shape[0]
        pool = torch.arange(1, n) if pool_rows is None else torch.as_tensor(pool_rows).long()
        if pool.ndim != 1 or pool.numel() < 2 or bool((pool < 0).any() | (pool >= n).any()):
            raise ConfigError(f"pool_rows must be >= 2 distinct rows in [0, {n}) of the news "
                              f"table, got {pool.numel()} rows")
        self.pool_rows = pool
        self._loss = _RecallLoss(model)
        self.spec = ParamSpec.of(self._loss)
        trainable = set(self.spec.names)
        self._frozen = {k: v.detach() for k, v in [*self._loss.named_parameters(),
                                                   *self._loss.named_buffers()]
                        if k not in trainable}

    @property
    def dimension(self) -> int:
        """D, the number of uploaded coordinates."""
        return self.spec.dimension

    @property
    def score_shape(self) -> tuple[int, int]:
        """(M, B): channel slots × basic interests."""
        return (self.model.max_channels, self.model.num_basis)

    def parameters(self) -> Tensor:
        """The model's current θ ``[D]``."""
        params = dict(self._loss.named_parameters())
        return self.spec.flatten({n: params[n].detach() for n in self.spec.names})

    def load(self, flat: Tensor) -> None:
        """Copy θ ``[D]`` into the model."""
        params = dict(self._loss.named_parameters())
        with torch.no_grad():
            for name, value in self.spec.unflatten(flat).items():
                params[name].copy_(value)

    def _call(self, flat: Tensor, *args: Any) -> Tensor:
        return functional_call(self._loss, {**self._frozen, **self.spec.unflatten(flat)}, args)

    @torch.no_grad()
    def channels(self, flat: Tensor, history: Tensor, mask: Tensor) -> ChannelBatch:
        """Interest channels under θ of histories ``LongTensor[b, H]`` (rows), ``[b, H]``."""
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

    def client_gradient(self, flat: Tensor, inputs: RecallClientInputs, *,
                        score_clip: bool = True) -> tuple[Tensor, float]:
        """∇θ of one client's loss ``[D]`` and the loss (no ``vmap``: the reference)."""
        batch = self.channels(flat, inputs.history[None], inputs.history_mask[None])
        weights = torch.ones(inputs.candidates.shape[0])
        g, loss = grad_and_value(self.client_loss)(
            flat, inputs.history, inputs.history_mask, batch.channel_ids[0], batch.quotas[0],
            inputs.candidates, weights, inputs.score_noise, score_clip)
        return g, float(loss)

    def client_gradients(self, flat: Tensor, inputs: Sequence[RecallClientInputs], *,
                         chunk_clients: int = 16,
                         score_clip: bool = True) -> tuple[Tensor, Tensor]:
        """Per-client gradients ``[m, D]`` and losses ``[m]``, ``vmap(grad)`` over chunks.

        Clients of a chunk are padded to its largest number of samples (weight 0, row 0).
        """
        m = len(inputs)
        grads = torch.empty(m, self.dimension)
        losses = torch.empty(m)
        with_noise = inputs[0].score_noise is not None if m else False
        fn = vmap(grad_and_value(self.client_loss),
                  in_dims=(None, 0, 0, 0, 0, 0, 0, 0 if with_noise else None, None))
        for lo in range(0, m, chunk_clients):
            part = inputs[lo: lo + chunk_clients]
            history = torch.stack([x.history for x in part])
            mask = torch.stack([x.history_mask for x in part])
            batch = self.channels(flat, history, mask)
            width = max(x.candidates.shape[0] for x in part)
            cands = torch.zeros(len(part), width, part[0].candidates.shape[1], dtype=torch.long)
            weights = torch.zeros(len(part), width)
            for i, x in enumerate(part):
                cands[i, : x.candidates.shape[0]] = x.candidates
                weights[i, : x.candidates.shape[0]] = 1.0
            noise = torch.stack([x.score_noise for x in part]) if with_noise else None
            g, loss = fn(flat, history, mask, batch.channel_ids, batch.quotas, cands, weights,
                         noise, score_clip)
            grads[lo: lo + len(part)], losses[lo: lo + len(part)] = g, loss
        return grads, losses


# ----------------------------------------------------------------------------- client side
def recall_client_inputs(objective: RecallObjective, data: ClientData,
                         config: RecallTrainConfig, *,
                         generator: torch.Generator) -> RecallClientInputs:
    """Steps 1-3 of a client round, in this order on ``generator``: the sample subset, the
    negatives, the score noise (module docstring)."""
    n = data.num_samples
    if n == 0:
        raise ValueError(f"client {data.user_id!r} has no training click")
    if n > config.max_samples:
        chosen = torch.randperm(n, generator=generator)[: config.max_samples].sort().values
    else:
        chosen = torch.arange(n)
    positives = data.positives[chosen]
    if config.negative_source == "impression":
        candidates = draw_candidates(positives, data.negatives[chosen],
                                     data.negative_counts[chosen],
                                     negatives=config.negatives, generator=generator)
    else:
        pool = objective.pool_rows
        idx = torch.randint(0, pool.numel(), (positives.shape[0], config.negatives),
                            generator=generator)
        rows = pool[idx]
        rows = torch.where(rows == positives[:, None], pool[(idx + 1) % pool.numel()], rows)
        candidates = torch.cat([positives[:, None], rows], dim=1)
    noise = None
    if config.score_noise and objective.model.noise_scale > 0:
        noise = laplace_noise(objective.score_shape, scale=objective.model.noise_scale,
                              generator=generator)
    return RecallClientInputs(data.history, data.history_mask, candidates, noise)


def privatize_recall(updates: Tensor, config: RecallTrainConfig,
                     generators: Sequence[torch.Generator]) -> tuple[Tensor, PrivacyEvent]:
    """Eq. 8 for a batch of uploads: clip each row, add Laplace(λ_g) from its own generator.

    Parameters
    ----------
    updates:
        ``Tensor[m, D]``, row i = client i's gradient.
    config:
        ``clipping``, ``clip`` (θ), ``noise_scale`` (λ_g).
    generators:
        One per row.

    Returns
    -------
    (``Tensor[m, D]`` uploads, the event of ONE upload: :meth:`RecallTrainConfig.upload_event`)
    """
    if len(generators) != updates.shape[0]:
        raise ValueError(f"need one generator per client: {len(generators)} for "
                         f"{updates.shape[0]} updates")
    event = config.upload_event(int(updates.shape[1]))
    if config.clipping == "none":
        return updates, event
    clipped = (clip_l1(updates, config.clip, dim=-1) if config.clipping == "l1"
               else clip_elementwise(updates, config.clip))
    if config.noise_scale == 0:
        return clipped, event
    return clipped + laplace_noise(clipped.shape, scale=config.noise_scale,
                                   generator=list(generators), dtype=clipped.dtype), event


def recall_client_update(objective: RecallObjective, params: Tensor, data: ClientData,
                         config: RecallTrainConfig, *,
                         generator: torch.Generator) -> ClientUpdate:
    """One client's upload in one round (Uni-FedRec §3.5, Eq. 8): a pure function of
    (θ, the client's data, the config, its generator).

    Parameters
    ----------
    objective:
        The recall model architecture and the news vectors (public).
    params:
        The global θ ``[D]``.
    data:
        The client's history and training clicks (never leaves the device).
    config:
        Sampling, clipping and noise settings.
    generator:
        The client's only source of randomness (steps 1-3, then the gradient noise).

    Returns
    -------
    :class:`~privaterec.fed.client.ClientUpdate`: payload ``[D]`` (clipped + noised gradient),
    ``num_examples`` = clicks used (the aggregation weight |B_u|, Eq. 9), one privacy event,
    ``metrics["loss"]``.
    """
    inputs = recall_client_inputs(objective, data, config, generator=generator)
    g, loss = objective.client_gradient(params, inputs, score_clip=config.score_clip)
    released, event = privatize_recall(g[None], config, [generator])
    n = int(inputs.candidates.shape[0])
    private = event.is_private
    # A private upload's count and loss stay on the device; the server weighs clients equally.
    return ClientUpdate(payload=released[0], num_examples=n, privacy_events=(event,),
                        metrics={"loss": loss}, weight=1.0 if private else float(n),
                        sends_metadata=not private)


def recall_round(objective: RecallObjective, params: Tensor, clients: ClientDataset,
                 selected: Sequence[int], config: RecallTrainConfig, *, seed: int,
                 round_index: int) -> RoundResult:
    """All uploads of one round, vectorized; equals one :func:`recall_client_update` per
    client followed by :func:`~privaterec.fed.strategies.aggregate` (up to float rounding)."""
    generators = [client_generator(seed, round_index, u) for u in selected]
    inputs = [recall_client_inputs(objective, clients.client(u), config, generator=g)
              for u, g in zip(selected, generators)]
    grads, losses = objective.client_gradients(params, inputs,
                                               chunk_clients=config.chunk_clients,
                                               score_clip=config.score_clip)
    released, event = privatize_recall(grads, config, generators)
    counts = torch.tensor([x.candidates.shape[0] for x in inputs])
    weights = torch.ones_like(counts) if event.is_private else counts
    return RoundResult(weighted_mean(released, weights), counts.tolist(),
                       [float(x) for x in losses], [(event,)] * len(selected))


# ------------------------------------------------------------------------------- training
def _check_resumable(saved: dict[str, Any], config: RecallTrainConfig, seed: int,
                     dimension: int, path: Path) -> None:
    if saved.get("kind") != CHECKPOINT_KIND:
        raise CheckpointError(f"{path}: not a recall-model checkpoint (kind "
                              f"{saved.get('kind')!r}); use another --out path")
    if tuple(saved["params"].shape) != (dimension,):
        raise CheckpointError(f"{path}: holds {tuple(saved['params'].shape)} parameters, the "
                              f"recall model has ({dimension},); use another --out path")
    old = saved.get("config", {})
    new = dataclasses.asdict(config)
    changed = [k for k in _RESULT_FIELDS if old.get(k) != new[k]]
    if saved.get("seed") != seed:
        changed.insert(0, "seed")
    if changed:
        raise CheckpointError(f"{path}: cannot resume with different {', '.join(changed)}; "
                              f"use the checkpoint's settings or another --out path")


def train_recall(model: UniFedRecRecall, news_vectors: Tensor, clients: ClientDataset,
                 config: RecallTrainConfig, *, seed: int, pool_rows: Tensor | None = None,
                 checkpoint_path: str | Path | None = None, progress: bool = True,
                 on_round: Callable[[int, FederatedState], dict[str, Any] | None] | None = None,
                 stop_after_rounds: int | None = None) -> FederatedState:
    """Federated LDP training of the recall model (Uni-FedRec §3.5); resumable.

    Parameters
    ----------
    model:
        The recall model; its parameters are the initial θ, and the final θ is loaded in it.
    news_vectors:
        ``Tensor[N, d]`` fixed news vectors of the table rows (:func:`encode_news_table`).
    clients:
        Training users: histories and train-split clicks as table rows
        (:func:`~privaterec.data.clients.build_client_dataset`). Users without a click are
        never sampled.
    config:
        Rounds, sampling, optimiser, clipping and noise.
    seed:
        The run's seed: client sampling of round t and client u's draws in round t are
        functions of (seed, t) and (seed, t, u) only (:mod:`privaterec.fed.rng`).
    pool_rows:
        Pool for ``negative_source="pool"`` (default: all rows but row 0).
    checkpoint_path:
        Saved every ``config.checkpoint_every`` rounds and at the end (θ, strategy state,
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
    :class:`~privaterec.fed.simulator.FederatedState` (the engine's loop runs the rounds;
    ``ledger`` holds one event per user per round it took part in).
    """
    objective = RecallObjective(model, news_vectors, pool_rows=pool_rows)
    path = None if checkpoint_path is None else Path(checkpoint_path)
    if path is not None and path.exists():
        _check_resumable(load_checkpoint(path), config, seed, objective.dimension, path)
    if len(eligible_clients(clients)) == 0:
        raise ConfigError("no client has a training click: nothing to train the recall model "
                          "on (check the training split's labels)")
    fed = FedConfig(rounds=config.rounds, client_fraction=config.client_fraction,
                    clients_per_round=config.clients_per_round,
                    chunk_clients=config.chunk_clients,
                    checkpoint_every=config.checkpoint_every,
                    eval_every=0 if on_round is None else 1)

    def round_fn(params: Tensor, selected: list[int], t: int) -> RoundResult:
        return recall_round(objective, params, clients, selected, config, seed=seed,
                            round_index=t)

    return train_federated(
        objective, clients, fed, _RECALL_METHOD, config.strategy_object(),  # type: ignore[arg-type]
        seed=seed, round_fn=round_fn, checkpoint_path=path, on_evaluate=on_round,
        progress=progress, stop_after_rounds=stop_after_rounds,
        checkpoint_extra={"kind": CHECKPOINT_KIND, "config": dataclasses.asdict(config),
                          "seed": seed})


@dataclass(frozen=True)
class _RecallClients:
    """What the federated loop needs to know of the recall clients' method: its name, and
    that its clients are sampled per round (no central DP)."""

    name: str = "unifedrec"
    is_central: bool = False
    is_privaterec: bool = False
    sampling_rate: float | None = None


_RECALL_METHOD = _RecallClients()


__all__ = ["CHECKPOINT_KIND", "RankerNews", "RecallClientInputs", "RecallObjective",
           "RecallTrainConfig", "encode_news_table", "load_ranker_news",
           "privatize_recall", "recall_client_inputs", "recall_client_update", "recall_round",
           "train_recall"]
