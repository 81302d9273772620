"""Row-wise preprocessing of `ai.onnx.ml`: Binarizer, Scaler, Normalizer, Imputer,
ArrayFeatureExtractor, FeatureVectorizer, OneHotEncoder, and the refusals of the map ops
(DictVectorizer, ZipMap) that kiln's types cannot hold.

Binarizer is a compute; the others are small C kernels with their tables baked in.
"""

from __future__ import annotations

import math

import numpy as np

import kiln.loops as L
from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.ml_common import ML, c_table as _table, c_type as _c_type, numeric_input, rows_type
from kiln.ops.registry import lowering, op, same_as


def _infer_feature_extractor(ctx):
    t = ctx.tensor(0)
    idx = ctx.tensor(1)
    if idx.dtype != DType.int64:
        ctx.fail(f"indices must be int64, got {idx.dtype}")
    k = int(np.prod(idx.shape)) if idx.is_static else ctx.new_dim()
    if t.shape is None:
        return [TensorType(t.dtype, None)]
    return [TensorType(t.dtype, (1, k) if len(t.shape) == 1 else t.shape[:-1] + (k,))]


@op("ArrayFeatureExtractor", infer=_infer_feature_extractor, domain=ML)
def array_feature_extractor(ctx, x, indices):
    """Gathers along the last axis; a 1-D input gives one row (as ONNX Runtime does)."""
    idx = indices.ravel()
    if len(idx) and (idx.min() < 0 or idx.max() >= x.shape[-1]):
        ctx.fail(f"indices {idx.tolist()} out of range for last dim {x.shape[-1]}")
    out = x[..., idx]
    return out.reshape(1, -1) if x.ndim == 1 else out


@op("Binarizer", infer=same_as(0), domain=ML)
def binarizer(ctx, x):
    return (x > ctx.attr("threshold", 0.0)).astype(x.dtype)


def _infer_float_like(ctx):
    t = numeric_input(ctx)
    return [TensorType(DType.float32, t.shape)]


def _per_feature(ctx, name: str, default: float, width: int) -> np.ndarray:
    v = np.asarray(ctx.attr(name, [default]), np.float32)
    if len(v) not in (1, width):
        ctx.fail(f"{name} has {len(v)} entries; expected 1 or the feature count {width}")
    return v


@op("Scaler", infer=_infer_float_like, domain=ML)
def scaler(ctx, x):
    w = x.shape[-1] if x.ndim else 1
    return ((x.astype(np.float32) - _per_feature(ctx, "offset", 0.0, w)) * _per_feature(ctx, "scale", 1.0, w))


@op("Normalizer", infer=_infer_float_like, domain=ML)
def normalizer(ctx, x):
    """MAX divides by the greatest magnitude, as the ONNX reference and scikit-learn do
    (ONNX Runtime divides by the signed max: they differ on rows of negative values)."""
    x = x.astype(np.float32)
    norm = ctx.attr("norm", "MAX")
    fn = {"MAX": lambda r: np.abs(r).max(-1, keepdims=True), "L1": lambda r: np.abs(r).sum(-1, keepdims=True),
          "L2": lambda r: np.sqrt((r * r).sum(-1, keepdims=True))}.get(norm)
    if fn is None:
        ctx.fail(f"norm must be MAX, L1 or L2, got {norm!r}")
    d = fn(x)
    return np.where(d == 0, x, x / np.where(d == 0, 1, d)).astype(np.float32)


@op("Imputer", infer=same_as(0), domain=ML)
def imputer(ctx, x):
    floats = x.dtype.kind == "f"
    fill = np.asarray(ctx.attr("imputed_value_floats" if floats else "imputed_value_int64s"), x.dtype)
    bad = ctx.attr("replaced_value_float" if floats else "replaced_value_int64", np.nan if floats else 0)
    hit = np.isnan(x) if floats and math.isnan(bad) else x == bad
    return np.where(hit, np.broadcast_to(fill, x.shape[-1:]) if fill.size > 1 else fill, x).astype(x.dtype)


def _infer_feature_vectorizer(ctx):
    dims = ctx.attr("inputdimensions")
    if len(dims) != ctx.num_inputs:
        ctx.fail(f"inputdimensions has {len(dims)} entries for {ctx.num_inputs} inputs")
    return [rows_type(ctx, ctx.tensor(0), int(sum(dims)))]


@op("FeatureVectorizer", infer=_infer_feature_vectorizer, domain=ML)
def feature_vectorizer(ctx, *xs):
    """Concatenates the inputs' features, each cut or zero-padded to its inputdimensions entry."""
    parts = []
    for x, d in zip(xs, ctx.attr("inputdimensions")):
        x = np.atleast_2d(x).astype(np.float32).reshape(len(np.atleast_2d(x)), -1)[:, :d]
        parts.append(np.pad(x, ((0, 0), (0, d - x.shape[1]))))
    return np.concatenate(parts, axis=1)


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
    xt = ctx.input_types[0]
    _c_type(ctx, xt.dtype)
    if not xt.shape:
        ctx.fail("Normalizer needs at least one axis", stage="lower")
    norm = ctx.attr("norm", "MAX")
    width, rows = xt.shape[-1], math.prod(xt.shape[:-1])
    step = {"MAX": "{ const float v = fabsf(r[j]); d = (v > d || v != v || d != d) ? (d != d ? d : v) : d; }",
            "L1": "acc += (double)fabsf(r[j]);",
            "L2": "{ const float sq = r[j] * r[j]; acc += (double)sq; }"}.get(norm)
    if step is None:
        ctx.fail(f"norm must be MAX, L1 or L2, got {norm!r}")
    finish = {"MAX": "", "L1": "d = (float)acc;", "L2": "d = sqrtf((float)acc);"}[norm]
    body = f"""  float* r = (float*)malloc(sizeof(float) * ({width} + 1));
  if (!r) return -1;
  for (int64_t row = 0; row < {rows}; ++row) {{
    for (int64_t j = 0; j < {width}; ++j) r[j] = (float)in0[row * {width} + j];
    float d = -INFINITY;
    double acc = 0;
    for (int64_t j = 0; j < {width}; ++j) {step}
    {finish}
    for (int64_t j = 0; j < {width}; ++j) out0[row * {width} + j] = d == 0 ? r[j] : r[j] / d;
  }}
  free(r);
  return 0;"""
    return ctx.extern(body, [x], [(ctx.out_shape(), DType.float32)])


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


# ---- OneHotEncoder ----
#
# As ONNX Runtime: a number is truncated to int64 and looked up in cats_int64s (a string
# in cats_strings); its category's column of the output [..., categories] is 1. An
# unknown value gives a row of zeros, or an error when zeros=0.

def _categories(ctx, x_dtype: DType) -> tuple[list, dict]:
    ints, strs = ctx.attr("cats_int64s", None), ctx.attr("cats_strings", None)
    if (ints is None) == (strs is None):
        ctx.fail("exactly one of cats_int64s and cats_strings must be given")
    cats = [int(v) for v in ints] if ints is not None else [v.decode() if isinstance(v, bytes) else v for v in strs]
    if (x_dtype == DType.string) != (strs is not None):
        ctx.fail(f"input of type {x_dtype} needs {'cats_strings' if x_dtype == DType.string else 'cats_int64s'}")
    index: dict = {}
    for i, c in enumerate(cats):
        index.setdefault(c, i)  # a repeated category: its first column
    return cats, index


def _infer_one_hot_encoder(ctx):
    t = ctx.tensor(0)
    if not (t.dtype == DType.string or t.dtype.is_int or t.dtype.is_float):
        ctx.fail(f"input must be string or numeric, got {t.dtype}")
    cats, _ = _categories(ctx, t.dtype)
    return [TensorType(DType.float32, None if t.shape is None else tuple(t.shape) + (len(cats),))]


@op("OneHotEncoder", infer=_infer_one_hot_encoder, domain=ML)
def one_hot_encoder(ctx, x):
    cats, index = _categories(ctx, DType.string if x.dtype == object else DType.from_numpy(x.dtype))
    flat = x.ravel()
    if x.dtype != object:
        ok = np.isfinite(flat) if flat.dtype.kind == "f" else np.ones(flat.shape, bool)
        flat = [int(v) if k else None for v, k in zip(flat.tolist(), ok.tolist())]
    cols = [index.get(v, -1) for v in (flat.tolist() if isinstance(flat, np.ndarray) else flat)]
    if not int(ctx.attr("zeros", 1)) and -1 in cols:
        ctx.fail("a value is not among the categories and zeros=0")
    out = np.zeros((len(cols), len(cats)), np.float32)
    hit = np.asarray(cols) >= 0
    out[np.flatnonzero(hit), np.asarray(cols, np.int64)[hit]] = 1
    return out.reshape(x.shape + (len(cats),))


@lowering("OneHotEncoder", domain=ML)
def _one_hot_encoder_lower(ctx, x):
    xt = ctx.input_types[0]
    cats, index = _categories(ctx, xt.dtype)
    n, nc = math.prod(xt.shape), len(cats)
    zeros = int(ctx.attr("zeros", 1))
    errors = {1: "a value is not among OneHotEncoder's categories and zeros=0"}
    if xt.dtype == DType.string:
        from kiln.codegen.strings import str_table, utf8_key
        from kiln.ops.strings_lower import string_extern
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
