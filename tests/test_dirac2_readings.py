"""The two readings of Dirac-2 (Salnikov–Hamdouni eq. (7)): `geomjax.dirac2(..., reading=...)`.

- "literal": the centred q̃ = (q_{k+1} − q_{k−1})/2h in every line of eq. (7) (the default,
  unchanged: compared with numbers recorded before the option existed);
- "centred_constraint": Dirac-1's momentum equations with the centred constraint
  α(q_k)·(q_{k+1} − q_{k−1}) = 0, checked against the same equations solved by hand in
  NumPy on the Cartesian pendulum (with a hand Dirac-1 starter).

Roots on the oscillator: the literal reading's spurious root z ≈ −1 − h²ω²/2 is measured
from runs (the growth of the sign-alternating mode, and a recurrence fitted to a
trajectory); the Jacobian of each reading's one-step map has the roots of
`dirac2_oscillator_roots`, and none of the centred-constraint reading's lie outside the
unit circle.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax
from geomjax._step.dirac import dirac2_oscillator_roots

M, G, ELL = 1.3, 9.81, 0.8
SUBSTEPS = 16  # the default starter's substeps


def pendulum_lagrangian(q, v):
    return 0.5 * M * v @ v - M * G * q[1]


def pendulum_phi(q):
    return jnp.array([q @ q - ELL**2])


def at_angle(theta):
    return jnp.array([ELL * jnp.sin(theta), -ELL * jnp.cos(theta), 0.0, 0.0])


X0 = at_angle(1.0)
CENTRED = geomjax.dirac2(pendulum_lagrangian, holonomic=pendulum_phi, reading="centred_constraint")
LITERAL = geomjax.dirac2(pendulum_lagrangian, holonomic=pendulum_phi)
# Every pendulum run has this many steps, saved at each (h and x0 are traced): one
# compiled program per reading serves the whole file.
STEPS = 2000


def run(step, x0, h, steps=STEPS):
    return geomjax.integrate(step, x0, dt=h, steps=steps, drift_tol=None).xs


# --- the hand implementation (NumPy) ------------------------------------------------


def _hand_dirac1(q, p, h):
    """Dirac-1 on the pendulum: p' = p − h m g e_y + 2μ q, q' = q + h p'/m, q·(q' − q) = 0."""
    b = p - np.array([0.0, h * M * G])
    mu = -(q @ b) / (2.0 * (q @ q))
    p_next = b + 2.0 * mu * q
    return q + h * p_next / M, p_next


def _hand_centred(q_prev, q, p, h):
    """The centred-constraint reading: p' = p − h m g e_y + 2μ q, q' = q + h p'/m,
    q·(q' − q_prev) = 0 ⇒ μ = −(q·(q − q_prev) + (h/m) q·b) / (2 (h/m) |q|²)."""
    b = p - np.array([0.0, h * M * G])
    mu = -(q @ (q - q_prev) + (h / M) * (q @ b)) / (2.0 * (h / M) * (q @ q))
    p_next = b + 2.0 * mu * q
    return q + h * p_next / M, p_next


def _hand_run(x0, h, steps):
    q, p = np.asarray(x0[:2], float), np.asarray(x0[2:], float)
    qb, pb = q, p
    for _ in range(SUBSTEPS):
        qb, pb = _hand_dirac1(qb, pb, -h / SUBSTEPS)
    q_prev, out = qb, [np.concatenate([q, p])]
    for _ in range(steps):
        q_next, p = _hand_centred(q_prev, q, p, h)
        q_prev, q = q, q_next
        out.append(np.concatenate([q, p]))
    return np.array(out), qb


def test_centred_constraint_reading_is_its_equations_solved_by_hand():
    h = 0.01
    hand, _ = _hand_run(np.asarray(X0), h, STEPS)
    # (the first step reads q_{−1} through the constraint: agreeing there checks the start)
    ours = np.asarray(run(CENTRED, X0, h))
    np.testing.assert_allclose(ours[:100], hand[:100], rtol=0, atol=1e-13)
    np.testing.assert_allclose(ours, hand, rtol=0, atol=1e-11)  # 2000 steps: round-off accumulates
    # the centred constraint holds at every step, to round-off
    q = hand[:, :2]
    centred = np.einsum("ki,ki->k", q[1:-1], q[2:] - q[:-2])
    assert np.max(np.abs(centred)) < 1e-13


# --- the default is unchanged ---------------------------------------------------------


def test_default_reading_is_unchanged():
    # recorded at commit 5d17dd0 (before the option): dt = 0.01, 60 steps, saved every 20
    recorded = np.array([
        [0.6731767878463173, -0.4322418446945118, 0.0, 0.0],
        [0.562252973728, -0.5689529764913311, -1.4195562129354389, -1.457078359896788],
        [0.18545423803494757, -0.7778625399241264, -3.1924867289681864, -0.8679438396214911],
        [-0.31500888147404155, -0.7349366394166486, -2.8730490400405255, 1.131174519738521],
    ])
    for step in (LITERAL, geomjax.dirac2(pendulum_lagrangian, holonomic=pendulum_phi, reading="literal")):
        xs = run(step, X0, 0.01)[:61:20]
        np.testing.assert_allclose(np.asarray(xs), recorded, rtol=0, atol=1e-14)


# --- roots ---------------------------------------------------------------------------


def oscillator(q, v):
    """L = v²/2 − ω²q²/2 with ω = 1 (hω = h)."""
    return 0.5 * v @ v - 0.5 * q @ q


OSC_LITERAL = geomjax.dirac2(oscillator)
OSC_CENTRED = geomjax.dirac2(oscillator, reading="centred_constraint")
OSC_STEPS = 3000  # hω = 0.1: the spurious mode grows by e^{15}; hω = 0.3: by e^{133}, still finite


@pytest.mark.parametrize("h_omega", [0.1, 0.3])
def test_literal_spurious_root_grows_by_one_plus_half_h2_omega2(h_omega):
    # The sign-alternating mode that the starter excites grows by |z| per step until it
    # dominates; then q_{k+1}/q_k is the spurious root.
    a = h_omega**2
    q = np.asarray(run(OSC_LITERAL, jnp.array([1.0, 0.0]), h_omega, OSC_STEPS)[:, 0])
    ratios = q[-20:] / q[-21:-1]
    assert np.all(ratios < -1.0)  # alternating sign, growing
    measured = float(np.mean(ratios))
    assert np.ptp(ratios) < 1e-6
    exact = min(dirac2_oscillator_roots(h_omega, "literal"), key=lambda z: z.real)
    assert abs(exact.imag) < 1e-12
    assert abs(measured - exact.real) < 1e-6
    # the expansion −1 − a/2 − a²/4 + O(a³), and its first term
    assert abs(measured - (-1.0 - a / 2 - a**2 / 4)) < 2 * a**3
    assert abs(abs(measured) - (1.0 + a / 2)) < 0.3 * a**2


def test_a_recurrence_fitted_to_literal_runs_has_the_predicted_roots():
    # Least squares for q_{k+1} = c₀q_k + c₁q_{k−1} + c₂q_{k−2} over a short run: the fitted
    # characteristic polynomial is z³ + (2a − 1)z² − z + 1.
    h = 0.3
    a = h**2
    q = np.asarray(run(OSC_LITERAL, jnp.array([1.0, 0.3]), h, OSC_STEPS)[:41, 0])
    A = np.stack([q[2:-1], q[1:-2], q[:-3]], axis=1)
    c, *_ = np.linalg.lstsq(A, q[3:], rcond=None)
    np.testing.assert_allclose(c, [1.0 - 2.0 * a, 1.0, -1.0], atol=1e-9)


def _jacobian_roots(step, x_rest, h):
    """The eigenvalues of the one-step map (q_k, p_k, q_{k−1}) ↦ (q_{k+1}, p_{k+1}, q_k) at rest."""
    q, p = step.split(x_rest)
    n = q.shape[0]

    def one(z):
        (q1, p1, past), _ = step.advance(0.0, (z[:n], z[n:2 * n], (z[2 * n:],)), h, None)
        return jnp.concatenate([q1, p1, past[0]])

    J = jax.jit(jax.jacfwd(one))(jnp.concatenate([q, p, q]))
    return np.linalg.eigvals(np.asarray(J))


def _sorted(z):
    z = np.asarray(z, complex)
    return z[np.lexsort((np.round(z.imag, 9), np.round(z.real, 9)))]


@pytest.mark.parametrize("reading", ["literal", "centred_constraint"])
def test_step_jacobians_have_the_predicted_roots(reading):
    # The Cartesian pendulum at rest: the tangential part is the oscillator with ω² = g/ℓ
    # (the roots of `dirac2_oscillator_roots`), the constraint normal adds 1, −1 and 0.
    h = 0.1
    step = LITERAL if reading == "literal" else CENTRED
    roots = _jacobian_roots(step, at_angle(0.0), h)
    expected = np.concatenate([dirac2_oscillator_roots(h * np.sqrt(G / ELL), reading), [1.0, -1.0, 0.0]])
    np.testing.assert_allclose(_sorted(roots), _sorted(expected), atol=1e-8)
    if reading == "centred_constraint":
        assert np.max(np.abs(roots)) < 1 + 1e-8
    else:
        assert np.max(np.abs(roots)) > 1 + h**2 * G / ELL / 2


@pytest.mark.parametrize("h_omega", [0.1, 0.5, 1.0, 1.9])
def test_centred_constraint_roots_lie_on_or_inside_the_unit_circle(h_omega):
    assert np.max(np.abs(dirac2_oscillator_roots(h_omega, "centred_constraint"))) <= 1 + 1e-12
    assert np.max(np.abs(dirac2_oscillator_roots(h_omega, "literal"))) > 1 + h_omega**2 / 2 - 1e-12


def test_centred_constraint_reading_stays_bounded_where_the_literal_one_grows():
    # The oscillator at hω = 0.3 over 3000 steps: the literal reading's parasitic mode
    # grows by 1.046 a step; the other reading keeps symplectic Euler's bounded ellipse.
    x0, h = jnp.array([1.0, 0.0]), 0.3
    lit = run(OSC_LITERAL, x0, h, OSC_STEPS)
    cen = run(OSC_CENTRED, x0, h, OSC_STEPS)
    assert float(jnp.max(jnp.abs(lit))) > 1e50
    assert float(jnp.max(jnp.abs(cen))) < 1.1
    # the pendulum at h = 0.05 (hω = 0.18), 2000 steps: φ stays small, and the
    # sign-alternating part (the second difference) does not grow
    xs = np.asarray(run(CENTRED, X0, 0.05))
    phi = np.abs(np.sum(xs[:, :2] ** 2, axis=1) - ELL**2)
    assert np.max(phi) < 2e-2
    second = np.linalg.norm(xs[2:, :2] - 2 * xs[1:-1, :2] + xs[:-2, :2], axis=1)
    assert np.max(second[-500:]) < 1.5 * np.max(second[:500])


# --- jit, vmap, grad, Newton ------------------------------------------------------------


def test_jit_vmap_and_grad():
    xs0 = jnp.stack([at_angle(a) for a in (0.3, 0.6, 0.9)])
    batch = jax.jit(jax.vmap(lambda x: run(CENTRED, x, 0.01)))
    out = batch(xs0)
    assert out.shape == (3, STEPS + 1, 4)
    np.testing.assert_allclose(out[1], run(CENTRED, xs0[1], 0.01), rtol=0, atol=1e-11)  # XLA's batched arithmetic

    def loss(angle, h):
        xs = run(CENTRED, at_angle(angle), h)
        return jnp.sum(xs[30] ** 2) + xs[30, 0]

    ga, gh = jax.grad(loss, argnums=(0, 1))(0.7, 0.01)
    eps = 1e-6
    np.testing.assert_allclose(float(ga), float((loss(0.7 + eps, 0.01) - loss(0.7 - eps, 0.01)) / (2 * eps)), rtol=1e-6)
    np.testing.assert_allclose(float(gh), float((loss(0.7, 0.01 + eps) - loss(0.7, 0.01 - eps)) / (2 * eps)), rtol=1e-6)


def test_newton_path_and_its_failure_are_reported():
    # A quartic kinetic term makes the equations non-affine: Newton solves them.
    # Six Newton iterations: enough at h = 0.01, not at h = 0.3 and a fast start (measured);
    # the starter is a Dirac-1 with the default Newton, so the failure is the step's.
    L = lambda q, v: pendulum_lagrangian(q, v) + 0.1 * (v @ v) ** 2  # noqa: E731
    step = geomjax.dirac2(L, holonomic=pendulum_phi, reading="centred_constraint",
                          starter=geomjax.dirac1(L, holonomic=pendulum_phi), newton=geomjax.Newton(max_steps=6))
    # one program for both runs (x0 and h traced; the start check is made on concrete
    # states only, and this Newton is too short for its Legendre solve at the fast start)
    go = jax.jit(lambda x, h: geomjax.integrate(step, x, dt=h, steps=20, drift_tol=None, start_tol=None, throw=False))

    def moving(speed):  # along the circle
        return X0.at[2].set(speed * np.cos(1.0)).at[3].set(speed * np.sin(1.0))

    sol = go(moving(0.5), 0.01)
    assert sol.result == geomjax.RESULTS.successful
    q = np.asarray(sol.xs[:, :2])
    assert np.max(np.abs(np.einsum("ki,ki->k", q[1:-1], q[2:] - q[:-2]))) < 1e-10
    sol = go(moving(2.0), 0.3)
    assert sol.result == geomjax.RESULTS.newton_failed
    assert int(sol.failed_step) == 1


def test_bad_reading():
    with pytest.raises(ValueError, match="reading must be one of"):
        geomjax.dirac2(pendulum_lagrangian, holonomic=pendulum_phi, reading="centred")
    with pytest.raises(ValueError, match="reading must be one of"):
        dirac2_oscillator_roots(0.1, "centered")
