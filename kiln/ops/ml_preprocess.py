"""Row-wise preprocessing of `ai.onnx.ml`: Binarizer, Scaler, Normalizer, Imputer,
ArrayFeatureExtractor, FeatureVectorizer, OneHotEncoder, and the refusals of the map ops
(DictVectorizer, ZipMap) that kiln's types cannot hold.

Their native lowerings live in kiln.lower.ml_preprocess.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.ml_common import ML, numeric_input, rows_type
from kiln.ops.registry import OPAQUE, op, same_as


def _infer_feature_extractor(ctx):
    t = ctx.tensor(0)
    idx = ctx.tensor(1)
    if idx.dtype != DType.int64:
        ctx.fail(f"indices must be int64, got {idx.dtype}")
    k = int(np.prod(idx.shape)) if idx.is_static else ctx.new_dim()
    if t.shape is None:
        return [TensorType(t.dtype, None)]
    return [TensorType(t.dtype, (1, k) if len(t.shape) == 1 else t.shape[:-1] + (k,))]


@op("ArrayFeatureExtractor", infer=_infer_feature_extractor, domain=ML, fusion=OPAQUE)
def array_feature_extractor(ctx, x, indices):
    """Gathers along the last axis; a 1-D input gives one row (as ONNX Runtime does)."""
    idx = indices.ravel()
    if len(idx) and (idx.min() < 0 or idx.max() >= x.shape[-1]):
        ctx.fail(f"indices {idx.tolist()} out of range for last dim {x.shape[-1]}")
    out = x[..., idx]
    return out.reshape(1, -1) if x.ndim == 1 else out


@op("Binarizer", infer=same_as(0), domain=ML, fusion=OPAQUE)
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


@op("Scaler", infer=_infer_float_like, domain=ML, fusion=OPAQUE)
def scaler(ctx, x):
    w = x.shape[-1] if x.ndim else 1
    return ((x.astype(np.float32) - _per_feature(ctx, "offset", 0.0, w)) * _per_feature(ctx, "scale", 1.0, w))


@op("Normalizer", infer=_infer_float_like, domain=ML, fusion=OPAQUE)
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


@op("Imputer", infer=same_as(0), domain=ML, fusion=OPAQUE)
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


@op("FeatureVectorizer", infer=_infer_feature_vectorizer, domain=ML, fusion=OPAQUE)
def feature_vectorizer(ctx, *xs):
    """Concatenates the inputs' features, each cut or zero-padded to its inputdimensions entry."""
    parts = []
    for x, d in zip(xs, ctx.attr("inputdimensions")):
        x = np.atleast_2d(x).astype(np.float32).reshape(len(np.atleast_2d(x)), -1)[:, :d]
        parts.append(np.pad(x, ((0, 0), (0, d - x.shape[1]))))
    return np.concatenate(parts, axis=1)


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


@op("OneHotEncoder", infer=_infer_one_hot_encoder, domain=ML, fusion=OPAQUE)
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
