"""Convolution, pooling and normalization operators (ONNX opsets 1 … latest).

Every sliding-window op shares one geometry helper (`window`: strides,
dilations, pads, auto_pad, ceil_mode → pads and output sizes) and one strided
window view (`windows`), so Conv, ConvTranspose, the pools and Col2Im agree on
output-size arithmetic. Convolutions are im2col + batched matmul, never
per-pixel Python loops, because whole CNNs run through these references.
Half-precision inputs are computed in float32 and cast back.

Each op also has a native lowering (after the references, below): compute
definitions and a schedule for the cpu target.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.registry import op, same_as
from kiln.ops.shapes import expect_shape, normalize_axis

# ---------------------------------------------------------------- helpers


def attr_str(ctx, name: str, default: str) -> str:
    """String attribute, whether the frontend kept it as bytes or str."""
    v = ctx.attr(name, default)
    return v.decode() if isinstance(v, bytes) else str(v)


_HALF = (np.dtype(np.float16), DType.bfloat16.np)


def compute_dtype(x: np.ndarray) -> np.ndarray:
    """Half precision is computed in float32 (ONNX runtimes accumulate wider)."""
    return x.astype(np.float32) if x.dtype in _HALF else x


def chan(p: np.ndarray, rank: int) -> np.ndarray:
    """Per-channel parameter (C,) as (1, C, 1, …); a full (C, D1, …) one as (1, C, D1, …)."""
    p = np.asarray(p)
    return p.reshape((1, -1) + (1,) * (rank - 2)) if p.ndim <= 1 else p[None]


@dataclass
class Window:
    """Resolved sliding-window geometry for the spatial dims of one node."""
    kernel: list
    strides: list[int]
    dilations: list[int]
    begin: list        # pads before each spatial dim (int or None when symbolic)
    end: list          # pads after, including ceil_mode overhang
    out: list          # output spatial dims (int or symbol)
    extra: list        # ceil_mode overhang beyond the explicit end pad


def _int_list(ctx, name, n, default):
    v = ctx.attr(name, None)
    if v is None:
        return [default] * n
    v = [int(a) for a in v]
    if len(v) != n:
        ctx.fail(f"attribute {name!r} has {len(v)} entries, expected {n} (one per spatial dim)")
    return v


def window(ctx, spatial, kernel, *, ceil_mode=False) -> Window:
    """Strides, dilations, pads (explicit or auto_pad) and output size of a sliding window.

    `spatial` and `kernel` may hold symbols at inference time; output dims
    that depend on them become fresh symbols.
    """
    n = len(kernel)
    if len(spatial) != n:
        ctx.fail(f"input has {len(spatial)} spatial dims but the kernel has {n}")
    strides = _int_list(ctx, "strides", n, 1)
    dil = _int_list(ctx, "dilations", n, 1)
    pads = ctx.attr("pads", None)
    pads = [0] * (2 * n) if pads is None else [int(p) for p in pads]
    if len(pads) != 2 * n:
        ctx.fail(f"attribute 'pads' has {len(pads)} entries, expected {2 * n}")
    if any(s < 1 for s in strides) or any(d < 1 for d in dil):
        ctx.fail(f"strides {strides} and dilations {dil} must be positive")
    auto = attr_str(ctx, "auto_pad", "NOTSET")
    begin, end, out, extra = list(pads[:n]), list(pads[n:]), [], []
    for i, (size, k, s, d) in enumerate(zip(spatial, kernel, strides, dil)):
        if isinstance(size, str) or isinstance(k, str):
            out.append(ctx.new_dim())
            extra.append(0)
            if auto.startswith("SAME"):
                begin[i] = end[i] = None
            continue
        eff = (k - 1) * d + 1
        if auto == "VALID":
            begin[i] = end[i] = 0
        elif auto in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-size // s)
            total = max(0, (o - 1) * s + eff - size)
            small = total // 2
            begin[i], end[i] = (small, total - small) if auto == "SAME_UPPER" else (total - small, small)
        elif auto != "NOTSET":
            ctx.fail(f"auto_pad {auto!r} is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID")
        span = size + begin[i] + end[i] - eff
        if span < 0:
            ctx.fail(f"kernel extent {eff} (kernel {k}, dilation {d}) exceeds padded input {size + begin[i] + end[i]}")
        o = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (o - 1) * s >= size + begin[i]:
            o -= 1          # the last window must start inside the input or left pad
        out.append(o)
        extra.append(max(0, (o - 1) * s + eff - (size + begin[i] + end[i])))
    return Window(list(kernel), strides, dil, begin, end, out, extra)


def pad_spatial(x: np.ndarray, w: Window, value) -> np.ndarray:
    """Pad the trailing spatial dims by the window's pads (+ ceil overhang) with `value`."""
    n = len(w.kernel)
    widths = [(0, 0)] * (x.ndim - n) + [(b, e + x_) for b, e, x_ in zip(w.begin, w.end, w.extra)]
    if not any(b or e for b, e in widths):
        return x
    # negative pads crop
    sl = tuple(slice(max(0, -b), x.shape[i] - max(0, -e) if e < 0 else None) for i, (b, e) in enumerate(widths))
    x = x[sl]
    return np.pad(x, [(max(0, b), max(0, e)) for b, e in widths], constant_values=value)


def windows(xp: np.ndarray, w: Window) -> np.ndarray:
    """Strided view (…, *out, *kernel) of a padded array's trailing spatial dims."""
    n = len(w.kernel)
    axes = tuple(range(xp.ndim - n, xp.ndim))
    eff = [(k - 1) * d + 1 for k, d in zip(w.kernel, w.dilations)]
    v = np.lib.stride_tricks.sliding_window_view(xp, eff, axis=axes)
    lead = (slice(None),) * (xp.ndim - n)
    v = v[lead + tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(w.out, w.strides))
          + tuple(slice(None, None, d) for d in w.dilations)]
    return v


def scatter_windows(cols: np.ndarray, full: list[int], strides, dilations) -> np.ndarray:
    """Inverse of `windows`: sum (N, C, *kernel, *in) window values into (N, C, *full).

    Loops over kernel offsets only (a handful), each a strided slice add.
    """
    n = len(full)
    kernel = cols.shape[2:2 + n]
    ins = cols.shape[2 + n:]
    out = np.zeros(cols.shape[:2] + tuple(full), dtype=cols.dtype)
    for k in np.ndindex(*kernel):
        sl = tuple(slice(ki * d, ki * d + s * (i - 1) + 1, s)
                   for ki, d, s, i in zip(k, dilations, strides, ins))
        out[(slice(None), slice(None)) + sl] += cols[(slice(None), slice(None)) + k]
    return out


def kernel_of(ctx, wshape, n):
    """kernel_shape attribute, else the weight's trailing dims (symbols if unknown)."""
    ks = ctx.attr("kernel_shape", None)
    if ks is not None:
        ks = [int(k) for k in ks]
        if wshape is not None and any(isinstance(w, int) and w != k for w, k in zip(wshape[2:], ks)):
            ctx.fail(f"kernel_shape {ks} does not match weight spatial dims {tuple(wshape[2:])}")
        return ks
    if wshape is None:
        return [ctx.new_dim() for _ in range(n)]
    return list(wshape[2:])


def _rank_check(ctx, shape, least=3):
    if shape is not None and len(shape) < least:
        ctx.fail(f"input of rank {len(shape)} given, expected rank >= {least} (N, C, spatial...)")


# ---------------------------------------------------------------- convolution


def conv_core(ctx, x, w, group, win: Window):
    """Grouped N-D convolution by im2col + batched matmul (no bias).

    x: (N, C, *S) already in the compute dtype; w: (M, C/group, *K).
    """
    n, c = x.shape[:2]
    m, nd = w.shape[0], x.ndim - 2
    if c != w.shape[1] * group or m % group:
        ctx.fail(f"weight shape {w.shape} does not fit input channels {c} with group {group}: "
                 f"expected weight dim 1 = {c // max(group, 1)} and output channels divisible by group")
    cols = windows(pad_spatial(x, win, 0), win)                      # N, C, *O, *K
    outs = cols.shape[2:2 + nd]
    cols = cols.reshape((n, group, c // group) + cols.shape[2:])
    # explicit sizes, not -1: an empty batch (n = 0) leaves -1 undetermined
    cols = np.moveaxis(cols, 2, 2 + nd).reshape(n, group, math.prod(outs), c // group * math.prod(w.shape[2:]))
    wm = w.reshape(group, m // group, -1).transpose(0, 2, 1)          # g, C/g*K, M/g
    y = np.matmul(cols, wm[None])                                      # N, g, P, M/g
    return y.transpose(0, 1, 3, 2).reshape((n, m) + tuple(outs))


def _conv_infer(out_dtype=None, xi=0, wi=1, bi=2, per_channel=()):
    """Conv-family inference; the bias (input `bi`) must have one value per output channel,
    and each input in `per_channel` (index, name) one per output channel or one in all."""
    def infer(ctx):
        res = _conv_infer_shape(ctx)
        ws = ctx.shape(wi)
        m = ws[0] if ws else None
        if m is not None:
            if bi is not None:
                expect_shape(ctx, bi, (m,), "bias: one value per output channel")
            for i, name in per_channel:
                expect_shape(ctx, i, (m,), name, scalar_ok=True)
        return res

    def _conv_infer_shape(ctx):
        xs, ws = ctx.shape(xi), ctx.shape(wi)
        dt = out_dtype(ctx) if out_dtype else ctx.dtype(xi)
        _rank_check(ctx, xs)
        if xs is None:
            return [TensorType(dt, None)]
        nd = len(xs) - 2
        if ws is not None and len(ws) != len(xs):
            ctx.fail(f"weight rank {len(ws)} does not match input rank {len(xs)}")
        group = int(ctx.attr("group", 1))
        if ws is not None and isinstance(xs[1], int) and isinstance(ws[1], int) and xs[1] != ws[1] * group:
            ctx.fail(f"input has {xs[1]} channels but weight {tuple(ws)} with group {group} expects {ws[1] * group}")
        win = window(ctx, xs[2:], kernel_of(ctx, ws, nd))
        m = ws[0] if ws is not None else ctx.new_dim()
        return [TensorType(dt, (xs[0], m, *win.out))]
    return infer


def _window_for(ctx, x, w_spatial, ceil_mode=False):
    return window(ctx, list(x.shape[2:]), list(ctx.attr("kernel_shape", w_spatial)), ceil_mode=ceil_mode)


@op("Conv", infer=_conv_infer())
def conv(ctx, x, w, b=None):
    """Conv: float convolution with groups, dilations, strides, pads/auto_pad."""
    # accumulate in float64: the golden model's sums must not depend on where BLAS puts a
    # channel in its register tile (ill-conditioned nets amplify a 1-ulp difference)
    xc, wc = x.astype(np.float64), w.astype(np.float64)
    y = conv_core(ctx, xc, wc, int(ctx.attr("group", 1)), _window_for(ctx, x, w.shape[2:]))
    if b is not None:
        y = y + chan(np.asarray(b, dtype=np.float64), y.ndim)
    return y.astype(x.dtype, copy=False)


def _zp(z, dtype=np.float64):
    return np.zeros((), dtype) if z is None else np.asarray(z).astype(dtype)


def _int_conv(ctx, x, xzp, w, wzp):
    """Integer convolution of zero-point-shifted operands; exact in float64 (BLAS) then int."""
    xs = x.astype(np.float64) - _zp(xzp)
    wz = _zp(wzp)
    ws = w.astype(np.float64) - (wz.reshape((-1,) + (1,) * (w.ndim - 1)) if wz.ndim == 1 else wz)
    return conv_core(ctx, xs, ws, int(ctx.attr("group", 1)), _window_for(ctx, x, w.shape[2:]))


@op("ConvInteger", infer=_conv_infer(lambda ctx: DType.int32, bi=None, per_channel=((3, "w_zero_point"),)))
def conv_integer(ctx, x, w, xzp=None, wzp=None):
    return np.rint(_int_conv(ctx, x, xzp, w, wzp)).astype(np.int32)


def _qlinear_dtype(ctx):
    return ctx.dtype(7) if ctx.has_input(7) else ctx.dtype(0)


@op("QLinearConv", infer=_conv_infer(_qlinear_dtype, xi=0, wi=3, bi=8,
                                      per_channel=((4, "w_scale"), (5, "w_zero_point"))))
def qlinear_conv(ctx, x, xs, xzp, w, ws, wzp, ys, yzp=None, b=None):
    acc = _int_conv(ctx, x, xzp, w, wzp)
    if b is not None:
        acc = acc + chan(b.astype(np.float64), acc.ndim)
    scale = np.asarray(xs, np.float64) * np.asarray(ws, np.float64) / np.asarray(ys, np.float64)
    y = np.rint(acc * chan(scale, acc.ndim)) + _zp(yzp)
    dt = np.dtype(np.uint8) if yzp is None else yzp.dtype
    info = np.iinfo(dt)
    return np.clip(y, info.min, info.max).astype(dt)


def _conv_transpose_infer(ctx):
    xs, ws = ctx.shape(0), ctx.shape(1)
    _rank_check(ctx, xs)
    if xs is None:
        return [TensorType(ctx.dtype(0), None)]
    group = int(ctx.attr("group", 1))
    if ws is not None and len(ws) != len(xs):
        ctx.fail(f"weight rank {len(ws)} does not match input rank {len(xs)}")
    if ws is not None and isinstance(xs[1], int) and isinstance(ws[0], int) and xs[1] != ws[0]:
        ctx.fail(f"input has {xs[1]} channels but weight {tuple(ws)} expects {ws[0]} (its dim 0)")
    m = ws[1] * group if ws is not None and isinstance(ws[1], int) else ctx.new_dim()
    expect_shape(ctx, 2, (m,), "bias: one value per output channel")
    kern = kernel_of(ctx, ws, len(xs) - 2)
    if any(isinstance(d, str) for d in list(xs[2:]) + kern):
        return [TensorType(ctx.dtype(0), (xs[0], m, *ctx.unknown_shape(len(xs) - 2)))]
    return [TensorType(ctx.dtype(0), (xs[0], m, *_transpose_geometry(ctx, list(xs[2:]), kern)[2]))]


def _transpose_geometry(ctx, ins, kernel):
    """ConvTranspose pads (begin, end) and output size from pads / output_shape / auto_pad."""
    n = len(ins)
    s = _int_list(ctx, "strides", n, 1)
    d = _int_list(ctx, "dilations", n, 1)
    op_ = _int_list(ctx, "output_padding", n, 0)
    full = [si * (i - 1) + opi + (k - 1) * di + 1 for si, i, opi, k, di in zip(s, ins, op_, kernel, d)]
    auto = attr_str(ctx, "auto_pad", "NOTSET")
    oshape = ctx.attr("output_shape", None)
    if oshape is not None:
        target = [int(v) for v in oshape][-n:]
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        target = [i * si for i, si in zip(ins, s)]
    else:
        pads = ctx.attr("pads", None)
        pads = [0] * (2 * n) if pads is None or auto == "VALID" else [int(p) for p in pads]
        if len(pads) != 2 * n:
            ctx.fail(f"attribute 'pads' has {len(pads)} entries, expected {2 * n}")
        out = [f - b - e for f, b, e in zip(full, pads[:n], pads[n:])]
        if any(o < 1 for o in out):
            ctx.fail(f"output size {out} is not positive (pads {pads} too large)")
        return pads[:n], pads[n:], out
    total = [f - t for f, t in zip(full, target)]
    # a negative total grows the output at the end, zero-filled (as ONNX Runtime does)
    begin = [0 if t < 0 else t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
    return begin, [t - b for t, b in zip(total, begin)], target


@op("ConvTranspose", infer=_conv_transpose_infer)
def conv_transpose(ctx, x, w, b=None):
    """ConvTranspose as matmul to per-window columns, then a strided scatter-add (col2im)."""
    xc = compute_dtype(x)
    wc = compute_dtype(w).astype(xc.dtype, copy=False)
    group = int(ctx.attr("group", 1))
    n, c, nd = x.shape[0], x.shape[1], x.ndim - 2
    if w.shape[0] != c or c % group:
        ctx.fail(f"weight shape {w.shape} expects {w.shape[0]} input channels, input has {c} (group {group})")
    kern = list(ctx.attr("kernel_shape", w.shape[2:]))
    m = w.shape[1] * group
    ins = x.shape[2:]
    xm = xc.reshape(n, group, c // group, math.prod(ins))
    wm = wc.reshape(group, c // group, -1).transpose(0, 2, 1)           # g, M/g*K, C/g
    cols = np.matmul(wm[None], xm).reshape((n, m) + tuple(kern) + tuple(ins))
    s = _int_list(ctx, "strides", nd, 1)
    d = _int_list(ctx, "dilations", nd, 1)
    full = [si * (i - 1) + (k - 1) * di + 1 for si, i, k, di in zip(s, ins, kern, d)]
    y = scatter_windows(cols, full, s, d)
    begin, _, out = _transpose_geometry(ctx, list(ins), kern)
    y = crop(y, begin, out)
    if b is not None:
        y = y + chan(compute_dtype(b), y.ndim)
    return y.astype(x.dtype, copy=False)


def crop(y, begin, size):
    """Take `size` elements from `begin` in each trailing dim, zero-filling outside the array."""
    n = len(size)
    lead = y.ndim - n
    widths = [(0, 0)] * lead + [(max(0, -b), max(0, b + s - y.shape[lead + i]))
                                for i, (b, s) in enumerate(zip(begin, size))]
    y = np.pad(y, widths)
    return y[(slice(None),) * lead + tuple(slice(b + w[0], b + w[0] + s)
                                         for b, s, w in zip(begin, size, widths[lead:]))]


def _bilinear_zero(img, yy, xx):
    """Bilinear samples of img (N, G, Cg, H, W) at (N, G, P) points, zero outside the image."""
    n, g, cg, h, w = img.shape
    flat = img.reshape(n, g, cg, h * w)
    y0, x0 = np.floor(yy), np.floor(xx)
    out = 0
    for dy in (0, 1):
        for dx in (0, 1):
            yi, xi = y0 + dy, x0 + dx
            wt = (1 - np.abs(yy - yi)) * (1 - np.abs(xx - xi))
            ok = (yi >= 0) & (yi < h) & (xi >= 0) & (xi < w)
            idx = (np.clip(yi, 0, h - 1) * w + np.clip(xi, 0, w - 1)).astype(np.intp)
            v = np.take_along_axis(flat, idx[:, :, None, :], axis=3)
            out = out + v * (wt * ok)[:, :, None, :]
    return out


@op("DeformConv", infer=_conv_infer(bi=3))
def deform_conv(ctx, x, w, offset, b=None, mask=None):
    """2-D deformable convolution: bilinear samples at offset kernel taps, then a grouped matmul."""
    if x.ndim != 4:
        ctx.fail(f"only 2-D DeformConv is supported, input has rank {x.ndim}")
    xc = compute_dtype(x)
    n, c, h, wd = x.shape
    m = w.shape[0]
    group, og = int(ctx.attr("group", 1)), int(ctx.attr("offset_group", 1))
    win = _window_for(ctx, x, w.shape[2:])
    kh, kw = win.kernel
    oh, ow = win.out
    kk, p = kh * kw, oh * ow
    if offset.shape != (n, og * kk * 2, oh, ow):
        ctx.fail(f"offset shape {offset.shape} given, expected {(n, og * kk * 2, oh, ow)}")
    if c % og or c != w.shape[1] * group:
        ctx.fail(f"channels {c} do not fit weight {w.shape}, group {group}, offset_group {og}")
    ki, kj = np.meshgrid(np.arange(kh), np.arange(kw), indexing="ij")
    ki, kj = ki.ravel()[:, None, None], kj.ravel()[:, None, None]
    base_y = (np.arange(oh) * win.strides[0] - win.begin[0])[None, :, None] + ki * win.dilations[0]
    base_x = (np.arange(ow) * win.strides[1] - win.begin[1])[None, None, :] + kj * win.dilations[1]
    off = offset.astype(np.float64).reshape(n, og, kk, 2, oh, ow)
    yy = (base_y + off[:, :, :, 0]).reshape(n, og, kk * p)
    xx = (base_x + off[:, :, :, 1]).reshape(n, og, kk * p)
    cols = _bilinear_zero(xc.reshape(n, og, c // og, h, wd), yy, xx)      # N, og, C/og, K*P
    if mask is not None:
        cols = cols * mask.reshape(n, og, 1, kk * p)
    cols = cols.reshape(n, group, (c // group) * kk, p).transpose(0, 1, 3, 2)
    wm = compute_dtype(w).reshape(group, m // group, -1).transpose(0, 2, 1)
    y = np.matmul(cols, wm[None]).transpose(0, 1, 3, 2).reshape(n, m, oh, ow)
    if b is not None:
        y = y + chan(b, 4)
    return y.astype(x.dtype)


def _causal_infer(ctx):
    xs, ws = ctx.shape(0), ctx.shape(1)
    if xs is not None and len(xs) != 3:
        ctx.fail(f"input must be rank 3 (batch, channels, length), got rank {len(xs)}")
    if ws is not None and len(ws) != 3:
        ctx.fail(f"weight must be rank 3 (channels, 1, k), got rank {len(ws)}")
    k = ws[2] if ws is not None and isinstance(ws[2], int) else None
    b, c = (xs[0], xs[1]) if xs is not None else (ctx.new_dim(), ctx.new_dim())
    t = ctx.dtype(0)
    state = (b, c, k - 1 if k is not None else ctx.new_dim())
    return [TensorType(t, xs), TensorType(t, state)]


@op("CausalConvWithState", infer=_causal_infer)
def causal_conv_with_state(ctx, x, w, b=None, past=None):
    """Depthwise causal conv over [past_state | input]; the last k-1 steps become the state."""
    act = attr_str(ctx, "activation", "none")
    if act not in ("none", "silu", "swish"):
        ctx.fail(f"activation {act!r} is not one of 'none', 'silu', 'swish'")
    bsz, c, length = x.shape
    k = w.shape[2]
    if w.shape[:2] != (c, 1):
        ctx.fail(f"weight shape {w.shape} given, expected ({c}, 1, k)")
    if past is None:
        past = np.zeros((bsz, c, k - 1), x.dtype)
    elif past.shape != (bsz, c, k - 1):
        ctx.fail(f"past_state shape {past.shape} given, expected {(bsz, c, k - 1)}")
    padded = np.concatenate([past, x], axis=2)
    xc = compute_dtype(padded)
    win = np.lib.stride_tricks.sliding_window_view(xc, k, axis=2)       # B, C, L, k
    y = np.einsum("bclk,ck->bcl", win, compute_dtype(w)[:, 0].astype(xc.dtype))
    if b is not None:
        y = y + compute_dtype(b)[:, None]
    if act != "none":
        y = y / (1 + np.exp(-y))
    return y.astype(x.dtype), padded[:, :, length:].copy()


# ---------------------------------------------------------------- pooling


def _pool_infer(extra_int64=False):
    def infer(ctx):
        xs = ctx.shape(0)
        _rank_check(ctx, xs)
        t = ctx.dtype(0)
        if xs is None:
            shape = None
        else:
            kern = ctx.attr("kernel_shape", None)
            if kern is None:
                ctx.fail("missing required attribute 'kernel_shape'")
            win = window(ctx, list(xs[2:]), [int(k) for k in kern], ceil_mode=bool(ctx.attr("ceil_mode", 0)))
            shape = (xs[0], xs[1], *win.out)
        return [TensorType(t, shape), TensorType(DType.int64, shape)] if extra_int64 else [TensorType(t, shape)]
    return infer


def _pool_window(ctx, x):
    return window(ctx, list(x.shape[2:]), [int(k) for k in ctx.attr("kernel_shape")],
                  ceil_mode=bool(ctx.attr("ceil_mode", 0)))


def _sum_windows(x, win, nd):
    return windows(pad_spatial(x, win, 0), win).sum(axis=tuple(range(-nd, 0)))


@op("AveragePool", infer=_pool_infer())
def average_pool(ctx, x):
    """Mean over each window; the divisor counts real elements, or pads too with count_include_pad."""
    win = _pool_window(ctx, x)
    nd = x.ndim - 2
    xc = compute_dtype(x)
    total = _sum_windows(xc, win, nd)
    inside = np.ones(x.shape[2:], xc.dtype)
    if ctx.attr("count_include_pad", 0):
        # the explicit pads count, the ceil_mode overhang does not
        inside = np.pad(inside, [(b, e) for b, e in zip(win.begin, win.end)], constant_values=1)
        grown = Window(win.kernel, win.strides, win.dilations, [0] * nd, [0] * nd, win.out, win.extra)
        count = _sum_windows(inside, grown, nd)
    else:
        count = _sum_windows(inside, win, nd)
    return (total / count).astype(x.dtype)


def _lowest(dt):
    return -np.inf if dt.kind == "f" else np.iinfo(dt).min


@op("MaxPool", infer=_pool_infer(extra_int64=True))
def max_pool(ctx, x):
    """Max over each window; Indices are flat offsets into X (row- or column-major spatial)."""
    win = _pool_window(ctx, x)
    nd = x.ndim - 2
    xc = compute_dtype(x)
    v = windows(pad_spatial(xc, win, _lowest(xc.dtype)), win)
    flat = v.reshape(v.shape[:2 + nd] + (math.prod(v.shape[2 + nd:]),))   # not -1: N may be 0
    y = flat.max(axis=-1).astype(x.dtype)
    if not ctx.output_used(1):
        return y, np.zeros(y.shape, np.int64)
    arg = flat.argmax(axis=-1)
    kidx = np.unravel_index(arg, win.kernel)
    pos = [np.arange(o).reshape((-1,) + (1,) * (nd - 1 - i)) * s - b + ki * d
           for i, (o, s, b, ki, d) in enumerate(zip(win.out, win.strides, win.begin, kidx, win.dilations))]
    dims = list(x.shape[2:])
    if int(ctx.attr("storage_order", 0)):
        pos, dims = pos[::-1], dims[::-1]
    idx = np.zeros(y.shape, np.int64)
    for p_, dim in zip(pos, dims):
        idx = idx * dim + p_
    nc = np.arange(x.shape[0] * x.shape[1]).reshape(x.shape[:2] + (1,) * nd)
    return y, idx + nc * math.prod(dims)


def _lp_p(ctx):
    return float(ctx.attr("p", 2))


@op("LpPool", infer=_pool_infer())
def lp_pool(ctx, x):
    p = _lp_p(ctx)
    xc = compute_dtype(x)
    s = _sum_windows(np.abs(xc) ** p, _pool_window(ctx, x), x.ndim - 2)
    return (s ** (1.0 / p)).astype(x.dtype)


def _global_infer(ctx):
    xs = ctx.shape(0)
    _rank_check(ctx, xs)
    return [TensorType(ctx.dtype(0), None if xs is None else (*xs[:2], *[1] * (len(xs) - 2)))]


def _global(fn):
    def run(ctx, x):
        return np.asarray(fn(ctx, compute_dtype(x), tuple(range(2, x.ndim)))).astype(x.dtype)
    return run


op("GlobalAveragePool", infer=_global_infer)(_global(lambda ctx, x, ax: x.mean(axis=ax, keepdims=True)))
op("GlobalMaxPool", infer=_global_infer)(_global(lambda ctx, x, ax: x.max(axis=ax, keepdims=True)))
op("GlobalLpPool", infer=_global_infer)(
    _global(lambda ctx, x, ax: (np.abs(x) ** _lp_p(ctx)).sum(axis=ax, keepdims=True) ** (1 / _lp_p(ctx))))


def _unpool_shape(ctx, xs):
    """Default MaxUnpool output: the input size MaxPool would have reduced to xs."""
    if xs is None:
        return None
    kern = [int(k) for k in ctx.attr("kernel_shape")]
    nd = len(kern)
    s = _int_list(ctx, "strides", nd, 1)
    pads = ctx.attr("pads", None)
    pads = [0] * (2 * nd) if pads is None else [int(p) for p in pads]
    sp = [ctx.new_dim() if isinstance(i, str) else (i - 1) * si + k - pads[j] - pads[j + nd]
          for j, (i, si, k) in enumerate(zip(xs[2:], s, kern))]
    return (*xs[:2], *sp)


def _max_unpool_infer(ctx):
    if not ctx.has_input(2):
        shape = _unpool_shape(ctx, ctx.shape(0))
    elif ctx.value(2) is not None:
        shape = tuple(int(v) for v in ctx.value(2))
    else:
        s2 = ctx.shape(2)
        shape = ctx.unknown_shape(s2[0] if s2 and isinstance(s2[0], int) else None)
    return [TensorType(ctx.dtype(0), shape)]


@op("MaxUnpool", infer=_max_unpool_infer)
def max_unpool(ctx, x, idx, out_shape=None):
    """Scatter X at MaxPool's flat indices into the default shape, then fit it to output_shape."""
    shape = _unpool_shape(ctx, x.shape)
    y = np.zeros(math.prod(shape), x.dtype)
    y[idx.ravel()] = x.ravel()
    y = y.reshape(shape)
    if out_shape is not None:
        y = crop(y, [0] * y.ndim, [int(v) for v in out_shape])
    return y


# ---------------------------------------------------------------- normalization


def _normalize(xc, axes, eps):
    mean = xc.mean(axis=axes, keepdims=True)
    var = ((xc - mean) ** 2).mean(axis=axes, keepdims=True)
    return mean, var, (xc - mean) / np.sqrt(var + eps)


def _batchnorm_infer(ctx):
    t = ctx.tensor(0)
    if ctx.attr("spatial", 1):  # opset < 9 spatial=0: per-activation (C, D1, ...) statistics
        _channel_params(ctx, t, ("scale", "B", "input_mean", "input_var"))
    outs = [t]
    for i in range(1, ctx.num_outputs):
        src = ctx.tensor(3 if i % 2 else 4)
        outs.append(TensorType(src.dtype, src.shape))
    return outs


def _bn_training(ctx) -> bool:
    if ctx.opset >= 14:
        return bool(ctx.attr("training_mode", 0))
    if ctx.opset < 7 and ctx.attr("is_test", 0):
        return False
    return ctx.num_outputs > 1


@op("BatchNormalization", infer=_batchnorm_infer)
def batch_norm(ctx, x, scale, bias, mean, var):
    """Inference form with running stats; training form also returns updated running stats."""
    eps = float(ctx.attr("epsilon", 1e-5))
    xc = compute_dtype(x)
    r = x.ndim
    if not _bn_training(ctx):
        mean_, var_ = chan(compute_dtype(mean), r), chan(compute_dtype(var), r)
        y = (xc - mean_) / np.sqrt(var_ + eps) * chan(compute_dtype(scale), r) + chan(compute_dtype(bias), r)
        return (y.astype(x.dtype), *([mean, var, mean, var][:ctx.num_outputs - 1]))
    axes = (0,) + tuple(range(2, r))
    bmean, bvar, xn = _normalize(xc, axes, eps)
    y = xn * chan(compute_dtype(scale), r) + chan(compute_dtype(bias), r)
    mom = float(ctx.attr("momentum", 0.9))
    bmean, bvar = bmean.reshape(mean.shape), bvar.reshape(var.shape)
    rmean = (compute_dtype(mean) * mom + bmean * (1 - mom)).astype(mean.dtype)
    rvar = (compute_dtype(var) * mom + bvar * (1 - mom)).astype(var.dtype)
    # opset < 14 "saved_var" is the inverse std, as cuDNN and ONNX Runtime return it
    saved = (bmean.astype(mean.dtype), (1 / np.sqrt(bvar + eps)).astype(var.dtype))
    return (y.astype(x.dtype), rmean, rvar, *saved)[:max(ctx.num_outputs, 1)]


def _instance_norm_infer(ctx):
    _channel_params(ctx, ctx.tensor(0), ("scale", "B"))
    return [ctx.tensor(0)]


def _channel_params(ctx, t, names) -> None:
    """Inputs 1.. (`names`) hold one value per channel (dim 1) of input 0."""
    if t.shape is not None and len(t.shape) >= 2:
        for i, name in enumerate(names, 1):
            expect_shape(ctx, i, (t.shape[1],), f"{name}: one value per channel")


@op("InstanceNormalization", infer=_instance_norm_infer)
def instance_norm(ctx, x, scale, bias):
    xc = compute_dtype(x)
    xn = _normalize(xc, tuple(range(2, x.ndim)), float(ctx.attr("epsilon", 1e-5)))[2]
    return (xn * chan(compute_dtype(scale), x.ndim) + chan(compute_dtype(bias), x.ndim)).astype(x.dtype)


def _stash(ctx):
    return DType.from_onnx(int(ctx.attr("stash_type", 1)))


def _layer_norm_infer(ctx):
    t = ctx.tensor(0)
    if t.shape is None:
        stat = None
    else:
        axis = normalize_axis(ctx, int(ctx.attr("axis", -1)), len(t.shape))
        stat = tuple(t.shape[:axis]) + (1,) * (len(t.shape) - axis)
    u = _stash(ctx)
    return [t, TensorType(u, stat), TensorType(u, stat)]


@op("LayerNormalization", infer=_layer_norm_infer)
def layer_norm(ctx, x, scale, bias=None):
    axis = normalize_axis(ctx, int(ctx.attr("axis", -1)), x.ndim)
    xc = x.astype(_stash(ctx).np)
    mean, var, xn = _normalize(xc, tuple(range(axis, x.ndim)), float(ctx.attr("epsilon", 1e-5)))
    y = xn * scale.astype(xc.dtype)
    if bias is not None:
        y = y + bias.astype(xc.dtype)
    inv = 1 / np.sqrt(var + float(ctx.attr("epsilon", 1e-5)))
    return y.astype(x.dtype), mean, inv.astype(xc.dtype)


def _rms_infer(ctx):
    t = ctx.tensor(0)
    return [TensorType(ctx.dtype(1), t.shape)]


@op("RMSNormalization", infer=_rms_infer)
def rms_norm(ctx, x, scale):
    axis = normalize_axis(ctx, int(ctx.attr("axis", -1)), x.ndim)
    xc = x.astype(_stash(ctx).np)
    ms = (xc * xc).mean(axis=tuple(range(axis, x.ndim)), keepdims=True)
    y = xc / np.sqrt(ms + float(ctx.attr("epsilon", 1e-5))) * scale.astype(xc.dtype)
    return y.astype(scale.dtype)


@op("GroupNormalization", infer=same_as(0))
def group_norm(ctx, x, scale, bias):
    """Statistics per (batch, group); scale/bias per group (opset 18) or per channel (21)."""
    g = int(ctx.attr("num_groups"))
    n, c = x.shape[:2]
    if c % g:
        ctx.fail(f"channels {c} not divisible by num_groups {g}")
    xc = x.astype(_stash(ctx).np) if ctx.opset >= 21 else compute_dtype(x)
    xn = _normalize(xc.reshape(n, g, c // g * math.prod(x.shape[2:])), (2,), float(ctx.attr("epsilon", 1e-5)))[2].reshape(x.shape)

    def per_channel(p):
        p = compute_dtype(p)
        if p.size == c:
            return p
        if p.size == g:
            return np.repeat(p, c // g)
        ctx.fail(f"scale/bias of size {p.size} given, expected {c} (channels) or {g} (groups)")
    return (xn * chan(per_channel(scale), x.ndim) + chan(per_channel(bias), x.ndim)).astype(x.dtype)


@op("LRN", infer=same_as(0))
def lrn(ctx, x):
    """Local response normalization across channels."""
    size = int(ctx.attr("size"))
    alpha, beta, bias = float(ctx.attr("alpha", 1e-4)), float(ctx.attr("beta", 0.75)), float(ctx.attr("bias", 1.0))
    xc = compute_dtype(x)
    sq = np.pad(xc * xc, [(0, 0), ((size - 1) // 2, size // 2)] + [(0, 0)] * (x.ndim - 2))
    ssum = np.lib.stride_tricks.sliding_window_view(sq, size, axis=1).sum(axis=-1)
    return (xc / (bias + alpha / size * ssum) ** beta).astype(x.dtype)


@op("LpNormalization", infer=same_as(0))
def lp_normalization(ctx, x):
    p = int(ctx.attr("p", 2))
    if p not in (1, 2):
        ctx.fail(f"p must be 1 or 2, got {p}")
    xc = compute_dtype(x)
    axis = normalize_axis(ctx, int(ctx.attr("axis", -1)), x.ndim)
    norm = (np.abs(xc) ** p).sum(axis=axis, keepdims=True) ** (1.0 / p)
    safe = np.where(norm == 0, 1, norm)
    return np.where(norm == 0, 0, xc / safe).astype(x.dtype)


@op("MeanVarianceNormalization", infer=same_as(0))
def mean_variance_normalization(ctx, x):
    axes = tuple(int(a) for a in ctx.attr("axes", [0, 2, 3]))
    xc = compute_dtype(x)
    mean = xc.mean(axis=axes, keepdims=True)
    var = (xc * xc).mean(axis=axes, keepdims=True) - mean * mean
    return ((xc - mean) / (np.sqrt(var) + 1e-9)).astype(x.dtype)


# ================================================================ native lowerings (cpu target)
#
# Compute definitions say what each op computes for concrete shapes; schedules say
# how. Convolutions (Conv, ConvInteger, QLinearConv) share one formulation,
# `conv_native`, over element readers and an epilogue:
#
#   xpad[n, c, phase..., f]  the padded input, split into stride phases and flat, so
#                            a kernel tap reads a contiguous run of it (skipped when
#                            the input itself is that plane: 1x1, stride 1, no pads);
#   acc[n, g, cb, j, b, t]   the sum over (input channel, taps) at flat output position
#                            q = b * rows * pstr[0] + t of row block b; the plane's rows
#                            are a few columns wider than the output (those columns are
#                            computed and thrown away), so the vectorized t loop reads
#                            xpad contiguously whatever the stride or dilation;
#   conv[n, oc, o...]        acc at the output positions, through the epilogue (bias,
#                            requantization; a fused ReLU/Add lands here too).
#
# The schedule (see `plan_conv`): the output's tiles (image, row block, channel block)
# run in parallel; each computes its acc block locally in register blocks (channels x
# vectors of t, a small local array the C compiler keeps in registers), looping t
# outside and channels inside so an input block is reused by every channel block, and
# writes its output rows from it. Depthwise convolutions go per (image, channel), with
# that channel's plane made in place. Pools read the same plane.

from kiln.codegen.cpu import vector_bytes, vector_lanes  # noqa: E402
from kiln.loops import (cast, compute, const, max_, min_, reduce_axis, select,  # noqa: E402
                        sum_)
from kiln.ops.registry import lowering  # noqa: E402
from kiln.ops.reduce import schedule_per_row  # noqa: E402

_PAR_MIN = 1 << 15       # work (points x reduction) below which a kernel stays serial

# Serial time (estimated, microseconds) below which a kernel does not fork. A parallel region
# with sleeping threads (OMP_WAIT_POLICY=PASSIVE, kiln's runtime default) first wakes them:
# ~80 us measured on a 2-vCPU VM, so a kernel must run for a few times that to gain from a
# second thread. With spinning threads the fork costs a microsecond or two.
PARALLEL_MIN_US_PASSIVE = 150.0
# multiply-adds (or ops) per us, serial, measured with AVX-512; vectorized kinds scale with
# the vector width (an AVX2 EPYC runs 1x1 convs at ~15e3: with 60e3 a 0.5 ms conv looked
# like 0.12 ms and stayed serial)
RATES = {"conv": 60e3, "depthwise": 10e3, "window": 2e3}
VECTOR_RATE_BYTES = 64


def parallel_worth(work: int, kind: str = "window") -> bool:
    """Whether a kernel doing `work` multiply-adds (window ops) should run in parallel."""
    if work < _PAR_MIN:
        return False
    policy = os.environ.get("OMP_WAIT_POLICY", "PASSIVE").upper()
    if policy != "PASSIVE" or os.environ.get("GOMP_SPINCOUNT"):
        return True
    rate = RATES[kind] * (vector_bytes() / VECTOR_RATE_BYTES if kind == "conv" else 1)
    return work / rate >= PARALLEL_MIN_US_PASSIVE


def _rup(a: int, b: int) -> int:
    return -(-a // b) * b


def _strides_of(shape) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return out[::-1]


def _acc_dtype(dt: DType) -> DType:
    return DType.float32 if dt in (DType.float16, DType.bfloat16) else dt


@dataclass
class ConvPlan:
    """How a convolution is tiled (see conv_native)."""
    oct: int          # output channels per register block
    qv: int           # vectors along q per register block
    qt: int           # q per register block (qv * lanes)
    rows: int         # output rows (first spatial dim) per tile
    block: int        # q computed per tile (whole register blocks; may overlap the next tile)
    q_alloc: int      # q extent of the accumulator (last tile's end)
    ocb: int          # output channels per tile (a multiple of oct)
    direct: bool      # read the input in place (no padded plane)


ACC_TILE_BYTES = 256 << 10   # a tile's accumulator block stays in L2
CONV_KNOBS: dict = {}        # overrides for experiments and tests: oct, qv, rows, ocb
PLANE_PARALLEL_MIN = 1 << 17  # padded-plane elements below which it is built serially


def plan_conv(g: "ConvGeom", lanes: int, acc_bytes: int, knobs: dict | None = None,
              threads: int | None = None) -> ConvPlan:
    """Register block and tile sizes: heuristics over the register file and the shapes.

    A tile is (image, block of output rows, block of output channels); its accumulator is
    local. Rows per tile are chosen so that the tile's q range is whole register blocks with
    little overlap; channels per tile so that there are a few tiles per thread.
    """
    knobs = {**CONV_KNOBS, **(knobs or {})}
    big = lanes * acc_bytes >= 64           # AVX-512: 32 vector registers, else 16
    threads = threads or os.cpu_count() or 1
    rowlen, oh = g.pstr[0], g.out[0]
    inner_span = sum((o - 1) * p for o, p in zip(g.out[1:], g.pstr[1:])) + 1

    def span(r):                            # flat q extent of r output rows
        return (r - 1) * rowlen + inner_span
    # register blocks (channels, vectors) and their relative cost per useful FMA: enough
    # independent accumulators to cover the FMA latency, few loads per FMA (measured)
    if g.ocg < 4:                           # depthwise-like: one channel, a long run of q
        blocks = [(1, 4, 1.0)] if big else [(1, 2, 1.0)]
    elif big:
        blocks = [(8, 3, 1.0), (8, 2, 1.02), (4, 4, 1.06), (16, 2, 1.12), (16, 1, 1.25), (4, 2, 1.3),
                  (2, 4, 1.3), (1, 4, 1.6)]
    else:
        # 16 registers: 4 x 2 (8 accumulators, 2 loads, a broadcast) over 4 x 3, which fills
        # the file: 3x3 convs 64-256 channels at 56-14 wide 58-64 -> 65-67 GFLOP/s (AVX2 EPYC)
        blocks = [(4, 2, 1.0), (4, 3, 1.05), (6, 2, 1.08), (12, 1, 1.15), (2, 2, 1.4), (1, 2, 1.8)]
    blocks = [b for b in blocks if g.ocg % b[0] == 0] or [(1, 1, 2.0)]
    if "oct" in knobs or "qv" in knobs:
        blocks = [(int(knobs.get("oct", blocks[0][0])), int(knobs.get("qv", blocks[0][1])), 1.0)]
    best = None
    for oct_, qv, slow in blocks:
        qt = qv * lanes
        if g.ocg < 4:
            cands = [oh]
        elif "rows" in knobs:
            cands = [int(knobs["rows"])]
        else:
            cands = [r for r in range(1, oh + 1) if span(r) >= min(256, span(oh))] or [oh]
        for r in cands:
            block = _rup(span(r), qt)
            nb = -(-oh // r)
            q_alloc = (nb - 1) * r * rowlen + block
            direct = g.direct and q_alloc == g.q_len
            cost = nb * block * slow * (1.0 if direct or g.direct is False else 1.05)
            cost *= 1 + 0.02 * (block // 1024)          # big tiles spill out of L1
            key = (cost, -r)
            if best is None or key < best[0]:
                best = (key, oct_, qv, r, block, q_alloc, direct)
    _, oct_, qv, r, block, q_alloc, direct = best
    nb = -(-oh // r)
    if g.ocg < 4:
        ocb = 1
    elif "ocb" in knobs:
        ocb = int(knobs["ocb"])
    else:
        # channels per tile: the accumulator fits L2, and there are a few tiles per thread
        ocb = g.ocg
        while ocb % (2 * oct_) == 0 and (ocb * block * acc_bytes > ACC_TILE_BYTES
                                         or g.n * nb * g.group * (g.ocg // ocb) < 4 * threads):
            ocb //= 2
    return ConvPlan(oct_, qv, qv * lanes, r, block, q_alloc, ocb, direct)


@dataclass
class ConvGeom:
    """Concrete geometry of an N-d convolution for the native formulation."""
    n: int
    c: int
    spatial: list
    oc: int
    kernel: list
    group: int
    strides: list
    dil: list
    begin: list
    out: list
    # read the last dim with the stride (no phase split of it): the plane's rows are
    # `stride` times wider and a tap reads every stride-th element (depthwise: a cheap
    # contiguous plane matters more than contiguous tap reads)
    cols_strided: bool = False

    def __post_init__(self):
        nd = len(self.kernel)
        self.nd = nd
        self.cg = self.c // self.group
        self.ocg = self.oc // self.group
        self.tap_off = [(k - 1) * d // s for k, d, s in zip(self.kernel, self.dil, self.strides)]
        self.plane = [o + t for o, t in zip(self.out, self.tap_off)]
        self.pstr = _strides_of(self.plane)
        res = [{(k * d) % s for k in range(kk)} for kk, d, s in zip(self.kernel, self.dil, self.strides)]
        self.nphase = [s if len(r) > 1 else 1 for r, s in zip(res, self.strides)]
        self.phase0 = [0 if len(r) > 1 else next(iter(r)) for r in res]
        self.cols_strided = self.cols_strided and self.strides[-1] > 1
        self.qscale = self.strides[-1] if self.cols_strided else 1
        if self.cols_strided:
            self.nphase[-1], self.phase0[-1] = 1, 0
        # flat strides of the padded plane (q strides times the column stride, if strided)
        self.fstr = [p * self.qscale for p in self.pstr[:-1]] + [1]
        # pointwise-like: the plane's inner dims equal the output's (no thrown-away columns)
        self.dense = all(t == 0 for t in self.tap_off[1:])
        # the input itself is the padded, phase-split plane: read it directly
        self.direct = all(s == 1 and b == 0 and k == 1 and o == i for s, b, k, o, i in
                          zip(self.strides, self.begin, self.kernel, self.out, self.spatial))

    @property
    def q_len(self) -> int:
        return self.out[0] * self.pstr[0]

    def tap_offset(self, ks):
        """Flat offset in the plane (and phase indices) of kernel tap ks (ints or Exprs)."""
        ph, off = [], 0
        for i, (k, d, s) in enumerate(zip(ks, self.dil, self.strides)):
            if self.cols_strided and i == self.nd - 1:
                ph.append(0)
                off = off + k * d
            else:
                ph.append((k * d) % s if self.nphase[i] > 1 else 0)
                off = off + ((k * d) // s) * self.fstr[i]
        return ph, off

    def flat_len(self, q_alloc: int) -> int:
        _, maxoff = self.tap_offset([k - 1 for k in self.kernel])
        return _rup(self.qscale * (q_alloc - 1) + maxoff + 1, self.fstr[0])

    def macs(self) -> int:
        return self.n * self.oc * math.prod(self.out) * self.cg * math.prod(self.kernel)


def conv_native(ctx, geom: ConvGeom, xval, wval, acc_dt: DType, epilogue, out_dt: DType,
                pad_value=None, knobs: dict | None = None):
    """Lower a convolution given element readers; returns the output Tensor (and sets the schedule).

    xval(n, c, *sp) -> Expr in acc_dt for in-bounds input positions; pad_value (acc_dt Expr)
    is what padded positions read. wval(oc, icg, *k) -> Expr in acc_dt.
    epilogue(acc, oc) -> Expr in out_dt (bias, requantization, cast).
    """
    g = geom
    nd = g.nd
    lanes = vector_lanes(acc_dt.itemsize)
    plan = plan_conv(g, lanes, acc_dt.itemsize, knobs)
    oct_, qt, q_alloc, direct = plan.oct, plan.qt, plan.q_alloc, plan.direct
    if g.ocg % oct_ or g.ocg % plan.ocb or plan.ocb % oct_:
        ctx.fail(f"conv plan: register block of {oct_} and tile of {plan.ocb} channels do not divide "
                 f"the {g.ocg} output channels per group")
    zero = const(0, acc_dt) if pad_value is None else pad_value

    if direct:
        xs = None

        def tap_read(n, c, ks, q):
            return xval(n, c, *([0] * (nd - 1) + [q]))     # a flat view of the spatial dims
    else:
        xs, tap_read = padded_plane(g, xval, zero, q_alloc)

    ic = reduce_axis(g.cg, "ic")
    ks = [reduce_axis(k, f"k{i}") for i, k in enumerate(g.kernel)]
    red = [ic] + ks

    def taps(n, gi, j, q):
        return tap_read(n, gi * g.cg + ic, ks, q) * wval(gi * g.ocg + j, ic, *ks)

    # acc[n, g, j, b, t]: flat position q = b * rows * pstr[0] + t of row block b. Blocks are
    # whole register blocks long (they may overlap the next one), and indexed from their own
    # start, so every tile's region starts at 0 and its loops need no guards
    # Channels likewise: j = c * ocb + jj for channel block c (one block per group if group > 1)
    nb, bstride = -(-g.out[0] // plan.rows), plan.rows * g.pstr[0]
    ocb = plan.ocb if g.group == 1 else g.ocg
    acc = compute((g.n, g.group, g.ocg // ocb, ocb, nb, plan.block),
                  lambda n, gi, c, jj, b, t: sum_(taps(n, gi, c * ocb + jj, b * bstride + t), axis=red), "acc")
    last = g.out[-1]

    def out_body(n, o, *sp):
        gj = (0, o // ocb, o % ocb) if g.group == 1 else (o // g.ocg, 0, o % g.ocg)
        rb, ri = (0, sp[0]) if nb == 1 else (sp[0] // plan.rows, sp[0] % plan.rows)
        t = ri * g.pstr[0] + sum(i * p for i, p in zip(sp[1:], g.pstr[1:]))
        # `sp[-1] < last` always holds (the simplifier removes the select); the other branch
        # tells bound inference that a tile reads its block to the end (whole register blocks)
        a = select(sp[-1] < last, acc[(n, *gj, rb, t)], acc[(n, *gj, rb, plan.block - 1)])
        return epilogue(a, o)
    out = compute((g.n, g.oc, *g.out), out_body, "conv", out_dt)
    if out.dtype is not out_dt:
        ctx.fail(f"conv epilogue gives {out.dtype}, expected {out_dt}")
    work = g.macs()
    depthwise = g.ocg < 4

    def schedule(sch, outputs):
        par_ok = parallel_worth(work, "depthwise" if depthwise else "conv")
        final = out
        if sch[out].attach == "inline" and outputs and tuple(outputs[0].shape) == tuple(out.shape):
            final = outputs[0]              # an elementwise epilogue fused after the conv
        # the register block: a small local array the C compiler keeps in registers over the
        # reduction loops (a tile-sized or heap buffer it would load and store every step).
        # Depthwise: the few taps are unrolled, so the compiler keeps the accumulators in
        # registers across them anyway, and the channel's padded plane can be computed in
        # the accumulator's loop
        blk = None if depthwise else sch.cache_write(acc)
        so = sch[final]
        oax = list(so.axis)
        sp = oax[2:]
        if depthwise:
            # per (image, channel): its padded plane, the accumulation, the output rows
            top = so.fuse(oax[0], oax[1])
        else:
            # a tile: (image, block of rows, block of channels); channels are split per group
            # first so that the group and channel-in-group indices stay affine
            rb, ri = so.split(sp[0], plan.rows)
            if g.group > 1:
                go, oj = so.split(oax[1], g.ocg)
                so.reorder(oax[0], rb, go, oj, ri)
                top = so.fuse(oax[0], rb, go)
            else:
                cb, ci = so.split(oax[1], plan.ocb)
                so.reorder(oax[0], rb, cb, ci, ri)
                top = so.fuse(oax[0], rb, cb)
        if par_ok:
            so.parallel(top)
        vec = so.leaves[-1]
        if vec.arg.dom[1] >= 4:
            so.vectorize(vec)
        # the tile's accumulator: register blocks (q outer, channels inner: a block of the
        # input is reused by every channel block) copied out
        sa = sch[acc]
        sa.compute_at(so, top)
        an, ag, _, aj, ab, aq = sa.axis
        qo, qi = sa.split(aq, qt)
        jo, ji = sa.split(aj, oct_)
        if blk is None:
            sa.reorder(an, ag, ab, qo, jo, *sa.reduce_axis, ji, qi)
            if math.prod(g.kernel) <= 32:
                for k in sa.reduce_axis[1:]:
                    sa.unroll(k)
            sa.unroll(ji)
            sa.vectorize(qi)
        else:
            sa.reorder(an, ag, ab, qo, jo, ji, qi)
            sa.vectorize(qi)
            sl = sch[blk]
            sl.compute_at(sa, jo)
            ln, lg, lc, lj, lb, lq = sl.axis
            sl.reorder(ln, lg, lc, lb, *sl.reduce_axis, lj, lq)
            _unroll_taps(sl, g)
            sl.unroll(lj)
            sl.vectorize(lq)
        if xs is not None:
            if depthwise:
                sch[xs].compute_at(sa, an)
                schedule_plane(sch[xs], g, False, fuse_lead=False)
            else:
                # a small plane is copied serially: a parallel region costs more than the copy
                schedule_plane(sch[xs], g, par_ok and math.prod(xs.shape) >= PLANE_PARALLEL_MIN)

    ctx.schedule(schedule)
    return out


def padded_plane(g: ConvGeom, xval, pad, q_alloc: int):
    """The input zero- (or `pad`-) padded, split into stride phases and flattened per (n, c):
    xpad[n, c, phase..., f]. Returns it and `tap_read(n, c, ks, q)`, the value kernel tap ks
    (Exprs, one per spatial dim) sees at flat output position q (q = sum o_i * pstr_i)."""
    nd = g.nd
    flen = g.flat_len(q_alloc)

    def body(n, c, *rest):
        ph, f = rest[:nd], rest[nd]
        rows = [f // g.fstr[0]] + [(f % g.fstr[i - 1]) // g.fstr[i] for i in range(1, nd)]
        pos, ok = [], []
        for i in range(nd):
            if g.cols_strided and i == nd - 1:
                p = rows[i] - g.begin[i]
            else:
                p = rows[i] * g.strides[i] + (ph[i] if g.nphase[i] > 1 else g.phase0[i]) - g.begin[i]
            ok += [p >= 0, p < g.spatial[i]]
            pos.append(p)
        # the load happens only where `ok` holds (C evaluates one branch; vectorized, a
        # masked load), so the index needs no clamping
        return select(_conj(ok), xval(n, c, *pos), pad)
    xs = compute((g.n, g.c, *g.nphase, flen), body, "xpad")

    def tap_read(n, c, ks, q):
        ph, off = g.tap_offset(ks)
        return xs[(n, c, *ph, q * g.qscale + off if g.qscale > 1 else q + off)]
    return xs, tap_read


def schedule_plane(stage, g: ConvGeom, par_ok: bool, fuse_lead: bool = True):
    """Rows of the padded plane: (n, c) parallel, the flat axis split back into rows (so the
    row/column arithmetic simplifies away) with the last one vectorized."""
    ax = list(stage.axis)
    f = ax[-1]
    for i in range(g.nd - 1):
        _, f = stage.split(f, g.fstr[i])
    if fuse_lead:
        lead = stage.fuse(*ax[:2])
        if par_ok:
            stage.parallel(lead)
    stage.vectorize(f)


def _unroll_taps(stage, g: ConvGeom):
    """Unroll the kernel-tap loops when there are few taps (else the innermost, when short)."""
    ks = stage.reduce_axis[1:]
    if ks and math.prod(g.kernel) <= 9:
        for k in ks:
            stage.unroll(k)
    elif ks and g.kernel[-1] <= 7:
        stage.unroll(ks[-1])


def _conv_geom(ctx, xshape, wshape, group: int) -> ConvGeom:
    nd = len(xshape) - 2
    kern = kernel_of(ctx, wshape, nd)
    if xshape[1] != wshape[1] * group or wshape[0] % group:
        ctx.fail(f"weight shape {tuple(wshape)} does not fit input channels {xshape[1]} with group {group}")
    win = window(ctx, list(xshape[2:]), list(kern))
    depthwise = wshape[0] // group < 4
    return ConvGeom(xshape[0], xshape[1], list(xshape[2:]), wshape[0], list(kern), group,
                    win.strides, win.dilations, [int(b) for b in win.begin], [int(o) for o in win.out],
                    cols_strided=depthwise)


@lowering("Conv")
def _conv_lower(ctx, x, w, b=None):
    group = int(ctx.attr("group", 1))
    geom = _conv_geom(ctx, x.shape, w.shape, group)
    acc_dt = _acc_dtype(x.dtype)

    def xval(n, c, *sp):
        return cast(acc_dt, x[(n, c, *sp)])

    def wval(o, i, *k):
        return cast(acc_dt, w[(o, i, *k)])

    def epilogue(a, o):
        if b is not None:
            a = a + cast(acc_dt, b[o])
        return cast(x.dtype, a)
    return conv_native(ctx, geom, xval, wval, acc_dt, epilogue, x.dtype)


# ---------------------------------------------------------------- native: shared helpers

def _lanes(dt: DType) -> int:
    return vector_lanes(dt.itemsize)


def _conj(conds):
    out = None
    for c in conds:
        out = c if out is None else out & c
    return const(1, DType.bool) if out is None else out


def bcast_load(t, idx):
    """Numpy-broadcast read of tensor t at the (right-aligned) output index idx."""
    lead = len(idx) - len(t.shape)
    return t[tuple(0 if n == 1 else idx[lead + k] for k, n in enumerate(t.shape))]


def schedule_rows(stage, lead: int, work: int | None = None, vector: bool = True):
    """Fuse the first `lead` axes into one (parallel when there is work) and the rest into one
    vectorized loop: the shape of per-row/per-channel elementwise and pooling stages."""
    axes = list(stage.axis)
    if not axes:
        return
    lead = max(0, min(lead, len(axes) - 1))
    outer = stage.fuse(*axes[:lead]) if lead > 1 else axes[0] if lead == 1 else None
    inner_axes = axes[lead:]
    if stage.reduce_axis:
        if outer is not None and parallel_worth(work or 0) and outer.arg.dom[1] > 1:
            stage.parallel(outer)
        return
    inner = stage.fuse(*inner_axes) if len(inner_axes) > 1 else inner_axes[0]
    lanes = _lanes(stage.tensor.dtype)
    if vector and inner.arg.dom[1] >= lanes:
        stage.vectorize(inner)
    if outer is not None and parallel_worth(work or 0) and outer.arg.dom[1] > 1:
        stage.parallel(outer)


def _default_then(extra):
    """A schedule: the default one for every stage, then `extra(sch)` adjustments."""
    from kiln.lower.schedules import default_schedule

    def fn(sch, outputs):
        extra(sch)
        done = {s for s in sch.stages if s.relations or s.kinds or s.attach is not None}
        rest = [s for s in sch.stages if s not in done]
        saved = sch.stages
        sch.stages = rest
        try:
            default_schedule(sch, outputs)
        finally:
            sch.stages = saved
    return fn


# ---------------------------------------------------------------- native: pooling

def _pool_taps(win, o, ks, spatial, lo=None, hi=None):
    """Input positions of taps ks at output o, whether each is inside [lo, hi), clamped positions."""
    pos, ok, clamped = [], [], []
    for i, (oi, k) in enumerate(zip(o, ks)):
        p = oi * win.strides[i] + k * win.dilations[i] - win.begin[i]
        lo_i = 0 if lo is None else lo[i]
        hi_i = spatial[i] if hi is None else hi[i]
        pos.append(p)
        ok.append((p >= lo_i) & (p < hi_i))
        clamped.append(min_(max_(p, 0), spatial[i] - 1))
    return pos, _conj(ok), clamped


def _window_count(win, o, spatial, lo, hi):
    """Number of taps of the window at output o falling inside [lo, hi) per dim, multiplied (int64)."""
    total = None
    for i, oi in enumerate(o):
        s, d, b, kk = win.strides[i], win.dilations[i], win.begin[i], win.kernel[i]
        start = oi * s - b
        k_lo = max_(-((start - lo[i]) // d), 0)                      # ceil((lo - start) / d)
        k_hi = min_(-((start - hi[i]) // d), kk)                     # ceil((hi - start) / d)
        c = max_(k_hi - k_lo, 0)
        total = c if total is None else total * c
    return total


def _pool_schedule(red_stages, out_stages, nd, work, planes=()):
    """Pool stages: (n, c) parallel, rows, the window's taps, then the vectorized last output dim."""
    def fn(sch, outputs):
        for t in red_stages:
            # a row of results accumulates in a local array (registers) over the window's
            # taps, then is stored once
            row = sch.cache_write(t)
            s = sch[t]
            ax = list(s.axis)
            nc = s.fuse(ax[0], ax[1])
            if parallel_worth(work):
                s.parallel(nc)
            if ax[-1].arg.dom[1] >= 4:
                s.vectorize(ax[-1])
            sl = sch[row]
            sl.compute_at(s, ax[-2] if len(ax) > 3 else nc)
            lax = list(sl.axis)
            sl.reorder(*lax[:-1], *sl.reduce_axis, lax[-1])
            if sl.reduce_axis and math.prod(k.arg.dom[1] for k in sl.reduce_axis) <= 9:
                for k in sl.reduce_axis:
                    sl.unroll(k)
            elif sl.reduce_axis and sl.reduce_axis[-1].arg.dom[1] <= 7:
                sl.unroll(sl.reduce_axis[-1])
            if lax[-1].arg.dom[1] >= 4:
                sl.vectorize(lax[-1])
        for xs, g in planes:
            schedule_plane(sch[xs], g, parallel_worth(work))
        for t in out_stages:
            schedule_rows(sch[t], 2, work)
    return fn


def _lowest_expr(dt: DType):
    return const(-math.inf, dt) if dt.is_float else const(np.iinfo(dt.np).min, dt)


def _pool_plane(ctx, x, win, xval, pad):
    """Pooling windows read from the padded, phase-split plane: (plane, geometry, tap reader)."""
    n, c = x.shape[:2]
    g = ConvGeom(n, c, list(x.shape[2:]), c, list(win.kernel), c, list(win.strides), list(win.dilations),
                 [int(b) for b in win.begin], [int(o) for o in win.out], cols_strided=True)
    xs, tap = padded_plane(g, xval, pad, g.q_len)

    def read(n_, c_, ks, o):
        return tap(n_, c_, ks, sum(i * p for i, p in zip(o, g.pstr)))
    return xs, g, read


@lowering("MaxPool")
def _max_pool_lower(ctx, x):
    win = _pool_window(ctx, x)
    nd = len(x.shape) - 2
    out_shape = ctx.out_shape(0)
    ks = [reduce_axis(k, f"k{i}") for i, k in enumerate(win.kernel)]
    spatial = list(x.shape[2:])
    xs, geom, read = _pool_plane(ctx, x, win, lambda n, c, *sp: x[(n, c, *sp)], _lowest_expr(x.dtype))
    y = compute(out_shape, lambda n, c, *o: _rmax(read(n, c, ks, o), ks), "maxpool")
    work = math.prod(out_shape) * math.prod(win.kernel)
    planes = [(xs, geom)]
    if ctx.output_used(1):
        ks2 = [reduce_axis(k, f"t{i}") for i, k in enumerate(win.kernel)]
        kstr = _strides_of(win.kernel)
        big = const(math.prod(win.kernel), DType.int64)

        def first(n, c, *o):
            _, ok, cl = _pool_taps(win, o, ks2, spatial)
            v = x[(n, c, *cl)]
            hit = v.eq(y[(n, c, *o)])
            if x.dtype.is_float:
                from kiln.loops import isnan
                hit = hit | isnan(v)
            lin = sum(k * st for k, st in zip(ks2, kstr))
            return _rmin(select(ok & hit, lin, big), ks2)
        kidx = compute(out_shape, first, "argmax")
        dims = spatial[::-1] if int(ctx.attr("storage_order", 0)) else spatial

        def index(n, c, *o):
            kk = kidx[(n, c, *o)]
            pos = [o[i] * win.strides[i] - win.begin[i] + ((kk // kstr[i]) % win.kernel[i]) * win.dilations[i]
                   for i in range(nd)]
            if int(ctx.attr("storage_order", 0)):
                pos = pos[::-1]
            flat = (n * x.shape[1] + c) * math.prod(spatial)
            for p, st in zip(pos, _strides_of(dims)):
                flat = flat + p * st
            return flat
        ind = compute(out_shape, index, "indices", DType.int64)
        ctx.schedule(_pool_schedule([y, kidx], [ind], nd, work, planes))
        return [y, ind]
    ctx.schedule(_pool_schedule([y], [], nd, work, planes))
    if ctx.num_outputs > 1:
        return [y, compute(ctx.out_shape(1), lambda *i: const(0, DType.int64), "indices")]
    return y


def _rmax(v, ks):
    from kiln.loops import rmax
    return rmax(v, ks)


def _rmin(v, ks):
    from kiln.loops import rmin
    return rmin(v, ks)


@lowering("AveragePool")
def _average_pool_lower(ctx, x):
    win = _pool_window(ctx, x)
    nd = len(x.shape) - 2
    out_shape = ctx.out_shape(0)
    acc = _acc_dtype(x.dtype)
    ks = [reduce_axis(k, f"k{i}") for i, k in enumerate(win.kernel)]
    spatial = list(x.shape[2:])
    xs, geom, read = _pool_plane(ctx, x, win, lambda n, c, *sp: cast(acc, x[(n, c, *sp)]), const(0, acc))
    total = compute(out_shape, lambda n, c, *o: sum_(read(n, c, ks, o), ks), "winsum")
    if ctx.attr("count_include_pad", 0):
        lo, hi = [-b for b in win.begin], [s + e for s, e in zip(spatial, win.end)]
    else:
        lo, hi = [0] * nd, spatial
    y = compute(out_shape, lambda n, c, *o: cast(x.dtype, total[(n, c, *o)] /
                                                 cast(acc, _window_count(win, o, spatial, lo, hi))),
                "avgpool")
    ctx.schedule(_pool_schedule([total], [y], nd, math.prod(out_shape) * math.prod(win.kernel),
                                [(xs, geom)]))
    return y


@lowering("LpPool")
def _lp_pool_lower(ctx, x):
    win = _pool_window(ctx, x)
    nd = len(x.shape) - 2
    out_shape = ctx.out_shape(0)
    acc = _acc_dtype(x.dtype)
    p = _lp_p(ctx)
    ks = [reduce_axis(k, f"k{i}") for i, k in enumerate(win.kernel)]
    xs, geom, read = _pool_plane(ctx, x, win, lambda n, c, *sp: cast(acc, x[(n, c, *sp)]), const(0, acc))
    total = compute(out_shape, lambda n, c, *o: sum_(_abs_pow(read(n, c, ks, o), p), ks), "winsum")
    y = compute(out_shape, lambda *i: cast(x.dtype, _root(total[i], p)), "lppool")
    ctx.schedule(_pool_schedule([total], [y], nd, math.prod(out_shape) * math.prod(win.kernel),
                                [(xs, geom)]))
    return y


def _abs_pow(v, p: float):
    from kiln.loops import fabs, pow_
    if p == 2.0:
        return v * v
    if p == 1.0:
        return fabs(v)
    return pow_(fabs(v), const(p, v.dtype))


def _root(v, p: float):
    from kiln.loops import pow_, sqrt
    if p == 2.0:
        return sqrt(v)
    if p == 1.0:
        return v
    return pow_(v, const(1.0 / p, v.dtype))


def _global_lower(kind):
    def lower_fn(ctx, x):
        acc = _acc_dtype(x.dtype)
        spatial = list(x.shape[2:])
        ks = [reduce_axis(s, f"r{i}") for i, s in enumerate(spatial)]
        if kind == "max":
            r = compute((x.shape[0], x.shape[1]), lambda n, c: _rmax(cast(acc, x[(n, c, *ks)]), ks), "gmax")
            fin = lambda v: v  # noqa: E731
        elif kind == "avg":
            r = compute((x.shape[0], x.shape[1]), lambda n, c: sum_(cast(acc, x[(n, c, *ks)]), ks), "gsum")
            cnt = const(math.prod(spatial), acc)
            fin = lambda v: v / cnt  # noqa: E731
        else:
            p = _lp_p(ctx)
            r = compute((x.shape[0], x.shape[1]),
                        lambda n, c: sum_(_abs_pow(cast(acc, x[(n, c, *ks)]), p), ks), "gsum")
            fin = lambda v: _root(v, p)  # noqa: E731
        y = compute(ctx.out_shape(0), lambda n, c, *z: cast(x.dtype, fin(r[n, c])), "gpool")
        work = math.prod(x.shape)

        def sched(sch):
            s = sch[r]
            nc = s.fuse(*s.axis)
            if parallel_worth(work):
                s.parallel(nc)
        ctx.schedule(_default_then(sched))
        return y
    return lower_fn


lowering("GlobalAveragePool")(_global_lower("avg"))
lowering("GlobalMaxPool")(_global_lower("max"))
lowering("GlobalLpPool")(_global_lower("lp"))


# ---------------------------------------------------------------- native: normalization

def _keep_shape(shape, axes):
    return tuple(1 if a in axes else n for a, n in enumerate(shape))


def moments(xval, shape, axes, acc: DType, name: str, centered: bool = True):
    """Keepdims mean and variance (two-pass, as the references) of xval(idx) over `axes`.

    Returns (mean, var) tensors of the keepdims shape. With centered=False the
    variance is E[x^2] - E[x]^2 (MeanVarianceNormalization's definition).
    """
    rank = len(shape)
    keep = _keep_shape(shape, axes)
    cnt = const(math.prod(shape[a] for a in axes), acc)

    def over(i, red):
        return [red[a] if a in red else i[a] for a in range(rank)]

    r1 = {a: reduce_axis(shape[a], f"r{a}") for a in axes}
    s1 = compute(keep, lambda *i: sum_(xval(over(i, r1)), list(r1.values())), f"{name}_sum")
    mean = compute(keep, lambda *i: s1[i] / cnt, f"{name}_mean")
    r2 = {a: reduce_axis(shape[a], f"s{a}") for a in axes}
    if centered:
        def sq(*i):
            d = xval(over(i, r2)) - mean[i]
            return sum_(d * d, list(r2.values()))
        s2 = compute(keep, sq, f"{name}_sqsum")
        var = compute(keep, lambda *i: s2[i] / cnt, f"{name}_var")
    else:
        def sq2(*i):
            v = xval(over(i, r2))
            return sum_(v * v, list(r2.values()))
        s2 = compute(keep, sq2, f"{name}_sqsum")
        var = compute(keep, lambda *i: s2[i] / cnt - mean[i] * mean[i], f"{name}_var")
    return mean, var


def _rsqrt_eps(var, eps, acc, name):
    from kiln.loops import sqrt
    one = const(1, acc)
    return compute(var.shape, lambda *i: one / sqrt(var[i] + const(eps, acc)), name)


def _norm_schedule(out_tensors, lead: int, work: int):
    """Statistics stages by default; the normalized outputs as rows (lead axes parallel)."""
    def extra(sch):
        for t in out_tensors:
            schedule_rows(sch[t], lead, work)
    return _default_then(extra)


@lowering("BatchNormalization")
def _batch_norm_lower(ctx, x, scale, bias, mean, var):
    eps = float(ctx.attr("epsilon", 1e-5))
    acc = _acc_dtype(x.dtype)
    rank = len(x.shape)
    C = x.shape[1]
    f = lambda t, c: cast(acc, t[c])  # noqa: E731
    if _bn_training(ctx):
        axes = [0] + list(range(2, rank))
        bmean, bvar = moments(lambda i: cast(acc, x[tuple(i)]), x.shape, axes, acc, "bn")
        inv = _rsqrt_eps(bvar, eps, acc, "bn_inv")
        mom = const(float(ctx.attr("momentum", 0.9)), acc)
        one = const(1, acc)
        zi = (0,) * (rank - 2)
        y = compute(x.shape, lambda n, c, *sp: cast(x.dtype, (cast(acc, x[(n, c, *sp)]) - bmean[(0, c, *zi)])
                                                       * inv[(0, c, *zi)] * f(scale, c) + f(bias, c)), "bn")
        run_mean = compute((C,), lambda c: cast(mean.dtype, f(mean, c) * mom + bmean[(0, c, *zi)] * (one - mom)),
                           "running_mean")
        run_var = compute((C,), lambda c: cast(var.dtype, f(var, c) * mom + bvar[(0, c, *zi)] * (one - mom)),
                          "running_var")
        saved_mean = compute((C,), lambda c: cast(mean.dtype, bmean[(0, c, *zi)]), "saved_mean")
        saved_var = compute((C,), lambda c: cast(var.dtype, inv[(0, c, *zi)]), "saved_var")
        ctx.schedule(_norm_schedule([y], 2, math.prod(x.shape)))
        return [y, run_mean, run_var, saved_mean, saved_var][:max(ctx.num_outputs, 1)]
    from kiln.loops import sqrt
    a = compute((C,), lambda c: f(scale, c) / sqrt(f(var, c) + const(eps, acc)), "bn_scale")
    y = compute(x.shape, lambda n, c, *sp: cast(x.dtype, (cast(acc, x[(n, c, *sp)]) - f(mean, c)) * a[c]
                                                 + f(bias, c)), "bn")
    ctx.schedule(_norm_schedule([y], 2, math.prod(x.shape)))
    extra = [compute(t.shape, lambda c, t=t: t[c], f"stat{k}")
             for k, t in enumerate([mean, var, mean, var][:ctx.num_outputs - 1])]
    return [y, *extra]


@lowering("InstanceNormalization")
def _instance_norm_lower(ctx, x, scale, bias):
    acc = _acc_dtype(x.dtype)
    rank = len(x.shape)
    axes = list(range(2, rank))
    mean, var = moments(lambda i: cast(acc, x[tuple(i)]), x.shape, axes, acc, "in")
    inv = _rsqrt_eps(var, float(ctx.attr("epsilon", 1e-5)), acc, "in_inv")
    zi = (0,) * (rank - 2)
    y = compute(x.shape, lambda n, c, *sp: cast(x.dtype, (cast(acc, x[(n, c, *sp)]) - mean[(n, c, *zi)])
                                                 * inv[(n, c, *zi)] * cast(acc, scale[c]) + cast(acc, bias[c])),
                "instnorm")
    ctx.schedule(_norm_schedule([y], 2, math.prod(x.shape)))
    return y


@lowering("LayerNormalization")
def _layer_norm_lower(ctx, x, scale, bias=None):
    rank = len(x.shape)
    axis = normalize_axis(ctx, int(ctx.attr("axis", -1)), rank)
    acc = _stash(ctx)
    if acc.c is None:
        ctx.fail(f"stash_type {acc} has no native type")
    axes = list(range(axis, rank))
    mean, var = moments(lambda i: cast(acc, x[tuple(i)]), x.shape, axes, acc, "ln")
    inv = _rsqrt_eps(var, float(ctx.attr("epsilon", 1e-5)), acc, "ln_inv")
    zi = (0,) * (rank - axis)

    def body(*i):
        k = tuple(i[:axis]) + zi
        v = (cast(acc, x[i]) - mean[k]) * inv[k] * cast(acc, bcast_load(scale, i))
        if bias is not None:
            v = v + cast(acc, bcast_load(bias, i))
        return cast(x.dtype, v)
    y = compute(x.shape, body, "layernorm")
    if axis == rank - 1 and rank >= 2 and ctx.num_outputs <= 1:
        # one loop over rows: sum, mean, centred sum of squares, 1/std per row (consumers first)
        (s2,), (s1,) = var.inputs, mean.inputs
        ctx.schedule(lambda sch, outs: schedule_per_row(sch, y, [inv, var, s2, mean, s1]))
        return y
    mean_out = compute(mean.shape, lambda *i: mean[i], "mean")
    inv_out = compute(inv.shape, lambda *i: inv[i], "invstd")
    ctx.schedule(_norm_schedule([y], axis, math.prod(x.shape)))
    return [y, mean_out, inv_out][:max(ctx.num_outputs, 1)]


@lowering("RMSNormalization")
def _rms_norm_lower(ctx, x, scale):
    from kiln.loops import sqrt
    rank = len(x.shape)
    axis = normalize_axis(ctx, int(ctx.attr("axis", -1)), rank)
    acc = _stash(ctx)
    if acc.c is None:
        ctx.fail(f"stash_type {acc} has no native type")
    axes = list(range(axis, rank))
    keep = _keep_shape(x.shape, axes)
    red = {a: reduce_axis(x.shape[a], f"r{a}") for a in axes}

    def sq(*i):
        v = cast(acc, x[tuple(red[a] if a in red else i[a] for a in range(rank))])
        return sum_(v * v, list(red.values()))
    ss = compute(keep, sq, "rms_sqsum")
    cnt = const(math.prod(x.shape[a] for a in axes), acc)
    eps = const(float(ctx.attr("epsilon", 1e-5)), acc)
    den = compute(keep, lambda *i: sqrt(ss[i] / cnt + eps), "rms_den")
    zi = (0,) * (rank - axis)
    y = compute(x.shape, lambda *i: cast(scale.dtype, cast(acc, x[i]) / den[tuple(i[:axis]) + zi]
                                         * cast(acc, bcast_load(scale, i))), "rmsnorm")
    if axis == rank - 1 and rank >= 2:
        ctx.schedule(lambda sch, outs: schedule_per_row(sch, y, [den, ss]))
        return y
    ctx.schedule(_norm_schedule([y], axis, math.prod(x.shape)))
    return y


@lowering("GroupNormalization")
def _group_norm_lower(ctx, x, scale, bias):
    g = int(ctx.attr("num_groups"))
    n, c = x.shape[:2]
    if c % g:
        ctx.fail(f"channels {c} not divisible by num_groups {g}")
    cg = c // g
    acc = _stash(ctx) if ctx.opset >= 21 else _acc_dtype(x.dtype)
    if acc.c is None:
        ctx.fail(f"stash_type {acc} has no native type")
    sp = list(x.shape[2:])
    view = (n, g, cg, *sp)
    mean, var = moments(lambda i: cast(acc, x[(i[0], i[1] * cg + i[2], *i[3:])]), view,
                        list(range(2, len(view))), acc, "gn")
    inv = _rsqrt_eps(var, float(ctx.attr("epsilon", 1e-5)), acc, "gn_inv")
    zi = (0,) * (len(view) - 2)

    def per_channel(p, ch):
        if p.shape[0] == c:
            return cast(acc, p[ch])
        if p.shape[0] == g:
            return cast(acc, p[ch // cg])
        ctx.fail(f"scale/bias of size {p.shape[0]} given, expected {c} (channels) or {g} (groups)")

    def body(b, ch, *s):
        k = (b, ch // cg, *zi)
        return cast(x.dtype, (cast(acc, x[(b, ch, *s)]) - mean[k]) * inv[k] * per_channel(scale, ch)
                    + per_channel(bias, ch))
    y = compute(x.shape, body, "groupnorm")
    ctx.schedule(_norm_schedule([y], 2, math.prod(x.shape)))
    return y


@lowering("LpNormalization")
def _lp_normalization_lower(ctx, x):
    p = int(ctx.attr("p", 2))
    if p not in (1, 2):
        ctx.fail(f"p must be 1 or 2, got {p}")
    acc = _acc_dtype(x.dtype)
    rank = len(x.shape)
    axis = normalize_axis(ctx, int(ctx.attr("axis", -1)), rank)
    keep = _keep_shape(x.shape, [axis])
    r = reduce_axis(x.shape[axis], "r")

    def s(*i):
        v = cast(acc, x[tuple(r if a == axis else i[a] for a in range(rank))])
        return sum_(_abs_pow(v, float(p)), r)
    tot = compute(keep, s, "lp_sum")
    norm = compute(keep, lambda *i: _root(tot[i], float(p)), "lp_norm")
    zero = const(0, acc)

    def body(*i):
        k = tuple(0 if a == axis else i[a] for a in range(rank))
        nv = norm[k]
        safe = select(nv.eq(zero), const(1, acc), nv)
        return cast(x.dtype, select(nv.eq(zero), zero, cast(acc, x[i]) / safe))
    y = compute(x.shape, body, "lpnorm")
    ctx.schedule(_norm_schedule([y], rank - 1 if axis == rank - 1 else 1, math.prod(x.shape)))
    return y


@lowering("MeanVarianceNormalization")
def _mvn_lower(ctx, x):
    from kiln.loops import sqrt
    acc = _acc_dtype(x.dtype)
    rank = len(x.shape)
    axes = sorted(normalize_axis(ctx, int(a), rank) for a in ctx.attr("axes", [0, 2, 3]))
    mean, var = moments(lambda i: cast(acc, x[tuple(i)]), x.shape, axes, acc, "mvn", centered=False)
    den = compute(var.shape, lambda *i: sqrt(var[i]) + const(1e-9, acc), "mvn_den")

    def body(*i):
        k = tuple(0 if a in axes else i[a] for a in range(rank))
        return cast(x.dtype, (cast(acc, x[i]) - mean[k]) / den[k])
    y = compute(x.shape, body, "mvn")
    ctx.schedule(_norm_schedule([y], 1, math.prod(x.shape)))
    return y


@lowering("LRN")
def _lrn_lower(ctx, x):
    from kiln.loops import pow_
    size = int(ctx.attr("size"))
    alpha, beta, bias = float(ctx.attr("alpha", 1e-4)), float(ctx.attr("beta", 0.75)), float(ctx.attr("bias", 1.0))
    acc = _acc_dtype(x.dtype)
    C = x.shape[1]
    k = reduce_axis(size, "k")
    lo = (size - 1) // 2

    def ss(n, c, *sp):
        cc = c - lo + k
        v = cast(acc, x[(n, min_(max_(cc, 0), C - 1), *sp)])
        return sum_(select((cc >= 0) & (cc < C), v * v, const(0, acc)), k)
    tot = compute(x.shape, ss, "lrn_sqsum")
    y = compute(x.shape, lambda *i: cast(x.dtype, cast(acc, x[i]) / pow_(
        const(bias, acc) + const(alpha / size, acc) * tot[i], const(beta, acc))), "lrn")
    ctx.schedule(_norm_schedule([y], 2, math.prod(x.shape) * size))
    return y


# ---------------------------------------------------------------- native: integer and transposed convolutions

def _first(t):
    """The single value of a scalar-like tensor (0-d, or one element)."""
    return t[(0,) * len(t.shape)]


def _per_channel(t, oc, n_oc):
    """A zero point / scale that is a scalar or one value per output channel."""
    if t is None:
        return None
    if len(t.shape) == 1 and t.shape[0] == n_oc and n_oc > 1:
        return t[oc]
    return _first(t)


@lowering("ConvInteger")
def _conv_integer_lower(ctx, x, w, xzp=None, wzp=None):
    group = int(ctx.attr("group", 1))
    geom = _conv_geom(ctx, x.shape, w.shape, group)
    i32 = DType.int32

    def xval(n, c, *sp):
        v = cast(i32, x[(n, c, *sp)])
        return v - cast(i32, _first(xzp)) if xzp is not None else v

    def wval(o, i, *k):
        v = cast(i32, w[(o, i, *k)])
        return v - cast(i32, _per_channel(wzp, o, w.shape[0])) if wzp is not None else v
    return conv_native(ctx, geom, xval, wval, i32, lambda a, o: a, i32)


@lowering("QLinearConv")
def _qlinear_conv_lower(ctx, x, xs, xzp, w, ws, wzp, ys, yzp=None, b=None):
    from kiln.loops import round_
    group = int(ctx.attr("group", 1))
    geom = _conv_geom(ctx, x.shape, w.shape, group)
    i32, f64 = DType.int32, DType.float64
    out_dt = ctx.out_dtype(0)
    m = w.shape[0]
    info = np.iinfo(out_dt.np)

    def xval(n, c, *sp):
        return cast(i32, x[(n, c, *sp)]) - cast(i32, _first(xzp))

    def wval(o, i, *k):
        return cast(i32, w[(o, i, *k)]) - cast(i32, _per_channel(wzp, o, m))

    def epilogue(a, o):
        v = cast(f64, a)
        if b is not None:
            v = v + cast(f64, b[o])
        scale = cast(f64, _first(xs)) * cast(f64, _per_channel(ws, o, m)) / cast(f64, _first(ys))
        v = round_(v * scale)
        if yzp is not None:
            v = v + cast(f64, _first(yzp))
        v = min_(max_(v, const(float(info.min), f64)), const(float(info.max), f64))
        return cast(out_dt, v)
    return conv_native(ctx, geom, xval, wval, i32, epilogue, out_dt)


@lowering("ConvTranspose")
def _conv_transpose_lower(ctx, x, w, b=None):
    group = int(ctx.attr("group", 1))
    n, c = x.shape[:2]
    nd = len(x.shape) - 2
    if w.shape[0] != c or c % group:
        ctx.fail(f"weight shape {tuple(w.shape)} expects {w.shape[0]} input channels, input has {c} (group {group})")
    kern = [int(k) for k in ctx.attr("kernel_shape", w.shape[2:])]
    ins = list(x.shape[2:])
    s = _int_list(ctx, "strides", nd, 1)
    d = _int_list(ctx, "dilations", nd, 1)
    begin = _transpose_geometry(ctx, ins, kern)[0]
    acc = _acc_dtype(x.dtype)
    cg, mg = c // group, w.shape[1]
    out_shape = ctx.out_shape(0)
    ic = reduce_axis(cg, "ic")
    ks = [reduce_axis(k, f"k{i}") for i, k in enumerate(kern)]

    def body(b_, m, *o):
        gi = m // mg
        conds, pos = [], []
        for i in range(nd):
            t = o[i] + begin[i] - ks[i] * d[i]
            conds += [t >= 0, t < ins[i] * s[i]] + ([(t % s[i]).eq(0)] if s[i] > 1 else [])
            pos.append(min_(max_(t // s[i], 0), ins[i] - 1))
        cin = gi * cg + ic
        v = cast(acc, x[(b_, cin, *pos)]) * cast(acc, w[(cin, m % mg, *ks)])
        return sum_(select(_conj(conds), v, const(0, acc)), [ic, *ks])
    tot = compute(out_shape, body, "convT")
    y = compute(out_shape, lambda b_, m, *o: cast(x.dtype, tot[(b_, m, *o)] + cast(acc, b[m]) if b is not None
                                                  else tot[(b_, m, *o)]), "convtranspose")
    work = math.prod(out_shape) * cg * math.prod(kern)
    ctx.schedule(_pool_schedule([tot], [y], nd, work))
    return y


# ---------------------------------------------------------------- native: CausalConvWithState, MaxUnpool, DeformConv

@lowering("CausalConvWithState")
def _causal_conv_lower(ctx, x, w, b=None, past=None):
    from kiln.loops import exp
    act = attr_str(ctx, "activation", "none")
    if act not in ("none", "silu", "swish"):
        ctx.fail(f"activation {act!r} is not one of 'none', 'silu', 'swish'")
    bsz, c, length = x.shape
    k = w.shape[2]
    if tuple(w.shape[:2]) != (c, 1):
        ctx.fail(f"weight shape {tuple(w.shape)} given, expected ({c}, 1, k)")
    if past is not None and tuple(past.shape) != (bsz, c, k - 1):
        ctx.fail(f"past_state shape {tuple(past.shape)} given, expected {(bsz, c, k - 1)}")
    acc = _acc_dtype(x.dtype)
    hist = k - 1

    def padded(n, ch, t):
        cur = x[n, ch, min_(max_(t - hist, 0), length - 1)]
        if past is None:
            old = const(0, x.dtype)
        else:
            old = past[n, ch, min_(max_(t, 0), max(hist - 1, 0))] if hist > 0 else const(0, x.dtype)
        return select(t < hist, old, cur) if hist > 0 else cur
    r = reduce_axis(k, "k")
    conv = compute((bsz, c, length), lambda n, ch, t: sum_(cast(acc, padded(n, ch, t + r)) * cast(acc, w[ch, 0, r]), r),
                   "causal_conv")

    def fin(n, ch, t):
        v = conv[n, ch, t]
        if b is not None:
            v = v + cast(acc, b[ch])
        if act != "none":
            v = v / (const(1, acc) + exp(-v))
        return cast(x.dtype, v)
    y = compute((bsz, c, length), fin, "causal_out")
    state = compute((bsz, c, hist), lambda n, ch, t: padded(n, ch, t + length), "present_state")
    ctx.schedule(_norm_schedule([y], 2, bsz * c * length * k))
    return [y, state]


@lowering("MaxUnpool")
def _max_unpool_lower(ctx, x, idx, out_shape=None):
    shape = _unpool_shape(ctx, tuple(x.shape))
    want = list(ctx.out_shape(0))
    total = math.prod(shape)
    n = math.prod(x.shape)
    dt = x.dtype.c
    if dt is None:
        ctx.fail(f"dtype {x.dtype} has no native type")
    out_n = math.prod(want)
    # a flat position of the default-shaped result, moved into the (cropped / zero-grown) output
    move = ["    int64_t rest = p, dst = 0, ok = 1;\n"]
    for d in reversed(range(len(shape))):
        move.append(f"    {{ int64_t c = rest % {shape[d]}; rest /= {shape[d]}; if (c >= {want[d]}) ok = 0; "
                    f"dst += c * {math.prod(want[d + 1:])}; }}\n")
    body = (f"  memset(out0, 0, {out_n}ULL * sizeof({dt}));\n"
            f"  for (int64_t i = 0; i < {n}; ++i) {{\n"
            f"    int64_t p = (int64_t)in1[i];\n"
            f"    if (p < -{total} || p >= {total}) KILN_FAIL(1, p);\n"
            f"    if (p < 0) p += {total};\n"
            + "".join(move) +
            "    if (ok) out0[dst] = in0[i];\n  }\n  return 0;\n")
    return ctx.extern(body, [x, idx, out_shape], [(tuple(want), x.dtype)],
                      errors={1: f"index {{value}} is out of range [-{total}, {total - 1}] of the unpooled output"})


@lowering("DeformConv")
def _deform_conv_lower(ctx, x, w, offset, b=None, mask=None):
    from kiln.loops import fabs, floor
    from kiln.lower.tensor import float_index
    if len(x.shape) != 4:
        ctx.fail(f"only 2-D DeformConv is supported, input has rank {len(x.shape)}")
    n, c, h, wd = x.shape
    m = w.shape[0]
    group, og = int(ctx.attr("group", 1)), int(ctx.attr("offset_group", 1))
    win = window(ctx, [h, wd], list(ctx.attr("kernel_shape", w.shape[2:])))
    kh, kw = win.kernel
    oh, ow = win.out
    kk = kh * kw
    if tuple(offset.shape) != (n, og * kk * 2, oh, ow):
        ctx.fail(f"offset shape {tuple(offset.shape)} given, expected {(n, og * kk * 2, oh, ow)}")
    if c % og or c != w.shape[1] * group:
        ctx.fail(f"channels {c} do not fit weight {tuple(w.shape)}, group {group}, offset_group {og}")
    f64 = DType.float64
    cg, mg, cog = c // group, m // group, c // og
    ic, r0, r1 = reduce_axis(cg, "ic"), reduce_axis(kh, "kh"), reduce_axis(kw, "kw")

    def body(b_, o, y, xo):
        cin = (o // mg) * cg + ic
        gofs = cin // cog
        tap = r0 * kw + r1
        ch = (gofs * kk + tap) * 2
        yy = cast(f64, y * win.strides[0] - win.begin[0] + r0 * win.dilations[0]) + cast(f64, offset[b_, ch, y, xo])
        xx = cast(f64, xo * win.strides[1] - win.begin[1] + r1 * win.dilations[1]) \
            + cast(f64, offset[b_, ch + 1, y, xo])
        y0, x0 = floor(yy), floor(xx)
        val = None
        for dy in (0, 1):
            for dx in (0, 1):
                yi, xi = y0 + const(float(dy), f64), x0 + const(float(dx), f64)
                wt = (const(1.0, f64) - fabs(yy - yi)) * (const(1.0, f64) - fabs(xx - xi))
                iy, ix = float_index(yi, -1, h), float_index(xi, -1, wd)   # NaN / huge offsets: -1 / h
                ok = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < wd)
                v = cast(f64, x[b_, cin, min_(max_(iy, 0), h - 1), min_(max_(ix, 0), wd - 1)])
                term = select(ok, v * wt, const(0.0, f64))
                val = term if val is None else val + term
        if mask is not None:
            val = val * cast(f64, mask[b_, gofs * kk + tap, y, xo])
        return sum_(val * cast(f64, w[o, ic, r0, r1]), [ic, r0, r1])
    tot = compute((n, m, oh, ow), body, "deform")
    y = compute((n, m, oh, ow), lambda b_, o, i, j: cast(x.dtype, tot[b_, o, i, j] + cast(f64, b[o]) if b is not None
                                                         else tot[b_, o, i, j]), "deform_conv")
    ctx.schedule(_pool_schedule([tot], [y], 2, n * m * oh * ow * cg * kk * 8))
    return y
