"""LocalObjective: per-client gradients (vmap, chunks, padding) against independent references."""

from __future__ import annotations

import pytest
import torch

from privaterec.fed.objective import ClientBatch, LocalObjective, ParamSpec

ENCODERS = [("nrms", None), ("naml", None), ("naml", "lstur"), ("fednewsrec", None),
            ("id", None)]
# Users with 9, 2, 8, 4 and 2 samples (the batch is padded to 9 samples per client) and
# histories of 3, 0 (empty), 2, 3 and 1 clicks out of H = 5.
USERS = [0, 6, 12, 3, 13]


def _reference_gradient(model, theta_names, history, mask, candidates):
    """∇ of the mean InfoNCE loss through the ordinary ``Recommender.forward`` (eval mode)."""
    model.eval()
    n, h = candidates.shape[0], history.shape[0]
    logits = model(history.expand(n, h), mask.expand(n, h), candidates)
    loss = -torch.log_softmax(logits, dim=1)[:, 0].mean()
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(loss, [params[name] for name in theta_names])
    return torch.cat([g.reshape(-1) for g in grads]), float(loss.detach())


def test_param_spec_lists_exactly_the_trainable_parameters(make_model):
    model = make_model("nrms")
    spec = ParamSpec.of(model)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert list(spec.names) == list(trainable)
    assert spec.dimension == sum(p.numel() for p in trainable.values())
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and not set(frozen) & set(spec.names)  # frozen word vectors not uploaded
    flat = spec.flatten({n: p.detach() for n, p in trainable.items()})
    assert flat.shape == (spec.dimension,)
    back = spec.unflatten(flat)
    assert all(torch.equal(back[n], trainable[n].detach()) for n in spec.names)


def test_parameters_load_round_trip(make_objective, perturb):
    objective = make_objective("nrms")
    theta = perturb(objective)
    objective.load(theta)
    assert torch.equal(objective.parameters(), theta)
    state = objective.model.state_dict()
    names = objective.parameter_names()
    assert all(name in state for name in names)
    assert torch.equal(torch.cat([state[n].reshape(-1) for n in names]), theta)


@pytest.mark.parametrize("news_encoder,user_encoder", ENCODERS)
def test_client_gradient_equals_autograd_on_the_recommender(make_objective, perturb, clients,
                                                            client_batch, news_encoder,
                                                            user_encoder):
    objective = make_objective(news_encoder, user_encoder)
    theta = perturb(objective)
    objective.load(theta)
    _, candidates = client_batch(USERS[:3])
    for u, cands in zip(USERS[:3], candidates):  # 3 clicks, an empty history, 2 clicks
        g, loss = objective.client_gradient(theta, clients.history[u], clients.history_mask[u],
                                            cands)
        ref, ref_loss = _reference_gradient(objective.model, objective.parameter_names(),
                                            clients.history[u], clients.history_mask[u], cands)
        assert g.shape == (objective.dimension,)
        assert loss == pytest.approx(ref_loss, rel=1e-5)
        torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-6)
        assert ref.abs().max() > 1e-3  # a non-trivial gradient was compared


@pytest.mark.parametrize("news_encoder,user_encoder", ENCODERS)
def test_vmapped_client_gradients_equal_one_client_at_a_time(make_objective, perturb, clients,
                                                             client_batch, news_encoder,
                                                             user_encoder):
    objective = make_objective(news_encoder, user_encoder)
    assert objective.supports_vmap
    theta = perturb(objective)
    batch, candidates = client_batch(USERS)
    assert sorted({c.shape[0] for c in candidates}) == [2, 4, 8, 9]  # padded batch
    assert batch.history_mask.sum(1).tolist() == [3, 0, 2, 3, 1]  # incl. an empty history
    refs = [objective.client_gradient(theta, clients.history[u], clients.history_mask[u], c)
            for u, c in zip(USERS, candidates)]
    ref_grads = torch.stack([g for g, _ in refs])
    ref_losses = torch.tensor([loss for _, loss in refs])
    for chunk in (1, 2, 3, len(USERS), 32):  # chunks smaller than m, uneven, larger
        grads, losses = objective.client_gradients(theta, batch, chunk_clients=chunk)
        assert grads.shape == (len(USERS), objective.dimension)
        torch.testing.assert_close(grads, ref_grads, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(losses, ref_losses, rtol=1e-5, atol=1e-6)


def test_loop_fallback_equals_vmap(make_objective, perturb, client_batch):
    objective = make_objective("nrms")
    theta = perturb(objective)
    batch, _ = client_batch(USERS)
    vmapped, losses = objective.client_gradients(theta, batch, chunk_clients=2)
    objective.supports_vmap = False  # the path of encoders that cannot run under vmap (plm)
    looped, loop_losses = objective.client_gradients(theta, batch, chunk_clients=2)
    torch.testing.assert_close(looped, vmapped, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(loop_losses, losses)


@pytest.mark.parametrize("news_encoder,user_encoder", [("nrms", None), ("naml", "lstur")])
def test_round_gradient_is_the_sample_weighted_mean(make_objective, perturb, client_batch,
                                                    news_encoder, user_encoder):
    objective = make_objective(news_encoder, user_encoder)
    theta = perturb(objective)
    batch, candidates = client_batch(USERS)
    grads, losses = objective.client_gradients(theta, batch)
    n = torch.tensor([float(c.shape[0]) for c in candidates])
    expected = (n[:, None] * grads).sum(0) / n.sum()
    g, loss = objective.round_gradient(theta, batch)
    torch.testing.assert_close(g, expected, rtol=1e-4, atol=1e-6)
    assert loss == pytest.approx(float((n * losses).sum() / n.sum()), rel=1e-5)


def _indices(part) -> list[int]:
    return list(range(part.start, part.stop)) if isinstance(part, slice) else part.tolist()


def test_chunks_cover_every_client_once_and_keep_all_real_data(client_batch):
    batch, candidates = client_batch(USERS)
    seen = []
    for part, chunk in batch.chunks(2):
        idx = _indices(part)
        assert 1 <= len(idx) <= 2
        sizes = [candidates[i].shape[0] for i in idx]
        assert chunk.candidates.shape[1] == max(sizes)  # trimmed to the chunk's own padding
        assert chunk.weights.sum(1).tolist() == sizes
        for row, i in enumerate(idx):
            assert torch.equal(chunk.candidates[row, : sizes[row]], candidates[i])
            real = batch.history_mask[i]
            assert torch.equal(chunk.history[row][chunk.history_mask[row]], batch.history[i][real])
        seen += idx
    assert sorted(seen) == list(range(len(USERS)))


def test_local_deltas_one_and_two_sgd_steps(make_objective, perturb, clients, client_batch):
    objective = make_objective("nrms")
    theta = perturb(objective)
    users = USERS[:3]
    batch, candidates = client_batch(users)
    lr = 0.3
    one, first_losses = objective.local_deltas(theta, batch, steps=1, lr=lr, chunk_clients=2)
    two, _ = objective.local_deltas(theta, batch, steps=2, lr=lr, chunk_clients=2)
    for i, (u, c) in enumerate(zip(users, candidates)):
        h, m = clients.history[u], clients.history_mask[u]
        g1, loss1 = objective.client_gradient(theta, h, m, c)
        torch.testing.assert_close(one[i], lr * g1, rtol=1e-4, atol=1e-7)
        assert float(first_losses[i]) == pytest.approx(loss1, rel=1e-5)
        theta1 = theta - lr * g1
        g2, _ = objective.client_gradient(theta1, h, m, c)
        theta2 = theta1 - lr * g2
        torch.testing.assert_close(two[i], theta - theta2, rtol=1e-4, atol=1e-7)
        assert not torch.allclose(two[i], 2 * one[i], atol=1e-7)  # the 2nd step moved θ


def test_gradients_do_not_touch_the_model(make_objective, perturb, client_batch):
    objective = make_objective("nrms")
    before = objective.parameters()
    theta = perturb(objective)
    batch, _ = client_batch(USERS[:2])
    objective.client_gradients(theta, batch)
    objective.round_gradient(theta, batch)
    objective.local_deltas(theta, batch, steps=2, lr=0.1)
    assert torch.equal(objective.parameters(), before)
    assert not objective.model.training  # clients compute in eval mode (no dropout)


def test_stack_pads_with_zero_weight_rows(clients):
    candidates = [torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5, 6], [7, 8, 9]])]
    batch = ClientBatch.stack([clients.history[0], clients.history[1]],
                              [clients.history_mask[0], clients.history_mask[1]], candidates)
    assert batch.weights.tolist() == [[1.0, 0.0], [1.0, 1.0]]
    assert batch.candidates[0, 1].tolist() == [0, 0, 0]
    assert batch.num_clients == 2


def test_objective_puts_the_model_in_eval_mode(make_model):
    model = make_model("nrms")
    model.train()
    LocalObjective(model)
    assert not model.training
