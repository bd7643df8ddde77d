"""Explicit Runge–Kutta steps from Butcher tableaux, on states given in pieces."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._field.base import AbstractField, SystemField, as_field, tree_axpy
from .base import FieldStep, ok_status


class ButcherTableau(eqx.Module):
    """An explicit Butcher tableau (a strictly lower triangular), with its classical order."""

    a: tuple = eqx.field(static=True)
    b: tuple = eqx.field(static=True)
    order: int = eqx.field(static=True)

    @property
    def stages(self) -> int:
        return len(self.b)

    def matrix(self):
        """The coefficients as a dense `(s, s)` array (zero above the diagonal)."""
        a = np.zeros((self.stages, self.stages))
        for i, row in enumerate(self.a):
            a[i, : len(row)] = row
        return a


EULER = ButcherTableau(a=((),), b=(1.0,), order=1)
HEUN = ButcherTableau(a=((), (1.0,)), b=(0.5, 0.5), order=2)
MIDPOINT = ButcherTableau(a=((), (0.5,)), b=(0.0, 1.0), order=2)
KUTTA3 = ButcherTableau(a=((), (0.5,), (-1.0, 2.0)), b=(1 / 6, 2 / 3, 1 / 6), order=3)
RK4 = ButcherTableau(a=((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)), b=(1 / 6, 1 / 3, 1 / 3, 1 / 6), order=4)


def _weighted(z, h, weights, ks):
    """z + h Σ_i weights_i k_i, with the stage derivatives stacked along axis 0 of `ks`."""

    def leaf(zl, kl):
        return zl + h * jnp.tensordot(jnp.asarray(weights, kl.dtype), kl, axes=1)

    return jax.tree_util.tree_map(leaf, z, ks)


#: Derived fields of at most this many operations (as simplified) have their stages
#: written out; larger ones run the stages in a loop over one field evaluation. With RK4
#: on feedback fields, the spherical pendulum (about 90 operations) runs faster written
#: out, a chain of 2 links (307 operations) runs and compiles faster looped
#: (`benchmarks/chain_scaling.py`, `benchmarks/derived_vs_hand.py`).
WRITTEN_OUT_MAX_OPERATIONS = 200


def _operation_count(jaxpr) -> int:
    return sum(1 + sum(_operation_count(sub) for sub in jax.extend.core.jaxprs_in_params(e.params)) for e in jaxpr.eqns)


class ExplicitRungeKutta(FieldStep):
    """z_{n+1} = z_n + h Σ b_i k_i, k_i = X(z_n + h Σ_j a_ij k_j), for a field X.

    Works on the field's pieces (for T*Rⁿ the pair (q, p)), so the loop carries no flat
    concatenations. For a field derived from a `System`, whose `rhs` is a simplified
    scalar graph (`geomjax.internal.simplify`), the stages are written out when the field
    is small (`WRITTEN_OUT_MAX_OPERATIONS`), and looped otherwise. For plain
    callables the stages run in a `lax.fori_loop` whose body holds one field evaluation:
    written out as array code, XLA's CPU backend compiled RK4 into a body with several
    times the kernels, and ran slower. Fields are autonomous: x ↦ ẋ.

    The looped stages of a derived field are each under `jax.checkpoint`: reverse mode
    then keeps a stage's input, not one stacked array per intermediate scalar of the
    field, and recomputes the stage when it transposes it (`benchmarks/tuning.py`, the
    double pendulum's feedback RK4: a tuning iteration 1.3–1.4× faster at B = 256–4096,
    the same derivatives; the forward run is unchanged). Plain callables keep their
    residuals: a small array-code field ran 1.1–1.2× slower in reverse mode with the
    stages checkpointed.
    """

    field: AbstractField
    tableau: ButcherTableau

    def advance(self, t, z, h, args):
        field = self._rhs(args)
        layout = self._layout(t, z, field)
        if layout == "written out":
            return self._written_out(t, z, h, field), ok_status()
        return self._looped(t, z, h, field, checkpoint_stages=layout == "checkpointed"), ok_status()

    def stage_layout(self, t, z, args=None) -> str:
        """How `advance` runs the stages at the state `z` (pieces): `"written out"` (one
        stage, or a derived field of at most `WRITTEN_OUT_MAX_OPERATIONS` operations),
        `"checkpointed"` (a larger derived field: a loop, each stage under
        `jax.checkpoint`) or `"looped"` (a plain callable).

        Example:

        ```python
        >>> import geomjax
        >>> chain = geomjax.models.planar_chain(2, gravity=9.81)
        >>> rk4 = geomjax.explicit_rk(geomjax.feedback_field(chain.system, chain.x0, 2.0), geomjax.RK4)
        >>> rk4.stage_layout(0.0, rk4.split(chain.x0))
        'checkpointed'

        ```
        """
        return self._layout(t, z, self._rhs(args))

    def _rhs(self, args):
        def field(time, state):
            return self.field.rhs(time, state, args)

        if self.tableau.stages > 1 and isinstance(self.field, SystemField):
            # One trace of the field for all stages: a jitted closure is traced once per
            # state shape, also inside another trace (the chain of 8 links, feedback RK4:
            # lowering the run takes a fraction of the time); XLA inlines the calls.
            # Concrete arrays of the field stay constants of the trace, as without the jit.
            return jax.jit(field)
        return field

    def _layout(self, t, z, field) -> str:
        if self.tableau.stages == 1:
            return "written out"
        if not isinstance(self.field, SystemField):
            return "looped"
        small = _operation_count(jax.make_jaxpr(field)(t, z).jaxpr) <= WRITTEN_OUT_MAX_OPERATIONS
        return "written out" if small else "checkpointed"

    def _written_out(self, t, z, h, field):
        def combine(coeffs, ks):
            out = z
            for coeff, k in zip(coeffs, ks):
                if coeff:
                    out = tree_axpy(h * coeff, k, out)
            return out

        ks = []
        for row in self.tableau.a:
            ks.append(field(t + sum(row) * h, combine(row, ks)))
        return combine(self.tableau.b, ks)

    def _looped(self, t, z, h, field, checkpoint_stages=False):
        tab = self.tableau
        a = jnp.asarray(tab.matrix(), dtype=jax.tree_util.tree_leaves(z)[0].dtype)
        c = a.sum(axis=1)
        ks = jax.tree_util.tree_map(lambda leaf: jnp.zeros((tab.stages,) + leaf.shape, leaf.dtype), z)

        def stage(i, ks):
            k = field(t + c[i] * h, _weighted(z, h, a[i], ks))
            return jax.tree_util.tree_map(lambda stack, new: stack.at[i].set(new), ks, k)

        if checkpoint_stages:
            stage = jax.checkpoint(stage, prevent_cse=False)  # inside a loop: no barrier needed
        ks = lax.fori_loop(0, tab.stages, stage, ks)
        return _weighted(z, h, tab.b, ks)


def explicit_rk(field, tableau: ButcherTableau) -> ExplicitRungeKutta:
    """Build an explicit Runge–Kutta step for `field` (a geomjax field or a callable x ↦ ẋ).

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum()
    >>> rk4 = geomjax.explicit_rk(geomjax.dirac_field(model.system), geomjax.RK4)
    >>> rk4(model.x0, 0.01).shape
    (6,)

    ```
    """
    return ExplicitRungeKutta(as_field(field), tableau)
