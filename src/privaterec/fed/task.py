"""The seam between the federated engine and what it trains: a *task* (docs/architecture.md#seams).

A federated task is a public model viewed as a function of one flat parameter vector
θ ∈ R^D: the ranking model (:class:`privaterec.fed.objective.LocalObjective`) and
Uni-FedRec's recall model (:class:`privaterec.recall.task.RecallTask`) are both tasks. The
engine — :func:`privaterec.fed.simulator.train_federated`, the vectorized round, the
sequential reference round and the Flower engine — only sees this protocol; what a client
does with the task's gradients (clip, noise, local steps, DPA, ...) is its method's
(:mod:`privaterec.fed.methods`).

Both tasks build on :class:`ModuleTask`, θ as the trainable parameters of a loss module
(its layout, reading and loading θ, the loss called at a given θ). Per-client gradients of
every task come from one helper, :func:`per_client_gradients`: ``vmap(grad)`` over
memory-bounded chunks of clients, with a loop over the clients of a chunk for models that
cannot run under ``vmap``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol, Sequence, TypeVar, runtime_checkable

import torch
from torch import nn
from torch.func import functional_call, vmap

from privaterec.data.clients import ClientData
from privaterec.privacy.samplers import NoiseSource


@dataclass(frozen=True)
class ParamSpec:
    """Names and shapes of the trainable parameters, in a fixed order (θ's layout)."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, module: nn.Module) -> "ParamSpec":
        """The parameters of ``module`` with ``requires_grad``, in registration order."""
        items = [(n, tuple(p.shape)) for n, p in module.named_parameters() if p.requires_grad]
        return cls(tuple(n for n, _ in items), tuple(s for _, s in items))

    @property
    def numels(self) -> tuple[int, ...]:
        return tuple(int(torch.Size(s).numel()) for s in self.shapes)

    @property
    def dimension(self) -> int:
        """D, the number of trainable (uploaded) coordinates."""
        return sum(self.numels)

    def flatten(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """``{name: Tensor[shape]}`` → ``Tensor[D]`` (float32)."""
        return torch.cat([tensors[n].reshape(-1).float() for n in self.names])

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """``Tensor[D]`` → ``{name: view of shape}`` (differentiable, vmap-compatible)."""
        parts = torch.split(flat, list(self.numels))
        return {n: part.reshape(shape) for n, part, shape in zip(self.names, parts, self.shapes)}


InputsT = TypeVar("InputsT")
InputsT_co = TypeVar("InputsT_co", covariant=True)


@runtime_checkable
class FederatedTask(Protocol[InputsT]):
    """A model trained federatedly, as the engine sees it.

    Attributes
    ----------
    model: the ``nn.Module`` holding θ (its ``state_dict`` is checkpointed).
    spec: θ's layout (:class:`ParamSpec`).
    """

    @property
    def model(self) -> nn.Module:
        """The module holding θ."""
        ...

    @property
    def spec(self) -> ParamSpec:
        """θ's layout."""
        ...

    @property
    def dimension(self) -> int:
        """D, the number of uploaded coordinates."""
        ...

    def parameters(self) -> torch.Tensor:
        """The model's current θ ``Tensor[D]``."""
        ...

    def load(self, flat: torch.Tensor) -> None:
        """Copy θ ``Tensor[D]`` into the model."""
        ...

    def parameter_names(self) -> list[str]:
        """Names of θ's parameters, as the model's ``state_dict`` calls them."""
        ...

    def pretrained_mask(self) -> torch.Tensor:
        """``BoolTensor[D]``: coordinates fine-tuned from a pre-trained model."""
        ...

    def public_state(self) -> dict[str, torch.Tensor]:
        """Every public tensor of the task that is not part of θ (frozen parameters, fixed
        inputs): server and devices must agree on them (Flower's fingerprint)."""
        ...

    def client_inputs(self, data: ClientData, *, max_samples: int, negatives: int,
                      noise: NoiseSource) -> InputsT:
        """A client's inputs to its gradient after its own random draws (which samples,
        which negatives, ...), drawn from ``noise`` in a fixed order."""
        ...

    def gradient(self, flat: torch.Tensor, inputs: InputsT) -> tuple[torch.Tensor, float]:
        """One client's gradient ``Tensor[D]`` of its mean loss and the loss (the reference
        the batched :meth:`gradients` must equal up to float rounding)."""
        ...

    def gradients(self, flat: torch.Tensor, inputs: Sequence[InputsT], *,
                  chunk_clients: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-client gradients ``Tensor[m, D]`` and losses ``Tensor[m]``
        (:func:`per_client_gradients`)."""
        ...


class ModuleTask:
    """The parameter half of a :class:`FederatedTask` whose θ ∈ R^D is the trainable
    parameters of a loss module wrapping the task's model.

    The ranking task (:class:`~privaterec.fed.objective.LocalObjective`) and the recall task
    (:class:`~privaterec.recall.task.RecallTask`) build on it: θ's layout (:attr:`spec`),
    :meth:`parameters`, :meth:`load`, :meth:`parameter_names`, and :meth:`_call`, the loss
    module (or another module over the same parameters) called at a given θ with
    ``functional_call``, the module's other tensors held fixed.

    Parameters
    ----------
    loss:
        The ``nn.Module`` whose trainable parameters are θ, in registration order.
    prefix:
        The attribute of ``loss`` that holds the task's model (``loss.<prefix>``): θ's names
        without it are the model's ``state_dict`` names.
    """

    def __init__(self, loss: nn.Module, *, prefix: str) -> None:
        self._loss_module = loss
        self._prefix = prefix
        self.spec = ParamSpec.of(loss)
        trainable = set(self.spec.names)
        self._frozen = {n: t.detach() for n, t in [*loss.named_parameters(),
                                                   *loss.named_buffers()]
                        if n not in trainable}

    @property
    def dimension(self) -> int:
        """D, the number of trainable (uploaded) coordinates."""
        return self.spec.dimension

    def parameters(self) -> torch.Tensor:
        """The model's current θ, ``Tensor[D]``."""
        params = dict(self._loss_module.named_parameters())
        return self.spec.flatten({n: params[n].detach() for n in self.spec.names})

    def load(self, flat: torch.Tensor) -> None:
        """Copy θ ``Tensor[D]`` into the model (e.g. before evaluation or saving)."""
        params = dict(self._loss_module.named_parameters())
        with torch.no_grad():
            for name, value in self.spec.unflatten(flat).items():
                params[name].copy_(value)

    def parameter_names(self) -> list[str]:
        """Names of θ's parameters, as the model's ``state_dict`` calls them."""
        return [n.removeprefix(self._prefix + ".") for n in self.spec.names]

    def _model_public_state(self) -> dict[str, torch.Tensor]:
        """The model's tensors outside θ (frozen parameters and buffers)."""
        trainable = set(self.parameter_names())
        state = self._loss_module.get_submodule(self._prefix).state_dict()
        return {n: t for n, t in state.items() if n not in trainable}

    def _call(self, flat: torch.Tensor, *args: Any,
              module: nn.Module | None = None) -> torch.Tensor:
        """``module(*args)`` (default: the loss module) with θ = ``flat`` (differentiable,
        vmap-compatible) and the loss module's other tensors."""
        return functional_call(self._loss_module if module is None else module,
                               {**self._frozen, **self.spec.unflatten(flat)}, args)


Chunk = tuple[torch.Tensor, tuple[Any, ...]]
"""(indices of the chunk's clients ``LongTensor[c]``, the chunk's batched arguments)."""


def per_client_gradients(fn: Callable[..., tuple[torch.Tensor, torch.Tensor]],
                         flat: torch.Tensor, chunks: Iterable[Chunk], *, num_clients: int,
                         shape: Sequence[int], in_dims: Sequence[int | None],
                         vectorize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-client ``fn(θ, *client args)`` over chunks of clients: ``vmap`` or a loop.

    The one chunked functional ``vmap(grad)`` of every task
    (docs/architecture.md#performance-design): memory is bounded by one chunk's activations.

    Parameters
    ----------
    fn:
        ``fn(flat, *args) -> (value Tensor[*shape], loss Tensor[])`` for ONE client, e.g.
        ``grad_and_value(loss)``.
    flat:
        θ ``Tensor[D]``, shared by every client.
    chunks:
        (indices ``LongTensor[c]`` of the chunk's clients among ``num_clients``, the chunk's
        arguments); an argument with ``in_dims`` 0 has the chunk's clients on dim 0, one with
        ``None`` is shared (e.g. ``None`` noise, a flag).
    num_clients:
        m, the number of clients over all chunks.
    shape:
        Shape of one client's value (``(D,)``, or ``(2, D)`` for a split gradient).
    in_dims:
        ``vmap``'s in_dims of the arguments after θ.
    vectorize:
        ``False``: call ``fn`` once per client (encoders that cannot run under ``vmap``).

    Returns
    -------
    (``Tensor[m, *shape]`` values, ``Tensor[m]`` losses)
    """
    values = torch.empty(num_clients, *shape, device=flat.device)
    losses = torch.empty(num_clients, device=flat.device)
    batched = vmap(fn, in_dims=(None, *in_dims))
    for index, args in chunks:
        if vectorize:
            value, loss = batched(flat, *args)
        else:
            size = int(index.shape[0])
            outs = [fn(flat, *(a if d is None else a[i] for a, d in zip(args, in_dims)))
                    for i in range(size)]
            value = torch.stack([o[0] for o in outs])
            loss = torch.stack([o[1] for o in outs])
        index = index.to(flat.device)
        values[index], losses[index] = value, loss
    return values, losses


__all__ = ["Chunk", "FederatedTask", "ModuleTask", "ParamSpec", "per_client_gradients"]
