"""Random generators: RandomUniform(Like), RandomNormal(Like), Bernoulli, Multinomial.

Values come from NumPy's PCG64 generator seeded by the `seed` attribute
(`ctx.rng()`): a seeded node gives the same values on every run of kiln, but
not the values another runtime's generator gives; without a seed each run
draws fresh values. Only shapes and dtypes are portable across runtimes. Their native
lowerings live in kiln.lower.random.
"""

from __future__ import annotations

import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.registry import OPAQUE, op


def _dtype(ctx, default: DType | None, allowed=lambda d: d.is_float) -> DType:
    """The `dtype` attribute (ONNX code), else `default`; checked against what the op can produce."""
    d = DType.from_onnx(int(ctx.attr("dtype"))) if ctx.has_attr("dtype") else default
    if d is None or not allowed(d):
        ctx.fail(f"unsupported output dtype {d}")
    return d


def _infer_from_shape(ctx):
    shape = tuple(int(s) for s in ctx.attr("shape"))
    if any(s < 0 for s in shape):
        ctx.fail(f"shape must be non-negative, got {list(shape)}")
    return [TensorType(_dtype(ctx, DType.float32), shape)]


def _infer_like(ctx):
    t = ctx.tensor(0)
    return [TensorType(_dtype(ctx, t.dtype if t.dtype.is_float else None), t.shape)]


def _uniform(ctx, shape):
    return ctx.rng().uniform(ctx.attr("low", 0.0), ctx.attr("high", 1.0), shape)


def _normal(ctx, shape):
    return ctx.rng().normal(ctx.attr("mean", 0.0), ctx.attr("scale", 1.0), shape)


def _register_sampler(name: str, draw) -> None:
    """`name` takes its shape from an attribute; `name`Like from its input (and its dtype by default)."""
    def from_shape(ctx):
        return draw(ctx, tuple(ctx.attr("shape"))).astype(_dtype(ctx, DType.float32).np)

    def like(ctx, x):
        return draw(ctx, x.shape).astype(_dtype(ctx, DType.from_numpy(x.dtype)).np)

    op(name, infer=_infer_from_shape, fusion=OPAQUE)(from_shape)
    op(name + "Like", infer=_infer_like, fusion=OPAQUE)(like)


_register_sampler("RandomUniform", _uniform)
_register_sampler("RandomNormal", _normal)


def _infer_bernoulli(ctx):
    t = ctx.tensor(0)
    if not t.dtype.is_float:
        ctx.fail(f"probabilities must be a float tensor, got {t.dtype}")
    return [TensorType(_dtype(ctx, t.dtype, lambda d: d.is_float or d.is_int or d == DType.bool), t.shape)]


@op("Bernoulli", infer=_infer_bernoulli, fusion=OPAQUE)
def bernoulli(ctx, p):
    out = _dtype(ctx, DType.from_numpy(p.dtype), lambda d: True)
    return (ctx.rng().random(p.shape) < p).astype(out.np)


def _infer_multinomial(ctx):
    t = ctx.tensor(0)
    if t.rank not in (None, 2) or not t.dtype.is_float:
        ctx.fail(f"input must be 2-D float log-probabilities [batch, classes], got {t}")
    n = int(ctx.attr("sample_size", 1))
    if n < 1:
        ctx.fail(f"sample_size must be positive, got {n}")
    out = _dtype(ctx, DType.int32, lambda d: d in (DType.int32, DType.int64))
    return [TensorType(out, (t.shape[0] if t.shape else ctx.new_dim(), n))]


@op("Multinomial", infer=_infer_multinomial, fusion=OPAQUE)
def multinomial(ctx, logits):
    """Draws class indices from softmax(logits) per row, by inverse CDF."""
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    cdf = np.cumsum(p, axis=1)
    u = ctx.rng().random((len(z), int(ctx.attr("sample_size", 1)))) * cdf[:, -1:]
    idx = np.stack([np.searchsorted(c, row, side="right") for c, row in zip(cdf, u)]).reshape(u.shape)
    return np.minimum(idx, z.shape[1] - 1).astype(_dtype(ctx, DType.int32, lambda d: True).np)
