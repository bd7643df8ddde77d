"""The `gain-tuning` experiment in its reduced mode (`gain_tuning.QUICK`: the spherical
pendulum, 3 training and 3 held-out starts, 2 optax iterations, t ∈ [0, 0.5]): the JSON
layout, the held-out numbers against `geomjax.feedback_objective` and the rule-of-thumb
gains against `geomjax.recommended_gains`."""

import json
import math

import numpy as np
import pytest

import geomjax
from geomjax.experiments import gain_tuning, reproduce
from geomjax.experiments._common import save_json

PROBLEM = "spherical_pendulum"

# The experiment's quick run takes 15-18 s; its library calls are tested by
# tests/test_gain_tuning.py in the default run: CI's extended job runs this module.
pytestmark = pytest.mark.extended


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    # The experiment's quick configuration (= gain_tuning.QUICK) through `reproduce`, whose
    # figure checks stand in for this experiment's case of tests/test_experiment_figures.py.
    out = tmp_path_factory.mktemp("gain-tuning")
    metrics = reproduce("gain-tuning", out, quick=True)
    assert metrics["quick"] is True
    return out, metrics


def test_its_figures_pass_the_readability_checks(quick):
    out, metrics = quick
    assert metrics["figure_problems"] == {}, metrics["figure_problems"]
    assert sorted(out.glob("*.png")), "no figure written"


def test_the_json_has_the_held_out_table_and_is_strict_json(quick):
    out, metrics = quick
    path = save_json(out / "gain-tuning.json", metrics)
    data = json.loads(path.read_text())  # allow_nan=False when written: no NaN or inf
    for key in ("held_out", "held_out_reference"):
        for method in ("euler", "rk4"):
            row = data[key][PROBLEM][method]
            assert set(row) == {"paper", "adaptive", "recommended", "tuned", "none"}
            failed = data[f"{key}_failed"][PROBLEM][method]
            for variant, value in row.items():
                assert (value is None) == (failed[variant] > 0)
                assert value is None or math.isfinite(value)
    assert data["setup"]["settings"]["train"] == 3 and data["setup"]["problems"][PROBLEM]["steps_at_h0"] == 500
    assert {row["problem"] for row in data["summary"]} == {PROBLEM}
    for name in data["figures"]:
        assert (out / name).stat().st_size > 0
    points = data["errors_vs_h"][PROBLEM]["feedback"]["euler"]["tuned"]
    assert [p["h"] for p in points] == pytest.approx([1e-3, 2e-3])
    assert data["training_objective_check"][PROBLEM]["euler"]["difference"] < 1e-9


def test_held_out_values_are_those_of_feedback_objective(quick):
    _, metrics = quick
    settings = gain_tuning.QUICK
    problem = gain_tuning.PROBLEMS[PROBLEM]()
    held = problem.starts(settings.held_out, settings.held_out_seed)
    h0 = problem.h0
    steps = int(round(problem.t_final * settings.horizon / h0))
    paper = geomjax.feedback_field(problem.model.system, problem.model.x0, problem.paper_gains)
    run = dict(dt=h0, steps=steps)
    value, _, failed = geomjax.feedback_objective(paper, held, method="rk4", **run)
    assert failed == 0 and value == pytest.approx(metrics["held_out"][PROBLEM]["rk4"]["paper"], abs=1e-9)
    value, _, _ = geomjax.feedback_objective(paper.adaptive(dt=h0), held, method="euler", **run)
    assert value == pytest.approx(metrics["held_out"][PROBLEM]["euler"]["adaptive"], abs=1e-9)
    value, _, _ = geomjax.feedback_objective(paper, held, method="euler", objective="reference", **run)
    assert value == pytest.approx(metrics["held_out_reference"][PROBLEM]["euler"]["paper"], abs=1e-9)


def test_rule_of_thumb_gains_are_those_of_recommended_gains():
    problem = gain_tuning.PROBLEMS[PROBLEM]()
    train = problem.starts(3, 1)
    paper = geomjax.feedback_field(problem.model.system, problem.model.x0, problem.paper_gains)
    check = geomjax.check_gains(paper, train, 2e-3, "euler", warn=False)
    for method in ("euler", "rk4"):
        for h in (1e-3, 4e-3):
            np.testing.assert_allclose(
                gain_tuning.recommended_gains(problem, check, h, method),
                geomjax.recommended_gains(paper, train, h, method), rtol=1e-12,
            )


def test_a_failed_run_is_null_with_a_count():
    xs = np.ones((2, 3, 4))  # 2 runs, 3 saves, n = 4
    xs[1, 2] = np.nan
    fs = np.ones((2, 3, 2))
    reference = np.zeros((2, 3, 4))
    inv, traj, failed = gain_tuning._measures(xs, fs, np.zeros(2, int), reference)
    assert failed.tolist() == [False, True]
    assert gain_tuning._aggregate(inv, failed) == (None, 1)
    assert gain_tuning._aggregate(traj[:1], failed[:1]) == (pytest.approx(math.log10(2.0)), 0)
