"""Maciel, Ortiz and Schaerer (2020) §3.2, Fig. 2: the damped Foucault pendulum, contact vs Lagrange–d'Alembert.

System (`geomjax.models.damped_foucault`): m = 28 kg, ℓ = 67 m, β = 49°, g = 9.81,
Ω = 7.2921e−5 rad/s; q = (x, y), L = ½m|q̇|² − ½m(g/ℓ)|q|², Rayleigh damping −αmq̇ (or
L − αz), and the nonholonomic constraint (13), affine in the velocity,
−yẋ + xẏ + Ω sin β |q|² = 0 (`geomjax.VelocityConstraint`). h = 0.1 s, t ∈ [0, 3600] s,
q(0) = (0.67, 0), q̇(0) = 0, α = 1e−3 and 1e−4.

Methods (both derived by autodiff from L and the constraint; the discrete constraint is
the same for both, Φ(q_k, (q_{k+1} − q_k)/h) = 0, as the paper notes):

- **contact** (blue, paper eq. (18)): `geomjax.herglotz(L − αz, order=1, nonholonomic=Φ)`;
- **LA** (orange, paper eq. (15)): `geomjax.forced_dla(L, force=−αmq̇, nonholonomic=Φ)`.

Reference: the Lagrange–d'Alembert ODE derived by autodiff
(`geomjax.lagrange_dalembert_field`), started on the constraint (`project`: the
impulsive reaction to q̇(0) = 0) and integrated by RK4 with h = 0.01; and the closed form
(`model.exact`: θ̇ = −Ω sin β, r̈ + αṙ + (g/ℓ − Ω² sin² β)r = 0 for the signed distance r
along the turning line), which it matches to ~1e−10 m.

**The anomaly.** The discrete constraint fixes the cross product of two successive
positions exactly: x_k y_{k+1} − y_k x_{k+1} = −hΩ sin β |q_k|². So at every step the line
through the origin turns by −asin(hΩ sin β r_k / r_{k+1}) (r = |q|): the correct −hΩ sin β
when r_{k+1} ≈ r_k, but a jump of the plane of oscillation of ≈ hΩ sin β·r_k/r_{k+1} when
a step lands next to the origin (r_{k+1} ≪ r_k, which happens each swing), with a matching
loss of the kinetic energy across the new line. Both integrators share this discrete
constraint; which of them meets it depends on where their steps fall near the origin.
Measured per run, inside the loop (`_anomaly_scan`): the largest extra turn of the line
in one step (the plane jump) and when, the final deviation of the plane from the exact
−Ω sin β t, the largest |q − q_exact| and the final E/E_exact. The refined-step check runs
each h ∈ {0.1, 0.05, 0.02, 0.01, 0.005} and an ensemble of 64 steps within ±2.5% of it,
and reports the fraction of runs with a plane jump above 1°.
"""

import dataclasses
import pathlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import geomjax

from . import register
from ._common import MARKERS, _figure, _markevery, _save, max_finite

NAME = "damped-foucault"
ALPHAS = (1e-3, 1e-4)
H = 0.1
T_FINAL = 3600.0
REFINE_HS = (0.1, 0.05, 0.02, 0.01, 0.005)
ENSEMBLE = 64
SPREAD = 0.025
JUMP_DEG = 1.0
REFERENCE_H = 0.01
ORDER_T = 100.0
ORDER_HS = (0.4, 0.2, 0.1, 0.05, 0.025)
COLOURS = {"contact": "tab:blue", "LA": "tab:orange"}


@dataclasses.dataclass(frozen=True)
class Config:
    """The horizons and grids of a run: the defaults are the paper's (module constants);
    `QUICK` is a tiny configuration that draws every figure (smoke tests)."""

    t_final: float = T_FINAL
    refine_hs: tuple = REFINE_HS
    ensemble: int = ENSEMBLE
    order_t: float = ORDER_T
    order_hs: tuple = ORDER_HS


QUICK = Config(t_final=60.0, refine_hs=(0.1, 0.05), ensemble=4, order_t=10.0, order_hs=(0.4, 0.2, 0.1))


def _steps(model):
    """name -> (step, x0): the paper's two integrators."""
    return {
        "contact": (geomjax.herglotz(model.contact, order=1), model.x0_contact),
        "LA": (geomjax.forced_dla(model.forced), model.x0_forced),
    }


def _energy(model, xs):
    n = model.q0.shape[0]
    xs = jnp.asarray(xs)
    return np.asarray(jax.vmap(lambda x: model.energy(x[:n], x[n : 2 * n]))(xs))


def _exact_energy(model, ts):
    q, v = jax.vmap(model.exact)(jnp.asarray(ts))
    return np.asarray(0.5 * model.params["m"] * jnp.sum(v * v, 1) + 0.5 * model.params["m"] * model.params["stiffness"] * jnp.sum(q * q, 1))


def _line_turn(q0, q1):
    """The turn of the line through the origin from q₀ to q₁ (mod π, in (−π/2, π/2])."""
    turn = jnp.arctan2(q0[0] * q1[1] - q0[1] * q1[0], q0 @ q1)
    return (turn + 0.5 * jnp.pi) % jnp.pi - 0.5 * jnp.pi


@eqx.filter_jit
def _anomaly_scan(step, model, x0, h, n):
    """Run n steps of size h and measure, on the fly: the largest extra turn of the line
    in one step (turn + hΩ sin β) and its time, the summed extra turn (the plane's final
    deviation), max |q − q_exact(t)| and E(T)/E_exact(T)."""
    rate = model.params["rate"]
    dim = model.q0.shape[0]

    def body(k, carry):
        z, worst, when, total, err = carry
        z1, _ = step.advance(k * h, z, h, None)
        extra = _line_turn(z[0], z1[0]) + rate * h
        t1 = (k + 1) * h
        q_exact, _ = model.exact(t1)
        bigger = jnp.abs(extra) > jnp.abs(worst)
        return (
            z1,
            jnp.where(bigger, extra, worst),
            jnp.where(bigger, t1, when),
            total + extra,
            jnp.maximum(err, jnp.max(jnp.abs(z1[0] - q_exact))),
        )

    zero = jnp.zeros((), x0.dtype)
    z, worst, when, total, err = lax.fori_loop(0, n, body, (step.split(x0), zero, zero, zero, zero))
    q, p = z[0], z[1]
    t = n * h
    q_exact, v_exact = model.exact(t)
    m, k2 = model.params["m"], model.params["stiffness"]
    exact_energy = 0.5 * m * (v_exact @ v_exact) + 0.5 * m * k2 * (q_exact @ q_exact)
    del dim
    return worst, when, total, err, model.energy(q, p) / exact_energy


def _ensemble(step, model, x0, h, config: Config):
    """The anomaly measures for h itself (first entry) and `config.ensemble` steps within ±SPREAD."""
    n = int(round(config.t_final / h))
    hs = h * (1.0 + np.concatenate([[0.0], np.linspace(-SPREAD, SPREAD, config.ensemble)]))
    run = jax.vmap(lambda hh: _anomaly_scan(step, model, x0, hh, jnp.asarray(n)))
    return [np.asarray(a) for a in run(jnp.asarray(hs))]


def _swings(xs):
    """(start, stop) index pairs of the half swings: between successive crossings of the
    origin (q_k·q_{k+1} < 0)."""
    q = np.asarray(xs)[:, :2]
    cross = np.flatnonzero(np.sum(q[:-1] * q[1:], axis=1) < 0)
    bounds = np.concatenate([[0], cross + 1, [len(q)]])
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _turning_points(xs):
    """Indices of the largest |q| in each half swing."""
    r = np.hypot(np.asarray(xs)[:, 0], np.asarray(xs)[:, 1])
    return np.array([a + int(np.argmax(r[a:b])) for a, b in _swings(xs)])


def _swing_means(xs, ts, values):
    """(t, mean of values) over each complete half swing (the discrete energy oscillates
    by O(h) within a swing; its mean shows what the swing lost)."""
    pairs = _swings(xs)[1:-1]
    return np.array([ts[a:b].mean() for a, b in pairs]), np.array([values[a:b].mean() for a, b in pairs])


def _plane_deviation(xs, ts, rate):
    """(t, deviation in degrees) of the line through the origin at the turning points from
    the exact plane −Ω sin β t (the plane starts along q₀ = (0.67, 0))."""
    idx = _turning_points(xs)
    q = np.asarray(xs)[idx, :2]
    dev = np.arctan2(q[:, 1], q[:, 0]) + rate * ts[idx]
    dev = (dev + 0.5 * np.pi) % np.pi - 0.5 * np.pi
    return ts[idx], np.degrees(np.unwrap(2.0 * dev) / 2.0)


def _reference(model, steps_per_save, t_final):
    field = geomjax.lagrange_dalembert_field(model.forced)
    x0 = field.project(jnp.concatenate([model.q0, model.v0]))
    n = int(round(t_final / REFERENCE_H))
    sol = geomjax.integrate(field, x0, dt=REFERENCE_H, steps=n, method="rk4", save_every=steps_per_save)
    return np.asarray(sol.xs)


def _order_study(model, config: Config):
    """|q(T) − q_exact(T)| at T = config.order_t for each integrator and h, and the fitted orders."""
    q_exact = np.asarray(model.exact(config.order_t)[0])
    out = {}
    for name, (step, x0) in _steps(model).items():
        errs = []
        for h in config.order_hs:
            x, status = geomjax.diagnostics.final_state(step, x0, h, int(round(config.order_t / h)))
            ok = bool(status == geomjax.RESULTS.successful)
            errs.append(float(np.max(np.abs(np.asarray(x)[:2] - q_exact))) if ok else np.nan)
        out[name] = (errs, geomjax.diagnostics.convergence_order(config.order_hs, errs).order)
    return out


def _plot_figure_2(path, runs, models):
    fig, axes = _figure(2, 2, size=(12.0, 9.0), sharex=False)
    for row, alpha in enumerate(ALPHAS):
        run = runs[alpha]
        ts = run["ts"]
        ax = axes[row, 0]
        ax.plot(ts, run["exact_energy"], color="black", linewidth=0.8, linestyle="--", label="exact")
        # A method can follow the exact energy to a line width: markers (staggered) show it.
        for i, (name, data) in enumerate(run["methods"].items()):
            ax.plot(ts, data["energy"], color=COLOURS[name], linewidth=0.6, label=name, marker=MARKERS[i],
                    markersize=4, markerfacecolor="none", markevery=_markevery(len(ts), i, len(run["methods"])))
        ax.set_xlabel("t [s]")
        ax.set_ylabel("energy [J]")
        ax.set_title(f"{'ac'[row]}) energy, alpha = {alpha:g}, h = {H:g} s", fontsize="small")
        ax.legend(fontsize="small")
        ax.grid(True, alpha=0.3)
        ax = axes[row, 1]
        for name, data in run["methods"].items():
            ax.plot(data["xs"][:, 0], data["xs"][:, 1], color=COLOURS[name], linewidth=0.3, label=name)
        ax.set_xlabel("x [m] (south)")
        ax.set_ylabel("y [m] (east)")
        ax.set_title(f"{'bd'[row]}) bob trajectory, alpha = {alpha:g}", fontsize="small")
        ax.grid(True, alpha=0.3)
    fig.suptitle("damped Foucault pendulum (Maciel, Ortiz and Schaerer (2020) Fig. 2): contact (blue) vs Lagrange-d'Alembert (orange)")
    return _save(fig, path)


def _plot_anomaly(path, runs, models):
    fig, axes = _figure(len(ALPHAS), 3, size=(15.0, 4.2 * len(ALPHAS)), sharex=False)
    for row, alpha in enumerate(ALPHAS):
        run = runs[alpha]
        ts = run["ts"]
        rate = float(models[alpha].params["rate"])
        ax = axes[row, 0]
        for name, data in run["methods"].items():
            t_dev, dev = _plane_deviation(data["xs"], ts, rate)
            ax.plot(t_dev, dev, color=COLOURS[name], linewidth=0.8, label=name)
        ax.set_ylabel("plane - exact plane [deg]")
        ax.set_title(rf"alpha = {alpha:g}: plane of oscillation minus $-\Omega \sin\beta\, t$", fontsize="small")
        ax = axes[row, 1]
        for name, data in run["methods"].items():
            t_mid, num = _swing_means(data["xs"], ts, data["energy"])
            _, exact = _swing_means(data["xs"], ts, run["exact_energy"])
            ax.plot(t_mid, num / exact, color=COLOURS[name], linewidth=0.8, label=name)
        ax.set_ylabel("E / E_exact (means over half swings)")
        ax.set_title(f"alpha = {alpha:g}: energy relative to the exact energy", fontsize="small")
        for ax in axes[row, :2]:
            ax.set_xlabel("t [s]")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize="x-small")
        # the bob near the largest jump of either integrator
        ax = axes[row, 2]
        name = max(run["methods"], key=lambda k: abs(run["methods"][k]["jump"][0]))
        data = run["methods"][name]
        k = int(round(float(data["jump"][1]) / H))
        window = slice(max(k - 200, 0), k + 200)
        xs = data["xs"][window]
        ax.plot(xs[:, 0], xs[:, 1], ".-", color=COLOURS[name], markersize=2, linewidth=0.4)
        ax.plot([0.0], [0.0], "k+")
        ax.set_xlabel("x [m]")
        ax.set_ylabel("y [m]")
        ax.set_title(
            f"{name}, alpha = {alpha:g}: 400 steps around its largest jump\n"
            f"({np.degrees(data['jump'][0]):.2f} deg in one step, t = {float(data['jump'][1]):.1f} s)",
            fontsize="small",
        )
        ax.grid(True, alpha=0.3)
    return _save(fig, path)


def _plot_errors(path, runs, orders, config: Config):
    fig, axes = _figure(1, 2, size=(12.0, 4.5), sharex=False)
    styles = {ALPHAS[0]: "-", ALPHAS[1]: ":"}
    window = int(round(20.0 / H))  # maxima over 20-s windows (about one period)
    for alpha, run in runs.items():
        for name, data in run["methods"].items():
            err = data["error_vs_reference"][1:]
            err = err[: len(err) // window * window].reshape(-1, window).max(axis=1)
            t_mid = (np.arange(err.shape[0]) + 0.5) * window * H
            axes[0, 0].plot(t_mid, err, styles[alpha], color=COLOURS[name], linewidth=1.0,
                            label=f"{name}, alpha = {alpha:g}")
    axes[0, 0].set_yscale("log")
    axes[0, 0].set_xlabel("t [s]")
    axes[0, 0].set_ylabel("max |q - q_ref| over 20 s [m]")
    axes[0, 0].set_title(f"h = {H:g}: error against the derived Lagrange-d'Alembert ODE (RK4, h = {REFERENCE_H:g})",
                         fontsize="small")
    hs = np.asarray(config.order_hs)
    for alpha in ALPHAS:
        for name, (errs, p) in orders[str(alpha)].items():
            # the two alphas give nearly the same errors: one marker each tells them apart
            axes[0, 1].loglog(hs, errs, styles[alpha], marker="o" if alpha == ALPHAS[0] else "s", color=COLOURS[name],
                              markersize=5, markerfacecolor="none", label=f"{name}, alpha = {alpha:g}: order {p:.2f}")
    axes[0, 1].set_xlabel("h [s]")
    axes[0, 1].set_ylabel(f"|q(T) - q_exact(T)| [m], T = {config.order_t:g} s")
    axes[0, 1].set_title("convergence of the positions (closed form)", fontsize="small")
    for ax in axes[0]:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="x-small")
    return _save(fig, path)


def _plot_refinement(path, refinement, config: Config):
    fig, axes = _figure(1, 2, size=(12.0, 4.5), sharex=False)
    markers = {ALPHAS[0]: "s", ALPHAS[1]: "o"}
    for (alpha, name), rows in refinement.items():
        hs = np.array([r["h"] for r in rows])
        shift = 1.03 if name == "LA" else 0.97
        for r in rows:
            jumps = np.abs(np.degrees(r["ensemble_max_jump"]))
            axes[0, 0].scatter(np.full(jumps.shape, r["h"] * shift), jumps, s=8, color=COLOURS[name],
                               marker=markers[alpha], alpha=0.6)
        # contact and LA can have the same fractions: their own markers and a small shift keep both visible
        axes[0, 1].plot(hs * shift, [r["fraction_above"] for r in rows], marker=markers[alpha],
                        markerfacecolor="none" if name == "LA" else COLOURS[name], markersize=6,
                        linestyle="--" if name == "LA" else "-", color=COLOURS[name], label=f"{name}, alpha = {alpha:g}")
    axes[0, 0].axhline(JUMP_DEG, color="black", linestyle=":", linewidth=0.8)
    axes[0, 0].set_xscale("log")
    axes[0, 0].set_yscale("log")
    axes[0, 0].set_xlabel("h [s]")
    axes[0, 0].set_ylabel("largest plane jump in one step [deg]")
    axes[0, 0].set_title(f"each run of the ensembles (h and {config.ensemble} steps within +-{SPREAD:.1%})",
                         fontsize="small")
    axes[0, 1].set_xscale("log")
    axes[0, 1].set_xlabel("h [s]")
    axes[0, 1].set_ylabel(f"fraction of runs with a jump > {JUMP_DEG:g} deg")
    axes[0, 1].legend(fontsize="x-small")
    for ax in axes[0]:
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"refined-step check: plane jumps over t in [0, {config.t_final:g}] s")
    return _save(fig, path)


@register(
    NAME,
    "Maciel, Ortiz and Schaerer (2020) sec. 3.2, Fig. 2: damped Foucault pendulum, nonholonomic contact vs Lagrange-d'Alembert; "
    "energy, trajectory, the plane-jump anomaly and the refined-step check, errors against a derived ODE reference",
    options=("t_final",),
    quick={"config": QUICK},
)
def run(out_dir: pathlib.Path, progress: bool, config: Config | None = None, t_final=None) -> dict:
    """The paper's runs, the anomaly scan, the refined-step check and the orders; `config`
    (default `Config()`, the paper's) and `t_final` (the `--t-final` option) set the sizes."""
    config = Config() if config is None else config
    if t_final is not None:
        config = dataclasses.replace(config, t_final=float(t_final))
    out_dir = pathlib.Path(out_dir)
    models = {alpha: geomjax.models.damped_foucault(alpha=alpha) for alpha in ALPHAS}
    steps = int(round(config.t_final / H))
    ts = np.arange(steps + 1) * H
    runs, summary, reference_check = {}, [], {}
    for alpha, model in models.items():
        ref = _reference(model, int(round(H / REFERENCE_H)), config.t_final)
        q_exact = np.asarray(jax.vmap(lambda t: model.exact(t)[0])(jnp.asarray(ts)))
        reference_check[str(alpha)] = float(np.max(np.abs(ref[:, :2] - q_exact)))
        run_ = {"ts": ts, "exact_energy": _exact_energy(model, ts), "methods": {}}
        for name, (step, x0) in _steps(model).items():
            sol = geomjax.integrate(step, x0, dt=H, steps=steps, throw=False,
                                    progress=f"{name}, alpha={alpha:g}" if progress else False)
            xs = np.asarray(sol.xs)
            worst, when, total, _, _ = (float(a) for a in _anomaly_scan(step, model, x0, jnp.asarray(H), jnp.asarray(steps)))
            run_["methods"][name] = {
                "xs": xs,
                "energy": _energy(model, xs),
                "status": sol.message,
                "jump": (worst, when),
                "plane_final_deg": float(np.degrees(total)),
                "error_vs_reference": np.max(np.abs(xs[:, :2] - ref[:, :2]), axis=1),
            }
        runs[alpha] = run_
    figures = [
        _plot_figure_2(out_dir / f"{NAME}_fig2.png", runs, models),
        _plot_anomaly(out_dir / f"{NAME}_anomaly.png", runs, models),
    ]
    refinement = {}
    for alpha, model in models.items():
        for name, (step, x0) in _steps(model).items():
            rows = []
            for h in config.refine_hs:
                worst, when, total, err, ratio = _ensemble(step, model, x0, h, config)
                rows.append({
                    "h": h,
                    "max_jump_rad": float(worst[0]),
                    "jump_time_s": float(when[0]),
                    "plane_final_deg": float(np.degrees(total[0])),
                    "max_q_error_vs_exact_m": float(err[0]),
                    "energy_ratio_at_T": float(ratio[0]),
                    "ensemble_max_jump": worst[1:],
                    "fraction_above": float(np.mean(np.abs(np.degrees(worst[1:])) > JUMP_DEG)),
                    "median_max_jump_deg": float(np.median(np.abs(np.degrees(worst[1:])))),
                })
            refinement[(alpha, name)] = rows
    figures.append(_plot_refinement(out_dir / f"{NAME}_refinement.png", refinement, config))
    orders = {str(alpha): _order_study(model, config) for alpha, model in models.items()}
    figures.append(_plot_errors(out_dir / f"{NAME}_errors.png", runs, orders, config))
    for alpha in ALPHAS:
        for name in ("contact", "LA"):
            for r in refinement[(alpha, name)]:
                summary.append({
                    "alpha": alpha,
                    "method": name,
                    "h [s]": r["h"],
                    "max jump [deg]": float(np.degrees(r["max_jump_rad"])),
                    "at t [s]": r["jump_time_s"],
                    "plane at T [deg]": r["plane_final_deg"],
                    "max|q-q_exact| [m]": r["max_q_error_vs_exact_m"],
                    "E(T)/E_exact(T)": r["energy_ratio_at_T"],
                    f"P(jump>{JUMP_DEG:g}deg)": r["fraction_above"],
                    "median jump [deg]": r["median_max_jump_deg"],
                })
    seed_runs = {
        str(alpha): {
            name: {
                "status": data["status"],
                "max_plane_jump_deg": float(np.degrees(data["jump"][0])),
                "jump_time_s": float(data["jump"][1]),
                "plane_deviation_at_T_deg": data["plane_final_deg"],
                "energy_at_T": float(data["energy"][-1]),
                "exact_energy_at_T": float(runs[alpha]["exact_energy"][-1]),
                "max_q_error_vs_reference_m": max_finite(data["error_vs_reference"]),
            }
            for name, data in runs[alpha]["methods"].items()
        }
        for alpha in ALPHAS
    }
    return {
        "setup": {
            "m": 28.0, "length": 67.0, "latitude_deg": 49.0, "g": 9.81, "Omega": geomjax.models._damped.EARTH_ROTATION_RATE,
            "h": H, "t_final": config.t_final, "q0": [0.67, 0.0], "v0": [0.0, 0.0], "alphas": list(ALPHAS),
            "reference": f"lagrange_dalembert_field, RK4, h = {REFERENCE_H}, started on the constraint (project)",
            "refinement": {"hs": list(config.refine_hs), "ensemble": config.ensemble, "spread": SPREAD, "jump_threshold_deg": JUMP_DEG},
        },
        "reference_vs_exact_max_q_error_m": reference_check,
        "seed_runs": seed_runs,
        "refinement": {
            f"{name}, alpha={alpha:g}": [{k: v for k, v in r.items() if k != "ensemble_max_jump"} for r in rows]
            for (alpha, name), rows in refinement.items()
        },
        "orders_vs_exact": {
            a: {name: {"errors": errs, "hs": list(config.order_hs), "t_final": config.order_t, "order": p} for name, (errs, p) in by.items()}
            for a, by in orders.items()
        },
        "summary": summary,
        "figures": [str(p) for p in figures],
    }
