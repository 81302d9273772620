"""What the `ai.onnx.ml` op families share: input checks and score transforms (NumPy).
The C side (tables baked into hand-written kernels, score transforms in C) is kiln.lower.ml_common.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType


ML = "ai.onnx.ml"
POST = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")


def numeric_input(ctx, i: int = 0) -> TensorType:
    t = ctx.tensor(i)
    if not (t.dtype.is_float or t.dtype.is_int):
        ctx.fail(f"input {i} must be numeric, got {t.dtype}")
    return t


def rows_type(ctx, t: TensorType, width, dtype: DType = DType.float32) -> TensorType:
    """[N, width]: the output shape of the row-wise ML ops (1-D input is one row)."""
    n = 1 if t.rank == 1 else (t.shape[0] if t.shape else ctx.new_dim())
    return TensorType(dtype, (n, width))


def post_name(ctx, kind) -> str:
    """A post_transform given by enum code (0..4) or name, as its name."""
    kind = kind.decode() if isinstance(kind, bytes) else kind
    kind = POST[kind] if isinstance(kind, int) and 0 <= kind < len(POST) else kind
    if kind not in POST:
        ctx.fail(f"post_transform must be one of {', '.join(POST)}, got {kind!r}")
    return kind


def post_transform(ctx, scores: np.ndarray, kind) -> np.ndarray:
    """The ML ops' score transforms, by enum code (0..4) or name (NONE, SOFTMAX, ...)."""
    kind = post_name(ctx, kind)
    if kind == "NONE":
        return scores
    if kind == "LOGISTIC":
        return 1 / (1 + np.exp(-scores))
    if kind in ("SOFTMAX", "SOFTMAX_ZERO"):
        keep = scores != 0 if kind == "SOFTMAX_ZERO" else np.ones_like(scores, bool)
        e = np.where(keep, np.exp(scores - np.max(np.where(keep, scores, -np.inf), -1, keepdims=True)), 0)
        return e / np.maximum(e.sum(-1, keepdims=True), np.finfo(np.float64).tiny)
    return np.sqrt(2) * erfinv(2 * scores - 1)


def erfinv(y: np.ndarray) -> np.ndarray:
    """Inverse error function: Winitzki's closed form refined by Newton steps (no scipy)."""
    y = np.clip(y, -1, 1)
    a = 0.147
    ln = np.log1p(-y * y)
    t = 2 / (np.pi * a) + ln / 2
    x = np.sign(y) * np.sqrt(np.sqrt(t * t - ln / a) - t)
    erf = np.vectorize(math.erf, otypes=[np.float64])
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(3):
            x = np.where(np.abs(y) < 1, x - (erf(x) - y) / (2 / np.sqrt(np.pi) * np.exp(-x * x)), x)
    return x
