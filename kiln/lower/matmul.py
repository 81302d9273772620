"""GEMM-family lowerings (cpu target): MatMul, Gemm, MatMulInteger, QLinearMatMul, Einsum, Det,
and kiln's MatMulPacked.

MatMul, Gemm and MatMulInteger are one GEMM (kiln.lower.gemm) with different
operand views and epilogues; transposes stay views (the GEMM reads them in place
or while packing), so no operand is copied just to change its layout.
"""

from __future__ import annotations

import math

import numpy as np

import kiln.loops as L
from kiln.codegen.csource import c_instance
from kiln.dtypes import DType
from kiln.lower.gemm import Gemm, accumulator_dtype, gemm as build_gemm
from kiln.ops.linalg import _einsum_terms
from kiln.ops.packed import DOMAIN
from kiln.ops.reduce import text
from kiln.lower.context import LowerCtx, lowering


def _scheduled(ctx: LowerCtx, g: Gemm):
    """The GEMM's output, with its schedule (tiling the kernel's output: with a fused
    elementwise epilogue, that is the epilogue's result)."""
    ctx.schedule(lambda sch, outs: g.schedule(sch, outs[0] if len(outs) == 1 else None))
    return g.out


def _as_matrices(a, b):
    """numpy.matmul's 1-D rule: a (K,) is a row [1, K], b (K,) a column [K, 1]; those dims are squeezed."""
    squeeze = []
    if len(a.shape) == 1:
        a = L.compute((1, a.shape[0]), lambda i, k, a=a: a[k], "row")
        squeeze.append("m")
    if len(b.shape) == 1:
        b = L.compute((b.shape[0], 1), lambda k, j, b=b: b[k], "col")
        squeeze.append("n")
    return a, b, tuple(squeeze)


@lowering("MatMul")
def _lower_matmul(ctx: LowerCtx, a, b):
    a, b, squeeze = _as_matrices(a, b)
    return _scheduled(ctx, build_gemm(a, b, squeeze=squeeze, name="matmul", target=ctx.target))


def _index_bcast(t, idx):
    """t[idx] with numpy broadcasting of t's (right-aligned) shape against idx."""
    idx = tuple(idx[len(idx) - len(t.shape):]) if t.shape else ()
    return t[tuple(0 if n == 1 else i for i, n in zip(idx, t.shape))]


def gemm_epilogue(alpha: float, beta: float, c, ep: DType):
    """Gemm's epilogue in `ep`: alpha * v + beta * c[idx] (c broadcast, or None)."""
    def epilogue(v, idx):
        v = L.cast(ep, v)
        if alpha != 1.0:
            v = v * L.const(alpha, ep)
        if c is not None:
            cv = L.cast(ep, _index_bcast(c, idx))
            v = v + (cv if beta == 1.0 else cv * L.const(beta, ep))
        return v
    return epilogue


@lowering("Gemm")
def _lower_gemm(ctx: LowerCtx, a, b, c=None):
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    acc = accumulator_dtype(a.dtype)
    # integer Gemm scales in float64 and truncates, as the reference does
    ep = acc if acc.is_float or (alpha == 1.0 and (c is None or beta == 1.0)) else DType.float64

    g = build_gemm(a, b, trans_a=bool(ctx.attr("transA", 0)), trans_b=bool(ctx.attr("transB", 0)),
             epilogue=gemm_epilogue(alpha, beta, c, ep), name="gemm", target=ctx.target)
    return _scheduled(ctx, g)


def _param(p, idx, per_row: bool):
    """A zero point or scale at output index idx = (*batch, i, j): a 1-D one of `a` holds
    one value per row (as the reference reshapes it to a column), others broadcast."""
    if per_row and len(p.shape) == 1 and p.shape[0] != 1:
        return p[(idx[-2],)]
    return _index_bcast(p, idx)


def _shifted(x, zp, per_row: bool, name: str):
    """int32 view of x - zero_point, for the GEMM to read (inlined, never stored)."""
    if zp is None:
        return L.compute(x.shape, lambda *i: L.cast(DType.int32, x[i]), name)
    per_row = per_row and len(x.shape) >= 2
    return L.compute(x.shape, lambda *i: L.cast(DType.int32, x[i]) - L.cast(DType.int32, _param(zp, i, per_row)),
                     name)


@lowering("MatMulInteger")
def _lower_matmul_integer(ctx: LowerCtx, a, b, a_zero_point=None, b_zero_point=None):
    a, b, squeeze = _as_matrices(_shifted(a, a_zero_point, True, "a_shifted"),
                                 _shifted(b, b_zero_point, False, "b_shifted"))
    return _scheduled(ctx, build_gemm(a, b, squeeze=squeeze, out_dtype=DType.int32, name="matmul_integer", target=ctx.target))


@lowering("QLinearMatMul")
def _lower_qlinear_matmul(ctx: LowerCtx, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                          y_zero_point=None):
    """int32 GEMM of the shifted operands; the epilogue requantizes as the reference:
    acc * (a_scale * b_scale / y_scale) (the factor in the scales' type, the product in
    float64), rounded half to even, plus y's zero point, saturated."""
    out = ctx.out_dtype()
    if not out.is_int:
        ctx.fail(f"QLinearMatMul to {out} has no native code (integer outputs only)")
    info = np.iinfo(out.np)
    sdt = DType.from_numpy(np.result_type(a_scale.dtype.np, b_scale.dtype.np, y_scale.dtype.np))
    f64 = DType.float64
    a_rows = len(a.shape) >= 2

    def epilogue(v, idx):
        s = L.cast(sdt, _param(a_scale, idx, a_rows)) * L.cast(sdt, _index_bcast(b_scale, idx)) \
            / L.cast(sdt, _index_bcast(y_scale, idx))
        y = L.round_(L.cast(f64, v) * L.cast(f64, s))
        if y_zero_point is not None:
            y = y + L.cast(f64, _index_bcast(y_zero_point, idx))
        return L.min_(L.max_(y, L.const(info.min, f64)), L.const(info.max, f64))

    a, b, squeeze = _as_matrices(_shifted(a, a_zero_point, True, "a_shifted"),
                                 _shifted(b, b_zero_point, False, "b_shifted"))
    return _scheduled(ctx, build_gemm(a, b, squeeze=squeeze, epilogue=epilogue, acc_dtype=DType.int32,
                                      out_dtype=out, name="qlinear_matmul", target=ctx.target))


@lowering("Einsum")
def _lower_einsum(ctx: LowerCtx, *xs):
    """Two-operand contractions shaped like a (batched) matmul go to the GEMM; any other
    equation is one reduction compute over the labels missing from the output."""
    ins, out = _einsum_terms(ctx, text(ctx.attr("equation")), [len(x.shape) for x in xs])
    sizes: dict = {}
    for labels, x in zip(ins, xs):
        for lab, d in zip(labels, x.shape):
            sizes[lab] = d if sizes.get(lab, 1) == 1 else sizes[lab]
    shape, dt = ctx.out_shape(), ctx.out_dtype()
    g = _einsum_as_gemm(ins, out, xs, sizes, ctx.target)
    if g is not None:
        return _scheduled(ctx, g)
    red = [lab for labels in ins for lab in labels if lab not in out]
    red = list(dict.fromkeys(red))
    if any(sizes[lab] == 0 for lab in red):
        return L.compute(shape, lambda *i: L.const(0, dt), "einsum")
    acc = accumulator_dtype(dt)
    raxes = {lab: L.reduce_axis(sizes[lab], lab if isinstance(lab, str) else f"e{lab[1]}") for lab in red}

    def body(*ix):
        env = {**dict(zip(out, ix)), **raxes}
        prod = None
        for labels, x in zip(ins, xs):
            v = L.cast(acc, x[tuple(0 if d == 1 else env[lab] for lab, d in zip(labels, x.shape))])
            prod = v if prod is None else prod * v
        return L.sum_(prod, list(raxes.values())) if raxes else prod

    y = L.compute(shape, body, "einsum")
    return y if y.dtype == dt else L.compute(shape, lambda *i: L.cast(dt, y[i]), "einsum_cast")


def _einsum_as_gemm(ins, out, xs, sizes, target) -> Gemm | None:
    """The GEMM for `batch.. m, k` x `batch.. k, n` -> `batch.. m n` (any operand axis order;
    m, n may be absent), else None."""
    if len(ins) != 2 or any(len(set(t)) != len(t) for t in ins):
        return None
    (la, lb), (xa, xb) = ins, xs
    if any(d != sizes[lab] for t, x in zip(ins, xs) for lab, d in zip(t, x.shape)):
        return None                                      # a broadcast label: the general path
    ks = [lab for lab in la if lab in lb and lab not in out]
    ms = [lab for lab in la if lab not in lb]
    ns = [lab for lab in lb if lab not in la]
    batch = [lab for lab in out if lab in la and lab in lb]
    if len(ks) != 1 or len(ms) > 1 or len(ns) > 1 or out != [*batch, *ms, *ns] \
            or len(batch) + len(ks) + len(ms) != len(la) or len(batch) + len(ks) + len(ns) != len(lb):
        return None
    k = ks[0]

    def view(x, labels, other, is_a):
        """x as the GEMM operand [*batch, M, K] / [*batch, K, N], or transposed where x stores
        its two matrix labels the other way round (the GEMM reads either in place)."""
        o = other[0] if other else None
        k_first = o is not None and labels.index(k) < labels.index(o)
        trans = k_first if is_a else (o is not None and not k_first)
        dims = [*batch, *((k, o) if k_first or (not is_a and o is None) else (o, k))]
        shape = [1 if lab is None else sizes[lab] for lab in dims]
        return L.compute(shape, lambda *ix: x[tuple(dict(zip(dims, ix))[lab] for lab in labels)],
                         "einsum_view"), trans

    a, ta = view(xa, la, ms, True)
    b, tb = view(xb, lb, ns, False)
    squeeze = ("m",) * (not ms) + ("n",) * (not ns)
    return build_gemm(a, b, trans_a=ta, trans_b=tb, squeeze=squeeze, name="einsum", target=target)


@lowering("Det")
def _lower_det(ctx: LowerCtx, x):
    """LU factorization with partial pivoting per matrix, in double (as numpy's LAPACK getrf)."""
    *batch, n, _ = x.shape
    fn = f"kiln_det_{x.dtype.name}"
    preamble = c_instance("det.c", {"KILN_DET_T": x.dtype.c, "KILN_DET_FN": fn}, fn.upper())
    body = f"  return {fn}(in0, out0, {math.prod(batch)}, {n});"
    return ctx.extern(body, [x], [(tuple(batch), x.dtype)], preamble=preamble)


@lowering("MatMulPacked", domain=DOMAIN)
def _lower(ctx, a, wp, c=None):
    n = int(ctx.attr("n"))
    *wb, _, k, nr = wp.shape
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    ep = accumulator_dtype(a.dtype)
    # b only gives the GEMM its [..., K, n] shape: the kernel reads the panels
    b = L.compute((*wb, k, n), lambda *ix: wp[(*ix[:-2], ix[-1] // nr, ix[-2], ix[-1] % nr)], "w")

    g = build_gemm(a, b, epilogue=gemm_epilogue(alpha, beta, c, ep), name="matmul_packed", prepacked=wp,
                   target=ctx.target)
    return _scheduled(ctx, g)
