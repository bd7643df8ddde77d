"""Structural Jacobian sparsity, read off the jaxpr at trace time.

`jacobian_pattern(fn, n)` traces `fn: R^n -> R^m` to a jaxpr and propagates, entry by
entry, the set of inputs each intermediate entry depends on (a boolean array of shape
`var.shape + (n,)`). The pattern is *structural*: an entry marked False is zero for every
input, because the output does not depend on that input through any path of the graph.
It is sound (never misses a dependence):

- elementwise, shape (reshape, squeeze, transpose, broadcast, slice, pad, concatenate) and
  reduction primitives have exact entrywise rules;
- `dot_general` and `mul` use the zero pattern of operands whose values are known at trace
  time (constants, literals, and what is folded from them), so multiplying by a constant
  sparse matrix keeps its sparsity;
- calls (`pjit`, `custom_jvp_call`, `custom_vjp_call`, `remat`, `closed_call`) are entered;
- every other primitive (gather, scatter, control flow, linear algebra, ...) is treated as
  dense: each of its outputs depends on everything any of its inputs depends on.

Values are never sampled, so coincidental zeros cannot hide a dependence (unlike a pattern
taken from `jax.jacfwd` at random states).

Also here: `greedy_coloring` (columns that share no row get one colour, so one
Jacobian-vector product evaluates all of them at once: Curtis–Powell–Reed) and
`bandwidth`.
"""

import string

import jax
import numpy as np
from jax.extend.core import Literal

_ELEMENTWISE = {
    "add", "add_any", "sub", "mul", "div", "neg", "sign", "floor", "ceil", "round", "is_finite",
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan", "asin",
    "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "atan2", "sqrt", "rsqrt", "cbrt",
    "pow", "integer_pow", "square", "abs", "max", "min", "rem", "select_n", "clamp",
    "convert_element_type", "copy", "copy_p", "erf", "erfc", "erf_inv", "lgamma", "digamma",
    "real", "imag", "conj", "complex", "nextafter", "eq", "ne", "lt", "le", "gt", "ge", "and",
    "or", "not", "xor", "stop_gradient", "reduce_precision", "optimization_barrier",
}
_REDUCTIONS = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin",
               "reduce_and", "reduce_or"}
_CALL_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")
_FOLD_LIMIT = 1 << 16  # fold constants up to this many entries


class _Entry:
    """What is known about one variable: its dependence pattern and, if constant, its value."""

    __slots__ = ("dep", "value")

    def __init__(self, dep, value=None):
        self.dep = dep
        self.value = value

    def nonzero(self):
        """Entries that may be nonzero: the constant's zero pattern, else everywhere."""
        if self.value is None:
            return np.ones(self.dep.shape[:-1], bool)
        return np.asarray(self.value) != 0


def _dense(ins, out_avals, n):
    """Every output entry depends on everything any input depends on."""
    union = np.zeros(n, bool)
    for e in ins:
        union |= e.dep.reshape(-1, n).any(axis=0)
    return [np.broadcast_to(union, tuple(a.shape) + (n,)).copy() for a in out_avals]


def _broadcast_in_dim(dep, shape, dims, n):
    view = [1] * len(shape)
    for src, dst in enumerate(dims):
        view[dst] = dep.shape[src]
    return np.broadcast_to(dep.reshape(tuple(view) + (n,)), tuple(shape) + (n,)).copy()


def _pad(op, padval, config, n):
    """lax.pad on the pattern: the padding entries get the padding value's pattern."""
    shape = op.shape[:-1]
    # first place the operand with interior padding and non-negative edges, then crop
    full = [max(lo, 0) + s + max(s - 1, 0) * it + max(hi, 0) for s, (lo, hi, it) in zip(shape, config)]
    out = np.broadcast_to(padval.reshape(-1, n).any(axis=0), tuple(full) + (n,)).copy()
    index = tuple(slice(max(lo, 0), max(lo, 0) + (s - 1) * (it + 1) + 1 if s else max(lo, 0), it + 1)
                  for s, (lo, _, it) in zip(shape, config))
    out[index] = op
    crop = tuple(slice(-min(lo, 0), f + min(hi, 0)) for f, (lo, hi, _) in zip(full, config))
    return out[crop]


def _dot_general(a: _Entry, b: _Entry, params, n):
    (lc, rc), (lb, rb) = params["dimension_numbers"]
    letters = iter(string.ascii_letters)
    la = [None] * a.dep.ndim
    ra = [None] * b.dep.ndim
    la[-1] = ra[-1] = "Z"  # the dependence axis (only on the operand that carries it)
    for i, j in zip(lb, rb):
        la[i] = ra[j] = next(letters)
    for i, j in zip(lc, rc):
        la[i] = ra[j] = next(letters)
    for k in range(a.dep.ndim - 1):
        if la[k] is None:
            la[k] = next(letters)
    for k in range(b.dep.ndim - 1):
        if ra[k] is None:
            ra[k] = next(letters)
    free_a = [la[k] for k in range(a.dep.ndim - 1) if k not in lc and k not in lb]
    free_b = [ra[k] for k in range(b.dep.ndim - 1) if k not in rc and k not in rb]
    out = "".join([la[i] for i in lb] + free_a + free_b) + "Z"
    sa, sb = "".join(la), "".join(ra)
    # out[i, j] depends on a[i, k] where b[k, j] may be nonzero, and on b[k, j] where a[i, k] may be.
    t1 = np.einsum(f"{sa},{sb[:-1]}->{out}", a.dep.astype(np.int32), b.nonzero().astype(np.int32))
    t2 = np.einsum(f"{sa[:-1]},{sb}->{out}", a.nonzero().astype(np.int32), b.dep.astype(np.int32))
    return (t1 > 0) | (t2 > 0)


def _fold(eqn, ins):
    """Evaluate an equation whose inputs are all known constants (None if it cannot be)."""
    if any(e.value is None for e in ins) or any(k in eqn.params for k in _CALL_PARAMS):
        return None
    if any(np.size(e.value) > _FOLD_LIMIT for e in ins):
        return None
    try:
        with jax.ensure_compile_time_eval():
            out = eqn.primitive.bind(*[e.value for e in ins], **eqn.params)
        outs = out if eqn.primitive.multiple_results else [out]
        return [np.asarray(o) for o in outs]
    except Exception:  # folding is an optimisation only
        return None


def _sub_jaxpr(eqn):
    for key in _CALL_PARAMS:
        if key in eqn.params:
            sub = eqn.params[key]
            if hasattr(sub, "jaxpr"):  # ClosedJaxpr
                return sub.jaxpr, list(sub.consts)
            return sub, []
    return None


def _eqn_patterns(eqn, ins, n):
    """The dependence patterns of one equation's outputs."""
    name = eqn.primitive.name
    p = eqn.params
    outs = [v.aval for v in eqn.outvars]
    if name in _ELEMENTWISE and len(outs) == 1:
        shape = tuple(outs[0].shape)
        if name == "mul" and len(ins) == 2:
            a, b = ins
            nz_a = np.broadcast_to(a.nonzero(), shape)[..., None]
            nz_b = np.broadcast_to(b.nonzero(), shape)[..., None]
            da = np.broadcast_to(a.dep, shape + (n,))
            db = np.broadcast_to(b.dep, shape + (n,))
            return [(da & nz_b) | (nz_a & db)]
        acc = np.zeros(shape + (n,), bool)
        for e in ins:
            acc |= np.broadcast_to(e.dep, shape + (n,))
        return [acc]
    (first, *_) = ins if ins else (None,)
    if name in ("squeeze", "expand_dims") or (name == "reshape" and p.get("dimensions") is None):
        # row-major order is kept: only size-1 axes come or go
        return [first.dep.reshape(tuple(outs[0].shape) + (n,))]
    if name == "transpose":
        return [first.dep.transpose(tuple(p["permutation"]) + (first.dep.ndim - 1,))]
    if name == "broadcast_in_dim":
        return [_broadcast_in_dim(first.dep, p["shape"], p["broadcast_dimensions"], n)]
    if name == "slice":
        strides = p["strides"] or (1,) * len(p["start_indices"])
        index = tuple(slice(s, l, st) for s, l, st in zip(p["start_indices"], p["limit_indices"], strides))
        return [first.dep[index]]
    if name == "concatenate":
        return [np.concatenate([e.dep for e in ins], axis=p["dimension"])]
    if name == "split":
        bounds = np.cumsum(p["sizes"])[:-1]
        return np.split(first.dep, bounds, axis=p["axis"])
    if name == "pad":
        return [_pad(ins[0].dep, ins[1].dep, p["padding_config"], n)]
    if name == "rev":
        return [np.flip(first.dep, axis=tuple(p["dimensions"]))]
    if name in _REDUCTIONS:
        return [first.dep.any(axis=tuple(p["axes"]))]
    if name == "dot_general" and len(ins) == 2:
        return [_dot_general(ins[0], ins[1], p, n)]
    sub = _sub_jaxpr(eqn)
    if sub is not None and name in ("pjit", "jit", "closed_call", "core_call", "remat", "checkpoint",
                                    "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"):
        jaxpr, consts = sub
        k = len(jaxpr.invars)
        inner = _propagate(jaxpr, consts, ins[len(ins) - k:], n)
        return [e.dep for e in inner]
    return _dense(ins, outs, n)


def _propagate(jaxpr, consts, ins, n):
    env = {}
    for v, c in zip(jaxpr.constvars, consts):
        arr = np.asarray(c) if not isinstance(c, jax.core.Tracer) else None
        env[v] = _Entry(np.zeros(tuple(v.aval.shape) + (n,), bool), arr)
    for v, e in zip(jaxpr.invars, ins):
        env[v] = e

    def read(v):
        if isinstance(v, Literal):
            return _Entry(np.zeros(tuple(np.shape(v.val)) + (n,), bool), np.asarray(v.val))
        return env[v]

    for eqn in jaxpr.eqns:
        ins_e = [read(v) for v in eqn.invars]
        folded = _fold(eqn, ins_e)
        if folded is not None:
            for v, val in zip(eqn.outvars, folded):
                env[v] = _Entry(np.zeros(tuple(v.aval.shape) + (n,), bool), val)
            continue
        try:
            deps = _eqn_patterns(eqn, ins_e, n)
        except Exception:  # a rule that does not fit this equation: be conservative
            deps = _dense(ins_e, [v.aval for v in eqn.outvars], n)
        for v, d in zip(eqn.outvars, deps):
            env[v] = _Entry(np.asarray(d, bool).reshape(tuple(v.aval.shape) + (n,)))
    return [read(v) for v in jaxpr.outvars]


def jacobian_pattern(fn, n: int, dtype=np.float64) -> np.ndarray:
    """Structural sparsity of the Jacobian of `fn: R^n -> R^m` (flat vectors), shape `(m, n)`.

    Entry (i, j) is False only if output i cannot depend on input j (read off the jaxpr;
    see the module docstring). Traces `fn` on an abstract input; no values are used.

    Example: `jacobian_pattern(lambda x: x[1:] * x[:-1], 3)` is
    `[[True, True, False], [False, True, True]]`.
    """
    # a fresh wrapper: make_jaxpr caches by the function, and comparing bound methods of
    # modules holding arrays would compare those arrays (traced inside an outer jit)
    closed = jax.make_jaxpr(lambda x: fn(x))(jax.ShapeDtypeStruct((n,), dtype))
    jaxpr = closed.jaxpr
    (out,) = _propagate(jaxpr, list(closed.consts), [_Entry(np.eye(n, dtype=bool))], n)
    return out.dep.reshape(-1, n)


def greedy_coloring(pattern: np.ndarray) -> np.ndarray:
    """A colour per column of `pattern` (m, c) such that no two columns of one colour share a
    row: one product with the sum of a colour's unit vectors evaluates all its columns."""
    cols = pattern.shape[1]
    colors = np.full(cols, -1, dtype=np.int64)
    overlap = (pattern.T.astype(np.int32) @ pattern.astype(np.int32)) > 0
    for j in range(cols):
        used = {colors[i] for i in np.flatnonzero(overlap[j]) if colors[i] >= 0}
        c = 0
        while c in used:
            c += 1
        colors[j] = c
    return colors


def bandwidth(pattern: np.ndarray) -> int:
    """max |i − j| over the True entries (0 for a diagonal or empty pattern)."""
    rows, cols = np.nonzero(pattern)
    return int(np.max(np.abs(rows - cols))) if rows.size else 0
