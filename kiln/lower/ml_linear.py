"""Native lowerings of LinearRegressor and LinearClassifier (kiln.ops.ml_linear):
hand-written C kernels with the coefficients baked in.
"""

from __future__ import annotations

import numpy as np

from kiln.codegen.csource import c_instance
from kiln.dtypes import DType
from kiln.lower.ml_common import (c_labels, c_post_transform as _c_post_transform, c_table as _table,
    c_type as _c_type, label_extern, post_transform_c, rows_width)
from kiln.ops.ml_common import ML
from kiln.ops.ml_linear import _classifier_parts
from kiln.lower.context import lowering


def _scores(ctx, dt: DType) -> tuple[str, str]:
    """(function, its C): kiln/codegen/c_src/linear_scores.c instantiated for the input type."""
    fn = f"kiln_linear_scores_{dt.name}"
    return fn, c_instance("linear_scores.c", {"KILN_LINEAR_T": _c_type(ctx, dt), "KILN_LINEAR_FN": fn}, fn.upper())


@lowering("LinearRegressor", domain=ML)
def _linear_regressor_lower(ctx, x):
    xt = ctx.input_types[0]
    fn, scores = _scores(ctx, xt.dtype)
    if xt.rank > 2:
        ctx.fail(f"X must be 1-D or 2-D, got {xt}", stage="lower")
    rows, width = (1, xt.shape[0]) if xt.rank == 1 else xt.shape if xt.rank == 2 else (1, 1)
    n = int(ctx.attr("targets", 1))
    coef = np.asarray(ctx.attr("coefficients"), np.float32).ravel()
    if coef.size != n * width:
        ctx.fail(f"{coef.size} coefficients for {n} targets x {width} features")
    icpt = np.asarray(ctx.attr("intercepts", [0.0] * n), np.float32).ravel()
    if icpt.size not in (1, n):
        ctx.fail(f"{icpt.size} intercepts for {n} targets")
    body = (_table(ctx, "coef", "float", coef, DType.float32) + _table(ctx, "icpt", "float", icpt, DType.float32) +
            f"""  double a[{max(n, 1)}];
  float s[{max(n, 1)}];
  for (int64_t row = 0; row < {rows}; ++row) {{
    {fn}(in0 + row * {width}, coef, icpt, {0 if icpt.size == 1 else 1}, {n}, {width}, s);
    for (int64_t t = 0; t < {n}; ++t) a[t] = (double)s[t];
{_c_post_transform(ctx, ctx.attr("post_transform", "NONE"), n)}    for (int64_t t = 0; t < {n}; ++t) out0[row * {n} + t] = (float)a[t];
  }}
  return 0;""")
    return ctx.extern(body, [x], [(ctx.out_shape(), DType.float32)], preamble=post_transform_c() + scores)


@lowering("LinearClassifier", domain=ML)
def _linear_classifier_lower(ctx, x):
    xt = ctx.input_types[0]
    fn, scores = _scores(ctx, xt.dtype)
    rows, width = rows_width(ctx, xt)
    coef, icpt, labels, strings, post, add_second = _classifier_parts(ctx, width)
    n = len(icpt)
    body = (_table(ctx, "coef", "float", coef, DType.float32) + _table(ctx, "icpt", "float", icpt, DType.float32) +
            c_labels(ctx, labels, strings))
    if n == 1:
        pos, neg = ("labels[1]", "labels[0]") if len(labels) == 2 else (
            ('(kiln_str){"1", 1}', '(kiln_str){"0", 1}') if strings else ("1", "0"))
        tail = f"""    out0[row] = s[0] > 0 ? {pos} : {neg};
    {("const float p1 = " + ("(float)(1.0 / (1.0 + exp(-(double)s[0])));" if post == "LOGISTIC" else "s[0];")
      + " out1[row * 2] = 1.0f - p1; out1[row * 2 + 1] = p1;") if add_second else
     "double a[1] = {(double)s[0]};" + chr(10) + _c_post_transform(ctx, "PROBIT" if post == "PROBIT" else "NONE", 1)
     + "    out1[row] = (float)a[0];"}"""
    else:
        tail = f"""    int64_t best = 0;
    for (int64_t t = 1; t < {n}; ++t) if (s[t] > s[best]) best = t;
    out0[row] = labels[best];
    double a[{n}];
    for (int64_t t = 0; t < {n}; ++t) a[t] = (double)s[t];
{_c_post_transform(ctx, post, n)}    for (int64_t t = 0; t < {n}; ++t) out1[row * {n} + t] = (float)a[t];"""
    body += f"""  #pragma omp parallel for schedule(static) if ({rows} >= 1024)
  for (int64_t row = 0; row < {rows}; ++row) {{
    float s[{n}];
    {fn}(in0 + row * {width}, coef, icpt, 1, {n}, {width}, s);
{tail}
  }}
  return 0;"""
    return label_extern(ctx, body, [x], [(ctx.out_shape(0), DType.string if strings else DType.int64),
                                         (ctx.out_shape(1), DType.float32)], strings, preamble=scores)
