"""Fixed-point iteration for the stage equations of implicit steps, with a Newton fallback.

The stages of an implicit Runge–Kutta step solve Z = Φ(Z), Φ(Z) = h (A⊗I) X(x + Z). For a
non-stiff field (h‖∂X/∂x‖‖A‖ < 1) the iteration Z ← Φ(Z) contracts and needs no
Jacobian and no linear algebra: each sweep is s field evaluations. Hairer, Lubich and
Wanner (Geometric Numerical Integration, VIII.6) recommend it for symplectic Gauss
methods on non-stiff problems. Where it does not contract (a stiff field, a large step)
the caller's Newton solve takes over from the same starting guess.

Derivatives never go through the iterations: the solution is a `lax.custom_root` of the
residual Z − Φ(Z), differentiated by the implicit function theorem with the exact Jacobian,
whichever iteration found it.
"""

from collections.abc import Callable

import equinox as eqx
import jax.numpy as jnp
from jax import lax
from jax.flatten_util import ravel_pytree

from .newton import NewtonResult, tangent_solve

#: Stage solvers of implicit steps.
SOLVERS = ("auto", "fixed_point", "newton")


class FixedPoint(eqx.Module):
    """Settings of the fixed-point iteration: stop when the update is within
    `atol + rtol·|Z|_∞` (both ≥ 0, not both 0), give up after `max_steps` sweeps or as
    soon as an update is no smaller than the one before it (after `patience` sweeps):
    the iteration does not contract there.

    Example:

    ```python
    >>> import jax.numpy as jnp
    >>> from geomjax._solve.fixed_point import FixedPoint
    >>> res = FixedPoint().solve(lambda z: 0.5 * jnp.cos(z), jnp.array([0.0]))
    >>> print(f"{float(res.value[0]):.12f}", bool(res.converged))
    0.450183611295 True
    >>> bool(FixedPoint().solve(lambda z: 3.0 * jnp.cos(z), jnp.array([0.0])).converged)
    False

    ```
    """

    rtol: float = eqx.field(static=True, default=1e-15)
    atol: float = eqx.field(static=True, default=1e-15)
    max_steps: int = eqx.field(static=True, default=40)
    patience: int = eqx.field(static=True, default=3)

    def __check_init__(self):
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value >= 0.0 or value == float("inf"):
                raise ValueError(f"FixedPoint {name} must be a finite number >= 0, got {value!r}")
        if self.rtol == 0.0 and self.atol == 0.0:
            raise ValueError("FixedPoint needs rtol > 0 or atol > 0 to stop")
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise ValueError(f"FixedPoint max_steps must be an integer >= 1, got {self.max_steps!r}")

    def solve(self, phi: Callable, guess, *, fallback: Callable | None = None, carried=()) -> NewtonResult:
        """Solve Z = Φ(Z) by Z ← Φ(Z), for `phi` = Φ (a map of pytrees like `guess`).

        The root is that of the residual Z − Φ(Z), and derivatives go through it (implicit
        function theorem), not through the sweeps. `fallback(guess, *carried) ↦ (value,
        converged)`: run where the iteration failed (a
        non-contracting or non-finite iteration, or `max_steps` spent), from `guess`; in a
        loop that runs at most once, so under `vmap` it costs nothing unless a member needs
        it. Whatever the fallback computes from values other than its arguments is
        loop-invariant, and XLA would hoist it out of that loop (computing it every time):
        pass such values (the state a Jacobian is taken at) as `carried`. Returns a
        `NewtonResult` (`iterations`: the fixed-point sweeps).
        """
        flat_guess, unravel = ravel_pytree(guess)

        def flat_phi(y):
            return ravel_pytree(phi(unravel(y)))[0]

        def flat_residual(y):
            return y - flat_phi(y)

        def iterate(_, y0):
            # Sweeps of Φ itself (one vector operation fewer per sweep than y − residual(y)).
            def cond(c):
                _, k, done, _, _ = c
                return (k < self.max_steps) & ~done

            def body(c):
                y, k, _, _, previous = c
                y_new = flat_phi(y)
                size = jnp.max(jnp.abs(y_new - y))  # NaN or inf when y_new is not finite
                small = size <= self.atol + self.rtol * jnp.max(jnp.abs(y_new))
                # not contracting (or not finite: NaN compares false)
                stalled = (k >= self.patience) & ~(size < previous)
                return y_new, k + 1, small | stalled, small, size

            start = (y0, jnp.asarray(0), jnp.asarray(False), jnp.asarray(False), jnp.asarray(jnp.inf, y0.dtype))
            y, k, _, ok, _ = lax.while_loop(cond, body, start)
            if fallback is not None:
                # From the guess, not from where the iteration stopped (it may have diverged).
                def again(c):
                    _, _, _, start, inputs = c
                    value, converged = fallback(unravel(start), *inputs)
                    # What leaves the body unchanged is loop-invariant to XLA, and so would be
                    # all the fallback computes from it: passed through a barrier, it is not.
                    start, inputs = lax.optimization_barrier((start, inputs))
                    return ravel_pytree(value)[0], jnp.asarray(converged), jnp.asarray(True), start, inputs

                init = (y, ok, jnp.asarray(False), y0, tuple(carried))
                y, ok, *_ = lax.while_loop(lambda c: ~c[1] & ~c[2], again, init)
            return y, jnp.stack([ok, k]).astype(y.dtype)

        y, aux = lax.custom_root(flat_residual, flat_guess, iterate, tangent_solve, has_aux=True)
        aux = lax.stop_gradient(aux)
        return NewtonResult(unravel(y), aux[0] > 0.5, aux[1].astype(jnp.int32))
