"""Chang and Perlmutter (2019) §3: feedback integrators on six nonholonomic systems, one experiment each.

For each system (Suslov on SO(3), knife edge, Chaplygin sleigh, vertical rolling disk,
roller racer, Heisenberg system) four runs from the same start on the constraint set:

- feedback Euler and feedback RK4: the feedback field Y = X − ∇V
  (`geomjax.feedback_field`, V = ½ΔᵀKΔ on F = (J, H_ext, integrals), plus k₀/4‖D‖² on an
  embedded group), the paper's method;
- Euler and RK4 on the extended field X alone (`geomjax.nonholonomic_field`), no feedback.

Two systems differ (docs/reproductions.md says why): `heisenberg` starts off the
constraint set (on it the motion is a straight line that every method reproduces
exactly), with the feedback targets of the start on it; `vertical-disk` also runs the
paper's own extension (60), in which all momenta are conserved everywhere
(`vertical_disk(extension="seed")`), with the paper's feedback (61).

Figures: the errors of the monitored quantities (one log panel each; a panel's title
names the methods whose error is exactly zero and so not drawn, and the groups of curves
on top of each other), the error against the reference, and the path in the (x, y) plane
with a zoom on its end points. Every method has its own marker in every figure, so that
curves that agree to a line width can still be told apart; the zoom is centred on the
reference's end and names the end points it leaves out (one run far off) and those that
agree to a line width.

The runs without feedback are made with `drift_tol=None`, so their curves show the whole
drift; the summary table's "default check" column gives the status `geomjax.integrate`'s
default monitoring (drift_tol = 1e-2) reports for each method ("ok" or the status and
step where a default run stops).

Recorded over time: the constraint |J|, the energy error |H − H₀| with the original H (as
the paper does), the errors of the other conserved momenta, the distance to the group
(‖RᵀR − I‖ or |cos² + sin² − 1|) where the group is embedded, and the error against the
exact solution where one exists (knife edge: the cycloid; Chaplygin sleigh: tanh/sech;
vertical disk: the circle; Heisenberg: the straight line). The paper's parameter values, steps and gains were lost in extraction: the
ones used are in each `SETUPS` entry and in the JSON.

Explicit Euler on Y is stable near the invariant set only for h·λ_max(∇²V) < 2 (λ_max the
largest eigenvalue of the Hessian of V; with gains k it scales like k·|∇F|²). The JSON
records 2/λ_max at x₀ (`euler_step_limit`) and its minimum along the path next to the step
used; where the gradients of F grow along the motion (Heisenberg) the limit shrinks.
"""

import pathlib
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

import geomjax

from . import register
from ._common import Method, default_check, max_finite, method_styles, run_method


@dataclass(frozen=True)
class Setup:
    """One system's run: model, step, number of steps, saving stride and gains."""

    name: str
    title: str
    make_model: object
    dt: float = 1e-3
    steps: int = 10_000
    save_every: int = 20
    gains: tuple = (10.0,)
    notes: str = ""
    path_indices: tuple | None = (0, 1)
    extra: dict = field(default_factory=dict)
    #: the name in figure titles (mathtext allowed)
    short: str = ""
    #: added to the model's start (on the constraint set) to start off it; the feedback
    #: targets stay the values at the model's start
    start_offset: tuple | None = None
    #: Chang and Perlmutter's (2019) variant of the system (`vertical_disk(extension="seed")`), run too
    variant: object = None
    variant_gains: tuple = ()

    @property
    def t_final(self) -> float:
        return self.dt * self.steps


SETUPS = {
    "suslov": Setup(
        "suslov",
        "Suslov problem on SO(3) (Chang and Perlmutter (2019) sec. 3.1)",
        lambda: geomjax.models.suslov(inertia=(1.0, 2.0, 3.0), xi=(0.3, 0.5, 0.8), omega0=(1.0, 0.4, -0.625)),
        steps=20_000,
        gains=(10.0, 10.0, 10.0),
        notes="I = diag(1, 2, 3), xi = (0.3, 0.5, 0.8) (not an eigenvector of I, so the motion is not a "
        "uniform spin and there is no closed form: errors are against RK4 with h/10), "
        "Omega0 = (1, 0.4, -0.625), R0 = I; gains (k_J, k_H, k_0) = (10, 10, 10), k_0/4 |R^T R - I|^2 in V. "
        "With xi an eigenvector (the paper's exact case, tested in tests/test_nonholonomic_models.py) J and "
        "H are kept exactly by every method",
        path_indices=None,
        short="Suslov problem on SO(3)",
    ),
    "knife-edge": Setup(
        "knife-edge",
        "knife edge on an inclined plane (Chang and Perlmutter (2019) sec. 3.2)",
        lambda: geomjax.models.knife_edge(m=1.0, inertia=1.0, g=9.81, alpha=np.pi / 6, omega=2.0),
        steps=10_000,
        gains=(10.0, 10.0, 10.0),
        notes="m = J = 1, g = 9.81, alpha = pi/6, Omega = 2, start at rest at the origin; "
        "gains (k_J, k_H, k_pphi) = 10",
        short="knife edge on an inclined plane",
    ),
    "chaplygin-sleigh": Setup(
        "chaplygin-sleigh",
        "Chaplygin sleigh on SE(2), angle embedded as (cos, sin) (Chang and Perlmutter (2019) sec. 3.3)",
        lambda: geomjax.models.chaplygin_sleigh(m=1.0, inertia=1.0, a=1.0, v0=1.0, omega0=1.0),
        steps=10_000,
        gains=(10.0, 10.0, 10.0),
        notes="m = J = a = 1, v0 = omega0 = 1; gains (k_J, k_H, k_0) = 10, k_0/4 (c^2 + s^2 - 1)^2 in V",
        short=r"Chaplygin sleigh on SE(2), $\theta$ as $(\cos\theta, \sin\theta)$",
    ),
    "vertical-disk": Setup(
        "vertical-disk",
        "vertical rolling disk (Chang and Perlmutter (2019) sec. 3.4)",
        lambda: geomjax.models.vertical_disk(),
        steps=10_000,
        gains=(10.0, 10.0, 10.0, 10.0, 10.0),
        notes="uniform thin disk m = R = 1, I_phi = 1/4, I_theta = 1/2, Omega_phi = 1, Omega_theta = 2 "
        "(circle of radius 2); gains 10 on (J1, J2, H, p_phi, p_theta). Also Chang and Perlmutter's (2019) own extension (60), "
        "vertical_disk(extension='seed'), in which all momenta (the body momenta mu_1, mu_2 and p_phi, p_theta) "
        "are conserved on the whole phase space, with the paper's feedback (61): V quadratic in the four "
        "momenta, gains (k_H, k_mu1, k_mu2, k_pphi, k_ptheta) = (0, 10, 10, 10, 10). The generic extension keeps "
        "J and H_ext everywhere but p_phi, p_theta only on J = 0; on J = 0 both are the rolling disk",
        short="vertical rolling disk",
        variant=lambda: geomjax.models.vertical_disk(extension="seed"),
        variant_gains=(0.0, 10.0, 10.0, 10.0, 10.0),
    ),
    "roller-racer": Setup(
        "roller-racer",
        "roller racer on SE(2) x S^1 (Chang and Perlmutter (2019) sec. 3.5)",
        lambda: geomjax.models.roller_racer(),
        steps=10_000,
        gains=(10.0, 10.0, 10.0, 10.0),
        notes="m = I1 = 1, I2 = 0.5, d1 = 1, d2 = 0.5, phi0 = 0.5, omega0 = 0.3, phidot0 = 0.5; "
        "gains (k_J1, k_J2, k_H, k_0) = 10",
        short=r"roller racer on SE(2) $\times\ S^1$",
    ),
    "heisenberg": Setup(
        "heisenberg",
        "Heisenberg system (Chang and Perlmutter (2019) sec. 3.6)",
        lambda: geomjax.models.heisenberg(),
        steps=10_000,
        gains=(1.0, 1.0, 1.0),
        notes="q0 = (1, 0.5, 0), (xdot0, ydot0) = (0.3, 1); gains (k_J, k_H, k_Lz) = 1; the paper left "
        "this simulation to the reader. On the constraint set the motion is a straight line at constant "
        "speed, which explicit Euler and RK4 reproduce exactly (errors at round-off, 1e-12, for every method): "
        "nothing to see. So the runs start OFF the constraint set, p_z0 raised by 0.1 (J0 = 0.1), with the "
        "feedback targets (J, H, L_z) = (0, H, L_z) of the start on the set: the feedback integrators are "
        "pulled back to the constraint set and the target levels, the extended field without feedback keeps "
        "J (it is a first integral of X) and so stays off, and its Euler run drifts further. There is no "
        "exact solution from an off-set start, so no error figure. The invariant set is not compact: the "
        "gradients of J and L_z grow with |q|, so the Euler step limit 2/lambda_max shrinks along the path "
        "(with gains 10 feedback Euler at h = 1e-3 blows up near t = 8)",
        short="Heisenberg system",
        start_offset=(0.0, 0.0, 0.0, 0.0, 0.0, 0.1),
    ),
}


def _start(model, setup: Setup):
    if setup.start_offset is None:
        return model.x0
    return model.x0 + jnp.asarray(setup.start_offset)


def _integrate(field, model, setup: Setup, progress, method, **kwargs):
    if setup.start_offset is not None:
        kwargs = {"start_tol": None, "drift_tol": None, **kwargs}  # a start off the set on purpose
    return geomjax.integrate(
        field,
        _start(model, setup),
        dt=setup.dt,
        steps=setup.steps,
        save_every=setup.save_every,
        method=method,
        progress=progress,
        throw=False,
        **kwargs,
    )


def _feedback(model, gains, pin: bool = False):
    """The feedback field; with `pin` its targets are those of the model's start (on the
    constraint set) whatever the run's start."""
    target = None
    if pin:
        target = geomjax.nonholonomic_quantities(model.system, model.x0)
    return geomjax.feedback_field(model.system, model.x0, gains=jnp.asarray(gains), target=target)


def _run(name, description, field, model, method, style=None, *, feedback: bool) -> Method:
    """`method` on `field`; a run without feedback is made with drift_tol=None (its drift
    is the point of the comparison; the table's "default check" says where default
    monitoring would stop it)."""
    options = {} if feedback else {"drift_tol": None}
    return Method(
        name, description, lambda s, p: _integrate(field, model, s, p, method, **options), style or {},
        target=lambda s: field, monitored=feedback,
    )


def _methods(model, setup: Setup) -> list[Method]:
    y = _feedback(model, setup.gains, pin=setup.start_offset is not None)
    x = geomjax.nonholonomic_field(model.system)
    dashed = {"linestyle": "--"}
    methods = [
        _run("feedback Euler", "explicit Euler on Y = X - grad V", y, model, "euler", feedback=True),
        _run("feedback RK4", "classical RK4 on Y = X - grad V", y, model, "rk4", feedback=True),
        _run("Euler, no feedback", "explicit Euler on the extended field X (drift_tol=None)", x, model, "euler",
             dashed, feedback=False),
        _run("RK4, no feedback", "classical RK4 on the extended field X (drift_tol=None)", x, model, "rk4",
             dashed, feedback=False),
    ]
    if setup.variant is not None:
        seed = setup.variant()
        ys = _feedback(seed, setup.variant_gains)
        xs = geomjax.dirac_field(seed.system)
        dotted = {"linestyle": ":"}
        methods += [
            _run("paper (60): feedback Euler", "explicit Euler on Chang and Perlmutter's (2019) momentum-conserving extension (60) "
                 "with its feedback (61), V quadratic in the four momenta", ys, seed, "euler", {"linestyle": "-."},
                 feedback=True),
            _run("paper (60): Euler, no feedback", "explicit Euler on Chang and Perlmutter's (2019) extension (60) (drift_tol=None)",
                 xs, seed, "euler", dotted, feedback=False),
            _run("paper (60): RK4, no feedback", "classical RK4 on Chang and Perlmutter's (2019) extension (60) (drift_tol=None)",
                 xs, seed, "rk4", dotted, feedback=False),
        ]
    return methods


def monitored(model, xs) -> tuple[list[str], np.ndarray]:
    """Names and |values| along a trajectory: |J_a|, |H − H₀|, |I − I₀|, embedding defect."""
    system = model.system
    xs = jnp.asarray(xs)
    f_of = jax.jit(jax.vmap(lambda x: geomjax.nonholonomic_quantities(system, x)))
    h_of = jax.jit(jax.vmap(system.hamiltonian))
    f = np.asarray(f_of(xs))
    f0 = np.asarray(geomjax.nonholonomic_quantities(system, model.x0))
    k = geomjax.nonholonomic_field(system).momenta(model.x0).shape[0]
    names = list(model.quantity_names[:k])
    cols = [np.abs(f[:, a]) for a in range(k)]
    names.append("H")
    cols.append(np.abs(np.asarray(h_of(xs)) - float(system.hamiltonian(model.x0))))
    for j, q in enumerate(model.quantity_names[k + 1 : k + 1 + f.shape[1] - k - 1]):
        names.append(q)
        cols.append(np.abs(f[:, k + 1 + j] - f0[k + 1 + j]))
    if system.structure.embedded:
        names.append("embedding")
        cols.append(np.asarray(jax.jit(jax.vmap(lambda x: geomjax.embedding_defect(system, x)))(xs)))
    return names, np.stack(cols, axis=1)


def _reference(model, setup: Setup, ts):
    """The exact solution at `ts`, or RK4 on the extended field with h/10 where none is known;
    `(None, None)` for a start off the constraint set (no solution to compare with)."""
    if setup.start_offset is not None:
        return None, None
    if model.exact is not None:
        return np.asarray(jax.jit(jax.vmap(model.exact))(jnp.asarray(ts))), "exact solution"
    sol = geomjax.integrate(
        geomjax.nonholonomic_field(model.system),
        model.x0,
        dt=setup.dt / 10,
        steps=10 * setup.steps,
        save_every=10 * setup.save_every,
        method="rk4",
    )
    return np.asarray(sol.xs), f"reference (RK4 on X, h = {setup.dt / 10:g})"


def _clusters(names: list[str], together) -> list[list[str]]:
    """The groups of `names` linked by the relation `together(a, b)` (its transitive
    closure), each in the order of `names`; singletons left out."""
    group = {n: n for n in names}

    def root(n):
        while group[n] != n:
            n = group[n]
        return n

    for a, name in enumerate(names):
        for other in names[a + 1 :]:
            if together(name, other):
                group[root(other)] = root(name)
    clusters: dict[str, list[str]] = {}
    for n in names:
        clusters.setdefault(root(n), []).append(n)
    return [c for c in clusters.values() if len(c) > 1]


def _zero_note(fig, ax, series: dict) -> list[str]:
    """Say in the panel's title which curves cannot be seen or sit on each other: the
    methods whose error is exactly 0 at every save after the start (not drawn on a log
    axis) or at most of them (gaps), and groups of curves equal to 1% at every save
    (each drawn with its own marker). Returns the names that have nothing to draw."""
    from ._common import wrap_title

    everywhere, mostly = [], []
    for name, y in series.items():
        zero = np.asarray(y, dtype=float)[1:] == 0.0  # the start is 0 for every method
        if zero.all():
            everywhere.append(name)
        elif zero.mean() > 0.5:
            mostly.append(name)
    values = {n: np.asarray(y, dtype=float) for n, y in series.items() if n not in everywhere}

    def close(a, b):
        y, z = values[a], values[b]
        with np.errstate(invalid="ignore", divide="ignore"):
            near = np.abs(y - z) <= 1e-2 * np.maximum(np.abs(y), np.abs(z))
        return bool(np.all(near[1:]) and np.any(y[1:] > 0))

    hidden = [" = ".join(c) for c in _clusters(list(values), close)]
    parts = [
        f"{label}: " + "; ".join(names)
        for label, names in (
            ("exactly 0, not drawn", everywhere),
            ("0 at most saves (gaps)", mostly),
            ("on top of each other (within 1%)", hidden),
        )
        if names
    ]
    if parts:
        width = fig.get_figwidth() * ax.get_position().width
        ax.set_title(wrap_title("\n".join(parts), width, 8.0), fontsize=8.0, loc="left")
    return everywhere


def _with_markers(styles: dict) -> dict:
    """Each method's style with a marker of its own (hollow), so that curves that agree
    to a line width stay distinguishable in every figure."""
    from ._common import MARKERS

    return {
        name: {"marker": MARKERS[i % len(MARKERS)], "markerfacecolor": "none", **style}
        for i, (name, style) in enumerate(styles.items())
    }


def _draw_errors(fig, ax, ts, series: dict, styles, ylabel) -> None:
    """The log error curves of a panel, with the notes of `_zero_note` in its title; a
    panel where every method is exactly 0 says so in its middle."""
    from ._common import _draw_log_errors

    zero = _zero_note(fig, ax, series)
    drawable = {n: y for n, y in series.items() if n not in zero}
    if drawable:
        _draw_log_errors(ax, ts, drawable, styles, ylabel)
    else:
        ax.text(0.5, 0.5, "exactly 0 for every method", transform=ax.transAxes, ha="center", va="center")
        ax.set_ylabel(ylabel)


def _plot_invariants(path, ts, errors: dict, names, title, styles):
    """One log panel per monitored quantity (no empty panels), with notes on exact zeros;
    the legend in the spare panel or below the panels."""
    from ._common import _figure, _save, delta_label

    m = len(names)
    ncols = m if m <= 3 else (2 if m == 4 else 3)
    nrows = -(-m // ncols)
    fig, axes = _figure(nrows, ncols, size=(4.6 * ncols, 3.2 * nrows + 1.4))
    for j, q in enumerate(names):
        ax = axes.flat[j]
        _draw_errors(fig, ax, ts, {k: v[:, j] for k, v in errors.items()}, styles, delta_label(q))
        if j >= m - ncols:
            ax.set_xlabel("t")
            ax.xaxis.set_tick_params(labelbottom=True)
    spare = list(axes.flat)[m:]
    for ax in spare:
        ax.set_axis_off()
    handles, labels = _legend(styles)
    if spare:  # the legend fills the spare panel
        spare[0].legend(handles, labels, loc="center", fontsize="small")
    else:
        fig.legend(handles, labels, loc="outside lower center", ncols=_legend_columns(len(labels)), fontsize="small")
    fig.suptitle(title, fontsize="medium")
    return _save(fig, path)


def _legend_columns(n: int) -> int:
    """Columns of a legend under the panels: one row up to 4 entries, else two rows."""
    return n if n <= 4 else -(-n // 2)


def _legend(styles):
    """A legend entry for every method (also those with nothing drawn in a panel)."""
    from ._common import _legend_handles

    return _legend_handles(list(styles), styles)


def _plot_error(path, ts, exact: dict, title, styles):
    from ._common import _figure, _save

    fig, axes = _figure(size=(8.0, 5.0))
    ax = axes[0, 0]
    _draw_errors(fig, ax, ts, exact, styles, r"$\max_i |x_i(t) - x_i^{\mathrm{ref}}(t)|$")
    ax.set_xlabel("t")
    handles, labels = _legend(styles)
    fig.legend(handles, labels, loc="outside lower center", ncols=_legend_columns(len(labels)), fontsize="small")
    fig.suptitle(title, fontsize="medium")
    return _save(fig, path)


def _last_finite(xy: np.ndarray) -> int | None:
    ok = np.flatnonzero(np.all(np.isfinite(xy), axis=1))
    return int(ok[-1]) if ok.size else None


def _zoom_window(ends: dict, reference: str | None):
    """Centre, half-width and the far end points of the zoom on the end points `ends`
    (name -> (x, y)). The centre is the reference's end where there is one (else the
    mean); an end more than 10 times farther from it than every other one is left out
    of the window (and returned, name -> distance), so that a single run far off does
    not squeeze the others into one dot."""
    points = np.array(list(ends.values()))
    centre = ends[reference] if reference is not None else points.mean(axis=0)
    floor = 1e-6 * (1.0 + np.abs(centre).max())
    dist = {n: float(np.hypot(*(e - centre))) for n, e in ends.items()}
    order = sorted(dist, key=dist.get)
    outside = {}
    while len(order) > 1 and dist[order[-2]] > floor and dist[order[-1]] > 10.0 * dist[order[-2]]:
        name = order.pop()
        outside[name] = dist[name]
    half = max(1.5 * max(dist[n] for n in order), floor)
    return centre, half, dict(reversed(outside.items()))


def _plot_paths(path, runs, ref, ref_name, setup: Setup, styles):
    """The path in the (x, y) plane, and a zoom on its end where the methods part; `ref`
    (the exact solution or the reference run at the saves) in grey where there is one.
    Every method has its own marker: staggered along the path in the left panel, on its
    end point in the zoom; the zoom's title names the methods whose end points agree to
    a line width."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from ._common import _markevery, _save, wrap_title

    i, j = setup.path_indices
    fig = Figure(figsize=(11.0, 5.6), layout="constrained")
    full, zoom = fig.subplots(1, 2)
    ends = {}
    if ref is not None:
        label = ref_name.split(" (")[0]
        for ax in (full, zoom):
            ax.plot(ref[:, i], ref[:, j], color="black", linewidth=3.0, alpha=0.25, label=label)
        ends[label] = ref[-1, [i, j]]
    paths = {r.method.name: np.asarray(r.solution.xs)[:, [i, j]] for r in runs}
    for k, (name, xy) in enumerate(paths.items()):
        style = {"markersize": 5, **styles[name]}
        full.plot(xy[:, 0], xy[:, 1], label=name, markevery=_markevery(len(xy), k, len(paths)), **style)
        last = _last_finite(xy)
        if last is not None:
            zoom.plot(xy[:, 0], xy[:, 1], label=name, markevery=[last], **{**style, "markersize": 8})
            ends[name] = xy[last]
    for ax in (full, zoom):
        ax.set_xlabel("x")
        ax.set_ylabel("y")
        ax.grid(True, alpha=0.3)
    # Equal aspect only where the path's shape is close to the panel's: otherwise most of
    # the panel would be empty.
    finite = np.concatenate([xy[np.all(np.isfinite(xy), axis=1)] for xy in paths.values()])
    span = np.ptp(finite, axis=0)
    if span.min() > 0.6 * span.max():
        full.set_aspect("equal", adjustable="datalim")
    full.set_title(f"path in the (x, y) plane, t ≤ {setup.t_final:g}", fontsize="medium")
    centre, half, outside = _zoom_window(ends, ref_name.split(" (")[0] if ref is not None else None)
    zoom.set_xlim(centre[0] - half, centre[0] + half)
    zoom.set_ylim(centre[1] - half, centre[1] + half)
    zoom.set_aspect("equal", adjustable="box")
    for axis in (zoom.xaxis, zoom.yaxis):
        axis.set_major_locator(MaxNLocator(4))
    zoom.ticklabel_format(useOffset=False)
    # end points within 1/150 of the window (about 2 px) are one dot to the eye
    same = _clusters([n for n in ends if n in paths], lambda a, b: np.hypot(*(ends[a] - ends[b])) < half / 75)
    title = f"zoom on the end points (t = {setup.t_final:g}, markers)"
    if same:
        title += "\nsame end point: " + "; ".join(" = ".join(c) for c in same)
    if outside:
        title += "\nend off this window: " + "; ".join(f"{n} ({d:.2g} away)" for n, d in outside.items())
    size = 10.0 if not (same or outside) else 8.5
    zoom.set_title(wrap_title(title, fig.get_figwidth() * zoom.get_position().width, size), fontsize=size)
    handles, labels = full.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=_legend_columns(len(labels)), fontsize="small")
    fig.suptitle(f"{_short(setup)}, h = {setup.dt:g}", fontsize="medium")
    return _save(fig, path)


_DISPLAY = {"p_phi": r"p_\phi", "p_theta": r"p_\theta", "embedding": "D", "L_z": "L_z"}


def _short(setup: Setup) -> str:
    return setup.short or setup.title.split(" (")[0]


def _invariants_title(setup: Setup, model, names) -> str:
    k = geomjax.nonholonomic_field(model.system).momenta(model.x0).shape[0]
    parts = ["constraint " + ", ".join(f"${n.replace('J', 'J_')}$" if len(n) > 1 else "$J$" for n in names[:k])]
    parts.append("energy $H$ (original)")
    others = [n for n in names[k + 1 :] if n != "embedding"]
    if others:
        parts.append("momenta " + ", ".join(f"${_DISPLAY.get(n, n)}$" for n in others))
    if "embedding" in names:
        parts.append("distance $D$ to the group")
    start = "" if setup.start_offset is None else "; start off the constraint set, targets those on it"
    return f"{_short(setup)}, h = {setup.dt:g}{start}\nerrors of the " + ", ".join(parts)


def run_system(setup: Setup, out_dir: pathlib.Path, progress: bool) -> dict:
    model = setup.make_model()
    methods = _methods(model, setup)
    runs = [run_method(m, setup, progress) for m in methods]
    ts = np.asarray(runs[0].solution.ts)
    styles = _with_markers(method_styles(methods))
    ref, ref_name = _reference(model, setup, ts)
    errors, exact = {}, {}
    for r in runs:
        names, errors[r.method.name] = monitored(model, r.solution.xs)
        if ref is not None:
            exact[r.method.name] = np.max(np.abs(np.asarray(r.solution.xs) - ref), axis=1)
    out_dir = pathlib.Path(out_dir)
    figures = [
        _plot_invariants(
            out_dir / f"{setup.name}_invariants.png",
            ts,
            errors,
            [_DISPLAY.get(q, q) for q in names],
            _invariants_title(setup, model, names),
            styles,
        )
    ]
    if ref is not None:
        figures.append(
            _plot_error(
                out_dir / f"{setup.name}_error.png",
                ts,
                exact,
                f"{_short(setup)}, h = {setup.dt:g}\nerror against the {ref_name}",
                styles,
            )
        )
    if setup.path_indices is not None:
        figures.append(_plot_paths(out_dir / f"{setup.name}_path.png", runs, ref, ref_name, setup, styles))

    y = geomjax.feedback_field(model.system, model.x0, gains=jnp.asarray(setup.gains))
    limit = float(y.euler_step_limit(model.x0))
    # The limit depends on the state: evaluate it along the feedback-RK4 trajectory too.
    along = np.asarray(runs[1].solution.xs)[:: max(1, len(ts) // 20)]
    limits = np.asarray(jax.jit(jax.vmap(y.euler_step_limit))(jnp.asarray(along)))
    summary, per_method = [], {}
    for r in runs:
        e = errors[r.method.name]
        row = {"method": r.method.name}
        for j, q in enumerate(names):
            row[f"max |d{q}|"] = max_finite(e[:, j])
        if ref is not None:
            row["max err ref"] = max_finite(exact[r.method.name])
        row["run [s]"] = r.run_time_s
        if setup.start_offset is None:
            check = default_check(r.method.target(setup), r.solution, setup.save_every)
        else:
            check = "n/a (starts off the set)"
        row["default check"] = check
        summary.append(row)
        per_method[r.method.name] = {
            "description": r.method.description,
            "status": r.solution.message,
            "monitored": r.method.monitored,
            "default_check": check,
            "wall_time_s": r.wall_time_s,
            "run_time_s": r.run_time_s,
            "final": {q: float(e[-1, j]) for j, q in enumerate(names)},
            "final_error_against_reference": float(exact[r.method.name][-1]) if ref is not None else None,
        }
    return {
        "setup": {
            "parameters": {k: np.asarray(v).tolist() for k, v in model.params.items()},
            "x0": np.asarray(_start(model, setup)).tolist(),
            "feedback_targets_from": np.asarray(model.x0).tolist(),
            "dt": setup.dt,
            "steps": setup.steps,
            "t_final": setup.t_final,
            "gains": list(setup.gains),
            "variant_gains": list(setup.variant_gains),
            "notes": setup.notes,
            "reference": ref_name,
            "euler_step_limit": limit,
            "h_times_lambda_max": 2.0 * setup.dt / limit,
            "euler_step_limit_min_along_path": float(np.min(limits)),
            "h_times_lambda_max_along_path": float(2.0 * setup.dt / np.min(limits)),
        },
        "methods": per_method,
        "summary": summary,
        "figures": [str(p) for p in figures],
    }


def _register(key: str):
    setup = SETUPS[key]

    @register(key, f"Chang and Perlmutter (2019): {setup.title}; feedback Euler/RK4 vs the extended field without feedback",
              options=("dt", "t_final", "gains"), quick={"t_final": 0.2})
    def run(out_dir: pathlib.Path, progress: bool, **options) -> dict:
        from ._common import with_options
        return run_system(with_options(setup, **options), out_dir, progress)

    return run


for _key in SETUPS:
    _register(_key)
