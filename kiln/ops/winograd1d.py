"""Winograd convolution F(m, r) of 1-D signals on the blocked layout, dilated or strided: kiln's own op.

A 3-tap stride-1 1-D convolution computes m consecutive outputs from the m + 2 inputs
under them with m + 2 multiplies per channel pair instead of 3 m (Lavin and Gray 2015;
the 1-D case of kiln.ops.winograd):  y = A^T [ (G g) (.) (B^T d) ].
A dilated one (dilation D) is D undilated ones, one per phase: outputs o = p + D q
(p < D) read inputs p - pad + D (q + k), so a tile is m outputs of one phase, its inputs
D apart (TCN and WaveNet-style audio nets' dilated residual convs).
A strided one (stride S, K taps, undilated) is a stride-1 one of r = ceil(K / S) taps over
S times the input channels (polyphase): y[o] = sum over c, p < S, j < r of
w[c, S j + p] x[c, S (o + j) + p - pad], input phase p of channel c being a channel of its
own (audio front ends' 8-tap stride-4 convs: 2 taps, F(m, 2): 2m / (m + 1) fewer multiplies).

- `ConvWinograd1D(x, u, b?) {m, pads, dilation, stride, kernel, relu}`: x blocked
  N,ICB,1,W,cb (a 1-D N,C,W value as the layout pass blocks it); u the transformed weights
  [m+r-1, OCB, ICB*S*cb, ob] (`transform_weight_1d`: the reduction runs over channel block,
  phase, lane); b packed (OCB, ob); pads [left, right]; kernel K (default 3) and stride S
  (default 1; S > 1 only undilated); the output N,OCB,1,OW,ob with OW = (W + left + right -
  (K-1) D - 1) / S + 1; `relu` (default 0): max(y, 0) applied to the result (a Relu fused by
  kiln.passes.layout).

Error (float32, against the direct convolution in float64, max |error| / max |output|, on
the corpus's 1-D convs, benchmarks/winograd_error.py --1d): 3 taps, F(4, 3) 2.2e-6,
F(6, 3) 2.7e-6; strided (r = 2, 3), F(4, r) 2.6e-6, F(6, r) 4.9e-6, F(8, r) 3.8e-5; the float32
direct convolution 4.7e-7-6.6e-7; tests/lower/test_winograd1d.py asserts 1e-5. The chooser
(kiln.lower.conv_algo.winograd_1d_m) takes m = 4 or 6.
"""

from __future__ import annotations

import numpy as np

from kiln.graph.types import TensorType
from kiln.ops.layout import from_blocked, to_blocked
from kiln.ops.nn import compute_dtype
from kiln.ops.registry import OPAQUE, op
from kiln.ops.winograd import matrices

DOMAIN = "kiln"


def taps(kernel: int, stride: int) -> int:
    """Taps per input phase: r = ceil(K / S)."""
    return -(-kernel // stride)


def transform_weight_1d(w: np.ndarray, block: int, m: int, stride: int = 1, dtype=np.float32) -> np.ndarray:
    """OIK or OI1K weights -> U = G w_p as [m+r-1, OCB, ICB*S*block, block] (rounded to `dtype`
    once, from float64; padded channels and taps zero), r = ceil(K / S): input channel c =
    cb * block + lane at phase p is reduction index (cb * S + p) * block + lane."""
    w = w.reshape(w.shape[0], w.shape[1], w.shape[-1])
    oc, ic, k = w.shape
    r = taps(k, stride)
    _, g, _ = matrices(m, r)
    ocp, icp = -(-oc // block) * block, -(-ic // block) * block
    wp = np.zeros((ocp, icp, stride * r), np.float64)
    wp[:oc, :ic, :k] = w
    wp = wp.reshape(ocp, icp // block, block, r, stride).transpose(0, 1, 4, 2, 3)  # oc, cb, p, lane, j
    u = np.einsum("aj,ocplj->aocpl", g, wp).reshape(m + r - 1, ocp, icp * stride)
    out = u.reshape(m + r - 1, ocp // block, block, icp * stride).transpose(0, 1, 3, 2)
    return np.ascontiguousarray(out, dtype=dtype)


def out_len(w: int, pads, dilation: int, kernel: int = 3, stride: int = 1) -> int:
    return (w + pads[0] + pads[1] - (kernel - 1) * dilation - 1) // stride + 1


def phases(x: np.ndarray, pads, stride: int, kernel: int, block: int) -> np.ndarray:
    """N,C,W x (C a multiple of `block`) -> its input phases as channels, N,(C/block)*S*block,Q
    (channel block, phase, lane: the reduction order of transform_weight_1d's U), zero padded:
    x'[n, (cb S + p) block + l, q] = xpad[n, cb block + l, S q + p], Q = OW + r - 1."""
    n_, c, w = x.shape
    r = taps(kernel, stride)
    q = out_len(w, pads, 1, kernel, stride) + r - 1
    xp = np.zeros((n_, c, stride * q), x.dtype)
    cols = min(w, stride * q - pads[0])
    xp[:, :, pads[0]:pads[0] + cols] = x[:, :, :cols]
    xp = xp.reshape(n_, c // block, block, q, stride).transpose(0, 1, 4, 2, 3)
    return np.ascontiguousarray(xp.reshape(n_, c * stride, q))


def winograd_conv1d(x: np.ndarray, u: np.ndarray, pads, dilation: int, m: int, r: int = 3) -> np.ndarray:
    """The op's semantics in NumPy for a stride-1 r-tap conv: N,C,W x, U unblocked
    [m+r-1, OCp, ICp] -> N,OCp,OW y, computed tile by tile as the native kernel does, in x's
    precision (a strided conv: of its `phases`, with no pads)."""
    at, _, bt = matrices(m, r)
    dt = x.dtype
    at, bt = at.astype(dt), bt.astype(dt)
    n_, c, w = x.shape
    d, nt = dilation, m + r - 1
    ow = out_len(w, pads, d, r)
    per_phase = -(-(-(-ow // d)) // m)
    # phase p's inputs: s[p, j] = xpad[p + d * j], j < per_phase * m + r - 1
    span = d * (per_phase * m + r - 1)
    xp = np.zeros((n_, c, span), dt)
    cols = min(w, span - pads[0])
    xp[:, :, pads[0]:pads[0] + cols] = x[:, :, :cols]
    s = xp.reshape(n_, c, per_phase * m + r - 1, d)                            # [.., j, p]
    st = s.strides
    tiles = np.lib.stride_tricks.as_strided(s, (n_, c, d, per_phase, nt),
                                            (st[0], st[1], st[3], st[2] * m, st[2]))
    v = np.einsum("ak,ncpik->anpic", bt, tiles).reshape(nt, -1, c)             # n, tiles, C
    mm = np.matmul(v, u.astype(dt).transpose(0, 2, 1))                          # n, tiles, OC
    y = np.einsum("ka,atc->tck", at, mm).reshape(n_, d, per_phase, -1, m)       # N, p, i, OC, k
    y = y.transpose(0, 3, 2, 4, 1).reshape(n_, -1, per_phase * m * d)           # o = d (m i + k) + p
    return np.ascontiguousarray(y[:, :, :ow])


def geometry(ctx, xs, us):
    """Check a ConvWinograd1D node's shapes and attributes; (m, pads, dilation, stride, kernel, OW)."""
    m = int(ctx.attr("m", 4))
    k, st = int(ctx.attr("kernel", 3)), int(ctx.attr("stride", 1))
    pads = [int(p) for p in ctx.attr("pads", [1, 1])]
    d = int(ctx.attr("dilation", 1))
    if m < 1 or k < 2 or st < 1 or (st > 1 and d > 1) or d < 1 or len(pads) != 2 or min(pads) < 0:
        ctx.fail(f"ConvWinograd1D needs m >= 1, kernel >= 2, stride >= 1, dilation >= 1 (not both above 1) and "
                 f"pads [left, right] >= 0; got m={m}, kernel={k}, stride={st}, dilation={d}, pads={pads}")
    nt = m + taps(k, st) - 1
    if xs is None or us is None or len(xs) != 5 or len(us) != 4 or xs[2] != 1:
        ctx.fail(f"ConvWinograd1D needs x N,CB,1,W,cb and weights [m+r-1, OCB, ICp*S, ob]; got x {xs}, u {us}")
    if us[0] != nt or us[2] != xs[1] * xs[4] * st or us[3] != xs[4]:
        ctx.fail(f"ConvWinograd1D weights {tuple(us)} do not fit input {tuple(xs)} with m={m}, kernel={k}, "
                 f"stride={st}: expected ({nt}, OCB, {xs[1] * xs[4] * st}, {xs[4]})")
    ow = out_len(xs[3], pads, d, k, st)
    if ow < 1:
        ctx.fail(f"ConvWinograd1D of a {xs[3]}-long input with pads {pads}, dilation {d}, kernel {k}, "
                 f"stride {st} has no output")
    return m, pads, d, st, k, ow


def _infer(ctx):
    xs, us = ctx.shape(0), ctx.shape(1)
    if xs is None or not all(isinstance(d, int) for d in xs[1:]):
        ctx.fail(f"ConvWinograd1D needs a static input shape, got {ctx.tensor(0)}")
    ow = geometry(ctx, xs, us)[-1]
    if ctx.has_input(2) and ctx.shape(2) != (us[1], us[3]):
        ctx.fail(f"ConvWinograd1D bias {ctx.shape(2)} must be packed as {(us[1], us[3])}")
    return [TensorType(ctx.dtype(0), (xs[0], us[1], 1, ow, us[3]))]


@op("ConvWinograd1D", infer=_infer, domain=DOMAIN, fusion=OPAQUE)
def conv_winograd_1d(ctx, x, u, b=None):
    """1-D convolution (3 taps dilated, or strided) of a blocked input by Winograd F(m, r) with
    pre-transformed weights, as the native kernel computes it (float32 transforms)."""
    m, pads, d, st, k, _ = geometry(ctx, x.shape, u.shape)
    xc = compute_dtype(x)
    xn = from_blocked(xc, x.shape[1] * x.shape[-1])[:, :, 0]
    t, ocb, icp, ob = u.shape
    un = compute_dtype(u).transpose(0, 1, 3, 2).reshape(t, ocb * ob, icp)
    if st > 1:
        y = winograd_conv1d(phases(xn, pads, st, k, x.shape[-1]), un, (0, 0), 1, m, taps(k, st))
    else:
        y = winograd_conv1d(xn, un, pads, d, m, k)
    if b is not None:
        y = y + compute_dtype(b).reshape(1, -1, 1)
    if int(ctx.attr("relu", 0)):
        y = np.maximum(y, 0)
    return to_blocked(y[:, :, None], ob).astype(x.dtype, copy=False)
