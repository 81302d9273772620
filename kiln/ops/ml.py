"""The `ai.onnx.ml` label maps: LabelEncoder and CategoryMapper.

The other ML families live beside this one: ml_trees (tree ensembles), ml_linear
(LinearClassifier/Regressor), ml_svm (SVMClassifier/Regressor) and ml_preprocess
(Scaler, Normalizer, Binarizer, Imputer, OneHotEncoder, ...); ml_common holds what
they share.
Their native lowerings live in kiln.lower under the same module names.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.ml_common import ML
from kiln.ops.registry import OPAQUE, op
from kiln.ops.strings import string_array


# ---- LabelEncoder ----

def _encoder_table(ctx):
    """(keys, values, default): keys/values as arrays, default as a 0-d array of the value type."""
    def pick(prefix, kinds):
        given = [(k, ctx.attr(prefix + k)) for k in kinds if ctx.has_attr(prefix + k)]
        if len(given) != 1:
            ctx.fail(f"exactly one of {', '.join(prefix + k for k in kinds)} must be set, "
                     f"got {[k for k, _ in given] or 'none'}")
        kind, v = given[0]
        dtype = {"strings": object, "int64s": np.int64, "floats": np.float32}.get(kind)
        return np.asarray(v, dtype=dtype).ravel()

    kinds = ("strings", "int64s", "floats", "tensor")
    keys, values = pick("keys_", kinds), pick("values_", kinds)
    if len(keys) != len(values):
        ctx.fail(f"{len(keys)} keys but {len(values)} values")
    vtype = DType.from_numpy(values.dtype)
    fallback = "_Unused" if vtype == DType.string else -0.0 if vtype.is_float else -1
    if ctx.has_attr("default_tensor"):
        default = np.asarray(ctx.attr("default_tensor")).ravel()[:1]
    else:
        name = {DType.string: "default_string", DType.int64: "default_int64",
                DType.float32: "default_float"}.get(vtype)
        default = [ctx.attr(name, fallback) if name else fallback]
    return keys, values, np.asarray(default, dtype=values.dtype).reshape(())


def _infer_label_encoder(ctx):
    t = ctx.tensor(0)
    if ctx.opset < 2:  # v1: classes_strings maps strings to their index and back
        return [TensorType(DType.int64 if t.dtype == DType.string else DType.string, t.shape)]
    keys, values, _ = _encoder_table(ctx)
    if DType.from_numpy(keys.dtype) != t.dtype:
        ctx.fail(f"input type {t.dtype} does not match the keys' type {DType.from_numpy(keys.dtype)}")
    return [TensorType(DType.from_numpy(values.dtype), t.shape)]


def _key(v):
    """A dict key under which every NaN is the same key (NaN keys match any NaN)."""
    return "nan" if isinstance(v, float) and math.isnan(v) else v


@op("LabelEncoder", infer=_infer_label_encoder, domain=ML, fusion=OPAQUE)
def label_encoder(ctx, x):
    if ctx.opset < 2:
        classes = list(ctx.attr("classes_strings", []))
        if x.dtype == object:
            index = {s: i for i, s in enumerate(classes)}
            return np.array([index.get(s, ctx.attr("default_int64", -1)) for s in x.ravel()],
                            dtype=np.int64).reshape(x.shape)
        default = ctx.attr("default_string", "_Unused")
        return string_array([classes[i] if 0 <= i < len(classes) else default
                             for i in x.ravel().tolist()], x.shape)
    keys, values, default = _encoder_table(ctx)
    table = {_key(k): v for k, v in zip(keys.tolist(), values)}  # a repeated key: the last wins
    out = np.empty(x.size, dtype=values.dtype)
    out[:] = [table.get(_key(k), default) for k in x.ravel().tolist()]
    return out.reshape(x.shape)


def _infer_category_mapper(ctx):
    t = ctx.tensor(0)
    if t.dtype not in (DType.string, DType.int64):
        ctx.fail(f"input must be string or int64, got {t.dtype}")
    return [TensorType(DType.int64 if t.dtype == DType.string else DType.string, t.shape)]


@op("CategoryMapper", infer=_infer_category_mapper, domain=ML, fusion=OPAQUE)
def category_mapper(ctx, x):
    strings, ints = list(ctx.attr("cats_strings")), list(ctx.attr("cats_int64s"))
    if x.dtype == object:
        table = dict(zip(strings, ints))
        return np.array([table.get(s, ctx.attr("default_int64", -1)) for s in x.ravel()], np.int64).reshape(x.shape)
    table = dict(zip(ints, strings))
    return string_array([table.get(int(v), ctx.attr("default_string", "_Unused")) for v in x.ravel()], x.shape)
