"""What `geomjax.sweep(layout="auto", unroll="auto")` picks, per platform and per step.

The choice follows what `benchmarks/sweep_throughput.py` measured (README, "Sweeps on a
GPU"; H100, JAX 0.11.2, float64, B = 2²⁰, the driver's per-step finite mark included):

- **CPU**: batch-major, one step per loop iteration, for every step: the fastest layout
  there, and the one `jax.vmap` of `geomjax.integrate` uses.
- **GPU**: what the loop carries decides the speed. One (B,) array per scalar of the
  state (the component layout, `Rows`) ran the spherical-pendulum feedback Euler at
  1.05e11 trajectory-steps/s with 8 steps per iteration, 4× its speed with 1 and 11× that
  of (3, B) pieces. How many steps per iteration pay depends on the step's cost:

  - a cheap step (one evaluation of a small field, `_CHEAP` operations or fewer, such as
    Euler on the pendulum's 102): 8 steps per iteration;
  - a step of a few evaluations (up to `_MEDIUM` operations, such as Heun): 4;
  - a costlier step (RK4: 2.4e10 with 1 and with 4 steps per iteration, two thirds of
    that with 8), and every step with a solve (RATTLE, implicit Runge–Kutta, Dirac
    steps: their Newton loop is not unrolled): 1;
  - a step with float64 transcendental functions (`sin`, `cos`, `exp`, ...) is bound
    by their cost, not by memory: the knife edge's feedback Euler (73 operations with a
    `sin` and a `cos`) ran at 8.4e9 on rows with 1 step per iteration and slower with
    more (3.2e9 with 8), and fastest carried as (3, B) pieces with 8 (1.1e10): that is
    what it gets (`"component-pieces"`).

The step's cost is read off the jaxpr of one member's step (`step_profile`): the number
of operations, nested calls included, and whether any is transcendental.
"""

from collections.abc import Iterable

import jax
from jax.extend.core import ClosedJaxpr, Jaxpr

#: Operations per step at most for 8 and for 4 steps per loop iteration on a GPU.
_CHEAP = 150
_MEDIUM = 300
#: float64 operations evaluated by a library routine on a GPU (range reduction and a
#: polynomial, tens of instructions each), which make a step compute-bound.
TRANSCENDENTAL = frozenset(
    {"sin", "cos", "tan", "exp", "exp2", "log", "log1p", "expm1", "pow", "atan2", "asin", "acos", "atan",
     "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "logistic", "erf", "erfc", "lgamma", "digamma", "cbrt"}
)
# Bookkeeping that costs nothing at run time: not counted (nor are calls: their bodies are).
_FREE = frozenset({"convert_element_type", "reshape", "squeeze", "broadcast_in_dim", "copy", "copy_p",
                   "stop_gradient", "optimization_barrier"})


def _sub_jaxprs(params) -> Iterable[Jaxpr]:
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, Jaxpr):
                yield item


def _count(jaxpr: Jaxpr, found: dict) -> None:
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        subs = list(_sub_jaxprs(eqn.params))
        if name in ("while", "scan", "cond"):
            found["loops"] += 1
        if name not in _FREE and not subs:
            found["operations"] += 1
        if name in TRANSCENDENTAL:
            found["transcendental"] += 1
        for sub in subs:
            _count(sub, found)


def step_profile(fn, *args) -> dict:
    """`{"operations", "transcendental", "loops"}` of `fn(*args)` (abstract values are
    enough): operations counted once however they are nested in calls, bodies of loops
    and branches included once.

    Example:

    ```python
    >>> import jax.numpy as jnp
    >>> step_profile(lambda x: jnp.sin(x) * x + 1.0, jnp.ones(3))
    {'operations': 3, 'transcendental': 1, 'loops': 0}

    ```
    """
    found = {"operations": 0, "transcendental": 0, "loops": 0}
    _count(jax.make_jaxpr(fn)(*args).jaxpr, found)
    return found


def auto_loop(platform: str, constant_status: bool, profile: dict | None, layout: str = "auto") -> tuple[str, int]:
    """`(layout, unroll)` for a sweep on `platform` (`"cpu"` or `"gpu"`) of a step whose
    status is a constant (no solve) or not, and whose one-member `step_profile` is
    `profile` (not read on the CPU); `layout` as given (`"auto"`: chosen too). The module docstring says which
    measurement each case rests on.

    Example:

    ```python
    >>> auto_loop("gpu", True, {"operations": 102, "transcendental": 0, "loops": 0})
    ('component', 8)
    >>> auto_loop("gpu", True, {"operations": 73, "transcendental": 2, "loops": 0})
    ('component-pieces', 8)
    >>> auto_loop("gpu", True, {"operations": 73, "transcendental": 2, "loops": 0}, "component")
    ('component', 1)
    >>> auto_loop("cpu", True, {"operations": 102, "transcendental": 0, "loops": 0})
    ('batch', 1)

    ```
    """
    if platform == "cpu":
        return ("batch" if layout == "auto" else layout), 1
    solves = not constant_status or profile["loops"] > 0
    if layout == "auto":
        layout = "component-pieces" if profile["transcendental"] and not solves else "component"
    if layout == "batch" or solves:
        return layout, 1
    if layout == "component-pieces":
        return layout, 8
    if profile["transcendental"]:
        return layout, 1
    if profile["operations"] <= _CHEAP:
        return layout, 8
    return layout, (4 if profile["operations"] <= _MEDIUM else 1)
