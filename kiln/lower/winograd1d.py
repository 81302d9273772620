"""kiln::ConvWinograd1D's native kernel (cpu target): F(m, 3) of 1-D signals on the blocked layout.

The kernel is C (kiln/codegen/c_src/winograd1d.c), instantiated per m, channel block and
register tile; its transform matrices are written into it from kiln.ops.winograd.matrices
(exact rationals, so the zero and one entries fold away). The register tile and the chunks of
tiles are chosen as for the 2-D kernel (kiln.lower.winograd.register_tile, chunking), with
m + 2 GEMMs per chunk instead of 36.
"""

from __future__ import annotations

from kiln.codegen.csource import c_instance
from kiln.dtypes import DType
from kiln.lower.conv_algo import CONV_ALGORITHM
from kiln.lower.context import lowering
from kiln.lower.nnutil import parallel_worth
from kiln.lower.winograd import chunking
from kiln.ops.winograd import matrices
from kiln.ops.winograd1d import DOMAIN, geometry
from kiln.targets.target import Target


def tiles_of(n: int, ow: int, dilation: int, m: int) -> int:
    """Tiles over the batch: m outputs of one phase each."""
    return n * dilation * (-(-(-(-ow // dilation)) // m))


def _c_matrix(a) -> str:
    return "{" + ", ".join("{" + ", ".join(f"{float(v)!r}f" for v in row) + "}" for row in a) + "}"


@lowering("ConvWinograd1D", domain=DOMAIN)
def _lower(ctx, x, u, b=None):
    target = Target.of(ctx.target)
    m, pads, d, ow = geometry(ctx, x.shape, u.shape)
    if x.dtype is not DType.float32 or u.dtype is not DType.float32:
        ctx.fail(f"ConvWinograd1D's native kernel takes float32, got {x.dtype} and {u.dtype}", stage="lower")
    if CONV_ALGORITHM.asked() not in (None, "winograd"):
        raise CONV_ALGORITHM.illegal(CONV_ALGORITHM.asked(), "the conv algorithm is chosen by the layout pass; "
                                     "ask it of kiln.compile (decisions={'conv.algorithm': ...}) for the model")
    CONV_ALGORITHM.value("winograd")
    n, icb, _, w, lanes = x.shape
    ocb = u.shape[1]
    tiles = tiles_of(n, ow, d, m)
    tr, ov, t, osplit = chunking(tiles, m + 2, icb * lanes, ocb, lanes, target)
    fn = f"kiln_winograd1d_f{m}_l{lanes}_r{tr}_o{ov}"
    at, _, bt = matrices(m)
    preamble = c_instance("winograd1d.c", {
        "KILN_WG1_FN": fn, "KILN_WG1_L": str(lanes), "KILN_WG1_M": str(m), "KILN_WG1_TR": str(tr),
        "KILN_WG1_OV": str(ov), "KILN_WG1_AT": _c_matrix(at), "KILN_WG1_BT": _c_matrix(bt)}, fn.upper())
    work = tiles * (m + 2) * icb * lanes * ocb * lanes
    par = int(parallel_worth(work, target, "conv"))
    body = (f"  return {fn}(in0, in1, {'in2' if b is not None else 'NULL'}, out0, {n}, {icb}, {w}, "
            f"{ocb}, {ow}, {pads[0]}, {d}, {t}, {osplit}, {int(ctx.attr('relu', 0))}, {par});")
    return ctx.extern(body, [x, u, b], [(ctx.out_shape(0), ctx.out_dtype(0))], preamble=preamble,
                      errors={-1: "out of memory for the Winograd transform buffers"})
