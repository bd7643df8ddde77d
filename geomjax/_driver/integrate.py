"""The driver: `geomjax.integrate`, its fixed-step `lax.scan` loops, and the dispatch to the
diffrax path (`adaptive.py`), with a status per run.

What a run guarantees (under `jit` and `vmap` too):

- the start is checked: a non-finite x0 or one off the constraint set ends the run at
  step 0 with `RESULTS.nonfinite_start` / `RESULTS.off_constraint_set`;
- every step is checked for a non-finite state and for its own failure (a Newton solve);
- at every save point the monitored quantities of the field or step (constraint
  residuals, first integrals) are compared with `drift_tol`; a drift's message names the
  quantity and its value (`Solution.detail`, computed after the run);
- with `accuracy_tol`, the saves are compared with the same run at dt/2 (`_compared`);
- after the first failure the state stops advancing (so losses on earlier states have
  the gradients of the shorter run), and later saves are NaN, in value and in
  derivative: a loss that reads them has a NaN gradient (forward and reverse mode), so
  a failed run is never silently finite.

The per-step loop carries only the state and a finiteness mark; a save block that failed
is searched step by step, with each step checked, by the same loop run one step per pass
(`_fast_steps`: the step is compiled once). The checked loop (`_exact_steps`) defines the
derivatives (`_block_map`). A step with a cheaper `fast_variant` (an implicit step's
fixed-point iteration without its Newton fallback) runs as that variant in the loop, and
is redone with the step itself where it failed: in the search of a failed block, and in
runs saved every one or two steps, for the whole run (`_fast_variant_then_step`).
"""

import dataclasses
import math
import operator
import sys
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Float
from jax import lax
from jax.custom_batching import custom_vmap

from .._field.base import AbstractField, TimeField, as_field, entrywise, entrywise_applies
from .._field.feedback import AbstractFeedbackField
from .._stability.analysis import check_gains
from .._system.system import check_names_at_start
from .._step.runge_kutta import ExplicitRungeKutta
from .._step.methods import build_step, method_builder
from .._monitored import DRIFT_TOL, START_TOL, check_on_constraint_set
from .batched import BatchedStep, vmap_keep_shared
from .common import (
    RunOptions,
    FAILED_STEP,
    OK,
    STATUS,
    STEPS,
    Monitor,
    begin,
    compiled_call,
    compiled_call_on,
    drift_detail,
    known_memo,
    memo_of,
    nan_max,
    no_detail,
    solution_from_record,
)
from .flagged import flag_failed
from .loop import checked_step
from .solution import FailureDetail, Solution, raise_if_failed
from .._status import RESULTS, code_int, code_of, known_code
from .._step.base import AbstractStep, FunctionStep
from .._validate import (
    as_state,
    at_top_level,
    check,
    check_call_args,
    check_positive_step,
    check_run_options,
    check_tolerance,
    is_concrete,
    known,
)
from ..internal.closure import custom_jvp_by_reference

# Outside jit a long run is split into compiled chunks of at most this many steps, so
# that Ctrl-C and progress bars act between chunks.
_CHUNK_STEPS = 1 << 20


def _exact_steps(step: AbstractStep, dt, t0, args, block: int, checkpoint: bool):
    """`(z, record) ↦ (z, record)` after `block` steps, every step checked and recorded.

    `record = (steps taken, first failed step or −1, status)`. This is the reference
    semantics of the loop (and what reverse- and forward-mode derivatives go through).
    """

    one = checked_step(step, dt, t0, args, checkpoint)

    def one_step(c, _):
        return one(c), None

    def run(z, record):
        init = (z, record, record[STATUS] == OK)
        (z, record, _), _ = lax.scan(one_step, init, None, length=block)
        return z, record

    return run


# Fields of at most this many state entries are differentiated with each entry a piece
# of its own (`per_entry`); larger ones may exceed the scalar graph's limits, and then an
# entrywise layout only adds a stack and its slices per evaluation.
_PER_ENTRY_MAX_DIM = 32


def per_entry(step):
    """`step` with its field's entries as pieces (`geomjax._field.base.EntrywiseField`), for
    the loops that define derivatives; `step` itself where that does not pay.

    Converted: one-stage explicit methods (explicit Euler) of derived fields of at most
    `_PER_ENTRY_MAX_DIM` entries. `benchmarks/tuning.py` measured a tuning iteration
    (feedback Euler, B = 16–256) 1.6–1.9× faster this way. Left alone: methods with
    several stages, for which XLA's CPU backend fuses every stage into each entry's
    consumers and recomputes it there (feedback RK4 ran up to 2× slower entrywise), and
    steps whose pieces are not the field's (multistep histories, implicit and projected
    steps). A `BatchedStep` converts its members' step, keeping shared arrays shared.
    """
    if isinstance(step, BatchedStep):
        if not _converts(step.step):
            return step
        inner, axes = vmap_keep_shared(per_entry, (step.step,), list(step.step_axes), step.size, step.axis)
        return BatchedStep(inner, axes, step.axis, step.size, step.rows)
    if _converts(step):
        return eqx.tree_at(lambda s: s.field, step, entrywise(step.field))
    return step


def _converts(step) -> bool:
    """Whether `per_entry` changes `step` (decided without building anything)."""
    return (
        type(step) is ExplicitRungeKutta
        and step.tableau.stages == 1
        and (step.dim or _PER_ENTRY_MAX_DIM + 1) <= _PER_ENTRY_MAX_DIM
        and entrywise_applies(step.field)
    )


def _in_layout_of(step, other, run):
    """`run`, a map `(z, record) ↦ (z, record)` of `other`'s pieces, as a map of `step`'s."""
    if other is step:
        return run

    def converted(z, record):
        z, record = run(other.split(step.merge(z)), record)
        return step.split(other.merge(z)), record

    return converted


@custom_vmap
def _any_member(flag):
    """`flag`, a boolean scalar; under `vmap`, whether it holds for *any* member, the same
    (unbatched) value for all. It decides only whether a loop redoes work whose results
    each member then takes or not as its own flag says, so a member's values never
    depend on another's; what it buys is a loop whose trip count stays unbatched under
    `vmap` (a batched one would select every carried value at every step)."""
    return flag


@_any_member.def_vmap
def _any_member_rule(axis_size, in_batched, flag):
    del axis_size
    if in_batched[0]:
        flag = _any_member(jnp.any(flag, axis=0))  # again: for an enclosing vmap
    return flag, False


def _anywhere(flags):
    """Whether any entry of `flags` holds, in any member of an enclosing `vmap`."""
    return _any_member(jnp.any(flags))


def _fast_steps(step: AbstractStep, dt, t0, args, block: int):
    """The map of `_exact_steps(step, ...)` over one save block, with the bookkeeping out of
    the per-step loop and one copy of that loop in the compiled program.

    The per-step loop (`steps_from`: `n` steps of `step.fast_variant()`) carries the state,
    a running `0·Σx` (NaN from the first non-finite state on, whatever later steps do)
    and, for steps whose status is not a constant, the first status that is not a
    success. It runs inside a loop over passes, with a trip count that the pass sets:

    - pass 0 runs the whole block. Where it succeeded (the whole batch, under `vmap` or
      for a `BatchedStep`), that is the block;
    - otherwise the same loop runs one step at a time from the block's start, each step
      checked as `_exact_steps` checks it, for the members that failed, until each has
      found its failing step (the state stays at the last good one) or reached the end of
      the block. A step whose fast variant failed is taken again with `step` itself (an
      implicit step's Newton fallback: a second, different step in the program, run only
      there); where that succeeds the member goes on.

    So the step of a block that succeeded is compiled once and runs with no per-step
    check beyond the flag; a failed block costs its steps once more, one loop pass each.
    Whether to redo is decided for the whole batch (`_anywhere`), so the trip counts stay
    unbatched under `vmap` and the loop stays a loop (no per-step selects). After an
    earlier failure the block keeps the frozen state and only counts its steps.
    """
    fast = step.fast_variant()

    def finite_mark(z):
        # 0 if every entry of z is finite, else NaN (0·x is NaN for ±inf and NaN)
        return 0.0 * fast.state_sum(z)

    def steps_from(z, k, n, like):
        """`n` steps of `fast` from `z` after step `k`: `(z_n, mark, first bad code)`."""

        def body(c):
            z, i, mark, code = c
            t = t0 + (k + i).astype(dt.dtype) * dt
            z_next, result = fast.advance(t, z, dt, args)
            if known_code(result) != OK:
                code = jnp.where(code == OK, jnp.asarray(code_of(result), code.dtype), code)
            # The mark of the state the step starts from (read with the step's own
            # inputs, so XLA computes it beside them); the end state's after the loop.
            return z_next, i + 1, mark + finite_mark(z), code

        init = (z, jnp.zeros((), k.dtype), jnp.zeros_like(like, dt.dtype), jnp.full_like(like, OK))
        z, _, mark, code = lax.while_loop(lambda c: c[1] < n, body, init)
        return z, mark + finite_mark(z), code

    def run(z, record):
        k0 = record[STEPS]
        running = record[STATUS] == OK

        def one_pass(c):
            searching, j, z, record, pending, _ = c
            z_next, mark, code = steps_from(z, k0 + j, jnp.where(searching, 1, block), k0)
            ok = jnp.isfinite(mark) & (code == OK)
            if fast is not step:
                redo = searching & pending & ~ok

                def full(_):
                    z_full, result = step.advance(t0 + (k0 + j).astype(dt.dtype) * dt, z, dt, args)
                    return z_full, jnp.broadcast_to(jnp.asarray(code_of(result), code.dtype), code.shape)

                z_full, code_full = lax.cond(_anywhere(redo), full, lambda _: (z_next, code), None)
                z_next = step.state_select(redo, z_full, z_next)
                code = jnp.where(redo, code_full, code)
            # pass 0: the members that failed search their block from its start
            failed = running & ~ok
            # a search step: the exact loop's status of step k
            k = k0 + j + 1
            finite = jnp.isfinite(step.state_sum(z_next))
            blow_up = jnp.where(k == 1, code_int(RESULTS.nonfinite_first_step), code_int(RESULTS.diverged))
            code = jnp.where(code != OK, code, jnp.where(finite, OK, blow_up))
            bad = pending & (code != OK)
            found = jnp.stack([k, k, code])
            record = jnp.where(searching & bad, found.astype(record.dtype), record)
            advance = jnp.where(searching, pending & ~bad, running & ok)
            pending = jnp.where(searching, pending & ~bad, failed)
            j = jnp.where(searching, j + 1, 0)
            go = (j < block) & _anywhere(pending)
            return jnp.asarray(True), j, step.state_select(advance, z_next, z), record, pending, go

        init = (jnp.asarray(False), jnp.zeros((), k0.dtype), z, record, jnp.zeros_like(running), jnp.asarray(True))
        _, _, z, record, _, _ = lax.while_loop(lambda c: c[5], one_pass, init)
        return z, record.at[STEPS].set(k0 + block)

    return run


def _fast_steps_unrolled(step: AbstractStep, times, block: int, exact, unroll: int):
    """`_fast_steps` for a loop that takes `unroll` steps per iteration (sweeps on a GPU):
    the block in one `lax.scan`, and where it failed, recomputed by `exact` (the checked
    loop, a second copy of the step) from its start, in a `while_loop` that runs at most
    once."""
    dt, t0, args = times

    def finite_mark(z):
        return 0.0 * step.state_sum(z)

    def run(z, record):
        k0 = record[STEPS]

        def body(c, _):
            z, i, mark, ok = c
            t = t0 + (k0 + i).astype(dt.dtype) * dt
            z_next, result = step.advance(t, z, dt, args)
            if known_code(result) is not None:
                ok_next = ok if known_code(result) == OK else jnp.zeros_like(ok)
            else:
                ok_next = ok & (jnp.asarray(code_of(result)) == OK)
            return (z_next, i + 1, mark + finite_mark(z), ok_next), None

        init = (z, jnp.zeros((), k0.dtype), jnp.zeros(jnp.shape(k0), dt.dtype), jnp.ones(jnp.shape(k0), bool))
        (z_end, _, mark, ok), _ = lax.scan(body, init, None, length=block, unroll=unroll)
        mark = mark + finite_mark(z_end)
        failed_before = record[STATUS] != OK
        failed = ~failed_before & ~(jnp.isfinite(mark) & ok)
        z_end = step.state_select(failed_before, z, z_end)
        record_end = record.at[STEPS].add(block)

        def again(c):
            # From the carry, not from the closure: XLA would hoist a loop-invariant
            # recomputation out of the loop (under vmap, run it for every block).
            return (jnp.zeros_like(c[0]), *exact(c[1], c[2]))

        _, z_exact, record_exact = lax.while_loop(lambda c: jnp.any(c[0]), again, (failed, z, record))
        return step.state_select(failed, z_exact, z_end), jnp.where(failed, record_exact, record_end)

    return run


def _dynamic_leaves(tree):
    """`(dyn, rebuild)`: the array leaves of `tree`, and `rebuild(dyn)` ↦ `tree` with
    those leaves replaced (the inputs of a custom derivative, everything else kept)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    is_dyn = [eqx.is_array(leaf) for leaf in leaves]

    def rebuild(dyn):
        it = iter(dyn)
        return jax.tree_util.tree_unflatten(treedef, [next(it) if d else leaf for leaf, d in zip(leaves, is_dyn)])

    return [leaf for leaf, d in zip(leaves, is_dyn) if d], rebuild


def _block_map(step: AbstractStep, times, block: int, run: RunOptions):
    """`(z, record) ↦ (z, record)` over one save block: the fast loop for the values, the
    exact per-step loop for derivatives (a `custom_jvp`: reverse mode transposes the
    exact loop's JVP, so a failed block differentiates as the frozen, shorter run).

    Blocks of one or two steps run the exact loop alone: there the fast loop's block-level
    check costs more than the per-step bookkeeping it saves (measured, `save_every=1`).
    """
    dt, t0, args = times
    checkpoint, unroll = run.checkpoint, run.unroll
    if block <= 2:
        return _exact_steps(step, dt, t0, args, block, checkpoint)
    dyn, rebuild = _dynamic_leaves((step, dt, t0, args))

    def exact_of(dyn):
        # Derivatives run with each state entry a piece of its own (`per_entry`): the
        # cotangent loop then works on contiguous vectors, never on per-entry
        # concatenations. The layout changes once per block, outside the step loop.
        s, h, t, a = rebuild(dyn)
        entries = per_entry(s)
        return _in_layout_of(s, entries, _exact_steps(entries, h, t, a, block, checkpoint))

    def fast(dyn, z, record):
        s, h, t, a = rebuild(dyn)
        if unroll == 1:
            return _fast_steps(s, h, t, a, block)(z, record)
        exact = _exact_steps(s, h, t, a, block, False)
        return _fast_steps_unrolled(s.fast_variant(), (h, t, a), block, exact, unroll)(z, record)

    # Values from the fast loop, derivatives from the exact one, with respect to the
    # explicit inputs and to whatever the user's functions close over (a parameter traced
    # by an enclosing `jax.grad`): `custom_jvp_by_reference` makes those inputs too.
    run = custom_jvp_by_reference(fast, lambda d, z, r: exact_of(d)(z, r))
    return lambda z, record: run(dyn, z, record)


def _scan_blocks(step: AbstractStep, carry, times, monitor: Monitor, run: RunOptions):
    """Run `run.blocks × run.save_every` steps; save the flat state after every block.

    `carry` is `(z, record)` with `record = (steps taken, first failed step or −1, status)`.
    `times` is `(dt, t0, args)`. With `run.monitored`, each save is `(x, invariants, residuals)`: the values the drift
    check computed there (NaN after a failure, as the states).
    """
    if run.save_every <= 2 and step.fast_variant() is not step:
        return _fast_variant_then_step(step, carry, times, monitor, run)
    return _scan_blocks_of(step, carry, times, monitor, run)


def _fast_variant_then_step(step, carry, times, monitor, run: RunOptions):
    """`_scan_blocks_of(step, ...)` for blocks of one or two steps (run by the checked loop
    alone) of a step with a cheaper `fast_variant` (an implicit step whose Newton fallback,
    present in a loop even where it never runs, slows the whole loop several times on the
    CPU): the run goes with the fast variant, and only where it failed (a batch: where
    some member failed) again with `step` from the start, its results taken for the runs
    that failed. Values are `step`'s wherever they differ, and derivatives are those of
    the run with `step` (`custom_jvp_by_reference`)."""
    dyn, rebuild = _dynamic_leaves((step, times, monitor))

    def reference(dyn, carry):
        s, ts, m = rebuild(dyn)
        return _scan_blocks_of(s, carry, ts, m, run)

    def value(dyn, carry):
        s, ts, m = rebuild(dyn)
        fast = _scan_blocks_of(s.fast_variant(), carry, ts, m, run.but(checkpoint=False))
        failed = fast[0][1][STATUS] != OK

        def again(c):
            # From the carry through a barrier: XLA would hoist a recomputation of values
            # it sees as loop-invariant out of the loop, and run it every time.
            start_dyn, start_carry = lax.optimization_barrier((c[2], c[3]))
            return jnp.zeros_like(c[0]), reference(start_dyn, start_carry), start_dyn, start_carry

        _, full, _, _ = lax.while_loop(lambda c: jnp.any(c[0]), again, (failed, fast, dyn, carry))
        (z_full, record_full), xs_full = full
        (z_fast, record_fast), xs_fast = fast
        pick = lambda a, b: jnp.where(failed, a, b)  # members on the last axis
        z = s.state_select(failed, z_full, z_fast)
        return (z, pick(record_full, record_fast)), jax.tree_util.tree_map(pick, xs_full, xs_fast)

    return custom_jvp_by_reference(value, reference)(dyn, carry)


def _scan_blocks_of(step: AbstractStep, carry, times, monitor: Monitor, run: RunOptions):
    """`_scan_blocks` with `step` throughout."""
    block_map = _block_map(step, times, run.save_every, run)

    def run_block(c):
        return block_map(*c)

    if run.checkpoint and run.blocks > 1:
        # Memory: the carries of one block at a time, plus one per block.
        run_block = jax.checkpoint(run_block, prevent_cse=False)

    def outer(c, _):
        return _save(step, monitor, run_block(c), run.monitored)

    return lax.scan(outer, carry, None, length=run.blocks)


def _save(step: AbstractStep, monitor: Monitor, carry, monitored: bool = False):
    """The end of a save block: the drift check of the carry `(z, record)`, and the saved
    flat state (with `monitored`, `(x, invariants, residuals)`). Returns `(carry, saved)`."""
    z, record = carry
    x = step.merge(z)
    failed_before = record[STATUS] != OK
    values = step.monitored(x)
    code = monitor.drift_code(step, x, values)
    first = ~failed_before & (code != OK)
    k = record[STEPS]
    record = jnp.stack([k, jnp.where(first, k, record[FAILED_STEP]), jnp.where(first, code, record[STATUS])])
    # The state that showed the drift is saved; saves after a failure are NaN, and so
    # are the derivatives of losses that read them (`flag_failed`).
    saved = flag_failed(x, failed_before)
    if monitored:
        saved = (saved, *(flag_failed(v, failed_before) for v in values))
    return (z, record), saved


def _chunks(n_blocks: int, block: int, progress) -> list[int]:
    """Save blocks per compiled call, for blocks of at most `_CHUNK_STEPS` steps (longer
    blocks run in parts: `_parts`); with a progress bar, at least about 20 calls."""
    per_chunk = max(1, _CHUNK_STEPS // block)
    if progress:
        per_chunk = min(per_chunk, max(1, -(-n_blocks // 20)))
    chunks = [per_chunk] * (n_blocks // per_chunk)
    if n_blocks % per_chunk:
        chunks.append(n_blocks % per_chunk)
    return chunks


def _parts(block: int) -> list[int]:
    """The steps of each compiled call of a save block longer than `_CHUNK_STEPS`."""
    parts = [_CHUNK_STEPS] * (block // _CHUNK_STEPS)
    return parts + [block % _CHUNK_STEPS] if block % _CHUNK_STEPS else parts


def runs_whole(n_blocks: int, block: int, progress) -> bool:
    """Whether a concrete run goes in one compiled call: at most `_CHUNK_STEPS` steps a
    block and one chunk of blocks (see `_chunks`)."""
    if block > _CHUNK_STEPS:
        return False
    return n_blocks <= _CHUNK_STEPS // block if not progress else len(_chunks(n_blocks, block, progress)) == 1


def _progress_bar(total: int, progress):
    from tqdm.auto import tqdm

    desc = progress if isinstance(progress, str) else "integrating"
    # kept when done: each run leaves one line that ends at 100 % (or where it stopped)
    return tqdm(total=total, desc=desc, unit="step", unit_scale=True, leave=True)


def _assemble(x0, pieces, record, dt, t0, run: RunOptions):
    xs = jnp.concatenate([x0[None, :]] + list(pieces), axis=0)
    counts = jnp.arange(run.blocks + 1, dtype=x0.dtype).reshape((-1,) + (1,) * jnp.ndim(dt))
    ts = t0 + dt * run.save_every * counts  # (saves,), or (saves, members) for a batch of step sizes
    return solution_from_record(ts, xs, record, dt, t0)


def _whole_run(step, x0, dt, t0, args, run: RunOptions):
    """Start check, loop, saves and status of a run in one compiled program. With
    `run.monitored`: `(solution, invariants, residuals)`, the monitored values at every
    save (the start included)."""
    step, carry, monitor = begin(step, x0, dt, run.start_tol, run.drift_tol, t0, args)
    carry, xs = _scan_blocks(step, carry, (dt, t0, args), monitor, run)
    if run.monitored:
        xs, inv, res = xs
        inv0, res0 = step.monitored(x0)  # as the start check computed them (XLA shares them)
        sol = _assemble(x0, [xs], carry[1], dt, t0, run)
        return sol, jnp.concatenate([inv0[None], inv]), jnp.concatenate([res0[None], res])
    return _assemble(x0, [xs], carry[1], dt, t0, run)


def _begin_run(step, x0, dt, t0, args, run: RunOptions):
    return begin(step, x0, dt, run.start_tol, run.drift_tol, t0, args)


def _chunk(step, carry, times, monitor, run: RunOptions):
    return _scan_blocks(step, carry, times, monitor, run)


def _block_part(step, carry, times, n, run: RunOptions):
    """`n` steps of a save block that runs in parts: the loop of `_block_map`, no save."""
    return _block_map(step, times, n, run)(*carry)


def _save_point(step, carry, monitor):
    """The save ending a block that ran in parts, its state as a piece of one save."""
    carry, x = _save(step, monitor, carry)
    return carry, x[None]


def _run_fixed(step, x0, dt, t0, args, steps, *, run: RunOptions, progress=False):
    """A fixed-step run of `steps` steps (`run.save_every` a save; `run.blocks` is set
    here), in one compiled program, or outside jit in compiled chunks of at most
    `_CHUNK_STEPS` steps."""
    save_every = run.save_every
    n_blocks = steps // save_every
    if run.blocks != n_blocks:
        run = run.but(blocks=n_blocks)
    # (At the top level nothing is traced: no need to look through the step's leaves.)
    concrete = at_top_level() or is_concrete((x0, dt, t0, args, step))
    if not concrete or runs_whole(n_blocks, save_every, progress):
        bar = _progress_bar(steps, progress) if (progress and concrete) else None
        if args is None:
            sol = compiled_call_on(_whole_run, (None, run), step, x0, dt, t0)
        else:
            sol = compiled_call(_whole_run, (run,), step, x0, dt, t0, args)
        if bar is not None:
            bar.update(steps)
            bar.close()
        return sol
    # Outside jit a long run goes in compiled calls of at most _CHUNK_STEPS steps (whole
    # save blocks, or the parts of a longer block and then its save), so that Ctrl-C and
    # the progress bar act between them. The results are those of one call: the steps,
    # their times (from the step count in the carry) and the checks are the same.
    step, carry, monitor = compiled_call(_begin_run, (run,), step, x0, dt, t0, args)
    bar = _progress_bar(steps, progress) if progress else None
    pieces = []
    times = (dt, t0, args)
    if save_every > _CHUNK_STEPS:
        for _ in range(n_blocks):
            for n in _parts(save_every):
                carry = compiled_call(_block_part, (n, run), step, carry, times)
                if bar is not None:
                    bar.update(n)
            carry, x = compiled_call(_save_point, (), step, carry, monitor)
            pieces.append(x)
    else:
        for n in _chunks(n_blocks, save_every, progress):
            carry, xs = compiled_call(_chunk, (run.but(blocks=n),), step, carry, times, monitor)
            pieces.append(xs)
            if bar is not None:
                bar.update(n * save_every)
    if bar is not None:
        bar.close()
    return compiled_call(_assemble, (run,), x0, pieces, carry[1], dt, t0)


def _target(field_or_step, method):
    """Tell steps from fields by type (or by `method="step"`), never by their signature."""
    if isinstance(field_or_step, AbstractStep):
        return field_or_step, True
    if isinstance(field_or_step, AbstractField):
        return field_or_step, False
    diffrax = sys.modules.get("diffrax")  # a diffrax object exists only if diffrax was imported
    if diffrax is not None and isinstance(field_or_step, diffrax.ODETerm):
        return TimeField(field_or_step.vector_field), False
    if isinstance(method, str) and method == "step":
        if not callable(field_or_step):
            raise TypeError(f"method='step' needs a callable step(x, h) ↦ x_next, got {type(field_or_step).__name__}")
        return FunctionStep(field_or_step), True
    return as_field(field_or_step), False


def _as_scalar(value, dtype):
    """A scalar of `dtype`; concrete Python/NumPy numbers stay on the host (the compiled
    run takes them as arguments), tracers and device arrays become jax arrays."""
    if isinstance(value, (int, float, np.number, np.ndarray)) and not isinstance(value, bool):
        return np.asarray(value, dtype=dtype)
    return jnp.asarray(value, dtype=dtype)


# Starts that passed the eager checks, per field or step (`_check_start`), at most this many.
_MAX_PASSED = 64


def _check_start(target, x0, start_tol) -> None:
    """`target.check(x0)` and the constraint-set check of x0, once per (target, x0).

    The checks are deterministic functions of the target and of x0, so a start that
    passed once passes again; targets with NumPy leaves (mutable in place) are checked
    every time. (A check whose values are not known, e.g. read through a tracer the
    target closes over, is left to the run; such a target lives only inside its trace, and
    so does its memo.) Measured:
    a 10-step run costs 200 µs a call with this memo and 420-470 µs without it (the
    checks' own dispatches)."""
    key = (np.asarray(x0).tobytes(), x0.shape, start_tol)
    memo = known_memo(target)
    if memo is not None and key in memo.get("passed", ()):
        return
    with jax.ensure_compile_time_eval():  # values computed from x0 and constants: known now
        _start_checks(target, x0, start_tol)
    if any(isinstance(leaf, np.ndarray) for leaf in jax.tree_util.tree_leaves(target)):
        return
    memo = memo_of(target)
    if memo is not None:
        passed = memo.setdefault("passed", set())
        if len(passed) < _MAX_PASSED:
            passed.add(key)


def _step_for(method: str, field):
    """`build_step(method, field)`, built once per field and method outside transformations
    (a step is immutable; building one costs a direct `integrate` call tens of µs, and a
    new object each call costs the dispatch of its compiled run more). Inside `jit`,
    `vmap` or `grad` it is built anew: what it holds may be traced values of that trace."""
    if not at_top_level():
        return build_step(method, field)
    memo = memo_of(field)
    builder = method_builder(method)
    found = None if memo is None else memo.get(("step", method))
    if found is not None and found[0] is builder:  # the method was not registered anew
        return found[1]
    step = build_step(method, field)
    if memo is not None:
        memo[("step", method)] = (builder, step)
    return step


def _start_checks(target, x0, start_tol) -> None:
    check_names_at_start(target, x0)
    target.check(x0)
    check_on_constraint_set(target, x0, start_tol)


def _end_time_grid(t1, saves, dt, steps, save_every, t0, *, adaptive: bool, rtol, atol, max_steps):
    """`(dt of the save grid, first step, steps, save_every, max_steps)` of a diffrax run
    given by its end time `t1` and `saves` equal save intervals (see `integrate`). With
    constant steps (no `rtol`/`atol`) the run takes ⌈(t1 − t0)/dt⌉ steps of `dt`, which is
    `max_steps` unless given."""
    if not adaptive:
        raise ValueError(
            "t1= and saves= are for diffrax solvers (method=diffrax.Tsit5(), ...), which choose their own steps; "
            "a fixed-step method runs steps= steps of dt=, to t0 + dt·steps"
        )
    if t1 is None:
        raise ValueError("saves= goes with t1= (saves equally spaced intervals of [t0, t1])")
    if steps is not None:
        raise ValueError("give either t1= (the solver chooses its steps) or steps= (t1 = t0 + dt·steps), not both")
    if save_every != 1:
        raise ValueError("with t1=, saves= sets the save points (equally spaced over [t0, t1]), not save_every=")
    saves = _as_count(100 if saves is None else saves, "saves")
    check(
        (t0, t1),
        lambda xp, a, b: ~(xp.isfinite(b - a) & (b - a > 0.0)),
        "t1 must be finite and after t0",
        detail=lambda a, b: f", got t0 = {float(a):g}, t1 = {float(b):g}",
    )
    if dt is not None:
        check(dt, lambda xp, d: ~(d > 0.0), "dt (the first step) must be > 0", detail=lambda d: f", got {float(d):g}")
    if rtol is None and atol is None:
        if dt is None:
            raise ValueError("a diffrax run without rtol/atol takes constant steps: give dt= (or rtol=/atol= to adapt)")
        if max_steps is None:
            ends = [known(v) for v in (t0, t1, dt)]
            if any(v is None for v in ends):
                raise ValueError("a constant-step diffrax run to a traced t1 needs max_steps= (its number of steps)")
            span = float(ends[1]) - float(ends[0])
            max_steps = math.ceil(span / float(ends[2]) * (1.0 - 1e-12)) + 1
    return (t1 - t0) / saves, dt, saves, 1, max_steps


def default_method(field) -> str:
    """The method `integrate` uses for `field` when none is given: `"euler"` for feedback
    fields (feedback Euler, the integrator of Chang, Perlmutter and Vankerschaver (2022) and of Bae & Chang's adaptive gain,
    whose gains are chosen for it: `feedback_field(..., dt=h)`), `"rk4"` (explicit, order
    4) for every other field (Dirac, nonholonomic, contact fields, plain callables)."""
    return "euler" if isinstance(field, AbstractFeedbackField) else "rk4"


_DEFAULT_METHOD_NOTES = {
    "euler": (
        "The method was the default for a feedback field, explicit Euler (feedback Euler, as in "
        "Chang, Perlmutter and Vankerschaver (2022)): first order, and it keeps the constraints and first integrals only through "
        "the feedback, whose gains must keep h·λ_max(L∇²V) < 2 (geomjax.check_gains). Choose "
        'another with method=, e.g. method="rk4", or a constraint-preserving step (geomjax.rattle)'
    ),
    "rk4": (
        'The method was the default for this field, "rk4" (explicit, order 4): it keeps neither '
        "the constraints nor the first integrals exactly. Choose one for the problem, e.g. "
        'method="gauss4" (implicit, order 4, keeps quadratic first integrals), a smaller dt, a '
        "feedback field (geomjax.feedback_field) or a constraint-preserving step (geomjax.rattle)"
    ),
}

_DRIFT_CODES = frozenset((code_int(RESULTS.invariant_drift), code_int(RESULTS.constraint_violation)))


def _explained(target, x0, sol: Solution, save_every: int, drift_tol, note: str) -> Solution:
    """`sol` with its `detail`: what a drift failure measured (`common.drift_detail`),
    computed where a drift may have been reported (a traced status, or a known drift)."""
    status = known(sol.status)
    if drift_tol is None or (status is not None and _DRIFT_CODES.isdisjoint(np.ravel(status).tolist())):
        detail = no_detail(x0.dtype, note)
    else:
        detail = compiled_call(drift_detail, (save_every, drift_tol, note), target, x0, sol)
    return _with_detail(sol, detail)


def _with_linear_cause(sol: Solution, step, dt, t0, args, save_every: int) -> Solution:
    """`sol`, with `detail.cause` giving the residual where a run of a step with sparse
    linear solves (`Rattle.linear_residuals`) ended with `RESULTS.linear_solve_failed`:
    the step's solves are repeated at the last good state (step k − 1 of a failure at step
    k, reached from the last save before it) and their relative residuals ‖b − A y‖/‖b‖
    named beside the bound each must reach. Only for a run that failed outside jit."""
    status = known(sol.status)
    diagnose = getattr(step, "linear_residuals", None)
    if (
        diagnose is None
        or status is None
        or np.ndim(status) != 0
        or int(status) != code_int(RESULTS.linear_solve_failed)
        or not is_concrete((sol.xs, dt, t0, args, step))
        or np.ndim(dt) != 0
    ):
        return sol
    failed = int(known(sol.failed_step))
    save = max(failed - 1, 0) // save_every
    before = failed - 1 - save * save_every  # steps from that save to the last good state
    x = sol.xs[save]
    dt, t0 = jnp.asarray(dt, x.dtype), jnp.asarray(t0, x.dtype)
    if before > 0:
        lean = RunOptions.of(save_every=before, blocks=1, start_tol=None, drift_tol=None)
        x = _run_fixed(step, x, dt, t0 + save * save_every * dt, args, before, run=lean).xs[-1]
    report = eqx.filter_jit(diagnose)(x, dt)
    if report is None:
        return sol
    solver, rows = report
    measured = "; ".join(f"{stage} stage {_residual_words(float(rel))} (bound {bound:.0e})" for stage, rel, bound in rows)
    cause = (
        f"Repeated at the last good state (step {failed - 1}), the step's sparse solves by {solver} "
        f"with G M⁻¹Gᵀ reach the relative residuals ‖b − A y‖/‖b‖: {measured}"
    )
    return _with_detail(sol, dataclasses.replace(sol.detail, cause=cause))


def _residual_words(rel: float) -> str:
    if np.isfinite(rel):
        return f"{rel:.3g}"
    return "not finite (the solve broke down: G M⁻¹Gᵀ is not positive definite there)"


def _with_gain_cause(sol: Solution, field, x0, dt, method: str) -> Solution:
    """`sol`, with `detail.cause` saying so where a failed run of a feedback field had
    h·λ_max(L∇²V)(x0) at or past the stability bound β of its explicit method (the gains,
    the bound and `geomjax.recommended_gains`). Only for a run that failed outside jit
    (status, x0 and dt known), one state and one step size."""
    status = known(sol.status)
    if (
        status is None
        or np.ndim(status) != 0
        or int(status) == OK
        or not isinstance(field, AbstractFeedbackField)
        or not is_concrete((x0, dt, field))
        or np.ndim(dt) != 0
    ):
        return sol
    try:
        check = check_gains(field, x0, float(dt), str(method), warn=False)
    except (ValueError, TypeError):
        return sol  # rates not finite at x0, or a method without a stability interval
    if check.stability_fraction < 1.0:
        return sol
    gains = np.asarray(field.gains)
    shown = f"{gains.flat[0]:.4g}" if gains.ndim == 1 and np.all(gains == gains.flat[0]) else np.array2string(gains, precision=4)
    cause = (
        f"Likely cause: the gains. With K = {shown}, h·λ_max(L∇²V) = {float(dt) * check.feedback_rate:.3g} at x0, "
        f"past the stability bound β = {check.bound:.4g} of {str(method)!r} (explicit methods need "
        f"h·λ_max < β); lower the gains by a factor ≥ {check.stability_fraction:.3g}, e.g. "
        f"geomjax.recommended_gains(field, x0, dt, {str(method)!r}) (× {check.recommended_scale:.3g}), "
        f"or build the field with geomjax.feedback_field(system, x0, dt={float(dt):.4g}, method={str(method)!r})"
    )
    return _with_detail(sol, dataclasses.replace(sol.detail, cause=cause))


def _with_detail(sol: Solution, detail) -> Solution:
    """`dataclasses.replace(sol, detail=detail)`, through the pytree: a module's `__init__`
    costs a direct `integrate` call tens of µs more."""
    children, treedef = jax.tree_util.tree_flatten(sol, is_leaf=lambda node: node is not sol)
    assert children[-1] is sol.detail  # `detail` is the last field
    return jax.tree_util.tree_unflatten(treedef, [*children[:-1], detail])


def _compared(sol: Solution, half: Solution, save_every: int, accuracy_tol) -> Solution:
    """`sol`, failed as `RESULTS.inaccurate` at the first save where its state x_h differs
    from the state x_{h/2} of `half` (the same run at dt/2) by more than
    `accuracy_tol·(1 + max|x_{h/2}|)` in max-norm, if that save comes before the run's
    own failure; later saves NaN, as after any failure."""
    saves = jnp.arange(sol.xs.shape[-2])
    diff = nan_max(jnp.abs(sol.xs - half.xs), axis=-1) / (1.0 + nan_max(jnp.abs(half.xs), axis=-1))
    checked = (sol.status == OK) | (saves * save_every < sol.failed_step)
    bad = checked & ~(diff <= accuracy_tol)  # NaN: `half` failed before this save
    first = jnp.argmax(bad)
    failed = jnp.any(bad)
    step = (first * save_every).astype(sol.failed_step.dtype)
    d = sol.detail
    detail = FailureDetail(
        jnp.where(failed, -1, d.quantity),
        jnp.where(failed, diff[first], d.value),
        jnp.where(failed, accuracy_tol, d.bound).astype(d.value.dtype),
        d.labels,
        d.note,
    )
    return dataclasses.replace(
        sol,
        xs=flag_failed(sol.xs, (failed & (saves > first))[:, None]),
        result=RESULTS.where(failed, RESULTS.inaccurate, sol.result),
        failed_step=jnp.where(failed, step, sol.failed_step),
        num_steps=jnp.where(failed, jnp.maximum(step - 1, 0), sol.num_steps),
        detail=detail,
    )


def _as_accuracy_tol(accuracy_tol, adaptive: bool):
    if accuracy_tol is None:
        return None
    if adaptive:
        raise ValueError(
            "accuracy_tol checks fixed-step runs (a method name or a step); an adaptive diffrax "
            "solver controls its own error: pass rtol and atol instead"
        )
    check_tolerance(accuracy_tol, "accuracy_tol", zero_ok=False, none_means="for no accuracy check")
    return accuracy_tol


def _as_count(value, name: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be a positive integer, got {value!r}") from None


def integrate(
    field_or_step: Callable,
    x0: Float[ArrayLike, " n"],
    *,
    dt: Float[ArrayLike, ""] | None = None,
    steps: int | None = None,
    method=None,
    save_every: int = 1,
    t0: Float[ArrayLike, ""] = 0.0,
    args=None,
    rtol: float | None = None,
    atol: float | None = None,
    max_steps: int | None = None,
    drift_tol: float | None = DRIFT_TOL,
    start_tol: float | None = START_TOL,
    throw: bool = True,
    progress: bool | str = False,
    checkpoint: bool = True,
    accuracy_tol: float | None = None,
    t1: Float[ArrayLike, ""] | None = None,
    saves: int | None = None,
) -> Solution:
    """Integrate a vector field or iterate a step map from `x0`.

    Runs `steps` steps of size `dt` in one compiled `lax.scan`, saving the state every
    `save_every` steps. Fields and steps made by geomjax carry their state in pieces (for
    T*Rⁿ the pair (q, p)) inside the loop; the state is flat at the boundary.

    A run never reports success past a failed check. Its status (`Solution.result`) is set
    at the first of:

    - a start with NaN/inf entries, or off the constraint set of the field or step
      (largest constraint residual above `start_tol·(1 + max|x0|)`): step 0;
    - a step whose own solve failed (a Newton iteration), or whose result is non-finite;
    - a save point where a constraint residual exceeds `drift_tol·(1 + max|x0|)`, or a
      first integral I differs from its initial value by more than
      `drift_tol·(1 + |I(x0)|)`. What is monitored is what the field or step keeps:
      constraints and energy for Dirac, feedback, nonholonomic fields and their methods,
      RATTLE, projection; nothing for plain callables;
    - with `accuracy_tol`, a save point where the state differs from the same run at
      dt/2 by more than `accuracy_tol·(1 + max|x_{h/2}|)` (`RESULTS.inaccurate`).

    After the first failure the state stops advancing; later saves are NaN. A feedback
    field keeps the invariants of *this run's* initial state (`at_start`), unless its
    target was pinned when it was built. `Solution.message` names what failed: for a
    drift, the quantity (by the system's names), its value at the failing save and the
    tolerance, and whether the method was the default for the field.

    What success certifies, exactly: the checks above passed — a finite start on the
    constraint set, converged and finite steps, the monitored constraints and first
    integrals within `drift_tol` at the saves. Not accuracy: a method can keep every
    monitored quantity and be far from the exact trajectory (a phase error). For that,
    `accuracy_tol` compares with the run at dt/2: for a method of order p with global
    error e_h ≈ C hᵖ, x_h − x_{h/2} ≈ (2ᵖ − 1)·e_{h/2} = (1 − 2⁻ᵖ)·e_h (Richardson), so the
    measured difference is the error of the returned x_h to within a factor
    1/(1 − 2⁻ᵖ) ∈ (1, 2] — an estimate, valid where h is in the asymptotic regime.

    **Arguments:**

    - `field_or_step`: a vector field (`geomjax.dirac_field(...)`,
      `geomjax.feedback_field(...)`, a `geomjax.TimeField(f)` with `f(t, x, args)`, a
      `diffrax.ODETerm`, or any callable `x ↦ ẋ`), or a step: a geomjax step
      (`geomjax.rattle(system)`, `geomjax.FunctionStep(fn)`, ...), or a plain callable
      `step(x, h) ↦ x_next` together with `method="step"`.
    - `x0`: initial flat state (float64).
    - `dt`: step size (the initial step for adaptive diffrax solvers).
    - `steps`: number of steps; the final time is `t0 + steps·dt`.
    - `t1`, `saves`: with a diffrax solver, instead of `steps`: run over [t0, t1] and save
      at `saves` (default 100) equally spaced intervals, t0 + k(t1 − t0)/saves. `dt` is
      then the first step only (optional with `rtol`/`atol`: diffrax chooses it), and
      `Solution.stats` counts the steps the solver took. Without `t1` a diffrax run
      covers [t0, t0 + dt·steps] and saves every `save_every`·dt.
    - `method`: for a field, the name of a one-step method (`"euler"`, `"heun"`,
      `"midpoint"`, `"rk3"`, `"rk4"`, and the implicit ones registered by geomjax:
      `geomjax.method_names()`), or any `diffrax.AbstractSolver` instance (adaptive when
      `rtol`/`atol` are given, with a `diffrax.PIDController`). Ignored for steps.
      Default (`None`): the method for the kind of field, `"euler"` for a feedback field
      (feedback Euler, the papers' integrator, for which `feedback_field(..., dt=h)`
      chooses the gains) and `"rk4"` for every other field; a failed run's message says
      when the default was used.
    - `save_every`: save every this many steps (`steps` must be a multiple).
    - `t0`: initial time; `args`: passed to time-dependent fields and steps.
    - `rtol`, `atol`, `max_steps`: for diffrax solvers.
    - `drift_tol`: relative tolerance on the monitored quantities (default `1e-2`);
      `None` turns drift monitoring off (e.g. to measure how far a method drifts).
    - `start_tol`: tolerance on the initial constraint residuals (default `1e-8`); `None`
      lets a run start off the constraint set on purpose.
    - `throw`: raise when the run failed: `geomjax.IntegrationError` (carrying the partial
      `Solution`) outside `jit`, an `equinox` runtime error inside `jit`. Under `vmap`, pass
      `throw=False` and read the per-member `solution.result`.
    - `progress`: show a progress bar (the run is split into compiled chunks). Outside
      `jit` a run of more than 2²⁰ steps always goes in compiled calls of at most 2²⁰
      steps (a longer save block in parts, checked and saved at its end), so that Ctrl-C
      and the bar act between them; the results are those of one call.
    - `checkpoint`: rematerialise each save block in reverse-mode autodiff (saves memory
      on long differentiated runs; no cost on forward runs).
    - `accuracy_tol`: check the accuracy too (default `None`: no check). The run is
      repeated at dt/2 with twice the steps and the same saves, and at the first save
      where max|x_h − x_{h/2}| > `accuracy_tol·(1 + max|x_{h/2}|)` the run fails as
      `RESULTS.inaccurate` (the states returned are those at dt). It costs the run three
      times over. Fixed-step runs only (a method name, or a step).

    **Returns:**

    A `geomjax.Solution` with `ts`, `xs`, `result` (`status`), `failed_step`, `message`
    and `stats` (the step counts).

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum()
    >>> Y = geomjax.feedback_field(model.system, model.x0, gains=50.0)
    >>> sol = geomjax.integrate(Y, model.x0, dt=1e-3, steps=1000, save_every=100)
    >>> sol.xs.shape, sol.message
    ((11, 6), 'success')
    >>> geomjax.integrate(Y, model.x0, dt=1e-3, steps=1000, save_every=100, accuracy_tol=1e-3).ok
    Array(True, dtype=bool)
    >>> coarse = geomjax.integrate(Y, model.x0, dt=1e-3, steps=1000, save_every=100, accuracy_tol=1e-5, throw=False)
    >>> coarse.status_name, int(coarse.failed_step)
    ('inaccurate', 100)
    >>> import diffrax
    >>> X = geomjax.dirac_field(model.system)
    >>> sol = geomjax.integrate(X, model.x0, t1=10.0, saves=5, method=diffrax.Tsit5(), rtol=1e-8, atol=1e-8)
    >>> [float(t) for t in sol.ts], sol.message
    ([0.0, 2.0, 4.0, 6.0, 8.0, 10.0], 'success')
    >>> int(sol.stats["num_accepted_steps"]) > 0
    True

    ```
    """
    diffrax = sys.modules.get("diffrax")  # a diffrax solver exists only if diffrax was imported
    dt0 = None
    if t1 is not None or saves is not None:
        adaptive = diffrax is not None and isinstance(method, diffrax.AbstractSolver)
        dt, dt0, steps, save_every, max_steps = _end_time_grid(
            t1, saves, dt, steps, save_every, t0, adaptive=adaptive, rtol=rtol, atol=atol, max_steps=max_steps
        )
    elif dt is None or steps is None:
        raise TypeError(
            "integrate needs dt= and steps= (the run covers t0 + k·dt, k = 0..steps), or, with a diffrax solver, "
            "t1= (the end time; the solver chooses its steps)"
        )
    steps = _as_count(steps, "steps")
    save_every = _as_count(save_every, "save_every")
    check_positive_step(dt, steps, save_every)
    check_run_options(t0, drift_tol, start_tol)
    target, is_step = _target(field_or_step, method)
    x0 = as_state(x0, target.dim)
    check_call_args(target, x0, args)
    if is_concrete(x0):
        _check_start(target, x0, start_tol)
    dt = _as_scalar(dt, x0.dtype)
    t0 = _as_scalar(t0, x0.dtype)
    dt0 = None if dt0 is None else _as_scalar(dt0, x0.dtype)
    note = ""
    if method is None and not is_step:
        method = default_method(target)
        note = _DEFAULT_METHOD_NOTES[method]
    if not is_step and diffrax is not None and isinstance(method, diffrax.AbstractSolver):
        from .adaptive import AdaptiveOptions, run_diffrax  # imports diffrax: only when a diffrax solver is passed (import time)

        _as_accuracy_tol(accuracy_tol, adaptive=True)
        run = RunOptions.of(save_every=save_every, start_tol=start_tol, drift_tol=drift_tol)
        options = AdaptiveOptions(run, steps, rtol, atol, max_steps)
        sol = run_diffrax(target, method, x0, dt, t0, args, options=options, dt0=dt0)
        sol = _explained(target, x0, sol, save_every, drift_tol, note)
    else:
        accuracy_tol = _as_accuracy_tol(accuracy_tol, adaptive=False)
        field = None if is_step else target
        if not is_step:
            if not isinstance(method, str):
                raise TypeError(
                    f"method must be a method name or a diffrax solver, got {type(method).__name__}"
                )
            target = _step_for(method, target)
        blocks = steps // save_every
        run = RunOptions.of(save_every=save_every, blocks=blocks, checkpoint=checkpoint, start_tol=start_tol,
                            drift_tol=drift_tol)
        sol = _explained(target, x0, _run_fixed(target, x0, dt, t0, args, steps, run=run, progress=progress),
                         save_every, drift_tol, note)
        if accuracy_tol is not None:
            # The same run at dt/2: the same saves, twice the steps between them.
            half = _run_fixed(target, x0, dt / 2, t0, args, 2 * steps, run=run.but(save_every=2 * save_every, blocks=blocks),
                              progress=progress)
            sol = compiled_call(_compared, (save_every, accuracy_tol), sol, half)
        status = known(sol.status)
        if status is not None and np.ndim(status) == 0 and int(status) != OK:  # a failed run outside jit
            if field is not None:
                sol = _with_gain_cause(sol, field, x0, dt, method)
            sol = _with_linear_cause(sol, target, dt, t0, args, save_every)
    if throw:
        sol = raise_if_failed(sol)
    return sol
