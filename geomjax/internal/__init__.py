"""Internals of geomjax that are not concepts of its own (no stable API)."""
