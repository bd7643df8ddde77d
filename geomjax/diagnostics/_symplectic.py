"""Symplecticity (and Poisson-map) defects of a step map, by `jax.jacfwd`.

A map Φ on T*Rⁿ is symplectic when DΦᵀ Ω DΦ = Ω, Ω = [[0, I], [−I, 0]]. A constrained
method is a map of the constraint manifold S = {f = const}, and only its restriction to S
can be symplectic (for ω restricted to S): off S the step map also contracts towards S.
So the defect is measured on tangent vectors of S only.

Tangent vectors are produced by the projector onto T_xS along the symplectic complement
T_xS^ω = span{X_{f_j}(x)} (the splitting T_xP = T_xS ⊕ T_xS^ω used by the Dirac formula):
writing v = u + Σⱼ cⱼ X_{f_j} with Df·u = 0 gives Df·v = C c, so

    P = I − B Dfᵀ C⁻¹ Df,   C = Df B Dfᵀ = ({f_i, f_j}),

which is the identity on T_xS and zero on T_xS^ω, and the restricted defect is
‖Pᵀ(DΦᵀ Ω DΦ − Ω)P‖ (vectors P v span T_xS, and ω(DΦ Pu, DΦ Pv) − ω(Pu, Pv) are its
entries). Unlike a null-space basis from an SVD this needs no factorisation and is smooth
in x.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from .._step.base import AbstractStep, FunctionStep
from .._system.structures import CanonicalStructure
from .._system.system import System
from ._runs import step_jacobian


def _canonical_form(dim: int, dtype):
    n = dim // 2
    eye, zero = jnp.eye(n, dtype=dtype), jnp.zeros((n, n), dtype)
    return jnp.block([[zero, eye], [-eye, zero]])


def tangent_projector(system: System, x: Float[ArrayLike, " dim"]) -> Float[Array, "dim dim"]:
    """P = I − B Dfᵀ C⁻¹ Df: the projector onto T_xS along the symplectic complement T_xS^ω.

    S is the level set through x of the system's constraint functions f (for
    `holonomic=g`, f = (g, Dg·∂H/∂p)). P v lies in T_xS for every v, and P u = u for u in
    T_xS. For an unconstrained system P = I.

    **Arguments:**

    - `system`: a constrained `geomjax.System`; `x`: a flat state (near S).

    **Returns:**

    The `(dim, dim)` matrix P.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum(holonomic=True)
    >>> P = geomjax.diagnostics.tangent_projector(model.system, model.x0)
    >>> P.shape
    (6, 6)

    ```
    """
    x = jnp.asarray(x)
    eye = jnp.eye(x.shape[0], dtype=x.dtype)
    if not system.is_constrained:
        return eye
    df = jax.jacfwd(system.constraint_functions)(x)
    b = system.structure.matrix(x)
    xf = b @ df.T
    c = df @ xf
    return eye - xf @ jnp.linalg.solve(c, df)


def symplecticity_defect(
    step, x: Float[ArrayLike, " dim"], h: Float[ArrayLike, ""], system: System | None = None
) -> Float[Array, ""]:
    """‖DΦ_hᵀ Ω DΦ_h − Ω‖_max of a step map at x, restricted to T_xS for constrained systems.

    DΦ_h is the Jacobian of x ↦ step(x, h) by `jax.jacfwd` (through Newton solves it is the
    implicit-function derivative, exact at the converged solution). For a symplectic
    method (Gauss–Legendre, Störmer–Verlet, RATTLE on S, exact sub-flows and their
    compositions) the defect is at round-off level; for non-symplectic ones (explicit
    Euler, RK4, feedback integrators, projection methods) it is O(h^{p+1}) or larger.

    If `system` is given and constrained, the defect is ‖Pᵀ(DΦᵀΩDΦ − Ω)P‖_max with P the
    projector onto T_xS along T_xS^ω (`tangent_projector`): only tangent vectors of S
    count, since a constrained method is a map of S (x should lie on S).

    **Arguments:**

    - `step`: a geomjax step (or `step(x, h)` callable) on T*Rⁿ with x = (q, p).
    - `x`: the flat state at which to evaluate; `h`: the step size.
    - `system`: optional; needed to restrict the defect to a constraint manifold.

    **Returns:**

    A scalar array: the largest entry of the defect matrix in absolute value.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum(holonomic=True)
    >>> step = geomjax.rattle(model.system)
    >>> float(geomjax.diagnostics.symplecticity_defect(step, model.x0, 0.1, model.system)) < 1e-13
    True

    ```
    """
    if system is not None and not isinstance(system.structure, CanonicalStructure):
        raise ValueError(
            "symplecticity_defect needs the canonical structure (x = (q, p)); for a Lie–Poisson "
            "structure use geomjax.diagnostics.poisson_defect"
        )
    if not isinstance(step, AbstractStep):
        step = FunctionStep(step)
    x = jnp.asarray(x)
    if x.shape[0] % 2:
        raise ValueError(f"a canonical state has even length (q, p); got {x.shape[0]}")
    d = step_jacobian(step, x, h)
    omega = _canonical_form(x.shape[0], x.dtype)
    defect = d.T @ omega @ d - omega
    if system is not None and system.is_constrained:
        p = tangent_projector(system, x)
        defect = p.T @ defect @ p
    return jnp.max(jnp.abs(defect))


def poisson_defect(step, x: Float[ArrayLike, " dim"], h: Float[ArrayLike, ""], structure) -> Float[Array, ""]:
    """‖DΦ_h B(x) DΦ_hᵀ − B(Φ_h(x))‖_max: how far a step is from a Poisson map of `structure`.

    For the canonical structure this vanishes exactly when the step is symplectic; for
    Lie–Poisson structures (`so(3)*`, `se(2)*`) it tests Poisson integrators.

    Example:

    ```python
    >>> import jax.numpy as jnp, geomjax
    >>> inertia = jnp.array([1.0, 2.0, 3.0])
    >>> body = geomjax.System(lambda m: 0.5 * jnp.sum(m**2 / inertia), geomjax.lie_poisson_so3())
    >>> euler = geomjax.explicit_rk(geomjax.dirac_field(body), geomjax.EULER)
    >>> m0 = jnp.array([0.3, 1.0, -0.5])
    >>> round(float(geomjax.diagnostics.poisson_defect(euler, m0, 0.1, geomjax.lie_poisson_so3())), 5)
    0.00116

    ```
    """
    if not isinstance(step, AbstractStep):
        step = FunctionStep(step)
    x = jnp.asarray(x)
    d = step_jacobian(step, x, h)
    return jnp.max(jnp.abs(d @ structure.matrix(x) @ d.T - structure.matrix(step(x, h))))
