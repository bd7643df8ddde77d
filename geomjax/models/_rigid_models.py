"""Finzi, Wang and Wilson's (2020) extended bodies: a gyroscope pinned at a point of its
axle under gravity, and a free rotor; their trajectories from random starts."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import Partial
from jaxtyping import PRNGKeyArray

from ._model import Model, model_params
from ._rigid_bodies import RigidBodies, angular_momentum
from ._trajectories import Trajectories, observed_runs

_OBSERVED = ("velocity", "momentum")


def _rotation(tilt, azimuth, roll) -> np.ndarray:
    """R = R_z(azimuth) R_y(tilt) R_z(roll): its third column, the body's symmetry axis, at
    polar angle `tilt` from +z and azimuth `azimuth`."""

    def rz(a):
        c, s = np.cos(a), np.sin(a)
        return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])

    c, s = np.cos(tilt), np.sin(tilt)
    ry = np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])
    return rz(azimuth) @ ry @ rz(roll)


def _vertical_momentum(x):
    return angular_momentum(x)[2]


def _gyroscope_bodies(mass, inertia, arm):
    bodies = RigidBodies()
    bodies.add_body(mass, inertia)
    bodies.pin(0, point=(0.0, 0.0, -arm))  # the axle's end, `arm` below the centre, at the origin
    return bodies


def _gyroscope_state(bodies, arm, tilt, azimuth, roll, spin, precession, nutation):
    """The pinned top with its axle at (tilt, azimuth), turning at ω = spin·a + precession·e_z
    + nutation·(e_z × a)/|e_z × a| (a the axle): its centre at arm·a, moving at ω × arm·a."""
    r = _rotation(tilt, azimuth, roll)
    axle = r[:, 2]
    across = np.cross([0.0, 0.0, 1.0], axle)
    norm = np.linalg.norm(across)
    across = across / norm if norm > 1e-12 else r[:, 0]  # an upright axle: any horizontal axis
    omega = spin * axle + precession * np.array([0.0, 0.0, 1.0]) + nutation * across
    centre = arm * axle
    return bodies.state(centres=centre[None], rotations=r[None], velocities=np.cross(omega, centre)[None],
                        angular_velocities=omega[None])


def gyroscope(mass=0.1, inertia=None, arm=1.0, gravity=9.81, *, tilt=0.5, azimuth=0.0, spin=10.5, precession=1.0,
              nutation=0.0) -> Model:
    """A symmetric top (Lagrange's), its axle pinned at a point `arm` below its centre of mass,
    under gravity: Finzi, Wang and Wilson's (2020) gyroscope as four points in R³
    (`geomjax.models.RigidBodies`: 6 distance constraints and a ball joint at the origin,
    k = 9 holonomic constraints on q ∈ R¹²).

    The default body is a solid cylinder of radius 1 and height ½ (mass m = 0.1:
    I₁ = I₂ = m(3r² + h²)/12, I₃ = mr²/2, the axle along the third principal axis), its
    centre `arm` = 1 above the pivot along the axle. Start: the axle at polar angle
    `tilt` from the vertical and `azimuth`, turning at ω = spin·a + precession·e_z +
    nutation·(e_z × a)/|e_z × a| (a the axle; their data spin at ±(7 + N(0,1))·1.5 ≈ ±10.5
    rad/s about the axle), the centre at arm·a moving at ω × arm·a: on the constraint set
    S = {g = 0, G M⁻¹p = 0} to round-off.

    First integrals: H, and the vertical angular momentum about the pivot
    L_z = (Σ_a x_a × p_a)·e_z (declared as the system's integral "Lz"; RATTLE keeps it to
    round-off: it is the momentum map of rotations about the vertical, linear in q).

    **Returns:** a `geomjax.models.Model` with `quantity_names` ("g1", …, "g9", "gdot1", …,
    "gdot9", "H", "Lz"); `exact` is `None`.

    Example:

    ```python
    >>> import numpy as np, geomjax
    >>> model = geomjax.models.gyroscope()
    >>> float(np.abs(model.system.holonomic(model.x0[:12])).max()) < 1e-15
    True
    >>> lz = float(model.system.integral_values(model.x0)[0])  # L_z, kept by RATTLE to round-off
    >>> round(lz, 6)
    0.528448

    ```
    """
    bodies, system = _gyroscope_parts(mass, inertia, arm, gravity)
    x0 = _gyroscope_state(bodies, float(arm), tilt, azimuth, 0.0, spin, precession, nutation)
    params = model_params(m=mass, arm=arm, g=gravity)
    return Model("gyroscope", system, params, x0, system.names)


def _gyroscope_parts(mass, inertia, arm, gravity):
    """(bodies, system) of the pinned top; `inertia` None: the solid cylinder of radius 1
    and height ½ of mass `mass`."""
    if inertia is None:
        r, h = 1.0, 0.5
        inertia = (mass * (3 * r * r + h * h) / 12, mass * (3 * r * r + h * h) / 12, mass * r * r / 2)
    bodies = _gyroscope_bodies(float(mass), inertia, float(arm))
    return bodies, bodies.system(gravity=float(gravity), integrals=Partial(_vertical_momentum), integral_names=("Lz",))


def rotor(mass=3.0, inertia=(5.0, 4.0, 3.0), *, angular_velocity=(0.05, 2.0, 0.05)) -> Model:
    """A free rigid body (Finzi, Wang and Wilson's (2020) rotor: mass 3, second moments
    (1, 2, 3), i.e. principal moments of inertia (5, 4, 3)) as four points in R³ (six distance
    constraints on q ∈ R¹², no potential), at the origin and turning at `angular_velocity`
    (space frame), by default nearly about its intermediate axis: the Dzhanibekov (tennis
    racket) flip.

    First integrals: H, the angular momentum Σ_a x_a × p_a (3, "L1", "L2", "L3") and the
    momentum Σ_a p_a (3, "P1", "P2", "P3"), all kept to round-off by RATTLE (momentum maps
    of the rotations and translations of space).

    Example:

    ```python
    >>> import numpy as np, geomjax
    >>> model = geomjax.models.rotor()
    >>> (np.round(model.system.integral_values(model.x0), 12) + 0.0).tolist()  # L = Iω, P = 0
    [0.25, 8.0, 0.15, 0.0, 0.0, 0.0]

    ```
    """
    bodies = RigidBodies()
    bodies.add_body(float(mass), inertia)
    system = bodies.system(integrals=Partial(_momenta), integral_names=("L1", "L2", "L3", "P1", "P2", "P3"))
    x0 = bodies.state(angular_velocities=np.asarray(angular_velocity, np.float64)[None])
    return Model("rotor", system, model_params(m=mass), x0, system.names)


def _momenta(x):
    n = x.shape[0] // 2
    return jnp.concatenate([angular_momentum(x), jnp.sum(x[n:].reshape(-1, 3), axis=0)])


def gyroscope_trajectories(
    count: int,
    *,
    steps: int = 100,
    dt: float = 0.02,
    observed: str = "velocity",
    substeps: int = 40,
    method: str = "rk4",
    key: PRNGKeyArray,
    mass=0.1,
    inertia=None,
    arm=1.0,
    gravity=9.81,
) -> Trajectories:
    """Trajectories of `geomjax.models.gyroscope` from random starts, observed every `dt`.

    Starts (after Finzi, Wang and Wilson (2020): their gyroscope's data, dt = 0.02 over
    2 time units): the axle at a tilt uniform on [0.1, 1.2] rad from the vertical, azimuth
    and roll uniform on [0, 2π), spin ±(7 + N(0, 1))·1.5 rad/s about the axle (sign at
    random), precession N(0, 1) and nutation N(0, 0.5) rad/s; each on the constraint set to
    round-off. Each trajectory is `method` (RK4) on the Dirac field with `substeps` steps
    per observation (h = 5·10⁻⁴ at the defaults), observed as positions and velocities
    q̇ = ∂H/∂p = 𝕄⁻¹p (or momenta). `mass`, `inertia`, `arm`, `gravity`: as for `gyroscope`.

    **Returns:** `geomjax.Trajectories` with `xs` of shape `(count, steps + 1, 24)` and
    `space_dim = 3` (four points per body).

    Example:

    ```python
    >>> import jax, jax.numpy as jnp, geomjax
    >>> data = geomjax.models.gyroscope_trajectories(2, steps=5, key=jax.random.key(0))
    >>> data.xs.shape
    (2, 6, 24)
    >>> float(jnp.abs(jax.vmap(jax.vmap(data.constraints))(data.xs[..., :12])).max()) < 1e-9
    True

    ```
    """
    count, steps, substeps = int(count), int(steps), int(substeps)
    if count < 1 or steps < 1 or substeps < 1:
        raise ValueError("count, steps and substeps must be positive integers")
    if observed not in _OBSERVED:
        raise ValueError(f"observed must be one of {_OBSERVED}, got {observed!r}")
    bodies, system = _gyroscope_parts(mass, inertia, arm, gravity)
    arm = float(arm)
    k = jax.random.split(key, 6)
    tilt = np.asarray(jax.random.uniform(k[0], (count,), minval=0.1, maxval=1.2))
    azimuth, roll = (np.asarray(jax.random.uniform(kk, (count,), maxval=2 * np.pi)) for kk in k[1:3])
    sign = np.where(np.asarray(jax.random.bernoulli(k[3], 0.5, (count,))), 1.0, -1.0)
    spin = sign * (7.0 + np.asarray(jax.random.normal(k[4], (count,)))) * 1.5
    rates = np.asarray(jax.random.normal(k[5], (count, 2))) * np.array([1.0, 0.5])
    starts = jnp.stack([_gyroscope_state(bodies, arm, *args) for args in zip(tilt, azimuth, roll, spin, *rates.T)])
    xs = observed_runs(system, starts, float(dt), steps, substeps, method)
    if observed == "velocity":
        n = xs.shape[-1] // 2
        velocity = jax.vmap(jax.vmap(jax.grad(system.hamiltonian)))(xs)[..., n:]
        xs = jnp.concatenate([xs[..., :n], velocity], axis=-1)
    ts = dt * jnp.arange(steps + 1, dtype=jnp.float64)
    return Trajectories(xs, ts, float(dt), system.holonomic, system, 3, observed)
