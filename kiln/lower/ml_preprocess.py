"""Native lowerings of the `ai.onnx.ml` row-wise preprocessing ops (kiln.ops.ml_preprocess).

Binarizer is a compute; the others are small C kernels with their tables baked in.
"""

from __future__ import annotations

import math

import numpy as np

import kiln.loops as L

from kiln.codegen.csource import c_instance
from kiln.dtypes import DType
from kiln.lower.ml_common import c_table as _table, c_type as _c_type
from kiln.ops.ml_common import ML
from kiln.ops.ml_preprocess import _categories, _per_feature
from kiln.lower.context import lowering


# ---- native lowerings ----

@lowering("Binarizer", domain=ML)
def _binarizer_lower(ctx, x):
    dt = ctx.input_types[0].dtype
    _c_type(ctx, dt)
    thr = float(ctx.attr("threshold", 0.0))
    if dt.is_float:  # the threshold is rounded to the input's type (NumPy's weak Python scalars)
        thr_e = L.const(float(np.asarray(thr, dt.np)), DType.float64)
        val = lambda v: L.cast(DType.float64, v)  # noqa: E731 - exact for every float type
    else:
        thr_e, val = L.const(thr, DType.float64), (lambda v: L.cast(DType.float64, v))
    return L.compute(x.shape, lambda *i: L.select(val(x[i]) > thr_e, L.const(1, dt), L.const(0, dt)),
                     "binarizer")


@lowering("ArrayFeatureExtractor", domain=ML)
def _feature_extractor_lower(ctx, x, indices):
    xt = ctx.input_types[0]
    t = _c_type(ctx, xt.dtype)
    width = xt.shape[-1] if xt.shape else 1
    k = math.prod(ctx.input_types[1].shape)
    rows = math.prod(xt.shape[:-1]) if xt.shape else 1
    body = f"""  for (int64_t j = 0; j < {k}; ++j) if (in1[j] < 0 || in1[j] >= {width}) KILN_FAIL(1, in1[j]);
  for (int64_t r = 0; r < {rows}; ++r)
    for (int64_t j = 0; j < {k}; ++j) out0[r * {k} + j] = in0[r * {width} + in1[j]];
  (void)sizeof({t});
  return 0;"""
    return ctx.extern(body, [x, indices], [(ctx.out_shape(), xt.dtype)],
                      errors={1: f"index {{value}} is out of range [0, {width - 1}] of the last axis"})


def _feature_table(ctx, name: str, default: float, width: int) -> tuple[str, str]:
    """A per-feature float32 attribute as a C table and the C index to read it with."""
    v = _per_feature(ctx, name, default, width)
    return _table(ctx, name, "float", v, DType.float32), ("0" if len(v) == 1 else "j")


@lowering("Scaler", domain=ML)
def _scaler_lower(ctx, x):
    xt = ctx.input_types[0]
    _c_type(ctx, xt.dtype)
    width = xt.shape[-1] if xt.shape else 1
    off, oi = _feature_table(ctx, "offset", 0.0, width)
    sc, si = _feature_table(ctx, "scale", 1.0, width)
    n = math.prod(xt.shape)
    body = off + sc + f"""  for (int64_t q = 0; q < {n}; ++q) {{
    const int64_t j = q % {width};
    const float d = (float)in0[q] - offset[{oi}];
    out0[q] = d * scale[{si}];
  }}
  return 0;"""
    return ctx.extern(body, [x], [(ctx.out_shape(), DType.float32)])


@lowering("Normalizer", domain=ML)
def _normalizer_lower(ctx, x):
    """The kernel kiln/codegen/c_src/normalizer.c, instantiated for the input type."""
    xt = ctx.input_types[0]
    _c_type(ctx, xt.dtype)
    if not xt.shape:
        ctx.fail("Normalizer needs at least one axis", stage="lower")
    norm = ctx.attr("norm", "MAX")
    width, rows = xt.shape[-1], math.prod(xt.shape[:-1])
    code = {"MAX": 0, "L1": 1, "L2": 2}.get(norm)
    if code is None:
        ctx.fail(f"norm must be MAX, L1 or L2, got {norm!r}")
    fn = f"kiln_normalizer_{xt.dtype.name}"
    macros = {"KILN_NORMALIZER_T": _c_type(ctx, xt.dtype), "KILN_NORMALIZER_FN": fn}
    body = f"  return {fn}(in0, out0, {rows}, {width}, {code});"
    return ctx.extern(body, [x], [(ctx.out_shape(), DType.float32)],
                      preamble=c_instance("normalizer.c", macros, fn.upper()))


@lowering("Imputer", domain=ML)
def _imputer_lower(ctx, x):
    xt = ctx.input_types[0]
    t = _c_type(ctx, xt.dtype)
    floats = xt.dtype.is_float
    fill = np.asarray(ctx.attr("imputed_value_floats" if floats else "imputed_value_int64s"), xt.dtype.np).ravel()
    bad = ctx.attr("replaced_value_float" if floats else "replaced_value_int64", np.nan if floats else 0)
    width = xt.shape[-1] if xt.shape else 1
    if fill.size != 1 and (fill.size != width or not xt.shape):
        ctx.fail(f"{fill.size} imputed values for {width} features")
    if floats and math.isnan(bad):
        hit = "v != v"
    else:
        body_bad = _table(ctx, "bad", t, [np.asarray(bad).astype(xt.dtype.np)], xt.dtype)
        hit = "v == bad[0]"
    body = (_table(ctx, "fill", t, fill, xt.dtype) + ("" if hit == "v != v" else body_bad) +
            f"""  for (int64_t q = 0; q < {math.prod(xt.shape)}; ++q) {{
    const {t} v = in0[q];
    out0[q] = ({hit}) ? fill[{'0' if fill.size == 1 else f'q % {width}'}] : v;
  }}
  return 0;""")
    return ctx.extern(body, [x], [(ctx.out_shape(), xt.dtype)])


@lowering("FeatureVectorizer", domain=ML)
def _feature_vectorizer_lower(ctx, *xs):
    dims = [int(d) for d in ctx.attr("inputdimensions")]
    rows, total = ctx.out_shape()
    body, col = [], 0
    for k, (xt, d) in enumerate(zip(ctx.input_types, dims)):
        _c_type(ctx, xt.dtype)
        r = 1 if xt.rank <= 1 else xt.shape[0]
        w = math.prod(xt.shape[1:]) if xt.rank > 1 else math.prod(xt.shape)
        if r != rows:
            ctx.fail(f"input {k} has {r} rows, the output {rows}", stage="lower")
        body.append(f"""  for (int64_t r = 0; r < {rows}; ++r)
    for (int64_t j = 0; j < {d}; ++j)
      out0[r * {total} + {col} + j] = j < {w} ? (float)in{k}[r * {w} + j] : 0.0f;
""")
        col += d
    return ctx.extern("".join(body) + "  return 0;", list(xs), [(ctx.out_shape(), DType.float32)])


@lowering("OneHotEncoder", domain=ML)
def _one_hot_encoder_lower(ctx, x):
    xt = ctx.input_types[0]
    cats, index = _categories(ctx, xt.dtype)
    n, nc = math.prod(xt.shape), len(cats)
    zeros = int(ctx.attr("zeros", 1))
    errors = {1: "a value is not among OneHotEncoder's categories and zeros=0"}
    if xt.dtype == DType.string:
        from kiln.codegen.strings import str_table, utf8_key
        from kiln.lower.strings import string_extern
        keys = sorted(index, key=utf8_key)
        head = str_table("keys", keys)
        find = f"const int64_t lo = kiln_str_find(keys, {len(keys)}, in0[i]);\n    if (lo >= 0)"
    else:
        _c_type(ctx, xt.dtype)
        keys = sorted(index)
        head = _table(ctx, "keys", "int64_t", keys, DType.int64)
        if xt.dtype.is_float:  # NaN and values beyond int64 match no category
            key = ("const double d = (double)in0[i];\n"
                   f"    if (!(d > -9.2e18 && d < 9.2e18)) {{ if (!{zeros}) return 1; continue; }}\n"
                   "    const int64_t v = (int64_t)d;")
        else:
            key = "const int64_t v = (int64_t)in0[i];"
        find = f"""{key}
    int64_t lo = 0, hi = {len(keys)};
    while (lo < hi) {{ const int64_t mid = lo + (hi - lo) / 2; if (keys[mid] < v) lo = mid + 1; else hi = mid; }}
    if (lo < {len(keys)} && keys[lo] == v)"""
    body = (head + _table(ctx, "cols", "int64_t", [index[k] for k in keys], DType.int64) +
            f"""  memset(out0, 0, sizeof(float) * {n * nc});
  for (int64_t i = 0; i < {n}; ++i) {{
    {find} out0[i * {nc} + cols[lo]] = 1.0f;
    else if (!{zeros}) return 1;
  }}
  return 0;""")
    if xt.dtype == DType.string:
        return string_extern(ctx, body, [x], [(ctx.out_shape(), DType.float32)], errors=errors)
    return ctx.extern(body, [x], [(ctx.out_shape(), DType.float32)], errors=errors)
