"""String operators: StringConcat, StringNormalizer, StringSplit, RegexFullMatch, TfIdfVectorizer.

String tensors are object arrays of Python `str`. Nothing here depends on the
system locale: case changes use Python's Unicode-aware `str.lower`/`str.upper`,
so results are the same on every machine.
"""

from __future__ import annotations

import re

import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.registry import OPAQUE, op
from kiln.ops.shapes import broadcast_shapes


def _strings(ctx, i: int) -> TensorType:
    t = ctx.tensor(i)
    if t.dtype != DType.string:
        ctx.fail(f"input {i} must be a string tensor, got {t.dtype}")
    return t


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def string_array(values, shape) -> np.ndarray:
    """An object array of `str` with the given shape (np.array would make a unicode array)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out.reshape(shape)


# ---- StringConcat ----

def _infer_concat(ctx):
    a, b = _strings(ctx, 0), _strings(ctx, 1)
    return [TensorType(DType.string, broadcast_shapes(ctx, a.shape, b.shape))]


@op("StringConcat", infer=_infer_concat, fusion=OPAQUE)
def string_concat(ctx, a, b):
    return np.asarray(np.add(a, b), dtype=object)


# ---- StringNormalizer ----

def _infer_normalizer(ctx):
    t = _strings(ctx, 0)
    if t.shape is not None and not (len(t.shape) == 1 or (len(t.shape) == 2 and t.shape[0] == 1)):
        ctx.fail(f"input must have shape [C] or [1, C], got {t}")
    if ctx.attr("case_change_action", "NONE") not in ("LOWER", "UPPER", "NONE"):
        ctx.fail(f"case_change_action must be LOWER, UPPER or NONE, got "
                 f"{ctx.attr('case_change_action')!r}")
    if t.shape is None or not ctx.attr("stopwords", None):
        return [t]
    return [TensorType(DType.string, t.shape[:-1] + (ctx.new_dim(),))]


@op("StringNormalizer", infer=_infer_normalizer, fusion=OPAQUE)
def string_normalizer(ctx, x):
    stop = [_text(w) for w in ctx.attr("stopwords", None) or []]
    fold = (lambda s: s) if ctx.attr("is_case_sensitive", 0) else str.lower
    stop = {fold(w) for w in stop}
    keep = [s for s in x.ravel() if fold(s) not in stop]
    change = {"LOWER": str.lower, "UPPER": str.upper}.get(ctx.attr("case_change_action", "NONE"))
    if change is not None:
        keep = [change(s) for s in keep]
    if not keep:  # the spec's "empty" result is one empty string, not a zero-size tensor
        keep = [""]
    return string_array(keep, x.shape[:-1] + (len(keep),))


# ---- StringSplit ----

def _infer_split(ctx):
    t = _strings(ctx, 0)
    subs = None if t.shape is None else t.shape + (ctx.new_dim(),)
    return [TensorType(DType.string, subs), TensorType(DType.int64, t.shape)]


@op("StringSplit", infer=_infer_split, fusion=OPAQUE)
def string_split(ctx, x):
    delim = ctx.attr("delimiter", None) or None  # unset or "": split on runs of whitespace
    maxsplit = ctx.attr("maxsplit", None)
    maxsplit = -1 if maxsplit is None else int(maxsplit)
    parts = [s.split(delim, maxsplit) for s in x.ravel()]
    width = max((len(p) for p in parts), default=0)
    flat = [s for p in parts for s in p + [""] * (width - len(p))]
    lengths = np.array([len(p) for p in parts], dtype=np.int64).reshape(x.shape)
    return string_array(flat, x.shape + (width,)), lengths


# ---- RegexFullMatch ----

_POSIX = {"alnum": "0-9A-Za-z", "alpha": "A-Za-z", "ascii": "\\x00-\\x7f", "blank": " \\t",
          "cntrl": "\\x00-\\x1f\\x7f", "digit": "0-9", "graph": "!-~", "lower": "a-z",
          "print": " -~", "punct": "!-/:-@\\[-`{-~", "space": " \\t\\n\\r\\f\\v",
          "upper": "A-Z", "word": "0-9A-Za-z_", "xdigit": "0-9A-Fa-f"}


_PERL = {"d": "0-9", "w": "0-9A-Za-z_", "s": "\\t\\n\\f\\r "}
_WORD = "[0-9A-Za-z_]"
_BOUNDARY = {"b": f"(?:(?<={_WORD})(?!{_WORD})|(?<!{_WORD})(?={_WORD}))",
             "B": f"(?:(?<={_WORD})(?={_WORD})|(?<!{_WORD})(?!{_WORD}))"}


def re2_to_python(ctx, pattern: str) -> re.Pattern:
    """Compile an RE2 pattern with Python's `re`, translating the RE2-only syntax.

    RE2's `\\d \\w \\s \\b` are ASCII-only, so they become explicit ASCII classes (and
    lookarounds for \\b), while the pattern stays Unicode: `(?i)` folds non-ASCII letters as
    RE2 does. A flag group `(?i)` applies to the rest of its group in RE2 (Python wants
    global flags first): it becomes a scoped `(?i:...)`, closed and reopened around `|`.
    RE2 rejects backreferences and lookaround; so do we, rather than silently accepting
    patterns another runtime would refuse.
    """
    if re.search(r"\(\?<?[=!]", pattern):
        ctx.fail(f"pattern {pattern!r} uses lookaround, which RE2 syntax does not allow")
    out, i = [], 0
    multiline = re.search(r"\(\?[a-zA-Z]*m", pattern) is not None
    scoped: list[list[str]] = [[]]   # per open group: the flag groups opened inside it
    in_class = class_start = False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            n = pattern[i + 1]
            if n == "Q":  # \Q...\E quotes literally
                end = pattern.find("\\E", i + 2)
                end = len(pattern) if end < 0 else end
                out.append(re.escape(pattern[i + 2:end]))
                i = end + 2
                continue
            if n == "x" and pattern[i + 2:i + 3] == "{":  # \x{10FFFF}
                end = pattern.find("}", i + 3)
                try:
                    out.append(re.escape(chr(int(pattern[i + 3:end], 16))))
                except ValueError:
                    ctx.fail(f"pattern {pattern!r} has a bad escape \\x{{...}}")
                i = end + 1
                continue
            if n.isdigit() and n != "0" and not (len(pattern) > i + 3 and pattern[i + 2:i + 4].isdigit()):
                ctx.fail(f"pattern {pattern!r} uses a backreference, which RE2 syntax does not allow")
            if n.lower() in _PERL:
                if in_class and n.isupper():
                    ctx.fail(f"pattern {pattern!r}: a negated class \\{n} inside brackets is not supported")
                body = _PERL[n.lower()]
                out.append(body if in_class else f"[{'^' if n.isupper() else ''}{body}]")
            elif n in _BOUNDARY and not in_class:
                out.append(_BOUNDARY[n])
            else:
                out.append("\\Z" if n == "z" else c + n)
            class_start = False
            i += 2
            continue
        if in_class:
            m = re.match(r"\[:(\^?)(\w+):\]", pattern[i:])
            if m and m.group(2) in _POSIX:
                if m.group(1):
                    ctx.fail(f"negated POSIX class in {pattern!r} is not supported")
                out.append(_POSIX[m.group(2)])
                i += m.end()
            else:
                in_class = not (c == "]" and not class_start)
                out.append(c)
                i += 1
            class_start = False
            continue
        if c == "[":
            in_class = class_start = True
            out.append("[^" if pattern[i + 1:i + 2] == "^" else "[")
            i += 2 if pattern[i + 1:i + 2] == "^" else 1
            continue
        flag = re.match(r"\(\?([imsU-]+)(\)|:)", pattern[i:]) if c == "(" else None
        if flag:
            flags = flag.group(1).replace("U", "")  # ungreedy: a full match does not depend on it
            if flag.group(2) == ")":
                if flags.strip("-"):
                    out.append(f"(?{flags}:")
                    scoped[-1].append(flags)
            else:
                out.append(f"(?{flags}:" if flags.strip("-") else "(?:")
                scoped.append([])
            i += flag.end()
            continue
        if c == "(":
            scoped.append([])
            if pattern.startswith("(?<", i) and not pattern.startswith("(?<=", i) \
                    and not pattern.startswith("(?<!", i):
                out.append("(?P<")  # RE2's (?<name>...) is Python's (?P<name>...)
                i += 3
                continue
        elif c == ")" and len(scoped) > 1:
            out.append(")" * len(scoped.pop()))
        elif c == "|":
            out.append(")" * len(scoped[-1]) + "|" + "".join(f"(?{f}:" for f in scoped[-1]))
            i += 1
            continue
        elif c == "$" and not multiline:  # RE2's $ is the end of the text; Python's also before a final \n
            out.append("\\Z")
            i += 1
            continue
        out.append(c)
        i += 1
    out.append(")" * len(scoped[0]))
    try:
        return re.compile("".join(out))
    except re.error as e:
        ctx.fail(f"invalid regular expression {pattern!r}: {e}")


def _infer_regex(ctx):
    t = _strings(ctx, 0)
    re2_to_python(ctx, ctx.attr("pattern"))
    return [TensorType(DType.bool, t.shape)]


@op("RegexFullMatch", infer=_infer_regex, fusion=OPAQUE)
def regex_full_match(ctx, x):
    rx = re2_to_python(ctx, ctx.attr("pattern"))
    return np.array([rx.fullmatch(s) is not None for s in x.ravel()], dtype=bool).reshape(x.shape)


# ---- TfIdfVectorizer ----

def _tfidf_pool(ctx) -> tuple[dict[tuple, int], int]:
    """Map each pooled n-gram (a tuple) to its position in the pool, and the output width."""
    strings, ints = ctx.attr("pool_strings", None), ctx.attr("pool_int64s", None)
    if (strings is None) == (ints is None):
        ctx.fail("exactly one of pool_strings and pool_int64s must be set")
    pool = [_text(s) for s in strings] if strings is not None else [int(v) for v in ints]
    starts = [int(v) for v in ctx.attr("ngram_counts")] + [len(pool)]
    indexes = [int(v) for v in ctx.attr("ngram_indexes")]
    grams: dict[tuple, int] = {}
    for n, (lo, hi) in enumerate(zip(starts, starts[1:]), start=1):
        if (hi - lo) % n:
            ctx.fail(f"the pool's {n}-grams span {hi - lo} items, not a multiple of {n}")
        for k in range(lo, hi, n):
            grams[tuple(pool[k:k + n])] = len(grams)
    if len(indexes) != len(grams):
        ctx.fail(f"ngram_indexes has {len(indexes)} entries for {len(grams)} pooled n-grams")
    return grams, max(indexes, default=-1) + 1


def _infer_tfidf(ctx):
    t = ctx.tensor(0)
    want_strings = ctx.attr("pool_strings", None) is not None
    if (t.dtype == DType.string) != want_strings or not (t.dtype in (DType.string, DType.int32, DType.int64)):
        ctx.fail(f"input type {t.dtype} does not match the "
                 f"{'pool_strings' if want_strings else 'pool_int64s'} pool")
    if ctx.attr("mode", "TF") not in ("TF", "IDF", "TFIDF"):
        ctx.fail(f"mode must be TF, IDF or TFIDF, got {ctx.attr('mode')!r}")
    if t.rank not in (None, 1, 2):
        ctx.fail(f"input must be 1-D or 2-D, got {t}")
    _, width = _tfidf_pool(ctx)
    shape = None if t.shape is None else t.shape[:-1] + (width,)
    return [TensorType(DType.float32, shape)]


@op("TfIdfVectorizer", infer=_infer_tfidf, fusion=OPAQUE)
def tfidf_vectorizer(ctx, x):
    grams, width = _tfidf_pool(ctx)
    indexes = np.array(ctx.attr("ngram_indexes"), dtype=np.int64)
    lo, hi = int(ctx.attr("min_gram_length")), int(ctx.attr("max_gram_length"))
    max_skip = int(ctx.attr("max_skip_count"))
    rows = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    counts = np.zeros((rows.shape[0], len(grams)), dtype=np.float32)
    # only lengths the pool holds can match, and a skip wider than the row matches nothing:
    # bounding both keeps the loops to the data (max_gram_length 10^12 ran for ever)
    lengths = sorted({len(g) for g in grams if lo <= len(g) <= hi})
    max_skip = min(max_skip, rows.shape[1])
    for r, row in enumerate(rows):
        row = [v if isinstance(v, str) else int(v) for v in row]
        for n in lengths:
            for skip in range(max_skip + 1 if n > 1 else 1):  # unigrams have no skips to vary
                step = skip + 1
                for start in range(len(row) - (n - 1) * step):
                    k = grams.get(tuple(row[start:start + (n - 1) * step + 1:step]))
                    if k is not None:
                        counts[r, k] += 1
    weights = ctx.attr("weights", None)
    weights = np.ones(len(grams), np.float32) if weights is None else np.asarray(weights, np.float32)
    mode = ctx.attr("mode", "TF")
    if mode == "IDF":
        counts = np.minimum(counts, 1) * weights
    elif mode == "TFIDF":
        counts = counts * weights
    out = np.zeros((rows.shape[0], width), dtype=np.float32)
    np.add.at(out, (slice(None), indexes), counts)
    return out.reshape(x.shape[:-1] + (width,))
