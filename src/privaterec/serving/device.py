"""The devices: private queries of the serving API (PrivateRec Alg. 1-2, Uni-FedRec §3.4).

A device holds the news its user read (:class:`~privaterec.data.records.NewsRecord`) and never
sends them. It downloads the public model once (:mod:`privaterec.serving.download`) and per
query releases only a privatised summary of the (truncated) history:

* :class:`PrivateRecDevice` — Alg. 2 (:func:`privaterec.eval.serving.dpa_release`): α̃ [B]
  to ``/v1/recommend/privaterec``; the server scores ũ = Σ α̃ᵢ bᵢ over its pool (Alg. 1).
* :class:`VDPDevice` — the VDP baseline (§3.2.1): the clipped, noised user vector [d] to
  ``/v1/recommend/vdp``.
* :class:`UniFedRecDevice` — Uni-FedRec §3.4-3.5: protected channel weights [C, B_r] (and
  quotas) to ``/v1/recall/unifedrec``, then local ranking of the returned candidates.

Every release is charged to the device's :class:`~privaterec.serving.budget.DeviceBudget`
before it is sent (raising :class:`~privaterec.errors.PrivacyBudgetExceeded` instead when it
would exceed the cap); an unchanged history re-sends its cached release at no cost. A release
is recorded before it is sent, so a failed request can be retried with it at no cost.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any, Mapping, Self, Sequence

import torch
from torch import Tensor

from privaterec.data.records import NewsRecord
from privaterec.errors import CheckpointError, ConfigError
from privaterec.eval.serving import ServingConfig, dpa_release, serving_event
from privaterec.privacy.dpa import vdp_release
from privaterec.privacy.ledger import Composition, PrivacyEvent, PrivacyLedger
from privaterec.serving.budget import STATE_FILE, DeviceBudget, release_key
from privaterec.serving.download import (DeviceModel, RecallBuilder, build_recall_model,
                                         download_model, download_recall_model)
from privaterec.serving.transport import (HttpSession, ModelChangedError, ServerError,
                                          Transport, json_body, json_floats)

MAX_K = 1000
"""Largest ``k`` (and Uni-FedRec ``total``) the server accepts (serving spec)."""


def _check_history(history: Sequence[NewsRecord]) -> list[NewsRecord]:
    if isinstance(history, (str, bytes)) or not isinstance(history, Sequence):
        raise ConfigError("'history' must be a sequence of NewsRecord (the news this user "
                          "read, held on the device)")
    items = list(history)
    for i, n in enumerate(items):
        if not isinstance(n, NewsRecord):
            raise ConfigError(f"history[{i}] is a {type(n).__name__}, expected a NewsRecord: "
                              f"the device encodes the news it holds and never sends ids")
    return items


def _check_count(value: int, name: str, upper: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= upper:
        raise ConfigError(f"invalid '{name}': got {value!r}, expected an integer in "
                          f"[1, {upper}]")
    return value


def _check_gaussian_budget(mechanism: str, budget: float, budget_delta: float) -> None:
    if mechanism == "gaussian" and math.isfinite(budget) and not budget_delta > 0:
        raise ConfigError("a finite 'budget' with the Gaussian mechanism needs "
                          "'budget_delta' > 0 (the target delta of the composed releases)")


class _Device:
    """Shared machinery of the devices: transport, downloaded model, budget, release cache.

    A subclass names its ``kind`` (release-cache key) and ``endpoint``, and implements
    :meth:`_params` (what a release depends on besides the history) and :meth:`_new_release`
    (spend the budget, then return the JSON value to send, stored in the cache under
    ``_cache_field``).
    """

    kind = ""
    endpoint = ""
    _cache_field = ""

    def __init__(self, base_url: str | None, *, budget: float, budget_delta: float,
                 composition: Composition, generator: torch.Generator,
                 cache_dir: str | Path | None, transport: Transport | None,
                 timeout: float) -> None:
        if not isinstance(generator, torch.Generator):
            raise ConfigError("pass generator=torch.Generator() (seeded for reproducible "
                              "releases): every random draw of the device goes through it")
        self.generator = generator
        self.cache_dir = None if cache_dir is None else Path(cache_dir)
        self._http = HttpSession(base_url, transport, timeout)
        self.budget = DeviceBudget(cap=budget, delta=budget_delta, composition=composition,
                                   path=None if self.cache_dir is None
                                   else self.cache_dir / STATE_FILE)
        self.last_query: dict[str, Any] | None = None
        self.refresh()

    # -- model -----------------------------------------------------------------------
    def refresh(self) -> None:
        """(Re)download ``/v1/model`` and, if its version is new, the parameters."""
        info = self._http.get_json("/v1/model")
        self._check_info(info)
        current = getattr(self, "_model", None)
        if current is None or current.model_version != info["model_version"]:
            self._download(info)

    def _check_info(self, info: Mapping[str, Any]) -> None:
        pass

    def _download(self, info: Mapping[str, Any]) -> None:
        self._model = download_model(self._http, info, self.cache_dir)

    @property
    def model(self) -> DeviceModel:
        return self._model

    @property
    def model_version(self) -> str:
        return self._model.model_version

    @property
    def bytes_sent(self) -> int:
        """Size in bytes of the JSON body of the last query (what left the device)."""
        return self._http.bytes_sent

    @property
    def ledger(self) -> PrivacyLedger:
        return self.budget.ledger

    def spent(self, *, delta: float | None = None) -> float:
        """Total ε this device has released (all queries, all models) at target δ.

        ∞ once a non-private release was recorded (Uni-FedRec quotas in the clear).
        """
        return self.budget.spent(delta=delta)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- release ---------------------------------------------------------------------
    def _params(self) -> dict[str, Any]:
        raise NotImplementedError

    def _new_release(self, history: Sequence[NewsRecord]) -> Any:
        raise NotImplementedError

    def release(self, history: Sequence[NewsRecord]) -> tuple[Any, bool]:
        """What this device sends for ``history``: ``(value, from_cache)``.

        The value is the vector (``list[float]``) of a ranking device, or Uni-FedRec's
        channels ``[{"weights": [B_r floats], "quota": float}]``. Spends the budget (or
        raises :class:`PrivacyBudgetExceeded` before anything is sent) unless the same
        truncated history was released before under the same model and parameters.
        """
        items = _check_history(history)
        kept = items[-self._model.config.model.history_len:]
        key = release_key(self.kind, self.model_version, self._params(), kept)
        entry = self.budget.cached(key)
        if entry is not None:
            return copy.deepcopy(entry[self._cache_field]), True
        value = self._new_release(kept)
        self.budget.cache(key, {self._cache_field: value, "model_version": self.model_version})
        return value, False

    def _post(self, payload: Mapping[str, Any]) -> tuple[dict[str, Any], bytes]:
        """POST ``payload`` to the endpoint: ``(response, body)``; check the served model."""
        body = json_body(payload)
        response = self._http.post_json(self.endpoint, body)
        served = response.get("model_version")
        if served != self.model_version:
            raise ModelChangedError("POST", self.endpoint, 200,
                                    f"the server now serves model {served!r}, this device "
                                    f"holds {self.model_version!r}: call refresh() and query "
                                    f"again")
        return response, body


class _RankingDevice(_Device):
    """A device that queries ``/v1/recommend/*`` with one released vector (``field``)."""

    field = ""
    _cache_field = "values"

    def __init__(self, base_url: str | None, config: ServingConfig, *, budget: float,
                 budget_delta: float, composition: Composition, generator: torch.Generator,
                 cache_dir: str | Path | None, transport: Transport | None,
                 timeout: float) -> None:
        self.config = config
        _check_gaussian_budget(config.mechanism, budget, budget_delta)
        super().__init__(base_url, budget=budget, budget_delta=budget_delta,
                         composition=composition, generator=generator, cache_dir=cache_dir,
                         transport=transport, timeout=timeout)

    def _event(self) -> PrivacyEvent:
        raise NotImplementedError

    def _draw(self, history: Sequence[NewsRecord]) -> Tensor:
        raise NotImplementedError

    def _new_release(self, history: Sequence[NewsRecord]) -> list[float]:
        self.budget.spend([(self._event(), 1)])  # raises before anything is drawn or sent
        return json_floats(self._draw(history).reshape(-1).tolist())

    def recommend(self, history: Sequence[NewsRecord], k: int = 10) -> list[dict[str, Any]]:
        """Top-``k`` news of the server's pool for this user, sending only the release.

        Parameters
        ----------
        history:
            The news this user read, oldest first (only the last H are used).
        k:
            Number of results, 1 ≤ k ≤ 1000 (the server also caps k at its pool size).

        Returns
        -------
        The server's items ``{"news_id", "title", "category", "score"}``, best first.

        Raises
        ------
        PrivacyBudgetExceeded
            A new release would exceed the budget (nothing sent).
        ServerError, ModelChangedError
            The server refused the query or now serves another model.
        """
        _check_count(k, "k", MAX_K)
        values, cached = self.release(history)
        payload = {self.field: values, "k": k}
        response, body = self._post(payload)
        items = list(response.get("items", []))
        self.last_query = {"endpoint": self.endpoint, "sent": payload, "bytes_sent": len(body),
                           "cached": cached, "received": items,
                           "model_version": self.model_version}
        return items


class PrivateRecDevice(_RankingDevice):
    """A PrivateRec device: releases α̃ (B floats) per query (Alg. 1-2 with errata 1-3).

    Alg. 2 on the device (:func:`privaterec.eval.serving.dpa_release`): each clicked news is
    replaced by the anonymous news r₀ with probability p, u = Θ_U(history) [d],
    α = softmax(u·bᵀ/√d) [B], Laplace or analytic-Gaussian noise calibrated with the TRUE
    simplex sensitivity (L1 = 2, L2 = √2) at the padding-amplified budget, α̃ =
    softplus-normalised α + n (DESIGN §4 errata 1-3). It POSTs ``{"alpha": [B floats], "k"}``.

    Parameters
    ----------
    base_url:
        The server, e.g. ``"http://127.0.0.1:8000"`` (or pass ``transport``).
    epsilon:
        ε_s of one release (after padding amplification); ``math.inf``: no noise, no padding,
        not private.
    delta:
        δ_s: 0 with Laplace, in (0, 1) with the analytic Gaussian.
    padding_p:
        p, the probability that each click is replaced by the anonymous news r₀.
    mechanism:
        ``"laplace"`` (L1 sensitivity 2) or ``"gaussian"`` (L2 sensitivity √2).
    normalization:
        ``"softplus"`` (Alg. 2 line 10) or ``"relu"`` (post-processing either way).
    budget, budget_delta, composition:
        Cap on the device's total ε at target δ (:class:`DeviceBudget`); a Gaussian device
        with a finite budget needs ``budget_delta`` > 0.
    generator:
        The device's randomness (padding and noise).
    cache_dir:
        Keeps the downloaded parameters, the ledger and the release cache across restarts
        (one ledger per ``cache_dir``: use one directory per user).
    transport:
        An httpx-compatible client (default: ``httpx.Client(base_url)``).
    timeout:
        Seconds per request of the default transport.

    Raises
    ------
    ConfigError
        Invalid privacy parameters, or the server's model has no basic vectors.
    """

    kind = "privaterec"
    endpoint = "/v1/recommend/privaterec"
    field = "alpha"

    def __init__(self, base_url: str | None = None, *, epsilon: float, delta: float = 0.0,
                 padding_p: float = 0.5, mechanism: str = "laplace",
                 normalization: str = "softplus", budget: float = math.inf,
                 budget_delta: float = 0.0, composition: Composition = "pld",
                 generator: torch.Generator, cache_dir: str | Path | None = None,
                 transport: Transport | None = None, timeout: float = 30.0) -> None:
        super().__init__(base_url, ServingConfig(kind="privaterec", epsilon=epsilon, delta=delta,
                                                 padding_p=padding_p, mechanism=mechanism,
                                                 normalization=normalization),
                         budget=budget, budget_delta=budget_delta, composition=composition,
                         generator=generator, cache_dir=cache_dir, transport=transport,
                         timeout=timeout)

    def _check_info(self, info: Mapping[str, Any]) -> None:
        if not info.get("basis_size"):
            raise ConfigError(f"the server's model {info.get('model_version')!r} has no basic "
                              f"vectors (basis_size = 0): PrivateRec serving needs a model "
                              f"trained with --method privaterec; use VDPDevice otherwise")

    @property
    def basis_size(self) -> int:
        return int(self._model.config.model.basis_size)

    def _params(self) -> dict[str, Any]:
        c = self.config
        return {"epsilon": c.epsilon, "delta": c.delta, "padding_p": c.padding_p,
                "mechanism": c.mechanism, "normalization": c.normalization}

    def _event(self) -> PrivacyEvent:
        return serving_event(self.config, basis_size=self.basis_size,
                             dim=self._model.model.dim)

    def _draw(self, history: Sequence[NewsRecord]) -> Tensor:
        """α̃ ``Tensor[B]`` of the history (Alg. 2)."""
        vectors, mask, r0 = self._model.history_tensors(history)
        out = dpa_release(self._model.model, r0, vectors, mask, self.config,
                          generator=self.generator)
        return out.released[0]


class VDPDevice(_RankingDevice):
    """The VDP baseline device (PrivateRec §3.2.1): sends the d-dim user vector, clipped to
    θ (L1 for Laplace, L2 for Gaussian) plus noise with Δ = 2θ, to ``/v1/recommend/vdp``.

    Parameters are those of :class:`PrivateRecDevice`, with ``clip`` (θ, the paper's 0.001)
    instead of ``padding_p``/``normalization``.
    """

    kind = "vdp"
    endpoint = "/v1/recommend/vdp"
    field = "embedding"

    def __init__(self, base_url: str | None = None, *, epsilon: float, delta: float = 0.0,
                 clip: float = 0.001, mechanism: str = "laplace", budget: float = math.inf,
                 budget_delta: float = 0.0, composition: Composition = "pld",
                 generator: torch.Generator, cache_dir: str | Path | None = None,
                 transport: Transport | None = None, timeout: float = 30.0) -> None:
        super().__init__(base_url, ServingConfig(kind="vdp", epsilon=epsilon, delta=delta,
                                                 vdp_clip=clip, mechanism=mechanism),
                         budget=budget, budget_delta=budget_delta, composition=composition,
                         generator=generator, cache_dir=cache_dir, transport=transport,
                         timeout=timeout)

    def _params(self) -> dict[str, Any]:
        c = self.config
        return {"epsilon": c.epsilon, "delta": c.delta, "clip": c.vdp_clip,
                "mechanism": c.mechanism}

    def _event(self) -> PrivacyEvent:
        return serving_event(self.config, basis_size=0, dim=self._model.model.dim)

    @torch.no_grad()
    def _draw(self, history: Sequence[NewsRecord]) -> Tensor:
        """The clipped, noised user vector ``Tensor[d]`` (§3.2.1)."""
        vectors, mask, _ = self._model.history_tensors(history)
        c = self.config
        released, _ = vdp_release(self._model.model.encode_user(vectors, mask), clip=c.vdp_clip,
                                  epsilon=c.epsilon, delta=c.delta,
                                  mechanism=c.mechanism,  # type: ignore[arg-type]
                                  generator=self.generator, phase="serve")
        return released[0]


class UniFedRecDevice(_Device):
    """A Uni-FedRec device: protected interest channels up, candidates down, local ranking.

    Per query (Uni-FedRec §3.4-3.5): the clicked news are encoded with the downloaded ranking
    model's news encoder, the recall model clusters them into C ≤ 5 interest channels and
    releases each channel's B_r weights αᵢ = softmax(clip(rᵢ·eᵏ, ±δ) + Laplace(λ_I)) with its
    quota; the server returns ``total`` candidates (quota-proportional per channel), which
    the device ranks with the ranking model's user vector of the FULL local history (never
    sent) and returns the top k.

    Privacy: each channel costs ε = 2δB_r/λ_I and the C channels compose
    (:func:`~privaterec.recall.interest.query_events`). Quotas (hence C) are sent in the clear
    by default — a non-private (ε = ∞) event, so a finite ``budget`` needs
    ``quota_noise_scale``: then every one of the M slots is released with Laplace-noised
    quotas (ε = 2/λ_q) and C is hidden.

    Parameters
    ----------
    base_url, transport, timeout, cache_dir:
        As in :class:`PrivateRecDevice`.
    generator:
        The device's randomness (channel noise, then quota noise).
    noise_scale:
        λ_I override (default: the served recall model's); larger is more private.
    quota_noise_scale:
        λ_q > 0 to noise the quotas (default ``None``: in the clear, as in the paper).
    budget, budget_delta, composition:
        As in :class:`PrivateRecDevice`.
    total:
        Candidates to recall per query (R, 1..1000).
    candidate_vectors:
        ``"server"``: rank with the news vectors the server sends (computed by the same
        ranking model); ``"local"``: encode the candidates' text on the device.
    recall_builder:
        ``(recall_yaml, state_dict) -> UniFedRecRecall`` (default :func:`build_recall_model`).

    Raises
    ------
    ConfigError
        The server has no recall model, or a finite budget with quotas in the clear.
    """

    kind = "unifedrec"
    endpoint = "/v1/recall/unifedrec"
    _cache_field = "channels"

    def __init__(self, base_url: str | None = None, *, generator: torch.Generator,
                 noise_scale: float | None = None, quota_noise_scale: float | None = None,
                 budget: float = math.inf, budget_delta: float = 0.0,
                 composition: Composition = "pld", total: int = 100,
                 candidate_vectors: str = "server", cache_dir: str | Path | None = None,
                 transport: Transport | None = None, timeout: float = 30.0,
                 recall_builder: RecallBuilder | None = None) -> None:
        if noise_scale is not None and not (isinstance(noise_scale, (int, float))
                                            and 0 < noise_scale < math.inf):
            raise ConfigError(f"invalid privacy parameter 'noise_scale' (lambda_I): got "
                              f"{noise_scale!r}, expected a finite number > 0")
        if quota_noise_scale is not None and not (isinstance(quota_noise_scale, (int, float))
                                                  and 0 < quota_noise_scale < math.inf):
            raise ConfigError(f"invalid privacy parameter 'quota_noise_scale': got "
                              f"{quota_noise_scale!r}, expected a finite number > 0 or None")
        if math.isfinite(budget) and quota_noise_scale is None:
            raise ConfigError("quotas sent in the clear (Uni-FedRec Eq. 4) have no DP "
                              "guarantee, so no finite 'budget' can hold: pass "
                              "quota_noise_scale=... (e.g. 1.0) or budget=math.inf")
        if candidate_vectors not in ("server", "local"):
            raise ConfigError(f"invalid 'candidate_vectors': got {candidate_vectors!r}, "
                              f"expected 'server' or 'local'")
        self.noise_scale = noise_scale
        self.quota_noise_scale = quota_noise_scale
        self.total = _check_count(total, "total", MAX_K)
        self.candidate_vectors = candidate_vectors
        self.recall_builder = recall_builder or build_recall_model
        super().__init__(base_url, budget=budget, budget_delta=budget_delta,
                         composition=composition, generator=generator, cache_dir=cache_dir,
                         transport=transport, timeout=timeout)

    def _check_info(self, info: Mapping[str, Any]) -> None:
        if not info.get("recall"):
            raise ConfigError(f"the server's model {info.get('model_version')!r} has no "
                              f"Uni-FedRec recall model: serve a run trained with --method "
                              f"unifedrec")

    def _download(self, info: Mapping[str, Any]) -> None:
        """Download the ranker, then the recall model (same model version)."""
        super()._download(info)
        recall_model = download_recall_model(self._http, info, self.cache_dir,
                                              builder=self.recall_builder)
        if self.noise_scale is not None:
            recall_model.noise_scale = float(self.noise_scale)
        if recall_model.dim != self._model.model.dim:
            raise CheckpointError(f"recall model dim {recall_model.dim} differs from the "
                                  f"ranking model's news vectors ({self._model.model.dim})")
        self.recall = recall_model

    def _params(self) -> dict[str, Any]:
        r = self.recall
        return {"clip": r.clip, "noise_scale": r.noise_scale,
                "quota_noise_scale": self.quota_noise_scale}

    def _new_release(self, history: Sequence[NewsRecord]) -> list[dict[str, Any]]:
        """The channels of ``history`` [C ≤ M] after spending C channel events + the quota's."""
        vectors, mask, _ = self._model.history_tensors(history)
        noisy = self.quota_noise_scale is not None
        query = self.recall.query(vectors, mask, generator=self.generator,
                                  quota_noise_scale=self.quota_noise_scale,
                                  quota_generator=self.generator if noisy else None)
        self.budget.spend(query.events[0])  # raises before anything is sent
        released = query.released[0]
        return [{"weights": json_floats(query.alpha[0, i].tolist()),
                 "quota": json_floats([float(query.quotas[0, i])])[0]}
                for i in range(released.shape[0]) if bool(released[i])]

    @torch.no_grad()
    def recommend(self, history: Sequence[NewsRecord], k: int = 10) -> list[dict[str, Any]]:
        """Recall ``total`` candidates privately, rank them on the device, return the top k.

        Returns
        -------
        ``{"news_id", "title", "category", "score", "channel"}`` best first, ``score`` being
        the ranking model's click score uᵀr computed on the device.
        """
        _check_count(k, "k", self.total)
        items = _check_history(history)
        channels, cached = self.release(items)
        payload = {"channels": channels, "total": self.total,
                   "include_vectors": self.candidate_vectors == "server"}
        response, body = self._post(payload)
        candidates = list(response.get("candidates", []))
        ranked = self.rank(items, candidates)[:k]
        self.last_query = {"endpoint": self.endpoint, "sent": payload, "bytes_sent": len(body),
                           "cached": cached, "received": len(candidates), "items": ranked,
                           "model_version": self.model_version}
        return ranked

    @torch.no_grad()
    def rank(self, history: Sequence[NewsRecord],
             candidates: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Rank recalled candidates with the ranking model on the device (best first).

        The user vector is Θ_U of the (truncated) local history without noise: it never
        leaves the device. Candidate vectors [R, d] are the server's
        (``candidate_vectors="server"`` when present) or encoded here from the candidates'
        text.
        """
        if not candidates:
            return []
        vectors, mask, _ = self._model.history_tensors(history)
        user = self._model.model.encode_user(vectors, mask)[0]
        use_server = (self.candidate_vectors == "server"
                      and all(c.get("vector") is not None for c in candidates))
        if use_server:
            news = torch.tensor([c["vector"] for c in candidates], dtype=user.dtype)
            if news.shape[-1] != user.shape[-1]:
                raise ServerError("POST", self.endpoint, 200,
                                  f"candidate vectors have size {news.shape[-1]}, the model's "
                                  f"is {user.shape[-1]}")
        else:
            records = [NewsRecord(str(c["news_id"]), str(c.get("category") or ""),
                                  str(c.get("subcategory") or ""), str(c.get("title") or ""),
                                  str(c.get("abstract") or "")) for c in candidates]
            news = self._model.encode_news(records)[1:]
        scores = (news @ user).tolist()
        order = sorted(range(len(candidates)), key=lambda i: (-scores[i], i))
        return [{"news_id": candidates[i]["news_id"], "title": candidates[i].get("title"),
                 "category": candidates[i].get("category"), "score": scores[i],
                 "channel": candidates[i].get("channel")} for i in order]


__all__ = ["MAX_K", "PrivateRecDevice", "UniFedRecDevice", "VDPDevice"]
