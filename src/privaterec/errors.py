"""Exceptions raised to users.

Every message names the file, line or parameter at fault and says what to do.
"""

from __future__ import annotations

from pathlib import Path


class PrivateRecError(Exception):
    """Base class of every error privaterec raises on purpose."""


class ConfigError(PrivateRecError, ValueError):
    """A configuration value is invalid; the message names the parameter."""


class DataFormatError(PrivateRecError, ValueError):
    """A data file is malformed.

    Parameters
    ----------
    path:
        The file at fault.
    line:
        1-based line number, or ``None`` when the problem is not tied to one line.
    message:
        What is wrong and, where possible, what to do.
    """

    def __init__(self, path: str | Path, line: int | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.message = message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


class MissingNewsError(DataFormatError):
    """Behaviors reference news ids that are absent from news.tsv."""

    def __init__(self, path: str | Path, missing_count: int, examples: list[str],
                 affected_impressions: int) -> None:
        self.missing_count = missing_count
        self.examples = examples
        self.affected_impressions = affected_impressions
        shown = ", ".join(examples)
        super().__init__(
            path, None,
            f"{missing_count} news ids referenced by behaviors are missing from news.tsv "
            f"(e.g. {shown}; {affected_impressions} impressions affected). Add them to "
            f"news.tsv or pass --drop-missing to drop the references (the counts of dropped "
            f"impressions and clicks are reported).",
        )


class CheckpointError(PrivateRecError):
    """A run directory or checkpoint is missing, incomplete or incompatible."""


class PrivacyBudgetExceeded(PrivateRecError):
    """A release would exceed the privacy budget cap of a user or device."""


class TrainingDivergedError(PrivateRecError):
    """Training produced non-finite parameters (e.g. a learning rate too large)."""
