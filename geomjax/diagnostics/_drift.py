"""Secular drift of an error series: the slope of its per-window maxima."""

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from jaxtyping import ArrayLike, Float


class DriftFit(NamedTuple):
    """The drift of an error series over windows.

    - `slope`: least-squares slope of the window maxima against the window centres
      (error per unit time).
    - `relative`: slope × (t_end − t_start) / max error: the fraction of the error that the
      trend accounts for over the run (≈ 0 for bounded oscillation, ≈ 1 for linear growth).
    - `centres`, `maxima`: the windows' centre times and max |error|.
    """

    slope: float
    relative: float
    centres: np.ndarray
    maxima: np.ndarray


def drift_slope(
    ts: Float[ArrayLike, " N"] | Sequence[float], errors: Float[ArrayLike, " N"] | Sequence[float], windows: int = 10
) -> DriftFit:
    """Detect secular drift: fit a line to the maxima of |error| over `windows` equal windows.

    A symplectic method's energy error oscillates with a bounded amplitude, so its window
    maxima are flat (relative drift near 0); a method with drift (explicit Euler, RK4 over
    long times) shows a trend (relative drift of order 1). Per-window maxima are used so
    that the oscillation inside a window does not mask or fake a trend.

    **Arguments:**

    - `ts`: times, shape `(n,)`; `errors`: the error values (e.g. |H − H₀|), shape `(n,)`.
    - `windows`: number of windows (each must hold at least one point).

    Non-finite `ts` or `errors` (e.g. the NaN saves after a failed run) are a ValueError
    that names the input and the indices: a NaN slope is never returned.

    **Returns:**

    A `DriftFit`.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum(holonomic=True)
    >>> sol = geomjax.integrate(geomjax.rattle(model.system), model.x0, dt=0.05, steps=2000)
    >>> err = geomjax.diagnostics.energy_errors(model.system, sol.xs)
    >>> abs(geomjax.diagnostics.drift_slope(sol.ts, err).relative) < 0.2  # no drift for RATTLE
    True

    ```
    """
    ts = np.asarray(ts, dtype=float).ravel()
    errors = np.abs(np.asarray(errors, dtype=float).ravel())
    if ts.shape != errors.shape:
        raise ValueError(f"ts and errors differ in length ({ts.size} vs {errors.size})")
    if windows < 2 or ts.size < windows:
        raise ValueError(f"need at least 2 windows and one point per window (got {windows} windows, {ts.size} points)")
    hints = {
        "ts": "the times must be finite",
        "errors": (
            "a failed run's saves after its failure are NaN: fit the saves before "
            "sol.failed_step (and check sol.ok), or pass drift_tol=None to integrate to measure "
            "a drift that the default monitoring stops"
        ),
    }
    for name, values in (("ts", ts), ("errors", errors)):
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            more = f" and {bad.size - 8} more" if bad.size > 8 else ""
            raise ValueError(
                f"{name} has non-finite entries (NaN or inf) at indices {bad[:8].tolist()}{more} of "
                f"{values.size}, so the fitted slope would be NaN; {hints[name]}"
            )
    parts = np.array_split(np.arange(ts.size), windows)
    centres = np.array([ts[idx].mean() for idx in parts])
    maxima = np.array([errors[idx].max() for idx in parts])
    a = np.vstack([centres, np.ones_like(centres)]).T
    (slope, _), *_ = np.linalg.lstsq(a, maxima, rcond=None)
    top = maxima.max()
    relative = float(slope * (ts[-1] - ts[0]) / top) if top > 0 else 0.0
    return DriftFit(float(slope), relative, centres, maxima)
