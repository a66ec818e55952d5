"""The device SDK (privaterec.serving.client) against an in-process fake server.

The fake speaks the serving API, validates every body with the server's own request models
(privaterec.serving.schemas) and records what the device sent, so the tests can check what
left the device: only α̃ (or the channel weights) and k, never the history. The real server
is exercised in test_end_to_end.py.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import time

import httpx
import numpy as np
import pytest
import torch
import yaml
from scipy import stats

from privaterec.config import ModelConfig, RunConfig
from privaterec.data.features import build_news_features, build_vocabularies
from privaterec.data.records import NewsRecord
from privaterec.data.synth import SynthConfig, generate
from privaterec.errors import ConfigError, PrivacyBudgetExceeded
from privaterec.eval.serving import private_user_encoder
from privaterec.ondevice.release import ServingConfig
from privaterec.models.factory import build_recommender
from privaterec.privacy.formulas import amplified_budget
from privaterec.privacy.mechanisms import clip_l1
from privaterec.recall.index import ScoreSpaceIndex
from privaterec.runs.recall import RecallModelConfig
from privaterec.privacy.samplers import SIMULATED_NOTE, SecureNoise, SimulationNoise
from privaterec.serving.client import (ModelChangedError, PrivateRecDevice, UniFedRecDevice,
                                       VDPDevice, dpa_release, json_body)
from privaterec.serving.schemas import request_models

TINY = ModelConfig(word_dim=8, num_heads=2, head_dim=8, attention_dim=8, title_len=6,
                   abstract_len=4, history_len=5, basis_size=3)
SYNTH = SynthConfig(users=30, news=120, seed=5, impressions_per_user=1, min_history=5,
                    max_history=10, max_candidates=10)
D = 16
# Threshold 0: every distinct click is its own interest, cut to at most M = 3 channels.
RECALL = RecallModelConfig(num_basis=6, attention_dim=8, max_channels=3, distance_threshold=0.0,
                           clip=0.2, noise_scale=1.2)


class FakeServer:
    """The serving API in process: an httpx-compatible transport that records requests."""

    def __init__(self, world, *, basis_size: int | None = None, recall: bool = True) -> None:
        self.w = world
        self.version = "v1"
        self.served_version = None  # set to simulate a model swap on the server
        self.requests: list[tuple[str, str, bytes | None]] = []
        self.basis_size = TINY.basis_size if basis_size is None else basis_size
        self.recall = recall
        self.bundles: dict[str, bytes] = {}  # parameters of versions other than v1
        self.schemas = request_models(basis_size=self.basis_size, dim=D,
                                      recall_basis_size=RECALL.num_basis, max_channels=3)

    def count(self, path: str) -> int:
        return sum(1 for _, url, _ in self.requests if url == path)

    def posts(self) -> list[dict]:
        return [json.loads(body) for method, _, body in self.requests if method == "POST"]

    def request(self, method, url, *, content=None, headers=None):
        self.requests.append((method, url, content))
        w = self.w
        if url == "/v1/model":
            return httpx.Response(200, json={
                "model_version": self.version, "method": "privaterec", "news_encoder": "nrms",
                "basis_size": self.basis_size, "dim": D, "num_news": len(w.pool),
                "parameters_url": "/v1/model/parameters",
                "recall": {"basis_size": RECALL.num_basis, "dim": D, "max_channels": 3,
                           "parameters_url": "/v1/model/recall-parameters"}
                if self.recall else None, "privacy_note": ""})
        if url == "/v1/model/parameters":
            return httpx.Response(200, content=self.bundles.get(self.version, w.parameters))
        if url == "/v1/model/recall-parameters":
            return httpx.Response(200, content=w.recall_parameters)
        version = self.served_version or self.version
        if url == "/v1/recommend/privaterec":
            query = self.schemas.query["privaterec"].model_validate_json(content)
            scores = np.asarray(query.alpha, np.float32) @ w.score_matrix
            return httpx.Response(200, json={"model_version": version,
                                             "items": w.items(scores, query.k)})
        if url == "/v1/recommend/vdp":
            query = self.schemas.query["vdp"].model_validate_json(content)
            scores = w.news_vectors @ np.asarray(query.embedding, np.float32)
            return httpx.Response(200, json={"model_version": version,
                                             "items": w.items(scores, query.k)})
        if url == "/v1/recall/unifedrec":
            query = self.schemas.recall.model_validate_json(content)
            alpha = np.asarray([c.weights for c in query.channels])
            quotas = np.asarray([c.quota for c in query.channels])
            rows = w.recall_index.recall(alpha, quotas / quotas.sum(), query.total)
            channel = w.recall_index.channel_scores(alpha)[:, rows].argmax(0)
            return httpx.Response(200, json={"model_version": version, "candidates": [
                {"news_id": w.pool[r].news_id, "title": w.pool[r].title,
                 "category": w.pool[r].category, "subcategory": w.pool[r].subcategory,
                 "abstract": w.pool[r].abstract, "channel": int(c),
                 "vector": w.news_vectors[r].tolist() if query.include_vectors else None}
                for r, c in zip(rows.tolist(), channel.tolist())]})
        return httpx.Response(404, json={"detail": f"no route {url}"})


class World:
    """A tiny trained-shape PrivateRec model, its bundle, a news pool and a recall model."""

    def __init__(self, tmp_path) -> None:
        dataset = generate(SYNTH)
        self.vocabs = build_vocabularies(dataset.train.news.values())
        self.pool = list(dataset.all_news().values())
        self.features = build_news_features(self.pool, self.vocabs, title_len=6, abstract_len=4)
        torch.manual_seed(0)
        self.model = build_recommender(TINY, self.vocabs, self.features).eval()
        with torch.no_grad():
            self.news_vectors = self.model.encode_rows(
                torch.arange(1, len(self.pool) + 1)).numpy()
            self.score_matrix = self.model.basis.score_matrix(
                torch.from_numpy(self.news_vectors)).numpy()
        vocab_path = tmp_path / "vocab.json"
        self.vocabs.save(vocab_path)
        self.vocab_json = vocab_path.read_text()
        self.parameters = self.parameters_of("v1")
        torch.manual_seed(1)
        self.recall_model = RECALL.build(D).eval()
        with torch.no_grad():  # sharp self-attention: distinct context vectors per click
            self.recall_model.self_attention.query.weight.mul_(30)
            self.recall_model.self_attention.key.weight.mul_(30)
        self.recall_parameters = _bundle({
            "recall_yaml": yaml.safe_dump(dataclasses.asdict(RECALL)),
            "state_dict": self.recall_model.state_dict(), "model_version": "v1"})
        self.recall_index = ScoreSpaceIndex(self.recall_model.interest.values.detach(),
                                            self.news_vectors)
        self.histories = [[self.pool[i] for i in range(s, s + 7)] for s in range(0, 70, 7)]

    def parameters_of(self, version: str) -> bytes:
        """The model bundle the server sends for ``version`` (same weights)."""
        return _bundle({"config_yaml": yaml.safe_dump(RunConfig(model=TINY).to_dict()),
                        "vocab_json": self.vocab_json, "state_dict": self.model.state_dict(),
                        "model_version": version})

    def items(self, scores: np.ndarray, k: int) -> list[dict]:
        order = np.argsort(-scores, kind="stable")[:k]
        return [{"news_id": self.pool[i].news_id, "title": self.pool[i].title,
                 "category": self.pool[i].category, "score": float(scores[i])} for i in order]

    def history_tensors(self, history):
        """Vectors and mask of a history from the full news table (the offline path)."""
        rows = torch.tensor([self.features.row[n.news_id] for n in history[-5:]])
        with torch.no_grad():
            vectors = self.model.encode_rows(rows)[None]
        return vectors, torch.ones(1, len(rows), dtype=torch.bool)


def _bundle(payload: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return World(tmp_path_factory.mktemp("world"))


@pytest.fixture
def server(world):
    return FakeServer(world)


def device(server, **kwargs):
    """A PrivateRec device as on a real phone (SecureNoise), talking to the fake server."""
    options = dict(epsilon=1.0, transport=server)
    return PrivateRecDevice(**{**options, **kwargs})


def simulated(seed: int) -> SimulationNoise:
    """Seeded noise for the tests that compare a device with the offline computation."""
    return SimulationNoise(torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------- noise calibration
def test_dpa_noise_has_the_laplace_scale_of_the_amplified_simplex_budget(world):
    eps, p, m = 1.0, 0.5, 4000
    vectors, mask = world.history_tensors(world.histories[0])
    out = dpa_release(world.model, world.model.encode_rows(torch.tensor([0]))[0].detach(),
                      vectors.expand(m, -1, -1), mask.expand(m, -1),
                      ServingConfig(kind="privaterec", epsilon=eps, padding_p=p),
                      noise=SimulationNoise(torch.Generator().manual_seed(1)))
    noise = out.noise.flatten().double().numpy()
    # Independent calibration: ε′ = ln((e^ε − p)/(1 − p)) (padding), L1 sensitivity 2.
    scale = 2.0 / math.log((math.exp(eps) - p) / (1 - p))
    assert out.event.noise_scale == pytest.approx(scale)
    assert stats.kstest(noise, "laplace", args=(0, scale)).pvalue > 1e-3
    assert np.mean(np.abs(noise)) == pytest.approx(scale, rel=0.04)  # E|X| = b
    # The test has power: the paper's sensitivity (b/2) and no amplification (2/ε) are rejected.
    assert stats.kstest(noise, "laplace", args=(0, scale / 2)).pvalue < 1e-9
    assert stats.kstest(noise, "laplace", args=(0, 2.0 / eps)).pvalue < 1e-9
    # Padding really happened at rate p on the real clicks, and α̃ is α + n normalised.
    assert out.padded.float().mean().item() == pytest.approx(p, abs=0.02)
    torch.testing.assert_close(out.released.sum(-1), torch.ones(m))
    assert bool((out.released > 0).all())


def test_dpa_gaussian_noise_is_the_analytic_gaussian_of_sensitivity_sqrt2(world):
    from dp_accounting import get_epsilon_gaussian

    eps, delta, p, m = 2.0, 1e-5, 0.3, 4000
    vectors, mask = world.history_tensors(world.histories[1])
    out = dpa_release(world.model, torch.zeros(D), vectors.expand(m, -1, -1),
                      mask.expand(m, -1),
                      ServingConfig(kind="privaterec", epsilon=eps, delta=delta, padding_p=p,
                                    mechanism="gaussian"),
                      noise=SimulationNoise(torch.Generator().manual_seed(2)))
    sigma = out.event.noise_scale
    eps_base, delta_base = amplified_budget(epsilon=eps, delta=delta, padding_p=p)
    # dp_accounting's exact ε of a Gaussian with multiplier σ/Δ₂ at δ′ is the base ε′.
    assert get_epsilon_gaussian(sigma / math.sqrt(2), delta_base) == pytest.approx(eps_base,
                                                                                   rel=1e-3)
    noise = out.noise.flatten().double().numpy()
    assert stats.kstest(noise, "norm", args=(0, sigma)).pvalue > 1e-3
    assert stats.kstest(noise, "norm", args=(0, sigma / math.sqrt(2))).pvalue < 1e-9


# ------------------------------------------------------------------ the device release
def test_device_release_is_the_offline_privaterec_encoder(world, server):
    history = world.histories[2]
    d = device(server, epsilon=2.0, padding_p=0.5, insecure_simulation_noise=simulated(7))
    alpha, cached = d.release(history)
    assert not cached and len(alpha) == TINY.basis_size
    vectors, mask = world.history_tensors(history)
    config = ServingConfig(kind="privaterec", epsilon=2.0, padding_p=0.5)
    offline = private_user_encoder(world.model, world.features, config,
                                   noise=SimulationNoise(torch.Generator().manual_seed(7)))
    with torch.no_grad():
        expected = offline(vectors, mask)[0]
        clean = world.model.encode_user(vectors, mask)[0]
        torch.testing.assert_close(world.model.basis.reconstruct(torch.tensor(alpha)), expected)
    assert not torch.allclose(expected, clean, atol=1e-3)  # the release is noisy
    assert math.fsum(alpha) == pytest.approx(1.0, abs=1e-6)


def test_device_sends_only_alpha_and_k_never_the_history(world, server):
    d = device(server)
    results = [d.recommend(h, k=4) for h in world.histories[:3]]
    posts = [(url, body) for method, url, body in server.requests if method == "POST"]
    assert len(posts) == 3 and all(url == "/v1/recommend/privaterec" for url, _ in posts)
    for (_, body), items, sent in zip(posts, results, server.posts()):
        assert set(sent) == {"alpha", "k"} and len(sent["alpha"]) == TINY.basis_size
        assert sent["k"] == 4
        # The server ranked exactly this α̃ (no other channel carried information).
        scores = np.asarray(sent["alpha"], np.float32) @ world.score_matrix
        assert [i["news_id"] for i in items] == [i["news_id"] for i in world.items(scores, 4)]
    assert d.bytes_sent == len(posts[-1][1])
    sent_text = b" ".join(body or b"" for _, _, body in server.requests).decode()
    urls = " ".join(url for _, url, _ in server.requests)
    for history in world.histories[:3]:
        for news in history:
            assert news.news_id not in sent_text and news.news_id not in urls
            assert news.title not in sent_text
    gets = [url for method, url, _ in server.requests if method == "GET"]
    assert gets == ["/v1/model", "/v1/model/parameters"]  # downloaded once


def test_budget_refuses_before_anything_is_sent(world, server):
    d = device(server, epsilon=1.0, budget=2.5)
    d.recommend(world.histories[0])
    d.recommend(world.histories[1])
    posts_before = server.count("/v1/recommend/privaterec")
    with pytest.raises(PrivacyBudgetExceeded, match="budget=2.5"):
        d.recommend(world.histories[2])
    assert server.count("/v1/recommend/privaterec") == posts_before == 2
    assert d.spent() == pytest.approx(2.0)
    assert sum(c for _, c in d.budget.events()) == 2
    d.recommend(world.histories[0])  # a cached release is still free
    assert server.count("/v1/recommend/privaterec") == 3 and d.spent() == pytest.approx(2.0)


def test_cached_release_for_unchanged_history_costs_nothing(world, server):
    d = device(server, epsilon=0.5)
    history = world.histories[3]
    d.recommend(history, k=3)
    d.recommend(list(history), k=7)  # same history (new list), other k
    first, second = server.posts()
    assert first["alpha"] == second["alpha"] and (first["k"], second["k"]) == (3, 7)
    [(event, count)] = d.budget.events()
    assert count == 1 and event.epsilon == 0.5 and event.phase == "serve"
    assert d.last_query["cached"] is True
    # Clicks older than the last H = 5 do not enter the release: still the same release.
    d.recommend([world.pool[100], *history[-5:]])
    assert server.posts()[-1]["alpha"] == first["alpha"]
    d.recommend([*history, world.pool[100]])  # a new click: a new release, a new event
    assert server.posts()[-1]["alpha"] != first["alpha"]
    assert sum(c for _, c in d.budget.events()) == 2 and d.spent() == pytest.approx(1.0)


def test_parameters_ledger_and_cache_survive_a_restart(world, server, tmp_path):
    first = device(server, budget=1.5, cache_dir=tmp_path)
    first.recommend(world.histories[0])
    again = device(server, budget=1.5, cache_dir=tmp_path)
    assert server.count("/v1/model/parameters") == 1  # the second device read its cache
    assert again.spent() == pytest.approx(1.0)
    again.recommend(world.histories[0])  # cached across the restart: free, same α̃
    assert server.posts()[0] == server.posts()[1]
    with pytest.raises(PrivacyBudgetExceeded):
        again.recommend(world.histories[1])
    assert server.count("/v1/recommend/privaterec") == 2


def test_model_swap_on_the_server_is_reported(world, server):
    d = device(server)
    server.served_version = "v2"
    with pytest.raises(ModelChangedError, match="refresh"):
        d.recommend(world.histories[0])


def test_device_parameter_and_server_checks(world, server):
    with pytest.raises(TypeError):
        PrivateRecDevice(None, 1.0, transport=server)  # noqa
    with pytest.raises(ConfigError, match="epsilon"):
        device(server, epsilon=0.0)
    with pytest.raises(ConfigError, match="budget_delta"):
        device(server, mechanism="gaussian", delta=1e-5, budget=3.0, budget_delta=0.0)
    # Without budget_delta a Gaussian device composes at the stated default δ = 1e-6.
    assert device(server, mechanism="gaussian", delta=1e-5, budget=3.0).budget.delta == 1e-6
    with pytest.raises(ConfigError, match="basic vectors"):
        device(FakeServer(world, basis_size=0))
    d = device(server)
    with pytest.raises(ConfigError, match="'k'"):
        d.recommend(world.histories[0], k=0)
    with pytest.raises(ConfigError, match="NewsRecord"):
        d.recommend(["N1", "N2"])
    assert server.count("/v1/recommend/privaterec") == 0


def test_vdp_device_sends_a_d_dim_embedding(world, server):
    d = VDPDevice(epsilon=1.0, clip=0.5, transport=server)
    d.recommend(world.histories[0], k=2)
    [sent] = server.posts()
    assert set(sent) == {"embedding", "k"} and len(sent["embedding"]) == D
    assert d.bytes_sent == len(json_body(sent))
    assert d.spent() == pytest.approx(1.0)


# --------------------------------------------------------------------------- Uni-FedRec
def test_unifedrec_device_sends_channels_and_ranks_candidates_locally(world, server):
    d = UniFedRecDevice(transport=server, total=20, budget=math.inf)  # quotas in the clear
    history = world.histories[4]
    top = d.recommend(history, k=6)
    [sent] = server.posts()
    assert set(sent) == {"channels", "total", "include_vectors"} and sent["total"] == 20
    vectors, mask = world.history_tensors(history)
    channels = world.recall_model.channels(vectors, mask)
    num_channels = int(channels.valid.sum())
    assert num_channels == 3
    assert len(sent["channels"]) == num_channels
    for channel in sent["channels"]:
        assert set(channel) == {"weights", "quota"}
        assert len(channel["weights"]) == RECALL.num_basis
    quotas = sorted(c["quota"] for c in sent["channels"])
    assert quotas == pytest.approx(sorted(channels.quotas[0][channels.valid[0]].tolist()))
    text = json.dumps(sent)
    assert all(n.news_id not in text for n in history)
    # The device's ranking is the ranker's score uᵀr of the recalled candidates.
    with torch.no_grad():
        user = world.model.encode_user(vectors, mask)[0].numpy()
    scores = {n.news_id: float(world.news_vectors[i] @ user) for i, n in enumerate(world.pool)}
    assert [t["score"] for t in top] == pytest.approx([scores[t["news_id"]] for t in top],
                                                      rel=1e-5, abs=1e-6)
    assert [t["score"] for t in top] == sorted((t["score"] for t in top), reverse=True)
    # Privacy account: C channel releases of ε = 2δB/λ_I plus quotas in the clear (ε = ∞).
    events = dict((e.mechanism, (e, c)) for e, c in d.budget.events())
    event, count = events["laplace"]
    assert count == num_channels
    assert event.epsilon == pytest.approx(2 * 0.2 * RECALL.num_basis / 1.2)
    assert "clear_quotas" in events and d.spent() == math.inf
    # Same query ranked with locally encoded candidate text gives the same order (the
    # second device of this user re-sends the cached channels: same candidates).
    local = UniFedRecDevice(transport=server, total=20, candidate_vectors="local",
                            budget=math.inf)
    assert [t["news_id"] for t in local.recommend(history, k=6)] == [t["news_id"] for t in top]
    assert server.posts()[-1]["include_vectors"] is False


def test_unifedrec_budget_needs_quota_noise_and_refuses_before_sending(world, server):
    with pytest.raises(ConfigError, match="quota_noise_scale"):
        UniFedRecDevice(transport=server)  # the default budget is finite
    with pytest.raises(ConfigError, match="quota_noise_scale"):
        UniFedRecDevice(transport=server, budget=50.0)
    # Noised quotas: all M = 3 slots are released whatever C (here 2 clicks, C <= 2), each
    # channel ε = 2δB/λ_I = 2, the quotas ε = 2/λ_q = 2: 8 per query.
    d = UniFedRecDevice(transport=server, quota_noise_scale=1.0, budget=12.0,
                        composition="basic", total=10)
    history = world.histories[5][:2]
    d.recommend(history, k=3)
    [sent] = server.posts()
    assert len(sent["channels"]) == 3
    assert d.spent() == pytest.approx(8.0)
    with pytest.raises(PrivacyBudgetExceeded):
        d.recommend(world.histories[6], k=3)
    assert server.count("/v1/recall/unifedrec") == 1
    d.recommend(history, k=5)  # cached channels: free
    assert server.count("/v1/recall/unifedrec") == 2 and d.spent() == pytest.approx(8.0)
    assert server.posts()[0]["channels"] == server.posts()[1]["channels"]


def test_device_over_the_real_app_as_transport(served_app, serving_news):
    # The SDK accepts any httpx-compatible transport, e.g. S1's app through a TestClient.
    d = PrivateRecDevice(epsilon=1.0, transport=served_app)
    items = d.recommend(serving_news[:5], k=4)
    assert len(items) == 4 and d.basis_size == 5
    assert d.model_version == served_app.get("/v1/health").json()["model_version"]
    assert d.bytes_sent == len(json_body(d.last_query["sent"]))


# ------------------------------------------------------------- randomness on devices
def test_two_devices_set_up_as_documented_draw_different_noise(world, server, tmp_path):
    # Regression: the docs built every device with torch.Generator().manual_seed(0), so two
    # devices drew identical padding and noise, replayable by the server.
    history = world.histories[0]
    sent = []
    for user in ("alice", "bob"):
        d = PrivateRecDevice(epsilon=1.0, padding_p=0.0, cache_dir=tmp_path / user,
                             transport=server)
        assert isinstance(d.noise, SecureNoise) and not d.simulated
        alpha, cached = d.release(history)
        assert not cached
        sent.append(alpha)
    assert sent[0] != sent[1]  # same history, no padding: only the noise differs


def vdp_noise(world, d, history) -> torch.Tensor:
    """What the server can compute if it knows the history: released − clipped user vector."""
    released, _ = d.release(history)
    vectors, mask = world.history_tensors(history)
    with torch.no_grad():
        clipped = clip_l1(world.model.encode_user(vectors, mask), d.config.vdp_clip)[0]
    return torch.tensor(released) - clipped


def test_a_restart_does_not_replay_the_previous_sessions_noise(world, server, tmp_path):
    # Regression: after a restart with cache_dir, a seeded device started its stream over and
    # a new history got the noise of the previous session (here seen through VDP, whose
    # release is the clipped user vector + noise, so the noise is the difference).
    first = VDPDevice(epsilon=1.0, clip=0.5, transport=server, cache_dir=tmp_path)
    noise1 = vdp_noise(world, first, world.histories[0])
    again = VDPDevice(epsilon=1.0, clip=0.5, transport=server, cache_dir=tmp_path)
    assert again.spent() == pytest.approx(1.0)  # the same device, restarted
    noise2 = vdp_noise(world, again, world.histories[1])  # a new history
    assert noise1.abs().mean() > 0.1 and noise2.abs().mean() > 0.1  # noise scale 2θ/ε = 1
    assert not torch.allclose(noise1, noise2, atol=1e-3)
    # Two devices of two users (as the docs build them) do not share noise either.
    other = VDPDevice(epsilon=1.0, clip=0.5, transport=server, cache_dir=tmp_path / "other")
    assert not torch.allclose(vdp_noise(world, other, world.histories[0]), noise1, atol=1e-3)


def test_devices_take_no_generator_and_simulation_is_explicit_and_marked(world, server,
                                                                         caplog):
    with pytest.raises(TypeError, match="generator"):
        PrivateRecDevice(epsilon=1.0, transport=server,
                         generator=torch.Generator())  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="SimulationNoise"):
        device(server, insecure_simulation_noise=torch.Generator())
    with pytest.raises(ConfigError, match="SimulationNoise"):
        device(server, insecure_simulation_noise=SecureNoise())
    real = device(server, cache_dir=None)
    real.recommend(world.histories[0])
    [(event, _)] = real.budget.events()
    assert SIMULATED_NOTE not in event.note
    with caplog.at_level("WARNING", logger="privaterec.serving.device"):
        sim = VDPDevice(epsilon=1.0, clip=0.5, transport=server,
                        insecure_simulation_noise=simulated(0), cache_dir=None)
    assert sim.simulated and "seeded noise" in caplog.text
    sim.recommend(world.histories[1])
    events = [e for e, _ in sim.budget.events()]  # one ledger per user: both devices
    assert sum(SIMULATED_NOTE in e.note for e in events) == 1  # the VDP release only
    # A simulated device never re-sends a real device's cached release, nor the reverse.
    sim_pr = device(server, insecure_simulation_noise=simulated(1))
    sim_pr.recommend(world.histories[0])
    assert sim_pr.last_query["cached"] is False


def test_vdp_device_release_is_vdp_release(world, server):
    from privaterec.privacy.dpa import vdp_calibration, vdp_release

    for mechanism, delta in (("laplace", 0.0), ("gaussian", 1e-5)):
        d = VDPDevice(epsilon=1.5, delta=delta, clip=0.5, mechanism=mechanism,
                      transport=server, insecure_simulation_noise=simulated(5), budget=math.inf)
        sent, _ = d.release(world.histories[1])
        vectors, mask = world.history_tensors(world.histories[1])
        with torch.no_grad():
            user = world.model.encode_user(vectors, mask)
            calibration = vdp_calibration(clip=0.5, epsilon=1.5, delta=delta,
                                          mechanism=mechanism, dimension=user.shape[-1])
            want = vdp_release(user, calibration,
                               noise=SimulationNoise(torch.Generator().manual_seed(5)))
        assert sent == pytest.approx(want[0].tolist(), abs=1e-6)


@pytest.mark.parametrize("quota_noise", [None, 0.7])
def test_recall_release_is_the_recall_models_query(world, quota_noise):
    from privaterec.recall.query import release_query
    from privaterec.serving.device import recall_release

    vectors, mask = world.history_tensors(world.histories[4])
    alpha, quotas, released, events = recall_release(world.recall_model, vectors, mask,
                                                     simulated(8), quota_noise_scale=quota_noise)
    noise = SimulationNoise(torch.Generator().manual_seed(8))
    with torch.no_grad():
        q = release_query(world.recall_model, vectors, mask, noise=noise,
                          quota_noise_scale=quota_noise,
                          quota_noise=None if quota_noise is None else noise)
    torch.testing.assert_close(alpha, q.alpha[0])
    torch.testing.assert_close(quotas, q.quotas[0])
    assert torch.equal(released, q.released[0]) and events == q.events[0]
    # On a device the same computation runs on SecureNoise.
    alpha, _, _, _ = recall_release(world.recall_model, vectors, mask, SecureNoise(),
                                    quota_noise_scale=quota_noise)
    assert not torch.allclose(alpha, q.alpha[0])


# ------------------------------------------------------------------------ device budget
def test_default_budget_is_finite_and_persists_without_cache_dir(world, server,
                                                                 _device_state_dir):
    # Regression: the default budget was infinite and, without cache_dir, the ledger lived
    # in memory: every restart started from zero.
    d = device(server, epsilon=4.0)
    assert d.budget.cap == 10.0 and d.budget.path.parent == _device_state_dir
    d.recommend(world.histories[0])
    d.recommend(world.histories[1])
    restarted = device(server, epsilon=4.0)
    assert restarted.spent() == pytest.approx(8.0)
    with pytest.raises(PrivacyBudgetExceeded, match="budget=10"):
        restarted.recommend(world.histories[2])
    assert server.count("/v1/recommend/privaterec") == 2


def test_default_state_dir(monkeypatch, tmp_path):
    from privaterec.ondevice.budget import default_state_dir

    monkeypatch.setenv("PRIVATEREC_DEVICE_DIR", str(tmp_path / "mine"))
    assert default_state_dir() == tmp_path / "mine"
    monkeypatch.delenv("PRIVATEREC_DEVICE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_state_dir() == tmp_path / "state" / "privaterec" / "device"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_state_dir() == tmp_path / "home" / ".local" / "state" / "privaterec" / "device"


def test_two_racing_spenders_cannot_both_pass_the_cap(tmp_path, monkeypatch):
    # Regression: the state file had no lock, so two processes (here: two budgets on one file
    # in two threads, each with its own file handle as two processes have) could both read
    # the old ledger, both pass the cap and both spend.
    import threading

    from privaterec.privacy.events import PrivacyEvent
    from privaterec.ondevice import budget as budget_module

    real_compose = budget_module.compose_events

    def slow_compose(*args, **kwargs):  # widen the read-check-write window
        time.sleep(0.3)
        return real_compose(*args, **kwargs)

    monkeypatch.setattr(budget_module, "compose_events", slow_compose)
    path = tmp_path / "device_state.json"
    event = PrivacyEvent(mechanism="laplace", epsilon=1.0, noise_scale=2.0, sensitivity=2.0,
                         phase="serve")
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def spender() -> None:
        b = budget_module.DeviceBudget(cap=1.5, path=path)
        barrier.wait()
        try:
            b.spend([(event, 1)])
            outcomes.append("spent")
        except PrivacyBudgetExceeded:
            outcomes.append("refused")

    threads = [threading.Thread(target=spender) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["refused", "spent"]
    on_disk = budget_module.DeviceBudget(cap=1.5, path=path)
    assert on_disk.spent() == pytest.approx(1.0)
    assert (tmp_path / "device_state.json.lock").exists()


RACER = """
import sys, time
from pathlib import Path
from privaterec.errors import PrivacyBudgetExceeded
from privaterec.privacy.events import PrivacyEvent
from privaterec.ondevice import budget as b
real = b.compose_events
def slow(*args, **kwargs):  # widen the read-check-write window
    time.sleep(0.5)
    return real(*args, **kwargs)
b.compose_events = slow
state, go, ready = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
budget = b.DeviceBudget(cap=1.5, path=state)
ready.touch()
while not go.exists():
    time.sleep(0.01)
try:
    budget.spend([(PrivacyEvent(mechanism="laplace", epsilon=1.0, noise_scale=2.0,
                                sensitivity=2.0, phase="serve"), 1)])
    print("spent")
except PrivacyBudgetExceeded:
    print("refused")
"""


def test_two_processes_racing_cannot_both_pass_the_cap(tmp_path):
    import subprocess
    import sys

    from privaterec.ondevice.budget import DeviceBudget

    # Regression (two real processes): both load the empty ledger before either spends.
    state, go = tmp_path / "device_state.json", tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(state), str(go), str(r)],
                               stdout=subprocess.PIPE, text=True) for r in ready]
    deadline = time.monotonic() + 120
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        time.sleep(0.02)
    go.touch()  # both spend now; each spend's check takes 0.5 s
    outcomes = sorted(p.communicate(timeout=120)[0].strip() for p in racers)
    assert outcomes == ["refused", "spent"]
    assert DeviceBudget(cap=1.5, path=state).spent() == pytest.approx(1.0)


def test_model_changes_cannot_force_unbounded_fresh_releases(world, server):
    # Regression: the server controls model_version; each new version forced a fresh,
    # charged release of an unchanged history, without limit.
    from privaterec.ondevice.budget import ReleaseLimitExceeded

    now = [1_000_000.0]
    d = device(server, epsilon=0.5)
    d.budget.clock = lambda: now[0]
    history = world.histories[0]
    d.recommend(history)
    d.recommend(history)  # unchanged: the cached release, not a fresh one
    for version in ("v2", "v3"):
        server.version = version
        server.bundles[version] = world.parameters_of(version)
        d.refresh()
        if version == "v2":
            d.recommend(history)  # second fresh release of this history today: allowed
    assert server.count("/v1/recommend/privaterec") == 3
    with pytest.raises(ReleaseLimitExceeded, match="max_fresh_releases=2"):
        d.recommend(history)
    assert server.count("/v1/recommend/privaterec") == 3  # nothing sent
    assert d.spent() == pytest.approx(1.0)  # two charged releases
    d.recommend(world.histories[1])  # another history is not limited
    now[0] += 86_400.0  # a day later the window has passed
    d.recommend(history)
    assert server.count("/v1/recommend/privaterec") == 5 and d.spent() == pytest.approx(2.0)
    with pytest.raises(ConfigError, match="max_fresh_releases"):
        device(server, max_fresh_releases=0)


def test_unwritable_state_dir_is_a_clear_error(world, server, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("PRIVATEREC_DEVICE_DIR", str(blocker / "device"))
    with pytest.raises(ConfigError, match="cache_dir=.*PRIVATEREC_DEVICE_DIR"):
        device(server)


def test_changing_the_history_length_cannot_force_fresh_releases(world, server):
    # Regression: the re-release limit was keyed on the history truncated to the model's
    # history_len, which the server sets: a new H per model version gave a new key and a
    # fresh, charged release of the same history each time.
    import dataclasses

    from privaterec.config import replace
    from privaterec.ondevice.budget import ReleaseLimitExceeded

    d = device(server, epsilon=0.5)
    history = world.histories[0]
    model = d._model
    lengths = (5, 4, 3)
    assert len(history) > max(lengths)
    for n, length in enumerate(lengths):
        d._model = dataclasses.replace(  # a new model version with another H each time
            model, model_version=f"{model.model_version}-h{length}", config=replace(
                model.config, model=replace(model.config.model, history_len=length)))
        if n < 2:
            d.release(history)  # two fresh releases of this history today: allowed
        else:
            with pytest.raises(ReleaseLimitExceeded, match="max_fresh_releases=2"):
                d.release(history)
    assert d.spent() == pytest.approx(1.0)  # the two charged releases only
