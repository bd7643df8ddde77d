"""The forced Lagrange–d'Alembert equations of a `geomjax.LagrangianSystem` as a first-order ODE."""

import jax
import jax.numpy as jnp

from .._solve.linalg import small_solve
from .._system.lagrangian import LagrangianSystem
from ..internal.simplify import scalar_graph
from .._validate import trace_user_function
from .base import AbstractField


class LagrangeDAlembertField(AbstractField):
    """ẋ on x = (q, v) for a `geomjax.LagrangianSystem`; built by `geomjax.lagrange_dalembert_field`.

    Pieces are (q, v). Monitored: the constraint residuals Φ(q, v) (none without
    constraints).
    """

    system: LagrangianSystem

    @property
    def dim(self):
        return 2 * self.system.n

    def split(self, x):
        n = self.system.n
        return x[:n], x[n:]

    def merge(self, z):
        return jnp.concatenate(z)

    def accelerations(self, q, v, t=0.0):
        """(v̇, λ): the acceleration and the multipliers (shape `(k,)`, empty without
        constraints) of the forced Lagrange–d'Alembert equations at (q, v, t)."""
        system = self.system
        grad_v = jax.grad(system.lagrangian, argnums=1)
        w = jax.jacfwd(grad_v, argnums=1)(q, v)
        # d/dt ∂L/∂v = W v̇ + (∂/∂q ∂L/∂v)·v, so W v̇ = b + αᵀλ with
        b = jax.grad(system.lagrangian, argnums=0)(q, v) - jax.jvp(lambda qq: grad_v(qq, v), (q,), (v,))[1]
        if system.force is not None:
            b = b + system.force(q, v, jnp.asarray(t, q.dtype))
        constraint = system.nonholonomic
        if constraint is None:
            return small_solve(w, b), jnp.zeros((0,), q.dtype)
        forms = constraint.forms(q)
        # dΦ/dt = ∂Φ/∂q·v + α(q)·v̇ = 0 (Φ affine in v: ∂Φ/∂v = α(q)); eliminate v̇:
        # (α W⁻¹ αᵀ) λ = −∂Φ/∂q·v − α W⁻¹ b
        drift = jax.jvp(lambda qq: constraint(qq, v), (q,), (v,))[1]
        solved = small_solve(w, jnp.concatenate([b[:, None], forms.T], axis=1))
        w_b, w_forms = solved[:, 0], solved[:, 1:]
        lam = small_solve(forms @ w_forms, -drift - forms @ w_b)
        return w_b + w_forms @ lam, lam

    def rhs(self, t, z, args):
        del args

        def field(zz, tt):
            q, v = zz
            return v, self.accelerations(q, v, tt)[0]

        return scalar_graph(field, z, jnp.asarray(t, z[0].dtype), enabled=self.simplify)

    def constraint_residuals(self, x):
        q, v = self.split(x)
        if self.system.nonholonomic is None:
            return jnp.zeros((0,), x.dtype)
        return self.system.nonholonomic(q, v)

    def project(self, x):
        """The state with its velocity projected onto Φ(q, ·) = 0 in the kinetic metric:
        v⁺ = v − W⁻¹αᵀ(αW⁻¹αᵀ)⁻¹Φ(q, v), W = ∂²L/∂v² (the velocity just after an
        impulsive constraint reaction, which is normal to the constraint in that metric)."""
        q, v = self.split(x)
        constraint = self.system.nonholonomic
        if constraint is None:
            return x
        w = jax.jacfwd(jax.grad(self.system.lagrangian, argnums=1), argnums=1)(q, v)
        forms = constraint.forms(q)
        w_forms = small_solve(w, forms.T)
        return self.merge((q, v - w_forms @ small_solve(forms @ w_forms, constraint(q, v))))

    def check(self, x0) -> None:
        if x0.shape[0] != self.dim:
            raise ValueError(f"x0 has length {x0.shape[0]}, but the system's state (q, v) has length {self.dim}")
        trace_user_function(self, x0, "the lagrangian, the force or the constraint")


def lagrange_dalembert_field(system: LagrangianSystem) -> LagrangeDAlembertField:
    """The forced Lagrange–d'Alembert equations of a Lagrangian system, as an ODE on (q, v).

    For L(q, v) with the external force F(q, v, t) and constraints Φ(q, v) = α(q)v + β(q)
    = 0 (affine in v), everything by autodiff:

        q̇ = v,    W v̇ = ∂L/∂q − (∂/∂q ∂L/∂v)·v + F + α(q)ᵀλ,    W = ∂²L/∂v²,

    with the multipliers λ from differentiating the constraint along the flow,
    dΦ/dt = ∂Φ/∂q·v + α v̇ = 0: (α W⁻¹ αᵀ) λ = −∂Φ/∂q·v − α W⁻¹ b. The constraint is a
    first integral of this field (its level Φ = 0 is kept by the exact flow): start on it
    (`field.project(x)` moves the velocity there) and integrate with any method, e.g. a
    high-order reference for the discrete integrators `geomjax.forced_dla` and
    `geomjax.herglotz` (Herglotz' equations of L − αz are these with F = −α ∂L/∂v).

    **Arguments:**

    - `system`: a `geomjax.LagrangianSystem` (its force and nonholonomic constraints are
      used; holonomic constraints are not supported here).

    **Returns:**

    A `LagrangeDAlembertField` on flat states x = (q, v) of length 2n, for
    `geomjax.integrate(field, x0, method=...)`.

    Example (a damped particle on a turning line, the damped Foucault pendulum):

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> model = geomjax.models.damped_foucault(alpha=1e-3)
    >>> field = geomjax.lagrange_dalembert_field(model.forced)
    >>> x0 = field.project(jnp.concatenate([model.q0, model.v0]))
    >>> sol = geomjax.integrate(field, x0, dt=0.05, steps=2000, method="rk4")
    >>> q, v = model.exact(100.0)
    >>> bool(jnp.max(jnp.abs(sol.xs[-1] - jnp.concatenate([q, v]))) < 1e-7)   # RK4 error 1.4e-8
    True

    ```
    """
    if not isinstance(system, LagrangianSystem):
        raise TypeError(f"lagrange_dalembert_field needs a geomjax.LagrangianSystem, got {type(system).__name__}")
    if system.holonomic is not None:
        raise ValueError(
            "lagrange_dalembert_field does not take holonomic constraints; use "
            "geomjax.dirac_field(system.to_hamiltonian()) or geomjax.rattle"
        )
    return LagrangeDAlembertField(system)
