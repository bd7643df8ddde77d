"""Problems and steps shared by the holonomic-method tests (built once per test session).

Steps built here are reused across test modules, so `geomjax.diagnostics.final_state`
(one compilation per step structure, any number of steps) compiles each method once.
"""

import functools

import jax.numpy as jnp
import numpy as np

import geomjax
from geomjax import diagnostics

SPHERE = geomjax.models.spherical_pendulum(holonomic=True)
SPHERE_F = geomjax.models.spherical_pendulum()
X0 = SPHERE.x0
T_ORDER = 1.0
NS = (10, 20, 40, 80, 160)
HS = tuple(T_ORDER / n for n in NS)

KINETIC, POTENTIAL = geomjax.models.pendulum_flows(SPHERE)
DIRAC = geomjax.dirac_field(SPHERE.system)


def pendulum_1dof(x):
    """A nonlinear unconstrained test problem: H = p²/2 − cos q."""
    return 0.5 * x[1] ** 2 - jnp.cos(x[0])


def henon_heiles(x):
    """H = |p|²/2 + (x² + y²)/2 + x²y − y³/3 (nonlinear, two degrees of freedom)."""
    q, p = x[:2], x[2:]
    return 0.5 * p @ p + 0.5 * q @ q + q[0] ** 2 * q[1] - q[1] ** 3 / 3.0


PENDULUM_1DOF = geomjax.System(pendulum_1dof, geomjax.canonical(1))
X0_1DOF = jnp.array([1.2, 0.3])
HENON_HEILES = geomjax.System(henon_heiles, geomjax.canonical(2))
X0_HH = jnp.array([0.1, -0.2, 0.3, 0.25])
FIELD_HH = geomjax.hamiltonian_vector_field(henon_heiles, geomjax.canonical(2))
GAUSS4_HH = geomjax.implicit_rk(FIELD_HH, geomjax.GAUSS4)


@functools.cache
def sphere_reference():
    """x(1) for the spherical pendulum: Yoshida-4 Strang with 2560 steps (error ~1e-15)."""
    step = geomjax.triple_jump(geomjax.strang(KINETIC, POTENTIAL))
    x, status = diagnostics.final_state(step, X0, T_ORDER / 2560, 2560)
    assert bool(status == geomjax.RESULTS.successful)
    return np.asarray(x)


@functools.cache
def one_dof_reference():
    """x(1) for H = p²/2 − cos q by 6th-order Gauss with 400 steps (error ~1e-16)."""
    step = geomjax.implicit_rk(geomjax.hamiltonian_vector_field(pendulum_1dof, geomjax.canonical(1)), geomjax.GAUSS6)
    x, status = diagnostics.final_state(step, X0_1DOF, T_ORDER / 400, 400)
    assert bool(status == geomjax.RESULTS.successful)
    return np.asarray(x)


def measured_order(step, x0, reference, ns=NS):
    errors = diagnostics.global_errors(step, x0, T_ORDER, ns, reference)
    assert np.all(np.isfinite(errors)), errors
    return diagnostics.convergence_order([T_ORDER / n for n in ns], errors)


def state_on_sphere():
    """A generic point of T*S² (RATTLE from x0 for 37 steps of 0.01)."""
    x, _ = diagnostics.final_state(geomjax.rattle(SPHERE.system), X0, 0.01, 37)
    return x
