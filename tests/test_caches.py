"""`geomjax.clear_caches` empties every table geomjax keeps, and results do not change."""

import jax.numpy as jnp
import numpy as np

import geomjax
from geomjax._driver import common, sweep
from geomjax._system import implicit
from geomjax._stability import analysis as stability


def test_clear_caches_empties_every_table_and_changes_no_result():
    model = geomjax.models.spherical_pendulum(holonomic=True)
    step = geomjax.rattle(model.system)
    first = geomjax.integrate(step, model.x0, dt=0.01, steps=20)
    lag = geomjax.dirac1(lambda q, v: 0.5 * v @ v - 9.81 * q[2], model.system.holonomic)
    geomjax.integrate(lag, model.x0, dt=0.01, steps=5, drift_tol=None)
    stability.stability_interval("rk4")
    assert common._MEMOS and implicit._QUADRATIC and stability.stability_interval.cache_info().currsize
    geomjax.clear_caches()
    assert not common._MEMOS and not common._NO_DETAIL and not sweep._PROBED and not sweep._CLOSES_OVER_MEMBER
    assert not implicit._QUADRATIC and stability.stability_interval.cache_info().currsize == 0
    again = geomjax.integrate(step, model.x0, dt=0.01, steps=20)
    np.testing.assert_array_equal(np.asarray(again.xs), np.asarray(first.xs))
    assert again.result == first.result == geomjax.RESULTS.successful
    assert jnp.isfinite(again.xs).all()


def test_equal_fields_share_a_program_and_different_closures_do_not():
    """The compiled-program table of direct `integrate` calls (`compiled_call_on`, kept:
    it saves ~0.1 ms a call, benchmarks/loop_overhead.py) is keyed by value: a field
    built again from the same system reuses the program, and so does one whose function
    is the same code closing over another number (hoisted as an argument); other code,
    or the simplify option off, gets its own program."""
    import jax.numpy as jnp

    from geomjax._driver import common
    from geomjax.internal.simplify import unsimplified

    def field_for(g):
        return geomjax.dirac_field(geomjax.System(lambda x: 0.5 * x[1] ** 2 + g * jnp.cos(x[0]), geomjax.canonical(1)))

    x0 = jnp.array([0.3, 0.0])
    run = lambda f: geomjax.integrate(f, x0, dt=0.01, steps=5, method="rk4")  # noqa: E731
    system = field_for(1.0).system
    run(geomjax.dirac_field(system))
    size = common._compiled_on._cache_size()
    run(geomjax.dirac_field(system))  # an equal field: no new program
    assert common._compiled_on._cache_size() == size
    run(unsimplified(geomjax.dirac_field(system)))  # the simplify option: a program of its own
    assert common._compiled_on._cache_size() == size + 1
    # closures of the same code over other numbers: the numbers are arguments of one program
    a, b = run(field_for(1.0)), run(field_for(2.0))
    assert common._compiled_on._cache_size() == size + 1
    assert not jnp.allclose(a.xs, b.xs)
    # other code closing over the same number: a program of its own
    other = geomjax.dirac_field(geomjax.System(lambda x: 0.5 * x[1] ** 2 + 1.0 * jnp.sin(x[0]), geomjax.canonical(1)))
    c = run(other)
    assert common._compiled_on._cache_size() == size + 2
    assert not jnp.allclose(a.xs, c.xs)


_SCALE = 1.0


def _pendulum_run(h_of_x):
    import jax.numpy as jnp

    field = geomjax.dirac_field(geomjax.System(h_of_x, geomjax.canonical(1)))
    return geomjax.integrate(field, jnp.array([0.3, 0.0]), dt=0.01, steps=5, method="rk4").x_final


def test_closed_over_numbers_are_arguments_and_everything_else_is_in_the_key():
    """Eager calls of a loss that builds a closure over its parameter compile once: the
    float is an argument of the program (`geomjax._driver.hoisting`). Never shared: a
    program for other code, for an integer closed over (it may set shapes and indexing),
    or for a large array (its values may be read at trace time). A function that needs its
    float as a Python number (Python control flow on it) falls back to keeping it in the
    key, with the right answers."""
    import jax
    import jax.numpy as jnp

    from geomjax._driver import common

    def loss(g):
        return _pendulum_run(lambda x: 0.5 * x[1] ** 2 + g * jnp.cos(x[0]))[0]

    values = [float(loss(g)) for g in (1.0, 2.0)]
    size = common._compiled_on._cache_size()
    again = [float(loss(g)) for g in (3.0, 1.0)]
    assert common._compiled_on._cache_size() == size  # no new program
    assert again[1] == values[0] and len({*values, again[0]}) == 3
    grads = [float(jax.grad(loss)(g)) for g in (1.0, 2.0)]  # eager grad: the same reuse
    size = common._compiled._cached._cache_size()
    float(jax.grad(loss)(3.0))
    assert common._compiled._cached._cache_size() == size
    eps = 1e-6
    assert abs(grads[1] - (loss(2.0 + eps) - loss(2.0 - eps)) / (2 * eps)) < 1e-6
    assert grads[0] != grads[1]

    global _SCALE

    def scaled(g):  # a closure that also reads a global
        return _pendulum_run(lambda x: 0.5 * x[1] ** 2 + g * _SCALE * jnp.cos(x[0]))[0]

    for scale in (1.0, 2.0):  # the global rebound between calls: another program, the new value
        _SCALE = scale
        np.testing.assert_allclose(float(scaled(1.0)), values[int(scale) - 1], rtol=1e-13)
    _SCALE = 1.0
    params = {"s": 1.0}

    def mutable(g):  # a closure over a dict, changed in place between calls: never a template
        return _pendulum_run(lambda x: 0.5 * x[1] ** 2 + g * params["s"] * jnp.cos(x[0]))[0]

    first = float(mutable(1.0))
    params["s"] = 2.0
    np.testing.assert_allclose([first, float(mutable(1.0))], values, rtol=1e-13)

    def indexed(k):  # an integer closed over: by value
        return _pendulum_run(lambda x: 0.5 * x[1] ** 2 + jnp.cos(x[k] + 1.0))[0]

    assert float(indexed(0)) != float(indexed(1))

    def branching(g):  # Python control flow on the float: it cannot be traced
        return _pendulum_run(lambda x: 0.5 * x[1] ** 2 + (g if g > 1.5 else -g) * jnp.cos(x[0]))[0]

    np.testing.assert_allclose([float(branching(2.0)), float(branching(1.0))], [values[1], float(loss(-1.0))], rtol=1e-13)

    def big(scale):  # a large closed-over array: by identity
        weights = jnp.full(100, scale)
        return _pendulum_run(lambda x: 0.5 * x[1] ** 2 + jnp.sum(weights) / 100 * jnp.cos(x[0]))[0]

    size = common._compiled_on._cache_size()
    np.testing.assert_allclose([float(big(1.0)), float(big(2.0))], values, rtol=1e-13)
    assert common._compiled_on._cache_size() == size + 2
