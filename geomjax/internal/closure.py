"""Closed-over tracers as explicit inputs: custom derivative rules that see every parameter.

A JAX custom derivative rule (`jax.custom_jvp`) differentiates its function with respect
to the function's explicit inputs only. A value the function reaches by closure, such as
a parameter `g` in a user's `H = lambda x: ... + g * x[2]` traced by an outer `jax.grad`,
gets no tangent: JAX drops it (a gradient of exactly 0 under `jax.jit(jax.grad)`) or
embeds the outer tracer as a constant (`TypeError: No constant handler for type
LinearizeTracer`). The remedy is closure conversion, as `jax.closure_convert`, equinox's
`filter_closure_convert` and optimistix's `root_find` do it: the function is traced once
at its actual arguments, the tracers of enclosing transformations found among the
constants of its jaxpr become explicit inputs, and the rule differentiates with respect
to them too.

`custom_jvp_by_reference(value, reference)` is the one custom derivative of geomjax's
driver written this way: values from one function (a fast loop), derivatives from
another that computes the same map (the exact loop). Concrete constants stay constants
(the simplification pass folds them into its graphs); only tracers are hoisted.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from .._validate import is_traced


def _trace(fn, args):
    """`(closed jaxpr, output tree)` of `fn(*args)`, traced at the shapes of `args`."""
    flat, in_tree = jax.tree_util.tree_flatten(args)
    specs = [jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)) for a in flat]

    def flat_fn(*leaves):
        return fn(*jax.tree_util.tree_unflatten(in_tree, leaves))

    closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*specs)
    return closed, jax.tree_util.tree_structure(out_shape)


def closed_over_tracers(closed) -> list:
    """The tracers (values of enclosing transformations) among a closed jaxpr's constants."""
    return [c for c in closed.consts if is_traced(c)]


def _evaluate(closed, out_tree, hoisted_ids, hoisted, args):
    """`closed` evaluated at `args`, each constant that is one of the hoisted tracers (by
    identity) replaced by the corresponding value of `hoisted`."""
    position = {i: k for k, i in enumerate(hoisted_ids)}
    consts = []
    for c in closed.consts:
        if is_traced(c):
            k = position.get(id(c))
            if k is None:
                raise RuntimeError(
                    "geomjax internal error: a derivative rule reaches a traced value by closure "
                    "that its primal does not; please report this with the code that raised it"
                )
            c = hoisted[k]
        consts.append(c)
    out = jax.core.eval_jaxpr(closed.jaxpr, consts, *jax.tree_util.tree_leaves(args))
    return jax.tree_util.tree_unflatten(out_tree, [batch_axis_first(o) for o in out])


def batch_axis_first(a):
    """`a` unchanged, through an operation whose batching rule puts a `vmap`'s batch axis
    first (a reshape that adds a leading axis of length 1, and one that drops it: free
    in XLA).

    Under `vmap`, JAX lays out a `custom_jvp`'s outputs by the batch axes of its rule's
    outputs, but stages them by those of its function's (JAX 0.10): where the two
    computations end in different layouts (the fast loop's carry against the exact
    loop's stacked entries), the outputs are read transposed (`jax.grad` of a `vmap`
    over gains raised a shape error). `custom_jvp_by_reference` ends its function and
    its rule here, so the two agree. (The simplified graphs' rule instead returns its
    function's own call as its primal: `geomjax.internal.simplify`.)"""
    shape = jnp.shape(a)
    return jax.lax.reshape(jax.lax.reshape(a, (1, *shape)), shape)


def custom_jvp_by_reference(value: Callable, reference: Callable) -> Callable:
    """`f(*args)` with the values of `value(*args)` and the derivatives of
    `reference(*args)`, including derivatives with respect to everything either function
    closes over.

    `value` and `reference` must compute the same map (e.g. a fast loop and the exact
    loop that defines its derivatives); `args` are pytrees of arrays.

    Closed-over tracers of enclosing transformations (`jax.grad`, `jax.vmap`, `jax.jit`
    of a caller) are found by tracing `value` at the call's arguments, and passed to the
    `jax.custom_jvp` as explicit inputs, so that the rule differentiates with respect to
    them. Where `value` closes over tracers, `reference` is traced at the call too (its
    tracers must be read while their transformations are alive: the rule may run after
    an enclosing `vmap` has finished); where it closes over none, `reference` is traced
    only when a derivative is taken.

    Example:

    ```python
    >>> import jax, jax.numpy as jnp
    >>> from geomjax.internal.closure import custom_jvp_by_reference
    >>> def loss(g):
    ...     fast = lambda x: g * x            # closes over the traced g
    ...     exact = lambda x: g * x
    ...     return custom_jvp_by_reference(fast, exact)(3.0)
    >>> float(jax.grad(loss)(2.0)), float(jax.jit(jax.grad(loss))(2.0))
    (3.0, 3.0)

    ```
    """

    def call(*args):
        closed, out_tree = _trace(value, args)
        hoisted = closed_over_tracers(closed)
        ref = None
        if hoisted:
            ref = _trace(reference, args)
            seen = {id(c) for c in hoisted}
            hoisted += [c for c in closed_over_tracers(ref[0]) if id(c) not in seen]
        ids = tuple(id(c) for c in hoisted)

        @jax.custom_jvp
        def run(hoisted, args):
            return _evaluate(closed, out_tree, ids, hoisted, args)

        @run.defjvp
        def run_jvp(primals, tangents):
            ref_closed, ref_tree = ref if ref is not None else _trace(reference, primals[1])
            return jax.jvp(lambda h, a: _evaluate(ref_closed, ref_tree, ids, h, a), primals, tangents)

        return run(hoisted, args)

    return call
