"""Run directories: what ``privaterec train`` writes and ``privaterec evaluate`` reads.

A ranking run directory holds ``config.yaml`` (the :class:`~privaterec.config.RunConfig`),
``vocab.json`` (vocabularies built from the training news), ``checkpoint.pt`` (the model
``state_dict`` under key ``model`` plus optimizer/RNG state for resuming) and
``metrics.json``; federated runs also ``privacy.json`` (the privacy ledger and its
report). The popularity baseline writes ``popularity.json`` instead of a checkpoint.
``data.json`` is the fingerprint of the data the run trained on
(:mod:`privaterec.runs.fingerprint`): resuming, or evaluating on the run's own data, refuses
data that changed since. ``train.lock`` exists while a training holds the directory
(:mod:`privaterec.runs.lock`).

A Uni-FedRec run directory (:mod:`privaterec.runs.recall`) holds ``recall.yaml`` (its
:class:`~privaterec.runs.recall_setup.RecallRunConfig`) instead of ``config.yaml`` and
``vocab.json``, and the same ``checkpoint.pt``, ``privacy.json``, ``metrics.json`` and
``data.json``.
:class:`RunDirectory` names the files of both kinds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol, Self, overload

from privaterec.config import RunConfig
from privaterec.errors import CheckpointError
from privaterec.files import write_atomic
from privaterec.runs.fingerprint import differences, read_fingerprint, write_fingerprint
from privaterec.runs.lock import LOCK_FILE, run_lock

CONFIG_FILE = "config.yaml"
RECALL_CONFIG_FILE = "recall.yaml"


class SavedConfig(Protocol):
    """A run's configuration as its file stores it: a :class:`RunConfig` (``config.yaml``) or a
    Uni-FedRec run's ``RecallRunConfig`` (``recall.yaml``)."""

    def to_yaml(self, path: Path) -> None: ...

    @classmethod
    def from_yaml(cls, path: Path) -> Self: ...



def config_differences(old: Any, new: Any) -> list[tuple[str, Any, Any]]:
    """The dotted keys (``train.lr``, ``fed.rounds``, ``data``) whose values differ between
    two (nested) dataclass configurations, with the old and the new value."""

    def flat(value: Any, prefix: str = "") -> dict[str, Any]:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out: dict[str, Any] = {}
            for f in dataclasses.fields(value):
                out.update(flat(getattr(value, f.name), f"{prefix}{f.name}."))
            return out
        return {prefix.rstrip("."): value}

    a, b = flat(old), flat(new)
    return [(key, a.get(key), b.get(key)) for key in sorted(a.keys() | b.keys())
            if a.get(key) != b.get(key)]


class RunFile:
    """A file of a run directory: ``run.<attribute>`` is ``run.path / name``."""

    def __init__(self, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, run: None, owner: type) -> Self: ...

    @overload
    def __get__(self, run: RunDirectory, owner: type) -> Path: ...

    def __get__(self, run: RunDirectory | None, owner: type) -> Self | Path:
        return self if run is None else run.path / self.name


@dataclass(frozen=True)
class RunDirectory:
    """Paths of one run directory: a ranking run or a Uni-FedRec run (module docstring)."""

    path: Path

    config_path = RunFile(CONFIG_FILE)
    recall_config_path = RunFile(RECALL_CONFIG_FILE)
    vocab_path = RunFile("vocab.json")
    checkpoint_path = RunFile("checkpoint.pt")
    metrics_path = RunFile("metrics.json")
    privacy_path = RunFile("privacy.json")
    popularity_path = RunFile("popularity.json")
    data_fingerprint_path = RunFile("data.json")
    lock_path = RunFile(LOCK_FILE)

    @property
    def is_recall(self) -> bool:
        """Whether this is a Uni-FedRec run directory (it holds ``recall.yaml``)."""
        return self.recall_config_path.is_file()

    def config_file(self, config: SavedConfig) -> Path:
        """Where ``config`` is saved: ``config.yaml`` for a :class:`RunConfig`, ``recall.yaml``
        for a Uni-FedRec run's configuration."""
        return self.config_path if isinstance(config, RunConfig) else self.recall_config_path

    def check(self, config: SavedConfig) -> bool:
        """Whether ``config`` can train here, without creating anything.

        Returns ``True`` when the directory holds this run (training resumes), ``False``
        when it holds none.

        Raises
        ------
        CheckpointError
            If the directory holds a run with a different configuration; the message names
            every differing key with both values.
        """
        file = self.config_file(config)
        if not file.exists():
            return False
        previous = type(config).from_yaml(file)
        if previous != config:
            changes = "; ".join(f"{key}: {old!r} in the run, {new!r} now"
                                for key, old, new in config_differences(previous, config))
            what = ("a run with a different configuration" if isinstance(config, RunConfig)
                    else "a different Uni-FedRec run")
            raise CheckpointError(
                f"{file}: this run directory holds {what} ({changes}); choose another --out, "
                f"delete the directory, or train with the run's values")
        return True

    def check_data(self, data: str | Path, *,
                   remedy: str = "Restore the data, or train a new run with another --out"
                   ) -> None:
        """Refuse ``data`` unless it is the data this run trained on (``data.json``; a run
        without one, written by an earlier version, is not checked). ``remedy`` ends the
        message: what to do instead.

        Raises
        ------
        CheckpointError
            Naming every file that changed (:func:`privaterec.runs.fingerprint.differences`).
        """
        recorded = read_fingerprint(self.data_fingerprint_path)
        if recorded is None:
            return
        changes = differences(recorded, data)
        if changes:
            raise CheckpointError(
                f"{self.path}: {data} is not the data this run trained on, it changed since "
                f"({'; '.join(changes)}). {remedy}")

    def start(self, config: SavedConfig, *, data: str | Path | None = None) -> bool:
        """Create the directory for ``config``; return ``True`` when resuming a previous run.

        ``data``: the run's data set. A new run records its fingerprint (``data.json``); a
        resumed run must still have the same data (:meth:`check_data`).

        Raises
        ------
        CheckpointError
            If the directory holds a run with a different configuration (see :meth:`check`)
            or the data changed since it trained.
        """
        if self.check(config):
            if data is not None:
                self.check_data(data)
            return True
        self.path.mkdir(parents=True, exist_ok=True)
        if data is not None:
            write_fingerprint(self.data_fingerprint_path, data)
        config.to_yaml(self.config_file(config))
        return False

    def record_data(self, data: str | Path) -> None:
        """Record the fingerprint of ``data`` for a run that has none (written by an earlier
        version), once the run's own checks passed; from then on it is checked."""
        if read_fingerprint(self.data_fingerprint_path) is None:
            write_fingerprint(self.data_fingerprint_path, data)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold this directory's training lock (:func:`privaterec.runs.lock.run_lock`).

        Raises
        ------
        CheckpointError
            If another training holds it, naming its process id.
        """
        with run_lock(self.path):
            yield

    def config(self) -> RunConfig:
        if not self.config_path.exists():
            raise CheckpointError(f"{self.path}: not a run directory (no config.yaml); "
                                  f"create one with 'privaterec train --out {self.path}'")
        return RunConfig.from_yaml(self.config_path)

    def read_metrics(self) -> dict[str, Any]:
        if not self.metrics_path.exists():
            return {}
        return json.loads(self.metrics_path.read_text())

    def update_metrics(self, **entries: Any) -> dict[str, Any]:
        """Merge ``entries`` into ``metrics.json`` (written atomically)."""
        metrics = self.read_metrics()
        metrics.update(entries)
        write_atomic(self.metrics_path, json.dumps(metrics, indent=2, sort_keys=True))
        return metrics
