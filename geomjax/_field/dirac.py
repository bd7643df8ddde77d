"""The Dirac-extended Hamiltonian vector field (Chang, Perlmutter and Vankerschaver (2022), Theorem 1 and eq. 4)."""

import equinox as eqx
from jaxtyping import Array, ArrayLike, Float

from .derived import GramSolvable, constraint_data, dirac_vector, gram_solvable
from .base import SystemField
from .._system.system import NonholonomicSystem, System
from .._validate import as_state, known, require_invertible


def constraint_matrix_at(system: System, x):
    """C_ij = {f_i, f_j} at the flat state `x`."""
    return constraint_data(system, system.structure.split(x)).matrix


_constraint_matrix_compiled = eqx.filter_jit(constraint_matrix_at)


@eqx.filter_jit
def start_values(system: System, x):
    """At a concrete start x0: F(x0) = (f, H, integrals), C(x0) (None without second-class
    constraints) and the constraint residuals, in one compiled call shared by
    `feedback_field` and the checks of the Dirac and feedback fields (one compilation
    instead of three in a fresh process). For a large sparse C (`GramDiracPlan`) the
    second entry is a `GramSolvable` instead of C (never formed densely)."""
    matrix = None
    if system.is_constrained:
        matrix = gram_solvable(system, system.structure.split(x))
        if matrix is None:
            matrix = constraint_matrix_at(system, x)
    return system.conserved_quantities(x), matrix, system.constraint_residuals(x)


def check_constraint_matrix(system: System, x0, matrix=None) -> None:
    """Raise if C_ij = {f_i, f_j} is singular (or nearly so) at the concrete state `x0`
    (`matrix`: C at x0 if the caller has it already)."""
    if not system.is_constrained:
        return
    matrix = start_values(system, x0)[1] if matrix is None else matrix
    if isinstance(matrix, GramSolvable):
        ok = known(matrix.ok)
        if ok is not None and not bool(ok):
            raise ValueError(
                f"the constraint matrix C_ij = {{f_i, f_j}} is singular at x0: its block A = G M⁻¹ Gᵀ "
                f"({matrix.k} × {matrix.k}, solved sparsely) could not be solved, so the constraints "
                "are not independent there and the Dirac formula is undefined (a repeated constraint, "
                "a closed loop of rods pulled straight)"
            )
        return
    require_invertible(
        matrix,
        "the constraint matrix C_ij = {f_i, f_j}",
        "the constraints are not second-class there, so the Dirac formula is undefined "
        "(for a pendulum this happens at q = 0)",
    )


class DiracField(SystemField):
    """X = X_H − Σ_ij (C⁻¹)_ij {H, f_i} X_{f_j}, derived by autodiff from a `System`."""

    system: System

    def check(self, x0) -> None:
        check_constraint_matrix(self.system, x0)

    def vector(self, z):
        return dirac_vector(constraint_data(self.system, z))


def dirac_field(system: System) -> DiracField:
    """The Dirac-extended Hamiltonian vector field of a constrained system.

    With second-class constraint functions f = (f₁, …, f₂ₖ) and C_ij = {f_i, f_j}
    (invertible near S = level set of f), Chang, Perlmutter and Vankerschaver (2022) eq. (1)/(4):

    X(x) = X_H(x) − Σ_ij (C⁻¹)_ij(x) {H, f_i}(x) X_{f_j}(x).

    On S it equals X_{H|S}; off S it is defined on a neighbourhood and keeps every f_i
    and H constant (Df·X = 0, ∇H·X = 0). Everything is derived by autodiff of the
    system's functions; for `holonomic=g`, f = (g, {g, H}). Without constraints this is
    X_H = B∇H.

    **Arguments:**

    - `system`: a `geomjax.System`.

    **Returns:**

    A `DiracField`: callable `x ↦ ẋ` on flat states, jit/vmap/grad compatible, and
    accepted by `geomjax.integrate`.

    Example:

    ```python
    model = geomjax.models.spherical_pendulum()
    X = geomjax.dirac_field(model.system)
    X(model.x0)
    ```
    """
    if not isinstance(system, System):
        raise TypeError(f"dirac_field needs a geomjax.System, got {type(system).__name__}")
    if isinstance(system, NonholonomicSystem):
        raise ValueError("this System has nonholonomic constraints: use geomjax.nonholonomic_field(system)")
    return DiracField(system)


def constraint_matrix(system: System, x: Float[ArrayLike, " n"]) -> Float[Array, "c c"]:
    """C_ij = {f_i, f_j}(x), the matrix the Dirac formula inverts (shape `(2k, 2k)`).

    `x` is a flat state of the system's length (a state of another length is a
    ValueError naming both lengths).

    Example: for the spherical pendulum with f = (|q|², q·p), C = [[0, 2|q|²], [−2|q|², 0]]:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum()
    >>> geomjax.constraint_matrix(model.system, model.x0).tolist()
    [[0.0, 2.0], [-2.0, 0.0]]

    ```
    """
    if not isinstance(system, System):
        raise TypeError(f"constraint_matrix needs a geomjax.System, got {type(system).__name__}")
    return _constraint_matrix_compiled(system, as_state(x, system.dim, "x"))
