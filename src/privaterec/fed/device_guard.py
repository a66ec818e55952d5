"""A federated device's own guarantee: it does not trust the server to respect it.

A real device (a Flower SuperNode started with ``user-id``) keeps, next to its privacy
ledger (:class:`~privaterec.ondevice.budget.DeviceBudget`, the serving SDK's persistent,
locked ledger with a finite cap), a pinned privacy policy and the rounds it has answered.
Before anything leaves the device, :meth:`DeviceGuard.admit` refuses a round

* whose privacy policy (:func:`privacy_policy`: the method and every setting of it — ε,
  clip, noise multiplier z, sampling rate q, secure aggregation, noise placement, ...)
  departs from the one pinned when the device enrolled (:meth:`DeviceGuard.enrol`);
* that is a plain (unmasked) message while the policy says SecAgg+;
* whose (run, round) it has already answered (a server asking the same round again would
  average fresh noise away);
* whose release would take the ledger's total ε above the device's budget.

Each refusal logs one line on the ``privaterec`` logger and raises :class:`RoundRefused`
before any release is computed; an admitted round is recorded (ledger, answered round)
before the release is computed, so a crash cannot make the device answer twice
(docs/privacy.md#devices-that-enforce-their-own-guarantee).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
from pathlib import Path
from typing import Any

from privaterec.errors import PrivacyBudgetExceeded, PrivateRecError
from privaterec.eval.federated import EvaluationPolicy
from privaterec.fed.methods.base import ClientMethod
from privaterec.fed.methods.dp_fedavg import CentralDP
from privaterec.ondevice.budget import (DEFAULT_DEVICE_BUDGET, DEFAULT_GAUSSIAN_DELTA,
                                        STATE_FILE, DeviceBudget, Events)
from privaterec.privacy.central_accounting import central_round_event
from privaterec.files import write_atomic
from privaterec.privacy.events import PrivacyEvent

GUARD_FILE = "federated_device.json"
"""File (in the device's state directory) holding the pinned policy and answered rounds."""

_FORMAT = "privaterec.federated_device"
_LOG = logging.getLogger("privaterec")


class RoundRefused(PrivateRecError):
    """A device refused a round: nothing was computed or sent for it."""


def privacy_policy(method: ClientMethod,
                   evaluation: EvaluationPolicy | None = None) -> dict[str, str]:
    """The method's name and every setting of it, flattened (nested methods as
    ``inner.<field>``), each value as its ``repr``, and the federated evaluation's policy
    (``evaluation.<field>``; absent without one): what a device pins at enrolment."""
    out: dict[str, str] = {"method": method.name}
    if evaluation is not None:
        for field in dataclasses.fields(evaluation):
            out[f"evaluation.{field.name}"] = repr(getattr(evaluation, field.name))

    def walk(prefix: str, obj: Any) -> None:
        for field in dataclasses.fields(obj):
            value = getattr(obj, field.name)
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                out[f"{prefix}{field.name}"] = type(value).__name__
                walk(f"{prefix}{field.name}.", value)
            else:
                out[f"{prefix}{field.name}"] = repr(value)

    walk("", method)
    return out


def secure_aggregation_required(method: ClientMethod) -> bool:
    """Whether the method's policy sends updates through SecAgg+ only."""
    return isinstance(method, CentralDP) and method.secure_aggregation != "none"


def device_events(method: ClientMethod, dimension: int) -> tuple[PrivacyEvent, ...]:
    """What one answered round costs the device, as its ledger records it.

    A local-DP method: its client's events (:meth:`ClientMethod.events`, the simulator's
    ledger entries for that client). Central DP: the server picks the sample, so
    amplification by sampling does not hold against it; each participation is charged as
    the Gaussian mechanism with the run's z on its own (q = 1, one user's data replaced).
    With distributed noise that is the guarantee against the server; with central noise the
    server sees the noiseless sum, and the charge bounds the device's participations (its
    guarantee against the released models).
    """
    if isinstance(method, CentralDP):
        note = (f"device-side charge of one dp-fedavg participation: Gaussian z = "
                f"{method.noise_multiplier:g} on the sum of updates clipped to L2 norm "
                f"{method.clip:g}, no amplification by sampling (the server picks the "
                f"sample), one user's data replaced (covers one click and one user); "
                + ("the noise is the clients' shares (distributed)" if method.distributed
                   else "the server adds the noise and sees the noiseless sum"))
        return (central_round_event(noise_multiplier=method.noise_multiplier,
                                    sampling_rate=1.0, clip=method.clip,
                                    delta=method.delta, note=note),)
    return method.events(dimension)


class DeviceGuard:
    """One device's pinned policy, answered rounds and privacy ledger.

    Parameters
    ----------
    state_dir:
        The device's state directory (persistent; the serving SDK keeps its ledger in the
        same ``device_state.json`` when given the same directory, so training and serving
        releases compose in one ledger).
    budget:
        Cap on the ledger's total ε (finite; default
        :data:`~privaterec.ondevice.budget.DEFAULT_DEVICE_BUDGET`).
    budget_delta:
        Target δ of the total (default: 0 for pure-DP events,
        :data:`~privaterec.ondevice.budget.DEFAULT_GAUSSIAN_DELTA` once a Gaussian event is
        charged).
    """

    def __init__(self, state_dir: str | Path, *, budget: float = DEFAULT_DEVICE_BUDGET,
                 budget_delta: float | None = None) -> None:
        if not (isinstance(budget, (int, float)) and 0 < budget < float("inf")):
            raise PrivateRecError(f"node option budget={budget!r}: a federated device's "
                                  f"budget must be a finite epsilon > 0")
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / GUARD_FILE
        self.cap = float(budget)
        self.budget_delta = budget_delta

    def _budget(self, events: Events) -> DeviceBudget:
        gaussian = any(e.mechanism == "gaussian" for e, _ in events)
        delta = (self.budget_delta if self.budget_delta is not None
                 else DEFAULT_GAUSSIAN_DELTA if gaussian else 0.0)
        return DeviceBudget(cap=self.cap, delta=delta, path=self.state_dir / STATE_FILE,
                            max_fresh_releases=None)

    def _lock(self) -> Any:
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        handle = open(self.path.with_name(self.path.name + ".lock"), "a+")  # noqa: SIM115
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        return handle

    def _read(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"format": _FORMAT, "policy": None, "answered": []}
        try:
            state = json.loads(self.path.read_text())
            if state.get("format") != _FORMAT:
                raise ValueError(f"'format' is not {_FORMAT!r}")
            return dict(state)
        except ValueError as exc:
            raise PrivateRecError(f"{self.path}: unreadable device state ({exc}); it holds "
                                  f"this device's pinned privacy policy and the rounds it "
                                  f"answered: restore it") from None

    def _write(self, state: dict[str, Any]) -> None:
        write_atomic(self.path, json.dumps(state, indent=1))

    def _refuse(self, what: str, reason: str) -> RoundRefused:
        _LOG.warning("privaterec device %s: refused %s: %s; nothing was released",
                     self.state_dir, what, reason)
        return RoundRefused(f"this device refused {what}: {reason}; nothing was released")

    def _check_policy(self, state: dict[str, Any], policy: dict[str, str], what: str) -> None:
        pinned = state.get("policy")
        if pinned is None:
            state["policy"] = policy
            return
        changed = sorted(k for k in set(pinned) | set(policy) if pinned.get(k) != policy.get(k))
        if changed:
            details = ", ".join(f"{k}: {pinned.get(k, '-')} -> {policy.get(k, '-')}"
                                for k in changed[:6])
            raise self._refuse(what, f"the server's privacy policy departs from the one this "
                                     f"device enrolled with ({details}); to accept a new "
                                     f"policy, the device's owner re-enrols it (removes "
                                     f"{self.path.name} from {self.state_dir})")

    @property
    def policy(self) -> dict[str, str] | None:
        """The pinned policy (``None`` before enrolment)."""
        with self._lock():
            policy = self._read().get("policy")
        return None if policy is None else dict(policy)

    def enrol(self, policy: dict[str, str]) -> None:
        """Pin ``policy`` on first contact; afterwards refuse any other (:class:`RoundRefused`)."""
        with self._lock():
            state = self._read()
            self._check_policy(state, policy, "to enrol")
            self._write(state)

    def answered(self) -> list[tuple[int, int]]:
        """The (run, round) pairs whose training round this device has answered."""
        with self._lock():
            return [(int(k[0]), int(k[1])) for k in self._read()["answered"] if len(k) == 2]

    def answered_evaluations(self) -> list[tuple[int, int]]:
        """The (run, round) pairs whose federated evaluation this device has answered."""
        with self._lock():
            return [(int(k[0]), int(k[1])) for k in self._read()["answered"] if len(k) == 3]

    def spent(self) -> float:
        """The ledger's total ε at the budget's δ (0 before any release)."""
        budget = self._budget([])
        events = budget.events()
        if not events:
            return 0.0
        return self._budget(events).spent()

    def admit(self, *, run: int, round_index: int, policy: dict[str, str],
              secure_message: bool, secure_required: bool, events: Events,
              kind: str = "train") -> None:
        """Record round ``round_index`` of ``run`` and charge ``events``, or refuse.

        ``kind``: ``"train"`` (the round's update) or ``"evaluate"`` (the federated
        evaluation after that round): each is answered at most once per (run, round).

        Raises
        ------
        RoundRefused
            The policy departs from the pinned one, a plain message arrives under a SecAgg+
            policy, the (run, round) was already answered, or the budget would be exceeded.
            Nothing is recorded.
        """
        if kind not in ("train", "evaluate"):
            raise PrivateRecError(f"invalid round kind {kind!r}")
        what = (f"round {round_index + 1} of run {run}" if kind == "train" else
                f"the federated evaluation after round {round_index + 1} of run {run}")
        key: list[Any] = [run, round_index] if kind == "train" else [run, round_index, kind]
        with self._lock():
            state = self._read()
            self._check_policy(state, policy, what)
            if secure_required and not secure_message:
                raise self._refuse(what, "the policy sends updates through SecAgg+ only, and "
                                         "the server asked for a plain (unmasked) update")
            if key in state["answered"]:
                raise self._refuse(what, "this device already answered that round (a server "
                                         "asking again could average the noise away)")
            try:
                self._budget([*self._budget([]).events(), *events]).spend(events)
            except PrivacyBudgetExceeded as exc:
                raise self._refuse(what, f"its privacy budget is spent ({exc})") from None
            state["answered"].append(key)
            self._write(state)


__all__ = ["GUARD_FILE", "DeviceGuard", "RoundRefused", "device_events", "privacy_policy",
           "secure_aggregation_required"]
