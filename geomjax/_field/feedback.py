"""Feedback integrators: the field X − L∇V that makes the invariant set attracting."""

import abc

import equinox as eqx
import jax
import jax.numpy as jnp

from .feedback_terms import (
    _check_metric,
    embedding_potential,
    feedback_rate_at,
    has_embedding,
    lipschitz_estimate,
    resolve_target,
    scale_gains,
    split_gains,
)
from .derived import constraint_data, dirac_vector, stacked_combination
from .dirac import check_constraint_matrix, start_values
from .base import SystemField
from .._system.system import System
from .._monitored import check_on_constraint_set
from .._validate import as_state, check_real, check_step_size, known


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
        return 2.0 / feedback_rate_at(self, jnp.asarray(x))

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


def _start_checks(system, x0, start, start_tol):
    check_constraint_matrix(system, x0, matrix=start[1])
    check_on_constraint_set(system, x0, start_tol, residuals=start[2])


class AdaptiveFeedbackField(AbstractFeedbackField):
    """Y(x) = X(x) − α(x)·L∇V(x),  α(x) = 1 / (h·max(L_min, c‖L·DFᵀKDF(x)‖_F)).

    The adaptive-gain rule of Bae & Chang ("Feedback Integrators Revisited",
    arXiv:2512.01528): the feedback term of a feedback field is scaled so that one
    explicit-Euler step of size h removes at most a fraction 1/c of the deviation along
    the stiffest direction (h·α·λ_max ≤ 1/c near the invariant set, where ∇²V = DFᵀKDF,
    since λ_max ≤ ‖·‖_F), which is the scaling
    that minimises their Taylor bound for feedback Euler. L̂ is re-estimated at every
    evaluation (their stepwise variant); their periodic variant holds it over a time
    window. Built by `AbstractFeedbackField.adaptive`; behaves as the wrapped feedback
    field in every other respect (targets, checks, monitored quantities).

    Example (at h = 0.02 the fixed gains 50 are past explicit Euler's bound):

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum()
    >>> Y = geomjax.feedback_field(model.system, model.x0, 50.0)
    >>> fixed = geomjax.integrate(Y, model.x0, dt=0.02, steps=500, method="euler", throw=False)
    >>> adaptive = geomjax.integrate(Y.adaptive(dt=0.02), model.x0, dt=0.02, steps=500, method="euler")
    >>> bool(fixed.ok), bool(adaptive.ok)
    (False, True)

    ```
    """

    feedback: AbstractFeedbackField
    dt: jax.Array
    safety: float = eqx.field(static=True, default=1.1)
    floor: float = eqx.field(static=True, default=1e-10)

    def __check_init__(self):
        # α = 1/(h·L̂): a zero or NaN h makes the field non-finite at the first step, a
        # negative one turns the feedback around. Checked where h is known.
        try:
            check_step_size(self.dt)
        except (TypeError, ValueError) as err:
            raise type(err)(
                f"{err}: the adaptive gain α = 1/(h·L̂) needs h, the step the field will be run "
                "with (pass the run's dt to .adaptive(dt=...))"
            ) from None

    @property
    def system(self):
        return self.feedback.system

    @property
    def target(self):
        return self.feedback.target

    @property
    def gains(self):
        return self.feedback.gains

    @property
    def metric(self):
        return self.feedback.metric

    @property
    def pinned(self):
        return self.feedback.pinned

    def check(self, x0) -> None:
        self.feedback.check(x0)

    def quantities(self, x):
        return self.feedback.quantities(x)

    def target_at(self, x0):
        return self.feedback.target_at(x0)

    def extra_potential(self, x):
        return self.feedback.extra_potential(x)

    def lyapunov(self, x):
        return self.feedback.lyapunov(x)

    def at_start(self, z0):
        return eqx.tree_at(lambda f: f.feedback, self, self.feedback.at_start(z0))

    def scale(self, x):
        """α(x) = 1 / (h·max(L_min, c‖L·DFᵀKDF(x)‖_F)) at the flat state `x`."""
        estimate = lipschitz_estimate(self.feedback, x, self.safety)
        return 1.0 / (self.dt * jnp.maximum(self.floor, estimate))

    def vector(self, z):
        return scale_gains(self.feedback, self.scale(self.merge(z))).vector(z)


def holonomic_feedback_field(system: System, x0, gains, metric, target, start_tol) -> "FeedbackField":
    """`geomjax.feedback_field` with its gains given, for a system without nonholonomic
    constraints: F = (f, H, integrals), F₀ = F(x0) or `target`, checked at x0."""
    start = None
    if x0 is not None and known(x0) is not None:
        x0 = as_state(x0, system.dim)
        with jax.ensure_compile_time_eval():  # what is computed from x0 and constants is known now
            start = start_values(system, x0)
    x0, target, pinned, m = resolve_target(
        system, x0, target, lambda x: _conserved_quantities(system, x), None if start is None else start[0]
    )
    if start is not None:
        with jax.ensure_compile_time_eval():
            _start_checks(system, x0, start, start_tol)
    k, k_emb = split_gains(gains, m, has_embedding(system.structure), "(f, H, integrals)")
    metric = _check_metric(metric, x0, system.dim)
    return FeedbackField(system, target, k, metric, pinned, embedding_gain=k_emb)


