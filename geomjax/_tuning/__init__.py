"""Choosing feedback gains: stability bounds, rules of thumb, and gradient-based tuning."""
