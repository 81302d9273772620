"""Native lowerings of QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear
(kiln.ops.quant).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from kiln.dtypes import DType
from kiln.loops import call, cast, compute, const, max_, min_, select
from kiln.lower.reduce import reduction, schedule_stages
from kiln.ops.quant import _expand
from kiln.lower.context import LowerCtx, lowering
from kiln.ops.shapes import normalize_axis


# ==== native lowerings (target "cpu") ====
#
# Scales and zero points are read at run time, indexed per tensor, per axis or per
# block exactly as `_expand` broadcasts them. Narrow targets (int4, float8, float4)
# are C storage dtypes: the final cast rounds as ml_dtypes does.

_F32, _F64 = DType.float32, DType.float64


def _param_at(ctx: LowerCtx, p, shape: tuple, axis: int, block: int):
    """`i -> p at input index i` for a scale or zero point (None when absent)."""
    if p is None:
        return None
    _expand(ctx, np.zeros(p.shape, np.int8), shape, axis, block)  # the reference's shape checks
    if not p.shape or int(np.prod(p.shape)) == 1:
        return lambda i: p[(0,) * len(p.shape)]
    axis = normalize_axis(ctx, axis, len(shape))
    if not block:
        return lambda i: p[(i[axis],)]
    return lambda i: p[tuple(j // block if d == axis else j for d, j in enumerate(i))]


def _clamp(v, lo, hi):
    return min_(max_(v, const(lo, v.dtype)), const(hi, v.dtype))


@lowering("QuantizeLinear")
def _quantize_lower(ctx: LowerCtx, x, y_scale, y_zero_point=None):
    """saturate(rint(x / scale) + zero_point): the division in the reference's promoted
    type (or `precision`), rounding half-to-even (rint; float targets round in the cast),
    the rest in float64."""
    shape, out = tuple(x.shape), ctx.out_dtype(0)
    args = (shape, ctx.attr("axis", 1), ctx.attr("block_size", 0))
    scale, zp = _param_at(ctx, y_scale, *args), _param_at(ctx, y_zero_point, *args)
    precision = ctx.attr("precision", 0)
    div = DType.from_onnx(precision) if precision else DType.from_numpy(np.result_type(x.dtype.np, y_scale.dtype.np))
    if out.is_int:  # round half to even, add the zero point, saturate
        info = ml_dtypes.iinfo(out.np)
        bounds = (info.min, info.max)
    else:  # float8 saturates to its finite range when asked; float4's own cast saturates
        finite = ctx.attr("saturate", 1) and out.itemsize == 1 and out is not DType.float4e2m1
        bounds = (float(ml_dtypes.finfo(out.np).min), float(ml_dtypes.finfo(out.np).max)) if finite else None

    def body(*i):
        q = cast(_F64, cast(div, x[i]) / cast(div, scale(i)))
        q = call("round", q) if out.is_int else q
        q = q + cast(_F64, zp(i)) if zp else q
        return cast(out, _clamp(q, *bounds) if bounds else q)
    y = compute(shape, body, "y")
    ctx.schedule(lambda sch, outs: schedule_stages(sch, {}))
    return y


@lowering("DequantizeLinear")
def _dequantize_lower(ctx: LowerCtx, x, x_scale, x_zero_point=None):
    """(float32(x) - float32(zero_point)) * scale, cast to the output type."""
    shape, out = tuple(x.shape), ctx.out_dtype(0)
    args = (shape, ctx.attr("axis", 1), ctx.attr("block_size", 0))
    scale, zp = _param_at(ctx, x_scale, *args), _param_at(ctx, x_zero_point, *args)
    mul = DType.from_numpy(np.result_type(np.float32, x_scale.dtype.np))

    def body(*i):
        d = cast(_F32, x[i]) - cast(_F32, zp(i)) if zp else cast(_F32, x[i])
        return cast(out, cast(mul, d) * cast(mul, scale(i)))
    y = compute(shape, body, "y")
    ctx.schedule(lambda sch, outs: schedule_stages(sch, {}))
    return y


@lowering("DynamicQuantizeLinear")
def _dynamic_quantize_lower(ctx: LowerCtx, x):
    """Range [min(x, 0), max(x, 0)] by two reductions, then the uint8 quantization, all
    in float32 as the reference."""
    shape = tuple(x.shape)
    every = range(len(shape))
    zero = const(0, _F32)
    if 0 in shape:
        hi = lo = compute((), lambda: zero, "zero")
    else:
        hi = reduction(shape, every, False, lambda i: cast(_F32, x[i]), "max", "hi")
        lo = reduction(shape, every, False, lambda i: cast(_F32, x[i]), "min", "lo")
    top, bottom = max_(hi[()], zero), min_(lo[()], zero)
    scale = compute((), lambda: select(top.eq(bottom), const(1, _F32), top - bottom) / const(255, _F32), "scale")
    zpf = compute((), lambda: call("round", _clamp(zero - bottom / scale[()], 0, 255)), "zpf")
    y = compute(shape, lambda *i: cast(DType.uint8, _clamp(call("round", cast(_F32, x[i]) / scale[()]) + zpf[()],
                                                            0, 255)), "y")
    zp = compute((), lambda: cast(DType.uint8, zpf[()]), "zp")
    ctx.schedule(lambda sch, outs: schedule_stages(sch, {}))
    return [y, scale, zp]
