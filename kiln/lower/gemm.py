"""A reusable GEMM builder: out[..., M, N] = epilogue(sum_k A[..., M, K] * B[..., K, N]).

MatMul, Gemm, MatMulInteger, and later Conv (im2col) and attention are all this
one computation with different operand views and epilogues, so they share one
compute definition and one schedule that is fast on CPUs. `gemm(a, b)` returns a
`Gemm`: the output compute (`.out`) and `.schedule(sch)`, which schedules the
stages it made (and inlines injective computes feeding A and B).

The micro-kernel computes an mr x nr tile of the product: each k step loads nr / lanes
vectors from the "vector" operand V, broadcasts mr scalars of the "scalar" operand S
and does mr * nr / lanes FMAs into accumulators that the C compiler keeps in
registers. Normally S = A (rows i) and V = B (columns j); when B is given transposed
(B^T[N, K], how nn.Linear weights arrive) and M is the smaller side, the roles swap
(S = B^T, V = A^T, the tile is written out transposed) so the big weight is read in
place, row by row, and only the small activation is repacked.

The schedule, in kiln's schedule language:

- V is packed into panels `Vp[.., c_outer, k, c_inner]` of nr columns, so the
  micro-kernel reads it contiguously: with V's own row stride every k step would
  touch a new page (TLB misses, 4K cache-set aliasing);
- the accumulator `acc` is computed at the output's tile loop into an mr x nr local
  array, loops k, r (unrolled), c (vectorized);
- `acc` is padded to multiples of mr and nr and reads clamped indices, so the hot
  loop has no guards; only the copy-out (which applies the epilogue) checks edges;
- all tile loops (batch, panels, blocks) are fused into one parallel loop, the loop
  over the bigger operand's tiles outermost so that it streams from memory once; a V
  shared by the whole batch (a weight against batched activations) has its panel loop
  outside the batch too, so each panel is read once, not once per batch item;
- the loop forks when the time the threads save pays for the fork and join
  (kiln.lower.nnutil.parallel_worth: the target's vector width and wait policy), the
  serial time being the larger of the FMAs' and reading both operands once: a Linear at
  batch 1 does one multiply-add per weight it reads from memory, so the FMA rate put a
  classifier's 1280 -> 1000 (5 MiB, ~0.2 ms on one thread of the Zen 4) at 21 us, serial.

Two ways to pack V. "Root": all of V once, before the tile loop (right when V is
small or reused by many row blocks). "Panel" (few row blocks, e.g. M = 64 against
a big weight): `acc` covers a whole column panel (all rows, on the stack), V's panel
is packed inside the parallel panel loop, and the row-block loop is unrolled so
that each block's accumulators still have constant addresses (registers); V is read
from memory once instead of read, written and read again.

S is read in place, unless reading it divides indices (a fused prologue that merges
dims, such as attention's heads Transpose + Reshape feeding the output projection):
then it is first copied row-major into `Sp[.., R, K]` at the root (in parallel), so the
micro-kernel's loads stay a row pointer plus k instead of a division per k step and
a 16 KiB jump per head.

A single column (matrix-vector: a Linear at batch 1) has nothing to vectorize over
along C; there the k loop is split by the vector width and rfactor'ed, so each row
accumulates a vector of partial sums, added up once at the end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from kiln.codegen.c import STACK_LIMIT
from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.loops import Schedule, Tensor, cast, compute, min_, reduce_axis, sum_
from kiln.loops.expr import walk
from kiln.loops.symbols import UNBOUNDED, as_int, ceildiv, hint, same_size, size_hint, static
from kiln.lower.decisions import Ints, OneOf, declare
from kiln.lower.nnutil import parallel_worth
from kiln.lower.row_tiles import plan_row_tiles, row_tile_state
from kiln.targets.target import Target


# GCC (12, -mtune=znver3, which -march=native picks on a Zen 4 VM) folds a V vector's load
# into each FMA when the vector serves at most this many rows: 16 loads per 16 FMAs instead of
# 4, so a 4-row tile ran at 60% of the speed of 5, 6 or 8 rows (1 thread, AVX-512, 32x256x768:
# 30 vs 48-52 GMAC/s; 8x784x256: 26 vs 37.5 at 5 rows; 16x256x256: 26 vs 39 at 6 rows). Tiles
# take more rows than this where the product has them, even at the cost of a padded row.
FOLD_ROWS = 4
ONE_BLOCK_SPILL = 2   # rows past the register budget that one block still takes (choose_tile)
# The cost per row of a tile with spilled accumulators (8 x 4 vectors on AVX-512) against one
# that fits (6 x 4), so that it is taken only where it pads fewer rows: 1 thread, Zen 4,
# benchmarks/linear.py --also gemm.mr=8: M = 32 (4 blocks of 8, not 6 of 6 = 36 rows)
# 45.3 -> 51.1 GMAC/s; M = 64 and 128 +1-2%; M = 197, 256, 750 (6 pads little) -1 to -3.5%
SPILL_COST = 1.05
PANEL_MAX_BLOCKS = 8  # S blocks per panel: each an unrolled copy of the micro-kernel (compile time)
PANEL_MIN_BYTES = 1 << 20  # V smaller than this packs at the root: it stays in L2 anyway

# The template's decisions (kiln.lower.decisions; the heuristics below give the defaults,
# so an untuned build is unchanged): which operand is S, the micro-tile, packing, loop order.
_BOOL = OneOf((False, True))
GEMM_SWAP = declare("gemm.swap", _BOOL, lambda t: False, "S = B^T, V = A^T (the roles of the operands)")
GEMM_MR = declare("gemm.mr", Ints(1, 32), lambda t: 1, "rows of S per micro-tile")
GEMM_NVEC = declare("gemm.nvec", Ints(1, 4), lambda t: 2, "vectors of V per micro-tile row (nr = nvec x lanes)")
GEMM_PACK = declare("gemm.pack", _BOOL, lambda t: True, "pack V into nr-wide panels")
GEMM_PANEL = declare("gemm.panel", _BOOL, lambda t: False, "pack V panel by panel inside the parallel loop")
GEMM_S_OUTER = declare("gemm.s_outer", _BOOL, lambda t: False, "loop over S blocks outside V panels")
GEMM_PREFETCH = declare("gemm.prefetch", Ints(0), None,
                        "k steps (one row of a panel each) a weight packed ahead of time is prefetched "
                        "ahead in the micro-kernel (0: none)")
# Made by a graph pass (kiln.passes.pack_weights), per GEMM (keyed by its workload, as the conv
# algorithm is) or for all: the panel width of a weight packed at compile time, in vectors
WEIGHT_NR = declare("gemm.weight_nr", Ints(1, 256), lambda t: 4 * t.vector_lanes(4) if t else 64,
                    "columns per panel of a constant weight packed at compile time (kiln::MatMulPacked): "
                    "weight_panel_width's, or 1-4 vectors")


def accumulator_dtype(dt: DType) -> DType:
    """Half floats accumulate in float32 (as the reference's wide sum rounds once)."""
    return DType.float32 if dt in (DType.float16, DType.bfloat16) else dt


def choose_tile(rows: int, cols: int, dtype: DType, target: Target, max_padded_rows: int | None = None,
                nvec: int | None = None, few_rows: bool = False, spill_one: bool = False,
                exact_rows: bool = True) -> tuple[int, int] | None:
    """(mr, nr) for a rows x cols product on `target`: nr = nvec vectors (default two, one when cols
    is narrow, four with `few_rows`), mr = as many rows as the registers hold, lowered
    where that pads fewer rows. max_padded_rows: only tiles whose padded row count fits
    (None when none does). few_rows: the S rows alias in the L1 cache (their stride is a
    multiple of 4 KiB), so a dozen of them would evict each other: take fewer rows. exact_rows:
    `rows` is the product's own row count, not a symbolic size's hint (only then do a few rows
    past the budget take one block, ONE_BLOCK_SPILL)."""
    lanes, regs = target.vector_lanes(dtype.itemsize), target.vector_registers
    # four vectors only where the registers still hold a useful number of rows (6 of 32)
    nvec = nvec or (1 if cols <= lanes else 4 if few_rows and cols >= 4 * lanes and regs >= 32 else 2)
    # narrow products still use whole vectors (padded columns beat a scalar remainder),
    # unless nearly all lanes would be padding
    nr = lanes * nvec if 2 * cols > lanes else cols
    # accumulators + nvec B vectors + one broadcast must fit the register file: one more
    # and the compiler spills an accumulator, a load and a store in every k step.
    # spill_one: one more row of four vectors all the same (7 x 4 on AVX-512), where fewer
    # row blocks (less B read from L2) pay for the spill: the stored accumulator's
    # load -> FMA -> store chain (~10 cycles) hides under the k step's 28 FMAs (14 cycles)
    budget = tile_budget(nvec, regs, spill_one)
    # a few rows past the budget (at most ONE_BLOCK_SPILL) still take one block of all the rows,
    # four-vector tiles with 32 registers: the spilled accumulators' loads and stores cost less
    # than a second row block streaming every B panel again (8 x 1568 @ 1568 x 128 and
    # 8 x 784 @ 784 x 256, one thread on the AVX-512 Zen 4: 8 x 4 vectors 28.0 us, 5 x 4 34.7)
    if exact_rows and budget < rows <= (regs - nvec - 1) // nvec + ONE_BLOCK_SPILL and nvec >= 4 and regs >= 32 \
            and (max_padded_rows is None or rows <= max_padded_rows):
        return rows, nr
    # and more than FOLD_ROWS rows where the product has more rows than the registers hold
    cands = [rows] if rows <= budget else range(max(min(FOLD_ROWS + 1, budget), budget // 2), budget + 1)
    # with four-vector tiles and 32 registers, tiles of up to ONE_BLOCK_SPILL rows past the budget
    # (8 x 4, a few accumulators spilled) where they pad fewer rows, at SPILL_COST per row
    spilled = range(budget + 1, (regs - nvec - 1) // nvec + ONE_BLOCK_SPILL + 1) \
        if exact_rows and rows > budget and nvec >= 4 and regs >= 32 else ()
    cost = {mr: -(-rows // mr) * (mr + 1) * (SPILL_COST if mr > budget else 1) for mr in (*cands, *spilled)
            if max_padded_rows is None or -(-rows // mr) * mr <= max_padded_rows}
    return (min(cost, key=lambda mr: (cost[mr], -mr)), nr) if cost else None


def tile_budget(nvec: int, regs: int, spill_one: bool = False) -> int:
    """The rows of nvec-vector accumulators the register file holds (choose_tile): past
    them a tile spills and costs SPILL_COST per row."""
    extra = nvec if spill_one and nvec >= 4 and regs >= 32 else 0
    return max(1, (regs - nvec - 1 + extra) // nvec)


def weight_aliasing(k: int, dtype: DType) -> bool:
    """Do rows of a k-contiguous S operand alias in L1 (their stride a multiple of 4 KiB)?"""
    return (k * dtype.itemsize) % 4096 == 0


def weight_panel_width(cols: int, k: int, dtype: DType, target: Target) -> int:
    """nr, the panel width of a B[K, cols] packed ahead of time (kiln::MatMulPacked): what
    `gemm` picks for an A read in place (it depends on the vector width, not on M).

    With 32 vector registers: four-vector panels, a 6 x 4-vector tile (24 accumulators,
    10 loads per 24 FMAs, 6 row pointers) rather than 13 x 2 (15 loads per 26 FMAs, 13
    row pointers: more than the free general registers, so the k loop reloads some from
    the stack). With 16: two (6 x 2); four would leave room for 2 rows (3 spilled one
    accumulator, a load and a store per k step: 128x2048 @ 2048x512 ran at 60% of the
    speed of 6 x 2).

    Where four-vector panels would pad the columns, the width (two to four vectors, 32
    registers) is the one with the fewest loads per useful FMA: a tile of mr rows x nvec
    vectors loads mr + nvec per mr x nvec FMAs, times the columns computed per column kept.
    N = 96 (a ConvNeXt stage's 384 -> 96 projection) takes 3 vectors (9 x 3 tiles, no
    padding) instead of 4 (128 columns computed): one thread on the AVX-512 Zen 4,
    3136x384x96 3.19 -> 2.52 ms, 12544x384x96 12.1 -> 9.6 ms (benchmarks/linear.py).
    """
    acc = accumulator_dtype(dtype)
    nr = choose_tile(1, cols, acc, target, few_rows=target.vector_registers >= 32)[1]
    lanes, regs = target.vector_lanes(acc.itemsize), target.vector_registers
    if regs < 32 or cols <= 2 * lanes:
        return nr

    def cost(nvec: int) -> float:
        mr = (regs - nvec - 1) // nvec              # choose_tile's row budget
        return -(-cols // (nvec * lanes)) * nvec * lanes / cols * (mr + nvec) / (mr * nvec)
    best = min((4, 3, 2), key=lambda v: (round(cost(v), 9), -v))
    return best * lanes if cost(best) < cost(nr // lanes) - 1e-9 else nr


def weight_prefetch(k: int, cols: int, nr: int, itemsize: int, target: Target) -> int:
    """k steps of the micro-kernel that a weight packed ahead of time (kiln::MatMulPacked) is
    prefetched ahead: kiln.lower.nchwc.PREFETCH_BYTES of its panel, where the weight exceeds L1
    (else 0). A model's weights come from memory in each inference (they do not stay in cache
    between runs), each panel in its first row block, whose multiply-adds then wait on memory
    while the hardware prefetcher ramps up again at every 4 KiB page: with few rows (a
    ConvNeXt's last stage at batch 1, 49 rows against 768 x 3072 weights) that wait is most of
    the time the product takes."""
    from kiln.lower.nchwc import PREFETCH_BYTES  # noqa: PLC0415 (the conv tiles' rule and its measurement)
    if k * cols * itemsize <= target.l1d_bytes:
        return 0
    return max(1, PREFETCH_BYTES // (nr * itemsize))


def pack_weight(w, nr: int):
    """B[K, N] (numpy) as panels [ceil(N / nr), K, nr], the padded columns zero."""
    import numpy as np
    k, n = w.shape
    cp = -(-n // nr) * nr
    wp = np.zeros((k, cp), dtype=w.dtype)
    wp[:, :n] = w
    return np.ascontiguousarray(wp.reshape(k, cp // nr, nr).transpose(1, 0, 2))


def _panel_tile(rows: int, cols: int, dtype: DType, tile, target: Target) -> tuple[int, int] | None:
    """A tile for panel-at-a-time packing: the panel's accumulators fit the stack and
    it has at most PANEL_MAX_BLOCKS row blocks (two-vector tiles first, then one)."""
    for nvec in (2, 1):
        fit = tile or choose_tile(rows, cols, dtype, target, nvec=nvec,
                                  max_padded_rows=STACK_LIMIT // (target.vector_lanes(dtype.itemsize) * nvec
                                                                  * dtype.itemsize))
        if fit is not None and -(-rows // fit[0]) <= PANEL_MAX_BLOCKS \
                and -(-rows // fit[0]) * fit[0] * fit[1] * dtype.itemsize <= STACK_LIMIT:
            return fit
    return None


@dataclass
class Gemm:
    """The output compute of a GEMM, the stages its schedule manages, and its knobs."""
    out: Tensor
    acc: Tensor | None          # accumulator [*batch, panels, Rp, nr] (rows: S side); None when empty
    packed: Tensor | None       # packed V panels
    operands: tuple
    mr: int
    nr: int
    swapped: bool               # S = B^T, V = A^T
    squeeze: tuple
    work: int                   # multiply-adds, for the serial/parallel decision
    s_outer: bool               # loop over S blocks outside V panels
    panel: bool = False         # pack V one panel at a time, inside the parallel panel loop
    dot: int = 0                # single-column V: vectorize k in `dot` partial sums per row (rfactor)
    s_packed: Tensor | None = None  # S copied row-major at the root (its view divides indices)
    target: Target | None = None    # sizes the fork decisions (None: the host)
    v_shared: bool = False          # V has no batch dims of its own (one weight for the whole batch)
    streamed: int = 0               # elements of S and V, each read at least once (the fork decision)
    flat: int = 0                   # trailing batch dims whose rows are one matrix against a shared V (`_flat_rows`)
    prefetch: int = 0               # k steps a prepacked V is prefetched ahead (weight_prefetch)

    @property
    def _target(self) -> Target:
        return self.target or Target.host()

    def schedule(self, sch: Schedule, out: Tensor | None = None) -> None:
        """Schedule out, acc and the packed panels (see the module docstring); inline
        the injective computes that produce A and B.

        `out`: a fused epilogue's result, an elementwise function of `self.out` of the
        same shape; `self.out` is then inlined into it and its loops carry the tiles.
        """
        _inline_producers(sch, self.operands)
        if out is not None and out is not self.out and tuple(out.shape) == tuple(self.out.shape):
            if sch[self.out].attach != "inline":
                sch[self.out].compute_inline()
        else:
            out = self.out
        if self.acc is None:
            return
        rf = None
        if self.dot:  # partial sums over k mod lanes: one vector accumulator per row
            sa = sch[self.acc]
            ko, ki = sa.split(sa.reduce_axis[0], self.dot)
            rf = sch.rfactor(self.acc, ki, len(self.acc.shape))
        so = sch[out]
        axes = list(so.axis)
        j = None if "n" in self.squeeze else axes.pop()
        i = None if "m" in self.squeeze else axes.pop()
        if self.flat:   # the row blocks run over the folded batch dims' rows as one matrix
            i, axes = so.fuse(*axes[len(axes) - self.flat:], i), axes[:len(axes) - self.flat]
        mi, nj = (self.nr, self.mr) if self.swapped else (self.mr, self.nr)
        io, ii = so.split(i, mi) if i is not None else (None, None)
        jo, ji = so.split(j, nj) if j is not None else (None, None)
        s_o, v_o = (jo, io) if self.swapped else (io, jo)
        if self.panel:   # acc covers a whole V panel; the S blocks loop inside it
            tiles, inner = [v for v in (*axes, v_o) if v is not None], [s_o]
        elif self.v_shared and not self.s_outer:
            # V is one matrix for the whole batch (a weight): the batch is part of S's blocks,
            # inside the panel loop, so each panel is read from memory once, not once per item
            tiles, inner = [v for v in (v_o, *axes, s_o) if v is not None], []
        else:
            tiles, inner = [v for v in (*axes, *((s_o, v_o) if self.s_outer else (v_o, s_o))) if v is not None], []
        so.reorder(*tiles, *[v for v in (*inner, ii, ji) if v is not None])
        fused = so.fuse(*tiles) if tiles else None
        if ji is not None and nj > 1:
            so.vectorize(ji)
        if fused is None and not static(math.prod(self.acc.shape)):
            raise KilnError(f"{self.out.name}: a GEMM without tile loops needs static sizes", stage="lower")
        if fused is not None and parallel_worth(self.work, self._target, "gemm", streamed=self.streamed):
            so.parallel(fused)
        sa = sch[self.acc]
        if fused is not None:
            sa.compute_at(so, fused)
        *_, co, r, c = sa.axis
        k = sa.reduce_axis[0]
        if self.panel:
            # the S-block loop is unrolled, so every accumulator index is a constant
            # and the C compiler keeps each block's tile in registers over its k loop
            ro, ri = sa.split(r, self.mr)
            sa.reorder(co, ro, k, ri, c)
            sa.unroll(ro)
            sa.unroll(ri)
        else:
            sa.reorder(k, r, c)
            sa.unroll(r)
        lanes = self._target.vector_lanes(self.acc.dtype.itemsize)
        if self.prefetch and self.nr > lanes and self.nr % lanes == 0:
            # a panel row of several vectors, one line each: a prefetch hint per vector
            # (Stage.prefetch hints one element per vector loop)
            cv, c = sa.split(c, lanes)
            sa.unroll(cv)
        if self.nr > 1:
            sa.vectorize(c)
        if self.prefetch:
            sa.prefetch(self.operands[1], k, self.prefetch)
        if rf is not None:
            sr = sch[rf]
            *_, rr, rc, lane = sr.axis
            sr.compute_at(sa, co)
            sr.reorder(sr.reduce_axis[0], rr, rc, lane)
            sr.unroll(rr)
            sr.vectorize(lane)
        if self.s_packed is not None:
            ss = sch[self.s_packed]
            *sb, sk = ss.axis
            outer = ss.fuse(*sb) if len(sb) > 1 else sb[0]
            if self.nr > 1 and self.s_packed.shape[-1] > 1:
                ss.vectorize(sk)
            if parallel_worth(size_hint(self.s_packed.shape), self._target, "copy"):
                ss.parallel(outer)
        if self.packed is not None:
            sp = sch[self.packed]
            *pb, pco, pk, pci = sp.axis
            if self.nr > 1:
                sp.vectorize(pci)
            if self.panel:
                sp.compute_at(sa, co)
            else:
                outer = sp.fuse(*pb, pco)
                if parallel_worth(size_hint(self.packed.shape), self._target, "copy"):
                    sp.parallel(outer)


def _inline_producers(sch: Schedule, tensors) -> None:
    """Inline non-reduction computes feeding the operands (views, casts, zero points)."""
    staged = {s.tensor for s in sch.stages}
    todo = [t for t in tensors if t.op is not None]
    seen = set()
    while todo:
        t = todo.pop()
        if t in seen or t not in staged or t.reduce_axis or t in sch.outputs:
            continue
        seen.add(t)
        sch[t].compute_inline()
        todo.extend(t.inputs)


_INDEX_DIVISION = ("floordiv", "floormod", "truncdiv", "truncmod")


def divides_indices(t: Tensor) -> bool:
    """Does a load of `t` divide an index: does `t`, or a non-reduction compute it reads
    (what `_inline_producers` inlines), merge dims (a Reshape view that must unflatten)?"""
    todo, seen = [t], set()
    while todo:
        x = todo.pop()
        if x.op is None or x.reduce_axis or id(x) in seen:
            continue
        seen.add(id(x))
        if any(e.op in _INDEX_DIVISION and not e.dtype.is_float for e in walk(x.op.body)):
            return True
        todo.extend(x.inputs)
    return False


def _unsqueeze(ix, squeeze) -> tuple:
    """An output index with the squeezed M / N dims put back (as 0)."""
    ix = list(ix)
    if "n" in squeeze:
        ix.append(0)
    if "m" in squeeze:
        ix.insert(len(ix) - 1, 0)
    return tuple(ix)


def _bcast(idx, shape):
    """Index a (right-aligned, numpy-broadcast) batch shape with the output's batch index."""
    idx = idx[len(idx) - len(shape):] if shape else ()
    return tuple(0 if n == 1 else v for v, n in zip(idx, shape))


def gemm(a: Tensor, b: Tensor, *, trans_a: bool = False, trans_b: bool = False,
         epilogue: Callable | None = None, out_dtype: DType | None = None,
         acc_dtype: DType | None = None, squeeze: tuple = (), name: str = "gemm",
         tile: tuple[int, int] | None = None, swap: bool | None = None, pack: bool | None = None,
         panel: bool | None = None, prepacked: Tensor | None = None, target: Target) -> Gemm:
    """GEMM of a [*ba, M, K] and b [*bb, K, N], batch dims broadcast as numpy.matmul.

    trans_a / trans_b: a is stored [*ba, K, M] / b is stored [*bb, N, K] (read in place,
    never copied; the layout picks the loop structure). a and b may be computes (views
    such as im2col, casts, zero-point shifts): they are inlined where read, into the
    packing of V or into the micro-kernel; pass pack=True when an expensive view is V. epilogue(value, idx) -> Expr
    maps the accumulated value (acc_dtype) at output index idx = (*batch, i, j) to the
    stored value (bias, alpha/beta, activations); the result is cast to out_dtype
    (default: a's dtype). squeeze: "m" and/or "n", size-1 output dims to drop
    (numpy.matmul's 1-D operands). tile = (mr, nr), swap, pack and panel override the
    heuristics (a tuner's knobs). prepacked: b already packed as panels [Cp // nr, K, nr]
    (see `pack_weight`; b then only gives the shape): read directly, nothing is packed.
    target: the CPU whose vector width and registers size the tiles (a lowering's ctx.target).
    """
    *ba, M, K = a.shape if not trans_a else (*a.shape[:-2], a.shape[-1], a.shape[-2])
    *bb, K2, N = b.shape if not trans_b else (*b.shape[:-2], b.shape[-1], b.shape[-2])
    if K != K2:
        raise ValueError(f"gemm: inner dims differ: {tuple(a.shape)} x {tuple(b.shape)} "
                         f"(trans_a={trans_a}, trans_b={trans_b})")
    nb = max(len(ba), len(bb))
    # broadcast: a 1 takes the other's size (0 included: max(0, 1) would be 1, not 0)
    batch = [y if x == 1 else x for x, y in zip([1] * (nb - len(ba)) + ba, [1] * (nb - len(bb)) + bb)]
    acc_dtype = acc_dtype or accumulator_dtype(a.dtype)
    out_dtype = out_dtype or a.dtype

    def a_at(bi, i, k):
        return a[(*_bcast(bi, ba), *((k, i) if trans_a else (i, k)))]

    def b_at(bi, k, j):
        return b[(*_bcast(bi, bb), *((j, k) if trans_b else (k, j)))]

    shape = [*batch, *(() if "m" in squeeze else (M,)), *(() if "n" in squeeze else (N,))]
    epi = epilogue or (lambda v, idx: v)
    if 0 in (M, N, K):  # nothing to multiply: an empty output or epilogue(0)
        out = compute(shape, lambda *ix: cast(out_dtype, epi(cast(acc_dtype, 0), _unsqueeze(ix, squeeze))), name)
        return Gemm(out, None, None, (a, b), 1, 1, False, tuple(squeeze), 0, False)
    if prepacked is not None:
        swap, pack, panel = False, False, False
    if swap is None:  # S = B^T read in place pays when it is stored k-contiguous and M is the small side
        swap = GEMM_SWAP.value(heuristic=bool(trans_b and not trans_a and hint(M) < hint(N)))
    if swap:
        (R, C), s_at, v_at, vb, sb = (N, M), (lambda bi, r, k: b_at(bi, k, r)), a_at, ba, bb
    else:
        (R, C), s_at, v_at, vb, sb = (M, N), a_at, (lambda bi, c, k: b_at(bi, k, c)), bb, ba
    s_packed = None
    if divides_indices(b if swap else a):
        s_packed = compute((*sb, R, K), lambda *ix: s_at(ix[:-2], ix[-2], ix[-1]), f"{name}.s_packed")

        def s_at(bi, r, k):
            return s_packed[(*_bcast(bi, sb), r, k)]
    lanes = target.vector_lanes(acc_dtype.itemsize)
    s_contiguous = trans_b if swap else not trans_a
    # matrix-vector: a single column to vectorize over is no use; vectorize k instead
    dot = lanes if tile is None and C == 1 and s_contiguous and K % lanes == 0 and K >= 2 * lanes else 0
    flat = 0 if swap or dot or squeeze else _flat_rows(M, ba, vb, batch)
    lead, folded = batch[:len(batch) - flat], batch[len(batch) - flat:]
    if flat:   # R counts the rows of the folded items; acc keeps only the leading batch dims
        s_row, R = s_at, M * math.prod(folded)

        def s_at(bi, r, k):
            q, item = r // M, []
            for d in reversed(folded[1:]):
                q, rem = q // d, q % d
                item.insert(0, rem)
            return s_row((*bi, q, *item), r % M, k)
    aliasing = s_contiguous and weight_aliasing(K, a.dtype)
    # a symbolic row count (kiln.lower.row_tiles): the generic module's kernel is also built with
    # other row tiles (`force`), picked per call by the run-time rows; `log` collects which
    force, log = row_tile_state()
    sym_rows = tile is None and not static(R) and not dot
    hR, hC = hint(R), hint(C)
    regs = target.vector_registers
    if prepacked is not None:
        dot, nr = 0, prepacked.shape[-1]
        if tuple(prepacked.shape[-2:]) != (K, nr) or prepacked.shape[-3] != -(-C // nr):
            raise ValueError(f"gemm: packed B {tuple(prepacked.shape)} does not fit K={K}, N={C}")
        # where S's rows alias in L1 (K = 2048 x fp32), 7 x 4 vectors with one accumulator
        # spilled beat 6 x 4: 128x2048 @ 2048x512 205 vs 180, 211 vs 183, 192 vs 172 GFLOP/s
        spill_one = s_contiguous and weight_aliasing(K, a.dtype)
        spill = tile_budget(max(1, nr // lanes), regs, spill_one)

        def pick(rows: int, exact: bool = True) -> int:
            return choose_tile(rows, C, acc_dtype, target, nvec=max(1, nr // lanes), spill_one=spill_one,
                               exact_rows=exact)[0]
        heuristic = force[0] if sym_rows and force else pick(hR, static(R))
        tile = tile or (GEMM_MR.value(heuristic=heuristic), nr)
    else:
        def pick(rows: int, exact: bool = True) -> int:
            return choose_tile(rows, hC, acc_dtype, target, few_rows=aliasing, exact_rows=exact)[0]
    # symbolic sizes (kiln.loops.symbols): decisions at their hints, tiles padded as for any size
    mr, nr = tile or ((choose_tile(hR, lanes, acc_dtype, target, nvec=1)[0], 1) if dot
                      else choose_tile(hR, hC, acc_dtype, target, few_rows=aliasing, exact_rows=static(R)))
    mr, nr = max(1, min(mr, hR) if static(R) else mr), max(1, nr)
    if prepacked is None:
        spill = tile_budget(max(1, nr // lanes), regs)
        heuristic = mr = force[0] if sym_rows and force else mr
    if tile is None and not dot and 2 * hC > lanes:   # a tuner may pick another micro-tile
        want = (GEMM_MR.value(heuristic=mr), lanes * GEMM_NVEC.value(heuristic=max(1, min(4, nr // lanes))))
        if want != (mr, nr):
            tile = (mr, nr) = (max(1, min(want[0], hR) if static(R) else want[0]), want[1])
    if sym_rows and log is not None and force is None and mr == heuristic and nr > 1:
        log.append(plan_row_tiles(R, mr, spill, pick))   # (None: no other tile pays)
    v_contiguous = (trans_a if swap else not trans_b)
    if pack is None:  # V is reused by every S block; unpacked it must at least be contiguous along c
        pack = GEMM_PACK.value(heuristic=bool(nr > 1 and (-(-hR // mr) > 1 or not static(C) or C % nr != 0
                                                          or not v_contiguous)))
    if panel is None:
        # a V that stays in cache packs cheaply at the root (and compiles faster)
        panel = GEMM_PANEL.value(heuristic=bool(hint(K * C * math.prod(vb)) * b.dtype.itemsize >= PANEL_MIN_BYTES))
    if not static(R):   # a panel's accumulators cover all rows, on the stack: a static count
        panel = False
    fit = _panel_tile(R, C, acc_dtype, tile, target) if pack and panel else None
    panel = fit is not None
    if panel:
        # few row blocks: pack V panel by panel (read once, no packed copy in memory)
        # with the whole panel's accumulators on the stack
        mr, nr = max(1, min(fit[0], R)), max(1, fit[1])
    Rp, Cp = ceildiv(R, mr) * mr, ceildiv(C, nr) * nr
    k = reduce_axis(K, "k")

    if pack:
        packed = compute((*vb, Cp // nr, K, nr),
                         lambda *ix: v_at(ix[:-3], min_(ix[-3] * nr + ix[-1], C - 1), ix[-2]),
                         f"{name}.packed")

        def v_load(bi, co, ci):
            return packed[(*bi, co, k, ci)]
    elif prepacked is not None:
        packed = None

        def v_load(bi, co, ci):
            return prepacked[(*bi, co, k, ci)]
    else:
        packed = None

        def v_load(bi, co, ci):
            return v_at(bi, min_(co * nr + ci, C - 1), k)

    def acc_body(*ix):
        *bi, co, r, ci = ix
        sv = s_at(tuple(bi), min_(r, R - 1), k)
        vv = v_load(_bcast((*bi, *(0,) * flat), vb), co, ci)
        return sum_(cast(acc_dtype, sv) * cast(acc_dtype, vv), axis=k)

    # the panel index is a dim of its own: no div/mod between the tile loops and the
    # accumulator, so bound inference sees exact one-panel regions
    # a symbolic dim of acc is declared UNBOUNDED: acc is only ever computed a tile at a time
    # (at the output's tile loop) and reads clamped rows and columns, so no index of it
    # needs clamping to the padded size (which the simplifier could not prove, leaving a
    # guard in the micro-kernel)
    acc = compute(tuple(d if static(d) else UNBOUNDED for d in (*lead, Cp // nr, Rp, nr)), acc_body,
                  f"{name}.acc")

    def out_body(*ix):
        *bi, i, j = ix = _unsqueeze(ix, squeeze)
        r, c = (j, i) if swap else (i, j)
        if flat:
            item = 0
            for v, d in zip(bi[len(lead):], folded):
                item = item * d + v
            bi, r = bi[:len(lead)], item * M + r
        return cast(out_dtype, epi(acc[(*bi, c // nr, r, c % nr)], ix))

    out = compute(shape, out_body, name)
    s_size, v_size = hint((M if flat else R) * K * math.prod(ba if not swap else bb)), \
        hint(C * K * math.prod(vb))
    work = math.prod(batch) * M * N * K
    if sym_rows and force:   # a row-tile variant decides loop order and forks as for force[1] rows
        s_size, work = s_size * force[1] // max(1, hR), hint(work) * force[1] // max(1, hR)
    itemsize = (prepacked if prepacked is not None else b if not swap else a).dtype.itemsize
    s_outer = s_blocks_outside(s_size, v_size, ceildiv(hR, mr), ceildiv(hC, nr), itemsize, target)
    return Gemm(out, acc, packed, (a, b) if prepacked is None else (a, prepacked), mr, nr, swap, tuple(squeeze), work,
                s_outer=GEMM_S_OUTER.value(heuristic=s_outer), panel=panel, dot=dot,
                s_packed=s_packed, target=target, v_shared=all(isinstance(d, int) and d == 1 for d in vb) and hint(math.prod(batch)) > 1,
                streamed=s_size + v_size, flat=flat,
                prefetch=0 if prepacked is None or not static(K * C) else GEMM_PREFETCH.value(
                    heuristic=weight_prefetch(as_int(K), as_int(C), nr, prepacked.dtype.itemsize, target)))


def s_blocks_outside(s_elems: int, v_elems: int, s_blocks: int, v_panels: int, itemsize: int,
                     target: Target) -> bool:
    """The loop order of a GEMM's tiles (GEMM_S_OUTER's default): S blocks outside the V
    panels, or the panels outside. The inner operand is read once per outer tile, from L2
    where it stays there (half the target's L2: beside the outer tile and the output), else
    from L3 or memory: the order that streams fewer bytes from beyond L2, and where both
    stay (or as many stream) the larger operand outside, read once. A ConvNeXt stage-3
    projection at batch 4 (784x1536 @ 1536x384: V 2.4 MB against a 2 MB L2) swept all of V
    for each of its 131 S blocks, 309 MB; the panels outside read S (4.8 MB) once per panel,
    29 MB: 11.5 -> 9.1 ms, one thread, Sapphire Rapids (benchmarks/linear.py --also gemm.s_outer=true)."""
    stays = target.l2_bytes // 2
    s_bytes, v_bytes = s_elems * itemsize, v_elems * itemsize
    s_out = s_bytes + v_bytes * (s_blocks if v_bytes > stays else 1)
    v_out = v_bytes + s_bytes * (v_panels if s_bytes > stays else 1)
    return s_out < v_out if s_out != v_out else s_elems > v_elems


def _flat_rows(M, ba, vb, batch) -> int:
    """How many trailing batch dims fold into the rows: a batch of S matrices against one
    shared V runs as a single matrix of all their rows. A transformer's Linear at batch 8 x
    seq 32 is 8 products of 32 rows by one weight: tiled per item, 32 rows take six 6-row
    blocks (36 rows of FMAs, 12% wasted) and each V panel is swept 8 times in short runs; as
    one 256-row matrix, 43 blocks (258 rows). 1 thread, AVX-512 Zen 4, 32x768x3072 x 8:
    48.2 GMAC/s per item, 54.9 as 256x768x3072.

    A dim folds where V is 1 (shared) and S is not broadcast (each item its own rows),
    counted from the last batch dim inward (the merged Q/K/V GEMM's [3, batch, M, N] folds
    the batch, not its weight's planes), static or symbolic (a symbolic batch or M: the row
    is rebuilt from the fused loop's digits, which the simplifier joins back for symbolic
    divisors too). Leading size-1 dims stay outside (`lead`): the outermost folded dim's
    digit, f // (rows per item of it), is what carries the last row tile's padded rows past
    R, and an epilogue indexes a size-1 dim with the constant 0 (a broadcast), so folding
    [1, 56] x 56 rows made the accumulator's row (f // 56 % 56) * 56 + f % 56 = f % R: a
    region of every row, computed again per tile (a ConvNeXt at 32.7 s an inference).

    Where it pays: always taken where legal. It never pads more rows than the items tiled
    one by one (one last tile instead of one per item), reads each V panel in one sweep, and
    under symbolic dims a contiguous S is then read at row * K + k and the output written at
    row * N + c, with no division inside a tile; items of many rows (a ConvNeXt's 56, whole
    tiles already) gain nothing and lose nothing. One thread, thread CPU time (benchmarks/
    generic_shapes.py --corpus bert_base, load ~14): generic bert_base batch 8 x seq 32 162.6 ->
    151.5 ms (specialised 140.6-145.7); convnext_tiny batch 1 and 4 unchanged within noise."""
    n = len(batch)
    vb_full = [1] * (n - len(vb)) + list(vb)
    ba_full = [1] * (n - len(ba)) + list(ba)
    flat = 0
    while flat < n:
        d = n - 1 - flat
        if not (static(vb_full[d]) and as_int(vb_full[d]) == 1 and same_size(ba_full[d], batch[d])):
            break
        flat += 1
    while flat and static(batch[n - flat]) and as_int(batch[n - flat]) == 1:   # leading 1s stay in `lead`
        flat -= 1
    # an empty batch (a 0 dim) has no rows to fold
    return 0 if any(static(d) and as_int(d) == 0 for d in batch) else flat
