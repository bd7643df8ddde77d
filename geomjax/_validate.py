"""Input checks that turn bad input into errors that say what is wrong and where."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


# --- what is known now, and what is traced ----------------------------------------------
# Three questions, one function each:
# - `known(x)`: the value of x if it is known now (NumPy), else None. Every check and every
#   host-side decision or message that reads a value reads it through `known` (or `check`,
#   built on it); nothing catches JAX's tracer-conversion errors to find out.
# - `is_traced(x)` / `is_concrete(tree)`: whether a value is a tracer, which must stay one
#   (it may carry derivatives or a batch axis even where its primal is known): for
#   converting inputs on the host only when they are plain values, and for hoisting
#   closed-over tracers out of traced functions.
# - `at_top_level()`: whether any transformation is tracing now: for cross-call caches,
#   which must not keep objects built inside a trace.
# The one place geomjax reads JAX's private API (`jax._src.core`): whether a traced value
# is known now, and whether any transformation is tracing. Both are resolved at import;
# `tests/test_known.py` fails loudly if a JAX release moves them (geomjax then counts
# every value as traced, which is safe but slow, and warns once here).
try:
    from jax._src.core import to_concrete_value as _to_concrete_value, trace_ctx as _trace_ctx
except ImportError:  # pragma: no cover - a JAX release without them
    import warnings as _warnings

    _to_concrete_value = _trace_ctx = None
    _warnings.warn(
        "geomjax: this JAX has no jax._src.core.to_concrete_value / trace_ctx; values under "
        "transformations count as traced (checks move into the compiled runs)",
        RuntimeWarning,
        stacklevel=2,
    )


def is_traced(value) -> bool:
    """True when `value` (one leaf) is a tracer of a JAX transformation."""
    return isinstance(value, jax.core.Tracer)


def is_concrete(x) -> bool:
    """True when `x` (a pytree) holds values: no leaf is a tracer inside jit/vmap/grad."""
    return not any(is_traced(leaf) for leaf in jax.tree_util.tree_leaves(x))


def at_top_level() -> bool:
    """Whether no JAX transformation is tracing now (values computed now are concrete)."""
    return _trace_ctx is not None and bool(_trace_ctx.is_top_level())


def known(x) -> np.ndarray | None:
    """The value of the array `x` as a NumPy array when it is known now, else None.

    Known: concrete arrays, and the tracers of transformations that evaluate as they go
    (`jax.grad`, `jax.jvp`, `jax.jacfwd` outside `jit`), whose primal values are concrete.
    Unknown: values traced by `jax.jit` or batched by `jax.vmap`, including values a
    function computes from a parameter it closes over. Checks read values through this
    function, never through `np.asarray` of a tracer.

    Example:

    ```python
    >>> import jax, jax.numpy as jnp
    >>> from geomjax._validate import known
    >>> float(known(jnp.array(2.0)))
    2.0
    >>> jax.grad(lambda a: (print(known(a * 3.0)), a)[1])(1.0)   # under eager grad: known
    3.0
    Array(1., dtype=float64, weak_type=True)
    >>> _ = jax.jit(lambda a: print(known(a * 3.0)))(1.0)       # under jit: not yet
    None

    ```
    """
    if not is_traced(x):
        return np.asarray(x)
    if _to_concrete_value is None:
        return None
    # JAX's own test for "is this traced value known now" (what `bool(tracer)` uses);
    # None where it is not.
    value = _to_concrete_value(x)
    return None if value is None else np.asarray(value)


def known_tree(tree):
    """`tree` (a pytree of arrays) with every leaf `known` (NumPy arrays), or None where a
    leaf is not known now: the host-side checks that need several derived values at once
    (a start check reading residuals, a Gram matrix and its singular values) read them
    through this, and leave the check to the run where it gives None."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    values = [known(leaf) for leaf in leaves]
    return None if any(v is None for v in values) else jax.tree_util.tree_unflatten(treedef, values)


def check(values, bad, message: str, error: type[Exception] = ValueError, *, detail=None, guard=None, status=False):
    """The one mechanism of geomjax's value checks (as diffrax checks `dt0`).

    `values`: an array, a tuple of arrays, or a callable returning them, called under
    `jax.ensure_compile_time_eval()` (so what it computes from values known now is known
    now, even inside an enclosing `jit`). `bad(xp, *values)` returns a boolean (array),
    true where the input is bad, written with the array module `xp`: NumPy on the host
    where every value is `known` (no JAX dispatch, so no compilation in a fresh process),
    `jax.numpy` otherwise. Then:

    - the values are known and bad somewhere: raises `error(message + detail(*values))`
      now (`detail`, optional, formats the offending values);
    - they are known and good: returns `guard`;
    - they are not known (traced): with `guard` given, returns
      `equinox.error_if(guard, predicate, message)`, raised when the compiled program
      runs; with `status=True`, returns the traced predicate for the caller's run status;
      otherwise returns None and leaves the check to the run.

    Example:

    ```python
    >>> import jax, jax.numpy as jnp
    >>> from geomjax._validate import check
    >>> positive = lambda x: check(x, lambda xp, v: v <= 0, "x must be positive", guard=x)
    >>> positive(jnp.array([1.0, -2.0]))
    Traceback (most recent call last):
    ...
    ValueError: x must be positive
    >>> jax.jit(positive)(jnp.array([1.0, 2.0])).tolist()   # checked when the program runs
    [1.0, 2.0]

    ```
    """
    if callable(values):
        with jax.ensure_compile_time_eval():
            values = values()
    leaves = values if isinstance(values, tuple) else (values,)
    known_values = tuple(known(v) for v in leaves)
    if any(v is None for v in known_values):
        if guard is None and not status:
            return None
        with jax.ensure_compile_time_eval():
            predicate = jnp.any(bad(jnp, *leaves))
        return predicate if guard is None else eqx.error_if(guard, predicate, message)
    if np.any(bad(np, *known_values)):
        raise error(message + ("" if detail is None else detail(*known_values)))
    return guard


def host_array(value) -> jax.Array:
    """A concrete value as a float64 jax array, converted on the host.

    `jnp.asarray` of a NumPy array is a compiled call (`stage`); in a fresh process each
    first compilation costs milliseconds of the time to the first result.
    """
    return jax.device_put(np.asarray(value, np.float64))


def as_state(x0, dim: int | None, name: str = "x0"):
    """Convert `x0` to a float64 state vector, raising clear errors for bad input.

    Checks: one-dimensional, the expected length, floating dtype of 64 bits (float32 loses
    the invariants geomjax preserves), and all entries finite (when concrete).
    """
    if isinstance(x0, (list, tuple)) or np.isscalar(x0):
        x0 = jnp.asarray(x0, dtype=jnp.float64)
    dtype = getattr(x0, "dtype", None)
    if dtype is None:
        raise TypeError(f"{name} must be an array, got {type(x0).__name__}")
    if jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_):
        x0 = jnp.asarray(x0, dtype=jnp.float64)
    elif dtype != jnp.float64:
        raise TypeError(
            f"{name} has dtype {dtype}; geomjax needs float64 states (float32 round-off "
            "destroys the invariants it preserves). geomjax enables jax_enable_x64 on import: "
            f"pass {name} as a float64 array, e.g. jnp.asarray({name}, dtype=jnp.float64)"
        )
    if x0.ndim != 1:
        raise ValueError(f"{name} must be a flat state vector (one dimension), got shape {tuple(x0.shape)}")
    if dim is not None and x0.shape[0] != dim:
        raise ValueError(f"{name} has length {x0.shape[0]}, but the system's state has length {dim}")
    check(
        x0,
        lambda xp, v: ~xp.isfinite(v),
        f"{name} has non-finite entries (NaN or inf)",
        detail=lambda v: f" at indices {np.flatnonzero(~np.isfinite(v)).tolist()}",
    )
    return x0


def _described(value) -> str:
    """`value` as an error message names it: its kind and, where short, the value."""
    if isinstance(value, (str, bytes)):
        return f"the string {value!r}"
    if isinstance(value, (bool, np.bool_)):
        return f"the bool {value!r}"
    if isinstance(value, (complex, np.complexfloating)):
        return f"the complex number {value!r}"
    if value is None:
        return "None"
    dtype = getattr(value, "dtype", None)
    if dtype is not None:
        shape = tuple(getattr(value, "shape", ()))
        return f"an array of dtype {dtype}" + (f" and shape {shape}" if shape else "")
    return f"a {type(value).__name__}"


def check_real(value, name: str, expected: str = "a real number") -> None:
    """Raise a TypeError, naming `name`, unless `value` is a real number (a Python or NumPy
    int or float, or an integer or floating array or tracer); strings, bools, complex
    numbers and other objects are rejected before they reach JAX (whose own errors for
    them do not name the argument)."""
    dtype = getattr(value, "dtype", None)
    if dtype is None and isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_)):
        return
    if dtype is not None and not isinstance(value, (str, bytes)):
        if jnp.issubdtype(dtype, jnp.complexfloating):
            raise TypeError(
                f"{name} must be {expected}, got {_described(value)}: geomjax steps in real time; "
                f"pass the real part ({name}.real) if the imaginary part is zero"
            )
        if jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating):
            return
    hint = ""
    if isinstance(value, (str, bytes)):
        try:
            hint = f"; pass a number, not text: {name}={float(value)!r}"
        except ValueError:
            hint = "; pass a number, not text"
    elif isinstance(value, complex):
        hint = f": geomjax steps in real time; pass the real part ({name}.real) if the imaginary part is zero"
    raise TypeError(f"{name} must be {expected}, got {_described(value)}{hint}")


def check_tolerance(value, name: str, *, zero_ok: bool, none_means: str) -> None:
    """Raise a clear error unless `value` is None or a real number > 0 (≥ 0 with
    `zero_ok`); a traced value is let through. `none_means` says what None does."""
    if value is None:
        return
    expected = f"a {'non-negative' if zero_ok else 'positive'} number (or None {none_means})"
    check_real(value, name, expected)
    check(
        value,
        lambda xp, v: (np.shape(v) != ()) | ~((v >= 0) if zero_ok else (v > 0)),
        f"{name} must be {expected}",
        detail=lambda v: f", got {value!r}",
    )


def check_time(t0, name: str = "t0") -> None:
    """Raise a clear error unless `t0` is a real scalar, finite where it is known."""
    check_real(t0, name, "a finite real number (the initial time)")
    if np.shape(t0) != ():
        raise ValueError(f"{name} must be a scalar (the initial time), got shape {np.shape(t0)}")
    check(
        t0,
        lambda xp, v: ~xp.isfinite(v),
        f"{name} must be a finite real number (the initial time)",
        detail=lambda v: (
            f", got {float(v)!r}: every save time would be non-finite, and a time-dependent "
            "field would be evaluated there"
        ),
    )


def check_run_options(t0, drift_tol, start_tol) -> None:
    """The checks of `integrate`'s and `sweep`'s options other than dt and steps."""
    check_time(t0)
    check_tolerance(drift_tol, "drift_tol", zero_ok=False, none_means="to monitor nothing")
    check_tolerance(start_tol, "start_tol", zero_ok=True, none_means="to start off the constraint set on purpose")


def check_call_args(target, x0, args) -> None:
    """Let a field or step check, before the run, that it can be called with the run's
    `args` (its `check_args(x0, args)`, where it has one: `geomjax.TimeField`)."""
    hook = getattr(target, "check_args", None)
    if hook is not None:
        hook(x0, args)


def check_step_size(dt, name: str = "dt") -> None:
    """Raise a clear error unless `dt` is a positive finite real scalar (where it is
    known; a traced one is left to the run's status)."""
    check_real(dt, name, "a positive finite scalar")

    def shown(d):
        if isinstance(dt, (int, float, np.number)):
            return f", got {dt!r}"
        return f", got {float(d)!r}" if np.shape(d) == () else f", got an array of shape {np.shape(d)}"

    check(
        dt,
        lambda xp, d: (np.shape(d) != ()) | ~xp.isfinite(d) | (d <= 0),
        f"{name} must be a positive finite scalar",
        detail=shown,
    )


#: The most steps a run may take: its step counter is an int64.
MAX_STEPS = 2**62


def check_positive_step(dt, steps, save_every):
    check_step_size(dt)
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if isinstance(save_every, bool) or not isinstance(save_every, (int, np.integer)) or save_every < 1:
        raise ValueError(f"save_every must be a positive integer, got {save_every!r}")
    for name, value in (("steps", steps), ("save_every", save_every)):
        if value > MAX_STEPS:
            raise ValueError(f"{name} must be at most 2**62 (the step counter is an int64), got {value!r}")
    if steps % save_every:
        raise ValueError(f"steps ({steps}) must be a multiple of save_every ({save_every})")


def require_invertible(matrix, what: str, reason: str, where: str = "at x0") -> None:
    """Raise a ValueError if the (concrete) `matrix` is non-finite or numerically singular.

    `what` names the matrix in the message (e.g. "the constraint matrix C_ij = {f_i, f_j}"),
    `reason` says what singularity means for the user's system and `where` where it was
    evaluated. A traced matrix (parameters under jit/vmap/grad) cannot be checked eagerly
    and is let through.
    """
    check(
        matrix,
        lambda xp, c: ~xp.all(xp.isfinite(c)),
        f"{what} is not finite {where}: the functions or their gradients give NaN/inf there",
    )

    def singular(xp, c):
        if c.size == 0:
            return False
        sv = xp.linalg.svd(c, compute_uv=False)
        return (sv[0] == 0.0) | (sv[-1] <= 1e-12 * xp.maximum(sv[0], 1.0))

    check(
        matrix,
        singular,
        f"{what} is singular {where}",
        detail=lambda c: f" (singular values {np.array2string(np.linalg.svd(c, compute_uv=False), precision=3)}): {reason}",
    )


#: The hint for user functions that cannot be traced by JAX.
TRACE_HINT = (
    "user functions must be written with jax.numpy and without Python control flow on "
    "state values; use jnp.where / lax.cond"
)

_TRACE_ERRORS = (
    jax.errors.ConcretizationTypeError,  # includes TracerBoolConversionError (`if x[0] > 0:`)
    jax.errors.TracerArrayConversionError,  # np.sin(x), np.asarray(x)
    jax.errors.TracerIntegerConversionError,  # range(x[0]), a list indexed by a traced value
)


def untraceable_message(what: str, err: BaseException) -> str:
    """A message for a user function that JAX cannot trace, naming the likely cause."""
    if isinstance(err, jax.errors.TracerArrayConversionError):
        cause = (
            f"{what} converts a traced JAX array to a NumPy array (a NumPy function such as "
            "np.sin, or np.asarray, applied to the state)"
        )
    elif isinstance(err, jax.errors.TracerIntegerConversionError):
        cause = f"{what} uses a value that depends on the state as a Python integer (an index, range(...))"
    else:
        cause = (
            f"{what} uses Python control flow (if, while, and/or, bool(), float()) on a value "
            "that depends on the state"
        )
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"{cause}: {TRACE_HINT}. (JAX: {first})"


def trace_user_function(fn, spec, what: str):
    """`jax.eval_shape(fn, spec)`, turning JAX's tracer errors into a TypeError that says
    what is wrong with the user function `what` and how to fix it."""
    try:
        # Through a fresh function: `jax.eval_shape` caches on the function it is given,
        # and looking up a bound method of a module whose leaves are tracers compares
        # the tracers (a TracerBoolConversionError under `jit(grad)`).
        return jax.eval_shape(lambda a: fn(a), spec)
    except _TRACE_ERRORS as err:
        raise TypeError(untraceable_message(what, err)) from err


def positive_count(value, name: str = "steps") -> int:
    """`value` as an int, or a ValueError naming `name` unless it is a positive integer."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)
