"""What one client uploads in one round (:class:`ClientUpdate`), shared by every engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from privaterec.privacy.events import PrivacyEvent


@dataclass(frozen=True)
class ClientUpdate:
    """What one client uploads in one round, and what it spent.

    Attributes
    ----------
    payload: ``Tensor[D]``: the clipped/noised gradient (FedSGD) or pseudo-gradient θ − θ_u
        (FedAvg, E > 1). Strategies subtract it.
    num_examples: |B_u|, the number of samples used (kept on the device by private methods).
    privacy_events: the releases this upload spent (for the user's ledger; a function of the
        public run configuration only, the same for every client and round).
    metrics: e.g. ``{"loss": mean loss before the update}`` (kept on the device by private
        methods; the simulator logs it as a simulation-only diagnostic).
    weight: the update's weight in the server's mean (``num_examples`` for ``fedrec``, else 1;
        :meth:`~privaterec.fed.methods.base.ClientMethod.aggregation_weight`).
    sends_metadata: whether ``num_examples`` and the loss are part of what the client sends.
    reports: scalars the client sends next to its payload, each covered by an accounted
        release (adaptive clipping's centred clip indicator ``clip_indicator`` = b − ½, which
        the trusted aggregator noises with the sum; none for the other methods).
    """

    payload: torch.Tensor
    num_examples: int
    privacy_events: tuple[PrivacyEvent, ...]
    metrics: dict[str, Any] = field(default_factory=dict)
    weight: float = 1.0
    sends_metadata: bool = False
    reports: dict[str, float] = field(default_factory=dict)

    def sent(self) -> dict[str, Any]:
        """Everything the client transmits to the server (besides its public events).

        ``{"payload": Tensor[D]}``, plus ``num_examples`` and ``loss`` for a method that sends
        metadata (``fedrec``), plus the :attr:`reports` (adaptive clipping). The Flower
        ClientApp sends exactly this; the end-to-end privacy audit distinguishes neighbours
        on exactly this.
        """
        out: dict[str, Any] = {"payload": self.payload, **self.reports}
        if self.sends_metadata:
            out["num_examples"] = self.num_examples
            out["loss"] = float(self.metrics["loss"])
        return out


__all__ = ["ClientUpdate"]
