"""Large sparse constraint graphs: sparsity through gathers, matrix-free RATTLE, the rod models."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax
from geomjax._solve.banded import TridiagonalJacobian
from geomjax._solve.block_cholesky import BlockCholeskyPlan
from geomjax._solve.krylov import GramPlan, pcg, spd_solve
from geomjax._status import RESULTS
from geomjax._step import rattle as rattle_module
from geomjax.internal.sparsity import jacobian_sparsity
from geomjax.models._rod_networks import RodConstraints, _Indices
from test_sparsity import _random_jacobian_support as _support

H = 0.005




def _positions(model):
    return model.x0[: model.system.dim // 2]


# --------------------------------------------------------------------------- sparsity
@pytest.mark.parametrize("name", ["cloth", "rod_tree", "rod_ring", "water_box"])
def test_edge_list_constraints_have_exact_sparse_patterns(name, rng):
    """q[E[:, 0]] − q[E[:, 1]] (gathers) and its reverse pass (scatter-adds) read as sparse."""
    model = getattr(geomjax.models, name)(3 if name != "rod_tree" else 12)
    g, n = model.system.holonomic, model.system.dim // 2
    pattern = jacobian_sparsity(g, n)
    np.testing.assert_array_equal(pattern.dense(), _support(g, n, rng))
    assert pattern.count().max() <= 6  # two particles in 3-D
    q = jnp.asarray(rng.normal(size=n))  # a generic point (at the start some coordinates vanish)
    m = g(q).shape[0]
    transpose = jacobian_sparsity(lambda lam: jax.vjp(g, q)[1](lam)[0], m)  # scatter-add
    np.testing.assert_array_equal(transpose.dense(), pattern.dense().T)


def test_pattern_rules_for_indexing_are_sound(rng):
    idx = np.array([3, 0, 3, 1])
    cases = [
        (lambda x: x[idx] * x[jnp.array([1, 1, 2, 0])], 4),
        (lambda x: jnp.zeros(5).at[idx].add(x[:4] ** 2), 6),
        (lambda x: jax.lax.dynamic_slice(x, (2,), (3,)) * 2.0, 6),
        (lambda x: jax.lax.dynamic_update_slice(x, x[:2] ** 2, (3,)), 6),
        (lambda x: jnp.pad(x.reshape(2, 3), ((1, 0), (0, 2)))[::-1].T.ravel(), 6),
        (lambda x: jnp.zeros(4).at[jnp.array([0, 9])].set(x[:2], mode="drop"), 4),
    ]
    for fn, n in cases:
        pat = jacobian_sparsity(fn, n).dense()
        support = _support(fn, n, rng)
        assert not (support & ~pat).any()  # sound
        np.testing.assert_array_equal(pat, support)  # and exact for these


def test_gather_with_traced_indices_is_dense():
    def fn(x):
        i = jnp.argmax(x).astype(jnp.int32)  # an index the analysis cannot know
        return x[jnp.stack([i, 0])] * 1.0

    assert jacobian_sparsity(fn, 4).dense()[0].all()


def test_large_patterns_take_memory_of_their_nonzeros():
    model = geomjax.models.cloth(60)  # 7080 rods + 4 pin rows over 7200 coordinates
    pattern = jacobian_sparsity(model.system.holonomic, model.system.dim // 2)
    assert pattern.idx.shape == (7084, 4) and not pattern.full.any()


# --------------------------------------------------------------------------- Krylov pieces
def test_pcg_and_spd_solve_against_dense(rng):
    a = rng.normal(size=(30, 30))
    a = a @ a.T + 30 * np.eye(30)
    b = rng.normal(size=30)
    apply = lambda v: jnp.asarray(a) @ v
    x, ok, _ = pcg(apply, jnp.asarray(b), jnp.asarray(1 / np.diag(a)), rtol=1e-14)
    assert ok and np.allclose(x, np.linalg.solve(a, b), rtol=1e-12, atol=1e-14)
    # implicit derivatives of the solve, w.r.t. the right-hand side and the matrix
    loss = lambda s: jnp.sum(spd_solve(lambda v: (jnp.asarray(a) + s * jnp.eye(30)) @ v, jnp.asarray(b) * s,
                                        jnp.ones(30) / 30)[0] ** 2)
    grad = jax.grad(loss)(1.0)
    eps = 1e-6
    assert abs(grad - (loss(1.0 + eps) - loss(1.0 - eps)) / (2 * eps)) < 1e-6 * abs(grad)


def test_pcg_reports_a_singular_inconsistent_system():
    a = jnp.asarray(np.diag([1.0, 2.0, 0.0]) + np.diag([0.0, 0.0], 1) + np.diag([0.0, 0.0], -1))
    x, ok, steps = pcg(lambda v: a @ v, jnp.array([1.0, 1.0, 1.0]), jnp.ones(3), rtol=1e-12)
    assert not bool(ok)


# --------------------------------------------------------------------------- RATTLE
def _sparse_and_dense(model, steps):
    out = []
    for structured in ("krylov", "banded", False):
        step = geomjax.rattle(model.system, structured=structured)

        def run(x, step=step):
            def body(z, _):
                z, status = step.advance(0.0, z, H, None)
                return z, status._value

            z, codes = jax.lax.scan(body, step.split(x), None, length=steps)
            return step.merge(z), codes

        out.append(jax.jit(run))
    return out


def _random_sparse_model(seed=3):
    """Rods on a random sparse graph in the plane (a grid with random diagonals)."""
    base = geomjax.models.cloth(4)
    con = base.system.holonomic
    rng = np.random.default_rng(seed)
    # two diagonal braces in one column of cells: each fixes one angle between the top row's
    # rods and a column's, so the constraints stay independent (a cycle of braces would not)
    col, rows = rng.integers(3), rng.choice(3, size=2, replace=False)
    extra = np.array([[4 * r + col, 4 * (r + 1) + col + 1] for r in rows])
    pts = np.asarray(_positions(base)).reshape(-1, 2)
    lengths = np.linalg.norm(pts[extra[:, 0]] - pts[extra[:, 1]], axis=1)
    new = RodConstraints(jnp.concatenate([con.lengths, jnp.asarray(lengths)]), con.anchors,
                         _Indices(np.concatenate([con.edges.array, extra])), con.pins, 2)
    system = geomjax.System(base.system.hamiltonian, geomjax.canonical(32), holonomic=new)
    return geomjax.models.Model("random", system, base.params, base.x0, ())


# the ring and the molecules in the extended job (3 s each): the same Krylov and block paths as
# the cloth, the tree and the random graph, on other shapes of graph
@pytest.mark.parametrize("name", ["cloth", "rod_tree", pytest.param("rod_ring", marks=pytest.mark.extended),
                                  pytest.param("water_box", marks=pytest.mark.extended), "random"])
def test_matrix_free_rattle_matches_dense(name):
    model = {"cloth": lambda: geomjax.models.cloth(4), "rod_tree": lambda: geomjax.models.rod_tree(20),
             "rod_ring": lambda: geomjax.models.rod_ring(20), "water_box": lambda: geomjax.models.water_box(2),
             "random": _random_sparse_model}[name]()
    sparse, banded, dense = _sparse_and_dense(model, 40)
    xs, codes_s = sparse(model.x0)
    xb, codes_b = banded(model.x0)
    xd, codes_d = dense(model.x0)
    assert not np.any(codes_s) and not np.any(codes_b) and not np.any(codes_d)
    assert float(jnp.max(jnp.abs(xs - model.x0))) > 1e-3  # it moved
    np.testing.assert_allclose(xs, xd, rtol=0, atol=1e-12)
    np.testing.assert_allclose(xb, xd, rtol=0, atol=1e-12)
    n = model.system.dim // 2
    g = model.system.holonomic
    assert float(jnp.max(jnp.abs(g(xs[:n])))) < 1e-13
    assert float(jnp.max(jnp.abs(jax.jvp(g, (xs[:n],), (xs[n:] * model.system.hamiltonian.inverse_mass.repeat(
        n // model.system.hamiltonian.inverse_mass.shape[0]),))[1]))) < 1e-12
    # under vmap: two starts, the second a few steps on
    if name != "cloth":  # under vmap: one graph is enough (the same programs batched)
        return
    batch = jnp.stack([model.x0, xs])
    for run, alone in ((sparse, xs), (banded, xb)):
        ys, codes = jax.vmap(run)(batch)
        assert not np.any(codes)
        np.testing.assert_allclose(ys[0], alone, atol=1e-13)


def test_which_plan_each_graph_gets():
    def plan(model, structured=True):
        step = geomjax.rattle(model.system, structured=structured)
        q, p = step.split(model.x0)
        return step._plan(q, p, H)

    cloth = plan(geomjax.models.cloth(5))  # 44 constraints
    assert isinstance(cloth, BlockCholeskyPlan) and cloth.bandwidth <= 10  # RCM: a band of ~2n
    assert plan(geomjax.models.cloth(4)) is None  # 28 constraints: dense is faster
    ring = plan(geomjax.models.rod_ring(40))
    assert isinstance(ring, BlockCholeskyPlan) and ring.bandwidth <= 6  # a band whatever the length
    assert isinstance(plan(geomjax.models.cloth(4), "krylov"), GramPlan)
    assert isinstance(plan(geomjax.models.planar_chain(20)), TridiagonalJacobian)
    assert plan(geomjax.models.rod_tree(8)) is None  # 10 constraints: dense
    with pytest.raises(ValueError, match="structured must be"):
        geomjax.rattle(geomjax.models.cloth(4).system, structured="sparse")


def test_block_plan_solves_against_dense(rng):
    """RCM-ordered block Cholesky on the Gram matrices of each graph kind, and on a random
    sparse SPD matrix, against a dense solve."""
    graphs = [geomjax.models.cloth(5), geomjax.models.rod_ring(30)]
    for model in graphs:
        g = model.system.holonomic
        q = _positions(model)
        m = g(q).shape[0]
        gram = lambda v, q=q, g=g: jax.jvp(g, (q,), (jax.vjp(g, q)[1](v)[0],))[1]
        plan = BlockCholeskyPlan.of(gram, m)
        dense = np.asarray(jax.vmap(gram)(jnp.eye(m)))
        b = jnp.asarray(rng.normal(size=m))
        x = jax.jit(lambda b, plan=plan, gram=gram: plan.solve(plan.factor(gram, b.dtype), b))(b)
        np.testing.assert_allclose(x, np.linalg.solve(dense, b), rtol=1e-12, atol=1e-12)
    mask = rng.random((60, 60)) < 0.05
    a = np.where(mask | mask.T, rng.normal(size=(60, 60)), 0.0)
    a = a + a.T + 20 * np.eye(60)
    apply = lambda v: jnp.asarray(a) @ v
    plan = BlockCholeskyPlan.of(apply, 60)
    b = rng.normal(size=60)
    np.testing.assert_allclose(plan.solve(plan.factor(apply, jnp.float64), jnp.asarray(b)), np.linalg.solve(a, b),
                               rtol=1e-12, atol=1e-13)


def test_block_plan_with_a_hub_solves_by_a_border(rng):
    """A hub joined to one corner of each of 12 strips (20 × 3 grids), the corners and the
    hub a clique, as the rods at a pinned root: the plan takes the hub's neighbourhood out
    as a border, narrows the band of the rest (RCM alone: 33), and its solves (jit, vmap,
    grad) agree with the dense ones."""
    legs, length, width = 12, 20, 3
    per = length * width
    m = 1 + legs * per
    a = np.zeros((m, m))
    for leg in range(legs):
        cell = 1 + leg * per + np.arange(per).reshape(length, width)
        a[cell[:, :-1], cell[:, 1:]] = -rng.random((length, width - 1))
        a[cell[:-1], cell[1:]] = -rng.random((length - 1, width))
    clique = np.concatenate([[0], 1 + per * np.arange(legs)])
    a[np.ix_(clique, clique)] = -0.05 * rng.random((legs + 1, legs + 1))
    np.fill_diagonal(a, 0.0)
    a = a + a.T
    a += np.diag(np.abs(a).sum(axis=1) + 0.5)
    apply = lambda v: jnp.asarray(a) @ v  # noqa: E731
    plan = BlockCholeskyPlan.of(apply, m)
    assert plan.border == legs + 3 and plan.bandwidth <= 4  # the hub's clique and a corner's strip neighbours
    solve = jax.jit(lambda b: plan.solve(plan.factor(apply, jnp.float64), b))
    b = rng.normal(size=(3, m))
    np.testing.assert_allclose(jax.vmap(solve)(jnp.asarray(b)), np.linalg.solve(a, b.T).T, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(plan.inverse_diagonal(plan.factor(apply, jnp.float64)), 1.0 / np.diag(a), rtol=1e-15)
    # the gradient of a loss through the solve, w.r.t. a scale of the matrix
    loss = lambda c: jnp.sum(jnp.sin(plan.solve(plan.factor(lambda v: c * apply(v), jnp.float64), jnp.asarray(b[0]))))
    exact = lambda c: np.sum(np.sin(np.linalg.solve(c * a, b[0])))
    fd = (exact(1.3 + 1e-6) - exact(1.3 - 1e-6)) / 2e-6
    assert abs(float(jax.jit(jax.grad(loss))(1.3)) - fd) <= 1e-7 * abs(fd)


def test_tree_dirac_field_with_a_border_matches_the_dense_field():
    """A tree of 255 rods hung from a pinned particle: its A = G M⁻¹Gᵀ is solved with the
    rods at the root as a border, and the field agrees with the dense Dirac field."""
    from geomjax._field.derived import GramDiracPlan, block_tridiagonal_plan, dense_constraint_data, dirac_vector

    model = geomjax.models.rod_tree(256)
    system = model.system
    z = system.structure.split(model.x0)
    plan = block_tridiagonal_plan(system, z, 2 * (256 - 1 + 3))
    assert isinstance(plan, GramDiracPlan) and isinstance(plan.gram, BlockCholeskyPlan) and plan.gram.border > 0
    x = model.x0 + 0.01 * jnp.cos(jnp.arange(system.dim))  # off the constraint set too
    sparse = jax.jit(lambda x: geomjax.dirac_field(system)(x))(x)
    dense = jax.jit(lambda x: system.structure.merge(dirac_vector(dense_constraint_data(system, system.structure.split(x)))))(x)
    np.testing.assert_allclose(sparse, dense, rtol=1e-10, atol=1e-10)


# the banded variant in the extended job (7 s): its derivatives are checked forward, reverse and batched by
# test_step_jacobians_forward_reverse_and_batched_agree[banded]
@pytest.mark.parametrize("structured", ["krylov", pytest.param("banded", marks=pytest.mark.extended)])
def test_gradient_through_sparse_rattle_matches_central_differences(structured):
    """d/dg of a loss after 50 steps of a 4 × 4 cloth, g closed over by H (jit of grad)."""
    model = geomjax.models.cloth(4)
    base, con = model.system.hamiltonian, model.system.holonomic
    n = 32

    def loss(gravity):
        ham = lambda x: base(x) + (gravity - 9.81) * jnp.sum(x[1:n:2])
        step = geomjax.rattle(geomjax.System(ham, geomjax.canonical(n), holonomic=con), structured=structured)
        z, _ = jax.lax.scan(lambda z, _: (step.advance(0.0, z, 0.01, None)[0], None), step.split(model.x0),
                            None, length=50)
        x = step.merge(z)
        return jnp.sum(x[:n] ** 2) + jnp.sum(jnp.sin(x[n:]))

    grad = float(jax.jit(jax.grad(loss))(9.81))
    eps = 1e-4
    fd = float((loss(9.81 + eps) - loss(9.81 - eps)) / (2 * eps))
    assert abs(grad - fd) <= 1e-6 * abs(fd)
    # and w.r.t. the initial momenta, along a direction tangent to the constraint set
    step = geomjax.rattle(model.system, structured=structured)
    out = lambda x: jnp.sum(jax.lax.scan(lambda z, _: (step.advance(0.0, z, 0.01, None)[0], None),
                                         step.split(x), None, length=50)[0][0] ** 2)
    direction = jnp.zeros(64).at[n + 2 * 5].set(1.0)  # an interior particle, horizontally
    jvp = float(jax.jvp(out, (model.x0,), (direction,))[1])
    fd = float((out(model.x0 + 1e-6 * direction) - out(model.x0 - 1e-6 * direction)) / 2e-6)
    assert abs(jvp - fd) <= 1e-5 * abs(fd)


def test_a_singular_constraint_matrix_is_reported_not_hidden(monkeypatch):
    """A rod given twice with two lengths: G M⁻¹Gᵀ singular, g(q₁) = 0 unsolvable."""
    model = geomjax.models.rod_ring(20)
    c = model.system.holonomic
    con = RodConstraints(jnp.concatenate([c.lengths, jnp.array([1.001])]), c.anchors,
                         _Indices(np.concatenate([c.edges.array, c.edges.array[:1]])), c.pins, 3)
    system = geomjax.System(model.system.hamiltonian, geomjax.canonical(60), holonomic=con)
    for structured in ("krylov", "banded"):
        step = geomjax.rattle(system, structured=structured)
        advance = jax.jit(jax.vmap(lambda x, step=step: step.advance(0.0, step.split(x), 0.01, None)[1]))
        codes = advance(jnp.stack([model.x0, model.x0]))
        assert bool(jnp.all(codes != RESULTS.successful)), structured
    with pytest.raises(ValueError, match="not independent"):
        step.check(model.x0)
    # the check for large systems, by conjugate gradients on G M⁻¹Gᵀ (products only)
    monkeypatch.setattr(rattle_module, "_DENSE_START_CHECK", 0)
    with pytest.raises(ValueError, match="conjugate gradients on G M⁻¹ Gᵀ"):
        step.check(model.x0)
    geomjax.rattle(model.system).check(model.x0)  # the ring itself passes


@pytest.mark.parametrize("structured", ["krylov", "banded"])
def test_step_program_holds_no_m_by_m_array_and_does_not_grow(structured):
    """The jaxpr of a 16 × 16 cloth's RATTLE step: no array with m² entries (conjugate
    gradients: nothing beyond colours × m; blocks: 2m·s for blocks of s ≈ the RCM band);
    the same number of equations as a 10 × 10 cloth's (nothing unrolled per constraint)."""

    def eqns_and_largest(n):
        model = geomjax.models.cloth(n)
        step = geomjax.rattle(model.system, structured=structured)
        closed = jax.make_jaxpr(lambda x: step.advance(0.0, step.split(x), H, None))(model.x0)
        sizes, count = [], 0

        def walk(jaxpr):
            nonlocal count
            for eqn in jaxpr.eqns:
                count += 1
                sizes.extend(int(np.prod(v.aval.shape)) for v in eqn.outvars if hasattr(v.aval, "shape"))
                for p in eqn.params.values():
                    for sub in (p if isinstance(p, (tuple, list)) else (p,)):
                        if hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):
                            walk(sub.jaxpr)
                        elif hasattr(sub, "eqns"):
                            walk(sub)

        walk(closed.jaxpr)
        m = 2 * n * (n - 1) + 4
        return count, max(sizes), m

    small, _, _ = eqns_and_largest(10)
    count, largest, m = eqns_and_largest(16)
    if structured == "krylov":
        assert largest < 16 * m  # (colours × m) at most; an m × m matrix would be 234 256
    else:
        assert largest <= 2 * (m + 32) * 32  # two blocks of 32 × 32 per 32 rows (band 32)
    assert count == small


@pytest.mark.parametrize("build", [lambda: geomjax.models.cloth(5), lambda: geomjax.models.cloth(5, space=True),
                                   lambda: geomjax.models.rod_tree(40), lambda: geomjax.models.rod_ring(40),
                                   lambda: geomjax.models.water_box(2)])
def test_rod_models_start_on_their_constraint_sets(build):
    model = build()
    n = model.system.dim // 2
    q, p = model.x0[:n], model.x0[n:]
    g = model.system.holonomic
    v = jax.grad(lambda pp: model.system.hamiltonian(jnp.concatenate([q, pp])))(p)
    assert float(jnp.max(jnp.abs(g(q)))) < 1e-13
    assert float(jnp.max(jnp.abs(jax.jvp(g, (q,), (v,))[1]))) < 1e-13
    geomjax.rattle(model.system).check(model.x0)  # independent constraints, a separable H


def test_hand_written_floors_agree_with_geomjax():
    """The benchmark's floors (`benchmarks/constraint_scaling.py`, the `scaling` experiment)
    integrate the same motion as geomjax: the ratios they print compare equal work."""
    from geomjax.experiments.rod_floors import check_floors

    check_floors(geomjax.models.rod_ring(16))


# --------------------------------------------------------------------------- Dirac and feedback fields
def _dense_dirac(system, x):
    """X_H − Σ c_j X_{f_j} with C formed densely (`dense_constraint_data`): the reference."""
    from geomjax._field import derived

    s = system.structure
    return s.merge(derived.dirac_vector(derived.dense_constraint_data(system, s.split(x))))


# the ring in the extended job (5 s): the same Gram path as the cloth's, and the tree's (with a border) is
# checked against the dense field by test_tree_dirac_field_with_a_border_matches_the_dense_field
@pytest.mark.parametrize("build", [lambda: geomjax.models.cloth(4),
                                   pytest.param(lambda: geomjax.models.rod_ring(20), marks=pytest.mark.extended),
                                   pytest.param(lambda: geomjax.models.water_box(2), marks=pytest.mark.extended)],
                         ids=["cloth", "ring", "water"])
def test_dirac_field_on_sparse_graphs_matches_dense(build):
    from geomjax._field import derived

    model = build()
    system = model.system
    m = system.constraint_functions(model.x0).shape[0]
    assert isinstance(derived.block_tridiagonal_plan(system, system.structure.split(model.x0), m), derived.GramDiracPlan)
    field = geomjax.dirac_field(system)
    x1 = model.x0 + 1e-2 * jnp.cos(jnp.arange(system.dim, dtype=float))  # off the start (and the set)
    call = jax.jit(lambda x: field(x))
    dense = jax.jit(lambda x: _dense_dirac(system, x))
    for x in (model.x0, x1):
        ref = dense(x)
        np.testing.assert_allclose(call(x), ref, rtol=0, atol=1e-12 * float(jnp.max(jnp.abs(ref))))
    both = jax.vmap(field)(jnp.stack([model.x0, x1]))
    np.testing.assert_allclose(both[1], call(x1), atol=1e-13 * float(jnp.max(jnp.abs(both))))
    # derivatives of the field (the Jacobian of implicit steps, the tangents of gradients)
    direction = jnp.sin(jnp.arange(system.dim, dtype=float))
    tangent = jax.jit(lambda x, d: jax.jvp(field, (x,), (d,))[1])(x1, direction)
    ref = (dense(x1 + 1e-6 * direction) - dense(x1 - 1e-6 * direction)) / 2e-6
    np.testing.assert_allclose(tangent, ref, atol=1e-6 * float(jnp.max(jnp.abs(ref))))


@pytest.mark.extended  # 8 s; the feedback field reads the sparse constraint data the Dirac-field tests check against dense
def test_feedback_field_on_a_sparse_graph_keeps_the_constraints():
    model = geomjax.models.cloth(4)
    field = geomjax.feedback_field(model.system, model.x0, dt=1e-3, method="rk4")  # gains chosen for h
    sol = geomjax.integrate(field, model.x0, dt=1e-3, steps=300, method="rk4", save_every=300)
    assert sol.ok
    n = model.system.dim // 2
    assert float(jnp.max(jnp.abs(model.system.holonomic(sol.xs[-1][:n])))) < 1e-9


def test_a_singular_sparse_constraint_matrix_is_reported_at_the_start():
    model = geomjax.models.rod_ring(20)
    c = model.system.holonomic
    con = RodConstraints(jnp.concatenate([c.lengths, c.lengths[:1]]), c.anchors,
                         _Indices(np.concatenate([c.edges.array, c.edges.array[:1]])), c.pins, 3)
    system = geomjax.System(model.system.hamiltonian, geomjax.canonical(60), holonomic=con)
    with pytest.raises(ValueError, match="G M⁻¹ Gᵀ .* could not be solved"):
        geomjax.integrate(geomjax.dirac_field(system), model.x0, dt=1e-3, steps=2)


# the Krylov variant in the extended job (7 s): its implicit differentiation is checked
# against central differences by test_gradient_through_sparse_rattle_matches_central_differences
@pytest.mark.parametrize("structured", [pytest.param("krylov", marks=pytest.mark.extended), "banded"])
def test_step_jacobians_forward_reverse_and_batched_agree(structured):
    """jacfwd (a vmap over tangents: a flag carried out of the solves as auxiliary output
    came out batched there and broke it) and jacrev of a sparse RATTLE step agree."""
    model = geomjax.models.rod_ring(8)
    step = geomjax.rattle(model.system, structured=structured)
    f = lambda x: step(x, 0.01)
    np.testing.assert_allclose(jax.jacrev(f)(model.x0), jax.jacfwd(f)(model.x0), atol=1e-12)


def test_sweep_over_a_parameter_of_a_sparse_graph():
    """`geomjax.sweep` (the batched driver) runs the sparse RATTLE member by member, as
    `integrate` does alone; the models take traced parameters."""
    member = lambda gravity: (geomjax.rattle(geomjax.models.cloth(4, gravity=gravity).system),
                              geomjax.models.cloth(4).x0)
    result = geomjax.sweep(member, geomjax.zipped(gravity=[9.81, 2.0]), dt=0.005, steps=40)
    alone = geomjax.integrate(geomjax.rattle(geomjax.models.cloth(4, gravity=2.0).system),
                              geomjax.models.cloth(4).x0, dt=0.005, steps=40)
    assert np.all(np.asarray(result.status) == 0)
    np.testing.assert_allclose(result.xs[1, -1], alone.xs[-1], atol=1e-13)


@pytest.mark.parametrize("module", ["geomjax._solve.krylov", "geomjax._solve.block_cholesky",
                                    "geomjax.internal.sparsity"])
def test_internal_examples_run(module):
    """The examples in the docstrings of the sparse solvers' modules (not public names, so
    `test_docstrings.py` does not collect them)."""
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_gradient_through_the_sparse_dirac_field_matches_central_differences():
    """jit(grad) of a loss after 20 RK4 steps of the Dirac field of a 4 × 4 cloth (its sparse
    A = G M⁻¹Gᵀ solved by blocks) w.r.t. g closed over by H, against central differences."""
    model = geomjax.models.cloth(4)
    base, con = model.system.hamiltonian, model.system.holonomic
    n = 32

    def loss(gravity):
        ham = lambda x: base(x) + (gravity - 9.81) * jnp.sum(x[1:n:2])
        field = geomjax.dirac_field(geomjax.System(ham, geomjax.canonical(n), holonomic=con))
        x = geomjax.integrate(field, model.x0, dt=0.01, steps=20, method="rk4", save_every=20,
                              drift_tol=None, start_tol=None).xs[-1]
        return jnp.sum(x[:n] ** 2) + jnp.sum(jnp.sin(x[n:]))

    grad = float(jax.jit(jax.grad(loss))(9.81))
    fd = float((loss(9.81 + 1e-4) - loss(9.81 - 1e-4)) / 2e-4)
    assert abs(grad - fd) <= 1e-6 * abs(fd)


def _reusing_factors_runs():
    """12 RATTLE steps of a 6 × 6 cloth through `integrate`, factoring G M⁻¹Gᵀ every step and
    with `refactor_every=5` (block factors carried, refreshed every 5 steps)."""
    model = geomjax.models.cloth(6)
    plain = geomjax.rattle(model.system)
    reusing = geomjax.rattle(model.system, refactor_every=5)
    assert reusing.carries_history and not plain.carries_history
    runs = [jax.jit(lambda x, s=s: geomjax.integrate(s, x, dt=H, steps=12, drift_tol=None).x_final)
            for s in (plain, reusing)]
    return model, runs


def test_rattle_reusing_factors_across_steps_matches_rattle():
    """`refactor_every=5` matches RATTLE that factors every step to 1e-11 and keeps g at
    round-off."""
    model, runs = _reusing_factors_runs()
    a, b = (r(model.x0) for r in runs)
    assert bool(jnp.all(jnp.isfinite(b)))  # a failed run ends in NaN
    np.testing.assert_allclose(b, a, rtol=1e-11, atol=1e-11)
    n = model.x0.shape[0] // 2
    assert float(jnp.max(jnp.abs(model.system.holonomic(b[:n])))) < 1e-12
    with pytest.raises(ValueError, match="refactor_every"):
        geomjax.rattle(model.system, refactor_every=0)


@pytest.mark.extended  # 4 s of compiling two jvps; the chord's implicit derivative is checked on RATTLE itself
def test_rattle_reusing_factors_differentiates_as_rattle():
    """The derivative w.r.t. the start matches RATTLE's (implicit differentiation does not
    depend on the chord's matrix)."""
    model, runs = _reusing_factors_runs()
    n = model.x0.shape[0] // 2
    tangent = jnp.zeros_like(model.x0).at[n:].set(jnp.sin(jnp.arange(n)))
    ja, jb = (jax.jvp(r, (model.x0,), (tangent,))[1] for r in runs)
    np.testing.assert_allclose(jb, ja, rtol=1e-8, atol=1e-8)


def test_a_step_too_large_is_blamed_on_the_position_iteration_not_the_velocity_solve():
    """A 6 × 6 cloth thrown hard at a large step: the chord iteration for the position
    multipliers finds no solution near the predictor; the velocity stage then works on
    garbage and its solve fails too, but the status names the first cause."""
    model = geomjax.models.cloth(6)
    step = geomjax.rattle(model.system)
    assert isinstance(step._block_plan(*step.split(model.x0), 0.3), BlockCholeskyPlan)
    n = model.x0.shape[0] // 2
    x = model.x0.at[n:].set(40.0 * jnp.sin(jnp.arange(n)))
    x = x.at[n:].set(x[n:] - jax.vjp(model.system.holonomic, x[:n])[1](
        jnp.linalg.lstsq(jax.jacfwd(model.system.holonomic)(x[:n]).T, x[n:])[0])[0])  # on G p = 0
    _, status = jax.jit(lambda z: step.advance(0.0, z, 0.3, None))(step.split(x))
    assert status == RESULTS.newton_failed


def test_a_failed_sparse_solve_names_the_solve_the_step_and_the_residual(monkeypatch):
    """Conjugate gradients held to two iterations cannot solve a ring's G M⁻¹Gᵀ: the run
    ends with linear_solve_failed at step 1, and the message gives each stage's relative
    residual against its bound (repeated at the last good state), never a success."""
    from functools import partial

    from geomjax._solve import krylov

    model = geomjax.models.rod_ring(20)
    step = geomjax.rattle(model.system, structured="krylov")
    monkeypatch.setattr(krylov, "pcg", partial(krylov.pcg, max_steps=2))
    try:
        sol = geomjax.integrate(step, model.x0, dt=0.01, steps=4, save_every=2, throw=False)
    finally:
        geomjax.clear_caches()  # the programs compiled with the patched limit
    assert sol.result == RESULTS.linear_solve_failed and int(sol.failed_step) == 1
    message = sol.message
    assert "at step 1" in message and "last good state (step 0)" in message
    assert "by conjugate gradients" in message
    position = float(message.split("position stage ")[1].split(" ")[0])
    assert position > 1e-1  # above its bound: the residual that failed


@pytest.mark.extended  # 5 s; the failed-solve message itself is checked on the ring held to 2 CG iterations
def test_the_residual_is_measured_at_the_last_good_state_between_saves():
    """A failure at step 5 of a run saved every 3 steps: the diagnosis repeats the step at
    state 4 (run on from the save at step 3), as a direct call there does."""
    import dataclasses

    from geomjax._driver.integrate import _with_linear_cause

    model = geomjax.models.rod_ring(20)
    step = geomjax.rattle(model.system, structured="krylov")
    sol = geomjax.integrate(step, model.x0, dt=0.01, steps=6, save_every=3)
    failed = dataclasses.replace(sol, result=RESULTS.linear_solve_failed, failed_step=jnp.asarray(5))
    cause = _with_linear_cause(failed, step, 0.01, 0.0, None, 3).detail.cause
    residuals = eqx.filter_jit(step.linear_residuals)
    position = lambda steps: float(residuals(  # noqa: E731  (one compiled loop for every count)
        geomjax.diagnostics.final_state(step, model.x0, 0.01, steps)[0], 0.01)[1][0][1])
    assert "(step 4)" in cause
    reported = float(cause.split("position stage ")[1].split(" ")[0])
    assert abs(reported - position(4)) <= 1e-2 * reported
    assert abs(reported - position(3)) > 1e-2 * reported  # not the save's state
