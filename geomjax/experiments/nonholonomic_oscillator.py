"""Seed 001 §3.7: the nonholonomic oscillator, feedback integrator vs discrete Lagrange–d'Alembert.

System (`geomjax.models.nonholonomic_oscillator`): q = (x, y, z), H = ½(|p|² + |q|²) +
(ε/2)x²z², constraint ẋ + y ż = 0; conserved: the constraint momentum J = p_x + y p_z, the
energy H and the energy of the decoupled y-motion H_y = ½(y² + ẏ²).

Methods: explicit Euler on the feedback field (V = ½(k_J J² + k_H ΔH² + k_y ΔH_y²)), the
seed's integrator; and the McLachlan–Perlmutter DLA step (`geomjax.dla`, second order,
Newton solve per step). The seed compared two first-order schemes; our DLA is the
second-order one from REFERENCES.md. Also, for reference, feedback RK4.

Figures: |J|, |ΔH| and |ΔH_y| over time (seed Fig. 6), and Poincaré sections (seed Fig. 7):
each time y crosses 0 upwards (ẏ > 0), the points (x, z) and (z, ż), linearly interpolated
between steps, one row per method. (On the constraint ẋ = −y ż vanishes at y = 0, so the
(x, ẋ) plane would show only the constraint error; we use (x, z) instead.)

The seed's ε, initial state, step and gains were lost in extraction; ours: ε = 0.3
(McLachlan–Perlmutter), q₀ = (1, 0, 1), p₀ = (0, 1, 0.5), h = 0.01, gains 10, t ≤ 200 for
the time series and t ≤ 2000 for the sections (where feedback Euler is also run with h/10).
"""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np

import geomjax

from . import register
from ._common import Method, max_finite, method_styles, plot_error_grid, run_method

NAME = "nonholonomic-oscillator"


class Setup:
    def __init__(self, steps, save_every, dt=0.01, gains=(10.0, 10.0, 10.0), eps=0.3):
        self.model = geomjax.models.nonholonomic_oscillator(eps=eps)
        self.dt, self.steps, self.save_every, self.gains = dt, steps, save_every, gains

    @property
    def t_final(self):
        return self.dt * self.steps


def _feedback(method):
    def produce(setup, progress):
        y = geomjax.feedback_field(setup.model.system, setup.model.x0, gains=jnp.asarray(setup.gains))
        return geomjax.integrate(
            y, setup.model.x0, dt=setup.dt, steps=setup.steps, save_every=setup.save_every,
            method=method, progress=progress, throw=False,
        )

    return produce


def _dla(setup, progress):
    return geomjax.integrate(
        geomjax.dla(setup.model.system), setup.model.x0, dt=setup.dt, steps=setup.steps,
        save_every=setup.save_every, progress=progress, throw=False,
    )


METHODS = [
    Method("feedback Euler", "explicit Euler on Y = X - grad V, gains (k_J, k_H, k_Hy) = 10", _feedback("euler")),
    Method("DLA", "McLachlan-Perlmutter discrete Lagrange-d'Alembert (order 2, Newton per step)", _dla),
    Method("feedback RK4", "classical RK4 on Y = X - grad V", _feedback("rk4"), {"linestyle": ":"}),
]


def _quantities(model, xs):
    f = np.asarray(jax.jit(jax.vmap(lambda x: geomjax.nonholonomic_quantities(model.system, x)))(jnp.asarray(xs)))
    h = np.asarray(jax.jit(jax.vmap(model.system.hamiltonian))(jnp.asarray(xs)))
    f0 = np.asarray(geomjax.nonholonomic_quantities(model.system, model.x0))
    h0 = float(model.system.hamiltonian(model.x0))
    return np.stack([np.abs(f[:, 0]), np.abs(h - h0), np.abs(f[:, 2] - f0[2])], axis=1)


def poincare_points(xs):
    """Upward crossings of y = 0 (ẏ = p_y > 0): interpolated (x, ẋ, z, ż), ẋ = p_x, ż = p_z."""
    xs = np.asarray(xs)
    y = xs[:, 1]
    idx = np.flatnonzero((y[:-1] < 0) & (y[1:] >= 0))
    s = (-y[idx] / (y[idx + 1] - y[idx]))[:, None]
    pts = xs[idx] + s * (xs[idx + 1] - xs[idx])
    return np.stack([pts[:, 0], pts[:, 3], pts[:, 2], pts[:, 5]], axis=1)


def _plot_sections(path, runs_long, title):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12.0, 3.4 * len(runs_long) + 0.6), layout="constrained")
    axes = fig.subplots(len(runs_long), 3, squeeze=False)
    for row, (name, xs) in enumerate(runs_long):
        xs = np.asarray(xs)
        pts = poincare_points(xs)
        ax = axes[row, 0]
        tail = xs[-3000:]
        ax.plot(tail[:, 0], tail[:, 2], linewidth=0.5)
        ax.set_xlabel("x")
        ax.set_ylabel("z")
        ax.set_title(f"{name}: trajectory (x, z), last 3000 steps", fontsize="small")
        ax = axes[row, 1]
        ax.plot(pts[:, 0], pts[:, 2], ".", markersize=2)
        ax.set_xlabel("x")
        ax.set_ylabel("z")
        ax.set_title(rf"{name}: section y = 0, $\dot y$ > 0, in (x, z)", fontsize="small")
        ax = axes[row, 2]
        ax.plot(pts[:, 2], pts[:, 3], ".", markersize=2)
        ax.set_xlabel("z")
        ax.set_ylabel(r"$\dot z$")
        ax.set_title(rf"{name}: section in (z, $\dot z$)", fontsize="small")
        for ax in axes[row]:
            ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    path = pathlib.Path(path)
    fig.savefig(path, dpi=110)
    return path


@register(
    NAME,
    "Seed 001 sec. 3.7: nonholonomic oscillator, feedback Euler vs discrete Lagrange-d'Alembert; "
    "energy, constraint, H_y errors and Poincare sections",
    quick={"series_steps": 200, "section_steps": 3000},
)
def run(out_dir: pathlib.Path, progress: bool, series_steps: int = 20_000, section_steps: int = 200_000) -> dict:
    out_dir = pathlib.Path(out_dir)
    setup = Setup(series_steps, save_every=10)
    runs = [run_method(m, setup, progress) for m in METHODS]
    ts = np.asarray(runs[0].solution.ts)
    names = ["J", "H", "H_y"]
    errors = {r.method.name: _quantities(setup.model, r.solution.xs) for r in runs}
    styles = method_styles(METHODS)
    figures = [
        plot_error_grid(
            out_dir / f"{NAME}_errors.png",
            ts,
            errors,
            names,
            title=f"nonholonomic oscillator, eps = 0.3, h = {setup.dt:g}: constraint, energy, y-energy (seed Fig. 6)",
            styles=styles,
            ncols=3,
        )
    ]
    long = Setup(section_steps, save_every=1)
    long_runs = [run_method(m, long, progress, rerun_for_timing=False) for m in METHODS]
    # Feedback Euler again with a ten times smaller step over the same time (saving every
    # 10th step, so the section is interpolated at the same time resolution).
    fine = Setup(10 * section_steps, save_every=10, dt=setup.dt / 10)
    fine_run = run_method(
        Method("feedback Euler, h/10", "explicit Euler on Y with h = 0.001", _feedback("euler")),
        fine,
        progress,
        rerun_for_timing=False,
    )
    long_runs.insert(1, fine_run)
    figures.append(
        _plot_sections(
            out_dir / f"{NAME}_poincare.png",
            [(r.method.name, r.solution.xs) for r in long_runs],
            f"Poincare sections, t <= {long.t_final:g}, h = {long.dt:g} (seed Fig. 7)",
        )
    )
    summary, methods = [], {}
    for r in runs:
        e = errors[r.method.name]
        summary.append(
            {
                "method": r.method.name,
                "max |J|": max_finite(e[:, 0]),
                "max |dH|": max_finite(e[:, 1]),
                "max |dH_y|": max_finite(e[:, 2]),
                "run [s]": r.run_time_s,
                # every run here is made with the default monitoring (drift_tol = 1e-2)
                "default check": "ok" if bool(r.solution.ok) else r.solution.message,
            }
        )
        methods[r.method.name] = {
            "description": r.method.description,
            "status": r.solution.message,
            "run_time_s": r.run_time_s,
            "final": {q: float(e[-1, j]) for j, q in enumerate(names)},
            # secular drift detector: energy error maxima over the four quarters of the run
            "energy_error_quarter_maxima": [float(w.max()) for w in np.array_split(e[1:, 1], 4)],
        }
    sections = {r.method.name: int(poincare_points(r.solution.xs).shape[0]) for r in long_runs}
    y = geomjax.feedback_field(setup.model.system, setup.model.x0, gains=jnp.asarray(setup.gains))
    return {
        "setup": {
            "eps": 0.3,
            "x0": np.asarray(setup.model.x0).tolist(),
            "dt": setup.dt,
            "steps_series": series_steps,
            "steps_sections": section_steps,
            "gains": list(setup.gains),
            "euler_step_limit": float(y.euler_step_limit(setup.model.x0)),
        },
        "methods": methods,
        "poincare_points": sections,
        "summary": summary,
        "figures": [str(p) for p in figures],
    }
