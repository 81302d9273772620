"""Lowerings of the blocked-layout ops (kiln.ops.layout, cpu target): ToNCHWc, FromNCHWc,
ConvNCHWc, MaxPoolNCHWc, GlobalAveragePoolNCHWc.

The native lowering vectorizes over the output-channel block (one vector
register: ob = vector lanes, as TVM's conv2d_NCHWc and oneDNN's blocked
convolutions do), with a register tile of output columns x channel blocks:
each input element is broadcast once per tile and multiplied into every
channel vector, and each weight vector is reused across the tile's columns.
"""

from __future__ import annotations

import functools
import math
import operator

import numpy as np

from kiln.codegen.c import STACK_LIMIT
from kiln.dtypes import DType
from kiln.loops import cast, compute, const, reduce_axis, rmax, select, sum_
from kiln.lower.decisions import Ints, OneOf, declare
from kiln.loops.symbols import hint, static
from kiln.lower import narrow_convert
from kiln.lower.nnutil import parallel_worth
from kiln.ops.layout import _block_attr, blocked_geom, BlockedGeom, conversion_pads, DOMAIN, rotated_lane
from kiln.ops.nn import window
from kiln.lower.context import lowering
from kiln.targets.target import Target


def _rows_schedule(stage, work: int, lead: int, target: Target) -> None:
    """Fuse the first `lead` axes (parallel when there is work) and vectorize the rest as one run."""
    axes = list(stage.axis)
    outer = stage.fuse(*axes[:lead])
    inner = stage.fuse(*axes[lead:])
    if hint(inner.arg.dom[1]) >= 4:
        stage.vectorize(inner)
    if parallel_worth(work, target) and hint(outer.arg.dom[1]) > 1:
        stage.parallel(outer)


@lowering("ToNCHWc", domain=DOMAIN)
def _to_lower(ctx, x):
    block = _block_attr(ctx)
    c = x.shape[1]
    rank = len(x.shape) - 2
    pads = conversion_pads(ctx, rank)
    if 1 < block < ctx.target.vector_lanes(4) and narrow_convert.fits(x, block, x.dtype is DType.float32):
        # a few channels (a stem conv's input, its padding too): the vectorized interleave
        # (the scheduled copy below stores an element at a time: kiln.lower.narrow_convert)
        return narrow_convert.narrow_to_blocked(ctx, x, pads, ctx.target.vector_lanes(4))

    def body(n, cb, *rest):
        ch = cb * block + rest[-1]
        sp = [r - pads[i] for i, r in enumerate(rest[:-1])]
        v = x[(n, ch, *sp)]
        ok = None if c % block == 0 else ch < c
        for i, s in enumerate(sp):
            if pads[i] or pads[rank + i]:
                inside = (s >= 0) & (s < x.shape[2 + i])
                ok = inside if ok is None else ok & inside
        return v if ok is None else select(ok, v, const(0, x.dtype))
    out = compute(ctx.out_shape(), body, "to_nchwc", x.dtype)
    work = math.prod(out.shape)
    if block >= 4 or len(out.shape) < 4:
        # (n, block, rows) outer, a row of spatial x lanes inner: reads run along the row
        ctx.schedule(lambda sch, outs: _rows_schedule(sch[outs[0]], work, len(out.shape) - 2, ctx.target))
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
        if parallel_worth(work, ctx.target) and hint(outer.arg.dom[1]) > 1:
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
        ctx.schedule(lambda sch, outs: _rows_schedule(sch[outs[0]], work, 2, ctx.target))
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
        if parallel_worth(work, ctx.target) and hint(top.arg.dom[1]) > 1:
            st.parallel(top)
    ctx.schedule(rows)
    return out


VECTOR_REGISTERS = {64: 32, 32: 16, 16: 16}    # x86 vector registers by vector bytes (no target given)
# the register tile's decisions (kiln.lower.decisions), picked by plan_tile's heuristic
NCHWC_REG_W = declare("nchwc.reg_w", Ints(1), None, "output columns of one register tile")
NCHWC_OC_V = declare("nchwc.oc_v", Ints(1, 8), None, "channel blocks of one register tile")
NCHWC_UNROLL_TAPS = declare("nchwc.unroll_taps", Ints(0, 2), None,
                            "kernel axes (innermost first) a rotated conv's tile unrolls")
# A tile's columns each broadcast from their own input address, and GCC keeps one integer
# register per column's offset: past ~14 columns it spills them and reloads one per FMA (a 28x1
# tile's inner loop reloaded 17 of its 28 offsets from the stack). No tile is wider: measured,
# one thread on the AVX-512 Zen 4, tiles of one channel block (oc_v 1, all an output of 16
# channels allows) 28 -> 14 columns: a 1-channel 3x3 conv on 28x28 at batch 8 34.6 -> 24.9 us,
# 16 -> 16 3x3 on 56x56 172 -> 156 us, 32 -> 16 1x1 on 112x112 130 -> 125 us. (Depthwise tiles
# were already capped here: the widest measured.)
MAX_COLUMNS = 14


def plan_tile(g: BlockedGeom, vbytes: int, knobs: dict | None = None, regs: int | None = None,
              in_place: bool = False, max_cols: int = MAX_COLUMNS) -> tuple[int, int]:
    """(reg_w, oc_v): output columns x channel blocks of one register tile.

    Per input channel the tile loads reg_w broadcasts and oc_v weight vectors for
    reg_w * oc_v FMAs into accumulators that stay in vector registers: at most 4 fewer
    than the register file (28 of AVX-512's 32; one of them may spill, measured no slower
    than smaller tiles, and 4x4/14x2 tiles measured 1.3x slower than 7x4 on 56- and
    28-wide outputs), and at most MAX_COLUMNS columns (an integer register each for its
    broadcasts' address; `max_cols`: NARROW_MAX_COLUMNS for a narrow input's conv). Depthwise tiles read their taps' weights from L1 (a memory operand
    of each FMA) rather than holding them in registers, which left AVX2 one or two
    accumulators on 7- and 14-wide outputs: a chain of dependent FMAs at the FMA's
    latency (mobilenetv2's depthwise convs 3.31 -> 2.37 ms with 7 columns instead of 1).
    The last tile of a row may run past the output width into columns that are computed and
    thrown away (a 1-D conv's 398 or 1599 columns would otherwise get 2- or 13-column tiles:
    1599 = 3 x 13 x 41, its 13x2 tile measured 1.3x slower than 7x4), so a tile's cost is its
    loads per FMA times the columns computed per column kept, and 2% more when the conv
    could read its input in place but the tile needs a padded copy of it (`in_place`: a
    copy of the input costs about 1/OC of the convolution). The cheapest wins (ties: more
    accumulators, to cover the FMA latency). A rotated conv's tile (columns x lane rotations)
    takes rotated_columns. `regs`: the target's vector registers (default: x86's for `vbytes`).
    """
    knobs = dict(knobs or {})
    regs = regs or VECTOR_REGISTERS.get(vbytes, 16)
    ow = g.out[1]
    best = None
    for r in range(1, ow + 1):
        for v in [1] if g.depthwise else [v for v in range(1, 5) if g.ocb // g.groups % v == 0]:
            fits = r * v <= regs - 4 and r <= max_cols
            if not fits and r > 1:
                continue
            waste = -(-ow // r) * r / ow
            copy = 1.02 if in_place and ow % r and not g.depthwise else 1.0
            key = (copy * waste * (1 + 0.5 * (r + v) / (r * v)), -r * v)
            if best is None or key < best[0]:
                best = (key, r, v)
    _, r, v = best
    if g.rotate > 1:
        r = min(ow, rotated_columns(g.rotate, regs))
    r, v = int(knobs.get("reg_w", NCHWC_REG_W.asked() or r)), int(knobs.get("oc_v", NCHWC_OC_V.asked() or v))
    if g.ocb // g.groups % v or (g.depthwise and v != 1):
        raise NCHWC_OC_V.illegal(v, f"it must divide the {g.ocb // g.groups} channel blocks of a block group"
                                    + (" and be 1 for a depthwise convolution" if g.depthwise else ""))
    return NCHWC_REG_W.value(r), NCHWC_OC_V.value(v)


def rotated_columns(rotate: int, regs: int) -> int:
    """A rotated conv's register tile: columns of `rotate` accumulators each (one per lane
    rotation), half the `regs` vector registers in all (16 of AVX-512's 32), at least 2 columns.
    Measured one thread on the AVX-512 Zen 4 (ResNeXt-50's grouped 3x3 convs, 32 groups, a
    symbolic batch, the least of 300 runs): 4 per group at 56x56 0.28 ms with 4 columns vs
    0.34-0.43 with 2 and 7; 8 per group at 28x28 0.275 ms with 2 columns vs 0.31 with 3; 2 per
    group ties 4, 7 and 8 columns; 1 column (a chain of dependent FMAs per accumulator) took 2.5x
    as long."""
    return max(2, regs // 2 // rotate)


def scaled_weights(g: BlockedGeom, w, scale):
    """The packed weights times a per-image, per-input-channel scale: ws[n, *w's index], or
    None when the weights outnumber the input plane (then the conv scales what it reads).
    Conv(x * s) is Conv with W * s (zero padding stays zero): a squeeze-excite gate costs a
    pass over the weights (OC x IC x taps per image) instead of one over the activation
    (IC x H x W), where that is the smaller (960 -> 160 channels on a 7x7 plane is not)."""
    if math.prod(w.shape) > g.icb * g.ib * g.h * g.w:
        return None     # (a rotated conv's weights are packed by input lane: scaled as depthwise ones)
    if g.depthwise:
        return compute((g.n, *w.shape), lambda n, c, i, kh, kw, ii, o: w[(c, i, kh, kw, ii, o)]
                       * scale[(n, c, 0, 0, o)], "wscaled", w.dtype)
    return compute((g.n, *w.shape), lambda n, c, i, kh, kw, ii, o: w[(c, i, kh, kw, ii, o)]
                   * scale[(n, in_block(g, c, i), 0, 0, ii)], "wscaled", w.dtype)


def in_block(g: BlockedGeom, c, i):
    """The input block that output block c reads as its i-th (its block group's, kiln.ops.layout)."""
    return i if g.groups == 1 else (c // (g.ocb // g.groups)) * g.icbg + i


def column_chunk(g: BlockedGeom, reg_w: int, itemsize: int, target: Target) -> int | None:
    """Register tiles per chunk of an output row, when a row reads many input rows at once:
    the tiles then go chunk by chunk, every channel block over a chunk, so the chunk's input
    (at most a quarter of L2) is read from L2 once per block instead of many long rows streamed
    from L3 (a 1-D conv is one long row: 512 channels x 3199 samples k3 s2, 32 rows of input,
    ran at 70 GFLOP/s one thread, 97 in chunks, its 399-sample version at 95; 128 channels,
    8 rows, ran at 98 unchunked and slower in chunks). The chunks split the row's tiles evenly
    (the last chunk's extra tiles are computed and thrown away). None: no chunks (depthwise,
    fewer than 16 input rows, or a row's input within a quarter of L2)."""
    per_col = g.icbg * g.ib * itemsize * g.strides[1] * g.kernel[0]     # input bytes per output column
    budget = target.l2_bytes // 4
    if g.depthwise or g.icbg * g.kernel[0] < 16 or per_col * g.out[1] <= budget:
        return None
    tiles = -(-g.out[1] // reg_w)
    chunks = -(-tiles // max(1, budget // (per_col * reg_w)))
    return -(-tiles // chunks)


# Weight prefetch (kiln.loops Stage.prefetch): a conv's weights are read from memory the first
# time each is used in an inference (a model's weights do not stay in cache between runs), in
# the first register tiles of each channel group, whose multiply-adds then wait on memory
# while the hardware prefetcher, which stops at each 4 KiB page, ramps up again. A tile asks
# for each weight vector stream PREFETCH_BYTES ahead of the one it multiplies (one hint per
# output block and input lane): measured one thread, thread CPU time, ResNet-50 and
# ResNeXt-50 at batch 1 on the AVX-512 Sapphire Rapids (1 KiB ahead on every dense conv):
# 7% less time (512 and 2 KiB ahead about the same).
PREFETCH_BYTES = 1024
NCHWC_PREFETCH = declare("nchwc.prefetch", Ints(0), None,
                         "iterations of a dense conv tile's innermost reduction loop (one weight vector "
                         "each) its weights are prefetched ahead (0: none)")


def prefetch_ahead(g: BlockedGeom, w_bytes: int, itemsize: int, target: Target) -> int:
    """Iterations of the tile's input-lane loop (one weight vector per output block each) that
    the weights are prefetched ahead: PREFETCH_BYTES, where they exceed L1 (else 0: they stay
    there between tiles)."""
    if g.depthwise or g.rotate > 1 or w_bytes <= target.l1d_bytes:
        return 0
    return max(1, PREFETCH_BYTES // (g.ob * itemsize))


# A grouped conv copies the window its register tile reads (kernel rows x the tile's columns x
# the group's input blocks, a few KB) just before the tile, where it copied the whole padded input
# first: that copy went to memory and came back. One thread, thread CPU time, default vs
# nchwc.tile_pad=0 interleaved, batch 4 (1): ResNeXt-50's 512-channel 28x28 stride-2 conv (a 6.9
# MB copy at batch 4) 1.40 -> 1.01 ms (0.365 -> 0.269), 1024-channel 14x14 stride 2 1.06 -> 0.88
# (0.277 -> 0.237), the stride-1 512 at 14x14 0.88 -> 0.79, 1024 at 7x7 0.81 -> 0.77; in the model at
# batch 4, blocks.7's 2.27 -> 1.43 ms. A grouped tile reads its own group's few blocks, so each is
# copied about once per output row; a dense tile would copy every input block once per output
# channel group. Rotated convs (a few channels per group, read through a select) stay as they
# are: a tile's copy made ResNeXt's 4-per-group 56x56 conv 0.99 -> 1.21 ms, 8 per group neutral.
# A window past a quarter of L1 (or the stack's limit) is not copied per tile.
NCHWC_TILE_PAD = declare("nchwc.tile_pad", OneOf((0, 1)), None,
                         "1: each register tile copies the padded window it reads (grouped convs); "
                         "0: the whole padded input is copied once before the conv")


def tile_window(g: BlockedGeom, reg_w: int, itemsize: int) -> int:
    """Bytes of the padded input one register tile of `reg_w` columns reads: the kernel's rows x
    the columns its windows span x the input blocks of its group."""
    rows = (g.kernel[0] - 1) * g.dil[0] + 1
    cols = (reg_w - 1) * g.strides[1] + (g.kernel[1] - 1) * g.dil[1] + 1
    return g.icbg * rows * cols * g.ib * itemsize


# The input a 1x1 conv's tile reads next: per input channel block, a register tile broadcasts
# from reg_w pixels of one plane (a line each), the next block's a plane further on (another
# page), which the hardware prefetcher does not follow: the lines come from L3, or from the other
# core's L2 where it wrote them, as the multiply-adds wait. The tile hints the next block's lines
# (one per column) at each block. One thread, thread CPU time, in-process A/B (decision_ab,
# ResNeXt-50 batch 4, 6 x 3 runs, load 2.6): its 1x1 convs 3-8% faster (stage 3/4 4.99 -> 4.78,
# 5.52 -> 5.09 ms, the stride-2 downsampling 5.17 -> 4.84); on the stem (7x7 of 3 channels) it
# cost 8% (6.77 -> 7.34), so 1x1 convs only.
NCHWC_PREFETCH_INPUT = declare("nchwc.prefetch_input", Ints(0), None,
                               "input channel blocks ahead a dense conv tile hints the input it will read "
                               "(0: none)")


def prefetch_input(g: BlockedGeom) -> int:
    """1 (the next input block) for a dense 1x1 conv (see NCHWC_PREFETCH_INPUT), else 0."""
    return int(not g.depthwise and g.groups == 1 and tuple(g.kernel) == (1, 1) and g.icbg > 1)


# The next channel group's weights: a tile's first output row of a group waits for the group's
# weights from memory (one core reads ~12 GB/s there) while its other rows multiply them from
# cache, so the multiply-adds and the stream do not overlap. Where a group's weights take at
# most a quarter of L2 (the next group's fit beside them), each output row hints one of the next
# group's channel blocks (the row's index modulo the tile's blocks) into L2
# (Stage.prefetch_next: one hint per input-lane step, a quarter of the tile's weight loads).
# Measured, ResNet-50 batch 1 (main 3bb54ad, the hints added to the generated C by hand, one
# thread, thread CPU time, the two libraries alternating, load 1.7-3.4; the hints in rows 1-4
# only): 512 -> 2048 1x1 of 7x7 0.90 -> 0.77 and 0.92 -> 0.80 ms, 0.86 -> 0.73; 1024 -> 2048
# stride 2 1.64 -> 1.41; 2048 -> 512 0.83 -> 0.73; 256 -> 1024 of 14x14 0.69 -> 0.66; into L1
# instead 0.90 -> 0.78, into L3 0.95 -> 0.93; 3x3 512 -> 512 of 7x7 (1.18 MB a group, twice
# what fits beside it) 2.00 -> 2.08. Only where each of the parallel loop's chunks holds two
# groups or more: a chunk of one group's rows would hint the group the next chunk holds, which
# another thread takes (threads.pool_chunks).
NCHWC_PREFETCH_NEXT = declare("nchwc.prefetch_next", Ints(0, 1), None,
                              "whether a dense conv tile hints the next channel group's weights into L2, "
                              "a channel block per output row (1) or not (0)")


def prefetch_next(g: BlockedGeom, oc_v: int, itemsize: int, target: Target) -> int:
    """1 where a "channels"-order dense conv hints the next channel group's weights (see
    NCHWC_PREFETCH_NEXT): groups of at most a quarter of L2, rows after a group's first, and
    on several cores every chunk of the parallel loop two groups or more (its iterations one
    output row of one group of one image); else 0."""
    from kiln.runtime.threads import pool_chunks  # noqa: PLC0415
    groups, rows = g.ocb // oc_v, g.out[0]
    group_bytes = oc_v * g.ob * g.icb * g.ib * g.kernel[0] * g.kernel[1] * itemsize
    if g.depthwise or g.groups != 1 or groups < 2 or rows < 2 or group_bytes > target.l2_bytes // 4:
        return 0
    if target.cores < 2:
        return 1            # one thread runs every chunk, in order
    n = g.n if static(g.n) else 1
    return int(min(hi - lo for lo, hi in pool_chunks(n * groups * rows, target.cores)) >= 2 * rows)


# A group's reduction in chunks: where the group's sums over all its output rows fit the stack (a
# plane of 7x7), the tiles sum one chunk of about K_CHUNK_BYTES of the group's weights over every
# row (kiln.loops rfactor: a chunk's register tile, added into the group's sums), then the next
# chunk, and each row hints one block of the next chunk's weights into L2 (Stage.prefetch_next
# along the input blocks), so the stream of a group's weights from memory is spread over its rows
# where it came all in the first row (whose multiply-adds then waited) and the next group's do not
# fit L2 beside them (a 3x3 512 -> 512 group: 1.18 MB; NCHWC_PREFETCH_NEXT) or belong to another
# thread's chunk. Measured one thread, thread CPU time, batch 1 in the model's order (python
# benchmarks/decision_ab.py MODEL --b '{"nchwc.k_chunk": 0}', least of 40 runs, load 6): ResNet-50's
# 3x3 512 -> 512 of 7x7 1.89-1.95 -> 1.62-1.64 ms, stride 2 from 14x14 1.95 -> 1.65, 2048 -> 512
# 1x1 0.83-0.84 -> 0.75-0.77; ResNet-18's 3x3 512 1.87-1.89 -> 1.48-1.50; chunks of 16, 64 and
# 128 KiB within 2% of 32 at 16 and 64, the 3x3s 3% slower at 128; without the hints the 1x1s
# were 11-16% slower than whole rows. On 14x14 and 28x28 planes (the sums on the heap, past L1)
# the 1x1 convs took 8-22% longer: not there.
NCHWC_K_CHUNK = declare("nchwc.k_chunk", Ints(0), None,
                        "input channel blocks per chunk of a dense conv group's reduction, every row of the "
                        "group summing one chunk before the next (0: each row its whole reduction in turn)")
K_CHUNK_BYTES = 32 * 1024


def k_chunk(g: BlockedGeom, oc_v: int, owp: int, acc_bytes: int, itemsize: int, target: Target) -> int:
    """Input blocks per chunk of a dense conv group's reduction (see NCHWC_K_CHUNK): the most that
    divide the group's input blocks with at most K_CHUNK_BYTES of weights, where the group's sums
    (oc_v blocks x every output row and column, `acc_bytes` an element) fit the stack, a group's
    weights take an eighth of L2 or more (a stream worth spreading: not a squeeze-excite's 1x1s),
    there are two chunks or more, the batch is one image (measured there only; at batch 4 the
    least of a few runs gained 5-8% and their median lost as much, loaded), and the parallel loop
    over the groups has POOL_CHUNKS iterations a core (threads.pool_chunks: as fine as the rows it
    replaces); else 0."""
    from kiln.runtime.threads import POOL_CHUNKS  # noqa: PLC0415
    if g.depthwise or g.groups != 1 or g.rotate > 1 or oc_v * g.ob * g.out[0] * owp * acc_bytes > STACK_LIMIT:
        return 0
    if not static(g.n) or g.n != 1 or (target.cores > 1 and g.ocb // oc_v < POOL_CHUNKS * target.cores):
        return 0
    per_block = oc_v * g.ob * g.ib * g.kernel[0] * g.kernel[1] * itemsize
    if per_block * g.icbg < target.l2_bytes // 8:
        return 0
    best = max(d for d in range(1, g.icbg + 1) if g.icbg % d == 0 and d * per_block <= max(K_CHUNK_BYTES, per_block))
    return best if best < g.icbg else 0


NCHWC_ORDER = declare("nchwc.order", OneOf(("channels", "rows", "groups")), None,
                      "the parallel loop's order: output channel groups outside rows (each group's "
                      "weights read once per image, the input once per group), rows outside the groups "
                      "(the input read once, the weights once per row) or the groups outside the images "
                      "(each group's weights read once for the batch, the batch's input once per group)")


def loop_order(g: BlockedGeom, oc_v: int, itemsize: int, target: Target) -> str:
    """"channels" (every row of one group of oc_v output channel blocks, then the next group),
    "rows" (every group over one output row, then the next row), both image by image, or
    "groups" (a group over every image's rows, then the next group): whichever reads fewer bytes
    from beyond L2: the input plane is read again from L2 when it fits there beside a group's
    weights, and all the weights when they fit half of it (beside a row's input and output);
    else each reading streams them again from L3 or memory. So a 1x1 conv of a plane larger
    than L2 into several channel groups reads its input once (rows outside): ResNet-50's
    downsampling 1x1 conv 256 -> 512, stride 2, of a 56x56 plane (3.2 MB read 8 times, once
    per group of 64 channels; rows outside: once, its 512 KB of weights from L2) took 2.14-2.22
    ms instead of 2.36-2.40 (one thread, thread CPU time, in the model, loaded), 256 -> 128 of
    56x56 1.94-2.06 instead of 2.06-2.14, 512 -> 128 of 28x28 1.00 instead of 1.05-1.08; 64 ->
    256 of 56x56 (802 KB, fits) stays channels outside (rows outside: the same or 4% slower)."""
    if g.depthwise or g.groups != 1:
        return "channels"
    plane = g.icb * g.ib * g.h * g.w * itemsize
    weights = g.ocb * g.ob * g.icb * g.ib * g.kernel[0] * g.kernel[1] * itemsize
    groups, rows = g.ocb // oc_v, g.out[0]
    by_channels = weights + plane * (groups if plane + weights // groups > target.l2_bytes else 1)
    by_rows = plane + weights * (rows if weights > target.l2_bytes // 2 else 1)
    order = "rows" if by_rows < by_channels else "channels"
    n = g.n if static(g.n) else 1
    if n > 1 and weights > target.l2_bytes:
        # weights larger than L2: both read them again for every image; "groups" reads each
        # group's weights once and the batch's input once, or once per group
        by_groups = weights + n * plane * (groups if n * plane + weights // groups > target.l2_bytes else 1)
        if by_groups < GROUPS_MARGIN * n * min(by_channels, by_rows):
            return "groups"
    return order


# "groups" (the channel groups outside the images) only where it reads a quarter fewer bytes from
# beyond L2: one thread, thread CPU time, ResNet-50 batch 4, in-process A/B of every conv's order
# (load 5): 512 -> 2048 1x1 of 7x7 (4 MB of weights read once instead of per image; 4.4 MB
# against 16.4 MB) 3.13 -> 2.79 ms and 3.20 -> 2.84; 3x3 512 stride 2 to 7x7 (22 MB against
# 39 MB) 7.73 -> 6.82; but 2048 -> 512 of 7x7 (the batch's input 1.6 MB re-read per group: 16.8
# MB against 17.6) 3.32 -> 3.74, and the 1x1 downsampling convs of large planes 1.16-1.28x slower.
# Only weights larger than L2: smaller ones, read again per image, come from L3 (MobileNetV2's
# 960 -> 320 of 7x7 at batch 8, 1.2 MB: 1.52 -> 1.60 ms in "groups" order, the batch's 1.5 MB of
# input then crowding L2). ResNeXt-50 batch 4: its 1024 -> 2048 of 7x7 6.15 -> 5.38 and 12.21 ->
# 10.62 for two, the model 230.05 -> 225.22 ms summed (ResNet-50: 181.06 -> 182.44 with the
# unchanged kernels 2% slower in that run; its three changed 0.90-0.92)
GROUPS_MARGIN = 0.75


ROW_TASKS_PER_THREAD = 8     # parallel tasks per thread a conv of few rows is cut into (row_parts)
ROW_PART_MIN_TILES = 4       # register tiles per task at least


def row_parts(g: BlockedGeom, reg_w: int, oc_v: int, target: Target) -> int | None:
    """Parts each output row's register tiles are cut into, as parallel tasks of their own, when a
    conv has few (image, channel-block group, row) tasks: a 1-D conv at batch 1 is one row, two
    tasks at 128 channels. A thread woken late (threads sleep between kernels) then still finds
    most of the work unclaimed (the parallel loop hands out iterations in shrinking chunks),
    where with two tasks the other thread had already taken them both and ran the kernel alone.
    About ROW_TASKS_PER_THREAD tasks per thread (half to twice that), each at least
    ROW_PART_MIN_TILES tiles, the parts equal (the last part's extra tiles are computed and thrown
    away: the count with the fewest, e.g. 6 parts of 19 tiles for 114); None: no cut (tasks
    enough, or rows too short)."""
    tasks = (g.n if isinstance(g.n, int) else 1) * (g.ocb // oc_v) * g.out[0]   # a symbolic batch: one image
    threads = max(1, target.cores)
    if threads < 2 or tasks >= ROW_TASKS_PER_THREAD * threads // 2:
        return None
    tiles = -(-g.out[1] // reg_w)
    want = -(-ROW_TASKS_PER_THREAD * threads // tasks)
    cands = range(max(2, -(-want // 2)), min(2 * want, tiles // ROW_PART_MIN_TILES) + 1)
    if not cands:
        return None
    return min(cands, key=lambda p: (p * -(-tiles // p), abs(p - want), -p))


def summed_channels(w) -> int | None:
    """The input channels a packed dense weight (OCB, ICB, KH, KW, L, L: input lane, then output
    lane) reads: up to its last input channel with a nonzero weight (at least 1), or None when
    the weights are not known at compile time. A channel past it adds zero times its input, which
    is zero (a blocked tensor's padding lanes) or, where a real channel's weights are all zero, a
    finite value (an infinite input there would make the reference's sum NaN)."""
    if w is None:
        return None
    used = np.flatnonzero(np.any(np.asarray(w) != 0, axis=(0, 2, 3, 5)).reshape(-1))
    return int(used[-1]) + 1 if used.size else 1


# The widest register tile that sums over a narrow input's used channels (_narrow_sum), and so the
# widest plan_tile gives such a conv. Its broadcasts' addresses hold k % ib, not an induction
# variable: under -fwrapv GCC then keeps an integer register per column and spills past ~8 (a
# 14-column tile of 200 -> 80 channels on 14x14 at batch 8 ran 0.47 -> 0.75 ms, one thread); 7-
# and 8-column tiles gained (24 -> 144 on 56x56 0.305 -> 0.244 ms, 40 -> 240 on 28x28 0.181 ->
# 0.155). A one-block tile loads a broadcast per FMA at any width: 7 columns instead of 14 cost
# nothing measured (240 -> 80 on 14x14 0.075-0.076 ms either way) and let 24 -> 72 on 56x56 sum
# its 24 channels (0.176 -> 0.141 ms).
NARROW_MAX_COLUMNS = 8
# ... and only where that skips at least 1/NARROW_MIN_SAVED of the padded sum (24 or 40 channels,
# not 72, 120 or 200 at 16 lanes): each step's block and lane cost integer work beside the tile's
# FMAs, which a one-block tile of 7 columns does not hide (200 -> 80 on 14x14 0.065 -> 0.09-0.11 ms)
NARROW_MIN_SAVED = 8


def _narrow_sum(g: BlockedGeom, w, reg_w: int | None = None) -> int | None:
    """The input channels a dense 1x1 conv sums over where its last block is at most half used
    (24 channels in two 16-lane blocks: 8 of 32 lanes skipped), that skipping at least
    1/NARROW_MIN_SAVED of the sum, and its register tile (reg_w columns, if given) has at most
    NARROW_MAX_COLUMNS, else None (the blocks whole)."""
    if g.depthwise or g.groups != 1 or g.rotate > 1 or tuple(g.kernel) != (1, 1) \
            or (reg_w or 0) > NARROW_MAX_COLUMNS:
        return None
    icr, padded = summed_channels(w), g.icbg * g.ib
    if icr is None or icr > (g.icbg - 1) * g.ib + g.ib // 2 or (padded - icr) * NARROW_MIN_SAVED < padded:
        return None
    return icr


@lowering("ConvNCHWc", domain=DOMAIN)
def _conv_lower(ctx, x, w, b=None, scale=None):
    g = blocked_geom(ctx, x.shape, w.shape)
    dt = x.dtype
    acc_dt = DType.float32 if dt.itemsize < 4 else dt
    ws = scaled_weights(g, w, scale) if scale is not None else None

    def wv(c, i, kh, kw, ii, o, n):
        return w[(c, i, kh, kw, ii, o)] if ws is None else ws[(n, c, i, kh, kw, ii, o)]
    pt, pl = g.begin
    sh, sw = g.strides
    dh, dw = g.dil
    # the zero border. Depthwise: read through a select (the condition is uniform over the
    # vectorized lanes; a padded copy costs as much as the convolution: measured 2-3x slower).
    # Dense: a zero-padded copy of the input (the rows and columns the windows read), so the
    # register tile's inner loop has no conditions (a select there made it 2x slower for
    # some tiles, as the C compiler did not always unswitch it)
    vbytes = ctx.target.vector_lanes(acc_dt.itemsize) * acc_dt.itemsize
    hp = (g.out[0] - 1) * sh + (g.kernel[0] - 1) * dh + 1

    def cols_read(ow):
        return (ow - 1) * sw + (g.kernel[1] - 1) * dw + 1
    in_place = not (pt or pl or hp > g.h + pt or cols_read(g.out[1]) > g.w + pl)
    # the register tile's columns; a row's last tile may run past the output (owp columns
    # computed, ow kept: see plan_tile), reading a padded copy of the input
    narrow = _narrow_sum(g, ctx.value(1)) is not None
    reg_w, oc_v = plan_tile(g, vbytes, regs=ctx.target.vector_registers, in_place=in_place,
                            max_cols=NARROW_MAX_COLUMNS if narrow else MAX_COLUMNS)
    chunk = column_chunk(g, reg_w, acc_dt.itemsize, ctx.target)
    parts = None
    if chunk is None and parallel_worth(g.macs(), ctx.target, "depthwise" if g.depthwise else "conv"):
        parts = row_parts(g, reg_w, oc_v, ctx.target)
    if parts is not None:
        chunk = -(-(-(-g.out[1] // reg_w)) // parts)
    owp = -(-g.out[1] // (reg_w * (chunk or 1))) * reg_w * (chunk or 1)
    order = NCHWC_ORDER.value(heuristic=loop_order(g, oc_v, acc_dt.itemsize, ctx.target)) if chunk is None else None
    wp = cols_read(owp)
    padded = bool(pt or pl or hp > g.h + pt or wp > g.w + pl)

    def xv(n, c, r, s, i):      # the input, times the scale when the weights do not take it
        v = x[(n, c, r, s, i)]
        return v if scale is None or ws is not None else v * scale[(n, c, 0, 0, i)]

    def border(n, c, r, s, i):
        ok = (r >= 0) & (r < g.h) & (s >= 0) & (s < g.w)
        return select(ok, xv(n, c, r, s, i), const(0, dt))
    xpad = None
    # the kernel taps a depthwise tile unrolls (all: its tile is small); a rotated conv's tile
    # (columns x rotations) unrolls a row's taps, and none at 8 or more channels per group, as GCC
    # then holds every tap's weight vectors in registers across the tile loop and spills the
    # accumulators (measured as rotated_columns: 8 per group at 28x28 0.275 ms with no tap
    # unrolled, 0.34-0.41 with a row's; 4 per group at 56x56 0.28 with a row's, 0.30-0.32 with
    # all, 0.43 with none)
    rotated = g.depthwise and g.rotate > 1
    unroll_taps = NCHWC_UNROLL_TAPS.value(0 if g.rotate >= 8 else 1) if rotated else 2
    # a dense conv scaling its input (a squeeze-excite gate the weights do not take) scales it in
    # such a copy too (unpadded: the same rows and columns), once per element, where the tile
    # multiplied at every broadcast, once per channel group: MobileNetV3-Large's 960 -> 160
    # project on 7x7 0.179 -> 0.141 ms (benchmarks/se_project.py, one thread, Sapphire Rapids)
    scaled_copy = scale is not None and ws is None
    tile_pad = padded and g.groups > 1 and NCHWC_TILE_PAD.value(
        heuristic=int(tile_window(g, reg_w, dt.itemsize) <= min(ctx.target.l1d_bytes // 4, STACK_LIMIT)))
    if tile_pad or ((padded or scaled_copy) and not g.depthwise):
        xpad = compute((g.n, g.icb, hp, wp, g.ib), lambda n, c, r, s, i: border(n, c, r - pt, s - pl, i)
                       if padded else xv(n, c, r - pt, s - pl, i), "xpad", dt)

    def xp(idx):
        n, c, r, s, i = idx
        if xpad is not None:
            return xpad[idx]
        return border(n, c, r - pt, s - pl, i) if padded else xv(n, c, r - pt, s - pl, i)

    kh, kw = reduce_axis(g.kernel[0], "kh"), reduce_axis(g.kernel[1], "kw")
    rot = None
    lanes_inner = False     # the tile's innermost reduction loop is the input lanes' (dense, blocked)
    if g.depthwise and g.rotate > 1:
        # a rotated grouped conv: per lane rotation j an accumulator of the input lanes times
        # their weights at j (the weights are packed by input lane), summed over the taps
        # unshuffled; then output lane o adds up, over j, the lane it reads at j (rotated_lane):
        # r FMAs per output and tap and r - 1 shuffles per output, where shuffling the input
        # took r - 1 per output and tap (kiln.codegen.c's permuted loads)
        red = [kh, kw]
        acc = compute((g.n, g.ocb, g.out[0], owp, g.rotate, g.ob), lambda n, c, oh, ow, j, i: sum_(
            cast(acc_dt, xp((n, c, oh * sh + kh * dh, ow * sw + kw * dw, i))) * cast(acc_dt, wv(c, j, kh, kw, 0, i, n)),
            axis=red), "acc")
        rot = compute((g.n, g.ocb, g.out[0], owp, g.ob), lambda n, c, oh, ow, o: functools.reduce(
            operator.add, [acc[(n, c, oh, ow, j, rotated_lane(o, j, g.rotate))] for j in range(g.rotate)]), "rot")
    elif g.depthwise:
        red = [kh, kw]

        def acc_body(n, c, oh, ow, o):
            return sum_(cast(acc_dt, xp((n, c, oh * sh + kh * dh, ow * sw + kw * dw, o)))
                        * cast(acc_dt, wv(c, 0, kh, kw, 0, o, n)), axis=red)
    elif narrow and (icr := _narrow_sum(g, ctx.value(1), reg_w)) is not None:
        # one axis over the used input channels (block k // ib, lane k % ib: a shift and a mask
        # per step of the tile), not the padded blocks' whole lanes
        k = reduce_axis(icr, "k")
        red = [k, kh, kw]

        def acc_body(n, c, oh, ow, o):
            i, ii = k // g.ib, k % g.ib
            return sum_(cast(acc_dt, xp((n, i, oh * sh + kh * dh, ow * sw + kw * dw, ii)))
                        * cast(acc_dt, wv(c, i, kh, kw, ii, o, n)), axis=red)
    else:
        icb, ii = reduce_axis(g.icbg, "icb"), reduce_axis(g.ib, "ii")
        red = [icb, kh, kw, ii]
        lanes_inner = True

        def acc_body(n, c, oh, ow, o):
            return sum_(cast(acc_dt, xp((n, in_block(g, c, icb), oh * sh + kh * dh, ow * sw + kw * dw, ii)))
                        * cast(acc_dt, wv(c, icb, kh, kw, ii, o, n)), axis=red)
    if rot is None:
        acc = compute((g.n, g.ocb, g.out[0], owp, g.ob), acc_body, "acc")
    # the weights a dense tile streams, prefetched ahead in its input-lane loop (prefetch_ahead)
    ahead = 0 if not lanes_inner else NCHWC_PREFETCH.value(
        heuristic=prefetch_ahead(g, math.prod(w.shape) * w.dtype.itemsize, w.dtype.itemsize, ctx.target))
    # (the tile's weights in their packed form, one channel block per row: not a per-image scaled copy)
    nxt = bool(ahead) and order == "channels" and ws is None and rot is None and NCHWC_PREFETCH_NEXT.value(
        heuristic=prefetch_next(g, oc_v, w.dtype.itemsize, ctx.target))
    # the group's reduction in chunks of input blocks, every row over one chunk (k_chunk), where
    # the weights stream (ahead) and no next-group hint does it
    kc = 0 if not ahead or chunk is not None or order != "channels" or ws is not None else NCHWC_K_CHUNK.value(
        heuristic=0 if nxt else k_chunk(g, oc_v, owp, acc_dt.itemsize, w.dtype.itemsize, ctx.target))
    if kc and g.icbg % kc:
        raise NCHWC_K_CHUNK.illegal(kc, f"it must divide the {g.icbg} input blocks of a group")
    # the input the tile reads at the next input block, hinted (prefetch_input)
    pf_in = NCHWC_PREFETCH_INPUT.value(heuristic=prefetch_input(g)) if lanes_inner and not tile_pad else 0

    def out_body(n, c, oh, ow, o):
        a = (acc if rot is None else rot)[(n, c, oh, ow, o)]
        if b is not None:
            a = a + cast(acc_dt, b[(c, o)])
        return cast(dt, a)
    out = compute((g.n, g.ocb, *g.out, g.ob), out_body, "conv", dt)
    work = g.macs()

    def schedule(sch, outputs):
        final = out
        if sch[out].attach == "inline" and outputs and tuple(outputs[0].shape) == tuple(out.shape):
            final = outputs[0]              # an elementwise epilogue fused after the conv
        so = sch[final]
        n, c, oh, ow, o = so.axis
        co, ci = so.split(c, oc_v)
        wo, wi = so.split(ow, reg_w)
        if kc:      # a group's rows computed together, chunk by chunk of its reduction (k_chunk)
            so.reorder(n, co, oh, wo, ci, wi, o)
            top = so.fuse(n, co)
        elif chunk is None and order == "channels":
            so.reorder(n, co, oh, wo, ci, wi, o)
            top = so.fuse(n, co, oh)
        elif chunk is None and order == "groups":     # the groups outside the images (loop_order)
            so.reorder(co, n, oh, wo, ci, wi, o)
            top = so.fuse(co, n, oh)
        elif chunk is None:     # rows outside the channel groups (loop_order)
            so.reorder(n, oh, co, wo, ci, wi, o)
            top = so.fuse(n, oh, co)
        else:   # a chunk of a row's tiles, every channel block over it (column_chunk, row_parts)
            wc, wo = so.split(wo, chunk)
            so.reorder(n, oh, wc, co, wo, ci, wi, o)
            top = so.fuse(n, oh, wc, co)
        # (a 1x1 conv on a few pixels, a squeeze-excite block's, is bound by reading its weights)
        if parallel_worth(work, ctx.target, "depthwise" if g.depthwise else "conv", streamed=math.prod(w.shape)):
            so.parallel(top)
        so.vectorize(o)
        # the register tile: the accumulators of (reg_w columns x oc_v channel blocks)
        if rot is not None:     # the rotations' sum, vector by vector (shuffles)
            sr = sch[rot]
            sr.compute_at(so, wo)
            rn, rc, rh, rw, ro = sr.axis
            sr.unroll(rw)
            sr.unroll(rc)
            sr.vectorize(ro)
        sa = sch[acc]
        if kc:
            # the group's sums over chunks of kc input blocks: a register tile sums one chunk
            # (acc.rf, at the tile's columns) and adds it into the group's sums (acc, all its rows)
            rf = sch.rfactor(acc, sa.split(sa.reduce_axis[0], kc)[0])
            sa.compute_at(so, top)
            _, _, ah, aw, ao = sa.axis
            awo, awi = sa.split(aw, reg_w)
            sa.reorder(sa.axis[0], sa.reduce_axis[0], ah, awo, awi, sa.axis[1], ao)
            sa.unroll(awi)
            sa.unroll(sa.axis[1])
            sa.vectorize(ao)
            sa = sch[rf]
            sa.compute_at(sch[acc], awo)
            _, an, ac, ah, aw, ao = sa.axis
            sa.reorder(an, ah, *sa.reduce_axis, aw, ac, ao)
        elif rot is None:
            sa.compute_at(so, wo)
            an, ac, ah, aw, ao = sa.axis
            sa.reorder(an, ah, *sa.reduce_axis, aw, ac, ao)
        else:   # the tile's accumulators: columns x rotations
            sa.compute_at(so, wo)
            an, ac, ah, aw, aj, ao = sa.axis
            sa.reorder(an, ah, *sa.reduce_axis, aw, aj, ac, ao)
            sa.unroll(aj)
        if g.depthwise:
            for k in sa.reduce_axis[2 - unroll_taps:]:
                sa.unroll(k)
        sa.unroll(aw)
        sa.unroll(ac)
        sa.vectorize(ao)
        if ahead:
            sa.prefetch(w if ws is None else ws, sa.reduce_axis[-1], ahead)     # (ii: the innermost)
            if nxt:     # the next group's weights, a block per row (the tile's blocks: ac)
                sa.prefetch_next(w, sa.reduce_axis[-1], 0, oc_v, ac, ah)
            elif kc:    # the next chunk's, a block per row
                sa.prefetch_next(w, sa.reduce_axis[-1], 1, kc, ac, ah)
        if pf_in:
            sa.prefetch(xpad if xpad is not None else x, sa.reduce_axis[0], pf_in)
        if xpad is not None and tile_pad:     # the tile's own window, copied beside its accumulators
            sx = sch[xpad]
            sx.compute_at(sa, sa.axis[0])
            sx.vectorize(sx.axis[-1])
        elif xpad is not None:
            _rows_schedule(sch[xpad], math.prod(xpad.shape), 3, ctx.target)
        if ws is not None:
            # a dense conv's scale is per input lane ii: rows of the o lanes (the scale one value
            # over the vector), not runs of ii x o (a scale per 16 lanes: GCC left that loop
            # scalar, one element a cycle: 75K of 672 -> 112's weights per image)
            _rows_schedule(sch[ws], math.prod(ws.shape), 5 if g.depthwise else 6, ctx.target)

    ctx.schedule(schedule)
    return out


POOL_PARTIALS = declare("pool.partials", OneOf((1, 2, 4, 8)), lambda target: 4,
                        "a blocked global average's partial sums per vector of lanes (1: one sum)")


@lowering("GlobalAveragePoolNCHWc", domain=DOMAIN)
def _global_average_lower(ctx, x):
    """Per (image, channel block): the plane's rows summed into one vector of the block's
    channels (each row a contiguous run of pixels x lanes), then divided by the pixel count."""
    n, cb, h, w, blk = x.shape
    acc_dt = DType.float32 if x.dtype.itemsize < 4 else x.dtype
    kh, kw = reduce_axis(h, "kh"), reduce_axis(w, "kw")
    total = compute((n, cb, 1, 1, blk), lambda n_, c, i, j, o: sum_(cast(acc_dt, x[(n_, c, kh, kw, o)]), [kh, kw]),
                    "gsum")
    out = compute((n, cb, 1, 1, blk), lambda *i: cast(x.dtype, total[i] / const(h * w, acc_dt)), "gavg_nchwc",
                  x.dtype)
    work = math.prod(x.shape)

    def schedule(sch, outputs):
        st = sch[total]
        a = list(st.axis)
        rf, parts = None, POOL_PARTIALS.value()
        if blk >= 4 and parts > 1 and hint(w) >= 2 * parts:
            # POOL_PARTIALS sums of a row's pixels (kw mod that), so as many adds run at once
            # where one sum waits for the last add of the plane's every pixel
            rf = sch.rfactor(total, st.split(st.reduce_axis[1], parts)[1], 4)
        st.reorder(*a[:4], *st.reduce_axis, a[4])
        top = st.fuse(*a[:4])
        if blk >= 4:
            st.vectorize(a[4])
        if rf is not None:
            sr = sch[rf]
            sr.compute_at(st, top)
            rn, rc, ri, rj, ru, ro = sr.axis
            sr.reorder(rn, rc, ri, rj, *sr.reduce_axis, ru, ro)
            sr.unroll(ru)
            sr.vectorize(ro)
        if parallel_worth(work, ctx.target, "sum") and hint(top.arg.dom[1]) > 1:
            st.parallel(top)
        _rows_schedule(sch[out], 0, 4, ctx.target)
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
        if parallel_worth(work, ctx.target) and hint(top.arg.dom[1]) > 1:
            st.parallel(top)
        if win.kernel[0] * win.kernel[1] <= 16:
            st.unroll(r_h)
            st.unroll(r_w)
        if blk >= 4:
            st.vectorize(a_o)
    ctx.schedule(schedule)
    return out
