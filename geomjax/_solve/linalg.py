"""Small dense linear algebra that fuses inside compiled loops.

`jnp.linalg.solve` lowers to a LAPACK custom call that XLA cannot fuse; on the tiny
matrices of constrained mechanics (2×2 to 8×8) it dominates the cost of a step. These
unrolled routines use only elementwise arithmetic, so they fuse with the surrounding field.
"""

import jax.numpy as jnp
from jax import lax

# Above this size the unrolled elimination stops paying off and LAPACK is used: on the
# planar chain (benchmarks/chain_scaling.py) an unrolled 8×8 elimination compiled and
# ran a Dirac-field Euler step slower than LAPACK.
_UNROLL_MAX = 4


def small_solve(a, b):
    """Solve `a @ x = b` for a small square matrix `a`.

    Sizes 1 and 2 use closed forms; sizes up to 4 use Gauss–Jordan elimination with
    partial pivoting, unrolled at trace time; larger systems call `jnp.linalg.solve`.

    **Arguments:**

    - `a`: array of shape `(m, m)`.
    - `b`: array of shape `(m,)` or `(m, r)`.

    **Returns:**

    `x` with the shape of `b`. A singular `a` gives non-finite entries (no exception is
    raised inside compiled code; callers check the result).

    Example: `small_solve(jnp.array([[0., 2.], [-2., 0.]]), jnp.array([1., 1.]))`
    returns `[-0.5, 0.5]`.
    """
    m = a.shape[0]
    if m == 1:
        return b / a[0, 0]
    if m == 2:
        det = a[0, 0] * a[1, 1] - a[0, 1] * a[1, 0]
        x0 = (a[1, 1] * b[0] - a[0, 1] * b[1]) / det
        x1 = (a[0, 0] * b[1] - a[1, 0] * b[0]) / det
        return jnp.stack([x0, x1])
    if m > _UNROLL_MAX:
        return jnp.linalg.solve(a, b)
    return unrolled_solve(a, b)


def unrolled_solve(a, b):
    """Solve `a @ x = b` by Gauss–Jordan elimination with partial pivoting, unrolled at
    trace time whatever the size (`small_solve` uses it up to 4 × 4; callers that invert
    a somewhat larger matrix once per step may prefer it to a LAPACK call)."""
    m = a.shape[0]
    # The row operations are decided by `a` alone and applied to `b` separately, so the
    # result is linear in `b` with coefficients that do not depend on it: reverse-mode
    # autodiff can transpose it (Newton's implicit-function gradients need that).
    rows = [a[i] for i in range(m)]
    rhs = [b[i] for i in range(m)]
    for col in range(m):
        # Partial pivoting: bring the row with the largest |entry| in this column up.
        # The choice is made with comparisons and selects only (no indexing by a traced
        # integer), so the elimination also expands into a scalar graph.
        mags = jnp.stack([jnp.abs(rows[r][col]) for r in range(col, m)])
        best = jnp.argmax(mags)
        picked = {r: best == (r - col) for r in range(col + 1, m)}
        chosen, chosen_rhs = rows[col], rhs[col]
        for r, pick in picked.items():
            chosen = jnp.where(pick, rows[r], chosen)
            chosen_rhs = jnp.where(pick, rhs[r], chosen_rhs)
        # the pivot row moves up; the row it came from receives the old row `col`
        rows = rows[:col] + [chosen] + [jnp.where(pick, rows[col], rows[r]) for r, pick in picked.items()]
        rhs = rhs[:col] + [chosen_rhs] + [jnp.where(pick, rhs[col], rhs[r]) for r, pick in picked.items()]
        pivot = rows[col][col]
        rows[col] = rows[col] / pivot
        rhs[col] = rhs[col] / pivot
        for r in range(m):
            if r != col:
                factor = rows[r][col]
                rows[r] = rows[r] - factor * rows[col]
                rhs[r] = rhs[r] - factor * rhs[col]
    sol = jnp.stack(rhs)
    return sol


def tridiagonal_solve(dl, d, du, b):
    """Solve `T x = b` for the tridiagonal T with sub-diagonal `dl` (dl[0] = 0), diagonal
    `d` and super-diagonal `du` (du[-1] = 0), `b` of shape `(k,)`.

    `jax.lax.linalg.tridiagonal_solve` (LAPACK gtsv on the CPU: Gaussian elimination with
    partial pivoting, so T need not be symmetric or definite, only invertible). O(k).

    Example: `tridiagonal_solve(jnp.array([0., 1.]), jnp.array([2., 2.]), jnp.array([1., 0.]), jnp.array([3., 3.]))`
    returns `[1., 1.]`.
    """
    return lax.linalg.tridiagonal_solve(dl, d, du, b[:, None])[:, 0]
