"""`geomjax.feedback_field`: the feedback field of a system, with gains given or chosen
for a step size (by the stability analysis of `geomjax._stability.analysis`, along a pilot
run of the driver: so above both)."""

import warnings
from collections.abc import Callable

import jax
import numpy as np
from jaxtyping import ArrayLike, Float

from .._field.feedback import AbstractFeedbackField, holonomic_feedback_field
from .._field.nonholonomic import nonholonomic_feedback_field
from .._monitored import START_TOL
from .._system.system import NonholonomicSystem, System
from .._validate import check_tolerance, is_concrete, positive_count
from .._driver.integrate import integrate
from .._stability.analysis import TRACED_RATES, recommended_field, without_feedback


#: The default horizon, in steps of dt, of the pilot run along which `feedback_field(...,
#: dt=h)` chooses its gains (the double pendulum, a cart double pendulum and a 3-link chain
#: with gains chosen at x0 alone failed within 600–8000 Euler steps at h = 10⁻³).
PILOT_STEPS = 10_000
#: States saved along the pilot run (besides x0), where the rates are measured: 100 for
#: small systems, fewer as the state grows (each costs a Hessian of V and an eigenvalue
#: problem of the state's size), at least 8.
_PILOT_SAVES = 100
_PILOT_BUDGET = 1600  # saves × state length


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
    pilot_steps: int = PILOT_STEPS,
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
    - `dt`: the step the field will be run with, to choose the gains when `gains` is
      None (`geomjax.recommended_gains`: h·λ_max(L∇²V) = 1 for first-order methods,
      λ_max = ‖DX‖/10 for higher orders); a `ChosenGainsWarning` says what was chosen.
    - `method`: the fixed-step method the gains are chosen for (default `"euler"`).
    - `pilot_steps`: the gains chosen from `dt` must stay stable along the motion, not only
      at x0 (the rates grow with the velocities): they are chosen at the stiffest of the
      states of a pilot run from x0 over `pilot_steps`·dt (the field without feedback, RK4
      at 10·dt, 100 states saved, x0 included). 0 chooses them at x0 alone.

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

    Without gains, chosen for the step (h·λ_max(L∇²V) = 1 with Euler, at the stiffest state
    along the motion):

    ```python
    >>> import geomjax, warnings
    >>> model = geomjax.models.spherical_pendulum()
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     Y = geomjax.feedback_field(model.system, model.x0, dt=1e-3)
    >>> print(caught[0].message)
    feedback_field: no gains given, chose K = 158.1 (all 4 entries of F) for dt = 0.001 with 'euler' (h·λ_max(L∇²V) = 1 at the stiffest of 101 states along a pilot run from x0 to t = 10 (the field without feedback, RK4 at 10·dt; pilot_steps=10000); at x0 alone K would be 185.6, stability bound 2; geomjax.recommended_gains); pass gains= to choose them yourself
    >>> round(1e-3 * float(geomjax.feedback_rate(Y, model.x0)), 2)  # below 1 at x0: 1 where the motion is stiffest
    0.85

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
        return _with_chosen_gains(unit, x0, dt, method, positive_count(pilot_steps, "pilot_steps") if pilot_steps else 0)
    if isinstance(system, NonholonomicSystem):
        # F = (J, H_ext, integrals) on the extended nonholonomic field (Chang and Perlmutter (2019)).
        return nonholonomic_feedback_field(system, x0, gains, metric, target=target, start_tol=start_tol)
    return holonomic_feedback_field(system, x0, gains, metric, target, start_tol)


class ChosenGainsWarning(UserWarning):
    """`geomjax.feedback_field` chose the gains itself (from `dt`): the message says which."""

    def __init__(self, message: str):  # a real signature (a built-in's has none)
        super().__init__(message)


def _pilot_states(unit, x0, dt, steps: int):
    """x0 and the states along the motion from it: the field without feedback (the Dirac
    or extended field, which keeps F) by RK4 at step 10·dt over `steps`·dt, `_PILOT_SAVES`
    of them; the finite ones (a pilot that blows up gives what it had)."""
    coarse = max(steps // 10, 1)
    saves = min(_PILOT_SAVES, max(8, _PILOT_BUDGET // int(np.size(x0))), coarse)
    every = coarse // saves
    plain = without_feedback(unit)
    sol = integrate(plain, x0, dt=10.0 * float(dt), steps=saves * every, save_every=every, method="rk4",
                    drift_tol=None, start_tol=None, throw=False)
    xs = np.asarray(sol.xs)
    return xs[np.all(np.isfinite(xs), axis=1)], saves * every * 10.0 * float(dt)


def _with_chosen_gains(unit, x0, dt, method, pilot_steps: int):
    """`unit` (a feedback field with gains 1) with its gains scaled by the rule of
    `geomjax.recommended_gains` for step `dt` and `method` at the stiffest state of a pilot
    run from x0 (`_pilot_states`), and a `ChosenGainsWarning` that says so."""
    if x0 is None:
        raise ValueError("feedback_field(system, x0, dt=h) chooses the gains from the rates at x0: give x0, or gains=")
    if not is_concrete((x0, dt)):
        raise ValueError(f"feedback_field(system, x0, dt=h) chooses the gains itself, but {TRACED_RATES}")
    # (a traced value the system closes over: recommended_field says so in the same words)
    at_x0 = recommended_field(unit, x0, dt, method)
    field, check = at_x0
    where = "at x0"
    if pilot_steps:
        states, horizon = _pilot_states(unit, x0, dt, pilot_steps)
        field, check = recommended_field(unit, states, dt, method)
        where = (f"at the stiffest of {len(states)} states along a pilot run from x0 to t = {horizon:.4g} "
                 f"(the field without feedback, RK4 at 10·dt; pilot_steps={pilot_steps}); at x0 alone "
                 f"K would be {float(np.max(np.asarray(at_x0[0].gains))):.4g}")
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
        f"(h·λ_max(L∇²V) = {float(dt) * check.feedback_rate * check.recommended_scale:.3g} {where}, "
        f"stability bound {check.bound:.4g}; geomjax.recommended_gains); pass gains= to choose them yourself",
        ChosenGainsWarning,
        stacklevel=3,
    )
    return field
