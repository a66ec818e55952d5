"""Checkpoint files and deterministic execution: helpers every trainer and engine uses."""
