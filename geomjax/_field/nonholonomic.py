"""Nonholonomic systems: the extension off the constraint set and its feedback field (seed 001).

A nonholonomic system is a Hamiltonian H on a phase space whose states split into a
configuration piece and a momentum piece m (T*Rⁿ: (q, p); left-trivialised bundles:
(g, μ); Lie–Poisson spaces: only Π), with k velocity constraints

    ω(q)·v = 0,    v = ∂H/∂m (the velocity; on T*Rⁿ, q̇),

ω a (k, d) array of one-forms, not necessarily orthonormal. Everything else is derived by
autodiff (seed 001 §2, Remark 2.4, as reconstructed in DESIGN.md):

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

How it is computed inside loops (measured on the knife edge against the same field
written by hand, `benchmarks/nonholonomic_vs_hand.py`): the state is taken apart into its
scalar entries and the user's functions are evaluated on them (no slicing of vectors);
all derivatives are forward-mode partials in single entries, skipping entries a quantity
does not depend on and one-form entries that are structurally zero; the gradient of H_ext
comes from H − μ·J + ½μᵀCμ with μ = C⁻¹J frozen (no derivative of the solve); C⁻¹ is
written out for k ≤ 2. Reverse mode on vectors produced pads that split XLA's CPU fusions
(15× the hand-written field); this form runs at about 1.1× of it for one trajectory.
"""


import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .feedback import AbstractFeedbackField, _check_metric, _gain_array, resolve_target
from .._monitored import START_TOL, check_on_constraint_set
from .base import SystemField
from ..internal.pieces import evaluate_on_pieces
from ..internal.sparse_ad import (
    dependencies,
    directional,
    inverse,
    matvec,
    partial,
    scalars,
    sdot,
    sdot_sparse,
    solve,
    sparse_partials,
    structural_zeros,
)
from .._system.structures import CanonicalStructure, LiePoissonSE2, LiePoissonSO3
from .._system.system import System
from .._validate import as_state, is_concrete, require_invertible

# --------------------------------------------------------------------------------------
# Which piece is the momentum


def nonholonomic_layout(structure) -> str | None:
    """`"pair"` when pieces are (configuration, momentum), `"momentum"` when the whole state
    is the momentum (Lie–Poisson spaces), None when the structure does not say."""
    if isinstance(structure, CanonicalStructure):
        return "pair"
    if isinstance(structure, (LiePoissonSO3, LiePoissonSE2)):
        return "momentum"
    return getattr(structure, "nonholonomic_layout", None)


def check_nonholonomic_system(system: System, omega) -> None:
    """Validation run by `System(..., nonholonomic=omega)` (before the field is stored)."""
    if not callable(omega):
        raise TypeError("nonholonomic must be a callable returning the (k, d) constraint one-forms ω")
    if system.holonomic is not None or system.constraints is not None:
        raise ValueError(
            "nonholonomic constraints cannot be combined with holonomic= or constraints= in one System"
        )
    if nonholonomic_layout(system.structure) is None:
        raise ValueError(
            f"nonholonomic constraints need to know which coordinates are momenta; the structure "
            f"{type(system.structure).__name__} does not say. Use geomjax.canonical(n), "
            "geomjax.lie_poisson_so3(), geomjax.lie_poisson_se2(), geomjax.left_trivialised_so3() "
            "or geomjax.left_trivialised_se2(), or give your structure a class attribute "
            "nonholonomic_layout = 'pair' with pieces (configuration, momentum)"
        )


def _require(system) -> None:
    if not isinstance(system, System):
        raise TypeError(f"expected a geomjax.System, got {type(system).__name__}")
    if system.nonholonomic is None:
        raise ValueError("this System has no nonholonomic constraints: build it with System(..., nonholonomic=omega)")


# --------------------------------------------------------------------------------------
# The derived quantities at one state


class _Parts:
    """The system's functions on the scalar pieces `s` of a state shaped like `z`.

    `s` lists the entries of the flat state in order (shape (1,) each); the first `nc` are
    the configuration, the rest the momentum (`nc = 0` on Lie–Poisson spaces).
    """

    def __init__(self, system: System, z):
        self.system = system
        self.structure = system.structure
        self.kind = nonholonomic_layout(self.structure)
        leaves, self.treedef = jax.tree_util.tree_flatten(z)
        self.shapes = [leaf.shape for leaf in leaves]
        self.nc = leaves[0].size if self.kind == "pair" else 0
        self.config_is_vector = self.kind == "pair" and leaves[0].ndim == 1
        self._form_zeros = None
        self._forms_constant = False
        if self.kind == "momentum":
            try:
                deps = dependencies(lambda ss: [self.forms(ss)], self.explode(z))
                self._forms_constant = not deps[0]
            except Exception:
                self._forms_constant = False

    # -- conversions
    def explode(self, z):
        out = []
        for leaf in jax.tree_util.tree_leaves(z):
            out.extend(scalars(leaf))
        return tuple(out)

    def implode(self, s):
        leaves, start = [], 0
        for shape in self.shapes:
            size = int(np.prod(shape))
            leaves.append(jnp.concatenate(s[start : start + size]).reshape(shape))
            start += size
        return jax.tree_util.tree_unflatten(self.treedef, leaves)

    def _config(self, s):
        return self.implode(s)[0] if self.kind == "pair" else self.implode(s)

    # -- the user's functions on scalars
    def energy(self, s):
        return evaluate_on_pieces(self.system.hamiltonian, list(s)).reshape(())

    def forms(self, s):
        """ω as a (k, d) array."""
        if self.kind == "momentum":
            w = evaluate_on_pieces(self.system.nonholonomic, list(s))
        elif self.config_is_vector:
            w = evaluate_on_pieces(self.system.nonholonomic, list(s[: self.nc]))
        else:
            w = self.system.nonholonomic(self._config(s))
        w = jnp.asarray(w)
        return w[None, :] if w.ndim == 1 else w

    def form_entries(self, s):
        """ω and its entries as scalars, None for entries that are structurally zero."""
        w = self.forms(s)
        k, d = w.shape
        zero = self.form_zeros(s)
        return w, [
            [None if zero[a, i] else lax.slice(w, (a, i), (a + 1, i + 1)).reshape(1) for i in range(d)]
            for a in range(k)
        ]

    def form_zeros(self, s):
        if self._form_zeros is None:
            arg = self._config(s) if self.kind == "pair" else self.implode(s)
            fn = lambda a: jnp.atleast_2d(jnp.asarray(self.system.nonholonomic(a)))
            try:
                self._form_zeros = structural_zeros(fn, arg)
            except Exception:  # the analysis is an optimisation only
                self._form_zeros = np.zeros(fn(arg).shape, dtype=bool)
        return self._form_zeros

    def integrals(self, s):
        return evaluate_on_pieces(self.system.integral_values, list(s))

    def defect(self, s):
        return self.structure.embedding_defect(self._config(s)).reshape(-1)

    @property
    def embedded(self) -> bool:
        return self.kind == "pair" and hasattr(self.structure, "embedding_defect")

    # -- derived quantities
    def velocity(self, s):
        """v = ∂H/∂m, as scalars (one forward-mode pass per momentum entry)."""
        s = tuple(s)
        return tuple(partial(self.energy, s, i).reshape(1) for i in range(self.nc, len(s)))

    def momenta(self, s):
        """J = ω ∂H/∂m, a list of k scalars."""
        _, rows = self.form_entries(s)
        v = self.velocity(s)
        return [sdot_sparse(v, row) for row in rows]

    def matrix(self, s):
        """C_ab = ⟨∂J_a/∂m, ω_b⟩ as nested lists (column b: derivative of J along ω_b in m)."""
        _, rows = self.form_entries(s)
        cols = [directional(self.momenta, tuple(s), self.nc, row)[1] for row in rows]
        k = len(rows)
        return [[cols[b][a] for b in range(k)] for a in range(k)]

    def core(self, s):
        """(J, C⁻¹, μ = C⁻¹J) at s; C⁻¹ is formed once (one reciprocal)."""
        j = self.momenta(s)
        c_inv = inverse(self.matrix(s))
        mu = matvec(c_inv, j)
        return j, c_inv, mu

    def extended(self, s):
        """H_ext = H − ½ JᵀC⁻¹J."""
        j, _, mu = self.core(s)
        return self.energy(s) - 0.5 * sdot(j, mu).reshape(())

    def direction(self, s, coeffs):
        """u = ωᵀc in the momentum (entries None where structurally zero)."""
        _, rows = self.form_entries(s)
        return [sdot_sparse(coeffs, [row[i] for row in rows]) for i in range(len(s) - self.nc)]

    @property
    def forms_fixed(self) -> bool:
        """True when ω does not depend on the momentum (always on pair layouts)."""
        return self.kind == "pair" or self._forms_constant

    def weighted_momenta(self, s, coeffs):
        """c·J(s). With ω independent of m this is the derivative of H along u = ωᵀc."""
        if self.forms_fixed:
            u = self.direction(s, coeffs)
            if all(x is None for x in u):
                return jnp.zeros_like(s[0])
            return directional(self.energy, tuple(s), self.nc, u)[1].reshape(1)
        return sdot(coeffs, self.momenta(s))

    def half_quadratic(self, s, mu):
        """½ μᵀC(s)μ with μ fixed: the derivative of μ·J along u = ωᵀμ in m (with ω
        independent of m: the second derivative of H along u)."""
        u = self.direction(s, mu)
        if all(x is None for x in u):
            return jnp.zeros_like(s[0])
        if self.forms_fixed:
            inner = lambda ss: directional(self.energy, ss, self.nc, u)[1]
        else:
            inner = lambda ss: sdot(mu, self.momenta(ss))
        return 0.5 * directional(inner, tuple(s), self.nc, u)[1].reshape(1)

    def field(self, s, z, weights=None, extra=None):
        """The extended field at the state z (scalars s), with shared first derivatives.

        With μ = C⁻¹J frozen, H_ext = H − μ·J + ½μᵀCμ at this point and its gradient is
        ∇H − (∇J)ᵀμ + ½μᵀ(∇C)μ (no derivative of the solve). One forward-mode pass per
        state entry s_i differentiates (H, μ·J, ½μᵀCμ, w·J, extra(s)); `weights` w and
        `extra` serve the feedback term. {J, H_ext} = DJ·X_Hext is one more forward pass.

        Returns (X_Hext, H_ext, J, λ, ∇H_ext, ∂(w·J)/∂s_i, ∂extra/∂s_i, weights), the
        middle three as lists over the state entries i (None where structurally zero).
        """
        s = tuple(s)
        j, c_inv, mu = self.core(s)
        h_ext = self.energy(s) - 0.5 * sdot(j, mu).reshape(())
        if weights is not None:
            weights = weights(j, h_ext)
            w_j = weights[0]

        def terms(ss):
            out = [self.energy(ss).reshape(1), self.weighted_momenta(ss, mu), self.half_quadratic(ss, mu)]
            if weights is not None:
                out.append(self.weighted_momenta(ss, w_j))
            if extra is not None:
                out = out + list(extra(ss))
            return out

        table = sparse_partials(terms, s)
        zero = jnp.zeros_like(s[0])
        grad = [sdot_sparse([1.0, -1.0, 1.0], row[:3]) for row in table]
        x_h = self.structure.apply(z, self.implode(tuple(zero if g is None else g for g in grad)))
        _, j_dot = jax.jvp(self.momenta, (s,), (self.explode(x_h),))
        lam = [-x for x in matvec(c_inv, j_dot)]
        n0 = 3 + (weights is not None)
        return (
            x_h,
            h_ext,
            j,
            lam,
            grad,
            [row[3] for row in table] if weights is not None else None,
            [row[n0:] for row in table],
            weights,
        )

    def add_force(self, s, x_h, lam):
        """ẋ = X_Hext + (0, ωᵀλ), the force added entry by entry (skipping structural zeros)."""
        _, rows = self.form_entries(s)
        m_dot = x_h[1] if self.kind == "pair" else x_h
        entries = scalars(m_dot)
        for i in range(len(entries)):
            f = sdot_sparse(lam, [row[i] for row in rows])
            if f is not None:
                entries[i] = entries[i] + f
        m_dot = jnp.concatenate(entries).reshape(m_dot.shape)
        return (x_h[0], m_dot) if self.kind == "pair" else m_dot


def _at(system, x):
    """(_Parts, scalars, pieces) at a flat state."""
    z = system.structure.split(jnp.asarray(x))
    parts = _Parts(system, z)
    return parts, parts.explode(z), z


def _matrix_array(c):
    return jnp.concatenate([jnp.concatenate(row) for row in c]).reshape(len(c), len(c))


@eqx.filter_jit
def _matrix_at(system, x):
    parts, s, _ = _at(system, x)
    return _matrix_array(parts.matrix(s))


def _check_matrix_at(system, x0) -> None:
    require_invertible(
        _matrix_at(system, x0),
        "the nonholonomic matrix C_ab = ⟨∂J_a/∂m, ω_b⟩",
        "the constraint one-forms are linearly dependent there, or the kinetic energy is "
        "degenerate along them",
    )


# --------------------------------------------------------------------------------------
# The extended field


class NonholonomicField(SystemField):
    """The extended nonholonomic field ẋ = B∇H_ext + (0, ωᵀλ), λ = −C⁻¹{J, H_ext} (seed 001 §2).

    Built by `geomjax.nonholonomic_field(system)`. Besides `field(x)` it evaluates the
    derived quantities on flat states: `momenta(x)` (J), `matrix(x)` (C),
    `extended_hamiltonian(x)` (H_ext), `multipliers(x)` (λ) and `quantities(x)`
    (F = (J, H_ext, integrals)).
    """

    system: System

    def check(self, x0) -> None:
        _check_matrix_at(self.system, x0)

    def vector(self, z):
        parts = _Parts(self.system, z)
        s = parts.explode(z)
        x_h, _, _, lam, *_ = parts.field(s, z)
        return parts.add_force(s, x_h, lam)

    def momenta(self, x):
        """J(x) = ω ∂H/∂m, shape (k,)."""
        parts, s, _ = _at(self.system, x)
        return jnp.concatenate(parts.momenta(s))

    def matrix(self, x):
        """C(x), shape (k, k)."""
        parts, s, _ = _at(self.system, x)
        return _matrix_array(parts.matrix(s))

    def extended_hamiltonian(self, x):
        """H_ext(x) = H − ½ JᵀC⁻¹J."""
        parts, s, _ = _at(self.system, x)
        return parts.extended(s)

    def multipliers(self, x):
        """λ(x) = −C⁻¹{J, H_ext}, shape (k,)."""
        parts, s, z = _at(self.system, x)
        return jnp.concatenate(parts.field(s, z)[3])

    def quantities(self, x):
        """F(x) = (J, H_ext, integrals), the quantities the feedback field stabilises."""
        return nonholonomic_quantities(self.system, x)


def nonholonomic_field(system: System) -> NonholonomicField:
    """The extension of a nonholonomic system to its whole phase space (seed 001 §2).

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


def nonholonomic_quantities(system: System, x):
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
    parts, s, _ = _at(system, x)
    j, _, mu = parts.core(s)
    h_ext = parts.energy(s) - 0.5 * sdot(j, mu).reshape(())
    pieces = list(j) + [jnp.atleast_1d(h_ext)]
    if system.integrals:
        pieces.append(parts.integrals(s))
    return jnp.concatenate(pieces)


def embedding_defect(system: System, x):
    """‖D(x)‖ (Frobenius norm of the embedding defect: RᵀR − I or cos² + sin² − 1).

    Zero when the structure has no embedding. Use it to monitor how far a trajectory on an
    embedded group (`left_trivialised_so3`, `left_trivialised_se2`) has left the group.

    Example:

    ```python
    model = geomjax.models.suslov()
    geomjax.embedding_defect(model.system, model.x0)  # 0.0 at the start
    ```
    """
    s = system.structure
    if not hasattr(s, "embedding_defect"):
        return jnp.zeros((), jnp.asarray(x).dtype)
    d = s.embedding_defect(s.split(jnp.asarray(x))[0])
    return jnp.sqrt(jnp.sum(d * d))


def project_nonholonomic(system: System, x):
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
    parts, s, z = _at(system, x)
    mu = solve(parts.matrix(s), parts.momenta(s))
    w = parts.forms(s)
    shift = mu[0] * w[0]
    for a in range(1, w.shape[0]):
        shift = shift + mu[a] * w[a]
    if parts.kind == "pair":
        z = (z[0], z[1] - shift)
    else:
        z = z - shift
    return system.structure.merge(z)


# --------------------------------------------------------------------------------------
# The feedback field


class NonholonomicFeedbackField(AbstractFeedbackField):
    """Y = X − L∇V for a nonholonomic system (seed 001 §2.4 with the extended field X).

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
        _check_matrix_at(self.system, x0)

    def quantities(self, x):
        return nonholonomic_quantities(self.system, x)

    def target_at(self, x0):
        """(0, H_ext(x0), I(x0)): the constraint momenta are held at zero."""
        return self.quantities(x0).at[: _constraint_count(self.system)].set(0.0)

    def extra_potential(self, x):
        if self.embedding_gain is None:
            return super().extra_potential(x)
        dd = self.system.structure.embedding_defect(self.split(x)[0]).reshape(-1)
        return 0.25 * self.embedding_gain * jnp.sum(dd * dd)

    def vector(self, z):
        self._require_target()
        parts = _Parts(self.system, z)
        s = parts.explode(z)
        k0 = self.embedding_gain
        with_int = bool(self.system.integrals)

        def extra(ss):
            out = list(scalars(parts.integrals(ss))) if with_int else []
            if k0 is not None:
                d = parts.defect(ss)
                out.append(0.25 * jnp.sum(d * d).reshape(1))
            return out

        n_int = self.target.shape[0] - parts.forms(s).shape[0] - 1

        def weights(j, h_ext):
            pieces = list(j) + [jnp.atleast_1d(h_ext)]
            if n_int:
                pieces.append(parts.integrals(s))
            w = self._weights(jnp.concatenate(pieces) - self.target)
            w_s = scalars(w)
            return w_s[: len(j)], w_s[len(j)], w_s[len(j) + 1 :]

        use_extra = with_int or k0 is not None
        x_h, h_ext, j, lam, grad_h, jac_wj, jac_extra, (w_j, w_h, w_i) = parts.field(
            s, z, weights, extra if use_extra else None
        )
        ydot = parts.add_force(s, x_h, lam)
        # ∇V = ∇(w_J·J) + w_H ∇H_ext + Σ w_I ∇I + k₀ ∇(¼‖D‖²), from the shared partials.
        coeffs = list(w_i) + ([k0] if k0 is not None else [])
        grad_v = []
        zero = jnp.zeros_like(s[0])
        for i in range(len(grad_h)):
            parts_i = [w_h * grad_h[i]] if grad_h[i] is not None else []
            if jac_wj[i] is not None:
                parts_i.append(jac_wj[i])
            if use_extra:
                more = sdot_sparse(coeffs, jac_extra[i])
                if more is not None:
                    parts_i.append(more)
            grad_v.append(sum(parts_i[1:], parts_i[0]) if parts_i else zero)
        grad_v = parts.implode(tuple(grad_v))
        return jax.tree_util.tree_map(jnp.subtract, ydot, self._apply_metric(z, grad_v))


def _constraint_count(system) -> int:
    spec = jax.ShapeDtypeStruct((system.dim,), jnp.float64)
    n_int = jax.eval_shape(lambda x: system.integral_values(x), spec).shape[0]
    return jax.eval_shape(lambda x: nonholonomic_quantities(system, x), spec).shape[0] - 1 - n_int


def nonholonomic_feedback_field(system: System, x0, gains, metric=None, *, target=None) -> NonholonomicFeedbackField:
    """Feedback field of a nonholonomic system; called by `geomjax.feedback_field`.

    F = (J, H_ext, integrals) with target (0, H_ext(x0), I(x0)), V = ½ΔᵀKΔ (+ k₀/4‖D‖²
    when the structure is embedded, k₀ the last gain), Y = X − L∇V, X the extended field.

    `gains`: a positive scalar, or one positive gain per entry of F (then one more, k₀, for
    an embedded structure), or an SPD matrix over F (structures without embedding).
    Explicit Euler is stable near the invariant set only for h·λ_max(L∇²V) < 2 (see
    `NonholonomicFeedbackField.euler_step_limit`).
    """
    _require(system)
    if gains is None:
        raise TypeError("feedback_field needs gains: a positive scalar, one per entry of F, or an SPD matrix")
    k = _constraint_count(system)
    x0, target, pinned, m = resolve_target(
        system, x0, target, lambda x: nonholonomic_quantities(system, x).at[:k].set(0.0)
    )
    embedded = nonholonomic_layout(system.structure) == "pair" and hasattr(system.structure, "embedding_defect")
    if x0 is not None and is_concrete(x0):
        _check_matrix_at(system, x0)
        check_on_constraint_set(system, x0, START_TOL)
    g = jnp.asarray(gains, dtype=jnp.float64)
    if embedded:
        if g.ndim == 0:
            k_all = jnp.full((m + 1,), g)
        elif g.ndim == 1 and g.shape[0] == m + 1:
            k_all = g
        else:
            raise ValueError(
                f"gains for an embedded structure: a scalar or a vector of {m + 1} positive gains "
                f"(one per entry of F = (J, H_ext, integrals), {m} here, then k₀ for k₀/4‖D‖²); "
                f"got shape {tuple(g.shape)}"
            )
        k_all = _gain_array(k_all, m + 1)
        k_main, k_emb = k_all[:m], k_all[m]
    else:
        k_main, k_emb = _gain_array(g, m), None
    metric = _check_metric(metric, x0, system.dim)
    return NonholonomicFeedbackField(system, target, k_main, k_emb, metric, pinned)
