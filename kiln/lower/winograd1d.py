"""kiln::ConvWinograd1D's native kernel (cpu target): F(m, r) of 1-D signals on the blocked layout.

The kernel is C (kiln/codegen/c_src/winograd1d.c), instantiated per m, r, channel block and
register tile; its transform matrices are written into it from kiln.ops.winograd.matrices
(exact rationals, so the zero and one entries fold away). The register tile is the 2-D
kernel's (kiln.lower.winograd.register_tile); the chunks of tiles are small (`plan`).
"""

from __future__ import annotations

from kiln.codegen.csource import c_instance, c_source
from kiln.loops.symbols import c_size, static
from kiln.lower.conv_algo import tiles_1d
from kiln.lower.context import lowering
from kiln.lower.nnutil import parallel_from
from kiln.lower.winograd import decided, gemm_instance, register_tile, taken
from kiln.ops.winograd import matrices
from kiln.ops.winograd1d import DOMAIN, geometry, taps
from kiln.targets.target import Target


TASKS_PER_THREAD = 8     # chunks of tiles per thread, where the tiles allow


def plan(tiles: int, positions: int, ic: int, ocb: int, target: Target) -> tuple[int, int, int, int]:
    """(TR, OV, T, osplit): the register tile (kiln.lower.winograd.register_tile), T tiles per
    chunk and the parts `osplit` each chunk's output channels are cut into.

    Chunks are small, a register block or a few: about TASKS_PER_THREAD per thread, so that a
    thread woken late still finds work (tasks are taken dynamically), and each chunk's
    transformed input (positions x T x IC floats) within half of L2. A chunk's GEMMs stream
    every weight once whatever T (128 channels, 398 samples, F(6, 3), one thread: T = 6 0.199 ms,
    12 0.206, 36 with osplit 2 0.211); osplit > 1 (the chunk's input transformed once per part)
    only when there are fewer than two chunks per thread."""
    tr, ov = register_tile(ocb, target)
    threads = max(1, target.cores)
    per_tile = positions * ic * 4
    t = tr * max(1, tiles // (tr * TASKS_PER_THREAD * threads))
    t = max(tr, min(t, (target.l2_bytes // 2) // per_tile // tr * tr))
    nchunk = -(-tiles // t)
    osplit = 1 if nchunk >= 2 * threads else min(ocb // ov, -(-2 * threads // nchunk))
    return decided(tr, ov, t, max(osplit, 1), ocb)


def _c_matrix(a) -> str:
    return "{" + ", ".join("{" + ", ".join(f"{float(v)!r}f" for v in row) + "}" for row in a) + "}"


@lowering("ConvWinograd1D", domain=DOMAIN)
def _lower(ctx, x, u, b=None):
    target = Target.of(ctx.target)
    m, pads, d, st, k, ow = geometry(ctx, x.shape, u.shape)
    r = taps(k, st)
    taken(ctx, "ConvWinograd1D", x, u)
    n, icb, _, w, lanes = x.shape
    ocb = u.shape[1]
    # chunks planned for one image when the batch is symbolic (images are the kernel's outer loop)
    tiles = tiles_1d(n if static(n) else 1, ow, d, m)
    tr, ov, t, osplit = plan(tiles, m + r - 1, icb * st * lanes, ocb, target)
    fn = f"kiln_winograd1d_f{m}x{r}_l{lanes}_r{tr}_o{ov}"
    at, _, bt = matrices(m, r)
    gemm = gemm_instance(fn, lanes, tr, ov)
    preamble = gemm[1] + c_source("kiln_par.h") + c_instance("winograd1d.c", {
        "KILN_WG1_FN": fn, "KILN_WG1_GEMM": gemm[0], "KILN_WG1_L": str(lanes), "KILN_WG1_M": str(m), "KILN_WG1_R": str(r),
        "KILN_WG1_TR": str(tr),
        "KILN_WG1_OV": str(ov), "KILN_WG1_AT": _c_matrix(at), "KILN_WG1_BT": _c_matrix(bt)}, fn.upper())
    par = parallel_from(n, lambda k: tiles_1d(k, ow, d, m) * (m + r - 1) * icb * st * lanes * ocb * lanes, target)
    body = (f"  return {fn}(in0, in1, {'in2' if b is not None else 'NULL'}, out0, {c_size(n)}, {icb}, {w}, "
            f"{ocb}, {ow}, {pads[0]}, {d}, {st}, {t}, {osplit}, {int(ctx.attr('relu', 0))}, {par});")
    return ctx.extern(body, [x, u, b], [(ctx.out_shape(0), ctx.out_dtype(0))], preamble=preamble,
                      errors={-1: "out of memory for the Winograd transform buffers"})
