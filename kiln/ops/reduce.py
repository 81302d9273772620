"""Reductions along axes: Reduce*, ArgMax/ArgMin, Softmax/LogSoftmax/Hardmax, CumSum/CumProd.

All ten Reduce* ops share one inference and one reference driven by a table;
float inputs are accumulated in float64 and cast back so results match the
ONNX test data to tight tolerances. `softmax`/`log_softmax` are reused by the
attention and loss families.
"""

from __future__ import annotations


import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.registry import OPAQUE, REDUCTION, InferCtx, RunCtx, register, same_as
from kiln.ops.shapes import normalize_axes, normalize_axis, require_nonempty


# ---- helpers shared with linalg / attention / loss ----

def is_float(x: np.ndarray) -> bool:
    return DType.from_numpy(x.dtype).is_float


def wide(x: np.ndarray) -> np.ndarray:
    """Float data widened to float64 for accurate accumulation; other data unchanged."""
    return x.astype(np.float64) if is_float(x) else x


def as_dtype(x, dtype) -> np.ndarray:
    """Cast to `dtype` keeping 0-d results as arrays (never numpy scalars)."""
    return np.asarray(x).astype(dtype, copy=False)


def text(v) -> str:
    """String attributes may arrive as bytes or str."""
    return v.decode() if isinstance(v, bytes) else str(v)


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """Max-shifted softmax; an all -inf slice gives NaN as in ONNX (callers that want 0 guard it)."""
    with np.errstate(invalid="ignore"):
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        s = x - np.max(x, axis=axis, keepdims=True)
        return s - np.log(np.sum(np.exp(s), axis=axis, keepdims=True))


# ---- Reduce* ----

def _identity(x: np.ndarray, biggest: bool):
    """Largest (or smallest) value of x's dtype: the identity of ReduceMin (ReduceMax)."""
    if x.dtype == np.bool_:
        return biggest
    if is_float(x):
        return np.inf if biggest else -np.inf
    info = np.iinfo(x.dtype)
    return info.max if biggest else info.min


def _logsumexp(x, axes):
    m = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0.0)
    return np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m


# name -> (reference over (x, axes) with keepdims=True, opset from which axes is an input)
_REDUCE = {
    "ReduceSum": (lambda x, a: np.sum(x, axis=a, keepdims=True), 13),
    "ReduceMean": (lambda x, a: np.mean(x, axis=a, keepdims=True), 18),
    "ReduceMax": (lambda x, a: np.max(x, axis=a, keepdims=True, initial=_identity(x, False)), 18),
    "ReduceMin": (lambda x, a: np.min(x, axis=a, keepdims=True, initial=_identity(x, True)), 18),
    "ReduceProd": (lambda x, a: np.prod(x, axis=a, keepdims=True), 18),
    "ReduceL1": (lambda x, a: np.sum(np.abs(x), axis=a, keepdims=True), 18),
    "ReduceL2": (lambda x, a: np.sqrt(np.sum(np.square(x), axis=a, keepdims=True)), 18),
    "ReduceLogSum": (lambda x, a: np.log(np.sum(x, axis=a, keepdims=True)), 18),
    "ReduceLogSumExp": (_logsumexp, 18),
    "ReduceSumSquare": (lambda x, a: np.sum(np.square(x), axis=a, keepdims=True), 18),
}


def _reduce_axes(ctx, rank: int, axes_value, axes_known: bool):
    """Axes to reduce: a sorted tuple, () for a no-op, or None when unknown at compile time."""
    if ctx.opset >= _REDUCE[ctx.node.op][1]:
        if not ctx.has_input(1):
            axes = []
        elif not axes_known:
            return None
        else:
            axes = [int(a) for a in np.asarray(axes_value).reshape(-1)]
        if not axes and ctx.attr("noop_with_empty_axes", 0):
            return ()
    else:
        axes = list(ctx.attr("axes", []))
    if not axes:
        return tuple(range(rank))
    return tuple(sorted(set(normalize_axes(ctx, axes, rank))))


def _reduce_infer(ctx: InferCtx):
    t = ctx.tensor(0)
    keep = ctx.attr("keepdims", 1)
    uses_input = ctx.opset >= _REDUCE[ctx.node.op][1] and ctx.has_input(1)
    if t.shape is None:
        return [TensorType(t.dtype, None)]
    value = ctx.value(1) if uses_input else None
    if uses_input and ctx.shape(1) == (0,):  # an empty axes tensor needs no data to be known
        value = np.zeros(0, np.int64)
    axes = _reduce_axes(ctx, len(t.shape), value, not uses_input or value is not None)
    if axes is None:  # axes only known at run time: the rank still is, given keepdims or the axes count
        count = ctx.shape(1)[0] if ctx.shape(1) and isinstance(ctx.shape(1)[0], int) else 0
        rank = len(t.shape) if keep else (len(t.shape) - count if count else None)
        return [TensorType(t.dtype, ctx.unknown_shape(rank))]
    shape = [1 if i in axes else d for i, d in enumerate(t.shape)] if keep else \
        [d for i, d in enumerate(t.shape) if i not in axes]
    return [TensorType(t.dtype, tuple(shape))]


def _reduce_run(ctx: RunCtx, x, axes_in=None):
    axes = _reduce_axes(ctx, x.ndim, axes_in, True)
    if axes == ():
        return x
    fn = _REDUCE[ctx.node.op][0]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        y = fn(wide(x), axes)
    if not ctx.attr("keepdims", 1):
        y = y.reshape([d for i, d in enumerate(x.shape) if i not in axes])
    return as_dtype(y, x.dtype)


for _name in _REDUCE:
    register(_name, infer=_reduce_infer, run=_reduce_run, fusion=REDUCTION)


# ---- ArgMax / ArgMin ----

def _arg_infer(ctx: InferCtx):
    shape = ctx.shape(0)
    if shape is not None:
        axis = normalize_axis(ctx, ctx.attr("axis", 0), len(shape))
        require_nonempty(ctx, shape, [axis], f"{ctx.node.op} along axis {axis}")
        shape = tuple(1 if i == axis else d for i, d in enumerate(shape)) if ctx.attr("keepdims", 1) \
            else shape[:axis] + shape[axis + 1:]
    return [TensorType(DType.int64, shape)]


def _arg_run(ctx: RunCtx, x):
    axis = normalize_axis(ctx, ctx.attr("axis", 0), x.ndim)
    require_nonempty(ctx, x.shape, [axis], f"{ctx.node.op} along axis {axis}")
    fn = np.argmax if ctx.node.op == "ArgMax" else np.argmin
    if ctx.attr("select_last_index", 0):
        idx = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis)
    else:
        idx = fn(x, axis=axis)
    idx = np.asarray(idx, dtype=np.int64)
    return np.expand_dims(idx, axis) if ctx.attr("keepdims", 1) else idx


for _name in ("ArgMax", "ArgMin"):
    register(_name, infer=_arg_infer, run=_arg_run, fusion=REDUCTION)


# ---- Softmax / LogSoftmax / Hardmax ----

def _hardmax(x, axis):
    idx = np.expand_dims(np.argmax(x, axis=axis), axis)
    out = np.zeros_like(x)
    np.put_along_axis(out, idx, 1, axis=axis)
    return out


_NORMALIZE = {"Softmax": softmax, "LogSoftmax": log_softmax, "Hardmax": _hardmax}


def _normalize_run(ctx: RunCtx, x):
    """Opset < 13 coerces the input to 2-D at `axis` (default 1); from 13 one axis (default -1)."""
    fn = _NORMALIZE[ctx.node.op]
    if x.size == 0:   # nothing to normalize (and no max of an empty slice to take)
        return x.copy()
    if ctx.opset >= 13:
        axis = normalize_axis(ctx, ctx.attr("axis", -1), max(x.ndim, 1))
        y = fn(wide(x), axis)
    else:
        axis = ctx.attr("axis", 1)
        axis = axis + x.ndim if axis < 0 else axis
        if not 0 <= axis <= x.ndim:
            ctx.fail(f"axis {ctx.attr('axis')} is out of range for rank {x.ndim}")
        rows = int(np.prod(x.shape[:axis], dtype=np.int64))
        y = fn(wide(x).reshape(rows, int(np.prod(x.shape[axis:], dtype=np.int64))), 1).reshape(x.shape)
    return as_dtype(y, x.dtype)


for _name in _NORMALIZE:
    register(_name, infer=same_as(0), run=_normalize_run, fusion=OPAQUE if _name == "Hardmax" else REDUCTION)


# ---- CumSum / CumProd ----

def _cumulative_run(ctx: RunCtx, x, axis):
    axis = normalize_axis(ctx, int(np.asarray(axis).reshape(-1)[0]), x.ndim)
    fn, unit = (np.cumsum, 0) if ctx.node.op == "CumSum" else (np.cumprod, 1)
    y = wide(x)
    if ctx.attr("reverse", 0):
        y = np.flip(y, axis)
    if ctx.attr("exclusive", 0):
        pad = [(0, 0)] * x.ndim
        pad[axis] = (1, 0)
        y = np.pad(y, pad, constant_values=unit)
        y = np.take(y, np.arange(x.shape[axis]), axis=axis)
    y = fn(y, axis=axis)
    if ctx.attr("reverse", 0):
        y = np.flip(y, axis)
    return as_dtype(y, x.dtype)


for _name in ("CumSum", "CumProd"):
    register(_name, infer=same_as(0), run=_cumulative_run, fusion=OPAQUE)
