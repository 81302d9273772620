"""Classification losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both pick `-input[n, target[n, d...], d...]`, weight it by `weight[target]`
(0 where target == ignore_index) and reduce: none, sum, or mean = sum of
weighted losses / sum of weights. SoftmaxCrossEntropyLoss is that applied to
log_softmax over the class axis, optionally also returning the log-probabilities.
"""

from __future__ import annotations

import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.loops import call, cast, compute, const, select
from kiln.ops.reduce import as_dtype, bcast, const_output, exp_shifted, log_softmax, reduction, schedule_stages, text, wide
from kiln.ops.registry import InferCtx, LowerCtx, RunCtx, lowering, register
from kiln.ops.shapes import expect_shape
from kiln.ops.tensor import checked_index

_REDUCTIONS = ("none", "sum", "mean")


def _loss_infer(ctx: InferCtx):
    x, t = ctx.shape(0), ctx.shape(1)
    reduction = text(ctx.attr("reduction", "mean"))
    if reduction not in _REDUCTIONS:
        ctx.fail(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if x is not None:
        if len(x) < 2:
            ctx.fail(f"input must have shape (N, C, d1, ...), got {x}")
        if t is not None and (len(t) != len(x) - 1 or any(
                isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(t, (x[0], *x[2:])))):
            ctx.fail(f"target must have shape (N, d1, ...) for input shape {x}, got {t}")
        expect_shape(ctx, 2, (x[1],), "weight: one value per class")
    if not ctx.dtype(1).is_int:
        ctx.fail(f"target must be an integer tensor, got {ctx.dtype(1)}")
    loss_shape = (t if t is not None else (None if x is None else (x[0], *x[2:]))) if reduction == "none" else ()
    return [TensorType(ctx.dtype(0), loss_shape), TensorType(ctx.dtype(0), x)][:max(ctx.num_outputs, 1)]


def _nll(ctx: RunCtx, logp: np.ndarray, target: np.ndarray, weight):
    """Weighted, ignore-aware negative log-likelihood of `logp` (N, C, d...) at `target` (N, d...)."""
    ignore = ctx.attr("ignore_index", None)
    keep = np.ones(target.shape, bool) if ignore is None else target != ignore
    classes = logp.shape[1]
    idx = np.where(keep, target, 0).astype(np.int64)
    if np.any((idx < 0) | (idx >= classes)):
        ctx.fail(f"target values must lie in [0, {classes}) or equal ignore_index ({ignore})")
    picked = np.take_along_axis(logp, idx[:, None], axis=1)[:, 0]
    w = (wide(weight)[idx] if weight is not None else np.ones(idx.shape)) * keep
    loss = -picked * w
    reduction = text(ctx.attr("reduction", "mean"))
    if reduction == "sum":
        loss = loss.sum()
    elif reduction == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            loss = loss.sum() / w.sum()
    return as_dtype(loss, ctx.output_types[0].dtype.np)


def _nll_run(ctx: RunCtx, x, target, weight=None):
    return _nll(ctx, wide(x), target, weight)


def _sce_run(ctx: RunCtx, scores, labels, weights=None):
    logp = log_softmax(wide(scores), 1)
    loss = _nll(ctx, logp, labels, weights)
    return (loss, as_dtype(logp, scores.dtype)) if ctx.output_used(1) else loss


register("NegativeLogLikelihoodLoss", infer=_loss_infer, run=_nll_run)
register("SoftmaxCrossEntropyLoss", infer=_loss_infer, run=_sce_run)


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
