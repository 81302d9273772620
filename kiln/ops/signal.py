"""Signal-processing operators: DFT, STFT, window generators and MelWeightMatrix.

Complex tensors are ONNX-style real tensors whose last dim is 2 (real, imag);
real signals carry a last dim of 1. The reference computes with `np.fft` in
the input's precision (float16/bfloat16 via float32) and casts back.
"""

from __future__ import annotations

import math

import numpy as np

import kiln.loops as L
from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.registry import lowering, op
from kiln.ops.shapes import normalize_axis


def _scalar(ctx, i: int, what: str) -> int | None:
    """The compile-time int value of scalar input `i` (None when unknown or absent)."""
    return _run_scalar(ctx, ctx.value(i), what)


def _run_scalar(ctx, x, what: str) -> int | None:
    if x is None:
        return None
    if np.size(x) != 1:
        ctx.fail(f"{what} must be a scalar, got shape {np.shape(x)}")
    return int(np.ravel(x)[0])


def _signal_type(ctx, i: int) -> TensorType:
    t = ctx.tensor(i)
    if not t.dtype.is_float:
        ctx.fail(f"input {i} must be a float tensor, got {t.dtype}")
    last = t.shape[-1] if t.shape else None
    if t.shape is not None and (not t.shape or isinstance(last, int) and last not in (1, 2)):
        ctx.fail(f"input {i}'s last dim must be 1 (real) or 2 (complex), got shape {t.shape}")
    return t


def _to_complex(ctx, x: np.ndarray) -> np.ndarray:
    if x.ndim == 0 or x.shape[-1] not in (1, 2):
        ctx.fail(f"signal's last dim must be 1 (real) or 2 (complex), got shape {x.shape}")
    real = x.astype(np.float64 if x.dtype == np.float64 else np.float32)  # float16/bfloat16 via float32
    z = real[..., 0].astype(np.complex128 if real.dtype == np.float64 else np.complex64)
    if x.shape[-1] == 2:
        z.imag = real[..., 1]
    return z


def _from_complex(z: np.ndarray, dtype: np.dtype, real: bool = False) -> np.ndarray:
    parts = (z.real,) if real else (z.real, z.imag)
    return np.stack(parts, axis=-1).astype(dtype)


# ---- DFT ----

def _dft_args(ctx, axis_in, rank: int | None):
    """(axis or None, inverse, onesided): the axis is an attribute before opset 20, an input since."""
    if ctx.opset >= 20:
        axis = -2 if not ctx.has_input(2) else axis_in
    else:
        axis = ctx.attr("axis", 1)
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    if axis is not None and rank is not None:
        axis = normalize_axis(ctx, int(axis), rank)
        if axis == rank - 1:
            ctx.fail(f"DFT axis {axis} is the last (real/imag) dim; expected one of the first {rank - 1}")
    return axis, inverse, onesided


def _dft_len(n, dft_length, inverse: bool, onesided: bool):
    """(transform length, output size along the axis) for input size `n` along the axis."""
    if dft_length is None:
        dft_length = 2 * (n - 1) if inverse and onesided else n
    return dft_length, (dft_length // 2 + 1 if onesided and not inverse else dft_length)


def _infer_dft(ctx):
    t = _signal_type(ctx, 0)
    axis_in = _scalar(ctx, 2, "axis") if ctx.opset >= 20 else None
    axis, inverse, onesided = _dft_args(ctx, axis_in, t.rank)
    last = 1 if inverse and onesided else 2
    if t.shape is None:
        return [TensorType(t.dtype, None)]
    length = _scalar(ctx, 1, "dft_length")
    if ctx.has_input(1) and length is not None and length < 1:
        ctx.fail(f"dft_length must be positive, got {length}")
    dims = list(t.shape[:-1])
    if axis is None:  # the transformed dim is unknown: only keep dims that cannot change
        same = not onesided and not ctx.has_input(1)
        dims = [d if same else ctx.new_dim() for d in dims]
    elif ctx.has_input(1) and length is None:
        dims[axis] = ctx.new_dim()
    elif isinstance(dims[axis], int) or length is not None:
        dims[axis] = _dft_len(dims[axis], length, inverse, onesided)[1]
    elif onesided:
        dims[axis] = ctx.new_dim()
    return [TensorType(t.dtype, tuple(dims) + (last,))]


@op("DFT", infer=_infer_dft)
def dft(ctx, x, dft_length=None, axis=None):
    axis, inverse, onesided = _dft_args(ctx, _run_scalar(ctx, axis, "axis"), x.ndim)
    z = _to_complex(ctx, x)
    n, _ = _dft_len(z.shape[axis], _run_scalar(ctx, dft_length, "dft_length"), inverse, onesided)
    if n < 1:
        ctx.fail(f"dft_length must be positive, got {n}")
    if inverse and onesided:
        return _from_complex(np.fft.irfft(z, n, axis=axis), x.dtype, real=True)
    z = (np.fft.ifft if inverse else np.fft.fft)(z, n, axis=axis)
    if onesided:  # the one-sided spectrum of the (possibly complex) signal
        z = np.take(z, np.arange(n // 2 + 1), axis=axis)
    return _from_complex(z, x.dtype)


# ---- STFT ----

def _stft_sizes(ctx, signal_len, step, window_len, frame_length):
    """(frame length, number of frames, bins) from whatever is known (None where unknown)."""
    if window_len is not None and frame_length is not None and window_len != frame_length:
        ctx.fail(f"window length {window_len} differs from frame_length {frame_length}")
    fl = frame_length if frame_length is not None else window_len
    if not ctx.has_input(2) and not ctx.has_input(3):
        fl = signal_len
    if step is not None and step < 1:
        ctx.fail(f"frame_step must be positive, got {step}")
    if fl is not None and signal_len is not None and not 0 < fl <= signal_len:
        ctx.fail(f"frame length {fl} must be in [1, signal length {signal_len}]")
    frames = None if None in (signal_len, fl, step) else (signal_len - fl) // step + 1
    bins = None if fl is None else (fl // 2 + 1 if ctx.attr("onesided", 1) else fl)
    return fl, frames, bins


def _infer_stft(ctx):
    t = _signal_type(ctx, 0)
    if t.rank not in (None, 3):
        ctx.fail(f"signal must have rank 3 [batch, length, 1|2], got {t}")
    if t.shape is None:
        return [TensorType(t.dtype, (ctx.new_dim(),) * 3 + (2,))]
    sig = t.shape[1] if isinstance(t.shape[1], int) else None
    win = ctx.type(2).shape[0] if ctx.has_input(2) and ctx.tensor(2).shape else None
    win = win if isinstance(win, int) else None
    _, frames, bins = _stft_sizes(ctx, sig, _scalar(ctx, 1, "frame_step"), win, _scalar(ctx, 3, "frame_length"))
    dim = lambda d: ctx.new_dim() if d is None else d  # noqa: E731
    return [TensorType(t.dtype, (t.shape[0], dim(frames), dim(bins), 2))]


@op("STFT", infer=_infer_stft)
def stft(ctx, signal, frame_step, window=None, frame_length=None):
    z = _to_complex(ctx, signal)
    fl, frames, bins = _stft_sizes(ctx, z.shape[1], _run_scalar(ctx, frame_step, "frame_step"),
                                   None if window is None else len(window),
                                   _run_scalar(ctx, frame_length, "frame_length"))
    step = int(np.ravel(frame_step)[0])
    idx = np.arange(frames)[:, None] * step + np.arange(fl)[None, :]
    framed = z[:, idx]  # [batch, frames, frame_length]
    if window is not None:
        framed = framed * window.astype(framed.real.dtype)
    return _from_complex(np.fft.fft(framed, axis=-1)[..., :bins], signal.dtype)


# ---- windows ----

def _out_dtype(ctx, default: int = 1) -> DType:
    return DType.from_onnx(int(ctx.attr("output_datatype", default)))


def _infer_window(ctx):
    if not ctx.dtype(0).is_int:
        ctx.fail(f"size must be an integer scalar, got {ctx.dtype(0)}")
    size = _scalar(ctx, 0, "size")
    if size is not None and size < 0:
        ctx.fail(f"window size must be non-negative, got {size}")
    return [TensorType(_out_dtype(ctx), (ctx.new_dim() if size is None else size,))]


def _window(coeffs: tuple[float, ...]):
    """Reference for a generalized cosine window sum_k (-1)^k a_k cos(2 pi k n / N)."""
    def run(ctx, size):
        n = _run_scalar(ctx, size, "size")
        if n < 0:
            ctx.fail(f"window size must be non-negative, got {n}")
        denom = max(n if ctx.attr("periodic", 1) else n - 1, 1)
        phase = 2 * np.pi * np.arange(n) / denom
        w = sum((-1) ** k * a * np.cos(k * phase) for k, a in enumerate(coeffs))
        return np.asarray(w).astype(_out_dtype(ctx).np)
    return run


for _name, _coeffs in (("HannWindow", (0.5, 0.5)), ("HammingWindow", (25 / 46, 21 / 46)),
                       ("BlackmanWindow", (0.42, 0.5, 0.08))):
    op(_name, infer=_infer_window)(_window(_coeffs))


# ---- MelWeightMatrix ----

def _infer_mel(ctx):
    bins, length = _scalar(ctx, 0, "num_mel_bins"), _scalar(ctx, 1, "dft_length")
    for name, v in (("num_mel_bins", bins), ("dft_length", length)):
        if v is not None and v < 1:
            ctx.fail(f"{name} must be positive, got {v}")
    rows = ctx.new_dim() if length is None else length // 2 + 1
    return [TensorType(_out_dtype(ctx), (rows, ctx.new_dim() if bins is None else bins))]


def _mel(hz):
    return 2595 * np.log1p(hz / 700) / np.log(10)


@op("MelWeightMatrix", infer=_infer_mel)
def mel_weight_matrix(ctx, num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz):
    """Triangular filters with peak 1 whose edges sit at whole DFT bins (as ONNX Runtime does)."""
    bins, length = _run_scalar(ctx, num_mel_bins, "num_mel_bins"), _run_scalar(ctx, dft_length, "dft_length")
    rate = _run_scalar(ctx, sample_rate, "sample_rate")
    lo, hi = (np.ravel(v)[0] for v in (lower_edge_hertz, upper_edge_hertz))
    if not 0 <= lo < hi or rate <= 0:
        ctx.fail(f"need 0 <= lower_edge_hertz < upper_edge_hertz and sample_rate > 0, "
                 f"got {lo}, {hi}, {rate}")
    mels = _mel(lo) + np.arange(bins + 2) * (_mel(hi) - _mel(lo)) / (bins + 2)
    edges = (((length + 1) * 700 * np.expm1(mels / 2595 * np.log(10))) // rate).astype(np.int64)
    out = np.zeros((length // 2 + 1, bins))
    for i, (left, center, right) in enumerate(zip(edges, edges[1:], edges[2:])):
        if center == left:
            out[center, i] = 1
        else:
            out[left:center + 1, i] = (np.arange(left, center + 1) - left) / (center - left)
        if right > center:
            out[center:right, i] = (right - np.arange(center, right)) / (right - center)
    return out.astype(_out_dtype(ctx).np)


# ---- native lowerings ----
#
# DFT and STFT are direct O(n^2) transforms in C with double accumulation over a
# cos/sin table (exact enough for every precision the reference computes in); sizes
# read from inputs at run time are checked against the output shape the kernel was
# built for (status 1 when they disagree). Windows are compute definitions in float64;
# MelWeightMatrix is a C kernel that repeats the reference's float32/float64 steps.

def _ctype(ctx, dt: DType) -> str:
    if dt.c is None:
        ctx.fail(f"{dt} data has no native (C) type", stage="lower")
    return dt.c


def _present(ctx, names: list[str]) -> dict[str, str]:
    """Node input name -> its extern param name (present inputs numbered in node order)."""
    out, k = {}, 0
    for i, name in enumerate(names):
        if ctx.has_input(i):
            out[name], k = f"in{k}", k + 1
    return out


_TWIDDLES = """  double* tw = (double*)malloc(sizeof(double) * 2 * ({n} > 0 ? {n} : 1));
  if (!tw) return -1;
  for (int64_t j = 0; j < {n}; ++j) {{
    const double th = 6.283185307179586 * (double)j / (double)({n});
    tw[2 * j] = cos(th); tw[2 * j + 1] = sin(th);
  }}
"""


@lowering("DFT")
def _dft_lower(ctx, x, *rest):
    xt = ctx.input_types[0]
    t, to = _ctype(ctx, xt.dtype), _ctype(ctx, ctx.out_dtype())
    dims, odims = tuple(xt.shape), ctx.out_shape()
    rank = len(dims)
    p = _present(ctx, ["x", "dft_length", "axis"])
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    cin, cout = dims[-1], odims[-1]
    if ctx.opset >= 20:
        axis = -2 if "axis" not in p else ctx.value(2)
        axis = None if axis is None else _run_scalar(ctx, axis, "axis")
    else:
        axis = ctx.attr("axis", 1)
    if axis is not None:
        axis, _, _ = _dft_args(ctx, axis, rank)
        get_axis = f"  const int64_t a = {axis};\n"
    else:  # an axis only known at run time (the output shape does not depend on it)
        get_axis = (f"  int64_t a = (int64_t){p['axis']}[0];\n  if (a < 0) a += {rank};\n"
                    f"  if (a < 0 || a >= {rank - 1}) return 1;\n")
    default_n = "2 * (nin - 1)" if inverse and onesided else "nin"
    want_m = "n / 2 + 1" if onesided and not inverse else "n"
    irfft = inverse and onesided
    lines = max(math.prod(dims[:-1]), 1)
    work = math.prod(odims[:-1]) * max(dims[:-1], default=1)  # multiply-adds, about
    par = "  #pragma omp parallel for schedule(static)\n" if lines > 1 and work > 1 << 16 else ""
    if irfft:
        inner_loop = """      double s = 0;
      if (nin > 0) s = (double)in0[base];
      for (int64_t k = 1; k <= (n - 1) / 2 && k < nin; ++k) {
        const int64_t j = (k * m) % n;
        const double zr = (double)in0[base + k * step], zi = CIN == 2 ? (double)in0[base + k * step + 1] : 0.0;
        s += 2.0 * (zr * tw[2 * j] - zi * tw[2 * j + 1]);
      }
      if (n % 2 == 0 && n / 2 < nin) s += (m % 2 ? -1.0 : 1.0) * (double)in0[base + (n / 2) * step];
      out0[obase + m * ostep] = (TO)(s * (1.0 / (double)n));
"""
    else:
        sign = "+" if inverse else "-"
        other = "-" if inverse else "+"
        scale = " * (1.0 / (double)n)" if inverse else ""
        inner_loop = f"""      double re = 0, im = 0;
      const int64_t kn = nin < n ? nin : n;
      for (int64_t k = 0; k < kn; ++k) {{
        const int64_t j = (k * m) % n;
        const double zr = (double)in0[base + k * step], zi = CIN == 2 ? (double)in0[base + k * step + 1] : 0.0;
        const double c = tw[2 * j], sn = tw[2 * j + 1];
        re += zr * c {other} zi * sn;
        im += zi * c {sign} zr * sn;
      }}
      out0[obase + m * ostep] = (TO)(re{scale});
      out0[obase + m * ostep + 1] = (TO)(im{scale});
"""
    body = f"""#define CIN {cin}
#define TO {to}
  static const int64_t idims[{rank}] = {{{', '.join(map(str, dims))}}};
  static const int64_t odims[{rank}] = {{{', '.join(map(str, odims))}}};
{get_axis}  int64_t outer = 1, inner = 1;
  for (int64_t q = 0; q < a; ++q) {{ outer *= idims[q]; if (odims[q] != idims[q]) return 1; }}
  for (int64_t q = a + 1; q < {rank - 1}; ++q) {{ inner *= idims[q]; if (odims[q] != idims[q]) return 1; }}
  const int64_t nin = idims[a], m_out = odims[a];
  const int64_t n = {f"(int64_t){p['dft_length']}[0]" if "dft_length" in p else default_n};
  if (n < 1 || {want_m} != m_out) return 1;
  if (outer * inner * m_out == 0) return 0;
{_TWIDDLES.format(n="n")}  const int64_t step = inner * CIN, ostep = inner * {cout};
{par}  for (int64_t line = 0; line < outer * inner; ++line) {{
    const int64_t o = line / inner, i = line % inner;
    const int64_t base = (o * nin * inner + i) * CIN, obase = (o * m_out * inner + i) * {cout};
    for (int64_t m = 0; m < m_out; ++m) {{
{inner_loop}    }}
  }}
  free(tw);
  return 0;
#undef CIN
#undef TO"""
    return ctx.extern(body, [x, *rest], [(odims, ctx.out_dtype())])


@lowering("STFT")
def _stft_lower(ctx, signal, *rest):
    st = ctx.input_types[0]
    t, to = _ctype(ctx, st.dtype), _ctype(ctx, ctx.out_dtype())
    p = _present(ctx, ["signal", "frame_step", "window", "frame_length"])
    batch, length, cin = st.shape
    _, frames, bins, _ = ctx.out_shape()
    onesided = bool(ctx.attr("onesided", 1))
    wlen = ctx.input_types[2].shape[0] if "window" in p else None
    if "frame_length" in p:
        fl = f"(int64_t){p['frame_length']}[0]"
    else:
        fl = str(wlen if wlen is not None else length)
    win = f"(double){p['window']}[k]" if "window" in p else "1.0"
    body = f"""  const int64_t fstep = (int64_t){p['frame_step']}[0], n = {fl};
  if (fstep < 1 || n < 1 || n > {length} || {"n != " + str(wlen) if wlen is not None else "0"}) return 1;
  if ({frames} != ({length} - n) / fstep + 1 || {bins} != {"n / 2 + 1" if onesided else "n"}) return 1;
  if ({batch * frames * bins} == 0) return 0;
{_TWIDDLES.format(n="n")}  for (int64_t bf = 0; bf < {batch * frames}; ++bf) {{
    const int64_t b = bf / {frames}, f = bf % {frames};
    const {t}* z = in0 + (b * {length} + f * fstep) * {cin};
    for (int64_t m = 0; m < {bins}; ++m) {{
      double re = 0, im = 0;
      for (int64_t k = 0; k < n; ++k) {{
        const int64_t j = (k * m) % n;
        const double w = {win};
        const double zr = (double)z[k * {cin}] * w, zi = {f"(double)z[k * {cin} + 1] * w" if cin == 2 else "0.0"};
        const double c = tw[2 * j], sn = tw[2 * j + 1];
        re += zr * c + zi * sn;
        im += zi * c - zr * sn;
      }}
      out0[(bf * {bins} + m) * 2] = ({to})re;
      out0[(bf * {bins} + m) * 2 + 1] = ({to})im;
    }}
  }}
  free(tw);
  return 0;"""
    return ctx.extern(body, [signal, *rest], [(ctx.out_shape(), ctx.out_dtype())])


def _window_lower(coeffs: tuple[float, ...]):
    def lower(ctx, size):
        (n,) = ctx.out_shape()
        out = ctx.out_dtype()
        if out.c is None:
            ctx.fail(f"output type {out} has no native (C) type", stage="lower")
        denom = max(n if ctx.attr("periodic", 1) else n - 1, 1)
        f64 = DType.float64

        def w(i):
            phase = L.const(2 * np.pi, f64) * L.cast(f64, i) / L.const(float(denom), f64)
            acc = None
            for k, a in enumerate(coeffs):
                term = L.const((-1) ** k * a, f64) * (L.const(1.0, f64) if k == 0 else
                                                      L.cos(L.const(float(k), f64) * phase))
                acc = term if acc is None else acc + term
            return L.cast(out, acc) if out is not DType.bool else acc.ne(L.const(0.0, f64))
        return L.compute((n,), w, "window")
    return lower


for _name, _coeffs in (("HannWindow", (0.5, 0.5)), ("HammingWindow", (25 / 46, 21 / 46)),
                       ("BlackmanWindow", (0.42, 0.5, 0.08))):
    lowering(_name)(_window_lower(_coeffs))


@lowering("MelWeightMatrix")
def _mel_lower(ctx, num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz):
    """The reference's arithmetic step by step: _mel in the edges' float type up to the
    division by log(10) (float64 from there), Python's float floor division for the edges."""
    rows, bins = ctx.out_shape()
    ht = ctx.input_types[3].dtype
    h, to = _ctype(ctx, ht), _ctype(ctx, ctx.out_dtype())
    calc = "double" if ht is DType.float64 else "float"  # float16 math runs in float, rounded back
    body = f"""  const int64_t nb = (int64_t)in0[0], len = (int64_t)in1[0], rate = (int64_t)in2[0];
  const {h} lo = in3[0], hi = in4[0];
  if (nb != {bins} || len / 2 + 1 != {rows} || nb < 1 || len < 1) return 1;
  if (!((double)lo >= 0 && (double)lo < (double)hi) || rate <= 0) return 1;
  int64_t* edges = (int64_t*)malloc(sizeof(int64_t) * ({bins} + 2));
  if (!edges) return -1;
  const double mlo = KILN_MEL(lo), mhi = KILN_MEL(hi), diff = mhi - mlo;
  for (int64_t i = 0; i < {bins} + 2; ++i) {{
    const double mel = mlo + ((double)i * diff) / (double)({bins} + 2);
    const double a = (double)((len + 1) * 700) * expm1(mel / 2595.0 * 2.302585092994046), b = (double)rate;
    double mod = fmod(a, b), div = (a - mod) / b, fl;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1.0;
    if (div != 0) {{ fl = floor(div); if (div - fl > 0.5) fl += 1.0; }} else fl = 0.0;
    if (!(fl > -9.0e18 && fl < 9.0e18)) {{ free(edges); return 1; }}
    edges[i] = (int64_t)fl;
  }}
  double* w = (double*)calloc({rows * bins} + 1, sizeof(double));
  if (!w) {{ free(edges); return -1; }}
  int rc = 0;
  for (int64_t i = 0; i < {bins} && !rc; ++i) {{
    const int64_t left = edges[i], center = edges[i + 1], right = edges[i + 2];
    if (left < 0 || center < 0 || right < 0 || center >= {rows}) {{ rc = 1; break; }}
    if (center == left) w[center * {bins} + i] = 1.0;
    else for (int64_t r = left; r <= center; ++r) w[r * {bins} + i] = (double)(r - left) / (double)(center - left);
    if (right > center) {{
      if (right > {rows}) {{ rc = 1; break; }}
      for (int64_t r = center; r < right; ++r) w[r * {bins} + i] = (double)(right - r) / (double)(right - center);
    }}
  }}
  if (!rc) for (int64_t q = 0; q < {rows * bins}; ++q) out0[q] = ({to})w[q];
  free(w); free(edges);
  return rc;"""
    log1p = "log1p" if calc == "double" else "log1pf"

    def mel(v):  # 2595 * log1p(hz / 700) in the edges' type, then / log(10) in float64
        q = f"({h})(({calc}){v} / ({calc})700)"
        lg = f"({h}){log1p}(({calc}){q})"
        return f"(double)({h})(({calc})2595 * ({calc}){lg}) / 2.302585092994046"
    body = body.replace("KILN_MEL(lo)", mel("lo")).replace("KILN_MEL(hi)", mel("hi"))
    return ctx.extern(body, [num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz],
                      [((rows, bins), ctx.out_dtype())])
