"""The verification harness itself: order fits, drift detection, error series, defects, projection."""

import jax.numpy as jnp
import numpy as np
import pytest
from _holonomic_cases import (
    DIRAC,
    FIELD_HH,
    GAUSS4_HH,
    SPHERE,
    SPHERE_F,
    X0,
    X0_HH,
    measured_order,
    sphere_reference,
    state_on_sphere,
)

import geomjax
from geomjax import diagnostics
from geomjax._step.base import NEWTON_FAILED


def test_convergence_order_removes_the_round_off_plateau():
    hs = 0.1 / 2.0 ** np.arange(10)
    noise = 1e-12 * (1.0 + 0.5 * np.sin(np.arange(10)))
    fit = diagnostics.convergence_order(hs, 2.0 * hs**4 + noise)
    assert abs(fit.order - 4.0) < 0.1 and fit.dropped >= 2, fit
    fit = diagnostics.convergence_order(hs[:4], 0.5 * hs[:4] ** 2)
    assert abs(fit.order - 2.0) < 1e-12 and abs(fit.constant - 0.5) < 1e-10 and fit.hs.size == 3
    with pytest.raises(ValueError, match="fewer than two"):
        diagnostics.convergence_order([0.1, 0.05], [1e-16, np.nan])


def test_drift_slope_separates_oscillation_from_growth():
    ts = np.linspace(0.0, 100.0, 2001)
    bounded = diagnostics.drift_slope(ts, 1e-3 * np.sin(3.0 * ts) ** 2)
    growing = diagnostics.drift_slope(ts, 1e-5 * ts * (1.0 + 0.3 * np.sin(3.0 * ts)))
    assert abs(bounded.relative) < 0.05 and growing.relative > 0.7
    assert growing.slope > 0 and len(growing.maxima) == 10


def test_energy_drift_of_explicit_euler_is_detected():
    sol = geomjax.integrate(DIRAC, X0, dt=0.01, steps=2000, save_every=10, method="euler", drift_tol=None)
    e = diagnostics.energy_errors(SPHERE.system, sol.xs)
    assert diagnostics.drift_slope(sol.ts, e).relative > 0.5


def test_error_series_columns():
    sol = geomjax.integrate(geomjax.rattle(SPHERE.system), X0, dt=0.05, steps=20, save_every=5)
    inv = diagnostics.invariant_errors(SPHERE.system, sol.xs)
    assert inv.shape == (5, 4) and float(inv[0].max()) == 0.0
    np.testing.assert_allclose(inv[:, 2], diagnostics.energy_errors(SPHERE.system, sol.xs), atol=0)
    assert diagnostics.constraint_errors(SPHERE.system, sol.xs).shape == (5, 2)
    # The seed's form f = (|q|², q·p) compares with the level of the first state.
    f = diagnostics.constraint_errors(SPHERE_F.system, sol.xs)
    assert float(f.max()) < 1e-12


def test_tangent_projector():
    x = state_on_sphere()
    p = diagnostics.tangent_projector(SPHERE.system, x)
    np.testing.assert_allclose(p @ p, p, atol=1e-13)
    df = np.asarray(jnp.stack([jnp.asarray(row) for row in _jacobian_of_constraints(x)]))
    np.testing.assert_allclose(df @ p, 0.0, atol=1e-13)  # image in T_xS
    xf = np.asarray(SPHERE.system.structure.matrix(x)) @ df.T
    np.testing.assert_allclose(p @ xf, 0.0, atol=1e-13)  # kernel is T_xS^ω
    assert np.linalg.matrix_rank(np.asarray(p), tol=1e-9) == 4


def _jacobian_of_constraints(x):
    import jax

    return jax.jacfwd(SPHERE.system.constraint_functions)(x)


def test_symplecticity_defect_separates_methods_on_the_manifold():
    x = state_on_sphere()
    euler = geomjax.explicit_rk(DIRAC, geomjax.EULER)
    assert float(diagnostics.symplecticity_defect(euler, x, 0.1, SPHERE.system)) > 1e-3
    with pytest.raises(ValueError, match="canonical"):
        diagnostics.symplecticity_defect(euler, x, 0.1, geomjax.System(lambda m: m @ m, geomjax.lie_poisson_so3()))


def test_poisson_defect_agrees_with_symplecticity_for_canonical_maps():
    structure = geomjax.canonical(2)
    assert float(diagnostics.poisson_defect(GAUSS4_HH, X0_HH, 0.3, structure)) < 1e-13
    euler = geomjax.explicit_rk(FIELD_HH, geomjax.EULER)
    assert float(diagnostics.poisson_defect(euler, X0_HH, 0.3, structure)) > 1e-4


def test_projection_method_keeps_constraints_and_base_order():
    rk4 = geomjax.explicit_rk(DIRAC, geomjax.RK4)
    step = geomjax.project(rk4, SPHERE.system)
    fit = measured_order(step, X0, sphere_reference())
    assert abs(fit.order - 4.0) <= 0.3, fit
    x, status = diagnostics.final_state(step, X0, 0.1, 50)
    assert bool(status == geomjax.RESULTS.successful)
    assert float(jnp.abs(SPHERE.system.constraint_functions(x)).max()) < 1e-12
    # The seed's general form needs the level of f on S.
    with pytest.raises(ValueError, match="level="):
        geomjax.project(rk4, SPHERE_F.system)
    euler = geomjax.explicit_rk(geomjax.dirac_field(SPHERE_F.system), geomjax.EULER)
    general = geomjax.project(euler, SPHERE_F.system, level=SPHERE_F.system.constraint_functions(X0))
    x, status = diagnostics.final_state(general, X0, 0.01, 100)
    f = SPHERE_F.system.constraint_functions(x) - SPHERE_F.system.constraint_functions(X0)
    assert bool(status == geomjax.RESULTS.successful) and float(jnp.abs(f).max()) < 1e-12


def test_final_state_reports_failure():
    x, status = diagnostics.final_state(geomjax.rattle(SPHERE.system), X0, 1.0, 3)
    assert bool(status == NEWTON_FAILED)
    errs = diagnostics.global_errors(geomjax.rattle(SPHERE.system), X0, 3.0, [3], X0)
    assert np.isnan(errs[0])
