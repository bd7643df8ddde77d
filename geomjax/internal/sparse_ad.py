"""Sparse forward-mode derivatives of functions of a state taken apart into scalars.

Inside compiled loops a state can be taken apart into its scalar entries (arrays of shape
`(1,)`, `scalars`) and a user's function of the flat state evaluated on them with
`geomjax.internal.pieces.evaluate_on_pieces`: a slice `x[3]` reads the entry, a slice `x[3:]` is a
view of entries, and nothing is concatenated unless an operation needs the whole vector.
Derivatives are then forward-mode partials in single entries (`partial`,
`sparse_partials`, `directional`), which never create the pads that reverse mode makes of
slices (on the CPU they split XLA's fusions), and skip the entries an output does not
depend on (`dependencies`, read off the jaxpr) and the products with entries that are
zero whatever the inputs (`structural_zeros`). Small linear algebra on lists of scalars
(`sdot`, `inverse`, `solve`) is written out; vectors are rebuilt only at the end.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Literal

from .._solve.linalg import small_solve


def scalars(a):
    """The entries of `a` in order, as arrays of shape `(1,)`."""
    flat = a.reshape(-1)
    return [lax.slice(flat, (i,), (i + 1,)) for i in range(flat.shape[0])]


def partial(fn, s, i):
    """∂fn/∂s_i by one forward-mode pass in the single scalar s_i (the others held fixed)."""
    head, tail = s[:i], s[i + 1 :]
    return jax.jvp(lambda si: fn(head + (si,) + tail), (s[i],), (jnp.ones_like(s[i]),))[1]


def dependencies(fn, s):
    """For each output of `fn(s)` (a list of arrays), the set of indices i of the scalar
    inputs s_i it depends on, read off the traced jaxpr (conservatively through sub-calls)."""
    specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in s]
    closed = jax.make_jaxpr(lambda *a: fn(tuple(a)))(*specs)
    jaxpr = closed.jaxpr
    deps = {v: {i} for i, v in enumerate(jaxpr.invars)}
    for eqn in jaxpr.eqns:
        d = set()
        for v in eqn.invars:
            if not isinstance(v, Literal):
                d |= deps.get(v, set())
        for o in eqn.outvars:
            deps[o] = d
    return [set() if isinstance(v, Literal) else deps.get(v, set()) for v in jaxpr.outvars]


def sparse_partials(fn, s):
    """table[i][o] = ∂fn_o/∂s_i, None where output o does not depend on s_i (no work)."""
    deps = dependencies(fn, s)
    table = []
    for i in range(len(s)):
        needed = [i in d for d in deps]
        if not any(needed):
            table.append([None] * len(deps))
            continue
        row = partial(fn, s, i)
        table.append([r.reshape(1) if n else None for r, n in zip(row, needed)])
    return table


def _zero_mask_eqn(eqn, ins, out_avals):
    """Elementwise 'is exactly zero' for the outputs of one equation (False when unsure)."""
    if not out_avals:
        return []
    name = eqn.primitive.name
    p = eqn.params
    shape = out_avals[0].shape

    def full(value):
        return [np.full(a.shape, value, dtype=bool) for a in out_avals]

    try:
        if "jaxpr" in p or "call_jaxpr" in p:
            if name not in ("jit", "pjit", "closed_call", "core_call", "remat", "checkpoint"):
                return full(False)
            sub = p.get("jaxpr", p.get("call_jaxpr"))
            consts = getattr(sub, "consts", [])
            return _zero_mask_jaxpr(getattr(sub, "jaxpr", sub), ins, consts)
        if name == "stack":
            return [np.stack([np.broadcast_to(m, out_avals[0].shape[:0] + np.shape(m)) for m in ins], axis=p["axis"])]
        if name == "broadcast_in_dim":
            x = ins[0]
            dims = p["broadcast_dimensions"]
            expanded = x.reshape([x.shape[dims.index(d)] if d in dims else 1 for d in range(len(shape))])
            return [np.broadcast_to(expanded, shape).copy()]
        if name in ("reshape", "squeeze", "expand_dims"):
            return [ins[0].reshape(shape)]
        if name == "concatenate":
            return [np.concatenate(ins, axis=p["dimension"])]
        if name == "slice":
            idx = tuple(slice(a, b, c) for a, b, c in zip(p["start_indices"], p["limit_indices"], p["strides"] or [1] * len(shape)))
            return [ins[0][idx]]
        if name in ("neg", "convert_element_type", "copy", "sin", "tan", "sinh", "tanh", "sqrt", "abs", "sign"):
            return [np.broadcast_to(ins[0], shape).copy()]
        if name == "mul":
            return [np.broadcast_to(ins[0] | ins[1], shape).copy()]
        if name in ("add", "sub", "add_any"):
            return [np.broadcast_to(ins[0] & ins[1], shape).copy()]
        if name == "div":
            return [np.broadcast_to(ins[0], shape).copy()]
        if name == "integer_pow" and p["y"] > 0:
            return [np.broadcast_to(ins[0], shape).copy()]
    except (ValueError, IndexError, KeyError, TypeError):
        pass
    return full(False)


def _const_mask(value, shape):
    if isinstance(value, jax.core.Tracer):
        return np.zeros(shape, dtype=bool)
    return np.asarray(value) == 0


def _zero_mask_jaxpr(jaxpr, in_masks, consts=()):
    env = {}

    def read(v):
        if isinstance(v, Literal):
            return np.full(np.shape(v.val), np.all(np.asarray(v.val) == 0), dtype=bool)
        return env[v]

    for v, m in zip(jaxpr.invars, in_masks):
        env[v] = m
    for i, v in enumerate(jaxpr.constvars):
        env[v] = _const_mask(consts[i], v.aval.shape) if i < len(consts) else np.zeros(v.aval.shape, dtype=bool)
    for eqn in jaxpr.eqns:
        outs = _zero_mask_eqn(eqn, [read(v) for v in eqn.invars], [o.aval for o in eqn.outvars])
        for o, m in zip(eqn.outvars, outs):
            env[o] = m
    return [read(v) for v in jaxpr.outvars]


def structural_zeros(fn, *args):
    """Boolean mask of the entries of `fn(*args)` that are exactly zero whatever the inputs
    (e.g. the constant 0 in ω(q) = (sin φ, −cos φ, 0)), read off the traced jaxpr.

    Used to skip multiplications by those zeros: XLA keeps x·0 (it is NaN for x = inf),
    and in the third derivatives of the nonholonomic field they add up."""
    specs = [jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)) for a in args]
    closed = jax.make_jaxpr(fn)(*specs)
    ins = [np.zeros(sp.shape, dtype=bool) for sp in specs]
    (mask,) = _zero_mask_jaxpr(closed.jaxpr, ins, closed.consts)[:1]
    return mask


def directional(fn, s, start, direction):
    """jvp of fn(s) along `direction` on the entries s[start:], skipping None entries
    (they are structural zeros: those inputs are held fixed, not given zero tangents)."""
    idx = [start + i for i, d in enumerate(direction) if d is not None]
    tangents = tuple(d for d in direction if d is not None)
    if not idx:
        raise ValueError("a direction with no nonzero entry")
    base = list(s)

    def restricted(vals):
        full = list(base)
        for i, v in zip(idx, vals):
            full[i] = v
        return fn(tuple(full))

    return jax.jvp(restricted, (tuple(s[i] for i in idx),), (tangents,))


def sdot_sparse(u, v):
    """Σ u_i v_i over the entries where v_i is not None (None if there are none)."""
    acc = None
    for a, b in zip(u, v):
        if b is None:
            continue
        acc = a * b if acc is None else acc + a * b
    return acc


def sdot(u, v):
    """Σ u_i v_i for two equally long lists of scalars, written out."""
    acc = u[0] * v[0]
    for a, b in zip(u[1:], v[1:]):
        acc = acc + a * b
    return acc


def inverse(c):
    """Inverse of a k×k matrix given as nested lists of scalars (written out for k ≤ 2)."""
    k = len(c)
    if k == 1:
        return [[1.0 / c[0][0]]]
    if k == 2:
        r = 1.0 / (c[0][0] * c[1][1] - c[0][1] * c[1][0])
        return [[c[1][1] * r, -c[0][1] * r], [-c[1][0] * r, c[0][0] * r]]
    mat = jnp.concatenate([jnp.concatenate(row) for row in c]).reshape(k, k)
    inv = small_solve(mat, np.eye(k))  # numpy: literal constants XLA can fold
    return [[lax.slice(inv, (a, b), (a + 1, b + 1)).reshape(1) for b in range(k)] for a in range(k)]


def matvec(a, x):
    """The product of a matrix and a vector given as (nested) lists of scalars."""
    return [sdot(row, x) for row in a]


def solve(c, b):
    """Solve C x = b for a k×k matrix C and vector b given as (nested) lists of scalars."""
    return matvec(inverse(c), b)
