"""Structure of an implicit system F(u) = 0, read off its jaxpr: which equations are affine.

Many implicit steps solve equations that are affine in some or all of their unknowns: the
discrete Euler–Lagrange equations of a Lagrangian quadratic in the velocity are linear in
the discrete velocity and the multipliers, a z-linear contact Lagrangian makes the action
update linear in the new action. For such equations one linear solve is the exact answer,
and Newton's method only repeats it to test convergence (and, with an ill-conditioned
matrix, may fail that test on round-off alone).

`SystemStructure.of(fn, guess)` traces F and its Jacobian to jaxprs and marks, with
`geomjax.internal.sparsity.jacobian_pattern` (structural and sound: never misses a
dependence), which residual entries can depend on which unknowns and which Jacobian
entries can depend on which unknowns. "Affine in a block of unknowns" is then a fact
about the graph, valid for every input and every parameter value, never a sample.
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ..internal.sparsity import bandwidth, jacobian_pattern
from .linalg import _UNROLL_MAX, small_solve, tridiagonal_solve


class SystemStructure:
    """Dependence patterns of F: R^m → R^m (flat) and of its Jacobian.

    - `depends[i, j]`: residual i may depend on unknown j;
    - `curved[i, j, k]`: ∂F_i/∂u_j may depend on unknown k (all False in the columns j, k
      of a block means F is affine in that block).

    Built at trace time; `None` entries (an analysis that failed) count as dense.
    """

    def __init__(self, depends: np.ndarray, curved: np.ndarray):
        self.depends = depends
        self.curved = curved

    @classmethod
    def of(cls, fn, guess) -> "SystemStructure":
        """Analyse `fn(u)` (a pytree of arrays out with the flat size of `guess`) around the
        shapes of `guess` (its values are not used)."""
        flat, unravel = ravel_pytree(guess)
        m = int(flat.shape[0])

        def residual(y):
            return ravel_pytree(fn(unravel(y)))[0]

        try:
            depends = jacobian_pattern(residual, m, flat.dtype)
            curved = jacobian_pattern(lambda y: jax.jacfwd(residual)(y).ravel(), m, flat.dtype)
        except Exception:  # an analysis that cannot trace: assume the worst
            depends = np.ones((m, m), bool)
            curved = np.ones((m * m, m), bool)
        return cls(np.asarray(depends, bool), np.asarray(curved, bool).reshape(m, m, m))

    def independent(self, rows: Sequence[int], cols: Sequence[int]) -> bool:
        """True when no residual in `rows` can depend on an unknown in `cols`."""
        return not self.depends[np.ix_(rows, cols)].any()

    def affine(self, rows: Sequence[int], cols: Sequence[int]) -> bool:
        """True when the residuals `rows` are affine in the unknowns `cols` (their Jacobian
        in `cols` does not depend on `cols`), whatever the other unknowns are."""
        return not self.curved[np.ix_(rows, cols, cols)].any()


def linear_solve(fn, guess):
    """The root of `fn`, affine in its unknowns, by one linear solve from `guess`:
    u = u₀ − J⁻¹F(u₀) with J = ∂F/∂u by forward-mode autodiff (exact for affine F).

    Returns the root (a singular J gives non-finite entries: check the result).
    Differentiable in the parameters of `fn` like any expression (the solution formula
    holds for all parameter values, so its derivatives are the implicit ones).
    """
    flat, unravel = ravel_pytree(guess)

    def residual(y):
        return ravel_pytree(fn(unravel(y)))[0]

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

    `pattern`: the structural Jacobian pattern of `fn` (`SystemStructure.depends`), if
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
