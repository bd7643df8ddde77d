"""The Ziegler column of Salnikov & Hamdouni §IV B, Figs. 4–7, and a sweep of the load (beyond the paper).

Paper: V. Salnikov and A. Hamdouni, "From modelling of systems with constraints to
generalized geometry and back to numerics", ZAMM – Journal of Applied Mathematics and
Mechanics 99 (2019) e201800218 (arXiv:1807.06652) — `PAPER`.

System (`geomjax.models.ziegler_column`): n rods (n = 2 here) from a fixed base, point
masses m at the joints and the tip, restoring joint springs k/2 θ₁² + k/2 Σ(θ_i − θ_{i−1})²
(the paper prints +k/2 θ², a sign slip, see the model), a load P on every joint, rods of
length ℓ; θ_i = atan2 of rod i from the upward vertical, released from rest. For n = 2 and
equal k, ℓ the upright column buckles at Pℓ/k = 1 − 1/√2 ≈ 0.293; above it the column
oscillates about a buckled equilibrium, to the left or the right.

**ziegler-column** (Figs. 4–7): Dirac-1, Dirac-2 in two readings, and the trapezium rule
(on the index-reduced field) at one step h, and a converged reference: RK4 on the
index-reduced field at h/20 (its distance to RK4 at h/10 is recorded). The parameters
(searched by hand over P ∈ {0.5, 1}, θ(0) ∈ {(0.1, 0), (0.6, 0)}, h = 0.05): k = 1, P = 0.5,
ℓ = 1, m = 1, θ(0) = (0.6, 0), h = 0.05, t ≤ 200.

The paper's eq. (7) is ambiguous about where Dirac-2's centred difference enters
(`geomjax.dirac2`'s docstring writes out both readings):

- "dirac2", the literal reading (q̃ = (q_{k+1} − q_{k−1})/2h everywhere): a two-step
  recurrence with a spurious root z ≈ −1 − h²ω²/2 outside the unit circle. Its fast
  sign-alternating oscillation grows and, from t ≈ 170, the upper rod swings over the
  top of its spring and about the downward vertical — the artefact the paper's Figs. 5–6
  show for Dirac-1, while its Dirac-2 bounces back;
- "dirac2_centred", the centred-constraint reading (Dirac-1's momentum equations,
  constraint α(q_k)·(q_{k+1} − q_{k−1}) = 0, a reconstruction): no turns, and it settles
  about the reference's buckled state, as the paper's Dirac-2 does.

Dirac-1 oscillates about a different buckled state (more bent: its rods lengthen, which
shifts the balance of load and springs — the paper's Fig. 7), the trapezium about the
reference's. The run's `findings` state the measured numbers. Passages through the
downward vertical are counted as jumps of an angle by more than π between saved states;
the equilibrium as the mean angles over the second half; the constraint error as
max |φ_i| over the saved states.

**ziegler-bifurcation** (beyond the paper): for each method and h ∈ BIF_STEPS, a vmapped
sweep over P ∈ BIF_LOADS (one compilation per method and h) from θ(0) = (0.6, 0), t ≤ 100;
each run is classified by the branch it settles about — "upright" (|mean θ₁| < 0.05 over
the second half), "right"/"left" (the sign of mean θ₁), or "turned" (a full turn of a rod),
"failed" (non-finite: a blow-up or a Newton failure) — and marked wrong where a finite
run's label differs from the reference's (RK4 at h = 0.0025); failed runs are counted
apart.
"""

import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

import geomjax

from . import _dirac_methods as dm
from . import register
from ._common import _figure, _save

COLUMN = {"n": 2, "k": 1.0, "P": 0.5, "length": 1.0, "m": 1.0, "angles": (0.6, 0.0), "h": 0.05, "t_final": 200.0}
PAPER = ('V. Salnikov and A. Hamdouni, "From modelling of systems with constraints to generalized geometry and '
         'back to numerics", ZAMM - Journal of Applied Mathematics and Mechanics 99 (2019) e201800218, arXiv:1807.06652')
COLUMN_METHODS = ("dirac1", "dirac2", "dirac2_centred", "trapezium")
LABELS = {"dirac2": "Dirac-2 literal", "dirac2_centred": "Dirac-2 centred"}
REFERENCE_REFINE = 20
SAVE_DT = 0.25
BIF_LOADS = tuple(np.round(np.linspace(0.2, 0.8, 13), 3))
BIF_STEPS = (0.025, 0.05, 0.1)
BIF_METHODS = ("dirac1", "dirac2", "dirac2_centred", "trapezium", "rk4")
BIF_REFERENCE_H = 0.0025
BIF_T = 100.0
UPRIGHT_TOL = 0.05


def _column(P=None, **overrides):
    c = {**COLUMN, **overrides}
    return geomjax.models.ziegler_column(c["n"], k=c["k"], P=c["P"] if P is None else P, lengths=c["length"],
                                         m=c["m"], angles=jnp.asarray(c["angles"], jnp.float64))


def _angles(xs, n):
    return np.asarray(geomjax.models.column_angles(jnp.asarray(xs)[:, : 2 * n]))


def _turns(angles):
    """Passages of each rod through the downward vertical (full turns): jumps of an angle by more than π between saved states."""
    return np.sum(np.abs(np.diff(angles, axis=0)) > np.pi, axis=0)


def _run(name, model, h, t_final, save_dt=SAVE_DT):
    steps = int(round(t_final / h))
    save_every = max(1, int(round(save_dt / h)))
    while steps % save_every:
        save_every -= 1
    xs = dm.RUNS[name](model, model.x0, h, steps, save_every)
    return np.asarray(xs), h * save_every


@register("ziegler-column", "Salnikov & Hamdouni (ZAMM 2019) sec. IV B, Figs. 4-7: Ziegler column (n = 2), angles "
                            "by Dirac-1, Dirac-2 (literal and centred-constraint readings), trapezium and a converged "
                            "reference; full turns and different equilibria",
          options=("dt", "t_final"), quick={"t_final": 2.0, "check_reference": False})
def run_column(out_dir: pathlib.Path, progress: bool, t_final=None, h=None, methods=COLUMN_METHODS,
               check_reference=True, dt=None) -> dict:
    """`h` (or `dt`, the `--dt` option) and `t_final` override the step and the horizon."""
    out_dir = pathlib.Path(out_dir)
    t_final = COLUMN["t_final"] if t_final is None else t_final
    h = COLUMN["h"] if h is None and dt is None else (h if dt is None else dt)
    n = COLUMN["n"]
    model = _column()
    curves, metrics, times, phi = {}, {}, {}, {}
    constraint_error = jax.jit(jax.vmap(lambda x: jnp.max(jnp.abs(model.holonomic(x[: 2 * n])))))
    for name in methods:
        t0 = time.perf_counter()
        xs, dt = _run(name, model, h, t_final)
        times[name] = time.perf_counter() - t0
        curves[name] = (np.arange(xs.shape[0]) * dt, _angles(xs, n))
        phi[name] = float(np.max(np.asarray(constraint_error(jnp.asarray(xs)))))
    t0 = time.perf_counter()
    xs, dt = _run("rk4", model, h / REFERENCE_REFINE, t_final)
    times["reference"] = time.perf_counter() - t0
    curves["reference"] = (np.arange(xs.shape[0]) * dt, _angles(xs, n))
    phi["reference"] = float(np.max(np.asarray(constraint_error(jnp.asarray(xs)))))
    reference_spread = float("nan")
    if check_reference:
        check, _ = _run("rk4", model, h / (REFERENCE_REFINE // 2), t_final)
        reference_spread = float(np.max(np.abs(_angles(check, n) - curves["reference"][1])))

    for name, (ts, a) in curves.items():
        half = a[a.shape[0] // 2:]
        finite = bool(np.all(np.isfinite(a)))
        crossings = np.nonzero(np.any(np.abs(np.diff(a, axis=0)) > np.pi, axis=1))[0] if finite else []
        metrics[name] = {
            "downward_crossings_per_rod": _turns(a) if finite else "non-finite",
            "first_crossing_t": float(ts[crossings[0] + 1]) if len(crossings) else None,
            "max_constraint_error": phi[name],
            "mean_angles_second_half": np.mean(half, axis=0) if finite else "non-finite",
            "max_abs_angle": np.max(np.abs(a), axis=0) if finite else "non-finite",
            "wall_s": times[name],
        }
    title = (f"Ziegler column n = {n}: k = {COLUMN['k']:g}, P = {COLUMN['P']:g}, l = {COLUMN['length']:g}, "
             f"m = {COLUMN['m']:g}, theta(0) = {COLUMN['angles']}, h = {h:g}")
    figures = []
    pairs = [("fig4", "dirac1", "trapezium"), ("fig5", "dirac2", "dirac1"), ("fig5", "dirac2_centred", "dirac1"),
             ("readings", "dirac2", "dirac2_centred"), ("ref", "reference", "dirac2")]
    for tag, left, right in pairs:
        if left not in curves or right not in curves:
            continue
        fig, axes = _figure(1, 2, size=(11.0, 4.0), sharex=False)
        for ax, name in zip(axes[0], (left, right)):
            ts, a = curves[name]
            for i in range(n):
                ax.plot(ts, a[:, i], linewidth=0.8, label=rf"$\theta_{i + 1}$")
            ts_r, a_r = curves["reference"]
            if name != "reference":
                for i in range(n):
                    # a wide translucent band: a method on the reference stays visible on top of it
                    ax.plot(ts_r, a_r[:, i], linewidth=3.0, color="k", alpha=0.2,
                            label="reference" if i == 0 else None, zorder=1)
            ax.set_title(f"{LABELS.get(name, name)}: downward crossings {metrics[name]['downward_crossings_per_rod']}")
            ax.set_xlabel("t")
            ax.set_ylabel("angle from the upward vertical")
            ax.set_ylim(-3.3, 3.3)
            ax.grid(True, alpha=0.3)
        # One legend beside the panels (inside, it hid part of the curves).
        fig.legend(*axes[0, 1].get_legend_handles_labels(), loc="outside right upper", fontsize="small")
        fig.suptitle(title)
        figures.append(_save(fig, out_dir / f"ziegler-column_{tag}_{left}_vs_{right}.png"))

    summary = [
        {
            "method": name,
            "crossings rod 1": int(m["downward_crossings_per_rod"][0]) if not isinstance(m["downward_crossings_per_rod"], str) else -1,
            "crossings rod 2": int(m["downward_crossings_per_rod"][1]) if not isinstance(m["downward_crossings_per_rod"], str) else -1,
            "mean theta1": float(m["mean_angles_second_half"][0]) if not isinstance(m["mean_angles_second_half"], str) else float("nan"),
            "mean theta2": float(m["mean_angles_second_half"][1]) if not isinstance(m["mean_angles_second_half"], str) else float("nan"),
            "max |phi|": m["max_constraint_error"],
            "run [s]": m["wall_s"],
        }
        for name, m in metrics.items()
    ]
    return {
        "paper": PAPER,
        "parameters": {**COLUMN, "h": h, "t_final": t_final, "reference": f"RK4 on the index-reduced field, h/{REFERENCE_REFINE}",
                       "reference_max_angle_change_vs_h_over_10": reference_spread,
                       "spring_sign": "restoring (-k/2 theta^2 in L); the paper prints +k/2 theta^2"},
        "readings": {"dirac2": "literal reading of eq. (7): q~ = (q_{k+1} - q_{k-1})/2h in every line",
                     "dirac2_centred": "centred-constraint reading (a reconstruction): Dirac-1's momentum equations, "
                                       "constraint alpha(q_k).(q_{k+1} - q_{k-1}) = 0"},
        "findings": _findings(metrics, t_final),
        "methods": metrics,
        "figures": [p.name for p in figures],
        "summary": summary,
    }


def _findings(metrics, t_final):
    """Plain statements of what the run measured about the two readings of Dirac-2."""

    def means(name):
        m = metrics[name]["mean_angles_second_half"]
        return "non-finite" if isinstance(m, str) else "(" + ", ".join(f"{v:.3f}" for v in m) + ")"

    def turns(name):
        m = metrics[name]
        c = m["downward_crossings_per_rod"]
        if isinstance(c, str):
            return "does not finish (non-finite)"
        if m["first_crossing_t"] is None:
            return f"makes no full turn up to t = {t_final:g}"
        return f"turns over (crossings of the downward vertical per rod {[int(v) for v in c]}, the first at t = {m['first_crossing_t']:g})"

    out = [f"Paper: {PAPER}. Its Figs. 5-6 show Dirac-2 bouncing back where Dirac-1 makes a full turn."]
    ref = f"the reference's {means('reference')}" if "reference" in metrics else "no reference"
    if "dirac2" in metrics:
        out.append(f"Dirac-2, literal reading of eq. (7) (geomjax.dirac2 default): {turns('dirac2')}; late mean angles "
                   f"{means('dirac2')} vs {ref}; max |phi| = {metrics['dirac2']['max_constraint_error']:.3g}."
                   + (" Where the paper's Dirac-2 does not turn over, this reading does." if metrics["dirac2"]["first_crossing_t"] is not None else ""))
    if "dirac2_centred" in metrics:
        m = metrics["dirac2_centred"]
        agrees = (m["first_crossing_t"] is None and not isinstance(m["mean_angles_second_half"], str) and "reference" in metrics
                  and np.max(np.abs(np.asarray(m["mean_angles_second_half"]) - np.asarray(metrics["reference"]["mean_angles_second_half"]))) < 0.05)
        out.append(f"Dirac-2, centred-constraint reading (a reconstruction): {turns('dirac2_centred')}; late mean angles "
                   f"{means('dirac2_centred')} vs {ref}; max |phi| = {m['max_constraint_error']:.3g}."
                   + (" It behaves as the paper's Dirac-2 in Figs. 5-6 (no turn, the reference's equilibrium)." if agrees else ""))
    if "dirac1" in metrics:
        out.append(f"Dirac-1: {turns('dirac1')}; late mean angles {means('dirac1')}; "
                   f"max |phi| = {metrics['dirac1']['max_constraint_error']:.3g}.")
    return out


def _label(angles):
    """Branch label of a run from its saved angles (T, n): see the module docstring."""
    if not np.all(np.isfinite(angles)):
        return "failed"
    if np.any(_turns(angles) > 0):
        return "turned"
    mean = float(np.mean(angles[angles.shape[0] // 2:, 0]))
    if abs(mean) < UPRIGHT_TOL:
        return "upright"
    return "right" if mean > 0 else "left"


def _sweep(name, loads, h, t_final):
    models = jax.tree.map(lambda *leaves: jnp.stack(leaves), *[_column(P=float(P)) for P in loads])
    steps = int(round(t_final / h))
    save_every = max(1, int(round(SAVE_DT / h)))
    while steps % save_every:
        save_every -= 1

    def one(model):
        return dm.RUNS[name](model, model.x0, h, steps, save_every)

    xs = np.asarray(jax.jit(jax.vmap(one))(models))
    return [_label(_angles(x, COLUMN["n"])) for x in xs]


_MARKERS = {"right": ("tab:blue", ">"), "left": ("tab:orange", "<"), "upright": ("tab:green", "^"),
            "turned": ("tab:red", "o"), "failed": ("k", "x")}


@register("ziegler-bifurcation", "Beyond Salnikov & Hamdouni (ZAMM 2019): Ziegler column, vmapped sweep over the load P and h; which "
                                 "equilibrium each method settles about vs a converged reference",
          options=("t_final",), quick={"loads": (0.2, 0.5), "steps": (0.1,), "t_final": 4.0})
def run_bifurcation(out_dir: pathlib.Path, progress: bool, loads=BIF_LOADS, steps=BIF_STEPS, t_final=BIF_T,
                    methods=BIF_METHODS) -> dict:
    out_dir = pathlib.Path(out_dir)
    t0 = time.perf_counter()
    reference = _sweep("rk4", loads, BIF_REFERENCE_H, t_final)
    times = {"reference": time.perf_counter() - t0}
    labels, wrong, failed = {}, {}, {}
    for name in methods:
        t0 = time.perf_counter()
        labels[name] = {}
        for h in steps:
            labels[name][h] = _sweep(name, loads, h, t_final)
            if progress:
                print(f"  {name} h={h}: {labels[name][h]}", flush=True)
        times[name] = time.perf_counter() - t0
        wrong[name] = [(float(P), float(h)) for h in steps for P, a, b in zip(loads, labels[name][h], reference)
                       if a != b and a != "failed"]
        failed[name] = [(float(P), float(h)) for h in steps for P, a in zip(loads, labels[name][h]) if a == "failed"]

    fig, axes = _figure(1, len(methods), size=(3.6 * len(methods), 3.8), sharex=False)
    for ax, name in zip(axes[0], methods):
        for j, h in enumerate(steps):
            for P, lab, ref in zip(loads, labels[name][h], reference):
                colour, marker = _MARKERS[lab]
                ax.scatter([P], [j], color=colour, marker=marker, s=36)
                if lab != ref and lab != "failed":
                    ax.scatter([P], [j], facecolors="none", edgecolors="k", s=140, linewidths=1.2)
        ax.set_yticks(range(len(steps)), [f"{h:g}" for h in steps])
        ax.set_xlabel("load P")
        ax.set_title(f"{name}: {len(wrong[name])} wrong, {len(failed[name])} failed")
        ax.grid(True, alpha=0.3)
    axes[0, 0].set_ylabel("h")
    handles = [axes[0, 0].scatter([], [], color=c, marker=mk, label=lab) for lab, (c, mk) in _MARKERS.items()]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize="small")
    fig.suptitle(f"Branch per (P, h), circled where a finite run differs from the reference (RK4, h = {BIF_REFERENCE_H}); "
                 f"k = {COLUMN['k']:g}, l = {COLUMN['length']:g}, theta(0) = {COLUMN['angles']}, t <= {t_final:g}")
    figure = _save(fig, out_dir / "ziegler-bifurcation_map.png")

    cells = len(loads) * len(steps)
    summary = [{"method": name, "wrong branch": len(wrong[name]), "failed": len(failed[name]), "cells": cells,
                "fraction wrong": len(wrong[name]) / cells, "run [s]": times[name]} for name in methods]
    return {
        "parameters": {**COLUMN, "loads": list(loads), "steps": list(steps), "t_final": t_final,
                       "reference": f"RK4 on the index-reduced field, h = {BIF_REFERENCE_H}",
                       "classification": "turned (a rod made a full turn), failed (non-finite), else by the mean of "
                                         f"theta1 over the second half: upright if |mean| < {UPRIGHT_TOL}, right/left by its sign"},
        "reference_labels": dict(zip([float(P) for P in loads], reference)),
        "labels": {name: {str(h): lab for h, lab in per.items()} for name, per in labels.items()},
        "fraction_wrong": {name: len(wrong[name]) / cells for name in methods},
        "fraction_failed": {name: len(failed[name]) / cells for name in methods},
        "wrong_cells": wrong,
        "failed_cells": failed,
        "wrong_means": "a finite run settling about another branch than the reference (failed runs counted apart)",
        "paper": PAPER,
        "findings": [f"{LABELS.get(name, name)}: {len(wrong[name])} of {cells} (P, h) cells on another branch than the "
                     f"reference, {len(failed[name])} failed" for name in methods],
        "figures": [figure.name],
        "summary": summary,
    }
