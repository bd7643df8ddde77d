"""Seed 001 §3: feedback integrators on six nonholonomic systems, one experiment each.

For each system (Suslov on SO(3), knife edge, Chaplygin sleigh, vertical rolling disk,
roller racer, Heisenberg system) four runs from the same start on the constraint set:

- feedback Euler and feedback RK4: the feedback field Y = X − ∇V
  (`geomjax.feedback_field`, V = ½ΔᵀKΔ on F = (J, H_ext, integrals), plus k₀/4‖D‖² on an
  embedded group), the seed's method;
- Euler and RK4 on the extended field X alone (`geomjax.nonholonomic_field`), no feedback.

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
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

import geomjax

from . import register
from ._common import Method, default_check, max_finite, method_styles, plot_error_grid, plot_log_errors, run_method


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
    ),
    "knife-edge": Setup(
        "knife-edge",
        "knife edge on an inclined plane (seed 001 sec. 3.2)",
        lambda: geomjax.models.knife_edge(m=1.0, inertia=1.0, g=9.81, alpha=np.pi / 6, omega=2.0),
        steps=10_000,
        gains=(10.0, 10.0, 10.0),
        notes="m = J = 1, g = 9.81, alpha = pi/6, Omega = 2, start at rest at the origin; "
        "gains (k_J, k_H, k_pphi) = 10",
    ),
    "chaplygin-sleigh": Setup(
        "chaplygin-sleigh",
        "Chaplygin sleigh on SE(2), angle embedded as (cos, sin) (seed 001 sec. 3.3)",
        lambda: geomjax.models.chaplygin_sleigh(m=1.0, inertia=1.0, a=1.0, v0=1.0, omega0=1.0),
        steps=10_000,
        gains=(10.0, 10.0, 10.0),
        notes="m = J = a = 1, v0 = omega0 = 1; gains (k_J, k_H, k_0) = 10, k_0/4 (c^2 + s^2 - 1)^2 in V",
    ),
    "vertical-disk": Setup(
        "vertical-disk",
        "vertical rolling disk (seed 001 sec. 3.4)",
        lambda: geomjax.models.vertical_disk(),
        steps=10_000,
        gains=(10.0, 10.0, 10.0, 10.0, 10.0),
        notes="uniform thin disk m = R = 1, I_phi = 1/4, I_theta = 1/2, Omega_phi = 1, Omega_theta = 2 "
        "(circle of radius 2); gains 10 on (J1, J2, H, p_phi, p_theta)",
    ),
    "roller-racer": Setup(
        "roller-racer",
        "roller racer on SE(2) x S^1 (seed 001 sec. 3.5)",
        lambda: geomjax.models.roller_racer(),
        steps=10_000,
        gains=(10.0, 10.0, 10.0, 10.0),
        notes="m = I1 = 1, I2 = 0.5, d1 = 1, d2 = 0.5, phi0 = 0.5, omega0 = 0.3, phidot0 = 0.5; "
        "gains (k_J1, k_J2, k_H, k_0) = 10",
    ),
    "heisenberg": Setup(
        "heisenberg",
        "Heisenberg system (seed 001 sec. 3.6)",
        lambda: geomjax.models.heisenberg(),
        steps=10_000,
        gains=(1.0, 1.0, 1.0),
        notes="q0 = (1, 0.5, 0), (xdot0, ydot0) = (0.3, 1); gains (k_J, k_H, k_Lz) = 1; the seed left "
        "this simulation to the reader. The invariant set is not compact: the gradients of J and L_z "
        "grow with |q|, so the Euler step limit 2/lambda_max shrinks along the line (0.38 at t = 0, "
        "0.008 at t = 10 for these gains; with gains 10 feedback Euler at h = 1e-3 blows up near t = 8)",
    ),
}


def _integrate(field, model, setup: Setup, progress, method, **kwargs):
    return geomjax.integrate(
        field,
        model.x0,
        dt=setup.dt,
        steps=setup.steps,
        save_every=setup.save_every,
        method=method,
        progress=progress,
        throw=False,
        **kwargs,
    )


def _methods(model, setup: Setup) -> list[Method]:
    y = geomjax.feedback_field(model.system, model.x0, gains=jnp.asarray(setup.gains))
    x = geomjax.nonholonomic_field(model.system)
    # The runs without feedback are made with drift_tol=None: their drift is the point of
    # the comparison. The table's "default check" says where default monitoring stops them.
    return [
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
    """The exact solution at `ts`, or RK4 on the extended field with h/10 where none is known."""
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


def _plot_paths(path, runs, model, setup: Setup, styles):
    from matplotlib.figure import Figure

    i, j = setup.path_indices
    fig = Figure(figsize=(6.0, 5.0), layout="constrained")
    ax = fig.subplots()
    if model.exact is not None:
        ts = np.linspace(0.0, setup.t_final, 1000)
        ref = np.asarray(jax.jit(jax.vmap(model.exact))(jnp.asarray(ts)))
        ax.plot(ref[:, i], ref[:, j], color="black", linewidth=3.0, alpha=0.25, label="exact")
    for r in runs:
        xs = np.asarray(r.solution.xs)
        ax.plot(xs[:, i], xs[:, j], label=r.method.name, **styles[r.method.name])
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_aspect("equal", adjustable="datalim")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title(f"{_short(setup)}: path of the contact point (x, y), h = {setup.dt:g}", fontsize="small")
    path = pathlib.Path(path)
    fig.savefig(path, dpi=120)
    return path


_DISPLAY = {"p_phi": r"p_\phi", "p_theta": r"p_\theta", "embedding": "D"}


def _short(setup: Setup) -> str:
    return setup.title.split(" (")[0]


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
        exact[r.method.name] = np.max(np.abs(np.asarray(r.solution.xs) - ref), axis=1)
    out_dir = pathlib.Path(out_dir)
    sub = f"h = {setup.dt:g}"
    figures = [
        plot_error_grid(
            out_dir / f"{setup.name}_invariants.png",
            ts,
            errors,
            [_DISPLAY.get(q, q) for q in names],
            title=f"{_short(setup)}, {sub}: constraint J, energy H (original), momenta"
            + (", distance D to the group" if "embedding" in names else ""),
            styles=styles,
        )
    ]
    figures.append(
        plot_log_errors(
            out_dir / f"{setup.name}_error.png",
            ts,
            exact,
            ylabel=r"$\max_i |x_i(t) - x_i^{ref}(t)|$",
            title=f"{_short(setup)}, {sub}: error against the {ref_name}",
            styles=styles,
        )
    )
    if setup.path_indices is not None:
        figures.append(_plot_paths(out_dir / f"{setup.name}_path.png", runs, model, setup, styles))

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
        row["max err ref"] = max_finite(exact[r.method.name])
        row["run [s]"] = r.run_time_s
        check = default_check(r.method.target(setup), r.solution, setup.save_every)
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
            "final_error_against_reference": float(exact[r.method.name][-1]),
        }
    return {
        "setup": {
            "parameters": {k: np.asarray(v).tolist() for k, v in model.params.items()},
            "x0": np.asarray(model.x0).tolist(),
            "dt": setup.dt,
            "steps": setup.steps,
            "t_final": setup.t_final,
            "gains": list(setup.gains),
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
