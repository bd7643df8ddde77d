"""`clear_caches`: every table geomjax keeps across calls, emptied in one place."""

import jax

from ._driver import common, hoisting, sweep
from ._system import implicit
from ._stability import analysis as stability


def clear_caches() -> None:
    """Empty every cache geomjax keeps between calls, and JAX's compiled programs.

    geomjax remembers, per field or step object, what it derived from it (start checks
    that passed, probes of a sweep's closures, whether a Lagrangian is quadratic, the
    `FailureDetail` of runs with nothing to report) and, per explicit method, its linear
    stability interval. None of these change a result: each is a deterministic function of
    its key. Clearing them (with `jax.clear_caches()`, which drops the compiled programs)
    returns a process to the state of a fresh import, e.g. to measure a first call again
    or to release memory in a long notebook session.

    Example:

    ```python
    >>> import jax.numpy as jnp
    >>> import geomjax
    >>> sol = geomjax.integrate(lambda x: -x, jnp.array([1.0]), dt=0.1, steps=10)
    >>> geomjax.clear_caches()
    >>> again = geomjax.integrate(lambda x: -x, jnp.array([1.0]), dt=0.1, steps=10)
    >>> bool(jnp.all(again.xs == sol.xs))
    True

    ```
    """
    common._MEMOS.clear()
    hoisting.clear()
    common._NO_DETAIL.clear()
    common._RUN_OPTIONS.clear()
    sweep._PROBED.clear()
    sweep._CLOSES_OVER_MEMBER.clear()
    implicit._QUADRATIC.clear()
    stability._step_matrices.cache_clear()
    stability.stability_interval.cache_clear()
    jax.clear_caches()
