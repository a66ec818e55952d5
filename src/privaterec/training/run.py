"""Run directories: what ``privaterec train`` writes and ``privaterec evaluate`` reads.

A run directory holds ``config.yaml`` (the :class:`~privaterec.config.RunConfig`),
``vocab.json`` (vocabularies built from the training news), ``checkpoint.pt`` (the model
``state_dict`` under key ``model`` plus optimizer/RNG state for resuming) and
``metrics.json``; federated runs also ``privacy.json`` (the privacy ledger and its
report). The popularity baseline writes ``popularity.json`` instead of a checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privaterec.config import RunConfig
from privaterec.errors import CheckpointError


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

    def start(self, config: RunConfig) -> bool:
        """Create the directory for ``config``; return ``True`` when resuming a previous run.

        Raises
        ------
        CheckpointError
            If the directory holds a run with a different configuration.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        if self.config_path.exists():
            previous = RunConfig.from_yaml(self.config_path)
            if previous != config:
                raise CheckpointError(
                    f"{self.config_path}: this run directory holds a run with a different "
                    f"configuration; choose another --out or delete the directory")
            return True
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
