"""Differentiating whole trajectories: gradients with respect to the initial state, a model
parameter and the feedback gains against central finite differences; parameter sweeps by
`vmap`."""

import equinox as eqx
import geomjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.tree_util import Partial

DT, STEPS, SAVE = 0.005, 200, 10


def trajectory_functional(x_start, g, gains, checkpoint=True):
    """Feedback-Euler run of the spherical pendulum (gravity g) toward V⁻¹(0) of the seed's x0,
    started from x_start: Σ q₃ over the saved states plus the final energy.

    x_start is off V⁻¹(0), so the gains shape the trajectory at first order.
    """
    model = geomjax.models.spherical_pendulum(g=g)
    field = geomjax.feedback_field(model.system, model.x0, gains=gains)
    sol = geomjax.integrate(
        field, x_start, dt=DT, steps=STEPS, method="euler", save_every=SAVE, throw=False, checkpoint=checkpoint
    )
    return jnp.sum(sol.xs[:, 2]) + model.system.hamiltonian(sol.x_final)


value = jax.jit(trajectory_functional)
gradient = jax.jit(jax.grad(trajectory_functional, argnums=(0, 1, 2)))

X_START = jnp.array([0.03, 1.02, -0.04, 0.97, 0.05, -1.02])
G = jnp.asarray(1.3)
GAINS = jnp.array([2.0, 3.0, 4.0, 5.0])


def central_difference(fn, x, eps):
    x = np.asarray(x, dtype=np.float64)
    flat = x.reshape(-1)
    out = np.empty_like(flat)
    for i in range(flat.size):
        e = np.zeros_like(flat)
        e[i] = eps
        out[i] = (float(fn(jnp.asarray((flat + e).reshape(x.shape)))) - float(fn(jnp.asarray((flat - e).reshape(x.shape))))) / (
            2 * eps
        )
    return out.reshape(x.shape)


@pytest.fixture(scope="module")
def ad_gradients():
    return [np.asarray(a) for a in gradient(X_START, G, GAINS)]


def _assert_grad_close(ad, fd, rtol=1e-5):
    ad, fd = np.atleast_1d(ad), np.atleast_1d(fd)
    assert np.all(np.isfinite(ad))
    assert np.linalg.norm(fd) > 1e-4, "gradient too small for a meaningful check"
    assert np.linalg.norm(ad - fd) <= rtol * np.linalg.norm(fd), (ad, fd)


def test_gradient_wrt_initial_state(ad_gradients):
    fd = central_difference(lambda x: value(x, G, GAINS), X_START, 1e-6)
    _assert_grad_close(ad_gradients[0], fd)


def test_gradient_wrt_model_parameter(ad_gradients):
    fd = central_difference(lambda g: value(X_START, g, GAINS), G, 1e-6)
    _assert_grad_close(ad_gradients[1], fd)


def test_gradient_wrt_gains(ad_gradients):
    fd = central_difference(lambda k: value(X_START, G, k), GAINS, 1e-5)
    _assert_grad_close(ad_gradients[2], fd)
    # Every gain acts on the trajectory.
    assert np.all(np.abs(ad_gradients[2]) > 1e-6)


def test_forward_and_reverse_mode_agree_and_checkpointing_is_exact(ad_gradients):
    fwd = jax.jacfwd(lambda g: value(X_START, g, GAINS))(G)
    np.testing.assert_allclose(fwd, ad_gradients[1], rtol=1e-10)
    no_ckpt = jax.grad(trajectory_functional)(X_START, G, GAINS, checkpoint=False)
    np.testing.assert_allclose(no_ckpt, ad_gradients[0], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("save_every", [1, SAVE, STEPS])
def test_checkpointed_gradients_equal_the_plain_ones(save_every):
    # checkpoint=True recomputes each step in the backward pass (and each save block when
    # there are several); the gradients must be those of checkpoint=False to round-off.
    def loss(x_start, g, gains, checkpoint):
        model = geomjax.models.spherical_pendulum(g=g)
        field = geomjax.feedback_field(model.system, model.x0, gains=gains)
        sol = geomjax.integrate(
            field, x_start, dt=DT, steps=STEPS, save_every=save_every, throw=False, checkpoint=checkpoint
        )
        return jnp.sum(sol.xs[:, 2]) + jnp.sum(sol.x_final**2)

    grads = {
        ck: jax.jit(jax.grad(lambda x, g, k: loss(x, g, k, ck), argnums=(0, 1, 2)))(X_START, G, GAINS)
        for ck in (True, False)
    }
    for with_ckpt, without in zip(grads[True], grads[False]):
        np.testing.assert_allclose(with_ckpt, without, rtol=1e-12, atol=1e-12)


def test_vmap_sweep_over_gravity(ad_gradients):
    """vmap over the model parameter g: one compiled run per batch, different results per g."""
    gs = jnp.array([0.5, 1.0, 1.3, 2.0, 9.81])
    sweep = jax.jit(jax.vmap(trajectory_functional, in_axes=(None, 0, None)))(X_START, gs, GAINS)
    assert sweep.shape == (5,)
    assert len(np.unique(np.round(np.asarray(sweep), 10))) == 5
    for i in (1, 2, 4):
        np.testing.assert_allclose(sweep[i], value(X_START, gs[i], GAINS), rtol=1e-12)
    # Gradients vmap too: d/dg at each g, checked against the scalar gradient at g = 1.3.
    grads = jax.vmap(jax.grad(trajectory_functional, argnums=1), in_axes=(None, 0, None))(X_START, gs, GAINS)
    np.testing.assert_allclose(grads[2], ad_gradients[1], rtol=1e-10)
    assert len(np.unique(np.round(np.asarray(grads), 8))) == 5


def _spring_hamiltonian(stiffness, x):
    q, p = x[:2], x[2:]
    return 0.5 * p @ p + 0.5 * stiffness * (q[0] - 0.3) ** 2 + q[1]


def _user_run(stiffness):
    """A user-built System whose parameter lives in a Partial: a bead on a circle with a spring."""
    system = geomjax.System(
        Partial(_spring_hamiltonian, stiffness), geomjax.canonical(2), holonomic=lambda q: jnp.atleast_1d(q @ q - 1.0)
    )
    x0 = jnp.array([1.0, 0.0, 0.0, 0.4])
    sol = geomjax.integrate(geomjax.dirac_field(system), x0, dt=0.01, steps=100, method="rk4", save_every=100, throw=False)
    return sol.x_final[0]


def test_user_system_parameter_sweep_and_gradient():
    ks = jnp.array([0.0, 1.0, 4.0])
    finals = jax.jit(jax.vmap(_user_run))(ks)
    assert len(np.unique(np.round(np.asarray(finals), 10))) == 3
    run = jax.jit(_user_run)
    np.testing.assert_allclose(finals, [run(k) for k in ks], rtol=1e-12)
    k = jnp.asarray(2.0)
    ad = jax.grad(_user_run)(k)
    fd = (run(k + 1e-6) - run(k - 1e-6)) / 2e-6
    assert abs(float(ad) - float(fd)) <= 1e-5 * abs(float(fd))
    assert abs(float(fd)) > 1e-4


def test_traced_parameters_with_a_concrete_initial_state():
    """Under grad the system's parameter is traced while x0 is a concrete array: the eager
    checks on x0 (C nonsingular, x0 on g = 0) must step aside rather than fail."""
    x0 = jnp.array([1.0, 0.0, 0.0, 0.4])

    def run(stiffness):
        system = geomjax.System(
            Partial(_spring_hamiltonian, stiffness), geomjax.canonical(2), holonomic=lambda q: jnp.atleast_1d(q @ q - 1.0)
        )
        field = geomjax.feedback_field(system, x0, gains=3.0)
        sol = geomjax.integrate(field, x0, dt=0.01, steps=50, method="heun", save_every=50, throw=False)
        return sol.x_final[1]

    k = jnp.asarray(1.5)
    ad = float(jax.grad(run)(k))
    fd = (float(jax.jit(run)(k + 1e-6)) - float(jax.jit(run)(k - 1e-6))) / 2e-6
    assert abs(fd) > 1e-4
    assert abs(ad - fd) <= 1e-5 * abs(fd)


def test_derivative_loops_run_entrywise_with_the_same_steps_and_derivatives():
    """Derivatives of explicit-Euler runs go through the field with every state entry (and
    every entry of its gains and targets) a piece of its own (`per_entry`): the same step,
    the same derivatives, members' shared arrays still shared. Multi-stage methods keep
    their layout."""
    from geomjax._driver.batched import batch_members
    from geomjax._driver.integrate import per_entry
    from geomjax._field.base import EntrywiseField
    from geomjax._step.methods import build_step

    model = geomjax.models.spherical_pendulum()
    field = geomjax.feedback_field(model.system, model.x0, gains=GAINS)
    starts = jnp.stack([X_START, X_START * 1.01, X_START * 0.99])

    def batched(method, gains):
        def make(member):
            f = eqx.tree_at(lambda f: f.gains, field, gains)
            step = build_step(method, f)
            return step.at_start(step.split(member["x0"])), member["x0"]

        return batch_members(make, {"x0": starts}, 0, 3)

    step, x0 = batched("euler", GAINS)
    entries = per_entry(step)
    assert isinstance(entries.step.field, EntrywiseField)
    rk4 = batched("rk4", GAINS)[0]
    assert per_entry(rk4) is rk4
    arrays = jax.tree_util.tree_leaves(eqx.filter(entries.step, eqx.is_array))
    gain_axes = [ax for leaf, ax in zip(arrays, entries.step_axes) if leaf.ndim == 0]
    assert None in gain_axes  # the gains' entries stay shared by the members

    def advance(s, x):
        z, _ = s.advance(0.0, s.split(x), 0.01, None)
        return s.merge(z)

    x_plain, x_entry = advance(step, x0), advance(entries, x0)
    np.testing.assert_allclose(x_entry, x_plain, rtol=1e-15, atol=1e-15)
    v = jnp.ones_like(x0)
    _, t_plain = jax.jvp(lambda x: advance(step, x), (x0,), (v,))
    _, t_entry = jax.jvp(lambda x: advance(entries, x), (x0,), (v,))
    np.testing.assert_allclose(t_entry, t_plain, rtol=1e-13, atol=1e-15)
    cot = jnp.cos(x0)
    g_plain = jax.vjp(lambda x: advance(step, x), x0)[1](cot)[0]
    g_entry = jax.vjp(lambda x: advance(entries, x), x0)[1](cot)[0]
    np.testing.assert_allclose(g_entry, g_plain, rtol=1e-13, atol=1e-15)

    # the gains' cotangent through the conversion (per_entry inside, as the driver does)
    def through_gains(layout):
        def loss(gains):
            s = batched("euler", gains)[0]
            s = per_entry(s) if layout == "entries" else s
            z, _ = s.advance(0.0, s.split(x0), 0.01, None)
            return jnp.sum(jnp.sin(s.merge(z)))

        return jax.grad(loss)(GAINS)

    np.testing.assert_allclose(through_gains("entries"), through_gains("plain"), rtol=1e-12, atol=1e-15)


def _primitives_in_loops(jaxpr, inside=False, found=None):
    found = set() if found is None else found
    for eqn in jaxpr.eqns:
        if inside:
            found.add(eqn.primitive.name)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            _primitives_in_loops(sub, inside or eqn.primitive.name in ("while", "scan"), found)
    return found


def test_looped_stages_of_a_large_derived_field_are_checkpointed_and_differentiate_exactly():
    """The double pendulum's feedback field is above the written-out size, so RK4 loops over
    its stages, each under `jax.checkpoint`; the gradients through a run (w.r.t. the start
    and the gain) match central differences."""
    model = geomjax.models.planar_chain(2, gravity=9.81)
    field = geomjax.feedback_field(model.system, model.x0, gains=2.0)
    step = geomjax.explicit_rk(field, geomjax.RK4)
    assert step.stage_layout(0.0, step.split(model.x0)) == "checkpointed"
    pendulum = geomjax.models.spherical_pendulum()
    small = geomjax.explicit_rk(geomjax.feedback_field(pendulum.system, pendulum.x0, gains=2.0), geomjax.RK4)
    assert small.stage_layout(0.0, small.split(pendulum.x0)) == "written out"
    assert "remat2" in _primitives_in_loops(jax.make_jaxpr(lambda x: step(x, 1e-3))(model.x0).jaxpr)

    x_start = model.x0 + 1e-2 * jnp.arange(1.0, 9.0) / 8

    def loss(x_start, gain):
        f = geomjax.feedback_field(model.system, model.x0, gains=gain)
        sol = geomjax.integrate(f, x_start, dt=2e-3, steps=100, method="rk4", save_every=10, start_tol=None,
                                throw=False)
        return jnp.sum((sol.xs - model.x0) ** 2)

    grad_x, grad_gain = jax.jit(jax.grad(loss, argnums=(0, 1)))(x_start, jnp.asarray(2.0))
    f = jax.jit(loss)
    _assert_grad_close(grad_x, central_difference(lambda x: f(x, 2.0), x_start, 1e-6))
    # the gain changes this short run little (a small derivative): against forward mode and differences
    _, forward_gain = jax.jvp(lambda k: loss(x_start, k), (jnp.asarray(2.0),), (jnp.asarray(1.0),))
    np.testing.assert_allclose(grad_gain, forward_gain, rtol=1e-9)
    np.testing.assert_allclose(grad_gain, central_difference(lambda k: f(x_start, k), np.asarray(2.0), 1e-3), rtol=1e-5)
    assert abs(float(grad_gain)) > 0
