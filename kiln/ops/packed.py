"""kiln's GEMM with a weight packed ahead of time (introduced by kiln.passes.pack_weights).

- `MatMulPacked(a, wp, c?) {n, alpha, beta}`: y = alpha * (a @ w) + beta * c, where
  a is [..., M, K] (numpy.matmul batch rules, rank >= 2), w is the [..., K, n] weight and
  wp is w packed as the GEMM micro-kernel reads it: each matrix as panels [ceil(n / nr),
  K, nr] of nr columns (kiln.lower.gemm.pack_weight), the padded columns zero, so wp is
  [..., P, K, nr] (a stack of weights: kiln.passes.merge_gemms); c (optional) broadcasts
  into the output [..., M, n]. Without c it is MatMul(a, w) exactly; with it, Gemm(a, w, c)
  (alpha and beta default to 1).

The panel width nr is the vector width times the micro-kernel's vectors per row
(kiln.lower.gemm.weight_panel_width, from the `Target` compiled for), so
the native kernel reads the panels in place: no packing at run time.
"""

from __future__ import annotations

import numpy as np

from kiln.graph.types import TensorType
from kiln.ops.linalg import matmul_shape
from kiln.ops.reduce import as_dtype, wide
from kiln.ops.registry import OUT_FUSABLE, op

DOMAIN = "kiln"


def unpack_weight(wp: np.ndarray, n: int) -> np.ndarray:
    """The [..., K, n] weight of panels [..., P, K, nr]."""
    *wb, p, k, nr = wp.shape
    r = len(wb)
    return wp.transpose(*range(r), r + 1, r, r + 2).reshape(*wb, k, p * nr)[..., :n]


def _check(ctx, a, wp, n):
    if wp is None:
        return
    if len(wp) < 3:
        ctx.fail(f"MatMulPacked needs weight panels [..., P, K, nr], got shape {tuple(wp)}")
    p, k, nr = wp[-3:]
    if isinstance(n, int) and isinstance(p, int) and isinstance(nr, int) and -(-n // nr) != p:
        ctx.fail(f"weight panels {tuple(wp)} do not hold n={n} columns")
    if a is not None and len(a) < 2:
        ctx.fail(f"MatMulPacked needs a of rank >= 2, got shape {tuple(a)}")


def _infer(ctx):
    a, wp, n = ctx.shape(0), ctx.shape(1), int(ctx.attr("n"))
    _check(ctx, a, wp, n)
    if a is None or wp is None:
        return [TensorType(ctx.dtype(0), None)]
    return [TensorType(ctx.dtype(0), matmul_shape(ctx, a, (*wp[:-3], wp[-2], n)))]


@op("MatMulPacked", infer=_infer, domain=DOMAIN, fusion=OUT_FUSABLE)
def matmul_packed(ctx, a, wp, c=None):
    """MatMul (no c) or Gemm (with c) of a and the unpacked weight, as their references."""
    w = unpack_weight(wp, int(ctx.attr("n")))
    y = np.matmul(wide(a), wide(w))
    if c is None and "alpha" not in ctx.node.attrs:
        return as_dtype(y, a.dtype)
    y = ctx.attr("alpha", 1.0) * y
    if c is not None:
        y = y + ctx.attr("beta", 1.0) * wide(c)
    return as_dtype(y, a.dtype)
