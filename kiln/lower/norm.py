"""Normalization lowerings (cpu target): BatchNormalization, InstanceNormalization,
LayerNormalization, RMSNormalization, GroupNormalization, LpNormalization,
MeanVarianceNormalization, LRN: moments over the normalized axes, then one injective stage.
"""

from __future__ import annotations

import math

from kiln.dtypes import DType
from kiln.loops import (Expr, cast, compute, const, max_, min_, reduce_axis, select,
                        sum_)
from kiln.lower.nnutil import _acc_dtype, bcast_load
from kiln.lower.schedules import norm_schedule
from kiln.lower.pool import _abs_pow, _root
from kiln.lower.reduce import schedule_per_row
from kiln.ops.nn import _bn_training, _stash, norm_dtype
from kiln.lower.context import lowering
from kiln.ops.shapes import normalize_axis


# ---------------------------------------------------------------- native: normalization

def _keep_shape(shape, axes):
    return tuple(1 if a in axes else n for a, n in enumerate(shape))


def moments(xval, shape, axes, acc: DType, name: str, centered: bool = True):
    """Keepdims mean and variance (two-pass, as the references) of xval(idx) over `axes`.

    Returns (mean, var) tensors of the keepdims shape. With centered=False the
    variance is E[x^2] - E[x]^2 (MeanVarianceNormalization's definition).
    """
    rank = len(shape)
    keep = _keep_shape(shape, axes)
    n = math.prod(shape[a] for a in axes)
    cnt = cast(acc, n) if isinstance(n, Expr) else const(n, acc)   # a symbolic count: its value at run time

    def over(i, red):
        return [red[a] if a in red else i[a] for a in range(rank)]

    r1 = {a: reduce_axis(shape[a], f"r{a}") for a in axes}
    s1 = compute(keep, lambda *i: sum_(xval(over(i, r1)), list(r1.values())), f"{name}_sum")
    mean = compute(keep, lambda *i: s1[i] / cnt, f"{name}_mean")
    r2 = {a: reduce_axis(shape[a], f"s{a}") for a in axes}
    if centered:
        def sq(*i):
            d = xval(over(i, r2)) - mean[i]
            return sum_(d * d, list(r2.values()))
        s2 = compute(keep, sq, f"{name}_sqsum")
        var = compute(keep, lambda *i: s2[i] / cnt, f"{name}_var")
    else:
        def sq2(*i):
            v = xval(over(i, r2))
            return sum_(v * v, list(r2.values()))
        s2 = compute(keep, sq2, f"{name}_sqsum")
        var = compute(keep, lambda *i: s2[i] / cnt - mean[i] * mean[i], f"{name}_var")
    return mean, var


def _rsqrt_eps(var, eps, acc, name):
    from kiln.loops import sqrt
    one = const(1, acc)
    return compute(var.shape, lambda *i: one / sqrt(var[i] + const(eps, acc)), name)


@lowering("BatchNormalization")
def _batch_norm_lower(ctx, x, scale, bias, mean, var):
    eps = float(ctx.attr("epsilon", 1e-5))
    acc = _acc_dtype(x.dtype)
    rank = len(x.shape)
    C = x.shape[1]
    f = lambda t, c: cast(acc, t[c])  # noqa: E731
    if _bn_training(ctx):
        axes = [0] + list(range(2, rank))
        bmean, bvar = moments(lambda i: cast(acc, x[tuple(i)]), x.shape, axes, acc, "bn")
        inv = _rsqrt_eps(bvar, eps, acc, "bn_inv")
        mom = const(float(ctx.attr("momentum", 0.9)), acc)
        one = const(1, acc)
        zi = (0,) * (rank - 2)
        y = compute(x.shape, lambda n, c, *sp: cast(x.dtype, (cast(acc, x[(n, c, *sp)]) - bmean[(0, c, *zi)])
                                                       * inv[(0, c, *zi)] * f(scale, c) + f(bias, c)), "bn")
        run_mean = compute((C,), lambda c: cast(mean.dtype, f(mean, c) * mom + bmean[(0, c, *zi)] * (one - mom)),
                           "running_mean")
        run_var = compute((C,), lambda c: cast(var.dtype, f(var, c) * mom + bvar[(0, c, *zi)] * (one - mom)),
                          "running_var")
        saved_mean = compute((C,), lambda c: cast(mean.dtype, bmean[(0, c, *zi)]), "saved_mean")
        saved_var = compute((C,), lambda c: cast(var.dtype, inv[(0, c, *zi)]), "saved_var")
        ctx.schedule(norm_schedule([y], 2, math.prod(x.shape), ctx.target))
        return [y, run_mean, run_var, saved_mean, saved_var][:max(ctx.num_outputs, 1)]
    from kiln.loops import sqrt
    a = compute((C,), lambda c: f(scale, c) / sqrt(f(var, c) + const(eps, acc)), "bn_scale")
    y = compute(x.shape, lambda n, c, *sp: cast(x.dtype, (cast(acc, x[(n, c, *sp)]) - f(mean, c)) * a[c]
                                                 + f(bias, c)), "bn")
    ctx.schedule(norm_schedule([y], 2, math.prod(x.shape), ctx.target))
    extra = [compute(t.shape, lambda c, t=t: t[c], f"stat{k}")
             for k, t in enumerate([mean, var, mean, var][:ctx.num_outputs - 1])]
    return [y, *extra]


@lowering("InstanceNormalization")
def _instance_norm_lower(ctx, x, scale, bias):
    acc = _acc_dtype(x.dtype)
    rank = len(x.shape)
    axes = list(range(2, rank))
    mean, var = moments(lambda i: cast(acc, x[tuple(i)]), x.shape, axes, acc, "in")
    inv = _rsqrt_eps(var, float(ctx.attr("epsilon", 1e-5)), acc, "in_inv")
    zi = (0,) * (rank - 2)
    y = compute(x.shape, lambda n, c, *sp: cast(x.dtype, (cast(acc, x[(n, c, *sp)]) - mean[(n, c, *zi)])
                                                 * inv[(n, c, *zi)] * cast(acc, scale[c]) + cast(acc, bias[c])),
                "instnorm")
    ctx.schedule(norm_schedule([y], 2, math.prod(x.shape), ctx.target))
    return y


def _trailing_norm(ctx, x):
    """LayerNorm/RMSNorm normalise over the dims from `axis` on, accumulating in norm_dtype:
    (rank, axis, accumulator dtype, normalised axes)."""
    rank = len(x.shape)
    axis = normalize_axis(ctx, int(ctx.attr("axis", -1)), rank)
    acc = norm_dtype(ctx, x.dtype)
    if acc.c is None:
        ctx.fail(f"stash_type {acc} has no native type")
    return rank, axis, acc, list(range(axis, rank))


@lowering("LayerNormalization")
def _layer_norm_lower(ctx, x, scale, bias=None):
    rank, axis, acc, axes = _trailing_norm(ctx, x)
    mean, var = moments(lambda i: cast(acc, x[tuple(i)]), x.shape, axes, acc, "ln")
    inv = _rsqrt_eps(var, float(ctx.attr("epsilon", 1e-5)), acc, "ln_inv")
    zi = (0,) * (rank - axis)

    def body(*i):
        k = tuple(i[:axis]) + zi
        v = (cast(acc, x[i]) - mean[k]) * inv[k] * cast(acc, bcast_load(scale, i))
        if bias is not None:
            v = v + cast(acc, bcast_load(bias, i))
        return cast(x.dtype, v)
    y = compute(x.shape, body, "layernorm")
    if axis == rank - 1 and rank >= 2 and ctx.num_outputs <= 1:
        # one loop over rows: sum, mean, centred sum of squares, 1/std per row (consumers first)
        (s2,), (s1,) = var.inputs, mean.inputs
        ctx.schedule(lambda sch, outs: schedule_per_row(sch, y, [inv, var, s2, mean, s1], ctx.target))
        return y
    stash = _stash(ctx)
    mean_out = compute(mean.shape, lambda *i: cast(stash, mean[i]), "mean")
    inv_out = compute(inv.shape, lambda *i: cast(stash, inv[i]), "invstd")
    ctx.schedule(norm_schedule([y], axis, math.prod(x.shape), ctx.target))
    return [y, mean_out, inv_out][:max(ctx.num_outputs, 1)]


@lowering("RMSNormalization")
def _rms_norm_lower(ctx, x, scale):
    from kiln.loops import sqrt
    rank, axis, acc, axes = _trailing_norm(ctx, x)
    keep = _keep_shape(x.shape, axes)
    red = {a: reduce_axis(x.shape[a], f"r{a}") for a in axes}

    def sq(*i):
        v = cast(acc, x[tuple(red[a] if a in red else i[a] for a in range(rank))])
        return sum_(v * v, list(red.values()))
    ss = compute(keep, sq, "rms_sqsum")
    cnt = const(math.prod(x.shape[a] for a in axes), acc)
    eps = const(float(ctx.attr("epsilon", 1e-5)), acc)
    den = compute(keep, lambda *i: sqrt(ss[i] / cnt + eps), "rms_den")
    zi = (0,) * (rank - axis)
    y = compute(x.shape, lambda *i: cast(scale.dtype, cast(acc, x[i]) / den[tuple(i[:axis]) + zi]
                                         * cast(acc, bcast_load(scale, i))), "rmsnorm")
    if axis == rank - 1 and rank >= 2:
        ctx.schedule(lambda sch, outs: schedule_per_row(sch, y, [den, ss], ctx.target))
        return y
    ctx.schedule(norm_schedule([y], axis, math.prod(x.shape), ctx.target))
    return y


@lowering("GroupNormalization")
def _group_norm_lower(ctx, x, scale, bias):
    g = int(ctx.attr("num_groups"))
    n, c = x.shape[:2]
    if c % g:
        ctx.fail(f"channels {c} not divisible by num_groups {g}")
    cg = c // g
    acc = norm_dtype(ctx, x.dtype) if ctx.opset >= 21 else _acc_dtype(x.dtype)
    if acc.c is None:
        ctx.fail(f"stash_type {acc} has no native type")
    sp = list(x.shape[2:])
    view = (n, g, cg, *sp)
    mean, var = moments(lambda i: cast(acc, x[(i[0], i[1] * cg + i[2], *i[3:])]), view,
                        list(range(2, len(view))), acc, "gn")
    inv = _rsqrt_eps(var, float(ctx.attr("epsilon", 1e-5)), acc, "gn_inv")
    zi = (0,) * (len(view) - 2)

    def per_channel(p, ch):
        if p.shape[0] == c:
            return cast(acc, p[ch])
        if p.shape[0] == g:
            return cast(acc, p[ch // cg])
        ctx.fail(f"scale/bias of size {p.shape[0]} given, expected {c} (channels) or {g} (groups)")

    def body(b, ch, *s):
        k = (b, ch // cg, *zi)
        return cast(x.dtype, (cast(acc, x[(b, ch, *s)]) - mean[k]) * inv[k] * per_channel(scale, ch)
                    + per_channel(bias, ch))
    y = compute(x.shape, body, "groupnorm")
    ctx.schedule(norm_schedule([y], 2, math.prod(x.shape), ctx.target))
    return y


@lowering("LpNormalization")
def _lp_normalization_lower(ctx, x):
    p = int(ctx.attr("p", 2))
    if p not in (1, 2):
        ctx.fail(f"p must be 1 or 2, got {p}")
    acc = _acc_dtype(x.dtype)
    rank = len(x.shape)
    axis = normalize_axis(ctx, int(ctx.attr("axis", -1)), rank)
    keep = _keep_shape(x.shape, [axis])
    r = reduce_axis(x.shape[axis], "r")

    def s(*i):
        v = cast(acc, x[tuple(r if a == axis else i[a] for a in range(rank))])
        return sum_(_abs_pow(v, float(p)), r)
    tot = compute(keep, s, "lp_sum")
    norm = compute(keep, lambda *i: _root(tot[i], float(p)), "lp_norm")
    zero = const(0, acc)

    def body(*i):
        k = tuple(0 if a == axis else i[a] for a in range(rank))
        nv = norm[k]
        safe = select(nv.eq(zero), const(1, acc), nv)
        return cast(x.dtype, select(nv.eq(zero), zero, cast(acc, x[i]) / safe))
    y = compute(x.shape, body, "lpnorm")
    ctx.schedule(norm_schedule([y], rank - 1 if axis == rank - 1 else 1, math.prod(x.shape), ctx.target))
    return y


@lowering("MeanVarianceNormalization")
def _mvn_lower(ctx, x):
    from kiln.loops import sqrt
    acc = _acc_dtype(x.dtype)
    rank = len(x.shape)
    axes = sorted(normalize_axis(ctx, int(a), rank) for a in ctx.attr("axes", [0, 2, 3]))
    mean, var = moments(lambda i: cast(acc, x[tuple(i)]), x.shape, axes, acc, "mvn", centered=False)
    den = compute(var.shape, lambda *i: sqrt(var[i]) + const(1e-9, acc), "mvn_den")

    def body(*i):
        k = tuple(0 if a in axes else i[a] for a in range(rank))
        return cast(x.dtype, (cast(acc, x[i]) - mean[k]) / den[k])
    y = compute(x.shape, body, "mvn")
    ctx.schedule(norm_schedule([y], 1, math.prod(x.shape), ctx.target))
    return y


@lowering("LRN")
def _lrn_lower(ctx, x):
    from kiln.loops import pow_
    size = int(ctx.attr("size"))
    alpha, beta, bias = float(ctx.attr("alpha", 1e-4)), float(ctx.attr("beta", 0.75)), float(ctx.attr("bias", 1.0))
    acc = _acc_dtype(x.dtype)
    C = x.shape[1]
    k = reduce_axis(size, "k")
    lo = (size - 1) // 2

    def ss(n, c, *sp):
        cc = c - lo + k
        v = cast(acc, x[(n, min_(max_(cc, 0), C - 1), *sp)])
        return sum_(select((cc >= 0) & (cc < C), v * v, const(0, acc)), k)
    tot = compute(x.shape, ss, "lrn_sqsum")
    y = compute(x.shape, lambda *i: cast(x.dtype, cast(acc, x[i]) / pow_(
        const(bias, acc) + const(alpha / size, acc) * tot[i], const(beta, acc))), "lrn")
    ctx.schedule(norm_schedule([y], 2, math.prod(x.shape) * size, ctx.target))
    return y
