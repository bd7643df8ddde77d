"""Dirac–Runge–Kutta integrators (seed 004): tableaux, measured orders of q, p and λ,
relations at step ends, Dirac-1 = forced discrete Lagrange–d'Alembert, gradients, bad input.

The test problem is the double pendulum in Cartesian coordinates: q = (x₁, y₁, x₂, y₂),
L = ½|v|² − g(y₁ + y₂), φ = (|q₁|² − 1, |q₂ − q₁|² − 1). Orders are least-squares log–log
slopes of the error at T = 1 against a Radau IIA (s = 3) run with h = 1/1024, whose λ
agrees with the exact λ(q, p) of the DAE (checked below). The runs for the order fits go
through one jitted loop per tableau with the number of steps a traced argument (one
compilation for all step sizes; `geomjax.integrate` compiles per number of steps).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.tree_util import Partial

import geomjax
from geomjax import PartitionedTableau as PT

G = 1.0
T = 1.0


def double_pendulum(g, q, v):
    return 0.5 * v @ v - g * (q[1] + q[3])


def links(q):
    d = q[2:] - q[:2]
    return jnp.stack([q[:2] @ q[:2] - 1.0, d @ d - 1.0])


L2 = Partial(double_pendulum, G)
TH1, TH2 = 0.5, 1.0
Q0 = jnp.array([np.sin(TH1), -np.cos(TH1), np.sin(TH1) + np.sin(TH2), -np.cos(TH1) - np.cos(TH2)])
X0 = jnp.concatenate([Q0, jnp.zeros(4)])


@functools.lru_cache(maxsize=None)
def step_of(name, s):
    tab = PT.dirac1() if name == "dirac1" else PT.from_name(name, s)
    return geomjax.dirac_rk(L2, tab, holonomic=links)


@functools.lru_cache(maxsize=None)
def runner(name, s):
    """jit (x0, h, N) ↦ (x_N, λ_N, V_s, v_end): N steps; λ at the end of the last one, its
    last stage velocity and end velocity."""
    step = step_of(name, s)

    @jax.jit
    def run(x0, h, n):
        def body(_, carry):
            q, p = carry[:2]
            st = step.solve_stages(q, p, h)
            return st.q, st.p, st.lam_end, st.velocities[-1], st.v_end

        q, p = step.split(x0)
        zero = jnp.zeros_like(q)
        q, p, lam, v_last, v_end = lax.fori_loop(0, n, body, (q, p, jnp.zeros((2,), q.dtype), zero, zero))
        return jnp.concatenate([q, p]), lam, v_last, v_end

    return run


@functools.lru_cache(maxsize=None)
def reference():
    return runner("radau_iia", 3)(X0, T / 1024, 1024)[:2]


def exact_multiplier(x):
    """λ(q, p) of the DAE: d/dt[Dφ(q)v] = 0 with v̇ = −∇U + Dφᵀλ (v = p)."""
    q, v = x[:4], x[4:]
    a = jax.jacfwd(links)(q)
    curvature = jax.jvp(lambda r: jax.jacfwd(links)(r) @ v, (q,), (v,))[1]
    return jnp.linalg.solve(a @ a.T, a @ jnp.array([0.0, G, 0.0, G]) - curvature)


def slope(hs, errs):
    return float(np.polyfit(np.log(hs), np.log(errs), 1)[0])


# (name, s): (q, p, λ) measured orders, and the step counts of the fit. Classical orders:
# Gauss 2s, Radau IIA 2s − 1, Lobatto IIIA–IIIB 2s − 2. For the index-2 DAE: Gauss q and p
# reduce to s + 1 (s odd) / s (s even) except the q of s = 2 (4) and s = 3 (≈ 6 here, above
# the bound); Gauss λ (interpolated to the step end) 1, 1, 3; Radau IIA λ order s;
# Lobatto IIIA–IIIB λ order s − 1 (as Jay's for holonomic constraints). Dirac-1 is order 1.
ORDERS = {
    ("dirac1", 1): ((1, 1, 1), (16, 32, 64, 128)),
    ("gauss", 1): ((2, 2, 1), (8, 16, 32, 64)),
    ("gauss", 2): ((4, 2, 1), (8, 16, 32, 64)),
    ("gauss", 3): ((6, 4, 3), (4, 8, 16, 32)),
    ("radau_iia", 1): ((1, 1, 1), (16, 32, 64, 128)),
    ("radau_iia", 2): ((3, 3, 2), (16, 32, 64, 128)),
    ("radau_iia", 3): ((5, 5, 3), (4, 8, 16, 32)),
    ("lobatto_iiia_iiib", 2): ((2, 2, 1), (8, 16, 32, 64)),
    ("lobatto_iiia_iiib", 3): ((4, 4, 2), (8, 16, 32, 64)),
}


def test_reference_multiplier_is_the_exact_one():
    x, lam = reference()
    np.testing.assert_allclose(lam, exact_multiplier(x), atol=1e-10)


@pytest.mark.parametrize("case", list(ORDERS), ids=[f"{n}{s}" for n, s in ORDERS])
def test_measured_orders_of_q_p_and_lambda(case):
    (oq, op, ol), ns = ORDERS[case]
    xr, lr = reference()
    run = runner(*case)
    hs = T / np.asarray(ns, float)
    eq, ep, el = [], [], []
    for n in ns:
        x, lam, _, _ = run(X0, T / n, n)
        eq.append(float(jnp.max(jnp.abs(x[:4] - xr[:4]))))
        ep.append(float(jnp.max(jnp.abs(x[4:] - xr[4:]))))
        el.append(float(jnp.max(jnp.abs(lam - lr))))
    got = (slope(hs, eq), slope(hs, ep), slope(hs, el))
    assert all(abs(g - o) <= 0.3 for g, o in zip(got, (oq, op, ol))), (case, got, eq, ep, el)


# --- tableaux -----------------------------------------------------------------------------
ALL = [PT.gauss(s) for s in (1, 2, 3)] + [PT.radau_iia(s) for s in (1, 2, 3)] + [PT.lobatto_iiia_iiib(s) for s in (2, 3)]


@pytest.mark.parametrize("tab", ALL, ids=[t.name for t in ALL])
def test_tableaux_satisfy_their_order_conditions(tab):
    a, b, c = np.array(tab.a), np.array(tab.b), np.array(tab.c)
    ah, bh = np.array(tab.a_hat), np.array(tab.b_hat)
    s = tab.stages
    np.testing.assert_allclose(a.sum(axis=1), c, atol=1e-15)
    for k in range(1, s + 1):
        # C(s) (collocation in q) and the quadrature B(s); for Lobatto B(2s − 2), Gauss B(2s)
        np.testing.assert_allclose(a @ c ** (k - 1), c**k / k, atol=2e-15)
    for k in range(1, tab.order + 1):
        assert abs(b @ c ** (k - 1) - 1.0 / k) < 2e-15
    np.testing.assert_array_equal(bh, b)
    # symplectic pair: bᵢâᵢⱼ + b̂ⱼaⱼᵢ = bᵢb̂ⱼ (Gauss, Lobatto IIIA–IIIB)
    if not tab.name.startswith("radau"):
        np.testing.assert_allclose(b[:, None] * ah + bh[None, :] * a.T, np.outer(b, bh), atol=2e-15)


def test_named_tableaux_match_the_known_coefficients():
    np.testing.assert_allclose(np.array(PT.gauss(2).a), np.array(geomjax.GAUSS4.a), atol=1e-15)
    np.testing.assert_allclose(np.array(PT.gauss(3).a), np.array(geomjax.GAUSS6.a), atol=1e-15)
    r6 = np.sqrt(6.0)
    np.testing.assert_allclose(PT.radau_iia(3).c, [(4 - r6) / 10, (4 + r6) / 10, 1.0], atol=1e-15)
    np.testing.assert_allclose(PT.radau_iia(3).b, [(16 - r6) / 36, (16 + r6) / 36, 1 / 9], atol=1e-15)
    lob = PT.lobatto_iiia_iiib(3)
    np.testing.assert_allclose(lob.a_hat, [[1 / 6, -1 / 6, 0], [1 / 6, 1 / 3, 0], [1 / 6, 5 / 6, 0]], atol=1e-15)
    assert geomjax.dirac_rk(L2, "gauss", 3, holonomic=links).tableau == PT.gauss(3)


# --- relations at step ends --------------------------------------------------------------
@pytest.mark.parametrize("case", [("radau_iia", 1), ("radau_iia", 3), ("lobatto_iiia_iiib", 2), ("lobatto_iiia_iiib", 3)])
def test_step_ends_on_the_velocity_constraint_set(case):
    """Radau IIA (stiffly accurate) and Lobatto IIIA–IIIB (relations imposed at the end):
    p₁ = ∂L/∂v(q₁, v₁) with α(q₁)·v₁ = 0 to round-off, v₁ the last stage velocity / the end
    unknown. (Gauss and Dirac-1 do not have this property; the test below.)"""
    step = step_of(*case)
    for n in (1, 3):
        x, _, v_last, v_end = runner(*case)(X0, 0.1, n)
        q1, p1 = step.split(x)
        v1 = v_end if case[0].startswith("lobatto") else v_last
        np.testing.assert_allclose(step.system.momentum(q1, v1), p1, atol=1e-14)
        np.testing.assert_allclose(step.system.constraint(q1, v1), 0.0, atol=1e-14)
        assert float(jnp.max(jnp.abs(step.constraint_residuals(x)[2:]))) < 1e-14


@pytest.mark.parametrize("case", [("gauss", 2), ("dirac1", 1)])
def test_gauss_and_dirac1_leave_the_velocity_constraint_set_a_little(case):
    step = step_of(*case)
    x, _, _, v_end = runner(*case)(X0, 0.1, 1)
    q1, p1 = step.split(x)
    np.testing.assert_allclose(step.system.momentum(q1, v_end), p1, atol=1e-14)  # v_end = v(q₁, p₁)
    res = float(jnp.max(jnp.abs(step.system.constraint(q1, v_end))))
    assert 1e-8 < res < 1e-2, res
    if case[0] == "dirac1":  # the public λ of a step: Λ₁ here (one stage)
        _, lam, _, _ = runner(*case)(X0, 0.1, 1)
        np.testing.assert_allclose(jax.jit(step.multipliers)(X0, 0.1), lam, rtol=1e-14)


def knife_edge(q, v):
    return 0.5 * (v[0] ** 2 + v[1] ** 2) + 0.5 * v[2] ** 2 - 0.1 * q[0]


def blade(q):
    return jnp.array([[jnp.sin(q[2]), -jnp.cos(q[2]), 0.0]])


def test_nonholonomic_knife_edge_from_a_lagrangian_system():
    """A non-integrable constraint (α given directly, through a `LagrangianSystem`): the
    step ends keep it to round-off; the energy is kept to the method's accuracy."""
    system = geomjax.LagrangianSystem(knife_edge, 3, nonholonomic=blade)
    step = geomjax.dirac_rk(system, "lobatto_iiia_iiib", 2)
    x0 = jnp.array([0.0, 0.0, 0.3, np.cos(0.3), np.sin(0.3), 1.0])
    x = jax.jit(lambda x: lax.fori_loop(0, 40, lambda _, y: step(y, 0.05), x))(x0)
    assert float(jnp.max(jnp.abs(step.constraint_residuals(x)))) < 1e-14
    assert abs(float(step.invariants(x)[0] - step.invariants(x0)[0])) < 1e-4


def coupled(q, v):
    """An unconstrained Lagrangian with velocity–position coupling (p ≠ v)."""
    return 0.5 * v @ v + jnp.cos(q[0]) + 0.1 * q[0] * q[1] ** 2 - 0.5 * q[1] ** 2 + 0.05 * q[1] * v[0] * v[1]


@pytest.mark.parametrize("tableau, s, symplectic", [("gauss", 2, True), ("lobatto_iiia_iiib", 3, True), ("radau_iia", 2, False)])
def test_symplectic_pairs_without_constraints(tableau, s, symplectic):
    """Without constraints the Dirac–RK step is the partitioned RK method in (q, p) with
    v = v(q, p): Gauss and Lobatto IIIA–IIIB (bᵢâᵢⱼ + b̂ⱼaⱼᵢ = bᵢb̂ⱼ) are symplectic, Radau IIA
    is not."""
    step = geomjax.dirac_rk(coupled, tableau, s)
    defect = float(geomjax.diagnostics.symplecticity_defect(step, jnp.array([0.5, 0.2, 0.1, -0.3]), 0.3))
    assert (defect < 1e-13) if symplectic else (defect > 1e-6), defect


# --- Dirac-1 = forced discrete Lagrange–d'Alembert -----------------------------------------
def test_dirac1_tableau_is_forced_dla_left():
    rk = step_of("dirac1", 1)
    dla = geomjax.forced_dla(L2, nonholonomic=lambda q: jax.jacfwd(links)(q), rule="left")
    a = geomjax.integrate(rk, X0, dt=0.05, steps=20, drift_tol=None)
    b = geomjax.integrate(dla, X0, dt=0.05, steps=20, drift_tol=None)
    assert a.result == geomjax.RESULTS.successful and b.result == geomjax.RESULTS.successful
    np.testing.assert_allclose(a.xs, b.xs, rtol=0, atol=1e-13)


# --- gradients ---------------------------------------------------------------------------
def pendulum(g, q, v):
    return 0.5 * v @ v - g * q[1]


def circle(q):
    return jnp.atleast_1d(q @ q - 1.0)


def _loss(x0, g, h, tableau):
    step = geomjax.dirac_rk(Partial(pendulum, g), tableau, 2, holonomic=circle)
    sol = geomjax.integrate(step, x0, dt=h, steps=8, drift_tol=None, start_tol=None, save_every=8)
    return jnp.sum(sol.xs[-1] * jnp.array([1.0, 2.0, -0.5, 0.3]))


# 12 s; the default run differentiates Dirac-RK through tests/test_closures.py (dirac_rk)
@pytest.mark.extended
@pytest.mark.parametrize("tableau", ["lobatto_iiia_iiib"])
def test_gradients_against_finite_differences(tableau):
    x0 = jnp.array([0.6, -0.8, 0.4, 0.3])  # |q| = 1, q·p = 0
    g, h = 9.81, 0.05
    value_and_grad = jax.jit(jax.value_and_grad(functools.partial(_loss, tableau=tableau), argnums=(0, 1, 2)))
    grads = value_and_grad(x0, g, h)[1]
    eps = 1e-6

    def loss(*args):
        return value_and_grad(*args)[0]

    def fd(f):
        return (f(eps) - f(-eps)) / (2 * eps)

    tangent = jnp.array([0.8, 0.6, -0.3, 0.4])  # keeps the start on the constraint set to first order
    np.testing.assert_allclose(grads[0] @ tangent, fd(lambda e: loss(x0 + e * tangent, g, h)), rtol=1e-6)
    np.testing.assert_allclose(grads[1], fd(lambda e: loss(x0, g + e, h)), rtol=1e-6)
    np.testing.assert_allclose(grads[2], fd(lambda e: loss(x0, g, h + e)), rtol=1e-6)


def test_planar_pendulum_gauss2_loop_has_no_custom_call():
    """The simplified-Newton matrix (6 × 6) is inverted by unrolled elimination: no LAPACK
    call inside the compiled loop (it made the step about 3× slower)."""
    step = geomjax.dirac_rk(Partial(pendulum, 9.81), "gauss", 2, holonomic=circle)
    run = jax.jit(lambda x: lax.fori_loop(0, 10, lambda _, y: step(y, 0.01), x))
    text = run.lower(jnp.array([1.0, 0.0, 0.0, 0.0])).compile().as_text()
    assert text.count("custom-call") == 0


# --- failures and bad input ----------------------------------------------------------------
def test_newton_failure_is_reported():
    step = geomjax.dirac_rk(Partial(pendulum, 9.81), "gauss", 1, holonomic=circle, newton=geomjax.Newton(max_steps=1))
    sol = geomjax.integrate(step, jnp.array([0.6, -0.8, 0.4, 0.3]), dt=0.1, steps=3, throw=False, drift_tol=None)
    assert sol.result == geomjax.RESULTS.newton_failed


def test_odd_length_state():
    with pytest.raises(ValueError, match="even length"):
        geomjax.integrate(step_of("gauss", 2), jnp.zeros(7), dt=0.1, steps=2)


def test_unknown_tableau_and_stages():
    with pytest.raises(ValueError, match="unknown Dirac–Runge–Kutta tableau"):
        geomjax.dirac_rk(L2, "rk4", holonomic=links)
    with pytest.raises(ValueError, match="stages in"):
        geomjax.dirac_rk(L2, "lobatto_iiia_iiib", 1, holonomic=links)
    with pytest.raises(TypeError, match="tableau must be"):
        geomjax.dirac_rk(L2, geomjax.GAUSS4, holonomic=links)


def test_degenerate_lagrangian_and_dependent_constraints():
    degenerate = geomjax.dirac_rk(lambda q, v: v[0] ** 2 - q[1], "gauss", 1, holonomic=circle)
    with pytest.raises(ValueError, match="Hessian"):
        degenerate.check(jnp.array([1.0, 0.0, 0.0, 0.0]))
    twice = geomjax.dirac_rk(L2, "gauss", 1, holonomic=lambda q: jnp.concatenate([links(q), links(q)[:1]]))
    with pytest.raises(ValueError, match="dependent"):
        twice.check(X0)


def test_long_run_at_small_step_converges_every_step():
    # Regression: with the multipliers themselves as unknowns, round-off in the momentum
    # equations moved them by ~1e-16/h and a Gauss-2 pendulum run at h = 1e-3 failed
    # Newton's test at step 9435; the unknowns are now the impulses hΛ.
    L = lambda q, v: 0.5 * v @ v - 9.81 * q[1]  # noqa: E731
    phi = lambda q: jnp.array([q @ q - 1.0])  # noqa: E731
    x0 = jnp.array([jnp.sin(1.0), -jnp.cos(1.0), 0.0, 0.0])
    step = geomjax.dirac_rk(L, "gauss", 2, holonomic=phi)
    sol = geomjax.integrate(step, x0, dt=1e-3, steps=20000, save_every=20000, drift_tol=None, throw=False)
    assert sol.message == "success"
