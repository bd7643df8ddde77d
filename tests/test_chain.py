"""The planar chain model: start on S, Dirac field keeps f and H, n = 1 is the pendulum, RATTLE."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax
from geomjax.models import planar_chain, planar_pendulum


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("holonomic", [True, False])
def test_start_on_constraint_set(n, holonomic):
    model = planar_chain(n, holonomic=holonomic, mass=1.3, length=0.7, gravity=2.0)
    f = model.system.constraint_functions(model.x0)
    assert f.shape == (2 * n,)
    assert float(jnp.max(jnp.abs(f))) < 1e-14
    assert len(model.quantity_names) == 2 * n + 1


def test_second_class_set_matches_holonomic():
    """constraints=(g, G M⁻¹p) written by hand equals what geomjax derives from holonomic=g."""
    a, b = planar_chain(3, holonomic=True, mass=1.3), planar_chain(3, holonomic=False, mass=1.3)
    x = a.x0 + 0.05 * jnp.asarray(np.random.default_rng(0).normal(size=a.x0.shape))
    np.testing.assert_allclose(a.system.constraint_functions(x), b.system.constraint_functions(x), atol=1e-14)


@pytest.mark.parametrize("holonomic", [True, False])
def test_dirac_field_keeps_constraints_and_energy(holonomic, rng):
    model = planar_chain(3, holonomic=holonomic)
    system = model.system
    field = geomjax.dirac_field(system)

    @jax.jit
    def rates(x):
        v = field(x)
        df = jax.jvp(system.constraint_functions, (x,), (v,))[1]
        dh = jax.jvp(system.hamiltonian, (x,), (v,))[1]
        return df, dh, jnp.max(jnp.abs(v))

    for _ in range(3):
        x = model.x0 + 1e-3 * jnp.asarray(rng.normal(size=model.x0.shape))
        df, dh, scale = rates(x)
        assert float(jnp.max(jnp.abs(df))) < 1e-12 * float(scale)
        assert abs(float(dh)) < 1e-12 * float(scale)


def test_one_link_is_the_planar_pendulum():
    chain = planar_chain(1, holonomic=False, angular_velocities=jnp.array([0.8]))
    pendulum = planar_pendulum(q0=chain.x0[:2], p0=chain.x0[2:])
    run = lambda m: geomjax.integrate(geomjax.dirac_field(m.system), m.x0, dt=1e-2, steps=100, method="rk4").xs
    xs_chain, xs_pendulum = run(chain), run(pendulum)
    np.testing.assert_allclose(xs_chain, xs_pendulum, atol=1e-9)
    energy = jax.vmap(chain.system.hamiltonian)(xs_chain)
    np.testing.assert_allclose(energy, energy[0], atol=1e-9)


def test_rattle_keeps_position_constraints():
    model = planar_chain(3)
    sol = geomjax.integrate(geomjax.rattle(model.system), model.x0, dt=1e-2, steps=100, save_every=10)
    g = jax.vmap(lambda x: model.system.constraint_functions(x)[:3])(sol.xs)
    assert float(jnp.max(jnp.abs(g))) < 1e-12
    gdot = jax.vmap(lambda x: model.system.constraint_functions(x)[3:])(sol.xs)
    assert float(jnp.max(jnp.abs(gdot))) < 1e-12
