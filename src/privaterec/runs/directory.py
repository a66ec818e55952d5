"""Run directories: what ``privaterec train`` writes and ``privaterec evaluate`` reads.

A run directory holds ``config.yaml`` (the :class:`~privaterec.config.RunConfig`),
``vocab.json`` (vocabularies built from the training news), ``checkpoint.pt`` (the model
``state_dict`` under key ``model`` plus optimizer/RNG state for resuming) and
``metrics.json``; federated runs also ``privacy.json`` (the privacy ledger and its
report). The popularity baseline writes ``popularity.json`` instead of a checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privaterec.config import RunConfig
from privaterec.errors import CheckpointError


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


@dataclass(frozen=True)
class RunDirectory:
    """Paths of one run directory."""

    path: Path

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def vocab_path(self) -> Path:
        return self.path / "vocab.json"

    @property
    def checkpoint_path(self) -> Path:
        return self.path / "checkpoint.pt"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.json"

    @property
    def privacy_path(self) -> Path:
        return self.path / "privacy.json"

    @property
    def popularity_path(self) -> Path:
        return self.path / "popularity.json"

    def check(self, config: RunConfig) -> bool:
        """Whether ``config`` can train here, without creating anything.

        Returns ``True`` when the directory holds this run (training resumes), ``False``
        when it holds none.

        Raises
        ------
        CheckpointError
            If the directory holds a run with a different configuration; the message names
            every differing key with both values.
        """
        if not self.config_path.exists():
            return False
        previous = RunConfig.from_yaml(self.config_path)
        if previous != config:
            changes = "; ".join(f"{key}: {old!r} in the run, {new!r} now"
                                for key, old, new in config_differences(previous, config))
            raise CheckpointError(
                f"{self.config_path}: this run directory holds a run with a different "
                f"configuration ({changes}); choose another --out, delete the directory, "
                f"or train with the run's values")
        return True

    def start(self, config: RunConfig) -> bool:
        """Create the directory for ``config``; return ``True`` when resuming a previous run.

        Raises
        ------
        CheckpointError
            If the directory holds a run with a different configuration (see :meth:`check`).
        """
        if self.check(config):
            return True
        self.path.mkdir(parents=True, exist_ok=True)
        config.to_yaml(self.config_path)
        return False

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
        tmp = self.metrics_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(metrics, indent=2, sort_keys=True))
        tmp.replace(self.metrics_path)
        return metrics
