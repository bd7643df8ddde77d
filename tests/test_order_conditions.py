"""Order conditions by Taylor expansion in h (seed 004's procedure, automated).

- Taylor coefficients through implicit solves (geomjax.Newton and series_root).
- Seed 004's worked example: the symplecticity conditions a + b − c − d = 0 (h¹) and,
  under consistency, a − d = 0 (h²); symplectic Euler and the midpoint rule satisfy them.
- Seed 004's Dirac–Runge–Kutta claim for s = 1, with the relation defects measured three
  ways (see `_dirac_defects`). What holds: imposed as Dirac-1 discretises them (base point
  q₀, velocity q̃ = (q₁ − q₀)/h), the relations force (a, â) = (0, 1) already at h¹, and
  that method *is* Dirac-1 (to all orders, not only h²). Imposed at the end point they
  force a = â (h¹) and a = â = 1 (h²) instead; Dirac-1 violates α(q₁)ṽ = 0 at h¹, and the
  position constraint drifts by ½ D²φ(v, v) h² per step (a = ½ would remove that term).
- Two-stage explicit Runge–Kutta: b₁ + b₂ = 1, b₂c₂ = ½; Heun and the midpoint method.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax

TOL = 1e-12
FAST_COMPILE = {"xla_backend_optimization_level": 0}  # large graphs evaluated once or twice


def _assert_condition(condition, expected):
    """`condition` is the polynomial `expected` (dict monomial → value) to 1e-12."""
    got = condition.coefficients
    assert set(got) == set(expected), (str(condition), expected)
    for mono, value in expected.items():
        assert abs(got[mono] - value) <= TOL, (str(condition), mono)
    # the unrounded fitted values too
    assert max(abs(v - float(c)) for v, (_, c) in zip(condition.values, condition.terms)) <= TOL
    assert condition.exact


# ---------------------------------------------------------------------------------------
# Taylor coefficients through implicit maps


def test_taylor_coefficients_through_newton_and_series_root():
    # y = 1 + h y²: y = (1 − √(1 − 4h))/(2h) = Σ Catalan(k) hᵏ.
    catalan = [1.0, 1.0, 2.0, 5.0, 14.0]

    def newton(h):
        return geomjax.Newton().solve(lambda y: y - 1.0 - h * y**2, jnp.array([1.0])).value[0]

    def series(h):
        return geomjax.series_root(lambda y, h: y - 1.0 - h * y**2, jnp.array([1.0]), h, 4)[0]

    for fn in (newton, series):
        cs = [float(c) for c in geomjax.taylor_coefficients(fn, 4)]
        np.testing.assert_allclose(cs, catalan, rtol=0, atol=1e-12)


def test_newton_and_series_root_give_the_same_step_jacobian_series():
    # The implicit seed-004 step (a, b, c, d) = (0.3, 0.8, 0.6, 0.2), solved by geomjax.Newton
    # (derivatives by the implicit function theorem) and by series_root: the Taylor
    # coefficients in h of DΦ_h agree through h².
    n = 1
    H = geomjax.random_polynomial(jax.random.key(1), 2 * n, 4)
    x = jax.random.normal(jax.random.key(2), (2 * n,))
    a, b, c, d = 0.3, 0.8, 0.6, 0.2

    def residual(z, x, h):
        q, p, q1, p1 = x[:n], x[n:], z[:n], z[n:]
        g = jax.jacfwd(H)(jnp.concatenate([a * q + b * q1, c * p + d * p1]))
        return jnp.concatenate([q1 - q - h * g[n:], p1 - p + h * g[:n]])

    def newton_step(x, h):
        return geomjax.Newton().solve(lambda z: residual(z, x, h), x).value

    def series_step(x, h):
        return geomjax.series_root(lambda z, h: residual(z, x, h), x, h, 2)

    @partial(jax.jit, compiler_options=FAST_COMPILE)
    def series(x):
        return [
            jnp.stack(geomjax.taylor_coefficients(lambda h: jax.jacfwd(step, 0)(x, h), 2))
            for step in (newton_step, series_step)
        ]

    by_newton, by_series = series(x)
    np.testing.assert_allclose(by_newton, by_series, rtol=0, atol=1e-12 * float(jnp.max(jnp.abs(by_newton))))
    assert float(jnp.max(jnp.abs(by_newton[2]))) > 1e-3


# ---------------------------------------------------------------------------------------
# Seed 004: symplecticity of q⁺ = q + h H_p(q̄, p̄), p⁺ = p − h H_q(q̄, p̄)


def _seed_family(n, state_scale):
    def sample(key):
        k1, k2, k3 = jax.random.split(key, 3)
        H = geomjax.random_polynomial(k1, 2 * n, 3)
        x = state_scale * jax.random.normal(k2, (2 * n,))
        return H, x, jax.random.normal(k3, (2, 2 * n))  # state and two tangent vectors

    def step(th, H, x, h):
        q, p = x[:n], x[n:]

        def residual(z, h):
            q1, p1 = z[:n], z[n:]
            g = jax.jacfwd(H)(jnp.concatenate([th["a"] * q + th["b"] * q1, th["c"] * p + th["d"] * p1]))
            return jnp.concatenate([q1 - q - h * g[n:], p1 - p + h * g[:n]])

        return geomjax.series_root(residual, x, h, 2)

    def defect(th, problem, h):
        # ω(DΦ u, DΦ w) − ω(u, w), ω = dq ∧ dp: the symplecticity defect DΦᵀJDΦ − J
        # applied to random tangent vectors (u, w).
        H, x, uw = problem
        du, dw = jax.vmap(lambda u: jax.jvp(lambda x: step(th, H, x, h), (x,), (u,))[1])(uw)

        def omega(u, w):
            return u[:n] @ w[n:] - u[n:] @ w[:n]

        return omega(du, dw) - omega(uw[0], uw[1])

    return sample, defect


def test_seed_symplecticity_h1_condition():
    # With a + b ≠ 1 the method evaluates H at ((a + b) q, (c + d) p) already at h = 0, so
    # its Taylor coefficients are polynomial in θ only at the origin (the jets of the
    # random H there are arbitrary): this is the seed's expansion about the frozen point.
    sample, defect = _seed_family(n=1, state_scale=0.0)
    conditions = geomjax.order_conditions(defect, ("a", "b", "c", "d"), sample, [0, 1], samples=6)
    assert len(conditions) == 1 and conditions[0].power == 1
    _assert_condition(conditions[0], {"a": 1.0, "b": 1.0, "c": -1.0, "d": -1.0})
    assert str(conditions[0]) == "a + b − c − d = 0"
    assert repr(conditions[0]) == 'OrderCondition(power=1, expression="a + b − c − d")'


@pytest.mark.extended
def test_seed_symplecticity_h2_condition_under_consistency():
    sample, seed_defect = _seed_family(n=1, state_scale=1.0)

    def defect(th, problem, h):  # consistency: b = 1 − a, c = 1 − d
        return seed_defect(dict(a=th["a"], b=1.0 - th["a"], c=1.0 - th["d"], d=th["d"]), problem, h)

    conditions = geomjax.order_conditions(defect, ("a", "d"), sample, [1, 2], samples=4)
    assert [c.power for c in conditions] == [2]  # h¹ vanishes identically
    (h2,) = conditions
    _assert_condition(h2, {"a": 1.0, "d": -1.0})
    assert repr(h2) == 'OrderCondition(power=2, expression="a − d")'

    euler = geomjax.solve_conditions(conditions, {"a": 0.2, "d": 0.7}, fixed={"a": 1.0})
    assert euler == {"a": 1.0, "d": 1.0}  # symplectic Euler: a = d = 1, b = c = 0
    assert h2({"a": 0.5, "d": 0.5}) == 0.0  # the midpoint rule a = b = c = d = ½

    # And directly: the h¹, h² coefficients of the defect vanish for these methods.
    problem = sample(jax.random.key(7))

    @partial(jax.jit, compiler_options=FAST_COMPILE)
    def series(th):
        return jnp.stack(geomjax.taylor_coefficients(lambda h: seed_defect(th, problem, h), 2))

    for th in ((1.0, 0.0, 0.0, 1.0), (0.5, 0.5, 0.5, 0.5)):  # symplectic Euler, midpoint
        assert float(jnp.max(jnp.abs(series(dict(zip("abcd", th)))))) < 1e-12
    assert abs(float(series(dict(zip("abcd", (1.0, 0.0, 1.0, 0.0))))[2])) > 1e-3  # explicit Euler


# ---------------------------------------------------------------------------------------
# Seed 004: one-stage Dirac–Runge–Kutta versus Dirac-1


def _dirac_problem(n=2):
    def sample(key):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        extra = geomjax.random_polynomial(k1, 2 * n, 3, scale=0.2)  # L = ½|v|² + P(q, v)
        phi = geomjax.random_polynomial(k2, n, 3)  # holonomic constraint, α = Dφ
        q = 0.5 * jax.random.normal(k3, (n,))
        alpha = jax.grad(phi)(q)
        v = jax.random.normal(k4, (n,))
        v = v - alpha * (alpha @ v) / (alpha @ alpha)  # consistent: α(q)v = 0
        return extra, phi, q, v

    def unpack(problem):
        extra, phi, q, v = problem

        def lagrangian(q, v):
            return 0.5 * v @ v + extra(jnp.concatenate([q, v]))

        def alpha(q):
            return jax.jacfwd(phi)(q)[None, :]

        lv = jax.grad(lagrangian, 1)
        return lagrangian, alpha, q, v, lv(q, v)  # p = ∂L/∂v(q, v): consistent state

    return sample, unpack


def _dirac_rk(th, problem, h, unpack, order=2):
    """One step of s = 1 Dirac–RK: Q = q + h a V, P = p + h â F, F = L_q(Q, V) + α(Q)ᵀΛ,
    L_v(Q, V) = P, α(Q)V = 0, q₁ = q + hV, p₁ = p + hF; unknowns V and the impulse hΛ."""
    lagrangian, alpha, q, v, p = unpack(problem)
    lq, lv = jax.grad(lagrangian, 0), jax.grad(lagrangian, 1)
    n = q.shape[0]

    def residual(z, h):
        V, impulse = z[:n], z[n:]
        Q = q + h * th["a"] * V
        hF = h * lq(Q, V) + alpha(Q).T @ impulse
        return jnp.concatenate([lv(Q, V) - p - th["â"] * hF, alpha(Q) @ V])

    z = geomjax.series_root(residual, jnp.concatenate([v, jnp.zeros(1)]), h, order)
    V, impulse = z[:n], z[n:]
    Q = q + h * th["a"] * V
    return q + h * V, p + h * lq(Q, V) + alpha(Q).T @ impulse, V


def _dirac_defects(unpack):
    """Three ways to measure "the algebraic relations hold at the end of the step".

    - `dirac1_relations`: the relations as Dirac-1 discretises them, with the velocity
      q̃ = (q₁ − q₀)/h (= V) and the base point q₀: p₁ − ∂L/∂v(q₀, q̃), α(q₀) q̃.
    - `step_velocity`: at the end point with the step's velocity: p₁ − ∂L/∂v(q₁, V), α(q₁)V.
    - `legendre_velocity`: at the end point with the velocity the end momentum implies,
      ṽ solving ∂L/∂v(q₁, ṽ) = p₁: α(q₁) ṽ (the hidden constraint of the end state).
    """
    def dirac1_relations(th, problem, h):
        lagrangian, alpha, q, v, p = unpack(problem)
        q1, p1, V = _dirac_rk(th, problem, h, unpack)
        return jnp.concatenate([p1 - jax.grad(lagrangian, 1)(q, V), alpha(q) @ V])

    def step_velocity(th, problem, h):
        lagrangian, alpha, q, v, p = unpack(problem)
        q1, p1, V = _dirac_rk(th, problem, h, unpack)
        return jnp.concatenate([p1 - jax.grad(lagrangian, 1)(q1, V), alpha(q1) @ V])

    def legendre_velocity(th, problem, h):
        lagrangian, alpha, q, v, p = unpack(problem)
        q1, p1, _ = _dirac_rk(th, problem, h, unpack)
        lv = jax.grad(lagrangian, 1)
        vt = geomjax.series_root(lambda w, h: lv(q1, w) - p1, v, h, 2)
        return alpha(q1) @ vt

    return dirac1_relations, step_velocity, legendre_velocity


@pytest.mark.extended
def test_dirac_rk_one_stage_conditions_give_dirac1():
    sample, unpack = _dirac_problem()
    dirac1_relations, _, _ = _dirac_defects(unpack)
    conditions = geomjax.order_conditions(dirac1_relations, ("a", "â"), sample, [1, 2], nonzero=("â",), samples=3)
    h1 = [c for c in conditions if c.power == 1]
    assert sorted(str(c) for c in h1) == ["a = 0", "â − 1 = 0"]
    _assert_condition(h1[0], {"a": 1.0})
    _assert_condition(h1[1], {"â": 1.0, "1": -1.0})
    theta = geomjax.solve_conditions(h1, {"a": 0.3, "â": 0.6})
    assert abs(theta["a"]) < TOL and abs(theta["â"] - 1.0) < TOL
    # h² adds nothing new: every h² condition holds at (0, 1)
    assert all(abs(c(theta)) < TOL for c in conditions if c.power == 2)

    # The found method's map against Dirac-1 as seed 003 writes it (p₁ = ∂L/∂v(q₀, q̃),
    # p₁ = p₀ + h ∂L/∂q(q₀, q̃) + α(q₀)ᵀλ, α(q₀)q̃ = 0, q₁ = q₀ + h q̃): the Taylor
    # coefficients of the difference vanish through h² (and beyond: it is Dirac-1).
    # (At finite h, the s = 1 tableau (0, 1) of geomjax.dirac_rk is checked against
    # geomjax.forced_dla(rule="left"), the same map as geomjax.dirac1, in tests/test_dirac_rk.py.)
    th = {"a": jnp.asarray(theta["a"]), "â": jnp.asarray(theta["â"])}

    @partial(jax.jit, compiler_options=FAST_COMPILE)
    def difference_series(problem):
        lagrangian, alpha, q, v, p = unpack(problem)
        lq, lv = jax.grad(lagrangian, 0), jax.grad(lagrangian, 1)
        n = q.shape[0]

        def seed003(h):
            def residual(z, h):
                qt, lam = z[:n], z[n:]
                return jnp.concatenate([lv(q, qt) - p - h * lq(q, qt) - alpha(q).T @ lam, alpha(q) @ qt])

            z = geomjax.series_root(residual, jnp.concatenate([v, jnp.zeros(1)]), h, 2)
            return jnp.concatenate([q + h * z[:n], lv(q, z[:n])])

        def difference(h):
            q1, p1, _ = _dirac_rk(th, problem, h, unpack, order=2)
            return jnp.concatenate([q1, p1]) - seed003(h)

        return jnp.stack(geomjax.taylor_coefficients(difference, 2))

    for key in jax.random.split(jax.random.key(3), 2):
        problem = sample(key)
        assert float(jnp.max(jnp.abs(difference_series(problem)))) < 1e-12


@pytest.mark.extended
def test_dirac_rk_relations_at_the_end_point_do_not_give_dirac1():
    # Measured at the end point, the relations ask for a = â (h¹) and then a = â = 1: the
    # implicit method whose stage is the end point. Dirac-1 (0, 1) violates them at h¹.
    sample, unpack = _dirac_problem()
    _, step_velocity, legendre_velocity = _dirac_defects(unpack)
    conditions = geomjax.order_conditions(legendre_velocity, ("a", "â"), sample, [1], nonzero=("â",), samples=3)
    assert [str(c) for c in conditions] == ["a − â = 0"]
    conditions = geomjax.order_conditions(step_velocity, ("a", "â"), sample, [1], nonzero=("â",), samples=3)
    assert sorted(str(c) for c in conditions) == ["a − 1 = 0", "â − 1 = 0"]
    problem = sample(jax.random.key(5))
    dirac1 = {"a": jnp.asarray(0.0), "â": jnp.asarray(1.0)}
    series = partial(jax.jit, compiler_options=FAST_COMPILE)(
        lambda th: geomjax.taylor_coefficients(lambda h: legendre_velocity(th, problem, h), 1)
    )
    cs = series(dirac1)
    assert abs(float(cs[0][0])) < 1e-13 and abs(float(cs[1][0])) > 1e-3


# ---------------------------------------------------------------------------------------
# Two-stage explicit Runge–Kutta: local error against the exact flow


def test_two_stage_runge_kutta_second_order():
    def sample(key):
        k1, k2 = jax.random.split(key)
        return geomjax.random_polynomial(k1, 2, 3, shape=(2,)), jax.random.normal(k2, (2,))

    def defect(th, problem, h):
        f, y = problem
        k1 = f(y)
        k2 = f(y + h * th["c2"] * k1)
        return y + h * (th["b1"] * k1 + th["b2"] * k2) - geomjax.exact_flow(f, y, 3)(h)

    names = ("b1", "b2", "c2")
    conditions = geomjax.order_conditions(defect, names, sample, [1, 2, 3], samples=3)
    h1, h2 = [c for c in conditions if c.power == 1], [c for c in conditions if c.power == 2]
    assert [str(c) for c in h1] == ["b1 + b2 − 1 = 0"]
    assert [str(c) for c in h2] == ["b2·c2 − 1/2 = 0"]
    _assert_condition(h1[0], {"b1": 1.0, "b2": 1.0, "1": -1.0})
    _assert_condition(h2[0], {"b2·c2": 1.0, "1": -0.5})
    # h³ cannot be met by two stages: its conditions include 1 = 0 (the f′f′f term)
    assert "1 = 0" in [str(c) for c in conditions if c.power == 3]

    heun = geomjax.solve_conditions(h1 + h2, {"b1": 0.3, "b2": 0.3}, fixed={"c2": 1.0})
    midpoint = geomjax.solve_conditions(h1 + h2, {"b1": 0.3, "b2": 0.3}, fixed={"c2": 0.5})
    for got, want in ((heun, (0.5, 0.5, 1.0)), (midpoint, (0.0, 1.0, 0.5))):
        np.testing.assert_allclose([got[k] for k in names], want, rtol=0, atol=TOL)


def test_conditions_api_errors():
    sample = lambda key: jax.random.normal(key, (2,))  # noqa: E731
    with pytest.raises(ValueError, match="powers"):
        geomjax.order_conditions(lambda th, x, h: x, ("a",), sample, [-1])
    with pytest.raises(ValueError, match="nonzero"):
        geomjax.order_conditions(lambda th, x, h: x, ("a",), sample, [1], nonzero=("b",))
    # not polynomial in θ: 1/(1 + a²)
    with pytest.raises(ValueError, match="not a polynomial"):
        geomjax.order_conditions(lambda th, x, h: h * x / (1.0 + th["a"] ** 2), ("a",), sample, [1])


def test_partitioned_family_gives_stormer_verlet():
    # p½ = p − h b₁ ∇U(q), q₁ = q + h c ∇T(p½), p₁ = p½ − h b₂ ∇U(q₁), H = T(p) + U(q):
    # every member is symplectic (three shears); second order asks for Störmer–Verlet.
    n = 1

    def sample(key):
        k1, k2, k3 = jax.random.split(key, 3)
        return geomjax.random_polynomial(k1, n, 4), geomjax.random_polynomial(k2, n, 4), jax.random.normal(k3, (2 * n,))

    def defect(th, problem, h):
        T, U, x = problem
        q, p = x[:n], x[n:]
        p_half = p - h * th["b1"] * jax.grad(U)(q)
        q1 = q + h * th["c"] * jax.grad(T)(p_half)
        p1 = p_half - h * th["b2"] * jax.grad(U)(q1)

        def field(x):
            return jnp.concatenate([jax.grad(T)(x[n:]), -jax.grad(U)(x[:n])])

        return jnp.concatenate([q1, p1]) - geomjax.exact_flow(field, x, 2)(h)

    conditions = geomjax.order_conditions(defect, ("b1", "b2", "c"), sample, [1, 2], samples=3)
    assert sorted(str(c) for c in conditions if c.power == 1) == ["b1 + b2 − 1 = 0", "c − 1 = 0"]
    theta = geomjax.solve_conditions(conditions, {"b1": 0.2, "b2": 0.9, "c": 1.3})
    np.testing.assert_allclose([theta["b1"], theta["b2"], theta["c"]], [0.5, 0.5, 1.0], rtol=0, atol=TOL)


@pytest.mark.extended
def test_reduce_conditions_states_them_as_one_groebner_basis():
    pytest.importorskip("sympy")
    # Seed 004's general family: h¹ and h² conditions together (states at the origin).
    sample, defect = _seed_family(n=2, state_scale=0.0)
    conditions = geomjax.order_conditions(defect, ("a", "b", "c", "d"), sample, [1, 2], samples=6)
    reduced = geomjax.reduce_conditions(conditions)
    # every point of the reduced set satisfies the original conditions, and conversely
    for theta in ({"a": 1.0, "b": 0.0, "c": 0.0, "d": 1.0}, {"a": 0.5, "b": 0.5, "c": 0.5, "d": 0.5}):
        assert all(abs(c(theta)) < TOL for c in conditions + reduced)
    explicit = {"a": 1.0, "b": 0.0, "c": 1.0, "d": 0.0}
    assert any(abs(c(explicit)) > 0.1 for c in reduced)
    assert all(c.exact and c.power == 2 for c in reduced)
    # a + b = c + d and (b − c)(c + d) = 0: under consistency, b = c, i.e. a = d
    assert [str(c) for c in reduced] == ["a + b − c − d = 0", "b·c + b·d − c² − c·d = 0"]
