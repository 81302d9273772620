"""A detector head's channel groups, each padded to whole blocks (part of the layout pass).

A head conv computes G groups of K channels (YOLO: 3 anchors x 85 outputs), then its
result, through unary elementwise ops (the Sigmoid), is split N,G*K,*S -> N,G,K,*S and
transposed to put K innermost (N,G,*S,K: one row of K values per anchor and pixel). Blocked,
channel g*K + k sits in block (g*K + k) // c, lane (g*K + k) % c, so when K is not a multiple
of the block c the conversion out of the blocked layout gathers each output row from lanes
that start mid-block: per element a division, a remainder and a gathered load (YOLOv5s at
320x320: its three heads' conversions took 0.84 ms of 29 ms, one thread).

Here, before the layout rewrite, such a conv's weights and bias get zero rows so that each
group of K channels starts a block (G groups of Kp = K rounded up to the block), its split
reads N,G,Kp,*S and a Slice keeps the first K of each group: the conversion then reads
whole lane runs (group g, channel k: block g * Kp / c + k // c, lane k % c) with plain
loads. The cost is the padded channels' multiply-adds in the conv, allowed up to
GATHER_MACS per element the conversion no longer gathers.
"""

from __future__ import annotations

import numpy as np

from kiln.graph.ir import Graph, Node, Value
from kiln.graph.types import TensorType
from kiln.ops.infer import Inferencer
from kiln.passes.edit import Namer, new_const, static_shape, use_counts

# The multiply-adds a padded channel may add per element whose gather it saves. Measured, one
# thread, thread CPU time, Sapphire Rapids, YOLOv5s-style at 320x320: the conversions of its
# 40x40 and 20x20 heads took 0.86 and 0.24 ms gathering, 0.32 and 0.07 ms padded (1.3-1.7 ns
# saved per element); a 1x1 conv from 128 channels to 288 instead of 255 took 0.124 ms more
# at 40x40 (55 multiply-adds per ns): break-even ~70 per element. The 10x10 head's conversion
# (25,500 elements, 0.03 ms) saved less than its 512-channel conv's padding cost (64 per
# element), hence the margin.
GATHER_MACS = 48

# unary ops the padded channels may pass through between the conv and the split (their values
# in padded channels are sliced off, so any elementwise function of one input will do)
UNARY = {"Sigmoid", "Relu", "Tanh", "HardSigmoid", "Identity", "Exp", "Neg", "Abs", "LeakyRelu", "Elu",
         "Selu", "Softplus", "HardSwish", "Clip"}


def _padded_split(graph: Graph, node: Node, block: int, uses, consumers) -> tuple | None:
    """(chain of unary nodes, the Reshape, G, K) when conv `node`'s result is split into G
    groups of K channels (K not a multiple of `block`; N,G,K,H,W or N,G,K,H*W) and each
    group's channels are then moved innermost; else None."""
    w = node.inputs[1].const
    y = node.outputs[0]
    shape = static_shape(y)
    if shape is None or len(shape) < 3 or int(node.attrs.get("group", 1)) != 1:
        return None
    chain, v = [], y
    while True:
        readers = consumers.get(v.id, [])
        if uses[v.id] != 1 or len(readers) != 1 or any(o is v for o in graph.outputs):
            return None
        r = readers[0]
        if r.domain or r.inputs[0] is not v:
            return None
        if r.op == "Reshape":
            break
        if r.op not in UNARY or any(i is not None and i.const is None for i in r.inputs[1:]) \
                or len(r.outputs) != 1:
            return None
        chain.append(r)
        v = r.outputs[0]
    split = static_shape(r.outputs[0])
    n, c, *sp = shape
    if split is None or len(split) < 4 or split[0] != n or int(np.prod(split[3:])) != int(np.prod(sp)):
        return None
    g, k = split[1], split[2]
    if g < 2 or g * k != c or k % block == 0 or w.shape[0] != c:
        return None
    out = r.outputs[0]
    readers = consumers.get(out.id, [])
    if not readers or any(o is out for o in graph.outputs) or any(
            t.op != "Transpose" or t.domain or [int(p) for p in t.attrs.get("perm", ())][-1:] != [2]
            for t in readers):
        return None
    kp = -(-k // block) * block
    extra = g * kp - -(-c // block) * block       # channels the conv computes in addition
    if extra * int(np.prod(w.shape[1:])) > GATHER_MACS * c:
        return None
    return chain, r, g, k


def align_channel_groups(graph: Graph, convs: dict[int, dict], block: int) -> int:
    """Pad the channel groups of the blocked (in `convs`), non-Winograd convs whose results
    are split and moved channels-last (see the module doc); returns how many were padded."""
    uses, consumers = use_counts(graph), graph.consumers()
    namer, inf = Namer(graph), Inferencer(graph.opsets)
    done = 0
    for node in list(graph.nodes):
        attrs = convs.get(id(node))
        if attrs is None or attrs.get("winograd") or attrs.get("depthwise") or "groups" in attrs:
            continue
        found = _padded_split(graph, node, block, uses, consumers)
        if found is None:
            continue
        chain, r, g, k = found
        kp = -(-k // block) * block
        w = node.inputs[1].const
        rows = (np.arange(g)[:, None] * kp + np.arange(k)[None, :]).reshape(-1)   # old channel -> new
        wp = np.zeros((g * kp, *w.shape[1:]), w.dtype)
        wp[rows] = w
        ins = list(node.inputs)
        ins[1] = new_const(namer, f"{ins[1].name}.groups{kp}", wp)
        if len(ins) > 2 and ins[2] is not None:
            bp = np.zeros(g * kp, ins[2].const.dtype)
            bp[rows] = ins[2].const
            ins[2] = new_const(namer, f"{ins[2].name}.groups{kp}", bp)
        node.inputs = ins
        for m in [node, *chain]:           # the same values, g * kp channels wide now
            t = m.outputs[0].type
            m.outputs[0].type = TensorType(t.dtype, (t.shape[0], g * kp, *t.shape[2:]))
        out = r.outputs[0]
        n, _, _, *rest = static_shape(out)
        wide = Value(namer.fresh(f"{out.name}.groups{kp}"), None)
        shp = new_const(namer, f"{out.name}.groups{kp}.shape", np.array([n, g, kp, *rest], np.int64))
        r.inputs = [r.inputs[0], shp]
        r.outputs = [wide]
        inf.infer_node(r)
        bounds = (("starts", 0), ("ends", k), ("axes", 2))
        if graph.opset("") >= 10:
            sl = Node("Slice", [wide, *(new_const(namer, f"{out.name}.{what}", np.array([x], np.int64))
                                        for what, x in bounds)], [out], {}, namer.fresh(f"{r.name}.groups"))
        else:
            sl = Node("Slice", [wide], [out], {what: [x] for what, x in bounds}, namer.fresh(f"{r.name}.groups"))
        graph.nodes.insert(graph.nodes.index(r) + 1, sl)
        done += 1
    return done
