"""Linear (de)quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear.

Scales and zero points are per tensor (scalar), per axis (1-D along `axis`) or
blocked (input rank, `block_size` elements per scale along `axis`); one helper
expands all three to a broadcastable array. Narrow types (int4/uint4/int2/
uint2, float8, float4) are ml_dtypes dtypes. Rounding is half-to-even with
saturation to the target range. Their native lowerings live in
kiln.lower.quant.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.registry import OPAQUE, InferCtx, RunCtx, op
from kiln.ops.shapes import normalize_axis


def saturate_to(y: np.ndarray, dtype, zero_point=None, saturate: bool = True) -> np.ndarray:
    """Quantize real values y (zero point not yet added) to `dtype`.

    Integer targets round half-to-even, add the zero point and clip to the type's
    range. Float8 targets clip to the finite range when `saturate` (else overflow
    becomes inf/nan as the plain cast does); float4 has no inf/nan and the cast saturates.
    """
    dtype = np.dtype(dtype)
    y = np.asarray(y, dtype=np.float64)
    zp = 0.0 if zero_point is None else np.asarray(zero_point).astype(np.float64)
    if DType.from_numpy(dtype).is_int:
        info = ml_dtypes.iinfo(dtype)
        return np.clip(np.rint(y) + zp, info.min, info.max).astype(dtype)
    y = y + zp
    if saturate and dtype.itemsize == 1 and dtype != np.dtype(ml_dtypes.float4_e2m1fn):
        info = ml_dtypes.finfo(dtype)
        y = np.clip(y, float(info.min), float(info.max))
    return y.astype(dtype)


def _expand(ctx, param: np.ndarray | None, shape: tuple, axis: int, block_size: int):
    """Scale or zero point made broadcastable to the input: per tensor, per axis or blocked."""
    if param is None or param.ndim == 0 or param.size == 1:
        return None if param is None else param.reshape(())
    axis = normalize_axis(ctx, axis, len(shape))
    if not block_size:
        if param.ndim != 1 or param.shape[0] != shape[axis]:
            ctx.fail(f"per-axis scale/zero point must be 1-D of length {shape[axis]} (axis {axis} of input "
                     f"shape {shape}), got shape {param.shape}")
        return param.reshape([-1 if i == axis else 1 for i in range(len(shape))])
    want = tuple(-(-d // block_size) if i == axis else d for i, d in enumerate(shape))
    if param.shape != want:
        ctx.fail(f"blocked scale/zero point for input shape {shape}, axis {axis}, block_size {block_size} "
                 f"must have shape {want}, got {param.shape}")
    return np.repeat(param, block_size, axis=axis).take(np.arange(shape[axis]), axis=axis)


def _quantize_infer(ctx: InferCtx):
    if ctx.has_input(2):
        dtype = ctx.dtype(2)
        attr = ctx.attr("output_dtype", 0)
        if attr and DType.from_onnx(attr) != dtype:
            ctx.fail(f"output_dtype {DType.from_onnx(attr)} differs from y_zero_point type {dtype}")
    else:
        dtype = DType.from_onnx(ctx.attr("output_dtype", 0) or DType.uint8.onnx)
    return [TensorType(dtype, ctx.shape(0))]


@op("QuantizeLinear", infer=_quantize_infer, fusion=OPAQUE)
def quantize_linear(ctx: RunCtx, x, y_scale, y_zero_point=None):
    args = (x.shape, ctx.attr("axis", 1), ctx.attr("block_size", 0))
    scale, zp = _expand(ctx, y_scale, *args), _expand(ctx, y_zero_point, *args)
    precision = ctx.attr("precision", 0)
    if precision:
        p = DType.from_onnx(precision).np
        y = x.astype(p) / scale.astype(p)
    else:
        y = x / scale
    return saturate_to(y, ctx.output_types[0].dtype.np, zp, bool(ctx.attr("saturate", 1)))


def _dequantize_infer(ctx: InferCtx):
    attr = ctx.attr("output_dtype", 0)
    return [TensorType(DType.from_onnx(attr) if attr else ctx.dtype(1), ctx.shape(0))]


@op("DequantizeLinear", infer=_dequantize_infer, fusion=OPAQUE)
def dequantize_linear(ctx: RunCtx, x, x_scale, x_zero_point=None):
    args = (x.shape, ctx.attr("axis", 1), ctx.attr("block_size", 0))
    dx = x.astype(np.float32)
    if x_zero_point is not None:
        dx = dx - _expand(ctx, x_zero_point, *args).astype(np.float32)
    return np.asarray(dx * _expand(ctx, x_scale, *args)).astype(ctx.output_types[0].dtype.np)


def _dynamic_quantize_infer(ctx: InferCtx):
    return [TensorType(DType.uint8, ctx.shape(0)), TensorType(DType.float32, ()), TensorType(DType.uint8, ())]


@op("DynamicQuantizeLinear", infer=_dynamic_quantize_infer, fusion=OPAQUE)
def dynamic_quantize_linear(ctx: RunCtx, x):
    """uint8 quantization over [min(x, 0), max(x, 0)] with a rounded zero point."""
    hi = np.float32(max(0.0, float(np.max(x, initial=0.0))))
    lo = np.float32(min(0.0, float(np.min(x, initial=0.0))))
    scale = np.float32(1.0 if hi == lo else hi - lo) / np.float32(255)
    zp = np.rint(np.clip(np.float32(0) - lo / scale, 0, 255))
    y = np.asarray(np.clip(np.rint(x / scale) + zp, 0, 255)).astype(np.uint8)  # 0-d stays an array
    return y, np.asarray(scale, dtype=np.float32), np.asarray(zp, dtype=np.uint8)
