"""The adaptive path of `geomjax.integrate`: a diffrax solver on a geomjax field, with the
same start check, save-point monitoring and statuses as the fixed-step loop.

Imported only when a diffrax solver is passed, so that `import geomjax` does not import
diffrax.
"""

import dataclasses

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp

from .._field.base import AbstractField
from .._status import RESULTS, code_int
from .common import OK, STATUS, RunOptions, begin, compiled_call, solution_from_record
from .flagged import flag_failed

class _RejectNonFinite(diffrax.PIDController):
    """A PID controller that treats a non-finite error estimate as an infinite one, so
    the step is rejected and shrunk (diffrax's own turns NaN into a NaN step size)."""

    def adapt_step_size(self, t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state):
        y_error = jax.tree_util.tree_map(lambda e: jnp.where(jnp.isfinite(e), e, jnp.inf), y_error)
        return super().adapt_step_size(t0, t1, y0, y1_candidate, args, y_error, error_order, controller_state)



class AdaptiveOptions(eqx.Module):
    """The options of a diffrax run: `run` (the loop's: `save_every`, `start_tol`,
    `drift_tol`), the number of `steps` of dt to the end time, and the step-size control
    (`rtol`, `atol`: None for both, constant steps; `max_steps`)."""

    run: RunOptions
    steps: int = eqx.field(static=True)
    rtol: float | None = None
    atol: float | None = None
    max_steps: int | None = eqx.field(static=True, default=None)


def run_diffrax(field: AbstractField, solver, x0, dt, t0, args, *, options: AdaptiveOptions, dt0=None):
    """The run over [t0, t0 + dt·steps], saved every `save_every`·dt; `dt0` (default `dt`)
    is diffrax's first step."""
    times = (dt, t0, args)
    return compiled_call(_diffrax_run, (options,), field, solver, x0, times, dt if dt0 is None else dt0)


def _diffrax_run(field: AbstractField, solver, x0, times, dt0, options: AdaptiveOptions):
    """A diffrax solve with the start check and the save-point monitoring, compiled whole."""
    dt, t0, args = times
    steps, save_every = options.steps, options.run.save_every
    rtol, atol, max_steps = options.rtol, options.atol, options.max_steps
    field, (z0, record), monitor = begin(field, x0, dt, options.run.start_tol, options.run.drift_tol, t0)
    start_ok = record[STATUS] == OK
    t1 = t0 + dt * steps
    n_saves = steps // save_every
    ts = t0 + dt * save_every * jnp.arange(n_saves + 1, dtype=x0.dtype)
    term = diffrax.ODETerm(lambda t, y, a: field.rhs(t, y, a))
    if rtol is None and atol is None:
        controller = diffrax.ConstantStepSize()
        max_steps = steps + 1 if max_steps is None else max_steps
    else:
        # Non-finite error estimates shrink the step, so the saves stop at the time where
        # the field turned non-finite; a step size below 1e-12 of the interval ends the
        # solve at once (`force_dtmin=False`: diffrax's default would accept steps of
        # dtmin, NaN ones included, until max_steps) as RESULTS.step_size_collapsed.
        controller = _RejectNonFinite(
            rtol=1e-6 if rtol is None else rtol,
            atol=1e-9 if atol is None else atol,
            dtmin=1e-12 * dt * steps,
            force_dtmin=False,
        )
        max_steps = 1_000_000 if max_steps is None else max_steps
    sol = diffrax.diffeqsolve(
        term,
        solver,
        t0,
        t1,
        dt0,
        z0,
        args=args,
        saveat=diffrax.SaveAt(ts=ts),
        stepsize_controller=controller,
        max_steps=max_steps,
        throw=False,
    )
    xs = jax.vmap(field.merge)(sol.ys)
    num_steps = jnp.asarray(sol.stats["num_steps"], jnp.int64)
    reached = jnp.isfinite(sol.ts)
    finite = jnp.all(jnp.isfinite(xs), axis=1) & reached
    drift = jax.vmap(lambda x: monitor.drift_code(field, x))(jnp.where(finite[:, None], xs, x0))
    drift = jnp.where(finite, drift, OK)
    collapsed = sol.result == diffrax.RESULTS.dt_min_reached
    solver_code = jnp.where(
        sol.result == diffrax.RESULTS.successful,
        OK,
        jnp.where(collapsed, code_int(RESULTS.step_size_collapsed), code_int(RESULTS.solver_failed)),
    )
    bad_save = (~finite) | (drift != OK)
    first_bad = jnp.argmax(bad_save)
    any_bad = jnp.any(bad_save)
    save_code = jnp.where(finite[first_bad], drift[first_bad], code_int(RESULTS.diverged))
    code = jnp.where(any_bad & (solver_code == OK), save_code, solver_code)
    code = jnp.where(start_ok, code, record[STATUS])
    # diffrax gives no per-step index on an adaptive grid; report the save point (in
    # steps of dt) where the failure showed, or the steps taken when the solver stopped.
    failed_step = jnp.where(
        code == OK, -1, jnp.where(any_bad, first_bad * save_every, num_steps)
    )
    failed_step = jnp.where(start_ok, failed_step, 0)
    keep = jnp.where(code == OK, True, jnp.arange(n_saves + 1) <= jnp.where(any_bad, first_bad, n_saves))
    keep = keep & (finite | (jnp.arange(n_saves + 1) == 0))
    xs = flag_failed(xs, ~keep[:, None])
    xs = xs.at[0].set(x0)
    record = jnp.stack([num_steps, failed_step.astype(jnp.int64), code.astype(jnp.int64)])
    stats = {k: jnp.asarray(sol.stats[k], jnp.int64) for k in ("num_steps", "num_accepted_steps", "num_rejected_steps", "max_steps")}
    return dataclasses.replace(solution_from_record(ts, xs, record, dt, t0), stats=stats)
