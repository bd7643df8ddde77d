"""Seed 001 extras: the first-order DLA step (`geomjax.dla(system, order=1)`), the seed's
momentum-conserving extension of the vertical disk, and the sign of the knife edge's ṗ_φ
off the constraint set."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax
from geomjax.models._nonholonomic import _disk_constraints

OSC = geomjax.models.nonholonomic_oscillator(eps=1.0)  # ε = 1: a strongly nonlinear coupling


def _constraint(x):  # J = p_x + y p_z for the oscillator (m = 1)
    return x[3] + x[1] * x[5]


@jax.jit
def _run(x0, h, n):
    step = geomjax.dla(OSC.system, order=1)
    return jax.lax.fori_loop(0, n, lambda i, x: step(x, h), x0)


def test_first_order_dla_has_order_one_and_keeps_the_constraint():
    # One compiled loop for every step size; the error of x_h is estimated by x_h − x_{h/2}.
    t = 1.0
    finals = [_run(OSC.x0, t / n, n) for n in (20, 40, 80, 160)]
    for x in finals:
        assert abs(float(_constraint(x))) < 1e-12
    differences = [float(jnp.abs(a - b).max()) for a, b in itertools.pairwise(finals)]
    slopes = np.log2(np.array(differences[:-1]) / np.array(differences[1:]))
    assert np.all(np.abs(slopes - 1.0) < 0.1), slopes


def test_first_order_dla_rejects_other_orders():
    with pytest.raises(ValueError, match="order must be 1"):
        geomjax.dla(OSC.system, order=3)


def _derivative(field, fn, x):
    return jax.jvp(fn, (x,), (field(x),))[1]


def test_seed_vertical_disk_keeps_all_momenta_off_the_constraint_set():
    seed = geomjax.models.vertical_disk(extension="seed")
    generic = geomjax.models.vertical_disk()
    x = seed.x0 + jnp.array([0.1, -0.2, 0.3, 0.4, 0.2, -0.3, 0.1, 0.05])  # J ≠ 0
    assert float(jnp.abs(_disk_constraints(seed.params, x)).max()) > 0.1

    def body(y):  # body-frame momenta, p_phi, p_theta, H and the body-frame constraints
        c, s = jnp.cos(y[2]), jnp.sin(y[2])
        mu1, mu2 = y[4] * c + y[5] * s, -y[4] * s + y[5] * c
        j = _disk_constraints(seed.params, y)
        return jnp.stack([mu1, mu2, y[6], y[7], seed.system.hamiltonian(y), c * j[0] + s * j[1], -s * j[0] + c * j[1]])

    rates = jax.jit(_derivative, static_argnums=(0, 1))(geomjax.dirac_field(seed.system), body, x)
    np.testing.assert_allclose(rates, 0.0, atol=1e-14)
    # ... where the generic extension changes p_phi (it keeps it only on J = 0)
    assert abs(float(_derivative(geomjax.nonholonomic_field(generic.system), lambda y: y[6], x))) > 1e-2
    # on the constraint set both are the rolling disk
    np.testing.assert_allclose(
        geomjax.dirac_field(seed.system)(seed.x0), geomjax.nonholonomic_field(generic.system)(generic.x0), atol=1e-15
    )


def test_knife_edge_p_phi_rate_off_the_constraint_set_is_plus_j_times_u():
    model = geomjax.models.knife_edge(m=2.0, inertia=3.0)
    x = jnp.array([0.3, 0.1, 0.7, 0.4, -0.2, 1.5])
    phi, px, py = x[2], x[3], x[4]
    j = (px * jnp.sin(phi) - py * jnp.cos(phi)) / 2.0
    assert abs(float(j - jax.jit(geomjax.nonholonomic_quantities, static_argnums=0)(model.system, x)[0])) < 1e-15
    rate = jax.jit(geomjax.nonholonomic_field(model.system))(x)[5]
    expected = j * (px * jnp.cos(phi) + py * jnp.sin(phi))
    assert abs(float(expected)) > 1e-2
    assert abs(float(rate - expected)) < 1e-14
