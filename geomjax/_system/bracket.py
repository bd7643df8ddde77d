"""Poisson brackets and Hamiltonian vector fields by autodiff."""

from collections.abc import Callable

import jax

from .structures import AbstractPoissonStructure


def gradient_pieces(fn: Callable, structure: AbstractPoissonStructure, z):
    """∇fn at the state `z` (in pieces), by one reverse-mode pass through `merge`."""
    return jax.grad(lambda w: structure.evaluate(fn, w))(z)


def hamiltonian_vector_field(fn: Callable, structure: AbstractPoissonStructure) -> Callable:
    """X_F = B∇F as a callable on flat states.

    **Arguments:**

    - `fn`: scalar function F(x).
    - `structure`: the Poisson structure.

    **Returns:**

    Callable `x ↦ B(x)∇F(x)` (flat in, flat out).

    Example:

    ```python
    >>> import jax.numpy as jnp, geomjax
    >>> H = lambda x: 0.5 * x[1] ** 2 + 0.5 * x[0] ** 2   # harmonic oscillator
    >>> geomjax.hamiltonian_vector_field(H, geomjax.canonical(1))(jnp.array([1.0, 2.0]))  # (∂H/∂p, −∂H/∂q)
    Array([ 2., -1.], dtype=float64)

    ```
    """

    def field(x):
        z = structure.split(x)
        return structure.merge(structure.apply(z, gradient_pieces(fn, structure, z)))

    return field


def bracket(f: Callable, g: Callable, structure: AbstractPoissonStructure) -> Callable:
    """The Poisson bracket {F, G}(x) = ∇F(x)·B(x)∇G(x).

    **Arguments:**

    - `f`, `g`: scalar functions of the flat state.
    - `structure`: a Poisson structure (`canonical(n)`, `lie_poisson_so3()`, ...).

    **Returns:**

    Callable `x ↦ {F, G}(x)`, a scalar; jit-, vmap- and grad-compatible.

    Example:

    ```python
    B = geomjax.canonical(1)
    q = lambda x: x[0]
    p = lambda x: x[1]
    geomjax.bracket(q, p, B)(jnp.array([0.3, 0.1]))  # 1.0
    ```
    """

    def value(x):
        z = structure.split(x)
        gf = gradient_pieces(f, structure, z)
        xg = structure.apply(z, gradient_pieces(g, structure, z))
        return sum(jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda a, b: (a * b).sum(), gf, xg)))

    return value
