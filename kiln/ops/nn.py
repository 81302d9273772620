"""Convolution, pooling and normalization operators (ONNX opsets 1 … latest).

Every sliding-window op shares one geometry helper (`window`: strides,
dilations, pads, auto_pad, ceil_mode → pads and output sizes) and one strided
window view (`windows`), so Conv, ConvTranspose, the pools and Col2Im agree on
output-size arithmetic. Convolutions are im2col + batched matmul, never
per-pixel Python loops, because whole CNNs run through these references.
Half-precision inputs are computed in float32 and cast back.

Their native lowerings (compute definitions and schedules for the cpu target) live
in kiln.lower.conv, kiln.lower.conv_window, kiln.lower.pool and kiln.lower.norm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.registry import OPAQUE, OUT_FUSABLE, REDUCTION, op, same_as
from kiln.ops.shapes import expect_shape, normalize_axis, require_nonempty

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


@op("Conv", infer=_conv_infer(), fusion=OUT_FUSABLE)
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


@op("ConvInteger", infer=_conv_infer(lambda ctx: DType.int32, bi=None, per_channel=((3, "w_zero_point"),)), fusion=OPAQUE)
def conv_integer(ctx, x, w, xzp=None, wzp=None):
    return np.rint(_int_conv(ctx, x, xzp, w, wzp)).astype(np.int32)


def _qlinear_dtype(ctx):
    return ctx.dtype(7) if ctx.has_input(7) else ctx.dtype(0)


@op("QLinearConv", infer=_conv_infer(_qlinear_dtype, xi=0, wi=3, bi=8,
                                      per_channel=((4, "w_scale"), (5, "w_zero_point"))), fusion=OPAQUE)
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


@op("ConvTranspose", infer=_conv_transpose_infer, fusion=OUT_FUSABLE)
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
    wm = wc.reshape(group, c // group, math.prod(w.shape[1:])).transpose(0, 2, 1)   # g, M/g*K, C/g
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


@op("DeformConv", infer=_conv_infer(bi=3), fusion=OPAQUE)
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


@op("CausalConvWithState", infer=_causal_infer, fusion=OPAQUE)
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


@op("AveragePool", infer=_pool_infer(), fusion=OPAQUE)
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


@op("MaxPool", infer=_pool_infer(extra_int64=True), fusion=OPAQUE)
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


@op("LpPool", infer=_pool_infer(), fusion=OPAQUE)
def lp_pool(ctx, x):
    p = _lp_p(ctx)
    xc = compute_dtype(x)
    s = _sum_windows(np.abs(xc) ** p, _pool_window(ctx, x), x.ndim - 2)
    return (s ** (1.0 / p)).astype(x.dtype)


def _global_infer(ctx):
    xs = ctx.shape(0)
    _rank_check(ctx, xs)
    require_nonempty(ctx, xs, range(2, len(xs or ())), "pooling")
    return [TensorType(ctx.dtype(0), None if xs is None else (*xs[:2], *[1] * (len(xs) - 2)))]


def _global(fn):
    def run(ctx, x):
        require_nonempty(ctx, x.shape, range(2, x.ndim), "pooling")
        return np.asarray(fn(ctx, compute_dtype(x), tuple(range(2, x.ndim)))).astype(x.dtype)
    return run


op("GlobalAveragePool", infer=_global_infer, fusion=REDUCTION)(_global(lambda ctx, x, ax: x.mean(axis=ax, keepdims=True)))
op("GlobalMaxPool", infer=_global_infer, fusion=REDUCTION)(_global(lambda ctx, x, ax: x.max(axis=ax, keepdims=True)))
op("GlobalLpPool", infer=_global_infer, fusion=OPAQUE)(
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


@op("MaxUnpool", infer=_max_unpool_infer, fusion=OPAQUE)
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


@op("BatchNormalization", infer=_batchnorm_infer, fusion=OPAQUE)
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


@op("InstanceNormalization", infer=_instance_norm_infer, fusion=OPAQUE)
def instance_norm(ctx, x, scale, bias):
    xc = compute_dtype(x)
    xn = _normalize(xc, tuple(range(2, x.ndim)), float(ctx.attr("epsilon", 1e-5)))[2]
    return (xn * chan(compute_dtype(scale), x.ndim) + chan(compute_dtype(bias), x.ndim)).astype(x.dtype)


def _stash(ctx):
    return DType.from_onnx(int(ctx.attr("stash_type", 1)))


def norm_dtype(ctx, x_dtype) -> DType:
    """The precision LayerNorm, RMSNorm and GroupNorm (opset 21) compute in: their stash_type,
    or the input's own float type where that is wider. stash_type is the precision of the
    statistics the spec asks for at least; a double input normalised in float32 (the default
    stash_type) would be float32-accurate only, while ONNX Runtime and onnx.reference compute
    it in double, and two float32 orders of summation (kiln's reference, its native code)
    differ by ulps of float32, far outside double's tolerance. Mean and InvStdDev still have
    the stash_type dtype."""
    stash, x = _stash(ctx), DType.from_numpy(np.dtype(x_dtype)) if not isinstance(x_dtype, DType) else x_dtype
    return x if x.is_float and x.itemsize > stash.itemsize else stash


def _layer_norm_infer(ctx):
    t = ctx.tensor(0)
    if t.shape is None:
        stat = None
    else:
        axis = normalize_axis(ctx, int(ctx.attr("axis", -1)), len(t.shape))
        stat = tuple(t.shape[:axis]) + (1,) * (len(t.shape) - axis)
    u = _stash(ctx)
    return [t, TensorType(u, stat), TensorType(u, stat)]


@op("LayerNormalization", infer=_layer_norm_infer, fusion=REDUCTION)
def layer_norm(ctx, x, scale, bias=None):
    axis = normalize_axis(ctx, int(ctx.attr("axis", -1)), x.ndim)
    xc = x.astype(norm_dtype(ctx, x.dtype).np)
    mean, var, xn = _normalize(xc, tuple(range(axis, x.ndim)), float(ctx.attr("epsilon", 1e-5)))
    y = xn * scale.astype(xc.dtype)
    if bias is not None:
        y = y + bias.astype(xc.dtype)
    inv = 1 / np.sqrt(var + float(ctx.attr("epsilon", 1e-5)))
    stash = _stash(ctx).np
    return y.astype(x.dtype), mean.astype(stash), inv.astype(stash)


def _rms_infer(ctx):
    t = ctx.tensor(0)
    return [TensorType(ctx.dtype(1), t.shape)]


@op("RMSNormalization", infer=_rms_infer, fusion=REDUCTION)
def rms_norm(ctx, x, scale):
    axis = normalize_axis(ctx, int(ctx.attr("axis", -1)), x.ndim)
    xc = x.astype(norm_dtype(ctx, x.dtype).np)
    ms = (xc * xc).mean(axis=tuple(range(axis, x.ndim)), keepdims=True)
    y = xc / np.sqrt(ms + float(ctx.attr("epsilon", 1e-5))) * scale.astype(xc.dtype)
    return y.astype(scale.dtype)


@op("GroupNormalization", infer=same_as(0), fusion=OPAQUE)
def group_norm(ctx, x, scale, bias):
    """Statistics per (batch, group); scale/bias per group (opset 18) or per channel (21)."""
    g = int(ctx.attr("num_groups"))
    n, c = x.shape[:2]
    if c % g:
        ctx.fail(f"channels {c} not divisible by num_groups {g}")
    xc = x.astype(norm_dtype(ctx, x.dtype).np) if ctx.opset >= 21 else compute_dtype(x)
    xn = _normalize(xc.reshape(n, g, c // g * math.prod(x.shape[2:])), (2,), float(ctx.attr("epsilon", 1e-5)))[2].reshape(x.shape)

    def per_channel(p):
        p = compute_dtype(p)
        if p.size == c:
            return p
        if p.size == g:
            return np.repeat(p, c // g)
        ctx.fail(f"scale/bias of size {p.size} given, expected {c} (channels) or {g} (groups)")
    return (xn * chan(per_channel(scale), x.ndim) + chan(per_channel(bias), x.ndim)).astype(x.dtype)


@op("LRN", infer=same_as(0), fusion=OPAQUE)
def lrn(ctx, x):
    """Local response normalization across channels."""
    size = int(ctx.attr("size"))
    alpha, beta, bias = float(ctx.attr("alpha", 1e-4)), float(ctx.attr("beta", 0.75)), float(ctx.attr("bias", 1.0))
    xc = compute_dtype(x)
    if x.size == 0:   # no channel (or nothing else): no window to slide
        return x.copy()
    sq = np.pad(xc * xc, [(0, 0), ((size - 1) // 2, size // 2)] + [(0, 0)] * (x.ndim - 2))
    ssum = np.lib.stride_tricks.sliding_window_view(sq, size, axis=1).sum(axis=-1)
    return (xc / (bias + alpha / size * ssum) ** beta).astype(x.dtype)


@op("LpNormalization", infer=same_as(0), fusion=OPAQUE)
def lp_normalization(ctx, x):
    p = int(ctx.attr("p", 2))
    if p not in (1, 2):
        ctx.fail(f"p must be 1 or 2, got {p}")
    xc = compute_dtype(x)
    axis = normalize_axis(ctx, int(ctx.attr("axis", -1)), x.ndim)
    norm = (np.abs(xc) ** p).sum(axis=axis, keepdims=True) ** (1.0 / p)
    safe = np.where(norm == 0, 1, norm)
    return np.where(norm == 0, 0, xc / safe).astype(x.dtype)


@op("MeanVarianceNormalization", infer=same_as(0), fusion=OPAQUE)
def mean_variance_normalization(ctx, x):
    axes = tuple(int(a) for a in ctx.attr("axes", [0, 2, 3]))
    xc = compute_dtype(x)
    mean = xc.mean(axis=axes, keepdims=True)
    var = (xc * xc).mean(axis=axes, keepdims=True) - mean * mean
    return ((xc - mean) / (np.sqrt(var) + 1e-9)).astype(x.dtype)
