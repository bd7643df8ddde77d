"""How strong the feedback may be for a method and a step: the method's stability interval
on ẏ = −μy, the stiffest rate of the feedback term, the dynamics' own rate, and the gains
that place the one at a chosen point of the others."""

import functools
import math
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, ArrayLike, Float

from .._field.feedback import AbstractFeedbackField
from .._field.feedback_terms import feedback_rate_at, scale_gains
from .._field.base import FunctionField
from .._step.methods import build_step, method_order
from .._validate import check_step_size, is_concrete, known


class FeedbackAccuracyWarning(UserWarning):
    """Feedback with a high-order method at gains that are expected to cost accuracy."""

    def __init__(self, message: str):  # a real signature (a built-in's has none)
        super().__init__(message)


def _decay(x):
    return -x


@functools.lru_cache(maxsize=None)
def _step_matrices(method: str):
    """`z ↦ M(−z)`, the matrix of the method's loop map on ẏ = −y with step z, vmapped and
    jitted. The map is linear in the loop carry (for a multistep method: x and the past
    slopes), taken where a run's loop starts (after the starter)."""
    step = build_step(method, FunctionField(_decay))

    def matrix(h):
        carry = step.start(jnp.zeros_like(h), step.split(jnp.ones((1,), h.dtype)), h, None)
        flat, unravel = ravel_pytree(carry)
        advance = lambda v: ravel_pytree(step.advance(jnp.zeros_like(h), unravel(v), h, None)[0])[0]
        return jax.jacfwd(advance)(flat)

    return jax.jit(jax.vmap(matrix))


def _growth(method: str, z) -> np.ndarray:
    """The spectral radius of the loop map at steps `z`: |R(−z)| for a one-step method, the
    largest root of the characteristic polynomial for a multistep one."""
    mats = np.asarray(_step_matrices(method)(jnp.asarray(z, jnp.float64)))
    return np.max(np.abs(np.linalg.eigvals(mats)), axis=-1)


@functools.lru_cache(maxsize=None)
def stability_interval(method: str) -> float:
    """β, the end of the method's stability interval on the negative real axis.

    Near the invariant set the feedback term −L∇V contributes the real, non-positive
    eigenvalues −μ of −L∇²V (L and ∇²V symmetric positive semidefinite there). A one-step
    method applied to ẏ = −μy multiplies y by its stability function R(−hμ); it is stable
    when |R(−hμ)| ≤ 1; a multistep method when every root of its characteristic
    polynomial has modulus ≤ 1, i.e. the spectral radius of its loop map (on x and the
    past slopes it carries) is ≤ 1. β is the largest value with that radius ≤ 1 for every
    z ∈ [0, β], found from the Jacobian of the method's own step on ẏ = −y (exact: the map
    is linear) over a grid of steps z, the first crossing refined by bisection. Explicit
    Euler: β = 2 (the bound h·λ_max(L∇²V) < 2 of Chang, Perlmutter and Vankerschaver (2022)); RK4: 2.785; Adams–Bashforth
    2, 3, 4: 1, 6/11, 3/10; A-stable implicit methods: ∞ (reported when the radius stays
    ≤ 1 up to z = 10⁴).

    **Arguments:**

    - `method`: a fixed-step method name of `geomjax.integrate` (`"euler"`, `"rk4"`, …).

    **Returns:** β, a float (`inf` for methods stable on the whole negative real axis).

    Example:

    ```python
    >>> import geomjax
    >>> geomjax.stability_interval("euler"), round(geomjax.stability_interval("rk4"), 4)
    (2.0, 2.7853)
    >>> geomjax.stability_interval("gauss4")
    inf

    ```
    """
    grid = np.concatenate([np.linspace(0.0, 64.0, 6401)[1:], np.geomspace(64.0, 1e4, 400)[1:]])
    unstable = _growth(method, grid) > 1.0 + 1e-12
    if not unstable.any():
        return math.inf
    first = int(np.argmax(unstable))
    lo, hi = (0.0 if first == 0 else grid[first - 1]), grid[first]
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if _growth(method, [mid])[0] > 1.0 + 1e-12:
            hi = mid
        else:
            lo = mid
    return float(round(lo, 10))


def feedback_rate(field, x: Float[ArrayLike, " n"]) -> Float[Array, ""]:
    """λ_max(L∇²V)(x), the stiffest rate of the feedback term −L∇V at the flat state `x`.

    On the invariant set (F = F₀) the Hessian is DFᵀKDF (+ the embedded groups' k₀ term),
    linear in the gains K; explicit methods are stable there for h·λ_max ≤ β
    (`stability_interval`). Differentiable in the field's gains and metric.

    **Arguments:**

    - `field`: a feedback field (`geomjax.feedback_field`, or its `.adaptive(dt)`).
    - `x`: a flat state, on the invariant set for the bound to mean what it says.

    **Returns:** λ_max, a scalar array.

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum()
    >>> Y = geomjax.feedback_field(model.system, model.x0, 50.0)
    >>> round(float(geomjax.feedback_rate(Y, model.x0)), 2)   # 2 / Y.euler_step_limit
    269.42

    ```
    """
    require_feedback(field, "feedback_rate")
    return feedback_rate_at(field, jnp.asarray(x))


def require_feedback(field, what: str) -> None:
    """Raise a TypeError unless `field` is a feedback field (it has gains and V)."""
    if not isinstance(field, AbstractFeedbackField):
        raise TypeError(
            f"{what} needs a feedback field Y = X − L∇V (geomjax.feedback_field(system, x0, gains=...)), "
            f"got a {type(field).__name__}: a field without feedback has no gains and no λ_max(L∇²V) to "
            "check. Build the feedback field of the same system, or, for a plain explicit method, "
            "compare dt with geomjax.stability_interval(method)"
        )


def without_feedback(field):
    """The feedback field with zero gains: X itself (the Dirac or extended field)."""
    return scale_gains(field, 0.0)


def dynamics_rate(field, x):
    """‖DX(x)‖₂, the rate of the dynamics without feedback at the flat state `x` (the
    Lipschitz constant of X there), the time scale a high-order method resolves."""
    plain = without_feedback(field.at_start(field.split(jnp.asarray(x))))
    return jnp.linalg.norm(jax.jacfwd(plain)(jnp.asarray(x)), 2)


def _states(x0, dim=None):
    """The initial states as a `(B, n)` float64 array, checked: one state or a batch, of
    the field's length, finite where the values are known (a NaN start has NaN rates, and
    every comparison with NaN would find nothing wrong)."""
    x0 = jnp.asarray(x0, jnp.float64)
    if x0.ndim not in (1, 2):
        raise ValueError(f"x0 must be one flat state (n,) or a batch (B, n), got shape {tuple(x0.shape)}")
    if dim is not None and x0.shape[-1] != dim:
        raise ValueError(f"x0 has states of length {x0.shape[-1]}, but the field's state has length {dim}")
    values = known(x0)
    if values is not None and not np.all(np.isfinite(values)):
        where = (
            f"indices {np.flatnonzero(~np.isfinite(values)).tolist()}"
            if values.ndim == 1
            else f"rows {np.flatnonzero(~np.isfinite(values).all(axis=1)).tolist()}"
        )
        raise ValueError(f"x0 has non-finite entries (NaN or inf) at {where}: the rates there would be NaN")
    return x0[None] if x0.ndim == 1 else x0


def _at(field, x):
    return field.at_start(field.split(x))


#: Why the gain analysis cannot run on traced values, and what to do instead.
TRACED_RATES = (
    "the gain analysis computes numbers at x0 (λ_max(L∇²V), ‖DX‖), which are traced here: x0, dt or a value "
    "the system's functions close over is a tracer (inside jit, grad or vmap). Choose the gains outside the "
    "transformation, e.g. K = geomjax.recommended_gains(field, x0, dt, method) for a concrete system, and pass "
    "gains=K (a gradient then treats K as fixed)"
)


@eqx.filter_jit
def _rates(field, x0s):
    """(feedback rate, dynamics rate) at each initial state, with F₀ = F(x0) per state
    (compiled once per kind of field and batch shape)."""
    return jax.vmap(lambda x: (feedback_rate(_at(field, x), x), dynamics_rate(field, x)))(x0s)


class GainCheck(eqx.Module):
    """What `check_gains` found: rates at the initial states and where the gains stand.

    **Fields:**

    - `feedback_rate`: the largest λ_max(L∇²V) over the initial states.
    - `dynamics_rate`: the largest ‖DX‖₂ over them.
    - `bound`: the method's stability interval β (`stability_interval`), ∞ if A-stable.
    - `stability_fraction`: h·λ_max/β (≥ 1 is unstable).
    - `recommended_scale`: the factor on the gains that `recommended_gains` applies.
    - `messages`: what is wrong or expected to cost accuracy, in words (empty if nothing).
    """

    feedback_rate: float
    dynamics_rate: float
    bound: float
    stability_fraction: float
    recommended_scale: float
    messages: tuple

    def __str__(self):
        head = (
            f"h·λ_max(L∇²V) = {self.stability_fraction * self.bound:.3g} "
            f"({self.stability_fraction:.1%} of the stability bound {self.bound:.4g}); "
            f"λ_max = {self.feedback_rate:.3g}, dynamics rate ‖DX‖ = {self.dynamics_rate:.3g}; "
            f"recommended gains: × {self.recommended_scale:.3g}"
        )
        return "\n".join((head, *self.messages))


def _target_rate(order: int, dt: float, bound: float, dynamics: float) -> float:
    if order <= 1:
        # Bae & Chang: α = 1/(h·L̂) minimises the Taylor bound of feedback Euler, i.e.
        # h·λ_max = 1 (half the stability interval).
        return min(1.0, 0.5 * bound) / dt
    # A high-order method resolves the dynamics to O(h^p); feedback faster than the
    # dynamics adds its own truncation error to the invariants (measured: knife edge,
    # RK4, h = 0.01: λ = 0.1‖DX‖ leaves the drift as is, λ = 5‖DX‖ makes it 100× worse).
    return min(0.1 * dynamics, 0.5 * bound / dt)


def check_gains(
    field, x0: Float[ArrayLike, "*batch n"], dt: float, method: str = "euler", *, warn: bool = True
) -> GainCheck:
    """Where the gains of a feedback field stand for a step `dt` and a method.

    With λ = λ_max(L∇²V) at the initial states (`feedback_rate`), β the method's stability
    interval (`stability_interval`) and ω = ‖DX‖₂ the dynamics' own rate:

    - h·λ ≥ β: the run is unstable near the invariant set (a `messages` entry; this is
      the bound h·λ_max < 2 of explicit Euler, and its analogue for other methods);
    - a method of order p ≥ 2 with λ > ω: the feedback is faster than the dynamics the
      method resolves, and its own truncation error is expected to cost accuracy on the
      invariants (a `FeedbackAccuracyWarning` when `warn`);
    - the rule of thumb (`recommended_gains`): h·λ = 1 for first-order methods (Bae &
      Chang's α = 1/(h·L̂), which minimises their Taylor bound for feedback Euler), and
      λ = ω/10 (within half the stability interval) for higher orders.

    `x0` is one flat initial state or a batch `(B, n)` (the largest rates are used).
    A field without feedback is a TypeError; a `dt` that is not a positive finite number,
    a non-finite x0 or rates that are not finite there are a ValueError (never a check
    that finds nothing wrong).

    **Arguments:**

    - `field`: a feedback field.
    - `x0`: one flat initial state `(n,)` or a batch `(B, n)`.
    - `dt`, `method`: the step and the fixed-step method.
    - `warn`: issue the `FeedbackAccuracyWarning` (the message is in `messages` either way).

    **Returns:** a `geomjax.GainCheck` (`feedback_rate`, `dynamics_rate`, `bound`,
    `stability_fraction`, `recommended_scale`, `messages`).

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum()
    >>> Y = geomjax.feedback_field(model.system, model.x0, 50.0)
    >>> check = geomjax.check_gains(Y, model.x0, 1e-3, "euler")
    >>> round(check.stability_fraction, 3), check.messages
    (0.135, ())

    ```
    """
    require_feedback(field, "check_gains")
    check_step_size(dt)
    x0s = _states(x0, field.dim)
    rates = _rates(field, x0s)
    if not is_concrete(rates):  # traced, or carrying derivatives that gains chosen from them would drop
        raise ValueError(TRACED_RATES)
    lam, omega = (float(np.max(np.asarray(r))) for r in rates)
    if not (math.isfinite(lam) and math.isfinite(omega)):
        raise ValueError(
            f"the rates at the initial states are not finite (λ_max(L∇²V) = {lam}, ‖DX‖ = {omega}): the "
            "field or its derivatives are NaN/inf there (a singular constraint matrix, a NaN parameter or "
            "gain), so nothing can be said about the gains"
        )
    bound = stability_interval(method)
    order = method_order(method)
    messages = []
    fraction = dt * lam / bound if math.isfinite(bound) else 0.0
    if fraction >= 1.0:
        messages.append(
            f"unstable: h·λ_max(L∇²V) = {dt * lam:.3g} ≥ {bound:.4g}, the stability interval of "
            f"{method!r}; lower the gains by a factor ≥ {fraction:.3g} or the step"
        )
    if order >= 2 and lam > omega:
        text = (
            f"feedback with {method!r} (order {order}) is expected to cost accuracy: its rate "
            f"λ_max = {lam:.3g} exceeds the dynamics' rate ‖DX‖ = {omega:.3g}; gains about "
            f"{lam / max(omega, 1e-300) * 10:.3g}× smaller keep the method's accuracy"
        )
        messages.append(text)
        if warn:
            warnings.warn(text, FeedbackAccuracyWarning, stacklevel=2)
    scale = _target_rate(order, dt, bound, omega) / lam if lam > 0 else math.inf
    return GainCheck(lam, omega, bound, fraction, scale, tuple(messages))


def recommended_gains(
    field, x0: Float[ArrayLike, "*batch n"], dt: float, method: str = "euler"
) -> Float[np.ndarray, "*k"]:
    """The field's gains scaled by the rule of thumb of `check_gains`: h·λ_max(L∇²V) = 1
    for first-order methods, λ_max = ‖DX‖/10 (within half the stability interval) for
    higher orders. The relative weights of the gains are kept (λ_max is linear in K).

    **Arguments:**

    - `field`: a feedback field whose gains set the relative weights.
    - `x0`: one flat state `(n,)` or a batch `(B, n)`: the largest rates over them count.
    - `dt`, `method`: the step and the fixed-step method the field will be run with.

    **Returns:** the gains, shaped like the field's (a NumPy array).

    Example:

    ```python
    >>> import geomjax
    >>> model = geomjax.models.spherical_pendulum()
    >>> Y = geomjax.feedback_field(model.system, model.x0, 1.0)
    >>> K = geomjax.recommended_gains(Y, model.x0, 1e-3, "euler")
    >>> Z = geomjax.feedback_field(model.system, model.x0, K)
    >>> round(1e-3 * float(geomjax.feedback_rate(Z, model.x0)), 6)
    1.0

    ```
    """
    return np.asarray(recommended_field(field, x0, dt, method)[0].gains)


def recommended_field(field, x0, dt: float, method: str = "euler"):
    """`(field with the recommended gains, GainCheck of the field as given)`: every gain
    (K and an embedded group's k₀) times `GainCheck.recommended_scale`; what
    `recommended_gains` and `feedback_field(..., dt=h)` use."""
    check = check_gains(field, x0, dt, method, warn=False)
    if not (math.isfinite(check.recommended_scale) and check.recommended_scale > 0):
        raise ValueError(
            f"no gains reach the rule of thumb here: λ_max(L∇²V) = {check.feedback_rate:.3g} and the dynamics' "
            f"rate ‖DX‖ = {check.dynamics_rate:.3g} at the initial states (scaling the gains cannot move a zero rate)"
        )
    return scale_gains(field, check.recommended_scale), check
