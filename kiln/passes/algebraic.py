"""Algebraic simplification: shorter or cheaper forms of the same expression.

- reshape chains: Reshape/Flatten/Squeeze/Unsqueeze of one of them → one Reshape
  (a reshape never moves data, so only the final shape matters);
- Transpose pairs → one Transpose with the composed perm, or nothing;
- a Transpose that moves only size-1 axes (the others keep their order) → Reshape: it
  moves no data (a bidirectional LSTM's [seq, 2, 1, H] → [seq, 1, 2, H] at batch 1), and
  as a Reshape it is a view, where as a Transpose it was copied or fused as a strided
  read into the GEMM that consumes it;
- constants gathered: (x*c1)*c2 → x*(c1*c2), (x+c1)+c2 → x+(c1+c2);
- canonical forms: x-c → x+(-c) (exact), x/c → x*(1/c) (floats, when 1/c is a
  normal number), 1/x → Reciprocal(x), x**2 → x*x, Neg(Neg(x)) → x;
- strength reduction: x/y, where y is broadcast over x (LayerNorm's division by
  the per-row std), → x*Reciprocal(y): one division per row instead of per element;
- x*Sigmoid(x) (SiLU as exporters write it) → Swish(x): one elementwise op, so it fuses
  into the Conv/MatMul that makes x as an epilogue (x has two readers, so neither the
  Sigmoid nor the Mul could join it) and the sigmoid's tensor is never written.

Reassociating and replacing a division by a multiplication change float results
by about an ulp, as every optimizing compiler's -O2 does.
"""

from __future__ import annotations

import numpy as np

from kiln.graph.ir import Graph
from kiln.passes.edit import same_type, static_shape
from kiln.passes.pattern import Const, Op, Rule, Var, apply_rules
from kiln.passes.registry import PassContext, graph_pass

RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def _not_const(v) -> bool:
    return v.const is None


def _float_kind(v) -> bool:
    return v.const is None and getattr(v.type, "dtype", None) is not None and v.type.dtype.np.kind == "f"


def _one_reshape(m, b):
    x, root = m["x"], m.root
    if same_type(x.type, root.type):
        return x
    shape = static_shape(root)
    if shape is not None:   # a literal 0 is an empty dim here, not "copy the input's dim"
        return b.op("Reshape", [x, b.const(np.array(shape, np.int64))], {"allowzero": 1} if 0 in shape else {})
    outer = m.root_node
    target = outer.inputs[1] if outer.op == "Reshape" and len(outer.inputs) > 1 else None
    if target is not None and target.const is not None and (
            outer.attrs.get("allowzero", 0) or not np.any(target.const == 0)):
        return b.op("Reshape", [x, target], dict(outer.attrs))
    return None


def transpose_perm(node, rank):
    """A Transpose node's perm (ONNX's default: the axes reversed)."""
    p = node.attrs.get("perm")
    return list(p) if p is not None else list(range(rank))[::-1]


def _compose_transposes(m, b):
    x = m["x"]
    rank = getattr(x.type, "rank", None)
    if rank is None:
        return None
    inner, outer = transpose_perm(m.node("inner"), rank), transpose_perm(m.root_node, rank)
    perm = [inner[i] for i in outer]
    if perm == list(range(rank)):
        return x
    return b.op("Transpose", [x], {"perm": perm})


def _transpose_as_reshape(m, b):
    x, root = m["x"], m.root
    shape, out = static_shape(x), static_shape(root)
    if shape is None or out is None:
        return None
    perm = transpose_perm(m.root_node, len(shape))
    moved = [a for a in perm if shape[a] != 1]
    if perm == sorted(perm) or moved != sorted(moved):
        return None
    return b.op("Reshape", [x, b.const(np.array(out, np.int64))], {"allowzero": 1} if 0 in out else {})


def _combine(fn, op):
    def rewrite(m, b):
        c1, c2 = m.const("c1"), m.const("c2")
        if c1.dtype != c2.dtype or c1.dtype.kind not in "iuf":
            return None
        with np.errstate(all="ignore"):
            c = np.asarray(fn(c1, c2)).astype(c1.dtype)
        if c.size > max(c1.size, c2.size):
            return None  # an outer product of constants: more data, not less
        return b.op(op, [m["x"], b.const(c)])
    return rewrite


def _sub_to_add(m, b):
    c = m.const("c")
    if c.dtype.kind not in "if":
        return None
    return b.op("Add", [m["x"], b.const(np.negative(c))])


def _div_to_mul(m, b):
    c = m.const("c")
    if c.dtype.kind != "f" or not _float_kind(m["x"]):
        return None
    with np.errstate(all="ignore"):
        r = (1.0 / c.astype(np.float64)).astype(c.dtype)
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(r))
            and np.all(np.abs(r) >= np.finfo(c.dtype).tiny)):
        return None
    return b.op("Mul", [m["x"], b.const(r)])


def _div_by_broadcast(m, b):
    y_shape, out_shape = static_shape(m["y"]), static_shape(m.root)
    if y_shape is None or out_shape is None or np.prod(y_shape) >= np.prod(out_shape):
        return None
    return b.op("Mul", [m["x"], b.op("Reciprocal", [m["y"]])])


def _reciprocal(m, b):
    return b.op("Reciprocal", [m["x"]])


def _square(m, b):
    return b.op("Mul", [m["x"], m["x"]])


def _input(m, b):
    return m["x"]


def _swish(m, b):
    return b.op("Swish", [m["x"]])


def _scalar_is(value):
    return lambda a: a.size == 1 and a.dtype.kind in "iuf" and float(a.reshape(())) == value


RULES = [
    Rule("reshape of reshape", Op(RESHAPES, Op(RESHAPES, Var("x"), name="inner")), _one_reshape),
    Rule("transpose pair", Op("Transpose", Op("Transpose", Var("x"), name="inner")),
         _compose_transposes),
    Rule("transpose of size-1 axes", Op("Transpose", Var("x")), _transpose_as_reshape),
    Rule("(x*c1)*c2", Op("Mul", Op("Mul", Var("x", _not_const), Const("c1")), Const("c2")),
         _combine(np.multiply, "Mul")),
    Rule("(x+c1)+c2", Op("Add", Op("Add", Var("x", _not_const), Const("c1")), Const("c2")),
         _combine(np.add, "Add")),
    Rule("x-c", Op("Sub", Var("x", _not_const), Const("c")), _sub_to_add),
    Rule("1/x", Op("Div", Const(when=_scalar_is(1)), Var("x", _float_kind)), _reciprocal),
    Rule("x/c", Op("Div", Var("x", _not_const), Const("c")), _div_to_mul),
    Rule("x/y, y broadcast", Op("Div", Var("x", _float_kind), Var("y", _not_const)),
         _div_by_broadcast),
    Rule("x**2", Op("Pow", Var("x", _float_kind), Const(when=_scalar_is(2))), _square),
    Rule("Neg(Neg(x))", Op("Neg", Op("Neg", Var("x"))), _input),
    Rule("x*Sigmoid(x)", Op("Mul", Var("x", _float_kind), Op("Sigmoid", Var("x"))), _swish, private=True),
]


@graph_pass("simplify_algebra")
def simplify_algebra(graph: Graph, ctx: PassContext) -> Graph:
    """Reshape/Transpose chains, gathered constants, canonical and cheaper arithmetic."""
    ctx.tally(apply_rules(graph, RULES))
    return graph

