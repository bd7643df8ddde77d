"""Banded Jacobians evaluated from a few coloured products, and tridiagonal ones solved in O(k).

If the structural pattern of a k × k Jacobian J = ∂F/∂x (read off F's jaxpr by
`geomjax.internal.sparsity.jacobian_pattern`: sound, never misses a dependence) has
bandwidth b, columns whose rows do not overlap can be evaluated together
(Curtis–Powell–Reed): with a colouring of the columns (`greedy_coloring`) and the paper
s_c = Σ_{colour(j) = c} e_j, the product J s_c holds, in row i, the entry J[i, j] of the
one column j of colour c that row i may touch. For a tridiagonal pattern there are three
colours whatever k, so three Jacobian-vector products give the whole matrix, where the
dense `jacfwd` takes k. The diagonals are read from the compressed products with
constant 0/1 weights (no gathers), so everything fuses.

Used by RATTLE and SHAKE on chains (the Newton matrix G(q₁)M⁻¹G(q₀)ᵀ and the projection
matrix G M⁻¹Gᵀ are tridiagonal) and by the Dirac field's block-tridiagonal constraint
matrix (`geomjax._field.derived`).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..internal.sparsity import bandwidth, greedy_coloring, jacobian_pattern
from .linalg import tridiagonal_solve


def diagonal_weights(pattern, colors, n_colors: int, offset: int) -> np.ndarray:
    """0/1 weights (n_colors, k) that read diagonal `offset` (entries (i, i + offset)) of a
    k × k matrix with column colours `colors` off its compressed products: the entry is
    Σ_c compressed[c, i] · weights[c, i], and weights[c, i] = 1 where (i, i + offset) may be
    nonzero (`pattern`) and column i + offset has colour c."""
    k = pattern.shape[0]
    w = np.zeros((n_colors, k))
    for i in range(k):
        j = i + offset
        if 0 <= j < k and pattern[i, j]:
            w[colors[j], i] = 1.0
    return w


def pick_diagonal(compressed, weights):
    """One diagonal from compressed products (c, k) and its `diagonal_weights` (c, k)."""
    return jnp.sum(compressed * weights.astype(compressed.dtype), axis=0)


def shifted(x, offset: int):
    """y_i = x_{i+offset}, zero outside."""
    if offset == 0:
        return x
    zero = jnp.zeros((abs(offset),), x.dtype)
    if offset > 0:
        return jnp.concatenate([x[offset:], zero])
    return jnp.concatenate([zero, x[:offset]])


class TridiagonalJacobian(eqx.Module):
    """A k × k Jacobian structurally known to be tridiagonal (trace-time facts).

    `seeds` (c, k): one 0/1 seed per colour of columns; `weights`: the `diagonal_weights`
    of the offsets −1, 0, 1. `jacobian(fn, x)` evaluates the three diagonals (dl, d, du)
    of ∂fn/∂x at x by c ≤ 3 forward products, `solve` solves with them
    (`geomjax._solve.linalg.tridiagonal_solve`).

    Example:

    ```python
    >>> import jax
    >>> import jax.numpy as jnp
    >>> from geomjax._solve.banded import TridiagonalJacobian
    >>> fn = lambda x: x**3 - jnp.concatenate([x[1:], jnp.zeros(1)]) - 2.0  # tridiagonal (upper)
    >>> plan = TridiagonalJacobian.of(fn, 6)
    >>> plan.seeds.shape  # two colours suffice for a bidiagonal pattern
    (2, 6)
    >>> x = jnp.linspace(1.0, 2.0, 6)
    >>> dl, d, du = plan.jacobian(fn, x)
    >>> bool(jnp.allclose(d, 3 * x**2)), bool(jnp.allclose(du[:-1], -1.0)), bool(jnp.all(dl == 0))
    (True, True, True)
    >>> dx = plan.solve((dl, d, du), fn(x))
    >>> bool(jnp.allclose(jax.jacfwd(fn)(x) @ dx, fn(x)))
    True

    ```
    """

    seeds: np.ndarray
    weights: tuple

    @classmethod
    def from_pattern(cls, pattern: np.ndarray) -> "TridiagonalJacobian | None":
        """The plan for a square boolean `pattern`, or None when it is not tridiagonal or
        when the colouring does not need fewer products than the k of a dense Jacobian."""
        pattern = np.asarray(pattern, bool)
        k = pattern.shape[0]
        if pattern.shape != (k, k) or k == 0 or bandwidth(pattern) > 1:
            return None
        colors = greedy_coloring(pattern)
        n_colors = int(colors.max()) + 1
        if n_colors >= k:
            return None
        seeds = np.zeros((n_colors, k))
        seeds[colors, np.arange(k)] = 1.0
        return cls(seeds, tuple(diagonal_weights(pattern, colors, n_colors, o) for o in (-1, 0, 1)))

    @classmethod
    def of(cls, fn, k: int, dtype=np.float64) -> "TridiagonalJacobian | None":
        """The plan for ∂fn/∂x, fn: Rᵏ → Rᵏ (flat), from its structural pattern, or None
        (not tridiagonal, no saving, or a function the analysis cannot trace)."""
        try:
            pattern = jacobian_pattern(fn, k, dtype)
        except Exception:  # an analysis that cannot trace: the dense path
            return None
        return cls.from_pattern(pattern) if pattern.shape == (k, k) else None

    def diagonals(self, compressed):
        """(dl, d, du) from the products with the papers, shape (c, k)."""
        return tuple(pick_diagonal(compressed, w) for w in self.weights)

    def of_linear(self, linear, dtype):
        """The diagonals of a linear map `linear` (x ↦ A x, x of `dtype`) with this pattern."""
        return self.diagonals(jax.vmap(linear)(self.seeds.astype(dtype)))

    def jacobian(self, fn, x):
        """The diagonals of ∂fn/∂x at x (c forward products)."""
        return self.of_linear(lambda s: jax.jvp(fn, (x,), (s,))[1], x.dtype)

    @staticmethod
    def solve(diagonals, b):
        """x with T x = b, T given by its diagonals (dl, d, du)."""
        return tridiagonal_solve(*diagonals, b)
