"""Native lowerings of the indexing family (kiln.ops.indexing).

Gathers are computes whose indices are wrapped then clamped (never a read out of
bounds) and checked: an index out of range fails the run with a KilnError naming the
node and the index, as ONNX Runtime raises. Scatters, TopK and run-time sized
Compress/Unique are C kernels; the scatters fail the same way (KILN_FAIL) on an index
out of range instead of writing out of bounds.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.codegen.csource import c_instance, c_source
from kiln.dtypes import DType
from kiln.loops import INDEX, cast, compute, const, select
from kiln.loops.symbols import as_int, c_size, same_size, static
from kiln.lower.decisions import parallel_min_work
from kiln.lower.tensor import clamp, rows_schedule, sized_by, unflat_index
from kiln.ops.indexing import _axis, _indices, _nd_index, _onehot_axis
from kiln.lower.context import lowering


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


@lowering("GatherElements")
def _gather_elements_lower(ctx, data, indices):
    a = _axis(ctx, len(data.shape))

    def fn(*i):
        return data[i[:a] + (_index_expr(ctx, indices[i], data.shape[a], a),) + i[a + 1:]]
    ctx.schedule(rows_schedule())
    return _empty_or(ctx, fn, "gather_elements")


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
    """C: out0 starts as a copy of in0 (a scatter's data), unless it is in0 (a buffer bound as
    both, kiln.decode's static KV cache: then only the scattered rows are written)."""
    if static(n) and not as_int(n):
        return ""
    return (f"  if ((const void*)out0 != (const void*)in0) "
            f"memcpy(out0, in0, ({c_size(n)}) * sizeof({_c_type(ctx, dt)}));\n")


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


@lowering("TensorScatter")
def _tensor_scatter_lower(ctx, past, update, write_indices=None):
    """Sizes may be symbols of a shape-generic module (a KV cache's batch and new-token
    count, kiln.decode.concat_cache): they are written as C expressions (c_size)."""
    p, u = past.shape, update.shape
    a = _axis(ctx, len(p), -2)
    if a == 0 or len(u) != len(p) or any(not same_size(m, n) for k, (m, n) in enumerate(zip(p, u)) if k != a):
        ctx.fail(f"update {u} must match past_cache {p} except on axis {a} (not 0)")
    size, seq = c_size(p[a]), c_size(u[a])
    pre, row, nb = c_size(math.prod(p[1:a])), c_size(math.prod(p[a + 1:])), c_size(p[0])
    circular = ctx.attr("mode", "linear") == "circular"
    start = "(int64_t)in2[b]" if write_indices is not None else "0"
    if circular:  # w % size first: w + s could overflow
        check = f"if ({seq} > 0 && ({size}) == 0) KILN_FAIL(2, w);"
        pos = f"((w % ({size}) + ({size})) % ({size}) + s) % ({size})"
    else:  # w + seq > size could overflow (w read from the inputs): compare w with size - seq
        check, pos = f"if (({seq}) > 0 && (w < 0 || w > ({size}) - ({seq}))) KILN_FAIL(1, w);", "w + s"
    body = (f"{_c_copy(ctx, math.prod(p), past.dtype)}"
            f"  for (int64_t b = 0; b < {nb}; ++b) {{\n    const int64_t w = {start};\n    {check}\n"
            f"    for (int64_t q = 0; q < {pre}; ++q)\n      for (int64_t s = 0; s < {seq}; ++s)\n"
            f"        memcpy(out0 + ((b * {pre} + q) * ({size}) + {pos}) * {row},\n"
            f"               in1 + ((b * {pre} + q) * ({seq}) + s) * {row},\n"
            f"               {row} * sizeof({_c_type(ctx, past.dtype)}));\n"
            "  }\n  return 0;")
    count = f"{as_int(u[a])} updates" if static(u[a]) else "the updates"
    errors = {1: f"write_indices value {{value}} plus {count} overruns axis {a} (size {p[a]}) "
                 "of past_cache", 2: f"write_indices value {{value}}: axis {a} of past_cache is empty"}
    return ctx.extern(body, [past, update, write_indices], [(p, past.dtype)], errors=errors)


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
    """The kernel kiln/codegen/c_src/unique.c (its comment says how). The number of unique
    rows is data: the kernel writes the outputs compactly and this body reports the dims."""
    d, nout = x.shape, ctx.num_outputs
    t, load = _sort_key_type(ctx, x.dtype)
    a = None if ctx.attr("axis", None) is None else _axis(ctx, len(d))
    rows = math.prod(d) if a is None else d[a]
    outer, inner = (1, 1) if a is None else (math.prod(d[:a]), math.prod(d[a + 1:]))
    cap = max(rows, 1)
    y_dims = ["n"] if a is None else [str(v) if k != a else "n" for k, v in enumerate(d)]
    dims = (y_dims + ["n", str(rows), "n"])[:len(y_dims) + nout - 1]
    fn = f"kiln_unique_{x.dtype.name}"
    preamble = c_instance("unique.c", {"KILN_UNIQUE_S": t, "KILN_UNIQUE_K": load,
                                       "KILN_UNIQUE_KEY(v)": _KEY_OF.get(x.dtype, "(v)"), "KILN_UNIQUE_FN": fn},
                          fn.upper())
    outs = ", ".join(f"out{k}" if k < nout else "NULL" for k in range(1, 4))
    body = (f"  int64_t n = 0;\n  const int32_t rc = {fn}(in0, {rows}, {inner}, {outer}, {int(a is None)}, "
            f"{int(bool(ctx.attr('sorted', 1)))}, out0, {outs}, &n);\n  if (rc) return rc;\n"
            + "".join(f"  out{nout}[{k}] = {v};\n" for k, v in enumerate(dims)) + "  return 0;")
    shapes = [(cap,) if a is None else d[:a] + (cap,) + d[a + 1:], (cap,), (cap,), (cap,)]
    return ctx.extern(body, [x], [(sh, x.dtype if k == 0 else DType.int64) for k, sh in enumerate(shapes[:nout])],
                      dynamic=True, preamble=preamble)


@lowering("TopK")
@sized_by("K")
def _topk_lower(ctx, x, k=None):
    """The kernel kiln/codegen/c_src/topk.c (its comment says how), instantiated for the
    element type and called with this node's sizes."""
    shape, a = x.shape, _axis(ctx, len(x.shape), -1)
    n, kk = shape[a], ctx.out_shape()[a]
    inner = math.prod(shape[a + 1:])
    lines = math.prod(shape[:a]) * inner
    t = _c_type(ctx, x.dtype)
    y = shape[:a] + (kk,) + shape[a + 1:]
    if lines == 0 or kk == 0:
        return ctx.extern("  return 0;", [x, k], [(y, x.dtype), (y, DType.int64)])
    fn = f"kiln_topk_{x.dtype.name}"
    preamble = c_source("kiln_par.h") + c_instance("topk.c", {"KILN_TOPK_T": t, "KILN_TOPK_FN": fn}, fn.upper())
    largest = int(bool(ctx.attr("largest", 1)))
    body = f"  return {fn}(in0, out0, out1, {lines}, {n}, {kk}, {inner}, {largest}, {parallel_min_work()});"
    return ctx.extern(body, [x, k], [(y, x.dtype), (y, DType.int64)], preamble=preamble)


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
