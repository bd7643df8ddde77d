"""Input checks that turn bad input into errors that say what is wrong and where."""

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(x) -> bool:
    """True when `x` holds values (not a tracer inside jit/vmap/grad)."""
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(x))


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
    if is_concrete(x0):
        bad = np.flatnonzero(~np.isfinite(np.asarray(x0)))
        if bad.size:
            raise ValueError(f"{name} has non-finite entries (NaN or inf) at indices {bad.tolist()}")
    return x0


def check_positive_step(dt, steps, save_every):
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if not isinstance(save_every, (int, np.integer)) or save_every < 1:
        raise ValueError(f"save_every must be a positive integer, got {save_every!r}")
    if steps % save_every:
        raise ValueError(f"steps ({steps}) must be a multiple of save_every ({save_every})")
    if is_concrete(dt):
        d = np.asarray(dt)
        if d.shape != () or not np.isfinite(d) or d <= 0:
            raise ValueError(f"dt must be a positive finite scalar, got {dt!r}")


def require_invertible(matrix, what: str, reason: str, where: str = "at x0") -> None:
    """Raise a ValueError if the (concrete) `matrix` is non-finite or numerically singular.

    `what` names the matrix in the message (e.g. "the constraint matrix C_ij = {f_i, f_j}"),
    `reason` says what singularity means for the user's system and `where` where it was
    evaluated. A traced matrix (parameters under jit/vmap/grad) cannot be checked eagerly
    and is let through.
    """
    if not is_concrete(matrix):
        return
    c = np.asarray(matrix)
    if not np.all(np.isfinite(c)):
        raise ValueError(f"{what} is not finite {where}: the functions or their gradients give NaN/inf there")
    sv = np.linalg.svd(c, compute_uv=False)
    if sv.size and (sv[0] == 0.0 or sv[-1] <= 1e-12 * max(sv[0], 1.0)):
        raise ValueError(
            f"{what} is singular {where} (singular values {np.array2string(sv, precision=3)}): {reason}"
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
        return jax.eval_shape(fn, spec)
    except _TRACE_ERRORS as err:
        raise TypeError(untraceable_message(what, err)) from err
