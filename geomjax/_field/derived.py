"""The quantities every constrained field is built from, derived by autodiff, vectorised.

At a state `z` (in pieces) these are ∇H, the constraint values f, their gradients ∇f_i
stacked along a leading axis (one vectorised reverse pass: `vmap` of the pullback over
unit cotangents), the Hamiltonian fields X_{f_i} = B∇f_i (the structure applied under
`vmap`) and the matrix C_ij = {f_i, f_j} = ⟨∇f_i, X_{f_j}⟩, one contraction. Nothing is
unrolled per constraint, so the size of the traced program, and the compile time, do not
grow with the number of constraints.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._solve.linalg import small_solve
from .._system.system import System


def stacked_dot(a, b):
    """⟨a_i, b_j⟩ summed over the pieces, for pieces stacked along a leading axis: (m, k)."""
    leaves = [
        jnp.einsum("i...,j...->ij", u.reshape(u.shape[0], -1), v.reshape(v.shape[0], -1))
        for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    ]
    return sum(leaves[1:], leaves[0])


def stacked_combination(coefficients, stacked):
    """Σ_j c_j s_j for pieces `stacked` with a leading axis j."""
    return jax.tree_util.tree_map(lambda s: jnp.tensordot(coefficients, s, axes=1), stacked)


def piece_dot(a, b):
    """⟨a, b⟩ summed over the pieces of two states."""
    leaves = [jnp.vdot(u, v) for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))]
    return sum(leaves[1:], leaves[0])


class ConstraintData(eqx.Module):
    """∇H, X_H, f, ∇f (stacked), X_f (stacked) and C at one state (gradients in pieces)."""

    grad_h: object
    x_h: object
    values: jax.Array
    grads: object
    fields: object
    matrix: jax.Array

    @property
    def count(self) -> int:
        return self.values.shape[0]


def constraint_data(system: System, z) -> ConstraintData:
    """Evaluate ∇H, f, Df, X_f and C_ij = {f_i, f_j} at the state `z` (pieces)."""
    s = system.structure
    grad_h = jax.grad(lambda w: s.evaluate(system.hamiltonian, w))(z)
    x_h = s.apply(z, grad_h)
    values, f_vjp = jax.vjp(lambda w: s.evaluate(system.constraint_functions, w), z)
    m = values.shape[0]
    if m == 0:
        return ConstraintData(grad_h, x_h, values, None, None, jnp.zeros((0, 0), values.dtype))
    # numpy: literal unit cotangents that XLA (and the simplification pass) can fold.
    grads = jax.vmap(lambda e: f_vjp(e)[0])(np.eye(m, dtype=values.dtype))
    fields = jax.vmap(lambda g: s.apply(z, g))(grads)
    matrix = stacked_dot(grads, fields)
    return ConstraintData(grad_h, x_h, values, grads, fields, matrix)


def dirac_multipliers(data: ConstraintData):
    """c = C⁻ᵀ h with h_i = {H, f_i}: the Dirac formula reads X = X_H − Σ_j c_j X_{f_j}."""
    h = stacked_dot(data.fields, jax.tree_util.tree_map(lambda g: g[None], data.grad_h))[:, 0]
    if data.count == 2:
        # C = [[0, c], [−c, 0]] so Cᵀ c' = h reads −c·c'₁ = h₀, c·c'₀ = h₁.
        c = data.matrix[0, 1]
        return jnp.stack([h[1] / c, -h[0] / c])
    return small_solve(data.matrix.T, h)


def dirac_vector(data: ConstraintData, multipliers=None):
    """X = X_H − Σ_j c_j X_{f_j} with c = C⁻ᵀh (seed 000 eq. 4), from precomputed data.

    `multipliers` may pass c when the caller has already computed it.
    """
    if data.count == 0:
        return data.x_h
    c = dirac_multipliers(data) if multipliers is None else multipliers
    return jax.tree_util.tree_map(jnp.subtract, data.x_h, stacked_combination(c, data.fields))
