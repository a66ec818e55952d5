"""Public artifacts a server ships to the devices with a content hash, so that devices use
them instead of fitting them again (docs/flower.md, "What a device needs").

``"corpus"`` word vectors (:mod:`privaterec.data.corpus_vectors`) are fitted on the public
news catalogue. A device that fitted them itself would need the whole catalogue, and one
whose CPU or linear-algebra build rounds differently would compute other vectors and be
refused (the public fingerprint, :func:`privaterec.fed.flower.messages.public_fingerprint`,
covers them). The server therefore sends the table it fitted, ``word_vectors.json``: the
float32 bytes (little-endian, row-major ``[V, word_dim]``), base64-encoded, with their
SHA-256; the device checks the hash of the bytes it decoded before using them.
"""

from __future__ import annotations

import base64
import hashlib
import json

import numpy as np
import torch

from privaterec.errors import ConfigError
from privaterec.models.layers import WordEmbedding
from privaterec.models.recommender import Recommender

WORD_VECTORS_FILE = "word_vectors.json"
"""The run file holding the shipped ``"corpus"`` word vectors."""


def word_vectors_of(model: Recommender) -> torch.Tensor | None:
    """The token table ``[V, word_dim]`` of ``model``'s word embedding (``None`` when its
    news encoder has none, e.g. ``news_encoder: id``)."""
    for module in model.modules():
        if isinstance(module, WordEmbedding):
            return module.weight.detach()
    return None


def encode_word_vectors(table: torch.Tensor) -> str:
    """``word_vectors.json``'s text for ``table`` ``[V, D]``: shape, SHA-256 and base64."""
    raw = np.ascontiguousarray(table.detach().cpu().numpy(), dtype="<f4").tobytes()
    return json.dumps({"shape": list(table.shape), "dtype": "float32",
                       "sha256": hashlib.sha256(raw).hexdigest(),
                       "data": base64.b64encode(raw).decode("ascii")})


def decode_word_vectors(text: str) -> torch.Tensor:
    """The table of a ``word_vectors.json`` text, once its bytes match the stated SHA-256.

    Raises
    ------
    ConfigError
        If the file is malformed, or its bytes do not hash to the stated SHA-256.
    """
    try:
        record = json.loads(text)
        shape = tuple(int(n) for n in record["shape"])
        raw = base64.b64decode(record["data"], validate=True)
        stated = str(record["sha256"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{WORD_VECTORS_FILE}: malformed ({exc}); restart the run so that "
                          f"the server sends it again") from None
    actual = hashlib.sha256(raw).hexdigest()
    if actual != stated:
        raise ConfigError(f"{WORD_VECTORS_FILE}: its bytes hash to {actual}, the file states "
                          f"{stated}; it was altered or truncated, nothing is trained with it")
    if len(raw) != 4 * int(np.prod(shape)):
        raise ConfigError(f"{WORD_VECTORS_FILE}: {len(raw)} bytes do not hold a float32 "
                          f"table of shape {shape}")
    return torch.from_numpy(np.frombuffer(raw, dtype="<f4").reshape(shape).copy())


__all__ = ["WORD_VECTORS_FILE", "decode_word_vectors", "encode_word_vectors",
           "word_vectors_of"]
