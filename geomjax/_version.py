"""The package version: a leaf module, so that any layer may read it without importing
`geomjax` (the one place it is written; `pyproject.toml` reads it from here)."""

__version__ = "0.2.0"
