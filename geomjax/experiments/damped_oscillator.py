"""Maciel, Ortiz and Schaerer (2020) §3.1, Fig. 1: the damped oscillator, contact (Herglotz) vs forced Lagrange–d'Alembert.

System (`geomjax.models.damped_oscillator`): m = 1, L = ½q̇² − ½q², Rayleigh force
F = −αq̇; Herglotz form L − αz. Exact motion q̈ + αq̇ + q = 0.

Methods, all derived by autodiff from L:

- **contact** (paper eq. (10)): `geomjax.herglotz(L − αz, order=1)`;
- **LA** (paper eq. (7), with 1 + hα): `geomjax.forced_dla(L, force=−αq̇)` (left rule);
- **contact, order 2** (extra): the symmetric contact integrator `herglotz(order=2)`;
- **LA as printed** (extra): the paper's typeset eq. (7), p_j = (p_{j−1} − hq_{j−1})/(1 + α),
  is the forced DLA map of the damping force −(α/h)q̇ (a damping rate α/h): derived by
  autodiff with that force, to show what the printed map does.

References: the exact solution, and the paper's "leapfrog at h/10": the explicit symmetric
contact splitting C_{h/2}B_{h/2}A_hB_{h/2}C_{h/2} of H = p²/2 + q²/2 + αs
(`geomjax.contact_splitting`, order 2) with step h/10.

Setup: the paper prints no values for Fig. 1 ("a small damping parameter α"); we use the
public setup of Vermeeren–Bravetti–Seri, h = 0.1, (p₀, q₀) = (0.75, −0.25), t ∈ [0, 100],
with α = 0.01 and α = 0.1 (stated in the JSON and in the figure titles). The relative
error is the phase-space one, ‖(q, p) − (q, p)_ref‖ / ‖(q, p)_ref‖ (p = q̇ for m = 1): a
relative error of q alone is infinite at the zeros of q.

Measured orders: global relative errors at T = 10 for h = 0.2 … 0.2/2⁶, for
α ∈ {1, 0.3, 0.1, 0.01, 0.001, 0}, least-squares slope (`diagnostics.convergence_order`).

Modified Lagrangians: for a linear map the step's Jacobian (`diagnostics.step_jacobian`,
autodiff) gives the per-step area factor det DΦ_h and rotation angle, hence the exact
energy decay rate r(h) = −log det DΦ_h / h (the quadratic energy decays as e^{−rt}) and
frequency ω(h) = arg λ / h of the numerical flow. Paper eq. (11) (contact, L_mod =
(1 + hα/2)L + O(h²)) predicts the modified motion q̈ + α(1 + hα/2)q̇ + q = 0, i.e.
r = α + hα²/2 + O(h²); paper eq. (8) (LA, L_mod = L + (h/2)q̇q̈ — a total derivative —
and F_mod = F − (h/2)αq̈) predicts (1 + hα/2)q̈ + αq̇ + q = 0, i.e. r = α − hα²/2 + O(h²)
and a frequency lowered by hα/(4ω_d)(1 − α²/2). So the leading coefficient of the energy
error, E_num/E_exact − 1 ≈ −κ h t, is κ = +α²/2 for the contact map (overdamped) and
−α²/2 for LA (underdamped). Checked: κ and the frequency coefficient measured at small h,
and |r − r_mod|/h², |ω − ω_mod|/h² bounded (the truncated modified equations are
O(h²)-accurate); κ also fitted from the energies of the Fig. 1 runs.
"""

import dataclasses
import pathlib
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import geomjax
from geomjax import diagnostics

from . import register
from ._common import MARKERS, _figure, _markevery, _save, max_finite, method_styles

NAME = "damped-oscillator"

ALPHAS = (0.01, 0.1)
ORDER_ALPHAS = (1.0, 0.3, 0.1, 0.01, 0.001, 0.0)
MODIFIED_ALPHAS = (0.01, 0.1, 1.0)
H = 0.1
T_FINAL = 100.0
ORDER_T = 10.0
ORDER_HS = tuple(0.2 / 2**k for k in range(7))
MODIFIED_HS = (0.1, 0.05, 0.025, 0.0125, 0.002, 0.001)


@dataclasses.dataclass(frozen=True)
class Config:
    """Step, horizon and grids of a run: the defaults are the module constants (the
    the paper's setting); `QUICK` is a tiny configuration that draws every figure (smoke tests)."""

    h: float = H
    t_final: float = T_FINAL
    order_t: float = ORDER_T
    order_hs: tuple = ORDER_HS
    order_alphas: tuple = ORDER_ALPHAS
    modified_hs: tuple = MODIFIED_HS


QUICK = Config(t_final=20.0, order_t=2.0, order_hs=ORDER_HS[:3], order_alphas=(1.0, 0.1, 0.0),
               modified_hs=MODIFIED_HS[-3:])


def _contact1(model):
    return geomjax.herglotz(model.contact, order=1), model.x0_contact


def _contact2(model):
    return geomjax.herglotz(model.contact, order=2), model.x0_contact


def _la(model):
    return geomjax.forced_dla(model.forced), model.x0_forced


def _printed_damping(alpha, h, q, v, t):
    """−(α/h)v: its left-rule discrete force −αv gives the paper's printed 1 + α."""
    del q, t
    return -(alpha / h) * v


def _la_printed(model, h):
    force = jax.tree_util.Partial(_printed_damping, model.params["alpha"], jnp.asarray(h))
    return geomjax.forced_dla(model.forced.lagrangian, force=force), model.x0_forced


class Scheme(NamedTuple):
    """An integrator of the comparison: `build(model, h) -> (step, x0)`."""

    name: str
    description: str
    build: Callable
    style: dict


METHODS = [
    Scheme("contact", "paper eq. (10): geomjax.herglotz(L - alpha z, order=1)", lambda m, h: _contact1(m),
           {"color": "tab:blue"}),
    Scheme("LA", "paper eq. (7) with 1 + h alpha: geomjax.forced_dla(L, force=-alpha v), left rule", lambda m, h: _la(m),
           {"color": "tab:orange"}),
    Scheme("contact, order 2", "symmetric contact integrator, geomjax.herglotz(order=2)", lambda m, h: _contact2(m),
           {"color": "tab:green", "linestyle": "--"}),
    Scheme("LA as printed (1+alpha)", "the paper's typeset eq. (7): forced_dla with the force -(alpha/h) v",
           _la_printed, {"color": "tab:red", "linestyle": ":"}),
]
ORDER_METHODS = METHODS[:3]


def _phase_state(x):
    """(q, p) of a flat state (q, p) or (q, p, z)."""
    return np.asarray(x)[..., :2]


def _leapfrog(model, h, steps):
    """The reference: symmetric contact splitting with step h/10, saved every 10 steps."""
    alpha = model.params["alpha"]
    step = geomjax.contact_splitting(
        jax.tree_util.Partial(_potential), jax.tree_util.Partial(_constant, alpha), order=2
    )
    sol = geomjax.integrate(step, model.x0_contact, dt=h / 10, steps=10 * steps, save_every=10)
    return _phase_state(sol.xs)


def _potential(q, t):
    del t
    return 0.5 * (q @ q)


def _constant(value, t):
    del t
    return value


def _exact(model, ts):
    q, v = jax.vmap(model.exact)(jnp.asarray(ts))
    return np.concatenate([np.asarray(q), np.asarray(v)], axis=1)


def _relative(xs, ref):
    return np.linalg.norm(xs - ref, axis=1) / np.linalg.norm(ref, axis=1)


def _energy(xs):
    return 0.5 * (xs[:, 0] ** 2 + xs[:, 1] ** 2)


def _fitted_rate(ts, energy, alpha):
    """The mean energy decay rate: −log of the ratio of E averaged over the last and the
    first period 2π/ω_d, over the time between the windows' centres (averaging over a
    period removes the O(h) oscillation of the discrete energy at leading order)."""
    window = int(round(2.0 * np.pi / np.sqrt(1.0 - 0.25 * alpha**2) / (ts[1] - ts[0])))
    first, last = energy[:window].mean(), energy[-window:].mean()
    span = ts[-window:].mean() - ts[:window].mean()
    return -float(np.log(last / first)) / span


def _run_figure_1(progress, config: Config):
    h = config.h
    steps = int(round(config.t_final / h))
    ts = np.arange(steps + 1) * h
    runs = {}
    for alpha in ALPHAS:
        model = geomjax.models.damped_oscillator(alpha)
        exact = _exact(model, ts)
        leapfrog = _leapfrog(model, h, steps)
        out = {"ts": ts, "exact": exact, "leapfrog": leapfrog, "methods": {}}
        for method in METHODS:
            step, x0 = method.build(model, h)
            sol = geomjax.integrate(step, x0, dt=h, steps=steps, throw=False,
                                    progress=f"{method.name}, alpha={alpha:g}" if progress else False)
            out["methods"][method.name] = (_phase_state(sol.xs), sol.message)
        runs[alpha] = out
    return runs


def _order_study(config: Config):
    """Relative errors at T for each method, α and h; and the fitted orders."""
    table, orders = {}, {}
    for method in ORDER_METHODS:
        table[method.name], orders[method.name] = {}, {}
        for alpha in config.order_alphas:
            model = geomjax.models.damped_oscillator(alpha)
            exact = _exact(model, np.array([config.order_t]))[0]
            errors = []
            for h in config.order_hs:
                step, x0 = method.build(model, h)
                x, status = diagnostics.final_state(step, x0, h, int(round(config.order_t / h)))
                ok = bool(status == geomjax.RESULTS.successful)
                errors.append(float(np.linalg.norm(_phase_state(x) - exact) / np.linalg.norm(exact)) if ok else np.nan)
            fit = diagnostics.convergence_order(config.order_hs, errors)
            table[method.name][alpha] = errors
            orders[method.name][alpha] = fit.order
    return table, orders


def _predicted(name, alpha, h):
    """(r, ω) of the modified equations of paper eqs. (11) (contact) and (8) (LA)."""
    if name == "contact":  # q̈ + α(1 + hα/2)q̇ + q = 0
        rate = alpha * (1.0 + 0.5 * h * alpha)
        return rate, np.sqrt(1.0 - 0.25 * rate**2)
    if name == "LA":  # (1 + hα/2)q̈ + αq̇ + q = 0
        mu = 1.0 + 0.5 * h * alpha
        return alpha / mu, np.sqrt(1.0 / mu - 0.25 * alpha**2 / mu**2)
    return alpha, np.sqrt(1.0 - 0.25 * alpha**2)


def _rate_and_frequency(step, x0, h):
    jac = np.asarray(diagnostics.step_jacobian(step, x0, h))[:2, :2]
    lam = np.linalg.eigvals(jac)[0]
    return -np.log(np.linalg.det(jac)) / h, abs(np.angle(lam)) / h


def _leading(h1, d1, h2, d2):
    """a of d(h) = a h + b h² through (h1, d1), (h2, d2)."""
    return (d1 * h2**2 - d2 * h1**2) / (h1 * h2 * (h2 - h1))


def _modified_lagrangian_study(config: Config):
    rows, curves = [], {}
    for alpha in MODIFIED_ALPHAS:
        model = geomjax.models.damped_oscillator(alpha)
        wd = np.sqrt(1.0 - 0.25 * alpha**2)
        for method in METHODS[:3]:
            rates, freqs, rate_res, freq_res = [], [], [], []
            for h in config.modified_hs:
                step, x0 = method.build(model, h)
                r, w = _rate_and_frequency(step, x0, h)
                rp, wp = _predicted(method.name, alpha, h)
                rates.append(r)
                freqs.append(w)
                rate_res.append(abs(r - rp) / h**2)
                freq_res.append(abs(w - wp) / h**2)
            # leading coefficients a of d(h) = a h + b h² from the two smallest steps
            h1, h2 = config.modified_hs[-1], config.modified_hs[-2]
            rp, wp = _predicted(method.name, alpha, h1)
            rp2, wp2 = _predicted(method.name, alpha, h2)
            claim = {"contact": "eq. (11)", "LA": "eq. (8)"}.get(method.name, "order 2: no O(h) term")
            rows.append(
                {
                    "method": method.name,
                    "alpha": alpha,
                    "claim": claim,
                    "kappa measured": _leading(h1, rates[-1] - alpha, h2, rates[-2] - alpha),
                    "kappa predicted": _leading(h1, rp - alpha, h2, rp2 - alpha),
                    "freq coef measured": _leading(h1, freqs[-1] - wd, h2, freqs[-2] - wd),
                    "freq coef predicted": _leading(h1, wp - wd, h2, wp2 - wd),
                    "max |r-r_mod|/h^2": max(rate_res),
                    "max |w-w_mod|/h^2": max(freq_res),
                }
            )
            curves[(method.name, alpha)] = (np.asarray(rates), np.asarray(freqs))
    return rows, curves


def _plot_figure_1(path, runs, styles, config: Config):
    fig, axes = _figure(3, len(ALPHAS), size=(6.0 * len(ALPHAS), 9.0))
    for j, (alpha, run) in enumerate(runs.items()):
        ts = run["ts"]
        ax = axes[0, j]
        ax.plot(ts, run["exact"][:, 0], color="black", linewidth=2.0, alpha=0.3, label="exact")
        # The methods agree to a line width here: staggered markers tell them apart.
        for i, (name, (xs, _)) in enumerate(run["methods"].items()):
            ax.plot(ts, xs[:, 0], label=name, marker=MARKERS[i], markersize=4,
                    markevery=_markevery(len(ts), i, len(run["methods"])), **styles[name])
        ax.set_ylabel("q")
        ax.set_title(rf"solutions, $\alpha$ = {alpha:g}, h = {config.h:g}, $(p_0, q_0)$ = (0.75, -0.25)", fontsize="small")
        for row, (ref_name, ref) in ((1, ("leapfrog h/10", run["leapfrog"])), (2, ("exact", run["exact"]))):
            ax = axes[row, j]
            for i, (name, (xs, _)) in enumerate(run["methods"].items()):
                ax.plot(ts[1:], _relative(xs, ref)[1:], label=name, marker=MARKERS[i], markersize=4,
                        markevery=_markevery(len(ts) - 1, i, len(run["methods"])), **styles[name])
            ax.set_yscale("log")
            ax.set_ylabel(f"relative error vs {ref_name}")
            ax.grid(True, which="major", alpha=0.3)
        axes[2, j].set_xlabel("t")
        axes[0, j].grid(True, alpha=0.3)
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside lower center", ncols=5, fontsize="small")
    fig.suptitle("damped oscillator (Maciel, Ortiz and Schaerer (2020) Fig. 1): contact (eq. 10) vs Lagrange-d'Alembert (eq. 7)")
    return _save(fig, path)


def _plot_orders(path, table, orders, styles, config: Config):
    fig, axes = _figure(1, len(ORDER_METHODS) + 1, size=(4.2 * (len(ORDER_METHODS) + 1), 4.0), sharex=False)
    hs = np.asarray(config.order_hs)
    colours = ("tab:purple", "tab:brown", "tab:blue", "tab:green", "tab:olive", "tab:gray")
    for i, method in enumerate(ORDER_METHODS):
        ax = axes[0, i]
        # Errors for small alpha agree to a line width: one marker per alpha tells them apart.
        for k, (c, alpha) in enumerate(zip(colours, config.order_alphas)):
            p = orders[method.name][alpha]
            ax.loglog(hs, table[method.name][alpha], "-", marker=MARKERS[k], color=c, markersize=4,
                      markerfacecolor="none", label=rf"$\alpha$={alpha:g}: p={p:.2f}")
        ax.loglog(hs, 0.5 * hs, "k:", linewidth=0.8)
        ax.loglog(hs, 0.05 * hs**2, "k--", linewidth=0.8)
        ax.set_title(f"{method.name}: error at t = {config.order_t:g}", fontsize="small")
        ax.set_xlabel("h")
        ax.legend(fontsize="xx-small")
        ax.grid(True, which="both", alpha=0.2)
    axes[0, 0].set_ylabel("relative error (k: h, --: h²)")
    ax = axes[0, -1]
    a = np.asarray([x for x in config.order_alphas if x > 0])
    for method in ORDER_METHODS:
        ax.semilogx(a, [orders[method.name][x] for x in a], "o-", label=method.name, color=styles[method.name]["color"])
    ax.set_xlabel(r"$\alpha$")
    ax.set_ylabel("measured order")
    ax.set_ylim(0.5, 2.5)
    ax.set_title("measured order vs damping", fontsize="small")
    ax.legend(fontsize="x-small")
    ax.grid(True, alpha=0.3)
    return _save(fig, path)


def _plot_modified(path, curves, styles, config: Config):
    fig, axes = _figure(1, len(MODIFIED_ALPHAS), size=(4.5 * len(MODIFIED_ALPHAS), 4.0), sharex=False)
    hs = np.asarray(config.modified_hs)
    fine = np.geomspace(hs.min(), hs.max(), 50)
    for j, alpha in enumerate(MODIFIED_ALPHAS):
        ax = axes[0, j]
        for method in METHODS[:3]:
            rates, _ = curves[(method.name, alpha)]
            style = {"color": styles[method.name]["color"]}
            ax.plot(hs, (rates - alpha) / alpha, "o", **style, label=f"{method.name} (measured)")
            predicted = np.array([_predicted(method.name, alpha, h)[0] for h in fine])
            ax.plot(fine, (predicted - alpha) / alpha, "-", linewidth=0.8, **style)
        ax.set_xscale("log")
        ax.set_xlabel("h")
        ax.set_title(rf"$\alpha$ = {alpha:g}: (r(h) - $\alpha$)/$\alpha$; lines: eqs. (8), (11)", fontsize="small")
        ax.grid(True, which="both", alpha=0.2)
    axes[0, 0].set_ylabel("relative error of the energy decay rate")
    axes[0, 0].legend(fontsize="x-small")
    return _save(fig, path)


@register(
    NAME,
    "Maciel, Ortiz and Schaerer (2020) sec. 3.1, Fig. 1: damped oscillator, contact (Herglotz) vs forced Lagrange-d'Alembert; "
    "errors vs leapfrog and exact, measured orders, modified-Lagrangian checks",
    options=("dt", "t_final"),
    quick={"config": QUICK},
)
def run(out_dir: pathlib.Path, progress: bool, config: Config | None = None, dt=None, t_final=None) -> dict:
    """Figure 1's runs, the order study and the modified-Lagrangian check; `config`
    (default `Config()`, the paper's) sets the sizes, `dt` and `t_final` (the `--dt`,
    `--t-final` options) the step and horizon of figure 1's runs."""
    config = Config() if config is None else config
    config = dataclasses.replace(config, **{k: float(v) for k, v in (("h", dt), ("t_final", t_final)) if v is not None})
    H = config.h  # noqa: N806 (the step of figure 1's runs, as in the paper)
    out_dir = pathlib.Path(out_dir)
    styles = method_styles(METHODS)
    runs = _run_figure_1(progress, config)
    table, orders = _order_study(config)
    modified_rows, curves = _modified_lagrangian_study(config)
    figures = [
        _plot_figure_1(out_dir / f"{NAME}_solutions.png", runs, styles, config),
        _plot_orders(out_dir / f"{NAME}_orders.png", table, orders, styles, config),
        _plot_modified(out_dir / f"{NAME}_modified.png", curves, styles, config),
    ]
    summary, fig1 = [], {}
    for alpha, run_ in runs.items():
        ts = run_["ts"]
        exact_energy = _energy(run_["exact"])
        fig1[str(alpha)] = {}
        for name, (xs, message) in run_["methods"].items():
            rel_leap = _relative(xs, run_["leapfrog"])
            rel_exact = _relative(xs, run_["exact"])
            energy = _energy(xs)
            kappa = (_fitted_rate(ts, energy, alpha) - _fitted_rate(ts, exact_energy, alpha)) / H
            order = orders.get(name, {}).get(alpha)
            summary.append(
                {
                    "method": name,
                    "alpha": alpha,
                    "max rel err vs leapfrog": max_finite(rel_leap[1:]),
                    "max rel err vs exact": max_finite(rel_exact[1:]),
                    "E(T)/E_exact(T)": float(energy[-1] / exact_energy[-1]),
                    "kappa fitted": kappa,
                    "order (T=10)": "-" if order is None else order,
                    "status": message,
                }
            )
            fig1[str(alpha)][name] = {
                "max_relative_error_vs_leapfrog": max_finite(rel_leap[1:]),
                "max_relative_error_vs_exact": max_finite(rel_exact[1:]),
                "final_relative_error_vs_exact": float(rel_exact[-1]),
                "energy_ratio_at_T": float(energy[-1] / exact_energy[-1]),
                "energy_decay_rate_fitted": _fitted_rate(ts, energy, alpha),
                "kappa_fitted": kappa,
                "status": message,
            }
        leap = run_["leapfrog"]
        fig1[str(alpha)]["leapfrog h/10 vs exact"] = float(np.max(_relative(leap, run_["exact"])))
    return {
        "setup": {
            "m": 1.0,
            "alphas": list(ALPHAS),
            "h": H,
            "t_final": config.t_final,
            "q0": -0.25,
            "p0": 0.75,
            "relative_error": "||(q, p) - (q, p)_ref|| / ||(q, p)_ref|| (phase space, p = q' for m = 1)",
            "leapfrog": "geomjax.contact_splitting order 2 (C B A B C) at h/10",
            "order_study": {"alphas": list(config.order_alphas), "hs": list(config.order_hs), "t_final": config.order_t},
            "modified_study": {"alphas": list(MODIFIED_ALPHAS), "hs": list(config.modified_hs)},
        },
        "methods": {m.name: m.description for m in METHODS},
        "figure_1": fig1,
        "orders": {name: {str(a): p for a, p in by_alpha.items()} for name, by_alpha in orders.items()},
        "order_errors": {name: {str(a): e for a, e in by_alpha.items()} for name, by_alpha in table.items()},
        "modified_lagrangian": modified_rows,
        "summary": summary,
        "figures": [p.name for p in figures],
    }
