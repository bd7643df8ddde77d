"""Observed trajectories of a constrained mechanical system, to learn from or fit to."""

from collections.abc import Callable

import equinox as eqx
import jax
from jaxtyping import Array, Float

from .._driver.integrate import integrate
from .._field.dirac import dirac_field
from .._step.methods import build_step
from .._system.system import System
from .._validate import positive_count


class Trajectories(eqx.Module):
    """Observed trajectories of a constrained mechanical system, sampled every `dt`.

    **Fields:**

    - `xs`: the observed states, shape `(B, T + 1, 2n)`: positions q and, after them,
      velocities q̇ (`observed="velocity"`) or momenta p (`"momentum"`).
    - `ts`: the observation times 0, dt, …, T·dt.
    - `dt`: the observation interval.
    - `constraints`: `q ↦ g(q)`, the system's holonomic constraints (what a
      `ConstrainedHamiltonianNetwork` is told).
    - `system`: the system that generated the data (its H and constraints, for
      reference: the true energy of a rollout, say).
    - `space_dim`: the dimension of the space the points move in (2 or 3 for chains).
    - `observed`: `"velocity"` or `"momentum"`.
    """

    xs: Float[Array, "batch time dim"]
    ts: Float[Array, " time"]
    dt: float = eqx.field(static=True)
    constraints: Callable
    system: System
    space_dim: int = eqx.field(static=True)
    observed: str = eqx.field(static=True)

    @property
    def n(self) -> int:
        """The number of configuration coordinates."""
        return self.xs.shape[-1] // 2

    def chunks(self, length: int) -> Float[Array, "chunks length dim"]:
        """The trajectories cut into non-overlapping chunks of `length` observations:
        shape `(B·⌊(T + 1)/length⌋, length, 2n)`, the training examples of `geomjax.train`.

        Example:

        ```python
        >>> import jax, geomjax
        >>> data = geomjax.chain_trajectories(1, 4, steps=4, key=jax.random.key(0))
        >>> data.xs.shape, data.chunks(2).shape  # 5 observations: 2 chunks of 2 each
        ((4, 5, 4), (8, 2, 4))

        ```
        """
        return cut_chunks(self.xs, length)

    def split(self, count: int) -> tuple["Trajectories", "Trajectories"]:
        """`(the first count trajectories, the others)`, e.g. a training and a test set."""
        first = eqx.tree_at(lambda t: t.xs, self, self.xs[:count])
        rest = eqx.tree_at(lambda t: t.xs, self, self.xs[count:])
        return first, rest


def cut_chunks(xs, length: int):
    """Non-overlapping chunks of `length` observations of each trajectory (B, T, 2n):
    (B·⌊T/length⌋, length, 2n)."""
    length = positive_count(length, "chunk_length")
    if length < 2:
        raise ValueError(f"chunk_length must be at least 2 (a start and one predicted state), got {length}")
    b, t, dim = xs.shape
    per = t // length
    if per == 0:
        raise ValueError(f"trajectories of {t} observations are shorter than chunk_length={length}")
    return xs[:, : per * length].reshape(b * per, length, dim)


@eqx.filter_jit
def observed_runs(system, starts, dt, steps, substeps, method):
    """The runs of `method` on the Dirac field of `system` from each of `starts`, `substeps`
    steps per observation interval `dt`, saved every `dt` for `steps` intervals:
    `(len(starts), steps + 1, 2n)`."""
    step = build_step(method, dirac_field(system))
    run = lambda x0: integrate(step, x0, dt=dt / substeps, steps=steps * substeps, save_every=substeps,
                               drift_tol=None).xs  # noqa: E731
    return jax.vmap(run)(starts)
