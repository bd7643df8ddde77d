"""Bad input gives an error that names the problem; a run that blows up says where."""

import re

import equinox as eqx
import geomjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest


@pytest.fixture(scope="module")
def pendulum():
    model = geomjax.models.spherical_pendulum()
    return model, geomjax.dirac_field(model.system), geomjax.feedback_field(model.system, model.x0, gains=50.0)


# ----------------------------------------------------------------------------- states


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_initial_state(pendulum, bad):
    model, dirac, feedback = pendulum
    x0 = model.x0.at[4].set(bad)
    with pytest.raises(ValueError, match=r"non-finite.*\[4\]"):
        geomjax.integrate(dirac, x0, dt=0.01, steps=10)
    with pytest.raises(ValueError, match="non-finite"):
        geomjax.feedback_field(model.system, x0, gains=50.0)


def test_two_dimensional_initial_state(pendulum):
    model, dirac, _ = pendulum
    with pytest.raises(ValueError, match=r"one dimension.*\(1, 6\)"):
        geomjax.integrate(dirac, model.x0[None, :], dt=0.01, steps=10)
    with pytest.raises(ValueError, match=r"one dimension.*\(2, 3\)"):
        geomjax.feedback_field(model.system, model.x0.reshape(2, 3), gains=50.0)


@pytest.mark.parametrize("length", [5, 7, 0])
def test_wrong_length_initial_state(pendulum, length):
    model, dirac, feedback = pendulum
    x0 = jnp.ones(length)
    with pytest.raises(ValueError, match=f"length {length}.*length 6"):
        geomjax.integrate(dirac, x0, dt=0.01, steps=10)
    with pytest.raises(ValueError, match=f"length {length}.*length 6"):
        geomjax.integrate(feedback, x0, dt=0.01, steps=10, method="rk4")


def test_float32_state_is_rejected(pendulum):
    model, dirac, _ = pendulum
    x32 = np.asarray(model.x0, dtype=np.float32)
    with pytest.raises(TypeError, match="float32.*float64"):
        geomjax.integrate(dirac, x32, dt=0.01, steps=10)
    with pytest.raises(TypeError, match="float64"):
        geomjax.feedback_field(model.system, jnp.asarray(x32, dtype=jnp.float32), gains=50.0)


def test_lists_and_integer_states_are_converted(pendulum):
    """Not an error: a Python list or an integer array becomes a float64 state."""
    model, dirac, _ = pendulum
    sol = geomjax.integrate(dirac, [0, 1, 0, 1, 0, -1], dt=0.01, steps=4)
    assert sol.xs.dtype == jnp.float64
    np.testing.assert_array_equal(sol.xs[0], model.x0)


def test_singular_constraint_matrix_at_q_zero(pendulum):
    """At q = 0, C = [[0, 2|q|²], [−2|q|², 0]] vanishes: the Dirac formula is undefined."""
    model, dirac, feedback = pendulum
    x0 = jnp.array([0.0, 0.0, 0.0, 1.0, 0.0, -1.0])
    with pytest.raises(ValueError, match="singular"):
        geomjax.integrate(dirac, x0, dt=0.01, steps=10)
    with pytest.raises(ValueError, match="singular"):
        geomjax.feedback_field(model.system, x0, gains=50.0)
    with pytest.raises(ValueError, match="singular"):
        geomjax.integrate(feedback, x0, dt=0.01, steps=10)
    holo = geomjax.System(
        model.system.hamiltonian, geomjax.canonical(3), holonomic=lambda q: jnp.atleast_1d(q @ q - 1.0)
    )
    with pytest.raises(ValueError, match="singular"):
        geomjax.integrate(geomjax.dirac_field(holo), x0, dt=0.01, steps=10)


def test_holonomic_start_off_the_constraint_set():
    holo = geomjax.System(
        lambda x: 0.5 * x[2:] @ x[2:] + x[1], geomjax.canonical(2), holonomic=lambda q: jnp.atleast_1d(q @ q - 1.0)
    )
    with pytest.raises(ValueError, match="off the constraint set"):
        geomjax.feedback_field(holo, jnp.array([1.1, 0.0, 0.0, 0.3]), gains=1.0)
    geomjax.feedback_field(holo, jnp.array([1.0, 0.0, 0.0, 0.3]), gains=1.0)  # on the set: accepted


def test_feedback_field_start_tol_is_the_tolerance_of_its_start_check():
    """feedback_field checks x0 as integrate does, with the same start_tol: the residual
    0.002 (q·p = 1e-3, {g, H} = 2q·p) passes a tolerance of 1e-2 and fails one of 1e-4."""
    model = geomjax.models.spherical_pendulum(holonomic=True)
    x_off = model.x0.at[4].add(1e-3)
    geomjax.feedback_field(model.system, x_off, gains=1.0, start_tol=1e-2)
    with pytest.raises(ValueError, match=r"residual is 0\.002 \(start_tol 0\.0001"):
        geomjax.feedback_field(model.system, x_off, gains=1.0, start_tol=1e-4)
    with pytest.raises(ValueError, match="start_tol must be a non-negative number"):
        geomjax.feedback_field(model.system, model.x0, gains=1.0, start_tol=-1.0)


# ----------------------------------------------------------------------------- gains


@pytest.mark.parametrize(
    "gains, pattern",
    [
        (-50.0, "non-negative"),
        (0.0, "positive entry"),
        ([0.0, 0.0, 0.0, 0.0], "positive entry"),
        ([50.0, -1.0, 50.0, 50.0], r"non-negative.*\[1\]"),
        ([50.0, 50.0, 50.0], "3 entries.*4"),
        ([50.0, np.nan, 50.0, 50.0], "finite"),
        (np.diag([1.0, 2.0, -3.0, 4.0]), "positive definite"),
        (np.triu(np.ones((4, 4))), "symmetric"),
        (np.eye(3), r"shape \(3, 3\).*\(4, 4\)"),
        (np.ones((2, 2, 2)), "scalar, a vector or a matrix"),
    ],
)
def test_bad_gains(pendulum, gains, pattern):
    model, _, _ = pendulum
    with pytest.raises(ValueError, match=pattern):
        geomjax.feedback_field(model.system, model.x0, gains=gains)


def test_bad_metric(pendulum):
    model, _, _ = pendulum
    with pytest.raises(ValueError, match="positive"):
        geomjax.feedback_field(model.system, model.x0, gains=1.0, metric=-2.0)
    with pytest.raises(ValueError, match="positive definite"):
        geomjax.feedback_field(model.system, model.x0, gains=1.0, metric=-np.eye(6))
    with pytest.raises(ValueError, match="shape"):
        geomjax.feedback_field(model.system, model.x0, gains=1.0, metric=np.eye(4))


# ----------------------------------------------------------------------------- arguments


def test_bad_step_arguments(pendulum):
    model, dirac, _ = pendulum
    for dt in (0.0, -0.01, np.nan):
        with pytest.raises(ValueError, match="dt must be a positive"):
            geomjax.integrate(dirac, model.x0, dt=dt, steps=10)
    for steps in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="steps must be a positive integer"):
            geomjax.integrate(dirac, model.x0, dt=0.01, steps=steps)
    with pytest.raises(ValueError, match="multiple of save_every"):
        geomjax.integrate(dirac, model.x0, dt=0.01, steps=10, save_every=3)
    with pytest.raises(ValueError, match="unknown method 'rk5'"):
        geomjax.integrate(dirac, model.x0, dt=0.01, steps=10, method="rk5")
    with pytest.raises(TypeError, match="method"):
        geomjax.integrate(dirac, model.x0, dt=0.01, steps=10, method=4)


def test_bad_system_definitions():
    h = lambda x: 0.5 * x @ x  # noqa: E731
    g = lambda q: jnp.atleast_1d(q @ q - 1.0)  # noqa: E731
    with pytest.raises(TypeError, match="hamiltonian"):
        geomjax.System(3.0, geomjax.canonical(1))
    with pytest.raises(TypeError, match="structure"):
        geomjax.System(h, np.eye(2))
    with pytest.raises(ValueError, match="not both"):
        geomjax.System(h, geomjax.canonical(1), holonomic=g, constraints=lambda x: x)
    with pytest.raises(ValueError, match="canonical"):
        geomjax.System(h, geomjax.lie_poisson_so3(), holonomic=g)
    with pytest.raises(TypeError, match="System"):
        geomjax.dirac_field(h)
    with pytest.raises(TypeError, match="System"):
        geomjax.feedback_field(h, jnp.zeros(2), gains=1.0)


# ----------------------------------------------------------------------------- blow-up


def test_blow_up_raises_with_the_failing_step(pendulum):
    """Gain × step far past Euler's stability limit (k = 1e4, h = 0.1): the first step
    already leaves the invariant set; with monitoring off the state turns non-finite."""
    model, _, _ = pendulum
    stiff = geomjax.feedback_field(model.system, model.x0, gains=1e4)
    with pytest.raises(geomjax.IntegrationError, match=r"failed at step \d+") as info:
        geomjax.integrate(stiff, model.x0, dt=0.1, steps=50)
    sol = info.value.solution
    assert int(sol.failed_step) == 1 and sol.result == geomjax.RESULTS.invariant_drift
    assert "stability limit" in str(info.value) and sol.message == str(info.value)
    with pytest.raises(geomjax.IntegrationError) as info:
        geomjax.integrate(stiff, model.x0, dt=0.1, steps=50, drift_tol=None)
    sol = info.value.solution
    step = int(sol.failed_step)
    assert step > 1 and f"step {step} " in str(info.value)
    assert "non-finite" in str(info.value) and sol.result == geomjax.RESULTS.diverged
    assert int(sol.status) != 0 and not bool(sol.ok)
    finite = np.isfinite(np.asarray(sol.xs)).all(axis=1)
    assert finite[:step].all() and not finite[step:].any()


def test_blow_up_under_jit_reports_status_and_first_failing_step(pendulum):
    model, _, _ = pendulum

    @jax.jit
    def run(gain, dt):
        field = geomjax.feedback_field(model.system, model.x0, gains=gain)
        return geomjax.integrate(field, model.x0, dt=dt, steps=40, method="euler", save_every=1, throw=False)

    for gain, dt in [(1e4, 0.1), (100.0, 0.05), (100.0, 0.02)]:
        sol = run(gain, dt)
        status, step = int(sol.status), int(sol.failed_step)
        assert status != 0 and step > 0
        finite = np.isfinite(np.asarray(sol.xs)).all(axis=1)
        # Saves up to the failing step are kept (the one that showed the drift too), later
        # ones are NaN.
        assert finite[:step].all() and not finite[step + 1 :].any(), (gain, dt, step)
        assert f"step {step}" in sol.message
    ok = run(50.0, 1e-3)
    assert int(ok.status) == 0 and int(ok.failed_step) == -1
    assert np.isfinite(np.asarray(ok.xs)).all()


def test_blow_up_in_one_member_of_a_batch(pendulum):
    model, _, _ = pendulum

    def run(gain):
        field = geomjax.feedback_field(model.system, model.x0, gains=gain)
        return geomjax.integrate(field, model.x0, dt=0.005, steps=40, method="euler", save_every=10, throw=False)

    sol = jax.vmap(run)(jnp.array([1.0, 1e4, 2.0]))
    np.testing.assert_array_equal(np.asarray(sol.status) != 0, [False, True, False])
    assert int(sol.failed_step[1]) > 0 and int(sol.failed_step[0]) == -1
    assert sol.message.startswith("1 of 3 runs failed; run 1: integration failed at step")


# ----------------------------------------------------------------------------- splitting


@pytest.mark.parametrize("make", [geomjax.models.spherical_pendulum, geomjax.models.planar_pendulum])
@pytest.mark.parametrize("length", [1.0, 2.0])
def test_pendulum_flows_check_the_rod_length(make, length):
    """The exact sub-flows keep |q| whatever it is: a start on a sphere of another radius
    would run a pendulum of another length. They read ℓ from the model and reject it."""
    model = make(length=length)
    step = geomjax.strang(*geomjax.models.pendulum_flows(model))
    n = model.x0.shape[0] // 2
    assert geomjax.integrate(step, model.x0, dt=0.01, steps=4).ok
    longer = model.x0.at[:n].multiply(1.1)  # q·p stays 0: only the radius is wrong
    residual = f"{0.21 * length**2:.3g}"  # |q|² − ℓ² = (1.1² − 1) ℓ²
    with pytest.raises(ValueError, match=f"off the constraint set.*residual is {residual}"):
        geomjax.integrate(step, longer, dt=0.01, steps=4)
    with pytest.raises(ValueError, match="off the constraint set"):
        geomjax.integrate(geomjax.lie_trotter(*geomjax.models.pendulum_flows(model)), longer, dt=0.01, steps=4)


# ----------------------------------------------------------------------------- order conditions


def _defect(th, y, h):
    return h * th["a"] * y + h**2 * th["b"] * y


def test_order_conditions_refuse_non_finite_samples_and_keep_finite_ones():
    """A NaN in some sampled problems used to be fitted (giving conditions that no
    sample supports); now it is an error naming the samples, and finite samples give the
    true conditions of the same family."""

    def some_nan(key):
        y = jax.random.normal(key, (2,))
        return jnp.where(jax.random.uniform(key) < 0.5, jnp.nan, 1.0) * y

    keys = jax.random.split(jax.random.split(jax.random.key(0))[0], 4)
    nan_samples = [i for i, k in enumerate(keys) if not np.isfinite(np.asarray(some_nan(k))).all()]
    assert 0 < len(nan_samples) < 4  # the test exercises a partial NaN
    with pytest.raises(ValueError, match=re.escape(f"for samples {nan_samples} of 4")):
        geomjax.order_conditions(_defect, ("a", "b"), some_nan, [1, 2])
    good = geomjax.order_conditions(_defect, ("a", "b"), lambda k: jax.random.normal(k, (2,)), [1, 2])
    assert [str(c) for c in good] == ["a = 0", "b = 0"]


# ----------------------------------------------------------------------------- gain checks


def test_check_gains_never_finds_nothing_wrong_in_nan(pendulum):
    """Where the rates are NaN every comparison is False: check_gains used to return no
    message ("nothing wrong"). A singular constraint matrix at x0 (q = 0) makes ‖DX‖ NaN."""
    model, _, feedback = pendulum
    with pytest.raises(ValueError, match="rates at the initial states are not finite"):
        geomjax.check_gains(feedback, jnp.array([0.0, 0.0, 0.0, 1.0, 0.0, -1.0]), 1e-3)
    with pytest.raises(ValueError, match=r"non-finite entries \(NaN or inf\) at rows \[1\]"):
        geomjax.check_gains(feedback, jnp.stack([model.x0, model.x0.at[0].set(jnp.inf)]), 1e-3)
    with pytest.raises(ValueError, match="length 4, but the field's state has length 6"):
        geomjax.check_gains(feedback, model.x0[:4], 1e-3)
    # the same call on a good start and step: a check with a number, no message
    check = geomjax.check_gains(feedback, model.x0, 1e-3)
    assert np.isfinite(check.stability_fraction) and check.messages == ()


def test_adaptive_gain_rejects_a_bad_step_and_runs_with_a_good_one(pendulum):
    model, _, feedback = pendulum
    for dt in (0.0, -1e-2, np.nan, np.inf):
        with pytest.raises(ValueError, match="dt must be a positive finite scalar"):
            feedback.adaptive(dt=dt)
    with pytest.raises(TypeError, match="got the string"):
        feedback.adaptive(dt="0.01")
    assert geomjax.integrate(feedback.adaptive(dt=1e-2), model.x0, dt=1e-2, steps=4).ok


def test_feedback_field_under_jit_works_the_documented_ways(pendulum):
    """jax.jit cannot take or return a field holding Python functions (JAX's TypeError,
    raised outside geomjax's code); the two ways the docstring gives work: the field built
    inside the jitted function that runs it, and equinox.filter_jit of the builder."""
    model, _, _ = pendulum
    with pytest.raises(TypeError, match="system.constraints"):
        jax.jit(geomjax.feedback_field)(model.system, model.x0, 50.0)

    @jax.jit
    def final(gain):
        field = geomjax.feedback_field(model.system, model.x0, gains=gain)
        return geomjax.integrate(field, model.x0, dt=1e-3, steps=10, throw=False).xs[-1]

    built = eqx.filter_jit(geomjax.feedback_field)(model.system, model.x0, 50.0)
    np.testing.assert_allclose(built.target, model.system.conserved_quantities(model.x0))
    eager = geomjax.integrate(built, model.x0, dt=1e-3, steps=10).xs[-1]
    np.testing.assert_allclose(final(50.0), eager, rtol=1e-12)
