"""A chain of point masses in space joined by rigid links: k = n holonomic constraints in R³ⁿ."""

import jax.numpy as jnp
import numpy as np
from jax.tree_util import Partial

from .._system.structures import canonical
from .._system.system import System
from ._model import Model
from ._model import model_params as _params


def _links(q):
    """Flat q = (x₁, y₁, z₁, …) → link vectors d_i = q_i − q_{i−1} (q_0 = 0, the pivot), (n, 3)."""
    points = q.reshape(-1, 3)
    return jnp.diff(points, axis=0, prepend=jnp.zeros((1, 3), points.dtype))


def _spatial_hamiltonian(params, x):
    n3 = x.shape[0] // 2
    q, p = x[:n3], x[n3:]
    heights = q.reshape(-1, 3)[:, 2]
    return 0.5 * (p @ p) / params["m"] + params["m"] * params["g"] * jnp.sum(heights)


def _spatial_constraint(params, q):
    """g_i(q) = ½(|q_i − q_{i−1}|² − ℓ²), i = 1..n, all links at once."""
    d = _links(q)
    return 0.5 * (jnp.sum(d * d, axis=1) - params["length"] ** 2)


def _spatial_second_class(params, x):
    """f = (g(q), G(q)M⁻¹p): row i of G(q)M⁻¹p is d_i·(v_i − v_{i−1}), v = p/m."""
    n3 = x.shape[0] // 2
    q, p = x[:n3], x[n3:]
    d = _links(q)
    u = _links(p / params["m"])
    g = 0.5 * (jnp.sum(d * d, axis=1) - params["length"] ** 2)
    return jnp.concatenate([g, jnp.sum(d * u, axis=1)])


def _spatial_chain_state(params, directions, angular_velocities):
    """Cartesian (q, p) of the chain with link i along the direction u_i (normalised) turning
    at the angular velocity ω_i: d_i = ℓu_i, ḋ_i = ℓ ω_i × u_i,

    q_i = Σ_{j≤i} d_j,   p_i = m q̇_i = m Σ_{j≤i} ḋ_j.

    The component of ω_i along u_i does not move the link.
    """
    ell, m = params["length"], params["m"]
    u = directions / jnp.linalg.norm(directions, axis=1, keepdims=True)
    d = ell * u
    ddot = ell * jnp.cross(angular_velocities, u)
    q = jnp.cumsum(d, axis=0).reshape(-1)
    p = m * jnp.cumsum(ddot, axis=0).reshape(-1)
    return jnp.concatenate([q, p])


def _default_start(n: int):
    """Link i at polar angle 0.3 + 0.1i from the downward vertical and azimuth 0.7i,
    turning about ω_i = (0.2(−1)^{i+1}, 0.1, 0.3)."""
    i = np.arange(1, n + 1, dtype=np.float64)
    theta, phi = 0.3 + 0.1 * i, 0.7 * i
    directions = np.stack([np.sin(theta) * np.cos(phi), np.sin(theta) * np.sin(phi), -np.cos(theta)], axis=1)
    omega = np.stack([0.2 * (-1.0) ** (i + 1), np.full(n, 0.1), np.full(n, 0.3)], axis=1)
    return directions, omega


def spatial_chain(
    n_links: int = 3,
    *,
    mass=1.0,
    length=1.0,
    gravity=1.0,
    holonomic: bool = True,
    directions=None,
    angular_velocities=None,
) -> Model:
    """A chain of `n_links` point masses in R³ joined by massless rigid links, hanging from a
    fixed pivot: a spherical n-pendulum.

    Mass i sits at q_i ∈ R³, linked to q_{i−1} by a rod of length ℓ; q_0 = 0 is the
    pivot and gravity acts along −z. In maximal (Cartesian) coordinates,
    x = (q, p) ∈ T*R³ⁿ with q = (x₁, y₁, z₁, …, xₙ, yₙ, zₙ), p laid out the same way, and

    H(q, p) = Σ_i |p_i|²/(2m) + m g Σ_i z_i,
    g_i(q) = ½(|q_i − q_{i−1}|² − ℓ²) = 0,   i = 1, …, n.

    As for `planar_chain`, row i of G = Dg is d_i = q_i − q_{i−1} in the block of mass i
    and −d_i in that of mass i−1, so G M⁻¹ Gᵀ is tridiagonal, and the hidden velocity
    constraints are (G M⁻¹ p)_i = d_i·(v_i − v_{i−1}) = 0, v = p/m. The constrained phase
    space S = {g = 0, G M⁻¹ p = 0} has dimension 4n (each link a point of the sphere and
    a tangent velocity). For n = 1 this is the spherical pendulum of radius ℓ, and the
    vertical angular momentum Σ_i (q_i × p_i)·e_z is a first integral for every n (the
    model does not declare it).

    The default start has link i along the direction at polar angle 0.3 + 0.1i from the
    downward vertical and azimuth 0.7i, turning at ω_i = (0.2(−1)^{i+1}, 0.1, 0.3):
    d_i = ℓu_i, ḋ_i = ℓ ω_i × u_i, so x0 lies on S up to round-off.

    **Arguments:**

    - `n_links`: number of links (and masses), n ≥ 1.
    - `mass`, `length`, `gravity`: m, ℓ and g, the same for every link (differentiable).
    - `holonomic`: if True (default), the links as position constraints
      (`System(holonomic=g)`, as RATTLE and SHAKE need); if False, the full second-class
      set f = (g, G M⁻¹ p) as `constraints=`.
    - `directions`: optional link directions u_i, shape `(n_links, 3)` (normalised here).
    - `angular_velocities`: optional ω_i, shape `(n_links, 3)`, with ḋ_i = ℓ ω_i × u_i.

    **Returns:**

    A `geomjax.models.Model` with
    `quantity_names = ("g1", …, "gn", "gdot1", …, "gdotn", "H")`; `exact` is `None`.

    Example:

    ```python
    >>> import geomjax, numpy as np
    >>> model = geomjax.models.spatial_chain(2)
    >>> q = np.asarray(model.x0[:6]).reshape(2, 3)
    >>> [round(float(np.linalg.norm(d)), 12) for d in (q[0], q[1] - q[0])]  # two rods of length 1
    [1.0, 1.0]
    >>> sol = geomjax.integrate(geomjax.rattle(model.system), model.x0, dt=1e-2, steps=100)
    >>> sol.message
    'success'

    ```
    """
    n = int(n_links)
    if n < 1:
        raise ValueError(f"n_links must be at least 1, got {n_links}")
    params = _params(m=mass, g=gravity, length=length)
    default_u, default_omega = _default_start(n)
    u = jnp.asarray(default_u if directions is None else directions, jnp.float64)
    omega = jnp.asarray(default_omega if angular_velocities is None else angular_velocities, jnp.float64)
    if u.shape != (n, 3) or omega.shape != (n, 3):
        raise ValueError(f"directions and angular_velocities must have shape ({n}, 3), got {u.shape} and {omega.shape}")
    x0 = _spatial_chain_state(params, u, omega)
    hamiltonian = Partial(_spatial_hamiltonian, params)
    if holonomic:
        system = System(hamiltonian, canonical(3 * n), holonomic=Partial(_spatial_constraint, params))
    else:
        system = System(hamiltonian, canonical(3 * n), constraints=Partial(_spatial_second_class, params))
    names = tuple(f"g{k}" for k in range(1, n + 1)) + tuple(f"gdot{k}" for k in range(1, n + 1)) + ("H",)
    return Model("spatial_chain", system, params, x0, names)
