"""A ConvTranspose whose windows do not overlap becomes a 1x1 Conv and a DepthToSpace.

Why: when the kernel equals the stride (U-Net's and DBNet's 2x2 / stride 2 up-convolutions),
every output pixel receives exactly one input pixel times one kernel tap:

    y[n, m, h*k + a, w*k + b] = sum_c x[n, c, h, w] * W[c, m, a, b] + bias[m]

That is a 1x1 convolution to k*k*M channels (channel (a*k + b)*M + m, weight
W[c, m, a, b], the bias tiled k*k times) followed by a DCR DepthToSpace of block k.
DCR rather than CRD: each of the k*k output positions reads a run of M whole channels,
so on the blocked layout (M a multiple of the block) the DepthToSpace moves whole channel
vectors and stays blocked (kiln.passes.layout), where CRD would gather every k*k-th lane.
The 1x1 conv runs on kiln's fast convolution kernels (and the blocked layout), where a
direct ConvTranspose lowering visits all k*k taps per output to use one of them.

Applies to a 2-D ConvTranspose with constant weights (and bias), group 1, square kernel
equal to its strides, dilations 1, no padding, output_padding or output_shape, float
input, in a graph of opset 11+ (DepthToSpace's mode attribute). Any other ConvTranspose is left alone.
"""

from __future__ import annotations

import numpy as np

from kiln.graph.ir import Graph, Node
from kiln.passes.edit import is_float
from kiln.passes.pattern import Const, Op, Rule, Var, apply_rules
from kiln.passes.registry import PassContext, graph_pass


def _block(node: Node, w: np.ndarray) -> int | None:
    """k when `node` (weights `w`) is a non-overlapping square 2-D ConvTranspose, else None."""
    a = node.attrs
    if w.ndim != 4 or int(a.get("group", 1)) != 1 or w.shape[2] != w.shape[3]:
        return None
    k = int(w.shape[2])
    if k < 2 or [int(v) for v in a.get("kernel_shape", w.shape[2:])] != [k, k]:
        return None

    def ints(name, default):
        return [int(v) for v in a.get(name, default)]
    if (ints("strides", [1, 1]) != [k, k] or ints("dilations", [1, 1]) != [1, 1]
            or any(ints("pads", [0] * 4)) or any(ints("output_padding", [0, 0]))
            or "output_shape" in a):
        return None
    auto = a.get("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    return k if auto in ("NOTSET", "VALID") else None


def _to_conv(m, b):
    node, w = m.node("y"), m.const("w")
    k = _block(node, w)
    if m.get("b") is None and len(node.inputs) > 2 and node.inputs[2] is not None:
        return None   # the bias-less rule seeing a node with a bias
    bias = m.const("b") if m.get("b") is not None else None
    if k is None or b.opset() < 11 or not is_float(m["x"]) or (m.get("b") is not None and bias is None):
        return None
    c, mo = w.shape[:2]
    w2 = np.ascontiguousarray(w.transpose(2, 3, 1, 0).reshape(k * k * mo, c, 1, 1))
    ins = [m["x"], b.const(w2, f"{m['w'].name}.conv1x1")]
    if bias is not None:
        ins.append(b.const(np.tile(bias, k * k), f"{node.name}.bias.conv1x1"))
    y = b.op("Conv", ins, {"kernel_shape": [1, 1]})
    return b.op("DepthToSpace", [y], {"blocksize": k, "mode": "DCR"})


RULES = [
    Rule("ConvTranspose+bias", Op("ConvTranspose", Var("x"), Const("w"), Var("b"), name="y"), _to_conv),
    Rule("ConvTranspose", Op("ConvTranspose", Var("x"), Const("w"), name="y"), _to_conv),
]


@graph_pass("conv_transpose_to_conv")
def conv_transpose_to_conv(graph: Graph, ctx: PassContext) -> Graph:
    """Non-overlapping ConvTranspose (kernel = stride) -> 1x1 Conv + DepthToSpace."""
    ctx.tally(apply_rules(graph, RULES))
    return graph
