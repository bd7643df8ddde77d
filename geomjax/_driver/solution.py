"""The result of `geomjax.integrate`."""

import equinox as eqx
import jax
import numpy as np

from .._status import RESULTS, code_int, code_of, from_code, status_messages, status_names
from .._validate import known


class IntegrationError(eqx.EquinoxRuntimeError):
    """Raised by `geomjax.integrate` when a run fails and its status is known outside a
    compiled program (a run outside `jit`, also under an eager `jax.grad`).

    The partial result is kept in `.solution`: nothing computed is lost. Inside `jit`
    the same sentence is raised when the program runs, as equinox's
    `equinox.EquinoxRuntimeError` (through `equinox.filter_jit`; `jax.jit` wraps it in
    JAX's runtime error). `IntegrationError` is an `equinox.EquinoxRuntimeError`, so
    `except equinox.EquinoxRuntimeError` catches a failed run whether its values were
    traced or not.
    """

    def __init__(self, message: str, solution: "Solution"):
        super().__init__(message)
        self.solution = solution


class FailureDetail(eqx.Module):
    """What a failed run measured where it stopped: the numbers behind `Solution.message`.

    **Fields** (arrays: one entry per run under `vmap`):

    - `quantity`: for `RESULTS.invariant_drift` and `RESULTS.constraint_violation`, the
      index of the monitored quantity furthest beyond its tolerance at the failing save,
      into `labels[0] + labels[1]` (first integrals, then constraint residuals); −1 for
      every other outcome.
    - `value`: what was measured there: the relative drift |I − I(x0)| / (1 + |I(x0)|) of
      that first integral, the |residual| of that constraint, or, for
      `RESULTS.inaccurate`, the relative difference to the run at dt/2; NaN otherwise.
    - `bound`: what `value` was compared with: `drift_tol`, `drift_tol·(1 + max|x0|)` or
      `accuracy_tol`.
    - `labels`: names of the monitored quantities, `(first integrals, constraint
      residuals)` (`AbstractMonitored.quantity_labels`).
    - `note`: a sentence on the method where the run used the default one, else "".
    - `cause`: a sentence on the likely cause found after the run, else "" (a feedback
      field run with an explicit method past its stability bound: the gains, the bound
      and `geomjax.recommended_gains`). Found only where the status is known outside
      `jit`; added to `message` whatever the outcome.
    """

    quantity: jax.Array
    value: jax.Array
    bound: jax.Array
    labels: tuple = eqx.field(static=True, default=((), ()))
    note: str = eqx.field(static=True, default="")
    cause: str = eqx.field(static=True, default="")


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
    - `detail`: a `FailureDetail`, the numbers behind `message` (which quantity left its
      tolerance, by how much), or None.
    - `stats`: step statistics. Runs with a diffrax solver: `num_steps` (steps attempted),
      `num_accepted_steps`, `num_rejected_steps` and `max_steps`, as diffrax counts them;
      fixed-step runs: `num_steps`.

    `status` is the integer code of `result` (0 on success), `ok` says whether the run
    succeeded and `message` says in words what happened and where.

    What success certifies: a finite start on the constraint set, converged and finite
    steps, and the monitored constraints and first integrals within `drift_tol` at every
    save point (and, with `accuracy_tol`, agreement with the run at dt/2 at every save).
    Not accuracy: without `accuracy_tol`, a successful run can be far from the exact
    trajectory while it keeps every monitored quantity.
    """

    ts: jax.Array
    xs: jax.Array
    result: RESULTS
    failed_step: jax.Array
    dt: jax.Array
    t0: jax.Array
    num_steps: jax.Array
    stats: dict | None = None
    detail: FailureDetail | None = None  # the last field (`integrate._with_detail`)

    @property
    def status(self):
        """The integer code of `result`: 0 on success (an array under vmap)."""
        return code_of(self.result)

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
        """The last saved state, `(n,)` (or `(..., n)` under `vmap`); NaN if the run failed
        before it. `SweepResult.x_final` is the same for a sweep."""
        return self.xs[..., -1, :]

    @property
    def message(self) -> str:
        """A sentence saying whether the run succeeded and, if not, where and why it failed:
        for a drift, which quantity left its tolerance, its value at the failing save and
        the tolerance; under `vmap`, how many runs failed and the first one's sentence."""
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
    an `equinox.error_if`, raised when the compiled program runs. Its sentence is fixed
    when the program is traced: the cause (and the note on a default method), with the
    measured values left to `sol.message` of a run with `throw=False`.
    """
    status = known(sol.status)
    if status is not None:
        if (status != 0) if status.ndim == 0 else np.any(status != 0):
            raise IntegrationError(_message(sol, status), sol)
        return sol
    messages = [
        text + (_TRACED_DETAIL + _note(sol, code) if code in _DETAILED else _TRACED_RESIDUAL if code == _LINEAR else "")
        for code, text in enumerate(status_messages())
    ]
    return eqx.branched_error_if(sol, sol.result != RESULTS.successful, sol.status, messages)


# The outcomes whose message names a measured value (`FailureDetail`).
_DETAILED = {
    code_int(RESULTS.invariant_drift),
    code_int(RESULTS.constraint_violation),
    code_int(RESULTS.inaccurate),
}
_TRACED_DETAIL = (
    ". Which quantity, and its value at the failing save, are in sol.message: run with "
    "throw=False and read sol.message outside jit"
)

_LINEAR = code_int(RESULTS.linear_solve_failed)
_TRACED_RESIDUAL = (
    ". The residual each sparse solve reaches at the last good state is in sol.message: run "
    "with throw=False and read sol.message outside jit"
)


def _note(sol: Solution, code: int) -> str:
    note = "" if sol.detail is None else sol.detail.note
    return f". {note}" if note and code in _DETAILED else ""


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
    code = int(status)
    cause = "" if sol.detail is None or not sol.detail.cause else f". {sol.detail.cause}"
    return f"integration failed {where}: {RESULTS[from_code(code)]}{_measured(sol.detail, code)}{_note(sol, code)}{cause}"


def _measured(detail: FailureDetail | None, code: int) -> str:
    """The sentence on what was measured at the failing save ("" if nothing was)."""
    if detail is None or code not in _DETAILED:
        return ""
    index = int(known(detail.quantity))
    invariants, residuals = detail.labels
    if index < 0 or index >= len(invariants) + len(residuals):
        quantity = ""
    elif index < len(invariants):
        quantity = f"first integral {invariants[index]}"
    else:
        quantity = f"constraint residual {residuals[index - len(invariants)]}"
    return measured_sentence(code, quantity, float(known(detail.value)), float(known(detail.bound)))


def measured_sentence(code: int, quantity: str, value: float, bound: float) -> str:
    """". At that save …": what a failed run measured at its failing save, for
    `invariant_drift` and `constraint_violation` (`quantity`: which one, e.g. "first
    integral H"; "" if unknown) and `inaccurate`; "" for other outcomes."""
    if code == code_int(RESULTS.inaccurate):
        if not np.isfinite(value):
            return (
                ". The run at dt/2 had failed before this save, so the accuracy could not be "
                "checked there (integrate at dt/2 with throw=False for its status)"
            )
        return (
            f". At that save the state differed from the run at dt/2 by {value:.3g} relative "
            f"to 1 + max|x| (accuracy_tol = {bound:.3g})"
        )
    if code not in _DETAILED or not quantity:
        return ""
    if not np.isfinite(value):
        return f". At that save the {quantity} was not finite"
    if code == code_int(RESULTS.invariant_drift):
        return (
            f". At that save the {quantity} had drifted by {value:.6g} relative to its initial "
            f"value, |I − I(x0)| / (1 + |I(x0)|), against drift_tol = {bound:.3g}"
        )
    return f". At that save the {quantity} was {value:.6g}, against drift_tol·(1 + max|x0|) = {bound:.3g}"
