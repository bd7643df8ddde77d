"""Seed 001 §3: feedback integrators on six nonholonomic systems, one experiment each.

For each system (Suslov on SO(3), knife edge, Chaplygin sleigh, vertical rolling disk,
roller racer, Heisenberg system) four runs from the same start on the constraint set:

- feedback Euler and feedback RK4: the feedback field Y = X − ∇V
  (`geomjax.feedback_field`, V = ½ΔᵀKΔ on F = (J, H_ext, integrals), plus k₀/4‖D‖² on an
  embedded group), the seed's method;
- Euler and RK4 on the extended field X alone (`geomjax.nonholonomic_field`), no feedback.

Two systems differ (docs/reproductions.md says why): `heisenberg` starts off the
constraint set (on it the motion is a straight line that every method reproduces
exactly), with the feedback targets of the start on it; `vertical-disk` also runs seed
001's own extension (60), in which all momenta are conserved everywhere
(`vertical_disk(extension="seed")`), with the seed's feedback (61).

Figures: the errors of the monitored quantities (one log panel each; a panel's title
names the methods whose error is exactly zero and so not drawn), the error against the
reference, and the path in the (x, y) plane with a zoom on its end points.

The runs without feedback are made with `drift_tol=None`, so their curves show the whole
drift; the summary table's "default check" column gives the status `geomjax.integrate`'s
default monitoring (drift_tol = 1e-2) reports for each method ("ok" or the status and
step where a default run stops).

Recorded over time: the constraint |J|, the energy error |H − H₀| with the original H (as
the seed does), the errors of the other conserved momenta, the distance to the group
(‖RᵀR − I‖ or |cos² + sin² − 1|) where the group is embedded, and the error against the
exact solution where one exists (knife edge: the cycloid; Chaplygin sleigh: tanh/sech;
vertical disk: the circle; Heisenberg: the straight line). The seed's parameter values, steps and gains were lost in extraction: the
ones used are in each `SETUPS` entry and in the JSON.

Explicit Euler on Y is stable near the invariant set only for h·λ_max(∇²V) < 2 (λ_max the
largest eigenvalue of the Hessian of V; with gains k it scales like k·|∇F|²). The JSON
records 2/λ_max at x₀ (`euler_step_limit`) and its minimum along the path next to the step
used; where the gradients of F grow along the motion (Heisenberg) the limit shrinks.
"""

import pathlib
import textwrap
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
    #: seed 001's variant of the system (`vertical_disk(extension="seed")`), run too
    variant: object = None
    variant_gains: tuple = ()

    @property
    def t_final(self) -> float:
        return self.dt * self.steps


SETUPS = {
    "suslov": Setup(
        "suslov",
        "Suslov problem on SO(3) (seed 001 sec. 3.1)",
        lambda: geomjax.models.suslov(inertia=(1.0, 2.0, 3.0), xi=(0.3, 0.5, 0.8), omega0=(1.0, 0.4, -0.625)),
        steps=20_000,
        gains=(10.0, 10.0, 10.0),
        notes="I = diag(1, 2, 3), xi = (0.3, 0.5, 0.8) (not an eigenvector of I, so the motion is not a "
        "uniform spin and there is no closed form: errors are against RK4 with h/10), "
        "Omega0 = (1, 0.4, -0.625), R0 = I; gains (k_J, k_H, k_0) = (10, 10, 10), k_0/4 |R^T R - I|^2 in V. "
        "With xi an eigenvector (the seed's exact case, tested in tests/test_nonholonomic_models.py) J and "
        "H are kept exactly by every method",
        path_indices=None,
        short="Suslov problem on SO(3)",
    ),
    "knife-edge": Setup(
        "knife-edge",
        "knife edge on an inclined plane (seed 001 sec. 3.2)",
        lambda: geomjax.models.knife_edge(m=1.0, inertia=1.0, g=9.81, alpha=np.pi / 6, omega=2.0),
        steps=10_000,
        gains=(10.0, 10.0, 10.0),
        notes="m = J = 1, g = 9.81, alpha = pi/6, Omega = 2, start at rest at the origin; "
        "gains (k_J, k_H, k_pphi) = 10",
        short="knife edge on an inclined plane",
    ),
    "chaplygin-sleigh": Setup(
        "chaplygin-sleigh",
        "Chaplygin sleigh on SE(2), angle embedded as (cos, sin) (seed 001 sec. 3.3)",
        lambda: geomjax.models.chaplygin_sleigh(m=1.0, inertia=1.0, a=1.0, v0=1.0, omega0=1.0),
        steps=10_000,
        gains=(10.0, 10.0, 10.0),
        notes="m = J = a = 1, v0 = omega0 = 1; gains (k_J, k_H, k_0) = 10, k_0/4 (c^2 + s^2 - 1)^2 in V",
        short=r"Chaplygin sleigh on SE(2), $\theta$ as $(\cos\theta, \sin\theta)$",
    ),
    "vertical-disk": Setup(
        "vertical-disk",
        "vertical rolling disk (seed 001 sec. 3.4)",
        lambda: geomjax.models.vertical_disk(),
        steps=10_000,
        gains=(10.0, 10.0, 10.0, 10.0, 10.0),
        notes="uniform thin disk m = R = 1, I_phi = 1/4, I_theta = 1/2, Omega_phi = 1, Omega_theta = 2 "
        "(circle of radius 2); gains 10 on (J1, J2, H, p_phi, p_theta). Also seed 001's own extension (60), "
        "vertical_disk(extension='seed'), in which all momenta (the body momenta mu_1, mu_2 and p_phi, p_theta) "
        "are conserved on the whole phase space, with the seed's feedback (61): V quadratic in the four "
        "momenta, gains (k_H, k_mu1, k_mu2, k_pphi, k_ptheta) = (0, 10, 10, 10, 10). The generic extension keeps "
        "J and H_ext everywhere but p_phi, p_theta only on J = 0; on J = 0 both are the rolling disk",
        short="vertical rolling disk",
        variant=lambda: geomjax.models.vertical_disk(extension="seed"),
        variant_gains=(0.0, 10.0, 10.0, 10.0, 10.0),
    ),
    "roller-racer": Setup(
        "roller-racer",
        "roller racer on SE(2) x S^1 (seed 001 sec. 3.5)",
        lambda: geomjax.models.roller_racer(),
        steps=10_000,
        gains=(10.0, 10.0, 10.0, 10.0),
        notes="m = I1 = 1, I2 = 0.5, d1 = 1, d2 = 0.5, phi0 = 0.5, omega0 = 0.3, phidot0 = 0.5; "
        "gains (k_J1, k_J2, k_H, k_0) = 10",
        short=r"roller racer on SE(2) $\times\ S^1$",
    ),
    "heisenberg": Setup(
        "heisenberg",
        "Heisenberg system (seed 001 sec. 3.6)",
        lambda: geomjax.models.heisenberg(),
        steps=10_000,
        gains=(1.0, 1.0, 1.0),
        notes="q0 = (1, 0.5, 0), (xdot0, ydot0) = (0.3, 1); gains (k_J, k_H, k_Lz) = 1; the seed left "
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


def _methods(model, setup: Setup) -> list[Method]:
    y = _feedback(model, setup.gains, pin=setup.start_offset is not None)
    x = geomjax.nonholonomic_field(model.system)
    # The runs without feedback are made with drift_tol=None: their drift is the point of
    # the comparison. The table's "default check" says where default monitoring stops them.
    methods = [
        Method(
            "feedback Euler",
            "explicit Euler on Y = X - grad V",
            lambda s, p: _integrate(y, model, s, p, "euler"),
            target=lambda s: y,
        ),
        Method(
            "feedback RK4",
            "classical RK4 on Y = X - grad V",
            lambda s, p: _integrate(y, model, s, p, "rk4"),
            target=lambda s: y,
        ),
        Method(
            "Euler, no feedback",
            "explicit Euler on the extended field X (drift_tol=None)",
            lambda s, p: _integrate(x, model, s, p, "euler", drift_tol=None),
            {"linestyle": "--"},
            target=lambda s: x,
            monitored=False,
        ),
        Method(
            "RK4, no feedback",
            "classical RK4 on the extended field X (drift_tol=None)",
            lambda s, p: _integrate(x, model, s, p, "rk4", drift_tol=None),
            {"linestyle": "--"},
            target=lambda s: x,
            monitored=False,
        ),
    ]
    if setup.variant is not None:
        seed = setup.variant()
        ys = _feedback(seed, setup.variant_gains)
        xs = geomjax.dirac_field(seed.system)
        methods += [
            Method(
                "seed (60): feedback Euler",
                "explicit Euler on seed 001's momentum-conserving extension (60) with its feedback (61), "
                "V quadratic in the four momenta",
                lambda s, p: _integrate(ys, seed, s, p, "euler"),
                {"linestyle": "-."},
                target=lambda s: ys,
            ),
            Method(
                "seed (60): Euler, no feedback",
                "explicit Euler on seed 001's extension (60) (drift_tol=None)",
                lambda s, p: _integrate(xs, seed, s, p, "euler", drift_tol=None),
                {"linestyle": ":"},
                target=lambda s: xs,
                monitored=False,
            ),
            Method(
                "seed (60): RK4, no feedback",
                "classical RK4 on seed 001's extension (60) (drift_tol=None)",
                lambda s, p: _integrate(xs, seed, s, p, "rk4", drift_tol=None),
                {"linestyle": ":"},
                target=lambda s: xs,
                monitored=False,
            ),
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


def _zero_note(ax, series: dict) -> None:
    """Say in the panel's title which curves cannot be seen: the methods whose error is
    exactly 0 at every save after the start (not drawn on a log axis) or at most of them
    (gaps), and pairs of curves on top of each other."""
    everywhere, mostly = [], []
    for name, y in series.items():
        zero = np.asarray(y, dtype=float)[1:] == 0.0  # the start is 0 for every method
        if zero.all():
            everywhere.append(name)
        elif zero.mean() > 0.5:
            mostly.append(name)
    # curves hidden under another one: equal to 1% at every save
    hidden = []
    items = [(n, np.asarray(y, dtype=float)) for n, y in series.items() if n not in everywhere]
    for a, (name, y) in enumerate(items):
        for other, z in items[a + 1 :]:
            with np.errstate(invalid="ignore", divide="ignore"):
                close = np.abs(y - z) <= 1e-2 * np.maximum(np.abs(y), np.abs(z))
            if np.all(close[1:]) and np.any(y[1:] > 0):
                hidden.append(f"{name} = {other}")
    lines = []
    for label, names in (
        ("exactly 0, not drawn", everywhere),
        ("0 at most saves (gaps)", mostly),
        ("on top of each other (within 1%)", hidden),
    ):
        if names:
            lines.extend(textwrap.wrap(f"{label}: " + "; ".join(names), 60))
    if lines:
        ax.set_title("\n".join(lines), fontsize="x-small", loc="left")


def _plot_invariants(path, ts, errors: dict, names, title, styles):
    """One log panel per monitored quantity (no empty panels), with notes on exact zeros."""
    from ._common import _draw_log_errors, _figure, _save, delta_label

    m = len(names)
    ncols = m if m <= 3 else (2 if m == 4 else 3)
    nrows = -(-m // ncols)
    fig, axes = _figure(nrows, ncols, size=(4.6 * ncols, 3.0 * nrows + 1.2))
    for j, q in enumerate(names):
        ax = axes.flat[j]
        series = {k: v[:, j] for k, v in errors.items()}
        _draw_log_errors(ax, ts, series, styles, delta_label(q))
        _zero_note(ax, series)
        if j >= m - ncols:
            ax.set_xlabel("t")
            ax.xaxis.set_tick_params(labelbottom=True)
    spare = list(axes.flat)[m:]
    for ax in spare:
        ax.set_axis_off()
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if spare:  # the legend fills the spare panel
        spare[0].legend(handles, labels, loc="center", fontsize="small")
    else:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 4), fontsize="small")
    fig.suptitle(title, fontsize="medium")
    return _save(fig, path)


def _plot_error(path, ts, exact: dict, title, styles):
    from ._common import _draw_log_errors, _figure, _save

    fig, axes = _figure(size=(7.5, 4.4))
    ax = axes[0, 0]
    _draw_log_errors(ax, ts, exact, styles, r"$\max_i |x_i(t) - x_i^{\mathrm{ref}}(t)|$")
    _zero_note(ax, exact)
    ax.set_xlabel("t")
    ax.legend(loc="best", fontsize="x-small")
    fig.suptitle(title, fontsize="medium")
    return _save(fig, path)


def _plot_paths(path, runs, ref, ref_name, setup: Setup, styles):
    """The path in the (x, y) plane, and a zoom on its end where the methods part; `ref`
    (the exact solution or the reference run at the saves) in grey where there is one."""
    from matplotlib.figure import Figure

    i, j = setup.path_indices
    fig = Figure(figsize=(11.0, 5.0), layout="constrained")
    full, zoom = fig.subplots(1, 2)
    ends = []
    if ref is not None:
        label = ref_name.split(" (")[0]
        for ax in (full, zoom):
            ax.plot(ref[:, i], ref[:, j], color="black", linewidth=3.0, alpha=0.25, label=label)
        ends.append(ref[-1, [i, j]])
    for r in runs:
        xs = np.asarray(r.solution.xs)
        for ax in (full, zoom):
            ax.plot(xs[:, i], xs[:, j], label=r.method.name, **styles[r.method.name])
        zoom.plot(xs[-1, i], xs[-1, j], "o", markersize=4, color=styles[r.method.name]["color"])
        ends.append(xs[-1, [i, j]])
    ends = np.array([e for e in ends if np.all(np.isfinite(e))])
    for ax in (full, zoom):
        ax.set_xlabel("x")
        ax.set_ylabel("y")
        ax.grid(True, alpha=0.3)
    # Equal aspect only where it does not leave most of the panel empty.
    span = np.ptp(np.concatenate([np.asarray(r.solution.xs)[:, [i, j]] for r in runs]), axis=0)
    if span.min() > 0.25 * span.max():
        full.set_aspect("equal", adjustable="datalim")
    full.set_title(f"path in the (x, y) plane, t ≤ {setup.t_final:g}", fontsize="medium")
    centre = ends.mean(axis=0)
    half = max(1.5 * np.abs(ends - centre).max(), 1e-6 * (1.0 + np.abs(centre).max()))
    zoom.set_xlim(centre[0] - half, centre[0] + half)
    zoom.set_ylim(centre[1] - half, centre[1] + half)
    zoom.set_aspect("equal", adjustable="box")
    from matplotlib.ticker import MaxNLocator

    for axis in (zoom.xaxis, zoom.yaxis):
        axis.set_major_locator(MaxNLocator(4))
    zoom.set_title(f"zoom on the end points (t = {setup.t_final:g}, dots)", fontsize="medium")
    full.legend(fontsize="x-small", loc="best")
    fig.suptitle(f"{_short(setup)}, h = {setup.dt:g}", fontsize="medium")
    path = pathlib.Path(path)
    fig.savefig(path, dpi=120)
    return path


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
    styles = method_styles(methods)
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

    @register(key, f"Seed 001: {setup.title}; feedback Euler/RK4 vs the extended field without feedback",
              options=("dt", "t_final", "gains"), quick={"t_final": 0.2})
    def run(out_dir: pathlib.Path, progress: bool, **options) -> dict:
        from ._common import with_options
        return run_system(with_options(setup, **options), out_dir, progress)

    return run


for _key in SETUPS:
    _register(_key)
