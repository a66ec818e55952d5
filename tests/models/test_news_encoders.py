"""Tests for the news encoders: shapes, padding semantics (e₀, r₀), batch independence."""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from torch import nn

from privaterec.data.features import build_news_features, build_vocabularies
from privaterec.data.records import NewsRecord
from privaterec.errors import ConfigError
from privaterec.models.layers import WordEmbedding
from privaterec.models.news_encoders import (FedNewsRecNewsEncoder, IDNewsEncoder,
                                             NAMLNewsEncoder, NRMSNewsEncoder, PLMNewsEncoder)

V, NCAT, NSUB, NIDS, D = 30, 5, 7, 12, 8
LT, LA = 6, 7


def _embedding() -> WordEmbedding:
    return WordEmbedding(V, 6)


BUILDERS: dict[str, Callable[[], nn.Module]] = {
    "nrms": lambda: NRMSNewsEncoder(_embedding(), num_heads=2, head_dim=4, attention_dim=5,
                                    dropout=0.2),
    "fednewsrec": lambda: FedNewsRecNewsEncoder(_embedding(), cnn_filters=5, cnn_window=3,
                                                num_heads=2, head_dim=4, attention_dim=5,
                                                dropout=0.2),
    "naml": lambda: NAMLNewsEncoder(_embedding(), num_categories=NCAT,
                                    num_subcategories=NSUB, dim=D, cnn_filters=5,
                                    cnn_window=3, attention_dim=5, category_dim=4,
                                    dropout=0.2),
    "id": lambda: IDNewsEncoder(NIDS, D),
}
TEXT_ENCODERS = ["nrms", "fednewsrec", "naml"]


def _tokens(lengths: list[int], width: int, g: torch.Generator) -> torch.Tensor:
    """Right-padded random token rows with the given numbers of real tokens (ids >= 1)."""
    out = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        out[i, :n] = torch.randint(1, V, (n,), generator=g)
    return out


def _features(lengths: list[int], g: torch.Generator) -> dict[str, torch.Tensor]:
    n = len(lengths)
    return {"title": _tokens(lengths, LT, g),
            "abstract": _tokens([min(x + 1, LA) if x else 0 for x in lengths], LA, g),
            "category": torch.randint(0, NCAT, (n,), generator=g),
            "subcategory": torch.randint(0, NSUB, (n,), generator=g),
            "news_index": torch.randint(0, NIDS, (n,), generator=g)}


def _perturb_other_rows(features: dict[str, torch.Tensor], keep: list[int],
                        g: torch.Generator) -> dict[str, torch.Tensor]:
    """Same features at rows ``keep``; fresh random content and padding lengths elsewhere."""
    n = features["title"].shape[0]
    other = _features(torch.randint(0, LT + 1, (n,), generator=g).tolist(), g)
    out = {}
    for name, t in features.items():
        new = other[name].clone()
        new[keep] = t[keep]
        out[name] = new
    return out


def assert_batch_independent(encoder: nn.Module, features: dict[str, torch.Tensor],
                             keep: list[int], trials: int = 3) -> None:
    """Rows ``keep`` encode identically whatever the other rows of the batch hold."""
    encoder.eval()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        base = encoder(features)[keep]
        for _ in range(trials):
            other = encoder(_perturb_other_rows(features, keep, g))[keep]
            assert torch.allclose(base, other, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_shape_dim_and_finite(name: str) -> None:
    enc = BUILDERS[name]()
    g = torch.Generator().manual_seed(1)
    out = enc(_features([0, 1, 3, LT, 2], g))
    assert enc.dim == D and out.shape == (5, D)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", list(BUILDERS))
def test_batch_independent(name: str) -> None:
    # kept rows with different padding lengths, including an all-padding title
    g = torch.Generator().manual_seed(2)
    assert_batch_independent(BUILDERS[name](), _features([0, 2, LT, 4, 1, 5], g),
                             keep=[0, 2, 4])


@pytest.mark.parametrize("name", TEXT_ENCODERS)
def test_anonymous_news_is_finite_trainable_function_of_e0(name: str) -> None:
    enc = BUILDERS[name]().eval()
    anonymous = {"title": torch.zeros(1, LT, dtype=torch.long),
                 "abstract": torch.zeros(1, LA, dtype=torch.long),
                 "category": torch.zeros(1, dtype=torch.long),
                 "subcategory": torch.zeros(1, dtype=torch.long),
                 "news_index": torch.zeros(1, dtype=torch.long)}
    r0 = enc(anonymous)
    assert torch.isfinite(r0).all()
    r0.sum().backward()
    assert enc.embedding.pad.grad is not None and enc.embedding.pad.grad.abs().sum() > 0
    with torch.no_grad():
        enc.embedding.pad.add_(1.0)
    assert not torch.allclose(enc(anonymous), r0)


@pytest.mark.parametrize("name", TEXT_ENCODERS)
def test_extra_trailing_padding_does_not_change_output(name: str) -> None:
    # Padding is masked out of the attentions; the CNNs see e0 next to the last word either
    # way, so lengthening the padded tail must not change the news vector.
    enc = BUILDERS[name]().eval()
    g = torch.Generator().manual_seed(3)
    short = _features([2, 4, 0], g)
    long = dict(short)
    long["title"] = torch.cat([short["title"], torch.zeros(3, 5, dtype=torch.long)], 1)
    long["abstract"] = torch.cat([short["abstract"], torch.zeros(3, 4, dtype=torch.long)], 1)
    with torch.no_grad():
        a, b = enc(short), enc(long)
    # rows with real words are unchanged; the all-padding row attends all (more) positions
    assert torch.allclose(a[:2], b[:2], atol=1e-6)


@pytest.mark.parametrize("name", TEXT_ENCODERS)
def test_padding_embedding_is_used_for_padding_only(name: str) -> None:
    # A full-length title never reads e0 (NRMS: masked; NAML needs full abstracts too).
    enc = BUILDERS[name]().eval()
    g = torch.Generator().manual_seed(4)
    feats = _features([LT], g)
    feats["abstract"] = _tokens([LA], LA, g)
    with torch.no_grad():
        before = enc(feats)
        enc.embedding.pad.add_(3.0)
        assert torch.allclose(before, enc(feats), atol=1e-6)


def test_dropout_active_only_in_training() -> None:
    enc = BUILDERS["nrms"]()
    feats = _features([3, 5], torch.Generator().manual_seed(5))
    enc.train()
    assert not torch.allclose(enc(feats), enc(feats))
    enc.eval()
    assert torch.equal(enc(feats), enc(feats))


def test_naml_uses_all_views() -> None:
    enc = BUILDERS["naml"]().eval()
    feats = _features([3, 3], torch.Generator().manual_seed(6))
    base = enc(feats)
    for name, value in (("abstract", _tokens([5, 5], LA, torch.Generator().manual_seed(9))),
                        ("category", (feats["category"] + 1) % NCAT),
                        ("subcategory", (feats["subcategory"] + 1) % NSUB)):
        changed = dict(feats)
        changed[name] = value
        assert not torch.allclose(enc(changed), base), name


def test_id_encoder_reads_news_index_rows() -> None:
    enc = BUILDERS["id"]()
    feats = _features([1, 1, 1, 1], torch.Generator().manual_seed(8))
    feats["news_index"] = torch.tensor([0, 1, 1, 5])
    out = enc(feats)
    assert torch.equal(out, enc.embedding.weight[[0, 1, 1, 5]])
    assert torch.equal(out[1], out[2])  # unseen news share the unknown vector


# --------------------------------------------------------------------------- plm (MiniLM)

NEWS = [NewsRecord("N1", "sports", "soccer", "The king and the queen watched football",
                   "a match"),
        NewsRecord("N2", "news", "world", "Bananas are yellow", ""),
        NewsRecord("N3", "news", "world", "Unbelievable transfer records broken again today "
                   "as clubs spend billions", "money")]


@pytest.fixture(scope="module")
def plm_setup(minilm_offline):
    vocabs = build_vocabularies(NEWS, kind="wordpiece")
    features = build_news_features(NEWS, vocabs, title_len=8, abstract_len=4)
    torch.manual_seed(0)
    enc = PLMNewsEncoder(vocabs.words, dim=D, trainable_layers=1, dropout=0.1).eval()
    return vocabs, features, enc


def test_plm_only_top_layer_pad_and_projection_train(plm_setup) -> None:
    _, _, enc = plm_setup
    trainable = {n for n, p in enc.named_parameters() if p.requires_grad}
    assert trainable, "nothing trainable"
    assert all(n.startswith(("bert.encoder.layer.5.", "pad", "projection.")) for n in trainable)
    assert {"pad", "projection.weight"} <= trainable
    top = {n for n, _ in enc.named_parameters() if n.startswith("bert.encoder.layer.5.")}
    assert top <= trainable
    assert not any(p.requires_grad for p in enc.bert.embeddings.parameters())


def test_plm_matches_plain_minilm_on_real_tokens(plm_setup) -> None:
    # Independent reference: run MiniLM on input ids [CLS] title [SEP] (no padding), mean-pool
    # and project; our encoder (padded to title_len, pads masked) must agree.
    from transformers import AutoTokenizer

    from privaterec.data.features import minilm_path

    vocabs, features, enc = plm_setup
    tok = AutoTokenizer.from_pretrained(str(minilm_path()), local_files_only=True)
    rows = torch.tensor([1, 2, 3])
    with torch.no_grad():
        ours = enc(features.select(rows))
        for i, record in zip(rows.tolist(), NEWS):
            pieces = tok.tokenize(record.title)[:8]
            ids = tok.convert_tokens_to_ids(["[CLS]", *pieces, "[SEP]"])
            hidden = enc.bert(input_ids=torch.tensor([ids])).last_hidden_state[0]
            expected = enc.projection(hidden.mean(0))
            assert torch.allclose(ours[i - 1], expected, atol=1e-4), record.title


def test_plm_batch_independent_and_anonymous_news(plm_setup) -> None:
    vocabs, features, enc = plm_setup
    batch = features.select(torch.tensor([0, 1, 2, 3]))
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        base = enc(batch)[[0, 2]]
        for _ in range(2):
            other = {k: v.clone() for k, v in batch.items()}
            for i in (1, 3):
                n = int(torch.randint(0, 9, (1,), generator=g))
                other["title"][i] = 0
                other["title"][i, :n] = torch.randint(2, len(vocabs.words), (n,), generator=g)
            assert torch.allclose(enc(other)[[0, 2]], base, rtol=1e-5, atol=1e-6)
    # r0 (all-padding row 0) is finite and depends on the trainable e0
    r0 = enc(features.select(torch.tensor([0])))
    assert torch.isfinite(r0).all()
    (grad,) = torch.autograd.grad(r0.sum(), enc.pad)
    assert grad.abs().sum() > 0


def test_plm_token_ids_map_to_minilm_vocabulary(plm_setup) -> None:
    from transformers import AutoTokenizer

    from privaterec.data.features import minilm_path

    vocabs, _, enc = plm_setup
    tok = AutoTokenizer.from_pretrained(str(minilm_path()), local_files_only=True)
    expected = tok.convert_tokens_to_ids(vocabs.words.tokens[2:])
    assert enc.token_ids[2:].tolist() == expected
    assert enc.token_ids[:2].tolist() == tok.convert_tokens_to_ids(["[PAD]", "[UNK]"])


def test_plm_rejects_more_trainable_layers_than_minilm_has(plm_setup) -> None:
    vocabs, _, _ = plm_setup
    with pytest.raises(ConfigError, match="plm_trainable_layers.*got 7, MiniLM has 6 layers"):
        PLMNewsEncoder(vocabs.words, dim=D, trainable_layers=7, dropout=0.0)


# ----------------------------------------------------------- plm frozen-prefix cache (exactness)

def _plm_titles(lengths: list[int], vocabs, g: torch.Generator, width: int = 8) -> torch.Tensor:
    """Right-padded random word-piece titles (ids of real MiniLM pieces, >= 2)."""
    out = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        out[i, :n] = torch.randint(2, len(vocabs.words), (n,), generator=g)
    return out


def _outputs_and_grads(enc: PLMNewsEncoder, title: torch.Tensor, weights: torch.Tensor):
    params = [p for p in enc.parameters() if p.requires_grad]
    out = enc({"title": title})
    grads = torch.autograd.grad((out * weights).sum(), params)
    return out.detach(), dict(zip([n for n, p in enc.named_parameters() if p.requires_grad],
                                  grads))


@pytest.fixture(scope="module")
def plm_other_depths(plm_setup):
    """Encoders with no trainable layer (dropout 0) and with all six layers trainable."""
    vocabs, _, _ = plm_setup
    torch.manual_seed(1)
    return {0: PLMNewsEncoder(vocabs.words, dim=D, trainable_layers=0, dropout=0.0).eval(),
            6: PLMNewsEncoder(vocabs.words, dim=D, trainable_layers=6, dropout=0.1).eval()}


@pytest.mark.parametrize("depth", [1, 0, 6])
def test_plm_cache_is_exact_for_outputs_and_gradients(plm_setup, plm_other_depths,
                                                       depth: int) -> None:
    vocabs, _, enc = plm_setup
    enc = enc if depth == 1 else plm_other_depths[depth]
    enc.eval().clear_cache()
    g = torch.Generator().manual_seed(12)
    # all-padding rows, a 1-piece title, full-length titles, a duplicated title; more
    # distinct lengths than length groups, so groups are padded and masked
    title = _plm_titles([3, 0, 8, 1, 5, 8, 0, 3, 2, 6, 7, 4], vocabs, g)
    title[7] = title[0]
    weights = torch.randn(len(title), D, generator=g)
    enc.cache_frozen = False
    try:
        ref_out, ref_grads = _outputs_and_grads(enc, title, weights)
    finally:
        enc.cache_frozen = True
    assert ref_grads["pad"].abs().sum() > 0  # e0 is trained through the all-padding rows
    hits, misses = enc.frozen_cache.hits, enc.frozen_cache.misses
    for _ in ("cold", "warm"):
        out, grads = _outputs_and_grads(enc, title, weights)
        assert torch.allclose(out, ref_out, atol=1e-5)
        assert grads.keys() == ref_grads.keys()
        flat, ref_flat = (torch.cat([t.flatten() for t in d.values()]) for d in (grads, ref_grads))
        assert torch.allclose(flat, ref_flat, atol=1e-5), [
            name for name in grads if not torch.allclose(grads[name], ref_grads[name], atol=1e-5)]
    assert len(enc.frozen_cache) == 9  # lazily: one entry per distinct non-empty title
    assert enc.frozen_cache.misses - misses == 9  # computed once each, then hits
    assert enc.frozen_cache.hits - hits == 2 * 10 - 9


def test_plm_frozen_prefix_runs_in_eval_mode_during_training(plm_setup, plm_other_depths) -> None:
    _, features, enc = plm_setup
    frozen = plm_other_depths[0]
    batch = features.select(torch.tensor([0, 1, 2, 3]))
    try:
        enc.train()
        assert enc.bert.encoder.layer[5].training and enc.dropout.training
        assert not any(m.training for m in enc.frozen_modules())
        assert len(enc.frozen_modules()) == 1 + 5
        with torch.no_grad():  # MiniLM dropout is still active in the trainable top layer
            assert not torch.allclose(enc(batch), enc(batch))
        # no trainable layer and no pooling dropout: training mode is deterministic and equal
        # to eval mode, with or without the cache (MiniLM's dropout would break this)
        frozen.train()
        with torch.no_grad():
            cached = frozen(batch)
            frozen.cache_frozen = False
            uncached = frozen(batch)
            frozen.eval()
            evaluated = frozen(batch)
    finally:
        frozen.cache_frozen = True
        enc.eval()
        frozen.eval()
    assert torch.allclose(cached, uncached, atol=1e-5)
    assert torch.allclose(cached, evaluated, atol=1e-5)


def test_plm_cache_keys_on_tokens_not_table_rows(plm_setup) -> None:
    vocabs, features, enc = plm_setup
    enc.eval().clear_cache()
    rows = torch.tensor([1, 2, 3])
    with torch.no_grad():
        first = enc(features.select(rows))
    assert len(enc.frozen_cache) == 3
    # another table: the same titles at other rows, and a new title at a row index in use
    other = build_news_features(
        [NEWS[2], NewsRecord("N9", "news", "world", "The queen watched bananas", ""), NEWS[0]],
        vocabs, title_len=8, abstract_len=4)
    with torch.no_grad():
        second = enc(other.select(rows))
        enc.cache_frozen = False
        try:
            reference = enc(other.select(rows))
        finally:
            enc.cache_frozen = True
    assert len(enc.frozen_cache) == 4
    assert torch.allclose(second, reference, atol=1e-5)
    assert torch.allclose(second[0], first[2], atol=1e-6)
    assert torch.allclose(second[2], first[0], atol=1e-6)
    assert not torch.allclose(second[1], first[1], atol=1e-3)


def test_plm_cache_is_not_state_and_follows_frozen_weight_changes(plm_setup) -> None:
    import copy

    _, features, enc = plm_setup
    enc.eval().clear_cache()
    batch = features.select(torch.tensor([0, 1, 2, 3]))
    with torch.no_grad():
        before = enc(batch)
    assert len(enc.frozen_cache) == 3
    state = enc.state_dict()
    assert not any("cache" in key for key in state)
    twin = copy.deepcopy(enc)
    assert twin.frozen_cache is enc.frozen_cache  # shared: same frozen weights
    changed = {k: v.clone() for k, v in state.items()}
    changed["bert.encoder.layer.2.output.dense.weight"] *= 1.5  # a frozen layer
    twin.load_state_dict(changed)
    with torch.no_grad():
        after = twin(batch)
        twin.cache_frozen = False
        expected = twin(batch)
        assert torch.allclose(after, expected, atol=1e-5)
        assert not torch.allclose(after[1:], before[1:], atol=1e-3)
        assert torch.allclose(enc(batch), before, atol=1e-5)  # the original is unaffected
        # reloading identical weights (new versions, same values) keeps the entries
        misses = enc.frozen_cache.misses
        enc.load_state_dict(state)
        assert torch.allclose(enc(batch), before, atol=1e-5)
        assert enc.frozen_cache.misses == misses


def test_plm_cache_filled_in_inference_mode_serves_training(plm_setup) -> None:
    _, features, enc = plm_setup
    enc.eval().clear_cache()
    batch = features.select(torch.tensor([1, 2, 3]))
    with torch.inference_mode():
        enc(batch)
    hits = enc.frozen_cache.hits
    out = enc(batch)
    assert enc.frozen_cache.hits - hits == 3
    top = list(enc.bert.encoder.layer[5].parameters())
    grads = torch.autograd.grad(out.sum(), top)
    assert all(torch.isfinite(g).all() for g in grads) and grads[0].abs().sum() > 0


def test_plm_torch_func_grad_takes_the_uncached_path(plm_setup) -> None:
    # functorch wraps tensors (no bytes to key on): the encoder must bypass the cache there
    _, features, enc = plm_setup
    enc.eval().clear_cache()
    batch = {"title": features.select(torch.tensor([0, 1, 2]))["title"]}
    params = {k: p.detach() for k, p in enc.named_parameters() if p.requires_grad}
    frozen = {k: p.detach() for k, p in enc.named_parameters() if not p.requires_grad}

    def loss(p):
        return torch.func.functional_call(enc, {**p, **frozen}, (batch,)).square().sum()

    grads = torch.func.grad(loss)(params)
    assert len(enc.frozen_cache) == 0
    leaves = [p for p in enc.parameters() if p.requires_grad]
    expected = torch.autograd.grad(enc(batch).square().sum(), leaves)  # cached path
    assert len(enc.frozen_cache) == 2
    for (name, g), e in zip(grads.items(), expected):
        assert torch.allclose(g, e, atol=1e-5), name
