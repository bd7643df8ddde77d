"""The benchmarks of the original feedback-integrator paper (Chang–Jiménez–Perlmutter 2016):
free rigid body on SO(3) ⊂ R^{3×3}, Kepler and perturbed Kepler problems.

The feedback fields geomjax derives by autodiff from H, the first integrals and the gains
are compared with the fields written by hand as in Bae and Chang's public C++ code
(github.com/johnbae1901/Feedback-Integrator), at random states near the invariant set.
The hand-written fields below are written from those equations, not from geomjax.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import geomjax
from geomjax import models

N_STATES = 8


def _close(a, b, rtol=1e-12):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape
    scale = np.abs(b).max(axis=-1, keepdims=True)
    assert np.all(np.abs(a - b) <= rtol * np.maximum(scale, 1.0)), np.abs(a - b).max()


# ----------------------------------------------------------------------------- Kepler


def kepler_reference(x, mu, k1, k2, l0, a0):
    """Bae–Chang's Kepler feedback field: V = k₁/2‖L − L₀‖² + k₂/2‖A − A₀‖²."""
    r, v = x[:3], x[3:]
    n = jnp.linalg.norm(r)
    ang = jnp.cross(r, v)
    lrl = jnp.cross(v, ang) - mu * r / n
    dl, da = ang - l0, lrl - a0
    grad_r = k1 * jnp.cross(v, dl) + k2 * (jnp.cross(v, jnp.cross(da, v)) - mu * da / n + mu * r * (r @ da) / n**3)
    grad_v = k1 * jnp.cross(dl, r) + k2 * (jnp.cross(ang, da) + jnp.cross(r, jnp.cross(v, da)))
    return jnp.concatenate([v - grad_r, -mu * r / n**3 - grad_v])


def perturbed_reference(x, mu, delta, k_e, k_l, e0, l0):
    """The perturbed-Kepler feedback field (Bae–Chang's fi_rhs with the gain k_L on the
    L terms, as its comment and V = k_E/2(E − E₀)² + k_L/2‖L − L₀‖² state)."""
    r, v = x[:3], x[3:]
    n = jnp.linalg.norm(r)
    du = mu / n**2 + 3.0 * delta / n**4  # U'(r)
    energy = 0.5 * v @ v - mu / n - delta / n**3
    de, dl = energy - e0, jnp.cross(r, v) - l0
    r_dot = v - k_e * de * du * r / n - k_l * jnp.cross(v, dl)
    v_dot = -du * r / n - k_e * de * v - k_l * jnp.cross(dl, r)
    return jnp.concatenate([r_dot, v_dot])


def _near_orbit(model, rng, states_on_orbit, size=1e-2):
    noise = size * rng.standard_normal((N_STATES, model.x0.shape[0]))
    return jnp.asarray(np.asarray(states_on_orbit) + noise)


def _rk4_states(model, t_end=5.0, n=N_STATES):
    """States along a short RK4 run of the Hamiltonian field (on the invariant set)."""
    steps = 500 * n
    sol = geomjax.integrate(geomjax.dirac_field(model.system), model.x0, dt=t_end / steps, steps=steps,
                            save_every=500, method="rk4")
    return np.asarray(sol.xs[1:])


def test_kepler_feedback_field_is_bae_changs(rng):
    model = models.kepler()
    f0 = np.asarray(model.system.conserved_quantities(model.x0))
    y = geomjax.feedback_field(model.system, model.x0, model.gains)
    ts = rng.uniform(0.0, model.period, N_STATES)
    xs = _near_orbit(model, rng, jax.vmap(model.exact)(jnp.asarray(ts)))
    ref = jax.vmap(lambda x: kepler_reference(x, 1.0, 4.0, 2.0, f0[1:4], f0[4:7]))(xs)
    _close(jax.jit(jax.vmap(y))(xs), ref)
    # V has no energy term (gain 0 on H): the Lyapunov function is Bae–Chang's.
    v = jax.vmap(y.lyapunov)(xs)
    d = jax.vmap(model.system.conserved_quantities)(xs) - f0
    _close(v[:, None], (2.0 * jnp.sum(d[:, 1:4] ** 2, axis=1) + jnp.sum(d[:, 4:7] ** 2, axis=1))[:, None])


def test_perturbed_kepler_feedback_field_is_bae_changs(rng):
    model = models.perturbed_kepler()
    f0 = np.asarray(model.system.conserved_quantities(model.x0))
    y = geomjax.feedback_field(model.system, model.x0, model.gains)
    xs = _near_orbit(model, rng, _rk4_states(model))
    ref = jax.vmap(lambda x: perturbed_reference(x, 1.0, 0.0025, 2.0, 3.0, f0[0], f0[1:4]))(xs)
    _close(jax.jit(jax.vmap(y))(xs), ref)


# ----------------------------------------------------------------------------- rigid body


def _hat(w):
    return jnp.array([[0.0, -w[2], w[1]], [w[2], 0.0, -w[0]], [-w[1], w[0], 0.0]])


def rigid_reference(r, omega, inertia, k0, k1, k2, e0, p0):
    """Bae–Chang's rigid-body feedback field on (R, Ω), the gradient taken in (R, Ω):
    V = k₀/4‖RᵀR − I‖² + k₁/2(E − E₀)² + k₂/2‖RIΩ − Π₀‖²."""
    i_omega = inertia * omega
    dp = r @ i_omega - p0
    de = 0.5 * omega @ i_omega - e0
    r_dot = r @ _hat(omega) - (k0 * r @ (r.T @ r - jnp.eye(3)) + k2 * jnp.outer(dp, i_omega))
    omega_dot = jnp.cross(i_omega, omega) / inertia - (k1 * de * i_omega + k2 * inertia * (r.T @ dp))
    return r_dot, omega_dot


def _rigid_states(model, rng):
    """States (R, Π) near the invariant set: R = exp(ŵ)(I + 0.01 noise), Π near Π of x0
    turned by R (so Π_s stays near Π₀) and scaled a little."""
    out = []
    for _ in range(N_STATES):
        w = rng.standard_normal(3)
        rot = np.asarray(jax.scipy.linalg.expm(_hat(jnp.asarray(w))))
        r = rot @ (np.eye(3) + 1e-2 * rng.standard_normal((3, 3)))
        pi = rot.T @ np.asarray(model.x0[9:]) * (1.0 + 1e-2 * rng.standard_normal(3))
        out.append(np.concatenate([r.reshape(9), pi]))
    return jnp.asarray(np.stack(out))


def test_rigid_body_feedback_field_is_bae_changs(rng):
    """With the model's metric diag(1, I²) the derived field is Bae–Chang's, written in
    (R, Π = IΩ): Ṙ the same, Π̇ = IΩ̇. With the identity metric only the Π rows differ,
    by the gradient taken in Π instead of Ω."""
    model = models.rigid_body()
    inertia = np.array([3.0, 2.0, 1.0])
    assert np.allclose(np.asarray(model.params["inertia"]), inertia)
    f0 = np.asarray(model.system.conserved_quantities(model.x0))
    assert np.allclose(f0, [3.0, 3.0, 2.0, 1.0])
    xs = _rigid_states(model, rng)

    def reference(x):
        r, pi = x[:9].reshape(3, 3), x[9:]
        return rigid_reference(r, pi / inertia, inertia, 50.0, 100.0, 50.0, f0[0], f0[1:4])

    r_dot, omega_dot = jax.jit(jax.vmap(reference))(xs)
    paper = geomjax.feedback_field(model.system, model.x0, model.gains, model.metric)
    _close(jax.jit(jax.vmap(paper))(xs), jnp.concatenate([r_dot.reshape(-1, 9), inertia * omega_dot], axis=1))

    # Identity metric: Π̇ = Π × Ω − ∂V/∂Π = Π × Ω − I⁻¹∂V/∂Ω.
    plain = geomjax.feedback_field(model.system, model.x0, model.gains)

    def identity_reference(x):
        r, pi = x[:9].reshape(3, 3), x[9:]
        omega = pi / inertia
        _, free = rigid_reference(r, omega, inertia, 0.0, 0.0, 0.0, f0[0], f0[1:4])
        _, with_v = rigid_reference(r, omega, inertia, 50.0, 100.0, 50.0, f0[0], f0[1:4])
        return inertia * free + (with_v - free) / inertia

    _close(jax.jit(jax.vmap(plain))(xs)[:, 9:], jax.jit(jax.vmap(identity_reference))(xs))
    _close(jax.jit(jax.vmap(plain))(xs)[:, :9], r_dot.reshape(-1, 9))
    # V includes k₀/4‖RᵀR − I‖² (the embedding term, gain last).
    x = xs[0]
    r = x[:9].reshape(3, 3)
    d = np.asarray(model.system.conserved_quantities(x)) - f0
    defect = np.asarray(r.T @ r - jnp.eye(3))
    v = 50.0 / 4 * np.sum(defect**2) + 100.0 / 2 * d[0] ** 2 + 50.0 / 2 * np.sum(d[1:4] ** 2)
    assert np.isclose(float(plain.lyapunov(x)), v, rtol=1e-12)


def test_embedded_unconstrained_gains_need_k0():
    model = models.rigid_body()
    with pytest.raises(ValueError, match="embedded structure.*5 gains"):
        geomjax.feedback_field(model.system, model.x0, gains=[100.0, 50.0, 50.0, 50.0])
    y = geomjax.feedback_field(model.system, model.x0, gains=10.0)  # scalar: k₀ = 10 too
    assert float(y.embedding_gain) == 10.0 and y.gains.shape == (4,)
    # k₀ = 0 drops the embedding term; a zero gain elsewhere is allowed as well.
    y0 = geomjax.feedback_field(model.system, model.x0, gains=[100.0, 0.0, 0.0, 0.0, 0.0])
    x = model.x0.at[0].add(0.01)  # R off SO(3)
    assert float(y0.extra_potential(x)) == 0.0
    assert float(y.extra_potential(x)) > 0.0
    with pytest.raises(ValueError, match="non-negative"):
        geomjax.feedback_field(model.system, model.x0, gains=[100.0, 50.0, 50.0, 50.0, -1.0])


# ----------------------------------------------------------------------------- invariants and exact solutions


@pytest.mark.parametrize("make", [models.rigid_body, models.kepler, models.perturbed_kepler])
def test_integrals_are_kept_by_the_hamiltonian_field(make):
    model = make()
    # h = 2e-3: RK4's own error at the perturbed orbit's periapsis (r = 0.4) is 6e-11.
    sol = geomjax.integrate(geomjax.dirac_field(model.system), model.x0, dt=2e-3, steps=1000, save_every=100,
                            method="rk4")
    f = jax.vmap(model.system.conserved_quantities)(sol.xs)
    assert float(jnp.abs(f - f[0]).max()) < 1e-9
    if model.system.structure.embedded:
        assert float(jax.vmap(lambda x: geomjax.embedding_defect(model.system, x))(sol.xs).max()) < 1e-9


def test_kepler_model_values_and_exact_orbit():
    model = models.kepler()
    assert model.period == pytest.approx(70.24814731, abs=1e-7)
    f0 = np.asarray(model.system.conserved_quantities(model.x0))
    assert np.allclose(f0, [-0.1, 0, 0, 1.8**0.5, 0.8, 0, 0])  # E, L = (0, 0, √1.8), A = (e, 0, 0)
    sol = geomjax.integrate(geomjax.dirac_field(model.system), model.x0, dt=1e-3, steps=10_000, save_every=2500,
                            method="rk4")
    exact = jax.vmap(model.exact)(sol.ts)
    assert float(jnp.abs(sol.xs - exact).max()) < 1e-9
    assert float(jnp.abs(model.exact(model.period) - model.x0).max()) < 1e-12
    pk = models.perturbed_kepler()
    assert np.allclose(np.asarray(pk.x0), [0.4, 0, 0, 0, 2.0, 0])
    assert pk.exact is None and pk.t_final == 200.0


def test_splitting_flows_keep_what_they_should():
    rigid = models.rigid_body()
    r1, r2, r3 = models.rigid_body_flows(rigid)
    f0 = rigid.system.conserved_quantities(rigid.x0)
    errs = []
    for h in (0.02, 0.01):
        sol = geomjax.integrate(geomjax.strang(r3, geomjax.strang(r2, r1)), rigid.x0, dt=h, steps=int(round(2 / h)))
        d = jnp.abs(rigid.system.conserved_quantities(sol.xs[-1]) - f0)
        assert float(d[1:].max()) < 1e-13  # Π_s
        assert float(geomjax.embedding_defect(rigid.system, sol.xs[-1])) < 1e-13
        errs.append(float(d[0]))
    assert 3.0 < errs[0] / errs[1] < 5.0  # energy error O(h²)
    kep = models.kepler()
    drift, kick = models.kepler_flows(kep)
    sol = geomjax.integrate(geomjax.strang(kick, drift), kep.x0, dt=1e-2, steps=7025)
    d = jnp.abs(kep.system.conserved_quantities(sol.xs[-1]) - kep.system.conserved_quantities(kep.x0))
    assert float(d[1:4].max()) < 1e-12 and float(d[0]) < 1e-4
    with pytest.raises(ValueError, match="kepler"):
        models.kepler_flows(rigid)
    with pytest.raises(ValueError, match="rigid_body"):
        models.rigid_body_flows(kep)


# ----------------------------------------------------------------------------- experiment


def test_feedback_paper_experiment_runs(tmp_path):
    from geomjax.experiments import feedback_paper

    setup = feedback_paper.SETUPS["perturbed-kepler"]
    methods = ("feedback Euler", "Stormer-Verlet", "RK4")
    metrics = feedback_paper.run_setup(setup, tmp_path, False, hs=(0.1, 0.01), t_final=2.0, methods=methods)
    rows = {(r["method"], r["h"]): r for r in metrics["summary"]}
    assert rows[("feedback Euler", 0.1)]["status"].startswith("diverged")  # past the step limit
    assert rows[("feedback Euler", 0.01)]["status"] == "ok"
    assert rows[("Stormer-Verlet", 0.01)]["max|dL|"] < 1e-12
    assert rows[("RK4", 0.01)]["max|dE|"] < rows[("feedback Euler", 0.01)]["max|dE|"]
    assert 0.018 < metrics["setup"]["feedback_euler_step_limit_min_along_orbit"] < 0.02
    for name in metrics["figures"]:
        assert (tmp_path / name).stat().st_size > 10_000
