"""Resampling and geometry operators: Resize/Upsample, GridSample, AffineGrid, RoiAlign, Col2Im.

Resize is separable: each resized axis is resampled on its own by gathering
a few neighbours per output index and weighting them (nearest, linear, cubic,
antialiased filters), computed in float64 and cast back, as the ONNX
reference does. Source coordinates follow the ONNX spec formulas in
ONNX Runtime's float32 arithmetic, so nearest picks agree with it.

Their native lowerings live in kiln.lower.image.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.graph.types import TensorType
from kiln.ops.nn import attr_str, crop, scatter_windows, window
from kiln.ops.registry import OPAQUE, op
from kiln.ops.shapes import normalize_axes


# ---------------------------------------------------------------- Resize / Upsample


def _cast_back(y: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Saturating, rounding cast of a float64 result to the input's dtype."""
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return np.clip(np.rint(y), info.min, info.max).astype(dt)
    return y.astype(dt)


def _source_coords(ctm, out_len, in_len, scale, roi):
    """Input coordinate of each output index along one axis, and an out-of-roi mask.

    Float32 arithmetic in ONNX Runtime's operation order: nearest-neighbour
    picks at exact .5 / integer boundaries depend on it (e.g. 3 / 0.6f).
    """
    f = np.float32
    y = np.arange(out_len, dtype=f)
    scale, n_in, n_out = f(scale), f(in_len), f(out_len)
    if ctm in ("align_corners", "tf_crop_and_resize"):
        n_out = scale * n_in      # the ONNX test data use the unrounded length here (ORT does not)
    outside = None
    if ctm == "align_corners":
        x = np.zeros(out_len, f) if n_out == 1 else y * (n_in - 1) / (n_out - 1)
    elif ctm == "asymmetric":
        x = y / scale
    elif ctm == "tf_crop_and_resize":
        start, end = f(roi[0]), f(roi[1])
        if n_out == 1:
            x = np.full(out_len, f(0.5) * (start + end) * (n_in - 1), f)
        else:
            x = start * (n_in - 1) + (y * (end - start) * (n_in - 1)) / (n_out - 1)
        outside = (x < 0) | (x > n_in - 1)
    elif ctm == "pytorch_half_pixel":
        x = np.zeros(out_len, f) if out_len == 1 else (y + f(0.5)) / scale - f(0.5)
    elif ctm == "half_pixel":
        x = (y + f(0.5)) / scale - f(0.5)
    elif ctm == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / (scale * n_in))
        x = offset + (y + f(0.5)) / scale - f(0.5)
    elif ctm == "tf_half_pixel_for_nn":
        x = (y + f(0.5)) / scale
    else:
        raise ValueError(ctm)
    return x.astype(np.float64), outside


def _cubic(t, a):
    """Keys cubic kernel at distances t (any sign)."""
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _filter_weights(mode, ratio, scale, a, antialias):
    """(offsets from the base index, weights (out, taps)) of the linear/cubic filters.

    `ratio` in (0, 1] is the coordinate's distance past the base index. With
    antialias the filter is widened by 1/scale when downsampling.
    """
    s = min(scale, 1.0) if antialias else 1.0
    support = 1.0 if mode == "linear" else 2.0
    start = int(math.floor(-support / s)) + 1
    offs = np.arange(start, 2 - start)
    t = (offs[None, :] - ratio[:, None]) * s
    w = np.clip(1 - np.abs(t), 0, 1) if mode == "linear" else _cubic(t, a)
    if antialias:
        w = w / w.sum(axis=1, keepdims=True)
    return offs, w


def _axis_taps(in_len, out_len, scale, roi, p):
    """How one axis is resampled: per output index, input indices (out, taps) already
    clipped into range, their weights (None for nearest: one tap, weight 1) and the
    out-of-roi mask (tf_crop_and_resize; else None). Shared by the reference and the
    native kernel, which bakes these tables into its C source."""
    x, outside = _source_coords(p["ctm"], out_len, in_len, scale, roi)
    if p["mode"] == "nearest":
        nm = p["nearest_mode"]
        if nm == "simple":    # Resize-10 / Upsample: truncate up-sampling, ceil down-sampling
            nm = "ceil" if scale < 1 else "floor"
        r = {"round_prefer_floor": lambda v: np.ceil(v - 0.5), "round_prefer_ceil": lambda v: np.floor(v + 0.5),
             "floor": np.floor, "ceil": np.ceil}[nm](x)
        # a NaN coordinate (roi or scales holding NaN) would cast to INT_MIN: take element 0
        return np.clip(np.nan_to_num(r, nan=0.0), 0, in_len - 1).astype(np.intp)[:, None], None, outside
    base = np.ceil(x) - 1
    offs, w = _filter_weights(p["mode"], x - base, scale, p["a"], p["antialias"])
    idx = np.clip(np.nan_to_num(base, nan=0.0), -1 - offs.max(), in_len - offs.min())  # no cast overflow
    idx = idx[:, None].astype(np.int64) + offs[None, :]
    if p["exclude_outside"]:
        w = np.where((idx < 0) | (idx >= in_len), 0.0, w)
        tot = w.sum(axis=1, keepdims=True)
        w = w / np.where(tot == 0, 1.0, tot)
    return np.clip(idx, 0, in_len - 1).astype(np.intp), w, outside


def _resample_axis(data, axis, out_len, scale, roi, p):
    """Resample one axis of float64 `data` to `out_len` samples."""
    idx, w, outside = _axis_taps(data.shape[axis], out_len, scale, roi, p)
    if w is None:
        out = np.take(data, idx[:, 0], axis=axis)
    else:
        g = np.take(data, idx, axis=axis)
        out = (g * w.reshape((1,) * axis + w.shape + (1,) * (data.ndim - axis - 1))).sum(axis=axis + 1)
    if outside is not None and outside.any():
        mshape = (1,) * axis + (out_len,) + (1,) * (data.ndim - axis - 1)
        out = np.where(outside.reshape(mshape), p["extrapolation"], out)
    return out


def _resize_inputs(ctx, get):
    """(scales, sizes, roi) for any Resize/Upsample version; `get(i)` reads input i."""
    if ctx.node.op == "Upsample":
        sc = ctx.attr("scales", None) if ctx.opset < 9 else get(1)
        return sc, None, None
    if ctx.opset < 11:
        return get(1), None, None
    return get(2), get(3), get(1)


def _plan(ctx, shape, scales, sizes, roi):
    """Output shape and per-axis (scale, roi); symbolic input dims give symbolic outputs.

    Returns None when scales/sizes are unknown (inference without values).
    """
    r = len(shape)
    axes = ctx.attr("axes", None)
    axes = list(range(r)) if axes is None else normalize_axes(ctx, axes, r)
    scales = None if scales is None or np.size(scales) == 0 else [float(v) for v in np.asarray(scales).ravel()]
    sizes = None if sizes is None or np.size(sizes) == 0 else [int(v) for v in np.asarray(sizes).ravel()]
    if scales is None and sizes is None:
        return None
    n = len(axes)
    if len(scales or sizes) != n:
        what = "scales" if scales else "sizes"
        ctx.fail(f"{what} has {len(scales or sizes)} entries, expected {n} (one per resized axis)")
    roi = None if roi is None or np.size(roi) == 0 else [float(v) for v in np.asarray(roi).ravel()]
    if roi is not None and len(roi) != 2 * n:
        ctx.fail(f"roi has {len(roi)} entries, expected {2 * n}")
    out, per = list(shape), {}
    known = [isinstance(shape[a], int) for a in axes]       # symbols only at inference time
    if sizes is not None:
        policy = attr_str(ctx, "keep_aspect_ratio_policy", "stretch")
        if policy not in ("stretch", "not_larger", "not_smaller"):
            ctx.fail(f"keep_aspect_ratio_policy {policy!r} is not stretch, not_larger or not_smaller")
        fs = [sz / shape[a] if k else None for sz, a, k in zip(sizes, axes, known)]
        if policy != "stretch" and all(known):
            fs = [min(fs) if policy == "not_larger" else max(fs)] * n
            sizes = [int(fs[0] * shape[a] + 0.5) for a in axes]
        elif policy != "stretch":
            sizes = [ctx.new_dim() for _ in axes]
    else:
        fs = scales
        if any(s <= 0 for s in fs):
            ctx.fail(f"scales must be positive, got {fs}")
        sizes = [int(s * shape[a]) if k else shape[a] if s == 1 else ctx.new_dim()
                 for s, a, k in zip(fs, axes, known)]
    for i, a in enumerate(axes):
        out[a] = sizes[i]
        per[a] = (fs[i], None if roi is None else (roi[i], roi[n + i]))
    return out, per


def _params(ctx):
    mode = attr_str(ctx, "mode", "nearest").lower()
    mode = {"bilinear": "linear", "trilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    if mode not in ("nearest", "linear", "cubic"):
        ctx.fail(f"mode {mode!r} is not nearest, linear or cubic")
    old = ctx.node.op == "Upsample" or ctx.opset < 11
    return {
        "mode": mode,
        "ctm": "asymmetric" if old else attr_str(ctx, "coordinate_transformation_mode", "half_pixel"),
        "nearest_mode": "simple" if old else attr_str(ctx, "nearest_mode", "round_prefer_floor"),
        "a": float(ctx.attr("cubic_coeff_a", -0.75)),
        "antialias": bool(ctx.attr("antialias", 0)) and mode != "nearest",
        "exclude_outside": bool(ctx.attr("exclude_outside", 0)),
        "extrapolation": float(ctx.attr("extrapolation_value", 0.0)),
    }


def _resize_infer(ctx):
    t = ctx.tensor(0)
    if t.shape is None:
        return [t]
    scales, sizes, roi = _resize_inputs(ctx, ctx.value)
    plan = _plan(ctx, t.shape, scales, sizes, roi)
    return [TensorType(t.dtype, tuple(plan[0]) if plan else ctx.unknown_shape(len(t.shape)))]


def resize(ctx, x, *rest):
    """Resize (10 … 19) and Upsample (7, 9) reference."""
    scales, sizes, roi = _resize_inputs(ctx, lambda i: rest[i - 1] if i - 1 < len(rest) else None)
    plan = _plan(ctx, x.shape, scales, sizes, roi)
    if plan is None:
        ctx.fail("neither scales nor sizes given")
    p = _params(ctx)
    y = x.astype(np.float64)
    for a, out_len, s, axis_roi in _passes(ctx, plan, x.shape, p):
        y = _resample_axis(y, a, out_len, s, axis_roi, p)
    return _cast_back(y, x.dtype)


def _passes(ctx, plan, shape, p):
    """The separable passes, in order: (axis, output length, scale, roi) per resampled axis."""
    if p["ctm"] not in ("align_corners", "asymmetric", "tf_crop_and_resize", "pytorch_half_pixel",
                        "half_pixel", "half_pixel_symmetric", "tf_half_pixel_for_nn"):
        ctx.fail(f"unknown coordinate_transformation_mode {p['ctm']!r}")
    out = []
    for a, (s, axis_roi) in plan[1].items():
        out_len = plan[0][a]
        if p["ctm"] == "tf_crop_and_resize":
            axis_roi = axis_roi or (0.0, 1.0)
        elif math.isclose(s, 1.0) and out_len == shape[a]:
            continue
        out.append((a, out_len, s, axis_roi))
    return out


op("Resize", infer=_resize_infer, aliases=("Upsample",), fusion=OPAQUE)(resize)


# ---------------------------------------------------------------- GridSample


def _reflect(x, lo, hi):
    """Reflect coordinates at the borders until they fall inside [lo, hi]."""
    rng = hi - lo
    if rng <= 0:
        return np.full_like(x, lo)
    below, above = x < lo, x > hi
    d = np.where(below, lo - x, x - hi)
    k = np.floor(d / rng)
    r = d - k * rng
    even = k % 2 == 0
    fb = np.where(even, lo + r, hi - r)
    fa = np.where(even, hi - r, lo + r)
    return np.where(below, fb, np.where(above, fa, x))


def _grid_infer(ctx):
    xs, gs = ctx.shape(0), ctx.shape(1)
    if xs is None or gs is None:
        return [TensorType(ctx.dtype(0), None)]
    if len(gs) != len(xs) or (isinstance(gs[-1], int) and gs[-1] != len(xs) - 2):
        ctx.fail(f"grid shape {tuple(gs)} does not fit input rank {len(xs)}: expected (N, *out, {len(xs) - 2})")
    return [TensorType(ctx.dtype(0), (xs[0], xs[1], *gs[1:-1]))]


def _grid_attrs(ctx):
    """GridSample's (mode, padding_mode, align_corners), with opset-16 mode names mapped."""
    mode = attr_str(ctx, "mode", "linear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    pad = attr_str(ctx, "padding_mode", "zeros")
    if mode not in ("nearest", "linear", "cubic") or pad not in ("zeros", "border", "reflection"):
        ctx.fail(f"unsupported mode {mode!r} / padding_mode {pad!r}")
    return mode, pad, bool(ctx.attr("align_corners", 0))


@op("GridSample", infer=_grid_infer, fusion=OPAQUE)
def grid_sample(ctx, x, grid):
    """Sample X at normalized grid points: nearest / (multi)linear / cubic with zeros, border or reflection padding."""
    mode, pad, align = _grid_attrs(ctx)
    n, c = x.shape[:2]
    dims = x.shape[2:]
    nd = len(dims)
    out_sp = grid.shape[1:-1]
    g = grid.astype(np.float64).reshape(n, -1, nd)[..., ::-1]          # per spatial dim, x last in grid
    coords, bounds = [], []
    for i, L in enumerate(dims):
        v = g[..., i]
        v = (v + 1) / 2 * (L - 1) if align else ((v + 1) * L - 1) / 2
        lo, hi = (0.0, L - 1.0) if align else (-0.5, L - 0.5)
        if mode == "nearest":
            v = np.rint(v)
        if pad == "border" and mode != "cubic":   # cubic clamps each tap instead (PyTorch, ORT)
            v = np.where((v < lo) | (v > hi), np.clip(v, 0, L - 1), v)
        elif pad == "reflection":
            v = _reflect(v, lo, hi)
        coords.append(v)
        bounds.append((lo, hi))
    taps = []                          # per dim: list of (index array, weight array)
    for v in coords:
        if mode == "nearest":
            taps.append([(v, np.ones_like(v))])
            continue
        f = np.floor(v)
        t = v - f
        if mode == "linear":
            taps.append([(f, 1 - t), (f + 1, t)])
        else:
            taps.append([(f + o, _cubic(t - o, -0.75)) for o in (-1, 0, 1, 2)])
    flat = x.reshape(n, c, -1)
    out = np.zeros((n, c, g.shape[1]))
    for combo in np.ndindex(*[len(tp) for tp in taps]):
        lin = np.zeros(g.shape[:2], np.int64)
        wt = np.ones(g.shape[:2])
        for i, k in enumerate(combo):
            idx, w = taps[i][k]
            L = dims[i]
            if pad == "zeros":
                wt = wt * ((idx >= 0) & (idx < L))
            elif pad == "border":
                idx = np.clip(idx, 0, L - 1)
            else:
                idx = _reflect(idx, *bounds[i]).astype(np.int64)   # truncates, as the reference does
            lin = lin * L + np.clip(np.nan_to_num(idx, nan=0.0), 0, L - 1).astype(np.int64)  # NaN: 0
            wt = wt * w
        vals = np.take_along_axis(flat, lin[:, None, :].repeat(c, axis=1), axis=2)
        out += vals * wt[:, None, :]
    return out.reshape((n, c) + tuple(out_sp)).astype(x.dtype)


# ---------------------------------------------------------------- AffineGrid


def _affine_infer(ctx):
    size = ctx.value(1)
    t = ctx.dtype(0)
    if size is not None:
        sz = [int(v) for v in size]
        return [TensorType(t, (sz[0], *sz[2:], len(sz) - 2))]
    ss = ctx.shape(1)
    nd = ss[0] - 2 if ss is not None and isinstance(ss[0], int) else None
    return [TensorType(t, None if nd is None else (*ctx.unknown_shape(nd + 1), nd))]


@op("AffineGrid", infer=_affine_infer, fusion=OPAQUE)
def affine_grid(ctx, theta, size):
    """Normalized sampling grid (N, *spatial, nd) = base coordinates @ theta^T."""
    sz = [int(v) for v in size]
    n, sp = sz[0], sz[2:]
    nd = len(sp)
    if theta.shape != (n, nd, nd + 1):
        ctx.fail(f"theta shape {theta.shape} given, expected {(n, nd, nd + 1)} for size {sz}")
    align = bool(ctx.attr("align_corners", 0))
    lines = [np.linspace(-1, 1, L) if align else (np.arange(L) * 2 + 1) / L - 1 for L in sp]
    mesh = np.meshgrid(*lines, indexing="ij")
    base = np.stack([m for m in mesh[::-1]] + [np.ones(sp)], axis=-1).reshape(-1, nd + 1)   # x, y, (z), 1
    grid = np.einsum("pk,njk->npj", base, theta.astype(np.float64))
    return grid.reshape((n, *sp, nd)).astype(theta.dtype)


# ---------------------------------------------------------------- RoiAlign


def _roi_infer(ctx):
    xs, rs = ctx.shape(0), ctx.shape(1)
    if xs is not None and len(xs) != 4:
        ctx.fail(f"input must be rank 4 (N, C, H, W), got rank {len(xs)}")
    r = rs[0] if rs is not None else ctx.new_dim()
    c = xs[1] if xs is not None else ctx.new_dim()
    return [TensorType(ctx.dtype(0), (r, c, int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1))))]


def _roi_axis(start, length, bins, grid, size):
    """Sample positions along one axis of a roi: low/high indices, weights, validity."""
    pos = start + (np.arange(bins)[:, None] + (np.arange(grid)[None, :] + 0.5) / grid) * (length / bins)
    valid = (pos >= -1.0) & (pos <= size)
    pos = np.maximum(pos, 0)
    low = np.floor(pos).astype(np.int64)
    edge = low >= size - 1
    low = np.where(edge, size - 1, low)
    high = np.where(edge, size - 1, low + 1)
    frac = np.where(edge, 0.0, pos - low)
    return low, high, (1 - frac) * valid, frac * valid


@op("RoiAlign", infer=_roi_infer, fusion=OPAQUE)
def roi_align(ctx, x, rois, batch_indices):
    """Average or max of bilinear samples on a regular grid inside each roi bin."""
    mode = attr_str(ctx, "mode", "avg")
    ph, pw = int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1))
    ratio = int(ctx.attr("sampling_ratio", 0))
    scale = float(ctx.attr("spatial_scale", 1.0))
    half = attr_str(ctx, "coordinate_transformation_mode", "half_pixel" if ctx.opset >= 16 else "output_half_pixel")
    offset = 0.5 if half == "half_pixel" else 0.0
    _, c, h, w = x.shape
    xd = x.astype(np.float64)
    out = np.zeros((rois.shape[0], c, ph, pw))
    for r, (box, b) in enumerate(zip(rois.astype(np.float64), batch_indices)):
        x0, y0, x1, y1 = box * scale - offset
        rw, rh = x1 - x0, y1 - y0
        if offset == 0.0:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        gh = ratio if ratio > 0 else np.ceil(rh / ph)
        gw = ratio if ratio > 0 else np.ceil(rw / pw)
        if not (gh <= _ROI_GRID_MAX and gw <= _ROI_GRID_MAX):
            ctx.fail(f"roi {r} is too large or not finite: more than {_ROI_GRID_MAX} samples per bin side")
        if not 0 <= int(b) < x.shape[0]:
            ctx.fail(f"batch_indices value {int(b)} is out of range [0, {x.shape[0] - 1}]")
        gh, gw = max(int(gh), 0), max(int(gw), 0)
        ylo, yhi, wyl, wyh = _roi_axis(y0, rh, ph, gh, h)          # (ph, gh)
        xlo, xhi, wxl, wxh = _roi_axis(x0, rw, pw, gw, w)          # (pw, gw)
        img = xd[int(b)]
        terms = [img[:, yi[:, :, None, None], xi[None, None]] * (wy[:, :, None, None] * wx[None, None])
                 for yi, wy in ((ylo, wyl), (yhi, wyh)) for xi, wx in ((xlo, wxl), (xhi, wxh))]
        if mode == "avg":
            out[r] = sum(terms).sum(axis=(2, 4)) / max(gh * gw, 1)
        elif mode == "max":
            out[r] = np.max(terms, axis=0).max(axis=(2, 4))
        else:
            ctx.fail(f"mode {mode!r} is not avg or max")
    return out.astype(x.dtype)


# ---------------------------------------------------------------- Col2Im


def _col2im_infer(ctx):
    xs = ctx.shape(0)
    img, blk = ctx.value(1), ctx.value(2)
    if xs is None:
        return [TensorType(ctx.dtype(0), None)]
    nd = ctx.shape(1)[0] if ctx.shape(1) is not None else None
    c = ctx.new_dim()
    if blk is not None and isinstance(xs[1], int):
        k = math.prod(int(v) for v in blk)
        if xs[1] % k:
            ctx.fail(f"input dim 1 = {xs[1]} is not a multiple of the block size {k}")
        c = xs[1] // k
    sp = [int(v) for v in img] if img is not None else ctx.unknown_shape(nd) if isinstance(nd, int) else None
    return [TensorType(ctx.dtype(0), None if sp is None else (xs[0], c, *sp))]


@op("Col2Im", infer=_col2im_infer, fusion=OPAQUE)
def col2im(ctx, x, image_shape, block_shape):
    """Sum sliding blocks (N, C*prod(block), L) back into an image (N, C, *image_shape)."""
    img = [int(v) for v in image_shape]
    blk = [int(v) for v in block_shape]
    win = window(ctx, img, blk)
    n = x.shape[0]
    k = math.prod(blk)
    if x.shape[1] % k or x.shape[2] != math.prod(win.out):
        ctx.fail(f"input shape {x.shape} does not fit blocks {blk} over image {img}: "
                 f"expected dim 1 a multiple of {k} and {math.prod(win.out)} blocks")
    cols = x.reshape((n, x.shape[1] // k, *blk, *win.out))
    full = [i + b + e for i, b, e in zip(img, win.begin, win.end)]
    return crop(scatter_windows(cols, full, win.strides, win.dilations), win.begin, img).astype(x.dtype)


_ROI_GRID_MAX = 1 << 16   # samples per output bin side (a bound against NaN / huge rois)
