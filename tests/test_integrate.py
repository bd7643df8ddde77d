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


def test_progress_and_checkpoint_options_do_not_change_the_result(spherical, spherical_dirac, capsys):
    kw = dict(dt=0.01, steps=200, method="euler", save_every=5, drift_tol=None)
    base = geomjax.integrate(spherical_dirac, spherical.x0, **kw)
    chunked = geomjax.integrate(spherical_dirac, spherical.x0, progress="my run", **kw)
    # one bar, left on screen at 100 %
    bars = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if "my run" in line]
    assert bars and "100%" in bars[-1]
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


# --- what a failure message says ----------------------------------------------------


def test_drift_message_names_the_quantity_its_value_and_the_default_method(spherical, spherical_dirac):
    """Explicit Euler on the Dirac field stops at step 4906: the message names H, its
    drift there and the tolerance; a run with the default method (RK4 for a Dirac field)
    says the method was the default."""
    with pytest.raises(geomjax.IntegrationError) as err:
        geomjax.integrate(spherical_dirac, spherical.x0, dt=1e-3, steps=10_000, method="euler")
    sol, text = err.value.solution, str(err.value)
    assert int(sol.failed_step) == 4906 and text == sol.message
    assert "At that save the first integral H had drifted by 0.0100023" in text
    assert "against drift_tol = 0.01" in text
    default = geomjax.integrate(spherical_dirac, spherical.x0, dt=0.2, steps=600, save_every=100, throw=False)
    assert "first integral" in default.message
    assert 'the default for this field, "rk4"' in default.message and 'method="gauss4"' in default.message
    # The numbers behind it: H is entry 2 of (f1, f2, H, J), at the saved failing state.
    assert sol.detail.labels == (("f1", "f2", "H", "J"), ())
    assert int(sol.detail.quantity) == 2
    drift = abs(spherical_quantities(sol.xs[4906])[2] - 1.0) / 2.0
    assert float(sol.detail.value) == pytest.approx(float(drift), rel=1e-12)
    # An explicit method is not the default: no note.
    assert "default" not in text


def test_drift_detail_under_jit_and_vmap(spherical, spherical_dirac):
    """Traced runs carry the same detail for `message` outside; under jit, throw=True
    raises the cause with a pointer to sol.message (its sentence is fixed at trace time)."""
    run = lambda x0: geomjax.integrate(spherical_dirac, x0, dt=0.2, steps=600, save_every=100, throw=False)
    eager = run(spherical.x0)
    batch = jax.jit(jax.vmap(run))(jnp.stack([spherical.x0, spherical.x0]))
    assert batch.message == f"2 of 2 runs failed; run 0: {eager.message}"
    assert "first integral H had drifted by" in eager.message
    thrown = jax.jit(lambda x0: geomjax.integrate(spherical_dirac, x0, dt=0.2, steps=600, save_every=100).xs)
    with pytest.raises(Exception, match="are in sol.message") as err:
        thrown(spherical.x0)
    assert "a first integral drifted further than drift_tol" in str(err.value)
    assert 'the default for this field, "rk4"' in str(err.value)


def test_constraint_violation_uses_the_systems_names():
    """A free particle on the sphere under Euler leaves |q|² = 1 first: the message names
    the residual by the name the System was given, with the bound drift_tol·(1 + max|x0|)."""
    system = geomjax.System(
        lambda x: 0.5 * x[3:] @ x[3:],
        geomjax.canonical(3),
        holonomic=lambda q: jnp.atleast_1d(q @ q - 1.0),
        names=("rod", "rod speed", "energy"),
    )
    assert system.quantity_labels(jnp.zeros(6)) == (("energy",), ("rod", "rod speed"))
    unnamed = geomjax.System(system.hamiltonian, system.structure, holonomic=system.holonomic)
    assert unnamed.quantity_labels(jnp.zeros(6)) == (("H",), ("g", "gdot"))
    # a step without a system: its residuals by index
    great_circle, _ = geomjax.models.pendulum_flows(geomjax.models.spherical_pendulum())
    assert great_circle.quantity_labels(jnp.zeros(6)) == ((), ("[0]", "[1]"))
    with pytest.raises(ValueError, match="names has 2 entries.*have 3"):
        geomjax.System(system.hamiltonian, system.structure, holonomic=system.holonomic, names=("a", "b"))
    x0 = jnp.array([0.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    sol = geomjax.integrate(geomjax.dirac_field(system), x0, dt=1e-2, steps=2000, save_every=10, method="euler", throw=False)
    assert sol.result == geomjax.RESULTS.constraint_violation
    assert "At that save the constraint residual rod was 0.0202" in sol.message
    assert "against drift_tol·(1 + max|x0|) = 0.02" in sol.message


# --- long save blocks in parts (Ctrl-C acts between them) ----------------------------


def _recording(monkeypatch, on_part=None):
    """Record the programs the driver compiles and calls; `on_part(n)` runs after the
    n-th call of a part of a save block."""
    import geomjax._driver.integrate as driver

    calls = []
    real = driver.compiled_call

    def recorded(program, *rest):
        out = real(program, *rest)
        calls.append(program.__name__)
        if on_part is not None and program.__name__ == "_block_part":
            on_part(calls.count("_block_part"))
        return out

    monkeypatch.setattr(driver, "compiled_call", recorded)
    return calls


def test_long_save_blocks_run_in_parts_with_the_results_of_one_call(monkeypatch, spherical, spherical_dirac):
    """A save block longer than the chunk size runs in compiled parts, checked and saved
    at its end: the same states, statuses and step counts as one call, for a successful
    run, a drift caught at a save and a blow-up inside a part; the bar advances per part."""
    import geomjax._driver.integrate as driver

    feedback = geomjax.feedback_field(spherical.system, gains=50.0)
    blow_up = geomjax.FunctionStep(lambda x, h: jnp.where(x > 30.0, jnp.inf, x + h))
    cases = [
        (feedback, spherical.x0, dict(dt=1e-3, steps=300, save_every=150)),
        (spherical_dirac, spherical.x0, dict(dt=0.05, steps=600, save_every=200, method="euler")),
        (blow_up, jnp.zeros(1), dict(dt=1.0, steps=200, save_every=100)),
    ]
    whole = [geomjax.integrate(f, x0, throw=False, **kw) for f, x0, kw in cases]
    assert [r.status_name for r in whole] == ["successful", "invariant_drift", "diverged"]
    monkeypatch.setattr(driver, "_CHUNK_STEPS", 64)
    updates = []

    class Bar:
        update = staticmethod(updates.append)
        close = staticmethod(lambda: None)

    monkeypatch.setattr(driver, "_progress_bar", lambda total, progress: Bar())
    calls = _recording(monkeypatch)
    for (f, x0, kw), one in zip(cases, whole):
        split = geomjax.integrate(f, x0, throw=False, progress=True, **kw)
        np.testing.assert_array_equal(np.asarray(split.xs), np.asarray(one.xs))
        np.testing.assert_array_equal(np.asarray(split.ts), np.asarray(one.ts))
        for name in ("status", "failed_step", "num_steps"):
            assert int(getattr(split, name)) == int(getattr(one, name)), name
        assert split.message == one.message
    assert updates[:5] == [64, 64, 22, 64, 64]  # blocks of 150 steps: 64 + 64 + 22
    # blocks of 150, 200 and 100 steps in parts of at most 64
    assert calls.count("_block_part") == 2 * 3 + 3 * 4 + 2 * 2 and "_whole_run" not in calls


def test_ctrl_c_between_parts_of_a_save_block_stops_the_run(monkeypatch):
    """A SIGINT during one compiled part surfaces as KeyboardInterrupt before the next
    part starts (one save block of 2⁸ steps in parts of 2⁴ here)."""
    import signal

    import geomjax._driver.integrate as driver

    monkeypatch.setattr(driver, "_CHUNK_STEPS", 16)

    def interrupt(n):
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.raise_signal(signal.SIGINT)  # what Ctrl-C does
        else:
            raise KeyboardInterrupt

    calls = _recording(monkeypatch, interrupt)
    step = geomjax.FunctionStep(lambda x, h: x + h)
    with pytest.raises(KeyboardInterrupt):
        geomjax.integrate(step, jnp.zeros(1), dt=1.0, steps=256, save_every=256)
    assert calls.count("_block_part") == 1


# --- the opt-in accuracy check ---------------------------------------------------------


def test_accuracy_check_catches_what_the_monitors_miss(planar):
    """Implicit midpoint (gauss2) at h = 0.5 keeps f and H of the planar pendulum to
    round-off and reports success, with a phase error above 0.1 by t = 10;
    accuracy_tol=1e-3 fails it at the first save, with the measured difference to the
    run at dt/2. An accurate RK4 run passes the same check."""
    field = geomjax.dirac_field(planar.system)
    kw = dict(dt=0.5, steps=20, save_every=5, method="gauss2")
    plain = geomjax.integrate(field, planar.x0, **kw)
    inv = np.asarray(jax.vmap(planar.system.invariants)(plain.xs))
    assert plain.ok and np.max(np.abs(inv - inv[0])) < 1e-12
    reference = geomjax.integrate(field, planar.x0, dt=0.01, steps=1000, save_every=250, method="rk4")
    assert np.max(np.abs(np.asarray(plain.xs - reference.xs))) > 0.1
    checked = geomjax.integrate(field, planar.x0, accuracy_tol=1e-3, throw=False, **kw)
    assert checked.result == geomjax.RESULTS.inaccurate
    assert int(checked.failed_step) == 5 and int(checked.num_steps) == 4
    half = geomjax.integrate(field, planar.x0, dt=0.25, steps=40, save_every=10, method="gauss2")
    x, y = np.asarray(plain.xs[1]), np.asarray(half.xs[1])
    assert float(checked.detail.value) == pytest.approx(np.max(np.abs(x - y)) / (1 + np.max(np.abs(y))), rel=1e-12)
    np.testing.assert_array_equal(np.asarray(checked.xs[:2]), np.asarray(plain.xs[:2]))
    assert np.all(np.isnan(np.asarray(checked.xs[2:])))
    with pytest.raises(geomjax.IntegrationError, match=r"differed from the run at dt/2 by 0\.0476.*accuracy_tol = 0\.001"):
        geomjax.integrate(field, planar.x0, accuracy_tol=1e-3, **kw)
    accurate = geomjax.integrate(field, planar.x0, dt=0.01, steps=1000, save_every=250, method="rk4", accuracy_tol=1e-6)
    assert accurate.ok
    with pytest.raises(ValueError, match="accuracy_tol must be a positive number"):
        geomjax.integrate(field, planar.x0, accuracy_tol=0.0, **kw)


def test_accuracy_check_is_a_status_under_jit_and_vmap(planar):
    """RK4 on the planar pendulum: at h = 0.01 it agrees with h/2 to 1e-4, at h = 0.3 not."""
    field = geomjax.dirac_field(planar.system)

    def run(dt):
        return geomjax.integrate(field, planar.x0, dt=dt, steps=40, save_every=10, method="rk4", accuracy_tol=1e-4, throw=False)

    sols = jax.jit(jax.vmap(run))(jnp.array([0.01, 0.3]))
    assert sols.status_name.tolist() == ["successful", "inaccurate"]
    assert "run 1: integration failed at step" in sols.message and "differed from the run at dt/2" in sols.message
