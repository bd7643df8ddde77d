"""The Newton settings module: solves, failure flags (also per member under vmap), implicit
gradients against finite differences, settings validation, the old keywords."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax
from geomjax import Newton


def _system(theta):
    """x² + y² = 4, y = θ x³ (two curves that cross): a small nonlinear system."""

    def fn(x):
        return jnp.stack([x[0] ** 2 + x[1] ** 2 - 4.0, x[1] - theta * x[0] ** 3])

    return fn


SETTINGS = [Newton(), Newton(iterations=6), Newton(backend="optimistix")]
IDS = ["loop", "fixed", "optimistix"]


@pytest.mark.parametrize("newton", SETTINGS, ids=IDS)
def test_solves_a_small_nonlinear_system(newton):
    fn = _system(0.5)
    res = jax.jit(newton.solve, static_argnums=0)(fn, jnp.array([1.5, 1.0]))
    assert bool(res.converged)
    assert float(jnp.max(jnp.abs(fn(res.value)))) < 1e-14
    x = np.asarray(res.value)
    np.testing.assert_allclose(x[1], 0.5 * x[0] ** 3, rtol=1e-14)


@pytest.mark.parametrize("newton", SETTINGS, ids=IDS)
def test_no_root_gives_converged_false_and_fails_alone_under_vmap(newton):
    # x² + c = 0: a root for c < 0, none for c > 0 (Newton wanders and never settles).
    def solve(c, guess):
        return newton.solve(lambda x: x**2 + c, guess)

    cs = jnp.array([-2.0, 1.0, -3.0])
    res = jax.jit(jax.vmap(solve))(cs, jnp.ones((3, 1)))
    assert np.asarray(res.converged).tolist() == [True, False, True]
    np.testing.assert_allclose(np.asarray(res.value)[[0, 2], 0], np.sqrt([2.0, 3.0]), rtol=1e-14)
    single = solve(1.0, jnp.ones(1))
    assert not bool(single.converged)


def test_too_few_fixed_iterations_do_not_pretend_success():
    res = Newton(iterations=2).solve(lambda x: x**2 - 2.0, jnp.array([1.0]))
    assert not bool(res.converged)  # 1.4167 after two steps: the check sees it
    res = Newton(iterations=5).solve(lambda x: x**2 - 2.0, jnp.array([1.0]))
    assert bool(res.converged) and abs(float(res.value[0]) - np.sqrt(2.0)) < 1e-15


@pytest.mark.parametrize("newton", SETTINGS, ids=IDS)
def test_gradient_of_the_solution_matches_finite_differences(newton):
    def first(theta):
        return newton.solve(_system(theta), jnp.array([1.5, 1.0])).value[0]

    grad = float(jax.grad(first)(0.5))
    eps = 1e-6
    fd = (float(first(0.5 + eps)) - float(first(0.5 - eps))) / (2 * eps)
    np.testing.assert_allclose(grad, fd, rtol=1e-7)


def test_chord_iteration_with_a_fixed_matrix():
    fn = _system(0.5)
    guess = jnp.array([1.5, 1.0])
    res = Newton().solve(fn, guess, jacobian=jax.jacfwd(fn)(guess))
    assert bool(res.converged) and int(res.iterations) > 3  # linear, not quadratic
    assert float(jnp.max(jnp.abs(fn(res.value)))) < 1e-12


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(rtol=-1e-3), "rtol"),
        (dict(atol=-1.0), "atol"),
        (dict(atol=float("nan")), "atol"),
        (dict(rtol=0.0, atol=0.0), "rtol > 0 or atol > 0"),
        (dict(max_steps=0), "max_steps"),
        (dict(iterations=0), "iterations"),
        (dict(iterations=2.5), "iterations"),
        (dict(backend="scipy"), "backend"),
        (dict(backend="optimistix", iterations=3), "iterations=None"),
    ],
)
def test_settings_are_validated(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Newton(**kwargs)


def test_steps_store_one_newton_and_keep_the_old_keywords():
    model = geomjax.models.spherical_pendulum(holonomic=True)
    step = geomjax.rattle(model.system, rtol=1e-12, max_iter=7)
    assert step.newton == Newton(rtol=1e-12, max_steps=7)
    assert geomjax.rattle(model.system).newton.iterations is not None  # written out by default
    mine = Newton(iterations=4)
    assert geomjax.shake(model.system, newton=mine).newton is mine
    field = geomjax.dirac_field(geomjax.models.spherical_pendulum().system)
    assert geomjax.implicit_rk(field, geomjax.GAUSS4, atol=1e-12).newton == Newton(atol=1e-12)
    rk4 = geomjax.explicit_rk(field, geomjax.RK4)
    assert geomjax.project(rk4, model.system, max_iter=9).newton.max_steps == 9
    with pytest.raises(ValueError, match="not both"):
        geomjax.rattle(model.system, newton=mine, rtol=1e-10)
    with pytest.raises(ValueError, match="iterations"):
        geomjax.rattle(model.system, newton=Newton(iterations=-1))
