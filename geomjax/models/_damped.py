"""Maciel, Ortiz and Schaerer's (2020) damped systems, each in both of its descriptions: Herglotz and Lagrange–d'Alembert.

A mechanical Lagrangian L(q, v) = ½ m|v|² − V(q) with Rayleigh damping F = −α m v is
described two ways (Maciel, Ortiz and Schaerer (2020) §3):

- **Lagrange–d'Alembert** (`DampedModel.forced`): a `geomjax.LagrangianSystem` with the
  external force F(q, v, t) = −α m v, integrated by `geomjax.forced_dla`;
- **Herglotz** (`DampedModel.contact`): a `geomjax.ContactLagrangianSystem` with
  L(q, v, z) = L(q, v) − α z, integrated by `geomjax.herglotz`. Herglotz' equations
  d/dt ∂L/∂v − ∂L/∂q = ∂L/∂v ∂L/∂z = −α m v are the same motion.

Both carry the same nonholonomic constraint where there is one. The initial states are
x = (q, p) for the first and x = (q, p, z) with z(0) = 0 for the second, p = ∂L/∂v(q₀, v₀)
by autodiff.
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.tree_util import Partial

from .._system.contact import ContactLagrangianSystem
from .._system.lagrangian import LagrangianSystem
from .._system.velocity_constraints import VelocityConstraint
from ._model import flat_state, model_params as _params

#: The Earth's sidereal rotation rate Ω in rad/s.
EARTH_ROTATION_RATE = 7.2921e-5


class DampedModel(eqx.Module):
    """A damped mechanical system of Maciel, Ortiz and Schaerer (2020) in its two descriptions.

    **Fields:**

    - `name`: short identifier.
    - `forced`: the `geomjax.LagrangianSystem` L(q, v) with the Rayleigh force
      F = −α m v (and the constraint), for `geomjax.forced_dla`.
    - `contact`: the `geomjax.ContactLagrangianSystem` L(q, v) − αz (and the constraint),
      for `geomjax.herglotz`.
    - `params`: the parameter values, a dict of float64 scalars.
    - `q0`, `v0`: the initial position and velocity.
    - `exact`: `t ↦ (q(t), q̇(t))` where a closed form is known, else `None`.
    """

    name: str = eqx.field(static=True)
    forced: LagrangianSystem
    contact: ContactLagrangianSystem
    params: dict
    q0: jax.Array
    v0: jax.Array
    exact: Callable | None = None

    @property
    def p0(self) -> jax.Array:
        """p₀ = ∂L/∂v(q₀, v₀) (autodiff)."""
        return self.forced.momentum(self.q0, self.v0)

    @property
    def x0_forced(self) -> jax.Array:
        """The initial state (q₀, p₀) of `geomjax.forced_dla`."""
        return flat_state(self.q0, self.p0)

    @property
    def x0_contact(self) -> jax.Array:
        """The initial state (q₀, p₀, z₀ = 0) of `geomjax.herglotz`."""
        return flat_state(self.q0, self.p0, 0.0)

    def energy(self, q, p):
        """E = p·v − L(q, v) with v = v(q, p) (the undamped mechanical energy)."""
        return self.forced.hamiltonian(jnp.concatenate([q, p]))


def _mechanical(pr, q, v):
    return 0.5 * pr["m"] * (v @ v) - 0.5 * pr["m"] * pr["stiffness"] * (q @ q)


def _herglotz(pr, q, v, z):
    return _mechanical(pr, q, v) - pr["alpha"] * z


def _rayleigh(pr, q, v, t):
    del q, t
    return -pr["alpha"] * pr["m"] * v


def _damped_cosine(alpha, omega2, r0, rdot0, t):
    """r(t), ṙ(t) of r̈ + αṙ + ω²r = 0 (underdamped, ω² > α²/4)."""
    wd = jnp.sqrt(omega2 - 0.25 * alpha**2)
    a, b = r0, (rdot0 + 0.5 * alpha * r0) / wd
    decay = jnp.exp(-0.5 * alpha * t)
    c, s = jnp.cos(wd * t), jnp.sin(wd * t)
    r = decay * (a * c + b * s)
    rdot = decay * (-0.5 * alpha * (a * c + b * s) + wd * (b * c - a * s))
    return r, rdot


def _oscillator_exact(pr, q0, v0, t):
    r, rdot = _damped_cosine(pr["alpha"], pr["stiffness"], q0[0], v0[0], t)
    return jnp.reshape(r, (1,)), jnp.reshape(rdot, (1,))


def damped_oscillator(alpha=0.1, q0=-0.25, p0=0.75, m=1.0) -> DampedModel:
    """The damped harmonic oscillator of Maciel, Ortiz and Schaerer (2020) §3.1: L = ½mq̇² − ½mq² with F = −αmq̇.

    Herglotz form L(q, q̇, z) = ½mq̇² − ½mq² − αz (Maciel, Ortiz and Schaerer (2020) eq. (9)); Lagrange–d'Alembert
    form eq. (5) with the Rayleigh force F = −αmq̇. Both give q̈ + αq̇ + q = 0, whose exact
    solution (ω_d = √(1 − α²/4)) is

        q(t) = e^{−αt/2} [q₀ cos ω_d t + (q̇₀ + αq₀/2)/ω_d · sin ω_d t].

    Defaults: the public setup of Vermeeren–Bravetti–Seri, (p₀, q₀) = (0.75, −0.25), m = 1
    (the paper does not print its values).

    Example:

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> model = geomjax.models.damped_oscillator(alpha=0.1)
    >>> model.x0_contact                    # (q, p, z)
    Array([-0.25,  0.75,  0.  ], dtype=float64)
    >>> q, v = model.exact(1.0)
    >>> step = geomjax.herglotz(model.contact, order=2)
    >>> x = geomjax.integrate(step, model.x0_contact, dt=0.01, steps=100).xs[-1]
    >>> bool(abs(x[0] - q[0]) < 1e-4)      # order 2: error about 1e-5 at h = 0.01
    True

    ```
    """
    pr = _params(alpha=alpha, m=m, stiffness=1.0)
    q0 = flat_state(q0)
    v0 = flat_state(p0 / m)
    forced = LagrangianSystem(Partial(_mechanical, pr), 1, force=Partial(_rayleigh, pr))
    contact = ContactLagrangianSystem(Partial(_herglotz, pr), 1)
    return DampedModel("damped_oscillator", forced, contact, pr, q0, v0, Partial(_oscillator_exact, pr, q0, v0))


def _foucault_phi(pr, q, v):
    # Maciel, Ortiz and Schaerer (2020) eq. (13): −y ẋ + x ẏ + Ω sin β (x² + y²) = 0
    return -q[1] * v[0] + q[0] * v[1] + pr["rate"] * (q @ q)


def _foucault_exact(pr, q0, v0, t):
    # The constraint fixes θ̇ = −Ω sin β; the variations are radial, so the signed radius r
    # along the line through the origin obeys r̈ + αṙ + (g/ℓ − Ω² sin² β) r = 0. The start
    # is projected onto the constraint (an impulsive reaction, normal to the line), which
    # leaves ṙ(0) = e·v₀.
    r0 = jnp.sqrt(q0 @ q0)
    e = q0 / r0
    r, rdot = _damped_cosine(pr["alpha"], pr["stiffness"] - pr["rate"] ** 2, r0, e @ v0, t)
    theta = -pr["rate"] * t
    c, s = jnp.cos(theta), jnp.sin(theta)
    e_t = jnp.stack([c * e[0] - s * e[1], s * e[0] + c * e[1]])
    n_t = jnp.stack([-e_t[1], e_t[0]])
    return r * e_t, rdot * e_t - pr["rate"] * r * n_t


def damped_foucault(
    alpha=1e-3, m=28.0, length=67.0, latitude_deg=49.0, g=9.81, rotation_rate=EARTH_ROTATION_RATE, q0=(0.67, 0.0)
) -> DampedModel:
    """The damped Foucault pendulum of Maciel, Ortiz and Schaerer (2020) §3.2, linearised in the plane z = 0.

    q = (x, y) (x south, y east), L = ½m(ẋ² + ẏ²) − ½m(g/ℓ)(x² + y²) (eq. (14)) with the
    Rayleigh force F = −αmq̇ (Herglotz form eq. (16): L − αz) and the nonholonomic
    constraint (13), affine in the velocity,

        −y ẋ + x ẏ + Ω sin β (x² + y²) = 0          (a `geomjax.VelocityConstraint`),

    which says that the plane of oscillation does not turn in an inertial frame: in the
    Earth's frame it turns at −Ω sin β. Defaults: the paper's m = 28 kg, ℓ = 67 m, β = 49°,
    g = 9.81 m/s², Ω = 7.2921e−5 rad/s (the Earth's), q(0) = (0.67, 0) m, q̇(0) = 0.

    The start q̇(0) = 0 is off the constraint (Φ = Ω sin β |q₀|² ≠ 0): the discrete steps
    impose it from the first step on. `exact(t)` is the motion after the impulsive reaction
    at t = 0⁺ (the velocity projected onto Φ = 0, normal to the line through q₀): θ̇ =
    −Ω sin β and, for the signed distance r along the turning line,
    r̈ + αṙ + (g/ℓ − Ω² sin² β) r = 0.

    Example:

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> model = geomjax.models.damped_foucault(alpha=1e-4)
    >>> q, v = model.exact(600.0)
    >>> bool(abs(model.forced.nonholonomic(q, v)[0]) < 1e-18)   # on the constraint
    True
    >>> float(model.exact(0.0)[1][1])       # ẏ(0⁺) = −Ω sin β x₀
    -3.68728987...e-05

    ```
    """
    rate = rotation_rate * jnp.sin(jnp.deg2rad(jnp.asarray(latitude_deg, jnp.float64)))
    pr = _params(alpha=alpha, m=m, length=length, g=g, rate=rate, stiffness=g / length)
    q0 = flat_state(*q0)
    v0 = jnp.zeros_like(q0)
    constraint = VelocityConstraint(Partial(_foucault_phi, pr))
    forced = LagrangianSystem(Partial(_mechanical, pr), 2, force=Partial(_rayleigh, pr), nonholonomic=constraint)
    contact = ContactLagrangianSystem(Partial(_herglotz, pr), 2, nonholonomic=constraint)
    return DampedModel("damped_foucault", forced, contact, pr, q0, v0, Partial(_foucault_exact, pr, q0, v0))
