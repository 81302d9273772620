"""Tensor family: constants, shape queries and layout/shape manipulation.

These ops move data without computing on it. Their inference works hard to
keep shapes static: shape-giving inputs known at compile time (`ctx.value`)
give exact output dims, and `Shape`/`Size`/`Constant` publish their data
(`value=`) so chains like `Reshape(x, Concat(Shape(x)[:1], [-1]))` stay static
(the inferencer folds the small ops in between).

Their native lowerings live in kiln.lower.tensor.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.registry import INJECTIVE, OPAQUE, op
from kiln.ops.shapes import broadcast_shapes, dim_mul, normalize_axes, normalize_axis


# ---- helpers shared with indexing.py ----

def ints(a) -> list[int] | None:
    """A known integer tensor as a list of Python ints (None stays None)."""
    return None if a is None else [int(v) for v in np.asarray(a).reshape(-1)]


def scalar(a):
    """The single element of a scalar or 1-element tensor as a Python number."""
    return None if a is None else np.asarray(a).reshape(-1)[0].item()


def param(ctx, attr: str, i: int, since: int, data=None, default=None):
    """An int-list parameter that moved from attribute `attr` to input `i` at opset `since`.

    Infer passes no `data` (the input's compile-time value is used); run
    passes the runtime input. Returns `default` when absent and the string
    "?" when the input exists but is unknown at compile time.
    """
    if ctx.opset < since and (ctx.has_attr(attr) or not ctx.has_input(i)):  # Split-1 took either
        v = ctx.attr(attr, None)
        return default if v is None else ints(v)
    if not ctx.has_input(i):
        return default
    v = ctx.value(i) if data is None else data
    return "?" if v is None else ints(v)


def out(ctx, dtype: DType, shape) -> list:
    """One tensor type for every output."""
    return [TensorType(dtype, None if shape is None else tuple(shape))] * ctx.num_outputs


def vec_len(ctx, i: int):
    """Static length of 1-D input `i` (a shape vector), else None."""
    s = ctx.shape(i) if ctx.has_input(i) else None
    return s[0] if s is not None and len(s) == 1 and isinstance(s[0], int) else None


def _per_axis_infer(ctx, params, dim):
    """Inference for ops mapping each input dim through a per-axis parameter (pads, slices, repeats).

    `params(ctx, rank)` gives the per-axis parameters, or None when unknown at
    compile time (then the rank is kept and the dims are fresh symbols).
    """
    s = ctx.shape(0)
    ps = None if s is None else params(ctx, len(s))
    if ps is None:
        return out(ctx, ctx.dtype(0), None if s is None else ctx.unknown_shape(len(s)))
    return out(ctx, ctx.dtype(0), [dim(d, p) for d, p in zip(s, ps)])


def _sum_dims(ctx, dims):
    return sum(dims) if all(isinstance(d, int) for d in dims) else ctx.new_dim()


# ---- constants and shape queries ----

_CONST_ATTRS = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
                "value_ints": np.int64, "value_string": object, "value_strings": object}


def _constant_data(ctx) -> np.ndarray:
    dense = [k for k in ("value", "sparse_value") if k in ctx.node.attrs]  # frontend densified sparse
    if dense:
        v = np.asarray(ctx.attr(dense[0]))
    else:
        names = [k for k in _CONST_ATTRS if k in ctx.node.attrs]
        if len(names) != 1:
            ctx.fail(f"needs exactly one value attribute, got {sorted(ctx.node.attrs)}")
        v = np.array(ctx.attr(names[0]), dtype=_CONST_ATTRS[names[0]])
    if v.dtype.kind in "US":
        v = v.astype(object)
    return v


def _constant_infer(ctx):
    v = _constant_data(ctx)
    return out(ctx, DType.from_numpy(v.dtype), v.shape)


@op("Constant", infer=_constant_infer, value=lambda ctx: [_constant_data(ctx)], fusion=OPAQUE)
def constant(ctx):
    return _constant_data(ctx).copy()


def _fill(ctx):
    """ConstantOfShape's fill element (default float32 zero)."""
    v = ctx.attr("value", None)
    return np.zeros(1, np.float32) if v is None else np.asarray(v).reshape(-1)[:1]


def _constant_of_shape_infer(ctx):
    shape = ints(ctx.value(0))
    if shape is None:
        n = vec_len(ctx, 0)
        shape = None if n is None else ctx.unknown_shape(n)
    elif any(d < 0 for d in shape):
        ctx.fail(f"shape must be non-negative, got {shape}")
    return out(ctx, DType.from_numpy(_fill(ctx).dtype), shape)


@op("ConstantOfShape", infer=_constant_of_shape_infer, fusion=OPAQUE)
def constant_of_shape(ctx, shape):
    if (shape < 0).any():
        ctx.fail(f"shape must be non-negative, got {ints(shape)}")
    ctx.check_size(ints(shape), _fill(ctx).dtype)
    return np.full(tuple(ints(shape)), _fill(ctx)[0])


def _shape_range(ctx, rank: int) -> slice:
    """Shape-15's start/end attributes, clamped like Python slicing."""
    return slice(*slice(ctx.attr("start", 0), ctx.attr("end", None)).indices(rank)[:2])


def _shape_infer(ctx):
    s = ctx.shape(0)
    n = ctx.new_dim() if s is None else len(s[_shape_range(ctx, len(s))])
    return out(ctx, DType.int64, (n,))


def _shape_value(ctx):
    s = ctx.shape(0)
    dims = None if s is None else s[_shape_range(ctx, len(s))]
    known = dims is not None and all(isinstance(d, int) for d in dims)
    return [np.array(dims, np.int64) if known else None]


@op("Shape", infer=_shape_infer, value=_shape_value, fusion=OPAQUE)
def shape_op(ctx, x):
    return np.array(x.shape[_shape_range(ctx, x.ndim)], np.int64)


def _size_value(ctx):
    t = ctx.tensor(0)
    return [np.array(math.prod(t.shape), np.int64) if t.is_static else None]


@op("Size", infer=lambda ctx: out(ctx, DType.int64, ()), value=_size_value, fusion=OPAQUE)
def size_op(ctx, x):
    return np.array(x.size, np.int64)


# ---- reshaping ----

def _reshape_target(ctx, in_shape, target):
    """Resolve Reshape's 0 (copy) and -1 (infer) entries against `in_shape` (dims may be symbols)."""
    allowzero = ctx.attr("allowzero", 0)
    if target.count(-1) > 1:
        ctx.fail(f"shape {target} has more than one -1")
    if any(d < -1 for d in target):
        ctx.fail(f"shape {target} has a negative entry other than -1")
    if allowzero and -1 in target and 0 in target:
        ctx.fail(f"shape {target} mixes -1 with 0 while allowzero=1")
    dims = []
    for k, d in enumerate(target):
        if d == 0 and not allowzero:
            if k >= len(in_shape):
                ctx.fail(f"shape {target} copies dim {k} (0) but the input has rank {len(in_shape)}")
            d = in_shape[k]
        dims.append(d)
    ins, outs = list(in_shape), [d for d in dims if d != -1]
    for d in [d for d in outs if isinstance(d, str)]:  # symbols copied or shared cancel out
        if d in ins:
            ins.remove(d)
            outs.remove(d)
    n_in, n_out = (math.prod(d for d in ds if isinstance(d, int)) for ds in (ins, outs))
    static = all(isinstance(d, int) for d in ins + outs)
    if -1 in dims:
        k = dims.index(-1)
        syms = [d for d in ins if isinstance(d, str)]
        if not static and len(syms) == 1 and not any(isinstance(d, str) for d in outs) and n_in == n_out:
            dims[k] = syms[0]          # [batch, 32, 7, 7] -> [-1, 1568]: the -1 is `batch`
        elif not static:
            dims[k] = ctx.new_dim()
        elif n_out == 0 or n_in % n_out:
            ctx.fail(f"cannot reshape {tuple(in_shape)} to {target}: "
                     f"{n_in} elements do not divide by {n_out}")
        else:
            dims[k] = n_in // n_out
    elif static and n_in != n_out:
        ctx.fail(f"cannot reshape {tuple(in_shape)} ({n_in} elements) to {target} ({n_out} elements)")
    return dims


def _reshape_infer(ctx):
    target = param(ctx, "shape", 1, 5)
    s = ctx.shape(0)
    if target == "?" or target is None or s is None:
        n = vec_len(ctx, 1) if target == "?" else (len(target) if target else None)
        return out(ctx, ctx.dtype(0), ctx.unknown_shape(n))
    return out(ctx, ctx.dtype(0), _reshape_target(ctx, s, target))


@op("Reshape", infer=_reshape_infer, fusion=INJECTIVE)
def reshape(ctx, x, shape=None):
    target = param(ctx, "shape", 1, 5, shape)
    if target is None:
        ctx.fail("missing target shape")
    return x.reshape(_reshape_target(ctx, x.shape, target))


def _flatten_axis(ctx, rank):
    axis = ctx.attr("axis", 1)
    if not -rank <= axis <= rank:
        ctx.fail(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _flatten_infer(ctx):
    s = ctx.shape(0)
    if s is None:
        return out(ctx, ctx.dtype(0), ctx.unknown_shape(2))
    a = _flatten_axis(ctx, len(s))
    prod = lambda ds: _dims_prod(ctx, ds)
    return out(ctx, ctx.dtype(0), (prod(s[:a]), prod(s[a:])))


def _dims_prod(ctx, dims):
    p = 1
    for d in dims:
        p = dim_mul(p, d, ctx)
    return p


@op("Flatten", infer=_flatten_infer, fusion=INJECTIVE)
def flatten(ctx, x):
    a = _flatten_axis(ctx, x.ndim)
    return x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:]))


def _squeeze_axes(ctx, shape, axes):
    axes = normalize_axes(ctx, axes, len(shape))
    for a in axes:
        if isinstance(shape[a], int) and shape[a] != 1:
            ctx.fail(f"cannot squeeze axis {a} of size {shape[a]} (shape {tuple(shape)})")
    return axes


def _squeeze_infer(ctx):
    axes, s = param(ctx, "axes", 1, 13), ctx.shape(0)
    if axes == "?" or s is None or (axes is None and any(isinstance(d, str) for d in s)):
        return out(ctx, ctx.dtype(0), None)
    axes = [k for k, d in enumerate(s) if d == 1] if axes is None else _squeeze_axes(ctx, s, axes)
    return out(ctx, ctx.dtype(0), [d for k, d in enumerate(s) if k not in axes])


@op("Squeeze", infer=_squeeze_infer, fusion=INJECTIVE)
def squeeze(ctx, x, axes=None):
    axes = param(ctx, "axes", 1, 13, axes)
    return np.squeeze(x, axis=None if axes is None else tuple(_squeeze_axes(ctx, x.shape, axes)))


def _unsqueezed(ctx, shape, axes):
    rank = len(shape) + len(axes)
    axes = normalize_axes(ctx, axes, rank)
    if len(set(axes)) != len(axes):
        ctx.fail(f"axes {axes} repeat an axis")
    rest = iter(shape)
    return [1 if k in axes else next(rest) for k in range(rank)]


def _unsqueeze_infer(ctx):
    axes, s = param(ctx, "axes", 1, 13), ctx.shape(0)
    if axes is None:
        ctx.fail("missing axes")
    if axes == "?" or s is None:
        n = vec_len(ctx, 1) if axes == "?" else len(axes)
        return out(ctx, ctx.dtype(0), None if s is None or n is None else ctx.unknown_shape(len(s) + n))
    return out(ctx, ctx.dtype(0), _unsqueezed(ctx, s, axes))


@op("Unsqueeze", infer=_unsqueeze_infer, fusion=INJECTIVE)
def unsqueeze(ctx, x, axes=None):
    return x.reshape(_unsqueezed(ctx, x.shape, param(ctx, "axes", 1, 13, axes)))


def _perm(ctx, rank):
    perm = ctx.attr("perm", None)
    perm = list(range(rank))[::-1] if perm is None else [int(p) for p in perm]
    if sorted(perm) != list(range(rank)):
        ctx.fail(f"perm {perm} is not a permutation of the {rank} axes")
    return perm


def _transpose_infer(ctx):
    s = ctx.shape(0)
    return out(ctx, ctx.dtype(0), None if s is None else [s[p] for p in _perm(ctx, len(s))])


@op("Transpose", infer=_transpose_infer, fusion=INJECTIVE)
def transpose(ctx, x):
    return np.transpose(x, _perm(ctx, x.ndim))


# ---- joining and splitting ----

def _concat_axis(ctx):
    return ctx.attr("axis", 1) if ctx.opset < 4 else ctx.attr("axis")  # Concat-1 defaulted to 1


def _concat_infer(ctx):
    types = [ctx.tensor(i) for i in range(ctx.num_inputs) if ctx.has_input(i)]
    dtype = types[0].dtype
    if any(t.dtype != dtype for t in types):
        ctx.fail(f"inputs have different dtypes: {[str(t.dtype) for t in types]}")
    shapes = [t.shape for t in types if t.shape is not None]
    if not shapes:
        return out(ctx, dtype, None)
    rank = len(shapes[0])
    if any(len(s) != rank for s in shapes):
        ctx.fail(f"inputs have different ranks: {[tuple(s) for s in shapes]}")
    axis = normalize_axis(ctx, _concat_axis(ctx), rank)
    if len(shapes) < len(types):
        return out(ctx, dtype, ctx.unknown_shape(rank))
    dims = []
    for k in range(rank):
        col = [s[k] for s in shapes]
        if k == axis:
            dims.append(_sum_dims(ctx, col))
            continue
        static = {d for d in col if isinstance(d, int)}
        if len(static) > 1:
            ctx.fail(f"inputs differ in dim {k} (axis {axis} is the only one that may): "
                     f"{[tuple(s) for s in shapes]}")
        dims.append(static.pop() if static else col[0])
    return out(ctx, dtype, dims)


@op("Concat", infer=_concat_infer, fusion=INJECTIVE)
def concat(ctx, *xs):
    xs = [x for x in xs if x is not None]
    if len({x.ndim for x in xs}) > 1:
        ctx.fail(f"inputs have different ranks: {[x.shape for x in xs]}")
    axis = normalize_axis(ctx, _concat_axis(ctx), xs[0].ndim)
    if any(x.shape[:axis] + x.shape[axis + 1:] != xs[0].shape[:axis] + xs[0].shape[axis + 1:] for x in xs):
        ctx.fail(f"shapes {[x.shape for x in xs]} differ outside axis {axis}")
    return np.concatenate(xs, axis=axis)


def _split_sizes(ctx, dim, split):
    """Sizes of Split's outputs along the axis (ints, or None when unknown)."""
    n = ctx.num_outputs
    if split is not None:
        if len(split) != n or any(s < 0 for s in split):
            ctx.fail(f"split {split} must give {n} non-negative sizes")
        if isinstance(dim, int) and sum(split) != dim:
            ctx.fail(f"split {split} sums to {sum(split)}, but the axis has size {dim}")
        return split
    if not isinstance(dim, int):
        return None
    if ctx.has_attr("num_outputs"):
        if ctx.attr("num_outputs") != n:
            ctx.fail(f"num_outputs={ctx.attr('num_outputs')} but the node has {n} outputs")
        chunk = -(-dim // n)
        return [chunk] * (n - 1) + [dim - chunk * (n - 1)]
    if dim % n:
        ctx.fail(f"axis of size {dim} does not split evenly into {n} outputs")
    return [dim // n] * n


def _split_infer(ctx):
    s, split = ctx.shape(0), param(ctx, "split", 1, 13)
    if s is None:
        return out(ctx, ctx.dtype(0), None)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(s))
    sizes = None if split == "?" else _split_sizes(ctx, s[axis], split)
    dims = [ctx.new_dim() for _ in range(ctx.num_outputs)] if sizes is None else sizes
    return [TensorType(ctx.dtype(0), s[:axis] + (d,) + s[axis + 1:]) for d in dims]


@op("Split", infer=_split_infer, fusion=OPAQUE)
def split(ctx, x, split=None):
    axis = normalize_axis(ctx, ctx.attr("axis", 0), x.ndim)
    sizes = _split_sizes(ctx, x.shape[axis], param(ctx, "split", 1, 13, split))
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


# ---- broadcasting, tiling, padding ----

def _expand_infer(ctx):
    shape = ints(ctx.value(1))
    if shape is None:
        n, s = vec_len(ctx, 1), ctx.shape(0)
        return out(ctx, ctx.dtype(0), None if n is None or s is None else ctx.unknown_shape(max(n, len(s))))
    return out(ctx, ctx.dtype(0), broadcast_shapes(ctx, ctx.shape(0), tuple(shape)))


@op("Expand", infer=_expand_infer, fusion=INJECTIVE)
def expand(ctx, x, shape):
    try:
        target = np.broadcast_shapes(x.shape, tuple(ints(shape)))
    except ValueError:
        ctx.fail(f"cannot expand shape {x.shape} to {ints(shape)}")
    ctx.check_size(target, x.dtype)
    return np.broadcast_to(x, target).copy()


def _tile_reps(ctx, rank, repeats=None, axis=None):
    """Tile's per-dim repeats; Tile-1 gave one count (`tiles`) and an `axis` input instead."""
    if repeats is None:
        repeats, axis = ctx.value(1), ctx.value(2)
        if repeats is None or (ctx.opset < 6 and axis is None):
            return None
    reps = ints(repeats)
    if ctx.opset < 6:
        reps = [reps[0] if k == normalize_axis(ctx, int(scalar(axis)), rank) else 1 for k in range(rank)]
    if len(reps) != rank or min(reps, default=0) < 0:
        ctx.fail(f"repeats {reps} must be {rank} non-negative entries")
    return reps


@op("Tile", infer=lambda ctx: _per_axis_infer(ctx, _tile_reps, lambda d, r: dim_mul(d, r, ctx)), fusion=INJECTIVE)
def tile(ctx, x, repeats, axis=None):
    reps = _tile_reps(ctx, x.ndim, repeats, axis)
    ctx.check_size([d * r for d, r in zip(x.shape, reps)], x.dtype)
    return np.tile(x, reps)


def _pads(ctx, rank, pads=None, axes=None):
    """Pad's per-axis (begin, end) list, from Pad-1/2 attributes or Pad-11+ inputs."""
    if ctx.opset < 11:
        pads = ctx.attr("pads" if ctx.opset >= 2 else "paddings")
    elif pads is None:
        pads = ctx.value(1)
        axes = ctx.value(3) if ctx.has_input(3) else None
        if pads is None or (ctx.has_input(3) and axes is None):
            return None
    pads = ints(pads)
    axes = list(range(rank)) if axes is None else normalize_axes(ctx, ints(axes), rank)
    if len(pads) != 2 * len(axes):
        ctx.fail(f"pads {pads} must have 2 entries per padded axis ({len(axes)} axes)")
    both = [(0, 0)] * rank
    for k, a in enumerate(axes):
        both[a] = (pads[k], pads[k + len(axes)])
    return both


def _padded_dim(ctx, d, pads):
    b, e = pads
    if isinstance(d, str):
        return d if b == e == 0 else ctx.new_dim()
    if d + b + e < 0:
        ctx.fail(f"pads ({b}, {e}) crop more than the input dim {d}")
    return d + b + e


@op("Pad", infer=lambda ctx: _per_axis_infer(ctx, _pads, lambda d, p: _padded_dim(ctx, d, p)), fusion=INJECTIVE)
def pad(ctx, x, pads=None, value=None, axes=None):
    both = _pads(ctx, x.ndim, pads if ctx.opset >= 11 else None, axes)
    if ctx.opset < 11:
        value = ctx.attr("value", 0.0)
    value = 0 if value is None or np.size(value) == 0 else scalar(value)
    mode, plan = _pad_plan(ctx, x.shape, both)
    ctx.check_size([n + w[0] + w[1] for _, n, w in plan], x.dtype)
    x = x[tuple(slice(c, c + n) for c, n, _ in plan)]
    width = [w for _, _, w in plan]
    if mode == "constant":
        return np.pad(x, width, constant_values=np.array(value).astype(x.dtype))
    return np.pad(x, width, mode=mode)


def _pad_plan(ctx, shape, both):
    """Pad's mode and per axis (crop at the start, size kept, (pad before, pad after)):
    negative pads crop first, then the kept part is padded. Fails where ORT does."""
    if any(d + b + e < 0 for d, (b, e) in zip(shape, both)):
        ctx.fail(f"pads {both} crop more than the input {tuple(shape)}")
    plan = [(max(-b, 0), d + min(b, 0) + min(e, 0), (max(b, 0), max(e, 0))) for d, (b, e) in zip(shape, both)]
    kept, width = tuple(n for _, n, _ in plan), [w for _, _, w in plan]
    mode = ctx.attr("mode", "constant")
    if mode == "constant":
        return mode, plan
    if mode not in ("reflect", "edge", "wrap"):
        ctx.fail(f"mode must be constant, reflect, edge or wrap, got {mode!r}")
    empty = [k for k, (n, w) in enumerate(zip(kept, width)) if n == 0 and any(w)]
    if empty:   # an empty axis has nothing to mirror or repeat; padding other axes is fine
        ctx.fail(f"cannot {mode}-pad axis {empty[0]} of an empty tensor of shape {kept}")
    if mode == "reflect" and any(max(w) >= d for d, w in zip(kept, width) if max(w)):
        ctx.fail(f"reflect pads {width} must be smaller than the dims {kept} they mirror")
    return mode, plan


def _center_crop_pad_infer(ctx):
    s, target = ctx.shape(0), ints(ctx.value(1))
    if s is None:
        return out(ctx, ctx.dtype(0), None)
    axes = normalize_axes(ctx, ctx.attr("axes", range(len(s))), len(s))
    if target is None:
        return out(ctx, ctx.dtype(0), [ctx.new_dim() if k in axes else d for k, d in enumerate(s)])
    if len(target) != len(axes):
        ctx.fail(f"shape {target} must have one entry per axis {axes}")
    dims = list(s)
    for a, t in zip(axes, target):
        dims[a] = t
    return out(ctx, ctx.dtype(0), dims)


@op("CenterCropPad", infer=_center_crop_pad_infer, fusion=OPAQUE)
def center_crop_pad(ctx, x, shape):
    axes = normalize_axes(ctx, ctx.attr("axes", range(x.ndim)), x.ndim)
    target = ints(shape)
    if len(target) != len(axes):
        ctx.fail(f"shape {target} must have one entry per axis {axes}")
    y = np.zeros([dict(zip(axes, target)).get(k, d) for k, d in enumerate(x.shape)], x.dtype)
    src, dst = [slice(None)] * x.ndim, [slice(None)] * x.ndim
    for a, t in zip(axes, target):
        d = x.shape[a]
        lo = abs(d - t) // 2
        (src if d > t else dst)[a] = slice(lo, lo + min(d, t))
    y[tuple(dst)] = x[tuple(src)]
    return y


# ---- slicing ----

def _slice_args(ctx, rank, starts=None, ends=None, axes=None, steps=None):
    """Slice's per-axis Python slices; None when a parameter is unknown at compile time."""
    if ctx.opset < 10:
        starts, ends, axes = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes", None)
    elif starts is None:
        vals = [ctx.value(i) for i in range(1, 5)]
        if any(ctx.has_input(i) and v is None for i, v in zip(range(1, 5), vals)):
            return None
        starts, ends, axes, steps = vals
    starts, ends = ints(starts), ints(ends)
    axes = list(range(len(starts))) if axes is None else normalize_axes(ctx, ints(axes), rank)
    steps = [1] * len(starts) if steps is None else ints(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        ctx.fail(f"starts {starts}, ends {ends}, axes {axes} and steps {steps} differ in length")
    if len(set(axes)) != len(axes) or 0 in steps:
        ctx.fail(f"axes {axes} must not repeat and steps {steps} must be non-zero")
    out_ = [slice(None)] * rank
    for a, b, e, st in zip(axes, starts, ends, steps):
        out_[a] = slice(b, e, st)
    return out_


def _clamped(d: int, k: slice) -> slice:
    """ONNX's clamping, which differs from Python's for negative steps: start goes to
    [0, d-1] (so a start before the beginning still takes element 0) and end to [-1, d-1]."""
    if k == slice(None):
        return k
    b, e = (v + d if v < 0 else v for v in (k.start, k.stop))
    if k.step > 0:
        return slice(min(max(b, 0), d), min(max(e, 0), d), k.step)
    e = min(max(e, -1), d - 1)
    return slice(min(max(b, 0), d - 1), None if e < 0 else e, k.step)


def contiguous_slice_offset(shape, starts, ends, axes=None, steps=None) -> int | None:
    """The element offset of Slice(x, starts, ends, axes, steps) in a row-major x of static
    `shape` when the result is one contiguous run of x (single indices on the axes before
    one axis, a unit-step range there, every axis after it whole), else None: then the Slice
    is a view of x at that offset and needs no kernel (a packed QKV's unbind: q, k and v are
    three consecutive runs of one buffer)."""
    if not all(isinstance(d, int) for d in shape):
        return None
    rank = len(shape)
    axes = list(range(len(starts))) if axes is None else [a + rank if a < 0 else a for a in axes]
    steps = [1] * len(starts) if steps is None else list(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps) or len(set(axes)) != len(axes) \
            or 0 in steps or any(not 0 <= a < rank for a in axes):
        return None
    per = {a: _clamped(d, slice(b, e, st)) for a, b, e, st, d in
           zip(axes, starts, ends, steps, (shape[a % rank] for a in axes))}
    ranges = [range(*per.get(a, slice(None)).indices(d)) for a, d in enumerate(shape)]
    if any(len(r) == 0 for r in ranges):
        return None
    offset, stride, inner_whole = 0, 1, True
    for a in reversed(range(rank)):
        r, d = ranges[a], shape[a]
        if not inner_whole and len(r) > 1:
            return None   # a range on this axis, but an axis inside it was cut
        if len(r) > 1 and r.step != 1:
            return None
        offset += r[0] * stride
        inner_whole = inner_whole and len(r) == d
        stride *= d
    return offset


def _sliced_dim(ctx, d, k: slice):
    if isinstance(d, int):
        return len(range(*_clamped(d, k).indices(d)))
    big = 2 ** 31 - 1  # exporters write INT_MAX / INT64_MAX for "to the end"
    whole = k == slice(None) or (k.step == 1 and k.start == 0 and k.stop >= big) or \
        (k.step == -1 and (k.start == -1 or k.start >= big) and k.stop <= -big)
    return d if whole else ctx.new_dim()


@op("Slice", infer=lambda ctx: _per_axis_infer(ctx, _slice_args, lambda d, k: _sliced_dim(ctx, d, k)), fusion=INJECTIVE)
def slice_op(ctx, x, starts=None, ends=None, axes=None, steps=None):
    sl = _slice_args(ctx, x.ndim, starts, ends, axes, steps)
    return x[tuple(_clamped(d, k) for d, k in zip(x.shape, sl))].copy()


# ---- generators ----

def _range_count(ctx, start, limit, delta):
    if delta == 0:
        ctx.fail("delta must be non-zero")
    return max(math.ceil((limit - start) / delta), 0)


def _range_infer(ctx):
    dtype = ctx.dtype(0)
    if ctx.dtype(1) != dtype or ctx.dtype(2) != dtype:
        ctx.fail(f"start, limit and delta must share a dtype, got {dtype}, {ctx.dtype(1)}, {ctx.dtype(2)}")
    vals = [scalar(ctx.value(i)) for i in range(3)]
    n = ctx.new_dim() if None in vals else _range_count(ctx, *vals)
    return out(ctx, dtype, (n,))


@op("Range", infer=_range_infer, fusion=OPAQUE)
def range_op(ctx, start, limit, delta):
    s, lim, d = (scalar(v) for v in (start, limit, delta))
    n = _range_count(ctx, s, lim, d)
    ctx.check_size([n], np.float64 if DType.from_numpy(start.dtype).is_float else np.int64)
    if DType.from_numpy(start.dtype).is_float:  # start + i*delta, rounded once
        return (np.float64(s) + np.arange(n) * np.float64(d)).astype(start.dtype)
    return (s + np.arange(n, dtype=np.int64) * d).astype(start.dtype)


def _eye_like_dtype(ctx):
    code = ctx.attr("dtype", None)
    return ctx.dtype(0) if code is None else DType.from_onnx(code)


def _eye_like_infer(ctx):
    s = ctx.shape(0)
    if s is not None and len(s) != 2:
        ctx.fail(f"input must be 2-D, got shape {tuple(s)}")
    return out(ctx, _eye_like_dtype(ctx), s)


@op("EyeLike", infer=_eye_like_infer, fusion=OPAQUE)
def eye_like(ctx, x):
    if x.ndim != 2:
        ctx.fail(f"input must be 2-D, got shape {x.shape}")
    code = ctx.attr("dtype", None)
    dt = x.dtype if code is None else DType.from_onnx(code).np
    return np.eye(*x.shape, k=ctx.attr("k", 0), dtype=dt)


def _trilu_infer(ctx):
    if ctx.shape(0) is not None and len(ctx.shape(0)) < 2:
        ctx.fail(f"input must have rank >= 2, got shape {ctx.shape(0)}")
    return out(ctx, ctx.dtype(0), ctx.shape(0))


@op("Trilu", infer=_trilu_infer, fusion=OPAQUE)
def trilu(ctx, x, k=None):
    k = 0 if k is None else int(scalar(k))
    keep = (np.triu if ctx.attr("upper", 1) else np.tril)(np.ones(x.shape[-2:], bool), k)
    return np.where(keep, x, np.zeros((), x.dtype))


# ---- block rearrangements ----

def _blocks_infer(ctx, to_space: bool):
    s, bs = ctx.shape(0), ctx.attr("blocksize")
    if s is None:
        return out(ctx, ctx.dtype(0), ctx.unknown_shape(4))
    if len(s) != 4:
        ctx.fail(f"input must be 4-D (N, C, H, W), got {tuple(s)}")
    n, c, h, w = s
    div = lambda d: d // (bs * bs) if to_space else d * bs * bs
    mul = (lambda d: dim_mul(d, bs, ctx)) if to_space else (lambda d: d // bs)
    for d in ((c,) if to_space else (h, w)):
        if isinstance(d, int) and d % (bs * bs if to_space else bs):
            ctx.fail(f"dim {d} of {tuple(s)} does not divide by blocksize {bs}"
                     f"{'^2' if to_space else ''}")
    f = lambda fn, d: fn(d) if isinstance(d, int) else ctx.new_dim()
    return out(ctx, ctx.dtype(0), (n, f(div, c), f(mul, h), f(mul, w)))


def _mode(ctx):
    mode = ctx.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        ctx.fail(f"mode must be DCR or CRD, got {mode!r}")
    return mode


@op("DepthToSpace", infer=lambda ctx: _blocks_infer(ctx, True), fusion=INJECTIVE)
def depth_to_space(ctx, x):
    b, c, h, w = x.shape
    bs = ctx.attr("blocksize")
    if _mode(ctx) == "DCR":
        t = x.reshape(b, bs, bs, c // bs ** 2, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        t = x.reshape(b, c // bs ** 2, bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    return t.reshape(b, c // bs ** 2, h * bs, w * bs)


@op("SpaceToDepth", infer=lambda ctx: _blocks_infer(ctx, False), fusion=INJECTIVE)
def space_to_depth(ctx, x):
    b, c, h, w = x.shape
    bs = ctx.attr("blocksize")
    t = x.reshape(b, c, h // bs, bs, w // bs, bs)
    t = t.transpose((0, 3, 5, 1, 2, 4) if _mode(ctx) == "DCR" else (0, 1, 3, 5, 2, 4))
    return t.reshape(b, c * bs * bs, h // bs, w // bs)


def _reverse_sequence_axes(ctx):
    return ctx.attr("batch_axis", 1), ctx.attr("time_axis", 0)


@op("ReverseSequence", infer=lambda ctx: out(ctx, ctx.dtype(0), ctx.shape(0)), fusion=OPAQUE)
def reverse_sequence(ctx, x, lens):
    b_ax, t_ax = _reverse_sequence_axes(ctx)
    if {b_ax, t_ax} != {0, 1}:
        ctx.fail(f"batch_axis/time_axis must be 0 and 1, got {b_ax}, {t_ax}")
    y = np.moveaxis(x, b_ax, 0).copy()
    for i, n in enumerate(ints(lens)):
        if not 0 <= n <= y.shape[1]:
            ctx.fail(f"sequence_lens[{i}] = {n} is out of range [0, {y.shape[1]}]")
        y[i, :n] = y[i, :n][::-1]
    return np.moveaxis(y, 0, b_ax)
