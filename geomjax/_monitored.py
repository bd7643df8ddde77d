"""What fields and steps share: the state layout, start checks and monitored quantities.

`geomjax.integrate` runs either a vector field (with a method) or a step map. Both say how
a flat state splits into the pieces carried inside the compiled loop, and both may say
what a run must keep:

- `constraint_residuals(x)`: residuals that vanish on the constraint set S (holonomic
  g(q) and its hidden constraint, nonholonomic constraint momenta J). A start with a
  residual above `start_tol` is reported as `RESULTS.off_constraint_set` at step 0, a
  trajectory whose residual grows above `drift_tol` as `RESULTS.constraint_violation`.
- `invariants(x)`: first integrals the exact flow keeps (energy, extra integrals, the
  levels of second-class constraint functions); a drift above `drift_tol` relative to
  their initial values is reported as `RESULTS.invariant_drift`.
- `at_start(z0)`: the field or step specialised to one run; a feedback field sets its
  target values from the run's own initial state here.
- `quantity_labels(x)`: names of those quantities, for the messages of failed runs
  ("the first integral H drifted by …"): a system's own (`System(..., names=...)`, or
  by kind: "H", "g1", "gdot1", "J1", …), else their indices ("[2]").
"""

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._labels import numbered
from ._validate import known
from .internal.simplify import scalar_graph


#: Default relative tolerance on monitored constraints and first integrals.
DRIFT_TOL = 1e-2
#: Default tolerance on the constraint residuals of the initial state.
START_TOL = 1e-8


def empty_like_state(x):
    """A float array of shape (0,), for "nothing to monitor"."""
    leaf = jax.tree_util.tree_leaves(x)[0]
    return jnp.zeros((0,), leaf.dtype)


class AbstractMonitored(eqx.Module):
    """Base of fields and steps: flat state ↔ pieces, start checks, monitored quantities.

    `simplify` (static, keyword-only, default True): evaluate what this field or step
    derives through its simplified scalar graph (`geomjax.internal.simplify`); False
    evaluates it as derived. Part of the compiled program's key like any static field:
    the two never share a program. `geomjax.internal.simplify.unsimplified(target)`
    turns it off for a target and everything it holds.
    """

    simplify: bool = eqx.field(static=True, default=True, kw_only=True)

    @abc.abstractmethod
    def split(self, x):
        """Flat state → pieces carried in loops."""

    @abc.abstractmethod
    def merge(self, z):
        """Pieces → flat state."""

    @property
    def dim(self) -> int | None:
        """Expected length of the flat state, or None if any length is accepted."""
        return None

    def check(self, x0) -> None:
        """Raise a clear error if the concrete state `x0` cannot start a run (e.g. a
        singular constraint matrix there)."""

    def at_start(self, z0):
        """This field or step, specialised to a run starting at the pieces `z0`."""
        return self

    def constraint_residuals(self, x):
        """Residuals (flat state `x`) that vanish on the constraint set; shape `(r,)`."""
        return empty_like_state(x)

    def invariants(self, x):
        """First integrals of the exact flow at the flat state `x`; shape `(i,)`."""
        return empty_like_state(x)

    def quantity_labels(self, x) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Labels of the entries of `(invariants(x), constraint_residuals(x))`, for messages:
        here their indices, `("[0]", "[1]", …)`; targets built from a system use its names.
        Reads only shapes (`x` may be traced)."""
        spec = jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))
        inv, res = jax.eval_shape(lambda y: (self.invariants(y), self.constraint_residuals(y)), spec)
        return numbered("", inv.shape[0]), numbered("", res.shape[0])

    def monitored(self, x):
        """`(invariants(x), constraint_residuals(x))`, as the driver checks them at every
        save: evaluated through their simplified scalar graph (`geomjax.internal.simplify`),
        which turns their small dot products into scalar arithmetic (under `vmap` a batched
        `dot` of 3-vectors costs many times its arithmetic on the CPU)."""
        return scalar_graph(lambda y: (self.invariants(y), self.constraint_residuals(y)), x, warn=False,
                            enabled=self.simplify)


class AbstractSystemMonitored(AbstractMonitored):
    """Fields and steps built from a system monitor what the system keeps: its constraint
    residuals and its first integrals."""

    system: eqx.AbstractVar[object]

    def constraint_residuals(self, x):
        return self.system.constraint_residuals(x)

    def invariants(self, x):
        return self.system.invariants(x)

    def quantity_labels(self, x):
        labels = getattr(self.system, "quantity_labels", None)  # a System names its own
        return super().quantity_labels(x) if labels is None else labels(x)


@eqx.filter_jit
def _residuals(monitored, x0):
    return monitored.constraint_residuals(x0)


def check_on_constraint_set(monitored, x0, start_tol, residuals=None) -> None:
    """Raise a ValueError if the concrete `x0` is off the constraint set of `monitored` (a
    field, step or system): max |residual| > start_tol·(1 + max|x0|). The one place where
    starts are checked outside jit; inside jit the driver sets `RESULTS.off_constraint_set`
    with the same test. `residuals`: the residuals at x0 if the caller has them already."""
    if start_tol is None:
        return
    res = _residuals(monitored, x0) if residuals is None else residuals
    res, x = known(res), known(x0)
    if res is None or x is None or not res.shape[0]:
        return
    scale = 1.0 + float(np.max(np.abs(x)))
    worst = float(np.max(np.abs(res)))
    if not worst <= start_tol * scale:
        raise ValueError(
            f"x0 is off the constraint set: the largest constraint residual is {worst:.3g} "
            f"(start_tol {start_tol:g} × scale {scale:.3g}); the residuals are the holonomic "
            "constraints g and their velocity constraints, the nonholonomic constraint momenta "
            "J, or the embedding defect of an embedded group (RᵀR − I, cos² + sin² − 1). The "
            "run would follow a different system. Move x0 onto the set first (geomjax.project_holonomic for holonomic constraints, "
            "geomjax.project_nonholonomic for nonholonomic ones), or pass start_tol=None to "
            "integrate from off the set on purpose"
        )
