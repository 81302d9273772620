"""What the `ai.onnx.ml` families' lowerings share: C tables baked into hand-written
kernels, score transforms in C, label outputs (numbers or strings).
"""

from __future__ import annotations

import numpy as np

from kiln.codegen.csource import c_source
from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.ml_common import post_name


def rows_width(ctx, t: TensorType) -> tuple[int, int]:
    """(rows, features) of a 1-D (one row) or 2-D input, for a kernel."""
    if t.rank not in (1, 2):
        ctx.fail(f"X must be 1-D or 2-D, got {t}", stage="lower")
    return (1, t.shape[0]) if t.rank == 1 else tuple(t.shape)


# ---- C helpers for the hand-written kernels ----
#
# Tables (tree nodes, leaf weights, label maps, coefficients) are baked into the kernel's
# source as exact literals, or as one aligned byte string for the big ones (fast to compile).

def c_type(ctx, dt: DType, what: str = "input") -> str:
    if dt.c is None:
        ctx.fail(f"{what} of type {dt} has no native (C) type", stage="lower")
    return dt.c


def c_table(ctx, name: str, ctype: str, data, dt: DType) -> str:
    """`static const ctype name[] = {...};` with exact literals (one dummy element when empty)."""
    from kiln.lower.tensor import c_literals
    data = np.asarray(data, dt.np).reshape(-1)
    lits = c_literals(data, dt) if data.size else ["0"]
    return f"  static const {ctype} {name}[{max(data.size, 1)}] = {{{', '.join(lits)}}};\n"


def c_blob(name: str, data: bytes) -> str:
    """`static const unsigned char name[]`, 64-byte aligned, holding `data` (native byte order):
    a string literal, which C compilers read far faster than a long list of numbers."""
    data = data or b"\0"
    b = np.frombuffer(data, np.uint8)
    esc = np.empty((len(b), 4), np.uint8)  # \xHH per byte, built at once
    esc[:, 0], esc[:, 1] = ord("\\"), ord("x")
    esc[:, 2], esc[:, 3] = _HEX[b >> 4], _HEX[b & 15]
    text = esc.tobytes().decode("ascii")
    step = 4 * 2048
    chunks = ['"' + text[i:i + step] + '"' for i in range(0, len(text), step)]
    return (f"  static const unsigned char {name}[{len(data)}] __attribute__((aligned(64))) =\n    "
            + "\n    ".join(chunks) + ";\n")


_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)


def c_post_transform(ctx, kind, n: int) -> str:
    """C over `double* a` (one row of n scores): `post_transform` in float64, a call into
    kiln/codegen/c_src/ml_post_transform.h (`POST_TRANSFORM_C`, which the kernel's preamble
    must hold: label_extern adds it)."""
    kind = post_name(ctx, kind)
    if kind == "NONE":
        return ""
    if kind in ("LOGISTIC", "PROBIT"):
        return f"    kiln_ml_{kind.lower()}(a, {n});\n"
    return f"    kiln_ml_softmax(a, {n}, {int(kind == 'SOFTMAX_ZERO')});\n"


def post_transform_c() -> str:
    """The C the post transforms call (kiln/codegen/c_src/ml_post_transform.h)."""
    return c_source("ml_post_transform.h")


def c_labels(ctx, labels: list, strings: bool) -> str:
    """`static const T labels[]`: int64 class labels, or string ones as kiln_str."""
    if strings:
        from kiln.codegen.strings import str_table
        return str_table("labels", labels)
    return c_table(ctx, "labels", "int64_t", labels, DType.int64)


def label_extern(ctx, body: str, inputs: list, outputs: list, strings: bool, preamble: str = "", **kw):
    """ctx.extern for a classifier kernel, the post transforms in its preamble; with string
    labels its label output is kiln_str and the string helpers join its preamble."""
    preamble = post_transform_c() + preamble
    if strings:
        from kiln.lower.strings import string_extern
        return string_extern(ctx, body, inputs, outputs, preamble=preamble, **kw)
    return ctx.extern(body, inputs, outputs, preamble=preamble, **kw)
