"""Dirac integrators of implicit Lagrangian systems: Dirac-1, Dirac-2 and their family.

Salnikov and Hamdouni (2019), §III.B discretises the implicit Lagrangian system
(`geomjax._system.implicit`) q̇ = v, ṗ = ∂L/∂q + α(q)ᵀλ, p = ∂L/∂v, α(q)·v = 0 by
replacing the velocity with an approximation q̃ built from positions (the inverse of a
retraction), ∂L/∂q by ∂L_d/∂q_k and ∂L/∂v by ∂L_d/∂q_k⁺, with L_d = h L(q_k, q̃). For
its pendulum this gives eq. (7); for any L and constraints the step
(q_k, p_k) ↦ (q_{k+1}, p_{k+1}) solves, for q_{k+1} and λ,

    p_{k+1} = ∂L/∂v(q_k, q̃),
    p_{k+1} = p_k + h (∂L/∂q(q_k, q̃) + α(q_k)ᵀλ),
    α(q_k)·q̃ (+ β(q_k)) = 0,

with q̃ = (q_{k+1} − q_k)/h for **Dirac-1** (the implicit discrete Lagrangian system of
Leok–Ohsawa: the same map as the forced discrete Lagrange–d'Alembert step with the left
rule) and q̃ = (q_{k+1} − q_{k−1})/2h for **Dirac-2** (a two-step method). The multiplier
is scaled by h, so λ approximates the continuous multiplier. Every derivative comes from
autodiff of the user's L and φ (α = Dφ for holonomic constraints).

**What the paper leaves open, and the choices made here.**

- The velocity approximation is the design freedom the paper stresses: `geomjax.dirac`
  takes any callable `velocity(past, q, q_next, h) ↦ q̃`, with `past` the `history`
  positions before q_k (oldest first); Dirac-1 and Dirac-2 are two such callables.
- A two-step method needs q_{−1}: the step's `start` computes it with a backward step of
  size −h of a one-step `starter` (default: Dirac-1 in 16 substeps), so that
  `geomjax.integrate(step, x0, ...)` starts from (q₀, p₀) alone and saves (q, p).
- The paper imposes the constraint at the velocity level, α(q_k)·q̃ = 0, so the holonomic
  constraint φ(q) drifts (paper Table I: 0.952 for Dirac-1 after 100 periods).
  `constraint="position"` imposes φ(q_{k+1}) = 0 instead (kept to Newton tolerance; the
  nonholonomic rows stay at the velocity level).

**Orders (measured, `tests/test_dirac.py`).** Dirac-1 is first order in q and p (its q
sequence is Störmer–Verlet's, but p_{k+1} = ∂L/∂v(q_k, q̃) is the momentum at t_{k+½}).
Dirac-2 as printed is first order too, not second: eliminating p, its positions satisfy
q_{k+1} − q_k − q_{k−1} + q_{k−2} = 2h² M⁻¹ ∂L/∂q(q_k) (+ constraint forces), a linear
multistep recurrence with ρ(ζ) = (ζ − 1)²(ζ + 1), σ(ζ) = 2ζ², whose error constant
ρ(eʰ) − h²σ(eʰ) = −h³ + O(h⁴) is of order 1; on the harmonic oscillator it damps the
amplitude by e^{−ht/4}. Its "order 2" (paper Table I) is that of its velocity
approximation and of its constraint, α(q_k)·(q_{k+1} − q_{k−1})/2h = 0, which is why
it keeps the constraint far better than Dirac-1. The root ζ = −1 of ρ is a parasitic
mode: it can grow on nonlinear problems (the `pendulum-dirac` experiment at 141 steps
per period, and the full turns of the `ziegler-column` experiment).

**Solves.** When L is quadratic in v and the imposed constraints are affine in q_{k+1}
(the velocity level), the equations are affine in (q_{k+1}, λ) — decided from their jaxpr
(`geomjax._solve.structure`, sound) — and one linear solve is the exact root, by block
elimination of the saddle-point system on the velocity block (`saddle_linear_solve`: a
diagonal block divided by, a tridiagonal Schur complement of a chain solved in O(k)),
evaluated through its simplified scalar graph. Otherwise Newton's method (`geomjax.Newton`, exact
implicit derivatives) solves for w = (q_{k+1} − q_k)/h and the impulse hλ, and a failure is reported
as `RESULTS.newton_failed`.
"""

from collections.abc import Callable
from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

from .._solve.block_lu import SPARSE_NEWTON_MIN
from .._solve.newton import Newton, as_newton
from .._solve.structure import SystemStructure, linear_solve, saddle_linear_solve
from .._system.implicit import ImplicitLagrangian, as_implicit_lagrangian
from ..internal.simplify import scalar_graph
from .._status import RESULTS
from .._validate import trace_user_function
from .base import AbstractStep, newton_status, ok_status


def forward_difference(past, q, q_next, h):
    """Dirac-1's velocity approximation q̃ = (q_{k+1} − q_k)/h."""
    del past
    return (q_next - q) / h


def centred_difference(past, q, q_next, h):
    """Dirac-2's velocity approximation q̃ = (q_{k+1} − q_{k−1})/2h."""
    return (q_next - past[-1]) / (2.0 * h)


_IMPOSED = ("velocity", "position")


class _Equations:
    """The equations of one Dirac step from (past, q_k, p_k), in u = (w, μ): w = (q_{k+1} − q_k)/h
    and the impulse μ = hλ. `constraint_velocity` (None: `velocity`) is the velocity
    approximation in the velocity-level constraint rows."""

    def __init__(self, system: ImplicitLagrangian, velocity, imposed, past, q, p, h, constraint_velocity=None):
        self.system, self.velocity, self.imposed = system, velocity, imposed
        self.constraint_velocity = constraint_velocity
        self.past, self.q, self.p, self.h = past, q, p, h
        self.constrained = system.constrained

    def zeros(self):
        out = [jnp.zeros_like(self.q)]
        if self.constrained:
            # (a fresh lambda: eval_shape caches by function, and comparing bound methods of
            # modules holding traced arrays would compare the arrays)
            k = jax.eval_shape(lambda a, b: self.system.constraint(a, b), self.q, self.q).shape[0]
            out.append(jnp.zeros((k,), self.q.dtype))
        return tuple(out)

    def forms_transpose(self, mu):
        """α(q_k)ᵀμ, by a reverse pass through the velocity constraints (affine in v) taken
        inside the equations: no k × n matrix, and their sparsity stays readable."""
        return jax.vjp(lambda v: self.system.constraint(self.q, v), jnp.zeros_like(self.q))[1](mu)[0]

    def approximate_velocity(self, u):
        q_next = self.q + self.h * u[0]
        return q_next, self.velocity(self.past, self.q, q_next, self.h)

    def constrained_velocity(self, q_next, qt):
        """The velocity the velocity-level constraint rows read: q̃ itself, or that of `constraint_velocity`."""
        if self.constraint_velocity is None:
            return qt
        return self.constraint_velocity(self.past, self.q, q_next, self.h)

    def __call__(self, u):
        system, q, h = self.system, self.q, self.h
        q_next, qt = self.approximate_velocity(u)
        qc = self.constrained_velocity(q_next, qt)
        dq, dv = system.derivatives(q, qt)
        # The unknown multiplier is the impulse μ = hλ: of the size of a momentum at any
        # h, so that the Newton update test means the same at every step size.
        out = [dv - self.p - h * dq]
        if self.constrained:
            out[0] = out[0] - self.forms_transpose(u[1])
            if self.imposed == "position" and system.holonomic is not None:
                k_h = system.position_constraints(q).shape[0]
                rows = [system.position_constraints(q_next) / h]
                if system.nonholonomic is not None:
                    rows.append(system.constraint(q, qc)[k_h:])
                out.append(jnp.concatenate(rows))
            else:
                out.append(system.constraint(q, qc))
        return tuple(out)

    def finish(self, u):
        """(q_{k+1}, p_{k+1} = ∂L/∂v(q_k, q̃))."""
        q_next, qt = self.approximate_velocity(u)
        return q_next, self.system.momentum(self.q, qt)


def _affine_structure(equations: _Equations):
    """The equations' `SystemStructure` when they are affine in all unknowns, else None."""
    zeros = equations.zeros()
    structure = SystemStructure.of(equations, zeros)
    everything = list(range(structure.m))
    return structure if structure.affine(everything, everything) else None


class DiracStep(AbstractStep):
    """A Dirac integrator step on (q, p); built by `geomjax.dirac1`, `geomjax.dirac2`, `geomjax.dirac`.

    `advance(t, z, h, args)` returns `(z_next, status)`; for a method with history the
    pieces are `(q, p, past)` with `past` the previous positions (oldest first), set up
    by `start` from (q₀, p₀).
    """

    system: ImplicitLagrangian
    velocity: Callable
    starter: AbstractStep | None
    newton: Newton
    history: int = eqx.field(static=True)
    imposed: str = eqx.field(static=True)
    starter_substeps: int = eqx.field(static=True, default=16)
    constraint_velocity: Callable | None = None

    @property
    def dim(self):
        return None if self.system.n is None else 2 * self.system.n

    @property
    def carries_history(self) -> bool:
        return self.history > 0

    def split(self, x):
        return self.system.split(x)

    def merge(self, z):
        return self.system.merge(z)

    def start(self, t0, z0, h, args):
        if not self.history:
            return z0
        q, p = z0[0], z0[1]
        past = []
        sub = -h / self.starter_substeps

        def substep(_, carry):
            state, ok = carry
            state, result = self.starter.advance(t0, state, sub, args)
            return state, ok & (result == RESULTS.successful)

        carry = ((q, p), jnp.asarray(True))
        for _ in range(self.history):
            # in a loop: written out, 16 linear solves made Dirac-2 on a Ziegler column
            # slow to compile
            carry = lax.fori_loop(0, self.starter_substeps, substep, carry)
            past.insert(0, carry[0][0])
        # A starter whose Newton solve failed gives no history to trust: NaN past positions
        # make the first step non-finite, which the driver reports at step 1.
        ok = carry[1]
        return (q, p, tuple(jnp.where(ok, a, jnp.nan) for a in past))

    def advance(self, t, z, h, args):
        del t, args
        q, p = z[0], z[1]
        past = z[2] if self.history else ()
        h = jnp.asarray(h, q.dtype)
        equations = _Equations(self.system, self.velocity, self.imposed, past, q, p, h, self.constraint_velocity)
        structure = _affine_structure(equations)
        if structure is not None:
            large = structure.m >= SPARSE_NEWTON_MIN and self.newton.sparse
            pattern = None if large else structure.dense()

            def solve(past, q, p, h):
                eqs = _Equations(self.system, self.velocity, self.imposed, past, q, p, h, self.constraint_velocity)
                zeros = eqs.zeros()
                if len(zeros) == 1 or large:  # large: by sparse blocks where the pattern allows
                    return eqs.finish(linear_solve(eqs, zeros))
                return eqs.finish(saddle_linear_solve(eqs, zeros, pattern))

            # One linear solve is the root: no convergence to report (a singular matrix
            # makes the state non-finite, which the driver reports). Small systems run
            # through their simplified scalar graph.
            run = solve if large else partial(scalar_graph, solve)
            (q_next, p_next), status = run(past, q, p, h), ok_status()
        else:
            guess = list(equations.zeros())
            guess[0] = self.system.velocity(q, p)
            sol = self.newton.solve(equations, tuple(guess))
            (q_next, p_next), status = equations.finish(sol.value), newton_status(sol.converged)
        if not self.history:
            return (q_next, p_next), status
        return (q_next, p_next, tuple(past[1:]) + (q,)), status

    def check(self, x0) -> None:
        self.system.check(x0, "a Dirac integrator")
        # (L and the constraints were traced by the system's check; the step itself is
        # traced once, by the run)
        q = self.split(x0)[0]
        approximations = [("the velocity approximation", self.velocity)]
        if self.constraint_velocity is not None:
            approximations.append(("the constraint's velocity approximation", self.constraint_velocity))
        for what, velocity in approximations:
            out = trace_user_function(lambda a, velocity=velocity: velocity((a,) * self.history, a, a, 0.1), q, what)
            if getattr(out, "shape", None) != q.shape:
                raise ValueError(f"{what} must return q̃ shaped like q {tuple(q.shape)}, got {getattr(out, 'shape', None)}")

    def constraint_residuals(self, x):
        return self.system.constraint_residuals(x)

    def invariants(self, x):
        return self.system.invariants(x)


def dirac(
    lagrangian,
    holonomic: Callable | None = None,
    nonholonomic=None,
    *,
    velocity: Callable = forward_difference,
    history: int = 0,
    constraint: str = "velocity",
    starter: AbstractStep | None = None,
    newton: Newton | None = None,
    constraint_velocity: Callable | None = None,
) -> DiracStep:
    """A Dirac integrator (Salnikov and Hamdouni (2019) §III.B) with a velocity approximation of your choice.

    One step (q_k, p_k) ↦ (q_{k+1}, p_{k+1}) of size h solves, for q_{k+1} and λ,

        p_{k+1} = ∂L/∂v(q_k, q̃),   p_{k+1} = p_k + h (∂L/∂q(q_k, q̃) + α(q_k)ᵀλ),
        α(q_k)·q̂ (+ β(q_k)) = 0,

    with q̃ = `velocity(past, q_k, q_{k+1}, h)`, q̂ = `constraint_velocity(past, q_k,
    q_{k+1}, h)` (default q̂ = q̃) and α the constraint one-forms (α = Dφ of the holonomic
    constraints φ, and the nonholonomic one-forms), all by autodiff. See the module
    `geomjax._step.dirac` for the solves and the measured orders.

    **Arguments:**

    - `lagrangian`: `(q, v) ↦ L`, a scalar, or a `geomjax.LagrangianSystem` (its
      constraints are used).
    - `holonomic`: `q ↦ φ(q)`, shape `(k,)`: holonomic constraints φ(q) = 0.
    - `nonholonomic`: `alpha(q)` (shape `(k, n)`, α(q)·v = 0) or a
      `geomjax.VelocityConstraint(phi)`.
    - `velocity`: `(past, q, q_next, h) ↦ q̃`, the velocity approximation (the inverse of
      a retraction); `past` is the tuple of the `history` positions before q (oldest
      first). Default: the forward difference (Dirac-1).
    - `history`: how many past positions `velocity` reads (0 for a one-step method).
    - `constraint`: `"velocity"` (the paper's α(q_k)·q̃ = 0) or `"position"` (φ(q_{k+1}) = 0
      for the holonomic rows).
    - `starter`: a one-step geomjax step on (q, p) that computes the past positions by
      backward steps (default: Dirac-1 with the same constraints, in 16 substeps).
    - `newton`: the `geomjax.Newton` of the implicit solve (not used when the equations
      are affine: see the module docstring).
    - `constraint_velocity`: `(past, q, q_next, h) ↦ q̂`, the velocity approximation of
      the velocity-level constraint rows (default: `velocity`'s). `geomjax.dirac2(...,
      reading="centred_constraint")` is `velocity=forward_difference,
      constraint_velocity=centred_difference, history=1`.

    **Returns:**

    A step for `geomjax.integrate(step, x0, dt=..., steps=...)` on flat states
    x = (q, p) of length 2n.

    Example (a velocity approximation of your own: the backward-looking three-point rule):

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> L = lambda q, v: 0.5 * v @ v - 9.81 * q[1]
    >>> phi = lambda q: jnp.array([q @ q - 1.0])
    >>> three_point = lambda past, q, q1, h: (3 * q1 - 4 * q + past[-1]) / (2 * h)
    >>> step = geomjax.dirac(L, holonomic=phi, velocity=three_point, history=1)
    >>> x0 = jnp.array([1.0, 0.0, 0.0, 0.0])
    >>> sol = geomjax.integrate(step, x0, dt=1e-3, steps=100, drift_tol=None)
    >>> sol.message, sol.xs.shape
    ('success', (101, 4))

    ```
    """
    system = as_implicit_lagrangian(lagrangian, holonomic, nonholonomic, newton)
    if not callable(velocity):
        raise TypeError(f"velocity must be a callable (past, q, q_next, h) ↦ q̃, got {type(velocity).__name__}")
    if isinstance(history, bool) or not isinstance(history, int) or history < 0:
        raise ValueError(f"history (the number of past positions velocity reads) must be an integer ≥ 0, got {history!r}")
    if constraint not in _IMPOSED:
        raise ValueError(f"constraint must be one of {_IMPOSED}, got {constraint!r}")
    if constraint_velocity is not None and not callable(constraint_velocity):
        raise TypeError(f"constraint_velocity must be None or a callable (past, q, q_next, h) ↦ q̂, got {type(constraint_velocity).__name__}")
    if starter is not None and not isinstance(starter, AbstractStep):
        raise TypeError(f"starter must be a geomjax step on (q, p) (e.g. geomjax.dirac1(...)), got {type(starter).__name__}")
    newton = as_newton(newton)
    if history and starter is None:
        starter = DiracStep(system, forward_difference, None, newton, 0, constraint)
    return DiracStep(system, velocity, starter if history else None, newton, history, constraint,
                     constraint_velocity=constraint_velocity)


def dirac1(lagrangian, holonomic: Callable | None = None, nonholonomic=None, *, constraint: str = "velocity", newton: Newton | None = None) -> DiracStep:
    """Dirac-1 (Salnikov and Hamdouni (2019) eq. (7), q̃ = (q_{k+1} − q_k)/h): a first-order Dirac integrator.

    Solves p_{k+1} = ∂L/∂v(q_k, q̃), p_{k+1} = p_k + h(∂L/∂q(q_k, q̃) + α(q_k)ᵀλ),
    α(q_k)·q̃ = 0 for (q_{k+1}, λ), with every derivative by autodiff of `lagrangian(q, v)`
    and `holonomic(q)` (α = Dφ). Arguments as for `geomjax.dirac`; a step for
    `geomjax.integrate` on x = (q, p).

    Example (Salnikov and Hamdouni (2019) §IV.A's pendulum in Cartesian coordinates):

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> m, g, l = 1.0, 9.81, 1.0
    >>> L = lambda q, v: 0.5 * m * v @ v - m * g * q[1]
    >>> phi = lambda q: jnp.array([q @ q - l**2])
    >>> step = geomjax.dirac1(L, holonomic=phi)
    >>> x0 = jnp.array([jnp.sin(0.5), -jnp.cos(0.5), 0.0, 0.0])   # at rest, 0.5 rad out
    >>> sol = geomjax.integrate(step, x0, dt=1e-3, steps=1000, drift_tol=None)
    >>> q = sol.xs[-1, :2]
    >>> bool(abs(q @ q - 1.0) < 1e-2)      # the constraint drifts, slowly
    True

    ```
    """
    return dirac(lagrangian, holonomic, nonholonomic, constraint=constraint, newton=newton)


_READINGS = ("literal", "centred_constraint")


def dirac2(
    lagrangian,
    holonomic: Callable | None = None,
    nonholonomic=None,
    *,
    reading: str = "literal",
    constraint: str = "velocity",
    starter: AbstractStep | None = None,
    newton: Newton | None = None,
) -> DiracStep:
    """Dirac-2 (Salnikov and Hamdouni (2019) §III.B, q̃ = (q_{k+1} − q_{k−1})/2h): a two-step Dirac integrator.

    V. Salnikov and A. Hamdouni, "From modelling of systems with constraints to generalized
    geometry and back to numerics" (ZAMM 2019, arXiv:1807.06652), define Dirac-2 by their
    eq. (7) with "q̃ = (q_{k+1} − q_{k−1})/2h", and the typography leaves open where q̃
    enters. Two readings, both derived by autodiff of `lagrangian(q, v)` and
    `holonomic(q)` (α = Dφ; nonholonomic rows α(q)·v + β(q) alike):

    - `reading="literal"` (default): the centred q̃ everywhere in eq. (7),

          p_{k+1} = ∂L/∂v(q_k, q̃),   p_{k+1} = p_k + h (∂L/∂q(q_k, q̃) + α(q_k)ᵀλ),
          α(q_k)·q̃ = 0,               q̃ = (q_{k+1} − q_{k−1})/2h.

    - `reading="centred_constraint"` (a reconstruction, not the paper's certain meaning):
      the centred difference only in the constraint; the momentum equations keep
      Dirac-1's forward difference w = (q_{k+1} − q_k)/h,

          p_{k+1} = ∂L/∂v(q_k, w),    p_{k+1} = p_k + h (∂L/∂q(q_k, w) + α(q_k)ᵀλ),
          α(q_k)·(q_{k+1} − q_{k−1}) = 0.

      For L = |v|²/2 − V(q) this is the symplectic-Euler-like p_{k+1} = p_k − h∇V(q_k) +
      hα(q_k)ᵀλ, q_{k+1} = q_k + h p_{k+1}, with the multiplier fixed by the centred
      constraint. It is Dirac-1 (`geomjax.dirac1`) on unconstrained problems. With
      `constraint="position"` the holonomic rows are φ(q_{k+1}) = 0 in both readings
      (only nonholonomic rows keep the centred difference).

    **Roots** (`dirac2_oscillator_roots`). On the oscillator L = v²/2 − ω²q²/2 (also the
    tangential part of a pendulum linearised at rest, ω² = g/ℓ), with a = h²ω², the
    literal reading's positions satisfy q_{k+1} − q_k − q_{k−1} + q_{k−2} = −2a q_k, with
    characteristic polynomial z³ + (2a − 1)z² − z + 1: two damped principal roots and a
    spurious root z = −1 − a/2 − a²/4 + O(a³), |z| > 1 for every h > 0 — a weakly unstable
    mode alternating in sign, growing by about 1 + h²ω²/2 per step. The centred-constraint
    reading's roots are those of z² − (2 − a)z + 1 (symplectic Euler: |z| = 1 for hω ≤ 2)
    and z = 0 (the carried q_{k−1} is not read). In both readings the constraint normal of
    the linearised pendulum follows δr_{k+1} = δr_{k−1} (roots ±1, on the unit circle).

    The step carries q_{k−1}; its `start` computes q_{−1} by a backward step of `starter`
    (default Dirac-1 in 16 substeps), so `geomjax.integrate(step, x0, ...)` takes
    (q₀, p₀) and saves (q, p). The equations are affine in (q_{k+1}, λ) for L quadratic in
    v and holonomic constraints (one linear solve), else solved by Newton's method
    (`RESULTS.newton_failed` on failure). Both readings keep φ far better than Dirac-1
    (their constraint is centred); both trajectories are first order (see
    `geomjax._step.dirac`). On the Ziegler column (the `ziegler-column` experiment) the
    literal reading's upper rod turns over, the centred-constraint reading's does not.

    Example (the literal reading's spurious root on the oscillator, hω = 0.5: the
    sign-alternating mode the starter excites dominates after 200 steps, and the ratio
    of successive positions is the root; the other reading stays bounded):

    ```python
    >>> import geomjax, jax.numpy as jnp, numpy as np
    >>> from geomjax._step.dirac import dirac2_oscillator_roots
    >>> L = lambda q, v: 0.5 * v @ v - 0.5 * q @ q            # ω = 1
    >>> h, x0 = 0.5, jnp.array([1.0, 0.0])
    >>> run = lambda reading: geomjax.integrate(geomjax.dirac2(L, reading=reading), x0, dt=h, steps=200, drift_tol=None).xs[:, 0]
    >>> q = run("literal")
    >>> round(float(q[-1] / q[-2]), 9)                       # measured root
    -1.142138769
    >>> spurious = min(dirac2_oscillator_roots(h, "literal"), key=lambda z: z.real)
    >>> round(float(spurious.real), 9), -1 - h**2 / 2 - h**4 / 4   # the root, its expansion
    (-1.142138769, -1.140625)
    >>> float(jnp.max(jnp.abs(run("centred_constraint")))) < 1.2
    True
    >>> bool(max(abs(dirac2_oscillator_roots(h, "centred_constraint"))) <= 1 + 1e-12)
    True

    ```

    A pendulum in Cartesian coordinates (the literal reading keeps the constraint far
    better than Dirac-1):

    ```python
    >>> L = lambda q, v: 0.5 * v @ v - 9.81 * q[1]
    >>> phi = lambda q: jnp.array([q @ q - 1.0])
    >>> x0 = jnp.array([jnp.sin(0.5), -jnp.cos(0.5), 0.0, 0.0])
    >>> run = lambda step: geomjax.integrate(step, x0, dt=1e-2, steps=2000, drift_tol=None).xs[-1, :2]
    >>> drift = lambda q: float(abs(q @ q - 1.0))
    >>> drift(run(geomjax.dirac2(L, holonomic=phi))) < drift(run(geomjax.dirac1(L, holonomic=phi))) / 10
    True

    ```
    """
    if reading not in _READINGS:
        raise ValueError(f"reading must be one of {_READINGS} (see geomjax.dirac2's docstring), got {reading!r}")
    literal = reading == "literal"
    return dirac(
        lagrangian,
        holonomic,
        nonholonomic,
        velocity=centred_difference if literal else forward_difference,
        history=1,
        constraint=constraint,
        starter=starter,
        newton=newton,
        constraint_velocity=None if literal else centred_difference,
    )


def dirac2_oscillator_roots(h_omega, reading: str = "literal"):
    """The characteristic roots of `geomjax.dirac2` on the oscillator L = v²/2 − ω²q²/2.

    With a = (hω)²: `"literal"` — the roots of z³ + (2a − 1)z² − z + 1 (from q_{k+1} −
    q_k − q_{k−1} + q_{k−2} = −2a q_k): a spurious root z = −1 − a/2 − a²/4 + O(a³),
    outside the unit circle for every hω > 0, and two principal roots of modulus < 1;
    `"centred_constraint"` — the roots of z(z² − (2 − a)z + 1): symplectic Euler's
    e^{±iθ}, cos θ = 1 − a/2 (on the unit circle for hω ≤ 2), and 0. These are the
    eigenvalues of the step's map on (q_k, p_k, q_{k−1}) (checked against its Jacobian in
    `tests/test_dirac2_readings.py`). Returns a NumPy array of 3 complex roots.

    ```python
    >>> import numpy as np
    >>> from geomjax._step.dirac import dirac2_oscillator_roots
    >>> for hw in (0.1, 0.5, 1.0):
    ...     z = dirac2_oscillator_roots(hw, "literal")
    ...     print(hw, round(float(max(abs(z))), 6), round(1 + hw**2 / 2, 6))
    0.1 1.005025 1.005
    0.5 1.142139 1.125
    1.0 1.839287 1.5
    >>> float(max(abs(dirac2_oscillator_roots(1.0, "centred_constraint"))))
    1.0

    ```
    """
    import numpy as np

    if reading not in _READINGS:
        raise ValueError(f"reading must be one of {_READINGS}, got {reading!r}")
    a = float(h_omega) ** 2
    if reading == "literal":
        return np.roots([1.0, 2.0 * a - 1.0, -1.0, 1.0]).astype(complex)
    return np.roots([1.0, a - 2.0, 1.0, 0.0]).astype(complex)
