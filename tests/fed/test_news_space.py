"""Clipping in news-vector space (``--clip-space news_vectors``): exact per-client vectors,
their clipping, the noise of the release and the configuration rules."""

from __future__ import annotations

import math

import pytest
import torch

from privaterec.privacy.samplers import SimulationNoise
from privaterec.config import replace
from privaterec.errors import ConfigError
from privaterec.fed.engine import train_federated_run
from privaterec.fed.methods import method_from_config, resolve_run_config
from privaterec.fed.methods.dp_fedavg import CentralDP
from privaterec.fed.news_space import NewsSpaceClipping
from privaterec.fed.objective import ClientBatch, LocalObjective
from privaterec.fed.rng import aggregator_noise, client_noise
from privaterec.fed.simulator import eligible_clients, simulate_round
from privaterec.runs.report import central_dp_release

# Users with 9, 2, 8, 4 and 2 samples and histories of 3, 0 (empty), 2, 3 and 1 clicks.
USERS = [0, 6, 12, 3, 13]
MODELS = [("nrms", None, {}), ("naml", "lstur", {}),
          ("nrms", None, {"basis_size": 3})]  # PrivateRec's basis, centered attention


def _reference_vector(space: NewsSpaceClipping, theta, history, mask, candidates):
    """One client's w = [g_U ; v_n per table row] by plain autograd, independently of the
    vmapped path: the whole table's vectors are one leaf, so the gradient sums a news's
    cotangents over all its positions."""
    objective = space.objective
    model = objective.model
    objective.load(theta)
    with torch.no_grad():
        table = model.encode_rows(torch.arange(space.pool_size), deduplicate=False)
    table.requires_grad_(True)
    params = dict(model.named_parameters())
    user_names = [n for n in objective.parameter_names() if not n.startswith("news_encoder.")]
    user = model.encode_user(table[history][None], mask[None])[0]
    logits = torch.einsum("d,scd->sc", user, table[candidates])
    loss = -torch.log_softmax(logits, dim=1)[:, 0].mean()
    grads = torch.autograd.grad(loss, [params[n] for n in user_names] + [table],
                                allow_unused=True)
    g_user = torch.cat([torch.zeros_like(params[n]).reshape(-1) if g is None else g.reshape(-1)
                        for n, g in zip(user_names, grads[:-1])])
    return g_user, grads[-1]


@pytest.fixture
def float64():
    """Double precision for an exact comparison: PrivateRec's centered attention takes the
    cosine of u − c with u ≈ c at θ₀, which turns float32 rounding into differences of
    0.2% between two exact ways of summing the same gradient (1.8e-15 in float64)."""
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("news_encoder,user_encoder,changes", MODELS)
def test_unclipped_sum_gives_the_sum_of_the_client_gradients(make_model, perturb, float64,
                                                             client_batch, news_encoder,
                                                             user_encoder, changes):
    """With a clip no client reaches, the server's backward pass of the summed cotangents
    plus the summed user-side gradients is exactly Σ_u ∇θ L_u (the parameter-space sum)."""
    objective = LocalObjective(make_model(news_encoder, user_encoder, **changes).double())
    theta = perturb(objective)
    batch, _ = client_batch(USERS)
    space = NewsSpaceClipping(objective)
    grads, losses = objective.client_gradients(theta, batch)
    for chunk in (1, 2, 32):
        sums = space.clipped_sum(theta, batch, clip=1e9, chunk_clients=chunk)
        direction = space.direction(theta, sums.user, sums.news)
        assert direction.dtype == torch.float64
        torch.testing.assert_close(direction, grads.sum(0), rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(sums.losses, losses, rtol=1e-9, atol=1e-12)
    assert grads.sum(0)[space.news_mask].abs().max() > 1e-3  # the news encoder learns
    assert grads.sum(0)[~space.news_mask].abs().max() > 1e-3


def test_each_client_vector_and_its_norm_match_plain_autograd(make_objective, perturb,
                                                              clients, client_batch):
    objective = make_objective("nrms")
    theta = perturb(objective)
    space = NewsSpaceClipping(objective)
    batch, candidates = client_batch(USERS)
    norms = space.clipped_sum(theta, batch, clip=1e9).norms
    for i, (u, cands) in enumerate(zip(USERS, candidates)):
        keep = int(clients.history_mask[u].sum()) or clients.history.shape[1]
        history, mask = clients.history[u, -keep:], clients.history_mask[u, -keep:]
        g_user, v = _reference_vector(space, theta, history, mask, cands)
        reference_norm = math.sqrt(float((g_user ** 2).sum() + (v ** 2).sum()))
        assert float(norms[i]) == pytest.approx(reference_norm, rel=1e-4)
        one, (own,) = client_batch([u])  # the client alone (its own candidate draw)
        sums = space.clipped_sum(theta, one, clip=1e9)
        g_user, v = _reference_vector(space, theta, history, mask, own)
        torch.testing.assert_close(sums.user[~space.news_mask], g_user, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(sums.news, v, rtol=1e-4, atol=1e-6)
        assert int((v.abs().sum(1) > 0).sum()) >= 3  # several news carry a cotangent


def test_a_clients_clipped_vector_has_norm_at_most_c(make_objective, perturb, client_batch):
    objective = make_objective("nrms")
    theta = perturb(objective)
    space = NewsSpaceClipping(objective)
    clip = 0.01
    for u in USERS:
        one, _ = client_batch([u])
        sums = space.clipped_sum(theta, one, clip=clip)
        norm = float(torch.cat([sums.user[~space.news_mask], sums.news.reshape(-1)]).norm())
        assert float(sums.norms[0]) > clip  # clipped: the vector is scaled onto the sphere
        assert norm == pytest.approx(clip, rel=1e-4)


def test_a_clients_vector_does_not_depend_on_the_other_clients(make_objective, perturb,
                                                               clients, client_batch):
    """Batch independence: the same candidates, batched (chunks of 2) or alone."""
    objective = make_objective("nrms")
    theta = perturb(objective)
    space = NewsSpaceClipping(objective)
    batch, candidates = client_batch(USERS)
    together = space.clipped_sum(theta, batch, clip=0.01, chunk_clients=2)
    alone = [space.clipped_sum(theta, ClientBatch.stack([clients.history[u]],
                                                        [clients.history_mask[u]], [c]),
                               clip=0.01)
             for u, c in zip(USERS, candidates)]
    torch.testing.assert_close(together.norms, torch.cat([a.norms for a in alone]),
                               rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(together.news, sum(a.news for a in alone), rtol=1e-4,
                               atol=1e-7)


def test_device_releases_sum_to_the_rounds_clipped_sum(make_objective, perturb, clients,
                                                       run_config):
    """A device's upload (``release``: clip(w_u, C) in ``pack``'s layout, what it hands to
    SecAgg+) has D_U + P·d coordinates and norm ≤ C, and the uploads of a round's clients
    sum to the simulator's clipped sum; the server's ``direction_from_release`` of that sum
    is the simulator's direction."""
    from privaterec.fed.rng import client_noise
    objective = make_objective("nrms")
    theta = perturb(objective)
    method = _news_method(run_config)
    space = NewsSpaceClipping(objective)
    inputs = [method.inputs(objective, clients.client(u), noise=client_noise(1, 0, u))
              for u in USERS]
    uploads = []
    for one in inputs:
        payload, loss, reports = method.release(objective, theta, one,
                                                noise=SimulationNoise(torch.Generator()))
        assert payload.shape == (method.release_dimension(objective),)
        assert method.release_dimension(objective) == space.release_dimension
        assert float(payload.double().norm()) <= 0.05 and reports == {}
        uploads.append(payload)
    sums = space.clipped_sum(theta, objective.batch(inputs), clip=0.05, chunk_clients=2)
    total = torch.stack(uploads).sum(0)
    torch.testing.assert_close(total, space.pack(sums.user, sums.news), rtol=1e-4, atol=1e-7)
    user, news = space.unpack(total)
    torch.testing.assert_close(method.direction_from_release(objective, theta, total),
                               space.direction(theta, user, news))
    assert bool((user[space.news_mask] == 0).all())
    with pytest.raises(ValueError, match="coordinates"):
        space.unpack(total[:-1])


def _news_method(run_config, **changes) -> CentralDP:
    method = method_from_config(run_config(
        "dp-fedavg", **{"noise_multiplier": 1.0, "client_fraction": 0.25, "clip": 0.05,
                        "clip_space": "news_vectors", **changes}))
    assert isinstance(method, CentralDP) and method.clip_space == "news_vectors"
    return method


def test_round_is_the_backward_pass_of_the_noised_clipped_sums_over_qn(make_objective, clients,
                                                                       client_batch,
                                                                       run_config):
    objective = make_objective("nrms", seed=0)
    theta = objective.parameters()
    method = _news_method(run_config)
    population = len(eligible_clients(clients))
    selected = [1, 4, 7]
    result = simulate_round(objective, theta, clients, selected, method, seed=3,
                            round_index=2)
    space = NewsSpaceClipping(objective)
    from privaterec.fed.rng import client_noise
    inputs = [method.inputs(objective, clients.client(u), noise=client_noise(3, 2, u))
              for u in selected]
    sums = space.clipped_sum(theta, objective.batch(inputs), clip=0.05)
    noise = aggregator_noise(3, 2).draw((space.release_dimension,), mechanism="gaussian",
                                        scale=1.0 * 0.05)
    d_user = int((~space.news_mask).sum())
    user = sums.user.clone()
    user[~space.news_mask] += noise[:d_user]
    news = sums.news + noise[d_user:].reshape(space.pool_size, space.dim)
    expected = space.direction(theta, user, news) / (0.25 * population)
    torch.testing.assert_close(result.direction, expected, rtol=1e-4, atol=1e-7)
    assert result.population_events == (method.central_event(),)


def test_empty_round_releases_noise_of_the_calibrated_scale_on_every_coordinate(
        make_objective, run_config):
    """Statistical test of the noise scale: with no client, the release is N(0, (zC)²) on
    each of the D_U + P·d coordinates (the news rows of the table included)."""
    objective = make_objective("nrms", seed=0)
    method = _news_method(run_config)
    space = NewsSpaceClipping(objective)
    user, news, losses = method.news_space_release(
        objective, objective.parameters(), [],
        noise=SimulationNoise(torch.Generator().manual_seed(5)))
    assert losses == []
    released = torch.cat([user[~space.news_mask], news.reshape(-1)]).double()
    n = released.numel()
    assert n == space.release_dimension == int((~space.news_mask).sum()) + len(
        objective.model.features) * objective.model.dim
    assert float(released.std()) == pytest.approx(0.05, rel=5 / math.sqrt(n))
    assert float(released.mean()) == pytest.approx(0.0, abs=5 * 0.05 / math.sqrt(n))
    assert bool((news.abs().sum(1) > 0).all())  # every row of the table is noised
    assert bool((user[space.news_mask] == 0).all())


def test_configuration_rules(run_config, tiny_model_config):
    with pytest.raises(ConfigError, match="clip_space"):
        run_config("dp-fedavg", noise_multiplier=1.0, clip_space="gradients")
    with pytest.raises(ConfigError, match="fixed --clip"):
        run_config("dp-fedavg", noise_multiplier=1.0, clip_space="news_vectors",
                   adaptive_clip_quantile=0.5)
    with pytest.raises(ConfigError, match="--local-steps 1"):
        _news_method(run_config, local_steps=2)
    with pytest.raises(ConfigError, match="plm"):
        resolve_run_config(replace(run_config("dp-fedavg", noise_multiplier=1.0,
                                              clip_space="news_vectors"),
                                   model=replace(tiny_model_config, news_encoder="plm")))
    method = _news_method(run_config)
    with pytest.raises(ConfigError, match="secure aggregation only"):
        method.check_engine("flower")  # on Flower, through SecAgg+ (as parameter space)
    secure = _news_method(run_config, engine="flower", secure_aggregation="secaggplus")
    secure.check_engine("flower")
    assert "news-vector space" in secure.event_note() and "SecAgg+" in secure.event_note()
    with pytest.raises(ConfigError, match="ranking task"):
        method.release_dimension(object())  # type: ignore[arg-type]
    described = central_dp_release(method, dimension=10,
                                   parameters=["user_encoder.w", "news_encoder.v"],
                                   clients_per_round=4, client_fraction=0.25)
    assert described["clip_space"] == "news_vectors" and "cotangents" in described["clipping"]
    assert described["dimension"] is None  # not D: the user side plus d per news
    assert described["noised_parameters"][0] == "user_encoder.w"
    assert "news_encoder.v" not in described["noised_parameters"]
    assert "news-vector space" in method.central_event().note


def test_training_runs_and_accounts_like_dp_fedavg(run_config, make_model, clients):
    config = run_config("dp-fedavg", noise_multiplier=2.0, client_fraction=0.2, clip=0.05,
                        rounds=3, target_delta=1e-3, clip_space="news_vectors")
    state = train_federated_run(config, make_model("nrms", seed=0), clients, progress=False)
    parameter_space = train_federated_run(
        replace(config, fed=replace(config.fed, settings=replace(config.fed.settings,
                                                                 clip_space="parameters"))),
        make_model("nrms", seed=0), clients, progress=False)
    user = next(iter(state.ledger.users))
    assert state.ledger.user_epsilon(user, delta=1e-3, adjacency="user") == pytest.approx(
        parameter_space.ledger.user_epsilon(user, delta=1e-3, adjacency="user"))
    assert sorted(state.ledger.users) == sorted(parameter_space.ledger.users)
