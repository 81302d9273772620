"""Winograd convolution F(m, 3) of 1-D signals on the blocked layout, dilated or not: kiln's own op.

A 3-tap stride-1 1-D convolution computes m consecutive outputs from the m + 2 inputs
under them with m + 2 multiplies per channel pair instead of 3 m (Lavin and Gray 2015;
the 1-D case of kiln.ops.winograd):  y = A^T [ (G g) (.) (B^T d) ].
A dilated one (dilation D) is D undilated ones, one per phase: outputs o = p + D q
(p < D) read inputs p - pad + D (q + k), so a tile is m outputs of one phase, its inputs
D apart (TCN and WaveNet-style audio nets' dilated residual convs).

- `ConvWinograd1D(x, u, b?) {m, pads, dilation, relu}`: x blocked N,ICB,1,W,cb (a 1-D
  N,C,W value as the layout pass blocks it); u the transformed weights
  [m+2, OCB, ICB*cb, ob] (`transform_weight_1d`); b packed (OCB, ob); pads [left, right];
  the output N,OCB,1,OW,ob with OW = W + left + right - 2 dilation; `relu` (default 0):
  max(y, 0) applied to the result (a Relu fused by kiln.passes.layout).

Error (float32, against the direct convolution in float64, max |error| / max |output|, on
the corpus's 3-tap stride-1 1-D convs, benchmarks/winograd_error.py --1d): F(4, 3) 2.2e-6,
F(6, 3) 2.7e-6, the float32 direct convolution 6.6e-7; tests/lower/test_winograd1d.py asserts
1e-5. The chooser (kiln.lower.conv_algo.winograd_1d_m) takes m = 4 or 6.
"""

from __future__ import annotations

import numpy as np

from kiln.graph.types import TensorType
from kiln.ops.layout import from_blocked, to_blocked
from kiln.ops.nn import compute_dtype
from kiln.ops.registry import OPAQUE, op
from kiln.ops.winograd import matrices

DOMAIN = "kiln"


def transform_weight_1d(w: np.ndarray, block: int, m: int, dtype=np.float32) -> np.ndarray:
    """OIK (K = 3) or OI1K weights -> U = G w as [m+2, OCB, ICB*block, block] (rounded to
    `dtype` once, from float64; padded channels zero)."""
    _, g, _ = matrices(m)
    w = w.reshape(w.shape[0], w.shape[1], 3)
    oc, ic = w.shape[:2]
    ocp, icp = -(-oc // block) * block, -(-ic // block) * block
    u = np.einsum("ak,oik->aoi", g, w.astype(np.float64))                   # n, OC, IC
    out = np.zeros((m + 2, ocp, icp), np.float64)
    out[:, :oc, :ic] = u
    out = out.reshape(m + 2, ocp // block, block, icp).transpose(0, 1, 3, 2)
    return np.ascontiguousarray(out, dtype=dtype)


def out_len(w: int, pads, dilation: int) -> int:
    return w + pads[0] + pads[1] - 2 * dilation


def winograd_conv1d(x: np.ndarray, u: np.ndarray, pads, dilation: int, m: int) -> np.ndarray:
    """The op's semantics in NumPy: N,C,W x, U unblocked [m+2, OCp, ICp] -> N,OCp,OW y,
    computed tile by tile as the native kernel does, in x's precision."""
    at, _, bt = matrices(m)
    dt = x.dtype
    at, bt = at.astype(dt), bt.astype(dt)
    n_, c, w = x.shape
    d = dilation
    ow = out_len(w, pads, d)
    per_phase = -(-(-(-ow // d)) // m)
    # phase p's inputs: s[p, j] = xpad[p + d * j], j < per_phase * m + 2
    span = d * (per_phase * m + 2)
    xp = np.zeros((n_, c, span), dt)
    cols = min(w, span - pads[0])
    xp[:, :, pads[0]:pads[0] + cols] = x[:, :, :cols]
    s = xp.reshape(n_, c, per_phase * m + 2, d)                                 # [.., j, p]
    st = s.strides
    tiles = np.lib.stride_tricks.as_strided(s, (n_, c, d, per_phase, m + 2),
                                            (st[0], st[1], st[3], st[2] * m, st[2]))
    v = np.einsum("ak,ncpik->anpic", bt, tiles).reshape(m + 2, -1, c)          # n, tiles, C
    mm = np.matmul(v, u.astype(dt).transpose(0, 2, 1))                          # n, tiles, OC
    y = np.einsum("ka,atc->tck", at, mm).reshape(n_, d, per_phase, -1, m)       # N, p, i, OC, k
    y = y.transpose(0, 3, 2, 4, 1).reshape(n_, -1, per_phase * m * d)           # o = d (m i + k) + p
    return np.ascontiguousarray(y[:, :, :ow])


def geometry(ctx, xs, us):
    """Check a ConvWinograd1D node's shapes and attributes; (m, pads, dilation, OW)."""
    m = int(ctx.attr("m", 4))
    if m < 1:
        ctx.fail(f"ConvWinograd1D needs m >= 1, got {m}")
    if xs is None or us is None or len(xs) != 5 or len(us) != 4 or xs[2] != 1:
        ctx.fail(f"ConvWinograd1D needs x N,CB,1,W,cb and weights [m+2, OCB, ICp, ob]; got x {xs}, u {us}")
    if us[0] != m + 2 or us[2] != xs[1] * xs[4] or us[3] != xs[4]:
        ctx.fail(f"ConvWinograd1D weights {tuple(us)} do not fit input {tuple(xs)} with m={m}: expected "
                 f"({m + 2}, OCB, {xs[1] * xs[4]}, {xs[4]})")
    pads = [int(p) for p in ctx.attr("pads", [1, 1])]
    d = int(ctx.attr("dilation", 1))
    if len(pads) != 2 or min(pads) < 0 or d < 1:
        ctx.fail(f"ConvWinograd1D needs pads [left, right] >= 0 and dilation >= 1, got {pads}, {d}")
    ow = out_len(xs[3], pads, d)
    if ow < 1:
        ctx.fail(f"ConvWinograd1D of a {xs[3]}-long input with pads {pads}, dilation {d} has no output")
    return m, pads, d, ow


def _infer(ctx):
    xs, us = ctx.shape(0), ctx.shape(1)
    if xs is None or not all(isinstance(d, int) for d in xs):
        ctx.fail(f"ConvWinograd1D needs a static input shape, got {ctx.tensor(0)}")
    _, _, _, ow = geometry(ctx, xs, us)
    if ctx.has_input(2) and ctx.shape(2) != (us[1], us[3]):
        ctx.fail(f"ConvWinograd1D bias {ctx.shape(2)} must be packed as {(us[1], us[3])}")
    return [TensorType(ctx.dtype(0), (xs[0], us[1], 1, ow, us[3]))]


@op("ConvWinograd1D", infer=_infer, domain=DOMAIN, fusion=OPAQUE)
def conv_winograd_1d(ctx, x, u, b=None):
    """3-tap stride-1 (dilated) 1-D convolution of a blocked input by Winograd F(m, 3) with
    pre-transformed weights, as the native kernel computes it (float32 transforms)."""
    m, pads, d, _ = geometry(ctx, x.shape, u.shape)
    xc = compute_dtype(x)
    xn = from_blocked(xc, x.shape[1] * x.shape[-1])[:, :, 0]
    t, ocb, icp, ob = u.shape
    un = compute_dtype(u).transpose(0, 1, 3, 2).reshape(t, ocb * ob, icp)
    y = winograd_conv1d(xn, un, pads, d, m)
    if b is not None:
        y = y + compute_dtype(b).reshape(1, -1, 1)
    if int(ctx.attr("relu", 0)):
        y = np.maximum(y, 0)
    return to_blocked(y[:, :, None], ob).astype(x.dtype, copy=False)
