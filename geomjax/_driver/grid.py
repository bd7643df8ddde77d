"""The members of a sweep: products and zips of named value axes."""

import math

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .._validate import known


def _as_values(name, values):
    if isinstance(values, (list, tuple)) or np.isscalar(values):
        values = np.asarray(values)
    if not hasattr(values, "shape") or not hasattr(values, "dtype"):
        raise TypeError(f"the values of {name!r} must be an array or a list, got {type(values).__name__}")
    if values.ndim == 0:
        raise ValueError(f"{name!r} needs one value per member along its axis (a 1-D or larger array), got a scalar")
    if values.shape[0] == 0:
        raise ValueError(f"{name!r} has no values")
    if jnp.issubdtype(values.dtype, jnp.floating) and values.dtype != jnp.float64:
        raise TypeError(
            f"{name!r} has dtype {values.dtype}; geomjax needs float64 values (float32 round-off "
            "destroys the invariants it preserves)"
        )
    if jnp.issubdtype(values.dtype, jnp.integer) or jnp.issubdtype(values.dtype, jnp.bool_):
        values = jnp.asarray(values, jnp.float64) if known(values) is None else known(values).astype(np.float64)
    return values


class Grid(eqx.Module):
    """Named values over a grid of sweep members, built with `geomjax.product` and
    `geomjax.zipped`.

    `axes` holds one dict per grid axis, mapping each name that varies along that axis to
    its values (leading dimension: the axis length). A member is one index per axis; its
    values are `{name: values[index]}` for every name. Members are numbered in C order
    (the last axis fastest), and results come back shaped `grid.shape + (...)`.

    Example:

    ```python
    >>> import geomjax
    >>> grid = geomjax.product(g=[1.0, 9.81], gain=[10.0, 100.0, 1000.0])
    >>> grid.shape, grid.axis_of("gain"), [float(v) for v in grid.take([4])["gain"]]
    ((2, 3), 1, [100.0])

    ```
    """

    axes: tuple

    @property
    def shape(self) -> tuple:
        return tuple(int(next(iter(axis.values())).shape[0]) for axis in self.axes)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def names(self) -> tuple:
        return tuple(name for axis in self.axes for name in axis)

    def axis_of(self, name: str) -> int:
        for a, axis in enumerate(self.axes):
            if name in axis:
                return a
        raise KeyError(f"{name!r} is not swept; the grid has {list(self.names)}")

    def values(self, name: str):
        """The values of `name` along its axis."""
        return self.axes[self.axis_of(name)][name]

    def take(self, members):
        """`{name: values}` for the members numbered `members` (a 1-D integer array)."""
        members = np.asarray(members)
        if len(self.axes) == 1 and members.shape == (self.size,) and np.array_equal(members, np.arange(self.size)):
            return dict(self.axes[0])  # all members of one axis, in order: the values themselves
        index = np.unravel_index(members, self.shape)
        return {name: values[index[a]] for a, axis in enumerate(self.axes) for name, values in axis.items()}


def zipped(**values) -> Grid:
    """One sweep axis along which several names vary together (equal lengths).

    Example:

    ```python
    >>> import numpy as np, geomjax
    >>> grid = geomjax.zipped(g=[1.0, 2.0, 3.0], gain=[10.0, 20.0, 30.0])
    >>> grid.shape, grid.names
    ((3,), ('g', 'gain'))

    ```
    """
    if not values:
        raise ValueError("zipped needs at least one name=values")
    axis = {name: _as_values(name, v) for name, v in values.items()}
    lengths = {name: int(v.shape[0]) for name, v in axis.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"zipped values must have equal lengths, got {lengths}")
    return Grid((axis,))


def product(*grids: Grid, **values) -> Grid:
    """The product of sweep axes: every combination of the values of each axis.

    Positional arguments are grids (`geomjax.zipped(...)`, or other products), each
    keyword adds an axis of its own; axes come in the order given.

    Example:

    ```python
    >>> import numpy as np, geomjax
    >>> grid = geomjax.product(geomjax.zipped(a=[0.0, 1.0], b=[2.0, 3.0]), gain=np.logspace(0, 2, 3))
    >>> grid.shape, grid.size
    ((2, 3), 6)
    >>> {k: float(v[0]) for k, v in grid.take(np.array([5])).items()}
    {'a': 1.0, 'b': 3.0, 'gain': 100.0}

    ```
    """
    axes = []
    for g in grids:
        if not isinstance(g, Grid):
            raise TypeError(f"product's positional arguments must be grids (geomjax.zipped, geomjax.product), got {type(g).__name__}")
        axes.extend(g.axes)
    axes.extend(zipped(**{name: v}).axes[0] for name, v in values.items())
    if not axes:
        raise ValueError("product needs at least one axis")
    seen = [name for axis in axes for name in axis]
    repeated = sorted({n for n in seen if seen.count(n) > 1})
    if repeated:
        raise ValueError(f"names swept on more than one axis: {repeated}")
    return Grid(tuple(axes))


def as_grid(grid) -> Grid:
    if isinstance(grid, Grid):
        return grid
    if isinstance(grid, dict):
        return product(**grid)
    raise TypeError(
        f"the sweep's members must be a grid (geomjax.product(...) or geomjax.zipped(...)) or a "
        f"dict of name → values (their product), got {type(grid).__name__}"
    )

