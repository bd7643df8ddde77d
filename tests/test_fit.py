"""`geomjax.fit`: parameters recovered from noisy synthetic trajectories, within their
standard errors, through a holonomic (RATTLE), a contact (Herglotz) and a nonholonomic
(discrete Lagrange–d'Alembert) integrator; standard errors that are real estimates; and
parameters the data do not determine, and failed runs, reported in words.

Each problem's fit is compiled once (its `make`, `observe` and start function are defined
at module level, so that every fit of a problem reuses one compiled program); the
fifty-dataset coverage of `benchmarks/fit_coverage.py` is the extended test at the end.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax


def simulate(make, params, x0, shape, **run):
    """The observations (B, T, m) that `fit` predicts at `params`: the residuals of a fit
    to zero data that evaluates its guess only (`max_steps=0`). The same compiled program
    as the fits of the test that follows (same functions and shapes): no compile of its
    own. `test_predictions_are_the_runs_saves` checks these predictions against the
    exact solution."""
    return geomjax.fit(make, params, x0, np.zeros(shape), max_steps=0, throw=False, **run).residuals


def within(result, truth, k):
    """|fitted − true| ≤ k standard errors for every parameter."""
    values, errors = result.values(), result.errors()
    truth = np.concatenate([np.ravel(v) for v in jax.tree_util.tree_leaves(truth)])
    return np.abs(values - truth) <= k * errors


# The data of these fits are made by the integrator that fits them, at the same step:
# there is no integrator error for `step_check` to see (its own test is at the end).
# --------------------------------------------------------------------------------------
# Spherical pendulum by RATTLE: g and ℓ from noisy positions. The start depends on ℓ
# (it must lie on the sphere of radius ℓ): x0 is a function of the parameters, from
# known angles and angular rates.

ANGLES = np.array([[0.5, 0.0, 0.0, 1.0], [1.0, 0.3, 0.2, 0.5], [0.3, 1.0, 0.5, 0.0]])  # θ, φ, θ̇, φ̇


def pendulum_starts(params):
    length = params["length"]

    def one(a):
        th, ph, thd, phd = a[0], a[1], a[2], a[3]
        q = length * jnp.stack([jnp.sin(th) * jnp.cos(ph), jnp.sin(th) * jnp.sin(ph), -jnp.cos(th)])
        q_th = length * jnp.stack([jnp.cos(th) * jnp.cos(ph), jnp.cos(th) * jnp.sin(ph), jnp.sin(th)])
        q_ph = length * jnp.stack([-jnp.sin(th) * jnp.sin(ph), jnp.sin(th) * jnp.cos(ph), 0.0 * th])
        return jnp.concatenate([q, q_th * thd + q_ph * phd])  # p = m q̇ with m = 1

    return jax.vmap(one)(jnp.asarray(ANGLES))


def pendulum(params):
    model = geomjax.models.spherical_pendulum(g=params["g"], length=params["length"], holonomic=True)
    return geomjax.rattle(model.system)


def positions(x):
    return x[:3]


PENDULUM = dict(dt=0.05, save_every=2, step_check=False)
PENDULUM_TRUE = {"g": 9.81, "length": 1.3}


@pytest.fixture(scope="module")
def pendulum_fit():
    clean = simulate(pendulum, PENDULUM_TRUE, pendulum_starts, (3, 15, 3), observe=positions, **PENDULUM)
    data = clean + 0.01 * np.random.default_rng(0).standard_normal(clean.shape)
    return geomjax.fit(pendulum, {"g": 5.0, "length": 1.0}, pendulum_starts, data, observe=positions, **PENDULUM)


def test_spherical_pendulum_g_and_length(pendulum_fit):
    result = pendulum_fit
    assert result.message.startswith("success"), result.message
    assert set(result.params) == {"g", "length"}
    assert np.all(within(result, PENDULUM_TRUE, 3.0)), result.summary()
    # a real precision: 0.01 noise on 135 positions pins g to about 0.1 %
    assert float(result.standard_errors["g"]) < 0.05
    assert abs(float(result.noise_scale) - 0.01) < 0.003
    assert int(result.iterations) < 20
    losses = np.asarray(result.losses)
    assert np.all(np.diff(losses[np.isfinite(losses)]) <= 0)  # LM only accepts decreases
    text = result.summary()
    assert text.splitlines()[1].startswith("g ") and "std. error" in text


# --------------------------------------------------------------------------------------
# Damped oscillator by the Herglotz integrator: the damping α and the mass m from noisy
# positions. L = ½mq̇² − ½mq² − αz, so q̈ + αq̇ + q = 0 does not involve m: m is seen only
# through the known initial momenta, q̇(0) = p₀/m.


def oscillator(params):
    model = geomjax.models.damped_oscillator(alpha=params["alpha"], m=params["m"])
    return geomjax.herglotz(model.contact, order=2)


def position(x):
    return x[:1]


OSCILLATOR = dict(dt=0.2, save_every=2, step_check=False)
OSCILLATOR_TRUE = {"alpha": 0.3, "m": 2.0}
OSCILLATOR_STARTS = np.array([[1.0, 1.0, 0.0], [0.0, 2.0, 0.0], [-0.5, -1.0, 0.0]])  # (q, p, z)
OSCILLATOR_GUESS = {"alpha": 0.1, "m": 1.0}
NOISE = 0.01


@pytest.fixture(scope="module")
def oscillator_clean():
    return simulate(oscillator, OSCILLATOR_TRUE, OSCILLATOR_STARTS, (3, 15, 1), observe=position, **OSCILLATOR)


def oscillator_fit(data, x0s=OSCILLATOR_STARTS, throw=True):
    return geomjax.fit(oscillator, OSCILLATOR_GUESS, x0s, data, observe=position, throw=throw, **OSCILLATOR)


def test_damped_oscillator_alpha_herglotz(oscillator_clean):
    # the data are the Herglotz runs, near the exact damped motion from q₀, q̇₀ = p₀/m (a save off by one
    # step would be 0.3 off)
    alpha, m = OSCILLATOR_TRUE["alpha"], OSCILLATOR_TRUE["m"]
    t = 0.4 * np.arange(1, 16)
    wd = math.sqrt(1 - alpha**2 / 4)
    q0, v0 = OSCILLATOR_STARTS[:, :1], OSCILLATOR_STARTS[:, 1:2] / m
    exact = np.exp(-alpha * t / 2) * (q0 * np.cos(wd * t) + (v0 + alpha * q0 / 2) / wd * np.sin(wd * t))
    np.testing.assert_allclose(oscillator_clean[..., 0], exact, atol=1e-2)  # order 2 at h = 0.2: phase error
    data = oscillator_clean + NOISE * np.random.default_rng(1).standard_normal(oscillator_clean.shape)
    result = oscillator_fit(data)
    assert result.message.startswith("success"), result.message
    assert np.all(within(result, OSCILLATOR_TRUE, 3.0)), result.summary()
    assert float(result.standard_errors["alpha"]) < 0.02
    assert result.residuals.shape == data.shape
    # the residuals are predicted − observed (no noise scale given): their mean square is the loss
    assert math.isclose(float(np.mean(np.asarray(result.residuals) ** 2)), float(result.loss), rel_tol=1e-12)


def test_optax_finds_the_same_optimum(oscillator_clean):
    """An optax optimiser minimises the same loss (the same compiled evaluation): Adam ends
    within 0.01 standard errors of Levenberg–Marquardt, with the same standard errors."""
    import optax

    data = oscillator_clean + NOISE * np.random.default_rng(1).standard_normal(oscillator_clean.shape)
    lm = oscillator_fit(data)
    adam = geomjax.fit(
        oscillator, OSCILLATOR_GUESS, OSCILLATOR_STARTS, data, observe=position, optimizer=optax.adam(0.1), **OSCILLATOR
    )
    assert adam.message.startswith("success: converged after") and "optax" in adam.message
    assert int(adam.iterations) > 10 * int(lm.iterations)
    assert np.all(np.abs(adam.values() - lm.values()) <= 0.01 * lm.errors())
    np.testing.assert_allclose(adam.errors(), lm.errors(), rtol=1e-3)


def test_standard_errors_are_real_estimates(oscillator_clean):
    """Over 12 noisy datasets (one compiled fit), the spread of the fitted α and m matches
    the standard errors: the sample standard deviation is within a factor 1.6 of the
    mean standard error, and |α̂ − α| ≤ 2 se in at least 10 of 12."""
    rng = np.random.default_rng(2)
    fits = [oscillator_fit(oscillator_clean + NOISE * rng.standard_normal(oscillator_clean.shape)) for _ in range(12)]
    assert all(f.message.startswith("success") for f in fits), [f.message for f in fits if not f.ok]
    values = np.stack([f.values() for f in fits])
    errors = np.stack([f.errors() for f in fits])
    truth = np.array([OSCILLATOR_TRUE["alpha"], OSCILLATOR_TRUE["m"]])
    ratio = values.std(axis=0, ddof=1) / errors.mean(axis=0)
    assert np.all((ratio > 1 / 1.6) & (ratio < 1.6)), ratio
    covered = np.sum(np.abs(values - truth) <= 2 * errors, axis=0)
    assert np.all(covered >= 10), covered
    # the noise scale σ̂ estimates the noise that was added
    sigma = np.array([float(f.noise_scale) for f in fits])
    assert abs(sigma.mean() / NOISE - 1) < 0.15


def test_released_from_rest_the_mass_is_not_identified(oscillator_clean):
    """Released from rest (p₀ = 0), the motion does not depend on m at all: the fit says
    so, gives m an infinite standard error, and α a finite one."""
    starts = OSCILLATOR_STARTS * np.array([1.0, 0.0, 0.0]) + np.array([[0.0, 0, 0], [1.5, 0, 0], [0.0, 0, 0]])
    clean = simulate(oscillator, OSCILLATOR_TRUE, starts, (3, 15, 1), observe=position, **OSCILLATOR)
    data = clean + NOISE * np.random.default_rng(3).standard_normal(clean.shape)
    with pytest.raises(geomjax.FitError, match="do not depend on m at all") as raised:
        oscillator_fit(data, starts)
    result = raised.value.result
    assert result.result == geomjax.FIT_RESULTS.unidentifiable
    assert not bool(result.ok)
    assert "do not depend on m at all" in result.message, result.message
    assert np.isinf(float(result.standard_errors["m"]))
    assert np.isfinite(float(result.standard_errors["alpha"]))
    assert abs(float(result.params["alpha"]) - 0.3) <= 3 * float(result.standard_errors["alpha"])


# --------------------------------------------------------------------------------------
# Knife edge on an incline by the discrete Lagrange–d'Alembert step: m and the inertia J
# from noisy positions (x, y, φ). Gravity's force m g sin α scales with m, so the motion
# from known *velocities* would not depend on m or J at all; the starts are given by
# their momenta instead (known impulses: a push P along the blade, a twist L), which the
# blade turns into velocities P/m and L/J. So both are identified.


def knife_edge(params):
    model = geomjax.models.knife_edge(m=params["m"], inertia=params["inertia"])
    return geomjax.dla(model.system)


def pushed(phi, push, twist):
    return np.array([0.0, 0.0, phi, push * np.cos(phi), push * np.sin(phi), twist])


KNIFE = dict(dt=0.05, save_every=2, drift_tol=0.05, step_check=False)
KNIFE_TRUE = {"m": 2.0, "inertia": 0.5}
KNIFE_STARTS = np.stack([pushed(0.3, 1.0, 2.0), pushed(-1.0, 2.0, -1.0), pushed(2.0, 0.5, 3.0)])


def test_knife_edge_mass_and_inertia():
    clean = simulate(knife_edge, KNIFE_TRUE, KNIFE_STARTS, (3, 10, 3), observe=positions, **KNIFE)
    data = clean + 0.01 * np.random.default_rng(4).standard_normal(clean.shape)
    result = geomjax.fit(knife_edge, {"m": 1.0, "inertia": 1.0}, KNIFE_STARTS, data, observe=positions, **KNIFE)
    assert result.message.startswith("success"), result.message
    assert np.all(within(result, KNIFE_TRUE, 3.0)), result.summary()
    assert float(result.standard_errors["m"]) < 0.1 and float(result.standard_errors["inertia"]) < 0.01


# --------------------------------------------------------------------------------------
# Two parameters that enter only as a product, and a run that fails


def spring(params):
    k = params["a"] * params["b"]
    return lambda x: jnp.stack([x[1], -k * x[0]])


SPRING = dict(dt=0.1, save_every=2, method="rk4", step_check=False)
SPRING_STARTS = np.array([[1.0, 0.0], [0.0, 1.0]])


@pytest.fixture(scope="module")
def spring_data():
    clean = simulate(spring, {"a": 2.0, "b": 1.5}, SPRING_STARTS, (2, 10, 1), observe=position, **SPRING)
    return clean + 0.01 * np.random.default_rng(5).standard_normal(clean.shape)


def test_predictions_are_the_runs_saves():
    """data[:, k] is compared with the state at t = (k + 1)·save_every·dt (the start not
    included): the predictions at the truth are the exact solution there, to RK4's error."""
    predicted = simulate(spring, {"a": 2.0, "b": 1.5}, SPRING_STARTS, (2, 10, 1), observe=position, **SPRING)
    t = 0.2 * np.arange(1, 11)
    w = math.sqrt(3.0)
    exact = np.stack([np.cos(w * t), np.sin(w * t) / w])[:, :, None]
    np.testing.assert_allclose(predicted, exact, atol=2e-5)


def test_parameters_entering_as_a_product_are_flagged(spring_data):
    result = geomjax.fit(
        spring, {"a": 1.0, "b": 1.0}, SPRING_STARTS, spring_data, observe=position, throw=False, **SPRING
    )
    assert result.result == geomjax.FIT_RESULTS.unidentifiable
    assert np.all(np.isinf(result.errors()))
    assert np.all(result.values() > 0)
    assert abs(float(result.params["a"] * result.params["b"]) - 3.0) < 0.1  # the product is determined
    (direction,) = result.flat_directions()
    np.testing.assert_allclose(np.abs(direction), [math.sqrt(0.5)] * 2, atol=1e-6)
    assert direction[0] * direction[1] < 0  # log a − log b: a/b is what the data cannot see
    assert "flat along 0.707·log a − 0.707·log b" in result.message, result.message
    assert "not identifiable" in result.summary()


def test_failed_runs_are_reported(spring_data):
    # k = a·b = 1e20: RK4 at h = 0.1 overflows in a few steps
    result = geomjax.fit(
        spring, {"a": 1e10, "b": 1e10}, SPRING_STARTS, spring_data, observe=position, throw=False, **SPRING
    )
    assert result.result == geomjax.FIT_RESULTS.integration_failed
    assert result.message.startswith("integration failed at the initial guess: 2 of 2 runs failed"), result.message
    assert "non-finite" in result.message


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="not positive"):
        geomjax.fit(spring, {"a": -1.0, "b": 1.0}, SPRING_STARTS, np.zeros((2, 10, 1)), dt=0.1)
    with pytest.raises(ValueError, match="x0 has 2 initial states but data has 3"):
        geomjax.fit(spring, {"a": 1.0, "b": 1.0}, SPRING_STARTS, np.zeros((3, 10, 1)), dt=0.1)
    with pytest.raises(ValueError, match="data must be observations"):
        geomjax.fit(spring, {"a": 1.0, "b": 1.0}, SPRING_STARTS, np.zeros((1, 2, 3, 10, 1)), dt=0.1)
    with pytest.raises(TypeError, match="cannot run inside jax.jit"):
        jax.jit(lambda d: geomjax.fit(spring, {"a": 1.0, "b": 1.0}, SPRING_STARTS, d, dt=0.1))(np.zeros((2, 10, 1)))
    with pytest.raises(TypeError, match="optax GradientTransformation"):
        geomjax.fit(spring, {"a": 1.0}, SPRING_STARTS, np.zeros((2, 10, 1)), dt=0.1, optimizer="adam")


# --------------------------------------------------------------------------------------
# Extended: the coverage over fifty datasets per problem (benchmarks/fit_coverage.py)


@pytest.mark.extended
def test_coverage_over_fifty_datasets():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "benchmarks" / "fit_coverage.py"
    spec = importlib.util.spec_from_file_location("fit_coverage", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, problem in module.PROBLEMS.items():
        report = module.coverage(problem, datasets=50)
        assert report["failed"] == 0, (name, report)
        for parameter, fraction in report["coverage"].items():
            assert fraction >= 0.9, (name, parameter, fraction)


def test_fit_passes_on_only_the_options_of_its_runs():
    """`**options` is an allow-list of `integrate`'s keywords: anything else is a
    TypeError that names what the runs take (a typo is never silently dropped or passed)."""
    import pytest

    model = geomjax.models.spherical_pendulum(holonomic=True)
    make = lambda p: geomjax.rattle(geomjax.models.spherical_pendulum(g=p["g"], holonomic=True).system)  # noqa: E731
    data = jnp.zeros((1, 3, 6))
    for bad, words in (("steps", "follow from the data"), ("t1", "follow from the data"), ("drift_tl", "not an option")):
        with pytest.raises(TypeError, match=words) as info:
            geomjax.fit(make, {"g": 9.0}, model.x0[None], data, dt=0.01, **{bad: 1})
        assert "t0, args, drift_tol, start_tol, checkpoint" in str(info.value)


def test_fit_sees_the_integrators_error_at_dt():
    """Data from a 64× finer run (no integrator error to speak of), fitted with RATTLE at a
    coarse step: the refit at dt/2 that `step_check` estimates (one Gauss–Newton step)
    matches the actual refit at dt/2 to 2 %, is past 0.3 standard errors, and the result
    says so; with step_check=False the same fit is a success."""
    model = geomjax.models.spherical_pendulum(holonomic=True)
    ref = geomjax.integrate(geomjax.rattle(model.system), model.x0, dt=0.05 / 64, steps=64 * 20, save_every=64)
    data = (np.asarray(ref.xs[1:, :3]) + 2e-4 * np.random.default_rng(0).standard_normal((20, 3)))[None]
    make = lambda p: geomjax.rattle(geomjax.models.spherical_pendulum(g=p["g"], holonomic=True).system)  # noqa: E731
    fit = lambda dt, k, **kw: geomjax.fit(make, {"g": 1.1}, model.x0[None], data, dt=dt, save_every=k,  # noqa: E731
                                          observe=lambda x: x[:3], throw=False, **kw)
    coarse, half = fit(0.0125, 4), fit(0.00625, 8, step_check=False)
    actual = (float(half.params["g"]) - float(coarse.params["g"])) / float(coarse.standard_errors["g"])
    assert coarse.result == geomjax.FIT_RESULTS.discretization_bias, coarse.message
    assert abs(float(coarse.step_shift[0]) - actual) <= 0.02 * abs(actual) and abs(actual) > 0.3
    assert "g moves by" in coarse.message and "save_every doubled" in coarse.message
    assert half.result == geomjax.FIT_RESULTS.successful
