"""Dirac–Runge–Kutta steps: partitioned Runge–Kutta methods for implicit Lagrangian systems.

An implicit Lagrangian system (`geomjax._system.implicit.ImplicitLagrangian`) is the
differential–algebraic system in (q, v, p, λ)

    q̇ = v,   ṗ = ∂L/∂q(q, v) + α(q)ᵀλ,   p = ∂L/∂v(q, v),   α(q)·v (+ β(q)) = 0.

A partitioned tableau (A, b, c) for q and (Â, b̂) for p (`PartitionedTableau`) advances
(q₀, p₀) by one step of size h with stage velocities Vᵢ and stage multipliers Λᵢ:

    Qᵢ = q₀ + h Σⱼ aᵢⱼ Vⱼ,        Fⱼ = ∂L/∂q(Qⱼ, Vⱼ) + α(Qⱼ)ᵀΛⱼ,
    Pᵢ = p₀ + h Σⱼ âᵢⱼ Fⱼ,
    ∂L/∂v(Qᵢ, Vᵢ) = Pᵢ,   α(Qᵢ)·Vᵢ (+ β) = 0          (i = 1..s),
    q₁ = q₀ + h Σᵢ bᵢ Vᵢ,           p₁ = p₀ + h Σᵢ b̂ᵢ Fᵢ:

the algebraic relations of the Dirac structure (the Legendre relation and the
constraints) imposed at every stage (Hamdouni and Salnikov (2021) eqs. (3)–(6)). Eliminating v = v(q, p), this
is the Runge–Kutta method applied to an index-2 Hessenberg DAE in y = (q, p) and λ.

**Lobatto IIIA–IIIB.** The last column of Â is zero, so Λ_s enters no stage equation and
the system above is singular (Λ_s is free, and the other unknowns face k equations too
many). The square formulation used instead, in the unknowns (V₁..V_s, Λ₁..Λ_s, v₁):

    ∂L/∂v(Qᵢ, Vᵢ) = Pᵢ                        (i = 1..s),
    Σⱼ aᵢⱼ [α(Qⱼ)·Vⱼ (+ β)] = 0                (i = 2..s),
    ∂L/∂v(q₁, v₁) = p₁,   α(q₁)·v₁ (+ β) = 0:

the Legendre relation and the constraint are imposed at the step end with an extra
unknown v₁ (this is what fixes Λ_s: it enters p₁ through b̂_s ≠ 0), and the stage
constraints are imposed integrated by the q-quadrature of stages 2..s (the first row of
Lobatto IIIA is zero): the quadrature of ∫₀^{cᵢ} α(u)·u̇ dt = 0 along the collocation
polynomial u of q. For holonomic constraints it approximates (φ(Qᵢ) − φ(q₀))/h, so these
are the velocity form of Jay's position constraints φ(Qᵢ) = 0 (i = 2..s) for Lobatto
IIIA–IIIB. For s = 2 and L = ½|v|² − U this is RATTLE with g(q₁) = 0 replaced by
½[α(q₀) + α(q₁)]·(q₁ − q₀)/h = 0. Imposing the constraint pointwise at the stages
instead, with one stage's constraint dropped to make the system square, is wrong: for
s = 2, keeping only α(q₀)·V₁ = 0 misses the curvature term of λ and keeping only
α(q₁)·V₂ = 0 doubles it; measured orders of q fell to 1 (s = 2) and 2 (s = 3), and λ did
not converge for s = 2.

**What holds at step ends.** Radau IIA is stiffly accurate (the last stage is the step
end: q₁ = Q_s, p₁ = P_s), so p₁ = ∂L/∂v(q₁, V_s) with α(q₁)·V_s = 0; Lobatto IIIA–IIIB
imposes p₁ = ∂L/∂v(q₁, v₁), α(q₁)·v₁ = 0. For both, (q₁, p₁) lies on the velocity-
constraint set α(q)·v(q, p) = 0 to round-off at every step. Gauss methods and the
Dirac-1 tableau (whose relations hold at (q₀, V₁)) leave it by the local error: α(q₁)·
v(q₁, p₁) is small, not zero. Position constraints φ(q) = 0 of holonomic systems are
imposed only in their velocity form and drift at the order of the method (all tableaux).

**Multipliers.** λ at the step end is the Lagrange interpolant through (cᵢ, Λᵢ) evaluated
at 1 (= Λ_s for c_s = 1); `DiracRungeKutta.multipliers(x, h)` returns it and
`solve_stages` returns every stage quantity.

**Measured orders** (double pendulum in Cartesian coordinates, q ∈ R⁴ with two length
constraints; `tests/test_dirac_rk.py`; least-squares slopes of q, p and λ at T = 1):

    tableau               q      p      λ        classical
    Gauss s = 1          2.00   2.00   1.01      2
    Gauss s = 2          4.00   2.00   1.01      4
    Gauss s = 3          5.97   4.03   3.01      6
    Radau IIA s = 1      0.99   0.99   0.99      1
    Radau IIA s = 2      3.00   3.00   1.88      3
    Radau IIA s = 3      5.01   5.01   2.91      5
    Lobatto IIIA–B s = 2 2.00   2.00   0.99      2
    Lobatto IIIA–B s = 3 4.00   4.00   2.24      4
    Dirac-1              1.00   1.00   0.99      1

Radau IIA and Lobatto IIIA–IIIB keep their classical orders in q and p (with λ of order s
and s − 1). Gauss keeps it in q but p shows the index-2 order reduction (s + 1 for odd s,
s for even s, the known result for Gauss methods on index-2 DAEs), and its λ, the
interpolant extrapolated to the step end, is of order 1, 1, 3.

The stage equations are solved together by a simplified Newton iteration (the Jacobian of
the stage equations at the guess Vᵢ = v(q₀, p₀), Λᵢ = 0 (and v₁ = v(q₀, p₀)), inverted
once per step; `geomjax.Newton` settings for the tolerances and iteration counts);
derivatives of q₁, p₁ follow the implicit function theorem. A solve that does not
converge gives `RESULTS.newton_failed`.
"""

from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .._solve.block_lu import BlockLUPlan
from .._solve.linalg import unrolled_solve
from .._solve.newton import Newton, as_newton, structured_tangent_solve
from .._system.implicit import ImplicitLagrangian, as_implicit_lagrangian
from .._validate import trace_user_function
from .base import AbstractStep, newton_status
from .partitioned_tableau import PartitionedTableau


_UNROLLED_INVERSE_MAX = 8


class DiracStages(eqx.Module):
    """Everything one Dirac–Runge–Kutta step computes (`DiracRungeKutta.solve_stages`).

    `velocities` (s, n) and `multipliers` (s, k) at the stages; `q`, `p` at the step end;
    `v_end` the end velocity (the unknown v₁ of Lobatto IIIA–IIIB, else v(q₁, p₁) by the
    Legendre inverse); `lam_end` λ at the step end (the Lagrange interpolant through
    (cᵢ, Λᵢ) at 1); `converged` whether Newton's method converged.
    """

    velocities: jax.Array
    multipliers: jax.Array
    q: jax.Array
    p: jax.Array
    v_end: jax.Array
    lam_end: jax.Array
    converged: jax.Array


def _weighted(h, coeffs, vectors):
    """h Σ cⱼ vⱼ over the nonzero coefficients (None if all are zero)."""
    acc = None
    for c, v in zip(coeffs, vectors):
        if c != 0.0:
            term = c * v
            acc = term if acc is None else acc + term
    return None if acc is None else h * acc


def _end_weights(c) -> tuple | None:
    """Weights wᵢ with Σ wᵢ Λᵢ the Lagrange interpolant through (cᵢ, Λᵢ) at 1."""
    c = np.asarray(c, float)
    s = c.shape[0]
    if s == 1:
        return (1.0,)
    if len(set(c.tolist())) < s:
        return None
    w = [float(np.prod([(1.0 - c[j]) / (c[i] - c[j]) for j in range(s) if j != i])) for i in range(s)]
    return tuple(w)


class DiracRungeKutta(AbstractStep):
    """A Dirac–Runge–Kutta step on (q, p); built by `geomjax.dirac_rk`."""

    system: ImplicitLagrangian
    tableau: PartitionedTableau
    newton: Newton

    # --- layout and monitoring: the implicit system's ---------------------------------
    @property
    def dim(self):
        return None if self.system.n is None else 2 * self.system.n

    def split(self, x):
        return self.system.split(x)

    def merge(self, z):
        return self.system.merge(z)

    def constraint_residuals(self, x):
        return self.system.constraint_residuals(x)

    def invariants(self, x):
        return self.system.invariants(x)

    @property
    def end_unknown(self) -> bool:
        """Whether the last column of Â is zero (Lobatto IIIB): then v₁ is an unknown and
        the relations are imposed at the step end (see the module docstring)."""
        return all(row[-1] == 0.0 for row in self.tableau.a_hat)

    # --- the stage equations -----------------------------------------------------------
    def _stage_values(self, q0, p0, h, velocities, multipliers):
        """(Qᵢ, Fᵢ, ∂L/∂v(Qᵢ, Vᵢ), Pᵢ) for the stage unknowns."""
        tab, system = self.tableau, self.system
        s = tab.stages
        vs = [velocities[i] for i in range(s)]
        qs = []
        for i in range(s):
            inc = _weighted(h, tab.a[i], vs)
            qs.append(q0 if inc is None else q0 + inc)
        fs, moms = [], []
        for i in range(s):
            dq, dv = system.derivatives(qs[i], vs[i])
            if multipliers is not None:
                _, pull = jax.vjp(lambda v, qi=qs[i]: system.constraint(qi, v), vs[i])
                dq = dq + pull(multipliers[i])[0]
            fs.append(dq)
            moms.append(dv)
        ps = []
        for i in range(s):
            inc = _weighted(h, tab.a_hat[i], fs)
            ps.append(p0 if inc is None else p0 + inc)
        return qs, fs, moms, ps

    def _ends(self, q0, p0, h, velocities, fs):
        tab = self.tableau
        vs = [velocities[i] for i in range(tab.stages)]
        dq = _weighted(h, tab.b, vs)
        dp = _weighted(h, tab.b_hat, fs)
        return (q0 if dq is None else q0 + dq), (p0 if dp is None else p0 + dp)

    def _unpack(self, u, h):
        # The multiplier unknowns are the impulses hΛᵢ, of the size of a momentum at any h
        # (Λᵢ itself enters the equations only through hΛᵢ: as an unknown, round-off in
        # the momentum equations would move it by ~1e−16/h and fail the Newton test at
        # small h).
        it = iter(u)
        velocities = next(it)
        multipliers = next(it) / h if self.system.constrained else None
        v_end = next(it) if self.end_unknown else None
        return velocities, multipliers, v_end

    def _residual(self, q0, p0, h):
        system = self.system
        s = self.tableau.stages
        end = self.end_unknown
        constrained = system.constrained

        def residual(u):
            velocities, multipliers, v_end = self._unpack(u, h)
            qs, fs, moms, ps = self._stage_values(q0, p0, h, velocities, multipliers)
            out = [jnp.stack([moms[i] - ps[i] for i in range(s)])]
            if constrained:
                phis = [system.constraint(qs[i], velocities[i]) for i in range(s)]
                if end:
                    # the constraint integrated by the q-quadrature of stages 2..s
                    rows = [_weighted(1.0, self.tableau.a[i], phis) for i in range(1, s)]
                else:
                    rows = phis
            if end:
                q1, p1 = self._ends(q0, p0, h, velocities, fs)
                out.append(system.momentum(q1, v_end) - p1)
                if constrained:
                    rows.append(system.constraint(q1, v_end))
            if constrained:
                out.insert(1, jnp.stack(rows))
            return tuple(out)

        return residual

    def solve_stages(self, q0, p0, h) -> DiracStages:
        """Solve the stage equations of one step from (q₀, p₀): a `DiracStages`."""
        system, tab = self.system, self.tableau
        h = jnp.asarray(h, p0.dtype)
        s = tab.stages
        v0 = system.velocity(q0, p0)
        guess = [jnp.broadcast_to(v0, (s,) + v0.shape)]
        if system.constrained:
            k = system.constraint(q0, v0).shape[0]
            guess.append(jnp.zeros((s, k), p0.dtype))
        if self.end_unknown:
            guess.append(v0)
        residual = self._residual(q0, p0, h)
        guess = tuple(guess)
        if self.newton.backend == "optimistix":
            sol = self.newton.solve(residual, guess)
        else:
            # Simplified Newton: the Jacobian at the guess, inverted once per step (unrolled
            # Gauss–Jordan up to 8 unknowns, else one LAPACK call), then every iteration is
            # a residual and a matrix–vector product that fuse (planar pendulum, Gauss s = 2,
            # 6 unknowns: no custom call in the loop; with LAPACK's inverse the step took
            # longer). Exact derivatives of the root still follow the implicit
            # function theorem.
            flat, unravel = ravel_pytree(guess)
            m = flat.shape[0]
            flat_residual = lambda y: ravel_pytree(residual(unravel(y)))[0]  # noqa: E731
            plan = BlockLUPlan.for_newton(flat_residual, m, flat.dtype) if self.newton.sparse else None
            if plan is not None:
                # a large sparse graph: the Jacobian's block LU factors, c products
                factors = plan.jacobian(flat_residual, flat)
                inverse = lambda b: plan.solve(factors, b)  # noqa: E731
                # derivatives: the exact Jacobian at the root, by the same plan
                tangent = partial(structured_tangent_solve, plan)
            else:
                tangent = None
                jac = jax.jacfwd(flat_residual)(flat)
                eye = jnp.eye(m, dtype=jac.dtype)
                inverse = unrolled_solve(jac, eye) if m <= _UNROLLED_INVERSE_MAX else jnp.linalg.inv(jac)
            sol = self.newton.solve(residual, guess, inverse=inverse, tangent=tangent)
        velocities, multipliers, v_end = self._unpack(sol.value, h)
        _, fs, _, _ = self._stage_values(q0, p0, h, velocities, multipliers)
        q1, p1 = self._ends(q0, p0, h, velocities, fs)
        if v_end is None:
            v_end = system.velocity(q1, p1)
        if multipliers is None:
            multipliers = jnp.zeros((s, 0), p0.dtype)
        weights = _end_weights(tab.c)
        if weights is None:
            lam_end = jnp.full(multipliers.shape[1:], jnp.nan, p0.dtype)
        else:
            lam_end = sum(w * multipliers[i] for i, w in enumerate(weights))
        return DiracStages(velocities, multipliers, q1, p1, v_end, lam_end, sol.converged)

    def advance(self, t, z, h, args):
        del t, args
        q0, p0 = z
        st = self.solve_stages(q0, p0, h)
        return (st.q, st.p), newton_status(st.converged)

    def multipliers(self, x, h):
        """λ at the end of the step of size `h` from the flat state `x` (shape `(k,)`):
        the Lagrange interpolant through the stage multipliers (cᵢ, Λᵢ) at 1 (NaN when
        the nodes cᵢ are not distinct)."""
        q0, p0 = self.split(jnp.asarray(x))
        return self.solve_stages(q0, p0, h).lam_end

    def check(self, x0) -> None:
        x0 = jnp.asarray(x0)
        self.system.check(x0, "geomjax.dirac_rk")
        trace_user_function(lambda x: self.advance(0.0, self.split(x), 0.1, None)[0], x0,
                            "the lagrangian L(q, v) or the constraints")


def dirac_rk(
    lagrangian,
    tableau="gauss",
    stages: int = 2,
    *,
    holonomic=None,
    nonholonomic=None,
    newton: Newton | None = None,
) -> DiracRungeKutta:
    """A Dirac–Runge–Kutta integrator of an implicit Lagrangian system (Hamdouni and Salnikov (2021)).

    For L(q, v) and constraint one-forms α(q) (from holonomic constraints φ(q) = 0,
    α = Dφ, and/or nonholonomic ones), the implicit Lagrangian system is the DAE

        q̇ = v,   ṗ = ∂L/∂q(q, v) + α(q)ᵀλ,   p = ∂L/∂v(q, v),   α(q)·v = 0.

    One step (q₀, p₀) ↦ (q₁, p₁) of a partitioned Runge–Kutta pair (A, b, c; Â, b̂) solves
    for the stage velocities Vᵢ and multipliers Λᵢ

        Qᵢ = q₀ + h Σⱼ aᵢⱼ Vⱼ,   Fⱼ = ∂L/∂q(Qⱼ, Vⱼ) + α(Qⱼ)ᵀΛⱼ,   Pᵢ = p₀ + h Σⱼ âᵢⱼ Fⱼ,
        ∂L/∂v(Qᵢ, Vᵢ) = Pᵢ,   α(Qᵢ)·Vᵢ = 0,
        q₁ = q₀ + h Σ bᵢ Vᵢ,   p₁ = p₀ + h Σ b̂ᵢ Fᵢ,

    all derivatives by autodiff, by one Newton solve per step. For Lobatto IIIA–IIIB (Â
    has a zero last column, so Λ_s is absent from the stages) the Legendre relation and
    the constraint are imposed at the step end, with the end velocity an extra unknown,
    and the stage constraints in the integrated form Σⱼ aᵢⱼ α(Qⱼ)·Vⱼ = 0 (i = 2..s); see
    `geomjax._step.dirac_rk` for why. With the tableau
    `PartitionedTableau.dirac1()` (s = 1, a = 0, â = 1) this is Salnikov and Hamdouni's (2019) Dirac-1
    integrator.

    Measured orders of q / p / λ (double pendulum in Cartesian coordinates, see
    `geomjax._step.dirac_rk` for the table): Gauss s = 1, 2, 3: 2/2/1, 4/2/1, 6/4/3 (the
    momenta show the index-2 order reduction); Radau IIA s = 1, 2, 3: 1/1/1, 3/3/2, 5/5/3;
    Lobatto IIIA–IIIB s = 2, 3: 2/2/1, 4/4/2. Radau IIA and Lobatto IIIA–IIIB end every
    step on the velocity-constraint set (to round-off); Gauss does not.

    **Arguments:**

    - `lagrangian`: `(q, v) ↦ L` (a scalar) or a `geomjax.LagrangianSystem` (its
      constraints are used; it must have no external force).
    - `tableau`: `"gauss"`, `"radau_iia"`, `"lobatto_iiia_iiib"` or a
      `geomjax.PartitionedTableau`.
    - `stages`: the number of stages s for a named tableau (Gauss and Radau IIA: 1, 2, 3;
      Lobatto IIIA–IIIB: 2, 3); ignored for a `PartitionedTableau`.
    - `holonomic`: optional φ(q), shape `(k,)`; imposed in its velocity form Dφ(q)·v = 0.
    - `nonholonomic`: optional `alpha(q)` (k × n) or a `geomjax.VelocityConstraint`.
    - `newton`: the `geomjax.Newton` of the stage solve.

    **Returns:**

    A `DiracRungeKutta` step on flat states x = (q, p) of length 2n, for
    `geomjax.integrate`, `jax.jit`, `jax.vmap` and `jax.grad`; `step.multipliers(x, h)`
    gives λ at the end of a step, `step.solve_stages(q, p, h)` all stage values.

    Example (the planar pendulum as a constrained particle, Gauss s = 2):

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> L = lambda q, v: 0.5 * v @ v - q[1]
    >>> step = geomjax.dirac_rk(L, "gauss", 2, holonomic=lambda q: jnp.atleast_1d(q @ q - 1.0))
    >>> x0 = jnp.array([1.0, 0.0, 0.0, 0.0])          # q = (1, 0) at rest
    >>> sol = geomjax.integrate(step, x0, dt=0.05, steps=100)
    >>> q, p = sol.xs[-1, :2], sol.xs[-1, 2:]
    >>> energy = 0.5 * p @ p + q[1]
    >>> print(sol.result == geomjax.RESULTS.successful, bool(abs(energy) < 1e-6), bool(abs(q @ q - 1.0) < 1e-6))
    True True True

    ```
    """
    system = as_implicit_lagrangian(lagrangian, holonomic=holonomic, nonholonomic=nonholonomic, newton=newton)
    if isinstance(tableau, str):
        tableau = PartitionedTableau.from_name(tableau, stages)
    elif not isinstance(tableau, PartitionedTableau):
        raise TypeError(
            f"tableau must be a name ('gauss', 'radau_iia', 'lobatto_iiia_iiib') or a geomjax.PartitionedTableau, got {type(tableau).__name__}"
        )
    end = all(row[-1] == 0.0 for row in tableau.a_hat)
    if end and tableau.b_hat[-1] == 0.0:
        raise ValueError("the last column of Â and b̂_s are zero: the last stage multiplier enters nothing")
    if end and tableau.stages > 1 and any(a != 0.0 for a in tableau.a[0]):
        raise ValueError(
            "a tableau whose Â has a zero last column is solved in the Lobatto IIIA–IIIB "
            "formulation (constraints integrated by the rows 2..s of A, relations at the step "
            "end), which needs the first row of A to be zero"
        )
    return DiracRungeKutta(system, tableau, as_newton(newton))
