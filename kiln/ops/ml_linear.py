"""Linear models of `ai.onnx.ml`: LinearRegressor and LinearClassifier (what scikit-learn's
linear and logistic regression become through skl2onnx)."""

from __future__ import annotations

import numpy as np

from kiln.dtypes import DType
from kiln.ops.ml_common import (ML, c_post_transform as _c_post_transform, c_table as _table, c_type as _c_type,
                                numeric_input, post_transform, rows_type, rows_width)
from kiln.ops.registry import lowering, op


def _infer_linear_regressor(ctx):
    t = numeric_input(ctx)
    return [rows_type(ctx, t, int(ctx.attr("targets", 1)))]


@op("LinearRegressor", infer=_infer_linear_regressor, domain=ML)
def linear_regressor(ctx, x):
    x = np.atleast_2d(x).astype(np.float32)
    n = int(ctx.attr("targets", 1))
    coef = np.asarray(ctx.attr("coefficients"), np.float32)
    if coef.size != n * x.shape[1]:
        ctx.fail(f"{coef.size} coefficients for {n} targets x {x.shape[1]} features")
    y = x @ coef.reshape(n, -1).T + np.asarray(ctx.attr("intercepts", [0.0] * n), np.float32)
    return post_transform(ctx, y, ctx.attr("post_transform", "NONE")).astype(np.float32)


@lowering("LinearRegressor", domain=ML)
def _linear_regressor_lower(ctx, x):
    xt = ctx.input_types[0]
    _c_type(ctx, xt.dtype)
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
  for (int64_t row = 0; row < {rows}; ++row) {{
    for (int64_t t = 0; t < {n}; ++t) {{
      double acc = 0;
      for (int64_t j = 0; j < {width}; ++j) acc += (double)(float)in0[row * {width} + j] * (double)coef[t * {width} + j];
      a[t] = (double)((float)acc + icpt[{'0' if icpt.size == 1 else 't'}]);
    }}
{_c_post_transform(ctx, ctx.attr("post_transform", "NONE"), n)}    for (int64_t t = 0; t < {n}; ++t) out0[row * {n} + t] = (float)a[t];
  }}
  return 0;""")
    return ctx.extern(body, [x], [(ctx.out_shape(), DType.float32)])
