"""RMSNorm recognition: the primitive chain exporters write becomes one RMSNormalization op.

    r = Sqrt(ReduceMean(x**2 | x*x, trailing axes) + eps)
    y = x / r   |   x * Reciprocal(r)   |   x * (1 / r)
    y = y * w                                                (optional; w broadcast over the
                                                              normalized axes only)

→ `RMSNormalization(x, w) {axis, epsilon}` (opset 23 semantics; kiln's op definition serves
any graph): one kernel that reads each row once for its sum of squares and once to scale it,
instead of three (square, mean, scale). This is the form of Llama's, T5's and Gemma's
(`x * (1 + w)`: w is then the Add) RMSNorm as torch.onnx exports it in float32; the Casts
around it are identities there and gone by now (eliminate_nops). Every value inside the
chain must be read only by the chain, so nothing is computed twice; eps must be one number,
and the mean over the normalized axes only.
"""

from __future__ import annotations

import numpy as np

from kiln.graph.ir import Graph
from kiln.passes.edit import const_scalar, static_shape
from kiln.passes.layernorm import STASH, _reduced_axes
from kiln.passes.pattern import Const, Op, Or, Rule, Var, apply_rules
from kiln.passes.registry import PassContext, graph_pass

X = Var("x")
SQUARE = Or(Op("Pow", X, Const(when=lambda a: a.size == 1 and float(a.reshape(())) == 2)), Op("Mul", X, X))
RMS = Op("Sqrt", Op("Add", Op("ReduceMean", SQUARE, name="ms"), Const("eps", lambda a: a.size == 1)))
NORM = Or(Op("Div", X, RMS), Op("Mul", X, Op("Reciprocal", RMS)),
          Op("Mul", X, Op("Div", Const(when=lambda a: a.size == 1 and float(a.reshape(())) == 1), RMS)))


def _weight(b, w, norm_shape, dtype):
    """`w` as RMSNormalization's scale: itself when its shape (leading 1s dropped) broadcasts
    over the normalized axes alone, else None (a weight that varies along a leading axis is
    not a scale)."""
    shape = static_shape(w)
    if shape is None or w.type.dtype.np != dtype:
        return None
    while shape and shape[0] == 1 and len(shape) > len(norm_shape):
        shape = shape[1:]
    if len(shape) > len(norm_shape) or any(s not in (1, n) for s, n in zip(shape[::-1], norm_shape[::-1])):
        return None
    if w.const is not None and tuple(w.const.shape) != tuple(shape):
        return b.const(np.ascontiguousarray(w.const.reshape(shape)), f"{w.name}.rms")
    return w


def _rmsnorm(m, b):
    x = m["x"]
    shape = getattr(x.type, "shape", None)   # leading dims may be symbols (batch, sequence)
    if shape is None or x.type.dtype.name not in STASH:
        return None
    axes = _reduced_axes(m.node("ms"), len(shape))
    if not axes or axes != list(range(axes[0], len(shape))) or not all(isinstance(d, int) for d in shape[axes[0]:]):
        return None
    eps = m["eps"]
    if eps.const.ndim > len(shape) or eps.type.dtype != x.type.dtype:
        return None
    norm_shape, dtype = tuple(shape[axes[0]:]), x.type.dtype.np
    w = m.get("w")
    scale = (_weight(b, w, norm_shape, dtype) if w is not None
             else b.const(np.ones(norm_shape, dtype), f"{m.root.name}.ones"))
    if scale is None:
        return None
    attrs = {"axis": axes[0], "epsilon": float(str(np.float32(const_scalar(eps))))}
    if STASH[x.type.dtype.name] != 1:
        attrs["stash_type"] = STASH[x.type.dtype.name]
    return b.op("RMSNormalization", [x, scale], attrs)


RULES = [
    Rule("RMSNorm*w", Op("Mul", NORM, Var("w", lambda v: v.type is not None)), _rmsnorm, private=True),
    Rule("RMSNorm", NORM, _rmsnorm, private=True),
]


@graph_pass("recognize_rmsnorm")
def recognize_rmsnorm(graph: Graph, ctx: PassContext) -> Graph:
    """Replace RMSNorm written out as Pow/ReduceMean/Add/Sqrt/Div (or Reciprocal)/Mul by RMSNormalization."""
    ctx.tally(apply_rules(graph, RULES, reverse=True))
    return graph
