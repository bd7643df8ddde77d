"""Defaults that do not surprise (issue 26, item 3): gains chosen from a step size, the
failure message of gains past the stability bound, the default method per field, the
Hamiltonian field of a System, step statistics and end times of runs, and named
quantities in plots and messages."""

import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import geomjax

PENDULUM = geomjax.models.spherical_pendulum()
DOUBLE = geomjax.models.planar_chain(2, gravity=9.81)


# --- 1. feedback_field without gains ----------------------------------------------------


def test_feedback_field_without_gains_or_dt_says_both_ways_to_call_it():
    with pytest.raises(TypeError) as info:
        geomjax.feedback_field(PENDULUM.system)
    text = str(info.value)
    assert "feedback_field(system, x0, gains=K)" in text
    assert "feedback_field(system, x0, dt=h" in text
    assert "recommended_gains" in text


@pytest.mark.parametrize("method, dt", [("euler", 1e-3), ("rk4", 1e-2)])
def test_feedback_field_with_dt_chooses_the_recommended_gains_and_says_so(method, dt):
    with pytest.warns(geomjax.ChosenGainsWarning, match=rf"chose K = .* for dt = {dt:g} with '{method}'"):
        Y = geomjax.feedback_field(DOUBLE.system, DOUBLE.x0, dt=dt, method=method)
    unit = geomjax.feedback_field(DOUBLE.system, DOUBLE.x0, 1.0)
    np.testing.assert_allclose(Y.gains, geomjax.recommended_gains(unit, DOUBLE.x0, dt, method), rtol=1e-12)
    if method == "euler":
        # the rule for first-order methods: h·λ_max(L∇²V) = 1 at x0
        assert abs(dt * float(geomjax.feedback_rate(Y, DOUBLE.x0)) - 1.0) < 1e-9
    sol = geomjax.integrate(Y, DOUBLE.x0, dt=dt, steps=200, method=method, save_every=20)
    assert bool(sol.ok)


def test_feedback_field_with_dt_needs_x0():
    with pytest.raises(ValueError, match="give x0"):
        geomjax.feedback_field(DOUBLE.system, dt=1e-3)


def test_gains_past_the_stability_bound_are_named_as_the_likely_cause():
    # the README's gains=50 copied to a double pendulum: h·λ_max ≈ 9.7 against β = 2
    Y = geomjax.feedback_field(DOUBLE.system, DOUBLE.x0, gains=50.0)
    with pytest.raises(geomjax.IntegrationError) as info:
        geomjax.integrate(Y, DOUBLE.x0, dt=1e-3, steps=1000, method="euler")
    text = str(info.value)
    assert "Likely cause: the gains. With K = 50" in text
    assert "stability bound β = 2 of 'euler'" in text
    assert "geomjax.recommended_gains" in text
    # gains within the bound that fail for another reason get no such sentence
    Z = geomjax.feedback_field(DOUBLE.system, DOUBLE.x0, gains=1.0)
    sol = geomjax.integrate(Z, DOUBLE.x0, dt=1e-3, steps=100, method="euler", drift_tol=1e-12, throw=False)
    assert not bool(sol.ok)
    assert "Likely cause" not in sol.message
