"""Chang and Perlmutter's (2019) nonholonomic systems on T*Rⁿ: knife edge, vertical rolling disk, Heisenberg
system, nonholonomic oscillator.

Each constructor returns a `Model` whose system has `nonholonomic=ω(q)`; the feedback
quantities are F = (J, H_ext, integrals) in the order of `quantity_names`. The paper's
parameter values were lost in text extraction: the defaults below are our choices and
are stated in each docstring.
"""

import jax.numpy as jnp
from jax.tree_util import Partial

from .._system.structures import PoissonStructure, canonical
from .._system.system import System
from ._model import Model, model_params as _params




# --------------------------------------------------------------------------------------
# Knife edge on an inclined plane


def _knife_hamiltonian(pr, x):
    q, p = x[:3], x[3:]
    return 0.5 * (p[0] ** 2 + p[1] ** 2) / pr["m"] + 0.5 * p[2] ** 2 / pr["inertia"] - pr["m"] * pr["g"] * jnp.sin(
        pr["alpha"]
    ) * q[0]


def _knife_forms(q):
    return jnp.stack([jnp.sin(q[2]), -jnp.cos(q[2]), jnp.zeros_like(q[2])])[None, :]


def _momentum_phi(x):
    return x[5]


def _knife_exact(pr, t):
    om = pr["omega"]
    amp = pr["g"] * jnp.sin(pr["alpha"]) / (2.0 * om**2)
    ph = om * t
    q = jnp.stack([amp * jnp.sin(ph) ** 2, amp * (ph - 0.5 * jnp.sin(2.0 * ph)), ph])
    p = jnp.stack(
        [
            pr["m"] * amp * om * jnp.sin(2.0 * ph),
            pr["m"] * amp * om * (1.0 - jnp.cos(2.0 * ph)),
            pr["inertia"] * om * jnp.ones_like(ph),
        ]
    )
    return jnp.concatenate([q, p])


def knife_edge(m=1.0, inertia=1.0, g=9.81, alpha=jnp.pi / 6, omega=2.0) -> Model:
    """A knife edge sliding on a plane inclined at angle α (Chang and Perlmutter (2019) §3.2; Bloch §1.6).

    q = (x, y, φ): contact point (x downhill) and blade heading; p = (p_x, p_y, p_φ);
    H = (p_x² + p_y²)/2m + p_φ²/2J − m g sin α·x; constraint ẋ sin φ − ẏ cos φ = 0,
    i.e. ω(q) = (sin φ, −cos φ, 0). Start at rest at the origin spinning at φ̇ = Ω:
    x0 = (0, 0, 0, 0, 0, JΩ). Exact solution (a cycloid), A = g sin α / 2Ω²:
    x = A sin²Ωt, y = A(Ωt − ½ sin 2Ωt), φ = Ωt.

    Defaults (ours; the paper's were lost): m = J = 1, g = 9.81, α = π/6, Ω = 2.

    `quantity_names = ("J", "H", "p_phi")`: p_φ is conserved on the constraint set (the
    true motion); off it the extended field changes it at the rate
    ṗ_φ = +J·(p_x cos φ + p_y sin φ), J = (p_x sin φ − p_y cos φ)/m the constraint momentum
    (tests/test_nonholonomic_extras.py checks the sign against the derived field).

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.knife_edge()
    >>> model.exact(1.0).shape
    (6,)

    ```
    """
    pr = _params(m=m, inertia=inertia, g=g, alpha=alpha, omega=omega)
    system = System(
        Partial(_knife_hamiltonian, pr), canonical(3), nonholonomic=_knife_forms, integrals=(_momentum_phi,)
    )
    zero = jnp.zeros((), jnp.float64)
    x0 = jnp.stack([zero, zero, zero, zero, zero, pr["inertia"] * pr["omega"]])
    return Model("knife_edge", system, pr, x0, ("J", "H", "p_phi"), Partial(_knife_exact, pr))


# --------------------------------------------------------------------------------------
# Vertical rolling disk


def _disk_hamiltonian(pr, x):
    p = x[4:]
    return (
        0.5 * (p[0] ** 2 + p[1] ** 2) / pr["m"]
        + 0.5 * p[2] ** 2 / pr["inertia_heading"]
        + 0.5 * p[3] ** 2 / pr["inertia_rolling"]
    )


def _disk_forms(pr, q):
    one, zero = jnp.ones_like(q[2]), jnp.zeros_like(q[2])
    r = pr["radius"]
    return jnp.stack(
        [
            jnp.stack([one, zero, zero, -r * jnp.cos(q[2])]),
            jnp.stack([zero, one, zero, -r * jnp.sin(q[2])]),
        ]
    )


def _momentum_heading(x):
    return x[6]


def _momentum_rolling(x):
    return x[7]


def _disk_exact(pr, x0, t):
    om_phi = x0[6] / pr["inertia_heading"]
    om_th = x0[7] / pr["inertia_rolling"]
    rho = om_th * pr["radius"] / om_phi
    phi = x0[2] + om_phi * t
    q = jnp.stack(
        [
            x0[0] + rho * (jnp.sin(phi) - jnp.sin(x0[2])),
            x0[1] - rho * (jnp.cos(phi) - jnp.cos(x0[2])),
            phi,
            x0[3] + om_th * t,
        ]
    )
    vel = pr["m"] * pr["radius"] * om_th
    p = jnp.stack([vel * jnp.cos(phi), vel * jnp.sin(phi), x0[6] + 0.0 * t, x0[7] + 0.0 * t])
    return jnp.concatenate([q, p])


def _disk_seed_tensor(pr, x):
    """The almost-Poisson tensor of Chang and Perlmutter's (2019) (60): canonical, plus ṗ_x = −φ̇p_y, ṗ_y = φ̇p_x."""
    px, py = x[4], x[5]
    zero = jnp.zeros_like(px)
    rot = jnp.stack(
        [
            jnp.stack([zero, zero, -py, zero]),
            jnp.stack([zero, zero, px, zero]),
            jnp.stack([py, -px, zero, zero]),
            jnp.stack([zero, zero, zero, zero]),
        ]
    )
    eye = jnp.eye(4, dtype=x.dtype)
    return jnp.block([[jnp.zeros((4, 4), x.dtype), eye], [-eye, rot]])


def _forward_momentum(x):
    return x[4] * jnp.cos(x[2]) + x[5] * jnp.sin(x[2])


def _lateral_momentum(x):
    return -x[4] * jnp.sin(x[2]) + x[5] * jnp.cos(x[2])


def _disk_constraints(params, x):
    """The vertical disk's constraint momenta (J₁, J₂) = (ẋ − R cos φ θ̇, ẏ − R sin φ θ̇) at x."""
    p = x[4:]
    vel_th = p[3] / params["inertia_rolling"]
    return jnp.stack(
        [
            p[0] / params["m"] - params["radius"] * jnp.cos(x[2]) * vel_th,
            p[1] / params["m"] - params["radius"] * jnp.sin(x[2]) * vel_th,
        ]
    )


def vertical_disk(
    m=1.0,
    radius=1.0,
    inertia_heading=0.25,
    inertia_rolling=0.5,
    omega_heading=1.0,
    omega_rolling=2.0,
    extension="generic",
) -> Model:
    """A disk rolling upright without slipping on the plane (Chang and Perlmutter (2019) §3.4; Bloch §1.4).

    q = (x, y, φ, θ): contact point, heading, rolling angle; H = (p_x² + p_y²)/2m +
    p_φ²/2I_φ + p_θ²/2I_θ; constraints ẋ = R cos φ θ̇, ẏ = R sin φ θ̇, i.e.
    ω(q) = [(1, 0, 0, −R cos φ), (0, 1, 0, −R sin φ)]. With φ̇ = Ω_φ, θ̇ = Ω_θ (both constant
    on the true motion) and ρ = Ω_θR/Ω_φ the contact point runs on a circle:
    x = x₀ + ρ(sin φ − sin φ₀), y = y₀ − ρ(cos φ − cos φ₀).

    Defaults (ours): a uniform thin disk m = R = 1 (I_φ = ¼mR², I_θ = ½mR²), Ω_φ = 1,
    Ω_θ = 2 (ρ = 2), starting at the origin with φ = θ = 0.

    `extension` chooses how the motion is continued off the constraint set:

    - `"generic"` (default): `System(H, canonical(4), nonholonomic=ω, integrals=(p_φ, p_θ))`,
      whose extended field (`geomjax.nonholonomic_field`, Chang and Perlmutter (2019) §2) keeps J and H_ext
      everywhere but p_φ, p_θ only on J = 0.
      `quantity_names = ("J1", "J2", "H", "p_phi", "p_theta")`.
    - `"seed"`: Chang and Perlmutter's (2019) modification (60), in which *all* momenta are conserved on the
      whole phase space: the body momenta μ₁ = p_x cos φ + p_y sin φ (forward),
      μ₂ = −p_x sin φ + p_y cos φ (lateral), p_φ and p_θ. In these coordinates it is
      q̇ = ∂H/∂p, ṗ_x = −φ̇ p_y, ṗ_y = φ̇ p_x, ṗ_φ = ṗ_θ = 0 (the space momentum turns with
      the heading): the field B(x)∇H of the almost-Poisson tensor B = [[0, I], [−I, P(p)]],
      P's only entries P_{x φ} = −p_y, P_{y φ} = p_x and their negatives
      (a `geomjax.PoissonStructure`; B fails the Jacobi identity, as nonholonomic brackets
      do, which neither the field nor its feedback needs). The constraint momenta in the
      body frame, μ₁/m − Rθ̇ and μ₂/m, are functions of the conserved momenta, so J = 0 is
      invariant and on it the motion is the rolling disk's. The system has no constraint
      forms; its integrals are the four momenta, and `geomjax.feedback_field` with gains
      (0, k, k, k, k) (H left out) is the paper's feedback integrator (61), with V a
      quadratic in the momenta only.
      `quantity_names = ("H", "mu_1", "mu_2", "p_phi", "p_theta")`.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.vertical_disk()
    >>> geomjax.nonholonomic_field(model.system)(model.x0).shape == model.x0.shape
    True

    ```
    """
    pr = _params(
        m=m, radius=radius, inertia_heading=inertia_heading, inertia_rolling=inertia_rolling
    )
    om_phi = jnp.asarray(omega_heading, jnp.float64)
    om_th = jnp.asarray(omega_rolling, jnp.float64)
    pr["omega_heading"], pr["omega_rolling"] = om_phi, om_th
    zero = jnp.zeros((), jnp.float64)
    vel = pr["m"] * pr["radius"] * om_th
    x0 = jnp.stack(
        [zero, zero, zero, zero, vel, zero, pr["inertia_heading"] * om_phi, pr["inertia_rolling"] * om_th]
    )
    exact = Partial(_disk_exact, pr, x0)
    if extension == "seed":
        system = System(
            Partial(_disk_hamiltonian, pr),
            PoissonStructure(Partial(_disk_seed_tensor, pr), dim=8),
            integrals=(_forward_momentum, _lateral_momentum, _momentum_heading, _momentum_rolling),
        )
        return Model("vertical_disk_seed", system, pr, x0, ("H", "mu_1", "mu_2", "p_phi", "p_theta"), exact)
    if extension != "generic":
        raise ValueError(f'extension must be "generic" or "seed", got {extension!r}')
    system = System(
        Partial(_disk_hamiltonian, pr),
        canonical(4),
        nonholonomic=Partial(_disk_forms, pr),
        integrals=(_momentum_heading, _momentum_rolling),
    )
    return Model("vertical_disk", system, pr, x0, ("J1", "J2", "H", "p_phi", "p_theta"), exact)


# --------------------------------------------------------------------------------------
# Heisenberg system


def _free_hamiltonian(x):
    p = x[3:]
    return 0.5 * (p[0] ** 2 + p[1] ** 2 + p[2] ** 2)


def _heisenberg_forms(q):
    return jnp.stack([-q[1], q[0], jnp.ones_like(q[0])])[None, :]


def _angular_momentum_z(x):
    return x[0] * x[4] - x[1] * x[3]


def _line(x0, t):
    return jnp.concatenate([x0[:3] + t * x0[3:], x0[3:] + 0.0 * t])


def heisenberg(q0=(1.0, 0.5, 0.0), v0=(0.3, 1.0)) -> Model:
    """The Heisenberg system (Chang and Perlmutter (2019) §3.6): a free particle in R³ with ż = y ẋ − x ẏ.

    H = ½|p|², ω(q) = (−y, x, 1) (not normalised). On the constraint set the multiplier
    vanishes, so the motion is the straight line q(t) = q₀ + t q̇₀ — a sharp test that no
    spurious force appears. The extended field conserves J, H_ext and L_z = x p_y − y p_x.

    Defaults (ours): q₀ = (1, 0.5, 0), (ẋ₀, ẏ₀) = (0.3, 1) and ż₀ = y₀ẋ₀ − x₀ẏ₀ = −0.85.

    `quantity_names = ("J", "H", "L_z")`.

    Example:

    ```python
    model = geomjax.models.heisenberg()
    Y = geomjax.feedback_field(model.system, model.x0, gains=1.0)
    sol = geomjax.integrate(Y, model.x0, dt=1e-3, steps=1000)
    ```
    """
    q = jnp.asarray(q0, jnp.float64)
    v = jnp.asarray(v0, jnp.float64)
    vz = q[1] * v[0] - q[0] * v[1]
    x0 = jnp.concatenate([q, v, vz[None]])
    system = System(
        _free_hamiltonian, canonical(3), nonholonomic=_heisenberg_forms, integrals=(_angular_momentum_z,)
    )
    return Model("heisenberg", system, {}, x0, ("J", "H", "L_z"), Partial(_line, x0))


# --------------------------------------------------------------------------------------
# Nonholonomic (contact) oscillator


def _oscillator_hamiltonian(pr, x):
    q, p = x[:3], x[3:]
    return 0.5 * (p[0] ** 2 + p[1] ** 2 + p[2] ** 2 + q[0] ** 2 + q[1] ** 2 + q[2] ** 2) + 0.5 * pr["eps"] * (
        q[0] * q[2]
    ) ** 2


def _oscillator_forms(q):
    return jnp.stack([jnp.ones_like(q[1]), jnp.zeros_like(q[1]), q[1]])[None, :]


def _y_energy(x):
    return 0.5 * (x[1] ** 2 + x[4] ** 2)


def nonholonomic_oscillator(eps=0.3, q0=(1.0, 0.0, 1.0), p0=(0.0, 1.0, 0.5)) -> Model:
    """The nonholonomic ("contact") oscillator (Chang and Perlmutter (2019) §3.7; McLachlan–Perlmutter 2006).

    q = (x, y, z), H = ½(|p|² + |q|²) + (ε/2) x²z², constraint ẋ + y ż = 0, i.e.
    ω(q) = (1, 0, y). The y-motion decouples (ÿ = −y), so H_y = ½(y² + ẏ²) is conserved:
    with y₀ = 0, ẏ₀ = 1 it is y = sin t, period 2π; Poincaré sections are taken at y = 0,
    ẏ > 0. ε = 0.3 is McLachlan–Perlmutter's value; the paper's initial state was lost and
    ours is q₀ = (1, 0, 1), p₀ = (0, 1, 0.5) (on the constraint: p_x + y p_z = 0).

    `quantity_names = ("J", "H", "H_y")`; H_y is conserved on the constraint set.

    Example:

    ```python
    model = geomjax.models.nonholonomic_oscillator()
    sol = geomjax.integrate(geomjax.dla(model.system), model.x0, dt=0.05, steps=2000)
    ```
    """
    pr = _params(eps=eps)
    x0 = jnp.concatenate([jnp.asarray(q0, jnp.float64), jnp.asarray(p0, jnp.float64)])
    system = System(
        Partial(_oscillator_hamiltonian, pr), canonical(3), nonholonomic=_oscillator_forms, integrals=(_y_energy,)
    )
    return Model("nonholonomic_oscillator", system, pr, x0, ("J", "H", "H_y"))
