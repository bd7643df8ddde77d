"""Constrained Hamiltonian networks: the learned mass matrix, the network's Dirac field,
gradients of rollout losses, a short training run, RATTLE and RK4 rollouts, the
neural-ODE baseline and the spatial chain.

Cheap by design (tiny networks, a pendulum, a few steps): the compiled programs are
built once per module and shared by the tests. Larger runs are `extended`.
"""

import equinox as eqx
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import geomjax
from geomjax._learning.networks import trainable_filter


@pytest.fixture(scope="module")
def pendulum_data():
    """Ten pendulum trajectories of 12 observations (dt = 0.1): 6 to train on, 4 held out."""
    data = geomjax.chain_trajectories(1, 10, steps=12, dt=0.1, substeps=10, key=jax.random.key(0))
    return data.split(6)


def _network(constraints, n=2, key=1, **kwargs):
    kwargs = {"width_size": 8, "depth": 1, **kwargs}
    return geomjax.ConstrainedHamiltonianNetwork(n, constraints, key=jax.random.key(key), **kwargs)


@pytest.fixture(scope="module")
def trained(pendulum_data):
    """(untrained, trained network, history): RK4 rollouts of chunks of 3 observations, MSE,
    all 24 chunks in one minibatch."""
    train, _ = pendulum_data
    net = _network(train.constraints, width_size=16)
    model, history = geomjax.train(
        net,
        train,
        chunk_length=3,
        epochs=40,
        batch_size=100,
        loss="mse",
        key=jax.random.key(2),
        optimizer=optax.adam(2e-2),
    )
    return net, model, history


def test_mass_matrix_is_spd_for_any_raw_parameters():
    pendulum = geomjax.models.planar_pendulum(holonomic=True)
    net = _network(pendulum.system.holonomic, n=6, space_dim=2)  # 3 bodies in the plane: M = (LLᵀ) ⊗ I₂
    mass_of = jax.jit(lambda raw: eqx.tree_at(lambda m: m.mass_factor, net, raw).mass_matrix())
    assert np.allclose(mass_of(net.mass_factor), np.eye(6))
    factor_of = jax.jit(lambda raw: eqx.tree_at(lambda m: m.mass_factor, net, raw).factor())
    rng = np.random.default_rng(0)
    momenta = rng.normal(size=(50, 3, 2))
    for scale in (0.1, 1.0, 3.0, 30.0, 300.0):
        raw = scale * rng.normal(size=net.mass_factor.shape)
        mass = np.asarray(mass_of(raw))
        assert np.array_equal(mass, mass.T)
        assert mass[0, 1] == 0.0  # x and y of a body never mix
        # positive definite by construction: L has a positive diagonal, and H's kinetic
        # term ½|L⁻¹p|² is positive for every p ≠ 0 (the potential is the same for all p)
        lower = np.asarray(factor_of(raw))
        assert np.diagonal(lower).min() >= 1e-4 and np.array_equal(lower, np.tril(lower))
        energies = 0.5 * np.sum(np.linalg.solve(lower, momenta) ** 2, axis=(1, 2))
        assert energies.min() > 0, scale
        if scale <= 3.0:  # and so in floating point while L is well conditioned
            assert np.linalg.eigvalsh(mass).min() > 0, scale
            np.linalg.cholesky(mass)


def test_dirac_field_of_a_network_keeps_the_constraints(pendulum_data):
    """d/dt Φ = DΦ·X = 0 along the network's Dirac field, Φ = (g, Dg·∂H/∂p), and dH/dt = 0."""
    train, _ = pendulum_data
    net = _network(train.constraints, key=3, width_size=4, hamiltonian="mlp", observed="momentum")
    system = net.system()
    field = geomjax.dirac_field(system)
    states = train.xs[:, ::4].reshape(-1, 4) * jnp.array([1.0, 1.0, 0.7, 1.3])  # off S too: Φ is kept anyway

    @jax.jit
    def rates(x):
        v = field(x)
        return jax.jvp(system.constraint_functions, (x,), (v,))[1], jax.jvp(system.hamiltonian, (x,), (v,))[1], v

    dphi, dh, v = jax.vmap(rates)(states)
    scale = jnp.abs(v).max()
    assert float(jnp.abs(dphi).max()) < 1e-12 * float(scale)
    assert float(jnp.abs(dh).max()) < 1e-12 * float(scale)


@pytest.mark.parametrize("method", ["rk4", "rattle"])
def test_rollout_loss_gradient_matches_finite_differences(pendulum_data, method):
    train, _ = pendulum_data
    net = _network(train.constraints, key=4, width_size=4)
    params, static = eqx.partition(net, trainable_filter(net))
    chunks = train.chunks(3)[:2]
    loss = jax.jit(
        jax.value_and_grad(lambda p: geomjax.rollout_loss(eqx.combine(p, static), chunks, train.dt, method, loss="mse"))
    )
    _, grad = loss(params)
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    direction = jax.random.normal(jax.random.key(5), flat.shape)
    eps = 1e-6
    plus, _ = loss(unravel(flat + eps * direction))
    minus, _ = loss(unravel(flat - eps * direction))
    fd = (plus - minus) / (2 * eps)
    exact = jnp.vdot(jax.flatten_util.ravel_pytree(grad)[0], direction)
    assert abs(float(exact - fd)) < 1e-6 * abs(float(exact)) + 1e-10, (float(exact), float(fd))


def test_training_lowers_the_loss_and_learns_the_dynamics(pendulum_data, trained):
    _, held_out = pendulum_data
    net, model, history = trained
    loss = history["loss"]
    assert loss.shape == (40,) and history["skipped"].sum() == 0
    assert loss[-1] < loss[0] / 50, (loss[0], loss[-1])
    # on held-out trajectories the learned dynamics predict 10× better than the untrained ones
    # (measured: 0.35 before, 0.011 after: the geometric mean of the relative state error)
    before = geomjax.rollout_error(net, held_out, steps=6)
    after = geomjax.rollout_error(model, held_out, steps=6)
    assert after < before / 10, (before, after)


def test_chunks_whose_rattle_step_fails_are_left_out_of_the_loss(pendulum_data):
    """A chunk RATTLE cannot step (here one whose velocity carries the bob further than the
    rod's length in one step, h|v| > ℓ: no multiplier puts it back on the circle) is left
    out of its minibatch's loss and counted; the other chunks still train the network (one
    failed chunk used to make every step's gradient NaN, and no step was taken)."""
    train, _ = pendulum_data
    chunks = np.array(train.chunks(3)[:8])
    chunks[3, :, 2:] *= 60.0  # |v| ~ 60 at h = 0.1
    net = _network(train.constraints)
    with pytest.warns(RuntimeWarning, match=r"left 10 of 80 chunk predictions out .* skipped 0 of 10 steps"):
        _, history = geomjax.train(net, chunks, dt=train.dt, chunk_length=3, method="rattle", epochs=10, batch_size=8, loss="mse",
                                   key=jax.random.key(2), optimizer=optax.adam(2e-2))
    assert history["failed_chunks"].tolist() == [1] * 10 and history["skipped"].sum() == 0
    # (measured: 0.171 -> 0.099; with every step skipped it would stay where it started)
    assert np.all(np.isfinite(history["loss"])) and history["loss"][-1] < 0.7 * history["loss"][0], history["loss"]


def test_rattle_keeps_the_constraints_where_rk4_drifts(pendulum_data, trained):
    train, _ = pendulum_data
    _, model, _ = trained
    circle = jax.vmap(train.constraints)
    x0 = train.xs[0, 0]
    rattle = geomjax.rollout(model, x0, 200, 0.1, "rattle")
    rk4 = geomjax.rollout(model, x0, 200, 0.1, "rk4")
    assert float(jnp.abs(circle(rattle[:, :2])).max()) < 1e-12
    drift = jnp.abs(circle(rk4[:, :2]))[:, 0]
    assert float(drift[-1]) > 1e-8 and float(drift[-1]) > 100 * float(drift[1])


@pytest.mark.parametrize(
    "links, space_dim, width, depth", [(1, 2, 16, 1), (2, 2, 32, 2), (5, 2, 256, 3), (3, 3, 64, 3)]
)
def test_neural_ode_has_the_size_of_the_network(links, space_dim, width, depth):
    def chain_constraints(q):  # a chain's links (only n matters for the sizes)
        d = jnp.diff(q.reshape(-1, space_dim), axis=0, prepend=jnp.zeros((1, space_dim)))
        return 0.5 * (jnp.sum(d * d, axis=1) - 1.0)

    def build():  # shapes only (equinox.filter_eval_shape): no weights are drawn
        net = geomjax.ConstrainedHamiltonianNetwork(
            links * space_dim,
            chain_constraints,
            space_dim=space_dim,
            width_size=width,
            depth=depth,
            key=jax.random.key(0),
        )
        return net, geomjax.NeuralODE.sized_like(net, key=jax.random.key(6))

    net, node = eqx.filter_eval_shape(build)
    count, target = geomjax.parameter_count(node), geomjax.parameter_count(net)
    assert abs(count - target) <= 0.1 * target, (count, target)
    assert node.dim == 2 * net.n and len(node.network.layers) == depth + 1


@pytest.mark.extended
def test_neural_ode_trains(pendulum_data):
    train, held_out = pendulum_data
    node = geomjax.NeuralODE(4, width_size=16, depth=2, key=jax.random.key(6))
    trained, history = geomjax.train(
        node,
        train,
        chunk_length=3,
        epochs=200,
        batch_size=100,
        loss="mse",
        optimizer=optax.adam(1e-2),
        key=jax.random.key(7),
    )
    assert history["loss"][-1] < history["loss"][0] / 10
    assert geomjax.rollout_error(trained, held_out, steps=6) < geomjax.rollout_error(node, held_out, steps=6)


def test_wrong_methods_are_refused(pendulum_data):
    train, _ = pendulum_data
    general = _network(train.constraints, hamiltonian="mlp", observed="momentum")
    with pytest.raises(ValueError, match="rattle.*needs H = ½pᵀM⁻¹p"):
        geomjax.rollout(general, train.xs[0, 0], 2, 0.1, "rattle")
    node = geomjax.NeuralODE(4, width_size=4, depth=1, key=jax.random.key(0))
    with pytest.raises(ValueError, match="needs a constrained Hamiltonian network"):
        geomjax.rollout(node, train.xs[0, 0], 2, 0.1, "rattle")
    with pytest.raises(ValueError, match="needs observed='momentum'"):
        _network(train.constraints, hamiltonian="mlp")
    with pytest.raises(ValueError, match="method must be"):
        geomjax.rollout(general, train.xs[0, 0], 2, 0.1, "rk5")


def test_relative_error_is_theirs():
    """‖x̂ − x‖/‖x̂ + x‖, the norm of the sum in the denominator."""
    a, b = jnp.array([3.0, 0.0]), jnp.array([1.0, 0.0])
    assert float(geomjax.relative_error(a, b)) == pytest.approx(0.5)


def test_spatial_chain_of_one_link_is_the_spherical_pendulum():
    one = geomjax.models.spatial_chain(1, holonomic=False)
    sphere = geomjax.models.spherical_pendulum()
    x = one.x0
    assert x.shape == (6,) and abs(float(x[:3] @ x[:3]) - 1.0) < 1e-15 and abs(float(x[:3] @ x[3:])) < 1e-15
    assert float(one.system.hamiltonian(x)) == pytest.approx(float(sphere.system.hamiltonian(x)), rel=1e-14)


@pytest.mark.extended
def test_spatial_chain_data_and_feedback_training():
    data = geomjax.chain_trajectories(2, 6, steps=12, space_dim=3, key=jax.random.key(0))
    g = jax.vmap(jax.vmap(data.constraints))(data.xs[..., :6])
    assert float(jnp.abs(g).max()) < 1e-9
    net = _network(data.constraints, n=6, space_dim=3, width_size=16)
    model, history = geomjax.train(net, data, method="feedback", epochs=20, batch_size=12, key=jax.random.key(1))
    assert history["loss"][-1] < history["loss"][0]
    rattle = geomjax.rollout(model, data.xs[0, 0], 100, data.dt, "rattle")
    assert float(jnp.abs(jax.vmap(data.constraints)(rattle[:, :6])).max()) < 1e-12


def test_rollout_error_gives_both_measures_of_the_paper():
    """denominator="norms" and aggregate="arithmetic" against a hand computation."""
    data = geomjax.chain_trajectories(1, 3, steps=6, key=jax.random.key(0))
    net = geomjax.ConstrainedHamiltonianNetwork(2, data.constraints, width_size=4, depth=1, key=jax.random.key(1))
    _, rel = geomjax.rollout_error(net, data, errors=True)
    predicted = jax.vmap(lambda x: geomjax.rollout(net, x, 6, data.dt))(data.xs[:, 0])
    xs, pr = np.asarray(data.xs), np.asarray(predicted)
    norms = np.linalg.norm(pr - xs, axis=-1) / (np.linalg.norm(pr, axis=-1) + np.linalg.norm(xs, axis=-1))
    expected = np.mean(np.exp(np.mean(np.log(norms[:, 1:]), axis=1)))
    got = geomjax.rollout_error(net, data, denominator="norms", aggregate="arithmetic")
    assert abs(got - expected) <= 1e-12 * expected
    np.testing.assert_allclose(rel, np.linalg.norm(pr - xs, axis=-1) / np.linalg.norm(pr + xs, axis=-1), rtol=1e-12)
    with pytest.raises(ValueError, match="aggregate must be one of"):
        geomjax.rollout_error(net, data, aggregate="median")


def test_planar_chain_angles_round_trip():
    """The learning experiment's angle coordinates of a planar chain (the paper's baseline):
    Cartesian (q, q̇) → (θ, θ̇) → (q, q̇) exactly, angles unwrapped along time (a link turning
    past ±π does not jump by 2π)."""
    from types import SimpleNamespace

    from geomjax.experiments.learn_chain import _planar_angles
    from geomjax.models._chain import _chain_state

    params = {"length": jnp.asarray(1.0), "m": jnp.asarray(1.0)}
    t = jnp.linspace(0.0, 2.0, 9)
    thetas = jnp.stack([2.0 * t + 2.5, 0.3 * jnp.sin(t)], axis=1)  # link 1 turns past π
    rates = jnp.stack([jnp.full_like(t, 2.0), 0.3 * jnp.cos(t)], axis=1)
    xs = jax.vmap(lambda a, r: _chain_state(params, a, r))(thetas, rates)[None]  # (1, 9, 8): m = 1, p = q̇
    to_angles, to_cartesian = _planar_angles(SimpleNamespace(n=4, xs=xs))
    angles = to_angles(xs)
    np.testing.assert_allclose(angles[0, :, :2], thetas, atol=1e-12)
    np.testing.assert_allclose(angles[0, :, 2:], rates, atol=1e-12)
    np.testing.assert_allclose(to_cartesian(angles), xs, atol=1e-12)


def test_early_stopping_on_held_out_chunks_returns_the_best_epoch():
    """`train(validation=, patience=)`: the held-out rollout loss after every epoch, the model
    of the epoch where it was lowest, and a stop after `patience` epochs without a new
    lowest. Gradient ascent makes every epoch worse than the first: training stops after
    1 + patience epochs and returns the first epoch's model."""
    import optax

    data = geomjax.chain_trajectories(1, 6, steps=4, key=jax.random.key(0))
    train_set, held = data.split(4)
    net = geomjax.ConstrainedHamiltonianNetwork(2, data.constraints, width_size=4, depth=1, key=jax.random.key(1))
    common = dict(chunk_length=2, loss="mse", key=jax.random.key(2), validation=held)
    worse, history = geomjax.train(net, train_set, epochs=10, optimizer=optax.sgd(-0.05), patience=2, **common)
    assert len(history["loss"]) == 3 and history["best_epoch"] == 0
    chunks = held.xs[:, :4].reshape(held.xs.shape[0] * 2, 2, -1)
    np.testing.assert_allclose(float(geomjax.rollout_loss(worse, chunks, data.dt, loss="mse")), history["validation"][0],
                               rtol=1e-12)
    with pytest.raises(ValueError, match="validation="):
        geomjax.train(net, train_set, epochs=2, patience=1, key=jax.random.key(2))


@pytest.mark.extended  # 4 s of another training's compilation; the mechanism is checked above
def test_early_stopping_lets_a_descent_run_to_its_end():
    import optax

    data = geomjax.chain_trajectories(1, 6, steps=4, key=jax.random.key(0))
    train_set, held = data.split(4)
    net = geomjax.ConstrainedHamiltonianNetwork(2, data.constraints, width_size=4, depth=1, key=jax.random.key(1))
    _, history = geomjax.train(net, train_set, chunk_length=2, loss="mse", key=jax.random.key(2), validation=held,
                               epochs=12, optimizer=optax.adam(0.05))
    assert len(history["validation"]) == 12 and history["validation"][history["best_epoch"]] < history["validation"][0]
