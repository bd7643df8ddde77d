"""Evaluate a user's function of the flat state directly on the state's pieces.

Users write `H(x)` with `q, p = x[:n], x[n:]`. Called on `concatenate([q, p])`, the
slices come back as slices of a concatenation, and reverse-mode autodiff turns each into a
`pad`; on the CPU those pads split XLA's fusions and cost several times the field itself.
`evaluate_on_pieces` traces the function once to a jaxpr and evaluates it with the flat
input replaced by a view of its pieces: a slice or split that falls on a piece reads the
piece directly, one that covers several whole pieces is again a view, and only an
operation that needs the whole vector sees the concatenation. The result is the same
function, with no concatenate–slice round trip left for autodiff to transpose.

Derived fields are expanded into simplified scalar graphs (`geomjax.internal.simplify`);
this interpreter serves the user functions inside them (through
`AbstractPoissonStructure.evaluate`) and whole fields the graph leaves alone.
"""

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Literal


class _View:
    """A flat vector held as its consecutive one-dimensional pieces, never concatenated
    unless something needs it whole."""

    def __init__(self, pieces: Sequence[jax.Array]):
        self.pieces = list(pieces)
        self.bounds = []
        start = 0
        for piece in self.pieces:
            self.bounds.append((start, start + piece.shape[0]))
            start += piece.shape[0]
        self.size = start
        self._joined = None

    def joined(self):
        """The vector itself (the concatenation, built once)."""
        if self._joined is None:
            self._joined = self.pieces[0] if len(self.pieces) == 1 else jnp.concatenate(self.pieces)
        return self._joined

    def take(self, start: int, limit: int):
        """Entries `start:limit` as a piece, a slice of one piece or a view of several
        whole pieces; None when the range straddles a piece boundary."""
        for piece, (lo, hi) in zip(self.pieces, self.bounds):
            if lo <= start and limit <= hi:
                if (start, limit) == (lo, hi):
                    return piece
                return lax.slice(piece, (start - lo,), (limit - lo,))
        starts = [lo for lo, _ in self.bounds]
        limits = [hi for _, hi in self.bounds]
        if start not in starts or limit not in limits:
            return None
        return _View(self.pieces[starts.index(start) : limits.index(limit) + 1])


def _view_outputs(eqn, view: _View):
    """Outputs of `eqn` read off the view, or None when the equation needs the whole vector."""
    name = eqn.primitive.name
    params = eqn.params
    if name == "slice" and (params.get("strides") is None or tuple(params["strides"]) == (1,)):
        out = view.take(params["start_indices"][0], params["limit_indices"][0])
        return None if out is None else [out]
    if name == "split" and params.get("axis", 0) == 0:
        outs, start = [], 0
        for size in params["sizes"]:
            out = view.take(start, start + int(size))
            if out is None:
                return None
            outs.append(out)
            start += int(size)
        return outs
    return None


def _bind(eqn, invals):
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns = ()
    if isinstance(params, tuple):  # older JAX returns (subfuns, params)
        subfuns, params = params
    with eqn.ctx.manager:
        outs = eqn.primitive.bind(*subfuns, *invals, **params)
    return outs if eqn.primitive.multiple_results else [outs]


def evaluate_on_pieces(fn: Callable, pieces: Sequence[jax.Array]):
    """`fn(concatenate(pieces))`, evaluated so that slices of the input read the pieces.

    **Arguments:**

    - `fn`: a function of one flat array (any pytree of arrays out).
    - `pieces`: one-dimensional arrays whose concatenation is the input, e.g. `(q, p)`, or
      the single entries of a state (shape `(1,)` each).

    **Returns:**

    The value of `fn` at the concatenation; slices `x[3]`, `x[:3]`, `x[3:][0]` that fall on
    pieces are read from them, and the input is concatenated only for an operation that
    needs it whole.
    """
    pieces = list(pieces)
    spec = jax.ShapeDtypeStruct((sum(p.shape[0] for p in pieces),), pieces[0].dtype)
    # A fresh wrapper: make_jaxpr and eval_shape cache on the callable, and bound methods of modules
    # holding tracers cannot be hashed.
    closed, out_shape = jax.make_jaxpr(lambda x: fn(x), return_shape=True)(spec)
    jaxpr = closed.jaxpr
    env = dict(zip(jaxpr.constvars, closed.consts))
    env[jaxpr.invars[0]] = _View(pieces)

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        outs = _view_outputs(eqn, invals[0]) if invals and isinstance(invals[0], _View) else None
        if outs is None:
            outs = _bind(eqn, [v.joined() if isinstance(v, _View) else v for v in invals])
        for var, val in zip(eqn.outvars, outs):
            env[var] = val
    results = [read(v) for v in jaxpr.outvars]
    results = [r.joined() if isinstance(r, _View) else r for r in results]
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), results)
