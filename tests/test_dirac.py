"""Dirac-1, Dirac-2 (seed 003) and the Adams–Bashforth multistep methods.

Independent checks: seed 003's written-out system (7) for the pendulum, solved here by
hand in NumPy; the forced discrete Lagrange–d'Alembert step (the same map as Dirac-1);
orders measured on the double pendulum in Cartesian coordinates (nonlinear, two
constraints); derivatives against central finite differences.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax
from geomjax import diagnostics

M, G, ELL = 1.3, 9.81, 0.8


def pendulum_lagrangian(q, v, g=G):
    return 0.5 * M * v @ v - M * g * q[1]


def pendulum_phi(q):
    return jnp.array([q @ q - ELL**2])


def at_angle(theta, length=ELL):
    return jnp.array([length * np.sin(theta), -length * np.cos(theta), 0.0, 0.0])


X0 = at_angle(1.0)
DIRAC1 = geomjax.dirac1(pendulum_lagrangian, holonomic=pendulum_phi)
DIRAC2 = geomjax.dirac2(pendulum_lagrangian, holonomic=pendulum_phi)


def seed_eq7(x, h, *, past=None):
    """Seed 003 eq. (7) solved by hand: x_k x̃ + y_k ỹ = 0, p_{k+1} = m q̃,
    p_k − m q̃ − h m g e_y = λ q_k (q̃ the forward difference, or the centred one from
    `past` = q_{k−1}). Linear in (q̃, λ): m q̃ = p_k − (0, h m g) − λ q_k and q_k·q̃ = 0."""
    x = np.asarray(x)
    q, p = x[:2], x[2:]
    b = p - np.array([0.0, h * M * G])
    lam = (q @ b) / (q @ q)
    qt = (b - lam * q) / M
    q_next = q + h * qt if past is None else np.asarray(past) + 2 * h * qt
    return np.concatenate([q_next, M * qt])


def test_dirac1_is_seed_eq7_written_out():
    x, h = np.asarray(X0), 0.01
    for _ in range(25):
        ours = np.asarray(DIRAC1(jnp.asarray(x), h))
        np.testing.assert_allclose(ours, seed_eq7(x, h), rtol=0, atol=1e-14)
        x = ours


def test_dirac2_is_seed_eq7_with_the_centred_velocity():
    h, n = 0.01, 30
    sol = geomjax.integrate(DIRAC2, X0, dt=h, steps=n, drift_tol=None)
    xs = np.asarray(sol.xs)
    q_prev = np.asarray(DIRAC2.start(0.0, DIRAC2.split(X0), h, None)[2][0])
    for k in range(n):
        expected = seed_eq7(xs[k], h, past=q_prev)
        np.testing.assert_allclose(xs[k + 1], expected, rtol=0, atol=1e-13)
        q_prev = xs[k, :2]


def test_dirac1_is_forced_dla_with_the_left_rule():
    fdla = geomjax.forced_dla(pendulum_lagrangian, nonholonomic=lambda q: jax.jacfwd(pendulum_phi)(q), rule="left")
    a = geomjax.integrate(DIRAC1, X0, dt=0.02, steps=50, drift_tol=None).xs
    b = geomjax.integrate(fdla, X0, dt=0.02, steps=50, drift_tol=None).xs
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


# --- orders on the double pendulum (Cartesian, two constraints) -----------------------


def double_lagrangian(q, v):
    return 0.5 * v @ v - G * (q[1] + q[3])


def double_phi(q):
    return jnp.array([q[:2] @ q[:2] - 1.0, (q[2:] - q[:2]) @ (q[2:] - q[:2]) - 1.0])


def double_x0():
    a, b = 1.0, 0.4
    q1 = jnp.array([jnp.sin(a), -jnp.cos(a)])
    q2 = q1 + jnp.array([jnp.sin(b), -jnp.cos(b)])
    return jnp.concatenate([q1, q2, jnp.zeros(4)])


DOUBLE_X0 = double_x0()
T_ORDER = 0.5
NS = (50, 100, 200, 400)


@pytest.fixture(scope="module")
def double_reference():
    system = geomjax.LagrangianSystem(double_lagrangian, 4, holonomic=double_phi).to_hamiltonian()
    field = geomjax.dirac_field(system)
    # RK4 at h = 2.5e-4 on the index-reduced ODE: error ~1e-13, far below the errors measured
    return np.asarray(geomjax.integrate(field, DOUBLE_X0, dt=T_ORDER / 2000, steps=2000, save_every=2000, method="rk4").xs[-1])


def _errors(step, reference):
    q_err, p_err, c_err = [], [], []
    for n in NS:
        x, status = diagnostics.final_state(step, DOUBLE_X0, T_ORDER / n, n)
        assert status == geomjax.RESULTS.successful
        x = np.asarray(x)
        q_err.append(np.max(np.abs(x[:4] - reference[:4])))
        p_err.append(np.max(np.abs(x[4:] - reference[4:])))
        c_err.append(np.max(np.abs(np.asarray(double_phi(jnp.asarray(x[:4]))))))
    hs = [T_ORDER / n for n in NS]
    orders = [diagnostics.convergence_order(hs, e).order for e in (q_err, p_err)]
    # (a constraint kept to round-off has no order)
    orders.append(diagnostics.convergence_order(hs, c_err).order if max(c_err) > 1e-10 else np.nan)
    return orders


def test_dirac1_orders(double_reference):
    q, p, c = _errors(geomjax.dirac1(double_lagrangian, holonomic=double_phi), double_reference)
    assert abs(q - 1) < 0.3 and abs(p - 1) < 0.3
    assert abs(c - 1) < 0.3  # the velocity-level constraint lets φ drift at O(h)


def test_dirac2_orders_first_order_trajectory_second_order_constraint(double_reference):
    # Seed 003 calls it "order 2": that is its velocity approximation and its constraint
    # (measured slope 2); the trajectory is first order (module docstring: ρ(eʰ) − h²σ(eʰ) = −h³).
    q, p, c = _errors(geomjax.dirac2(double_lagrangian, holonomic=double_phi), double_reference)
    assert abs(q - 1) < 0.3 and abs(p - 1) < 0.3
    assert abs(c - 2) < 0.3


def test_dirac1_position_constraint_is_kept_to_newton_tolerance(double_reference):
    step = geomjax.dirac1(double_lagrangian, holonomic=double_phi, constraint="position")
    sol = geomjax.integrate(step, DOUBLE_X0, dt=0.01, steps=200, drift_tol=None)
    assert sol.message == "success"
    phi = jax.vmap(double_phi)(sol.xs[:, :4])
    assert float(jnp.max(jnp.abs(phi))) < 1e-12
    q, p, _ = _errors(step, double_reference)
    # measured: q 1.00, p 2.00 (p_{k+1} = ∂L/∂v(q_k, q̃) with q_{k+1} on the constraint set)
    assert abs(q - 1) < 0.3 and abs(p - 2) < 0.3


def test_harmonic_oscillator_dirac2_damps_as_predicted():
    # On q̈ = −q the recurrence q_{k+1} − q_k − q_{k−1} + q_{k−2} = −2h²q_k has its
    # principal root e^{iθ}, θ = h + i h²/4 + O(h³): the amplitude decays like e^{−ht/4}.
    step = geomjax.dirac2(lambda q, v: 0.5 * v @ v - 0.5 * q @ q)
    h, t = 0.01, 20.0
    sol = geomjax.integrate(step, jnp.array([1.0, 0.0]), dt=h, steps=int(t / h), drift_tol=None)
    q, p = sol.xs[-1]
    amplitude = float(jnp.sqrt(q**2 + p**2))
    assert abs(amplitude / np.exp(-h * t / 4) - 1.0) < 5e-3


# --- multistep plumbing -------------------------------------------------------------


def test_multistep_runs_save_q_p_and_vmap():
    xs0 = jnp.stack([at_angle(a) for a in (0.3, 0.6, 0.9)])
    run = jax.jit(jax.vmap(lambda x: geomjax.integrate(DIRAC2, x, dt=0.01, steps=40, save_every=10, drift_tol=None).xs))
    out = run(xs0)
    assert out.shape == (3, 5, 4)
    single = geomjax.integrate(DIRAC2, xs0[1], dt=0.01, steps=40, save_every=10, drift_tol=None).xs
    np.testing.assert_allclose(out[1], single, rtol=0, atol=1e-14)
    # the step called directly starts its own history
    np.testing.assert_allclose(DIRAC2(xs0[1], 0.01), np.asarray(single[0]) * 0 + geomjax.integrate(DIRAC2, xs0[1], dt=0.01, steps=1, drift_tol=None).xs[-1], atol=1e-15)


def test_default_monitoring_flags_dirac1_drift():
    sol = geomjax.integrate(DIRAC1, X0, dt=0.02, steps=3000, save_every=100, throw=False)
    assert sol.result in (geomjax.RESULTS.constraint_violation, geomjax.RESULTS.invariant_drift)
    assert 0 < int(sol.failed_step) <= 3000


def test_adams_bashforth_coefficients_and_orders():
    from geomjax._step.multistep import adams_bashforth_coefficients

    assert [str(b) for b in adams_bashforth_coefficients(2)] == ["3/2", "-1/2"]
    assert [str(b) for b in adams_bashforth_coefficients(4)] == ["55/24", "-59/24", "37/24", "-3/8"]
    system = geomjax.LagrangianSystem(pendulum_lagrangian, 2, holonomic=pendulum_phi).to_hamiltonian()
    field = geomjax.dirac_field(system)
    ref = np.asarray(geomjax.integrate(field, X0, dt=1 / 4000, steps=4000, save_every=4000, method="rk4").xs[-1])
    for k in (2, 3):
        step = geomjax.adams_bashforth(field, k)
        errs = [np.max(np.abs(np.asarray(diagnostics.final_state(step, X0, 1 / n, n)[0]) - ref)) for n in (50, 100, 200, 400)]
        assert abs(diagnostics.convergence_order([1 / n for n in (50, 100, 200, 400)], errs).order - k) < 0.3


# --- derivatives ---------------------------------------------------------------------


class PendulumLagrangian(eqx.Module):
    """L with g as a pytree leaf: one compilation serves every value of g."""

    g: jax.Array

    def __call__(self, q, v):
        return pendulum_lagrangian(q, v, self.g)


@pytest.mark.parametrize("step_of", [geomjax.dirac1, geomjax.dirac2], ids=["dirac1", "dirac2"])
def test_gradients_against_finite_differences(step_of):
    def loss(x0, g, h):
        step = step_of(PendulumLagrangian(g), holonomic=pendulum_phi)
        xs = geomjax.integrate(step, x0, dt=h, steps=30, drift_tol=None, start_tol=None).xs
        return jnp.sum(xs[-1] ** 2) + xs[-1, 0]

    args = (X0, jnp.asarray(G), jnp.asarray(0.01))
    grads = jax.grad(loss, argnums=(0, 1, 2))(*args)
    eps = 1e-6
    direction = jnp.array([0.3, 0.4, 0.0, 0.0])  # along the constraint circle to first order
    fd_x = (loss(X0 + eps * direction, *args[1:]) - loss(X0 - eps * direction, *args[1:])) / (2 * eps)
    fd_g = (loss(X0, G + eps, 0.01) - loss(X0, G - eps, 0.01)) / (2 * eps)
    fd_h = (loss(X0, G, 0.01 + eps) - loss(X0, G, 0.01 - eps)) / (2 * eps)
    np.testing.assert_allclose(float(grads[0] @ direction), float(fd_x), rtol=1e-6)
    np.testing.assert_allclose(float(grads[1]), float(fd_g), rtol=1e-6)
    np.testing.assert_allclose(float(grads[2]), float(fd_h), rtol=1e-6)


# --- bad input ---------------------------------------------------------------------


def test_bad_input():
    with pytest.raises(ValueError, match="even length"):
        geomjax.integrate(DIRAC1, jnp.ones(5), dt=0.1, steps=2)
    with pytest.raises(ValueError, match="constraint must be one of"):
        geomjax.dirac1(pendulum_lagrangian, holonomic=pendulum_phi, constraint="both")
    with pytest.raises(ValueError, match="history"):
        geomjax.dirac(pendulum_lagrangian, holonomic=pendulum_phi, history=-1)
    with pytest.raises(ValueError, match="off the constraint set"):
        geomjax.integrate(DIRAC1, jnp.array([1.0, 0.0, 0.0, 0.0]), dt=0.1, steps=2)
    with pytest.raises(ValueError, match="linearly dependent"):
        twice = lambda q: jnp.array([q @ q - ELL**2, 2 * (q @ q - ELL**2)])  # noqa: E731
        geomjax.integrate(geomjax.dirac1(pendulum_lagrangian, holonomic=twice), X0, dt=0.1, steps=2)
    with pytest.raises(ValueError, match="multistep"):
        geomjax.StepSolver(DIRAC2)


def test_newton_failure_is_reported_with_its_step():
    # A quartic kinetic term makes the equations non-affine (Newton); a huge step has no
    # root near the guess.
    L = lambda q, v: 0.5 * v @ v + 0.25 * (v @ v) ** 2 - M * G * q[1]  # noqa: E731
    step = geomjax.dirac1(L, holonomic=pendulum_phi, constraint="position", newton=geomjax.Newton(max_steps=3))
    sol = geomjax.integrate(step, X0, dt=0.5, steps=10, drift_tol=None, throw=False)
    assert sol.result == geomjax.RESULTS.newton_failed
    assert int(sol.failed_step) >= 1


def test_chain_uses_the_tridiagonal_schur_complement_and_agrees_with_the_dense_solve():
    # A Ziegler column of 6 rods: W = M is diagonal and S = α M⁻¹ αᵀ tridiagonal (6 > the
    # unrolled size), so the block elimination divides by W and solves S in O(k).
    from geomjax._solve import structure
    from geomjax._step.dirac import _Equations, _affine_structure

    model = geomjax.models.ziegler_column(6, P=0.3, angles=jnp.full((6,), 0.05))
    step = geomjax.dirac1(model.lagrangian, holonomic=model.holonomic)
    q, p = step.split(model.x0)
    h = jnp.asarray(0.01)
    eqs = _Equations(step.system, step.velocity, "velocity", (), q, p, h)
    affine = _affine_structure(eqs)
    assert affine is not None
    pattern = affine.dense()
    sparse = structure.saddle_linear_solve(eqs, eqs.zeros(), pattern)
    dense = structure.saddle_linear_solve(eqs, eqs.zeros())
    for a, b in zip(sparse, dense):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    # the tridiagonal solve is plain JAX (Thomas elimination): spy on the call instead
    calls = []
    original = structure.tridiagonal_solve
    structure.tridiagonal_solve = lambda *a: calls.append(a[1].shape) or original(*a)
    try:
        jax.make_jaxpr(lambda: structure.saddle_linear_solve(eqs, eqs.zeros(), pattern))()
    finally:
        structure.tridiagonal_solve = original
    assert calls == [(6,)]
    # and the equations hold at the root
    assert float(jnp.max(jnp.abs(jnp.concatenate(eqs(sparse))))) < 1e-12


@pytest.mark.extended  # 9 s; gradients of Dirac steps in closed-over parameters: test_closures.py (dirac1)
def test_gradient_in_the_ziegler_load_against_finite_differences():
    # d/dP of the final tip height of a Dirac-2 run of the Ziegler column (P enters L
    # through the model's parameters; one compilation serves every P).
    def tip_height(load):
        model = geomjax.models.ziegler_column(2, P=load, angles=jnp.array([0.3, 0.1]))
        step = geomjax.dirac2(model.lagrangian, holonomic=model.holonomic)
        return geomjax.integrate(step, model.x0, dt=0.02, steps=50, save_every=50, drift_tol=None).xs[-1, 3]

    load, eps = 0.4, 1e-5
    grad = jax.grad(tip_height)(load)
    fd = (tip_height(load + eps) - tip_height(load - eps)) / (2 * eps)
    np.testing.assert_allclose(float(grad), float(fd), rtol=1e-6)


def test_a_failed_starter_is_not_a_success():
    # Dirac-2 with a Newton-based starter that cannot converge (one iteration, L quartic in
    # v): the history it leaves is not trusted, and the run reports the first step.
    L = lambda q, v: pendulum_lagrangian(q, v) + (v @ v) ** 2  # noqa: E731
    starter = geomjax.dirac1(L, holonomic=pendulum_phi, constraint="position", newton=geomjax.Newton(max_steps=1))
    step = geomjax.dirac2(pendulum_lagrangian, holonomic=pendulum_phi, starter=starter)
    x0 = X0.at[2].set(0.5 * np.cos(1.0)).at[3].set(0.5 * np.sin(1.0))  # moving along the circle
    sol = geomjax.integrate(step, x0, dt=0.2, steps=4, drift_tol=None, throw=False)
    assert sol.result == geomjax.RESULTS.nonfinite_first_step
    assert int(sol.failed_step) == 1
