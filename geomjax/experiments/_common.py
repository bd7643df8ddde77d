"""Helpers shared by experiments: comparing methods, invariant errors, JSON, figures, tables.

An experiment is usually a *setup* (a model, step size, number of steps, ...) and a list
of `Method`s, each a recipe `produce(setup, progress) -> geomjax.Solution`. `run_method`
runs one recipe and times it; `invariant_errors` gives |F(x(t)) − F(x0)| for the
conserved quantities F = (f, H, integrals) of a `geomjax.System`; the plotting helpers
draw one curve per method on shared axes, with the same colour for a method in every
figure of the experiment.
"""

import json
import math
import pathlib
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from .._status import status_names
from ._errors import ExperimentOptionError  # a ValueError the command reports as a usage error

# --------------------------------------------------------------------------------------
# Methods and timing


@dataclass(frozen=True)
class Method:
    """One entry of a method comparison.

    - `name`: label used in tables, legends and JSON keys.
    - `description`: a sentence saying what is integrated and how.
    - `produce`: `produce(setup, progress) -> geomjax.Solution`; `progress` is `False` or
      a label for the progress bar (pass it on to `geomjax.integrate(progress=...)`).
    - `style`: extra matplotlib line keywords (colour, linestyle, ...), optional.
    - `target`: `target(setup)`, the field or step that `produce` integrates, for
      `default_check` (optional).
    - `monitored`: False for runs made with `drift_tol=None` (comparison runs whose point is
      to show drift); their table row then reports what the default check would say.
    """

    name: str
    description: str
    produce: Callable[[Any, bool | str], Any]
    style: Mapping = field(default_factory=dict)
    target: Callable[[Any], Any] | None = None
    monitored: bool = True


@dataclass
class MethodRun:
    """The outcome of `run_method`."""

    method: Method
    solution: Any
    wall_time_s: float  # first call: includes tracing and XLA compilation
    run_time_s: float | None  # a second, already compiled call (None if not re-run)


def _block(tree):
    return jax.block_until_ready(tree)


def run_method(method: Method, setup, progress: bool = False, rerun_for_timing: bool = True) -> MethodRun:
    """Run `method.produce(setup, ...)`, timing a first call and (optionally) a compiled re-run.

    The first call's wall time includes JIT compilation, which dominates short runs; the
    re-run measures the integration itself. Both calls get the same arguments, so the
    re-run hits the compilation cache.
    """
    label = method.name if progress else False
    start = time.perf_counter()
    solution = _block(method.produce(setup, label))
    wall = time.perf_counter() - start
    run = None
    if rerun_for_timing:  # no second progress bar: the run is the same
        start = time.perf_counter()
        solution = _block(method.produce(setup, False))
        run = time.perf_counter() - start
    return MethodRun(method, solution, wall, run)


def invariant_errors(system, xs, x0=None) -> np.ndarray:
    """|F(x) − F(x0)| along a trajectory, F = system.conserved_quantities = (f, H, integrals).

    `xs` has shape `(n, dim)`; `x0` defaults to `xs[0]`. Returns an `(n, m)` NumPy array.
    """
    xs = jax.numpy.asarray(xs)
    f_of = jax.jit(jax.vmap(system.conserved_quantities))
    values = np.asarray(f_of(xs))
    start = values[0] if x0 is None else np.asarray(system.conserved_quantities(jax.numpy.asarray(x0)))
    return np.abs(values - start[None, :])


def max_finite(a) -> float:
    """Max of an array, `inf` if any entry is non-finite (a blown-up run)."""
    a = np.asarray(a, dtype=float)
    if a.size == 0:
        return float("nan")
    if not np.all(np.isfinite(a)):
        return float("inf")
    return float(a.max())


def _status_names() -> dict[int, str]:
    return status_names()


def default_check(target, solution, save_every: int, drift_tol: float = 1e-2) -> str:
    """What `geomjax.integrate`'s default monitoring says about a run made with `drift_tol=None`.

    Comparison runs whose point is to show drift are made with monitoring off, so their
    curves are complete. This replays the default check on the same saved states, with the
    test the driver applies at every save point: a first integral I of `target` (the field
    or step that was integrated) further than `drift_tol·(1 + |I(x0)|)` from I(x0) is
    `invariant_drift`, a constraint residual above `drift_tol·(1 + max|x0|)` is
    `constraint_violation`, a non-finite monitored value is `constraint_violation`. The
    run's own failure (a blow-up, a Newton failure) counts too, so the answer is exactly the
    status a default run (`drift_tol=1e-2`, same `save_every`) would end with.

    Returns `"ok"` or `"<status> at step N"`.
    """
    xs = jax.numpy.asarray(solution.xs)
    x0 = xs[0]
    inv = np.asarray(jax.jit(jax.vmap(target.invariants))(xs))
    res = np.asarray(jax.jit(jax.vmap(target.constraint_residuals))(xs))
    scale = 1.0 + float(np.max(np.abs(np.asarray(x0))))
    with np.errstate(invalid="ignore"):
        drift = np.zeros(xs.shape[0], dtype=bool)
        if inv.shape[1]:
            rel = np.abs(inv - inv[0]) / (1.0 + np.abs(inv[0]))
            drift = np.max(rel, axis=1) > drift_tol
        violated = np.zeros(xs.shape[0], dtype=bool)
        if res.shape[1]:
            violated = np.max(np.abs(res), axis=1) > drift_tol * scale
    finite_state = np.all(np.isfinite(np.asarray(xs)), axis=1)
    nonfinite = ~(np.all(np.isfinite(inv), axis=1) & np.all(np.isfinite(res), axis=1))
    # Saves after the run's own failure are NaN: that failure is reported below.
    bad = (drift | violated | nonfinite) & finite_state
    own_step = int(np.asarray(solution.failed_step))
    names = _status_names()
    if bad.any():
        i = int(np.argmax(bad))
        step = i * save_every
        if own_step < 0 or step < own_step:
            name = "constraint_violation" if (violated[i] or nonfinite[i]) else "invariant_drift"
            return f"{name} at step {step}"
    if own_step >= 0:
        return f"{names[int(np.asarray(solution.status))]} at step {own_step}"
    return "ok"


# --------------------------------------------------------------------------------------
# JSON


def to_jsonable(obj):
    """Convert arrays, NumPy/JAX scalars, paths and tuples to plain JSON types.

    Non-finite floats become the strings "nan", "inf", "-inf" (strict JSON has no NaN).
    """
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, pathlib.PurePath):
        return str(obj)
    if isinstance(obj, (jax.Array, np.ndarray)):
        return to_jsonable(np.asarray(obj).tolist())
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer, int)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        x = float(obj)
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    return obj


def save_json(path, data) -> pathlib.Path:
    """Write `data` (converted by `to_jsonable`) to `path`, indented; return the path."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_jsonable(data), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------
# Figures (object-oriented matplotlib: no pyplot state, no GUI backend needed)

_COLOURS = ("tab:blue", "tab:red", "tab:green", "tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:gray")


def method_styles(methods: Sequence[Method]) -> dict[str, dict]:
    """Line keywords per method name: a fixed colour cycle, overridden by `Method.style`."""
    return {
        m.name: {"color": _COLOURS[i % len(_COLOURS)], "linewidth": 1.0, **dict(m.style)}
        for i, m in enumerate(methods)
    }


def math_name(name: str) -> str:
    """A quantity name as mathtext (without $): a trailing index becomes a subscript, f1 → f_{1}."""
    match = re.fullmatch(r"([A-Za-z]+)_?(\d+)", name)
    return f"{match.group(1)}_{{{match.group(2)}}}" if match else name


def delta_label(name: str) -> str:
    """Axis label |Δname| in mathtext: f1 → |Δf₁|."""
    return rf"$|\Delta {math_name(name)}|$"


def _figure(nrows=1, ncols=1, size=(7.0, 4.0), sharex=True):
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    axes = fig.subplots(nrows, ncols, sharex=sharex, squeeze=False)
    return fig, axes


def _save(fig, path) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with np.errstate(over="ignore"):  # huge values of a blown-up run on a log axis
        fig.savefig(path, dpi=120)
    return path


def wrap_title(text: str, width_in: float, fontsize_pt: float = 12.0) -> str:
    r"""`text` broken into lines that fit `width_in` inches at `fontsize_pt` (an average
    glyph is taken as 0.6 em wide); `$...$` mathtext spans are never broken.

    ```python
    >>> print(wrap_title(r"a long title $|\Delta H|$ over two lines", 1.5, 10))
    a long title
    $|\Delta H|$ over two
    lines

    ```
    """
    chars = max(10, int(width_in * 72.0 / (0.6 * fontsize_pt)))
    lines = []
    for existing in text.split("\n"):
        words = re.findall(r"(?:\$[^$]*\$|[^\s$])+", existing)
        line = ""
        for word in words:
            visible = len(re.sub(r"\\[A-Za-z]+|[{}$^_]", "x", line + " " + word))
            if line and visible > chars:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
    return "\n".join(lines)


def _title(fig, ax, title: str, fontsize_pt: float = 12.0) -> None:
    """A suptitle (ax None) or an axes title, wrapped to the width it has."""
    if ax is None:
        fig.suptitle(wrap_title(title, fig.get_figwidth() - 0.2, fontsize_pt), fontsize=fontsize_pt)
    else:
        width = fig.get_figwidth() * ax.get_position().width
        ax.set_title(wrap_title(title, width, fontsize_pt), fontsize=fontsize_pt)


def _positive(y):
    """Mask exact zeros (and negatives) so a log axis shows gaps rather than clipping."""
    y = np.asarray(y, dtype=float)
    return np.where(y > 0, y, np.nan)


def _draw_log_errors(ax, ts, series: Mapping[str, np.ndarray], styles, ylabel):
    """One log-scale curve per series; a series with no positive value (exactly zero at
    every save: nothing a log axis can draw) is named in a note in the panel instead."""
    undrawable = []
    n = len(np.asarray(ts))
    for i, (name, err) in enumerate(series.items()):
        shown = _positive(err)
        if not np.any(np.isfinite(shown)):
            undrawable.append(name)
            continue
        ax.plot(np.asarray(ts), shown, label=name, **_marked(styles.get(name, {}), i, len(series), n))
    if undrawable:
        ax.text(0.01, 0.02, f"exactly 0 (not drawn): {', '.join(undrawable)}", transform=ax.transAxes,
                fontsize="x-small", color="0.3", ha="left", va="bottom")
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)


def _marked(style, index, count, n_points):
    """`style` with a marker of its own (`MARKERS[index]`, hollow) placed every
    n_points/12 points, staggered by series, unless the style sets one: curves that agree
    to a line width stay distinguishable."""
    return {"marker": MARKERS[index % len(MARKERS)], "markersize": 4, "markerfacecolor": "none",
            "markevery": _markevery(n_points, index, count), **style}


def _legend_handles(names, styles):
    from matplotlib.lines import Line2D

    return [Line2D([], [], **{k: v for k, v in styles.get(n, {}).items() if k != "markevery"}) for n in names], list(names)


def plot_log_errors(
    path,
    ts,
    series: Mapping[str, np.ndarray],
    *,
    ylabel: str,
    title: str = "",
    styles: Mapping[str, dict] | None = None,
    xlabel: str = "t",
) -> pathlib.Path:
    """One log-scale error figure: `series` maps method name → error values at `ts`.

    The legend sits beside the axes (it covers no curve) and a long title is wrapped."""
    fig, axes = _figure(size=(8.4, 4.0))
    ax = axes[0, 0]
    styles = styles or {}
    _draw_log_errors(ax, ts, series, styles, ylabel)
    ax.set_xlabel(xlabel)
    if title:  # over the axes (a suptitle would run under the legend beside them)
        ax.set_title(wrap_title(title, fig.get_figwidth() - 2.6, 11.0), fontsize=11.0)
    marked = {n: _marked(styles.get(n, {}), i, len(series), 1) for i, n in enumerate(series)}
    fig.legend(*_legend_handles(series, marked), loc="outside right upper", fontsize="small")
    return _save(fig, path)


def plot_error_grid(
    path,
    ts,
    errors: Mapping[str, np.ndarray],
    quantity_names: Sequence[str],
    *,
    title: str = "",
    styles: Mapping[str, dict] | None = None,
    ncols: int = 2,
    xlabel: str = "t",
) -> pathlib.Path:
    """An overview grid: one log-scale panel per quantity; `errors[name]` is `(n, m)`."""
    m = len(quantity_names)
    nrows = -(-m // ncols)
    fig, axes = _figure(nrows, ncols, size=(5.0 * ncols, 3.2 * nrows))
    styles = styles or {}
    for j, q in enumerate(quantity_names):
        ax = axes.flat[j]
        _draw_log_errors(ax, ts, {k: v[:, j] for k, v in errors.items()}, styles, delta_label(q))
        if j >= m - ncols:
            ax.set_xlabel(xlabel)
    for ax in list(axes.flat)[m:]:
        ax.set_visible(False)
    handles, labels = _legend_handles(errors, {n: _marked(styles.get(n, {}), i, len(errors), 1)
                                               for i, n in enumerate(errors)})
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 4), fontsize="small")
    if title:
        _title(fig, None, title)
    return _save(fig, path)


def _markevery(n_points: int, index: int, count: int, marks: int = 12):
    every = max(1, n_points // marks)
    return (int(index * every // max(count, 1)), every)


def plot_components(
    path,
    ts,
    series: Mapping[str, np.ndarray],
    component_labels: Sequence[str],
    *,
    title: str = "",
    styles: Mapping[str, dict] | None = None,
    xlabel: str = "t",
    difference_to: str | None = None,
) -> pathlib.Path:
    """Stacked linear-scale panels, one per component; `series[name]` is `(n, k)`.

    Methods that agree to within a line width would hide each other: each curve carries
    its own marker (`MARKERS`, staggered so marks do not sit on each other). With
    `difference_to` (a series name) a last, log-scale panel shows max_j |x_j − ref_j| of
    every other series from that one, and the title notes which series coincide with it
    at the scale of the component panels (within 0.5% of the panels' y range)."""
    k = len(component_labels)
    extra = difference_to is not None
    fig, axes = _figure(k + extra, 1, size=(8.4, 1.9 * (k + extra) + 1.0))
    styles = styles or {}
    names = list(series)
    marked = {
        n: {"marker": MARKERS[i % len(MARKERS)], "markersize": 4,
            "markevery": _markevery(len(np.asarray(ts)), i, len(names)), **styles.get(n, {})}
        for i, n in enumerate(names)
    }
    for j, label in enumerate(component_labels):
        ax = axes[j, 0]
        for name, values in series.items():
            ax.plot(np.asarray(ts), np.asarray(values)[:, j], label=name, **marked[name])
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    note = ""
    if extra:
        ref = np.asarray(series[difference_to], dtype=float)
        span = max(float(np.nanmax(ref) - np.nanmin(ref)), 1e-300)
        ax = axes[k, 0]
        diffs = {n: np.max(np.abs(np.asarray(v, dtype=float) - ref), axis=1) for n, v in series.items() if n != difference_to}
        _draw_log_errors(ax, ts, diffs, {n: marked[n] for n in diffs}, f"distance from\n{difference_to}")
        same = [n for n, d in diffs.items() if np.all(np.isfinite(d)) and float(np.max(d)) < 5e-3 * span]
        if same:
            note = (f"\n{', '.join([difference_to, *same])} coincide at this scale (markers tell them apart); "
                    f"the bottom panel shows their distance from {difference_to}")
    axes[-1, 0].set_xlabel(xlabel)
    fig.legend(*_legend_handles(names, marked), loc="outside lower center", ncols=min(len(names), 3), fontsize="small")
    if title or note:
        _title(fig, None, title + note, 11.0)
    return _save(fig, path)


MARKERS = ("o", "s", "^", "v", "D", "x", "+", "*")


# --------------------------------------------------------------------------------------
# Tables


def _cell(value, float_format: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return format(float(value), float_format)
    return str(value)


def format_table(
    rows: Sequence[Mapping], float_format: str = ".3e", column_formats: Mapping[str, str] | None = None
) -> str:
    """A plain-text table: the keys of the first row are the columns.

    Floats use `float_format`, except in columns named in `column_formats` and in columns
    whose header ends with "[s]" (seconds, shown as ".3f").
    """
    if not rows:
        return "(no rows)"
    columns = list(rows[0])
    formats = {c: ".3f" for c in columns if c.endswith("[s]")}
    formats.update(column_formats or {})
    cells = [[_cell(r.get(c), formats.get(c, float_format)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]

    def line(items):
        # left-align the first column (names), right-align numbers
        return "  ".join(
            s.ljust(w) if i == 0 else s.rjust(w) for i, (s, w) in enumerate(zip(items, widths))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(columns), rule, *(line(r) for r in cells)])


# --------------------------------------------------------------------------------------
# Options (`geomjax reproduce NAME --dt H --t-final T --gains K`)


def gains_like(default, gains):
    """`gains` (a tuple from the `--gains` option) shaped like `default`: one value is used
    for every gain; otherwise there must be as many values as `default` has entries."""
    if gains is None:
        return default
    if np.ndim(default) == 0:
        if len(gains) != 1:
            raise ExperimentOptionError(f"--gains takes one value here (a single gain k for every quantity), got {len(gains)}")
        return type(default)(gains[0]) if isinstance(default, float) else gains[0]
    n = len(default)
    if len(gains) == 1:
        return tuple(gains * n)
    if len(gains) != n:
        raise ExperimentOptionError(f"--gains takes 1 or {n} values here (one per gain), got {len(gains)}")
    return tuple(gains)


def with_options(setup, *, dt=None, t_final=None, gains=None):
    """A frozen dataclass `setup` with fields `dt`, `steps`, `save_every` (and `gains`)
    after the options: `dt` keeps the horizon (steps = t_final/dt), `t_final` sets the
    number of steps at the step size, `gains` goes through `gains_like`. The number of
    steps is rounded to a multiple of `save_every` (at least one save interval), the
    saving stride shrinks when the run is shorter than it, so the horizon is met to
    within one save interval.

    ```python
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class S:
    ...     dt: float = 1e-3
    ...     steps: int = 1000
    ...     save_every: int = 10
    ...     gains: float = 50.0
    >>> with_options(S(), dt=1e-2)
    S(dt=0.01, steps=100, save_every=10, gains=50.0)
    >>> with_options(S(), t_final=0.05, gains=(5.0,))
    S(dt=0.001, steps=50, save_every=10, gains=5.0)

    ```
    """
    import dataclasses

    changes = {}
    new_dt = setup.dt if dt is None else float(dt)
    horizon = setup.dt * setup.steps if t_final is None else float(t_final)
    if dt is not None or t_final is not None:
        steps = max(1, int(round(horizon / new_dt)))
        save_every = max(1, min(setup.save_every, steps))
        steps = save_every * max(1, int(round(steps / save_every)))
        changes.update(dt=new_dt, steps=steps, save_every=save_every)
    if gains is not None:
        changes["gains"] = gains_like(setup.gains, gains)
    return dataclasses.replace(setup, **changes)
