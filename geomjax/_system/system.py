"""Mechanical systems defined only by JAX functions."""

import dataclasses
import inspect
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp

from .nonholonomic import Derivation
from .structures import AbstractPoissonStructure, CanonicalStructure
from .._labels import numbered
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


def _require_real(out, what: str) -> None:
    """Raise a TypeError if the traced output `out` of the user function `what` is complex."""
    dtype = getattr(out, "dtype", None)
    if dtype is not None and jnp.issubdtype(dtype, jnp.complexfloating):
        raise TypeError(
            f"{what} returns complex values (dtype {dtype}): the functions of a geomjax System are real "
            "functions of a real state (their gradients and brackets are taken in the real sense). Return a "
            "real array, e.g. jnp.real(...) of it if the imaginary part vanishes by construction"
        )


def _require_one_argument(fn, what: str, form: str, dim: int) -> None:
    """A TypeError that says so where `fn` needs more than one positional argument: the
    functions of a System take the flat state x (H(q, p), as textbooks write it, is the
    usual slip)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a callable without a signature: let tracing tell
        return
    required = [p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(required) > 1:
        names = ", ".join(p.name for p in required)
        n = dim // 2
        raise TypeError(
            f"{what} takes {len(required)} arguments ({names}), but geomjax calls it as {form} on the flat state "
            f"x of length {dim}: for canonical coordinates x = (q, p), write it as def H(x): q, p = x[:{n}], x[{n}:] "
            f"(or wrap yours: lambda x: H(x[:{n}], x[{n}:]))"
        )


def _check_user_functions(system) -> None:
    """Trace the user functions once on an abstract state (no values are computed): each
    must be traceable by JAX and return real values of the documented shape. Skipped
    where the structure does not fix the state's length."""
    structure = system.structure
    dim = structure.dim
    if dim is None:
        return
    spec = jax.ShapeDtypeStruct((dim,), jnp.float64)
    _require_one_argument(system.hamiltonian, "the hamiltonian", "H(x)", dim)
    out = trace_user_function(system.hamiltonian, spec, "the hamiltonian")
    _require_real(out, "the hamiltonian")
    if getattr(out, "shape", None) != ():
        shape = getattr(out, "shape", type(out).__name__)
        raise ValueError(
            f"the hamiltonian must return a scalar H(x), got shape {shape}; "
            "for a vector of first integrals use integrals="
        )
    if system.constraints is not None:
        out = trace_user_function(system.constraints, spec, "constraints")
        _require_real(out, "constraints")
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
        _require_real(out, "holonomic")
        if getattr(out, "ndim", None) not in (0, 1):
            raise ValueError(
                f"holonomic must return a vector g(q) of shape (k,), got shape {getattr(out, 'shape', None)}"
            )
    for i, fn in enumerate(system.integrals):
        out = trace_user_function(fn, spec, f"integrals[{i}]")
        _require_real(out, f"integrals[{i}]")
        if getattr(out, "ndim", None) not in (0, 1):
            raise ValueError(
                f"integrals[{i}] must return a scalar or a vector, got shape {getattr(out, 'shape', None)}"
            )


class _ByKind(type(eqx.Module)):
    """`System(...)` builds the typed system its arguments describe."""

    def __call__(cls, *args, **kwargs):
        if cls is System:
            return _build(*args, **kwargs)
        return super().__call__(*args, **kwargs)

    @property
    def __signature__(cls):
        # `System`'s own signature is its builder's (`inspect.signature`, `help`, IDEs);
        # the typed systems keep equinox's (that of their `__init__`).
        if cls is System:
            return inspect.signature(_build).replace(return_annotation="System")
        return super().__signature__


class System(eqx.Module, metaclass=_ByKind):
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
    - `names`: optional names of the quantities F = (constraint quantities, H, integrals),
      one per entry, in that order (as `geomjax.models.Model.quantity_names`): the
      constraint quantities are g then its velocity constraints for `holonomic=g`, f for
      `constraints=f`, the constraint momenta J for `nonholonomic`, none otherwise. A run
      that fails names the quantity that left its tolerance with them ("the first
      integral L_z drifted by …"). Without names: "g1", "gdot1", "f1", "J1", "H" (H_ext
      for nonholonomic systems), "I1", … (a single one unnumbered: "g", "I").

    Parameters live in the functions, written any way JAX differentiates: a closure
    (`H = lambda x: ... + g * x[2]` inside the function you differentiate or `vmap`),
    `jax.tree_util.Partial(H, g)`, or an `equinox.Module` callable. `jax.grad`,
    `jax.jit(jax.grad)`, `jax.jacfwd`, `jax.hessian` and `jax.vmap` with respect to a
    closed-over value give what they give for the value passed explicitly: geomjax's
    custom derivative rules take every traced value the functions close over as an input
    (`geomjax.internal.closure`). A `Partial` or a module's array leaves are also leaves
    of the `System` pytree, so a built system can itself be `vmap`ped over or
    differentiated; a closure's values are not leaves (they are reached only by calling
    the function).

    `System(...)` returns one of the typed systems, all subclasses of `System`:
    `HamiltonianSystem` (no constraints), `HolonomicSystem` (`holonomic=g`),
    `ConstrainedSystem` (`constraints=f`) or `NonholonomicSystem` (`nonholonomic=ω`).
    Fields and steps dispatch on these types.

    Example (Chang, Perlmutter and Vankerschaver's (2022) spherical pendulum):

    ```python
    >>> import geomjax, jax.numpy as jnp
    >>> H = lambda x: 0.5 * x[3:] @ x[3:] + x[2]
    >>> system = geomjax.System(
    ...     H, geomjax.canonical(3),
    ...     constraints=lambda x: jnp.stack([x[:3] @ x[:3], x[:3] @ x[3:]]),
    ...     integrals=lambda x: x[0] * x[4] - x[1] * x[3],
    ... )
    >>> type(system).__name__, isinstance(system, geomjax.System)
    ('ConstrainedSystem', True)
    >>> system.quantity_labels(jnp.zeros(6))  # (first integrals, constraint residuals)
    (('f1', 'f2', 'H', 'I'), ())

    ```
    """

    hamiltonian: eqx.AbstractVar[Callable]
    structure: eqx.AbstractVar[AbstractPoissonStructure]
    integrals: eqx.AbstractVar[tuple]

    # What the single System class of earlier versions exposed; each typed system
    # overrides the one it has with a field.
    holonomic = None
    constraints = None
    nonholonomic = None

    @property
    def dim(self) -> int | None:
        """Dimension of the flat state."""
        return self.structure.dim

    @property
    def is_constrained(self) -> bool:
        """True for systems with a second-class constraint set (holonomic or general)."""
        return False

    def constraint_functions(self, x):
        """The second-class constraint functions f(x) (shape `(2k,)`; empty if none)."""
        return jnp.zeros((0,), jnp.asarray(x).dtype)

    def integral_values(self, x):
        """The extra first integrals I(x), concatenated (shape `(ℓ,)`)."""
        if not self.integrals:
            return jnp.zeros((0,), jnp.asarray(x).dtype)
        return jnp.concatenate([jnp.atleast_1d(fn(x)) for fn in self.integrals])

    def conserved_quantities(self, x):
        """F(x) = (f(x), H(x), I(x)): constraints, energy and extra integrals, in that order."""
        return jnp.concatenate(
            [self.constraint_functions(x), jnp.atleast_1d(self.hamiltonian(x)), self.integral_values(x)]
        )

    def _embedding_defect(self, x):
        return self.structure.embedding_residual(x)

    def constraint_residuals(self, x):
        """Residuals that vanish on the constraint set S (shape `(r,)`): the embedding
        defect of an embedded group (RᵀR − I, cos² + sin² − 1), plus what the kind of
        system adds (holonomic: g and {g, H}; nonholonomic: J)."""
        return self._embedding_defect(jnp.asarray(x))

    def invariants(self, x):
        """First integrals of the exact flow (shape `(i,)`): H and the extra integrals
        (second-class systems add the levels of f; nonholonomic ones use H_ext)."""
        x = jnp.asarray(x)
        return jnp.concatenate([jnp.atleast_1d(self.hamiltonian(x)), self.integral_values(x)])

    # --- names of the monitored quantities (for the messages of failed runs) ---------
    names = ()
    _energy_label = "H"

    def _constraint_labels(self, spec) -> tuple[str, ...]:
        """Default names of the constraint quantities, the entries of F before H."""
        return ()

    def _quantity_labels(self, spec) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Names of F = (constraint quantities, (H, integrals)): the system's `names` where
        it has enough of them (a model's may end with a feedback term F does not hold)."""
        constraint = self._constraint_labels(spec)
        n_integrals = jax.eval_shape(lambda y: self.integral_values(y), spec).shape[0]
        labels = constraint + (self._energy_label,) + numbered("I", n_integrals, 1)
        if len(self.names) >= len(labels):
            labels = tuple(self.names[: len(labels)])
        return labels[: len(constraint)], labels[len(constraint) :]

    def quantity_labels(self, x) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Names of the monitored quantities at states shaped like `x` (only its shape and
        dtype are read): `(labels of invariants(x), labels of constraint_residuals(x))`.
        The embedding defect of an embedded group is "embedding defect [i]"."""
        spec = jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))
        constraint, integrals = self._quantity_labels(spec)
        embedding = numbered("embedding defect ", jax.eval_shape(lambda y: self.structure.embedding_residual(y), spec).shape[0])
        return self._monitored_labels(constraint, integrals, embedding)

    def _monitored_labels(self, constraint, integrals, embedding):
        """Which of F's names label first integrals and which residuals: the constraint
        quantities vanish on the constraint set, so they are residuals."""
        return integrals, constraint + embedding


class HamiltonianSystem(System):
    """A Hamiltonian system without constraints: ẋ = B(x)∇H(x). Built by `System(H, B)`."""

    hamiltonian: Callable
    structure: AbstractPoissonStructure
    integrals: tuple = ()
    names: tuple = eqx.field(static=True, default=())


class HolonomicSystem(System):
    """Position constraints g(q) = 0 on T*Rⁿ; built by `System(H, canonical(n), holonomic=g)`.

    The second-class set is f = (g, {g, H}) with the hidden velocity constraint
    {g, H} = Dg(q)·∂H/∂p, derived by autodiff.
    """

    hamiltonian: Callable
    structure: AbstractPoissonStructure
    holonomic: Callable
    integrals: tuple = ()
    names: tuple = eqx.field(static=True, default=())

    @property
    def is_constrained(self) -> bool:
        return True

    def constraint_functions(self, x):
        """f = (g(q), Dg(q)·∂H/∂p): the position constraints and their velocity constraints."""
        q, p = self.structure.split(x)
        # H on the pieces (`evaluate`): q carries no tangent into ∂H/∂p, so the potential
        # is not differentiated along with it (a learned potential network: 4× faster).
        dh_dp = jax.grad(lambda pp: self.structure.evaluate(self.hamiltonian, (q, pp)))(p)
        g, g_dot = jax.jvp(lambda qq: jnp.atleast_1d(self.holonomic(qq)), (q,), (dh_dp,))
        return jnp.concatenate([g, g_dot])

    def constraint_residuals(self, x):
        x = jnp.asarray(x)
        return jnp.concatenate([self.constraint_functions(x), self._embedding_defect(x)])

    def _constraint_labels(self, spec):
        k = jax.eval_shape(lambda y: self.constraint_functions(y), spec).shape[0] // 2
        return numbered("g", k, 1) + numbered("gdot", k, 1)


class ConstrainedSystem(System):
    """A general second-class constraint set f(x); built by `System(H, B, constraints=f)`.

    S is the level set of f through the initial state, so f's values are first integrals
    (monitored relative to their initial values), not residuals with a fixed target.
    """

    hamiltonian: Callable
    structure: AbstractPoissonStructure
    constraints: Callable
    integrals: tuple = ()
    names: tuple = eqx.field(static=True, default=())

    @property
    def is_constrained(self) -> bool:
        return True

    def constraint_functions(self, x):
        return jnp.atleast_1d(self.constraints(x))

    def invariants(self, x):
        return self.conserved_quantities(jnp.asarray(x))

    def _constraint_labels(self, spec):
        return numbered("f", jax.eval_shape(lambda y: self.constraint_functions(y), spec).shape[0], 1)

    def _monitored_labels(self, constraint, integrals, embedding):
        # the levels of f are first integrals here (kept at their initial values)
        return constraint + integrals, embedding


class NonholonomicSystem(System):
    """Velocity constraints ω·v = 0 on v = ∂H/∂m (m the momentum pieces); built by
    `System(H, B, nonholonomic=omega)`.

    The quantities of Chang and Perlmutter's (2019) extension, by autodiff: the constraint momenta
    J = ω ∂H/∂m, C_ab = ⟨∂J_a/∂m, ω_b⟩ and the extended Hamiltonian H_ext = H − ½JᵀC⁻¹J
    (equal to H on J = 0), on flat states. They are derived once, in pieces, by
    `geomjax._system.nonholonomic.Derivation`, which `geomjax.nonholonomic_field` uses too
    for the extended field.
    """

    hamiltonian: Callable
    structure: AbstractPoissonStructure
    nonholonomic: Callable
    integrals: tuple = ()
    names: tuple = eqx.field(static=True, default=())
    _energy_label = "H_ext"

    def _derived(self, x):
        """The derivation of J, C and H_ext, and the flat state x in pieces."""
        return Derivation(self), self.structure.split(jnp.asarray(x))

    def constraint_momenta(self, x):
        """J(x) = ω ∂H/∂m, shape (k,); the constraint set is J = 0."""
        d, z = self._derived(x)
        return d.momenta(z)

    def constraint_matrix(self, x):
        """C_ab = ⟨∂J_a/∂m, ω_b⟩ (= ω M⁻¹ ωᵀ for H = ½mᵀM⁻¹m + U), shape (k, k)."""
        d, z = self._derived(x)
        return d.matrix(z)

    def extended_hamiltonian(self, x):
        """H_ext = H − ½ JᵀC⁻¹J."""
        d, z = self._derived(x)
        return d.extended(z)[0]

    def constraint_residuals(self, x):
        x = jnp.asarray(x)
        return jnp.concatenate([self.constraint_momenta(x), self._embedding_defect(x)])

    def invariants(self, x):
        x = jnp.asarray(x)
        return jnp.concatenate([jnp.atleast_1d(self.extended_hamiltonian(x)), self.integral_values(x)])

    def _constraint_labels(self, spec):
        return numbered("J", jax.eval_shape(lambda y: self.constraint_momenta(y), spec).shape[0], 1)


def _check_nonholonomic(structure, omega, holonomic, constraints) -> None:
    if not callable(omega):
        raise TypeError("nonholonomic must be a callable returning the (k, d) constraint one-forms ω")
    if holonomic is not None or constraints is not None:
        raise ValueError("nonholonomic constraints cannot be combined with holonomic= or constraints= in one System")
    if structure.nonholonomic_layout is None:
        raise ValueError(
            f"nonholonomic constraints need to know which coordinates are momenta; the structure "
            f"{type(structure).__name__} does not say. Use geomjax.canonical(n), "
            "geomjax.lie_poisson_so3(), geomjax.lie_poisson_se2(), geomjax.left_trivialised_so3() "
            "or geomjax.left_trivialised_se2(), or give your structure a class attribute "
            "nonholonomic_layout = 'pair' with pieces (configuration, momentum)"
        )


def _build(
    hamiltonian: Callable,
    structure: AbstractPoissonStructure,
    *,
    holonomic: Callable | None = None,
    constraints: Callable | None = None,
    integrals: Callable | Sequence[Callable] | None = (),
    nonholonomic: Callable | None = None,
    names: Sequence[str] | None = None,
) -> System:
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
    integrals = _as_tuple(integrals)
    names = _as_names(names)
    if nonholonomic is not None:
        _check_nonholonomic(structure, nonholonomic, holonomic, constraints)
        system = NonholonomicSystem(hamiltonian, structure, nonholonomic, integrals, names)
    elif holonomic is not None:
        system = HolonomicSystem(hamiltonian, structure, holonomic, integrals, names)
    elif constraints is not None:
        system = ConstrainedSystem(hamiltonian, structure, constraints, integrals, names)
    else:
        system = HamiltonianSystem(hamiltonian, structure, integrals, names)
    _check_user_functions(system)
    _check_names(system)
    return system


def _as_names(names) -> tuple:
    if names is not None and not isinstance(names, str):
        try:
            names = tuple(names)  # once: a generator is consumed by the check below
        except TypeError:
            raise TypeError(f"names must be a sequence of strings, one per quantity of F = (constraints, H, integrals), got {names!r}") from None
    if names is None:
        return ()
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"names must be a sequence of strings, one per quantity of F = (constraints, H, integrals), got {names!r}")
    return tuple(names)


def _check_names(system, dim: int | None = None) -> None:
    """One name per entry of F = (constraint quantities, H, integrals), checked by tracing
    at states of the structure's length, or of length `dim` where the structure does not
    fix it (`check_names_at_start`)."""
    dim = system.dim if system.dim is not None else dim
    if not system.names or dim is None:
        return
    spec = jax.ShapeDtypeStruct((dim,), jnp.float64)
    constraint, integrals = dataclasses.replace(system, names=())._quantity_labels(spec)
    expected = constraint + integrals
    if len(system.names) != len(expected):
        raise ValueError(
            f"names has {len(system.names)} entries, but this system's quantities "
            f"F = (constraint quantities, H, integrals) have {len(expected)}: one name each, in "
            f"the order of the default names {expected}"
        )


def check_names_at_start(target, x0) -> None:
    """The `names` check of a system whose structure does not fix the state's length, at
    the first state it runs from (`geomjax.integrate`'s start checks)."""
    system = getattr(target, "system", None)
    if isinstance(system, System) and system.names and system.dim is None:
        _check_names(system, int(x0.shape[-1]))
