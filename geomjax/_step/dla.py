"""McLachlan–Perlmutter discrete Lagrange–d'Alembert step for nonholonomic systems on T*Rⁿ.

J. Nonlinear Sci. 16 (2006) 283–328, eq. 4.18. With ω(q) the constraint
one-forms, one step (q₀, p₀) ↦ (q₁, p₁) of size h is

    q½ = q₀ + h/2 H_p(q₀, p₀)
    p₁ = p₀ − h/2 [H_q(q½, p₀) + H_q(q½, p₁)] + ω(q½)ᵀ λ
    q₁ = q½ + h/2 H_p(q₁, p₁)
    0  = ω(q₁) H_p(q₁, p₁)

The first line is explicit; the rest is one Newton solve for (q₁, p₁, λ) (2n + k
unknowns) with autodiff Jacobians (`geomjax.Newton`, exact implicit
gradients). The scheme is second order and reversible, keeps the constraint
ω(q)·H_p = 0 at every step to the Newton tolerance, and on reversible problems such as
the contact oscillator keeps the energy error bounded.
"""

import jax
import jax.numpy as jnp

from .._solve.newton import Newton, as_newton
from .base import SystemStep, newton_status
from .._system.nonholonomic import check_matrix, one_forms
from .._system.structures import CanonicalStructure
from .._system.system import NonholonomicSystem, System


class DiscreteLagrangeDAlembert(SystemStep):
    """The McLachlan–Perlmutter DLA step on the pieces (q, p); built by `geomjax.dla(system)`.

    `advance(t, z, h, args)` returns `(z_next, status)`, status `RESULTS.newton_failed` when the implicit
    solve did not converge (then `geomjax.integrate` reports the step).
    """

    system: System
    newton: Newton = Newton()

    def check(self, x0) -> None:
        check_matrix(self.system, x0)

    def _energy(self, q, p):
        return self.system.structure.evaluate(self.system.hamiltonian, (q, p))

    def _forms(self, q):
        return one_forms(self.system, q)

    def advance(self, t, z, h, args):
        del t, args
        q0, p0 = z
        h_q = jax.grad(self._energy, argnums=0)
        h_p = jax.grad(self._energy, argnums=1)
        half = 0.5 * h
        q_half = q0 + half * h_p(q0, p0)
        kick0 = h_q(q_half, p0)
        w_half = self._forms(q_half)
        k = w_half.shape[0]

        # ωᵀλ and ω·v as elementwise products and sums: DLA steps of the knife edge and
        # the nonholonomic oscillator run faster this way than with `@` (a dot that does
        # not fuse on the CPU).
        def residual(u):
            q1, p1, lam = u
            r_p = p1 - p0 + half * (kick0 + h_q(q_half, p1)) - jnp.sum(lam[:, None] * w_half, axis=0)
            v1 = h_p(q1, p1)
            r_q = q1 - q_half - half * v1
            r_c = jnp.sum(self._forms(q1) * v1, axis=1)
            return (r_q, r_p, r_c)

        p_guess = p0 - h * kick0
        q_guess = q_half + half * h_p(q_half, p_guess)
        guess = (q_guess, p_guess, jnp.zeros((k,), p0.dtype))
        sol = self.newton.solve(residual, guess)
        q1, p1, _ = sol.value
        status = newton_status(sol.converged)
        return (q1, p1), status


def dla(
    system: System,
    *,
    newton: Newton | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    max_iter: int | None = None,
) -> DiscreteLagrangeDAlembert:
    """The discrete Lagrange–d'Alembert integrator of McLachlan and Perlmutter (2006, eq. 4.18).

    For a nonholonomic system on T*Rⁿ (`System(H, canonical(n), nonholonomic=omega)`):

    q½ = q₀ + h/2 H_p(q₀, p₀);  p₁ = p₀ − h/2 [H_q(q½, p₀) + H_q(q½, p₁)] + ω(q½)ᵀλ;
    q₁ = q½ + h/2 H_p(q₁, p₁);  ω(q₁)·H_p(q₁, p₁) = 0,

    derived from H and ω by autodiff and solved by Newton's method for (q₁, p₁, λ).
    Second order; the constraint holds at every step to the Newton tolerance.

    **Arguments:**

    - `system`: a nonholonomic `geomjax.System` on `geomjax.canonical(n)`.
    - `newton`: a `geomjax.Newton` for the solve (default `Newton()`, a loop).
    - `rtol`, `atol`, `max_iter`: the earlier keywords, mapped onto `newton`.

    **Returns:**

    A step, usable as `step(x, h)` on flat states and by `geomjax.integrate(step, x0, ...)`.

    Example:

    ```python
    model = geomjax.models.nonholonomic_oscillator()
    sol = geomjax.integrate(geomjax.dla(model.system), model.x0, dt=0.05, steps=2000)
    ```
    """
    if not isinstance(system, System):
        raise TypeError(f"dla needs a geomjax.System, got {type(system).__name__}")
    if not isinstance(system, NonholonomicSystem):
        raise ValueError("dla needs a System with nonholonomic=omega")
    if not isinstance(system.structure, CanonicalStructure):
        raise ValueError(
            "dla is defined on T*Rⁿ (geomjax.canonical(n)); for Lie groups integrate the "
            "feedback or extended field instead"
        )
    return DiscreteLagrangeDAlembert(system, as_newton(newton, rtol, atol, max_iter))


#: Long name of `dla`.
discrete_lagrange_dalembert = dla
