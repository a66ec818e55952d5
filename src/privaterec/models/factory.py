"""Build a :class:`~privaterec.models.recommender.Recommender` from a :class:`ModelConfig`.

Construction draws from the global torch RNG only, so it is deterministic under
``torch.manual_seed`` (the caller seeds).

Word embeddings (``ModelConfig.embeddings``), for the text encoders ``nrms``, ``naml`` and
``fednewsrec``:

* ``"random"`` — N(0, 0.1²) vectors of size ``word_dim``;
* ``"corpus"`` — vectors of size ``word_dim`` fitted on the texts of the training news (the
  rows of ``features`` whose news id is in the vocabulary; public data, no user enters the
  fit; :mod:`privaterec.data.corpus_vectors`). Without ``features`` the model can only be
  built as the shell of a checkpoint (``for_checkpoint=True``): the table is zeros until the
  checkpoint's ``state_dict`` fills it;
* ``"glove50"`` — GloVe 6B 50-d; the embedding size is 50 (``ModelConfig`` rejects a
  conflicting ``word_dim``);
* ``"minilm"`` — MiniLM-L6 input word-piece embeddings, size 384 (``ModelConfig``
  rejects a conflicting ``word_dim``); needs a ``"wordpiece"`` vocabulary (see :func:`vocabulary_kind`).

The table is frozen when ``freeze_embeddings`` (the padding embedding e₀ is always
trainable). ``plm`` uses MiniLM's own embeddings and ``id`` uses none, so ``embeddings`` is
ignored for them.
"""

from __future__ import annotations

import torch
from torch import nn

from privaterec.config import ModelConfig
from privaterec.data.corpus_vectors import corpus_word_vectors
from privaterec.data.features import NewsFeatures
from privaterec.data.text import TextVocabularies
from privaterec.errors import ConfigError
from privaterec.models.basis import REFERENCE_NEWS, BasicVectors, ReferenceNews
from privaterec.models.layers import NewsEncoderModule, WordEmbedding
from privaterec.models.news_encoders import NEWS_ENCODER_BUILDERS
from privaterec.models.recommender import Recommender
from privaterec.models.user_encoders import USER_ENCODER_BUILDERS

FIRST_NEWS_INDEX = 2  # news-id vocabulary: 0 padding, 1 unseen, then the training news


def vocabulary_kind(model_config: ModelConfig) -> str:
    """Vocabulary kind a model needs: ``"wordpiece"`` for ``plm`` or ``minilm`` embeddings,
    else ``"word"``."""
    if model_config.news_encoder == "plm" or model_config.embeddings == "minilm":
        return "wordpiece"
    return "word"


def build_word_embedding(model_config: ModelConfig, vocabs: TextVocabularies,
                         features: NewsFeatures | None = None, *,
                         for_checkpoint: bool = False,
                         word_vectors: torch.Tensor | None = None) -> WordEmbedding:
    """The :class:`WordEmbedding` selected by ``model_config.embeddings`` (see module doc);
    ``features`` is the news table ``"corpus"`` vectors are fitted on, and
    ``for_checkpoint`` allows a zero placeholder without it (a checkpoint is loaded next).
    ``word_vectors``: the ``"corpus"`` table ``[V, word_dim]`` already fitted (e.g. shipped
    by a deployed server, :mod:`privaterec.runs.artifacts`), used instead of fitting it.

    Raises
    ------
    ConfigError
        When ``vocabs.kind`` is not the kind the configuration needs, or ``"corpus"``
        vectors are asked for without ``features`` and not ``for_checkpoint``.
    """
    _check_vocabulary(model_config, vocabs)
    num_tokens = len(vocabs.words)
    freeze = model_config.freeze_embeddings
    if model_config.embeddings == "random":
        return WordEmbedding(num_tokens, model_config.resolved_word_dim, freeze=freeze)
    if model_config.embeddings == "corpus":
        dim = model_config.resolved_word_dim
        if word_vectors is not None:
            if tuple(word_vectors.shape) != (num_tokens, dim):
                raise ConfigError(f"the corpus word vectors have shape "
                                  f"{tuple(word_vectors.shape)}, the vocabulary and word_dim "
                                  f"need {(num_tokens, dim)}")
            return WordEmbedding(num_tokens, dim, pretrained=word_vectors, freeze=freeze)
        if features is None:
            if not for_checkpoint:
                raise ConfigError("embeddings='corpus' are fitted on the news texts: build the "
                                  "model with its news features (or for_checkpoint=True "
                                  "when a checkpoint's state_dict is loaded next)")
            table = torch.zeros(num_tokens, dim)
        else:
            training_news = features.news_index >= FIRST_NEWS_INDEX
            texts = torch.cat([features.title, features.abstract], dim=1)[training_news]
            table = corpus_word_vectors(texts, num_tokens, dim)
        return WordEmbedding(num_tokens, dim, pretrained=table, freeze=freeze)
    from privaterec.data.embeddings import load_pretrained

    table, _ = load_pretrained(model_config.embeddings, vocabs.words)
    return WordEmbedding(num_tokens, table.shape[1], pretrained=table, freeze=freeze)


def build_news_encoder(model_config: ModelConfig, vocabs: TextVocabularies,
                       features: NewsFeatures | None = None, *,
                       for_checkpoint: bool = False,
                       word_vectors: torch.Tensor | None = None) -> NewsEncoderModule:
    """The news encoder Θ_N named by ``model_config.news_encoder``, output size
    ``model_config.news_dim`` (``features``, ``for_checkpoint``: see
    :func:`build_word_embedding`)."""
    _check_vocabulary(model_config, vocabs)
    return NEWS_ENCODER_BUILDERS[model_config.news_encoder](
        model_config, vocabs, lambda: build_word_embedding(
            model_config, vocabs, features, for_checkpoint=for_checkpoint,
            word_vectors=word_vectors))


def build_user_encoder(model_config: ModelConfig) -> nn.Module:
    """The user encoder Θ_U named by ``model_config.resolved_user_encoder``."""
    return USER_ENCODER_BUILDERS[model_config.resolved_user_encoder](model_config)


def build_recommender(model_config: ModelConfig, vocabs: TextVocabularies,
                      features: NewsFeatures | None = None, *,
                      for_checkpoint: bool = False,
                      word_vectors: torch.Tensor | None = None) -> Recommender:
    """Θ_N + Θ_U as a :class:`Recommender` (FedNewsRec §3.1).

    Parameters
    ----------
    model_config:
        Architecture; vocabulary sizes come from ``vocabs``.
    vocabs:
        Vocabularies built with ``kind=vocabulary_kind(model_config)``.
    features:
        Optional news table to attach (``"corpus"`` word vectors are fitted on it).
    for_checkpoint:
        The model is the shell of a checkpoint whose ``state_dict`` is loaded next: frozen
        tables that need ``features`` may be zero placeholders.
    word_vectors:
        ``"corpus"`` word vectors already fitted (:func:`build_word_embedding`).

    With ``basis_size`` B > 0 the model carries PrivateRec's B basic vectors (built after
    the encoders, so models without a basis draw exactly the same initial parameters;
    :func:`build_basis`).

    Raises
    ------
    ConfigError
        When ``vocabs.kind`` does not match the configuration, ``plm_trainable_layers``
        exceeds MiniLM's depth, or ``"corpus"`` vectors lack ``features`` (and not
        ``for_checkpoint``).
    ImportError
        When pre-trained embeddings or MiniLM are requested but their package is missing.
    """
    news_encoder = build_news_encoder(model_config, vocabs, features,
                                      for_checkpoint=for_checkpoint,
                                      word_vectors=word_vectors)
    user_encoder = build_user_encoder(model_config)
    basis = None
    if model_config.basis_size > 0:
        basis = build_basis(model_config, int(news_encoder.dim), features)
    return Recommender(news_encoder, user_encoder, features, basis=basis)


def build_basis(model_config: ModelConfig, dim: int,
                features: NewsFeatures | None = None) -> BasicVectors:
    """PrivateRec's B basic vectors with the configured attention (``basis_attention``).

    ``centered`` attention gets :data:`~privaterec.models.basis.REFERENCE_NEWS` reference
    news, evenly spaced rows of ``features`` when given (else anonymous news until a
    checkpoint is loaded). Draws only the basis from the torch RNG, as before the option
    existed.
    """
    c = model_config
    reference = None
    if c.basis_attention == "centered":
        reference = ReferenceNews(REFERENCE_NEWS, title_len=c.title_len,
                                  abstract_len=c.abstract_len, length=c.history_len)
        if features is not None:
            reference.fill(features.select(ReferenceNews.rows(len(features), REFERENCE_NEWS)))
    return BasicVectors(c.basis_size, dim, attention=c.basis_attention, scale=c.basis_scale,
                        reference=reference)


def _check_vocabulary(model_config: ModelConfig, vocabs: TextVocabularies) -> None:
    if model_config.news_encoder == "id":
        return
    needed = vocabulary_kind(model_config)
    if vocabs.kind != needed:
        raise ConfigError(
            f"news_encoder={model_config.news_encoder!r} with "
            f"embeddings={model_config.embeddings!r} needs a {needed!r} vocabulary, but the "
            f"vocabulary is of kind {vocabs.kind!r}; rebuild it with "
            f"build_vocabularies(..., kind={needed!r})")
