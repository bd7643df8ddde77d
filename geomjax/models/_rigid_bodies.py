"""Rigid bodies in space as sets of points held by constraints (Finzi, Wang and Wilson (2020)).

A rigid body of mass M with principal moments of inertia I₁, I₂, I₃ about its centre of
mass is represented by four points: its centre of mass x₀ and the tips x_i = x₀ + R e_i of
its three principal axes (R its orientation). Six distance constraints keep the four points
a rigid unit frame; joints (a body point held at a point of space, two bodies sharing a
point) and hinges (a body turning about an axis fixed in space) are further holonomic
constraints, linear in the points. With the second moments s_i = ∫ r_i² dm =
(I₁ + I₂ + I₃)/2 − I_i along the principal axes, the kinetic energy of the body is

    T = ½ M |ẋ₀|² + ½ Σ_i s_i |ẋ_i − ẋ₀|² = ½ ẋᵀ (𝕄 ⊗ I₃) ẋ,

𝕄 = [[M + Σs, −s₁, −s₂, −s₃], [−s₁, s₁, 0, 0], [−s₂, 0, s₂, 0], [−s₃, 0, 0, s₃]], a constant
4 × 4 mass matrix (it equals ½M|v|² + ½ωᵀIω for every rigid motion). The system is then an
ordinary holonomic `geomjax.System` on T*R^(12·bodies): H = ½pᵀ(𝕄⁻¹ ⊗ I₃)p + V(q), so its
Dirac field, RATTLE, feedback fields and a `ConstrainedHamiltonianNetwork` (whose learned
mass matrix has exactly this form, (LLᵀ) ⊗ I₃) apply unchanged.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import Partial

from .._system.structures import canonical
from .._system.system import System
from ._rod_networks import _Indices

#: The pairs of a body's four points held at fixed distances, and their squared distances.
_PAIRS = np.array([(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)])
_SQUARED = np.array([1.0, 1.0, 1.0, 2.0, 2.0, 2.0])


def second_moments(inertia) -> np.ndarray:
    """s_i = (I₁ + I₂ + I₃)/2 − I_i from the principal moments of inertia (each s_i > 0:
    every moment below the sum of the other two, a body with thickness in every direction)."""
    inertia = np.asarray(inertia, np.float64)
    if inertia.shape != (3,) or not np.all(np.isfinite(inertia)) or np.any(inertia <= 0):
        raise ValueError(f"inertia must be three positive principal moments of inertia, got {inertia.tolist()}")
    s = 0.5 * inertia.sum() - inertia
    if np.any(s <= 0):
        raise ValueError(
            f"the principal moments of inertia {inertia.tolist()} violate I_i < I_j + I_k (strictly): "
            "a flat or thin body has a zero second moment, and its four-point mass matrix is singular; "
            "give it some thickness"
        )
    return s


def body_mass_matrix(mass: float, inertia) -> np.ndarray:
    """𝕄 (4 × 4) of one body: its kinetic energy is ½ Σ_ab 𝕄_ab ẋ_a·ẋ_b over its points."""
    if not (np.isfinite(mass) and mass > 0):
        raise ValueError(f"a body's mass must be positive and finite, got {mass!r}")
    s = second_moments(inertia)
    out = np.zeros((4, 4))
    out[0, 0] = mass + s.sum()
    out[0, 1:] = out[1:, 0] = -s
    out[np.arange(1, 4), np.arange(1, 4)] = s
    return out


def _point_weights(point) -> np.ndarray:
    """Weights w over a body's four points with Σ_a w_a x_a the body point at `point` (in
    the body's principal frame, from its centre of mass): w = (1 − Σc, c₁, c₂, c₃)."""
    c = np.asarray(point, np.float64)
    if c.shape != (3,) or not np.all(np.isfinite(c)):
        raise ValueError(f"a body point must be 3 finite coordinates in the body's principal frame, got {c.tolist()}")
    return np.concatenate([[1.0 - c.sum()], c])


def _perpendicular(axis) -> np.ndarray:
    """Two unit vectors perpendicular to `axis` and to each other, (2, 3)."""
    a = np.asarray(axis, np.float64)
    a = a / np.linalg.norm(a)
    helper = np.eye(3)[int(np.argmin(np.abs(a)))]
    u = np.cross(a, helper)
    u /= np.linalg.norm(u)
    return np.stack([u, np.cross(a, u)])


class RigidBodies:
    """A builder of systems of rigid bodies in space, each a set of four points.

    Add bodies (`add_body`), then joints: `pin` (a body point held at a point of space, a
    ball joint to the ground), `join` (two bodies sharing a point, a ball joint between
    them) and `hinge` (a body turning about an axis fixed in space); `system(gravity=…)`
    returns the `geomjax.System`, and `state(...)` a state on its constraint set from the
    bodies' positions, orientations and velocities.

    Constraints, all holonomic, in this order: for each body the six
    ½(|x_a − x_b|² − L_ab²) of its points (L² = 1 from the centre to a tip, 2 between tips),
    then for each joint its rows, each linear in the points: ⟨Σ_a w_a x_a − c, d⟩ for a
    body point Σ_a w_a x_a (see `add_body`), a fixed point c and a direction d.

    Example: a body turning at ω has, on its four points, the kinetic energy
    ½M|v|² + ½ ωᵀ(R I Rᵀ)ω of the rigid body:

    ```python
    >>> import numpy as np, geomjax
    >>> bodies = geomjax.models.RigidBodies()
    >>> bodies.add_body(mass=3.0, inertia=(5.0, 4.0, 3.0))
    0
    >>> system = bodies.system()
    >>> v, w = np.array([0.3, 0.0, -0.1]), np.array([0.1, 2.0, 0.1])
    >>> x0 = bodies.state(velocities=v[None], angular_velocities=w[None])
    >>> float(np.abs(system.holonomic(x0[:12])).max())  # a rigid unit frame
    0.0
    >>> exact = 0.5 * 3.0 * v @ v + 0.5 * w @ np.diag([5.0, 4.0, 3.0]) @ w
    >>> bool(abs(float(system.hamiltonian(x0)) - exact) < 1e-13)
    True

    ```
    """

    def __init__(self):
        self.masses: list[float] = []
        self.inertias: list[np.ndarray] = []
        self._rows: list[tuple] = []  # (weights over all points (filled later per body), direction, value)

    @property
    def count(self) -> int:
        """The number of bodies."""
        return len(self.masses)

    def add_body(self, mass: float, inertia) -> int:
        """Add a body of `mass` with principal moments of inertia `inertia` (I₁, I₂, I₃)
        about its centre of mass, each below the sum of the other two; returns its index.
        Its points are 4·index … 4·index + 3: the centre, then the tips of the principal
        axes (a body point at c in the principal frame is (1 − Σc)·x₀ + Σ c_i x_i)."""
        body_mass_matrix(float(mass), inertia)  # checks
        self.masses.append(float(mass))
        self.inertias.append(np.asarray(inertia, np.float64))
        return self.count - 1

    def _body(self, body: int) -> int:
        if isinstance(body, bool) or not isinstance(body, (int, np.integer)) or not 0 <= body < self.count:
            raise ValueError(f"no body {body!r}: bodies are numbered 0 … {self.count - 1}")
        return int(body)

    def _add_rows(self, terms, at, directions):
        """Rows ⟨Σ (weights of `terms`) − at, d⟩ for each d of `directions`."""
        at = np.asarray(at, np.float64)
        if at.shape != (3,) or not np.all(np.isfinite(at)):
            raise ValueError(f"a point of space must be 3 finite coordinates, got {at.tolist()}")
        for d in np.asarray(directions, np.float64):
            self._rows.append((tuple(terms), d, float(at @ d)))

    def pin(self, body: int, point=(0.0, 0.0, 0.0), at=(0.0, 0.0, 0.0)) -> "RigidBodies":
        """Hold the body's `point` (principal frame, from its centre of mass) at the point
        `at` of space: a ball joint to the ground (3 constraints)."""
        self._add_rows([(self._body(body), _point_weights(point))], at, np.eye(3))
        return self

    def join(self, body_a: int, point_a, body_b: int, point_b) -> "RigidBodies":
        """A ball joint: the point `point_a` of body a and `point_b` of body b coincide
        (3 constraints)."""
        a, b = self._body(body_a), self._body(body_b)
        if a == b:
            raise ValueError("join connects two different bodies; a body's own points are already rigid")
        self._add_rows([(a, _point_weights(point_a)), (b, -_point_weights(point_b))], np.zeros(3), np.eye(3))
        return self

    def hinge(self, body: int, point, direction, at=(0.0, 0.0, 0.0), axis=(0.0, 0.0, 1.0)) -> "RigidBodies":
        """A hinge to the ground: the body's `point` held at `at`, and its axle (the unit
        `direction` in the principal frame, through `point`) along the fixed `axis` of space
        through `at` (3 + 2 constraints: the axle's far end has no component across `axis`)."""
        b = self._body(body)
        u = np.asarray(direction, np.float64)
        if u.shape != (3,) or not np.linalg.norm(u) > 0 or not np.linalg.norm(axis) > 0:
            raise ValueError("hinge needs a nonzero direction (principal frame) and a nonzero axis (space)")
        self.pin(b, point, at)
        tip = np.asarray(point, np.float64) + u / np.linalg.norm(u)
        self._add_rows([(b, _point_weights(tip))], at, _perpendicular(axis))
        return self

    # --- what the builder makes -----------------------------------------------------
    def mass_matrix(self) -> np.ndarray:
        """𝕄 over all points (4B × 4B, block diagonal): T = ½ Σ_ab 𝕄_ab ẋ_a·ẋ_b."""
        if not self.count:
            raise ValueError("add a body first (RigidBodies.add_body)")
        out = np.zeros((4 * self.count, 4 * self.count))
        for b, (m, inertia) in enumerate(zip(self.masses, self.inertias)):
            out[4 * b : 4 * b + 4, 4 * b : 4 * b + 4] = body_mass_matrix(m, inertia)
        return out

    def _joint_arrays(self):
        """(points (R, 8), weights (R, 8), directions (R, 3), values (R,)): row r of the joint
        constraints is ⟨Σ_k weights_rk x_{points_rk}, directions_r⟩ − values_r, over the four
        points of each of its (one or two) bodies: gathers, so each row depends on at most
        eight points and the constraints stay sparse whatever the number of bodies."""
        points = np.zeros((len(self._rows), 8), np.int64)
        weights = np.zeros((len(self._rows), 8))
        for r, (terms, _, _) in enumerate(self._rows):
            for slot, (body, w) in enumerate((terms * 2)[:2]):
                points[r, 4 * slot : 4 * slot + 4] = 4 * body + np.arange(4)
                weights[r, 4 * slot : 4 * slot + 4] = w if slot < len(terms) else 0.0
        directions = np.array([d for _, d, _ in self._rows]).reshape(-1, 3)
        values = np.array([v for _, _, v in self._rows])
        return points, weights, directions, values

    def system(self, gravity: float = 0.0, potential=None, integrals=None, integral_names=()) -> System:
        """The `geomjax.System`: H = ½pᵀ(𝕄⁻¹ ⊗ I₃)p + g Σ_b M_b z_b + V(q) (z_b the height of
        body b's centre of mass, gravity along −z; `potential`: an optional V(q) of the flat
        points q), with the constraints of the class docstring as `holonomic=` and the
        first `integrals` the system has (`integral_names`, one per entry, name them).
        𝕄⁻¹ is applied body by body (B × 4 × 4), never as a dense matrix over all points."""
        if not self.count:
            raise ValueError("add a body first (RigidBodies.add_body)")
        inverse = np.stack([np.linalg.inv(body_mass_matrix(m, i)) for m, i in zip(self.masses, self.inertias)])
        points, weights, directions, values = self._joint_arrays()
        ham = Partial(_hamiltonian, jnp.asarray(inverse), jnp.asarray(self.masses), jnp.asarray(float(gravity)), potential)
        con = Partial(_constraints, self.count, _Indices(points), jnp.asarray(weights), jnp.asarray(directions),
                      jnp.asarray(values))
        k = 6 * self.count + len(self._rows)
        names = tuple(f"g{i}" for i in range(1, k + 1)) + tuple(f"gdot{i}" for i in range(1, k + 1)) + ("H",)
        return System(ham, canonical(12 * self.count), holonomic=con, integrals=integrals,
                      names=names + tuple(integral_names))

    def state(self, centres=None, rotations=None, velocities=None, angular_velocities=None) -> jax.Array:
        """The flat state (q, p) of the bodies with centres of mass `centres` (B, 3), orientations
        `rotations` (B, 3, 3: columns the principal axes in space), centre velocities
        `velocities` (B, 3) and angular velocities `angular_velocities` (B, 3, in space):
        x₀ = centre, x_i = x₀ + R e_i, ẋ_i = v + ω × R e_i, p = (𝕄 ⊗ I₃)ẋ. Defaults: at
        the origin, unrotated, at rest. The six distance constraints of each body hold
        exactly; joints hold where the motions given respect them (a body turning about a
        fixed pivot c moves its centre at v = ω × (x₀ − c))."""
        b = self.count
        c = np.zeros((b, 3)) if centres is None else np.asarray(centres, np.float64)
        r = np.broadcast_to(np.eye(3), (b, 3, 3)) if rotations is None else np.asarray(rotations, np.float64)
        v = np.zeros((b, 3)) if velocities is None else np.asarray(velocities, np.float64)
        w = np.zeros((b, 3)) if angular_velocities is None else np.asarray(angular_velocities, np.float64)
        for name, a, shape in (("centres", c, (b, 3)), ("rotations", r, (b, 3, 3)), ("velocities", v, (b, 3)),
                               ("angular_velocities", w, (b, 3))):
            if a.shape != shape:
                raise ValueError(f"{name} must have shape {shape} for {b} bodies, got {a.shape}")
        axes = np.swapaxes(r, 1, 2)  # (B, 3 axes, 3 coordinates)
        if np.abs(np.einsum("bij,bkj->bik", axes, axes) - np.eye(3)).max() > 1e-12:
            raise ValueError("rotations must be orthogonal matrices (columns the principal axes in space)")
        points = np.concatenate([c[:, None], c[:, None] + axes], axis=1)  # (B, 4, 3)
        point_velocities = np.concatenate([v[:, None], v[:, None] + np.cross(w[:, None], axes)], axis=1)
        blocks = np.stack([body_mass_matrix(m, i) for m, i in zip(self.masses, self.inertias)])
        momenta = np.einsum("bij,bjk->bik", blocks, point_velocities).reshape(-1)
        return jnp.asarray(np.concatenate([points.reshape(-1), momenta]))


def angular_momentum(x):
    """Σ_a x_a × p_a over the points of a flat state (q, p): the angular momentum about the
    origin, the momentum map of rotations of space (conserved where the potential and the
    joints are invariant under them)."""
    n = x.shape[0] // 2
    return jnp.sum(jnp.cross(x[:n].reshape(-1, 3), x[n:].reshape(-1, 3)), axis=0)


def _hamiltonian(inverse, masses, gravity, potential, x):
    n = x.shape[0] // 2
    q, p = x[:n], x[n:]
    momenta = p.reshape(-1, 4, 3)  # (bodies, points, coordinates)
    kinetic = 0.5 * jnp.sum(momenta * jnp.einsum("bij,bjk->bik", inverse, momenta))
    heights = q.reshape(-1, 4, 3)[:, 0, 2]  # the centres of mass
    out = kinetic + gravity * jnp.dot(masses, heights)
    return out if potential is None else out + potential(q)


def _constraints(count, points, weights, directions, values, q):
    bodies = q.reshape(count, 4, 3)
    d = bodies[:, _PAIRS[:, 0]] - bodies[:, _PAIRS[:, 1]]  # (B, 6, 3)
    rigid = 0.5 * (jnp.sum(d * d, axis=-1) - _SQUARED).reshape(-1)
    if weights.shape[0] == 0:
        return rigid
    joined = jnp.sum(weights[:, :, None] * q.reshape(-1, 3)[points.array], axis=1)  # (R, 3)
    return jnp.concatenate([rigid, jnp.sum(joined * directions, axis=1) - values])
