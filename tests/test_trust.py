"""Regression tests: runs that used to give wrong answers with a success status.

Each test here failed before the core redesign (issue 8): the run either returned a
wrong trajectory reporting success, or crashed on ordinary input.
"""

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax
from geomjax import RESULTS


@pytest.fixture(scope="module")
def pendulum():
    return geomjax.models.spherical_pendulum()


@pytest.fixture(scope="module")
def holonomic_pendulum():
    return geomjax.models.spherical_pendulum(holonomic=True)


def _other_start(model):
    """A second state on the same constraint set, with another energy."""
    return model.x0.at[3:].multiply(1.7)


def test_vmap_over_initial_states_keeps_each_runs_own_invariants(pendulum):
    # One field, built from x0; runs from other states must keep *their* invariants.
    field = geomjax.feedback_field(pendulum.system, pendulum.x0, gains=50.0)
    starts = jnp.stack([pendulum.x0, _other_start(pendulum), pendulum.x0.at[3:].multiply(0.4)])
    run = jax.jit(
        jax.vmap(lambda x: geomjax.integrate(field, x, dt=1e-3, steps=2000, save_every=2000, throw=False))
    )
    sol = run(starts)
    F = jax.vmap(jax.vmap(pendulum.system.conserved_quantities))(sol.xs)
    assert np.all(np.asarray(sol.status) == 0)
    assert float(jnp.abs(F[:, -1] - F[:, 0]).max()) < 1e-4
    # The energies really differ, so a field holding x0's energy would have moved them.
    assert float(jnp.ptp(F[:, 0, 2])) > 0.5


def test_pinned_target_is_kept(pendulum):
    target = pendulum.system.conserved_quantities(pendulum.x0).at[2].add(0.05)
    field = geomjax.feedback_field(pendulum.system, gains=20.0, target=target)
    sol = geomjax.integrate(field, pendulum.x0, dt=1e-3, steps=3000, save_every=3000, drift_tol=None)
    energy = pendulum.system.hamiltonian(sol.xs[-1])
    assert abs(float(energy - target[2])) < 1e-3


def test_field_without_x0_takes_the_runs_start(pendulum):
    field = geomjax.feedback_field(pendulum.system, gains=50.0)
    sol = geomjax.integrate(field, pendulum.x0, dt=1e-3, steps=500)
    assert bool(sol.ok)
    with pytest.raises(ValueError, match="no target"):
        field(pendulum.x0)


@pytest.mark.parametrize("method, factor", [("euler", 1.5), ("euler", 3.0), ("rk4", 1.5)])
def test_past_the_step_limit_is_a_failure_not_a_wrong_success(pendulum, method, factor):
    field = geomjax.feedback_field(pendulum.system, pendulum.x0, gains=50.0)
    limit = float(field.euler_step_limit(pendulum.x0))
    if method == "rk4":
        limit *= 2.785 / 2.0  # RK4's stability interval on the negative real axis
    sol = geomjax.integrate(
        field, pendulum.x0, dt=factor * limit, steps=400, save_every=10, method=method, throw=False
    )
    assert not bool(sol.ok)
    assert sol.result in (RESULTS.invariant_drift, RESULTS.constraint_violation, RESULTS.diverged)
    assert 0 < int(sol.failed_step) <= 400
    # Saves after the failure are NaN, never a finite wrong trajectory.
    assert np.all(np.isnan(np.asarray(sol.xs[-1])))


def test_a_field_of_two_arguments_is_not_taken_for_a_step():
    with pytest.raises(TypeError, match="autonomous field"):
        geomjax.integrate(lambda x, t: -x, jnp.array([1.0]), dt=0.1, steps=10, method="rk4")


def test_time_dependent_field_with_args_matches_the_exact_solution():
    # ẋ = a cos t, x(0) = 0: x(t) = a sin t.
    field = geomjax.TimeField(lambda t, x, a: a * jnp.cos(t) * jnp.ones_like(x))
    sol = geomjax.integrate(field, jnp.array([0.0]), dt=0.01, steps=100, method="rk4", args=2.0)
    assert abs(float(sol.xs[-1, 0]) - 2.0 * np.sin(1.0)) < 1e-9
    term = diffrax.ODETerm(lambda t, x, a: a * jnp.cos(t) * jnp.ones_like(x))
    sol2 = geomjax.integrate(term, jnp.array([0.0]), dt=0.01, steps=100, method="rk4", args=2.0)
    assert abs(float(sol2.xs[-1, 0]) - 2.0 * np.sin(1.0)) < 1e-9


def test_step_functions_need_saying_so():
    step = lambda x, h: x * (1.0 - h)  # noqa: E731
    sol = geomjax.integrate(step, jnp.array([1.0]), dt=0.1, steps=3, method="step")
    assert abs(float(sol.xs[-1, 0]) - 0.9**3) < 1e-15


def _off_start(model):
    return model.x0.at[1].add(1e-3)  # |q| ≠ 1


def test_off_constraint_start_inside_jit_and_vmap(holonomic_pendulum):
    model = holonomic_pendulum
    field = geomjax.dirac_field(model.system)
    run = jax.jit(
        jax.vmap(lambda x: geomjax.integrate(field, x, dt=1e-2, steps=10, method="rk4", throw=False))
    )
    sol = run(jnp.stack([model.x0, _off_start(model)]))
    assert int(sol.status[0]) == 0
    assert int(sol.status[1]) == int(RESULTS.off_constraint_set._value)
    assert int(sol.failed_step[1]) == 0 and int(sol.num_steps[1]) == 0


@pytest.mark.parametrize("which", ["dirac", "gauss4", "strang", "rattle"])
def test_off_constraint_start_outside_jit_is_an_error(holonomic_pendulum, which):
    model = holonomic_pendulum
    if which == "dirac":
        target, method = geomjax.dirac_field(model.system), "rk4"
    elif which == "gauss4":
        target, method = geomjax.dirac_field(model.system), "gauss4"
    elif which == "strang":
        target, method = geomjax.strang(*geomjax.models.pendulum_flows(model)), None
    else:
        target, method = geomjax.rattle(model.system), None
    kwargs = {} if method is None else {"method": method}
    x_off = model.x0.at[4].add(1e-3)  # momentum no longer tangent (q = (0, 1, 0))
    with pytest.raises(ValueError, match="off the constraint set"):
        geomjax.integrate(target, x_off, dt=1e-2, steps=4, **kwargs)
    # On purpose, it is allowed.
    geomjax.integrate(target, x_off, dt=1e-2, steps=4, start_tol=None, drift_tol=None, **kwargs)


def test_off_constraint_start_for_dla():
    model = geomjax.models.nonholonomic_oscillator()
    x_off = model.x0.at[3:].add(jnp.array([0.1, 0.2, 0.3]))
    assert float(jnp.abs(model.system.constraint_residuals(x_off)).max()) > 1e-3
    with pytest.raises(ValueError, match="off the constraint set"):
        geomjax.integrate(geomjax.dla(model.system), x_off, dt=1e-2, steps=4)


def test_nan_start_under_jit_is_reported_as_such(pendulum):
    field = geomjax.feedback_field(pendulum.system, pendulum.x0, gains=50.0)
    x_nan = pendulum.x0.at[1].set(jnp.nan)
    sol = jax.jit(lambda x: geomjax.integrate(field, x, dt=1e-3, steps=10, throw=False))(x_nan)
    assert int(sol.status) == int(RESULTS.nonfinite_start._value)
    assert "gains" not in sol.message and "non-finite entries" in sol.message


def test_metric_checks(pendulum):
    x0 = pendulum.x0
    bad = np.eye(6)
    bad[0, 1] = 5.0  # non-symmetric; the symmetric part is indefinite
    with pytest.raises(ValueError, match="symmetric"):
        geomjax.feedback_field(pendulum.system, x0, 10.0, metric=bad)
    with pytest.raises(ValueError, match="positive definite"):
        geomjax.feedback_field(pendulum.system, x0, 10.0, metric=-np.eye(6))
    with pytest.raises(ValueError, match="positive"):
        geomjax.feedback_field(pendulum.system, x0, 10.0, metric=0.0)
    plain = geomjax.feedback_field(pendulum.system, x0, 10.0)
    scaled = geomjax.feedback_field(pendulum.system, x0, 10.0, metric=4.0)
    matrix = geomjax.feedback_field(pendulum.system, x0, 10.0, metric=4.0 * np.eye(6))
    callable_metric = geomjax.feedback_field(pendulum.system, x0, 10.0, metric=lambda x: 4.0 * jnp.eye(6))
    base = float(plain.euler_step_limit(x0))
    for field in (scaled, matrix, callable_metric):
        assert float(field.euler_step_limit(x0)) == pytest.approx(base / 4.0, rel=1e-10)
    # A callable metric integrates (it used to crash).
    sol = geomjax.integrate(callable_metric, x0, dt=1e-3, steps=200)
    assert bool(sol.ok)


class _FailsLate(geomjax.AbstractStep):
    """x ↦ x(1 + h sin x), reporting a failed inner solve from t = 0.5 on (finite values:
    the case where a gradient could look meaningful)."""

    def split(self, x):
        return x

    def merge(self, z):
        return z

    def advance(self, t, z, h, args):
        bad = t >= 0.5 - 1e-12
        return z * (1.0 + h * jnp.sin(z)), RESULTS.where(bad, RESULTS.newton_failed, RESULTS.successful)


def test_gradients_of_a_failed_run():
    """A run that fails at step k: losses on earlier states have the shorter run's
    gradient; the saves after the failure are NaN."""
    step, x0 = _FailsLate(), jnp.array([0.3, 1.1])

    def run(x, steps):
        return geomjax.integrate(step, x, dt=0.1, steps=steps, throw=False)

    sol = run(x0, 10)
    assert sol.result == RESULTS.newton_failed and int(sol.failed_step) == 6
    early = lambda x: run(x, 10).xs[5].sum()  # noqa: E731
    short = lambda x: run(x, 5).xs[-1].sum()  # noqa: E731
    g_early, g_short = jax.grad(early)(x0), jax.grad(short)(x0)
    assert np.all(np.isfinite(np.asarray(g_early)))
    np.testing.assert_allclose(g_early, g_short, rtol=1e-13)
    assert np.all(np.isnan(np.asarray(sol.xs[6:])))
    # A loss that reads a save after the failure has a NaN gradient (flagged), in
    # reverse and in forward mode; one that reads only earlier saves stays finite.
    late = lambda x: run(x, 10).xs[8].sum()  # noqa: E731
    assert np.all(np.isnan(np.asarray(jax.grad(late)(x0))))
    assert np.all(np.isnan(np.asarray(jax.jacfwd(late)(x0))))
    whole = jax.jacrev(lambda x: run(x, 10).xs)(x0)
    assert np.all(np.isfinite(np.asarray(whole[:6])))
    assert np.all(np.any(np.isnan(np.asarray(whole[6:])), axis=-1))


def test_gradients_of_one_failed_vmap_member_are_flagged_alone():
    step = _FailsLate()
    x0s = jnp.array([[0.3, 1.1], [0.2, 0.4]])

    def final(x, steps):
        return geomjax.integrate(step, x, dt=0.1, steps=steps, throw=False).xs[-1].sum()

    # steps=10 passes t = 0.5, where the step reports a failure: both members fail.
    grads = jax.vmap(jax.grad(lambda x: final(x, 10)))(x0s)
    assert np.all(np.isnan(np.asarray(grads)))
    grads = jax.vmap(jax.grad(lambda x: final(x, 5)))(x0s)
    assert np.all(np.isfinite(np.asarray(grads)))


def test_throw_inside_jit_raises(holonomic_pendulum):
    model = holonomic_pendulum
    field = geomjax.dirac_field(model.system)
    run = jax.jit(lambda x: geomjax.integrate(field, x, dt=1e-2, steps=5, method="rk4").xs)
    with pytest.raises(Exception, match="off the constraint set"):
        jax.block_until_ready(run(_off_start(model)))


def test_numpy_integer_steps_and_int64_counters(pendulum):
    field = geomjax.dirac_field(pendulum.system)
    sol = geomjax.integrate(field, pendulum.x0, dt=1e-2, steps=np.int64(20), save_every=np.int32(10), method="rk4")
    assert sol.xs.shape == (3, 6)
    assert sol.num_steps.dtype == jnp.int64


def test_adaptive_diffrax_stops_at_once_on_a_nan_field():
    evaluations = []

    def field(x):
        jax.debug.callback(lambda: evaluations.append(None))
        return jnp.where(x[0] > 0.5, jnp.nan, 1.0) * jnp.ones_like(x)

    sol = geomjax.integrate(
        field, jnp.array([0.0]), dt=0.01, steps=100, method=diffrax.Tsit5(), rtol=1e-8, atol=1e-8, throw=False
    )
    jax.effects_barrier()
    assert not bool(sol.ok)
    assert sol.result == geomjax.RESULTS.step_size_collapsed
    # The solve stops once the step size collapses, not after max_steps (10⁶) rejections:
    # Tsit5 evaluates the field 6 times per step attempt.
    assert len(evaluations) < 6 * 1000
    assert int(sol.num_steps) < 1000
    # The failure is reported where the field turned NaN (x = t reaches 0.5 at t = 0.5).
    t_fail = float(sol.t0 + sol.failed_step * sol.dt)
    assert 0.45 <= t_fail <= 0.55
    assert np.all(np.isfinite(np.asarray(sol.xs[:50]))) and np.all(np.isnan(np.asarray(sol.xs[51:])))


def test_convergence_order_keeps_the_small_step_points():
    # A 4th-order method whose large-step errors fall faster than h⁴ (pre-asymptotic).
    hs = np.array([0.4, 0.2, 0.1, 0.05, 0.025, 0.0125])
    errors = 1e-3 * hs**4 + 50.0 * hs**8
    fit = geomjax.diagnostics.convergence_order(hs, errors)
    assert abs(fit.order - 4.0) < 0.3


def test_traced_zero_or_nan_step_size_is_reported_at_step_zero(pendulum):
    """A dt that is traced (a parameter of a jitted or vmapped function) cannot be checked
    before the run; a zero, negative or NaN one ends the run at step 0 with its own status
    instead of standing still and reporting success."""
    field = geomjax.dirac_field(pendulum.system)
    run = jax.jit(
        jax.vmap(lambda dt: geomjax.integrate(field, pendulum.x0, dt=dt, steps=4, method="rk4", throw=False))
    )
    sol = run(jnp.array([1e-2, 0.0, -1e-2, jnp.nan]))
    statuses = [RESULTS.successful, RESULTS.invalid_step_size, RESULTS.invalid_step_size, RESULTS.invalid_step_size]
    for i, expected in enumerate(statuses):
        assert int(sol.status[i]) == int(expected._value)
    assert "step size dt is zero" in RESULTS[RESULTS.invalid_step_size]
    assert np.all(np.isfinite(np.asarray(sol.xs[0]))) and np.all(np.isnan(np.asarray(sol.xs[1, 1:])))
