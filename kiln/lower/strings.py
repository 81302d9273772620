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

from kiln.codegen.csource import c_instance, c_source
from kiln.codegen.strings import ERRORS, HELPERS
from kiln.dtypes import DType
from kiln.lower.context import lowering


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


def string_extern(ctx, body: str, inputs: list, outputs: list, preamble: str = "", errors=None, **kw):
    """ctx.extern for a kernel over kiln_str values: the string helpers in its preamble and
    their statuses in its error messages."""
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
    return string_extern(ctx, body, [a, b], [(out, DType.string)])


def string_equal(ctx, a, b):
    """Equal on string tensors (called by Equal's lowering for string inputs)."""
    out = ctx.out_shape()
    body = f"""  for (int64_t i = 0; i < {math.prod(out)}LL; ++i)
    out0[i] = kiln_str_eq(in0[{broadcast_offset(out, a.shape)}], in1[{broadcast_offset(out, b.shape)}]);
  return 0;"""
    return string_extern(ctx, body, [a, b], [(out, DType.bool)])


# ---- StringSplit ----

# A split's piece count is known only at run time: the kernel's output has room for this
# many pieces over all strings (kiln_str views into the input: nothing is copied; the
# capacity is zero-filled memory that costs nothing until written), and fails beyond it.
SPLIT_MAX_PIECES = 1 << 22


@lowering("StringSplit")
def _string_split_lower(ctx, x):
    """The kernel kiln/codegen/c_src/string_split.c, called with this node's sizes."""
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
  const int32_t rc = kiln_string_split(in0, {n}LL, sep, {maxsplit}LL, {width}LL, out0, out1, &width);
  if (rc) return rc;
{dims}  out2[{r}] = width;
  return 0;"""
    errors = {3: f"a string splits into more than {width} pieces, the most this kernel holds for "
                 f"{n} strings ({SPLIT_MAX_PIECES} in all)"}
    return string_extern(ctx, body, [x], [(shape + (width,), DType.string), (shape, DType.int64)], dynamic=True,
                         errors=errors, preamble=c_source("string_split.c"))


# ---- StringNormalizer ----

@lowering("StringNormalizer")
def _string_normalizer_lower(ctx, x):
    from kiln.codegen.strings import case_helpers, str_table, utf8_key
    shape = tuple(ctx.input_types[0].shape)
    n = math.prod(shape)
    sensitive = bool(ctx.attr("is_case_sensitive", 0))
    stop = sorted({utf8_key(_text(w) if sensitive else _text(w).lower())
                   for w in ctx.attr("stopwords", None) or []})
    change = {"LOWER": "lower", "UPPER": "upper"}.get(ctx.attr("case_change_action", "NONE"))
    preamble = "".join(case_helpers(k) for k in sorted({change, None if sensitive or not stop else "lower"} - {None}))
    fold = "" if sensitive or not stop else "    if ((rc = kiln_str_lower(s, &key)) != 0) return rc;\n"
    body = str_table("stop", stop) + f"""  int64_t m = 0;
  int rc;
  for (int64_t i = 0; i < {n}LL; ++i) {{
    const kiln_str s = in0[i];
    kiln_str key = s, out = s;
    if (!kiln_str_ok(s)) return 2;
{fold if stop else ""}{f"    if (kiln_str_find(stop, {len(stop)}, key) >= 0) continue;" if stop else ""}
{f"    if ((rc = kiln_str_{change}(s, &out)) != 0) return rc;" if change else ""}
    out0[m++] = out;
  }}
"""
    if not stop:  # no word removed: the output has the input's shape
        return string_extern(ctx, body + "  (void)rc; (void)stop;\n  return 0;", [x], [(shape, DType.string)],
                       preamble=preamble)
    # the spec's "everything removed" result is one empty string, not an empty tensor
    dims = "".join(f"  out1[{k}] = {d};\n" for k, d in enumerate(shape[:-1]))
    body += f"""  if (m == 0) {{ out0[0].ptr = ""; out0[0].len = 0; m = 1; }}
{dims}  out1[{len(shape) - 1}] = m;
  return 0;"""
    cap = shape[:-1] + (max(shape[-1], 1),)
    return string_extern(ctx, body, [x], [(cap, DType.string)], preamble=preamble, dynamic=True)


def _text(v) -> str:
    return v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else str(v)


# ---- TfIdfVectorizer ----

@lowering("TfIdfVectorizer")
def _tfidf_lower(ctx, x):
    """Counts every n-gram (n in [min_gram_length, max_gram_length], items `skip + 1`
    apart for skip <= max_skip_count) found in the pool, per row. Items become int64 ids
    first (a string's rank in the pool's sorted vocabulary, -1 when absent); each n has
    a table of its pooled n-grams sorted lexicographically, searched by bisection: the kernel
    kiln/codegen/c_src/tfidf.c (over tfidf.h), instantiated for the input type, called with
    this node's tables."""
    import numpy as np

    from kiln.codegen.strings import str_table, utf8_key
    from kiln.ops.strings import _tfidf_pool
    from kiln.lower.tensor import c_literals
    grams, width = _tfidf_pool(ctx)
    xt = ctx.input_types[0]
    shape = tuple(xt.shape)
    rows, cols = (1, shape[0]) if len(shape) == 1 else shape
    is_str = xt.dtype is DType.string
    vocab = sorted({s for g in grams for s in g}, key=utf8_key) if is_str else []
    rank = {s: k for k, s in enumerate(vocab)}
    by_n: dict[int, list] = {}
    for g, k in grams.items():
        by_n.setdefault(len(g), []).append(([rank[s] for s in g] if is_str else [int(v) for v in g], k))
    lo, hi = int(ctx.attr("min_gram_length")), int(ctx.attr("max_gram_length"))
    # only lengths the pool holds can match, and a skip wider than the row matches nothing:
    # bounding both keeps compile and run time to the data (max_gram_length 10^12 hung)
    max_skip = max(0, min(int(ctx.attr("max_skip_count")), cols))
    # weights are per pooled n-gram, as the spec says and ONNX Runtime does (the ONNX
    # reference evaluator indexes them by output column instead)
    weights = np.asarray(ctx.attr("weights", None) or np.ones(len(grams)), np.float32)
    if ctx.attr("mode", "TF") != "TF" and weights.size != len(grams):
        ctx.fail(f"weights has {weights.size} entries for {len(grams)} pooled n-grams", stage="lower")
    indexes = [int(v) for v in ctx.attr("ngram_indexes")]
    if any(i < 0 for i in indexes):
        ctx.fail(f"ngram_indexes must be non-negative, got {min(indexes)}", stage="lower")
    body = [str_table("vocab", vocab) if is_str else "",
            f"  static const int64_t idx[{max(len(indexes), 1)}] = {{{', '.join(map(str, indexes)) or '0'}}};\n"
            f"  static const float w[{max(weights.size, 1)}] = "
            f"{{{', '.join(c_literals(weights, DType.float32)) if weights.size else '0'}}};\n"]
    tables = []
    for n in sorted(k for k in by_n if max(lo, 1) <= k <= hi):
        table = sorted(by_n[n])
        flat = [v for g, _ in table for v in g]
        body.append(f"  static const int64_t g{n}[{len(flat)}] = {{{', '.join(map(str, flat))}}};\n"
                    f"  static const int64_t k{n}[{len(table)}] = {{{', '.join(str(k) for _, k in table)}}};\n")
        tables.append(f"{{g{n}, k{n}, {len(table)}, {n}, {max_skip + 1 if n > 1 else 1}}}")
    body.append(f"  static const kiln_tfidf_grams tables[{max(len(tables), 1)}] = {{{', '.join(tables) or '{0}'}}};\n")
    fn = f"kiln_tfidf_{xt.dtype.name}"
    macros = {"KILN_TFIDF_T": "kiln_str" if is_str else xt.dtype.c, "KILN_TFIDF_FN": fn,
              "KILN_TFIDF_ID(x)": "kiln_str_find(vocab, nvocab, x)" if is_str else "(int64_t)(x)"}
    mode = {"TF": 0, "IDF": 1, "TFIDF": 2}[ctx.attr("mode", "TF")]
    body.append(f"  return {fn}(in0, {rows}, {cols}, {'vocab' if is_str else 'NULL'}, {len(vocab)}, tables, "
                f"{len(tables)}, idx, w, {len(grams)}, {width}, {mode}, out0);")
    return string_extern(ctx, "".join(body), [x], [(ctx.out_shape(), DType.float32)],
                         preamble=c_source("tfidf.h") + c_instance("tfidf.c", macros, fn.upper()))


# ---- RegexFullMatch ----

@lowering("RegexFullMatch")
def _regex_full_match_lower(ctx, x):
    """The kernel kiln/codegen/c_src/regex_match.c (glibc's POSIX regex engine; its comment
    says how), instantiated for the pattern translated from RE2 syntax (kiln.lower.regex_posix)."""
    import hashlib

    from kiln.codegen.strings import c_bytes
    from kiln.lower.regex_posix import RegexError, re2_to_ere
    pattern = ctx.attr("pattern")
    pattern = pattern.decode("utf-8", "surrogateescape") if isinstance(pattern, bytes) else str(pattern)
    try:
        ere = re2_to_ere(pattern)
    except RegexError as e:
        ctx.fail(f"pattern {pattern!r} cannot run natively: {e}", stage="lower")
    h = "kiln_rx_" + hashlib.sha256(ere).hexdigest()[:16]
    preamble = c_instance("regex_match.c", {"KILN_RX(name)": f"{h}_##name", "KILN_RX_ERE": c_bytes(ere)}, h.upper())
    body = f"  return {h}_match(in0, out0, {math.prod(ctx.input_types[0].shape)});"
    errors = {3: "the C library's regcomp refused the pattern translated to POSIX syntax",
              4: "a string longer than 2**31 - 1 bytes, more than POSIX regexec can address"}
    return string_extern(ctx, body, [x], [(ctx.out_shape(), DType.bool)], preamble=preamble, errors=errors)
