"""Tests for the Uni-FedRec recall model: a by-hand reference, batch independence, loss, vmap."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.func import functional_call, grad, vmap

from privaterec.errors import ConfigError
from privaterec.recall.channels import cluster_history
from privaterec.privacy.samplers import SimulationNoise
from privaterec.recall.model import NUM_NEGATIVES, UniFedRecRecall, info_nce, unified_score
from privaterec.recall.query import release_query

D, H, M, B = 8, 7, 3, 6


def make_model(**kwargs) -> UniFedRecRecall:
    torch.manual_seed(0)
    options = dict(num_heads=2, head_dim=4, attention_dim=5, num_basis=B, max_channels=M,
                   distance_threshold=0.05)
    options.update(kwargs)
    model = UniFedRecRecall(D, **options)
    return model.eval()


def score_noise(model: UniFedRecRecall, b: int, generator) -> torch.Tensor:
    """Laplace(λ_I) noise ``[b, M, B]`` of the decomposition scores, as a query draws it."""
    return SimulationNoise(generator).draw((b, model.max_channels, model.num_basis),
                                           mechanism="laplace", scale=model.noise_scale)


def make_batch(b: int = 4, seed: int = 1, lengths=(7, 4, 1, 0)):
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(3, D, generator=gen) * 2
    pick = torch.randint(0, 3, (b, H), generator=gen)
    vectors = centers[pick] + 0.3 * torch.randn(b, H, D, generator=gen)
    mask = torch.stack([torch.arange(H) >= H - n for n in lengths])
    candidates = torch.randn(b, 1 + NUM_NEGATIVES, D, generator=gen)
    return vectors, mask, candidates


def reference_logits(model: UniFedRecRecall, h: torch.Tensor, m: torch.Tensor,
                     cands: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    """One user's unified scores computed by hand from the parameters (float64)."""
    p = {k: v.detach().double() for k, v in model.named_parameters()}
    x, heads, hd = h.double(), 2, 4
    keys_mask = m if bool(m.any()) else torch.ones_like(m)
    q = x @ p["self_attention.query.weight"].T + p["self_attention.query.bias"]
    k = x @ p["self_attention.key.weight"].T + p["self_attention.key.bias"]
    v = x @ p["self_attention.value.weight"].T + p["self_attention.value.bias"]
    g = torch.empty(H, D, dtype=torch.float64)
    for head in range(heads):
        sl = slice(head * hd, (head + 1) * hd)
        s = q[:, sl] @ k[:, sl].T / math.sqrt(hd)
        s = s.masked_fill(~keys_mask[None, :], -math.inf)
        g[:, sl] = torch.softmax(s, dim=-1) @ v[:, sl]
    channels = cluster_history(g.numpy(), m.numpy(), distance_threshold=0.05, max_channels=M)
    z = torch.zeros(cands.shape[0], dtype=torch.float64)
    for i in range(channels.num_channels):
        members = np.flatnonzero(channels.assignment == i)
        gi = g[members]
        att = torch.tanh(gi @ p["channel_attention.projection.weight"].T
                         + p["channel_attention.projection.bias"])
        gamma = torch.softmax((att @ p["channel_attention.query.weight"].T).squeeze(-1), dim=0)
        r = gamma @ gi
        a = (r @ p["interest.keys"].T).clamp(-0.2, 0.2)
        r_hat = torch.softmax(a, dim=0) @ p["interest.values"]
        z += channels.quotas[i] * (cands.double() @ r_hat)
    return z, channels.assignment


def test_forward_matches_hand_computation():
    model = make_model()
    vectors, mask, candidates = make_batch()
    logits = model(vectors, mask, candidates)
    assert logits.shape == (4, 1 + NUM_NEGATIVES)
    batch = model.channels(vectors, mask)
    assert int(batch.num_channels.max()) >= 2  # the example really has several channels
    for u in range(4):
        z, assignment = reference_logits(model, vectors[u], mask[u], candidates[u])
        assert batch.channel_ids[u].tolist() == assignment.tolist()
        torch.testing.assert_close(logits[u].double(), z, rtol=1e-4, atol=1e-5)


def test_given_channels_equal_computed_channels():
    model = make_model()
    vectors, mask, candidates = make_batch()
    batch = model.channels(vectors, mask)
    torch.testing.assert_close(model(vectors, mask, candidates, batch.channel_ids, batch.quotas),
                               model(vectors, mask, candidates))
    with pytest.raises(ConfigError, match="both"):
        model(vectors, mask, candidates, batch.channel_ids)


def test_unified_score_definition():
    gen = torch.Generator().manual_seed(3)
    r_hat, cands = torch.randn(2, M, D, generator=gen), torch.randn(2, 5, D, generator=gen)
    quotas = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    z = unified_score(r_hat, quotas, cands)
    expected = torch.stack([sum(quotas[u, i] * cands[u] @ r_hat[u, i] for i in range(M))
                            for u in range(2)])
    torch.testing.assert_close(z, expected)


def test_padding_content_is_ignored_and_empty_history_is_finite():
    model = make_model()
    vectors, mask, candidates = make_batch()
    changed = vectors.clone()
    changed[~mask] = 100.0 * torch.randn(int((~mask).sum()))[:, None]
    out, again = model(vectors, mask, candidates), model(changed, mask, candidates)
    torch.testing.assert_close(out[:3], again[:3])  # rows with at least one real click
    assert torch.isfinite(again).all()  # row 3 is empty: attends over its padding


def _assert_row_independent(fn, vectors, mask, keep=0, trials=3):
    base = fn(vectors, mask)
    gen = torch.Generator().manual_seed(7)
    for _ in range(trials):
        v = torch.randn(vectors.shape, generator=gen) * 3
        m = torch.rand(mask.shape, generator=gen) > 0.4
        v[keep], m[keep] = vectors[keep], mask[keep]
        out = fn(v, m)
        for a, b in zip(base if isinstance(base, tuple) else (base,),
                        out if isinstance(out, tuple) else (out,)):
            torch.testing.assert_close(a[keep], b[keep], rtol=0, atol=1e-6)


@pytest.mark.parametrize("keep", [0, 2])
def test_batch_independence_of_every_stage(keep):
    model = make_model()
    vectors, mask, candidates = make_batch()

    def context(v, m):
        return model.context(v, m)

    def channels(v, m):
        c = model.channels(v, m)
        return c.channel_ids, c.quotas, c.counts

    def interests(v, m):
        return model.interests(model.context(v, m), model.channels(v, m).channel_ids)

    def weights(v, m):
        r = interests(v, m)
        gens = [torch.Generator().manual_seed(s) for s in range(v.shape[0])]
        return model.protected_weights(r, score_noise=score_noise(model, v.shape[0], gens))

    def forward(v, m):
        return model(v, m, candidates)

    def noisy_forward(v, m):
        gens = [torch.Generator().manual_seed(10 + s) for s in range(v.shape[0])]
        return model(v, m, candidates, score_noise=score_noise(model, v.shape[0], gens))

    def query(v, m):
        gens = [torch.Generator().manual_seed(20 + s) for s in range(v.shape[0])]
        out = release_query(model, v, m, noise=SimulationNoise(gens))
        return out.alpha, out.quotas

    with torch.no_grad():
        for fn in (context, channels, interests, weights, forward, noisy_forward, query):
            _assert_row_independent(fn, vectors, mask, keep=keep)


def test_noise_only_as_an_input_and_the_model_draws_none():
    model = make_model()
    vectors, mask, candidates = make_batch()
    state = torch.get_rng_state()
    with torch.no_grad():
        clean = model(vectors, mask, candidates)
        noise = score_noise(model, 4, torch.Generator().manual_seed(1))
        noisy = model(vectors, mask, candidates, score_noise=noise)
        same = model(vectors, mask, candidates, score_noise=noise)
    assert torch.equal(torch.get_rng_state(), state)  # no draw from the global RNG either
    torch.testing.assert_close(clean, model(vectors, mask, candidates))
    assert not torch.allclose(clean, noisy)
    torch.testing.assert_close(noisy, same)
    # the noise enters after the clip, before the aggregator (Eq. 2-3)
    with torch.no_grad():
        r = model.interests(model.context(vectors, mask), model.channels(vectors, mask).channel_ids)
        scores = model.interest.decompose(r).clamp(-0.2, 0.2)
        torch.testing.assert_close(model.protected_weights(r, score_noise=noise),
                                   torch.softmax(scores + noise, dim=-1))


def test_info_nce_is_minus_log_softmax_of_positive():
    logits = torch.tensor([[2.0, 0.0, 1.0, -1.0, 0.5], [0.0, 0.0, 0.0, 0.0, 0.0]])
    expected = [-(2.0 - math.log(math.exp(2) + 1 + math.e + math.exp(-1) + math.exp(0.5))),
                math.log(5.0)]
    torch.testing.assert_close(info_nce(logits, reduction="none"),
                               torch.tensor(expected))
    assert float(info_nce(logits)) == pytest.approx(sum(expected) / 2)
    assert float(info_nce(logits, reduction="sum")) == pytest.approx(sum(expected))
    assert float(info_nce(logits, torch.tensor([2, 0]), reduction="sum")) == pytest.approx(
        -(1.0 - math.log(math.exp(2) + 1 + math.e + math.exp(-1) + math.exp(0.5)))
        + math.log(5.0))


@pytest.mark.parametrize("clip, scale", [(0.2, 0.05), (None, 1.0)])
def test_gradients_reach_every_parameter_and_vmap_matches_loop(clip, scale):
    model = make_model(clip=clip)
    vectors, mask, candidates = make_batch()
    vectors = vectors * scale  # small inputs keep the scores inside [−δ, δ]
    batch = model.channels(vectors, mask)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_one(p, h, m, c, ids, q):
        logits = functional_call(model, p, (h[None], m[None], c[None], ids[None], q[None]))
        return info_nce(logits)

    args = (vectors, mask, candidates, batch.channel_ids, batch.quotas)
    batched = vmap(grad(loss_one), in_dims=(None, 0, 0, 0, 0, 0))(params, *args)
    for u in range(vectors.shape[0]):
        single = grad(loss_one)(params, *(a[u] for a in args))
        for name in params:
            torch.testing.assert_close(batched[name][u], single[name], rtol=1e-5, atol=1e-7)
    if clip is not None:
        r = model.interests(model.context(vectors, mask), batch.channel_ids)
        assert (model.interest.decompose(r)[batch.valid].abs() < clip).all()
    for name in params:
        assert batched[name].abs().sum() > 0, name


def test_clipped_scores_pass_no_gradient_upstream():
    # Large inputs: every score of a used channel exceeds δ = 0.2, so only the value
    # embeddings learn (why the official code trains without clipping).
    model = make_model()
    vectors, mask, candidates = make_batch()
    vectors = vectors * 20
    batch = model.channels(vectors, mask)
    with torch.no_grad():
        r = model.interests(model.context(vectors, mask), batch.channel_ids)
    assert (model.interest.decompose(r)[batch.valid].abs() > 0.2).all()
    info_nce(model(vectors, mask, candidates, batch.channel_ids, batch.quotas)).backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert grads["interest.values"].abs().sum() > 0
    for name in ("interest.keys", "self_attention.value.weight",
                 "channel_attention.projection.weight"):
        assert grads[name] is None or grads[name].abs().sum() == 0, name


def test_toy_training_decreases_loss():
    model = make_model(clip=None)  # as the official code trains: no clipping
    vectors, mask, candidates = make_batch(b=8, lengths=(7, 6, 5, 4, 3, 2, 1, 7))
    # positives: a noisy copy of the user's last click; negatives: random news
    jitter = torch.randn(8, D, generator=torch.Generator().manual_seed(2))
    candidates[:, 0] = vectors[:, -1] + 0.1 * jitter
    batch = model.channels(vectors, mask)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        loss = info_nce(model(vectors, mask, candidates, batch.channel_ids, batch.quotas))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]


def test_query_events_and_alpha():
    model = make_model()
    vectors, mask, _ = make_batch()
    batch = model.channels(vectors, mask)
    gens = [torch.Generator().manual_seed(s) for s in range(4)]
    out = release_query(model, vectors, mask, noise=SimulationNoise(gens))
    assert out.alpha.shape == (4, M, B)
    torch.testing.assert_close(out.alpha.sum(-1), torch.ones(4, M))
    assert torch.equal(out.released, batch.valid)
    torch.testing.assert_close(out.quotas, batch.quotas)
    # released slots: α from the same noise as protected_weights
    with torch.no_grad():
        r = model.interests(model.context(vectors, mask), batch.channel_ids)
        noise = score_noise(model, 4, [torch.Generator().manual_seed(s) for s in range(4)])
        ref = model.protected_weights(r, score_noise=noise)
    torch.testing.assert_close(out.alpha[batch.valid], ref[batch.valid])
    for u in range(4):
        (channel, count), (quota, one) = out.events[u]
        assert count == int(batch.num_channels[u]) and one == 1
        assert channel.epsilon == pytest.approx(2 * 0.2 * B / 1.2)
        assert quota.mechanism == "clear_quotas" and not quota.is_private
    # no generator: no noise, and the events say so
    clean = release_query(model, vectors, mask, noise=None)
    assert not clean.events[0][0][0].is_private
    # noised quotas: every slot released, quotas still on the simplex
    noised = release_query(model, vectors, mask, noise=SimulationNoise(gens), quota_noise_scale=0.5,
                           quota_noise=SimulationNoise(torch.Generator().manual_seed(0)))
    assert noised.released.all()
    torch.testing.assert_close(noised.quotas.sum(-1), torch.ones(4))
    assert (noised.quotas >= 0).all()
    (channel, count), (quota, _) = noised.events[0]
    assert count == M and quota.epsilon == pytest.approx(4.0) and quota.dimension == M


def test_invalid_construction_and_serving_without_clip():
    with pytest.raises(ConfigError, match="num_heads"):
        UniFedRecRecall(8, num_heads=3, head_dim=4)
    with pytest.raises(ConfigError, match="max_channels"):
        UniFedRecRecall(8, num_heads=2, head_dim=4, max_channels=0)
    model = make_model(clip=None)
    vectors, mask, _ = make_batch()
    with pytest.raises(ConfigError, match="clip"):
        release_query(model, vectors, mask, noise=SimulationNoise(torch.Generator()))


def test_aggregator_scale_is_post_processing_of_the_release():
    plain = make_model()
    scaled = make_model(aggregator_scale=True)
    with torch.no_grad():
        scaled.load_state_dict({**plain.state_dict(), "log_scale": torch.tensor(math.log(4.0))})
    vectors, mask, _ = make_batch()
    q_plain = release_query(plain, vectors, mask,
                            noise=SimulationNoise(torch.Generator().manual_seed(3)))
    q_scaled = release_query(scaled, vectors, mask,
                             noise=SimulationNoise(torch.Generator().manual_seed(3)))
    # same noised scores â: α_scaled = softmax(4·â) = α_plain⁴ / Σ α_plain⁴ (softmax identity)
    expected = q_plain.alpha ** 4 / (q_plain.alpha ** 4).sum(-1, keepdim=True)
    torch.testing.assert_close(q_scaled.alpha, expected)
    assert q_scaled.events == q_plain.events  # the scale spends nothing
    assert "log_scale" not in plain.state_dict()
    assert any(p is scaled.log_scale for p in scaled.parameters())  # trained with the model
