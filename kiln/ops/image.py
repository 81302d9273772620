"""Resampling and geometry operators: Resize/Upsample, GridSample, AffineGrid, RoiAlign, Col2Im.

Resize is separable: each resized axis is resampled on its own by gathering
a few neighbours per output index and weighting them (nearest, linear, cubic,
antialiased filters), computed in float64 and cast back, as the ONNX
reference does. Source coordinates follow the ONNX spec formulas in
ONNX Runtime's float32 arithmetic, so nearest picks agree with it.

Native lowerings (below): Resize/Upsample is a C kernel whose per-axis tap
tables (`_axis_taps`, shared with the reference) are computed at compile time
and baked into the source; RoiAlign is a C kernel (its sample counts depend on
the boxes); Col2Im, AffineGrid and GridSample are compute definitions.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.graph.types import TensorType
from kiln.ops.nn import attr_str, crop, scatter_windows, window
from kiln.ops.registry import op
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


op("Resize", infer=_resize_infer, aliases=("Upsample",))(resize)


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


@op("GridSample", infer=_grid_infer)
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


@op("AffineGrid", infer=_affine_infer)
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


@op("RoiAlign", infer=_roi_infer)
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


@op("Col2Im", infer=_col2im_infer)
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


# ================================================================ native lowerings (cpu target)

from kiln.dtypes import DType  # noqa: E402
from kiln.ops.registry import lowering  # noqa: E402


def c_double(v: float) -> str:
    """A C literal for a double (hex, exact)."""
    v = float(v)
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    return v.hex()


def c_table(name: str, ctype: str, values) -> str:
    vals = list(values)
    lits = [c_double(v) if ctype == "double" else str(int(v)) for v in vals] or ["0"]
    rows = [", ".join(lits[i:i + 16]) for i in range(0, len(lits), 16)]
    return f"  static const {ctype} {name}[{max(len(vals), 1)}] = {{\n    " + ",\n    ".join(rows) + "};\n"


def c_store_cast(dt: DType, expr: str) -> str:
    """C expression converting double `expr` to dtype `dt` as `_cast_back` does."""
    if dt.is_float:
        return f"({dt.c})({expr})"
    info = np.iinfo(dt.np)
    lo, hi = c_double(float(info.min)), c_double(float(info.max))
    return f"({dt.c})fmin(fmax(rint({expr}), {lo}), {hi})"


def _resize_value_getter(ctx, p):
    def get(i):
        if not ctx.has_input(i):
            return None
        v = ctx.value(i)
        if v is not None:
            return v
        t = ctx.input_types[i]
        if t is not None and t.shape is not None and math.prod(t.shape) == 0:
            return np.zeros(0, np.float32)
        is_roi = ctx.node.op == "Resize" and ctx.opset >= 11 and i == 1
        if is_roi and p["ctm"] != "tf_crop_and_resize":
            return None
        what = {1: "roi" if is_roi else "scales", 2: "scales", 3: "sizes"}.get(i, f"input {i}")
        ctx.fail(f"{ctx.node.op} needs its {what} known at compile time for native code "
                 f"(input {i} is computed at run time)")
    return get


def _resize_lower(ctx, x, *rest):
    p = _params(ctx)
    scales, sizes, roi = _resize_inputs(ctx, _resize_value_getter(ctx, p))
    plan = _plan(ctx, list(x.shape), scales, sizes, roi)
    if plan is None:
        ctx.fail("neither scales nor sizes given")
    shape = list(x.shape)
    if [int(v) for v in plan[0]] != list(ctx.out_shape(0)):
        ctx.fail(f"resize plan gives shape {plan[0]}, inference says {ctx.out_shape(0)}")
    n_in = math.prod(shape)
    body = [f"  const int64_t n0 = {n_in};\n",
            f"  double* cur = (double*)malloc((size_t)(n0 > 0 ? n0 : 1) * sizeof(double));\n",
            "  if (!cur) return -1;\n",
            "  for (int64_t i = 0; i < n0; ++i) cur[i] = (double)in0[i];\n"]
    for k, (a, out_len, s, axis_roi) in enumerate(_passes(ctx, plan, shape, p)):
        in_len = shape[a]
        idx, w, outside = _axis_taps(in_len, out_len, s, axis_roi, p)
        taps = idx.shape[1]
        outer, inner = math.prod(shape[:a]), math.prod(shape[a + 1:])
        shape[a] = out_len
        n_out = math.prod(shape)
        body.append(c_table(f"I{k}", "int64_t", idx.ravel()))
        if w is not None:
            body.append(c_table(f"W{k}", "double", w.ravel()))
        has_out = outside is not None and bool(outside.any())
        if has_out:
            body.append(c_table(f"O{k}", "uint8_t", outside.astype(np.uint8)))
        if w is None:
            val = f"cur[(o * {in_len} + I{k}[j]) * {inner} + i]"
        else:
            terms = [f"W{k}[j * {taps} + {t}] * cur[(o * {in_len} + I{k}[j * {taps} + {t}]) * {inner} + i]"
                     for t in range(taps)]
            val = " + ".join(terms) if taps <= 8 else None
        if has_out:
            ext = c_double(p["extrapolation"])
        body.append(f"  {{ double* nxt = (double*)malloc((size_t){max(n_out, 1)} * sizeof(double));\n"
                    f"  if (!nxt) {{ free(cur); return -1; }}\n"
                    + ("  #pragma omp parallel for schedule(static)\n" if n_out * taps >= 1 << 15 else "")
                    + f"  for (int64_t oj = 0; oj < {outer * out_len}; ++oj) {{\n"
                    f"    const int64_t o = oj / {out_len}, j = oj % {out_len};\n"
                    f"    double* dst = nxt + oj * {inner};\n"
                    f"    for (int64_t i = 0; i < {inner}; ++i) {{\n")
        if val is None:
            body.append(f"      double acc = 0.0;\n"
                        f"      for (int64_t t = 0; t < {taps}; ++t)\n"
                        f"        acc += W{k}[j * {taps} + t]\n"
                        f"               * cur[(o * {in_len} + I{k}[j * {taps} + t]) * {inner} + i];\n")
            val = "acc"
        if has_out:
            val = f"(O{k}[j] ? {ext} : ({val}))"
        body.append(f"      dst[i] = {val};\n    }}\n  }}\n  free(cur); cur = nxt; }}\n")
    body.append(f"  for (int64_t i = 0; i < {math.prod(shape)}; ++i) out0[i] = {c_store_cast(x.dtype, 'cur[i]')};\n"
                "  free(cur);\n  return 0;\n")
    if x.dtype.c is None:
        ctx.fail(f"dtype {x.dtype} has no native type")
    return ctx.extern("".join(body), [x, *rest], [(ctx.out_shape(0), ctx.out_dtype(0))])


lowering("Resize")(_resize_lower)
lowering("Upsample")(_resize_lower)


@lowering("Col2Im")
def _col2im_lower(ctx, x, image_shape, block_shape):
    from kiln.loops import compute, const, max_, min_, reduce_axis, select, sum_
    from kiln.ops.nn import _conj, _pool_schedule
    img_v, blk_v = ctx.value(1), ctx.value(2)
    if img_v is None or blk_v is None:
        ctx.fail("Col2Im needs image_shape and block_shape known at compile time for native code")
    img = [int(v) for v in img_v]
    blk = [int(v) for v in blk_v]
    win = window(ctx, img, blk)
    n = x.shape[0]
    k = math.prod(blk)
    nd = len(img)
    if x.shape[1] % k or x.shape[2] != math.prod(win.out):
        ctx.fail(f"input shape {tuple(x.shape)} does not fit blocks {blk} over image {img}: "
                 f"expected dim 1 a multiple of {k} and {math.prod(win.out)} blocks")
    c = x.shape[1] // k
    ks = [reduce_axis(b, f"k{i}") for i, b in enumerate(blk)]
    kstr = [math.prod(blk[i + 1:]) for i in range(nd)]
    ostr = [math.prod(win.out[i + 1:]) for i in range(nd)]

    def body(b_, ch, *p):
        conds, lin = [], None
        for i in range(nd):
            t = p[i] + win.begin[i] - ks[i] * win.dilations[i]
            conds += [t >= 0, t < win.out[i] * win.strides[i]] + ([(t % win.strides[i]).eq(0)]
                                                                  if win.strides[i] > 1 else [])
            o = min_(max_(t // win.strides[i], 0), win.out[i] - 1)
            lin = o * ostr[i] if lin is None else lin + o * ostr[i]
        kl = sum(kv * st for kv, st in zip(ks, kstr))
        return sum_(select(_conj(conds), x[b_, ch * k + kl, lin], const(0, x.dtype)), ks)
    y = compute((n, c, *img), body, "col2im")
    ctx.schedule(_pool_schedule([y], [], nd, n * c * math.prod(img) * k))
    return y


@lowering("AffineGrid")
def _affine_grid_lower(ctx, theta, size):
    from kiln.loops import cast, compute, const, select, sum_, reduce_axis
    sz_v = ctx.value(1)
    if sz_v is None:
        ctx.fail("AffineGrid needs its size known at compile time for native code")
    sz = [int(v) for v in sz_v]
    n, sp = sz[0], sz[2:]
    nd = len(sp)
    if tuple(theta.shape) != (n, nd, nd + 1):
        ctx.fail(f"theta shape {tuple(theta.shape)} given, expected {(n, nd, nd + 1)} for size {sz}")
    align = bool(ctx.attr("align_corners", 0))
    f64 = DType.float64

    def coord(i, L):
        fi = cast(f64, i)
        if align:
            if L == 1:
                return const(-1.0, f64)
            v = fi * const(2.0 / (L - 1), f64) + const(-1.0, f64)
            return select(i.eq(L - 1), const(1.0, f64), v)
        return (fi * const(2.0, f64) + const(1.0, f64)) / const(float(L), f64) - const(1.0, f64)

    def body(b, *rest):
        pos, j = rest[:nd], rest[nd]
        base = [coord(pos[d], sp[d]) for d in reversed(range(nd))] + [const(1.0, f64)]
        tot = None
        for kk, bv in enumerate(base):
            term = bv * cast(f64, theta[b, j, kk])
            tot = term if tot is None else tot + term
        return cast(theta.dtype, tot)
    del sum_, reduce_axis
    return compute((n, *sp, nd), body, "affine_grid")


def _reflect_expr(v, lo: float, hi: float):
    """Expr form of `_reflect` (float64)."""
    from kiln.loops import const, floor, fmod, select
    dt = v.dtype
    rng = hi - lo
    if rng <= 0:
        return const(lo, dt)
    below, above = v < const(lo, dt), v > const(hi, dt)
    d = select(below, const(lo, dt) - v, v - const(hi, dt))
    k = floor(d / const(rng, dt))
    r = d - k * const(rng, dt)
    even = fmod(k, const(2.0, dt)).eq(const(0.0, dt))
    fb = select(even, const(lo, dt) + r, const(hi, dt) - r)
    fa = select(even, const(hi, dt) - r, const(lo, dt) + r)
    return select(below, fb, select(above, fa, v))


def _cubic_expr(t, a: float):
    from kiln.loops import const, fabs, select
    dt = t.dtype
    t = fabs(t)
    A = const(a, dt)
    near = ((A + const(2.0, dt)) * t - (A + const(3.0, dt))) * t * t + const(1.0, dt)
    far = ((A * t - const(5.0, dt) * A) * t + const(8.0, dt) * A) * t - const(4.0, dt) * A
    return select(t <= const(1.0, dt), near, select(t < const(2.0, dt), far, const(0.0, dt)))


@lowering("GridSample")
def _grid_sample_lower(ctx, x, grid):
    import itertools
    from kiln.loops import cast, compute, const, floor, max_, min_, round_, select
    from kiln.ops.tensor import float_index
    mode, pad, align = _grid_attrs(ctx)
    n, c = x.shape[:2]
    dims = list(x.shape[2:])
    nd = len(dims)
    out_sp = list(grid.shape[1:-1])
    f64 = DType.float64
    one, zero = const(1.0, f64), const(0.0, f64)

    def clip(v, lo, hi):
        return min_(max_(v, const(lo, v.dtype)), const(hi, v.dtype))

    def coord(b, *rest):
        """The sampling coordinate along spatial dim i, after unnormalizing, rounding and padding."""
        o, i = rest[:-1], rest[-1]
        out = None
        for d, L in enumerate(dims):          # dim d reads grid component nd - 1 - d
            v = cast(f64, grid[(b, *o, nd - 1 - d)])
            v = (v + one) / const(2.0, f64) * const(L - 1.0, f64) if align else \
                ((v + one) * const(float(L), f64) - one) / const(2.0, f64)
            lo, hi = (0.0, L - 1.0) if align else (-0.5, L - 0.5)
            if mode == "nearest":
                v = round_(v)
            if pad == "border" and mode != "cubic":
                v = select((v < const(lo, f64)) | (v > const(hi, f64)), clip(v, 0.0, L - 1.0), v)
            elif pad == "reflection":
                v = _reflect_expr(v, lo, hi)
            out = v if out is None else select(i.eq(d), v, out)
        return out
    coords = compute((n, *out_sp, nd), coord, "grid_coord")

    def body(b, ch, *o):
        taps = []
        for i, L in enumerate(dims):
            v = coords[(b, *o, i)]
            if mode == "nearest":
                taps.append([(v, None)])
                continue
            f = floor(v)
            t = v - f
            if mode == "linear":
                taps.append([(f, one - t), (f + one, t)])
            else:
                taps.append([(f + const(float(off), f64), _cubic_expr(t - const(float(off), f64), -0.75))
                             for off in (-1, 0, 1, 2)])
        total = None
        for combo in itertools.product(*[range(len(tp)) for tp in taps]):
            wt, idx = None, []
            for i, kk in enumerate(combo):
                iv, w = taps[i][kk]
                L = dims[i]
                if pad == "zeros":
                    ok = cast(f64, (iv >= zero) & (iv < const(float(L), f64)))
                    w = ok if w is None else w * ok
                elif pad == "border":
                    iv = clip(iv, 0.0, L - 1.0)
                else:
                    iv = _reflect_expr(iv, *((0.0, L - 1.0) if align else (-0.5, L - 0.5)))
                ii = float_index(iv, 0, L - 1)
                idx.append(ii)
                if w is not None:
                    wt = w if wt is None else wt * w
            val = cast(f64, x[(b, ch, *idx)])
            term = val if wt is None else val * wt
            total = term if total is None else total + term
        return cast(x.dtype, total)
    y = compute((n, c, *out_sp), body, "grid_sample")
    return y


_ROI_GRID_MAX = 1 << 16   # samples per output bin side (a bound against NaN / huge rois)


@lowering("RoiAlign")
def _roi_align_lower(ctx, x, rois, batch_indices):
    mode = attr_str(ctx, "mode", "avg")
    if mode not in ("avg", "max"):
        ctx.fail(f"mode {mode!r} is not avg or max")
    ph, pw = int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1))
    ratio = int(ctx.attr("sampling_ratio", 0))
    scale = float(ctx.attr("spatial_scale", 1.0))
    half = attr_str(ctx, "coordinate_transformation_mode", "half_pixel" if ctx.opset >= 16 else "output_half_pixel")
    offset = 0.5 if half == "half_pixel" else 0.0
    nb, c, h, w = x.shape
    nr = rois.shape[0]
    avg = mode == "avg"
    body = f"""  const double scale = {c_double(scale)}, off = {c_double(offset)};
  for (int64_t r = 0; r < {nr}; ++r) {{
    const int64_t b = (int64_t)in2[r];
    if (b < 0 || b >= {nb}) KILN_FAIL(1, b);
    const double x0 = (double)in1[r * 4 + 0] * scale - off, y0 = (double)in1[r * 4 + 1] * scale - off;
    const double x1 = (double)in1[r * 4 + 2] * scale - off, y1 = (double)in1[r * 4 + 3] * scale - off;
    double rw = x1 - x0, rh = y1 - y0;
    {"" if offset else "if (rw < 1.0) rw = 1.0; if (rh < 1.0) rh = 1.0;"}
    /* the sampling grid per bin, from run-time coordinates: bounded before any cast (a NaN
       or huge roi would cast to garbage, or loop for ever) */
    const double ghd = {ratio} > 0 ? {ratio} : ceil(rh / {ph}), gwd = {ratio} > 0 ? {ratio} : ceil(rw / {pw});
    if (!(ghd <= {_ROI_GRID_MAX} && gwd <= {_ROI_GRID_MAX})) KILN_FAIL(2, r);
    const int64_t gh = ghd > 0 ? (int64_t)ghd : 0, gw = gwd > 0 ? (int64_t)gwd : 0;
    const double cnt = gh * gw > 1 ? (double)(gh * gw) : 1.0;
    for (int64_t ch = 0; ch < {c}; ++ch) {{
      const {x.dtype.c}* img = in0 + (b * {c} + ch) * {h * w};
      for (int64_t i = 0; i < {ph}; ++i) for (int64_t j = 0; j < {pw}; ++j) {{
        double acc = {"0.0" if avg else "-INFINITY"};
        for (int64_t iy = 0; iy < gh; ++iy) {{
          double py = y0 + (i + (iy + 0.5) / gh) * (rh / {ph});
          const double vy = (py >= -1.0 && py <= {h}) ? 1.0 : 0.0;
          if (!(py >= 0)) py = 0; else if (py > {h}) py = {h};  /* NaN too: no cast overflow */
          int64_t ylo = (int64_t)floor(py), yhi; double fy;
          if (ylo >= {h - 1}) {{ ylo = yhi = {h - 1}; fy = 0.0; }} else {{ yhi = ylo + 1; fy = py - ylo; }}
          const double wyl = (1 - fy) * vy, wyh = fy * vy;
          for (int64_t ix = 0; ix < gw; ++ix) {{
            double px = x0 + (j + (ix + 0.5) / gw) * (rw / {pw});
            const double vx = (px >= -1.0 && px <= {w}) ? 1.0 : 0.0;
            if (!(px >= 0)) px = 0; else if (px > {w}) px = {w};
            int64_t xlo = (int64_t)floor(px), xhi; double fx;
            if (xlo >= {w - 1}) {{ xlo = xhi = {w - 1}; fx = 0.0; }} else {{ xhi = xlo + 1; fx = px - xlo; }}
            const double wxl = (1 - fx) * vx, wxh = fx * vx;
            const double t00 = (double)img[ylo * {w} + xlo] * (wyl * wxl);
            const double t01 = (double)img[ylo * {w} + xhi] * (wyl * wxh);
            const double t10 = (double)img[yhi * {w} + xlo] * (wyh * wxl);
            const double t11 = (double)img[yhi * {w} + xhi] * (wyh * wxh);
            {"acc += ((t00 + t01) + t10) + t11;" if avg else
             "double m = fmax(fmax(t00, t01), fmax(t10, t11)); if (m > acc) acc = m;"}
          }}
        }}
        out0[((r * {c} + ch) * {ph} + i) * {pw} + j] =
            ({x.dtype.c})({"acc / cnt" if avg else "(gh * gw > 0 ? acc : 0.0)"});
      }}
    }}
  }}
  return 0;
"""
    if x.dtype.c is None:
        ctx.fail(f"dtype {x.dtype} has no native type")
    errors = {1: f"batch_indices value {{value}} is out of range [0, {nb - 1}]",
              2: f"roi {{value}} is too large or not finite: more than {_ROI_GRID_MAX} samples per bin side"}
    return ctx.extern(body, [x, rois, batch_indices], [(ctx.out_shape(0), ctx.out_dtype(0))], errors=errors)
