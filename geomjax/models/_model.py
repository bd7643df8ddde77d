"""A reference problem: a system with parameters, an initial state and known solutions."""

import dataclasses
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._system.system import System
from .._validate import host_array, is_concrete


def model_params(**values) -> dict:
    """The parameters of a model as float64 scalars.

    Concrete values are converted on the host: each `jnp` operation on them would be a
    compiled call, and in a fresh process every first compilation costs milliseconds of
    the time to the first result. Traced values (a model built inside `jit`, `vmap` or
    `grad`) stay traced.
    """
    return {
        k: host_array(v) if is_concrete(v) else jnp.asarray(v, jnp.float64)
        for k, v in values.items()
    }


def flat_state(*pieces) -> jax.Array:
    """The flat float64 state made of `pieces` (scalars or vectors), on the host when every
    piece is concrete (see `model_params`)."""
    if all(is_concrete(p) for p in pieces):
        return host_array(np.concatenate([np.asarray(p, np.float64).reshape(-1) for p in pieces]))
    return jnp.concatenate([jnp.asarray(p, jnp.float64).reshape(-1) for p in pieces])


class Model(eqx.Module):
    """A ready-made system from the papers.

    **Fields:**

    - `name`: short identifier.
    - `system`: the `geomjax.System` (parameters are leaves inside its functions).
    - `params`: the parameter values, a dict of float64 scalars.
    - `x0`: the default initial flat state.
    - `quantity_names`: names of the entries of F = (f, H, integrals), in order. The
      model's `System` carries them (`System(..., names=...)`), so a run that fails names
      the quantity that left its tolerance with them.
    - `exact`: `t ↦ x(t)` from `x0`, where a closed form is known, else `None`.
    """

    name: str = eqx.field(static=True)
    system: System
    params: dict
    x0: jax.Array
    quantity_names: tuple = eqx.field(static=True)
    exact: Callable | None = None

    def __post_init__(self):
        if isinstance(self.system, System) and not self.system.names:
            self.system = dataclasses.replace(self.system, names=tuple(self.quantity_names))
