"""The models a server serves, and the public parameters devices download.

:class:`ServingModels` holds the ranking model (a
:class:`~privaterec.models.recommender.Recommender` with its
:class:`~privaterec.config.RunConfig` and vocabularies), PrivateRec's
basic vectors b ``[B, d]`` when the ranker has them (PrivateRec §3.2.2), and optionally a
Uni-FedRec recall model (Uni-FedRec §3.2, §3.4) whose value embeddings eᵛ ``[B_r, d]`` live
over the ranker's news vectors (Uni-FedRec §3.3 footnote 3).

Devices never get a training checkpoint (federated checkpoints hold the privacy ledger, i.e.
user ids): :meth:`ServingModels.parameters_payload` is a fresh ``torch.save`` of
``{"config_yaml", "vocab_json", "state_dict", "model_version"}`` with the model's
``state_dict`` only, and :meth:`ServingModels.recall_parameters_payload` of
``{"recall_yaml", "state_dict", "model_version"}`` where ``recall_yaml`` is the YAML of a
:class:`~privaterec.runs.recall.RecallModelConfig` (rebuild with
``RecallModelConfig(**yaml.safe_load(recall_yaml)).build(dim)``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch
import yaml

from privaterec.config import RunConfig
from privaterec.data.features import build_news_features
from privaterec.data.records import NewsRecord
from privaterec.data.text import TextVocabularies
from privaterec.errors import CheckpointError, ConfigError
from privaterec.models.recommender import Recommender

if TYPE_CHECKING:
    from privaterec.recall.model import UniFedRecRecall
    from privaterec.runs.recall import RecallModelConfig

VERSION_CHARS = 12
RECALL_CONFIG_FILE = "recall.yaml"  # privaterec.runs.recall.RECALL_CONFIG_FILE
ENCODE_BATCH = 256
PRIVACY_NOTE = (
    "PrivateRec queries send only alpha: B attention weights over the public basic vectors, "
    "computed on the device with random behaviour padding and DP noise (PrivateRec Alg. 2; "
    "the device accounts for epsilon). VDP queries send a noised d-dim user vector. Uni-FedRec "
    "recall queries send per-channel weights over the basic interests (noised on the device) "
    "and the channel quotas, which are in the clear unless the device noises them. The server "
    "neither logs nor stores query payloads.")


def digest(*chunks: bytes) -> str:
    """First 12 hex characters of the SHA-256 of the concatenated bytes."""
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(chunk)
    return h.hexdigest()[:VERSION_CHARS]


def state_digest(module: torch.nn.Module) -> bytes:
    """Bytes identifying a module's parameters (names, dtypes, shapes, values)."""
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else
                 t.float().numpy().tobytes())
    return h.digest()


def recall_model_config(model: "UniFedRecRecall") -> "RecallModelConfig":
    """The :class:`~privaterec.runs.recall.RecallModelConfig` that rebuilds ``model``'s
    architecture with ``.build(model.dim)``.

    Raises
    ------
    ConfigError
        If the model has no clipping (serving needs clipped scores) or heads other than the
        16-dim heads :meth:`~privaterec.runs.recall_setup.RecallModelConfig.build` uses.
    """
    from privaterec.runs.recall import HEAD_DIM, RecallModelConfig

    if model.clip is None:
        raise ConfigError("the recall model has clip=None; serving needs clipped "
                          "decomposition scores (build it with clip=delta, e.g. 0.2)")
    if model.self_attention.head_dim != HEAD_DIM:
        raise ConfigError(f"the recall model uses heads of {model.self_attention.head_dim}; "
                          f"devices rebuild it with heads of {HEAD_DIM} "
                          f"(RecallModelConfig.build)")
    options = model.cluster_options
    return RecallModelConfig(num_basis=model.num_basis,
                             attention_dim=model.channel_attention.projection.out_features,
                             max_channels=model.max_channels,
                             distance_threshold=float(options["distance_threshold"]),
                             cluster_method=options["method"],
                             cluster_metric=options["metric"],
                             clip=float(model.clip), noise_scale=float(model.noise_scale))


class ServingModels:
    """The served models (construct directly, or with :meth:`from_run`).

    Parameters
    ----------
    config, vocabs, ranker:
        The ranking run: configuration, vocabularies and model (put in eval mode here).
    recall:
        Optional Uni-FedRec recall model over the ranker's d-dim news vectors.
    ranker_version:
        Identity of the ranker (default: digest of its ``state_dict``; :meth:`from_run`:
        of its checkpoint file's bytes).
    recall_version_bytes:
        Bytes identifying the recall model (default: its ``state_dict`` digest).
    config_yaml, vocab_json:
        The run's files as devices download them (default: serialised from ``config`` and
        ``vocabs``).
    recall_config:
        The recall model's :class:`~privaterec.runs.recall.RecallModelConfig` (default:
        :func:`recall_model_config`).

    Attributes
    ----------
    model_version:
        12 hex characters: the ranker's version, or for a Uni-FedRec bundle the digest of
        the ranker's checkpoint and the recall model together.
    """

    def __init__(self, config: RunConfig, vocabs: TextVocabularies, ranker: Recommender, *,
                 recall: "UniFedRecRecall | None" = None, ranker_version: str | None = None,
                 ranker_version_bytes: bytes | None = None,
                 recall_version_bytes: bytes | None = None, config_yaml: str | None = None,
                 vocab_json: str | None = None,
                 recall_config: "RecallModelConfig | None" = None) -> None:
        self.config = config
        self.vocabs = vocabs
        self.ranker = ranker.eval()
        self.recall = recall.eval() if recall is not None else None
        ranker_bytes = ranker_version_bytes if ranker_version_bytes is not None else \
            state_digest(ranker)
        self.ranker_version = ranker_version or digest(ranker_bytes)
        self.recall_config: RecallModelConfig | None
        if self.recall is not None:
            if int(self.recall.dim) != self.dim:
                raise ConfigError(f"the recall model works on {self.recall.dim}-dim news "
                                  f"vectors but the ranker's are {self.dim}-dim; train the "
                                  f"recall model on this ranker")
            self.recall_config = recall_config or recall_model_config(self.recall)
            recall_bytes = recall_version_bytes if recall_version_bytes is not None else \
                state_digest(self.recall)
            self.model_version = digest(ranker_bytes, recall_bytes)
        else:
            self.recall_config = None
            self.model_version = self.ranker_version
        self._config_yaml = config_yaml
        self._vocab_json = vocab_json

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_run(cls, run: str | Path) -> "ServingModels":
        """Load a ranking run (``config.yaml``, ``vocab.json``, ``checkpoint.pt``) or a
        Uni-FedRec run (``recall.yaml``; its ``ranker`` is loaded as the ranking model).

        Raises
        ------
        CheckpointError
            If a file is missing or does not match.
        """
        from privaterec.runs.ranking import load_run_model
        from privaterec.runs.directory import RunDirectory

        run = Path(run)
        recall_run = None
        if (run / RECALL_CONFIG_FILE).is_file():  # imports the recall package only if needed
            from privaterec.runs.recall import load_recall_run
            recall_run = load_recall_run(run)
        ranker_dir = RunDirectory(recall_run.ranker if recall_run is not None else run)
        config, vocabs, model = load_run_model(ranker_dir.path)
        ranker_bytes = ranker_dir.checkpoint_path.read_bytes()
        kwargs: dict[str, Any] = {}
        if recall_run is not None:
            kwargs = dict(recall=recall_run.model, recall_config=recall_run.config.model,
                          recall_version_bytes=hashlib.sha256(
                              recall_run.checkpoint_path.read_bytes()).digest())
        return cls(config, vocabs, model, ranker_version=digest(ranker_bytes),
                   ranker_version_bytes=hashlib.sha256(ranker_bytes).digest(),
                   config_yaml=ranker_dir.config_path.read_text(),
                   vocab_json=ranker_dir.vocab_path.read_text(), **kwargs)

    # ------------------------------------------------------------------ description
    @property
    def dim(self) -> int:
        """d, the size of news and user vectors."""
        return int(self.ranker.dim)

    @property
    def basis_size(self) -> int:
        """B (0 without basic vectors)."""
        return 0 if self.ranker.basis is None else int(self.ranker.basis.size)

    @property
    def method(self) -> str:
        return "unifedrec" if self.recall is not None else self.config.train.method

    @cached_property
    def basis(self) -> np.ndarray | None:
        """PrivateRec's basic vectors b ``float32[B, d]`` (``None`` without a basis)."""
        if self.ranker.basis is None:
            return None
        return self.ranker.basis.weight.detach().cpu().numpy().astype(np.float32)

    @cached_property
    def recall_values(self) -> np.ndarray | None:
        """Uni-FedRec's value embeddings eᵛ ``float32[B_r, d]`` (``None`` without recall)."""
        if self.recall is None:
            return None
        return self.recall.interest.values.detach().cpu().numpy().astype(np.float32)

    def score_bases(self) -> dict[str, np.ndarray]:
        """The store's score spaces: ``privaterec`` → b, ``recall`` → eᵛ (when present)."""
        bases = {}
        if self.basis is not None:
            bases["privaterec"] = self.basis
        if self.recall_values is not None:
            bases["recall"] = self.recall_values
        return bases

    def info(self) -> dict[str, Any]:
        """``GET /v1/model`` without ``num_news``."""
        recall = None
        if self.recall is not None:
            recall = {"basis_size": int(self.recall.num_basis), "dim": int(self.recall.dim),
                      "max_channels": int(self.recall.max_channels),
                      "parameters_url": "/v1/model/recall-parameters"}
        return {"model_version": self.model_version, "method": self.method,
                "news_encoder": self.config.model.news_encoder,
                "basis_size": self.basis_size, "dim": self.dim,
                "parameters_url": "/v1/model/parameters", "recall": recall,
                "privacy_note": PRIVACY_NOTE}

    # ------------------------------------------------------------------ encoding
    @torch.inference_mode()
    def encode_news(self, articles: Sequence[NewsRecord]) -> np.ndarray:
        """Θ_N of the ranker on articles: ``float32[n, d]`` (unknown words → ``<unk>``)."""
        records = list(articles)
        features = build_news_features(records, self.vocabs,
                                       title_len=self.config.model.title_len,
                                       abstract_len=self.config.model.abstract_len)
        out = np.empty((len(records), self.dim), dtype=np.float32)
        for lo in range(0, len(records), ENCODE_BATCH):
            hi = min(lo + ENCODE_BATCH, len(records))
            rows = torch.arange(lo + 1, hi + 1)  # row 0 is the anonymous news
            out[lo:hi] = self.ranker.encode_features(features.select(rows)).float().numpy()
        return out

    # ------------------------------------------------------------------ downloads
    @property
    def config_yaml(self) -> str:
        if self._config_yaml is None:
            self._config_yaml = yaml.safe_dump(self.config.to_dict(), sort_keys=False)
        return self._config_yaml

    @property
    def vocab_json(self) -> str:
        if self._vocab_json is None:
            self._vocab_json = self.vocabs.to_json()
        return self._vocab_json

    @cached_property
    def parameters_payload(self) -> bytes:
        """``torch.save`` bytes of ``{"config_yaml", "vocab_json", "state_dict",
        "model_version"}`` (the ranker's weights only: no ledger, no optimizer state)."""
        return _saved({"config_yaml": self.config_yaml, "vocab_json": self.vocab_json,
                       "state_dict": _cpu_state(self.ranker),
                       "model_version": self.model_version})

    @cached_property
    def recall_parameters_payload(self) -> bytes | None:
        """``torch.save`` bytes of ``{"recall_yaml", "state_dict", "model_version"}``."""
        if self.recall is None or self.recall_config is None:
            return None
        recall_yaml = yaml.safe_dump(dataclasses.asdict(self.recall_config), sort_keys=False)
        return _saved({"recall_yaml": recall_yaml, "state_dict": _cpu_state(self.recall),
                       "model_version": self.model_version})


def _cpu_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def _saved(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


__all__ = ["PRIVACY_NOTE", "ServingModels", "digest", "recall_model_config",
           "state_digest"]
