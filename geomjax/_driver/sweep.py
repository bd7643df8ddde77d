"""`geomjax.sweep`: one method over a batch of initial states × parameters × gains.

A sweep builds every member's field or step and initial state from the member's values
(`build(**member)`, under `equinox.filter_vmap`), stacks them into one `BatchedStep` and
runs the fixed-step driver of `geomjax.integrate` on the whole batch: the same loop, the
same checks, one status per member. Members are processed in chunks that fit in memory,
each chunk split over the given devices.
"""

import inspect
import math
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._monitored import DRIFT_TOL, START_TOL
from .._step.methods import build_step
from .._validate import as_state, check_call_args, check_positive_step, check_run_options, is_concrete
from .batched import batch_members, holds_member_values, reachable_tracers
from .common import RunOptions, begin, compiled_call, nan_max
from .grid import as_grid
from .integrate import _as_count, _as_scalar, _run_fixed, _target, _whole_run, default_method, runs_whole
from .loop_choice import auto_loop, step_profile
from .sweep_result import SweepResult
from .._status import known_code

#: Members per compiled chunk when `chunk_size` is not given.
DEFAULT_CHUNK = 1 << 20
# Below this many members a GPU is slower than the CPU: a GPU step costs a kernel launch
# whatever the batch (benchmarks/sweep_throughput.py; docs/performance.md).
_GPU_MIN_MEMBERS = 4096
# Layout name ↦ (member axis, carried as rows): `batched.py`.
_LAYOUTS = {"batch": (0, False), "component": (-1, True), "component-pieces": (-1, False)}


def _platform(devices) -> str:
    platform = devices[0].platform if devices else jax.default_backend()
    return "cpu" if platform == "cpu" else "gpu"


def _as_devices(devices):
    if devices is None:
        return None
    if isinstance(devices, jax.Device):
        return [devices]
    if isinstance(devices, str):
        return jax.devices(devices)
    devices = list(devices)
    if not devices or not all(isinstance(d, jax.Device) for d in devices):
        raise TypeError("devices must be a jax.Device, a platform name ('cpu', 'gpu') or a list of jax.Device")
    return devices


def _split_build(out):
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TypeError(
            "build(**member) must return a pair (field_or_step, x0): the member's vector field "
            f"(or step) and its initial state; got {type(out).__name__}"
        )
    return out


def _check_names(build, member, grid):
    try:
        inspect.signature(build).bind(**member)
    except TypeError as err:
        raise TypeError(
            f"build could not be called with the swept names {list(grid.names)} as keywords "
            f"(build(**member)): {err}"
        ) from None
    except ValueError:  # no signature to read (a builtin): the call will tell
        pass


# Probes that passed, by (build, method, layout, unroll, platform, the member's shapes and dtypes): a
# later sweep of the same kind skips the trace (a few milliseconds, more for big systems).
_PROBED: dict = {}
_MAX_PROBED = 256


# Kinds of sweep whose build closes over the member's values (they run in one vmap).
_CLOSES_OVER_MEMBER: set = set()


def _known(cache: set, key) -> bool:
    try:
        return key in cache
    except TypeError:  # unhashable
        return False


def _remember(cache: set, key) -> None:
    try:
        if len(cache) < _MAX_PROBED:
            cache.add(key)
    except TypeError:
        pass


def _probe(probe, member, key) -> tuple:
    """Trace `probe` on one member (abstractly) once per `key`: whether build gives a step,
    and the labels of the monitored quantities."""
    signature = tuple((name, jnp.shape(v), jnp.result_type(v)) for name, v in member.items())
    try:
        key = (*key, signature)
        if key in _PROBED:
            return _PROBED[key]
    except TypeError:  # an unhashable build: probed every time
        key = None
    found = []
    eqx.filter_eval_shape(lambda m: found.append(probe(m)), member)
    if key is not None and len(_PROBED) < _MAX_PROBED:
        _PROBED[key] = found[0]
    return found[0]


def _one_step_profile(step, x0, dt, t0, args):
    """Whether one member's step reports a constant status (no solve that can fail) and
    the `step_profile` of its `advance`, read off a trace from `x0` (nothing is computed)."""
    found = []

    def one(x0, dt, t0):
        target, (z0, _), _ = begin(step, x0, dt, None, None, t0, args)

        def advance(z):
            z1, result = target.advance(t0, z, dt, args)
            found.append(known_code(result) == 0)
            return z1

        found.append(step_profile(advance, z0))

    jax.eval_shape(one, x0, dt, t0)
    return found[0], found[1]


def _step_of(method, target):
    """The step of `method` for the field `target` (`method=None`: `integrate`'s default for
    that field, `default_method`)."""
    return build_step(default_method(target) if method is None else method, target)


def _maker(build, method, is_step):
    """member values ↦ (that member's step, its x0)."""

    def make(member):
        target, x0 = _split_build(build(**member))
        target, _ = _target(target, method)
        target = target if is_step else _step_of(method, target)
        return target, jnp.asarray(x0, jnp.float64)

    return make


def _batch(build, members, method, is_step, layout, size):
    """The chunk's members as one `BatchedStep` and their initial states as (n, B)."""
    axis, rows = _LAYOUTS[layout]
    step, x0 = batch_members(_maker(build, method, is_step), members, axis, size, rows)
    # Values traced outside the sweep that build closes over (a parameter of an enclosing
    # jax.grad or jit) may stay in the step: the driver takes them as inputs of its
    # derivatives. Values of the members may not.
    if holds_member_values(eqx.filter(step, eqx.is_array, inverse=True), outer=reachable_tracers(build)):
        raise _ClosesOverMember
    return step, x0


class _ClosesOverMember(Exception):
    """`build` returned functions that close over a member's values (e.g. a lambda using a
    swept parameter): they cannot leave the `vmap` that built them."""


def _runs_in_vmap(build, members, times, making, run: RunOptions):
    """Each member built and run inside one `vmap` (batch-major): what works when `build`
    closes over the member's values. `times` is `(dt, t0, args)`, `making` `(method,
    is_step)`, `run` monitored. Returns `(ts, outputs)` as `_chunk_outputs`."""
    make = _maker(build, *making)

    def one(member):
        target, x0 = make(member)
        sol, inv, res = _whole_run(target, x0, *times, run)
        return sol, _relative_errors(inv, res)

    sol, (inv_err, res_err) = jax.vmap(one)(members)
    return sol.ts[0], (sol.xs, sol.status, sol.failed_step, sol.num_steps, inv_err, res_err)


def _chunk_outputs(step, sol, monitored=None):
    """The batched run's outputs member-major: `(xs, status, failed_step, num_steps,
    invariant errors, constraint errors)`, each with the members first. `monitored`: the
    invariants and residuals at the saves, if the run returned them."""
    inv, res = jax.vmap(step.monitored)(sol.xs) if monitored is None else monitored
    inv_err, res_err = _relative_errors(inv, res)
    first = lambda a, axis: jnp.moveaxis(a, axis, 0)
    return first(sol.xs, 2), sol.status, sol.failed_step, sol.num_steps, first(inv_err, 2), first(res_err, 1)


def _sweep_chunk(build, members, times, making, run: RunOptions, grid_shape=None):
    """One chunk in one compiled program: members built (`making` = `(method, is_step,
    layout, size)`), run (`times` = `(dt, t0, args)`, `run` monitored), checked and laid
    out."""
    step, x0 = _batch(build, members, *making)
    sol, *monitored = _whole_run(step, x0, *times, run)
    outputs = _chunk_outputs(step, sol, monitored)
    if grid_shape is not None:  # the chunk is the whole grid: shaped like it here, not after
        outputs = tuple(a.reshape(grid_shape + a.shape[1:]) for a in outputs)
    return sol.ts, outputs


def _in_one_program(steps, save_every, progress, values) -> bool:
    """Whether a chunk runs as one compiled program: no progress bar, and not split into
    chunks of steps by the driver (which it is only outside jit, past 2²⁰ steps)."""
    if not is_concrete(values):
        return True
    return not progress and runs_whole(steps // save_every, save_every, False)


def _relative_errors(inv, res):
    """From the invariants (saves, k, …) and residuals (saves, r, …) at the saves (the
    start first): the relative drift |I − I₀| / (1 + |I₀|), (saves, k, …), and the largest
    |residual|, (saves, …); … is B for a batch, nothing for one run."""
    inv_err = jnp.abs(inv - inv[:1]) / (1.0 + jnp.abs(inv[:1]))
    res_err = nan_max(jnp.abs(res), axis=1) if res.shape[1] else jnp.zeros(res.shape[:1] + res.shape[2:], res.dtype)
    return inv_err, res_err


def _placed(members, devices, size):
    if devices is None:
        return members
    if len(devices) == 1:
        return jax.device_put(members, devices[0])
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.asarray(devices), ("members",))
    sharding = NamedSharding(mesh, PartitionSpec("members"))

    def put(a):
        if not is_concrete(a):
            return jax.lax.with_sharding_constraint(a, sharding)
        host = np.asarray(a)
        # Each process supplies the shards on its own devices (multi-host as one host).
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree_util.tree_map(put, members)


def _gathered(tree):
    if jax.process_count() == 1:
        return tree
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


def sweep(
    build,
    grid,
    *,
    dt,
    steps: int,
    method=None,
    save_every: int | None = None,
    t0=0.0,
    args=None,
    drift_tol: float | None = DRIFT_TOL,
    start_tol: float | None = START_TOL,
    layout: str = "auto",
    unroll: int | str = "auto",
    chunk_size: int | None = None,
    devices=None,
    progress: bool | str = False,
    checkpoint: bool = True,
) -> SweepResult:
    """Run one method over every member of a grid of parameters, gains and initial states.

    Each member is one run of `geomjax.integrate`: `build(**member)` returns the member's
    vector field (or step) and initial state, and the run has its own status (its start
    checked against the constraint set, every step for a failed solve or a non-finite
    state, every save for drift of the monitored constraints and first integrals). A
    failed member freezes and reports the step and the cause; the others are unaffected.

    All members advance together in one compiled loop (the driver of `integrate` on a
    batch): `B` members of `n` scalars each are laid out either batch-major, (B, n), or
    component-major, where the loop carries one vector of the B members' values per
    scalar of the state and the derived field's scalar operations are vector operations
    on them (the GPU layout).

    **Arguments:**

    - `build`: `build(**member) ↦ (field_or_step, x0)`, called with one value per swept
      name (traced: under `vmap`, so it must be a JAX function of them).
    - `grid`: the members, `geomjax.product(...)` of axes and `geomjax.zipped(...)`
      groups, or a dict `{name: values}` (their product).
    - `dt`, `steps`, `method`, `t0`, `args`, `drift_tol`, `start_tol`, `checkpoint`: as in
      `geomjax.integrate`, shared by all members (they fix the compiled loop: a sweep over
      step sizes is one sweep per step size).
    - `save_every`: save every this many steps (default: only the final state).
    - `layout`: `"batch"`, `"component"` (one (B,) array per scalar of the state in the
      loop), `"component-pieces"` (the pieces as (n, B) arrays) or `"auto"`: batch-major
      on the CPU; on a GPU `"component"`, or `"component-pieces"` for explicit steps with
      transcendental functions (docs/performance.md, "Sweeps on a GPU", says what was measured).
    - `unroll`: steps per iteration of the compiled loop (`"auto"`: 1 on the CPU; on a
      GPU by the step's cost: 8 for a cheap explicit step such as Euler on a small field,
      4 for a few evaluations, 1 for RK4-sized steps and for steps with a solve).
    - `chunk_size`: members per compiled chunk (default all, up to 2²⁰); the last chunk is
      padded to the same size so that every chunk reuses one compilation.
    - `devices`: a device, a platform name or a list of devices; with several, each chunk
      is sharded over them (`jax.sharding`, one mesh axis `"members"`), also across hosts
      after `jax.distributed.initialize()`. Default: JAX's default device.
    - `progress`: show a progress bar over chunks and steps.

    **Returns:**

    A `geomjax.SweepResult`: `xs` (`grid.shape + (saves, n)`), `ts`, `status`,
    `failed_step`, `invariant_error`, `constraint_error`, with `heatmap`, `summary` and
    `save`.

    Example:

    ```python
    >>> import numpy as np, geomjax
    >>> def member(g, gain):
    ...     model = geomjax.models.spherical_pendulum(g=g)
    ...     return geomjax.feedback_field(model.system, model.x0, gains=gain), model.x0
    >>> grid = geomjax.product(g=[1.0, 9.81], gain=[10.0, 100.0, 1e4])
    >>> result = geomjax.sweep(member, grid, dt=1e-3, steps=500)
    >>> result.status.shape, result.summary()
    ((2, 3), '3 of 6 members succeeded; 3 diverged')
    >>> result.message(1, 2)[:45]
    'failed at step 8: the state became non-finite'

    ```
    """
    steps = _as_count(steps, "steps")
    save_every = steps if save_every is None else _as_count(save_every, "save_every")
    check_positive_step(dt, steps, save_every)
    check_run_options(t0, drift_tol, start_tol)
    grid = as_grid(grid)
    devices = _as_devices(devices)
    platform = _platform(devices)
    if layout not in ("auto", *_LAYOUTS):
        raise ValueError(f"layout must be 'batch', 'component', 'component-pieces' or 'auto', got {layout!r}")
    if unroll != "auto":
        unroll = _as_count(unroll, "unroll")
    if chunk_size is None:
        chunk_size = min(grid.size, DEFAULT_CHUNK)
    chunk_size = min(_as_count(chunk_size, "chunk_size"), grid.size)
    n_devices = 1 if devices is None else len(devices)
    chunk_size = n_devices * math.ceil(chunk_size / n_devices)
    if platform == "gpu" and grid.size < _GPU_MIN_MEMBERS:
        warnings.warn(
            f"a sweep of {grid.size} members on a GPU: a GPU step costs about 7 µs whatever the "
            "batch (one kernel launch per loop iteration), so below a few thousand members the "
            "CPU is faster; pass devices='cpu'",
            stacklevel=2,
        )

    first = {name: v[0] for name, v in grid.take(np.array([0])).items()}
    _check_names(build, first, grid)
    dt = _as_scalar(dt, jnp.float64)
    t0 = _as_scalar(t0, jnp.float64)

    def probe(member):
        # One member traced (abstract values): structural errors (a wrong build, a bad
        # method, a state of the wrong shape or dtype) are raised here, in words, before
        # anything compiles; value checks are left to each member's status.
        target, x0 = _split_build(build(**member))
        target, is_step = _target(target, method)
        if not is_step and not (method is None or isinstance(method, str)):
            raise TypeError(f"sweep takes a method name (a fixed-step method), got {type(method).__name__}")
        x0 = as_state(x0, target.dim, "x0 of the first member")
        check_call_args(target, x0, args)
        step = target if is_step else _step_of(method, target)
        choice = (layout, unroll)
        if "auto" in choice:
            constant, profile = (True, None) if platform == "cpu" else _one_step_profile(step, x0, dt, t0, args)
            picked = auto_loop(platform, constant, profile, layout)
            choice = (picked[0], picked[1] if unroll == "auto" else unroll)
        resolved = method if (is_step or method is not None) else default_method(target)
        return is_step, step.quantity_labels(x0), choice, resolved

    kind = (build, method, layout, unroll, platform, jax.tree_util.tree_structure(args))
    is_step, labels, (layout, unroll), method = _probe(probe, first, kind)
    pieces = []
    run = RunOptions.of(save_every=save_every, checkpoint=checkpoint, unroll=unroll, start_tol=start_tol, drift_tol=drift_tol)
    monitored = run.but(blocks=steps // save_every, monitored=True)
    starts = list(range(0, grid.size, chunk_size))
    for c, start in enumerate(starts):
        index = np.arange(start, start + chunk_size)
        index = np.minimum(index, grid.size - 1)  # the last chunk padded with its last member
        members = _placed(grid.take(index), devices, chunk_size)
        label = progress
        if progress and len(starts) > 1:
            label = f"{progress if isinstance(progress, str) else 'sweep'} (chunk {c + 1}/{len(starts)})"
        try:
            if _known(_CLOSES_OVER_MEMBER, kind):
                raise _ClosesOverMember
            if _in_one_program(steps, save_every, progress, (members, dt, t0, args)):
                whole = grid.shape if chunk_size == grid.size and n_devices == 1 else None
                making = (method, is_step, layout, chunk_size)
                ts, piece = compiled_call(_sweep_chunk, (making, monitored, whole), build, members, (dt, t0, args))
            else:  # a long run or a progress bar: the driver's chunks of steps
                batched, x0 = compiled_call(_batch, (method, is_step, layout, chunk_size), build, members)
                sol = _run_fixed(batched, x0, dt, t0, args, steps, run=run, progress=label)
                ts, piece = sol.ts, compiled_call(_chunk_outputs, (), batched, sol)
        except _ClosesOverMember:
            _remember(_CLOSES_OVER_MEMBER, kind)
            if layout != "batch":
                warnings.warn(
                    "build returns functions that close over swept values (a lambda or inner "
                    "function using a swept name): they cannot leave the vmap that built them, so "
                    "this sweep runs batch-major, each member built and run inside one vmap. For the "
                    "component-major layout pass swept values as pytree leaves: "
                    "jax.tree_util.Partial(f, value) or a field of an equinox Module",
                    stacklevel=2,
                )
            ts, piece = compiled_call(_runs_in_vmap, ((method, is_step), monitored), build, members, (dt, t0, args))
        pieces.append(_gathered(piece))
    return SweepResult._from_chunks(
        grid, pieces, ts, steps=steps, save_every=save_every, dt=dt, t0=t0, method=method,
        layout=layout, unroll=unroll, build=build, drift_tol=drift_tol, start_tol=start_tol, devices=n_devices,
        quantity_labels=[list(labels[0]), list(labels[1])],
    )
