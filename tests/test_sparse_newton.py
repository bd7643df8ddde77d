"""Implicit steps on large sparse constraint graphs: Newton by block LU in RCM order."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax
from geomjax._solve import block_lu
from geomjax._solve.block_lu import SPARSE_NEWTON_MIN, BlockLUPlan
from geomjax._status import RESULTS
from geomjax.internal.sparsity import Pattern
from geomjax.models._rod_networks import RodConstraints, _Indices

H = 0.01


def _lagrangian(model):
    g = model.params["g"]
    return lambda q, v: 0.5 * jnp.sum(v * v) - g * jnp.sum(q.reshape(-1, 2)[:, 1])


def _steps(model, sparse):
    """The implicit steps with a Newton solve over 100+ unknowns on an 8 × 8 cloth."""
    newton = geomjax.Newton(sparse=sparse)
    system, lag = model.system, _lagrangian(model)
    return {
        "dirac1 position": geomjax.dirac1(lag, system.holonomic, constraint="position", newton=newton),
        "dirac_rk gauss 2": geomjax.dirac_rk(lag, "gauss", 2, holonomic=system.holonomic, newton=newton),
        "rattle non-separable": geomjax.rattle(system, separable=False, newton=newton),
        "projection": geomjax.project(geomjax.explicit_rk(
            geomjax.hamiltonian_vector_field(system.hamiltonian, system.structure), geomjax.RK4), system,
            newton=newton),
    }


def _run(step, x0, steps=8):
    def run(x):
        def body(z, _):
            z, status = step.advance(0.0, z, H, None)
            return z, status._value

        z, codes = jax.lax.scan(body, step.split(x), None, length=steps)
        return step.merge(z), codes

    return jax.jit(run)(x0)


def _plans_made(monkeypatch):
    made = []
    original = BlockLUPlan.for_newton.__func__

    def spy(cls, fn, m, dtype=np.float64):
        plan = original(cls, fn, m, dtype)
        made.append(plan)
        return plan

    monkeypatch.setattr(BlockLUPlan, "for_newton", classmethod(spy))
    return made


def _block_tridiagonal_pattern(rng, m, band, saddle=0):
    """A random sparse square pattern of band `band` in a shuffled order (RCM must find it),
    with `saddle` trailing rows/columns forming a zero diagonal block."""
    dense = np.zeros((m, m), bool)
    for i in range(m):
        js = rng.integers(max(0, i - band), min(m, i + band + 1), size=3)
        dense[i, js] = True
        dense[js, i] = True
    np.fill_diagonal(dense, True)
    if saddle:  # [[A, Bᵀ], [B, 0]] with B of full rank (rows on consecutive columns)
        dense[m - saddle:, :] = False
        dense[:, m - saddle:] = False
        for t in range(saddle):
            cols = [3 * t, 3 * t + 1, 3 * t + 2]
            dense[m - saddle + t, cols] = True
            dense[cols, m - saddle + t] = True
    perm = rng.permutation(m)
    return dense[np.ix_(perm, perm)]


@pytest.mark.parametrize("saddle", [0, 12])
def test_block_lu_solves_against_dense(rng, saddle):
    """Random non-symmetric sparse matrices, and saddle-point ones (zero diagonal block,
    singular leading minors: pivoting across block rows is needed) to 1e-12."""
    m = 70
    pattern = _block_tridiagonal_pattern(rng, m, 4, saddle)
    values = jnp.asarray(np.where(pattern, rng.normal(size=(m, m)), 0.0) + np.where(
        np.eye(m, dtype=bool) & pattern, 4.0, 0.0))
    assert np.linalg.cond(values) < 1e8
    plan = BlockLUPlan.from_pattern(Pattern.from_dense(pattern))
    assert plan is not None and plan.source.shape[0] == 3
    b = jnp.asarray(rng.normal(size=m))
    x = plan.solve(plan.factor(lambda v: values @ v, jnp.float64), b)
    np.testing.assert_allclose(x, jnp.linalg.solve(values, b), rtol=1e-12, atol=1e-12)


def test_a_singular_matrix_gives_non_finite_factors_not_a_wrong_solve(rng):
    m = 70
    pattern = _block_tridiagonal_pattern(rng, m, 3)
    values = np.where(pattern, rng.normal(size=(m, m)), 0.0)
    values[5] = 0.0  # an empty row: singular
    plan = BlockLUPlan.from_pattern(Pattern.from_dense(pattern))
    x = plan.solve(plan.factor(lambda v: jnp.asarray(values) @ v, jnp.float64), jnp.ones(m))
    assert not bool(jnp.all(jnp.isfinite(x)))


@pytest.mark.extended  # 10 s; block-LU Newton against dense is also checked (default run) by the affine Dirac-1 and the gradient/vmap tests below
def test_implicit_steps_on_a_cloth_use_blocks_and_match_the_dense_newton(monkeypatch):
    """Every implicit step with a Newton solve (Dirac-1 with position constraints,
    Dirac–Runge–Kutta, RATTLE for a non-separable H, projection) on an 8 × 8 cloth (116
    to 480 unknowns): the block-LU Newton agrees with the dense one to 1e-12 after 4 steps,
    and the steps that impose g(q) = 0 keep it."""
    model = geomjax.models.cloth(8)
    made = _plans_made(monkeypatch)
    dense = _steps(model, sparse=False)
    for name, step in _steps(model, sparse=True).items():
        del made[:]
        x_sparse, codes = _run(step, model.x0, steps=4)
        assert any(p is not None for p in made), name  # the block plan drove the solve
        assert bool(jnp.all(codes == RESULTS.successful._value)), name
        x_dense, _ = _run(dense[name], model.x0, steps=4)
        np.testing.assert_allclose(x_sparse, x_dense, rtol=1e-12, atol=1e-12, err_msg=name)
        q = x_sparse[: model.x0.shape[0] // 2]
        if name != "dirac_rk gauss 2":  # (its stages impose the velocity constraint)
            assert float(jnp.max(jnp.abs(model.system.holonomic(q)))) < 1e-10, name


def test_affine_dirac_step_on_a_cloth_solves_by_blocks_and_matches_block_elimination(monkeypatch):
    """Dirac-1 at the velocity level is affine in (w, μ): on a 6 × 6 cloth (132 unknowns)
    one block-LU solve, against the dense saddle-point elimination."""
    from geomjax._solve import structure
    from geomjax._step.dirac import _affine_structure, _Equations

    model = geomjax.models.cloth(6)
    step = geomjax.dirac1(_lagrangian(model), model.system.holonomic)
    q, p = step.split(model.x0)
    eqs = _Equations(step.system, step.velocity, "velocity", (), q, p, jnp.asarray(H))
    affine = _affine_structure(eqs)
    assert affine is not None and affine.m >= SPARSE_NEWTON_MIN
    assert affine.depends.count().max() <= 9  # sparse rows: no dense closed-over matrix
    made = _plans_made(monkeypatch)
    sparse = structure.linear_solve(eqs, eqs.zeros())
    assert made and made[0] is not None
    dense = structure.saddle_linear_solve(eqs, eqs.zeros())
    for a, b in zip(sparse, dense):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)
    assert float(jnp.max(jnp.abs(jnp.concatenate(eqs(sparse))))) < 1e-12


def test_gradient_and_vmap_through_a_sparse_newton_step():
    """d/dg of a Dirac-1 (position constraints) run on a 6 × 6 cloth (136 unknowns) through
    the block-LU Newton (implicit differentiation) against central differences, and vmap
    over starts."""
    base = geomjax.models.cloth(6)

    def final_height(g):
        lag = lambda q, v: 0.5 * jnp.sum(v * v) - g * jnp.sum(q.reshape(-1, 2)[:, 1])  # noqa: E731
        step = geomjax.dirac1(lag, base.system.holonomic, constraint="position")
        x, _ = _run(step, base.x0, steps=6)
        return jnp.sum(x[1:72:2])

    g0, eps = 9.81, 1e-5
    grad = jax.jit(jax.grad(final_height))(g0)  # g is closed over by the Lagrangian
    fd = (final_height(g0 + eps) - final_height(g0 - eps)) / (2 * eps)
    assert abs(float(grad) - float(fd)) < 1e-7 * max(1.0, abs(float(fd)))

    step = geomjax.dirac1(_lagrangian(base), base.system.holonomic, constraint="position")
    starts = jnp.stack([base.x0, base.x0.at[72:].multiply(1.1)])
    batched = jax.vmap(lambda x: _run(step, x, steps=3)[0])(starts)
    for i in range(2):
        np.testing.assert_allclose(batched[i], _run(step, starts[i], steps=3)[0], rtol=1e-13, atol=1e-13)


def test_a_singular_sparse_newton_system_is_reported():
    """A rod given twice with two lengths: the Dirac step's Jacobian is singular; the
    block LU gives non-finite factors and the step reports a failed Newton solve."""
    model = geomjax.models.cloth(6)
    c = model.system.holonomic
    con = RodConstraints(jnp.concatenate([c.lengths, jnp.array([1.001])]), c.anchors,
                         _Indices(np.concatenate([c.edges.array, c.edges.array[:1]])), c.pins, 2)
    step = geomjax.dirac1(_lagrangian(model), con, constraint="position")
    _, codes = _run(step, model.x0, steps=1)
    assert int(codes[0]) == RESULTS.newton_failed._value


def test_small_systems_keep_the_dense_newton(monkeypatch):
    made = _plans_made(monkeypatch)
    model = geomjax.models.cloth(5)  # 50 + 44 unknowns: below SPARSE_NEWTON_MIN
    step = geomjax.dirac1(_lagrangian(model), model.system.holonomic, constraint="position")
    _run(step, model.x0, steps=1)
    assert all(p is None for p in made)


def test_internal_example_runs():
    import doctest

    assert doctest.testmod(block_lu).failed == 0


def _oscillator_chain(stiffness=30.0):
    """Gauss 4 with Newton on 20 coupled nonlinear oscillators (n = 40), and a start."""

    def field(x):
        q, p = x[:20], x[20:]
        springs = jnp.diff(q, prepend=0.0, append=0.0)
        return jnp.concatenate([p, stiffness * jnp.diff(springs) - q**3])

    x0 = jnp.concatenate([jnp.sin(jnp.arange(20.0)), jnp.zeros(20)])
    return geomjax.implicit_rk(field, geomjax.GAUSS4, solver="newton"), x0


def test_implicit_rk_newton_matrix_free_matches_the_dense_jacobian(monkeypatch):
    """Gauss 4 with Newton on a chain of 20 nonlinear oscillators (a stiff-ish coupled
    field): the stages' simplified Newton by GMRES on jvp products (forced below its size
    threshold) agrees with the one that forms the field's Jacobian, to 1e-11 after 5
    steps."""
    from geomjax._step import implicit_rk

    step, x0 = _oscillator_chain()
    dense, _ = _run(step, x0, steps=5)
    monkeypatch.setattr(implicit_rk, "MATRIX_FREE_MIN", 0)
    free, codes_free = _run(step, x0, steps=5)
    assert bool(jnp.all(codes_free == RESULTS.successful._value))
    np.testing.assert_allclose(free, dense, rtol=1e-11, atol=1e-11)


def test_implicit_rk_matrix_free_gradients_form_no_jacobian(monkeypatch):
    """The matrix-free stage solve differentiates matrix-free too: the gradient of a Gauss 4
    Newton step on 20 coupled nonlinear oscillators (n = 40, s·n = 80 unknowns) agrees with
    the dense path's and with central differences, forward and reverse, and the traced
    gradient holds no n × n or s·n × s·n array (the dense path's does, so the test can fail)."""
    from _jaxpr import jaxpr_shapes

    from geomjax._step import implicit_rk

    step, x0 = _oscillator_chain()

    def energy_after(x):
        return jnp.sum(step.advance(0.0, x, 0.05, None)[0] ** 2)

    def squares(fn):
        shapes = jaxpr_shapes(jax.make_jaxpr(fn)(x0).jaxpr)
        return [s for s in shapes if len(s) >= 2 and s[-1] in (40, 80) and s[-2] in (40, 80)]

    dense_grad = jax.jit(jax.grad(energy_after))(x0)
    assert squares(jax.grad(energy_after))
    monkeypatch.setattr(implicit_rk, "MATRIX_FREE_MIN", 0)
    assert not squares(jax.grad(energy_after))
    free_grad = jax.jit(jax.grad(energy_after))(x0)
    np.testing.assert_allclose(free_grad, dense_grad, rtol=1e-9, atol=1e-9)
    direction = jnp.cos(jnp.arange(40.0))
    _, tangent = jax.jvp(energy_after, (x0,), (direction,))
    eps = 1e-6
    fd = (energy_after(x0 + eps * direction) - energy_after(x0 - eps * direction)) / (2 * eps)
    np.testing.assert_allclose(float(tangent), float(jnp.dot(free_grad, direction)), rtol=1e-9)
    np.testing.assert_allclose(float(tangent), float(fd), rtol=1e-6)

    def closed_over(stiffness):  # jit(grad) w.r.t. a value the field closes over
        step, x0 = _oscillator_chain(stiffness)
        return jnp.sum(step.advance(0.0, x0, 0.05, None)[0] ** 2)

    grad = float(jax.jit(jax.grad(closed_over))(30.0))
    fd = (closed_over(30.0 + 1e-5) - closed_over(30.0 - 1e-5)) / 2e-5
    np.testing.assert_allclose(grad, float(fd), rtol=1e-6)


def _dirac_rk_final_height(g, steps=2):
    """Σ y after Dirac–RK (Gauss, s = 2) steps on a 6 × 6 cloth under gravity g (closed over)."""
    base = geomjax.models.cloth(6)
    lag = lambda q, v: 0.5 * jnp.sum(v * v) - g * jnp.sum(q.reshape(-1, 2)[:, 1])  # noqa: E731
    step = geomjax.dirac_rk(lag, "gauss", 2, holonomic=base.system.holonomic)
    x, _ = _run(step, base.x0, steps=steps)
    return jnp.sum(x[1:72:2])


def test_gradient_through_a_sparse_dirac_rk_step_forms_no_dense_jacobian():
    """The implicit-function tangent solve of a sparse Dirac–RK step uses the block-LU plan
    at the root: no dense matrix over the 272 stage unknowns in the traced gradient (the
    dense tangent solve forms a 272 × 272 one)."""
    from _jaxpr import jaxpr_shapes

    shapes = jaxpr_shapes(jax.make_jaxpr(jax.grad(_dirac_rk_final_height))(9.81).jaxpr)
    assert max(s[-1] * s[-2] for s in shapes if len(s) >= 2) < 200 * 200


@pytest.mark.extended  # 7 s of compilation; the structure test above runs by default
def test_gradient_through_a_sparse_dirac_rk_step_matches_central_differences():
    """d/dg of two sparse Dirac–RK steps on a 6 × 6 cloth against central differences."""
    final_height = _dirac_rk_final_height
    g0, eps = 9.81, 1e-5
    grad = jax.jit(jax.grad(final_height))(g0)
    fd = (final_height(g0 + eps) - final_height(g0 - eps)) / (2 * eps)
    assert abs(float(grad) - float(fd)) < 1e-7 * max(1.0, abs(float(fd)))
