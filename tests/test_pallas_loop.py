"""`geomjax.sweep(..., loop="pallas")`: each save block of an explicit method as one Pallas
kernel (interpret mode on the CPU) gives the states, statuses and failed steps of the
`lax.scan` loop, members that diverge inside a block included; other cases are refused.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import geomjax
from geomjax import models
from geomjax._driver import integrate as integrate_module
from geomjax._driver.common import begin
from geomjax._driver.grid import as_grid
from geomjax._driver.pallas_loop import pallas_steps
from geomjax._driver.sweep import _batch


def _pendulum(g, gain):
    model = models.spherical_pendulum(g=g)
    return geomjax.feedback_field(model.system, model.x0, gains=gain), model.x0


def _knife(alpha, gain):
    model = models.knife_edge(alpha=alpha)
    return geomjax.feedback_field(model.system, model.x0, gains=gain), model.x0


# 12 members (the tile is 16: padded); gain 1e4 diverges in the first steps, gain 20 at
# g = 9.81 (Euler) and gain 30 (both methods) in later steps of a block of 50.
PENDULUM = (_pendulum, geomjax.product(g=[1.0, 9.81, 3.0], gain=[1.0, 20.0, 30.0, 1e4]), 1e-3)
# 10 members; gains 50 and above diverge, and Euler drifts off the constraint at gain 0.5.
KNIFE = (_knife, geomjax.product(alpha=[0.3, 0.5], gain=[0.5, 5.0, 50.0, 1e3, 1e4]), 1e-2)


def _compare(build, grid, dt, method):
    kw = dict(dt=dt, steps=200, save_every=50, method=method, layout="component")
    scan = geomjax.sweep(build, grid, loop="scan", **kw)
    kernel = geomjax.sweep(build, grid, loop="pallas", **kw)
    np.testing.assert_array_equal(kernel.status, scan.status)
    np.testing.assert_array_equal(kernel.failed_step, scan.failed_step)
    np.testing.assert_array_equal(np.isnan(kernel.xs), np.isnan(scan.xs))
    np.testing.assert_allclose(kernel.xs, scan.xs, rtol=0, atol=1e-13)
    return scan


@pytest.mark.parametrize("method", ["euler", "rk4"])
def test_pendulum_sweep_matches_the_scan(method, monkeypatch):
    calls = []
    monkeypatch.setattr(integrate_module, "pallas_steps", lambda *a, **k: calls.append(1) or pallas_steps(*a, **k))
    build, grid, dt = PENDULUM
    scan = _compare(build, grid, dt, method)
    assert calls  # the kernel ran (the pallas sweep was traced here, not cached)
    diverged = np.asarray(scan.status) == int(geomjax.RESULTS.diverged._value)
    assert diverged[:, -1].all()  # gain 1e4
    assert np.any(diverged & (np.asarray(scan.failed_step) > 25))  # inside a later block or mid-block
    assert np.any(np.asarray(scan.status) == 0)


@pytest.mark.extended
def test_knife_edge_sweep_matches_the_scan():
    build, grid, dt = KNIFE
    status = np.asarray(_compare(build, grid, dt, "euler").status)
    assert np.any(status == int(geomjax.RESULTS.diverged._value))
    assert np.any(status == int(geomjax.RESULTS.constraint_violation._value))


def test_kernel_over_several_padded_tiles():
    """10 members in tiles of 4 (three programs, two padded members) against the scan's
    recurrence, step counts and per-member step sizes included."""
    grid = as_grid(geomjax.product(g=[1.0, 9.81], gain=[1.0, 10.0, 30.0, 100.0, 1e4]))
    step, x0 = _batch(_pendulum, grid.take(np.arange(grid.size)), "heun", False, -1, grid.size)
    dt = jnp.linspace(1e-3, 2e-3, grid.size)
    t0 = jnp.float64(0.5)
    step, (z, record), _ = begin(step, x0, dt, None, None, t0, None)
    k0 = record[0] + 7

    @jax.jit
    def reference(z):
        def body(i, c):
            z, mark = c
            z_next, _ = step.advance(t0 + (k0 + i).astype(dt.dtype) * dt, z, dt, None)
            return z_next, mark + 0.0 * step.state_sum(z)

        z, mark = lax.fori_loop(0, 40, body, (z, jnp.zeros(grid.size)))
        return z, mark + 0.0 * step.state_sum(z)

    z_ref, mark_ref = reference(z)
    z_ker, mark_ker = jax.jit(lambda z: pallas_steps(step, dt, t0, None, 40, k0, z, tile=4))(z)
    np.testing.assert_array_equal(np.isnan(mark_ker), np.isnan(mark_ref))
    assert np.isnan(mark_ref).any() and not np.isnan(mark_ref).all()
    for a, b in zip(jax.tree_util.tree_leaves(z_ker), jax.tree_util.tree_leaves(z_ref)):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-13)


def test_pallas_loop_refuses_batch_layout_and_implicit_methods():
    build, grid, dt = PENDULUM
    kw = dict(dt=dt, steps=10)
    with pytest.raises(ValueError, match="layout='component'"):
        geomjax.sweep(build, grid, loop="pallas", layout="batch", **kw)
    with pytest.raises(ValueError, match="loop='scan'"):
        geomjax.sweep(build, grid, loop="pallas", method="implicit_midpoint", **kw)
    with pytest.raises(ValueError, match="explicit method"):

        def rattle(g):
            model = models.spherical_pendulum(g=g, holonomic=True)
            return geomjax.rattle(model.system), model.x0

        geomjax.sweep(rattle, {"g": [1.0, 2.0]}, loop="pallas", **kw)
    with pytest.raises(ValueError, match="'scan' or 'pallas'"):
        geomjax.sweep(build, grid, loop="while", **kw)
