"""Indexing family: gather/scatter by index tensors and data-dependent selection.

Indices may be negative (counted from the end); any index out of range is a
KilnError naming the node, never a wrapped or clipped read. Outputs whose size
depends on data (NonZero, Unique, Compress) get fresh symbols at compile time.

Their native lowerings live in kiln.lower.indexing.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.registry import INJECTIVE, OPAQUE, op
from kiln.ops.shapes import normalize_axis
from kiln.ops.tensor import out, scalar


def _indices(ctx, idx, dim: int, what: str = "index"):
    """int64 indices with negatives wrapped; out-of-range ones fail."""
    idx = np.asarray(idx).astype(np.int64)
    bad = (idx < -dim) | (idx >= dim)
    if bad.any():
        ctx.fail(f"{what} {int(idx[bad].reshape(-1)[0])} is out of range for a dim of size {dim}")
    return np.where(idx < 0, idx + dim, idx)


def _axis(ctx, rank: int, default: int = 0) -> int:
    return normalize_axis(ctx, ctx.attr("axis", default), rank)


# ---- gathers ----

def _gather_infer(ctx):
    s, i = ctx.shape(0), ctx.shape(1)
    if s is None or i is None:
        return out(ctx, ctx.dtype(0), None)
    a = _axis(ctx, len(s))
    return out(ctx, ctx.dtype(0), s[:a] + i + s[a + 1:])


@op("Gather", infer=_gather_infer, fusion=INJECTIVE)
def gather(ctx, data, indices):
    a = _axis(ctx, data.ndim)
    return np.asarray(np.take(data, _indices(ctx, indices, data.shape[a]), axis=a))


def _gather_elements_infer(ctx):
    s, i = ctx.shape(0), ctx.shape(1)
    if s is not None and i is not None and len(s) != len(i):
        ctx.fail(f"data {tuple(s)} and indices {tuple(i)} must have the same rank")
    return out(ctx, ctx.dtype(0), i)


@op("GatherElements", infer=_gather_elements_infer, fusion=OPAQUE)
def gather_elements(ctx, data, indices):
    if data.ndim != indices.ndim:
        ctx.fail(f"data {data.shape} and indices {indices.shape} must have the same rank")
    a = _axis(ctx, data.ndim)
    return np.take_along_axis(data, _indices(ctx, indices, data.shape[a]), axis=a)


def _gather_nd_infer(ctx):
    s, i, b = ctx.shape(0), ctx.shape(1), ctx.attr("batch_dims", 0)
    if s is None or not i or not isinstance(i[-1], int):
        return out(ctx, ctx.dtype(0), None)
    if i[-1] > len(s) - b:
        ctx.fail(f"indices {tuple(i)} index {i[-1]} dims but data {tuple(s)} has "
                 f"{len(s) - b} after batch_dims={b}")
    return out(ctx, ctx.dtype(0), i[:-1] + s[b + i[-1]:])


def _nd_index(ctx, data_shape, indices, b: int):
    """Flatten GatherND/ScatterND's indices to (batch, M, k) with negatives wrapped."""
    k = indices.shape[-1] if indices.ndim else len(data_shape) + 1
    if b >= indices.ndim or k > len(data_shape) - b or data_shape[:b] != indices.shape[:b]:
        ctx.fail(f"indices {indices.shape} do not fit data {data_shape} with batch_dims={b}")
    dims = np.array(data_shape[b:b + k], np.int64)
    idx = indices.astype(np.int64).reshape(math.prod(indices.shape[:b]), math.prod(indices.shape[b:-1]), k)
    bad = (idx < -dims) | (idx >= dims)
    if bad.any():
        ctx.fail(f"an index in {indices.shape} is out of range for data {data_shape}")
    return np.where(idx < 0, idx + dims, idx)


@op("GatherND", infer=_gather_nd_infer, fusion=OPAQUE)
def gather_nd(ctx, data, indices):
    b = ctx.attr("batch_dims", 0)
    idx = _nd_index(ctx, data.shape, indices, b)
    d = data.reshape((math.prod(data.shape[:b]),) + data.shape[b:])
    batch = np.broadcast_to(np.arange(d.shape[0])[:, None], idx.shape[:2])
    res = d[(batch, *np.moveaxis(idx, -1, 0))]
    return res.reshape(indices.shape[:-1] + data.shape[b + indices.shape[-1]:])


# ---- scatters ----

_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_into(ctx, data, index, updates):
    """Copy of `data` with `updates` written (or reduced) at the advanced index `index`."""
    y = data.copy()
    reduction = ctx.attr("reduction", "none")
    if reduction == "none":
        y[index] = updates
    elif reduction in _REDUCE:
        _REDUCE[reduction].at(y, index, updates)
    else:
        ctx.fail(f"reduction must be none, add, mul, max or min, got {reduction!r}")
    return y


def _scatter_elements_infer(ctx):
    s, i, u = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if i is not None and u is not None and len(i) == len(u) and any(
            isinstance(p, int) and isinstance(q, int) and p != q for p, q in zip(i, u)):
        ctx.fail(f"indices {tuple(i)} and updates {tuple(u)} must have the same shape")
    return out(ctx, ctx.dtype(0), s)


def scatter_elements(ctx, data, indices, updates):
    if not data.ndim == indices.ndim == updates.ndim or indices.shape != updates.shape:
        ctx.fail(f"data {data.shape}, indices {indices.shape} and updates {updates.shape} "
                 "must have equal ranks, and indices/updates equal shapes")
    a = _axis(ctx, data.ndim)
    index = list(np.indices(indices.shape, sparse=True))
    index[a] = _indices(ctx, indices, data.shape[a])
    return _scatter_into(ctx, data, tuple(index), updates)


op("ScatterElements", infer=_scatter_elements_infer, aliases=("Scatter",), fusion=OPAQUE)(scatter_elements)


def _scatter_nd_infer(ctx):
    return out(ctx, ctx.dtype(0), ctx.shape(0))


@op("ScatterND", infer=_scatter_nd_infer, fusion=OPAQUE)
def scatter_nd(ctx, data, indices, updates):
    idx = _nd_index(ctx, data.shape, indices, 0)[0]
    want = indices.shape[:-1] + data.shape[indices.shape[-1]:]
    if updates.shape != want:
        ctx.fail(f"updates {updates.shape} must have shape {want} for indices {indices.shape}")
    return _scatter_into(ctx, data, tuple(idx.T), updates.reshape((idx.shape[0],) + want[indices.ndim - 1:]))


def _tensor_scatter_infer(ctx):
    if ctx.attr("mode", "linear") not in ("linear", "circular"):
        ctx.fail(f"mode must be linear or circular, got {ctx.attr('mode')!r}")
    return out(ctx, ctx.dtype(0), ctx.shape(0))


@op("TensorScatter", infer=_tensor_scatter_infer, fusion=OPAQUE)
def tensor_scatter(ctx, past, update, write_indices=None):
    a = _axis(ctx, past.ndim, -2)
    if a == 0 or update.ndim != past.ndim or any(
            p != u for k, (p, u) in enumerate(zip(past.shape, update.shape)) if k != a):
        ctx.fail(f"update {update.shape} must match past_cache {past.shape} except on axis {a} (not 0)")
    size, seq = past.shape[a], update.shape[a]
    starts = np.zeros(past.shape[0], np.int64) if write_indices is None else write_indices.astype(np.int64)
    y = past.copy()
    for b, w in enumerate(starts):
        pos = w + np.arange(seq)
        if ctx.attr("mode", "linear") == "circular":
            pos %= size
        elif seq and (w < 0 or pos[-1] >= size):
            ctx.fail(f"write_indices[{b}] = {w} plus {seq} updates overruns axis size {size}")
        np.moveaxis(y[b], a - 1, 0)[pos] = np.moveaxis(update[b], a - 1, 0)
    return y


# ---- data-dependent selection ----

def _compress_infer(ctx):
    s, cond = ctx.shape(0), ctx.value(1)
    n = ctx.new_dim() if cond is None else int(np.count_nonzero(cond))
    if ctx.attr("axis", None) is None:
        return out(ctx, ctx.dtype(0), (n,))
    a = None if s is None else _axis(ctx, len(s))
    return out(ctx, ctx.dtype(0), None if s is None else s[:a] + (n,) + s[a + 1:])


@op("Compress", infer=_compress_infer, fusion=OPAQUE)
def compress(ctx, x, condition):
    axis = ctx.attr("axis", None)
    axis = None if axis is None else _axis(ctx, x.ndim)
    cond = condition.reshape(-1).astype(bool)
    if cond.size > (x.size if axis is None else x.shape[axis]):
        ctx.fail(f"condition of length {cond.size} is longer than the compressed axis of {x.shape}")
    return np.compress(cond, x, axis=axis)


def _nonzero_infer(ctx):
    s = ctx.shape(0)
    return out(ctx, DType.int64, (ctx.new_dim() if s is None else max(len(s), 1), ctx.new_dim()))


@op("NonZero", infer=_nonzero_infer, fusion=OPAQUE)
def nonzero(ctx, x):
    return np.array(np.nonzero(x.reshape(-1) if x.ndim == 0 else x), np.int64).reshape(max(x.ndim, 1), -1)


def _unique_infer(ctx):
    s, n, axis = ctx.shape(0), ctx.new_dim(), ctx.attr("axis", None)
    vec = TensorType(DType.int64, (n,))
    if axis is None:
        total = ctx.new_dim() if s is None or not ctx.tensor(0).is_static else int(np.prod(s, dtype=np.int64))
        y = (n,)
    elif s is None:
        total, y = ctx.new_dim(), None
    else:
        a = _axis(ctx, len(s))
        total, y = s[a], s[:a] + (n,) + s[a + 1:]
    return [TensorType(ctx.dtype(0), y), vec, TensorType(DType.int64, (total,)), vec]


@op("Unique", infer=_unique_infer, fusion=OPAQUE)
def unique(ctx, x):
    axis = ctx.attr("axis", None)
    axis = None if axis is None else _axis(ctx, x.ndim)
    dt = DType.from_numpy(x.dtype)
    if dt.is_narrow:  # NumPy cannot sort bfloat16/float8: order their exact float32 values
        x = x.astype(np.float32 if dt.is_float else np.int32)
    y, first, inverse, counts = np.unique(x.reshape(-1) if axis is None else x, return_index=True,
                                          return_inverse=True, return_counts=True, axis=axis)
    y = y.astype(dt.np)
    inverse = inverse.reshape(-1)
    if not ctx.attr("sorted", 1):  # reorder to first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y, first, counts = np.take(y, order, axis=axis or 0), first[order], counts[order]
        inverse = rank[inverse]
    return y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)


def _topk_k(ctx, k=None):
    if ctx.opset < 10:
        return ctx.attr("k")
    if k is None:
        return None if ctx.value(1) is None else int(scalar(ctx.value(1)))
    if k.size != 1:
        ctx.fail(f"K must hold one value, got shape {k.shape}")
    return int(scalar(k))


def _topk_infer(ctx):
    s, k = ctx.shape(0), _topk_k(ctx)
    if s is None:
        return [TensorType(ctx.dtype(0), None), TensorType(DType.int64, None)]
    a = _axis(ctx, len(s), -1)
    if k is not None and (k < 0 or isinstance(s[a], int) and k > s[a]):
        ctx.fail(f"k={k} is out of range for axis {a} of size {s[a]}")
    y = s[:a] + (ctx.new_dim() if k is None else k,) + s[a + 1:]
    return [TensorType(ctx.dtype(0), y), TensorType(DType.int64, y)]


@op("TopK", infer=_topk_infer, fusion=OPAQUE)
def topk(ctx, x, k=None):
    a, k = _axis(ctx, x.ndim, -1), _topk_k(ctx, k)
    n = x.shape[a]
    if not 0 <= k <= n:
        ctx.fail(f"k={k} is out of range for axis {a} of size {n}")
    if ctx.attr("largest", 1):  # descending, ties by ascending index: sort the reversed axis stably
        order = n - 1 - np.flip(np.argsort(np.flip(x, a), axis=a, kind="stable"), a)
    else:
        order = np.argsort(x, axis=a, kind="stable")
    idx = np.take(order, np.arange(k), axis=a)
    return np.take_along_axis(x, idx, axis=a), idx.astype(np.int64)


def _onehot_axis(ctx, rank: int) -> int:
    axis = ctx.attr("axis", -1)
    if not -rank - 1 <= axis <= rank:
        ctx.fail(f"axis {axis} is out of range for output rank {rank + 1}")
    return axis + rank + 1 if axis < 0 else axis


def _onehot_infer(ctx):
    s, depth = ctx.shape(0), scalar(ctx.value(1))
    if s is None:
        return out(ctx, ctx.dtype(2), None)
    a = _onehot_axis(ctx, len(s))
    return out(ctx, ctx.dtype(2), s[:a] + (ctx.new_dim() if depth is None else int(depth),) + s[a:])


@op("OneHot", infer=_onehot_infer, fusion=OPAQUE)
def onehot(ctx, indices, depth, values):
    depth, a = int(scalar(depth)), _onehot_axis(ctx, indices.ndim)
    if depth < 1 or values.size != 2:
        ctx.fail(f"depth must be positive and values hold [off, on], "
                 f"got depth {depth}, values of shape {values.shape}")
    ctx.check_size((*indices.shape, depth), np.int64)
    idx = np.expand_dims(np.where(indices < 0, indices + depth, indices), a)  # fractional: no class
    classes = np.arange(depth).reshape([-1 if k == a else 1 for k in range(indices.ndim + 1)])
    off, on = values.reshape(-1)
    return np.where(idx == classes, on, off).astype(values.dtype)
