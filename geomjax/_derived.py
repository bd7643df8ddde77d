"""The quantities every constrained field is built from, derived by autodiff.

At a state `z` (in pieces) these are ∇H, the constraint values f and gradients ∇f_i
(reverse-mode passes with unit cotangents), the Hamiltonian fields X_{f_i} = B∇f_i and the
matrix C_ij = {f_i, f_j}.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._field import tree_dot
from ._linalg import small_solve
from ._system import System


class ConstraintData(eqx.Module):
    """∇H, f, ∇f_i, X_{f_i} and C at one state (all gradients in pieces)."""

    grad_h: object
    x_h: object
    values: jax.Array
    grads: tuple
    fields: tuple
    matrix: jax.Array


def constraint_data(system: System, z) -> ConstraintData:
    """Evaluate ∇H, f, Df, X_f and C_ij = {f_i, f_j} at the state `z` (pieces)."""
    s = system.structure
    grad_h = jax.grad(lambda w: s.evaluate(system.hamiltonian, w))(z)
    x_h = s.apply(z, grad_h)
    values, f_vjp = jax.vjp(lambda w: s.evaluate(system.constraint_functions, w), z)
    m = values.shape[0]
    eye = np.eye(m)  # numpy: literal constants that XLA can fold, not a hoisted iota
    grads = tuple(f_vjp(eye[i])[0] for i in range(m))
    fields = tuple(s.apply(z, g) for g in grads)
    entries = [[None] * m for _ in range(m)]
    zero = jnp.zeros((), values.dtype)
    for i in range(m):
        entries[i][i] = zero
        for j in range(i + 1, m):
            cij = tree_dot(grads[i], fields[j])
            entries[i][j] = cij
            entries[j][i] = -cij
    matrix = jnp.stack([jnp.stack(row) for row in entries]) if m else jnp.zeros((0, 0), values.dtype)
    return ConstraintData(grad_h, x_h, values, grads, fields, matrix)


def dirac_multipliers(data: ConstraintData):
    """c = C⁻ᵀ h with h_i = {H, f_i}: the Dirac formula reads X = X_H − Σ_j c_j X_{f_j}."""
    h = [tree_dot(data.grad_h, xf) for xf in data.fields]
    if len(h) == 2:
        # C = [[0, c], [−c, 0]] so Cᵀ c' = h reads −c·c'₁ = h₀, c·c'₀ = h₁.
        c = data.matrix[0, 1]
        return jnp.stack([h[1] / c, -h[0] / c])
    return small_solve(data.matrix.T, jnp.stack(h))


def dirac_vector(data: ConstraintData, multipliers=None):
    """X = X_H − Σ_j c_j X_{f_j} with c = C⁻ᵀh (seed 000 eq. 4), from precomputed data.

    `multipliers` may pass c when the caller has already computed it.
    """
    x = data.x_h
    if not data.fields:
        return x
    c = dirac_multipliers(data) if multipliers is None else multipliers
    for j, xf in enumerate(data.fields):
        x = jax.tree_util.tree_map(lambda a, b: a - c[j] * b, x, xf)
    return x
