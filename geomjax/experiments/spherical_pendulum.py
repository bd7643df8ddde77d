"""Chang, Perlmutter and Vankerschaver (2022) §2.3: the spherical pendulum, feedback Euler vs RATTLE, Lie–Trotter and Strang.

Setup (Chang, Perlmutter and Vankerschaver (2022) §2.3): m = g = ℓ = 1, q(0) = (0, 1, 0), p(0) = (1, 0, −1), h = 1e−3,
t ∈ [0, 100] (1e5 steps), gains k₁..k₄ = 50 on F = (f₁, f₂, H, J) with f₁ = |q|²,
f₂ = q·p, H = |p|²/2m + m g q₃, J = q₁p₂ − q₂p₁. The paper prints H₀ = 2; the stated
Hamiltonian gives H₀ = 1 at this state, and the computed value is what is recorded.

Figures: the trajectory q₁, q₂, q₃ (paper Fig. 1) and the log-scale errors |Δf₁|, |Δf₂|,
|ΔH|, |ΔJ| (paper Figs. 2–5), one PNG each, plus an overview of the four errors.

Methods (Chang, Perlmutter and Vankerschaver (2022) compares the first four): feedback Euler; RATTLE (`geomjax.rattle` on
the same pendulum with the rod as g(q) = |q|² − 1); Lie–Trotter and Strang splittings of
H into |p|²/2m and m g q₃ with their exact flows on T*S² (`geomjax.models.pendulum_flows`);
and, as a baseline, Euler on the Dirac field without feedback. All errors are measured with
the paper's functions f₁ = |q|², f₂ = q·p, H, J. The summary table gives max |Δf₁|, |Δf₂|,
|ΔH|, |ΔJ| and the wall time per method, the run's status, and a "default check" column:
the status `geomjax.integrate` would report with its default monitoring (drift_tol = 1e-2).
The Euler baseline without feedback is run with `drift_tol=None`, so its curves show the
whole drift; its default check names the step where the default run would have stopped.

Methods are the entries of `METHODS`: each a `Method(name, description, produce)` with
`produce(setup, progress) -> geomjax.Solution` saving every `setup.save_every` steps.
"""

import pathlib
from dataclasses import dataclass

import jax
import numpy as np

import geomjax

from . import register
from ._common import (
    Method,
    default_check,
    delta_label,
    invariant_errors,
    math_name,
    max_finite,
    method_styles,
    plot_components,
    plot_error_grid,
    plot_log_errors,
    run_method,
    with_options,
)

NAME = "spherical-pendulum"


@dataclass(frozen=True)
class Setup:
    """The Chang, Perlmutter and Vankerschaver (2022) §2.3 configuration (all methods integrate this)."""

    model: geomjax.models.Model
    dt: float = 1e-3
    steps: int = 100_000
    save_every: int = 10
    gains: float = 50.0

    @property
    def t_final(self) -> float:
        return self.dt * self.steps


def default_setup() -> Setup:
    return Setup(geomjax.models.spherical_pendulum(m=1.0, g=1.0, length=1.0))


def _integrate(field, setup: Setup, progress, **kwargs):
    # throw=False: a run that blows up is a result to report (status, failed_step), not a crash.
    return geomjax.integrate(
        field,
        setup.model.x0,
        dt=setup.dt,
        steps=setup.steps,
        save_every=setup.save_every,
        progress=progress,
        throw=False,
        **kwargs,
    )


def _feedback(setup: Setup):
    return geomjax.feedback_field(setup.model.system, setup.model.x0, gains=setup.gains)


def _feedback_euler(setup: Setup, progress):
    return _integrate(_feedback(setup), setup, progress, method="euler")


def _dirac(setup: Setup):
    return geomjax.dirac_field(setup.model.system)


def _dirac_euler(setup: Setup, progress):
    # Monitoring off: the point of this baseline is to show how far it drifts; the table's
    # "default check" column says where the default drift_tol would have stopped it.
    return _integrate(_dirac(setup), setup, progress, method="euler", drift_tol=None)


def _holonomic_model(setup: Setup):
    """The same pendulum and start with the rod as a position constraint g(q) = |q|² − ℓ²."""
    params = {k: float(v) for k, v in setup.model.params.items()}
    x0 = setup.model.x0
    return geomjax.models.spherical_pendulum(
        m=params["m"], g=params["g"], length=params["length"], q0=x0[:3], p0=x0[3:], holonomic=True
    )


def _rattle_step(setup: Setup):
    return geomjax.rattle(_holonomic_model(setup).system)


def _rattle(setup: Setup, progress):
    return _integrate(_rattle_step(setup), setup, progress)


def _splitting_step(compose):
    def target(setup: Setup):
        kinetic, potential = geomjax.models.pendulum_flows(setup.model)
        return compose(kinetic, potential)

    return target


def _splitting(compose):
    def produce(setup: Setup, progress):
        return _integrate(_splitting_step(compose)(setup), setup, progress)

    return produce


METHODS: list[Method] = [
    Method(
        "feedback Euler",
        "explicit Euler on the feedback field Y = X - grad V (Dirac field X, gains k1..k4 = 50), "
        "Chang, Perlmutter and Vankerschaver (2022) eqs. (7)-(8)",
        _feedback_euler,
        target=_feedback,
    ),
    Method(
        "RATTLE",
        "RATTLE (symplectic, order 2): g = |q|^2 - 1 and its hidden constraint q.p = 0 imposed "
        "by Newton multipliers, derived by autodiff",
        _rattle,
        target=_rattle_step,
    ),
    Method(
        "Lie-Trotter",
        "Lie-Trotter splitting of H into |p|^2/2m (exact great-circle flow) then m g q3 "
        "(exact constrained kick), order 1",
        _splitting(geomjax.lie_trotter),
        target=_splitting_step(geomjax.lie_trotter),
    ),
    Method(
        "Strang",
        "Strang splitting: half step of |p|^2/2m, full kick of m g q3, half step of |p|^2/2m "
        "(exact sub-flows), order 2",
        _splitting(geomjax.strang),
        target=_splitting_step(geomjax.strang),
    ),
    Method(
        "Euler, no feedback",
        "explicit Euler on the Dirac-extended field X alone (no feedback term), run with "
        "drift_tol=None so that its drift is shown in full",
        _dirac_euler,
        {"linestyle": "--"},
        target=_dirac,
        monitored=False,
    ),
]


def _method_metrics(run, errors: np.ndarray, names, setup: Setup) -> dict:
    sol = run.solution
    method = run.method
    if method.monitored:
        check = "ok" if int(np.asarray(sol.failed_step)) < 0 else None
    else:
        check = None
    if check is None and method.target is not None:
        check = default_check(method.target(setup), sol, setup.save_every)
    elif check is None:
        check = sol.message
    steps = int(np.asarray(sol.num_steps))
    metrics = {
        "description": run.method.description,
        "status": sol.message,
        "monitored": method.monitored,
        "default_check": check,
        "failed_step": int(np.asarray(sol.failed_step)),
        "steps": steps,
        "wall_time_s": run.wall_time_s,
        "run_time_s": run.run_time_s,
        "ns_per_step": None if run.run_time_s is None else 1e9 * run.run_time_s / max(steps, 1),
    }
    for j, q in enumerate(names):
        metrics[f"max_abs_d{q}"] = max_finite(errors[:, j])
        metrics[f"final_abs_d{q}"] = float(errors[-1, j])
    return metrics


@register(
    NAME,
    "Chang, Perlmutter and Vankerschaver (2022) sec. 2.3: spherical pendulum, feedback Euler vs RATTLE, Lie-Trotter, Strang "
    "(and Euler without feedback), h=1e-3, t<=100",
    options=("dt", "t_final", "gains"),
    quick={"t_final": 0.5},
)
def run(out_dir: pathlib.Path, progress: bool, setup: Setup | None = None, methods=None, *, dt=None, t_final=None,
        gains=None) -> dict:
    """Integrate every method, write the figures into `out_dir`, return the metrics.

    `dt`, `t_final`, `gains` change the step size, the horizon and the feedback gain(s)
    of the default setup (`_common.with_options`)."""
    setup = default_setup() if setup is None else setup
    setup = with_options(setup, dt=dt, t_final=t_final, gains=gains)
    methods = METHODS if methods is None else methods
    model = setup.model
    names = model.quantity_names
    f0 = np.asarray(model.system.conserved_quantities(model.x0))

    runs = [run_method(m, setup, progress) for m in methods]
    ts = np.asarray(runs[0].solution.ts)
    errors = {r.method.name: invariant_errors(model.system, r.solution.xs, model.x0) for r in runs}
    positions = {r.method.name: np.asarray(r.solution.xs)[:, :3] for r in runs}

    styles = method_styles(methods)
    out_dir = pathlib.Path(out_dir)
    subtitle = f"spherical pendulum, h = {setup.dt:g}"
    figures = [
        plot_components(
            out_dir / f"{NAME}_trajectory.png",
            ts,
            positions,
            ["$q_1$", "$q_2$", "$q_3$"],
            title=f"Trajectory q(t), {subtitle} (Chang, Perlmutter and Vankerschaver (2022) Fig. 1)",
            styles=styles,
            difference_to="RATTLE" if "RATTLE" in positions else None,
        )
    ]
    for j, q in enumerate(names):
        figures.append(
            plot_log_errors(
                out_dir / f"{NAME}_error_{q}.png",
                ts,
                {k: v[:, j] for k, v in errors.items()},
                ylabel=delta_label(q),
                title=rf"$|\Delta {math_name(q)}| = |{math_name(q)}(t) - {math_name(q)}(0)|$, {subtitle} "
                f"(Chang, Perlmutter and Vankerschaver (2022) Fig. {2 + j})",
                styles=styles,
            )
        )
    figures.append(
        plot_error_grid(
            out_dir / f"{NAME}_errors.png",
            ts,
            errors,
            names,
            title=f"Invariant errors, {subtitle}",
            styles=styles,
        )
    )

    per_method = {r.method.name: _method_metrics(r, errors[r.method.name], names, setup) for r in runs}
    summary = [
        {
            "method": name,
            "steps": m["steps"],
            "wall [s]": m["wall_time_s"],
            "run [s]": m["run_time_s"],
            **{f"max|d{q}|": m[f"max_abs_d{q}"] for q in names},
            # an unmonitored run (drift_tol=None) that ends is not "ok": nothing was checked
            "status": (f"failed at step {m['failed_step']}" if m["failed_step"] >= 0
                       else "ok" if m["monitored"] else "ran to the end, drift unchecked (drift_tol=None)"),
            "default check": m["default_check"],
        }
        for name, m in per_method.items()
    ]
    return {
        "setup": {
            "source": "Chang, Perlmutter and Vankerschaver (2022), sec. 2.3",
            "params": {k: float(v) for k, v in model.params.items()},
            "q0": np.asarray(model.x0[:3]),
            "p0": np.asarray(model.x0[3:]),
            "dt": setup.dt,
            "t_final": setup.t_final,
            "steps": setup.steps,
            "save_every": setup.save_every,
            "gains": np.broadcast_to(np.asarray(setup.gains, dtype=float), (len(names),)).tolist(),
            "quantities": list(names),
            "errors_measured_at": "saved states (every save_every steps, t = 0 included)",
            "timing": "wall_time_s: first call incl. JIT compilation; run_time_s: compiled re-run",
            "device": str(jax.devices()[0]),
        },
        "initial_values": dict(zip(names, f0.tolist())),
        "H0": float(f0[list(names).index("H")]),
        "H0_note": "the paper prints H0 = 2; H = |p|^2/2m + m g q3 gives 1 at q0 = (0,1,0), p0 = (1,0,-1)",
        "methods": per_method,
        "figures": [p.name for p in figures],
        "summary": summary,
    }
