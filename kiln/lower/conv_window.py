"""Convolutions lowered as window computes (cpu target): ConvTranspose, CausalConvWithState,
DeformConv; they share the pools' schedule (kiln.lower.pool).
"""

from __future__ import annotations

import math

from kiln.dtypes import DType
from kiln.loops import (cast, compute, const, max_, min_, reduce_axis, select,
                        sum_)
from kiln.lower.nnutil import _acc_dtype, _conj
from kiln.lower.schedules import norm_schedule
from kiln.lower.pool import _pool_schedule
from kiln.ops.nn import _int_list, _transpose_geometry, attr_str, window
from kiln.lower.context import lowering


@lowering("ConvTranspose")
def _conv_transpose_lower(ctx, x, w, b=None):
    group = int(ctx.attr("group", 1))
    n, c = x.shape[:2]
    nd = len(x.shape) - 2
    if w.shape[0] != c or c % group:
        ctx.fail(f"weight shape {tuple(w.shape)} expects {w.shape[0]} input channels, input has {c} (group {group})")
    kern = [int(k) for k in ctx.attr("kernel_shape", w.shape[2:])]
    ins = list(x.shape[2:])
    s = _int_list(ctx, "strides", nd, 1)
    d = _int_list(ctx, "dilations", nd, 1)
    begin = _transpose_geometry(ctx, ins, kern)[0]
    acc = _acc_dtype(x.dtype)
    cg, mg = c // group, w.shape[1]
    out_shape = ctx.out_shape(0)
    ic = reduce_axis(cg, "ic")
    ks = [reduce_axis(k, f"k{i}") for i, k in enumerate(kern)]

    def body(b_, m, *o):
        gi = m // mg
        conds, pos = [], []
        for i in range(nd):
            t = o[i] + begin[i] - ks[i] * d[i]
            conds += [t >= 0, t < ins[i] * s[i]] + ([(t % s[i]).eq(0)] if s[i] > 1 else [])
            pos.append(min_(max_(t // s[i], 0), ins[i] - 1))
        cin = gi * cg + ic
        v = cast(acc, x[(b_, cin, *pos)]) * cast(acc, w[(cin, m % mg, *ks)])
        return sum_(select(_conj(conds), v, const(0, acc)), [ic, *ks])
    tot = compute(out_shape, body, "convT")
    y = compute(out_shape, lambda b_, m, *o: cast(x.dtype, tot[(b_, m, *o)] + cast(acc, b[m]) if b is not None
                                                  else tot[(b_, m, *o)]), "convtranspose")
    work = math.prod(out_shape) * cg * math.prod(kern)
    ctx.schedule(_pool_schedule([tot], [y], nd, work, ctx.target))
    return y


# ---------------------------------------------------------------- native: CausalConvWithState, MaxUnpool, DeformConv

@lowering("CausalConvWithState")
def _causal_conv_lower(ctx, x, w, b=None, past=None):
    from kiln.loops import exp
    act = attr_str(ctx, "activation", "none")
    if act not in ("none", "silu", "swish"):
        ctx.fail(f"activation {act!r} is not one of 'none', 'silu', 'swish'")
    bsz, c, length = x.shape
    k = w.shape[2]
    if tuple(w.shape[:2]) != (c, 1):
        ctx.fail(f"weight shape {tuple(w.shape)} given, expected ({c}, 1, k)")
    if past is not None and tuple(past.shape) != (bsz, c, k - 1):
        ctx.fail(f"past_state shape {tuple(past.shape)} given, expected {(bsz, c, k - 1)}")
    acc = _acc_dtype(x.dtype)
    hist = k - 1

    def padded(n, ch, t):
        cur = x[n, ch, min_(max_(t - hist, 0), length - 1)]
        if past is None:
            old = const(0, x.dtype)
        else:
            old = past[n, ch, min_(max_(t, 0), max(hist - 1, 0))] if hist > 0 else const(0, x.dtype)
        return select(t < hist, old, cur) if hist > 0 else cur
    r = reduce_axis(k, "k")
    conv = compute((bsz, c, length), lambda n, ch, t: sum_(cast(acc, padded(n, ch, t + r)) * cast(acc, w[ch, 0, r]), r),
                   "causal_conv")

    def fin(n, ch, t):
        v = conv[n, ch, t]
        if b is not None:
            v = v + cast(acc, b[ch])
        if act != "none":
            v = v / (const(1, acc) + exp(-v))
        return cast(x.dtype, v)
    y = compute((bsz, c, length), fin, "causal_out")
    state = compute((bsz, c, hist), lambda n, ch, t: padded(n, ch, t + length), "present_state")
    ctx.schedule(norm_schedule([y], 2, bsz * c * length * k, ctx.target))
    return [y, state]


@lowering("DeformConv")
def _deform_conv_lower(ctx, x, w, offset, b=None, mask=None):
    from kiln.loops import fabs, floor
    from kiln.lower.tensor import float_index
    if len(x.shape) != 4:
        ctx.fail(f"only 2-D DeformConv is supported, input has rank {len(x.shape)}")
    n, c, h, wd = x.shape
    m = w.shape[0]
    group, og = int(ctx.attr("group", 1)), int(ctx.attr("offset_group", 1))
    win = window(ctx, [h, wd], list(ctx.attr("kernel_shape", w.shape[2:])))
    kh, kw = win.kernel
    oh, ow = win.out
    kk = kh * kw
    if tuple(offset.shape) != (n, og * kk * 2, oh, ow):
        ctx.fail(f"offset shape {tuple(offset.shape)} given, expected {(n, og * kk * 2, oh, ow)}")
    if c % og or c != w.shape[1] * group:
        ctx.fail(f"channels {c} do not fit weight {tuple(w.shape)}, group {group}, offset_group {og}")
    f64 = DType.float64
    cg, mg, cog = c // group, m // group, c // og
    ic, r0, r1 = reduce_axis(cg, "ic"), reduce_axis(kh, "kh"), reduce_axis(kw, "kw")

    def body(b_, o, y, xo):
        cin = (o // mg) * cg + ic
        gofs = cin // cog
        tap = r0 * kw + r1
        ch = (gofs * kk + tap) * 2
        yy = cast(f64, y * win.strides[0] - win.begin[0] + r0 * win.dilations[0]) + cast(f64, offset[b_, ch, y, xo])
        xx = cast(f64, xo * win.strides[1] - win.begin[1] + r1 * win.dilations[1]) \
            + cast(f64, offset[b_, ch + 1, y, xo])
        y0, x0 = floor(yy), floor(xx)
        val = None
        for dy in (0, 1):
            for dx in (0, 1):
                yi, xi = y0 + const(float(dy), f64), x0 + const(float(dx), f64)
                wt = (const(1.0, f64) - fabs(yy - yi)) * (const(1.0, f64) - fabs(xx - xi))
                iy, ix = float_index(yi, -1, h), float_index(xi, -1, wd)   # NaN / huge offsets: -1 / h
                ok = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < wd)
                v = cast(f64, x[b_, cin, min_(max_(iy, 0), h - 1), min_(max_(ix, 0), wd - 1)])
                term = select(ok, v * wt, const(0.0, f64))
                val = term if val is None else val + term
        if mask is not None:
            val = val * cast(f64, mask[b_, gofs * kk + tap, y, xo])
        return sum_(val * cast(f64, w[o, ic, r0, r1]), [ic, r0, r1])
    tot = compute((n, m, oh, ow), body, "deform")
    y = compute((n, m, oh, ow), lambda b_, o, i, j: cast(x.dtype, tot[b_, o, i, j] + cast(f64, b[o]) if b is not None
                                                         else tot[b_, o, i, j]), "deform_conv")
    ctx.schedule(_pool_schedule([tot], [y], 2, n * m * oh * ow * cg * kk * 8, ctx.target))
    return y
