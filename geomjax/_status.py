"""Why a run stopped: one enumeration, shared by steps, solves and the driver.

`RESULTS` is an `equinox.Enumeration`, as optimistix's and lineax's result enumerations
are. It does not extend optimistix's: a solve through `optimistix.root_find` (the
`Newton(backend="optimistix")` option) reports only whether it converged, which becomes
`newton_failed` here, and importing optimistix (with lineax) would add a fifth of
geomjax's import time to every program. Every member's message names the cause and what
to try; `Solution.message` adds the step and time.
"""

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from ._validate import known


class RESULTS(eqx.Enumeration):  # pyright: ignore
    """How a step or a run ended (`geomjax.RESULTS.successful` when it did not fail).

    Members: `successful`, `nonfinite_start`, `off_constraint_set`,
    `nonfinite_first_step`, `diverged`, `newton_failed`, `constraint_violation`,
    `invariant_drift`, `solver_failed`, `step_size_collapsed`, `invalid_step_size`,
    `inaccurate`, `linear_solve_failed`. A status is an `equinox.EnumerationItem`; compare it with `==` (it works
    under `jit` and `vmap`), and read its sentence with `RESULTS[item]`.

    What `successful` certifies, exactly: the start was finite and on the constraint set
    (`start_tol`); every step's own solve converged and every state was finite; at every
    save point the *monitored* quantities (the constraint residuals and first integrals the
    field or step declares) were within `drift_tol`. It does not certify accuracy: a run can
    keep every monitored quantity and still be far from the exact trajectory (a phase
    error: implicit midpoint at a large step keeps the energy of a pendulum to 1e-13 and is
    off by more than 1 in its state). `integrate(..., accuracy_tol=...)` adds an estimate
    of the error, reported as `inaccurate`.

    Example:

    ```python
    >>> import geomjax
    >>> status = geomjax.RESULTS.newton_failed
    >>> bool(status == geomjax.RESULTS.successful)
    False
    >>> geomjax.RESULTS[status].startswith("a Newton solve")
    True

    ```
    """

    successful = ""
    nonfinite_start = (
        "the initial state has non-finite entries (NaN or inf): nothing was integrated"
    )
    off_constraint_set = (
        "the initial state is off the constraint set (a constraint residual is above "
        "start_tol): the run would follow a different system. Move x0 onto the constraint "
        "set first (geomjax.project_holonomic for holonomic constraints, "
        "geomjax.project_nonholonomic for nonholonomic ones), or pass start_tol=None to "
        "integrate deliberately from off the set"
    )
    nonfinite_first_step = (
        "the first step from a finite initial state gave a non-finite state: the system's "
        "functions, gradients or parameters are not finite at x0 (a NaN parameter, a "
        "division by zero, a singular constraint matrix)"
    )
    diverged = (
        "the state became non-finite after finite steps: the step is past the method's "
        "stability limit. For a feedback field with an explicit method the step must satisfy "
        "h·λ_max(L∇²V) < β, β = geomjax.stability_interval(method) (2 for Euler): lower dt "
        "or the gains (geomjax.check_gains, geomjax.recommended_gains). With constraints it "
        "can also be a constraint matrix that became singular along the run (or, for a chain's "
        "tridiagonal one, solved without row exchanges, one whose elimination needs them)"
    )
    newton_failed = (
        "a Newton solve inside the step did not converge: the implicit equations have no "
        "solution near the predictor at this step size (lower dt), or the Newton settings "
        "are too strict (raise max_steps)"
    )
    constraint_violation = (
        "the constraint residuals left their tolerance (drift_tol): the trajectory is no "
        "longer on the constraint set, so it follows a different system. Lower dt, use a "
        "method that keeps the constraints (feedback, RATTLE, projection), or, for a "
        "feedback field with an explicit method, keep h·λ_max(L∇²V) < β "
        "(geomjax.stability_interval; 2 for Euler)"
    )
    invariant_drift = (
        "a first integral drifted further than drift_tol (relative to its initial value): "
        "the method is not accurate enough at this step size (lower dt), or, for a "
        "feedback field with an explicit method, the step is past the stability limit "
        "h·λ_max(L∇²V) < β (geomjax.stability_interval; 2 for Euler; geomjax.check_gains)"
    )
    solver_failed = "the diffrax solver stopped with an error"
    invalid_step_size = (
        "the step size dt is zero, negative or not finite, or the initial time t0 is not "
        "finite (they were traced, so this could only be checked inside the run): nothing "
        "was integrated. Pass a positive finite dt and a finite t0"
    )
    step_size_collapsed = (
        "the adaptive step size collapsed: the solver rejected every step near the last "
        "accepted state, usually because the field is non-finite there"
    )
    inaccurate = (
        "the accuracy check (accuracy_tol) failed: the state at a save point differs from "
        "the same run at half the step size (dt/2, twice the steps) by more than "
        "accuracy_tol relative to 1 + max|x|, so the trajectory is not accurate to that "
        "tolerance at this step size, whatever the monitored quantities say. Lower dt or "
        "use a higher-order method (geomjax.method_order)"
    )
    linear_solve_failed = (
        "a sparse linear solve inside the step failed (the constraint multipliers of a "
        "large sparse constraint graph: conjugate gradients that did not reach their "
        "tolerance within their iteration limit, or a block Cholesky factorization that "
        "broke down): the constraint matrix G M⁻¹ Gᵀ is singular or nearly so at this state "
        "(dependent constraints, or a mass near zero), or the step is too large (lower dt). "
        "geomjax.rattle(..., structured=False) solves the same step densely, for comparison"
    )


def where_first(current, new):
    """Keep the first failure: `current` if it already failed, else `new`."""
    return RESULTS.where(current == RESULTS.successful, new, current)


def code_of(item):
    """The integer code (an array, possibly traced or batched) of a status item of any
    `equinox.Enumeration` (`RESULTS`, `FIT_RESULTS`): the one place that reads equinox's
    private storage of it."""
    return item._value


def known_code(item) -> int | None:
    """The integer code of a status item when it is known at trace time (a step that cannot
    fail returns a constant success), else None (a traced status)."""
    code = known(item._value)
    return None if code is None else int(code)


def code_int(item) -> int:
    """The integer code of a status item whose value is known (not traced)."""
    return int(np.asarray(item._value))


def from_code(code, enumeration=None):
    """The item of `enumeration` (default `RESULTS`) with integer code(s) `code` (an int
    array, e.g. from a loop carry)."""
    item = next(iter((RESULTS if enumeration is None else enumeration)._name_to_item.values()))
    return eqx.tree_at(lambda r: r._value, item, jnp.asarray(code, item._value.dtype))


def status_names(enumeration=None) -> dict:
    """{integer code: member name} of `enumeration` (default `RESULTS`; e.g. 4 ↦ "diverged")."""
    members = (RESULTS if enumeration is None else enumeration)._name_to_item.items()
    return {int(item._value): name for name, item in members}


def status_messages(enumeration=None) -> list:
    """The members' messages, indexed by integer code."""
    return list((RESULTS if enumeration is None else enumeration)._index_to_message)
