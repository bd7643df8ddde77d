"""A batch of runs as one step: the members' states stacked in a chosen memory layout.

`BatchedStep` advances every member of a batch at once, so the driver's loop
(`geomjax.integrate`'s `lax.scan`, its per-step bookkeeping and its save blocks) runs a
whole batch as it runs one trajectory, with one status per member.

The two layouts of the pieces (q, p, ...) inside the loop:

- **batch-major** (`axis=0`): a piece of shape (3,) becomes (B, 3), as `jax.vmap` lays it
  out. Each scalar of the field reads a strided column.
- **component-major** (`axis=-1`): (3,) becomes (3, B). Each scalar of a state is a
  contiguous vector over the members, so the scalar operations of a derived field (the
  simplified expression graph of `geomjax.internal.simplify`) become vector operations on
  contiguous rows: the layout GPUs need (`benchmarks/sweep_throughput.py`).

At the driver's boundary a flat batch of states is always (n, B) (entries, members), so the
monitor's reductions over axis 0 give one value per member; the pieces are laid out as
`axis` says between the boundary conversions (`split` at the start, `merge` at saves).

What the members share stays shared: an array of the step that does not depend on the
member (a mass, a gain that is not swept, a method's coefficients) is kept once, not
repeated B times, so XLA sees it as one scalar and, where it is a constant, folds it.
Whether an array depends on the member is read off the jaxpr of the function that makes it
(`member_dependent`: structural and conservative).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.extend.core import Literal

from .._step.base import AbstractStep, written_out_sum
from .._status import RESULTS, from_code
from .._validate import is_concrete


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


class BatchedStep(AbstractStep):
    """`step` advanced for all members at once, pieces laid out along `axis` (0 or −1).

    `step_axes`: for each array leaf of `step` (flattening order), the member axis or None
    (shared). The flat state at the boundary is (n, B); `invariants` and
    `constraint_residuals` are (k, B). Times and step sizes are shared scalars or
    per-member vectors (B,). `loop`: how the driver runs a save block, `"scan"` (a
    `lax.scan`) or `"pallas"` (one Pallas kernel, `pallas_loop.py`: needs `axis=-1`; a step
    whose status is not a constant runs the scan).
    """

    step: AbstractStep
    step_axes: tuple = eqx.field(static=True)
    axis: int = eqx.field(static=True)
    size: int = eqx.field(static=True)
    loop: str = eqx.field(static=True, default="scan")

    def _vmap(self, fn, args, arg_axes, out_axes):
        """`fn(step, *args)` over the members: `arg_axes` per argument (an int, or None
        for a shared one), `out_axes` for the outputs (an int or a tuple of them)."""
        dynamic, static = eqx.partition((self.step, *args), eqx.is_array)
        step_dyn, *args_dyn = dynamic
        leaves, treedef = jax.tree_util.tree_flatten(step_dyn)
        arg_leaves = [jax.tree_util.tree_flatten(a) for a in args_dyn]
        in_axes = [list(self.step_axes)] + [[ax] * len(l) for ax, (l, _) in zip(arg_axes, arg_leaves)]

        def member_fn(step_leaves, *arg_flat):
            step = jax.tree_util.tree_unflatten(treedef, step_leaves)
            rest = [jax.tree_util.tree_unflatten(t, l) for (_, t), l in zip(arg_leaves, arg_flat)]
            full = eqx.combine((step, *rest), static)
            return fn(*full)

        return jax.vmap(member_fn, in_axes=in_axes, out_axes=out_axes, axis_size=self.size)(
            leaves, *[l for l, _ in arg_leaves]
        )

    @property
    def dim(self):
        return self.step.dim

    @property
    def carries_history(self) -> bool:
        return self.step.carries_history

    def split(self, x):
        return self._vmap(lambda s, y: s.split(y), (x,), (-1,), self.axis)

    def merge(self, z):
        return self._vmap(lambda s, w: s.merge(w), (z,), (self.axis,), -1)

    def at_start(self, z0):
        z_axes = [self.axis] * len(jax.tree_util.tree_leaves(z0))
        inner, axes = vmap_keep_shared(
            lambda s, z: s.at_start(z), (self.step, z0), list(self.step_axes) + z_axes, self.size, self.axis
        )
        return BatchedStep(inner, axes, self.axis, self.size, self.loop)

    def start(self, t0, z0, h, args):
        fn = lambda s, t, w, dt: s.start(t, w, dt, args)
        return self._vmap(fn, (t0, z0, h), (_axis_of(t0), self.axis, _axis_of(h)), self.axis)

    def advance(self, t, z, h, args):
        constant = []

        def one(s, t, w, dt):
            w_next, result = s.advance(t, w, dt, args)
            constant.append(is_concrete(result._value) and int(result._value) == 0)
            return w_next, jnp.asarray(result._value)

        z_next, codes = self._vmap(one, (t, z, h), (_axis_of(t), self.axis, _axis_of(h)), (self.axis, 0))
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
        if self.axis == 0:
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


def batch_members(make, members: dict, axis: int, size: int, loop: str = "scan"):
    """`make(member) ↦ (step, x0)` over the members (`{name: values}`, members along axis
    0): a `BatchedStep` (what depends on the member along `axis`, the rest shared, its
    blocks run by `loop`) and the initial states as (n, B)."""
    (step, x0), axes = vmap_keep_shared(
        lambda m: make(m), (members,), [0] * len(jax.tree_util.tree_leaves(members)), size, axis
    )
    step_axes, x0_axis = axes[:-1], axes[-1]
    if x0_axis is None:  # every member starts from the same state
        x0 = jnp.broadcast_to(x0[:, None], (x0.shape[0], size))
    elif axis == 0:
        x0 = x0.T
    return BatchedStep(step, step_axes, axis, size, loop), x0


def reachable_tracers(tree, depth: int = 8) -> dict:
    """{id: tracer} of the traced values reachable from `tree` through its non-array
    parts: functions and what they close over (cells, defaults, `functools.partial` and
    `Partial` arguments, bound methods), containers and modules."""
    seen, found = set(), {}

    def visit(obj, d):
        if isinstance(obj, jax.core.Tracer):
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
