"""Chang–Jiménez–Perlmutter 2016: the original feedback-integrator benchmarks, error vs h.

Three experiments, each a log-log comparison of the largest error of the first integrals
over a run against the step size h, for the paper's feedback Euler and the methods it is
compared with:

- `rigid-body`: the free rigid body on SO(3) ⊂ R^{3×3} (`models.rigid_body`), errors of
  the energy E, the spatial angular momentum Π_s = RΠ and the distance ‖RᵀR − I‖ to
  SO(3). Methods: feedback Euler (the paper's V and gains, gradient in (R, Ω) as the
  paper takes it: `model.metric`), explicit Euler followed by a Newton projection onto the
  invariant set {E = E₀, Π_s = Π₀, RᵀR = I} (`geomjax.project`), the symmetric splitting
  of the kinetic energy into the three exactly solvable rotations about the body axes
  (`models.rigid_body_flows`, φ³_{h/2}φ²_{h/2}φ¹_hφ²_{h/2}φ³_{h/2}), and plain RK4 and
  Euler on the Hamiltonian field.
- `kepler`: the Kepler problem with e = 0.8 (`models.kepler`), errors of E, the angular
  momentum L and the Laplace–Runge–Lenz vector A. Methods: feedback Euler and feedback
  RK4 (V on L and A, k = (4, 2)), Störmer–Verlet (velocity form, `strang(kick, drift)`
  of `models.kepler_flows`), plain RK4 and Euler.
- `perturbed-kepler`: U = −1/r − 0.0025/r³, e = 0.6 (`models.perturbed_kepler`), errors
  of E and L, the same methods (V on E and L, k = (2, 3)).

For every method and h the run goes to the same final time and the errors are measured
after every step (as Bae and Chang's code does): max_k |E(x_k) − E₀|, max_k ‖L(x_k) − L₀‖,
... . One compiled loop per method runs all step sizes (h and the number of steps are
traced). Nothing stops a run: a run that turns non-finite is reported as diverged (its
points are drawn as crosses at the top of the panel). Near the invariant set feedback
Euler with the paper's gains needs h·λ_max(L∇²V) < 2; the JSON records the limit
2/λ_max at x₀ and its smallest value along the orbit (over one Kepler period, or
t ≤ 20). Euler + projection costs a Newton solve per step (15–25 µs), so its runs over
2·10⁵ steps are skipped.

A second figure shows the errors over time at one step size, from `geomjax.integrate`
runs with `drift_tol=None` (their point is the drift); the summary's "default check" says
what the default monitoring (drift_tol = 1e-2) reports for that run.

The paper's horizons (1000 rigid-body time units with h down to 1e−5 or 1e−7; 1000–2000
Kepler periods) take minutes to hours; the defaults here are shorter (rigid body
t ≤ 20, Kepler 100 periods; the perturbed Kepler problem keeps the paper's t ≤ 200) so
that each experiment takes well under a minute on 2 CPU cores (measured CPU times: rigid body
45 s, Kepler 21 s, perturbed Kepler 15 s). Both horizons are in the JSON.
"""

import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import geomjax

from . import register
from ._common import Method, default_check, method_styles
from .._status import code_of, status_names


# --------------------------------------------------------------------------------------
# Error measures


class Measures(eqx.Module):
    """The error measures of one experiment at a flat state x: for each group of entries
    of F = (H, integrals) the Euclidean norm of F − F₀ over the group, and, with
    `embedding`, ‖RᵀR − I‖ (Frobenius)."""

    system: object
    f0: jax.Array
    groups: tuple = eqx.field(static=True)
    embedding: bool = eqx.field(static=True, default=False)

    def __call__(self, x):
        d = self.system.conserved_quantities(x) - self.f0
        out = [jnp.sqrt(jnp.sum(d[a:b] * d[a:b])) for a, b in self.groups]
        if self.embedding:
            out.append(geomjax.embedding_defect(self.system, x))
        return jnp.stack(out)


@dataclass(frozen=True)
class Quantity:
    """One panel: the name used in JSON keys and its axis label."""

    name: str
    label: str


# --------------------------------------------------------------------------------------
# The loop: one compilation per method, h and the number of steps traced


_OK = int(np.asarray(code_of(geomjax.RESULTS.successful)))


@eqx.filter_jit
def _max_errors(step, x0, h, n, measures):
    """Run `n` steps of size `h` from x0; the largest value of `measures` after each step,
    the final state and the first non-success status code of the steps."""
    z0 = step.split(x0)
    run = step.at_start(z0)

    def body(i, carry):
        z, worst, code = carry
        z, result = run.advance(i.astype(h.dtype) * h, z, h, None)
        worst = jnp.maximum(worst, measures(run.merge(z)))
        code = jnp.where(code == _OK, jnp.asarray(code_of(result), code.dtype), code)
        return z, worst, code

    init = (z0, jnp.zeros_like(measures(x0)), jnp.asarray(_OK, jnp.int32))
    z, worst, code = lax.fori_loop(jnp.zeros_like(n), n, body, init)
    return worst, run.merge(z), code


# --------------------------------------------------------------------------------------
# Setups


@dataclass(frozen=True)
class Scheme:
    """A method of the comparison: `make(model, h) -> step` (a geomjax step; most ignore h)."""

    name: str
    description: str
    make: Callable
    style: dict = field(default_factory=dict)
    max_steps: int | None = None  # runs longer than this are skipped (cost)


@dataclass(frozen=True)
class Setup:
    name: str
    title: str
    make_model: Callable
    quantities: tuple
    groups: tuple
    embedding: bool
    hs: tuple
    t_final: float
    horizon_note: str
    trace_h: float
    trace_saves: int
    paper: dict
    notes: str = ""


def _feedback(model, h=None):
    return geomjax.feedback_field(model.system, model.x0, model.gains, model.metric)


def _adaptive(model, h):
    """Bae & Chang's adaptive gain on the paper's V: α(x) = 1/(h·1.1‖L∇²V(x)‖_F)."""
    return _feedback(model).adaptive(dt=h)


def _rk(field_of, tableau):
    return lambda model, h: geomjax.explicit_rk(field_of(model, h), tableau)


def _hamiltonian_field(model, h=None):
    return geomjax.dirac_field(model.system)  # no constraints: the Hamiltonian field B∇H


def _invariant_set_constraints(hamiltonian, x):
    """(E, Π_s, the entries of RᵀR on and above the diagonal): the rigid body's invariant set
    is a level set of these ten functions."""
    r = x[:9].reshape(3, 3)
    g = r.T @ r
    upper = jnp.stack([g[0, 0], g[0, 1], g[0, 2], g[1, 1], g[1, 2], g[2, 2]])
    return jnp.concatenate([jnp.atleast_1d(hamiltonian(x)), r @ x[9:], upper])


def _projected_euler(model, h=None):
    hamiltonian = model.system.hamiltonian
    constraints = jax.tree_util.Partial(_invariant_set_constraints, hamiltonian)
    target = geomjax.System(hamiltonian, model.system.structure, constraints=constraints)
    euler = geomjax.explicit_rk(_hamiltonian_field(model), geomjax.EULER)
    return geomjax.project(euler, target, level=constraints(model.x0))


def _rigid_splitting(model, h=None):
    r1, r2, r3 = geomjax.models.rigid_body_flows(model)
    return geomjax.strang(r3, geomjax.strang(r2, r1))


def _verlet(model, h=None):
    drift, kick = geomjax.models.kepler_flows(model)
    return geomjax.strang(kick, drift)


_DASHED = {"linestyle": "--"}

ADAPTIVE_EULER = Scheme(
    "adaptive feedback Euler",
    "explicit Euler on Y = X - alpha(x) L grad V, alpha = 1/(h max(1e-10, 1.1 |L DF^T K DF(x)|_F)) "
    "(Bae and Chang's adaptive gain, re-estimated at every step; field.adaptive(dt=h)), the paper's V",
    _rk(_adaptive, geomjax.EULER),
)

RIGID_SCHEMES = (
    Scheme(
        "feedback Euler",
        "explicit Euler on Y = X - L grad V, V = k0/4|R^T R - I|^2 + k1/2 (E - E0)^2 + k2/2 |R I Omega - Pi0|^2, "
        "(k0, k1, k2) = (50, 100, 50), L = diag(1 (R), I^2 (Pi)): the gradient in (R, Omega) as in the paper",
        _rk(_feedback, geomjax.EULER),
    ),
    ADAPTIVE_EULER,
    Scheme(
        "Euler + projection",
        "explicit Euler on X, then Newton projection x + Df^T nu onto f = f(x0), f = (E, Pi_s, entries of R^T R) "
        "(geomjax.project on a System with constraints=f); about 20-30 us per step (a Newton solve), so runs "
        "over 2e5 steps are skipped",
        _projected_euler,
        max_steps=200_000,
    ),
    Scheme(
        "splitting (exact rotations)",
        "symmetric splitting of E into Pi_k^2/2I_k, each flow an exact rotation about body axis k: "
        "phi3(h/2) phi2(h/2) phi1(h) phi2(h/2) phi3(h/2) (models.rigid_body_flows), order 2",
        _rigid_splitting,
    ),
    Scheme("RK4", "classical RK4 on the Hamiltonian field X (Rdot = R Omega^, Pidot = Pi x Omega)", _rk(_hamiltonian_field, geomjax.RK4), _DASHED),
    Scheme("Euler", "explicit Euler on the Hamiltonian field X, no feedback", _rk(_hamiltonian_field, geomjax.EULER), _DASHED),
)

KEPLER_SCHEMES = (
    Scheme("feedback Euler", "explicit Euler on Y = X - grad V with the paper's gains (model.gains)", _rk(_feedback, geomjax.EULER)),
    Scheme("feedback RK4", "classical RK4 on Y = X - grad V with the paper's gains", _rk(_feedback, geomjax.RK4)),
    ADAPTIVE_EULER,
    Scheme(
        "Stormer-Verlet",
        "velocity Stormer-Verlet: half kick, drift, half kick (geomjax.strang(kick, drift) of models.kepler_flows), "
        "symplectic, order 2",
        _verlet,
    ),
    Scheme("RK4", "classical RK4 on the Hamiltonian field X", _rk(_hamiltonian_field, geomjax.RK4), _DASHED),
    Scheme("Euler", "explicit Euler on the Hamiltonian field X, no feedback", _rk(_hamiltonian_field, geomjax.EULER), _DASHED),
)

_DECADES = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5)
_HALF_DECADES = (1e-1, 10**-1.5, 1e-2, 10**-2.5, 1e-3)

SETUPS = {
    "rigid-body": Setup(
        "rigid-body",
        "free rigid body on SO(3)",
        geomjax.models.rigid_body,
        (Quantity("E", "$|E - E_0|$"), Quantity("Pi_s", r"$\|\Pi_s - \Pi_0\|$"), Quantity("RtR-I", r"$\|R^TR - I\|$")),
        ((0, 1), (1, 4)),
        True,
        _DECADES,
        20.0,
        "t in [0, 20] (the reference code: t in [0, 1000])",
        1e-4,
        400,
        {
            "source": "Chang, Jimenez, Perlmutter, J. Nonlinear Sci. 26 (2016); values of Bae and Chang's code "
            "(github.com/johnbae1901/Feedback-Integrator, Rigid_Motion_C++)",
            "I": [3.0, 2.0, 1.0],
            "Omega0": [1.0, 1.0, 1.0],
            "R0": "identity",
            "gains (k0, k1, k2)": [50.0, 100.0, 50.0],
            "h": "1e-1 ... 1e-5 (the paper); the reference code sweeps 1e-1 ... 1e-7",
            "t_final": 1000.0,
        },
        "E0 = 3, Pi0 = (3, 2, 1). The feedback gradient is taken in (R, Omega) as in the paper and the "
        "reference code (model.metric = diag(1, ..., 1, I1^2, I2^2, I3^2) on the state (R, Pi = I Omega)).",
    ),
    "kepler": Setup(
        "kepler",
        "Kepler problem, e = 0.8",
        geomjax.models.kepler,
        (Quantity("E", "$|E - E_0|$"), Quantity("L", r"$\|L - L_0\|$"), Quantity("A", r"$\|A - A_0\|$")),
        ((0, 1), (1, 4), (4, 7)),
        False,
        _HALF_DECADES,
        100.0,  # in periods
        "100 periods, t in [0, 7024.8] (the paper: 1000 periods; the reference code: 2000)",
        1e-3,
        500,
        {
            "source": "Chang, Jimenez, Perlmutter, J. Nonlinear Sci. 26 (2016); values of Bae and Chang's code "
            "(Kepler_C++)",
            "mu": 1.0,
            "x0": [1.0, 0.0, 0.0],
            "v0": [0.0, 1.8**0.5, 0.0],
            "gains (k_L, k_A)": [4.0, 2.0],
            "period": 70.2481,
            "h": "1e-1 ... 1e-3",
            "t_final": "1000 periods (the reference code: 2000 periods)",
        },
        "e = 0.8, a = 5. V leaves H out (gain 0 on H): |A|^2 = mu^2 + 2H|L|^2 ties it to L and A.",
    ),
    "perturbed-kepler": Setup(
        "perturbed-kepler",
        "perturbed Kepler problem, U = −1/r − 0.0025/r³, e = 0.6",
        geomjax.models.perturbed_kepler,
        (Quantity("E", "$|E - E_0|$"), Quantity("L", r"$\|L - L_0\|$")),
        ((0, 1), (1, 4)),
        False,
        _DECADES,
        200.0,
        "t in [0, 200] (the paper's)",
        1e-3,
        400,
        {
            "source": "Chang, Jimenez, Perlmutter, J. Nonlinear Sci. 26 (2016); values of Bae and Chang's code "
            "(Perturbed_Kepler_C++)",
            "mu": 1.0,
            "delta": 0.0025,
            "e": 0.6,
            "x0": [0.4, 0.0, 0.0],
            "v0": [0.0, 2.0, 0.0],
            "gains (k_E, k_L)": [2.0, 3.0],
            "h": "1e-1 ... 1e-9 (the reference code)",
            "t_final": 200.0,
        },
        "",
    ),
}


# --------------------------------------------------------------------------------------
# Figures


def _plot_vs_h(path, hs, table, quantities, styles, title):
    """One log-log panel per quantity: max error against h, one curve per method. A run
    that diverged is a cross in the band at the top of the panel (one row per method);
    a skipped run is left out."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    k = len(quantities)
    fig = Figure(figsize=(4.3 * k, 4.8), layout="constrained")
    axes = fig.subplots(1, k, squeeze=False)[0]
    hs = np.asarray(hs)
    any_diverged = False
    legend = []
    for ax, (j, q) in zip(axes, enumerate(quantities)):
        for i, (name, errs) in enumerate(table.items()):
            e = np.asarray(errs)[:, j]
            skipped = np.isnan(e)
            label = name if not skipped.any() else f"{name} (not run at h = {', '.join(f'{h:.0e}' for h in hs[skipped])})"
            # NaN breaks the line: no segment is drawn across a diverged or skipped run.
            shown = np.where(np.isfinite(e) & (e > 0), e, np.nan)
            if j == 0:
                legend.append((Line2D([], [], marker="o", markersize=4, **styles[name]), label))
            if np.any(np.isfinite(shown)):  # a method that diverged at every h has only its crosses
                ax.plot(hs, shown, label=label, marker="o", markersize=4, **styles[name])
            bad = np.isinf(e)
            if bad.any():
                any_diverged = True
                ax.plot(hs[bad], np.full(int(bad.sum()), 0.97 - 0.045 * i), linestyle="none", marker="x",
                        markersize=7, markeredgewidth=1.5, color=styles[name]["color"],
                        transform=ax.get_xaxis_transform())
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("step size h")
        ax.set_title(f"max over the run of {q.label}", fontsize="medium")
        ax.grid(True, which="major", alpha=0.3)
        if any_diverged:
            # Room above the data for the band of crosses.
            lo, hi = ax.get_ylim()
            ax.set_ylim(lo, hi * (hi / lo) ** 0.3)
    handles, labels = [h for h, _ in legend], [lab for _, lab in legend]
    if any_diverged:
        handles.append(Line2D([], [], linestyle="none", marker="x", color="black"))
        labels.append("diverged (non-finite)")
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 6), fontsize="small")
    fig.suptitle(title, fontsize="medium")
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with np.errstate(over="ignore", invalid="ignore"):
        fig.savefig(path, dpi=120)
    return path


def _plot_vs_t(path, ts, series, quantities, styles, title):
    """One log-scale panel per quantity: the error over time of each method at one h."""
    from matplotlib.figure import Figure

    k = len(quantities)
    fig = Figure(figsize=(4.2 * k, 4.2), layout="constrained")
    axes = fig.subplots(1, k, squeeze=False, sharex=True)[0]
    for j, (ax, q) in enumerate(zip(axes, quantities)):
        for name, errs in series.items():
            e = np.asarray(errs)[:, j]
            ax.plot(np.asarray(ts), np.where(e > 0, e, np.nan), label=name, **styles[name])
        ax.set_yscale("log")
        ax.set_xlabel("t")
        ax.set_title(q.label, fontsize="medium")
        ax.grid(True, which="major", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 5), fontsize="small")
    fig.suptitle(title, fontsize="medium")
    path = pathlib.Path(path)
    with np.errstate(over="ignore", invalid="ignore"):
        fig.savefig(path, dpi=120)
    return path


# --------------------------------------------------------------------------------------
# Running


def _final_time(setup: Setup, model) -> float:
    return setup.t_final * model.period if setup.name == "kepler" else setup.t_final


def _status(code: int, worst) -> str:
    if code != _OK:
        return _code_name(code)
    if not np.all(np.isfinite(worst)):
        return "diverged (non-finite)"
    return "ok"


def _code_name(code: int) -> str:
    return status_names().get(code, f"status {code}")


def _sweep_h(scheme: Scheme, model, measures, hs, t_end, names, progress):
    """Every h for one method (one compilation): the summary rows and the (len(hs), k)
    errors (inf: diverged; NaN: skipped, over the method's step budget)."""
    step = scheme.make(model, hs[0])
    start = time.perf_counter()
    jax.block_until_ready(_max_errors(step, model.x0, jnp.asarray(hs[0]), jnp.asarray(1), measures))
    compile_s = time.perf_counter() - start
    rows, errors = [], []
    for h in hs:
        n = int(round(t_end / h))
        row = {"method": scheme.name, "h": h, "steps": n}
        if scheme.max_steps is not None and n > scheme.max_steps:
            errors.append(np.full(len(names), np.nan))
            rows.append({**row, **{f"max|d{q}|": None for q in names}, "run [s]": None, "ns/step": None,
                         "status": f"skipped (> {scheme.max_steps:.0e} steps)"})
            continue
        step = scheme.make(model, h)  # the same compiled loop: h only enters as array leaves
        start = time.perf_counter()
        worst, _, code = jax.block_until_ready(_max_errors(step, model.x0, jnp.asarray(h), jnp.asarray(n), measures))
        run_s = time.perf_counter() - start
        worst = np.asarray(worst)
        worst = np.where(np.isfinite(worst), worst, np.inf)
        errors.append(worst)
        rows.append(
            {
                **row,
                **{f"max|d{q}|": float(worst[j]) for j, q in enumerate(names)},
                "run [s]": run_s,
                "ns/step": 1e9 * run_s / n,
                "status": _status(int(np.asarray(code)), worst),
            }
        )
    if progress:
        ran = sum(r["run [s]"] or 0.0 for r in rows)
        print(f"  {scheme.name}: {len(hs)} step sizes, compiled in {compile_s:.2f} s, ran in {ran:.2f} s", flush=True)
    return rows, np.stack(errors), compile_s


def run_setup(setup: Setup, out_dir: pathlib.Path, progress: bool, hs=None, t_final=None, methods=None) -> dict:
    """Run one experiment; `hs`, `t_final` and `methods` (names, a subset that includes
    "RK4") override the defaults (for quick checks)."""
    model = setup.make_model()
    hs = tuple(setup.hs if hs is None else hs)
    t_end = _final_time(setup, model) if t_final is None else float(t_final)
    schemes = RIGID_SCHEMES if setup.embedding else KEPLER_SCHEMES
    if methods is not None:
        schemes = tuple(s for s in schemes if s.name in methods)
    f0 = model.system.conserved_quantities(model.x0)
    measures = Measures(model.system, f0, setup.groups, setup.embedding)
    names = [q.name for q in setup.quantities]

    table, runs, compile_s = {}, [], {}
    for scheme in schemes:
        rows, table[scheme.name], compile_s[scheme.name] = _sweep_h(scheme, model, measures, hs, t_end, names, progress)
        runs.extend(rows)

    styles = method_styles([Method(s.name, s.description, None, s.style) for s in schemes])
    out_dir = pathlib.Path(out_dir)
    horizon = f"{t_end / model.period:.4g} periods, " if model.period is not None else ""
    figures = [
        _plot_vs_h(
            out_dir / f"{setup.name}_errors_vs_h.png",
            hs,
            table,
            setup.quantities,
            styles,
            f"{setup.title}\nlargest error over every step of t ∈ [0, {t_end:.6g}] ({horizon}same final time for every h)",
        )
    ]

    # Errors over time at one h, from geomjax.integrate (drift monitoring off).
    trace_h = setup.trace_h
    n_trace = int(round(t_end / trace_h))
    save_every = max(1, n_trace // setup.trace_saves)
    n_trace = save_every * max(1, n_trace // save_every)
    series, checks, trace_xs = {}, {}, {}
    for scheme in schemes:
        step = scheme.make(model, trace_h)
        sol = geomjax.integrate(step, model.x0, dt=trace_h, steps=n_trace, save_every=save_every, drift_tol=None, throw=False)
        series[scheme.name] = np.asarray(jax.jit(jax.vmap(measures))(sol.xs))
        checks[scheme.name] = default_check(step, sol, save_every)
        trace_xs[scheme.name] = sol.xs
    ts = np.asarray(sol.ts)
    figures.append(
        _plot_vs_t(
            out_dir / f"{setup.name}_errors_vs_t.png",
            ts,
            series,
            setup.quantities,
            styles,
            f"{setup.title}\nerrors over time at h = {trace_h:g} (geomjax.integrate, drift_tol=None, saved every {save_every} steps)",
        )
    )

    # Explicit Euler on the feedback field is stable near the invariant set only for
    # h < 2/λ_max(L∇²V), which changes along the orbit: its smallest value at 1000 points
    # of one period (Kepler) or of t ∈ [0, min(t_f, 20)], on an RK4 run at h/10 of the trace.
    y = _feedback(model)
    limit0 = float(y.euler_step_limit(model.x0))
    span = model.period if model.period is not None else min(t_end, 20.0)
    fine = trace_h / 10
    n_fine = 1000 * max(1, int(round(span / fine / 1000)))
    ref = geomjax.integrate(_rk(_hamiltonian_field, geomjax.RK4)(model, None), model.x0, dt=span / n_fine, steps=n_fine,
                            save_every=n_fine // 1000, drift_tol=None)
    limits = np.asarray(jax.jit(jax.vmap(y.euler_step_limit))(ref.xs))
    limit_min = float(limits.min())
    limit_where = float(np.asarray(ref.ts)[int(np.argmin(limits))])
    for row in runs:
        if np.isclose(row["h"], trace_h):
            row["default check"] = checks[row["method"]]
    # the default check is replayed on the traced runs only (one h per method): "-" elsewhere
    summary = [{**row, "default check": row.get("default check", "-")} for row in runs]
    return {
        "setup": {
            "model": model.name,
            "params": {k: np.asarray(v).tolist() for k, v in model.params.items()},
            "x0": np.asarray(model.x0).tolist(),
            "quantity_names": list(model.quantity_names),
            "gains": np.asarray(model.gains).tolist(),
            "metric": None if model.metric is None else "diag(1 (9 entries of R), I1^2, I2^2, I3^2 (Pi))",
            "hs": list(hs),
            "t_final": t_end,
            "horizon": setup.horizon_note,
            "errors": "max over every step of the run of: " + ", ".join(q.name for q in setup.quantities),
            "trace_h": trace_h,
            "trace_save_every": save_every,
            "feedback_euler_step_limit_at_x0": limit0,
            "feedback_euler_step_limit_min_along_orbit": limit_min,
            "feedback_euler_step_limit_min_at_t": limit_where,
            "feedback_euler_step_limit_note": "2/lambda_max(L hess V) near the invariant set (necessary for stability "
            "of feedback Euler, not sufficient); min over 1000 points of "
            + ("one period" if model.period is not None else f"t in [0, {span:g}]"),
            "notes": setup.notes,
            "paper": setup.paper,
            "timing": "run [s]: one compiled run (compiled once per method, h and steps traced); compile_s per method",
            "device": str(jax.devices()[0]),
        },
        "methods": {s.name: s.description for s in schemes},
        "compile_s": compile_s,
        "figures": [p.name for p in figures],
        "summary": summary,
    }


def _register(key: str):
    setup = SETUPS[key]

    @register(
        key,
        f"Chang-Jimenez-Perlmutter 2016: {setup.title}; max errors of the first integrals vs h, feedback Euler "
        f"vs {'projection, splitting' if setup.embedding else 'Stormer-Verlet, feedback RK4'}, RK4, Euler; "
        f"{setup.horizon_note}",
        options=("t_final",),
        quick={"hs": (1e-1, 1e-2), "t_final": 1.0},
    )
    def run(out_dir: pathlib.Path, progress: bool, **options) -> dict:
        return run_setup(setup, out_dir, progress, **options)

    return run


for _key in SETUPS:
    _register(_key)
