"""The package's version, importable by every layer (the package root is the top layer)."""

__version__ = "0.1.0"
