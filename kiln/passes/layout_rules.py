"""Which convs and ops can run on the blocked NCHW[c]c layout, and which convs do, each with the
chooser's algorithm and reason: the rules of the layout pass (kiln.passes.layout, whose module
doc describes the rewrite), kept apart from its rewriter so that each file has one job.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import replace

import numpy as np

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.graph.ir import Graph, Node
from kiln.lower.conv_algo import Choice, ConvChoice, ConvShape, asked_for, choose, conv_key, legal, winograd_m
from kiln.ops.layout import block_groups
from kiln.ops.nn import window
from kiln.ops.registry import NodeCtx
from kiln.passes.edit import images
from kiln.passes.edit import per_image_shape as static_shape   # (a symbolic batch allowed)
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


def narrow_output(c: int, oc: int, block: int, kernel, dense: bool = True) -> bool:
    """A dense pointwise conv from channels that fill blocks to fewer channels than a block (a
    segmentation or detection head's 1x1 to a few classes) writes them in one zero-padded
    block: where its input is blocked already, converting that input (C channels, and a
    DepthToSpace before it then not blocked but fused into the conversion, which reads the
    blocked plane a lane at a time) costs more than the padded outputs' multiply-adds.
    Measured, one thread, thread CPU time, per-kernel profile (Sapphire Rapids, block 16):
    DBNet's head at 320x320, 1x1 64 -> 256, DepthToSpace, ReLU, 1x1 64 -> 4, DepthToSpace,
    Sigmoid: 8.55 ms NCHW after the first conv (FromNCHWc+DepthToSpace+ReLU 7.47) -> 2.07
    blocked; U-Net's last 1x1 32 -> 2 at 256x256 with its conversion 2.58 -> 1.24 ms.
    A KxK conv does K*K times the padded multiply-adds and stays NCHW."""
    return (dense and oc < block and not worth_blocking(oc, block) and worth_blocking(c, block)
            and all(int(k) == 1 for k in kernel))


def blockable_channels(c: int, oc: int, block: int, kernel, depthwise: bool = False, grouped: bool = False) -> bool:
    """Whether a conv of `c` -> `oc` channels (taps `kernel`) fills the blocks well enough to run
    blocked: both channel counts little padded, or few input channels read channels-last
    (`narrow_input`), or few output channels of a pointwise conv (`narrow_output`)."""
    dense = not depthwise and not grouped
    return ((worth_blocking(oc, block) or narrow_output(c, oc, block, kernel, dense))
            and (worth_blocking(c, block) or (dense and narrow_input(c, block, depthwise))))


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
    kernel = node.attrs.get("kernel_shape", w.const.shape[2:])
    if not one_pixel(xs) and not blockable_channels(c, oc, block, kernel, depthwise, group > 1 and not depthwise):
        return None
    attrs = _window_attrs(node, opset, xs, kernel)
    if attrs is None:
        return None
    if group > 1 and not depthwise and rotated(c, oc, group, block):
        return {**attrs, "depthwise": 1, "rotate": c // group}
    return {**attrs, "depthwise": int(depthwise), **({"groups": groups} if group > 1 and not depthwise else {})}


def rotated(c: int, oc: int, group: int, block: int) -> bool:
    """A grouped conv of r < block channels per group in and out, r dividing the block: it runs
    as a depthwise conv over r lane rotations (kiln.ops.layout, ConvNCHWc's `rotate`): r
    multiply-adds per output and tap (and r - 1 shuffles per output), where block-diagonal
    weights over whole blocks would take block / r times as many."""
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


def _selected_kind(node: Node, attrs: dict, block: int) -> str | None:
    """What makes a blockable conv one the layout pass blocks next to a blocked neighbour (said
    in the chooser's reason): pointwise, depthwise, grouped, a stem conv reading few channels
    (channels-last), strided or 1-D; None for a dense KxK conv."""
    w = node.inputs[1].const
    if "rotate" in attrs:
        r = attrs["rotate"]
        return (f"grouped ({int(node.attrs['group'])} groups of {r} channels: depthwise over {r} lane "
                f"rotations, {r} FMAs per output vector and tap, {r - 1} shuffles per output vector)")
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
    if not blockable_channels(c, oc, block, node.attrs.get("kernel_shape", w.const.shape[2:]),
                              group > 1 and group == c == oc, group > 1 and not group == c == oc):
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
                 selective: bool = True, decisions: dict | None = None) -> tuple[dict[int, dict], list[ConvChoice]]:
    """id(conv node) -> its blocked attributes (with "winograd" set for a Winograd conv), for
    the convs to rewrite; and every 2-D conv's algorithm with the reason
    (kiln.lower.conv_algo.choose, then the neighbour rule below). `decisions`: per-conv
    algorithms keyed by the conv's workload (kiln.lower.conv_algo.asked_for), before `override`."""
    target = Target.of(target)
    opset = graph.opset("")
    cands, choices, forced = {}, {}, set()
    for n in graph.nodes:
        a = blockable_conv(n, opset, block)
        shape = conv_shape(n, opset, block, a)
        if shape is None:
            continue
        key = conv_key(n, opset)
        own, record = asked_for(decisions, key)
        try:
            c = choose(shape, target, own or override, strict=n.name if own else None,
                       source="a per-conv decision" if record is None else f"tuning record {record}")
        except KilnError as e:
            if record is None:
                raise
            warnings.warn(f"tuning record {record} not applied: {e}", stacklevel=2)
            own, c = None, choose(shape, target, override)
        if own is not None and own != "direct" or override in ("direct-nchwc", "direct-nchw") and own is None:
            forced.add(id(n))     # asked for: the neighbour rule does not move it
        choices[id(n)] = ConvChoice(n.name, shape, c, key, legal(shape, target))
        if c.algorithm == "winograd":
            cands[id(n)] = {**a, "winograd": winograd_m(shape, target, decisions)}   # its output tile
        elif a is not None and ((not selective and id(n) not in forced) or c.algorithm == "direct-nchwc"):
            cands[id(n)] = a
            if c.algorithm != "direct-nchwc":
                choices[id(n)] = replace(choices[id(n)], choice=Choice("direct-nchwc", f"{c.reason}; blocked all the "
                                                                  "same (the layout pass not selective)"))
    if selective:
        kept = select_convs(graph, block, cands)
        kept.update({k: a for k, a in cands.items() if k in forced})
        for k in set(cands) - set(kept):
            old = choices[k]
            choices[k] = replace(old, choice=Choice(
                "direct-nchw", f"{old.choice.reason}, but no blocked neighbour: the layout conversions "
                               "would cost more than blocking saves"))
        for k, a in kept.items():
            old = choices[k]
            if not a.get("winograd") and alone(a):
                choices[k] = replace(old, choice=Choice(old.choice.algorithm, (
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
