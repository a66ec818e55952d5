"""The public models, downloaded from the server and rebuilt on the device.

``GET /v1/model`` announces the served model; its parameters (``GET /v1/model/parameters``:
``torch.save`` of ``{"config_yaml", "vocab_json", "state_dict", "model_version"}``) rebuild
the ranking :class:`~privaterec.models.recommender.Recommender` (:class:`DeviceModel`), and a
Uni-FedRec server's recall parameters (``{"recall_yaml", "state_dict", "model_version"}``)
rebuild the :class:`~privaterec.recall.model.UniFedRecRecall` (:func:`build_recall_model`).
With a ``cache_dir`` the downloaded bundles are kept per model version (``model-V.pt``,
``recall-V.pt``) and read from there on the next start.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import yaml
from torch import Tensor

from privaterec.config import RunConfig, from_mapping
from privaterec.data.features import ANONYMOUS_NEWS, build_news_features
from privaterec.data.records import NewsRecord
from privaterec.data.text import TextVocabularies
from privaterec.errors import CheckpointError, ConfigError
from privaterec.files import write_atomic
from privaterec.models.factory import build_recommender
from privaterec.models.recommender import Recommender
from privaterec.recall.model import UniFedRecRecall
from privaterec.serving.transport import HttpSession, Transport

RecallBuilder = Callable[[str, Mapping[str, Tensor]], UniFedRecRecall]
"""``(recall_yaml, state_dict) -> UniFedRecRecall`` (default :func:`build_recall_model`)."""


@dataclass
class DeviceModel:
    """The public ranking model rebuilt on the device from ``GET /v1/model/parameters``.

    Attributes
    ----------
    info: the ``GET /v1/model`` document. config: the run's RunConfig. vocabs: its
    vocabularies. model: the Recommender (eval mode). model_version: the server's version.
    """

    info: dict[str, Any]
    config: RunConfig
    vocabs: TextVocabularies
    model: Recommender
    model_version: str

    @torch.no_grad()
    def encode_news(self, records: Sequence[NewsRecord]) -> Tensor:
        """Θ_N of ``records`` → ``Tensor[1 + n, d]``; row 0 is r₀ (the anonymous news)."""
        m = self.config.model
        features = build_news_features(list(records), self.vocabs, title_len=m.title_len,
                                       abstract_len=m.abstract_len)
        return self.model.encode_features(features.tensors())

    @torch.no_grad()
    def history_tensors(self, history: Sequence[NewsRecord]
                        ) -> tuple[Tensor, Tensor, Tensor]:
        """``(vectors [1, H, d], mask [1, H], r₀ [d])`` of the last H clicks (right-aligned)."""
        kept = list(history)[-self.config.model.history_len:]
        m = self.config.model
        # Rows 1..n of the table are the kept clicks in order (ids may repeat), right-aligned
        # and left-padded with row 0 as in privaterec.data.history.history_rows.
        rows = torch.full((m.history_len,), ANONYMOUS_NEWS, dtype=torch.long)
        mask = torch.zeros(m.history_len, dtype=torch.bool)
        if kept:
            rows[m.history_len - len(kept):] = torch.arange(1, len(kept) + 1)
            mask[m.history_len - len(kept):] = True
        table = self.encode_news(kept)
        return table[rows][None], mask[None], table[ANONYMOUS_NEWS]


def load_parameters(data: bytes, what: str) -> dict[str, Any]:
    """The parameter bundle in ``data`` (``GET /v1/model/parameters`` or
    ``/v1/model/recall-parameters``; tensors only, ``weights_only`` unpickling), or a
    :class:`CheckpointError` naming ``what`` (the URL or the cached file)."""
    try:
        payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is a bad download
        raise CheckpointError(f"{what}: not a privaterec parameter bundle ({exc})") from None
    if not isinstance(payload, dict) or "state_dict" not in payload:
        raise CheckpointError(f"{what}: not a privaterec parameter bundle (no 'state_dict')")
    return payload


def _download(http: HttpSession, url: str, version: str, name: str,
              cache_dir: Path | None) -> dict[str, Any]:
    """The parameter bundle at ``url`` for ``version``, from ``cache_dir`` when present."""
    cached = None if cache_dir is None else cache_dir / f"{name}-{version}.pt"
    if cached is not None and cached.exists():
        payload = load_parameters(cached.read_bytes(), str(cached))
    else:
        data = http.get_bytes(url)
        payload = load_parameters(data, url)
        if cached is not None:
            write_atomic(cached, data)
    if payload.get("model_version") != version:
        raise CheckpointError(f"{cached or url}: holds model_version "
                              f"{payload.get('model_version')!r}, the server announces "
                              f"{version!r}; delete the cached file or call refresh()")
    return payload


def download_model(http: HttpSession, info: Mapping[str, Any],
                   cache_dir: Path | None = None) -> DeviceModel:
    """Rebuild the ranking model announced by ``info`` (``GET /v1/model``).

    Raises
    ------
    CheckpointError
        An unreadable bundle, one of another model version, or weights that do not match
        the announced configuration.
    """
    version = str(info["model_version"])
    payload = _download(http, str(info.get("parameters_url", "/v1/model/parameters")), version,
                        "model", cache_dir)
    try:
        raw = yaml.safe_load(payload["config_yaml"]) or {}
        config = RunConfig.from_dict(raw)
        vocab_text = payload["vocab_json"]
    except (KeyError, yaml.YAMLError, ValueError, TypeError) as exc:
        raise CheckpointError(f"model parameters {version}: bad config/vocabulary ({exc})"
                              ) from None
    vocabs = TextVocabularies.from_json(vocab_text, f"model parameters {version}")
    model = build_recommender(config.model, vocabs, for_checkpoint=True)
    _load_weights(model, payload["state_dict"], f"model parameters {version}: do not match "
                                                f"the announced configuration")
    return DeviceModel(info=dict(info), config=config, vocabs=vocabs, model=model,
                       model_version=version)


def _load_weights(model: torch.nn.Module, state_dict: Mapping[str, Tensor], what: str) -> None:
    """Load ``state_dict`` into ``model`` and set eval mode; a mismatch is a CheckpointError."""
    try:
        model.load_state_dict(state_dict)
    except RuntimeError as exc:
        raise CheckpointError(f"{what} ({exc})") from None
    model.eval()


def fetch_model(base_url: str | None = None, *, transport: Transport | None = None,
                cache_dir: str | Path | None = None, timeout: float = 30.0) -> DeviceModel:
    """Download and rebuild the served ranking model (what every device does first)."""
    http = HttpSession(base_url, transport, timeout)
    try:
        return download_model(http, http.get_json("/v1/model"),
                              None if cache_dir is None else Path(cache_dir))
    finally:
        http.close()


def build_recall_model(recall_yaml: str, state_dict: Mapping[str, Tensor]) -> UniFedRecRecall:
    """Rebuild the Uni-FedRec recall model from its downloaded ``recall_yaml`` and weights.

    ``recall_yaml`` is a :class:`~privaterec.runs.recall.RecallModelConfig` (at the top level,
    as the server sends it, or under ``model`` as in a run's ``recall.yaml``); d is the width
    of the basic interest embeddings in ``state_dict``; the architecture is
    :meth:`RecallModelConfig.build(d) <privaterec.runs.recall.RecallModelConfig.build>`.

    Raises
    ------
    CheckpointError
        Unreadable YAML, or weights that do not match the architecture.
    """
    from privaterec.runs.recall import RecallModelConfig

    try:
        raw = yaml.safe_load(recall_yaml) or {}
    except yaml.YAMLError as exc:
        raise CheckpointError(f"recall parameters: recall_yaml is not valid YAML ({exc})"
                              ) from None
    if isinstance(raw, Mapping) and isinstance(raw.get("model"), Mapping):
        raw = raw["model"]
    keys = state_dict.get("interest.keys")
    if not isinstance(raw, Mapping) or keys is None or keys.ndim != 2:
        raise CheckpointError("recall parameters: expected a RecallModelConfig mapping and "
                              "the weights of a UniFedRecRecall (interest.keys [B, d])")
    try:
        model = from_mapping(RecallModelConfig, raw).build(int(keys.shape[1]))
    except ConfigError as exc:
        raise CheckpointError(f"recall parameters: cannot rebuild the recall model ({exc})"
                              ) from None
    _load_weights(model, dict(state_dict), "recall parameters: cannot rebuild the recall model")
    return model


def download_recall_model(http: HttpSession, info: Mapping[str, Any],
                          cache_dir: Path | None = None, *,
                          builder: RecallBuilder = build_recall_model) -> UniFedRecRecall:
    """Rebuild the Uni-FedRec recall model that ``info`` (``GET /v1/model``) announces.

    ``info["recall"]`` must be present (a server serving a Uni-FedRec run); its
    ``parameters_url`` (default ``/v1/model/recall-parameters``) is downloaded for
    ``info["model_version"]`` and rebuilt with ``builder``.
    """
    url = str(info["recall"].get("parameters_url", "/v1/model/recall-parameters"))
    payload = _download(http, url, str(info["model_version"]), "recall", cache_dir)
    return builder(str(payload.get("recall_yaml", "")), payload["state_dict"])


__all__ = ["DeviceModel", "RecallBuilder", "build_recall_model", "download_model",
           "download_recall_model", "fetch_model", "load_parameters"]
