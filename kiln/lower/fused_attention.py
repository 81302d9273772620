"""kiln::FusedAttention's native kernel (cpu target), shared with the ONNX Attention op.

One C kernel (kiln/codegen/c_src/flash_attention.c) computes softmax(Q·Kᵀ·scale + mask)·V
FlashAttention-style: per (batch, head, tile of query rows) it streams K/V in blocks,
keeps a running max and sum per row and never stores the S x S scores. Its two products
are register-tiled micro-kernels in the GEMM's manner (kiln.lower.gemm: an mr x nr tile of
accumulators over the reduction, one operand packed into vector-wide panels): Q·Kᵀ with
Kᵀ packed in panels of keys, P·V with V packed as rows. `FlashCall` describes one call
(logical dims, element strides, mask, scale, causal offset); `flash_kernel` makes it a
lowering's extern kernel, its tile sized for the Target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kiln.codegen.csource import c_parallel, c_shared, c_source
from kiln.dtypes import DType
from kiln.loops.symbols import as_int, c_size, hint, same_size, static
from kiln.lower.decisions import Ints, declare
from kiln.lower.nnutil import parallel_worth
from kiln.ops.fused_attention import DOMAIN, MASK_KINDS, contiguous_strides, logical_shapes, mask_strides
from kiln.lower.context import LowerCtx, lowering
from kiln.targets.target import Target

FLOATS = (DType.float32, DType.float16, DType.bfloat16)
MASK_FLOATS = (DType.float32, DType.float16, DType.float64)


@dataclass(frozen=True)
class FlashTile:
    """The kernel's tile: lanes per vector, micro-tile rows, vectors of keys (Q·Kᵀ) and of
    the value dim (P·V) per micro-tile row, keys per block, query rows per task."""
    lanes: int
    mr: int
    nk: int
    no: int
    bk: int
    bq: int


# The tile as decisions (the tuner's knobs; the heuristic below gives their defaults): rows per
# micro-tile, keys per block, and micro-tiles of rows per parallel task, the kernel's parallel
# granularity (batch x heads x ceil(queries / bq) tasks: 48 for a 4-head layer at batch 4 x 64,
# 12 at batch 1, for 2 threads)
ATTN_MR = declare("attention.mr", Ints(1, 12), lambda t: 6, "query rows per micro-tile of the fused attention kernel")
ATTN_BK = declare("attention.bk", Ints(1, 4096), lambda t: 64,
                  "keys per block of the fused attention kernel (a multiple of its micro-tile's keys)")
ATTN_Q_TILES = declare("attention.q_tiles", Ints(1, 16), lambda t: 4,
                       "micro-tiles of query rows per parallel task of the fused attention kernel")


def flash_tile(target: Target, dv: int, sk: int) -> FlashTile:
    """Accumulators mr x max(nk, no) plus one row of loads and a broadcast fit the register
    file (AVX-512's 32: 6 rows x 4 vectors, 64 keys or 64 dims; AVX2's 16: 6 x 2). A block
    of 64 keys keeps the online softmax's rescale of the output (a multiply per output
    element per block) small against the block's products (64 multiply-adds per element);
    four micro-tiles of rows per task reuse each K/V block from L1 (Kᵀ and V blocks of
    D = 64: 16 KiB each). Fewer keys than that: the block is the keys rounded up to whole
    vectors (32 keys: 2 vectors of 16, not 64 with half of them padding)."""
    lanes, regs = target.vector_lanes(4), target.vector_registers
    nv = 4 if regs >= 32 else 2
    no = max(1, min(nv, -(-dv // lanes)))
    nk = max(1, min(nv, -(-sk // lanes)))
    mr = ATTN_MR.value(heuristic=max(1, min(6, (regs - nv - 1) // nv)))
    bk = ATTN_BK.value(heuristic=nk * lanes * max(1, min(64 // (nk * lanes), -(-sk // (nk * lanes)))))
    if bk % (nk * lanes):
        raise ATTN_BK.illegal(bk, f"not a multiple of the micro-tile's {nk * lanes} keys")
    return FlashTile(lanes, mr, nk, no, bk, ATTN_Q_TILES.value(heuristic=4) * mr)


@dataclass(frozen=True)
class FlashCall:
    """One fused attention: logical dims, element strides over (b, h, s, d) of q, k, v and
    the output, and the mask's over (b, h, sq, sk) (0 where broadcast)."""
    dims: tuple            # (B, HQ, HKV, SQ, SK, D, DV)
    strides: tuple         # (q, k, v, out), four ints each
    scale: float
    mask_kind: int = 0     # 0 none, 1 additive, 2 boolean (true: visible), 3 boolean (true: masked)
    mask_strides: tuple = (0, 0, 0, 0)
    fill: float = -math.inf
    causal: int = -1
    empty_nan: bool = True


def permuted_strides(shape, perm) -> tuple[int, ...]:
    """Element strides over the logical axes of numpy.transpose(x, perm), x contiguous."""
    st = contiguous_strides(shape)
    return tuple(st[p] for p in perm)


def out_strides(logical_shape, out_perm) -> tuple[int, ...]:
    """Element strides over the logical axes when the output is stored transposed by out_perm."""
    phys = [logical_shape[p] for p in out_perm]
    st = contiguous_strides(phys)
    inv = [list(out_perm).index(j) for j in range(4)]
    return tuple(st[i] for i in inv)


def _types(dt: DType) -> tuple[str, str, str]:
    """(C type, element -> float, float -> element) for an input/output dtype."""
    if dt is DType.bfloat16:
        return dt.c_storage, "kiln_fa_bf16(x)", "kiln_fa_to_bf16(x)"
    return dt.c, "(float)(x)", f"({dt.c})(x)"


def _lit(x: float) -> str:
    if math.isinf(x):
        return "-INFINITY" if x < 0 else "INFINITY"
    return f"{float(x).hex()}f" if x == x else "NAN"


def flash_kernel(ctx: LowerCtx, call: FlashCall, q, k, v, mask, out_shape, out_dtype: DType, kv_lens=None):
    """The extern kernel computing `call` (see kiln/codegen/c_src/flash_attention.c).
    `kv_lens`: an int64 [B] input, the keys valid per batch entry, read at run time (a static
    KV cache's filled rows; the causal offset then counts from their end)."""
    b, hq, hkv, sq, sk, d, dv = call.dims
    if sk == 0 or d == 0:
        ctx.fail("attention over an empty key sequence or head size has no fused kernel", stage="lower")
    if q.dtype not in FLOATS or k.dtype is not q.dtype or v.dtype is not q.dtype or out_dtype is not q.dtype:
        ctx.fail(f"the fused attention kernel takes one float dtype for q, k, v and the output, "
                 f"got {q.dtype}, {k.dtype}, {v.dtype} -> {out_dtype}", stage="lower")
    target = Target.of(ctx.target)
    t = flash_tile(target, dv, hint(sk))   # a symbolic key count: tiled for its hint
    # the kernel forks when its threads save more than the fork and join cost (the Target's
    # wait policy): its products, Q·Kᵀ and P·V, over every (batch, head, query, key); with
    # keys or sizes known at run time only (a static cache, a shape-generic module) the
    # kernel compares its work with the cost model's floor then
    work = b * hq * sq * sk * (d + dv)
    fork_at = (str(_fork_floor(target)) if kv_lens is not None or not static(work) else
               "0" if parallel_worth(work, target, "attention") else "INT64_MAX")
    dvp = -(-dv // (t.no * t.lanes)) * t.no * t.lanes
    ct, ld, st = _types(q.dtype)
    mt = "float" if mask is None else mask.dtype.c
    fn = (f"kiln_flash_attention_{q.dtype.name}_{mask.dtype.name if mask is not None else 'none'}_{d}_{dv}"
          f"_{t.nk}_{t.bk}_{t.mr}_{t.bq}")
    macros = {"KILN_FA_FN": fn, "KILN_FA_TQ": ct, "KILN_FA_TK": ct, "KILN_FA_TV": ct, "KILN_FA_TM": mt,
              "KILN_FA_TO": ct, "KILN_FA_LD(x)": ld, "KILN_FA_ST(x)": st, "KILN_FA_L": t.lanes,
              "KILN_FA_MR": t.mr, "KILN_FA_NK": t.nk, "KILN_FA_NO": t.no, "KILN_FA_BK": t.bk, "KILN_FA_BQ": t.bq,
              "KILN_FA_D": d, "KILN_FA_DV": dv, "KILN_FA_DVP": dvp,
              # in-place reads of K and V rows (decoding, see flash_attention.c): float32 whole vectors
              "KILN_FA_DIRECT": int(q.dtype is DType.float32 and d % t.lanes == 0 and dv % t.lanes == 0)}
    preamble = c_shared("flash_attention.c", {k_: str(v_) for k_, v_ in macros.items()}, fn.upper(),
                        helpers=c_source("kiln_exp.h") + c_parallel(target.threads_impl))
    if kv_lens is not None and (kv_lens.dtype is not DType.int64 or len(kv_lens.shape) != 1
                                or not same_size(kv_lens.shape[0], b)):
        ctx.fail(f"the keys' valid lengths must be int64 of shape ({b},), got {kv_lens.dtype} "
                 f"{tuple(kv_lens.shape)}", stage="lower")
    lens = "NULL" if kv_lens is None else "in4" if mask is not None else "in3"
    args = ["in0", "in1", "in2", "in3" if mask is not None else "NULL", lens, "out0",
            *(c_size(x) for x in (b, hq, hkv, sq, sk)), *(c_size(x) for s in call.strides for x in s),
            str(call.mask_kind), *(c_size(x) for x in call.mask_strides), _lit(call.fill), _lit(call.scale),
            str(call.causal), str(int(call.empty_nan)), fork_at]
    body = f"  return {fn}({', '.join(args)});"
    return ctx.extern(body, [q, k, v, mask, kv_lens], [(tuple(out_shape), out_dtype)], preamble=preamble)


def _fork_floor(target: Target) -> int | str:
    """The least work (the products' multiply-adds) at which the kernel forks on `target`
    (parallel_worth is monotonic in it), for a kernel whose key count is known at run time."""
    lo, hi = 1, 1 << 50
    if not parallel_worth(hi, target, "attention"):
        return "INT64_MAX"
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if parallel_worth(mid, target, "attention") else (mid + 1, hi)
    return lo


@lowering("FusedAttention", domain=DOMAIN)
def _lower(ctx: LowerCtx, q, k, v, mask=None, kv_lens=None):
    perms = [tuple(int(i) for i in ctx.attr(f"{n}_perm", [0, 1, 2, 3])) for n in ("q", "k", "v", "out")]
    (nb, hq, sq, d), (_, hkv, sk, _), (_, _, _, dv) = logical_shapes(ctx, [q.shape, k.shape, v.shape])
    strides = tuple(permuted_strides(x.shape, p) for x, p in zip((q, k, v), perms)) + \
        (out_strides((nb, hq, sq, dv), perms[3]),)
    kind, ms = 0, (0, 0, 0, 0)
    if mask is not None:
        name = ctx.attr("mask_kind", "add")
        kind = MASK_KINDS.index(name.decode() if isinstance(name, bytes) else name) + 1
        if kv_lens is not None and len(mask.shape) and not static_one(mask.shape[-1]):
            sk = mask.shape[-1]   # the keys read stop at the mask's width (its reads stay inside it)
        ms = mask_strides(mask.shape, (nb, hq, sq, sk))
        if ms is None:
            ctx.fail(f"mask of shape {tuple(mask.shape)} does not broadcast to the scores {(nb, hq, sq, sk)}",
                     stage="lower")
        if kind == 1 and mask.dtype not in MASK_FLOATS or kind > 1 and mask.dtype is not DType.bool:
            ctx.fail(f"a {'additive' if kind == 1 else 'boolean'} mask of dtype {mask.dtype} has no fused kernel",
                     stage="lower")
    empty = ctx.attr("empty", "nan")
    call = FlashCall((nb, hq, hkv, sq, sk, d, dv), strides, float(ctx.attr("scale", 1.0)), kind, ms,
                     float(ctx.attr("fill", -math.inf)), int(ctx.attr("causal", -1)),
                     (empty.decode() if isinstance(empty, bytes) else empty) == "nan")
    return flash_kernel(ctx, call, q, k, v, mask, ctx.out_shape(0), ctx.out_dtype(0), kv_lens)


def static_one(x) -> bool:
    return static(x) and as_int(x) == 1
