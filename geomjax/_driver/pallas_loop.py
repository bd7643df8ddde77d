"""A save block of an explicit method as one Pallas kernel, the members' states in registers.

`geomjax.sweep(..., loop="pallas")` runs each save block of a component-major batch
(`BatchedStep` with `axis=-1`) of a method whose status is a constant (the explicit
methods: `euler`, `heun`, `midpoint`, `rk3`, `rk4`, `geomjax.explicit_rk`) as one
`pallas_call` instead of a `lax.scan`. It computes what the scan of the driver's fast loop
(`_fast_steps` in `integrate.py`) computes for such a step: for each member, from the
pieces z₀ and the member's step count k₀ at the start of the block,

    z_{i+1} = Φ_h(t₀ + (k₀ + i)·h, z_i),   i = 0, …, block − 1,
    mark    = Σ_{i=0}^{block} 0·(Σ_j z_i[j]),

so `mark` is 0 while every state of the block is finite and NaN from the first non-finite
one on. Everything else (the failure check, the exact recomputation of a failed block that
finds each member's failed step and status, the saves) stays the driver's.

Kernel layout. The grid is 1-D over tiles of `tile` members (a power of two; B is padded
up to a multiple of it by repeating the last member, and the padding is dropped). Every
per-member array (each scalar row of each piece: a (3, B) piece is 3 rows of (B,); each
per-member leaf of the step; k₀; h or t₀ when they are per member) enters as a 1-D row
blocked by tile, the shared arrays (shared leaves of the step, of `args`, the constants
the step's code closes over) whole. Inside, the rows are restacked into the tile's pieces,
the step is the same `BatchedStep` rebuilt on the tile (so the members are advanced by the
very vmap the scan uses) and a `lax.fori_loop` over the block's steps carries the pieces
and the mark as values, not refs: nothing is read from or written to memory between
steps. The kernel's code is traced once outside the kernel (`jax.make_jaxpr`), so that
constants the step closes over (a tableau's weights) become inputs: a Pallas kernel may
not capture arrays.

Platforms. On CUDA and ROCm the kernel is compiled (`interpret=False`, Pallas' default GPU
lowering); on every other platform it runs in Pallas' interpret mode (a `jax.jit` of a
loop over the grid whose body is the kernel as JAX code), which makes it testable on the
CPU. The choice is made when the program is lowered (`lax.platform_dependent`), so a
GPU machine running a sweep on `devices="cpu"` interprets.

What was verified and what was not: on the CPU (interpret mode) the kernel reproduces the
scan loop to round-off (tests/test_pallas_loop.py: spherical pendulum and knife edge
feedback fields, Euler and RK4, diverging members, member counts that are not multiples
of the tile). The GPU lowering was not run (no GPU was available when this was written).
It was written for it (float64 throughout, 1-D power-of-two blocks, no gathers in the
kernel, a loop with `unroll=1`, which the Triton lowering of `fori_loop` requires), but
the step's own code inside the kernel makes (n, tile) intermediates (stacking the rows
into pieces, the vmapped field); Triton wants power-of-two sizes for every array, so a
piece of 3 or 6 rows may not lower there.
"""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.extend.core import ClosedJaxpr, jaxpr_as_fun

from .._validate import is_concrete
from .batched import BatchedStep
from .common import OK, begin

#: Members per program of the kernel (at most; smaller batches use the next power of two).
DEFAULT_TILE = 128


def constant_status(step, t, z, h, args) -> bool:
    """Whether `step.advance(t, z, h, args)` reports `successful` as a constant, read off
    a trace of it (nothing is computed): true of explicit steps, false of steps with a
    solve (implicit Runge–Kutta, RATTLE, Dirac steps), whose status is a traced value."""
    codes = []

    def probe(t, z, h):
        _, result = step.advance(t, z, h, args)
        codes.append(result._value if is_concrete(result._value) else None)

    jax.eval_shape(probe, t, z, h)
    return codes[0] is not None and int(np.asarray(codes[0])) == OK


def check_pallas_loop(step, x0, dt, t0, args, layout: str) -> None:
    """Raise a `ValueError`, in words, when a sweep cannot run `loop="pallas"`: a
    batch-major layout, or a method whose status is not a constant (checked on one member,
    `step` from the flat state `x0`, as the driver starts it)."""
    if layout != "component":
        raise ValueError(
            f"loop='pallas' runs component-major batches (every scalar of the state a row over "
            f"the members); got layout={layout!r}: pass layout='component' (or 'auto'), or "
            "loop='scan' for a batch-major sweep"
        )
    found = []

    def probe(x0, dt, t0):
        target, (z0, _), _ = begin(step, x0, dt, None, None, t0, args)
        found.append(constant_status(target, t0, z0, dt, args))

    jax.eval_shape(probe, x0, dt, t0)
    if not found[0]:
        raise ValueError(
            f"loop='pallas' needs an explicit method (a step whose status is a constant), but "
            f"{type(step).__name__}'s status is computed at every step (a solve that can fail: an "
            "implicit method, RATTLE, a Dirac step); use loop='scan' for it, or an explicit method "
            "('euler', 'heun', 'midpoint', 'rk3', 'rk4', geomjax.explicit_rk)"
        )


def _to_rows(leaf, axis):
    """A per-member array (members along `axis`) as its rows of one entry over the members,
    and the shape of one member's entries."""
    moved = jnp.moveaxis(leaf, axis, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    return [flat[j] for j in range(flat.shape[0])], moved.shape[:-1]


def _from_rows(rows, shape, dtype, size):
    """The inverse of `_to_rows` for `size` members, the members along the last axis."""
    if not rows:
        return jnp.zeros(shape + (size,), dtype)
    return jnp.stack(rows).reshape(shape + (size,))


def _pad(row, size: int):
    """`row` (B,) repeated at its last member up to `size` entries."""
    return jnp.pad(row, (0, size - row.shape[0]), mode="edge")


def pallas_steps(step: BatchedStep, dt, t0, args, block: int, k0, z, *, tile: int = DEFAULT_TILE):
    """`block` steps of a component-major `BatchedStep` with a constant status, in one
    Pallas kernel: returns `(z_end, mark)`, the pieces after the block and the per-member
    mark (B,) (module docstring). `k0` (B,): each member's steps taken before the block;
    `dt`, `t0`: shared scalars or per-member (B,); `args` shared. `tile`: members per
    program, at most (rounded down to a power of two)."""
    if not isinstance(step, BatchedStep) or step.axis != -1:
        raise ValueError("pallas_steps runs a component-major BatchedStep (axis=-1)")
    if tile < 1:
        raise ValueError(f"tile must be a positive number of members, got {tile!r}")
    size = step.size
    tile = min(1 << (int(tile).bit_length() - 1), pl.next_power_of_2(size))
    padded = pl.cdiv(size, tile) * tile

    step_dyn, step_static = eqx.partition(step.step, eqx.is_array)
    step_leaves, step_def = jax.tree_util.tree_flatten(step_dyn)
    args_dyn, args_static = eqx.partition(args, eqx.is_array)
    args_leaves, args_def = jax.tree_util.tree_flatten(args_dyn)
    z_leaves, z_def = jax.tree_util.tree_flatten(z)
    dt, t0, k0 = jnp.asarray(dt), jnp.asarray(t0), jnp.asarray(k0)
    # Every input with its member axis (None: shared by all members).
    values = [*z_leaves, *step_leaves, *args_leaves, k0, dt, t0]
    axes = (
        [step.axis] * len(z_leaves) + list(step.step_axes) + [None] * len(args_leaves)
        + [0, 0 if dt.ndim == 1 else None, 0 if t0.ndim == 1 else None]
    )
    rows, shared, layout = [], [], []
    for value, axis in zip(values, axes):
        if axis is None:
            shared.append(value)
            layout.append(None)
        else:
            value_rows, shape = _to_rows(value, axis)
            rows.extend(_pad(r, padded) for r in value_rows)
            layout.append((len(value_rows), shape, value.dtype))
    tile_axes = tuple(None if a is None else -1 for a in step.step_axes)
    cuts = list(itertools.accumulate([len(z_leaves), len(step_leaves), len(args_leaves)]))

    def tile_block(tile_rows, tile_shared):
        """The block on one tile: rows and shared values in, the end state's rows and the
        mark out."""
        row_it, shared_it = iter(tile_rows), iter(tile_shared)
        tile_values = [
            next(shared_it) if lay is None else _from_rows([next(row_it) for _ in range(lay[0])], *lay[1:], tile)
            for lay in layout
        ]
        z_t, step_t, args_t = (tile_values[a:b] for a, b in zip([0, *cuts], cuts))
        k0_t, dt_t, t0_t = tile_values[cuts[-1] :]
        inner = eqx.combine(jax.tree_util.tree_unflatten(step_def, step_t), step_static)
        batched = BatchedStep(inner, tile_axes, -1, tile)
        args_tile = eqx.combine(jax.tree_util.tree_unflatten(args_def, args_t), args_static)

        def body(i, c):
            z, mark = c
            t = t0_t + (k0_t + i).astype(dt_t.dtype) * dt_t
            z_next, _ = batched.advance(t, z, dt_t, args_tile)
            # The driver's finiteness mark, 0·Σz per member (NaN once an entry is not finite).
            return z_next, mark + 0.0 * batched.state_sum(z)

        init = (jax.tree_util.tree_unflatten(z_def, z_t), jnp.zeros((tile,), dt.dtype))
        z_end, mark = lax.fori_loop(0, block, body, init)
        mark = mark + 0.0 * batched.state_sum(z_end)
        return [r for leaf in jax.tree_util.tree_leaves(z_end) for r in _to_rows(leaf, -1)[0]], mark

    # Traced once here, so that what the step's code closes over becomes inputs.
    row_avals = [jax.ShapeDtypeStruct((tile,), r.dtype) for r in rows]
    closed = jax.make_jaxpr(tile_block)(row_avals, shared)
    consts = [jnp.asarray(c) for c in closed.consts]
    n_operands, n_in = len(rows) + len(shared), len(rows) + len(shared) + len(consts)
    n_out = sum(lay[0] for lay in layout[: len(z_leaves)]) + 1

    def kernel(*refs):
        ins = [ref[...] for ref in refs[:n_in]]
        outs = jaxpr_as_fun(ClosedJaxpr(closed.jaxpr, ins[n_operands:]))(*ins[:n_operands])
        for ref, value in zip(refs[n_in:], outs):
            ref[...] = value

    by_tile = pl.BlockSpec((tile,), lambda j: (j,))
    whole = [pl.BlockSpec(jnp.shape(v), lambda j, n=jnp.ndim(v): (0,) * n) for v in [*shared, *consts]]
    out_dtypes = [r.dtype for r in rows[: n_out - 1]] + [dt.dtype]

    def call(interpret: bool):
        def run(*inputs):
            return pl.pallas_call(
                kernel,
                out_shape=[jax.ShapeDtypeStruct((padded,), d) for d in out_dtypes],
                grid=(padded // tile,),
                in_specs=[by_tile] * len(rows) + whole,
                out_specs=[by_tile] * n_out,
                interpret=interpret,
                name="geomjax_block",
            )(*inputs)

        return run

    inputs = [*rows, *shared, *consts]
    out = lax.platform_dependent(*inputs, cuda=call(False), rocm=call(False), default=call(True))
    out = [o[:size] for o in out]
    out_it = iter(out[:-1])
    z_end = [_from_rows([next(out_it) for _ in range(lay[0])], *lay[1:], size) for lay in layout[: len(z_leaves)]]
    return jax.tree_util.tree_unflatten(z_def, z_end), out[-1]
