"""Contact (Herglotz) systems: Lagrangians L(q, v, z) and Hamiltonians H(q, p, s).

Herglotz' principle: among curves q(t) with fixed ends, the motion makes the action z(T)
stationary, where ż = L(q, q̇, z). Its equations are

    d/dt ∂L/∂v − ∂L/∂q = ∂L/∂v · ∂L/∂z,     ż = L,

and under the Legendre transform p = ∂L/∂v, H(q, p, s) = p·v − L(q, v, s) (s = z), they are
the contact Hamiltonian equations on (q, p, s) ∈ R²ⁿ⁺¹ with contact form η = ds − p·dq:

    q̇ = ∂H/∂p,   ṗ = −∂H/∂q − p ∂H/∂s,   ṡ = p·∂H/∂p − H.

Along them dH/dt = −H ∂H/∂s: for H = |p|²/2 + V(q) + αs the energy decays as e^{−αt}, and
the flow is conformally contact, φ*η = ρ η with ρ = exp(−∫∂H/∂s dt).

These types stand beside the Hamiltonian `geomjax.System` types (a contact manifold is not
a Poisson manifold); `geomjax.contact_field` derives the vector field and
`geomjax.herglotz` the variational integrators.
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

from .._solve.newton import Newton
from .lagrangian import check_dimension, check_scalar_function, decide_quadratic
from .legendre import probe_point, solve_gradient
from .velocity_constraints import AbstractVelocityConstraint, as_velocity_constraint


def split_contact(x, n: int):
    """Flat (q, p, s), shape (2n + 1,) → pieces (q, p, s) with s a scalar."""
    return x[:n], x[n : 2 * n], x[2 * n]


def merge_contact(z):
    q, p, s = z
    return jnp.concatenate([q, p, jnp.reshape(s, (1,))])


class ContactHamiltonianSystem(eqx.Module):
    """A contact Hamiltonian system H(q, p, s) on R²ⁿ⁺¹ with contact form η = ds − p·dq.

    The contact vector field, derived by autodiff (`geomjax.contact_field`):

        q̇ = ∂H/∂p,   ṗ = −∂H/∂q − p ∂H/∂s,   ṡ = p·∂H/∂p − H,

    along which dH/dt = −H ∂H/∂s (conformal decay, not conservation). Flat states are
    x = (q, p, s) of length 2n + 1.

    **Arguments:**

    - `hamiltonian`: `(q, p, s) ↦ H`, a scalar (q, p of shape `(n,)`, s a scalar); with
      `time_dependent=True`, `(q, p, s, t) ↦ H` (e.g. H = p²/2 + f(t)s + V(q, t)).
    - `n`: the number of degrees of freedom.

    Example (the damped oscillator H = p²/2 + q²/2 + αs: energy decays as e^{−αt}):

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> alpha = 0.1
    >>> system = geomjax.ContactHamiltonianSystem(
    ...     lambda q, p, s: 0.5 * p @ p + 0.5 * q @ q + alpha * s, 1)
    >>> x0 = jnp.array([1.0, 0.0, 0.0])
    >>> sol = geomjax.integrate(geomjax.contact_field(system), x0, dt=0.01, steps=500, method="rk4")
    >>> h = jax.vmap(system.energy)(sol.xs)
    >>> bool(jnp.allclose(h, h[0] * jnp.exp(-alpha * sol.ts), rtol=1e-9))
    True

    ```
    """

    hamiltonian: Callable
    n: int = eqx.field(static=True)
    time_dependent: bool = eqx.field(static=True)

    def __init__(self, hamiltonian: Callable, n: int, *, time_dependent: bool = False):
        n = check_dimension(n)
        spec = jax.ShapeDtypeStruct((n,), jnp.float64)
        scalar = jax.ShapeDtypeStruct((), jnp.float64)
        if time_dependent:
            check_scalar_function(hamiltonian, (spec, spec, scalar, scalar), "the contact hamiltonian", "H(q, p, s, t)")
        else:
            check_scalar_function(hamiltonian, (spec, spec, scalar), "the contact hamiltonian", "H(q, p, s)")
        self.hamiltonian = hamiltonian
        self.n = n
        self.time_dependent = bool(time_dependent)

    @property
    def dim(self) -> int:
        return 2 * self.n + 1

    def value(self, q, p, s, t=0.0):
        """H(q, p, s) (at time t for a time-dependent H)."""
        if self.time_dependent:
            return self.hamiltonian(q, p, s, t)
        return self.hamiltonian(q, p, s)

    def energy(self, x, t=0.0):
        """H at the flat state x = (q, p, s)."""
        return self.value(*split_contact(x, self.n), t)

    def vector_field(self, q, p, s, t=0.0):
        """(q̇, ṗ, ṡ) = (∂H/∂p, −∂H/∂q − p ∂H/∂s, p·∂H/∂p − H)."""
        h, (h_q, h_p, h_s) = jax.value_and_grad(self.value, argnums=(0, 1, 2))(q, p, s, t)
        return h_p, -h_q - p * h_s, p @ h_p - h

    def split(self, x):
        return split_contact(x, self.n)

    def merge(self, z):
        return merge_contact(z)


class ContactLagrangianSystem(eqx.Module):
    """A contact (Herglotz) Lagrangian system L(q, v, z) on TRⁿ × R.

    The motion satisfies Herglotz' equations d/dt ∂L/∂v − ∂L/∂q = ∂L/∂v ∂L/∂z with ż = L,
    and, with nonholonomic constraints, the variations are restricted to ker α(q)
    (de León, Jiménez, Lainz; Maciel, Ortiz and Schaerer (2020) §2.2). `geomjax.herglotz(system)` integrates it with
    the discrete Herglotz (contact variational) integrators; `to_hamiltonian()` gives the
    contact Hamiltonian H(q, p, s) = p·v − L(q, v, s) with p = ∂L/∂v solved for v by
    autodiff (one linear solve when L is quadratic in v, Newton otherwise).

    **Arguments:**

    - `lagrangian`: `(q, v, z) ↦ L`, a scalar (q, v of shape `(n,)`, z a scalar).
    - `n`: the number of degrees of freedom.
    - `nonholonomic`: optional constraints: `alpha(q)` of shape `(k, n)` or a
      `geomjax.VelocityConstraint(phi)`.
    - `quadratic`, `newton`: as for `geomjax.LagrangianSystem`.

    A singular Hessian ∂²L/∂v² raises a `ValueError`.

    Example (the damped oscillator of Maciel, Ortiz and Schaerer (2020) eq. (9), m = 1):

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> L = lambda q, v, z: 0.5 * v @ v - 0.5 * q @ q - 0.1 * z
    >>> system = geomjax.ContactLagrangianSystem(L, 1)
    >>> H = system.to_hamiltonian()
    >>> float(H.value(jnp.array([1.0]), jnp.array([2.0]), 3.0))   # p²/2 + q²/2 + αs
    2.8

    ```
    """

    lagrangian: Callable
    n: int = eqx.field(static=True)
    nonholonomic: AbstractVelocityConstraint | None
    quadratic: bool = eqx.field(static=True)
    newton: Newton

    def __init__(
        self,
        lagrangian: Callable,
        n: int,
        *,
        nonholonomic=None,
        quadratic: bool | None = None,
        newton: Newton | None = None,
    ):
        n = check_dimension(n)
        spec = jax.ShapeDtypeStruct((n,), jnp.float64)
        scalar = jax.ShapeDtypeStruct((), jnp.float64)
        check_scalar_function(lagrangian, (spec, spec, scalar), "the lagrangian", "L(q, v, z)")
        nonholonomic = as_velocity_constraint(nonholonomic)
        if nonholonomic is not None:
            nonholonomic.check(probe_point((), n)[1])
        if newton is not None and not isinstance(newton, Newton):
            raise TypeError(f"newton must be a geomjax.Newton, got {type(newton).__name__}")
        self.lagrangian = lagrangian
        self.n = n
        self.nonholonomic = nonholonomic
        self.newton = Newton() if newton is None else newton
        self.quadratic = decide_quadratic(
            lambda qz, v: lagrangian(qz[0], v, qz[1]),
            (jnp.zeros((n,)), jnp.zeros(())),
            n,
            quadratic,
            "the velocity Hessian ∂²L/∂v²",
        )

    def momentum(self, q, v, z):
        """p = ∂L/∂v(q, v, z)."""
        return jax.grad(self.lagrangian, argnums=1)(q, v, z)

    def velocity(self, q, p, z):
        """v with ∂L/∂v(q, v, z) = p (NaN where the Newton solve of a non-quadratic L fails)."""
        return solve_gradient(
            lambda qz, v: self.lagrangian(qz[0], v, qz[1]), (q, z), p, quadratic=self.quadratic, newton=self.newton
        )

    def energy(self, q, v, z):
        """E = v·∂L/∂v − L (the contact Hamiltonian at p = ∂L/∂v, s = z)."""
        return self.momentum(q, v, z) @ v - self.lagrangian(q, v, z)

    def to_hamiltonian(self) -> ContactHamiltonianSystem:
        """The contact Hamiltonian system H(q, p, s) = p·v − L(q, v, s), v = v(q, p, s)."""
        if self.nonholonomic is not None:
            raise ValueError(
                "the contact Hamiltonian of a nonholonomic contact Lagrangian is not built "
                "here; integrate it with geomjax.herglotz(system), which imposes the constraints"
            )

        def hamiltonian(q, p, s):
            v = self.velocity(q, p, s)
            return p @ v - self.lagrangian(q, v, s)

        return ContactHamiltonianSystem(hamiltonian, self.n)


def check_flat_contact_state(x0, n: int | None, what: str) -> int:
    """The n of a flat contact state (q, p, z) of length 2n + 1 (checked against `n`)."""
    size = x0.shape[0]
    if size < 3 or size % 2 == 0:
        raise ValueError(
            f"{what} works on flat states x = (q, p, z) of length 2n + 1 (q, p of length n, z "
            f"the action), got length {size}"
        )
    m = (size - 1) // 2
    if n is not None and m != n:
        raise ValueError(f"x0 has length {size}, but the system has n = {n} (length {2 * n + 1})")
    return m

