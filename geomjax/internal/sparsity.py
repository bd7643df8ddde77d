"""Structural Jacobian sparsity, read off the jaxpr at trace time, in memory O(nnz).

`jacobian_sparsity(fn, n)` traces `fn: R^n -> R^m` to a jaxpr and propagates, entry by
entry, the set of inputs each intermediate entry depends on. A set is stored sparsely: a
`Pattern` holds, for each entry (row-major), the sorted input indices it may depend on
(padded with −1), or a mark `full` for "every input". A 100 × 100 cloth's constraints
(19 800 rows, 20 000 inputs, 4 nonzeros a row) take a few hundred kB, where a dense
boolean pattern would take 400 MB per intermediate. `jacobian_pattern` gives the dense
(m, n) boolean array, for small systems.

The pattern is *structural*: an entry marked absent is zero for every input, because the
output does not depend on that input through any path of the graph. It is sound (never
misses a dependence):

- elementwise and reduction primitives have exact entrywise rules;
- data movement (reshape, squeeze, transpose, broadcast, slice, pad, concatenate, stack,
  rev, split) moves the sets with the entries; `gather`, `dynamic_slice` and
  `dynamic_update_slice` do so too when their indices are known at trace time (constants,
  and what is folded from them: the edge list of `q[E[:, 0]] − q[E[:, 1]]`), and
  `scatter-add` (the transpose of a gather, in every reverse-mode gradient of one) unions
  each update's set into the entry it lands on;
- `dot_general` and `mul` use the zero pattern of operands whose values are known at trace
  time, so multiplying by a constant sparse matrix keeps its sparsity;
- calls (`pjit`, `custom_jvp_call`, `custom_vjp_call`, `remat`, `closed_call`) are entered;
- every other primitive (control flow, linear algebra, sort, gathers with traced indices,
  ...) is treated as dense: each of its outputs depends on everything any of its inputs
  depends on.

Values are never sampled, so coincidental zeros cannot hide a dependence (unlike a pattern
taken from `jax.jacfwd` at random states).

Also here: `greedy_coloring` (columns that share no row get one colour, so one
Jacobian-vector product evaluates all of them at once: Curtis–Powell–Reed),
`Pattern.coloring` for the same on a sparse pattern, and `bandwidth`.
"""

import string

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Literal
from .._validate import is_traced

_ELEMENTWISE = {
    "add", "add_any", "sub", "mul", "div", "neg", "sign", "floor", "ceil", "round", "is_finite",
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan", "asin",
    "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "atan2", "sqrt", "rsqrt", "cbrt",
    "pow", "integer_pow", "square", "abs", "max", "min", "rem", "select_n", "clamp",
    "convert_element_type", "copy", "copy_p", "erf", "erfc", "erf_inv", "lgamma", "digamma",
    "real", "imag", "conj", "complex", "nextafter", "eq", "ne", "lt", "le", "gt", "ge", "and",
    "or", "not", "xor", "stop_gradient", "reduce_precision", "optimization_barrier",
}
_REDUCTIONS = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin",
               "reduce_and", "reduce_or"}
_CALLS = ("pjit", "jit", "closed_call", "core_call", "remat", "checkpoint",
          "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr")
_CALL_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")
_SCATTERS = ("scatter-add", "scatter_add", "scatter", "scatter-mul", "scatter_mul", "scatter-min",
             "scatter_min", "scatter-max", "scatter_max")
_FOLD_LIMIT = 1 << 16  # fold constants up to this many entries
#: A set with more inputs than this is stored as "every input" (sound, and it bounds memory).
_ROW_CAP = 4096
#: The most (entry, candidate) pairs a rule enumerates; beyond, the rule's outputs are dense.
_WORK_CAP = 1 << 24


class Pattern:
    """Sparse dependence sets of the entries of an array of `shape`, over `n` inputs.

    `idx` (size, w): entry e may depend on the inputs `idx[e][idx[e] >= 0]` (sorted, no
    repeats, −1 pads); `full` (size,): entry e may depend on every input. Used for the
    intermediate values of the analysis and for the Jacobian patterns it returns (then
    `shape = (m,)`: row i is the set of inputs output i may depend on).
    """

    __slots__ = ("shape", "idx", "full", "n")

    def __init__(self, shape, idx, full, n):
        self.shape = tuple(int(s) for s in shape)
        self.idx = idx
        self.full = full
        self.n = int(n)

    # ----------------------------------------------------------------- construction
    @classmethod
    def empty(cls, shape, n):
        size = int(np.prod(shape, dtype=np.int64))
        return cls(shape, np.zeros((size, 0), np.int64), np.zeros(size, bool), n)

    @classmethod
    def identity(cls, n):
        return cls((n,), np.arange(n, dtype=np.int64)[:, None], np.zeros(n, bool), n)

    @classmethod
    def from_dense(cls, dense):
        """The pattern of a boolean matrix (m, n)."""
        dense = np.asarray(dense, bool)
        m, n = dense.shape
        rows, cols = np.nonzero(dense)
        idx, full = _canonical(grouped(rows, cols, m), np.zeros(m, bool), n)
        return cls((m,), idx, full, n)

    @property
    def size(self):
        return self.idx.shape[0]

    def reshaped(self, shape):
        return Pattern(shape, self.idx, self.full, self.n)

    # ----------------------------------------------------------------- operations
    def select(self, src, shape):
        """Entry e of the result is entry `src[e]` of this one (none where src[e] < 0)."""
        src = np.asarray(src, np.int64).reshape(-1)
        ok = src >= 0
        safe = np.where(ok, src, 0)
        idx = np.where(ok[:, None], self.idx[safe], -1) if self.idx.shape[1] else self.idx[safe]
        return Pattern(shape, idx, self.full[safe] & ok, self.n)

    def masked(self, keep):
        """Sets emptied where `keep` (per entry) is False."""
        keep = np.asarray(keep, bool).reshape(-1)
        return Pattern(self.shape, np.where(keep[:, None], self.idx, -1), self.full & keep, self.n)

    def count(self):
        """How many inputs each entry may depend on."""
        return np.where(self.full, self.n, (self.idx >= 0).sum(axis=1))

    def dense(self):
        """The boolean array `shape + (n,)`."""
        out = np.zeros((self.size, self.n), bool)
        rows, cols = np.nonzero(self.idx >= 0)
        out[rows, self.idx[rows, cols]] = True
        out[self.full] = True
        return out.reshape(self.shape + (self.n,))

    def nonzeros(self):
        """(rows, cols) of the possible nonzeros of a 2-D (m, n) pattern (no full rows)."""
        if self.full.any():
            raise ValueError("the pattern has dense rows")
        rows, slots = np.nonzero(self.idx >= 0)
        return rows, self.idx[rows, slots]

    def transpose(self):
        """The (n, m) pattern of a 2-D (m, n) one (full rows give every column)."""
        rows, cols = np.nonzero(self.idx >= 0)
        vals = self.idx[rows, cols]
        full_rows = np.flatnonzero(self.full)
        if full_rows.size:
            rows = np.concatenate([rows, np.repeat(full_rows, self.n)])
            vals = np.concatenate([vals, np.tile(np.arange(self.n), full_rows.size)])
        return _group(vals, rows, self.n, self.size)

    def matmul(self, other: "Pattern"):
        """The pattern of a product X·Y of matrices with these (m, k) and (k, p) patterns."""
        idx = self.idx
        picked = other.select(idx.reshape(-1), (idx.size,))
        w = picked.idx.shape[1]
        out_full = self.full | picked.full.reshape(self.size, -1).any(axis=1)
        out = _canonical(picked.idx.reshape(self.size, idx.shape[1] * w), out_full, other.n)
        return Pattern((self.size,), out[0], out[1], other.n)

    def bandwidth(self) -> int:
        """max |i − j| over the possible nonzeros (i, j) of a square pattern (a full row: n − 1)."""
        if self.full.any():
            return self.n - 1
        rows, cols = self.nonzeros()
        return int(np.max(np.abs(rows - cols))) if rows.size else 0

    def symmetric_coloring(self):
        """A colour per row of a square pattern such that rows i ≠ j with (i, j) or (j, i)
        in the pattern get different colours (distance-1 colouring of its graph, greedy
        in row order): then A·(Σ_{colour c} e_j) holds A_ii in every row i of colour c, so
        c products read the diagonal. Full rows make every row its own colour."""
        if self.full.any():
            return np.arange(self.size, dtype=np.int64)
        both = _union([self, self.transpose()], (self.size,), self.n)
        return _greedy(Pattern((self.size,), np.arange(self.size)[:, None], np.zeros(self.size, bool), self.size), both)

    def coloring(self):
        """A colour per column of a 2-D pattern such that no two columns of one colour share
        a row (greedy, in column order); full rows make every column its own colour."""
        if self.full.any():
            return np.arange(self.n, dtype=np.int64)
        cols_rows = self.transpose()  # column j -> rows
        return _greedy(cols_rows, self)


def grouped(groups, values, n_groups: int) -> np.ndarray:
    """Row g of the result holds the `values` paired with `groups == g`, in their order,
    padded with −1 to the largest group (n_groups, w)."""
    groups = np.asarray(groups, np.int64)
    values = np.asarray(values, np.int64)
    order = np.argsort(groups, kind="stable")
    groups, values = groups[order], values[order]
    counts = np.bincount(groups, minlength=n_groups)
    out = np.full((n_groups, int(counts.max()) if counts.size else 0), -1, np.int64)
    out[groups, np.arange(groups.size) - np.repeat(np.cumsum(counts) - counts, counts)] = values
    return out


def _group(groups, values, n_groups, n):
    """The pattern whose entry g holds the `values` paired with `groups == g`."""
    idx, full = _canonical(grouped(groups, values, n_groups), np.zeros(n_groups, bool), n)
    return Pattern((n_groups,), idx, full, n)


def _canonical(idx, full, n):
    """Sorted rows without repeats, right-aligned (−1 pads first), trimmed; rows with more
    than `_ROW_CAP` inputs become full."""
    if idx.shape[1] == 0:
        return idx, full
    idx = np.sort(idx, axis=1)
    repeat = np.zeros(idx.shape, bool)
    repeat[:, 1:] = idx[:, 1:] == idx[:, :-1]
    idx = np.where(repeat | full[:, None], -1, idx)
    idx = np.sort(idx, axis=1)
    counts = (idx >= 0).sum(axis=1)
    w = int(counts.max()) if counts.size else 0
    idx = idx[:, idx.shape[1] - w:]
    if w > _ROW_CAP:
        full = full | (counts > _ROW_CAP)
        idx = np.where(full[:, None], -1, idx)
        w = int(np.where(full, 0, counts).max())
        idx = np.sort(idx, axis=1)[:, idx.shape[1] - w:]
    return idx, full


def _union(pats, shape, n):
    """Entrywise union of patterns broadcast (numpy rules) to `shape`."""
    size = int(np.prod(shape, dtype=np.int64))
    parts, full = [], np.zeros(size, bool)
    for p in pats:
        src = np.broadcast_to(np.arange(p.size).reshape(p.shape), shape)
        moved = p.select(src, shape)
        parts.append(moved.idx)
        full |= moved.full
    if not parts:
        return Pattern.empty(shape, n)
    idx, full = _canonical(np.concatenate(parts, axis=1), full, n)
    return Pattern(shape, idx, full, n)


def _greedy(cols_rows: Pattern, rows_cols: Pattern):
    """Greedy distance-1 colouring of the columns' conflict graph (columns sharing a row)."""
    n_cols = cols_rows.size
    colors = np.full(n_cols, -1, np.int64)
    crow = [r[r >= 0] for r in cols_rows.idx]
    rcol = [c[c >= 0] for c in rows_cols.idx]
    for j in range(n_cols):
        rows = crow[j]
        if rows.size:
            neighbours = np.concatenate([rcol[r] for r in rows])
            used = colors[neighbours]
            used = np.unique(used[used >= 0])
            gaps = np.flatnonzero(used != np.arange(used.size))
            colors[j] = gaps[0] if gaps.size else used.size
        else:
            colors[j] = 0
    return colors


class _Entry:
    """What is known about one variable: its dependence pattern and, if constant, its value."""

    __slots__ = ("dep", "value")

    def __init__(self, dep: Pattern, value=None):
        self.dep = dep
        self.value = value

    def nonzero(self):
        """Entries that may be nonzero: the constant's zero pattern, else everywhere."""
        if self.value is None:
            return np.ones(self.dep.shape, bool)
        return np.asarray(self.value) != 0


def _dense(ins, out_avals, n):
    """Every output entry depends on everything any input depends on."""
    full = any(bool(e.dep.full.any()) for e in ins)
    cols = np.unique(np.concatenate([e.dep.idx[e.dep.idx >= 0] for e in ins])) if ins else np.zeros(0, np.int64)
    outs = []
    for a in out_avals:
        shape = tuple(a.shape)
        size = int(np.prod(shape, dtype=np.int64))
        if full or cols.size > _ROW_CAP or size * cols.size > _WORK_CAP:
            outs.append(Pattern(shape, np.zeros((size, 0), np.int64), np.full(size, bool(full or cols.size)), n))
        else:
            outs.append(Pattern(shape, np.broadcast_to(cols, (size, cols.size)).copy(), np.zeros(size, bool), n))
    return outs


def _ids(shape, start=0):
    return np.arange(start, start + int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)


def _pad_ids(ids, pad_id, config):
    """lax.pad on an array of ids: the padding entries get `pad_id`."""
    shape = ids.shape
    full = [max(lo, 0) + s + max(s - 1, 0) * it + max(hi, 0) for s, (lo, hi, it) in zip(shape, config)]
    out = np.full(full, pad_id, np.int64)
    index = tuple(slice(max(lo, 0), max(lo, 0) + (s - 1) * (it + 1) + 1 if s else max(lo, 0), it + 1)
                  for s, (lo, _, it) in zip(shape, config))
    out[index] = ids
    crop = tuple(slice(-min(lo, 0), f + min(hi, 0)) for f, (lo, hi, _) in zip(full, config))
    return out[crop]


def _moved_ids(eqn, ins):
    """For a data-movement equation: the ids (into the concatenated inputs) each output entry
    is copied from (−1: none), or None when the rule does not apply."""
    name, p = eqn.primitive.name, eqn.params
    outs = [tuple(v.aval.shape) for v in eqn.outvars]
    if name in ("squeeze", "expand_dims", "copy", "copy_p") or (name == "reshape" and p.get("dimensions") is None):
        return [_ids(outs[0])]
    first = _ids(ins[0].dep.shape)
    if name == "transpose":
        return [first.transpose(p["permutation"])]
    if name == "broadcast_in_dim":
        view = [1] * len(p["shape"])
        for src, dst in enumerate(p["broadcast_dimensions"]):
            view[dst] = first.shape[src]
        return [np.broadcast_to(first.reshape(view), p["shape"])]
    if name == "slice":
        strides = p["strides"] or (1,) * len(p["start_indices"])
        return [first[tuple(slice(s, l, st) for s, l, st in zip(p["start_indices"], p["limit_indices"], strides))]]
    if name == "rev":
        return [np.flip(first, axis=tuple(p["dimensions"]))]
    if name == "pad":
        return [_pad_ids(first, first.size, p["padding_config"])]
    if name == "concatenate":
        parts, start = [], 0
        for e in ins:
            parts.append(_ids(e.dep.shape, start))
            start += e.dep.size
        return [np.concatenate(parts, axis=p["dimension"])]
    if name == "stack":  # (a primitive of its own since JAX 0.9)
        parts, start = [], 0
        for e in ins:
            parts.append(_ids(e.dep.shape, start))
            start += e.dep.size
        return [np.stack(parts, axis=p["axis"])]
    if name == "split":
        return np.split(first, np.cumsum(p["sizes"])[:-1], axis=p["axis"])
    if name in ("gather", "dynamic_slice", "dynamic_update_slice"):
        data = 2 if name == "dynamic_update_slice" else 1
        if any(e.value is None for e in ins[data:]):
            return None  # traced indices: dense
        arrays, start = [], 1
        for e in ins[:data]:
            arrays.append(_ids(e.dep.shape, start))
            start += e.dep.size
        with jax.ensure_compile_time_eval():
            out = eqn.primitive.bind(*[jnp.asarray(a, jnp.int32) for a in arrays],
                                     *[e.value for e in ins[data:]], **p)
        out = np.asarray(out, np.int64) - 1
        return [np.where((out >= 0) & (out < start - 1), out, -1)]
    return None


def _scatter(eqn, ins, n):
    """scatter(-add) with known indices: each update's set joins the entry it lands on (the
    operand's sets are kept too: an overwrite only removes dependences, so this is sound)."""
    operand, indices, updates = ins[0], ins[1], ins[2]
    if indices.value is None:
        return None
    p = eqn.params
    dn = p["dimension_numbers"]
    # where each update lands: the gather that is the scatter's transpose, applied to ids
    slice_sizes, pos = [], 0
    for d in range(len(operand.dep.shape)):
        if d in dn.inserted_window_dims or d in dn.operand_batching_dims:
            slice_sizes.append(1)
        else:
            slice_sizes.append(updates.dep.shape[dn.update_window_dims[pos]])
            pos += 1
    gather_dn = lax.GatherDimensionNumbers(
        offset_dims=dn.update_window_dims, collapsed_slice_dims=dn.inserted_window_dims,
        start_index_map=dn.scatter_dims_to_operand_dims, operand_batching_dims=dn.operand_batching_dims,
        start_indices_batching_dims=dn.scatter_indices_batching_dims)
    with jax.ensure_compile_time_eval():
        target = lax.gather(jnp.asarray(_ids(operand.dep.shape, 1), jnp.int32), jnp.asarray(indices.value), gather_dn,
                            tuple(slice_sizes), mode=p["mode"], fill_value=0)
    target = np.asarray(target).reshape(-1).astype(np.int64) - 1
    if target.size != updates.dep.size:
        return None
    size = operand.dep.size
    landed = np.flatnonzero((target >= 0) & (target < size))
    # entries of the result: the operand's own sets, plus the updates that land there
    groups = np.concatenate([np.arange(size), target[landed]])
    members = np.concatenate([np.arange(size), size + landed])
    stacked = Pattern((size + updates.dep.size,), *_stack_rows([operand.dep, updates.dep]), n)
    return [_gather_union(stacked, groups, members, size, operand.dep.shape)]


def _stack_rows(pats):
    w = max(p.idx.shape[1] for p in pats)
    idx = np.concatenate([np.pad(p.idx, ((0, 0), (w - p.idx.shape[1], 0)), constant_values=-1) for p in pats])
    return idx, np.concatenate([p.full for p in pats])


def _gather_union(pat: Pattern, groups, members, n_groups, shape):
    """Entry g of the result is the union of the sets `members[groups == g]` of `pat`."""
    src = grouped(groups, members, n_groups)
    c = src.shape[1]
    if n_groups * c * max(pat.idx.shape[1], 1) > _WORK_CAP:  # too much work: every input (sound)
        return Pattern(shape, np.zeros((n_groups, 0), np.int64), np.full(n_groups, True), pat.n)
    picked = pat.select(src.reshape(-1), (src.size,))
    full = picked.full.reshape(n_groups, c).any(axis=1) if c else np.zeros(n_groups, bool)
    idx, full = _canonical(picked.idx.reshape(n_groups, -1), full, pat.n)
    return Pattern(shape, idx, full, pat.n)


def _reduce(dep: Pattern, axes, out_shape):
    axes = tuple(int(a) for a in axes)
    keep = [d for d in range(len(dep.shape)) if d not in axes]
    ids = _ids(dep.shape).transpose(keep + list(axes))
    out_size = int(np.prod(out_shape, dtype=np.int64))
    members = ids.reshape(out_size, -1)
    groups = np.repeat(np.arange(out_size), members.shape[1])
    return _gather_union(dep, groups, members.reshape(-1), out_size, out_shape)


def _mul(a: _Entry, b: _Entry, shape, n):
    nz_a = np.broadcast_to(a.nonzero(), shape)
    nz_b = np.broadcast_to(b.nonzero(), shape)
    da = _union([a.dep], shape, n).masked(nz_b)
    db = _union([b.dep], shape, n).masked(nz_a)
    return _union([da, db], shape, n)


def _dot_general(a: _Entry, b: _Entry, params, out_shape, n):
    (lc, rc), (lb, rb) = params["dimension_numbers"]
    sa, sb = a.dep.shape, b.dep.shape
    letters = iter(string.ascii_letters)
    la, ra = [None] * len(sa), [None] * len(sb)
    for i, j in zip(lb, rb):
        la[i] = ra[j] = next(letters)
    contract = []
    for i, j in zip(lc, rc):
        la[i] = ra[j] = next(letters)
        contract.append((la[i], sa[i]))
    for k in range(len(sa)):
        if la[k] is None:
            la[k] = next(letters)
    for k in range(len(sb)):
        if ra[k] is None:
            ra[k] = next(letters)
    free_a = [la[k] for k in range(len(sa)) if k not in lc and k not in lb]
    free_b = [ra[k] for k in range(len(sb)) if k not in rc and k not in rb]
    out_letters = [la[i] for i in lb] + free_a + free_b
    grid_letters = out_letters + [c for c, _ in contract]
    out_size = int(np.prod(out_shape, dtype=np.int64))
    k_size = int(np.prod([s for _, s in contract], dtype=np.int64))
    width = max(a.dep.idx.shape[1], 1) + max(b.dep.idx.shape[1], 1)
    if out_size * k_size * width > _WORK_CAP:
        return None
    sizes = dict(zip(out_letters, out_shape))
    sizes.update(dict(contract))
    grid = np.indices([sizes[c] for c in grid_letters], dtype=np.int64) if grid_letters else np.zeros((0,), np.int64)
    coord = dict(zip(grid_letters, grid))
    flat_a = np.ravel_multi_index([coord[c] for c in la], sa) if la else np.zeros((), np.int64)
    flat_b = np.ravel_multi_index([coord[c] for c in ra], sb) if ra else np.zeros((), np.int64)
    flat_a = np.broadcast_to(flat_a, grid.shape[1:] if grid_letters else ()).reshape(-1)
    flat_b = np.broadcast_to(flat_b, grid.shape[1:] if grid_letters else ()).reshape(-1)
    nz_a, nz_b = a.nonzero().reshape(-1), b.nonzero().reshape(-1)
    from_a = a.dep.select(flat_a, (flat_a.size,)).masked(nz_b[flat_b])
    from_b = b.dep.select(flat_b, (flat_b.size,)).masked(nz_a[flat_a])
    idx = np.concatenate([from_a.idx, from_b.idx], axis=1).reshape(out_size, -1)
    full = (from_a.full | from_b.full).reshape(out_size, -1).any(axis=1)
    idx, full = _canonical(idx, full, n)
    return Pattern(out_shape, idx, full, n)


def _fold(eqn, ins):
    """Evaluate an equation whose inputs are all known constants (None if it cannot be)."""
    if any(e.value is None for e in ins) or any(k in eqn.params for k in _CALL_PARAMS):
        return None
    if any(np.size(e.value) > _FOLD_LIMIT for e in ins):
        return None
    try:
        with jax.ensure_compile_time_eval():
            out = eqn.primitive.bind(*[e.value for e in ins], **eqn.params)
        outs = out if eqn.primitive.multiple_results else [out]
        return [np.asarray(o) for o in outs]
    except Exception:  # folding is an optimisation only
        return None


def _sub_jaxpr(eqn):
    for key in _CALL_PARAMS:
        if key in eqn.params:
            sub = eqn.params[key]
            if hasattr(sub, "jaxpr"):  # ClosedJaxpr
                return sub.jaxpr, list(sub.consts)
            return sub, []
    return None


def _eqn_patterns(eqn, ins, n):
    """The dependence patterns of one equation's outputs."""
    name = eqn.primitive.name
    p = eqn.params
    outs = [tuple(v.aval.shape) for v in eqn.outvars]
    if name in _ELEMENTWISE and len(outs) == 1:
        if name == "mul" and len(ins) == 2:
            return [_mul(ins[0], ins[1], outs[0], n)]
        return [_union([e.dep for e in ins], outs[0], n)]
    if name in _REDUCTIONS:
        return [_reduce(ins[0].dep, p["axes"], outs[0])]
    if name == "dot_general" and len(ins) == 2:
        out = _dot_general(ins[0], ins[1], p, outs[0], n)
        if out is not None:
            return [out]
    if name in _SCATTERS and len(ins) == 3:
        out = _scatter(eqn, ins, n)
        if out is not None:
            return out
    moved = _moved_ids(eqn, ins)
    if moved is not None:
        if len(ins) == 1 or name in ("squeeze", "expand_dims", "reshape", "copy", "copy_p", "transpose",
                                     "broadcast_in_dim", "slice", "rev", "split", "gather", "dynamic_slice"):
            data = ins[0].dep
        else:
            data_ins = ins[:2] if name in ("pad", "dynamic_update_slice") else ins
            data = Pattern((sum(e.dep.size for e in data_ins),), *_stack_rows([e.dep for e in data_ins]), n)
        return [data.select(ids, shape) for ids, shape in zip(moved, outs)]
    sub = _sub_jaxpr(eqn)
    if sub is not None and name in _CALLS:
        jaxpr, consts = sub
        k = len(jaxpr.invars)
        inner = _propagate(jaxpr, consts, ins[len(ins) - k:], n)
        return [e.dep for e in inner]
    return _dense(ins, [v.aval for v in eqn.outvars], n)


def _propagate(jaxpr, consts, ins, n):
    env = {}
    for v, c in zip(jaxpr.constvars, consts):
        arr = np.asarray(c) if not is_traced(c) else None
        env[v] = _Entry(Pattern.empty(tuple(v.aval.shape), n), arr)
    for v, e in zip(jaxpr.invars, ins):
        env[v] = e

    def read(v):
        if isinstance(v, Literal):
            return _Entry(Pattern.empty(tuple(np.shape(v.val)), n), np.asarray(v.val))
        return env[v]

    for eqn in jaxpr.eqns:
        ins_e = [read(v) for v in eqn.invars]
        folded = _fold(eqn, ins_e)
        if folded is not None:
            for v, val in zip(eqn.outvars, folded):
                env[v] = _Entry(Pattern.empty(tuple(v.aval.shape), n), val)
            continue
        try:
            deps = _eqn_patterns(eqn, ins_e, n)
        except Exception:  # a rule that does not fit this equation: be conservative
            deps = _dense(ins_e, [v.aval for v in eqn.outvars], n)
        for v, d in zip(eqn.outvars, deps):
            env[v] = _Entry(d.reshaped(tuple(v.aval.shape)))
    return [read(v) for v in jaxpr.outvars]


def jacobian_sparsity(fn, n: int, dtype=np.float64) -> Pattern:
    """Structural sparsity of the Jacobian of `fn: R^n -> R^m` (flat vectors), as a sparse
    `Pattern` of shape (m,) over n inputs: row i lists the inputs output i may depend on.

    Read off the jaxpr (see the module docstring); traces `fn` on an abstract input, no
    values are used. Memory and time grow with the number of nonzeros, not with m·n.

    Example:

    ```python
    >>> import numpy as np
    >>> from geomjax.internal.sparsity import jacobian_sparsity
    >>> edges = np.array([[0, 1], [1, 2], [2, 0]])  # a ring of three points on a line
    >>> pat = jacobian_sparsity(lambda q: (q[edges[:, 0]] - q[edges[:, 1]]) ** 2 - 1.0, 3)
    >>> pat.dense().astype(int)
    array([[1, 1, 0],
           [0, 1, 1],
           [1, 0, 1]])

    ```
    """
    # a fresh wrapper: make_jaxpr caches by the function, and comparing bound methods of
    # modules holding arrays would compare those arrays (traced inside an outer jit)
    closed = jax.make_jaxpr(lambda x: fn(x))(jax.ShapeDtypeStruct((n,), dtype))
    (out,) = _propagate(closed.jaxpr, list(closed.consts), [_Entry(Pattern.identity(n))], n)
    dep = out.dep
    return Pattern((dep.size,), dep.idx, dep.full, n)


def jacobian_pattern(fn, n: int, dtype=np.float64) -> np.ndarray:
    """Structural sparsity of the Jacobian of `fn: R^n -> R^m` (flat vectors), shape `(m, n)`.

    Entry (i, j) is False only if output i cannot depend on input j (read off the jaxpr;
    see the module docstring). The dense form of `jacobian_sparsity`, for small systems.

    Example: `jacobian_pattern(lambda x: x[1:] * x[:-1], 3)` is
    `[[True, True, False], [False, True, True]]`.
    """
    return jacobian_sparsity(fn, n, dtype).dense()


def greedy_coloring(pattern: np.ndarray) -> np.ndarray:
    """A colour per column of `pattern` (m, c) such that no two columns of one colour share
    a row: one product with the sum of a colour's unit vectors evaluates all its columns."""
    return Pattern.from_dense(pattern).coloring()


def bandwidth(pattern: np.ndarray) -> int:
    """max |i − j| over the True entries (0 for a diagonal or empty pattern)."""
    rows, cols = np.nonzero(pattern)
    return int(np.max(np.abs(rows - cols))) if rows.size else 0
