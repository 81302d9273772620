"""ATen handlers: plumbing (getitem, clones, casts), elementwise math with torch's type
promotion, comparisons, logical and bitwise ops, where/masked_fill, and the matrix products.
"""

from __future__ import annotations

import operator

import numpy as np

from kiln.dtypes import DType
from kiln.graph.ir import Value
from kiln.frontends.torch_ops_common import TABLE, _promoted, aten, reg


# -- no-ops and plumbing ------------------------------------------------------------------

@reg(aten._assert_tensor_metadata.default, aten._assert_scalar.default,
     aten.sym_constrain_range_for_size.default, aten._assert_async.msg)
def _nothing(t, n, *args, **kw):
    return None


@reg(operator.getitem)
def _getitem(t, n, seq, i):
    v = seq[i]
    if v is None:
        t.fail(n, f"output {i} of this op (e.g. max_pool's indices, batch_norm's statistics) is not "
                  "translated")
    return v


@reg(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default, aten.detach.default)
def _identity(t, n, x, *args, **kw):
    return x


@reg(aten._to_copy.default)
def _to_copy(t, n, x, **kw):
    return t.b.cast(x, t.out_dtype(n))


# -- elementwise ----------------------------------------------------------------------------

_UNARY = {
    aten.relu.default: "Relu", aten.sigmoid.default: "Sigmoid", aten.tanh.default: "Tanh",
    aten.neg.default: "Neg", aten.exp.default: "Exp", aten.log.default: "Log", aten.sqrt.default: "Sqrt",
    aten.abs.default: "Abs", aten.erf.default: "Erf", aten.reciprocal.default: "Reciprocal",
    aten.floor.default: "Floor", aten.ceil.default: "Ceil", aten.sign.default: "Sign",
    aten.round.default: "Round", aten.sin.default: "Sin", aten.cos.default: "Cos", aten.tan.default: "Tan",
    aten.asin.default: "Asin", aten.acos.default: "Acos", aten.atan.default: "Atan",
    aten.sinh.default: "Sinh", aten.cosh.default: "Cosh", aten.asinh.default: "Asinh",
    aten.acosh.default: "Acosh", aten.atanh.default: "Atanh", aten.hardswish.default: "HardSwish",
}


def _unary(op):
    def handler(t, n, x):
        return t.b.op(op, [t.b.cast(x, t.out_dtype(n))])
    return handler


for _target, _op in _UNARY.items():
    TABLE[_target] = _unary(_op)


@reg(aten.isnan.default)
def _isnan(t, n, x):
    return t.b.op("IsNaN", [x])


@reg(aten.rsqrt.default)
def _rsqrt(t, n, x):
    return t.b.op("Reciprocal", [t.b.op("Sqrt", [t.b.cast(x, t.out_dtype(n))])])


@reg(aten.log1p.default)
def _log1p(t, n, x):
    dt = t.out_dtype(n)
    return t.b.op("Log", [t.b.op("Add", [t.b.cast(x, dt), t.tensor(1, dt)])])


@reg(aten.expm1.default)
def _expm1(t, n, x):
    dt = t.out_dtype(n)
    return t.b.op("Sub", [t.b.op("Exp", [t.b.cast(x, dt)]), t.tensor(1, dt)])


@reg(aten.gelu.default)
def _gelu(t, n, x, approximate="none"):
    return t.b.op("Gelu", [x], approximate=approximate)


@reg(aten.hardtanh.default, aten.clamp.default, aten.clamp.Tensor)
def _clamp(t, n, x, lo=None, hi=None):
    if n.target is aten.hardtanh.default:
        lo = -1.0 if lo is None else lo
        hi = 1.0 if hi is None else hi
    dt = t.out_dtype(n)
    x = t.b.cast(x, dt)
    if isinstance(lo, Value) or isinstance(hi, Value):  # tensor bounds broadcast: Max/Min
        if lo is not None:
            x = t.b.op("Max", [x, t.tensor(lo, dt)])
        if hi is not None:
            x = t.b.op("Min", [x, t.tensor(hi, dt)])
        return x
    return t.b.op("Clip", [x, None if lo is None else t.tensor(lo, dt), None if hi is None else t.tensor(hi, dt)])


@reg(aten.clamp_min.default)
def _clamp_min(t, n, x, lo):
    return _clamp(t, n, x, lo, None)


@reg(aten.clamp_max.default)
def _clamp_max(t, n, x, hi):
    return _clamp(t, n, x, None, hi)


@reg(aten.leaky_relu.default)
def _leaky_relu(t, n, x, slope=0.01):
    return t.b.op("LeakyRelu", [x], alpha=float(slope))


@reg(aten.elu.default)
def _elu(t, n, x, alpha=1.0, scale=1.0, input_scale=1.0):
    dt = t.out_dtype(n)
    if input_scale != 1:
        x = t.b.op("Mul", [x, t.tensor(input_scale, dt)])
    y = t.b.op("Elu", [x], alpha=float(alpha))
    return y if scale == 1 else t.b.op("Mul", [y, t.tensor(scale, dt)])


@reg(aten.hardsigmoid.default)
def _hardsigmoid(t, n, x):
    return t.b.op("HardSigmoid", [x], alpha=1 / 6, beta=0.5)


@reg(aten.softplus.default)
def _softplus(t, n, x, beta=1.0, threshold=20.0):
    dt = t.out_dtype(n)
    if beta == 1:
        y = t.b.op("Softplus", [x])
    else:
        y = t.b.op("Div", [t.b.op("Softplus", [t.b.op("Mul", [x, t.tensor(beta, dt)])]), t.tensor(beta, dt)])
    big = t.b.op("Greater", [t.b.op("Mul", [x, t.tensor(beta, dt)]), t.tensor(threshold, dt)])
    return t.b.op("Where", [big, x, y])


def _binary(op, alpha_on_b=False, swap=False):
    def handler(t, n, a, b, alpha=1, **kw):
        dt = t.out_dtype(n)
        if swap:
            a, b = b, a
        a, b = t.tensor(a, dt), t.tensor(b, dt)
        if alpha_on_b and alpha != 1:
            b = t.b.op("Mul", [b, t.tensor(alpha, dt)])
        return t.b.op(op, [a, b])
    return handler


for _targets, _h in [
    ((aten.add.Tensor, aten.add.Scalar), _binary("Add", alpha_on_b=True)),
    ((aten.sub.Tensor, aten.sub.Scalar), _binary("Sub", alpha_on_b=True)),
    ((aten.rsub.Scalar, aten.rsub.Tensor), _binary("Sub", alpha_on_b=True, swap=True)),
    ((aten.mul.Tensor, aten.mul.Scalar), _binary("Mul")),
    ((aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar), _binary("Pow")),
    ((aten.maximum.default,), _binary("Max")),
    ((aten.minimum.default,), _binary("Min")),
    ]:
    for _t in _targets:
        TABLE[_t] = _h


@reg(aten.fmod.Tensor, aten.fmod.Scalar)
def _fmod(t, n, a, b):
    dt = t.out_dtype(n)
    return t.b.op("Mod", [t.tensor(a, dt), t.tensor(b, dt)], fmod=1)


@reg(aten.remainder.Tensor, aten.remainder.Scalar)
def _remainder(t, n, a, b):
    dt = t.out_dtype(n)
    a, b = t.tensor(a, dt), t.tensor(b, dt)
    if not dt.np.kind == "f":
        return t.b.op("Mod", [a, b], fmod=0)
    return t.b.op("Sub", [a, t.b.op("Mul", [t.b.op("Floor", [t.b.op("Div", [a, b])]), b])])


@reg(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div(t, n, a, b, rounding_mode=None):
    dt = t.out_dtype(n)
    if rounding_mode is None or dt.np.kind == "f":
        work = dt
    else:
        work = DType.float64  # exact floor/trunc of an integer quotient
    q = t.b.op("Div", [t.tensor(a, work), t.tensor(b, work)])
    if rounding_mode == "floor":
        q = t.b.op("Floor", [q])
    elif rounding_mode == "trunc":
        q = t.b.op("Mul", [t.b.op("Floor", [t.b.op("Abs", [q])]), t.b.op("Sign", [q])])
    return t.b.cast(q, dt)


def _compare(op, negate=False):
    def handler(t, n, a, b):
        dt = _promoted(n)
        y = t.b.op(op, [t.tensor(a, dt), t.tensor(b, dt)])
        return t.b.op("Not", [y]) if negate else y
    return handler


for _name, _op, _neg in [("eq", "Equal", False), ("ne", "Equal", True), ("lt", "Less", False),
                         ("le", "LessOrEqual", False), ("gt", "Greater", False),
                         ("ge", "GreaterOrEqual", False)]:
    for _ov in ("Tensor", "Scalar"):
        TABLE[getattr(getattr(aten, _name), _ov)] = _compare(_op, _neg)


def _logical(op):
    def handler(t, n, a, b):
        return t.b.op(op, [_truth(t, a), _truth(t, b)])
    return handler


def _truth(t, x) -> Value:
    """x != 0 as a bool tensor."""
    if isinstance(x, Value) and t.b.dtype(x) == DType.bool:
        return x
    if not isinstance(x, Value):
        return t.b.const(np.asarray(bool(x)))
    return t.b.op("Not", [t.b.op("Equal", [x, t.tensor(0, t.b.dtype(x))])])


TABLE[aten.logical_and.default] = _logical("And")
TABLE[aten.logical_or.default] = _logical("Or")
TABLE[aten.logical_xor.default] = _logical("Xor")


@reg(aten.logical_not.default)
def _logical_not(t, n, x):
    return t.b.op("Not", [_truth(t, x)])


def _bitwise(bool_op, int_op):
    def handler(t, n, a, b):
        dt = t.out_dtype(n)
        return t.b.op(bool_op if dt == DType.bool else int_op, [t.tensor(a, dt), t.tensor(b, dt)])
    return handler


for _ov in ("Tensor", "Scalar"):
    TABLE[getattr(aten.bitwise_and, _ov)] = _bitwise("And", "BitwiseAnd")
    TABLE[getattr(aten.bitwise_or, _ov)] = _bitwise("Or", "BitwiseOr")
    TABLE[getattr(aten.bitwise_xor, _ov)] = _bitwise("Xor", "BitwiseXor")


@reg(aten.bitwise_not.default)
def _bitwise_not(t, n, x):
    return t.b.op("Not" if t.b.dtype(x) == DType.bool else "BitwiseNot", [x])


@reg(aten.where.self)
def _where(t, n, c, a, b):
    dt = t.out_dtype(n)
    return t.b.op("Where", [_truth(t, c), t.tensor(a, dt), t.tensor(b, dt)])


@reg(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(t, n, x, mask, value):
    dt = t.out_dtype(n)
    return t.b.op("Where", [_truth(t, mask), t.tensor(value, dt), x])


# -- linear algebra, convolution, normalization, pooling ------------------------------------

@reg(aten.mm.default, aten.bmm.default)
def _mm(t, n, a, b):
    return t.b.op("MatMul", [a, b])


@reg(aten.addmm.default)
def _addmm(t, n, bias, a, b, beta=1, alpha=1):
    return t.b.op("Gemm", [a, b, bias], alpha=float(alpha), beta=float(beta))


@reg(aten.baddbmm.default)
def _baddbmm(t, n, bias, a, b, beta=1, alpha=1):
    dt = t.out_dtype(n)
    y = t.b.op("MatMul", [a, b])
    if alpha != 1:
        y = t.b.op("Mul", [y, t.tensor(alpha, dt)])
    if beta == 0:
        return y
    if beta != 1:
        bias = t.b.op("Mul", [bias, t.tensor(beta, dt)])
    return t.b.op("Add", [y, bias])


@reg(aten.convolution.default)
def _convolution(t, n, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    k = t.b.rank(w) - 2
    pads = list(padding) * 2 if len(padding) == k else [padding[0]] * 2 * k
    attrs = dict(strides=list(stride), pads=pads, dilations=list(dilation), group=int(groups))
    if transposed:
        return t.b.op("ConvTranspose", [x, w, b], output_padding=list(output_padding), **attrs)
    return t.b.op("Conv", [x, w, b], **attrs)
