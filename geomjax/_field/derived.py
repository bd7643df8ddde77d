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
Σ c_j X_{f_j} from one pullback. When A is sparse but not tridiagonal (a cloth, a tree, a
ring, molecules: `GramDiracPlan`, from k = 16 constraints), A (symmetric positive definite,
A = G M⁻¹Gᵀ) is solved by a block Cholesky factorization in reverse Cuthill–McKee order or
by conjugate gradients (`geomjax._solve.block_cholesky`, `geomjax._solve.krylov`, as RATTLE
does), its products A v and D v being columns C·(0, v) of one product each. The patterns are
sparse throughout (`jacobian_sparsity`): memory O(nnz) at trace time too. Otherwise C is
formed densely as below.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._solve.banded import diagonal_weights, pick_diagonal, shifted
from .._solve.block_cholesky import BlockCholeskyPlan, direct_band_limit
from .._solve.krylov import EXACT_RTOL, GramPlan, symmetric_solve
from .._solve.linalg import _UNROLL_MAX, small_solve, tridiagonal_solve_pair
from .._system.system import System
from ..internal.sparsity import Pattern, bandwidth, greedy_coloring, jacobian_sparsity


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


class GramDiracPlan(eqx.Module):
    """Trace-time facts for C = [[0, A], [−Aᵀ, D]] with A = G M⁻¹Gᵀ sparse (k × k, m = 2k):
    the plan of its solve (`BlockCholeskyPlan` or `GramPlan`)."""

    k: int = eqx.field(static=True)
    gram: object


#: The fewest constraint pairs k for which a sparse A that is not tridiagonal is solved
#: by `GramDiracPlan` rather than densely (the Dirac field of a 4 × 4 cloth, k = 28: 18.7
#: against 43.2 µs per Euler step densely).
GRAM_MIN = 16


def _columns(pattern: Pattern, start: int, stop: int) -> Pattern:
    """The columns start..stop−1 of a 2-D sparse pattern, renumbered from 0."""
    keep = (pattern.idx >= start) & (pattern.idx < stop)
    idx = np.where(keep, pattern.idx - start, -1)
    return Pattern(pattern.shape, np.sort(idx, axis=1), pattern.full.copy(), stop - start)


def _rows(pattern: Pattern, start: int, stop: int) -> Pattern:
    return Pattern((stop - start,), pattern.idx[start:stop], pattern.full[start:stop], pattern.n)


def block_tridiagonal_plan(system: System, z, m: int):
    """The plan for C's sparse block form at states shaped like `z`: a `BlockTridiagonalPlan`
    (A tridiagonal, D banded), a `GramDiracPlan` (A sparse), or None when C is not of that
    form (decided from structural patterns only, at trace time)."""
    s = system.structure
    n = system.dim
    if m <= _UNROLL_MAX or m % 2 or n is None or _flat_size(z) != n:
        return None
    try:
        if jax.tree_util.tree_structure(jax.eval_shape(s.split, jax.ShapeDtypeStruct((n,), jnp.float64))) != jax.tree_util.tree_structure(z):
            return None
        df = jacobian_sparsity(system.constraint_functions, n)
        struct = _columns(jacobian_sparsity(lambda v: s.merge(s.apply(s.split(v[:n]), s.split(v[n:]))), 2 * n), n, 2 * n)
    except Exception:  # a function the analysis cannot trace here: use the dense path
        return None
    if df.size != m or df.full.any():
        return None
    c_pat = df.matmul(struct).matmul(df.transpose())
    k = m // 2
    if c_pat.full.any() or _columns(_rows(c_pat, 0, k), 0, k).count().any():
        return None
    a_sparse = _columns(_rows(c_pat, 0, k), k, m)
    d_sparse = _columns(_rows(c_pat, k, m), k, m)
    if a_sparse.bandwidth() <= 1 and d_sparse.bandwidth() <= _D_BANDWIDTH_MAX:
        # a chain: the tridiagonal plan reads its (narrow) patterns densely
        dense = c_pat.dense()
        a_pat, d_pat = dense[:k, k:], dense[k:, k:]
        if bandwidth(a_pat) <= 1 and bandwidth(d_pat) <= _D_BANDWIDTH_MAX:
            colors = greedy_coloring(dense[:, k:])
            n_colors = int(colors.max()) + 1
            if n_colors < k:  # fewer products than the dense path
                seeds = np.zeros((n_colors, m))
                seeds[colors, k + np.arange(k)] = 1.0
                a_weights = tuple(diagonal_weights(a_pat, colors, n_colors, o) for o in (-1, 0, 1))
                bw = bandwidth(d_pat)
                d_weights = tuple(
                    (o, diagonal_weights(d_pat, colors, n_colors, o)) for o in range(-bw, bw + 1) if np.diag(d_pat, o).any()
                )
                return BlockTridiagonalPlan(k, seeds, a_weights, d_weights, n_colors * n >= _LOOPED_PRODUCTS_MIN)
    if k < GRAM_MIN:
        return None
    gram = BlockCholeskyPlan.from_pattern(a_sparse, direct_band_limit(k)) or GramPlan.from_pattern(a_sparse)
    return None if gram is None else GramDiracPlan(k, gram)


class GramSolvable(eqx.Module):
    """Whether A = G M⁻¹Gᵀ of a large sparse C (`GramDiracPlan`) could be solved at a state
    (a generic right-hand side): C = [[0, A], [−Aᵀ, D]] is invertible exactly when A is, and
    C itself is never formed (m × m)."""

    ok: jax.Array
    k: int = eqx.field(static=True)


def gram_solvable(system: System, z):
    """A `GramSolvable` where C has a `GramDiracPlan` at `z`, else None (trace-time)."""
    s = system.structure
    m = jax.eval_shape(lambda w: s.evaluate(system.constraint_functions, w), z).shape[0]
    plan = block_tridiagonal_plan(system, z, m)
    if not isinstance(plan, GramDiracPlan):
        return None
    _, f_jvp = jax.linearize(lambda w: s.evaluate(system.constraint_functions, w), z)
    f_t = jax.linear_transpose(f_jvp, z)
    k = plan.k
    gram = lambda v: f_jvp(s.apply(z, f_t(jnp.concatenate([jnp.zeros_like(v), v]))[0]))[:k]
    dtype = jax.tree_util.tree_leaves(z)[0].dtype
    rhs = jnp.cos(0.3 + 1.7 * jnp.arange(k, dtype=dtype))
    x, ok = plan.gram.apply_inverse(plan.gram.prepare(gram, dtype), gram, rhs, EXACT_RTOL)
    return GramSolvable(ok & jnp.all(jnp.isfinite(x)), k)


def _gram_constraint_data(system: System, z, grad_h, x_h, plan: GramDiracPlan):
    """`SparseConstraintData` for a sparse A: Cᵀc = h by two solves with A (symmetric
    positive definite), c₂ = −A⁻¹h₁ and c₁ = A⁻¹(h₂ + D c₂), A v and D v being the halves of
    the column C·(0, v). A solve that fails makes the multipliers NaN (the run reports it)."""
    s = system.structure
    values, f_jvp = jax.linearize(lambda w: s.evaluate(system.constraint_functions, w), z)
    f_t = jax.linear_transpose(f_jvp, z)
    pullback = lambda c: f_t(c)[0]
    hamiltonian_fields = lambda c: s.apply(z, pullback(c))
    column = lambda e: f_jvp(hamiltonian_fields(e))
    h = -f_jvp(x_h)
    k = plan.k
    lower = lambda v: column(jnp.concatenate([jnp.zeros_like(v), v]))  # (A v, D v)
    gram = lambda v: lower(v)[:k]
    prepared = plan.gram.prepare(gram, values.dtype)
    c2, ok2 = symmetric_solve(gram, -h[:k], plan.gram, prepared)
    c1, ok1 = symmetric_solve(gram, h[k:] + lower(c2)[k:], plan.gram, prepared)
    multipliers = jnp.where(ok1 & ok2, jnp.concatenate([c1, c2]), jnp.nan)
    return SparseConstraintData(
        grad_h, x_h, values, LinearStack(pullback), LinearStack(hamiltonian_fields), multipliers, column
    )


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
    if isinstance(plan, GramDiracPlan):
        return _gram_constraint_data(system, z, grad_h, x_h, plan)
    if plan is not None:
        return _sparse_constraint_data(system, z, grad_h, x_h, plan)
    return dense_constraint_data(system, z, grad_h, x_h)


def dense_constraint_data(system: System, z, grad_h=None, x_h=None):
    """`ConstraintData` with Df, X_f and C formed densely (one pullback per constraint),
    whatever C's pattern: the path of small or dense systems, and the reference the
    sparse paths are tested and measured against."""
    s = system.structure
    if grad_h is None:
        grad_h = jax.grad(lambda w: s.evaluate(system.hamiltonian, w))(z)
        x_h = s.apply(z, grad_h)
    values, f_vjp = jax.vjp(lambda w: s.evaluate(system.constraint_functions, w), z)
    m = values.shape[0]
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
