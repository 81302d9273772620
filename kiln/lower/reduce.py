"""Reduction lowerings (cpu target): Reduce*, ArgMax/ArgMin, Softmax/LogSoftmax/Hardmax,
CumSum/CumProd, and the schedules shared by the reduction-like families.

A reduction is a compute whose whole body is one reducer over `reduce_axis` vars;
work before it (abs, square, exp) sits inside the body, work after it (mean's
divide, sqrt, log, the cast back) in a following injective stage. Float sums and
products accumulate in float64 and integer ones in wrapping uint64, as the NumPy
reference does (it widens floats; NumPy sums small ints in int64).
"""

from __future__ import annotations

import math

import numpy as np

from kiln.codegen.csource import c_instance
from kiln.dtypes import DType
from kiln.loops import Expr, call, cast, compute, const, reduce, reduce_axis, select
from kiln.loops.symbols import c_size, extent, size_hint, static
from kiln.lower.decisions import Ints, declare, parallel_min_work
from kiln.lower.nnutil import parallel_worth
from kiln.ops.reduce import _NORMALIZE, _REDUCE, _reduce_axes, _reduce_run
from kiln.lower.context import LowerCtx, lowering
from kiln.ops.shapes import normalize_axis


# The tile sizes of the reduction and injective templates (also Softmax's, LayerNorm's and
# Attention's), declared decisions with their defaults as formulas of the Target:
# - the inner block an injective loop is split into (vectorized, the outer part parallel):
#   64 elements, chosen with these templates on the AVX2 EPYC (733fd23) and kept for
#   AVX-512 (a whole number of vectors either way: 8 AVX2 or 4 AVX-512 float32 vectors);
# - the partial results an innermost reduction is vectorized across: at least one vector
#   of float32, and 16 (one 64-byte cache line: two AVX2 vectors, so two independent add
#   chains hide the add latency; one AVX-512 vector) as measured in ea4d1ce.
REDUCE_BLOCK = declare("reduce.block", Ints(1, 4096), lambda target: 64,
                       "elements in the vectorized inner block of an injective or reduction loop")
REDUCE_LANES = declare("reduce.lanes", Ints(1, 256),
                       lambda target: max(16, 16 if target is None else target.vector_lanes(4)),
                       "partial results an innermost reduction is vectorized across")


def full_index(ndim: int, ks: dict, keep: bool, out_idx) -> tuple:
    """The input index of a reduction over `ks` (axis -> reduce var) given output index vars."""
    it, full = iter(out_idx), []
    for a in range(ndim):
        if a in ks and keep:
            next(it)
        full.append(ks[a] if a in ks else next(it))
    return tuple(full)


def reduction(shape, axes, keep: bool, body, comb: str, name: str):
    """Reduce `body(input index)` with `comb` over `axes` of `shape`, reduced dims kept
    as 1 (keep) or dropped. No axes: the body itself."""
    ks = {a: reduce_axis(shape[a], f"k{a}") for a in sorted(axes)}

    def fn(*o):
        v = body(full_index(len(shape), ks, keep, o))
        return reduce(comb, v, list(ks.values())) if ks else v
    out = [1 if a in ks else n for a, n in enumerate(shape)] if keep else \
        [n for a, n in enumerate(shape) if a not in ks]
    return compute(out, fn, name)


def exp_shifted(d):
    """exp(d) for d <= 0 (a value minus its row's max) as the `exp_floored` intrinsic,
    exp(max(d, floor)) with exp(floor) still a normal number: glibc's vector exp runs a
    scalar loop over all lanes when one would underflow, and masked attention scores
    (-inf, -1e9) make that nearly every vector (gpt2's causal softmax 4x slower). A result
    below exp(floor) reads as exp(floor), at most 1.7e-38 (float32) or 3.3e-308 (float64),
    instead of a denormal or 0; exp(-inf) stays exactly 0 (an all-masked attention row)."""
    return select(d.eq(const(-math.inf, d.dtype)), const(0, d.dtype), call("exp_floored", d))


def bcast(t, axes, idx):
    """Read keepdims-shaped `t` at input index `idx` (reduced axes at 0)."""
    return t[tuple(0 if a in axes else i for a, i in enumerate(idx))]


def accumulator(dt: DType, comb: str) -> DType:
    """Where a reduction of `dt` accumulates: max/min exactly in dt (bool as uint8)."""
    if comb in ("max", "min"):
        return DType.uint8 if dt is DType.bool else dt
    return DType.float64 if dt.is_float else DType.uint64


def as_f64(acc, dt: DType):
    """An accumulated value as float64, integers read back as signed when dt is."""
    if dt.is_float:
        return cast(DType.float64, acc)
    return cast(DType.float64, cast(DType.int64, acc) if dt.is_signed else acc)


def wrap_square(x):
    """x*x in x's own type, wrapping for integers as np.square does."""
    if x.dtype.is_float:
        return x * x
    u = DType.uint64 if x.dtype.itemsize == 8 else DType.uint32
    return cast(x.dtype, cast(u, x) * cast(u, x))


def const_output(ctx: LowerCtx, value: np.ndarray, k: int = 0):
    """An output whose every element is known at compile time (e.g. an empty reduction)."""
    dt = ctx.out_dtype(k)
    v = np.asarray(value).reshape(-1)[:1]
    return compute(ctx.out_shape(k), lambda *i: const(v[0].item() if v.size else 0, dt), f"const{k}")


# ---- schedules shared by the reduction-like families ----

def _ext(v) -> int:
    return extent(v)


def schedule_injective(stage, inner: int | None = None) -> None:
    """Fuse the loops, vectorize an inner block, parallelize the outer part when there is work.
    `inner`: only the trailing `inner` loops form the vector block (the rest stay outer)."""
    loops = list(stage.leaves)
    if not loops:
        return
    inner = len(loops) if inner is None else inner
    points = math.prod(_ext(v) for v in loops)
    par = points >= parallel_min_work()
    outer, tail = loops[:len(loops) - inner], loops[len(loops) - inner:]
    t = stage.fuse(*tail) if len(tail) > 1 else tail[0] if tail else None
    o = stage.fuse(*outer) if len(outer) > 1 else outer[0] if outer else None
    block = REDUCE_BLOCK.value() if t is not None else None
    if t is not None and _ext(t) > block and (o is None or _ext(o) == 1 or _ext(t) >= 4 * block):
        to, t = stage.split(t, block)
        o = stage.fuse(o, to) if o is not None else to
    if t is not None and _ext(t) > 1:
        stage.vectorize(t)
    if par and o is not None and _ext(o) > 1:
        stage.parallel(o)


def lane_partials(sch, tensor):
    """Vectorize an innermost reduction across `reduce.lanes` partial results: the last reduction
    loop is split by that many and rfactored, so each lane accumulates every lanes-th element
    (a spatial, vectorizable loop inside the reduction); the stage then combines the
    lanes. Returns the partials' tensor (for the caller to place), or None when the
    reduction is too short."""
    stage = sch[tensor]
    k = stage.reduce_axis[-1]
    lanes = REDUCE_LANES.value()
    if _ext(k) < 2 * lanes:
        return None
    ko, ki = stage.split(k, lanes)
    rf = sch.rfactor(tensor, ki, len(stage.axis))
    st = sch[rf]
    lane = st.axis[-1]
    st.reorder(*st.reduce_axis, lane)
    st.vectorize(lane)
    return rf


def schedule_reduction(sch, tensor, inner: int = 0) -> None:
    """Reduction stage: outer spatial loops, the reduction, then the `inner` trailing spatial
    loops (contiguous in the input, vectorized). Parallel over the outer loops; an innermost
    reduction is vectorized across lane partials; a large reduction to few outputs is
    first split into parallel partial reductions (rfactor)."""
    stage = sch[tensor]
    sp, red = list(stage.axis), list(stage.reduce_axis)
    points = math.prod(_ext(v) for v in sp)
    size = math.prod(_ext(k) for k in red)
    par = points * size >= parallel_min_work()
    outer, tail = sp[:len(sp) - inner], sp[len(sp) - inner:]
    if red and par and points < 8 and size >= parallel_min_work() and all(static(k.arg.dom[1]) for k in red):
        k = red[0] if _ext(red[0]) >= 16 else stage.fuse(*red)  # fused indices cost a div/mod
        ko, _ = stage.split(k, nparts=min(64, _ext(k), size // 4096))
        schedule_reduction(sch, sch.rfactor(tensor, ko))  # the chunks: parallel, vectorized
        return
    rf = lane_partials(sch, tensor) if red and not tail else None
    if tail and red:
        stage.reorder(*outer, *red, *tail)
    t = stage.fuse(*tail) if len(tail) > 1 else tail[0] if tail else None
    o = stage.fuse(*outer) if len(outer) > 1 else outer[0] if outer else None
    if t is not None and red and par and (o is None or _ext(o) < 8) and _ext(t) >= 4 * REDUCE_BLOCK.value():
        to, t = stage.split(t, REDUCE_BLOCK.value())  # too few outer rows: blocks of the tail run in parallel
        stage.reorder(*([o] if o is not None else []), to, *red, t)
        o = stage.fuse(o, to) if o is not None else to
    if t is not None and _ext(t) > 1:
        stage.vectorize(t)
    if par and o is not None and _ext(o) > 1:
        stage.parallel(o)
    if rf is not None and o is not None:
        sch[rf].compute_at(stage, o)


def schedule_stages(sch, plans: dict) -> None:
    """Apply `plans` (tensor -> trailing contiguous loop count, for reductions the
    spatial ones after the reduction) to every root stage; injective stages not named
    in `plans` get the plain injective schedule."""
    for stage in list(sch.stages):
        if stage.attach is not None or stage.relations or stage.kinds:
            continue
        inner = plans.get(stage.tensor)
        if stage.reduce_axis:
            schedule_reduction(sch, stage.tensor, inner or 0)
        else:
            schedule_injective(stage, inner)


# ---- Reduce* ----

_F64 = DType.float64

# name -> (reducer, per-element map, finishing map of (float64 value, element count))
_REDUCE_LOWER = {
    "ReduceSum": ("sum", None, None),
    "ReduceMean": ("sum", None, lambda v, n: v / (cast(_F64, n) if isinstance(n, Expr) else const(n, _F64))),
    "ReduceMax": ("max", None, None),
    "ReduceMin": ("min", None, None),
    "ReduceProd": ("prod", None, None),
    "ReduceL1": ("sum", lambda x: call("abs", x), None),
    "ReduceL2": ("sum", wrap_square, lambda v, n: call("sqrt", v)),
    "ReduceLogSum": ("sum", None, lambda v, n: call("log", v)),
    "ReduceSumSquare": ("sum", wrap_square, None),
}


def _reduce_lower(ctx: LowerCtx, x, axes_in=None):
    shape, dt = tuple(x.shape), x.dtype
    uses_input = ctx.opset >= _REDUCE[ctx.node.op][1] and ctx.has_input(1)
    axes_value = ctx.value(1) if uses_input else None
    if uses_input and tuple(ctx.input_types[1].shape) == (0,):  # empty: no data needed
        axes_value = np.zeros(0, np.int64)
    if uses_input and axes_value is None:
        ctx.fail("axes must be known at compile time for native code (a constant or initializer)")
    axes = _reduce_axes(ctx, len(shape), axes_value, True)
    if axes == ():
        return x
    if 0 in shape:
        return const_output(ctx, _reduce_run(ctx, np.zeros(shape, dt.np), axes_value))
    keep = bool(ctx.attr("keepdims", 1))
    inner = len(shape) - 1 - max(axes)  # kept dims after the last reduced one: contiguous
    if ctx.node.op == "ReduceLogSumExp":
        m = reduction(shape, axes, True, lambda i: cast(_F64, x[i]), "max", "max")
        shift = compute(m.shape, lambda *i: select(call("isinf", m[i]) | call("isnan", m[i]), const(0, _F64),
                                                   m[i]), "shift")
        r = reduction(shape, axes, keep, lambda i: exp_shifted(cast(_F64, x[i]) - bcast(shift, axes, i)),
                      "sum", "sum")
        kept = (lambda o: o) if keep else (lambda o: full_index(len(shape), dict.fromkeys(axes, 0), False, o))
        y = compute(r.shape, lambda *o: cast(dt, call("log", r[o]) + shift[kept(o)]), "y")
        plans = {m: inner, r: inner}
    else:
        comb, pre, post = _REDUCE_LOWER[ctx.node.op]
        acc = accumulator(dt, comb)

        def widen(v):  # floats map after widening (as the reference), integers before (wrapping)
            if pre is None:
                return cast(acc, v)
            return pre(cast(acc, v)) if dt.is_float else cast(acc, pre(v))
        r = reduction(shape, axes, keep, lambda i: widen(x[i]), comb, "acc")
        n = math.prod(shape[a] for a in axes)
        y = compute(r.shape, lambda *o: cast(dt, post(as_f64(r[o], dt), n) if post else r[o]), "y") \
            if post or r.dtype is not dt else r
        plans = {r: inner}
    ctx.schedule(lambda sch, outs: schedule_stages(sch, plans))
    return y


for _name in _REDUCE:
    lowering(_name)(_reduce_lower)


# ---- ArgMax / ArgMin ----

def _arg_lower(ctx: LowerCtx, x):
    shape, dt = tuple(x.shape), x.dtype
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(shape))
    comb = "max" if ctx.node.op == "ArgMax" else "min"
    val = (lambda i: cast(DType.uint8, x[i])) if dt is DType.bool else (lambda i: x[i])
    best = reduction(shape, [axis], True, val, comb, "best")

    def hit(i):  # NumPy's arg-reductions pick a NaN when there is one
        v, b = val(i), bcast(best, [axis], i)
        return v.eq(b) | v.ne(v) if dt.is_float else v.eq(b)
    last = bool(ctx.attr("select_last_index", 0))
    miss = const(-1 if last else shape[axis], DType.int64)
    idx = reduction(shape, [axis], bool(ctx.attr("keepdims", 1)), lambda i: select(hit(i), i[axis], miss),
                    "max" if last else "min", "idx")
    inner = len(shape) - 1 - axis
    ctx.schedule(lambda sch, outs: schedule_stages(sch, {best: inner, idx: inner}))
    return idx


for _name in ("ArgMax", "ArgMin"):
    lowering(_name)(_arg_lower)


# ---- Softmax / LogSoftmax / Hardmax ----

def _normalize_lower(ctx: LowerCtx, x):
    """max, exp-sum, divide over the normalized axes (one, or all from `axis` before opset 13),
    in float32; float64 for float64 and float16 (where float32 would round twice, 1 ulp off)."""
    shape, dt, nd = tuple(x.shape), x.dtype, len(x.shape)
    if ctx.opset >= 13:
        axes = [normalize_axis(ctx, ctx.attr("axis", -1), max(nd, 1))] if nd else []
    else:
        axis = ctx.attr("axis", 1)
        axis = axis + nd if axis < 0 else axis
        if not 0 <= axis <= nd:
            ctx.fail(f"axis {ctx.attr('axis')} is out of range for rank {nd}")
        axes = list(range(axis, nd))
    if 0 in shape:
        return const_output(ctx, np.zeros(1, dt.np))
    cd = DType.float32 if dt is DType.float32 else DType.float64
    op = ctx.node.op

    def xv(i):
        return cast(cd, x[i]) if op != "Hardmax" else x[i]
    m = reduction(shape, axes, True, xv, "max", "max")
    e = None
    if op == "Hardmax":
        strides = {a: math.prod(shape[b] for b in axes if b > a) for a in axes}

        def flat(i):
            return sum((i[a] * strides[a] for a in axes), const(0, DType.int64))

        def hit(i):
            v, b = x[i], bcast(m, axes, i)
            return v.eq(b) | v.ne(v)
        s = reduction(shape, axes, True, lambda i: select(hit(i), flat(i), const(1 << 62, DType.int64)),
                      "min", "first")
        y = compute(shape, lambda *i: select(flat(i).eq(bcast(s, axes, i)), const(1, dt), const(0, dt)), "y")
    elif op == "Softmax":  # exp once, into a temporary: both the sum and the divide read it
        e = compute(shape, lambda *i: exp_shifted(xv(i) - bcast(m, axes, i)), "exp")
        s = reduction(shape, axes, True, lambda i: e[i], "sum", "sum")
        y = compute(shape, lambda *i: cast(dt, e[i] / bcast(s, axes, i)), "y")
    else:
        s = reduction(shape, axes, True, lambda i: exp_shifted(xv(i) - bcast(m, axes, i)), "sum", "sum")
        y = compute(shape, lambda *i: cast(dt, xv(i) - bcast(m, axes, i) - call("log", bcast(s, axes, i))), "y")
    if op != "Hardmax" and nd >= 2 and axes == [nd - 1]:
        ctx.schedule(lambda sch, outs: schedule_per_row(sch, y, [s, e, m] if e is not None else [s, m], ctx.target))
        return y
    # trailing axes: rows, parallel over rows and vectorized along them (reductions across lanes)
    tail = nd - 1 - max(axes) if axes else 0
    rows = len(axes) if axes and sorted(axes) == list(range(nd - len(axes), nd)) else None
    plans = {m: tail, s: tail, e: rows, y: rows}
    ctx.schedule(lambda sch, outs: schedule_stages(sch, plans))
    return y


def schedule_per_row(sch, y, stages: list, target) -> None:
    """A row-wise normalization over the last axis (softmax, layer norm) as one loop over
    rows: per row, every stage of `stages` (listed consumers first: each read only by y or
    by stages before it) in a local buffer, reductions across lane partials, row-long ones
    vectorized, then y's row, vectorized. One parallel region and no heap temporaries,
    instead of a pass over the whole tensor per stage (gpt2's softmax: four parallel
    regions and a 512 KiB temporary on every call). The rows are split among threads when
    the three passes over the tensor pay for the fork on `target` (short rows of a small
    batch do not: a LayerNorm of 32 x 768 is a few microseconds)."""
    sy = sch[y]
    *lead, last = sy.axis
    row = sy.fuse(*lead) if len(lead) > 1 else lead[0]
    if parallel_worth(size_hint(y.shape) * 3, target, "copy") and _ext(row) > 1:
        sy.parallel(row)
    if _ext(last) > 1:
        sy.vectorize(last)
    for t in stages:
        parts = lane_partials(sch, t) if sch[t].reduce_axis else None
        for u in [t] + ([parts] if parts is not None else []):
            st = sch[u]
            st.compute_at(sy, row)
            if not st.reduce_axis and _ext(st.axis[-1]) > 1:
                st.vectorize(st.axis[-1])


for _name in _NORMALIZE:
    lowering(_name)(_normalize_lower)


# ---- CumSum / CumProd ----

def _cumulative_lower(ctx: LowerCtx, x, axis_in):
    """A scan along one axis as a C kernel (the axis is read at run time; a bad one
    fails the call): floats accumulate in double, integers in wrapping uint64_t, as
    the reference's widened cumsum/cumprod."""
    shape, dt = tuple(x.shape), x.dtype
    if not shape:
        ctx.fail("input must have at least one dimension")
    if dt.c is None:
        ctx.fail(f"no native code for dtype {dt}")
    total = ctx.node.op == "CumSum"
    fn = f"kiln_{ctx.node.op.lower()}_{dt.name}"
    macros = {"KILN_SCAN_T": dt.c, "KILN_SCAN_ACC": "double" if dt.is_float else "uint64_t",
              "KILN_SCAN_OP(a, b)": "((a) + (b))" if total else "((a) * (b))",
              "KILN_SCAN_UNIT": "0" if total else "1", "KILN_SCAN_FN": fn}
    sized = "static const" if all(static(d) for d in shape) else "const"   # symbolic sizes: run-time values
    body = (f"  {sized} int64_t dims[{len(shape)}] = {{{', '.join(c_size(d) for d in shape)}}};\n"
            f"  return {fn}(in0, out0, dims, {len(shape)}, (int64_t)in1[0], {parallel_min_work()}, "
            f"{int(bool(ctx.attr('reverse', 0)))}, {int(bool(ctx.attr('exclusive', 0)))});")
    preamble = c_instance("cumulative.c", macros, fn.upper())
    return ctx.extern(body, [x, axis_in], [(shape, dt)], preamble=preamble,
                      errors={1: f"axis {{value}} is out of range [-{len(shape)}, {len(shape) - 1}]"})


for _name in ("CumSum", "CumProd"):
    lowering(_name)(_cumulative_lower)
