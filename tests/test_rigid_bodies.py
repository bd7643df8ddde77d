"""Rigid bodies as point sets (`geomjax.models.RigidBodies`), the gyroscope and the rotor,
checked against rigid-body mechanics written by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax
from geomjax.models._rigid_models import _rotation


def _frame_and_rates(system, x):
    """(axes e_i (3, 3), their rates ė_i) of body 0 from a state, ẋ = ∂H/∂p."""
    n = x.shape[0] // 2
    v = np.asarray(jax.grad(system.hamiltonian)(x)[n:]).reshape(-1, 3)
    q = np.asarray(x[:n]).reshape(-1, 3)
    return q[1:4] - q[0], v[1:4] - v[0]


def test_kinetic_energy_is_that_of_the_rigid_body(rng):
    """½ẋᵀ(𝕄 ⊗ I)ẋ = ½M|v|² + ½ωᵀ(R I Rᵀ)ω at random orientations and motions, and the
    distance constraints hold exactly."""
    inertia = np.array([2.0, 3.0, 4.0])
    bodies = geomjax.models.RigidBodies()
    bodies.add_body(1.5, inertia)
    bodies.add_body(0.5, (1.0, 1.0, 1.5))
    system = bodies.system()
    r = np.stack([_rotation(*rng.uniform(0, 3, 3)) for _ in range(2)])
    v, w, c = rng.normal(size=(3, 2, 3))
    x = bodies.state(centres=c, rotations=r, velocities=v, angular_velocities=w)
    assert float(jnp.abs(system.holonomic(x[:24])).max()) < 1e-14
    exact = sum(0.5 * m * v[b] @ v[b] + 0.5 * w[b] @ r[b] @ np.diag(i) @ r[b].T @ w[b]
                for b, (m, i) in enumerate(((1.5, inertia), (0.5, np.array([1.0, 1.0, 1.5])))))
    assert abs(float(system.hamiltonian(x)) - exact) < 1e-12 * exact
    # the angular velocity is read back from the axes' rates
    axes, rates = _frame_and_rates(system, x)
    np.testing.assert_allclose(0.5 * np.cross(axes, rates).sum(axis=0), w[0], atol=1e-12)


def test_bad_bodies_and_joints_are_refused():
    bodies = geomjax.models.RigidBodies()
    with pytest.raises(ValueError, match="I_i < I_j \\+ I_k"):
        bodies.add_body(1.0, (1.0, 1.0, 2.0))  # a flat disk: zero thickness
    with pytest.raises(ValueError, match="mass must be positive"):
        bodies.add_body(0.0, (1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="add a body first"):
        bodies.system()
    bodies.add_body(1.0, (1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="no body 1"):
        bodies.pin(1)
    with pytest.raises(ValueError, match="two different bodies"):
        bodies.join(0, (0, 0, 1), 0, (0, 0, 0))
    with pytest.raises(ValueError, match="orthogonal"):
        bodies.state(rotations=2 * np.eye(3)[None])


def test_gyroscope_keeps_its_spin_vertical_momentum_and_energy():
    """The symmetric top: RATTLE keeps L_z to round-off (a momentum map linear in q), the
    spin ω·a about the axle (Lagrange's integral, not built in: a check of the mass
    matrix) to O(h²), and the energy bounded; the axle precesses."""
    model = geomjax.models.gyroscope()
    system = model.system
    g = jax.vmap(system.holonomic)
    n = 12
    sol = geomjax.integrate(geomjax.rattle(system), model.x0, dt=1e-3, steps=1000, save_every=50)
    assert sol.ok
    xs = np.asarray(sol.xs)
    assert float(np.abs(g(sol.xs[:, :n])).max()) < 1e-10
    lz = np.array([system.integral_values(x)[0] for x in xs])
    assert np.abs(lz - lz[0]).max() < 1e-12
    h = np.array([system.hamiltonian(x) for x in xs])
    assert np.abs(h - h[0]).max() < 1e-5 * abs(h[0])
    spins = []
    for x in xs:
        axes, rates = _frame_and_rates(system, x)
        spins.append(0.5 * np.cross(axes, rates).sum(axis=0) @ axes[2])
    # ω·a = spin + precession·cos(tilt) at the start
    assert abs(spins[0] - (10.5 + np.cos(0.5))) < 1e-12 and np.abs(np.array(spins) - spins[0]).max() < 1e-6 * spins[0]
    azimuths = [np.arctan2(x[2], x[1]) for x in (xs[:, 9:12] - xs[:, 0:3])]  # of the axle, not the spin
    assert np.ptp(np.unwrap(azimuths)) > 0.5  # it precesses


@pytest.mark.extended  # 2.6 s; the rotor's momenta are declared integrals, which every integrate run monitors
def test_rotor_flips_about_its_intermediate_axis_keeping_its_momenta():
    """The free body started nearly about its intermediate axis turns over (Dzhanibekov):
    the angular velocity's component along the body's second axis changes sign, while L
    and P stay to round-off."""
    model = geomjax.models.rotor()
    system = model.system
    sol = geomjax.integrate(geomjax.rattle(system), model.x0, dt=1e-2, steps=1000, save_every=10)
    assert sol.ok
    xs = np.asarray(sol.xs)
    momenta = np.array([system.integral_values(x) for x in xs])
    assert np.abs(momenta - momenta[0]).max() < 1e-11
    along = []
    for x in xs:
        axes, rates = _frame_and_rates(system, x)
        along.append(0.5 * np.cross(axes, rates).sum(axis=0) @ axes[1])
    assert along[0] > 1.9 and min(along) < -1.5


def test_a_hinged_body_turns_about_its_axis_only():
    """A body hinged to the vertical axis through its centre, under gravity: the hinge's
    5 constraints hold, and the angular velocity stays vertical."""
    bodies = geomjax.models.RigidBodies()
    bodies.add_body(1.0, (2.0, 3.0, 4.0))
    bodies.hinge(0, point=(0.0, 0.0, 0.0), direction=(0.0, 0.0, 1.0))
    system = bodies.system(gravity=9.81)
    x0 = bodies.state(angular_velocities=[[0.0, 0.0, 1.5]])
    sol = geomjax.integrate(geomjax.rattle(system), x0, dt=1e-2, steps=200, save_every=20)
    assert sol.ok and float(jnp.abs(jax.vmap(system.holonomic)(sol.xs[:, :12])).max()) < 1e-10
    for x in np.asarray(sol.xs):
        axes, rates = _frame_and_rates(system, x)
        np.testing.assert_allclose(0.5 * np.cross(axes, rates).sum(axis=0), [0.0, 0.0, 1.5], atol=1e-9)


def test_project_holonomic_moves_a_state_onto_the_constraint_set():
    """`geomjax.project_holonomic` (the start-check hint's remedy): onto S to round-off,
    a state already on S unchanged; a failed projection raises (eagerly) or gives NaN (jit);
    a system without holonomic constraints is refused with the right remedy."""
    model = geomjax.models.gyroscope()
    system = model.system
    off = model.x0 + 1e-3 * jnp.cos(jnp.arange(24.0))
    on = geomjax.project_holonomic(system, off)
    assert float(jnp.abs(system.constraint_residuals(on)).max()) < 1e-12
    np.testing.assert_allclose(geomjax.project_holonomic(system, model.x0), model.x0, atol=1e-14)
    far = model.x0.at[:12].set(0.0)  # every point at the origin: no rigid frame nearby along M⁻¹Gᵀ
    with pytest.raises(ValueError, match="did not converge"):
        geomjax.project_holonomic(system, far)
    assert bool(jnp.all(jnp.isnan(jax.jit(lambda x: geomjax.project_holonomic(system, x))(far))))
    with pytest.raises(TypeError, match="project_nonholonomic"):
        geomjax.project_holonomic(geomjax.models.knife_edge().system, geomjax.models.knife_edge().x0)


def test_second_order_neural_ode_builds_in_the_kinematics():
    net = geomjax.ConstrainedHamiltonianNetwork(4, lambda q: jnp.array([q @ q - 1.0]), space_dim=2, width_size=16,
                                                depth=2, key=jax.random.key(0))
    second = geomjax.NeuralODE.sized_like(net, order=2, key=jax.random.key(1))
    count, target = geomjax.parameter_count(second), geomjax.parameter_count(net)
    assert second.order == 2 and abs(count - target) <= 0.1 * target
    x = jnp.arange(8.0)
    np.testing.assert_array_equal(second(x)[:4], x[4:])
    with pytest.raises(ValueError, match="even length"):
        geomjax.NeuralODE(5, order=2, key=jax.random.key(0))


def test_gradient_through_project_holonomic_wrt_a_closed_over_length():
    """jax.jit(jax.grad) of a loss of the projected state w.r.t. a rod length the constraint
    closes over equals central differences (the Newton solves differentiate implicitly)."""
    base = geomjax.models.spatial_chain(2)
    n = 6

    def loss(length):
        g = lambda q: jnp.stack([q[:3] @ q[:3] - length**2, (q[3:] - q[:3]) @ (q[3:] - q[:3]) - 1.0])  # noqa: E731
        system = geomjax.System(base.system.hamiltonian, geomjax.canonical(n), holonomic=g)
        x = geomjax.project_holonomic(system, base.x0 + 0.01)
        return jnp.sum(jnp.sin(x))

    grad = float(jax.jit(jax.grad(loss))(1.2))
    fd = float((loss(1.2 + 1e-6) - loss(1.2 - 1e-6)) / 2e-6)
    assert abs(grad - fd) <= 1e-6 * max(abs(fd), 1.0)


@pytest.mark.extended  # 6 s: RATTLE's bordered block Cholesky on a tree, differentiated
def test_gradient_through_rattle_on_a_bordered_tree_wrt_closed_over_gravity():
    """jax.jit(jax.grad) through 5 RATTLE steps of a tree of 255 rods (its G M⁻¹Gᵀ solved with
    a border) w.r.t. gravity closed over by H equals central differences."""
    from geomjax._solve.block_cholesky import BlockCholeskyPlan

    model = geomjax.models.rod_tree(256)
    n = model.system.dim // 2
    base, con = model.system.hamiltonian, model.system.holonomic
    probe = geomjax.rattle(model.system)
    plan = probe._plan(model.x0[:n], model.x0[n:], 0.002)
    assert isinstance(plan, BlockCholeskyPlan) and plan.border > 0

    def loss(gravity):
        ham = lambda x: base(x) + (gravity - 9.81) * jnp.sum(x[2:n:3])  # noqa: E731  (z of every particle)
        step = geomjax.rattle(geomjax.System(ham, geomjax.canonical(n), holonomic=con))
        z, _ = jax.lax.scan(lambda z, _: (step.advance(0.0, z, 0.002, None)[0], None), step.split(model.x0),
                            None, length=5)
        return jnp.sum(jnp.sin(step.merge(z)))

    grad = float(jax.jit(jax.grad(loss))(9.81))
    fd = float((loss(9.81 + 1e-4) - loss(9.81 - 1e-4)) / 2e-4)
    assert abs(grad - fd) <= 1e-6 * abs(fd)
