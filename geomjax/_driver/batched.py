"""A batch of runs as one step: the members' states stacked in a chosen memory layout.

`BatchedStep` advances every member of a batch at once, so the driver's loop
(`geomjax.integrate`'s `lax.scan`, its per-step bookkeeping and its save blocks) runs a
whole batch as it runs one trajectory, with one status per member.

The three layouts of the state inside the loop:

- **batch-major** (`axis=0`): a piece of shape (3,) becomes (B, 3), as `jax.vmap` lays it
  out. Each scalar of the field reads a strided column.
- **component-major rows** (`axis=-1, rows=True`): the loop carries one array of shape
  (B,) per scalar of the state (`Rows`). The member's step sees its pieces through a
  `vmap` over the rows (it stacks its scalars into its pieces), so the scalar operations
  of a derived field (the simplified expression graph of `geomjax.internal.simplify`)
  become operations on contiguous vectors and XLA's GPU loop reads and writes each row
  once per fused kernel: the layout GPUs need (measured on an H100, six rows ran the
  spherical-pendulum feedback Euler 11× faster than (3, B) pieces; docs/performance.md).
- **component-major pieces** (`axis=-1`): (3,) becomes (3, B), carried as such.

At the driver's boundary a flat batch of states is always (n, B) (entries, members), so the
monitor's reductions over axis 0 give one value per member; the state is laid out as the
layout says between the boundary conversions (`split` at the start, `merge` at saves).

What the members share stays shared: an array of the step that does not depend on the
member (a mass, a gain that is not swept, a method's coefficients) is kept once, not
repeated B times, so XLA sees it as one scalar and, where it is a constant, folds it.
Whether an array depends on the member is read off the jaxpr of the function that makes it
(`member_dependent`: structural and conservative). Per-member arrays of the step (a
feedback target, a swept gain) keep their (k, B) layout: they do not change in the loop.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Literal

from .._step.base import AbstractStep, written_out_sum
from .._status import RESULTS, code_of, from_code, known_code
from .._validate import is_traced
from ..internal.simplify import scalar_graph


def member_dependent(fn, leaves, varying) -> list:
    """For each output leaf of `fn(*leaves)` (arrays in, a pytree of arrays out): whether
    it depends on an input leaf marked in `varying`. Read off the jaxpr (an equation with
    a varying operand makes all its results varying), so a leaf marked False is certainly
    shared; literal and constant outputs are shared."""
    closed = jax.make_jaxpr(fn)(*leaves)
    jaxpr = closed.jaxpr
    dep = {v for v, m in zip(jaxpr.invars, varying) if m}
    for eqn in jaxpr.eqns:
        if any(not isinstance(v, Literal) and v in dep for v in eqn.invars):
            dep.update(eqn.outvars)
    return [not isinstance(v, Literal) and v in dep for v in jaxpr.outvars]


def _member_example(leaf, axis):
    """The abstract value of one member's part of `leaf` (batched along `axis`, or shared)."""
    if axis is None:
        return leaf
    shape = list(jnp.shape(leaf))
    del shape[axis]
    return jax.ShapeDtypeStruct(tuple(shape), leaf.dtype)


def vmap_keep_shared(fn, args, in_axes, size: int, out_axis: int):
    """`fn` over the members of `args`, leaves that do not depend on the member unbatched.

    `args`: a tuple of pytrees; `in_axes`: for each array leaf of `args` (in flattening
    order), the member axis or None. Returns `(out, out_axes)`: the output pytree (its
    non-array leaves kept from the trace) and, per array leaf, `out_axis` or None."""
    dynamic, static = eqx.partition(args, eqx.is_array)
    flat, treedef = jax.tree_util.tree_flatten(dynamic)
    out_static = []

    def member_fn(*leaves):
        out = fn(*eqx.combine(jax.tree_util.tree_unflatten(treedef, list(leaves)), static))
        out_dyn, rest = eqx.partition(out, eqx.is_array)
        out_static[:] = [rest]
        return out_dyn

    examples = [_member_example(leaf, a) for leaf, a in zip(flat, in_axes)]
    varying = member_dependent(member_fn, examples, [a is not None for a in in_axes])
    out_tree = jax.tree_util.tree_structure(jax.eval_shape(member_fn, *examples))
    out_axes = [out_axis if v else None for v in varying]
    out = jax.vmap(member_fn, in_axes=list(in_axes), out_axes=jax.tree_util.tree_unflatten(out_tree, out_axes), axis_size=size)(*flat)
    return eqx.combine(out, out_static[0]), tuple(out_axes)


#: `out_axes` entry of `BatchedStep._vmap` for an output that is a state: laid out as
#: `Rows` (one (B,) array per scalar).
ROWS = "rows"


class Rows(eqx.Module):
    """A batch of states in pieces as one (B,) array per scalar: `rows[j]` is entry j of
    the members' pieces, flattened leaf by leaf in C order.

    `spec` (static) says how a member's scalars restack into its pieces: the pieces'
    tree structure and each leaf's shape and dtype.

    Example:

    ```python
    >>> import jax.numpy as jnp
    >>> _, spec = _scalars((jnp.zeros(3), jnp.zeros(2)))  # one member's pieces: 5 scalars
    >>> z = Rows(tuple(jnp.full(4, float(j)) for j in range(5)), spec)  # 4 members
    >>> [p.shape for p in z.to_pieces()], z.to_pieces()[1][:, 0].tolist()
    ([(3, 4), (2, 4)], [3.0, 4.0])

    ```
    """

    rows: tuple
    spec: tuple = eqx.field(static=True)

    def to_pieces(self):
        """The pieces with the members along the last axis of each leaf."""
        size = self.rows[0].shape[0] if self.rows else 0
        return _restack(self.rows, self.spec, (size,))


def _scalars(pieces):
    """One member's pieces as `(scalars, spec)` (the inverse of `_restack`)."""
    leaves, treedef = jax.tree_util.tree_flatten(pieces)
    scalars = []
    for leaf in leaves:
        flat = jnp.reshape(leaf, (-1,))
        scalars.extend(flat[j] for j in range(flat.shape[0]))
    spec = (treedef, tuple(jnp.shape(leaf) for leaf in leaves), tuple(jnp.dtype(leaf.dtype) for leaf in leaves))
    return tuple(scalars), spec


def _restack(values, spec, trailing=()):
    """Pieces from their entries `values` (each of shape `trailing`), as `spec` says."""
    treedef, shapes, dtypes = spec
    it = iter(values)
    leaves = []
    for shape, dtype in zip(shapes, dtypes):
        n = int(np.prod(shape, dtype=np.int64))
        part = [next(it) for _ in range(n)]
        if n == 0:
            leaves.append(jnp.zeros(shape + trailing, dtype))
        elif not shape:
            leaves.append(part[0])
        else:
            leaves.append(jnp.stack(part).reshape(shape + trailing))
    return jax.tree_util.tree_unflatten(treedef, leaves)


class BatchedStep(AbstractStep):
    """`step` advanced for all members at once, the state laid out along `axis` (0 or −1),
    as `Rows` where `rows` (component-major only).

    `step_axes`: for each array leaf of `step` (flattening order), the member axis or None
    (shared). The flat state at the boundary is (n, B); `invariants` and
    `constraint_residuals` are (k, B). Times and step sizes are shared scalars or
    per-member vectors (B,).
    """

    step: AbstractStep
    step_axes: tuple = eqx.field(static=True)
    axis: int = eqx.field(static=True)
    size: int = eqx.field(static=True)
    rows: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        if self.rows and self.axis != -1:
            raise ValueError("a batch carried as rows is component-major (axis=-1)")

    def _vmap(self, fn, args, arg_axes, out_axes):
        """`fn(step, *args)` over the members: `arg_axes` per argument (an int, or None
        for a shared one; a `Rows` argument is read by its rows), `out_axes` for the
        outputs (an int, `ROWS` for a state laid out as rows, or a tuple of them)."""
        specs = [a.spec if isinstance(a, Rows) else None for a in args]
        args = [a.rows if isinstance(a, Rows) else a for a in args]
        dynamic, static = eqx.partition((self.step, *args), eqx.is_array)
        step_dyn, *args_dyn = dynamic
        leaves, treedef = jax.tree_util.tree_flatten(step_dyn)
        arg_axes = [0 if spec is not None else ax for ax, spec in zip(arg_axes, specs)]
        arg_leaves = [jax.tree_util.tree_flatten(a) for a in args_dyn]
        in_axes = [list(self.step_axes)] + [[ax] * len(l) for ax, (l, _) in zip(arg_axes, arg_leaves)]
        single = not isinstance(out_axes, tuple)
        out_axes = (out_axes,) if single else out_axes
        out_specs = [None] * len(out_axes)

        def member_fn(step_leaves, *arg_flat):
            step = jax.tree_util.tree_unflatten(treedef, step_leaves)
            rest = [jax.tree_util.tree_unflatten(t, l) for (_, t), l in zip(arg_leaves, arg_flat)]
            step, *full = eqx.combine((step, *rest), static)
            out = fn(step, *[v if spec is None else _restack(v, spec) for v, spec in zip(full, specs)])
            out = (out,) if single else tuple(out)
            converted = []
            for i, (value, ax) in enumerate(zip(out, out_axes)):
                if ax == ROWS:
                    value, out_specs[i] = _scalars(value)
                converted.append(value)
            return tuple(converted)

        vmap_axes = tuple(0 if ax == ROWS else ax for ax in out_axes)
        if ROWS in out_axes:
            # Scalars in, scalars out: through the simplified scalar graph, a member's
            # function keeps no stacked pieces, so under `vmap` every operation acts on
            # (B,) rows. Stacked, the rows were computed as slices of (n, B) arrays, which
            # XLA cannot write in place into the loop's rows: on a GPU every step then
            # copied each row once more and split into several kernels (measured on an
            # H100: 8.5e9 against 1.1e11 trajectory-steps/s for pendulum Euler).
            stepped = functools.partial(scalar_graph, member_fn, warn=False)
        else:
            stepped = member_fn
        out = jax.vmap(stepped, in_axes=in_axes, out_axes=vmap_axes, axis_size=self.size)(
            leaves, *[l for l, _ in arg_leaves]
        )
        out = tuple(v if spec is None else Rows(v, spec) for v, spec in zip(out, out_specs))
        return out[0] if single else out

    @property
    def _state_axis(self):
        return ROWS if self.rows else self.axis

    def _pieces(self, z):
        """`z` with the members along `self.axis` of each leaf (rows restacked)."""
        return z.to_pieces() if isinstance(z, Rows) else z

    def fast_variant(self):
        inner = self.step.fast_variant()
        return self if inner is self.step else BatchedStep(inner, self.step_axes, self.axis, self.size, self.rows)

    @property
    def dim(self):
        return self.step.dim

    @property
    def carries_history(self) -> bool:
        return self.step.carries_history

    def split(self, x):
        return self._vmap(lambda s, y: s.split(y), (x,), (-1,), self._state_axis)

    def merge(self, z):
        return self._vmap(lambda s, w: s.merge(w), (z,), (self.axis,), -1)

    def at_start(self, z0):
        z0 = self._pieces(z0)
        z_axes = [self.axis] * len(jax.tree_util.tree_leaves(z0))
        inner, axes = vmap_keep_shared(
            lambda s, z: s.at_start(z), (self.step, z0), list(self.step_axes) + z_axes, self.size, self.axis
        )
        return BatchedStep(inner, axes, self.axis, self.size, self.rows)

    def start(self, t0, z0, h, args):
        fn = lambda s, t, w, dt: s.start(t, w, dt, args)
        return self._vmap(fn, (t0, z0, h), (_axis_of(t0), self.axis, _axis_of(h)), self._state_axis)

    def advance(self, t, z, h, args):
        constant = []

        def one(s, t, w, dt):
            w_next, result = s.advance(t, w, dt, args)
            constant.append(known_code(result) == 0)
            return w_next, jnp.asarray(code_of(result))

        z_next, codes = self._vmap(one, (t, z, h), (_axis_of(t), self.axis, _axis_of(h)), (self._state_axis, 0))
        if all(constant):
            # An explicit step cannot fail by itself: keep its status a constant, so the
            # loop carries no per-member success flag (the broadcast above is dead code).
            return z_next, RESULTS.successful
        return z_next, from_code(codes)

    def invariants(self, x):
        return self._vmap(lambda s, y: s.invariants(y), (x,), (-1,), -1)

    def constraint_residuals(self, x):
        return self._vmap(lambda s, y: s.constraint_residuals(y), (x,), (-1,), -1)

    def monitored(self, x):
        return self._vmap(lambda s, y: s.monitored(y), (x,), (-1,), -1)

    def state_sum(self, z):
        # one sum per member: over every axis of a piece but the members'
        if isinstance(z, Rows):
            rows = lambda row: row[None]
        elif self.axis == 0:
            rows = lambda leaf: jnp.moveaxis(leaf.reshape(leaf.shape[0], -1), 1, 0)
        else:
            rows = lambda leaf: leaf.reshape(-1, leaf.shape[-1])
        return written_out_sum(z, rows, lambda r: jnp.sum(r, axis=0))

    def state_select(self, keep, new, old):
        def pick(a, b):
            k = keep if self.axis != 0 else keep.reshape(keep.shape + (1,) * (a.ndim - 1))
            return jnp.where(k, a, b)

        return jax.tree_util.tree_map(pick, new, old)


def _axis_of(x):
    """0 for a per-member value (one entry per member), None for a shared one."""
    return 0 if jnp.ndim(x) == 1 else None


def batch_members(make, members: dict, axis: int, size: int, rows: bool = False):
    """`make(member) ↦ (step, x0)` over the members (`{name: values}`, members along axis
    0): a `BatchedStep` (what depends on the member along `axis`, the rest shared, its
    state carried as rows where `rows`) and the initial states as (n, B)."""
    (step, x0), axes = vmap_keep_shared(
        lambda m: make(m), (members,), [0] * len(jax.tree_util.tree_leaves(members)), size, axis
    )
    step_axes, x0_axis = axes[:-1], axes[-1]
    if x0_axis is None:  # every member starts from the same state
        x0 = jnp.broadcast_to(x0[:, None], (x0.shape[0], size))
    elif axis == 0:
        x0 = x0.T
    return BatchedStep(step, step_axes, axis, size, rows), x0


def reachable_tracers(tree, depth: int = 8) -> dict:
    """{id: tracer} of the traced values reachable from `tree` through its non-array
    parts: functions and what they close over (cells, defaults, `functools.partial` and
    `Partial` arguments, bound methods), containers and modules."""
    seen, found = set(), {}

    def visit(obj, d):
        if is_traced(obj):
            found[id(obj)] = obj
            return
        if d == 0 or id(obj) in seen or isinstance(obj, (str, bytes, int, float, complex, type)) or obj is None:
            return
        seen.add(id(obj))
        children = []
        if isinstance(obj, (list, tuple, set, frozenset)):
            children = list(obj)
        elif isinstance(obj, dict):
            children = list(obj.values())
        elif isinstance(obj, eqx.Module) or isinstance(obj, jax.tree_util.Partial):
            children = jax.tree_util.tree_leaves(obj)
            children += [getattr(obj, "func", None)] if isinstance(obj, jax.tree_util.Partial) else []
        elif hasattr(obj, "__func__") and hasattr(obj, "__self__"):  # a bound method
            children = [obj.__func__, obj.__self__]
        elif callable(obj):
            cells = getattr(obj, "__closure__", None) or ()
            children = [c.cell_contents for c in cells if _filled(c)]
            children += list(getattr(obj, "__defaults__", None) or ())
            children += list((getattr(obj, "__kwdefaults__", None) or {}).values())
            children += [getattr(obj, a) for a in ("func", "args", "keywords") if hasattr(obj, a)]  # functools.partial
        for c in children:
            visit(c, d - 1)

    visit(tree, depth)
    return found


def holds_member_values(tree, outer=(), depth: int = 8) -> bool:
    """True when the non-array parts of `tree` (functions and what they close over) hold a
    traced value other than those in `outer` (the ids of values traced outside the
    sweep, which `build` itself closes over): a swept parameter captured by a user's
    lambda, which cannot leave the `vmap` that built it."""
    return any(i not in outer for i in reachable_tracers(tree, depth))


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True
