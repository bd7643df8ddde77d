"""Explicit Runge–Kutta steps from Butcher tableaux, on states given in pieces."""

import equinox as eqx
import jax

from ._field import AbstractField, as_field
from ._step import FieldStep, ok_status


class ButcherTableau(eqx.Module):
    """An explicit Butcher tableau (a strictly lower triangular), with its classical order."""

    a: tuple = eqx.field(static=True)
    b: tuple = eqx.field(static=True)
    order: int = eqx.field(static=True)


EULER = ButcherTableau(a=((),), b=(1.0,), order=1)
HEUN = ButcherTableau(a=((), (1.0,)), b=(0.5, 0.5), order=2)
MIDPOINT = ButcherTableau(a=((), (0.5,)), b=(0.0, 1.0), order=2)
KUTTA3 = ButcherTableau(a=((), (0.5,), (-1.0, 2.0)), b=(1 / 6, 2 / 3, 1 / 6), order=3)
RK4 = ButcherTableau(a=((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)), b=(1 / 6, 1 / 3, 1 / 3, 1 / 6), order=4)


def _combine(z, h, coeffs, ks):
    terms = [(c, k) for c, k in zip(coeffs, ks) if c != 0.0]
    if not terms:
        return z

    def leaf(zl, *kl):
        acc = terms[0][0] * kl[0]
        for (c, _), kk in zip(terms[1:], kl[1:]):
            acc = acc + c * kk
        return zl + h * acc

    return jax.tree_util.tree_map(leaf, z, *[k for _, k in terms])


class ExplicitRungeKutta(FieldStep):
    """z_{n+1} = z_n + h Σ b_i k_i, k_i = X(z_n + h Σ_j a_ij k_j), for a field X.

    Works on the field's pieces (for T*Rⁿ the pair (q, p)), so the loop carries no flat
    concatenations. Explicit methods are autonomous here: fields are x ↦ ẋ.
    """

    field: AbstractField
    tableau: ButcherTableau

    def advance(self, z, h):
        ks = []
        for row in self.tableau.a:
            ks.append(self.field.rhs(_combine(z, h, row, ks)))
        return _combine(z, h, self.tableau.b, ks), ok_status()


def explicit_rk(field, tableau: ButcherTableau) -> ExplicitRungeKutta:
    """Build an explicit Runge–Kutta step for `field` (a geomjax field or a callable x ↦ ẋ).

    Example: `geomjax.explicit_rk(geomjax.dirac_field(system), geomjax.RK4)(x, 0.01)`.
    """
    return ExplicitRungeKutta(as_field(field), tableau)
