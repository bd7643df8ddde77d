"""Structure of an implicit system F(u) = 0, read off its jaxpr: which equations are affine.

Many implicit steps solve equations that are affine in some or all of their unknowns: the
discrete Euler–Lagrange equations of a Lagrangian quadratic in the velocity are linear in
the discrete velocity and the multipliers, a z-linear contact Lagrangian makes the action
update linear in the new action. For such equations one linear solve is the exact answer,
and Newton's method only repeats it to test convergence (and, with an ill-conditioned
matrix, may fail that test on round-off alone).

`SystemStructure.of(fn, guess)` traces F and its directional derivatives to jaxprs and
marks, with `geomjax.internal.sparsity.jacobian_sparsity` (structural and sound: never
misses a dependence; sparse, so O(nnz) at any size), which residual entries can depend on
which unknowns and which Jacobian entries can depend on which unknowns. "Affine in a block of unknowns" is then a fact
about the graph, valid for every input and every parameter value, never a sample.
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ..internal.sparsity import Pattern, bandwidth, jacobian_sparsity
from .block_lu import BlockLUPlan
from .linalg import _UNROLL_MAX, small_solve, tridiagonal_solve


class SystemStructure:
    """Dependence patterns of F: R^m → R^m (flat) and of its Jacobian, sparse.

    - `depends`: the sparse `Pattern` of ∂F/∂u (row i: the unknowns residual i may depend on);
    - `affine(rows, cols)`: whether ∂F_rows/∂u_cols may depend on u_cols, read off the
      pattern of (u, v) ↦ ∂F/∂u(u)·(v masked to `cols`) in u: O(nnz) memory, never the
      m × m × m array of every second derivative.

    Built at trace time; an analysis that fails counts as dense (never affine).
    """

    def __init__(self, residual, m: int, dtype):
        self._residual, self.m, self._dtype = residual, m, dtype
        self._affine = {}
        try:
            self.depends = jacobian_sparsity(residual, m, dtype)
        except Exception:  # an analysis that cannot trace: assume the worst
            self.depends = Pattern((m,), np.zeros((m, 0), np.int64), np.ones(m, bool), m)

    @classmethod
    def of(cls, fn, guess) -> "SystemStructure":
        """Analyse `fn(u)` (a pytree of arrays out with the flat size of `guess`) around the
        shapes of `guess` (its values are not used)."""
        flat, unravel = ravel_pytree(guess)

        def residual(y):
            return ravel_pytree(fn(unravel(y)))[0]

        return cls(residual, int(flat.shape[0]), flat.dtype)

    def dense(self) -> np.ndarray:
        """`depends` as an m × m boolean array (for small systems)."""
        return self.depends.dense()

    def independent(self, rows: Sequence[int], cols: Sequence[int]) -> bool:
        """True when no residual in `rows` can depend on an unknown in `cols`."""
        return not _touches(self.depends, rows, cols)

    def affine(self, rows: Sequence[int], cols: Sequence[int]) -> bool:
        """True when the residuals `rows` are affine in the unknowns `cols` (their Jacobian
        in `cols` does not depend on `cols`), whatever the other unknowns are."""
        key = tuple(sorted(set(int(c) for c in cols)))
        if key not in self._affine:
            m = self.m
            mask = np.zeros(m)
            mask[list(key)] = 1.0

            def directional(uv):
                return jax.jvp(self._residual, (uv[:m],), (mask * uv[m:],))[1]

            try:
                self._affine[key] = jacobian_sparsity(directional, 2 * m, self._dtype)
            except Exception:
                self._affine[key] = None
        curved = self._affine[key]
        return curved is not None and not _touches(curved, rows, key)


def _touches(pattern: Pattern, rows, cols) -> bool:
    """Whether any of `rows` of `pattern` may depend on an input in `cols`."""
    rows = np.asarray(list(rows), np.int64)
    if not rows.size or not len(cols):
        return False
    if pattern.full[rows].any():
        return True
    idx = pattern.idx[rows]
    return bool(np.isin(idx[idx >= 0], np.asarray(list(cols), np.int64)).any())


def linear_solve(fn, guess, sparse: bool = True):
    """The root of `fn`, affine in its unknowns, by one linear solve from `guess`:
    u = u₀ − J⁻¹F(u₀) with J = ∂F/∂u by forward-mode autodiff (exact for affine F).

    From `geomjax._solve.block_lu.SPARSE_NEWTON_MIN` unknowns, a structurally sparse J of
    narrow band is evaluated by coloured products and solved by block LU (`BlockLUPlan`),
    unless `sparse=False`.

    Returns the root (a singular J gives non-finite entries: check the result).
    Differentiable in the parameters of `fn` like any expression (the solution formula
    holds for all parameter values, so its derivatives are the implicit ones).
    """
    flat, unravel = ravel_pytree(guess)

    def residual(y):
        return ravel_pytree(fn(unravel(y)))[0]

    m = int(flat.shape[0])
    plan = BlockLUPlan.for_newton(residual, m, flat.dtype) if sparse else None
    if plan is not None:  # a large sparse system: block LU in RCM order, c products
        value, linear = jax.linearize(residual, flat)
        return unravel(flat - plan.solve(plan.factor(linear, flat.dtype), value))
    value, jac = residual(flat), jax.jacfwd(residual)(flat)
    return unravel(flat - small_solve(jac, value))


def saddle_linear_solve(fn, guess, pattern: np.ndarray | None = None):
    """The root of `fn`, affine in its two blocks of unknowns `guess = (u, μ)`, by block
    elimination on the leading block: for the Jacobian [[A, B], [C, D]] (A = ∂F₁/∂u),

        S = D − C A⁻¹B,   δμ = S⁻¹(F₂ − C A⁻¹F₁),   δu = A⁻¹(F₁ − B δμ).

    The systems of constrained mechanics have this form with A the (scaled) velocity
    Hessian of a regular Lagrangian, invertible for small steps, and D = 0: solving A
    and the small Schur complement S needs no pivoting across the blocks, which a dense
    elimination of the whole (indefinite) matrix does; through `scalar_graph` a constant
    A then folds away (the pendulum's A = m I leaves one division for S).

    `pattern`: the structural Jacobian pattern of `fn` (`SystemStructure.dense()`), if
    known. With it, a diagonal A is divided by instead of solved, and a tridiagonal S
    (a chain: each constraint couples neighbouring bodies, and S = α W⁻¹ αᵀ is
    tridiagonal) larger than the unrolled size is solved in O(k)
    (`tridiagonal_solve`) instead of by a dense LAPACK solve.
    """
    (u, mu) = guess
    flat_u, unravel_u = ravel_pytree(u)
    flat_mu, unravel_mu = ravel_pytree(mu)
    n, k = int(flat_u.shape[0]), int(flat_mu.shape[0])

    def residual(a, b):
        return ravel_pytree(fn((unravel_u(a), unravel_mu(b))))[0]

    value = residual(flat_u, flat_mu)
    jac_u, jac_mu = jax.jacfwd(residual, argnums=(0, 1))(flat_u, flat_mu)
    a, b, c, d = jac_u[:n], jac_mu[:n], jac_u[n:], jac_mu[n:]
    a_diagonal = pattern is not None and not (pattern[:n, :n] & ~np.eye(n, dtype=bool)).any()
    if a_diagonal:
        diag = jnp.diagonal(a)
        ai_r, ai_b = value[:n] / diag, b / diag[:, None]
    else:
        ai_r, ai_b = small_solve(a, value[:n]), small_solve(a, b)
    schur = d - c @ ai_b
    rhs = value[n:] - c @ ai_r
    tridiagonal = False
    if pattern is not None and k > _UNROLL_MAX:
        a_inverse = np.eye(n, dtype=np.int64) if a_diagonal else np.ones((n, n), np.int64)
        coupling = (pattern[n:, :n].astype(np.int64) @ a_inverse @ pattern[:n, n:].astype(np.int64)) > 0
        tridiagonal = bandwidth(pattern[n:, n:] | coupling) <= 1
    if tridiagonal:
        zero = jnp.zeros((1,), schur.dtype)
        sub = jnp.concatenate([zero, jnp.diagonal(schur, -1)])
        sup = jnp.concatenate([jnp.diagonal(schur, 1), zero])
        d_mu = tridiagonal_solve(sub, jnp.diagonal(schur), sup, rhs)
    else:
        d_mu = small_solve(schur, rhs)
    d_u = ai_r - ai_b @ d_mu
    return unravel_u(flat_u - d_u), unravel_mu(flat_mu - d_mu)
