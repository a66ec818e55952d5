"""Device side of private online serving: the client SDK (PrivateRec Alg. 1-2, Uni-FedRec).

The public facade of the SDK: import from here. A device holds the news its user read
(:class:`~privaterec.data.records.NewsRecord`) and never sends them. It downloads the public
model once (``GET /v1/model`` and its parameters), rebuilds it, and per query releases only
a privatised summary of the (truncated) history:

* :class:`PrivateRecDevice` — Alg. 2 on the device (:func:`dpa_release`): α̃ [B], padded and
  noised (docs/privacy.md#dpa-sensitivity), POSTed to ``/v1/recommend/privaterec``; the
  server scores ũ = Σ α̃ᵢ bᵢ over its pool (Alg. 1).
* :class:`VDPDevice` — the VDP baseline (§3.2.1): the d-dim user vector clipped to θ plus
  noise, POSTed to ``/v1/recommend/vdp``.
* :class:`ServingDevice` — a device of any serving mode that sends one vector per query
  (:data:`privaterec.ondevice.release.SERVING_MODES`; the two above are two of them).
* :class:`UniFedRecDevice` — Uni-FedRec §3.4: the recall model's protected channel weights
  (:func:`~privaterec.recall.query.release_query`, noise λ_I; quotas in the clear
  unless ``quota_noise_scale``) are POSTed to ``/v1/recall/unifedrec``; the returned
  candidates are ranked ON THE DEVICE with the ranking model and the full local history.

Privacy accounting (docs/privacy.md#the-ledger): every device keeps a ledger
(:class:`DeviceBudget`, one user, :data:`DEVICE_USER`) and a budget cap; a release that would take
the total ε above the cap raises :class:`~privaterec.errors.PrivacyBudgetExceeded` before anything
is sent. Re-sending the release cached for an unchanged (truncated) history is post-processing: it
costs nothing and records no event. A release is recorded before it is sent, so a failed request
can be retried with the cached release at no cost. With ``cache_dir`` the downloaded parameters,
the ledger and the release cache survive restarts (one ledger per ``cache_dir``: use one
directory per user); without it the ledger persists in :func:`default_state_dir`. The default
cap is ε = 10 per device; the state file is locked for every spend; one history is freshly
released at most twice a day whatever the server's model version
(:class:`ReleaseLimitExceeded`). Adjacency is substitution of one item of the fixed-length
(truncated) history, as in :func:`privaterec.privacy.formulas.amplified_budget`.

Randomness: devices draw from :class:`SecureNoise` (OS CSPRNG, float-safe OpenDP noise) and
take no seed; :class:`SimulationNoise` is accepted only as ``insecure_simulation_noise=`` for
simulations and tests (:mod:`privaterec.privacy.samplers`).

Public API, by module (imports flow one way: client → process → device → budget, download →
transport; the DPA computation is :mod:`privaterec.ondevice.release`'s, shared with the offline
evaluation):

* devices (:mod:`~privaterec.serving.device`): :class:`PrivateRecDevice`, :class:`VDPDevice`,
  :class:`ServingDevice`, :class:`UniFedRecDevice`, :data:`MAX_K`;
* PrivateRec Alg. 2 (:mod:`privaterec.ondevice.release`): :func:`dpa_release`,
  :class:`DpaRelease`;
* privacy account (:mod:`~privaterec.ondevice.budget`): :class:`DeviceBudget`,
  :data:`DEVICE_USER`, :data:`DEFAULT_DEVICE_BUDGET`, :class:`ReleaseLimitExceeded`,
  :func:`default_state_dir`;
* randomness (:mod:`privaterec.privacy.samplers`): :class:`SecureNoise`,
  :class:`SimulationNoise`;
* model download (:mod:`~privaterec.serving.download`): :func:`fetch_model`,
  :func:`download_model`, :class:`DeviceModel`, :func:`build_recall_model`;
* HTTP (:mod:`~privaterec.serving.transport`): :class:`Transport` (any object with httpx's
  ``request(method, url, content=..., headers=...)``, e.g. FastAPI's ``TestClient(app)``;
  default an ``httpx.Client`` on ``base_url``), :func:`json_body`, :class:`ServerError`,
  :class:`ModelChangedError`;
* local server (:mod:`~privaterec.serving.process`): :class:`ServerProcess` (``privaterec
  serve`` on loopback for demos, end-to-end tests, benchmarks), :func:`demo_query` (the
  demo's private query), :func:`free_port`.
"""

from __future__ import annotations

from privaterec.ondevice.release import DpaRelease, dpa_release
from privaterec.privacy.samplers import SecureNoise, SimulationNoise
from privaterec.ondevice.budget import (DEFAULT_DEVICE_BUDGET, DEVICE_USER, DeviceBudget,
                                       ReleaseLimitExceeded, default_state_dir)
from privaterec.serving.device import (MAX_K, PrivateRecDevice, ServingDevice, UniFedRecDevice,
                                       VDPDevice)
from privaterec.serving.download import (DeviceModel, build_recall_model, download_model,
                                         fetch_model)
from privaterec.serving.process import ServerProcess, demo_query, free_port
from privaterec.serving.transport import ModelChangedError, ServerError, Transport, json_body

__all__ = ["DEFAULT_DEVICE_BUDGET", "DEVICE_USER", "DeviceBudget", "DeviceModel", "DpaRelease",
           "MAX_K", "ModelChangedError", "PrivateRecDevice", "ReleaseLimitExceeded",
           "SecureNoise", "ServerError", "ServerProcess", "ServingDevice", "SimulationNoise",
           "Transport",
           "UniFedRecDevice", "VDPDevice", "build_recall_model", "default_state_dir",
           "demo_query", "download_model", "dpa_release", "fetch_model", "free_port",
           "json_body"]

from privaterec.serving.local_device import LocalRankingDevice  # noqa: E402  (local ranking)
__all__ += ["LocalRankingDevice"]
