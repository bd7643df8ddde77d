"""What each column of the experiments' summary tables means.

`geomjax reproduce NAME` prints the summary table and, under it, one legend line per
column; the JSON stores the same legends under `"columns"`. A column is explained by its
exact name in `LEGENDS`, or by one of the `PATTERNS` (columns named after the quantity
they measure, such as `max |dH|`).
"""

import re
from collections.abc import Mapping, Sequence

LEGENDS: dict[str, str] = {
    # what ran, and how it ended
    "method": "the integrator (and its setting) of this row",
    "problem": "the system of this row",
    "alpha": "damping coefficient α of the row's run",
    "h": "step size",
    "h [s]": "step size, in seconds",
    "steps": "number of steps of the run",
    "runs": "number of runs (step sizes or tolerances) of this method",
    "cells": "number of (P, h) cells of the bifurcation grid",
    "status": "how the run ended: success, or the status and the step where it stopped",
    "default check": (
        "what the default monitoring (drift_tol = 1e-2) reports for this run: ok, or the status and step where a "
        "default run stops (comparison runs are made with drift_tol=None so their curves are complete); "
        "'-' where it was not replayed (the step-size sweeps replay it at one h per method)"
    ),
    "failed": "number of runs that failed (non-finite, or a failed Newton solve)",
    "unstable": "number of runs past the method's stability bound (non-finite or diverged)",
    # timing
    "m": "number of constraints (rods and pin rows)",
    "geomjax us/step": "µs per RATTLE step of geomjax's default (a block Cholesky or CG on the sparse G M⁻¹Gᵀ)",
    "best floor us/step": "µs per step of the fastest hand-written floor of this row",
    "best floor": "which hand-written floor was fastest (block-banded Cholesky, or Jacobi-CG with warm start)",
    "geomjax / floor": "geomjax's µs per step over the best floor's, measured in the same run",
    "dense us/step": "µs per step of geomjax with structured=False (dense Jacobians and LU); nan where not run",
    "compile [s]": "lower + XLA compile time of geomjax's scan of RATTLE steps",
    "memory [MB]": "temporary buffers of geomjax's compiled program, in MB",
    "max |dq| vs geomjax": "largest difference of the final positions between the methods of this row",
    "wall [s]": "wall time of the first call: tracing, XLA compilation and the run",
    "run [s]": "wall time of a second, already compiled call: the run alone",
    "ns/step": "run time per step, in nanoseconds",
    "wall@1e-6 (s)": "wall time of the cheapest run whose error is below 1e-6",
    "wall@1e-10 (s)": "wall time of the cheapest run whose error is below 1e-10",
    "budget@1e-6": "force evaluations of the cheapest run whose error is below 1e-6 (∇H costs 1, the feedback field 4)",
    "budget@1e-10": "force evaluations of the cheapest run whose error is below 1e-10",
    # errors
    "max err ref": "largest |x − x_ref| over the run, against a reference run at a small step",
    "max error": "largest constraint error |φ(q)| over the run (the paper's Table I measure)",
    "error at end": "constraint error |φ(q)| at the end of the run",
    "paper": "the paper's value of the same measure (Table I)",
    "ratio to paper": "measured / the paper's value",
    "min error": "smallest global error after one period over the step sizes run",
    "largest ok h": "largest step size whose run passed the default check",
    "order": "measured convergence order (least-squares slope of log error vs log h)",
    "order (T=10)": "measured convergence order of the phase-space error at t = 10",
    "max rel err vs leapfrog": "largest relative phase-space error against a leapfrog run at h/10",
    "max rel err vs exact": "largest relative phase-space error against the exact solution",
    "E(T)/E_exact(T)": "energy at the final time over the exact solution's energy then",
    "kappa fitted": (
        "leading coefficient κ of the method's damping-rate error, fitted from the energy decay: "
        "rate = α + κh + O(h²) (contact map: κ ≈ α²/2, forced DLA: κ ≈ −α²/2)"
    ),
    "max |phi|": "largest constraint error |φ(q)| over the run (0 on the exact flow)",
    "turns over top": "whether the pendulum goes over the top at some point of the run",
    # Foucault pendulum
    "max jump [deg]": "largest jump of the swing plane between two half swings, in degrees",
    "at t [s]": "time of that largest jump",
    "plane at T [deg]": "angle of the swing plane at the final time, in degrees",
    "max|q-q_exact| [m]": "largest distance to the exact solution, in metres",
    "P(jump>1deg)": "fraction of nearby step sizes whose run has a plane jump above 1 degree",
    "median jump [deg]": "median over nearby step sizes of the largest plane jump",
    # Ziegler column
    "crossings rod 1": "number of times rod 1 crosses the upright position",
    "crossings rod 2": "number of times rod 2 crosses the upright position",
    "mean theta1": "mean angle of rod 1 over the second half of the run (rad)",
    "mean theta2": "mean angle of rod 2 over the second half of the run (rad)",
    "wrong branch": "number of (P, h) cells where the method settles about another branch than the reference",
    "fraction wrong": "wrong branch / cells",
    # gain tuning
    "gains": "how the feedback gains were chosen: paper, adaptive, rule of thumb or tuned",
    "held-out inv": "log10 RMS invariant error |F − F₀| on the held-out initial states (lower is better)",
    "held-out traj": "log10 RMS trajectory error |x − x_ref| on the held-out initial states",
    "h*lam/beta": "h·λ_max(L∇²V) / (the method's stability bound): past 1 a run diverges",
    "inv/base": "invariant error over the baseline method's (RATTLE or Störmer–Verlet) at equal force evaluations",
    "traj/base": "trajectory error over the baseline method's at equal force evaluations",
    "K": "the gains used",
    # learning chain pendulums
    "model": "the learned model and the method it is trained and rolled out with",
    "train trajectories": "number of observed trajectories the model is trained on (cut into chunks of 5 observations)",
    "train chunks": "number of training chunks of 5 observations (the unit in which Finzi, Wang and Wilson (2020) count their training set)",
    "rollout error": (
        "geometric mean over the held-out trajectories and observation steps of the relative state error "
        "‖x̂ − x‖/‖x̂ + x‖ of the model's rollout (Finzi, Wang and Wilson's measure)"
    ),
    "ratio to neural ODE": "rollout error / the neural ODE's at the same training-set size (below 1: better)",
    "seeds": "number of training seeds (network initialisation and minibatches; the data stay) the rollout error is the geometric mean over",
    "lowest of seeds": "the lowest rollout error over the seeds",
    "highest of seeds": "the highest rollout error over the seeds",
    "perturbation floor": "rollout error of the true system itself from the held-out starts moved by 1e-4 (what a perfect model scores from starts known to that accuracy)",
    "long max |phi|": "largest constraint violation |g(q)| over the long rollouts from the held-out starts",
    "long max |dH_theta|": (
        "largest change of the model's own learned energy |H_θ(x_t) − H_θ(x_0)| over the long rollouts "
        "(nan for the neural ODE, which has no energy)"
    ),
    "final loss": "mean training loss (mean absolute error of the chunk rollouts) of the last epoch",
    "train [s]": "wall time of the training, compilation included",
}

PATTERNS: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"^max ?\|d(.+)\|$"), "largest |{0}(t) − {0}(0)| over the run (a quantity the flow conserves)"),
    (re.compile(r"^max ?\|(J\d?)\|$"), "largest |{0}| over the run ({0}: the constraint, 0 on the exact flow)"),
)


def legend(column: str) -> str | None:
    """The explanation of a summary-table column, or None if it has none."""
    if column in LEGENDS:
        return LEGENDS[column]
    for pattern, text in PATTERNS:
        match = pattern.match(column)
        if match:
            return text.format(*match.groups())
    return None


def columns_of(rows: Sequence[Mapping]) -> list[str]:
    """Every column of a table's rows, in first-seen order."""
    names: list[str] = []
    for row in rows:
        names += [k for k in row if k not in names]
    return names


def missing_legends(rows: Sequence[Mapping]) -> list[str]:
    """The columns of `rows` without a legend."""
    return [c for c in columns_of(rows) if legend(c) is None]


def legends(rows: Sequence[Mapping]) -> dict[str, str]:
    """Column -> legend for the columns of `rows` that have one."""
    return {c: text for c in columns_of(rows) if (text := legend(c)) is not None}


def format_legend(rows: Sequence[Mapping]) -> str:
    """One line per column, `name: meaning`, to print under the table."""
    found = legends(rows)
    width = max((len(c) for c in found), default=0)
    return "\n".join(f"  {c.ljust(width)}  {text}" for c, text in found.items())
