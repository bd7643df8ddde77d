"""Implicit Lagrangian systems (L, Δ_Q): the data of the Dirac integrators.

Yoshimura–Marsden's implicit Lagrangian system of a Lagrangian L(q, v) on TRⁿ with a
constraint distribution Δ_Q = ker α(q) (Salnikov and Hamdouni (2019) eqs. (4), (6); Hamdouni and Salnikov (2021) eqs. (3)–(5)) is
the differential–algebraic system in (q, v, p, λ)

    q̇ = v,    ṗ = ∂L/∂q(q, v) + α(q)ᵀλ,    p = ∂L/∂v(q, v),    α(q)·v (+ β(q)) = 0,

with the constraint one-forms α(q) (k × n) given either

- by holonomic constraints φ(q) = 0 (shape `(k,)`): α = Dφ by autodiff (the paper's
  ψ = dφ; φ itself is what a run is checked against), or
- directly, as nonholonomic constraints: a callable `alpha(q)` or a
  `geomjax.VelocityConstraint(phi)` (Φ(q, v) = α(q)·v + β(q), affine in v),

or both (holonomic rows first). Nothing is written by hand: ∂L/∂q, ∂L/∂v, α and the
Legendre inverse v(q, p) come from autodiff of the user's functions. The flat state of
a run is x = (q, p); v and λ are not carried (v(q, p) is the Legendre inverse).
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

from .._solve.linalg import small_solve
from .._solve.newton import Newton
from .._validate import _TRACE_ERRORS, require_invertible, trace_user_function, untraceable_message
from .lagrangian import LagrangianSystem
from .legendre import REGULAR_HINT, hessian_dependence, solve_gradient, velocity_hessian
from .velocity_constraints import AbstractVelocityConstraint, as_velocity_constraint

_QUADRATIC: dict = {}
_QUADRATIC_MAX = 256


def _is_quadratic(lagrangian, n: int) -> bool:
    """Whether L is quadratic in v, read off the jaxpr once per (L, n) (sound)."""
    zeros = jnp.zeros((n,))
    try:
        key = (lagrangian, n)
        cached = _QUADRATIC.get(key)
    except TypeError:  # an unhashable callable (a module holding traced parameters)
        return not hessian_dependence(lambda q, v: lagrangian(q, v), zeros, zeros)[0]
    if cached is None:
        if len(_QUADRATIC) >= _QUADRATIC_MAX:  # bounded: user code may make new closures freely
            _QUADRATIC.clear()
        cached = _QUADRATIC[key] = not hessian_dependence(lambda q, v: lagrangian(q, v), zeros, zeros)[0]
    return cached


class ImplicitLagrangian(eqx.Module):
    """(L, Δ_Q) with Δ_Q = ker α(q): a Lagrangian and its constraint one-forms.

    Built by `as_implicit_lagrangian`; the Dirac steps (`geomjax.dirac1`, `geomjax.dirac2`,
    `geomjax.dirac_rk`) keep one as `step.system`. Flat states are x = (q, p) of length 2n.

    Example (the pendulum in Cartesian coordinates: α = Dφ = 2qᵀ, residuals φ and α·v):

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> step = geomjax.dirac1(lambda q, v: 0.5 * v @ v - 9.81 * q[1],
    ...                       holonomic=lambda q: jnp.array([q @ q - 1.0]))
    >>> system = step.system
    >>> system.forms(jnp.array([0.6, -0.8]))
    Array([[ 1.2, -1.6]], dtype=float64)
    >>> system.constraint_residuals(jnp.array([0.6, -0.8, 0.8, 0.6]))
    Array([0., 0.], dtype=float64)

    ```
    """

    lagrangian: Callable
    holonomic: Callable | None
    nonholonomic: AbstractVelocityConstraint | None
    newton: Newton
    n: int | None = eqx.field(static=True, default=None)

    # --- the functions of the implicit system --------------------------------------
    def derivatives(self, q, v):
        """(∂L/∂q, ∂L/∂v) at (q, v)."""
        return jax.grad(self.lagrangian, argnums=(0, 1))(q, v)

    def momentum(self, q, v):
        """p = ∂L/∂v(q, v)."""
        return jax.grad(self.lagrangian, argnums=1)(q, v)

    def velocity(self, q, p):
        """v(q, p) with ∂L/∂v(q, v) = p: one linear solve when L is quadratic in v, else
        Newton (NaN if it fails)."""
        quadratic = _is_quadratic(self.lagrangian, q.shape[0])
        return solve_gradient(self.lagrangian, q, p, quadratic=quadratic, newton=self.newton)

    def position_constraints(self, q):
        """φ(q), shape `(k_h,)` (empty without holonomic constraints)."""
        if self.holonomic is None:
            return jnp.zeros((0,), q.dtype)
        return jnp.atleast_1d(self.holonomic(q))

    def constraint(self, q, v):
        """The velocity constraints at (q, v): Dφ(q)·v and Φ(q, v) = α(q)·v + β(q), shape `(k,)`."""
        parts = []
        if self.holonomic is not None:
            parts.append(jax.jvp(self.position_constraints, (q,), (v,))[1])
        if self.nonholonomic is not None:
            parts.append(self.nonholonomic(q, v))
        if not parts:
            return jnp.zeros((0,), q.dtype)
        return jnp.concatenate(parts)

    def forms(self, q):
        """The constraint one-forms α(q) = ∂(constraint)/∂v, shape `(k, n)`."""
        return jax.jacfwd(self.constraint, argnums=1)(q, jnp.zeros_like(q))

    @property
    def constrained(self) -> bool:
        return self.holonomic is not None or self.nonholonomic is not None

    @property
    def conservative(self) -> bool:
        """Whether the energy E = v·∂L/∂v − L is a first integral (no affine part β(q))."""
        return self.nonholonomic is None or self.nonholonomic.linear

    def energy(self, q, v):
        """E(q, v) = v·∂L/∂v − L."""
        return self.momentum(q, v) @ v - self.lagrangian(q, v)

    # --- flat states (q, p) and what a run monitors ----------------------------------
    def split(self, x):
        n = x.shape[0] // 2
        return x[:n], x[n:]

    def merge(self, z):
        return jnp.concatenate([z[0], z[1]])

    def constraint_residuals(self, x):
        """φ(q) and the velocity constraints α(q)·v(q, p) (+ β) at x = (q, p)."""
        q, p = self.split(jnp.asarray(x))
        return jnp.concatenate([self.position_constraints(q), self.constraint(q, self.velocity(q, p))])

    def invariants(self, x):
        """The energy E(q, v(q, p)) when it is conserved (else nothing)."""
        q, p = self.split(jnp.asarray(x))
        if not self.conservative:
            return jnp.zeros((0,), q.dtype)
        return jnp.atleast_1d(self.energy(q, self.velocity(q, p)))

    def check(self, x0, who: str) -> None:
        """Clear errors for a state that cannot start a run of `who` (a concrete x0)."""
        if x0.ndim != 1 or x0.shape[0] % 2:
            raise ValueError(f"{who} works on flat states x = (q, p) of even length 2n, got shape {tuple(x0.shape)}")
        n = x0.shape[0] // 2
        if self.n is not None and n != self.n:
            raise ValueError(f"x0 has length {x0.shape[0]}, but the system has n = {self.n} (length {2 * self.n})")
        spec = jax.ShapeDtypeStruct((n,), x0.dtype)
        out = trace_user_function(lambda a: self.lagrangian(*a), (spec, spec), "the lagrangian L(q, v)")
        if getattr(out, "shape", None) != ():
            raise ValueError(f"the lagrangian must return a scalar L(q, v), got shape {getattr(out, 'shape', None)}")
        if self.holonomic is not None:
            out = trace_user_function(self.position_constraints, spec, "the holonomic constraint φ(q)")
            if out.ndim != 1:
                raise ValueError(f"holonomic must return φ(q) of shape (k,), got shape {out.shape}")
        q, p = self.split(x0)
        if self.nonholonomic is not None:
            self.nonholonomic.check(q)
        try:
            w, schur = _start_matrices(self, q, p)
        except _TRACE_ERRORS as err:
            raise TypeError(untraceable_message("the lagrangian L(q, v)", err)) from err
        require_invertible(w, "the velocity Hessian ∂²L/∂v²", REGULAR_HINT)
        if self.constrained:
            require_invertible(
                schur,
                "the constraint matrix α W⁻¹ αᵀ (α the constraint one-forms, W = ∂²L/∂v²)",
                "the constraint one-forms (Dφ and α) are linearly dependent there, or vanish: "
                "remove redundant constraints",
            )


@eqx.filter_jit
def _start_matrices(system: ImplicitLagrangian, q, p):
    """W = ∂²L/∂v² at (q, v(q, p)) and α W⁻¹ αᵀ, in one compiled call (evaluated op by op,
    the checks of a Ziegler column spent most of their time compiling single operations)."""
    v = system.velocity(q, p)
    w = velocity_hessian(system.lagrangian, q, v)
    if not system.constrained:
        return w, None
    forms = system.forms(q)
    return w, forms @ small_solve(w, forms.T)


def as_implicit_lagrangian(lagrangian, holonomic=None, nonholonomic=None, newton: Newton | None = None) -> ImplicitLagrangian:
    """An `ImplicitLagrangian` from `lagrangian(q, v)` (or a `geomjax.LagrangianSystem`,
    whose constraints are used) and the constraints."""
    n = None
    if isinstance(lagrangian, LagrangianSystem):
        if lagrangian.force is not None:
            raise ValueError(
                "the Dirac integrators take conservative implicit Lagrangian systems; this "
                "LagrangianSystem has an external force (use geomjax.forced_dla)"
            )
        if holonomic is not None and lagrangian.holonomic is not None:
            raise ValueError("the system already has holonomic constraints; do not pass holonomic= too")
        if nonholonomic is not None and lagrangian.nonholonomic is not None:
            raise ValueError("the system already has nonholonomic constraints; do not pass nonholonomic= too")
        holonomic = lagrangian.holonomic if holonomic is None else holonomic
        nonholonomic = lagrangian.nonholonomic if nonholonomic is None else nonholonomic
        newton = lagrangian.newton if newton is None else newton
        n = lagrangian.n
        lagrangian = lagrangian.lagrangian
    elif not callable(lagrangian):
        raise TypeError(f"lagrangian must be a callable (q, v) ↦ L or a geomjax.LagrangianSystem, got {type(lagrangian).__name__}")
    if holonomic is not None and not callable(holonomic):
        raise TypeError(f"holonomic must be a callable q ↦ φ(q) (shape (k,)), got {type(holonomic).__name__}")
    if newton is not None and not isinstance(newton, Newton):
        raise TypeError(f"newton must be a geomjax.Newton, got {type(newton).__name__}")
    return ImplicitLagrangian(lagrangian, holonomic, as_velocity_constraint(nonholonomic), Newton() if newton is None else newton, n)
