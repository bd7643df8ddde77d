"""Contact Hamiltonian splitting integrators for H = T(p) + V(q, t) + f(t)s.

Bravetti, Seri, Vermeeren and Zadra (Celest. Mech. Dyn. Astr. 132 (2020) 7) split a
contact Hamiltonian of this form into three pieces whose contact flows are exact:

- A = T(p):     q ← q + τ∇T(p),   p ← p,            s ← s + τ(p·∇T(p) − T(p));
- B = V(q, t):  q ← q,            p ← p − τ∇V(q, t), s ← s − τV(q, t);
- C = f(t)s:    q ← q,            p ← e^{−τf(t)}p,   s ← e^{−τf(t)}s,

(each from q̇ = ∂H/∂p, ṗ = −∂H/∂q − p∂H/∂s, ṡ = p·∂H/∂p − H; ∇T, ∇V by autodiff). Time is
a coordinate advanced by the kinetic flow A only (the autonomised Hamiltonian has the
conjugate of t in its A part), so B and C act at the time A has reached. The symmetric
composition

    Φ_h = C_{h/2} ∘ B_{h/2} ∘ A_h ∘ B_{h/2} ∘ C_{h/2}     (B, C at t, then at t + h)

is of order 2; compositions of it with Yoshida's coefficients give orders 4 (triple jump)
and 6 (Yoshida 1990, "solution A", 7 stages). Every piece is a contact flow, so the
composition is a conformally contact map, whatever its order.
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

from .._system.contact import check_flat_contact_state, merge_contact, split_contact
from .base import AbstractStep, ok_status

#: Yoshida (1990) solution A for order 6: w₁, w₂, w₃; w₀ = 1 − 2(w₁ + w₂ + w₃).
_YOSHIDA6 = (-1.17767998417887, 0.235573213359357, 0.784513610477560)


def _coefficients(order: int) -> tuple[float, ...]:
    if order == 2:
        return (1.0,)
    if order == 4:
        root = 2.0 ** (1.0 / 3.0)
        g = 1.0 / (2.0 - root)
        return (g, 1.0 - 2.0 * g, g)
    w1, w2, w3 = _YOSHIDA6
    w0 = 1.0 - 2.0 * (w1 + w2 + w3)
    return (w3, w2, w1, w0, w1, w2, w3)


def _half_kinetic(p):
    return 0.5 * jnp.sum(p * p)


class ContactSplittingStep(AbstractStep):
    """The splitting step of H = T(p) + V(q, t) + f(t)s on (q, p, s); built by
    `geomjax.contact_splitting`."""

    potential: Callable
    damping: Callable | None
    kinetic: Callable | None
    order: int = eqx.field(static=True)

    def split(self, x):
        return split_contact(x, (x.shape[0] - 1) // 2)

    def merge(self, z):
        return merge_contact(z)

    def check(self, x0) -> None:
        check_flat_contact_state(x0, None, "geomjax.contact_splitting")
        jax.eval_shape(lambda x: self(x, 0.1), x0)

    def _kinetic(self, p):
        return _half_kinetic(p) if self.kinetic is None else self.kinetic(p)

    def _flow_a(self, z, tau):
        q, p, s = z
        t_val, grad_t = jax.value_and_grad(self._kinetic)(p)
        return q + tau * grad_t, p, s + tau * (jnp.sum(p * grad_t) - t_val)

    def _flow_b(self, z, tau, t):
        q, p, s = z
        v, grad_v = jax.value_and_grad(self.potential)(q, t)
        return q, p - tau * grad_v, s - tau * v

    def _flow_c(self, z, tau, t):
        if self.damping is None:
            return z
        q, p, s = z
        factor = jnp.exp(-tau * self.damping(t))
        return q, factor * p, factor * s

    def _symmetric(self, z, t, h):
        half = 0.5 * h
        z = self._flow_c(z, half, t)
        z = self._flow_b(z, half, t)
        z = self._flow_a(z, h)
        z = self._flow_b(z, half, t + h)
        return self._flow_c(z, half, t + h)

    def advance(self, t, z, h, args):
        del args
        for c in _coefficients(self.order):
            z = self._symmetric(z, t, c * h)
            t = t + c * h
        return z, ok_status()


def contact_splitting(
    potential: Callable,
    damping: Callable | None = None,
    *,
    kinetic: Callable | None = None,
    order: int = 2,
) -> ContactSplittingStep:
    """Splitting integrators for the contact Hamiltonian H = T(p) + V(q, t) + f(t)s.

    The contact flows of A = T(p), B = V(q, t) and C = f(t)s are exact (∇T, ∇V by
    autodiff): A moves q by τ∇T and s by τ(p·∇T − T), B kicks p by −τ∇V and s by −τV, C
    scales p and s by e^{−τf}. Time advances with A only. `order=2` is the symmetric
    C_{h/2}B_{h/2}A_hB_{h/2}C_{h/2}; `order=4` its triple jump and `order=6` Yoshida's
    7-stage composition (Bravetti–Seri–Vermeeren–Zadra 2020). Explicit, and conformally
    contact: φ*(ds − p·dq) = ρ (ds − p·dq).

    For f = α constant and V = V(q) this is the damped mechanical system q̈ = −∇V − αq̇
    with the Herglotz Lagrangian L = T*(q̇) − V − αz (the same motion as
    `geomjax.herglotz`); a time-dependent f(t) or V(q, t) adds variable damping or forcing.

    **Arguments:**

    - `potential`: `(q, t) ↦ V(q, t)`, a scalar (q of shape `(n,)`).
    - `damping`: optional `t ↦ f(t)`, a scalar (default: none).
    - `kinetic`: optional `p ↦ T(p)` (default |p|²/2).
    - `order`: 2, 4 or 6.

    **Returns:**

    A step for `geomjax.integrate` on flat states x = (q, p, s) of length 2n + 1.

    Example (a damped, periodically forced oscillator; energy decay of the unforced one):

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> step = geomjax.contact_splitting(lambda q, t: 0.5 * q @ q, lambda t: 0.1, order=4)
    >>> sol = geomjax.integrate(step, jnp.array([1.0, 0.0, 0.0]), dt=0.1, steps=100)
    >>> q, p, s = sol.xs[-1]
    >>> bool(abs((0.5 * p**2 + 0.5 * q**2 + 0.1 * s) / (0.5 * jnp.exp(-1.0)) - 1) < 1e-5)
    True

    ```
    """
    if not callable(potential):
        raise TypeError(f"potential must be a callable (q, t) ↦ V, got {type(potential).__name__}")
    for name, fn in (("damping", damping), ("kinetic", kinetic)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be a callable, got {type(fn).__name__}")
    if isinstance(order, bool) or order not in (2, 4, 6):
        raise ValueError(f"order must be 2, 4 or 6, got {order!r}")
    return ContactSplittingStep(potential, damping, kinetic, order)
