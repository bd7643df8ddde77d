"""Splitting and composition: orders, invariants of the exact pendulum sub-flows, symplecticity."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _holonomic_cases import KINETIC, POTENTIAL, SPHERE, SPHERE_F, X0, measured_order, sphere_reference, state_on_sphere

import geomjax
from geomjax import diagnostics

LIE = geomjax.lie_trotter(KINETIC, POTENTIAL)
STRANG = geomjax.strang(KINETIC, POTENTIAL)
YOSHIDA = geomjax.triple_jump(STRANG)


@pytest.mark.parametrize(
    "step, nominal", [(LIE, 1), (STRANG, 2), (YOSHIDA, 4)], ids=["lie-trotter", "strang", "triple-jump"]
)
def test_orders(step, nominal):
    fit = measured_order(step, X0, sphere_reference())
    assert abs(fit.order - nominal) <= 0.3, fit


@pytest.mark.parametrize("step", [LIE, STRANG], ids=["lie-trotter", "strang"])
def test_stays_on_the_sphere_and_keeps_vertical_angular_momentum(step):
    # The seed's form of the constraints, f = (|q|², q·p), and its model's J.
    sol = geomjax.integrate(step, SPHERE_F.x0, dt=0.01, steps=1000, save_every=10)
    err = np.asarray(diagnostics.invariant_errors(SPHERE_F.system, sol.xs))
    f1, f2, energy, j = err.max(axis=0)
    assert f1 <= 1e-12 and f2 <= 1e-12 and j <= 1e-12, (f1, f2, j)
    assert energy < 5e-2  # O(h) / O(h²) energy error, bounded


@pytest.mark.parametrize("step", [LIE, STRANG, YOSHIDA], ids=["lie-trotter", "strang", "triple-jump"])
def test_symplectic_on_t_star_sphere(step):
    defect = float(diagnostics.symplecticity_defect(step, state_on_sphere(), 0.1, SPHERE.system))
    assert defect < 1e-13, defect


def test_sub_flows_are_exact_flows():
    x = state_on_sphere()
    for flow in (KINETIC, POTENTIAL):
        # group property φ_s ∘ φ_t = φ_{s+t}, and reversibility φ_{−t} ∘ φ_t = id
        np.testing.assert_allclose(flow(flow(x, 0.3), 0.45), flow(x, 0.75), atol=1e-14)
        np.testing.assert_allclose(flow(flow(x, 0.6), -0.6), x, atol=1e-14)
    # The kinetic flow is uniform great-circle motion with angular speed |p|/(m r).
    q, p = x[:3], x[3:]
    omega = jnp.linalg.norm(p)
    quarter = KINETIC(x, 0.5 * jnp.pi / omega)
    np.testing.assert_allclose(quarter[:3], p / omega, atol=1e-14)
    np.testing.assert_allclose(quarter[3:], -omega * q, atol=1e-14)
    # Each sub-flow solves its Hamiltonian's restricted equations: d/dt at t = 0 matches the
    # Dirac field of H¹ = |p|²/2 and H² = q₃ on T*S².
    for flow, part in ((KINETIC, lambda y: 0.5 * y[3:] @ y[3:]), (POTENTIAL, lambda y: y[2])):
        rate = jax.jvp(lambda t: flow(x, t), (0.0,), (1.0,))[1]
        sub = geomjax.System(part, geomjax.canonical(3), constraints=SPHERE_F.system.constraints)
        np.testing.assert_allclose(rate, geomjax.dirac_field(sub)(x), atol=1e-13)


def test_kinetic_flow_is_smooth_at_rest():
    planar = geomjax.models.planar_pendulum()
    kinetic, potential = geomjax.models.pendulum_flows(planar)
    jac = jax.jacfwd(lambda y: geomjax.strang(potential, kinetic)(y, 0.1))(planar.x0)
    assert np.all(np.isfinite(np.asarray(jac)))
    np.testing.assert_allclose(kinetic(planar.x0, 0.3), planar.x0, atol=0)


def test_strang_is_symmetric():
    x = state_on_sphere()
    np.testing.assert_allclose(STRANG(STRANG(x, 0.2), -0.2), x, atol=1e-14)


def test_compose_general_forms():
    x = state_on_sphere()
    # a plain callable sub-flow on flat states mixes with steps carried in pieces
    flat_potential = lambda y, h: POTENTIAL(y, h)  # noqa: E731
    np.testing.assert_allclose(geomjax.lie_trotter(KINETIC, flat_potential)(x, 0.1), LIE(x, 0.1), atol=1e-15)
    # Strang as a general composition with its coefficients
    np.testing.assert_allclose(geomjax.compose([KINETIC, POTENTIAL], [0.5, 1.0, 0.5])(x, 0.1), STRANG(x, 0.1))
    with pytest.raises(ValueError, match="sum to"):
        geomjax.compose([KINETIC, POTENTIAL], [0.5, 1.0])
    with pytest.raises(ValueError, match="even order"):
        geomjax.triple_jump_coefficients(3)


def test_sub_flows_reject_a_start_off_the_tangent_bundle():
    with pytest.raises(ValueError, match="off the constraint set"):
        geomjax.integrate(STRANG, X0.at[4].add(0.1), dt=0.01, steps=2)


def _fused_and_plain(system):
    from geomjax._step.rattle import RattleComposition
    from geomjax._step.splitting import Composition

    rattle = geomjax.rattle(system)
    fused = geomjax.triple_jump(rattle)
    assert isinstance(fused, RattleComposition)
    return fused, Composition((rattle,), geomjax.triple_jump_coefficients(2))


def test_the_triple_jump_of_rattle_fuses_its_joints_and_is_the_same_map():
    """`triple_jump(rattle(system))` leaves out the velocity projection at the two joints
    (the next sub-step's position multiplier takes up the same direction G(q)ᵀ) and reuses
    ∇U there: the same map as the plain composition to round-off on the spherical
    pendulum, order 4, constraints at round-off. SHAKE's compositions are not fused (its
    second kick reuses the multiplier, which a fused joint changes)."""
    from geomjax._step.splitting import Composition

    fused, plain = _fused_and_plain(SPHERE.system)
    xs = [diagnostics.final_state(s, X0, 0.02, 50)[0] for s in (fused, plain)]
    np.testing.assert_allclose(xs[0], xs[1], rtol=0, atol=1e-13)
    assert float(jnp.max(jnp.abs(SPHERE.system.constraint_residuals(xs[0])))) < 1e-13
    fit = measured_order(fused, X0, sphere_reference())
    assert abs(fit.order - 4) <= 0.3, fit
    assert isinstance(geomjax.triple_jump(geomjax.shake(SPHERE.system)), Composition)

    def height(g):  # jit(grad) w.r.t. a value H closes over, through the fused composition
        system = geomjax.System(lambda x: 0.5 * x[3:] @ x[3:] + g * x[2], geomjax.canonical(3),
                                holonomic=lambda q: q @ q - 1.0)
        return geomjax.integrate(geomjax.triple_jump(geomjax.rattle(system)), X0, dt=0.05, steps=20).x_final[2]

    grad = float(jax.jit(jax.grad(height))(9.81))
    fd = float((height(9.81 + 1e-5) - height(9.81 - 1e-5)) / 2e-5)
    assert abs(grad - fd) <= 1e-6 * max(1.0, abs(fd)), (grad, fd)


@pytest.mark.extended  # 4 s; the same code path as the sphere's above, with k = 3 constraints
def test_the_fused_triple_jump_of_rattle_on_a_chain_is_symplectic_and_the_same_map():
    model = geomjax.models.planar_chain(3)
    fused, plain = _fused_and_plain(model.system)
    xs = [diagnostics.final_state(s, model.x0, 0.02, 50)[0] for s in (fused, plain)]
    np.testing.assert_allclose(xs[0], xs[1], rtol=0, atol=1e-13)
    assert float(jnp.max(jnp.abs(model.system.constraint_residuals(xs[0])))) < 1e-13
    fused, _ = _fused_and_plain(SPHERE.system)
    assert float(diagnostics.symplecticity_defect(fused, state_on_sphere(), 0.1, SPHERE.system)) < 1e-13
