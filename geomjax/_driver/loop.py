"""The time-stepping loop: one step with its bookkeeping, and the runs built from it.

Every run of a geomjax step goes through `checked_step`: the step, its status, the
finiteness of the new state, the first failure recorded (its step and its code) and the
state frozen at the last good one from there on. `geomjax.integrate` scans it over save
blocks (with start checks, monitoring and the failure search around it,
`geomjax._driver.integrate`); the lean configurations here run it with none of those:
`saved_states` (training and rollouts of learned models: saves every `substeps` steps,
NaN from a failure on) and `final_state` (a traced number of steps: one compilation for a
convergence study over many step sizes).
"""

import jax
import jax.numpy as jnp
from jax import lax

from .._status import RESULTS, code_int, code_of
from .common import FAILED_STEP, OK, STATUS, STEPS


def checked_step(step, dt, t0, args, checkpoint: bool = False):
    """`(z, record, running) ↦ (z, record, running)`: one step of `step` with its bookkeeping.

    `record = (steps taken, first failed step or −1, status code)` (int64), `running`
    whether no step failed yet. A step fails where its status is not a success or its
    state is not finite (`nonfinite_first_step` at step 1, `diverged` later); from the
    first failure on the state stays at the last good one (no NaN enters the carry, and
    later steps are evaluated at a finite state: finite, zero derivatives). With
    `checkpoint`, reverse mode recomputes the step instead of storing its residuals.
    """

    def advance(t, z):
        return step.advance(t, z, dt, args)

    if checkpoint:
        # Reverse mode keeps only the state before each step and recomputes the step in
        # the backward loop. Saving the step's own residuals instead stacks one array per
        # intermediate scalar of the field (hundreds for a simplified derived field), and
        # the loops that write and read them run far slower than the step. The
        # bookkeeping stays outside: its one saved flag per step is all the backward
        # loop needs of it. (`prevent_cse=False`: inside a scan no barrier is needed.)
        advance = jax.checkpoint(advance, prevent_cse=False)

    def one_step(carry):
        z, record, running = carry
        k = record[STEPS] + 1
        t = t0 + (k - 1).astype(dt.dtype) * dt
        z_next, result = advance(t, z)
        code = jnp.asarray(code_of(result), jnp.int64)
        finite = jnp.isfinite(step.state_sum(z_next))
        step_ok = (code == OK) & finite
        blow_up = jnp.where(k == 1, code_int(RESULTS.nonfinite_first_step), code_int(RESULTS.diverged))
        code = jnp.where(code != OK, code, jnp.where(finite, OK, blow_up))
        first = running & ~step_ok
        record = jnp.stack(
            [k, jnp.where(first, k, record[FAILED_STEP]), jnp.where(first, code, record[STATUS])]
        )
        # Whether the run is still going rides in the carry as a boolean of its own: read
        # off the integer status instead, it makes XLA's CPU runtime run the forward half
        # of reverse mode many times slower (benchmarks/gradients.py).
        running_next = running & step_ok
        return step.state_select(running_next, z_next, z), record, running_next

    return one_step


def fresh_record():
    """The record of a run before its first step: no steps, no failure, success."""
    return jnp.asarray([0, -1, OK], jnp.int64)


def _started(step, x0, dt, t0, args):
    z0 = step.split(x0)
    step = step.at_start(z0)
    start = getattr(step, "start", None)
    if start is not None:
        z0 = start(t0, z0, dt, args)
    return step, (z0, fresh_record(), jnp.asarray(True))


def saved_states(step, x0, saves: int, dt, substeps: int = 1):
    """The lean run: the flat states at t = 0, dt, …, saves·dt of `step` from the flat
    `x0`, taking `substeps` steps of dt/substeps between saves; shape (saves + 1, dim).

    No start check, no monitoring, no failure search: the saves from a failed step on are
    NaN (so a loss on them is NaN, never a wrong number). Differentiable in every mode,
    without checkpoints (what training needs: the states of short chunks)."""
    h = jnp.asarray(dt / substeps, x0.dtype)
    step, carry = _started(step, x0, h, jnp.zeros((), x0.dtype), None)
    one = checked_step(step, h, jnp.zeros((), x0.dtype), None)

    def save_block(c, _):
        c = lax.fori_loop(0, substeps, lambda _, cc: one(cc), c) if substeps > 1 else one(c)
        return c, (step.merge(c[0]), c[2])

    _, (xs, ok) = lax.scan(save_block, carry, None, length=saves)
    xs = jnp.where(ok[:, None], xs, jnp.nan)
    return jnp.concatenate([x0[None], xs])


def final_state(step, x0, h, n):
    """`(x_n, record)`: `n` steps (a traced count) of size `h` of `step` from the flat
    `x0`; after a failure the state is the last good one and `record` says where."""
    step, carry = _started(step, x0, h, jnp.zeros((), h.dtype), None)
    one = checked_step(step, h, jnp.zeros((), h.dtype), None)
    z, record, _ = lax.fori_loop(0, n, lambda _, c: one(c), carry)
    return step.merge(z), record
