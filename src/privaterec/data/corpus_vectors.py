"""Word vectors fitted on the public news catalogue: PPMI + truncated SVD
(docs/privacy.md#what-each-ε-protects).

NRMS and the other text encoders start from pre-trained word vectors (GloVe in the papers).
Data whose words no public model knows (the synthetic pseudo-words of
:mod:`privaterec.data.synth`, or a language GloVe does not cover) would otherwise get random
vectors. This module fits vectors on the **news texts** instead: the titles and abstracts of
the training news, which the server publishes to every device. No click, history or user
enters the fit, so it spends no privacy budget — the same status as GloVe (public data).

Method (Levy, Goldberg & Dagan 2015, "Improving distributional similarity with lessons
learned from word embeddings", §3): two words co-occur when they appear in the same news
(title and abstract together); the co-occurrence counts ``C[w, c]`` (each news counted once
per pair) give the positive pointwise mutual information with context-distribution smoothing
α = 0.75::

    PPMI[w, c] = max(0, log(C[w, c] · Σ_c' Ĉ_c' / (C_w · Ĉ_c)))    Ĉ_c = (Σ_w C[w, c])^α

and the vectors are the ``dim`` leading left singular vectors of PPMI weighted by the square
roots of their singular values (``U √Σ``, the symmetric weighting), each row scaled to the
common norm ``std · √dim`` (so entries have the spread of a random N(0, std²) table and the
encoders' initialisation is unchanged). Words without a positive PPMI entry (no co-occurrence
above chance) get zero vectors.

The fit is deterministic: a dense SVD on one thread for vocabularies of at most 3,000 words
(the same bits in every process of a machine, whatever its thread settings), a fixed ARPACK
start vector for larger ones, and a sign convention (the largest entry of each singular
vector is positive; singular values that repeat leave the basis of their subspace to the
solver). The ARPACK path, another CPU or another library build may round differently; a
Flower device that gets other bits is refused by the public-fingerprint check
(docs/flower.md).

Which news count as training news is the caller's: a deployment fits on the publisher's
catalogue, which no user chooses. In MIND-format files a split's ``news.tsv`` lists the news
its logs reference, so there (as for the vocabulary) the set of news depends on the logged
data (docs/privacy.md, "Data used for tuning and vocabularies").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from scipy import sparse

FIRST_WORD = 2  # token ids 0 (<pad>) and 1 (<unk>) are not words
CONTEXT_SMOOTHING = 0.75  # α of Levy et al. 2015
_DENSE_LIMIT = 3000  # below this many words, a dense SVD (exact, fast enough)


def corpus_word_vectors(documents: torch.Tensor, num_tokens: int, dim: int, *,
                        std: float = 0.1) -> torch.Tensor:
    """PPMI-SVD word vectors of the news texts ``documents`` (module docstring).

    Parameters
    ----------
    documents:
        ``LongTensor[n, L]``: the token ids of each training news (title and abstract
        concatenated; 0 = padding and 1 = unknown are ignored).
    num_tokens:
        Vocabulary size V; every id in ``documents`` is below it.
    dim:
        Size of the vectors.
    std:
        Entries of the result have about this spread (rows of norm ``std · √dim``).

    Returns
    -------
    torch.Tensor
        ``FloatTensor[V, dim]``; rows 0 and 1 and the rows of words without a positive PPMI
        entry are 0.

    Raises
    ------
    ValueError
        When ``documents`` is not a 2-d tensor of ids in ``[0, V)``, or ``dim`` < 1.
    """
    from scipy import sparse

    if documents.dim() != 2:
        raise ValueError(f"documents must be [n, L] token ids, got shape "
                         f"{tuple(documents.shape)}")
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    ids = documents.numpy()
    if ids.size and (ids.min() < 0 or ids.max() >= num_tokens):
        raise ValueError(f"documents hold token ids outside [0, {num_tokens})")
    rows, positions = np.nonzero(ids >= FIRST_WORD)
    words = ids[rows, positions]
    presence = sparse.csr_matrix((np.ones(len(words)), (rows, words)),
                                 shape=(len(ids), num_tokens))
    presence.data[:] = 1.0  # a news counts once per word (duplicates were summed)
    counts = (presence.T @ presence).tocsr()
    counts.setdiag(0.0)
    counts.eliminate_zeros()
    ppmi = _ppmi(counts)
    vectors = _leading_vectors(ppmi, dim)
    # a word without PPMI entries keeps a zero row (not the solver's round-off, normalised)
    has_context = (np.diff(ppmi.indptr) > 0)[:, None]
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    scaled = np.divide(vectors, norms, out=np.zeros_like(vectors),
                       where=has_context & (norms > 1e-9 * max(float(norms.max()), 1e-30)))
    return torch.from_numpy((scaled * std * np.sqrt(dim)).astype(np.float32))


def _ppmi(counts: "sparse.csr_matrix") -> "sparse.csr_matrix":
    """Positive PMI of a symmetric co-occurrence matrix, α-smoothed contexts."""
    from scipy import sparse

    word_totals = np.asarray(counts.sum(axis=1)).ravel()
    context_weights = np.asarray(counts.sum(axis=0)).ravel() ** CONTEXT_SMOOTHING
    coo = counts.tocoo()
    pmi = np.log(coo.data * context_weights.sum()
                 / (word_totals[coo.row] * context_weights[coo.col]))
    keep = pmi > 0
    return sparse.csr_matrix((pmi[keep], (coo.row[keep], coo.col[keep])), shape=counts.shape)


def _leading_vectors(matrix: "sparse.csr_matrix", dim: int) -> np.ndarray:
    """``U √Σ`` of the ``k = min(dim, V − 1)`` largest singular values, ``[V, dim]`` (columns
    ``k..dim`` are 0), each column's largest entry positive."""
    size = matrix.shape[0]
    vectors = np.zeros((size, dim))
    if matrix.nnz == 0:
        return vectors
    k = min(dim, size - 1)
    if size <= _DENSE_LIMIT:
        # one thread: the same bits in every process, whatever its thread settings (server and
        # devices compare the frozen vectors through the task's public fingerprint)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            u_t, s_t, _ = torch.linalg.svd(torch.from_numpy(matrix.toarray()))
        finally:
            torch.set_num_threads(threads)
        u, s = u_t[:, :k].numpy(), s_t[:k].numpy()
    else:
        from scipy.sparse.linalg import svds

        u, s, _ = svds(matrix, k=k, v0=np.full(size, 1.0 / np.sqrt(size)), solver="arpack")
        order = np.argsort(-s)
        u, s = u[:, order], s[order]
    largest = u[np.abs(u).argmax(axis=0), np.arange(u.shape[1])]
    u = u * np.where(largest < 0, -1.0, 1.0)
    vectors[:, :k] = u * np.sqrt(np.maximum(s, 0.0))
    return vectors


__all__ = ["CONTEXT_SMOOTHING", "corpus_word_vectors"]
