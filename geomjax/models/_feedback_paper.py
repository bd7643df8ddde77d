"""The unconstrained benchmarks of the original feedback-integrator paper.

Chang, Jiménez and Perlmutter, "Feedback integrators", J. Nonlinear Sci. 26 (2016)
1693–1721, integrate three systems whose first integrals, not constraints, define the
invariant set: the free rigid body on SO(3) ⊂ R^{3×3}, the Kepler problem and a perturbed
Kepler problem. The parameters, initial states and gains here are the ones of Bae and
Chang's public code for these benchmarks (github.com/johnbae1901/Feedback-Integrator).

Each model carries the paper's gains (`FeedbackModel.gains`, one per entry of
F = (H, integrals), then k₀ for the rigid body's embedding term), so that
`geomjax.feedback_field(model.system, model.x0, model.gains, model.metric)` is the
paper's field. The exact sub-flows of the splittings the paper compares against are
`rigid_body_flows` (rotations about the body axes) and `kepler_flows` (drift and kick:
Störmer–Verlet is `geomjax.strang(kick, drift)`).
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import Partial

from .._step.base import SystemStep, ok_status
from .._system.bundles import left_trivialised_so3
from .._system.structures import canonical
from .._system.system import System
from .._validate import host_array
from ._model import Model, flat_state, model_params


class FeedbackModel(Model):
    """A `Model` with the feedback gains (and metric) of the paper that integrates it.

    **Fields** (besides those of `Model`):

    - `gains`: the paper's gain vector, one entry per name in `quantity_names` (zeros
      leave a quantity out of V); pass it to `geomjax.feedback_field`.
    - `metric`: the metric L of the paper's field X − L∇V (None: the identity).
    - `period`: the period of the motion where it is known (Kepler), else None.
    - `t_final`: the paper's final time.
    """

    gains: jax.Array | None = None
    metric: jax.Array | None = None
    period: float | None = None
    t_final: float | None = None


# --------------------------------------------------------------------------------------
# Free rigid body


def _rigid_hamiltonian(pr, x):
    pi = x[9:]
    inertia = pr["inertia"]
    return 0.5 * (pi[0] ** 2 / inertia[0] + pi[1] ** 2 / inertia[1] + pi[2] ** 2 / inertia[2])


def _spatial_momentum(x):
    """Π_s = R Π, the angular momentum in space (Π = IΩ the body momentum)."""
    return x[:9].reshape(3, 3) @ x[9:]


def rigid_body(inertia=(3.0, 2.0, 1.0), omega0=(1.0, 1.0, 1.0), r0=None) -> FeedbackModel:
    """The free rigid body on SO(3) ⊂ R^{3×3} (Chang–Jiménez–Perlmutter 2016).

    State (R, Π): the attitude R, embedded in R^{3×3}, and the body angular momentum
    Π = IΩ, flat (R.ravel(), Π) on the left-trivialised T*SO(3)
    (`geomjax.left_trivialised_so3`). H = E = ½Π·I⁻¹Π = ½Ω·IΩ, and

    Ṙ = RΩ̂,   Π̇ = Π × Ω,   Ω = I⁻¹Π.

    The first integrals are E and the spatial angular momentum Π_s = RΠ = RIΩ; the
    invariant set is {RᵀR = I, E = E₀, Π_s = Π₀}. The paper's Lyapunov function is

    V = k₀/4‖RᵀR − I‖² + k₁/2(E − E₀)² + k₂/2‖RIΩ − Π₀‖²,   (k₀, k₁, k₂) = (50, 100, 50),

    i.e. `gains = (k₁, k₂, k₂, k₂, k₀) = (100, 50, 50, 50, 50)` on
    `quantity_names = ("H", "Pi_s1", "Pi_s2", "Pi_s3", "RtR-I")` (k₀/4‖RᵀR − I‖² is the
    embedding term `feedback_field` adds on an embedded group, its gain last). The paper
    takes the gradient in the coordinates (R, Ω); here the state holds Π = IΩ, and the
    metric L = diag(1, …, 1, I₁², I₂², I₃²) (`metric`) turns X − L∇_{(R,Π)}V into exactly
    the paper's field written in (R, Π): Π̇ = I Ω̇. With L = identity the field differs
    from the paper's in the Π rows only (same invariant set, other transients).

    Defaults (the paper's): I = diag(3, 2, 1), Ω₀ = (1, 1, 1), R₀ = I₃, so E₀ = 3 and
    Π₀ = (3, 2, 1); t_final = 1000 (Bae and Chang's code). No closed-form solution is
    given (`exact` is None); the splitting into exactly solvable rotations is
    `geomjax.models.rigid_body_flows`.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.rigid_body()
    >>> Y = geomjax.feedback_field(model.system, model.x0, model.gains, model.metric)
    >>> sol = geomjax.integrate(Y, model.x0, dt=1e-4, steps=1000, method="euler")
    >>> F = model.system.conserved_quantities(sol.xs[-1])   # (E, Π_s)
    >>> [round(float(v), 4) for v in F]
    [3.0, 3.0, 2.0, 1.0]
    >>> float(geomjax.embedding_defect(model.system, sol.xs[-1])) < 1e-4   # ‖RᵀR − I‖
    True

    ```
    """
    pr = model_params(inertia=inertia)
    om = np.asarray(omega0, np.float64)
    r = np.eye(3) if r0 is None else np.asarray(r0, np.float64)
    if r.shape != (3, 3):
        raise ValueError(f"r0 must be a 3 × 3 rotation matrix, got shape {r.shape}")
    inertia_n = np.asarray(inertia, np.float64)
    x0 = flat_state(r, inertia_n * om)
    system = System(Partial(_rigid_hamiltonian, pr), left_trivialised_so3(), integrals=(_spatial_momentum,))
    metric = np.diag(np.concatenate([np.ones(9), inertia_n**2]))
    return FeedbackModel(
        "rigid_body",
        system,
        pr,
        x0,
        ("H", "Pi_s1", "Pi_s2", "Pi_s3", "RtR-I"),
        None,
        gains=flat_state([100.0, 50.0, 50.0, 50.0, 50.0]),
        metric=host_array(metric),
        t_final=1000.0,
    )


def _axis_rotation(k: int, c, s):
    """The rotation exp(θ ê_k) about the k-th coordinate axis, from c = cos θ, s = sin θ."""
    one, zero = jnp.ones_like(c), jnp.zeros_like(c)
    i, j = (k + 1) % 3, (k + 2) % 3
    rows = [[zero, zero, zero], [zero, zero, zero], [zero, zero, zero]]
    rows[k][k] = one
    rows[i][i], rows[i][j] = c, -s
    rows[j][i], rows[j][j] = s, c
    return jnp.stack([jnp.stack(row) for row in rows])


class AxisRotation(SystemStep):
    """The exact flow of H_k = Π_k²/2I_k: a rotation about the k-th body axis.

    With θ = hΠ_k/I_k and E = exp(θê_k): R ← RE, Π ← EᵀΠ (Π_k is kept). Off SO(3) it is
    still the exact flow of the extended field (Ṙ = RΩ̂ is linear in R). It keeps RΠ, |Π|,
    ‖RᵀR − I‖ and its own Π_k²/2I_k, not the whole energy.
    """

    system: System
    inertia: jax.Array
    axis: int = eqx.field(static=True)

    def advance(self, t, z, h, args):
        del t, args
        r, pi = z
        theta = h * pi[self.axis] / self.inertia[self.axis]
        e = _axis_rotation(self.axis, jnp.cos(theta), jnp.sin(theta))
        return (r @ e, e.T @ pi), ok_status()


def rigid_body_flows(model: FeedbackModel) -> tuple[AxisRotation, AxisRotation, AxisRotation]:
    """The exact flows of the three parts of the rigid body's kinetic energy.

    H = Π₁²/2I₁ + Π₂²/2I₂ + Π₃²/2I₃; the flow of the k-th part turns the body about its
    k-th axis at the constant rate Π_k/I_k: R(t) = R exp(tΠ_kê_k/I_k),
    Π(t) = exp(−tΠ_kê_k/I_k)Π. Each keeps the spatial momentum Π_s = RΠ, |Π| and
    ‖RᵀR − I‖ exactly, so every composition does; the energy E is not kept exactly (each
    flow keeps only its own part) but, the splitting being symplectic, its error stays
    bounded, O(h²) for the symmetric splitting φ³_{h/2} φ²_{h/2} φ¹_h φ²_{h/2} φ³_{h/2},
    which is `geomjax.strang(r3, geomjax.strang(r2, r1))` (order 2).

    **Arguments:**

    - `model`: `geomjax.models.rigid_body()` (its inertia is used).

    **Returns:**

    The steps `(r1, r2, r3)`, usable with `geomjax.integrate` and the splitting helpers.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.rigid_body()
    >>> r1, r2, r3 = geomjax.models.rigid_body_flows(model)
    >>> step = geomjax.strang(r3, geomjax.strang(r2, r1))
    >>> sol = geomjax.integrate(step, model.x0, dt=1e-2, steps=1000)
    >>> dF = abs(model.system.conserved_quantities(sol.xs[-1]) - model.system.conserved_quantities(model.x0))
    >>> bool(dF[1:].max() < 1e-12), bool(dF[0] < 1e-6)   # Π_s to round-off, E to O(h²)
    (True, True)

    ```
    """
    if model.name != "rigid_body":
        raise ValueError(f"rigid_body_flows needs geomjax.models.rigid_body(), got the model {model.name!r}")
    inertia = model.params["inertia"]
    return tuple(AxisRotation(model.system, inertia, k) for k in range(3))


# --------------------------------------------------------------------------------------
# Kepler problems


def _kepler_hamiltonian(pr, x):
    q, p = x[:3], x[3:]
    return 0.5 * (p @ p) - pr["mu"] / jnp.sqrt(q @ q)


def _perturbed_hamiltonian(pr, x):
    q, p = x[:3], x[3:]
    r = jnp.sqrt(q @ q)
    return 0.5 * (p @ p) - pr["mu"] / r - pr["delta"] / (r * r * r)


def _angular_momentum(x):
    q, p = x[:3], x[3:]
    return jnp.cross(q, p)


def _runge_lenz(pr, x):
    q, p = x[:3], x[3:]
    return jnp.cross(p, jnp.cross(q, p)) - pr["mu"] * q / jnp.sqrt(q @ q)


def _solve_kepler(mean_anomaly, e):
    """E with E − e sin E = M (elliptic, 0 ≤ e < 1), Newton from E = π: monotone and
    quadratically convergent for M in [0, 2π); 40 iterations leave round-off."""
    m = jnp.mod(mean_anomaly, 2.0 * jnp.pi)

    def body(_, ecc):
        return ecc - (ecc - e * jnp.sin(ecc) - m) / (1.0 - e * jnp.cos(ecc))

    return jax.lax.fori_loop(0, 40, body, jnp.full_like(m, jnp.pi))


def _kepler_exact(pr, x0, t):
    """The Kepler orbit through x0 at time t, from Kepler's equation (elliptic, e > 0)."""
    mu = pr["mu"]
    q0, p0 = x0[:3], x0[3:]
    r0 = jnp.sqrt(q0 @ q0)
    energy = 0.5 * (p0 @ p0) - mu / r0
    a = -mu / (2.0 * energy)
    ang = jnp.cross(q0, p0)
    ecc_vec = (jnp.cross(p0, ang) - mu * q0 / r0) / mu
    e = jnp.sqrt(ecc_vec @ ecc_vec)
    u = ecc_vec / e  # towards periapsis
    w = jnp.cross(ang / jnp.sqrt(ang @ ang), u)  # in the plane, 90° ahead
    sqrt_mu_a = jnp.sqrt(mu * a)
    ecc0 = jnp.arctan2((q0 @ p0) / (e * sqrt_mu_a), (1.0 - r0 / a) / e)
    n = jnp.sqrt(mu / a**3)
    ecc = _solve_kepler(ecc0 - e * jnp.sin(ecc0) + n * t, e)
    b = jnp.sqrt(1.0 - e * e)
    r = a * (1.0 - e * jnp.cos(ecc))
    q = a * (jnp.cos(ecc) - e) * u + a * b * jnp.sin(ecc) * w
    p = (sqrt_mu_a / r) * (-jnp.sin(ecc) * u + b * jnp.cos(ecc) * w)
    return jnp.concatenate([q, p])


def kepler(mu=1.0, x0=(1.0, 0.0, 0.0), v0=(0.0, math.sqrt(1.8), 0.0)) -> FeedbackModel:
    """The Kepler problem (Chang–Jiménez–Perlmutter 2016), unit mass so p = v.

    H = ½|p|² − μ/|q| on T*R³ (`geomjax.canonical(3)`), with the first integrals the
    angular momentum L = q × p and the Laplace–Runge–Lenz vector A = p × L − μq/|q|.
    The paper's Lyapunov function leaves H out (|A|² = μ² + 2H|L|² ties it to L and A):

    V = k₁/2‖L − L₀‖² + k₂/2‖A − A₀‖²,   k₁ = 4, k₂ = 2,

    so `gains = (0, 4, 4, 4, 2, 2, 2)` on `quantity_names = ("H", "L1", "L2", "L3", "A1",
    "A2", "A3")`; the feedback field is then the one of Bae and Chang's code, with
    ∇_qV = k₁ p × ΔL + k₂[p × (ΔA × p) − μΔA/|q| + μq(q·ΔA)/|q|³] and
    ∇_pV = k₁ ΔL × q + k₂[L × ΔA + q × (p × ΔA)].

    Defaults (the paper's): μ = 1, q₀ = (1, 0, 0), p₀ = (0, √1.8, 0): a periapsis of the
    ellipse with e = 0.8, a = 5 and period 2πa^{3/2}/√μ = 70.2481… (`period`);
    t_final = 1000 periods. `exact(t)` is the orbit through x0 from Kepler's equation
    (for 0 < e < 1; None otherwise).

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.kepler()
    >>> round(model.period, 4)
    70.2481
    >>> Y = geomjax.feedback_field(model.system, model.x0, model.gains)
    >>> sol = geomjax.integrate(Y, model.x0, dt=1e-3, steps=5000, method="euler")
    >>> err = abs(model.system.conserved_quantities(sol.xs[-1]) - model.system.conserved_quantities(model.x0))
    >>> bool(err.max() < 1e-3)
    True
    >>> float(abs(model.exact(model.period) - model.x0).max()) < 1e-12
    True

    ```
    """
    pr = model_params(mu=mu)
    state = flat_state(x0, v0)
    system = System(
        Partial(_kepler_hamiltonian, pr), canonical(3), integrals=(_angular_momentum, Partial(_runge_lenz, pr))
    )
    q, p, mu_n = np.asarray(x0, float), np.asarray(v0, float), float(np.asarray(mu))
    energy = 0.5 * p @ p - mu_n / np.linalg.norm(q)
    ang = np.cross(q, p)
    e = np.linalg.norm(np.cross(p, ang) - mu_n * q / np.linalg.norm(q)) / mu_n
    elliptic = energy < 0 and 1e-12 < e < 1.0
    period = float(2.0 * math.pi * (-mu_n / (2.0 * energy)) ** 1.5 / math.sqrt(mu_n)) if energy < 0 else None
    return FeedbackModel(
        "kepler",
        system,
        pr,
        state,
        ("H", "L1", "L2", "L3", "A1", "A2", "A3"),
        Partial(_kepler_exact, pr, state) if elliptic else None,
        gains=flat_state([0.0, 4.0, 4.0, 4.0, 2.0, 2.0, 2.0]),
        period=period,
        t_final=None if period is None else 1000.0 * period,
    )


def perturbed_kepler(mu=1.0, delta=0.0025, e=0.6) -> FeedbackModel:
    """A perturbed Kepler problem (Chang–Jiménez–Perlmutter 2016), unit mass so p = v.

    H = ½|p|² + U(|q|), U(r) = −μ/r − δ/r³: still a central force, so the angular
    momentum L = q × p is kept, but the orbit precesses and the Laplace–Runge–Lenz vector
    is no longer a first integral. The paper's Lyapunov function is on E = H and L:

    V = k_E/2(E − E₀)² + k_L/2‖L − L₀‖²,   k_E = 2, k_L = 3,

    `gains = (2, 3, 3, 3)` on `quantity_names = ("H", "L1", "L2", "L3")`; the field is
    q̇ = p − k_E ΔE U′(r) q/r − k_L p × ΔL, ṗ = −U′(r) q/r − k_E ΔE p − k_L ΔL × q.

    Defaults (the paper's): μ = 1, δ = 0.0025, q₀ = (1 − e, 0, 0) and
    p₀ = (0, √(μ(1 + e)/(1 − e)), 0) with e = 0.6 (the periapsis of the unperturbed orbit
    of eccentricity e and semi-major axis 1); t_final = 200. No closed form (`exact` is
    None).

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.perturbed_kepler()
    >>> model.quantity_names, [float(g) for g in model.gains]
    (('H', 'L1', 'L2', 'L3'), [2.0, 3.0, 3.0, 3.0])
    >>> Y = geomjax.feedback_field(model.system, model.x0, model.gains)
    >>> sol = geomjax.integrate(Y, model.x0, dt=1e-3, steps=2000, method="euler")
    >>> bool(sol.ok)
    True

    ```
    """
    e_n = float(np.asarray(e))
    if not 0.0 <= e_n < 1.0:
        raise ValueError(f"e must be in [0, 1) (an ellipse of the unperturbed problem), got {e_n}")
    pr = model_params(mu=mu, delta=delta, e=e)
    mu_n = float(np.asarray(mu))
    state = flat_state([1.0 - e_n, 0.0, 0.0], [0.0, math.sqrt(mu_n * (1.0 + e_n) / (1.0 - e_n)), 0.0])
    system = System(Partial(_perturbed_hamiltonian, pr), canonical(3), integrals=(_angular_momentum,))
    return FeedbackModel(
        "perturbed_kepler",
        system,
        pr,
        state,
        ("H", "L1", "L2", "L3"),
        None,
        gains=flat_state([2.0, 3.0, 3.0, 3.0]),
        t_final=200.0,
    )


class Drift(SystemStep):
    """The exact flow of the kinetic part ½|p|²: q ← q + hp (p kept)."""

    system: System

    def advance(self, t, z, h, args):
        del t, args
        q, p = z
        return (q + h * p, p), ok_status()


class Kick(SystemStep):
    """The exact flow of the potential part U(q): p ← p − h∇U(q) (q kept); ∇U = ∂H/∂q,
    by autodiff (H is separable)."""

    system: System

    def advance(self, t, z, h, args):
        del t, args
        q, p = z
        grad_u = jax.grad(lambda qq: self.system.hamiltonian(jnp.concatenate([qq, p])))(q)
        return (q, p - h * grad_u), ok_status()


def kepler_flows(model: FeedbackModel) -> tuple[Drift, Kick]:
    """The exact flows of the kinetic and potential parts of a Kepler problem.

    H = ½|p|² + U(q) splits into the drift φ^T_t: q ← q + tp and the kick
    φ^U_t: p ← p − t∇U(q) (∇U by autodiff). Both keep L = q × p exactly (U is central),
    so every composition does. `geomjax.strang(kick, drift)` is the velocity form of
    Störmer–Verlet (half kick, drift, half kick), the symplectic method of the paper's
    comparisons; `geomjax.strang(drift, kick)` is its position form.

    **Arguments:**

    - `model`: `geomjax.models.kepler()` or `geomjax.models.perturbed_kepler()`.

    **Returns:**

    The steps `(drift, kick)`, usable with `geomjax.integrate` and the splitting helpers.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.kepler()
    >>> drift, kick = geomjax.models.kepler_flows(model)
    >>> verlet = geomjax.strang(kick, drift)
    >>> sol = geomjax.integrate(verlet, model.x0, dt=1e-2, steps=7025)   # one period
    >>> L = model.system.conserved_quantities(sol.xs[-1])[1:4]
    >>> float(abs(L - model.system.conserved_quantities(model.x0)[1:4]).max()) < 1e-12
    True

    ```
    """
    if model.name not in ("kepler", "perturbed_kepler"):
        raise ValueError(f"kepler_flows needs geomjax.models.kepler() or perturbed_kepler(), got the model {model.name!r}")
    return Drift(model.system), Kick(model.system)
