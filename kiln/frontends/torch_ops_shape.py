"""ATen handlers of shapes and data movement: views, permutes, concatenation and splits,
slicing and indexing, padding, gathers, tensor creation, and the symbolic-size arithmetic
Dynamo and torch.export graphs hold.
"""

from __future__ import annotations

import operator

import numpy as np
import torch

from kiln.dtypes import DType
from kiln.frontends.torch_fx import SymInt
from kiln.graph.ir import Value
from kiln.frontends.torch_ops_common import INT64_MAX, TABLE, _axis, aten, reg
from kiln.frontends.torch_ops_nn import _axes


@reg(aten.permute.default)
def _permute(t, n, x, dims):
    r = t.b.rank(x)
    return t.b.op("Transpose", [x], perm=[_axis(d, r) for d in dims])


@reg(aten.t.default)
def _t(t, n, x):
    return x if t.b.rank(x) < 2 else t.b.op("Transpose", [x], perm=[1, 0])


@reg(aten.transpose.int)
def _transpose(t, n, x, a, b):
    r = t.b.rank(x)
    perm = list(range(r))
    perm[_axis(a, r)], perm[_axis(b, r)] = perm[_axis(b, r)], perm[_axis(a, r)]
    return t.b.op("Transpose", [x], perm=perm)


@reg(aten.expand.default)
def _expand(t, n, x, size, implicit=False):
    size = [1 if (isinstance(s, int) and s == -1) else s for s in size]
    return t.b.op("Expand", [x, t.int_list(size)])


@reg(aten.cat.default)
def _cat(t, n, xs, dim=0):
    dt = t.out_dtype(n)
    xs = [x for x in xs if not (t.b.rank(x) == 1 and t.b.shape(x)[0] == 0)] or xs[:1]
    r = t.b.rank(xs[0])
    return t.b.op("Concat", [t.b.cast(x, dt) for x in xs], axis=_axis(dim, r))


@reg(aten.stack.default)
def _stack(t, n, xs, dim=0):
    r = t.b.rank(xs[0]) + 1
    a = _axis(dim, r)
    return t.b.op("Concat", [t.b.op("Unsqueeze", [x, t.b.i64([a])]) for x in xs], axis=a)


@reg(aten.split_with_sizes.default)
def _split_with_sizes(t, n, x, sizes, dim=0):
    a = _axis(dim, t.b.rank(x))
    if len(sizes) == 1:
        return [x]
    return list(t.b.op("Split", [x, t.int_list(sizes)], n_out=len(sizes), axis=a))


@reg(aten.split.Tensor)
def _split(t, n, x, size, dim=0):
    a = _axis(dim, t.b.rank(x))
    total = t.b.shape(x)[a]
    if not isinstance(total, int):
        t.fail(n, "split of a symbolic dim is not supported")
    sizes = [min(size, total - s) for s in range(0, total, size)] or [0]
    return _split_with_sizes(t, n, x, sizes, a)


@reg(aten.unbind.int)
def _unbind(t, n, x, dim=0):
    a = _axis(dim, t.b.rank(x))
    total = t.b.shape(x)[a]
    if not isinstance(total, int):
        t.fail(n, "unbind of a symbolic dim is not supported")
    parts = _split_with_sizes(t, n, x, [1] * total, a) if total > 1 else [x]
    return [t.b.op("Squeeze", [p, t.b.i64([a])]) for p in parts]


@reg(aten.slice.Tensor)
def _slice(t, n, x, dim=0, start=None, end=None, step=1):
    a = _axis(dim, t.b.rank(x))
    start = 0 if start is None else start
    end = INT64_MAX if end is None else end
    if isinstance(end, int):
        end = min(end, INT64_MAX)
    if isinstance(start, int) and start == 0 and isinstance(end, int) and end >= INT64_MAX and step == 1:
        return x
    return t.b.op("Slice", [x, t.int_list([start]), t.int_list([end]), t.b.i64([a]), t.int_list([step])])


@reg(aten.select.int)
def _select(t, n, x, dim, index):
    a = _axis(dim, t.b.rank(x))
    idx = index.value if isinstance(index, SymInt) else t.b.const(np.asarray(index, dtype=np.int64))
    return t.b.op("Gather", [x, idx], axis=a)


@reg(aten.squeeze.dims, aten.squeeze.dim, aten.squeeze.default)
def _squeeze(t, n, x, dims=None):
    shape = t.b.shape(x)
    r = len(shape)
    axes = _axes(t, x, dims) if dims is not None else list(range(r))
    axes = [a for a in axes if shape[a] == 1]  # torch leaves a dim that is not 1 alone
    return t.b.op("Squeeze", [x, t.b.i64(axes)]) if axes else x


@reg(aten.unsqueeze.default)
def _unsqueeze(t, n, x, dim):
    return t.b.op("Unsqueeze", [x, t.b.i64([_axis(dim, t.b.rank(x) + 1)])])


@reg(aten.flip.default)
def _flip(t, n, x, dims):
    axes = _axes(t, x, dims)
    k = len(axes)
    return t.b.op("Slice", [x, t.b.i64([-1] * k), t.b.i64([-INT64_MAX - 1] * k), t.b.i64(axes),
                            t.b.i64([-1] * k)])


@reg(aten.repeat.default)
def _repeat(t, n, x, repeats):
    extra = len(repeats) - t.b.rank(x)
    if extra > 0:
        x = t.b.op("Unsqueeze", [x, t.b.i64(list(range(extra)))])
    return t.b.op("Tile", [x, t.int_list(repeats)])


@reg(aten.constant_pad_nd.default)
def _pad(t, n, x, pad, value=0):
    r = t.b.rank(x)
    begins, ends = [0] * r, [0] * r
    for i in range(len(pad) // 2):
        begins[r - 1 - i], ends[r - 1 - i] = pad[2 * i], pad[2 * i + 1]
    return t.b.op("Pad", [x, t.int_list(begins + ends), t.tensor(value, t.b.dtype(x))], mode="constant")


@reg(aten.tril.default, aten.triu.default)
def _trilu(t, n, x, diagonal=0):
    return t.b.op("Trilu", [x, t.b.i64(diagonal)],
                  upper=int(n.target is aten.triu.default))


@reg(aten.embedding.default)
def _embedding(t, n, w, idx, *rest):
    return t.b.op("Gather", [w, idx], axis=0)


@reg(aten.index_select.default)
def _index_select(t, n, x, dim, idx):
    return t.b.op("Gather", [x, idx], axis=_axis(dim, t.b.rank(x)))


@reg(aten.gather.default)
def _gather(t, n, x, dim, idx, sparse_grad=False):
    return t.b.op("GatherElements", [x, idx], axis=_axis(dim, t.b.rank(x)))


@reg(aten.index.Tensor)
def _index(t, n, x, indices):
    """x[..., i, j, ...] with index tensors: one index is a Gather; several adjacent ones from
    the first dim on are broadcast together and read with GatherND."""
    pos = [k for k, i in enumerate(indices) if i is not None]
    if len(pos) == 1 and t.b.dtype(indices[pos[0]]) == DType.bool:
        return _mask_index(t, x, indices[pos[0]], pos[0])
    idx = [_as_index(t, indices[k]) for k in pos]
    if len(pos) == 1:
        return t.b.op("Gather", [x, idx[0]], axis=pos[0])
    if pos != list(range(len(pos))):
        t.fail(n, "advanced indexing with index tensors that do not start at dim 0 and sit side by "
                  "side is not supported")
    shape = idx[0]
    for i in idx[1:]:
        shape = t.b.op("Add", [shape, i])  # broadcasts every index to one shape
    zero = t.b.op("Mul", [shape, t.tensor(0, DType.int64)])
    cols = [t.b.op("Unsqueeze", [t.b.op("Add", [i, zero]), t.b.i64([-1])]) for i in idx]
    sizes = [t.b.shape(x)[k] for k in range(len(pos))]
    cols = [_wrap_negative(t, c, s) for c, s in zip(cols, sizes)]
    return t.b.op("GatherND", [x, t.b.op("Concat", cols, axis=-1)])


def _mask_index(t, x: Value, mask: Value, k: int) -> Value:
    """x[..., mask] (a bool mask over dims k .. k+r-1): those dims flattened into one, and the
    entries where the mask is true kept (Compress; the result's size is a run-time symbol)."""
    r = t.b.rank(mask)
    if r != 1:
        shape = t.b.op("Shape", [x])
        parts = [t.b.i64([-1])]
        if k:
            parts.insert(0, t.b.op("Slice", [shape, t.b.i64([0]), t.b.i64([k])]))
        if k + r < t.b.rank(x):
            parts.append(t.b.op("Slice", [shape, t.b.i64([k + r]), t.b.i64([INT64_MAX])]))
        x = t.b.op("Reshape", [x, t.b.op("Concat", parts, axis=0) if len(parts) > 1 else parts[0]])
        mask = t.b.op("Reshape", [mask, t.b.i64([-1])])
    return t.b.op("Compress", [x, mask], axis=k)


def _as_index(t, i: Value) -> Value:
    if t.b.dtype(i) == DType.bool:
        from kiln.errors import KilnError
        raise KilnError("a boolean mask next to other index tensors is not supported (index with "
                        "the mask alone, or with mask.nonzero())", stage="torch import")
    return t.b.cast(i, DType.int64)


def _wrap_negative(t, i: Value, size) -> Value:
    if not isinstance(size, int):
        return i
    neg = t.b.op("Less", [i, t.tensor(0, DType.int64)])
    return t.b.op("Where", [neg, t.b.op("Add", [i, t.tensor(size, DType.int64)]), i])


# -- tensor factories ------------------------------------------------------------------------

@reg(aten.full.default)
def _full(t, n, size, value, **kw):
    dt = t.out_dtype(n)
    static = [t.static_int(s) for s in size]
    if all(s is not None for s in static):
        return t.b.const(np.full(static, value, dtype=dt.np))
    return t.b.op("Expand", [t.tensor(value, dt), t.int_list(size)])


@reg(aten.full_like.default)
def _full_like(t, n, x, value, **kw):
    dt = t.out_dtype(n)
    shape = t.b.shape(x)
    if all(isinstance(s, int) for s in shape):
        return t.b.const(np.full(shape, value, dtype=dt.np))
    return t.b.op("Expand", [t.tensor(value, dt), t.b.op("Shape", [x])])


@reg(aten.scalar_tensor.default)
def _scalar_tensor(t, n, value, **kw):
    return t.b.const(np.asarray(value, dtype=t.out_dtype(n).np))


@reg(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(t, n, *args, **kw):
    nums = [a for a in args if not isinstance(a, (torch.dtype, torch.layout, torch.device))]
    if n.target is aten.arange.default:
        start, end, step = 0, nums[0], 1
    elif n.target is aten.arange.start:
        start, end, step = nums[0], nums[1], 1
    else:
        start, end = nums[0], nums[1]
        step = nums[2] if len(nums) > 2 else kw.get("step", 1)
    dt = t.out_dtype(n)
    vals = [t.static_int(v) if isinstance(v, SymInt) else v for v in (start, end, step)]
    if all(isinstance(v, (int, float)) for v in vals):
        return t.b.const(np.arange(*vals).astype(dt.np))
    return t.b.op("Range", [_scalar(t, start, dt), _scalar(t, end, dt), _scalar(t, step, dt)])


def _scalar(t, v, dt):
    return t.tensor(v, dt)


# -- symbolic sizes (Dynamo and torch.export graphs read sizes of dynamic dims) ------------

@reg(aten.sym_size.int)
def _sym_size(t, n, x, dim):
    a = _axis(dim, t.b.rank(x))
    d = t.b.shape(x)[a]
    if isinstance(d, int):
        return d
    s = t.b.op("Shape", [x], start=a, end=a + 1)
    return SymInt(t.b.op("Squeeze", [s, t.b.i64([0])]))


_SYM = {operator.add: ("Add", operator.add), operator.sub: ("Sub", operator.sub),
        operator.mul: ("Mul", operator.mul), operator.floordiv: ("Div", operator.floordiv),
        operator.mod: ("Mod", operator.mod)}


def _sym_binary(op, py):
    def handler(t, n, a, b):
        sa, sb = t.static_int(a), t.static_int(b)
        if sa is not None and sb is not None:
            return py(sa, sb)
        return SymInt(t.b.op(op, [t.tensor(a, DType.int64), t.tensor(b, DType.int64)]))
    return handler


for _pyop, (_op, _py) in _SYM.items():
    TABLE[_pyop] = _sym_binary(_op, _py)

# comparisons of sizes: the range checks torch.export adds for data-dependent sizes (their
# _assert_scalar is dropped), or a python bool where both sides are known
for _pyop, _op in [(operator.ge, "GreaterOrEqual"), (operator.gt, "Greater"), (operator.le, "LessOrEqual"),
                   (operator.lt, "Less"), (operator.eq, "Equal")]:
    TABLE[_pyop] = _sym_binary(_op, _pyop)


@reg(operator.neg)
def _sym_neg(t, n, a):
    s = t.static_int(a)
    return -s if s is not None else SymInt(t.b.op("Neg", [a.value]))
