"""The quantities every constrained field is built from, derived by autodiff, vectorised.

At a state `z` (in pieces) these are ∇H, the constraint values f, their gradients ∇f_i
stacked along a leading axis (one vectorised reverse pass: `vmap` of the pullback over
unit cotangents), the Hamiltonian fields X_{f_i} = B∇f_i (the structure applied under
`vmap`) and the matrix C_ij = {f_i, f_j} = ⟨∇f_i, X_{f_j}⟩, one contraction. Nothing is
unrolled per constraint, so the size of the traced program, and the compile time, do not
grow with the number of constraints.

Many constraints with a sparse C (`constraint_data` for m > 4): the dependency structure
of f on the state entries is read off the jaxpr at trace time
(`geomjax.internal.sparsity.jacobian_pattern`, structural and sound), and with the
pattern of the structure B it gives the pattern of C = Df B Dfᵀ. When C has the block form
[[0, A], [−Aᵀ, D]] (for holonomic f = (g, ġ) on T*Rⁿ, {g_i, g_j} = 0 and A = G ∂²H/∂p² Gᵀ)
and A is tridiagonal (the chain's links), nothing m × n or m × m is formed: the needed
columns of C come from a few products Df·B·Dfᵀ·s with coloured seeds s (columns that share
no row are evaluated together; side by side under `vmap`, or one colour at a time for large
states, `_LOOPED_PRODUCTS_MIN`), h = {H, f} from one Jacobian-vector product, the
multipliers from two tridiagonal solves with A and Aᵀ sharing one factorization
(`tridiagonal_solve_pair`: Thomas elimination in plain JAX, a pivot with too much growth
giving a non-finite result), and
Σ c_j X_{f_j} from one pullback. Otherwise C is formed densely as below.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._solve.banded import diagonal_weights, pick_diagonal, shifted
from .._solve.linalg import _UNROLL_MAX, small_solve, tridiagonal_solve_pair
from .._system.system import System
from ..internal.sparsity import bandwidth, greedy_coloring, jacobian_pattern


def stacked_dot(a, b):
    """⟨a_i, b_j⟩ summed over the pieces, for pieces stacked along a leading axis: (m, k)."""
    leaves = [
        jnp.einsum("i...,j...->ij", u.reshape(u.shape[0], -1), v.reshape(v.shape[0], -1))
        for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    ]
    return sum(leaves[1:], leaves[0])


class LinearStack(eqx.Module):
    """Stacked pieces s_j never formed: `combine(c)` = Σ_j c_j s_j, a linear map."""

    combine: object = eqx.field(static=True)


def stacked_combination(coefficients, stacked):
    """Σ_j c_j s_j for pieces `stacked` with a leading axis j (or a `LinearStack`)."""
    if isinstance(stacked, LinearStack):
        return stacked.combine(coefficients)
    return jax.tree_util.tree_map(lambda s: jnp.tensordot(coefficients, s, axes=1), stacked)


def piece_dot(a, b):
    """⟨a, b⟩ summed over the pieces of two states."""
    leaves = [jnp.vdot(u, v) for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))]
    return sum(leaves[1:], leaves[0])


class ConstraintData(eqx.Module):
    """∇H, X_H, f, ∇f (stacked), X_f (stacked) and C at one state (gradients in pieces)."""

    grad_h: object
    x_h: object
    values: jax.Array
    grads: object
    fields: object
    matrix: jax.Array

    @property
    def count(self) -> int:
        return self.values.shape[0]


class SparseConstraintData(eqx.Module):
    """`ConstraintData` for a sparse C: Df and X_f as linear maps (`LinearStack`), the
    multipliers c = C⁻ᵀh already solved for; `matrix` forms the dense C on demand."""

    grad_h: object
    x_h: object
    values: jax.Array
    grads: LinearStack
    fields: LinearStack
    multipliers: jax.Array
    column: object = eqx.field(static=True)  # e ↦ C e

    @property
    def count(self) -> int:
        return self.values.shape[0]

    @property
    def matrix(self):
        m = self.count
        return jax.vmap(self.column, out_axes=1)(np.eye(m, dtype=self.values.dtype))


class BlockTridiagonalPlan(eqx.Module):
    """Trace-time facts for C = [[0, A], [−Aᵀ, D]] with A tridiagonal and D banded (k × k,
    m = 2k).

    `seeds` (c, m): one coloured seed per group of the columns k..m−1 of C that share no
    row (C·seed is the sum of those columns). Diagonal o of A or D (entries (i, i+o)) is
    Σ_c compressed[c, rows] · weights[c], with 0/1 `weights` (c, k) that pick the colour of
    column i+o where the pattern allows an entry: products with constants, no gathers, so
    everything fuses and the scalar-graph pass can expand it.
    """

    k: int
    seeds: np.ndarray
    a_weights: tuple  # offsets −1, 0, 1
    d_weights: tuple  # (offset, weights) for the offsets of D's band
    looped: bool = False  # the products one colour at a time (`lax.map`), not under `vmap`


def _flat_size(z):
    return sum(int(np.size(leaf)) for leaf in jax.tree_util.tree_leaves(z))


_D_BANDWIDTH_MAX = 4

# From this many entries of the coloured products' tangents (colours × state size) on,
# the products run one colour at a time in a `lax.map` instead of side by side under
# `vmap`. XLA's CPU backend compiles a `while` loop into a single native call only when its
# body accesses under about 64 kB per iteration (by its cost analysis, which counts a
# nested loop's body once); the products under `vmap` hold (colours, n) intermediates that
# put the run loop of a chain over that size from N = 24 links (n = 96, 3 colours), where
# the run then went 2–5× slower. Looped (planar chain, through `geomjax.integrate`, each
# variant in its own process, shared 2-core CPU under load): N = 32 Dirac Euler 6355 →
# 2490 and 6838 → 2149 ns/step, feedback Euler 10843 → 4975, Dirac RK4 31859 → 9952;
# N = 24 Dirac RK4 13507 → 8959, Euler 1571 → 1741; below that the loop costs 0–17 %
# (N = 8, 16) and nothing is gained, so it is not taken.
_LOOPED_PRODUCTS_MIN = 288


def block_tridiagonal_plan(system: System, z, m: int):
    """The `BlockTridiagonalPlan` of `system` at states shaped like `z`, or None when C is
    not of that form (decided from structural patterns only, at trace time)."""
    s = system.structure
    n = system.dim
    if m <= _UNROLL_MAX or m % 2 or n is None or _flat_size(z) != n:
        return None
    try:
        if jax.tree_util.tree_structure(jax.eval_shape(s.split, jax.ShapeDtypeStruct((n,), jnp.float64))) != jax.tree_util.tree_structure(z):
            return None
        df = jacobian_pattern(system.constraint_functions, n)
        struct = jacobian_pattern(lambda v: s.merge(s.apply(s.split(v[:n]), s.split(v[n:]))), 2 * n)[:, n:]
    except Exception:  # a function the analysis cannot trace here: use the dense path
        return None
    if df.shape != (m, n):
        return None
    c_pat = (df.astype(np.int64) @ struct.astype(np.int64) @ df.T.astype(np.int64)) > 0
    k = m // 2
    a_pat, d_pat = c_pat[:k, k:], c_pat[k:, k:]
    if c_pat[:k, :k].any() or bandwidth(a_pat) > 1 or bandwidth(d_pat) > _D_BANDWIDTH_MAX:
        return None
    colors = greedy_coloring(c_pat[:, k:])
    n_colors = int(colors.max()) + 1
    if n_colors >= k:  # no fewer products than the dense path
        return None
    seeds = np.zeros((n_colors, m))
    seeds[colors, k + np.arange(k)] = 1.0
    a_weights = tuple(diagonal_weights(a_pat, colors, n_colors, o) for o in (-1, 0, 1))
    bw = bandwidth(d_pat)
    d_weights = tuple(
        (o, diagonal_weights(d_pat, colors, n_colors, o)) for o in range(-bw, bw + 1) if np.diag(d_pat, o).any()
    )
    return BlockTridiagonalPlan(k, seeds, a_weights, d_weights, n_colors * n >= _LOOPED_PRODUCTS_MIN)


def _sparse_constraint_data(system: System, z, grad_h, x_h, plan: BlockTridiagonalPlan):
    s = system.structure
    values, f_jvp = jax.linearize(lambda w: s.evaluate(system.constraint_functions, w), z)
    f_t = jax.linear_transpose(f_jvp, z)
    pullback = lambda c: f_t(c)[0]  # Σ_j c_j ∇f_j
    hamiltonian_fields = lambda c: s.apply(z, pullback(c))  # Σ_j c_j X_{f_j}
    column = lambda e: f_jvp(hamiltonian_fields(e))  # C e = Df B Dfᵀ e
    # h_i = {H, f_i} = ⟨∇H, B∇f_i⟩ = −⟨∇f_i, B∇H⟩ = −(Df X_H)_i
    h = -f_jvp(x_h)
    k = plan.k
    seeds = plan.seeds.astype(values.dtype)
    # (colours, m); one colour at a time for large states (`_LOOPED_PRODUCTS_MIN`)
    compressed = jax.lax.map(column, jnp.asarray(seeds)) if plan.looped else jax.vmap(column)(seeds)
    top, bottom = compressed[:, :k], compressed[:, k:]
    dl, d, du = (pick_diagonal(top, w) for w in plan.a_weights)
    # Cᵀc = h with C = [[0, A], [−Aᵀ, D]], Dᵀ = −D: −A c₂ = h₁, Aᵀc₁ − D c₂ = h₂. Both
    # solves use one factorization of A (`tridiagonal_solve_pair`: N = 8, 16, 32 links,
    # Euler, 606 → 502, 1188 → 935, 2352 → 1740 ns per step against two solves).
    def second_rhs(minus_c2):
        d_c2 = sum((pick_diagonal(bottom, w) * shifted(minus_c2, o) for o, w in plan.d_weights), jnp.zeros_like(minus_c2))
        return h[k:] - d_c2

    minus_c2, c1 = tridiagonal_solve_pair(dl, d, du, h[:k], second_rhs)
    c2 = -minus_c2
    return SparseConstraintData(
        grad_h, x_h, values, LinearStack(pullback), LinearStack(hamiltonian_fields), jnp.concatenate([c1, c2]), column
    )


def constraint_data(system: System, z):
    """Evaluate ∇H, f, Df, X_f and C_ij = {f_i, f_j} at the state `z` (pieces).

    Returns a `ConstraintData`, or a `SparseConstraintData` when C has the sparse block
    form of `block_tridiagonal_plan` (the multipliers then come solved)."""
    s = system.structure
    grad_h = jax.grad(lambda w: s.evaluate(system.hamiltonian, w))(z)
    x_h = s.apply(z, grad_h)
    m = jax.eval_shape(lambda w: s.evaluate(system.constraint_functions, w), z).shape[0]
    plan = block_tridiagonal_plan(system, z, m)
    if plan is not None:
        return _sparse_constraint_data(system, z, grad_h, x_h, plan)
    values, f_vjp = jax.vjp(lambda w: s.evaluate(system.constraint_functions, w), z)
    if m == 0:
        return ConstraintData(grad_h, x_h, values, None, None, jnp.zeros((0, 0), values.dtype))
    # numpy: literal unit cotangents that XLA (and the simplification pass) can fold.
    grads = jax.vmap(lambda e: f_vjp(e)[0])(np.eye(m, dtype=values.dtype))
    fields = jax.vmap(lambda g: s.apply(z, g))(grads)
    matrix = stacked_dot(grads, fields)
    return ConstraintData(grad_h, x_h, values, grads, fields, matrix)


def dirac_multipliers(data: ConstraintData):
    """c = C⁻ᵀ h with h_i = {H, f_i}: the Dirac formula reads X = X_H − Σ_j c_j X_{f_j}."""
    if isinstance(data, SparseConstraintData):
        return data.multipliers
    h = stacked_dot(data.fields, jax.tree_util.tree_map(lambda g: g[None], data.grad_h))[:, 0]
    if data.count == 2:
        # C = [[0, c], [−c, 0]] so Cᵀ c' = h reads −c·c'₁ = h₀, c·c'₀ = h₁.
        c = data.matrix[0, 1]
        return jnp.stack([h[1] / c, -h[0] / c])
    return small_solve(data.matrix.T, h)


def dirac_vector(data: ConstraintData, multipliers=None):
    """X = X_H − Σ_j c_j X_{f_j} with c = C⁻ᵀh (Chang, Perlmutter and Vankerschaver (2022) eq. 4), from precomputed data.

    `multipliers` may pass c when the caller has already computed it.
    """
    if data.count == 0:
        return data.x_h
    c = dirac_multipliers(data) if multipliers is None else multipliers
    return jax.tree_util.tree_map(jnp.subtract, data.x_h, stacked_combination(c, data.fields))
