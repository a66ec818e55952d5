"""Tests for privaterec.data.corpus_vectors: PPMI-SVD word vectors of the news texts."""

from __future__ import annotations

import math

import pytest
import torch

from privaterec.data import corpus_vectors
from privaterec.data.corpus_vectors import corpus_word_vectors

# Two topics with their own words (ids 2..9 and 10..17) and shared filler words (18..21).
TOPIC_A, TOPIC_B, FILLER = range(2, 10), range(10, 18), range(18, 22)
VOCAB = 22


def _corpus(news: int = 400, length: int = 8, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    docs = []
    for i in range(news):
        topic = torch.tensor(list(TOPIC_A if i % 2 == 0 else TOPIC_B))
        filler = torch.tensor(list(FILLER))
        words = torch.where(torch.rand(length, generator=g) < 0.3,
                            filler[torch.randint(len(filler), (length,), generator=g)],
                            topic[torch.randint(len(topic), (length,), generator=g)])
        pad = torch.zeros(3, dtype=torch.long)  # padding is ignored
        docs.append(torch.cat([words, pad]))
    return torch.stack(docs)


def _cosine(table: torch.Tensor, a: range, b: range) -> float:
    unit = torch.nn.functional.normalize(table, dim=1)
    sims = unit[list(a)] @ unit[list(b)].T
    if a == b:
        sims = sims[~torch.eye(len(a), dtype=torch.bool)]
    return float(sims.mean())


def test_words_of_a_topic_are_closer_to_each_other_than_to_the_other_topic() -> None:
    table = corpus_word_vectors(_corpus(), VOCAB, 8)
    within = min(_cosine(table, TOPIC_A, TOPIC_A), _cosine(table, TOPIC_B, TOPIC_B))
    across = _cosine(table, TOPIC_A, TOPIC_B)
    assert within > 0.5 and across < 0.1, (within, across)


def test_shape_scale_and_special_rows() -> None:
    table = corpus_word_vectors(_corpus(), VOCAB, 8, std=0.1)
    assert table.shape == (VOCAB, 8) and table.dtype == torch.float32
    assert torch.equal(table[:2], torch.zeros(2, 8))  # <pad>, <unk>
    norms = table[2:].norm(dim=1)
    assert torch.allclose(norms, torch.full_like(norms, 0.1 * math.sqrt(8)), rtol=1e-5)


def test_a_word_that_cooccurs_with_nothing_gets_a_zero_vector() -> None:
    docs = _corpus()
    lonely = torch.zeros(1, docs.shape[1], dtype=torch.long)
    lonely[0, 0] = VOCAB  # alone in its news
    table = corpus_word_vectors(torch.cat([docs, lonely]), VOCAB + 1, 8)
    assert torch.equal(table[VOCAB], torch.zeros(8)) and table[2].norm() > 0


def test_fit_is_deterministic_and_depends_on_the_texts() -> None:
    first = corpus_word_vectors(_corpus(seed=0), VOCAB, 8)
    assert torch.equal(first, corpus_word_vectors(_corpus(seed=0), VOCAB, 8))
    assert not torch.allclose(first, corpus_word_vectors(_corpus(seed=1), VOCAB, 8))


def test_sparse_solver_agrees_with_the_dense_one(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = _corpus(news=600, length=10)
    dense = corpus_word_vectors(docs, VOCAB, 4)
    monkeypatch.setattr(corpus_vectors, "_DENSE_LIMIT", 0)
    sparse = corpus_word_vectors(docs, VOCAB, 4)
    assert torch.allclose(dense, sparse, atol=1e-4)


def test_at_most_v_minus_one_dimensions_are_filled() -> None:
    table = corpus_word_vectors(_corpus(), VOCAB, 40)
    assert table.shape == (VOCAB, 40)
    assert torch.equal(table[:, VOCAB - 1:], torch.zeros(VOCAB, 40 - VOCAB + 1))


@pytest.mark.parametrize("documents,vocab,dim,match", [
    (torch.zeros(3, dtype=torch.long), VOCAB, 4, r"\[n, L\]"),
    (torch.full((2, 3), VOCAB), VOCAB, 4, "outside"),
    (torch.zeros(2, 3, dtype=torch.long), VOCAB, 0, "dim"),
])
def test_bad_input_is_refused(documents: torch.Tensor, vocab: int, dim: int,
                              match: str) -> None:
    with pytest.raises(ValueError, match=match):
        corpus_word_vectors(documents, vocab, dim)


def test_dense_fit_does_not_depend_on_the_callers_thread_count() -> None:
    """A 1,200-word vocabulary (the dense path, large enough for LAPACK to block and
    thread): the same bits with 1 and 4 threads, and the caller's setting restored."""
    g = torch.Generator().manual_seed(3)
    words = 1200
    topics = torch.randint(8, (3000, 1), generator=g)
    docs = 2 + topics * (words // 8) + torch.randint(words // 8, (3000, 12), generator=g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = corpus_word_vectors(docs, words + 2, 16)
        torch.set_num_threads(4)
        four = corpus_word_vectors(docs, words + 2, 16)
        assert torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(threads)
    assert one[2:].abs().sum() > 0 and torch.equal(one, four)
