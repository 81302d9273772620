"""Native lowerings of the signal-processing ops (kiln.ops.signal): DFT, STFT, the
window generators and MelWeightMatrix.
"""

from __future__ import annotations

import math

import numpy as np

import kiln.loops as L

from kiln.codegen.csource import c_instance, c_source
from kiln.dtypes import DType
from kiln.ops.registry import lowering
from kiln.ops.signal import _dft_args, _run_scalar


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


# the cos/sin table (kiln_twiddles, kiln/codegen/c_src/twiddles.h) both transforms start with
_TWIDDLES = "  double* tw = kiln_twiddles(n);\n  if (!tw) return -1;\n"


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
{_TWIDDLES}  const int64_t step = inner * CIN, ostep = inner * {cout};
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
    return ctx.extern(body, [x, *rest], [(odims, ctx.out_dtype())], preamble=c_source("twiddles.h"))


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
    wdt = ctx.input_types[2].dtype if "window" in p else st.dtype
    fn = f"kiln_stft_{st.dtype.name}_{wdt.name}_{ctx.out_dtype().name}"
    macros = {"KILN_STFT_T": t, "KILN_STFT_W": _ctype(ctx, wdt), "KILN_STFT_TO": to, "KILN_STFT_FN": fn}
    preamble = c_source("twiddles.h") + c_instance("stft.c", macros, fn.upper())
    body = (f"  return {fn}(in0, {p.get('window', 'NULL')}, out0, (int64_t){p['frame_step']}[0], {fl}, {batch}, "
            f"{length}, {cin}, {frames}, {bins}, {-1 if wlen is None else wlen}, {int(onesided)});")
    return ctx.extern(body, [signal, *rest], [(ctx.out_shape(), ctx.out_dtype())], preamble=preamble)


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
