"""Implicit Runge–Kutta (Gauss–Legendre, implicit midpoint, trapezoidal) with Newton stages."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _holonomic_cases import (
    DIRAC,
    FIELD_HH,
    GAUSS4_HH,
    PENDULUM_1DOF,
    SPHERE,
    X0,
    X0_1DOF,
    X0_HH,
    measured_order,
    one_dof_reference,
)

import geomjax
from geomjax import diagnostics
from geomjax._step.base import NEWTON_FAILED

FIELD_1DOF = geomjax.hamiltonian_vector_field(PENDULUM_1DOF.hamiltonian, PENDULUM_1DOF.structure)
TABLEAUX = {
    "implicit_midpoint": geomjax.IMPLICIT_MIDPOINT,
    "gauss4": geomjax.GAUSS4,
    "gauss6": geomjax.GAUSS6,
    "gauss8": geomjax.GAUSS8,
    "trapezoidal": geomjax.TRAPEZOIDAL,
}


@pytest.mark.parametrize("name", list(TABLEAUX))
def test_orders_on_a_nonlinear_pendulum(name):
    step = geomjax.implicit_rk(FIELD_1DOF, TABLEAUX[name])
    ns = {"gauss6": (4, 8, 16, 32), "gauss8": (3, 4, 5, 6)}.get(name, (10, 20, 40, 80))
    fit = measured_order(step, X0_1DOF, one_dof_reference(), ns=ns)
    assert abs(fit.order - geomjax.method_order(name)) <= 0.3, fit
    assert geomjax.method_order(name) == TABLEAUX[name].order


def test_registered_names_run_through_integrate():
    assert {"implicit_midpoint", "gauss2", "gauss4", "gauss6", "gauss8", "trapezoidal"} <= set(geomjax.method_names())
    sol = geomjax.integrate(FIELD_1DOF, X0_1DOF, dt=0.1, steps=10, save_every=10, method="gauss4")
    x, _ = diagnostics.final_state(geomjax.implicit_rk(FIELD_1DOF, geomjax.GAUSS4), X0_1DOF, 0.1, 10)
    np.testing.assert_allclose(sol.xs[-1], x, atol=1e-14)


@pytest.mark.parametrize("tableau", [geomjax.GAUSS2, geomjax.GAUSS4, geomjax.GAUSS6, geomjax.GAUSS8], ids=["g2", "g4", "g6", "g8"])
def test_gauss_is_symplectic(tableau):
    step = GAUSS4_HH if tableau is geomjax.GAUSS4 else geomjax.implicit_rk(FIELD_HH, tableau)
    defect = float(diagnostics.symplecticity_defect(step, X0_HH, 0.3))
    assert defect < 1e-13, defect


@pytest.mark.parametrize("method", ["trapezoidal", "euler"])
def test_non_symplectic_methods_have_a_defect(method):
    step = geomjax._step.methods.build_step(method, FIELD_HH)
    defect = float(diagnostics.symplecticity_defect(step, X0_HH, 0.3))
    assert defect > 1e-4, defect


def test_gauss_conserves_the_quadratic_invariants_of_the_dirac_field():
    # |q|², q·p and q₁p₂ − q₂p₁ are quadratic first integrals of the Dirac field of the
    # spherical pendulum: Gauss methods keep them to round-off.
    sol = geomjax.integrate(DIRAC, X0, dt=0.1, steps=200, save_every=10, method="gauss4")
    err = np.asarray(diagnostics.invariant_errors(SPHERE.system, sol.xs))
    assert err[:, [0, 1, 3]].max() < 1e-12, err.max(axis=0)


def test_works_on_a_feedback_field():
    y = geomjax.feedback_field(SPHERE.system, X0, gains=1.0)
    step = geomjax.implicit_rk(y, geomjax.GAUSS4)
    ref, status = diagnostics.final_state(step, X0, 1.0 / 160, 160)
    assert bool(status == geomjax.RESULTS.successful)
    fit = measured_order(step, X0, ref, ns=(5, 10, 20, 40))
    assert abs(fit.order - 4.0) <= 0.3, fit


def test_newton_failure_is_reported():
    # Implicit midpoint for ẋ = x² from x = 1 with h = 1: Z = h(x + Z/2)² has no real root.
    sol = geomjax.integrate(lambda x: x**2, jnp.array([1.0]), dt=1.0, steps=3, method="implicit_midpoint", throw=False)
    assert bool(sol.result == NEWTON_FAILED) and int(sol.failed_step) == 1
    with pytest.raises(geomjax.IntegrationError, match="Newton"):
        geomjax.integrate(lambda x: x**2, jnp.array([1.0]), dt=1.0, steps=3, method="implicit_midpoint")


def test_gradient_by_implicit_function_theorem_matches_finite_differences():
    step = GAUSS4_HH
    f = jax.jit(lambda x: step(step(x, 0.3), 0.3)[1])
    grad = jax.grad(f)(X0_HH)
    eps = 1e-6
    eye = jnp.eye(4)
    fd = jnp.stack([(f(X0_HH + eps * e) - f(X0_HH - eps * e)) / (2 * eps) for e in eye])
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-9)
