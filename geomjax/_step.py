"""Pure step maps x_{k+1} = Φ_h(x_k), with a status flowing out of each step."""

import abc
from collections.abc import Callable

import equinox as eqx
import jax.numpy as jnp

#: Status codes carried out of steps and runs.
SUCCESS = 0
NONFINITE = 1
NEWTON_FAILED = 2
SOLVER_FAILED = 3

STATUS_MESSAGES = {
    SUCCESS: "success",
    NONFINITE: (
        "the state became non-finite (NaN or inf); with a feedback field and an explicit "
        "method this usually means the stability limit h·λ_max(L∇²V) < 2 was exceeded: "
        "lower dt or the gains"
    ),
    NEWTON_FAILED: "a Newton solve inside the step did not converge (try a smaller dt)",
    SOLVER_FAILED: "the diffrax solver stopped with an error",
}


class AbstractStep(eqx.Module):
    """A one-step method Φ_h: `step(x, h)` on flat states, `advance(z, h)` on pieces.

    `advance` returns `(z_next, status)` with `status` an int32 code (0 on success,
    `NEWTON_FAILED` when an implicit solve did not converge); `geomjax.integrate` records the
    first failing step. Subclasses also give `split`/`merge` (flat ↔ pieces).
    """

    @abc.abstractmethod
    def split(self, x):
        """Flat state → pieces."""

    @abc.abstractmethod
    def merge(self, z):
        """Pieces → flat state."""

    @abc.abstractmethod
    def advance(self, z, h):
        """One step from pieces `z` with step size `h`: returns `(z_next, status)`."""

    @property
    def dim(self) -> int | None:
        return None

    def check(self, x0) -> None:
        """Raise a clear error if `x0` (concrete) is not a valid start for this step."""

    def __call__(self, x, h):
        z, _ = self.advance(self.split(x), h)
        return self.merge(z)


def ok_status():
    return jnp.asarray(SUCCESS, dtype=jnp.int32)


class FunctionStep(AbstractStep):
    """Wrap a user's pure step function `x_next = step(x, h)` on flat states."""

    fn: Callable

    def split(self, x):
        return x

    def merge(self, z):
        return z

    def advance(self, z, h):
        return self.fn(z, h), ok_status()


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


class SystemStep(StructureStep):
    """Base of steps built from a `geomjax.System`: pieces come from its structure."""

    system: eqx.AbstractVar[object]

    @property
    def structure(self):
        return self.system.structure


class FieldStep(AbstractStep):
    """Base of steps built from a vector field: pieces and checks come from the field."""

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
