"""The result of `geomjax.integrate`."""

import equinox as eqx
import jax
import numpy as np

from .._status import RESULTS, status_names


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
        status = np.asarray(self.status)
        if status.ndim:
            bad = np.flatnonzero(status != 0)
            if not bad.size:
                return f"all {status.size} runs succeeded"
            first = int(bad[0])
            sub = jax.tree_util.tree_map(lambda a: a[first] if getattr(a, "ndim", 0) else a, self)
            return f"{bad.size} of {status.size} runs failed; run {first}: {sub.message}"
        if int(status) == 0:
            return "success"
        step = int(np.asarray(self.failed_step))
        t = float(np.asarray(self.t0) + step * np.asarray(self.dt))
        where = "at the start (step 0)" if step == 0 else f"at step {step} (t = {t:.6g})"
        return f"integration failed {where}: {RESULTS[self.result]}"
