"""Checks at the boundary of the learning functions (`train`, `rollout`, `rollout_error`):
the data's shape and values, the step, the observation convention and the starts.

Each check runs where its values are known (outside `jit`) and raises an error that says
what is wrong, where, and what to do; under a transformation the values are traced and
the check is left to the caller's run (a NaN start gives NaN predictions, never a number).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._validate import check_step_size, known
from ..models._trajectories import Trajectories
from .networks import ConstrainedHamiltonianNetwork, NeuralODE

#: Default tolerance of the start check: the largest constraint residual of an observed
#: start, |g(q)| and |G(q)·∂H/∂p|, relative to 1 + max|x|. Looser than `integrate`'s
#: (1e−8): observed data carry the error of whatever produced them.
START_TOL = 1e-6


def state_dim(model) -> int:
    """The length of the model's observed state."""
    return model.dim if isinstance(model, NeuralODE) else 2 * model.n


def step_size(dt, what: str):
    """`dt` checked: a positive finite scalar where it is known."""
    try:
        check_step_size(dt)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{what}: {err} (the observation interval)") from None
    return dt


def one_state(model, x0, what: str):
    """`x0` as one observed state of `model`, shape (2n,): a batch of starts is refused
    with the `vmap` that runs it, a wrong length with both lengths."""
    x0 = jnp.asarray(x0)
    dim = state_dim(model)
    if x0.ndim == 2 and x0.shape[-1] == dim:
        raise ValueError(
            f"{what} takes one state x0 of shape ({dim},), got a batch of shape {tuple(x0.shape)}: run a batch with "
            f"jax.vmap(lambda x: geomjax.rollout(model, x, steps, dt))(x0s)"
        )
    if x0.shape != (dim,):
        raise ValueError(f"{what}: x0 must be one observed state of shape ({dim},) (the model's), got {tuple(x0.shape)}")
    return x0


def trajectories(data, dt, what: str, least: int = 2):
    """`(xs, dt)` of `data` (`Trajectories` or an array (B, T, 2n) with `dt`), checked:
    at least one trajectory of at least `least` observations, every observation finite
    (the first non-finite ones are named: a NaN would make every loss it enters NaN)."""
    if isinstance(data, Trajectories):
        xs, dt = data.xs, (data.dt if dt is None else dt)
    else:
        if dt is None:
            raise TypeError(f"{what} needs dt= (the observation interval) when the data are an array of trajectories")
        xs = jnp.asarray(data, jnp.float64)
    if xs.ndim != 3:
        raise ValueError(f"{what}: the data must be trajectories of shape (B, T, 2n), got shape {tuple(xs.shape)}")
    if xs.shape[0] == 0 or xs.shape[1] < least:
        raise ValueError(
            f"{what}: the data hold {xs.shape[0]} trajectories of {xs.shape[1]} observations; at least one trajectory "
            f"of at least {least} observations is needed"
        )
    step_size(dt, what)
    values = known(xs)
    if values is not None and not np.all(np.isfinite(values)):
        bad = np.argwhere(~np.isfinite(values))
        shown = ", ".join(f"trajectory {b}, observation {t}, entry {i}" for b, t, i in bad[:3].tolist())
        raise ValueError(
            f"{what}: the data hold {len(bad)} non-finite observations (NaN or inf), the first at {shown}: a "
            "non-finite observation makes every loss it enters non-finite. Drop those trajectories (or cut them "
            "before the gap) and pass the rest"
        )
    return xs, dt


def convention(model, data, what: str) -> None:
    """`Trajectories` observed one way (velocities or momenta) for a network that expects
    the other are refused: both declare their convention."""
    if isinstance(data, Trajectories) and isinstance(model, ConstrainedHamiltonianNetwork):
        if data.observed != model.observed:
            raise ValueError(
                f"{what}: the data are observed as {data.observed} (q, {'v' if data.observed == 'velocity' else 'p'}), "
                f"the network expects observed={model.observed!r}: build the network with "
                f"observed={data.observed!r}, or generate the data with observed={model.observed!r}"
            )


def dimension(model, xs, what: str) -> None:
    if xs.shape[-1] != state_dim(model):
        raise ValueError(
            f"{what}: the data's states have {xs.shape[-1]} entries, the model's {state_dim(model)} "
            f"({'2n for n = ' + str(model.n) if isinstance(model, ConstrainedHamiltonianNetwork) else 'its dim'})"
        )


def starts_on_constraints(model, starts, start_tol, what: str) -> None:
    """For a constrained network: every observed start (B, 2n) on its constraint set,
    |g(q)| and |G(q)·∂H/∂p| at most `start_tol`·(1 + max|x|), or a ValueError naming the
    worst start, its residual and the opt-out (`start_tol=None`, for noisy data). A
    constraint function written for another dimension (its indices clamped by JAX) shows
    here too."""
    if start_tol is None or not isinstance(model, ConstrainedHamiltonianNetwork):
        return
    starts = jnp.atleast_2d(jnp.asarray(starts))
    residual = known(_start_residuals(model, starts))
    if residual is None:
        return
    scale = 1.0 + np.max(np.abs(np.nan_to_num(np.asarray(known(starts)))), axis=1)
    ratio = residual / scale
    worst = int(np.argmax(ratio))
    if not ratio[worst] <= start_tol:
        raise ValueError(
            f"{what}: start {worst} is off the model's constraint set: its largest residual (|g(q)| or "
            f"|G(q)·∂H/∂p|) is {residual[worst]:.3g}, above start_tol·(1 + max|x|) = {start_tol * scale[worst]:.3g}. "
            "A prediction from it would be of another system (RK4 keeps the offset, RATTLE jumps onto the set at "
            "the first step). Check that the constraints are written for this state (n = "
            f"{model.n}) and the data's units; for noisy observations pass start_tol=None (or a larger tolerance)"
        )


@eqx.filter_jit
def _start_residuals(model, starts):
    def one(x):
        canonical = model.to_canonical(x)
        n = model.n
        q, p = canonical[:n], canonical[n:]
        velocity = jax.grad(lambda pp: model.hamiltonian(jnp.concatenate([q, pp])))(p)
        g, hidden = jax.jvp(lambda qq: jnp.atleast_1d(model.constraints(qq)), (q,), (velocity,))
        return jnp.maximum(jnp.max(jnp.abs(g)), jnp.max(jnp.abs(hidden)))

    return jax.vmap(one)(starts)
