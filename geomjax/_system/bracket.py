"""Poisson brackets by autodiff."""

from collections.abc import Callable

import jax

from .structures import AbstractPoissonStructure


def gradient_pieces(fn: Callable, structure: AbstractPoissonStructure, z):
    """∇fn at the state `z` (in pieces), by one reverse-mode pass through `merge`."""
    return jax.grad(lambda w: structure.evaluate(fn, w))(z)


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
