"""RATTLE and SHAKE: order, constraints, energy without drift, symplecticity, gradients, failures."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _holonomic_cases import SPHERE, SPHERE_F, X0, measured_order, sphere_reference, state_on_sphere
from _jaxpr import jaxpr_shapes

import geomjax
from geomjax import diagnostics
from geomjax._step.base import NEWTON_FAILED

RATTLE = geomjax.rattle(SPHERE.system)
RATTLE_GENERAL = geomjax.rattle(SPHERE.system, separable=False)
SHAKE = geomjax.shake(SPHERE.system)


@pytest.mark.parametrize("step", [RATTLE, RATTLE_GENERAL, SHAKE], ids=["rattle", "rattle-general", "shake"])
def test_order_two(step):
    fit = measured_order(step, X0, sphere_reference())
    assert abs(fit.order - 2.0) <= 0.3, fit


def _long_run(h, steps=2000):
    return geomjax.integrate(RATTLE, X0, dt=h, steps=steps, save_every=5)


def test_rattle_constraints_at_round_off_and_energy_second_order_without_drift():
    errs = {}
    for h in (0.1, 0.05):
        sol = _long_run(h)
        c = diagnostics.constraint_errors(SPHERE.system, sol.xs)
        assert float(c.max()) <= 1e-12, (h, float(c[:, 0].max()), float(c[:, 1].max()))
        e = np.asarray(diagnostics.energy_errors(SPHERE.system, sol.xs))
        drift = diagnostics.drift_slope(sol.ts, e, windows=10)
        assert abs(drift.relative) < 0.1, drift
        errs[h] = e.max()
    ratio = errs[0.1] / errs[0.05]
    assert 3.2 < ratio < 4.8, ratio  # O(h²)


def test_shake_keeps_positions_but_not_the_hidden_constraint():
    sol = geomjax.integrate(SHAKE, X0, dt=0.05, steps=200, save_every=5)
    c = np.asarray(diagnostics.constraint_errors(SPHERE.system, sol.xs))
    assert c[:, 0].max() <= 1e-12
    assert 1e-6 < c[:, 1].max() < 1e-1  # G M⁻¹p = 2q·p is only O(h²)


@pytest.mark.parametrize("step", [RATTLE, RATTLE_GENERAL], ids=["rattle", "rattle-general"])
def test_symplectic_on_the_constraint_manifold(step):
    x = state_on_sphere()
    defect = float(diagnostics.symplecticity_defect(step, x, 0.1, SPHERE.system))
    assert defect < 1e-13, defect


def test_gradient_matches_finite_differences():
    def objective(x0, gravity):
        model = geomjax.models.spherical_pendulum(g=gravity, holonomic=True)
        # Finite differences step off S: start_tol=None lets the perturbed starts run.
        sol = geomjax.integrate(
            geomjax.rattle(model.system), x0, dt=0.05, steps=40, save_every=40, throw=False, start_tol=None
        )
        return sol.xs[-1, 2] + 0.3 * sol.xs[-1, 4]

    grad_x, grad_g = jax.grad(objective, argnums=(0, 1))(X0, 1.0)
    f = jax.jit(objective)
    eps = 1e-6
    v = jnp.array([0.3, 0.0, -0.2, 0.1, 0.5, 0.2])
    fd_x = (f(X0 + eps * v, 1.0) - f(X0 - eps * v, 1.0)) / (2 * eps)
    fd_g = (f(X0, 1.0 + eps) - f(X0, 1.0 - eps)) / (2 * eps)
    np.testing.assert_allclose(float(grad_x @ v), float(fd_x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(float(grad_g), float(fd_g), rtol=1e-6, atol=1e-8)


def test_newton_failure_is_reported_not_hidden():
    # With h = 1 the sphere cannot be reached from q + h p½: g(q₁) = 0 has no solution.
    sol = geomjax.integrate(RATTLE, X0, dt=1.0, steps=4, throw=False)
    assert bool(sol.result == NEWTON_FAILED)
    assert int(sol.failed_step) == 1
    assert "Newton" in sol.message
    with pytest.raises(geomjax.IntegrationError, match="Newton"):
        geomjax.integrate(RATTLE, X0, dt=1.0, steps=4)


def test_start_off_the_constraint_set_is_rejected():
    with pytest.raises(ValueError, match="off the constraint set"):
        geomjax.integrate(RATTLE, X0.at[1].add(0.01), dt=0.01, steps=4)
    with pytest.raises(ValueError, match="off the constraint set"):
        geomjax.integrate(SHAKE, X0.at[4].add(0.01), dt=0.01, steps=4)


def test_needs_position_constraints():
    with pytest.raises(ValueError, match="holonomic=g"):
        geomjax.rattle(SPHERE_F.system)


def _particle_with_varying_mass(x):
    """A particle on the unit sphere with mass 1 + q₁²/2 (so M depends on q) in gravity."""
    q, p = x[:3], x[3:]
    return 0.5 * (p @ p) / (1.0 + 0.5 * q[0] ** 2) + q[2]


VARYING = geomjax.System(
    _particle_with_varying_mass, geomjax.canonical(3), holonomic=lambda q: jnp.atleast_1d(q @ q - 1.0)
)


def test_position_dependent_mass_needs_the_general_form():
    with pytest.raises(ValueError, match="separable=False"):
        geomjax.rattle(VARYING).check(X0)
    step = geomjax.rattle(VARYING, separable=False)
    step.check(X0)
    x, status = diagnostics.final_state(step, X0, 0.05, 100)
    assert bool(status == geomjax.RESULTS.successful)
    assert float(jnp.abs(VARYING.constraint_functions(x)).max()) <= 1e-12
    assert float(diagnostics.symplecticity_defect(step, x, 0.1, VARYING)) < 1e-13
    ref, _ = diagnostics.final_state(step, X0, 1.0 / 1280, 1280)
    fit = measured_order(step, X0, ref, ns=(10, 20, 40, 80))
    assert abs(fit.order - 2.0) <= 0.3, fit


def test_vmap_over_initial_states_and_diffrax_adapter():
    import diffrax

    angles = jnp.linspace(0.0, 1.0, 4)
    x0s = jnp.stack([jnp.array([jnp.sin(a), jnp.cos(a), 0.0, 1.0 * jnp.cos(a), -jnp.sin(a), -1.0]) for a in angles])
    finals, status = jax.vmap(lambda x: diagnostics.final_state(RATTLE, x, 0.05, 20))(x0s)
    assert np.all(np.asarray(status._value) == 0)
    np.testing.assert_allclose(np.sum(np.asarray(finals[:, :3]) ** 2, axis=1), 1.0, atol=1e-13)
    sol = diffrax.diffeqsolve(
        diffrax.ODETerm(lambda t, y, args: y),
        geomjax.StepSolver(RATTLE, order=2),
        t0=0.0,
        t1=1.0,
        dt0=0.05,
        y0=X0,
        saveat=diffrax.SaveAt(t1=True),
    )
    np.testing.assert_allclose(np.asarray(sol.ys[-1]), np.asarray(finals[0]), atol=1e-12)


def test_global_error_keeps_decreasing_as_h_squared():
    # t ∈ [0, 1], h = 1e-2 ... 1.5625e-4: the Newton solve must not put a floor under the
    # error (the reference, Yoshida-4 with 2560 steps, is accurate to ~1e-15).
    hs = [1e-2 / 2**i for i in range(7)]
    errors = diagnostics.global_errors(RATTLE, X0, 1.0, [int(round(1 / h)) for h in hs], sphere_reference())
    ratios = errors[:-1] / errors[1:]
    assert np.all(np.abs(ratios - 4.0) < 0.05), (errors, ratios)
    assert errors[-1] < 5e-8, errors


@pytest.mark.parametrize("h", [0.1, 1e-2, 1e-3, 1e-5])
def test_one_step_lands_on_the_sphere_at_round_off(h):
    x = state_on_sphere()
    (q1, p1), status = RATTLE.advance(0.0, RATTLE.split(x), h, None)
    assert bool(status == geomjax.RESULTS.successful)
    scale = float(q1 @ q1)  # g = |q|² − 1 is computed from terms of size |q|²
    assert abs(float(q1 @ q1) - 1.0) <= 1e-15 * scale
    assert abs(float(q1 @ p1)) <= 1e-15 * (1.0 + float(jnp.abs(p1).max()))


def test_a_chain_at_a_large_step_stays_at_round_off():
    """Three links at h = 0.03, 300 steps from 8 starts: the Newton check after the two
    written-out iterations estimated the error from their updates and accepted solves 20×
    less accurate than estimated (|g| up to 5e−13 here, 4.3e−12 over 3000 steps); with its
    safety factor the loop finishes those solves."""
    data = geomjax.chain_trajectories(3, 8, steps=2, key=jax.random.key(0))
    chain = geomjax.models.planar_chain(3)
    step = geomjax.rattle(chain.system)
    run = jax.jit(jax.vmap(lambda x0: geomjax.integrate(step, x0, dt=0.03, steps=300, drift_tol=None).xs))
    xs = run(data.xs[:, 0])
    g = jax.vmap(jax.vmap(chain.system.holonomic))(xs[..., :6])
    assert float(jnp.abs(g).max()) <= 1e-14  # measured 8.3e-16


def test_failure_is_per_member_under_vmap():
    # h = 1 has no solution of g(q₁) = 0 from x0; the other members are unaffected.
    hs = jnp.array([0.01, 1.0, 0.05])
    (q1, _), status = jax.vmap(lambda h: RATTLE.advance(0.0, RATTLE.split(X0), h, None))(hs)
    assert np.asarray(status._value).tolist() == [0, int(NEWTON_FAILED._value), 0]
    np.testing.assert_allclose(np.sum(np.asarray(q1)[[0, 2]] ** 2, axis=1), 1.0, atol=2e-16)


# --------------------------------------------------------------------------------------
# Chains: the tridiagonal Newton and projection matrices (`structured=True`, the default)
# against the dense path (`structured=False`).

CHAIN = geomjax.models.planar_chain(5, angular_velocities=jnp.linspace(1.0, 3.0, 5))


@pytest.fixture(scope="module")
def chain_steps():
    """(structured, dense) batched one-step maps x, h ↦ (x₁, status), for RATTLE and SHAKE."""

    def batched(step):
        def one(x, h):
            (q, p), status = step.advance(0.0, step.split(x), h, None)
            return jnp.concatenate([q, p]), status._value

        return jax.jit(jax.vmap(one))

    return {
        name: (batched(make(CHAIN.system)), batched(make(CHAIN.system, structured=False)))
        for name, make in (("rattle", geomjax.rattle), ("shake", geomjax.shake))
    }


@pytest.mark.parametrize("name", ["rattle", "shake"])
def test_chain_structured_step_matches_dense_on_and_off_the_constraint_set(chain_steps, name):
    structured, dense = chain_steps[name]
    off = CHAIN.x0 + 1e-3 * jnp.asarray(np.random.default_rng(3).normal(size=CHAIN.x0.shape))
    # rows: on S at h = 0.01 and 0.1, off S (g ≠ 0, G M⁻¹p ≠ 0), and h = 0.5, 1, where
    # g(q₁) = 0 has no solution near the predictor: both paths must report the failure.
    xs = jnp.stack([CHAIN.x0, CHAIN.x0, off, CHAIN.x0, CHAIN.x0])
    hs = jnp.array([0.01, 0.1, 0.01, 0.5, 1.0])
    (x_s, status_s), (x_d, status_d) = structured(xs, hs), dense(xs, hs)
    failed = int(NEWTON_FAILED._value)
    assert np.asarray(status_s).tolist() == np.asarray(status_d).tolist() == [0, 0, 0, failed, failed]
    np.testing.assert_allclose(np.asarray(x_s[:3]), np.asarray(x_d[:3]), rtol=0, atol=1e-13)
    g = jax.vmap(lambda x: CHAIN.system.constraint_functions(x)[:5])(x_s[:3])
    assert float(jnp.max(jnp.abs(g))) < 1e-13  # the position constraints hold after the step
    if name == "rattle":
        gdot = jax.vmap(lambda x: CHAIN.system.constraint_functions(x)[5:])(x_s[:3])
        assert float(jnp.max(jnp.abs(gdot))) < 1e-12


def test_chain_structured_run_and_gradient_match_dense():
    """A short run (a scan of steps) and its gradient with respect to the initial state:
    the implicit-function tangent solve goes through the same tridiagonal matrix."""
    weights = jnp.asarray(np.random.default_rng(4).normal(size=CHAIN.x0.shape))

    def run(step, x):
        def body(z, _):
            return step.advance(0.0, z, 0.02, None)[0], None

        q, p = jax.lax.scan(body, step.split(x), None, length=10)[0]
        return jnp.concatenate([q, p])

    @jax.jit
    def both(x):
        out = []
        for structured in (True, False):
            step = geomjax.rattle(CHAIN.system, structured=structured)
            out.append(jax.value_and_grad(lambda y: run(step, y) @ weights)(x))
        return out

    (v_s, grad_s), (v_d, grad_d) = both(CHAIN.x0)
    np.testing.assert_allclose(float(v_s), float(v_d), rtol=1e-13)
    scale = float(jnp.max(jnp.abs(grad_d)))
    assert scale > 0.1
    np.testing.assert_allclose(np.asarray(grad_s), np.asarray(grad_d), rtol=0, atol=1e-10 * scale)


def test_chain_of_16_takes_the_tridiagonal_path():
    """No k × k matrix (k = 16 constraints) is formed in a RATTLE step of the structured path,
    in the step or in its derivative; the dense path forms them (so the test can fail)."""
    model = geomjax.models.planar_chain(16)
    k = 16
    for structured in (True, False):
        step = geomjax.rattle(model.system, structured=structured)

        def one(x):
            return jnp.concatenate(step.advance(0.0, step.split(x), 0.01, None)[0])

        jaxpr = jax.make_jaxpr(jax.grad(lambda x: one(x)[0]))(model.x0)
        square = [s for s in jaxpr_shapes(jaxpr.jaxpr) if len(s) >= 2 and s[-2:] == (k, k)]
        if structured:
            assert not square, square
        else:
            assert square


def test_tridiagonal_plan_only_for_tridiagonal_patterns_and_its_example():
    import doctest

    from geomjax._solve import banded

    assert banded.TridiagonalJacobian.of(lambda x: x * jnp.sum(x), 6) is None  # dense
    assert banded.TridiagonalJacobian.of(lambda x: x - jnp.roll(x, 2), 6) is None  # bandwidth 2
    assert banded.TridiagonalJacobian.of(lambda x: x * x[::-1], 2) is None  # no fewer products than k
    zero = jnp.zeros(1)
    plan = banded.TridiagonalJacobian.of(lambda x: x**2 - jnp.concatenate([zero, x[:-1]]) * jnp.sin(x), 6)
    assert plan is not None and plan.seeds.shape == (2, 6)  # bidiagonal: two colours
    plan = banded.TridiagonalJacobian.of(
        lambda x: x**3 + jnp.concatenate([x[1:], zero]) + jnp.concatenate([zero, x[:-1]]), 6
    )
    assert plan is not None and plan.seeds.shape == (3, 6)
    result = doctest.testmod(banded)
    assert result.attempted > 0 and result.failed == 0
