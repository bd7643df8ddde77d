"""Choosing feedback gains: stability intervals, the feedback rate, the rule of thumb and
its accuracy warning, Bae & Chang's adaptive gain, and gradient-based tuning with optax."""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import geomjax
from geomjax._tuning.tune import _initial_theta, _objective, _with_theta

PENDULUM = geomjax.models.spherical_pendulum()


def _double_pendulum_starts(count, seed):
    rng = np.random.default_rng(seed)
    return np.stack([
        np.asarray(geomjax.models.planar_chain(2, gravity=9.81, angles=rng.uniform(-1.0, 1.0, 2),
                                               angular_velocities=rng.uniform(-1.0, 1.0, 2)).x0)
        for _ in range(count)
    ])


def test_stability_intervals_match_the_stability_polynomials():
    # Explicit RK of order p = s ≤ 4: R(z) = Σ_{j≤p} z^j/j!; β is the first x > 0 with
    # |R(−x)| = 1, i.e. a root of R(−x) − 1 or R(−x) + 1.
    for name, p in (("euler", 1), ("heun", 2), ("rk3", 3), ("rk4", 4)):
        coeffs = [(-1.0) ** j / np.prod(np.arange(1, j + 1)) for j in range(p + 1)]  # R(−x), low → high
        roots = []
        for shift in (-1.0, 1.0):
            c = np.array(coeffs)
            c[0] += shift
            r = np.roots(c[::-1])
            roots += [z.real for z in r if abs(z.imag) < 1e-9 and z.real > 1e-9]
        assert geomjax.stability_interval(name) == pytest.approx(min(roots), abs=1e-8)
    # Adams–Bashforth k = 2, 3, 4 (multistep: the roots of ζ^k − ζ^{k−1} + x·σ(ζ), not the
    # starter's one step): the intervals 1, 6/11, 3/10 of the textbooks.
    for name, beta in (("ab2", 1.0), ("ab3", 6.0 / 11.0), ("ab4", 0.3)):
        assert geomjax.stability_interval(name) == pytest.approx(beta, abs=1e-8)
    assert geomjax.stability_interval("gauss4") == np.inf
    assert geomjax.stability_interval("implicit_midpoint") == np.inf


def test_feedback_rate_is_the_largest_eigenvalue_of_DF_K_DF_and_linear_in_K():
    gains = np.array([3.0, 10.0, 50.0, 7.0])
    Y = geomjax.feedback_field(PENDULUM.system, PENDULUM.x0, gains)
    DF = np.asarray(jax.jacfwd(PENDULUM.system.conserved_quantities)(PENDULUM.x0))
    expected = np.linalg.eigvalsh(DF.T @ np.diag(gains) @ DF).max()
    assert float(geomjax.feedback_rate(Y, PENDULUM.x0)) == pytest.approx(expected, rel=1e-12)
    Y2 = geomjax.feedback_field(PENDULUM.system, PENDULUM.x0, 2.5 * gains)
    assert float(geomjax.feedback_rate(Y2, PENDULUM.x0)) == pytest.approx(2.5 * expected, rel=1e-12)
    assert float(Y.euler_step_limit(PENDULUM.x0)) == pytest.approx(2.0 / expected, rel=1e-12)
    # A scalar metric scales the rate; an SPD matrix metric gives λ_max(L DFᵀKDF).
    ell = np.diag([1.0, 2.0, 0.5, 1.0, 3.0, 1.0])
    Z = geomjax.feedback_field(PENDULUM.system, PENDULUM.x0, gains, metric=ell)
    lam = np.linalg.eigvals(ell @ DF.T @ np.diag(gains) @ DF).real.max()
    assert float(geomjax.feedback_rate(Z, PENDULUM.x0)) == pytest.approx(lam, rel=1e-10)


def test_the_euler_bound_separates_stable_from_divergent_runs():
    h = 1e-2
    Y = geomjax.feedback_field(PENDULUM.system, PENDULUM.x0, 1.0)
    unit = float(geomjax.feedback_rate(Y, PENDULUM.x0))
    for fraction, stable in ((0.8, True), (1.3, False)):
        K = fraction * 2.0 / (h * unit)
        Z = geomjax.feedback_field(PENDULUM.system, PENDULUM.x0, K)
        check = geomjax.check_gains(Z, PENDULUM.x0, h, "euler")
        assert check.stability_fraction == pytest.approx(fraction, rel=1e-9)
        assert bool(check.messages) == (not stable)
        # Past the bound the deviation from the invariant set grows by |1 − hλ| > 1 per
        # step until it saturates in a large oscillation, which the drift check reports.
        sol = geomjax.integrate(Z, PENDULUM.x0, dt=h, steps=400, method="euler", throw=False)
        assert bool(sol.ok) == stable, sol.message
        if not stable:
            assert sol.result == geomjax.RESULTS.invariant_drift and int(sol.failed_step) < 100


@pytest.mark.extended  # 8 s; the rule of thumb for Euler is checked by test_defaults and the docs' gains page
def test_rule_of_thumb_and_the_accuracy_warning_for_feedback_rk4():
    knife = geomjax.models.knife_edge()
    plain = geomjax.nonholonomic_field(knife.system)
    h, steps = 1e-2, 500
    default = geomjax.feedback_field(knife.system, knife.x0, 1.0)

    def drift(field):
        sol = geomjax.integrate(field, knife.x0, dt=h, steps=steps, method="rk4", save_every=250, drift_tol=None)
        dev = jax.vmap(default.quantities)(sol.xs) - default.quantities(knife.x0)
        return float(jnp.abs(dev).max())

    with pytest.warns(geomjax.FeedbackAccuracyWarning, match="expected to cost accuracy"):
        check = geomjax.check_gains(default, knife.x0, h, "rk4")
    assert check.feedback_rate > check.dynamics_rate
    K = geomjax.recommended_gains(default, knife.x0, h, "rk4")
    tuned = geomjax.feedback_field(knife.system, knife.x0, K)
    with warnings.catch_warnings():
        warnings.simplefilter("error", geomjax.FeedbackAccuracyWarning)
        again = geomjax.check_gains(tuned, knife.x0, h, "rk4")
    assert again.feedback_rate == pytest.approx(0.1 * again.dynamics_rate, rel=1e-9)
    base, with_default, with_rule = drift(plain), drift(default), drift(tuned)
    assert with_default > 20 * base  # the warning was right
    assert with_rule < 2 * base  # the rule of thumb keeps RK4's accuracy
    # First order: h·λ_max = 1 (Bae & Chang's α = 1/(hL)).
    Ke = geomjax.recommended_gains(default, knife.x0, h, "euler")
    Ye = geomjax.feedback_field(knife.system, knife.x0, Ke)
    assert h * float(geomjax.feedback_rate(Ye, knife.x0)) == pytest.approx(1.0, rel=1e-9)


@pytest.mark.extended  # 6.5 s; the adaptive gain runs in the docs' gains page
def test_adaptive_gain_matches_its_definition_on_a_known_lyapunov_function():
    # Harmonic oscillator, F = (H): V = k/2 (H − H₀)², ∇V = k(H − H₀)∇H, and on the
    # invariant set ∇²V = k∇H∇Hᵀ = DFᵀKDF, whose Frobenius norm is k|∇H|²:
    # α = 1/(h·max(floor, c·k|∇H|²)).
    system = geomjax.System(lambda x: 0.5 * jnp.sum(x * x), geomjax.canonical(1))
    x0 = jnp.array([1.0, 0.0])
    k, h, c = 3.0, 0.05, 1.1
    Y = geomjax.feedback_field(system, x0, k)
    A = Y.adaptive(dt=h, safety=c)
    x = jnp.array([0.9, 0.3])
    dH = x
    dev = 0.5 * jnp.sum(x * x) - 0.5
    alpha = 1.0 / (h * c * k * jnp.sum(dH * dH))
    assert float(A.scale(x)) == pytest.approx(float(alpha), rel=1e-13)
    on_set = x0
    assert float(jnp.sqrt(jnp.sum(jax.hessian(Y.lyapunov)(on_set) ** 2))) == pytest.approx(k * float(on_set @ on_set), rel=1e-13)
    expected = jnp.array([x[1], -x[0]]) - alpha * k * dev * dH
    np.testing.assert_allclose(np.asarray(A(x)), np.asarray(expected), rtol=1e-13)
    # On an embedded group (k₀/4‖RᵀR − I‖² in V, a matrix metric) the Gauss–Newton
    # Hessian the rule uses is ∇²V on the invariant set.
    from geomjax._field.feedback_terms import gauss_newton_hessian

    body = geomjax.models.rigid_body()
    R = geomjax.feedback_field(body.system, body.x0, body.gains, body.metric)
    np.testing.assert_allclose(np.asarray(gauss_newton_hessian(R, body.x0)), np.asarray(jax.hessian(R.lyapunov)(body.x0)),
                               atol=1e-12 * float(jnp.abs(jax.hessian(R.lyapunov)(body.x0)).max()))
    # h·α·λ_max ≤ 1/c along the way, where fixed gains past the bound diverge.
    fixed = geomjax.feedback_field(PENDULUM.system, PENDULUM.x0, 50.0)
    h = 2e-2
    assert h * float(geomjax.feedback_rate(fixed, PENDULUM.x0)) > 2.0
    assert not bool(geomjax.integrate(fixed, PENDULUM.x0, dt=h, steps=500, method="euler", throw=False).ok)
    sol = geomjax.integrate(fixed.adaptive(dt=h), PENDULUM.x0, dt=h, steps=500, method="euler", drift_tol=None)
    H = PENDULUM.system.hamiltonian
    assert abs(float(H(sol.xs[-1]) - H(PENDULUM.x0))) < 1e-2
    with pytest.raises(ValueError, match="positive safety"):
        fixed.adaptive(dt=h, safety=-1.0)


@pytest.fixture(scope="module")
def double_pendulum():
    model = geomjax.models.planar_chain(2, gravity=9.81)
    return model, _double_pendulum_starts(4, 1), _double_pendulum_starts(4, 2)


@pytest.mark.extended  # 7 s; tune_gains against the papers' gains is also the gain-tuning experiment's test (tests/test_gain_tuning_experiment.py)
def test_tuning_beats_the_papers_gains_on_held_out_states_and_keeps_the_bound(double_pendulum):
    model, train, test = double_pendulum
    h, steps = 1e-3, 200
    paper = geomjax.feedback_field(model.system, model.x0, 50.0)  # seed 000's pendulum gains
    assert geomjax.check_gains(paper, train, h).stability_fraction > 1.0
    value, _, failed = geomjax.feedback_objective(paper, test, dt=h, steps=steps)
    assert failed == len(test) and value == np.inf  # every held-out run blows up
    tuned = geomjax.tune_gains(paper, train, dt=h, steps=steps, iterations=3, held_out=test)
    # Projected onto the bound, the gains sit where the drift is at feedback Euler's
    # floor (its O(h²) local error, about 1e−3 here): the updates push the gains up and
    # the projection holds them at 0.9 of the bound.
    assert tuned.objective_after <= tuned.objective_before < -2.5
    assert np.all(np.asarray(tuned.history["stability_fraction"]) <= 0.9 + 1e-12)
    rates = [float(geomjax.feedback_rate(tuned.field.at_start(tuned.field.split(x)), x)) for x in train]
    assert h * max(rates) <= 0.9 * 2.0 * (1 + 1e-9)
    after, per_member, failed = geomjax.feedback_objective(tuned.field, test, dt=h, steps=steps)
    assert failed == 0 and after == pytest.approx(tuned.held_out_after, abs=1e-9)
    assert np.all(np.isfinite(per_member))
    assert "held-out objective" in tuned.summary()
    import matplotlib

    matplotlib.use("Agg")
    fig = tuned.plot()
    assert len(fig.axes) == 2 and fig.axes[0].lines
    # gains tuned alike (the two rods' constraints) are one curve, not curves hiding each other
    from geomjax.experiments._figure_check import figure_problems

    assert figure_problems(fig) == []


# the "reference" objective in the extended job (4 s): the same members and gradient path
@pytest.mark.parametrize("name", ["invariants", pytest.param("reference", marks=pytest.mark.extended)])
def test_gradient_of_the_objective_against_finite_differences(double_pendulum, name):
    model, train, _ = double_pendulum
    field = geomjax.feedback_field(model.system, model.x0, np.array([5.0, 8.0, 3.0, 2.0, 1.0]))
    for name in (name,):
        obj = _objective(name, dt=1e-3, steps=60, method="euler", save_every=20, checkpoint=True)
        states = jnp.asarray(train[:3])
        refs = obj.references(field, states)

        @jax.jit
        def loss(theta):
            values, _ = obj.members(_with_theta(field, theta, "vector", False), states, refs)
            return jnp.mean(values)

        theta = _initial_theta(field, "vector", False, field.system.dim)
        grad = jax.grad(loss)(theta)["gains"]
        eps = 1e-5
        fd = [
            (loss({"gains": theta["gains"].at[i].add(eps)}) - loss({"gains": theta["gains"].at[i].add(-eps)})) / (2 * eps)
            for i in range(5)
        ]
        np.testing.assert_allclose(np.asarray(grad), np.asarray(fd), rtol=2e-5, atol=1e-5 * np.abs(fd).max())


@pytest.mark.extended  # 17 s; the gradient against finite differences stays in the default run
def test_forward_and_reverse_mode_give_the_same_gradient(double_pendulum):
    """tune_gains' two ways of differentiating the penalised objective (the stability
    scaling active for the vector gains: h·λ past the bound at these gains)."""
    from geomjax._tuning.tune import _differentiation, _loss_and_grad, _loss_and_grad_forward

    model, train, _ = double_pendulum
    obj = _objective("invariants", dt=1e-3, steps=60, method="euler", save_every=20, checkpoint=True)
    states = jnp.asarray(train[:3])
    for kind, factor in (("scalar", 1.0), ("vector", 40.0)):
        field = geomjax.feedback_field(model.system, model.x0, np.array([5.0, 8.0, 3.0, 2.0, 1.0]) * factor)
        refs = obj.references(field, states)
        theta = _initial_theta(field, kind, False, field.system.dim)
        args = (obj, field, theta, states, states, refs, kind, False, 0.9, 2.0)
        (v_rev, f_rev), g_rev = _loss_and_grad(*args)
        (v_fwd, f_fwd), g_fwd = _loss_and_grad_forward(*args)
        assert float(v_fwd) == float(v_rev) and int(f_fwd) == int(f_rev) == 0
        assert np.all(np.abs(np.asarray(g_rev["gains"])) > 1e-6)
        np.testing.assert_allclose(np.asarray(g_fwd["gains"]), np.asarray(g_rev["gains"]), rtol=1e-9, atol=1e-12)
    scalar = {"gains": jnp.zeros(())}
    pendulum = geomjax.feedback_field(PENDULUM.system, PENDULUM.x0, 2.0)
    assert _differentiation("auto", scalar, pendulum, "rk4", PENDULUM.x0) == "forward"
    assert _differentiation("auto", {"gains": jnp.zeros(5)}, pendulum, "euler", PENDULUM.x0) == "reverse"
    # the double pendulum's field is above the written-out size: forward mode for Euler
    # only, reverse mode for several stages (unless asked for)
    assert _differentiation("auto", scalar, field, "euler", model.x0) == "forward"
    assert _differentiation("auto", scalar, field, "rk4", model.x0) == "reverse"
    assert _differentiation("forward", scalar, field, "rk4", model.x0) == "forward"
    with pytest.raises(ValueError, match="differentiation must be"):
        _differentiation("backward", scalar, field, "rk4", model.x0)


@pytest.mark.extended  # 11 s; scalar gains and the built-in objectives are tested in the default run
def test_matrix_gains_metric_reference_and_user_objectives():
    starts = np.stack([PENDULUM.x0, PENDULUM.x0 * np.array([1, 1, 1, 0.7, 1, 0.7])])
    Y = geomjax.feedback_field(PENDULUM.system, PENDULUM.x0, 2.0)
    tuned = geomjax.tune_gains(Y, starts, dt=1e-2, steps=100, iterations=3, gains="matrix",
                               tune_metric="diagonal", objective="reference", optimizer=optax.adam(0.3))
    assert tuned.gains.shape == (4, 4) and np.linalg.eigvalsh(tuned.gains).min() > 0
    assert tuned.metric.shape == (6, 6) and np.all(np.diag(tuned.metric) > 0)
    assert tuned.objective_after <= tuned.objective_before and tuned.objective == "reference"

    def final_energy_error(xs, x0):
        H = PENDULUM.system.hamiltonian
        return (H(xs[-1]) - H(x0)) ** 2

    user = geomjax.tune_gains(Y, starts, dt=1e-2, steps=100, iterations=3, gains="scalar", objective=final_energy_error,
                              optimizer=optax.adam(1.0))
    assert user.objective == "final_energy_error" and user.objective_after < user.objective_before


def test_bad_input_to_the_tuner():
    Y = geomjax.feedback_field(PENDULUM.system, PENDULUM.x0, 2.0)
    run = dict(dt=1e-2, steps=10)
    with pytest.raises(TypeError, match="feedback field"):
        geomjax.tune_gains(geomjax.dirac_field(PENDULUM.system), PENDULUM.x0, **run)
    with pytest.raises(ValueError, match="stability"):
        geomjax.tune_gains(Y, PENDULUM.x0, stability=1.5, **run)
    with pytest.raises(ValueError, match="gains must be one of"):
        geomjax.tune_gains(Y, PENDULUM.x0, gains="diagonal", **run)
    with pytest.raises(ValueError, match="length 5"):
        geomjax.tune_gains(Y, np.zeros((2, 5)), **run)
    with pytest.raises(ValueError, match="non-finite"):
        geomjax.tune_gains(Y, np.stack([PENDULUM.x0, np.full(6, np.nan)]), **run)
    with pytest.raises(ValueError, match="objective must be"):
        geomjax.tune_gains(Y, PENDULUM.x0, objective="energy", **run)
    with pytest.raises(ValueError, match="multiple of save_every"):
        geomjax.tune_gains(Y, PENDULUM.x0, save_every=3, **run)
    with pytest.raises(ValueError, match="iterations"):
        geomjax.tune_gains(Y, PENDULUM.x0, iterations=0, **run)
    assert eqx.is_array(Y.gains)


def test_no_wrong_objective_when_every_training_run_fails():
    # Starts at q = 0, where the constraint matrix is singular, fail at their first step:
    # nothing to tune on.
    Y = geomjax.feedback_field(PENDULUM.system, PENDULUM.x0, 2.0)
    off = np.array([[0.0, 0.0, 0.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.5, 0.2, 0.0]])
    value, per_member, failed = geomjax.feedback_objective(Y, off, dt=1e-2, steps=10)
    assert value == np.inf and failed == 2 and np.all(np.isnan(per_member))
    with pytest.warns(RuntimeWarning, match="no gains at which every training run succeeded"):
        tuned = geomjax.tune_gains(Y, off, dt=1e-2, steps=10, iterations=1)
    assert tuned.objective_after == np.inf and np.all(tuned.history["failed"] == 2)


def _released_near_the_top():
    return geomjax.models.planar_chain(2, gravity=9.81, angles=jnp.array([3.0, 3.0]), angular_velocities=jnp.zeros(2))


def test_gains_chosen_from_dt_hold_along_the_motion_not_only_at_x0():
    """A double pendulum released at rest near the top: the rates at x0 (no velocity) are
    far below those at the bottom of its swing, so gains chosen at x0 alone let feedback
    Euler at h = 3e−4 leave the constraint set at t = 1.44; chosen along the pilot run
    (the default) the same 3·10⁴ steps succeed, and the warning says where they came from."""
    import warnings

    model = _released_near_the_top()
    runs = {}
    for pilot in (0, 30_000):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            field = geomjax.feedback_field(model.system, model.x0, dt=3e-4, pilot_steps=pilot)
        runs[pilot] = (field, str(caught[0].message))
    alone = geomjax.integrate(runs[0][0], model.x0, dt=3e-4, steps=30_000, method="euler", save_every=100, throw=False)
    along = geomjax.integrate(runs[30_000][0], model.x0, dt=3e-4, steps=30_000, method="euler", save_every=100, throw=False)
    assert not bool(alone.ok) and bool(along.ok), (alone.message, along.message)
    assert float(jnp.max(runs[30_000][0].gains)) < 0.7 * float(jnp.max(runs[0][0].gains))
    assert "at the stiffest of" in runs[30_000][1] and "at x0 alone K would be" in runs[30_000][1]


@pytest.mark.extended
@pytest.mark.parametrize("name", ["double pendulum", "cart double pendulum", "3-link chain", "knife edge"])
def test_automatic_gains_hold_over_ten_thousand_steps(name):
    """The four systems of the first-hour report, gains chosen from dt = 1e−4 alone, 10⁴
    feedback-Euler steps: success."""
    g = 9.81
    if name == "cart double pendulum":
        def hamiltonian(x):
            q, p = x[:6], x[6:]
            return 0.5 * p @ p + g * (q[3] + q[5])

        def rails_and_rods(q):
            c, a, b = q[0:2], q[2:4], q[4:6]
            return jnp.array([c[1], 0.5 * (jnp.sum((a - c) ** 2) - 1.0), 0.5 * (jnp.sum((b - a) ** 2) - 1.0)])

        system = geomjax.System(hamiltonian, geomjax.canonical(6), holonomic=rails_and_rods)
        a = jnp.array([jnp.sin(1.2), -jnp.cos(1.2)])
        x0 = jnp.concatenate([jnp.zeros(2), a, a + jnp.array([jnp.sin(-0.8), -jnp.cos(-0.8)]), jnp.zeros(6)])
    else:
        model = {"double pendulum": _released_near_the_top,
                 "3-link chain": lambda: geomjax.models.planar_chain(3, gravity=g, angles=jnp.array([1.2, -0.5, 0.8])),
                 "knife edge": geomjax.models.knife_edge}[name]()
        system, x0 = model.system, model.x0
    with pytest.warns(geomjax.ChosenGainsWarning):
        field = geomjax.feedback_field(system, x0, dt=1e-4)
    sol = geomjax.integrate(field, x0, dt=1e-4, steps=10_000, method="euler", save_every=100, throw=False)
    assert bool(sol.ok), sol.message
