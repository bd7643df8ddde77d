"""Closed-over values are parameters: for every family of field and step, a parameter the
user's function reaches by closure (as JAX users write it) differentiates as the same
parameter passed explicitly (`jax.tree_util.Partial`) and as central differences, under
`jax.grad`, `jax.jit(jax.grad)`, `jax.jacfwd` and `jax.vmap`.

Each case is `loss(wrap, p)`: `wrap(f, p)` makes the user's function from `f(p, ...)`,
either as a closure `lambda *a: f(p, *a)` or as `Partial(f, p)` (an explicit pytree leaf).
"""

import equinox as eqx
import geomjax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.tree_util import Partial


def closure(f, p):
    return lambda *a: f(p, *a)


def explicit(f, p):
    return Partial(f, p)


SPHERE_X0 = jnp.array([0.0, 1.0, 0.0, 1.0, 0.0, -1.0])  # |q| = 1, q·p = 0, moving


def _pendulum_hamiltonian(g, x):
    return 0.5 * x[3:] @ x[3:] + g * x[2] + 0.05 * g**2 * x[0] ** 2


def _sphere(q):
    return jnp.stack([q @ q - 1.0])


def _holonomic_system(wrap, p):
    return geomjax.System(wrap(_pendulum_hamiltonian, p), geomjax.canonical(3), holonomic=_sphere)


def _final(sol):
    return sol.xs[-1] @ jnp.array([0.3, 1.0, 1.7, -0.4, 0.8, 1.1])


# Six steps saved every three: the driver's save blocks (custom derivatives) are used.
DT = 0.02


def run(dt):
    return dict(dt=dt, steps=6, save_every=3)


def _field_case(name, make_field, x0, method):
    """A case: the field `make_field(wrap, p)` run by `method` from `x0`."""

    def case(wrap, p, dt=DT):
        return _final(geomjax.integrate(make_field(wrap, p), x0, method=method, **run(dt)))

    case.__name__ = name
    return case


def _dirac(wrap, p):
    return geomjax.dirac_field(_holonomic_system(wrap, p))


def _feedback(wrap, p):
    return geomjax.feedback_field(_holonomic_system(wrap, p), SPHERE_X0, gains=5.0)


dirac_euler = _field_case("dirac_euler", _dirac, SPHERE_X0, "euler")
dirac_midpoint = _field_case("dirac_midpoint", _dirac, SPHERE_X0, "implicit_midpoint")
dirac_gauss4 = _field_case("dirac_gauss4", _dirac, SPHERE_X0, "gauss4")
feedback_rk4 = _field_case("feedback_rk4", _feedback, SPHERE_X0, "rk4")
feedback_gauss2 = _field_case("feedback_gauss2", _feedback, SPHERE_X0, "gauss2")


def _oscillator_hamiltonian(eps, x):
    q, m = x[:3], x[3:]
    return 0.5 * (m @ m + q @ q) + 0.5 * eps * q[0] ** 2 * q[2] ** 2


def _oscillator_forms(q):
    return jnp.stack([jnp.stack([1.0, 0.0 * q[0], q[1]])])


OSC_X0 = jnp.array([1.0, 0.0, 1.0, 0.0, 1.0, 0.5])


def _nonholonomic_system(wrap, p):
    return geomjax.System(wrap(_oscillator_hamiltonian, p), geomjax.canonical(3), nonholonomic=_oscillator_forms)


def _nonholonomic(wrap, p):
    return geomjax.nonholonomic_field(_nonholonomic_system(wrap, p))


nonholonomic_euler = _field_case("nonholonomic_euler", _nonholonomic, OSC_X0, "euler")
nonholonomic_gauss2 = _field_case("nonholonomic_gauss2", _nonholonomic, OSC_X0, "gauss2")


def _scaled_sphere(s, q):
    return s * jnp.stack([q @ q - 1.0])  # the same constraint set for every s ≠ 0


def _vertical_momentum(s, x):
    return s * (x[0] * x[4] - x[1] * x[3])


def _metric(s, x):
    return 1.0 + 0.1 * s * x[2] ** 2


def feedback_everything(wrap, p, dt=DT):
    # The parameter in every user function of a feedback field: H, g, an integral, L(x).
    system = geomjax.System(
        wrap(_pendulum_hamiltonian, p), geomjax.canonical(3), holonomic=wrap(_scaled_sphere, p),
        integrals=wrap(_vertical_momentum, p),
    )
    field = geomjax.feedback_field(system, SPHERE_X0, gains=5.0, metric=wrap(_metric, p))
    return _final(geomjax.integrate(field, SPHERE_X0, method="euler", **run(dt)))


def _scaled_forms(s, q):
    return s * _oscillator_forms(q)


def nonholonomic_feedback(wrap, p, dt=DT):
    # The parameter in the constraint one-forms ω(q) (the same distribution for s ≠ 0).
    system = geomjax.System(
        Partial(_oscillator_hamiltonian, 0.3), geomjax.canonical(3), nonholonomic=wrap(_scaled_forms, p)
    )
    field = geomjax.feedback_field(system, OSC_X0, gains=5.0)
    return _final(geomjax.integrate(field, OSC_X0, method="euler", **run(dt)))


def rattle(wrap, p, dt=DT):
    return _final(geomjax.integrate(geomjax.rattle(_holonomic_system(wrap, p)), SPHERE_X0, **run(dt)))


def shake(wrap, p, dt=DT):
    return _final(geomjax.integrate(geomjax.shake(_holonomic_system(wrap, p)), SPHERE_X0, **run(dt)))


def dla(wrap, p, dt=DT):
    return _final(geomjax.integrate(geomjax.dla(_nonholonomic_system(wrap, p)), OSC_X0, **run(dt)))


def _kick(k, x, h):
    return jnp.concatenate([x[:3], x[3:] - h * k * x[:3]])


def _drift(x, h):
    return jnp.concatenate([x[:3] + h * x[3:], x[3:]])


def strang(wrap, p, dt=DT):
    step = geomjax.strang(geomjax.FunctionStep(wrap(_kick, p)), geomjax.FunctionStep(_drift))
    return _final(geomjax.integrate(step, SPHERE_X0, **run(dt)))


def _damped_lagrangian(alpha, q, v, z):
    return 0.5 * v @ v - 0.5 * q @ q - 0.2 * q[0] ** 4 - alpha * z


def herglotz(wrap, p, dt=DT):
    sol = geomjax.integrate(geomjax.herglotz(wrap(_damped_lagrangian, p), order=2), jnp.array([1.0, 0.3, 0.0]), **run(dt))
    return sol.xs[-1] @ jnp.array([1.0, 0.7, 0.4])


def _force(alpha, q, v, t):
    return -alpha * v


def forced_dla(wrap, p, dt=DT):
    L = lambda q, v: 0.5 * v @ v - 0.5 * q @ q - 0.2 * q[0] ** 4
    sol = geomjax.integrate(geomjax.forced_dla(L, force=wrap(_force, p)), jnp.array([1.0, 0.3]), **run(dt))
    return sol.xs[-1] @ jnp.array([1.0, 0.7])


def _contact_potential(k, q, t):
    return 0.5 * k * q @ q + 0.1 * q[0] ** 4


def contact_splitting(wrap, p, dt=DT):
    step = geomjax.contact_splitting(wrap(_contact_potential, p), lambda t: 0.1, order=2)
    sol = geomjax.integrate(step, jnp.array([1.0, 0.2, 0.0]), **run(dt))
    return sol.xs[-1] @ jnp.array([1.0, 0.7, 0.4])


def _planar_lagrangian(g, q, v):
    return 0.5 * v @ v - g * q[1]


def _circle(q):
    return jnp.stack([q @ q - 1.0])


PLANAR_X0 = jnp.array([jnp.sin(0.5), -jnp.cos(0.5), 0.0, 0.0])


def dirac1(wrap, p, dt=DT):
    sol = geomjax.integrate(geomjax.dirac1(wrap(_planar_lagrangian, p), holonomic=_circle), PLANAR_X0, **run(dt))
    return sol.xs[-1] @ jnp.array([1.0, 0.7, 0.4, -0.3])


def dirac2(wrap, p, dt=DT):
    sol = geomjax.integrate(geomjax.dirac2(wrap(_planar_lagrangian, p), holonomic=_circle), PLANAR_X0, **run(dt))
    return sol.xs[-1] @ jnp.array([1.0, 0.7, 0.4, -0.3])


def dirac_rk(wrap, p, dt=DT):
    step = geomjax.dirac_rk(wrap(_planar_lagrangian, p), "gauss", 1, holonomic=_circle)
    sol = geomjax.integrate(step, PLANAR_X0, **run(dt))
    return sol.xs[-1] @ jnp.array([1.0, 0.7, 0.4, -0.3])


def sweep(wrap, p, dt=DT):
    def member(gain):
        field = geomjax.feedback_field(_holonomic_system(wrap, p), SPHERE_X0, gains=gain)
        return field, SPHERE_X0

    result = geomjax.sweep(member, geomjax.product(gain=[2.0, 5.0]), **run(dt))
    return jnp.sum(result.xs[..., -1, :] @ jnp.array([0.3, 1.0, 1.7, -0.4, 0.8, 1.1]))


def sweep_rows(wrap, p, dt=DT):
    """The sweep in the component layout: the loop carries one (B,) row per scalar."""

    def member(gain):
        field = geomjax.feedback_field(_holonomic_system(wrap, p), SPHERE_X0, gains=gain)
        return field, SPHERE_X0

    result = geomjax.sweep(member, geomjax.product(gain=[2.0, 5.0]), layout="component", **run(dt))
    return jnp.sum(result.xs[..., -1, :] @ jnp.array([0.3, 1.0, 1.7, -0.4, 0.8, 1.1]))


def dirac_midpoint_every_step(wrap, p, dt=DT):
    """Saved every step: the run goes with the stages' fixed-point iteration and is redone
    with its Newton fallback where it failed (the driver's `_fast_variant_then_step`)."""
    sol = geomjax.integrate(_dirac(wrap, p), SPHERE_X0, method="implicit_midpoint", dt=dt, steps=6, save_every=1)
    return _final(sol)


def _time_field(k, t, x, args):
    return jnp.concatenate([x[3:], -k * x[:3] * (1.0 + 0.1 * jnp.sin(t))])


def time_field(wrap, p, dt=DT):
    return _final(geomjax.integrate(geomjax.TimeField(wrap(_time_field, p)), SPHERE_X0, method="rk4", **run(dt)))


def _user_step(k, x, h):
    return x + h * jnp.concatenate([x[3:], -k * x[:3]])


def user_step(wrap, p, dt=DT):
    return _final(geomjax.integrate(wrap(_user_step, p), SPHERE_X0, method="step", **run(dt)))


# The default run: every family once (an explicit and an implicit method on the fields);
# CI's `extended` job adds the other methods and variants of the same code paths.
CASES = [
    dirac_euler, feedback_everything, nonholonomic_euler, rattle, dla, strang,
    herglotz, forced_dla, contact_splitting, dirac1, dirac_rk, sweep, time_field,
    user_step,
]
# (implicit midpoint saved every step or in blocks: the implicit solve's derivative path is
# dirac_rk's and rattle's; the rows layout of a sweep runs the same member step as sweep)
EXTENDED = [
    dirac_midpoint, dirac_midpoint_every_step, sweep_rows, dirac_gauss4, feedback_rk4, feedback_gauss2,
    nonholonomic_gauss2, nonholonomic_feedback, shake, dirac2,
]
P = 1.3


def _close(a, b, rtol):
    a, b = np.asarray(a), np.asarray(b)
    return np.all(np.isfinite(a)) and np.max(np.abs(a - b)) <= rtol * max(np.max(np.abs(b)), 1e-3)


EPS = 1e-5


# Eager `jax.grad` (the closed-over value a LinearizeTracer outside any jit) for a few
# families: it goes through the same compiled entry programs for all of them.
EAGER = {"dirac_euler", "rattle"}


@pytest.mark.parametrize(
    "case", CASES + [pytest.param(c, marks=pytest.mark.extended) for c in EXTENDED], ids=lambda c: c.__name__
)
def test_a_closed_over_parameter_differentiates_as_an_explicit_one(case):
    closed = lambda p, dt=DT: case(closure, p, dt)
    passed = lambda p: case(explicit, p)

    @jax.jit
    def everything(ps, p, dt):
        # vmap over the closed-over value with dt traced and x0 concrete (the start
        # checks must leave traced values to the run's own status); the explicit form's
        # value and gradient; the closed-over form's gradient and forward derivative.
        values = jax.vmap(closed, in_axes=(0, None))(ps, dt)
        return values, jax.value_and_grad(passed)(p), jax.grad(closed)(p), jax.jacfwd(closed)(p)

    values, (value, reference), grad, jacfwd = everything(jnp.array([P + EPS, P - EPS, P]), P, DT)
    fd = (values[0] - values[1]) / (2 * EPS)
    assert _close(values[2], value, 1e-12), (values[2], value)
    assert abs(fd) > 1e-5, "the loss hardly depends on the parameter: no check"
    assert _close(reference, fd, 1e-6), (reference, fd)
    derivatives = {"jit(grad)": grad, "jit(jacfwd)": jacfwd}
    if case.__name__ in EAGER:
        derivatives["grad"] = jax.grad(closed)(P)
    for name, d in derivatives.items():
        assert _close(d, reference, 1e-9), (name, float(d), reference, fd)


def test_the_hessian_of_a_closed_over_parameter():
    closed = lambda p: dirac_euler(closure, p)
    passed = lambda p: dirac_euler(explicit, p)
    h = jax.jit(jax.hessian(closed))(P)
    assert _close(h, jax.jit(jax.hessian(passed))(P), 1e-8)
    g = jax.jit(jax.grad(passed))
    assert _close(h, (g(P + 1e-4) - g(P - 1e-4)) / 2e-4, 1e-5)


def test_two_closures_over_different_values_give_different_runs():
    # The same code, the same shapes, two closed-over values in one process: neither a
    # compiled program nor a simplified graph may be reused for the other value.
    runs = [float(dirac_euler(closure, p)) for p in (1.0, 2.0, 1.0)]
    assert runs[0] != runs[1] and runs[0] == runs[2]
    grads = [float(jax.jit(jax.grad(lambda p: dirac_euler(closure, p)))(p)) for p in (1.0, 2.0)]
    assert grads[0] != grads[1]


class _WeightedEnergyError(eqx.Module):
    """The tuning objective with its weight as an explicit pytree leaf."""

    weight: jax.Array

    def __call__(self, xs, x0):
        return self.weight * (_pendulum_hamiltonian(1.0, xs[-1]) - _pendulum_hamiltonian(1.0, x0)) ** 2 + xs[-1, 2] ** 2


def test_a_tuning_objective_that_closes_over_an_array():
    # tune_gains differentiates the user's objective with respect to the gains: a weight
    # the objective closes over is the same as the weight as a leaf, and two objectives
    # closing over different weights (same code) are two objectives.
    field = geomjax.feedback_field(_holonomic_system(explicit, 1.0), SPHERE_X0, gains=1.0)
    starts = np.stack([SPHERE_X0, SPHERE_X0 * np.array([1, 1, 1, 0.8, 1, 0.8])])

    def tune(objective):
        tuned = geomjax.tune_gains(field, starts, dt=0.02, steps=20, iterations=2, gains="scalar",
                                   objective=objective, optimizer=optax.sgd(0.5))
        return np.asarray(tuned.history["objective"]), np.asarray(tuned.history["gains"])

    def closing_over(weight):
        def objective(xs, x0):
            return _WeightedEnergyError(weight)(xs, x0)
        return objective

    closed = tune(closing_over(jnp.asarray(3.0)))
    leaf = tune(_WeightedEnergyError(jnp.asarray(3.0)))
    other = tune(closing_over(jnp.asarray(300.0)))
    np.testing.assert_allclose(closed[0], leaf[0], rtol=1e-12)
    np.testing.assert_allclose(closed[1], leaf[1], rtol=1e-12)
    assert not np.allclose(closed[0], other[0]) and not np.allclose(closed[1][1:], other[1][1:])


def _contact_hamiltonian(a, q, m, s):
    return 0.5 * m @ m + 0.5 * q @ q + a * s


def _foucault_constraint(rate, q, v):
    return -q[1] * v[0] + q[0] * v[1] + rate * (q @ q)


# The other families, values only: a closed-over parameter and a traced dt under jit give
# the run the same code gives with both concrete (one program each).
MORE = {
    "project(rk4)": (lambda w, p: geomjax.project(geomjax.explicit_rk(geomjax.dirac_field(_holonomic_system(w, p)), geomjax.RK4),
                                                  _holonomic_system(w, p)), SPHERE_X0),
    "triple_jump(rattle)": (lambda w, p: geomjax.triple_jump(geomjax.rattle(_holonomic_system(w, p))), SPHERE_X0),
    "ab3": (lambda w, p: geomjax.adams_bashforth(geomjax.dirac_field(_holonomic_system(w, p)), 3), SPHERE_X0),
    "contact_field(rk4)": (lambda w, p: geomjax.explicit_rk(geomjax.contact_field(
        geomjax.ContactHamiltonianSystem(w(_contact_hamiltonian, p), 1)), geomjax.RK4), jnp.array([1.0, 0.3, 0.0])),
    "herglotz(nonholonomic)": (lambda w, p: geomjax.herglotz(
        lambda q, v, z: 0.5 * v @ v - 0.5 * q @ q - 0.1 * z, nonholonomic=geomjax.VelocityConstraint(w(_foucault_constraint, p))),
        jnp.array([0.6, 0.1, 0.0, 0.0, 0.0])),
}


@pytest.mark.parametrize(
    "name", [n if n in ("project(rk4)", "herglotz(nonholonomic)") else pytest.param(n, marks=pytest.mark.extended) for n in sorted(MORE)]
)
def test_other_families_with_a_closed_over_parameter_and_a_traced_step_size(name):
    make, x0 = MORE[name]

    def final(p, dt):
        return geomjax.integrate(make(closure, p), x0, **run(dt)).xs[-1]

    traced = jax.jit(final)(P, DT)
    assert _close(traced, final(P, DT), 1e-12)
    assert not _close(traced, final(0.8 * P, DT), 1e-6)  # the parameter acts


def test_a_failed_run_raises_one_exception_type_traced_or_not():
    # Outside jit (also under an eager jax.grad, where the status is known) an
    # IntegrationError with the partial solution; inside a compiled program equinox's
    # runtime error with the same sentence: IntegrationError is one.
    blow_up = geomjax.FunctionStep(lambda x, h: x / (h - 0.5))
    run = lambda a: geomjax.integrate(blow_up, jnp.stack([a]), dt=0.5, steps=2).xs[-1, 0]
    for call in (lambda: run(1.0), lambda: jax.grad(run)(1.0)):
        with pytest.raises(geomjax.IntegrationError, match="failed at step 1 .* first step from a finite") as err:
            call()
        assert err.value.solution.failed_step == 1
    with pytest.raises(eqx.EquinoxRuntimeError, match="first step from a finite"):
        eqx.filter_jit(run)(1.0)
    assert issubclass(geomjax.IntegrationError, eqx.EquinoxRuntimeError)


@pytest.mark.parametrize(
    "case", [sweep, *(pytest.param(c, marks=pytest.mark.extended) for c in (dirac_euler, rattle))], ids=lambda c: c.__name__
)
def test_the_gradient_of_a_vmap_over_a_closed_over_value(case):
    # jax.grad of a jax.vmap over the parameter: the derivative rules are batched after
    # the driver's programs are staged, and a rule whose outputs were batched unlike its
    # function's (a monitored quantity that does not depend on the parameter) used to
    # fail to lower, closed over or not.
    scales = jnp.array([1.0, 1.2])

    def batched(s, wrap):
        return jax.vmap(lambda g: case(wrap, g))(s * scales).sum()

    @jax.jit
    def everything(s):
        grads = jax.grad(lambda u: batched(u, closure))(s), jax.grad(lambda u: batched(u, explicit))(s)
        return grads, batched(s + EPS, closure), batched(s - EPS, closure)

    (closed, passed), up, down = everything(P)
    assert _close(closed, passed, 1e-9)
    assert _close(closed, (up - down) / (2 * EPS), 1e-6)


def test_the_examples_of_the_closure_and_check_helpers_run():
    import doctest

    import geomjax._validate
    import geomjax.internal.closure

    for module in (geomjax.internal.closure, geomjax._validate):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, module.__name__
