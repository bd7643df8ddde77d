"""Error series of conserved quantities and constraints along a trajectory."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from .._driver.solution import Solution
from .._system.system import HolonomicSystem, System


def _states(xs, system, what: str):
    """The trajectory `xs` as an `(n, dim)` array, for the error series `what` (a
    Solution in either place is a TypeError saying to pass the system and sol.xs)."""
    if isinstance(system, Solution) or eqx.is_array_like(system):
        raise TypeError(
            f"{what} takes the system first, then the states: {what}(system, sol.xs); got "
            f"{type(system).__name__} as the system"
        )
    if isinstance(xs, Solution):
        raise TypeError(
            f"{what} takes the saved states, an array of shape (n, dim), not a geomjax.Solution: "
            f"pass sol.xs ({what}(system, sol.xs))"
        )
    xs = jnp.asarray(xs)
    if xs.ndim != 2:
        raise ValueError(f"xs must be a trajectory of flat states, shape (n, dim); got shape {tuple(xs.shape)}")
    return xs


def invariant_errors(
    system: System, xs: Float[ArrayLike, "steps dim"], reference: Float[ArrayLike, " dim"] | None = None
) -> Float[Array, "steps q"]:
    """|F(x_t) − F(x_ref)| along a trajectory, for F = (f, H, I) (constraints, energy, integrals).

    The columns follow `system.conserved_quantities`: the constraint functions (for
    `holonomic=g`: g and Dg·∂H/∂p), then H, then the extra integrals (for the pendulum
    models, `model.quantity_names`).

    **Arguments:**

    - `system`: the `geomjax.System`.
    - `xs`: states, shape `(n, dim)` (e.g. `solution.xs`).
    - `reference`: the state the values are compared with; `xs[0]` by default.

    **Returns:**

    An array of shape `(n, m)`.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum()
    >>> Y = geomjax.feedback_field(model.system, model.x0, gains=50.0)
    >>> sol = geomjax.integrate(Y, model.x0, dt=1e-3, steps=1000)
    >>> err = geomjax.diagnostics.invariant_errors(model.system, sol.xs)
    >>> err.shape                      # |Δf1|, |Δf2|, |ΔH|, |ΔJ| at every save
    (1001, 4)

    ```
    """
    xs = _states(xs, system, "invariant_errors")
    values = jax.vmap(system.conserved_quantities)(xs)
    start = values[0] if reference is None else system.conserved_quantities(jnp.asarray(reference))
    return jnp.abs(values - start[None, :])


def constraint_errors(system: System, xs: Float[ArrayLike, "steps dim"]) -> Float[Array, "steps c"]:
    """Constraint violations along a trajectory, shape `(n, 2k)`.

    For `holonomic=g` these are |g(q_t)| and |G(q_t)∂H/∂p| (S is where both vanish); for a
    general set `constraints=f`, |f(x_t) − f(x_0)| (S is the level set through x_0).

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum(holonomic=True)
    >>> sol = geomjax.integrate(geomjax.rattle(model.system), model.x0, dt=0.01, steps=100)
    >>> float(geomjax.diagnostics.constraint_errors(model.system, sol.xs).max()) < 1e-12
    True

    ```
    """
    xs = _states(xs, system, "constraint_errors")
    values = jax.vmap(system.constraint_functions)(xs)
    if isinstance(system, HolonomicSystem):
        return jnp.abs(values)
    return jnp.abs(values - values[0][None, :])


def energy_errors(
    system: System, xs: Float[ArrayLike, "steps dim"], reference: Float[ArrayLike, " dim"] | None = None
) -> Float[Array, " steps"]:
    """|H(x_t) − H(x_ref)| along a trajectory (`reference` defaults to `xs[0]`), shape `(n,)`.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum(holonomic=True)
    >>> sol = geomjax.integrate(geomjax.rattle(model.system), model.x0, dt=0.01, steps=100)
    >>> float(geomjax.diagnostics.energy_errors(model.system, sol.xs).max()) < 1e-3
    True

    ```
    """
    xs = _states(xs, system, "energy_errors")
    values = jax.vmap(system.hamiltonian)(xs)
    start = values[0] if reference is None else system.hamiltonian(jnp.asarray(reference))
    return jnp.abs(values - start)
