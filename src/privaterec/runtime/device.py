"""Where a run's tensors live: ``--device auto|cpu|cuda[:N]`` (docs/gpu.md).

The model, θ, the simulator's round (per-client gradients, clipping, the noise added to
the updates), the server's strategy and the evaluation run on one device. Every seeded
random draw of a simulation stays on the CPU (the clients' and the server's
``torch.Generator``\\ s, :mod:`privaterec.fed.rng`) and its result is moved to the device, so
a run draws the same numbers on every device; on the CPU a tensor already there is never
copied, so CPU runs stay bitwise reproducible. Deployed releases (a device's
:class:`~privaterec.privacy.samplers.SecureNoise`, the Flower engine, the device SDK) run on
the CPU.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

import torch
from torch import nn

from privaterec.errors import ConfigError

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"
"""What ``--device`` accepts (:func:`resolve_device`)."""

_SPEC = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """The ``torch.device`` a run uses.

    Parameters
    ----------
    spec:
        ``"auto"`` (or ``None``): the first CUDA device when PyTorch sees one, else the CPU;
        ``"cpu"``; ``"cuda"`` / ``"cuda:N"``: that CUDA device; a ``torch.device`` is checked
        the same way.

    Raises
    ------
    ConfigError
        If ``spec`` is none of these, or names a CUDA device this PyTorch build or machine
        does not have (the message says which devices exist and how to get a CUDA build).
    """
    text = "auto" if spec is None else str(spec)
    if not _SPEC.match(text):
        raise ConfigError(f"invalid --device {text!r}: expected {DEVICE_CHOICES}")
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(text)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = ("a CPU-only build" if torch.version.cuda is None
                     else f"built for CUDA {torch.version.cuda}, but no GPU is visible")
            raise ConfigError(f"--device {text}: this PyTorch ({torch.__version__}) is {build}; "
                              f"pass --device cpu, or install a CUDA build of PyTorch "
                              f"(docs/gpu.md)")
        index = 0 if device.index is None else device.index
        count = torch.cuda.device_count()
        if index >= count:
            raise ConfigError(f"--device {text}: only {count} CUDA device(s) are visible "
                              f"(cuda:0 to cuda:{count - 1}); pass one of them")
        device = torch.device("cuda", index)
        prepare_cuda()
    return device


def prepare_cuda() -> None:
    """Settings a CUDA run needs before its first kernel: deterministic cuBLAS workspaces
    (``CUBLAS_WORKSPACE_CONFIG``, which ``torch.use_deterministic_algorithms`` requires on
    CUDA; an existing value is kept) and TF32 matmuls (fp32 storage, a 10-bit mantissa in
    the tensor cores' products; docs/gpu.md "Precision")."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


_CURRENT: ContextVar[torch.device] = ContextVar("privaterec_device",
                                                default=torch.device("cpu"))


def current_device() -> torch.device:
    """The device of the innermost :func:`using_device` block (the CPU outside any)."""
    return _CURRENT.get()


@contextmanager
def using_device(spec: str | torch.device | None) -> Iterator[torch.device]:
    """Run the block's trainings and evaluations on ``spec`` (:func:`resolve_device`): the
    default of every ``device=None`` of :mod:`privaterec.runs` (the experiments and the
    demo train through them)."""
    token = _CURRENT.set(resolve_device(spec))
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)


def set_current_device(spec: str | torch.device | None) -> torch.device:
    """Make ``spec`` (:func:`resolve_device`) this context's device until changed (a worker
    process of the demo, which starts on the CPU, takes its parent's this way)."""
    _CURRENT.set(resolve_device(spec))
    return _CURRENT.get()


def run_device(spec: str | torch.device | None) -> torch.device:
    """``spec`` resolved (:func:`resolve_device`), or :func:`current_device` for ``None``."""
    return current_device() if spec is None else resolve_device(spec)


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s first parameter or buffer (the CPU for an empty module)."""
    for parameter in module.parameters():
        return parameter.device
    for buffer in module.buffers():
        return buffer.device
    return torch.device("cpu")


__all__ = ["DEVICE_CHOICES", "current_device", "module_device", "prepare_cuda",
           "resolve_device", "run_device", "set_current_device", "using_device"]
