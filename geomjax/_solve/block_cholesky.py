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

A hub (a particle many constraints share: the pinned root of a tree of rods) joins its
rows in a clique that widens any band through it; `bordered_order` then orders the hub's
neighbourhood last, as a border of r rows eliminated through a dense r × r Schur
complement, and the rest in a narrow band (a tree of 255 rods: band 34 → 16 with r = 14).

The factorization is exact: unlike conjugate gradients its cost does not depend on the
condition number, which grows with the size of a cloth or a ring (taut rows of rods make
G M⁻¹Gᵀ nearly singular). A matrix that is not positive definite gives non-finite
factors, which the callers report as a failed solve.
"""

from typing import ClassVar, NamedTuple

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
    return _rcm(_neighbours(pattern), np.zeros(pattern.size, bool))


def _neighbours(pattern: Pattern) -> list:
    """The neighbours of each node of the symmetrised graph of a square pattern (no loops)."""
    both = [set(r[r >= 0].tolist()) - {i} for i, r in enumerate(pattern.idx)]
    for i, nbrs in enumerate(list(both)):
        for j in nbrs:
            both[j].add(i)
    return [np.array(sorted(s), np.int64) for s in both]


def _rcm(neighbours: list, removed: np.ndarray) -> np.ndarray:
    """The RCM order of the nodes not `removed` (a boolean mask), in the graph they span."""
    degree = np.array([len(s) for s in neighbours])
    seen = removed.copy()
    order = []
    for start in np.argsort(degree, kind="stable"):
        if seen[start]:
            continue
        # a pseudo-peripheral start: the last node of a first breadth-first sweep
        root = _bfs(start, neighbours, degree, seen.copy())[-1]
        order.extend(_bfs(root, neighbours, degree, seen))
    return np.asarray(order[::-1], np.int64)


#: The most rows a border may hold (`bordered_order`): its Schur complement is dense.
MAX_BORDER = 48

#: The hubs tried as borders (`bordered_order`): the nodes of highest degree.
_BORDER_CANDIDATES = 6
#: A border is kept where its estimated work is under this fraction of the plain order's.
_BORDER_GAIN = 0.75


def _band(rows: np.ndarray, cols: np.ndarray, where: np.ndarray, keep: np.ndarray) -> int:
    """The band of the edges (rows, cols) between kept nodes, in the positions `where`."""
    both = keep[rows] & keep[cols]
    return int(np.max(np.abs(where[rows[both]] - where[cols[both]]), initial=0))


def bordered_order(pattern: Pattern) -> tuple[np.ndarray, int, int]:
    """(perm, band, r): an order of a square sparse pattern whose first m − r rows form a
    narrow band and whose last r rows, the border, may couple to any row.

    A hub (a particle many constraints share, a pinned root of a tree of rods) joins many
    rows in one clique, and a band through it is wide: the RCM band of a random tree of
    256 rods hung from a pinned particle is 34, without the hub's clique 16. Taking a hub's
    closed neighbourhood out as the border and ordering the rest by RCM keeps the band
    narrow; the border is eliminated by a dense r × r Schur complement
    (`BlockCholeskyPlan.factor`). Tried for the few nodes of highest degree (hubs: at least
    twice the median degree, none in a grid); kept where the
    work it estimates, (m − r)·s² + 2(m − r)·s·r + r³/3 with blocks of s = max(band, 16),
    is under ¾ of the plain order's m·s²; otherwise r = 0 and the plain RCM order.
    Measured (Dirac field of `geomjax.models.rod_tree`, 2-core CPU, µs per evaluation,
    plain → bordered): 256 rods 484 → 326 (band 34 → 16, r = 14); 1023 rods, band 128
    (conjugate gradients) → 51 (blocks, r = 20), 2407 → 2246; 159 rods (band 22) the
    model keeps the plain order, and a border forced there gains nothing (220 against
    230 µs)."""
    m = pattern.size
    neighbours = _neighbours(pattern)
    rows, cols = pattern.nonzeros()
    plain = _rcm(neighbours, np.zeros(m, bool))
    band = _band(rows, cols, inverse_permutation(plain), np.ones(m, bool))
    best = (max(band, MIN_BLOCK) ** 2 * m * _BORDER_GAIN, plain, band, 0)
    if band <= MIN_BLOCK:
        return plain, band, 0
    degree = np.array([len(s) for s in neighbours])
    hub_degree = 2 * np.median(degree)
    for hub in np.argsort(-degree, kind="stable")[:_BORDER_CANDIDATES]:
        if degree[hub] < hub_degree:  # not a hub: a grid's rows are alike
            break
        border = np.concatenate([[hub], neighbours[hub]])
        r = border.shape[0]
        if r > MAX_BORDER or 4 * r > m:
            continue
        removed = np.zeros(m, bool)
        removed[border] = True
        perm = np.concatenate([_rcm(neighbours, removed), np.sort(border)])
        inner = _band(rows, cols, inverse_permutation(perm), ~removed)
        s = max(inner, MIN_BLOCK)
        cost = (m - r) * s * s + 2 * (m - r) * s * r + r**3 / 3
        if cost < best[0]:
            best = (cost, perm, inner, r)
    return best[1], best[2], best[3]


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
        """The plan for a square sparse pattern, or None where it has dense rows or its band
        (after a border, `bordered_order`, narrows it) exceeds `max_block`."""
        layout = block_layout(pattern, max_block, symmetric=cls.symmetric)
        return None if layout is None else cls._from_layout(layout)

    @classmethod
    def _from_layout(cls, layout: "BlockLayout"):
        return cls(layout.perm, layout.seeds, layout.source, layout.band)

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

    @property
    def banded_size(self) -> int:
        """The rows in the band (all of them but a border's)."""
        return self.perm.shape[0]

    def blocks(self, linear, dtype):
        """The blocks (kinds, nb, s, s) of the linear map (permuted), from c products;
        padding rows get an identity diagonal."""
        return band_blocks(self.banded_size, self.source, compressed_products(self.seeds, linear, dtype), dtype)


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

    edge: np.ndarray = eqx.field(default_factory=lambda: np.zeros((0, 0, 0), np.int64))
    corner: np.ndarray = eqx.field(default_factory=lambda: np.zeros((0, 0), np.int64))

    @classmethod
    def _from_layout(cls, layout: "BlockLayout"):
        return cls(layout.perm, layout.seeds, layout.source, layout.band, layout.edge, layout.corner)

    @property
    def border(self) -> int:
        """r, the rows of the border (`bordered_order`; 0 without one)."""
        return self.corner.shape[0]

    @property
    def banded_size(self) -> int:
        return self.perm.shape[0] - self.border

    def diagonal(self, blocks, corner):
        """diag(A) in the original order, from `blocks` and the border's `corner`."""
        d = jnp.diagonal(blocks[0], axis1=-2, axis2=-1).reshape(-1)[: self.banded_size]
        return jnp.concatenate([d, jnp.diagonal(corner)])[inverse_permutation(self.perm)]

    def factor(self, linear, dtype):
        """The block Cholesky factors of A = `linear`, kept as (C_k⁻¹, W_k, diag(A), Y_k,
        C_S⁻¹): with the inverse of each s × s triangular factor formed once, a solve is two
        sweeps of matrix–vector products (no triangular-solve call per block, which on a CPU
        costs more than its arithmetic for blocks of 16–64).

        With a border (A = [[B, E], [Eᵀ, F]] in the plan's order, B banded, E and F the r
        border columns): B = L Lᵀ by blocks, Y = L⁻¹E by one forward sweep, and the Schur
        complement S = F − YᵀY = C_S C_Sᵀ; without one, Y and C_S⁻¹ are empty."""
        products = compressed_products(self.seeds, linear, dtype)
        blocks = band_blocks(self.banded_size, self.source, products, dtype)
        edge, corner = take(products, self.edge), take(products, self.corner)
        d, low = blocks[0], blocks[1]
        c0 = _inverse_cholesky(d[0])

        def body(prev_inv, xs):
            dk, lk = xs
            w = lk @ prev_inv.T  # L_k C_{k−1}^{−T}
            ck = _inverse_cholesky(dk - w @ w.T)
            return ck, (ck, w)

        _, (cs, ws) = lax.scan(body, c0, (d[1:], low[1:]))
        cs = jnp.concatenate([c0[None], cs])
        ws = jnp.concatenate([jnp.zeros_like(c0)[None], ws])
        ys, schur_inv = edge, corner
        if self.border:
            ys = _forward(cs, ws, edge)
            schur_inv = _inverse_cholesky(corner - jnp.einsum("ksr,ksq->rq", ys, ys))
        return cs, ws, self.diagonal(blocks, corner), ys, schur_inv

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
        y_k = C_k⁻¹(b_k − W_k y_{k−1}), then x_k = C_k⁻ᵀ(y_k − W_{k+1}ᵀ x_{k+1}); with a
        border, its y_B = C_S⁻¹(b_B − Σ_k Y_kᵀ y_k) and x_B = C_S⁻ᵀ y_B between the sweeps,
        the backward sweep then from y_k − Y_k x_B."""
        cs, ws, _, ys, schur_inv = factors
        size, s = self.banded_size, self.block
        nb = cs.shape[0]
        permuted = b[self.perm]
        rhs = jnp.zeros(nb * s, b.dtype).at[:size].set(permuted[:size]).reshape(nb, s)
        y = _forward(cs, ws, rhs)
        x_border = permuted[size:]
        if self.border:
            x_border = schur_inv.T @ (schur_inv @ (x_border - jnp.einsum("ksr,ks->r", ys, y)))
            y = y - ys @ x_border
        w_next = jnp.concatenate([ws[1:], jnp.zeros_like(ws[:1])])

        def backward(nxt, xs):
            ck, wn, yk = xs
            x = ck.T @ (yk - wn.T @ nxt)
            return x, x

        _, xs = lax.scan(backward, jnp.zeros_like(y[0]), (cs, w_next, y), reverse=True)
        out = jnp.concatenate([xs.reshape(-1)[:size], x_border])
        return out[inverse_permutation(self.perm)]  # a gather: transposes under reverse mode


def _inverse_cholesky(a):
    """C⁻¹ for the lower Cholesky factor C of the symmetric positive definite `a`."""
    eye = jnp.eye(a.shape[-1], dtype=a.dtype)
    return jax.scipy.linalg.solve_triangular(jnp.linalg.cholesky(a), eye, lower=True)


def _forward(cs, ws, rhs):
    """The forward sweep y_k = C_k⁻¹(b_k − W_k y_{k−1}) for right-hand sides (nb, s) or
    (nb, s, r)."""

    def step(prev, xs):
        ck, wk, bk = xs
        y = ck @ (bk - wk @ prev)
        return y, y

    return lax.scan(step, jnp.zeros_like(rhs[0]), (cs, ws, rhs))[1]


class BlockLayout(NamedTuple):
    """What `block_layout` returns: the order `perm` (m,), the coloured `seeds` (c, m),
    the band's blocks' `source` (kinds, nb, s, s), the `band`, and for a border of r rows
    (symmetric patterns only; r = 0 otherwise) the sources of its columns beside the band,
    `edge` (nb, s, r), and of its own block, `corner` (r, r)."""

    perm: np.ndarray
    seeds: np.ndarray
    source: np.ndarray
    band: int
    edge: np.ndarray
    corner: np.ndarray


def block_layout(pattern: Pattern, max_block: int | None, symmetric: bool) -> BlockLayout | None:
    """The `BlockLayout` of a block-tridiagonal plan for a square sparse pattern in RCM
    order (see `BlockCholeskyPlan`), or None where the pattern has dense rows or its band
    exceeds `max_block`. A symmetric pattern may get a border (`bordered_order`).

    `source[0]`, `source[1]`: where each entry of the diagonal blocks and of the blocks below
    them sits in the flattened compressed products; with `symmetric=False` also
    `source[2]`, the blocks above the diagonal. A symmetric matrix is coloured on its
    symmetrised pattern, another on its own (columns sharing no row share a colour)."""
    m = pattern.size
    if m == 0 or pattern.n != m or pattern.full.any():
        return None
    rows, cols = pattern.nonzeros()
    both_rows, both_cols = np.concatenate([rows, cols, np.arange(m)]), np.concatenate([cols, rows, np.arange(m)])
    if symmetric:
        perm, band, r = bordered_order(pattern)
    else:
        perm, r = rcm_order(pattern), 0
        band = _band(rows, cols, inverse_permutation(perm), np.ones(m, bool))
    if max_block is not None and band > max_block:
        return None
    where = inverse_permutation(perm)
    if symmetric:
        rows, cols = both_rows, both_cols
    else:
        rows, cols = np.concatenate([rows, np.arange(m)]), np.concatenate([cols, np.arange(m)])
    size = m - r
    s = max(band, MIN_BLOCK)
    nb = -(-size // s)
    colors = _column_colors(rows, cols, m)
    n_colors = int(colors.max()) + 1
    seeds = np.zeros((n_colors, m))
    seeds[colors, np.arange(m)] = 1.0
    source = np.full((2 if symmetric else 3, nb, s, s), -1, np.int64)
    pi, pj = where[rows], where[cols]  # permuted positions of each structural nonzero
    flat = colors[cols] * m + rows  # where A[row, col] sits in the compressed products
    bi, bj = pi // s, pj // s
    inside = (pi < size) & (pj < size)
    for kind, offset in enumerate((0, 1, -1)[: source.shape[0]]):
        sel = inside & (bi == bj + offset)
        source[kind, bi[sel], pi[sel] % s, pj[sel] % s] = flat[sel]
    edge = np.full((nb, s, r), -1, np.int64)
    sel = (pi < size) & (pj >= size)
    edge[bi[sel], pi[sel] % s, pj[sel] - size] = flat[sel]
    corner = np.full((r, r), -1, np.int64)
    sel = (pi >= size) & (pj >= size)
    corner[pi[sel] - size, pj[sel] - size] = flat[sel]
    return BlockLayout(perm, seeds, source, band, edge, corner)


def inverse_permutation(perm: np.ndarray) -> np.ndarray:
    """`where` with where[perm[i]] = i: x[perm][where] = x."""
    where = np.empty_like(perm)
    where[perm] = np.arange(perm.shape[0])
    return where


def compressed_products(seeds, linear, dtype):
    """The products of the linear map with the coloured `seeds`, flattened (c·m,)."""
    return jax.vmap(linear)(jnp.asarray(seeds, dtype)).reshape(-1)


def take(products, source):
    """The entries `source` points at in the flattened products (0 where it is −1)."""
    source = np.asarray(source)
    return jnp.where(source >= 0, products[np.maximum(source, 0)], 0.0)


def band_blocks(size: int, source, products, dtype):
    """The blocks `source` describes (see `block_layout`) from the flattened `products`;
    the padding rows past the band's `size` rows get an identity diagonal."""
    values = take(products, source)
    s = source.shape[-1]
    pad = np.zeros(source.shape[1:], bool)
    rows = np.arange(size, source.shape[1] * s)
    pad[rows // s, rows % s, rows % s] = True
    return values.at[0].add(jnp.asarray(pad, dtype))


def _column_colors(rows, cols, m):
    """Colours of the columns of a square pattern given by (rows, cols), no two columns of a
    colour sharing a row (greedy)."""
    return Pattern((m,), grouped(rows, cols, m), np.zeros(m, bool), m).coloring()
