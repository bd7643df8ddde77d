"""A reference problem: a system with parameters, an initial state and known solutions."""

from collections.abc import Callable

import equinox as eqx
import jax

from .._system.system import System


class Model(eqx.Module):
    """A ready-made system from the papers.

    **Fields:**

    - `name`: short identifier.
    - `system`: the `geomjax.System` (parameters are leaves inside its functions).
    - `params`: the parameter values, a dict of float64 scalars.
    - `x0`: the default initial flat state.
    - `quantity_names`: names of the entries of F = (f, H, integrals), in order.
    - `exact`: `t ↦ x(t)` from `x0`, where a closed form is known, else `None`.
    """

    name: str = eqx.field(static=True)
    system: System
    params: dict
    x0: jax.Array
    quantity_names: tuple = eqx.field(static=True)
    exact: Callable | None = None
