"""Measured order of convergence: a least-squares log–log slope without the round-off plateau."""

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from jaxtyping import ArrayLike, Float


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
    hs: Float[ArrayLike, " N"] | Sequence[float],
    errors: Float[ArrayLike, " N"] | Sequence[float],
    *,
    floor: float = 1e-13,
    ceiling: float = math.inf,
    plateau_ratio: float = 0.5,
    window: int = 3,
    steadiness: float = 0.85,
) -> OrderFit:
    """Measured order p from errors at several step sizes: the least-squares slope of
    log e = p log h + log C where the error is asymptotic.

    Points with an error at or below `floor` (or not finite) are dropped, and so are
    points above `ceiling` (outside the asymptotic range, e.g. near a stability limit).
    The asymptotic regime is where the local slope is steady: going from the smallest h
    upwards, the first run of `window` consecutive points whose segment slopes are
    positive and agree (smallest/largest ≥ `steadiness`) is fitted. So neither a
    round-off plateau at small h (slopes falling towards 0) nor a pre-asymptotic regime at
    large h (slopes above the order) moves the estimate. If no run is steady, the fit uses
    every point left after cutting the round-off plateau: going from the smallest h
    upwards, a point is dropped while its segment slope is below `plateau_ratio` times the
    slope of the segment above it.

    **Arguments:**

    - `hs`: step sizes; `errors`: the matching global errors.
    - `floor`: errors at or below this are round-off, not truncation error.
    - `ceiling`: errors above this are pre-asymptotic and ignored (default: none).
    - `plateau_ratio`: how much flatter than the segment above it the last segment must
      be to count as round-off.
    - `window`: how many consecutive points make a steady run (at least 2).
    - `steadiness`: how closely the segment slopes of a run must agree.

    **Returns:**

    An `OrderFit` (`.order` is the measured order). Raises `ValueError` if fewer than two
    usable points remain.

    Example:

    ```python
    >>> import numpy as np, geomjax
    >>> hs = np.array([0.1, 0.05, 0.025])
    >>> round(geomjax.diagnostics.convergence_order(hs, 3.0 * hs**2).order, 6)
    2.0

    ```
    """
    if int(window) < 2:
        raise ValueError(f"window must be at least 2, got {window!r}")
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
    slopes = np.diff(log_e) / np.diff(log_h)
    window = min(int(window), log_h.size)
    for end in range(log_h.size, window - 1, -1):
        run = slopes[end - window : end - 1]
        if np.all(run > 0) and run.min() >= steadiness * run.max():
            used = slice(end - window, end)
            p, c = _slope(log_h[used], log_e[used])
            return OrderFit(p, float(np.exp(c)), np.exp(log_h[used]), np.exp(log_e[used]), dropped + log_h.size - window)
    while log_h.size >= 3:
        above = (log_e[-3] - log_e[-2]) / (log_h[-3] - log_h[-2])
        last = (log_e[-2] - log_e[-1]) / (log_h[-2] - log_h[-1])
        if above > 0 and last < plateau_ratio * above:
            log_h, log_e = log_h[:-1], log_e[:-1]
            dropped += 1
        else:
            break
    p, c = _slope(log_h, log_e)
    return OrderFit(p, float(np.exp(c)), np.exp(log_h), np.exp(log_e), dropped)
