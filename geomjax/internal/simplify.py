"""Derived fields rewritten as simplified scalar expression graphs.

A field derived by autodiff carries what the derivation needed but the result does not:
products with the zeros and ones of unit cotangents, `0.5·p + 0.5·p` from transposing
`p·p`, dense inner products of gradients that are mostly zero, the same sum computed
twice in two gradients. XLA keeps most of it (it may not assume that `x·0 = 0` in
floating point). For the small state spaces of constrained mechanics the cure is cheap:
trace the field once to a jaxpr, expand every array into its scalar entries, and rebuild
each entry as a node of an expression graph that

- folds constants (including the entries of unit cotangents and identity matrices),
- applies `x·0 = 0`, `x·1 = x`, `x + 0 = x`, `x + x = 2x`, `−(−x) = x`, `c₁(c₂x) = (c₁c₂)x`,
- shares equal subexpressions (hash-consing, with commutative operands sorted), and
- drops everything no output reads.

The graph is then emitted as scalar JAX operations and the outputs restacked. Under
`vmap` each scalar becomes a batch vector, so the batched field costs exactly the
operations left in the graph. Functions with an operation the expansion does not know,
or that would expand to too many scalars, are evaluated unchanged.

Like the symbolic zeros of JAX's own autodiff, `x·0 = 0` assumes finite intermediates:
a NaN or infinity multiplied by a structural zero no longer propagates (non-finite
states still are reported, since they reach the outputs through other terms).
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Literal

# Functions of more input scalars than this, whose expansion grows past MAX_NODES nodes,
# or whose simplified graph still needs more than MAX_OPERATIONS scalar operations are
# evaluated unchanged: the expansion is quadratic in the state dimension for the Jacobians
# of derived fields, and past a few thousand scalar operations XLA's compile time grows
# faster than the savings (a 32-dimensional state with 8 constraints compiled in 9.5 s as
# scalars against 2.4 s as derived).
MAX_INPUTS = 64
MAX_NODES = 20_000
MAX_OPERATIONS = 2_000


class _Unsupported(Exception):
    """The jaxpr has an operation the scalar expansion does not handle."""


_FOLD = {
    "add": np.add,
    "add_any": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "neg": np.negative,
    "max": np.maximum,
    "min": np.minimum,
    "sqrt": np.sqrt,
    "sin": np.sin,
    "cos": np.cos,
    "exp": np.exp,
    "log": np.log,
    "abs": np.abs,
    "sign": np.sign,
}
_COMMUTATIVE = {"add", "mul", "max", "min"}
# Arithmetic whose parameters (result dtype hints) are dropped, so equal expressions from
# different sources share one node; emitted through the `lax` functions.
_PLAIN = {"add": lax.add, "sub": lax.sub, "mul": lax.mul, "div": lax.div, "neg": lax.neg, "max": lax.max, "min": lax.min}
_PRIMITIVES = {name: getattr(lax, f"{name}_p") for name in _PLAIN}
# Elementwise primitives re-bound as they are on scalar operands.
_ELEMENTWISE = set(_FOLD) | {
    "integer_pow", "pow", "rsqrt", "tan", "tanh", "atan2", "asin", "acos", "atan", "sinh", "cosh",
    "log1p", "expm1", "logistic", "square", "exp2", "erf", "cbrt", "convert_element_type",
    "select_n", "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "is_finite", "floor", "ceil",
    "round", "nextafter", "rem", "clamp", "copy", "copy_p",
}


def _params_key(params):
    try:
        key = tuple(sorted(params.items()))
        hash(key)
        return key
    except TypeError:
        return repr(sorted(params.items()))


class _Graph:
    """Hash-consed scalar nodes; node ids are ints in creation (topological) order.

    Floating-point arithmetic is kept in a canonical form: a node is either a constant,
    an input leaf, or `c·t` with a constant c ≠ 0, 1 (a `mul` node, or `neg` for
    c = −1) over a term `t` whose own constant factors have been pulled out. Products
    multiply the constants and the terms separately, sums of `c·t` and `c·u` factor to
    `c·(t ± u)`, `a·t + b·t` is `(a + b)·t`, and `t − u` is stored with sorted operands
    (`u − t` is `−(t − u)`), so that equal expressions meet in one node whatever order the
    derivation produced them in.
    """

    def __init__(self):
        self.nodes = []  # ("const", value) | ("leaf", k) | (prim, params, args)
        self.dtypes = []
        self.varying = []  # depends on the state (not only on constants and parameters)
        self.index = {}
        self.constants = {}  # id -> numpy scalar

    def _add(self, key, node, dtype):
        found = self.index.get(key)
        if found is not None:
            return found
        if len(self.nodes) >= MAX_NODES:
            raise _Unsupported("graph too large")
        self.nodes.append(node)
        self.dtypes.append(np.dtype(dtype))
        if node[0] == "const":
            self.varying.append(False)
        elif node[0] == "leaf":
            self.varying.append(node[2])
        else:
            self.varying.append(any(self.varying[a] for a in node[2]))
        self.index[key] = len(self.nodes) - 1
        return len(self.nodes) - 1

    def const(self, value):
        value = np.asarray(value)[()]
        key = ("const", value.dtype.str, value.tobytes())
        i = self._add(key, ("const", value), value.dtype)
        self.constants[i] = value
        return i

    def leaf(self, k, dtype, varying=True):
        """Input scalar number k: an entry of the state (`varying`) or of a parameter."""
        return self._add(("leaf", k), ("leaf", k, varying), dtype)

    def value(self, i):
        """The constant value of node i, or None."""
        return self.constants.get(i)

    def _raw(self, name, args, dtype, call=None):
        """The node `name(*args)` as it is; `call` = (primitive, params) unless plain arithmetic."""
        prim, params = (_PRIMITIVES[name], {}) if call is None else call
        if name in _COMMUTATIVE:
            args = tuple(sorted(args))
        return self._add((name, _params_key(params), tuple(args)), (prim, params, tuple(args)), dtype)

    def _name(self, i):
        node = self.nodes[i]
        return node[0] if isinstance(node[0], str) else node[0].name

    def _args(self, i):
        return self.nodes[i][2]

    # -- the canonical form c·t ------------------------------------------------------

    def split(self, i):
        """(c, t) with node i = c·t; t is None for a constant."""
        v = self.constants.get(i)
        if v is not None:
            return v, None
        name = self._name(i)
        if name == "neg":
            return np.asarray(-1, self.dtypes[i])[()], self._args(i)[0]
        if name == "mul":
            a, b = self._args(i)
            if a in self.constants:
                return self.constants[a], b
            if b in self.constants:
                return self.constants[b], a
        return np.asarray(1, self.dtypes[i])[()], i

    def scale(self, c, t, dtype):
        """The node c·t (t a term, or None for the constant c)."""
        c = np.asarray(c, dtype)[()]
        if t is None or c == 0:
            return self.const(c if t is None else np.zeros((), dtype))
        if c == 1:
            return t
        if c == -1:
            return self._raw("neg", (t,), dtype)
        return self._raw("mul", (self.const(c), t), dtype)

    def _is_square_of(self, t, fn):
        if t is None or self._name(t) != "mul":
            return None
        a, b = self._args(t)
        if a == b and self._name(a) == fn:
            return self._args(a)[0]
        return None

    def _combine(self, a, b, sign, dtype):
        """a + sign·b in canonical form."""
        ca, ta = self.split(a)
        cb, tb = self.split(b)
        cb = cb * sign
        if ta is None and tb is None:
            return self.const(ca + cb)
        if tb is None and cb == 0:
            return a
        if ta is None and ca == 0:
            return self.scale(cb, tb, dtype)
        if ta is None or tb is None:
            return self._raw("add", (self.scale(ca, ta, dtype), self.scale(cb, tb, dtype)), dtype)
        if ta == tb:
            return self.scale(ca + cb, ta, dtype)
        if ca == cb or ca == -cb:
            # sin²θ + cos²θ = 1 (the embedding of an angle as (cos θ, sin θ))
            if ca == cb:
                angle = self._is_square_of(ta, "sin")
                if angle is not None and self._is_square_of(tb, "cos") == angle:
                    return self.const(ca)
                angle = self._is_square_of(tb, "sin")
                if angle is not None and self._is_square_of(ta, "cos") == angle:
                    return self.const(ca)
                return self.scale(ca, self._raw("add", (ta, tb), dtype), dtype)
            lo, hi = sorted((ta, tb))
            # ca·(ta − tb), stored as ±ca·(lo − hi)
            flip = 1 if lo == ta else -1
            return self.scale(ca * flip, self._raw("sub", (lo, hi), dtype), dtype)
        return self._raw("add", (self.scale(ca, ta, dtype), self.scale(cb, tb, dtype)), dtype)

    def op(self, prim, params, args, dtype):
        """A node for `prim(*args)`, simplified."""
        name = prim.name
        consts = [self.constants.get(a) for a in args]
        if name in _FOLD and all(c is not None for c in consts):
            with np.errstate(all="ignore"):
                return self.const(np.asarray(_FOLD[name](*consts), dtype=dtype))
        if name == "convert_element_type":
            if consts[0] is not None:
                return self.const(np.asarray(consts[0], dtype=params["new_dtype"]))
            if self.dtypes[args[0]] == np.dtype(params["new_dtype"]):
                return args[0]
        floating = np.dtype(dtype).kind == "f"
        if floating and name in ("add", "add_any", "sub"):
            return self._combine(args[0], args[1], -1 if name == "sub" else 1, dtype)
        if floating and name == "neg":
            c, t = self.split(args[0])
            return self.scale(-c, t, dtype)
        if floating and name == "mul" or (name == "integer_pow" and params["y"] == 2 and floating):
            a, b = (args[0], args[0]) if name == "integer_pow" else args
            ca, ta = self.split(a)
            cb, tb = self.split(b)
            if ta is None or tb is None:
                return self.scale(ca * cb, ta if tb is None else tb, dtype)
            return self.scale(ca * cb, self._raw("mul", (ta, tb), dtype), dtype)
        if floating and name == "div":
            ca, ta = self.split(args[0])
            cb, tb = self.split(args[1])
            if ta is None and ca == 0:
                return args[0]
            if tb is None:
                inverse = np.asarray(1, dtype)[()] / cb
                if np.frexp(cb)[0] in (0.5, -0.5):  # a power of two: its inverse is exact
                    return self.scale(ca * inverse, ta, dtype)
                return self.scale(ca, self._raw("div", (ta, args[1]), dtype), dtype)
            one = self.const(np.ones((), dtype))
            if not self.varying[tb]:
                # A denominator made of parameters only: its reciprocal is loop-invariant
                # (XLA hoists it out of the integrator's loop) and the division becomes a
                # product, which XLA fuses into every consumer.
                inverse = self._raw("div", (one, tb), dtype)
                return self.scale(ca / cb, inverse if ta is None else self._raw("mul", (ta, inverse), dtype), dtype)
            return self.scale(ca / cb, self._raw("div", (one if ta is None else ta, tb), dtype), dtype)
        if name == "select_n":
            which = consts[0]
            if which is not None:
                return args[1 + int(which)]
            if all(a == args[1] for a in args[1:]):
                return args[1]
        if name in _PLAIN:
            params = {}
        return self._raw(name, args, dtype, (prim, params))


class _Expander:
    """Evaluates a jaxpr on arrays of node ids (numpy int arrays)."""

    def __init__(self, graph: _Graph):
        self.graph = graph

    def run(self, jaxpr, consts, args):
        env = {}

        def read(v):
            if isinstance(v, Literal):
                return self.constant_array(np.asarray(v.val, dtype=v.aval.dtype))
            return env[v]

        for var, val in zip(jaxpr.constvars, consts):
            env[var] = val
        for var, val in zip(jaxpr.invars, args):
            env[var] = val
        for eqn in jaxpr.eqns:
            invals = [read(v) for v in eqn.invars]
            outs = self.equation(eqn, invals)
            for var, val in zip(eqn.outvars, outs):
                env[var] = val
        return [read(v) for v in jaxpr.outvars]

    def constant_array(self, value):
        value = np.asarray(value)
        flat = [self.graph.const(v) for v in value.reshape(-1)]
        return np.asarray(flat, dtype=np.int64).reshape(value.shape)

    def equation(self, eqn, invals):
        name = eqn.primitive.name
        params = eqn.params
        out_avals = [v.aval for v in eqn.outvars]
        g = self.graph
        if name in _ELEMENTWISE:
            dtype = out_avals[0].dtype
            shape = out_avals[0].shape
            arrays = [np.broadcast_to(a, shape) for a in invals]
            out = np.empty(shape, dtype=np.int64)
            for idx in np.ndindex(shape):
                out[idx] = g.op(eqn.primitive, params, tuple(int(a[idx]) for a in arrays), dtype)
            return [out]
        if name in ("pjit", "jit", "closed_call", "core_call", "remat2", "checkpoint"):
            return self._closed(params.get("jaxpr") or params["call_jaxpr"], invals)
        if name == "optimization_barrier":
            return list(invals)
        x = invals[0] if invals else None
        if name == "slice":
            strides = params["strides"] or (1,) * x.ndim
            index = tuple(slice(s, e, st) for s, e, st in zip(params["start_indices"], params["limit_indices"], strides))
            return [x[index]]
        if name == "squeeze":
            return [np.squeeze(x, axis=tuple(params["dimensions"]))]
        if name == "reshape":
            return [np.reshape(x, out_avals[0].shape)]
        if name == "expand_dims":
            return [np.reshape(x, out_avals[0].shape)]
        if name == "broadcast_in_dim":
            shape = params["shape"]
            dims = params["broadcast_dimensions"]
            expanded = np.reshape(x, [x.shape[dims.index(d)] if d in dims else 1 for d in range(len(shape))])
            return [np.broadcast_to(expanded, shape).copy()]
        if name == "concatenate":
            return [np.concatenate(invals, axis=params["dimension"])]
        if name == "stack":
            return [np.stack(invals, axis=params["axis"])]
        if name == "unstack":
            axis = params["axis"]
            return [np.take(x, i, axis=axis) for i in range(x.shape[axis])]
        if name == "split":
            bounds = np.cumsum(params["sizes"])[:-1]
            return list(np.split(x, bounds, axis=params["axis"]))
        if name == "transpose":
            return [np.transpose(x, params["permutation"])]
        if name == "rev":
            return [np.flip(x, axis=tuple(params["dimensions"]))]
        if name == "pad":
            return [self._pad(x, invals[1], params["padding_config"])]
        if name == "iota":
            value = lax.broadcasted_iota(params["dtype"], params["shape"], params["dimension"])
            return [self.constant_array(np.asarray(value))]
        if name == "reduce_sum":
            return [self._reduce(x, params["axes"], "add")]
        if name in ("reduce_max", "reduce_min"):
            return [self._reduce(x, params["axes"], name[len("reduce_") :])]
        if name == "argmax" and tuple(params["axes"]) == (0,) and x.ndim == 1:
            return [self._argmax(x, params["index_dtype"])]
        if name == "dot_general":
            return [self._dot_general(invals[0], invals[1], params, out_avals[0].dtype)]
        raise _Unsupported(name)

    def _closed(self, sub, invals):
        """Inline a called jaxpr (closed, as `jit` gives it, or open, as `checkpoint`)."""
        if not hasattr(sub, "consts"):
            return self.run(sub, [], invals)
        for c in sub.consts:
            if isinstance(c, jax.core.Tracer):
                raise _Unsupported("traced constant inside a call")
        return self.run(sub.jaxpr, [self.constant_array(np.asarray(c)) for c in sub.consts], invals)

    def _pad(self, x, pad_value, config):
        value = int(np.asarray(pad_value).reshape(()))
        out = x
        for axis, (lo, hi, interior) in enumerate(config):
            if interior:
                n = out.shape[axis]
                shape = list(out.shape)
                shape[axis] = n + (n - 1) * interior if n else 0
                spread = np.full(shape, value, dtype=np.int64)
                index = [slice(None)] * out.ndim
                index[axis] = slice(None, None, interior + 1)
                spread[tuple(index)] = out
                out = spread
            for amount, at_end in ((lo, False), (hi, True)):
                if amount > 0:
                    shape = list(out.shape)
                    shape[axis] = amount
                    block = np.full(shape, value, dtype=np.int64)
                    out = np.concatenate([out, block] if at_end else [block, out], axis=axis)
                elif amount < 0:
                    index = [slice(None)] * out.ndim
                    index[axis] = slice(None, amount) if at_end else slice(-amount, None)
                    out = out[tuple(index)]
        return out

    def _sum(self, ids, prim_name, dtype):
        prim = {"add": lax.add_p, "max": lax.max_p, "min": lax.min_p}[prim_name]
        if not ids:
            return self.graph.const(np.zeros((), dtype))
        acc = int(ids[0])
        for i in ids[1:]:
            acc = self.graph.op(prim, {}, (acc, int(i)), dtype)
        return acc

    def _reduce(self, x, axes, how):
        axes = tuple(axes)
        keep = [d for d in range(x.ndim) if d not in axes]
        moved = np.transpose(x, keep + list(axes))
        lead = moved.shape[: len(keep)]
        moved = moved.reshape(lead + (-1,))
        out = np.empty(lead, dtype=np.int64)
        dtype = self.graph.dtypes[int(moved.reshape(-1)[0])] if moved.size else np.dtype(np.float64)
        for idx in np.ndindex(lead):
            out[idx] = self._sum(list(moved[idx]), how, dtype)
        return out

    def _argmax(self, x, index_dtype):
        """The first index of the largest entry, as a chain of comparisons and selects."""
        g = self.graph
        best_value, best_index = int(x[0]), g.const(np.zeros((), index_dtype))
        for i in range(1, x.shape[0]):
            better = g.op(lax.gt_p, {}, (int(x[i]), best_value), np.bool_)
            best_index = g.op(lax.select_n_p, {}, (better, best_index, g.const(np.asarray(i, index_dtype))), index_dtype)
            best_value = g.op(lax.select_n_p, {}, (better, best_value, int(x[i])), g.dtypes[best_value])
        return np.asarray(best_index, dtype=np.int64)

    def _dot_general(self, lhs, rhs, params, dtype):
        (lc, rc), (lb, rb) = params["dimension_numbers"]
        lf = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
        rf = [d for d in range(rhs.ndim) if d not in rc and d not in rb]
        l = np.transpose(lhs, list(lb) + lf + list(lc))
        r = np.transpose(rhs, list(rb) + rf + list(rc))
        nb = len(lb)
        bshape = l.shape[:nb]
        lfs = l.shape[nb : nb + len(lf)]
        rfs = r.shape[nb : nb + len(rf)]
        l = l.reshape(bshape + lfs + (-1,))
        r = r.reshape(bshape + rfs + (-1,))
        out = np.empty(bshape + lfs + rfs, dtype=np.int64)
        g = self.graph
        for b in np.ndindex(bshape):
            for i in np.ndindex(lfs):
                for j in np.ndindex(rfs):
                    terms = [
                        g.op(lax.mul_p, {}, (int(u), int(v)), dtype) for u, v in zip(l[b + i], r[b + j])
                    ]
                    out[b + i + j] = self._sum(terms, "add", dtype)
        return out


def _emit(graph: _Graph, outputs, leaves, out_avals):
    """Evaluate the nodes the outputs need, as scalar JAX operations (None when there are
    more than `MAX_OPERATIONS` of them)."""
    needed = set()
    stack = [int(i) for o in outputs for i in np.asarray(o).reshape(-1)]
    while stack:
        i = stack.pop()
        if i in needed:
            continue
        needed.add(i)
        node = graph.nodes[i]
        if not isinstance(node[0], str):
            stack.extend(node[2])
    if sum(not isinstance(graph.nodes[i][0], str) for i in needed) > MAX_OPERATIONS:
        return None
    values = {}
    for i in sorted(needed):
        node = graph.nodes[i]
        if node[0] == "const":
            values[i] = node[1]  # a numpy scalar: a literal XLA can fold
        elif node[0] == "leaf":
            array, idx = leaves[node[1]]  # each leaf is one node, so sliced once
            values[i] = array[idx] if idx else array
        else:
            prim, params, args = node
            operands = [values[a] for a in args]
            if prim.name in _PLAIN:
                values[i] = _PLAIN[prim.name](*operands)
            else:
                values[i] = prim.bind(*operands, **params)
    results = []
    for ids, aval in zip(outputs, out_avals):
        ids = np.asarray(ids)
        if ids.size == 0:
            results.append(jnp.zeros(aval.shape, aval.dtype))
            continue
        flat = [jnp.asarray(values[int(i)], dtype=aval.dtype) for i in ids.reshape(-1)]
        results.append(jnp.stack(flat).reshape(aval.shape))
    return results


def scalar_graph(fn: Callable, *args):
    """`fn(*args)`, evaluated through its simplified scalar expression graph.

    **Arguments:**

    - `fn`: a function of arrays (a pytree of arrays out).
    - `args`: the arrays (pytrees of arrays) to evaluate it at; concrete (untraced)
      arrays are folded into the graph as constants.

    **Returns:**

    The value of `fn(*args)`. When `fn` holds an operation the expansion does not handle,
    or exceeds one of the size limits (`MAX_INPUTS`, `MAX_NODES`, `MAX_OPERATIONS`),
    `fn(*args)` itself.

    Example: `scalar_graph(jax.grad(lambda x: 0.5 * x @ x), x)` is `x` itself, with no
    arithmetic left.
    """
    flat_args, in_tree = jax.tree_util.tree_flatten(args)
    specs = [jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)) for a in flat_args]

    def flat_fn(*flat):
        return fn(*jax.tree_util.tree_unflatten(in_tree, flat))

    if sum(int(np.prod(spec.shape)) for spec in specs) > MAX_INPUTS:
        return fn(*args)
    closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*specs)
    out_leaves, out_tree = jax.tree_util.tree_flatten(out_shape)
    try:
        graph = _Graph()
        expander = _Expander(graph)
        leaves = []  # (array, index) of every input scalar, in leaf order
        arrays = [_input(expander, leaves, a, varying=True) for a in flat_args]
        consts = [_input(expander, leaves, c, varying=False) for c in closed.consts]
        outputs = expander.run(closed.jaxpr, consts, arrays)
    except _Unsupported:
        return fn(*args)
    results = _emit(graph, outputs, leaves, out_leaves)
    if results is None:
        return fn(*args)
    return jax.tree_util.tree_unflatten(out_tree, results)


def _input(expander, leaves, value, varying):
    """Node ids for an input array: constants if it is concrete, else one leaf per entry
    (`varying`: an entry of the state rather than a parameter closed over)."""
    if not isinstance(value, jax.core.Tracer):
        return expander.constant_array(np.asarray(value))
    ids = np.empty(jnp.shape(value), dtype=np.int64)
    for idx in np.ndindex(ids.shape):
        ids[idx] = expander.graph.leaf(len(leaves), value.dtype, varying)
        leaves.append((value, idx))
    return ids
