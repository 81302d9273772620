"""BatchNorm folding: an inference BatchNormalization after a Conv, ConvTranspose, Gemm or
MatMul(+Add) with constant weights becomes part of that op.

Inference BN is `y*s + t` per channel, with s = scale/sqrt(var+eps) and
t = bias - mean*s. When BN is the only reader of `y = x⊛W + b`, scaling W's
output channels by s and taking b*s + t as the bias gives the same result with
no BN (a missing bias is created). Channels are axis 1: the Conv's output
channels (W's axis 0; a ConvTranspose's W is (C, M/group, k...): its axis 1 within each
group); for Gemm and 2-D MatMul the output columns.
"""

from __future__ import annotations

import numpy as np

from kiln.graph.ir import Graph, Node
from kiln.passes.edit import is_float
from kiln.passes.pattern import Const, Op, Rule, Var, apply_rules
from kiln.passes.registry import PassContext, graph_pass


def _inference(n: Node) -> bool:
    return (len(n.outputs) == 1 and not n.attrs.get("training_mode", 0)
            and n.attrs.get("spatial", 1) == 1)


def _bn(producer):
    return Op("BatchNormalization", producer, Const("scale"), Const("bias"), Const("mean"),
              Const("var"), when=_inference)


def _scale_shift(m, channels: int):
    """(s, t) in float64, or None when the BN parameters are not per-channel vectors."""
    p = [m.const(k).astype(np.float64) for k in ("scale", "bias", "mean", "var")]
    if any(a.shape != (channels,) for a in p):
        return None
    scale, bias, mean, var = p
    s = scale / np.sqrt(var + float(m.root_node.attrs.get("epsilon", 1e-5)))
    return s, bias - mean * s


def _const_input(n: Node, i: int):
    """(present, data) of optional input i: a missing input is (False, None)."""
    v = n.inputs[i] if len(n.inputs) > i else None
    return (v is not None), (None if v is None else v.const)


def _scaled(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """w * s (broadcast) computed in float64 and rounded once to w's dtype, in the ufunc's
    buffered chunks: no float64 copy of w (ResNet-18's 11M conv weights: 88 MB twice)."""
    if w.dtype not in (np.float16, np.float32, np.float64):    # (bfloat16..: through a float64 copy)
        return (w.astype(np.float64) * s).astype(w.dtype)
    out = np.empty(np.broadcast_shapes(w.shape, s.shape), w.dtype)
    np.multiply(w, s, out=out, dtype=np.float64, casting="same_kind")
    return out


def _fold_conv(m, b):
    conv, w = m.node("y"), m.const("w")
    has_bias, bias = _const_input(conv, 2)
    st = _scale_shift(m, w.shape[0]) if w.ndim >= 3 and is_float(m["x"]) else None
    if st is None or (has_bias and bias is None):
        return None
    s, t = st
    w2 = _scaled(w, s.reshape((-1,) + (1,) * (w.ndim - 1)))
    b2 = (bias.astype(np.float64) if has_bias else 0.0) * s + t
    return b.op("Conv", [m["x"], b.const(w2, f"{m['w'].name}.bn"),
                         b.const(b2.astype(w.dtype), f"{conv.name}.bias")], dict(conv.attrs), conv.name)


def _fold_conv_transpose(m, b):
    """ConvTranspose's output channels are W's axis 1 within each group: W is (C, M/g, k...)."""
    conv, w = m.node("y"), m.const("w")
    has_bias, bias = _const_input(conv, 2)
    group = int(conv.attrs.get("group", 1))
    if w.ndim < 3 or w.shape[0] % group or not is_float(m["x"]) or (has_bias and bias is None):
        return None
    st = _scale_shift(m, w.shape[1] * group)
    if st is None:
        return None
    s, t = st
    wg = w.astype(np.float64).reshape(group, w.shape[0] // group, *w.shape[1:])
    w2 = (wg * s.reshape(group, 1, w.shape[1], *(1,) * (w.ndim - 2))).reshape(w.shape)
    b2 = (bias.astype(np.float64) if has_bias else 0.0) * s + t
    return b.op("ConvTranspose", [m["x"], b.const(w2.astype(w.dtype), f"{m['w'].name}.bn"),
                                  b.const(b2.astype(w.dtype), f"{conv.name}.bias")], dict(conv.attrs), conv.name)


def _fold_gemm(m, b):
    gemm, w = m.node("y"), m.const("w")
    has_c, c = _const_input(gemm, 2)
    trans_b = bool(gemm.attrs.get("transB", 0))
    if w.ndim != 2 or (has_c and c is None) or b.opset() < 7 or not is_float(m["x"]):
        return None
    st = _scale_shift(m, w.shape[0] if trans_b else w.shape[1])
    if st is None:
        return None
    s, t = st
    w2 = _scaled(w, s[:, None] if trans_b else s[None, :])
    beta = float(gemm.attrs.get("beta", 1.0))
    c2 = (beta * c.astype(np.float64) if has_c else 0.0) * s + t
    attrs = {**gemm.attrs, "beta": 1.0}
    return b.op("Gemm", [m["x"], b.const(w2, f"{m['w'].name}.bn"),
                         b.const(c2.astype(w.dtype), f"{gemm.name}.bias")], attrs, gemm.name)


def _fold_matmul(m, b):
    """2-D MatMul (+ constant bias): columns are the channels."""
    mm, w = m.node("mm"), m.const("w")
    c = m.const("c") if m.get("c") is not None else np.zeros((), w.dtype)
    if w.ndim != 2 or getattr(m.root.type, "rank", None) != 2 or not is_float(m["x"]):
        return None
    st = _scale_shift(m, w.shape[1])
    if st is None:
        return None
    s, t = st
    w2 = _scaled(w, s[None, :])
    y = b.op("MatMul", [m["x"], b.const(w2, f"{m['w'].name}.bn")], name=mm.name)
    return b.op("Add", [y, b.const((c.astype(np.float64) * s + t).astype(w.dtype), f"{mm.name}.bias")])


MATMUL = Op("MatMul", Var("x"), Const("w"), name="mm")

RULES = [
    Rule("Conv+BN", _bn(Op("Conv", Var("x"), Const("w"), name="y")), _fold_conv, private=True),
    Rule("ConvTranspose+BN", _bn(Op("ConvTranspose", Var("x"), Const("w"), name="y")), _fold_conv_transpose,
         private=True),
    Rule("Gemm+BN", _bn(Op("Gemm", Var("x"), Const("w"), name="y")), _fold_gemm, private=True),
    Rule("MatMul+Add+BN", _bn(Op("Add", MATMUL, Const("c"))), _fold_matmul, private=True),
    Rule("MatMul+BN", _bn(MATMUL), _fold_matmul, private=True),
]


@graph_pass("fold_batchnorm")
def fold_batchnorm(graph: Graph, ctx: PassContext) -> Graph:
    """Fold inference BatchNormalization into the Conv/Gemm/MatMul(+Add) before it."""
    ctx.tally(apply_rules(graph, RULES))
    return graph
