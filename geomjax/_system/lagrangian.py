"""Lagrangian systems L(q, v), with external forces and nonholonomic constraints.

A `LagrangianSystem` is the Lagrangian side of a mechanical system on TRⁿ. It is not one
of the Hamiltonian `geomjax.System` types (those are built from H on a Poisson manifold);
`to_hamiltonian()` gives that system, by the Legendre transform derived by autodiff, so
every Hamiltonian field and step (Dirac and feedback fields, RATTLE, Gauss, the
nonholonomic extension and `geomjax.dla`) applies to a system written as a Lagrangian,
and `LagrangianSystem.from_hamiltonian` goes the other way. The discrete variational
steps (`geomjax.forced_dla`) use L directly.
"""

from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp

from .._solve.newton import Newton
from .._validate import _TRACE_ERRORS, trace_user_function
from .legendre import check_regular, hessian_dependence, probe_point, solve_gradient
from .structures import CanonicalStructure, canonical
from .system import ConstrainedSystem, System
from .velocity_constraints import AbstractVelocityConstraint, as_velocity_constraint


def check_dimension(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n (the number of degrees of freedom, the length of q) must be a positive integer, got {n!r}")
    return n


def check_scalar_function(fn, specs, what: str, call: str) -> None:
    """Trace `fn(*specs)` (shapes only) and require a scalar."""
    if not callable(fn):
        raise TypeError(f"{what} must be a callable {call}, got {type(fn).__name__}")
    try:
        out = trace_user_function(lambda a: fn(*a), tuple(specs), what)
    except TypeError as err:
        if isinstance(err.__cause__, _TRACE_ERRORS):
            raise
        raise TypeError(f"{what} could not be called as {call}: {err}") from err
    if getattr(out, "shape", None) != ():
        raise ValueError(f"{what} must return a scalar {call}, got shape {getattr(out, 'shape', type(out).__name__)}")


def decide_quadratic(f, a_like, n: int, quadratic, what: str) -> bool:
    """Whether f(a, v) is quadratic in v: the user's `quadratic` if given, else read off the
    jaxpr. A constant Hessian (independent of a too) is checked for singularity at once
    (exactly); otherwise at a generic probe point."""
    depends_v, depends_a = hessian_dependence(f, a_like, jnp.zeros((n,)))
    if quadratic is None:
        quadratic = not depends_v
    a, v = probe_point(a_like, n)
    if not depends_v and not depends_a:
        check_regular(f, a, v, what, "everywhere (it does not depend on the state)")
    else:
        check_regular(f, a, v, what, "at a generic probe point", probe=True)
    return bool(quadratic)


class LagrangianSystem(eqx.Module):
    """A mechanical system given by its Lagrangian L(q, v) on TRⁿ.

    The equations of motion are the forced Lagrange–d'Alembert equations

        d/dt ∂L/∂v − ∂L/∂q = F(q, v, t) + α(q)ᵀλ,   α(q)·v (+ β(q)) = 0,

    never written by hand: geomjax derives them by autodiff. The Legendre transform
    p = ∂L/∂v is solved for v by one linear solve when L is quadratic in v (decided from
    the jaxpr, see `geomjax._system.legendre`), by Newton's method otherwise; the
    Hamiltonian is H(q, p) = p·v − L(q, v).

    **Arguments:**

    - `lagrangian`: `(q, v) ↦ L(q, v)`, a scalar, with q and v of shape `(n,)`.
    - `n`: the number of degrees of freedom.
    - `force`: optional external force `(q, v, t) ↦ F(q, v, t)`, shape `(n,)` (damping,
      forcing).
    - `nonholonomic`: optional nonholonomic constraints: a callable `alpha(q)` of shape
      `(k, n)` (α(q)·v = 0) or a `geomjax.VelocityConstraint(phi)` (Φ(q, v) = 0, affine in v).
    - `holonomic`: optional position constraints `q ↦ g(q)`, shape `(k,)` (passed on to the
      Hamiltonian system by `to_hamiltonian`).
    - `quadratic`: `None` (default) to decide from the jaxpr whether L is quadratic in v;
      `True`/`False` to say so.
    - `newton`: the `geomjax.Newton` of the Legendre solve when L is not quadratic.

    A Hessian ∂²L/∂v² that is singular (at a generic probe point, or exactly when it is
    constant) raises a `ValueError`: such a Lagrangian has no Legendre transform.

    Example (a pendulum given by its Lagrangian, integrated through its Hamiltonian with Gauss):

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> pendulum = geomjax.LagrangianSystem(lambda q, v: 0.5 * v @ v + jnp.cos(q[0]), 1)
    >>> pendulum.quadratic
    True
    >>> system = pendulum.to_hamiltonian()
    >>> x0 = jnp.array([1.0, 0.0])
    >>> float(system.hamiltonian(x0)) == float(-jnp.cos(1.0))
    True
    >>> sol = geomjax.integrate(geomjax.hamiltonian_vector_field(system.hamiltonian, system.structure),
    ...                         x0, dt=0.01, steps=100, method="gauss4")
    >>> sol.message
    'success'

    ```
    """

    lagrangian: Callable
    n: int = eqx.field(static=True)
    force: Callable | None
    nonholonomic: AbstractVelocityConstraint | None
    holonomic: Callable | None
    quadratic: bool = eqx.field(static=True)
    newton: Newton

    def __init__(
        self,
        lagrangian: Callable,
        n: int,
        *,
        force: Callable | None = None,
        nonholonomic=None,
        holonomic: Callable | None = None,
        quadratic: bool | None = None,
        newton: Newton | None = None,
    ):
        n = check_dimension(n)
        spec = jax.ShapeDtypeStruct((n,), jnp.float64)
        check_scalar_function(lagrangian, (spec, spec), "the lagrangian", "L(q, v)")
        if force is not None:
            if not callable(force):
                raise TypeError(f"force must be a callable (q, v, t) ↦ F, got {type(force).__name__}")
            out = trace_user_function(lambda a: force(a[0], a[1], a[2]), (spec, spec, jax.ShapeDtypeStruct((), jnp.float64)), "force")
            if getattr(out, "shape", None) != (n,):
                raise ValueError(f"force must return F(q, v, t) of shape ({n},), got {getattr(out, 'shape', None)}")
        nonholonomic = as_velocity_constraint(nonholonomic)
        if nonholonomic is not None:
            nonholonomic.check(probe_point((), n)[1])
        if holonomic is not None and not callable(holonomic):
            raise TypeError(f"holonomic must be a callable q ↦ g(q), got {type(holonomic).__name__}")
        if newton is not None and not isinstance(newton, Newton):
            raise TypeError(f"newton must be a geomjax.Newton, got {type(newton).__name__}")
        self.lagrangian = lagrangian
        self.n = n
        self.force = force
        self.nonholonomic = nonholonomic
        self.holonomic = holonomic
        self.newton = Newton() if newton is None else newton
        self.quadratic = decide_quadratic(
            lambda q, v: lagrangian(q, v), jnp.zeros((n,)), n, quadratic, "the velocity Hessian ∂²L/∂v²"
        )

    def momentum(self, q, v):
        """p = ∂L/∂v(q, v)."""
        return jax.grad(self.lagrangian, argnums=1)(q, v)

    def velocity(self, q, p):
        """v with ∂L/∂v(q, v) = p (NaN where the Newton solve of a non-quadratic L fails)."""
        return solve_gradient(self.lagrangian, q, p, quadratic=self.quadratic, newton=self.newton)

    def energy(self, q, v):
        """E(q, v) = v·∂L/∂v − L (= H(q, ∂L/∂v))."""
        return self.momentum(q, v) @ v - self.lagrangian(q, v)

    def hamiltonian(self, x):
        """H(q, p) = p·v − L(q, v) with v = v(q, p), on the flat state x = (q, p)."""
        q, p = x[: self.n], x[self.n :]
        v = self.velocity(q, p)
        return p @ v - self.lagrangian(q, v)

    def to_hamiltonian(self, *, integrals: Callable | Sequence[Callable] | None = ()):
        """The Hamiltonian `geomjax.System` on T*Rⁿ (canonical structure) of this Lagrangian.

        Its type follows the constraints: `HamiltonianSystem`, `HolonomicSystem`
        (`holonomic=g`) or `NonholonomicSystem` (linear one-forms α(q); the constraint
        α(q)·v = 0 with v = ∂H/∂p is the same set). External forces and affine constraints
        have no Hamiltonian system type: they raise a `ValueError` (use
        `geomjax.forced_dla`, which takes both).
        """
        if self.force is not None:
            raise ValueError(
                "a LagrangianSystem with an external force has no Hamiltonian geomjax.System "
                "(Hamiltonian systems here are conservative): integrate it with "
                "geomjax.forced_dla(system), or drop force= for the conservative part"
            )
        kwargs = {"integrals": integrals}
        if self.holonomic is not None:
            kwargs["holonomic"] = self.holonomic
        if self.nonholonomic is not None:
            if not self.nonholonomic.linear:
                raise ValueError(
                    "geomjax.NonholonomicSystem takes linear constraints α(q)·v = 0; this "
                    "VelocityConstraint may have an affine part β(q). Give the one-forms "
                    "alpha(q) as nonholonomic= if it is linear, or use the discrete steps "
                    "(geomjax.forced_dla, geomjax.herglotz), which take affine constraints"
                )
            kwargs["nonholonomic"] = self.nonholonomic.forms
        return System(self.hamiltonian, canonical(self.n), **kwargs)

    @classmethod
    def from_hamiltonian(cls, system, *, quadratic: bool | None = None, newton: Newton | None = None):
        """The Lagrangian side of a Hamiltonian `geomjax.System` on T*Rⁿ.

        L(q, v) = p·v − H(q, p) with p solving ∂H/∂p(q, p) = v (one linear solve when H is
        quadratic in p, Newton otherwise). Holonomic and nonholonomic constraints come
        along; second-class `constraints=f(x)` do not (they are not constraints on
        (q, v)) and raise.
        """
        if not isinstance(system, System) or not isinstance(system.structure, CanonicalStructure):
            raise ValueError("from_hamiltonian needs a geomjax.System on geomjax.canonical(n)")
        if isinstance(system, ConstrainedSystem):
            raise ValueError(
                "a System with second-class constraints=f(x) has no Lagrangian form here; "
                "give position constraints as holonomic=g(q)"
            )
        n = system.structure.n
        structure = system.structure
        energy = lambda q, p: structure.evaluate(system.hamiltonian, (q, p))  # noqa: E731
        h_quadratic = decide_quadratic(energy, jnp.zeros((n,)), n, quadratic, "the momentum Hessian ∂²H/∂p²")
        solver = Newton() if newton is None else newton

        def lagrangian(q, v):
            p = solve_gradient(energy, q, v, quadratic=h_quadratic, newton=solver)
            return p @ v - energy(q, p)

        return cls(
            lagrangian,
            n,
            nonholonomic=system.nonholonomic,
            holonomic=system.holonomic,
            quadratic=h_quadratic,
            newton=newton,
        )
