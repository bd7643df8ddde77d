"""Saves after a failure: NaN values whose derivatives are NaN too.

A run that failed keeps its state frozen after the failing step and saves NaN from there
on. A plain `jnp.where(failed, nan, x)` gives the right values but the wrong derivatives:
reverse mode sends a zero cotangent into the frozen state, so a loss on a post-failure
save has a finite (zero) gradient, silently. `flag_failed` gives

- values: NaN where `failed`, `x` elsewhere;
- forward mode: tangents NaN where `failed`;
- reverse mode: a cotangent that reaches a failed entry and is not zero turns the
  gradient NaN; a zero cotangent (a loss that does not read that save) stays zero, so
  losses on the states before the failure keep finite gradients — those of the shorter
  run.

No linear map can send a non-zero cotangent to NaN and a zero one to zero (0·NaN is
NaN), so the tangent map is a primitive of its own, `failed_tangent_p`, linear for
forward mode and with its own transpose rule for reverse mode. It works under `jit`,
`vmap` and higher-order differentiation.
"""

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir


def _tangent_impl(t, failed):
    return jnp.where(failed, jnp.nan, t)


failed_tangent_p = Primitive("geomjax_failed_tangent")
failed_tangent_p.def_impl(_tangent_impl)
failed_tangent_p.def_abstract_eval(lambda t, failed: t)
mlir.register_lowering(failed_tangent_p, mlir.lower_fun(_tangent_impl, multiple_results=False))


def _tangent_jvp(primals, tangents):
    t, failed = primals
    t_dot, _ = tangents
    out = failed_tangent_p.bind(t, failed)
    if type(t_dot) is ad.Zero:
        return out, ad.Zero.from_primal_value(out)
    return out, failed_tangent_p.bind(t_dot, failed)


def _tangent_transpose(ct, t, failed):
    del t
    if type(ct) is ad.Zero:
        return [ad.Zero(ct.aval), None]
    return [jnp.where(failed, jnp.where(ct == 0, 0.0, jnp.nan).astype(ct.dtype), ct), None]


def _tangent_batch(args, dims):
    t, failed = args
    t_dim, f_dim = dims
    size = t.shape[t_dim] if t_dim is not None else failed.shape[f_dim]
    t = batching.bdim_at_front(t, t_dim, size)
    failed = batching.bdim_at_front(failed, f_dim, size)
    return failed_tangent_p.bind(t, failed), 0


ad.primitive_jvps[failed_tangent_p] = _tangent_jvp
ad.primitive_transposes[failed_tangent_p] = _tangent_transpose
batching.primitive_batchers[failed_tangent_p] = _tangent_batch


@jax.custom_jvp
def _flag(x, failed):
    return jnp.where(failed, jnp.nan, x)


@_flag.defjvp
def _flag_jvp(primals, tangents):
    x, failed = primals
    x_dot, _ = tangents
    return _flag(x, failed), failed_tangent_p.bind(x_dot, failed)


def flag_failed(x, failed):
    """`x` with NaN where `failed` (broadcast against `x`), in value and in derivative.

    Example:

    ```python
    >>> import jax, jax.numpy as jnp
    >>> from geomjax._driver.flagged import flag_failed
    >>> failed = jnp.array([False, True])
    >>> jax.grad(lambda x: flag_failed(x, failed)[0])(jnp.array([1.0, 2.0]))
    Array([1., 0.], dtype=float64)
    >>> jax.grad(lambda x: flag_failed(x, failed)[1])(jnp.array([1.0, 2.0]))
    Array([ 0., nan], dtype=float64)

    ```
    """
    failed = jnp.broadcast_to(jnp.asarray(failed, bool), jnp.shape(x))
    return _flag(x, failed)
