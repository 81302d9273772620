"""Convolution lowerings (cpu target): Conv, ConvInteger, QLinearConv and the conv planner.

Compute definitions say what each op computes for concrete shapes; schedules say
how. Convolutions (Conv, ConvInteger, QLinearConv) share one formulation,
`conv_native`, over element readers and an epilogue:

  xpad[n, c, phase..., f]  the padded input, split into stride phases and flat, so
                           a kernel tap reads a contiguous run of it (skipped when
                           the input itself is that plane: 1x1, stride 1, no pads);
  acc[n, g, cb, j, b, t]   the sum over (input channel, taps) at flat output position
                           q = b * rows * pstr[0] + t of row block b; the plane's rows
                           are a few columns wider than the output (those columns are
                           computed and thrown away), so the vectorized t loop reads
                           xpad contiguously whatever the stride or dilation;
  conv[n, oc, o...]        acc at the output positions, through the epilogue (bias,
                           requantization; a fused ReLU/Add lands here too).

The schedule (see `plan_conv`): the output's tiles (image, row block, channel block)
run in parallel; each computes its acc block locally in register blocks (channels x
vectors of t, a small local array the C compiler keeps in registers), looping t
outside and channels inside so an input block is reused by every channel block, and
writes its output rows from it. Depthwise convolutions go per (image, channel), with
that channel's plane made in place. Pools read the same plane.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kiln.dtypes import DType
from kiln.loops import (cast, compute, const, max_, min_, reduce_axis, select,
                        sum_)
from kiln.loops.symbols import hint
from kiln.lower import window_symbolic
from kiln.lower.decisions import Ints, declare
from kiln.lower.window_symbolic import symbolic_spatial
from kiln.lower.nnutil import _acc_dtype, _conj, _rup, _strides_of, parallel_worth
from kiln.ops.nn import kernel_of, window
from kiln.lower.context import lowering
from kiln.targets.target import Target


@dataclass
class ConvPlan:
    """How a convolution is tiled (see conv_native)."""
    oct: int          # output channels per register block
    qv: int           # vectors along q per register block
    qt: int           # q per register block (qv * lanes)
    rows: int         # output rows (first spatial dim) per tile
    block: int        # q computed per tile (whole register blocks; may overlap the next tile)
    q_alloc: int      # q extent of the accumulator (last tile's end)
    ocb: int          # output channels per tile (a multiple of oct)
    direct: bool      # read the input in place (no padded plane)


# the planner's decisions (kiln.lower.decisions): its heuristic picks each; a tuner or a test
# overrides them (kiln.compile(..., decisions={"conv.oct": 4}))
CONV_OCT = declare("conv.oct", Ints(1, 64), None, "output channels per register block")
CONV_QV = declare("conv.qv", Ints(1, 16), None, "vectors along the flat spatial axis per register block")
CONV_ROWS = declare("conv.rows", Ints(1), None, "output rows (first spatial dim) per tile")
CONV_OCB = declare("conv.ocb", Ints(1), None, "output channels per tile (a multiple of conv.oct)")
PLANE_PARALLEL_MIN = 1 << 17  # padded-plane elements below which it is built serially


def acc_tile_bytes(target: Target) -> int:
    """The most a tile's accumulator block may take: a quarter of the target's L2, so it stays
    there beside the input rows and weights it reads (256 KiB measured best on a 1 MiB-L2
    EPYC, the host these tiles were tuned on)."""
    return target.l2_bytes // 4


def plan_conv(g: "ConvGeom", target: Target, acc_bytes: int, knobs: dict | None = None) -> ConvPlan:
    """Register block and tile sizes for `target`: heuristics over its register file, L2,
    cores and the shapes.

    A tile is (image, block of output rows, block of output channels); its accumulator is
    local. Rows per tile are chosen so that the tile's q range is whole register blocks with
    little overlap; channels per tile so that there are a few tiles per thread.
    """
    knobs = dict(knobs or {})
    for key, d in (("oct", CONV_OCT), ("qv", CONV_QV), ("rows", CONV_ROWS), ("ocb", CONV_OCB)):
        if d.asked() is not None:
            knobs[key] = d.asked()
    lanes = target.vector_lanes(acc_bytes)
    big = target.vector_registers >= 32     # AVX-512: 32 vector registers, else 16
    threads = target.cores
    rowlen, oh = g.pstr[0], g.out[0]
    inner_span = sum((o - 1) * p for o, p in zip(g.out[1:], g.pstr[1:])) + 1

    def span(r):                            # flat q extent of r output rows
        return (r - 1) * rowlen + inner_span
    # register blocks (channels, vectors) and their relative cost per useful FMA: enough
    # independent accumulators to cover the FMA latency, few loads per FMA (measured)
    if g.ocg < 4:                           # depthwise-like: one channel, a long run of q
        blocks = [(1, 4, 1.0)] if big else [(1, 2, 1.0)]
    elif big:
        blocks = [(8, 3, 1.0), (8, 2, 1.02), (4, 4, 1.06), (16, 2, 1.12), (16, 1, 1.25), (4, 2, 1.3),
                  (2, 4, 1.3), (1, 4, 1.6)]
    else:
        # 16 registers: 4 x 2 (8 accumulators, 2 loads, a broadcast) over 4 x 3, which fills
        # the file: 3x3 convs 64-256 channels at 56-14 wide 58-64 -> 65-67 GFLOP/s (AVX2 EPYC)
        blocks = [(4, 2, 1.0), (4, 3, 1.05), (6, 2, 1.08), (12, 1, 1.15), (2, 2, 1.4), (1, 2, 1.8)]
    blocks = [b for b in blocks if g.ocg % b[0] == 0] or [(1, 1, 2.0)]
    if "oct" in knobs or "qv" in knobs:
        blocks = [(int(knobs.get("oct", blocks[0][0])), int(knobs.get("qv", blocks[0][1])), 1.0)]
    best = None
    for oct_, qv, slow in blocks:
        qt = qv * lanes
        if g.ocg < 4:
            cands = [oh]
        elif "rows" in knobs:
            cands = [int(knobs["rows"])]
        else:
            cands = [r for r in range(1, oh + 1) if span(r) >= min(256, span(oh))] or [oh]
        for r in cands:
            block = _rup(span(r), qt)
            nb = -(-oh // r)
            q_alloc = (nb - 1) * r * rowlen + block
            direct = g.direct and q_alloc == g.q_len
            cost = nb * block * slow * (1.0 if direct or g.direct is False else 1.05)
            cost *= 1 + 0.02 * (block // 1024)          # big tiles spill out of L1
            key = (cost, -r)
            if best is None or key < best[0]:
                best = (key, oct_, qv, r, block, q_alloc, direct)
    _, oct_, qv, r, block, q_alloc, direct = best
    nb = -(-oh // r)
    if g.ocg < 4:
        ocb = 1
    elif "ocb" in knobs:
        ocb = int(knobs["ocb"])
    else:
        # channels per tile: the accumulator fits L2, and there are a few tiles per thread
        # (a symbolic batch: planned for one image, its smallest value; images are an outer loop)
        n = g.n if isinstance(g.n, int) else 1
        ocb = g.ocg
        while ocb % (2 * oct_) == 0 and (ocb * block * acc_bytes > acc_tile_bytes(target)
                                         or n * nb * g.group * (g.ocg // ocb) < 4 * threads):
            ocb //= 2
    chosen = ((CONV_OCT, oct_), (CONV_QV, qv), (CONV_ROWS, r), (CONV_OCB, ocb))
    for d, v in chosen:
        if d.asked() is not None and d.asked() != v:
            raise d.illegal(d.asked(), f"this convolution ({g.ocg} output channels per group) takes {v}")
    if g.ocg % oct_ or g.ocg % ocb or ocb % oct_:
        bad = CONV_OCT if CONV_OCT.asked() is not None and g.ocg % oct_ else CONV_OCB
        raise bad.illegal(bad.asked() or (oct_ if bad is CONV_OCT else ocb),
                          f"a register block of {oct_} channels must divide a tile of {ocb}, which must "
                          f"divide the {g.ocg} output channels per group")
    if r > oh:
        raise CONV_ROWS.illegal(r, f"the convolution has {oh} output rows")
    for d, v in chosen:
        d.value(v)
    return ConvPlan(oct_, qv, qv * lanes, r, block, q_alloc, ocb, direct)


@dataclass
class ConvGeom:
    """Concrete geometry of an N-d convolution for the native formulation."""
    n: int
    c: int
    spatial: list
    oc: int
    kernel: list
    group: int
    strides: list
    dil: list
    begin: list
    out: list
    # read the last dim with the stride (no phase split of it): the plane's rows are
    # `stride` times wider and a tap reads every stride-th element (depthwise: a cheap
    # contiguous plane matters more than contiguous tap reads)
    cols_strided: bool = False

    def __post_init__(self):
        nd = len(self.kernel)
        self.nd = nd
        self.cg = self.c // self.group
        self.ocg = self.oc // self.group
        self.tap_off = [(k - 1) * d // s for k, d, s in zip(self.kernel, self.dil, self.strides)]
        self.plane = [o + t for o, t in zip(self.out, self.tap_off)]
        self.pstr = _strides_of(self.plane)
        res = [{(k * d) % s for k in range(kk)} for kk, d, s in zip(self.kernel, self.dil, self.strides)]
        self.nphase = [s if len(r) > 1 else 1 for r, s in zip(res, self.strides)]
        self.phase0 = [0 if len(r) > 1 else next(iter(r)) for r in res]
        self.cols_strided = self.cols_strided and self.strides[-1] > 1
        self.qscale = self.strides[-1] if self.cols_strided else 1
        if self.cols_strided:
            self.nphase[-1], self.phase0[-1] = 1, 0
        # flat strides of the padded plane (q strides times the column stride, if strided)
        self.fstr = [p * self.qscale for p in self.pstr[:-1]] + [1]
        # pointwise-like: the plane's inner dims equal the output's (no thrown-away columns)
        self.dense = all(t == 0 for t in self.tap_off[1:])
        # the input itself is the padded, phase-split plane: read it directly
        self.direct = all(s == 1 and b == 0 and k == 1 and o == i for s, b, k, o, i in
                          zip(self.strides, self.begin, self.kernel, self.out, self.spatial))

    @property
    def q_len(self) -> int:
        return self.out[0] * self.pstr[0]

    def tap_offset(self, ks):
        """Flat offset in the plane (and phase indices) of kernel tap ks (ints or Exprs)."""
        ph, off = [], 0
        for i, (k, d, s) in enumerate(zip(ks, self.dil, self.strides)):
            if self.cols_strided and i == self.nd - 1:
                ph.append(0)
                off = off + k * d
            else:
                ph.append((k * d) % s if self.nphase[i] > 1 else 0)
                off = off + ((k * d) // s) * self.fstr[i]
        return ph, off

    def flat_len(self, q_alloc: int) -> int:
        _, maxoff = self.tap_offset([k - 1 for k in self.kernel])
        return _rup(self.qscale * (q_alloc - 1) + maxoff + 1, self.fstr[0])

    def macs(self) -> int:
        return self.n * self.oc * math.prod(self.out) * self.cg * math.prod(self.kernel)


def conv_native(ctx, geom: ConvGeom, xval, wval, acc_dt: DType, epilogue, out_dt: DType,
                pad_value=None, knobs: dict | None = None):
    """Lower a convolution given element readers; returns the output Tensor (and sets the schedule).

    xval(n, c, *sp) -> Expr in acc_dt for in-bounds input positions; pad_value (acc_dt Expr)
    is what padded positions read. wval(oc, icg, *k) -> Expr in acc_dt.
    epilogue(acc, oc) -> Expr in out_dt (bias, requantization, cast).
    """
    g = geom
    if g.cg == 0:   # no input channels: every output is the epilogue of an empty sum (the bias)
        return compute((g.n, g.oc, *g.out), lambda n, o, *sp: epilogue(const(0, acc_dt), o), "conv", out_dt)
    nd = g.nd
    lanes = ctx.target.vector_lanes(acc_dt.itemsize)
    plan = plan_conv(g, ctx.target, acc_dt.itemsize, knobs)
    oct_, qt, q_alloc, direct = plan.oct, plan.qt, plan.q_alloc, plan.direct
    if g.ocg % oct_ or g.ocg % plan.ocb or plan.ocb % oct_:
        ctx.fail(f"conv plan: register block of {oct_} and tile of {plan.ocb} channels do not divide "
                 f"the {g.ocg} output channels per group")
    zero = const(0, acc_dt) if pad_value is None else pad_value

    if direct:
        xs = None

        def tap_read(n, c, ks, q):
            return xval(n, c, *([0] * (nd - 1) + [q]))     # a flat view of the spatial dims
    else:
        xs, tap_read = padded_plane(g, xval, zero, q_alloc)

    ic = reduce_axis(g.cg, "ic")
    ks = [reduce_axis(k, f"k{i}") for i, k in enumerate(g.kernel)]
    red = [ic] + ks

    def taps(n, gi, j, q):
        return tap_read(n, gi * g.cg + ic, ks, q) * wval(gi * g.ocg + j, ic, *ks)

    # acc[n, g, j, b, t]: flat position q = b * rows * pstr[0] + t of row block b. Blocks are
    # whole register blocks long (they may overlap the next one), and indexed from their own
    # start, so every tile's region starts at 0 and its loops need no guards
    # Channels likewise: j = c * ocb + jj for channel block c (one block per group if group > 1)
    nb, bstride = -(-g.out[0] // plan.rows), plan.rows * g.pstr[0]
    ocb = plan.ocb if g.group == 1 else g.ocg
    acc = compute((g.n, g.group, g.ocg // ocb, ocb, nb, plan.block),
                  lambda n, gi, c, jj, b, t: sum_(taps(n, gi, c * ocb + jj, b * bstride + t), axis=red), "acc")
    last = g.out[-1]

    def out_body(n, o, *sp):
        gj = (0, o // ocb, o % ocb) if g.group == 1 else (o // g.ocg, 0, o % g.ocg)
        rb, ri = (0, sp[0]) if nb == 1 else (sp[0] // plan.rows, sp[0] % plan.rows)
        t = ri * g.pstr[0] + sum(i * p for i, p in zip(sp[1:], g.pstr[1:]))
        # `sp[-1] < last` always holds (the simplifier removes the select); the other branch
        # tells bound inference that a tile reads its block to the end (whole register blocks)
        a = select(sp[-1] < last, acc[(n, *gj, rb, t)], acc[(n, *gj, rb, plan.block - 1)])
        return epilogue(a, o)
    out = compute((g.n, g.oc, *g.out), out_body, "conv", out_dt)
    if out.dtype is not out_dt:
        ctx.fail(f"conv epilogue gives {out.dtype}, expected {out_dt}")
    work = g.macs()
    depthwise = g.ocg < 4

    def schedule(sch, outputs):
        par_ok = parallel_worth(work, ctx.target, "depthwise" if depthwise else "conv")
        final = out
        if sch[out].attach == "inline" and outputs and tuple(outputs[0].shape) == tuple(out.shape):
            final = outputs[0]              # an elementwise epilogue fused after the conv
        # the register block: a small local array the C compiler keeps in registers over the
        # reduction loops (a tile-sized or heap buffer it would load and store every step).
        # Depthwise: the few taps are unrolled, so the compiler keeps the accumulators in
        # registers across them anyway, and the channel's padded plane can be computed in
        # the accumulator's loop
        blk = None if depthwise else sch.cache_write(acc)
        so = sch[final]
        oax = list(so.axis)
        sp = oax[2:]
        if depthwise:
            # per (image, channel): its padded plane, the accumulation, the output rows
            top = so.fuse(oax[0], oax[1])
        else:
            # a tile: (image, block of rows, block of channels); channels are split per group
            # first so that the group and channel-in-group indices stay affine
            rb, ri = so.split(sp[0], plan.rows)
            if g.group > 1:
                go, oj = so.split(oax[1], g.ocg)
                so.reorder(oax[0], rb, go, oj, ri)
                top = so.fuse(oax[0], rb, go)
            else:
                cb, ci = so.split(oax[1], plan.ocb)
                so.reorder(oax[0], rb, cb, ci, ri)
                top = so.fuse(oax[0], rb, cb)
        if par_ok:
            so.parallel(top)
        vec = so.leaves[-1]
        if vec.arg.dom[1] >= 4:
            so.vectorize(vec)
        # the tile's accumulator: register blocks (q outer, channels inner: a block of the
        # input is reused by every channel block) copied out
        sa = sch[acc]
        sa.compute_at(so, top)
        an, ag, _, aj, ab, aq = sa.axis
        qo, qi = sa.split(aq, qt)
        jo, ji = sa.split(aj, oct_)
        if blk is None:
            sa.reorder(an, ag, ab, qo, jo, *sa.reduce_axis, ji, qi)
            if math.prod(g.kernel) <= 32:
                for k in sa.reduce_axis[1:]:
                    sa.unroll(k)
            sa.unroll(ji)
            sa.vectorize(qi)
        else:
            sa.reorder(an, ag, ab, qo, jo, ji, qi)
            sa.vectorize(qi)
            sl = sch[blk]
            sl.compute_at(sa, jo)
            ln, lg, lc, lj, lb, lq = sl.axis
            sl.reorder(ln, lg, lc, lb, *sl.reduce_axis, lj, lq)
            _unroll_taps(sl, g)
            sl.unroll(lj)
            sl.vectorize(lq)
        if xs is not None:
            if depthwise:
                sch[xs].compute_at(sa, an)
                schedule_plane(sch[xs], g, False, fuse_lead=False)
            else:
                # a small plane is copied serially: a parallel region costs more than the copy
                schedule_plane(sch[xs], g, par_ok and hint(math.prod(xs.shape)) >= PLANE_PARALLEL_MIN)

    ctx.schedule(schedule)
    return out


def padded_plane(g: ConvGeom, xval, pad, q_alloc: int):
    """The input zero- (or `pad`-) padded, split into stride phases and flattened per (n, c):
    xpad[n, c, phase..., f]. Returns it and `tap_read(n, c, ks, q)`, the value kernel tap ks
    (Exprs, one per spatial dim) sees at flat output position q (q = sum o_i * pstr_i)."""
    nd = g.nd
    flen = g.flat_len(q_alloc)

    def body(n, c, *rest):
        ph, f = rest[:nd], rest[nd]
        rows = [f // g.fstr[0]] + [(f % g.fstr[i - 1]) // g.fstr[i] for i in range(1, nd)]
        pos, ok = [], []
        for i in range(nd):
            if g.cols_strided and i == nd - 1:
                p = rows[i] - g.begin[i]
            else:
                p = rows[i] * g.strides[i] + (ph[i] if g.nphase[i] > 1 else g.phase0[i]) - g.begin[i]
            ok += [p >= 0, p < g.spatial[i]]
            pos.append(p)
        # the load happens only where `ok` holds (C evaluates one branch; vectorized, a
        # masked load), so the index needs no clamping
        return select(_conj(ok), xval(n, c, *pos), pad)
    xs = compute((g.n, g.c, *g.nphase, flen), body, "xpad")

    def tap_read(n, c, ks, q):
        ph, off = g.tap_offset(ks)
        return xs[(n, c, *ph, q * g.qscale + off if g.qscale > 1 else q + off)]
    return xs, tap_read


def schedule_plane(stage, g: ConvGeom, par_ok: bool, fuse_lead: bool = True):
    """Rows of the padded plane: (n, c) parallel, the flat axis split back into rows (so the
    row/column arithmetic simplifies away) with the last one vectorized."""
    ax = list(stage.axis)
    f = ax[-1]
    for i in range(g.nd - 1):
        _, f = stage.split(f, g.fstr[i])
    if fuse_lead:
        lead = stage.fuse(*ax[:2])
        if par_ok:
            stage.parallel(lead)
    stage.vectorize(f)


def _unroll_taps(stage, g: ConvGeom):
    """Unroll the kernel-tap loops when there are few taps (else the innermost, when short)."""
    ks = stage.reduce_axis[1:]
    if ks and math.prod(g.kernel) <= 9:
        for k in ks:
            stage.unroll(k)
    elif ks and g.kernel[-1] <= 7:
        stage.unroll(ks[-1])


def _conv_geom(ctx, xshape, wshape, group: int) -> ConvGeom:
    nd = len(xshape) - 2
    kern = kernel_of(ctx, wshape, nd)
    if xshape[1] != wshape[1] * group or wshape[0] % group:
        ctx.fail(f"weight shape {tuple(wshape)} does not fit input channels {xshape[1]} with group {group}")
    win = window(ctx, list(xshape[2:]), list(kern))
    depthwise = wshape[0] // group < 4
    return ConvGeom(xshape[0], xshape[1], list(xshape[2:]), wshape[0], list(kern), group,
                    win.strides, win.dilations, [int(b) for b in win.begin], [int(o) for o in win.out],
                    cols_strided=depthwise)


@lowering("Conv")
def _conv_lower(ctx, x, w, b=None):
    if symbolic_spatial(x.shape):       # a shape-generic module's symbolic image size
        return window_symbolic.conv(ctx, x, w, b)
    group = int(ctx.attr("group", 1))
    geom = _conv_geom(ctx, x.shape, w.shape, group)
    acc_dt = _acc_dtype(x.dtype)

    def xval(n, c, *sp):
        return cast(acc_dt, x[(n, c, *sp)])

    def wval(o, i, *k):
        return cast(acc_dt, w[(o, i, *k)])

    def epilogue(a, o):
        if b is not None:
            a = a + cast(acc_dt, b[o])
        return cast(x.dtype, a)
    return conv_native(ctx, geom, xval, wval, acc_dt, epilogue, x.dtype)


# ---------------------------------------------------------------- native: integer and transposed convolutions

def _first(t):
    """The single value of a scalar-like tensor (0-d, or one element)."""
    return t[(0,) * len(t.shape)]


def _per_channel(t, oc, n_oc):
    """A zero point / scale that is a scalar or one value per output channel."""
    if t is None:
        return None
    if len(t.shape) == 1 and t.shape[0] == n_oc and n_oc > 1:
        return t[oc]
    return _first(t)


@lowering("ConvInteger")
def _conv_integer_lower(ctx, x, w, xzp=None, wzp=None):
    group = int(ctx.attr("group", 1))
    geom = _conv_geom(ctx, x.shape, w.shape, group)
    i32 = DType.int32

    def xval(n, c, *sp):
        v = cast(i32, x[(n, c, *sp)])
        return v - cast(i32, _first(xzp)) if xzp is not None else v

    def wval(o, i, *k):
        v = cast(i32, w[(o, i, *k)])
        return v - cast(i32, _per_channel(wzp, o, w.shape[0])) if wzp is not None else v
    return conv_native(ctx, geom, xval, wval, i32, lambda a, o: a, i32)


@lowering("QLinearConv")
def _qlinear_conv_lower(ctx, x, xs, xzp, w, ws, wzp, ys, yzp=None, b=None):
    from kiln.loops import round_
    group = int(ctx.attr("group", 1))
    geom = _conv_geom(ctx, x.shape, w.shape, group)
    i32, f64 = DType.int32, DType.float64
    out_dt = ctx.out_dtype(0)
    m = w.shape[0]
    info = np.iinfo(out_dt.np)

    def xval(n, c, *sp):
        return cast(i32, x[(n, c, *sp)]) - cast(i32, _first(xzp))

    def wval(o, i, *k):
        return cast(i32, w[(o, i, *k)]) - cast(i32, _per_channel(wzp, o, m))

    def epilogue(a, o):
        v = cast(f64, a)
        if b is not None:
            v = v + cast(f64, b[o])
        scale = cast(f64, _first(xs)) * cast(f64, _per_channel(ws, o, m)) / cast(f64, _first(ys))
        v = round_(v * scale)
        if yzp is not None:
            v = v + cast(f64, _first(yzp))
        v = min_(max_(v, const(float(info.min), f64)), const(float(info.max), f64))
        return cast(out_dt, v)
    return conv_native(ctx, geom, xval, wval, i32, epilogue, out_dt)
