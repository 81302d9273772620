"""Linear models of `ai.onnx.ml`: LinearRegressor and LinearClassifier (what scikit-learn's
linear and logistic regression become through skl2onnx).
Their native lowerings live in kiln.lower.ml_linear.
"""

from __future__ import annotations

import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.ml_common import ML, numeric_input, post_name, post_transform, rows_type
from kiln.ops.registry import OPAQUE, op
from kiln.ops.strings import string_array


def _infer_linear_regressor(ctx):
    t = numeric_input(ctx)
    return [rows_type(ctx, t, int(ctx.attr("targets", 1)))]


@op("LinearRegressor", infer=_infer_linear_regressor, domain=ML, fusion=OPAQUE)
def linear_regressor(ctx, x):
    x = np.atleast_2d(x).astype(np.float32)
    n = int(ctx.attr("targets", 1))
    coef = np.asarray(ctx.attr("coefficients"), np.float32)
    if coef.size != n * x.shape[1]:
        ctx.fail(f"{coef.size} coefficients for {n} targets x {x.shape[1]} features")
    y = x @ coef.reshape(n, -1).T + np.asarray(ctx.attr("intercepts", [0.0] * n), np.float32)
    return post_transform(ctx, y, ctx.attr("post_transform", "NONE")).astype(np.float32)


# ---- LinearClassifier ----
#
# As ONNX Runtime: scores = X coef^T + intercepts (float). One score column with two
# labels is a binary model: the label is the second label when the score is positive,
# and the scores are written as [1 - p, p], p = logistic(s) under LOGISTIC, else s itself
# (ORT applies no other transform there);
# more columns: the label is the first greatest score's, then post_transform per row.

def _classifier_parts(ctx, width: int):
    ints, strs = ctx.attr("classlabels_ints", None), ctx.attr("classlabels_strings", None)
    if (ints is None) == (strs is None):
        ctx.fail("exactly one of classlabels_ints and classlabels_strings must be given")
    labels = [int(v) for v in ints] if ints is not None else [s.decode() if isinstance(s, bytes) else s for s in strs]
    coef = np.asarray(ctx.attr("coefficients"), np.float32).ravel()
    icpt = ctx.attr("intercepts", None)
    n = len(icpt) if icpt is not None else (coef.size // width if width else 0)
    icpt = np.zeros(n, np.float32) if icpt is None else np.asarray(icpt, np.float32).ravel()
    if n < 1 or coef.size != n * width:
        ctx.fail(f"{coef.size} coefficients for {n} classes x {width} features")
    post = post_name(ctx, ctx.attr("post_transform", "NONE"))
    add_second = n == 1 and len(labels) == 2
    if add_second and post == "PROBIT":
        ctx.fail("a binary LinearClassifier under PROBIT: ONNX Runtime writes half of its scores only")
    if n > 1 and len(labels) != n:
        ctx.fail(f"{len(labels)} class labels for {n} score columns")
    return coef.reshape(n, width), icpt, labels, strs is not None, post, add_second


def _infer_linear_classifier(ctx):
    t = numeric_input(ctx)
    width = t.shape[-1] if t.shape else None
    if not isinstance(width, int):
        ctx.fail(f"X needs a known feature count, got {t}")
    _, icpt, _, strings, _, add_second = _classifier_parts(ctx, width)
    z = rows_type(ctx, t, 2 if add_second else len(icpt))
    return [TensorType(DType.string if strings else DType.int64, z.shape[:1]), z]


@op("LinearClassifier", infer=_infer_linear_classifier, domain=ML, fusion=OPAQUE)
def linear_classifier(ctx, x):
    x = np.atleast_2d(x).astype(np.float32)
    coef, icpt, labels, strings, post, add_second = _classifier_parts(ctx, x.shape[1])
    s = (x.astype(np.float64) @ coef.T.astype(np.float64)).astype(np.float32) + icpt
    if len(icpt) == 1:
        pos, neg = (labels[1], labels[0]) if len(labels) == 2 else (("1", "0") if strings else (1, 0))
        y = [pos if v > 0 else neg for v in s[:, 0].tolist()]
        p1 = (1 / (1 + np.exp(-s[:, 0].astype(np.float64)))).astype(np.float32) if post == "LOGISTIC" else s[:, 0]
        z = np.stack([1 - p1, p1], 1) if add_second else post_transform(
            ctx, s.astype(np.float64), "PROBIT" if post == "PROBIT" else "NONE")
    else:
        y = [labels[i] for i in np.argmax(s, 1).tolist()]
        z = post_transform(ctx, s.astype(np.float64), post)
    y = string_array(y, (len(y),)) if strings else np.asarray(y, np.int64)
    return y, np.asarray(z, np.float32)
