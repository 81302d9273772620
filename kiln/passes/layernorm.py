"""LayerNormalization recognition: the primitive chain older exporters write becomes one op.

    d = x - ReduceMean(x, trailing axes)
    y = d / Sqrt(ReduceMean(d**2 | d*d, same axes) + eps)     (or d * Reciprocal(Sqrt(...)))
    y = y * gamma + beta                                       (each optional)

→ `LayerNormalization(x, gamma, beta) {axis, epsilon}` (opset 17 semantics;
kiln's op definition serves any graph). Every value inside the chain must be
read only by the chain, so nothing is computed twice.
"""

from __future__ import annotations

import numpy as np

from kiln.graph.ir import Graph, Node
from kiln.passes.edit import const_scalar, static_shape
from kiln.passes.pattern import Const, Op, Or, Rule, Var, apply_rules
from kiln.passes.registry import PassContext, graph_pass

X = Var("x")
D = Op("Sub", X, Op("ReduceMean", X, name="mean"), name="d")
SQUARE = Or(Op("Pow", D, Const(when=lambda a: a.size == 1 and float(a.reshape(())) == 2)),
            Op("Mul", D, D))
STD = Op("Sqrt", Op("Add", Op("ReduceMean", SQUARE, name="var"), Const("eps", lambda a: a.size == 1)))
NORM = Or(Op("Div", D, STD), Op("Mul", D, Op("Reciprocal", STD)))

STASH = {"float16": 1, "bfloat16": 1, "float32": 1, "float64": 11}


def _reduced_axes(n: Node, rank: int) -> list[int] | None:
    """The sorted non-negative axes a keepdims ReduceMean averages over, or None."""
    if not n.attrs.get("keepdims", 1):
        return None
    given = n.inputs[1] if len(n.inputs) > 1 else None
    if given is not None:
        if given.const is None:
            return None
        axes = given.const.reshape(-1).tolist()
    else:
        axes = n.attrs.get("axes")
    if not axes:
        return None if n.attrs.get("noop_with_empty_axes", 0) else list(range(rank))
    return sorted(a % rank for a in axes)


def _param(b, v, norm_shape, dtype):
    """`v`'s data as a tensor of the normalized shape (broadcast if need be), or None."""
    a = v.const
    if a.dtype != dtype:
        return None
    while a.ndim > len(norm_shape) and a.shape[0] == 1:
        a = a[0]
    try:
        a = np.broadcast_to(a, norm_shape)
    except ValueError:
        return None
    return v if v.const.shape == tuple(norm_shape) else b.const(np.ascontiguousarray(a), f"{v.name}.ln")


def _layernorm(m, b):
    x = m["x"]
    shape = static_shape(x)
    if shape is None or x.type.dtype.name not in STASH:
        return None
    axes = _reduced_axes(m.node("mean"), len(shape))
    if not axes or axes != _reduced_axes(m.node("var"), len(shape)) or axes != list(
            range(axes[0], len(shape))):
        return None
    norm_shape, dtype = shape[axes[0]:], x.type.dtype.np
    gamma = m.get("gamma")
    scale = (_param(b, gamma, norm_shape, dtype) if gamma is not None
             else b.const(np.ones(norm_shape, dtype), f"{m.root.name}.ones"))
    bias = None if m.get("beta") is None else _param(b, m["beta"], norm_shape, dtype)
    if scale is None or (m.get("beta") is not None and bias is None):
        return None
    attrs = {"axis": axes[0], "epsilon": float(str(np.float32(const_scalar(m["eps"]))))}
    if STASH[x.type.dtype.name] != 1:
        attrs["stash_type"] = STASH[x.type.dtype.name]
    return b.op("LayerNormalization", [x, scale] + ([bias] if bias is not None else []), attrs)


RULES = [
    Rule("LayerNorm*gamma+beta", Op("Add", Op("Mul", NORM, Const("gamma")), Const("beta")),
         _layernorm, private=True),
    Rule("LayerNorm*gamma", Op("Mul", NORM, Const("gamma")), _layernorm, private=True),
    Rule("LayerNorm", NORM, _layernorm, private=True),
]


@graph_pass("recognize_layernorm")
def recognize_layernorm(graph: Graph, ctx: PassContext) -> Graph:
    """Replace LayerNorm written out as ReduceMean/Sub/Pow/Sqrt/Div/Mul/Add by LayerNormalization."""
    ctx.tally(apply_rules(graph, RULES, reverse=True))
    return graph
