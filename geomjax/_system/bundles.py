"""Left-trivialised cotangent bundles T*G ≅ G × g* of matrix groups, embedded in Euclidean space.

A state is a pair of pieces `(g, μ)`: the group element `g` in an embedding (a rotation
matrix R ∈ R^{3×3}; for SE(2) the vector (x, y, cos θ, sin θ)), and the body momentum
μ ∈ g*. Optionally a shape space T*Rⁿ is appended (trivial principal bundles G × S): its
coordinates r are appended to the configuration piece and their momenta p_r to the
momentum piece, so the pieces are always `(configuration, momentum)` as for T*Rⁿ.

With ξ = ∂H/∂μ the body velocity, the equations X_H = B∇H read

    ġ = g ξ,    μ̇ = ad*_ξ μ − τ,    ṙ = ∂H/∂p_r,    ṗ_r = −∂H/∂r,

where τ is the left-trivialised derivative of H in g: τ·η = ⟨∂H/∂g, g η⟩ for η ∈ g.
Away from the group (RᵀR ≠ I, cos² + sin² ≠ 1) the same formulas define an antisymmetric
B, so H stays a first integral there; this is the extension that feedback integrators need.
`embedding_defect(g)` vanishes exactly on the group and ½‖defect‖² is a first integral of
every field of this form (so it can enter a Lyapunov function).
"""

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .structures import AbstractPoissonStructure


def _row_cross(rows, w):
    """Each row r of `rows` (shape (3, 3)) replaced by r × w: this is rows @ hat(w)."""
    a0, a1, a2 = rows[:, 0], rows[:, 1], rows[:, 2]
    return jnp.stack([a1 * w[2] - a2 * w[1], a2 * w[0] - a0 * w[2], a0 * w[1] - a1 * w[0]], axis=1)


def _cross(a, b):
    return jnp.stack([a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]])


class LeftTrivialisedSO3(AbstractPoissonStructure):
    """T*SO(3) ≅ SO(3) × so(3)* with R ∈ R^{3×3} embedded; pieces `(R, Π)`, R of shape (3, 3).

    Ṙ = R Ω̂ and Π̇ = Π × Ω − τ with Ω = ∂H/∂Π and τ = vee(A − Aᵀ), A = Rᵀ ∂H/∂R (so
    τ·η = ⟨∂H/∂R, R η̂⟩). The flat state is `(R.ravel(), Π)` (length 12).
    """

    nonholonomic_layout = "pair"
    embedded = True

    @property
    def dim(self):
        return 12

    def split(self, x):
        return (x[:9].reshape(3, 3), x[9:])

    def merge(self, z):
        return jnp.concatenate([z[0].reshape(9), z[1]])

    def apply(self, z, grad):
        r, pi = z
        g_r, g_pi = grad
        a = r.T @ g_r
        tau = jnp.stack([a[2, 1] - a[1, 2], a[0, 2] - a[2, 0], a[1, 0] - a[0, 1]])
        return (_row_cross(r, g_pi), _cross(pi, g_pi) - tau)

    def embedding_residual(self, x):
        return jnp.ravel(self.embedding_defect(self.split(x)[0]))

    def embedding_defect(self, r):
        """RᵀR − I (shape (3, 3)); zero exactly on SO(3)."""
        return r.T @ r - np.eye(3)


class LeftTrivialisedSE2(AbstractPoissonStructure):
    """T*(SE(2) × Rⁿ) ≅ SE(2) × se(2)* × T*Rⁿ with the angle embedded as (cos θ, sin θ).

    Pieces `(g, μ)`: g = (x, y, c, s, r₁..rₙ) and μ = (μ_θ, μ_x, μ_y, p_r₁..p_rₙ), body
    velocity ξ = ∂H/∂μ = (ω, v_x, v_y, ṙ). Then ẋ = c v_x − s v_y, ẏ = s v_x + c v_y,
    ċ = −s ω, ṡ = c ω, ṙ = ∂H/∂p_r; μ̇ follows the se(2)* Lie–Poisson bracket of
    `geomjax.lie_poisson_se2` minus the left-trivialised derivative of H in (x, y, c, s),
    and ṗ_r = −∂H/∂r. The flat state is `(g, μ)` (length 2(4 + n) − 2).
    """

    shape: int = eqx.field(static=True, default=0)
    nonholonomic_layout = "pair"
    embedded = True

    @property
    def dim(self):
        return 7 + 2 * self.shape

    def split(self, x):
        k = 4 + self.shape
        return (x[:k], x[k:])

    def merge(self, z):
        return jnp.concatenate(z)

    def apply(self, z, grad):
        g, mu = z
        g_g, g_mu = grad
        c, s = g[2], g[3]
        w, vx, vy = g_mu[0], g_mu[1], g_mu[2]
        gx, gy, gc, gs = g_g[0], g_g[1], g_g[2], g_g[3]
        g_dot = [c * vx - s * vy, s * vx + c * vy, -s * w, c * w]
        tau = (-s * gc + c * gs, c * gx + s * gy, -s * gx + c * gy)
        mx, my = mu[1], mu[2]
        mu_dot = [-my * vx + mx * vy - tau[0], my * w - tau[1], -mx * w - tau[2]]
        if self.shape:
            g_dot = jnp.concatenate([jnp.stack(g_dot), g_mu[3:]])
            mu_dot = jnp.concatenate([jnp.stack(mu_dot), -g_g[4:]])
            return (g_dot, mu_dot)
        return (jnp.stack(g_dot), jnp.stack(mu_dot))

    def embedding_residual(self, x):
        return jnp.ravel(self.embedding_defect(self.split(x)[0]))

    def embedding_defect(self, g):
        """cos² + sin² − 1 (shape (1,)); zero exactly on SE(2)."""
        return jnp.stack([g[2] * g[2] + g[3] * g[3] - 1.0])


def left_trivialised_so3() -> LeftTrivialisedSO3:
    """Left-trivialised T*SO(3) with the rotation matrix embedded in R^{3×3}.

    A rigid body's attitude R and body angular momentum Π, flat state `(R.ravel(), Π)`:
    Ṙ = R Ω̂, Π̇ = Π × Ω − τ, Ω = ∂H/∂Π, τ the left-trivialised torque of ∂H/∂R. Off SO(3)
    the field keeps H and ‖RᵀR − I‖² constant; `embedding_defect(R) = RᵀR − I`.

    Example:

    ```python
    inertia = jnp.array([1.0, 2.0, 3.0])
    body = geomjax.System(lambda x: 0.5 * jnp.sum(x[9:] ** 2 / inertia),
                          geomjax.left_trivialised_so3())
    ```
    """
    return LeftTrivialisedSO3()


def left_trivialised_se2(shape: int = 0) -> LeftTrivialisedSE2:
    """Left-trivialised T*SE(2) (times a shape space T*Rⁿ), angle embedded as (cos θ, sin θ).

    **Arguments:**

    - `shape`: number n of shape coordinates (a trivial principal bundle SE(2) × Rⁿ, e.g.
      the roller racer's joint angle, n = 1).

    **Returns:**

    A structure with pieces `(g, μ)`, g = (x, y, cos θ, sin θ, r), μ = (μ_θ, μ_x, μ_y, p_r);
    `embedding_defect(g) = cos² + sin² − 1`.

    Example (Chaplygin sleigh, constraint v_y = 0 on the body velocity ∂H/∂μ):

    ```python
    >>> import jax.numpy as jnp, geomjax
    >>> H = lambda x: 0.5 * jnp.sum(x[4:] ** 2)   # unit mass and inertia, body momenta μ
    >>> system = geomjax.System(H, geomjax.left_trivialised_se2(),
    ...                         nonholonomic=lambda g: jnp.array([[0.0, 0.0, 1.0]]))
    >>> system.dim
    7

    ```
    """
    if not isinstance(shape, int) or shape < 0:
        raise ValueError(f"shape must be a non-negative integer, got {shape!r}")
    return LeftTrivialisedSE2(shape)
