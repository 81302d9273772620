"""Native lowerings of the resampling and geometry ops (kiln.ops.image).

Resize/Upsample is a C kernel whose per-axis tap tables (`_axis_taps`, shared with the
reference) are computed at compile time and baked into the source (nearest: one gather in
the tensor's own type); RoiAlign is a C
kernel (its sample counts depend on the boxes); Col2Im, AffineGrid and GridSample are
compute definitions.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.codegen.csource import c_instance, c_par_job
from kiln.dtypes import DType
from kiln.loops.symbols import as_int, c_size, hint, same_size, static, symbols_in
from kiln.lower.decisions import parallel_min_work
from kiln.lower.nnutil import _conj
from kiln.lower.pool import _pool_schedule
from kiln.ops.image import _ROI_GRID_MAX, _axis_taps, _grid_attrs, _params, _passes, _plan, _resize_inputs
from kiln.ops.nn import attr_str, window
from kiln.lower.context import lowering


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
    out = list(ctx.out_shape(0))
    if (symbols_in(out) and ctx.node.op == "Resize" and ctx.opset >= 11 and ctx.has_input(3)
            and ctx.value(3) is None):
        # sizes computed from a run-time shape (a shape-generic module: kiln.lower.symbolic_shapes
        # named them): each resampled axis at the ratio of its run-time sizes
        if p["mode"] != "nearest" or x.dtype != ctx.out_dtype(0) or p["ctm"] == "tf_crop_and_resize":
            ctx.fail("a linear or cubic Resize to run-time sizes: its tap tables need the sizes")
        from kiln.lower.window_symbolic import resize_nearest  # noqa: PLC0415
        return resize_nearest(ctx, x, p, [(a, n, None, None) for a, n in enumerate(out)
                                          if not same_size(n, x.shape[a])])
    scales, sizes, roi = _resize_inputs(ctx, _resize_value_getter(ctx, p))
    if symbols_in(list(x.shape)) and scales is not None and np.size(scales):
        # symbolic sizes (a shape-generic module): the per-axis scales do not depend on them
        plan = _plan(ctx, [hint(d) for d in x.shape], scales, None, roi)
        plan = plan and (list(ctx.out_shape(0)), plan[1])
    else:
        plan = _plan(ctx, list(x.shape), scales, sizes, roi)
    if plan is None:
        ctx.fail("neither scales nor sizes given")
    shape = list(x.shape)
    if not all(same_size(a, b) for a, b in zip(plan[0], ctx.out_shape(0))):
        ctx.fail(f"resize plan gives shape {plan[0]}, inference says {ctx.out_shape(0)}")
    passes = _passes(ctx, plan, shape, p)
    if x.dtype.c is None:
        ctx.fail(f"dtype {x.dtype} has no native type")
    if any(not static(shape[a]) or not static(n) for a, n, _, _ in passes):
        if p["mode"] != "nearest" or x.dtype != ctx.out_dtype(0) or p["ctm"] == "tf_crop_and_resize":
            ctx.fail("a linear or cubic Resize of an axis of symbolic size: its tap tables need the size")
        from kiln.lower.window_symbolic import resize_nearest  # noqa: PLC0415
        return resize_nearest(ctx, x, p, passes)
    if p["mode"] == "nearest" and x.dtype == ctx.out_dtype(0):
        tables = {a: _axis_taps(shape[a], out_len, s, axis_roi, p) for a, out_len, s, axis_roi in passes}
        if all(out is None or not out.any() for _, _, out in tables.values()):
            body, pre = _nearest_body(shape, list(ctx.out_shape(0)), {a: t[0][:, 0] for a, t in tables.items()},
                                      x.dtype.c)
            return ctx.extern(body, [x, *rest], [(ctx.out_shape(0), ctx.out_dtype(0))], preamble=pre)
    if symbols_in(shape):
        ctx.fail("the separable (linear, cubic) Resize kernel bakes its sizes in: it needs static sizes")
    n_in = math.prod(shape)
    preamble: list[str] = []   # a kiln_par_for job per resampled axis (c_par_job)
    body = [f"  const int64_t n0 = {n_in};\n",
            f"  double* cur = (double*)malloc((size_t)(n0 > 0 ? n0 : 1) * sizeof(double));\n",
            "  if (!cur) return -1;\n",
            "  for (int64_t i = 0; i < n0; ++i) cur[i] = (double)in0[i];\n"]
    for k, (a, out_len, s, axis_roi) in enumerate(passes):
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
        loop = [f"    const int64_t o = oj / {out_len}, j = oj % {out_len};\n"
                f"    double* dst = nxt + oj * {inner};\n"
                f"    for (int64_t i = 0; i < {inner}; ++i) {{\n"]
        if val is None:
            loop.append(f"      double acc = 0.0;\n"
                        f"      for (int64_t t = 0; t < {taps}; ++t)\n"
                        f"        acc += W{k}[j * {taps} + t]\n"
                        f"               * cur[(o * {in_len} + I{k}[j * {taps} + t]) * {inner} + i];\n")
            val = "acc"
        if has_out:
            val = f"(O{k}[j] ? {ext} : ({val}))"
        loop.append(f"      dst[i] = {val};\n    }}\n")
        captures = [("const double*", "cur"), ("double*", "nxt"), ("const int64_t*", f"I{k}"),
                    *([("const double*", f"W{k}")] if w is not None else []),
                    *([("const uint8_t*", f"O{k}")] if has_out else [])]
        pre, call = c_par_job("resize", "oj", str(outer * out_len), "".join(loop), captures,
                              "1" if n_out * taps >= parallel_min_work() else "0")
        preamble.append(pre)
        body.append(f"  {{ double* nxt = (double*)malloc((size_t){max(n_out, 1)} * sizeof(double));\n"
                    f"  if (!nxt) {{ free(cur); return -1; }}\n" + call + "  free(cur); cur = nxt; }\n")
    body.append(f"  for (int64_t i = 0; i < {math.prod(shape)}; ++i) out0[i] = {c_store_cast(x.dtype, 'cur[i]')};\n"
                "  free(cur);\n  return 0;\n")
    return ctx.extern("".join(body), [x, *rest], [(ctx.out_shape(0), ctx.out_dtype(0))],
                      preamble="".join(dict.fromkeys(preamble)))


def _nearest_body(in_shape: list[int], out_shape: list[int], idx: dict, ctype: str) -> tuple[str, str]:
    """C body (and preamble) of a nearest-neighbour Resize: one gather in the tensor's own type,
    through a source-index table per resampled axis (`idx`: axis -> input index per output index),
    its rows a kiln_par_for job (c_par_job) on the module's threads.
    Why: nearest needs no arithmetic, so the separable double-precision passes (a converted
    copy and a buffer per axis) only cost memory traffic; FPN upsampling is all nearest.
    Sizes of the axes not resampled may be symbolic (a shape-generic module's batch): they are
    printed as C expressions of the symbols (kiln.loops.symbols.c_size), which the job captures."""
    r = len(out_shape)
    body = [c_table(f"I{a}", "int64_t", t) for a, t in sorted(idx.items())]
    strides = [c_size(math.prod(in_shape[d + 1:])) for d in range(r)]
    rows, last = math.prod(out_shape[:-1]), out_shape[-1]
    work = rows * last
    if static(work):
        par = "1" if as_int(work) >= parallel_min_work() else "0"
    else:
        par = f"{c_size(work)} >= {parallel_min_work()}"
    loop = ["    int64_t rest = row, src = 0;\n"]
    for d in reversed(range(r - 1)):
        pos = f"I{d}[c]" if d in idx else "c"
        loop.append(f"    {{ const int64_t c = rest % {c_size(out_shape[d])}; rest /= {c_size(out_shape[d])}; "
                    f"src += {pos} * {strides[d]}; }}\n")
    pos = f"I{r - 1}[j]" if r - 1 in idx else "j"
    loop.append(f"    const {ctype}* s = in0 + src;\n"
                f"    {ctype}* dst = out0 + row * {c_size(last)};\n"
                f"    for (int64_t j = 0; j < {c_size(last)}; ++j) dst[j] = s[{pos}];\n")
    captures = [(f"const {ctype}*", "in0"), (f"{ctype}*", "out0"),
                *((("const int64_t*", f"I{a}") for a in sorted(idx))),
                *(("int64_t", v.arg.name) for v in symbols_in(list(in_shape) + list(out_shape)))]
    pre, call = c_par_job("resize_nearest", "row", c_size(rows), "".join(loop), captures, par)
    return "".join(body) + call + "  return 0;\n", pre


lowering("Resize")(_resize_lower)
lowering("Upsample")(_resize_lower)


@lowering("Col2Im")
def _col2im_lower(ctx, x, image_shape, block_shape):
    from kiln.loops import compute, const, max_, min_, reduce_axis, select, sum_
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
    ctx.schedule(_pool_schedule([y], [], nd, n * c * math.prod(img) * k, ctx.target))
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
    from kiln.lower.tensor import float_index
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
    types = (x.dtype, ctx.input_types[1].dtype, ctx.input_types[2].dtype)
    for name, t in zip(("X", "rois", "batch_indices"), types):
        if t.c is None:
            ctx.fail(f"{name} of dtype {t} has no native type")
    fn = "kiln_roi_align_" + "_".join(t.name for t in types)
    macros = {f"KILN_ROI_{k}": t.c for k, t in zip("XRI", types)}
    preamble = c_instance("roi_align.c", {**macros, "KILN_ROI_FN": fn}, fn.upper())
    body = (f"  return {fn}(in0, in1, in2, out0, {nr}, {nb}, {c}, {h}, {w}, {ph}, {pw}, {ratio}, "
            f"{_ROI_GRID_MAX}, {c_double(scale)}, {c_double(offset)}, {int(mode == 'avg')});")
    errors = {1: f"batch_indices value {{value}} is out of range [0, {nb - 1}]",
              2: f"roi {{value}} is too large or not finite: more than {_ROI_GRID_MAX} samples per bin side"}
    return ctx.extern(body, [x, rois, batch_indices], [(ctx.out_shape(0), ctx.out_dtype(0))], errors=errors,
                      preamble=preamble)
