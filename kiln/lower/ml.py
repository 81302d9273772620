"""Native lowerings of LabelEncoder and CategoryMapper (kiln.ops.ml): one table lookup per
element, a hand-written C kernel.
"""

from __future__ import annotations

import math

from kiln.dtypes import DType
from kiln.lower.ml_common import c_table as _table, c_type as _c_type
from kiln.ops.ml import _encoder_table, _key
from kiln.ops.ml_common import ML
from kiln.lower.context import lowering


# ---- native lowerings ----
#
# Both ops are one table lookup per element: keys sorted at compile time (strings by
# their UTF-8 bytes, as kiln_str_cmp orders them), binary search in C, values and the
# default baked in as literals (strings as kiln_str views of literals in the library).

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
