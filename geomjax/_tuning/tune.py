"""Gradient-based tuning of feedback gains (and optionally the metric) with optax."""

import math
import sys
import warnings
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Float
import optax
from jax.flatten_util import ravel_pytree

from .._driver.grid import zipped
from .._driver.sweep import sweep
from .._step.methods import build_step
from .._step.runge_kutta import ExplicitRungeKutta
from .._field.feedback_terms import scale_gains
from .._field.feedback import AbstractFeedbackField
from .._validate import as_state
from .._stability.analysis import feedback_rate, stability_interval, without_feedback

_KINDS = ("scalar", "vector", "matrix")
_METRICS = (False, "diagonal", "full")
_REFERENCE_SUBSTEPS = 8
_TINY = 1e-300


# --------------------------------------------------------------------------------------
# Parametrisation: unconstrained θ ↦ valid gains and metric


def _chol_param(matrix):
    """θ of an SPD matrix: its Cholesky factor with the diagonal's logarithm."""
    c = np.linalg.cholesky(np.asarray(matrix, np.float64))
    return jnp.asarray(np.tril(c, -1) + np.diag(np.log(np.diag(c))))


def _chol_value(theta):
    c = jnp.tril(theta, -1) + jnp.diag(jnp.exp(jnp.diag(theta)))
    return c @ c.T


def _initial_theta(field, kind: str, metric: str | bool, dim: int):
    k = np.asarray(field.gains, np.float64)
    theta = {}
    if kind == "scalar":
        theta["gains"] = jnp.zeros(())
    elif kind == "vector":
        if k.ndim != 1:
            raise ValueError("gains='vector' needs a field whose gains are a vector (one per entry of F)")
        theta["gains"] = jnp.asarray(np.log(np.where(k > 0, k, 1.0)))
    else:
        theta["gains"] = _chol_param(np.diag(k) if k.ndim == 1 else k)
    if getattr(field, "embedding_gain", None) is not None:
        theta["embedding"] = jnp.log(jnp.asarray(field.embedding_gain, jnp.float64))
    if metric:
        ell = field.metric
        if callable(ell):
            raise ValueError("tune_metric needs a constant metric (None, a scalar or a matrix), not a callable")
        ell = np.eye(dim) if ell is None else np.asarray(ell, np.float64) * (np.eye(dim) if np.ndim(ell) == 0 else 1.0)
        if metric == "diagonal":
            theta["metric"] = jnp.asarray(np.log(np.diag(ell)))
        else:
            theta["metric"] = _chol_param(ell)
    return theta


def _with_theta(field, theta, kind: str, metric):
    """The feedback field with the gains (and metric) that θ stands for."""
    k0 = jnp.asarray(field.gains, jnp.float64)
    if kind == "scalar":
        gains = jnp.exp(theta["gains"]) * k0
    elif kind == "vector":
        gains = jnp.where(k0 > 0, jnp.exp(theta["gains"]), 0.0)
    else:
        gains = _chol_value(theta["gains"])
    field = eqx.tree_at(lambda f: f.gains, field, gains)
    if "embedding" in theta:
        scale = jnp.exp(theta["gains"]) if kind == "scalar" else 1.0
        field = eqx.tree_at(lambda f: f.embedding_gain, field, scale * jnp.exp(theta["embedding"]))
    if metric:
        ell = jnp.diag(jnp.exp(theta["metric"])) if metric == "diagonal" else _chol_value(theta["metric"])
        field = eqx.tree_at(lambda f: f.metric, field, ell, is_leaf=lambda v: v is None)
    return field


def _scaled_theta(theta, kind: str, factor):
    """θ of the gains times `factor` (> 0), the metric unchanged."""
    log = jnp.log(factor)
    out = dict(theta)
    if kind == "matrix":
        g = theta["gains"]
        out["gains"] = jnp.tril(g, -1) * jnp.sqrt(factor) + jnp.diag(jnp.diag(g) + 0.5 * log)
    else:
        out["gains"] = theta["gains"] + log
    if "embedding" in theta and kind != "scalar":
        out["embedding"] = theta["embedding"] + log
    return out


# --------------------------------------------------------------------------------------
# Objectives, per member: log₁₀ of an RMS over the saves after the start


def _invariant_drift(field):
    def drift(xs, x0, reference):
        del reference
        target = field.target if field.pinned else field.target_at(x0)
        dev = jax.vmap(field.quantities)(xs[1:]) - target
        return jnp.sqrt(jnp.mean(jnp.sum(dev * dev, axis=-1)))

    return drift


def _reference_error(xs, x0, reference):
    del x0
    dev = xs[1:] - reference[1:]
    return jnp.sqrt(jnp.mean(jnp.sum(dev * dev, axis=-1)))


class _Objective(eqx.Module):
    """An objective over a batch of runs: per-member values (log₁₀ of an RMS for the
    built-in ones), the runs' settings, and the reference runs when it needs them. The
    settings are static, so compiled programs are cached across calls with equal
    settings; a user objective is a field of its own, so that the arrays of an objective
    written as a module (or a `Partial`) are traced inputs, not constants."""

    name: str = eqx.field(static=True)
    user: Callable | None
    use_log: bool = eqx.field(static=True)
    run: tuple = eqx.field(static=True)

    def per_member(self, field):
        if self.name == "invariants" and self.user is None:
            return _invariant_drift(field)
        if self.name == "reference" and self.user is None:
            return _reference_error
        return lambda xs, x0, ref: self.user(xs, x0)

    def references(self, field, states):
        """x_ref at the saves (the field without feedback, RK4 at dt/8) or zeros."""
        if self.name != "reference" or self.user is not None:
            return jnp.zeros((states.shape[0],))
        return _reference_runs(self, without_feedback(field), states)

    def members(self, field, states, refs):
        """(value per member, ok per member); a failed member's value is NaN."""
        result = sweep(lambda x0: (field, x0), zipped(x0=states), **dict(self.run))
        ok = result.ok
        xs = jnp.where(ok[:, None, None], result.xs, states[:, None, :])
        refs = refs if refs.ndim == 3 else jnp.zeros_like(xs)
        values = jax.vmap(self.per_member(field))(xs, states, refs)
        values = jnp.log10(values + _TINY) if self.use_log else values
        ok = ok & jnp.isfinite(values)
        return jnp.where(ok, values, jnp.nan), ok


@eqx.filter_jit
def _reference_runs(obj: _Objective, plain, states):
    run, sub = dict(obj.run), _REFERENCE_SUBSTEPS
    ref = sweep(
        lambda x0: (plain, x0), zipped(x0=states), dt=run["dt"] / sub, steps=run["steps"] * sub,
        method="rk4", save_every=run["save_every"] * sub, drift_tol=None,
    )
    return ref.xs


_members = eqx.filter_jit(lambda obj, field, states, refs: obj.members(field, states, refs))


def _objective(objective, *, dt, steps, method, save_every, checkpoint) -> _Objective:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if save_every is None:
        save_every = max(1, steps // 10)
    if steps % save_every:
        raise ValueError(f"steps ({steps}) must be a multiple of save_every ({save_every})")
    run = (("dt", float(dt)), ("steps", steps), ("method", method), ("save_every", save_every),
           ("drift_tol", None), ("checkpoint", checkpoint))
    if callable(objective):
        return _Objective(getattr(objective, "__name__", "user objective"), objective, False, run)
    if objective in ("invariants", "reference"):
        return _Objective(objective, None, True, run)
    raise ValueError(f"objective must be 'invariants', 'reference' or a callable, got {objective!r}")


# --------------------------------------------------------------------------------------
# The tuning problem's compiled pieces (module level: cached across calls)


def _rate_of(field, states):
    """The largest λ_max(L∇²V) over the states, F₀ = F(x0) for each."""
    return jnp.max(jax.vmap(lambda x: feedback_rate(field.at_start(field.split(x)), x))(states))


def _feasible(field, theta, train, problem, dt):
    """The field for θ, its gains scaled onto h·λ_max = stability·β where they exceed it
    at a training state (the constraint inside the parametrisation: the gradient sees
    it, so raising every gain at once changes nothing and changing their ratios does).
    `problem` is `(kind, metric, stability, bound)`."""
    kind, metric, stability, bound = problem
    tuned = _with_theta(field, theta, kind, metric)
    if not math.isfinite(bound):
        return tuned
    return scale_gains(tuned, jnp.minimum(1.0, stability * bound / (dt * _rate_of(tuned, train))))


def _penalised(obj, field, theta, data, problem):
    """The objective of the members (`data` = (training states, states, references)),
    failed members penalised, and the number that failed."""
    train, states, refs = data
    values, ok = obj.members(_feasible(field, theta, train, problem, dict(obj.run)["dt"]), states, refs)
    # A failed member counts as the worst finite one plus two decades (no gradient); with
    # every member failed there is nothing to compare with: the objective is inf.
    worst = jax.lax.stop_gradient(jnp.max(jnp.where(ok, values, -jnp.inf)))
    mean = jnp.mean(jnp.where(ok, values, worst + 2.0))
    return jnp.where(jnp.any(ok), mean, jnp.inf), jnp.sum(~ok)


_loss_and_grad = eqx.filter_jit(jax.value_and_grad(_penalised, argnums=2, has_aux=True))

# Forward mode pays about one forward run per parameter and stores nothing; reverse mode
# pays a backward loop whose cost does not grow with the parameters. Forward mode is taken
# up to this many (benchmarks/tuning.py, CPU, B = 16–4096, one parameter: the pendulum's
# RK4 4.8–6.8× the forward run against 10.7–17.5× in reverse; explicit Euler 2.5–11.4×
# against 3.3–8.2×, close either way; with 4 parameters forward mode lost everywhere in
# earlier runs, 12–44× against 10–29×), except for methods of several stages on a
# derived field above `runge_kutta.WRITTEN_OUT_MAX_OPERATIONS` (`_forward_mode_pays`).
_FORWARD_MAX_PARAMETERS = 3


def _forward_mode_pays(field, method, x0) -> bool:
    """False for an explicit method of several stages on a large derived field: there
    forward mode ran 2–4× slower than reverse mode (the double pendulum's feedback RK4,
    one parameter, B = 16–256: 11.8–32.6× the forward run against 7.0–8.5×; stages
    written out instead of looped, 17.9× against 6.4×)."""
    step = build_step(method, field) if isinstance(method, str) else None
    if not isinstance(step, ExplicitRungeKutta):
        return True
    return step.stage_layout(0.0, step.split(jnp.asarray(x0))) != "checkpointed"


@eqx.filter_jit
def _loss_and_grad_forward(obj, field, theta, *rest):
    """`_loss_and_grad` in forward mode: one JVP per parameter, batched by `vmap`."""
    flat, unravel = ravel_pytree(theta)
    loss = lambda v: _penalised(obj, field, unravel(v), *rest)
    if flat.size == 1:
        value, tangent, aux = jax.jvp(loss, (flat,), (jnp.ones_like(flat),), has_aux=True)
        tangent = tangent[None]
    else:
        one = lambda t: jax.jvp(loss, (flat,), (t,), has_aux=True)
        value, tangent, aux = jax.vmap(one, out_axes=(None, 0, None))(jnp.eye(flat.size, dtype=flat.dtype))
    return (value, aux), unravel(tangent)


def _differentiation(mode: str, theta, field, method, x0) -> str:
    if mode not in ("auto", "forward", "reverse"):
        raise ValueError(f"differentiation must be 'auto', 'forward' or 'reverse', got {mode!r}")
    if mode != "auto":
        return mode
    size = sum(int(np.size(leaf)) for leaf in jax.tree_util.tree_leaves(theta))
    return "forward" if size <= _FORWARD_MAX_PARAMETERS and _forward_mode_pays(field, method, x0) else "reverse"


@eqx.filter_jit
def _held_out(obj, field, theta, data, problem):
    train, states, refs = data
    return obj.members(_feasible(field, theta, train, problem, dict(obj.run)["dt"]), states, refs)


_rate_at = eqx.filter_jit(lambda field, theta, states, kind, metric: _rate_of(_with_theta(field, theta, kind, metric), states))


def feedback_objective(
    field: AbstractFeedbackField,
    x0s: Float[ArrayLike, "batch n"],
    *,
    dt: float,
    steps: int,
    method: str = "euler",
    objective: str | Callable = "invariants",
    save_every: int | None = None,
):
    """The objective `geomjax.tune_gains` minimises, for the gains the field has.

    Returns `(value, per_member, failed)`: the mean over the initial states `x0s` (B, n)
    of the per-member objective (`inf` when a member failed, e.g. diverged at gains past
    the stability bound), the `(B,)` values (NaN for failed members) and the number of
    failed members. See `tune_gains` for the objectives.

    Example:

    ```python
    >>> import numpy as np, geomjax
    >>> model = geomjax.models.spherical_pendulum()
    >>> for k in (1.0, 50.0):
    ...     Y = geomjax.feedback_field(model.system, model.x0, k)
    ...     value, _, failed = geomjax.feedback_objective(Y, model.x0[None], dt=1e-3, steps=500)
    ...     print(k, round(value, 2), failed)
    1.0 -3.06 0
    50.0 -4.36 0

    ```
    """
    if not isinstance(field, AbstractFeedbackField):
        raise TypeError(f"feedback_objective needs a feedback field, got {type(field).__name__}")
    states = _as_states(x0s, field.system.dim, "x0s")
    obj = _objective(objective, dt=dt, steps=steps, method=method, save_every=save_every, checkpoint=False)
    values, ok = _members(obj, field, states, obj.references(field, states))
    values = np.asarray(values)
    failed = int(np.sum(~np.asarray(ok)))
    return (math.inf if failed else float(values.mean())), values, failed


class TuningResult(eqx.Module):
    """What `geomjax.tune_gains` found.

    - `field`: the feedback field with the tuned gains (and metric).
    - `gains`, `metric`: the tuned values (`metric` None when it was not tuned).
    - `initial_gains`: the gains it started from (after the stability projection).
    - `history`: per iteration (the start included): `"objective"`, `"gains"`,
      `"stability_fraction"` (h·λ_max/β at the training states), `"failed"` (members that
      failed); `"skipped"`, per update, True where the gradient was not finite.
    - `objective_before`, `objective_after`: the training objective at the initial and
      the tuned gains (log₁₀ units for the built-in objectives: −1 is 10× smaller).
    - `held_out_before`, `held_out_after`: the same on the held-out states, `inf` where a
      held-out run failed (as `feedback_objective`; None without held-out states), and
      `held_out_failed`: how many failed, before and after.
    - `stability_fraction`: h·λ_max(L∇²V)/β at the tuned gains, the largest over the
      training and held-out states (0 for A-stable methods).
    - `objective`, `method`, `dt`, `steps`: what was tuned for.
    """

    field: AbstractFeedbackField
    gains: np.ndarray
    metric: np.ndarray | None
    initial_gains: np.ndarray
    history: dict
    objective_before: float
    objective_after: float
    held_out_before: float | None
    held_out_after: float | None
    held_out_failed: tuple | None
    stability_fraction: float
    objective: str = eqx.field(static=True)
    method: str = eqx.field(static=True)
    dt: float = eqx.field(static=True)
    steps: int = eqx.field(static=True)

    def summary(self) -> str:
        """The outcome in a few lines of text."""
        lines = [
            f"tuned {self.method} at h = {self.dt:g} over {self.steps} steps ({self.objective})",
            f"  training objective {self.objective_before:.4g} → {self.objective_after:.4g}",
        ]
        if self.held_out_before is not None:
            lines.append(f"  held-out objective {self.held_out_before:.4g} → {self.held_out_after:.4g}")
        lines.append(f"  gains {np.array2string(self.initial_gains, precision=4)} → {np.array2string(self.gains, precision=4)}")
        lines.append(f"  h·λ_max/β = {self.stability_fraction:.3g}")
        return "\n".join(lines)

    def gain_labels(self) -> tuple[str, ...]:
        """The names of the quantities the gains weigh, one per entry of a vector K: the
        names of F = (constraint quantities, H, integrals) of the field's system
        (`AbstractFeedbackField.quantity_names`). `plot` labels the gains with them."""
        return self.field.quantity_names()

    def plot(self, axes=None):
        """Objective and gains over the iterations (two panels); returns the figure. The
        gains are labelled by the quantities they weigh (`gain_labels`: the system's
        names of F, e.g. "g1", "gdot1", "H"), or "K[j]" for a gain matrix's entries."""
        import matplotlib.pyplot as plt

        if axes is None:
            fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
        else:
            fig = axes[0].figure
        it = np.arange(len(self.history["objective"]))
        axes[0].plot(it, self.history["objective"], "o-", ms=3, label="training states")
        if self.held_out_before is not None:
            axes[0].plot([0, it[-1]], [self.held_out_before, self.held_out_after], "s--", label="held-out states (start, tuned)")
        axes[0].set(xlabel="optax iteration", ylabel=f"objective ({self.objective})", title="objective")
        axes[0].legend(loc="best", fontsize="small")
        g = np.asarray(self.history["gains"]).reshape(len(it), -1)
        if g.shape[1] <= 12:
            labels = self.gain_labels()
            if len(labels) != g.shape[1]:  # a gain matrix: its entries
                labels = [f"K[{j}]" for j in range(g.shape[1])]
            # gains whose histories agree to 0.1 % (equal by symmetry, e.g. the two rods' velocity
            # constraints; closer than a pixel on the plot) are one curve labelled by all of
            # them ("gdot1 ≈ gdot2"), not curves hiding each other
            groups: list[list[int]] = []
            for j in range(g.shape[1]):
                same = next((grp for grp in groups if np.allclose(g[:, j], g[:, grp[0]], rtol=1e-3, atol=0.0)), None)
                if same is None:
                    groups.append([j])
                else:
                    same.append(j)
            for k, grp in enumerate(groups):
                if np.any(g[:, grp[0]] > 0):  # a zero gain stays zero: nothing to draw on a log axis
                    axes[1].semilogy(it, g[:, grp[0]], marker="os^vD<>"[k % 7], ms=3, label=" ≈ ".join(labels[j] for j in grp))
            axes[1].legend(loc="best", fontsize="small", ncol=2, title="gain on")
        else:
            axes[1].semilogy(it, np.abs(g).max(axis=1), label="max |K|")
        axes[1].set(xlabel="optax iteration", ylabel="gain", title="gains")
        return fig


def _as_states(x0s, dim, what):
    x = jnp.asarray(x0s)
    if x.ndim == 1:
        x = x[None]
    if x.ndim != 2:
        raise ValueError(f"{what} must be a batch of flat initial states (B, n), got shape {tuple(x.shape)}")
    if x.dtype != jnp.float64:
        as_state(x[0], dim)  # the float32 / wrong-type message
    if dim is not None and x.shape[1] != dim:
        raise ValueError(f"{what} has states of length {x.shape[1]}, but the system's state has length {dim}")
    if not bool(jnp.all(jnp.isfinite(x))):
        bad = np.argwhere(~np.isfinite(np.asarray(x)))[0]
        raise ValueError(f"{what} has non-finite entries (NaN or inf), first at state {bad[0]}, index {bad[1]}")
    return x


def tune_gains(
    field: AbstractFeedbackField,
    x0s: Float[ArrayLike, "batch n"],
    *,
    dt: float,
    steps: int,
    method: str = "euler",
    objective: str | Callable = "invariants",
    held_out: Float[ArrayLike, "held n"] | None = None,
    gains: str | None = None,
    tune_metric: bool | str = False,
    optimizer: optax.GradientTransformation | None = None,
    iterations: int = 20,
    save_every: int | None = None,
    stability: float = 0.9,
    checkpoint: bool = True,
    differentiation: str = "auto",
    progress: bool = False,
) -> TuningResult:
    """Tune the gains K (and optionally the metric L) of a feedback field with optax.

    Minimises, over the gains, the mean over a batch of initial states x₀⁽ⁱ⁾ (one
    `geomjax.sweep`) of an objective of the run of `steps` steps of size `dt`:

    - `"invariants"`: log₁₀ RMS over the saves of ‖F(x) − F₀‖, F = (constraints,
      energy, integrals) of the feedback field (the invariant and constraint drift);
    - `"reference"`: log₁₀ RMS of ‖x − x_ref‖, x_ref the run of the field without
      feedback (X, which the feedback leaves unchanged on the invariant set) by RK4 at
      step `dt`/8, at the same saves;
    - a callable `objective(xs, x0) ↦ scalar` per member (xs the member's saves, the
      start included, shape (saves, n)).

    Gradients go through the whole run: in forward mode (one JVP per parameter; nothing
    stored) or reverse mode (each save block rematerialised when `checkpoint`);
    `differentiation="auto"` takes forward mode for at most 3 parameters (a scalar gain
    scale, say), where it is the cheaper of the two, except with a method of several
    stages on a large field (above 200 operations), where reverse mode is. The gains
    stay valid by construction: a scalar scale
    K = e^s K₀ (`gains="scalar"`), one e^{θᵢ} per entry of F (`"vector"`; zero gains stay
    zero), or K = CCᵀ with C lower triangular with a log diagonal (`"matrix"`); a tuned
    metric is diagonal (e^μ) or Cholesky-parametrised (`tune_metric="diagonal"/"full"`).
    Stability is a constraint, h·λ_max(L∇²V) ≤ `stability`·β at every training state,
    β the method's stability interval (`geomjax.stability_interval`): the objective is
    evaluated at the gains scaled onto the bound where they exceed it (λ_max is linear
    in K, so the scaling is exact, and the gradient sees the constraint), and after every
    update the parameters are scaled back into the set. A member that fails counts as the worst finite one
    plus 2 decades; an update whose gradient is not finite is replaced by halving the
    gains. The result is the best iterate.

    **Arguments:**

    - `field`: a feedback field (`geomjax.feedback_field`) with the starting gains.
    - `x0s`: training initial states, `(B, n)`.
    - `dt`, `steps`, `method`, `save_every` (default: 10 saves), `checkpoint`: the runs.
    - `objective`: `"invariants"`, `"reference"` or a callable (above).
    - `held_out`: initial states `(B', n)` to report the objective on, before and after.
    - `gains`: `"scalar"`, `"vector"` or `"matrix"` (default: the field's own kind).
    - `tune_metric`: False, `"diagonal"` or `"full"`.
    - `optimizer`: an optax transformation (default `optax.adam(0.2)`, on log-gains).
    - `iterations`: optax steps.
    - `stability`: the fraction of the stability interval allowed, in (0, 1).
    - `differentiation`: `"auto"`, `"forward"` or `"reverse"` (same gradient, to
      round-off).
    - `progress`: print the objective at each iteration.

    **Returns:** a `geomjax.TuningResult` (`field`, `gains`, `history`, objectives before
    and after on training and held-out states, `summary()`, `plot()`).

    Example (the spherical pendulum from gains far too small, feedback Euler):

    ```python
    >>> import numpy as np, optax, geomjax
    >>> model = geomjax.models.spherical_pendulum()
    >>> Y = geomjax.feedback_field(model.system, model.x0, 0.1)
    >>> starts = np.stack([model.x0, model.x0 * np.array([1, 1, 1, 0.5, 1, 0.5])])
    >>> tuned = geomjax.tune_gains(Y, starts, dt=1e-2, steps=200, iterations=5,
    ...                            gains="scalar", optimizer=optax.adam(1.0))
    >>> bool(tuned.objective_after < tuned.objective_before - 0.5)
    True

    ```
    """
    if not isinstance(field, AbstractFeedbackField):
        raise TypeError(f"tune_gains needs a feedback field (geomjax.feedback_field), got {type(field).__name__}")
    dim = field.system.dim
    x0s = _as_states(x0s, dim, "x0s")
    held = None if held_out is None else _as_states(held_out, dim, "held_out")
    kind = gains or ("scalar", "vector", "matrix")[min(np.ndim(field.gains), 2)]
    if kind not in _KINDS:
        raise ValueError(f"gains must be one of {_KINDS}, got {gains!r}")
    if tune_metric not in _METRICS:
        raise ValueError(f"tune_metric must be one of {_METRICS}, got {tune_metric!r}")
    if not 0 < stability < 1:
        raise ValueError(f"stability is the fraction of the stability interval allowed, in (0, 1); got {stability!r}")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be a positive integer, got {iterations!r}")
    optimizer = optax.adam(0.2) if optimizer is None else optimizer
    bound = stability_interval(method)
    obj = _objective(objective, dt=dt, steps=steps, method=method, save_every=save_every, checkpoint=checkpoint)

    problem = (kind, tune_metric, stability, bound)
    def project(theta):
        if not math.isfinite(bound):
            return theta, 0.0
        frac = dt * float(_rate_at(field, theta, x0s, kind, tune_metric)) / bound
        if frac > stability:
            theta = _scaled_theta(theta, kind, stability / frac)
            frac = stability
        return theta, frac

    theta, frac = project(_initial_theta(field, kind, tune_metric, dim))
    mode = _differentiation(differentiation, theta, field, method, x0s[0])
    loss_and_grad = _loss_and_grad_forward if mode == "forward" else _loss_and_grad
    refs = obj.references(field, x0s)
    state = optimizer.init(theta)
    history = {"objective": [], "gains": [], "stability_fraction": [], "failed": [], "skipped": []}
    current, thetas = theta, []
    for it in range(iterations + 1):
        (value, failed), grad = loss_and_grad(obj, field, current, (x0s, x0s, refs), problem)
        history["objective"].append(float(value))
        history["gains"].append(np.asarray(_with_theta(field, current, kind, tune_metric).gains))
        history["stability_fraction"].append(frac)
        history["failed"].append(int(failed))
        thetas.append(current)
        if progress:
            print(f"tune_gains: iteration {it:3d}  objective {float(value):.5g}  failed {int(failed)}  h·λ/β {frac:.3g}", file=sys.stderr)
        if it == iterations:
            break
        finite = all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grad))
        history["skipped"].append(not finite)
        if finite:
            updates, state = optimizer.update(grad, state, current)
            current = optax.apply_updates(current, updates)
        else:
            current = _scaled_theta(current, kind, 0.5)
        current, frac = project(current)
    # The best iterate seen (optax steps need not decrease the objective monotonically).
    best = int(np.nanargmin(history["objective"])) if np.isfinite(history["objective"]).any() else len(history["objective"]) - 1
    tuned_theta = thetas[best]
    tuned = _with_theta(field, tuned_theta, kind, tune_metric)
    held_before = held_after = held_failed = None
    fraction = history["stability_fraction"][best]
    if held is not None:
        held_refs = obj.references(field, held)
        held_before, held_failed = [], []
        for t in (theta, tuned_theta):
            values, ok = _held_out(obj, field, t, (x0s, held, held_refs), problem)
            failed = int(np.sum(~np.asarray(ok)))
            held_before.append(math.inf if failed else float(np.mean(np.asarray(values))))
            held_failed.append(failed)
        (held_before, held_after), held_failed = held_before, tuple(held_failed)
        if math.isfinite(bound):
            fraction = max(fraction, dt * float(_rate_at(field, tuned_theta, held, kind, tune_metric)) / bound)
            if fraction > 1.0:
                warnings.warn(
                    f"the tuned gains are past the stability bound at a held-out start (h·λ_max/β = {fraction:.3g}): "
                    "the training starts do not cover the held-out ones; add starts like them to x0s",
                    RuntimeWarning, stacklevel=2)
    history = {k: np.asarray(v) for k, v in history.items()}
    if not np.isfinite(history["objective"][best]):
        warnings.warn(
            f"tune_gains found no gains at which every training run succeeded ({history['failed'][best]} of "
            f"{x0s.shape[0]} failed at the best iterate): the objective is inf; see history['failed'] and the "
            "members' statuses (geomjax.sweep)", RuntimeWarning, stacklevel=2)
    return TuningResult(
        field=tuned,
        gains=np.asarray(tuned.gains),
        metric=None if not tune_metric else np.asarray(tuned.metric),
        initial_gains=np.asarray(history["gains"][0]),
        history=history,
        objective_before=float(history["objective"][0]),
        objective_after=float(history["objective"][best]),
        held_out_before=held_before,
        held_out_after=held_after,
        held_out_failed=held_failed,
        stability_fraction=float(fraction),
        objective=obj.name,
        method=method,
        dt=float(dt),
        steps=int(steps),
    )
