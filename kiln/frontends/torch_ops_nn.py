"""ATen handlers of the network layers: convolution, batch/layer/group norm, softmax, pooling,
upsampling, reductions, variance, arg max/min, cumsum and topk.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.dtypes import DType
from kiln.frontends.torch_ops_common import TABLE, _axis, aten, reg
from kiln.frontends.torch_ops_math import _truth


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
