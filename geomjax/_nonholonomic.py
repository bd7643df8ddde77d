"""Nonholonomic systems: the extension off the constraint set and its feedback field (seed 001).

A nonholonomic system is a Hamiltonian H on a phase space whose states split into a
configuration piece and a momentum piece m (T*Rⁿ: (q, p); left-trivialised bundles:
(g, μ); Lie–Poisson spaces: only Π), with k velocity constraints

    ω(q)·v = 0,    v = ∂H/∂m (the velocity; on T*Rⁿ, q̇),

ω a (k, d) array of one-forms, not necessarily orthonormal. Everything else is derived by
autodiff (seed 001 §2, Remark 2.4, as reconstructed in DESIGN.md):

    J = ω ∂H/∂m                          constraint momenta, the constraint set is J = 0
    C_ab = ⟨∂J_a/∂m, ω_b⟩                 (= ω M⁻¹ ωᵀ for H = ½ mᵀM⁻¹m + U)
    H_ext = H − ½ Jᵀ C⁻¹ J               extended Hamiltonian (= H on J = 0)
    λ = −C⁻¹ {J, H_ext}                   multipliers
    ẋ = B ∇H_ext + (0, ωᵀλ)               the force acts on the momentum piece only.

Then J̇ = {J, H_ext} + Cλ = 0 everywhere, and Ḣ_ext = λ·(ω ∂H_ext/∂m) = 0 whenever C does
not depend on m (kinetic energy quadratic in the momenta): J and H_ext are first
integrals on the whole phase space, and on J = 0 the field is the Lagrange–d'Alembert
field. A feedback field then adds −L∇V with V = ½ΔᵀKΔ, Δ = (J, H_ext − H₀, I − I₀), and,
for structures embedded in Euclidean space, + k₀/4 ‖D‖² with D the embedding defect
(RᵀR − I for SO(3), cos² + sin² − 1 for SE(2)).

How it is computed inside loops (measured on the knife edge against the same field
written by hand, `benchmarks/nonholonomic_vs_hand.py`): the state is taken apart into its
scalar entries and the user's functions are evaluated on them (no slicing of vectors);
all derivatives are forward-mode partials in single entries, skipping entries a quantity
does not depend on and one-form entries that are structurally zero; the gradient of H_ext
comes from H − μ·J + ½μᵀCμ with μ = C⁻¹J frozen (no derivative of the solve); C⁻¹ is
written out for k ≤ 2. Reverse mode on vectors produced pads that split XLA's CPU fusions
(15× the hand-written field); this form runs at about 1.1× of it for one trajectory.
"""


import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Literal

from ._feedback import _check_metric, _gain_array
from ._field import AbstractField
from ._linalg import small_solve
from ._structures import CanonicalStructure, LiePoissonSE2, LiePoissonSO3
from ._system import System
from ._validate import as_state, is_concrete

# --------------------------------------------------------------------------------------
# Which piece is the momentum


def nonholonomic_layout(structure) -> str | None:
    """`"pair"` when pieces are (configuration, momentum), `"momentum"` when the whole state
    is the momentum (Lie–Poisson spaces), None when the structure does not say."""
    if isinstance(structure, CanonicalStructure):
        return "pair"
    if isinstance(structure, (LiePoissonSO3, LiePoissonSE2)):
        return "momentum"
    return getattr(structure, "nonholonomic_layout", None)


def check_nonholonomic_system(system: System, omega) -> None:
    """Validation run by `System(..., nonholonomic=omega)` (before the field is stored)."""
    if not callable(omega):
        raise TypeError("nonholonomic must be a callable returning the (k, d) constraint one-forms ω")
    if system.holonomic is not None or system.constraints is not None:
        raise ValueError(
            "nonholonomic constraints cannot be combined with holonomic= or constraints= in one System"
        )
    if nonholonomic_layout(system.structure) is None:
        raise ValueError(
            f"nonholonomic constraints need to know which coordinates are momenta; the structure "
            f"{type(system.structure).__name__} does not say. Use geomjax.canonical(n), "
            "geomjax.lie_poisson_so3(), geomjax.lie_poisson_se2(), geomjax.left_trivialised_so3() "
            "or geomjax.left_trivialised_se2(), or give your structure a class attribute "
            "nonholonomic_layout = 'pair' with pieces (configuration, momentum)"
        )


def _require(system) -> None:
    if not isinstance(system, System):
        raise TypeError(f"expected a geomjax.System, got {type(system).__name__}")
    if system.nonholonomic is None:
        raise ValueError("this System has no nonholonomic constraints: build it with System(..., nonholonomic=omega)")


# --------------------------------------------------------------------------------------
# Scalar pieces
#
# Inside loops the state is taken apart into its scalar entries (arrays of shape (1,)),
# and every function of the user's (H, ω, integrals) is evaluated with its flat input
# replaced by these scalars (`_evaluate_on_scalars`): a slice x[3] reads the entry, a
# slice x[3:] is a view of entries, and nothing is concatenated unless an operation needs
# the whole vector. Derivatives are forward-mode partials in single entries
# (`_sparse_partials`, `_directional`), which never create the pads that reverse mode
# makes of slices; vectors are rebuilt only at the end.

_UNROLL = 8


class _View:
    """A flat vector held as its consecutive pieces (for `_evaluate_on_scalars`)."""

    def __init__(self, pieces):
        self.pieces = list(pieces)
        self.bounds = []
        start = 0
        for piece in self.pieces:
            self.bounds.append((start, start + piece.shape[0]))
            start += piece.shape[0]
        self.size = start
        self._joined = None

    def joined(self):
        if self._joined is None:
            self._joined = self.pieces[0] if len(self.pieces) == 1 else jnp.concatenate(self.pieces)
        return self._joined

    def take(self, start, limit):
        """Entries start:limit as a piece or a sub-view, or None when not aligned."""
        for piece, (lo, hi) in zip(self.pieces, self.bounds):
            if lo <= start and limit <= hi:
                if (start, limit) == (lo, hi):
                    return piece
                return lax.slice(piece, (start - lo,), (limit - lo,))
        first = [b[0] for b in self.bounds].index(start) if start in [b[0] for b in self.bounds] else None
        last = [b[1] for b in self.bounds].index(limit) if limit in [b[1] for b in self.bounds] else None
        if first is None or last is None:
            return None
        return _View(self.pieces[first : last + 1])


def _view_outputs(eqn, view):
    name = eqn.primitive.name
    p = eqn.params
    if name == "slice" and (p.get("strides") is None or tuple(p["strides"]) == (1,)):
        out = view.take(p["start_indices"][0], p["limit_indices"][0])
        return None if out is None else [out]
    if name == "split" and p.get("axis", 0) == 0:
        outs, start = [], 0
        for size in p["sizes"]:
            out = view.take(start, start + int(size))
            if out is None:
                return None
            outs.append(out)
            start += int(size)
        return outs
    return None


def _evaluate_on_scalars(fn, pieces):
    """`fn(concatenate(pieces))` for a function of a flat vector, evaluated so that slices of
    the input (`x[3]`, `x[:3]`, `x[3:][0]`) read the pieces directly.

    The input is never concatenated unless an operation other than slicing needs it whole.
    Forward-mode derivatives with respect to one piece then touch only the operations that
    read it (a concatenation would give every other piece a zero tangent to multiply).
    """
    pieces = list(pieces)
    spec = jax.ShapeDtypeStruct((sum(x.shape[0] for x in pieces),), pieces[0].dtype)
    closed, out_shape = jax.make_jaxpr(lambda x: fn(x), return_shape=True)(spec)
    jaxpr = closed.jaxpr
    env = {v: c for v, c in zip(jaxpr.constvars, closed.consts)}
    env[jaxpr.invars[0]] = _View(pieces)

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    for eqn in jaxpr.eqns:
        vals = [read(v) for v in eqn.invars]
        outs = None
        if vals and isinstance(vals[0], _View):
            outs = _view_outputs(eqn, vals[0])
        if outs is None:
            vals = [x.joined() if isinstance(x, _View) else x for x in vals]
            params = eqn.primitive.get_bind_params(eqn.params)
            subfuns = ()
            if isinstance(params, tuple):
                subfuns, params = params
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*subfuns, *vals, **params)
            if not eqn.primitive.multiple_results:
                outs = [outs]
        for var, val in zip(eqn.outvars, outs):
            env[var] = val
    results = [read(v) for v in jaxpr.outvars]
    results = [x.joined() if isinstance(x, _View) else x for x in results]
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), results)


def _scalars(a):
    flat = a.reshape(-1)
    return [lax.slice(flat, (i,), (i + 1,)) for i in range(flat.shape[0])]


def _partial(fn, s, i):
    """∂fn/∂s_i by one forward-mode pass in the single scalar s_i (the others held fixed)."""
    head, tail = s[:i], s[i + 1 :]
    return jax.jvp(lambda si: fn(head + (si,) + tail), (s[i],), (jnp.ones_like(s[i]),))[1]


def _dependencies(fn, s):
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


def _sparse_partials(fn, s):
    """table[i][o] = ∂fn_o/∂s_i, None where output o does not depend on s_i (no work)."""
    deps = _dependencies(fn, s)
    table = []
    for i in range(len(s)):
        needed = [i in d for d in deps]
        if not any(needed):
            table.append([None] * len(deps))
            continue
        row = _partial(fn, s, i)
        table.append([r.reshape(1) if n else None for r, n in zip(row, needed)])
    return table


def _zero_mask_eqn(eqn, ins, out_avals):
    """Elementwise 'is exactly zero' for the outputs of one equation (False when unsure)."""
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


def _directional(fn, s, start, direction):
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


def _sdot_sparse(u, v):
    """Σ u_i v_i over the entries where v_i is not None (None if there are none)."""
    acc = None
    for a, b in zip(u, v):
        if b is None:
            continue
        acc = a * b if acc is None else acc + a * b
    return acc


def _sdot(u, v):
    acc = u[0] * v[0]
    for a, b in zip(u[1:], v[1:]):
        acc = acc + a * b
    return acc


def _inverse(c):
    """Inverse of a k×k matrix given as nested lists of scalars (written out for k ≤ 2)."""
    k = len(c)
    if k == 1:
        return [[1.0 / c[0][0]]]
    if k == 2:
        r = 1.0 / (c[0][0] * c[1][1] - c[0][1] * c[1][0])
        return [[c[1][1] * r, -c[0][1] * r], [-c[1][0] * r, c[0][0] * r]]
    mat = jnp.concatenate([jnp.concatenate(row) for row in c]).reshape(k, k)
    inv = small_solve(mat, jnp.eye(k, dtype=mat.dtype))
    return [[lax.slice(inv, (a, b), (a + 1, b + 1)).reshape(1) for b in range(k)] for a in range(k)]


def _matvec(a, x):
    return [_sdot(row, x) for row in a]


def _solve(c, b):
    """Solve C x = b for a k×k matrix C and vector b given as (nested) lists of scalars."""
    return _matvec(_inverse(c), b)


def _dot(u, v):
    """Inner product of two short vectors, written out."""
    if u.shape[0] <= _UNROLL:
        acc = u[0] * v[0]
        for i in range(1, u.shape[0]):
            acc = acc + u[i] * v[i]
        return acc
    return jnp.sum(u * v)


def _rows_dot(w, v):
    """w @ v for a (k, d) array w, as k written-out inner products."""
    return jnp.stack([_dot(w[a], v) for a in range(w.shape[0])])


def _combine_rows(w, coeffs):
    """Σ_a coeffs_a w_a, the one-forms weighted by the multipliers: ωᵀλ."""
    acc = coeffs[0] * w[0]
    for a in range(1, w.shape[0]):
        acc = acc + coeffs[a] * w[a]
    return acc


# --------------------------------------------------------------------------------------
# The derived quantities at one state


class _Parts:
    """The system's functions on the scalar pieces `s` of a state shaped like `z`.

    `s` lists the entries of the flat state in order (shape (1,) each); the first `nc` are
    the configuration, the rest the momentum (`nc = 0` on Lie–Poisson spaces).
    """

    def __init__(self, system: System, z):
        self.system = system
        self.structure = system.structure
        self.kind = nonholonomic_layout(self.structure)
        leaves, self.treedef = jax.tree_util.tree_flatten(z)
        self.shapes = [leaf.shape for leaf in leaves]
        self.nc = leaves[0].size if self.kind == "pair" else 0
        self.config_is_vector = self.kind == "pair" and leaves[0].ndim == 1
        self._form_zeros = None
        self._forms_constant = False
        if self.kind == "momentum":
            try:
                deps = _dependencies(lambda ss: [self.forms(ss)], self.explode(z))
                self._forms_constant = not deps[0]
            except Exception:
                self._forms_constant = False

    # -- conversions
    def explode(self, z):
        out = []
        for leaf in jax.tree_util.tree_leaves(z):
            out.extend(_scalars(leaf))
        return tuple(out)

    def implode(self, s):
        leaves, start = [], 0
        for shape in self.shapes:
            size = int(np.prod(shape))
            leaves.append(jnp.concatenate(s[start : start + size]).reshape(shape))
            start += size
        return jax.tree_util.tree_unflatten(self.treedef, leaves)

    def _config(self, s):
        return self.implode(s)[0] if self.kind == "pair" else self.implode(s)

    # -- the user's functions on scalars
    def energy(self, s):
        return _evaluate_on_scalars(self.system.hamiltonian, list(s)).reshape(())

    def forms(self, s):
        """ω as a (k, d) array."""
        if self.kind == "momentum":
            w = _evaluate_on_scalars(self.system.nonholonomic, list(s))
        elif self.config_is_vector:
            w = _evaluate_on_scalars(self.system.nonholonomic, list(s[: self.nc]))
        else:
            w = self.system.nonholonomic(self._config(s))
        w = jnp.asarray(w)
        return w[None, :] if w.ndim == 1 else w

    def form_entries(self, s):
        """ω and its entries as scalars, None for entries that are structurally zero."""
        w = self.forms(s)
        k, d = w.shape
        zero = self.form_zeros(s)
        return w, [
            [None if zero[a, i] else lax.slice(w, (a, i), (a + 1, i + 1)).reshape(1) for i in range(d)]
            for a in range(k)
        ]

    def form_zeros(self, s):
        if self._form_zeros is None:
            arg = self._config(s) if self.kind == "pair" else self.implode(s)
            fn = lambda a: jnp.atleast_2d(jnp.asarray(self.system.nonholonomic(a)))
            try:
                self._form_zeros = structural_zeros(fn, arg)
            except Exception:  # the analysis is an optimisation only
                self._form_zeros = np.zeros(fn(arg).shape, dtype=bool)
        return self._form_zeros

    def integrals(self, s):
        return _evaluate_on_scalars(self.system.integral_values, list(s))

    def defect(self, s):
        return self.structure.embedding_defect(self._config(s)).reshape(-1)

    @property
    def embedded(self) -> bool:
        return self.kind == "pair" and hasattr(self.structure, "embedding_defect")

    # -- derived quantities
    def velocity(self, s):
        """v = ∂H/∂m, as scalars (one forward-mode pass per momentum entry)."""
        s = tuple(s)
        return tuple(_partial(self.energy, s, i).reshape(1) for i in range(self.nc, len(s)))

    def momenta(self, s):
        """J = ω ∂H/∂m, a list of k scalars."""
        _, rows = self.form_entries(s)
        v = self.velocity(s)
        return [_sdot_sparse(v, row) for row in rows]

    def matrix(self, s):
        """C_ab = ⟨∂J_a/∂m, ω_b⟩ as nested lists (column b: derivative of J along ω_b in m)."""
        _, rows = self.form_entries(s)
        cols = [_directional(self.momenta, tuple(s), self.nc, row)[1] for row in rows]
        k = len(rows)
        return [[cols[b][a] for b in range(k)] for a in range(k)]

    def core(self, s):
        """(J, C⁻¹, μ = C⁻¹J) at s; C⁻¹ is formed once (one reciprocal)."""
        j = self.momenta(s)
        c_inv = _inverse(self.matrix(s))
        mu = _matvec(c_inv, j)
        return j, c_inv, mu

    def extended(self, s):
        """H_ext = H − ½ JᵀC⁻¹J."""
        j, _, mu = self.core(s)
        return self.energy(s) - 0.5 * _sdot(j, mu).reshape(())

    def direction(self, s, coeffs):
        """u = ωᵀc in the momentum (entries None where structurally zero)."""
        _, rows = self.form_entries(s)
        return [_sdot_sparse(coeffs, [row[i] for row in rows]) for i in range(len(s) - self.nc)]

    @property
    def forms_fixed(self) -> bool:
        """True when ω does not depend on the momentum (always on pair layouts)."""
        return self.kind == "pair" or self._forms_constant

    def weighted_momenta(self, s, coeffs):
        """c·J(s). With ω independent of m this is the derivative of H along u = ωᵀc."""
        if self.forms_fixed:
            u = self.direction(s, coeffs)
            if all(x is None for x in u):
                return jnp.zeros_like(s[0])
            return _directional(self.energy, tuple(s), self.nc, u)[1].reshape(1)
        return _sdot(coeffs, self.momenta(s))

    def half_quadratic(self, s, mu):
        """½ μᵀC(s)μ with μ fixed: the derivative of μ·J along u = ωᵀμ in m (with ω
        independent of m: the second derivative of H along u)."""
        u = self.direction(s, mu)
        if all(x is None for x in u):
            return jnp.zeros_like(s[0])
        if self.forms_fixed:
            inner = lambda ss: _directional(self.energy, ss, self.nc, u)[1]
        else:
            inner = lambda ss: _sdot(mu, self.momenta(ss))
        return 0.5 * _directional(inner, tuple(s), self.nc, u)[1].reshape(1)

    def field(self, s, z, weights=None, extra=None):
        """The extended field at the state z (scalars s), with shared first derivatives.

        With μ = C⁻¹J frozen, H_ext = H − μ·J + ½μᵀCμ at this point and its gradient is
        ∇H − (∇J)ᵀμ + ½μᵀ(∇C)μ (no derivative of the solve). One forward-mode pass per
        state entry s_i differentiates (H, μ·J, ½μᵀCμ, w·J, extra(s)); `weights` w and
        `extra` serve the feedback term. {J, H_ext} = DJ·X_Hext is one more forward pass.

        Returns (X_Hext, H_ext, J, λ, ∇H_ext, ∂(w·J)/∂s_i, ∂extra/∂s_i, weights), the
        middle three as lists over the state entries i (None where structurally zero).
        """
        s = tuple(s)
        j, c_inv, mu = self.core(s)
        h_ext = self.energy(s) - 0.5 * _sdot(j, mu).reshape(())
        k = len(j)
        if weights is not None:
            weights = weights(j, h_ext)
            w_j = weights[0]

        def terms(ss):
            out = [self.energy(ss).reshape(1), self.weighted_momenta(ss, mu), self.half_quadratic(ss, mu)]
            if weights is not None:
                out.append(self.weighted_momenta(ss, w_j))
            if extra is not None:
                out = out + list(extra(ss))
            return out

        table = _sparse_partials(terms, s)
        zero = jnp.zeros_like(s[0])
        grad = [_sdot_sparse([1.0, -1.0, 1.0], row[:3]) for row in table]
        x_h = self.structure.apply(z, self.implode(tuple(zero if g is None else g for g in grad)))
        _, j_dot = jax.jvp(self.momenta, (s,), (self.explode(x_h),))
        lam = [-x for x in _matvec(c_inv, j_dot)]
        n0 = 3 + (weights is not None)
        return (
            x_h,
            h_ext,
            j,
            lam,
            grad,
            [row[3] for row in table] if weights is not None else None,
            [row[n0:] for row in table],
            weights,
        )

    def add_force(self, s, x_h, lam):
        """ẋ = X_Hext + (0, ωᵀλ), the force added entry by entry (skipping structural zeros)."""
        _, rows = self.form_entries(s)
        m_dot = x_h[1] if self.kind == "pair" else x_h
        entries = _scalars(m_dot)
        for i in range(len(entries)):
            f = _sdot_sparse(lam, [row[i] for row in rows])
            if f is not None:
                entries[i] = entries[i] + f
        m_dot = jnp.concatenate(entries).reshape(m_dot.shape)
        return (x_h[0], m_dot) if self.kind == "pair" else m_dot


def _at(system, x):
    """(_Parts, scalars, pieces) at a flat state."""
    z = system.structure.split(jnp.asarray(x))
    parts = _Parts(system, z)
    return parts, parts.explode(z), z


def _matrix_array(c):
    return jnp.concatenate([jnp.concatenate(row) for row in c]).reshape(len(c), len(c))


@eqx.filter_jit
def _matrix_at(system, x):
    parts, s, _ = _at(system, x)
    return _matrix_array(parts.matrix(s))


def _check_matrix_at(system, x0) -> None:
    c = np.asarray(_matrix_at(system, x0))
    if not np.all(np.isfinite(c)):
        raise ValueError("the nonholonomic matrix C_ab = ⟨∂J_a/∂m, ω_b⟩ is not finite at x0")
    sv = np.linalg.svd(c, compute_uv=False)
    if sv[0] == 0.0 or sv[-1] <= 1e-12 * max(sv[0], 1.0):
        raise ValueError(
            "the nonholonomic matrix C_ab = ⟨∂J_a/∂m, ω_b⟩ is singular at x0 (singular values "
            f"{np.array2string(sv, precision=3)}): the constraint one-forms are linearly "
            "dependent there, or the kinetic energy is degenerate along them"
        )


# --------------------------------------------------------------------------------------
# The extended field


class NonholonomicField(AbstractField):
    """The extended nonholonomic field ẋ = B∇H_ext + (0, ωᵀλ), λ = −C⁻¹{J, H_ext} (seed 001 §2).

    Built by `geomjax.nonholonomic_field(system)`. Besides `field(x)` it evaluates the
    derived quantities on flat states: `momenta(x)` (J), `matrix(x)` (C),
    `extended_hamiltonian(x)` (H_ext), `multipliers(x)` (λ) and `quantities(x)`
    (F = (J, H_ext, integrals)).
    """

    system: System

    def split(self, x):
        return self.system.structure.split(x)

    def merge(self, z):
        return self.system.structure.merge(z)

    @property
    def dim(self):
        return self.system.dim

    def check(self, x0) -> None:
        _check_matrix_at(self.system, x0)

    def rhs(self, z):
        parts = _Parts(self.system, z)
        s = parts.explode(z)
        x_h, _, _, lam, *_ = parts.field(s, z)
        return parts.add_force(s, x_h, lam)

    def momenta(self, x):
        """J(x) = ω ∂H/∂m, shape (k,)."""
        parts, s, _ = _at(self.system, x)
        return jnp.concatenate(parts.momenta(s))

    def matrix(self, x):
        """C(x), shape (k, k)."""
        parts, s, _ = _at(self.system, x)
        return _matrix_array(parts.matrix(s))

    def extended_hamiltonian(self, x):
        """H_ext(x) = H − ½ JᵀC⁻¹J."""
        parts, s, _ = _at(self.system, x)
        return parts.extended(s)

    def multipliers(self, x):
        """λ(x) = −C⁻¹{J, H_ext}, shape (k,)."""
        parts, s, z = _at(self.system, x)
        return jnp.concatenate(parts.field(s, z)[3])

    def quantities(self, x):
        """F(x) = (J, H_ext, integrals), the quantities the feedback field stabilises."""
        return nonholonomic_quantities(self.system, x)


def nonholonomic_field(system: System) -> NonholonomicField:
    """The extension of a nonholonomic system to its whole phase space (seed 001 §2).

    With constraint one-forms ω (rows need not be orthonormal), all derived by autodiff:

    J = ω ∂H/∂m,  C_ab = ⟨∂J_a/∂m, ω_b⟩,  H_ext = H − ½JᵀC⁻¹J,  λ = −C⁻¹{J, H_ext},

    ẋ = B∇H_ext + (0, ωᵀλ)  (on T*Rⁿ: q̇ = ∂H_ext/∂p, ṗ = −∂H_ext/∂q + ωᵀλ;
    on so(3)*: Π̇ = Π × ∇H_ext + λξ).

    J and H_ext are first integrals everywhere (kinetic energy quadratic in the momenta),
    and on the constraint set J = 0 the field equals the Lagrange–d'Alembert equations.
    Any integrator can be applied; `geomjax.feedback_field` makes J = 0 and the energy
    level attracting.

    **Arguments:**

    - `system`: a `geomjax.System` built with `nonholonomic=omega`.

    **Returns:**

    A `NonholonomicField`, callable `x ↦ ẋ` on flat states (jit/vmap/grad compatible),
    accepted by `geomjax.integrate`.

    Example (Suslov problem on so(3)*):

    ```python
    inertia, xi = jnp.array([1.0, 2.0, 3.0]), jnp.array([0.0, 0.0, 1.0])
    system = geomjax.System(lambda m: 0.5 * jnp.sum(m**2 / inertia), geomjax.lie_poisson_so3(),
                            nonholonomic=lambda x: xi[None, :])
    X = geomjax.nonholonomic_field(system)
    ```
    """
    _require(system)
    return NonholonomicField(system)


def nonholonomic_quantities(system: System, x):
    """F(x) = (J(x), H_ext(x), I(x)) for a nonholonomic system (constraint momenta first).

    Example: `geomjax.nonholonomic_quantities(model.system, model.x0)`.
    """
    _require(system)
    parts, s, _ = _at(system, x)
    j, _, mu = parts.core(s)
    h_ext = parts.energy(s) - 0.5 * _sdot(j, mu).reshape(())
    pieces = list(j) + [jnp.atleast_1d(h_ext)]
    if system.integrals:
        pieces.append(parts.integrals(s))
    return jnp.concatenate(pieces)


def embedding_defect(system: System, x):
    """‖D(x)‖ (Frobenius norm of the embedding defect: RᵀR − I or cos² + sin² − 1).

    Zero when the structure has no embedding.
    """
    s = system.structure
    if not hasattr(s, "embedding_defect"):
        return jnp.zeros((), jnp.asarray(x).dtype)
    d = s.embedding_defect(s.split(jnp.asarray(x))[0])
    return jnp.sqrt(jnp.sum(d * d))


def project_nonholonomic(system: System, x):
    """Move the momentum onto the constraint set: m ← m − ωᵀC⁻¹J (configuration kept).

    For a Hamiltonian quadratic in the momenta this gives J = 0 exactly; it is the
    orthogonal projection in the kinetic-energy metric.

    Example: `x_on = geomjax.project_nonholonomic(system, x)`.
    """
    _require(system)
    parts, s, z = _at(system, x)
    mu = _solve(parts.matrix(s), parts.momenta(s))
    w = parts.forms(s)
    shift = mu[0] * w[0]
    for a in range(1, w.shape[0]):
        shift = shift + mu[a] * w[a]
    if parts.kind == "pair":
        z = (z[0], z[1] - shift)
    else:
        z = z - shift
    return system.structure.merge(z)


# --------------------------------------------------------------------------------------
# The feedback field


class NonholonomicFeedbackField(AbstractField):
    """Y = X − L∇V for a nonholonomic system (seed 001 §2.4 with the extended field X).

    V = ½ ΔᵀKΔ with Δ = (J, H_ext − H₀, I − I₀), plus k₀/4 ‖D‖² for an embedded structure
    (D = RᵀR − I or cos² + sin² − 1). Built by `geomjax.feedback_field`.
    """

    system: System
    target: jax.Array
    gains: jax.Array
    embedding_gain: jax.Array | None
    metric: object

    def split(self, x):
        return self.system.structure.split(x)

    def merge(self, z):
        return self.system.structure.merge(z)

    @property
    def dim(self):
        return self.system.dim

    def check(self, x0) -> None:
        _check_matrix_at(self.system, x0)

    def _weights(self, deviation):
        if self.gains.ndim == 1:
            return self.gains * deviation
        return (self.gains * deviation[None, :]).sum(axis=1)

    def lyapunov(self, x):
        """V(x) = ½(F − F₀)ᵀK(F − F₀) (+ k₀/4‖D‖²)."""
        d = nonholonomic_quantities(self.system, x) - self.target
        v = 0.5 * jnp.sum(d * self._weights(d))
        if self.embedding_gain is not None:
            dd = self.system.structure.embedding_defect(self.split(x)[0]).reshape(-1)
            v = v + 0.25 * self.embedding_gain * jnp.sum(dd * dd)
        return v

    def euler_step_limit(self, x):
        """2 / λ_max(L∇²V)(x): explicit Euler on Y is stable near the invariant set only for
        h·λ_max(L∇²V) < 2 (λ_max the largest eigenvalue of the Hessian of V; L = I or a
        scalar). Evaluate it on the invariant set, e.g. at x0.
        """
        hess = jax.hessian(self.lyapunov)(jnp.asarray(x))
        lam = jnp.max(jnp.linalg.eigvalsh(hess))
        if self.metric is not None and not callable(self.metric) and jnp.ndim(self.metric) == 0:
            lam = lam * self.metric
        return 2.0 / lam

    def _apply_metric(self, z, grad_v):
        if self.metric is None:
            return grad_v
        ell = self.metric(self.merge(z)) if callable(self.metric) else self.metric
        if jnp.ndim(ell) == 0:
            return jax.tree_util.tree_map(lambda g: ell * g, grad_v)
        return self.split(ell @ self.merge(grad_v))

    def rhs(self, z):
        parts = _Parts(self.system, z)
        s = parts.explode(z)
        k0 = self.embedding_gain
        with_int = bool(self.system.integrals)

        def extra(ss):
            out = list(_scalars(parts.integrals(ss))) if with_int else []
            if k0 is not None:
                d = parts.defect(ss)
                out.append(0.25 * jnp.sum(d * d).reshape(1))
            return out

        n_int = self.target.shape[0] - parts.forms(s).shape[0] - 1

        def weights(j, h_ext):
            pieces = list(j) + [jnp.atleast_1d(h_ext)]
            if n_int:
                pieces.append(parts.integrals(s))
            w = self._weights(jnp.concatenate(pieces) - self.target)
            w_s = _scalars(w)
            return w_s[: len(j)], w_s[len(j)], w_s[len(j) + 1 :]

        use_extra = with_int or k0 is not None
        x_h, h_ext, j, lam, grad_h, jac_wj, jac_extra, (w_j, w_h, w_i) = parts.field(
            s, z, weights, extra if use_extra else None
        )
        ydot = parts.add_force(s, x_h, lam)
        # ∇V = ∇(w_J·J) + w_H ∇H_ext + Σ w_I ∇I + k₀ ∇(¼‖D‖²), from the shared partials.
        coeffs = list(w_i) + ([k0] if k0 is not None else [])
        grad_v = []
        zero = jnp.zeros_like(s[0])
        for i in range(len(grad_h)):
            parts_i = [w_h * grad_h[i]] if grad_h[i] is not None else []
            if jac_wj[i] is not None:
                parts_i.append(jac_wj[i])
            if use_extra:
                more = _sdot_sparse(coeffs, jac_extra[i])
                if more is not None:
                    parts_i.append(more)
            grad_v.append(sum(parts_i[1:], parts_i[0]) if parts_i else zero)
        grad_v = parts.implode(tuple(grad_v))
        return jax.tree_util.tree_map(jnp.subtract, ydot, self._apply_metric(z, grad_v))


def nonholonomic_feedback_field(system: System, x0, gains, metric=None) -> NonholonomicFeedbackField:
    """Feedback field of a nonholonomic system; called by `geomjax.feedback_field`.

    F = (J, H_ext, integrals) with target (0, H_ext(x0), I(x0)), V = ½ΔᵀKΔ (+ k₀/4‖D‖²
    when the structure is embedded, k₀ the last gain), Y = X − L∇V, X the extended field.

    `gains`: a positive scalar, or one positive gain per entry of F (then one more, k₀, for
    an embedded structure), or an SPD matrix over F (structures without embedding).
    Explicit Euler is stable near the invariant set only for h·λ_max(L∇²V) < 2 (see
    `NonholonomicFeedbackField.euler_step_limit`).
    """
    _require(system)
    x0 = as_state(x0, system.dim)
    parts, s0, _ = _at(system, x0)
    f0 = nonholonomic_quantities(system, x0)
    k = len(parts.momenta(s0))
    embedded = parts.embedded
    if is_concrete(x0):
        _check_matrix_at(system, x0)
        _check_on_constraint(parts, s0, f0[:k], embedded)
    target = f0.at[:k].set(0.0)
    m = target.shape[0]
    g = jnp.asarray(gains, dtype=jnp.float64)
    if embedded:
        if g.ndim == 0:
            k_all = jnp.full((m + 1,), g)
        elif g.ndim == 1 and g.shape[0] == m + 1:
            k_all = g
        else:
            raise ValueError(
                f"gains for an embedded structure: a scalar or a vector of {m + 1} positive gains "
                f"(one per entry of F = (J, H_ext, integrals), {m} here, then k₀ for k₀/4‖D‖²); "
                f"got shape {tuple(g.shape)}"
            )
        k_all = _gain_array(k_all, m + 1)
        k_main, k_emb = k_all[:m], k_all[m]
    else:
        k_main, k_emb = _gain_array(g, m), None
    metric = _check_metric(metric, x0.shape[0])
    return NonholonomicFeedbackField(system, target, k_main, k_emb, metric)


def _check_on_constraint(parts: _Parts, s0, j0, embedded: bool, tol: float = 1e-8) -> None:
    v = np.concatenate([np.asarray(a) for a in parts.velocity(s0)])
    scale = 1.0 + float(np.abs(v).max())
    worst = float(np.abs(np.asarray(j0)).max())
    if worst > tol * scale:
        raise ValueError(
            f"x0 is off the nonholonomic constraint set: |J(x0)| = {worst:.3g} (tolerance "
            f"{tol * scale:.3g}); the feedback integrator stabilises J = 0, so start on it "
            "(geomjax.project_nonholonomic(system, x0) moves the momentum there)"
        )
    if embedded:
        d = np.asarray(parts.defect(s0))
        if np.abs(d).max() > 1e-8:
            raise ValueError(
                f"x0 is off the embedded group: |embedding defect| = {np.abs(d).max():.3g} "
                "(RᵀR − I, or cos² + sin² − 1, must vanish at x0)"
            )
