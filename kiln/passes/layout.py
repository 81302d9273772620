"""Layout transformation: convolutions with constant weights run on a blocked NCHW[c]c layout.

Why: in NCHW a convolution vectorizes over output pixels, and every output
channel rereads the input; pointwise and depthwise convolutions on small planes
(MobileNet) then waste most of each vector on tails and shuffles. Blocking the
channels (N,C,H,W -> N,C/c,H,W,c with c = the vector width, as TVM's
AlterOpLayout/conv2d_NCHWc and oneDNN do) lets a convolution broadcast one
input element into a whole vector of output channels, with weights packed once
at compile time so those channel vectors are contiguous (see kiln.ops.layout).

The rewrite, in one walk over the nodes in order:

- a `Conv` whose weights (and bias) are constants, 1-D or 2-D, float32, dense
  (group 1), depthwise (group = channels) or grouped with channels per group that are
  whole blocks or divisors of one (kiln.ops.layout.block_groups), and whose channel counts fill the
  blocks well (`worth_blocking`: padding the channels up to whole blocks adds at
  most a third) — except that a dense conv with fewer input channels than a
  block (the 3-channel stem) reads its input as one block of all of them
  (N,1,H,W,C: channels-last, `narrow_input`) — and, by default, only where
  measured to help (`SELECTIVE`: 1x1, depthwise, grouped, such a stem, strided or 1-D,
  next to another such conv through layout-agnostic ops, after a residual Add of
  blocked operands, or before a global average pool) — becomes
  `kiln::ConvNCHWc` with its weights and bias packed here (numpy) as new
  constants. A 1-D conv (N,C,L) runs as the 2-D one of N,C,1,L with a 1xK
  window: its values' twins are N,C/c,1,L,c, converted through free Reshapes;
- a 3x3 stride-1 `Conv` for which kiln.lower.conv_algo chooses Winograd becomes
  `kiln::ConvWinograd` (kiln.ops.winograd) with its weights transformed here, on the
  same blocked layout (a Relu that is its only reader runs in its output transform);
  a 1-D one (3 taps at stride 1, dilated or not; or strided) likewise `kiln::ConvWinograd1D`
  (kiln.ops.winograd1d), on the 1-D blocked layout N,C/c,1,L,c;
  the chooser's choice and reason for every conv are the pass's findings (`model.report`);
- a layout-agnostic elementwise op (Relu, Clip, Add of two same-shape tensors,
  ...) that reads a blocked value runs on the blocked values instead when every
  other computed operand has a blocked twin too; a per-channel (1,C,1,1) or
  scalar constant operand is blocked (or kept) here;
- a 1-D or 2-D MaxPool (no Indices, no ceil_mode) that reads a blocked value becomes
  `kiln::MaxPoolNCHWc` (ResNet's stem -> ReLU -> MaxPool runs blocked, its
  result converted to NCHW once, at a quarter of the stem output's size; YOLO's
  SPPF pools stay blocked between its convs);
- a global average over the plane (GlobalAveragePool, or a ReduceMean taking
  N,C,H,W to N,C,1,1, or to N,C over axes 2, 3) of a blocked value becomes `kiln::GlobalAveragePoolNCHWc`,
  and an elementwise op may read a computed per-image, per-channel operand
  (N,C,1,1) through its blocked twin (N,C/c,1,1,c, broadcast): so a
  squeeze-excite block (pool -> 1x1 -> act -> 1x1 -> gate -> scale) stays
  blocked. Its 1x1 convs on a 1x1 plane are blocked whatever their channel
  padding (a matrix-vector product: the padding costs nothing measurable);
- such a per-channel scale Mul(x, s) whose only reader is a blocked conv is not
  a kernel of its own: the conv takes s as its `scale` input and scales its
  weights per image and input channel (W * s is N x the weights' size, x * s
  would be a pass over the whole activation);
- a Concat along the channels of blocked values whose channel counts are whole
  blocks concatenates their twins (CSP blocks, SPPF, FPN/PAN necks), and a
  nearest-neighbour Resize of a blocked value (constant scales or sizes, batch
  and channels kept) resizes its twin with scale 1 on the block axis; a DCR DepthToSpace
  whose channel groups are whole blocks (a U-Net's up-convolution, kiln.passes.conv_transpose)
  moves the twin's channel vectors, when its result is read blocked;
- a value needed in NCHW (by any other op, or as a graph output) gets one
  `kiln::FromNCHWc` right before its first such reader, producing the very same
  Value; an NCHW value read by a blocked op gets one `kiln::ToNCHWc`. Each
  conversion is made once per value and a value converted one way is never
  converted back (the blocked twin is reused), so back-to-back to/from pairs
  never appear. Graph inputs and outputs stay NCHW.

Padding channels hold zeros and the ops allowed to run blocked keep them finite,
and the packed weights of a consumer are zero there, so results are unchanged.
The block is the target's vector lanes for float32 (`default_block(target)`: 16 with
AVX-512, 8 with AVX2; the pass reads the `Target` it is handed, never the host);
`KILN_NCHWC=0` turns the pass off, `KILN_NCHWC=8` forces a block of 8 (tests
call `transform(graph, block)`).
"""

from __future__ import annotations

import os

import numpy as np

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.graph.ir import Graph, Node, Value
from kiln.lower.conv_algo import Choice, ConvChoice, ConvShape, asked, choose, winograd_1d_m
from kiln.ops.infer import Inferencer
from kiln.ops.layout import (DOMAIN, block_groups, pack_bias, pack_conv_weight, pack_grouped_weight,
                             pack_rotated_weight, to_blocked)
from kiln.ops.winograd import transform_weight
from kiln.ops.winograd1d import transform_weight_1d
from kiln.ops.nn import window
from kiln.ops.registry import NodeCtx
from kiln.passes.edit import Namer, images, new_const, reads, use_counts
from kiln.passes.edit import per_image_shape as static_shape   # (a symbolic batch allowed)
from kiln.passes.registry import PassContext, graph_pass
from kiln.targets.target import Target

# elementwise ops that give the same result whatever the layout, and keep the padding
# channels' zeros finite (so a consumer's zero weights keep ignoring them)
UNARY = {"Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Swish", "Gelu", "Tanh", "Identity"}
BINARY = {"Add", "Sub", "Mul", "Max", "Min", "Sum"}
MAX_PAD_RATIO = 4 / 3   # padded channels / real channels at most this (24 -> 32 is fine; 3 -> 16 not)


def default_block(target: Target) -> int:
    """The block for float32: the target's vector lanes; KILN_NCHWC overrides (0: off)."""
    env = os.environ.get("KILN_NCHWC", "").strip()
    if env:
        return int(env)
    return target.vector_lanes(DType.float32.itemsize)


def worth_blocking(channels: int, block: int) -> bool:
    """Whether `channels` fill blocks of `block` well enough (little zero padding)."""
    padded = -(-channels // block) * block
    return padded <= MAX_PAD_RATIO * channels


def planar(shape: tuple) -> tuple:
    """A 1-D (N,C,L) shape as the 2-D one it runs blocked as, (N,C,1,L); others unchanged."""
    return tuple(shape[:2]) + (1,) + tuple(shape[2:]) if len(shape) == 3 else tuple(shape)


def _window_attrs(node: Node, opset: int, xshape, kernel) -> dict | None:
    """Explicit 2-D window attributes of a 1-D or 2-D Conv/MaxPool (a 1-D window as a 1xK one,
    its row untouched), or None when the window is invalid."""
    try:
        win = window(NodeCtx(node, opset), list(xshape[2:]), [int(k) for k in kernel])
    except KilnError:
        return None
    one = len(xshape) == 3      # the row of a 1-D window: kernel 1, stride 1, no pads
    return {"kernel_shape": [1] * one + list(win.kernel), "strides": [1] * one + list(win.strides),
            "pads": [0] * one + [int(p) for p in win.begin] + [0] * one + [int(p) for p in win.end],
            "dilations": [1] * one + list(win.dilations)}


def one_pixel(shape) -> bool:
    """A plane of one pixel (N,C,1,1): a conv on it is a matrix-vector product per image."""
    return shape is not None and len(shape) == 4 and shape[2] == shape[3] == 1


def blockable_conv(node: Node, opset: int, block: int) -> dict | None:
    """The ConvNCHWc attributes for `node`, or None when it stays NCHW (see the module doc)."""
    if node.op != "Conv" or node.domain or len(node.inputs) not in (2, 3) or len(node.outputs) != 1:
        return None
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    xs = static_shape(x)
    if (xs is None or len(xs) not in (3, 4) or x.type.dtype is not DType.float32 or w is None
            or w.const is None or w.const.ndim != len(xs) or w.const.dtype != np.float32
            or (b is not None and b.const is None) or node.outputs[0] is None):
        return None
    group = int(node.attrs.get("group", 1))
    oc, c = w.const.shape[0], xs[1]
    depthwise = group > 1 and group == c == oc and w.const.shape[1] == 1
    groups = 1 if group == 1 or depthwise else block_groups(c, oc, group, block)
    if groups is None or w.const.shape[1] * group != c:
        return None
    if not one_pixel(xs) and (not worth_blocking(oc, block) or not (
            worth_blocking(c, block) or (groups == 1 and narrow_input(c, block, depthwise)))):
        return None
    attrs = _window_attrs(node, opset, xs, node.attrs.get("kernel_shape", w.const.shape[2:]))
    if attrs is None:
        return None
    if group > 1 and not depthwise and rotated(c, oc, group, block):
        return {**attrs, "depthwise": 1, "rotate": c // group}
    return {**attrs, "depthwise": int(depthwise), **({"groups": groups} if group > 1 and not depthwise else {})}


def rotated(c: int, oc: int, group: int, block: int) -> bool:
    """A grouped conv of r < block channels per group in and out, r dividing the block: it runs
    as a depthwise conv over r lane rotations (kiln.ops.layout, ConvNCHWc's `rotate`): r
    multiply-adds per output and tap (and r - 1 shuffles), where block-diagonal weights over
    whole blocks would take block / r times as many."""
    r = c // group
    return r == oc // group and 1 < r < block and block % r == 0


def narrow_input(channels: int, block: int, depthwise: bool = False) -> bool:
    """A dense conv with fewer input channels than a block reads its input in one block of all
    of them (N,1,H,W,C: channels-last) instead of zero padding them up to a block."""
    return not depthwise and channels < block and not worth_blocking(channels, block)


def input_block(node: Node, attrs: dict, block: int) -> int:
    """The channel block a blockable conv reads its input in."""
    c = node.inputs[1].const.shape[1]
    narrow = "groups" not in attrs and narrow_input(c, block, bool(attrs["depthwise"])) \
        and not one_pixel(static_shape(node.inputs[0]))
    return c if narrow else block


def blockable_pool(node: Node, opset: int) -> dict | None:
    """The MaxPoolNCHWc attributes for a 1-D or 2-D float32 MaxPool (no Indices, no ceil_mode), or None."""
    if node.op != "MaxPool" or node.domain or len(node.inputs) != 1 or not node.outputs or node.outputs[0] is None:
        return None
    if any(v is not None for v in node.outputs[1:]) or int(node.attrs.get("ceil_mode", 0)):
        return None
    xs = static_shape(node.inputs[0])
    if (xs is None or len(xs) not in (3, 4) or node.inputs[0].type.dtype is not DType.float32
            or "kernel_shape" not in node.attrs):
        return None
    return _window_attrs(node, opset, xs, node.attrs["kernel_shape"])


def global_average(node: Node) -> bool:
    """A float32 mean over the whole plane of N,C,H,W: GlobalAveragePool, or a ReduceMean whose
    result is N,C,1,1 (whatever its axes: a mean over a size-1 axis is the value itself), or
    N,C from axes (2, 3) without keepdims (a classifier head's `x.mean((2, 3))`: its result is
    then the pooled twin converted and reshaped, not the whole plane converted back to NCHW
    and reduced there)."""
    if node.domain or node.op not in ("GlobalAveragePool", "ReduceMean") or len(node.outputs) != 1 \
            or node.outputs[0] is None or node.inputs[0] is None:
        return False
    xs, ys = static_shape(node.inputs[0]), static_shape(node.outputs[0])
    if xs is None or ys is None or len(xs) != 4 or node.inputs[0].type.dtype is not DType.float32:
        return False
    return ys == (*xs[:2], 1, 1) or (ys == xs[:2] and _reduced_axes(node) == {2, 3})


def _reduced_axes(node: Node) -> set[int] | None:
    """The axes a ReduceMean of a 4-D value reduces, when its attribute or constant input says."""
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None and node.inputs[1].const is not None:
        axes = node.inputs[1].const.reshape(-1).tolist()
    return None if axes is None else {int(a) % 4 for a in axes}


def per_channel(shape, out) -> bool:
    """`shape` (N,C,1,1) broadcasts per image and channel over `out` (N,C,H,W)."""
    return shape is not None and len(shape) == 4 and shape[:2] == out[:2] and shape[2:] == (1, 1)


def depth_to_space_blocks(node: Node, block: int) -> bool:
    """A DCR DepthToSpace of a static 4-D float32 value whose channel groups (C / k^2, one
    per output position in a k x k square) are whole blocks: it can run on the blocked twin."""
    if node.op != "DepthToSpace" or node.domain or len(node.outputs) != 1 or node.outputs[0] is None \
            or not node.inputs or node.inputs[0] is None:
        return False
    mode = node.attrs.get("mode", "DCR")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    xs, k = static_shape(node.inputs[0]), int(node.attrs.get("blocksize", 0))
    return (mode == "DCR" and k >= 1 and xs is not None and len(xs) == 4
            and node.inputs[0].type.dtype is DType.float32 and xs[1] % (k * k * block) == 0)


class _Rewriter:
    def __init__(self, graph: Graph, block: int, convs: dict[int, dict]):
        self.graph, self.block, self.convs = graph, block, convs
        self.namer = Namer(graph)
        self.inf = Inferencer(graph.opsets)
        self.blocked: dict[int, Value] = {}   # NCHW value id -> its blocked twin
        self.narrow: dict[int, Value] = {}    # NCHW value id -> its twin in one block of all channels
        self.pending: dict[int, Value] = {}   # NCHW values whose producer now makes only the twin
        self.nodes: list[Node] = []
        self.skip: set[int] = set()           # nodes folded into a kernel already emitted
        self.fired = {"Conv": 0, "Winograd": 0, "elementwise": 0, "MaxPool": 0, "GlobalAveragePool": 0,
                      "scale": 0, "Concat": 0, "Resize": 0, "DepthToSpace": 0, "ToNCHWc": 0, "FromNCHWc": 0}
        self.opset = graph.opset("")
        self.consumers = graph.consumers()
        self.uses = use_counts(graph)       # reads at any depth, graph outputs included
        self.scaled: dict[int, tuple[Value, Value]] = {}   # Mul output id -> (blocked x, blocked scale)

    def emit(self, op: str, inputs: list, outputs: list[Value], attrs: dict, name: str,
             domain: str = "") -> Node:
        node = Node(op, inputs, outputs, attrs, name, domain)
        if any(v.type is None for v in outputs):
            self.inf.infer_node(node)
        self.nodes.append(node)
        return node

    def twin_value(self, v: Value) -> Value:
        return Value(self.namer.fresh(f"{v.name}.nchwc"), None)

    def reshape(self, v: Value, shape: tuple, out: Value | None = None) -> Value:
        """v viewed as `shape` (a Reshape: no copy), into `out` (default: a fresh value)."""
        out = out or Value(self.namer.fresh(f"{v.name}.2d"), None)
        # (a symbolic batch is copied from the input: Reshape's 0)
        shp = new_const(self.namer, f"{v.name}.shape", np.array([d if isinstance(d, int) else 0 for d in shape],
                                                                 np.int64))
        self.emit("Reshape", [v, shp], [out], {}, self.namer.fresh(f"{v.name}.reshape"))
        return out

    def convert_in(self, v: Value, block: int, suffix: str) -> Value:
        """ToNCHWc of computed NCHW value v (a 1-D N,C,L value as N,C,1,L first)."""
        shape = static_shape(v)
        src = self.reshape(v, planar(shape)) if len(shape) == 3 else v
        vb = Value(self.namer.fresh(f"{v.name}.{suffix}"), None)
        self.emit("ToNCHWc", [src], [vb], {"block": block}, self.namer.fresh(f"{v.name}.to_{suffix}"), DOMAIN)
        self.fired["ToNCHWc"] += 1
        return vb

    def to_blocked(self, v: Value) -> Value:
        """v's blocked twin, converting (once) if there is none yet."""
        if v.id in self.blocked:
            return self.blocked[v.id]
        if v.const is not None:
            vb = new_const(self.namer, f"{v.name}.nchwc", to_blocked(v.const.reshape(planar(v.const.shape)),
                                                                     self.block))
        else:
            vb = self.convert_in(v, self.block, "nchwc")
        self.blocked[v.id] = vb
        return vb

    def to_narrow(self, v: Value, block: int) -> Value:
        """v (C < block channels) as one block of all C (channels-last), converting once; read
        only by convs (an elementwise op with this twin would give a differently shaped value)."""
        if v.id in self.narrow:
            return self.narrow[v.id]
        self.need_nchw(v)
        if v.const is not None:
            vb = new_const(self.namer, f"{v.name}.nchw{block}c",
                           to_blocked(v.const.reshape(planar(v.const.shape)), block))
        else:
            vb = self.convert_in(v, block, f"nchw{block}c")
        self.narrow[v.id] = vb
        return vb

    def need_nchw(self, v: Value) -> None:
        """v is read in NCHW: make it from its twin (once) if its producer was rewritten."""
        if v is not None and v.id in self.pending:
            del self.pending[v.id]
            shape = static_shape(v)
            out = v if len(shape) == 4 else Value(self.namer.fresh(f"{v.name}.2d"), None)
            self.emit("FromNCHWc", [self.blocked[v.id]], [out], {"channels": int(shape[1])},
                      self.namer.fresh(f"{v.name}.from_nchwc"), DOMAIN)
            if out is not v:
                self.reshape(out, shape, v)
            self.fired["FromNCHWc"] += 1

    def produce_blocked(self, old: Value, new: Value) -> None:
        self.blocked[old.id] = new
        self.pending[old.id] = old

    def conv(self, node: Node, attrs: dict) -> None:
        w = node.inputs[1].const
        w = w.reshape(planar(w.shape))
        b = node.inputs[2].const if len(node.inputs) > 2 and node.inputs[2] is not None else None
        if attrs.get("winograd"):
            self.winograd(node, attrs, w, b)
            return
        dw = bool(attrs["depthwise"])
        ib = input_block(node, attrs, self.block)
        packed = pack_rotated_weight(w, self.block) if "rotate" in attrs \
            else pack_grouped_weight(w, int(node.attrs["group"]), self.block) if "groups" in attrs \
            else pack_conv_weight(w, self.block, dw, ib)
        wp = new_const(self.namer, f"{node.inputs[1].name}.nchwc{self.block}", packed)
        scale = None
        if node.inputs[0].id in self.scaled:
            x, scale = self.scaled.pop(node.inputs[0].id)
        else:
            x = self.to_blocked(node.inputs[0]) if ib == self.block else self.to_narrow(node.inputs[0], ib)
        ins = [x, wp]
        if b is not None:
            ins.append(new_const(self.namer, f"{node.name}.bias.nchwc{self.block}",
                                 pack_bias(b, w.shape[0], self.block, w.dtype)))
        if scale is not None:
            ins += [None] * (3 - len(ins)) + [scale]
        y = node.outputs[0]
        yb = self.twin_value(y)
        self.emit("ConvNCHWc", ins, [yb], attrs, node.name, DOMAIN)
        self.produce_blocked(y, yb)
        self.fired["Conv"] += 1

    def winograd(self, node: Node, attrs: dict, w, b) -> None:
        """The conv as kiln::ConvWinograd (2-D) or kiln::ConvWinograd1D, its weights transformed
        here (kiln.ops.winograd, kiln.ops.winograd1d)."""
        if len(static_shape(node.inputs[0])) == 3:
            n, _, ow = static_shape(node.outputs[0])
            k, st, d = attrs["kernel_shape"][1], attrs["strides"][1], attrs["dilations"][1]
            m = winograd_1d_m(images(n), ow, d, -(-k // st))
            u = transform_weight_1d(w, self.block, m, st)
            op, kind = "ConvWinograd1D", {"m": m, "pads": [attrs["pads"][1], attrs["pads"][3]], "dilation": d,
                                          "stride": st, "kernel": k}
        else:
            u = transform_weight(w, self.block)
            op, kind = "ConvWinograd", {"m": 4, "pads": list(attrs["pads"])}
        u = new_const(self.namer, f"{node.inputs[1].name}.winograd{self.block}", u)
        ins = [self.to_blocked(node.inputs[0]), u]
        if b is not None:
            ins.append(new_const(self.namer, f"{node.name}.bias.nchwc{self.block}",
                                 pack_bias(b, w.shape[0], self.block, w.dtype)))
        y = node.outputs[0]
        # a Relu that is the conv's only reader runs in the kernel's output transform
        readers = self.consumers.get(y.id, [])
        relu = readers[0] if (self.uses[y.id] == 1 and len(readers) == 1 and readers[0].op == "Relu"
                              and not readers[0].domain) else None
        yb = self.twin_value(y)
        self.emit(op, ins, [yb], {**kind, "relu": int(relu is not None)}, node.name, DOMAIN)
        if relu is not None:
            self.skip.add(id(relu))
            y = relu.outputs[0]
        self.produce_blocked(y, yb)
        self.fired["Winograd"] += 1

    def operands(self, node: Node) -> list | None:
        """How each input of an elementwise node would run blocked: 'blocked' (same shape
        as the output), 'keep' (a scalar constant), 'pack' (a per-channel constant); None
        when the node must stay NCHW."""
        if node.domain or len(node.outputs) != 1 or node.outputs[0] is None:
            return None
        if node.op not in UNARY and node.op not in BINARY:
            return None
        out = static_shape(node.outputs[0])
        if out is None or len(out) not in (3, 4) or not any(v is not None and v.id in self.blocked
                                                            for v in node.inputs):
            return None
        kinds = []
        for i, v in enumerate(node.inputs):
            s = None if v is None else static_shape(v)
            if v is None:
                kinds.append(None)
            elif s == out and (v.id in self.blocked or v.const is not None or node.op in UNARY):
                # (a computed operand with no blocked twin keeps the op NCHW: converting it
                # in, and the result back out, costs more than the op)
                kinds.append("blocked")
            elif v.const is None and v.id in self.blocked and per_channel(s, out):
                kinds.append("blocked")         # its twin N,C/c,1,1,c broadcasts
            elif v.const is not None and v.const.size == 1:
                kinds.append("keep")
            elif (v.const is not None and node.op in BINARY and s is not None and len(s) == len(out)
                  and s[0] == 1 and s[1] == out[1] and all(d == 1 for d in s[2:])):
                kinds.append("pack")
            else:
                return None
        return kinds

    def elementwise(self, node: Node, kinds: list) -> None:
        ins = [v if k in (None, "keep") else self.to_blocked(v) for v, k in zip(node.inputs, kinds)]
        y = node.outputs[0]
        yb = self.twin_value(y)
        self.emit(node.op, ins, [yb], dict(node.attrs), node.name, node.domain)
        self.produce_blocked(y, yb)
        self.fired["elementwise"] += 1

    def fold_scale(self, node: Node, kinds: list) -> bool:
        """Mul(x, s), s per channel, read only by a blocked conv that reads x in full blocks:
        record it for the conv to take s as its scale input (see the module doc)."""
        if node.op != "Mul" or len(node.inputs) != 2 or kinds != ["blocked", "blocked"]:
            return False
        y = node.outputs[0]
        out = static_shape(y)
        shapes = [static_shape(v) for v in node.inputs]
        if shapes[0] == out and per_channel(shapes[1], out):
            x, s = node.inputs
        elif shapes[1] == out and per_channel(shapes[0], out):
            s, x = node.inputs
        else:
            return False
        readers = self.consumers.get(y.id, [])
        if self.uses[y.id] != 1 or len(readers) != 1 or id(readers[0]) not in self.convs \
                or self.convs[id(readers[0])].get("winograd") \
                or readers[0].inputs[0] is not y or any(v is y for v in readers[0].inputs[1:]) \
                or input_block(readers[0], self.convs[id(readers[0])], self.block) != self.block:
            return False
        self.scaled[y.id] = (self.to_blocked(x), self.to_blocked(s))
        self.fired["scale"] += 1
        return True

    def concat(self, node: Node) -> bool:
        """A Concat along the channels of blocked values whose channels fill whole blocks is a
        Concat of their blocked twins along the block axis (no padding channels in between)."""
        if node.op != "Concat" or node.domain or len(node.outputs) != 1 or not node.inputs:
            return False
        shapes = [None if v is None else static_shape(v) for v in node.inputs]
        if any(s is None or len(s) not in (3, 4) or s[1] % self.block for s in shapes) \
                or int(node.attrs.get("axis", 0)) not in (1, 1 - len(shapes[0])) \
                or not all(v.id in self.blocked for v in node.inputs):
            return False
        y = node.outputs[0]
        yb = self.twin_value(y)
        self.emit("Concat", [self.blocked[v.id] for v in node.inputs], [yb], {"axis": 1}, node.name)
        self.produce_blocked(y, yb)
        self.fired["Concat"] += 1
        return True

    def read_blocked(self, v: Value) -> bool:
        """Whether v (through unary elementwise ops) reaches a blocked conv or a channel Concat:
        a movement of v's twin pays only when its result stays blocked (else the conversion
        just moves after it, and does the movement's index arithmetic too: DBNet's head)."""
        todo, seen = [v], set()
        while todo:
            u = todo.pop()
            for c in self.consumers.get(u.id, []):
                if id(c) in seen:
                    continue
                seen.add(id(c))
                if id(c) in self.convs or (c.op == "Concat" and not c.domain):
                    return True
                if c.op in UNARY and not c.domain and c.outputs and c.outputs[0] is not None:
                    todo.append(c.outputs[0])
        return False

    def depth_to_space(self, node: Node) -> bool:
        """A DCR DepthToSpace (block k) of a blocked value whose k*k channel groups are whole
        blocks moves whole channel vectors: on the twin N,(k*k*CB'),H,W,c it is Reshape to
        N,k,k,CB',H,W,c, Transpose to N,CB',H,k,W,k,c and Reshape to N,CB',H*k,W*k,c (a U-Net's
        up-convolution, kiln.passes.conv_transpose, stays blocked into its skip Concat), when
        its result is read blocked (`read_blocked`)."""
        if not depth_to_space_blocks(node, self.block) or node.inputs[0].id not in self.blocked \
                or not self.read_blocked(node.outputs[0]):
            return False
        k = int(node.attrs["blocksize"])
        xb = self.blocked[node.inputs[0].id]
        _, cb, h, w, c = xb.type.shape
        y = node.outputs[0]
        split = self.reshape(xb, (0, k, k, cb // (k * k), h, w, c))
        moved = Value(self.namer.fresh(f"{y.name}.moved"), None)
        self.emit("Transpose", [split], [moved], {"perm": [0, 3, 4, 1, 5, 2, 6]}, self.namer.fresh(f"{node.name}.nchwc"))
        yb = self.twin_value(y)
        self.reshape(moved, (0, cb // (k * k), h * k, w * k, c), yb)
        self.produce_blocked(y, yb)
        self.fired["DepthToSpace"] += 1
        return True

    def resize(self, node: Node) -> bool:
        """A nearest-neighbour Resize (opset 11+, constant scales or sizes, batch and channels
        kept) of a blocked value resizes its blocked twin: the block axis gets scale 1, which
        every coordinate transformation maps to itself."""
        ins = node.inputs
        if (node.op != "Resize" or node.domain or self.opset < 11 or len(node.outputs) != 1
                or not ins or ins[0] is None or ins[0].id not in self.blocked or len(ins) > 4):
            return False
        def s(name, default):
            v = node.attrs.get(name, default)
            return v.decode() if isinstance(v, bytes) else str(v)
        if (s("mode", "nearest") != "nearest" or s("coordinate_transformation_mode", "") == "tf_crop_and_resize"
                or "axes" in node.attrs or s("keep_aspect_ratio_policy", "stretch") != "stretch"):
            return False
        xs, ys = static_shape(ins[0]), static_shape(node.outputs[0])
        scales, sizes = (ins[i] if len(ins) > i else None for i in (2, 3))
        scales = None if scales is None or scales.const is None or scales.const.size == 0 else scales.const
        sizes = None if sizes is None or sizes.const is None or sizes.const.size == 0 else sizes.const
        if xs is None or ys is None or len(xs) not in (3, 4) or ys[:2] != xs[:2] or (scales is None) == (sizes is None):
            return False
        xb = self.blocked[ins[0].id]
        if scales is not None:
            if scales.size != len(xs) or np.any(scales.ravel()[:2] != 1):
                return False
            scales = np.array(planar(tuple(scales.ravel().tolist())) + (1.0,), scales.dtype)
            new = [xb, None, new_const(self.namer, f"{node.name}.scales.nchwc", scales)]
        else:
            if not isinstance(xb.type.shape[0], int):
                return False      # (the sizes would name the batch)
            sizes = np.array(planar(tuple(sizes.ravel().tolist()))[2:], np.int64)
            full = np.array([xb.type.shape[0], xb.type.shape[1], *sizes, xb.type.shape[-1]], np.int64)
            new = [xb, None, None, new_const(self.namer, f"{node.name}.sizes.nchwc", full)]
        y = node.outputs[0]
        yb = self.twin_value(y)
        self.emit("Resize", new, [yb], dict(node.attrs), node.name)
        self.produce_blocked(y, yb)
        self.fired["Resize"] += 1
        return True

    def run(self) -> None:
        for node in self.graph.nodes:
            if id(node) in self.skip:
                continue
            attrs = self.convs.get(id(node))
            if attrs is not None:
                self.conv(node, attrs)
                continue
            pool = blockable_pool(node, self.opset) if node.inputs and node.inputs[0] is not None \
                and node.inputs[0].id in self.blocked else None
            if pool is not None:
                y = node.outputs[0]
                yb = self.twin_value(y)
                self.emit("MaxPoolNCHWc", [self.blocked[node.inputs[0].id]], [yb], pool, node.name, DOMAIN)
                self.produce_blocked(y, yb)
                self.fired["MaxPool"] += 1
                continue
            if global_average(node) and node.inputs[0].id in self.blocked:
                y = node.outputs[0]
                yb = self.twin_value(y)
                self.emit("GlobalAveragePoolNCHWc", [self.blocked[node.inputs[0].id]], [yb], {}, node.name,
                          DOMAIN)
                self.produce_blocked(y, yb)
                self.fired["GlobalAveragePool"] += 1
                continue
            kinds = self.operands(node)
            if kinds is not None and self.fold_scale(node, kinds):
                continue
            if kinds is not None:
                self.elementwise(node, kinds)
                continue
            if self.concat(node) or self.resize(node) or self.depth_to_space(node):
                continue
            for v in reads(node):
                self.need_nchw(v)
            self.nodes.append(node)
        for v in self.graph.outputs:
            self.need_nchw(v)
        self.graph.nodes = self.nodes


# Only where it measurably helps (2 cores, AVX-512, interleaved medians): blocked pointwise
# convs run 1.2-1.9x and depthwise 2-3x faster than kiln's NCHW kernels, dense KxK convs
# about the same (resnet18 at -O3: 25.6 ms NCHW vs 26.6 ms all blocked), and a conv whose
# input and output both need converting gains less than the conversions cost. Strided and
# 1-D convs run faster blocked (benchmarks/conv_bench.py --clock cpu, one thread, load ~9:
# 3x3 stride-2 convs of a 320x320 detector 1.05-1.31x; 1-D convs of an audio net 1.0-1.3x,
# a one-channel strided stem 10x, its whole net 9.9 -> 7.4 ms). So by
# default only 1x1 and depthwise convs that have a blocked neighbour (through unary
# elementwise ops) are rewritten: MobileNet's blocks, not ResNet's. SELECTIVE = False blocks every
# blockable conv (tests of the blocked kernels use it).
SELECTIVE = True


def _selected_kind(node: Node, attrs: dict, block: int) -> str | None:
    """What makes a blockable conv one the layout pass blocks next to a blocked neighbour (said
    in the chooser's reason): pointwise, depthwise, grouped, a stem conv reading few channels
    (channels-last), strided or 1-D; None for a dense KxK conv."""
    w = node.inputs[1].const
    if "rotate" in attrs:
        r = attrs["rotate"]
        return (f"grouped ({int(node.attrs['group'])} groups of {r} channels: depthwise over {r} lane "
                f"rotations, {r} FMAs and {r - 1} shuffles per output vector and tap)")
    if attrs["depthwise"]:
        return "depthwise"
    if "groups" in attrs:
        group, cin = int(node.attrs["group"]), w.shape[1]
        if cin % block == 0:
            return f"grouped ({group} groups of {cin} channels: {attrs['groups']} groups of whole blocks)"
        return (f"grouped ({group} groups of {cin} channels: {block // cin} per block of {block}, "
                f"block-diagonal weights, {block // cin}x the multiplies as full-vector FMAs)")
    if attrs["kernel_shape"] == [1, 1]:
        return "pointwise"
    if input_block(node, attrs, block) != block:
        return f"a stem reading its {w.shape[1]} channels channels-last"
    if any(s > 1 for s in attrs["strides"]):
        return "strided"
    if len(node.inputs[0].type.shape) == 3:
        return "1-D"
    return None


def why_unblockable(node: Node, opset: int, block: int) -> str:
    """Why blockable_conv refused a Conv (the chooser's reason for direct-nchw)."""
    x, w = node.inputs[0], node.inputs[1]
    xs = static_shape(x)
    if xs is None:
        return "symbolic or unknown sizes other than the batch (the blocked layout's kernels need them)"
    if len(xs) not in (3, 4):
        return f"{len(xs) - 2}-D (the blocked layout is for 1-D and 2-D convs)"
    if x.type.dtype is not DType.float32:
        return f"{x.type.dtype.name} (the blocked layout is float32)"
    if w.const is None or (len(node.inputs) > 2 and node.inputs[2] is not None and node.inputs[2].const is None):
        return "computed weights or bias (the blocked layout packs them at compile time)"
    group, oc, c = int(node.attrs.get("group", 1)), w.const.shape[0], xs[1]
    if group > 1 and not (group == c == oc and w.const.shape[1] == 1) \
            and block_groups(c, oc, group, block) is None:
        return (f"grouped ({group} groups of {c // group} -> {oc // group} channels: neither whole blocks of "
                f"{block} nor equal divisors of one)")
    if not worth_blocking(oc, block) or not worth_blocking(c, block):
        return f"{c} -> {oc} channels fill blocks of {block} badly (over {MAX_PAD_RATIO:.2f}x padding)"
    return "an invalid window"


def _layout_agnostic(node: Node, opset: int) -> bool:
    """A node a path between blocked convs may run through blocked with no conversion: a unary
    elementwise op, a MaxPool, a Concat along channels or a nearest Resize (a binary op would
    need its other input blocked too)."""
    if node.domain:
        return False
    if node.op in UNARY or blockable_pool(node, opset) is not None or depth_to_space_blocks(node, 1):
        return True
    mode = node.attrs.get("mode", "nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    return (node.op == "Concat" and int(node.attrs.get("axis", 0)) == 1) or (node.op == "Resize" and mode == "nearest")


def conv_shape(node: Node, opset: int, block: int, attrs: dict | None) -> ConvShape | None:
    """What the algorithm chooser reads of a 1-D or 2-D float Conv with static sizes (None otherwise)."""
    if node.op != "Conv" or node.domain or len(node.inputs) < 2 or node.inputs[1] is None:
        return None
    xs, ws, ys = static_shape(node.inputs[0]), static_shape(node.inputs[1]), \
        (static_shape(node.outputs[0]) if node.outputs and node.outputs[0] is not None else None)
    if xs is None or ws is None or ys is None or len(xs) not in (3, 4) or len(ys) != len(xs):
        return None
    ctx, nd = NodeCtx(node, opset), len(xs) - 2
    k = tuple(int(v) for v in node.attrs.get("kernel_shape", ws[2:]))
    kind = _selected_kind(node, attrs, block) if attrs is not None else None
    return ConvShape(images(xs[0]), xs[1], ys[1], tuple(ys[2:]), k, tuple(int(v) for v in ctx.attr("strides", [1] * nd)),
                     tuple(int(v) for v in ctx.attr("dilations", [1] * nd)), int(node.attrs.get("group", 1)),
                     attrs is not None, block, attrs is not None and input_block(node, attrs, block) != block,
                     kind is not None, kind or "", "" if attrs is not None else why_unblockable(node, opset, block),
                     not isinstance(xs[0], int))


def choose_convs(graph: Graph, block: int, target: Target | None = None, override: str | None = None,
                 selective: bool = True) -> tuple[dict[int, dict], list[ConvChoice]]:
    """id(conv node) -> its blocked attributes (with "winograd" set for a Winograd conv), for
    the convs to rewrite; and every 2-D conv's algorithm with the reason
    (kiln.lower.conv_algo.choose, then the neighbour rule below)."""
    target = Target.of(target)
    opset = graph.opset("")
    cands, choices = {}, {}
    for n in graph.nodes:
        a = blockable_conv(n, opset, block)
        shape = conv_shape(n, opset, block, a)
        if shape is None:
            continue
        c = choose(shape, target, override)
        choices[id(n)] = ConvChoice(n.name, shape, c)
        if c.algorithm == "winograd":
            cands[id(n)] = {**a, "winograd": 1}
        elif a is not None and (not selective or c.algorithm == "direct-nchwc"):
            cands[id(n)] = a
            if c.algorithm != "direct-nchwc":
                choices[id(n)] = ConvChoice(n.name, shape, Choice("direct-nchwc", f"{c.reason}; blocked all the "
                                                                  "same (the layout pass not selective)"))
    if selective:
        kept = select_convs(graph, block, cands)
        for k in set(cands) - set(kept):
            old = choices[k]
            choices[k] = ConvChoice(old.node, old.shape, Choice(
                "direct-nchw", f"{old.choice.reason}, but no blocked neighbour: the layout conversions "
                               "would cost more than blocking saves"))
        for k, a in kept.items():
            old = choices[k]
            if not a.get("winograd") and alone(a):
                choices[k] = ConvChoice(old.node, old.shape, Choice(old.choice.algorithm, (
                    f"{old.choice.reason}, {'x'.join(map(str, a['kernel_shape']))} taps: blocked whatever its "
                    f"neighbours (its conversions cost less than blocking saves)")))
        cands = kept
    return cands, [c for n in graph.nodes if (c := choices.get(id(n))) is not None]


# A depthwise conv of this many taps or more runs blocked with no blocked neighbour: ConvNeXt's
# 7x7 depthwise convs sit between Transposes to and from NHWC (LayerNorm, Linear), into which
# the conversions fuse; blocked they ran 2.3x faster (one thread, thread CPU time: 28x28x192
# 0.456 ms NCHW vs 0.197 blocked, 56x56x96 0.82 NCHW); a 3x3 one does 9 multiply-adds per
# element against the conversions' two passes, and stays with the neighbour rule.
DEPTHWISE_ALONE_TAPS = 25


def alone(attrs: dict) -> bool:
    """A conv worth blocking whatever its neighbours (DEPTHWISE_ALONE_TAPS)."""
    return bool(attrs["depthwise"]) and attrs["kernel_shape"][0] * attrs["kernel_shape"][1] >= DEPTHWISE_ALONE_TAPS


def select_convs(graph: Graph, block: int, cands: dict[int, dict]) -> dict[int, dict]:
    """The candidates that stay blocked: a Winograd conv or a large depthwise one (`alone`) always;
    another (pointwise, depthwise, grouped, strided, 1-D, a stem) next to a blocked conv through
    layout-agnostic ops (a stem: or a MaxPool),
    up through a residual Add whose every computed operand comes from a conv kept by that rule
    (so the Add runs blocked), or down into a global average pool (which then runs blocked: only
    its N,C,1,1 result converts).
    MobileNetV3's last 1x1 conv (160 -> 960 on 7x7, after a residual Add, before the pool) ran
    NCHW without those two paths: 0.29 ms against 0.16 blocked (ORT 0.17), one thread."""
    opset = graph.opset("")
    producer = {v.id: n for n in graph.nodes for v in n.outputs if v is not None}
    consumers = graph.consumers()

    def elementwise(n: Node) -> bool:
        # a path through a binary op would need its other input converted, unless that is one
        # value per channel (a squeeze-excite gate: N,C,1,1)
        if n.domain or len(n.outputs) != 1 or n.outputs[0] is None:
            return False
        if _layout_agnostic(n, opset):
            return True
        out = static_shape(n.outputs[0])
        shapes = [None if v is None else static_shape(v) for v in n.inputs]
        return (n.op == "Mul" and out is not None and len(out) == 4 and len(shapes) == 2
                and out in shapes and any(per_channel(s, out) for s in shapes))

    def ups(n: Node):
        return [producer[v.id] for v in n.inputs if v is not None and v.id in producer]

    def downs(n: Node):
        return [c for v in n.outputs if v is not None for c in consumers.get(v.id, [])]

    def residual(n: Node) -> list[Node] | None:
        """The producers of a same-shape binary op's computed operands (a residual Add), or
        None: the op runs blocked only when every one of them is blocked."""
        if n.domain or n.op not in BINARY or len(n.outputs) != 1 or n.outputs[0] is None:
            return None
        out = static_shape(n.outputs[0])
        computed = [v for v in n.inputs if v is not None and v.const is None]
        if out is None or len(computed) < 2 or any(static_shape(v) != out or v.id not in producer
                                                   for v in computed):
            return None
        return [producer[v.id] for v in computed]

    def reaches(start: Node, step, pools: bool = False, kept: dict | None = None) -> bool:
        """A candidate next to `start` through elementwise ops (a MaxPool too, for `pools`); with
        `kept` (the first round's choice), also a global average pool below, or a residual Add
        above whose every computed operand comes from a kept conv."""
        seen, todo = set(), list(step(start))
        while todo:
            n = todo.pop()
            if id(n) in seen:
                continue
            seen.add(id(n))
            if id(n) in cands or (pools and blockable_pool(n, opset) is not None):
                return True
            if kept is not None and step is downs and global_average(n):
                return True
            if elementwise(n):
                todo.extend(step(n))
            elif kept is not None and step is ups and (srcs := residual(n)) is not None \
                    and all(blocked_out(p, kept) for p in srcs):
                return True
        return False

    memo: dict[int, bool] = {}

    def blocked_out(n: Node, kept: dict) -> bool:
        """Whether `n`'s output will be blocked: a kept conv, or an elementwise op or a residual
        Add over such outputs."""
        if id(n) not in memo:
            memo[id(n)] = False     # (a DAG has no cycle; this only stops repeated walks)
            srcs = ups(n) if elementwise(n) else residual(n)
            memo[id(n)] = id(n) in kept or (srcs is not None and bool(srcs) and (
                any if elementwise(n) else all)(blocked_out(p, kept) for p in srcs))
        return memo[id(n)]

    nodes = {id(n): n for n in graph.nodes}

    def select(kept: dict | None) -> dict:
        # a stem also when a MaxPool follows (it runs blocked on the stem's blocked output: ResNet)
        return {k: a for k, a in cands.items() if a.get("winograd") or alone(a)
                or reaches(nodes[k], ups, kept=kept)
                or reaches(nodes[k], downs, pools=input_block(nodes[k], a, block) != block, kept=kept)}
    # rounds to a fixed point: a residual Add counts as blocked only when the convs making its
    # operands stay blocked by the previous round's choice (a 1x1 after an Add of NCHW paths
    # not); a chain of residual blocks needs a round per stage (ResNeXt's stride-2 1x1 of stage
    # 3 reads an Add whose identity path goes back to stage 2's, kept only in round 2)
    kept = select(None)
    for _ in range(len(cands)):     # (each round keeps more, so at most one per candidate)
        memo.clear()
        more = select(kept)
        if more.keys() == kept.keys():
            break
        kept = more
    return kept


def transform(graph: Graph, block: int, selective: bool | None = None, target: Target | None = None,
              override: str | None = None, findings: list | None = None) -> dict[str, int]:
    """Rewrite `graph` in place with blocks of `block` channels for `target` (None: the host;
    `override`: the conv algorithm asked for, see kiln.lower.conv_algo); returns what fired,
    and appends each conv's algorithm choice to `findings`."""
    if block < 2 or not any(n.op == "Conv" for n in graph.nodes):
        return {}
    convs, choices = choose_convs(graph, block, target, override, SELECTIVE if selective is None else selective)
    if findings is not None:
        findings.extend(choices)
    r = _Rewriter(graph, block, convs)
    r.run()
    if r.fired["Conv"] or r.fired["Winograd"]:
        graph.opsets.setdefault(DOMAIN, 1)
    return {k: n for k, n in r.fired.items() if n}


@graph_pass("transform_layout")
def transform_layout(graph: Graph, ctx: PassContext) -> Graph:
    """Run convolutions (and the elementwise ops between them) on the blocked NCHW[c]c layout,
    each by the algorithm kiln.lower.conv_algo chooses (listed in the pass's findings)."""
    ctx.tally(transform(graph, default_block(ctx.target), target=ctx.target,
                        override=asked(ctx.decisions), findings=ctx.findings))
    return graph
