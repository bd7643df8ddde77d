"""`geomjax.fit`: physical parameters fitted to observed trajectories by least squares,
through any integrator, with Gauss–Newton standard errors.

One compiled program per problem, `_evaluate`: for each dataset it runs the B
trajectories once with p forward-mode tangents (`jax.jvp` under `jax.vmap` over the unit
vectors), which gives the residuals r and their Jacobian J together. The optimiser
(Levenberg–Marquardt or optax), its convergence test and, at the end, the covariance all
use that same (r, J), on the host in NumPy, batched over the datasets.
"""

import dataclasses
import math
import sys
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Float

from .._driver.integrate import integrate
from .._status import RESULTS, code_int, code_of, from_code
from .._validate import is_traced

# A parameter counts as not identified when its variance inflation factor, the diagonal
# entry of the inverse correlation-scaled JᵀJ, is past this bound: its standard error
# would be 10⁴ times what it would be were the parameter uncorrelated with the others,
# and the correlations that near 1 are within the round-off of J (derivatives through
# implicit steps come from Newton solves converged to about 1e-12). The scaled matrix is
# factored with a ridge ε = `_RIDGE`, so that an exactly flat direction v gives a finite
# inflation vᵢ²/ε ≫ the bound.
_MAX_INFLATION = 1e8
_RIDGE = 1e-12
# A column of J (∂r/∂θᵢ) shorter than this fraction of the longest is zero to working
# precision: the predictions do not depend on that parameter.
_NEGLIGIBLE = 1e-8
# Levenberg–Marquardt: initial damping (relative to diag JᵀJ), and the damping past which
# no step decreases the loss any more (the fit has stalled).
_INITIAL_DAMPING = 1e-3
_STALLED_DAMPING = 1e16
# A step that changes every log-parameter (or parameter) by less than this, relative, is
# round-off: converged whatever the statistics say (noise-free data).
_ROUND_OFF_STEP = 1e-11

_TRACED = (
    "geomjax.fit runs its optimiser on the host, between calls of one compiled evaluation, so it cannot run "
    "inside jax.jit, jax.vmap or jax.grad. To fit many datasets at once, stack them: data of shape "
    "(datasets, trajectories, saves, observed values) gives one fit per dataset, all evaluated together"
)


class FIT_RESULTS(eqx.Enumeration):  # pyright: ignore
    """How a `geomjax.fit` ended (`FitResult.result`).

    Members: `successful`, `integration_failed`, `unidentifiable`, `not_converged`,
    `discretization_bias`.
    Compare with `==` (elementwise for a result with a datasets axis);
    `FIT_RESULTS[item]` is the sentence.
    `FitResult.message` adds the numbers (which runs failed and why, which combination of
    parameters is not identified, how far from an optimum the fit stopped).
    """

    successful = ""
    integration_failed = (
        "a run failed at the fitted parameters, so the residuals are not finite there and "
        "neither the loss nor the standard errors mean anything"
    )
    unidentifiable = (
        "JᵀJ is singular: the observations do not determine every parameter (the loss is flat "
        "along a direction in parameter space), so the standard errors of the parameters in "
        "that direction are infinite"
    )
    not_converged = (
        "the optimiser stopped before the Gauss–Newton step from its last point was below tol "
        "standard errors, so the point is not an optimum and the standard errors, which assume "
        "one, are approximate"
    )
    discretization_bias = (
        "the integrator's error at dt biases the fit: the same fit at dt/2 (twice the steps "
        "between the same observations) moves a parameter by more than "
        "`step_check_tol` standard errors. Fit with a smaller dt (save_every doubled) or a "
        "method of higher order"
    )


# --------------------------------------------------------------------------------------
# Parameters: a pytree of the user's values ↔ a flat vector θ (log of the positive ones)


class _Layout(eqx.Module):
    """The structure of the parameter pytree, static (equal for equal structures, so the
    compiled evaluation is reused across calls)."""

    treedef: Any = eqx.field(static=True)
    shapes: tuple = eqx.field(static=True)
    names: tuple = eqx.field(static=True)
    positive: tuple = eqx.field(static=True)

    def unflatten(self, flat):
        """The pytree of the flat values `flat` (…, p); leading axes (datasets) kept. On
        the host, a scalar parameter of one fit is a Python float."""
        leaves, start = [], 0
        batch = tuple(flat.shape[:-1])
        for shape in self.shapes:
            size = math.prod(shape)
            leaf = flat[..., start : start + size].reshape(batch + shape)
            leaves.append(float(leaf) if isinstance(leaf, np.ndarray) and leaf.ndim == 0 else leaf)
            start += size
        return jax.tree_util.tree_unflatten(self.treedef, leaves)

    def values(self, theta):
        """The parameters (flat, the user's scale) at θ."""
        return jnp.where(jnp.asarray(self.positive), jnp.exp(theta), theta)

    def params(self, theta):
        return self.unflatten(self.values(theta))


def _layout(guess, positive) -> tuple[_Layout, np.ndarray]:
    """The layout of the parameter pytree and the flat initial θ."""
    pairs, treedef = jax.tree_util.tree_flatten_with_path(guess)
    if not pairs:
        raise ValueError("the guess has no parameters (an empty pytree): nothing to fit")
    if isinstance(positive, bool):
        flags = [positive] * len(pairs)
    else:
        try:
            flags = treedef.flatten_up_to(positive)
        except (ValueError, TypeError) as err:
            raise ValueError(
                "positive must be True, False, or a pytree of bools with the structure of the guess "
                f"(one bool per parameter leaf): {err}"
            ) from None
        flags = [bool(f) for f in flags]
    names, shapes, positives, values = [], [], [], []
    for (path, leaf), pos in zip(pairs, flags):
        if is_traced(leaf):
            raise TypeError(_TRACED)
        value = np.asarray(leaf)
        if not (np.issubdtype(value.dtype, np.floating) or np.issubdtype(value.dtype, np.integer)):
            raise TypeError(f"parameter {_name(path)} must be real numbers, got dtype {value.dtype}")
        value = value.astype(np.float64)
        name = _name(path)
        shapes.append(tuple(value.shape))
        if value.ndim:
            names.extend(f"{name}[{', '.join(map(str, idx))}]" for idx in np.ndindex(value.shape))
        else:
            names.append(name)
        positives.extend([pos] * value.size)
        if not np.all(np.isfinite(value)):
            raise ValueError(f"the guess of {name} is {value.tolist()}, not finite")
        if pos and not np.all(value > 0):
            raise ValueError(
                f"the guess of {name} is {value.tolist()}, not positive: parameters are fitted in log "
                "space (positive=True, the default for physical parameters such as masses, lengths and g). Pass a "
                "positive guess, or positive=False (or a pytree of bools) for parameters that may be negative"
            )
        values.append(value.reshape(-1))
    flat = np.concatenate(values)
    pos = np.asarray(positives)
    theta = np.where(pos, np.log(np.where(pos, flat, 1.0)), flat)
    return _Layout(treedef, tuple(shapes), tuple(names), tuple(positives)), theta


def _name(path) -> str:
    text = jax.tree_util.keystr(path)
    if text.startswith("['") and text.endswith("']") and text.count("'") == 2:
        return text[2:-2]  # a dict's key: g, not ['g']
    return text.lstrip(".") or "param"


# --------------------------------------------------------------------------------------
# The problem: simulate, observe, compare


class _Problem(eqx.Module):
    make: Callable
    x0_of: Callable | None
    observe: Callable | None
    layout: _Layout
    dt: float = eqx.field(static=True)
    steps: int = eqx.field(static=True)
    save_every: int = eqx.field(static=True)
    method: Any = eqx.field(static=True)
    start_observed: bool = eqx.field(static=True)
    options: dict

    def predict(self, params, x0s):
        """Observations predicted at `params` (B, T, m) and the runs' status codes (B,)."""
        target = self.make(params)
        starts = self.x0_of(params) if self.x0_of is not None else x0s
        starts = jnp.asarray(starts, jnp.float64)
        if starts.ndim == 1:
            starts = starts[None]

        def run(x0):
            sol = integrate(
                target,
                x0,
                dt=self.dt,
                steps=self.steps,
                save_every=self.save_every,
                method=self.method,
                throw=False,
                **self.options,
            )
            return sol.xs, sol.status

        xs, codes = jax.vmap(run)(starts)
        if not self.start_observed:
            xs = xs[:, 1:]
        if self.observe is not None:
            xs = jax.vmap(jax.vmap(self.observe))(xs)
        return xs, codes

    def residuals(self, theta, x0s, data, weight):
        """r(θ), flat, and the runs' status codes; missing (non-finite) data give r = 0."""
        ys, codes = self.predict(self.layout.params(theta), x0s)
        if ys.shape != data.shape:
            raise ValueError(
                f"the observations predicted have shape {tuple(ys.shape)} (trajectories, saves, observed "
                f"values), but data has shape {tuple(data.shape)}: data[:, k] is observed at "
                f"t0 + {'k' if self.start_observed else '(k + 1)'}·save_every·dt"
            )
        known = jnp.isfinite(data)
        r = jnp.where(known, (ys - jnp.where(known, data, 0.0)) * weight, 0.0)
        return r.reshape(-1), codes

    def evaluate(self, theta, x0s, data, weight):
        """(r, J = ∂r/∂θ, status codes): one run of the batch with p forward tangents."""
        f = lambda t: self.residuals(t, x0s, data, weight)
        one = lambda v: jax.jvp(f, (theta,), (v,), has_aux=True)
        r, jt, codes = jax.vmap(one, out_axes=(None, 0, None))(jnp.eye(theta.size, dtype=theta.dtype))
        return r, jt.T, codes


# --------------------------------------------------------------------------------------
# The compiled part: the residuals and their Jacobian for a batch of datasets


@eqx.filter_jit
def _evaluate(problem: _Problem, thetas, x0s, data, weight):
    """(r, J, status codes) for each dataset: `_Problem.evaluate` under `vmap` over the
    leading axis of every argument. The one compiled program of a fit."""
    return jax.vmap(problem.evaluate)(thetas, x0s, data, weight)


# --------------------------------------------------------------------------------------
# Gauss–Newton quantities (NumPy, on the host, batched over datasets)
#
# The optimiser's bookkeeping and its p × p linear algebra run on the host, between calls
# of the compiled evaluation. Written into the compiled program (a `lax.while_loop`), they
# cost 0.7–1.0 s of compile time per problem on the CPU (measured: about 50 fused kernels
# and an eigh), as much as the derivative of a whole simulation; on the host they cost
# tens of microseconds per iteration.


def _scaled(a):
    """A = JᵀJ (…, p, p) as S C S with S = diag(s), s = √diag A, and C = V diag(w) Vᵀ the
    correlation-scaled matrix. A column of J shorter than `_NEGLIGIBLE` of the longest is
    zero to working precision (`zero`): its parameter does not move the predictions, so
    it gets no step (a step along it would be its round-off gradient divided by its
    round-off norm) and an infinite standard error; C has a 1 on its diagonal and zeros
    in its row and column there. Returns (s, w, v, zero)."""
    d = np.sqrt(np.maximum(np.diagonal(a, axis1=-2, axis2=-1), 0.0))
    zero = ~(d > _NEGLIGIBLE * d.max(axis=-1, keepdims=True))
    s = np.where(zero, 1.0, d)
    c = a / (s[..., :, None] * s[..., None, :])
    c = np.where(zero[..., :, None] | zero[..., None, :], 0.0, c)
    eye = np.eye(a.shape[-1], dtype=bool)
    w, v = np.linalg.eigh(np.where(eye, 1.0, c))
    return s, np.maximum(w, 0.0), v, zero


def _solve(scaled, g, damping):
    """δ with (A + damping·diag A) δ = g (δ = 0 along zero columns), batched."""
    s, w, v, zero = scaled
    b = np.where(zero, 0.0, g / s)
    x = np.einsum("...ij,...j->...i", v, np.einsum("...ji,...j->...i", v, b) / (w + np.asarray(damping)[..., None]))
    return np.where(zero, 0.0, x / s)


def _inverse(scaled):
    """(C + εI)⁻¹ with ε = `_RIDGE` (C⁻¹ to round-off where C is well-conditioned)."""
    _, w, v, _ = scaled
    return np.einsum("...ik,...jk->...ij", v / (w[..., None, :] + _RIDGE), v)


def _gauss_newton(scaled, g):
    """The Gauss–Newton step −A⁻¹g (ridge ε in scaled coordinates: a flat direction
    takes no step) and gᵀA⁻¹g, the decrease of |r|² it predicts."""
    step = -_solve(scaled, g, _RIDGE)
    return step, -np.sum(g * step, axis=-1)


def _ok(r, codes):
    return np.all(np.isfinite(r), axis=-1) & np.all(codes == 0, axis=-1)


class _Trace:
    """The optimiser's state, one row per dataset (NumPy arrays)."""

    def __init__(self, theta0, n_data, codes, max_steps):
        d, p = theta0.shape
        self.theta = theta0.copy()
        self.trial = theta0.copy()
        self.r = np.zeros((d, n_data))
        self.J = np.zeros((d, n_data, p))
        self.codes = np.zeros_like(codes)
        self.sq = np.full(d, np.inf)
        self.predicted = np.ones(d)
        self.damping = np.full(d, _INITIAL_DAMPING)
        self.nu = np.full(d, 2.0)
        self.converged = np.zeros(d, bool)
        self.failed = np.zeros(d, bool)
        self.stalled = np.zeros(d, bool)
        self.iterations = np.zeros(d, np.int64)
        self.history = np.full((d, max_steps + 1), np.nan)

    @property
    def running(self):
        return ~(self.converged | self.failed | self.stalled)


def _optimise_loop(evaluate, theta0, n_obs, *, optimizer, max_steps, tol, absolute, progress):
    """Levenberg–Marquardt (`optimizer=None`) or optax on every dataset at once: each
    iteration evaluates (r, J) at every dataset's trial point in one compiled call."""
    d, p = theta0.shape
    dof = np.maximum(n_obs - p, 1)
    t = None
    opt_state = None
    if optimizer is not None:
        opt_state = _optax_init(optimizer, jnp.asarray(theta0))
    for k in range(max_steps + 1):
        r, J, codes = (np.asarray(a) for a in evaluate(t.trial if t is not None else theta0))
        sq = np.sum(r * r, axis=-1)
        if t is None:
            t = _Trace(theta0, r.shape[-1], codes, max_steps)
        running = t.running
        ok = _ok(r, codes) & np.isfinite(sq)
        first = np.asarray(k == 0)
        better = ok & (sq < t.sq)
        accept = running & (first | better)
        rho = (t.sq - sq) / np.maximum(t.predicted, np.finfo(float).tiny)
        t.theta = np.where(accept[:, None], t.trial, t.theta)
        t.r = np.where(accept[:, None], r, t.r)
        t.J = np.where(accept[:, None, None], J, t.J)
        t.codes = np.where(accept[:, None], codes, t.codes)
        t.sq = np.where(accept, sq, t.sq)
        t.failed |= running & first & ~ok
        a = np.einsum("dni,dnj->dij", t.J, t.J)
        g = np.einsum("dni,dn->di", t.J, t.r)
        scaled = _scaled(a)
        step, dec = _gauss_newton(scaled, g)
        sigma2 = 1.0 if absolute else t.sq / dof
        tiny = np.max(np.abs(step), axis=-1) <= _ROUND_OFF_STEP * (1.0 + np.max(np.abs(t.theta), axis=-1))
        t.converged |= running & _ok(t.r, t.codes) & ((dec <= tol**2 * sigma2) | tiny)
        t.history[running, k] = (t.sq / np.maximum(n_obs, 1))[running]
        t.iterations = np.where(running, k, t.iterations)
        if progress:
            print(
                f"fit: iteration {k:3d}  loss {np.nanmean(t.sq / np.maximum(n_obs, 1)):.6g}  "
                f"running {int(np.sum(t.running))} of {d}",
                file=sys.stderr,
            )
        if optimizer is None:
            # Nielsen's damping update from the gain ratio ρ = actual / predicted decrease
            grow = np.maximum(1.0 / 3.0, 1.0 - (2.0 * rho - 1.0) ** 3)
            damping = np.where(first, t.damping, np.where(better, t.damping * grow, t.damping * t.nu))
            t.nu = np.where(first | better, 2.0, 2.0 * t.nu)
            t.damping = np.where(running, damping, t.damping)
            lm = -_solve(scaled, g, t.damping)
            t.predicted = -(2.0 * np.sum(lm * g, axis=-1) + np.einsum("di,dij,dj->d", lm, a, lm))
            t.stalled |= t.running & (t.damping > _STALLED_DAMPING)
            t.trial = np.where(t.running[:, None], t.theta + lm, t.theta)
        else:
            # optax: every evaluated point is the next iterate (the gradient is taken there);
            # the state keeps the best one. A failed run after the start ends that fit.
            grad = (2.0 / np.maximum(n_obs, 1))[:, None] * np.einsum("dni,dn->di", J, r)
            t.stalled |= t.running & ~ok & ~first
            grad = jnp.asarray(np.where(ok[:, None], grad, 0.0))
            updates, new_state = _optax_update(optimizer, grad, opt_state, jnp.asarray(t.trial))
            keep = jnp.asarray(t.running)
            opt_state = jax.tree_util.tree_map(
                lambda new, old: jnp.where(keep.reshape((-1,) + (1,) * (jnp.ndim(new) - 1)), new, old),
                new_state,
                opt_state,
            )
            t.trial = np.where(t.running[:, None], t.trial + np.asarray(updates), t.trial)
        if not np.any(t.running):
            break
    assert t is not None  # the loop runs at least once (max_steps ≥ 0)
    return t


# optax's init and update, one per dataset (compiled once per optimizer object: pass the
# same one to later fits to reuse them)
_optax_init = eqx.filter_jit(lambda optimizer, theta: jax.vmap(optimizer.init)(theta))
_optax_update = eqx.filter_jit(lambda optimizer, g, state, theta: jax.vmap(optimizer.update)(g, state, theta))


def _optimise(*args, **kwargs):
    # failed runs give inf and NaN residuals: they are rejected, not warned about
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _optimise_loop(*args, **kwargs)


def _statistics(t: _Trace, n_obs, positive, absolute: bool):
    """Standard errors, covariance, correlation, variance inflation and the status at the
    fit, for each dataset."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _statistics_of(t, n_obs, positive, absolute)


def _statistics_of(t: _Trace, n_obs, positive, absolute: bool):
    d, p = t.theta.shape
    sigma2 = t.sq / np.maximum(n_obs - p, 1)
    scale2 = np.ones(d) if absolute else sigma2
    a = np.einsum("dni,dnj->dij", t.J, t.J)
    g = np.einsum("dni,dn->di", t.J, t.r)
    scaled = _scaled(a)
    s, _, _, zero = scaled
    inverse = _inverse(scaled)
    # a parameter is not identified if its column of J is zero or its variance inflation
    # factor [(C + εI)⁻¹]ᵢᵢ is past the bound (along an exactly flat direction it is 1/ε)
    inflation = np.where(zero, np.inf, np.diagonal(inverse, axis1=-2, axis2=-1))
    involved = ~(inflation <= _MAX_INFLATION)
    cov_theta = scale2[:, None, None] * inverse / (s[:, :, None] * s[:, None, :])
    values = np.where(positive, np.exp(t.theta), t.theta)
    jac = np.where(positive, values, 1.0)  # ∂value/∂θ (the delta method)
    cov = cov_theta * jac[:, :, None] * jac[:, None, :]
    var = np.where(involved, np.inf, np.diagonal(cov, axis1=-2, axis2=-1))
    se = np.sqrt(var)
    eye = np.eye(p, dtype=bool)
    cov = np.where(involved[:, :, None] | involved[:, None, :], np.nan, cov)
    cov = np.where(eye, var[:, None, :], cov)
    corr = np.where(eye, 1.0, cov / (se[:, :, None] * se[:, None, :]))
    _, dec = _gauss_newton(scaled, g)
    remaining = np.sqrt(np.maximum(dec, 0.0) / scale2)
    ok = _ok(t.r, t.codes)
    code = np.where(
        ~ok,
        code_int(FIT_RESULTS.integration_failed),
        np.where(
            np.any(involved, axis=-1),
            code_int(FIT_RESULTS.unidentifiable),
            np.where(t.converged, code_int(FIT_RESULTS.successful), code_int(FIT_RESULTS.not_converged)),
        ),
    )
    return dict(
        values=values,
        se=se,
        covariance=cov,
        correlation=corr,
        inflation=inflation,
        information=a,
        remaining=remaining,
        noise_scale=np.sqrt(sigma2),
        loss=t.sq / np.maximum(n_obs, 1),
        code=code,
    )


# --------------------------------------------------------------------------------------
# The result


class FitResult(eqx.Module):
    """What `geomjax.fit` found. With a datasets axis in the data, every array has it
    first (one fit per dataset).

    **Fields:**

    - `params`: the fitted parameters, a pytree like the guess (the user's scale).
    - `standard_errors`: their standard errors, the same pytree: √diag of the
      Gauss–Newton covariance σ̂²(JᵀJ)⁻¹ at the fit, mapped to the user's scale by the
      delta method; `inf` for a parameter that the data do not determine.
    - `covariance`, `correlation`: p × p, flat in the order of `names` (the user's
      scale; NaN between a parameter that is not identified and the others).
    - `loss`: the mean squared (weighted) residual at the fit, |r|²/N.
    - `losses`: the loss of the current point after each iteration (the guess first),
      NaN after the last one.
    - `residuals`: r at the fit, shaped like the data: predicted − observed, divided by
      `noise` when it was given (0 where an observation is missing).
    - `iterations`: optimiser iterations taken (evaluations after the guess's).
    - `noise_scale`: σ̂ = √(|r|²/(N − p)), the noise standard deviation the residuals
      imply (in units of `noise` when it was given: then σ̂ ≈ 1 says the noise model fits).
    - `num_observations`: N, the finite entries of the data.
    - `information`: JᵀJ at the fit (p × p, fitted coordinates θ: log of the positive
      parameters), the Gauss–Newton Hessian of |r|²/2.
    - `inflation`: each parameter's variance inflation factor, [C⁻¹]ᵢᵢ for C the
      correlation-scaled JᵀJ: 1 for a parameter uncorrelated with the others, past 1e8
      (or `inf`, for a parameter that the observations do not depend on) for one that is
      not identified. `flat_directions()` gives the directions.
    - `remaining_step`: the length of the Gauss–Newton step from the fit, in standard
      errors (√(gᵀ(JᵀJ)⁻¹g)/σ̂ with g = Jᵀr): how far from the optimum the fit stopped.
    - `result`: a `geomjax.FIT_RESULTS` item; `runs`: each trajectory's
      `geomjax.RESULTS` at the fitted parameters; `stalled`: whether the optimiser
      stopped because no step lowered the loss; `message`: all that in words.
    - `names`: the parameters' names, flat (`"masses[1]"` for an array leaf);
      `positive`: which are fitted in log space; `optimizer`, `tol`: how.

    `values()` and `errors()` give the parameters and standard errors as flat arrays,
    `summary()` a table, `flat_directions()` the directions the data do not determine,
    and `result[i]` the fit of dataset i.
    """

    params: Any
    standard_errors: Any
    covariance: np.ndarray
    correlation: np.ndarray
    loss: np.ndarray
    losses: np.ndarray
    residuals: np.ndarray
    iterations: np.ndarray
    noise_scale: np.ndarray
    num_observations: np.ndarray
    information: np.ndarray
    inflation: np.ndarray
    remaining_step: np.ndarray
    result: FIT_RESULTS
    runs: RESULTS
    stalled: np.ndarray
    names: tuple = eqx.field(static=True)
    positive: tuple = eqx.field(static=True)
    optimizer: str = eqx.field(static=True)
    tol: float = eqx.field(static=True)
    step_shift: np.ndarray | None = None
    dt: float = eqx.field(static=True, default=0.0)

    @property
    def ok(self):
        """True where the fit succeeded (an array with a datasets axis)."""
        return np.asarray(code_of(self.result)) == code_int(FIT_RESULTS.successful)

    def values(self) -> np.ndarray:
        """The fitted parameters, flat in the order of `names` (datasets first)."""
        return _flat(self.params, self.loss)

    def errors(self) -> np.ndarray:
        """The standard errors, flat in the order of `names` (datasets first)."""
        return _flat(self.standard_errors, self.loss)

    def __getitem__(self, i) -> "FitResult":
        """The fit of dataset `i` (of a result with a datasets axis)."""
        if np.ndim(self.loss) == 0:
            raise IndexError("this FitResult holds one fit (the data had no datasets axis)")
        pick = lambda a: a[i].item() if np.ndim(a) == 1 and isinstance(a, np.ndarray) else a[i]
        return jax.tree_util.tree_map(pick, self)

    def __len__(self) -> int:
        if np.ndim(self.loss) == 0:
            raise TypeError("this FitResult holds one fit (the data had no datasets axis)")
        return int(np.shape(self.loss)[0])

    @property
    def message(self) -> str:
        """Whether the fit succeeded and, if not, why, in words (with the numbers)."""
        code = np.asarray(code_of(self.result))
        if code.ndim:
            bad = np.flatnonzero(code != 0)
            if not bad.size:
                return f"all {code.size} fits succeeded"
            first = int(bad[0])
            return f"{bad.size} of {code.size} fits did not succeed; dataset {first}: {self[first].message}"
        code = int(code)
        if code == code_int(FIT_RESULTS.successful):
            return (
                f"success: converged after {int(self.iterations)} {self.optimizer} iterations "
                f"(Gauss–Newton step {float(self.remaining_step):.2g} standard errors)"
            )
        text = FIT_RESULTS[self.result]
        if code == code_int(FIT_RESULTS.integration_failed):
            runs = np.atleast_1d(np.asarray(code_of(self.runs)))
            bad = np.flatnonzero(runs != 0)
            where = "at the initial guess" if int(self.iterations) <= 0 else "at the fitted parameters"
            if bad.size:
                why = RESULTS[from_code(int(runs[bad[0]]))]
                return (
                    f"integration failed {where}: {bad.size} of {runs.size} runs failed; run {int(bad[0])}: {why}. "
                    "Check the guess, dt and the method with geomjax.integrate(make(guess), x0) and read its message"
                )
            return (
                f"the residuals are not finite {where} (every run succeeded: the observation function or the data "
                "give NaN or inf)"
            )
        if code == code_int(FIT_RESULTS.unidentifiable):
            inflation = np.asarray(self.inflation)
            names = [n for n, v in zip(self.names, inflation) if not v <= _MAX_INFLATION]
            unused = [n for n, v in zip(self.names, inflation) if v == np.inf]
            lines = [f"not identifiable: {text}"]
            if unused:
                lines.append(f"The observations do not depend on {_listed(unused)} at all")
            directions = [d for d in self.flat_directions() if np.count_nonzero(np.abs(d) >= 1e-3) > 1]
            if directions:
                lines.append(
                    "The loss is flat along "
                    + "; and along ".join(self._direction(d) for d in directions)
                    + ": the data determine only combinations across it"
                )
            if len(names) == 1:
                lines.append(
                    f"The standard error of {names[0]} is inf: fix it, or observe something that depends on it"
                )
            else:
                lines.append(
                    f"The standard errors of {_listed(names)} are inf: fix one of them, or observe something that "
                    "depends on them separately"
                )
            return ". ".join(lines)
        if code == code_int(FIT_RESULTS.discretization_bias):
            shift = np.asarray(self.step_shift)
            worst = int(np.nanargmax(np.abs(shift)))
            return (
                f"discretization bias: refitted at dt/2 = {self.dt / 2:.4g}, {self.names[worst]} moves by "
                f"{shift[worst]:+.3g} standard errors (tolerance {STEP_CHECK_TOL:g}): the integrator's error at "
                f"dt = {self.dt:.4g} is as large as the data's noise allows to see, and biases the fit by about as "
                "much. Fit with dt/2 and save_every doubled (or smaller), or a method of higher order; "
                "step_check=False skips this check"
            )
        if not bool(self.stalled):
            stop = f"after {int(self.iterations)} {self.optimizer} iterations"
        elif self.optimizer == "optax":
            stop = "an optax step went to parameters where a run failed, and the fit kept the best point before it"
        else:
            stop = "no step decreased the loss any more (the residuals are not smooth enough at this scale)"
        return (
            f"not converged: {stop}; the Gauss–Newton step from the last point is "
            f"{float(self.remaining_step):.3g} standard errors (tol = {self.tol:g}). The standard errors assume an "
            "optimum: raise max_steps"
            + (", or use the default Levenberg–Marquardt (optimizer=None)" if self.optimizer == "optax" else "")
        )

    def flat_directions(self) -> list[np.ndarray]:
        """The directions in the fitted coordinates θ (log of the positive parameters)
        along which the loss is flat to working precision: unit vectors d with
        JᵀJ d ≈ 0, the eigenvectors of the correlation-scaled JᵀJ whose eigenvalue is
        below 1/1e8 of the largest (mapped back to θ). Empty when every parameter is
        identified. Computed with NumPy, for one fit (not under `jit`)."""
        a = np.asarray(self.information, np.float64)
        if a.ndim != 2:
            raise ValueError("flat_directions() is for one fit; pick one from a batch of fits first")
        d = np.sqrt(np.maximum(np.diag(a), 0.0))
        zero = ~(d > _NEGLIGIBLE * d.max())
        s = np.where(zero, 1.0, d)
        c = np.where(zero[:, None] | zero[None, :], 0.0, a / np.outer(s, s))  # a zero column: eigenvalue 0
        w, v = np.linalg.eigh(c)
        out = []
        for k in range(w.size):
            if w[k] <= w[-1] / _MAX_INFLATION:
                x = v[:, k] / s
                x = x / np.linalg.norm(x)
                out.append(x * np.sign(x[np.argmax(np.abs(x))]))
        return out

    def _direction(self, d) -> str:
        """`d` as a combination of the (log) parameters, largest weights first, the first
        positive (a direction's sign is arbitrary)."""
        order = [i for i in np.argsort(-np.round(np.abs(d), 3), kind="stable") if abs(d[i]) >= 1e-3]
        d = d if d[order[0]] > 0 else -d
        terms = []
        for k, i in enumerate(order):
            name = f"log {self.names[i]}" if self.positive[i] else self.names[i]
            sign = "" if k == 0 else (" − " if d[i] < 0 else " + ")
            terms.append(f"{sign}{abs(d[i]):.3g}·{name}")
        return "".join(terms)

    def summary(self) -> str:
        """The fit as a table: each parameter's value ± standard error, then the loss, σ̂
        and the largest correlation, and the message."""
        if np.ndim(code_of(self.result)):
            raise ValueError(
                "summary() is for one fit; this FitResult holds one fit per dataset: pick one with result[i], "
                "or read result.message"
            )
        names, values, errors = self.names, self.values(), self.errors()
        width = max(9, *(len(n) for n in names))
        lines = [f"{'parameter':<{width}}  {'value':>12}  {'std. error':>10}  {'rel.':>7}"]
        for name, v, e in zip(names, values, errors):
            rel = f"{abs(e / v):>7.2%}" if v != 0 and np.isfinite(e) else f"{'—':>7}"
            lines.append(f"{name:<{width}}  {v:>12.6g}  {e:>10.3g}  {rel}")
        lines.append(
            f"loss {float(self.loss):.4g} (mean squared residual, {int(self.num_observations)} observations; "
            f"guess {float(self.losses[0]):.4g}), noise scale σ̂ = {float(self.noise_scale):.4g}"
        )
        corr = np.asarray(self.correlation)
        off = np.where(np.eye(corr.shape[0], dtype=bool) | ~np.isfinite(corr), 0.0, corr)
        if np.any(off):
            i, j = np.unravel_index(np.argmax(np.abs(off)), off.shape)
            lines.append(f"largest correlation: {names[min(i, j)]} ~ {names[max(i, j)]} {corr[i, j]:+.3f}")
        lines.append(self.message)
        return "\n".join(lines)

    def __str__(self) -> str:
        if np.ndim(code_of(self.result)):
            return self.message
        return self.summary()


class FitError(eqx.EquinoxRuntimeError):
    """Raised by `geomjax.fit` (with `throw=True`, the default) when a fit did not succeed:
    a run failed, a parameter is not identified, or the optimiser did not converge. The
    message says which and why; the result is kept in `.result` (`FitResult`), so that
    nothing computed is lost. `throw=False` returns it instead. Like
    `geomjax.IntegrationError`, an `equinox.EquinoxRuntimeError` (itself a
    `RuntimeError`)."""

    def __init__(self, message: str, result: "FitResult"):
        super().__init__(message)
        self.result = result




def _flat(tree, like) -> np.ndarray:
    batch = np.shape(like)
    return np.concatenate([np.reshape(x, batch + (-1,)) for x in jax.tree_util.tree_leaves(tree)], axis=-1)


def _listed(names) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


# --------------------------------------------------------------------------------------
# The public function


def _check_observations(data, batched: bool) -> None:
    """NaN marks a missing observation; ±inf is an error (a unit or overflow problem), and
    a dataset with no finite observation cannot be fitted: both named."""
    infinite = np.argwhere(np.isinf(data))
    if infinite.size:
        where = ", ".join(
            (f"dataset {d}, " if batched else "") + f"trajectory {b}, save {t}, entry {i}" for d, b, t, i in infinite[:3].tolist()
        )
        raise ValueError(
            f"data hold {len(infinite)} infinite observations, the first at {where}: NaN marks a missing "
            "observation, inf is not one (an overflow or a unit problem upstream); replace them by NaN to leave them out"
        )
    empty = [d for d in range(data.shape[0]) if not np.isfinite(data[d]).any()]
    if empty:
        which = f"datasets {empty}" if batched else "the data"
        raise ValueError(
            f"no finite observation in {which}: every observation is NaN (missing), so there is nothing to fit to"
        )


def _check_start_not_observed(data, x0s, observe, batched: bool) -> None:
    """Data whose first save equals the observed start (to round-off), fitted as if it were
    the state one save later (`start_observed=False`), give a biased fit with a `success`
    status: refused, with the remedy."""
    if observe is not None or data.shape[-1] != x0s.shape[-1]:
        return
    first = data[..., 0, :]
    finite = np.isfinite(first)
    if not finite.any():
        return
    close = np.abs(first - x0s)[finite] <= 1e-12 * (1.0 + np.abs(x0s)[finite])
    if close.all():
        raise ValueError(
            "the first save of every trajectory equals its start x0: the data seem to include the start, but "
            "start_observed=False fits data[:, 0] as the state one save after x0. Pass start_observed=True, "
            "or drop the first save from the data"
        )


#: The largest shift of a fitted parameter, in its standard errors, that refitting at dt/2
#: may show before the fit is reported as biased by the integrator's error (`step_check`).
STEP_CHECK_TOL = 0.3


@eqx.filter_jit
def _residuals_at(problem: _Problem, thetas, x0s, data, weight):
    """(r, status codes) for each dataset: the residuals only (no Jacobian)."""
    return jax.vmap(problem.residuals)(thetas, x0s, data, weight)


def _step_shift(problem: _Problem, trace, dims, stats, positive):
    """The shift of each fitted parameter, in its standard errors, that the runs at dt/2
    ask for: δθ = −(JᵀJ)⁻¹Jᵀr_{h/2}(θ̂), J the Jacobian at the fit (the one of dt: its
    change with dt is of higher order), mapped to the user's scale (δp = p·δθ for the
    log-fitted ones). NaN where the runs at dt/2 failed or a parameter is unidentified."""
    half = dataclasses.replace(problem, dt=problem.dt / 2, steps=2 * problem.steps, save_every=2 * problem.save_every)
    r_half, codes = _residuals_at(half, jnp.asarray(trace.theta), *dims)
    r_half, codes = np.asarray(r_half), np.asarray(codes)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        a = np.einsum("dni,dnj->dij", trace.J, trace.J)
        g = np.einsum("dni,dn->di", trace.J, r_half)
        try:
            delta = -np.linalg.solve(a, g[..., None])[..., 0]
        except np.linalg.LinAlgError:
            delta = np.full(g.shape, np.nan)
        delta_user = np.where(positive, stats["values"], 1.0) * delta
        shift = delta_user / stats["se"]
    failed = np.any(codes != 0, axis=-1) | ~np.all(np.isfinite(r_half), axis=-1)
    return np.where(failed[:, None] | ~np.isfinite(shift), np.nan, shift)


#: The keywords of `geomjax.integrate` that `fit` passes on to its runs (`**options`).
_RUN_KEYWORDS = ("t0", "args", "drift_tol", "start_tol", "checkpoint")


def fit(
    make: Callable,
    guess,
    x0: Float[ArrayLike, "batch n"] | Callable,
    data: Float[ArrayLike, "batch saves m"],
    *,
    dt: float,
    save_every: int = 1,
    method=None,
    observe: Callable | None = None,
    noise: Float[ArrayLike, "..."] | None = None,
    absolute_noise: bool = False,
    positive=True,
    optimizer=None,
    max_steps: int | None = None,
    tol: float = 1e-3,
    start_observed: bool = False,
    throw: bool = True,
    progress: bool = False,
    step_check: bool = True,
    **options,
) -> FitResult:
    r"""Fit physical parameters of a system to observed trajectories (nonlinear least squares).

    The model: trajectories b = 1..B start at x₀⁽ᵇ⁾ and run the integrator that
    `make(params)` returns (`geomjax.integrate(make(params), x₀⁽ᵇ⁾, dt=dt, ...)`); the
    observation `observe(x)` of the state at save k is compared with `data[b, k]`. With
    r(θ) ∈ R^N the residuals (predicted − observed, divided by `noise` when given; N the
    finite entries of `data`, missing ones given as NaN), the fit minimises the mean
    squared residual |r(θ)|²/N over θ, the parameters on the fitted scale: log p for
    positive parameters (the default, so that masses, lengths and g stay positive), p
    itself for the others.

    **Optimiser.** The default is Levenberg–Marquardt: the step δ solves
    (JᵀJ + λ diag JᵀJ) δ = −Jᵀr with J = ∂r/∂θ, and λ adapts by Nielsen's rule (a
    Gauss–Newton step where the linear model predicts the decrease well, a short
    gradient step where not). An optax `GradientTransformation` (`optax.adam(0.05)`)
    can be given instead: it takes the gradient 2Jᵀr/N of the loss, and the fit keeps
    the best point it saw. J comes from forward-mode derivatives through the whole run
    (one run with p tangents per iteration; implicit steps differentiate by the
    implicit function theorem), so an iteration costs the same either way. Measured on
    the spherical pendulum of `benchmarks/fit_coverage.py` (RATTLE, 3 runs, 135
    observations, a guess 50 % and 23 % off): Levenberg–Marquardt converged in 4
    iterations, `optax.adam(0.05)` in 210–221, and `optimistix.least_squares` with
    `optimistix.LevenbergMarquardt(rtol=atol=1e-8)` on the same residuals in 6–7, to the
    same optimum, with a first call (its compilation) of 6.5–9.9 s against 3.6–4.3 s
    here. So Levenberg–Marquardt is the default, in NumPy on the host (below), and optax
    is there for users who want a first-order optimiser.

    **Convergence.** The fit stops when the Gauss–Newton step from the current point is
    shorter than `tol` standard errors, gᵀ(JᵀJ)⁻¹g ≤ tol²σ̂² with g = Jᵀr (so the answer
    is within a small fraction of its own uncertainty of the optimum), or when the step
    is below round-off.

    **Standard errors.** At the fit, σ̂² = |r|²/(N − p) estimates the noise variance
    (`absolute_noise=True`: the given `noise` is the standard deviation, σ̂² = 1), and
    the Gauss–Newton covariance of the fitted coordinates is Cov θ = σ̂²(JᵀJ)⁻¹ (the
    inverse Hessian of |r|²/2 with the second-derivative term dropped, exact for
    residuals linear in θ). On the user's scale Cov p = D Cov θ D with D = diag(∂p/∂θ)
    (= p for log-fitted parameters: the delta method), and the standard error is
    √diag Cov p. This is the asymptotic (large-N, small-noise) standard error of
    independent noise of equal variance; check it against `benchmarks/fit_coverage.py`
    for your problem's size.

    **Failures are words, not numbers.** A run that fails at the guess (a Newton solve, a
    NaN, a drift past `drift_tol`) makes the result `integration_failed`, with the run
    and its cause in `message`; later, a Levenberg–Marquardt step into a failed run is
    rejected like a step that raised the loss (optax: the fit stops at the best point
    so far, `not_converged`). If JᵀJ is singular, the result is `unidentifiable`: a parameter on
    which the observations do not depend, or whose variance inflation factor (the
    diagonal of the inverse correlation-scaled JᵀJ) is past 1e8, has standard error
    `inf`, and `message` names the flat direction (m and k entering only as m·k: "flat
    along 0.707·log k − 0.707·log m").

    **Arguments:**

    - `make`: `params ↦` a field or a step, what `geomjax.integrate` takes (e.g.
      `lambda p: geomjax.rattle(geomjax.models.spherical_pendulum(g=p["g"], holonomic=True).system)`).
      Build the system from `params` inside `make`: the parameters arrive as traced
      values. Most constructors of `geomjax.models` take them (`roller_racer`, and
      `kepler`'s and `perturbed_kepler`'s μ and e, which compute their start or period
      on the host, do not: write such a system's functions yourself, as in
      `geomjax.System`).
    - `guess`: the initial parameters, a pytree of floats (dict, tuple, array leaves).
    - `x0`: the initial states (B, n), or `x0(params) ↦ (B, n)` when they depend on
      the parameters (a pendulum of unknown length starts on the sphere of that
      length) or are fitted too (put them in `params`).
    - `data`: observations (B, T, m); `data[:, k]` is observed at
      t0 + (k + 1)·save_every·dt (`start_observed=True`: at t0 + k·save_every·dt, the
      start included). NaN marks a missing observation.
    - `dt`, `save_every`, `method`: the run (steps = T·save_every, or (T − 1)·save_every
      with `start_observed`); `method` as in `geomjax.integrate`, for fields.
    - `observe`: `x ↦ y` (m,), what is observed of a state (default: the whole state).
    - `noise`: the noise standard deviation, a scalar or an array broadcasting against
      `data` (weights 1/noise); with `absolute_noise=True` it is taken as known.
    - `positive`: True (all parameters fitted in log space), False, or a pytree of bools
      like `guess`.
    - `optimizer`: None (Levenberg–Marquardt) or an optax `GradientTransformation` on θ.
    - `max_steps`: iterations at most (default 100 for LM, 2000 for optax); `tol`: the
      convergence tolerance, in standard errors. `max_steps=0` evaluates the guess
      only: its residuals, loss and the standard errors that data like these would give
      there (with `data` of zeros, `residuals` are the predicted observations; with
      `noise=σ, absolute_noise=True` the standard errors are the expected precision of
      a planned experiment).
    - `throw`: raise `geomjax.FitError` (with the result in `.result`) when a fit did
      not succeed; False returns the result, whose `result` and `message` say why.
    - `progress`: print the loss at each iteration.
    - `step_check`: after a successful fit, estimate how far the integrator's error at dt
      moves it: one Gauss–Newton step from the fit with the residuals of runs at dt/2
      (twice the steps between the same observations; one more run), in standard errors
      of each parameter (`FitResult.step_shift`). Beyond `STEP_CHECK_TOL` = 0.3 the
      result is `FIT_RESULTS.discretization_bias`, whose message says which parameter
      moved and what to do. Data no integrator made (measurements, an exact solution)
      are fitted with the integrator's error; this check sees it. False skips it.
    - `**options`: further keyword arguments of `geomjax.integrate` (`t0`, `args`,
      `drift_tol`, `start_tol`, `checkpoint`).

    **Returns:** a `geomjax.FitResult` (`params`, `standard_errors`, `loss`, `losses`,
    `covariance`, `correlation`, `residuals`, `result`, `message`, `summary()`).

    **Many datasets.** Data of shape (D, B, T, m) are D independent datasets (with
    x0 (B, n) shared or (D, B, n)): D fits, evaluated together in each iteration (a
    `vmap` over the datasets), each with its own damping and stopping; every array of
    the result then has the datasets axis first, and `result[i]` is the i-th fit.

    **Compilation.** The one compiled program is the evaluation of (r, J) for a batch of
    datasets; the optimiser runs on the host between its calls (its p × p algebra costs
    microseconds there, and would cost about a second of compile time inside the
    program). A `make`, `observe` and `x0` function defined once are compiled once: later
    fits with data of the same shapes reuse the program. So `fit` itself cannot run under
    `jax.jit`, `jax.vmap` or `jax.grad`; stack datasets instead of `vmap`.

    Example (a damped oscillator's damping α from noisy positions, by the Herglotz
    integrator):

    ```python
    >>> import numpy as np, geomjax
    >>> def make(p):  # the Herglotz integrator of q̈ + αq̇ + q = 0
    ...     return geomjax.herglotz(geomjax.models.damped_oscillator(alpha=p["alpha"]).contact, order=2)
    >>> x0 = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])  # (q, p, z) of two runs
    >>> observe = lambda x: x[:1]  # q at t = 0.4, 0.8, ..., 6
    >>> # synthetic data: the predictions at α = 0.3 by a fine run (max_steps=0 evaluates the
    >>> # guess only; against data of zeros its residuals are the predictions), plus noise
    >>> clean = geomjax.fit(make, {"alpha": 0.3}, x0, np.zeros((2, 15, 1)), max_steps=0, throw=False,
    ...                     dt=0.025, save_every=16, observe=observe)
    >>> data = clean.residuals + 0.01 * np.random.default_rng(0).standard_normal((2, 15, 1))
    >>> result = geomjax.fit(make, {"alpha": 0.1}, x0, data, dt=0.1, save_every=4, observe=observe)
    >>> result.message.split(" (")[0]
    'success: converged after 4 Levenberg–Marquardt iterations'
    >>> round(result.params["alpha"], 3), round(result.standard_errors["alpha"], 4)
    (0.302, 0.0023)
    >>> coarse = geomjax.fit(make, {"alpha": 0.1}, x0, data, dt=0.2, save_every=2, observe=observe, throw=False)
    >>> bool(coarse.result == geomjax.FIT_RESULTS.discretization_bias)  # at dt = 0.2, α would move by 0.72 se
    True

    ```
    """
    if not callable(make):
        raise TypeError(f"make must be a function params ↦ field or step, got {type(make).__name__}")
    if observe is not None and not callable(observe):
        raise TypeError(f"observe must be a function x ↦ observed values, got {type(observe).__name__}")
    for name, value, least in (("save_every", save_every, 1), ("max_steps", max_steps, 0)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise ValueError(f"{name} must be an integer ≥ {least}, got {value!r}")
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol > 0:
        raise ValueError(f"tol is in standard errors and must be positive, got {tol!r}")
    if optimizer is not None and not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
        raise TypeError(
            "optimizer must be None (Levenberg–Marquardt) or an optax GradientTransformation, "
            f"got {type(optimizer).__name__}"
        )
    for name in options:
        if name not in _RUN_KEYWORDS:
            why = "the run's steps follow from the data" if name in ("steps", "saves", "t1") else "not an option of the runs"
            raise TypeError(
                f"fit() got an unexpected keyword argument {name!r} ({why}); the runs take "
                f"{', '.join(_RUN_KEYWORDS)} besides fit's own arguments"
            )
    if any(is_traced(v) for v in jax.tree_util.tree_leaves((x0, data, noise, dt))):
        raise TypeError(_TRACED)
    layout, theta0 = _layout(guess, positive)
    data = np.asarray(data, np.float64)
    if data.ndim == 2:
        data = data[None]  # one trajectory
    if data.ndim not in (3, 4):
        raise ValueError(
            "data must be observations (B, T, m) (trajectories, saves, observed values), or (D, B, T, m) for D "
            f"datasets; got shape {data.shape}"
        )
    batched = data.ndim == 4
    data = data if batched else data[None]
    datasets, trajectories, saves = data.shape[0], data.shape[1], data.shape[2]
    x0_of = x0 if callable(x0) else None
    if x0_of is None:
        x0s = np.asarray(x0, np.float64)
        if x0s.ndim == 1:
            x0s = x0s[None]
        if x0s.ndim == 2:
            x0s = np.broadcast_to(x0s, (datasets,) + x0s.shape)
        elif x0s.ndim != 3 or not batched:
            raise ValueError(
                "x0 must be initial states (B, n), (D, B, n) for D datasets, or a function params ↦ (B, n); "
                f"got shape {x0s.shape}"
            )
        if x0s.shape[1] != trajectories:
            raise ValueError(f"x0 has {x0s.shape[1]} initial states but data has {trajectories} trajectories")
        if x0s.shape[0] != datasets:
            raise ValueError(f"x0 has initial states for {x0s.shape[0]} datasets but data has {datasets}")
    else:
        x0s = np.zeros((datasets, trajectories, 0))
    runs = saves - (1 if start_observed else 0)
    if runs < 1:
        raise ValueError("data must have at least one observation after the start")
    _check_observations(data, batched)
    if not start_observed and x0_of is None:
        _check_start_not_observed(data, x0s, observe, batched)
    # the weights have the data's shape whatever `noise` is: one compiled program for all
    if noise is None:
        weight = np.ones(data.shape)
    else:
        noise = np.asarray(noise, np.float64)
        try:
            noise = np.broadcast_to(noise, data.shape if noise.ndim == 4 else data.shape[1:])
        except ValueError:
            raise ValueError(
                f"noise of shape {noise.shape} does not broadcast against the data's {data.shape[-3:]}"
            ) from None
        if not np.all(np.isfinite(noise) & (noise > 0)):
            raise ValueError("noise must be positive and finite (a standard deviation)")
        weight = np.broadcast_to(1.0 / noise, data.shape)
    problem = _Problem(
        make=make,
        x0_of=x0_of,
        observe=observe,
        layout=layout,
        dt=float(dt),
        steps=runs * save_every,
        save_every=save_every,
        method=method,
        start_observed=bool(start_observed),
        options=dict(options),
    )
    if max_steps is None:
        max_steps = 100 if optimizer is None else 2000
    n_obs = np.sum(np.isfinite(data), axis=(1, 2, 3))
    dims = (jnp.asarray(x0s), jnp.asarray(data), jnp.asarray(weight))
    evaluate = lambda thetas: _evaluate(problem, jnp.asarray(thetas), *dims)
    thetas = np.broadcast_to(theta0, (datasets, theta0.size)).copy()
    trace = _optimise(
        evaluate,
        thetas,
        n_obs,
        optimizer=optimizer,
        max_steps=max_steps,
        tol=float(tol),
        absolute=bool(absolute_noise),
        progress=progress,
    )
    stats = _statistics(trace, n_obs, np.asarray(layout.positive), bool(absolute_noise))
    shift = None
    if step_check and max_steps > 0:  # (max_steps=0 evaluates the guess: nothing was fitted)
        shift = _step_shift(problem, trace, dims, stats, np.asarray(layout.positive))
        biased = (stats["code"] == code_int(FIT_RESULTS.successful)) & np.any(np.abs(shift) > STEP_CHECK_TOL, axis=-1)
        stats["code"] = np.where(biased, code_int(FIT_RESULTS.discretization_bias), stats["code"])
    one = (lambda a: a) if batched else (lambda a: a[0])
    result = FitResult(
        params=layout.unflatten(one(stats["values"])),
        standard_errors=layout.unflatten(one(stats["se"])),
        covariance=one(stats["covariance"]),
        correlation=one(stats["correlation"]),
        loss=one(stats["loss"]),
        losses=one(trace.history),
        residuals=one(trace.r.reshape(data.shape)),
        iterations=one(trace.iterations),
        noise_scale=one(stats["noise_scale"]),
        num_observations=one(n_obs),
        information=one(stats["information"]),
        inflation=one(stats["inflation"]),
        remaining_step=one(stats["remaining"]),
        result=from_code(one(stats["code"]), FIT_RESULTS),
        runs=from_code(one(trace.codes)),
        stalled=one(trace.stalled),
        names=layout.names,
        positive=layout.positive,
        optimizer="Levenberg–Marquardt" if optimizer is None else "optax",
        tol=float(tol),
        step_shift=None if shift is None else one(shift),
        dt=float(dt),
    )
    if throw and not np.all(result.ok):
        raise FitError(result.message, result)
    return result
