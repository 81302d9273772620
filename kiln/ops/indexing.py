"""Indexing family: gather/scatter by index tensors and data-dependent selection.

Indices may be negative (counted from the end); any index out of range is a
KilnError naming the node, never a wrapped or clipped read. Outputs whose size
depends on data (NonZero, Unique, Compress) get fresh symbols at compile time.

Native lowerings: gathers are computes whose indices are wrapped then clamped
(never a read out of bounds) and checked: an index out of range fails the run
with a KilnError naming the node and the index, as ONNX Runtime raises. Scatters,
TopK and run-time sized Compress/Unique are C kernels; the scatters fail the same
way (KILN_FAIL) on an index out of range instead of writing out of bounds.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.loops import INDEX, cast, compute, const, select
from kiln.ops.registry import lowering, op
from kiln.ops.shapes import normalize_axis
from kiln.ops.tensor import clamp, ints, out, rows_schedule, scalar, sized_by, unflat_index


def _indices(ctx, idx, dim: int, what: str = "index"):
    """int64 indices with negatives wrapped; out-of-range ones fail."""
    idx = np.asarray(idx).astype(np.int64)
    bad = (idx < -dim) | (idx >= dim)
    if bad.any():
        ctx.fail(f"{what} {int(idx[bad].reshape(-1)[0])} is out of range for a dim of size {dim}")
    return np.where(idx < 0, idx + dim, idx)


def _axis(ctx, rank: int, default: int = 0) -> int:
    return normalize_axis(ctx, ctx.attr("axis", default), rank)


def _index_expr(ctx, j, dim: int, axis: int, i: int = 1):
    """Lowering: index expr `j` (read from input `i`) counted from the end when negative and
    clamped into the dim, so it never reads out of bounds; an index the reference rejects
    fails the kernel at run time (a KilnError naming the node and the index, as ONNX Runtime
    raises). Indices known at compile time are checked then."""
    if dim == 0:
        ctx.fail("indices into an empty axis are all out of range")
    if i is not None and ctx.value(i) is not None:
        _indices(ctx, ctx.value(i), dim)
    j = cast(INDEX, j)
    return ctx.check(clamp(select(j < 0, j + dim, j), 0, dim - 1), (j >= -dim) & (j < dim), j,
                 f"index {{value}} is out of range [-{dim}, {dim - 1}] for axis {axis} (size {dim}) "
                 "of the data")


# ---- gathers ----

def _gather_infer(ctx):
    s, i = ctx.shape(0), ctx.shape(1)
    if s is None or i is None:
        return out(ctx, ctx.dtype(0), None)
    a = _axis(ctx, len(s))
    return out(ctx, ctx.dtype(0), s[:a] + i + s[a + 1:])


@op("Gather", infer=_gather_infer)
def gather(ctx, data, indices):
    a = _axis(ctx, data.ndim)
    return np.asarray(np.take(data, _indices(ctx, indices, data.shape[a]), axis=a))


@lowering("Gather")
def _gather_lower(ctx, data, indices):
    a, q = _axis(ctx, len(data.shape)), len(indices.shape)

    def fn(*i):
        j = _index_expr(ctx, indices[i[a:a + q]], data.shape[a], a)
        return data[i[:a] + (j,) + i[a + q:]]
    ctx.schedule(rows_schedule(len(data.shape) - a - 1))
    return _empty_or(ctx, fn, "gather")


def _empty_or(ctx, fn, name):
    """compute(fn) over the output, or zeros when it is empty (no index is ever read)."""
    shape = ctx.out_shape()
    return compute(shape, (lambda *i: const(0, ctx.out_dtype())) if 0 in shape else fn, name)


def _gather_elements_infer(ctx):
    s, i = ctx.shape(0), ctx.shape(1)
    if s is not None and i is not None and len(s) != len(i):
        ctx.fail(f"data {tuple(s)} and indices {tuple(i)} must have the same rank")
    return out(ctx, ctx.dtype(0), i)


@op("GatherElements", infer=_gather_elements_infer)
def gather_elements(ctx, data, indices):
    if data.ndim != indices.ndim:
        ctx.fail(f"data {data.shape} and indices {indices.shape} must have the same rank")
    a = _axis(ctx, data.ndim)
    return np.take_along_axis(data, _indices(ctx, indices, data.shape[a]), axis=a)


@lowering("GatherElements")
def _gather_elements_lower(ctx, data, indices):
    a = _axis(ctx, len(data.shape))

    def fn(*i):
        return data[i[:a] + (_index_expr(ctx, indices[i], data.shape[a], a),) + i[a + 1:]]
    ctx.schedule(rows_schedule())
    return _empty_or(ctx, fn, "gather_elements")


def _gather_nd_infer(ctx):
    s, i, b = ctx.shape(0), ctx.shape(1), ctx.attr("batch_dims", 0)
    if s is None or not i or not isinstance(i[-1], int):
        return out(ctx, ctx.dtype(0), None)
    if i[-1] > len(s) - b:
        ctx.fail(f"indices {tuple(i)} index {i[-1]} dims but data {tuple(s)} has "
                 f"{len(s) - b} after batch_dims={b}")
    return out(ctx, ctx.dtype(0), i[:-1] + s[b + i[-1]:])


def _nd_index(ctx, data_shape, indices, b: int):
    """Flatten GatherND/ScatterND's indices to (batch, M, k) with negatives wrapped."""
    k = indices.shape[-1] if indices.ndim else len(data_shape) + 1
    if b >= indices.ndim or k > len(data_shape) - b or data_shape[:b] != indices.shape[:b]:
        ctx.fail(f"indices {indices.shape} do not fit data {data_shape} with batch_dims={b}")
    dims = np.array(data_shape[b:b + k], np.int64)
    idx = indices.astype(np.int64).reshape(math.prod(indices.shape[:b]), math.prod(indices.shape[b:-1]), k)
    bad = (idx < -dims) | (idx >= dims)
    if bad.any():
        ctx.fail(f"an index in {indices.shape} is out of range for data {data_shape}")
    return np.where(idx < 0, idx + dims, idx)


@op("GatherND", infer=_gather_nd_infer)
def gather_nd(ctx, data, indices):
    b = ctx.attr("batch_dims", 0)
    idx = _nd_index(ctx, data.shape, indices, b)
    d = data.reshape((math.prod(data.shape[:b]),) + data.shape[b:])
    batch = np.broadcast_to(np.arange(d.shape[0])[:, None], idx.shape[:2])
    res = d[(batch, *np.moveaxis(idx, -1, 0))]
    return res.reshape(indices.shape[:-1] + data.shape[b + indices.shape[-1]:])


@lowering("GatherND")
def _gather_nd_lower(ctx, data, indices):
    b, q = ctx.attr("batch_dims", 0), len(indices.shape)
    k = indices.shape[-1]

    def fn(*i):
        if ctx.value(1) is not None:
            _nd_index(ctx, data.shape, ctx.value(1), b)
        at = [_index_expr(ctx, indices[i[:q - 1] + (m,)], data.shape[b + m], b + m, None) for m in range(k)]
        return data[i[:b] + tuple(at) + i[q - 1:]]
    ctx.schedule(rows_schedule(len(data.shape) - b - k))
    return _empty_or(ctx, fn, "gather_nd")


# ---- scatters ----

_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_into(ctx, data, index, updates):
    """Copy of `data` with `updates` written (or reduced) at the advanced index `index`."""
    y = data.copy()
    reduction = ctx.attr("reduction", "none")
    if reduction == "none":
        y[index] = updates
    elif reduction in _REDUCE:
        _REDUCE[reduction].at(y, index, updates)
    else:
        ctx.fail(f"reduction must be none, add, mul, max or min, got {reduction!r}")
    return y


def _c_combine(ctx, dt: DType, old: str, new: str) -> str:
    """C expression for a scatter's `reduction` of the old element with the update
    (signed integer add/mul wrap through the unsigned type, as NumPy's do)."""
    reduction = ctx.attr("reduction", "none")
    if reduction == "none":
        return new
    if reduction in ("add", "mul"):
        sym = "+" if reduction == "add" else "*"
        if dt.is_int and dt.is_signed and dt.itemsize >= 4:
            u = f"uint{dt.itemsize * 8}_t"
            return f"({dt.c})(({u}){old} {sym} ({u}){new})"
        return f"{old} {sym} {new}"
    if reduction in ("max", "min"):  # NaN wins, as np.maximum/np.minimum
        keep = ">=" if reduction == "max" else "<="
        return f"({old} != {old} || {old} {keep} {new}) ? {old} : {new}"
    ctx.fail(f"reduction must be none, add, mul, max or min, got {reduction!r}")


def _index_error(dim: int, axis: int) -> dict:
    """The extern kernels' status 1: an index out of range (see `_c_index`)."""
    return {1: f"index {{value}} is out of range [-{dim}, {dim - 1}] for axis {axis} (size {dim}) of the data"}


def _c_index(var: str, src: str, dim: int, code: int = 1) -> str:
    """C lines reading index `src` into `var`, wrapping negatives; an index out of range
    makes the kernel fail (status `code`, reporting the index) instead of writing out of
    bounds. The range test is on the raw index, so no arithmetic can overflow first."""
    return (f"    int64_t {var} = (int64_t){src};\n"
            f"    if ({var} < -{dim} || {var} >= {dim}) KILN_FAIL({code}, {var});\n"
            f"    if ({var} < 0) {var} += {dim};\n")


def _c_type(ctx, dt: DType) -> str:
    if dt.c is None:
        ctx.fail(f"{dt} data has no C type for a native kernel")
    return dt.c


def _c_copy(ctx, n: int, dt: DType) -> str:
    """C: out0 starts as a copy of in0 (a scatter's data)."""
    return f"  memcpy(out0, in0, {n} * sizeof({_c_type(ctx, dt)}));\n" if n else ""


def _scatter_elements_infer(ctx):
    s, i, u = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if i is not None and u is not None and len(i) == len(u) and any(
            isinstance(p, int) and isinstance(q, int) and p != q for p, q in zip(i, u)):
        ctx.fail(f"indices {tuple(i)} and updates {tuple(u)} must have the same shape")
    return out(ctx, ctx.dtype(0), s)


def scatter_elements(ctx, data, indices, updates):
    if not data.ndim == indices.ndim == updates.ndim or indices.shape != updates.shape:
        ctx.fail(f"data {data.shape}, indices {indices.shape} and updates {updates.shape} "
                 "must have equal ranks, and indices/updates equal shapes")
    a = _axis(ctx, data.ndim)
    index = list(np.indices(indices.shape, sparse=True))
    index[a] = _indices(ctx, indices, data.shape[a])
    return _scatter_into(ctx, data, tuple(index), updates)


op("ScatterElements", infer=_scatter_elements_infer, aliases=("Scatter",))(scatter_elements)


def _scatter_elements_lower(ctx, data, indices, updates):
    """Copy, then write (or reduce) each update at its index, in order (the last write wins)."""
    d, i = data.shape, indices.shape
    a = _axis(ctx, len(d))
    if not len(d) == len(i) == len(updates.shape) or i != updates.shape or any(
            n > m for k, (n, m) in enumerate(zip(i, d)) if k != a):
        ctx.fail(f"data {d}, indices {i} and updates {updates.shape} must have equal ranks, "
                 "indices/updates equal shapes no larger than the data off the axis")
    dst = [f"i{k}" for k in range(len(i))]
    dst[a] = "j"
    body = [_c_copy(ctx, math.prod(d), data.dtype), f"  for (int64_t p = 0; p < {math.prod(i)}; ++p) {{\n"]
    body += [f"    const int64_t i{k} = p / {math.prod(i[k + 1:])} % {n};\n" for k, n in enumerate(i) if k != a]
    body.append(_c_index("j", "in1[p]", d[a]))
    off = " + ".join(f"{v} * {math.prod(d[k + 1:])}" for k, v in enumerate(dst))
    body.append(f"    const int64_t o = {off};\n    out0[o] = {_c_combine(ctx, data.dtype, 'out0[o]', 'in2[p]')};\n")
    body.append("  }\n  return 0;")
    return ctx.extern("".join(body), [data, indices, updates], [(d, data.dtype)], errors=_index_error(d[a], a))


for _name in ("ScatterElements", "Scatter"):
    lowering(_name)(_scatter_elements_lower)


def _scatter_nd_infer(ctx):
    return out(ctx, ctx.dtype(0), ctx.shape(0))


@op("ScatterND", infer=_scatter_nd_infer)
def scatter_nd(ctx, data, indices, updates):
    idx = _nd_index(ctx, data.shape, indices, 0)[0]
    want = indices.shape[:-1] + data.shape[indices.shape[-1]:]
    if updates.shape != want:
        ctx.fail(f"updates {updates.shape} must have shape {want} for indices {indices.shape}")
    return _scatter_into(ctx, data, tuple(idx.T), updates.reshape((idx.shape[0],) + want[indices.ndim - 1:]))


@lowering("ScatterND")
def _scatter_nd_lower(ctx, data, indices, updates):
    d, i = data.shape, indices.shape
    k = i[-1] if i else len(d) + 1
    want = i[:-1] + d[k:]
    if not i or k > len(d) or updates.shape != want:
        ctx.fail(f"indices {i} and updates {updates.shape} do not fit data {d} (updates must be {want})")
    rows, row = math.prod(i[:-1]), math.prod(d[k:])
    body = [_c_copy(ctx, math.prod(d), data.dtype), f"  for (int64_t m = 0; m < {rows}; ++m) {{\n",
            "    int64_t o = 0;\n"]
    errors = {}
    for c in range(k):
        body.append(_c_index(f"j{c}", f"in1[m * {k} + {c}]", d[c], c + 1))
        body.append(f"    o += j{c} * {math.prod(d[c + 1:])};\n")
        errors[c + 1] = _index_error(d[c], c)[1]
    body.append(f"    for (int64_t s = 0; s < {row}; ++s) out0[o + s] = "
                f"{_c_combine(ctx, data.dtype, 'out0[o + s]', f'in2[m * {row} + s]')};\n  }}\n  return 0;")
    return ctx.extern("".join(body), [data, indices, updates], [(d, data.dtype)], errors=errors)


def _tensor_scatter_infer(ctx):
    if ctx.attr("mode", "linear") not in ("linear", "circular"):
        ctx.fail(f"mode must be linear or circular, got {ctx.attr('mode')!r}")
    return out(ctx, ctx.dtype(0), ctx.shape(0))


@op("TensorScatter", infer=_tensor_scatter_infer)
def tensor_scatter(ctx, past, update, write_indices=None):
    a = _axis(ctx, past.ndim, -2)
    if a == 0 or update.ndim != past.ndim or any(
            p != u for k, (p, u) in enumerate(zip(past.shape, update.shape)) if k != a):
        ctx.fail(f"update {update.shape} must match past_cache {past.shape} except on axis {a} (not 0)")
    size, seq = past.shape[a], update.shape[a]
    starts = np.zeros(past.shape[0], np.int64) if write_indices is None else write_indices.astype(np.int64)
    y = past.copy()
    for b, w in enumerate(starts):
        pos = w + np.arange(seq)
        if ctx.attr("mode", "linear") == "circular":
            pos %= size
        elif seq and (w < 0 or pos[-1] >= size):
            ctx.fail(f"write_indices[{b}] = {w} plus {seq} updates overruns axis size {size}")
        np.moveaxis(y[b], a - 1, 0)[pos] = np.moveaxis(update[b], a - 1, 0)
    return y


@lowering("TensorScatter")
def _tensor_scatter_lower(ctx, past, update, write_indices=None):
    p, u = past.shape, update.shape
    a = _axis(ctx, len(p), -2)
    if a == 0 or len(u) != len(p) or any(m != n for k, (m, n) in enumerate(zip(p, u)) if k != a):
        ctx.fail(f"update {u} must match past_cache {p} except on axis {a} (not 0)")
    size, seq, pre, row = p[a], u[a], math.prod(p[1:a]), math.prod(p[a + 1:])
    circular = ctx.attr("mode", "linear") == "circular"
    start = "(int64_t)in2[b]" if write_indices is not None else "0"
    if circular:  # w % size first: w + s could overflow
        check = f"if ({size} == 0) KILN_FAIL(2, w);" if seq else ""
        pos = f"((w % {size} + {size}) % {size} + s) % {size}"
    else:  # w + seq > size could overflow (w read from the inputs): compare w with size - seq
        check, pos = (f"if (w < 0 || w > {size - seq}) KILN_FAIL(1, w);" if seq else ""), "w + s"
    body = (f"{_c_copy(ctx, math.prod(p), past.dtype)}"
            f"  for (int64_t b = 0; b < {p[0]}; ++b) {{\n    const int64_t w = {start};\n    {check}\n"
            f"    for (int64_t q = 0; q < {pre}; ++q)\n      for (int64_t s = 0; s < {seq}; ++s)\n"
            f"        memcpy(out0 + ((b * {pre} + q) * {size} + {pos}) * {row},\n"
            f"               in1 + ((b * {pre} + q) * {seq} + s) * {row}, {row} * sizeof({_c_type(ctx, past.dtype)}));\n"
            "  }\n  return 0;")
    errors = {1: f"write_indices value {{value}} plus {seq} updates overruns axis {a} (size {size}) "
                 "of past_cache", 2: f"write_indices value {{value}}: axis {a} of past_cache is empty"}
    return ctx.extern(body, [past, update, write_indices], [(p, past.dtype)], errors=errors)


# ---- data-dependent selection ----

def _compress_infer(ctx):
    s, cond = ctx.shape(0), ctx.value(1)
    n = ctx.new_dim() if cond is None else int(np.count_nonzero(cond))
    if ctx.attr("axis", None) is None:
        return out(ctx, ctx.dtype(0), (n,))
    a = None if s is None else _axis(ctx, len(s))
    return out(ctx, ctx.dtype(0), None if s is None else s[:a] + (n,) + s[a + 1:])


@op("Compress", infer=_compress_infer)
def compress(ctx, x, condition):
    axis = ctx.attr("axis", None)
    axis = None if axis is None else _axis(ctx, x.ndim)
    cond = condition.reshape(-1).astype(bool)
    if cond.size > (x.size if axis is None else x.shape[axis]):
        ctx.fail(f"condition of length {cond.size} is longer than the compressed axis of {x.shape}")
    return np.compress(cond, x, axis=axis)


@lowering("Compress")
def _compress_lower(ctx, x, condition):
    """With the condition known at compile time the kept positions are runs of consecutive
    indices: a select chain over the runs maps an output position to its source."""
    axis = ctx.attr("axis", None)
    a = None if axis is None else _axis(ctx, len(x.shape))
    n = math.prod(x.shape) if a is None else x.shape[a]
    c = math.prod(condition.shape)
    if c > n:
        ctx.fail(f"condition of length {c} is longer than the compressed axis of {x.shape}")
    if ctx.value(1) is None:
        return _compress_dynamic(ctx, x, condition, a)
    cond = ctx.value(1).reshape(-1).astype(bool)
    runs, pos = [], 0  # (first output position after the run, source - output offset)
    for src in np.flatnonzero(cond):
        if runs and runs[-1][0] == pos and runs[-1][1] == src - pos:
            runs[-1] = (pos + 1, runs[-1][1])
        else:
            runs.append((pos + 1, int(src) - pos))
        pos += 1

    def source(j):
        e = j + runs[-1][1]
        for end, off in reversed(runs[:-1]):
            e = select(j < end, j + off, e)
        return e

    def fn(*i):
        if a is None:
            return x[tuple(unflat_index(source(i[0]), x.shape))]
        return x[i[:a] + (source(i[a]),) + i[a + 1:]]
    ctx.schedule(rows_schedule(None if a is None else len(x.shape) - a - 1))
    return _empty_or(ctx, fn, "compress")


def _compress_dynamic(ctx, x, condition, a):
    """The condition is run-time data: a C kernel copies the kept rows compactly and
    reports the output dims (the runtime sizes what follows from them)."""
    d, c, t = x.shape, math.prod(condition.shape), _c_type(ctx, x.dtype)
    outer, inner = (1, 1) if a is None else (math.prod(d[:a]), math.prod(d[a + 1:]))
    stride = 1 if a is None else d[a]
    dims = ["n"] if a is None else [str(v) if k != a else "n" for k, v in enumerate(d)]
    body = (f"  int64_t n = 0;\n  for (int64_t c = 0; c < {c}; ++c) n += in1[c] != 0;\n"
            f"  for (int64_t o = 0; o < {outer}; ++o) {{\n    int64_t m = 0;\n"
            f"    for (int64_t c = 0; c < {c}; ++c) {{\n      if (!in1[c]) continue;\n"
            f"      memcpy(out0 + (o * n + m) * {inner}, in0 + (o * {stride} + c) * {inner}, "
            f"{inner} * sizeof({t}));\n      ++m;\n    }}\n  }}\n"
            + "".join(f"  out1[{k}] = {v};\n" for k, v in enumerate(dims)) + "  return 0;")
    cap = (max(c, 1),) if a is None else d[:a] + (max(c, 1),) + d[a + 1:]
    return ctx.extern(body, [x, condition], [(cap, x.dtype)], dynamic=True)


def _nonzero_infer(ctx):
    s = ctx.shape(0)
    return out(ctx, DType.int64, (ctx.new_dim() if s is None else max(len(s), 1), ctx.new_dim()))


@op("NonZero", infer=_nonzero_infer)
def nonzero(ctx, x):
    return np.array(np.nonzero(x.reshape(-1) if x.ndim == 0 else x), np.int64).reshape(max(x.ndim, 1), -1)


def _unique_infer(ctx):
    s, n, axis = ctx.shape(0), ctx.new_dim(), ctx.attr("axis", None)
    vec = TensorType(DType.int64, (n,))
    if axis is None:
        total = ctx.new_dim() if s is None or not ctx.tensor(0).is_static else int(np.prod(s, dtype=np.int64))
        y = (n,)
    elif s is None:
        total, y = ctx.new_dim(), None
    else:
        a = _axis(ctx, len(s))
        total, y = s[a], s[:a] + (n,) + s[a + 1:]
    return [TensorType(ctx.dtype(0), y), vec, TensorType(DType.int64, (total,)), vec]


@op("Unique", infer=_unique_infer)
def unique(ctx, x):
    axis = ctx.attr("axis", None)
    axis = None if axis is None else _axis(ctx, x.ndim)
    dt = DType.from_numpy(x.dtype)
    if dt.is_narrow:  # NumPy cannot sort bfloat16/float8: order their exact float32 values
        x = x.astype(np.float32 if dt.is_float else np.int32)
    y, first, inverse, counts = np.unique(x.reshape(-1) if axis is None else x, return_index=True,
                                          return_inverse=True, return_counts=True, axis=axis)
    y = y.astype(dt.np)
    inverse = inverse.reshape(-1)
    if not ctx.attr("sorted", 1):  # reorder to first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y, first, counts = np.take(y, order, axis=axis or 0), first[order], counts[order]
        inverse = rank[inverse]
    return y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)


# C that turns a stored element of a storage-only dtype into the value it orders by
_KEY_OF = {DType.bfloat16: "({ uint32_t u_ = (uint32_t)(v) << 16; float f_; memcpy(&f_, &u_, 4); f_; })"}


def _sort_key_type(ctx, dt: DType) -> tuple[str, str]:
    """(C storage type, C type compared): bfloat16 is kept as its bits, ordered as float."""
    if dt in _KEY_OF:
        return dt.c_storage, "float"
    t = _c_type(ctx, dt)
    return t, t


@lowering("Unique")
def _unique_lower(ctx, x):
    """Rows (the elements, or the slices along `axis`) merge-sorted by (value, position),
    NaN the largest; runs of equal rows are the unique values (flattened, NaNs are one value,
    as np.unique). Their number is data: a dynamic C kernel writes the outputs compactly and
    reports the dims."""
    d, nout = x.shape, ctx.num_outputs
    t, load = _sort_key_type(ctx, x.dtype)
    a = None if ctx.attr("axis", None) is None else _axis(ctx, len(d))
    rows = math.prod(d) if a is None else d[a]
    outer, inner = (1, 1) if a is None else (math.prod(d[:a]), math.prod(d[a + 1:]))
    width, cap = outer * inner, max(rows, 1)
    y_dims = ["n"] if a is None else [str(v) if k != a else "n" for k, v in enumerate(d)]
    dims = (y_dims + ["n", str(rows), "n"])[:len(y_dims) + nout - 1]
    if ctx.attr("sorted", 1):
        rank = f"  for (int64_t g = 0; g < n; ++g) order[g] = g;\n"
    else:  # by first occurrence
        rank = (f"  int64_t k = 0;\n  for (int64_t r = 0; r < {rows}; ++r)\n"
                f"    if (first[inv[r]] == r) {{ nxt[inv[r]] = k; order[k++] = inv[r]; }}\n"
                f"  for (int64_t r = 0; r < {rows}; ++r) inv[r] = nxt[inv[r]];\n")
    writes = [f"  for (int64_t o = 0; o < {outer}; ++o)\n    for (int64_t k = 0; k < n; ++k)\n"
              f"      memcpy(out0 + (o * n + k) * {inner}, in0 + (o * {rows} + first[order[k]]) * {inner}, "
              f"{inner} * sizeof({t}));\n",
              "  for (int64_t k = 0; k < n; ++k) out1[k] = first[order[k]];\n",
              f"  memcpy(out2, inv, {rows} * sizeof(int64_t));\n",
              "  for (int64_t k = 0; k < n; ++k) out3[k] = count[order[k]];\n"][:nout]
    same = "A == B || (A != A && B != B)" if a is None else "A == B"
    writes += [f"  out{nout}[{k}] = {v};\n" for k, v in enumerate(dims)]
    body = f"""#define KILN_AT(r, m) in0[(m) / {inner} * {rows * inner} + (r) * {inner} + (m) % {inner}]
#define KILN_KEY(v) {_KEY_OF.get(x.dtype, "(v)")}
  int64_t n = 0, *w = NULL;
  if ({rows} > 0) {{
    w = (int64_t*)malloc(6 * {rows} * sizeof(int64_t));
    if (!w) return -1;
  }}
  int64_t *cur = w, *nxt = w + {rows}, *first = w + {2 * rows}, *count = w + {3 * rows};
  int64_t *order = w + {4 * rows}, *inv = w + {5 * rows};
  for (int64_t m = 0; m < {rows}; ++m) cur[m] = m;
  for (int64_t span = 1; span < {rows}; span *= 2) {{
    for (int64_t lo = 0; lo < {rows}; lo += 2 * span) {{
      const int64_t mid = lo + span < {rows} ? lo + span : {rows};
      const int64_t hi = lo + 2 * span < {rows} ? lo + 2 * span : {rows};
      int64_t i = lo, j = mid, o = lo;
      while (i < mid && j < hi) {{
        const int64_t p = cur[j], q = cur[i];
        int c = 0;
        for (int64_t m = 0; m < {width} && !c; ++m) {{
          const {load} A = KILN_KEY(KILN_AT(p, m)), B = KILN_KEY(KILN_AT(q, m));
          c = (A < B || (B != B && A == A)) ? -1 : (A > B || (A != A && B == B)) ? 1 : 0;
        }}
        nxt[o++] = (c < 0 || (c == 0 && p < q)) ? cur[j++] : cur[i++];
      }}
      while (i < mid) nxt[o++] = cur[i++];
      while (j < hi) nxt[o++] = cur[j++];
    }}
    int64_t* tmp = cur; cur = nxt; nxt = tmp;
  }}
  for (int64_t s = 0; s < {rows}; ++s) {{
    int eq = s > 0;
    for (int64_t m = 0; m < {width} && eq; ++m) {{
      const {load} A = KILN_KEY(KILN_AT(cur[s - 1], m)), B = KILN_KEY(KILN_AT(cur[s], m));
      eq = {same};
    }}
    if (!eq) {{ first[n] = cur[s]; count[n++] = 0; }}
    ++count[n - 1];
    inv[cur[s]] = n - 1;
  }}
{rank}{"".join(writes)}  free(w);
  return 0;
#undef KILN_AT
#undef KILN_KEY"""
    shapes = [(cap,) if a is None else d[:a] + (cap,) + d[a + 1:], (cap,), (cap,), (cap,)]
    return ctx.extern(body, [x], [(sh, x.dtype if k == 0 else DType.int64) for k, sh in enumerate(shapes[:nout])],
                      dynamic=True)


def _topk_k(ctx, k=None):
    if ctx.opset < 10:
        return ctx.attr("k")
    if k is None:
        return None if ctx.value(1) is None else int(scalar(ctx.value(1)))
    if k.size != 1:
        ctx.fail(f"K must hold one value, got shape {k.shape}")
    return int(scalar(k))


def _topk_infer(ctx):
    s, k = ctx.shape(0), _topk_k(ctx)
    if s is None:
        return [TensorType(ctx.dtype(0), None), TensorType(DType.int64, None)]
    a = _axis(ctx, len(s), -1)
    if k is not None and (k < 0 or isinstance(s[a], int) and k > s[a]):
        ctx.fail(f"k={k} is out of range for axis {a} of size {s[a]}")
    y = s[:a] + (ctx.new_dim() if k is None else k,) + s[a + 1:]
    return [TensorType(ctx.dtype(0), y), TensorType(DType.int64, y)]


@op("TopK", infer=_topk_infer)
def topk(ctx, x, k=None):
    a, k = _axis(ctx, x.ndim, -1), _topk_k(ctx, k)
    n = x.shape[a]
    if not 0 <= k <= n:
        ctx.fail(f"k={k} is out of range for axis {a} of size {n}")
    if ctx.attr("largest", 1):  # descending, ties by ascending index: sort the reversed axis stably
        order = n - 1 - np.flip(np.argsort(np.flip(x, a), axis=a, kind="stable"), a)
    else:
        order = np.argsort(x, axis=a, kind="stable")
    idx = np.take(order, np.arange(k), axis=a)
    return np.take_along_axis(x, idx, axis=a), idx.astype(np.int64)


@lowering("TopK")
@sized_by("K")
def _topk_lower(ctx, x, k=None):
    """Per line along the axis, the positions ordered by (value, position), NaN the largest:
    for small k an insertion into the k best so far (most elements are rejected by one
    comparison with the k-th), else a merge sort. Lines run in parallel when there is work."""
    shape, a = x.shape, _axis(ctx, len(x.shape), -1)
    n, kk = shape[a], ctx.out_shape()[a]
    inner = math.prod(shape[a + 1:])
    lines = math.prod(shape[:a]) * inner
    t = _c_type(ctx, x.dtype)
    y = shape[:a] + (kk,) + shape[a + 1:]
    if lines == 0 or kk == 0:
        return ctx.extern("  return 0;", [x, k], [(y, x.dtype), (y, DType.int64)])
    nan, cmp = ("1", ">") if ctx.attr("largest", 1) else ("0", "<")
    body = f"""#define KILN_BEFORE(p, q) kiln_before_(src[(p) * {inner}], src[(q) * {inner}], (p), (q))
#define kiln_before_(A, B, p, q) \\
  ((A != A) ? ((B != B) ? p < q : {nan}) : (B != B) ? {1 - int(nan)} : (A {cmp} B || (A == B && p < q)))
  int32_t failed = 0;
  #pragma omp parallel if ({lines * n} > {1 << 15})
  {{
    int64_t* idx = (int64_t*)malloc(2 * {n} * sizeof(int64_t));
    #pragma omp for schedule(static)
    for (int64_t line = 0; line < {lines}; ++line) {{
      if (!idx) {{
        #pragma omp atomic write
        failed = 1;
        continue;
      }}
      const {t}* src = in0 + line / {inner} * {n * inner} + line % {inner};
      int64_t* cur = idx;
      {_TOPK_INSERT if kk <= 64 else _TOPK_MERGE}
      const int64_t base = line / {inner} * {kk * inner} + line % {inner};
      for (int64_t m = 0; m < {kk}; ++m) {{
        out0[base + m * {inner}] = src[cur[m] * {inner}];
        out1[base + m * {inner}] = cur[m];
      }}
    }}
    free(idx);
  }}
  return failed ? -1 : 0;
#undef kiln_before_
#undef KILN_BEFORE"""
    return ctx.extern(body.replace("N_", str(n)).replace("K_", str(kk)), [x, k], [(y, x.dtype), (y, DType.int64)])


_TOPK_INSERT = """int64_t cnt = 0;
      for (int64_t m = 0; m < N_; ++m) {
        if (cnt == K_ && !KILN_BEFORE(m, cur[K_ - 1])) continue;
        int64_t pos = cnt < K_ ? cnt++ : K_ - 1;
        for (; pos > 0 && KILN_BEFORE(m, cur[pos - 1]); --pos) cur[pos] = cur[pos - 1];
        cur[pos] = m;
      }"""

_TOPK_MERGE = """int64_t* nxt = idx + N_;
      for (int64_t m = 0; m < N_; ++m) cur[m] = m;
      for (int64_t w = 1; w < N_; w *= 2) {
        for (int64_t lo = 0; lo < N_; lo += 2 * w) {
          int64_t mid = lo + w < N_ ? lo + w : N_, hi = lo + 2 * w < N_ ? lo + 2 * w : N_;
          int64_t i = lo, j = mid, o = lo;
          while (i < mid && j < hi) nxt[o++] = KILN_BEFORE(cur[j], cur[i]) ? cur[j++] : cur[i++];
          while (i < mid) nxt[o++] = cur[i++];
          while (j < hi) nxt[o++] = cur[j++];
        }
        int64_t* tmp = cur; cur = nxt; nxt = tmp;
      }"""


def _onehot_axis(ctx, rank: int) -> int:
    axis = ctx.attr("axis", -1)
    if not -rank - 1 <= axis <= rank:
        ctx.fail(f"axis {axis} is out of range for output rank {rank + 1}")
    return axis + rank + 1 if axis < 0 else axis


def _onehot_infer(ctx):
    s, depth = ctx.shape(0), scalar(ctx.value(1))
    if s is None:
        return out(ctx, ctx.dtype(2), None)
    a = _onehot_axis(ctx, len(s))
    return out(ctx, ctx.dtype(2), s[:a] + (ctx.new_dim() if depth is None else int(depth),) + s[a:])


@op("OneHot", infer=_onehot_infer)
def onehot(ctx, indices, depth, values):
    depth, a = int(scalar(depth)), _onehot_axis(ctx, indices.ndim)
    if depth < 1 or values.size != 2:
        ctx.fail(f"depth must be positive and values hold [off, on], "
                 f"got depth {depth}, values of shape {values.shape}")
    ctx.check_size((*indices.shape, depth), np.int64)
    idx = np.expand_dims(np.where(indices < 0, indices + depth, indices), a)  # fractional: no class
    classes = np.arange(depth).reshape([-1 if k == a else 1 for k in range(indices.ndim + 1)])
    off, on = values.reshape(-1)
    return np.where(idx == classes, on, off).astype(values.dtype)


@lowering("OneHot")
@sized_by("depth")
def _onehot_lower(ctx, indices, depth, values):
    shape = ctx.out_shape()
    a = _onehot_axis(ctx, len(indices.shape))
    n, dt = shape[a], ctx.out_dtype()
    if n < 1 or math.prod(values.shape) != 2:
        ctx.fail(f"depth must be positive and values hold [off, on], got depth {n}, values {values.shape}")
    off, on = (values[tuple(unflat_index(k, values.shape))] for k in (0, 1))
    wide = DType.float64 if indices.dtype.is_float else INDEX  # fractional indices match no class

    def fn(*i):
        j = cast(wide, indices[i[:a] + i[a + 1:]])
        j = select(j < 0, j + const(n, wide), j)
        return select(j.eq(cast(wide, i[a])), on, off)
    ctx.schedule(rows_schedule())
    return compute(shape, lambda *i: cast(dt, fn(*i)), "onehot")
