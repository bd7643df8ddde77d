"""Feedback gains chosen four ways (the papers', Bae & Chang's adaptive rule, the
rule of thumb, tuned with optax), judged on held-out initial states, and Chang, Perlmutter and Vankerschaver's (2022) Fig. 6
claim (feedback Euler at least as good as RATTLE per force evaluation) revisited with them.

Problems (`PROBLEMS`), each with random initial states on its invariant set: a training
set for `geomjax.tune_gains` and a held-out set (other seeds) for every number reported.

- `spherical_pendulum`: Chang, Perlmutter and Vankerschaver (2022) §2.3, m = g = ℓ = 1, F = (|q|², q·p, H, J); starts with
  q uniform on S² and p a standard normal vector projected onto the tangent plane (so
  |q|² = 1, q·p = 0 to round-off). Paper gains 50 (Chang, Perlmutter and Vankerschaver's (2022)). Compared with RATTLE on
  the same pendulum with the rod as g(q) = |q|² − 1.
- `double_pendulum`: `models.planar_chain(2, gravity=9.81)`, F = (g₁, g₂, ġ₁, ġ₂, H);
  starts from link angles and angular velocities uniform in [−1, 1] (on S by
  construction). Paper gains 50 (Chang, Perlmutter and Vankerschaver's (2022) pendulum value). Compared with RATTLE.
- `kepler`: `models.kepler()`, F = (H, L, A) with the paper's gains (0, 4, 4, 4, 2, 2, 2)
  (V = 2‖L − L₀‖² + ‖A − A₀‖², no gain on H); starts on random ellipses (semi-major axis
  a ∈ [0.8, 1.25], eccentricity e ∈ [0.3, 0.7], random true anomaly and orientation).
  Compared with Störmer–Verlet (velocity form, `strang(kick, drift)` of
  `models.kepler_flows`).

Gains, for each problem and method (`euler`, `rk4`), at the step h₀ = 1e−3 of the
problem, over t ∈ [0, T] (T = 1 for the pendulums, 3 for Kepler; `Settings.horizon`
scales T):

- `paper`: the fixed gains above;
- `adaptive`: Bae & Chang's α(x) = 1/(h·1.1‖L·DFᵀKDF‖_F) on the paper's gains
  (`feedback_field(...).adaptive(dt=h)`). The rule is derived for explicit Euler
  (h·α·λ_max ≤ 1/1.1); with RK4 it is run as it is (a feedback rate about 1/h, far above
  the dynamics' rate, which `check_gains` says costs a high-order method accuracy);
- `recommended`: `geomjax.recommended_gains` of the paper field on the training states
  (h·λ_max = 1 for Euler, λ_max = ‖DX‖/10 for RK4), computed from one `check_gains`;
- `tuned`: `geomjax.tune_gains` from the paper's gains on 8 training states (one gain per
  entry of F, the "invariants" objective over the same T, `optax.adam(0.5)`, 30
  iterations, the library's stability constraint at 0.9 of the interval on the training
  states; the best iterate);
- `none` (baseline): zero gains, the method on X without feedback.

Held-out objectives (`metrics["held_out"]`, on 16 held-out states): the two built-in
objectives of `geomjax.feedback_objective` at h₀ with its default 10 saves:
"invariants" = mean over the states of log₁₀ RMS_saves ‖F(x) − F(x₀)‖₂, "reference"
(`metrics["held_out_reference"]`) = mean of log₁₀ RMS_saves ‖x − x_ref‖₂ with x_ref the
run of X (no feedback) by RK4 at h₀/8. They are computed here by one compiled loop per
problem, method and kind of field (gains, step size and number of steps traced) over the
held-out and the training states at once, with the arithmetic of `feedback_objective`:
the training objective of the tuned gains is compared with `TuningResult.objective_after`
(computed by the library) in `metrics["training_objective_check"]` (measured: within
1e−8 where the drift is well above round-off, within 1e−3 in log₁₀ where RK4's drift is
at round-off, 1e−13), and `tests/test_gain_tuning_experiment.py`
checks held-out values against `feedback_objective` itself. A held-out run that turns
non-finite is "failed": the variant's value is then null in the JSON
(`feedback_objective` returns inf) and `metrics["held_out_failed"]` counts the failures.

Error vs h and vs force evaluations (`metrics["errors_vs_h"]`): the same runs over
t ∈ [0, T] at h = h₀·2^k (k = −2 … 2; the baseline k = −4 … 2), each point the geometric
mean over the held-out states of the RMS invariant error and of the RMS trajectory error
(10^objective; the reference stays the RK4 run at h₀/8). Gains at h ≠ h₀: paper fixed;
adaptive rebuilt for h; recommended by the rule of thumb at h; tuned carried from h₀ with
the rule of thumb's dependence on h (Euler: K·h₀/h, keeping the tuned h·λ_max; RK4:
unchanged while λ_max = ‖DX‖/10 is within half the stability interval), not re-tuned per h
(that would take one tuning per point). Force evaluations per run, Chang, Perlmutter and Vankerschaver's (2022) cost model:
a feedback-field evaluation counts 4, ∇H 1: Euler 4/step, RK4 16/step, RATTLE and
Störmer–Verlet 1/step (one new force per step); the adaptive field's Hessian of V, which
it evaluates at every stage, is not counted.

Chang, Perlmutter and Vankerschaver's (2022) claim (`metrics["vs_baseline_per_force_evaluation"]`, and the summary's
"inv/base" and "traj/base" columns): for each variant and method, the ratio of its error
to the baseline's at the same number of force evaluations (the baseline's errors
interpolated log–log at each point inside their range). The claim holds at a point where
the ratio is ≤ 1.
"""

import math
import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

import geomjax

from . import register
from ._common import MARKERS, _markevery, _save
from .._status import code_of

NAME = "gain-tuning"

METHODS = ("euler", "rk4")
VARIANTS = ("paper", "adaptive", "recommended", "tuned")
FIXED = ("paper", "recommended", "tuned", "none")  # the variants run by one compiled loop
COST_PER_STEP = {"euler": 4, "rk4": 16, "baseline": 1}
_TABLEAUS = {"euler": geomjax.EULER, "rk4": geomjax.RK4}
_OK = int(np.asarray(code_of(geomjax.RESULTS.successful)))
_TINY = 1e-300  # as feedback_objective: log10(value + tiny)


# --------------------------------------------------------------------------------------
# Problems


@dataclass(frozen=True)
class Problem:
    """One system of the study.

    - `key`, `title`: the JSON key and a readable name.
    - `model`: the geomjax model whose system the feedback field is built on.
    - `paper_gains`: one gain per entry of F (the papers' values).
    - `baseline_name`, `baseline`: the symplectic method compared with, as a geomjax step.
    - `starts(count, seed)`: `(count, n)` initial states on the invariant set.
    - `h0`, `t_final`: the step the gains are tuned and compared at, and the horizon.
    - `residuals(x)`: what vanishes on the invariant set's constraints (to check starts).
    - `notes`: where the values come from.
    """

    key: str
    title: str
    model: object
    paper_gains: np.ndarray
    baseline_name: str
    baseline: object
    starts: Callable[[int, int], np.ndarray]
    h0: float
    t_final: float
    residuals: Callable
    notes: str = ""


def _sphere_starts(count: int, seed: int) -> np.ndarray:
    """q uniform on S², p standard normal projected on the tangent plane at q."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(count, 3))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    p = rng.normal(size=(count, 3))
    p -= np.sum(p * q, axis=1, keepdims=True) * q
    return np.concatenate([q, p], axis=1)


def _double_pendulum_starts(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([
        np.asarray(geomjax.models.planar_chain(2, gravity=9.81, angles=rng.uniform(-1.0, 1.0, 2),
                                               angular_velocities=rng.uniform(-1.0, 1.0, 2)).x0)
        for _ in range(count)
    ])


def _rotation(rng) -> np.ndarray:
    """A uniformly random rotation of R³ (QR of a Gaussian matrix, signs fixed, det = 1)."""
    qm, r = np.linalg.qr(rng.normal(size=(3, 3)))
    qm = qm * np.sign(np.diag(r))
    if np.linalg.det(qm) < 0:
        qm[:, 0] = -qm[:, 0]
    return qm


def _kepler_starts(count: int, seed: int, mu: float = 1.0) -> np.ndarray:
    """States on random ellipses: a ∈ [0.8, 1.25], e ∈ [0.3, 0.7], true anomaly ν uniform,
    orbital plane and periapsis direction uniformly random. In the plane,
    q = r(cos ν, sin ν), v = √(μ/(a(1 − e²)))(−sin ν, e + cos ν), r = a(1 − e²)/(1 + e cos ν)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        a, e, nu = rng.uniform(0.8, 1.25), rng.uniform(0.3, 0.7), rng.uniform(0.0, 2.0 * np.pi)
        slr = a * (1.0 - e * e)
        r = slr / (1.0 + e * np.cos(nu))
        q = np.array([r * np.cos(nu), r * np.sin(nu), 0.0])
        v = math.sqrt(mu / slr) * np.array([-np.sin(nu), e + np.cos(nu), 0.0])
        rot = _rotation(rng)
        out.append(np.concatenate([rot @ q, rot @ v]))
    return np.stack(out)


def _spherical_problem() -> Problem:
    model = geomjax.models.spherical_pendulum()
    rod = geomjax.models.spherical_pendulum(holonomic=True)
    return Problem(
        "spherical_pendulum", "spherical pendulum", model, np.full(4, 50.0), "RATTLE", geomjax.rattle(rod.system),
        _sphere_starts, 1e-3, 1.0, rod.system.constraint_residuals,
        "Chang, Perlmutter and Vankerschaver (2022) sec. 2.3: m = g = l = 1, F = (|q|^2, q.p, H, J), gains 50, h = 1e-3",
    )


def _double_pendulum_problem() -> Problem:
    model = geomjax.models.planar_chain(2, gravity=9.81)
    return Problem(
        "double_pendulum", "double pendulum", model, np.full(5, 50.0), "RATTLE", geomjax.rattle(model.system),
        _double_pendulum_starts, 1e-3, 1.0, model.system.constraint_residuals,
        "models.planar_chain(2, gravity=9.81): m = l = 1, F = (g1, g2, gdot1, gdot2, H); gains 50 (Chang, Perlmutter and Vankerschaver's (2022) "
        "pendulum value); starts: angles and angular velocities uniform in [-1, 1]",
    )


def _kepler_problem() -> Problem:
    model = geomjax.models.kepler()
    drift, kick = geomjax.models.kepler_flows(model)
    return Problem(
        "kepler", "Kepler problem", model, np.asarray(model.gains, np.float64), "Störmer–Verlet",
        geomjax.strang(kick, drift), _kepler_starts, 1e-3, 3.0, model.system.constraint_residuals,
        "models.kepler(): mu = 1, F = (H, L, A), the paper's gains (0, 4, 4, 4, 2, 2, 2) "
        "(V = k1/2|L - L0|^2 + k2/2|A - A0|^2, k1 = 4, k2 = 2); random ellipses a in [0.8, 1.25], "
        "e in [0.3, 0.7]; Stormer-Verlet = strang(kick, drift) of models.kepler_flows",
    )


PROBLEMS: dict[str, Callable[[], Problem]] = {
    "spherical_pendulum": _spherical_problem,
    "double_pendulum": _double_pendulum_problem,
    "kepler": _kepler_problem,
}


@dataclass(frozen=True)
class Settings:
    """What the experiment runs (all recorded in the JSON).

    `horizon` scales every problem's T (and so the number of steps); `h_exponents` are
    the k of h = h₀·2^k for the feedback runs, `baseline_exponents` for RATTLE/Verlet.
    """

    problems: tuple = tuple(PROBLEMS)
    methods: tuple = METHODS
    train: int = 8
    held_out: int = 16
    train_seed: int = 1
    held_out_seed: int = 2
    iterations: int = 30
    learning_rate: float = 0.5
    stability: float = 0.9
    saves: int = 10
    horizon: float = 1.0
    h_exponents: tuple = (-2, -1, 0, 1, 2)
    baseline_exponents: tuple = (-4, -3, -2, -1, 0, 1, 2)
    reference_substeps: int = 8


QUICK = Settings(problems=("spherical_pendulum",), train=3, held_out=3, iterations=2, horizon=0.5,
                 h_exponents=(0, 1), baseline_exponents=(-1, 0, 1))


# --------------------------------------------------------------------------------------
# The runs: one compiled loop per problem, method and kind of field; h, the number of
# steps and the gains are traced


def _trajectory(step, quantities, x0, h, per_save, saves: int):
    """`saves` blocks of `per_save` steps of size h from x0: the states and F at the saves
    (the start first), the largest ‖F − F(x0)‖₂ after any step, and the first non-success
    status code of the steps (a Newton failure; a non-finite state is seen in the states)."""
    z0 = step.split(x0)
    run = step.at_start(z0)
    f0 = quantities(x0)

    def one(i, carry):
        z, worst, code, k = carry
        z, result = run.advance(k.astype(h.dtype) * h, z, h, None)
        dev = quantities(run.merge(z)) - f0
        worst = jnp.maximum(worst, jnp.sqrt(jnp.sum(dev * dev)))
        code = jnp.where(code == _OK, jnp.asarray(code_of(result), code.dtype), code)
        return z, worst, code, k + 1

    def block(carry, _):
        carry = lax.fori_loop(jnp.zeros_like(per_save), per_save, one, carry)
        return carry, run.merge(carry[0])

    init = (z0, jnp.zeros((), x0.dtype), jnp.asarray(_OK, jnp.int32), jnp.zeros((), jnp.int64))
    (_, worst, code, _), xs = lax.scan(block, init, None, length=saves)
    xs = jnp.concatenate([x0[None], xs])
    return xs, jax.vmap(quantities)(xs), worst, code


@eqx.filter_jit
def _fixed_runs(base, tableau, gains, x0s, h, per_save, saves):
    """Every gain vector (V, m) from every state (B, n): states (V, B, saves + 1, n), F at
    the saves (V, B, saves + 1, m), worst invariant error and status (V, B)."""

    def member(k, x0):
        step = geomjax.explicit_rk(eqx.tree_at(lambda f: f.gains, base, k), tableau)
        return _trajectory(step, base.quantities, x0, h, per_save, saves)

    return jax.vmap(lambda k: jax.vmap(lambda x: member(k, x))(x0s))(gains)


@eqx.filter_jit
def _adaptive_runs(base, tableau, x0s, h, per_save, saves):
    step = geomjax.explicit_rk(base.adaptive(dt=h), tableau)
    return jax.vmap(lambda x: _trajectory(step, base.quantities, x, h, per_save, saves))(x0s)


@eqx.filter_jit
def _step_runs(step, base, x0s, h, per_save, saves):
    return jax.vmap(lambda x: _trajectory(step, base.quantities, x, h, per_save, saves))(x0s)


@eqx.filter_jit
def _rates(base, gains, x0s):
    """λ_max(∇²V) at each state (with F₀ = F(x0)) for each gain vector: (V, B)."""

    def one(k, x):
        f = eqx.tree_at(lambda f: f.gains, base, k)
        return geomjax.feedback_rate(f.at_start(f.split(x)), x)

    return jax.vmap(lambda k: jax.vmap(lambda x: one(k, x))(x0s))(gains)


def _counts(t_final, h, saves):
    steps = int(round(t_final / h))
    if steps % saves or abs(steps * h - t_final) > 1e-9 * t_final:
        raise ValueError(f"T = {t_final} is not a multiple of {saves} steps of h = {h}")
    return steps, steps // saves


def _measures(xs, fs, code, reference):
    """Per run (…, B): log₁₀ RMS over the saves of ‖F − F₀‖ and of ‖x − x_ref‖ (the
    objectives of feedback_objective), and whether the run failed."""
    xs, fs = np.asarray(xs), np.asarray(fs)
    with np.errstate(invalid="ignore", over="ignore"):
        dev = fs[..., 1:, :] - fs[..., :1, :]
        inv = np.log10(np.sqrt(np.mean(np.sum(dev * dev, axis=-1), axis=-1)) + _TINY)
        err = xs[..., 1:, :] - reference[:, 1:, :]
        traj = np.log10(np.sqrt(np.mean(np.sum(err * err, axis=-1), axis=-1)) + _TINY)
    failed = ~(np.all(np.isfinite(xs), axis=(-1, -2)) & np.isfinite(inv) & np.isfinite(traj)) | (np.asarray(code) != _OK)
    return inv, traj, failed


def _aggregate(values, failed):
    """Mean over the held-out states (last axis) or None, and the failure count."""
    n_failed = int(np.sum(failed))
    return (None if n_failed else float(np.mean(values))), n_failed


# --------------------------------------------------------------------------------------
# Gains


def _rule_rate(order: int, h: float, bound: float, dynamics: float) -> float:
    """The rule of thumb of `geomjax.check_gains`, as documented: h·λ_max = 1 (within half
    the stability interval) for first-order methods, λ_max = ‖DX‖/10 within half the
    stability interval for higher orders."""
    if order <= 1:
        return min(1.0, 0.5 * bound) / h
    return min(0.1 * dynamics, 0.5 * bound / h)


def _order(method: str) -> int:
    return 1 if method == "euler" else 4


def recommended_gains(problem, check, h, method):
    """`geomjax.recommended_gains(paper field, training states, h, method)` from a
    `check_gains` of the paper field on the training states (any method: its rates)."""
    rate = _rule_rate(_order(method), h, geomjax.stability_interval(method), check.dynamics_rate)
    return np.asarray(problem.paper_gains) * rate / check.feedback_rate


def _gains_at(problem, h, method, recommended_h0, tuned_h0, check):
    """The fixed-gain variants at step h (rows of FIXED): recommended and tuned gains from
    h₀ times rule(h)/rule(h₀), the rule of thumb's dependence on h."""
    order = _order(method)
    bound = geomjax.stability_interval(method)
    factor = _rule_rate(order, h, bound, check.dynamics_rate) / _rule_rate(order, problem.h0, bound, check.dynamics_rate)
    return np.stack([problem.paper_gains, recommended_h0 * factor, tuned_h0 * factor, np.zeros_like(problem.paper_gains)])


# --------------------------------------------------------------------------------------
# Figures


_VARIANT_STYLE = {
    "paper": {"color": "tab:blue", "marker": "o"},
    "adaptive": {"color": "tab:orange", "marker": "s"},
    "recommended": {"color": "tab:green", "marker": "^"},
    "tuned": {"color": "tab:red", "marker": "D", "markerfacecolor": "none", "markersize": 6},
    "none": {"color": "0.55", "marker": "x"},
}
_METHOD_STYLE = {"euler": {"linestyle": "-"}, "rk4": {"linestyle": "--"}}
_BASELINE_STYLE = {"color": "black", "marker": "*", "linestyle": ":", "markersize": 7}


def _figure(nrows, ncols, size):
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _plot_history(path, problem, tunings, held_out):
    fig, axes = _figure(len(tunings), 2, (11.0, 3.6 * len(tunings)))
    for row, (method, result) in enumerate(tunings.items()):
        result.plot(axes=axes[row])
        value = held_out[method]["tuned"]
        if value is not None:  # the held-out objective at the tuned gains (the best iterate)
            best = int(np.nanargmin(result.history["objective"]))
            axes[row, 0].plot([best], [value], "s", color="tab:red", label="held-out states, tuned gains")
        # An entry of F with gain 0 (Kepler's H) stays 0: drop its line from the log axis.
        ax = axes[row, 1]
        for line in list(ax.get_lines()):
            if np.all(np.asarray(line.get_ydata()) <= 1e-299):
                line.remove()
        ax.relim()
        ax.autoscale_view()
        names = problem.model.quantity_names
        # Gains that move together (equal starts) would hide each other: a marker each.
        for k, line in enumerate(ax.get_lines()):
            line.set_marker(MARKERS[k % len(MARKERS)])
            line.set_markevery(_markevery(len(line.get_xdata()), k, len(ax.get_lines()), marks=8))
            line.set_markerfacecolor("none")
        handles = ax.get_lines()
        labels = [_gain_label(names, h.get_label()) for h in handles]
        ax.legend(handles, labels, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small")
        axes[row, 0].legend(loc="best", fontsize="small")
        axes[row, 0].set_title(f"{problem.title}, {method}: objective (log10 RMS |F - F0|)", fontsize="medium")
        ax.set_title(f"{problem.title}, {method}: gains", fontsize="medium")
    return _save(fig, path)


def _gain_label(names, label):
    if label.startswith("K[") and label.endswith("]"):
        j = int(label[2:-1])
        if j < len(names):
            return f"K[{j}] ({names[j]})"
    return label


def _plot_held_out(path, held, failed, problems, titles, methods):
    """Grouped bars: one panel per problem and objective, bars per method and variant."""
    objectives = (("held_out", "invariants: log10 RMS |F - F0|"), ("held_out_reference", "trajectory: log10 RMS |x - x_ref|"))
    fig, axes = _figure(len(objectives), len(problems), (4.6 * len(problems), 7.6))
    width = 0.8 / len(VARIANTS)
    for col, key in enumerate(problems):
        for row, (obj, label) in enumerate(objectives):
            ax = axes[row, col]
            values = [[held[obj][key][m][v] for v in (*VARIANTS, "none")] for m in methods]
            finite = [x for r in values for x in r if x is not None]
            bottom = min(finite) - 0.5 if finite else -1.0
            top = max(finite) + 0.5 if finite else 1.0
            for j, v in enumerate(VARIANTS):
                xs = np.arange(len(methods)) + (j - (len(VARIANTS) - 1) / 2) * width
                for i, m in enumerate(methods):
                    value = held[obj][key][m][v]
                    if value is None:
                        ax.bar(xs[i], top - bottom, width, bottom=bottom, color="none",
                               edgecolor=_VARIANT_STYLE[v]["color"], hatch="//", linewidth=0.8)
                        ax.text(xs[i], bottom + 0.5 * (top - bottom), f"{failed[obj][key][m][v]} failed",
                                rotation=90, ha="center", va="center", fontsize="x-small")
                    else:
                        ax.bar(xs[i], value - bottom, width, bottom=bottom, color=_VARIANT_STYLE[v]["color"],
                               label=v if i == 0 else None)
                        ax.text(xs[i], value, f"{value:.2f}", ha="center", va="bottom", fontsize="x-small", rotation=90,
                                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 0.5}, zorder=4)
            for i, m in enumerate(methods):  # the same method without feedback
                value = held[obj][key][m]["none"]
                if value is not None:
                    ax.plot([i - 0.45, i + 0.45], [value, value], color="black", linestyle="--", linewidth=1.0, zorder=3)
            ax.set_xticks(np.arange(len(methods)), [f"feedback {m}" for m in methods])
            ax.set_ylim(bottom, top + 0.15 * (top - bottom))
            ax.set_ylabel(label, fontsize="small")
            ax.set_title(f"{titles[key]}: objective {'invariants' if row == 0 else 'reference'}", fontsize="medium")
            ax.grid(True, axis="y", alpha=0.3)
    from matplotlib.lines import Line2D

    handles = [_patch(v) for v in VARIANTS] + [Line2D([], [], color="black", linestyle="--", linewidth=1.0)]
    # about 2.2 inches per legend entry: as many columns as the figure is wide
    ncols = max(1, min(len(VARIANTS) + 1, int(4.6 * len(problems) / 2.2)))
    fig.legend(handles, [*VARIANTS, "no feedback (gains 0)"], loc="outside lower center", ncols=ncols, fontsize="small")
    fig.suptitle("held-out objectives at h0 (lower is better; hatched: runs failed)", fontsize="medium")
    return _save(fig, path)


def _patch(variant):
    from matplotlib.patches import Patch

    return Patch(color=_VARIANT_STYLE[variant]["color"], label=variant)


def _plot_errors(path, problem, curves, baseline, methods):
    """2 × 2 panels: invariant and trajectory error vs h (top) and vs force evaluations."""
    from matplotlib.lines import Line2D

    fig, axes = _figure(2, 2, (11.0, 9.6))
    handles, labels = [], []
    for m in methods:
        for v in (*VARIANTS, "none"):
            handles.append(Line2D([], [], **{"linewidth": 1.0, "markersize": 4, **_VARIANT_STYLE[v], **_METHOD_STYLE[m]}))
            labels.append(_curve_label(f"{v} ({m})", curves[m][v]))
    handles.append(Line2D([], [], **{"linewidth": 1.0, **_BASELINE_STYLE}))
    labels.append(_curve_label(problem.baseline_name, baseline))
    for col, quantity in enumerate(("invariants", "trajectory")):
        for row, xkey in enumerate(("h", "force_evaluations")):
            ax = axes[row, col]
            for m in methods:
                for v in (*VARIANTS, "none"):
                    x, y = _curve(curves[m][v], xkey, quantity)
                    if x.size:  # a curve without points (every run failed) has only its legend entry
                        style = {"markersize": 4, **_VARIANT_STYLE[v], **_METHOD_STYLE[m]}
                        ax.loglog(x, y, label=_curve_label(f"{v} ({m})", curves[m][v]), linewidth=1.0, **style)
            x, y = _curve(baseline, xkey, quantity)
            ax.loglog(x, y, label=_curve_label(problem.baseline_name, baseline), linewidth=1.0, **_BASELINE_STYLE)
            ax.set_xlabel("step size h" if xkey == "h" else "force evaluations (feedback field 4, grad H 1)")
            ax.set_ylabel("invariant error (geo. mean RMS |F - F0|)" if quantity == "invariants"
                          else "trajectory error (geo. mean RMS |x - x_ref|)", fontsize="small")
            ax.set_title(f"{quantity} error vs {'h' if xkey == 'h' else 'force evaluations'}", fontsize="medium")
            ax.grid(True, which="major", alpha=0.3)
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize="small")
    fig.suptitle(f"{problem.title}: held-out states, t in [0, {curves['t_final']:g}]", fontsize="medium")
    return _save(fig, path)


def _curve_label(name, points):
    """The legend label, with the step sizes at which held-out runs failed."""
    bad = [p["h"] for p in points if p["failed"]]
    if not bad:
        return name
    if len(bad) == len(points):
        return f"{name}: failed at every h"
    if all(p["failed"] for p in points if p["h"] >= min(bad)):
        return f"{name}: failed for h ≥ {min(bad):.1g}"
    return f"{name}: failed at {len(bad)} of {len(points)} h"


def _curve(points, xkey, quantity):
    """The points of a curve where no held-out run failed and the error is positive."""
    rows = [p for p in points if p["failed"] == 0 and p[quantity] is not None]
    x = np.array([p[xkey] for p in rows], dtype=float)
    y = np.array([10.0 ** p[quantity] for p in rows], dtype=float)
    keep = y > 0
    return x[keep], y[keep]


# --------------------------------------------------------------------------------------
# The claim: feedback Euler vs the baseline at matched force evaluations


def _matched(points, baseline, quantity):
    """For each feedback point inside the baseline's range of force evaluations: the ratio
    of its error to the baseline's (log–log interpolation). None where nothing matches."""
    bx, by = _curve(baseline, "force_evaluations", quantity)
    order = np.argsort(bx)
    bx, by = np.log10(bx[order]), np.log10(by[order])
    out = []
    x, y = _curve(points, "force_evaluations", quantity)
    for xi, yi in zip(np.log10(x), np.log10(y)):
        if bx.size >= 2 and bx[0] <= xi <= bx[-1]:
            out.append({"force_evaluations": float(10**xi), "ratio": float(10 ** (yi - np.interp(xi, bx, by)))})
    return out


# --------------------------------------------------------------------------------------
# The experiment


_CLOCK = [time.perf_counter()]


def _log(progress, text):
    if progress:
        print(f"  [{time.perf_counter() - _CLOCK[0]:6.1f} s] {text}", flush=True)


def _point(h, steps, cost, inv, traj, failed, worst):
    """One point of an error-vs-h curve from the held-out runs (last axis: the states)."""
    mean_inv, n_failed = _aggregate(inv, failed)
    return {
        "h": h, "steps": steps, "force_evaluations": cost * steps,
        "invariants": mean_inv, "trajectory": _aggregate(traj, failed)[0], "failed": n_failed,
        "max_invariant_error": None if n_failed else float(np.max(np.asarray(worst))),
    }


def _study(problem: Problem, settings: Settings, progress) -> dict:
    """Everything for one problem: tuning, held-out objectives, error vs h."""
    started = time.perf_counter()
    t_final = problem.t_final * settings.horizon
    h0, saves = problem.h0, settings.saves
    n0, _ = _counts(t_final, h0, saves)
    train = problem.starts(settings.train, settings.train_seed)
    held = problem.starts(settings.held_out, settings.held_out_seed)
    # Every run goes from the held-out states and, after them, the training states (these
    # only to check the training objective against tune_gains' own): one batch, one
    # compilation per kind of run.
    n_held = held.shape[0]
    x0s = jnp.asarray(np.concatenate([held, train]))
    paper = geomjax.feedback_field(problem.model.system, problem.model.x0, problem.paper_gains)

    # The starts are on S: the largest constraint residual over them.
    start_residual = float(np.max(np.abs(np.asarray(jax.jit(jax.vmap(problem.residuals))(x0s))), initial=0.0))

    # One check on the training states gives λ_max and ‖DX‖; the rule of thumb's gains for
    # each method follow from them (what geomjax.recommended_gains computes, one rate
    # evaluation instead of one per method; the test checks that they agree).
    check = geomjax.check_gains(paper, train, h0, "euler", warn=False)
    recommended, tunings, tune_times = {}, {}, {}
    for method in settings.methods:
        recommended[method] = recommended_gains(problem, check, h0, method)
        _log(progress, f"{problem.key}: tuning {method} ({settings.iterations} iterations)")
        t = time.perf_counter()
        tunings[method] = geomjax.tune_gains(
            paper, train, dt=h0, steps=n0, method=method, iterations=settings.iterations,
            stability=settings.stability, optimizer=optax.adam(settings.learning_rate),
        )
        tune_times[method] = time.perf_counter() - t

    # The reference: X (zero gains) by RK4 at h0/8, saved at the same times.
    _log(progress, f"{problem.key}: reference, then the runs over h")
    sub = settings.reference_substeps
    zeros = np.zeros((len(FIXED), problem.paper_gains.size))
    _, per_ref = _counts(t_final, h0 / sub, saves)
    ref_xs, _, _, ref_code = _fixed_runs(paper, geomjax.RK4, jnp.asarray(zeros), x0s, jnp.asarray(h0 / sub),
                                         jnp.asarray(per_ref), saves)
    reference = np.asarray(ref_xs[0])
    if np.any(np.asarray(ref_code[0]) != _OK) or not np.all(np.isfinite(reference)):
        raise RuntimeError(f"{problem.key}: the reference run failed")

    hs = [h0 * 2.0**k for k in settings.h_exponents]
    if h0 not in hs:
        hs = sorted([*hs, h0])
    curves = {m: {v: [] for v in (*VARIANTS, "none")} for m in settings.methods}
    fractions, training = {}, {}
    for method in settings.methods:
        tableau = _TABLEAUS[method]
        bound = geomjax.stability_interval(method)
        for h in hs:
            steps, per_save = _counts(t_final, h, saves)
            gains = _gains_at(problem, h, method, recommended[method], np.asarray(tunings[method].gains), check)
            args = (x0s, jnp.asarray(h), jnp.asarray(per_save), saves)
            xs, fs, worst, code = _fixed_runs(paper, tableau, jnp.asarray(gains), *args)
            inv, traj, failed = _measures(xs, fs, code, reference)
            ad_xs, ad_fs, ad_worst, ad_code = _adaptive_runs(paper, tableau, *args)
            ad_inv, ad_traj, ad_failed = _measures(ad_xs, ad_fs, ad_code, reference)
            lam = np.asarray(_rates(paper, jnp.asarray(gains), x0s[:n_held]))
            runs = {v: (inv[i], traj[i], failed[i], worst[i]) for i, v in enumerate(FIXED)}
            runs["adaptive"] = (ad_inv, ad_traj, ad_failed, ad_worst)
            for v, (vi, vt, vf, vw) in runs.items():
                point = _point(h, steps, COST_PER_STEP[method], vi[:n_held], vt[:n_held], vf[:n_held], vw[:n_held])
                if v in FIXED:
                    i = FIXED.index(v)
                    point["gains"] = gains[i]
                    point["stability_fraction_max"] = float(h * lam[i].max() / bound)
                if h == h0:
                    point["per_state_invariants"] = vi[:n_held]
                    training.setdefault(method, {})[v] = _aggregate(vi[n_held:], vf[n_held:])[0]
                curves[method][v].append(point)
            if h == h0:
                fractions[method] = {v: float(h * lam[i].max() / bound) for i, v in enumerate(FIXED)}
            _log(progress, f"{problem.key}: {method} at h = {h:.3g}")

    baseline = []
    for k in settings.baseline_exponents:
        h = h0 * 2.0**k
        steps, per_save = _counts(t_final, h, saves)
        xs, fs, worst, code = _step_runs(problem.baseline, paper, x0s, jnp.asarray(h), jnp.asarray(per_save), saves)
        inv, traj, failed = _measures(xs, fs, code, reference)
        baseline.append(_point(h, steps, COST_PER_STEP["baseline"], inv[:n_held], traj[:n_held], failed[:n_held],
                               worst[:n_held]))
    _log(progress, f"{problem.key}: {problem.baseline_name} at {len(baseline)} step sizes")

    # Held-out table at h0, and the training objective of the tuned gains against the one
    # tune_gains reports (the same objective, evaluated by the library).
    i0 = hs.index(h0)
    held_out = {"held_out": {}, "held_out_reference": {}}
    held_failed = {"held_out": {}, "held_out_reference": {}}
    cross_check = {}
    for method in settings.methods:
        for key in held_out:
            held_out[key][method], held_failed[key][method] = {}, {}
        for v in (*VARIANTS, "none"):
            point = curves[method][v][i0]
            held_out["held_out"][method][v] = point["invariants"]
            held_out["held_out_reference"][method][v] = point["trajectory"]
            held_failed["held_out"][method][v] = point["failed"]
            held_failed["held_out_reference"][method][v] = point["failed"]
        mine, lib = training[method]["tuned"], tunings[method].objective_after
        cross_check[method] = {
            "training_objective_here": mine,
            "TuningResult.objective_after": lib,
            "difference": None if mine is None else abs(mine - lib),
        }

    # Feedback Euler (the claim) and feedback RK4 against the baseline at matched force
    # evaluations.
    claim = {}
    for method in settings.methods:
        claim[method] = {}
        for v in (*VARIANTS, "none"):
            claim[method][v] = {}
            for quantity in ("invariants", "trajectory"):
                ratios = _matched(curves[method][v], baseline, quantity)
                claim[method][v][quantity] = {
                    "matched_points": ratios,
                    "at_most_baseline": sum(r["ratio"] <= 1.0 for r in ratios),
                    "of": len(ratios),
                }
    tuning = {
        m: {
            "initial_gains": r.initial_gains, "gains": r.gains, "objective_before": r.objective_before,
            "objective_after": r.objective_after, "stability_fraction_training": r.stability_fraction,
            "held_out_after": held_out["held_out"][m]["tuned"], "training_objective": training[m],
            "history": {k: np.asarray(val) for k, val in r.history.items()}, "time_s": tune_times[m],
            "summary": r.summary(),
        }
        for m, r in tunings.items()
    }
    return {
        "problem": problem,
        "t_final": t_final,
        "steps_h0": n0,
        "train": train,
        "held": held,
        "start_residual_max": start_residual,
        "check": {
            "feedback_rate_paper_max_train": check.feedback_rate, "dynamics_rate_max_train": check.dynamics_rate,
            "stability_interval_euler": geomjax.stability_interval("euler"),
            "stability_interval_rk4": geomjax.stability_interval("rk4"),
        },
        "recommended": recommended,
        "tunings": tunings,
        "tuning": tuning,
        "curves": curves,
        "baseline": baseline,
        "held_out": held_out,
        "held_failed": held_failed,
        "stability_fraction_h0": fractions,
        "cross_check": cross_check,
        "claim": claim,
        "time_s": time.perf_counter() - started,
    }


def _short(gains) -> str:
    g = np.asarray(gains, dtype=float)
    if g.size and np.allclose(g, g.flat[0]):
        return f"{g.flat[0]:.3g} (all)"
    return "(" + ", ".join(f"{x:.0f}" if abs(x) >= 100 else f"{x:.2g}" for x in g) + ")"


@register(
    NAME,
    "Feedback gains (paper, adaptive, rule of thumb, tuned with optax) on held-out starts for the "
    "spherical and double pendulums and Kepler, Euler and RK4; error vs h and vs force evaluations against "
    "RATTLE / Stormer-Verlet (Chang, Perlmutter and Vankerschaver (2022) Fig. 6 revisited)",
    quick={"settings": QUICK},
)
def run(out_dir: pathlib.Path, progress: bool, settings: Settings | None = None) -> dict:
    """Tune, evaluate on held-out states, sweep h; write the figures, return the metrics."""
    settings = settings or Settings()
    out_dir = pathlib.Path(out_dir)
    available = [k for k in settings.problems if k != "kepler" or hasattr(geomjax.models, "kepler")]
    skipped = [k for k in settings.problems if k not in available]
    studies = {}
    for key in available:
        studies[key] = _study(PROBLEMS[key](), settings, progress)

    methods = settings.methods
    held = {"held_out": {}, "held_out_reference": {}}
    failed = {"held_out": {}, "held_out_reference": {}}
    for key, s in studies.items():
        for obj in held:
            held[obj][key] = s["held_out"][obj]
            failed[obj][key] = s["held_failed"][obj]

    figures = []
    for key, s in studies.items():
        figures.append(_plot_history(out_dir / f"{NAME}_history_{key}.png", s["problem"], s["tunings"],
                                     s["held_out"]["held_out"]))
        curves = dict(s["curves"], t_final=s["t_final"])
        figures.append(_plot_errors(out_dir / f"{NAME}_errors_{key}.png", s["problem"], curves, s["baseline"], methods))
    if studies:
        titles = {key: s["problem"].title for key, s in studies.items()}
        figures.append(_plot_held_out(out_dir / f"{NAME}_held_out.png", held, failed, list(studies), titles, methods))

    summary = []
    for key, s in studies.items():
        for m in methods:
            for v in (*VARIANTS, "none"):
                point = s["curves"][m][v][[p["h"] for p in s["curves"][m][v]].index(s["problem"].h0)]
                summary.append({
                    "problem": key,
                    "method": m,
                    "gains": v,
                    "held-out inv": _fmt(point["invariants"], point["failed"]),
                    "held-out traj": _fmt(point["trajectory"], point["failed"]),
                    "failed": point["failed"],
                    "h*lam/beta": f"{point['stability_fraction_max']:.3g}" if "stability_fraction_max" in point else "-",
                    "inv/base": _ratio_cell(s["claim"][m][v]["invariants"]),
                    "traj/base": _ratio_cell(s["claim"][m][v]["trajectory"]),
                    "K": _short(point["gains"]) if "gains" in point else "alpha(x)*paper",
                })
        b = [p for p in s["baseline"] if p["h"] == s["problem"].h0][0]
        summary.append({
            "problem": key, "method": s["problem"].baseline_name, "gains": "-",
            "held-out inv": _fmt(b["invariants"], b["failed"]), "held-out traj": _fmt(b["trajectory"], b["failed"]),
            "failed": b["failed"], "h*lam/beta": "-", "inv/base": "-", "traj/base": "-", "K": "-",
        })

    setup = {
        "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in settings.__dict__.items()},
        "skipped_problems": skipped,
        "skipped_note": "kepler needs geomjax.models.kepler (not in this checkout)" if skipped else "",
        "problems": {
            key: {
                "notes": s["problem"].notes,
                "h0": s["problem"].h0,
                "t_final": s["t_final"],
                "steps_at_h0": s["steps_h0"],
                "saves": settings.saves,
                "paper_gains": s["problem"].paper_gains,
                "quantity_names": list(s["problem"].model.quantity_names),
                "baseline": s["problem"].baseline_name,
                "train_starts": s["train"],
                "held_out_starts": s["held"],
                "largest_constraint_residual_of_the_starts": s["start_residual_max"],
                "rates": s["check"],
                "time_s": s["time_s"],
            }
            for key, s in studies.items()
        },
        "objectives": "held_out: feedback_objective(objective='invariants') = mean over the held-out states of "
        "log10 RMS over the 10 saves (t > 0) of |F(x) - F(x0)|_2; held_out_reference: objective='reference' = "
        "mean of log10 RMS |x - x_ref|_2, x_ref = RK4 on X (no feedback) at h0/8. null = at least one held-out "
        "run failed (non-finite; feedback_objective returns inf); held_out_failed counts them",
        "variants": {
            "paper": "the fixed gains of the papers (pendulums: 50, Chang, Perlmutter and Vankerschaver (2022); Kepler: (0, 4, 4, 4, 2, 2, 2))",
            "adaptive": "Bae & Chang: Y = X - alpha(x) grad V, alpha = 1/(h 1.1 |Hess V|_F), V with the paper's "
            "gains (field.adaptive(dt=h)); derived for explicit Euler, run with RK4 as it is",
            "recommended": "geomjax.recommended_gains(paper field, training states, h, method)",
            "tuned": "geomjax.tune_gains(paper field, training states, dt=h0, gains='vector', objective='invariants', "
            "optax.adam(learning_rate), stability projection at settings.stability of the interval, checkpoint=False)",
            "none": "zero gains: the method on X without feedback (baseline)",
        },
        "h_dependence": "at h != h0: paper fixed; adaptive rebuilt with dt=h; recommended by the rule of thumb at h "
        "(Euler h lam_max = 1, RK4 lam_max = |DX|/10 within half the stability interval); tuned gains from h0 "
        "times rule(h)/rule(h0) (Euler: h0/h), not re-tuned",
        "cost_model": "force evaluations per run, Chang, Perlmutter and Vankerschaver (2022): feedback field 4, grad H 1; Euler 4/step, RK4 16/step, "
        "RATTLE and Stormer-Verlet 1/step; the adaptive field's Hessian of V is not counted",
        "error_measures": "per h: geometric mean over the held-out states (10**mean log10) of the RMS over the saves "
        "of |F - F0| (invariants) and |x - x_ref| (trajectory), the same reference for every h; "
        "max_invariant_error: largest |F - F0| after any step over the held-out runs",
        "device": str(jax.devices()[0]),
    }
    claim = {key: s["claim"] for key, s in studies.items()}
    return {
        "setup": setup,
        "held_out": held["held_out"],
        "held_out_failed": failed["held_out"],
        "held_out_reference": held["held_out_reference"],
        "held_out_reference_failed": failed["held_out_reference"],
        "training_objective_check": {key: s["cross_check"] for key, s in studies.items()},
        "stability_fraction_at_h0": {key: s["stability_fraction_h0"] for key, s in studies.items()},
        "recommended_gains": {key: s["recommended"] for key, s in studies.items()},
        "tuning": {key: s["tuning"] for key, s in studies.items()},
        "errors_vs_h": {key: {"feedback": s["curves"], "baseline": s["baseline"]} for key, s in studies.items()},
        "vs_baseline_per_force_evaluation": claim,
        "figures": [p.name for p in figures],
        "summary": summary,
    }


def _ratio_cell(entry):
    """The error ratio to the baseline at matched force evaluations: its range over the
    matched points, or "-" where none matched."""
    ratios = [r["ratio"] for r in entry["matched_points"]]
    if not ratios:
        return "-"
    return f"{min(ratios):.2g}..{max(ratios):.2g}"


def _fmt(value, n_failed):
    return f"{value:.3f}" if value is not None else f"failed ({n_failed})"
