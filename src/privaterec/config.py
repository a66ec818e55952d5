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
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, TypeVar, get_args

import yaml

from privaterec.errors import ConfigError
from privaterec.method_settings import (LEGACY_FLAT_KEYS, NOISE_KINDS, NOISE_PLACEMENTS,
                                        PRIVACY_MODES, RANKING_METHODS, SECURE_AGGREGATIONS,
                                        SENSITIVITY_MODES, SETTINGS, MethodSettings, NoiseKind,
                                        NoisePlacement, setting,
                                        PrivacyMode, SecureAggregation, SensitivityMode,
                                        settings_type)
from privaterec.validators import check as _check
from privaterec.validators import check_choice as _check_choice
from privaterec.validators import check_positive as _check_positive
from privaterec.validators import check_positive_int as _check_positive_int

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

D = TypeVar("D", bound="DataclassInstance")
S = TypeVar("S", bound=MethodSettings)

# Choice fields: each Literal alias is the field's type, its values the accepted choices.
UserEncoder = Literal["nrms", "naml", "lstur", "fednewsrec"]
Embeddings = Literal["random", "corpus", "glove50", "minilm"]
Strategy = Literal["sgd", "fedavg", "fedavgm", "fedadam"]
Engine = Literal["simulator", "flower"]
Evaluation = Literal["server", "federated"]
BasisAttention = Literal["dot", "centered"]

USER_ENCODERS: tuple[UserEncoder, ...] = get_args(UserEncoder)
EMBEDDINGS: tuple[Embeddings, ...] = get_args(Embeddings)
# Size of the word vectors each embedding kind brings (random and corpus vectors: ``word_dim``).
PRETRAINED_WORD_DIM: dict[Embeddings, int] = {"glove50": 50, "minilm": 384}
DEFAULT_RANDOM_WORD_DIM = 64
# Each news encoder with its default user encoder (builders: models/news_encoders.py).
DEFAULT_USER_ENCODER: dict[str, UserEncoder] = {
    "nrms": "nrms", "naml": "naml", "fednewsrec": "fednewsrec", "plm": "nrms", "id": "nrms"}
NEWS_ENCODERS: tuple[str, ...] = tuple(DEFAULT_USER_ENCODER)
FEDERATED_METHODS: tuple[str, ...] = RANKING_METHODS
"""The federated methods of a ranking run, from their declaration
(:data:`privaterec.method_settings.SETTINGS`)."""
METHODS: tuple[str, ...] = ("centralized", "popularity", *FEDERATED_METHODS)
"""``train.method``'s choices: the centralized baselines and the federated methods."""
if TYPE_CHECKING:
    NewsEncoder = str
    FederatedMethod = str
    Method = str
else:  # a Literal of the declared names: a config.yaml's value is checked against it
    NewsEncoder = Literal[NEWS_ENCODERS]
    FederatedMethod = Literal[FEDERATED_METHODS]
    Method = Literal[METHODS]
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)
ENGINES: tuple[Engine, ...] = get_args(Engine)
EVALUATIONS: tuple[Evaluation, ...] = get_args(Evaluation)
BASIS_ATTENTION_KINDS: tuple[BasisAttention, ...] = get_args(BasisAttention)


MIN_BASIS = 2
BASIS_RULE = ("B, the number of PrivateRec's basic vectors, is an integer >= 2 (alpha is a "
              "softmax over the B vectors: with B = 1 it is always 1 and carries nothing)")
"""The one rule for B (``ModelConfig.basis_size``, ``train --basis``, ``privacy calibrate
--basis``)."""


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of the news recommender (FedNewsRec §3.1; NRMS, NAML, LSTUR, PLM-NR).

    ``news_dim`` = ``num_heads * head_dim`` is the size d of news and user vectors for the
    attention-based encoders; CNN-based encoders project to the same d. ``word_dim`` is only
    set for ``random`` embeddings (default 64); pre-trained embeddings bring their own size
    (``glove50``: 50, ``minilm``: 384) and a conflicting ``word_dim`` is an error, so a saved
    configuration always states the size the model really has.

    ``embeddings``: ``random`` (frozen N(0, 0.1²)), ``corpus`` (PPMI-SVD vectors fitted on the
    training news' texts, public data: :mod:`privaterec.data.corpus_vectors`), ``glove50`` or
    ``minilm``; ``word_dim`` sizes ``random`` and ``corpus`` vectors.

    ``basis_attention`` and ``basis_scale`` shape PrivateRec's α when ``basis_size`` > 0:
    ``centered`` (default), softmax(s·cos(u − c, bᵢ)) with s = ``basis_scale``, or ``dot``,
    softmax(u·bᵀ/√d) as published (Alg. 2 line 7), which collapses (docs/privaterec.md,
    "Collapse of the basis attention").
    """

    news_encoder: NewsEncoder = setting("nrms", "news encoder", flag="--model")
    user_encoder: UserEncoder | None = setting(None, "user encoder (default: the news "
                                                     "encoder's own)")
    embeddings: Embeddings = setting("random", "word vectors")
    word_dim: int | None = setting(None, "size of the word vectors of --embeddings random or "
                                         "corpus (default 64; glove50 and minilm have their "
                                         "own)")
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
    history_len: int = setting(50, "H, clicks of a user's history used")
    dropout: float = 0.2
    plm_trainable_layers: int = setting(1, "plm: top MiniLM layers fine-tuned (default 1; "
                                           "0 = MiniLM frozen)", flag="--plm-layers")
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
            _check_positive_int(self.word_dim, "word_dim")
        if self.word_dim is not None and self.embeddings in PRETRAINED_WORD_DIM:
            _check(self.word_dim == PRETRAINED_WORD_DIM[self.embeddings], "word_dim",
                   f"got {self.word_dim!r}, but embeddings={self.embeddings!r} has "
                   f"{PRETRAINED_WORD_DIM[self.embeddings]}-d vectors; omit word_dim")
        for name in ("num_heads", "head_dim", "attention_dim", "cnn_filters",
                     "cnn_window", "gru_dim", "short_term_len", "category_dim", "title_len",
                     "abstract_len", "history_len", "min_word_count"):
            _check_positive_int(getattr(self, name), name)
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


MODEL_PRESETS: dict[str, dict[str, Any]] = {
    # NRMS at its published size (Wu et al., EMNLP 2019, and the MIND benchmark's NRMS): 300-d
    # word vectors (here fitted on the corpus: no download), 20 heads of 20 dimensions,
    # additive attention of 200, titles of 30 words. About 1.0M trainable parameters against
    # the default NRMS's 91k (8 heads of 16, 64-d random vectors, titles of 16).
    "nrms-published": {"news_encoder": "nrms", "user_encoder": "nrms",
                       "embeddings": "corpus", "word_dim": 300, "num_heads": 20,
                       "head_dim": 20, "attention_dim": 200, "title_len": 30},
}
"""Named model sizes (``train --preset NAME``): the :class:`ModelConfig` fields each sets;
flags given next to ``--preset`` override them."""


def model_preset(name: str, model: "ModelConfig | None" = None) -> "ModelConfig":
    """``model`` (default: the defaults) with the preset ``name``'s fields
    (:data:`MODEL_PRESETS`).

    Raises
    ------
    ConfigError
        If there is no such preset (the message lists them).
    """
    if name not in MODEL_PRESETS:
        raise ConfigError(f"invalid model preset {name!r}; expected one of "
                          f"{', '.join(sorted(MODEL_PRESETS))}")
    return replace(model or ModelConfig(), **MODEL_PRESETS[name])


@dataclass(frozen=True)
class TrainConfig:
    """How a model is trained: method, optimisation and sampling.

    ``plm_lr`` is the step size of the fine-tuned MiniLM layers of the ``plm`` news encoder
    wherever the optimiser is Adam-like (centralized Adam, the FedAdam server step), in place
    of ``lr`` / ``fed.server_lr``: Adam moves every coordinate by about its lr per step, and
    steps of 5e-3 wreck the pre-trained layer (centralized test AUC 0.512, docs/privaterec.md).
    """

    method: Method = "centralized"
    epochs: int = setting(3, "centralized: passes over the training samples")
    lr: float = setting(5e-3, "centralized: Adam learning rate")
    plm_lr: float = setting(3e-5, "plm: Adam step size of the fine-tuned MiniLM layers")
    batch_size: int = setting(32, "centralized: samples per step")
    negatives: int = 4
    seed: int = setting(0, "seed of every random draw")
    eval_batch_size: int = 256
    max_grad_norm: float | None = None

    def __post_init__(self) -> None:
        _check_choice(self.method, "method", METHODS)
        _check(isinstance(self.epochs, int) and self.epochs >= 0, "epochs",
               f"got {self.epochs!r}, expected an integer >= 0")
        _check_positive(self.lr, "lr")
        _check_positive(self.plm_lr, "plm_lr")
        for name in ("batch_size", "negatives", "eval_batch_size"):
            _check_positive_int(getattr(self, name), name)
        _check(isinstance(self.seed, int), "seed", f"got {self.seed!r}, expected an integer")
        if self.max_grad_norm is not None:
            _check_positive(self.max_grad_norm, "max_grad_norm")


@dataclass(frozen=True)
class FedConfig:
    """Federated training: the engine's settings and the method's own (FedNewsRec §3.2,
    PrivateRec Alg. 3).

    The engine's settings are the same for every method. What only one method has (its clip,
    its noise, its ε, ...) is in ``settings``, one of the classes of
    :mod:`privaterec.method_settings`. ``None`` in ``client_fraction``, ``strategy``,
    ``server_lr`` and ``adam_tau`` means "the method's default": each method class declares
    them (``server_defaults``), and :func:`privaterec.fed.methods.resolve_run_config` fills
    them in before a run starts, so a saved ``config.yaml`` states every value used.

    A field with a command-line flag is a :func:`~privaterec.method_settings.setting`
    (its help documents it).

    Attributes
    ----------
    strategy: ``sgd`` (FedNewsRec Eq. 6-7), ``fedavg`` (E = ``local_steps`` local SGD steps at
        ``local_lr``), ``fedavgm`` (FedAvg with server momentum ``server_momentum``; Hsu et
        al. 2019, the server optimiser of DP-FedAvg in McMahan et al. 2018) or ``fedadam``
        (Reddi et al. 2020, Alg. 2). server_lr: η of the server.
    server_momentum: β of ``fedavgm`` (heavy ball: m ← β m + ḡ, θ ← θ − η m).
    adam_beta1, adam_beta2, adam_tau: FedAdam's β₁, β₂ and adaptivity τ (None: the method's
        default, 1e-6; dp-fedrec 1e-10, far below the per-coordinate size of its clipped
        updates, θ/D ≈ 5e-8, which τ = 1e-6 froze near AUC 0.53 at ε = ∞; BENCHMARKS.md).
    max_client_samples: a client uses at most this many of its samples per round (drawn
        with its own generator).
    chunk_clients: clients per vectorized chunk when per-client gradients are needed.
    checkpoint_every: checkpoint every N rounds.
    report_delta: target δ of the privacy report's composed ε.
    evaluation: ``server``: the server evaluates on the test data it holds (the test split
        of a simulation, a deployed server's public or consented holdout, or nothing);
        ``federated``: the sampled devices evaluate on their own test impressions and
        release clipped, noised metric sums, accounted in the ledger every time
        (:mod:`privaterec.eval.federated`; docs/privacy.md#federated-evaluation), at every
        ``eval_every`` rounds and after the last round.
    eval_epsilon, eval_delta: (ε, δ) of one device's release in one federated evaluation
        (user-level; Gaussian noise).
    eval_clip: K, the most test impressions one user's release counts (L2 sensitivity
        K·√5; 1: each user's mean metrics).
    eval_fraction: probability that an enrolled device is asked in a federated evaluation.
    settings: the method's own settings (:mod:`privaterec.method_settings`; in YAML the
        ``fed.settings`` mapping). ``None`` only until a :class:`RunConfig` (or a Uni-FedRec
        run's configuration) fills in its method's defaults.
    """

    rounds: int = setting(100, "T communication rounds (default 100; unifedrec 200)")
    client_fraction: float | None = setting(
        None, "r, fraction of users sampled per round (default 0.02); dp-fedavg: q, each "
              "user's probability of joining a round (Poisson)")
    clients_per_round: int | None = setting(
        None, "sample exactly this many users per round (overrides r; not with dp-fedavg, "
              "whose accounting needs Poisson sampling)")
    strategy: Strategy | None = setting(
        None, "server optimiser (fednewsrec: sgd; fedrec, dp-fedrec, dp-fedavg: fedadam)")
    server_lr: float | None = setting(
        None, "server learning rate (sgd 0.5, fedavg 1.0, fedavgm 1.0, fedadam 1e-2)")
    server_momentum: float = setting(0.9, "beta of --strategy fedavgm (server momentum)")
    adam_beta1: float = 0.9
    adam_beta2: float = 0.99
    adam_tau: float | None = None
    local_steps: int = setting(1, "E local SGD steps per client (FedAvg; default 1 = FedSGD)")
    local_lr: float = setting(0.05, "clients' local SGD rate")
    max_client_samples: int = setting(64, "samples a client uses per round at most")
    chunk_clients: int = 16
    eval_every: int = setting(0, "evaluate on the test split every N rounds (0: at the end)")
    checkpoint_every: int = 10
    report_delta: float = 1e-5
    engine: Engine = setting("simulator", "simulator (vectorized, default) or flower")
    evaluation: Evaluation = setting(
        "server", "server: the server evaluates the test data it holds (default); federated: "
                  "sampled devices evaluate on their own test impressions and release "
                  "clipped, noised metric sums, each in the ledger "
                  "(docs/privacy.md#federated-evaluation)", flag="--eval")
    eval_epsilon: float = setting(1.0, "--eval federated: user-level epsilon of one "
                                       "device's release in one evaluation (Gaussian, "
                                       "delta 1e-6)")
    eval_delta: float = 1e-6
    eval_clip: float = setting(1.0, "--eval federated: K, test impressions one user's "
                                    "release counts at most (1: each user's mean metrics)")
    eval_fraction: float = setting(1.0, "--eval federated: probability that a device is "
                                        "asked")
    settings: MethodSettings | None = None

    def __post_init__(self) -> None:
        for name in ("rounds", "local_steps", "max_client_samples", "chunk_clients",
                     "checkpoint_every"):
            _check_positive_int(getattr(self, name), name)
        _check(isinstance(self.eval_every, int) and self.eval_every >= 0, "eval_every",
               f"got {self.eval_every!r}, expected an integer >= 0")
        if self.client_fraction is not None:
            _check(0 < self.client_fraction <= 1, "client_fraction",
                   f"got {self.client_fraction!r}, expected 0 < r <= 1")
        if self.clients_per_round is not None:
            _check_positive_int(self.clients_per_round, "clients_per_round")
        if self.strategy is not None:
            _check_choice(self.strategy, "strategy", STRATEGIES)
        _check_choice(self.engine, "engine", ENGINES)
        _check_choice(self.evaluation, "evaluation", EVALUATIONS)
        _check(isinstance(self.eval_epsilon, (int, float)) and 0 < self.eval_epsilon < math.inf,
               "eval_epsilon", f"got {self.eval_epsilon!r}, expected a finite number > 0")
        _check(isinstance(self.eval_delta, (int, float)) and 0 < self.eval_delta < 1,
               "eval_delta", f"got {self.eval_delta!r}, expected 0 < delta < 1")
        _check(isinstance(self.eval_clip, (int, float)) and 0 < self.eval_clip < math.inf,
               "eval_clip", f"got {self.eval_clip!r}, expected a finite number > 0")
        _check(isinstance(self.eval_fraction, (int, float)) and 0 < self.eval_fraction <= 1,
               "eval_fraction", f"got {self.eval_fraction!r}, expected 0 < q <= 1")
        if self.server_lr is not None:
            _check_positive(self.server_lr, "server_lr")
        _check_positive(self.local_lr, "local_lr")
        _check(0 < self.report_delta < 1, "report_delta",
               f"got {self.report_delta!r}, expected 0 < delta < 1")
        _check(0 <= self.server_momentum < 1, "server_momentum",
               f"got {self.server_momentum!r}, expected [0, 1)")
        _check(0 <= self.adam_beta1 < 1, "adam_beta1", f"got {self.adam_beta1!r}, expected [0, 1)")
        _check(0 <= self.adam_beta2 < 1, "adam_beta2", f"got {self.adam_beta2!r}, expected [0, 1)")
        if self.adam_tau is not None:
            _check_positive(self.adam_tau, "adam_tau")
        _check(self.settings is None or isinstance(self.settings, MethodSettings), "settings",
               f"got {self.settings!r}, expected a method's settings "
               f"(privaterec.method_settings)")

    def settings_as(self, kind: type[S]) -> S:
        """``settings``, checked to be a ``kind`` (the settings a method class reads).

        Raises
        ------
        ConfigError
            If ``settings`` are another method's (or not filled in).
        """
        if not isinstance(self.settings, kind):
            have = "none" if self.settings is None else f"{self.settings.method}'s"
            raise ConfigError(f"'fed.settings' are {have}, expected {kind.method}'s "
                              f"({kind.__name__})")
        return self.settings


@dataclass(frozen=True)
class RunConfig:
    """Everything needed to reproduce a run: data location, model and training.

    A federated method's settings (``fed.settings``) are of that method's class
    (:func:`privaterec.method_settings.settings_type`); left at ``None`` they become the
    method's defaults here, on construction.
    """

    data: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    fed: FedConfig = field(default_factory=FedConfig)

    def __post_init__(self) -> None:
        method = self.train.method
        if method not in FEDERATED_METHODS:
            return  # a centralized run reads no federated setting
        kind = settings_type(method)
        if self.fed.settings is None:
            object.__setattr__(self, "fed", dataclasses.replace(self.fed, settings=kind()))
        elif type(self.fed.settings) is not kind:
            raise ConfigError(f"'fed.settings' are {self.fed.settings.method}'s, but "
                              f"train.method is {method!r}: give {method}'s settings "
                              f"({kind.__name__}, keys {', '.join(kind.field_names()) or 'none'})")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "RunConfig":
        """Build from a mapping (a parsed ``config.yaml``): ``fed.settings`` are read as the
        settings of ``train.method``; a ``fed`` mapping with the flat keys of earlier versions
        is read by :func:`fed_from_mapping`'s legacy reader."""
        rest = {k: v for k, v in raw.items() if k != "fed"}
        model = rest.get("model")
        if isinstance(model, Mapping) and _saved_before_basis_attention(model):
            rest["model"] = {**model, "basis_attention": "dot"}
        kwargs = mapping_kwargs(cls, rest)
        train = kwargs.get("train", TrainConfig())
        kwargs["fed"] = fed_from_mapping(train.method, _section(raw, "fed"), prefix="fed.")
        return cls(**kwargs)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "RunConfig":
        return load_yaml_config(cls, path, build=cls.from_dict)


_ATTENTION_KEYS = frozenset({"basis_attention", "basis_scale"})


def _saved_before_basis_attention(model: Mapping[str, Any]) -> bool:
    """A ``model`` section saved by a version before ``basis_attention`` existed: it states
    every other :class:`ModelConfig` field (a saved configuration states them all) and not
    these two. Such a run was trained with the published dot-product attention, the only
    one then; a hand-written partial section gets the current default."""
    names = {f.name for f in fields(ModelConfig)}
    return names - set(model) == _ATTENTION_KEYS and bool(model.get("basis_size"))


def _section(raw: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = raw.get(name)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"'{name}' must be a mapping")
    return value


def load_yaml_config(cls: type[D], path: str | Path,
                     build: Callable[[Mapping[str, Any]], D] | None = None) -> D:
    """Build the frozen dataclass ``cls`` from the YAML file ``path`` (errors name the file);
    ``build`` turns the parsed mapping into ``cls`` (default :func:`from_mapping`)."""
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
        return build(raw) if build is not None else from_mapping(cls, raw)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def from_mapping(cls: type[D], raw: Mapping[str, Any], prefix: str = "") -> D:
    """Build the frozen dataclass ``cls`` from a mapping, rejecting unknown keys.

    Nested dataclass fields are built recursively; ``prefix`` names the enclosing section in
    error messages (e.g. ``model.num_heads``).
    """
    return cls(**mapping_kwargs(cls, raw, prefix))


def mapping_kwargs(cls: type[D], raw: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The keyword arguments of ``cls`` that ``raw`` gives, checked and converted
    (:func:`from_mapping` without the construction)."""
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
    return kwargs


_ENGINE_KEYS = tuple(f.name for f in fields(FedConfig) if f.name != "settings")


def fed_from_mapping(method: str, raw: Mapping[str, Any], *, prefix: str = "fed.") -> FedConfig:
    """The :class:`FedConfig` of a run of ``method`` from its ``fed`` mapping.

    The engine's keys are :class:`FedConfig`'s fields; ``settings`` is a mapping of the
    method's own settings (:func:`~privaterec.method_settings.settings_type`). A run of a
    method that is not federated has no settings.

    Legacy format: files written before the settings were per method (a flat FedConfig, e.g.
    ``fed: {clip: 0.005, noise_scale: null, epsilon_train: .inf, ...}``) are still read. Their
    flat method keys (:data:`~privaterec.method_settings.LEGACY_FLAT_KEYS`) become the
    method's settings: a key the method has is kept unless it is null (a default left
    unfilled), a key it does not have is dropped. The code that wrote such a file either
    refused those keys or ignored them, so the run used none of them.

    Raises
    ------
    ConfigError
        Naming the key (with ``prefix``): an unknown engine key, a setting the method does not
        have, an invalid value, or flat and ``settings`` keys mixed.
    """
    raw = dict(raw)
    settings_raw = raw.pop("settings", None)
    legacy: dict[str, Any] = {}
    if set(raw) & LEGACY_FLAT_KEYS:
        legacy = {k: raw.pop(k) for k in sorted(set(raw) - set(_ENGINE_KEYS))}
    fed = from_mapping(FedConfig, raw, prefix=prefix)
    if method not in SETTINGS:
        if settings_raw:
            raise ConfigError(f"'{prefix}settings' apply to federated methods only, not "
                              f"{method!r}")
        return fed
    kind = settings_type(method)
    if legacy:
        if settings_raw is not None:
            raise ConfigError(f"'{prefix}settings' and the flat keys "
                              f"{', '.join(prefix + k for k in legacy)} of earlier versions "
                              f"are mixed; move the latter into '{prefix}settings'")
        values = {k: v for k, v in legacy.items() if k in kind.field_names() and v is not None}
    elif settings_raw is None:
        values = {}
    elif not isinstance(settings_raw, Mapping):
        raise ConfigError(f"'{prefix}settings' must be a mapping of {method}'s settings")
    else:
        values = dict(settings_raw)
    where = f"{prefix}settings."
    _check_applies(method, kind, list(values), name=lambda k: f"'{where}{k}'")
    try:
        settings = from_mapping(kind, values, prefix=where)
    except ConfigError as exc:
        raise ConfigError(f"{method}'s settings ('{prefix}settings'): {exc}") from None
    return dataclasses.replace(fed, settings=settings)


def _check_applies(method: str, kind: type[MethodSettings], keys: list[str], *,
                   name: Callable[[str], str]) -> None:
    """Raise a ConfigError naming the ``keys`` that are not settings of ``method``."""
    wrong = [k for k in keys if k not in kind.field_names()]
    if not wrong:
        return
    own = kind.field_names()
    has = (f"its settings: {', '.join(name(k) for k in own)}" if own
           else "it has no settings of its own")
    raise ConfigError(f"{', '.join(name(k) for k in wrong)} "
                      f"{'does' if len(wrong) == 1 else 'do'} not apply to {method} ({has})")


def fed_with_changes(fed: FedConfig, method: str, changes: Mapping[str, Any], *,
                     name: Callable[[str], str] = lambda k: f"'fed.{k}'") -> FedConfig:
    """``fed`` for a run of ``method`` with the flat ``changes`` applied (command-line flags,
    ``flwr run``'s run config): a key of :class:`FedConfig` changes the engine's settings, any
    other key the method's settings.

    When ``fed.settings`` are another method's (the method was switched), its values that
    differ from their defaults are carried over to ``method``'s settings.

    Two changes that set the same thing two ways (:data:`ALTERNATIVES`, e.g. z and the ε it
    is calibrated from) are refused together; one of them replaces the other's value in
    ``fed``, which would otherwise be kept beside it (a saved configuration states both).

    Raises
    ------
    ConfigError
        If a key is not a setting of ``method`` (named with ``name``, e.g. as a flag), two
        changes are alternatives of each other, or a value is invalid.
    """
    for first, second, what in ALTERNATIVES:
        if changes.get(first) is not None and changes.get(second) is not None:
            raise ConfigError(f"{name(first)} and {name(second)} both set {what}, and they "
                              f"may contradict each other: give only one of them")
    engine = {k: v for k, v in changes.items() if k in _ENGINE_KEYS}
    own = {k: v for k, v in changes.items() if k not in _ENGINE_KEYS}
    for first, second, _ in ALTERNATIVES:  # a change of one clears the other
        for given, other in ((first, second), (second, first)):
            if changes.get(given) is not None:
                (engine if other in _ENGINE_KEYS else own).setdefault(other, None)
    kind = settings_type(method)
    _check_applies(method, kind, [k for k in own if own[k] is not None
                                  or k not in _ALTERNATIVE_KEYS], name=name)
    own = {k: v for k, v in own.items() if k in kind.field_names() or v is not None}
    old = fed.settings
    carried: dict[str, Any] = {}
    if old is not None:
        carried = {f.name: getattr(old, f.name) for f in fields(old)
                   if type(old) is kind or getattr(old, f.name) != f.default}
        if type(old) is not kind:
            _check_applies(method, kind, [k for k in carried if k not in own],
                           name=lambda k: f"'fed.settings.{k}' of {old.method}")
    settings = kind(**{**carried, **own})
    return dataclasses.replace(fed, **engine, settings=settings)


ALTERNATIVES: tuple[tuple[str, str, str], ...] = (
    ("target_epsilon", "noise_multiplier",
     "dp-fedavg's noise (z is calibrated from the target epsilon)"),
    ("client_fraction", "clients_per_round", "the clients sampled per round"),
)
"""Pairs of settings that set one thing two ways: given together they are refused by
:func:`fed_with_changes`, and a change of one clears the other's value."""

_ALTERNATIVE_KEYS = frozenset(k for first, second, _ in ALTERNATIVES for k in (first, second))


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


def fed_config(method: str, **values: Any) -> FedConfig:
    """A :class:`FedConfig` for a run of ``method`` from flat values: the engine's settings
    and ``method``'s own (e.g. ``fed_config("dp-fedrec", rounds=50, epsilon_train=1.0)``).

    Raises
    ------
    ConfigError
        If a value is not a setting of the engine or of ``method``, or is invalid.
    """
    return fed_with_changes(FedConfig(), method, values)


def replace(config: Any, **changes: Any) -> Any:
    """Return a copy of a frozen config with ``changes`` applied and validated."""
    return dataclasses.replace(config, **changes)
