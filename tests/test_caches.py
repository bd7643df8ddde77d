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
    built again from the same system reuses the program; a field of a system whose
    function closes over another value, or with the simplify option off, gets its own."""
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
    a, b = run(field_for(1.0)), run(field_for(2.0))  # two closures: two programs, two answers
    assert common._compiled_on._cache_size() == size + 3
    assert not jnp.allclose(a.xs, b.xs)
