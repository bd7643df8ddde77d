"""Feedback integrators: the field X − L∇V that makes the invariant set attracting."""

import abc
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Float

from .derived import constraint_data, dirac_vector, stacked_combination
from .dirac import check_constraint_matrix, start_values
from .base import SystemField
from .._system.system import NonholonomicSystem, System
from .._monitored import START_TOL, check_on_constraint_set
from .._validate import as_state, check_real, check_tolerance, checked_where_known, host_array, is_concrete


def _gain_array(gains, m: int):
    """Return gains as a scalar, an `(m,)` vector (diagonal K) or an `(m, m)` matrix."""
    # Concrete gains are built on the host (each jnp call is a compilation in a fresh process).
    k = host_array(gains) if is_concrete(gains) else jnp.asarray(gains, dtype=jnp.float64)
    if k.ndim == 0:
        k = host_array(np.full((m,), np.asarray(k))) if is_concrete(k) else jnp.full((m,), k)
    elif k.ndim == 1:
        if k.shape[0] != m:
            raise ValueError(
                f"gains has {k.shape[0]} entries but F = (f, H, integrals) has {m}; give one gain "
                "per entry of F, a scalar, or an (m, m) matrix"
            )
    elif k.ndim == 2:
        if k.shape != (m, m):
            raise ValueError(f"gain matrix has shape {tuple(k.shape)}, expected ({m}, {m})")
    else:
        raise ValueError(f"gains must be a scalar, a vector or a matrix, got shape {tuple(k.shape)}")
    if is_concrete(k):
        kn = np.asarray(k)
        if not np.all(np.isfinite(kn)):
            raise ValueError("gains must be finite")
        if kn.ndim == 1 and np.any(kn < 0):
            bad = np.flatnonzero(kn < 0).tolist()
            raise ValueError(
                f"gains must be non-negative (a zero gain leaves that quantity out of V); "
                f"entries {bad} are {kn[bad].tolist()}"
            )
        if kn.ndim == 1 and not np.any(kn > 0):
            raise ValueError("gains must include a positive entry: with all gains zero, V = 0 and there is no feedback")
        if kn.ndim == 2:
            if not np.allclose(kn, kn.T):
                raise ValueError("the gain matrix K must be symmetric")
            if np.linalg.eigvalsh(kn).min() <= 0:
                raise ValueError(
                    f"the gain matrix K must be positive definite; its smallest eigenvalue is "
                    f"{np.linalg.eigvalsh(kn).min():.3g}"
                )
    return k


def has_embedding(structure) -> bool:
    """True for a structure whose configuration piece lies in an embedded group
    (`left_trivialised_so3/se2`): its feedback fields add k₀/4‖D‖² to V."""
    return bool(structure.embedded) and structure.nonholonomic_layout == "pair"


def embedding_potential(structure, z):
    """¼‖D‖² at the state `z` (in pieces), D the structure's embedding defect of the
    configuration piece (RᵀR − I for SO(3), cos² + sin² − 1 for SE(2))."""
    d = structure.embedding_defect(z[0]).reshape(-1)
    return 0.25 * jnp.dot(d, d)


def split_gains(gains, m: int, embedded: bool, quantities: str):
    """`(K, k₀)`: the gains over the m entries of F (`quantities` names them in messages)
    and, for an embedded structure, the last gain k₀ of k₀/4‖D‖² (else None)."""
    if not embedded:
        return _gain_array(gains, m), None
    g = host_array(gains) if is_concrete(gains) else jnp.asarray(gains, dtype=jnp.float64)
    if g.ndim == 0:
        g = host_array(np.full((m + 1,), np.asarray(g))) if is_concrete(g) else jnp.full((m + 1,), g)
    elif g.ndim != 1 or g.shape[0] != m + 1:
        raise ValueError(
            f"gains for an embedded structure: a scalar or a vector of {m + 1} gains (one per entry "
            f"of F = {quantities}, {m} here, then k₀ for k₀/4‖D‖²); got shape {tuple(g.shape)}"
        )
    k_all = _gain_array(g, m + 1)
    return k_all[:m], k_all[m]


def _require_spd(ell: np.ndarray, what: str) -> None:
    if not np.all(np.isfinite(ell)):
        raise ValueError(f"{what} must be finite")
    if not np.allclose(ell, ell.T, rtol=1e-12, atol=0.0):
        raise ValueError(f"{what} must be symmetric (L = Lᵀ); its largest asymmetry is {np.abs(ell - ell.T).max():.3g}")
    smallest = np.linalg.eigvalsh(0.5 * (ell + ell.T)).min()
    if smallest <= 0:
        raise ValueError(f"{what} must be positive definite; its smallest eigenvalue is {smallest:.3g}")


def _check_metric(metric, x0, dim):
    """A metric L as given (None: the identity), checked where its values are known: a
    positive scalar, or a symmetric positive-definite (dim, dim) matrix, or a callable
    x ↦ L(x) whose value at x0 is one of those."""
    if x0 is not None:
        dim = x0.shape[0]
    if metric is None:
        return None
    if callable(metric):
        if x0 is None:
            return metric
        value = jnp.asarray(metric(x0))
        if value.ndim not in (0, 2) or (value.ndim == 2 and value.shape != (dim, dim)):
            raise ValueError(f"the metric callable must return a scalar or a ({dim}, {dim}) matrix, got shape {tuple(value.shape)}")
        if is_concrete(value):
            _require_spd(np.atleast_2d(np.asarray(value)), "the metric L(x0)")
        return metric
    ell = jnp.asarray(metric, dtype=jnp.float64)
    if ell.ndim == 0:
        if is_concrete(ell) and not float(ell) > 0:
            raise ValueError(f"metric L must be a positive scalar, got {float(ell)}")
        return ell
    if ell.shape != (dim, dim):
        raise ValueError(f"metric L has shape {tuple(ell.shape)}, expected ({dim}, {dim})")
    if is_concrete(ell):
        _require_spd(np.asarray(ell), "metric L")
    return ell


class AbstractFeedbackField(SystemField):
    """Y = X − L∇V with V = ½(F − F₀)ᵀK(F − F₀) (+ an optional extra potential).

    Subclasses give `quantities(x)` (the F whose level set is made attracting) and `rhs`;
    this base holds the gains K, the metric L and what follows from them.
    """

    target: eqx.AbstractVar[jax.Array | None]
    gains: eqx.AbstractVar[jax.Array]
    metric: eqx.AbstractVar[object]
    pinned: eqx.AbstractVar[bool]

    @abc.abstractmethod
    def quantities(self, x):
        """F(x), the quantities the feedback holds at their initial values."""

    def quantity_names(self) -> tuple[str, ...]:
        """The names of the entries of F, in order (one per gain of a vector K): the
        system's `names`, or its default ones ("g1", "gdot1", "f1", "J1", "H", "H_ext",
        "I1", …; see `geomjax.System`). Empty where the structure does not fix the
        state's length.

        Example:

        ```python
        >>> import geomjax
        >>> model = geomjax.models.spherical_pendulum()
        >>> geomjax.feedback_field(model.system, model.x0, 50.0).quantity_names()
        ('f1', 'f2', 'H', 'J')

        ```
        """
        if self.system.dim is None:
            return ()
        constraint, integrals = self.system._quantity_labels(jax.ShapeDtypeStruct((self.system.dim,), jnp.float64))
        return constraint + integrals

    def target_at(self, x0):
        """The target values F₀ for a run starting at the flat state `x0`: F(x0)."""
        return self.quantities(x0)

    def at_start(self, z0):
        """The field for one run: unless the target was pinned, F₀ = F(x0) of this run's
        own initial state (so one field serves runs from many initial states)."""
        if self.pinned:
            return self
        return eqx.tree_at(lambda f: f.target, self, self.target_at(self.merge(z0)), is_leaf=lambda v: v is None)

    def _require_target(self):
        if self.target is None:
            raise ValueError(
                "this feedback field was built without x0 or target, so it has no target values "
                "F₀ yet: geomjax.integrate sets them from the run's initial state; to evaluate "
                "the field directly, build it with x0 or target="
            )

    def extra_potential(self, x):
        """The potential added to V: k₀/4‖D‖² on an embedded group (D the embedding
        defect; k₀ the field's `embedding_gain`, where a subclass has one), else zero."""
        k0 = getattr(self, "embedding_gain", None)
        if k0 is None:
            return jnp.zeros((), jnp.asarray(x).dtype)
        return k0 * embedding_potential(self.system.structure, self.split(jnp.asarray(x)))

    def _weights(self, deviation):
        if self.gains.ndim == 1:
            return self.gains * deviation
        return (self.gains * deviation[None, :]).sum(axis=1)

    def lyapunov(self, x):
        """V(x) = ½(F(x) − F₀)ᵀ K (F(x) − F₀) (+ the extra potential)."""
        self._require_target()
        d = self.quantities(x) - self.target
        return 0.5 * jnp.sum(d * self._weights(d)) + self.extra_potential(x)

    def euler_step_limit(self, x):
        """2 / λ_max(L∇²V)(x), the largest stable explicit-Euler step near the invariant set.

        Explicit Euler on Y is stable near V⁻¹(0) only for h·λ_max(L∇²V) < 2, λ_max the
        largest eigenvalue of the Hessian of V (times a scalar metric L). Evaluate it on the
        invariant set, e.g. at x0.

        Example:

        ```python
        >>> import geomjax
        >>> model = geomjax.models.spherical_pendulum()
        >>> Y = geomjax.feedback_field(model.system, model.x0, 50.0)
        >>> round(float(Y.euler_step_limit(model.x0)), 5)  # h = 1e-3 is well inside
        0.00742

        ```
        """
        from .._tuning.stability import feedback_rate

        return 2.0 / feedback_rate(self, x)

    def adaptive(self, dt, *, safety: float = 1.1, floor: float = 1e-10):
        """This field with Bae & Chang's adaptive gain: Y = X − α(x)L∇V with
        α(x) = 1/(h·max(floor, c‖L·DFᵀKDF(x)‖_F)) (∇²V on the invariant set), h = `dt` the
        step it will be run with and
        c = `safety` (see `geomjax.AdaptiveFeedbackField`). A `dt` that is not a positive
        finite number (where it is known) is a ValueError.

        Example (Kepler-like use: the gains only set the weights, α sets the strength):

        ```python
        >>> import geomjax
        >>> model = geomjax.models.spherical_pendulum()
        >>> Y = geomjax.feedback_field(model.system, model.x0, 1.0).adaptive(dt=1e-2)
        >>> sol = geomjax.integrate(Y, model.x0, dt=1e-2, steps=1000, method="euler")
        >>> H = model.system.hamiltonian
        >>> bool(sol.ok), abs(float(H(sol.xs[-1]) - H(model.x0))) < 1e-3
        (True, True)

        ```
        """
        from .adaptive_gain import AdaptiveFeedbackField

        if not (isinstance(safety, (int, float)) and safety > 0 and isinstance(floor, (int, float)) and floor > 0):
            raise ValueError(f"adaptive gains need a positive safety factor and floor, got {safety!r} and {floor!r}")
        check_real(dt, "dt", "a positive finite scalar (the step the field will be run with)")
        return AdaptiveFeedbackField(self, jnp.asarray(dt, jnp.float64), float(safety), float(floor))

    def _apply_metric(self, z, grad_v):
        if self.metric is None:
            return grad_v
        ell = self.metric(self.merge(z)) if callable(self.metric) else self.metric
        if jnp.ndim(ell) == 0:
            return jax.tree_util.tree_map(lambda g: ell * g, grad_v)
        return self.split(ell @ self.merge(grad_v))


class FeedbackField(AbstractFeedbackField):
    """Y(x) = X(x) − L ∇V(x), V = ½(F − F₀)ᵀK(F − F₀), F = (f, H, I) (Chang, Perlmutter and Vankerschaver (2022) eq. 6);
    on an embedded group V also has k₀/4‖D‖² (`embedding_gain` k₀)."""

    system: System
    target: jax.Array | None
    gains: jax.Array
    metric: object
    pinned: bool = eqx.field(static=True, default=False)
    embedding_gain: jax.Array | None = None

    def check(self, x0) -> None:
        check_constraint_matrix(self.system, x0)
        if callable(self.metric):
            # A callable metric is checked at the run's start when the field was built
            # without x0 (feedback_field could not check it then).
            _check_metric(self.metric, x0, None)

    def quantities(self, x):
        return self.system.conserved_quantities(x)

    def vector(self, z):
        self._require_target()
        s = self.system.structure
        system = self.system
        data = constraint_data(system, z)
        m = data.values.shape[0]
        h = s.evaluate(system.hamiltonian, z)
        n_int = self.target.shape[0] - m - 1
        if n_int:
            ivals, i_vjp = jax.vjp(lambda w: s.evaluate(system.integral_values, w), z)
            deviation = jnp.concatenate([data.values, jnp.atleast_1d(h), ivals]) - self.target
        else:
            deviation = jnp.concatenate([data.values, jnp.atleast_1d(h)]) - self.target
        w = self._weights(deviation)
        # Y = X_H − Σ c_j X_{f_j} − L(w_H ∇H + Σ w_i ∇f_i + DIᵀ w_I)
        x = dirac_vector(data)
        grad_v = jax.tree_util.tree_map(lambda g: w[m] * g, data.grad_h)
        if m:
            grad_v = jax.tree_util.tree_map(jnp.add, grad_v, stacked_combination(w[:m], data.grads))
        if n_int:
            grad_v = jax.tree_util.tree_map(jnp.add, grad_v, i_vjp(w[m + 1 :])[0])
        if self.embedding_gain is not None:
            grad_d = jax.grad(lambda u: embedding_potential(s, u))(z)
            grad_v = jax.tree_util.tree_map(lambda a, b: a + self.embedding_gain * b, grad_v, grad_d)
        return jax.tree_util.tree_map(jnp.subtract, x, self._apply_metric(z, grad_v))


# One compiled call, cached per system: evaluated op by op, F(x0) dispatched dozens of
# small compilations in a fresh process, a large share of the time to the first result.
_conserved_quantities = eqx.filter_jit(lambda system, x: system.conserved_quantities(x))


def resolve_target(system, x0, target, target_at, value_at_x0=None):
    """`(x0, target, pinned, m)` for a feedback field: x0 checked (or None); the pinned
    target if one was given, else F(x0) (or None without x0; `value_at_x0` if the caller
    computed it already); m the length of F."""
    if x0 is not None:
        x0 = as_state(x0, system.dim)
        spec = x0
    elif system.dim is not None:
        spec = jax.ShapeDtypeStruct((system.dim,), jnp.float64)
    else:
        raise ValueError("give x0 (or target=) to feedback_field: this structure does not say its dimension")
    m = jax.eval_shape(lambda x: target_at(x), spec).shape[0]
    if target is not None:
        target = jnp.asarray(target, dtype=jnp.float64)
        if target.shape != (m,):
            raise ValueError(f"target has shape {tuple(target.shape)}, but F has {m} entries: expected ({m},)")
        if is_concrete(target) and not np.all(np.isfinite(np.asarray(target))):
            raise ValueError("target must be finite")
        return x0, target, True, m
    if x0 is None:
        return x0, None, False, m
    return x0, (target_at(x0) if value_at_x0 is None else value_at_x0), False, m


def _start_checks(system, x0, start, start_tol):
    check_constraint_matrix(system, x0, matrix=start[1])
    check_on_constraint_set(system, x0, start_tol, residuals=start[2])


def feedback_field(
    system: System,
    x0: Float[ArrayLike, " n"] | None = None,
    gains: Float[ArrayLike, "*k"] | None = None,
    metric: Callable | jax.Array | float | None = None,
    *,
    target=None,
    start_tol: float | None = START_TOL,
    dt: float | None = None,
    method: str = "euler",
) -> AbstractFeedbackField:
    """The feedback-integrator field Y = X − L∇V of Chang, Perlmutter and Vankerschaver (2022) §2.2.

    With F = (f, H, I) (constraint functions, Hamiltonian, extra integrals, in that order),
    F₀ = F(x₀) and a positive-definite K,

    V(x) = ½ (F(x) − F₀)ᵀ K (F(x) − F₀),   ∇V = DFᵀ K (F − F₀),   Y = X − L∇V,

    where X is the Dirac-extended field (`geomjax.dirac_field`), which keeps F constant, so
    V⁻¹(0) is invariant and, with the feedback term, attracting: trajectories of any
    off-the-shelf integrator are pulled back to the constraint set and the level set of
    the integrals. With explicit Euler the feedback term is stiff: stability needs roughly
    h·λ_max(L∇²V) < 2 (for Chang, Perlmutter and Vankerschaver's (2022) pendulum with k = 50 and h = 1e−3 this holds).

    For a nonholonomic system (`System(..., nonholonomic=omega)`, Chang and Perlmutter (2019)) X is the
    extended field `geomjax.nonholonomic_field(system)` and F = (J, H_ext, integrals) with
    target J = 0. On an embedded group (`left_trivialised_so3/se2`), with or without
    constraints, V also gets k₀/4‖D‖² (D = RᵀR − I or cos² + sin² − 1), k₀ being one
    extra, last gain.

    **Arguments:**

    - `system`: a `geomjax.System`.
    - `x0`: an initial state: F₀ = F(x0) when the field is called directly, and x0 is
      checked (on the constraint set, C invertible). Optional. `geomjax.integrate` always
      takes F₀ from the run's own initial state, so one field serves many initial states
      (`jax.vmap` over x0 included). The constraint set is g = 0 with {g, H} = 0 for
      `holonomic=g`, J = 0 for nonholonomic systems, the group for embedded structures;
      for `constraints=f` it is the level set of f through x0, so every x0 is on it (pin
      another level with `target=`).
    - `gains`: K as a positive scalar (K = kI), a vector with one gain ≥ 0 per entry of F
      (at least one positive; a zero leaves that quantity out of V, e.g. H when the
      other integrals already fix it), or a symmetric positive-definite matrix. On an
      embedded group: a scalar or a vector with one more entry, k₀, last.
    - `metric`: L, the identity if `None`; or a positive scalar, an SPD `(dim, dim)` matrix,
      or a callable `x ↦ L(x)` (checked at x0).
    - `target`: pin F₀ to these values for every run (e.g. an energy level other than
      the start's); the run is then pulled towards them.
    - `start_tol`: the tolerance of the check that x0 is on the constraint set, as in
      `geomjax.integrate` (largest residual ≤ `start_tol·(1 + max|x0|)`, default 1e-8);
      `None` builds the field from an x0 off the set on purpose. F₀ = F(x0) then holds
      a holonomic system on the level g = g(x0), not on g = 0 (give `target=` to pull it
      onto the set); a nonholonomic J and an embedded group's defect are pulled to 0.

    **Returns:**

    A `FeedbackField`, callable `x ↦ Y(x)` on flat states; `.lyapunov(x)` gives V(x).

    Inside `jit`: the field holds the system's Python functions, which `jax.jit` can
    neither take as arguments nor return (JAX raises a TypeError naming the function's
    path, before and after geomjax runs). Build the field inside the jitted function that
    uses it (gains, x0 and parameters may be traced there), or jit the builder with
    `equinox.filter_jit(geomjax.feedback_field)`, which treats the functions as static.

    Example (Chang, Perlmutter and Vankerschaver (2022) §2.3, k₁..k₄ = 50):

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum()
    >>> Y = geomjax.feedback_field(model.system, model.x0, gains=50.0)
    >>> sol = geomjax.integrate(Y, model.x0, dt=1e-3, steps=1000, method="euler")
    >>> bool(sol.ok)
    True

    ```

    Without gains, chosen for the step (h·λ_max(L∇²V) = 1 with Euler):

    ```python
    >>> import geomjax, warnings
    >>> model = geomjax.models.spherical_pendulum()
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     Y = geomjax.feedback_field(model.system, model.x0, dt=1e-3)
    >>> print(caught[0].message)
    feedback_field: no gains given, chose K = 185.6 (all 4 entries of F) for dt = 0.001 with 'euler' (h·λ_max(L∇²V) = 1 at x0, stability bound 2; geomjax.recommended_gains); pass gains= to choose them yourself
    >>> round(1e-3 * float(geomjax.feedback_rate(Y, model.x0)), 6)
    1.0

    ```
    """
    if not isinstance(system, System):
        raise TypeError(f"feedback_field needs a geomjax.System, got {type(system).__name__}")
    check_tolerance(start_tol, "start_tol", zero_ok=True, none_means="to build from off the constraint set on purpose")
    if gains is None:
        if dt is None:
            raise TypeError(
                "feedback_field needs the gains K, or the step size to choose them for: call "
                "feedback_field(system, x0, gains=K) (K a positive scalar, one gain ≥ 0 per entry "
                "of F, or an SPD matrix), or feedback_field(system, x0, dt=h, method='euler') to "
                "have K chosen for that step by geomjax.recommended_gains"
            )
        unit = feedback_field(system, x0, 1.0, metric, target=target, start_tol=start_tol)
        return _with_chosen_gains(unit, x0, dt, method)
    if isinstance(system, NonholonomicSystem):
        # F = (J, H_ext, integrals) on the extended nonholonomic field (Chang and Perlmutter (2019)).
        from .nonholonomic import nonholonomic_feedback_field

        return nonholonomic_feedback_field(system, x0, gains, metric, target=target, start_tol=start_tol)
    start = None
    if x0 is not None and is_concrete(x0):
        x0 = as_state(x0, system.dim)
        start = start_values(system, x0)
    x0, target, pinned, m = resolve_target(
        system, x0, target, lambda x: _conserved_quantities(system, x), None if start is None else start[0]
    )
    if start is not None:
        checked_where_known(_start_checks, system, x0, start, start_tol)
    k, k_emb = split_gains(gains, m, has_embedding(system.structure), "(f, H, integrals)")
    metric = _check_metric(metric, x0, system.dim)
    return FeedbackField(system, target, k, metric, pinned, embedding_gain=k_emb)



class ChosenGainsWarning(UserWarning):
    """`geomjax.feedback_field` chose the gains itself (from `dt`): the message says which."""

    def __init__(self, message: str):  # a real signature (a built-in's has none)
        super().__init__(message)


def _with_chosen_gains(unit, x0, dt, method):
    """`unit` (a feedback field with gains 1) with its gains scaled by the rule of
    `geomjax.recommended_gains` for step `dt` and `method`, and a `ChosenGainsWarning`."""
    import warnings

    from .._tuning.stability import recommended_field

    traced = (
        "feedback_field(system, x0, dt=h) chooses the gains from numbers it computes at x0 (λ_max(L∇²V), ‖DX‖), "
        "which are traced here: x0, dt or a value the system's functions close over is a tracer (inside jit, grad "
        "or vmap). Choose the gains outside the transformation, e.g. K = geomjax.recommended_gains(field, x0, dt, "
        "method) for a concrete system, and pass gains=K (a gradient then treats K as fixed)"
    )
    if x0 is None:
        raise ValueError("feedback_field(system, x0, dt=h) chooses the gains from the rates at x0: give x0, or gains=")
    if not is_concrete((x0, dt)):
        raise ValueError(traced)
    try:
        field, check = recommended_field(unit, x0, dt, method)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError) as err:  # a traced closed-over value
        raise ValueError(traced) from err
    k = np.asarray(field.gains)
    shown = (
        f"K = {k.flat[0]:.4g} (all {k.shape[0]} entries of F)"
        if k.ndim == 1 and np.all(k == k.flat[0])
        else f"K = {np.array2string(k, precision=4)}"
    )
    if getattr(field, "embedding_gain", None) is not None:
        shown += f", k₀ = {float(field.embedding_gain):.4g}"
    warnings.warn(
        f"feedback_field: no gains given, chose {shown} for dt = {float(dt):.4g} with {method!r} "
        f"(h·λ_max(L∇²V) = {float(dt) * check.feedback_rate * check.recommended_scale:.3g} at x0, "
        f"stability bound {check.bound:.4g}; geomjax.recommended_gains); pass gains= to choose them yourself",
        ChosenGainsWarning,
        stacklevel=3,
    )
    return field
