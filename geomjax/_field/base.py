"""Vector fields: flat at the public boundary, in pieces inside loops."""

import abc
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._monitored import AbstractMonitored, AbstractSystemMonitored
from .._validate import _TRACE_ERRORS, untraceable_message
from ..internal.simplify import scalar_graph


class AbstractField(AbstractMonitored):
    """A vector field ẋ = X(t, x, args).

    Call it on a flat state (`field(x)`, or `field(x, t, args)` for a time-dependent
    field); integrators call `rhs(t, z, args)` on the pieces given by `split`, which avoids
    slicing and concatenating a flat state inside compiled loops. Fields derived from a
    system ignore `t` and `args`.
    """

    @abc.abstractmethod
    def rhs(self, t, z, args):
        """ẋ in pieces, at time `t`, for a state in pieces `z` and extra arguments `args`."""

    def __call__(self, x, t=0.0, args=None):
        return self.merge(self.rhs(t, self.split(x), args))

    def __hash__(self):
        # A field that holds arrays (gains, a target) is not hashable, and `jax.jit(field)`
        # hashes the function it compiles: say what to do instead of JAX's bare TypeError.
        try:
            return super().__hash__()
        except TypeError:
            raise TypeError(
                f"this {type(self).__name__} holds arrays (its gains, target or parameters), so it is not hashable "
                "and jax.jit cannot take it as the function to compile: use equinox.filter_jit(field)(x), or "
                "jax.jit(lambda x: field(x))(x), or pass the field as an argument of a function that jax.jit "
                "compiles with equinox.filter_jit"
            ) from None


class SystemField(AbstractSystemMonitored, AbstractField):
    """Base of fields derived from a `geomjax.System`: pieces come from its structure.

    Subclasses give `vector(z)`, the field as derived by autodiff; `rhs` evaluates it
    through its simplified scalar expression graph (`geomjax.internal.simplify`), which drops
    what the derivation computed but the field does not need. The monitored quantities
    are the system's (constraint residuals; energy and first integrals).
    """

    system: eqx.AbstractVar[object]

    @abc.abstractmethod
    def vector(self, z):
        """ẋ in pieces as derived from the system's functions, for a state in pieces."""

    def rhs(self, t, z, args):
        del t, args
        return scalar_graph(self.vector, z, enabled=self.simplify)

    def split(self, x):
        return self.system.structure.split(x)

    def merge(self, z):
        return self.system.structure.merge(z)

    @property
    def dim(self):
        return self.system.dim


def _is_inexact_array(x) -> bool:
    return eqx.is_array(x) and jnp.issubdtype(x.dtype, jnp.inexact)


class EntrywiseField(SystemField):
    """A derived field with every scalar of the state, and of its own arrays, a piece of
    its own: the layout of the derivative loops.

    The same vector field: `rhs` is the simplified scalar graph of the original field's
    `vector`, with the state's entries `(x₁, …, xₙ)` as inputs and outputs and the
    entries of the field's floating-point arrays (gains, targets, metric) as further
    inputs. Under `vmap` each entry is one contiguous vector over the members, so reverse
    mode never assembles an array's cotangent from per-entry expressions: with arrays as
    inputs, the cotangent of each is a concatenation or a sum of pads of per-entry
    expressions, which XLA's CPU backend fuses with everything that computes them and
    then evaluates entry by entry, unvectorised (`benchmarks/tuning.py` measures the
    tuning iteration both ways). Build it with `EntrywiseField.of(field)`; everything but
    the layout (monitored quantities, targets, checks) is the original field's.
    """

    shell: SystemField  # the original field without its floating-point arrays
    entries: tuple  # their entries, as 0-d arrays
    shapes: tuple = eqx.field(static=True)
    treedef: object = eqx.field(static=True)

    @classmethod
    def of(cls, field: SystemField) -> "EntrywiseField":
        arrays, shell = eqx.partition(field, _is_inexact_array)
        leaves, treedef = jax.tree_util.tree_flatten(arrays)
        entries = tuple(e for leaf in leaves for e in (jnp.reshape(leaf, (-1,))[i] for i in range(leaf.size)))
        return cls(shell, entries, tuple(leaf.shape for leaf in leaves), treedef)

    @property
    def field(self) -> SystemField:
        leaves, start = [], 0
        for shape in self.shapes:
            size = int(np.prod(shape, dtype=int))
            part = self.entries[start : start + size]
            leaves.append(jnp.stack(part).reshape(shape) if size else jnp.zeros(shape))
            start += size
        return eqx.combine(jax.tree_util.tree_unflatten(self.treedef, leaves), self.shell)

    @property
    def system(self):
        return self.field.system

    def vector(self, z):
        inner = self.field
        x = inner.merge(inner.vector(inner.split(jnp.stack(z))))
        return tuple(x[i] for i in range(x.shape[0]))

    def split(self, x):
        return tuple(x[i] for i in range(x.shape[0]))

    def merge(self, z):
        return jnp.stack(z)

    @property
    def dim(self):
        return self.field.dim

    def check(self, x0) -> None:
        self.field.check(x0)

    def at_start(self, z0):
        inner = self.field
        return EntrywiseField.of(inner.at_start(inner.split(self.merge(z0))))

    def constraint_residuals(self, x):
        return self.field.constraint_residuals(x)

    def invariants(self, x):
        return self.field.invariants(x)

    def quantity_labels(self, x):
        return self.field.quantity_labels(x)


def entrywise_applies(field) -> bool:
    """Whether `entrywise` converts `field`: a derived field evaluated through its scalar
    graph (a `SystemField` with `SystemField`'s `rhs`), not already entrywise."""
    return isinstance(field, SystemField) and type(field).rhs is SystemField.rhs and not isinstance(field, EntrywiseField)


def entrywise(field):
    """`EntrywiseField.of(field)` where `entrywise_applies(field)`, else `field` unchanged."""
    return EntrywiseField.of(field) if entrywise_applies(field) else field


def _check_returns_state(fn, x, what: str, call: str, hint: str):
    try:
        out = jax.eval_shape(lambda y: fn(y), x)
    except _TRACE_ERRORS as err:
        raise TypeError(untraceable_message(what, err)) from err
    except TypeError as err:
        raise TypeError(f"{what} could not be called as {call}: {err}. {hint}") from err
    if not (hasattr(out, "shape") and out.shape == x.shape):
        shape = getattr(out, "shape", type(out).__name__)
        raise ValueError(f"{what} must return an array shaped like the state {tuple(x.shape)}, got {shape}")


class _FlatField(AbstractField):
    """A field of a plain function on flat states: split and merge are identities."""

    def split(self, x):
        return x

    def merge(self, z):
        return z


class FunctionField(_FlatField):
    """A plain callable `x ↦ ẋ` on flat states (autonomous), as a field."""

    fn: Callable

    def rhs(self, t, z, args):
        del t, args
        return self.fn(z)

    def check(self, x0) -> None:
        _check_returns_state(
            self.fn,
            x0,
            "the vector field",
            "field(x)",
            "A plain callable is read as an autonomous field x ↦ ẋ. For a step map "
            "x_next = step(x, h) pass method=\"step\" (or geomjax.FunctionStep(step)); for "
            "a time-dependent field f(t, x, args) wrap it as geomjax.TimeField(f)",
        )


class TimeField(_FlatField):
    """A time-dependent field `f(t, x, args) ↦ ẋ` (diffrax's convention) on flat states.

    `args` is what `geomjax.integrate(..., args=...)` passes (forcing parameters, controls).

    Example:

    ```python
    >>> import jax.numpy as jnp, geomjax
    >>> forced = geomjax.TimeField(lambda t, x, a: jnp.stack([x[1], -x[0] + a * jnp.cos(t)]))
    >>> sol = geomjax.integrate(forced, jnp.array([1.0, 0.0]), dt=0.01, steps=100,
    ...                         method="rk4", args=0.5)
    >>> sol.xs.shape
    (101, 2)

    ```
    """

    fn: Callable

    def rhs(self, t, z, args):
        return self.fn(t, z, args)

    def check_args(self, x0, args) -> None:
        """Raise a TypeError naming `args` when `f` reads its third argument but the run
        was given none (`args=None`): traced once at the shapes of `x0` (nothing is
        computed). Other errors are left to the run, which raises them as they are."""
        if args is not None:
            return
        t = jax.ShapeDtypeStruct((), jnp.asarray(x0).dtype)
        try:
            jax.eval_shape(lambda s, x: self.fn(s, x, None), t, x0)
        except (TypeError, AttributeError, IndexError, KeyError) as err:
            if "NoneType" not in str(err):
                return  # another cause: the run raises it as it is
            raise TypeError(
                "the time-dependent field f(t, x, args) uses its args, but the run was given none "
                f"(args=None), so f was called with args=None: {err}. Pass the values f reads "
                "from its third argument with args= (integrate(..., args=...), sweep(..., args=...))"
            ) from err


def as_field(field: Callable) -> AbstractField:
    """Return `field` itself if it is a geomjax field, else wrap a plain callable `x ↦ ẋ`."""
    if isinstance(field, AbstractField):
        return field
    if not callable(field):
        raise TypeError(f"expected a vector field x ↦ ẋ (a callable), got {type(field).__name__}")
    return FunctionField(field)


def tree_axpy(alpha, x, y):
    """alpha·x + y on pieces."""
    return jax.tree_util.tree_map(lambda u, v: alpha * u + v, x, y)
