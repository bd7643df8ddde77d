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


# Thomas elimination is written out at trace time up to this size and runs as two loops
# above it. Alone in a loop the written-out form is the fastest at every k ≤ 32
# (benchmarks/structured_solves.py); inside the chain's derived fields (chain_scaling.py)
# k = 6 and 8 written out ran no faster than the loops (RK4: 1.3–1.9× slower) and
# compiled 0.5–2.5 s longer (the scalar graph of `geomjax.internal.simplify` expands it).
_THOMAS_UNROLL_MAX = 4

# Largest accepted growth of a row of |L||U| over the same row of |T| (see
# `tridiagonal_solve`): the backward error stays below 3·1e3·ε relative to T's rows.
_THOMAS_GROWTH_MAX = 1e3


def _thomas_row(dl_i, d_i, du_prev, pivot_prev):
    """One elimination step: (l_i, u_i), u_i NaN when the row's growth is too large."""
    mult = dl_i / pivot_prev
    fill = mult * du_prev
    pivot = d_i - fill
    # |L||U| and |T| agree off the diagonal; on it they are |l_i du_{i−1}| + |u_i| and |d_i|.
    # A NaN or infinite fill (a zero pivot above) fails the comparison too.
    ok = jnp.abs(fill) + jnp.abs(pivot) <= _THOMAS_GROWTH_MAX * (jnp.abs(dl_i) + jnp.abs(d_i) + jnp.abs(du_prev))
    return mult, jnp.where(ok, pivot, jnp.nan)


def _thomas_factor_unrolled(dl, d, du):
    k = d.shape[0]
    pivots, mults = [d[0]], [jnp.zeros_like(d[0])]
    for i in range(1, k):
        mult, pivot = _thomas_row(dl[i], d[i], du[i - 1], pivots[-1])
        mults.append(mult)
        pivots.append(pivot)
    return jnp.stack(mults), jnp.stack(pivots)


def _thomas_apply_unrolled(mults, pivots, du, b):
    k = b.shape[0]
    y = [b[0]]
    for i in range(1, k):
        y.append(b[i] - mults[i] * y[-1])
    x = [y[-1] / pivots[k - 1]]
    for i in range(k - 2, -1, -1):
        x.append((y[i] - du[i] * x[-1]) / pivots[i])
    return jnp.stack(x[::-1])


def _thomas_factor_forward(dl, d, du, b):
    """Factorization and forward elimination in one `lax.scan` over the rows i = 0..k−1:

        lᵢ = dlᵢ rᵢ₋₁,   uᵢ = dᵢ − lᵢ duᵢ₋₁ (NaN when the row fails the growth check),
        rᵢ = 1 / uᵢ,     yᵢ = bᵢ − lᵢ yᵢ₋₁,

    with r₋₁ = du₋₁ = y₋₁ = 0 (so row 0 gives u₀ = d₀, l₀ = 0; dl₀ = 0). Returns (r, l, y):
    the pivots as reciprocals, which the substitutions multiply by, so the only division
    is the one on the factorization's own recurrence. The neighbours (rᵢ₋₁, duᵢ₋₁, yᵢ₋₁)
    are carried as scalars and every output has the full length k, so nothing is
    shifted, sliced or concatenated around the loop (see `tridiagonal_solve_pair`)."""

    def row(carry, xs):
        r_prev, du_prev, y_prev = carry
        dl_i, d_i, du_i, b_i = xs
        mult = dl_i * r_prev
        fill = mult * du_prev
        pivot = d_i - fill
        # |L||U| and |T| agree off the diagonal; on it they are |l_i du_{i−1}| + |u_i| and
        # |d_i|. A NaN or infinite fill (a zero pivot above) fails the comparison too.
        ok = jnp.abs(fill) + jnp.abs(pivot) <= _THOMAS_GROWTH_MAX * (jnp.abs(dl_i) + jnp.abs(d_i) + jnp.abs(du_prev))
        r = 1.0 / jnp.where(ok, pivot, jnp.nan)
        y = b_i - mult * y_prev
        return (r, du_i, y), (r, mult, y)

    zero = jnp.zeros((), d.dtype)
    _, out = lax.scan(row, (zero, zero, jnp.zeros_like(b[0])), (dl, d, du, b))
    return out


def _thomas_forward(mults, b):
    """L y = b (L unit lower, sub-diagonal lᵢ): yᵢ = bᵢ − lᵢ yᵢ₋₁, `lax.scan`."""

    def row(y_prev, xs):
        mult_i, b_i = xs
        y = b_i - mult_i * y_prev
        return y, y

    return lax.scan(row, jnp.zeros_like(b[0]), (mults, b))[1]


def _thomas_back(du, r, y):
    """U x = y, reverse `lax.scan`: xᵢ = (yᵢ − duᵢ xᵢ₊₁) rᵢ, x_k = 0."""

    def row(x_next, xs):
        du_i, r_i, y_i = xs
        x = (y_i - du_i * x_next) * r_i
        return x, x

    return lax.scan(row, jnp.zeros_like(y[0]), (du, r, y), reverse=True)[1]


def _thomas_forward_transposed(du, r, b):
    """Uᵀ z = b (Uᵀ has sub-diagonal du): zᵢ = (bᵢ − duᵢ₋₁ zᵢ₋₁) rᵢ, duᵢ₋₁ carried."""

    def row(carry, xs):
        z_prev, du_prev = carry
        du_i, r_i, b_i = xs
        z = (b_i - du_prev * z_prev) * r_i
        return (z, du_i), z

    return lax.scan(row, (jnp.zeros_like(b[0]), jnp.zeros((), du.dtype)), (du, r, b))[1]


def _thomas_back_transposed(mults, z):
    """Lᵀ x = z (Lᵀ unit upper, super-diagonal lᵢ₊₁): xᵢ = zᵢ − lᵢ₊₁ xᵢ₊₁, lᵢ₊₁ carried."""

    def row(carry, xs):
        x_next, mult_next = carry
        mult_i, z_i = xs
        x = z_i - mult_next * x_next
        return (x, mult_i), x

    return lax.scan(row, (jnp.zeros_like(z[0]), jnp.zeros((), mults.dtype)), (mults, z), reverse=True)[1]


def _thomas_solve_looped(dl, d, du, b):
    """T x = b by the scans: factorization with forward elimination, back substitution."""
    r, _, y = _thomas_factor_forward(dl, d, du, b)
    return _thomas_back(du, r, y)


def _thomas_solve_transposed_looped(dl, d, du, b, factors=None):
    """Tᵀ x = b with T's factors: Tᵀ = UᵀLᵀ, forward with Uᵀ, back with Lᵀ (factorized
    here unless `factors` = (r, l) are given)."""
    r, mults = factors if factors is not None else _thomas_factor_forward(dl, d, du, jnp.zeros_like(b))[:2]
    return _thomas_back_transposed(mults, _thomas_forward_transposed(du, r, b))


def _tridiagonal_matvec(dl, d, du, x):
    return _lead(d, x) * x + _lead(dl, x) * _shift(x, -1) + _lead(du, x) * _shift(x, 1)


def _lead(coefficients, like):
    """Coefficients of shape (k,) shaped to multiply the rows of b (b may have trailing axes)."""
    return jnp.reshape(coefficients, coefficients.shape + (1,) * (jnp.ndim(like) - 1))


def _shift(x, offset):
    """y_i = x_{i+offset} along the first axis, zero outside (|offset| = 1)."""
    zero = jnp.zeros_like(x[:1])
    return jnp.concatenate([x[1:], zero]) if offset > 0 else jnp.concatenate([zero, x[:-1]])


def tridiagonal_solve(dl, d, du, b):
    """Solve `T x = b` for the tridiagonal T with sub-diagonal `dl` (dl[0] = 0), diagonal
    `d` and super-diagonal `du` (du[-1] = 0), `b` of shape `(k,)` (or `(k, r)`). O(k).

    Thomas elimination: T = LU with L unit lower bidiagonal and U upper bidiagonal,

        u₀ = d₀,   lᵢ = dlᵢ / uᵢ₋₁,   uᵢ = dᵢ − lᵢ duᵢ₋₁,
        y₀ = b₀,   yᵢ = bᵢ − lᵢ yᵢ₋₁,
        x_{k−1} = y_{k−1} / u_{k−1},   xᵢ = (yᵢ − duᵢ xᵢ₊₁) / uᵢ,

    written out at trace time for k ≤ 4; above, two `lax.scan`s (factorization with forward
    elimination, back substitution; `_thomas_factor_forward`) inside
    `lax.custom_linear_solve`, whose derivative rules solve with T and Tᵀ (Tᵀ = UᵀLᵀ, the
    same factors). The scans carry the neighbouring row as scalars and multiply by the
    reciprocal pivots; `tridiagonal_solve_pair` gives their measurements. Plain arithmetic,
    no LAPACK call: a custom call is a separate runtime step (a thunk) per call on the CPU,
    and a loop holding one is never compiled into a single native call, as XLA's CPU
    backend does for a loop that holds no custom call and whose body accesses under about
    64 kB per iteration by XLA's cost analysis (the runs of small systems: 4–11× faster
    then). Above k = 4 the
    elimination is kept out of `geomjax.internal.simplify`'s scalar graph, as the LAPACK
    call was: on larger fields that graph is run step by step, one thunk per cluster of
    scalar operations, and ran 3–10× slower than with the LAPACK call (planar chain, RK4,
    N = 12–16, benchmarks/chain_scaling.py). The factors depend on T alone and x is linear
    in b, so jvp, vjp, `linear_transpose` in b and `vmap` go through.

    No pivoting, so it is checked. The computed factors satisfy T + ΔT = LU with
    |ΔT| ≤ 3ε|L||U| (ε the unit round-off; Higham, *Accuracy and Stability*, §9.5), and
    |L||U| differs from |T| only on the diagonal, |lᵢduᵢ₋₁| + |uᵢ| against |dᵢ|. Row i is
    accepted when

        |lᵢduᵢ₋₁| + |uᵢ| ≤ 10³ (|dlᵢ| + |dᵢ| + |duᵢ₋₁|),

    which bounds the backward error row by row by 3·10³ε: the answer is then as good as
    T's conditioning allows. For T symmetric positive (or negative) definite the two
    terms carry the sign of dᵢ and add up to |dᵢ| (no growth at all), and for T diagonally
    dominant by rows or columns the left side is at most 3 times the right side's sum
    (|uᵢ₋₁| ≥ |duᵢ₋₁| or |lᵢ| ≤ 1) — the chain's Gram matrices G M⁻¹Gᵀ are SPD. A row that fails (a tiny pivot uᵢ₋₁ next to T's entries, a
    zero or non-finite pivot) gets a NaN pivot, so x is non-finite, never a finite wrong
    answer; a zero last pivot (T singular) gives ±inf. Inside a run the driver reports the
    non-finite state (`RESULTS.nonfinite_first_step` / `RESULTS.diverged`). The check is
    elementwise and fuses; a pivoted fallback to LAPACK under `lax.cond` when the check
    fails was measured 1.3–7× slower per solve on the CPU (the conditional splits the fused
    loop body), 2.3–2.7× under `vmap` (where it becomes a select that runs both solves), so
    it is not taken.

    ```python
    >>> import jax.numpy as jnp
    >>> from geomjax._solve.linalg import tridiagonal_solve
    >>> x = tridiagonal_solve(jnp.array([0., 1.]), jnp.array([2., 2.]), jnp.array([1., 0.]), jnp.array([3., 3.]))
    >>> [float(v) for v in x]
    [1.0, 1.0]
    >>> # a zero first pivot (T is invertible, but needs a row exchange): flagged, not wrong
    >>> x = tridiagonal_solve(jnp.array([0., 1.]), jnp.array([0., 1.]), jnp.array([1., 0.]), jnp.array([2., 3.]))
    >>> bool(jnp.all(jnp.isfinite(x)))
    False

    ```
    """
    if d.shape[0] <= _THOMAS_UNROLL_MAX:
        mults, pivots = _thomas_factor_unrolled(dl, d, du)
        return _thomas_apply_unrolled(mults, pivots, du, b)

    return lax.custom_linear_solve(
        lambda x: _tridiagonal_matvec(dl, d, du, x),
        b,
        lambda _, rhs: _thomas_solve_looped(dl, d, du, rhs),
        lambda _, rhs: _thomas_solve_transposed_looped(dl, d, du, rhs),
    )


def tridiagonal_solve_pair(dl, d, du, b, second_rhs):
    """x = T⁻¹ b and w = T⁻ᵀ c with c = `second_rhs(x)`, T tridiagonal as in
    `tridiagonal_solve` and b of shape (k,): two solves with one factorization. O(k).

    Tᵀ = UᵀLᵀ with T's own factors (the growth check of a row of T is the check of the same
    row of Tᵀ: Thomas elimination of Tᵀ has the same pivots, and |L||U| and |Uᵀ||Lᵀ| are
    transposes of each other, so the backward-error bound of `tridiagonal_solve` holds
    for both solves). Five `lax.scan`s: the factorization, forward (L) and back (U)
    substitution, then forward with Uᵀ and back with Lᵀ; the pivots enter as reciprocals
    computed in the first, so the others hold no division. Each solve is a
    `lax.custom_linear_solve` (jvp and vjp solve with T and Tᵀ) closing over the factors.
    (Until the factors were moved out of the first solve, the factorization and the
    forward substitution of b shared one scan: four scans, but `jax.jacfwd` of a field
    using it failed, see the code.)

    Measured inside the planar chain's derived Dirac field (explicit Euler in the hand
    loop of benchmarks/chain_scaling.py, N = k links, shared 2-core CPU), against the two
    `tridiagonal_solve` calls with their `fori_loop`s this replaced: N = 8 606 → 502 ns
    per step, N = 16 1188 → 935, N = 32 2352 → 1740 (fori-loop Thomas with separately
    sliced, shifted and concatenated arrays put the N = 32 loop body over XLA's CPU
    small-loop size, 64 kB of bytes accessed, past which the whole run is no longer
    compiled into one call: 2–4× slower). Through `geomjax.integrate` (same box, under
    load, interleaved) the gain is smaller: Euler N = 8 764 → 713, N = 16 1588 → 1397,
    N = 32 4260 → 4151 ns, RK4 N = 32 26297 → 17912; at N = 32 the driver's loops are over
    that size limit with either solve (4 of 6 loops compiled as single calls). Up to
    k = 4 it is `tridiagonal_solve` twice, written out.

    ```python
    >>> import jax.numpy as jnp
    >>> from geomjax._solve.linalg import tridiagonal_solve_pair
    >>> dl, d, du = jnp.array([0., 1., 1., 1., 1.]), jnp.full(5, 4.), jnp.array([2., 2., 2., 2., 0.])
    >>> T = jnp.diag(d) + jnp.diag(dl[1:], -1) + jnp.diag(du[:-1], 1)
    >>> x, w = tridiagonal_solve_pair(dl, d, du, jnp.arange(5.), lambda x: x + 1.0)
    >>> bool(jnp.allclose(T @ x, jnp.arange(5.))) and bool(jnp.allclose(T.T @ w, x + 1.0))
    True

    ```
    """
    if d.shape[0] <= _THOMAS_UNROLL_MAX:
        x = tridiagonal_solve(dl, d, du, b)
        return x, tridiagonal_solve(_shift(du, -1), d, _shift(dl, 1), second_rhs(x))

    # The factors are computed once, outside both solves, which close over them (not
    # passed out of the first as `has_aux` outputs: JAX's jvp of `custom_linear_solve`
    # returns those from the tangent solve, so under `jax.jacfwd` the primal came out
    # batched over the tangents and the call failed).
    r, mults, _ = _thomas_factor_forward(dl, d, du, jnp.zeros_like(b))

    def solve(_, rhs):  # T x = rhs: L y = rhs, U x = y
        return _thomas_back(du, r, _thomas_forward(mults, rhs))

    def transpose_solve(_, rhs):  # Tᵀ x = rhs: Uᵀ z = rhs, Lᵀ x = z
        return _thomas_back_transposed(mults, _thomas_forward_transposed(du, r, rhs))

    x = lax.custom_linear_solve(lambda v: _tridiagonal_matvec(dl, d, du, v), b, solve, transpose_solve)
    # Tᵀ has sub-diagonal T[i−1, i] = du[i−1] and super-diagonal T[i+1, i] = dl[i+1].
    w = lax.custom_linear_solve(
        lambda v: _tridiagonal_matvec(_shift(du, -1), d, _shift(dl, 1), v), second_rhs(x), transpose_solve, solve
    )
    return x, w
