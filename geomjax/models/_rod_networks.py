"""Point masses held by rigid rods on a sparse graph: cloths, trees, rings and rigid molecules.

Each is a `System` on T*R^{dn} (n particles in R^d, d = 2 or 3) with

    H(q, p) = Σ_i |p_i|²/(2m_i) + g Σ_i m_i q_i·e_up + U_pair(q),
    g_e(q) = ½(|q_a − q_b|² − ℓ_e²) = 0   for every rod e = (a, b),
    q_i − c_i = 0                          for every pinned particle i (d rows each),

written with the edge list as index arrays (`q[E[:, 0]] − q[E[:, 1]]`), the way such
systems are written. Every row of G = Dg has at most 2d nonzeros and G M⁻¹ Gᵀ is as sparse
as the graph: these are the reference problems for the constraint solvers of large
sparse graphs (`geomjax.rattle` finds the pattern by itself; benchmarks/constraint_scaling.py).
Each start lies on the constraint set S = {g = 0, G M⁻¹ p = 0} to round-off by construction
(positions from exact rod geometry, velocities at rest, rigid or normal to every rod).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._system.structures import canonical
from .._system.system import System
from ._model import Model, flat_state
from ._model import model_params as _params


class _Indices:
    """A constant integer array as a static (hashable) field: equal arrays compare equal, so
    programs are shared, and the indices stay constants the sparsity analysis can read."""

    def __init__(self, array):
        self.array = np.asarray(array, np.int64)
        self.array.setflags(write=False)
        self._hash = hash((self.array.shape, self.array.tobytes()))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return isinstance(other, _Indices) and np.array_equal(self.array, other.array)


class RodConstraints(eqx.Module):
    """g(q) = (½(|q_a − q_b|² − ℓ_e²) for each rod e = (a, b); q_i − c_i for each pin i)."""

    lengths: jax.Array
    anchors: jax.Array
    edges: _Indices = eqx.field(static=True)
    pins: _Indices = eqx.field(static=True)
    dim: int = eqx.field(static=True)

    def __call__(self, q):
        points = q.reshape(-1, self.dim)
        e = self.edges.array
        d = points[e[:, 0]] - points[e[:, 1]]
        rods = 0.5 * (jnp.sum(d * d, axis=1) - self.lengths**2)
        if not self.pins.array.size:
            return rods
        pinned = (points[self.pins.array] - self.anchors).reshape(-1)
        return jnp.concatenate([rods, pinned])


class RodHamiltonian(eqx.Module):
    """H = Σ|p_i|²/(2m_i) + g Σ m_i (q_i)_up + ε Σ_{pairs} (1 − r/σ)² [r < σ]."""

    inverse_mass: jax.Array  # one per particle
    gravity: jax.Array
    repulsion: jax.Array
    radius: jax.Array
    pairs: _Indices = eqx.field(static=True)
    dim: int = eqx.field(static=True)

    def __call__(self, x):
        half = x.shape[0] // 2
        q, p = x[:half].reshape(-1, self.dim), x[half:].reshape(-1, self.dim)
        kinetic = 0.5 * jnp.sum(self.inverse_mass * jnp.sum(p * p, axis=1))
        height = jnp.sum(q[:, -1] / self.inverse_mass)
        energy = kinetic + self.gravity * height
        if self.pairs.array.size:
            pr = self.pairs.array
            d = q[pr[:, 0]] - q[pr[:, 1]]
            r = jnp.sqrt(jnp.sum(d * d, axis=1))
            overlap = jnp.maximum(1.0 - r / self.radius, 0.0)
            energy = energy + self.repulsion * jnp.sum(overlap**2)
        return energy


def _network_model(name, points, momenta, masses, edges, lengths, pins, params, *, pairs=None, radius=1.0):
    n, dim = points.shape
    pins = np.asarray(pins, np.int64).reshape(-1)
    anchors = points[pins] if pins.size else jnp.zeros((0, dim))
    constraint = RodConstraints(jnp.asarray(lengths, jnp.float64), jnp.asarray(anchors), _Indices(edges),
                                _Indices(pins), dim)
    pairs = np.zeros((0, 2), np.int64) if pairs is None else pairs
    hamiltonian = RodHamiltonian(1.0 / jnp.asarray(masses, jnp.float64), params["g"],
                                 params.get("repulsion", jnp.asarray(0.0)), jnp.asarray(radius, jnp.float64),
                                 _Indices(pairs), dim)
    system = System(hamiltonian, canonical(n * dim), holonomic=constraint)
    x0 = flat_state(points, momenta)
    return Model(name, system, params, x0, ())


def _uniform_model(name, unit_points, unit_velocities, edges, pins, params):
    """Equal masses m and rods of equal length ℓ: the geometry given for ℓ = 1 and unit
    velocities, scaled (q = ℓ q₁, p = m ℓ v₁: a start on the constraint set for any ℓ, m,
    which may be traced)."""
    n = unit_points.shape[0]
    length, mass = params["length"], params["m"]
    points = jnp.asarray(unit_points) * length
    momenta = jnp.asarray(unit_velocities) * (mass * length)
    masses = jnp.ones(n) * mass
    lengths = jnp.ones(len(edges)) * length
    return _network_model(name, points, momenta, masses, edges, lengths, pins, params)


def _grid_edges(rows: int, cols: int) -> np.ndarray:
    """Rods along the edges of a rows × cols grid of particles (row-major numbering)."""
    idx = np.arange(rows * cols).reshape(rows, cols)
    across = np.stack([idx[:, :-1].reshape(-1), idx[:, 1:].reshape(-1)], axis=1)
    down = np.stack([idx[:-1, :].reshape(-1), idx[1:, :].reshape(-1)], axis=1)
    return np.concatenate([across, down])


def cloth(n: int = 8, *, space: bool = False, mass=1.0, length=1.0, gravity=9.81, sag: float = 0.3,
          shear: float = 0.3, swing: float = 1.0) -> Model:
    """An n × n cloth: point masses on a grid held by rods of length ℓ along the grid's edges.

    m = 2n(n − 1) rod constraints ½(|q_a − q_b|² − ℓ²) = 0 plus the pins, H as in the module
    docstring with the last coordinate up (gravity −g).

    - `space=False` (planar, d = 2): a grid of rhombi in the vertical plane, hung from its
      two pinned top corners. Its configurations are q_ij = Σ_{k<j} a_k + Σ_{k<i} b_k with
      unit rod directions a (along the top row) and b (down the columns); the start has
      the top row bent into a V at the angle `sag` below the horizontal and the columns at
      the angle `shear` from the downward vertical, at rest. A rhombus flattens (a_j ∥ b_i)
      only far from this start, where the constraints become dependent.
    - `space=True` (d = 3): the same start in the vertical x–z plane, hung from the same two
      corners, moving out of its plane with v_y = `swing`·sin(πj/(n − 1))·(i + 1)/n
      (normal to every rod, so G M⁻¹p = 0 exactly, and zero at the pins): it billows.

    Pins are holonomic constraints q_i − c_i = 0 (d rows each). The start lies on the
    constraint set to round-off (exact rod geometry, at rest).

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.cloth(4)
    >>> model.system.dim, int(model.system.holonomic(model.x0[:32]).shape[0])  # 16 particles, 24 rods, 2 pins
    (64, 28)
    >>> sol = geomjax.integrate(geomjax.rattle(model.system), model.x0, dt=0.01, steps=20)
    >>> sol.message
    'success'

    ```
    """
    n = int(n)
    if n < 2:
        raise ValueError(f"a cloth needs n >= 2 particles a side, got {n}")
    params = _params(m=mass, g=gravity, length=length)
    ell = 1.0  # the geometry for unit rods, scaled by ℓ below (which may be traced)
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    k = np.arange(n - 1)
    slope = np.where(k < (n - 1) // 2, -sag, np.where(k >= n // 2, sag, 0.0))  # a V, level in the middle
    a = ell * np.stack([np.cos(slope), np.sin(slope)], axis=1)
    b = ell * np.array([np.sin(shear), -np.cos(shear)])
    top = np.concatenate([np.zeros((1, 2)), np.cumsum(a, axis=0)])
    points = (top[None, :, :] + np.arange(n)[:, None, None] * b).reshape(-1, 2)
    momenta = np.zeros_like(points)
    pins = [0, n - 1]
    if space:
        points = np.stack([points[:, 0], np.zeros(n * n), points[:, 1]], axis=1)
        out = swing * np.sin(np.pi * j / (n - 1)) * (i + 1) / n
        momenta = np.stack([np.zeros(n * n), out.reshape(-1), np.zeros(n * n)], axis=1)
    edges = _grid_edges(n, n)
    return _uniform_model("cloth", points, momenta, edges, pins, params)


def rod_tree(n_particles: int = 64, *, seed: int = 0, mass=1.0, length=1.0, gravity=9.81) -> Model:
    """A random tree of rods in space: particle 0 pinned at the origin, each later particle
    hung by a rod of length ℓ from a random earlier one, in a random direction.

    m = (n − 1) rods + 3 pin rows; released from rest under gravity (−z). The random tree
    (`seed`) has no bandwidth-reducing order that makes G M⁻¹Gᵀ banded, unlike a chain.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.rod_tree(32)
    >>> float(abs(model.system.holonomic(model.x0[:96])).max()) < 1e-14
    True

    ```
    """
    n = int(n_particles)
    if n < 2:
        raise ValueError(f"a tree needs at least 2 particles, got {n}")
    rng = np.random.default_rng(seed)
    params = _params(m=mass, g=gravity, length=length)
    parents = np.array([rng.integers(0, i) for i in range(1, n)])
    directions = rng.normal(size=(n - 1, 3))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    points = np.zeros((n, 3))
    for i in range(1, n):
        points[i] = points[parents[i - 1]] + directions[i - 1]
    edges = np.stack([np.arange(1, n), parents], axis=1)
    return _uniform_model("rod_tree", points, np.zeros_like(points), edges, [0], params)


def rod_ring(n_rods: int = 32, *, mass=1.0, length=1.0, gravity=9.81, swing: float = 0.5) -> Model:
    """A closed ring of `n_rods` rods in space, hung from its pinned particle 0.

    The start is the regular polygon of side ℓ in the vertical x–z plane with particle 0 on
    top, moving out of its plane with velocities v_i = a(1 − cos φ_i) e_y (`swing` = a,
    φ_i = 2πi/n): normal to every rod, so G M⁻¹ p = 0 exactly. m = n rods + 3 pin rows.
    Closing the chain makes G M⁻¹Gᵀ cyclic, not tridiagonal.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.rod_ring(16)
    >>> float(abs(model.system.holonomic(model.x0[:48])).max()) < 1e-14
    True

    ```
    """
    n = int(n_rods)
    if n < 3:
        raise ValueError(f"a ring needs at least 3 rods, got {n}")
    params = _params(m=mass, g=gravity, length=length)
    phi = 2 * np.pi * np.arange(n) / n
    radius = 1.0 / (2 * np.sin(np.pi / n))  # unit rods, scaled by ℓ
    points = np.stack([radius * np.sin(phi), np.zeros(n), radius * (np.cos(phi) - 1.0)], axis=1)
    momenta = np.stack([np.zeros(n), swing * (1.0 - np.cos(phi)), np.zeros(n)], axis=1)
    edges = np.stack([np.arange(n), (np.arange(n) + 1) % n], axis=1)
    return _uniform_model("rod_ring", points, momenta, edges, [0], params)


#: Rigid-water-like geometry (SPC-like): O–H bond length and H–O–H angle, masses O 16, H 1.
_OH, _HOH = 1.0, np.deg2rad(109.47)


def water_box(n_side: int = 4, *, spacing: float = 3.0, seed: int = 0, repulsion=1.0, radius: float = 2.5,
              speed: float = 0.1) -> Model:
    """A box of n_side³ rigid triatomic molecules (O and two H), each held rigid by three
    distance constraints (O–H₁, O–H₂, H₁–H₂), with a soft pairwise repulsion
    ε Σ (1 − r/σ)² (r < σ = `radius`) between the oxygens of different molecules.

    Molecules sit on a cubic lattice of `spacing`, randomly oriented (`seed`), each moving
    rigidly with a random translation and rotation of size `speed` (rigid motion keeps
    every distance, so G M⁻¹ p = 0 exactly). Masses 16 (O) and 1 (H): G M⁻¹Gᵀ has a
    block-diagonal 3 × 3 pattern whose entries differ 16-fold, a test of the preconditioner.
    m = 3 n_side³ constraints, no pins, no gravity.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.water_box(2)
    >>> model.system.dim, float(abs(model.system.holonomic(model.x0[:72])).max()) < 1e-14
    (144, True)

    ```
    """
    k = int(n_side)
    if k < 1:
        raise ValueError(f"n_side must be at least 1, got {n_side}")
    rng = np.random.default_rng(seed)
    params = _params(g=0.0, repulsion=repulsion)
    template = np.array([[0.0, 0.0, 0.0],
                         [_OH * np.sin(_HOH / 2), 0.0, _OH * np.cos(_HOH / 2)],
                         [-_OH * np.sin(_HOH / 2), 0.0, _OH * np.cos(_HOH / 2)]])
    template -= (16 * template[0] + template[1] + template[2]) / 18  # centre of mass at 0
    centres = spacing * np.stack(np.meshgrid(*[np.arange(k)] * 3, indexing="ij"), -1).reshape(-1, 3).astype(float)
    points, momenta = [], []
    masses = np.tile([16.0, 1.0, 1.0], len(centres))
    for c in centres:
        rot, _ = np.linalg.qr(rng.normal(size=(3, 3)))
        arm = template @ rot.T
        v, w = speed * rng.normal(size=3), speed * rng.normal(size=3)
        points.append(c + arm)
        momenta.append(np.array([16.0, 1.0, 1.0])[:, None] * (v + np.cross(w, arm)))
    points, momenta = np.concatenate(points), np.concatenate(momenta)
    base = 3 * np.arange(len(centres))[:, None, None]
    edges = (base + np.array([[0, 1], [0, 2], [1, 2]])).reshape(-1, 2)
    hh = 2 * _OH * np.sin(_HOH / 2)
    lengths = np.tile([_OH, _OH, hh], len(centres))
    oxygens = 3 * np.arange(len(centres))
    a, b = np.triu_indices(len(centres), 1)
    pairs = np.stack([oxygens[a], oxygens[b]], axis=1)
    return _network_model("water_box", jnp.asarray(points), momenta, masses, edges, lengths, [], params, pairs=pairs, radius=radius)
