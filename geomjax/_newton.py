"""Newton's method for the small implicit systems inside steps, with exact gradients.

Implicit steps (RATTLE multipliers, implicit Runge–Kutta stages, discrete
Lagrange–d'Alembert) solve a few equations per step. This solver uses autodiff Jacobians,
the unrolled `small_solve` (no LAPACK custom call inside the loop) and
`jax.lax.custom_root`, so derivatives of the solution follow the implicit function
theorem instead of differentiating through the iterations.
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jax.flatten_util import ravel_pytree

from ._linalg import small_solve


class NewtonResult(eqx.Module):
    """Solution of `fn(x) = 0`: `value` (pytree like the guess), `converged` (bool array),
    `iterations` (int array)."""

    value: object
    converged: jax.Array
    iterations: jax.Array


def newton_solve(
    fn: Callable,
    guess,
    *,
    rtol: float = 1e-13,
    atol: float = 1e-13,
    max_iter: int = 25,
) -> NewtonResult:
    """Solve `fn(x) = 0` by Newton's method, x a pytree of arrays.

    Iterates x ← x − J(x)⁻¹ fn(x), J = ∂fn/∂x by forward-mode autodiff, until the update
    satisfies |Δx|_∞ ≤ atol + rtol·|x|_∞ (and the residual is finite) or `max_iter`
    iterations are spent. The solution's derivatives with respect to anything `fn` closes
    over are exact: −J⁻¹ ∂fn/∂θ by the implicit function theorem (`jax.lax.custom_root`).

    **Arguments:**

    - `fn`: callable `x ↦ residual`, the residual with the same total size as `x`.
    - `guess`: the starting point (e.g. the explicit predictor).
    - `rtol`, `atol`: tolerances on the Newton update.
    - `max_iter`: the most iterations.

    **Returns:**

    A `NewtonResult`; `converged` is False when the iteration ran out or produced a
    non-finite value: steps turn it into the status `NEWTON_FAILED`.

    Example:

    ```python
    res = newton_solve(lambda x: x**2 - 2.0, jnp.array([1.0]))
    res.value  # [1.41421356]
    ```
    """
    flat_guess, unravel = ravel_pytree(guess)

    def residual(y):
        return ravel_pytree(fn(unravel(y)))[0]

    def solve(g, y0):
        def cond(carry):
            _, k, done, _ = carry
            return (k < max_iter) & ~done

        def body(carry):
            y, k, _, _ = carry
            r, jac = g(y), jax.jacfwd(g)(y)
            dy = small_solve(jac, r)
            y_new = y - dy
            finite = jnp.all(jnp.isfinite(y_new))
            small = jnp.max(jnp.abs(dy)) <= atol + rtol * jnp.max(jnp.abs(y_new))
            return y_new, k + 1, small | ~finite, finite & small

        init = (y0, jnp.asarray(0), jnp.asarray(False), jnp.asarray(False))
        y, k, _, ok = lax.while_loop(cond, body, init)
        # custom_root differentiates aux too: pass it as floats (zero tangents).
        return y, jnp.stack([ok, k]).astype(y.dtype)

    def tangent_solve(g, b):
        jac = jax.jacfwd(g)(jnp.zeros_like(b))
        return small_solve(jac, b)

    y, aux = lax.custom_root(residual, flat_guess, solve, tangent_solve, has_aux=True)
    aux = lax.stop_gradient(aux)
    return NewtonResult(unravel(y), aux[0] > 0.5, aux[1].astype(jnp.int32))
