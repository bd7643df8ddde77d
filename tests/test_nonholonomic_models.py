"""Seed 001's seven nonholonomic systems integrated with feedback integrators.

Exact solutions (the models' `exact`): the knife edge's cycloid, the Chaplygin sleigh's tanh/sech
law, the vertical disk's circle, the Heisenberg system's straight line and the Suslov
body's uniform spin (ξ an eigenvector of I) — errors against them fall at the order of
the integrator (explicit Euler 1, RK4 4) applied to the feedback field. For the systems
without a closed form (Suslov with a general ξ, roller racer, nonholonomic oscillator):
the invariants stay at the level the feedback keeps them, far below plain Euler on the
extended field, and the feedback-Euler error against a tight RK4 reference is first order.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import geomjax
from geomjax import models


@eqx.filter_jit
def _run(step, x0, h, n):
    """`n` steps of `step` from x0 (h and n traced: one compilation per step type)."""
    z = lax.fori_loop(0, n, lambda _, z: step.advance(0.0, z, h, None)[0], step.split(x0))
    return step.merge(z)


def _errors(field, tableau, model, hs, t_end, reference):
    step = geomjax.explicit_rk(field, tableau)
    out = []
    for h in hs:
        n = int(round(t_end / h))
        x = _run(step, model.x0, jnp.asarray(h), jnp.asarray(n))
        out.append(float(jnp.max(jnp.abs(x - reference))))
    return np.array(out)


def _order(hs, errs):
    return float(np.polyfit(np.log(hs), np.log(errs), 1)[0])


EXACT = {
    # name: (model, gains for the feedback field, final time); the gains keep
    # h·λ_max(∇²V) below Euler's (2) and RK4's (≈2.8) stability limits for every h used.
    "knife_edge": (models.knife_edge, 0.5, 1.0),
    "chaplygin_sleigh": (models.chaplygin_sleigh, 2.0, 2.0),
    "vertical_disk": (models.vertical_disk, 1.0, 1.0),
    "suslov": (models.suslov, 2.0, 1.0),
}


@pytest.fixture(scope="module", params=sorted(EXACT))
def exact_case(request):
    make, gains, t_end = EXACT[request.param]
    model = make()
    y = geomjax.feedback_field(model.system, model.x0, gains=gains)
    assert float(y.euler_step_limit(model.x0)) > 0.12
    return request.param, model, y, t_end, jax.jit(model.exact)(t_end)


def test_feedback_euler_is_first_order_against_the_exact_solution(exact_case):
    name, model, y, t_end, ref = exact_case
    hs = np.array([0.02, 0.01, 0.005])
    errs = _errors(y, geomjax.EULER, model, hs, t_end, ref)
    assert abs(_order(hs, errs) - 1.0) < 0.3, (name, errs)
    assert errs[-1] < 0.05


def test_feedback_rk4_is_fourth_order_against_the_exact_solution(exact_case):
    name, model, y, t_end, ref = exact_case
    hs = np.array([0.05, 0.025, 0.0125])
    errs = _errors(y, geomjax.RK4, model, hs, t_end, ref)
    assert abs(_order(hs, errs) - 4.0) < 0.3, (name, errs)
    assert errs[-1] < 1e-6


def test_knife_edge_cycloid_and_constants():
    """The closed form itself satisfies the constraint and keeps H and p_φ."""
    model = models.knife_edge()
    ts = jnp.linspace(0.0, 3.0, 7)
    xs = jax.vmap(model.exact)(ts)
    f = jax.vmap(lambda x: geomjax.nonholonomic_quantities(model.system, x))(xs)
    np.testing.assert_allclose(np.asarray(f - f[0]), 0.0, atol=1e-12)
    assert float(jnp.max(jnp.abs(f[:, 0]))) < 1e-13


def test_heisenberg_straight_line_is_exact_for_any_step():
    """On J = 0 the multiplier vanishes and Euler/RK4 reproduce the line to round-off."""
    model = models.heisenberg()
    y = geomjax.feedback_field(model.system, model.x0, gains=1.0)
    for tableau in (geomjax.EULER, geomjax.RK4):
        step = geomjax.explicit_rk(y, tableau)
        for h in (0.1, 0.05):
            x = _run(step, model.x0, jnp.asarray(h), jnp.asarray(int(round(2.0 / h))))
            assert float(jnp.max(jnp.abs(x - model.exact(2.0)))) < 1e-12
    f = geomjax.nonholonomic_quantities(model.system, x) - geomjax.nonholonomic_quantities(model.system, model.x0)
    assert float(jnp.max(jnp.abs(f))) < 1e-12  # J, H and L_z


def test_suslov_full_and_reduced_agree():
    full = models.suslov(xi=(0.3, 0.5, 0.8), omega0=(1.0, 0.4, -0.625))
    reduced = models.suslov(xi=(0.3, 0.5, 0.8), omega0=(1.0, 0.4, -0.625), reduced=True)
    a = geomjax.integrate(geomjax.nonholonomic_field(full.system), full.x0, dt=0.01, steps=200, method="rk4",
                          save_every=200).xs[-1]
    b = geomjax.integrate(geomjax.nonholonomic_field(reduced.system), reduced.x0, dt=0.01, steps=200,
                          method="rk4", save_every=200).xs[-1]
    np.testing.assert_allclose(np.asarray(a[9:]), np.asarray(b), atol=1e-12)
    assert full.exact is None  # ξ is not an eigenvector of I


NO_CLOSED_FORM = {
    # name: (model, gains) — the last gain is k₀ where the group is embedded
    "suslov_general": (lambda: models.suslov(xi=(0.3, 0.5, 0.8), omega0=(1.0, 0.4, -0.625)), (10.0, 10.0, 50.0)),
    "roller_racer": (models.roller_racer, 10.0),
    "nonholonomic_oscillator": (models.nonholonomic_oscillator, 10.0),
}


@pytest.mark.parametrize("name", sorted(NO_CLOSED_FORM))
def test_feedback_euler_keeps_invariants_and_converges(name):
    make, gains = NO_CLOSED_FORM[name]
    model = make()
    system = model.system
    x_field = geomjax.nonholonomic_field(system)
    y = geomjax.feedback_field(system, model.x0, gains=jnp.asarray(gains))
    t_end, h = 2.0, 1e-3
    n = int(round(t_end / h))
    ref = _run(geomjax.explicit_rk(x_field, geomjax.RK4), model.x0, jnp.asarray(h), jnp.asarray(n))

    euler_y = geomjax.explicit_rk(y, geomjax.EULER)
    hs = np.array([0.01, 0.005, 0.0025])
    errs = _errors(y, geomjax.EULER, model, hs, t_end, ref)
    assert abs(_order(hs, errs) - 1.0) < 0.3, (name, errs)

    f0 = geomjax.nonholonomic_quantities(system, model.x0)
    fb = _run(euler_y, model.x0, jnp.asarray(h), jnp.asarray(n))
    plain = _run(geomjax.explicit_rk(x_field, geomjax.EULER), model.x0, jnp.asarray(h), jnp.asarray(n))
    k = geomjax.nonholonomic_field(system).momenta(model.x0).shape[0]
    dev_fb = np.abs(np.asarray(geomjax.nonholonomic_quantities(system, fb) - f0))
    dev_plain = np.abs(np.asarray(geomjax.nonholonomic_quantities(system, plain) - f0))
    # Constraint and energy held by the feedback well below plain Euler's drift.
    assert dev_fb[: k + 1].max() < 1e-3, (name, dev_fb)
    assert dev_fb[k] < 0.2 * dev_plain[k] + 1e-12, (name, dev_fb, dev_plain)
    assert float(geomjax.embedding_defect(system, fb)) < 1e-4
