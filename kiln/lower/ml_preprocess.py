"""Native lowerings of the `ai.onnx.ml` row-wise preprocessing ops (kiln.ops.ml_preprocess).

Binarizer is a compute; the others are small C kernels (kiln/codegen/c_src: scaler.c,
normalizer.c, imputer.c, feature_vectorizer.c, one_hot_encoder.c) instantiated per input type
and called with the node's tables, baked in as constants; ArrayFeatureExtractor's gather is
written per node.
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


def _feature_table(ctx, name: str, default: float, width: int) -> tuple[str, int]:
    """A per-feature float32 attribute as a C table and its step (0: one value for every
    feature, 1: one per feature)."""
    v = _per_feature(ctx, name, default, width)
    return _table(ctx, name, "float", v, DType.float32), int(len(v) != 1)


def _instance(ctx, prefix: str, dt: DType, **more) -> tuple[str, dict, str]:
    """(function, macros, guard) to instantiate a kernel of kiln/codegen/c_src for input type
    `dt` with c_instance: the macros KILN_`prefix`_T and _FN, and KILN_`prefix`_<k> for each of
    `more`."""
    fn = f"kiln_{prefix.lower()}_{dt.name}"
    macros = {f"KILN_{prefix}_T": "kiln_str" if dt is DType.string else _c_type(ctx, dt), f"KILN_{prefix}_FN": fn,
              **{f"KILN_{prefix}_{k}": v for k, v in more.items()}}
    return fn, macros, fn.upper()


@lowering("Scaler", domain=ML)
def _scaler_lower(ctx, x):
    """The kernel kiln/codegen/c_src/scaler.c, instantiated for the input type."""
    xt = ctx.input_types[0]
    fn, macros, guard = _instance(ctx, "SCALER", xt.dtype)
    width = xt.shape[-1] if xt.shape else 1
    off, off_step = _feature_table(ctx, "offset", 0.0, width)
    sc, sc_step = _feature_table(ctx, "scale", 1.0, width)
    body = off + sc + (f"  {fn}(in0, out0, {math.prod(xt.shape)}, {width}, offset, {off_step}, scale, {sc_step});\n"
                       "  return 0;")
    return ctx.extern(body, [x], [(ctx.out_shape(), DType.float32)], preamble=c_instance("scaler.c", macros, guard))


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
    fn, macros, guard = _instance(ctx, "NORMALIZER", xt.dtype)
    body = f"  return {fn}(in0, out0, {rows}, {width}, {code});"
    return ctx.extern(body, [x], [(ctx.out_shape(), DType.float32)], preamble=c_instance("normalizer.c", macros, guard))


@lowering("Imputer", domain=ML)
def _imputer_lower(ctx, x):
    """The kernel kiln/codegen/c_src/imputer.c, instantiated for the input type."""
    xt = ctx.input_types[0]
    fn, macros, guard = _instance(ctx, "IMPUTER", xt.dtype)
    t = _c_type(ctx, xt.dtype)
    floats = xt.dtype.is_float
    fill = np.asarray(ctx.attr("imputed_value_floats" if floats else "imputed_value_int64s"), xt.dtype.np).ravel()
    bad = ctx.attr("replaced_value_float" if floats else "replaced_value_int64", np.nan if floats else 0)
    width = xt.shape[-1] if xt.shape else 1
    if fill.size != 1 and (fill.size != width or not xt.shape):
        ctx.fail(f"{fill.size} imputed values for {width} features")
    nan = floats and math.isnan(bad)
    body = _table(ctx, "fill", t, fill, xt.dtype)
    if not nan:
        body += _table(ctx, "bad", t, [np.asarray(bad).astype(xt.dtype.np)], xt.dtype)
    body += (f"  {fn}(in0, out0, {math.prod(xt.shape)}, {width}, fill, {int(fill.size != 1)}, {int(nan)}, "
             f"{'NULL' if nan else 'bad'});\n  return 0;")
    return ctx.extern(body, [x], [(ctx.out_shape(), xt.dtype)], preamble=c_instance("imputer.c", macros, guard))


@lowering("FeatureVectorizer", domain=ML)
def _feature_vectorizer_lower(ctx, *xs):
    """The kernel kiln/codegen/c_src/feature_vectorizer.c, instantiated per input type, once per input."""
    dims = [int(d) for d in ctx.attr("inputdimensions")]
    rows, total = ctx.out_shape()
    body, kernels, col = [], {}, 0
    for k, (xt, d) in enumerate(zip(ctx.input_types, dims)):
        fn, macros, guard = _instance(ctx, "VECTORIZER", xt.dtype)
        kernels[xt.dtype] = c_instance("feature_vectorizer.c", macros, guard)
        r = 1 if xt.rank <= 1 else xt.shape[0]
        w = math.prod(xt.shape[1:]) if xt.rank > 1 else math.prod(xt.shape)
        if r != rows:
            ctx.fail(f"input {k} has {r} rows, the output {rows}", stage="lower")
        body.append(f"  {fn}(in{k}, out0, {rows}, {w}, {d}, {total}, {col});\n")
        col += d
    return ctx.extern("".join(body) + "  return 0;", list(xs), [(ctx.out_shape(), DType.float32)],
                      preamble="".join(kernels.values()))


@lowering("OneHotEncoder", domain=ML)
def _one_hot_encoder_lower(ctx, x):
    """The kernel kiln/codegen/c_src/one_hot_encoder.c, instantiated for the input type, over
    this node's sorted categories."""
    xt = ctx.input_types[0]
    cats, index = _categories(ctx, xt.dtype)
    n, nc = math.prod(xt.shape), len(cats)
    zeros = int(ctx.attr("zeros", 1))
    errors = {1: "a value is not among OneHotEncoder's categories and zeros=0"}
    if xt.dtype == DType.string:
        from kiln.codegen.strings import str_table, utf8_key
        from kiln.lower.strings import string_extern
        keys = sorted(index, key=utf8_key)
        head, key_t, find = str_table("keys", keys), "kiln_str", "kiln_str_find(keys, nkeys, x)"
    else:
        keys = sorted(index)
        head, key_t = _table(ctx, "keys", "int64_t", keys, DType.int64), "int64_t"
        # a float is truncated to an integer; NaN and values beyond int64 match no category
        find = ("kiln_one_hot_find_real(keys, nkeys, (double)(x))" if xt.dtype.is_float else
                "kiln_one_hot_find_int(keys, nkeys, (int64_t)(x))")
    fn, macros, guard = _instance(ctx, "ONE_HOT", xt.dtype, KEY=key_t, **{"FIND(x)": find})
    kernel = c_instance("one_hot_encoder.c", macros, guard)
    body = (head + _table(ctx, "cols", "int64_t", [index[k] for k in keys], DType.int64) +
            f"  return {fn}(in0, out0, {n}, {nc}, keys, cols, {len(keys)}, {zeros});")
    if xt.dtype == DType.string:
        return string_extern(ctx, body, [x], [(ctx.out_shape(), DType.float32)], errors=errors, preamble=kernel)
    return ctx.extern(body, [x], [(ctx.out_shape(), DType.float32)], errors=errors, preamble=kernel)
