"""kiln::FusedAttention: softmax(Q·Kᵀ·scale + mask)·V as one op, run by one native kernel.

The `fuse_attention` pass (kiln.passes.attention) rewrites the decomposed form
exporters emit (MatMul, scale, mask, Softmax, MatMul, with the head Transposes and
the grouped-query repeat around them) to this op, and the ONNX `Attention` op's
lowering uses the same kernel (kiln.lower.fused_attention):

    FusedAttention(q, k, v, mask?, kv_lens?)
        {q_perm, k_perm, v_perm, out_perm, scale, mask_kind, fill, causal, empty}

- q, k, v: 4-D tensors read through a permutation: the logical (batch, head, seq,
  dim) tensor is numpy.transpose(x, perm). K is logical [B, Hkv, Sk, D], not
  transposed; Hq must be a multiple of Hkv, query head h reading K/V head
  h // (Hq // Hkv) (grouped-query and multi-query attention, no repeat);
- mask: broadcastable (numpy, right-aligned) to the scores [B, Hq, Sq, Sk];
  mask_kind "add" (added to the scaled scores), "bool" (true: keep the score, false:
  the score becomes `fill`, as Where(mask, scores, fill)) or "bool_not" (the other way
  round, as Where(mask, fill, scores));
- causal: -1, or an offset c: key t is visible to query s iff t <= s + c;
- kv_lens: int64 [B], the keys each batch entry reads (clamped to [0, Sk], and to the
  mask's key width when it has one): K/V buffers of more rows than are filled (a KV cache
  read in place, kiln.passes.attention); keys past them are not visible;
- empty: what a row with no finite score gives (every key -inf): "nan" (softmax's
  0/0, as the decomposed graph computes it) or "zero" (ONNX Attention's rule);
- the output: logical [B, Hq, Sq, Dv] transposed by out_perm, in q's dtype.
"""

from __future__ import annotations

import numpy as np

from kiln.graph.types import TensorType
from kiln.ops.registry import OPAQUE, op

DOMAIN = "kiln"
MASK_KINDS = ("add", "bool", "bool_not")
EMPTY = ("nan", "zero")


def contiguous_strides(shape) -> list:
    """Row-major element strides (products of the dims: symbolic size Exprs stay Exprs)."""
    out, n = [], 1
    for d in reversed(tuple(shape)):
        out.append(n)
        n = n * (int(d) if isinstance(d, (int, np.integer)) else d)
    return out[::-1]


def mask_strides(mask_shape, scores_shape) -> tuple[int, ...] | None:
    """Strides over (b, h, sq, sk) of a mask broadcast (numpy, right-aligned) to the scores;
    None when it does not broadcast."""
    ms = tuple(int(d) if isinstance(d, (int, np.integer)) else d for d in mask_shape)   # sizes may be symbolic
    if len(ms) > 4:
        return None
    ms = (1,) * (4 - len(ms)) + ms
    st = contiguous_strides(ms)
    out = []
    for n, want, s in zip(ms, scores_shape, st):
        if n != 1 and n != want:
            return None
        out.append(0 if n == 1 else s)
    return tuple(out)


def _perm(ctx, name: str) -> tuple[int, ...]:
    p = tuple(int(i) for i in ctx.attr(name, [0, 1, 2, 3]))
    if sorted(p) != [0, 1, 2, 3]:
        ctx.fail(f"{name} must be a permutation of (0, 1, 2, 3), got {p}")
    return p


def _text(ctx, name: str, default: str, allowed) -> str:
    v = ctx.attr(name, default)
    v = v.decode() if isinstance(v, bytes) else v
    if v not in allowed:
        ctx.fail(f"{name} must be one of {list(allowed)}, got {v!r}")
    return v


def logical_shapes(ctx, shapes):
    """(q, k, v) logical shapes [B, H, S, D] from the inputs' shapes and perms, checked."""
    out = []
    for i, (name, shape) in enumerate(zip(("q", "k", "v"), shapes)):
        if shape is None:
            return None
        if len(shape) != 4:
            ctx.fail(f"{name} must be 4-D, got shape {tuple(shape)}")
        out.append(tuple(shape[p] for p in _perm(ctx, f"{name}_perm")))
    (b, hq, sq, d), (kb, hkv, sk, kd), (vb, vh, vs, dv) = out
    ints = all(isinstance(x, int) for x in (b, hq, kb, hkv, sk, d, kd, vb, vh, vs))
    if ints and (kb != b or vb != b or vh != hkv or vs != sk or kd != d or hkv <= 0 or hq % hkv):
        ctx.fail(f"q {out[0]}, k {out[1]}, v {out[2]} (logical [batch, heads, seq, dim]) do not fit: "
                 "K and V need Q's batch, one head count that divides Q's, one sequence length, and K Q's dim")
    return out


def _infer(ctx):
    _text(ctx, "mask_kind", "add", MASK_KINDS)
    _text(ctx, "empty", "nan", EMPTY)
    shapes = logical_shapes(ctx, [ctx.shape(i) for i in range(3)])
    if shapes is None:
        return [TensorType(ctx.dtype(0), ctx.unknown_shape(4))]
    (b, hq, sq, _), _, (_, _, _, dv) = shapes
    y = (b, hq, sq, dv)
    return [TensorType(ctx.dtype(0), tuple(y[p] for p in _perm(ctx, "out_perm")))]


@op("FusedAttention", infer=_infer, domain=DOMAIN, fusion=OPAQUE)
def fused_attention(ctx, q, k, v, mask=None, kv_lens=None):
    """The golden model on the logical tensors: the masked scores rounded to float32 (what the
    decomposed float32 graph computes: a row whose visible scores all carry -1e4 keeps float32's
    precision there, not float64's), softmax and P·V in float64."""
    ql, kl, vl = (np.transpose(x, _perm(ctx, f"{n}_perm")).astype(np.float64)
                  for x, n in ((q, "q"), (k, "k"), (v, "v")))
    group = ql.shape[1] // kl.shape[1]
    kl, vl = np.repeat(kl, group, axis=1), np.repeat(vl, group, axis=1)
    s = (ql @ np.swapaxes(kl, -1, -2) * float(ctx.attr("scale", 1.0))).astype(np.float32)
    rows = s.shape[3]
    if kv_lens is not None:   # keys past the lengths (and past a mask's width) are not visible
        width = rows if mask is None or np.shape(mask)[-1] == 1 else np.shape(mask)[-1]
        n = np.clip(np.asarray(kv_lens, np.int64).reshape(-1), 0, min(rows, width))
        if mask is not None and width < rows:
            pad = [(0, 0)] * (np.ndim(mask) - 1) + [(0, rows - width)]
            mask = np.pad(mask, pad)
        s = np.where(np.arange(rows)[None, None, None, :] < n[:, None, None, None], s, -np.inf).astype(np.float32)
    if mask is not None:
        kind, fill = _text(ctx, "mask_kind", "add", MASK_KINDS), np.float32(ctx.attr("fill", -np.inf))
        if kind == "add":
            s = s + mask.astype(np.float32)
        else:
            s = np.where(mask, s, fill) if kind == "bool" else np.where(mask, fill, s)
    s = s.astype(np.float64)
    causal = int(ctx.attr("causal", -1))
    if causal >= 0:
        i, j = np.arange(s.shape[2])[:, None], np.arange(s.shape[3])[None, :]
        s = np.where(j <= i + causal, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    empty = np.isneginf(m)
    e = np.exp(s - np.where(empty, 0, m))
    with np.errstate(invalid="ignore", divide="ignore"):
        p = e / np.sum(e, axis=-1, keepdims=True)
    p = np.where(empty, 0.0 if _text(ctx, "empty", "nan", EMPTY) == "zero" else np.nan, p)
    y = p @ vl
    return np.transpose(y, _perm(ctx, "out_perm")).astype(q.dtype)
