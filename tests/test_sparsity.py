"""Structural sparsity from the jaxpr, and the block-tridiagonal Dirac path it enables."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax
from geomjax._field import derived
from geomjax.internal import simplify
from geomjax.internal.sparsity import bandwidth, greedy_coloring, jacobian_pattern
from geomjax.models import planar_chain


def _random_jacobian_support(fn, n, rng, samples=3):
    support = np.zeros((0, n), bool)
    for _ in range(samples):
        jac = np.asarray(jax.jacfwd(fn)(jnp.asarray(rng.normal(size=n)))) != 0
        support = jac if support.size == 0 else support | jac
    return support


def test_pattern_small_examples():
    np.testing.assert_array_equal(jacobian_pattern(lambda x: x[1:] * x[:-1], 3), [[1, 1, 0], [0, 1, 1]])
    # a constant sparse matrix keeps its zeros through dot_general
    mat = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 2.0]])
    np.testing.assert_array_equal(jacobian_pattern(lambda x: jnp.asarray(mat) @ x, 3), mat != 0)
    # multiplying by a constant zero removes the dependence
    np.testing.assert_array_equal(jacobian_pattern(lambda x: x * jnp.array([1.0, 0.0]), 2), np.eye(2) * [1, 0])
    # squeeze keeps entrywise dependence
    np.testing.assert_array_equal(jacobian_pattern(lambda x: x.reshape(2, 1)[:, 0] * 2.0, 2), np.eye(2))
    # shape operations, pads, reductions
    fn = lambda x: jnp.concatenate([jnp.pad(x[:2], (1, 0)), jnp.sum(x.reshape(2, 2), axis=0), x[::-1][:1]])
    np.testing.assert_array_equal(
        jacobian_pattern(fn, 4),
        [[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1], [0, 0, 0, 1]],
    )


def test_pattern_is_structural_not_sampled():
    """x0·x1 depends on x1 even where ∂/∂x1 happens to vanish (x0 = 0): the jaxpr says so."""
    fn = lambda x: jnp.stack([x[0] * x[1], x[2]])
    assert jacobian_pattern(fn, 3)[0, 1]
    assert not np.asarray(jax.jacfwd(fn)(jnp.array([0.0, 1.0, 1.0])))[0, 1] != 0


def test_unknown_primitive_is_dense():
    """sort is not given a rule: every output depends on every input it could."""
    pat = jacobian_pattern(lambda x: jnp.sort(x[:2]) * x[2], 4)
    np.testing.assert_array_equal(pat, [[1, 1, 1, 0], [1, 1, 1, 0]])


def test_pattern_inside_jit_and_control_flow():
    fn = lambda x: jax.lax.cond(x[0] > 0, lambda y: y[:2] * 2, lambda y: y[1:3], x)
    pat = jax.jit(lambda x: (x, jnp.asarray(jacobian_pattern(fn, 3))))(jnp.ones(3))[1]
    assert np.asarray(pat).all()  # cond is not entered: dense, which is sound


@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("holonomic", [True, False])
def test_chain_pattern_exact(n, holonomic, rng):
    system = planar_chain(n, holonomic=holonomic).system
    pat = jacobian_pattern(system.constraint_functions, system.dim)
    support = _random_jacobian_support(system.constraint_functions, system.dim, rng)
    assert not (support & ~pat).any()  # sound
    np.testing.assert_array_equal(pat, support)  # and exact for the chain
    assert pat.sum(axis=1).max() <= 8


@pytest.mark.parametrize("name", ["spherical_pendulum", "planar_pendulum"])
def test_pattern_sound_on_models(name, rng):
    system = getattr(geomjax.models, name)().system
    fn = system.constraint_functions
    pat = jacobian_pattern(fn, system.dim)
    assert not (_random_jacobian_support(fn, system.dim, rng) & ~pat).any()


def test_coloring_and_bandwidth():
    tri = np.eye(6, dtype=bool) | np.eye(6, k=1, dtype=bool) | np.eye(6, k=-1, dtype=bool)
    colors = greedy_coloring(tri)
    assert colors.max() + 1 == 3
    for c in range(3):
        cols = np.flatnonzero(colors == c)
        assert (tri[:, cols].sum(axis=1) <= 1).all()
    assert bandwidth(tri) == 1 and bandwidth(np.eye(3, dtype=bool)) == 0


@pytest.mark.parametrize("n", [2, 3])
def test_small_chains_keep_dense_path(n):
    """m ≤ 4 stays on the unrolled path; m = 6 has as many colours as links: dense."""
    model = planar_chain(n)
    z = model.system.structure.split(model.x0)
    assert isinstance(derived.constraint_data(model.system, z), derived.ConstraintData)


def test_dense_coupling_keeps_dense_path():
    """Three position constraints that all share q: A is dense, no block-tridiagonal plan."""
    n = 4
    g = lambda q: jnp.stack([q @ q - 1.0, q[0] + q[1] + q[2] + q[3], q[0] * q[3] - q[1]])
    system = geomjax.System(lambda x: 0.5 * x[n:] @ x[n:], geomjax.canonical(n), holonomic=g)
    z = system.structure.split(jnp.arange(1.0, 2 * n + 1))
    assert derived.block_tridiagonal_plan(system, z, 6) is None


def _dense_reference(fn, *args):
    original = derived.block_tridiagonal_plan
    derived.block_tridiagonal_plan = lambda *a: None
    try:
        return fn(*args)
    finally:
        derived.block_tridiagonal_plan = original


@pytest.mark.parametrize(("n", "holonomic"), [(4, True), (4, False), pytest.param(8, True, marks=pytest.mark.extended)])
def test_sparse_path_matches_dense(n, holonomic, rng):
    model = planar_chain(n, holonomic=holonomic, mass=1.3, length=0.7, gravity=2.0)
    system = model.system
    x = model.x0 + 1e-2 * jnp.asarray(rng.normal(size=model.x0.shape))
    z = system.structure.split(x)
    assert isinstance(derived.constraint_data(system, z), derived.SparseConstraintData)
    dirac = geomjax.dirac_field(system)
    feedback = geomjax.feedback_field(system, model.x0, gains=10.0)
    for field in (dirac, feedback):
        fast = jax.jit(lambda y: field(y))(x)
        slow = _dense_reference(jax.jit(lambda y: field(y)), x)
        np.testing.assert_allclose(fast, slow, rtol=0, atol=1e-12 * float(jnp.max(jnp.abs(slow))))
    np.testing.assert_allclose(
        geomjax.constraint_matrix(system, x), _dense_reference(geomjax.constraint_matrix, system, x), atol=1e-13
    )
    # the field keeps f and H: Df·X = 0 and ∇H·X = 0
    xdot = dirac(x)
    _, df_x = jax.jvp(system.constraint_functions, (x,), (xdot,))
    assert float(jnp.max(jnp.abs(df_x))) < 1e-11


def test_looped_coloured_products_match_the_dense_path(rng, monkeypatch):
    """Large states take the coloured products one colour at a time (`lax.map`): from
    N = 24 links on a chain (3 colours × 96 entries), not at N = 16 (3 × 64). Forced here on
    a 4-link chain: the field under `vmap` and its jvp agree with the dense path."""
    assert 3 * 64 < derived._LOOPED_PRODUCTS_MIN <= 3 * 96
    model = planar_chain(4, holonomic=False, mass=1.3, length=0.7, gravity=2.0)
    plan = lambda: derived.block_tridiagonal_plan(model.system, model.system.structure.split(model.x0), 8)
    assert not plan().looped
    monkeypatch.setattr(derived, "_LOOPED_PRODUCTS_MIN", 0)
    assert plan().looped
    dirac = simplify.unsimplified(geomjax.dirac_field(model.system))  # as for large states: no scalar graph
    xs = model.x0 + 1e-2 * jnp.asarray(rng.normal(size=(2, *model.x0.shape)))
    tangent = jnp.asarray(rng.normal(size=model.x0.shape))
    both = lambda ys: (jax.vmap(dirac)(ys), jax.jvp(dirac, (ys[0],), (tangent,))[1])
    fast = jax.jit(both)(xs)
    slow = _dense_reference(jax.jit(both), xs)
    assert "scan" in str(jax.make_jaxpr(dirac)(xs[0]))  # the loop itself
    for a, b in zip(fast, slow):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12 * float(jnp.max(jnp.abs(b))))


def test_long_chain_field_keeps_constraints_and_energy(rng):
    """n = 16 (32 constraints) on the sparse path, checked without the dense path (whose
    compile time is what the sparse path avoids): Df·X = 0 and ∇H·X = 0 at a perturbed state."""
    model = planar_chain(16, holonomic=False, mass=1.3, length=0.7, gravity=2.0)
    system = model.system
    x = model.x0 + 1e-2 * jnp.asarray(rng.normal(size=model.x0.shape))
    assert isinstance(derived.constraint_data(system, system.structure.split(x)), derived.SparseConstraintData)
    xdot = jax.jit(geomjax.dirac_field(system))(x)
    _, df_x = jax.jvp(system.constraint_functions, (x,), (xdot,))
    _, dh_x = jax.jvp(system.hamiltonian, (x,), (xdot,))
    scale = float(jnp.max(jnp.abs(xdot)))
    assert float(jnp.max(jnp.abs(df_x))) < 1e-11 * scale
    assert abs(float(dh_x)) < 1e-11 * scale


def test_sparse_path_under_vmap_and_grad(rng):
    model = planar_chain(4)
    system = model.system
    xs = model.x0 + 1e-2 * jnp.asarray(rng.normal(size=(3,) + model.x0.shape))
    field = geomjax.dirac_field(system)
    np.testing.assert_allclose(jax.vmap(field)(xs), _dense_reference(jax.vmap(field), xs), atol=1e-12)
    loss = lambda y: jnp.sum(field(y) ** 2)
    np.testing.assert_allclose(jax.grad(loss)(xs[0]), _dense_reference(jax.grad(loss), xs[0]), rtol=1e-9, atol=1e-10)


def test_integrate_chain_sparse():
    """geomjax.integrate on the sparse path against RK4 written out on the dense-path field."""
    model = planar_chain(8)
    field = geomjax.dirac_field(model.system)
    h, steps = 1e-3, 20
    sol = geomjax.integrate(field, model.x0, dt=h, steps=steps, method="rk4", save_every=steps)

    def rk4_step(_, x):
        k1 = field(x)
        k2 = field(x + 0.5 * h * k1)
        k3 = field(x + 0.5 * h * k2)
        k4 = field(x + h * k3)
        return x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)

    def rk4(x):  # a loop, not unrolled: one step to compile
        return jax.lax.fori_loop(0, steps, rk4_step, x)

    ref = _dense_reference(jax.jit(lambda x: rk4(x)), model.x0)
    np.testing.assert_allclose(sol.xs[-1], ref, atol=1e-12)
