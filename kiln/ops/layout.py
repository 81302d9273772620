"""Blocked channel layout (NCHW[c]c) and the convolution over it, kiln's own ops (domain "kiln").

A blocked tensor keeps channels in blocks of `block` as its innermost dim:
N,C,H,W is stored as N,ceil(C/block),H,W,block with element (n, c, h, w) at
[n, c // block, h, w, c % block]. When C is not a multiple of the block the
last block is padded with zeros (so every block is whole and a kernel never
needs a channel tail); `FromNCHWc` crops the padding off again. The padded
channels of a conv's output stay zero through bias, ReLU, Clip and Add, and a
consumer conv's packed weights are zero there, so padding never changes a
result (kiln.passes.layout only lets such padding-preserving ops run blocked).

- `ToNCHWc(x) {block, pads}`: N,C,*S -> N,ceil(C/block),*S,block (zero padded channels);
  `pads` (optional, ONNX order: the spatial begins, then ends) zero pads the spatial dims too:
  a stem conv's padding made by its input conversion instead of a padded copy of its own;
- `FromNCHWc(x) {channels}`: the inverse, keeping the first `channels` channels;
- `ConvNCHWc(x, w, b, scale) {kernel_shape, strides, pads, dilations, depthwise, groups, rotate}`: 2-D
  convolution of a blocked input with weights packed ahead of time as
  (OC/ob, IC/ib, KH, KW, ib, ob) (depthwise: (C/cb, 1, KH, KW, 1, cb), channel
  block k of the output reads channel block k of the input) and a bias packed
  as (OC/ob, ob); the output is N,OC/ob,OH,OW,ob. With `groups` G > 1 (a grouped
  conv, `block_groups`) the blocks form G block groups: output block k reads only the
  IC/ib/G input blocks of its group k // (OC/ob/G), and the weights are
  (OC/ob, IC/ib/G, KH, KW, ib, ob), zero where an ONNX group does not reach (a block of
  several small ONNX groups holds their block-diagonal weights). With `rotate` r > 1 (and
  depthwise) a grouped conv of r channels per group, r dividing the block, runs as a
  depthwise one over r lane rotations: output lane o reads, at rotation j, lane
  (o // r) * r + (o % r + j) % r of the same block, with weights (C/cb, r, KH, KW, 1, cb)
  indexed by the input lane (`pack_rotated_weight`): r multiply-adds per output and tap
  instead of a block's.
  ib may be less than ob: a stem conv's few input channels as one block (channels-last);
  the optional `scale` (N,IC/ib,1,1,ib, blocked like x) multiplies the input per image
  and channel first (a squeeze-excite gate: the lowering scales the weights instead);
- `GlobalAveragePoolNCHWc(x)`: the mean over the plane of a blocked tensor, N,CB,1,1,cb;
- `MaxPoolNCHWc(x) {kernel_shape, strides, pads, dilations}`: 2-D max pooling of a
  blocked tensor, blocked out (zeros in the padding channels stay zeros).

Their native lowerings live in kiln.lower.nchwc.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kiln.graph.types import TensorType
from kiln.ops.nn import compute_dtype, conv_core, pad_spatial, window, windows
from kiln.ops.registry import INJECTIVE, OPAQUE, OUT_FUSABLE, REDUCTION, op

DOMAIN = "kiln"


def _blocks(c: int, block: int) -> int:
    return -(-c // block)


# ---------------------------------------------------------------- references

def to_blocked(x: np.ndarray, block: int) -> np.ndarray:
    """N,C,*S -> N,ceil(C/block),*S,block, zero padding the last channel block."""
    n, c = x.shape[:2]
    cb = _blocks(c, block)
    if cb * block != c:
        x = np.concatenate([x, np.zeros((n, cb * block - c) + x.shape[2:], x.dtype)], axis=1)
    x = x.reshape((n, cb, block) + x.shape[2:])
    return np.ascontiguousarray(np.moveaxis(x, 2, -1))


def from_blocked(x: np.ndarray, channels: int) -> np.ndarray:
    """N,CB,*S,block -> N,channels,*S (the padding channels dropped)."""
    n, cb, block = x.shape[0], x.shape[1], x.shape[-1]
    y = np.moveaxis(x, -1, 2).reshape((n, cb * block) + x.shape[2:-1])
    return np.ascontiguousarray(y[:, :channels])


def pack_conv_weight(w: np.ndarray, block: int, depthwise: bool, in_block: int | None = None) -> np.ndarray:
    """OIHW (depthwise: C,1,KH,KW) -> (OC/ob, IC/ib, KH, KW, ib, ob), zero padded channels, with
    ob = block and ib = in_block (default: block). Depthwise weights become (C/cb, 1, KH, KW, 1, cb)."""
    oc, ic = w.shape[:2]
    ocp = _blocks(oc, block) * block
    if depthwise:
        wp = np.zeros((ocp,) + w.shape[1:], w.dtype)
        wp[:oc] = w
        return np.ascontiguousarray(wp.reshape(ocp // block, block, 1, *w.shape[2:], 1)
                                    .transpose(0, 2, 3, 4, 5, 1))
    ib = in_block or block
    icp = _blocks(ic, ib) * ib
    wp = w   # whole blocks: packed straight from w (a zero-padded copy first was 40% of ResNet-18's packing)
    if (ocp, icp) != (oc, ic):
        wp = np.zeros((ocp, icp) + w.shape[2:], w.dtype)
        wp[:oc, :ic] = w
    return np.ascontiguousarray(wp.reshape(ocp // block, block, icp // ib, ib, *w.shape[2:])
                                .transpose(0, 2, 4, 5, 3, 1))


def block_groups(c: int, oc: int, groups: int, block: int) -> int | None:
    """The block groups G a grouped conv (1 < groups, not depthwise) runs as blocked, or None.

    Channels per group that are whole blocks (ResNeXt's 16 or 32 at a block of 16): G = groups,
    each output block reads its group's input blocks. Channels per group that divide the block,
    as many per input as per output block (4 or 8 at 16): G = ceil(groups / (block / per
    group)) blocks of block / per-group ONNX groups each, with block-diagonal weights (block /
    per-group times the multiplies, each a full-vector FMA). Other mixes stay NCHW."""
    if groups < 2 or c % groups or oc % groups:
        return None
    cin, cout = c // groups, oc // groups
    if cin % block == 0 and cout % block == 0:
        return groups
    if cin == cout and block % cin == 0:
        return -(-groups // (block // cin))
    return None


def pack_grouped_weight(w: np.ndarray, groups: int, block: int) -> np.ndarray:
    """Grouped OIHW weights (OC, IC/groups, KH, KW) -> (OC/ob, IC/ib/G, KH, KW, ib, ob) over the
    G = block_groups(...) block groups (see the module doc); zero padded channels."""
    oc, cin = w.shape[:2]
    c, cout = cin * groups, oc // groups
    big = block_groups(c, oc, groups, block)
    if big is None:
        raise ValueError(f"grouped weights {w.shape} (groups {groups}) do not fit blocks of {block}")
    ocb, icb = _blocks(oc, block), _blocks(c, block)
    dense = np.zeros((ocb * block, icb * block) + w.shape[2:], w.dtype)
    for g in range(groups):
        dense[g * cout:(g + 1) * cout, g * cin:(g + 1) * cin] = w[g * cout:(g + 1) * cout]
    per, icbg = ocb // big, icb // big
    out = np.empty((ocb, icbg) + w.shape[2:] + (block, block), w.dtype)
    for k in range(ocb):
        q = k // per
        blk = dense[k * block:(k + 1) * block, q * icbg * block:(q + 1) * icbg * block]
        out[k] = blk.reshape(block, icbg, block, *w.shape[2:]).transpose(1, 3, 4, 2, 0)
    return np.ascontiguousarray(out)


def rotated_lane(o, j: int, r: int):
    """The input lane output lane o reads at rotation j of a rotated grouped conv (groups of r lanes)."""
    return o if j == 0 else (o // r) * r + (o % r + j) % r


def rotated_from(i: int, j: int, r: int) -> int:
    """The output lane that reads input lane i at rotation j (the inverse of rotated_lane)."""
    return (i // r) * r + (i % r - j) % r


def pack_rotated_weight(w: np.ndarray, block: int) -> np.ndarray:
    """Grouped OIHW weights of r = IC/groups = OC/groups channels per group, r dividing `block`,
    -> (C/cb, r, KH, KW, 1, cb) by input lane: [k, j, ..., i] is the weight input lane i of block
    k carries at rotation j, to output lane rotated_from(i, j, r) (whose rotated_lane(o, j, r) is
    i); zero padded channels."""
    oc, r = w.shape[:2]
    ocb = _blocks(oc, block)
    out = np.zeros((ocb, r) + w.shape[2:] + (1, block), w.dtype)
    for k in range(ocb):
        for i in range(block):
            for j in range(r):
                ch = k * block + rotated_from(i, j, r)
                if ch < oc:
                    out[k, j, ..., 0, i] = w[ch, i % r]
    return out


def unpack_rotated_weight(wp: np.ndarray) -> np.ndarray:
    """The inverse of pack_rotated_weight, padding kept: (Cp, r, KH, KW) grouped weights."""
    ocb, r, kh, kw, _, block = wp.shape
    out = np.zeros((ocb * block, r, kh, kw), wp.dtype)
    for k in range(ocb):
        for i in range(block):
            for j in range(r):
                out[k * block + rotated_from(i, j, r), i % r] = wp[k, j, :, :, 0, i]
    return out


def unpack_conv_weight(wp: np.ndarray, depthwise: bool) -> np.ndarray:
    """The inverse of pack_conv_weight, padding kept: (OCp, ICp, KH, KW) or (Cp, 1, KH, KW)."""
    ocb, icb, kh, kw, ib, ob = wp.shape
    return wp.transpose(0, 5, 1, 4, 2, 3).reshape(ocb * ob, icb * ib, kh, kw)


def pack_bias(b: np.ndarray | None, oc: int, block: int, dtype) -> np.ndarray:
    bp = np.zeros(_blocks(oc, block) * block, dtype)
    if b is not None:
        bp[:oc] = b
    return bp.reshape(-1, block)


# ---------------------------------------------------------------- inference

def _block_attr(ctx) -> int:
    block = int(ctx.attr("block"))
    if block < 1:
        ctx.fail(f"block must be positive, got {block}")
    return block


def conversion_pads(ctx, rank: int) -> list[int]:
    """ToNCHWc's `pads` (the spatial begins, then ends; zeros when absent), checked."""
    pads = [int(p) for p in ctx.attr("pads", [0] * 2 * rank)]
    if len(pads) != 2 * rank or any(p < 0 for p in pads):
        ctx.fail(f"ToNCHWc pads must be {2 * rank} non-negative ints (begins, then ends) for "
                 f"{rank} spatial dims, got {pads}")
    return pads


def _to_infer(ctx):
    t = ctx.tensor(0)
    block = _block_attr(ctx)
    if t.shape is None or len(t.shape) < 3 or not isinstance(t.shape[1], int):
        ctx.fail(f"ToNCHWc needs an input N,C,spatial... with known C, got {t}")
    rank = len(t.shape) - 2
    pads = conversion_pads(ctx, rank)
    spatial = [d + pads[i] + pads[rank + i] if pads[i] or pads[rank + i] else d for i, d in enumerate(t.shape[2:])]
    return [TensorType(t.dtype, (t.shape[0], _blocks(t.shape[1], block), *spatial, block))]


def _from_infer(ctx):
    t = ctx.tensor(0)
    c = int(ctx.attr("channels"))
    if t.shape is None or len(t.shape) < 4 or not all(isinstance(d, int) for d in (t.shape[1], t.shape[-1])):
        ctx.fail(f"FromNCHWc needs a blocked input N,CB,spatial...,block, got {t}")
    if not (t.shape[1] - 1) * t.shape[-1] < c <= t.shape[1] * t.shape[-1]:
        ctx.fail(f"{c} channels do not fill the {t.shape[1]} blocks of {t.shape[-1]} of {t}")
    return [TensorType(t.dtype, (t.shape[0], c, *t.shape[2:-1]))]


@dataclass
class BlockedGeom:
    """Concrete geometry of a ConvNCHWc node."""
    n: int
    icb: int
    h: int
    w: int
    ib: int
    ocb: int
    icbg: int        # input channel blocks read per output block (1 when depthwise)
    kernel: list
    ob: int
    strides: list
    dil: list
    begin: list
    out: list
    depthwise: bool
    groups: int = 1  # block groups: output block k reads input blocks (k // (ocb // groups)) * icbg + ...
    rotate: int = 1  # depthwise over this many lane rotations (a grouped conv of that many channels per group)

    @property
    def taps(self) -> int:
        return math.prod(self.kernel)

    def macs(self) -> int:
        red = self.taps * self.rotate if self.depthwise else self.icbg * self.ib * self.taps
        return self.n * self.ocb * self.ob * math.prod(self.out) * red


def blocked_geom(ctx, xs, ws) -> BlockedGeom:
    """Check a ConvNCHWc node's shapes; its output geometry (ctx: an inference/lowering ctx)."""
    if xs is None or ws is None or len(xs) != 5 or len(ws) != 6:
        ctx.fail(f"ConvNCHWc needs x N,CB,H,W,cb and packed weights OCB,ICB,KH,KW,ib,ob; got x {xs}, w {ws}")
    depthwise = bool(ctx.attr("depthwise", 0))
    groups, rotate = int(ctx.attr("groups", 1)), int(ctx.attr("rotate", 1))
    ocb, icbg, kh, kw, ib, ob = ws
    if rotate < 1 or (rotate > 1 and not depthwise) or xs[4] % rotate:
        ctx.fail(f"ConvNCHWc rotate {rotate} must divide the channel block {xs[4]} of a depthwise conv")
    if depthwise and (icbg != rotate or ib != 1 or ob != xs[4] or ocb != xs[1]):
        ctx.fail(f"depthwise ConvNCHWc weights {tuple(ws)} do not fit input {tuple(xs)}: expected "
                 f"({xs[1]}, {rotate}, KH, KW, 1, {xs[4]})")
    if groups < 1 or (groups > 1 and depthwise) or xs[1] % groups or ocb % groups:
        ctx.fail(f"ConvNCHWc groups {groups} must divide the {xs[1]} input and {ocb} output channel "
                 "blocks (and a depthwise conv has none)")
    if not depthwise and (icbg * groups != xs[1] or ib != xs[4]):
        ctx.fail(f"ConvNCHWc weights {tuple(ws)} do not fit input {tuple(xs)} in {groups} block groups: "
                 f"expected (OCB, {xs[1] // groups}, KH, KW, {xs[4]}, ob)")
    ks = [int(k) for k in ctx.attr("kernel_shape", [kh, kw])]
    if ks != [kh, kw]:
        ctx.fail(f"kernel_shape {ks} does not match packed weights {tuple(ws)}")
    win = window(ctx, list(xs[2:4]), ks)
    return BlockedGeom(xs[0], xs[1], xs[2], xs[3], xs[4], ocb, icbg, ks, ob, win.strides, win.dilations,
                       [int(b) for b in win.begin], [int(o) for o in win.out], depthwise, groups, rotate)


def _conv_infer(ctx):
    xs, ws = ctx.shape(0), ctx.shape(1)
    if xs is None or not all(isinstance(d, int) for d in xs[1:]):
        ctx.fail(f"ConvNCHWc needs a static input shape, got {ctx.tensor(0)}")
    g = blocked_geom(ctx, xs, ws)
    if ctx.has_input(2) and ctx.shape(2) != (g.ocb, g.ob):
        ctx.fail(f"ConvNCHWc bias {ctx.shape(2)} must be packed as {(g.ocb, g.ob)}")
    if ctx.has_input(3) and ctx.shape(3) != (xs[0], xs[1], 1, 1, xs[4]):
        ctx.fail(f"ConvNCHWc scale {ctx.shape(3)} must be one value per image and input channel, "
                 f"{(xs[0], xs[1], 1, 1, xs[4])}")
    return [TensorType(ctx.dtype(0), (g.n, g.ocb, *g.out, g.ob))]


def _global_pool_infer(ctx):
    xs = ctx.shape(0)
    if xs is None or len(xs) != 5 or not all(isinstance(d, int) for d in xs[1:]):
        ctx.fail(f"GlobalAveragePoolNCHWc needs a static blocked input N,CB,H,W,cb, got {ctx.tensor(0)}")
    return [TensorType(ctx.dtype(0), (xs[0], xs[1], 1, 1, xs[4]))]


def _pool_infer(ctx):
    xs = ctx.shape(0)
    if xs is None or len(xs) != 5 or not all(isinstance(d, int) for d in xs[1:]):
        ctx.fail(f"MaxPoolNCHWc needs a static blocked input N,CB,H,W,cb, got {ctx.tensor(0)}")
    win = window(ctx, list(xs[2:4]), [int(k) for k in ctx.attr("kernel_shape")])
    return [TensorType(ctx.dtype(0), (xs[0], xs[1], *[int(o) for o in win.out], xs[4]))]


# ---------------------------------------------------------------- the ops

def keeps_bytes(op: str, src: TensorType, dst: TensorType) -> bool:
    """Whether a ToNCHWc / FromNCHWc from `src` to `dst` leaves every element at its place, so
    the conversion is a view of its input (no kernel, no copy): blocks of one channel
    (N,C,H,W,1 is N,C,H,W), or one pixel per image with the channels filling whole blocks
    (N,C/b,1,1,b is N,C,1,1: a global pool's output on its way to a classifier)."""
    if op not in ("ToNCHWc", "FromNCHWc") or src.dtype != dst.dtype or src.shape is None or dst.shape is None:
        return False
    nchw, blocked = (src.shape, dst.shape) if op == "ToNCHWc" else (dst.shape, src.shape)
    if len(blocked) != len(nchw) + 1 or not all(isinstance(d, int) for d in (*nchw[1:], blocked[1], blocked[-1])):
        return False
    block, spatial = blocked[-1], nchw[2:]
    return blocked[1] * block == nchw[1] and tuple(blocked[2:-1]) == tuple(spatial) \
        and (block == 1 or all(d == 1 for d in spatial))


@op("ToNCHWc", infer=_to_infer, domain=DOMAIN, fusion=INJECTIVE)
def to_nchwc(ctx, x):
    """NCHW -> NCHW[block]c (zero padded channels; zero padded spatial dims by `pads`)."""
    rank = x.ndim - 2
    pads = conversion_pads(ctx, rank)
    if any(pads):
        x = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[rank + i]) for i in range(rank)])
    return to_blocked(x, _block_attr(ctx))


@op("FromNCHWc", infer=_from_infer, domain=DOMAIN, fusion=INJECTIVE)
def from_nchwc(ctx, x):
    """NCHW[block]c -> NCHW (the first `channels` channels)."""
    return from_blocked(x, int(ctx.attr("channels")))


@op("ConvNCHWc", infer=_conv_infer, domain=DOMAIN, fusion=OUT_FUSABLE)
def conv_nchwc(ctx, x, w, b=None, scale=None):
    """Blocked 2-D convolution (dense, depthwise or in block groups) with pre-packed weights, of x * scale."""
    g = blocked_geom(ctx, x.shape, w.shape)
    xc = compute_dtype(x)
    if scale is not None:
        xc = xc * compute_dtype(scale)
    xn = from_blocked(xc, x.shape[1] * x.shape[-1])
    wc = compute_dtype(w).astype(xc.dtype, copy=False)
    wn = unpack_rotated_weight(wc) if g.rotate > 1 else unpack_conv_weight(wc, g.depthwise)
    win = window(ctx, list(xn.shape[2:]), g.kernel)
    y = conv_core(ctx, xn, wn, xn.shape[1] // g.rotate if g.depthwise else g.groups, win)
    if b is not None:
        y = y + compute_dtype(b).reshape(1, -1, 1, 1)
    return to_blocked(y, g.ob).astype(x.dtype, copy=False)


@op("GlobalAveragePoolNCHWc", infer=_global_pool_infer, domain=DOMAIN, fusion=REDUCTION)
def global_average_pool_nchwc(ctx, x):
    """The mean over H,W of a blocked tensor, kept blocked (padding channels stay zero)."""
    return compute_dtype(x).mean(axis=(2, 3), keepdims=True).astype(x.dtype, copy=False)


@op("MaxPoolNCHWc", infer=_pool_infer, domain=DOMAIN, fusion=OPAQUE)
def max_pool_nchwc(ctx, x):
    """2-D MaxPool {kernel_shape, strides, pads, dilations} of a blocked tensor, blocked out
    (the padding channels' zeros stay zeros)."""
    xn = from_blocked(compute_dtype(x), x.shape[1] * x.shape[-1])
    win = window(ctx, list(xn.shape[2:]), [int(k) for k in ctx.attr("kernel_shape")])
    v = windows(pad_spatial(xn, win, -np.inf), win)
    y = v.reshape(v.shape[:4] + (-1,)).max(axis=-1)
    return to_blocked(y, x.shape[-1]).astype(x.dtype, copy=False)
