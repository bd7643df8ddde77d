"""What `geomjax.sweep(layout="auto", unroll="auto")` picks, per platform and per step.

The choice follows what `benchmarks/sweep_throughput.py` measured (docs/performance.md, "Sweeps on a
GPU"; H100, JAX 0.11.2, float64, B = 10⁶, the driver's per-step finite mark included;
`benchmarks/sweep_throughput_gpu_results.txt`):

- **CPU**: batch-major, one step per loop iteration, for every step: the fastest layout
  there, and the one `jax.vmap` of `geomjax.integrate` uses.
- **GPU**: the component layout (`Rows`: one (B,) array per scalar of the state, each
  member's step one scalar graph under `vmap`) for every step. It ran the
  spherical-pendulum feedback Euler at 5.9e10 trajectory-steps/s with 8 steps per loop
  iteration (1.7e10 with 1), 8× the (3, B) pieces layout and 10× `vmap` of
  `geomjax.integrate`. How many steps per iteration pay depends on the step's cost:

  - a cheap step (one evaluation of a small field, `_CHEAP` operations or fewer: Euler
    on the pendulum's feedback field, 108; on the knife edge's, 81 with a `sin` and a
    `cos`, 2.3e10 with 8 against 1.6e10 with 1): 8 steps per iteration;
  - a step of a few evaluations (up to `_MEDIUM` operations, such as Heun, 221): 4;
  - a costlier step (RK4, 447: 1.4e10 with 1, half that with 8), and every step with a
    solve (RATTLE: 5.0e9 with 1, 4.8e9 with 8; implicit Runge–Kutta, Dirac steps: their
    Newton loop is not unrolled): 1.

The step's cost is read off the jaxpr of one member's step (`step_profile`): the number
of operations (a custom derivative's primal body only, loop and branch bodies once),
and how many are transcendental.
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
    if "call_jaxpr" in params:  # a custom derivative (or a call): what runs is its body
        params = {"call_jaxpr": params["call_jaxpr"]}
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
    >>> auto_loop("gpu", True, {"operations": 447, "transcendental": 0, "loops": 0})
    ('component', 1)
    >>> auto_loop("gpu", False, {"operations": 90, "transcendental": 0, "loops": 1}, "component-pieces")
    ('component-pieces', 1)
    >>> auto_loop("cpu", True, {"operations": 102, "transcendental": 0, "loops": 0})
    ('batch', 1)

    ```
    """
    if platform == "cpu":
        return ("batch" if layout == "auto" else layout), 1
    solves = not constant_status or profile["loops"] > 0
    if layout == "auto":
        layout = "component"
    if layout == "batch" or solves:
        return layout, 1
    if profile["operations"] <= _CHEAP:
        return layout, 8
    return layout, (4 if profile["operations"] <= _MEDIUM else 1)
