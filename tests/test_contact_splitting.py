"""Contact Hamiltonian splitting integrators (Bravetti–Seri–Vermeeren–Zadra) for
H = T(p) + V(q, t) + f(t)s: orders 2, 4, 6 with time-dependent forcing and damping against
a Gauss-6 reference on the contact field (derived by autodiff), the order-2 map of the
damped oscillator written out by hand, the conformal factor ρ = e^{−αh} of the contact
form, and gradients against finite differences."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.tree_util import Partial

import geomjax
from geomjax import diagnostics


def potential(q, t):
    return -jnp.cos(q[0]) - 0.3 * q[0] * jnp.sin(2.0 * t)


def damping(t):
    return 0.4 + 0.2 * jnp.cos(t)


X0 = jnp.array([1.2, 0.3, 0.1])
T_FINAL = 2.0
STEPS = {order: geomjax.contact_splitting(potential, damping, order=order) for order in (2, 4, 6)}


@pytest.fixture(scope="module")
def reference():
    system = geomjax.ContactHamiltonianSystem(
        lambda q, p, s, t: 0.5 * p @ p + potential(q, t) + damping(t) * s, 1, time_dependent=True
    )
    step = geomjax.implicit_rk(geomjax.contact_field(system), geomjax.GAUSS6)
    x, status = diagnostics.final_state(step, X0, T_FINAL / 200, 200)
    assert bool(status == geomjax.RESULTS.successful)
    return np.asarray(x)


@pytest.mark.parametrize("order", [2, 4, 6])
def test_measured_order_with_forcing_and_variable_damping(order, reference):
    ns = (5, 10, 20, 40) if order == 6 else (10, 20, 40, 80)
    errors = diagnostics.global_errors(STEPS[order], X0, T_FINAL, ns, reference)
    fit = diagnostics.convergence_order([T_FINAL / n for n in ns], errors)
    assert abs(fit.order - order) <= 0.3, fit


def test_order_two_map_of_the_damped_oscillator(rng):
    alpha = 0.3
    step = geomjax.contact_splitting(lambda q, t: 0.5 * q @ q, lambda t: alpha)
    for _ in range(3):
        start = rng.normal(size=3)
        h = rng.uniform(0.05, 0.5)
        q, p, s = start
        e = np.exp(-alpha * h / 2)
        p, s = e * p, e * s  # C_{h/2}
        p, s = p - h / 2 * q, s - h / 2 * (0.5 * q * q)  # B_{h/2}
        q, s = q + h * p, s + h * 0.5 * p * p  # A_h
        p, s = p - h / 2 * q, s - h / 2 * (0.5 * q * q)  # B_{h/2}
        p, s = e * p, e * s  # C_{h/2}
        out = _one_step(step, jnp.asarray(start), jnp.asarray(h))
        np.testing.assert_allclose(out, [q, p, s], rtol=1e-14, atol=1e-15)


@eqx.filter_jit
def _one_step(step, x, h):
    return step(x, h)


@eqx.filter_jit
def _defect(step, x, h):
    jac = jax.jacfwd(lambda y: step(y, h))(x)
    y = step(x, h)
    n = (x.shape[0] - 1) // 2

    def form(u):
        return jnp.concatenate([-u[n : 2 * n], jnp.zeros(n), jnp.ones(1)])

    pulled = form(y) @ jac
    rho = pulled[-1]
    return jnp.max(jnp.abs(pulled - rho * form(x))), rho


def test_conformally_contact_with_the_continuous_factor(rng):
    alpha, h = 0.3, 0.2
    step = geomjax.contact_splitting(lambda q, t: -jnp.cos(q[0]) + 0.1 * q[1] ** 3, lambda t: alpha, order=6)
    for _ in range(2):
        defect, rho = _defect(step, jnp.asarray(rng.normal(size=5)), jnp.asarray(h))
        assert float(defect) < 1e-13, defect
        np.testing.assert_allclose(float(rho), np.exp(-alpha * h), rtol=1e-14)


def test_gradients_match_finite_differences():
    def objective(x0, alpha, h):
        step = geomjax.contact_splitting(potential, Partial(lambda a, t: a * (1.0 + 0.5 * jnp.cos(t)), alpha), order=4)
        sol = geomjax.integrate(step, x0, dt=h, steps=10, save_every=10, throw=False)
        return jnp.sum(sol.xs[-1] * jnp.array([1.0, 2.0, 3.0]))

    x0, alpha, h = X0, 0.4, 0.1
    value_and_grad = jax.jit(jax.value_and_grad(objective, argnums=(0, 1, 2)))
    grads = value_and_grad(x0, alpha, h)[1]

    def value(*a):
        return value_and_grad(*a)[0]

    eps, d = 1e-6, jnp.array([0.3, -0.1, 0.5])
    fd = [
        (value(x0 + eps * d, alpha, h) - value(x0 - eps * d, alpha, h)) / (2 * eps),
        (value(x0, alpha + eps, h) - value(x0, alpha - eps, h)) / (2 * eps),
        (value(x0, alpha, h + eps) - value(x0, alpha, h - eps)) / (2 * eps),
    ]
    np.testing.assert_allclose([float(grads[0] @ d), float(grads[1]), float(grads[2])], fd, rtol=1e-6, atol=1e-8)


def test_bad_input():
    with pytest.raises(ValueError, match="order must be 2, 4 or 6"):
        geomjax.contact_splitting(potential, order=3)
    with pytest.raises(ValueError, match="2n \\+ 1"):
        geomjax.integrate(STEPS[2], jnp.array([0.1, 0.2]), dt=0.1, steps=2)
