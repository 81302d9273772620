"""The `ai.onnx.ml` label maps: LabelEncoder and CategoryMapper.

The other ML families live beside this one: ml_trees (tree ensembles), ml_linear
(LinearClassifier/Regressor), ml_svm (SVMClassifier/Regressor) and ml_preprocess
(Scaler, Normalizer, Binarizer, Imputer, OneHotEncoder, ...); ml_common holds what
they share.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.ml_common import ML, c_table as _table, c_type as _c_type
from kiln.ops.registry import lowering, op
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


@op("LabelEncoder", infer=_infer_label_encoder, domain=ML)
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


@op("CategoryMapper", infer=_infer_category_mapper, domain=ML)
def category_mapper(ctx, x):
    strings, ints = list(ctx.attr("cats_strings")), list(ctx.attr("cats_int64s"))
    if x.dtype == object:
        table = dict(zip(strings, ints))
        return np.array([table.get(s, ctx.attr("default_int64", -1)) for s in x.ravel()], np.int64).reshape(x.shape)
    table = dict(zip(ints, strings))
    return string_array([table.get(int(v), ctx.attr("default_string", "_Unused")) for v in x.ravel()], x.shape)


# ---- native lowerings ----
#
# Both ops are one table lookup per element: keys sorted at compile time (strings by
# their UTF-8 bytes, as kiln_str_cmp orders them), binary search in C, values and the
# default baked in as literals (strings as kiln_str views of literals in the library).

def _lookup_kernel(ctx, x, table: dict, default, kt: DType, vt: DType):
    """C kernel mapping each element of x through `table` ({key: value}, NaN keys as
    "nan"), `default` where no key matches."""
    from kiln.codegen.strings import str_table, utf8_key
    from kiln.ops.strings_lower import string_extern
    n = math.prod(ctx.input_types[0].shape)
    nan_val = table.pop("nan", None)
    if kt is DType.string:
        ordered = sorted(table, key=utf8_key)
        body = str_table("keys", ordered)
        find = f"    const int64_t k = kiln_str_find(keys, {len(ordered)}, in0[i]);\n"
    else:
        kc = _c_type(ctx, kt, "keys")
        ordered = sorted(table)
        body = _table(ctx, "keys", kc, ordered, kt)
        nan_case = (f"    if (in0[i] != in0[i]) {{ out0[i] = {'vals_nan[0]' if nan_val is not None else 'dflt[0]'}; "
                    "continue; }\n" if kt.is_float else "")
        find = f"""{nan_case}    int64_t lo = 0, hi = {len(ordered)};
    while (lo < hi) {{
      const int64_t mid = lo + (hi - lo) / 2;
      if (keys[mid] < in0[i]) lo = mid + 1; else hi = mid;
    }}
    const int64_t k = (lo < {len(ordered)} && keys[lo] == in0[i]) ? lo : -1;
"""
    vals = [table[k] for k in ordered]
    if vt is DType.string:
        body += str_table("vals", vals) + str_table("dflt", [default]) + \
            (str_table("vals_nan", [nan_val]) if nan_val is not None else "")
    else:
        vc = _c_type(ctx, vt, "values")
        body += _table(ctx, "vals", vc, vals, vt) + _table(ctx, "dflt", vc, [default], vt) + \
            (_table(ctx, "vals_nan", vc, [nan_val], vt) if nan_val is not None else "")
    body += f"""  for (int64_t i = 0; i < {n}; ++i) {{
{find}    out0[i] = k >= 0 ? vals[k] : dflt[0];
  }}
  return 0;"""
    if DType.string in (kt, vt):
        return string_extern(ctx, body, [x], [(ctx.out_shape(), vt)])
    return ctx.extern(body, [x], [(ctx.out_shape(), vt)])


@lowering("LabelEncoder", domain=ML)
def _label_encoder_lower(ctx, x):
    xt = ctx.input_types[0].dtype
    if ctx.opset < 2:  # classes_strings: a string's index, or an index's string
        classes = [str(c) for c in ctx.attr("classes_strings", [])]
        if xt is DType.string:
            return _lookup_kernel(ctx, x, {c: i for i, c in enumerate(classes)},
                                  int(ctx.attr("default_int64", -1)), DType.string, DType.int64)
        return _lookup_kernel(ctx, x, dict(enumerate(classes)), str(ctx.attr("default_string", "_Unused")),
                              xt, DType.string)
    keys, vals, default = _encoder_table(ctx)
    kt, vt = DType.from_numpy(keys.dtype), DType.from_numpy(vals.dtype)
    table = {_key(k): v for k, v in zip(keys.tolist(), vals.tolist())}  # as the reference: the last key wins
    return _lookup_kernel(ctx, x, table, default.item(), kt, vt)


@lowering("CategoryMapper", domain=ML)
def _category_mapper_lower(ctx, x):
    strings, ints = [str(s) for s in ctx.attr("cats_strings")], [int(v) for v in ctx.attr("cats_int64s")]
    if ctx.input_types[0].dtype is DType.string:
        return _lookup_kernel(ctx, x, dict(zip(strings, ints)), int(ctx.attr("default_int64", -1)),
                              DType.string, DType.int64)
    return _lookup_kernel(ctx, x, dict(zip(ints, strings)), str(ctx.attr("default_string", "_Unused")),
                          DType.int64, DType.string)
