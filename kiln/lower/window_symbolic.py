"""Sliding-window ops over symbolic image sizes (issue 15 item 1): Conv, MaxPool,
AveragePool and nearest Resize when H or W is a symbol of a shape-generic module.

The static lowerings (kiln.lower.conv, kiln.lower.pool, kiln.lower.image) plan tiles on
concrete sizes: a padded, phase-split plane whose row length is the padded width, register
blocks whose remainders are thrown away, tap tables baked into C. With a symbolic H or W
those plans have no size to work on, so these lowerings write the window directly: each
output reads its taps from the input under a bounds check (the padding), the output size
comes from the run-time shape (kiln.lower.symbolic_shapes: floor((H + pads - span) /
stride) + 1), and the schedule is the one a row of outputs takes: (image, channel) in
parallel, the row's outputs accumulated in a local array over the taps, the last axis
vectorized with its remainder handled by the loop lowering. The kernel, the padding and
the strides are ints; only the extents are symbolic.
"""

from __future__ import annotations

import math

from kiln.dtypes import DType
from kiln.loops import cast, ceil, compute, const, floor, max_, min_, reduce_axis, select, sum_
from kiln.loops.symbols import UNBOUNDED, hint, static
from kiln.lower.nnutil import _acc_dtype, _conj, _pool_taps, _window_count, accumulate_rows, parallel_worth, schedule_rows


def symbolic_spatial(shape) -> bool:
    """Does a tensor N,C,*spatial have a symbolic spatial size?"""
    return any(not static(d) for d in shape[2:])


def _window(ctx, nd: int, kernel: list[int]):
    """(strides, dilations, pads before) of a window with explicit pads (auto_pad SAME only at
    stride 1, where the pads do not depend on the size; kiln.lower.symbolic_shapes agrees)."""
    strides = [int(v) for v in ctx.attr("strides", [1] * nd)]
    dil = [int(v) for v in ctx.attr("dilations", [1] * nd)]
    auto = ctx.attr("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if auto == "VALID":
        begin = [0] * nd
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        if any(s != 1 for s in strides):
            ctx.fail("auto_pad SAME with a stride over a symbolic image size (its pads depend on the size)")
        total = [(k - 1) * d for k, d in zip(kernel, dil)]
        begin = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
    else:
        begin = [int(p) for p in (ctx.attr("pads", None) or [0] * (2 * nd))[:nd]]
    if int(ctx.attr("ceil_mode", 0)):
        ctx.fail("ceil_mode over a symbolic image size")
    return strides, dil, begin


def _win(ctx, x, kernel: list[int]):
    """The window as kiln.ops.nn.Window (ints but the output sizes), for the pools' helpers."""
    from kiln.ops.nn import Window  # noqa: PLC0415
    nd = len(x.shape) - 2
    strides, dil, begin = _window(ctx, nd, kernel)
    end = [int(p) for p in (ctx.attr("pads", None) or [0] * (2 * nd))[nd:]]
    return Window(list(kernel), strides, dil, begin, end, list(ctx.out_shape(0)[2:]), [0] * nd)


def _taps(x, n, c, o, ks, win, pad):
    """x at the taps ks of output position o: `pad` outside the input (a select: the load
    happens only inside, so the index needs no clamping)."""
    pos, ok, _ = _pool_taps(win, o, ks, list(x.shape[2:]))
    return select(ok, x[(n, c, *pos)], pad)


def _row_schedule(stage_of, work: int, target):
    """A window op's result: (image, channel) fused and parallel, one row of outputs
    accumulated in a local array over the taps, the row's axis vectorized."""
    def fn(sch, outputs):
        sl = accumulate_rows(sch, stage_of, work, target)
        lax = list(sl.axis)
        taps = sl.reduce_axis[1:] if len(sl.reduce_axis) > len(lax) - 2 else sl.reduce_axis
        if taps and math.prod(int(k.arg.dom[1]) for k in taps) <= 9:
            for k in taps:
                sl.unroll(k)
        if hint(lax[-1].arg.dom[1]) >= 4:
            sl.vectorize(lax[-1])
    return fn


def conv(ctx, x, w, b=None):
    """A Conv (any group, 1-D to 3-D) over symbolic image sizes, NCHW.

    Schedule (conv_native's register block, over a symbolic width): a tile is (image, block
    of `ocb` output channels, output row, a run of the row: a vector, up to 4 for a narrow
    block); its accumulators, about 8 vectors, stay in registers over the input channels and
    taps, so each input vector loaded feeds ocb FMAs. The row's last run is computed whole
    from the zero padding and only its store is guarded."""
    nd = len(x.shape) - 2
    group = int(ctx.attr("group", 1))
    kernel = [int(k) for k in w.shape[2:]]
    strides, dil, begin = _window(ctx, nd, kernel)
    acc = _acc_dtype(x.dtype)
    cg, ocg = int(w.shape[1]), int(w.shape[0]) // group
    out_shape = ctx.out_shape(0)
    ic = reduce_axis(cg, "ic")
    ks = [reduce_axis(k, f"k{i}") for i, k in enumerate(kernel)]

    ocb = next(v for v in (8, 4, 2, 1) if ocg % v == 0)
    # a run: one vector per channel of the block, up to 4 vectors when the block is narrower
    # (a depthwise conv's one channel), so a tile holds about 8 vectors of accumulators
    lanes = ctx.target.vector_lanes(acc.itemsize) * max(1, min(4, 8 // ocb))
    # the input zero-padded, wide enough for whole runs of `lanes` outputs along the last axis
    # (the last run's extra outputs are computed from the padding and never stored)
    runs = (out_shape[-1] + (lanes - 1)) // lanes * lanes
    span = [(o - 1) * s_ + (k - 1) * d + 1 for o, s_, k, d in zip(list(out_shape[2:-1]) + [runs], strides, kernel, dil)]

    def pad_body(n, c, *q):
        pos = [qi - b for qi, b in zip(q, begin)]
        ok = _conj([(p_ >= 0) & (p_ < size) for p_, size in zip(pos, x.shape[2:])])
        return select(ok, x[(n, c, *pos)], const(0, x.dtype))
    xpad = compute((x.shape[0], x.shape[1], *span), pad_body, "xpad")

    def body(n, oc, *o):
        c = (oc // ocg) * cg + ic if group > 1 else ic
        pos = [oi * s_ + k * d for oi, k, s_, d in zip(o, ks, strides, dil)]
        return sum_(cast(acc, xpad[(n, c, *pos)]) * cast(acc, w[(oc, ic, *ks)]), [ic, *ks])
    # computed a tile at a time (never whole): its last axis is declared unbounded, so a tile
    # runs whole vectors with no guard (kiln.loops.symbols.UNBOUNDED)
    total = compute((*out_shape[:-1], UNBOUNDED), body, "conv_acc", acc)
    y = compute(out_shape, lambda n, oc, *o: cast(x.dtype, total[(n, oc, *o)] + cast(acc, b[oc]) if b is not None
                                                  else total[(n, oc, *o)]), "conv")
    work = math.prod(hint(d) for d in out_shape) * cg * math.prod(kernel)
    par = parallel_worth(work, ctx.target, "conv")

    def fn(sch, outputs):
        final = y
        if sch[y].attach == "inline" and outputs and tuple(outputs[0].shape) == tuple(y.shape):
            final = outputs[0]              # an elementwise epilogue fused after the conv
        sy = sch[final]
        ax = list(sy.axis)
        oco, oci = sy.split(ax[1], ocb)
        wo, wi = sy.split(ax[-1], lanes)
        sy.reorder(ax[0], oco, *ax[2:-1], wo, oci, wi)
        top = sy.fuse(ax[0], oco)
        if par:
            sy.parallel(top)
        sy.unroll(oci)
        sy.vectorize(wi)
        sa = sch[total]
        sa.compute_at(sy, wo)
        aax = list(sa.axis)
        sa.reorder(aax[0], *sa.reduce_axis, *aax[1:])
        if math.prod(kernel) <= 9:
            for k in sa.reduce_axis[1:]:
                sa.unroll(k)
        sa.unroll(aax[1])
        sa.vectorize(aax[-1])
        schedule_rows(sch[xpad], 2, ctx.target, math.prod(hint(d) for d in xpad.shape) if par else 0)
    ctx.schedule(fn)
    return y


def _lowest(dt: DType):
    import numpy as np  # noqa: PLC0415
    return const(-math.inf, dt) if dt.is_float else const(int(np.iinfo(dt.np).min), dt)


def max_pool(ctx, x):
    """MaxPool (no Indices output) over symbolic image sizes."""
    from kiln.loops import rmax  # noqa: PLC0415
    kernel = [int(k) for k in ctx.attr("kernel_shape")]
    win = _win(ctx, x, kernel)
    if ctx.num_outputs > 1 and ctx.output_used(1):
        ctx.fail("MaxPool's Indices over a symbolic image size")
    ks = [reduce_axis(k, f"k{i}") for i, k in enumerate(kernel)]
    y = compute(ctx.out_shape(0), lambda n, c, *o: rmax(_taps(x, n, c, o, ks, win, _lowest(x.dtype)), ks),
                "maxpool")
    ctx.schedule(_row_schedule(y, math.prod(hint(d) for d in y.shape) * math.prod(kernel), ctx.target))
    if ctx.num_outputs > 1:
        return [y, compute(ctx.out_shape(1), lambda *i: const(0, DType.int64), "indices")]
    return y


def average_pool(ctx, x):
    """AveragePool over symbolic image sizes: the divisor counts the taps inside the input
    (or the pads too, count_include_pad), computed per output from its position."""
    nd = len(x.shape) - 2
    kernel = [int(k) for k in ctx.attr("kernel_shape")]
    win = _win(ctx, x, kernel)
    acc = _acc_dtype(x.dtype)
    ks = [reduce_axis(k, f"k{i}") for i, k in enumerate(kernel)]
    total = compute(ctx.out_shape(0), lambda n, c, *o: sum_(cast(acc, _taps(x, n, c, o, ks, win, const(0, x.dtype))),
                                                             ks), "winsum")
    spatial = list(x.shape[2:])
    if int(ctx.attr("count_include_pad", 0)):
        lo, hi = [-b for b in win.begin], [s_ + e for s_, e in zip(spatial, win.end)]
    else:
        lo, hi = [0] * nd, spatial

    def count(o):
        return _window_count(win, o, spatial, lo, hi)
    y = compute(ctx.out_shape(0), lambda n, c, *o: cast(x.dtype, total[(n, c, *o)] / cast(acc, count(o))),
                "avgpool")
    work = math.prod(hint(d) for d in y.shape) * math.prod(kernel)
    sched = _row_schedule(total, work, ctx.target)

    def fn(sch, outputs):
        sched(sch, outputs)
        schedule_rows(sch[y], 2, ctx.target, work)
    ctx.schedule(fn)
    return y


_ROUND = {"round_prefer_floor": lambda v: ceil(v - 0.5), "round_prefer_ceil": lambda v: floor(v + 0.5),
          "floor": floor, "ceil": ceil}


def resize_nearest(ctx, x, p: dict, passes: list):
    """Nearest Resize by constant scales over symbolic sizes: each output reads the input at
    its source index, computed per output from the coordinate transformation (as
    kiln.ops.image._axis_taps does for the tables of the static kernel). A pass's scale of
    None: resized to run-time sizes, its scale out / in in double, as the reference's."""
    f64 = DType.float64
    axes = {a: (s, roi) for a, _, s, roi in passes}
    nm = p["nearest_mode"]
    ctm = p["ctm"]

    def src(a, j):
        s, _ = axes[a]
        in_len, out_len = x.shape[a], ctx.out_shape(0)[a]
        if nm == "simple":
            if s is None:
                ctx.fail("nearest_mode 'simple' (ceil or floor by the scale) to run-time sizes")
            mode = "ceil" if s < 1 else "floor"
        else:
            mode = nm
        scale = cast(f64, out_len) / cast(f64, in_len) if s is None else const(float(s), f64)
        jf = cast(f64, j)
        if ctm == "asymmetric":
            v = jf / scale
        elif ctm in ("half_pixel", "pytorch_half_pixel"):
            v = (jf + const(0.5, f64)) / scale - const(0.5, f64)
            if ctm == "pytorch_half_pixel":
                v = select(out_len > 1, v, const(0.0, f64))
        elif ctm == "align_corners":
            v = select(out_len > 1, jf * cast(f64, in_len - 1) / cast(f64, max_(out_len - 1, 1)), const(0.0, f64))
        elif ctm == "tf_half_pixel_for_nn":
            v = (jf + const(0.5, f64)) / scale
        else:
            ctx.fail(f"coordinate_transformation_mode {ctm!r} over a symbolic image size")
        r = cast(DType.int64, _ROUND[mode](v))
        return min_(max_(r, 0), in_len - 1)

    def body(*i):
        return x[tuple(src(a, j) if a in axes else j for a, j in enumerate(i))]
    y = compute(ctx.out_shape(0), body, "resize_nearest", x.dtype)
    ctx.schedule(lambda sch, outputs: schedule_rows(sch[y], len(y.shape) - 1, ctx.target,
                                                    math.prod(hint(d) for d in y.shape)))
    return y
