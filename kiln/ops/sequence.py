"""Sequences and optionals: construction, access, split/concat, SequenceMap.

Runtime values: a sequence is a Python list of arrays, an empty optional is
`None`, a full optional is its contained value. Elements of one sequence may
differ in shape, so element types join (`join_types`) into symbolic dims.
"""

from __future__ import annotations

import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import OptionalType, SequenceType, TensorType, Type
from kiln.ops.registry import OPAQUE, op
from kiln.ops.shapes import normalize_axis

I64 = TensorType(DType.int64, ())
BOOL = TensorType(DType.bool, ())


def join_types(ctx, a: Type, b: Type, what: str = "value", keep=frozenset()) -> Type:
    """The least general type covering both `a` and `b`.

    Differing dims become a fresh symbol (or stay, if `a`'s dim is in `keep`:
    a symbol already standing for "any size"), differing ranks an unknown rank.
    Differing kinds or dtypes fail: no value could have both types.
    """
    if a == b:
        return a
    if isinstance(a, TensorType) and isinstance(b, TensorType):
        if a.dtype != b.dtype:
            ctx.fail(f"{what}: element types differ ({a.dtype} vs {b.dtype})")
        if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
            return TensorType(a.dtype, None)
        return TensorType(a.dtype, tuple(
            x if x == y or x in keep else ctx.new_dim() for x, y in zip(a.shape, b.shape)))
    if isinstance(a, OptionalType) != isinstance(b, OptionalType):  # a value is a full optional
        a, b = (x if isinstance(x, OptionalType) else OptionalType(x) for x in (a, b))
    if type(a) is not type(b):
        ctx.fail(f"{what}: types {a} and {b} cannot be joined")
    return type(a)(join_types(ctx, a.elem, b.elem, what, keep))


def seq_elem(ctx, i: int) -> Type:
    t = ctx.type(i)
    if not isinstance(t, SequenceType):
        ctx.fail(f"input {i} must be a sequence, got {t}")
    return t.elem


def _position(ctx, pos, n: int, allow_end: bool) -> int:
    """Normalize a sequence position; `allow_end` admits n (insert at the back)."""
    if np.size(pos) != 1:
        ctx.fail(f"position must be a single element, got shape {np.shape(pos)}")
    p = int(np.asarray(pos).reshape(-1)[0])
    hi = n if allow_end else n - 1
    if not -n <= p <= hi:
        ctx.fail(f"position {p} is out of range [{-n}, {hi}] for a sequence of length {n}")
    return p + n if p < 0 else p


# ---- construction and access ----

def _infer_empty(ctx):
    return [SequenceType(TensorType(DType.from_onnx(ctx.attr("dtype", 1)), None))]


@op("SequenceEmpty", infer=_infer_empty, fusion=OPAQUE)
def sequence_empty(ctx):
    return []


def _infer_construct(ctx):
    if ctx.num_inputs == 0:
        ctx.fail("needs at least one input tensor")
    t = ctx.tensor(0)
    for i in range(1, ctx.num_inputs):
        t = join_types(ctx, t, ctx.tensor(i), "inputs")
    return [SequenceType(t)]


@op("SequenceConstruct", infer=_infer_construct, fusion=OPAQUE)
def sequence_construct(ctx, *xs):
    return list(xs)


def _infer_insert(ctx):
    return [SequenceType(join_types(ctx, seq_elem(ctx, 0), ctx.tensor(1), "inserted tensor"))]


@op("SequenceInsert", infer=_infer_insert, fusion=OPAQUE)
def sequence_insert(ctx, seq, x, pos=None):
    out = list(seq)
    out.insert(len(seq) if pos is None else _position(ctx, pos, len(seq), True), x)
    return out


@op("SequenceAt", infer=lambda ctx: [seq_elem(ctx, 0)], fusion=OPAQUE)
def sequence_at(ctx, seq, pos):
    return seq[_position(ctx, pos, len(seq), False)]


@op("SequenceErase", infer=lambda ctx: [SequenceType(seq_elem(ctx, 0))], fusion=OPAQUE)
def sequence_erase(ctx, seq, pos=None):
    out = list(seq)
    if not out:
        ctx.fail("cannot erase from an empty sequence")
    del out[-1 if pos is None else _position(ctx, pos, len(seq), False)]
    return out


def _infer_length(ctx):
    seq_elem(ctx, 0)
    return [I64]


@op("SequenceLength", infer=_infer_length, fusion=OPAQUE)
def sequence_length(ctx, seq):
    return np.array(len(seq), np.int64)


# ---- split / concat ----

def _split_sizes(ctx, dim: int, split) -> list[int]:
    """Chunk sizes along the split axis: all ones, equal chunks of a scalar, or explicit."""
    if split is None:
        return [1] * dim
    split = np.asarray(split).astype(np.int64)
    if split.ndim == 0:
        s = int(split)
        if s <= 0:
            ctx.fail(f"split size must be positive, got {s}")
        return [s] * (dim // s) + ([dim % s] if dim % s else [])
    if split.ndim != 1 or (split < 0).any() or int(split.sum()) != dim:
        ctx.fail(f"split {split.tolist()} must be non-negative sizes summing to the axis "
                 f"length {dim}")
    return split.tolist()


def _infer_split_to_sequence(ctx):
    t = ctx.tensor(0)
    if t.shape is None:
        return [SequenceType(t)]
    axis = normalize_axis(ctx, ctx.attr("axis", 0), len(t.shape))
    dims = list(t.shape)
    if not ctx.has_input(1):
        if ctx.attr("keepdims", 1):
            dims[axis] = 1
        else:
            del dims[axis]
    else:
        split, d = ctx.value(1), dims[axis]
        sizes = set(_split_sizes(ctx, d, split)) if split is not None and isinstance(d, int) else ()
        dims[axis] = sizes.pop() if len(sizes) == 1 else ctx.new_dim()
    return [SequenceType(TensorType(t.dtype, tuple(dims)))]


@op("SplitToSequence", infer=_infer_split_to_sequence, fusion=OPAQUE)
def split_to_sequence(ctx, x, split=None):
    axis = normalize_axis(ctx, ctx.attr("axis", 0), x.ndim)
    sizes = _split_sizes(ctx, x.shape[axis], split)
    parts = np.split(x, np.cumsum(sizes)[:-1], axis=axis)
    if split is None and not ctx.attr("keepdims", 1):
        parts = [np.squeeze(p, axis) for p in parts]
    return parts


def _infer_concat_from_sequence(ctx):
    e = seq_elem(ctx, 0)
    if not isinstance(e, TensorType):
        ctx.fail(f"sequence elements must be tensors, got {e}")
    if e.shape is None:
        return [e]
    new_axis = ctx.attr("new_axis", 0)
    dims = list(e.shape)
    axis = normalize_axis(ctx, ctx.attr("axis"), len(dims) + bool(new_axis))
    if new_axis:
        dims.insert(axis, ctx.new_dim())
    else:
        dims[axis] = ctx.new_dim()
    return [TensorType(e.dtype, tuple(dims))]


@op("ConcatFromSequence", infer=_infer_concat_from_sequence, fusion=OPAQUE)
def concat_from_sequence(ctx, seq):
    if not seq:
        ctx.fail("cannot concatenate an empty sequence")
    new_axis = ctx.attr("new_axis", 0)
    axis = normalize_axis(ctx, ctx.attr("axis"), seq[0].ndim + bool(new_axis))
    shapes = {tuple(np.delete(x.shape, axis)) if not new_axis else x.shape for x in seq}
    if len(shapes) != 1:
        ctx.fail(f"elements' shapes {[x.shape for x in seq]} differ off the axis {axis}")
    return np.stack(seq, axis) if new_axis else np.concatenate(seq, axis)


# ---- SequenceMap ----

def _infer_sequence_map(ctx):
    body = ctx.attr("body")
    ins = [t.elem if isinstance(t, SequenceType) else t
           for t in (ctx.type(i) for i in range(ctx.num_inputs))]
    seq_elem(ctx, 0)
    if len(body.inputs) != len(ins):
        ctx.fail(f"body takes {len(body.inputs)} inputs, the node gives {len(ins)}")
    outs = ctx.infer_subgraph(body, ins)
    if len(outs) != ctx.num_outputs:
        ctx.fail(f"body gives {len(outs)} outputs, the node has {ctx.num_outputs}")
    return [SequenceType(t) for t in outs]


@op("SequenceMap", infer=_infer_sequence_map, fusion=OPAQUE)
def sequence_map(ctx, seq, *extra):
    ins = [seq, *extra]
    n = len(seq)
    for x in ins:
        if isinstance(x, list) and len(x) != n:
            ctx.fail(f"input sequences differ in length ({n} vs {len(x)})")
    results = [ctx.run_subgraph(ctx.attr("body"), [x[i] if isinstance(x, list) else x for x in ins])
               for i in range(n)]
    outs = [list(r) for r in zip(*results)] if results else [[] for _ in range(ctx.num_outputs)]
    return outs[0] if ctx.num_outputs == 1 else tuple(outs)


# ---- optionals ----

def _infer_optional(ctx):
    if ctx.has_input(0):
        return [OptionalType(ctx.type(0))]
    if not ctx.has_attr("type"):
        ctx.fail("an empty Optional needs the 'type' attribute")
    return [OptionalType(ctx.attr("type"))]


@op("Optional", infer=_infer_optional, fusion=OPAQUE)
def optional(ctx, x=None):
    return x


def _infer_get_element(ctx):
    t = ctx.type(0)
    return [t.elem if isinstance(t, OptionalType) else t]


@op("OptionalGetElement", infer=_infer_get_element, fusion=OPAQUE)
def optional_get_element(ctx, x):
    if x is None:
        ctx.fail("the optional input is empty")
    return x


@op("OptionalHasElement", infer=lambda ctx: [BOOL], fusion=OPAQUE)
def optional_has_element(ctx, x=None):
    return np.array(x is not None)
