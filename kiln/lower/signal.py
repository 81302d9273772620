"""Native lowerings of the signal-processing ops (kiln.ops.signal): DFT, STFT, the
window generators and MelWeightMatrix.
"""

from __future__ import annotations

import math

import numpy as np

import kiln.loops as L

from kiln.codegen.csource import c_instance, c_source
from kiln.dtypes import DType
from kiln.lower.context import lowering
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
        get_axis = str(axis)
    else:  # an axis only known at run time (the output shape does not depend on it)
        get_axis = f"(int64_t){p['axis']}[0]"
    lines = max(math.prod(dims[:-1]), 1)
    work = math.prod(odims[:-1]) * max(dims[:-1], default=1)  # multiply-adds, about
    fn = f"kiln_dft_{xt.dtype.name}_{ctx.out_dtype().name}"
    preamble = c_source("twiddles.h") + c_source("kiln_par.h") + c_instance("dft.c", {"KILN_DFT_T": t, "KILN_DFT_TO": to,
                                                             "KILN_DFT_FN": fn}, fn.upper())
    n = f"(int64_t){p['dft_length']}[0], 1" if "dft_length" in p else "0, 0"
    body = (f"  static const int64_t idims[{rank}] = {{{', '.join(map(str, dims))}}};\n"
            f"  static const int64_t odims[{rank}] = {{{', '.join(map(str, odims))}}};\n"
            f"  return {fn}(in0, out0, idims, odims, {rank}, {get_axis}, {n}, {cin}, {cout}, {int(inverse)}, "
            f"{int(onesided)}, {int(lines > 1 and work > 1 << 16)});")
    return ctx.extern(body, [x, *rest], [(odims, ctx.out_dtype())], preamble=preamble)


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
    fn = f"kiln_mel_{ht.name}_{ctx.out_dtype().name}"
    macros = {"KILN_MEL_H": h, "KILN_MEL_CALC": calc, "KILN_MEL_LOG1P": "log1p" if calc == "double" else "log1pf",
              "KILN_MEL_TO": to, "KILN_MEL_FN": fn}
    body = f"  return {fn}((int64_t)in0[0], (int64_t)in1[0], (int64_t)in2[0], in3[0], in4[0], out0, {rows}, {bins});"
    return ctx.extern(body, [num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz],
                      [((rows, bins), ctx.out_dtype())], preamble=c_instance("mel_weight_matrix.c", macros, fn.upper()))
