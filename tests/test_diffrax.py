"""diffrax both ways: diffrax solvers through `geomjax.integrate`, geomjax steps inside
`diffrax.diffeqsolve` through `geomjax.StepSolver`, and users' own step functions."""

import diffrax
import geomjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from geomjax._step.base import AbstractStep


@pytest.fixture(scope="module")
def setup():
    model = geomjax.models.spherical_pendulum()
    dirac = geomjax.dirac_field(model.system)
    feedback = geomjax.feedback_field(model.system, model.x0, gains=50.0)
    return model, dirac, feedback


@pytest.fixture(scope="module")
def rk4_reference(setup):
    """States at t = 0, 0.1, ..., 1 from RK4 with h = 1e-3 (error ≈ 1e-14)."""
    model, dirac, _ = setup
    return np.asarray(geomjax.integrate(dirac, model.x0, dt=1e-3, steps=1000, method="rk4", save_every=100).xs)


def test_adaptive_dopri8_agrees_with_small_step_rk4(setup, rk4_reference):
    model, dirac, _ = setup
    sol = geomjax.integrate(dirac, model.x0, dt=0.1, steps=10, method=diffrax.Dopri8(), rtol=1e-10, atol=1e-12)
    assert bool(sol.ok), sol.message
    assert sol.xs.shape == (11, 6)
    np.testing.assert_allclose(sol.ts, np.linspace(0.0, 1.0, 11), atol=1e-15)
    np.testing.assert_allclose(sol.xs, rk4_reference, atol=1e-9)
    # The solver chose its own steps (adaptive), not the 10 save intervals.
    assert int(sol.num_steps) > 0


def test_end_time_and_saves_give_the_same_run_with_step_statistics(setup, rk4_reference):
    """`t1=`/`saves=` with a diffrax solver: the run over [t0, t1] saved at equal intervals,
    the same as the `dt`/`steps` form with the same first step; `stats` counts the steps."""
    model, dirac, _ = setup
    kw = dict(method=diffrax.Dopri8(), rtol=1e-10, atol=1e-12)
    by_end = geomjax.integrate(dirac, model.x0, t1=1.0, saves=10, dt=0.1, **kw)
    by_steps = geomjax.integrate(dirac, model.x0, dt=0.1, steps=10, **kw)
    np.testing.assert_allclose(by_end.ts, np.linspace(0.0, 1.0, 11), atol=1e-15)
    np.testing.assert_array_equal(np.asarray(by_end.xs), np.asarray(by_steps.xs))
    stats = by_end.stats
    assert int(stats["num_accepted_steps"]) + int(stats["num_rejected_steps"]) == int(stats["num_steps"]) > 0
    # no first step given: diffrax chooses it; the saves are the same up to the tolerance
    auto = geomjax.integrate(dirac, model.x0, t1=1.0, saves=10, **kw)
    np.testing.assert_allclose(np.asarray(auto.xs), rk4_reference, atol=1e-9)
    # constant steps of dt to t1: the same run as dt/steps, saved at the t1 grid
    constant = geomjax.integrate(dirac, model.x0, t1=1.0, saves=4, dt=0.01, method=diffrax.Tsit5())
    by_count = geomjax.integrate(dirac, model.x0, dt=0.01, steps=100, save_every=25, method=diffrax.Tsit5())
    assert constant.message == "success" and int(constant.stats["num_steps"]) == 100
    np.testing.assert_allclose(np.asarray(constant.xs), np.asarray(by_count.xs), rtol=0, atol=1e-13)
    # a fixed-step run counts its steps too
    assert int(geomjax.integrate(dirac, model.x0, dt=0.1, steps=10, method="rk4").stats["num_steps"]) == 10


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(t1=1.0, method="rk4", dt=0.1), "t1= and saves= are for diffrax solvers"),
        (dict(t1=1.0, steps=10, dt=0.1), "not both"),
        (dict(saves=10, dt=0.1), "saves= goes with t1="),
        (dict(t1=1.0, save_every=2, dt=0.1), "not save_every="),
        (dict(t1=-1.0, dt=0.1, rtol=1e-6), "after t0"),
        (dict(t1=1.0), "give dt="),
        (dict(t1=1.0, dt=-0.1, rtol=1e-6), "must be > 0"),
        (dict(method="rk4"), "integrate needs dt= and steps="),
    ],
)
def test_end_time_misuse_is_refused_in_words(setup, kwargs, match):
    model, dirac, _ = setup
    if ("t1" in kwargs or "saves" in kwargs) and "method" not in kwargs:
        kwargs = dict(method=diffrax.Tsit5(), **kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        geomjax.integrate(dirac, model.x0, **kwargs)


def test_tolerances_may_be_traced(setup, rk4_reference):
    """rtol/atol as tracers (a tolerance sweep under jit or vmap) run, and equal the eager run."""
    model, dirac, _ = setup

    def run(tol):
        sol = geomjax.integrate(dirac, model.x0, dt=0.1, steps=10, method=diffrax.Dopri8(), rtol=tol, atol=tol,
                                throw=False)
        return sol.xs[-1], sol.ok

    tols = jnp.array([1e-6, 1e-10])
    xs, ok = jax.jit(jax.vmap(run))(tols)
    assert bool(jnp.all(ok))
    np.testing.assert_allclose(xs[1], rk4_reference[-1], atol=1e-9)
    np.testing.assert_allclose(xs[0], run(1e-6)[0], rtol=1e-12, atol=1e-14)


def test_constant_step_diffrax_euler_equals_geomjax_euler(setup):
    """Without tolerances the diffrax path takes fixed steps: diffrax.Euler() is geomjax's "euler"."""
    model, _, feedback = setup
    kw = dict(dt=2e-3, steps=100, save_every=10)  # h·λ_max < 2 for k = 50
    ours = geomjax.integrate(feedback, model.x0, method="euler", **kw)
    theirs = geomjax.integrate(feedback, model.x0, method=diffrax.Euler(), **kw)
    assert bool(theirs.ok)
    assert int(theirs.num_steps) == 100
    np.testing.assert_allclose(theirs.xs, ours.xs, rtol=1e-12, atol=1e-13)


def test_diffrax_failure_is_reported(setup):
    """An adaptive solve that runs out of max_steps is a failure with a status, not silent output."""
    model, dirac, _ = setup
    with pytest.raises(geomjax.IntegrationError, match="diffrax") as info:
        geomjax.integrate(dirac, model.x0, dt=0.1, steps=10, method=diffrax.Dopri8(), rtol=1e-12, atol=1e-14, max_steps=3)
    assert int(info.value.solution.status) != 0
    sol = geomjax.integrate(
        dirac, model.x0, dt=0.1, steps=10, method=diffrax.Dopri8(), rtol=1e-12, atol=1e-14, max_steps=3, throw=False
    )
    assert not bool(sol.ok)


@pytest.mark.parametrize("which, tableau, steps", [("feedback", geomjax.EULER, 400), ("dirac", geomjax.RK4, 100)])
def test_step_solver_in_diffeqsolve_reproduces_integrate(setup, which, tableau, steps):
    model, dirac, feedback = setup
    field = {"dirac": dirac, "feedback": feedback}[which]
    dt = 0.005
    step = geomjax.explicit_rk(field, tableau)
    ours = geomjax.integrate(step, model.x0, dt=dt, steps=steps, save_every=1)
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(lambda t, y, args: y),  # not evaluated: the step carries the dynamics
        geomjax.StepSolver(step, order=tableau.order),
        t0=0.0,
        t1=dt * steps,
        dt0=dt,
        y0=model.x0,
        saveat=diffrax.SaveAt(steps=True),
        max_steps=steps,
    )
    assert sol.result == diffrax.RESULTS.successful
    assert int(sol.stats["num_steps"]) == steps
    ys = np.asarray(sol.ys)[:steps]
    np.testing.assert_allclose(ys, np.asarray(ours.xs)[1:], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(np.asarray(sol.ts)[:steps], np.asarray(ours.ts)[1:], rtol=1e-12)


def _rotation_step(x, h):
    """The exact flow of the harmonic oscillator q̇ = p, ṗ = −q: a rotation by angle h."""
    c, s = jnp.cos(h), jnp.sin(h)
    return jnp.stack([c * x[0] + s * x[1], -s * x[0] + c * x[1]])


def test_user_step_function_in_integrate():
    x0 = jnp.array([1.0, 0.5])
    sol = geomjax.integrate(_rotation_step, x0, dt=0.01, steps=1000, save_every=100, method="step")
    assert bool(sol.ok)
    t = np.asarray(sol.ts)
    exact = np.stack([np.cos(t) + 0.5 * np.sin(t), -np.sin(t) + 0.5 * np.cos(t)], axis=1)
    np.testing.assert_allclose(sol.xs, exact, atol=1e-12)
    # A wrapped step needs no method; a plain two-argument callable is never guessed to
    # be a step (it would be read as a field and rejected with a hint).
    wrapped = geomjax.integrate(geomjax.FunctionStep(_rotation_step), x0, dt=0.01, steps=1000, save_every=100)
    np.testing.assert_array_equal(wrapped.xs, sol.xs)
    with pytest.raises(TypeError, match='method="step"'):
        geomjax.integrate(_rotation_step, x0, dt=0.01, steps=10)


def test_user_step_function_in_step_solver():
    x0 = jnp.array([1.0, 0.5])
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(lambda t, y, args: y),
        geomjax.StepSolver(_rotation_step),
        t0=0.0,
        t1=1.0,
        dt0=0.01,
        y0=x0,
        saveat=diffrax.SaveAt(t1=True),
    )
    np.testing.assert_allclose(sol.ys[-1], [np.cos(1.0) + 0.5 * np.sin(1.0), -np.sin(1.0) + 0.5 * np.cos(1.0)], atol=1e-12)


def test_user_step_that_blows_up_reports_its_step():
    def bad_step(x, h):
        return x * 1e100  # overflows to inf on the fourth step

    sol = geomjax.integrate(bad_step, jnp.array([1.0, -2.0]), dt=0.1, steps=10, throw=False, method="step")
    assert int(sol.status) != 0
    assert int(sol.failed_step) == 4
    assert np.isfinite(np.asarray(sol.xs)[:4]).all() and not np.isfinite(np.asarray(sol.xs)[4]).all()


class _FailingStep(AbstractStep):
    """A step that reports a failed inner solve from t = 0.3 on."""

    def split(self, x):
        return x

    def merge(self, z):
        return z

    def advance(self, t, z, h, args):
        failed = z[0] >= 0.3 - 1e-12
        return z + h, geomjax.RESULTS.where(failed, geomjax.RESULTS.newton_failed, geomjax.RESULTS.successful)


def test_step_status_reaches_diffrax_and_integrate():
    x0 = jnp.array([0.0])
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(lambda t, y, args: y),
        geomjax.StepSolver(_FailingStep()),
        t0=0.0,
        t1=1.0,
        dt0=0.1,
        y0=x0,
        saveat=diffrax.SaveAt(t1=True),
        throw=False,
    )
    assert sol.result != diffrax.RESULTS.successful
    ours = geomjax.integrate(_FailingStep(), x0, dt=0.1, steps=10, throw=False)
    assert ours.result == geomjax.RESULTS.newton_failed
    assert int(ours.failed_step) == 4
    assert "Newton" in ours.message
