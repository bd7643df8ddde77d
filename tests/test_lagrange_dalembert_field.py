"""The forced Lagrange–d'Alembert ODE of a LagrangianSystem (`geomjax.lagrange_dalembert_field`).

Checks: the damped Foucault pendulum (affine constraint) against its closed form, a
non-quadratic Lagrangian against Herglotz' equations through the contact field (a
different derivation: Legendre transform and contact Hamiltonian), the projection onto
the constraint, and bad input.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax
from geomjax import diagnostics


def test_foucault_reference_matches_the_closed_form():
    model = geomjax.models.damped_foucault(alpha=0.05)
    field = geomjax.lagrange_dalembert_field(model.forced)
    x0 = field.project(jnp.concatenate([model.q0, jnp.array([0.01, -0.02])]))
    assert abs(float(field.constraint_residuals(x0)[0])) < 1e-18
    # the closed form from this start: r along the line through q0, ṙ(0) = e·v(0)
    start = geomjax.models.damped_foucault(alpha=0.05)
    exact = start.exact.func(start.params, model.q0, x0[2:], 20.0)
    x, status = diagnostics.final_state(geomjax.explicit_rk(field, geomjax.RK4), x0, 0.01, 2000)
    assert bool(status == geomjax.RESULTS.successful)
    np.testing.assert_allclose(x, jnp.concatenate(exact), atol=1e-10)


@pytest.mark.filterwarnings("ignore:geomjax. ContactField")  # Newton loop in the Legendre transform
def test_non_quadratic_lagrangian_matches_the_contact_field():
    alpha = 0.4

    def lagrangian(q, v):
        return 0.5 * v @ v + (v @ v) ** 2 / 12 + jnp.cos(q[0]) - 0.2 * q[1] ** 2 + 0.1 * q[0] * v[1]

    def force(q, v, t):  # Herglotz' L − αz gives the force −α ∂L/∂v
        return -alpha * jax.grad(lagrangian, argnums=1)(q, v)

    field = geomjax.lagrange_dalembert_field(geomjax.LagrangianSystem(lagrangian, 2, force=force))
    contact = geomjax.contact_field(geomjax.ContactLagrangianSystem(lambda q, v, z: lagrangian(q, v) - alpha * z, 2))
    q0, v0 = jnp.array([0.7, -0.2]), jnp.array([0.3, 0.5])
    p0 = jax.grad(lagrangian, argnums=1)(q0, v0)
    x, _ = diagnostics.final_state(geomjax.explicit_rk(field, geomjax.RK4), jnp.concatenate([q0, v0]), 1e-3, 1000)
    y, _ = diagnostics.final_state(
        geomjax.explicit_rk(contact, geomjax.RK4), jnp.concatenate([q0, p0, jnp.zeros(1)]), 1e-3, 1000
    )
    np.testing.assert_allclose(x[:2], y[:2], atol=1e-11)
    np.testing.assert_allclose(jax.grad(lagrangian, argnums=1)(x[:2], x[2:]), y[2:4], atol=1e-11)


def test_constraint_is_kept_and_bad_input():
    model = geomjax.models.damped_foucault(alpha=1e-3)
    field = geomjax.lagrange_dalembert_field(model.forced)
    x0 = jnp.concatenate([model.q0, model.v0])
    # off the constraint: the default start check refuses it, projected it runs
    with pytest.raises(ValueError, match="off the constraint set"):
        geomjax.integrate(field, x0, dt=0.1, steps=2)
    sol = geomjax.integrate(field, field.project(x0), dt=0.1, steps=100, method="rk4")
    assert float(jnp.max(jnp.abs(jax.vmap(field.constraint_residuals)(sol.xs)))) < 1e-12
    with pytest.raises(TypeError, match="LagrangianSystem"):
        geomjax.lagrange_dalembert_field(model.contact)
    with pytest.raises(ValueError, match="holonomic"):
        geomjax.lagrange_dalembert_field(geomjax.LagrangianSystem(lambda q, v: 0.5 * v @ v, 2, holonomic=lambda q: q @ q - 1))
