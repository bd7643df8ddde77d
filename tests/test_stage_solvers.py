"""Stage solves of implicit Runge–Kutta steps: fixed-point iteration, Newton, and "auto".

Checks: the three solvers give the same steps to round-off on every tableau; the
fixed-point iteration keeps symplecticity and the quadratic invariants of the Dirac field
at round-off; a stiff step (h·gain large) does not contract, where "fixed_point" reports
`newton_failed` and "auto" falls back to Newton and converges to Newton's answer; where
both fail, "auto" reports `newton_failed` at Newton's step, also as one member of a
`vmap`; gradients are those of the implicit function theorem whatever the solver.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _holonomic_cases import DIRAC, FIELD_HH, SPHERE, X0, X0_HH

import geomjax
from geomjax import diagnostics
from geomjax._solve.fixed_point import FixedPoint

R = geomjax.RESULTS
PENDULUM = geomjax.models.spherical_pendulum()
TABLEAUX = {"gauss2": geomjax.GAUSS2, "gauss4": geomjax.GAUSS4, "gauss6": geomjax.GAUSS6, "trapezoidal": geomjax.TRAPEZOIDAL}


def _run(field, x0, tableau, solver, **kw):
    step = geomjax.implicit_rk(field, tableau, solver=solver)
    return geomjax.integrate(step, x0, throw=False, **kw)


@pytest.mark.parametrize(
    "name", ["gauss4", "trapezoidal", *[pytest.param(n, marks=pytest.mark.extended) for n in ("gauss2", "gauss6")]]
)
def test_the_solvers_agree_to_round_off(name):
    kw = dict(dt=0.05, steps=40, save_every=10)
    # ("auto" equals "fixed_point" where the iteration contracts: the stiff test below)
    runs = {s: _run(DIRAC, X0, TABLEAUX[name], s, **kw) for s in ("fixed_point", "newton")}
    for solver, sol in runs.items():
        assert int(sol.status) == 0, solver
    np.testing.assert_allclose(runs["fixed_point"].xs, runs["newton"].xs, rtol=0, atol=1e-13)


def test_the_fixed_point_keeps_symplecticity_and_quadratic_invariants():
    step = geomjax.implicit_rk(FIELD_HH, geomjax.GAUSS4, solver="fixed_point")
    assert float(diagnostics.symplecticity_defect(step, X0_HH, 0.3)) < 1e-13
    sol = _run(DIRAC, X0, geomjax.GAUSS4, "fixed_point", dt=0.1, steps=100, save_every=10)
    err = np.asarray(diagnostics.invariant_errors(SPHERE.system, sol.xs))
    assert err[:, [0, 1, 3]].max() < 1e-13, err.max(axis=0)


def _feedback(gain):
    return geomjax.feedback_field(PENDULUM.system, PENDULUM.x0, gains=gain)


def test_a_stiff_step_falls_back_to_newton_and_both_failing_is_reported():
    def member(gain, solver, scale=1.0, dt=0.01):
        x0 = PENDULUM.x0.at[3:].multiply(scale)
        # (no drift check: a slow member must not stop on drift when its neighbour fails)
        return _run(_feedback(gain), x0, geomjax.GAUSS2, solver, dt=dt, steps=4, save_every=2, drift_tol=None)

    # h·gain = 100: the iteration does not contract, Newton converges; gain 1e7, h = 0.05
    # and a fast start: neither converges. Run as members of one vmap per solver.
    gains, scales, dts = jnp.array([1e4, 1e7, 0.1]), jnp.array([1.0, 5.0, 5.0]), jnp.array([0.01, 0.05, 0.05])
    runs = {s: jax.jit(jax.vmap(lambda g, c, h: member(g, s, c, h)))(gains, scales, dts) for s in ("fixed_point", "auto", "newton")}
    failed = int(R.newton_failed._value)
    np.testing.assert_array_equal(runs["fixed_point"].status, [failed, failed, 0])
    np.testing.assert_array_equal(runs["fixed_point"].failed_step[:2], [1, 1])
    np.testing.assert_array_equal(runs["newton"].status, [0, failed, 0])
    for name in ("status", "failed_step"):
        np.testing.assert_array_equal(getattr(runs["auto"], name), getattr(runs["newton"], name), err_msg=name)
    np.testing.assert_allclose(runs["auto"].xs[0], runs["newton"].xs[0], rtol=0, atol=1e-12)  # Newton's answer
    np.testing.assert_array_equal(runs["auto"].xs[2], runs["fixed_point"].xs[2])  # the fixed point's


# (jax.jit(jax.grad) through "auto" at save_every 1 and 3 against central differences, with
# the parameter closed over: tests/test_closures.py, dirac_midpoint and dirac_midpoint_every_step)
@pytest.mark.extended
def test_gradients_are_the_implicit_function_theorems_whatever_the_solver():
    @jax.jit
    def grads(scale):
        def loss(scale, solver, save_every):
            # the momentum scaled off the field's energy target: the feedback acts
            x0 = PENDULUM.x0.at[3:].multiply(scale)
            sol = _run(_feedback(2.0), x0, geomjax.GAUSS2, solver, dt=0.05, steps=6, save_every=save_every)
            return jnp.sum(sol.xs[-1] ** 2)

        # save_every=1: the run goes with the fixed point and is redone with the fallback
        # where it failed (the driver's `_fast_variant_then_step`); 3: per save block
        return [jax.grad(loss)(scale, s, k) for s, k in (("auto", 1), ("auto", 3), ("newton", 3))]

    auto, auto_blocks, newton = grads(1.2)
    np.testing.assert_allclose(auto_blocks, newton, rtol=1e-10)
    # (Newton's implicit-function gradients against finite differences: tests/test_implicit_rk.py)
    np.testing.assert_allclose(auto, newton, rtol=1e-10)
    assert abs(float(newton)) > 1e-3


def test_bad_settings_and_the_module_example():
    import doctest

    from geomjax._solve import fixed_point

    with pytest.raises(ValueError, match="solver"):
        geomjax.implicit_rk(DIRAC, geomjax.GAUSS4, solver="picard")
    with pytest.raises(ValueError, match="rtol"):
        FixedPoint(rtol=-1.0)
    with pytest.raises(ValueError, match="max_steps"):
        FixedPoint(max_steps=0)
    result = doctest.testmod(fixed_point)
    assert result.attempted > 0 and result.failed == 0
