"""Simplification is a static option of a field or step (`simplify`), so part of every
compiled program's key: a field and its unsimplified copy never share a program, and a
run's bits do not depend on what ran earlier in the process (they did with the old
thread-local switch: a program traced inside it was reused outside it)."""

import numpy as np

import geomjax
from geomjax.internal import simplify


def _run(field, x0):
    return np.asarray(geomjax.integrate(field, x0, dt=1e-3, steps=2_000, method="rk4", drift_tol=None).x_final)


def test_the_simplify_option_separates_programs_and_results_do_not_depend_on_history():
    model = geomjax.models.spherical_pendulum(holonomic=True)
    field = geomjax.dirac_field(model.system)
    off_field = simplify.unsimplified(field)
    assert field.simplify and not off_field.simplify and off_field.system is field.system
    assert field != off_field  # static: different keys
    off = _run(off_field, model.x0)
    after = _run(field, model.x0)  # after the unsimplified program ran
    geomjax.clear_caches()
    fresh = _run(field, model.x0)
    assert after.tobytes() == fresh.tobytes()
    assert _run(off_field, model.x0).tobytes() == off.tobytes()
    # the two programs differ (the pass changes the arithmetic): so the key did matter
    assert off.tobytes() != fresh.tobytes()


def test_unsimplified_reaches_the_field_inside_a_step():
    model = geomjax.models.spherical_pendulum(holonomic=True)
    step = geomjax.rattle(model.system)
    rk4 = geomjax.integrate.__globals__["build_step"]("rk4", geomjax.dirac_field(model.system))
    assert not simplify.unsimplified(step).simplify
    off = simplify.unsimplified(rk4)
    inner = [leaf for leaf in vars(off).values() if isinstance(leaf, geomjax.AbstractField)]
    assert inner and all(not f.simplify for f in inner)


def test_the_example_of_unsimplified_runs():
    import doctest

    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for test in finder.find(simplify.unsimplified, "unsimplified", globs={}):
        runner.run(test)
    assert runner.summarize(verbose=False).attempted >= 2 and runner.summarize(verbose=False).failed == 0
