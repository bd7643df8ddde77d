"""Discrete variational steps from a Lagrangian: Herglotz (contact) and forced Lagrange–d'Alembert.

Both are the position–momentum form of a discrete variational principle for a discrete
Lagrangian L_d (`geomjax.discrete_lagrangian`), with multipliers for nonholonomic
constraints, solved by one Newton solve per step (`geomjax.Newton`: autodiff Jacobians,
exact implicit-function gradients):

**Discrete Herglotz** (Vermeeren–Bravetti–Seri 2019; Maciel, Ortiz and Schaerer (2020) eqs. (3), (4)), on
(q, p, z) with z the action, L_d = L_d(q_k, q_{k+1}, z_k, z_{k+1}):

    p_k (1 + D₃L_d) + D₁L_d = α(q_k)ᵀλ,      Φ_d(q_k, q_{k+1}) = 0,
    z_{k+1} = z_k + L_d,                      p_{k+1} = D₂L_d / (1 − D₄L_d).

Eliminating p_k gives Maciel, Ortiz and Schaerer (2020) eq. (4) (eq. (3) without constraints); the derivation: the
variation of z_{k+1} = z_k + L_d in q_k is (1 − D₄)δz_{k+1} = (1 + D₃)δz_k + D₁δq_k + D₂δq_{k+1},
and δz_N vanishes for all admissible δq_k exactly when the bracket multiplying δq_k lies in
the span of the constraint one-forms. The map is conformally contact:
dz_{k+1} − p_{k+1}dq_{k+1} = (1 + D₃)/(1 − D₄) (dz_k − p_k dq_k) (without constraints).

**Forced discrete Lagrange–d'Alembert** (Marsden–West 2001 §3.2; Cortés–Martínez 2001;
Maciel, Ortiz and Schaerer (2020) eqs. (1), (15)), on (q, p):

    p_k = −D₁L_d − F_d^− + α(q_k)ᵀλ,    Φ_d(q_k, q_{k+1}) = 0,    p_{k+1} = D₂L_d + F_d^+.

The unknowns of the Newton solve are the discrete velocity v = (q_{k+1} − q_k)/h, the
action rate w = (z_{k+1} − z_k)/h when L_d depends on z_{k+1}, and the multipliers λ: all
of natural size at any h, so the Newton tolerances mean the same at every step size.

**Affine equations are solved, not iterated.** When L is quadratic in v and affine in z
and the constraints are affine in v (every example of Maciel, Ortiz and Schaerer (2020)), the equations are affine
in (v, λ), and with an implicit z₁ affine in w once (v, λ) are known. The step reads this
off the jaxpr of its equations when it is traced (`geomjax._solve.structure`, structural
and sound: a dependence is never missed) and then uses one linear solve (order 1, LA) or
two (order 2: (v, λ), then w): the exact root, with no iteration and no convergence test
to fail on round-off (the Foucault constraint's matrix is nearly singular where the bob
passes the origin). Everything else goes to Newton's method.
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

from .._solve.linalg import small_solve
from .._solve.newton import Newton, as_newton
from .._solve.structure import SystemStructure, linear_solve
from ..internal.simplify import scalar_graph
from .._system.contact import ContactLagrangianSystem, check_flat_contact_state, merge_contact, split_contact
from .._system.discrete import DiscreteLagrangian, Rule, as_rule
from .._system.lagrangian import LagrangianSystem
from .._system.legendre import check_regular, velocity_hessian
from .._system.velocity_constraints import AbstractVelocityConstraint, as_velocity_constraint
from .._validate import require_invertible, trace_user_function
from .base import AbstractStep, newton_status, ok_status


def _velocity_guess(lagrangian_qvz, q0, p0, z0):
    """v with ∂L/∂v(q₀, v, z₀) = p₀ to first order: one linear solve from v = 0 (exact for
    L quadratic in v)."""
    f = lambda a, v: lagrangian_qvz(a[0], v, a[1])  # noqa: E731
    zero = jnp.zeros_like(p0)
    w = velocity_hessian(f, (q0, z0), zero)
    return small_solve(w, p0 - jax.grad(f, argnums=1)((q0, z0), zero))


class _Equations:
    """The discrete variational equations of one step from (q₀, p₀, z₀) at time t₀, size h,
    in the unknowns u = (v[, w][, λ]) (v = (q₁ − q₀)/h, w = (z₁ − z₀)/h, λ multipliers)."""

    def __init__(self, discrete, force, constraint, constraint_rule, q0, p0, z0, t0, h):
        self.discrete, self.force, self.constraint = discrete, force, constraint
        self.q0, self.p0, self.z0, self.t0, self.h = q0, p0, z0, t0, h
        self.contact = discrete.contact
        self.implicit_z = self.contact and discrete.rule.implicit_z
        if constraint is not None:
            self.constraint_ld = DiscreteLagrangian(discrete.lagrangian, constraint_rule, self.contact)
            self.forms0 = constraint.forms(q0)

    def zeros(self):
        """u = 0, shaped like the unknowns."""
        dtype = self.p0.dtype
        out = [jnp.zeros(self.q0.shape, dtype)]
        if self.implicit_z:
            out.append(jnp.zeros((), dtype))
        if self.constraint is not None:
            out.append(jnp.zeros((self.forms0.shape[0],), dtype))
        return tuple(out)

    def full(self, u):
        it = iter(u)
        v = next(it)
        w = next(it) if self.implicit_z else None
        lam = next(it) if self.constraint is not None else None
        return v, w, lam

    def unpack(self, u):
        v, w, lam = self.full(u)
        q1 = self.q0 + self.h * v
        z1 = self.z0 + self.h * w if self.implicit_z else self.z0
        return q1, z1, lam

    def __call__(self, u):
        q0, p0, z0, h, discrete = self.q0, self.p0, self.z0, self.h, self.discrete
        q1, z1, lam = self.unpack(u)
        d1, d3 = jax.grad(lambda a, c: discrete(a, q1, h, c, z1), argnums=(0, 1))(q0, z0)
        r_p = p0 + d1 + p0 * d3 if self.contact else p0 + d1
        if self.force is not None:
            r_p = r_p + discrete.forces(self.force, q0, q1, h, self.t0)[0]
        if self.constraint is not None:
            r_p = r_p - jnp.sum(lam[:, None] * self.forms0, axis=0)
        out = [r_p]
        if self.implicit_z:
            out.append(self.full(u)[1] - discrete(q0, q1, h, z0, z1) / h)
        if self.constraint is not None:
            out.append(self.constraint_ld.constraint(self.constraint, q0, q1, h))
        return tuple(out)

    def finish(self, u):
        """(q₁, p₁, z₁) from the root u: p₁ = D₂L_d/(1 − D₄L_d) (+ F_d^+)."""
        q0, z0, h, discrete = self.q0, self.z0, self.h, self.discrete
        q1, z1, _ = self.unpack(u)
        if not self.implicit_z:
            z1 = z0 + discrete(q0, q1, h, z0, z0) if self.contact else z0
        _, d2, _, d4 = discrete.derivatives(q0, q1, h, z0, z1)
        p1 = d2 / (1.0 - d4) if self.contact else d2
        if self.force is not None:
            p1 = p1 + discrete.forces(self.force, q0, q1, h, self.t0)[1]
        return q1, p1, z1


def _linear_root(equations: _Equations, plan: str):
    """The root of affine (`"affine"`) or block-triangular affine (`"staged"`) equations."""
    zeros = equations.zeros()
    if plan == "affine":
        # Affine in (v, w, λ) (L quadratic in v and affine in z, constraints affine in v):
        # one linear solve is the exact root; iterating would only re-test it.
        return linear_solve(equations, zeros)
    # The momentum and constraint equations do not involve w and are affine in (v, λ);
    # the action equation is affine in w: two linear solves, (v, λ) then w.
    rows = (0, 2) if equations.constraint is not None else (0,)
    a0 = tuple(z for i, z in enumerate(zeros) if i != 1)
    a = linear_solve(lambda b: _select(equations(_insert(b, zeros[1])), rows), a0)
    w = linear_solve(lambda ww: equations(_insert(a, ww))[1], zeros[1])
    return _insert(a, w)


def _discrete_solve(
    discrete: DiscreteLagrangian,
    q0,
    p0,
    z0,
    t0,
    h,
    *,
    force: Callable | None,
    constraint: AbstractVelocityConstraint | None,
    constraint_rule: Rule | None,
    newton: Newton,
    simplify: bool = True,
):
    """One step (q₀, p₀, z₀) ↦ (q₁, p₁, z₁) of the discrete variational equations; also
    returns whether the Newton solve converged (`None` when linear solves gave the root)."""
    dtype = p0.dtype
    z0, t0, h = (jnp.asarray(a, dtype) for a in (z0, t0, h))

    def equations_at(q0, p0, z0, t0, h):
        return _Equations(discrete, force, constraint, constraint_rule, q0, p0, z0, t0, h)

    equations = equations_at(q0, p0, z0, t0, h)
    plan = _solve_plan(equations, equations.zeros(), q0.shape[0], equations.implicit_z)
    if plan != "newton":
        # Linear solves only: the whole step is a small expression, evaluated through its
        # simplified scalar graph (constants folded, structural zeros dropped).
        def step(q0, p0, z0, t0, h):
            eqs = equations_at(q0, p0, z0, t0, h)
            return eqs.finish(_linear_root(eqs, plan))

        # No convergence to report: a singular matrix makes the state non-finite, which
        # the driver reports (nonfinite_first_step / diverged) from its own check.
        return scalar_graph(step, q0, p0, z0, t0, h, enabled=simplify), None
    v_guess = _velocity_guess(discrete.lagrangian_qvz, q0, p0, z0)
    parts = [v_guess]
    if equations.implicit_z:
        parts.append(discrete.lagrangian_qvz(q0, v_guess, z0))
    if constraint is not None:
        parts.append(jnp.zeros((equations.forms0.shape[0],), dtype))
    sol = newton.solve(equations, tuple(parts))
    return equations.finish(sol.value), sol.converged


def _status(converged):
    return ok_status() if converged is None else newton_status(converged)


def _insert(a, w):
    """(v, λ...) and w → (v, w, λ...)."""
    return (a[0], w, *a[1:])


def _select(out, indices):
    return tuple(out[i] for i in indices)


def _solve_plan(equations, zeros, n: int, implicit_z: bool) -> str:
    """How to solve the step's equations, decided from their jaxpr at trace time (sound:
    `SystemStructure`): `"affine"` (one linear solve), `"staged"` (with z₁ implicit: the
    (v, λ) equations affine and free of w, then the w equation affine in w) or `"newton"`."""
    structure = SystemStructure.of(equations, zeros)
    m = structure.m
    everything = list(range(m))
    if structure.affine(everything, everything):
        return "affine"
    if implicit_z:
        w_index = [n]
        others = [i for i in everything if i != n]
        if (
            structure.independent(others, w_index)
            and structure.affine(others, others)
            and structure.affine(w_index, w_index)
        ):
            return "staged"
    return "newton"


def _check_regular_at(lagrangian_qvz, q0, p0, z0, constraint):
    """Clear errors at a concrete start: a degenerate L (singular ∂²L/∂v²) or dependent
    constraint one-forms make the step's Newton matrix singular as h → 0."""
    f = lambda a, v: lagrangian_qvz(a[0], v, a[1])  # noqa: E731
    v = _velocity_guess(lagrangian_qvz, q0, p0, z0)
    check_regular(f, (q0, z0), v, "the velocity Hessian ∂²L/∂v²", "at x0")
    if constraint is not None:
        constraint.check(q0)
        forms = constraint.forms(q0)
        w = velocity_hessian(f, (q0, z0), v)
        require_invertible(
            forms @ jnp.linalg.solve(w, forms.T),
            "the constraint matrix α W⁻¹ αᵀ (W = ∂²L/∂v²)",
            "the nonholonomic constraint one-forms α(q) are linearly dependent there (or "
            "vanish): remove redundant constraints",
        )


class _VariationalStep(AbstractStep):
    discrete: eqx.AbstractVar[DiscreteLagrangian]
    constraint: eqx.AbstractVar[AbstractVelocityConstraint | None]
    constraint_rule: eqx.AbstractVar[Rule | None]
    newton: eqx.AbstractVar[Newton]

    def _trace_check(self, x0, what):
        trace_user_function(lambda x: self.advance(0.0, self.split(x), 0.1, None)[0], x0, what)


class HerglotzStep(_VariationalStep):
    """The discrete Herglotz (contact variational) step on (q, p, z); built by `geomjax.herglotz`.

    `advance(t, z, h, args)` returns `((q₁, p₁, z₁), status)`, status
    `RESULTS.newton_failed` when the implicit solve did not converge.
    """

    discrete: DiscreteLagrangian
    constraint: AbstractVelocityConstraint | None
    constraint_rule: Rule | None
    newton: Newton
    order: int = eqx.field(static=True)
    n: int | None = eqx.field(static=True, default=None)

    @property
    def dim(self):
        return None if self.n is None else 2 * self.n + 1

    def split(self, x):
        return split_contact(x, (x.shape[0] - 1) // 2)

    def merge(self, z):
        return merge_contact(z)

    def advance(self, t, z, h, args):
        del args
        q0, p0, z0 = z
        out, converged = _discrete_solve(
            self.discrete,
            q0,
            p0,
            z0,
            t,
            h,
            force=None,
            constraint=self.constraint,
            constraint_rule=self.constraint_rule,
            newton=self.newton,
            simplify=self.simplify,
        )
        return out, _status(converged)

    def check(self, x0) -> None:
        check_flat_contact_state(x0, self.n, "geomjax.herglotz")
        self._trace_check(x0, "the lagrangian L(q, v, z) or the constraint")
        q0, p0, z0 = self.split(x0)
        _check_regular_at(self.discrete.lagrangian_qvz, q0, p0, z0, self.constraint)


class ForcedDLAStep(_VariationalStep):
    """The forced discrete Lagrange–d'Alembert step on (q, p); built by `geomjax.forced_dla`."""

    discrete: DiscreteLagrangian
    force: Callable | None
    constraint: AbstractVelocityConstraint | None
    constraint_rule: Rule | None
    newton: Newton
    n: int | None = eqx.field(static=True, default=None)

    @property
    def dim(self):
        return None if self.n is None else 2 * self.n

    def split(self, x):
        n = x.shape[0] // 2
        return x[:n], x[n:]

    def merge(self, z):
        return jnp.concatenate(z)

    def advance(self, t, z, h, args):
        del args
        q0, p0 = z
        (q1, p1, _), converged = _discrete_solve(
            self.discrete,
            q0,
            p0,
            jnp.zeros((), p0.dtype),
            t,
            h,
            force=self.force,
            constraint=self.constraint,
            constraint_rule=self.constraint_rule,
            newton=self.newton,
            simplify=self.simplify,
        )
        return (q1, p1), _status(converged)

    def check(self, x0) -> None:
        if x0.shape[0] % 2:
            raise ValueError(f"geomjax.forced_dla works on flat states x = (q, p) of even length, got length {x0.shape[0]}")
        if self.n is not None and x0.shape[0] != 2 * self.n:
            raise ValueError(f"x0 has length {x0.shape[0]}, but the system has n = {self.n} (length {2 * self.n})")
        self._trace_check(x0, "the lagrangian L(q, v), the force or the constraint")
        q0, p0 = self.split(x0)
        _check_regular_at(self.discrete.lagrangian_qvz, q0, p0, jnp.zeros((), x0.dtype), self.constraint)


_HERGLOTZ_RULES = {1: ("trapezoidal_left_z", "left"), 2: ("trapezoidal", "midpoint")}


def herglotz(
    lagrangian,
    order: int = 1,
    nonholonomic=None,
    *,
    rule=None,
    constraint_rule=None,
    newton: Newton | None = None,
) -> HerglotzStep:
    """The discrete Herglotz (contact variational) integrator, with nonholonomic constraints.

    For a contact Lagrangian L(q, v, z) (Herglotz' principle: ż = L, the action z(T)
    stationary), one step (q_k, p_k, z_k) ↦ (q_{k+1}, p_{k+1}, z_{k+1}) of size h solves

        p_k (1 + D₃L_d) + D₁L_d = α(q_k)ᵀλ,    Φ(Ψ(q_k, q_{k+1})) = 0,
        z_{k+1} = z_k + L_d,    p_{k+1} = D₂L_d / (1 − D₄L_d),

    with L_d = L_d(q_k, q_{k+1}, z_k, z_{k+1}) the discrete Lagrangian of `rule`
    (`geomjax.discrete_lagrangian`) and its derivatives D₁…D₄ by autodiff: Maciel, Ortiz and Schaerer (2020)
    eq. (3) (no constraints) and eq. (4) in position–momentum form, solved by Newton's
    method for the velocity, the action and the multipliers.

    - `order=1`: the contact integrator of Vermeeren–Bravetti–Seri,
      L_d = h/2 [L(q_k, v, z_k) + L(q_{k+1}, v, z_k)], v = (q_{k+1} − q_k)/h. Explicit in z,
      first order (its error is O(h) with a coefficient proportional to ∂L/∂z, so it looks
      second order as the damping goes to 0). For L = ½|v|² − ½|q|² − αz this is exactly
      Maciel, Ortiz and Schaerer (2020) eq. (10).
    - `order=2`: the symmetric contact integrator, L_d = h/2 [L(q_k, v, z_k) +
      L(q_{k+1}, v, z_{k+1})] (trapezoidal in q and z; implicit in z). Second order.

    Without constraints the map is conformally contact: it sends η = dz − p·dq to
    (1 + D₃L_d)/(1 − D₄L_d)·η. With constraints it is so on admissible variations
    (δq ∈ ker α(q_k)). With constraints and `order=2` the positions are second order but
    the momenta p_k = D₂L_d/(1 − D₄L_d) only first order: the reaction α(q_k)ᵀλ enters the
    equation at q_k alone (measured on a damped knife edge: q errors 1.8e−3 … 2.8e−5 for
    h = 1/20 … 1/160, slope 2.00; (q, p) slope 1.02).

    **Arguments:**

    - `lagrangian`: `(q, v, z) ↦ L`, a scalar (q, v of shape `(n,)`, z a scalar), or a
      `geomjax.ContactLagrangianSystem` (its constraints are used).
    - `order`: 1 or 2 (see above).
    - `nonholonomic`: optional constraints: `alpha(q)` of shape `(k, n)` (α(q)·v = 0) or a
      `geomjax.VelocityConstraint(phi)` (affine in v). The multiplier force acts at q_k
      (variations in ker α(q_k)); the discrete constraint is Φ_d = Φ∘Ψ with Ψ of
      `constraint_rule`.
    - `rule`: replaces the order's discrete Lagrangian: a rule name or a callable
      `psi(q0, q1, h) ↦ (q, v)` (see `geomjax.discrete_lagrangian`).
    - `constraint_rule`: the discretizing map of the constraints (default `"left"` for
      order 1, as in Maciel, Ortiz and Schaerer (2020) eq. (18); `"midpoint"` for order 2; `rule` itself when
      `rule` is given).
    - `newton`: the `geomjax.Newton` of the implicit solve (default `Newton()`); not used
      when the equations are affine (solved by linear solves, see the module docstring).

    **Returns:**

    A step for `geomjax.integrate(step, x0, dt=..., steps=...)` on flat states
    x = (q, p, z) of length 2n + 1. A Newton solve that fails is reported as
    `RESULTS.newton_failed` with the step number; where linear solves give the root (see
    the module docstring), a singular matrix makes the state non-finite, reported as
    `RESULTS.nonfinite_first_step` or `RESULTS.diverged`.

    Example (the damped oscillator of Maciel, Ortiz and Schaerer (2020) §3.1; the energy decays as e^{−αt}):

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> alpha = 0.1
    >>> L = lambda q, v, z: 0.5 * v @ v - 0.5 * q @ q - alpha * z
    >>> step = geomjax.herglotz(L, order=2)
    >>> sol = geomjax.integrate(step, jnp.array([1.0, 0.0, 0.0]), dt=0.05, steps=200)
    >>> q, p, z = sol.xs[-1]
    >>> energy = 0.5 * p**2 + 0.5 * q**2 + alpha * z      # the contact Hamiltonian
    >>> bool(abs(energy / (0.5 * jnp.exp(-alpha * 10.0)) - 1.0) < 1e-3)
    True

    ```
    """
    n = None
    if isinstance(lagrangian, ContactLagrangianSystem):
        if nonholonomic is not None and lagrangian.nonholonomic is not None:
            raise ValueError("the system already has nonholonomic constraints; do not pass nonholonomic= too")
        nonholonomic = lagrangian.nonholonomic if nonholonomic is None else nonholonomic
        n = lagrangian.n
        lagrangian = lagrangian.lagrangian
    elif isinstance(lagrangian, LagrangianSystem):
        raise TypeError(
            "herglotz needs a contact Lagrangian L(q, v, z) (or a ContactLagrangianSystem); "
            "for a LagrangianSystem L(q, v) use geomjax.forced_dla"
        )
    elif not callable(lagrangian):
        raise TypeError(f"lagrangian must be a callable (q, v, z) ↦ L, got {type(lagrangian).__name__}")
    if isinstance(order, bool) or order not in _HERGLOTZ_RULES:
        raise ValueError(f"order must be 1 or 2, got {order!r}")
    default_rule, default_constraint_rule = _HERGLOTZ_RULES[order]
    if rule is not None:
        default_constraint_rule = rule
    rule = as_rule(default_rule if rule is None else rule)
    constraint = as_velocity_constraint(nonholonomic)
    c_rule = None
    if constraint is not None:
        c_rule = as_rule(default_constraint_rule if constraint_rule is None else constraint_rule)
    return HerglotzStep(
        DiscreteLagrangian(lagrangian, rule, True), constraint, c_rule, as_newton(newton), order, n
    )


def forced_dla(
    lagrangian,
    force: Callable | None = None,
    nonholonomic=None,
    *,
    rule="left",
    constraint_rule=None,
    newton: Newton | None = None,
) -> ForcedDLAStep:
    """The forced discrete Lagrange–d'Alembert (variational) integrator, with nonholonomic constraints.

    From the Lagrange–d'Alembert principle δ∫L dt + ∫F·δq dt = 0 with variations in
    ker α(q), discretized with a discrete Lagrangian L_d (`geomjax.discrete_lagrangian`),
    discrete forces F_d^± by the same quadrature and discrete constraints Φ_d = Φ∘Ψ
    (Maciel, Ortiz and Schaerer (2020) eq. (1); Marsden–West 2001, Cortés–Martínez 2001). In position–momentum
    form, one step (q_k, p_k) ↦ (q_{k+1}, p_{k+1}) of size h solves

        p_k = −D₁L_d(q_k, q_{k+1}) − F_d^−(q_k, q_{k+1}) + α(q_k)ᵀλ,   Φ_d(q_k, q_{k+1}) = 0,
        p_{k+1} = D₂L_d(q_k, q_{k+1}) + F_d^+(q_k, q_{k+1}),

    by Newton's method for the velocity (q_{k+1} − q_k)/h and the multipliers. With
    `rule="left"` (the default): L_d = h L(q_k, v), F_d^− = h F(q_k, v, t_k), F_d^+ = 0 and
    Φ_d = Φ(q_k, v), Maciel, Ortiz and Schaerer (2020) eqs. (6), (7) and (15). (Maciel, Ortiz and Schaerer's (2020) printed eq. (7) has
    1 + α where the derivation gives 1 + hα; see `tests/test_herglotz.py`.)

    Order 1 with `"left"`, order 2 with `"midpoint"` or `"trapezoidal"` (without
    constraints; with constraints the momenta are first order, as for `geomjax.herglotz`).

    Not to be confused with `geomjax.dla`, McLachlan and Perlmutter's second-order
    Lagrange–d'Alembert integrator of a nonholonomic *Hamiltonian* system.

    **Arguments:**

    - `lagrangian`: `(q, v) ↦ L`, a scalar, or a `geomjax.LagrangianSystem` (its force and
      constraints are used).
    - `force`: optional external force `(q, v, t) ↦ F`, shape `(n,)`.
    - `nonholonomic`: optional constraints: `alpha(q)` of shape `(k, n)` or a
      `geomjax.VelocityConstraint(phi)`.
    - `rule`: the discretizing map (a name or `psi(q0, q1, h)`; see
      `geomjax.discrete_lagrangian`); `"midpoint"` and `"trapezoidal"` give second order.
    - `constraint_rule`: the discretizing map of the constraints (default: `rule`).
    - `newton`: the `geomjax.Newton` of the implicit solve; not used when the equations
      are affine in the unknowns (then one linear solve gives the root).

    **Returns:**

    A step for `geomjax.integrate` on flat states x = (q, p) of length 2n.

    Example (the damped oscillator of Maciel, Ortiz and Schaerer (2020) eq. (7)):

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> alpha, h = 0.1, 0.05
    >>> step = geomjax.forced_dla(lambda q, v: 0.5 * v @ v - 0.5 * q @ q,
    ...                           force=lambda q, v, t: -alpha * v)
    >>> x1 = step(jnp.array([1.0, 0.5]), h)
    >>> p1 = (0.5 - h * 1.0) / (1.0 + h * alpha)          # eq. (7) with 1 + hα
    >>> bool(jnp.allclose(x1, jnp.array([1.0 + h * p1, p1]), rtol=1e-14))
    True

    ```
    """
    n = None
    if isinstance(lagrangian, LagrangianSystem):
        if force is not None and lagrangian.force is not None:
            raise ValueError("the system already has a force; do not pass force= too")
        if nonholonomic is not None and lagrangian.nonholonomic is not None:
            raise ValueError("the system already has nonholonomic constraints; do not pass nonholonomic= too")
        if lagrangian.holonomic is not None:
            raise ValueError(
                "forced_dla does not take holonomic constraints; use geomjax.rattle on "
                "system.to_hamiltonian() (or write them as velocity constraints Dg(q)·v = 0)"
            )
        force = lagrangian.force if force is None else force
        nonholonomic = lagrangian.nonholonomic if nonholonomic is None else nonholonomic
        n = lagrangian.n
        lagrangian = lagrangian.lagrangian
    elif isinstance(lagrangian, ContactLagrangianSystem):
        raise TypeError("forced_dla needs L(q, v); for a contact Lagrangian L(q, v, z) use geomjax.herglotz")
    elif not callable(lagrangian):
        raise TypeError(f"lagrangian must be a callable (q, v) ↦ L, got {type(lagrangian).__name__}")
    if force is not None and not callable(force):
        raise TypeError(f"force must be a callable (q, v, t) ↦ F, got {type(force).__name__}")
    rule = as_rule(rule)
    constraint = as_velocity_constraint(nonholonomic)
    c_rule = None
    if constraint is not None:
        c_rule = rule if constraint_rule is None else as_rule(constraint_rule)
    return ForcedDLAStep(DiscreteLagrangian(lagrangian, rule, False), force, constraint, c_rule, as_newton(newton), n)
