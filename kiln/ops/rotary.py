"""kiln::RotaryHalf: rotary position embedding as Llama-style models write it, one op.

    RotaryHalf(x, cos, sin) = x * cos + rotate_half(x) * sin
    rotate_half(x) = Concat(-x[..., D/2:], x[..., :D/2])   (over the last axis, D even)

cos and sin broadcast (numpy, right-aligned) to x without widening it; every product and
the sum round in x's dtype, as the decomposed graph does. The `recognize_rotary` pass
(kiln.passes.rotary) rewrites the Mul/Slice/Neg/Concat/Mul/Add form exporters emit to it;
unlike ONNX RotaryEmbedding it takes the full-width cos/sin the model computed (no
assumption that their halves agree) and is injective, so the head split in front of it
joins its kernel.
"""

from __future__ import annotations

import numpy as np

from kiln.ops.registry import INJECTIVE, InferCtx, RunCtx, op

DOMAIN = "kiln"


def _fits(cd, xd) -> bool:
    """Whether a cos/sin dim broadcasts to x's without widening it. Sizes known: 1 or equal.
    A symbolic dim (a shape-generic module's sizes, `_u` names of sizes computed in the
    graph) may equal the other side, as in every valid model; only x's 1 against a symbol
    could widen the result, and that is refused."""
    if isinstance(cd, int) and isinstance(xd, int):
        return cd in (1, xd)
    return cd == 1 or cd == xd or not isinstance(xd, int) or xd != 1   # x's 1 against a symbol may widen


def _rotary_infer(ctx: InferCtx):
    x = ctx.tensor(0)
    if not x.dtype.is_float:
        ctx.fail(f"x must be a float tensor, got {x.dtype}")
    for i, name in ((1, "cos"), (2, "sin")):
        if ctx.dtype(i) != x.dtype:
            ctx.fail(f"input {i} ({name}) has dtype {ctx.dtype(i)}, x {x.dtype}")
    s = x.shape
    if s is not None:
        if not s or (isinstance(s[-1], int) and s[-1] % 2):
            ctx.fail(f"x needs an even last axis, got shape {tuple(s)}")
        for i, name in ((1, "cos"), (2, "sin")):
            c = ctx.shape(i)
            if c is not None and (len(c) > len(s) or not all(_fits(cd, xd) for cd, xd in zip(c[::-1], s[::-1]))):
                ctx.fail(f"input {i} ({name}) of shape {tuple(c)} does not broadcast to x's {tuple(s)}")
    return [x]


@op("RotaryHalf", infer=_rotary_infer, fusion=INJECTIVE, domain=DOMAIN)
def rotary_half(ctx: RunCtx, x, cos, sin):
    h = x.shape[-1] // 2
    with np.errstate(all="ignore"):
        return (x * cos + np.concatenate([-x[..., h:], x[..., :h]], axis=-1) * sin).astype(x.dtype)
