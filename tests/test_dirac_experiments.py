"""Seed 003's models (Cartesian pendulum, Ziegler column) and its experiments.

The models' L and φ are checked against formulas written out here, their initial states
for consistency; each experiment runs end to end on a tiny configuration; the Table-I
ranking is checked at the chosen setting for the methods geomjax has.
"""

import jax
import jax.numpy as jnp
import numpy as np

import geomjax
from geomjax.experiments import _dirac_methods as dm
from geomjax.experiments import pendulum_dirac


def test_cartesian_pendulum_lagrangian_and_constraint(rng):
    m, g, ell = 1.3, 2.5, 0.7
    model = geomjax.models.cartesian_pendulum(m=m, g=g, length=ell, angle=0.4)
    for _ in range(5):
        q, v = rng.normal(size=2), rng.normal(size=2)
        assert np.isclose(float(model.lagrangian(jnp.asarray(q), jnp.asarray(v))),
                          0.5 * m * (v[0] ** 2 + v[1] ** 2) - m * g * q[1], rtol=1e-14)
        assert np.allclose(np.asarray(model.holonomic(jnp.asarray(q))), [q[0] ** 2 + q[1] ** 2 - ell**2], rtol=1e-14)
        x = jnp.asarray(np.concatenate([q, m * v]))
        energy = 0.5 * m * (v @ v) + m * g * q[1]
        assert np.isclose(float(model.system.hamiltonian(x)), energy, rtol=1e-12)
    x0 = np.asarray(model.x0)
    np.testing.assert_allclose(x0, [ell * np.sin(0.4), -ell * np.cos(0.4), 0.0, 0.0], atol=1e-15)
    assert abs(float(model.holonomic(model.x0[:2])[0])) < 1e-15


def _column_lagrangian_by_hand(q, v, k, P, m):
    x1, y1, x2, y2 = q
    t1 = np.arctan2(x1, y1)
    t2 = np.arctan2(x2 - x1, y2 - y1)
    kinetic = 0.5 * m[0] * (v[0] ** 2 + v[1] ** 2) + 0.5 * m[1] * (v[2] ** 2 + v[3] ** 2)
    return kinetic - P * y1 - P * y2 - 0.5 * k * t1**2 - 0.5 * k * (t2 - t1) ** 2


def test_ziegler_column_lagrangian_and_constraints(rng):
    k, P, lengths, m = 1.7, 0.45, (1.0, 0.8), (1.2, 0.9)
    model = geomjax.models.ziegler_column(2, k=k, P=P, lengths=lengths, m=m, angles=(0.3, -0.2))
    for _ in range(5):
        q = np.array([0.2, 0.9, 0.5, 1.6]) + 0.1 * rng.normal(size=4)
        v = rng.normal(size=4)
        ours = float(model.lagrangian(jnp.asarray(q), jnp.asarray(v)))
        assert np.isclose(ours, _column_lagrangian_by_hand(q, v, k, P, m), rtol=1e-13)
        phi = np.asarray(model.holonomic(jnp.asarray(q)))
        np.testing.assert_allclose(phi, [q[0] ** 2 + q[1] ** 2 - 1.0, (q[2] - q[0]) ** 2 + (q[3] - q[1]) ** 2 - 0.64],
                                   rtol=1e-13, atol=1e-15)
        # the written-out Hamiltonian is the Legendre transform of L
        x = jnp.asarray(np.concatenate([q, np.repeat(m, 2) * v]))
        h_legendre = float(model.lagrangian_system.to_hamiltonian().hamiltonian(x))
        assert np.isclose(float(model.system.hamiltonian(x)), h_legendre, rtol=1e-12)


def test_ziegler_column_initial_state_is_consistent():
    angles, rates = jnp.array([0.3, -0.5, 1.1]), jnp.array([0.2, -0.4, 0.7])
    lengths, m = jnp.array([1.0, 0.6, 0.8]), jnp.array([1.0, 2.0, 0.5])
    x = geomjax.models.column_state(angles, lengths, rates=rates, m=m)
    model = geomjax.models.ziegler_column(3, lengths=lengths, m=m, angles=angles)
    q, p = x[:6], x[6:]
    np.testing.assert_allclose(np.asarray(model.holonomic(q)), 0.0, atol=1e-15)
    np.testing.assert_allclose(np.asarray(geomjax.models.column_angles(q)), np.asarray(angles), atol=1e-15)
    v = p / jnp.repeat(m, 2)
    # velocities tangent to the constraints, and equal to d/dt of the positions
    np.testing.assert_allclose(np.asarray(jax.jacfwd(model.holonomic)(q) @ v), 0.0, atol=1e-14)
    dq = jax.jvp(lambda a: geomjax.models.column_state(a, lengths, m=m)[:6], (angles,), (rates,))[1]
    np.testing.assert_allclose(np.asarray(dq), np.asarray(v), atol=1e-14)
    # the model's default start: at rest, on the constraints
    np.testing.assert_allclose(np.asarray(model.x0[6:]), 0.0)
    np.testing.assert_allclose(np.asarray(model.x0[:6]), np.asarray(q), atol=1e-15)


def test_table1_ranking_at_the_chosen_setting():
    """At the chosen setting the seed's ranking holds for Dirac-1 > Dirac-2 and AB3 > RK4,
    with Dirac-1 worst and RK4 best; the trapezium on the index-reduced field keeps φ far
    better than the seed's (see the experiment's docstring): it is not ranked here."""
    angle, m = pendulum_dirac.DEFAULT_SETTING
    model = pendulum_dirac._model(angle)
    names = dm.available(("dirac1", "dirac2", "ab3", "rk4"))
    errors = {}
    for name in names:
        xs = dm.RUNS[name](model, model.x0, pendulum_dirac.PERIOD / m, pendulum_dirac.PERIODS * m, 1)
        errors[name] = float(jnp.max(pendulum_dirac._relative_error(xs)))
    ranked = sorted(errors, key=lambda k: -errors[k])
    assert ranked[0] == "dirac1" and ranked[-1] == "rk4"
    assert errors["dirac1"] > 10 * errors["dirac2"]
    if "ab3" in errors:
        assert errors["ab3"] > 100 * errors["rk4"]
