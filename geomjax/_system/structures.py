"""Poisson structures: the tensor B(x) with {F, G} = ∇F·B∇G and X_F = B∇F.

A structure also says how a flat state `x` splits into the pieces carried inside compiled
loops (for T*Rⁿ the pair `(q, p)`): slicing and concatenating a flat state inside a loop
splits XLA's fusions, so fields and steps work on the pieces and only the public boundary
sees flat arrays.
"""

import abc
from collections.abc import Callable

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from ..internal.pieces import evaluate_on_pieces


class AbstractPoissonStructure(eqx.Module):
    """A Poisson tensor B(x) on a flat state space of dimension `dim`.

    Subclasses implement `split`/`merge` (flat state ↔ pieces) and `apply` (B(x) times a
    gradient, both in pieces), applying B structurally where its form is known.
    """

    dim: eqx.AbstractVar[int]
    #: Which pieces are momenta (for nonholonomic constraints on the velocity ∂H/∂m):
    #: "pair" for pieces (configuration, momentum), "momentum" when the whole state is a
    #: momentum (Lie–Poisson spaces), None when the structure does not say.
    nonholonomic_layout = None
    #: True for structures embedded in a Euclidean space (a rotation matrix in R^{3×3},
    #: an angle as (cos θ, sin θ)), whose `embedding_residual` vanishes on the group.
    embedded = False

    @abc.abstractmethod
    def split(self, x):
        """Flat state `x` (shape `(dim,)`) → pieces carried in loops."""

    @abc.abstractmethod
    def merge(self, z):
        """Pieces → flat state of shape `(dim,)`."""

    @abc.abstractmethod
    def apply(self, z, grad):
        """Return B(x)·grad in pieces, for `z` the state and `grad` a covector, both in pieces."""

    def evaluate(self, fn, z):
        """`fn(merge(z))`: a function of the flat state, evaluated at a state in pieces.

        `CanonicalStructure` evaluates it with `geomjax.internal.pieces`, a jaxpr
        interpreter that reads the user's slices x[:n], x[n:] straight from (q, p), so
        reverse-mode autodiff creates no `pad`s. Derived fields do not need it (the
        simplification pass sees through the concatenate), but steps that differentiate H
        inside a Newton iteration do: RATTLE on the spherical pendulum
        (`benchmarks/rattle.py`) runs much faster with it, as fast as a Newton RATTLE
        written by hand.
        """
        return fn(self.merge(z))

    def embedding_residual(self, x):
        """How far the flat state `x` is off the embedded group (flattened; empty for
        structures that embed nothing). Zero exactly on the group."""
        return jnp.zeros((0,), jnp.asarray(x).dtype)

    def matrix(self, x):
        """The dense matrix B(x), shape `(dim, dim)` (for checks and small problems)."""
        z = self.split(x)
        eye = jnp.eye(self.dim, dtype=x.dtype)
        cols = [self.merge(self.apply(z, self.split(e))) for e in eye]
        return jnp.stack(cols, axis=1)


class CanonicalStructure(AbstractPoissonStructure):
    """Canonical structure on T*Rⁿ, x = (q, p), B = [[0, I], [−I, 0]].

    Hamilton's equations q̇ = ∂H/∂p, ṗ = −∂H/∂q; the bracket is
    {F, G} = ∂F/∂q·∂G/∂p − ∂F/∂p·∂G/∂q. B is applied as the permutation
    (a, b) ↦ (b, −a), never as a matrix product.
    """

    nonholonomic_layout = "pair"

    n: int = eqx.field(static=True)

    @property
    def dim(self):
        return 2 * self.n

    def split(self, x):
        return (x[: self.n], x[self.n :])

    def merge(self, z):
        return jnp.concatenate(z)

    def evaluate(self, fn, z):
        return evaluate_on_pieces(fn, z)

    def apply(self, z, grad):
        gq, gp = grad
        return (gp, -gq)


def canonical(n: int) -> CanonicalStructure:
    """Canonical Poisson structure on x = (q, p) ∈ R²ⁿ.

    B = [[0, Iₙ], [−Iₙ, 0]], so X_H = (∂H/∂p, −∂H/∂q) and
    {F, G} = ∂F/∂q·∂G/∂p − ∂F/∂p·∂G/∂q.

    **Arguments:**

    - `n`: number of degrees of freedom (the length of q).

    **Returns:**

    A `CanonicalStructure`; flat states are `x = concatenate([q, p])`.

    Example:

    ```python
    B = geomjax.canonical(3)
    system = geomjax.System(lambda x: 0.5 * x[3:] @ x[3:] + x[2], B)
    ```
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"canonical(n) needs a positive integer n, got {n!r}")
    return CanonicalStructure(n)


def _cross(a, b):
    return jnp.stack(
        [
            a[1] * b[2] - a[2] * b[1],
            a[2] * b[0] - a[0] * b[2],
            a[0] * b[1] - a[1] * b[0],
        ]
    )


class _FlatStructure(AbstractPoissonStructure):
    """A structure whose state is carried whole (one piece): split and merge are identities."""

    def split(self, x):
        return x

    def merge(self, z):
        return z


class LiePoissonSO3(_FlatStructure):
    """Lie–Poisson structure on so(3)* ≅ R³ (body angular momentum Π).

    B(Π)v = Π × v, so Π̇ = Π × ∇H (Euler's equations for H = ½Π·I⁻¹Π) and
    {F, G}(Π) = −Π·(∇F × ∇G).
    """

    nonholonomic_layout = "momentum"

    @property
    def dim(self):
        return 3

    def apply(self, z, grad):
        return _cross(z, grad)


def lie_poisson_so3() -> LiePoissonSO3:
    """The (minus) Lie–Poisson structure on so(3)*: {F, G}(Π) = −Π·(∇F × ∇G).

    **Returns:**

    A structure on Π ∈ R³ with X_H(Π) = Π × ∇H(Π), applied as a cross product.

    Example:

    ```python
    inertia = jnp.array([3.0, 2.0, 1.0])
    rigid_body = geomjax.System(lambda m: 0.5 * jnp.sum(m**2 / inertia),
                                geomjax.lie_poisson_so3())
    ```
    """
    return LiePoissonSO3()


class LiePoissonSE2(_FlatStructure):
    """Lie–Poisson structure on se(2)* with coordinates μ = (μ_θ, μ_x, μ_y).

    With the bracket [(ω, v), (ω', v')] = (0, ω Jv' − ω' Jv), J the rotation by π/2:
    {μ_θ, μ_x} = −μ_y, {μ_θ, μ_y} = μ_x, {μ_x, μ_y} = 0, so
    B(μ) = [[0, −μ_y, μ_x], [μ_y, 0, 0], [−μ_x, 0, 0]].
    """

    nonholonomic_layout = "momentum"

    @property
    def dim(self):
        return 3

    def apply(self, z, grad):
        mx, my = z[1], z[2]
        g0, g1, g2 = grad[0], grad[1], grad[2]
        return jnp.stack([-my * g1 + mx * g2, my * g0, -mx * g0])


def lie_poisson_se2() -> LiePoissonSE2:
    """The (minus) Lie–Poisson structure on se(2)*, μ = (μ_θ, μ_x, μ_y).

    B(μ) = [[0, −μ_y, μ_x], [μ_y, 0, 0], [−μ_x, 0, 0]]: a planar rigid body's body
    momenta, with μ̇_θ = μ_x ∂H/∂μ_y − μ_y ∂H/∂μ_x and μ̇_v = −(∂H/∂μ_θ) J μ_v.

    **Returns:**

    A structure on μ ∈ R³, applied elementwise (no matrix product).

    Example:

    ```python
    >>> import geomjax
    >>> planar_body = geomjax.System(lambda m: 0.5 * m @ m, geomjax.lie_poisson_se2())
    >>> planar_body.dim
    3

    ```
    """
    return LiePoissonSE2()


class PoissonStructure(_FlatStructure):
    """A user-supplied Poisson tensor x ↦ B(x) on R^dim, applied as a dense product.

    **Arguments:**

    - `tensor`: callable `x ↦ B(x)` returning an antisymmetric `(dim, dim)` array that
      satisfies the Jacobi identity (not checked; `geomjax.bracket` lets you test it). A
      matrix is a TypeError: for a constant B pass `lambda x: B`.
    - `dim`: the dimension of the state space (optional; when given, states of another
      length are rejected with a clear error).

    Example:

    ```python
    B = geomjax.PoissonStructure(lambda x: jnp.array([[0.0, 1.0], [-1.0, 0.0]]))
    ```
    """

    tensor: Callable
    dim: int | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        if not callable(self.tensor):
            shape = getattr(self.tensor, "shape", None)
            got = f"an array of shape {tuple(shape)}" if shape is not None else f"a {type(self.tensor).__name__}"
            n = shape[0] if shape is not None and len(shape) == 2 else "n"
            raise TypeError(
                f"PoissonStructure takes a callable x ↦ B(x), got {got}. For a constant tensor B, "
                f"pass a function that returns it: geomjax.PoissonStructure(lambda x: B, dim={n})"
            )
        if self.dim is not None and (
            isinstance(self.dim, bool) or not isinstance(self.dim, (int, np.integer)) or self.dim < 1
        ):
            raise ValueError(f"PoissonStructure: dim must be a positive integer (or None), got {self.dim!r}")

    def apply(self, z, grad):
        return self.tensor(z) @ grad

    def matrix(self, x):
        return self.tensor(x)
