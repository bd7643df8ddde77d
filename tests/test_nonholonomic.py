"""The nonholonomic extension (seed 001 §2, geomjax/_field/nonholonomic.py), its feedback
field, the left-trivialised bundles and the discrete Lagrange–d'Alembert step.

Checked at random states of every seed-001 system:

- J and H_ext are first integrals of the extended field off the constraint set;
- on J = 0 the extended field equals the Lagrange–d'Alembert field, computed here
  independently (dense Poisson matrix, Jacobians of J by autodiff of the flat state, and a
  dense multiplier solve);
- the feedback term makes V decrease, leaves the field unchanged on the invariant set, and
  the derived feedback field equals the knife edge's written out by hand.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax
from geomjax import models

MODELS = {
    "knife_edge": models.knife_edge,
    "vertical_disk": models.vertical_disk,
    "heisenberg": models.heisenberg,
    "nonholonomic_oscillator": models.nonholonomic_oscillator,
    "suslov": models.suslov,
    "suslov_reduced": lambda: models.suslov(reduced=True),
    "suslov_general": lambda: models.suslov(xi=(0.3, 0.5, 0.8), omega0=(1.0, 0.4, -0.625)),
    "chaplygin_sleigh": models.chaplygin_sleigh,
    "roller_racer": models.roller_racer,
}


def _layout(model):
    """(momentum index slice, configuration of a flat state) of a model, written out here."""
    s = model.system.structure
    n = model.x0.shape[0]
    name = type(s).__name__
    if name == "CanonicalStructure":
        return slice(n // 2, n), lambda x: x[: n // 2]
    if name == "LeftTrivialisedSO3":
        return slice(9, 12), lambda x: x[:9].reshape(3, 3)
    if name == "LeftTrivialisedSE2":
        k = 4 + s.shape
        return slice(k, n), lambda x: x[:k]
    return slice(0, n), lambda x: x


def _random_states(model, rng, count=6, scale=0.3):
    """States near x0, perturbed in every coordinate (so off J = 0 and off the group)."""
    x0 = np.asarray(model.x0)
    return jnp.asarray(x0 + scale * rng.standard_normal((count, x0.shape[0])))


def _lagrange_dalembert(model):
    """ẋ = B∇H + (0, ωᵀλ) with λ from d/dt(ω ∂H/∂m) = 0, all on the flat state."""
    system = model.system
    mom, config = _layout(model)

    def momenta(x):
        v = jax.grad(system.hamiltonian)(x)[mom]
        return jnp.atleast_2d(system.nonholonomic(config(x))) @ v

    def field(x):
        b = system.structure.matrix(x)
        x_h = b @ jax.grad(system.hamiltonian)(x)
        w = jnp.atleast_2d(system.nonholonomic(config(x)))
        forces = jnp.zeros((w.shape[0], x.shape[0])).at[:, mom].set(w)
        dj = jax.jacobian(momenta)(x)
        lam = jnp.linalg.solve(dj @ forces.T, -(dj @ x_h))
        return x_h + forces.T @ lam

    return field


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request):
    model = MODELS[request.param]()
    return request.param, model, geomjax.nonholonomic_field(model.system)


@eqx.filter_jit
def _rates(field, xs):
    """(J, dJ/dt, dH_ext/dt, H_ext) at each state, by autodiff of the public flat methods."""

    def one(x):
        xdot = field(x)
        j, j_dot = jax.jvp(field.momenta, (x,), (xdot,))
        h, h_dot = jax.jvp(field.extended_hamiltonian, (x,), (xdot,))
        return j, j_dot, h_dot, h

    return jax.vmap(one)(xs)


def test_momenta_and_energy_are_first_integrals_off_the_constraint_set(case, rng):
    name, model, field = case
    xs = _random_states(model, rng)
    j, j_dot, h_dot, h = _rates(field, xs)
    assert float(jnp.min(jnp.max(jnp.abs(j), axis=1))) > 1e-5, "states should be off J = 0"
    scale = 1.0 + float(jnp.max(jnp.abs(xs))) ** 3
    assert float(jnp.max(jnp.abs(j_dot))) < 1e-11 * scale, name
    assert float(jnp.max(jnp.abs(h_dot))) < 1e-11 * scale, name


@eqx.filter_jit
def _compare_with_lda(field, lda, xs):
    def one(x):
        x = geomjax.project_nonholonomic(field.system, x)
        return field.momenta(x), field(x), lda(x), geomjax.nonholonomic_quantities(field.system, x)

    return jax.vmap(one)(xs)


def test_equals_lagrange_dalembert_on_the_constraint_set(case, rng):
    name, model, field = case
    xs = _random_states(model, rng)
    j, x_ext, x_lda, f = _compare_with_lda(field, _lagrange_dalembert(model), xs)
    assert float(jnp.max(jnp.abs(j))) < 1e-12
    np.testing.assert_allclose(np.asarray(x_ext), np.asarray(x_lda), atol=1e-11, rtol=1e-10, err_msg=name)
    # H_ext = H on the constraint set.
    h = jax.vmap(lambda x: model.system.hamiltonian(geomjax.project_nonholonomic(model.system, x)))(xs)
    k = j.shape[1]
    np.testing.assert_allclose(np.asarray(f[:, k]), np.asarray(h), rtol=1e-12, atol=1e-12)


def test_suslov_reduced_field_matches_the_formula_written_out():
    """Π̇ = Π × Ω + λξ with λ = −ξ·I⁻¹(Π × Ω)/(ξ·I⁻¹ξ) on ⟨ξ, Ω⟩ = 0 (ξ not an eigenvector)."""
    inertia = jnp.array([1.0, 2.0, 3.0])
    xi = jnp.array([0.3, 0.5, 0.8])
    system = geomjax.System(
        lambda m: 0.5 * jnp.sum(m**2 / inertia), geomjax.lie_poisson_so3(), nonholonomic=lambda x: xi[None, :]
    )
    field = geomjax.nonholonomic_field(system)
    omega = jnp.array([1.0, 0.4, -(0.3 * 1.0 + 0.5 * 0.4) / 0.8])
    pi = inertia * omega
    cross = jnp.cross(pi, omega)
    lam = -(xi @ (cross / inertia)) / (xi @ (xi / inertia))
    np.testing.assert_allclose(np.asarray(field(pi)), np.asarray(cross + lam * xi), rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(float(field.multipliers(pi)[0]), float(lam), rtol=1e-13)


def test_heisenberg_multiplier_vanishes_everywhere(rng):
    model = models.heisenberg()
    field = geomjax.nonholonomic_field(model.system)
    xs = _random_states(model, rng, scale=1.0)
    lam = jax.vmap(field.multipliers)(xs)
    assert float(jnp.max(jnp.abs(lam))) < 1e-13


# --------------------------------------------------------------------------------------
# Feedback field


def _knife_hand_feedback(model, x0, gains):
    """The knife edge's feedback field worked out by hand (see benchmarks/nonholonomic_vs_hand.py)."""
    pr = model.params
    m, inertia = float(pr["m"]), float(pr["inertia"])
    f = m * float(pr["g"]) * float(np.sin(float(pr["alpha"])))
    k_j, k_h, k_p = gains

    def h_ext(x):
        par = x[3] * jnp.cos(x[2]) + x[4] * jnp.sin(x[2])
        return 0.5 * par**2 / m + 0.5 * x[5] ** 2 / inertia - f * x[0]

    h0, pphi0 = h_ext(x0), x0[5]

    def field(x):
        c, s = jnp.cos(x[2]), jnp.sin(x[2])
        par, perp = x[3] * c + x[4] * s, x[3] * s - x[4] * c
        j, lam = perp / m, -par * x[5] / inertia - f * s
        w_j, w_h, w_p = k_j * j, k_h * (h_ext(x) - h0), k_p * (x[5] - pphi0)
        qdot = jnp.stack([par * c / m + w_h * f, par * s / m, x[5] / inertia - w_j * par / m + w_h * par * perp / m])
        pdot = jnp.stack(
            [
                f + lam * s - w_j * s / m - w_h * par * c / m,
                -lam * c + w_j * c / m - w_h * par * s / m,
                par * perp / m - w_h * x[5] / inertia - w_p,
            ]
        )
        return jnp.concatenate([qdot, pdot])

    return field


def test_feedback_field_equals_knife_edge_by_hand(rng):
    model = models.knife_edge()
    gains = (3.0, 5.0, 7.0)
    y = geomjax.feedback_field(model.system, model.x0, gains=jnp.asarray(gains))
    hand = _knife_hand_feedback(model, model.x0, gains)
    xs = _random_states(model, rng, count=5, scale=0.5)
    np.testing.assert_allclose(np.asarray(jax.vmap(y)(xs)), np.asarray(jax.vmap(hand)(xs)), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "name", ["suslov", "chaplygin_sleigh", pytest.param("roller_racer", marks=pytest.mark.extended), "heisenberg", "suslov_reduced"]
)
def test_feedback_term_is_the_lyapunov_gradient(name, rng):
    """Y = X − ∇V with ∇V·X = 0 (V built from exact first integrals): V̇ = −|∇V|² ≤ 0;
    on the invariant set Y = X."""
    model = MODELS[name]()
    y = geomjax.feedback_field(model.system, model.x0, gains=2.0)
    x = geomjax.nonholonomic_field(model.system)
    np.testing.assert_allclose(np.asarray(y(model.x0)), np.asarray(x(model.x0)), atol=1e-13)

    @jax.jit
    def rates(xs):
        def one(z):
            g = jax.grad(y.lyapunov)(z)
            return g @ y(z), g @ x(z), g @ g, y(z) - x(z) + g

        return jax.vmap(one)(xs)

    xs = _random_states(model, rng, count=4, scale=0.1)
    v_dot, along_x, g2, residual = rates(xs)
    assert float(jnp.max(jnp.abs(residual))) < 1e-10
    assert float(jnp.max(jnp.abs(along_x))) < 1e-10 * (1 + float(jnp.max(g2)))
    np.testing.assert_allclose(np.asarray(v_dot), -np.asarray(g2), rtol=1e-9, atol=1e-12)


def test_feedback_gains_and_start_are_checked():
    model = models.knife_edge()
    with pytest.raises(ValueError, match="one gain per entry"):
        geomjax.feedback_field(model.system, model.x0, gains=[1.0, 2.0])
    with pytest.raises(ValueError, match="non-negative"):
        geomjax.feedback_field(model.system, model.x0, gains=[1.0, -2.0, 1.0])
    off = model.x0.at[3].set(0.5).at[4].set(0.5)  # lateral velocity ≠ 0
    with pytest.raises(ValueError, match="off the constraint set"):
        geomjax.feedback_field(model.system, off, gains=1.0)
    on = geomjax.project_nonholonomic(model.system, off)
    geomjax.feedback_field(model.system, on, gains=1.0)
    sleigh = models.chaplygin_sleigh()
    with pytest.raises(ValueError, match="embedded structure"):
        geomjax.feedback_field(sleigh.system, sleigh.x0, gains=[1.0, 1.0])
    with pytest.raises(ValueError, match="off the constraint set.*embedding defect"):
        geomjax.feedback_field(sleigh.system, sleigh.x0.at[2].set(1.1), gains=1.0)


def test_system_rejects_bad_nonholonomic_input():
    h = lambda x: 0.5 * x[3:] @ x[3:]
    with pytest.raises(ValueError, match="cannot be combined"):
        geomjax.System(h, geomjax.canonical(3), holonomic=lambda q: q @ q - 1.0, nonholonomic=lambda q: q[None, :])
    with pytest.raises(ValueError, match="which coordinates are momenta"):
        geomjax.System(h, geomjax.PoissonStructure(lambda x: jnp.zeros((6, 6))), nonholonomic=lambda x: x[None, :3])
    with pytest.raises(TypeError, match="callable"):
        geomjax.System(h, geomjax.canonical(3), nonholonomic=jnp.ones((1, 3)))
    with pytest.raises(ValueError, match="use geomjax.nonholonomic_field"):
        geomjax.dirac_field(models.knife_edge().system)
    with pytest.raises(ValueError, match="no nonholonomic constraints"):
        geomjax.nonholonomic_field(geomjax.System(h, geomjax.canonical(3)))
    degenerate = geomjax.System(h, geomjax.canonical(3), nonholonomic=lambda q: jnp.stack([q, 2 * q]))
    with pytest.raises(ValueError, match="singular"):
        geomjax.integrate(geomjax.nonholonomic_field(degenerate), jnp.ones(6), dt=0.1, steps=1)


def test_euler_stability_limit_is_reported_as_a_blow_up():
    """Explicit Euler on Y needs h·λ_max(∇²V) < 2; beyond it the run fails with its step."""
    model = models.knife_edge()
    y = geomjax.feedback_field(model.system, model.x0, gains=jnp.array([200.0, 200.0, 200.0]))
    h_max = float(y.euler_step_limit(model.x0))
    assert 1e-4 < h_max < 1.0
    stable = geomjax.integrate(y, model.x0, dt=0.5 * h_max, steps=400, save_every=400)
    assert bool(stable.ok)
    with pytest.raises(geomjax.IntegrationError, match="non-finite") as err:
        geomjax.integrate(y, model.x0, dt=3.0 * h_max, steps=400, save_every=400)
    assert 0 < int(err.value.solution.failed_step) <= 400


# --------------------------------------------------------------------------------------
# Left-trivialised bundles


@pytest.mark.parametrize("structure", [geomjax.left_trivialised_so3(), geomjax.left_trivialised_se2(shape=1)])
def test_bundle_structures_are_antisymmetric(structure, rng):
    x = jnp.asarray(rng.standard_normal(structure.dim))
    b = structure.matrix(x)
    np.testing.assert_allclose(np.asarray(b + b.T), 0.0, atol=1e-14)


def test_free_rigid_body_on_the_bundle_matches_euler_equations():
    """T*SO(3) (R embedded) reduces to so(3)*: Π(t) agrees, R stays orthogonal."""
    inertia = jnp.array([1.0, 2.0, 3.0])
    h = lambda x: 0.5 * jnp.sum(x[-3:] ** 2 / inertia)
    full = geomjax.System(h, geomjax.left_trivialised_so3())
    reduced = geomjax.System(h, geomjax.lie_poisson_so3())
    pi0 = jnp.array([0.4, 1.0, -0.7])
    x0 = jnp.concatenate([jnp.eye(3).reshape(9), pi0])
    xf = jax.jit(lambda x: geomjax.hamiltonian_vector_field(h, full.structure)(x))
    xr = jax.jit(lambda x: geomjax.hamiltonian_vector_field(h, reduced.structure)(x))
    a = geomjax.integrate(xf, x0, dt=0.01, steps=300, method="rk4", save_every=300).xs[-1]
    b = geomjax.integrate(xr, pi0, dt=0.01, steps=300, method="rk4", save_every=300).xs[-1]
    np.testing.assert_allclose(np.asarray(a[9:]), np.asarray(b), atol=1e-9)
    r = a[:9].reshape(3, 3)
    assert float(jnp.max(jnp.abs(r.T @ r - jnp.eye(3)))) < 1e-8


# --------------------------------------------------------------------------------------
# Discrete Lagrange–d'Alembert (McLachlan–Perlmutter)


def _iterate(step, x0, h, n):
    x, status = geomjax.diagnostics.final_state(step, x0, h, n)
    return x, status == geomjax.RESULTS.successful


def test_dla_is_second_order_on_the_contact_oscillator():
    model = models.nonholonomic_oscillator()
    field = geomjax.nonholonomic_field(model.system)
    t_end = 2.0
    ref, _ = _iterate(geomjax.explicit_rk(field, geomjax.RK4), model.x0, jnp.asarray(t_end / 2000), jnp.asarray(2000))
    step = geomjax.dla(model.system)
    hs = np.array([0.1, 0.05, 0.025])
    errs = []
    for h in hs:
        x, ok = _iterate(step, model.x0, jnp.asarray(h), jnp.asarray(int(round(t_end / h))))
        assert bool(ok)
        errs.append(float(jnp.max(jnp.abs(x - ref))))
    order = np.polyfit(np.log(hs), np.log(errs), 1)[0]
    assert abs(order - 2.0) < 0.3, (errs, order)


def test_dla_energy_is_bounded_and_constraint_exact():
    model = models.nonholonomic_oscillator()
    n = 400  # h = 2 sin(π/N), McLachlan–Perlmutter's choice
    h = 2 * np.sin(np.pi / 40)
    sol = geomjax.integrate(geomjax.dla(model.system), model.x0, dt=h, steps=n * 10, save_every=10)
    f = np.asarray(jax.vmap(lambda x: geomjax.nonholonomic_quantities(model.system, x))(sol.xs))
    assert np.abs(f[:, 0]).max() < 1e-12  # J = 0 at every step
    energy_err = np.abs(f[:, 1] - f[0, 1])
    assert energy_err.max() < 2e-2
    windows = energy_err[1:].reshape(4, -1).max(axis=1)
    assert windows[-1] < 1.5 * windows[0] + 1e-12  # no secular drift
    with pytest.raises(ValueError, match="canonical"):
        geomjax.dla(models.suslov(reduced=True).system)
