"""Classification losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both pick `-input[n, target[n, d...], d...]`, weight it by `weight[target]`
(0 where target == ignore_index) and reduce: none, sum, or mean = sum of
weighted losses / sum of weights. SoftmaxCrossEntropyLoss is that applied to
log_softmax over the class axis, optionally also returning the log-probabilities.
Their native lowerings live in kiln.lower.loss.
"""

from __future__ import annotations

import numpy as np

from kiln.graph.types import TensorType
from kiln.ops.reduce import as_dtype, log_softmax, text, wide
from kiln.ops.registry import OPAQUE, InferCtx, RunCtx, register
from kiln.ops.shapes import expect_shape


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


register("NegativeLogLikelihoodLoss", infer=_loss_infer, run=_nll_run, fusion=OPAQUE)
register("SoftmaxCrossEntropyLoss", infer=_loss_infer, run=_sce_run, fusion=OPAQUE)
