"""Evaluate a user's function of the flat state directly on the state's pieces.

Users write `H(x)` with `q, p = x[:n], x[n:]`. Called on `concatenate([q, p])`, the
slices come back as slices of a concatenation, and reverse-mode autodiff turns each into a
`pad`; on the CPU those pads split XLA's fusions and cost several times the field itself.
`evaluate_on_pieces` traces the function once to a jaxpr and evaluates it with the flat
input replaced by its pieces: a slice or split that falls on a piece reads the piece
directly, and any other use of the input sees the concatenation. The result is the same
function, with no concatenate–slice round trip left for autodiff to transpose.
"""

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Literal


class _Flat:
    """Marker for the flat input while interpreting: holds the pieces and their offsets."""

    def __init__(self, pieces: Sequence[jax.Array]):
        self.pieces = list(pieces)
        self.offsets = []
        start = 0
        for piece in self.pieces:
            self.offsets.append((start, start + piece.shape[0]))
            start += piece.shape[0]
        self._joined = None

    def joined(self):
        if self._joined is None:
            self._joined = jnp.concatenate(self.pieces)
        return self._joined

    def slice(self, start: int, limit: int):
        for piece, (lo, hi) in zip(self.pieces, self.offsets):
            if lo <= start and limit <= hi:
                if (start, limit) == (lo, hi):
                    return piece
                return lax.slice(piece, (start - lo,), (limit - lo,))
        return None


def _try_structural(eqn, flat: _Flat):
    """Outputs of `eqn` computed from the pieces, or None if the equation needs the flat array."""
    name = eqn.primitive.name
    if name == "slice":
        strides = eqn.params.get("strides")
        if strides is None or tuple(strides) == (1,):
            out = flat.slice(eqn.params["start_indices"][0], eqn.params["limit_indices"][0])
            return None if out is None else [out]
    elif name == "split" and eqn.params.get("axis", 0) == 0:
        outs, start = [], 0
        for size in eqn.params["sizes"]:
            out = flat.slice(start, start + int(size))
            if out is None:
                return None
            outs.append(out)
            start += int(size)
        return outs
    return None


def evaluate_on_pieces(fn: Callable, pieces: Sequence[jax.Array]):
    """Return `fn(concatenate(pieces))`, evaluated so that slices of the input read the pieces.

    Only one-dimensional pieces are handled; `fn` takes one flat array.
    """
    pieces = list(pieces)
    flat_shape = jax.ShapeDtypeStruct((sum(p.shape[0] for p in pieces),), pieces[0].dtype)
    # A fresh wrapper: make_jaxpr caches on the callable, and bound methods of modules
    # holding tracers cannot be hashed.
    closed, out_shape = jax.make_jaxpr(lambda x: fn(x), return_shape=True)(flat_shape)
    jaxpr = closed.jaxpr
    env = {}
    marker = _Flat(pieces)

    def read(v):
        if isinstance(v, Literal):
            return v.val
        return env[v]

    for var, val in zip(jaxpr.constvars, closed.consts):
        env[var] = val
    env[jaxpr.invars[0]] = marker
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        outs = None
        if any(v is marker for v in invals):
            if invals[0] is marker:
                outs = _try_structural(eqn, marker)
            if outs is None:
                invals = [marker.joined() if v is marker else v for v in invals]
        if outs is None:
            params = eqn.primitive.get_bind_params(eqn.params)
            subfuns = ()
            if isinstance(params, tuple):  # older JAX returns (subfuns, params)
                subfuns, params = params
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*subfuns, *invals, **params)
            if not eqn.primitive.multiple_results:
                outs = [outs]
        for var, val in zip(eqn.outvars, outs):
            env[var] = val
    results = [read(v) for v in jaxpr.outvars]
    results = [marker.joined() if r is marker else r for r in results]
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), results)
