"""Hamiltonian vector fields X_F = B∇F by autodiff."""

from collections.abc import Callable

from .._system.bracket import gradient_pieces
from .._system.structures import AbstractPoissonStructure
from .._system.system import System
from .dirac import dirac_field


def hamiltonian_vector_field(fn, structure: AbstractPoissonStructure | None = None) -> Callable:
    """X_F = B∇F as a callable on flat states; or the field ẋ = B(x)∇H(x) of a `System`
    without constraints.

    **Arguments:**

    - `fn`: scalar function F(x), with `structure`; or a `geomjax.System` without
      constraints, alone (its Hamiltonian and structure are used).
    - `structure`: the Poisson structure (only with a function).

    **Returns:**

    For a function: a callable `x ↦ B(x)∇F(x)` (flat in, flat out). For a `System`:
    `geomjax.dirac_field(system)`, which without constraints is X_H = B∇H (the same
    object: one implementation), a field `geomjax.integrate` monitors H and the
    system's integrals on. A system with constraints is a ValueError: its field is the
    Dirac field X_H − Σ(C⁻¹)_ij{H, f_i}X_{f_j}, and X_H alone would leave the constraint
    set (pass `system.hamiltonian, system.structure` for X_H itself).

    Example:

    ```python
    >>> import jax.numpy as jnp, geomjax
    >>> H = lambda x: 0.5 * x[1] ** 2 + 0.5 * x[0] ** 2   # harmonic oscillator
    >>> geomjax.hamiltonian_vector_field(H, geomjax.canonical(1))(jnp.array([1.0, 2.0]))  # (∂H/∂p, −∂H/∂q)
    Array([ 2., -1.], dtype=float64)
    >>> system = geomjax.System(H, geomjax.canonical(1))   # the same, from a System
    >>> X = geomjax.hamiltonian_vector_field(system)
    >>> X(jnp.array([1.0, 2.0]))
    Array([ 2., -1.], dtype=float64)
    >>> geomjax.integrate(X, jnp.array([1.0, 0.0]), dt=0.01, steps=100, method="rk4").ok
    Array(True, dtype=bool)

    ```
    """
    if isinstance(fn, System):
        return _system_field(fn, structure)
    if not callable(fn) or structure is None:
        raise TypeError(
            "hamiltonian_vector_field takes a scalar function and its Poisson structure, "
            "hamiltonian_vector_field(H, geomjax.canonical(n)), or a geomjax.System alone, "
            f"hamiltonian_vector_field(system); got {type(fn).__name__} and {type(structure).__name__}"
        )
    return _function_field(fn, structure)


def _system_field(system, structure):
    if structure is not None:
        raise TypeError("hamiltonian_vector_field(system) takes the structure from the system: pass no structure")
    if system.is_constrained or system.nonholonomic is not None:
        raise ValueError(
            f"this {type(system).__name__} has constraints, so X_H = B∇H would leave its constraint set: "
            "its field is geomjax.dirac_field(system) (geomjax.nonholonomic_field(system) for "
            "nonholonomic ones); for X_H itself pass hamiltonian_vector_field(system.hamiltonian, system.structure)"
        )
    return dirac_field(system)


def _function_field(fn: Callable, structure: AbstractPoissonStructure) -> Callable:
    """X_F = B∇F of the function `fn` (see `hamiltonian_vector_field`)."""

    def field(x):
        z = structure.split(x)
        return structure.merge(structure.apply(z, gradient_pieces(fn, structure, z)))

    return field
