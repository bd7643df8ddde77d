"""Derived fields rewritten as simplified scalar expression graphs.

A field derived by autodiff carries what the derivation needed but the result does not:
products with the zeros and ones of unit cotangents, `0.5·p + 0.5·p` from transposing
`p·p`, dense inner products of gradients that are mostly zero, the same sum computed
twice in two gradients. XLA keeps most of it (it may not assume that `x·0 = 0` in
floating point). For the small state spaces of constrained mechanics the cure is cheap:
trace the field once to a jaxpr, expand every array into its scalar entries, and rebuild
each entry as a node of an expression graph that

- folds constants (including the entries of unit cotangents and identity matrices, `iota`
  and comparisons of constants, selects with a constant predicate, and any operation
  whose operands are all constant, such as the inverse of a constant mass matrix),
- applies `x·0 = 0`, `x·1 = x`, `x + 0 = x`, `x + x = 2x`, `x − x = 0`, `0/x = 0`,
  `−(−x) = x`, `c₁(c₂x) = (c₁c₂)x`, `a·x + b·x = (a + b)·x`, `sin²x + cos²x = 1`,
- shares equal subexpressions (hash-consing, with commutative operands sorted), and
- drops everything no output reads.

The graph is then emitted as scalar JAX operations and the outputs restacked. Under
`vmap` each scalar becomes a batch vector, so the batched field costs exactly the
operations left in the graph. Calls (`jit`, `closed_call`, `checkpoint`, `custom_jvp`,
`custom_vjp`: their primal body) are inlined; `stop_gradient` stays an operation of the
graph; `gather`, `dynamic_slice` and `dynamic_update_slice` with constant indices,
cumulative sums/products/extrema and `cond` with a constant branch index are expanded, and
so are higher-order primitives that say how they expand (`call_hi_primitive`, which JAX
0.11 stages for some operations). An operation the expansion has no rule for (a loop,
`scatter`, `sort`, a primitive of a newer JAX or of another library) is kept whole as one
node of the graph, emitted as it is on arrays rebuilt from its operands' scalars: the graph
is simplified around it.

**What the rewrites assume, and how that is kept sound.** In IEEE arithmetic the rules
`x·0 = 0`, `x − x = 0`, `0/x = 0` and `sin²x + cos²x = 1` hold only for finite `x` (and
`0/x` for `x ≠ 0`). The graph records every subexpression such a rule removed and the
emitted function adds one guard: the sum of `t − t` over the removed `t` (and of `0/t`
over removed divisors), which is exactly 0 when they are all finite (and non-zero) and NaN
otherwise, is added to every floating-point output. So:

- when every intermediate the function as written computes is finite, the outputs are
  its outputs up to rounding (constant factors are multiplied together, products
  reordered, like terms collected and divisions by one denominator turned into one
  reciprocal and products, which can round differently; the sign of a zero is not kept);
- whenever a removed subexpression is non-finite, so that the function as written would
  have produced a NaN, the outputs are non-finite: a removed `t` that reaches some output
  (or another checked node) through NaN-propagating arithmetic (+, −, ·, sin, cos, √, …)
  makes that output non-finite by itself and is not checked; the others are summed into
  the guard, which is added to every floating-point output array. Non-finite values are
  never hidden, though they may show in other entries of the output than in the
  function as written.

**Derivatives are simplified graphs too.** The simplified function carries a JVP rule:
the JVP of the original function (its custom derivative rules, `custom_jvp` and
`custom_vjp`, included), expanded and simplified the same way, with zero tangents and
concrete inputs folded in as constants. Reverse mode transposes that linear graph, so
gradients through a derived field cost what its simplified derivative costs, not what
JAX's derivative of every emitted operation does (for the spherical pendulum's feedback
field the linearisation has half the arithmetic of the field as derived). In the
derivative's graph, the guard's terms that read a tangent are kept differentiable (they
are linear), and each output's guard holds only the terms that read inputs its primal
output depends on: the others carry only 0·ẋ of inputs the output does not depend on,
and under `vmap` they would batch a tangent whose value is not batched (JAX lays out a
`custom_jvp`'s outputs by its rule's batching but stages them by its function's; `jax.grad`
of a `vmap` over a parameter failed to lower). The primal outputs of the rule are the
simplified function's own call, so a differentiated run computes the values a plain run
does, batched alike.
`stop_gradient` is kept as an operation, so it acts as it does in the original. Where the
derivative's graph exceeds the size limits, the rule is JAX's JVP of the emitted graph,
or of the function as written where it holds custom derivative rules (the emitted
graph has them inlined: its JVP would differentiate a Newton loop's iterations, which
reverse mode cannot transpose).

**When it is not used.** Functions of more than `MAX_INPUTS` input scalars (their
arguments' and those of the traced values they close over, such as a network's weights
under `jax.grad`), whose
expansion grows past `MAX_NODES` nodes, or whose simplified graph still needs more than
`MAX_OPERATIONS` scalar operations are evaluated unchanged, quietly: that is by design
(the expansion is quadratic in the state dimension for the Jacobians of derived fields,
and compile time grows faster than the savings; `benchmarks/simplify_threshold.py`
measures where); so is a dense linear solve on the state past `small_solve`'s size. A
function holding an operation with side effects, an operation kept whole that closes over
a traced value, or whose expansion fails is also evaluated unchanged, and a warning names
the reason once per function: it runs unsimplified, and so slower. A field's or step's
static option `simplify=False` (`unsimplified(target)`) turns the pass off for it.

Expanded graphs are cached by the structure of the traced jaxpr, the values of its
concrete constants and the shapes of its traced inputs, so the several traces of a field
in one integrator step (the four stages of RK4) and later traces reuse one expansion.
"""

import dataclasses
import hashlib
import warnings
from collections import Counter, OrderedDict
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal
from .._validate import is_traced

# Functions of more input scalars than this, whose expansion grows past MAX_NODES nodes,
# or whose simplified graph still needs more than MAX_OPERATIONS scalar operations are
# evaluated unchanged. benchmarks/simplify_threshold.py (planar N-link chain, Dirac field,
# explicit Euler) measures simplified against unchanged: up to N = 4 (1235 operations)
# the simplified field runs faster and compiles no slower; the run-time gain holds past
# 3000 operations (N = 6, solve unrolled), but compile time grows faster than the
# graph: 2000 operations keeps it within a small factor of the unsimplified field's.
# The graph's size, not its inputs, is what binds (a 32-dimensional derived field with
# constraints is past 2000 operations); MAX_INPUTS only spares tracing what would be cut
# anyway, and MAX_NODES (the expansion before dead nodes are dropped) bounds the expansion time.
MAX_INPUTS = 64
MAX_NODES = 20_000
MAX_OPERATIONS = 2_000
# Expanded graphs kept (least recently used dropped first).
CACHE_SIZE = 256

def unsimplified(target):
    """`target` (a geomjax field or step, or any pytree holding them) with its static
    option `simplify` off, and that of every field or step it holds (the field inside a
    step, the feedback field inside an adaptive one): everything it derives is evaluated
    as derived, not through `scalar_graph`.

    A target and its unsimplified copy compile to separate programs (the option is static,
    so part of the program's key), and nothing else changes what a target computes.

    Example:

    ```python
    >>> import geomjax
    >>> from geomjax.internal.simplify import unsimplified
    >>> field = geomjax.dirac_field(geomjax.models.spherical_pendulum().system)
    >>> field.simplify, unsimplified(field).simplify
    (True, False)

    ```
    """
    return _with_option(target, "simplify", False)


def _with_option(node, name: str, value):
    """A copy of the pytree `node` with the dataclass field `name` set to `value` in every
    module that has one (copies: modules are immutable)."""
    if not dataclasses.is_dataclass(node) or isinstance(node, type):
        if isinstance(node, (list, tuple)) and not hasattr(node, "_fields"):
            items = [_with_option(item, name, value) for item in node]
            if any(new is not old for new, old in zip(items, node)):
                return type(node)(items)
        return node
    changed = {}
    for field in dataclasses.fields(node):
        old = getattr(node, field.name, None)
        new = value if field.name == name else _with_option(old, name, value)
        if new is not old:
            changed[field.name] = new
    if not changed:
        return node
    copy = object.__new__(type(node))
    for field in dataclasses.fields(node):
        object.__setattr__(copy, field.name, changed.get(field.name, getattr(node, field.name)))
    return copy


# Factorisations and solves of state-dependent matrices: evaluated unchanged, quietly.
_DENSE_LINEAR_ALGEBRA = {
    "lu", "lu_pivots_to_permutation", "triangular_solve", "custom_linear_solve", "cholesky",
    "eigh", "eig", "svd", "qr", "householder_product", "tridiagonal_solve", "schur",
}


class _Unsupported(Exception):
    """The jaxpr has an operation the scalar expansion does not handle."""


class _TooLarge(Exception):
    """A size limit was reached: evaluate unchanged, quietly."""


_FOLD = {
    "add": np.add,
    "add_any": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "neg": np.negative,
    "max": np.maximum,
    "min": np.minimum,
    "sqrt": np.sqrt,
    "sin": np.sin,
    "cos": np.cos,
    "exp": np.exp,
    "log": np.log,
    "abs": np.abs,
    "sign": np.sign,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "and": np.bitwise_and,
    "or": np.bitwise_or,
    "xor": np.bitwise_xor,
    "not": np.invert,
}
# numpy differs from lax for these on integers (lax.div truncates toward zero)
_FLOAT_ONLY_FOLD = {"div"}
_COMMUTATIVE = {"add", "mul", "max", "min"}
# Arithmetic whose parameters (result dtype hints) are dropped, so equal expressions from
# different sources share one node; emitted through the `lax` functions.
_PLAIN = {"add": lax.add, "sub": lax.sub, "mul": lax.mul, "div": lax.div, "neg": lax.neg, "max": lax.max, "min": lax.min}
_PRIMITIVES = {name: getattr(lax, f"{name}_p") for name in _PLAIN}
# Elementwise primitives re-bound as they are on scalar operands.
_ELEMENTWISE = set(_FOLD) | {
    "integer_pow", "pow", "rsqrt", "tan", "tanh", "atan2", "asin", "acos", "atan", "sinh", "cosh",
    "asinh", "acosh", "atanh", "log1p", "expm1", "logistic", "square", "exp2", "erf", "erfc", "erf_inv",
    "lgamma", "digamma", "cbrt", "convert_element_type", "select_n", "is_finite", "floor", "ceil",
    "round", "nextafter", "rem", "clamp", "copy", "copy_p", "stop_gradient", "reduce_precision",
    "shift_left", "shift_right_logical", "shift_right_arithmetic", "population_count",
}
# Calls whose body is inlined.
_CALLS = {"pjit", "jit", "closed_call", "core_call", "remat2", "checkpoint", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"}
_CUMULATIVE = {"cumsum": "add", "cumprod": "mul", "cummax": "max", "cummin": "min"}
_REDUCERS = {"add": lax.add_p, "mul": lax.mul_p, "max": lax.max_p, "min": lax.min_p, "and": lax.and_p, "or": lax.or_p}


def _hi_expansion(eqn):
    """The jaxpr of what a higher-order primitive (`call_hi_primitive`: JAX stages some
    operations, e.g. `lax.custom_root` from JAX 0.11, as an object with an `expand`
    method in terms of ordinary primitives) computes, or None for any other equation."""
    hi = eqn.params.get("_prim", eqn.params.get("prim"))
    expand, in_tree = getattr(hi, "expand", None), getattr(hi, "in_tree", None)
    if not callable(expand) or in_tree is None:
        return None

    def flat(*leaves):
        return jax.tree_util.tree_leaves(expand(*jax.tree_util.tree_unflatten(in_tree, list(leaves))))

    try:
        return jax.make_jaxpr(flat)(*[jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars])
    except NotImplementedError:  # no expansion given: kept whole, as an opaque node
        return None


class _Opaque:
    """An operation kept as it is (a loop, an operation without a rule): `emit` binds it
    on arrays of the given shapes and returns the list of its outputs."""

    name = "opaque"

    def __init__(self, primitive, params, shapes, dtypes):
        self.primitive, self.params, self.shapes, self.dtypes = primitive, params, shapes, dtypes

    def emit(self, operands):
        arrays, k = [], 0
        for shape, dtype in zip(self.shapes, self.dtypes):
            n = int(np.prod(shape, dtype=np.int64))
            part = [jnp.asarray(v, dtype) for v in operands[k : k + n]]
            arrays.append(part[0].reshape(shape) if n == 1 else jnp.stack(part).reshape(shape))
            k += n
        out = self.primitive.bind(*arrays, **self.params)
        return out if self.primitive.multiple_results else [out]


class _OpaqueOutput:
    """Entry `index` (flat) of output `position` of an opaque node."""

    name = "opaque_output"

    def __init__(self, position, index):
        self.position, self.index = position, index


def _evaluate(prim, params, values):
    """`prim(*values)` on concrete values, now (also inside an outer trace): a list of outputs."""
    bind_params = prim.get_bind_params(params)
    if isinstance(bind_params, tuple):  # (subfuns, params) in older JAX
        subfuns, bind_params = bind_params
    else:
        subfuns = []
    with jax.ensure_compile_time_eval():
        out = prim.bind(*subfuns, *[jnp.asarray(v) for v in values], **bind_params)
    out = out if prim.multiple_results else [out]
    return [np.asarray(o) for o in out]


def _params_key(params):
    try:
        key = tuple(sorted(params.items()))
        hash(key)
        return key
    except TypeError:
        return repr(sorted(params.items()))


class _Graph:
    """Hash-consed scalar nodes; node ids are ints in creation (topological) order.

    Floating-point arithmetic is kept in a canonical form: a node is either a constant,
    an input leaf, or `c·t` with a constant c ≠ 0, 1 (a `mul` node, or `neg` for
    c = −1) over a term `t` whose own constant factors have been pulled out. Products
    multiply the constants and the terms separately, sums of `c·t` and `c·u` factor to
    `c·(t ± u)`, `a·t + b·t` is `(a + b)·t`, and `t − u` is stored with sorted operands
    (`u − t` is `−(t − u)`), so that equal expressions meet in one node whatever order the
    derivation produced them in.
    """

    def __init__(self):
        self.nodes = []  # ("const", value) | ("leaf", k) | (prim, params, args)
        self.dtypes = []
        self.varying = []  # depends on the state (not only on constants and parameters)
        self.index = {}
        self.constants = {}  # id -> numpy scalar
        # Subexpressions a rewrite removed whose non-finite value would have made a result
        # NaN: ("finite", t) for `0·t`, `t − t`, `sin²t + cos²t`; ("divisor", t) for `0/t`.
        self.dropped = set()
        self._factor_cache = {}

    def _add(self, key, node, dtype):
        found = self.index.get(key)
        if found is not None:
            return found
        if len(self.nodes) >= MAX_NODES:
            raise _TooLarge(f"more than MAX_NODES = {MAX_NODES} nodes")
        self.nodes.append(node)
        self.dtypes.append(np.dtype(dtype))
        if node[0] == "const":
            self.varying.append(False)
        elif node[0] == "leaf":
            self.varying.append(node[2])
        else:
            self.varying.append(any(self.varying[a] for a in node[2]))
        self.index[key] = len(self.nodes) - 1
        return len(self.nodes) - 1

    def const(self, value):
        value = np.asarray(value)[()]
        key = ("const", value.dtype.str, value.tobytes())
        i = self._add(key, ("const", value), value.dtype)
        self.constants[i] = value
        return i

    def leaf(self, k, dtype, varying=True):
        """Input scalar number k: an entry of the state (`varying`) or of a parameter."""
        return self._add(("leaf", k), ("leaf", k, varying), dtype)

    def value(self, i):
        """The constant value of node i, or None."""
        return self.constants.get(i)

    def _raw(self, name, args, dtype, call=None):
        """The node `name(*args)` as it is; `call` = (primitive, params) unless plain arithmetic."""
        prim, params = (_PRIMITIVES[name], {}) if call is None else call
        if name in _COMMUTATIVE:
            args = tuple(sorted(args))
        return self._add((name, _params_key(params), tuple(args)), (prim, params, tuple(args)), dtype)

    def _name(self, i):
        node = self.nodes[i]
        return node[0] if isinstance(node[0], str) else node[0].name

    def _args(self, i):
        return self.nodes[i][2]

    # -- the canonical form c·t ------------------------------------------------------

    def split(self, i):
        """(c, t) with node i = c·t; t is None for a constant."""
        v = self.constants.get(i)
        if v is not None:
            return v, None
        name = self._name(i)
        if name == "neg":
            return np.asarray(-1, self.dtypes[i])[()], self._args(i)[0]
        if name == "mul":
            a, b = self._args(i)
            if a in self.constants:
                return self.constants[a], b
            if b in self.constants:
                return self.constants[b], a
        return np.asarray(1, self.dtypes[i])[()], i

    def scale(self, c, t, dtype):
        """The node c·t (t a term, or None for the constant c)."""
        c = np.asarray(c, dtype)[()]
        if t is not None and c == 0:
            self.dropped.add(("finite", t))
        if t is None or c == 0:
            return self.const(c if t is None else np.zeros((), dtype))
        if c == 1:
            return t
        if c == -1:
            return self._raw("neg", (t,), dtype)
        return self._raw("mul", (self.const(c), t), dtype)

    def factors(self, t):
        """The factors of the term t, sorted: a product of terms (a `mul` node with no
        constant operand) is flattened, anything else is one factor."""
        found = self._factor_cache.get(t)
        if found is None:
            args = self._args(t) if self._name(t) == "mul" else ()
            if len(args) == 2 and not any(a in self.constants for a in args):
                found = self.sort_factors(self.factors(args[0]) + self.factors(args[1]))
            else:
                found = (t,)
            self._factor_cache[t] = found
        return found

    def sort_factors(self, factors):
        """Factors in canonical order: those of parameters only (not varying with the
        state) first, so that their product is one loop-invariant node XLA hoists out of
        an integrator's loop (sorted by id alone, a field whose gains are traced ran
        slower: the knife edge called from `integrate`), then by node id."""
        return tuple(sorted(factors, key=lambda f: (self.varying[f], f)))

    def product(self, factors, dtype):
        """The product of the sorted `factors` as one left-nested chain: equal products
        meet in one node however the derivation associated them."""
        node = factors[0]
        for f in factors[1:]:
            node = self._raw("mul", (node, f), dtype)
        return node

    def _pythagorean(self, ta, tb):
        """(angle, remaining factors) when ta = sin²θ·R and tb = cos²θ·R (or the other way
        round), else None: then ta + tb = R."""
        fa, fb = Counter(self.factors(ta)), Counter(self.factors(tb))
        for s, c in ((fa, fb), (fb, fa)):
            for node, count in s.items():
                if count < 2 or self._name(node) != "sin":
                    continue
                angle = self._args(node)[0]
                for other, other_count in c.items():
                    if other_count >= 2 and self._name(other) == "cos" and self._args(other)[0] == angle:
                        rest = s.copy()
                        rest[node] -= 2
                        rest_other = c.copy()
                        rest_other[other] -= 2
                        if +rest == +rest_other:
                            return angle, self.sort_factors((+rest).elements())
        return None

    def _combine(self, a, b, sign, dtype):
        """a + sign·b in canonical form."""
        ca, ta = self.split(a)
        cb, tb = self.split(b)
        cb = cb * sign
        if ta is None and tb is None:
            return self.const(ca + cb)
        if tb is None and cb == 0:
            return a
        if ta is None and ca == 0:
            return self.scale(cb, tb, dtype)
        if ta is None or tb is None:
            return self._raw("add", (self.scale(ca, ta, dtype), self.scale(cb, tb, dtype)), dtype)
        if ta == tb:
            return self.scale(ca + cb, ta, dtype)
        # Like terms one level down: c·(u ± w) + d·w = c·u + (d ± c)·w.
        for (c1, t1), (c2, t2) in (((ca, ta), (cb, tb)), ((cb, tb), (ca, ta))):
            if self._name(t1) in ("add", "sub") and t2 in self._args(t1):
                u, w = self._args(t1)
                other, w_sign = (u, 1 if self._name(t1) == "add" else -1) if w == t2 else (w, 1)
                if other == t2:
                    continue
                if self._name(t1) == "sub" and w != t2:
                    # t1 = t2 − other
                    other_sign, w_coeff = -1, 1
                else:
                    other_sign, w_coeff = 1, w_sign
                first = self.scale(c1 * other_sign, other, dtype)
                second = self.scale(c1 * w_coeff + c2, t2, dtype)
                return self._combine(first, second, 1, dtype)
        if ca == cb or ca == -cb:
            # sin²θ + cos²θ = 1 (the embedding of an angle as (cos θ, sin θ))
            if ca == cb:
                found = self._pythagorean(ta, tb)
                if found is not None:
                    angle, rest = found
                    self.dropped.add(("finite", angle))
                    return self.scale(ca, self.product(rest, dtype) if rest else None, dtype)
                return self.scale(ca, self._raw("add", (ta, tb), dtype), dtype)
            lo, hi = sorted((ta, tb))
            # ca·(ta − tb), stored as ±ca·(lo − hi)
            flip = 1 if lo == ta else -1
            return self.scale(ca * flip, self._raw("sub", (lo, hi), dtype), dtype)
        return self._raw("add", (self.scale(ca, ta, dtype), self.scale(cb, tb, dtype)), dtype)

    def op(self, prim, params, args, dtype):
        """A node for `prim(*args)`, simplified."""
        name = prim.name
        consts = [self.constants.get(a) for a in args]
        if all(c is not None for c in consts):
            floating = all(np.asarray(c).dtype.kind == "f" for c in consts)
            if name in _FOLD and (floating or name not in _FLOAT_ONLY_FOLD):
                with np.errstate(all="ignore"):
                    return self.const(np.asarray(_FOLD[name](*consts), dtype=dtype))
            if name != "stop_gradient":
                return self.const(np.asarray(_evaluate(prim, params, consts)[0], dtype=dtype))
        if name == "stop_gradient" and consts[0] is not None:
            return args[0]
        if name == "convert_element_type":
            if consts[0] is not None:
                return self.const(np.asarray(consts[0], dtype=params["new_dtype"]))
            if self.dtypes[args[0]] == np.dtype(params["new_dtype"]):
                return args[0]
        floating = np.dtype(dtype).kind == "f"
        if floating and name in ("add", "add_any", "sub"):
            return self._combine(args[0], args[1], -1 if name == "sub" else 1, dtype)
        if floating and name == "neg":
            c, t = self.split(args[0])
            return self.scale(-c, t, dtype)
        if floating and name == "mul" or (name == "integer_pow" and params["y"] == 2 and floating):
            a, b = (args[0], args[0]) if name == "integer_pow" else args
            ca, ta = self.split(a)
            cb, tb = self.split(b)
            if ta is None or tb is None:
                return self.scale(ca * cb, ta if tb is None else tb, dtype)
            return self.scale(ca * cb, self.product(self.sort_factors(self.factors(ta) + self.factors(tb)), dtype), dtype)
        if floating and name == "div":
            ca, ta = self.split(args[0])
            cb, tb = self.split(args[1])
            if ta is None and ca == 0:
                self.dropped.add(("divisor", args[1]))
                return args[0]
            if tb is None:
                inverse = np.asarray(1, dtype)[()] / cb
                if np.frexp(cb)[0] in (0.5, -0.5):  # a power of two: its inverse is exact
                    return self.scale(ca * inverse, ta, dtype)
                return self.scale(ca, self._raw("div", (ta, args[1]), dtype), dtype)
            one = self.const(np.ones((), dtype))
            if not self.varying[tb]:
                # A denominator made of parameters only: its reciprocal is loop-invariant
                # (XLA hoists it out of the integrator's loop) and the division becomes a
                # product, which XLA fuses into every consumer.
                inverse = self._raw("div", (one, tb), dtype)
                return self.scale(ca / cb, inverse if ta is None else self._raw("mul", (ta, inverse), dtype), dtype)
            return self.scale(ca / cb, self._raw("div", (one if ta is None else ta, tb), dtype), dtype)
        if name == "select_n":
            which = consts[0]
            if which is not None:
                return args[1 + int(which)]
            if all(a == args[1] for a in args[1:]):
                return args[1]
        if name in _PLAIN:
            params = {}
        return self._raw(name, args, dtype, (prim, params))


class _Expander:
    """Evaluates a jaxpr on arrays of node ids (numpy int arrays)."""

    def __init__(self, graph: _Graph):
        self.graph = graph
        self.custom_rules = False  # a custom_jvp / custom_vjp was inlined

    def run(self, jaxpr, consts, args):
        env = {}

        def read(v):
            if isinstance(v, Literal):
                return self.constant_array(np.asarray(v.val, dtype=v.aval.dtype))
            return env[v]

        for var, val in zip(jaxpr.constvars, consts):
            env[var] = val
        for var, val in zip(jaxpr.invars, args):
            env[var] = val
        for eqn in jaxpr.eqns:
            invals = [read(v) for v in eqn.invars]
            outs = self.equation(eqn, invals)
            for var, val in zip(eqn.outvars, outs):
                env[var] = val
        return [read(v) for v in jaxpr.outvars]

    def constant_array(self, value):
        value = np.asarray(value)
        flat = [self.graph.const(v) for v in value.reshape(-1)]
        return np.asarray(flat, dtype=np.int64).reshape(value.shape)

    def constant_values(self, ids, what):
        """The values of an array of node ids that must all be constant."""
        ids = np.asarray(ids)
        values = [self.graph.value(int(i)) for i in ids.reshape(-1)]
        if any(v is None for v in values):
            raise _Unsupported(f"{what} that depend on the inputs")
        dtype = self.graph.dtypes[int(ids.reshape(-1)[0])] if ids.size else np.int64
        return np.asarray(values, dtype=dtype).reshape(ids.shape)

    def _all_constant(self, invals):
        return all(self.graph.value(int(i)) is not None for a in invals for i in np.asarray(a).reshape(-1))

    def equation(self, eqn, invals):
        name = eqn.primitive.name
        params = eqn.params
        out_avals = [v.aval for v in eqn.outvars]
        g = self.graph
        if name in _ELEMENTWISE:
            dtype = out_avals[0].dtype
            shape = out_avals[0].shape
            arrays = [np.broadcast_to(a, shape) for a in invals]
            out = np.empty(shape, dtype=np.int64)
            for idx in np.ndindex(shape):
                out[idx] = g.op(eqn.primitive, params, tuple(int(a[idx]) for a in arrays), dtype)
            return [out]
        if name == "iota":
            shape, dim = params["shape"], params["dimension"]
            value = np.broadcast_to(np.arange(shape[dim]).reshape([-1 if d == dim else 1 for d in range(len(shape))]), shape)
            return [self.constant_array(value.astype(params["dtype"]))]
        if name in _CALLS:
            if name.startswith("custom"):
                self.custom_rules = True
            sub = params.get("jaxpr") or params.get("call_jaxpr") or params.get("fun_jaxpr")
            if sub is None:
                raise _Unsupported(f"{name} without a body")
            return self._closed(sub, invals)
        if name == "optimization_barrier":
            return list(invals)
        x = invals[0] if invals else None
        if name == "slice":
            strides = params["strides"] or (1,) * x.ndim
            index = tuple(slice(s, e, st) for s, e, st in zip(params["start_indices"], params["limit_indices"], strides))
            return [x[index]]
        if name == "squeeze":
            return [np.squeeze(x, axis=tuple(params["dimensions"]))]
        if name in ("reshape", "expand_dims"):
            return [np.reshape(x, out_avals[0].shape)]
        if name == "broadcast_in_dim":
            shape = params["shape"]
            dims = params["broadcast_dimensions"]
            expanded = np.reshape(x, [x.shape[dims.index(d)] if d in dims else 1 for d in range(len(shape))])
            return [np.broadcast_to(expanded, shape).copy()]
        if name == "concatenate":
            return [np.concatenate(invals, axis=params["dimension"])]
        if name == "stack":
            return [np.stack(invals, axis=params["axis"])]
        if name == "unstack":
            axis = params["axis"]
            return [np.take(x, i, axis=axis) for i in range(x.shape[axis])]
        if name == "split":
            bounds = np.cumsum(params["sizes"])[:-1]
            return list(np.split(x, bounds, axis=params["axis"]))
        if name == "transpose":
            return [np.transpose(x, params["permutation"])]
        if name == "rev":
            return [np.flip(x, axis=tuple(params["dimensions"]))]
        if name == "pad":
            return [self._pad(x, invals[1], params["padding_config"])]
        if name == "reduce_sum":
            return [self._reduce(x, params["axes"], "add")]
        if name == "reduce_prod":
            return [self._reduce(x, params["axes"], "mul")]
        if name in ("reduce_max", "reduce_min", "reduce_and", "reduce_or"):
            return [self._reduce(x, params["axes"], name[len("reduce_") :])]
        if name in _CUMULATIVE:
            return [self._cumulative(x, params["axis"], params["reverse"], _CUMULATIVE[name])]
        if name in ("argmax", "argmin") and tuple(params["axes"]) == (0,) and x.ndim == 1:
            return [self._argbest(x, params["index_dtype"], lax.gt_p if name == "argmax" else lax.lt_p)]
        if name == "dot_general":
            return [self._dot_general(invals[0], invals[1], params, out_avals[0].dtype)]
        if name == "gather":
            return [self._gather(x, invals[1], params, out_avals[0].dtype)]
        if name == "dynamic_slice":
            starts = self._starts(invals[1:], x.shape, params["slice_sizes"])
            return [x[tuple(slice(s, s + n) for s, n in zip(starts, params["slice_sizes"]))]]
        if name == "dynamic_update_slice":
            update = invals[1]
            starts = self._starts(invals[2:], x.shape, update.shape)
            out = x.copy()
            out[tuple(slice(s, s + n) for s, n in zip(starts, update.shape))] = update
            return [out]
        if name == "cond":
            index = int(self.constant_values(invals[0], "cond branch indices"))
            branches = params["branches"]
            return self._closed(branches[min(max(index, 0), len(branches) - 1)], invals[1:])
        expansion = _hi_expansion(eqn)
        if expansion is not None:  # a higher-order primitive of JAX ≥ 0.10: its lowering inlined
            return self._closed(expansion, invals)
        if self._all_constant(invals):
            # anything of constants only (the LU factors of a constant matrix, ...) is a constant
            values = [self.constant_values(a, "operands") for a in invals]
            return [self.constant_array(o) for o in _evaluate(eqn.primitive, params, values)]
        if name in _DENSE_LINEAR_ALGEBRA:
            # Above `small_solve`'s unrolled size a solve is a library call on purpose:
            # such a system is past what the scalar graph pays for. Quietly unchanged.
            raise _TooLarge(f"a dense linear-algebra call (`{name}`) on state-dependent values")
        if eqn.effects:
            raise _Unsupported(f"`{name}`, an operation with side effects,")
        # An operation the expansion has no rule for (a `scatter`, a `sort`, a primitive of
        # a newer JAX or of another library): kept whole, the graph simplified around it.
        return self._opaque(eqn, invals, out_avals)

    def _opaque(self, eqn, invals, out_avals):
        """`eqn` kept whole: one node for the operation, one per entry of its outputs."""
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(sub, ClosedJaxpr) and any(is_traced(c) for c in sub.consts):
                    raise _Unsupported(f"`{eqn.primitive.name}` with a traced constant")
        g = self.graph
        arrays = [np.asarray(a) for a in invals]
        ids = tuple(int(i) for a in arrays for i in a.reshape(-1))
        shapes = tuple(a.shape for a in arrays)
        dtypes = tuple(np.dtype(v.aval.dtype) for v in eqn.invars)
        op = _Opaque(eqn.primitive, eqn.params, shapes, dtypes)
        key = ("opaque", eqn.primitive.name, id(eqn), ids)
        node = g._add(key, (op, eqn.params, ids), np.dtype("V8"))
        outs = []
        for position, aval in enumerate(out_avals):
            out = np.empty(aval.shape, dtype=np.int64)
            for index, idx in enumerate(np.ndindex(aval.shape)):
                reader = _OpaqueOutput(position, index)
                out[idx] = g._add(("opaque_output", node, position, index), (reader, {}, (node,)), aval.dtype)
            outs.append(out)
        return outs

    def _closed(self, sub, invals):
        """Inline a called jaxpr (closed, as `jit` gives it, or open, as `checkpoint`)."""
        if not hasattr(sub, "consts"):
            return self.run(sub, [], invals)
        for c in sub.consts:
            if is_traced(c):
                raise _Unsupported("a traced constant inside a call")
        return self.run(sub.jaxpr, [self.constant_array(np.asarray(c)) for c in sub.consts], invals)

    def _starts(self, starts, shape, sizes):
        """Start indices of a dynamic slice, clamped as `lax.dynamic_slice` clamps them."""
        values = [int(self.constant_values(s, "dynamic slice indices")) for s in starts]
        return [min(max(s, 0), n - k) for s, n, k in zip(values, shape, sizes)]

    def _gather(self, operand, indices, params, dtype):
        """A gather with constant indices: the same gather, done on the node ids."""
        indices = self.constant_values(indices, "gather indices")
        params = dict(params)
        fill = params["mode"] == lax.GatherScatterMode.FILL_OR_DROP
        fill_value = params["fill_value"]
        if fill:
            params["fill_value"] = 0
        (shifted,) = _evaluate(lax.gather_p, params, [operand.astype(np.int64) + 1, indices])
        out = np.asarray(shifted, dtype=np.int64) - 1
        if fill and np.any(out < 0):
            value = self._fill_value(np.dtype(dtype), fill_value)
            out = np.where(out < 0, self.graph.const(value), out)
        return out

    def _fill_value(self, dtype, value):
        if value is not None:
            return np.asarray(value, dtype)
        if dtype.kind in "fc":
            return np.asarray(np.nan, dtype)
        if dtype.kind == "b":
            return np.asarray(True)
        return np.asarray(np.iinfo(dtype).min if dtype.kind == "i" else np.iinfo(dtype).max, dtype)

    def _pad(self, x, pad_value, config):
        value = int(np.asarray(pad_value).reshape(()))
        out = x
        for axis, (lo, hi, interior) in enumerate(config):
            if interior:
                n = out.shape[axis]
                shape = list(out.shape)
                shape[axis] = n + (n - 1) * interior if n else 0
                spread = np.full(shape, value, dtype=np.int64)
                index = [slice(None)] * out.ndim
                index[axis] = slice(None, None, interior + 1)
                spread[tuple(index)] = out
                out = spread
            for amount, at_end in ((lo, False), (hi, True)):
                if amount > 0:
                    shape = list(out.shape)
                    shape[axis] = amount
                    block = np.full(shape, value, dtype=np.int64)
                    out = np.concatenate([out, block] if at_end else [block, out], axis=axis)
                elif amount < 0:
                    index = [slice(None)] * out.ndim
                    index[axis] = slice(None, amount) if at_end else slice(-amount, None)
                    out = out[tuple(index)]
        return out

    def _identity(self, how, dtype):
        if how == "add":
            return np.zeros((), dtype)
        if how == "mul":
            return np.ones((), dtype)
        if how in ("and", "or"):
            return np.asarray(how == "and", dtype)
        dtype = np.dtype(dtype)
        if dtype.kind == "f":
            return np.asarray(-np.inf if how == "max" else np.inf, dtype)
        info = np.iinfo(dtype) if dtype.kind in "iu" else None
        if info is None:
            return np.asarray(how == "min", dtype)
        return np.asarray(info.min if how == "max" else info.max, dtype)

    def _sum(self, ids, how, dtype):
        if not ids:
            return self.graph.const(self._identity(how, dtype))
        acc = int(ids[0])
        for i in ids[1:]:
            acc = self.graph.op(_REDUCERS[how], {}, (acc, int(i)), dtype)
        return acc

    def _reduce(self, x, axes, how):
        axes = tuple(axes)
        keep = [d for d in range(x.ndim) if d not in axes]
        moved = np.transpose(x, keep + list(axes))
        lead = moved.shape[: len(keep)]
        moved = moved.reshape(lead + (-1,))
        out = np.empty(lead, dtype=np.int64)
        dtype = self.graph.dtypes[int(moved.reshape(-1)[0])] if moved.size else np.dtype(np.float64)
        for idx in np.ndindex(lead):
            out[idx] = self._sum(list(moved[idx]), how, dtype)
        return out

    def _cumulative(self, x, axis, reverse, how):
        moved = np.moveaxis(x, axis, -1)
        out = np.empty_like(moved)
        for idx in np.ndindex(moved.shape[:-1]):
            row = list(moved[idx])
            order = range(len(row) - 1, -1, -1) if reverse else range(len(row))
            acc = None
            for k in order:
                v = int(row[k])
                acc = v if acc is None else self.graph.op(_REDUCERS[how], {}, (acc, v), self.graph.dtypes[v])
                out[idx + (k,)] = acc
        return np.moveaxis(out, -1, axis)

    def _argbest(self, x, index_dtype, better_p):
        """The first index of the largest (smallest) entry, as comparisons and selects."""
        g = self.graph
        best_value, best_index = int(x[0]), g.const(np.zeros((), index_dtype))
        for i in range(1, x.shape[0]):
            better = g.op(better_p, {}, (int(x[i]), best_value), np.bool_)
            best_index = g.op(lax.select_n_p, {}, (better, best_index, g.const(np.asarray(i, index_dtype))), index_dtype)
            best_value = g.op(lax.select_n_p, {}, (better, best_value, int(x[i])), g.dtypes[best_value])
        return np.asarray(best_index, dtype=np.int64)

    def _dot_general(self, lhs, rhs, params, dtype):
        (lc, rc), (lb, rb) = params["dimension_numbers"]
        lf = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
        rf = [d for d in range(rhs.ndim) if d not in rc and d not in rb]
        l = np.transpose(lhs, list(lb) + lf + list(lc))
        r = np.transpose(rhs, list(rb) + rf + list(rc))
        nb = len(lb)
        bshape = l.shape[:nb]
        lfs = l.shape[nb : nb + len(lf)]
        rfs = r.shape[nb : nb + len(rf)]
        l = l.reshape(bshape + lfs + (-1,))
        r = r.reshape(bshape + rfs + (-1,))
        out = np.empty(bshape + lfs + rfs, dtype=np.int64)
        g = self.graph
        for b in np.ndindex(bshape):
            for i in np.ndindex(lfs):
                for j in np.ndindex(rfs):
                    terms = [g.op(lax.mul_p, {}, (int(u), int(v)), dtype) for u, v in zip(l[b + i], r[b + j])]
                    out[b + i + j] = self._sum(terms, "add", dtype)
        return out


class _Plan:
    """An expanded, simplified graph, ready to be emitted on new input arrays."""

    def __init__(self, graph, outputs, leaves, order, guard, unguarded, custom_rules):
        self.graph = graph
        self.outputs = outputs  # arrays of node ids, one per output leaf
        self.leaves = leaves  # (source, position, index) of every leaf node
        self.order = order  # the operation nodes to evaluate, in order
        self.guard = guard  # (kind, node) of the removed subexpressions to check
        self.unguarded = unguarded  # output nodes that are non-finite whenever the check is
        self.custom_rules = custom_rules
        self.memo = {}  # what emission and derivatives read off the plan, computed once


class _Fallback:
    def __init__(self, reason, quiet):
        self.reason = reason
        self.quiet = quiet


def _build(closed, flat_args):
    """Expand and simplify `closed` on `flat_args`: a `_Plan`, or a `_Fallback`."""
    graph = _Graph()
    expander = _Expander(graph)
    leaves = []

    def inputs(source, values, varying):
        out = []
        for position, value in enumerate(values):
            if not is_traced(value):
                out.append(expander.constant_array(np.asarray(value)))
                continue
            ids = np.empty(jnp.shape(value), dtype=np.int64)
            for idx in np.ndindex(ids.shape):
                ids[idx] = graph.leaf(len(leaves), value.dtype, varying)
                leaves.append((source, position, idx))
            out.append(ids)
        return out

    try:
        arrays = inputs("arg", flat_args, True)
        consts = inputs("const", closed.consts, False)
        outputs = expander.run(closed.jaxpr, consts, arrays)
        roots = [int(i) for o in outputs for i in np.asarray(o).reshape(-1)]
        guard, unguarded = _prune(graph, sorted(graph.dropped, key=lambda d: d[1]), roots)
        needed = _ancestors(graph, roots + [t for _, t in guard])
    except _TooLarge as e:
        return _Fallback(str(e), quiet=True)
    except _Unsupported as e:
        return _Fallback(f"it holds {e}, which the scalar expansion does not handle", quiet=False)
    except Exception as e:  # noqa: BLE001  (any failure of the expansion: evaluate unchanged)
        return _Fallback(f"its expansion failed ({type(e).__name__}: {e})", quiet=False)
    order = [i for i in sorted(needed) if not isinstance(graph.nodes[i][0], str)]
    if len(order) + 2 * len(guard) > MAX_OPERATIONS:
        return _Fallback(f"more than MAX_OPERATIONS = {MAX_OPERATIONS} scalar operations", quiet=True)
    return _Plan(graph, outputs, leaves, order, guard, unguarded, expander.custom_rules)


def _ancestors(graph, roots):
    needed = set()
    stack = list(roots)
    while stack:
        i = stack.pop()
        if i in needed:
            continue
        needed.add(i)
        node = graph.nodes[i]
        if not isinstance(node[0], str):
            stack.extend(node[2])
    return needed


def _deps(plan, nodes) -> set:
    """The inputs `(source, position)` the nodes depend on ("arg": an argument of the
    function, "const": a traced constant of its jaxpr)."""
    out = set()
    for a in _ancestors(plan.graph, nodes):
        node = plan.graph.nodes[a]
        if node[0] == "leaf":
            source, position, _ = plan.leaves[node[1]]
            out.add((source, position))
    return out


# An operand that is ±inf or NaN makes the result of these non-finite (inf·0 = NaN,
# inf − inf = NaN, sin(±inf) = NaN); for `div` and positive `integer_pow` only the first
# operand does (x/inf = 0).
_PROPAGATE = {"add", "add_any", "sub", "mul", "neg", "sqrt", "square", "sin", "cos", "stop_gradient", "copy", "copy_p"}
_PROPAGATE_FIRST = {"div", "integer_pow"}


def _propagating_operands(graph, i):
    node = graph.nodes[i]
    if isinstance(node[0], str):
        return ()
    name = node[0].name
    if name in _PROPAGATE:
        return node[2]
    if name in _PROPAGATE_FIRST and (name == "div" or node[1]["y"] > 0):
        return node[2][:1]
    return ()


def _prune(graph, guard, roots):
    """The removed subexpressions that still need checking, and the output nodes that
    need no guard.

    A removed `t` need not be checked when its non-finite value reaches, through
    NaN-propagating arithmetic only, another checked node or a floating-point output: the
    outputs are then non-finite without the check (the output vector, not necessarily
    each entry the function as written would have made non-finite). An output that
    every checked node reaches that way needs no guard added.
    """
    finite = {t for kind, t in guard if kind == "finite"}

    def reached(starts):
        seen = set()
        stack = list(starts)
        while stack:
            i = stack.pop()
            if i not in seen:
                seen.add(i)
                stack.extend(_propagating_operands(graph, i))
        return seen

    floating = list(dict.fromkeys(r for r in roots if graph.dtypes[r].kind == "f"))
    reach = {r: reached([r]) & finite for r in floating}
    # A removed node that reaches an output shows there when it is non-finite. (Asking
    # that it reach every output cost the knife-edge feedback field 13 of its 89
    # operations and made it slower than the hand-written field; so, as fast.)
    covered = set.union(*reach.values()) if reach else set()
    # a node reaching another checked node is covered by it
    for t in sorted(finite - covered, reverse=True):
        if t not in covered:
            covered |= reached(_propagating_operands(graph, t)) & finite
    guard = [(kind, t) for kind, t in guard if not (kind == "finite" and t in covered)]
    checked = {t for kind, t in guard}
    # an output reached by every checked node is non-finite whenever the check is
    unguarded = {r for r in floating if all(kind == "finite" for kind, _ in guard) and checked <= reach[r]}
    return guard, unguarded


def _emit(plan: _Plan, flat_args, consts, out_avals, linear=None, allowed=None):
    """Evaluate the plan's nodes as scalar JAX operations on the current inputs.

    `linear`: for the tangent map of a JVP rule, the position of its first tangent
    argument (its arguments are the primals, then the tangents): see the guard below.
    `allowed` (with `linear`): per output, the input positions its primal depends on;
    the output's guard then holds only the terms that read no other input (`_deps`)."""
    graph = plan.graph
    sources = {"arg": flat_args, "const": consts}
    values = {}

    def value(i):
        found = values.get(i)
        if found is not None:
            return found
        node = graph.nodes[i]
        if node[0] == "const":
            return node[1]  # a numpy scalar: a literal XLA can fold
        source, position, idx = plan.leaves[node[1]]
        array = sources[source][position]
        values[i] = array[idx] if idx else array  # each leaf is one node, so sliced once
        return values[i]

    # Divisions that share a denominator: one reciprocal, then products (a division costs
    # several multiplications, and the results differ by at most an ulp).
    denominators = Counter(
        graph.nodes[i][2][1]
        for i in plan.order
        if graph.nodes[i][0].name == "div" and graph.value(graph.nodes[i][2][0]) != 1
    )
    reciprocals = {}
    for i in plan.order:
        prim, params, args = graph.nodes[i]
        operands = [value(a) for a in args]
        if isinstance(prim, _Opaque):
            values[i] = prim.emit(operands)
            continue
        if isinstance(prim, _OpaqueOutput):
            values[i] = values[args[0]][prim.position].reshape(-1)[prim.index]
            continue
        if prim.name == "div" and denominators.get(args[1], 0) > 1 and graph.value(args[0]) != 1:
            inverse = reciprocals.get(args[1])
            if inverse is None:
                inverse = reciprocals[args[1]] = 1.0 / operands[1]
            values[i] = operands[0] * inverse
            continue
        if prim.name in _PLAIN:
            values[i] = _PLAIN[prim.name](*operands)
        else:
            values[i] = prim.bind(*operands, **params)
    # The guard: one check over the removed subexpressions. In the tangent map of a JVP
    # rule (`linear`), the terms that read a tangent stay differentiable: they are
    # linear, and reverse mode transposes them.
    terms = []  # (term, the input positions it reads)
    if "guard reads" not in plan.memo:
        plan.memo["guard reads"] = [_deps(plan, [t]) for _, t in plan.guard]
    for (kind, t), reads in zip(plan.guard, plan.memo["guard reads"]):
        v = value(t)
        term = v - v if kind == "finite" else jnp.zeros((), graph.dtypes[t]) / v
        reads_tangent = linear is not None and any(source == "arg" and p >= linear for source, p in reads)
        terms.append((term if reads_tangent else lax.stop_gradient(term), reads))
    checks = {}  # the sum of each distinct selection of terms, formed once

    def check_for(o):
        if allowed is None:
            chosen = tuple(range(len(terms)))
        else:
            # Under `vmap` an output must be batched exactly where its primal is (JAX lays
            # out a custom_jvp's outputs by its rule's, but stages them by its function's):
            # a term reading the tangent of an input the primal does not depend on would
            # batch the tangent alone. Such terms only carry 0·ẋ of those inputs.
            chosen = tuple(
                k for k, (_, reads) in enumerate(terms)
                if all((p if p < linear else p - linear) in allowed[o] for source, p in reads if source == "arg")
            )
        if chosen not in checks:
            checks[chosen] = sum((terms[k][0] for k in chosen[1:]), terms[chosen[0]][0]) if chosen else None
        return checks[chosen]

    results = []
    for o, (ids, aval) in enumerate(zip(plan.outputs, out_avals)):
        ids = np.asarray(ids)
        if ids.size == 0:
            results.append(jnp.zeros(aval.shape, aval.dtype))
            continue
        check = check_for(o) if terms else None
        guarded = (
            check is not None
            and jnp.issubdtype(aval.dtype, jnp.inexact)
            and any(int(i) not in plan.unguarded for i in ids.reshape(-1))
        )
        entries = [jnp.asarray(value(int(i)), dtype=aval.dtype) for i in ids.reshape(-1)]
        # a scalar output is its one entry (no stacking: under `vmap` it stays one row)
        out = entries[0] if ids.ndim == 0 else jnp.stack(entries)
        # One add per output array, not one per entry: under `vmap` XLA copies the check
        # into every consumer, and per entry that made the vmapped spherical-pendulum
        # feedback field slower against the hand-written one (benchmarks/derived_vs_hand.py).
        results.append((out + check.astype(aval.dtype) if guarded else out).reshape(aval.shape))
    return results


_cache: "OrderedDict[object, _Plan | _Fallback]" = OrderedDict()
_stats = {"hits": 0, "misses": 0}
_warned: set = set()  # (function, reason) already warned about


def clear_cache():
    """Forget every expanded graph (and which fallbacks were warned about)."""
    _cache.clear()
    _warned.clear()
    _stats.update(hits=0, misses=0)


def cache_info():
    """{"hits", "misses", "size"} of the cache of expanded graphs."""
    return dict(_stats, size=len(_cache))


def _digest(value) -> str:
    array = np.asarray(value)
    return f"{array.dtype.str}{array.shape}" + hashlib.blake2b(np.ascontiguousarray(array).tobytes(), digest_size=16).hexdigest()


def _nested_consts(jaxpr, out):
    """Digests of the constants of every closed jaxpr inside `jaxpr` (not printed with it)."""
    for eqn in jaxpr.eqns:
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(sub, ClosedJaxpr):
                    for c in sub.consts:
                        out.append("tracer" + str(jax.typeof(c)) if is_traced(c) else _digest(c))
                    _nested_consts(sub.jaxpr, out)
                elif isinstance(sub, Jaxpr):
                    _nested_consts(sub, out)
    return out


def _cache_key(closed, flat_args, in_tree, out_tree):
    """What the expansion depends on: the jaxpr's structure and literals, the values of
    its concrete constants and inputs (folded into the graph), the shapes and dtypes of
    the traced ones (leaves of the graph), and the limits."""
    parts = [str(closed.jaxpr), str(in_tree), str(out_tree), MAX_NODES, MAX_OPERATIONS]
    for value in (*flat_args, *closed.consts):
        if is_traced(value):
            parts.append(("leaf", jnp.shape(value), str(value.dtype)))
        else:
            parts.append(_digest(value))
    parts.append(tuple(_nested_consts(closed.jaxpr, [])))
    return hashlib.blake2b(repr(parts).encode(), digest_size=20).hexdigest()


def _describe(fn) -> str:
    inner = getattr(fn, "__func__", fn)
    name = getattr(inner, "__qualname__", None) or type(fn).__qualname__
    owner = getattr(fn, "__self__", None)
    if owner is not None and not name.startswith(type(owner).__qualname__):
        name = f"{type(owner).__qualname__}.{name}"
    return name


def scalar_graph(fn: Callable, *args, warn: bool = True, enabled: bool = True):
    """`fn(*args)`, evaluated through its simplified scalar expression graph.

    **Arguments:**

    - `fn`: a function of arrays (a pytree of arrays out).
    - `args`: the arrays (pytrees of arrays) to evaluate it at; concrete (untraced)
      arrays are folded into the graph as constants.
    - `warn`: warn (once) when `fn` holds an operation the expansion does not handle.
    - `enabled`: False evaluates `fn(*args)` as it is (the `simplify` option of the
      field or step that calls this).

    **Returns:**

    The value of `fn(*args)`. When `enabled` is False, when `fn` holds an
    operation the expansion does not handle (with a warning, once), or when it exceeds one
    of the size limits (`MAX_INPUTS`, `MAX_NODES`, `MAX_OPERATIONS`), `fn(*args)` itself.

    Example: `scalar_graph(jax.grad(lambda x: 0.5 * x @ x), x)` is `x` itself, with no
    arithmetic left.
    """
    if not enabled:
        return fn(*args)
    return _simplified_call(fn, args, warn)


def _simplified_call(fn, args, warn: bool, linear=None, fallback=None, allowed=None):
    """`scalar_graph`'s work. `linear` (the position of the first tangent argument): `fn`
    is the tangent map `(primals, tangents) ↦ tangent outputs` of a JVP rule, emitted as
    it is (no derivative rule of its own) with the guard's tangent terms left
    differentiable, so that reverse mode can transpose it (see `_emit`). `fallback`: what
    is evaluated instead of `fn` where the graph is not simplified (default `fn`)."""
    fallback = fn if fallback is None else fallback
    flat_args, in_tree = jax.tree_util.tree_flatten(args)
    specs = [jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)) for a in flat_args]
    if sum(int(np.prod(spec.shape)) for spec in specs) > MAX_INPUTS:
        return fallback(*args)

    def flat_fn(*flat):
        return fn(*jax.tree_util.tree_unflatten(in_tree, flat))

    closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*specs)
    out_leaves, out_tree = jax.tree_util.tree_flatten(out_shape)
    if _input_size(specs, closed.consts) > MAX_INPUTS:
        # Traced values `fn` closes over (a network's weights under `jax.grad`) are
        # inputs of the graph as much as its arguments: expanded, every weight becomes a
        # scalar input, and its derivative a term per weight (a 2×16 network's training
        # step compiled 8× slower).
        if fallback is not fn:
            return fallback(*args)
        results = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *flat_args)
        return jax.tree_util.tree_unflatten(out_tree, results)
    key = _cache_key(closed, flat_args, in_tree, out_tree)
    plan = _cache.get(key)
    if plan is None:
        _stats["misses"] += 1
        plan = _build(closed, flat_args)
        _cache[key] = plan
        if len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
        if warn and isinstance(plan, _Fallback) and not plan.quiet and (key, plan.reason) not in _warned:
            _warned.add((key, plan.reason))
            warnings.warn(
                f"geomjax: {_describe(fn)} is evaluated without scalar-graph simplification "
                f"(so it runs slower): {plan.reason}",
                stacklevel=3,
            )
    else:
        _stats["hits"] += 1
        _cache.move_to_end(key)
    if isinstance(plan, _Fallback) and fallback is not fn:
        return fallback(*args)
    if isinstance(plan, _Fallback):
        # The jaxpr traced above, evaluated as it is: tracing `fn` again would double the
        # cost of lowering fields too large for the pass.
        results = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *flat_args)
        return jax.tree_util.tree_unflatten(out_tree, results)
    consts = list(closed.consts)
    if linear is not None:
        results = _emit(plan, list(flat_args), consts, out_leaves, linear, allowed)
    else:
        results = _with_simplified_derivatives(plan, closed, list(flat_args), consts, out_leaves)
    return jax.tree_util.tree_unflatten(out_tree, results)


def _input_size(specs, consts) -> int:
    """The graph's input scalars: the arguments' and those of the traced values the
    function closes over (concrete ones are folded in as constants)."""
    traced = sum(int(np.prod(jnp.shape(c))) for c in consts if is_traced(c))
    return sum(int(np.prod(spec.shape)) for spec in specs) + traced


def _primal_deps(plan, traced, n_args, out_avals) -> list:
    """Per output of the emitted graph, the positions in `traced` (the traced inputs, by
    index into arguments + constants) it depends on, its guard included."""
    key = ("primal deps", tuple(traced), n_args)
    if key in plan.memo:
        return plan.memo[key]
    position = {v: k for k, v in enumerate(traced)}
    guard = _deps(plan, [t for _, t in plan.guard]) if plan.guard else set()
    out = []
    for ids, aval in zip(plan.outputs, out_avals):
        flat = [int(i) for i in np.asarray(ids).reshape(-1)]
        reads = _deps(plan, flat)
        if guard and jnp.issubdtype(aval.dtype, jnp.inexact) and any(i not in plan.unguarded for i in flat):
            reads |= guard
        indices = (p if source == "arg" else n_args + p for source, p in reads)
        out.append({position[i] for i in indices if i in position})
    plan.memo[key] = out
    return out


def _zero_tangent(t):
    """A symbolic zero tangent as a concrete (host) zero: the derivative's graph folds it."""
    if isinstance(t, SymbolicZero):
        return np.zeros(t.aval.shape, t.aval.dtype)
    return t


def _with_simplified_derivatives(plan, closed, flat_args, consts, out_leaves):
    """The emitted graph, whose JVP is again a simplified scalar graph.

    Differentiated as it is, the emitted graph's JVP (and its transpose in reverse mode)
    carries what the primal graph no longer does: the derivative of every operation with
    its constant factors, the same partial derivative formed in several tangent terms.
    The JVP rule instead expands and simplifies `jax.jvp` of the original jaxpr (custom
    derivative rules included), with zero tangents and concrete inputs folded in as
    constants; reverse mode transposes that simplified linear graph. (The JVP of the
    original simplifies further than the JVP of the emitted graph, whose shared
    reciprocals and collected terms no longer cancel against their derivatives: a
    tuning iteration ran 1.3× slower that way.) The rule's primal outputs are the
    emitted graph's, the values of an undifferentiated call. Where the JVP's graph
    exceeds the size limits, the rule is the plain `jax.jvp` of the emitted graph, or of
    the original jaxpr where that holds custom derivative rules (the emitted graph inlines
    them, and differentiating a Newton loop's iterations cannot be transposed).
    """
    values = list(flat_args) + list(consts)
    traced = [i for i, v in enumerate(values) if is_traced(v)]
    n_args = len(flat_args)

    def full(inputs):
        # Concrete inputs stay closed over, so the JVP's graph folds them as constants.
        out = list(values)
        for i, v in zip(traced, inputs):
            out[i] = v
        return out[:n_args], out[n_args:]

    def original(inputs):
        args, cs = full(inputs)
        return jax.core.eval_jaxpr(closed.jaxpr, cs, *args)

    def emitted(inputs):
        return _emit(plan, *full(inputs), out_leaves)

    @jax.custom_jvp
    def simplified(inputs):
        return emitted(inputs)

    def _jvp(primals, tangents):
        tangents = jax.tree_util.tree_map(_zero_tangent, tangents, is_leaf=lambda t: isinstance(t, SymbolicZero))
        out_tangents = _simplified_call(
            lambda p, t: jax.jvp(original, p, t)[1], (primals, tangents), False,
            linear=len(traced), fallback=lambda p, t: jax.jvp(original if plan.custom_rules else emitted, p, t)[1],
            allowed=_primal_deps(plan, traced, n_args, out_leaves),
        )
        # The primal outputs are the function's own call: under `vmap` JAX lays out a
        # custom_jvp's outputs by the batch axes of its rule's primal outputs but stages
        # them by its function's (JAX 0.10), so the two must be the same computation
        # (`emitted` evaluated again can batch differently inside the rule's graph: a
        # `jax.grad` of a `vmap` over gains read the invariants transposed). Only a
        # higher derivative differentiates this inner call.
        return simplified(*primals), out_tangents

    simplified.defjvp(_jvp, symbolic_zeros=True)
    return simplified([values[i] for i in traced])
