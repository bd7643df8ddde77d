"""Lagrangian and contact systems: the Legendre transform by autodiff, the Hamiltonian
machinery reached from a Lagrangian, and the contact Hamiltonian field (seed 002 §2).

Hand-written formulas appear here only as independent checks: H = ½pᵀM⁻¹p + V for a
mass-matrix Lagrangian, H = √(1 + |p|²) + V for the relativistic one, the damped
oscillator's contact field and its energy decay H(t) = H(0)e^{−αt}.
"""

import functools
import warnings
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax
from geomjax import diagnostics

ALPHA = 0.3


def mass_matrix(q):
    return jnp.array([[2.0 + jnp.sin(q[0]) ** 2, 0.3 * q[1]], [0.3 * q[1], 1.0 + q[0] ** 2]])


def potential(q):
    return jnp.cos(q[0]) + 0.5 * q[1] ** 2


@pytest.mark.parametrize(
    "lagrangian, quadratic",
    [
        (lambda q, v: 0.5 * v @ v - q @ q, True),
        (lambda q, v: 0.5 * v @ mass_matrix(q) @ v + q @ v - potential(q), True),
        (lambda q, v: 0.5 * jnp.sum(v**2) * (1.0 + q[0] ** 2), True),
        (lambda q, v: 0.5 * v @ v + 0.1 * (v @ v) ** 2, False),
        (lambda q, v: -jnp.sqrt(1.0 - v @ v), False),
        (lambda q, v: jnp.where(v[0] > 0, v @ v, 2.0 * v @ v), False),
    ],
    ids=["identity", "mass-matrix+gyro", "sum", "quartic", "relativistic", "piecewise"],
)
def test_quadratic_in_velocity_is_read_off_the_jaxpr(lagrangian, quadratic):
    assert geomjax.LagrangianSystem(lagrangian, 2).quadratic is quadratic


@functools.cache
def _legendre_values():
    """The jitted Legendre checks, built when first used: the relativistic Lagrangian back
    from its Hamiltonian traces a Newton solve inside a Newton solve to decide how to invert
    it (8 s), which every xdist worker would otherwise pay when it collects this module."""
    mass_l = geomjax.LagrangianSystem(lambda q, v: 0.5 * v @ mass_matrix(q) @ v - potential(q), 2)
    relativistic = geomjax.LagrangianSystem(lambda q, v: -jnp.sqrt(1.0 - v @ v) - potential(q), 2)
    back = geomjax.LagrangianSystem.from_hamiltonian(relativistic.to_hamiltonian())

    @jax.jit
    def values(q, p, w):
        x = jnp.concatenate([q, p])
        out = {}
        # mass matrix: one linear solve, exact
        out["mass_h"] = mass_l.hamiltonian(x)
        out["mass_p"] = mass_l.momentum(q, mass_l.velocity(q, p))
        # relativistic: Newton (from v = p, which must lie in |v| < 1, the domain of L)
        pr = 0.3 * p
        xr = jnp.concatenate([q, pr])
        out["rel_p"] = relativistic.momentum(q, relativistic.velocity(q, pr))
        out["rel_h"] = relativistic.hamiltonian(xr)
        out["rel_grad"] = jax.grad(relativistic.hamiltonian)(xr)
        # and back: L from the Hamiltonian system; E(q, w) = H(q, ∂L/∂v(q, w))
        out["back_l"] = back.lagrangian(q, w)
        out["rel_l"] = relativistic.lagrangian(q, w)
        out["energy"] = relativistic.energy(q, w)
        out["h_of_energy"] = relativistic.hamiltonian(jnp.concatenate([q, relativistic.momentum(q, w)]))
        # a Newton solve that leaves the domain (first guess |v| > 1) gives NaN, not a value
        out["outside"] = relativistic.velocity(q, jnp.array([3.0, 0.0]))
        return out

    return values


@pytest.mark.extended  # 9 s (one large compile); the Legendre maps of LagrangianSystem run in every Lagrangian test (dirac, dirac_rk, herglotz, the bad-input table)
def test_legendre_both_ways_at_random_states(rng):
    for _ in range(3):
        q, p = rng.normal(size=2), rng.normal(size=2)
        w = 0.5 * rng.uniform(-1, 1, 2) / np.sqrt(2)
        out = {k: np.asarray(v) for k, v in _legendre_values()(q, p, w).items()}
        m = np.asarray(mass_matrix(q))
        v_pot = float(potential(jnp.asarray(q)))
        np.testing.assert_allclose(out["mass_h"], 0.5 * p @ np.linalg.solve(m, p) + v_pot, rtol=1e-14)
        np.testing.assert_allclose(out["mass_p"], p, rtol=1e-13, atol=1e-14)
        pr = 0.3 * p
        np.testing.assert_allclose(out["rel_p"], pr, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(out["rel_h"], np.sqrt(1.0 + pr @ pr) + v_pot, rtol=1e-13)
        np.testing.assert_allclose(out["rel_grad"][2:], pr / np.sqrt(1.0 + pr @ pr), rtol=1e-12)
        np.testing.assert_allclose(out["rel_grad"][:2], [-np.sin(q[0]), q[1]], rtol=1e-12)
        np.testing.assert_allclose(out["back_l"], out["rel_l"], rtol=1e-12)
        np.testing.assert_allclose(out["energy"], out["h_of_energy"], rtol=1e-12)
        assert np.all(np.isnan(out["outside"]))


def test_a_lagrangian_gets_rattle_and_dla_through_its_hamiltonian():
    from geomjax.diagnostics import final_state

    # The spherical pendulum written as L = |v|²/2 − z with g(q) = |q|² − 1 runs RATTLE
    # exactly as the Hamiltonian model does.
    sphere = geomjax.models.spherical_pendulum(holonomic=True)
    lag = geomjax.LagrangianSystem(
        lambda q, v: 0.5 * v @ v - q[2], 3, holonomic=lambda q: jnp.atleast_1d(q @ q - 1.0)
    )
    system = lag.to_hamiltonian()
    assert isinstance(system, geomjax.HolonomicSystem)
    a, _ = final_state(geomjax.rattle(system), sphere.x0, 0.05, 10)
    b, _ = final_state(geomjax.rattle(sphere.system), sphere.x0, 0.05, 10)
    np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)
    # The knife edge (seed 001) from its Lagrangian with the model's one-forms: the
    # derived NonholonomicSystem has the model's J, C and H_ext (so `geomjax.dla`, the
    # extended and feedback fields see the same system).
    knife = geomjax.models.knife_edge()
    lag = geomjax.LagrangianSystem(
        lambda q, v: 0.5 * v @ v + 9.81 * jnp.sin(jnp.pi / 6) * q[0], 3, nonholonomic=knife.system.nonholonomic
    )
    system = lag.to_hamiltonian()
    assert isinstance(system, geomjax.NonholonomicSystem)
    x = knife.x0 + jnp.linspace(0.1, 0.6, 6)
    a, b = _nonholonomic_quantities(system, x), _nonholonomic_quantities(knife.system, x)
    for u, w in zip(a, b):
        np.testing.assert_allclose(u, w, rtol=1e-14, atol=1e-15)


@eqx.filter_jit
def _nonholonomic_quantities(system, x):
    return (
        system.constraint_momenta(x),
        system.constraint_matrix(x),
        system.extended_hamiltonian(x),
        jax.grad(system.hamiltonian)(x),
    )


@pytest.mark.parametrize(
    "lagrangian, n",
    [
        (lambda q, v: 0.5 * v[0] ** 2 - q @ q, 2),  # a velocity that does not appear
        (lambda q, v: q @ v - 0.5 * q @ q, 2),  # linear in v
        (lambda q, v: 0.5 * (v[0] + v[1]) ** 2 * (1.0 + q[0] ** 2), 2),  # rank one, q-dependent
    ],
    ids=["missing-velocity", "linear", "rank-one"],
)
def test_singular_velocity_hessian_is_a_clear_error(lagrangian, n):
    with pytest.raises(ValueError, match="∂²L/∂v² is singular"):
        geomjax.LagrangianSystem(lagrangian, n)
    with pytest.raises(ValueError, match="∂²L/∂v² is singular"):
        geomjax.ContactLagrangianSystem(lambda q, v, z: lagrangian(q, v) - z, n)


def test_constraints_not_affine_in_velocity_are_rejected():
    bad = geomjax.VelocityConstraint(lambda q, v: v[0] ** 2 - q[1] * v[1])
    with pytest.raises(ValueError, match="not affine in the velocity"):
        geomjax.LagrangianSystem(lambda q, v: 0.5 * v @ v, 2, nonholonomic=bad)
    good = geomjax.VelocityConstraint(lambda q, v: q[1] * v[0] - q[0] * v[1] + q @ q)
    lag = geomjax.LagrangianSystem(lambda q, v: 0.5 * v @ v, 2, nonholonomic=good)
    with pytest.raises(ValueError, match="affine part"):
        lag.to_hamiltonian()
    with pytest.raises(ValueError, match="shape"):
        geomjax.LagrangianSystem(lambda q, v: 0.5 * v @ v, 2, nonholonomic=lambda q: jnp.ones((1, 3)))


def test_forced_lagrangian_has_no_conservative_hamiltonian():
    lag = geomjax.LagrangianSystem(lambda q, v: 0.5 * v @ v, 1, force=lambda q, v, t: -v)
    with pytest.raises(ValueError, match="forced_dla"):
        lag.to_hamiltonian()


DAMPED = geomjax.ContactLagrangianSystem(lambda q, v, z: 0.5 * v @ v - 0.5 * q @ q - ALPHA * z, 1)
DAMPED_FIELD = geomjax.contact_field(DAMPED)


def test_contact_field_equals_the_damped_oscillator_written_out(rng):
    for _ in range(3):
        q, p, s = rng.normal(size=3)
        # H = p²/2 + q²/2 + αs: q̇ = p, ṗ = −q − αp, ṡ = p² − H
        h = 0.5 * p * p + 0.5 * q * q + ALPHA * s
        expected = np.array([p, -q - ALPHA * p, p * p - h])
        np.testing.assert_allclose(DAMPED_FIELD(jnp.array([q, p, s])), expected, rtol=1e-14, atol=1e-15)


def _energy_after(field, energy, x0, h, n):
    x, status = diagnostics.final_state(geomjax.explicit_rk(field, geomjax.RK4), x0, h, n)
    assert bool(status == geomjax.RESULTS.successful)
    return float(energy(x)), float(energy(x0))


def test_contact_energy_decays_conformally_and_nonquadratic_legendre():
    x0 = jnp.array([1.0, 0.5, 0.2])
    e_t, e_0 = _energy_after(DAMPED_FIELD, DAMPED_FIELD.system.energy, x0, 0.02, 250)
    np.testing.assert_allclose(e_t, e_0 * np.exp(-ALPHA * 5.0), rtol=1e-8)
    # A Lagrangian not quadratic in v (Newton in the Legendre transform) gives the same
    # decay law: H = √(1 + p²) − 1 + V + αs satisfies dH/dt = −αH.
    rel = geomjax.ContactLagrangianSystem(lambda q, v, z: 1.0 - jnp.sqrt(1.0 - v @ v) - 0.5 * q @ q - ALPHA * z, 1)
    assert not rel.quadratic
    # The Newton loop of the Legendre transform is kept whole inside the simplified graph
    # (no fallback, so no warning).
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        field = geomjax.contact_field(rel)
        e_t, e_0 = _energy_after(
            field, lambda x: jnp.sqrt(1.0 + x[1] ** 2) - 1.0 + 0.5 * x[0] ** 2 + ALPHA * x[2], x0, 0.02, 250
        )
    np.testing.assert_allclose(e_t, e_0 * np.exp(-ALPHA * 5.0), rtol=1e-8)


def test_time_dependent_contact_hamiltonian():
    # H = p²/2 + f(t)s + q²/2 with f(t) = α(1 + t): dH/dt = ∂H/∂t − H f(t).
    system = geomjax.ContactHamiltonianSystem(
        lambda q, p, s, t: 0.5 * p @ p + ALPHA * (1.0 + t) * s + 0.5 * q @ q, 1, time_dependent=True
    )
    field = geomjax.contact_field(system)
    x = jnp.array([0.3, -0.2, 0.7])
    np.testing.assert_allclose(field(x, 2.0), [-0.2, -0.3 + 3 * ALPHA * 0.2, 0.04 - system.energy(x, 2.0)], rtol=1e-14)
    with pytest.raises(TypeError, match="ContactHamiltonianSystem"):
        geomjax.contact_field(geomjax.models.spherical_pendulum().system)
