"""The quantities of a nonholonomic system, derived in one place (Chang and Perlmutter (2019) §2).

With m the momentum piece of the state (T*Rⁿ: p; left-trivialised bundles: μ; Lie–Poisson
spaces: the whole state Π), v = ∂H/∂m the velocity and ω the (k, d) constraint one-forms:

    J = ω ∂H/∂m                          constraint momenta, the constraint set is J = 0
    C_ab = ⟨∂J_a/∂m, ω_b⟩                 (= ω M⁻¹ ωᵀ for H = ½ mᵀM⁻¹m + U)
    H_ext = H − ½ Jᵀ C⁻¹ J               extended Hamiltonian (= H on J = 0)

`Derivation` computes them as vectorised JAX on a state in pieces: v by one `grad` in
the momentum, C by one jvp of J vmapped over the rows of ω. `NonholonomicSystem`'s
methods (on flat states) and the extended and feedback fields of
`geomjax._field.nonholonomic` (on pieces, inside their loops) both evaluate them here,
so the system's quantities and the fields' are the same expressions.
"""

import equinox as eqx
import jax
import jax.numpy as jnp

from .._solve.linalg import small_solve
from .._validate import require_invertible


def one_forms(system, arg):
    """ω as a (k, d) array: the system's `nonholonomic(arg)`, a single row given as a
    vector (shape (d,)) read as k = 1."""
    w = jnp.asarray(system.nonholonomic(arg))
    return w[None, :] if w.ndim == 1 else w


class Derivation(eqx.Module):
    """J, C and H_ext of a nonholonomic system at a state in pieces: (configuration,
    momentum) on "pair" layouts, the momentum alone on "momentum" layouts (Lie–Poisson
    spaces); the layout is the structure's `nonholonomic_layout`.

    `system` is a `NonholonomicSystem` (any system with `hamiltonian`, `structure` and
    `nonholonomic`).
    """

    system: object

    @property
    def kind(self) -> str:
        """The structure's layout, "pair" or "momentum"."""
        return self.system.structure.nonholonomic_layout

    def momentum(self, z):
        """The momentum piece m of the state z."""
        return z[1] if self.kind == "pair" else z

    def with_momentum(self, z, m):
        """The state z with its momentum piece replaced by m."""
        return (z[0], m) if self.kind == "pair" else m

    def energy(self, z):
        """H at the state in pieces, a scalar."""
        return self.system.structure.evaluate(self.system.hamiltonian, z).reshape(())

    def forms(self, z):
        """ω as a (k, d) array (of the configuration on "pair" layouts, of the state else)."""
        return one_forms(self.system, z[0] if self.kind == "pair" else z)

    def velocity(self, z):
        """v = ∂H/∂m (one reverse pass in the momentum)."""
        return jax.grad(lambda m: self.energy(self.with_momentum(z, m)))(self.momentum(z))

    def momenta(self, z):
        """J = ω ∂H/∂m, shape (k,)."""
        return self.forms(z) @ self.velocity(z)

    def matrix(self, z, w=None):
        """C_ab = ⟨∂J_a/∂m, ω_b⟩, shape (k, k), `w` = ω at z when already computed: the
        derivatives of J along the rows of ω in the momentum, one jvp vmapped over the rows
        (row b of the result holds ∂J/∂m·ω_b, so C is its transpose)."""
        w = self.forms(z) if w is None else w
        j_of_m = lambda m: self.momenta(self.with_momentum(z, m))  # noqa: E731
        m = self.momentum(z)
        return jax.vmap(lambda u: jax.jvp(j_of_m, (m,), (u,))[1])(w).T

    def extended(self, z):
        """(H_ext, (J, C)) with H_ext = H − ½ JᵀC⁻¹J."""
        j, c = self.momenta(z), self.matrix(z)
        return self.energy(z) - 0.5 * jnp.dot(j, small_solve(c, j)), (j, c)

    def frozen_extended(self, z, mu):
        """H − μ·J + ½μᵀCμ at the state z for a given μ: H_ext with the same value and
        gradient where μ = C⁻¹J (∂/∂μ of it vanishes there), with no solve to
        differentiate. ½μᵀCμ is one jvp of μ·J along ωᵀμ."""
        mu_j = lambda m: jnp.dot(mu, self.momenta(self.with_momentum(z, m)))  # noqa: E731
        m = self.momentum(z)
        u = (mu @ self.forms(z)).reshape(m.shape)
        weighted, c_mu_mu = jax.jvp(mu_j, (m,), (u,))
        return self.energy(z) - weighted + 0.5 * c_mu_mu


@eqx.filter_jit
def _matrix_at(system, x):
    return Derivation(system).matrix(system.structure.split(jnp.asarray(x)))


def check_matrix(system, x0) -> None:
    """Raise a ValueError when C is not finite or numerically singular at the (concrete)
    flat state x0; run by the nonholonomic fields and steps before they integrate."""
    require_invertible(
        _matrix_at(system, x0),
        "the nonholonomic matrix C_ab = ⟨∂J_a/∂m, ω_b⟩",
        "the constraint one-forms are linearly dependent there, or the kinetic energy is "
        "degenerate along them",
    )
