"""Numbers that user functions close over, hoisted out of compiled programs' keys.

A loss such as

    def loss(g):
        system = geomjax.System(lambda x: 0.5 * x[3:] @ x[3:] + g * x[2], ...)
        return geomjax.integrate(geomjax.dirac_field(system), x0, ...).x_final[2]

builds a new function at every call. A compiled program is keyed by the functions it
runs, so called eagerly (`loss(9.81)`, `jax.grad(loss)(9.81)`) every call would compile
anew, though only the number `g` changed. Here each plain Python function among a field's
or step's static leaves is replaced by a `FunctionTemplate`: its code, its globals, its
defaults and the contents of its closure cells, where a cell holding a float scalar or a
small float array (a Python float, a NumPy or JAX array, or a tracer of an enclosing
transformation) is a slot for a value passed to the program as an argument, and a cell
holding a function is a template in turn. Two closures of the same code over different
numbers of the same shape then have equal templates, so they share one program; inside
it, the functions are rebuilt with the traced numbers in their cells.

What is never reused: a program for other code (code objects compare by value, with
their constants), for other values of the globals the code reads (numbers and small NumPy
arrays by value, immutable objects by identity), other defaults, or for a cell holding
another object (immutable ones by identity: another System, a JAX array, a module), for
numbers of another shape or dtype, or for integers and booleans (kept by value: they may
set shapes and Python control flow). A function that reaches anything that may change in
place (a list, a dict, a large NumPy array, an arbitrary object) gets no template: it
stays keyed by its identity, as every function was before. A function that needs a closed-over float as a Python number (in
`if g > 0:`, `np.sqrt(g)`, a shape) cannot take it traced: that is found at the first
trace (`_TRACE_ERRORS`), and its template is then marked to keep its numbers in the key,
as before.
"""

import types

import equinox as eqx
import jax
import numpy as np

#: Closed-over float arrays up to this many elements are hoisted; larger ones stay in the
#: key by identity (their values may be read at trace time, e.g. a sparsity pattern).
MAX_HOISTED_SIZE = 64


def _hoistable(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return True
    if isinstance(value, (np.ndarray, np.floating, jax.Array)):
        dtype = np.dtype(value.dtype)
        return np.issubdtype(dtype, np.floating) and int(np.size(value)) <= MAX_HOISTED_SIZE
    return False


def _aval(value):
    if isinstance(value, float):
        return ("python float",)
    return (tuple(np.shape(value)), str(np.dtype(value.dtype)))


class _Same:
    """A cell's content kept in the key by identity (kept alive, so its id is not reused)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, _Same) and other.value is self.value

    def __hash__(self):
        return id(self.value)


#: Global NumPy arrays up to this many elements are keyed by their contents (they may be
#: changed in place between calls); larger ones by identity.
MAX_HASHED_GLOBAL_SIZE = 10_000


def _names(code) -> set:
    """The names `code` and the code objects nested in it look up (globals among them)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _immutable(value) -> bool:
    """Whether `value` cannot change in place, so that identity keys it: modules, functions,
    classes, numbers, strings, JAX arrays, equinox modules, and tuples of these."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, type, types.ModuleType,
                                           types.FunctionType, types.BuiltinFunctionType, np.dtype, jax.Array,
                                           eqx.Module)):
        return True
    return isinstance(value, tuple) and all(_immutable(v) for v in value)


class _Mutable(Exception):
    """A function reads something that may change in place: it gets no template."""


def _global_value(value):
    if value is None or isinstance(value, (bool, int, float, complex, str)):
        return ("value", type(value), value)
    if isinstance(value, np.ndarray) and value.size <= MAX_HASHED_GLOBAL_SIZE:
        return ("array", value.shape, str(value.dtype), value.tobytes())
    if not _immutable(value):
        raise _Mutable
    return ("same", _Same(value))


def _globals_read(code, namespace) -> tuple:
    """The global values the function's code reads, as a key: a global rebound (or a small
    NumPy array changed in place) between two calls gives another key, so another program.
    Raises `_Mutable` for a global that could change in place unseen (a list, a dict, a
    large array, an object)."""
    return tuple((name, _global_value(namespace[name])) for name in sorted(_names(code)) if name in namespace)


class FunctionTemplate:
    """A plain Python function with its hoistable closed-over numbers taken out: equal
    for functions of the same code, globals and defaults whose cells differ only in the
    values of those numbers. `rebuild(values)` makes the function anew with `values`
    (an iterator) in the slots, in order."""

    __slots__ = ("code", "globals", "read", "name", "defaults", "kwdefaults", "cells", "_hash")

    def __init__(self, fn, cells):
        self.code = fn.__code__
        self.globals = _Same(fn.__globals__)
        self.read = _globals_read(fn.__code__, fn.__globals__)
        self.name = fn.__name__
        self.defaults = _Same(fn.__defaults__) if fn.__defaults__ is not None else None
        self.kwdefaults = _Same(fn.__kwdefaults__) if fn.__kwdefaults__ else None
        self.cells = cells
        self._hash = hash((self.code, self.globals, self.read, self.cells))

    def __eq__(self, other):
        return (isinstance(other, FunctionTemplate) and self._hash == other._hash and self.code == other.code
                and self.globals == other.globals and self.read == other.read and self.defaults == other.defaults
                and self.kwdefaults == other.kwdefaults and self.cells == other.cells)

    def __hash__(self):
        return self._hash

    def rebuild(self, values):
        cells = []
        for kind, content in self.cells:
            if kind == "slot":
                cells.append(types.CellType(next(values)))
            elif kind == "function":
                cells.append(types.CellType(content.rebuild(values)))
            elif kind == "value":
                cells.append(types.CellType(content[1]))
            else:
                cells.append(types.CellType(content.value))
        fn = types.FunctionType(self.code, self.globals.value, self.name,
                                None if self.defaults is None else self.defaults.value, tuple(cells))
        if self.kwdefaults is not None:
            fn.__kwdefaults__ = self.kwdefaults.value
        return fn


def _template(fn, values: list, seen: set):
    """`fn`'s template, its hoisted numbers appended to `values`; None where `fn` holds no
    hoistable number (it then stays as it is)."""
    if id(fn) in seen or fn.__closure__ is None:
        return None
    seen = seen | {id(fn)}
    cells, mine, hoisted = [], [], False
    for cell in fn.__closure__:
        try:
            content = cell.cell_contents
        except ValueError:  # an empty cell (a name assigned after the function was made)
            return None
        if _hoistable(content):
            cells.append(("slot", _aval(content)))
            mine.append(content)
            hoisted = True
        elif isinstance(content, types.FunctionType):
            inner = _template(content, mine, seen)
            cells.append(("function", inner) if inner is not None else ("same", _Same(content)))
            hoisted = hoisted or inner is not None
        elif content is None or isinstance(content, (bool, int, str)):
            cells.append(("value", (type(content), content)))  # by value: True and 1 differ
        elif _immutable(content):
            cells.append(("same", _Same(content)))
        else:  # a list, a dict, an object: it may change in place, so the function keeps its identity
            return None
    if not hoisted:
        return None
    try:
        template = FunctionTemplate(fn, tuple(cells))
    except _Mutable:
        return None
    values.extend(mine)
    return template


#: Templates whose function could not take its numbers traced: kept in the key by value.
_REFUSED: set = set()


def hoist(leaves) -> tuple[list, list]:
    """`(leaves with each plain function that closes over hoistable numbers replaced by
    its template, the hoisted numbers in order)`; Python floats among the numbers become
    0-d float64 NumPy arrays (arguments, never static)."""
    out, values = [], []
    for leaf in leaves:
        if isinstance(leaf, types.FunctionType):
            mine: list = []
            template = _template(leaf, mine, set())
            if template is not None and template not in _REFUSED:
                out.append(template)
                values.extend(np.asarray(v, np.float64) if isinstance(v, float) else v for v in mine)
                continue
        out.append(leaf)
    return out, values


def restore(leaves, values) -> list:
    """The leaves with their templates rebuilt from `values` (in the order of `hoist`)."""
    it = iter(values)
    return [leaf.rebuild(it) if isinstance(leaf, FunctionTemplate) else leaf for leaf in leaves]


def hoist_trees(trees) -> tuple[tuple, list]:
    """`hoist` over the leaves of several pytrees: `(trees with templates, numbers)`."""
    out, values = [], []
    for tree in trees:
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        hoisted, mine = hoist(leaves)
        out.append(jax.tree_util.tree_unflatten(treedef, hoisted) if mine else tree)
        values.extend(mine)
    return tuple(out), values


def restore_trees(trees, values) -> tuple:
    """The trees of `hoist_trees` with their functions rebuilt from `values`."""
    it = iter(values)
    out = []
    for tree in trees:
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        if any(isinstance(leaf, FunctionTemplate) for leaf in leaves):
            tree = jax.tree_util.tree_unflatten(
                treedef, [leaf.rebuild(it) if isinstance(leaf, FunctionTemplate) else leaf for leaf in leaves])
        out.append(tree)
    return tuple(out)


def refuse(leaves) -> None:
    """Mark the templates among `leaves` as not hoistable (their function needed a number
    as a Python value at trace time)."""
    _REFUSED.update(leaf for leaf in leaves if isinstance(leaf, FunctionTemplate))


def clear() -> None:
    _REFUSED.clear()
