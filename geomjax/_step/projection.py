"""Projection methods: any step followed by a Newton projection back onto the constraint set."""

import equinox as eqx
import jax
import jax.numpy as jnp

from .._solve.newton import Newton, as_newton
from .rattle import _Mechanics
from .splitting import _same_layout
from .._status import where_first
from .base import AbstractStep, newton_status
from .._monitored import AbstractSystemMonitored
from .._system.system import ConstrainedSystem, HolonomicSystem, NonholonomicSystem, System
from .._validate import as_state, check


class Projected(AbstractSystemMonitored, AbstractStep):
    """A step followed by projection onto S; see `geomjax.project`."""

    step: AbstractStep
    system: System
    level: jax.Array | None
    newton: Newton = Newton()

    def split(self, x):
        return self.step.split(x)

    def merge(self, z):
        return self.step.merge(z)

    @property
    def dim(self):
        return self.step.dim if self.step.dim is not None else self.system.dim

    def check(self, x0) -> None:
        self.step.check(x0)

    def at_start(self, z0):
        return eqx.tree_at(lambda s: s.step, self, self.step.at_start(z0))

    def _solve(self, fn, guess):
        return self.newton.solve(fn, guess)

    def _project_holonomic(self, q, p):
        return holonomic_projection(self.system, self.newton, q, p)

    def _project_general(self, z):
        s = self.system.structure
        f = lambda w: s.evaluate(self.system.constraint_functions, w)  # noqa: E731

        def moved(nu):
            # Df(z)ᵀν by a reverse pass inside the residual (its sparsity can then be read)
            return jax.tree_util.tree_map(jnp.add, z, jax.vjp(f, z)[1](nu)[0])

        res = self._solve(lambda nu: f(moved(nu)) - self.level, jnp.zeros_like(self.level))
        return moved(res.value), res.converged

    def advance(self, t, z, h, args):
        z1, status = self.step.advance(t, z, h, args)
        s = self.system.structure
        # Unused when the layouts agree: XLA drops the merge and split then.
        converted = s.split(self.step.merge(z1))
        own_layout = _same_layout(z1, converted)
        w = z1 if own_layout else converted
        if isinstance(self.system, HolonomicSystem):
            w, ok = self._project_holonomic(*w)
        else:
            w, ok = self._project_general(w)
        z2 = w if own_layout else self.step.split(s.merge(w))
        return z2, where_first(status, newton_status(ok))


def project(
    step: AbstractStep,
    system: System,
    *,
    level=None,
    newton: Newton | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    max_iter: int | None = None,
) -> Projected:
    """Any step followed by projection onto the constraint set (a comparison method).

    For a system with holonomic constraints g(q) = 0 (S = {g = 0, G ∂H/∂p = 0}), after
    the step x₁ = (q₁, p₁) = Φ_h(x) it projects in two Newton solves:

    q̃ = q₁ + M⁻¹G(q₁)ᵀν with g(q̃) = 0   (M⁻¹ = ∂²H/∂p², the kinetic metric),
    p̃ = p₁ + G(q̃)ᵀμ   with G(q̃)∂H/∂p(q̃, p̃) = 0,

    i.e. orthogonally in the kinetic metric onto the position constraint and then onto its
    hidden velocity constraint. For a general second-class set f (`System(constraints=f)`)
    it projects onto f = `level` along the gradients: x̃ = x₁ + Df(x₁)ᵀν, f(x̃) = level.

    The result keeps the constraints at round-off and the base method's order, but is in
    general neither symplectic nor symmetric (unlike RATTLE). A failed Newton solve gives
    the status `RESULTS.newton_failed`; the base step's own failures are reported first.

    **Arguments:**

    - `step`: any geomjax step (e.g. `geomjax.explicit_rk(geomjax.dirac_field(system), geomjax.RK4)`).
    - `system`: the `geomjax.System` whose constraint set to project onto.
    - `level`: for `constraints=f` systems, the values of f on S (e.g. `f(x0)`); not used
      with `holonomic=g` (S is g = 0).
    - `newton`: a `geomjax.Newton` for both solves (default `Newton()`, a loop).
    - `rtol`, `atol`, `max_iter`: the earlier keywords, mapped onto `newton`.

    **Returns:**

    A step usable with `geomjax.integrate`.

    Example:

    ```python
    model = geomjax.models.spherical_pendulum(holonomic=True)
    rk4 = geomjax.explicit_rk(geomjax.dirac_field(model.system), geomjax.RK4)
    sol = geomjax.integrate(geomjax.project(rk4, model.system), model.x0, dt=1e-2, steps=1000)
    ```
    """
    if not isinstance(step, AbstractStep):
        raise TypeError(f"project needs a geomjax step, got {type(step).__name__}")
    if not isinstance(system, System):
        raise TypeError(f"project needs a geomjax.System, got {type(system).__name__}")
    if isinstance(system, HolonomicSystem):
        if level is not None:
            raise ValueError("level is only for constraints=f systems; holonomic systems project onto g = 0")
    elif isinstance(system, ConstrainedSystem):
        if level is None:
            raise ValueError(
                "project needs level= for a System with constraints=f: the values of f on the "
                "constraint set, e.g. level=system.constraint_functions(x0)"
            )
        level = jnp.atleast_1d(jnp.asarray(level, dtype=jnp.float64))
    else:
        raise ValueError("project needs a constrained System (holonomic=g or constraints=f)")
    return Projected(step, system, level, as_newton(newton, rtol, atol, max_iter))


def holonomic_projection(system: System, newton: Newton, q, p):
    """((q̃, p̃), converged): q̃ = q + M⁻¹G(q)ᵀν with g(q̃) = 0, then p̃ = p + G(q̃)ᵀμ with
    G(q̃)∂H/∂p(q̃, p̃) = 0 (M⁻¹ = ∂²H/∂p², the kinetic metric), two Newton solves."""
    mech = _Mechanics(system)

    def position(nu):
        # q̃ = q + M⁻¹G(q)ᵀν, M⁻¹ = ∂²H/∂p² (the kinetic metric), by one jvp; Gᵀν by a
        # reverse pass inside the residual, so that its sparsity can be read.
        return q + jax.jvp(lambda pp: mech.dh_dp(q, pp), (p,), (mech.g_transpose(q, nu),))[1]

    k = mech.g(q).shape[0]
    zero = jnp.zeros((k,), q.dtype)
    res_q = newton.solve(lambda nu: mech.g(position(nu)), zero)
    q1 = position(res_q.value)

    def momentum(mu):
        return p + mech.g_transpose(q1, mu)

    res_p = newton.solve(lambda mu: mech.g_dot(q1, mech.dh_dp(q1, momentum(mu))), zero)
    return (q1, momentum(res_p.value)), res_q.converged & res_p.converged


def project_holonomic(system: System, x, *, newton: Newton | None = None):
    """Move the state x = (q, p) onto the constraint set S = {g = 0, G ∂H/∂p = 0} of a
    system with holonomic constraints g(q) = 0, orthogonally in the kinetic metric:

    q̃ = q + M⁻¹G(q)ᵀν with g(q̃) = 0,   then   p̃ = p + G(q̃)ᵀμ with G(q̃)∂H/∂p(q̃, p̃) = 0,

    M⁻¹ = ∂²H/∂p², by two Newton solves (`newton`: their settings). A solve that does not
    converge raises a ValueError where that is known now; under `jit` or `vmap` the result
    is then NaN, never an unprojected state passed off as projected.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spatial_chain(2)
    >>> x_on = geomjax.project_holonomic(model.system, model.x0 + 0.01)
    >>> bool(abs(model.system.constraint_residuals(x_on)).max() < 1e-12)
    True

    ```
    """
    if not isinstance(system, HolonomicSystem):
        remedy = ""
        if isinstance(system, NonholonomicSystem):
            remedy = " (for nonholonomic constraints use geomjax.project_nonholonomic)"
        elif isinstance(system, ConstrainedSystem):
            remedy = (" (this System gives second-class constraints f by constraints=; give holonomic=g instead, "
                      "or project after each step with geomjax.project(step, system))")
        raise TypeError(f"project_holonomic needs a geomjax.System with holonomic=g, got {type(system).__name__}{remedy}")
    x = as_state(x, system.dim)
    n = x.shape[0] // 2
    (q1, p1), converged = holonomic_projection(system, as_newton(newton), x[:n], x[n:])
    check(~converged, lambda xp, bad: bad, "project_holonomic: a Newton solve of the projection did not converge "
          "(the state is too far from the constraint set, or the constraints are singular there)")
    return jnp.where(converged, jnp.concatenate([q1, p1]), jnp.nan)
