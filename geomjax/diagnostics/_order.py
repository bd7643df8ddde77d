"""Measured order of convergence: a least-squares log–log slope without the round-off plateau."""

import math
from typing import NamedTuple

import numpy as np


class OrderFit(NamedTuple):
    """A fitted error model err ≈ C·hᵖ.

    - `order`: the slope p; `constant`: C.
    - `hs`, `errors`: the points used in the fit (largest h first).
    - `dropped`: how many points were removed (non-finite, below `floor`, above `ceiling`, or
      on the round-off plateau).
    """

    order: float
    constant: float
    hs: np.ndarray
    errors: np.ndarray
    dropped: int


def _slope(log_h, log_e):
    a = np.vstack([log_h, np.ones_like(log_h)]).T
    (slope, intercept), *_ = np.linalg.lstsq(a, log_e, rcond=None)
    return float(slope), float(intercept)


def convergence_order(
    hs,
    errors,
    *,
    floor: float = 1e-13,
    ceiling: float = math.inf,
    plateau_ratio: float = 0.5,
    excess: float = 2.0,
) -> OrderFit:
    """Measured order p from errors at several step sizes, by least squares on log e = p log h + log C.

    Round-off plateaus are removed first: points with an error at or below `floor` (or not
    finite) are dropped, and so are points above `ceiling` (outside the asymptotic range,
    e.g. near a stability limit); then, going from the smallest h upwards, a point is dropped while
    the slope of its last segment is below `plateau_ratio` times the slope fitted to the
    points above it (the error has stopped decreasing with h), or its error exceeds the
    extrapolation of that fit by more than a factor `excess` (round-off is already a
    visible part of it).

    **Arguments:**

    - `hs`: step sizes; `errors`: the matching global errors.
    - `floor`: errors at or below this are round-off, not truncation error.
    - `ceiling`: errors above this are pre-asymptotic and ignored (default: none).
    - `plateau_ratio`: how flat the last segment must be, relative to the fit, to be cut.
    - `excess`: how far above the fitted trend the smallest-h error may lie.

    **Returns:**

    An `OrderFit` (`.order` is the measured order). Raises `ValueError` if fewer than two
    usable points remain.

    Example:

    ```python
    hs = np.array([0.1, 0.05, 0.025])
    geomjax.diagnostics.convergence_order(hs, 3.0 * hs**2).order  # 2.0
    ```
    """
    hs = np.asarray(hs, dtype=float).ravel()
    errors = np.asarray(errors, dtype=float).ravel()
    if hs.shape != errors.shape:
        raise ValueError(f"hs and errors differ in length ({hs.size} vs {errors.size})")
    order = np.argsort(-hs)
    hs, errors = hs[order], errors[order]
    keep = np.isfinite(errors) & (errors > floor) & (errors <= ceiling) & (hs > 0)
    dropped = int(hs.size - keep.sum())
    hs, errors = hs[keep], errors[keep]
    if hs.size < 2:
        raise ValueError(
            "fewer than two usable (h, error) points: all errors are non-finite or below the "
            f"round-off floor {floor:g}; use larger step sizes"
        )
    log_h, log_e = np.log(hs), np.log(errors)
    while log_h.size >= 3:
        fit, intercept = _slope(log_h[:-1], log_e[:-1])
        last = (log_e[-2] - log_e[-1]) / (log_h[-2] - log_h[-1])
        above_trend = log_e[-1] - (fit * log_h[-1] + intercept) > np.log(excess)
        if fit > 0 and (last < plateau_ratio * fit or above_trend):
            log_h, log_e = log_h[:-1], log_e[:-1]
            dropped += 1
        else:
            break
    p, c = _slope(log_h, log_e)
    return OrderFit(p, float(np.exp(c)), np.exp(log_h), np.exp(log_e), dropped)
