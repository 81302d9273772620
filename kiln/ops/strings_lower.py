"""Native (C) lowerings of the string operators: StringConcat, string Equal, StringSplit,
StringNormalizer, RegexFullMatch, TfIdfVectorizer, and the string forms of LabelEncoder
and CategoryMapper.

Each is a hand-written C kernel over `kiln_str` elements (kiln.codegen.strings): a
pointer and a byte length, UTF-8. Strings a kernel makes come from the module's
per-thread arena; strings it passes through (StringSplit's pieces, Normalizer's kept
words) point into its inputs. Every user string (stopwords, table keys, patterns)
reaches the C source only as an escaped literal (`c_bytes`). Tables are sorted at
compile time and searched by binary search. The reference semantics are those of
kiln.ops.strings / kiln.ops.ml, which the tests compare against.
"""

from __future__ import annotations

import math

from kiln.codegen.strings import ERRORS, HELPERS
from kiln.dtypes import DType
from kiln.ops.registry import lowering


def broadcast_offset(out_shape, in_shape, i: str = "i") -> str:
    """C expression: the flat offset in a (NumPy-broadcast) input of output element `i`."""
    out_shape, in_shape = tuple(out_shape), tuple(in_shape)
    pad = (1,) * (len(out_shape) - len(in_shape)) + in_shape
    terms, stride_o, stride_i = [], 1, 1
    for d in reversed(range(len(out_shape))):
        if pad[d] != 1:
            idx = f"({i} / {stride_o}LL)" if stride_o > 1 else i
            idx = f"({idx} % {out_shape[d]}LL)" if d > 0 else idx
            terms.append(f"{idx} * {stride_i}LL" if stride_i > 1 else idx)
            stride_i *= pad[d]
        stride_o *= out_shape[d]
    return " + ".join(reversed(terms)) or "0"


def _extern(ctx, body: str, inputs: list, outputs: list, preamble: str = "", errors=None, **kw):
    return ctx.extern(body, inputs, outputs, preamble=HELPERS + preamble, errors={**ERRORS, **(errors or {})},
                      **kw)


# ---- StringConcat, Equal ----

@lowering("StringConcat")
def _string_concat_lower(ctx, a, b):
    out = ctx.out_shape()
    body = f"""  for (int64_t i = 0; i < {math.prod(out)}LL; ++i) {{
    const int rc = kiln_str_concat(in0[{broadcast_offset(out, a.shape)}], in1[{broadcast_offset(out, b.shape)}], &out0[i]);
    if (rc) return rc;
  }}
  return 0;"""
    return _extern(ctx, body, [a, b], [(out, DType.string)])


def string_equal(ctx, a, b):
    """Equal on string tensors (called by Equal's lowering for string inputs)."""
    out = ctx.out_shape()
    body = f"""  for (int64_t i = 0; i < {math.prod(out)}LL; ++i)
    out0[i] = kiln_str_eq(in0[{broadcast_offset(out, a.shape)}], in1[{broadcast_offset(out, b.shape)}]);
  return 0;"""
    return _extern(ctx, body, [a, b], [(out, DType.bool)])


def constant_kernel(name: str, data) -> "ExternFunc":
    """A kernel writing a string constant's `kiln_str` views into its one output (out0);
    the bytes are literals in the library itself. String constants cannot live in the
    weights blob, which holds bytes only (a pointer there would need fixing up at load)."""
    import numpy as np

    from kiln.codegen.strings import str_table
    from kiln.loops.stmt import Buffer, ExternFunc
    data = np.asarray(data, dtype=object)
    n = int(data.size)
    body = (str_table("k", list(data.reshape(-1))) +
            f"  memcpy(out0, k, {n}ULL * sizeof(kiln_str));\n  return 0;") if n else "  return 0;"
    return ExternFunc(name, (Buffer("out0", DType.string, tuple(data.shape)),), body)


# ---- StringSplit ----

# A split's piece count is known only at run time: the kernel's output has room for this
# many pieces over all strings (kiln_str views into the input: nothing is copied; the
# capacity is zero-filled memory that costs nothing until written), and fails beyond it.
SPLIT_MAX_PIECES = 1 << 22


@lowering("StringSplit")
def _string_split_lower(ctx, x):
    from kiln.codegen.strings import c_str
    shape = tuple(ctx.input_types[0].shape)
    n = math.prod(shape)
    delim = ctx.attr("delimiter", None) or ""
    maxsplit = ctx.attr("maxsplit", None)
    maxsplit = -1 if maxsplit is None or int(maxsplit) < 0 else int(maxsplit)
    width = max(1, SPLIT_MAX_PIECES // max(n, 1))
    if maxsplit >= 0:
        width = min(width, maxsplit + 1)
    r = len(shape)
    dims = "".join(f"  out2[{k}] = {d}; out2[{r + 1 + k}] = {d};\n" for k, d in enumerate(shape))
    body = f"""  static const kiln_str sep = {c_str(delim)};
  int64_t width = 0;
  for (int64_t i = 0; i < {n}LL; ++i) {{
    if (!kiln_str_ok(in0[i])) return 2;
    out1[i] = kiln_str_split(in0[i], sep, {maxsplit}LL, 0, 0);
    if (out1[i] > {width}LL) return 3;
    if (out1[i] > width) width = out1[i];
  }}
  for (int64_t i = 0; i < {n}LL; ++i) {{
    kiln_str* row = out0 + i * width;
    const int64_t got = kiln_str_split(in0[i], sep, {maxsplit}LL, row, width);
    for (int64_t j = got; j < width; ++j) {{ row[j].ptr = ""; row[j].len = 0; }}
  }}
{dims}  out2[{r}] = width;
  return 0;"""
    errors = {3: f"a string splits into more than {width} pieces, the most this kernel holds for "
                 f"{n} strings ({SPLIT_MAX_PIECES} in all)"}
    return _extern(ctx, body, [x], [(shape + (width,), DType.string), (shape, DType.int64)], dynamic=True,
                   errors=errors)
