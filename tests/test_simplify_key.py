"""The scalar-graph simplification switch is part of every compiled program's key: a
program traced inside `simplify.enabled(False)` is not reused outside it (results were
bit-different depending on what ran earlier in the process)."""

import numpy as np

import geomjax
from geomjax.internal import simplify


def test_a_run_outside_the_switch_does_not_reuse_the_unsimplified_program():
    model = geomjax.models.spherical_pendulum(holonomic=True)
    field = geomjax.dirac_field(model.system)

    def run():
        return np.asarray(geomjax.integrate(field, model.x0, dt=1e-3, steps=20_000, method="rk4",
                                            drift_tol=None).x_final)

    with simplify.enabled(False):
        off = run()
    after = run()
    geomjax.clear_caches()
    fresh = run()
    assert after.tobytes() == fresh.tobytes()  # the same program as a fresh process's
    with simplify.enabled(False):
        assert run().tobytes() == off.tobytes()
