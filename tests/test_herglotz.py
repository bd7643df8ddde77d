"""Discrete Herglotz (contact) and forced discrete Lagrange–d'Alembert steps (seed 002).

The steps are derived by autodiff of the user's L; the maps the seed writes out are
written here by hand, as independent checks, and compared at random states:

- eq. (10): the first-order contact map of the damped oscillator L = v²/2 − q²/2 − αz;
- eq. (7): the forced discrete Euler–Lagrange map of the oscillator with F = −αv. The
  printed eq. (7) reads p_j = (p_{j−1} − h q_{j−1})/(1 + α); the derivation (and the
  seed's own eq. (15), whose damping term is α(x_{j+1} − x_j) with F_d^− = hF(q_j, Δq/h))
  gives 1 + hα. The printed form cannot be right: α is a rate (1/time) and 1 + α is not
  dimensionless, and as h → 0 it damps p by 1/(1 + α) per step, so it does not converge
  to q̈ = −q − αq̇. Checked below;
- eqs. (15) and (18): the Lagrange–d'Alembert and contact maps of the damped Foucault
  pendulum with the nonholonomic constraint (13), solved here as 3 × 3 linear systems in
  (x_{j+1}, y_{j+1}, λ₁).

Then: measured orders on the damped pendulum (a nonlinear contact problem), the
conformal contact property of the map (jacfwd), energy decay at the continuous rate,
constraints kept to the Newton tolerance, gradients against finite differences, and
failures reported with the step.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.tree_util import Partial

import geomjax
from geomjax import diagnostics

ALPHA = 0.3


def oscillator(alpha, q, v, z):
    return 0.5 * v @ v - 0.5 * q @ q - alpha * z


OSC = Partial(oscillator, ALPHA)
HERGLOTZ1 = geomjax.herglotz(OSC, order=1)
HERGLOTZ2 = geomjax.herglotz(OSC, order=2)
LA = geomjax.forced_dla(lambda q, v: 0.5 * v @ v - 0.5 * q @ q, force=lambda q, v, t: -ALPHA * v)

one_step = jax.jit(lambda step, x, h: step(x, h), static_argnums=0)


def test_contact_map_is_seed_eq_10(rng):
    for _ in range(4):
        q, p, z = rng.normal(size=3)
        h = rng.uniform(0.01, 0.3)
        q1 = (1 - h**2 / 2) * q + h * (1 - h * ALPHA) * p
        p1 = (1 - h * ALPHA) * p - h / 2 * (q1 + q)
        v = (q1 - q) / h
        z1 = z + h * (0.5 * v * v - 0.25 * (q * q + q1 * q1) - ALPHA * z)  # L_d of VBS
        out = one_step(HERGLOTZ1, jnp.array([q, p, z]), h)
        np.testing.assert_allclose(out, [q1, p1, z1], rtol=1e-14, atol=1e-15)


def test_symmetric_contact_map_of_the_oscillator(rng):
    # L_d = h/2 [L(q₀, v, z₀) + L(q₁, v, z₁)]: p₀(1 − hα/2) = v + hq₀/2, p₁ = (v − hq₁/2)/(1 + hα/2)
    for _ in range(4):
        q, p, z = rng.normal(size=3)
        h = rng.uniform(0.01, 0.3)
        q1 = (h - 0.5 * h * h * ALPHA) * p + (1 - 0.5 * h * h) * q
        p1 = ((1 - 0.5 * h * ALPHA) * p - 0.5 * h * (q + q1)) / (1 + 0.5 * h * ALPHA)
        v = (q1 - q) / h
        # z₁ − z₀ = h/2 [L₀ + L₁] with L linear in z: solved for z₁ by hand
        rest = 0.5 * h * (v * v - 0.5 * (q * q + q1 * q1))
        z1 = (z * (1 - 0.5 * h * ALPHA) + rest) / (1 + 0.5 * h * ALPHA)
        out = one_step(HERGLOTZ2, jnp.array([q, p, z]), h)
        np.testing.assert_allclose(out, [q1, p1, z1], rtol=1e-13, atol=1e-14)


def test_forced_dla_is_seed_eq_7_with_one_plus_h_alpha(rng):
    for _ in range(4):
        q, p = rng.normal(size=2)
        h = rng.uniform(0.01, 0.3)
        p1 = (p - h * q) / (1 + h * ALPHA)
        out = one_step(LA, jnp.array([q, p]), h)
        np.testing.assert_allclose(out, [q + h * p1, p1], rtol=1e-14, atol=1e-15)
        printed = (p - h * q) / (1 + ALPHA)  # the seed's typeset eq. (7)
        assert abs(float(out[1]) - printed) > 0.1 * ALPHA * abs(printed) * (1 - h)


# ---- damped Foucault pendulum (seed 002 §3.2) ----------------------------------------

M, ELL, G = 28.0, 67.0, 9.81
RATE = 7.292e-5 * np.sin(np.deg2rad(49.0)) * 1e3  # Ω sin β, scaled up so the constraint acts
DAMP = 1e-2
FOUCAULT_C = geomjax.VelocityConstraint(lambda q, v: -q[1] * v[0] + q[0] * v[1] + RATE * (q @ q))


def foucault(alpha, q, v, z):
    return 0.5 * M * v @ v - 0.5 * M * G / ELL * q @ q - alpha * z


FOUCAULT_CONTACT = geomjax.herglotz(Partial(foucault, DAMP), order=1, nonholonomic=FOUCAULT_C)
FOUCAULT_LA = geomjax.forced_dla(
    lambda q, v: 0.5 * M * v @ v - 0.5 * M * G / ELL * q @ q,
    force=lambda q, v, t: -DAMP * M * v,
    nonholonomic=FOUCAULT_C,
)


def _solve_seed(qm, q, h, contact: bool):
    """(x_{j+1}, y_{j+1}) from seed 002 eq. (18) (contact) or eq. (15) (LA), by hand."""
    x, y = q
    xm, ym = qm
    w = G / ELL
    if contact:  # eq. (18), multiplied by h²
        a = np.array([[-1.0, 0.0, h * h * y / M], [0.0, -1.0, -h * h * x / M], [-y / h, x / h, 0.0]])
        bx = 2 * x - xm - h * h * w * x - DAMP * h * h * ((x - xm) / h - h / 2 * w * x)
        by = 2 * y - ym - h * h * w * y - DAMP * h * h * ((y - ym) / h - h / 2 * w * y)
    else:  # eq. (15), multiplied by h
        a = np.array([[-1.0 - DAMP * h, 0.0, h * y / M], [0.0, -1.0 - DAMP * h, -h * x / M], [-y / h, x / h, 0.0]])
        bx = 2 * x - xm - h * h * w * x + DAMP * h * x
        by = 2 * y - ym - h * h * w * y + DAMP * h * y
    bc = RATE * (x * x + y * y)  # −y(x_{j+1} − x)/h + x(y_{j+1} − y)/h + Ω sin β |q|²: the constant part
    sol = np.linalg.solve(a, -np.array([bx, by, bc]))
    return sol[:2]


@pytest.mark.parametrize("contact", [True, False], ids=["contact-eq18", "lagrange-dalembert-eq15"])
def test_foucault_maps_are_seed_eqs_15_and_18(rng, contact):
    step = FOUCAULT_CONTACT if contact else FOUCAULT_LA
    for _ in range(3):
        h = rng.uniform(0.05, 0.2)
        q0 = rng.normal(size=2) * 0.5
        p0 = rng.normal(size=2) * M * 0.1
        x0 = np.concatenate([q0, p0, [rng.normal()]]) if contact else np.concatenate([q0, p0])
        x1 = one_step(step, jnp.asarray(x0), h)  # q_j from (q_{j−1}, p_{j−1})
        x2 = one_step(step, x1, h)  # q_{j+1} from the derived map
        expected = _solve_seed(q0, np.asarray(x1[:2]), h, contact)
        np.testing.assert_allclose(x2[:2], expected, rtol=1e-12, atol=1e-13)


def test_nonholonomic_steps_keep_the_discrete_constraint():
    # Seed 002's start: q(0) = (0.67, 0), q̇(0) = 0 (off the continuous constraint, whose
    # affine part is Ω sin β |q|² ≠ 0); every later pair (q_k, q_{k+1}) keeps Φ_d = 0.
    h = 0.1
    for step, x0 in (
        (FOUCAULT_CONTACT, jnp.array([0.67, 0.0, 0.0, 0.0, 0.0])),
        (FOUCAULT_LA, jnp.array([0.67, 0.0, 0.0, 0.0])),
    ):
        energies = []
        for k in (0, 37, 150):
            xk, status = diagnostics.final_state(step, x0, h, k)
            x1, status1 = diagnostics.final_state(step, xk, h, 1)
            assert bool(status == geomjax.RESULTS.successful) and bool(status1 == geomjax.RESULTS.successful)
            q, q1 = np.asarray(xk[:2]), np.asarray(x1[:2])
            v = (q1 - q) / h
            phi = -q[1] * v[0] + q[0] * v[1] + RATE * (q @ q)
            assert abs(phi) <= 1e-14 * (1.0 + np.abs(v).max()), (k, phi)
            energies.append(0.5 * np.sum(np.asarray(xk[2:4]) ** 2) / M + 0.5 * M * G / ELL * (q @ q))
        assert energies[2] < energies[1] < energies[0]  # dissipation


# ---- orders, contact structure, energy decay on the damped pendulum -------------------

PENDULUM_ALPHA = 0.5


def damped_pendulum(alpha, q, v, z):
    return 0.5 * v @ v + jnp.cos(q[0]) - alpha * z


PENDULUM = Partial(damped_pendulum, PENDULUM_ALPHA)
X0P = jnp.array([1.2, 0.3, 0.1])
STEPS = {
    "herglotz1": (geomjax.herglotz(PENDULUM, order=1), 1),
    "herglotz2": (geomjax.herglotz(PENDULUM, order=2), 2),
    "la-left": (
        geomjax.forced_dla(lambda q, v: 0.5 * v @ v + jnp.cos(q[0]), force=lambda q, v, t: -PENDULUM_ALPHA * v),
        1,
    ),
    "la-midpoint": (
        geomjax.forced_dla(
            lambda q, v: 0.5 * v @ v + jnp.cos(q[0]), force=lambda q, v, t: -PENDULUM_ALPHA * v, rule="midpoint"
        ),
        2,
    ),
}


def _pendulum_reference():
    """x(1) of the contact field of L (Legendre transform by autodiff), RK4 with 1000 steps."""
    field = geomjax.contact_field(geomjax.ContactLagrangianSystem(PENDULUM, 1))
    x, status = diagnostics.final_state(geomjax.explicit_rk(field, geomjax.RK4), X0P, 1e-3, 1000)
    assert bool(status == geomjax.RESULTS.successful)
    return np.asarray(x)


@pytest.fixture(scope="module")
def reference():
    return _pendulum_reference()


@pytest.mark.parametrize("name", sorted(STEPS))
def test_measured_order_on_the_damped_pendulum(name, reference):
    step, order = STEPS[name]
    ns = (10, 20, 40, 80)
    if name.startswith("la"):
        x0, ref = X0P[:2], reference[:2]
    else:
        x0, ref = X0P, reference
    errors = diagnostics.global_errors(step, x0, 1.0, ns, ref)
    fit = diagnostics.convergence_order([1.0 / n for n in ns], errors)
    assert abs(fit.order - order) <= 0.3, (name, fit)


def _contact_defect(step, x, h, kernel=None):
    """‖e(Φ(x))·DΦ − ρ e(x)‖ for the contact form e = dz − p·dq, ρ its dz coefficient;
    with `kernel` (a basis of admissible δq), on those tangent vectors only."""
    defect, rho = _defect_parts(step, x, jnp.asarray(h), kernel)
    return float(defect), float(rho)


@eqx.filter_jit
def _defect_parts(step, x, h, kernel):
    n = (x.shape[0] - 1) // 2
    jac = jax.jacfwd(lambda y: step(y, h))(x)
    y = step(x, h)

    def form(s):
        return jnp.concatenate([-s[n : 2 * n], jnp.zeros(n), jnp.ones(1)])

    pulled = form(y) @ jac
    rho = pulled[-1]
    defect = pulled - rho * form(x)
    if kernel is not None:
        basis = jnp.zeros((x.shape[0], kernel.shape[1] + n + 1))
        basis = basis.at[:n, : kernel.shape[1]].set(kernel).at[n:, kernel.shape[1] :].set(jnp.eye(n + 1))
        defect = defect @ basis
    return jnp.max(jnp.abs(defect)), rho


def test_conformal_contact_structure(rng):
    # ρ = (1 + D₃L_d)/(1 − D₄L_d): 1 − hα for order 1 (z at the left end), and
    # (1 − hα/2)/(1 + hα/2) for order 2, for L linear in z with coefficient −α.
    h, a = 0.1, PENDULUM_ALPHA
    for name, expected in (("herglotz1", 1 - h * a), ("herglotz2", (1 - h * a / 2) / (1 + h * a / 2))):
        for _ in range(2):
            defect, rho = _contact_defect(STEPS[name][0], jnp.asarray(rng.normal(size=3)), h)
            assert defect < 1e-14, (name, defect)
            assert abs(rho - expected) < 1e-15, (name, rho, expected)
    # nonholonomic: conformally contact on admissible variations δq ∈ ker α(q₀) only
    x = jnp.array([0.4, -0.3, 1.1, 0.7, 0.2])
    kernel = jnp.array([[0.4], [-0.3]])  # α(q) = (−y, x) annihilates (x, y)
    defect, _ = _contact_defect(FOUCAULT_CONTACT, x, h, kernel)
    assert defect < 1e-12 * M, defect
    full, _ = _contact_defect(FOUCAULT_CONTACT, x, h)
    assert full > 1e-6  # the multiplier force breaks it off ker α


def test_energy_decays_at_the_continuous_rate():
    # H = p²/2 − cos q + αz satisfies dH/dt = −αH: H(t) = H(0) e^{−αt}; the discrete
    # energy at t = 10 follows to O(h) (order 1) and O(h²) (order 2).
    x0 = jnp.array([1.0, 0.0, 0.0])
    energy0 = -np.cos(1.0)
    for name, ratio in (("herglotz1", 2.0), ("herglotz2", 4.0)):
        errs = []
        for h, steps in ((0.1, 100), (0.05, 200)):
            x, status = diagnostics.final_state(STEPS[name][0], x0, h, steps)
            assert bool(status == geomjax.RESULTS.successful)
            q, p, z = np.asarray(x)
            energy = 0.5 * p * p - np.cos(q) + PENDULUM_ALPHA * z
            errs.append(abs(energy - energy0 * np.exp(-PENDULUM_ALPHA * 10.0)))
        assert abs(errs[0] / errs[1] / ratio - 1) < 0.2, (name, errs)


# ---- gradients ------------------------------------------------------------------------


def _objective(kind):
    def run(x0, alpha, h):
        if kind == "la":
            step = geomjax.forced_dla(
                lambda q, v: 0.5 * v @ v + jnp.cos(q[0]), force=Partial(lambda a, q, v, t: -a * v, alpha)
            )
        elif kind == "nonholonomic":
            step = geomjax.herglotz(Partial(foucault, alpha), order=1, nonholonomic=FOUCAULT_C)
        else:
            step = geomjax.herglotz(Partial(damped_pendulum, alpha), order=int(kind[-1]))
        sol = geomjax.integrate(step, x0, dt=h, steps=12, save_every=12, throw=False, start_tol=None)
        return jnp.sum(sol.xs[-1] * jnp.arange(1.0, x0.shape[0] + 1.0))

    return run


@pytest.mark.parametrize("kind", ["herglotz1", "herglotz2", "la", "nonholonomic"])
def test_gradients_match_finite_differences(kind):
    f = _objective(kind)
    x0 = {"la": X0P[:2], "nonholonomic": jnp.array([0.67, 0.1, 0.5, -0.3, 0.0])}.get(kind, X0P)
    alpha, h = (2.0 if kind == "nonholonomic" else PENDULUM_ALPHA), 0.1
    # one compilation: finite differences from the value of the same compiled function
    value_and_grad = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))
    grads = value_and_grad(x0, alpha, h)[1]

    def value(*a):
        return value_and_grad(*a)[0]

    eps = 1e-6
    d = jnp.linspace(0.3, -0.5, x0.shape[0])
    fd_x = (value(x0 + eps * d, alpha, h) - value(x0 - eps * d, alpha, h)) / (2 * eps)
    fd_a = (value(x0, alpha + eps, h) - value(x0, alpha - eps, h)) / (2 * eps)
    fd_h = (value(x0, alpha, h + eps) - value(x0, alpha, h - eps)) / (2 * eps)
    scale = 1.0 + abs(float(value(x0, alpha, h)))
    np.testing.assert_allclose(float(grads[0] @ d), float(fd_x), rtol=1e-6, atol=1e-7 * scale)
    np.testing.assert_allclose(float(grads[1]), float(fd_a), rtol=1e-6, atol=1e-7 * scale)
    np.testing.assert_allclose(float(grads[2]), float(fd_h), rtol=1e-6, atol=1e-7 * scale)


# ---- failures and bad input -----------------------------------------------------------


def test_newton_failure_is_reported_with_the_step():
    # a kinetic energy not quadratic in v: the step's equations are not affine, so Newton
    # iterates (for PENDULUM itself they are solved by two linear solves, see below)
    quartic = lambda q, v, z: 0.5 * v @ v + (v @ v) ** 2 / 12 + jnp.cos(q[0]) - 0.5 * z  # noqa: E731
    step = geomjax.herglotz(quartic, order=2, newton=geomjax.Newton(max_steps=1))
    sol = geomjax.integrate(step, X0P, dt=0.1, steps=5, throw=False)
    assert bool(sol.result == geomjax.RESULTS.newton_failed)
    assert int(sol.failed_step) == 1
    with pytest.raises(geomjax.IntegrationError, match="Newton"):
        geomjax.integrate(step, X0P, dt=0.1, steps=5)


def test_affine_equations_are_solved_without_newton():
    # Read off the jaxpr: the oscillator's and Foucault's equations are affine in (v, λ)
    # (one linear solve); order 2 of a z-linear L, affine in (v, λ) then in w (two
    # solves); a non-quadratic L, or the midpoint rule of the pendulum, needs Newton.
    # The Newton settings are then not used: max_steps=1 cannot fail.
    from geomjax._step import variational

    plans = []
    original = variational._solve_plan

    def spy(*args):
        plans.append(original(*args))
        return plans[-1]

    variational._solve_plan = spy
    try:
        strict = geomjax.Newton(max_steps=1)
        x_osc, x_fou = jnp.array([0.3, 0.2, 0.0]), jnp.array([0.4, 0.1, 0.2, 0.3, 0.0])
        cases = (
            (geomjax.herglotz(OSC, order=1, newton=strict), x_osc, "affine"),
            (geomjax.herglotz(OSC, order=2, newton=strict), x_osc, "staged"),
            (geomjax.herglotz(PENDULUM, order=2, newton=strict), X0P, "staged"),
            (geomjax.herglotz(Partial(foucault, DAMP), order=1, nonholonomic=FOUCAULT_C, newton=strict), x_fou, "affine"),
            (geomjax.forced_dla(LA.discrete.lagrangian, LA.force, newton=strict), x_osc[:2], "affine"),
            (STEPS["la-midpoint"][0], X0P[:2], "newton"),
        )
        for step, x0, expected in cases:
            plans.clear()
            jax.eval_shape(lambda x: step(x, 0.1), x0)  # decided when the step is traced
            assert plans == [expected], (expected, plans)
        # the linear solves agree with Newton's method on the same equations
        step, x0, _ = cases[3]
        solved = one_step(step, x0, 0.1)
        variational._solve_plan = lambda *args: "newton"
        fresh = geomjax.Newton(rtol=1e-14, atol=1e-14)  # a new static argument: traced again
        iterated = one_step(
            geomjax.herglotz(Partial(foucault, DAMP), order=1, nonholonomic=FOUCAULT_C, newton=fresh), x0, 0.1
        )
        np.testing.assert_allclose(solved, iterated, rtol=1e-13, atol=1e-15)
    finally:
        variational._solve_plan = original


def test_bad_input_is_a_clear_error():
    # singular ∂²L/∂v² at the start (the mass vanishes at q = 0)
    step = geomjax.herglotz(lambda q, v, z: 0.5 * (q @ q) * (v @ v) - z)
    with pytest.raises(ValueError, match="∂²L/∂v² is singular at x0"):
        geomjax.integrate(step, jnp.array([0.0, 0.0, 1.0, 1.0, 0.0]), dt=0.1, steps=2)
    # a constraint not affine in v
    step = geomjax.herglotz(OSC, nonholonomic=geomjax.VelocityConstraint(lambda q, v: v[0] ** 2 - v[1]))
    with pytest.raises(ValueError, match="not affine"):
        geomjax.integrate(step, jnp.array([0.1, 0.2, 0.3, 0.4, 0.0]), dt=0.1, steps=2)
    # the state layout
    with pytest.raises(ValueError, match="2n \\+ 1"):
        geomjax.integrate(HERGLOTZ1, jnp.array([0.1, 0.2]), dt=0.1, steps=2)
    with pytest.raises(ValueError, match="order must be 1 or 2"):
        geomjax.herglotz(OSC, order=3)
    with pytest.raises(TypeError, match="forced_dla"):
        geomjax.herglotz(geomjax.LagrangianSystem(lambda q, v: 0.5 * v @ v, 1))


def test_user_discretizing_map_and_systems(rng):
    # a callable Ψ equal to the left rectangle gives the "left" rule's map
    lag = lambda q, v: 0.5 * v @ v + jnp.cos(q[0])  # noqa: E731
    left = geomjax.forced_dla(lag, rule=lambda q0, q1, h: (q0, (q1 - q0) / h))
    named = geomjax.forced_dla(lag, rule="left")
    x = jnp.asarray(rng.normal(size=2))
    np.testing.assert_allclose(one_step(left, x, 0.1), one_step(named, x, 0.1), rtol=1e-15)
    # a ContactLagrangianSystem carries its constraint into herglotz
    system = geomjax.ContactLagrangianSystem(FOUCAULT_CONTACT.discrete.lagrangian, 2, nonholonomic=FOUCAULT_C)
    step = geomjax.herglotz(system)
    assert step.constraint is FOUCAULT_C and step.discrete == FOUCAULT_CONTACT.discrete
    assert step.dim == 5 and FOUCAULT_CONTACT.dim is None
    with pytest.raises(ValueError, match="already has nonholonomic"):
        geomjax.herglotz(system, nonholonomic=FOUCAULT_C)


def test_nonholonomic_order_two_positions_on_a_damped_knife_edge():
    # Constraint sin φ ẋ − cos φ ẏ = 0 (never degenerate, unlike the Foucault constraint
    # at q = 0). Positions of order=2 converge at order 2 (self-convergence against the
    # same step at h/32); the momenta p_k = D₂L_d are first order (see `herglotz`).
    forms = lambda q: jnp.stack([jnp.sin(q[2]), -jnp.cos(q[2]), 0.0 * q[2]])[None]  # noqa: E731
    lag = lambda q, v, z: 0.5 * v @ v + 4.9 * q[0] + jnp.cos(q[2]) - 0.3 * z  # noqa: E731
    step = geomjax.herglotz(lag, order=2, nonholonomic=forms)
    x0 = jnp.array([0.0, 0.0, 0.3, 0.0, 0.0, 2.0, 0.0])
    fine, _ = diagnostics.final_state(step, x0, 1.0 / 1280, 1280)
    ns = (10, 20, 40)
    finals = [np.asarray(diagnostics.final_state(step, x0, 1.0 / n, n)[0]) for n in ns]
    errors_q = [np.max(np.abs(x[:3] - np.asarray(fine[:3]))) for x in finals]
    errors_p = [np.max(np.abs(x[3:6] - np.asarray(fine[3:6]))) for x in finals]
    hs = [1.0 / n for n in ns]
    assert abs(diagnostics.convergence_order(hs, errors_q).order - 2.0) <= 0.3, errors_q
    assert abs(diagnostics.convergence_order(hs, errors_p).order - 1.0) <= 0.3, errors_p
