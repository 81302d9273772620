"""kiln::ConvWinograd's native kernel (cpu target): F(4x4, 3x3) or F(2x2, 3x3) (the op's `m`,
kiln.lower.conv_algo.winograd_m) on the blocked layout.

The kernel is C (kiln/codegen/c_src/winograd.c): input transform of a chunk of tiles,
the (m + 2)^2 GEMMs over those tiles in register blocks, output transform, in one pass per
task so a chunk's transformed input and the GEMMs' results stay in L2. What is chosen
here, from the `Target` and the shapes:

- the register block, TR tiles x OV channel vectors of accumulators, with OV weight
  vectors and a broadcast beside them in the register file (AVX2's 16: 4 x 3 or 6 x 2;
  AVX-512's 32: 6 x 4 or 9 x 3), the fewest loads per FMA; OV divides the output
  channel blocks;
- the chunk, T tiles (a multiple of TR; the chunks equal): when the weights fit L2, its
  buffers (transformed input and GEMM output, (m + 2)^2 T (IC + OV L) floats) take a quarter of
  the target's L2, and there are chunks for every thread when the image has the tiles;
  when the weights do not fit L2 (they stream once per chunk), one chunk if its buffers
  fit L2 (ONE_CHUNK_L2 times L2 for weights that large), else chunks of half of L2 but at
  least STREAM_MIN_TILES tiles;
- `osplit`: how many parts a chunk's output channels are cut into when there are fewer
  chunks than twice the threads (each part transforms the chunk's input again: a few
  percent of the GEMM's work, against an idle core).
"""

from __future__ import annotations

import math

from kiln.codegen.csource import c_instance, c_parallel, c_shared, c_source
from kiln.dtypes import DType
from kiln.loops.symbols import c_size, ceildiv, static
from kiln.lower.conv_algo import CONV_ALGORITHM
from kiln.lower.decisions import Ints, declare
from kiln.lower.nnutil import parallel_from
from kiln.lower.context import lowering
from kiln.ops.winograd import DOMAIN, geometry
from kiln.runtime import threads
from kiln.targets.target import Target


# The plan as decisions (the tuner's knobs; `plan` gives their defaults): the GEMM's register
# block (TR tiles x OV channel vectors), tiles per task in register blocks (the kernel's parallel
# granularity and the L2 footprint of its transformed input) and the parts a chunk's output
# channels are cut into (tasks for the threads when there are few chunks)
WG_TR = declare("winograd.tr", Ints(1, 16), lambda t: 6, "tiles per register block of the Winograd GEMM")
WG_OV = declare("winograd.ov", Ints(1, 4), lambda t: 4,
                "output channel vectors per register block of the Winograd GEMM (dividing the blocks)")
WG_BLOCKS = declare("winograd.chunk_blocks", Ints(1, 1 << 16), lambda t: 4,
                    "register blocks of tiles per Winograd task (its parallel granularity)")
WG_PREFETCH = declare("winograd.prefetch", Ints(0), None,
                      "floats ahead of each transformed-weight stream the Winograd GEMM prefetches (0: none)")
# Each register block after a transform position's first (its weights then come from cache)
# hints one of the next position's weight blocks into L2 (winograd_gemm.h's KILN_WGG_NX), as the
# blocked direct conv hints its next channel group's (kiln.lower.nchwc.NCHWC_PREFETCH_NEXT):
# where the weights stream (winograd.prefetch on)
WG_PREFETCH_NEXT = declare("winograd.prefetch_next", Ints(0, 1), None,
                           "1: the Winograd GEMM hints the next transform position's weights into L2 "
                           "while it multiplies this one's from cache (0: not)")
WG_OSPLIT = declare("winograd.osplit", Ints(1, 256), lambda t: 1,
                    "parts each Winograd chunk's output channels are cut into (tasks for threads)")


def decided(tr: int, ov: int, t: int, osplit: int, ocb: int) -> tuple[int, int, int, int]:
    """A plan's (TR, OV, T, osplit) through the decisions (the heuristic's values the defaults;
    an OV that does not divide `ocb` or an osplit past the channel groups: a KilnError naming it)."""
    tr2, ov2 = WG_TR.value(heuristic=tr), WG_OV.value(heuristic=ov)
    if ocb % ov2:
        raise WG_OV.illegal(ov2, f"it does not divide the {ocb} output channel blocks")
    blocks = WG_BLOCKS.value(heuristic=max(1, round(t / tr2)))
    split = WG_OSPLIT.value(heuristic=min(osplit, ocb // ov2))
    if split > ocb // ov2:
        raise WG_OSPLIT.illegal(split, f"more than the {ocb // ov2} groups of {ov2} output channel blocks")
    return tr2, ov2, tr2 * blocks, split


def register_tile(ocb: int, target: Target) -> tuple[int, int]:
    """(TR tiles, OV channel vectors) of the GEMM's register block for `ocb` output blocks."""
    regs = target.vector_registers
    best = None
    for ov in (4, 3, 2, 1):
        tr = min((regs - ov - 1) // ov, 12)       # accumulators + OV weight vectors + a broadcast
        if ocb % ov or tr < 1:
            continue
        loads = (tr + ov) / (tr * ov)             # loads per FMA: fewer is better
        if best is None or loads < best[0] - 1e-9:
            best = (loads, tr, ov)
    return best[1], best[2]


NATIVE_M = (4, 2)        # the output tiles the native kernel computes (winograd.c's KILN_WG_M)
STREAM_MIN_TILES = 18   # tiles per chunk at least when the weights stream from beyond L2 (see plan)
ONE_CHUNK_L2 = 2        # ... and weights this many L2s or larger stream once: one chunk while its buffers fit as much


def plan(n: int, icb: int, ocb: int, oh: int, ow: int, lanes: int, target: Target,
         m: int = 4) -> tuple[int, int, int, int]:
    """(TR, OV, T, osplit) for a ConvWinograd F(m x m, 3x3) of these sizes on `target` (see the module doc)."""
    tr, ov = register_tile(ocb, target)
    ic, npos = icb * lanes, (m + 2) ** 2
    tiles = n * (-(-oh // m)) * (-(-ow // m))
    whole = -(-tiles // tr) * tr                      # every tile in one chunk
    per_tile = npos * (ic + ov * lanes) * 4           # a tile's transformed input and GEMM output
    l2 = target.l2_bytes
    if npos * ic * ocb * lanes * 4 > l2:
        # weights larger than L2 stream from L3 or memory once per chunk: one chunk when its
        # buffers fit L2, else chunks of half of L2 but at least STREAM_MIN_TILES (the weights'
        # bytes per multiply-add fall as 4 / T). One thread, thread CPU time, caches flushed,
        # load ~10 (chunk tiles, ms): 28x28x128 54 -> 18 1.01 -> 0.97, 40x40x128 54 -> 18 1.85
        # -> 1.81; 14x14x256 18 (one chunk) 1.30, 6 1.31 (median 1.36 -> 1.57: the weights
        # three times), 12 1.60. Weights of ONE_CHUNK_L2 times L2 or more: one chunk also while
        # its buffers take up to that (they spill to L3 and come back in order; the weights
        # stream once): 4 images of 14x14x256 (9.4 MB of weights), 64 tiles (2.9 MB of buffers),
        # 3.65 ms in chunks of 18, 3.05 in chunks of 36, 2.85 in one (one thread, thread CPU
        # time, ResNet-50 b4 in one process, load 3.2-3.6)
        room = ONE_CHUNK_L2 * l2 if npos * ic * ocb * lanes * 4 >= ONE_CHUNK_L2 * l2 else l2
        t = whole if whole * per_tile <= room else max(STREAM_MIN_TILES, (l2 // 2) // per_tile // tr * tr)
    else:
        # weights that stay in L2 beside a chunk's buffers: chunks of a quarter of L2 (larger
        # ones push the weights out). 56x56x64 54 -> 12 tiles 1.11 -> 1.03 ms (warm caches 0.89
        # -> 0.72), 80x80x64 54 -> 12 2.16 -> 1.98, 160x160x32 108 -> 24 2.51 -> 2.37
        t = max(tr, (l2 // 4) // per_tile // tr * tr)
        per_thread = -(-tiles // max(target.cores, 1))
        t = min(t, -(-per_thread // tr) * tr)         # a chunk per thread at least, if there are tiles
    t = min(t, whole)
    nchunk = -(-tiles // t)
    t = ceildiv(ceildiv(tiles, nchunk), tr) * tr     # as many chunks, as equal as register blocks allow
    groups = ocb // ov
    osplit = 1 if nchunk >= 2 * target.cores else min(groups, -(-2 * target.cores // nchunk))
    osplit = balanced_osplit(tiles, t, groups, max(osplit, 1), target.cores, (2 * (m + 2) + 2) / (ocb * lanes))
    return decided(tr, ov, t, osplit, ocb)


def balanced_osplit(tiles: int, t: int, groups: int, least: int, cores: int, share: float) -> int:
    """The parts, `least` or more, that a chunk's output channel groups are cut into whose tasks
    end soonest on `cores` threads (2% sooner than fewer parts at least), the pool handing out
    its chunks of the tasks as threads come free (kiln.runtime.threads.pool_chunks, pool_span). A
    task costs its tiles times its share of the groups, plus `share` times its tiles for the input
    transform unless its range's previous task was a part of the same chunk (winograd.c). So
    chunks that do not split evenly over the threads are evened out by parts: ResNet-50 batch 4's
    14x14 convs, 64 tiles in chunks of 18, 18, 18 and 10, kept one thread on 36 tiles and the
    other on 28; in 2 parts, 32 each plus a second input transform (2 * 6 + 2 vector operations
    per tile and channel vector against the GEMMs' 36 x 256)."""
    nchunk = -(-tiles // t)

    def span(s: int) -> float:
        def cost(lo: int, hi: int) -> float:
            total, held = 0.0, -1
            for task in range(lo, hi):
                c, part = divmod(task, s)
                n = min(t, tiles - c * t)
                total += n * ((part + 1) * groups // s - part * groups // s) / groups + (n * share if c != held else 0.0)
                held = c
            return total
        return threads.pool_span([cost(lo, hi) for lo, hi in threads.pool_chunks(nchunk * s, cores)], cores)

    best, best_span = least, span(least)
    for s in range(least + 1, groups + 1):
        s_span = span(s)
        if s_span < 0.98 * best_span:
            best, best_span = s, s_span
    return best


def macs(n: int, icb: int, ocb: int, oh: int, ow: int, lanes: int, m: int = 4) -> int:
    """Multiply-adds of the GEMMs of F(m x m, 3x3) (the transforms add about a tenth at 64 channels)."""
    tiles = n * (-(-oh // m)) * (-(-ow // m))
    return (m + 2) ** 2 * tiles * icb * lanes * ocb * lanes


@lowering("ConvWinograd", domain=DOMAIN)
def _lower(ctx, x, u, b=None):
    target = Target.of(ctx.target)
    m, pads, oh, ow = geometry(ctx, x.shape, u.shape)
    if m not in NATIVE_M:
        ctx.fail(f"the native Winograd kernel computes F(4x4, 3x3) or F(2x2, 3x3), not m={m}", stage="lower")
    taken(ctx, "ConvWinograd", x, u)
    n, icb, h, w, lanes = x.shape
    ocb = u.shape[1]
    if lanes % 4:
        ctx.fail(f"ConvWinograd's channel block {lanes} is not a multiple of 4", stage="lower")
    # chunks planned for one image when the batch is symbolic (images are the kernel's outer loop)
    tr, ov, t, osplit = plan(n if static(n) else 1, icb, ocb, oh, ow, lanes, target, m)
    fn = f"kiln_winograd_f{m}_l{lanes}_r{tr}_o{ov}"
    gemm = gemm_instance(fn, lanes, tr, ov, math.prod(u.shape) * 4, target)
    fn = gemm[0][:-len("_gemm")]      # (its prefetch in the name: one shared kernel per variant)
    preamble = c_shared("winograd.c", {"KILN_WG_FN": fn, "KILN_WG_GEMM": gemm[0], "KILN_WG_M": str(m),
                                       "KILN_WG_L": str(lanes),
                                       "KILN_WG_TR": str(tr), "KILN_WG_OV": str(ov)}, fn.upper(),
                         helpers=gemm[1] + c_source("kiln_sigmoid.h") + c_parallel(target.threads_impl))
    par = parallel_from(n, lambda k: macs(k, icb, ocb, oh, ow, lanes, m), target)
    act = 1 if int(ctx.attr("relu", 0)) else 2 if int(ctx.attr("swish", 0)) else 0     # the kernel's `act`
    body = (f"  return {fn}(in0, in1, {'in2' if b is not None else 'NULL'}, out0, {c_size(n)}, {icb}, {h}, {w}, "
            f"{ocb}, {oh}, {ow}, {pads[0]}, {pads[1]}, {t}, {osplit}, {act}, {par});")
    return ctx.extern(body, [x, u, b], [(ctx.out_shape(0), ctx.out_dtype(0))], preamble=preamble,
                      errors={-1: "out of memory for the Winograd transform buffers"})


def taken(ctx, op: str, x, u) -> None:
    """What a Winograd kernel (2-D or 1-D) checks of its inputs before it is lowered: float32
    data, and the algorithm decision, recorded with the kernel's decisions. The algorithm was
    chosen by the layout pass (the weights are transformed there); another value asked of
    this kernel alone cannot be taken here."""
    if x.dtype is not DType.float32 or u.dtype is not DType.float32:
        ctx.fail(f"{op}'s native kernel takes float32, got {x.dtype} and {u.dtype}", stage="lower")
    if CONV_ALGORITHM.asked() not in (None, "winograd"):
        raise CONV_ALGORITHM.illegal(CONV_ALGORITHM.asked(), "the conv algorithm is chosen by the layout pass; "
                                     "ask it of kiln.compile (decisions={'conv.algorithm': ...}) for the model")
    CONV_ALGORITHM.value("winograd")


def gemm_instance(fn: str, lanes: int, tr: int, ov: int, u_bytes: int = 0,
                  target: Target | None = None) -> tuple[str, str]:
    """(name, text) of the batched GEMM (kiln/codegen/c_src/winograd_gemm.h) that the Winograd
    kernel `fn` (2-D or 1-D) calls, instantiated for its register tile and its weights'
    prefetch (winograd.prefetch: kiln.lower.nchwc.PREFETCH_BYTES ahead where the `u_bytes` of
    transformed weights exceed L1, as the blocked direct conv's; the name says it)."""
    from kiln.lower.nchwc import PREFETCH_BYTES  # noqa: PLC0415
    ahead = PREFETCH_BYTES // 4 if target is not None and u_bytes > target.l1d_bytes else 0
    pf = WG_PREFETCH.value(heuristic=ahead)
    nx = WG_PREFETCH_NEXT.value(heuristic=int(pf > 0))
    name = f"{fn}{f'_p{pf}' if pf else ''}{'_n' if nx else ''}_gemm"
    return name, c_instance("winograd_gemm.h", {"KILN_WGG_FN": name, "KILN_WGG_L": str(lanes),
                                               "KILN_WGG_TR": str(tr), "KILN_WGG_OV": str(ov),
                                               "KILN_WGG_PF": str(pf), "KILN_WGG_NX": str(nx)}, name.upper())
