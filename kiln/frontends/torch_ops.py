"""Core ATen ops as kiln (ONNX-semantics) nodes: one handler per op overload.

A handler gets the translator, the FX node and the node's arguments with every
FX node replaced by its kiln value (a `Value`, a `SymInt` for sizes read at run
time, or a python number), and returns the op's result in torch's structure
(a value, or a tuple for ops with several outputs). Dtypes follow the FX
node's metadata, so torch's type promotion is reproduced by explicit Casts.
"""

from __future__ import annotations

import math
import operator

import numpy as np
import torch

from kiln.dtypes import DType
from kiln.frontends.torch_fx import SymInt, Translator
from kiln.graph.ir import Value

aten = torch.ops.aten
TABLE: dict = {}
INT64_MAX = (1 << 63) - 1


def reg(*targets):
    def deco(fn):
        for t in targets:
            TABLE[t] = fn
        return fn
    return deco


def _axis(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def _meta(a):
    """An argument as torch.result_type sees it: a fake tensor's metadata, or a python number."""
    if isinstance(a, torch.fx.Node):
        v = a.meta.get("val")
        return v if isinstance(v, torch.Tensor) else 1
    return a


def _promoted(n) -> DType:
    """The dtype torch computes a binary op in (for comparisons, not their bool result)."""
    a, b = (_meta(x) for x in n.args[:2])
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        return DType.int64 if all(isinstance(x, int) for x in (a, b)) else DType.float32
    from kiln.frontends.torch_fx import kiln_dtype
    return kiln_dtype(torch.result_type(a, b))


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


def _ones_or(t, v, size, dt, fill):
    if v is not None:
        return v
    if not isinstance(size, int):
        raise_static(t, "an affine-less normalization over a symbolic number of channels")
    return t.b.const(np.full((size,), fill, dtype=dt.np))


def raise_static(t, what):
    from kiln.errors import KilnError
    raise KilnError(f"{what} is not supported; give it a static size", stage="torch import")


@reg(aten._native_batch_norm_legit_no_training.default)
def _batch_norm(t, n, x, w, b, mean, var, momentum, eps):
    c = t.b.shape(x)[1]
    dt = t.b.dtype(x)
    w, b = _ones_or(t, w, c, dt, 1.0), _ones_or(t, b, c, dt, 0.0)
    return t.b.op("BatchNormalization", [x, w, b, mean, var], epsilon=float(eps)), None, None


@reg(aten.native_layer_norm.default)
def _layer_norm(t, n, x, shape, w, b, eps):
    dt = t.b.dtype(x)
    if w is None:
        w = t.b.const(np.ones(tuple(shape), dtype=dt.np))
    y = t.b.op("LayerNormalization", [x, w, b], axis=-len(shape), epsilon=float(eps))
    return y, None, None


@reg(aten.native_group_norm.default)
def _group_norm(t, n, x, w, b, N, C, HxW, group, eps):
    dt = t.b.dtype(x)
    c = t.b.shape(x)[1]
    w, b = _ones_or(t, w, c, dt, 1.0), _ones_or(t, b, c, dt, 0.0)
    return t.b.op("GroupNormalization", [x, w, b], num_groups=int(group), epsilon=float(eps)), None, None


@reg(aten._softmax.default)
def _softmax(t, n, x, dim, half_to_float=False):
    return t.b.op("Softmax", [x], axis=int(dim))


@reg(aten._log_softmax.default)
def _log_softmax(t, n, x, dim, half_to_float=False):
    return t.b.op("LogSoftmax", [x], axis=int(dim))


def _pool_attrs(k, kernel, stride, padding, dilation, ceil_mode):
    kernel = list(kernel) * (k // len(kernel))
    stride = list(stride) * (k // len(stride)) if stride else kernel
    padding = list(padding) * (k // len(padding))
    attrs = dict(kernel_shape=kernel, strides=stride, pads=padding * 2, ceil_mode=int(bool(ceil_mode)))
    if dilation is not None:
        attrs["dilations"] = list(dilation) * (k // len(dilation))
    return attrs


@reg(aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
def _max_pool(t, n, x, kernel, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    k = t.b.rank(x) - 2
    return t.b.op("MaxPool", [x], **_pool_attrs(k, kernel, stride, padding, dilation, ceil_mode)), None


@reg(aten.avg_pool2d.default, aten.avg_pool3d.default)
def _avg_pool(t, n, x, kernel, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    if divisor_override is not None:
        t.fail(n, "avg_pool with divisor_override is not supported")
    k = t.b.rank(x) - 2
    return t.b.op("AveragePool", [x], count_include_pad=int(bool(count_include_pad)),
                  **_pool_attrs(k, kernel, stride, padding, None, ceil_mode))


@reg(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool(t, n, x, output_size):
    spatial = t.b.shape(x)[2:]
    if all(o == 1 for o in output_size):
        return t.b.op("GlobalAveragePool", [x])
    if not all(isinstance(s, int) and s % o == 0 for s, o in zip(spatial, output_size)):
        t.fail(n, f"adaptive_avg_pool from {spatial} to {list(output_size)}: kiln needs each output "
                  "size to divide its (static) input size")
    kernel = [s // o for s, o in zip(spatial, output_size)]
    return t.b.op("AveragePool", [x], kernel_shape=kernel, strides=kernel)


@reg(aten.upsample_nearest2d.default, aten.upsample_nearest2d.vec,
     aten.upsample_bilinear2d.default, aten.upsample_bilinear2d.vec)
def _upsample(t, n, x, output_size, *rest):
    out = n.meta["val"].shape
    if not all(isinstance(d, int) for d in out):
        t.fail(n, "upsampling to a symbolic size is not supported")
    sizes = t.b.i64(list(out))
    if "nearest" in str(n.target):
        return t.b.op("Resize", [x, None, None, sizes], mode="nearest",
                      coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    align = bool(rest[0]) if rest else False
    return t.b.op("Resize", [x, None, None, sizes], mode="linear",
                  coordinate_transformation_mode="align_corners" if align else "pytorch_half_pixel")


# -- reductions -----------------------------------------------------------------------------

def _axes(t, x, dims):
    r = t.b.rank(x)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(r))
    if isinstance(dims, int):
        dims = [dims]
    return [_axis(d, r) for d in dims]


def _reduce(op, via=None):
    def handler(t, n, x, dims=None, keepdim=False, dtype=None, **kw):
        out = t.out_dtype(n)
        work = via or out
        x = t.b.cast(x, work)
        if t.b.rank(x) == 0:
            return t.b.cast(x, out)
        y = t.b.op(op, [x, t.b.i64(_axes(t, x, dims))], keepdims=int(bool(keepdim)))
        return t.b.cast(y, out)
    return handler


TABLE[aten.mean.dim] = _reduce("ReduceMean")
TABLE[aten.mean.default] = lambda t, n, x, dtype=None: _reduce("ReduceMean")(t, n, x)
TABLE[aten.sum.dim_IntList] = _reduce("ReduceSum")
TABLE[aten.sum.default] = lambda t, n, x, dtype=None: _reduce("ReduceSum")(t, n, x)
TABLE[aten.amax.default] = _reduce("ReduceMax")
TABLE[aten.amin.default] = _reduce("ReduceMin")
TABLE[aten.prod.dim_int] = _reduce("ReduceProd")
for _ov in ("dim", "dims", "default"):
    if hasattr(aten.any, _ov):
        TABLE[getattr(aten.any, _ov)] = _reduce("ReduceMax", via=DType.int32)
    if hasattr(aten.all, _ov):
        TABLE[getattr(aten.all, _ov)] = _reduce("ReduceMin", via=DType.int32)


@reg(aten.linalg_vector_norm.default)
def _vector_norm(t, n, x, ord=2, dim=None, keepdim=False, dtype=None):
    """The p-norm over `dim`: ReduceL1/ReduceL2 for p = 1, 2, max/min of |x| for +-inf, the
    count of non-zeros for 0, and (sum |x|^p)^(1/p) otherwise."""
    dt = t.out_dtype(n)
    x = t.b.cast(x, dt)
    if t.b.rank(x) == 0:
        x = t.b.op("Unsqueeze", [x, t.b.i64([0])])
        dim, keepdim, scalar = None, False, True
    else:
        scalar = False
    ax = t.b.i64(_axes(t, x, dim))
    keep = int(bool(keepdim))
    p = float(ord)
    if p == 2:
        y = t.b.op("ReduceL2", [x, ax], keepdims=keep)
    elif p == 1:
        y = t.b.op("ReduceL1", [x, ax], keepdims=keep)
    elif math.isinf(p):
        y = t.b.op("ReduceMax" if p > 0 else "ReduceMin", [t.b.op("Abs", [x]), ax], keepdims=keep)
    elif p == 0:
        y = t.b.op("ReduceSum", [t.b.cast(_truth(t, x), dt), ax], keepdims=keep)
    else:
        s = t.b.op("ReduceSum", [t.b.op("Pow", [t.b.op("Abs", [x]), t.tensor(p, dt)]), ax], keepdims=keep)
        y = t.b.op("Pow", [s, t.tensor(1 / p, dt)])
    return y if not scalar or t.b.rank(y) == 0 else t.b.op("Squeeze", [y, t.b.i64([0])])


@reg(aten.var.correction)
def _var(t, n, x, dims=None, correction=None, keepdim=False, **kw):
    return _var_mean(t, n, x, dims, correction=correction, keepdim=keepdim)[0]


@reg(aten.var_mean.correction)
def _var_mean(t, n, x, dims=None, correction=None, keepdim=False, **kw):
    correction = 1 if correction is None else correction
    axes = _axes(t, x, dims)
    shape = t.b.shape(x)
    if not all(isinstance(shape[a], int) for a in axes):
        t.fail(n, "variance over symbolic dims is not supported")
    count = math.prod(shape[a] for a in axes)
    dt = t.b.dtype(x)
    ax = t.b.i64(axes)
    mean = t.b.op("ReduceMean", [x, ax], keepdims=1)
    d = t.b.op("Sub", [x, mean])
    s = t.b.op("ReduceSum", [t.b.op("Mul", [d, d]), ax], keepdims=int(bool(keepdim)))
    var = t.b.op("Div", [s, t.tensor(max(count - correction, 0), dt)])
    return var, (mean if keepdim else t.b.op("Squeeze", [mean, ax]))


def _max_min_dim(reduce, arg):
    def handler(t, n, x, dim, keepdim=False):
        a = _axis(dim, t.b.rank(x))
        y = t.b.op(reduce, [x, t.b.i64([a])], keepdims=int(bool(keepdim)))
        i = t.b.op(arg, [x], axis=a, keepdims=int(bool(keepdim)), select_last_index=0)
        return y, i
    return handler


TABLE[aten.max.dim] = _max_min_dim("ReduceMax", "ArgMax")
TABLE[aten.min.dim] = _max_min_dim("ReduceMin", "ArgMin")


def _arg(op):
    def handler(t, n, x, dim=None, keepdim=False):
        if dim is None:
            x = t.b.op("Reshape", [x, t.b.i64([-1])])
            dim = 0
        return t.b.op(op, [x], axis=_axis(dim, t.b.rank(x)), keepdims=int(bool(keepdim)))
    return handler


TABLE[aten.argmax.default] = _arg("ArgMax")
TABLE[aten.argmin.default] = _arg("ArgMin")


@reg(aten.cumsum.default)
def _cumsum(t, n, x, dim, dtype=None):
    x = t.b.cast(x, t.out_dtype(n))
    return t.b.op("CumSum", [x, t.b.i64(_axis(dim, t.b.rank(x)))])


@reg(aten.topk.default)
def _topk(t, n, x, k, dim=-1, largest=True, sorted=True):
    v, i = t.b.op("TopK", [x, t.int_list([k])], n_out=2, axis=_axis(dim, t.b.rank(x)),
                  largest=int(bool(largest)), sorted=int(bool(sorted)))
    return v, i


# -- shapes and data movement ----------------------------------------------------------------

@reg(aten.view.default, aten._unsafe_view.default)
def _view(t, n, x, size):
    static = [t.static_int(s) for s in size]
    return t.b.op("Reshape", [x, t.int_list(size)], allowzero=int(0 in static))


@reg(aten.permute.default)
def _permute(t, n, x, dims):
    r = t.b.rank(x)
    return t.b.op("Transpose", [x], perm=[_axis(d, r) for d in dims])


@reg(aten.t.default)
def _t(t, n, x):
    return x if t.b.rank(x) < 2 else t.b.op("Transpose", [x], perm=[1, 0])


@reg(aten.transpose.int)
def _transpose(t, n, x, a, b):
    r = t.b.rank(x)
    perm = list(range(r))
    perm[_axis(a, r)], perm[_axis(b, r)] = perm[_axis(b, r)], perm[_axis(a, r)]
    return t.b.op("Transpose", [x], perm=perm)


@reg(aten.expand.default)
def _expand(t, n, x, size, implicit=False):
    size = [1 if (isinstance(s, int) and s == -1) else s for s in size]
    return t.b.op("Expand", [x, t.int_list(size)])


@reg(aten.cat.default)
def _cat(t, n, xs, dim=0):
    dt = t.out_dtype(n)
    xs = [x for x in xs if not (t.b.rank(x) == 1 and t.b.shape(x)[0] == 0)] or xs[:1]
    r = t.b.rank(xs[0])
    return t.b.op("Concat", [t.b.cast(x, dt) for x in xs], axis=_axis(dim, r))


@reg(aten.stack.default)
def _stack(t, n, xs, dim=0):
    r = t.b.rank(xs[0]) + 1
    a = _axis(dim, r)
    return t.b.op("Concat", [t.b.op("Unsqueeze", [x, t.b.i64([a])]) for x in xs], axis=a)


@reg(aten.split_with_sizes.default)
def _split_with_sizes(t, n, x, sizes, dim=0):
    a = _axis(dim, t.b.rank(x))
    if len(sizes) == 1:
        return [x]
    return list(t.b.op("Split", [x, t.int_list(sizes)], n_out=len(sizes), axis=a))


@reg(aten.split.Tensor)
def _split(t, n, x, size, dim=0):
    a = _axis(dim, t.b.rank(x))
    total = t.b.shape(x)[a]
    if not isinstance(total, int):
        t.fail(n, "split of a symbolic dim is not supported")
    sizes = [min(size, total - s) for s in range(0, total, size)] or [0]
    return _split_with_sizes(t, n, x, sizes, a)


@reg(aten.unbind.int)
def _unbind(t, n, x, dim=0):
    a = _axis(dim, t.b.rank(x))
    total = t.b.shape(x)[a]
    if not isinstance(total, int):
        t.fail(n, "unbind of a symbolic dim is not supported")
    parts = _split_with_sizes(t, n, x, [1] * total, a) if total > 1 else [x]
    return [t.b.op("Squeeze", [p, t.b.i64([a])]) for p in parts]


@reg(aten.slice.Tensor)
def _slice(t, n, x, dim=0, start=None, end=None, step=1):
    a = _axis(dim, t.b.rank(x))
    start = 0 if start is None else start
    end = INT64_MAX if end is None else end
    if isinstance(end, int):
        end = min(end, INT64_MAX)
    if isinstance(start, int) and start == 0 and isinstance(end, int) and end >= INT64_MAX and step == 1:
        return x
    return t.b.op("Slice", [x, t.int_list([start]), t.int_list([end]), t.b.i64([a]), t.int_list([step])])


@reg(aten.select.int)
def _select(t, n, x, dim, index):
    a = _axis(dim, t.b.rank(x))
    idx = index.value if isinstance(index, SymInt) else t.b.const(np.asarray(index, dtype=np.int64))
    return t.b.op("Gather", [x, idx], axis=a)


@reg(aten.squeeze.dims, aten.squeeze.dim, aten.squeeze.default)
def _squeeze(t, n, x, dims=None):
    shape = t.b.shape(x)
    r = len(shape)
    axes = _axes(t, x, dims) if dims is not None else list(range(r))
    axes = [a for a in axes if shape[a] == 1]  # torch leaves a dim that is not 1 alone
    return t.b.op("Squeeze", [x, t.b.i64(axes)]) if axes else x


@reg(aten.unsqueeze.default)
def _unsqueeze(t, n, x, dim):
    return t.b.op("Unsqueeze", [x, t.b.i64([_axis(dim, t.b.rank(x) + 1)])])


@reg(aten.flip.default)
def _flip(t, n, x, dims):
    axes = _axes(t, x, dims)
    k = len(axes)
    return t.b.op("Slice", [x, t.b.i64([-1] * k), t.b.i64([-INT64_MAX - 1] * k), t.b.i64(axes),
                            t.b.i64([-1] * k)])


@reg(aten.repeat.default)
def _repeat(t, n, x, repeats):
    extra = len(repeats) - t.b.rank(x)
    if extra > 0:
        x = t.b.op("Unsqueeze", [x, t.b.i64(list(range(extra)))])
    return t.b.op("Tile", [x, t.int_list(repeats)])


@reg(aten.constant_pad_nd.default)
def _pad(t, n, x, pad, value=0):
    r = t.b.rank(x)
    begins, ends = [0] * r, [0] * r
    for i in range(len(pad) // 2):
        begins[r - 1 - i], ends[r - 1 - i] = pad[2 * i], pad[2 * i + 1]
    return t.b.op("Pad", [x, t.int_list(begins + ends), t.tensor(value, t.b.dtype(x))], mode="constant")


@reg(aten.tril.default, aten.triu.default)
def _trilu(t, n, x, diagonal=0):
    return t.b.op("Trilu", [x, t.b.i64(diagonal)],
                  upper=int(n.target is aten.triu.default))


@reg(aten.embedding.default)
def _embedding(t, n, w, idx, *rest):
    return t.b.op("Gather", [w, idx], axis=0)


@reg(aten.index_select.default)
def _index_select(t, n, x, dim, idx):
    return t.b.op("Gather", [x, idx], axis=_axis(dim, t.b.rank(x)))


@reg(aten.gather.default)
def _gather(t, n, x, dim, idx, sparse_grad=False):
    return t.b.op("GatherElements", [x, idx], axis=_axis(dim, t.b.rank(x)))


@reg(aten.index.Tensor)
def _index(t, n, x, indices):
    """x[..., i, j, ...] with index tensors: one index is a Gather; several adjacent ones from
    the first dim on are broadcast together and read with GatherND."""
    pos = [k for k, i in enumerate(indices) if i is not None]
    if len(pos) == 1 and t.b.dtype(indices[pos[0]]) == DType.bool:
        return _mask_index(t, x, indices[pos[0]], pos[0])
    idx = [_as_index(t, indices[k]) for k in pos]
    if len(pos) == 1:
        return t.b.op("Gather", [x, idx[0]], axis=pos[0])
    if pos != list(range(len(pos))):
        t.fail(n, "advanced indexing with index tensors that do not start at dim 0 and sit side by "
                  "side is not supported")
    shape = idx[0]
    for i in idx[1:]:
        shape = t.b.op("Add", [shape, i])  # broadcasts every index to one shape
    zero = t.b.op("Mul", [shape, t.tensor(0, DType.int64)])
    cols = [t.b.op("Unsqueeze", [t.b.op("Add", [i, zero]), t.b.i64([-1])]) for i in idx]
    sizes = [t.b.shape(x)[k] for k in range(len(pos))]
    cols = [_wrap_negative(t, c, s) for c, s in zip(cols, sizes)]
    return t.b.op("GatherND", [x, t.b.op("Concat", cols, axis=-1)])


def _mask_index(t, x: Value, mask: Value, k: int) -> Value:
    """x[..., mask] (a bool mask over dims k .. k+r-1): those dims flattened into one, and the
    entries where the mask is true kept (Compress; the result's size is a run-time symbol)."""
    r = t.b.rank(mask)
    if r != 1:
        shape = t.b.op("Shape", [x])
        parts = [t.b.i64([-1])]
        if k:
            parts.insert(0, t.b.op("Slice", [shape, t.b.i64([0]), t.b.i64([k])]))
        if k + r < t.b.rank(x):
            parts.append(t.b.op("Slice", [shape, t.b.i64([k + r]), t.b.i64([INT64_MAX])]))
        x = t.b.op("Reshape", [x, t.b.op("Concat", parts, axis=0) if len(parts) > 1 else parts[0]])
        mask = t.b.op("Reshape", [mask, t.b.i64([-1])])
    return t.b.op("Compress", [x, mask], axis=k)


def _as_index(t, i: Value) -> Value:
    if t.b.dtype(i) == DType.bool:
        from kiln.errors import KilnError
        raise KilnError("a boolean mask next to other index tensors is not supported (index with "
                        "the mask alone, or with mask.nonzero())", stage="torch import")
    return t.b.cast(i, DType.int64)


def _wrap_negative(t, i: Value, size) -> Value:
    if not isinstance(size, int):
        return i
    neg = t.b.op("Less", [i, t.tensor(0, DType.int64)])
    return t.b.op("Where", [neg, t.b.op("Add", [i, t.tensor(size, DType.int64)]), i])


# -- tensor factories ------------------------------------------------------------------------

@reg(aten.full.default)
def _full(t, n, size, value, **kw):
    dt = t.out_dtype(n)
    static = [t.static_int(s) for s in size]
    if all(s is not None for s in static):
        return t.b.const(np.full(static, value, dtype=dt.np))
    return t.b.op("Expand", [t.tensor(value, dt), t.int_list(size)])


@reg(aten.full_like.default)
def _full_like(t, n, x, value, **kw):
    dt = t.out_dtype(n)
    shape = t.b.shape(x)
    if all(isinstance(s, int) for s in shape):
        return t.b.const(np.full(shape, value, dtype=dt.np))
    return t.b.op("Expand", [t.tensor(value, dt), t.b.op("Shape", [x])])


@reg(aten.scalar_tensor.default)
def _scalar_tensor(t, n, value, **kw):
    return t.b.const(np.asarray(value, dtype=t.out_dtype(n).np))


@reg(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(t, n, *args, **kw):
    nums = [a for a in args if not isinstance(a, (torch.dtype, torch.layout, torch.device))]
    if n.target is aten.arange.default:
        start, end, step = 0, nums[0], 1
    elif n.target is aten.arange.start:
        start, end, step = nums[0], nums[1], 1
    else:
        start, end = nums[0], nums[1]
        step = nums[2] if len(nums) > 2 else kw.get("step", 1)
    dt = t.out_dtype(n)
    vals = [t.static_int(v) if isinstance(v, SymInt) else v for v in (start, end, step)]
    if all(isinstance(v, (int, float)) for v in vals):
        return t.b.const(np.arange(*vals).astype(dt.np))
    return t.b.op("Range", [_scalar(t, start, dt), _scalar(t, end, dt), _scalar(t, step, dt)])


def _scalar(t, v, dt):
    return t.tensor(v, dt)


# -- symbolic sizes (Dynamo and torch.export graphs read sizes of dynamic dims) ------------

@reg(aten.sym_size.int)
def _sym_size(t, n, x, dim):
    a = _axis(dim, t.b.rank(x))
    d = t.b.shape(x)[a]
    if isinstance(d, int):
        return d
    s = t.b.op("Shape", [x], start=a, end=a + 1)
    return SymInt(t.b.op("Squeeze", [s, t.b.i64([0])]))


_SYM = {operator.add: ("Add", operator.add), operator.sub: ("Sub", operator.sub),
        operator.mul: ("Mul", operator.mul), operator.floordiv: ("Div", operator.floordiv),
        operator.mod: ("Mod", operator.mod)}


def _sym_binary(op, py):
    def handler(t, n, a, b):
        sa, sb = t.static_int(a), t.static_int(b)
        if sa is not None and sb is not None:
            return py(sa, sb)
        return SymInt(t.b.op(op, [t.tensor(a, DType.int64), t.tensor(b, DType.int64)]))
    return handler


for _pyop, (_op, _py) in _SYM.items():
    TABLE[_pyop] = _sym_binary(_op, _py)

# comparisons of sizes: the range checks torch.export adds for data-dependent sizes (their
# _assert_scalar is dropped), or a python bool where both sides are known
for _pyop, _op in [(operator.ge, "GreaterOrEqual"), (operator.gt, "Greater"), (operator.le, "LessOrEqual"),
                   (operator.lt, "Less"), (operator.eq, "Equal")]:
    TABLE[_pyop] = _sym_binary(_op, _pyop)


@reg(operator.neg)
def _sym_neg(t, n, a):
    s = t.static_int(a)
    return -s if s is not None else SymInt(t.b.op("Neg", [a.value]))


# -- ops a Dynamo graph holds where a module's export would not ---------------------------

@reg(aten._transformer_encoder_layer_fwd.default)
def _encoder_layer_fwd(t, n, src, embed_dim, heads, qkv_w, qkv_b, proj_w, proj_b, use_gelu, norm_first, eps,
                       n1_w, n1_b, n2_w, n2_b, ff1_w, ff1_b, ff2_w, ff2_b, mask=None, mask_type=None):
    """nn.TransformerEncoderLayer's inference fast path (batch first), written out in kiln ops."""
    if mask is not None:
        t.fail(n, "the encoder layer's fused fast path with a mask is not supported; call it without "
                  "a mask or with torch.backends.mha.set_fastpath_enabled(False)")
    b = t.b
    dt = b.dtype(src)
    hd = embed_dim // heads

    def linear(x, w, bias):
        return b.op("Add", [b.op("MatMul", [x, b.op("Transpose", [w], perm=[1, 0])]), bias])

    def norm(x, w, bias):
        return b.op("LayerNormalization", [x, w, bias], axis=-1, epsilon=float(eps))

    def heads_of(x):  # (B, T, E) -> (B, H, T, hd)
        return b.op("Transpose", [b.op("Reshape", [x, b.i64([0, 0, heads, hd])])], perm=[0, 2, 1, 3])

    def attention(x):
        q, k, v = b.op("Split", [linear(x, qkv_w, qkv_b), b.i64([embed_dim] * 3)], n_out=3, axis=-1)
        q, k, v = heads_of(q), heads_of(k), heads_of(v)
        s = b.op("Mul", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                         t.tensor(1 / math.sqrt(hd), dt)])
        y = b.op("MatMul", [b.op("Softmax", [s], axis=-1), v])
        y = b.op("Reshape", [b.op("Transpose", [y], perm=[0, 2, 1, 3]), b.i64([0, 0, embed_dim])])
        return linear(y, proj_w, proj_b)

    def feed_forward(x):
        h = linear(x, ff1_w, ff1_b)
        h = b.op("Gelu", [h]) if use_gelu else b.op("Relu", [h])
        return linear(h, ff2_w, ff2_b)

    x = src
    if norm_first:
        x = b.op("Add", [x, attention(norm(x, n1_w, n1_b))])
        return b.op("Add", [x, feed_forward(norm(x, n2_w, n2_b))])
    x = norm(b.op("Add", [x, attention(x)]), n1_w, n1_b)
    return norm(b.op("Add", [x, feed_forward(x)]), n2_w, n2_b)
