"""Newton's linear systems with a sparse, non-symmetric Jacobian of narrow band.

The implicit steps of constrained mechanics (Dirac integrators with position constraints,
Dirac–Runge–Kutta stages, RATTLE for a non-separable H, projections, discrete
Lagrange–d'Alembert) solve, every iteration, J δ = F with J the Jacobian of their
equations in the unknowns (positions or velocities, momenta, multipliers). On a constraint
graph (a cloth, a tree, a ring of rods) J is sparse: an equation of one rod or one particle
involves the unknowns of its neighbours only. Ordered by reverse Cuthill–McKee on the
symmetrised pattern (`geomjax._solve.block_cholesky.rcm_order`, once at trace time), J is
block tridiagonal in blocks of the band s. Its LU factorization by blocks, with partial
pivoting over each pair of block rows (the banded LU of LAPACK's gbtrf, by blocks:
stable for the saddle-point matrices of constrained steps, whose leading minors are
singular, where block elimination without pivoting breaks down), costs (m/s)·O(s³) =
O(m s²) and keeps U three blocks wide. J's entries come from c forward products J·(Σ e_j
over a colour of columns), with the columns coloured so that no two of a colour share a row.

A singular J gives non-finite factors, which Newton's convergence test reports
(`RESULTS.newton_failed`), never a wrong answer.
"""

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .block_cholesky import BlockPlan, inverse_permutation

#: The fewest unknowns for which `Newton` solves by blocks when the Jacobian is sparse,
#: with a band of at most a quarter of them. Measured on 4 × 4 … 8 × 8 cloths (2-core CPU,
#: 50 steps in a scan, ms per step dense → blocks): Dirac-1 with position constraints at
#: 60 / 94 / 136 unknowns 0.10 → 0.26, 0.33 → 0.40, 0.76 → 0.60; Dirac–RK (Gauss, 2
#: stages) at 120 / 188 / 272: 0.43 → 0.47, 1.18 → 0.93, 2.76 → 1.13; RATTLE for a
#: non-separable H at 92 / 144 / 208: 0.23 → 0.34, 0.83 → 0.67, 2.46 → 0.86; the
#: projection at 44 / 64 / 116: 0.18 → 0.34, 0.40 → 0.39, 1.24 → 0.71.
SPARSE_NEWTON_MIN = 100


class BlockLUPlan(BlockPlan):
    """Trace-time facts for solving with a sparse square Jacobian by block LU.

    `perm` (m,): the RCM order; `seeds` (c, m): coloured seeds whose products give the
    entries; `source` (3, nb, s, s): for each entry of the diagonal (`[0]`), sub-diagonal
    (`[1]`) and super-diagonal (`[2]`) blocks in the permuted order, its index into the
    flattened products (−1 where J is structurally zero or the entry is padding).

    Used as the `structure` of `geomjax._solve.newton.Newton.solve`: `jacobian(fn, y)`
    evaluates and factors ∂fn/∂y at y, `solve(factors, b)` solves with the factors.

    Example:

    ```python
    >>> import jax.numpy as jnp
    >>> from geomjax._solve.block_lu import BlockLUPlan
    >>> m = 40  # a ring, not symmetric: 3 on the diagonal, −1 before, 0.5 after, cyclically
    >>> fn = lambda x: 3.0 * x - jnp.roll(x, 1) + 0.5 * jnp.roll(x, -1) + 0.1 * x**3
    >>> plan = BlockLUPlan.of(fn, m)
    >>> plan.bandwidth, plan.source.shape
    (2, (3, 3, 16, 16))
    >>> x = jnp.sin(jnp.arange(m, dtype=float))
    >>> b = jnp.cos(jnp.arange(m, dtype=float))
    >>> dx = plan.solve(plan.jacobian(fn, x), b)
    >>> bool(jnp.max(jnp.abs(jax.jvp(fn, (x,), (dx,))[1] - b)) < 1e-13)
    True

    ```
    """

    symmetric: ClassVar[bool] = False

    @classmethod
    def for_newton(cls, fn, m: int, dtype=np.float64) -> "BlockLUPlan | None":
        """The plan `Newton` uses for a residual of m ≥ `SPARSE_NEWTON_MIN` unknowns whose
        Jacobian is sparse with an RCM band of at most m/4 (where the block work, ≈ 6s³ per
        block of s, stays below a dense factorization's m³/3 and m forward products),
        else None (dense)."""
        if m < SPARSE_NEWTON_MIN:
            return None
        plan = cls.of(fn, m, dtype, m // 4)
        return plan if plan is not None and plan.seeds.shape[0] < m // 2 else None

    def factor(self, linear, dtype):
        """Block LU factors of the linear map `linear` with partial pivoting across each
        pair of block rows (the banded LU of LAPACK's gbtrf, by blocks): at block k the
        2s × s panel [A'_kk; L_{k+1}] is factored P [A'_kk; L_{k+1}] = [L₁₁; L₂₁] U₁₁, the
        pivoted rows give block row k of U (three blocks wide: pivoting lets the rows of
        block k + 1 move up) and the Schur complement carries on as block row k + 1.
        Triangular factors are inverted once, so a solve is two sweeps of matrix–vector
        products. A virtual identity block after the last closes the sweep."""
        blocks = self.blocks(linear, dtype)
        d, low, up = blocks[0], blocks[1], blocks[2]
        s = self.block
        eye = jnp.eye(s, dtype=dtype)
        zero = jnp.zeros((1, s, s), dtype)
        # block rows k + 1 (the virtual identity row after the last)
        below = (jnp.concatenate([low[1:], zero]), jnp.concatenate([d[1:], eye[None]]),
                 jnp.concatenate([up[1:], zero]))

        def body(work, xs):
            rows = jnp.concatenate([jnp.concatenate(work, axis=1), jnp.concatenate(xs, axis=1)])
            lu, _, perm = lax.linalg.lu(rows[:, :s])
            rows = rows[perm]
            l11 = jnp.tril(lu[:s], -1) + eye
            l11_inv = jax.scipy.linalg.solve_triangular(l11, eye, lower=True, unit_diagonal=True)
            u11_inv = jax.scipy.linalg.solve_triangular(jnp.triu(lu[:s]), eye, lower=False)
            upper = l11_inv @ rows[:s, s:]  # block row k of U beyond the diagonal, (s, 2s)
            schur = rows[s:, s:] - lu[s:] @ upper
            return (schur[:, :s], schur[:, s:], jnp.zeros_like(eye)), (perm, l11_inv, lu[s:], u11_inv, upper)

        _, factors = lax.scan(body, (d[0], up[0], jnp.zeros_like(eye)), below)
        return factors

    def jacobian(self, fn, y):
        """The factors of ∂fn/∂y at y (c forward products)."""
        _, linear = jax.linearize(fn, y)
        return self.factor(linear, y.dtype)

    def solve(self, factors, b):
        """x with J x = b, from `factor`'s factors: forward, r = P_k [c_k; b_{k+1}],
        y_k = L₁₁⁻¹ r_top, c_{k+1} = r_bottom − L₂₁ y_k; backward,
        x_k = U₁₁⁻¹(y_k − U_{k,k+1} x_{k+1} − U_{k,k+2} x_{k+2}). Non-finite where J was
        singular."""
        perms, l11_invs, l21s, u11_invs, uppers = factors
        m, s = self.perm.shape[0], self.block
        nb = perms.shape[0]
        rhs = jnp.zeros((nb + 1) * s, b.dtype).at[:m].set(b[self.perm]).reshape(nb + 1, s)

        def forward(carry, xs):
            perm, l11_inv, l21, b_next = xs
            r = jnp.concatenate([carry, b_next])[perm]
            y = l11_inv @ r[:s]
            return r[s:] - l21 @ y, y

        _, ys = lax.scan(forward, rhs[0], (perms, l11_invs, l21s, rhs[1:]))

        def backward(carry, xs):
            u11_inv, upper, y = xs
            x = u11_inv @ (y - upper @ jnp.concatenate(carry))
            return (x, carry[0]), x

        zero = jnp.zeros(s, b.dtype)
        _, xs = lax.scan(backward, (zero, zero), (u11_invs, uppers, ys), reverse=True)
        return xs.reshape(-1)[:m][inverse_permutation(self.perm)]
