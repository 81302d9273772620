"""Native lowerings of LabelEncoder and CategoryMapper (kiln.ops.ml): one table lookup per
element, a hand-written C kernel.
"""

from __future__ import annotations

import math

from kiln.codegen.csource import c_instance
from kiln.dtypes import DType
from kiln.lower.ml_common import c_table as _table, c_type as _c_type
from kiln.ops.ml import _encoder_table, _key
from kiln.ops.ml_common import ML
from kiln.lower.context import lowering


# ---- native lowerings ----
#
# Both ops are one table lookup per element: keys sorted at compile time (strings by
# their UTF-8 bytes, as kiln_str_cmp orders them), values and the default baked in as
# literals (strings as kiln_str views of literals in the library), the search in C
# (kiln/codegen/c_src/ml_lookup.c).

def _lookup_kernel(ctx, x, table: dict, default, kt: DType, vt: DType):
    """C kernel mapping each element of x through `table` ({key: value}, NaN keys as
    "nan"), `default` where no key matches."""
    from kiln.codegen.strings import str_table, utf8_key
    from kiln.lower.strings import string_extern
    n = math.prod(ctx.input_types[0].shape)
    nan_val = table.pop("nan", None)
    if kt is DType.string:
        ordered = sorted(table, key=utf8_key)
        body = str_table("keys", ordered)
        kc = "kiln_str"
    else:
        kc = _c_type(ctx, kt, "keys")
        ordered = sorted(table)
        body = _table(ctx, "keys", kc, ordered, kt)
    vals = [table[k] for k in ordered]
    if vt is DType.string:
        vc = "kiln_str"
        body += str_table("vals", vals) + str_table("dflt", [default]) + \
            (str_table("vals_nan", [nan_val]) if nan_val is not None else "")
    else:
        vc = _c_type(ctx, vt, "values")
        body += _table(ctx, "vals", vc, vals, vt) + _table(ctx, "dflt", vc, [default], vt) + \
            (_table(ctx, "vals_nan", vc, [nan_val], vt) if nan_val is not None else "")
    fn = f"kiln_lookup_{kt.name}_{vt.name}"
    macros = {"KILN_LOOKUP_K": kc, "KILN_LOOKUP_V": vc, "KILN_LOOKUP_STRKEY": str(int(kt is DType.string)),
              "KILN_LOOKUP_ISNAN(x)": "((x) != (x))" if kt.is_float else "0", "KILN_LOOKUP_FN": fn}
    preamble = c_instance("ml_lookup.c", macros, fn.upper())
    body += (f"  return {fn}(in0, out0, {n}, keys, {len(ordered)}, vals, dflt, "
             f"{'vals_nan' if nan_val is not None else 'NULL'});")
    if DType.string in (kt, vt):
        return string_extern(ctx, body, [x], [(ctx.out_shape(), vt)], preamble=preamble)
    return ctx.extern(body, [x], [(ctx.out_shape(), vt)], preamble=preamble)


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
