"""Derived fields: the Dirac and feedback fields against seed 000's hand-written equations,
and the invariance identities Df·X = 0, ∇H·X = 0 at random states off the constraint set.

Every field under test is built and jitted once per module; hypothesis draws states (and
physical parameters) that are passed to the compiled functions as arrays, so examples do
not recompile.
"""

import geomjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import spherical_quantities
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

E3 = jnp.array([0.0, 0.0, 1.0])


# --------------------------------------------------------------------------------------
# Seed 000 eqs. (7)-(8) and (10)-(11), written by hand.
# --------------------------------------------------------------------------------------


def spherical_terms(x, x0, m, g, k):
    """The right-hand side of seed 000 eqs. (7)-(8) as a stack of its separate terms.

    Summing the stack gives (q̇, ṗ); the per-term magnitudes set the round-off scale.
    """
    q, p = x[:3], x[3:]
    f1, f2, h, j = spherical_quantities(x, m, g)
    df1, df2, dh, dj = spherical_quantities(x, m, g) - spherical_quantities(x0, m, g)
    k1, k2, k3, k4 = k
    zero = jnp.zeros(3)
    qdot = [
        p / m,
        -f2 / (m * f1) * q,
        -2.0 * k1 * df1 * q,
        -k2 * df2 * p,
        -k3 * m * g * dh * E3,
        -k4 * dj * jnp.cross(p, E3),
    ]
    pdot = [
        -m * g * E3,
        f2 / (m * f1) * p,
        (-(p @ p) / m + m * g * q[2]) / f1 * q,
        -k2 * df2 * q,
        -k3 * dh / m * p,
        -k4 * dj * jnp.cross(E3, q),
    ]
    return jnp.stack([jnp.concatenate([a, b]) for a, b in zip(qdot, pdot)] + [jnp.concatenate([zero, zero])])


def planar_terms(x, x0, m, g, k):
    """Seed 000 eqs. (10)-(11) for the planar pendulum, q = (x, y), as a stack of terms."""
    q, p = x[:2], x[2:]
    e2 = jnp.array([0.0, 1.0])

    def quantities(y):
        qq, pp = y[:2], y[2:]
        return jnp.stack([qq @ qq, qq @ pp, pp @ pp / (2 * m) + m * g * qq[1]])

    f1, f2, _ = quantities(x)
    df1, df2, dh = quantities(x) - quantities(x0)
    k1, k2, k3 = k
    qdot = [p / m, -f2 / (m * f1) * q, -2.0 * k1 * df1 * q, -k2 * df2 * p, -k3 * m * g * dh * e2]
    pdot = [
        -m * g * e2,
        f2 / (m * f1) * p,
        (-(p @ p) / m + m * g * q[1]) / f1 * q,
        -k2 * df2 * q,
        -k3 * dh / m * p,
    ]
    return jnp.stack([jnp.concatenate([a, b]) for a, b in zip(qdot, pdot)])


@jax.jit
def spherical_derived_and_hand(params, gains, x):
    """(feedback field, hand-written (7)-(8) terms, Dirac field) at x.

    The model is rebuilt from traced parameters, so one compilation serves every draw.
    """
    m, g, ell = params
    model = geomjax.models.spherical_pendulum(m=m, g=g, length=ell)
    y = geomjax.feedback_field(model.system, model.x0, gains=gains)
    terms = spherical_terms(x, model.x0, m, g, gains)
    dirac = geomjax.dirac_field(model.system)
    return y(x), terms, dirac(x)


def _dirac_hand(x, m, g):
    """X(x) of seed 000 §2.3 (the Dirac-extended field, no feedback)."""
    q, p = x[:3], x[3:]
    f1, f2 = q @ q, q @ p
    qd = p / m - f2 / (m * f1) * q
    pd = -m * g * E3 + f2 / (m * f1) * p + (-(p @ p) / m + m * g * q[2]) / f1 * q
    return jnp.concatenate([qd, pd])


_dirac_hand_jit = jax.jit(_dirac_hand)

params_strategy = st.tuples(
    st.floats(0.3, 4.0), st.floats(0.2, 12.0), st.floats(0.5, 2.0)
)
gains_strategy = st.lists(st.floats(0.05, 100.0), min_size=4, max_size=4)
state_strategy = hnp.arrays(np.float64, 6, elements=st.floats(-2.0, 2.0))


def _assert_terms_close(derived, terms, tol=1e-13):
    derived, terms = np.asarray(derived), np.asarray(terms)
    expected = terms.sum(axis=0)
    scale = np.abs(terms).max()
    assert np.all(np.isfinite(derived))
    err = np.abs(derived - expected).max()
    assert err <= tol * max(1.0, scale), (err, scale)


@given(params=params_strategy, gains=gains_strategy, x=state_strategy)
def test_feedback_field_matches_seed_eqs_7_8_off_constraint_set(params, gains, x):
    """Generic states of T*R³ (off T*S²), random m, g, ℓ and four distinct gains."""
    if np.linalg.norm(x[:3]) < 0.2:
        x = x.copy()
        x[:3] += np.array([0.3, -0.2, 0.4])
    params = jnp.asarray(params)
    y, terms, dirac = spherical_derived_and_hand(params, jnp.asarray(gains), jnp.asarray(x))
    _assert_terms_close(y, terms)
    np.testing.assert_allclose(
        dirac, _dirac_hand_jit(jnp.asarray(x), params[0], params[1]), rtol=1e-13, atol=1e-13 * (1 + np.abs(terms).max())
    )


def _on_sphere(rng, ell):
    """A random point of T*S²_ℓ: |q| = ℓ, q·p = 0."""
    q = rng.normal(size=3)
    q *= ell / np.linalg.norm(q)
    p = rng.normal(size=3) * 1.5
    p -= (p @ q) / (q @ q) * q
    return np.concatenate([q, p])


def test_feedback_field_matches_seed_eqs_7_8_on_constraint_set(rng):
    for trial in range(20):
        m, g, ell = rng.uniform(0.3, 3.0), rng.uniform(0.5, 10.0), rng.uniform(0.5, 2.0)
        gains = rng.uniform(0.5, 80.0, size=4)
        x = _on_sphere(rng, ell)
        y, terms, dirac = spherical_derived_and_hand(jnp.array([m, g, ell]), jnp.asarray(gains), jnp.asarray(x))
        # On T*S² the constraint terms of V vanish; the energy and J terms need not.
        _assert_terms_close(y, terms)
        np.testing.assert_allclose(dirac, _dirac_hand_jit(jnp.asarray(x), m, g), rtol=1e-13, atol=1e-13)


def test_feedback_field_seed_setup_at_x0_and_on_its_orbit():
    """With seed 000's gains (50 each) the feedback vanishes on V⁻¹(0): Y = X there.

    Rotations about e₃ keep f, H and J, so they map x0 to other points of V⁻¹(0).
    """
    model = geomjax.models.spherical_pendulum()
    y = geomjax.feedback_field(model.system, model.x0, gains=50.0)
    x_field = geomjax.dirac_field(model.system)
    for angle in [0.0, 0.4, 2.0]:
        c, s = np.cos(angle), np.sin(angle)
        rot = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
        x = jnp.asarray(np.concatenate([rot @ np.asarray(model.x0[:3]), rot @ np.asarray(model.x0[3:])]))
        np.testing.assert_allclose(y(x), x_field(x), atol=1e-13)
        np.testing.assert_allclose(y(x), _dirac_hand(x, 1.0, 1.0), atol=1e-14)
    # Exact values at x0 = ((0, 1, 0), (1, 0, −1)): q̇ = p, ṗ = −e₃ − |p|² q = (0, −2, −1).
    np.testing.assert_allclose(y(model.x0), [1.0, 0.0, -1.0, 0.0, -2.0, -1.0], atol=1e-15)


def test_planar_feedback_field_matches_seed_eqs_10_11(rng):
    @jax.jit
    def both(params, gains, x):
        m, g, ell = params
        model = geomjax.models.planar_pendulum(m=m, g=g, length=ell)
        y = geomjax.feedback_field(model.system, model.x0, gains=gains)
        return y(x), planar_terms(x, model.x0, m, g, gains)

    for trial in range(15):
        params = jnp.asarray([rng.uniform(0.3, 3.0), rng.uniform(0.5, 10.0), rng.uniform(0.5, 2.0)])
        gains = jnp.asarray(rng.uniform(0.5, 80.0, size=3))
        x = jnp.asarray(rng.uniform(-1.5, 1.5, size=4))
        y, terms = both(params, gains, x)
        _assert_terms_close(y, terms)


# --------------------------------------------------------------------------------------
# Gain forms, metric, Lyapunov decrease.
# --------------------------------------------------------------------------------------


def test_gain_forms_scalar_vector_and_matrix_agree(spherical, rng):
    sys, x0 = spherical.system, spherical.x0
    y_scalar = geomjax.feedback_field(sys, x0, gains=7.0)
    y_vector = geomjax.feedback_field(sys, x0, gains=jnp.full(4, 7.0))
    y_matrix = geomjax.feedback_field(sys, x0, gains=7.0 * jnp.eye(4))
    for _ in range(3):
        x = jnp.asarray(rng.uniform(-1.2, 1.2, size=6))
        np.testing.assert_allclose(y_vector(x), y_scalar(x), rtol=1e-14, atol=1e-13)
        np.testing.assert_allclose(y_matrix(x), y_scalar(x), rtol=1e-13, atol=1e-12)


def test_feedback_is_dirac_minus_metric_times_grad_v_for_matrix_gains(spherical, rng):
    """Y = X − L∇V with ∇V from autodiff of V = ½ΔFᵀKΔF, for a full SPD K and an SPD metric L."""
    sys, x0 = spherical.system, spherical.x0
    a = rng.normal(size=(4, 4))
    k = jnp.asarray(a @ a.T + 4 * np.eye(4))
    b = rng.normal(size=(6, 6))
    ell = jnp.asarray(b @ b.T / 6 + np.eye(6))
    x_field = geomjax.dirac_field(sys)
    for metric in [None, 0.3, ell]:
        y = geomjax.feedback_field(sys, x0, gains=k, metric=metric)
        for _ in range(3):
            x = jnp.asarray(rng.uniform(-1.2, 1.2, size=6))
            dF = spherical_quantities(x) - spherical_quantities(x0)
            np.testing.assert_allclose(y.lyapunov(x), 0.5 * dF @ k @ dF, rtol=1e-13)
            grad_v = jax.grad(y.lyapunov)(x)
            lg = grad_v if metric is None else (metric * grad_v if np.ndim(metric) == 0 else ell @ grad_v)
            expected = x_field(x) - lg
            np.testing.assert_allclose(y(x), expected, rtol=1e-12, atol=1e-11 * (1 + np.abs(expected).max()))


# --------------------------------------------------------------------------------------
# Df·X = 0, ∇H·X = 0 off the constraint set (hypothesis).
# --------------------------------------------------------------------------------------


def _invariance_residuals(system):
    """Jitted x ↦ (Df·X, |∇f_i|, ∇H·X, |∇H|, scale) for the Dirac field X of `system`.

    scale = max(|X|, |X_H|): X may vanish (a pendulum at rest upside down) while its terms
    do not, so round-off is measured against the larger of the two.
    """
    field = geomjax.dirac_field(system)
    x_h = geomjax.hamiltonian_vector_field(system.hamiltonian, system.structure)

    def residuals(x):
        v = field(x)
        jac_f = jax.jacrev(system.constraint_functions)(x)
        grad_h = jax.grad(system.hamiltonian)(x)
        scale = jnp.maximum(jnp.linalg.norm(v), jnp.linalg.norm(x_h(x)))
        return jac_f @ v, jnp.linalg.norm(jac_f, axis=1), grad_h @ v, jnp.linalg.norm(grad_h), scale

    return jax.jit(residuals)


def _ellipse_h(x):
    q, p = x[:2], x[2:]
    minv = jnp.array([[1.0, 0.2], [0.2, 0.5]])
    return 0.5 * p @ minv @ p + q[1] + 0.1 * q[0] ** 3


def _double_pendulum_h(x):
    q, p = x[:4], x[4:]
    return 0.5 * p[:2] @ p[:2] / 1.5 + 0.5 * p[2:] @ p[2:] / 0.7 + 9.8 * (1.5 * q[1] + 0.7 * q[3])


def _double_pendulum_g(q):
    a, b = q[:2], q[2:]
    return jnp.stack([a @ a - 1.0, (b - a) @ (b - a) - 0.64])


SYSTEMS = {
    "spherical": geomjax.models.spherical_pendulum(m=1.3, g=2.0).system,
    "holonomic_circle": geomjax.System(
        _ellipse_h, geomjax.canonical(2), holonomic=lambda q: jnp.atleast_1d(q @ q - 1.0)
    ),
    "holonomic_double_pendulum": geomjax.System(_double_pendulum_h, geomjax.canonical(4), holonomic=_double_pendulum_g),
}
RESIDUALS = {name: _invariance_residuals(system) for name, system in SYSTEMS.items()}


def _check_invariance(name, x):
    df_x, norm_df, dh_x, norm_dh, scale = map(np.asarray, RESIDUALS[name](jnp.asarray(x)))
    assert np.all(np.isfinite(df_x)) and np.isfinite(dh_x)
    assert scale > 0
    assert np.all(np.abs(df_x) <= 1e-10 * norm_df * scale), (df_x, norm_df, scale)
    assert abs(dh_x) <= 1e-10 * norm_dh * scale, (dh_x, norm_dh, scale)


def _away_from(x, n, lo=0.3):
    """Push q away from the origin so that C = {f_i, f_j} stays well-conditioned."""
    x = np.array(x, dtype=np.float64)
    q = x[:n]
    r = np.linalg.norm(q)
    if r < lo:
        q = q + lo * np.eye(n)[0]
    x[:n] = q
    return x


@given(hnp.arrays(np.float64, 6, elements=st.floats(-2.0, 2.0)))
def test_dirac_field_keeps_f_and_h_spherical(x):
    _check_invariance("spherical", _away_from(x, 3))


@given(hnp.arrays(np.float64, 4, elements=st.floats(-2.0, 2.0)))
def test_dirac_field_keeps_f_and_h_holonomic(x):
    _check_invariance("holonomic_circle", _away_from(x, 2))


@given(
    st.floats(0.0, 2 * np.pi),
    st.floats(0.0, 2 * np.pi),
    st.floats(0.6, 1.5),
    st.floats(0.4, 1.2),
    hnp.arrays(np.float64, 4, elements=st.floats(-2.0, 2.0)),
)
def test_dirac_field_keeps_f_and_h_two_holonomic_constraints(a1, a2, r1, r2, p):
    """Planar double pendulum, g = (|q₁|² − 1, |q₂ − q₁|² − 0.64): f has four entries, C is 4×4."""
    q1 = r1 * np.array([np.cos(a1), np.sin(a1)])
    q2 = q1 + r2 * np.array([np.cos(a2), np.sin(a2)])
    _check_invariance("holonomic_double_pendulum", np.concatenate([q1, q2, p]))


def test_off_constraint_samples_really_are_off(rng):
    """The hypothesis samples above are generic: f ≠ its value on S, so the identities are not trivial."""
    x = jnp.asarray(_away_from(rng.uniform(-2, 2, size=6), 3))
    f = np.asarray(SYSTEMS["spherical"].constraint_functions(x))
    assert abs(f[0] - 1.0) > 1e-3 and abs(f[1]) > 1e-3
    # X_H alone does not keep f: the Dirac correction is doing the work.
    xh = geomjax.hamiltonian_vector_field(SYSTEMS["spherical"].hamiltonian, SYSTEMS["spherical"].structure)(x)
    assert abs(float(jax.jacrev(SYSTEMS["spherical"].constraint_functions)(x)[1] @ xh)) > 1e-3


@pytest.fixture(scope="module")
def lyapunov_check():
    model = geomjax.models.spherical_pendulum(m=0.8, g=1.7)
    y = geomjax.feedback_field(model.system, model.x0, gains=jnp.array([2.0, 3.0, 5.0, 7.0]))

    @jax.jit
    def check(x):
        grad_v = jax.grad(y.lyapunov)(x)
        return grad_v @ y(x), grad_v @ grad_v, jnp.linalg.norm(y(x))

    return check


@given(hnp.arrays(np.float64, 6, elements=st.floats(-1.5, 1.5)))
def test_feedback_decreases_lyapunov_function(lyapunov_check, x):
    """dV/dt = ∇V·(X − ∇V) = −|∇V|² since ∇V·X = 0 (seed 000 §2.2)."""
    x = _away_from(x, 3)
    vdot, gg, ny = map(float, lyapunov_check(jnp.asarray(x)))
    assert vdot <= 0.0
    assert abs(vdot + gg) <= 1e-10 * np.sqrt(gg) * max(ny, 1.0) + 1e-300


@given(hnp.arrays(np.float64, 6, elements=st.floats(-2.0, 2.0)))
def test_holonomic_form_gives_the_same_dirac_field(x):
    """f = (|q|² − ℓ², 2q·p/m) (from holonomic=g) is a constant linear change of f = (|q|², q·p),
    and the Dirac formula is invariant under it: the two systems give one field everywhere."""
    x = _away_from(x, 3)
    a, b = _HOLONOMIC_PAIR(jnp.asarray(x))
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12 * (1 + np.abs(np.asarray(b)).max()))


def _holonomic_pair():
    model = geomjax.models.spherical_pendulum(m=1.3, g=2.0, length=1.2)
    holo = geomjax.System(
        model.system.hamiltonian, geomjax.canonical(3), holonomic=lambda q: jnp.atleast_1d(q @ q - 1.44)
    )
    fa, fb = geomjax.dirac_field(holo), geomjax.dirac_field(model.system)
    return jax.jit(lambda x: (fa(x), fb(x)))


_HOLONOMIC_PAIR = _holonomic_pair()


def test_holonomic_completion_adds_hidden_constraint():
    """holonomic=g gives f = (g(q), Dg(q)·∂H/∂p); for g = |q|² − 1, H = |p|²/2m + …: (|q|² − 1, 2q·p/m)."""
    m = 1.3
    holo = geomjax.System(
        lambda x: 0.5 * x[3:] @ x[3:] / m + x[2], geomjax.canonical(3), holonomic=lambda q: jnp.atleast_1d(q @ q - 1.0)
    )
    x = jnp.array([0.3, -0.4, 1.1, 0.5, 0.7, -0.2])
    q, p = np.asarray(x[:3]), np.asarray(x[3:])
    np.testing.assert_allclose(holo.constraint_functions(x), [q @ q - 1.0, 2 * q @ p / m], rtol=1e-14)


def test_constraint_matrix_of_spherical_pendulum(spherical):
    x = jnp.array([0.3, -0.4, 1.1, 0.5, 0.7, -0.2])
    c = np.asarray(geomjax.constraint_matrix(spherical.system, x))
    r2 = float(x[:3] @ x[:3])
    np.testing.assert_allclose(c, [[0.0, 2 * r2], [-2 * r2, 0.0]], rtol=1e-14)


def test_unconstrained_dirac_field_is_hamiltonian_field():
    inertia = jnp.array([3.0, 2.0, 1.0])
    body = geomjax.System(lambda m: 0.5 * jnp.sum(m**2 / inertia), geomjax.lie_poisson_so3())
    x = jnp.array([1.0, -0.5, 0.25])
    np.testing.assert_allclose(geomjax.dirac_field(body)(x), np.cross(x, x / inertia), rtol=1e-14)


# --------------------------------------------------------------------------------------
# Models.
# --------------------------------------------------------------------------------------


def test_spherical_pendulum_model_initial_values(spherical):
    x0 = np.asarray(spherical.x0)
    np.testing.assert_array_equal(x0, [0.0, 1.0, 0.0, 1.0, 0.0, -1.0])
    np.testing.assert_allclose(spherical.system.constraint_functions(spherical.x0), [1.0, 0.0])
    assert float(spherical.system.hamiltonian(spherical.x0)) == pytest.approx(1.0)
    np.testing.assert_allclose(spherical.system.integral_values(spherical.x0), [-1.0])
    np.testing.assert_allclose(spherical.system.conserved_quantities(spherical.x0), [1.0, 0.0, 1.0, -1.0])
    assert tuple(spherical.quantity_names) == ("f1", "f2", "H", "J")
    for key in ("m", "g", "length"):
        assert float(spherical.params[key]) == 1.0


def test_planar_pendulum_model_initial_values(planar):
    np.testing.assert_array_equal(np.asarray(planar.x0), [1.0, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(planar.system.conserved_quantities(planar.x0), [1.0, 0.0, 0.0])
    assert tuple(planar.quantity_names) == ("f1", "f2", "H")


def test_model_parameters_enter_the_system():
    model = geomjax.models.spherical_pendulum(m=2.0, g=3.0, length=1.5)
    x0 = np.asarray(model.x0)
    np.testing.assert_allclose(x0[:3], [0.0, 1.5, 0.0])
    # H = |p|²/2m + m g q₃ = 2/4 + 6·0; f₁ = ℓ².
    np.testing.assert_allclose(model.system.conserved_quantities(model.x0), [2.25, 0.0, 0.5, -1.5])
