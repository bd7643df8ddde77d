"""Chang and Perlmutter's (2019) nonholonomic systems on Lie groups and trivial bundles: the Suslov problem on
SO(3), the Chaplygin sleigh on SE(2), the roller racer on SE(2) × S¹.

The group is embedded in Euclidean space (R ∈ R^{3×3}; SE(2) as (x, y, cos θ, sin θ)) with
the left-trivialised structures `geomjax.left_trivialised_so3/se2`; the constraints are
one-forms acting on the body velocity ∂H/∂μ. The feedback Lyapunov function gets the
extra term k₀/4‖D‖² (D = RᵀR − I or cos² + sin² − 1), so `quantity_names` ends with the
embedding defect and one gain per name is expected. Parameters are our choices where
the paper's were lost (stated in each docstring).
"""

import functools
import numpy as np
import jax
import jax.numpy as jnp
from jax.tree_util import Partial

from .._system.bundles import left_trivialised_se2, left_trivialised_so3
from .._system.structures import lie_poisson_so3
from .._system.system import System
from ._model import Model, model_params as _params




def _hat(w):
    z = jnp.zeros_like(w[0])
    return jnp.stack([jnp.stack([z, -w[2], w[1]]), jnp.stack([w[2], z, -w[0]]), jnp.stack([-w[1], w[0], z])])


def _rotation(w):
    """exp(ŵ) by Rodrigues' formula (smooth at w = 0)."""
    th2 = w @ w
    th = jnp.sqrt(jnp.where(th2 > 0, th2, 1.0))
    a = jnp.where(th2 > 1e-12, jnp.sin(th) / th, 1.0 - th2 / 6.0)
    b = jnp.where(th2 > 1e-12, (1.0 - jnp.cos(th)) / jnp.where(th2 > 0, th2, 1.0), 0.5 - th2 / 24.0)
    k = _hat(w)
    return jnp.eye(3) + a * k + b * (k @ k)


# --------------------------------------------------------------------------------------
# Suslov problem


def _rigid_energy(inertia, pi):
    return 0.5 * (pi[0] ** 2 / inertia[0] + pi[1] ** 2 / inertia[1] + pi[2] ** 2 / inertia[2])


def _suslov_hamiltonian(pr, x):
    return _rigid_energy(pr["inertia"], x[-3:])


def _suslov_forms(pr, arg):
    return pr["xi"][None, :]


def _suslov_exact(pr, x0, reduced, t):
    pi0 = x0[-3:]
    if reduced:
        return pi0 + 0.0 * t
    omega = pi0 / pr["inertia"]
    r = x0[:9].reshape(3, 3) @ _rotation(t * omega)
    return jnp.concatenate([r.reshape(9), pi0 + 0.0 * t])


def suslov(inertia=(1.0, 2.0, 3.0), xi=(0.0, 0.0, 1.0), omega0=(1.0, 1.0, 0.0), reduced=False) -> Model:
    """The Suslov problem (Chang and Perlmutter (2019) §3.1): a rigid body with ⟨ξ, Ω⟩ = 0 for a body-fixed ξ.

    Π̇ = Π × Ω + λξ, Ṙ = RΩ̂, Ω = I⁻¹Π, H = ½Π·I⁻¹Π; the constraint one-form ξ acts on the
    velocity ∂H/∂Π = Ω. With `reduced=False` the state is (R, Π) on T*SO(3) with R embedded
    in R^{3×3} (`geomjax.left_trivialised_so3`), flat (R.ravel(), Π), and the feedback term
    k₀/4‖RᵀR − I‖²; with `reduced=True` it is Π on so(3)* (`geomjax.lie_poisson_so3`).

    Defaults (ours): I = diag(1, 2, 3), ξ = e₃ (an eigenvector of I), Ω₀ = (1, 1, 0), R₀ = I.
    When ξ is an eigenvector of I and Ω₀ ⊥ ξ, λ = −(ξ·(Π × Ω)) keeps Ω constant: the body
    spins uniformly, R(t) = R₀ exp(tΩ̂₀) — `exact`. For other ξ `exact` is None.

    `quantity_names`: ("J", "H", "RtR-I") (full) or ("J", "H") (reduced).

    Example:

    ```python
    model = geomjax.models.suslov(reduced=True)
    X = geomjax.nonholonomic_field(model.system)
    sol = geomjax.integrate(X, model.x0, dt=1e-2, steps=1000, method="rk4")
    ```
    """
    pr = _params(inertia=inertia, xi=xi)
    om0 = jnp.asarray(omega0, jnp.float64)
    pi0 = pr["inertia"] * om0
    xi_n, inertia_n, om_n = np.asarray(xi, float), np.asarray(inertia, float), np.asarray(omega0, float)
    if abs(xi_n @ om_n) > 1e-12 * (1 + np.abs(om_n).max()):
        raise ValueError(f"omega0 must satisfy the constraint ⟨ξ, Ω₀⟩ = 0; got {xi_n @ om_n:.3g}")
    eigen = np.allclose(inertia_n * xi_n, (xi_n @ (inertia_n * xi_n)) / (xi_n @ xi_n) * xi_n)
    forms = Partial(_suslov_forms, pr)
    if reduced:
        system = System(Partial(_suslov_hamiltonian, pr), lie_poisson_so3(), nonholonomic=forms)
        x0, names = pi0, ("J", "H")
    else:
        system = System(Partial(_suslov_hamiltonian, pr), left_trivialised_so3(), nonholonomic=forms)
        x0, names = jnp.concatenate([jnp.eye(3).reshape(9), pi0]), ("J", "H", "RtR-I")
    exact = Partial(_suslov_exact, pr, x0, reduced) if eigen else None
    return Model("suslov_reduced" if reduced else "suslov", system, pr, x0, names, exact)


# --------------------------------------------------------------------------------------
# Chaplygin sleigh


def _sleigh_hamiltonian(pr, x):
    mt, mx, my = x[4], x[5], x[6]
    return 0.5 * mx**2 / pr["m"] + 0.5 * (mt - pr["a"] * my) ** 2 / pr["inertia"] + 0.5 * my**2 / pr["m"]


def _lateral_velocity(g):
    return jnp.stack([jnp.zeros_like(g[0]), jnp.zeros_like(g[0]), jnp.ones_like(g[0])])[None, :]


# Gauss–Legendre quadrature for the sleigh's position: 64 panels of 12 nodes.
_GL_ORDER = 12
_GL_PANELS = 64


@functools.cache
def _gauss_legendre():
    # Computed on first use: importing numpy.polynomial would slow `import geomjax`.
    return np.polynomial.legendre.leggauss(_GL_ORDER)


def _gd(u):
    return 2.0 * jnp.arctan(jnp.tanh(0.5 * u))


def _sleigh_body(pr, x0, t):
    """(v, ω, θ) at time t on the exact solution."""
    m, ic = pr["m"], pr["inertia"] + pr["m"] * pr["a"] ** 2
    om0 = (x0[4] - pr["a"] * x0[6]) / pr["inertia"]
    v0 = x0[5] / m
    energy = 0.5 * (m * v0**2 + ic * om0**2)
    vinf = jnp.sqrt(2.0 * energy / m)
    k = pr["a"] * m * vinf / ic
    c = jnp.arctanh(v0 / vinf)
    amp = jnp.sign(om0) * jnp.sqrt(m / ic) * vinf
    u = k * t + c
    theta0 = jnp.arctan2(x0[3], x0[2])
    return vinf * jnp.tanh(u), amp / jnp.cosh(u), theta0 + amp / k * (_gd(u) - _gd(c))


def _sleigh_exact(pr, x0, t):
    v, om, th = _sleigh_body(pr, x0, t)
    # Position: ∫ v (cos θ, sin θ) dt by composite Gauss–Legendre (error at round-off level).
    edges = jnp.linspace(0.0, 1.0, _GL_PANELS + 1) * t
    mid, half = 0.5 * (edges[1:] + edges[:-1]), 0.5 * (edges[1:] - edges[:-1])
    nodes, weights = _gauss_legendre()
    s = (mid[:, None] + half[:, None] * jnp.asarray(nodes)[None, :]).reshape(-1)
    w = (half[:, None] * jnp.asarray(weights)[None, :]).reshape(-1)
    vs, _, ths = jax.vmap(lambda ss: _sleigh_body(pr, x0, ss))(s)
    x = x0[0] + jnp.sum(w * vs * jnp.cos(ths))
    y = x0[1] + jnp.sum(w * vs * jnp.sin(ths))
    m, a = pr["m"], pr["a"]
    ic = pr["inertia"] + m * a**2
    return jnp.stack([x, y, jnp.cos(th), jnp.sin(th), ic * om, m * v, m * a * om])


def chaplygin_sleigh(m=1.0, inertia=1.0, a=1.0, v0=1.0, omega0=1.0, theta0=0.0) -> Model:
    """The Chaplygin sleigh (Chang and Perlmutter (2019) §3.3; Bloch §1.7) on SE(2) with (cos θ, sin θ) embedded.

    State (x, y, cos θ, sin θ, μ_θ, μ_x, μ_y): contact point, heading, body momenta; the
    centre of mass lies a distance a ahead of the blade, mass m, inertia J about the centre
    of mass. Body velocities ξ = (ω, v_x, v_y) = ∂H/∂μ, H = ½[m v_x² + m(v_y + aω)² + Jω²]
    = μ_x²/2m + (μ_θ − aμ_y)²/2J + μ_y²/2m; constraint v_y = 0 (no side slip), the one-form
    (0, 0, 1). On the constraint v̇ = aω², (J + ma²)ω̇ = −mavω, with the exact solution
    v = V∞ tanh(kt + c), ω = sign(ω₀)√(m/I_c)V∞ sech(kt + c), I_c = J + ma²,
    V∞ = √(2E/m), k = amV∞/I_c, c = artanh(v₀/V∞); θ follows in closed form and (x, y) by
    Gauss–Legendre quadrature (`exact`).

    Defaults (ours): m = J = a = 1, v₀ = ω₀ = 1, starting at the origin heading along x.

    `quantity_names = ("J", "H", "c2+s2-1")`.

    Example:

    ```python
    model = geomjax.models.chaplygin_sleigh()
    Y = geomjax.feedback_field(model.system, model.x0, gains=10.0)
    sol = geomjax.integrate(Y, model.x0, dt=1e-3, steps=5000, save_every=50)
    ```
    """
    pr = _params(m=m, inertia=inertia, a=a)
    v0, om0, th0 = (jnp.asarray(v, jnp.float64) for v in (v0, omega0, theta0))
    ic = pr["inertia"] + pr["m"] * pr["a"] ** 2
    zero = jnp.zeros((), jnp.float64)
    x0 = jnp.stack([zero, zero, jnp.cos(th0), jnp.sin(th0), ic * om0, pr["m"] * v0, pr["m"] * pr["a"] * om0])
    system = System(Partial(_sleigh_hamiltonian, pr), left_trivialised_se2(), nonholonomic=_lateral_velocity)
    return Model("chaplygin_sleigh", system, pr, x0, ("J", "H", "c2+s2-1"), Partial(_sleigh_exact, pr, x0))


# --------------------------------------------------------------------------------------
# Roller racer


def _racer_hamiltonian(pr, x):
    mt, mx, my, pf = x[5], x[6], x[7], x[8]
    return 0.5 * (mx**2 + my**2) / pr["m"] + 0.5 * (mt - pf) ** 2 / pr["inertia1"] + 0.5 * pf**2 / pr["inertia2"]


def _racer_forms(pr, g):
    phi = g[4]
    zero, one = jnp.zeros_like(phi), jnp.ones_like(phi)
    return jnp.stack(
        [
            jnp.stack([zero, zero, one, zero]),
            jnp.stack([-(pr["d1"] * jnp.cos(phi) + pr["d2"]), jnp.sin(phi), zero, -pr["d2"] * one]),
        ]
    )


def roller_racer(m=1.0, inertia1=1.0, inertia2=0.5, d1=1.0, d2=0.5, phi0=0.5, omega0=0.3, phi_dot0=0.5) -> Model:
    """The roller racer (Chang and Perlmutter (2019) §3.5; Bloch pp. 42–43, 386–387) on SE(2) × S¹.

    Two planar bodies joined at a pivot, each on a pair of wheels that cannot slip
    sideways. Configuration: the first body's axle centre (x, y) and heading θ (embedded as
    cos θ, sin θ) and the joint angle φ (a shape coordinate); momenta μ = (μ_θ, μ_x, μ_y)
    and p_φ. Body velocities (ω, v_x, v_y, φ̇) = ∂H/∂(μ, p_φ) with the kinetic energy
    ½m(v_x² + v_y²) + ½I₁ω² + ½I₂(ω + φ̇)², i.e. H = (μ_x² + μ_y²)/2m + (μ_θ − p_φ)²/2I₁ +
    p_φ²/2I₂. Constraints: v_y = 0 and v_x sin φ = (d₁ cos φ + d₂)ω + d₂φ̇ (the second axle,
    d₁ ahead of the first axle to the pivot and d₂ beyond it, does not slip).

    Defaults (ours): m = I₁ = 1, I₂ = 0.5, d₁ = 1, d₂ = 0.5, φ₀ = 0.5, ω₀ = 0.3,
    φ̇₀ = 0.5 (v_x from the constraint), starting at the origin heading along x.

    `quantity_names = ("J1", "J2", "H", "c2+s2-1")`; no exact solution.

    Example:

    ```python
    model = geomjax.models.roller_racer()
    Y = geomjax.feedback_field(model.system, model.x0, gains=10.0)
    sol = geomjax.integrate(Y, model.x0, dt=1e-3, steps=2000, method="rk4")
    ```
    """
    pr = _params(m=m, inertia1=inertia1, inertia2=inertia2, d1=d1, d2=d2)
    phi0, om0, fd0 = (jnp.asarray(v, jnp.float64) for v in (phi0, omega0, phi_dot0))
    if abs(float(np.sin(float(phi0)))) < 1e-8:
        raise ValueError("phi0 must not be a multiple of π: v_x is fixed by the constraint through 1/sin φ₀")
    vx = ((pr["d1"] * jnp.cos(phi0) + pr["d2"]) * om0 + pr["d2"] * fd0) / jnp.sin(phi0)
    zero, one = jnp.zeros((), jnp.float64), jnp.ones((), jnp.float64)
    p_phi = pr["inertia2"] * (om0 + fd0)
    mu_t = pr["inertia1"] * om0 + p_phi
    x0 = jnp.stack([zero, zero, one, zero, phi0, mu_t, pr["m"] * vx, zero, p_phi])
    system = System(
        Partial(_racer_hamiltonian, pr), left_trivialised_se2(shape=1), nonholonomic=Partial(_racer_forms, pr)
    )
    return Model("roller_racer", system, pr, x0, ("J1", "J2", "H", "c2+s2-1"))
