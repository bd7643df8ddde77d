"""Vector fields: flat at the public boundary, in pieces inside loops."""

import abc
from collections.abc import Callable

import equinox as eqx
import jax

from .internal.simplify import scalar_graph


class AbstractField(eqx.Module):
    """A vector field x ↦ ẋ.

    Call it on a flat state (`field(x)`); integrators call `rhs` on the pieces given by
    `split`, which avoids slicing and concatenating a flat state inside compiled loops.
    """

    @abc.abstractmethod
    def split(self, x):
        """Flat state → pieces."""

    @abc.abstractmethod
    def merge(self, z):
        """Pieces → flat state."""

    @abc.abstractmethod
    def rhs(self, z):
        """ẋ in pieces, for a state in pieces."""

    @property
    def dim(self) -> int | None:
        """Expected length of the flat state, or None if any length is accepted."""
        return None

    def check(self, x0) -> None:
        """Raise a clear error if `x0` (concrete) is not a valid start for this field."""

    def __call__(self, x):
        return self.merge(self.rhs(self.split(x)))


class SystemField(AbstractField):
    """Base of fields derived from a `geomjax.System`: pieces come from its structure.

    Subclasses give `vector(z)`, the field as derived by autodiff; `rhs` evaluates it
    through its simplified scalar expression graph (`geomjax.internal.simplify`), which drops
    what the derivation computed but the field does not need.
    """

    system: eqx.AbstractVar[object]

    @abc.abstractmethod
    def vector(self, z):
        """ẋ in pieces as derived from the system's functions, for a state in pieces."""

    def rhs(self, z):
        return scalar_graph(self.vector, z)

    def split(self, x):
        return self.system.structure.split(x)

    def merge(self, z):
        return self.system.structure.merge(z)

    @property
    def dim(self):
        return self.system.dim


class FunctionField(AbstractField):
    """Wrap a plain callable `x ↦ ẋ` on flat states as a field."""

    fn: Callable

    def split(self, x):
        return x

    def merge(self, z):
        return z

    def rhs(self, z):
        return self.fn(z)


def as_field(field: Callable) -> AbstractField:
    """Return `field` itself if it is a geomjax field, else wrap a plain callable."""
    if isinstance(field, AbstractField):
        return field
    if not callable(field):
        raise TypeError(f"expected a vector field x ↦ ẋ (a callable), got {type(field).__name__}")
    return FunctionField(field)


# Inner products of vectors up to this length are written out as scalar sums: XLA then
# fuses them into their consumers instead of launching one reduction kernel each.
_UNROLL_DOT = 8


def _dot(u, v):
    if u.ndim == 1 and u.shape[0] <= _UNROLL_DOT:
        acc = u[0] * v[0]
        for i in range(1, u.shape[0]):
            acc = acc + u[i] * v[i]
        return acc
    return (u * v).sum()


def tree_dot(a, b):
    """Euclidean inner product of two states given in pieces."""
    leaves = jax.tree_util.tree_leaves(jax.tree_util.tree_map(_dot, a, b))
    return sum(leaves[1:], leaves[0])


def tree_axpy(alpha, x, y):
    """alpha·x + y on pieces."""
    return jax.tree_util.tree_map(lambda u, v: alpha * u + v, x, y)
