"""Discrete Lagrange–d'Alembert (DLA) steps for nonholonomic systems on T*Rⁿ.

Two schemes, both derived by autodiff from the Hamiltonian H and the constraint one-forms
ω(q) of a `geomjax.System(H, canonical(n), nonholonomic=omega)`:

**Second order** (`dla(system)`, the default): McLachlan–Perlmutter,
J. Nonlinear Sci. 16 (2006), 283–328, eq. 4.18. One step (q₀, p₀) ↦ (q₁, p₁)
of size h is

    q½ = q₀ + h/2 H_p(q₀, p₀)
    p₁ = p₀ − h/2 [H_q(q½, p₀) + H_q(q½, p₁)] + ω(q½)ᵀ λ
    q₁ = q½ + h/2 H_p(q₁, p₁)
    0  = ω(q₁) H_p(q₁, p₁)

The first line is explicit; the rest is one Newton solve for (q₁, p₁, λ) (2n + k
unknowns) with autodiff Jacobians (`geomjax.Newton`, exact implicit
gradients). The scheme is second order and reversible, keeps the constraint
ω(q)·H_p = 0 at every step to the Newton tolerance, and on reversible problems such as
the contact oscillator keeps the energy error bounded.

**First order** (`dla(system, order=1)`): the explicit DLA integrator of Chang and Perlmutter (2019) §3.7
(eqs. (74)–(85)), reconstructed — the paper's formulas were lost in text extraction, and
what survives ("the map φ given by (74)", L_d = hL∘φ, D_d = φ⁻¹(D), "first-order", solved
explicitly for the oscillator) fixes it as the left-point rule. With φ(q₀, q₁) = (q₀,
(q₁ − q₀)/h), L_d(q₀, q₁) = h L(q₀, (q₁ − q₀)/h) and the discrete constraint set
D_d = {(q₀, q₁): ω(q₀)·(q₁ − q₀) = 0}, the DLA equations at q_k are

    D₂L_d(q_{k−1}, q_k) + D₁L_d(q_k, q_{k+1}) = −ω(q_k)ᵀλ_k,    ω(q_k)·(q_{k+1} − q_k) = 0.

With v_k = (q_{k+1} − q_k)/h, D₁L_d(q_k, q_{k+1}) = hL_q(q_k, v_k) − L_v(q_k, v_k) and
D₂L_d(q_{k−1}, q_k) = L_v(q_{k−1}, v_{k−1}). Taking as the momentum of the state the
Legendre transform of φ(q_k, q_{k+1}), p_k = L_v(q_k, v_k) (so q̇_k = v_k = H_p(q_k, p_k),
and L_q = −H_q at corresponding points), the DLA equations become the one-step map

    q₁ = q₀ + h H_p(q₀, p₀)
    p₁ = p₀ − h H_q(q₁, p₁) + ω(q₁)ᵀλ
    0  = ω(q₁) H_p(q₁, p₁)

— symplectic Euler (drift, then kick) with the constraint force in the kick. The start
(q₀, p₀) is the paper's (87): q₁ = q₀ + h q̇₀. For H = ½pᵀM⁻¹p + U(q) the kick is linear in
(p₁, λ) and the Newton solve ends after its first iteration (the paper solves the same
equations in closed form, its (84)–(85)). The scheme is first order and not symmetric; the
constraint J = ω(q)·H_p(q, p) = 0 holds at every step to the Newton tolerance. (These are the
discrete equations of `geomjax.forced_dla(L, nonholonomic=omega, rule="left")`, which
stores p_k = D₂L_d(q_{k−1}, q_k) = L_v(q_{k−1}, v_{k−1}) instead — the momentum before
the kick at q_k, off the constraint set by O(h): started from (q₁, p₀) it gives the
positions q₂, q₃, … of this step.)
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


class FirstOrderDLA(DiscreteLagrangeDAlembert):
    """Chang and Perlmutter's (2019) first-order DLA step on the pieces (q, p); built by `geomjax.dla(system, order=1)`.

    q₁ = q₀ + h H_p(q₀, p₀); then Newton for (p₁, λ) in p₁ = p₀ − h H_q(q₁, p₁) + ω(q₁)ᵀλ,
    ω(q₁)·H_p(q₁, p₁) = 0 (see the module docstring for the derivation).
    """

    def advance(self, t, z, h, args):
        del t, args
        q0, p0 = z
        h_q = jax.grad(self._energy, argnums=0)
        h_p = jax.grad(self._energy, argnums=1)
        q1 = q0 + h * h_p(q0, p0)
        w1 = self._forms(q1)

        def residual(u):
            p1, lam = u
            r_p = p1 - p0 + h * h_q(q1, p1) - jnp.sum(lam[:, None] * w1, axis=0)
            r_c = jnp.sum(w1 * h_p(q1, p1), axis=1)
            return (r_p, r_c)

        guess = (p0 - h * h_q(q1, p0), jnp.zeros((w1.shape[0],), p0.dtype))
        sol = self.newton.solve(residual, guess)
        p1, _ = sol.value
        return (q1, p1), newton_status(sol.converged)


def dla(
    system: System,
    *,
    order: int = 2,
    newton: Newton | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    max_iter: int | None = None,
) -> DiscreteLagrangeDAlembert:
    """A discrete Lagrange–d'Alembert integrator: McLachlan–Perlmutter's (order 2) or Chang and Perlmutter's (2019) (order 1).

    For a nonholonomic system on T*Rⁿ (`System(H, canonical(n), nonholonomic=omega)`),
    with `order=2` (McLachlan and Perlmutter 2006, eq. 4.18):

    q½ = q₀ + h/2 H_p(q₀, p₀);  p₁ = p₀ − h/2 [H_q(q½, p₀) + H_q(q½, p₁)] + ω(q½)ᵀλ;
    q₁ = q½ + h/2 H_p(q₁, p₁);  ω(q₁)·H_p(q₁, p₁) = 0,

    solved by Newton's method for (q₁, p₁, λ): second order and reversible. With
    `order=1`, Chang and Perlmutter (2019) §3.7's explicit DLA (L_d(q₀, q₁) = hL(q₀, (q₁ − q₀)/h), discrete
    constraint ω(q₀)·(q₁ − q₀) = 0; reconstructed, see the module docstring):

    q₁ = q₀ + h H_p(q₀, p₀);  p₁ = p₀ − h H_q(q₁, p₁) + ω(q₁)ᵀλ;  ω(q₁)·H_p(q₁, p₁) = 0,

    solved for (p₁, λ): first order, not symmetric. Both are derived from H and ω by
    autodiff; in both the constraint holds at every step to the Newton tolerance.

    **Arguments:**

    - `system`: a nonholonomic `geomjax.System` on `geomjax.canonical(n)`.
    - `order`: 2 (McLachlan–Perlmutter, the default) or 1 (Chang and Perlmutter's (2019) scheme).
    - `newton`: a `geomjax.Newton` for the solve (default `Newton()`, a loop).
    - `rtol`, `atol`, `max_iter`: the earlier keywords, mapped onto `newton`.

    **Returns:**

    A step, usable as `step(x, h)` on flat states and by `geomjax.integrate(step, x0, ...)`.

    Example (the nonholonomic oscillator; both keep the constraint p_x + y p_z = 0):

    ```python
    >>> import geomjax
    >>> model = geomjax.models.nonholonomic_oscillator()
    >>> for order in (1, 2):
    ...     sol = geomjax.integrate(geomjax.dla(model.system, order=order), model.x0, dt=0.01, steps=200)
    ...     x, y, z, px, py, pz = sol.xs[-1]
    ...     print(order, bool(abs(px + y * pz) < 1e-10))
    1 True
    2 True

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
    if isinstance(order, bool) or order not in (1, 2):
        raise ValueError(f"order must be 1 (Chang and Perlmutter's (2019) first-order DLA) or 2 (McLachlan–Perlmutter), got {order!r}")
    step = FirstOrderDLA if order == 1 else DiscreteLagrangeDAlembert
    return step(system, as_newton(newton, rtol, atol, max_iter))


#: Long name of `dla`.
discrete_lagrange_dalembert = dla
