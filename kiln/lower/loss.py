"""Native lowerings of NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (kiln.ops.loss)."""

from __future__ import annotations

import numpy as np

import kiln.ops.loss  # noqa: F401  (registers the ops lowered here)
from kiln.dtypes import DType
from kiln.loops import call, cast, compute, const, select
from kiln.lower.reduce import bcast, const_output, exp_shifted, reduction, schedule_stages
from kiln.lower.tensor import checked_index
from kiln.ops.reduce import text
from kiln.lower.context import LowerCtx, lowering


# ==== native lowerings (target "cpu") ====
#
# In float64 as the reference. A target outside [0, C) (and not ignore_index) is an
# error in the reference and fails the kernel (a run-time check); the clamped class
# it reads meanwhile is never out of bounds.

_F64, _I64 = DType.float64, DType.int64


def _nll_lower(ctx: LowerCtx, logp, target, weight, classes: int, plans: dict):
    """The weighted, reduced NLL of `logp(n, class, d...)` (a float64 Expr builder)."""
    tshape, dt = tuple(target.shape), ctx.out_dtype(0)
    ignore = ctx.attr("ignore_index", None)
    reduction_ = text(ctx.attr("reduction", "mean"))

    def keep(j):
        return target[j].ne(const(ignore, target.dtype)) if ignore is not None else None

    def cls(j):
        t = cast(_I64, target[j])
        t = select(keep(j), t, const(0, _I64)) if ignore is not None else t
        return checked_index(ctx, t, 0, classes - 1, f"target value {{value}} is out of range [0, {classes - 1}]"
                             + ("" if ignore is None else f" and is not ignore_index ({ignore})"))

    def w(j):
        wt = cast(_F64, weight[(cls(j),)]) if weight is not None else const(1, _F64)
        return wt * select(keep(j), const(1, _F64), const(0, _F64)) if ignore is not None else wt

    def loss(j):
        return -logp(j[0], cls(j), j[1:]) * w(j)
    if reduction_ == "none":
        return compute(tshape, lambda *j: cast(dt, loss(j)), "loss")
    if 0 in tshape:
        return const_output(ctx, np.array(0.0 if reduction_ == "sum" else np.nan))
    every = range(len(tshape))
    total = reduction(tshape, every, False, loss, "sum", "total")
    plans[total] = 0
    if reduction_ == "sum":
        return compute((), lambda: cast(dt, total[()]), "loss")
    wsum = reduction(tshape, every, False, w, "sum", "wsum")
    plans[wsum] = 0
    return compute((), lambda: cast(dt, total[()] / wsum[()]), "loss")


@lowering("NegativeLogLikelihoodLoss")
def _nll_loss_lower(ctx: LowerCtx, x, target, weight=None):
    plans = {}
    y = _nll_lower(ctx, lambda n, c, d: cast(_F64, x[(n, c, *d)]), target, weight, x.shape[1], plans)
    ctx.schedule(lambda sch, outs: schedule_stages(sch, plans))
    return y


@lowering("SoftmaxCrossEntropyLoss")
def _sce_lower(ctx: LowerCtx, scores, labels, weights=None):
    """log_softmax over the class axis (max, exp-sum; picked entries recomputed from
    them), then the NLL; the log-probabilities are an output only when asked for."""
    shape, axes = tuple(scores.shape), [1]
    inner = len(shape) - 2
    m = reduction(shape, axes, True, lambda i: cast(_F64, scores[i]), "max", "max")
    s = reduction(shape, axes, True, lambda i: exp_shifted(cast(_F64, scores[i]) - bcast(m, axes, i)), "sum", "sum")

    def logp(i):
        return cast(_F64, scores[i]) - bcast(m, axes, i) - call("log", bcast(s, axes, i))
    plans = {m: inner, s: inner}
    loss = _nll_lower(ctx, lambda n, c, d: logp((n, c, *d)), labels, weights, shape[1], plans)
    outs = [loss]
    if ctx.output_used(1):
        outs.append(compute(shape, lambda *i: cast(ctx.out_dtype(1), logp(i)), "log_prob"))
    ctx.schedule(lambda sch, outs: schedule_stages(sch, plans))
    return outs
