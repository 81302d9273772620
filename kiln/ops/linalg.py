"""Linear algebra: MatMul, Gemm, MatMulInteger, QLinearMatMul, Einsum, Det.

Float products are computed in float64 and cast back (numpy's float16 matmul
and float32 einsum accumulate in low precision); integer products keep their
exact integer semantics.
"""

from __future__ import annotations


import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.reduce import as_dtype, text, wide
from kiln.ops.registry import OPAQUE, OUT_FUSABLE, InferCtx, RunCtx, op
from kiln.ops.shapes import broadcast_shapes


def _same_dim(ctx, a, b, what: str):
    """Check two static dims agree (symbols match anything); return the more specific one."""
    if isinstance(a, int) and isinstance(b, int) and a != b:
        ctx.fail(f"{what}: {a} vs {b}")
    return a if isinstance(a, int) else b


def matmul_shape(ctx, a, b):
    """numpy.matmul output shape: 1-D operands are promoted then squeezed, batch dims broadcast."""
    if a is None or b is None:
        return None
    if len(a) == 0 or len(b) == 0:
        ctx.fail(f"MatMul operands must have rank >= 1, got shapes {a} and {b}")
    a2 = (1, *a) if len(a) == 1 else tuple(a)
    b2 = (*b, 1) if len(b) == 1 else tuple(b)
    _same_dim(ctx, a2[-1], b2[-2], f"inner dimensions of shapes {tuple(a)} and {tuple(b)} differ")
    batch = broadcast_shapes(ctx, a2[:-2], b2[:-2])
    return (*batch, *((a2[-2],) if len(a) > 1 else ()), *((b2[-1],) if len(b) > 1 else ()))


def _matmul_infer(ctx: InferCtx, dtype=None):
    b = 3 if ctx.node.op == "QLinearMatMul" else 1  # QLinearMatMul: (a, a_scale, a_zp, b, ...)
    return [TensorType(dtype or ctx.dtype(0), matmul_shape(ctx, ctx.shape(0), ctx.shape(b)))]


@op("MatMul", infer=_matmul_infer, fusion=OUT_FUSABLE)
def matmul(ctx: RunCtx, a, b):
    return as_dtype(np.matmul(wide(a), wide(b)), a.dtype)


def _zero_pointed(x, zp, per_row: bool):
    """x - zero_point in int32 (float64 for float8 data); a 1-D per-row zero point of `a` becomes a column."""
    acc = np.float64 if DType.from_numpy(x.dtype).is_float else np.int32
    x = x.astype(acc)
    if zp is None:
        return x
    zp = zp.astype(acc)
    if per_row and zp.ndim == 1 and x.ndim >= 2:
        zp = zp.reshape(-1, 1)
    return x - zp


@op("MatMulInteger", infer=lambda ctx: _matmul_infer(ctx, DType.int32), fusion=OPAQUE)
def matmul_integer(ctx: RunCtx, a, b, a_zero_point=None, b_zero_point=None):
    return np.matmul(_zero_pointed(a, a_zero_point, True), _zero_pointed(b, b_zero_point, False))


def _qlinear_matmul_infer(ctx: InferCtx):
    out = ctx.dtype(7) if ctx.has_input(7) else ctx.dtype(0)
    return _matmul_infer(ctx, out)


@op("QLinearMatMul", infer=_qlinear_matmul_infer, fusion=OPAQUE)
def qlinear_matmul(ctx: RunCtx, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point=None):
    from kiln.ops.quant import saturate_to
    acc = np.matmul(_zero_pointed(a, a_zero_point, True), _zero_pointed(b, b_zero_point, False))
    if a_scale.ndim == 1 and a.ndim >= 2:
        a_scale = a_scale.reshape(-1, 1)
    y = acc.astype(np.float64) * (a_scale * b_scale / y_scale)
    out = a.dtype if y_zero_point is None else y_zero_point.dtype
    return saturate_to(y, out, y_zero_point)


# ---- Gemm ----

def _gemm_infer(ctx: InferCtx):
    a, b = ctx.shape(0), ctx.shape(1)
    if a is None or b is None:
        return [TensorType(ctx.dtype(0), ctx.unknown_shape(2))]
    if len(a) != 2 or len(b) != 2:
        ctx.fail(f"A and B must be 2-D, got shapes {a} and {b}")
    (k1, m) = a if ctx.attr("transA", 0) else a[::-1]
    (n, k2) = b if ctx.attr("transB", 0) else b[::-1]
    _same_dim(ctx, k1, k2, f"inner dimensions of A{tuple(a)} and B{tuple(b)} (transA={ctx.attr('transA', 0)}, "
              f"transB={ctx.attr('transB', 0)}) differ")
    if ctx.has_input(2) and ctx.shape(2) is not None:
        c = ctx.shape(2)
        if len(c) > 2:
            ctx.fail(f"C must be broadcastable to (M, N) = ({m}, {n}), got shape {c}")
        broadcast_shapes(ctx, c, (m, n))
    return [TensorType(ctx.dtype(0), (m, n))]


@op("Gemm", infer=_gemm_infer, fusion=OUT_FUSABLE)
def gemm(ctx: RunCtx, a, b, c=None):
    a2 = wide(a).T if ctx.attr("transA", 0) else wide(a)
    b2 = wide(b).T if ctx.attr("transB", 0) else wide(b)
    y = ctx.attr("alpha", 1.0) * np.matmul(a2, b2)
    if c is not None:
        y = y + ctx.attr("beta", 1.0) * wide(c)
    return as_dtype(y, a.dtype)


# ---- Einsum ----

def _einsum_terms(ctx, equation: str, ranks: list[int]):
    """Per operand, and for the output, a list of labels; ellipsis dims become labels ('...', k from the right)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        ctx.fail(f"equation {equation!r} names {len(terms)} operands, node has {len(ranks)} inputs")

    def expand(term: str, rank: int | None):
        head, dots, tail = term.partition("...")
        if not dots:
            if rank is not None and rank != len(term):
                ctx.fail(f"term {term!r} of equation {equation!r} has {len(term)} labels for a rank-{rank} input")
            return list(term)
        n = (rank - len(head) - len(tail)) if rank is not None else 0
        if n < 0:
            ctx.fail(f"term {term!r} of equation {equation!r} has too many labels for a rank-{rank} input")
        return [*head, *(("...", n - i) for i in range(n)), *tail]

    ins = [expand(t, r) for t, r in zip(terms, ranks)]
    ell = max((lab[1] for t in ins for lab in t if isinstance(lab, tuple)), default=0)
    if arrow:
        out = expand(rhs, None)
        if "..." in rhs:
            head, _, tail = rhs.partition("...")
            out = [*head, *(("...", ell - i) for i in range(ell)), *tail]
    else:
        letters = [lab for t in ins for lab in t if isinstance(lab, str)]
        out = [("...", ell - i) for i in range(ell)] + sorted(c for c in set(letters) if letters.count(c) == 1)
    return ins, out


def _einsum_infer(ctx: InferCtx):
    shapes = [ctx.shape(i) for i in range(ctx.num_inputs)]
    if any(s is None for s in shapes):
        return [TensorType(ctx.dtype(0), None)]
    ins, out = _einsum_terms(ctx, text(ctx.attr("equation")), [len(s) for s in shapes])
    sizes: dict = {}
    for labels, shape in zip(ins, shapes):
        for lab, d in zip(labels, shape):
            prev = sizes.get(lab)
            if prev is None or prev == 1 or isinstance(prev, str):
                sizes[lab] = d if prev is None or d != 1 else prev
            elif isinstance(d, int) and d not in (1, prev):
                ctx.fail(f"label {lab!r} has sizes {prev} and {d} in equation {ctx.attr('equation')!r}")
    return [TensorType(ctx.dtype(0), tuple(sizes.get(lab, 1) for lab in out))]


@op("Einsum", infer=_einsum_infer, fusion=OPAQUE)
def einsum(ctx: RunCtx, *xs):
    return as_dtype(np.einsum(text(ctx.attr("equation")).replace(" ", ""), *map(wide, xs)), xs[0].dtype)


# ---- Det ----

def _det_infer(ctx: InferCtx):
    s = ctx.shape(0)
    if s is not None:
        if len(s) < 2:
            ctx.fail(f"input must have rank >= 2 (a batch of square matrices), got shape {s}")
        _same_dim(ctx, s[-2], s[-1], f"matrices must be square, got shape {s}")
        s = s[:-2]
    return [TensorType(ctx.dtype(0), s)]


@op("Det", infer=_det_infer, fusion=OPAQUE)
def det(ctx: RunCtx, x):
    return as_dtype(np.linalg.det(wide(x)), x.dtype)
