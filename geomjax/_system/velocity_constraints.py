"""Nonholonomic constraints of Lagrangian systems: Φ(q, v) = α(q)·v + β(q) = 0.

Two ways to give them, both turned into one type that the systems and the discrete
variational steps use:

- a callable `alpha(q)` returning the one-forms α(q), shape `(k, n)` (or `(n,)` for one
  constraint): the linear constraint α(q)·v = 0, as in `geomjax.System(...,
  nonholonomic=omega)`;
- `geomjax.VelocityConstraint(phi)` with `phi(q, v)` of shape `(k,)`, affine in v: the
  one-forms are α = ∂Φ/∂v by autodiff and β(q) = Φ(q, 0) is allowed (the Foucault
  pendulum's −y ẋ + x ẏ + Ω sin β (x² + y²) = 0 is affine, not linear).

The variations of the Lagrange–d'Alembert and Herglotz principles lie in ker α(q); the
discrete steps impose Φ_d = Φ∘Ψ on (q_k, q_{k+1}).
"""

import abc
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._validate import known, trace_user_function


class AbstractVelocityConstraint(eqx.Module):
    """Constraints Φ(q, v) = α(q)·v + β(q) = 0, affine in the velocity v."""

    @abc.abstractmethod
    def __call__(self, q, v):
        """Φ(q, v), shape `(k,)`."""

    @abc.abstractmethod
    def forms(self, q):
        """The one-forms α(q) = ∂Φ/∂v, shape `(k, n)`."""

    @property
    def linear(self) -> bool:
        """True when β = 0 is known (constraints given by one-forms α(q))."""
        return False

    def check(self, q) -> None:
        """Raise a clear error if the constraint cannot be evaluated at the concrete `q`."""


def _forms_shape_error(shape, n):
    return ValueError(
        f"nonholonomic must return the constraint one-forms α(q) of shape (k, {n}) (or ({n},) "
        f"for one constraint), got shape {shape}"
    )


class OneForms(AbstractVelocityConstraint):
    """Linear constraints α(q)·v = 0 from the one-forms `alpha(q)` (shape `(k, n)`)."""

    alpha: Callable

    def forms(self, q):
        return jnp.atleast_2d(jnp.asarray(self.alpha(q)))

    def __call__(self, q, v):
        return jnp.sum(self.forms(q) * v, axis=1)

    @property
    def linear(self) -> bool:
        return True

    def check(self, q) -> None:
        n = q.shape[0]
        out = trace_user_function(self.alpha, jax.ShapeDtypeStruct(q.shape, q.dtype), "nonholonomic")
        shape = getattr(out, "shape", None)
        if shape is None or len(shape) not in (1, 2) or shape[-1] != n:
            raise _forms_shape_error(shape, n)


class VelocityConstraint(AbstractVelocityConstraint):
    """Nonholonomic constraints given as Φ(q, v) = 0, affine in the velocity v.

    Φ(q, v) = α(q)·v + β(q): the one-forms α = ∂Φ/∂v are derived by autodiff, and the
    affine part β(q) = Φ(q, 0) may be non-zero (a rotating frame, a moving support). Pass it
    as `nonholonomic=geomjax.VelocityConstraint(phi)` to `geomjax.herglotz`,
    `geomjax.forced_dla`, `geomjax.LagrangianSystem` or `geomjax.ContactLagrangianSystem`;
    a plain callable there is read as the one-forms `alpha(q)` of α(q)·v = 0.

    Φ must be affine in v (the principles of Lagrange–d'Alembert and Herglotz constrain
    the variations by α(q), which needs this): `check` evaluates ∂Φ/∂v at two velocities
    and raises a `ValueError` if they differ.

    **Arguments:**

    - `phi`: `(q, v) ↦ Φ(q, v)`, shape `(k,)` (a scalar for one constraint).

    Example (Maciel, Ortiz and Schaerer (2020) eq. (13), the Foucault pendulum's constraint):

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> rate = 7.29e-5 * jnp.sin(jnp.deg2rad(49.0))
    >>> c = geomjax.VelocityConstraint(
    ...     lambda q, v: -q[1] * v[0] + q[0] * v[1] + rate * (q @ q))
    >>> c.forms(jnp.array([0.67, 0.1]))
    Array([[-0.1 ,  0.67]], dtype=float64)

    ```
    """

    phi: Callable

    def __call__(self, q, v):
        return jnp.atleast_1d(self.phi(q, v))

    def forms(self, q):
        return jax.jacfwd(self.__call__, argnums=1)(q, jnp.zeros_like(q))

    def check(self, q) -> None:
        spec = jax.ShapeDtypeStruct(q.shape, q.dtype)
        out = trace_user_function(lambda qq: self(qq, qq), spec, "the velocity constraint Φ(q, v)")
        if getattr(out, "ndim", None) != 1:
            raise ValueError(
                f"a VelocityConstraint must return Φ(q, v) of shape (k,), got shape {getattr(out, 'shape', None)}"
            )
        if known(q) is None:
            return
        # Affine in v: ∂Φ/∂v is the same at v = 0 and at a generic velocity.
        rng = np.random.default_rng(7)
        v = jnp.asarray(rng.uniform(0.3, 1.3, q.shape), q.dtype) * (1.0 + jnp.max(jnp.abs(q)))
        a0 = known(self.forms(q))
        a1 = known(jax.jacfwd(self.__call__, argnums=1)(q, v))
        if a0 is None or a1 is None:  # a closed-over parameter is traced: checked only where known
            return
        scale = 1.0 + np.max(np.abs(a0))
        if np.all(np.isfinite(a0)) and np.all(np.isfinite(a1)) and np.max(np.abs(a1 - a0)) > 1e-10 * scale:
            raise ValueError(
                "the nonholonomic constraint Φ(q, v) is not affine in the velocity v (∂Φ/∂v "
                f"changes with v at q = {known(q)}): nonholonomic constraints here are "
                "α(q)·v + β(q) = 0, the form the Lagrange–d'Alembert and Herglotz principles "
                "need. Write the constraint linearly in v"
            )


def as_velocity_constraint(nonholonomic) -> AbstractVelocityConstraint | None:
    """`None`, a `VelocityConstraint`/`OneForms` as it is, or a callable `alpha(q)` wrapped."""
    if nonholonomic is None or isinstance(nonholonomic, AbstractVelocityConstraint):
        return nonholonomic
    if callable(nonholonomic):
        return OneForms(nonholonomic)
    raise TypeError(
        "nonholonomic must be a callable q ↦ α(q) (the (k, n) constraint one-forms) or a "
        f"geomjax.VelocityConstraint(phi), got {type(nonholonomic).__name__}"
    )
