"""Chang, Perlmutter and Vankerschaver's (2022) pendulums: constrained to the sphere (§2.3) and to the circle (§2.4)."""

import jax.numpy as jnp
from jax.tree_util import Partial

from .._system.structures import canonical
from .._system.system import System
from ._model import Model, flat_state, model_params


def _pendulum_hamiltonian(params, x):
    n = x.shape[0] // 2
    q, p = x[:n], x[n:]
    return 0.5 * (p @ p) / params["m"] + params["m"] * params["g"] * q[-1]


def _radial_constraints(x):
    """f = (|q|², q·p): the sphere/circle and its tangency, Chang, Perlmutter and Vankerschaver's (2022) second-class set."""
    n = x.shape[0] // 2
    q, p = x[:n], x[n:]
    return jnp.stack([q @ q, q @ p])


def _sphere_constraint(params, q):
    """g(q) = |q|² − ℓ²: the holonomic form of the rod constraint (for RATTLE, SHAKE, ...)."""
    return jnp.atleast_1d(q @ q - params["length"] ** 2)


def _vertical_angular_momentum(x):
    return x[0] * x[4] - x[1] * x[3]


def spherical_pendulum(m=1.0, g=1.0, length=1.0, q0=None, p0=None, holonomic=False) -> Model:
    """The spherical pendulum of Chang, Perlmutter and Vankerschaver (2022) §2.3 on T*S² ⊂ T*R³.

    H = |p|²/2m + m g q₃, second-class constraints f = (|q|², q·p) (level set (ℓ², 0)),
    extra integral J = q₁p₂ − q₂p₁. Default start q(0) = (0, ℓ, 0), p(0) = (1, 0, −1), so
    f = (ℓ², 0), J = −ℓ and H = 1 for m = g = ℓ = 1 (the paper prints H₀ = 2, a slip).

    **Arguments:**

    - `m`, `g`, `length`: mass, gravity, rod length (differentiable and vmappable).
    - `q0`, `p0`: optional initial position and momentum.
    - `holonomic`: if True, state the rod as the position constraint g(q) = |q|² − ℓ²
      (`System(holonomic=g)`), as RATTLE and SHAKE need; geomjax then adds the hidden
      constraint {g, H} = 2q·p/m. The dynamics on T*S² are the same.

    **Returns:**

    A `geomjax.models.Model` with `quantity_names = ("f1", "f2", "H", "J")`, or
    `("g", "gdot", "H", "J")` with `holonomic=True`.

    Example:

    ```python
    model = geomjax.models.spherical_pendulum()
    Y = geomjax.feedback_field(model.system, model.x0, gains=50.0)
    ```
    """
    params = model_params(m=m, g=g, length=length)
    q0 = (0.0, params["length"], 0.0) if q0 is None else q0
    p0 = (1.0, 0.0, -1.0) if p0 is None else p0
    hamiltonian = Partial(_pendulum_hamiltonian, params)
    if holonomic:
        system = System(
            hamiltonian,
            canonical(3),
            holonomic=Partial(_sphere_constraint, params),
            integrals=(_vertical_angular_momentum,),
        )
        names = ("g", "gdot", "H", "J")
    else:
        system = System(
            hamiltonian, canonical(3), constraints=_radial_constraints, integrals=(_vertical_angular_momentum,)
        )
        names = ("f1", "f2", "H", "J")
    return Model("spherical_pendulum", system, params, flat_state(q0, p0), names)


def planar_pendulum(m=1.0, g=1.0, length=1.0, q0=None, p0=None, holonomic=False) -> Model:
    """The planar pendulum of Chang, Perlmutter and Vankerschaver (2022) §2.4 on T*S¹ ⊂ T*R².

    H = |p|²/2m + m g y, constraints f = (|q|², q·p); default start q(0) = (ℓ, 0),
    p(0) = (0, 0) (released from the horizontal; one period ≈ 7.4163 for m = g = ℓ = 1).
    The angle θ from the horizontal obeys θ̈ + (g/ℓ) cos θ = 0.

    **Arguments:**

    - `m`, `g`, `length`: mass, gravity, rod length.
    - `q0`, `p0`: optional initial position and momentum.
    - `holonomic`: if True, the rod is the position constraint g(q) = |q|² − ℓ²
      (for RATTLE and SHAKE).

    **Returns:**

    A `geomjax.models.Model` with `quantity_names = ("f1", "f2", "H")`, or
    `("g", "gdot", "H")` with `holonomic=True`.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.planar_pendulum()
    >>> geomjax.dirac_field(model.system)(model.x0).shape
    (4,)

    ```
    """
    params = model_params(m=m, g=g, length=length)
    q0 = (params["length"], 0.0) if q0 is None else q0
    p0 = (0.0, 0.0) if p0 is None else p0
    hamiltonian = Partial(_pendulum_hamiltonian, params)
    if holonomic:
        system = System(hamiltonian, canonical(2), holonomic=Partial(_sphere_constraint, params))
        names = ("g", "gdot", "H")
    else:
        system = System(hamiltonian, canonical(2), constraints=_radial_constraints)
        names = ("f1", "f2", "H")
    return Model("planar_pendulum", system, params, flat_state(q0, p0), names)
