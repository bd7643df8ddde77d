"""Direct solves with a sparse symmetric positive definite m × m matrix of narrow band.

A constraint graph of rods (a ring, a cloth, a tree, a box of molecules) makes
A = G M⁻¹ Gᵀ sparse: A_ij ≠ 0 only where constraints i and j share a particle. Ordered by
reverse Cuthill–McKee (`rcm_order`, computed once at trace time from the structural
pattern), its nonzeros lie within a band |i − j| ≤ b: b = 2 for a ring whatever its
length, b ≈ 2n for an n × n cloth, b = 2 for rigid molecules. Cut into blocks of size
s ≥ b, A is block tridiagonal, and its block Cholesky factorization

    C₀C₀ᵀ = D₀,   W_k = L_k C_{k−1}^{−T},   C_kC_kᵀ = D_k − W_kW_kᵀ,

costs (m/s)·O(s³) = O(m s²) in m/s sequential steps of dense s × s work (LAPACK), and each
solve O(m s). A's entries come from c products A·(Σ_{colour} e_j) with the columns
coloured so that no two of a colour share a row (Curtis–Powell–Reed: c = 12 for a cloth,
5 for a ring, 3 for molecules): A is never formed densely, and the storage is 2m·s.

The factorization is exact: unlike conjugate gradients its cost does not depend on the
condition number, which grows with the size of a cloth or a ring (taut rows of rods make
G M⁻¹Gᵀ nearly singular). A matrix that is not positive definite gives non-finite
factors, which the callers report as a failed solve.
"""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..internal.sparsity import Pattern, grouped, jacobian_sparsity

#: The smallest block: blocks below it run more sequential steps than their dense work saves.
MIN_BLOCK = 16


def direct_band_limit(m: int) -> int:
    """The widest RCM band for which a sparse solver should factor by blocks rather than
    iterate (conjugate gradients): max(96, 2√m). Measured (benchmarks/constraint_scaling.py,
    2-core CPU): the block factorization costs O(m·b²) whatever the conditioning, CG
    O(nnz) per iteration with iterations that grow with the condition number. A cloth's band
    is ≈ √(2m) and its G M⁻¹Gᵀ ill-conditioned: blocks win at every size (100 × 100, b = 199:
    453 against 2218 ms per RATTLE step); a random tree's band is ≈ 4√m and its matrix well
    conditioned: CG wins from b ≈ 128 (m = 1026: 5.4 against 13.6 ms; m = 4098: 43 against
    314 ms); rings and molecules have bands of 2–5."""
    return max(96, int(2.0 * np.sqrt(m)))


def rcm_order(pattern: Pattern) -> np.ndarray:
    """A reverse Cuthill–McKee order of the graph of a square sparse pattern (symmetrised):
    breadth-first from a low-degree node of each component, neighbours by increasing degree,
    reversed. Rows of A in this order have their nonzeros near the diagonal."""
    m = pattern.size
    both = [set(r[r >= 0].tolist()) - {i} for i, r in enumerate(pattern.idx)]
    for i, nbrs in enumerate(list(both)):
        for j in nbrs:
            both[j].add(i)
    neighbours = [np.array(sorted(s), np.int64) for s in both]
    degree = np.array([len(s) for s in neighbours])
    seen = np.zeros(m, bool)
    order = []
    for start in np.argsort(degree, kind="stable"):
        if seen[start]:
            continue
        # a pseudo-peripheral start: the last node of a first breadth-first sweep
        root = _bfs(start, neighbours, degree, seen.copy())[-1]
        order.extend(_bfs(root, neighbours, degree, seen))
    return np.asarray(order[::-1], np.int64)


def _bfs(root, neighbours, degree, seen):
    seen[root] = True
    out, head = [root], 0
    while head < len(out):
        node = out[head]
        head += 1
        nbrs = neighbours[node]
        nbrs = nbrs[~seen[nbrs]]
        for j in nbrs[np.argsort(degree[nbrs], kind="stable")]:
            seen[j] = True
            out.append(int(j))
    return out


class BlockPlan(eqx.Module):
    """The trace-time layout shared by the block plans (`BlockCholeskyPlan`,
    `geomjax._solve.block_lu.BlockLUPlan`): `perm` (m,), the RCM order; `seeds` (c, m),
    coloured seeds whose products give the entries; `source` (kinds, nb, s, s), where each
    entry of the blocks sits in the flattened products (see `block_layout`)."""

    perm: np.ndarray
    seeds: np.ndarray
    source: np.ndarray
    bandwidth: int = eqx.field(static=True)

    symmetric: ClassVar[bool] = True

    @classmethod
    def from_pattern(cls, pattern: Pattern, max_block: int | None = None):
        """The plan for a square sparse pattern, or None where it has dense rows or its RCM
        bandwidth exceeds `max_block`."""
        layout = block_layout(pattern, max_block, symmetric=cls.symmetric)
        return None if layout is None else cls(*layout)

    @classmethod
    def of(cls, fn, m: int, dtype=np.float64, max_block: int | None = None):
        """The plan for the Jacobian of `fn: R^m → R^m` (a linear map: the map itself), from
        its structural pattern; None where the analysis cannot trace `fn`, the pattern is
        not square or has dense rows, or the band exceeds `max_block`."""
        try:
            pattern = jacobian_sparsity(fn, m, dtype)
        except Exception:  # an analysis that cannot trace: no plan
            return None
        return cls.from_pattern(pattern, max_block) if pattern.size == m else None

    @property
    def block(self) -> int:
        return self.source.shape[-1]

    def blocks(self, linear, dtype):
        """The blocks (kinds, nb, s, s) of the linear map (permuted), from c products;
        padding rows get an identity diagonal."""
        return gather_blocks(self.perm.shape[0], self.seeds, self.source, linear, dtype)


class BlockCholeskyPlan(BlockPlan):
    """Trace-time facts for factoring a sparse SPD matrix A (given as a linear map) by blocks.

    `perm` (m,): the RCM order; `seeds` (c, m): coloured seeds whose products give A's
    entries; `source` (2, nb, s, s): for each entry of the diagonal blocks D_k (`[0]`) and
    sub-diagonal blocks L_k (`[1]`) in the permuted order, its index into the flattened
    compressed products (−1 where A is structurally zero or the entry is padding).

    Example:

    ```python
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from geomjax._solve.block_cholesky import BlockCholeskyPlan
    >>> m = 40  # a ring: 2.5 on the diagonal, −1 to both neighbours, cyclically
    >>> apply = lambda v: 2.5 * v - jnp.roll(v, 1) - jnp.roll(v, -1)
    >>> plan = BlockCholeskyPlan.of(apply, m)
    >>> plan.bandwidth, plan.source.shape[1:]  # RCM folds the ring into a band of 2
    (2, (3, 16, 16))
    >>> b = jnp.cos(jnp.arange(m, dtype=float))
    >>> x = plan.solve(plan.factor(apply, jnp.float64), b)
    >>> bool(jnp.max(jnp.abs(apply(x) - b)) < 1e-13)
    True

    ```
    """

    def diagonal(self, blocks):
        """diag(A) in the original order, from `blocks`."""
        d = jnp.diagonal(blocks[0], axis1=-2, axis2=-1).reshape(-1)
        return d[inverse_permutation(self.perm)]

    def factor(self, linear, dtype):
        """The block Cholesky factors of A = `linear`, kept as (C_k⁻¹, W_k, diag(A)): with the
        inverse of each s × s triangular factor formed once, a solve is two sweeps of
        matrix–vector products (no triangular-solve call per block, which on a CPU costs more
        than its arithmetic for blocks of 16–64)."""
        blocks = self.blocks(linear, dtype)
        d, low = blocks[0], blocks[1]
        eye = jnp.eye(self.block, dtype=dtype)

        def inverse_factor(a):
            return jax.scipy.linalg.solve_triangular(jnp.linalg.cholesky(a), eye, lower=True)

        c0 = inverse_factor(d[0])

        def body(prev_inv, xs):
            dk, lk = xs
            w = lk @ prev_inv.T  # L_k C_{k−1}^{−T}
            ck = inverse_factor(dk - w @ w.T)
            return ck, (ck, w)

        _, (cs, ws) = lax.scan(body, c0, (d[1:], low[1:]))
        cs = jnp.concatenate([c0[None], cs])
        ws = jnp.concatenate([jnp.zeros_like(c0)[None], ws])
        return cs, ws, self.diagonal(blocks)

    # The interface of a sparse symmetric solve (shared with `geomjax._solve.krylov.GramPlan`).
    def prepare(self, linear, dtype):
        return self.factor(linear, dtype)

    def inverse_diagonal(self, factors):
        return 1.0 / factors[2]

    def apply_inverse(self, factors, linear, b, rtol):
        """(A⁻¹b, ok): exact, whatever `rtol`; not ok where x is not finite though b is (a
        non-finite b is its caller's failure, not the solve's)."""
        del linear, rtol
        x = self.solve(factors, b)
        return x, jnp.all(jnp.isfinite(x)) | ~jnp.all(jnp.isfinite(b))

    @staticmethod
    def accepts(linear, b, x, rtol):
        """Whether the exact solve `x` is usable: finite (a matrix that was not positive
        definite gave non-finite factors)."""
        del linear, b, rtol
        return jnp.all(jnp.isfinite(x))

    def solve(self, factors, b):
        """x with A x = b, from `factor`'s factors (non-finite where A was not positive definite):
        y_k = C_k⁻¹(b_k − W_k y_{k−1}), then x_k = C_k⁻ᵀ(y_k − W_{k+1}ᵀ x_{k+1})."""
        cs, ws, _ = factors
        m, s = self.perm.shape[0], self.block
        nb = cs.shape[0]
        rhs = jnp.zeros(nb * s, b.dtype).at[:m].set(b[self.perm]).reshape(nb, s)

        def forward(prev, xs):
            ck, wk, bk = xs
            y = ck @ (bk - wk @ prev)
            return y, y

        _, ys = lax.scan(forward, jnp.zeros(s, b.dtype), (cs, ws, rhs))
        w_next = jnp.concatenate([ws[1:], jnp.zeros_like(ws[:1])])

        def backward(nxt, xs):
            ck, wn, yk = xs
            x = ck.T @ (yk - wn.T @ nxt)
            return x, x

        _, xs = lax.scan(backward, jnp.zeros(s, b.dtype), (cs, w_next, ys), reverse=True)
        out = xs.reshape(-1)[:m]
        return out[inverse_permutation(self.perm)]  # a gather: transposes under reverse mode


def block_layout(pattern: Pattern, max_block: int | None, symmetric: bool):
    """(perm, seeds, source, band) of a block-tridiagonal plan for a square sparse pattern
    in RCM order (see `BlockCholeskyPlan`), or None where the pattern has dense rows or its
    band exceeds `max_block`.

    `source[0]`, `source[1]`: where each entry of the diagonal blocks and of the blocks below
    them sits in the flattened compressed products; with `symmetric=False` also
    `source[2]`, the blocks above the diagonal. A symmetric matrix is coloured on its
    symmetrised pattern, another on its own (columns sharing no row share a colour)."""
    m = pattern.size
    if m == 0 or pattern.n != m or pattern.full.any():
        return None
    perm = rcm_order(pattern)
    where = inverse_permutation(perm)
    rows, cols = pattern.nonzeros()
    both_rows, both_cols = np.concatenate([rows, cols, np.arange(m)]), np.concatenate([cols, rows, np.arange(m)])
    band = int(np.max(np.abs(where[both_rows] - where[both_cols])))
    if max_block is not None and band > max_block:
        return None
    if symmetric:
        rows, cols = both_rows, both_cols
    else:
        rows, cols = np.concatenate([rows, np.arange(m)]), np.concatenate([cols, np.arange(m)])
    s = max(band, MIN_BLOCK)
    nb = -(-m // s)
    colors = _column_colors(rows, cols, m)
    n_colors = int(colors.max()) + 1
    seeds = np.zeros((n_colors, m))
    seeds[colors, np.arange(m)] = 1.0
    source = np.full((2 if symmetric else 3, nb, s, s), -1, np.int64)
    pi, pj = where[rows], where[cols]  # permuted positions of each structural nonzero
    flat = colors[cols] * m + rows  # where A[row, col] sits in the compressed products
    bi, bj = pi // s, pj // s
    for kind, offset in enumerate((0, 1, -1)[: source.shape[0]]):
        sel = bi == bj + offset
        source[kind, bi[sel], pi[sel] % s, pj[sel] % s] = flat[sel]
    return perm, seeds, source, band


def inverse_permutation(perm: np.ndarray) -> np.ndarray:
    """`where` with where[perm[i]] = i: x[perm][where] = x."""
    where = np.empty_like(perm)
    where[perm] = np.arange(perm.shape[0])
    return where


def gather_blocks(m: int, seeds, source, linear, dtype):
    """The blocks `source` describes (see `block_layout`) of the linear map `linear` on R^m,
    from its products with `seeds`; the padding rows past m get an identity diagonal."""
    products = jax.vmap(linear)(jnp.asarray(seeds, dtype)).reshape(-1)
    values = jnp.where(source >= 0, products[np.maximum(source, 0)], 0.0)
    s = source.shape[-1]
    pad = np.zeros(source.shape[1:], bool)
    rows = np.arange(m, source.shape[1] * s)
    pad[rows // s, rows % s, rows % s] = True
    return values.at[0].add(jnp.asarray(pad, dtype))


def _column_colors(rows, cols, m):
    """Colours of the columns of a square pattern given by (rows, cols), no two columns of a
    colour sharing a row (greedy)."""
    return Pattern((m,), grouped(rows, cols, m), np.zeros(m, bool), m).coloring()
