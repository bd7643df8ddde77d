"""Final states for many step sizes from one compilation (for convergence studies)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._driver.common import STATUS
from .._driver.loop import final_state as final_state_loop
from .._status import RESULTS, from_code
from .._step.base import AbstractStep, FunctionStep
from .._validate import as_state


@eqx.filter_jit
def _final_state(step: AbstractStep, x0, h, n):
    x, record = final_state_loop(step, x0, h, n)
    return x, from_code(record[STATUS])


def final_state(step, x0: Float[ArrayLike, " dim"], h: Float[ArrayLike, ""], n: int):
    """Apply a step `n` times with step size `h`: returns `(x_n, status)`.

    The number of steps is a traced argument, so every (h, n) reuses one compilation per
    step: convergence studies over many step sizes compile once. The loop is the one of
    `geomjax.integrate` (each step checked: its status and a finite state), without its
    start check and monitoring: `status` is the first failure met (`RESULTS.successful`
    if none), and after it `x_n` is the last good state. Differentiable in forward mode (`jax.jvp`,
    `jax.jacfwd`) in `x0`, `h` and the step's parameters; a loop with a traced length has no
    reverse mode, so for `jax.grad` use `geomjax.integrate` (a `lax.scan`).

    **Arguments:**

    - `step`: a geomjax step or a callable `step(x, h) ↦ x_next`.
    - `x0`: the initial flat state; `h`: the step size; `n`: the number of steps.

    **Returns:**

    `(x_n, status)`: the flat final state and a `geomjax.RESULTS` item.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum(holonomic=True)
    >>> x, status = geomjax.diagnostics.final_state(geomjax.rattle(model.system), model.x0, 0.01, 100)
    >>> bool(status == geomjax.RESULTS.successful)
    True

    ```
    """
    if not isinstance(step, AbstractStep):
        step = FunctionStep(step)
    x0 = as_state(x0, step.dim)
    return _final_state(step, x0, jnp.asarray(h, x0.dtype), jnp.asarray(n, jnp.int32))


def global_errors(
    step, x0: Float[ArrayLike, " dim"], t_final: float, num_steps, reference: Float[ArrayLike, " dim"]
) -> Float[np.ndarray, " N"]:
    """Global errors ‖x_N − x(T)‖_∞ at T = `t_final` for several step counts N (h = T/N).

    **Arguments:**

    - `step`: the one-step method (a geomjax step or `step(x, h)` callable).
    - `x0`: the initial flat state.
    - `t_final`: the final time T.
    - `num_steps`: a sequence of step counts N.
    - `reference`: the exact (or a much more accurate) state at T, a flat array.

    **Returns:**

    A NumPy array of errors, one per N; NaN where the run failed (non-success status or a
    non-finite state), so a failure never looks like a small error.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum(holonomic=True)
    >>> step = geomjax.rattle(model.system)
    >>> x_ref = geomjax.integrate(step, model.x0, dt=1e-4, steps=10_000, save_every=10_000).xs[-1]
    >>> ns = [25, 50, 100, 200]
    >>> errs = geomjax.diagnostics.global_errors(step, model.x0, 1.0, ns, x_ref)
    >>> round(geomjax.diagnostics.convergence_order([1.0 / n for n in ns], errs).order, 1)
    2.0

    ```
    """
    reference = np.asarray(reference)
    errors = []
    for n in num_steps:
        x, status = final_state(step, x0, t_final / n, int(n))
        x = np.asarray(x)
        bad = bool(status != RESULTS.successful) or not np.all(np.isfinite(x))
        errors.append(np.nan if bad else float(np.max(np.abs(x - reference))))
    return np.asarray(errors)


@eqx.filter_jit
def _jacobian(step, x, h):
    return jax.jacfwd(lambda y: step(y, h))(x)


def step_jacobian(step, x: Float[ArrayLike, " dim"], h: Float[ArrayLike, ""]) -> Float[Array, "dim dim"]:
    """DΦ_h(x), the Jacobian of the flat step map x ↦ step(x, h), by `jax.jacfwd` (compiled).

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum(holonomic=True)
    >>> geomjax.diagnostics.step_jacobian(geomjax.rattle(model.system), model.x0, 0.1).shape
    (6, 6)

    ```
    """
    if not isinstance(step, AbstractStep):
        step = FunctionStep(step)
    x = jnp.asarray(x)
    return _jacobian(step, x, jnp.asarray(h, x.dtype))
