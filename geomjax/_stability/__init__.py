"""Stability of explicit methods on feedback fields, and the gains chosen from it: above
the steps (it builds them), below the driver (which uses it to explain a failed run)."""
