"""Winograd convolution F(m x m, 3 x 3) on the blocked layout: kiln's own op (domain "kiln").

A 3x3, stride-1, undilated convolution computes each m x m block of outputs from
the (m + 2) x (m + 2) input tile under it with (m + 2)^2 multiplies per channel
pair instead of 9 m^2 (Lavin and Gray, "Fast Algorithms for Convolutional Neural
Networks", 2015): with the tile d, the filter g and the transform matrices below,

    Y = A^T [ (G g G^T) (.) (B^T d B) ] A        ((.) : elementwise product)

The filter transform U = G g G^T is done once, at compile time, here (numpy, in
float64, rounded to float32): the op reads U, not the 3x3 weights. The layout pass gives U
as deferred data (`deferred_weight`, kiln.graph.deferred), made part by part where the
weights blob is written, in a thread beside the C compiler: made whole on the compile's
path it cost ResNet-18 0.4 s of CPU (176 MB, most of it first touches of new pages). Summed over input
channels, the elementwise products are (m + 2)^2 independent GEMMs over tiles.

- `ConvWinograd(x, u, b?) {m, pads, relu}`: x blocked N,ICB,H,W,cb; u the
  transformed weights [(m+2)^2, OCB, ICB*cb, ob] (`transform_weight`); b packed
  (OCB, ob); the output N,OCB,OH,OW,ob with OH = H + pad_top + pad_bottom - 2
  (likewise OW); padding channels come out zero (their weights and bias are); `relu`
  (default 0): max(y, 0) applied to the result (a Relu fused by kiln.passes.layout);
  `swish` (default 0): y * sigmoid(y) instead (a Swish, SiLU, fused likewise; both map 0
  to 0, so the padding channels stay zero).

The transforms are Toom-Cook's over the points 0, +-1, +-2, +-1/2, ... and infinity
(`matrices(m)`, built here rather than copied, so F(2), F(4) and F(6) come from one
formula). F(4x4, 3x3) and F(2x2, 3x3) are what the native kernel
(kiln/codegen/c_src/winograd.c) implements: on the corpus CNNs' 68 3x3 stride-1 convs F(4x4)'s
float32 error is at most 1.35e-5 of the output's largest value, against 6.3e-7 for the direct
convolution (benchmarks/winograd_error.py; asserted in tests/lower/test_winograd.py); F(2x2)'s
about 10x less. F(6x6) would lose more digits (its points +-1/2 grow the transforms' entries).
F(2x2) saves only 2.25x of the multiplies against F(4x4)'s 4x, but its transformed weights are
1.78x the 3x3 ones against 4x: where a plane has few tiles and the weights stream from memory
once per inference it is the faster (kiln.lower.conv_algo.winograd_m).
"""

from __future__ import annotations

import functools
from fractions import Fraction

import numpy as np

from kiln.graph.deferred import Deferred
from kiln.graph.types import TensorType
from kiln.ops.layout import from_blocked, to_blocked
from kiln.ops.elementwise import _sigmoid
from kiln.ops.nn import compute_dtype
from kiln.ops.registry import OPAQUE, op

DOMAIN = "kiln"
R = 3                     # the filter size this op transforms
M = 4                     # the output tile the native kernel computes: F(4x4, 3x3)
_POINTS = [Fraction(0), Fraction(1), Fraction(-1), Fraction(2), Fraction(-2), Fraction(1, 2), Fraction(-1, 2),
           Fraction(3), Fraction(-3)]


def _polymul(a: list, b: list) -> list:
    out = [Fraction(0)] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            out[i + j] += x * y
    return out


@functools.cache
def matrices(m: int, r: int = R) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A^T [m, n], G [n, r], B^T [n, n]) of F(m, r), n = m + r - 1, exactly (as float64).

    Correlation is the transpose of Toom-Cook's linear convolution (evaluate both factors at
    n - 1 points and infinity, multiply, interpolate): A^T evaluates the output polynomial's
    m coefficients at the points, G the filter's (each row divided by the Lagrange
    denominator of its point), B^T holds the interpolation polynomials' coefficients."""
    n = m + r - 1
    if n - 1 > len(_POINTS):
        raise ValueError(f"F({m}, {r}) needs {n - 1} points; {len(_POINTS)} are defined")
    pts = _POINTS[:n - 1]
    at = [[p ** i for p in pts] + [Fraction(int(i == m - 1))] for i in range(m)]
    g = []
    for j, p in enumerate(pts):
        f = Fraction(1)
        for k, q in enumerate(pts):
            if k != j:
                f *= p - q
        g.append([p ** k / f for k in range(r)])
    g.append([Fraction(int(k == r - 1)) for k in range(r)])
    bt = []
    for j in range(n - 1):
        poly = [Fraction(1)]
        for k, q in enumerate(pts):
            if k != j:
                poly = _polymul(poly, [-q, Fraction(1)])
        bt.append(poly + [Fraction(0)] * (n - len(poly)))
    whole = [Fraction(1)]
    for q in pts:
        whole = _polymul(whole, [-q, Fraction(1)])
    bt.append(whole)
    f64 = lambda rows: np.array([[float(v) for v in row] for row in rows])  # noqa: E731
    return f64(at), f64(g), f64(bt)


def transform_weight(w: np.ndarray, block: int, m: int = M, dtype=np.float32) -> np.ndarray:
    """OIHW 3x3 weights -> U = G w G^T as [(m+2)^2, OCB, ICB*block, block] (rounded to `dtype`
    once, from float64; padded channels zero): position t = row * (m+2) + col, then the output channel block, then the
    input channel (scalar), then the block's output channels (one vector). `deferred_weight`'s
    array, made now."""
    return deferred_weight(w, block, m, dtype).value()


def deferred_weight(w: np.ndarray, block: int, m: int = M, dtype=np.float32) -> Deferred:
    """`transform_weight`'s U as kiln.graph.deferred.Deferred data: made, a few output channel
    blocks at a time, only when read (or streamed into the weights blob, never whole in memory:
    ResNet-18's U is 176 MB, four times its 3x3 weights)."""
    _, g, _ = matrices(m)
    oc, ic = w.shape[:2]
    ocb, icp = -(-oc // block), -(-ic // block) * block
    n = g.shape[0]
    k = np.kron(g, g)                                    # [(m+2)^2, 9]: U[t] = sum_j k[t, j] w[tap j]
    cols = icp * block                                   # U[t, one ocb] as [ICp, block], contiguous
    taps = w.reshape(oc, ic, -1)
    # output channel blocks per group: U[t, group] is one part of about PART_BYTES (a file
    # written in 8 KB parts took 0.14 s of kernel CPU per 176 MB, in 256 KB parts 0.05 s);
    # a group of every block makes the whole U one part
    group = min(ocb, max(1, PART_BYTES // (cols * np.dtype(dtype).itemsize)))

    def parts():
        # a group's taps as [9, group * ICp * block] (float64, zero padded), then k times that
        # as a GEMM in 2048-column pieces (small enough that OpenBLAS runs them on this thread:
        # from 4096 columns it wakes its threads, which spin), rounded once to `dtype`
        src = np.zeros((taps.shape[2], group, icp, block))
        out = np.empty((n * n, group * cols), dtype)
        step = 2048
        for b0 in range(0, ocb, group):
            nb = min(group, ocb - b0)
            src[:] = 0
            for j in range(nb):
                o0, o1 = (b0 + j) * block, min(oc, (b0 + j + 1) * block)
                src[:, j, :ic, :o1 - o0] = taps[o0:o1].transpose(2, 1, 0)
            flat, width = src.reshape(src.shape[0], -1), nb * cols
            for c in range(0, width, step):
                out[:, c:min(c + step, width)] = k @ flat[:, c:min(c + step, width)]
            if nb == ocb:
                yield 0, out.reshape(-1)
                continue
            for t in range(n * n):
                yield (t * ocb + b0) * cols, out[t, :width]

    return Deferred((n * n, ocb, icp, block), dtype, parts)


PART_BYTES = 1 << 16


def winograd_conv(x: np.ndarray, u: np.ndarray, pads, m: int = M) -> np.ndarray:
    """The op's semantics in NumPy: NCHW x, U as transform_weight makes it (already
    unblocked: [(m+2)^2, OCp, ICp]) -> NCHW y (OCp channels), computed tile by tile as
    the native kernel does, in x's precision (float32 in, float32 arithmetic)."""
    at, _, bt = matrices(m)
    dt = x.dtype
    at, bt = at.astype(dt), bt.astype(dt)
    n_, c, h, w = x.shape
    pt, pl, pb, pr = pads
    oh, ow = h + pt + pb - 2, w + pl + pr - 2
    th, tw = -(-oh // m), -(-ow // m)
    t = m + 2
    xp = np.zeros((n_, c, th * m + 2, tw * m + 2), dt)
    rows, cols = min(h, th * m + 2 - pt), min(w, tw * m + 2 - pl)
    xp[:, :, pt:pt + rows, pl:pl + cols] = x[:, :, :rows, :cols]
    # tiles: N, C, th, tw, t, t (overlapping windows of the padded input)
    s = xp.strides
    d = np.lib.stride_tricks.as_strided(xp, (n_, c, th, tw, t, t), (s[0], s[1], s[2] * m, s[3] * m, s[2], s[3]))
    v = np.einsum("ai,nchwij,bj->abnhwc", bt, d, bt).reshape(t * t, -1, c)      # t*t, tiles, C
    uu = u.reshape(t * t, -1, c).astype(dt)                                       # t*t, OC, C
    mm = np.matmul(v, uu.transpose(0, 2, 1)).reshape(t, t, n_, th, tw, -1)      # t, t, N, th, tw, OC
    y = np.einsum("ia,abnhwo,jb->nohiwj", at, mm, at).reshape(n_, -1, th * m, tw * m)
    return np.ascontiguousarray(y[:, :, :oh, :ow])


def geometry(ctx, xs, us):
    """Check a ConvWinograd node's shapes and attributes; (m, pads, OH, OW)."""
    m = int(ctx.attr("m", M))
    t = m + 2
    if xs is None or us is None or len(xs) != 5 or len(us) != 4:
        ctx.fail(f"ConvWinograd needs x N,CB,H,W,cb and weights [(m+2)^2, OCB, ICp, ob]; got x {xs}, u {us}")
    if us[0] != t * t or us[2] != xs[1] * xs[4] or us[3] != xs[4]:
        ctx.fail(f"ConvWinograd weights {tuple(us)} do not fit input {tuple(xs)} with m={m}: expected "
                 f"({t * t}, OCB, {xs[1] * xs[4]}, {xs[4]})")
    if int(ctx.attr("relu", 0)) and int(ctx.attr("swish", 0)):
        ctx.fail("ConvWinograd takes one activation: relu or swish, not both")
    pads = [int(p) for p in ctx.attr("pads", [1, 1, 1, 1])]
    if len(pads) != 4 or min(pads) < 0:
        ctx.fail(f"ConvWinograd pads must be 4 non-negative ints, got {pads}")
    oh, ow = xs[2] + pads[0] + pads[2] - 2, xs[3] + pads[1] + pads[3] - 2
    if oh < 1 or ow < 1:
        ctx.fail(f"ConvWinograd of a {xs[2]}x{xs[3]} input with pads {pads} has no output")
    return m, pads, oh, ow


def _infer(ctx):
    xs, us = ctx.shape(0), ctx.shape(1)
    if xs is None or not all(isinstance(d, int) for d in xs[1:]):
        ctx.fail(f"ConvWinograd needs a static input shape, got {ctx.tensor(0)}")
    _, _, oh, ow = geometry(ctx, xs, us)
    if ctx.has_input(2) and ctx.shape(2) != (us[1], us[3]):
        ctx.fail(f"ConvWinograd bias {ctx.shape(2)} must be packed as {(us[1], us[3])}")
    return [TensorType(ctx.dtype(0), (xs[0], us[1], oh, ow, us[3]))]


@op("ConvWinograd", infer=_infer, domain=DOMAIN, fusion=OPAQUE)
def conv_winograd(ctx, x, u, b=None):
    """3x3 stride-1 convolution of a blocked input by Winograd F(m x m, 3 x 3) with
    pre-transformed weights, as the native kernel computes it (float32 transforms)."""
    m, pads, _, _ = geometry(ctx, x.shape, u.shape)
    xc = compute_dtype(x)
    xn = from_blocked(xc, x.shape[1] * x.shape[-1])
    t2, ocb, icp, ob = u.shape
    un = compute_dtype(u).transpose(0, 1, 3, 2).reshape(t2, ocb * ob, icp)
    y = winograd_conv(xn, un, pads, m)
    if b is not None:
        y = y + compute_dtype(b).reshape(1, -1, 1, 1)
    if int(ctx.attr("relu", 0)):
        y = np.maximum(y, 0)
    if int(ctx.attr("swish", 0)):
        y = y * _sigmoid(y)
    return to_blocked(y, ob).astype(x.dtype, copy=False)
