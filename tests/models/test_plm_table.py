"""PLM-NR's precomputed frozen-prefix table: exactness against the uncached reference path,
inside ``torch.func`` transforms and per-client gradients, invalidation, memory budget."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from privaterec.config import ModelConfig
from privaterec.data.features import NewsFeatures, build_vocabularies
from privaterec.data.records import NewsRecord
from privaterec.fed.objective import ClientBatch, LocalObjective
from privaterec.models.factory import build_recommender
from privaterec.models.plm_encoder import PLMNewsEncoder

D, WIDTH = 8, 8
RECORDS = [NewsRecord("N1", "sports", "soccer", "The king and the queen watched football", ""),
           NewsRecord("N2", "news", "world", "Bananas are yellow and unbelievable", "")]
# real-token counts of the table's titles; row 0 and row 5 are all padding (r0)
LENGTHS = [0, 3, 8, 1, 5, 0, 8, 2, 6, 7, 4, 3]


@pytest.fixture(scope="module")
def vocabs(minilm_offline):
    return build_vocabularies(RECORDS, kind="wordpiece")


def _table(vocabs, seed: int = 3) -> NewsFeatures:
    """A news table of random word-piece titles with the lengths of ``LENGTHS``."""
    g = torch.Generator().manual_seed(seed)
    n = len(LENGTHS)
    title = torch.zeros(n, WIDTH, dtype=torch.long)
    for i, k in enumerate(LENGTHS):
        title[i, :k] = torch.randint(2, len(vocabs.words), (k,), generator=g)
    title[11] = title[1]  # a duplicate title at another row
    zeros = torch.zeros(n, dtype=torch.long)
    return NewsFeatures(news_ids=[f"N{i}" for i in range(n)], title=title,
                        abstract=torch.zeros(n, 2, dtype=torch.long), category=zeros,
                        subcategory=zeros, news_index=zeros)


@pytest.fixture(scope="module")
def encoders(vocabs):
    torch.manual_seed(0)
    return {depth: PLMNewsEncoder(vocabs.words, dim=D, trainable_layers=depth,
                                  dropout=0.0).eval() for depth in (0, 1, 6)}


def _trainable(enc: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p for n, p in enc.named_parameters() if p.requires_grad}


def _reference(enc: PLMNewsEncoder, features: NewsFeatures, rows: torch.Tensor,
               weights: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Output and gradients of Σ w·Θ_N(rows) on the uncached path (all of MiniLM)."""
    enc.cache_frozen = False
    try:
        out = enc(features.select(rows))
    finally:
        enc.cache_frozen = True
    params = _trainable(enc)
    grads = torch.autograd.grad((out * weights).sum(), list(params.values()))
    return out.detach(), dict(zip(params, grads))


class _Rows(nn.Module):
    """``rows → Θ_N(rows)`` through the table, as a module for ``functional_call``."""

    def __init__(self, enc: PLMNewsEncoder, features: NewsFeatures) -> None:
        super().__init__()
        self.enc, self.features = enc, features

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.enc.encode_table(self.features, rows)


@pytest.mark.parametrize("depth", [0, 1, 6])
def test_table_outputs_and_gradients_equal_the_uncached_path(vocabs, encoders, depth):
    enc = encoders[depth]
    features = _table(vocabs)
    assert enc.prepare_table(features)
    assert enc.table is not None and enc.table.empty.tolist() == [k == 0 for k in LENGTHS]
    rows = torch.tensor([2, 0, 1, 11, 5, 6, 3, 9, 0, 10, 4, 7, 8])
    weights = torch.randn(len(rows), D, generator=torch.Generator().manual_seed(1))
    ref_out, ref_grads = _reference(enc, features, rows, weights)
    assert ref_grads["pad"].abs().sum() > 0  # e0 trains through the all-padding rows
    out = enc.encode_table(features, rows)
    params = _trainable(enc)
    grads = dict(zip(params, torch.autograd.grad((out * weights).sum(), list(params.values()))))
    torch.testing.assert_close(out.detach(), ref_out, rtol=1e-4, atol=1e-5)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-5,
                                   msg=name)
    # the table, not the lazy cache, did the work
    enc.clear_cache()
    enc.encode_table(features, rows)
    assert len(enc.frozen_cache) == 0


@pytest.mark.parametrize("depth", [0, 1])
def test_table_per_client_gradients_under_grad_and_vmap(vocabs, encoders, depth):
    # per-client gradients (DP-FedRec, PrivateRec strict) run inside torch.func transforms
    enc = encoders[depth]
    features = _table(vocabs)
    enc.prepare_table(features)
    module = _Rows(enc, features)
    params = {n: p.detach() for n, p in _trainable(enc).items()}
    frozen = {f"enc.{n}": t.detach() for n, t in [*enc.named_parameters(), *enc.named_buffers()]
              if n not in params}
    clients = torch.tensor([[1, 0, 4, 6], [5, 8, 8, 2], [10, 11, 3, 0]])  # rows per client
    weights = torch.randn(3, 4, D, generator=torch.Generator().manual_seed(2))

    def loss(theta, rows, w):
        named = {f"enc.{n}": t for n, t in theta.items()}
        return (functional_call(module, {**named, **frozen}, (rows,)) * w).sum()

    looped = [grad(loss)(params, clients[i], weights[i]) for i in range(3)]
    batched = vmap(grad(loss), in_dims=(None, 0, 0))(params, clients, weights)
    for i in range(3):
        _, expected = _reference(enc, features, clients[i], weights[i])
        for name in expected:
            torch.testing.assert_close(looped[i][name], expected[name], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(batched[name][i], expected[name], rtol=1e-4, atol=1e-5)


def test_table_is_batch_independent(vocabs, encoders):
    enc = encoders[1]
    features = _table(vocabs)
    enc.prepare_table(features)
    with torch.no_grad():
        base = enc.encode_table(features, torch.tensor([3, 1, 8]))[[0, 2]]
        for middle in (0, 2, 6, 9):
            out = enc.encode_table(features, torch.tensor([3, middle, 8]))[[0, 2]]
            assert torch.allclose(out, base, rtol=1e-5, atol=1e-6)


def test_table_follows_weight_and_table_changes(vocabs, encoders):
    enc = copy.deepcopy(encoders[1])  # own weights: this test changes a frozen layer
    features = _table(vocabs)
    rows = torch.tensor([0, 1, 2, 3, 4])
    assert enc.prepare_table(features)
    table = enc.table
    with torch.no_grad():
        before = enc.encode_table(features, rows)
        # the same weights reloaded (new versions, same values): the table stays in use
        enc.load_state_dict(copy.deepcopy(enc.state_dict()))
        assert enc.table.matches(features.title, enc._frozen_state())
        assert torch.equal(enc.encode_table(features, rows), before)
        # another news table of the same shape: its rows are other titles
        other = _table(vocabs, seed=4)
        torch.testing.assert_close(enc.encode_table(other, rows), enc(other.select(rows)),
                                   rtol=1e-4, atol=1e-5)
        assert not torch.allclose(enc.encode_table(other, rows)[1:], before[1:], atol=1e-3)
        # a changed frozen layer: the table no longer matches, encoding falls back and is exact
        state = enc.state_dict()
        state["bert.encoder.layer.2.output.dense.weight"] = (
            state["bert.encoder.layer.2.output.dense.weight"] * 1.5)
        enc.load_state_dict(state)
        assert not table.matches(features.title, enc._frozen_state())
        after = enc.encode_table(features, rows)
        enc.cache_frozen = False
        expected = enc(features.select(rows))
        enc.cache_frozen = True
        assert torch.allclose(after, expected, atol=1e-5)
        assert not torch.allclose(after[1:], before[1:], atol=1e-3)
        assert enc.prepare_table(other) and enc.table is not table


def test_table_respects_the_memory_budget(vocabs):
    torch.manual_seed(0)
    enc = PLMNewsEncoder(vocabs.words, dim=D, trainable_layers=0, dropout=0.0,
                         cache_bytes=10_000).eval()  # < 12 titles x 10 positions x 384 x 4
    features = _table(vocabs)
    assert not enc.prepare_table(features)
    assert enc.table is None and not enc.supports_vmap
    rows = torch.tensor([0, 1, 2])
    with torch.no_grad():
        torch.testing.assert_close(enc.encode_table(features, rows), enc(features.select(rows)))


def test_supports_vmap_only_with_a_table_and_no_trained_layer(vocabs, encoders):
    features = _table(vocabs)
    for depth, enc in encoders.items():
        enc.prepare_table(features)
        assert enc.supports_vmap == (depth == 0)
    enc = copy.deepcopy(encoders[0])
    enc.table = None
    assert not enc.supports_vmap


@pytest.mark.parametrize("depth", [0, 1])
def test_local_objective_per_client_gradients_equal_the_reference(vocabs, depth):
    # the federated path end to end: a PLM recommender's LocalObjective prepares the table
    # (vmap with no trained layer, a loop otherwise) and matches the uncached reference
    config = ModelConfig(news_encoder="plm", plm_trainable_layers=depth, num_heads=2,
                         head_dim=4, dropout=0.0, title_len=WIDTH)
    torch.manual_seed(0)
    model = build_recommender(config, vocabs, _table(vocabs))
    objective = LocalObjective(model)
    assert model.news_encoder.table is not None
    assert objective.supports_vmap == (depth == 0)
    # the FedAdam server steps these coordinates at TrainConfig.plm_lr
    top = sum(p.numel() for p in model.news_encoder.bert.encoder.layer[5].parameters())
    assert int(objective.pretrained_mask().sum()) == (top if depth else 0)
    assert objective.pretrained_mask().shape == (objective.dimension,)
    batch = ClientBatch(history=torch.tensor([[0, 3, 4], [0, 0, 0], [6, 7, 8]]),
                        history_mask=torch.tensor([[False, True, True], [False] * 3,
                                                   [True] * 3]),
                        candidates=torch.tensor([[[1, 2, 9], [10, 5, 3]],
                                                 [[2, 11, 4], [0, 0, 0]],
                                                 [[8, 5, 1], [7, 6, 2]]]),
                        weights=torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]]))
    theta = objective.parameters()
    fast, losses = objective.client_gradients(theta, batch)
    model.news_encoder.cache_frozen = False
    objective.supports_vmap = False
    reference, ref_losses = objective.client_gradients(theta, batch)
    torch.testing.assert_close(fast, reference, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-5, atol=1e-6)
    assert reference.abs().sum() > 0


def test_resumed_objective_keeps_the_table_inside_transforms(vocabs):
    # the simulator loads the checkpoint into the model after building LocalObjective: the
    # frozen weights get new versions, so the table re-checks them by digest, here inside
    # torch.func.grad (this raised "Cannot access data pointer" before the digest switched
    # the transforms off)
    config = ModelConfig(news_encoder="plm", plm_trainable_layers=1, num_heads=2,
                         head_dim=4, dropout=0.0, title_len=WIDTH)
    torch.manual_seed(0)
    model = build_recommender(config, vocabs, _table(vocabs))
    objective = LocalObjective(model)
    batch = ClientBatch(history=torch.tensor([[0, 3, 4]]),
                        history_mask=torch.tensor([[False, True, True]]),
                        candidates=torch.tensor([[[1, 2, 9], [10, 5, 3]]]),
                        weights=torch.tensor([[1.0, 1.0]]))
    theta = objective.parameters()
    before, _ = objective.client_gradients(theta, batch)
    table = model.news_encoder.table
    model.load_state_dict(copy.deepcopy(model.state_dict()))
    after, _ = objective.client_gradients(theta, batch)
    assert model.news_encoder.table is table
    assert table.matches(model.features.title, model.news_encoder._frozen_state())
    torch.testing.assert_close(after, before)
