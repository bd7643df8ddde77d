"""Pure step maps x_{k+1} = Φ_h(x_k), with a status flowing out of each step."""

import abc
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

from .._monitored import AbstractMonitored, AbstractSystemMonitored
from .._status import RESULTS
from .._validate import _TRACE_ERRORS, untraceable_message

#: Status of a step that did not fail (kept for older code; `geomjax.RESULTS.successful`).
SUCCESS = RESULTS.successful
NEWTON_FAILED = RESULTS.newton_failed


class AbstractStep(AbstractMonitored):
    """A one-step method Φ_h: `step(x, h)` on flat states, `advance(t, z, h, args)` on pieces.

    `advance` returns `(z_next, result)` with `result` a `geomjax.RESULTS` item
    (`RESULTS.successful`, or e.g. `RESULTS.newton_failed` when an implicit solve did not
    converge); `geomjax.integrate` records the first failing step. Subclasses also give
    `split`/`merge` (flat ↔ pieces).
    """

    @abc.abstractmethod
    def advance(self, t, z, h, args):
        """One step of size `h` from time `t` and pieces `z`: returns `(z_next, result)`."""

    @property
    def carries_history(self) -> bool:
        """True for a multistep method (its loop pieces hold past values)."""
        return False

    def fast_variant(self) -> "AbstractStep":
        """The step the driver's fast loop runs (`geomjax.integrate`): the same map where
        it succeeds, allowed to report a failure where this step would recover at a
        cost (an implicit step's Newton fallback). A block where it fails is recomputed
        with `self`, so the results and statuses are this step's. Default: `self`."""
        return self

    def start(self, t0, z0, h, args):
        """The loop carry at the start of a run from the pieces `z0`: `z0` itself for a
        one-step method; a multistep method adds the history its starter computes."""
        return z0

    def __call__(self, x, h, t=0.0, args=None):
        z, _ = self.advance(t, self.start(t, self.split(x), h, args), h, args)
        return self.merge(z)

    # The driver's two operations on whole states in pieces. A batch of runs
    # (`geomjax.sweep`) overrides them to act member by member.
    def state_sum(self, z):
        """The sum of every entry of the pieces `z` (non-finite exactly when an entry is);
        small pieces as written-out scalars, which XLA fuses into the step instead of
        launching a reduction per step."""
        return written_out_sum(z, lambda leaf: leaf.reshape(-1), lambda x: jnp.sum(x))

    def state_select(self, keep, new, old):
        """`new` where `keep`, else `old` (pieces)."""
        return jax.tree_util.tree_map(lambda a, b: jnp.where(keep, a, b), new, old)


def written_out_sum(z, rows, total):
    """Σ over the entries of each leaf's `rows(leaf)` (a leading axis of entries), as a chain
    of additions when there are at most 8 of them, else `total(rows)`; summed over leaves."""
    out = None
    for leaf in jax.tree_util.tree_leaves(z):
        r = rows(leaf)
        if r.shape[0] == 0:  # an empty piece (say, a solver's unused factor) adds nothing
            continue
        if r.shape[0] <= 8:
            part = r[0]
            for i in range(1, r.shape[0]):
                part = part + r[i]
        else:
            part = total(r)
        out = part if out is None else out + part
    return out


def ok_status():
    return RESULTS.successful


def newton_status(converged):
    """`successful` where the Newton solve converged, else `newton_failed` (vmap-safe)."""
    return RESULTS.where(jnp.asarray(converged), RESULTS.successful, RESULTS.newton_failed)


class FunctionStep(AbstractStep):
    """A user's pure step function `x_next = step(x, h)` on flat states.

    With `time_dependent=True` the function is `step(t, x, h, args)`.

    Example:

    ```python
    >>> import jax.numpy as jnp, geomjax
    >>> halve = geomjax.FunctionStep(lambda x, h: x * (1.0 - h))
    >>> geomjax.integrate(halve, jnp.array([1.0]), dt=0.5, steps=2).xs[-1]
    Array([0.25], dtype=float64)

    ```
    """

    fn: Callable
    time_dependent: bool = eqx.field(static=True, default=False)

    def split(self, x):
        return x

    def merge(self, z):
        return z

    def advance(self, t, z, h, args):
        out = self.fn(t, z, h, args) if self.time_dependent else self.fn(z, h)
        return out, ok_status()

    def check(self, x0) -> None:
        h = jnp.ones((), x0.dtype)
        call = "step(t, x, h, args)" if self.time_dependent else "step(x, h)"
        try:
            out = jax.eval_shape(lambda x: self.advance(h, x, h, None)[0], x0)
        except _TRACE_ERRORS as err:
            raise TypeError(untraceable_message("the step function", err)) from err
        except TypeError as err:
            raise TypeError(
                f"the step function could not be called as {call}: {err}. A step maps "
                "(x, h) to the next state; for a vector field x ↦ ẋ pass it without "
                "method=\"step\" and choose a method"
            ) from err
        if getattr(out, "shape", None) != x0.shape:
            raise ValueError(
                f"the step function must return a state shaped like x0 {tuple(x0.shape)}, "
                f"got {getattr(out, 'shape', type(out).__name__)}"
            )


def as_step(step) -> AbstractStep:
    """A geomjax step as it is, or a plain callable `step(x, h)` wrapped."""
    if isinstance(step, AbstractStep):
        return step
    if callable(step):
        return FunctionStep(step)
    raise TypeError(f"expected a geomjax step or a callable step(x, h) ↦ x_next, got {type(step).__name__}")


class StructureStep(AbstractStep):
    """Base of steps whose pieces are those of a Poisson structure (`structure`)."""

    structure: eqx.AbstractVar[object]

    def split(self, x):
        return self.structure.split(x)

    def merge(self, z):
        return self.structure.merge(z)

    @property
    def dim(self):
        return self.structure.dim


class SystemStep(AbstractSystemMonitored, StructureStep):
    """Base of steps built from a `geomjax.System`: pieces and monitored quantities come
    from the system."""

    system: eqx.AbstractVar[object]

    @property
    def structure(self):
        return self.system.structure


class FieldStep(AbstractStep):
    """Base of steps built from a vector field: pieces, checks and monitored quantities
    come from the field; `at_start` specialises the field to the run."""

    field: eqx.AbstractVar[object]

    def split(self, x):
        return self.field.split(x)

    def merge(self, z):
        return self.field.merge(z)

    @property
    def dim(self):
        return self.field.dim

    def check(self, x0) -> None:
        self.field.check(x0)

    def at_start(self, z0):
        return eqx.tree_at(lambda s: s.field, self, self.field.at_start(z0))

    def constraint_residuals(self, x):
        return self.field.constraint_residuals(x)

    def invariants(self, x):
        return self.field.invariants(x)

    def quantity_labels(self, x):
        return self.field.quantity_labels(x)
