"""Per-client gradients of the ranking task with the round's news encoded once (issue 15).

The reference per-client gradients (:meth:`~privaterec.fed.objective.LocalObjective.
client_gradients`, ``vmap(grad)`` over chunks of clients) re-run every client's own news
through the news encoder Θ_N: about 52,000 (client, news) forward and backward passes for
1,000 clients on the 50,000-user synthetic data, where the non-private round
(:meth:`~privaterec.fed.objective.LocalObjective.round_gradient`) encodes the round's
≤ 3,000 distinct news once. :class:`SharedNewsGradients` computes the same matrix
G ``[m, D]`` of per-client gradients g_u = ∇θ L_u (L_u the client's mean InfoNCE loss) with
per-client gradients of each layer built from its recorded inputs and output gradients,
the client as the "sample" of Opacus' per-sample gradients (Yousefpour et al. 2021):

1. The round's distinct news are encoded once, without a graph. Each client's history and
   candidate vectors are gathered from them as leaves of the user side (Θ_U and the
   scores), which runs for all m clients at once. Its one backward pass gives the output
   gradient of every user-encoder layer (one row per client: its per-client weight
   gradient is Σ over positions of G ⊗ A, a batched matmul) and the gradient
   v_{u,n} = ∂L_u/∂r_n of every (client, news) pair (summed over the client's slots of the
   news; pairs with v = 0, such as masked history positions, are dropped: J_nᵀ0 = 0).
2. Θ_N's part of g_u is Σ_n J_nᵀ v_{u,n}. News are grouped by k_n, their number of
   clients; a group is encoded once (its layers' inputs and outputs recorded, each news
   ``r`` times for small groups) and each backward pass from its output with the
   v of one slot per news (the j-th client of every news of the group) gives every
   layer's output gradient for those pairs. Nothing is re-encoded per client.
3. Per-client weight gradients of Θ_N's layers are contracted from the recorded inputs and
   the pairs' output gradients, the rows of each client together (one batched matmul per
   chunk of clients).

The result equals the reference up to float rounding (sums in another order). It is exact
for the gradient of every parameter owned by a supported layer: ``nn.Linear``,
``nn.Conv1d`` (stride 1, dilation 1, one group), ``nn.Embedding`` (no ``padding_idx``, no
``max_norm``) and :class:`~privaterec.models.layers.WordEmbedding` with a frozen table
(e₀ trained). :func:`supports` says whether a model qualifies (NRMS, NAML, FedNewsRec and
LSTUR encoders do; PrivateRec's basic vectors and the PLM encoder do not, and keep the
reference path).

Cost: one encoding of the distinct news without a graph, one with a graph, one backward
pass of the user side, and one Θ_N backward pass per (client, news) pair, run as a backward
of a group's graph (no forward per pair); see BENCHMARKS.md "Per-client clipping at
1,000 clients per round" for the measured cost against the non-private round.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from privaterec.models.layers import WordEmbedding
from privaterec.models.recommender import Recommender

_LAYERS = (nn.Linear, nn.Conv1d, nn.Embedding, WordEmbedding)
# Rows of a group's graph: small groups are encoded several times so that each backward
# pass covers at least this many (client, news) pairs.
_GROUP_ROWS = 512
# Groups: news whose client counts k_n are within this ratio share a graph (a pass of the
# group runs for every news, so a larger ratio wastes passes, a smaller one adds graphs).
_GROUP_RATIO = 1.25
# Pair slots (clients × their largest pair count) of one block of the per-client
# contraction.
_BLOCK_SLOTS = 4096


def supports(model: Recommender) -> bool:
    """Whether :class:`SharedNewsGradients` computes the per-client gradients of ``model``:
    every trainable parameter is owned by a supported layer (module docstring), the model
    has no basic vectors and its news encoder has no precomputed table (PLM-NR)."""
    if model.basis is not None or getattr(model.news_encoder, "encode_table", None) is not None:
        return False
    owned = 0
    for part in (model.news_encoder, model.user_encoder):
        for module in part.modules():
            own = [p for p in module.parameters(recurse=False) if p.requires_grad]
            if not own:
                continue
            if not _supported_layer(module):
                return False
            owned += sum(p.numel() for p in own)
    return owned == sum(p.numel() for p in model.parameters() if p.requires_grad)


def _supported_layer(module: nn.Module) -> bool:
    if isinstance(module, WordEmbedding):
        return not module.weight.requires_grad
    if isinstance(module, nn.Conv1d):
        return (module.stride == (1,) and module.dilation == (1,) and module.groups == 1
                and module.padding_mode == "zeros")
    if isinstance(module, nn.Embedding):
        return module.padding_idx is None and module.max_norm is None
    return isinstance(module, nn.Linear)


@dataclass
class _Call:
    """One call of a recorded layer: its module, its input and its output."""

    module: nn.Module
    input: Tensor
    output: Tensor


class _Recorder:
    """Forward hooks on the trainable layers under ``roots``; :meth:`record` collects the
    calls made inside its block."""

    def __init__(self, roots: tuple[nn.Module, ...]) -> None:
        self.modules = [m for root in roots for m in root.modules()
                        if isinstance(m, _LAYERS)
                        and any(p.requires_grad for p in m.parameters(recurse=False))]
        self._calls: list[_Call] | None = None

    def _hook(self, module: nn.Module, args: tuple[Any, ...], output: Tensor) -> None:
        if self._calls is not None:
            self._calls.append(_Call(module, args[0], output))

    @contextmanager
    def record(self) -> Iterator[list[_Call]]:
        handles = [m.register_forward_hook(self._hook) for m in self.modules]
        self._calls = calls = []
        try:
            yield calls
        finally:
            self._calls = None
            for handle in handles:
                handle.remove()


class _Parts(nn.Module):
    """Θ_N on table rows, or Θ_U on news vectors; shares the recommender (and so the
    parameter names) of the loss module, so it runs at θ with ``functional_call``."""

    def __init__(self, recommender: Recommender) -> None:
        super().__init__()
        self.recommender = recommender

    def forward(self, part: str, *args: Tensor) -> Tensor:
        rec = self.recommender
        if part == "news":
            return rec.encode_rows(args[0], deduplicate=False)
        return rec.encode_user(args[0], args[1])


@dataclass
class _Layout:
    """Where the (client, news) pairs go in the per-client contraction (:meth:`_contract`).

    Clients are sorted by their number of pairs and cut into chunks; chunk k holds c_k
    clients × w_k slots (w_k its largest count), slots ``start:stop``. ``dest[p]`` is pair
    p's slot; ``news_of_slot`` the distinct news of every slot (``num_news``, a zero row,
    for padding slots).
    """

    dest: Tensor
    news_of_slot: Tensor
    chunks: list[tuple[int, int, Tensor, int]]

    @classmethod
    def of(cls, client: Tensor, news_index: Tensor, *, num_clients: int,
           num_news: int) -> "_Layout":
        counts = torch.bincount(client, minlength=num_clients)
        by_client = torch.argsort(client, stable=True)
        rank = torch.empty_like(client)
        rank[by_client] = torch.arange(client.numel()) - torch.repeat_interleave(
            torch.cumsum(counts, 0) - counts, counts)
        clients = torch.argsort(counts, stable=True)
        clients = clients[counts[clients] > 0]
        sizes = counts[clients].tolist()
        base = torch.zeros(num_clients, dtype=torch.long)  # slot of each client's first pair
        chunks: list[tuple[int, int, Tensor, int]] = []
        start = lo = 0
        while lo < len(sizes):
            hi = lo + 1
            while hi < len(sizes) and (hi + 1 - lo) * sizes[hi] <= _BLOCK_SLOTS:
                hi += 1
            chunk, width = clients[lo:hi], sizes[hi - 1]
            base[chunk] = start + torch.arange(hi - lo) * width
            chunks.append((start, start + (hi - lo) * width, chunk, width))
            start += (hi - lo) * width
            lo = hi
        dest = base[client] + rank
        news_of_slot = torch.full((start,), num_news, dtype=torch.long)
        news_of_slot[dest] = news_index
        return cls(dest, news_of_slot, chunks)

    @property
    def slots(self) -> int:
        return self.chunks[-1][1] if self.chunks else 0


@dataclass
class _Weights:
    """The weight contraction of one news-encoder call position: the inputs A of every
    distinct news ``[N + 1, T, a]`` (last row 0) and the pairs' output gradients G
    ``[slots, T, g]`` in :class:`_Layout` order."""

    inputs: Tensor
    grads: Tensor


ForwardFn = Callable[..., Tensor]
"""``call(theta, part, *args, module=parts)``: a module called at θ (ModuleTask._call)."""


class SharedNewsGradients:
    """Per-client gradients ``[m, D]`` of a :class:`~privaterec.fed.objective.ClientBatch`
    with the round's news encoded once (module docstring).

    Parameters
    ----------
    recommender:
        The model (it must satisfy :func:`supports`), held by the loss module under
        ``prefix``.
    names, numels:
        θ's layout (``ParamSpec.names`` and ``numels``).
    call:
        ``call(theta, *args, module=m)``: ``m(*args)`` at θ (``ModuleTask._call``).
    prefix:
        The attribute of the loss module holding the recommender.
    """

    def __init__(self, recommender: Recommender, names: tuple[str, ...],
                 numels: tuple[int, ...], call: ForwardFn, *,
                 prefix: str = "recommender") -> None:
        if not supports(recommender):
            raise ValueError("the model has a layer the shared-news gradients do not "
                             "support (see privaterec.fed.shared_news.supports)")
        self.parts = _Parts(recommender)
        self._call = call
        starts = [0]
        for n in numels:
            starts.append(starts[-1] + n)
        self._slices = {name: (s, n) for name, s, n in zip(names, starts, numels)}
        self.dimension = starts[-1]
        self._module_names = {id(m): f"{prefix}.{name}" if name else prefix
                              for name, m in recommender.named_modules()}
        self._news = _Recorder((recommender.news_encoder,))
        self._user = _Recorder((recommender.user_encoder,))
        self._dim = int(recommender.dim)

    # ------------------------------------------------------------------------ public
    def __call__(self, flat: Tensor, history: Tensor, history_mask: Tensor,
                 candidates: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
        """Per-client gradients ``[m, D]`` and losses ``[m]`` of a padded batch.

        history ``LongTensor[m, H]``, history_mask ``BoolTensor[m, H]``, candidates
        ``LongTensor[m, n, 1 + k]`` and weights ``Tensor[m, n]`` (1 real sample, 0 padding),
        as in :class:`~privaterec.fed.objective.ClientBatch`.
        """
        m, h = history.shape
        out = torch.zeros(m, self.dimension)
        theta = flat.detach().requires_grad_(True)
        real = weights > 0
        sample_client = torch.arange(m)[:, None].expand_as(real)[real]
        cand_rows = candidates[real]
        s, c = cand_rows.shape
        if s == 0:  # no client has a sample: every loss and gradient is 0
            return out, torch.zeros(m)
        rows = torch.cat([history.reshape(-1), cand_rows.reshape(-1)])
        news, inverse = torch.unique(rows, return_inverse=True)
        with torch.no_grad():
            vectors = self._call(theta.detach(), "news", news, module=self.parts)
        hist = vectors[inverse[: m * h]].reshape(m, h, -1).requires_grad_(True)
        cand = vectors[inverse[m * h:]].reshape(s, c, -1).requires_grad_(True)

        # 1. the user side of every client at once
        with self._user.record() as calls:
            users = self._call(theta, "user", hist, history_mask, module=self.parts)
        logits = torch.einsum("sd,scd->sc", users[sample_client], cand)
        per_sample = F.cross_entropy(logits, torch.zeros(s, dtype=torch.long),
                                     reduction="none")
        counts = real.sum(1)
        per_sample = per_sample / counts[sample_client].to(per_sample.dtype)
        losses = torch.zeros(m).index_add_(0, sample_client, per_sample.detach())
        targets = [hist, cand, *[call.output for call in calls]]
        grads = torch.autograd.grad(per_sample.sum(), targets, allow_unused=True)
        owners = torch.arange(m)
        for call, grad in zip(calls, grads[2:]):
            if grad is not None:
                self._add_direct(out, call, grad, owners)

        # 2.-3. the news encoder, per (client, news) pair
        pair_client = torch.cat([owners.repeat_interleave(h),
                                 sample_client.repeat_interleave(c)])
        pair_v = torch.cat([_zeros_if_none(grads[0], hist).reshape(-1, self._dim),
                            _zeros_if_none(grads[1], cand).reshape(-1, self._dim)])
        key = pair_client * news.numel() + inverse
        keys, merged = torch.unique(key, return_inverse=True)
        v = torch.zeros(keys.numel(), self._dim).index_add_(0, merged, pair_v)
        keep = (v != 0).any(1)
        keys, v = keys[keep], v[keep]
        self._news_pairs(out, theta, news, keys // news.numel(), keys % news.numel(), v)
        return out, losses

    # -------------------------------------------------------------------- the news
    def _news_pairs(self, out: Tensor, theta: Tensor, news: Tensor, client: Tensor,
                    news_index: Tensor, v: Tensor) -> None:
        """Add Σ_n J_nᵀ v_{u,n} over the pairs (``client``, ``news[news_index]``) to
        ``out``'s rows."""
        if v.shape[0] == 0:
            return
        # Slot of each pair among its news' pairs; news sorted by their count k_n.
        order = torch.argsort(news_index, stable=True)
        client, news_index, v = client[order], news_index[order], v[order]
        layout = _Layout.of(client, news_index, num_clients=out.shape[0],
                            num_news=news.numel())
        distinct, k = torch.unique_consecutive(news_index, return_counts=True)
        first = torch.cumsum(k, 0) - k
        slot = torch.arange(news_index.numel()) - torch.repeat_interleave(first, k)
        local = torch.full((news.numel(),), -1, dtype=torch.long)
        by_count = torch.argsort(k, descending=True, stable=True)
        weights: dict[int, _Weights] = {}
        modules: list[nn.Module] = []
        start = 0
        while start < by_count.numel():
            top = int(k[by_count[start]])
            stop = start + 1
            while stop < by_count.numel() and int(k[by_count[stop]]) * _GROUP_RATIO >= top:
                stop += 1
            members = distinct[by_count[start:stop]]  # indices into ``news``
            start = stop
            local[members] = torch.arange(members.numel())
            in_group = local[news_index] >= 0
            self._group(out, weights, modules, theta, news, members, top, layout,
                        client[in_group], local[news_index[in_group]], slot[in_group],
                        v[in_group], layout.dest[in_group])
            local[members] = -1
        for position, contraction in weights.items():
            self._contract(out, contraction, modules[position], layout)

    def _group(self, out: Tensor, weights: dict[int, _Weights], modules: list[nn.Module],
               theta: Tensor, news: Tensor, members: Tensor, passes_needed: int,
               layout: _Layout, client: Tensor, local: Tensor, slot: Tensor, v: Tensor,
               dest: Tensor) -> None:
        """One group of news (``news[members]``, g of them), whose pairs are (``client``,
        news ``local``) at ``slot`` < ``passes_needed`` with gradient ``v``, going to
        ``dest`` in the layout."""
        g = members.numel()
        copies = max(1, min(passes_needed, math.ceil(_GROUP_ROWS / g)))
        with self._news.record() as calls:
            encoded = self._call(theta, "news", news[members].repeat(copies),
                                 module=self.parts)
        if not modules:
            modules.extend(call.module for call in calls)
        if [call.module for call in calls] != modules:
            raise RuntimeError("the news encoder called its layers in another order")
        for position, call in enumerate(calls):
            factor = _input_factor(call.module, call.input[:g])
            if factor is None:
                continue
            if position not in weights:
                t = factor.shape[1]
                size = _grad_factor(call.module, call.output[:1]).shape[2]
                inputs = torch.zeros(news.numel() + 1, t, factor.shape[2])
                weights[position] = _Weights(inputs, torch.zeros(layout.slots, t, size))
            weights[position].inputs[members] = factor
        outputs = [call.output for call in calls]
        passes = math.ceil(passes_needed / copies)
        for p in range(passes):
            active = (slot >= p * copies) & (slot < (p + 1) * copies)
            row = (slot[active] - p * copies) * g + local[active]
            cotangent = torch.zeros(g * copies, self._dim).index_put_((row,), v[active])
            grads = torch.autograd.grad(encoded, outputs, cotangent,
                                        retain_graph=p < passes - 1, allow_unused=True)
            owner = client[active]
            for position, (call, grad) in enumerate(zip(calls, grads)):
                if grad is None:
                    continue
                grad = grad[row]
                if position in weights:
                    weights[position].grads[dest[active]] = _grad_factor(call.module, grad)
                self._add_small(out, call, grad, call.input[local[active]], owner)

    # ----------------------------------------------------------- per-layer gradients
    def _param(self, module: nn.Module, name: str) -> tuple[int, int] | None:
        """The slice (start, numel) of ``module.<name>`` in θ, or None if not trained."""
        return self._slices.get(f"{self._module_names[id(module)]}.{name}")

    def _add_rows(self, out: Tensor, module: nn.Module, name: str, per_row: Tensor,
                  owner: Tensor) -> None:
        """``out[owner[i], θ slice of module.name] += per_row[i]``."""
        where = self._param(module, name)
        if where is not None:
            start, n = where
            out[:, start: start + n].index_add_(0, owner, per_row.reshape(owner.numel(), n))

    def _add_direct(self, out: Tensor, call: _Call, grad: Tensor, owner: Tensor) -> None:
        """A user-side call: row i of the call's tensors belongs to client ``owner[i]``."""
        module = call.module
        factor = _input_factor(module, call.input)
        if factor is not None:
            g = _grad_factor(module, grad)
            weight = torch.bmm(g.transpose(1, 2), factor)
            self._add_rows(out, module, "weight", weight, owner)
        self._add_small(out, call, grad, call.input, owner)

    def _add_small(self, out: Tensor, call: _Call, grad: Tensor, inputs: Tensor,
                   owner: Tensor) -> None:
        """Biases, e₀ (WordEmbedding.pad) and embedding tables, per row of ``grad``."""
        module = call.module
        if isinstance(module, WordEmbedding):
            pad = (inputs == 0).unsqueeze(-1).to(grad.dtype)
            self._add_rows(out, module, "pad", (grad * pad).reshape(grad.shape[0], -1,
                                                                    grad.shape[-1]).sum(1),
                           owner)
        elif isinstance(module, nn.Embedding):
            where = self._param(module, "weight")
            if where is not None:
                start, n = where
                idx = inputs.reshape(inputs.shape[0], -1)
                num = module.num_embeddings
                flat_idx = (owner[:, None] * num + idx).reshape(-1)
                table = out[:, start: start + n].reshape(-1, module.embedding_dim)
                table.index_add_(0, flat_idx, grad.reshape(-1, module.embedding_dim))
                out[:, start: start + n] = table.reshape(out.shape[0], n)
        elif getattr(module, "bias", None) is not None:
            g = _grad_factor(module, grad)
            self._add_rows(out, module, "bias", g.sum(1), owner)

    def _contract(self, out: Tensor, contraction: _Weights, module: nn.Module,
                  layout: _Layout) -> None:
        """``out[u, weight] += Σ_{pairs of u} Gᵀ A`` for one news-encoder call position:
        one batched matmul per chunk of clients of the layout."""
        where = self._param(module, "weight")
        if where is None:
            return
        start, n = where
        inputs, grads = contraction.inputs, contraction.grads
        t, a, g = inputs.shape[1], inputs.shape[2], grads.shape[2]
        for lo, hi, clients, width in layout.chunks:
            c = clients.numel()
            block_g = grads[lo:hi].reshape(c, width * t, g)
            block_a = inputs[layout.news_of_slot[lo:hi]].reshape(c, width * t, a)
            weight = torch.bmm(block_g.transpose(1, 2), block_a)
            out[clients, start: start + n] += weight.reshape(c, n)


def _zeros_if_none(grad: Tensor | None, like: Tensor) -> Tensor:
    return torch.zeros_like(like) if grad is None else grad


def _input_factor_kind(module: nn.Module) -> bool:
    """Whether the layer's weight gradient is a contraction Σ Gᵀ A (Linear, Conv1d)."""
    return isinstance(module, (nn.Linear, nn.Conv1d)) and module.weight.requires_grad


def _input_factor(module: nn.Module, x: Tensor) -> Tensor | None:
    """A ``[R, T, a]`` of a Linear or Conv1d call (None for the other layers): the weight
    gradient of row r is G_rᵀ A_r with G from :func:`_grad_factor`."""
    if not _input_factor_kind(module):
        return None
    if isinstance(module, nn.Conv1d):
        (w,) = module.kernel_size
        if module.padding == "same":
            left, right = (w - 1) // 2, w - 1 - (w - 1) // 2
        else:
            (left,) = module.padding  # type: ignore[misc]
            right = left
        padded = F.pad(x, (left, right))  # [R, in, L + w - 1]
        windows = padded.unfold(2, w, 1)  # [R, in, L, w]
        return windows.permute(0, 2, 1, 3).reshape(x.shape[0], windows.shape[2], -1)
    return x.reshape(x.shape[0], -1, x.shape[-1])


def _grad_factor(module: nn.Module, grad: Tensor) -> Tensor:
    """G ``[R, T, out]`` of a Linear or Conv1d call's output gradient."""
    if isinstance(module, nn.Conv1d):
        return grad.transpose(1, 2)
    return grad.reshape(grad.shape[0], -1, grad.shape[-1])


__all__ = ["SharedNewsGradients", "supports"]
