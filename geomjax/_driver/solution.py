"""The result of `geomjax.integrate`."""

import equinox as eqx
import jax
import numpy as np

from .._status import RESULTS, from_code, status_names
from .._validate import known


class IntegrationError(RuntimeError):
    """Raised by `geomjax.integrate` (outside `jit`) when a run fails.

    The partial result is kept in `.solution`: nothing computed is lost.
    """

    def __init__(self, message: str, solution: "Solution"):
        super().__init__(message)
        self.solution = solution


class Solution(eqx.Module):
    """A trajectory with its status.

    **Fields:**

    - `ts`: save times, shape `(n_saves + 1,)` (the initial time included).
    - `xs`: saved flat states, shape `(n_saves + 1, dim)`. Saves after a failure are NaN
      (the state that showed a constraint or invariant drift is kept).
    - `result`: a `geomjax.RESULTS` item, `RESULTS.successful` when the run succeeded.
    - `failed_step`: the first step whose result was bad (1-based; 0 for a bad start), −1
      if none.
    - `dt`, `t0`: step size and initial time.
    - `num_steps`: steps completed before the failure (all steps when the run succeeded).

    `status` is the integer code of `result` (0 on success), `ok` says whether the run
    succeeded and `message` says in words what happened and where.
    """

    ts: jax.Array
    xs: jax.Array
    result: RESULTS
    failed_step: jax.Array
    dt: jax.Array
    t0: jax.Array
    num_steps: jax.Array

    @property
    def status(self):
        """The integer code of `result`: 0 on success (an array under vmap)."""
        return self.result._value

    @property
    def status_name(self):
        """The name of `result` (`"successful"`, `"diverged"`, …), for labels and logs; a
        NumPy array of names under vmap. (`str(sol.result)` is equinox's repr of the item.)

        Example:

        ```python
        >>> import jax.numpy as jnp, geomjax
        >>> decay = geomjax.FunctionStep(lambda x, h: x * (1.0 - h))
        >>> geomjax.integrate(decay, jnp.array([1.0]), dt=0.5, steps=2).status_name
        'successful'
        >>> blow_up = geomjax.FunctionStep(lambda x, h: x / (h - 0.5))
        >>> geomjax.integrate(blow_up, jnp.array([1.0]), dt=0.5, steps=2, throw=False).status_name
        'nonfinite_first_step'

        ```
        """
        names = status_names()
        codes = np.asarray(self.status)
        if codes.ndim == 0:
            return names[int(codes)]
        return np.vectorize(names.__getitem__, otypes=[object])(codes).astype(str)

    @property
    def ok(self):
        """True where the run succeeded (an array under vmap)."""
        return self.result == RESULTS.successful

    @property
    def x_final(self):
        return self.xs[..., -1, :]

    @property
    def message(self) -> str:
        """A sentence saying whether the run succeeded and, if not, where and why it failed."""
        status = known(self.status)
        if status is None:
            raise TypeError(
                "Solution.message reads the run's status, which is traced here (inside jit or "
                "vmap): return the Solution from the transformed function and read the message "
                "outside, or use sol.result / sol.status, which work under jit and vmap"
            )
        return _message(self, status)


def raise_if_failed(sol: Solution) -> Solution:
    """`sol`, after raising `IntegrationError` if the run failed.

    Where the status is known now (a run outside `jit`, also under an eager `jax.grad`)
    the error is raised here, with `sol.message`; inside `jit` or `vmap` the run carries
    an `equinox.error_if` with the same sentence, raised when the compiled program runs.
    """
    status = known(sol.status)
    if status is not None:
        if np.any(status != 0):
            raise IntegrationError(_message(sol, status), sol)
        return sol
    return sol.result.error_if(sol, sol.result != RESULTS.successful)


def _message(sol: Solution, status: np.ndarray) -> str:
    if status.ndim:
        bad = np.flatnonzero(status != 0)
        if not bad.size:
            return f"all {status.size} runs succeeded"
        first = int(bad[0])
        sub = jax.tree_util.tree_map(lambda a: a[first] if getattr(a, "ndim", 0) else a, sol)
        return f"{bad.size} of {status.size} runs failed; run {first}: {_message(sub, status[first])}"
    if int(status) == 0:
        return "success"
    step = int(known(sol.failed_step))
    t = float(known(sol.t0) + step * known(sol.dt))
    where = "at the start (step 0)" if step == 0 else f"at step {step} (t = {t:.6g})"
    return f"integration failed {where}: {RESULTS[from_code(int(status))]}"
