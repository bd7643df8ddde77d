"""Nonholonomic systems: the extension off the constraint set and its feedback field (Chang and Perlmutter (2019)).

A nonholonomic system is a Hamiltonian H on a phase space whose states split into a
configuration piece and a momentum piece m (T*Rⁿ: (q, p); left-trivialised bundles:
(g, μ); Lie–Poisson spaces: only Π), with k velocity constraints

    ω(q)·v = 0,    v = ∂H/∂m (the velocity; on T*Rⁿ, q̇),

ω a (k, d) array of one-forms, not necessarily orthonormal. Everything else is derived by
autodiff (Chang and Perlmutter (2019) §2, Remark 2.4; reconstructed, checked in tests/test_nonholonomic.py):

    J = ω ∂H/∂m                          constraint momenta, the constraint set is J = 0
    C_ab = ⟨∂J_a/∂m, ω_b⟩                 (= ω M⁻¹ ωᵀ for H = ½ mᵀM⁻¹m + U)
    H_ext = H − ½ Jᵀ C⁻¹ J               extended Hamiltonian (= H on J = 0)
    λ = −C⁻¹ {J, H_ext}                   multipliers
    ẋ = B ∇H_ext + (0, ωᵀλ)               the force acts on the momentum piece only.

Then J̇ = {J, H_ext} + Cλ = 0 everywhere, and Ḣ_ext = λ·(ω ∂H_ext/∂m) = 0 whenever C does
not depend on m (kinetic energy quadratic in the momenta): J and H_ext are first
integrals on the whole phase space, and on J = 0 the field is the Lagrange–d'Alembert
field. A feedback field then adds −L∇V with V = ½ΔᵀKΔ, Δ = (J, H_ext − H₀, I − I₀), and,
for structures embedded in Euclidean space, + k₀/4 ‖D‖² with D the embedding defect
(RᵀR − I for SO(3), cos² + sin² − 1 for SE(2)).

How it is computed: as vectorised JAX on the state's pieces. J, C and H_ext come from
`geomjax._system.nonholonomic.Derivation` (v = ∂H/∂m by `grad`, C by one jvp vmapped over
the rows of ω), the one derivation that `NonholonomicSystem.constraint_momenta`,
`constraint_matrix` and `extended_hamiltonian` evaluate too; ∇H_ext and ∇V come from one
derivative of F = (J, H_ext, ...); `SystemField.rhs` then runs it through the
simplification pass (`geomjax.internal.simplify`), the one place expressions are
rewritten. See `_extended_field` for the two measured choices (μ = C⁻¹J held fixed in
∇H_ext, forward mode for DF) and `benchmarks/nonholonomic_vs_hand.py` for the comparison
with the field written by hand.
"""


import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .feedback import AbstractFeedbackField
from .feedback_terms import _check_metric, embedding_potential, has_embedding, resolve_target, split_gains
from .._monitored import START_TOL, check_on_constraint_set
from .base import SystemField
from ..internal.simplify import MAX_INPUTS
from .._solve.linalg import small_solve
from .._system.nonholonomic import Derivation, check_matrix
from .._system.system import System
from .._validate import known


def _require(system) -> None:
    if not isinstance(system, System):
        raise TypeError(f"expected a geomjax.System, got {type(system).__name__}")
    if system.nonholonomic is None:
        raise ValueError("this System has no nonholonomic constraints: build it with System(..., nonholonomic=omega)")


def _split(system, x):
    return system.structure.split(jnp.asarray(x))


# --------------------------------------------------------------------------------------
# The field at one state (pieces z), vectorised; J, C and H_ext from the system's
# `Derivation`


def _integrals(system, z):
    return system.structure.evaluate(system.integral_values, z)


def _quantities(system, z):
    """F = (J, H_ext, integrals) at the state in pieces."""
    h_ext, (j, _) = Derivation(system).extended(z)
    pieces = [j, h_ext[None]]
    if system.integrals:
        pieces.append(_integrals(system, z))
    return jnp.concatenate(pieces)


def _extended_field(system, z, weights=None, embedding_gain=None):
    """X_Hext + (0, ωᵀλ), λ, and ∇V for the feedback term (None without `weights`).

    J and C at z give C⁻¹ (one `small_solve` against the identity: one reciprocal for
    k = 1) and μ = C⁻¹J. F = (J, H_ext[, integrals, ¼‖D‖²]) is differentiated as a
    whole: ∇H_ext is its row H_ext and ∇V = DFᵀ(w, k₀) with w = `weights(F)` =
    K(F − F₀). λ = −C⁻¹ DJ·X_Hext is one jvp of J.

    Two choices, measured (knife edge, scalar operations left by the simplification
    pass with the system's parameters traced, as inside `geomjax.integrate`):

    - H_ext enters F as H − μ·J + ½μᵀCμ with μ held fixed (`Derivation.frozen_extended`):
      the same value and gradient at z, and the same function of the state (μ is
      recomputed from it), so derivatives of the field stay exact; no derivative of
      the solve. Field 64 ops / 5 divisions against 77 / 10 differentiating
      H − ½JᵀC⁻¹J through the solve (feedback 113 against 124), and the Euler
      `integrate` of the feedback field several times faster: the
      extra divisions each became a separate XLA kernel. (Scalar-by-scalar
      derivation before: 53 ops / 4 divisions, as fast; see
      `benchmarks/nonholonomic_vs_hand.py`.)
    - DF by forward mode (`jacfwd`, a vmapped jvp over unit tangents) when the pass
      expands the field (at most `MAX_INPUTS` state entries): the tangents follow the
      primal and more cancels (with constant parameters, field/feedback 25/56 ops
      against 37/90 in reverse mode). Larger states take one reverse pass vmapped
      over the cotangents e_Hext and (w, k₀).
    """
    d = Derivation(system)
    s = system.structure
    with_defect = weights is not None and embedding_gain is not None
    j, c = d.momenta(z), d.matrix(z)
    k = j.shape[0]
    c_inv = small_solve(c, np.eye(k, dtype=j.dtype))
    mu = c_inv @ j

    def outputs(w):
        pieces = [d.momenta(w), d.frozen_extended(w, mu)[None]]
        if weights is not None and system.integrals:
            pieces.append(_integrals(system, w))
        if with_defect:
            pieces.append(embedding_potential(s, w)[None])
        return jnp.concatenate(pieces)

    def combined(w):
        return jnp.concatenate([w, jnp.atleast_1d(embedding_gain).astype(w.dtype)]) if with_defect else w

    size = sum(leaf.size for leaf in jax.tree_util.tree_leaves(z))
    if size <= MAX_INPUTS:
        f = outputs(z)
        jac = jax.jacfwd(outputs)(z)
        grad_h = jax.tree_util.tree_map(lambda g: g[k], jac)
        grad_v = None
        if weights is not None:
            w = combined(weights(f[: f.shape[0] - with_defect]))
            grad_v = jax.tree_util.tree_map(lambda g: jnp.tensordot(w, g, axes=1), jac)
    else:
        f, f_vjp = jax.vjp(outputs, z)
        # numpy: a literal unit cotangent that XLA can fold.
        e_h = np.zeros(f.shape, f.dtype)
        e_h[k] = 1.0
        grad_v = None
        if weights is None:
            grad_h = f_vjp(jnp.asarray(e_h))[0]
        else:
            w = combined(weights(f[: f.shape[0] - with_defect]))
            both = jax.vmap(lambda e: f_vjp(e)[0])(jnp.stack([jnp.asarray(e_h), w]))
            grad_h = jax.tree_util.tree_map(lambda g: g[0], both)
            grad_v = jax.tree_util.tree_map(lambda g: g[1], both)
    x_h = s.apply(z, grad_h)
    _, j_dot = jax.jvp(d.momenta, (z,), (x_h,))
    lam = -(c_inv @ j_dot)
    force = lam @ d.forms(z)
    m_h = d.momentum(x_h)
    return d.with_momentum(x_h, m_h + force.reshape(m_h.shape)), lam, grad_v


# --------------------------------------------------------------------------------------
# The extended field


class NonholonomicField(SystemField):
    """The extended nonholonomic field ẋ = B∇H_ext + (0, ωᵀλ), λ = −C⁻¹{J, H_ext} (Chang and Perlmutter (2019) §2).

    Built by `geomjax.nonholonomic_field(system)`. Besides `field(x)` it evaluates the
    derived quantities on flat states: `momenta(x)` (J), `matrix(x)` (C),
    `extended_hamiltonian(x)` (H_ext), `multipliers(x)` (λ) and `quantities(x)`
    (F = (J, H_ext, integrals)).
    """

    system: System

    def check(self, x0) -> None:
        check_matrix(self.system, x0)

    def vector(self, z):
        return _extended_field(self.system, z)[0]

    def momenta(self, x):
        """J(x) = ω ∂H/∂m, shape (k,) (the system's `constraint_momenta`)."""
        return self.system.constraint_momenta(x)

    def matrix(self, x):
        """C(x), shape (k, k) (the system's `constraint_matrix`)."""
        return self.system.constraint_matrix(x)

    def extended_hamiltonian(self, x):
        """H_ext(x) = H − ½ JᵀC⁻¹J (the system's `extended_hamiltonian`)."""
        return self.system.extended_hamiltonian(x)

    def multipliers(self, x):
        """λ(x) = −C⁻¹{J, H_ext}, shape (k,)."""
        return _extended_field(self.system, _split(self.system, x))[1]

    def quantities(self, x):
        """F(x) = (J, H_ext, integrals), the quantities the feedback field stabilises."""
        return nonholonomic_quantities(self.system, x)


def nonholonomic_field(system: System) -> NonholonomicField:
    """The extension of a nonholonomic system to its whole phase space (Chang and Perlmutter (2019) §2).

    With constraint one-forms ω (rows need not be orthonormal), all derived by autodiff:

    J = ω ∂H/∂m,  C_ab = ⟨∂J_a/∂m, ω_b⟩,  H_ext = H − ½JᵀC⁻¹J,  λ = −C⁻¹{J, H_ext},

    ẋ = B∇H_ext + (0, ωᵀλ)  (on T*Rⁿ: q̇ = ∂H_ext/∂p, ṗ = −∂H_ext/∂q + ωᵀλ;
    on so(3)*: Π̇ = Π × ∇H_ext + λξ).

    J and H_ext are first integrals everywhere (kinetic energy quadratic in the momenta),
    and on the constraint set J = 0 the field equals the Lagrange–d'Alembert equations.
    Any integrator can be applied; `geomjax.feedback_field` makes J = 0 and the energy
    level attracting.

    **Arguments:**

    - `system`: a `geomjax.System` built with `nonholonomic=omega`.

    **Returns:**

    A `NonholonomicField`, callable `x ↦ ẋ` on flat states (jit/vmap/grad compatible),
    accepted by `geomjax.integrate`.

    Example (Suslov problem on so(3)*):

    ```python
    inertia, xi = jnp.array([1.0, 2.0, 3.0]), jnp.array([0.0, 0.0, 1.0])
    system = geomjax.System(lambda m: 0.5 * jnp.sum(m**2 / inertia), geomjax.lie_poisson_so3(),
                            nonholonomic=lambda x: xi[None, :])
    X = geomjax.nonholonomic_field(system)
    ```
    """
    _require(system)
    return NonholonomicField(system)


def nonholonomic_quantities(system: System, x: Float[ArrayLike, " n"]) -> Float[Array, " q"]:
    """F(x) = (J(x), H_ext(x), I(x)) for a nonholonomic system (constraint momenta first).

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.knife_edge()
    >>> F = geomjax.nonholonomic_quantities(model.system, model.x0)   # (J, H_ext, integrals)
    >>> float(abs(F[0])) < 1e-12
    True

    ```
    """
    _require(system)
    return _quantities(system, _split(system, x))


def embedding_defect(system: System, x: Float[ArrayLike, " n"]) -> Float[Array, ""]:
    """‖D(x)‖ (Frobenius norm of the embedding defect: RᵀR − I or cos² + sin² − 1).

    Zero when the structure has no embedding. Use it to monitor how far a trajectory on an
    embedded group (`left_trivialised_so3`, `left_trivialised_se2`) has left the group.

    Example:

    ```python
    model = geomjax.models.suslov()
    geomjax.embedding_defect(model.system, model.x0)  # 0.0 at the start
    ```
    """
    d = system.structure.embedding_residual(jnp.asarray(x))
    return jnp.sqrt(jnp.sum(d * d))


def project_nonholonomic(system: System, x: Float[ArrayLike, " n"]) -> Float[Array, " n"]:
    """Move the momentum onto the constraint set: m ← m − ωᵀC⁻¹J (configuration kept).

    For a Hamiltonian quadratic in the momenta this gives J = 0 exactly; it is the
    orthogonal projection in the kinetic-energy metric.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.knife_edge()
    >>> x_off = model.x0.at[3:].add(0.3)
    >>> x_on = geomjax.project_nonholonomic(model.system, x_off)
    >>> float(abs(geomjax.nonholonomic_quantities(model.system, x_on)[0])) < 1e-12
    True

    ```
    """
    _require(system)
    d = Derivation(system)
    z = _split(system, x)
    w = d.forms(z)
    shift = small_solve(d.matrix(z, w), d.momenta(z)) @ w
    m = d.momentum(z)
    return system.structure.merge(d.with_momentum(z, m - shift.reshape(m.shape)))


# --------------------------------------------------------------------------------------
# The feedback field


class NonholonomicFeedbackField(AbstractFeedbackField):
    """Y = X − L∇V for a nonholonomic system (Chang and Perlmutter (2019) §2.4 with the extended field X).

    V = ½ ΔᵀKΔ with Δ = (J, H_ext − H₀, I − I₀), plus k₀/4 ‖D‖² for an embedded structure
    (D = RᵀR − I or cos² + sin² − 1). Built by `geomjax.feedback_field`.
    """

    system: System
    target: jax.Array | None
    gains: jax.Array
    embedding_gain: jax.Array | None
    metric: object
    pinned: bool = eqx.field(static=True, default=False)

    def check(self, x0) -> None:
        check_matrix(self.system, x0)

    def quantities(self, x):
        return nonholonomic_quantities(self.system, x)

    def target_at(self, x0):
        """(0, H_ext(x0), I(x0)): the constraint momenta are held at zero."""
        return self.quantities(x0).at[: _constraint_count(self.system)].set(0.0)

    def vector(self, z):
        self._require_target()
        weights = lambda f: self._weights(f - self.target)
        y, _, grad_v = _extended_field(self.system, z, weights, self.embedding_gain)
        return jax.tree_util.tree_map(jnp.subtract, y, self._apply_metric(z, grad_v))


def _constraint_count(system) -> int:
    """k, the number of constraint momenta (from shapes only). A lambda, not the bound
    method: `eval_shape` caches on the function, and the system's leaves may be traced."""
    spec = jax.ShapeDtypeStruct((system.dim,), jnp.float64)
    return jax.eval_shape(lambda x: system.constraint_momenta(x), spec).shape[0]


def _start_checks(system, x0, start_tol):
    check_matrix(system, x0)
    check_on_constraint_set(system, x0, start_tol)


def nonholonomic_feedback_field(
    system: System, x0, gains, metric=None, *, target=None, start_tol=START_TOL
) -> NonholonomicFeedbackField:
    """Feedback field of a nonholonomic system; called by `geomjax.feedback_field`.

    F = (J, H_ext, integrals) with target (0, H_ext(x0), I(x0)), V = ½ΔᵀKΔ (+ k₀/4‖D‖²
    when the structure is embedded, k₀ the last gain), Y = X − L∇V, X the extended field.

    `start_tol`: as in `feedback_field` (None: build from an x0 off J = 0 on purpose).
    `gains`: a positive scalar, or one gain ≥ 0 per entry of F, at least one positive (then
    one more, k₀, for an embedded structure), or an SPD matrix over F (structures without
    embedding).
    Explicit Euler is stable near the invariant set only for h·λ_max(L∇²V) < 2 (see
    `NonholonomicFeedbackField.euler_step_limit`).
    """
    _require(system)
    k = _constraint_count(system)
    x0, target, pinned, m = resolve_target(
        system, x0, target, lambda x: nonholonomic_quantities(system, x).at[:k].set(0.0)
    )
    if x0 is not None and known(x0) is not None:
        with jax.ensure_compile_time_eval():  # what is computed from x0 and constants is known now
            _start_checks(system, x0, start_tol)
    k_main, k_emb = split_gains(gains, m, has_embedding(system.structure), "(J, H_ext, integrals)")
    metric = _check_metric(metric, x0, system.dim)
    return NonholonomicFeedbackField(system, target, k_main, k_emb, metric, pinned)
