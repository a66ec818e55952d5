"""Frozen, validated configuration dataclasses, loadable from and savable to YAML.

A run is described by one :class:`RunConfig` made of a :class:`ModelConfig` (what is trained)
and a :class:`TrainConfig` (how). Every value is checked on construction; an invalid value
raises :class:`privaterec.errors.ConfigError` naming the parameter and the accepted range.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping, TypeVar, get_args

import yaml

from privaterec.errors import ConfigError
from privaterec.validators import check as _check
from privaterec.validators import check_adaptive_clip
from privaterec.validators import check_choice as _check_choice
from privaterec.validators import check_positive as _check_positive

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

D = TypeVar("D", bound="DataclassInstance")

# Choice fields: each Literal alias is the field's type, its values the accepted choices.
NewsEncoder = Literal["nrms", "naml", "fednewsrec", "plm", "id"]
UserEncoder = Literal["nrms", "naml", "lstur", "fednewsrec"]
Embeddings = Literal["random", "glove50", "minilm"]
FederatedMethod = Literal["fedrec", "fednewsrec", "dp-fedrec", "privaterec", "dp-fedavg"]
Method = Literal["centralized", "popularity", "fedrec", "fednewsrec", "dp-fedrec",
                 "privaterec", "dp-fedavg"]
PrivacyMode = Literal["paper", "strict"]
SensitivityMode = Literal["true", "paper"]
ServingKind = Literal["none", "privaterec", "vdp", "local"]
Strategy = Literal["sgd", "fedavg", "fedadam"]
NoiseKind = Literal["laplace", "gaussian"]
Engine = Literal["simulator", "flower"]
BasisAttention = Literal["dot", "centered"]
SecureAggregation = Literal["none", "secaggplus"]
NoisePlacement = Literal["central", "distributed"]

NEWS_ENCODERS: tuple[NewsEncoder, ...] = get_args(NewsEncoder)
USER_ENCODERS: tuple[UserEncoder, ...] = get_args(UserEncoder)
EMBEDDINGS: tuple[Embeddings, ...] = get_args(Embeddings)
# Size of the word vectors each embedding kind brings (random vectors: ``word_dim``).
PRETRAINED_WORD_DIM: dict[Embeddings, int] = {"glove50": 50, "minilm": 384}
DEFAULT_RANDOM_WORD_DIM = 64
FEDERATED_METHODS: tuple[FederatedMethod, ...] = get_args(FederatedMethod)
PRIVACY_MODES: tuple[PrivacyMode, ...] = get_args(PrivacyMode)
SENSITIVITY_MODES: tuple[SensitivityMode, ...] = get_args(SensitivityMode)
SERVING_KINDS: tuple[ServingKind, ...] = get_args(ServingKind)
METHODS: tuple[Method, ...] = get_args(Method)
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)
NOISE_KINDS: tuple[NoiseKind, ...] = get_args(NoiseKind)
ENGINES: tuple[Engine, ...] = get_args(Engine)
BASIS_ATTENTION_KINDS: tuple[BasisAttention, ...] = get_args(BasisAttention)
SECURE_AGGREGATIONS: tuple[SecureAggregation, ...] = get_args(SecureAggregation)
NOISE_PLACEMENTS: tuple[NoisePlacement, ...] = get_args(NoisePlacement)

# The user encoder each news model pairs with when --user-encoder is not given.
DEFAULT_USER_ENCODER: dict[NewsEncoder, UserEncoder] = {
    "nrms": "nrms", "naml": "naml", "fednewsrec": "fednewsrec", "plm": "nrms", "id": "nrms"}


MIN_BASIS = 2
BASIS_RULE = ("B, the number of PrivateRec's basic vectors, is an integer >= 2 (alpha is a "
              "softmax over the B vectors: with B = 1 it is always 1 and carries nothing)")
"""The one rule for B (``ModelConfig.basis_size``, ``train --basis``, ``privacy calibrate
--basis``)."""


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of the news recommender (DESIGN §3).

    ``news_dim`` = ``num_heads * head_dim`` is the size d of news and user vectors for the
    attention-based encoders; CNN-based encoders project to the same d. ``word_dim`` is only
    set for ``random`` embeddings (default 64); pre-trained embeddings bring their own size
    (``glove50``: 50, ``minilm``: 384) and a conflicting ``word_dim`` is an error, so a saved
    configuration always states the size the model really has.

    ``basis_attention`` and ``basis_scale`` shape PrivateRec's α when ``basis_size`` > 0:
    ``centered`` (default), softmax(s·cos(u − c, bᵢ)) with s = ``basis_scale``, or ``dot``,
    softmax(u·bᵀ/√d) as published (Alg. 2 line 7), which collapses (docs/privaterec.md,
    "Collapse of the basis attention").
    """

    news_encoder: NewsEncoder = "nrms"
    user_encoder: UserEncoder | None = None
    embeddings: Embeddings = "random"
    word_dim: int | None = None
    freeze_embeddings: bool = True
    num_heads: int = 8
    head_dim: int = 16
    attention_dim: int = 64
    cnn_filters: int = 128
    cnn_window: int = 3
    gru_dim: int = 128
    short_term_len: int = 20
    category_dim: int = 32
    title_len: int = 16
    abstract_len: int = 32
    history_len: int = 50
    dropout: float = 0.2
    plm_trainable_layers: int = 1
    min_word_count: int = 1
    basis_size: int = 0
    basis_attention: BasisAttention = "centered"
    basis_scale: float = 5.0

    def __post_init__(self) -> None:
        _check_choice(self.news_encoder, "news_encoder", NEWS_ENCODERS)
        _check_choice(self.basis_attention, "basis_attention", BASIS_ATTENTION_KINDS)
        _check_positive(self.basis_scale, "basis_scale")
        if self.user_encoder is not None:
            _check_choice(self.user_encoder, "user_encoder", USER_ENCODERS)
        _check_choice(self.embeddings, "embeddings", EMBEDDINGS)
        if self.word_dim is not None:
            _check(isinstance(self.word_dim, int) and self.word_dim > 0, "word_dim",
                   f"got {self.word_dim!r}, expected a positive integer")
        if self.word_dim is not None and self.embeddings in PRETRAINED_WORD_DIM:
            _check(self.word_dim == PRETRAINED_WORD_DIM[self.embeddings], "word_dim",
                   f"got {self.word_dim!r}, but embeddings={self.embeddings!r} has "
                   f"{PRETRAINED_WORD_DIM[self.embeddings]}-d vectors; omit word_dim")
        for name in ("num_heads", "head_dim", "attention_dim", "cnn_filters",
                     "cnn_window", "gru_dim", "short_term_len", "category_dim", "title_len",
                     "abstract_len", "history_len", "min_word_count"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value > 0, name,
                   f"got {value!r}, expected a positive integer")
        _check(0.0 <= self.dropout < 1.0, "dropout", f"got {self.dropout!r}, expected 0 <= p < 1")
        _check(isinstance(self.basis_size, int)
               and (self.basis_size == 0 or self.basis_size >= MIN_BASIS), "basis_size",
               f"got {self.basis_size!r}; {BASIS_RULE}, or 0 (unset: no basic vectors, "
               f"and --method privaterec uses 5)")
        _check(self.plm_trainable_layers >= 0, "plm_trainable_layers",
               f"got {self.plm_trainable_layers!r}, expected >= 0")

    @property
    def resolved_word_dim(self) -> int:
        """Size of the word vectors the model uses."""
        if self.embeddings in PRETRAINED_WORD_DIM:
            return PRETRAINED_WORD_DIM[self.embeddings]
        return DEFAULT_RANDOM_WORD_DIM if self.word_dim is None else self.word_dim

    @property
    def news_dim(self) -> int:
        """Size d of news and user vectors."""
        return self.num_heads * self.head_dim

    @property
    def resolved_user_encoder(self) -> UserEncoder:
        """The user encoder, defaulting to the one paired with the news encoder."""
        return self.user_encoder or DEFAULT_USER_ENCODER[self.news_encoder]


@dataclass(frozen=True)
class TrainConfig:
    """How a model is trained: method, optimisation and sampling.

    ``plm_lr`` is the step size of the fine-tuned MiniLM layers of the ``plm`` news encoder
    wherever the optimiser is Adam-like (centralized Adam, the FedAdam server step), in place
    of ``lr`` / ``fed.server_lr``: Adam moves every coordinate by about its lr per step, and
    steps of 5e-3 wreck the pre-trained layer (centralized test AUC 0.512, docs/privaterec.md).
    """

    method: Method = "centralized"
    epochs: int = 3
    lr: float = 5e-3
    plm_lr: float = 3e-5
    batch_size: int = 32
    negatives: int = 4
    seed: int = 0
    eval_batch_size: int = 256
    max_grad_norm: float | None = None

    def __post_init__(self) -> None:
        _check_choice(self.method, "method", METHODS)
        _check(isinstance(self.epochs, int) and self.epochs >= 0, "epochs",
               f"got {self.epochs!r}, expected an integer >= 0")
        _check_positive(self.lr, "lr")
        _check_positive(self.plm_lr, "plm_lr")
        for name in ("batch_size", "negatives", "eval_batch_size"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value > 0, name,
                   f"got {value!r}, expected a positive integer")
        _check(isinstance(self.seed, int), "seed", f"got {self.seed!r}, expected an integer")
        if self.max_grad_norm is not None:
            _check_positive(self.max_grad_norm, "max_grad_norm")


@dataclass(frozen=True)
class FedConfig:
    """Federated training (DESIGN §3; FedNewsRec §3.2, PrivateRec Alg. 3).

    ``None`` means "the method's default" (:func:`privaterec.fed.methods.resolve_run_config`
    fills them in before a run starts, so a saved ``config.yaml`` states every value used).

    Attributes
    ----------
    rounds: T communication rounds.
    client_fraction: r, the fraction of training users sampled per round (without
        replacement); ``clients_per_round`` overrides it with an absolute number.
    strategy: ``sgd`` (FedNewsRec Eq. 6-7), ``fedavg`` (E = ``local_steps`` local SGD steps at
        ``local_lr``) or ``fedadam`` (Reddi et al. 2020, Alg. 2). server_lr: η of the server.
    adam_beta1, adam_beta2, adam_tau: FedAdam's β₁, β₂ and adaptivity τ (None: the method's
        default, 1e-6; dp-fedrec 1e-10, far below the per-coordinate size of its clipped
        updates, θ/D ≈ 5e-8, which τ = 1e-6 froze near AUC 0.53 at ε = ∞; BENCHMARKS.md).
    clip: δ of FedNewsRec's element-wise clipping or θ of DP-FedRec's (and Uni-FedRec's)
        norm clipping.
    noise_scale: λ of FedNewsRec's Laplace noise (λ_g of Uni-FedRec's; 0: no noise).
    epsilon_train, delta_train: DP-FedRec's per-round budget of one client's update (ε = inf:
        no noise). noise: ``laplace`` (L1 clipping) or ``gaussian`` (L2, analytic calibration).
    max_client_samples: a client uses at most this many of its samples per round (drawn
        with its own generator).
    chunk_clients: clients per vectorized chunk when per-client gradients are needed.
    eval_every: evaluate on the test split every N rounds (0: only at the end).
    checkpoint_every: checkpoint every N rounds.
    report_delta: target δ of the privacy report's composed ε.
    engine: ``simulator`` (vectorized, in process) or ``flower``.
    padding_p: PrivateRec's behaviour padding probability p (Alg. 2; None: 0.5).
    privacy_mode: PrivateRec's ``paper`` (Alg. 3 as published: the history-path gradient is
        uploaded raw and is not covered) or ``strict`` (that gradient is clipped to ``clip``
        and noised too, DESIGN §4 erratum 4).
    sensitivity_mode: DPA's ``true`` simplex sensitivity, or ``paper`` (S = 1, NOT a valid
        guarantee; reproduction only).
    history_budget: strict mode's share of ε_t (and δ_t) spent on the history-path gradient;
        DPA gets the rest, so one round's upload is (ε_t, δ_t)-DP for the history.
    noise_multiplier: ``dp-fedavg`` (central, user-level DP): z, the Gaussian noise on the sum
        of the clipped updates has standard deviation z·``clip``.
    target_epsilon: ``dp-fedavg``: the user-level ε of the whole run; z is calibrated from it
        (with ``client_fraction`` as the Poisson sampling rate q and ``rounds``).
    target_delta: ``dp-fedavg``: δ of the run's guarantee (default 1e-5; it must be below
        1/N for N training users).
    adaptive_clip_quantile, clip_lr, clip_count_stddev: ``dp-fedavg``'s adaptive clipping
        (Andrew et al., NeurIPS 2021), one group: the clip starts at ``clip`` and follows the
        quantile γ = ``adaptive_clip_quantile`` of the clients' update norms (None: a fixed
        clip), with geometric learning rate η_C = ``clip_lr`` (None: 0.2) and noise σ_b =
        ``clip_count_stddev`` on the count of unclipped clients (None: the expected clients
        per round / 20); the run's ε is unchanged (docs/privacy.md).
    secure_aggregation, noise_placement, max_dropouts: ``dp-fedavg`` on the Flower engine
        only (one group, :class:`~privaterec.fed.methods.central.CentralDP`'s fields):
        ``secaggplus`` sums the clipped updates with Flower's SecAgg+ so the server sees
        only the sum (``none``: it sees each one); the noise is added to the sum by the
        server (``central``) or in shares by the clients before masking (``distributed``);
        ``max_dropouts`` k: SecAgg+'s threshold is n − k, so a sum decodes only with at
        least n − k of the n sampled clients (and their noise shares) in it.
    """

    rounds: int = 100
    client_fraction: float | None = None
    clients_per_round: int | None = None
    strategy: Strategy | None = None
    server_lr: float | None = None
    adam_beta1: float = 0.9
    adam_beta2: float = 0.99
    adam_tau: float | None = None
    local_steps: int = 1
    local_lr: float = 0.05
    clip: float | None = None
    noise_scale: float | None = None
    epsilon_train: float = float("inf")
    delta_train: float = 1e-5
    noise: NoiseKind = "laplace"
    max_client_samples: int = 64
    chunk_clients: int = 16
    eval_every: int = 0
    checkpoint_every: int = 10
    report_delta: float = 1e-5
    engine: Engine = "simulator"
    padding_p: float | None = None
    privacy_mode: PrivacyMode = "paper"
    sensitivity_mode: SensitivityMode = "true"
    history_budget: float = 0.5
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    target_delta: float | None = None
    # dp-fedavg's adaptive clipping (one group; checked by validators.check_adaptive_clip)
    adaptive_clip_quantile: float | None = None
    clip_lr: float | None = None
    clip_count_stddev: float | None = None
    # dp-fedavg on Flower: secure aggregation (issue 15 item 2; fed/secagg.py).
    secure_aggregation: SecureAggregation = "none"
    noise_placement: NoisePlacement = "central"
    max_dropouts: int = 0

    def __post_init__(self) -> None:
        if self.padding_p is not None:
            _check(0 <= self.padding_p < 1, "padding_p",
                   f"got {self.padding_p!r}, expected a probability 0 <= p < 1")
        _check_choice(self.privacy_mode, "privacy_mode", PRIVACY_MODES)
        _check_choice(self.sensitivity_mode, "sensitivity_mode", SENSITIVITY_MODES)
        _check(0 < self.history_budget < 1, "history_budget",
               f"got {self.history_budget!r}, expected 0 < share < 1")
        for name in ("rounds", "local_steps", "max_client_samples", "chunk_clients",
                     "checkpoint_every"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value > 0, name,
                   f"got {value!r}, expected a positive integer")
        _check(isinstance(self.eval_every, int) and self.eval_every >= 0, "eval_every",
               f"got {self.eval_every!r}, expected an integer >= 0")
        if self.client_fraction is not None:
            _check(0 < self.client_fraction <= 1, "client_fraction",
                   f"got {self.client_fraction!r}, expected 0 < r <= 1")
        if self.clients_per_round is not None:
            _check(isinstance(self.clients_per_round, int) and self.clients_per_round > 0,
                   "clients_per_round",
                   f"got {self.clients_per_round!r}, expected a positive integer")
        if self.strategy is not None:
            _check_choice(self.strategy, "strategy", STRATEGIES)
        _check_choice(self.noise, "noise", NOISE_KINDS)
        _check_choice(self.engine, "engine", ENGINES)
        for name in ("server_lr", "clip"):
            if getattr(self, name) is not None:
                _check_positive(getattr(self, name), name)
        if self.noise_scale is not None:  # 0: no noise (Uni-FedRec's lambda_g = 0)
            _check(0 <= self.noise_scale < math.inf, "noise_scale",
                   f"got {self.noise_scale!r}, expected a finite number >= 0")
        _check_positive(self.local_lr, "local_lr")
        _check_positive(self.epsilon_train, "epsilon_train")
        _check(0 < self.delta_train < 1, "delta_train",
               f"got {self.delta_train!r}, expected 0 < delta < 1")
        _check(0 < self.report_delta < 1, "report_delta",
               f"got {self.report_delta!r}, expected 0 < delta < 1")
        _check(0 <= self.adam_beta1 < 1, "adam_beta1", f"got {self.adam_beta1!r}, expected [0, 1)")
        _check(0 <= self.adam_beta2 < 1, "adam_beta2", f"got {self.adam_beta2!r}, expected [0, 1)")
        if self.adam_tau is not None:
            _check_positive(self.adam_tau, "adam_tau")
        for name in ("noise_multiplier", "target_epsilon"):
            if getattr(self, name) is not None:
                _check_positive(getattr(self, name), name)
        _check_choice(self.secure_aggregation, "secure_aggregation", SECURE_AGGREGATIONS)
        _check_choice(self.noise_placement, "noise_placement", NOISE_PLACEMENTS)
        _check(isinstance(self.max_dropouts, int) and self.max_dropouts >= 0, "max_dropouts",
               f"got {self.max_dropouts!r}, expected an integer >= 0")
        if self.target_delta is not None:
            _check(0 < self.target_delta < 1, "target_delta",
                   f"got {self.target_delta!r}, expected 0 < delta < 1 (below 1/N)")
        check_adaptive_clip(adaptive_clip_quantile=self.adaptive_clip_quantile,
                            clip_lr=self.clip_lr, clip_count_stddev=self.clip_count_stddev)


@dataclass(frozen=True)
class RunConfig:
    """Everything needed to reproduce a run: data location, model and training."""

    data: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    fed: FedConfig = field(default_factory=FedConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def from_yaml(cls, path: str | Path) -> "RunConfig":
        return load_yaml_config(cls, path)


def load_yaml_config(cls: type[D], path: str | Path) -> D:
    """Build the frozen dataclass ``cls`` from the YAML file ``path`` (errors name the file)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    try:
        return from_mapping(cls, raw)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def from_mapping(cls: type[D], raw: Mapping[str, Any], prefix: str = "") -> D:
    """Build the frozen dataclass ``cls`` from a mapping, rejecting unknown keys.

    Nested dataclass fields are built recursively; ``prefix`` names the enclosing section in
    error messages (e.g. ``model.num_heads``).
    """
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown configuration key(s) {', '.join(prefix + k for k in unknown)}; "
            f"known keys are {', '.join(prefix + k for k in known)}")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for name, value in raw.items():
        hint = hints[name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            if not isinstance(value, Mapping):
                raise ConfigError(f"'{prefix}{name}' must be a mapping")
            kwargs[name] = from_mapping(hint, value, prefix=f"{prefix}{name}.")
        else:
            kwargs[name] = _coerce(value, hint, prefix + name)
    return cls(**kwargs)


def _coerce(value: Any, hint: Any, name: str) -> Any:
    """Check a YAML scalar against a type hint (ints are accepted for floats)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)  # Literal | None: Union
    allowed = typing.get_args(hint) if union else (hint,)
    if value is None and type(None) in allowed:
        return None
    for typ in allowed:
        if typing.get_origin(typ) is typing.Literal:
            if value in typing.get_args(typ):
                return value
            continue
        if typ is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if typ is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if typ in (str, bool) and isinstance(value, typ):
            return value
    expected = " or ".join(
        " or ".join(repr(a) for a in typing.get_args(t)) if typing.get_origin(t) is typing.Literal
        else getattr(t, "__name__", str(t)) for t in allowed)
    raise ConfigError(f"'{name}' must be {expected}, got {value!r}")


def replace(config: Any, **changes: Any) -> Any:
    """Return a copy of a frozen config with ``changes`` applied and validated."""
    return dataclasses.replace(config, **changes)
