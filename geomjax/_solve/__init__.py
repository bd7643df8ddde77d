"""Nonlinear and small linear solves used inside steps."""
