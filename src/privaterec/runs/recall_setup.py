"""What a Uni-FedRec run is built from: its configuration, the ranker's news vectors, the
recall model and the training clients.

The run layer (:mod:`privaterec.runs.recall`) trains and evaluates with them, and a Flower
device (:func:`privaterec.runs.engines.load_device`) rebuilds exactly the same public task
from the run's ``recall.yaml``; both import them from here, below the engine choice.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import Tensor

from privaterec.config import (FedConfig, fed_from_mapping, load_yaml_config, mapping_kwargs,
                               replace)
from privaterec.data.features import NewsFeatures, build_news_features
from privaterec.errors import ConfigError
from privaterec.method_settings import LEGACY_FLAT_KEYS, UniFedRecSettings, setting
from privaterec.models.recommender import Recommender
from privaterec.recall.channels import check_cluster_params
from privaterec.recall.interest import (DEFAULT_CLIP, DEFAULT_NOISE_SCALE, DEFAULT_NUM_BASIS,
                                        channel_event)
from privaterec.recall.model import UniFedRecRecall
from privaterec.recall.news import encode_news_table
from privaterec.recall.task import (METHOD, RecallTrainConfig, UniFedRecLDP,
                                    recall_fed_config, resolve_recall_fed)
from privaterec.runs.directory import RECALL_CONFIG_FILE
from privaterec.runs.ranking_setup import load_run_model
from privaterec.validators import fail

REPORT_DELTA = 1e-5  # target δ of privacy.json's composed ε (FedConfig.report_delta's default)
HEAD_DIM = 16


@dataclass
class RankerNews:
    """A trained ranking model with its news table and the table's news vectors.

    Attributes
    ----------
    model: the ranker (eval mode). features: news table built with the run's vocabularies.
    vectors: ``Tensor[N, d]``, :func:`~privaterec.recall.news.encode_news_table` of ``features``.
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
    config, vocabs, model = load_run_model(run_dir)
    features = build_news_features(news, vocabs, title_len=config.model.title_len,
                                   abstract_len=config.model.abstract_len)
    vectors = encode_news_table(model, features, batch_size=batch_size, progress=progress)
    return RankerNews(model, features, vectors, config.model.history_len)


@dataclass(frozen=True)
class RecallModelConfig:
    """Architecture and serving privacy of the recall model (defaults: Uni-FedRec §4.1).

    Attributes
    ----------
    num_basis: B basic interest embeddings (paper 30).
    attention_dim: hidden size of the cluster-wise attention (paper 128).
    max_channels: at most this many interest channels (paper 5).
    distance_threshold, cluster_method, cluster_metric: hierarchical clustering of the
        self-attended clicked-news vectors (threshold d_c, scipy linkage method and metric).
    bie: ``False`` trains the no-BIE ablation (channel interests scored directly; only
        ``--recall no-bie`` evaluates it).
    aggregator_scale: learn a public scale s of the aggregator softmax, α = softmax(s·â)
        (post-processing of the release; :class:`~privaterec.recall.model.UniFedRecRecall`).

    Keyword-only privacy parameters
    -------------------------------
    clip: δ, decomposition scores are clipped to [−δ, δ] (paper 0.2).
    noise_scale: λ_I, Laplace scale of the released scores (paper 1.2): each channel
        costs ε = 2δB/λ_I (docs/privacy.md#uni-fedrec-channels-and-quotas).
    """

    num_basis: int = setting(DEFAULT_NUM_BASIS, "B basic interest embeddings",
                             flag="--recall-basis")
    attention_dim: int = 128
    max_channels: int = setting(5, "at most this many interest channels")
    distance_threshold: float = setting(1.0, "d_c of the hierarchical clustering")
    cluster_method: str = setting("average", "scipy linkage method")
    cluster_metric: str = setting("cosine", "distance metric")
    bie: bool = True
    aggregator_scale: bool = False
    _: dataclasses.KW_ONLY
    clip: float = setting(DEFAULT_CLIP, "delta: decomposition scores clipped to [-delta, delta]",
                          flag="--interest-clip")
    noise_scale: float = setting(DEFAULT_NOISE_SCALE, "lambda_I: Laplace scale of the released "
                                                      "scores", flag="--interest-noise")

    def __post_init__(self) -> None:
        for name in ("num_basis", "attention_dim", "max_channels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                fail(f"recall.{name}", value, "an integer >= 1", kind="")
        check_cluster_params(self.distance_threshold, self.cluster_method,
                             self.cluster_metric, self.max_channels, "merge")
        if not (isinstance(self.clip, (int, float)) and 0 < self.clip < math.inf):
            raise ConfigError(f"invalid privacy parameter 'clip' (delta): got {self.clip!r}, "
                              f"expected a finite number > 0")
        if not (isinstance(self.noise_scale, (int, float)) and 0 <= self.noise_scale < math.inf):
            raise ConfigError(f"invalid privacy parameter 'noise_scale' (lambda_I): got "
                              f"{self.noise_scale!r}, expected a finite number >= 0")

    @property
    def channel_epsilon(self) -> float:
        """ε of one channel's release, 2δB/λ_I (∞ without noise)."""
        return channel_event(num_basis=self.num_basis, clip=self.clip,
                             noise_scale=self.noise_scale).epsilon

    def build(self, dim: int) -> UniFedRecRecall:
        """A fresh :class:`UniFedRecRecall` over d-dim news vectors (d/16 heads of 16)."""
        if dim % HEAD_DIM:
            raise ConfigError(f"the ranker's news vectors have d = {dim}, not a multiple of "
                              f"{HEAD_DIM} (the recall model's self-attention uses heads of "
                              f"{HEAD_DIM}); train the ranker with such a size")
        return UniFedRecRecall(dim, num_heads=dim // HEAD_DIM, head_dim=HEAD_DIM,
                               attention_dim=self.attention_dim, num_basis=self.num_basis,
                               clip=self.clip, noise_scale=self.noise_scale,
                               max_channels=self.max_channels,
                               distance_threshold=self.distance_threshold,
                               method=self.cluster_method, metric=self.cluster_metric,
                               use_bie=self.bie, aggregator_scale=self.aggregator_scale)


@dataclass(frozen=True)
class RecallRunConfig:
    """Everything a Uni-FedRec run computes from (saved as ``recall.yaml``).

    Attributes
    ----------
    ranker: the ranking run directory whose news encoder gives the news vectors and whose
        model ranks the recalled candidates on the device.
    data: data directory (empty: the ranker's).
    seed: seeds the model's initialisation, client sampling and the clients' draws.
    model: :class:`RecallModelConfig`.
    fed: the engine's settings (rounds, sampling, server strategy, ``max_client_samples``,
        ``engine``; ``None`` fields take Uni-FedRec's defaults,
        :func:`~privaterec.recall.task.resolve_recall_fed`) and in ``fed.settings`` the
        upload's (:class:`~privaterec.method_settings.UniFedRecSettings`: clipping, θ as
        ``clip``, λ_g as ``noise_scale``).
    train: recall's own settings (:class:`~privaterec.recall.task.RecallTrainConfig`).
    """

    ranker: str = ""
    data: str = ""
    seed: int = 0
    model: RecallModelConfig = field(default_factory=RecallModelConfig)
    fed: FedConfig = field(default_factory=recall_fed_config)
    train: RecallTrainConfig = field(default_factory=RecallTrainConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.ranker, str) or not self.ranker:
            raise ConfigError("a Uni-FedRec run needs its ranking model: pass --ranker RUN (a "
                              "run directory trained by another method)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"invalid 'seed': got {self.seed!r}, expected an integer >= 0")
        if self.fed.settings is None:
            object.__setattr__(self, "fed", replace(self.fed, settings=UniFedRecSettings()))
        resolve_recall_fed(self.fed)  # its rules, before anything runs

    def resolved(self) -> "RecallRunConfig":
        """The configuration with Uni-FedRec's defaults filled in (what ``recall.yaml``
        states)."""
        return dataclasses.replace(self, fed=resolve_recall_fed(self.fed))

    def method(self) -> UniFedRecLDP:
        """The client method of this run's training."""
        return UniFedRecLDP.of(resolve_recall_fed(self.fed), self.train)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self, path: Path) -> None:
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def from_dict(cls, raw: Any) -> "RecallRunConfig":
        """Build from a parsed ``recall.yaml``. A file written before the upload's settings
        moved to ``fed.settings`` (flat ``fed`` keys, the clipping as ``train.clipping``) is
        read by :func:`~privaterec.config.fed_from_mapping`'s legacy reader."""
        fed, train = (dict(_section(raw, name)) for name in ("fed", "train"))
        if set(fed) & LEGACY_FLAT_KEYS and "clipping" in train:
            fed["clipping"] = train.pop("clipping")
        rest = {k: v for k, v in raw.items() if k not in ("fed", "train")}
        kwargs = mapping_kwargs(cls, {**rest, "train": train})
        kwargs["fed"] = fed_from_mapping(METHOD, fed, prefix="fed.")
        return cls(**kwargs)

    @classmethod
    def from_yaml(cls, path: Path) -> "RecallRunConfig":
        return load_yaml_config(cls, path, build=cls.from_dict)


def _section(raw: Any, name: str) -> Any:
    value = raw.get(name) or {}
    if not isinstance(value, dict):
        raise ConfigError(f"'{name}' must be a mapping")
    return value


@dataclass
class RecallSetup:
    """What a recall run trains: the initial model, the news vectors, the training clients
    and the negatives' pool rows (the same on the server and on every Flower device)."""

    model: UniFedRecRecall
    vectors: torch.Tensor
    clients: Any
    pool_rows: torch.Tensor


def recall_setup(config: RecallRunConfig, dataset: Any, *, progress: bool = False
                 ) -> RecallSetup:
    """The ranker's news vectors of every news of ``dataset`` (train and test splits), the
    training split's users (histories and clicks as rows of that table), the recall model
    initialised with ``torch.manual_seed(config.seed)`` and the training split's news rows
    (pool negatives never come from the future, so the model cannot learn "unseen news are
    negatives")."""
    from privaterec.data.clients import build_client_dataset

    ranker = load_ranker_news(config.ranker, dataset.all_news(), progress=progress)
    clients = build_client_dataset(dataset.train, ranker.features,
                                   history_len=ranker.history_len)
    torch.manual_seed(config.seed)
    model = config.model.build(int(ranker.vectors.shape[-1]))
    train_rows = torch.tensor(sorted(set(ranker.features.rows_of(list(dataset.train.news)))))
    return RecallSetup(model, ranker.vectors, clients, train_rows)


__all__ = ["HEAD_DIM", "METHOD", "RECALL_CONFIG_FILE", "REPORT_DELTA", "RankerNews", "RecallModelConfig", "RecallRunConfig", "RecallSetup", "load_ranker_news", "recall_setup"]
