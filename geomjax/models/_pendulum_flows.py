"""Exact sub-flows of the pendulum on T*Sⁿ⁻¹ for splitting methods (Chang, Perlmutter and Vankerschaver (2022) §2.3).

Chang, Perlmutter and Vankerschaver (2022) splits H = |p|²/2m + m g qₙ into the kinetic part H¹ = |p|²/2m and the potential
part H² = m g qₙ. Restricted to T*S = {|q| = r, q·p = 0}, each has a flow in closed form:

- H¹|T*S is the geodesic flow: uniform motion on the great circle through q in the
  direction p, at angular speed ω = |p|/(m r):
  q(t) = q cos ωt + (r p/|p|) sin ωt,  p(t) = p cos ωt − (|p| q/r) sin ωt;
- H²|T*S does not move q and kicks p by the tangential part of gravity:
  p(t) = p − t m g (eₙ − (qₙ/r²) q).

Both keep |q|, q·p and the vertical angular momentum q₁p₂ − q₂p₁ exactly, so Lie–Trotter
and Strang splittings built from them stay on T*S and conserve J up to round-off. Since
they keep |q| whatever it is, a start with |q| ≠ ℓ would run a pendulum of another length
and report success: the flows know the model's rod length ℓ, and their constraint
residuals (|q|² − ℓ², q·p/|q|) make `geomjax.integrate` reject such a start
(`RESULTS.off_constraint_set`, or a ValueError before the run) like any other step's.
"""

import jax
import jax.numpy as jnp

from .._step.base import StructureStep, ok_status
from .._system.structures import CanonicalStructure, canonical
from .._validate import as_state, known
from ._model import Model

# Below this value of θ², cos θ and sin θ/θ are taken from their Taylor series, which are
# exact to round-off there and keep derivatives right at p = 0 (a pendulum at rest).
_SERIES_BELOW = 1e-6


def _cos_and_sinc(theta2):
    """(cos θ, sin θ/θ) as functions of θ², smooth (and correctly differentiable) at θ = 0."""
    small = theta2 < _SERIES_BELOW
    safe = jnp.where(small, 1.0, theta2)
    theta = jnp.sqrt(safe)
    cos_big, sinc_big = jnp.cos(theta), jnp.sin(theta) / theta
    t2 = theta2
    cos_small = 1.0 - t2 / 2.0 + t2 * t2 / 24.0 - t2 * t2 * t2 / 720.0
    sinc_small = 1.0 - t2 / 6.0 + t2 * t2 / 120.0 - t2 * t2 * t2 / 5040.0
    return jnp.where(small, cos_small, cos_big), jnp.where(small, sinc_small, sinc_big)


def _check_on_cotangent_sphere(structure, x0):
    x0 = as_state(x0, structure.dim)
    q = known(structure.split(x0)[0])
    if q is not None and float(q @ q) == 0.0:
        raise ValueError("the pendulum sub-flows need q0 ≠ 0 (the sphere |q| = r has r > 0)")


def _residuals(structure, length, x):
    """(|q|² − ℓ², q·p/|q|), which vanish on T*S: q on the sphere of the rod's length ℓ
    and the momentum tangent to it."""
    q, p = structure.split(x)
    r2 = q @ q
    return jnp.stack([r2 - length * length, q @ p / jnp.sqrt(r2)])


class GreatCircleFlow(StructureStep):
    """The exact flow of H¹ = |p|²/2m on T*S: uniform great-circle motion.

    With r = |q|, θ = |p| t/(m r): q(t) = q cos θ + (t/m) p (sin θ/θ),
    p(t) = p cos θ − (|p|² t/(m r²)) q (sin θ/θ).
    """

    structure: CanonicalStructure
    mass: jax.Array
    length: jax.Array

    def check(self, x0) -> None:
        _check_on_cotangent_sphere(self.structure, x0)

    def constraint_residuals(self, x):
        return _residuals(self.structure, self.length, x)

    def advance(self, t, z, h, args):
        del t, args
        q, p = z
        r2 = q @ q
        p2 = p @ p
        cos, sinc = _cos_and_sinc(p2 * h * h / (self.mass * self.mass * r2))
        q1 = cos * q + (h / self.mass) * sinc * p
        p1 = cos * p - (p2 * h / (self.mass * r2)) * sinc * q
        return (q1, p1), ok_status()


class GravityKick(StructureStep):
    """The exact flow of H² = m g qₙ on T*S: p(t) = p − t m g (eₙ − (qₙ/|q|²) q), q fixed."""

    structure: CanonicalStructure
    mass: jax.Array
    gravity: jax.Array
    length: jax.Array

    def check(self, x0) -> None:
        _check_on_cotangent_sphere(self.structure, x0)

    def constraint_residuals(self, x):
        return _residuals(self.structure, self.length, x)

    def advance(self, t, z, h, args):
        del t, args
        q, p = z
        n = q.shape[0]
        weight = self.mass * self.gravity
        vertical = jnp.zeros_like(q).at[n - 1].set(1.0)
        tangential = vertical - (q[n - 1] / (q @ q)) * q
        return (q, p - (h * weight) * tangential), ok_status()


def pendulum_flows(model: Model) -> tuple[GreatCircleFlow, GravityKick]:
    """The exact flows of the kinetic and potential parts of a pendulum on T*Sⁿ⁻¹.

    For H = |p|²/2m + m g qₙ (Chang, Perlmutter and Vankerschaver's (2022) spherical pendulum, n = 3, or planar pendulum,
    n = 2), returns the two sub-flows of the splitting H = H¹ + H²:

    - kinetic φ¹_t (H¹ = |p|²/2m): with r = |q| and θ = |p|t/(m r),
      q(t) = q cos θ + (t/m) p sin θ/θ,  p(t) = p cos θ − (|p|² t/(m r²)) q sin θ/θ
      (uniform motion on a great circle, written so that it is smooth at p = 0);
    - potential φ²_t (H² = m g qₙ): q(t) = q, p(t) = p − t m g (eₙ − (qₙ/r²) q)
      (gravity's tangential part; the constraint force cancels the normal part).

    Each is the exact Hamiltonian flow of its part restricted to T*S, so each is
    symplectic on T*S and keeps |q|, q·p and q₁p₂ − q₂p₁; Lie–Trotter and Strang
    compositions inherit this. Both know T*S = {|q| = ℓ, q·p = 0} for the model's rod
    length ℓ: their constraint residuals are (|q|² − ℓ², q·p/|q|), so `geomjax.integrate`
    rejects a start off T*S (e.g. |q|² = 1.5 for ℓ = 1, which the flows would otherwise
    run as a pendulum of length √1.5) as it does for every other step (`start_tol`).

    **Arguments:**

    - `model`: `geomjax.models.spherical_pendulum(...)` or `planar_pendulum(...)`
      (either form of the constraint); m, g and the rod length ℓ are read from
      `model.params`.

    **Returns:**

    `(kinetic, potential)`, two steps for `geomjax.lie_trotter`, `geomjax.strang` or
    `geomjax.compose`.

    Example:

    ```python
    model = geomjax.models.spherical_pendulum()
    kinetic, potential = geomjax.models.pendulum_flows(model)
    sol = geomjax.integrate(geomjax.strang(kinetic, potential), model.x0, dt=1e-3, steps=10_000)
    ```
    """
    n = model.x0.shape[0] // 2
    structure = canonical(n)
    m, g, length = model.params["m"], model.params["g"], model.params["length"]
    return GreatCircleFlow(structure, m, length), GravityKick(structure, m, g, length)
