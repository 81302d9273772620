"""kiln::InvertedResidual's native kernel (cpu target): expand 1x1 -> depthwise -> project 1x1
in one pass over rows (kiln/codegen/c_src/inverted_residual.c), and kiln::ExpandDepthwise's: the
same kernel without the project conv (its rows stored, their means summed on the way). What is
chosen here, from the `Target` and the shapes:

- the 1x1 register tiles: ov channel blocks x RW<ov> columns of accumulators for ov = 1..4,
  with ov weight vectors and a broadcast beside them in the register file; the largest ov
  of the fewest loads per FMA is the main one (AVX-512's 32 registers: 4 x 6; AVX2's 16: 3 x 3);
- the channels each 1x1 conv sums over (`summed_channels`) and makes (`made_channels`): up to
  the last one with a nonzero weight (or bias), so a narrow tensor's padding lanes (24 channels
  in two 16-lane blocks: 8 of 32) are skipped instead of multiplied by zero weights, and a last
  block of at most half its lanes made on half vectors;
- `bands`: the parts each image's output rows are cut into, as parallel tasks: one per
  thread when there are fewer images than threads (a band recomputes the KH - stride expanded
  rows it shares with the band above: 2 rows of a 56-row band), else whole images.
"""

from __future__ import annotations

import numpy as np

from kiln.codegen.csource import c_parallel, c_shared, c_source
from kiln.dtypes import DType
from kiln.lower.context import lowering
from kiln.lower.nchwc import summed_channels
from kiln.lower.nnutil import parallel_worth
from kiln.ops.inverted_residual import ACTIVATIONS, activations, geometry
from kiln.ops.layout import DOMAIN
from kiln.targets.target import Target

MAX_COLUMNS = 13      # the widest tile the kernel's column switch has (and 14 accumulators)


def register_tiles(regs: int) -> tuple[int, dict[int, int]]:
    """(main ov, {ov: columns}) of the 1x1 tiles for a register file of `regs` vectors."""
    cols = {ov: max(1, min(MAX_COLUMNS, (regs - ov - 2) // ov)) for ov in (1, 2, 3, 4)}
    main = min(cols, key=lambda ov: ((cols[ov] + ov) / (cols[ov] * ov), -ov))
    return main, cols


def bands(n: int, oh: int, par: bool, target: Target) -> int:
    """Output-row bands per image (see the module doc)."""
    if not par or n >= target.cores:
        return 1
    return max(1, min(oh, -(-target.cores // n)))


def _last_used(used) -> int:
    idx = np.flatnonzero(np.asarray(used).reshape(-1))
    return int(idx[-1]) + 1 if idx.size else 1


def made_channels(w, b) -> int | None:
    """The output channels of a packed 1x1 weight and bias (OCB, L) up to the last with a nonzero
    weight or bias, or None when not known: those past it are act(0) = 0 whatever the input."""
    if w is None or b is None:
        return None
    return _last_used(np.any(np.asarray(w) != 0, axis=(1, 2, 3, 4)) | (np.asarray(b) != 0))


def macs(n, icb, h, w, ecb, ocb, oh, ow, kh, kw, lanes) -> int:
    """Multiply-adds of the three convs (the expand counted once per input pixel)."""
    e = ecb * lanes
    return n * (h * w * e * icb * lanes + oh * ow * e * (kh * kw + ocb * lanes))


def _c_float(v: float) -> str:
    if v != v:
        return "__builtin_nanf(\"\")"
    if abs(v) == float("inf"):
        return "__builtin_inff()" if v > 0 else "-__builtin_inff()"
    return f"{float(v)!r}f"


def _setup(ctx, x, w1, w2, w3, tensors) -> tuple[str, str, str, str]:
    """What both kernels' calls share: (the function, its preamble, the call's leading
    arguments after the tensors: sizes, and its trailing ones: strides, pads, acts, bands)."""
    target = Target.of(ctx.target)
    ecb, ocb, oh, ow = geometry(ctx, x.shape, w1.shape, w2.shape, None if w3 is None else w3.shape)
    op = ctx.node.op
    if any(t.dtype is not DType.float32 for t in tensors):
        ctx.fail(f"{op}'s native kernel takes float32", stage="lower")
    n, icb, h, w, lanes = x.shape
    if lanes not in (4, 8, 16):
        ctx.fail(f"{op}'s channel block {lanes} is not 4, 8 or 16 lanes", stage="lower")
    acts, clip = activations(ctx)
    kh, kw = (int(k) for k in w2.shape[2:4])
    if kh > 16:
        ctx.fail(f"{op}'s depthwise kernel has {kh} rows (the kernel keeps at most 16)", stage="lower")
    sh, sw = (int(s) for s in ctx.attr("strides", [1, 1]))
    pads = [int(p) for p in ctx.attr("pads", [0, 0, 0, 0])]
    main, cols = register_tiles(target.vector_registers)
    fn = f"kiln_inverted_residual_l{lanes}_o{main}_" + "_".join(str(cols[o]) for o in (1, 2, 3, 4))
    macros = {"KILN_IR_FN": fn, "KILN_IR_L": str(lanes), "KILN_IR_OV": str(main),
              **{f"KILN_IR_RW{o}": str(c) for o, c in cols.items()}, "KILN_IR_REGS": str(target.vector_registers)}
    # three units compiled in parallel (the file says which part holds what, and why)
    preamble = c_shared("inverted_residual.c", macros, fn.upper(),
                        helpers=c_source("kiln_sigmoid.h") + c_parallel(target.threads_impl), parts=3)
    work = macs(n, icb, h, w, ecb, ocb or 0, oh, ow, kh, kw, lanes)
    par = parallel_worth(work, target, "conv", streamed=w1.shape[0] * w1.shape[1] * lanes * lanes * 2)
    nb = bands(n, oh, par, target)
    icr = summed_channels(ctx.value(1)) or icb * lanes
    eco = made_channels(ctx.value(1), ctx.value(2)) or ecb * lanes
    if w3 is not None:
        ecr = summed_channels(ctx.value(5)) or ecb * lanes
        oco = made_channels(ctx.value(5), ctx.value(6)) or ocb * lanes
    codes = ", ".join(str(ACTIVATIONS[a][0]) for a in acts)
    los = ", ".join(_c_float(c) for c in clip[0::2])
    his = ", ".join(_c_float(c) for c in clip[1::2])
    decl = (f"  static const int32_t act[3] = {{{codes}}};\n"
            f"  static const float lo[3] = {{{los}}}, hi[3] = {{{his}}};\n")
    sizes = f"{n}, {icb}, {h}, {w}, {ecb}, " + ("" if ocb is None else f"{ocb}, ") + f"{oh}, {ow}"
    made = f"{icr}, {eco}" if w3 is None else f"{icr}, {ecr}, {eco}, {oco}"
    tail = f"{kh}, {kw}, {sh}, {sw}, {pads[0]}, {pads[1]}, {made}, act, lo, hi, {nb}, {int(par)}"
    return fn, preamble, decl, f"{sizes}, {tail}"


@lowering("InvertedResidual", domain=DOMAIN)
def _lower(ctx, x, w1, b1, w2, b2, w3, b3, r=None):
    fn, preamble, decl, args = _setup(ctx, x, w1, w2, w3, (x, w1, b1, w2, b2, w3, b3))
    body = (f"{decl}  return {fn}(in0, in1, in2, in3, in4, in5, in6, {'in7' if r is not None else 'NULL'}, out0, "
            f"{args});")
    return ctx.extern(body, [x, w1, b1, w2, b2, w3, b3, r], [(ctx.out_shape(0), ctx.out_dtype(0))],
                      preamble=preamble, errors={-1: "out of memory for the inverted residual's row buffers"})


@lowering("ExpandDepthwise", domain=DOMAIN)
def _lower_expand_depthwise(ctx, x, w1, b1, w2, b2):
    """The same kernel without its project conv (KILN_IR_FN_ed), the plane's means as out1 when `pool`."""
    fn, preamble, decl, args = _setup(ctx, x, w1, w2, None, (x, w1, b1, w2, b2))
    pool = bool(int(ctx.attr("pool", 0)))
    body = f"{decl}  return {fn}_ed(in0, in1, in2, in3, in4, out0, {'out1' if pool else 'NULL'}, {args});"
    outs = [(ctx.out_shape(i), ctx.out_dtype(i)) for i in range(2 if pool else 1)]
    return ctx.extern(body, [x, w1, b1, w2, b2], outs, preamble=preamble,
                      errors={-1: "out of memory for the expand/depthwise kernel's row buffers"})
