"""Explicit Adams–Bashforth multistep methods, with their starter.

The k-step Adams–Bashforth method for ẋ = X(x),

    x_{n+1} = x_n + h Σ_{j=0}^{k−1} β_j X(x_{n−j}),

integrates the interpolating polynomial of the last k slopes over [t_n, t_{n+1}]; it is
of order k and costs one field evaluation per step. The coefficients are computed from
that definition (exact rationals), not typed in: AB3 has β = (23, −16, 5)/12.

The loop carries (x_n, X(x_{n−1}), …, X(x_{n−k+1})). A run starts from x₀ alone: the
step's `start` computes x_{−1}, …, x_{−k+1} by backward steps of classical RK4 (local
error O(h⁵), below AB-k's for k ≤ 4) and their slopes, so that `geomjax.integrate`
takes x₀ and saves x_n like any one-step method. Salnikov and Hamdouni's (2019) Table I compares AB3 on the
pendulum; here it runs on any geomjax field (e.g. the Dirac field of a constrained
system, the index-reduced ODE).
"""

from fractions import Fraction

import equinox as eqx
import numpy as np

from .._field.base import AbstractField, as_field, tree_axpy
from .base import FieldStep, ok_status
from .methods import register_method
from .runge_kutta import RK4, ExplicitRungeKutta


def adams_bashforth_coefficients(k: int) -> tuple[Fraction, ...]:
    """β_0 … β_{k−1} of the k-step Adams–Bashforth method, as exact fractions.

    β_j = ∫₀¹ ℓ_j(s) ds with ℓ_j the Lagrange basis polynomial through the nodes
    s = 0, −1, …, −(k−1) that is 1 at s = −j.

    Example:

    ```python
    >>> from geomjax._step.multistep import adams_bashforth_coefficients
    >>> [str(b) for b in adams_bashforth_coefficients(3)]
    ['23/12', '-4/3', '5/12']

    ```
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"the number of steps k must be an integer >= 1, got {k!r}")
    nodes = [Fraction(-j) for j in range(k)]
    out = []
    for j in range(k):
        # ℓ_j as polynomial coefficients (lowest degree first), then integrated over [0, 1].
        poly = [Fraction(1)]
        for i in range(k):
            if i == j:
                continue
            denom = nodes[j] - nodes[i]
            new = [Fraction(0)] * (len(poly) + 1)
            for d, c in enumerate(poly):
                new[d + 1] += c / denom
                new[d] -= c * nodes[i] / denom
            poly = new
        out.append(sum(c / (d + 1) for d, c in enumerate(poly)))
    return tuple(out)


class AdamsBashforth(FieldStep):
    """The k-step Adams–Bashforth step for a field; built by `geomjax.adams_bashforth`.

    Pieces in the loop: `(z_n, (X(z_{n−1}), …, X(z_{n−k+1})))`, set up by `start`.
    """

    field: AbstractField
    steps: int = eqx.field(static=True)

    @property
    def coefficients(self) -> np.ndarray:
        return np.asarray([float(b) for b in adams_bashforth_coefficients(self.steps)])

    @property
    def carries_history(self) -> bool:
        return self.steps > 1

    def merge(self, z):
        return self.field.merge(z[0] if self.steps > 1 else z)

    def start(self, t0, z0, h, args):
        if self.steps == 1:
            return z0
        starter = ExplicitRungeKutta(self.field, RK4)
        slopes, z = [], z0
        for j in range(1, self.steps):
            z, _ = starter.advance(t0 - (j - 1) * h, z, -h, args)
            slopes.append(self.field.rhs(t0 - j * h, z, args))
        return (z0, tuple(slopes))

    def advance(self, t, z, h, args):
        beta = self.coefficients
        if self.steps == 1:
            return tree_axpy(h * beta[0], self.field.rhs(t, z, args), z), ok_status()
        x, past = z
        slope = self.field.rhs(t, x, args)
        out = tree_axpy(h * beta[0], slope, x)
        for b, f in zip(beta[1:], past):
            out = tree_axpy(h * b, f, out)
        return (out, (slope,) + tuple(past[:-1])), ok_status()


def adams_bashforth(field, steps: int = 3) -> AdamsBashforth:
    """The explicit k-step Adams–Bashforth method (order k) for a field, with an RK4 starter.

    x_{n+1} = x_n + h Σ_j β_j X(x_{n−j}) (`adams_bashforth_coefficients`); one field
    evaluation per step. `geomjax.integrate(field, x0, method="ab3")` is
    `geomjax.integrate(geomjax.adams_bashforth(field, 3), x0)`; "ab2" and "ab4" too.

    **Arguments:**

    - `field`: a geomjax field or a callable x ↦ ẋ.
    - `steps`: k ≥ 1 (k = 1 is explicit Euler).

    Example (ẋ = −x: third order, so 1000 steps over t ∈ [0, 1] give e⁻¹ to ~1e−10):

    ```python
    >>> import jax.numpy as jnp, geomjax
    >>> sol = geomjax.integrate(lambda x: -x, jnp.array([1.0]), dt=1e-3, steps=1000, method="ab3")
    >>> bool(abs(sol.xs[-1, 0] - jnp.exp(-1.0)) < 1e-9)
    True

    ```
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps (k of the k-step method) must be an integer >= 1, got {steps!r}")
    return AdamsBashforth(as_field(field), steps)


for _k in (2, 3, 4):
    register_method(f"ab{_k}", lambda f, k=_k: adams_bashforth(f, k), _k)
