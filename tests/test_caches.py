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
