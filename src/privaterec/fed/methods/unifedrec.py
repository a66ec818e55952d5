"""Uni-FedRec's LDP upload (Uni-FedRec Eq. 8): the client method of the recall model's task,
:class:`~privaterec.recall.task.RecallTask` (whose module docstring derives its ε)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, Sequence

from privaterec.config import FedConfig
from privaterec.fed.methods.base import ClientMethod
from privaterec.fed.strategies import ServerDefaults
from privaterec.method_settings import GradientClipping, UniFedRecSettings
from privaterec.privacy.calibrate import Calibration, clipped_release, no_noise
from privaterec.validators import fail, is_integer


class _RecallOptions(Protocol):
    """What the method reads of the recall task's settings (``RecallTrainConfig``)."""

    @property
    def negatives(self) -> int: ...


@dataclass(frozen=True, kw_only=True)
class UniFedRecLDP(ClientMethod[Any]):
    """Uni-FedRec's client: clip its gradient (Eq. 8's f_θ: ``clipping`` to θ = ``clip``)
    and add Laplace(λ_g = ``noise_scale``) per coordinate (module docstring)."""

    name: ClassVar[str] = UniFedRecSettings.method
    settings_type: ClassVar[type[UniFedRecSettings]] = UniFedRecSettings
    # Uni-FedRec §4.1: plain SGD at ω = 0.05, r = 2%.
    server_defaults: ClassVar[ServerDefaults] = ServerDefaults(strategy="sgd",
                                                               server_lr=0.05)

    clipping: GradientClipping = "l1"
    clip: float = 0.1
    noise_scale: float = 0.01

    @classmethod
    def of(cls, fed: FedConfig, train: _RecallOptions) -> "UniFedRecLDP":
        """The method of a recall FedConfig (its ``settings``) and recall's own settings."""
        settings = fed.settings_as(UniFedRecSettings)
        return cls(negatives=train.negatives, max_samples=fed.max_client_samples,
                   clipping=settings.clipping, clip=settings.clip,
                   noise_scale=settings.noise_scale)

    @property
    def sends_metadata(self) -> bool:
        """An upload that is not private also sends its count and loss (Eq. 9's weights); a
        private one's stay on the device and the server weighs clients equally."""
        return not self.event(1).is_private

    def _calibrate(self, dimension: int) -> Calibration:
        """ONE client's upload of a D-dim gradient, calibrated (Eq. 8, module docstring):
        Laplace at the given λ_g on the clipped gradient (Δ₁ = 2θ for an L1 clip, 2θD
        element-wise)."""
        if not (is_integer(dimension) and not isinstance(dimension, bool) and dimension >= 1):
            fail("dimension", dimension, "an integer >= 1", kind="recall training parameter")
        lam = float(self.noise_scale)
        if self.clipping == "none":
            return no_noise(dimension=dimension, note="Uni-FedRec recall: raw gradient, no "
                                                      "clipping or noise (no guarantee)")
        if self.clipping == "l1":
            note = (f"Uni-FedRec Eq. 8: recall gradient L1-clipped to theta={self.clip}, "
                    f"Laplace(lambda_g={lam}) per coordinate; L1 sensitivity 2*theta, so "
                    f"epsilon = 2*theta/lambda_g per round for the whole update")
        else:
            note = (f"Uni-FedRec Eq. 8 read as FedNewsRec's element-wise clip to [-theta, "
                    f"theta] (theta={self.clip}) + Laplace(lambda_g={lam}): epsilon = "
                    f"2*theta*D/lambda_g for the whole update (2*theta/lambda_g per coordinate)")
        return clipped_release(clipping=self.clipping, clip=self.clip, dimension=dimension,
                               noise_scale=lam, note=note)

    def describe(self, *, dimension: int, parameters: Sequence[str], clients_per_round: int,
                 client_fraction: float) -> dict[str, Any]:
        event = self.event(1)
        return {"method": self.name, "mechanism": "laplace" if self.noise_scale else "none",
                "clipping": self.clipping, "clip": self.clip, "noise_scale": self.noise_scale,
                "epsilon_per_round": event.epsilon if self.clipping == "l1" else None,
                "note": event.note}


__all__ = ["UniFedRecLDP"]
