"""Implicit Runge–Kutta steps (Gauss–Legendre, implicit midpoint, trapezoidal).

An s-stage Runge–Kutta method for ẋ = X(x) with coefficients (A, b) advances

    Zᵢ = h Σⱼ aᵢⱼ X(x + Zⱼ)  (i = 1..s),     x₁ = x + h Σᵢ bᵢ X(x + Zᵢ).

The stage increments Zᵢ (O(h), well scaled for the update tests) are found together,
starting from the predictor Zᵢ = cᵢ h X(x), by the fixed-point iteration Z ← h(A⊗I)X(x + Z)
(`geomjax._solve.fixed_point`) and, where it does not contract, by the simplified Newton
iteration of `geomjax.Newton` (one Jacobian J = X'(x) per step, the matrix I − h A⊗J
reused by every iteration); stages whose row of A is
zero (the first stage of the trapezoidal rule) are explicit and not unknowns. Gauss–
Legendre methods (s = 1, 2, 3, 4: orders 2, 4, 6, 8) are symplectic and symmetric, and conserve
every quadratic first integral exactly; the trapezoidal rule is order 2 and symmetric, not
symplectic (it is conjugate to the implicit midpoint rule).
"""

import dataclasses
from functools import partial
import math

import equinox as eqx
import jax
import jax.numpy as jnp

from jax.flatten_util import ravel_pytree

from .._field.base import AbstractField, as_field
from .methods import register_method
from .partitioned_tableau import collocation, gauss_nodes
from .._solve.fixed_point import SOLVERS, FixedPoint
from .._solve.krylov import gmres, krylov_tangent_solve
from .._solve.newton import Newton, as_newton
from .base import FieldStep, newton_status


class ImplicitTableau(eqx.Module):
    """Coefficients (A, b) of a (fully) implicit Runge–Kutta method, with its order.

    **Fields:**

    - `a`: the s × s matrix A as a tuple of rows; `b`: the weights (length s). Another
      shape, or non-finite coefficients, is a ValueError at construction.
    - `order`: the classical order; `symplectic`: whether bᵢaᵢⱼ + bⱼaⱼᵢ = bᵢbⱼ holds.
    - `c`: the nodes cᵢ = Σⱼ aᵢⱼ (a property).
    """

    a: tuple = eqx.field(static=True)
    b: tuple = eqx.field(static=True)
    order: int = eqx.field(static=True)
    symplectic: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        s = len(self.b)
        if s < 1:
            raise ValueError("ImplicitTableau needs at least one stage: b is empty")
        lengths = [len(row) for row in self.a]
        if len(lengths) != s or any(n != s for n in lengths):
            raise ValueError(
                f"ImplicitTableau: A must be an s × s matrix with s = len(b) = {s} stage{'s' if s != 1 else ''}; got {len(lengths)} "
                f"row{'s' if len(lengths) != 1 else ''} of length{'s' if len(lengths) != 1 else ''} {lengths}"
            )
        values = [float(v) for row in self.a for v in row] + [float(v) for v in self.b]
        if not all(math.isfinite(v) for v in values):
            raise ValueError("ImplicitTableau: the coefficients A and b must be finite")

    @property
    def c(self) -> tuple:
        return tuple(sum(row) for row in self.a)

    @property
    def stages(self) -> int:
        return len(self.b)


_R3 = math.sqrt(3.0)
_R15 = math.sqrt(15.0)

#: Implicit midpoint rule = 1-stage Gauss–Legendre, order 2, symplectic.
GAUSS2 = ImplicitTableau(a=((0.5,),), b=(1.0,), order=2, symplectic=True)
IMPLICIT_MIDPOINT = GAUSS2
#: 2-stage Gauss–Legendre, order 4, symplectic.
GAUSS4 = ImplicitTableau(
    a=((0.25, 0.25 - _R3 / 6.0), (0.25 + _R3 / 6.0, 0.25)),
    b=(0.5, 0.5),
    order=4,
    symplectic=True,
)
#: 3-stage Gauss–Legendre, order 6, symplectic.
GAUSS6 = ImplicitTableau(
    a=(
        (5.0 / 36.0, 2.0 / 9.0 - _R15 / 15.0, 5.0 / 36.0 - _R15 / 30.0),
        (5.0 / 36.0 + _R15 / 24.0, 2.0 / 9.0, 5.0 / 36.0 - _R15 / 24.0),
        (5.0 / 36.0 + _R15 / 30.0, 2.0 / 9.0 + _R15 / 15.0, 5.0 / 36.0),
    ),
    b=(5.0 / 18.0, 4.0 / 9.0, 5.0 / 18.0),
    order=6,
    symplectic=True,
)
#: 4-stage Gauss–Legendre, order 8, symplectic; coefficients from the collocation
#: conditions at the zeros of P₄(2x − 1) (no closed form typed in).
GAUSS8 = ImplicitTableau(
    a=tuple(tuple(float(v) for v in row) for row in collocation(gauss_nodes(4))[0]),
    b=tuple(float(v) for v in collocation(gauss_nodes(4))[1]),
    order=8,
    symplectic=True,
)
#: Trapezoidal rule (2-stage Lobatto IIIA), order 2, not symplectic.
TRAPEZOIDAL = ImplicitTableau(a=((0.0, 0.0), (0.5, 0.5)), b=(0.5, 0.5), order=2, symplectic=False)


def _add(z, dz):
    return jax.tree_util.tree_map(jnp.add, z, dz)


def _weighted(h, coeffs, vectors):
    """h Σ cᵢ vᵢ over pieces, skipping zero coefficients (None if all are zero)."""
    terms = [(c, v) for c, v in zip(coeffs, vectors) if c != 0.0]
    if not terms:
        return None

    def leaf(*vs):
        acc = terms[0][0] * vs[0]
        for (c, _), v in zip(terms[1:], vs[1:]):
            acc = acc + c * v
        return h * acc

    return jax.tree_util.tree_map(leaf, *[v for _, v in terms])


class ImplicitRungeKutta(FieldStep):
    """An implicit Runge–Kutta step for a field; see `geomjax.implicit_rk`."""

    field: AbstractField
    tableau: ImplicitTableau
    newton: Newton = Newton()
    solver: str = eqx.field(static=True, default="auto")
    fixed_point: FixedPoint = FixedPoint()

    def __check_init__(self):
        if self.solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {self.solver!r}")

    def fast_variant(self):
        # "auto" in the fast loop is the fixed-point iteration alone: a step where it does
        # not contract fails its block, which the driver recomputes with the Newton fallback.
        # (A fallback inside the loop, even one that never runs, holds LAPACK calls that
        # keep XLA's CPU runtime from compiling the loop into one function: 4× slower.)
        return dataclasses.replace(self, solver="fixed_point") if self.solver == "auto" else self

    def advance(self, t, z, h, args):
        tab = self.tableau
        explicit = [all(a == 0.0 for a in row) for row in tab.a]
        implicit = [i for i, e in enumerate(explicit) if not e]
        k_start = self.field.rhs(t, z, args)  # explicit rows have c_i = 0

        def stage_slopes(increments, z=z):
            """X(t + cᵢh, x + Zᵢ) for every stage, given the increments of the implicit stages."""
            slopes, it = [], iter(increments)
            for i, e in enumerate(explicit):
                slopes.append(k_start if e else self.field.rhs(t + tab.c[i] * h, _add(z, next(it)), args))
            return slopes

        def phi(increments, z=z):
            """Φ(Z)ᵢ = h Σⱼ aᵢⱼ X(x + Zⱼ) for the implicit stages: the stages solve Z = Φ(Z)."""
            slopes = stage_slopes(increments, z)
            return tuple(_weighted(h, tab.a[i], slopes) for i in implicit)

        def residual(increments, z=z):
            return jax.tree_util.tree_map(jnp.subtract, increments, phi(increments, z))

        c = tab.c
        guess = tuple(jax.tree_util.tree_map(lambda k, ci=c[i]: ci * h * k, k_start) for i in implicit)

        def newton(start, z=z):
            # Simplified Newton: J = X'(x) once per step (n forward passes), the matrix
            # I − h A⊗J of the implicit stages reused by every iteration (exact Newton would
            # differentiate all s stages in every iteration: s²n field jvps each time).
            flat_z, unravel = ravel_pytree(z)
            n = flat_z.shape[0]
            if n >= MATRIX_FREE_MIN and self.newton.sparse:
                # A large state (a cloth's Dirac field, whose Jacobian holds A⁻¹ and is dense):
                # (I − h A⊗J)⁻¹ by GMRES on its products, J·v one jvp of X at x (linearized
                # once), never the n × n Jacobian.
                _, jvp = jax.linearize(lambda v: ravel_pytree(self.field.rhs(t, unravel(v), args))[0], flat_z)
                a_imp = [[tab.a[i][j] for j in implicit] for i in implicit]
                inverse = partial(_stage_matrix_solve, jvp, a_imp, h, n)
                # The derivatives' tangent solve, with the exact stage Jacobian, by GMRES too.
                return self.newton.solve(lambda w: residual(w, z), start, inverse=inverse, tangent=krylov_tangent_solve)
            jac = jax.jacfwd(lambda v: ravel_pytree(self.field.rhs(t, unravel(v), args))[0])(flat_z)
            a_imp = jnp.asarray([[tab.a[i][j] for j in implicit] for i in implicit], flat_z.dtype)
            matrix = jnp.eye(len(implicit) * n, dtype=flat_z.dtype) - h * jnp.kron(a_imp, jac)
            # Explicit stages do not move with the unknowns, so the matrix above is exact in
            # their place; the leaves of each increment are flattened in `guess` order.
            return self.newton.solve(lambda w: residual(w, z), start, jacobian=matrix)

        if self.solver == "newton":
            res = newton(guess)
        else:
            # Z ← Φ(Z) needs no Jacobian and no linear algebra; where it does not contract
            # ("auto") the simplified Newton solve runs from the same guess.
            fallback = None
            if self.solver == "auto":
                fallback = lambda start, z: (lambda r: (r.value, r.converged))(newton(start, z))  # noqa: E731
            res = self.fixed_point.solve(phi, guess, fallback=fallback, carried=(z,))
        z1 = _add(z, _weighted(h, tab.b, stage_slopes(res.value)))
        return z1, newton_status(res.converged)


#: The smallest state for which the stages' simplified Newton solves I − h A⊗J matrix-free
#: (GMRES on jvp products) instead of forming J by n forward passes. Measured, Gauss 4 with
#: `solver="newton"` on the Dirac field of a cloth (2-core CPU, ms per step, dense →
#: matrix-free): 8 × 8 (n = 256) 12.4 → 21.0, 12 × 12 (n = 576) 84 → 45.
MATRIX_FREE_MIN = 400


def _stage_matrix_solve(jvp, a_imp, h, n, b):
    """(I − h A⊗J)⁻¹b for the stacked stage increments b (s·n), by GMRES (lineax) on the
    products (I − h A⊗J)v = vᵢ − h Σⱼ aᵢⱼ J vⱼ; NaN where GMRES did not converge (the
    Newton test then fails and the step reports it)."""
    s = len(a_imp)
    coeffs = jnp.asarray(a_imp, b.dtype)

    def matvec(v):
        vs = v.reshape(s, n)
        jv = jax.vmap(jvp)(vs)
        return (vs - h * coeffs @ jv).reshape(-1)

    return gmres(matvec, b)


def implicit_rk(
    field,
    tableau: ImplicitTableau,
    *,
    newton: Newton | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    max_iter: int | None = None,
    solver: str = "auto",
) -> ImplicitRungeKutta:
    """An implicit Runge–Kutta step for any vector field, stages solved by fixed-point
    iteration or Newton.

    Zᵢ = h Σⱼ aᵢⱼ X(x + Zⱼ),  x₁ = x + h Σᵢ bᵢ X(x + Zᵢ), with the implicit stage increments
    solved together from the predictor Zᵢ = cᵢ h X(x), by

    - `solver="fixed_point"`: the iteration Z ← h (A⊗I) X(x + Z) to round-off (no Jacobian,
      no linear algebra: fast for non-stiff fields, where h‖X'‖‖A‖ < 1);
    - `solver="newton"`: simplified Newton (`geomjax.Newton`; the field's Jacobian by
      forward-mode autodiff once per step);
    - `solver="auto"` (default): the fixed-point iteration, and Newton from the same
      predictor in the steps (and `vmap` members) where it does not contract.

    Derivatives of x₁ are exact, by the implicit function theorem, whichever solver ran.
    A stage solve that does not converge gives the step status `RESULTS.newton_failed`.

    Tableaux: `GAUSS2` (= `IMPLICIT_MIDPOINT`), `GAUSS4`, `GAUSS6`, `GAUSS8` (Gauss–Legendre
    with 1, 2, 3, 4 stages; orders 2, 4, 6, 8; symplectic for Hamiltonian fields),
    `TRAPEZOIDAL` (order 2). The same methods are available as
    `geomjax.integrate(field, ..., method=NAME)` with NAME in "implicit_midpoint", "gauss2",
    "gauss4", "gauss6", "gauss8", "trapezoidal".

    **Arguments:**

    - `field`: a geomjax field (Hamiltonian, Dirac, feedback, ...) or a callable x ↦ ẋ.
    - `tableau`: an `ImplicitTableau`.
    - `newton`: a `geomjax.Newton` with the settings of the simplified Newton iteration
      on the stage increments (default `Newton()`: a loop, at most 25 iterations, update
      test 1e-13).
    - `rtol`, `atol`, `max_iter`: the earlier keywords, mapped onto `newton`.
    - `solver`: `"auto"`, `"fixed_point"` or `"newton"` (above).

    **Returns:**

    A step usable with `geomjax.integrate`, `jax.jit`, `jax.vmap` and `jax.grad`.

    Example:

    ```python
    model = geomjax.models.spherical_pendulum()
    X = geomjax.dirac_field(model.system)
    sol = geomjax.integrate(X, model.x0, dt=0.05, steps=200, method="gauss4")
    ```
    """
    if not isinstance(tableau, ImplicitTableau):
        raise TypeError(f"tableau must be an ImplicitTableau (GAUSS2, GAUSS4, ...), got {type(tableau).__name__}")
    if solver not in SOLVERS:
        raise ValueError(f"implicit_rk: solver must be one of {SOLVERS}, got {solver!r}")
    return ImplicitRungeKutta(as_field(field), tableau, as_newton(newton, rtol, atol, max_iter), solver)


register_method("implicit_midpoint", lambda f: implicit_rk(f, GAUSS2), 2)
register_method("gauss2", lambda f: implicit_rk(f, GAUSS2), 2)
register_method("gauss4", lambda f: implicit_rk(f, GAUSS4), 4)
register_method("gauss6", lambda f: implicit_rk(f, GAUSS6), 6)
register_method("gauss8", lambda f: implicit_rk(f, GAUSS8), 8)
register_method("trapezoidal", lambda f: implicit_rk(f, TRAPEZOIDAL), 2)
