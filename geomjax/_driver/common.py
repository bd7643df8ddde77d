"""What the fixed-step and the adaptive (diffrax) drivers share: compiled programs, the
start check, the run's record and monitor, and the `Solution` built from them.

A run's bookkeeping is one int64 array `record = (steps taken, first failed step or −1,
status code)`, indexed by `STEPS`, `FAILED_STEP`, `STATUS`.
"""

import dataclasses
import functools
import weakref

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

from .._monitored import AbstractMonitored
from .._status import RESULTS, code_int, from_code
from .._validate import _TRACE_ERRORS, at_top_level
from . import hoisting
from .solution import FailureDetail, Solution


@eqx.filter_jit
def _compiled(program, options, values, *trees):
    return program(*hoisting.restore_trees(trees, values), *options)


def compiled_call(program, options: tuple, *trees):
    """`program(*trees, *options)`, compiled by `equinox.filter_jit` once per static
    structure of its inputs: array leaves (jax or numpy arrays, tracers) of `trees` and
    of `options` are traced, everything else (the program, functions, Python numbers)
    is static and part of JAX's cache key. Functions are keyed by their code and what
    they close over, with closed-over float numbers hoisted out as arguments
    (`hoisting`): two closures of the same code over different numbers share a program.
    Works inside jit/vmap/grad; values a function closes over are traced by the
    enclosing transformation, not baked in. Whatever changes a trace is an argument: a
    field's or step's static options (`simplify`) are part of its static structure, so
    of the key.
    """
    hoisted, values = hoisting.hoist_trees(trees)
    if not values:
        return _compiled(program, options, (), *trees)
    try:
        return _compiled(program, options, values, *hoisted)
    except _TRACE_ERRORS:  # a user function needs a closed-over number as a Python value
        hoisting.refuse(jax.tree_util.tree_leaves(hoisted))
        return _compiled(program, options, (), *trees)


class _StaticPart:
    """The static part of a `compiled_call_on` call, a key of JAX's cache: equal (and of
    equal hash, computed once) for objects equal in everything but their arrays."""

    __slots__ = ("parts", "digest")

    def __init__(self, parts: tuple, digest: int):
        self.parts, self.digest = parts, digest

    def __hash__(self):
        return self.digest

    def __eq__(self, other):
        if self is other:
            return True
        return isinstance(other, _StaticPart) and self.digest == other.digest and self.parts == other.parts


@functools.partial(jax.jit, static_argnums=0)
def _compiled_on(static: _StaticPart, dynamic, values, *arrays):
    program, options, treedef, leaves = static.parts
    it = iter(dynamic)
    leaves = hoisting.restore([next(it) if leaf is None else leaf for leaf in leaves], values)
    return program(jax.tree_util.tree_unflatten(treedef, leaves), *arrays, *options)


def compiled_call_on(program, options: tuple, obj, *arrays):
    """`compiled_call(program, options, obj, *arrays)` for arrays (jax or NumPy) and an
    object `obj` (a field or step) that is called again: outside transformations, the
    split of `obj` into its arrays and its static part is made once per object and kept
    with it (`memo_of`), and the call goes straight to `jax.jit`, whose cache is keyed by
    the static part by value (an equal object, or the same one, shares the program). Saves
    equinox's partition of the inputs on every call: about 0.1 ms per direct
    `integrate` call (`benchmarks/loop_overhead.py`). Elsewhere: `compiled_call`."""
    memo = memo_of(obj) if at_top_level() and all(eqx.is_array(a) for a in arrays) else None
    if memo is None:
        return compiled_call(program, options, obj, *arrays)
    key = ("compiled", program, options)
    found = memo.get(key)
    if found is None:
        leaves, treedef = jax.tree_util.tree_flatten(obj)
        dynamic = [leaf for leaf in leaves if eqx.is_array(leaf)]
        hoisted, values = hoisting.hoist([None if eqx.is_array(leaf) else leaf for leaf in leaves])
        parts = (program, options, treedef, tuple(hoisted))
        try:
            static = _StaticPart(parts, hash(parts))
        except TypeError:  # an unhashable static leaf: equinox's path says what is wrong
            return compiled_call(program, options, obj, *arrays)
        found = memo[key] = (static, dynamic, values)
    try:
        return _compiled_on(found[0], found[1], found[2], *arrays)
    except _TRACE_ERRORS:
        if not found[2]:
            raise
        # a user function needs a closed-over number as a Python value: keep it in the key
        hoisting.refuse(found[0].parts[3])
        del memo[key]
        return compiled_call_on(program, options, obj, *arrays)


# What is known of an object (a field or step), per object: {id: (weak reference, {what:
# value})}, dropped with the object. Fields and steps are immutable, so what was derived
# from one holds as long as it lives.
_MEMOS: dict = {}


def memo_of(obj) -> dict | None:
    """The memo of `obj` (made empty the first time), or None if `obj` cannot be weakly
    referenced."""
    entry = _MEMOS.get(id(obj))
    if entry is not None and entry[0]() is obj:
        return entry[1]

    def forget(ref, i=id(obj), memos=_MEMOS):  # (the dict itself: at exit the global is gone)
        if memos.get(i, (None,))[0] is ref:
            del memos[i]

    try:
        ref = weakref.ref(obj, forget)
    except TypeError:
        return None
    memo: dict = {}
    _MEMOS[id(obj)] = (ref, memo)
    return memo


def known_memo(obj) -> dict | None:
    """The memo of `obj` if it has one (nothing made)."""
    entry = _MEMOS.get(id(obj))
    return entry[1] if entry is not None and entry[0]() is obj else None


def nan_max(x, axis):
    """`jnp.max` that is NaN wherever a reduced entry is NaN. (XLA's CPU reduction drops
    NaNs in reductions of a few thousand entries: JAX 0.10.2 gives max([0, NaN, …]) = 0.)"""
    return jnp.where(jnp.any(jnp.isnan(x), axis=axis), jnp.nan, jnp.max(x, axis=axis))


OK = code_int(RESULTS.successful)

# The loop's bookkeeping (steps taken, first failed step, status) rides in the carry as
# one int64 array: XLA's CPU runtime runs a loop whose carry holds three or more separate
# scalars several times slower (the spherical pendulum; benchmarks/loop_overhead.py).
STEPS, FAILED_STEP, STATUS = 0, 1, 2


class RunOptions(eqx.Module):
    """How a fixed-step run goes: the options of the time-stepping loop, one value through
    the driver, sweeps and the batched runs (static where they shape the program).

    - `save_every`: steps per save block; `blocks`: save blocks in this compiled call.
    - `checkpoint`: rematerialise each block's steps in reverse mode.
    - `unroll`: steps per iteration of the fast loop (sweeps on a GPU).
    - `start_tol`, `drift_tol`: the start check and the monitoring of the invariants
      and constraints (None: off). Python numbers are static; arrays are traced.
    - `monitored`: also return the monitored values at every save.
    """

    save_every: int = eqx.field(static=True, default=1)
    blocks: int = eqx.field(static=True, default=1)
    checkpoint: bool = eqx.field(static=True, default=True)
    unroll: int = eqx.field(static=True, default=1)
    start_tol: float | None = None
    drift_tol: float | None = None
    monitored: bool = eqx.field(static=True, default=False)

    @staticmethod
    def of(**options) -> "RunOptions":
        """`RunOptions(**options)`, the same object for the same hashable options (made
        once: building a module costs a direct `integrate` call ~30 µs, and the same
        object is found at once in the compiled-program tables; `loop_overhead.py`)."""
        key = tuple(sorted(options.items()))
        try:
            found = _RUN_OPTIONS.get(key)
        except TypeError:  # a traced tolerance: not a key
            return RunOptions(**options)
        if found is None:
            found = RunOptions(**options)
            if len(_RUN_OPTIONS) < 256:
                _RUN_OPTIONS[key] = found
        return found

    def but(self, **changes) -> "RunOptions":
        """These options with `changes` (`RunOptions.of`)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return RunOptions.of(**{**fields, **changes})


# `RunOptions.of`'s objects, by their options.
_RUN_OPTIONS: dict = {}


class Monitor(eqx.Module):
    """The tolerances of one run and the reference values they are measured from.

    Reductions run over axis 0 (the entries of a flat state, of the invariants, of the
    residuals), so a batch of runs laid out (entries, members) gets one code per member.
    """

    invariants0: jax.Array
    scale: jax.Array
    drift_tol: float | None = eqx.field(static=True)

    def drift_code(self, target: AbstractMonitored, x, values=None):
        """0, or the code of the first monitored quantity out of tolerance at `x`
        (`values`: `target.monitored(x)` when the caller has it)."""
        if self.drift_tol is None:
            return jnp.asarray(OK, jnp.int64)
        code = jnp.asarray(OK, jnp.int64)
        inv, res = target.monitored(x) if values is None else values
        if inv.shape[0]:
            err = jnp.abs(inv - self.invariants0) / (1.0 + jnp.abs(self.invariants0))
            code = jnp.where(jnp.max(err, axis=0) > self.drift_tol, code_int(RESULTS.invariant_drift), code)
        if res.shape[0]:
            bad = jnp.max(jnp.abs(res), axis=0) > self.drift_tol * self.scale
            code = jnp.where(bad, code_int(RESULTS.constraint_violation), code)
        # NaN comparisons are False: a NaN monitored value is a failure too.
        finite = jnp.all(jnp.isfinite(inv), axis=0) & jnp.all(jnp.isfinite(res), axis=0)
        return jnp.where(finite, code, code_int(RESULTS.constraint_violation))


def start_record(target: AbstractMonitored, x0, dt, start_tol, drift_tol, t0=0.0):
    """The start record (status at step 0) and the run's monitor."""
    scale = 1.0 + jnp.max(jnp.abs(jnp.where(jnp.isfinite(x0), x0, 0.0)), axis=0)
    code = jnp.where(jnp.all(jnp.isfinite(x0), axis=0), OK, code_int(RESULTS.nonfinite_start))
    # A concrete dt and t0 were checked before the run; traced ones (parameters of a
    # jitted or vmapped function) are checked here.
    dt_ok = jnp.isfinite(dt) & (dt > 0) & jnp.isfinite(t0)
    code = jnp.where(code == OK, jnp.where(dt_ok, OK, code_int(RESULTS.invalid_step_size)), code)
    inv, res = target.monitored(x0)
    if start_tol is not None:
        if res.shape[0]:
            off = ~(nan_max(jnp.abs(res), axis=0) <= start_tol * scale)
            code = jnp.where(code == OK, jnp.where(off, code_int(RESULTS.off_constraint_set), OK), code)
    code = jnp.asarray(code, jnp.int64)
    record = jnp.stack([jnp.zeros_like(code), jnp.where(code == OK, -1, 0), code])
    monitor = Monitor(inv, scale, drift_tol)
    return record, monitor


def begin(target, x0, dt, start_tol, drift_tol, t0=0.0, args=None):
    """The target specialised to this run, the loop carry at step 0 and the monitor.

    A step's `start` may extend the pieces with what it carries from step to step (a
    multistep method's history, computed by its starter)."""
    z0 = target.split(x0)
    target = target.at_start(z0)
    record, monitor = start_record(target, x0, dt, start_tol, drift_tol, t0)
    start = getattr(target, "start", None)
    if start is not None:
        z0 = start(t0, z0, dt, args)
    return target, (z0, record), monitor



def solution_from_record(ts, xs, record, dt, t0):
    failed_step = record[FAILED_STEP]
    code = record[STATUS]
    num_steps = jnp.where(failed_step >= 0, jnp.maximum(failed_step - 1, 0), record[STEPS])
    result = from_code(code)
    return Solution(ts, xs, result, failed_step, dt, t0, num_steps, {"num_steps": num_steps})


# `no_detail`'s results, per dtype and note: made once (an immutable module of three
# constants; made anew, its conversions and construction cost a direct `integrate` call
# tens of µs; `benchmarks/loop_overhead.py`).
_NO_DETAIL: dict = {}


def no_detail(dtype, note: str = "") -> FailureDetail:
    """The `FailureDetail` of a run with nothing measured to report."""
    key = (jnp.dtype(dtype), note)
    detail = _NO_DETAIL.get(key)
    if detail is None:
        with jax.ensure_compile_time_eval():  # concrete even when first made inside a trace
            nan = jnp.asarray(jnp.nan, key[0])
            detail = FailureDetail(jnp.asarray(-1, jnp.int64), nan, nan, note=note)
        if len(_NO_DETAIL) < 64:
            _NO_DETAIL[key] = detail
    return detail


def drift_detail(target: AbstractMonitored, x0, sol: Solution, save_every: int, drift_tol: float, note: str = ""):
    """`sol.detail` for a run of `target` from `x0` saved every `save_every` steps: at the
    save where drift was detected (step `sol.failed_step`, whose state `sol.xs` keeps),
    the monitored quantity furthest beyond its tolerance, by the ratio of its value to
    its bound; for `constraint_violation`, a residual or a non-finite quantity.
    Recomputes the monitored values there (once per run, after it)."""
    code = sol.status
    x0 = lax.stop_gradient(x0)  # a diagnostic: nothing here is differentiated
    target = target.at_start(target.split(x0))
    invariant_labels, residual_labels = target.quantity_labels(x0)
    inv0, _ = target.monitored(x0)
    scale = 1.0 + jnp.max(jnp.abs(jnp.where(jnp.isfinite(x0), x0, 0.0)))
    save = jnp.clip(sol.failed_step // save_every, 0, sol.xs.shape[0] - 1)
    inv, res = target.monitored(lax.stop_gradient(sol.xs[save]))
    values = jnp.concatenate([jnp.abs(inv - inv0) / (1.0 + jnp.abs(inv0)), jnp.abs(res)])
    if not values.shape[0]:
        return no_detail(x0.dtype, note)
    bounds = jnp.concatenate([jnp.full(inv.shape, drift_tol), jnp.full(res.shape, drift_tol * scale)])
    is_residual = jnp.arange(values.shape[0]) >= inv.shape[0]
    finite = jnp.isfinite(values)
    drifted = code == code_int(RESULTS.invariant_drift)
    candidate = jnp.where(drifted, ~is_residual, is_residual | ~finite)
    ratio = jnp.where(candidate, jnp.where(finite, values / bounds, jnp.inf), -jnp.inf)
    index = jnp.argmax(ratio)
    found = (drifted | (code == code_int(RESULTS.constraint_violation))) & jnp.any(candidate)
    return FailureDetail(
        jnp.where(found, index, -1).astype(jnp.int64),
        jnp.where(found, values[index], jnp.nan),
        jnp.where(found, bounds[index], jnp.nan),
        (invariant_labels, residual_labels),
        note,
    )
