"""Native lowerings of the tensor family (kiln.ops.tensor: constants, shape queries,
layout/shape manipulation), and the index helpers other families' lowerings share.

They are index remappings: each output element reads the input element it comes from
(`reshape_index`, per-axis affine maps, clamped selects for padding), with
`rows_schedule` giving copy kernels contiguous, vectorized inner loops. Shape-giving
inputs are read from the output types.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from kiln.dtypes import DType
from kiln.loops import INDEX, cast, compute, const, max_, min_, select
from kiln.loops.symbols import hint, same_size, size_hint, static
from kiln.lower.decisions import parallel_min_work
from kiln.lower.context import lowering
from kiln.ops.shapes import normalize_axis
from kiln.ops.tensor import (_clamped, _concat_axis, _constant_data, _fill, _mode, _pad_plan, _pads, _perm,
    _reverse_sequence_axes, _shape_range, _slice_args, scalar)


# ---- lowering helpers shared with indexing.py ----

ZERO = const(0, INDEX)


def clamp(e, lo, hi):
    """`e` forced into [lo, hi]: indices that the reference rejects never read out of bounds."""
    return min_(max_(e, lo), hi)


def checked_index(ctx, e, lo: int, hi: int, message: str):
    """`e` (read from the inputs) clamped into [lo, hi], with a run-time check that it was
    already there: a value the reference rejects fails the kernel with `message` (which
    shows the value as {value}) and is never used to address memory out of bounds."""
    e = cast(INDEX, e)
    return ctx.check(clamp(e, lo, hi), (e >= lo) & (e <= hi), e, message)


def float_index(v, lo: int, hi: int):
    """Float expr `v` as an int64 index in [lo, hi] (NaN: lo), clamped before the cast: C's
    cast of NaN or of a value out of int64's range is undefined (x86 gives INT64_MIN)."""
    f = v.dtype
    inside = min_(max_(v, const(float(lo), f)), const(float(hi), f))
    return cast(INDEX, select(v.eq(v), inside, const(float(lo), f)))


def flat_index(idx, shape):
    """Row-major position of index exprs `idx` in `shape`."""
    f = ZERO
    for i, d in zip(idx, shape):
        f = f * d + i
    return f


def unflat_index(flat, shape) -> list:
    """Index exprs of row-major position `flat` in `shape` (no division for dims of size 1,
    no modulo for the outermost dim that is not 1)."""
    if 0 in shape:
        return [ZERO] * len(shape)
    idx, outer, stride = [], 1, math.prod(shape)
    for d in shape:
        stride //= d
        e = flat if stride == 1 else flat // stride
        idx.append(ZERO if d == 1 else e if outer == 1 else e % d)
        outer *= d
    return idx


def reshape_index(in_shape, out_shape):
    """fn(out_idx) -> in_idx for the same row-major data seen with another shape.

    Dims are matched in the smallest groups of equal size (size-1 dims dropped), so a
    dim that survives a reshape costs no division and only merged/split dims are remapped.
    """
    if any(static(d) and int(hint(d)) == 0 for d in (*in_shape, *out_shape)):
        return lambda idx: [ZERO] * len(in_shape)
    ins = [k for k, d in enumerate(in_shape) if not same_size(d, 1)]
    outs = [k for k, d in enumerate(out_shape) if not same_size(d, 1)]
    try:
        groups = _reshape_groups(in_shape, out_shape, ins, outs)
    except IndexError:   # symbolic sizes grouped by their hints, wrongly: one group is always right
        groups = [(outs, ins)] if outs else []

    def fn(idx):
        res = [ZERO] * len(in_shape)
        for go, gi in groups:
            f = flat_index([idx[k] for k in go], [out_shape[k] for k in go])
            for k, e in zip(gi, unflat_index(f, [in_shape[k] for k in gi])):
                res[k] = e
        return res
    return fn


def _reshape_groups(in_shape, out_shape, ins, outs) -> list:
    """(output dims, input dims) groups of equal size; sizes may be symbolic (kiln.loops.symbols:
    compared by `same_size`, the smaller side extended by its hint)."""
    groups, i, j = [], 0, 0
    while i < len(outs):
        go, gi = [outs[i]], [ins[j]]
        po, pi = out_shape[outs[i]], in_shape[ins[j]]
        while not same_size(po, pi):
            if hint(po) < hint(pi):
                i += 1
                go.append(outs[i])
                po = po * out_shape[outs[i]]
            else:
                j += 1
                gi.append(ins[j])
                pi = pi * in_shape[ins[j]]
        groups.append((go, gi))
        i, j = i + 1, j + 1
    if j != len(ins):
        raise IndexError("input dims left over")
    return groups


def scalar_expr(t, data, dtype: DType | None = None):
    """The single element of input tensor `t` as an Expr: a constant when its data is known
    at compile time, else a load; cast to `dtype` when given."""
    e = const(scalar(data), t.dtype) if data is not None else t[(0,) * len(t.shape)]
    return e if dtype is None else cast(dtype, e)


def const_compute(data, name: str = "const"):
    """A compute whose elements are the constants of `data`: a select chain over the runs of
    equal values along the flat index (one constant for a splat; meant for small tensors)."""
    data = np.asarray(data)
    dt, flat = DType.from_numpy(data.dtype), data.reshape(-1)
    runs: list = []  # (end, value)
    for k, v in enumerate(flat):
        if runs and runs[-1][1].tobytes() == v.tobytes():
            runs[-1] = (k + 1, v)
        else:
            runs.append((k + 1, v))

    def fn(*i):
        if not runs:
            return const(0, dt)
        f, e = flat_index(i, data.shape), const(runs[-1][1].item(), dt)
        for end, v in reversed(runs[:-1]):
            e = select(f < end, const(v.item(), dt), e)
        return e
    return compute(data.shape, fn, name)


def sized_by(what: str):
    """Lowering decorator for ops whose output shape comes from input *data* (`what`): when
    that data is not known at compile time the output shape is symbolic, and the lowering
    fails naming the input instead of guessing (the cpu target specialises small integer
    inputs to their values, so this is the case only for float or computed shape data)."""
    def deco(fn):
        @functools.wraps(fn)
        def lower(ctx, *args):
            if ctx.dynamic():
                ctx.fail(f"the output shape depends on the run-time value of {what}; "
                         "native code needs it known at compile time")
            return fn(ctx, *args)
        return lower
    return deco


def rows_schedule(max_inner: int | None = None, min_inner: int = 16):
    """Schedule for copy-like kernels: the fewest trailing output axes (at most `max_inner`,
    at least one) spanning `min_inner` elements fused into one vectorized loop of contiguous
    stores, the other axes fused into one loop, parallel when the kernel is big enough.
    Index arithmetic and conditions on the outer axes stay invariant in the inner loop."""
    def fn(sch, outs):
        for t in outs:
            st = sch[t]
            axes = list(st.axis)
            if not axes:
                continue
            cap = len(axes) if max_inner is None else min(max(max_inner, 1), len(axes))
            k, span = len(axes) - 1, hint(t.shape[-1])   # symbolic sizes at their hints
            while k > len(axes) - cap and span < min_inner and static(t.shape[k - 1]):
                k -= 1
                span *= t.shape[k]
            inner = st.fuse(*axes[k:])
            st.vectorize(inner)
            if k:
                outer = st.fuse(*axes[:k])
                if size_hint(t.shape) >= parallel_min_work() and size_hint(t.shape[:k]) > 1:
                    st.parallel(outer)
    return fn


CONST_COMPUTE_MAX = 64  # larger non-splat constants become a C table


@lowering("Constant")
def _constant_lower(ctx):
    data = _constant_data(ctx)
    dt = DType.from_numpy(data.dtype)
    if dt.c is None:
        ctx.fail(f"a {dt} constant has no native (C) representation")
    bits = data.reshape(-1).view(f"u{data.itemsize}")
    if data.size <= CONST_COMPUTE_MAX or (bits == bits[0]).all():
        return const_compute(data, "constant")
    body = (f"  static const {dt.c} table[{data.size}] = {{{', '.join(c_literals(data, dt))}}};\n"
            f"  memcpy(out0, table, sizeof table);\n  return 0;")
    return ctx.extern(body, [], [(data.shape, dt)])


def c_literals(data, dt: DType) -> list[str]:
    """Exact C literals for the elements of `data` (hex floats; NAN/INFINITY by name)."""
    flat = data.reshape(-1)
    if dt.is_float:
        named = {math.inf: "INFINITY", -math.inf: "-INFINITY"}
        return ["NAN" if v != v else named.get(v) or v.hex() for v in map(float, flat)]
    if dt is DType.bool:
        return ["1" if v else "0" for v in flat]
    suffix = "ULL" if not dt.is_signed else "LL"
    return [f"{v}{suffix}" if v != -2 ** 63 else "INT64_MIN" for v in map(int, flat)]


@lowering("ConstantOfShape")
@sized_by("the input shape")
def _constant_of_shape_lower(ctx, shape):
    fill = _fill(ctx)[0].item()
    return compute(ctx.out_shape(), lambda *i: const(fill, ctx.out_dtype()), "constant_of_shape")


@lowering("Shape")
def _shape_lower(ctx, x):
    dims = x.shape[_shape_range(ctx, len(x.shape))]
    if all(static(d) for d in dims):
        return const_compute(np.array([int(d) if not hasattr(d, "op") else int(d.arg) for d in dims], np.int64),
                             "shape")
    # sizes of a shape-generic module (kiln.loops.symbols): read at run time

    def fn(i):
        e = cast(INDEX, dims[-1])
        for k in range(len(dims) - 2, -1, -1):
            e = select(i.eq(k), cast(INDEX, dims[k]), e)
        return e
    return compute((len(dims),), fn, "shape")


@lowering("Size")
def _size_lower(ctx, x):
    return const_compute(np.array(math.prod(x.shape), np.int64), "size")


@sized_by("the shape or axes input")
def _reshape_lower(ctx, x, *_):
    """Reshape-like ops copy the row-major data (the shape input is the known output shape)."""
    to = reshape_index(x.shape, ctx.out_shape())
    ctx.schedule(rows_schedule())
    return compute(ctx.out_shape(), lambda *i: x[tuple(to(i))], "reshape")


for _name in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
    lowering(_name)(_reshape_lower)


@lowering("Transpose")
def _transpose_lower(ctx, x):
    perm = _perm(ctx, len(x.shape))
    inv = [perm.index(k) for k in range(len(perm))]
    ctx.schedule(_transpose_schedule(perm, ctx.out_shape()))
    return compute(ctx.out_shape(), lambda *i: x[tuple(i[j] for j in inv)], "transpose")


def _transpose_schedule(perm, shape, tile: int = 16):
    """Trailing axes that keep their order are copied as contiguous rows; otherwise the
    output's last axis and the one walking the input's last axis are tiled, so both the
    loads and the stores of a tile touch few cache lines."""
    r = len(perm)
    same = next(k for k in range(r + 1) if perm[k:] == list(range(k, r)))
    a = perm.index(r - 1) if r else 0
    if same < r or r < 2 or 0 in shape:
        return rows_schedule(r - same)

    def fn(sch, outs):
        t = outs[0]
        st = sch[t]
        axes = list(st.axis)
        ao, bo, ai, bi = st.tile(axes[a], axes[-1], tile, tile)
        others = [v for k, v in enumerate(axes) if k not in (a, r - 1)]
        st.reorder(*others, ao, bo, ai, bi)
        outer = st.fuse(*others, ao, bo)
        if size_hint(t.shape) >= parallel_min_work():
            st.parallel(outer)
    return fn


@lowering("Concat")
def _concat_lower(ctx, *xs):
    shape = ctx.out_shape()
    a = normalize_axis(ctx, _concat_axis(ctx), len(shape))
    parts, off = [], 0
    for x in xs:
        if x is not None and (not static(x.shape[a]) or x.shape[a]):   # (a symbolic size is >= 1)
            parts.append((x, off))
            off += x.shape[a]

    def fn(*i):
        e = const(0, ctx.out_dtype())
        for k, (x, o) in reversed(list(enumerate(parts))):
            v = x[i[:a] + (clamp(i[a] - o, 0, x.shape[a] - 1),) + i[a + 1:]]
            e = v if k == len(parts) - 1 else select(i[a] < o + x.shape[a], v, e)
        return e
    ctx.schedule(rows_schedule(len(shape) - a - 1))
    return compute(shape, fn, "concat")


@lowering("Split")
@sized_by("split")
def _split_lower(ctx, x, *_):
    """Each output is a window of the input along the axis (sizes from the output types)."""
    a = normalize_axis(ctx, ctx.attr("axis", 0), len(x.shape))
    outs, off = [], 0
    for k in range(ctx.num_outputs):
        shape = ctx.out_shape(k)
        outs.append(compute(shape, lambda *i, o=off: x[i[:a] + (i[a] + o,) + i[a + 1:]], f"split{k}"))
        off += shape[a]
    ctx.schedule(rows_schedule())
    return outs


@lowering("Expand")
@sized_by("the target shape")
def _expand_lower(ctx, x, shape):
    lead = len(ctx.out_shape()) - len(x.shape)
    ctx.schedule(rows_schedule())
    return compute(ctx.out_shape(), lambda *i: x[tuple(ZERO if d == 1 else i[lead + k] for k, d in enumerate(x.shape))],
                   "expand")


@lowering("Tile")
@sized_by("repeats")
def _tile_lower(ctx, x, *_):
    ctx.schedule(rows_schedule())
    return compute(ctx.out_shape(), lambda *i: x[tuple(ZERO if d <= 1 else v % d for v, d in zip(i, x.shape))],
                   "tile")


@lowering("Pad")
@sized_by("pads")
def _pad_lower(ctx, x, *inputs):
    both = _pads(ctx, len(x.shape))
    if both is None:
        ctx.fail("pads (and axes) must be known at compile time for native code")
    mode, plan = _pad_plan(ctx, x.shape, both)
    dt = ctx.out_dtype()
    if ctx.opset < 11:
        fill = const(np.array(ctx.attr("value", 0.0)).astype(dt.np).item(), dt)
    else:
        v = inputs[1] if len(inputs) > 1 else None
        fill = const(0, dt) if v is None or v.size == 0 else scalar_expr(v, ctx.value(2), dt)

    def fn(*i):
        idx, inside = [], []
        for v, (c, n, (pb, pe)) in zip(i, plan):
            j = v - pb
            if pb or pe:
                if mode == "constant":
                    inside += [j >= 0, j < n]
                    j = clamp(j, 0, n - 1)
                elif mode == "edge":
                    j = clamp(j, 0, n - 1)
                elif mode == "wrap":
                    j = j % n
                else:  # reflect, pads narrower than the dim: one bounce
                    j = select(j < 0, -j, select(j >= n, 2 * (n - 1) - j, j))
            idx.append(j + c)
        e = x[tuple(idx)]
        for cond in inside[1:]:
            inside[0] = inside[0] & cond
        return select(inside[0], e, fill) if inside else e
    ctx.schedule(rows_schedule(1))
    if any(n == 0 for _, n, _ in plan):  # nothing of the input is kept: all fill
        return compute(ctx.out_shape(), lambda *i: fill, "pad")
    return compute(ctx.out_shape(), fn, "pad")


@lowering("CenterCropPad")
@sized_by("the target shape")
def _center_crop_pad_lower(ctx, x, shape):
    target, dt = ctx.out_shape(), ctx.out_dtype()

    def fn(*i):
        idx, inside = [], const(True, DType.bool)
        for v, d, t in zip(i, x.shape, target):
            if d >= t:  # crop (or keep): centred window
                idx.append(v + (d - t) // 2)
            else:  # pad: the input sits centred in zeros
                j = v - (t - d) // 2
                inside = inside & (j >= 0) & (j < d)
                idx.append(clamp(j, 0, d - 1))
        return select(inside, x[tuple(idx)], const(0, dt))
    ctx.schedule(rows_schedule(1))
    if 0 in x.shape:
        return compute(target, lambda *i: const(0, dt), "center_crop_pad")
    return compute(target, fn, "center_crop_pad")


@lowering("Slice")
@sized_by("starts/ends/axes/steps")
def _slice_lower(ctx, x, *_):
    sl = _slice_args(ctx, len(x.shape))
    if sl is None:
        ctx.fail("starts, ends, axes and steps must be known at compile time for native code")
    # an axis left whole reads as it is (a symbolic size, kiln.loops.symbols, included)
    # an axis of symbolic size read from a start >= 0 by steps > 0 starts there (the output's
    # size, from kiln.lower.symbolic_shapes, says how far it reads)
    first_step = [(0, d, 1) if k == slice(None) else
                  (k.start, None, k.step) if not static(d) and k.step > 0 and 0 <= k.start else
                  _clamped(d, k).indices(d) for d, k in zip(x.shape, sl)]
    ctx.schedule(rows_schedule())
    return compute(ctx.out_shape(), lambda *i: x[tuple(b + v * st for v, (b, _, st) in zip(i, first_step))],
                   "slice")


@lowering("Range")
@sized_by("start, limit and delta")
def _range_lower(ctx, start, limit, delta):
    """start + i*delta in float64 (integers: int64), rounded once, as the reference."""
    dt = ctx.out_dtype()
    wide = DType.float64 if dt.is_float else INDEX
    s, d = scalar_expr(start, ctx.value(0), wide), scalar_expr(delta, ctx.value(2), wide)
    return compute(ctx.out_shape(), lambda i: cast(dt, s + cast(wide, i) * d), "range")


@lowering("EyeLike")
def _eye_like_lower(ctx, x):
    k = ctx.attr("k", 0)
    return compute(ctx.out_shape(), lambda i, j: cast(ctx.out_dtype(), (j - i).eq(k)), "eye_like")


@lowering("Trilu")
def _trilu_lower(ctx, x, k=None):
    k = ZERO if k is None else scalar_expr(k, ctx.value(1), INDEX)
    upper = ctx.attr("upper", 1)

    def fn(*i):
        diag = i[-1] - i[-2]
        return select(diag >= k if upper else diag <= k, x[i], const(0, x.dtype))
    ctx.schedule(rows_schedule(1))
    return compute(x.shape, fn, "trilu")


@lowering("DepthToSpace")
def _depth_to_space_lower(ctx, x):
    bs, c = ctx.attr("blocksize"), ctx.out_shape()[1]
    dcr = _mode(ctx) == "DCR"

    def fn(n, ch, h, w):
        i1, i2 = h % bs, w % bs
        src = (i1 * bs + i2) * c + ch if dcr else (ch * bs + i1) * bs + i2
        return x[n, src, h // bs, w // bs]
    ctx.schedule(rows_schedule(1))
    return compute(ctx.out_shape(), fn, "depth_to_space")


@lowering("SpaceToDepth")
def _space_to_depth_lower(ctx, x):
    bs, c = ctx.attr("blocksize"), x.shape[1]
    dcr = _mode(ctx) == "DCR"

    def fn(n, ch, h, w):
        if dcr:  # ch = (i1*bs + i2)*C + c
            i1, i2, src = ch // (bs * c), ch // c % bs, ch % c
        else:  # ch = (c*bs + i1)*bs + i2
            i1, i2, src = ch // bs % bs, ch % bs, ch // (bs * bs)
        return x[n, src, h * bs + i1, w * bs + i2]
    ctx.schedule(rows_schedule(1))
    return compute(ctx.out_shape(), fn, "space_to_depth")


@lowering("ReverseSequence")
def _reverse_sequence_lower(ctx, x, lens):
    b_ax, t_ax = _reverse_sequence_axes(ctx)
    if {b_ax, t_ax} != {0, 1}:
        ctx.fail(f"batch_axis/time_axis must be 0 and 1, got {b_ax}, {t_ax}")
    steps = x.shape[t_ax]

    def fn(*i):
        n = checked_index(ctx, lens[i[b_ax]], 0, steps, f"sequence_lens value {{value}} is out of range [0, {steps}]")
        t = i[t_ax]
        return x[tuple(select(t < n, n - 1 - t, t) if k == t_ax else v for k, v in enumerate(i))]
    ctx.schedule(rows_schedule())
    return compute(x.shape, fn, "reverse_sequence")
