"""The devices: private queries of the serving API (PrivateRec Alg. 1-2, Uni-FedRec §3.4).

A device holds the news its user read (:class:`~privaterec.data.records.NewsRecord`) and never
sends them. It downloads the public model once (:mod:`privaterec.serving.download`) and per
query releases only a privatised summary of the (truncated) history:

* :class:`PrivateRecDevice` — Alg. 2 (:func:`privaterec.ondevice.release.dpa_release`): α̃ [B]
  to ``/v1/recommend/privaterec``; the server scores ũ = Σ α̃ᵢ bᵢ over its pool (Alg. 1).
* :class:`VDPDevice` — the VDP baseline (§3.2.1): the clipped, noised user vector [d] to
  ``/v1/recommend/vdp``.
* :class:`ServingDevice` — any serving mode that sends one vector per query
  (:data:`privaterec.ondevice.release.SERVING_MODES`); the two above are its ``privaterec``
  and ``vdp`` modes.
* :class:`UniFedRecDevice` — Uni-FedRec §3.4-3.5: protected channel weights [C, B_r] (and
  quotas) to ``/v1/recall/unifedrec``, then local ranking of the returned candidates.

Every release is charged to the device's :class:`~privaterec.ondevice.budget.DeviceBudget`
before it is sent (raising :class:`~privaterec.errors.PrivacyBudgetExceeded` instead when it
would exceed the cap or the re-release limit); an unchanged history re-sends its cached
release at no cost. A release is recorded before it is sent, so a failed request can be
retried with it at no cost.

Randomness (docs/serving.md#randomness-on-devices): a device draws every random bit — padding, noise — from
:class:`~privaterec.privacy.samplers.SecureNoise` (the OS CSPRNG; float-safe OpenDP Laplace /
Gaussian releases). There is no seed to pass, so no server can replay the stream. A seeded
source is accepted only through the keyword ``insecure_simulation_noise=SimulationNoise(g)``,
for simulations and tests; such a device logs a warning and every event it records carries
:data:`~privaterec.privacy.samplers.SIMULATED_NOTE`.

Budget: by default a device may release ε = 10 in total
(:data:`~privaterec.ondevice.budget.DEFAULT_DEVICE_BUDGET`), keeps its ledger in ``cache_dir``
or, without one, in :func:`~privaterec.ondevice.budget.default_state_dir` (per OS user,
persistent), locks it for every spend, and releases one history at most twice a day however
often the server changes its model (``max_fresh_releases``, ``release_window``).

Timing: a query whose history is unchanged re-sends its cached release without running the
model or drawing noise, so it is faster (the device-side work of a fresh PrivateRec release is
measured in ``benchmarks/device_noise_cost.py``). A server that times requests can tell a
cache hit — but the cached payload is byte-identical to the previous one, so the server
learns the same fact (this history did not change under this model) from the payload itself;
timing adds nothing beyond it, and it is not padded. That fact is outside the DP guarantee;
``max_fresh_releases`` bounds how often a server can probe it by switching models. A fresh
release's time also grows with the number of clicks encoded (at most H); not padded either.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from pathlib import Path
from typing import Any, Mapping, Sequence, TypedDict, Unpack

import torch
from torch import Tensor

from privaterec.config import NoiseKind
from privaterec.data.records import NewsRecord
from privaterec.errors import CheckpointError, ConfigError
from privaterec.privacy.events import PrivacyEvent
from privaterec.privacy.ledger import Composition, PrivacyLedger
from privaterec.privacy.mechanisms import clip_elementwise
from privaterec.privacy.noise import noise_mechanism
from privaterec.privacy.samplers import (SIMULATED_NOTE, NoiseSource, SecureNoise,
                                         SimulationNoise)
from privaterec.recall.interest import query_events
from privaterec.ondevice.budget import (DEFAULT_DEVICE_BUDGET, DEFAULT_GAUSSIAN_DELTA,
                                       DEFAULT_MAX_FRESH_RELEASES, DEFAULT_RELEASE_WINDOW,
                                       STATE_FILE, DeviceBudget, Events, default_state_dir,
                                       history_digest, release_key)
from privaterec.serving.device_common import MAX_K, DeviceBase, check_count, check_history
from privaterec.serving.download import RecallBuilder, build_recall_model, download_recall_model
from privaterec.ondevice.release import Normalization, ServingConfig, serving_event
from privaterec.serving.transport import (ModelChangedError, ServerError, Transport, json_body,
                                          json_floats)
from privaterec.validators import check_in, fail

_log = logging.getLogger(__name__)


class DeviceOptions(TypedDict, total=False):
    """The keyword arguments every device takes besides its budget, documented in
    :class:`PrivateRecDevice` (defaults: ``composition="pld"``, ``timeout=30.0``, no cache
    directory, the default transport, 2 fresh releases per day, :class:`SecureNoise`)."""

    composition: Composition
    cache_dir: str | Path | None
    transport: Transport | None
    timeout: float
    max_fresh_releases: int | None
    release_window: float
    insecure_simulation_noise: SimulationNoise | None


def _noise_source(insecure_simulation_noise: SimulationNoise | None) -> NoiseSource:
    if insecure_simulation_noise is None:
        return SecureNoise()
    if not isinstance(insecure_simulation_noise, SimulationNoise):
        raise ConfigError(f"'insecure_simulation_noise' takes SimulationNoise(generator) for a "
                          f"simulation or a test, got "
                          f"{type(insecure_simulation_noise).__name__}; a real device needs "
                          f"no randomness argument (it uses SecureNoise, the OS CSPRNG)")
    _log.warning("device built with insecure_simulation_noise: its releases use seeded noise "
                 "that anyone with the seed can regenerate; for simulations and tests only")
    return insecure_simulation_noise


class _Device(DeviceBase):
    """What the querying devices add to :class:`DeviceBase`: noise source, budget, release
    cache.

    A subclass names its ``kind`` (release-cache key) and ``endpoint``, and implements
    :meth:`_params` (what a release depends on besides the history) and :meth:`_new_release`
    (spend the budget, then return the JSON value to send, stored in the cache under
    ``_cache_field``).
    """

    kind = ""
    endpoint = ""
    _cache_field = ""

    def __init__(self, base_url: str | None, *, budget: float, budget_delta: float,
                 composition: Composition = "pld", cache_dir: str | Path | None = None,
                 transport: Transport | None = None, timeout: float = 30.0,
                 max_fresh_releases: int | None = DEFAULT_MAX_FRESH_RELEASES,
                 release_window: float = DEFAULT_RELEASE_WINDOW,
                 insecure_simulation_noise: SimulationNoise | None = None) -> None:
        self.noise = _noise_source(insecure_simulation_noise)
        super().__init__(base_url, cache_dir=cache_dir, transport=transport, timeout=timeout)
        state_dir = self.cache_dir if self.cache_dir is not None else default_state_dir()
        self.budget = DeviceBudget(cap=budget, delta=budget_delta, composition=composition,
                                   path=state_dir / STATE_FILE,
                                   max_fresh_releases=max_fresh_releases,
                                   release_window=release_window)
        self.last_query: dict[str, Any] | None = None
        self.refresh()

    @property
    def simulated(self) -> bool:
        """Whether this device runs on seeded :class:`SimulationNoise` (not for deployment)."""
        return not self.noise.secure

    def _charge(self, events: Events, history: str) -> None:
        """Spend ``events`` for a fresh release of ``history`` (raises before anything is sent).

        A simulated device's events carry :data:`SIMULATED_NOTE`.
        """
        if self.simulated:
            events = [(dataclasses.replace(e, note=f"{e.note}; {SIMULATED_NOTE}"
                                           if e.note else SIMULATED_NOTE), c)
                      for e, c in events]
        self.budget.spend(events, history=history)

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

    # -- release ---------------------------------------------------------------------
    def _params(self) -> dict[str, Any]:
        raise NotImplementedError

    def _new_release(self, history: Sequence[NewsRecord], digest: str) -> Any:
        raise NotImplementedError

    def release(self, history: Sequence[NewsRecord]) -> tuple[Any, bool]:
        """What this device sends for ``history``: ``(value, from_cache)``.

        The value is the vector (``list[float]``) of a ranking device, or Uni-FedRec's
        channels ``[{"weights": [B_r floats], "quota": float}]``. Spends the budget (or
        raises :class:`~privaterec.errors.PrivacyBudgetExceeded` before anything is sent) unless
        the same truncated history was released before under the same model and parameters. A
        fresh release of a history (the whole history given, whatever the model's history_len)
        already released ``max_fresh_releases`` times within ``release_window`` raises
        :class:`~privaterec.ondevice.budget.ReleaseLimitExceeded`.
        """
        items = check_history(history)
        kept = items[-self._model.config.model.history_len:]
        params = self._params()
        if self.simulated:  # never re-send a simulated release from a real device's cache
            params = {**params, "noise": "simulation"}
        key = release_key(self.kind, self.model_version, params, kept)
        entry = self.budget.cached(key)
        if entry is not None:
            return copy.deepcopy(entry[self._cache_field]), True
        # The re-release limit is keyed on the whole history, not on its truncation to the
        # server-supplied history_len: a server changing H per model version would otherwise
        # get fresh releases of one history under ever new keys.
        value = self._new_release(kept, history_digest(items))
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


class ServingDevice(_Device):
    """A device of any serving mode that sends one vector per query: it POSTs its mode's
    release to the mode's endpoint (:class:`~privaterec.ondevice.release.ServingMode`:
    ``endpoint``, ``field``, ``cache_params``, ``release``). The other parameters are those
    of :class:`PrivateRecDevice`."""

    _cache_field = "values"

    def __init__(self, base_url: str | None, config: ServingConfig, *,
                 budget: float = DEFAULT_DEVICE_BUDGET, budget_delta: float | None = None,
                 **options: Unpack[DeviceOptions]) -> None:
        self.config, self.mode = config, config.mode
        if not self.mode.endpoint:
            raise ConfigError(f"{config.kind} serving sends no query: {self.mode.help}")
        self.kind, self.endpoint, self.field = config.kind, self.mode.endpoint, self.mode.field
        pure = noise_mechanism(config.mechanism).pure
        if budget_delta is None:  # 0 (pure DP, exact Σε) or 1e-6 for Gaussian devices
            budget_delta = 0.0 if pure else DEFAULT_GAUSSIAN_DELTA
        if not pure and math.isfinite(budget) and not budget_delta > 0:
            raise ConfigError(f"a finite 'budget' with the {config.mechanism} mechanism needs "
                              "'budget_delta' > 0 (the target delta of the composed releases)")
        super().__init__(base_url, budget=budget, budget_delta=budget_delta, **options)

    def _check_info(self, info: Mapping[str, Any]) -> None:
        if self.mode.needs_basis and not info.get("basis_size"):
            raise ConfigError(f"the server's model {info.get('model_version')!r} has no basic "
                              f"vectors (basis_size = 0): {self.mode.name} serving needs a "
                              f"model trained with --method privaterec; use VDPDevice "
                              f"otherwise")

    @property
    def basis_size(self) -> int:
        return int(self._model.config.model.basis_size)

    def _params(self) -> dict[str, Any]:
        return {key: getattr(self.config, name) for key, name in self.mode.cache_params}

    def _event(self) -> PrivacyEvent:
        return serving_event(self.config, basis_size=self.basis_size,
                             dim=self._model.model.dim)

    @torch.no_grad()
    def _draw(self, history: Sequence[NewsRecord]) -> Tensor:
        """The release ``Tensor[width]`` of the history, from the device's noise source."""
        vectors, mask, r0 = self._model.history_tensors(history)
        return self.mode.release(self._model.model, r0, vectors, mask, self.config,
                                 self.noise)[0]

    def _new_release(self, history: Sequence[NewsRecord], digest: str) -> list[float]:
        self._charge([(self._event(), 1)], digest)  # raises before anything is drawn or sent
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
        check_count(k, "k", MAX_K)
        values, cached = self.release(history)
        payload = {self.field: values, "k": k}
        response, body = self._post(payload)
        items = list(response.get("items", []))
        self.last_query = {"endpoint": self.endpoint, "sent": payload, "bytes_sent": len(body),
                           "cached": cached, "received": items,
                           "model_version": self.model_version}
        return items


class PrivateRecDevice(ServingDevice):
    """A PrivateRec device: releases α̃ (B floats) per query (Alg. 1-2; docs/privacy.md).

    Alg. 2 on the device (:func:`privaterec.ondevice.release.dpa_release`): each clicked news is
    replaced by the anonymous news r₀ with probability p, u = Θ_U(history) [d],
    α = attention(u) [B], Laplace or analytic-Gaussian noise calibrated with the TRUE
    simplex sensitivity (L1 = 2, L2 = √2) at the padding-amplified budget, α̃ =
    softplus-normalised α + n (docs/privacy.md#dpa-sensitivity to #gaussian-calibration). It POSTs
    ``{"alpha": [B floats], "k"}``.

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
        Cap on the device's total ε at target δ (:class:`DeviceBudget`; default ε = 10,
        δ = 0 for Laplace and 1e-6 for Gaussian; ``math.inf``: record only).
    cache_dir:
        Keeps the downloaded parameters, the ledger and the release cache across restarts
        (one ledger per ``cache_dir``: use one directory per user). Default: the ledger in
        :func:`~privaterec.ondevice.budget.default_state_dir` (``$PRIVATEREC_DEVICE_DIR``,
        else ``~/.local/state/privaterec/device``), parameters not cached.
    transport:
        An httpx-compatible client (default: ``httpx.Client(base_url)``).
    timeout:
        Seconds per request of the default transport.
    max_fresh_releases, release_window:
        At most this many fresh releases of one history per window (seconds; default 2 per
        day), whatever the server's ``model_version``.
    insecure_simulation_noise:
        SIMULATION AND TESTS ONLY: a seeded :class:`~privaterec.privacy.samplers.SimulationNoise`
        instead of the OS CSPRNG. Its releases can be regenerated by whoever knows the seed;
        the device logs a warning and marks its ledger events as simulated. Never set it on
        a real device.

    Raises
    ------
    ConfigError
        Invalid privacy parameters, or the server's model has no basic vectors.
    """

    def __init__(self, base_url: str | None = None, *, epsilon: float, delta: float = 0.0,
                 padding_p: float = 0.5, mechanism: NoiseKind = "laplace",
                 normalization: Normalization = "softplus", budget: float = DEFAULT_DEVICE_BUDGET,
                 budget_delta: float | None = None, **options: Unpack[DeviceOptions]) -> None:
        super().__init__(base_url, ServingConfig(kind="privaterec", epsilon=epsilon, delta=delta,
                                                 padding_p=padding_p, mechanism=mechanism,
                                                 normalization=normalization),
                         budget=budget, budget_delta=budget_delta, **options)


class VDPDevice(ServingDevice):
    """The VDP baseline device (PrivateRec §3.2.1): sends the d-dim user vector, clipped to
    θ (L1 for Laplace, L2 for Gaussian) plus noise with Δ = 2θ, to ``/v1/recommend/vdp``.

    Parameters are those of :class:`PrivateRecDevice`, with ``clip`` (θ, the paper's 0.001)
    instead of ``padding_p``/``normalization``.
    """

    def __init__(self, base_url: str | None = None, *, epsilon: float, delta: float = 0.0,
                 clip: float = 0.001, mechanism: NoiseKind = "laplace",
                 budget: float = DEFAULT_DEVICE_BUDGET, budget_delta: float | None = None,
                 **options: Unpack[DeviceOptions]) -> None:
        super().__init__(base_url, ServingConfig(kind="vdp", epsilon=epsilon, delta=delta,
                                                 vdp_clip=clip, mechanism=mechanism),
                         budget=budget, budget_delta=budget_delta, **options)


@torch.no_grad()
def recall_release(recall: Any, vectors: Tensor, mask: Tensor, noise: NoiseSource, *,
                   quota_noise_scale: float | None) -> tuple[Tensor, Tensor, Tensor, Events]:
    """One user's Uni-FedRec recall upload (§3.4) with the device's noise source.

    The computation of :func:`privaterec.recall.query.release_query` for one user
    (same draws in the same order: channel scores, then quotas), with every release going
    through ``noise`` (:class:`SecureNoise` on a device): channels and their quotas from the
    clustering of the history, decomposition scores clipped to ±δ plus Laplace(λ_I) (Eq. 2),
    αᵢ = softmax (Eq. 3); quotas in the clear, or (``quota_noise_scale``) every one of the M
    slots with Laplace(λ_q)-noised quotas projected back to the simplex.

    Parameters
    ----------
    recall:
        The downloaded ``UniFedRecRecall`` (with ``clip`` set).
    vectors, mask:
        ``[1, H, d]`` clicked-news vectors and ``[1, H]`` mask.
    noise:
        The randomness.
    quota_noise_scale:
        λ_q, or ``None`` for quotas in the clear.

    Returns
    -------
    ``(alpha [M, B], quotas [M], released BoolTensor[M], events)``.
    """
    if not recall.use_bie or recall.clip is None:
        raise ConfigError("this recall model has no protected query (no basic interest "
                          "embeddings, or clip=None)")
    batch = recall.channels(vectors, mask)
    r = recall.interests(recall.context(vectors, mask), batch.channel_ids)
    valid = batch.valid
    scores = recall.interest.decompose(r)
    scores = torch.where(valid.unsqueeze(-1), scores, torch.zeros_like(scores))
    alpha = recall.weights(noise.release_laplace(clip_elementwise(scores, recall.clip),
                                                 scale=float(recall.noise_scale)))
    quotas = batch.quotas
    if quota_noise_scale is None:
        released = valid
    else:  # as perturb_quotas: clamp at 0, renormalise (uniform if nothing is left)
        clamped = noise.release_laplace(quotas, scale=quota_noise_scale).clamp_min(0.0)
        total = clamped.sum(dim=-1, keepdim=True)
        quotas = torch.where(total > 0, clamped / total.clamp_min(torch.finfo(total.dtype).tiny),
                             torch.full_like(clamped, 1.0 / quotas.shape[-1]))
        released = torch.ones_like(valid)
    count = int(released[0].sum())
    events = query_events(count, num_basis=recall.num_basis, clip=recall.clip,
                          noise_scale=float(recall.noise_scale),
                          quota_noise_scale=quota_noise_scale, num_quota_slots=count)
    return alpha[0], quotas[0], released[0], events


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
    base_url, transport, timeout, cache_dir, max_fresh_releases, release_window:
        As in :class:`PrivateRecDevice`.
    insecure_simulation_noise:
        As in :class:`PrivateRecDevice` (simulation only; channel noise, then quota noise).
    noise_scale:
        λ_I override (default: the served recall model's); larger is more private.
    quota_noise_scale:
        λ_q > 0 to noise the quotas (default ``None``: in the clear, as in the paper).
    budget, budget_delta, composition:
        As in :class:`PrivateRecDevice` (default ε = 10, δ = 0). The paper's quotas in the
        clear are not DP, so the default budget needs ``quota_noise_scale``; pass
        ``budget=math.inf`` to send them in the clear with no guarantee.
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

    def __init__(self, base_url: str | None = None, *, noise_scale: float | None = None,
                 quota_noise_scale: float | None = None,
                 budget: float = DEFAULT_DEVICE_BUDGET, budget_delta: float | None = None,
                 total: int = 100, candidate_vectors: str = "server",
                 recall_builder: RecallBuilder | None = None,
                 **options: Unpack[DeviceOptions]) -> None:
        if noise_scale is not None and not (isinstance(noise_scale, (int, float))
                                            and 0 < noise_scale < math.inf):
            raise ConfigError(f"invalid privacy parameter 'noise_scale' (lambda_I): got "
                              f"{noise_scale!r}, expected a finite number > 0")
        if quota_noise_scale is not None:
            check_in(quota_noise_scale, "quota_noise_scale", 0, math.inf,
                     "a finite number > 0 or None", open_low=True)
        if math.isfinite(budget) and quota_noise_scale is None:
            raise ConfigError("quotas sent in the clear (Uni-FedRec Eq. 4) have no DP "
                              "guarantee, so no finite 'budget' (default 10) can hold: pass "
                              "quota_noise_scale=... (e.g. 1.0), or budget=math.inf to send "
                              "them in the clear with no guarantee")
        if candidate_vectors not in ("server", "local"):
            fail("candidate_vectors", candidate_vectors, "'server' or 'local'", kind="")
        self.noise_scale = noise_scale
        self.quota_noise_scale = quota_noise_scale
        self.total = check_count(total, "total", MAX_K)
        self.candidate_vectors = candidate_vectors
        self.recall_builder = recall_builder or build_recall_model
        super().__init__(base_url, budget=budget,
                         budget_delta=0.0 if budget_delta is None else budget_delta, **options)

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

    def _new_release(self, history: Sequence[NewsRecord],
                     digest: str) -> list[dict[str, Any]]:
        """The channels of ``history`` [C ≤ M] after spending C channel events + the quota's."""
        vectors, mask, _ = self._model.history_tensors(history)
        alpha, quotas, released, events = recall_release(
            self.recall, vectors, mask, self.noise, quota_noise_scale=self.quota_noise_scale)
        self._charge(events, digest)  # raises before anything is sent
        return [{"weights": json_floats(alpha[i].tolist()),
                 "quota": json_floats([float(quotas[i])])[0]}
                for i in range(released.shape[0]) if bool(released[i])]

    @torch.no_grad()
    def recommend(self, history: Sequence[NewsRecord], k: int = 10) -> list[dict[str, Any]]:
        """Recall ``total`` candidates privately, rank them on the device, return the top k.

        Returns
        -------
        ``{"news_id", "title", "category", "score", "channel"}`` best first, ``score`` being
        the ranking model's click score uᵀr computed on the device.
        """
        check_count(k, "k", self.total)
        items = check_history(history)
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


__all__ = ["MAX_K", "DeviceOptions", "PrivateRecDevice", "ServingDevice", "UniFedRecDevice", "VDPDevice",
           "recall_release"]
