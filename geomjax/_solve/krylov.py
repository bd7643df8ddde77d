"""Matrix-free solves for the multipliers of large sparse constraint graphs.

RATTLE and SHAKE on a constraint graph that is not a chain (a cloth of rods, a tree, a
ring, a molecule) solve, every step, linear systems with the matrix A = G M⁻¹ Gᵀ
(G = Dg, m × n, a few nonzeros per row): m × m and as sparse as the graph, but a dense
factorization costs O(m³) and its storage O(m²). Here A is never formed. A product
A v = G(M⁻¹ Gᵀ v) is one reverse and one forward pass through the user's constraint
function (`jax.vjp`, `jax.jvp`): O(nnz). The solves are

- **preconditioned conjugate gradients** (`pcg`) for the symmetric positive definite
  A, with the Jacobi preconditioner diag(A)⁻¹. The diagonal comes from c products with
  coloured seeds (`GramPlan`): the structural pattern of A is read off the jaxpr at trace
  time (`geomjax.internal.sparsity`) and its graph coloured (i and j differ in colour
  where A_ij may be nonzero); row i of A·(Σ_{colour c} e_j) is then A_ii for the colour
  c of i. The number of colours does not grow with the size of a cloth, tree or ring.
- the **chord iteration** (`chord_solve`) for the nonlinear position constraint
  g(q₁(ν)) = 0: ν ← ν + A₀⁻¹ g(q₁(ν)) with A₀ = G(q) M⁻¹ G(q)ᵀ fixed over the step (the
  exact Jacobian G(q₁) M⁻¹ G(q)ᵀ is not symmetric, and differs from −A₀ by O(h)), each
  correction by PCG to a loose relative tolerance (an inexact Newton method: the outer
  test decides convergence).

Derivatives never go through the iterations. The position multipliers are the root of
g(q₁(ν)) = 0, differentiated by the implicit function theorem (`jax.lax.custom_root`);
its tangent system with the exact Jacobian J = G(q₁)M⁻¹G(q)ᵀ is solved by the same
chord-preconditioned iteration (x ← x − A₀⁻¹(J x − b)), wrapped in
`jax.lax.custom_linear_solve` with its transpose, so reverse mode solves Jᵀ. The velocity
multipliers are a `custom_linear_solve` with the symmetric A. Each iteration that does not
reach its tolerance within its limit makes the step report `RESULTS.linear_solve_failed`
(PCG) or `RESULTS.newton_failed` (chord), never a success.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..internal.sparsity import Pattern, jacobian_sparsity
from .newton import NewtonResult

#: Relative tolerance of each PCG correction inside the chord iteration (the outer update
#: test decides convergence; a looser inner solve costs more outer iterations, each of
#: which evaluates g once). Measured on the cloth (benchmarks/constraint_scaling.py).
INNER_RTOL = 1e-3
#: Relative tolerance (2-norm of the residual over that of the right-hand side) of the
#: solves that must be exact: the velocity multipliers and the tangent solves.
EXACT_RTOL = 1e-14
#: The relative true residual ‖b − A x‖/‖b‖ that `pcg` checks after its loop (at least 100×
#: its own tolerance): far above round-off for the condition numbers of rod networks
#: (ε·κ ≈ 1e−11 at κ = 1e5), far below what a broken-down iteration leaves.
_TRUE_RESIDUAL_RTOL = 1e-8
#: A pattern qualifies for the matrix-free path when its colouring needs at most this
#: fraction of its size in products (else the matrix is too dense for it to pay).
MAX_COLOR_FRACTION = 0.25


class GramPlan(eqx.Module):
    """Trace-time facts about a sparse symmetric m × m matrix A = G M⁻¹ Gᵀ: colour seeds
    (c, m) that read its diagonal off c products. Build with `GramPlan.of`.

    Example:

    ```python
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from geomjax._solve.krylov import GramPlan, pcg
    >>> m = 51  # an odd ring's Laplacian plus the identity: three nonzeros a row
    >>> apply = lambda v: 3.0 * v - jnp.roll(v, 1) - jnp.roll(v, -1)
    >>> plan = GramPlan.of(apply, m)
    >>> plan.seeds.shape  # three colours, whatever m (an even ring needs two)
    (3, 51)
    >>> bool(jnp.allclose(plan.diagonal(apply, jnp.float64), 3.0))
    True
    >>> b = jnp.sin(jnp.arange(m, dtype=float))
    >>> x, ok, steps = pcg(apply, b, 1.0 / plan.diagonal(apply, jnp.float64), rtol=1e-14)
    >>> bool(ok), bool(jnp.max(jnp.abs(apply(x) - b)) < 1e-12)
    (True, True)

    ```
    """

    seeds: np.ndarray

    @classmethod
    def from_pattern(cls, pattern: Pattern) -> "GramPlan | None":
        """The plan for a square sparse `pattern`, or None where it has dense rows or needs
        more than `MAX_COLOR_FRACTION` of its size in colours."""
        m = pattern.size
        if m == 0 or pattern.n != m or pattern.full.any():
            return None
        colors = pattern.symmetric_coloring()
        n_colors = int(colors.max()) + 1
        if n_colors > MAX_COLOR_FRACTION * m:
            return None
        seeds = np.zeros((n_colors, m))
        seeds[colors, np.arange(m)] = 1.0
        return cls(seeds)

    @classmethod
    def of(cls, linear, m: int, dtype=np.float64) -> "GramPlan | None":
        """The plan for the linear map `linear: R^m → R^m`, from its structural pattern."""
        try:
            pattern = jacobian_sparsity(linear, m, dtype)
        except Exception:  # an analysis that cannot trace: no plan
            return None
        return cls.from_pattern(pattern)

    def diagonal(self, linear, dtype):
        """diag(A) for the linear map `linear` (x ↦ A x) with this pattern: c products."""
        seeds = jnp.asarray(self.seeds, dtype)
        return jnp.sum(jax.vmap(linear)(seeds) * seeds, axis=0)

    # The interface of a sparse symmetric solve (shared with `geomjax._solve.block_cholesky.BlockCholeskyPlan`):
    # `prepare` once per matrix, then `apply_inverse` for each right-hand side.
    def prepare(self, linear, dtype):
        """The Jacobi preconditioner diag(A)⁻¹."""
        return 1.0 / self.diagonal(linear, dtype)

    def inverse_diagonal(self, prepared):
        return prepared

    def apply_inverse(self, prepared, linear, b, rtol):
        """(A⁻¹b by `pcg` to the relative tolerance `rtol`, converged)."""
        x, ok, _ = pcg(linear, b, prepared, rtol=rtol)
        return x, ok

    @staticmethod
    def accepts(linear, b, x, rtol):
        """Whether `x` solves A x = b: its true residual (one more product)."""
        return true_residual_ok(linear, b, x, rtol)


def pcg(apply, b, inv_diag, *, rtol: float, x0=None, max_steps: int | None = None):
    """Conjugate gradients for A x = b (A symmetric positive definite, given by `apply`),
    preconditioned by the diagonal `inv_diag` ≈ diag(A)⁻¹, or by `inv_diag(r)` where it is a
    callable (an approximate inverse of A, e.g. the factors of a nearby matrix).

    Stops when ‖b − A x‖₂ ≤ rtol·‖b‖₂ (a zero b gives x = 0 at once) or after `max_steps`
    iterations (default 10·m + 50). Returns `(x, converged, steps)`; `converged` is False
    when the limit was reached or a value is not finite, except that a non-finite b (the
    caller's failure, e.g. an outer iteration that ran off) is not blamed on the solve.
    """
    m = b.shape[0]
    limit = 10 * m + 50 if max_steps is None else max_steps
    x = jnp.zeros_like(b) if x0 is None else x0
    r = b - apply(x) if x0 is not None else b
    precondition = inv_diag if callable(inv_diag) else (lambda v: inv_diag * v)
    z = precondition(r)
    target = (rtol * jnp.linalg.norm(b)) ** 2

    def cond(carry):
        _, r, _, _, rr, k = carry
        return (rr > target) & (k < limit) & jnp.isfinite(rr)

    def body(carry):
        x, r, z, d, _, k = carry
        ad = apply(d)
        rz = jnp.vdot(r, z)
        alpha = rz / jnp.vdot(d, ad)
        x = x + alpha * d
        r = r - alpha * ad
        z_new = precondition(r)
        beta = jnp.vdot(r, z_new) / rz
        return x, r, z_new, z_new + beta * d, jnp.vdot(r, r), k + 1

    x, r, _, _, rr, k = lax.while_loop(cond, body, (x, r, z, z, jnp.vdot(r, r), jnp.asarray(0)))
    # The recursive residual can fall while the iterate is garbage (a singular A with an
    # inconsistent b breaks CG down): the true residual, at a tolerance round-off allows.
    ok = (rr <= target) & true_residual_ok(apply, b, x, rtol)
    # a non-finite b is the caller's failure (an iteration that ran off), not the solve's
    return x, ok | ~jnp.all(jnp.isfinite(b)), k


def symmetric_solve(apply, b, plan, prepared, rtol: float = EXACT_RTOL):
    """x = A⁻¹b for symmetric A (`apply`) by a sparse plan (`GramPlan`: conjugate gradients
    preconditioned by `prepared`; `BlockCholeskyPlan`: its factors `prepared`),
    differentiable by the implicit function theorem (`jax.lax.custom_linear_solve`,
    symmetric): derivatives solve with A again, never through the iterations.

    Returns `(x, ok)`, `ok` checked on the result outside the solve (`plan.accepts`): a
    flag carried out of `custom_linear_solve` as auxiliary output came out batched under
    `jax.jacfwd` (a `vmap` over tangents) and broke it.
    """
    solve = lambda matvec, rhs: plan.apply_inverse(prepared, matvec, rhs, rtol)[0]
    x = lax.custom_linear_solve(apply, b, solve, symmetric=True)
    return x, lax.stop_gradient(plan.accepts(apply, b, x, rtol))


class PreconditionedCG:
    """A sparse symmetric solve (the interface of `GramPlan`) by `pcg` with a given
    preconditioner: `prepared` is a callable r ↦ P⁻¹r. RATTLE's velocity stage takes the
    block Cholesky factors of the position stage's G(q)M⁻¹G(q)ᵀ for G(q₁)M⁻¹G(q₁)ᵀ: a few
    iterations, each one product and two sweeps of the factors, instead of a factorization."""

    @staticmethod
    def apply_inverse(prepared, linear, b, rtol):
        x, ok, _ = pcg(linear, b, prepared, rtol=rtol)
        return x, ok

    @staticmethod
    def accepts(linear, b, x, rtol):
        return true_residual_ok(linear, b, x, rtol)


def spd_solve(apply, b, inv_diag, rtol: float = EXACT_RTOL):
    """`symmetric_solve` by `pcg` with the Jacobi preconditioner `inv_diag`."""
    return symmetric_solve(apply, b, GramPlan(np.zeros((1, b.shape[0]))), inv_diag, rtol)


def residual_bound(rtol: float) -> float:
    """The relative true residual ‖b − A x‖/‖b‖ a solve to `rtol` must reach to count as
    converged: max(100·rtol, `_TRUE_RESIDUAL_RTOL`)."""
    return max(100.0 * rtol, _TRUE_RESIDUAL_RTOL)


def relative_residual(apply, b, x):
    """‖b − A x‖₂ / ‖b‖₂ (0 for b = 0 solved exactly; NaN where x is not finite)."""
    r = jnp.linalg.norm(b - apply(x))
    nb = jnp.linalg.norm(b)
    rel = jnp.where(nb > 0, r / jnp.where(nb > 0, nb, 1.0), jnp.where(r > 0, jnp.inf, 0.0))
    return jnp.where(jnp.all(jnp.isfinite(x)), rel, jnp.nan)


def true_residual_ok(apply, b, x, rtol):
    """‖b − A x‖ ≤ `residual_bound(rtol)`·‖b‖ and x finite."""
    bound = residual_bound(rtol) * jnp.linalg.norm(b)
    return (jnp.linalg.norm(b - apply(x)) <= bound) & jnp.all(jnp.isfinite(x))


def _chord_linear(apply_j, apply_j0_inv, b, newton, measure):
    """x with J x = b by the iteration x ← x − A₀⁻¹(J x − b), where `apply_j0_inv` applies
    an approximation A₀⁻¹ of J⁻¹ (symmetric); the update test on `measure(Δx)` against
    `measure(x)`. Returns (x, converged)."""

    def cond(carry):
        _, k, done, _, _ = carry
        return (k < newton.max_steps) & ~done

    def body(carry):
        x, k, _, _, last = carry
        dx, inner_ok = apply_j0_inv(apply_j(x) - b, EXACT_RTOL)
        x = x - dx
        md = measure(dx)
        size = jnp.max(jnp.abs(md))
        tol = newton.atol + newton.rtol * jnp.max(jnp.abs(measure(x)))
        good = _accepted(size, last, tol, newton) & inner_ok & jnp.all(jnp.isfinite(x))
        return x, k + 1, good | ~jnp.all(jnp.isfinite(x)), good, size

    x0, inner_ok = apply_j0_inv(b, EXACT_RTOL)
    start = (x0, jnp.asarray(0), jnp.asarray(False), inner_ok, jnp.max(jnp.abs(measure(x0))))
    x, _, _, ok, _ = lax.while_loop(cond, body, start)
    return x, ok


def _accepted(size, last, tol, newton):
    """The update test |Δ| ≤ tol, trusted only while the iteration contracts (an update no
    larger than the one before) or once the update is below the absolute tolerance alone:
    the relative part of the test grows with the iterate, so an iteration that runs off
    would pass it; at round-off the updates need not decrease."""
    return (size <= tol) & ((size <= last) | (size <= newton.atol))


def chord_solve(residual, guess, apply_j0_inv, newton, inv_diag, measure=None, scale=None):
    """The root ν of `residual(ν) = 0` (flat, m unknowns) by the chord iteration
    ν ← ν − A₀⁻¹ residual(ν), with `apply_j0_inv(r, rtol) -> (x, ok)` an inexact solve with a
    fixed approximation A₀ of the Jacobian; stops on Newton's update test or after
    `newton.max_steps` iterations.

    The test is on `measure(Δν)` (a linear map; default the identity), against
    `newton.atol + newton.rtol·scale` (default `scale` = |ν|): RATTLE measures what moves the
    positions, Δq₁ = −M⁻¹GᵀΔν, against the size of q, since along the soft modes of an
    ill-conditioned G M⁻¹Gᵀ (a long ring of rods) ν itself is set by round-off far above
    any absolute tolerance while q₁ is exact. The root found is then checked: the
    correction its residual asks for, estimated by the Jacobi approximation `inv_diag` ≈
    diag(A₀)⁻¹ and measured the same way, must be within 10× the test (an iteration that ran
    off, e.g. on a singular A₀ whose solves stayed within their loose tolerance, fails it).

    Returns `(NewtonResult, linear_ok)`: `linear_ok` is False when the last inner solve did
    not reach its tolerance (so a failure is the linear solve's, not the iteration's).
    Differentiable by the implicit function theorem: tangents solve with the exact Jacobian
    (`jax.lax.custom_root`), by `_chord_linear` inside `jax.lax.custom_linear_solve`.
    """
    measure = (lambda d: d) if measure is None else measure

    def tolerance(y):
        return newton.atol + newton.rtol * (jnp.max(jnp.abs(y)) if scale is None else scale)

    def solve(fn, y0):
        def cond(carry):
            _, k, done, _, _, _ = carry
            return (k < newton.max_steps) & ~done

        def body(carry):
            y, k, _, _, _, last = carry
            dy, inner_ok = apply_j0_inv(fn(y), INNER_RTOL)
            y = y - dy
            size = jnp.max(jnp.abs(measure(dy)))
            small = _accepted(size, last, tolerance(y), newton)
            finite = jnp.all(jnp.isfinite(y))
            return y, k + 1, small | ~finite, small & finite, inner_ok, size

        no = jnp.asarray(False)
        inf = jnp.asarray(jnp.inf, y0.dtype)
        y, k, _, ok, inner_ok, _ = lax.while_loop(cond, body, (y0, jnp.asarray(0), no, no, jnp.asarray(True), inf))
        estimate = jnp.max(jnp.abs(measure(inv_diag * fn(y))))
        ok = ok & (estimate <= 10.0 * tolerance(y))
        return y, jnp.stack([ok, k, inner_ok]).astype(y.dtype)

    def tangent_solve(lin, b):
        def forward(matvec, rhs):
            return _chord_linear(matvec, apply_j0_inv, rhs, newton, measure)

        x, _ = lax.custom_linear_solve(lin, b, forward, forward, has_aux=True)
        return x

    y, aux = lax.custom_root(residual, guess, solve, tangent_solve, has_aux=True)
    aux = lax.stop_gradient(aux)
    return NewtonResult(y, aux[0] > 0.5, aux[1].astype(jnp.int32)), aux[2] > 0.5


def gmres(matvec, rhs, tol: float = 1e-13):
    """x with matvec(x) = rhs by restarted GMRES (lineax; relative and absolute tolerance
    `tol` on the residual); NaN where GMRES did not converge, so that a Newton test or a
    derivative downstream fails visibly instead of using a wrong solution."""
    import lineax as lx

    operator = lx.FunctionLinearOperator(matvec, jax.ShapeDtypeStruct(rhs.shape, rhs.dtype))
    solver = lx.GMRES(rtol=tol, atol=tol, restart=40, stagnation_iters=40)
    sol = lx.linear_solve(operator, rhs, solver, throw=False)
    return jnp.where(sol.result == lx.RESULTS.successful, sol.value, jnp.nan)


def krylov_tangent_solve(g, b):
    """`jax.lax.custom_root`'s tangent solve without a matrix: GMRES on the products of the
    linear map `g` itself (J v = g(v), J the exact Jacobian), inside
    `jax.lax.custom_linear_solve` so that reverse mode solves Jᵀ by GMRES on the transposed
    map. O(n) memory and one product of `g` per Krylov iteration, never the n × n Jacobian
    (which the default tangent solve forms from n forward passes). NaN where GMRES did not
    converge: derivatives are flagged, not silently wrong.
    """
    return lax.custom_linear_solve(g, b, gmres, gmres)
