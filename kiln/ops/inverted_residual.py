"""The fused inverted residual block on the blocked layout: kiln's own op (domain "kiln").

MobileNetV2/V3-style blocks expand a tensor with a 1x1 conv (typically 6x the channels),
run a depthwise conv over the wide tensor and project it back with a 1x1 conv, with an
activation after each conv and often a residual add. Run as three kernels, the wide
tensor is written to memory and read back twice; fused, it is made and used a few rows at
a time (kiln/codegen/c_src/inverted_residual.c), in L1/L2. kiln.passes.inverted_residual
finds the chain in the blocked graph and chooses when to fuse it.

- `InvertedResidual(x, w1, b1, w2, b2, w3, b3, r?) {kernel_shape, strides, pads, act, clip}`:
  x blocked N,ICB,H,W,cb; w1 (ECB, ICB, 1, 1, cb, cb) and w3 (OCB, ECB, 1, 1, cb, cb) packed as
  ConvNCHWc's dense weights, w2 (ECB, 1, KH, KW, 1, cb) as its depthwise ones, biases packed
  (CB, cb); `kernel_shape`, `strides`, `pads` (4, ONNX order) the depthwise conv's (no
  dilation); `act` three names, the activation after each conv, each one of ACTIVATIONS
  ("" for none); `clip` six floats, (min, max) for each "clip"; r (optional) blocked like the
  output, added last. Output N,OCB,OH,OW,cb.

- `ExpandDepthwise(x, w1, b1, w2, b2) {kernel_shape, strides, pads, act, clip, pool}`: the
  same without the project conv (act[2] ""), for a block whose project conv cannot run row by
  row (a squeeze-excite gate in between): output N,ECB,OH,OW,cb, and when `pool` = 1 also its
  mean over the plane N,ECB,1,1,cb (the gate's global average pool).

Every activation here maps 0 to 0, so the blocked padding channels stay zero.
"""

from __future__ import annotations

import numpy as np

from kiln.graph.types import TensorType
from kiln.ops.layout import DOMAIN, from_blocked, to_blocked, unpack_conv_weight
from kiln.ops.nn import compute_dtype, conv_core, window
from kiln.ops.registry import OPAQUE, op

# name -> (code in the C kernel, reference)
ACTIVATIONS = {
    "": (0, lambda v, lo, hi: v),
    "relu": (1, lambda v, lo, hi: np.maximum(v, 0)),
    "clip": (2, lambda v, lo, hi: np.minimum(np.maximum(v, lo), hi)),
    "hardswish": (3, lambda v, lo, hi: v * np.clip(v / 6 + 0.5, 0, 1)),
    "swish": (4, lambda v, lo, hi: v / (1 + np.exp(-v))),
}


def activations(ctx) -> tuple[list[str], list[float]]:
    """The node's three activation names and six clip bounds, checked."""
    acts = [str(a) for a in ctx.attr("act", ["", "", ""])]
    clip = [float(c) for c in ctx.attr("clip", [0.0] * 6)]
    if len(acts) != 3 or any(a not in ACTIVATIONS for a in acts) or len(clip) != 6:
        ctx.fail(f"InvertedResidual needs act = 3 names of {sorted(ACTIVATIONS)} and clip = 6 floats, "
                 f"got act {acts}, clip {clip}")
    return acts, clip


def geometry(ctx, xs, w1s, w2s, w3s):
    """Check the shapes; (ECB, OCB, OH, OW) of the block's expanded and output tensors (w3s None:
    ExpandDepthwise's, no project conv; OCB None)."""
    if any(s is None for s in (xs, w1s, w2s)) or len(xs) != 5 or not all(isinstance(d, int) for d in xs):
        ctx.fail(f"{ctx.node.op} needs a static blocked input N,CB,H,W,cb, got {xs}")
    n, icb, h, w, cb = xs
    ecb = w1s[0] if len(w1s) == 6 else None
    w3ok = w3s is None or (len(w3s) == 6 and tuple(w3s[1:]) == (ecb, 1, 1, cb, cb))
    if tuple(w1s) != (ecb, icb, 1, 1, cb, cb) or len(w2s) != 6 or tuple(w2s[:2]) != (ecb, 1) \
            or tuple(w2s[4:]) != (1, cb) or not w3ok:
        ctx.fail(f"{ctx.node.op} weights {tuple(w1s)}, {tuple(w2s)}{'' if w3s is None else ', ' + str(tuple(w3s))} "
                 f"do not fit input {tuple(xs)}: expected (E, {icb}, 1, 1, {cb}, {cb}), (E, 1, KH, KW, 1, {cb})"
                 f"{'' if w3s is None else f', (O, E, 1, 1, {cb}, {cb})'}")
    ks = [int(k) for k in ctx.attr("kernel_shape", list(w2s[2:4]))]
    if ks != list(w2s[2:4]):
        ctx.fail(f"kernel_shape {ks} does not match the depthwise weights {tuple(w2s)}")
    if [int(d) for d in ctx.attr("dilations", [1, 1])] != [1, 1]:
        ctx.fail("InvertedResidual's depthwise conv is undilated")
    win = window(ctx, [h, w], ks)
    oh, ow = (int(o) for o in win.out)
    if oh < 1 or ow < 1:
        ctx.fail(f"InvertedResidual of a {h}x{w} input with kernel {ks} has no output")
    return ecb, None if w3s is None else w3s[0], oh, ow


def _infer(ctx):
    xs = ctx.shape(0)
    ecb, ocb, oh, ow = geometry(ctx, xs, ctx.shape(1), ctx.shape(3), ctx.shape(5))
    activations(ctx)
    cb = xs[4]
    for i, blocks in ((2, ecb), (4, ecb), (6, ocb)):
        if ctx.shape(i) != (blocks, cb):
            ctx.fail(f"InvertedResidual bias {i} {ctx.shape(i)} must be packed as {(blocks, cb)}")
    out = (xs[0], ocb, oh, ow, cb)
    if ctx.has_input(7) and ctx.shape(7) != out:
        ctx.fail(f"InvertedResidual residual {ctx.shape(7)} must be shaped as the output {out}")
    return [TensorType(ctx.dtype(0), out)]


def _pointwise(x, w, b):
    """A 1x1 conv of planar x (N,C,H,W) by unpacked (O, C, 1, 1) weights, plus bias."""
    return np.einsum("nchw,oc->nohw", x, w[:, :, 0, 0]) + b.reshape(1, -1, 1, 1)


def _expand_depthwise(ctx, x, w1, b1, w2, b2):
    """The planar result of expand 1x1 -> act -> depthwise -> act, and act(i, v) for the rest."""
    acts, clip = activations(ctx)

    def act(i, v):
        return ACTIVATIONS[acts[i]][1](v, clip[2 * i], clip[2 * i + 1])
    xn = from_blocked(compute_dtype(x), x.shape[1] * x.shape[-1])
    e = act(0, _pointwise(xn, unpack_conv_weight(compute_dtype(w1), False), compute_dtype(b1).reshape(-1)))
    w2n = unpack_conv_weight(compute_dtype(w2), True)
    d = conv_core(ctx, e, w2n, e.shape[1], window(ctx, list(e.shape[2:]), list(w2.shape[2:4])))
    return act(1, d + compute_dtype(b2).reshape(1, -1, 1, 1)), act


@op("InvertedResidual", infer=_infer, domain=DOMAIN, fusion=OPAQUE)
def inverted_residual(ctx, x, w1, b1, w2, b2, w3, b3, r=None):
    """expand 1x1 -> act -> depthwise -> act -> project 1x1 -> act (+ r), on blocked tensors."""
    d, act = _expand_depthwise(ctx, x, w1, b1, w2, b2)
    y = act(2, _pointwise(d, unpack_conv_weight(compute_dtype(w3), False), compute_dtype(b3).reshape(-1)))
    y = to_blocked(y, x.shape[-1])
    if r is not None:
        y = y + compute_dtype(r)
    return y.astype(x.dtype, copy=False)


def _ed_infer(ctx):
    xs = ctx.shape(0)
    ecb, _, oh, ow = geometry(ctx, xs, ctx.shape(1), ctx.shape(3), None)
    activations(ctx)
    cb = xs[4]
    for i in (2, 4):
        if ctx.shape(i) != (ecb, cb):
            ctx.fail(f"ExpandDepthwise bias {i} {ctx.shape(i)} must be packed as {(ecb, cb)}")
    outs = [TensorType(ctx.dtype(0), (xs[0], ecb, oh, ow, cb))]
    if int(ctx.attr("pool", 0)):
        outs.append(TensorType(ctx.dtype(0), (xs[0], ecb, 1, 1, cb)))
    return outs


@op("ExpandDepthwise", infer=_ed_infer, domain=DOMAIN, fusion=OPAQUE)
def expand_depthwise(ctx, x, w1, b1, w2, b2):
    """expand 1x1 -> act -> depthwise -> act on blocked tensors (an inverted residual whose
    project conv is not fused: a squeeze-excite gate comes between); `pool` = 1: a second
    output, the result's mean over the plane (N, ECB, 1, 1, cb), the gate's global pool."""
    y = to_blocked(_expand_depthwise(ctx, x, w1, b1, w2, b2)[0], x.shape[-1])
    if not int(ctx.attr("pool", 0)):
        return y.astype(x.dtype, copy=False)
    return y.astype(x.dtype, copy=False), y.mean(axis=(2, 3), keepdims=True).astype(x.dtype, copy=False)
