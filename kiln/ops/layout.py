"""Blocked channel layout (NCHW[c]c) and the convolution over it, kiln's own ops (domain "kiln").

A blocked tensor keeps channels in blocks of `block` as its innermost dim:
N,C,H,W is stored as N,ceil(C/block),H,W,block with element (n, c, h, w) at
[n, c // block, h, w, c % block]. When C is not a multiple of the block the
last block is padded with zeros (so every block is whole and a kernel never
needs a channel tail); `FromNCHWc` crops the padding off again. The padded
channels of a conv's output stay zero through bias, ReLU, Clip and Add, and a
consumer conv's packed weights are zero there, so padding never changes a
result (kiln.passes.layout only lets such padding-preserving ops run blocked).

- `ToNCHWc(x) {block}`: N,C,*S -> N,ceil(C/block),*S,block (zero padded channels);
- `FromNCHWc(x) {channels}`: the inverse, keeping the first `channels` channels;
- `ConvNCHWc(x, w, b) {kernel_shape, strides, pads, dilations, depthwise}`: 2-D
  convolution of a blocked input with weights packed ahead of time as
  (OC/ob, IC/ib, KH, KW, ib, ob) (depthwise: (C/cb, 1, KH, KW, 1, cb), channel
  block k of the output reads channel block k of the input) and a bias packed
  as (OC/ob, ob); the output is N,OC/ob,OH,OW,ob.
  ib may be less than ob: a stem conv's few input channels as one block (channels-last);
- `MaxPoolNCHWc(x) {kernel_shape, strides, pads, dilations}`: 2-D max pooling of a
  blocked tensor, blocked out (zeros in the padding channels stay zeros).

The native lowering vectorizes over the output-channel block (one vector
register: ob = vector lanes, as TVM's conv2d_NCHWc and oneDNN's blocked
convolutions do), with a register tile of output columns x channel blocks:
each input element is broadcast once per tile and multiplied into every
channel vector, and each weight vector is reused across the tile's columns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kiln.codegen.cpu import vector_lanes
from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.loops import cast, compute, const, reduce_axis, rmax, select, sum_
from kiln.ops.nn import compute_dtype, conv_core, pad_spatial, parallel_worth, window, windows
from kiln.ops.registry import lowering, op

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
    wp = np.zeros((ocp, icp) + w.shape[2:], w.dtype)
    wp[:oc, :ic] = w
    return np.ascontiguousarray(wp.reshape(ocp // block, block, icp // ib, ib, *w.shape[2:])
                                .transpose(0, 2, 4, 5, 3, 1))


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


def _to_infer(ctx):
    t = ctx.tensor(0)
    block = _block_attr(ctx)
    if t.shape is None or len(t.shape) < 3 or not isinstance(t.shape[1], int):
        ctx.fail(f"ToNCHWc needs an input N,C,spatial... with known C, got {t}")
    return [TensorType(t.dtype, (t.shape[0], _blocks(t.shape[1], block), *t.shape[2:], block))]


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

    @property
    def taps(self) -> int:
        return math.prod(self.kernel)

    def macs(self) -> int:
        red = self.taps if self.depthwise else self.icbg * self.ib * self.taps
        return self.n * self.ocb * self.ob * math.prod(self.out) * red


def blocked_geom(ctx, xs, ws) -> BlockedGeom:
    """Check a ConvNCHWc node's shapes; its output geometry (ctx: an inference/lowering ctx)."""
    if xs is None or ws is None or len(xs) != 5 or len(ws) != 6:
        ctx.fail(f"ConvNCHWc needs x N,CB,H,W,cb and packed weights OCB,ICB,KH,KW,ib,ob; got x {xs}, w {ws}")
    depthwise = bool(ctx.attr("depthwise", 0))
    ocb, icbg, kh, kw, ib, ob = ws
    if depthwise and (icbg != 1 or ib != 1 or ob != xs[4] or ocb != xs[1]):
        ctx.fail(f"depthwise ConvNCHWc weights {tuple(ws)} do not fit input {tuple(xs)}: expected "
                 f"({xs[1]}, 1, KH, KW, 1, {xs[4]})")
    if not depthwise and (icbg != xs[1] or ib != xs[4]):
        ctx.fail(f"ConvNCHWc weights {tuple(ws)} do not fit input {tuple(xs)}: expected "
                 f"(OCB, {xs[1]}, KH, KW, {xs[4]}, ob)")
    ks = [int(k) for k in ctx.attr("kernel_shape", [kh, kw])]
    if ks != [kh, kw]:
        ctx.fail(f"kernel_shape {ks} does not match packed weights {tuple(ws)}")
    win = window(ctx, list(xs[2:4]), ks)
    return BlockedGeom(xs[0], xs[1], xs[2], xs[3], xs[4], ocb, icbg, ks, ob, win.strides, win.dilations,
                       [int(b) for b in win.begin], [int(o) for o in win.out], depthwise)


def _conv_infer(ctx):
    xs, ws = ctx.shape(0), ctx.shape(1)
    if xs is None or not all(isinstance(d, int) for d in xs):
        ctx.fail(f"ConvNCHWc needs a static input shape, got {ctx.tensor(0)}")
    g = blocked_geom(ctx, xs, ws)
    if ctx.has_input(2) and ctx.shape(2) != (g.ocb, g.ob):
        ctx.fail(f"ConvNCHWc bias {ctx.shape(2)} must be packed as {(g.ocb, g.ob)}")
    return [TensorType(ctx.dtype(0), (g.n, g.ocb, *g.out, g.ob))]


def _pool_infer(ctx):
    xs = ctx.shape(0)
    if xs is None or len(xs) != 5 or not all(isinstance(d, int) for d in xs):
        ctx.fail(f"MaxPoolNCHWc needs a static blocked input N,CB,H,W,cb, got {ctx.tensor(0)}")
    win = window(ctx, list(xs[2:4]), [int(k) for k in ctx.attr("kernel_shape")])
    return [TensorType(ctx.dtype(0), (xs[0], xs[1], *[int(o) for o in win.out], xs[4]))]


# ---------------------------------------------------------------- the ops

@op("ToNCHWc", infer=_to_infer, domain=DOMAIN)
def to_nchwc(ctx, x):
    """NCHW -> NCHW[block]c (zero padded channels)."""
    return to_blocked(x, _block_attr(ctx))


@op("FromNCHWc", infer=_from_infer, domain=DOMAIN)
def from_nchwc(ctx, x):
    """NCHW[block]c -> NCHW (the first `channels` channels)."""
    return from_blocked(x, int(ctx.attr("channels")))


@op("ConvNCHWc", infer=_conv_infer, domain=DOMAIN)
def conv_nchwc(ctx, x, w, b=None):
    """Blocked 2-D convolution (dense or depthwise) with pre-packed weights."""
    g = blocked_geom(ctx, x.shape, w.shape)
    xc = compute_dtype(x)
    xn = from_blocked(xc, x.shape[1] * x.shape[-1])
    wn = unpack_conv_weight(compute_dtype(w).astype(xc.dtype, copy=False), g.depthwise)
    win = window(ctx, list(xn.shape[2:]), g.kernel)
    y = conv_core(ctx, xn, wn, xn.shape[1] if g.depthwise else 1, win)
    if b is not None:
        y = y + compute_dtype(b).reshape(1, -1, 1, 1)
    return to_blocked(y, g.ob).astype(x.dtype, copy=False)


@op("MaxPoolNCHWc", infer=_pool_infer, domain=DOMAIN)
def max_pool_nchwc(ctx, x):
    """2-D MaxPool {kernel_shape, strides, pads, dilations} of a blocked tensor, blocked out
    (the padding channels' zeros stay zeros)."""
    xn = from_blocked(compute_dtype(x), x.shape[1] * x.shape[-1])
    win = window(ctx, list(xn.shape[2:]), [int(k) for k in ctx.attr("kernel_shape")])
    v = windows(pad_spatial(xn, win, -np.inf), win)
    y = v.reshape(v.shape[:4] + (-1,)).max(axis=-1)
    return to_blocked(y, x.shape[-1]).astype(x.dtype, copy=False)


# ---------------------------------------------------------------- native lowerings

def _rows_schedule(stage, work: int, lead: int) -> None:
    """Fuse the first `lead` axes (parallel when there is work) and vectorize the rest as one run."""
    axes = list(stage.axis)
    outer = stage.fuse(*axes[:lead])
    inner = stage.fuse(*axes[lead:])
    if inner.arg.dom[1] >= 4:
        stage.vectorize(inner)
    if parallel_worth(work) and outer.arg.dom[1] > 1:
        stage.parallel(outer)


@lowering("ToNCHWc", domain=DOMAIN)
def _to_lower(ctx, x):
    block = _block_attr(ctx)
    c = x.shape[1]

    def body(n, cb, *rest):
        ch = cb * block + rest[-1]
        v = x[(n, ch, *rest[:-1])]
        return v if c % block == 0 else select(ch < c, v, const(0, x.dtype))
    out = compute(ctx.out_shape(), body, "to_nchwc", x.dtype)
    work = math.prod(out.shape)
    if block >= 4 or len(out.shape) < 4:
        # (n, block, rows) outer, a row of spatial x lanes inner: reads run along the row
        ctx.schedule(lambda sch, outs: _rows_schedule(sch[outs[0]], work, len(out.shape) - 2))
        return out

    def narrow(sch, outs):
        # a few channels (a channels-last copy for a stem conv): rows outer, then each channel's
        # contiguous run of a row (vectorized), as the lanes' index arithmetic (w*block + lane)
        # vectorized measured 5x slower
        st = sch[outs[0]]
        axes = list(st.axis)
        outer = st.fuse(*axes[:-2])
        st.reorder(axes[-1], axes[-2])
        st.unroll(axes[-1])
        st.vectorize(axes[-2])
        if parallel_worth(work) and outer.arg.dom[1] > 1:
            st.parallel(outer)
    ctx.schedule(narrow)
    return out


@lowering("FromNCHWc", domain=DOMAIN)
def _from_lower(ctx, x):
    block = x.shape[-1]
    out = compute(ctx.out_shape(), lambda n, c, *sp: x[(n, c // block, *sp, c % block)], "from_nchwc",
                  x.dtype)
    work = math.prod(out.shape)
    if len(out.shape) != 4 or out.shape[1] % block or out.shape[3] < 4:
        ctx.schedule(lambda sch, outs: _rows_schedule(sch[outs[0]], work, 2))
        return out

    def rows(sch, outs):
        # one row of one channel block at a time (W x block, in L1): each output row is
        # written whole, read from the block's row in strides of `block`; a whole plane per
        # channel read the blocked plane `block` times from L2 (measured 5x slower)
        st = sch[outs[0]]
        n, c, h, w = st.axis
        co, ci = st.split(c, block)
        st.reorder(n, co, h, ci, w)
        top = st.fuse(n, co, h)
        st.vectorize(w)
        if parallel_worth(work) and top.arg.dom[1] > 1:
            st.parallel(top)
    ctx.schedule(rows)
    return out


VECTOR_REGISTERS = {64: 32, 32: 16, 16: 16}    # architectural vector registers, by vector bytes
BLOCKED_KNOBS: dict = {}                       # overrides for experiments and tests: reg_w, oc_v
DEPTHWISE_MAX_COLUMNS = 14                     # the widest depthwise tile measured (AVX-512)


def plan_tile(g: BlockedGeom, vbytes: int, knobs: dict | None = None) -> tuple[int, int]:
    """(reg_w, oc_v): output columns x channel blocks of one register tile.

    Per input channel the tile loads reg_w broadcasts and oc_v weight vectors for
    reg_w * oc_v FMAs into accumulators that stay in vector registers: at most 4 fewer
    than the register file (28 of AVX-512's 32; one of them may spill, measured no slower
    than smaller tiles, and 4x4/14x2 tiles measured 1.3x slower than 7x4 on 56- and
    28-wide outputs). Depthwise tiles read their taps' weights from L1 (a memory operand
    of each FMA) rather than holding them in registers, which left AVX2 one or two
    accumulators on 7- and 14-wide outputs: a chain of dependent FMAs at the FMA's
    latency (mobilenetv2's depthwise convs 3.31 -> 2.37 ms with 7 columns instead of 1).
    Columns divide the output width (no tail loop); the tile with the fewest loads per
    FMA wins (ties: more accumulators, to cover the FMA latency).
    """
    knobs = {**BLOCKED_KNOBS, **(knobs or {})}
    regs = VECTOR_REGISTERS.get(vbytes, 16)
    ow = g.out[1]
    best = None
    for r in (d for d in range(1, ow + 1) if ow % d == 0):
        for v in [1] if g.depthwise else [v for v in range(1, 5) if g.ocb % v == 0]:
            fits = r * v <= regs - 4 and (r <= DEPTHWISE_MAX_COLUMNS or not g.depthwise)
            if not fits and r > 1:
                continue
            key = ((r + v) / (r * v), -r * v)
            if best is None or key < best[0]:
                best = (key, r, v)
    _, r, v = best
    return int(knobs.get("reg_w", r)), int(knobs.get("oc_v", v))


@lowering("ConvNCHWc", domain=DOMAIN)
def _conv_lower(ctx, x, w, b=None):
    g = blocked_geom(ctx, x.shape, w.shape)
    dt = x.dtype
    acc_dt = DType.float32 if dt.itemsize < 4 else dt
    pt, pl = g.begin
    sh, sw = g.strides
    dh, dw = g.dil
    # the zero border. Depthwise: read through a select (the condition is uniform over the
    # vectorized lanes; a padded copy costs as much as the convolution: measured 2-3x slower).
    # Dense: a zero-padded copy of the input (the rows and columns the windows read), so the
    # register tile's inner loop has no conditions (a select there made it 2x slower for
    # some tiles, as the C compiler did not always unswitch it)
    hp = (g.out[0] - 1) * sh + (g.kernel[0] - 1) * dh + 1
    wp = (g.out[1] - 1) * sw + (g.kernel[1] - 1) * dw + 1
    padded = bool(pt or pl or hp > g.h + pt or wp > g.w + pl)

    def border(n, c, r, s, i):
        ok = (r >= 0) & (r < g.h) & (s >= 0) & (s < g.w)
        return select(ok, x[(n, c, r, s, i)], const(0, dt))
    xpad = None
    if padded and not g.depthwise:
        xpad = compute((g.n, g.icb, hp, wp, g.ib), lambda n, c, r, s, i: border(n, c, r - pt, s - pl, i),
                       "xpad", dt)

    def xp(idx):
        n, c, r, s, i = idx
        if xpad is not None:
            return xpad[idx]
        return border(n, c, r - pt, s - pl, i) if padded else x[(n, c, r - pt, s - pl, i)]

    kh, kw = reduce_axis(g.kernel[0], "kh"), reduce_axis(g.kernel[1], "kw")
    if g.depthwise:
        red = [kh, kw]

        def acc_body(n, c, oh, ow, o):
            return sum_(cast(acc_dt, xp((n, c, oh * sh + kh * dh, ow * sw + kw * dw, o)))
                        * cast(acc_dt, w[(c, 0, kh, kw, 0, o)]), axis=red)
    else:
        icb, ii = reduce_axis(g.icbg, "icb"), reduce_axis(g.ib, "ii")
        red = [icb, kh, kw, ii]

        def acc_body(n, c, oh, ow, o):
            return sum_(cast(acc_dt, xp((n, icb, oh * sh + kh * dh, ow * sw + kw * dw, ii)))
                        * cast(acc_dt, w[(c, icb, kh, kw, ii, o)]), axis=red)
    acc = compute((g.n, g.ocb, *g.out, g.ob), acc_body, "acc")

    def out_body(n, c, oh, ow, o):
        a = acc[(n, c, oh, ow, o)]
        if b is not None:
            a = a + cast(acc_dt, b[(c, o)])
        return cast(dt, a)
    out = compute((g.n, g.ocb, *g.out, g.ob), out_body, "conv", dt)
    vbytes = vector_lanes(acc_dt.itemsize) * acc_dt.itemsize
    reg_w, oc_v = plan_tile(g, vbytes)
    work = g.macs()

    def schedule(sch, outputs):
        final = out
        if sch[out].attach == "inline" and outputs and tuple(outputs[0].shape) == tuple(out.shape):
            final = outputs[0]              # an elementwise epilogue fused after the conv
        so = sch[final]
        n, c, oh, ow, o = so.axis
        co, ci = so.split(c, oc_v)
        wo, wi = so.split(ow, reg_w)
        so.reorder(n, co, oh, wo, ci, wi, o)
        top = so.fuse(n, co, oh)
        if parallel_worth(work, "depthwise" if g.depthwise else "conv"):
            so.parallel(top)
        so.vectorize(o)
        # the register tile: the accumulators of (reg_w columns x oc_v channel blocks)
        sa = sch[acc]
        sa.compute_at(so, wo)
        an, ac, ah, aw, ao = sa.axis
        sa.reorder(an, ah, *sa.reduce_axis, aw, ac, ao)
        if g.depthwise:
            for k in sa.reduce_axis:
                sa.unroll(k)
        sa.unroll(aw)
        sa.unroll(ac)
        sa.vectorize(ao)
        if xpad is not None:
            _rows_schedule(sch[xpad], math.prod(xpad.shape), 3)

    ctx.schedule(schedule)
    return out



@lowering("MaxPoolNCHWc", domain=DOMAIN)
def _max_pool_lower(ctx, x):
    n, cb, h, w, blk = x.shape
    win = window(ctx, [h, w], [int(k) for k in ctx.attr("kernel_shape")])
    (sh, sw), (dh, dw), (pt, pl) = win.strides, win.dilations, [int(b) for b in win.begin]
    kh, kw = reduce_axis(win.kernel[0], "kh"), reduce_axis(win.kernel[1], "kw")
    lowest = const(-math.inf, x.dtype)

    def body(n_, c, oh, ow, o):
        r, s_ = oh * sh + kh * dh - pt, ow * sw + kw * dw - pl
        ok = (r >= 0) & (r < h) & (s_ >= 0) & (s_ < w)     # uniform over the vectorized lanes
        return rmax(select(ok, x[(n_, c, r, s_, o)], lowest), [kh, kw])
    out = compute(ctx.out_shape(), body, "maxpool_nchwc", x.dtype)
    work = math.prod(out.shape) * win.kernel[0] * win.kernel[1]

    def schedule(sch, outputs):
        st = sch[out]
        a_n, a_c, a_h, a_w, a_o = st.axis
        r_h, r_w = st.reduce_axis
        st.reorder(a_n, a_c, a_h, a_w, r_h, r_w, a_o)
        top = st.fuse(a_n, a_c, a_h)
        if parallel_worth(work) and top.arg.dom[1] > 1:
            st.parallel(top)
        if win.kernel[0] * win.kernel[1] <= 16:
            st.unroll(r_h)
            st.unroll(r_w)
        if blk >= 4:
            st.vectorize(a_o)
    ctx.schedule(schedule)
    return out
