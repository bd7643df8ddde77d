"""A planar chain of point masses joined by rigid links: k = n holonomic constraints in R²ⁿ."""

import jax.numpy as jnp
from jax.tree_util import Partial

from .._system.structures import canonical
from .._system.system import System
from ._model import Model
from ._model import model_params as _params


def _points(q):
    """Flat q = (x₁, y₁, …, xₙ, yₙ) → the (n, 2) array of mass positions."""
    return q.reshape(-1, 2)


def _links(points):
    """Link vectors d_i = q_i − q_{i−1} with q_0 = 0 (the pivot), shape (n, 2)."""
    return jnp.diff(points, axis=0, prepend=jnp.zeros((1, 2), points.dtype))


def _chain_hamiltonian(params, x):
    n2 = x.shape[0] // 2
    q, p = x[:n2], x[n2:]
    heights = _points(q)[:, 1]
    return 0.5 * (p @ p) / params["m"] + params["m"] * params["g"] * jnp.sum(heights)


def _chain_constraint(params, q):
    """g_i(q) = ½(|q_i − q_{i−1}|² − ℓ²), i = 1..n, all links at once."""
    d = _links(_points(q))
    return 0.5 * (jnp.sum(d * d, axis=1) - params["length"] ** 2)


def _chain_second_class(params, x):
    """f = (g(q), G(q)M⁻¹p): row i of G(q)M⁻¹p is d_i·(v_i − v_{i−1}), v = p/m."""
    n2 = x.shape[0] // 2
    q, p = x[:n2], x[n2:]
    d = _links(_points(q))
    u = _links(_points(p / params["m"]))
    g = 0.5 * (jnp.sum(d * d, axis=1) - params["length"] ** 2)
    return jnp.concatenate([g, jnp.sum(d * u, axis=1)])


def _chain_state(params, angles, rates):
    """Cartesian (q, p) of the chain with link angles θ_i from the downward vertical.

    q_i = Σ_{j≤i} ℓ(sin θ_j, −cos θ_j),  p_i = m q̇_i = m Σ_{j≤i} ℓ θ̇_j (cos θ_j, sin θ_j).
    """
    ell, m = params["length"], params["m"]
    d = ell * jnp.stack([jnp.sin(angles), -jnp.cos(angles)], axis=1)
    ddot = ell * rates[:, None] * jnp.stack([jnp.cos(angles), jnp.sin(angles)], axis=1)
    q = jnp.cumsum(d, axis=0).reshape(-1)
    p = m * jnp.cumsum(ddot, axis=0).reshape(-1)
    return jnp.concatenate([q, p])


def planar_chain(
    n_links: int = 4,
    *,
    mass=1.0,
    length=1.0,
    gravity=1.0,
    holonomic: bool = True,
    angles=None,
    angular_velocities=None,
) -> Model:
    """A planar chain of `n_links` point masses joined by massless rigid links (an n-pendulum).

    Mass i sits at q_i ∈ R², linked to q_{i−1} by a rod of length ℓ; q_0 = 0 is the fixed
    pivot. In maximal (Cartesian) coordinates, x = (q, p) ∈ T*R²ⁿ with
    q = (x₁, y₁, …, xₙ, yₙ), p laid out the same way, and

    H(q, p) = Σ_i |p_i|²/(2m) + m g Σ_i y_i,
    g_i(q) = ½(|q_i − q_{i−1}|² − ℓ²) = 0,   i = 1, …, n.

    The Jacobian G = Dg has row i equal to d_i = q_i − q_{i−1} in the block of mass i and
    −d_i in the block of mass i−1 (if i ≥ 2), so G M⁻¹ Gᵀ is tridiagonal; the hidden
    velocity constraints are (G M⁻¹ p)_i = d_i·(v_i − v_{i−1}) = 0, v = p/m. The
    constrained phase space S = {g = 0, G M⁻¹ p = 0} has dimension 2n. For n = 1 this is
    `planar_pendulum` (same coordinate layout, q = (x, y), p = (p_x, p_y)).

    The default start has link i at angle θ_i = 0.3 + 0.1 i from the downward vertical and
    angular velocity θ̇_i = 0.2 (−1)^{i+1}; positions and momenta p = m q̇ come from the
    angle parametrisation, so x0 lies on S up to round-off.

    **Arguments:**

    - `n_links`: number of links (and masses), n ≥ 1.
    - `mass`, `length`, `gravity`: m, ℓ and g, the same for every link (differentiable).
    - `holonomic`: if True (default), state the links as position constraints
      (`System(holonomic=g)`, as RATTLE and SHAKE need; geomjax adds G M⁻¹ p by autodiff);
      if False, give the full second-class set f = (g, G M⁻¹ p) as `constraints=`.
    - `angles`, `angular_velocities`: optional link angles θ_i (from the downward vertical)
      and rates θ̇_i, shape `(n_links,)`, for another start on S.

    **Returns:**

    A `geomjax.models.Model` with
    `quantity_names = ("g1", …, "gn", "gdot1", …, "gdotn", "H")`; `exact` is `None`.

    Example:

    ```python
    model = geomjax.models.planar_chain(3)
    sol = geomjax.integrate(geomjax.rattle(model.system), model.x0, dt=1e-2, steps=1000)
    ```
    """
    n = int(n_links)
    if n < 1:
        raise ValueError(f"n_links must be at least 1, got {n_links}")
    params = _params(m=mass, g=gravity, length=length)
    i = jnp.arange(1, n + 1, dtype=jnp.float64)
    theta = 0.3 + 0.1 * i if angles is None else jnp.asarray(angles, jnp.float64)
    omega = 0.2 * (-1.0) ** (i + 1) if angular_velocities is None else jnp.asarray(angular_velocities, jnp.float64)
    if theta.shape != (n,) or omega.shape != (n,):
        raise ValueError(
            f"angles and angular_velocities must have shape ({n},), got {theta.shape} and {omega.shape}"
        )
    x0 = _chain_state(params, theta, omega)
    hamiltonian = Partial(_chain_hamiltonian, params)
    if holonomic:
        system = System(hamiltonian, canonical(2 * n), holonomic=Partial(_chain_constraint, params))
    else:
        system = System(hamiltonian, canonical(2 * n), constraints=Partial(_chain_second_class, params))
    names = tuple(f"g{k}" for k in range(1, n + 1)) + tuple(f"gdot{k}" for k in range(1, n + 1)) + ("H",)
    return Model("planar_chain", system, params, x0, names)
