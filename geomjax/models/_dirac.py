"""Salnikov and Hamdouni's (2019) examples as implicit Lagrangian systems: the Cartesian pendulum and the Ziegler column.

Both are given by the data the Dirac integrators take, a Lagrangian L(q, v) on TRⁿ and
holonomic constraints φ(q) = 0 (Salnikov and Hamdouni (2019) §III A and §IV B), with q Cartesian. The same
data give the index-reduced Hamiltonian system (`LagrangianModel.system`, the Legendre
transform by autodiff) for `geomjax.dirac_field`, `geomjax.rattle` and friends. Flat
states are x = (q, p), p = ∂L/∂v = m v.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float
from jax.tree_util import Partial

from .._system.lagrangian import LagrangianSystem
from .._system.structures import canonical
from .._system.system import System
from ._model import flat_state, model_params


class LagrangianModel(eqx.Module):
    """A constrained mechanical system given by (L, φ).

    **Fields:**

    - `name`: short identifier.
    - `lagrangian_system`: the `geomjax.LagrangianSystem(L, n, holonomic=φ)`.
    - `system`: its Hamiltonian form (`lagrangian_system.to_hamiltonian()`, or the same
      H written out), for
      `geomjax.dirac_field`, `geomjax.rattle`, `geomjax.feedback_field`.
    - `params`: the parameter values, a dict of float64 scalars.
    - `x0`: the initial flat state (q₀, p₀).
    - `n_bodies`: the number of point masses (q has length 2·n_bodies).
    """

    name: str = eqx.field(static=True)
    lagrangian_system: LagrangianSystem
    system: object
    params: dict
    x0: jax.Array
    n_bodies: int = eqx.field(static=True)

    @property
    def lagrangian(self):
        """L(q, v)."""
        return self.lagrangian_system.lagrangian

    @property
    def holonomic(self):
        """φ(q), shape `(k,)`."""
        return self.lagrangian_system.holonomic


# --------------------------------------------------------------------------------------
# The pendulum of Salnikov and Hamdouni (2019) §III A, eq. (5)


def _pendulum_lagrangian(params, q, v):
    return 0.5 * params["m"] * (v @ v) - params["m"] * params["g"] * q[1]


def _pendulum_constraint(params, q):
    return jnp.atleast_1d(q @ q - params["length"] ** 2)


def pendulum_state(angle: Float[ArrayLike, "*batch"], length: float = 1.0) -> Float[Array, "*batch 4"]:
    """(q, p) of the pendulum at rest at `angle` from the downward vertical: q = ℓ(sin θ, −cos θ)."""
    angle = jnp.asarray(angle, jnp.float64)
    return jnp.stack([length * jnp.sin(angle), -length * jnp.cos(angle), 0.0 * angle, 0.0 * angle], axis=-1)


def cartesian_pendulum(m=1.0, g=1.0, length=1.0, angle=1.0) -> LagrangianModel:
    """Salnikov and Hamdouni's (2019) pendulum: L = m/2 |v|² − m g y on TR², φ = x² + y² − ℓ² (eq. (5)).

    Released from rest at `angle` (radians) from the downward vertical:
    q₀ = ℓ(sin θ₀, −cos θ₀), p₀ = 0.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.cartesian_pendulum(angle=0.5)
    >>> float(model.holonomic(model.x0[:2])[0]) == 0.0
    True

    ```
    """
    params = model_params(m=m, g=g, length=length)
    lagrangian = Partial(_pendulum_lagrangian, params)
    constraint = Partial(_pendulum_constraint, params)
    lsys = LagrangianSystem(lagrangian, 2, holonomic=constraint, quadratic=True)
    x0 = pendulum_state(angle, params["length"])
    return LagrangianModel("cartesian_pendulum", lsys, lsys.to_hamiltonian(), params, flat_state(x0), 1)


# --------------------------------------------------------------------------------------
# The Ziegler column of Salnikov and Hamdouni (2019) §IV B


def _rods(q):
    """Rod vectors d_i = q_i − q_{i−1} (q₀ = 0, the fixed base), shape (n, 2)."""
    points = q.reshape(-1, 2)
    return jnp.diff(points, axis=0, prepend=jnp.zeros((1, 2), points.dtype))


def column_angles(q: Float[ArrayLike, "*batch two_n"]) -> Float[Array, "*batch n"]:
    """θ_i = atan2(d_x, d_y) of each rod d_i = q_i − q_{i−1}: the angle from the *upward*
    vertical, in (−π, π]; works on a batch of states `(..., 2n)` too."""
    q = jnp.asarray(q)
    points = q.reshape(q.shape[:-1] + (-1, 2))
    zero = jnp.zeros(points.shape[:-2] + (1, 2), points.dtype)
    d = jnp.diff(points, axis=-2, prepend=zero)
    return jnp.arctan2(d[..., 0], d[..., 1])


def _column_lagrangian(params, q, v):
    theta = column_angles(q)
    relative = jnp.diff(theta, prepend=jnp.zeros((1,), theta.dtype))  # θ₁, θ₂ − θ₁, ...
    kinetic = 0.5 * jnp.sum(params["m"] * jnp.sum(v.reshape(-1, 2) ** 2, axis=1))
    load = params["P"] * jnp.sum(q.reshape(-1, 2)[:, 1])
    springs = 0.5 * jnp.sum(params["k"] * relative**2)
    return kinetic - load - springs


def _column_hamiltonian(params, x):
    """H = Σ |p_i|²/2m_i + V(q), V = −L(q, 0): the Legendre transform of L written out
    (cheaper in the fields' nested derivatives than the autodiff Legendre inverse)."""
    n2 = x.shape[0] // 2
    q, p = x[:n2], x[n2:]
    kinetic = 0.5 * jnp.sum(jnp.sum(p.reshape(-1, 2) ** 2, axis=1) / params["m"])
    return kinetic - _column_lagrangian(params, q, jnp.zeros_like(q))


def _column_constraint(params, q):
    d = _rods(q)
    return jnp.sum(d * d, axis=1) - params["lengths"] ** 2


def column_state(
    angles: Float[ArrayLike, " n"],
    lengths: float | Float[ArrayLike, " n"],
    rates: Float[ArrayLike, " n"] | None = None,
    m: float | Float[ArrayLike, " n"] | None = None,
) -> Float[Array, " four_n"]:
    """(q, p) of the column with rod angles θ_i from the upward vertical (and angular rates,
    zero by default): q_i = Σ_{j≤i} ℓ_j (sin θ_j, cos θ_j), p_i = m_i q̇_i."""
    angles = jnp.asarray(angles, jnp.float64)
    lengths = jnp.broadcast_to(jnp.asarray(lengths, jnp.float64), angles.shape)
    rates = jnp.zeros_like(angles) if rates is None else jnp.asarray(rates, jnp.float64)
    m = jnp.ones_like(angles) if m is None else jnp.broadcast_to(jnp.asarray(m, jnp.float64), angles.shape)
    d = lengths[:, None] * jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=1)
    ddot = (lengths * rates)[:, None] * jnp.stack([jnp.cos(angles), -jnp.sin(angles)], axis=1)
    q = jnp.cumsum(d, axis=0).reshape(-1)
    p = (m[:, None] * jnp.cumsum(ddot, axis=0)).reshape(-1)
    return jnp.concatenate([q, p])


def ziegler_column(n=2, k=1.0, P=0.4, lengths=1.0, m=1.0, angles=None) -> LagrangianModel:
    """The Ziegler column of Salnikov and Hamdouni (2019) §IV B: n rods from a fixed base, point masses at the
    joints and the tip, joint springs and a constant load P on every joint.

    q = (x₁, y₁, …, xₙ, yₙ) (joint i at q_i, the base q₀ = 0 fixed), and

        L = Σ m_i/2 |v_i|² − P Σ y_i − (k/2) θ₁² − (k/2) Σ_{i≥2} (θ_i − θ_{i−1})²,
        φ_i = |q_i − q_{i−1}|² − ℓ_i²,

    with θ_i = atan2(x_i − x_{i−1}, y_i − y_{i−1}) the angle of rod i from the upward
    vertical (`column_angles`). The paper prints +k/2 θ² in L: that is an anti-restoring
    spring (a potential −k/2 θ²); the restoring springs the text describes ("a harmonic
    force tending to align the segments") have the potential +k/2 θ², so L carries −k/2 θ².
    The angles jump by 2π where a rod passes the downward vertical, as in the paper (its
    full-turn artefact is exactly such a passage).

    For n = 2 with equal k, ℓ, the upright column loses stability at P ℓ/k = 1 − 1/√2 ≈ 0.293
    and buckles to the left or to the right.

    **Arguments:**

    - `n`: number of rods.
    - `k`, `P`: spring stiffness and load (scalars).
    - `lengths`, `m`: rod lengths and joint masses (scalars or shape `(n,)`).
    - `angles`: θ_i(0), default 0.1 for rod 1 and 0 for the others; velocities are zero.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.ziegler_column(2, k=1.0, P=0.4)
    >>> model.x0.shape
    (8,)

    ```
    """
    n = int(n)
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    ell = jnp.broadcast_to(jnp.asarray(lengths, jnp.float64), (n,))
    mass = jnp.broadcast_to(jnp.asarray(m, jnp.float64), (n,))
    params = model_params(k=k, P=P)
    params["lengths"] = ell
    params["m"] = mass
    if angles is None:
        angles = jnp.zeros((n,)).at[0].set(0.1)
    angles = jnp.asarray(angles, jnp.float64)
    if angles.shape != (n,):
        raise ValueError(f"angles must have shape ({n},), got {angles.shape}")
    lagrangian = Partial(_column_lagrangian, params)
    constraint = Partial(_column_constraint, params)
    lsys = LagrangianSystem(lagrangian, 2 * n, holonomic=constraint, quadratic=True)
    x0 = column_state(angles, ell, m=mass)
    system = System(Partial(_column_hamiltonian, params), canonical(2 * n), holonomic=constraint)
    return LagrangianModel("ziegler_column", lsys, system, params, x0, n)
