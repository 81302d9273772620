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
  (N,1,H,W,C: channels-last, `narrow_input`; its zero padding made by that conversion
  where the conv is its only reader, `padded_narrow`), and a dense pointwise conv from
  well-filled blocks to fewer channels than a block (a head's 1x1 to a few classes) writes them
  in one zero-padded block (`narrow_output`) — and, by default, only where
  measured to help (`SELECTIVE`: 1x1, depthwise, grouped, such a stem, strided or 1-D,
  next to another such conv through layout-agnostic ops, after a residual Add of
  blocked operands, or before a global average pool) — becomes
  `kiln::ConvNCHWc` with its weights and bias packed here (numpy) as new
  constants. A 1-D conv (N,C,L) runs as the 2-D one of N,C,1,L with a 1xK
  window: its values' twins are N,C/c,1,L,c, converted through free Reshapes;
- a 3x3 stride-1 `Conv` for which kiln.lower.conv_algo chooses Winograd becomes
  `kiln::ConvWinograd` (kiln.ops.winograd) with its weights transformed here, on the
  same blocked layout (a Relu, or for a 2-D one a Swish, that is its only reader runs in its
  output transform);
  a 1-D one (3 taps at stride 1, dilated or not; or strided) likewise `kiln::ConvWinograd1D`
  (kiln.ops.winograd1d), on the 1-D blocked layout N,C/c,1,L,c;
  the chooser's choice and reason for every conv are the pass's findings (`model.report`);
- a layout-agnostic elementwise op (Relu, Clip, Add of two same-shape tensors,
  ...) that reads a blocked value runs on the blocked values instead when every
  other computed operand has a blocked twin too, or is a channels-last value moved
  to NCHW (Transpose 0,3,1,2) for it alone, its twin then one pass of whole channel
  vectors, where its result is read blocked or moved back to channels-last
  (ConvNeXt's residual stream stays blocked); a per-channel (1,C,1,1) or
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
- a Flatten of a blocked N,C,H,W value whose only reader is a MatMul/Gemm with constant
  weights (a classifier after its last pool) flattens the twin instead, the weights' rows
  permuted to the blocked order (zero rows for padding channels);
- a blocked conv whose result is split into groups of channels that are then moved innermost
  (a detector head's anchors x outputs) first gets each group padded to whole blocks
  (kiln.passes.layout_groups), so its conversion back reads whole lane runs;
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

import numpy as np

from kiln.graph.ir import Graph, Node, Value
from kiln.lower.conv_algo import asked, winograd_1d_m
from kiln.ops.infer import Inferencer
from kiln.ops.layout import DOMAIN, pack_bias, pack_conv_weight, pack_grouped_weight, pack_rotated_weight, to_blocked
from kiln.ops.winograd import deferred_weight
from kiln.ops.winograd1d import transform_weight_1d
from kiln.passes.edit import Namer, images, new_const, reads, use_counts
from kiln.passes.edit import per_image_shape as static_shape   # (a symbolic batch allowed)
from kiln.passes.layout_groups import align_channel_groups
from kiln.passes.layout_rules import (  # noqa: F401 (_window_attrs, narrow_input, worth_blocking: read here)
    BINARY, UNARY, _window_attrs, blockable_pool, choose_convs, default_block, depth_to_space_blocks,
    global_average, input_block, narrow_input, per_channel, planar, worth_blocking)
from kiln.passes.registry import PassContext, graph_pass
from kiln.targets.target import Target


def _perm(node: Node) -> list[int]:
    return [int(a) for a in node.attrs.get("perm", ())]


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
                      "scale": 0, "Concat": 0, "Resize": 0, "DepthToSpace": 0, "Flatten": 0, "ToNCHWc": 0,
                      "FromNCHWc": 0}
        self.opset = graph.opset("")
        self.consumers = graph.consumers()
        self.producers = graph.producers()
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

    def padded_narrow(self, v: Value, block: int, attrs: dict) -> tuple[Value, dict] | None:
        """A narrow conv's only input read as one block of all C with the conv's zero padding
        made by the conversion (ToNCHWc's `pads`), and the conv's attributes with no padding
        left (it then reads its input in place instead of making a padded copy of it: kiln.lower.
        nchwc), or None (a 1-D or unpadded conv, a symbolic plane, an input read elsewhere or a
        constant, or one channel: N,C,H,W,1 is a view of the input, no copy, where the padded one
        would be a copy)."""
        pads = [int(p) for p in attrs.get("pads", [])]
        shape = static_shape(v)
        if block == 1 or v.const is not None or v.id in self.narrow or self.uses[v.id] != 1 or not any(pads) \
                or shape is None or len(shape) != 4 or len(pads) != 4 \
                or not all(isinstance(d, int) for d in shape[1:]):
            return None
        self.need_nchw(v)
        vb = Value(self.namer.fresh(f"{v.name}.nchw{block}c"), None)
        self.emit("ToNCHWc", [v], [vb], {"block": block, "pads": pads},
                  self.namer.fresh(f"{v.name}.to_nchw{block}c"), DOMAIN)
        self.fired["ToNCHWc"] += 1
        return vb, {**attrs, "pads": [0] * 4}

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
        elif ib == self.block:
            x = self.to_blocked(node.inputs[0])
        elif (padded := self.padded_narrow(node.inputs[0], ib, attrs)) is not None:
            x, attrs = padded
        else:
            x = self.to_narrow(node.inputs[0], ib)
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
            m = attrs["winograd"]                 # the output tile (kiln.lower.conv_algo.winograd_m)
            u = deferred_weight(w, self.block, m)    # made where it is written (the weights blob)
            op, kind = "ConvWinograd", {"m": m, "pads": list(attrs["pads"])}
        u = new_const(self.namer, f"{node.inputs[1].name}.winograd{self.block}", u)
        ins = [self.to_blocked(node.inputs[0]), u]
        if b is not None:
            ins.append(new_const(self.namer, f"{node.name}.bias.nchwc{self.block}",
                                 pack_bias(b, w.shape[0], self.block, w.dtype)))
        y = node.outputs[0]
        # a Relu (or, 2-D, a Swish: SiLU) that is the conv's only reader runs in the kernel's
        # output transform
        readers = self.consumers.get(y.id, [])
        act = readers[0] if (self.uses[y.id] == 1 and len(readers) == 1 and not readers[0].domain and (
            readers[0].op == "Relu" or (op == "ConvWinograd" and readers[0].op == "Swish"
                                        and float(readers[0].attrs.get("alpha", 1.0)) == 1.0))) else None
        yb = self.twin_value(y)
        acts = {"relu": int(act is not None and act.op == "Relu")}
        if act is not None and act.op == "Swish":
            acts["swish"] = 1
        self.emit(op, ins, [yb], {**kind, **acts}, node.name, DOMAIN)
        if act is not None:
            self.skip.add(id(act))
            y = act.outputs[0]
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
            elif s == out and (v.id in self.blocked or v.const is not None or node.op in UNARY
                               or self.moved_channels_last(v, node)):
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

    def moved_channels_last(self, v: Value, node: Node) -> bool:
        """Is v a channels-last value moved to NCHW (Transpose, perm 0,3,1,2) for `node` alone, whose
        result is read blocked or moved to channels-last again? Its blocked twin is then one pass of
        whole channel vectors (the Transpose runs inside the ToNCHWc), as cheap as the move itself,
        and so is the result's way back to channels-last (FromNCHWc + Transpose 0,2,3,1): so `node`
        runs blocked rather than in NCHW between a move and a conversion (ConvNeXt's residual Add
        after its channels-last MLP: Transpose + Add, then ToNCHWc for the next depthwise conv, or
        the stage's channels-last LayerNorm)."""
        p = self.producers.get(v.id)
        if p is None or p.op != "Transpose" or p.domain or self.uses[v.id] != 1 or _perm(p) != [0, 3, 1, 2]:
            return False
        y = node.outputs[0]
        readers = self.consumers.get(y.id, [])
        return self.read_blocked(y) or (bool(readers) and self.uses[y.id] == len(readers) and all(
            r.op == "Transpose" and not r.domain and _perm(r) == [0, 2, 3, 1] for r in readers))

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

    def flatten_dense(self, node: Node) -> bool:
        """A Flatten (or Reshape) of a blocked N,C,H,W value to N,C*H*W whose only reader is a
        MatMul/Gemm with constant weights (a classifier after its last pool: MNIST's and
        LeNet's) flattens the twin instead, the weights' rows permuted to the blocked order
        (zero rows for padding channels): no conversion back to NCHW."""
        if node.domain or node.op not in ("Flatten", "Reshape") or not node.inputs or node.inputs[0] is None \
                or node.inputs[0].id not in self.blocked or len(node.outputs) != 1 or node.outputs[0] is None:
            return False
        x, y = node.inputs[0], node.outputs[0]
        xs, ys = static_shape(x), static_shape(y)
        readers = self.consumers.get(y.id, [])
        if xs is None or ys is None or len(xs) != 4 or ys != (xs[0], xs[1] * xs[2] * xs[3]) \
                or self.uses[y.id] != 1 or len(readers) != 1:
            return False
        dense = readers[0]
        ins = dense.inputs
        if dense.domain or dense.op not in ("MatMul", "Gemm") or len(ins) < 2 or ins[0] is not y or ins[1] is None \
                or ins[1].const is None or ins[1].const.ndim != 2 or any(v is y for v in ins[1:]) \
                or int(dense.attrs.get("transA", 0)):
            return False
        trans = dense.op == "Gemm" and bool(int(dense.attrs.get("transB", 0)))
        xb = self.blocked[x.id]
        _, cb, h, w, blk = xb.type.shape
        c = np.arange(cb * blk).reshape(cb, 1, 1, blk)     # each twin element's channel, in twin order
        old = ((c * h + np.arange(h).reshape(1, h, 1, 1)) * w + np.arange(w).reshape(1, 1, w, 1)).reshape(-1)
        valid = (c < xs[1]).repeat(h, 1).repeat(w, 2).reshape(-1)
        b = ins[1].const.T if trans else ins[1].const
        rows = np.zeros((old.size, b.shape[1]), b.dtype)
        rows[valid] = b[old[valid]]
        wb = new_const(self.namer, f"{ins[1].name}.nchwc{blk}", np.ascontiguousarray(rows.T if trans else rows))
        flat = self.reshape(xb, (0, cb * h * w * blk))
        self.emit(dense.op, [flat, wb, *ins[2:]], list(dense.outputs), dict(dense.attrs), dense.name)
        self.skip.add(id(dense))
        self.fired["Flatten"] += 1
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
            if self.concat(node) or self.resize(node) or self.depth_to_space(node) or self.flatten_dense(node):
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


def transform(graph: Graph, block: int, selective: bool | None = None, target: Target | None = None,
              override: str | None = None, findings: list | None = None, decisions: dict | None = None
              ) -> dict[str, int]:
    """Rewrite `graph` in place with blocks of `block` channels for `target` (None: the host;
    `override`: the conv algorithm asked for every conv, `decisions`: per conv, see
    kiln.lower.conv_algo); returns what fired, and appends each conv's algorithm choice to `findings`."""
    if block < 2 or not any(n.op == "Conv" for n in graph.nodes):
        return {}
    convs, choices = choose_convs(graph, block, target, override, SELECTIVE if selective is None else selective,
                                  decisions)
    if findings is not None:
        findings.extend(choices)
    groups = align_channel_groups(graph, convs, block)
    r = _Rewriter(graph, block, convs)
    r.run()
    if r.fired["Conv"] or r.fired["Winograd"]:
        graph.opsets.setdefault(DOMAIN, 1)
    return {k: n for k, n in {**r.fired, "channel groups": groups}.items() if n}


@graph_pass("transform_layout")
def transform_layout(graph: Graph, ctx: PassContext) -> Graph:
    """Run convolutions (and the elementwise ops between them) on the blocked NCHW[c]c layout,
    each by the algorithm kiln.lower.conv_algo chooses (listed in the pass's findings)."""
    ctx.tally(transform(graph, default_block(ctx.target), target=ctx.target,
                        override=asked(ctx.decisions), findings=ctx.findings, decisions=ctx.decisions))
    return graph
