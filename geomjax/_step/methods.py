"""Named one-step methods accepted by `geomjax.integrate(..., method=NAME)`."""

from collections.abc import Callable

from .runge_kutta import EULER, HEUN, KUTTA3, MIDPOINT, RK4, explicit_rk

# name -> (builder field ↦ step, classical order)
_METHODS: dict[str, tuple[Callable, int]] = {
    "euler": (lambda f: explicit_rk(f, EULER), 1),
    "heun": (lambda f: explicit_rk(f, HEUN), 2),
    "midpoint": (lambda f: explicit_rk(f, MIDPOINT), 2),
    "rk3": (lambda f: explicit_rk(f, KUTTA3), 3),
    "rk4": (lambda f: explicit_rk(f, RK4), 4),
}


def register_method(name: str, builder: Callable, order: int) -> None:
    """Make `method=name` available in `geomjax.integrate`.

    **Arguments:**

    - `name`: the method's name.
    - `builder`: callable `field ↦ step` (a `geomjax.AbstractStep`).
    - `order`: its classical order (used by `method_order` and the convergence tests).

    Example:

    ```python
    >>> import jax.numpy as jnp, geomjax
    >>> ralston = geomjax.ButcherTableau(a=((), (2 / 3,)), b=(0.25, 0.75), order=2)
    >>> geomjax.register_method("ralston", lambda f: geomjax.explicit_rk(f, ralston), 2)
    >>> sol = geomjax.integrate(lambda x: -x, jnp.array([1.0]), dt=0.01, steps=100, method="ralston")
    >>> round(float(sol.xs[-1, 0]), 4)    # e⁻¹ = 0.36788 to O(h²)
    0.3679

    ```
    """
    _METHODS[name] = (builder, order)


def method_names() -> list[str]:
    """The names accepted by `geomjax.integrate(..., method=NAME)`.

    Example:

    ```python
    >>> import geomjax
    >>> {"euler", "rk4", "gauss4"} <= set(geomjax.method_names())
    True

    ```
    """
    return sorted(_METHODS)


def method_order(name: str) -> int:
    """Classical order of the named method.

    Example:

    ```python
    >>> import geomjax
    >>> geomjax.method_order("gauss4")
    4

    ```
    """
    return _METHODS[name][1]


def method_builder(name: str) -> Callable | None:
    """The builder `field ↦ step` registered for `name` (None if there is none)."""
    entry = _METHODS.get(name)
    return None if entry is None else entry[0]


def build_step(name: str, field):
    if name not in _METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {method_names()} or pass a diffrax solver")
    return _METHODS[name][0](field)
