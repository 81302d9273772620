"""Pooling lowerings (cpu target): MaxPool, AveragePool, LpPool, the global pools, MaxUnpool.

Pools read the padded plane the convolutions build (kiln.lower.conv.padded_plane).
"""

from __future__ import annotations

import math

import numpy as np

from kiln.dtypes import DType
from kiln.loops import cast, compute, const, reduce_axis, select, sum_
from kiln.loops.symbols import static
from kiln.lower import window_symbolic
from kiln.lower.conv import ConvGeom, padded_plane, schedule_plane
from kiln.lower.window_symbolic import symbolic_spatial
from kiln.lower.schedules import default_then
from kiln.lower.nnutil import (_acc_dtype, _pool_taps, _strides_of, _window_count,
                               accumulate_rows, parallel_worth, schedule_rows)
from kiln.targets.target import Target
from kiln.ops.nn import _lp_p, _pool_window, _unpool_shape
from kiln.lower.context import lowering


# ---------------------------------------------------------------- native: pooling

def _pool_schedule(red_stages, out_stages, nd, work, target: Target, planes=()):
    """Pool stages: (n, c) parallel, rows, the window's taps, then the vectorized last output dim."""
    def fn(sch, outputs):
        for t in red_stages:
            sl = accumulate_rows(sch, t, work, target)
            lax = list(sl.axis)
            if sl.reduce_axis and math.prod(k.arg.dom[1] for k in sl.reduce_axis) <= 9:
                for k in sl.reduce_axis:
                    sl.unroll(k)
            elif sl.reduce_axis and sl.reduce_axis[-1].arg.dom[1] <= 7:
                sl.unroll(sl.reduce_axis[-1])
            if lax[-1].arg.dom[1] >= 4:
                sl.vectorize(lax[-1])
        for xs, g in planes:
            schedule_plane(sch[xs], g, parallel_worth(work, target))
        for t in out_stages:
            schedule_rows(sch[t], 2, target, work)
    return fn


def _lowest_expr(dt: DType):
    return const(-math.inf, dt) if dt.is_float else const(np.iinfo(dt.np).min, dt)


def _pool_plane(ctx, x, win, xval, pad):
    """Pooling windows read from the padded, phase-split plane: (plane, geometry, tap reader)."""
    n, c = x.shape[:2]
    g = ConvGeom(n, c, list(x.shape[2:]), c, list(win.kernel), c, list(win.strides), list(win.dilations),
                 [int(b) for b in win.begin], [int(o) for o in win.out], cols_strided=True)
    xs, tap = padded_plane(g, xval, pad, g.q_len)

    def read(n_, c_, ks, o):
        return tap(n_, c_, ks, sum(i * p for i, p in zip(o, g.pstr)))
    return xs, g, read


@lowering("MaxPool")
def _max_pool_lower(ctx, x):
    if symbolic_spatial(x.shape):       # a shape-generic module's symbolic image size
        return window_symbolic.max_pool(ctx, x)
    win = _pool_window(ctx, x)
    nd = len(x.shape) - 2
    out_shape = ctx.out_shape(0)
    ks = [reduce_axis(k, f"k{i}") for i, k in enumerate(win.kernel)]
    spatial = list(x.shape[2:])
    xs, geom, read = _pool_plane(ctx, x, win, lambda n, c, *sp: x[(n, c, *sp)], _lowest_expr(x.dtype))
    y = compute(out_shape, lambda n, c, *o: _rmax(read(n, c, ks, o), ks), "maxpool")
    work = math.prod(out_shape) * math.prod(win.kernel)
    planes = [(xs, geom)]
    if ctx.output_used(1):
        ks2 = [reduce_axis(k, f"t{i}") for i, k in enumerate(win.kernel)]
        kstr = _strides_of(win.kernel)
        big = const(math.prod(win.kernel), DType.int64)

        def first(n, c, *o):
            _, ok, cl = _pool_taps(win, o, ks2, spatial)
            v = x[(n, c, *cl)]
            hit = v.eq(y[(n, c, *o)])
            if x.dtype.is_float:
                from kiln.loops import isnan
                hit = hit | isnan(v)
            lin = sum(k * st for k, st in zip(ks2, kstr))
            return _rmin(select(ok & hit, lin, big), ks2)
        kidx = compute(out_shape, first, "argmax")
        dims = spatial[::-1] if int(ctx.attr("storage_order", 0)) else spatial

        def index(n, c, *o):
            kk = kidx[(n, c, *o)]
            pos = [o[i] * win.strides[i] - win.begin[i] + ((kk // kstr[i]) % win.kernel[i]) * win.dilations[i]
                   for i in range(nd)]
            if int(ctx.attr("storage_order", 0)):
                pos = pos[::-1]
            flat = (n * x.shape[1] + c) * math.prod(spatial)
            for p, st in zip(pos, _strides_of(dims)):
                flat = flat + p * st
            return flat
        ind = compute(out_shape, index, "indices", DType.int64)
        ctx.schedule(_pool_schedule([y, kidx], [ind], nd, work, ctx.target, planes))
        return [y, ind]
    ctx.schedule(_pool_schedule([y], [], nd, work, ctx.target, planes))
    if ctx.num_outputs > 1:
        return [y, compute(ctx.out_shape(1), lambda *i: const(0, DType.int64), "indices")]
    return y


def _rmax(v, ks):
    from kiln.loops import rmax
    return rmax(v, ks)


def _rmin(v, ks):
    from kiln.loops import rmin
    return rmin(v, ks)


@lowering("AveragePool")
def _average_pool_lower(ctx, x):
    if symbolic_spatial(x.shape):
        return window_symbolic.average_pool(ctx, x)
    win = _pool_window(ctx, x)
    nd = len(x.shape) - 2
    out_shape = ctx.out_shape(0)
    acc = _acc_dtype(x.dtype)
    ks = [reduce_axis(k, f"k{i}") for i, k in enumerate(win.kernel)]
    spatial = list(x.shape[2:])
    xs, geom, read = _pool_plane(ctx, x, win, lambda n, c, *sp: cast(acc, x[(n, c, *sp)]), const(0, acc))
    total = compute(out_shape, lambda n, c, *o: sum_(read(n, c, ks, o), ks), "winsum")
    if ctx.attr("count_include_pad", 0):
        lo, hi = [-b for b in win.begin], [s + e for s, e in zip(spatial, win.end)]
    else:
        lo, hi = [0] * nd, spatial
    y = compute(out_shape, lambda n, c, *o: cast(x.dtype, total[(n, c, *o)] /
                                                 cast(acc, _window_count(win, o, spatial, lo, hi))),
                "avgpool")
    ctx.schedule(_pool_schedule([total], [y], nd, math.prod(out_shape) * math.prod(win.kernel),
                                ctx.target, [(xs, geom)]))
    return y


@lowering("LpPool")
def _lp_pool_lower(ctx, x):
    win = _pool_window(ctx, x)
    nd = len(x.shape) - 2
    out_shape = ctx.out_shape(0)
    acc = _acc_dtype(x.dtype)
    p = _lp_p(ctx)
    ks = [reduce_axis(k, f"k{i}") for i, k in enumerate(win.kernel)]
    xs, geom, read = _pool_plane(ctx, x, win, lambda n, c, *sp: cast(acc, x[(n, c, *sp)]), const(0, acc))
    total = compute(out_shape, lambda n, c, *o: sum_(_abs_pow(read(n, c, ks, o), p), ks), "winsum")
    y = compute(out_shape, lambda *i: cast(x.dtype, _root(total[i], p)), "lppool")
    ctx.schedule(_pool_schedule([total], [y], nd, math.prod(out_shape) * math.prod(win.kernel),
                                ctx.target, [(xs, geom)]))
    return y


def _abs_pow(v, p: float):
    from kiln.loops import fabs, pow_
    if p == 2.0:
        return v * v
    if p == 1.0:
        return fabs(v)
    return pow_(fabs(v), const(p, v.dtype))


def _root(v, p: float):
    from kiln.loops import pow_, sqrt
    if p == 2.0:
        return sqrt(v)
    if p == 1.0:
        return v
    return pow_(v, const(1.0 / p, v.dtype))


def _global_lower(kind):
    def lower_fn(ctx, x):
        acc = _acc_dtype(x.dtype)
        spatial = list(x.shape[2:])
        ks = [reduce_axis(s, f"r{i}") for i, s in enumerate(spatial)]
        if kind == "max":
            r = compute((x.shape[0], x.shape[1]), lambda n, c: _rmax(cast(acc, x[(n, c, *ks)]), ks), "gmax")
            fin = lambda v: v  # noqa: E731
        elif kind == "avg":
            r = compute((x.shape[0], x.shape[1]), lambda n, c: sum_(cast(acc, x[(n, c, *ks)]), ks), "gsum")
            cnt = const(math.prod(spatial), acc) if static(math.prod(spatial)) else cast(acc, math.prod(spatial))
            fin = lambda v: v / cnt  # noqa: E731
        else:
            p = _lp_p(ctx)
            r = compute((x.shape[0], x.shape[1]),
                        lambda n, c: sum_(_abs_pow(cast(acc, x[(n, c, *ks)]), p), ks), "gsum")
            fin = lambda v: _root(v, p)  # noqa: E731
        y = compute(ctx.out_shape(0), lambda n, c, *z: cast(x.dtype, fin(r[n, c])), "gpool")
        work = math.prod(x.shape)

        def sched(sch):
            s = sch[r]
            nc = s.fuse(*s.axis)
            if parallel_worth(work, ctx.target):
                s.parallel(nc)
        ctx.schedule(default_then(sched, ctx.target))
        return y
    return lower_fn


lowering("GlobalAveragePool")(_global_lower("avg"))
lowering("GlobalMaxPool")(_global_lower("max"))
lowering("GlobalLpPool")(_global_lower("lp"))


@lowering("MaxUnpool")
def _max_unpool_lower(ctx, x, idx, out_shape=None):
    shape = _unpool_shape(ctx, tuple(x.shape))
    want = list(ctx.out_shape(0))
    total = math.prod(shape)
    n = math.prod(x.shape)
    dt = x.dtype.c
    if dt is None:
        ctx.fail(f"dtype {x.dtype} has no native type")
    out_n = math.prod(want)
    # a flat position of the default-shaped result, moved into the (cropped / zero-grown) output
    move = ["    int64_t rest = p, dst = 0, ok = 1;\n"]
    for d in reversed(range(len(shape))):
        move.append(f"    {{ int64_t c = rest % {shape[d]}; rest /= {shape[d]}; if (c >= {want[d]}) ok = 0; "
                    f"dst += c * {math.prod(want[d + 1:])}; }}\n")
    body = (f"  memset(out0, 0, {out_n}ULL * sizeof({dt}));\n"
            f"  for (int64_t i = 0; i < {n}; ++i) {{\n"
            f"    int64_t p = (int64_t)in1[i];\n"
            f"    if (p < -{total} || p >= {total}) KILN_FAIL(1, p);\n"
            f"    if (p < 0) p += {total};\n"
            + "".join(move) +
            "    if (ok) out0[dst] = in0[i];\n  }\n  return 0;\n")
    return ctx.extern(body, [x, idx, out_shape], [(tuple(want), x.dtype)],
                      errors={1: f"index {{value}} is out of range [-{total}, {total - 1}] of the unpooled output"})
