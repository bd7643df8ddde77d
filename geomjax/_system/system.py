"""Mechanical systems defined only by JAX functions."""

from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp

from .structures import AbstractPoissonStructure, CanonicalStructure
from .._validate import trace_user_function


def _as_tuple(integrals):
    if integrals is None:
        return ()
    if callable(integrals):
        return (integrals,)
    integrals = tuple(integrals)
    for i, fn in enumerate(integrals):
        if not callable(fn):
            raise TypeError(f"integrals[{i}] must be a callable x ↦ I(x), got {type(fn).__name__}")
    return integrals


def _check_user_functions(system) -> None:
    """Trace the user functions once on an abstract state (no values are computed): each
    must be traceable by JAX and return the documented shape. Skipped where the structure
    does not fix the state's length."""
    structure = system.structure
    dim = structure.dim
    if dim is None:
        return
    spec = jax.ShapeDtypeStruct((dim,), jnp.float64)
    out = trace_user_function(system.hamiltonian, spec, "the hamiltonian")
    if getattr(out, "shape", None) != ():
        shape = getattr(out, "shape", type(out).__name__)
        raise ValueError(
            f"the hamiltonian must return a scalar H(x), got shape {shape}; "
            "for a vector of first integrals use integrals="
        )
    if system.constraints is not None:
        out = trace_user_function(system.constraints, spec, "constraints")
        if getattr(out, "ndim", None) not in (0, 1):
            raise ValueError(
                f"constraints must return a vector f(x) of shape (2k,), got shape {getattr(out, 'shape', None)}"
            )
        if out.ndim == 1 and out.shape[0] % 2:
            raise ValueError(
                f"constraints returns {out.shape[0]} functions, an odd number: a second-class set has "
                "an even number (C_ij = {f_i, f_j} is antisymmetric, so it is singular in odd "
                "dimension). For position constraints g(q) use holonomic=g, which adds the "
                "velocity constraints itself"
            )
    if system.holonomic is not None:
        out = trace_user_function(lambda x: system.holonomic(structure.split(x)[0]), spec, "holonomic")
        if getattr(out, "ndim", None) not in (0, 1):
            raise ValueError(
                f"holonomic must return a vector g(q) of shape (k,), got shape {getattr(out, 'shape', None)}"
            )
    for i, fn in enumerate(system.integrals):
        out = trace_user_function(fn, spec, f"integrals[{i}]")
        if getattr(out, "ndim", None) not in (0, 1):
            raise ValueError(
                f"integrals[{i}] must return a scalar or a vector, got shape {getattr(out, 'shape', None)}"
            )


class System(eqx.Module):
    """A Hamiltonian system with constraints and first integrals, given by JAX functions.

    The equations of motion are never written by hand: geomjax derives brackets,
    Hamiltonian and Dirac fields, multipliers and Jacobians from these functions by
    autodiff.

    **Arguments:**

    - `hamiltonian`: `x ↦ H(x)`, a scalar, on the flat state `x`.
    - `structure`: the Poisson structure (`geomjax.canonical(n)`, `geomjax.lie_poisson_so3()`,
      `geomjax.lie_poisson_se2()`, `geomjax.PoissonStructure(B)`).
    - `holonomic`: optional `q ↦ g(q)` of shape `(k,)`, position constraints g(q) = 0 on
      T*Rⁿ (canonical structure only). geomjax completes them to the second-class set
      f = (g, {g, H}) by adding the hidden velocity constraint {g, H} = Dg(q)·∂H/∂p.
    - `constraints`: optional `x ↦ f(x)` of shape `(2k,)`, a general second-class set: the
      constrained phase space S is a level set of f and C_ij = {f_i, f_j} is invertible near
      S. Give `holonomic` or `constraints`, not both.
    - `integrals`: extra first integrals, a callable `x ↦ I(x)` (scalar or vector) or a
      sequence of them.
    - `nonholonomic`: optional one-forms of nonholonomic (velocity) constraints, a callable
      returning a `(k, d)` array ω; the constraint is ω·v = 0 on the velocity v = ∂H/∂(momentum).
      On T*Rⁿ it is `q ↦ ω(q)` (ω(q)·q̇ = 0); on Lie–Poisson spaces `x ↦ ω` (constraint
      ⟨ξ_a, ∂H/∂Π⟩ = 0, force Σ λ_a ξ_a); on the left-trivialised bundles `g ↦ ω(g)`. Rows
      need not be orthonormal. See `geomjax.nonholonomic_field`.

    Parameters live in the functions: closures over arrays, `jax.tree_util.Partial`, or
    `equinox.Module` callables. Array leaves of the functions are leaves of the `System`
    pytree, so systems can be `vmap`ped over and differentiated with respect to parameters.

    Example (seed 000's spherical pendulum):

    ```python
    import geomjax, jax.numpy as jnp

    H = lambda x: 0.5 * x[3:] @ x[3:] + x[2]
    system = geomjax.System(
        H, geomjax.canonical(3),
        constraints=lambda x: jnp.stack([x[:3] @ x[:3], x[:3] @ x[3:]]),
        integrals=lambda x: x[0] * x[4] - x[1] * x[3],
    )
    ```
    """

    hamiltonian: Callable
    structure: AbstractPoissonStructure
    holonomic: Callable | None = None
    constraints: Callable | None = None
    integrals: tuple = ()
    nonholonomic: Callable | None = None

    def __init__(
        self,
        hamiltonian: Callable,
        structure: AbstractPoissonStructure,
        *,
        holonomic: Callable | None = None,
        constraints: Callable | None = None,
        integrals: Callable | Sequence[Callable] | None = (),
        nonholonomic: Callable | None = None,
    ):
        if not callable(hamiltonian):
            raise TypeError("hamiltonian must be a callable x ↦ H(x)")
        if not isinstance(structure, AbstractPoissonStructure):
            raise TypeError(
                "structure must be a geomjax Poisson structure (geomjax.canonical(n), "
                f"geomjax.lie_poisson_so3(), ...), got {type(structure).__name__}"
            )
        if holonomic is not None and constraints is not None:
            raise ValueError("give either holonomic=g(q) or constraints=f(x), not both")
        if holonomic is not None and not isinstance(structure, CanonicalStructure):
            raise ValueError("holonomic=g(q) needs the canonical structure geomjax.canonical(n)")
        self.hamiltonian = hamiltonian
        self.structure = structure
        self.holonomic = holonomic
        self.constraints = constraints
        self.integrals = _as_tuple(integrals)
        _check_user_functions(self)
        if nonholonomic is not None:
            from .._field.nonholonomic import check_nonholonomic_system

            check_nonholonomic_system(self, nonholonomic)
        self.nonholonomic = nonholonomic

    @property
    def dim(self) -> int | None:
        """Dimension of the flat state."""
        return self.structure.dim

    @property
    def is_constrained(self) -> bool:
        return self.holonomic is not None or self.constraints is not None

    def constraint_functions(self, x):
        """The second-class constraint functions f(x) (shape `(2k,)`; empty if none).

        For `holonomic=g` this is `(g(q), Dg(q)·∂H/∂p)`, the position constraints and the
        hidden velocity constraints {g, H}, derived by autodiff.
        """
        if self.constraints is not None:
            return jnp.atleast_1d(self.constraints(x))
        if self.holonomic is not None:
            q, p = self.structure.split(x)
            dh_dp = jax.grad(lambda pp: self.hamiltonian(jnp.concatenate([q, pp])))(p)
            g, g_dot = jax.jvp(lambda qq: jnp.atleast_1d(self.holonomic(qq)), (q,), (dh_dp,))
            return jnp.concatenate([g, g_dot])
        return jnp.zeros((0,), x.dtype)

    def integral_values(self, x):
        """The extra first integrals I(x), concatenated (shape `(ℓ,)`)."""
        if not self.integrals:
            return jnp.zeros((0,), x.dtype)
        return jnp.concatenate([jnp.atleast_1d(fn(x)) for fn in self.integrals])

    def conserved_quantities(self, x):
        """F(x) = (f(x), H(x), I(x)): constraints, energy and extra integrals, in that order."""
        return jnp.concatenate(
            [self.constraint_functions(x), jnp.atleast_1d(self.hamiltonian(x)), self.integral_values(x)]
        )

    def constraint_residuals(self, x):
        """Residuals that vanish on the constraint set S (shape `(r,)`).

        Holonomic g: (g(q), {g, H}); nonholonomic: the constraint momenta J; an embedded
        group adds its embedding defect. A general second-class set `constraints=f` has no
        fixed level (S is the level set through x0), so its values are monitored as
        invariants instead.
        """
        x = jnp.asarray(x)
        parts = []
        if self.holonomic is not None:
            parts.append(self.constraint_functions(x))
        if self.nonholonomic is not None:
            from .._field.nonholonomic import nonholonomic_quantities

            quantities = nonholonomic_quantities(self, x)
            k = quantities.shape[0] - 1 - self.integral_values(x).shape[0]
            parts.append(quantities[:k])
        defect = getattr(self.structure, "embedding_defect", None)
        if defect is not None:
            parts.append(jnp.ravel(defect(self.structure.split(x)[0])))
        return jnp.concatenate(parts) if parts else jnp.zeros((0,), x.dtype)

    def invariants(self, x):
        """First integrals of the exact flow (shape `(i,)`): the levels of second-class
        constraint functions, the energy (H, or H_ext for a nonholonomic system) and the
        extra integrals."""
        x = jnp.asarray(x)
        if self.nonholonomic is not None:
            from .._field.nonholonomic import nonholonomic_quantities

            n_int = self.integral_values(x).shape[0]
            return nonholonomic_quantities(self, x)[-(n_int + 1) :]
        if self.constraints is not None:
            return self.conserved_quantities(x)
        return jnp.concatenate([jnp.atleast_1d(self.hamiltonian(x)), self.integral_values(x)])

