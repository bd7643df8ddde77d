"""Rollouts, rollout losses, the training loop and the rollout error of learned dynamics.

A model is trained the way Finzi, Wang and Wilson (2020) train theirs: observed
trajectories are cut into chunks of a few observations, each chunk is predicted from its
first state by integrating the model, and the mean absolute error of the prediction is
minimised with Adam. The integration is geomjax's: RK4 on the Dirac field of the
network's system (their method), RATTLE, or RK4 on a feedback field, for a neural ODE RK4
on its field. One training epoch is one compiled program (a `lax.scan` over the
minibatches, each a `vmap` over chunks).
"""

import math
import sys
import time
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._driver.loop import saved_states
from .._field.base import as_field
from .._field.dirac import dirac_field
from .._stability.analysis import recommended_gains
from .._tuning.feedback_field import feedback_field
from .._step.methods import build_step, method_names
from .._step.rattle import rattle
from .._step.splitting import triple_jump
from ..internal import simplify
from ..models._trajectories import cut_chunks
from .._validate import positive_count
from . import checks
from .networks import ConstrainedHamiltonianNetwork, NeuralODE, trainable_filter

_LOSSES = ("mae", "mse")


#: The methods for constrained networks only: RATTLE, its triple jump (order 4) and
#: feedback RK4.
_CONSTRAINED_METHODS = ("rattle", "rattle4", "feedback")


def _check_method(model, method: str) -> None:
    if isinstance(model, NeuralODE):
        if method in _CONSTRAINED_METHODS:
            raise ValueError(
                f"method={method!r} needs a constrained Hamiltonian network (a system with constraints); "
                "a NeuralODE is a plain field ẋ = f(x): integrate it with a method name such as 'rk4'"
            )
    elif not isinstance(model, ConstrainedHamiltonianNetwork):
        raise TypeError(f"expected a ConstrainedHamiltonianNetwork or a NeuralODE, got {type(model).__name__}")
    elif method in ("rattle", "rattle4") and model.hamiltonian_kind != "separable":
        raise ValueError(
            f"method={method!r} needs H = ½pᵀM⁻¹p + V(q): geomjax.rattle's steps assume a kinetic energy "
            "quadratic in p (∂H/∂p linear in p; its check refuses any other H), and its explicit kick–drift "
            "form a mass matrix that does not depend on q; a network with hamiltonian='mlp' learns neither. "
            "Use method='rk4' (the Dirac field) or 'feedback'"
        )
    if method in _CONSTRAINED_METHODS:
        return
    if not isinstance(method, str) or method not in method_names():
        raise ValueError(
            f"method must be 'rattle', 'rattle4', 'feedback' or a method name of geomjax.integrate "
            f"({', '.join(method_names())}), got {method!r}"
        )


def _step(model, x0, method: str, gains):
    """The geomjax step that advances the model's canonical state; a feedback field's
    target F₀ is F(x0) of this run's start, as `geomjax.integrate` sets it."""
    if isinstance(model, NeuralODE):
        return build_step(method, as_field(model))
    system = model.system()
    if method == "rattle":
        return rattle(system)
    if method == "rattle4":
        return triple_jump(rattle(system))
    if method == "feedback":
        if gains is None:
            raise ValueError(
                "method='feedback' needs gains=: choose them with geomjax.network_gains(model, states, dt) "
                "outside the transformation (train() does this itself)"
            )
        field = feedback_field(system, gains=gains)
        return build_step("rk4", field.at_start(field.split(x0)))
    return build_step(method, dirac_field(system))


def _canonical_run(model, x0, steps: int, dt, method: str, substeps: int, gains):
    """The canonical states (steps + 1, 2n) of the model's run from the canonical x0.

    geomjax's scalar-graph simplification is off here. Under `jax.grad` a network's
    weights are traced inputs of every evaluation of its field; a network small enough
    that weights and state stay within `simplify.MAX_INPUTS` would be expanded weight by
    weight (a width-4 pendulum network's training compiled in 16.4 s with the pass, 5.4 s
    without), and wider ones are past the limit and run unsimplified anyway."""
    return saved_states(simplify.unsimplified(_step(model, x0, method, gains)), x0, steps, dt, substeps)


def _maps(model):
    if isinstance(model, NeuralODE):
        return (lambda x: x), (lambda x: x)
    return model.canonical_maps()


def rollout(
    model,
    x0: Float[ArrayLike, " 2n"],
    steps: int,
    dt,
    method: str = "rk4",
    *,
    substeps: int = 1,
    gains=None,
    start_tol: float | None = checks.START_TOL,
) -> Float[Array, "steps+1 2n"]:
    """The model's prediction of a trajectory from the observed state `x0`: the states at
    t = 0, dt, …, steps·dt (the first is `x0`).

    For a `ConstrainedHamiltonianNetwork`, x0 is mapped to the canonical state (p = Mv
    for observed velocities), the network's system (`model.system()`) is integrated by
    geomjax, and the states are mapped back (v = M⁻¹p):

    - `"rk4"` (or another method name of `geomjax.integrate`): that method on the Dirac
      field X = X_H − Σ(C⁻¹)_ij{H, f_i}X_{f_j} (`geomjax.dirac_field`), the dynamics with
      Lagrange multipliers that Finzi, Wang and Wilson (2020) integrate by RK4. The field
      keeps g and Dg·∂H/∂p constant, but RK4 does not: a rollout drifts off the
      constraint set by the method's truncation error;
    - `"rattle"`: `geomjax.rattle` (symplectic, order 2): g(q) = 0 and the hidden
      constraint hold to round-off at every step, whatever the network has learned
      (separable H only);
    - `"rattle4"`: the triple jump of RATTLE (`geomjax.triple_jump`, Yoshida 1990):
      symmetric, symplectic and of order 4, with the constraints at round-off as
      RATTLE's, at less than three RATTLE steps' cost (its joints fused: one velocity
      projection per step and the force reused between sub-steps);
    - `"feedback"`: RK4 on the feedback field Y = X − ∇V, V = ½(F − F₀)ᵀK(F − F₀),
      F = (g, Dg·∂H/∂p, H) (`geomjax.feedback_field`), which pulls the run back to the
      constraint set and the learned energy level of x0; `gains` K are required (see
      `network_gains`).

    For a `NeuralODE`, `method` on ẋ = f_θ(x). Pure JAX: `jax.vmap` over x0 runs a batch,
    `jax.grad` differentiates with respect to the model (pass it through
    `equinox.filter_grad`), `jax.jit` compiles. A run that fails (a non-finite state, a
    RATTLE step whose Newton solve did not converge) is frozen at its last good state
    and its later states are NaN, as in `geomjax.integrate`.

    **Arguments:**

    - `model`: a `ConstrainedHamiltonianNetwork` or a `NeuralODE`.
    - `x0`: the observed initial state, shape `(2n,)`.
    - `steps`, `dt`: the number of observation intervals and their length.
    - `method`: `"rk4"`, `"rattle"`, `"rattle4"`, `"feedback"` or another method name.
    - `substeps`: integration steps per observation interval (step dt/substeps).
    - `gains`: the feedback gains for `method="feedback"`.
    - `start_tol`: for a constrained network, x0 must lie on its constraint set, |g(q)| and
      |G(q)·∂H/∂p| at most `start_tol`·(1 + max|x0|) (checked where x0 is known); None
      skips the check (noisy observations).

    A batch of starts, an x0 of another length, a dt that is not a positive finite
    number are errors that say so.

    **Returns:** the observed states, shape `(steps + 1, 2n)`.

    Example (an untrained network on pendulum data: RATTLE keeps the circle, RK4 drifts):

    ```python
    >>> import jax, jax.numpy as jnp, geomjax
    >>> pendulum = geomjax.models.planar_pendulum(holonomic=True)
    >>> net = geomjax.ConstrainedHamiltonianNetwork(
    ...     2, pendulum.system.holonomic, width_size=8, depth=1, key=jax.random.key(0))
    >>> circle = lambda xs: float(jnp.abs(jax.vmap(pendulum.system.holonomic)(xs[:, :2])).max())
    >>> circle(geomjax.rollout(net, pendulum.x0, 50, 0.1, "rattle")) < 1e-12
    True
    >>> circle(geomjax.rollout(net, pendulum.x0, 50, 0.1, "rk4")) > 1e-9
    True

    ```
    """
    steps = positive_count(steps)
    substeps = positive_count(substeps, "substeps")
    _check_method(model, method)
    x0 = checks.one_state(model, x0, "rollout")
    checks.step_size(dt, "rollout")
    checks.starts_on_constraints(model, x0, start_tol, "rollout")
    to_canonical, from_canonical = _maps(model)
    xs = _canonical_run(model, to_canonical(jnp.asarray(x0)), steps, dt, method, substeps, gains)
    return jax.vmap(from_canonical)(xs)


def _predict_chunks(model, chunks, dt, method, substeps, gains):
    """The predictions of every chunk (B, C, 2n) from its first state, with the model's
    maps and system built once for the batch."""
    to_canonical, from_canonical = _maps(model)
    steps = chunks.shape[1] - 1

    def one(chunk):
        xs = _canonical_run(model, to_canonical(chunk[0]), steps, dt, method, substeps, gains)
        return jax.vmap(from_canonical)(xs)

    return jax.vmap(one)(chunks)


def rollout_loss(
    model,
    chunks: Float[ArrayLike, "batch chunk 2n"],
    dt,
    method: str = "rk4",
    *,
    substeps: int = 1,
    gains=None,
    loss: str = "mae",
) -> Float[Array, ""]:
    """The multi-step rollout loss of a batch of trajectory chunks.

    Each chunk (x_0, …, x_{C−1}) of observations dt apart is predicted from its first
    state by `rollout` (x̂_0 = x_0), and

    ℓ = mean over chunks, times and entries of |x̂_t − x_t|   (`loss="mae"`, Finzi, Wang
    and Wilson's (2020) loss), or of (x̂_t − x_t)² (`"mse"`).

    Differentiable with respect to the model (e.g. `equinox.filter_value_and_grad`);
    the chunks are batched with `jax.vmap`.

    **Arguments:**

    - `model`, `dt`, `method`, `substeps`, `gains`: as for `rollout`.
    - `chunks`: the observed chunks, shape `(B, C, 2n)` (`Trajectories.chunks`).
    - `loss`: `"mae"` or `"mse"`.

    Example:

    ```python
    >>> import jax, geomjax
    >>> data = geomjax.chain_trajectories(1, 4, steps=4, key=jax.random.key(0))
    >>> net = geomjax.ConstrainedHamiltonianNetwork(
    ...     2, data.constraints, width_size=4, depth=1, key=jax.random.key(1))
    >>> data.chunks(5).shape  # 4 chunks of 5 observations (q, q̇) ∈ R⁴
    (4, 5, 4)
    >>> float(geomjax.rollout_loss(net, data.chunks(5), data.dt)) > 0
    True

    ```
    """
    if loss not in _LOSSES:
        raise ValueError(f"loss must be one of {_LOSSES}, got {loss!r}")
    _check_method(model, method)
    chunks = jnp.asarray(chunks)
    if chunks.ndim != 3 or chunks.shape[1] < 2:
        raise ValueError(f"chunks must have shape (B, C, 2n) with C ≥ 2 observations each, got {tuple(chunks.shape)}")
    return _loss_value(model, chunks, dt, method, positive_count(substeps, "substeps"), gains, loss)


def _loss_value(model, chunks, dt, method, substeps, gains, loss, weights=None, ran=False):
    """The rollout loss of the chunks; with `weights` (B,), their weighted mean over the
    chunks (each chunk's own mean over its times and entries). `ran=True` also returns
    which chunks' predictions are finite, (B,)."""
    predictions = _predict_chunks(model, chunks, dt, method, substeps, gains)
    error = predictions - chunks
    per_entry = jnp.abs(error) if loss == "mae" else error * error
    if weights is None:
        value = jnp.mean(per_entry)
    else:
        value = jnp.sum(weights * jnp.mean(per_entry, axis=(1, 2))) / jnp.sum(weights)
    if ran:
        return value, jax.lax.stop_gradient(jnp.all(jnp.isfinite(predictions), axis=(1, 2)))
    return value


def network_gains(model: ConstrainedHamiltonianNetwork, states, dt, *, method: str = "rk4") -> np.ndarray:
    """Feedback gains K for rollouts of `model` with step `dt`, chosen the geomjax way.

    The gains of `geomjax.recommended_gains` for the feedback field of `model.system()`
    with unit gains, at the canonical forms of the observed `states` (a batch (B, 2n);
    the largest rates over them count): for RK4 (order 4) λ_max(∇²V) = ‖DX‖/10, the
    feedback ten times slower than the dynamics, so that it corrects the drift without
    adding its own truncation error. Concrete values only (call it outside `jit`).
    """
    if not isinstance(model, ConstrainedHamiltonianNetwork):
        raise TypeError(f"network_gains needs a ConstrainedHamiltonianNetwork, got {type(model).__name__}")
    states = jnp.atleast_2d(jnp.asarray(states, jnp.float64))
    to_canonical, _ = model.canonical_maps()
    canonical_states = jax.vmap(to_canonical)(states)
    unit = simplify.unsimplified(feedback_field(model.system(), canonical_states[0], 1.0, start_tol=None))
    return np.asarray(recommended_gains(unit, canonical_states, float(dt), method))  # as in rollouts


def default_optimizer(updates: int, learning_rate: float = 3e-3, weight_decay: float = 1e-4):
    """Finzi, Wang and Wilson's (2020) optimizer: AdamW (learning rate 3·10⁻³, weight decay
    10⁻⁴) with the learning rate annealed to 0 on a cosine over `updates` steps."""
    schedule = optax.cosine_decay_schedule(learning_rate, max(int(updates), 1))
    return optax.adamw(schedule, weight_decay=weight_decay)


def train(
    model,
    data,
    *,
    dt=None,
    chunk_length: int = 5,
    method: str = "rk4",
    substeps: int = 1,
    gains=None,
    optimizer: optax.GradientTransformation | None = None,
    epochs: int = 100,
    batch_size: int = 200,
    loss: str = "mae",
    key: PRNGKeyArray,
    progress: bool | str = False,
    start_tol: float | None = checks.START_TOL,
    validation=None,
    patience: int | None = None,
):
    """Train a model on observed trajectories by minimising the rollout loss with optax.

    The trajectories are cut into non-overlapping chunks of `chunk_length` observations
    (Finzi, Wang and Wilson (2020) use 5); each epoch visits them in a new random order
    in minibatches of `batch_size` (the last, incomplete one dropped, so that every
    minibatch has one shape), and each minibatch is one optimizer step on `rollout_loss`.
    The whole epoch is one compiled program, compiled once per call: a `lax.scan` over
    the minibatches of `jax.value_and_grad` of the loss, each loss a `jax.vmap` of the
    chunks' rollouts. A chunk whose prediction is not finite (a RATTLE step whose Newton
    solve failed, a rollout that blew up) is left out of its minibatch's loss and counted;
    a step whose loss or gradient is still not finite is skipped and counted. Only the
    trainable leaves change (`parameter_count` says which).

    **Arguments:**

    - `model`: a `ConstrainedHamiltonianNetwork` or a `NeuralODE`.
    - `data`: `geomjax.Trajectories`, or an array of observed trajectories `(B, T, 2n)`
      with `dt=`.
    - `dt`: the observation interval (default: the `Trajectories`' own).
    - `chunk_length`: observations per chunk (the loss predicts chunk_length − 1 steps).
    - `method`, `substeps`: as for `rollout` (`"rk4"`, `"rattle"`, `"rattle4"`, `"feedback"`).
    - `gains`: feedback gains for `method="feedback"`; default: `network_gains` of the
      initial network at the chunks' first states (up to 64 of them), kept fixed.
    - `optimizer`: an optax transformation (default `default_optimizer`: AdamW 3·10⁻³,
      weight decay 10⁻⁴, cosine-annealed over the run).
    - `epochs`, `batch_size`: the number of passes over the chunks and chunks per step
      (at most the number of chunks).
    - `loss`: `"mae"` (default) or `"mse"`.
    - `key`: a `jax.random` key for the order of the chunks.
    - `progress`: show a progress bar over epochs with the loss (a string labels it).
    - `start_tol`: for a constrained network, every chunk's first observation must lie
      on its constraint set (as for `rollout`); None skips the check (noisy data).
    - `validation`: held-out trajectories (like `data`, same dt), cut into chunks the same
      way: after every epoch their mean rollout loss is measured, and the model returned
      is the one of the epoch where it was lowest (early stopping on held-out chunks).
    - `patience`: with `validation`, stop after this many epochs without a new lowest
      validation loss (None: run all `epochs`, still returning the best epoch's model).

    Empty data, non-finite observations (named: where), data observed in the other
    convention than the network's, states of another length and a bad dt are errors that
    say so, before anything is compiled.

    **Returns:** `(trained model, history)`, history a dict of numpy arrays with one
    entry per epoch: `"loss"` (the mean minibatch loss, before each step's update),
    `"failed_chunks"` (chunk predictions left out of the loss), `"skipped"` (steps
    skipped for a non-finite loss or gradient) and `"seconds"` (the epoch's wall time);
    and `"compile_seconds"`, the time to compile the epoch. With `validation`, also
    `"validation"` (the held-out loss after each epoch) and `"best_epoch"` (the epoch of the
    model returned, counted from 0).

    Example (a pendulum from four short trajectories, one RK4 step per chunk):

    ```python
    >>> import jax, optax, geomjax
    >>> data = geomjax.chain_trajectories(1, 4, steps=4, key=jax.random.key(0))
    >>> net = geomjax.ConstrainedHamiltonianNetwork(
    ...     2, data.constraints, width_size=4, depth=1, key=jax.random.key(1))
    >>> trained, history = geomjax.train(net, data, chunk_length=2, epochs=30, loss="mse",
    ...                                  optimizer=optax.adam(0.1), key=jax.random.key(2))
    >>> bool(history["loss"][-1] < history["loss"][0] / 10)
    True

    ```
    """
    if loss not in _LOSSES:
        raise ValueError(f"loss must be one of {_LOSSES}, got {loss!r}")
    _check_method(model, method)
    substeps = positive_count(substeps, "substeps")
    epochs = positive_count(epochs, "epochs")
    batch_size = positive_count(batch_size, "batch_size")
    checks.convention(model, data, "train")
    xs, dt = checks.trajectories(data, dt, "train")
    checks.dimension(model, xs, "train")
    chunks = cut_chunks(xs, chunk_length)
    checks.starts_on_constraints(model, chunks[:, 0], start_tol, "train")
    held_out = None
    if validation is not None:
        checks.convention(model, validation, "train (validation)")
        vxs, vdt = checks.trajectories(validation, dt, "train (validation)")
        if vdt != dt:
            raise ValueError(f"train: the validation data are observed every {vdt:g}, the training data every {dt:g}")
        checks.dimension(model, vxs, "train (validation)")
        held_out = cut_chunks(vxs, chunk_length)
        checks.starts_on_constraints(model, held_out[:, 0], start_tol, "train (validation)")
    if patience is not None:
        if held_out is None:
            raise ValueError("train: patience= stops on the loss of held-out chunks: give validation= too")
        patience = positive_count(patience, "patience")
    count = chunks.shape[0]
    batch_size = min(batch_size, count)
    batches = count // batch_size
    if method == "feedback" and gains is None:
        gains = network_gains(model, chunks[: min(count, 64), 0], dt / substeps)
    if optimizer is None:
        optimizer = default_optimizer(epochs * batches)
    params, static = eqx.partition(model, trainable_filter(model))
    opt_state = optimizer.init(params)

    def step(carry, index):
        params, opt_state, chunks = carry
        batch = chunks[index]

        def objective(p, chunks, weights=None):
            return _loss_value(eqx.combine(p, static), chunks, dt, method, substeps, gains, loss, weights, ran=True)

        def without_failed_chunks(ran):
            # A chunk whose prediction is not finite (a RATTLE step whose Newton solve
            # failed, a rollout that blew up) is left out of the loss; one such chunk
            # would otherwise make the whole step's gradient NaN, and the same chunk
            # would stop every later step too. Its NaNs reach the gradient even with
            # weight 0 (0·NaN), so it is replaced by a chunk that ran.
            safe = jnp.where(ran[:, None, None], batch, batch[jnp.argmax(ran)])
            (value, _), grads = jax.value_and_grad(objective, has_aux=True)(params, safe, ran.astype(batch.dtype))
            return value, grads, jnp.sum(~ran).astype(jnp.int32)

        (value, ran), grads = jax.value_and_grad(objective, has_aux=True)(params, batch)
        value, grads, failed = jax.lax.cond(
            jnp.isfinite(value) & _all_finite(grads),
            lambda _: (value, grads, jnp.zeros((), jnp.int32)),
            without_failed_chunks,
            ran,
        )
        finite = jnp.isfinite(value) & _all_finite(grads)  # not when every chunk failed
        grads = jax.tree_util.tree_map(lambda g: jnp.where(finite, g, 0.0), grads)
        updates, new_state = optimizer.update(grads, opt_state, params)
        new_params = eqx.apply_updates(params, updates)
        keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(finite, a, b), new, old)
        return (keep(new_params, params), keep(new_state, opt_state), chunks), (value, ~finite, failed)

    @jax.jit
    def epoch(params, opt_state, chunks, order):
        # the chunks are an argument, not a constant folded into the program
        (params, opt_state, _), (values, skipped, failed) = jax.lax.scan(step, (params, opt_state, chunks), order)
        return params, opt_state, values, skipped, failed

    def order_of(k):
        return jax.random.permutation(k, count)[: batches * batch_size].reshape(batches, batch_size)

    @jax.jit
    def validation_loss(params, chunks):
        return _loss_value(eqx.combine(params, static), chunks, dt, method, substeps, gains, loss)

    keys = jax.random.split(key, epochs)
    start = time.perf_counter()
    compiled = epoch.lower(params, opt_state, chunks, order_of(keys[0])).compile()
    compile_seconds = time.perf_counter() - start
    history = {"loss": [], "skipped": [], "failed_chunks": [], "seconds": []}
    if held_out is not None:
        history["validation"] = []
        best = (math.inf, params, -1)
    bar = _progress_bar(epochs, progress)
    try:
        for i, k in enumerate(keys):
            start = time.perf_counter()
            params, opt_state, values, skipped, failed = compiled(params, opt_state, chunks, order_of(k))
            values = np.asarray(values)
            history["seconds"].append(time.perf_counter() - start)
            finite = values[np.isfinite(values)]
            history["loss"].append(float(finite.mean()) if finite.size else math.nan)
            history["skipped"].append(int(np.sum(np.asarray(skipped))))
            history["failed_chunks"].append(int(np.sum(np.asarray(failed))))
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{history['loss'][-1]:.4g}")
            if held_out is not None:
                held = float(validation_loss(params, held_out))
                history["validation"].append(held)
                if held < best[0]:  # (a NaN loss is never the best)
                    best = (held, params, i)
                elif patience is not None and i - best[2] >= patience:
                    break
    finally:
        if bar is not None:
            bar.close()
    history = {name: np.asarray(values) for name, values in history.items()}
    history["compile_seconds"] = compile_seconds
    if held_out is not None:
        if best[2] >= 0:
            params = best[1]
        else:
            warnings.warn(
                "train: the loss of the validation chunks was not finite after any epoch (predictions that blew "
                "up, or a RATTLE step that failed on them): the model of the last epoch is returned, and "
                "history['best_epoch'] is -1",
                RuntimeWarning,
                stacklevel=2,
            )
        history["best_epoch"] = best[2]
    failed_chunks, skipped_steps = int(history["failed_chunks"].sum()), int(history["skipped"].sum())
    if failed_chunks or skipped_steps:
        cause = "a RATTLE step whose Newton solve did not converge, or a rollout that blew up"
        warnings.warn(
            f"train left {failed_chunks} of {len(history['loss']) * batches * batch_size} chunk predictions out of their minibatch's "
            f"loss because they were not finite ({cause}), and skipped {skipped_steps} of {len(history['loss']) * batches} steps "
            "whose loss or gradient was not finite even so; lower the learning rate, or take substeps",
            RuntimeWarning,
            stacklevel=2,
        )
    return eqx.combine(params, static), history


def _all_finite(tree):
    leaves = [jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree_util.tree_leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def _progress_bar(total: int, progress):
    if not progress:
        return None
    from tqdm.auto import tqdm

    desc = progress if isinstance(progress, str) else "training"
    return tqdm(total=total, desc=desc, unit="epoch", leave=True, file=sys.stderr)


def relative_error(
    predicted: Float[ArrayLike, "... d"], true: Float[ArrayLike, "... d"], denominator: str = "sum"
) -> Float[Array, "..."]:
    """‖x̂ − x‖ / ‖x̂ + x‖ along the last axis: the relative state error of Finzi, Wang and
    Wilson (2020), as their evaluation computes it (the denominator is the norm of the
    sum, which lies between |‖x̂‖ − ‖x‖| and ‖x̂‖ + ‖x‖); with `denominator="norms"`,
    ‖x̂ − x‖ / (‖x̂‖ + ‖x‖), the measure of their published figures.

    Example:

    ```python
    >>> import jax.numpy as jnp, geomjax
    >>> float(geomjax.relative_error(jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0])))
    1.0

    ```
    """
    predicted, true = jnp.asarray(predicted), jnp.asarray(true)
    if denominator not in _DENOMINATORS:
        raise ValueError(f"denominator must be one of {_DENOMINATORS}, got {denominator!r}")
    if denominator == "sum":
        below = jnp.linalg.norm(predicted + true, axis=-1)
    else:
        below = jnp.linalg.norm(predicted, axis=-1) + jnp.linalg.norm(true, axis=-1)
    return jnp.linalg.norm(predicted - true, axis=-1) / below


_DENOMINATORS = ("sum", "norms")
_AGGREGATES = ("geometric", "arithmetic")


def rollout_error(
    model,
    data,
    *,
    dt=None,
    steps: int | None = None,
    method: str = "rk4",
    substeps: int = 1,
    gains=None,
    errors: bool = False,
    start_tol: float | None = checks.START_TOL,
    denominator: str = "sum",
    aggregate: str = "geometric",
):
    """The geometric mean over a rollout of the relative state error, the accuracy
    measure of Finzi, Wang and Wilson (2020).

    Each observed trajectory (x_0, …, x_T) is predicted from x_0 by `rollout`, and

    error = exp( mean over trajectories and t = 1 … T of log(‖x̂_t − x_t‖ / ‖x̂_t + x_t‖) ),

    the error at t = 0 (zero) left out, as their evaluation does; they roll out 100
    observation steps (3 time units at dt = 0.03). The states are the observed ones,
    positions and velocities.

    **Arguments:**

    - `model`: a `ConstrainedHamiltonianNetwork` or a `NeuralODE`.
    - `data`: `geomjax.Trajectories` or an array of trajectories `(B, T + 1, 2n)` with `dt=`.
    - `steps`: compare the first `steps` steps only (default: all).
    - `method`, `substeps`, `gains`: the rollouts' integration, as for `rollout`
      (feedback gains default to `network_gains` at the trajectories' starts).
    - `errors`: also return the relative errors themselves, `(B, steps + 1)`.
    - `start_tol`: the start check of `rollout`, on every trajectory's first observation.
    - `denominator`: `"sum"` (‖x̂ + x‖, their evaluation code, the default) or `"norms"`
      (‖x̂‖ + ‖x‖, their published figures); see `relative_error`.
    - `aggregate`: each trajectory's errors are averaged geometrically over t = 1 … T;
      then `"geometric"` (the default: the geometric mean over trajectories too, the
      formula above) or `"arithmetic"` (the arithmetic mean of the trajectories'
      geometric means, as their figures average trajectories).

    **Returns:** the geometric mean (a float), or `(mean, errors)` with `errors=True`.

    Example:

    ```python
    >>> import jax, geomjax
    >>> data = geomjax.chain_trajectories(1, 4, steps=4, key=jax.random.key(0))
    >>> net = geomjax.ConstrainedHamiltonianNetwork(
    ...     2, data.constraints, width_size=4, depth=1, key=jax.random.key(1))
    >>> 0 < geomjax.rollout_error(net, data) < 1
    True

    ```
    """
    checks.convention(model, data, "rollout_error")
    xs, dt = checks.trajectories(data, dt, "rollout_error")
    checks.dimension(model, xs, "rollout_error")
    checks.starts_on_constraints(model, xs[:, 0], start_tol, "rollout_error")
    steps = xs.shape[1] - 1 if steps is None else min(positive_count(steps), xs.shape[1] - 1)
    xs = xs[:, : steps + 1]
    _check_method(model, method)
    substeps = positive_count(substeps, "substeps")
    if method == "feedback" and gains is None:
        gains = network_gains(model, xs[:, 0], dt / substeps)
    predicted = _predicted(model, xs, dt, method, substeps, gains)
    if aggregate not in _AGGREGATES:
        raise ValueError(f"aggregate must be one of {_AGGREGATES}, got {aggregate!r}")
    rel = np.asarray(relative_error(predicted, xs, denominator))
    per_trajectory = np.exp(np.mean(np.log(rel[:, 1:]), axis=1))
    mean = float(np.exp(np.mean(np.log(per_trajectory))) if aggregate == "geometric" else np.mean(per_trajectory))
    return (mean, rel) if errors else mean


@eqx.filter_jit
def _predicted(model, xs, dt, method, substeps, gains):
    return _predict_chunks(model, xs, dt, method, substeps, gains)
