"""What a sweep returns: per-member arrays shaped like its grid, their summary, heat maps,
and saving with the sweep's definition."""

import json
import warnings
import sys
from collections import Counter

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._status import RESULTS, code_int, from_code, status_names
from .._version import __version__
from .common import nan_max
from .grid import Grid
from .solution import measured_sentence
from .._validate import known

_ARRAYS = ("ts", "xs", "status", "failed_step", "num_steps", "invariant_error", "constraint_error")


def _describe_build(build) -> str:
    module = getattr(build, "__module__", None) or ""
    name = getattr(build, "__qualname__", None) or type(build).__name__
    return f"{module}.{name}" if module else name


class SweepResult(eqx.Module):
    """The runs of a `geomjax.sweep`, one entry per member of its grid.

    **Fields** (`G` = `grid.shape`):

    - `grid`: the swept values (`geomjax.Grid`).
    - `ts`: save times `(saves,)`, the initial time included.
    - `xs`: saved flat states, `G + (saves, n)`; NaN after a member's failure.
    - `status`: integer `geomjax.RESULTS` codes, `G` (0: succeeded).
    - `failed_step`: first failed step, `G` (−1: none; 0: a bad start).
    - `num_steps`: steps completed before a failure, `G`.
    - `invariant_error`: |I(x) − I(x₀)| / (1 + |I(x₀)|) of the monitored first integrals,
      `G + (saves, k)`.
    - `constraint_error`: the largest |constraint residual|, `G + (saves,)`.
    - `definition`: the sweep's definition (JSON): names, method, dt, steps, tolerances,
      layout, and the versions it ran with.

    Example:

    ```python
    >>> import geomjax, tempfile, os
    >>> model = geomjax.models.spherical_pendulum()
    >>> member = lambda gain: (geomjax.feedback_field(model.system, model.x0, gains=gain), model.x0)
    >>> result = geomjax.sweep(member, geomjax.zipped(gain=[1.0, 10.0]), dt=1e-3, steps=100, save_every=50)
    >>> result.xs.shape, result.invariant_error.shape, bool(result.ok.all())
    ((2, 3, 6), (2, 3, 4), True)
    >>> path = os.path.join(tempfile.mkdtemp(), "gains")
    >>> result.save(path)
    >>> geomjax.SweepResult.load(path).summary()
    '2 of 2 members succeeded'

    ```
    """

    grid: Grid
    ts: jax.Array
    xs: jax.Array
    status: jax.Array
    failed_step: jax.Array
    num_steps: jax.Array
    invariant_error: jax.Array
    constraint_error: jax.Array
    definition: str = eqx.field(static=True)

    @classmethod
    def _from_chunks(cls, grid: Grid, pieces, ts, **definition):
        """Assemble per-chunk outputs `(xs, status, failed_step, num_steps, inv_err, res_err)`,
        members first, into arrays shaped like the grid (the last chunk's padding dropped)."""
        size, shape = grid.size, grid.shape

        def assemble(i):
            if len(pieces) == 1 and pieces[0][i].shape[: len(shape)] == shape:
                return jnp.asarray(pieces[0][i])  # shaped like the grid already
            a = jnp.asarray(pieces[0][i]) if len(pieces) == 1 else jnp.concatenate([p[i] for p in pieces], axis=0)
            a = a if a.shape[0] == size else a[:size]
            return a.reshape(shape + a.shape[1:])

        return cls(grid, ts, *(assemble(i) for i in range(6)), _definition_json(grid, definition))

    @property
    def x_final(self):
        """The final states, `G + (n,)` (NaN for members that failed): the name of
        `Solution.x_final`."""
        return self.xs[..., -1, :]

    @property
    def final(self):
        """Deprecated: `x_final` (one name with `Solution.x_final`)."""
        warnings.warn("SweepResult.final is deprecated: use SweepResult.x_final (as Solution.x_final)",
                      DeprecationWarning, stacklevel=2)
        return self.x_final

    @property
    def ok(self):
        """True for members that succeeded, `G`."""
        return self.status == 0

    @property
    def max_invariant_error(self):
        """The largest invariant drift of each member over its saves, `G` (NaN when it failed)."""
        err = self.invariant_error
        if err.shape[-1] == 0:
            return jnp.zeros(err.shape[:-2], err.dtype)
        return nan_max(err, axis=(-2, -1))

    @property
    def result(self):
        """The members' `geomjax.RESULTS` items, shaped `G`: compare with `==`, e.g.
        `result.result == geomjax.RESULTS.diverged` is a boolean mask over the grid."""
        return from_code(self.status)

    def message(self, *index) -> str:
        """In words, how the member at grid position `index` ended: one integer per axis of
        the grid (negative ones count from the end), e.g. `result.message(1, 2)`; for a
        drift, which quantity left its tolerance and its value at the failing save, as
        `Solution.message` says it.

        An index outside the grid is an IndexError naming the valid range (JAX's own
        indexing would clamp it silently and describe another member)."""
        index = _grid_position(index, tuple(self.status.shape))
        code = int(np.asarray(self.status[index]))
        if code == 0:
            return "success"
        step = int(np.asarray(self.failed_step[index]))
        where = "at the start (step 0)" if step == 0 else f"at step {step}"
        return f"failed {where}: {RESULTS[from_code(code)]}{self._measured(index, code, step)}"

    def _measured(self, index, code: int, step: int) -> str:
        """`measured_sentence` from the saved errors at the member's failing save."""
        definition = json.loads(self.definition)
        drift_tol, save_every = definition.get("drift_tol"), definition.get("save_every")
        if step <= 0 or not isinstance(drift_tol, (int, float)) or not isinstance(save_every, int):
            return ""
        save = min(step // save_every, self.ts.shape[0] - 1)
        invariant_labels = definition.get("quantity_labels", [[], []])[0]
        if code == code_int(RESULTS.invariant_drift):
            errors = np.asarray(self.invariant_error[index][save])
            if not errors.size:
                return ""
            k = int(np.argmax(np.where(np.isfinite(errors), errors, np.inf)))
            label = invariant_labels[k] if k < len(invariant_labels) else f"[{k}]"
            return measured_sentence(code, f"first integral {label}", float(errors[k]), drift_tol)
        scale = 1.0 + float(np.max(np.abs(np.asarray(self.xs[index][0]))))
        value = float(np.asarray(self.constraint_error[index][save]))
        return measured_sentence(code, "largest constraint residual", value, drift_tol * scale)

    def summary(self) -> str:
        """How many members succeeded, and how the others failed (by cause)."""
        codes = np.asarray(self.status).reshape(-1)
        names = status_names()
        counts = Counter(names[int(c)] for c in codes if c != 0)
        text = f"{int(np.sum(codes == 0))} of {codes.size} members succeeded"
        if counts:
            text += "; " + ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in counts.most_common())
        return text

    def save(self, path) -> None:
        """Write `path.npz` (the arrays and the swept values) and `path.json` (the definition)."""
        path = str(path)
        base = path[:-4] if path.endswith(".npz") else path
        arrays = {name: np.asarray(getattr(self, name)) for name in _ARRAYS}
        for a, axis in enumerate(self.grid.axes):
            for name, values in axis.items():
                arrays[f"grid/{a}/{name}"] = np.asarray(values)
        np.savez(base + ".npz", **arrays)
        with open(base + ".json", "w") as f:
            f.write(self.definition)

    @classmethod
    def load(cls, path) -> "SweepResult":
        """Read a result written by `save`."""
        path = str(path)
        base = path[:-4] if path.endswith(".npz") or path.endswith(".json") else path
        base = base[:-1] if base.endswith(".") else base
        with np.load(base + ".npz") as data:
            arrays = {k: data[k] for k in data.files}
        with open(base + ".json") as f:
            definition = f.read()
        axes = {}
        for key in [k for k in arrays if k.startswith("grid/")]:
            _, a, name = key.split("/", 2)
            axes.setdefault(int(a), {})[name] = arrays.pop(key)
        grid = Grid(tuple(axes[a] for a in sorted(axes)))
        return cls(grid, *(jnp.asarray(arrays[name]) for name in _ARRAYS), definition)

    def heatmap(self, quantity="invariant_error", x: str | None = None, y: str | None = None, ax=None):
        """A heat map of `quantity` over two swept names (other axes: the worst member).

        `quantity`: `"invariant_error"` or `"constraint_error"` (largest over the saves,
        log₁₀ scale), `"status"` (the cause of failure per member), or an array shaped
        `grid.shape`. `x`, `y`: swept names (default: the first scalar-valued names of the
        last two axes). Members that failed are drawn red on the error maps. Returns the
        matplotlib `Axes`. A figure made here uses matplotlib's constrained layout, so the
        colour bar's label and tick labels (the names of the outcomes) are not cut off;
        with your own `ax`, use a figure with `layout="constrained"` for the same.
        """
        import matplotlib.pyplot as plt
        from matplotlib.colors import BoundaryNorm, ListedColormap

        # per axis, its first name with one number per member
        names = [next((n for n, v in a.items() if np.ndim(v) == 1), next(iter(a))) for a in self.grid.axes]
        if x is None:
            x = names[-1]
        if y is None:
            y = names[-2] if len(names) > 1 else None
        if y is None:
            raise ValueError("a heat map needs two swept axes; this grid has one")
        ax_x, ax_y = self.grid.axis_of(x), self.grid.axis_of(y)
        if ax_x == ax_y:
            raise ValueError(f"{x!r} and {y!r} vary along the same axis of the grid")
        values, label, is_status = _quantity(self, quantity)
        failed = np.asarray(self.status) != 0
        others = tuple(a for a in range(values.ndim) if a not in (ax_x, ax_y))
        if others:
            values = np.max(values, axis=others)  # the worst member (a status: any failure)
            failed = np.any(failed, axis=others)
        if ax_y > ax_x:
            values, failed = values.T, failed.T  # rows: y
        if ax is None:
            # constrained layout makes room for the colour bar's label and tick labels
            _, ax = plt.subplots(figsize=(5.5, 4), layout="constrained")
        xv, yv = np.asarray(self.grid.values(x)), np.asarray(self.grid.values(y))
        if xv.ndim != 1 or yv.ndim != 1:
            raise ValueError("heat maps need scalar swept values on both axes")
        if is_status:
            names_of = status_names()
            present = sorted(set(np.unique(values).astype(int)))
            colours = plt.get_cmap("tab10")
            cmap = ListedColormap([(0.85, 0.92, 0.85)] + [colours(i) for i in range(1, len(present) + 1)])
            index = {c: i for i, c in enumerate([0] + [c for c in present if c != 0])}
            image = np.vectorize(lambda c: index[int(c)])(values)
            mesh = ax.pcolormesh(*_edges(xv, yv), image, cmap=cmap, norm=BoundaryNorm(np.arange(len(index) + 1) - 0.5, len(index)))
            bar = plt.colorbar(mesh, ax=ax, ticks=list(index.values()))
            bar.ax.set_yticklabels([names_of[c].replace("_", " ") for c in index])
        else:
            finite = values[np.isfinite(values) & (values > 0)]
            floor = finite.min() if finite.size else 1e-16
            with np.errstate(divide="ignore", invalid="ignore"):
                shown = np.log10(np.maximum(values, floor))  # exact zeros shown at the smallest value
            cmap = plt.get_cmap("viridis").with_extremes(bad=(0.8, 0.2, 0.2))
            mesh = ax.pcolormesh(*_edges(xv, yv), np.where(failed, np.nan, shown), cmap=cmap)
            # on two lines: one line of the longer labels is taller than the panel
            plt.colorbar(mesh, ax=ax, label=f"log10 {label}\n(red: failed)")
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        for axis, v in (("x", xv), ("y", yv)):
            if np.all(v > 0) and v.max() / v.min() > 50:
                getattr(ax, f"set_{axis}scale")("log")
        return ax


def _grid_position(index, shape) -> tuple:
    """`index` checked against the grid's `shape`: one integer per axis, in range."""
    if len(index) == 1 and isinstance(index[0], tuple):
        index = index[0]  # message((1, 2)) as message(1, 2)
    if len(index) != len(shape):
        raise IndexError(
            f"message takes one index per axis of the grid, whose shape is {shape}; got "
            f"{len(index)} ({', '.join(map(repr, index)) or 'none'})"
        )
    for axis, (i, n) in enumerate(zip(index, shape)):
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise IndexError(f"grid indices must be integers; got {i!r} for axis {axis}")
        if not -n <= i < n:
            raise IndexError(
                f"grid position {tuple(index)} is out of range: axis {axis} has {n} "
                f"member{'s' if n != 1 else ''}, so its index must be in 0..{n - 1} "
                f"(or {-n}..-1 from the end); got {i}"
            )
    return tuple(int(i) for i in index)


def _quantity(result: SweepResult, quantity):
    if isinstance(quantity, str):
        if quantity == "status":
            return np.asarray(result.status), "status", True
        if quantity == "invariant_error":
            return np.asarray(result.max_invariant_error), "max invariant drift", False
        if quantity == "constraint_error":
            return np.asarray(nan_max(result.constraint_error, axis=-1)), "max constraint residual", False
        raise ValueError(f"unknown quantity {quantity!r}: 'invariant_error', 'constraint_error', 'status' or an array")
    values = np.asarray(quantity)
    if values.shape != result.grid.shape:
        raise ValueError(f"an array to plot must have the grid's shape {result.grid.shape}, got {values.shape}")
    return values, "value", False


def _edges(xv, yv):
    def edges(v):
        if v.size == 1:
            return np.array([v[0] - 0.5, v[0] + 0.5])
        log = np.all(v > 0) and v.max() / v.min() > 50
        w = np.log(v) if log else v
        mid = (w[1:] + w[:-1]) / 2
        e = np.concatenate([[w[0] - (mid[0] - w[0])], mid, [w[-1] + (w[-1] - mid[-1])]])
        return np.exp(e) if log else e

    return edges(xv), edges(yv)


def _definition_json(grid: Grid, definition: dict) -> str:

    out = {
        "swept": [{name: known(v).tolist() if np.size(v) <= 4096 else f"array{np.shape(v)}" for name, v in axis.items()} for axis in grid.axes]
        if all(known(v) is not None for a in grid.axes for v in a.values())
        else [list(a) for a in grid.axes],
        "grid_shape": list(grid.shape),
    }
    for key, value in definition.items():
        if key == "build":
            value = _describe_build(value)
        elif key == "method":
            value = value if isinstance(value, str) else type(value).__name__
        elif isinstance(value, (jax.Array, np.ndarray, np.generic)):
            value = "traced" if known(value) is None else float(known(value))
        out[key] = value
    out["versions"] = {
        "geomjax": __version__,
        "jax": jax.__version__,
        "python": sys.version.split()[0],
        "backend": jax.default_backend(),
    }
    return json.dumps(out, indent=1)
