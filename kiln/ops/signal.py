"""Signal-processing operators: DFT, STFT, window generators and MelWeightMatrix.

Complex tensors are ONNX-style real tensors whose last dim is 2 (real, imag);
real signals carry a last dim of 1. The reference computes with `np.fft` in
the input's precision (float16/bfloat16 via float32) and casts back. Their native
lowerings live in kiln.lower.signal.
"""

from __future__ import annotations

import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.registry import OPAQUE, op
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


@op("DFT", infer=_infer_dft, fusion=OPAQUE)
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


@op("STFT", infer=_infer_stft, fusion=OPAQUE)
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
    op(_name, infer=_infer_window, fusion=OPAQUE)(_window(_coeffs))


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


@op("MelWeightMatrix", infer=_infer_mel, fusion=OPAQUE)
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
