"""Native lowerings of the random generators (kiln.ops.random). (Dropout's training mode, which
draws from NumPy's legacy MT19937, is kiln/codegen/c_src/dropout.c.)
"""

from __future__ import annotations

import numpy as np

from kiln.codegen.csource import c_instance, c_source
from kiln.dtypes import DType
from kiln.lower.context import lowering
import kiln.ops.random  # noqa: F401  (registers the ops lowered here)


# ---- native lowerings ----
#
# A seeded node draws exactly the reference's numbers: the C kernel runs NumPy's PCG64
# (128-bit LCG, XSL-RR output) from the state `default_rng(seed)` starts in (computed here,
# at compile time) and turns draws into doubles as NumPy does ((u64 >> 11) * 2^-53). Each
# call starts again from that state, as the reference does. Without a seed each call seeds
# from a call counter, the library's load address and the time-stamp counter (x86), so
# calls and processes draw fresh values. RandomNormal(Like) has no lowering: NumPy's
# normals come from its ziggurat tables, which kiln does not reproduce.

def _pcg_init(ctx) -> str:
    """C declaring `pcg_` (kiln_pcg, kiln/codegen/c_src/kiln_random.h) in the state the node
    starts from: the seeded reference's (computed here), else fresh entropy."""
    mask = (1 << 64) - 1
    if not ctx.has_attr("seed"):
        return "  kiln_pcg pcg_ = kiln_pcg_fresh();\n"
    try:
        seed = int(np.float32(ctx.attr("seed")).view(np.int32))  # as RunCtx.rng() seeds
        state = np.random.default_rng(seed).bit_generator.state["state"]
    except (ValueError, TypeError) as e:
        ctx.fail(f"seed {ctx.attr('seed')!r} does not seed NumPy's generator: {e}")
    s, inc = int(state["state"]), int(state["inc"])
    return (f"  kiln_pcg pcg_ = {{((unsigned __int128){s >> 64}ULL << 64) | {s & mask}ULL,\n"
            f"                   ((unsigned __int128){inc >> 64}ULL << 64) | {inc & mask}ULL, KILN_PCG_MUL}};\n")


def _ctype(ctx, dt: DType) -> str:
    if dt.c is None:
        ctx.fail(f"output type {dt} has no native (C) type", stage="lower")
    return dt.c


def _uniform_lower(ctx, *inputs):
    """The kernel kiln/codegen/c_src/uniform.c, instantiated for the output type."""
    dt = ctx.out_dtype()
    low, high = float(ctx.attr("low", 0.0)), float(ctx.attr("high", 1.0))
    if not np.isfinite(high - low):
        ctx.fail(f"high - low must be finite, got {high} - {low}")
    n = int(np.prod(ctx.out_shape()))
    fn = f"kiln_uniform_{dt.name}"
    macros = {"KILN_UNIFORM_O": _ctype(ctx, dt), "KILN_UNIFORM_FN": fn}
    body = _pcg_init(ctx) + f"  return {fn}(out0, {n}, {low.hex()}, {(high - low).hex()}, &pcg_);"
    return ctx.extern(body, list(inputs), [(ctx.out_shape(), dt)],
                      preamble=c_source("kiln_random.h") + c_instance("uniform.c", macros, fn.upper()))


lowering("RandomUniform")(_uniform_lower)
lowering("RandomUniformLike")(_uniform_lower)


@lowering("Bernoulli")
def _bernoulli_lower(ctx, p):
    """The kernel kiln/codegen/c_src/bernoulli.c, instantiated for the input and output types."""
    dt, pt = ctx.out_dtype(), ctx.input_types[0].dtype
    n = int(np.prod(ctx.out_shape()))
    fn = f"kiln_bernoulli_{pt.name}_{dt.name}"
    macros = {"KILN_BERNOULLI_T": _ctype(ctx, pt), "KILN_BERNOULLI_O": _ctype(ctx, dt), "KILN_BERNOULLI_FN": fn}
    body = _pcg_init(ctx) + f"  return {fn}(in0, out0, {n}, &pcg_);"
    return ctx.extern(body, [p], [(ctx.out_shape(), dt)],
                      preamble=c_source("kiln_random.h") + c_instance("bernoulli.c", macros, fn.upper()))


@lowering("Multinomial")
def _multinomial_lower(ctx, logits):
    dt = ctx.out_dtype()
    rows, classes = ctx.input_types[0].shape
    samples = int(ctx.attr("sample_size", 1))
    if classes < 1:
        ctx.fail("Multinomial needs at least one class")
    lt = ctx.input_types[0].dtype
    fn = f"kiln_multinomial_{lt.name}_{dt.name}"
    macros = {"KILN_MULTINOMIAL_T": _ctype(ctx, lt), "KILN_MULTINOMIAL_O": _ctype(ctx, dt), "KILN_MULTINOMIAL_FN": fn}
    body = _pcg_init(ctx) + f"  return {fn}(in0, out0, {rows}, {classes}, {samples}, &pcg_);"
    return ctx.extern(body, [logits], [(ctx.out_shape(), dt)],
                      preamble=c_source("kiln_random.h") + c_instance("multinomial.c", macros, fn.upper()))
