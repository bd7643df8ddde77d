"""The fixed-step driver: convergence orders, the effect of feedback (seed 000 §2.3), an
exact period of the planar pendulum, and the shape and bookkeeping of `Solution`."""

import geomjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import spherical_quantities
from scipy.special import ellipk


@pytest.fixture(scope="module")
def spherical_dirac(spherical):
    return geomjax.dirac_field(spherical.system)


@pytest.fixture(scope="module")
def reference_t1(spherical, spherical_dirac):
    """x(1) of the spherical pendulum: RK4 with h = 1/2000 (error ≈ 1e-14, far below the tested errors)."""
    sol = geomjax.integrate(spherical_dirac, spherical.x0, dt=1.0 / 2000, steps=2000, method="rk4", save_every=2000)
    return np.asarray(sol.x_final)


def test_named_methods_are_registered():
    names = geomjax.method_names()
    for name, order in [("euler", 1), ("heun", 2), ("rk4", 4)]:
        assert name in names
        assert geomjax.method_order(name) == order


@pytest.mark.parametrize(
    "method, order, steps",
    [("euler", 1, (50, 100, 200, 400)), ("heun", 2, (20, 40, 80, 160)), ("rk4", 4, (10, 20, 40, 80))],
)
def test_measured_convergence_order(spherical, spherical_dirac, reference_t1, method, order, steps):
    """Least-squares slope of log(error at t = 1) against log(h) on the nonlinear spherical pendulum."""
    hs, errors = [], []
    for n in steps:
        # Coarse steps are the point here: drift monitoring off.
        sol = geomjax.integrate(
            spherical_dirac, spherical.x0, dt=1.0 / n, steps=n, method=method, save_every=n, drift_tol=None
        )
        assert float(sol.ts[-1]) == pytest.approx(1.0, abs=1e-12)
        hs.append(1.0 / n)
        errors.append(np.linalg.norm(np.asarray(sol.x_final) - reference_t1))
    errors = np.array(errors)
    assert np.all(errors > 1e-12), "errors at round-off level: the measured order would be meaningless"
    assert np.all(np.diff(errors) < 0)
    slope = np.polyfit(np.log(hs), np.log(errors), 1)[0]
    assert abs(slope - order) <= 0.3, (method, slope, errors)


def test_feedback_lowers_invariant_errors_of_euler(spherical):
    """Seed 000 §2.3: Euler, h = 1e-3, t ∈ [0, 100], k₁..k₄ = 50, with and without feedback.

    Measured here: without feedback max|Δf₁|, |ΔH|, |ΔJ| reach 0.27, 0.40, 0.28 (they drift),
    |Δf₂| about 1e-3 (bounded); with feedback all four stay below 5e-5.
    """
    x0 = spherical.x0
    plain = geomjax.dirac_field(spherical.system)
    feedback = geomjax.feedback_field(spherical.system, x0, gains=[50.0, 50.0, 50.0, 50.0])
    errs = {}
    # Without feedback the constraints leave the default tolerance: the run says so.
    with pytest.raises(geomjax.IntegrationError, match="drift_tol|constraint"):
        geomjax.integrate(plain, x0, dt=1e-3, steps=100_000, method="euler", save_every=100)
    for name, field in [("plain", plain), ("feedback", feedback)]:
        tol = None if name == "plain" else geomjax.integrate.__kwdefaults__["drift_tol"]
        sol = geomjax.integrate(field, x0, dt=1e-3, steps=100_000, method="euler", save_every=100, drift_tol=tol)
        assert sol.xs.shape == (1001, 6)
        assert bool(sol.ok)
        errs[name] = np.abs(np.asarray(spherical_quantities(sol.xs) - spherical_quantities(x0))).max(axis=0)
    ratio = errs["plain"] / errs["feedback"]
    f1, f2, h, j = range(4)
    assert np.all(errs["feedback"] < 1e-4), errs["feedback"]
    for i in (f1, h, j):
        assert ratio[i] > 100, (ratio, errs)
    # f₂ = q·p: plain Euler keeps it bounded near 1e-3, so the gain is smaller (measured ≈ 58).
    assert ratio[f2] > 10, (ratio, errs)
    assert errs["plain"].max() / errs["feedback"].max() > 1000


def test_feedback_errors_do_not_drift(spherical):
    """With feedback the invariant errors settle: the last fifth is no worse than the first half."""
    x0 = spherical.x0
    feedback = geomjax.feedback_field(spherical.system, x0, gains=50.0)
    sol = geomjax.integrate(feedback, x0, dt=1e-3, steps=20_000, method="euler", save_every=100)
    err = np.abs(np.asarray(spherical_quantities(sol.xs) - spherical_quantities(x0)))
    n = err.shape[0]
    assert np.all(err[4 * n // 5 :].max(axis=0) <= 1.5 * err[: n // 2].max(axis=0) + 1e-12)


@pytest.mark.parametrize("g, ell", [(1.0, 1.0), (2.5, 0.8)])
def test_planar_pendulum_period(g, ell):
    """Released from the horizontal, the pendulum swings through 90° either side of the
    vertical: period T = 4 K(k² = ½) √(ℓ/g) (≈ 7.4163 for g = ℓ = 1, seed 000 §2.4).
    After T/2 it is at (−ℓ, 0) at rest, after T back at x0."""
    model = geomjax.models.planar_pendulum(g=g, length=ell)
    period = 4.0 * ellipk(0.5) * np.sqrt(ell / g)
    if g == 1.0 and ell == 1.0:
        assert period == pytest.approx(7.4163, abs=1e-4)
    field = geomjax.dirac_field(model.system)
    n = 2000
    sol = geomjax.integrate(field, model.x0, dt=period / n, steps=n, method="rk4", save_every=n // 2)
    xs = np.asarray(sol.xs)
    np.testing.assert_allclose(xs[1], [-ell, 0.0, 0.0, 0.0], atol=1e-8 * max(1.0, np.sqrt(g * ell)))
    np.testing.assert_allclose(xs[2], np.asarray(model.x0), atol=1e-8 * max(1.0, np.sqrt(g * ell)))
    # A quarter-period off, the pendulum would be at the bottom: the check is sharp.
    assert np.abs(xs[1, 1]) < 1e-7


def test_solution_bookkeeping(spherical, spherical_dirac):
    sol = geomjax.integrate(spherical_dirac, spherical.x0, dt=0.01, steps=60, method="heun", save_every=20, t0=2.0)
    assert isinstance(sol, geomjax.Solution)
    assert sol.xs.shape == (4, 6)
    np.testing.assert_allclose(sol.ts, [2.0, 2.2, 2.4, 2.6], rtol=1e-14)
    np.testing.assert_array_equal(sol.xs[0], spherical.x0)
    np.testing.assert_array_equal(sol.x_final, sol.xs[-1])
    assert int(sol.status) == 0 and bool(sol.ok)
    assert int(sol.failed_step) == -1
    assert int(sol.num_steps) == 60
    assert sol.message == "success"
    # Saving every step gives the same states at the common times.
    dense = geomjax.integrate(spherical_dirac, spherical.x0, dt=0.01, steps=60, method="heun", save_every=1)
    np.testing.assert_allclose(dense.xs[::20], sol.xs, rtol=1e-14, atol=1e-15)


def test_step_map_matches_hand_rk4(spherical, spherical_dirac):
    """One RK4 step of the derived field equals the classical formula applied by hand."""
    x, h = spherical.x0, 0.05
    f = spherical_dirac
    k1 = f(x)
    k2 = f(x + h / 2 * k1)
    k3 = f(x + h / 2 * k2)
    k4 = f(x + h * k3)
    expected = x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    step = geomjax.explicit_rk(f, geomjax.RK4)
    np.testing.assert_allclose(step(x, h), expected, rtol=1e-14, atol=1e-15)
    sol = geomjax.integrate(f, x, dt=h, steps=1, method="rk4")
    np.testing.assert_allclose(sol.x_final, expected, rtol=1e-14, atol=1e-15)


def test_integrate_under_jit_and_vmap_over_initial_states(spherical, spherical_dirac, rng):
    """A batch of initial states on T*S² integrated under jit(vmap(...)) equals one-by-one runs."""

    def final(x0):
        return geomjax.integrate(spherical_dirac, x0, dt=0.01, steps=50, method="rk4", save_every=50).x_final

    batch = []
    for _ in range(4):
        q = rng.normal(size=3)
        q /= np.linalg.norm(q)
        p = rng.normal(size=3)
        p -= (p @ q) * q
        batch.append(np.concatenate([q, p]))
    batch = jnp.asarray(np.array(batch))
    out = jax.jit(jax.vmap(final))(batch)
    assert out.shape == (4, 6)
    for i in range(4):
        np.testing.assert_allclose(out[i], final(batch[i]), rtol=1e-13, atol=1e-14)
    assert len({float(v) for v in out[:, 2]}) == 4


def test_progress_and_checkpoint_options_do_not_change_the_result(spherical, spherical_dirac):
    kw = dict(dt=0.01, steps=200, method="euler", save_every=5, drift_tol=None)
    base = geomjax.integrate(spherical_dirac, spherical.x0, **kw)
    chunked = geomjax.integrate(spherical_dirac, spherical.x0, progress=True, **kw)
    plain = geomjax.integrate(spherical_dirac, spherical.x0, checkpoint=False, **kw)
    np.testing.assert_array_equal(chunked.xs, base.xs)
    np.testing.assert_array_equal(chunked.ts, base.ts)
    np.testing.assert_array_equal(plain.xs, base.xs)


def test_euler_step_limit_predicts_feedback_blow_up(spherical):
    """h·λ_max(∇²V) < 2: below the predicted limit feedback Euler is stable, above it blows up."""
    gains = 50.0
    field = geomjax.feedback_field(spherical.system, spherical.x0, gains=gains)
    limit = float(field.euler_step_limit(spherical.x0))
    # On V⁻¹(0), ∇²V = DFᵀ K DF, so λ_max is K times the largest squared singular value of DF.
    jac = jax.jacfwd(spherical.system.conserved_quantities)(spherical.x0)
    expected = 2.0 / (gains * np.linalg.svd(np.asarray(jac), compute_uv=False)[0] ** 2)
    assert limit == pytest.approx(expected, rel=1e-10)
    stable = geomjax.integrate(field, spherical.x0, dt=0.5 * limit, steps=400, save_every=400)
    assert bool(stable.ok)
    err = spherical_quantities(stable.xs[-1]) - spherical_quantities(spherical.x0)
    assert float(jnp.max(jnp.abs(err))) < 1e-2
    with pytest.raises(geomjax.IntegrationError, match="stability limit"):
        geomjax.integrate(field, spherical.x0, dt=3.0 * limit, steps=400, save_every=400)


def test_status_name_reads_the_status_one_run_and_under_vmap():
    blow_up = geomjax.FunctionStep(lambda x, h: x / (x - 2.0))  # x = 2 → inf at the first step
    runs = jax.vmap(lambda x: geomjax.integrate(blow_up, x, dt=0.1, steps=3, throw=False))(jnp.array([[1.0], [2.0]]))
    assert runs.status_name.tolist() == ["successful", "nonfinite_first_step"]
    one = geomjax.integrate(blow_up, jnp.array([1.0]), dt=0.1, steps=3)
    assert one.status_name == "successful" and isinstance(one.status_name, str)
