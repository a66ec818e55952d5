"""Federated LDP training of the Uni-FedRec recall model: client update, rounds, resumption."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from privaterec.config import FedConfig
from privaterec.data.clients import ClientDataset
from privaterec.data.features import NewsFeatures
from privaterec.errors import CheckpointError, ConfigError
from privaterec.method_settings import UniFedRecSettings
from privaterec.fed.client import client_update
from privaterec.fed.rng import client_noise
from privaterec.fed.sampling import clients_per_round
from privaterec.privacy.samplers import SimulationNoise
from privaterec.fed.simulator import sequential_round, simulate_round
from privaterec.fed.strategies import aggregate
from privaterec.recall.model import UniFedRecRecall, info_nce
from privaterec.recall.news import encode_news_table
from privaterec.recall.task import (RecallTask, RecallTrainConfig, UniFedRecLDP,
                                    recall_fed_config, resolve_recall_fed, train_recall)

D, M, B, H = 8, 3, 6, 5


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

_FED_KEYS = {"rounds": "rounds", "clients_per_round": "clients_per_round", "lr": "server_lr",
             "strategy": "strategy", "clip": "clip", "noise_scale": "noise_scale",
             "max_samples": "max_client_samples", "chunk_clients": "chunk_clients",
             "checkpoint_every": "checkpoint_every", "client_fraction": "client_fraction",
             "clipping": "clipping"}


def settings(**kwargs) -> tuple[FedConfig, RecallTrainConfig, UniFedRecLDP]:
    """Recall training settings → (the engine's FedConfig resolved, recall's own, the method)."""
    fed = recall_fed_config(**{_FED_KEYS[k]: v for k, v in kwargs.items() if k in _FED_KEYS})
    train = RecallTrainConfig(**{k: v for k, v in kwargs.items() if k not in _FED_KEYS})
    fed = resolve_recall_fed(fed)
    return fed, train, UniFedRecLDP.of(fed, train)


def ldp(**kwargs) -> UniFedRecLDP:
    return settings(**kwargs)[2]


def task_of(model: UniFedRecRecall, vectors: torch.Tensor, pool_rows=None,
            **kwargs) -> RecallTask:
    return RecallTask(model, vectors, pool_rows=pool_rows, options=settings(**kwargs)[1])


def inputs_of(task: RecallTask, data, method: UniFedRecLDP, generator):
    return method.inputs(task, data, noise=SimulationNoise(generator))


def make_model(**kwargs) -> UniFedRecRecall:
    torch.manual_seed(0)
    options = dict(num_heads=2, head_dim=4, attention_dim=5, num_basis=B, max_channels=M,
                   distance_threshold=0.5)
    options.update(kwargs)
    return UniFedRecRecall(D, **options)


def planted(num_users: int = 24, topics: int = 3, per_topic: int = 10,
            seed: int = 0) -> tuple[torch.Tensor, ClientDataset]:
    """News in ``topics`` clusters; user u likes topic u % topics: its history and its
    1 + u % 4 clicks come from that topic, the non-clicked news of its impressions from the
    others. User 1 has an empty history (as in MIND), user 2 a single click."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.nn.functional.normalize(torch.randn(topics, D, generator=g), dim=1)
    n = 1 + topics * per_topic
    topic = torch.arange(n - 1) // per_topic
    vectors = torch.zeros(n, D)
    vectors[1:] = centers[topic] + 0.3 * torch.randn(n - 1, D, generator=g)
    rows = [torch.arange(1, n)[topic == t] for t in range(topics)]
    others = [torch.arange(1, n)[topic != t] for t in range(topics)]
    history = torch.zeros(num_users, H, dtype=torch.long)
    mask = torch.zeros(num_users, H, dtype=torch.bool)
    positives, negatives = [], []
    for u in range(num_users):
        t = u % topics
        length = 0 if u == 1 else 1 if u == 2 else H
        if length:
            history[u, H - length:] = rows[t][torch.randint(0, per_topic, (length,),
                                                            generator=g)]
            mask[u, H - length:] = True
        samples = 1 + u % 4
        positives.append(rows[t][torch.randint(0, per_topic, (samples,), generator=g)])
        negatives.append(others[t][torch.randint(0, len(others[t]), (samples, 6),
                                                 generator=g)])
    counts = torch.tensor([1 + u % 4 for u in range(num_users)])
    s = int(counts.sum())
    clients = ClientDataset(
        user_ids=[f"U{u}" for u in range(num_users)], history=history, history_mask=mask,
        sample_user=torch.arange(num_users).repeat_interleave(counts),
        positives=torch.cat(positives), negatives=torch.cat(negatives),
        negative_counts=torch.full((s,), 6), impression_size=torch.full((s,), 7),
        offsets=torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]), skipped={})
    return vectors, clients


# ------------------------------------------------------------------------------ config
def test_config_defaults_and_validation():
    fed, train, method = settings()
    assert (fed.settings.clip, fed.settings.noise_scale, fed.server_lr, fed.client_fraction,
            fed.rounds, train.negatives, fed.settings.clipping) == \
        (0.1, 0.01, 0.05, 0.02, 200, 4, "l1")
    assert (method.clip, method.noise_scale, method.max_samples) == (0.1, 0.01, 64)
    for kwargs, name in [({"clip": 0.0}, "clip"), ({"noise_scale": -1.0}, "noise_scale"),
                         ({"client_fraction": 0.0}, "client_fraction"),
                         ({"clipping": "l2"}, "clipping"), ({"negatives": 0}, "negatives"),
                         ({"strategy": "adam"}, "strategy"), ({"lr": math.inf}, "lr"),
                         ({"strategy": "fedavg"}, "strategy"),
                         ({"clipping": "none"}, "noise_scale"),
                         ({"negative_source": "all"}, "negative_source")]:
        with pytest.raises(ConfigError, match=name):
            settings(**kwargs)
    with pytest.raises(ConfigError, match="local_steps"):  # a ranking-only setting
        resolve_recall_fed(FedConfig(local_steps=2))
    with pytest.raises(TypeError):  # privacy parameters are keyword-only
        UniFedRecSettings("l1", 0.1, 0.01)
    assert clients_per_round(settings(clients_per_round=5)[0], 3) == 3
    assert clients_per_round(settings(client_fraction=0.02)[0], 24) == 1
    assert clients_per_round(settings(client_fraction=0.5)[0], 24) == 12


def test_upload_events():
    l1 = ldp(clip=0.1, noise_scale=0.01).event(1000)
    assert l1.epsilon == pytest.approx(20.0) and l1.sensitivity == pytest.approx(0.2)
    assert l1.noise_scale == 0.01 and l1.phase == "train" and "2*theta/lambda_g" in l1.note
    elem = ldp(clipping="elementwise", clip=0.1, noise_scale=0.01).event(1000)
    assert elem.epsilon == pytest.approx(20.0 * 1000)
    assert elem.coordinate_epsilon == pytest.approx(20.0)
    assert not ldp(noise_scale=0.0).event(10).is_private
    assert not ldp(clipping="none", noise_scale=0.0).event(10).is_private
    assert ldp().events(10) == (ldp().event(10),)


# --------------------------------------------------------------------- clipping and noise
def test_privatize_clips_l1_and_adds_laplace_of_scale_lambda():
    gen = torch.Generator().manual_seed(3)
    updates = torch.randn(4, 5000, generator=gen) * 0.01  # L1 norms ~ 40 >> theta
    updates[3] = updates[3] / updates[3].abs().sum() * 0.05  # already inside: unchanged
    gens = [SimulationNoise(torch.Generator().manual_seed(10 + i)) for i in range(4)]
    clean, _ = ldp(noise_scale=0.0).privatize(updates, gens)
    norms = clean.abs().sum(1)
    assert torch.allclose(norms[:3], torch.full((3,), 0.1), rtol=1e-5)
    torch.testing.assert_close(clean[3], updates[3])
    torch.testing.assert_close(clean[:3], updates[:3] * (0.1 / updates[:3].abs().sum(1,
                                                                                     True)))
    gens = [SimulationNoise(torch.Generator().manual_seed(10 + i)) for i in range(4)]
    noisy, event = ldp().privatize(updates, gens)
    assert event.epsilon == pytest.approx(20.0)
    noise = (noisy - clean).double()
    # row i's noise is drawn from generator i alone
    torch.testing.assert_close(noise[2], SimulationNoise(torch.Generator().manual_seed(12)).draw(
        (5000,), mechanism="laplace", scale=0.01,
        dtype=torch.float64), rtol=0, atol=1e-7)
    sample = noise.numpy().ravel()
    assert stats.kstest(sample, stats.laplace(scale=0.01).cdf).pvalue > 1e-3
    assert stats.kstest(sample, stats.laplace(scale=0.012).cdf).pvalue < 1e-6
    elem, _ = ldp(clipping="elementwise", noise_scale=0.0).privatize(updates * 100, gens)
    assert float(elem.abs().max()) == pytest.approx(0.1)


def test_client_update_bound_noise_and_determinism():
    vectors, clients = planted()
    objective = task_of(make_model(), vectors)
    params = objective.parameters()
    data = clients.client(3)  # 4 clicks
    raw = client_update(objective, params, data, ldp(clipping="none", noise_scale=0.0),
                        noise=client_noise(7, 3, 3))
    clean = client_update(objective, params, data, ldp(noise_scale=0.0),
                          noise=client_noise(7, 3, 3))
    assert float(raw.payload.abs().sum()) > 0.1  # the clip is active
    # clipped payload = raw gradient scaled to L1 norm θ
    torch.testing.assert_close(clean.payload, raw.payload * (0.1 / raw.payload.abs().sum()))
    noisy = client_update(objective, params, data, ldp(noise_scale=0.05),
                          noise=client_noise(7, 3, 3))
    again = client_update(objective, params, data, ldp(noise_scale=0.05),
                          noise=client_noise(7, 3, 3))
    other = client_update(objective, params, data, ldp(noise_scale=0.05),
                          noise=client_noise(7, 4, 3))
    assert torch.equal(noisy.payload, again.payload)
    assert not torch.equal(noisy.payload, other.payload)
    noise = (noisy.payload - clean.payload).double().numpy()
    assert noise.size == objective.dimension
    assert stats.kstest(noise, stats.laplace(scale=0.05).cdf).pvalue > 1e-3
    assert stats.kstest(noise, stats.laplace(scale=0.1).cdf).pvalue < 1e-6
    assert noisy.num_examples == 4 and len(noisy.privacy_events) == 1
    assert noisy.sent().keys() == {"payload"}  # a private upload's count and loss stay home
    assert raw.sent().keys() == {"payload", "num_examples", "loss"} and raw.weight == 4
    assert noisy.privacy_events[0].epsilon == pytest.approx(2 * 0.1 / 0.05)


def test_client_gradient_equals_autograd_through_the_model():
    vectors, clients = planted()
    model = make_model()
    config = dict(clipping="none", noise_scale=0.0, score_noise=True)
    objective = task_of(model, vectors, **config)
    method = ldp(**config)
    for u in (0, 1, 2):  # full history, empty history, one click
        data = clients.client(u)
        inputs = inputs_of(objective, data, method, torch.Generator().manual_seed(u))
        update = client_update(objective, objective.parameters(), data, method,
                               noise=SimulationNoise(torch.Generator().manual_seed(u)))
        # reference: the model's own forward, same draws (samples, negatives, then noise)
        gen = torch.Generator().manual_seed(u)
        ref_inputs = inputs_of(task_of(model, vectors, **{**config, "score_noise": False}),
                               data, method, gen)
        assert torch.equal(ref_inputs.candidates, inputs.candidates)
        h, m = vectors[data.history][None], data.history_mask[None]
        n, c = inputs.candidates.shape
        batch = model.channels(h, m)
        model.zero_grad()
        noise = SimulationNoise(gen).draw((1, model.max_channels, model.num_basis),
                                          mechanism="laplace", scale=model.noise_scale)
        logits = model(h, m, vectors[inputs.candidates].reshape(1, n * c, D),
                       batch.channel_ids, batch.quotas, score_noise=noise).reshape(n, c)
        info_nce(logits).backward()
        expected = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        torch.testing.assert_close(update.payload, expected, rtol=1e-5, atol=1e-7)
        assert update.metrics["loss"] == pytest.approx(float(info_nce(logits.detach())), rel=1e-6)


def test_pool_negatives_exclude_the_click():
    vectors, clients = planted()
    pool = torch.arange(1, 8)
    config = dict(negative_source="pool", negatives=6)
    objective = task_of(make_model(), vectors, pool, **config)
    for u in range(6):
        data = clients.client(u)
        cands = inputs_of(objective, data, ldp(**config),
                          torch.Generator().manual_seed(u)).candidates
        assert torch.equal(cands[:, 0], data.positives)
        assert bool(torch.isin(cands[:, 1:], pool).all())
        assert not bool((cands[:, 1:] == cands[:, :1]).any())


def test_vectorized_round_equals_sequential_client_updates():
    vectors, clients = planted()
    model = make_model()
    selected = [0, 1, 2, 5, 9, 13, 14, 19]  # 1-4 clicks, empty and one-click histories
    for config in (dict(clipping="none", noise_scale=0.0, score_noise=True, max_samples=3,
                        chunk_clients=3),
                   dict(noise_scale=0.02)):
        fed, _, method = settings(**config)
        objective = task_of(model, vectors, **config)
        params = objective.parameters()
        result = simulate_round(objective, params, clients, selected, method, seed=3,
                                round_index=2, chunk_clients=fed.chunk_clients)
        updates = [client_update(objective, params, clients.client(u), method,
                                 noise=client_noise(3, 2, u))
                   for u in selected]
        torch.testing.assert_close(result.direction, aggregate(updates), rtol=1e-5, atol=1e-7)
        reference = sequential_round(objective, params, clients, selected, method, seed=3,
                                     round_index=2)
        torch.testing.assert_close(reference.direction, aggregate(updates), rtol=0, atol=0)
        assert result.num_examples == [x.num_examples for x in updates]
        assert result.losses == pytest.approx([x.metrics["loss"] for x in updates], rel=1e-5)
        assert result.events == [x.privacy_events for x in updates]


# ----------------------------------------------------------------------------- training
def test_resume_equals_uninterrupted_run(tmp_path):
    vectors, clients = planted()
    fed, train, _ = settings(rounds=4, clients_per_round=5, noise_scale=0.02,
                             score_noise=True, checkpoint_every=1)
    full = train_recall(make_model(), vectors, clients, fed, train, seed=1, progress=False)
    path = tmp_path / "recall.pt"
    part = train_recall(make_model(), vectors, clients, fed, train, seed=1, progress=False,
                        checkpoint_path=path, stop_after_rounds=2)
    assert part.round_index == 2
    model = make_model()
    resumed = train_recall(model, vectors, clients, fed, train, seed=1, progress=False,
                           checkpoint_path=path)
    assert resumed.round_index == 4
    assert torch.equal(resumed.params, full.params)
    assert resumed.log == full.log
    assert resumed.ledger.to_dict() == full.ledger.to_dict()
    torch.testing.assert_close(RecallTask(model, vectors).parameters(), full.params,
                               rtol=0, atol=0)  # final θ loaded in the model
    # every sampled user spent ε = 2θ/λ_g per round it took part in
    for user in full.ledger.users:
        ((event, count),) = full.ledger.events(user)
        assert event.epsilon == pytest.approx(2 * 0.1 / 0.02)
        assert 1 <= count <= 4
    assert sum(c for u in full.ledger.users for _, c in full.ledger.events(u)) == 4 * 5
    with pytest.raises(CheckpointError, match="clip"):
        train_recall(make_model(), vectors, clients,
                     dataclasses.replace(
                         fed, settings=dataclasses.replace(fed.settings, clip=0.2)), train,
                     seed=1, progress=False, checkpoint_path=path)
    with pytest.raises(CheckpointError, match="seed"):
        train_recall(make_model(), vectors, clients, fed, train, seed=2, progress=False,
                     checkpoint_path=path)


def _mean_loss(objective: RecallTask, clients: ClientDataset) -> float:
    method = ldp(clipping="none", noise_scale=0.0)
    inputs = [method.inputs(objective, clients.client(u),
                            noise=SimulationNoise(torch.Generator().manual_seed(100 + u)))
              for u in range(clients.num_users)]
    _, losses = objective.gradients(objective.parameters(), inputs)
    return float(losses.mean())


@pytest.mark.parametrize("strategy, lr, rounds", [("fedadam", 0.1, 30), ("sgd", 2.0, 60)])
def test_loss_decreases_without_noise_on_a_planted_problem(strategy, lr, rounds):
    vectors, clients = planted()
    model = make_model()
    config = dict(rounds=rounds, clients_per_round=12, lr=lr, strategy=strategy,
                  clipping="none", noise_scale=0.0, score_clip=False)
    before = _mean_loss(task_of(model, vectors, score_clip=False), clients)
    fed, train, _ = settings(**config)
    state = train_recall(model, vectors, clients, fed, train, seed=0, progress=False)
    after = _mean_loss(task_of(model, vectors, score_clip=False), clients)
    assert before == pytest.approx(math.log(5), abs=0.1)  # untrained: near-uniform
    assert after < 0.5 * before, (before, after)
    first = np.mean([e["loss"] for e in state.log[:5]])
    last = np.mean([e["loss"] for e in state.log[-5:]])
    assert last < 0.5 * first


# ----------------------------------------------------------------------------- news table
class _Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 4)
        self.drop = nn.Dropout(0.5)

    def encode_features(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.drop(self.proj(features["title"].float()))


def test_encode_news_table_encodes_every_row_in_eval_mode():
    n = 7
    features = NewsFeatures(["<pad>", *[f"N{i}" for i in range(1, n)]],
                            title=torch.arange(n * 3).reshape(n, 3),
                            abstract=torch.zeros(n, 2, dtype=torch.long),
                            category=torch.zeros(n, dtype=torch.long),
                            subcategory=torch.zeros(n, dtype=torch.long),
                            news_index=torch.zeros(n, dtype=torch.long))
    torch.manual_seed(0)
    encoder = _Encoder().train()
    out = encode_news_table(encoder, features, batch_size=3)  # type: ignore[arg-type]
    assert encoder.training  # restored
    with torch.no_grad():
        expected = encoder.proj(features.title.float())  # no dropout
    torch.testing.assert_close(out, expected)
