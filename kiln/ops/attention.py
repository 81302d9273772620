"""Attention: Attention (opset 23-25), RotaryEmbedding, LinearAttention, FlexAttention (ai.onnx.preview).

All four work on (batch, heads, seq, head_size) tensors; 3-D (batch, seq,
heads*head_size) inputs are split into heads on entry and merged on exit.
K/V heads are repeated for grouped/multi-query attention. Masking is one
additive bias (0 or -inf) composed from the mask input, causal and sliding
window bounds (offset-aware, bottom-right aligned) and padding lengths; a query
row with no visible key gives zeros, never NaN. Scores are computed in float32
(float64 for float64 inputs) and cast back.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.loops import call, cast, compute, const, max_, min_, reduce_axis, rmax, select, sum_
from kiln.ops.reduce import PARALLEL_MIN_WORK, as_dtype, exp_shifted, schedule_injective, schedule_reduction, text, wide
from kiln.ops.registry import InferCtx, LowerCtx, RunCtx, lowering, op
from kiln.ops.shapes import dim_mul, expect_shape
from kiln.lower.tensor import checked_index


# ---- shared helpers ----

def split_heads(x: np.ndarray, heads: int) -> np.ndarray:
    """(B, T, H*D) -> (B, H, T, D)."""
    b, t, hd = x.shape
    return x.reshape(b, t, heads, hd // heads).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, H, T, D) -> (B, T, H*D)."""
    b, h, t, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * d)


def repeat_kv(x: np.ndarray, q_heads: int) -> np.ndarray:
    """Share each K/V head among a contiguous group of query heads (GQA/MQA)."""
    return np.repeat(x, q_heads // x.shape[1], axis=1) if x.shape[1] != q_heads else x


def compute_dtype(dtype) -> np.dtype:
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def safe_softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis where an all -inf row gives zeros instead of NaN."""
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isneginf(m), 0, m))
    s = np.sum(e, axis=-1, keepdims=True)
    return e / np.where(s == 0, 1, s)


def _div(ctx, d, n: int):
    if isinstance(d, int):
        if d % n:
            ctx.fail(f"hidden size {d} is not divisible by the number of heads {n}")
        return d // n
    return ctx.new_dim()


def _add(ctx, a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    return a if b == 0 else b if a == 0 else ctx.new_dim()


def _check_heads(ctx, q_heads, kv_heads):
    if isinstance(q_heads, int) and isinstance(kv_heads, int) and (kv_heads <= 0 or q_heads % kv_heads):
        ctx.fail(f"q_num_heads ({q_heads}) must be a positive multiple of kv_num_heads ({kv_heads})")


# ---- Attention ----

def _attention_dims(ctx: InferCtx):
    """(batch, q_heads, kv_heads, q_seq, kv_seq, head_size, v_head_size) from Q/K/V shapes and attributes."""
    q, k, v = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if q is None or k is None or v is None:
        return None
    if not (len(q) == len(k) == len(v) and len(q) in (3, 4)):
        ctx.fail(f"Q, K, V must all be 3-D or all 4-D, got shapes {q}, {k}, {v}")
    if len(q) == 4:
        if ctx.opset >= 25 and (ctx.has_attr("q_num_heads") or ctx.has_attr("kv_num_heads")):
            ctx.fail("q_num_heads and kv_num_heads must not be given for 4-D inputs")
        dims = (q[0], q[1], k[1], q[2], k[2], q[3], v[3])
    else:
        hq, hkv = ctx.attr("q_num_heads", None), ctx.attr("kv_num_heads", None)
        if hq is None or hkv is None:
            ctx.fail("3-D inputs need the q_num_heads and kv_num_heads attributes")
        dims = (q[0], hq, hkv, q[1], k[1], _div(ctx, q[2], hq), _div(ctx, v[2], hkv))
    _check_heads(ctx, dims[1], dims[2])
    b, _, hkv, _, skv, d, dv = dims
    heads_k = (k[1], k[3]) if len(q) == 4 else (k[2],)
    want_k = (hkv, d) if len(q) == 4 else (dim_mul(hkv, d, ctx),)
    if len(q) == 4:
        mism = [(k[0], b), (v[0], b), (k[1], hkv), (v[1], hkv), (v[2], skv), (k[3], d)]
    else:
        mism = [(k[0], b), (v[0], b), (v[1], skv)] + list(zip(heads_k, want_k))
    if any(isinstance(x, int) and isinstance(y, int) and x != y for x, y in mism):
        ctx.fail(f"Q {tuple(q)}, K {tuple(k)}, V {tuple(v)} do not fit together: K and V need Q's batch, "
                 "K/V heads and sequence length in common, and K the head size of Q")
    if ctx.has_input(4) or ctx.has_input(5):
        pk = ctx.shape(4) if ctx.has_input(4) else None
        past = pk[2] if pk is not None and len(pk) == 4 else "past"
        expect_shape(ctx, 4, (b, hkv, past, d), "past_key")
        expect_shape(ctx, 5, (b, hkv, past, dv), "past_value")
    return dims


def _attention_infer(ctx: InferCtx):
    t = ctx.dtype(0)
    dims = _attention_dims(ctx)
    if dims is None:
        four = [TensorType(dt, ctx.unknown_shape(4)) for dt in (t, ctx.dtype(2), t)]
        return [TensorType(t, None), *four][:max(ctx.num_outputs, 1)]
    b, hq, hkv, sq, skv, d, dv = dims
    past = ctx.shape(4) if ctx.has_input(4) else None
    total = skv if not ctx.has_input(4) else (_add(ctx, past[2], skv) if past is not None else ctx.new_dim())
    y = (b, hq, sq, dv) if len(ctx.shape(0)) == 4 else (b, sq, dim_mul(hq, dv, ctx))
    return [TensorType(t, y), TensorType(t, (b, hkv, total, d)), TensorType(ctx.dtype(2), (b, hkv, total, dv)),
            TensorType(t, (b, hq, sq, total))][:max(ctx.num_outputs, 1)]


def _attention_bias(ctx: RunCtx, mask, sq: int, total: int, offset, nonpad, dt) -> np.ndarray:
    """Additive bias (0 or -inf, plus a float mask) of shape broadcastable to (B, H, Sq, total)."""
    i = np.arange(sq).reshape(sq, 1)
    j = np.arange(total).reshape(1, total)
    pos = i + offset  # absolute query position; offset is scalar or (B, 1, 1, 1)
    allowed = np.ones(np.broadcast_shapes(np.shape(pos), (1, total)), dtype=bool)
    if ctx.attr("is_causal", 0):
        allowed &= j <= pos
    left, right = ctx.attr("left_window_size", -1), ctx.attr("right_window_size", -1)
    if left >= 0:
        allowed &= pos - j <= left
    if right >= 0:
        allowed &= j - pos <= right
    if nonpad is not None:
        allowed = allowed & (j < nonpad.reshape(-1, 1, 1, 1))
    bias = np.where(allowed, 0.0, -np.inf).astype(dt)
    if mask is not None:
        pad = total - mask.shape[-1]
        if pad < 0:
            ctx.fail(f"attn_mask last dim {mask.shape[-1]} exceeds total sequence length {total}")
        if mask.dtype == np.bool_:
            mask = np.where(mask, 0.0, -np.inf)
        mask = np.pad(mask.astype(dt), [(0, 0)] * (mask.ndim - 1) + [(0, pad)], constant_values=-np.inf)
        bias = bias + mask
    return bias


@op("Attention", infer=_attention_infer)
def attention(ctx: RunCtx, q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None):
    three_d = q.ndim == 3
    if three_d:
        q, k, v = split_heads(q, ctx.attr("q_num_heads")), split_heads(k, ctx.attr("kv_num_heads")), \
            split_heads(v, ctx.attr("kv_num_heads"))
    if (past_key is None) != (past_value is None):
        ctx.fail("past_key and past_value must be given together")
    present_k = k if past_key is None else np.concatenate([past_key, k], axis=2)
    present_v = v if past_value is None else np.concatenate([past_value, v], axis=2)
    dt = compute_dtype(q.dtype)
    hq, sq, total = q.shape[1], q.shape[2], present_k.shape[2]
    offset = past_key.shape[2] if past_key is not None else \
        (nonpad_kv_seqlen.reshape(-1, 1, 1, 1) - sq if nonpad_kv_seqlen is not None else 0)
    bias = _attention_bias(ctx, attn_mask, sq, total, offset, nonpad_kv_seqlen, dt)

    scale = ctx.attr("scale", None)
    root = np.sqrt(1.0 / np.sqrt(q.shape[3]) if scale is None else scale).astype(q.dtype)
    raw = np.matmul((q * root).astype(dt), np.swapaxes(repeat_kv((present_k * root).astype(dt), hq), -1, -2))
    cap = ctx.attr("softcap", 0.0)
    capped = cap * np.tanh(raw / cap) if cap > 0 else raw
    scores = capped + bias
    precision = ctx.attr("softmax_precision", 0)
    logits = scores.astype(DType.from_onnx(precision).np).astype(dt) if precision else scores
    probs = np.where(np.isneginf(np.max(bias, axis=-1, keepdims=True)), 0, safe_softmax(logits)).astype(dt)
    y = np.matmul(probs, repeat_kv(present_v.astype(dt), hq))
    y = as_dtype(merge_heads(y) if three_d else y, q.dtype)
    qk = (raw, capped, scores, probs)[ctx.attr("qk_matmul_output_mode", 0)]
    outs = (y, present_k, present_v, np.broadcast_to(qk, probs.shape).astype(q.dtype))
    return outs[:max(ctx.num_outputs, 1)]


# ---- RotaryEmbedding ----

def _rotary_infer(ctx: InferCtx):
    s = ctx.shape(0)
    if s is not None and len(s) not in (3, 4):
        ctx.fail(f"input must be 3-D or 4-D, got shape {s}")
    if s is not None and len(s) == 3 and not ctx.attr("num_heads", 0):
        ctx.fail("3-D input needs the num_heads attribute")
    if s is not None:
        b, seq = s[0], s[2] if len(s) == 4 else s[1]
        if ctx.has_input(3):   # cos/sin caches (max position, rotary_dim / 2), indexed by position
            expect_shape(ctx, 3, (b, seq), "position_ids")
            for i, name in ((1, "cos_cache"), (2, "sin_cache")):
                c = ctx.shape(i)
                if c is not None and len(c) != 2:
                    ctx.fail(f"input {i} ({name}) has shape {tuple(c)}, expected (max position, rotary dim / 2)")
        else:                  # caches per (batch, position)
            for i, name in ((1, "cos_cache"), (2, "sin_cache")):
                c = ctx.shape(i)
                if c is not None and (len(c) != 3 or any(isinstance(g, int) and isinstance(w, int) and g != w
                                                          for g, w in zip(c[:2], (b, seq)))):
                    ctx.fail(f"input {i} ({name}) has shape {tuple(c)}, expected ({b}, {seq}, rotary dim / 2)")
    return [ctx.tensor(0)]


@op("RotaryEmbedding", infer=_rotary_infer)
def rotary_embedding(ctx: RunCtx, x, cos_cache, sin_cache, position_ids=None):
    """Rotate pairs of features (halves, or even/odd when interleaved) by position-dependent angles."""
    xs = np.swapaxes(x, 1, 2) if x.ndim == 4 else x.reshape(*x.shape[:2], ctx.attr("num_heads"), -1)
    xs = wide(xs)  # (B, S, H, D)
    rd = ctx.attr("rotary_embedding_dim", 0) or xs.shape[-1]
    if position_ids is not None:
        bad = (position_ids < 0) | (position_ids >= cos_cache.shape[0])
        if bad.any():
            ctx.fail(f"position_ids value {int(position_ids[bad].reshape(-1)[0])} is out of range "
                     f"[0, {cos_cache.shape[0] - 1}] of the cos/sin cache rows")
        cos_cache, sin_cache = cos_cache[position_ids], sin_cache[position_ids]
    if cos_cache.shape[-1] != rd // 2 or sin_cache.shape[-1] != rd // 2:
        ctx.fail(f"cos/sin cache last dim must be rotary_embedding_dim/2 = {rd // 2}, "
                 f"got {cos_cache.shape[-1]} and {sin_cache.shape[-1]}")
    cos, sin = wide(cos_cache)[:, :, None, :], wide(sin_cache)[:, :, None, :]
    first, second = (slice(0, rd, 2), slice(1, rd, 2)) if ctx.attr("interleaved", 0) else \
        (slice(0, rd // 2), slice(rd // 2, rd))
    out = xs.copy()
    out[..., first] = cos * xs[..., first] - sin * xs[..., second]
    out[..., second] = sin * xs[..., first] + cos * xs[..., second]
    out = np.swapaxes(out, 1, 2) if x.ndim == 4 else out.reshape(x.shape)
    return as_dtype(out, x.dtype)


# ---- LinearAttention ----

_UPDATE_RULES = {"linear": (False, False), "gated": (True, False), "delta": (False, True),
                 "gated_delta": (True, True)}  # rule -> (decay gate, delta correction)


def _linear_attention_rule(ctx):
    rule = text(ctx.attr("update_rule", "gated_delta"))
    if rule not in _UPDATE_RULES:
        ctx.fail(f"update_rule must be one of {sorted(_UPDATE_RULES)}, got {rule!r}")
    gated, delta = _UPDATE_RULES[rule]
    for i, name, needed in ((4, "decay", gated), (5, "beta", delta)):
        if ctx.has_input(i) != needed:
            ctx.fail(f"update_rule {rule!r} {'requires' if needed else 'forbids'} the {name} input")
    return gated, delta


def _linear_attention_infer(ctx: InferCtx):
    _linear_attention_rule(ctx)
    hq, hkv = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
    _check_heads(ctx, hq, hkv)
    q, k, v = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    state_t = ctx.dtype(3) if ctx.has_input(3) else ctx.dtype(0)
    if q is None or k is None or v is None:
        return [TensorType(ctx.dtype(0), ctx.unknown_shape(3)), TensorType(state_t, ctx.unknown_shape(4))]
    if not len(q) == len(k) == len(v) == 3:
        ctx.fail(f"query, key, value must be 3-D (B, T, H*D), got shapes {q}, {k}, {v}")
    dv = _div(ctx, v[2], hkv)
    _linear_attention_shapes(ctx, q, k, v, hq, hkv, dv)
    return [TensorType(ctx.dtype(0), (q[0], q[1], dim_mul(hq, dv, ctx))),
            TensorType(state_t, (q[0], hkv, _div(ctx, q[2], hq), dv))]


def _linear_attention_shapes(ctx: InferCtx, q, k, v, hq: int, hkv: int, dv) -> None:
    """The operands against each other: key and value (B, T, Hkv*dk / Hkv*dv) share the
    query's batch and sequence and its head size, past_state is (B, Hkv, dk, dv), decay
    (B, T, Hkv or Hkv*dk), beta (B, T, Hkv or 1): the kernel indexes all of them by the
    query's dims."""
    def same(a, b):
        return not (isinstance(a, int) and isinstance(b, int)) or a == b
    dk = _div(ctx, q[2], hq)
    if not all(same(q[j], x[j]) for x in (k, v) for j in (0, 1)) or not same(k[2], dim_mul(hkv, dk, ctx)):
        ctx.fail(f"key {tuple(k)} and value {tuple(v)} must be (B, T, kv_num_heads * head size) for "
                 f"query {tuple(q)}: (B, T) = {tuple(q[:2])}, key's last dim {hkv} * {dk}")
    b, t = q[0], q[1]
    expect_shape(ctx, 3, (b, hkv, dk, dv), "past_state")
    for i, name, sizes in ((4, "decay", (hkv, dim_mul(hkv, dk, ctx))), (5, "beta", (hkv, 1))):
        got = ctx.shape(i) if ctx.has_input(i) else None
        if got is None:
            continue
        if len(got) != 3 or not (same(got[0], b) and same(got[1], t)) or not any(same(got[2], n) for n in sizes):
            ctx.fail(f"input {i} ({name}) has shape {tuple(got)}, expected ({b}, {t}, {sizes[0]} or {sizes[1]})")


@op("LinearAttention", infer=_linear_attention_infer)
def linear_attention(ctx: RunCtx, query, key, value, past_state=None, decay=None, beta=None):
    """The token-by-token recurrence over a (d_k, d_v) state per K/V head."""
    gated, delta = _linear_attention_rule(ctx)
    hq, hkv = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
    q, k, v = (wide(split_heads(a, h)) for a, h in ((query, hq), (key, hkv), (value, hkv)))
    b, _, t, dk = q.shape
    if gated:  # (B, T, Hkv) per-head or (B, T, Hkv*dk) per-key-dim decay -> (B, Hkv, T, 1 or dk)
        gate = np.exp(wide(split_heads(decay, hkv)))
    if delta:  # (B, T, Hkv) or (B, T, 1) -> (B, Hkv or 1, T, 1)
        rate = wide(split_heads(beta, beta.shape[-1]))
    state = np.zeros((b, hkv, dk, v.shape[-1])) if past_state is None else wide(past_state).copy()
    if state.shape != (b, hkv, dk, v.shape[-1]):
        ctx.fail(f"past_state must have shape {(b, hkv, dk, v.shape[-1])}, got {state.shape}")
    scale = ctx.attr("scale", 0.0) or 1.0 / np.sqrt(dk)
    out = np.empty((b, hq, t, v.shape[-1]))
    for i in range(t):
        if gated:
            state = state * gate[:, :, i, :, None]
        vi = v[:, :, i]
        if delta:
            vi = rate[:, :, i] * (vi - np.einsum("bhdm,bhd->bhm", state, k[:, :, i]))
        state = state + k[:, :, i, :, None] * vi[:, :, None, :]
        out[:, :, i] = scale * np.einsum("bhd,bhdm->bhm", q[:, :, i], repeat_kv(state, hq))
    state_dtype = query.dtype if past_state is None else past_state.dtype
    return as_dtype(merge_heads(out), query.dtype), as_dtype(state, state_dtype)


# ---- FlexAttention (ai.onnx.preview) ----

def _flex_softmax_dtype(ctx, q_dtype) -> DType:
    p = ctx.attr("softmax_precision", 0)
    return DType.from_onnx(p) if p else DType.from_numpy(compute_dtype(q_dtype))


def _flex_infer(ctx: InferCtx):
    q, k, v = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if any(s is not None and len(s) != 4 for s in (q, k, v)):
        ctx.fail(f"Q, K, V must be 4-D, got shapes {q}, {k}, {v}")
    shape = None if q is None or k is None or v is None else (q[0], q[1], q[2], v[3])
    if shape is not None:
        _check_heads(ctx, q[1], k[1])
    scores = TensorType(_flex_softmax_dtype(ctx, ctx.dtype(0).np), None if shape is None else (q[0], q[1], q[2], k[2]))
    for name in ("score_mod", "prob_mod"):
        if ctx.has_attr(name):
            ctx.infer_subgraph(ctx.attr(name), [scores])
    return [TensorType(ctx.dtype(0), shape)]


@op("FlexAttention", infer=_flex_infer, domain="ai.onnx.preview")
def flex_attention(ctx: RunCtx, q, k, v):
    """Scaled dot-product attention with optional score/probability modifier subgraphs."""
    dt = _flex_softmax_dtype(ctx, q.dtype).np
    scale = ctx.attr("scale", None)
    root = np.sqrt(np.float32(1.0 / np.sqrt(q.shape[3]) if scale is None else scale)).astype(q.dtype)
    hq = q.shape[1]
    scores = np.matmul(wide(q * root), np.swapaxes(wide(repeat_kv(k * root, hq)), -1, -2)).astype(dt)

    def modify(name, x):
        return np.asarray(ctx.run_subgraph(ctx.attr(name), [x])[0]).astype(dt) if ctx.has_attr(name) else x

    probs = modify("prob_mod", safe_softmax(modify("score_mod", scores)).astype(dt))
    return as_dtype(np.matmul(wide(probs), wide(repeat_kv(v, hq))), v.dtype)


# ==== native lowerings (target "cpu") ====

_I64 = DType.int64


def _heads_view(x, heads: int):
    """(b, head, pos, d) -> element of a 4-D (B, H, S, D) or 3-D (B, S, H*D) tensor."""
    if len(x.shape) == 4:
        return lambda b, h, t, d: x[b, h, t, d]
    size = x.shape[2] // heads
    return lambda b, h, t, d: x[b, t, h * size + d]


def _concat_past(past, new, p: int):
    """Present keys/values: `past` positions [0, p) then the new ones (indices clamped so
    the unused branch of the select never reads out of bounds)."""
    if past is None:
        return new
    last = const(p - 1, _I64)
    return lambda b, h, t, d: select(t < p, past[b, h, min_(t, last), d], new(b, h, max_(t - p, const(0, _I64)), d))


@lowering("Attention")
def _attention_lower(ctx: LowerCtx, q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None):
    """softmax(mask(cap(Q·Kᵀ·scale))) · V as computes: scaled Q and transposed scaled K,
    the raw scores (reduction over the head dim), row max, then per row the exp-sum,
    probabilities and their product with V (reduction over keys)."""
    if (past_key is None) != (past_value is None):
        ctx.fail("past_key and past_value must be given together")
    four = len(q.shape) == 4
    if four:
        (nb, hq, sq, d), hkv, dv = q.shape, k.shape[1], v.shape[3]
    else:
        hq, hkv = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
        nb, sq, d, dv = q.shape[0], q.shape[1], q.shape[2] // hq, v.shape[2] // hkv
    p = past_key.shape[2] if past_key is not None else 0
    total = p + k.shape[-2 if four else 1]
    if total == 0 or d == 0:
        ctx.fail("attention over an empty key sequence or head size has no native lowering")
    qdt = q.dtype
    dt = DType.float64 if qdt is DType.float64 else DType.float32
    qv = _heads_view(q, hq)
    kp = _concat_past(past_key, _heads_view(k, hkv), p)
    vp = _concat_past(past_value, _heads_view(v, hkv), p)
    scale = ctx.attr("scale", None)
    root_value = float(np.sqrt(1.0 / np.sqrt(d) if scale is None else scale).astype(qdt.np))

    def root(like):  # the reference's sqrt(scale) in Q's dtype, multiplied in each input's own
        return const(root_value, like.dtype)

    dims = (nb, hq, hkv, sq, total, d, dv)
    qs, ks, raw = _qk(qv, kp, root, dims, dt)
    cap = float(ctx.attr("softcap", 0.0))

    def capped(i):
        return const(cap, dt) * call("tanh", raw[i] / const(cap, dt)) if cap > 0 else raw[i]
    visible, add = _attention_mask(ctx, attn_mask, nonpad_kv_seqlen, sq, total, p, dt)

    def scores(i):
        c = capped(i)
        c = c + add(i) if add else c
        return select(visible(i), c, const(-math.inf, dt)) if visible else c
    precision = ctx.attr("softmax_precision", 0)
    pdt = DType.from_onnx(precision) if precision else dt

    def logits(i):
        return cast(dt, cast(pdt, scores(i))) if pdt is not dt else scores(i)
    m, ex, ssum, probs, y4 = _softmax_pv(logits, vp, dims, dt, dt)
    if four:
        y = y4 if qdt is dt else compute(y4.shape, lambda *i: cast(qdt, y4[i]), "y")
    else:
        y = compute((nb, sq, hq * dv), lambda b, s, n: cast(qdt, y4[b, n // dv, s, n % dv]), "y")
    mode = ctx.attr("qk_matmul_output_mode", 0)
    extra = [("present_key", (nb, hkv, total, d), kp), ("present_value", (nb, hkv, total, dv), vp),
             ("qk", probs.shape, [lambda *i: raw[i], lambda *i: capped(i), lambda *i: scores(i),
                                  lambda *i: probs[i]][mode])]
    outs = [y] + [compute(shape, lambda *i, f=f, k=k: cast(ctx.out_dtype(k), f(*i)), name)
                  if ctx.output_used(k) else compute((), lambda: const(0, qdt), f"unused{k}")
                  for k, (name, shape, f) in enumerate(extra, 1) if k < ctx.num_outputs]
    ctx.schedule(lambda sch, _: _attention_schedule(sch, qs, ks, raw, m, ex, ssum, probs, y4))
    return outs


def _qk(qv, kp, root, dims, acc: DType):
    """Scaled Q, transposed scaled K (keys contiguous) and their product over the head dim,
    in `acc`: the raw scores (batch, q head, query, key)."""
    nb, hq, hkv, sq, total, d, _ = dims
    group = hq // hkv
    qs = compute((nb, hq, sq, d), lambda b, h, s, e: cast(acc, qv(b, h, s, e) * root(qv(b, h, s, e))), "qs")
    ks = compute((nb, hkv, d, total), lambda b, g, e, t: cast(acc, kp(b, g, t, e) * root(kp(b, g, t, e))), "ks")
    r = reduce_axis(d, "e")
    raw = compute((nb, hq, sq, total), lambda b, h, s, t: sum_(qs[b, h, s, r] * ks[b, h // group, r, t], r), "raw")
    return qs, ks, raw


def _softmax_pv(logits, vp, dims, dt: DType, acc: DType, prob_mod=None):
    """Softmax over keys in `dt` where an all -inf row gives zeros (shift 0, sum 0 -> 1),
    then its product with V accumulated in `acc`: (max, exp, sum, probs, output).
    `prob_mod(probs)`, when given, is the tensor P·V reads instead of the probabilities."""
    nb, hq, hkv, sq, total, _, dv = dims
    group = hq // hkv
    ninf, zero, one = const(-math.inf, dt), const(0, dt), const(1, dt)
    t_ = reduce_axis(total, "t")
    m = compute((nb, hq, sq, 1), lambda b, h, s, z: rmax(logits((b, h, s, t_)), t_), "max")

    def shift(b, h, s):
        mx = m[b, h, s, 0]
        return select(mx.eq(ninf), zero, mx)
    ex = compute((nb, hq, sq, total), lambda b, h, s, t: exp_shifted(logits((b, h, s, t)) - shift(b, h, s)), "exp")
    t2 = reduce_axis(total, "t")
    ssum = compute((nb, hq, sq, 1), lambda b, h, s, z: sum_(ex[b, h, s, t2], t2), "sum")

    def prob(b, h, s, t):
        den = ssum[b, h, s, 0]
        return ex[b, h, s, t] / select(den.eq(zero), one, den)
    probs = compute((nb, hq, sq, total), prob, "probs")
    p = probs if prob_mod is None else prob_mod(probs)
    t3 = reduce_axis(total, "t")
    y4 = compute((nb, hq, sq, dv), lambda b, h, s, e: sum_(cast(acc, p[b, h, s, t3]) *
                                                           cast(acc, vp(b, h // group, t3, e)), t3), "y4")
    return m, ex, ssum, probs, y4


def _attention_mask(ctx: LowerCtx, mask, nonpad, sq: int, total: int, p: int, dt: DType):
    """(visible(i) or None, additive(i) or None) over score index i = (b, h, s, t): causal
    and window bounds (offset by the past length, or by nonpad_kv_seqlen - Sq), padding,
    a boolean mask (visible where True) and a float mask (added), both right-aligned and
    -inf beyond the mask's last dim, as the reference's bias."""
    conds = []

    def pos(b, s):  # the query's absolute position
        if p or nonpad is None:
            return s + p
        return s + cast(_I64, nonpad[(b,)]) - sq
    if ctx.attr("is_causal", 0):
        conds.append(lambda b, s, t: t <= pos(b, s))
    left, right = ctx.attr("left_window_size", -1), ctx.attr("right_window_size", -1)
    if left >= 0:
        conds.append(lambda b, s, t: pos(b, s) - t <= left)
    if right >= 0:
        conds.append(lambda b, s, t: t - pos(b, s) <= right)
    if nonpad is not None:
        conds.append(lambda b, s, t: t < cast(_I64, nonpad[(b,)]))
    bool_mask = add = None
    if mask is not None:
        ms, width = tuple(mask.shape), mask.shape[-1]
        if width > total:
            ctx.fail(f"attn_mask last dim {width} exceeds total sequence length {total}")

        def at(i):  # right-aligned broadcast; the last dim clamped (beyond it: masked out)
            idx = [const(0, _I64) if n == 1 else j for n, j in zip(ms, i[len(i) - len(ms):])]
            idx[-1] = min_(i[3], const(width - 1, _I64))
            return mask[tuple(idx)]
        if mask.dtype is DType.bool:
            bool_mask = at
        else:
            add = (lambda i: cast(dt, at(i)))
        if width < total:
            conds.append(lambda b, s, t: t < width)
    if not conds and bool_mask is None:
        return None, add

    def visible(i):
        b, _, s, t = i
        out = bool_mask(i) if bool_mask else None
        for c in conds:
            out = c(b, s, t) if out is None else out & c(b, s, t)
        return out
    return visible, add


def _attention_schedule(sch, qs, ks, raw, m, ex, ssum, probs, y4) -> None:
    """Every pass parallel over (batch, head, query) rows and vectorized along them. Q·Kᵀ
    runs the head dim outside the keys (contiguous in the transposed K); the row max and
    exp-sum reduce across lanes; the probabilities are inlined into P·V, which runs the
    keys outside the value dim."""
    for t in (qs, ks):
        schedule_injective(sch[t])
    work = math.prod(raw.shape) * qs.shape[3] >= PARALLEL_MIN_WORK

    def rows(t, reduce_outside: bool = False):
        st = sch[t]
        b, h, s, j = st.axis
        row = st.fuse(b, h, s)
        if reduce_outside:
            st.reorder(*st.reduce_axis, j)
        if work:
            st.parallel(row)
        st.vectorize(j)
    rows(raw, True)
    rows(ex)
    rows(y4, True)
    schedule_reduction(sch, m)
    schedule_reduction(sch, ssum)
    if sch.consumers(sch[probs]) == [sch[y4]]:
        sch[probs].compute_inline()
    else:  # the probabilities are also an output: a pass of their own
        rows(probs)
    for stage in sch.stages:
        if stage.attach is None and not stage.relations and not stage.kinds and not stage.reduce_axis:
            schedule_injective(stage)


@lowering("RotaryEmbedding")
def _rotary_lower(ctx: LowerCtx, x, cos_cache, sin_cache, position_ids=None):
    """Each feature d < rotary_dim pairs with a partner (the other half, or its even/odd
    neighbour when interleaved): first of a pair cos*x - sin*partner, second
    sin*partner + cos*x; later features pass through. In float64, as the reference."""
    f64, shape = DType.float64, tuple(x.shape)
    if len(shape) == 4:
        nb, _, seq, d = shape
        parts = lambda i: (i[0], i[2], i[3])  # noqa: E731  (b, s, d) of an element
        at = lambda i, e: x[i[0], i[1], i[2], e]  # noqa: E731
    else:
        heads = ctx.attr("num_heads")
        nb, seq, d = shape[0], shape[1], shape[2] // heads
        parts = lambda i: (i[0], i[1], i[2] % d)  # noqa: E731
        at = lambda i, e: x[i[0], i[1], i[2] - i[2] % d + e]  # noqa: E731
    rd = ctx.attr("rotary_embedding_dim", 0) or d
    half = rd // 2
    if cos_cache.shape[-1] != half or sin_cache.shape[-1] != half:
        ctx.fail(f"cos/sin cache last dim must be rotary_embedding_dim/2 = {half}, "
                 f"got {cos_cache.shape[-1]} and {sin_cache.shape[-1]}")
    interleaved = bool(ctx.attr("interleaved", 0))

    def cache(c, b, s, j):
        if position_ids is None:
            return cast(f64, c[b, s, j])
        n = c.shape[0]
        pos = checked_index(ctx, position_ids[b, s], 0, n - 1,
                            f"position_ids value {{value}} is out of range [0, {n - 1}] of the cos/sin cache rows")
        return cast(f64, c[pos, j])

    def body(*i):
        b, s, e = parts(i)
        rot = e < rd
        if interleaved:
            first, j, partner = (e % 2).eq(0), e // 2, e + 1 - 2 * (e % 2)
        else:
            first, j, partner = e < half, e % half, (e + half) % rd
        j, partner = select(rot, j, const(0, _I64)), select(rot, partner, e)
        xe, xp = cast(f64, at(i, e)), cast(f64, at(i, partner))
        c, sn = cache(cos_cache, b, s, j), cache(sin_cache, b, s, j)
        return cast(x.dtype, select(rot, select(first, c * xe - sn * xp, sn * xp + c * xe), xe))
    y = compute(shape, body, "y")
    ctx.schedule(lambda sch, _: schedule_injective(sch[y]))
    return y


def _flex_mod(ctx: LowerCtx, name: str, x, dt: DType):
    """`x` through the `name` subgraph, inlined as expressions (kiln.lower.subgraph), in `dt`;
    `x` itself when the node has no such subgraph."""
    if not ctx.has_attr(name):
        return x
    from kiln.lower.subgraph import inline_body
    outs = inline_body(ctx, ctx.attr(name), [x], name)
    if len(outs) != 1 or tuple(outs[0].shape) != tuple(x.shape):
        ctx.fail(f"{name} must give one tensor of shape {tuple(x.shape)}, got "
                 f"{[tuple(t.shape) for t in outs]}", stage="lower")
    return compute(x.shape, lambda *i: cast(dt, outs[0][i]), name)


@lowering("FlexAttention", domain="ai.onnx.preview")
def _flex_lower(ctx: LowerCtx, q, k, v):
    """Scores accumulated in float64 and cast to the softmax dtype, the safe softmax there,
    P·V accumulated in float64 (as the reference). score_mod / prob_mod subgraphs become
    expressions inlined into the scores and into P·V."""
    (nb, hq, sq, d), (_, hkv, total, _), dv = q.shape, k.shape, v.shape[3]
    if total == 0 or d == 0:
        ctx.fail("attention over an empty key sequence or head size has no native lowering")
    dt, f64 = _flex_softmax_dtype(ctx, q.dtype.np), DType.float64
    scale = ctx.attr("scale", None)
    root_value = float(np.sqrt(np.float32(1.0 / np.sqrt(d) if scale is None else scale)).astype(q.dtype.np))
    dims = (nb, hq, hkv, sq, total, d, dv)
    qs, ks, raw = _qk(_heads_view(q, hq), _heads_view(k, hkv), lambda like: const(root_value, like.dtype), dims, f64)
    logits = raw
    if ctx.has_attr("score_mod"):
        logits = _flex_mod(ctx, "score_mod", compute(raw.shape, lambda *i: cast(dt, raw[i]), "scores"), dt)
    m, ex, ssum, probs, y4 = _softmax_pv(lambda i: cast(dt, logits[i]), _heads_view(v, hkv), dims, dt, f64,
                                         lambda p: _flex_mod(ctx, "prob_mod", p, dt))
    y = compute(y4.shape, lambda *i: cast(v.dtype, y4[i]), "y")
    keep = {id(t) for t in (qs, ks, raw, m, ex, ssum, probs, y4, y)}

    def schedule(sch, outs):
        keep.update(id(t) for t in outs)
        for st in sch.stages:  # the modifiers' stages: expressions in the scores and in P·V
            if id(st.tensor) not in keep and not st.reduce_axis and st.attach is None:
                st.compute_inline()
        _attention_schedule(sch, qs, ks, raw, m, ex, ssum, probs, y4)
    ctx.schedule(schedule)
    return y


_LINEAR_ATTENTION_C = """
  const int64_t B = {b}, T = {t}, HQ = {hq}, HKV = {hkv}, DK = {dk}, DV = {dv}, G = {hq} / {hkv};
  const int64_t DW = {dw}, BH = {bh};
  const double scale = {scale};
  int32_t failed = 0;
  #pragma omp parallel for collapse(2) schedule(static) if (B * HKV > 1 && B * T * HQ * DK * DV >= {par})
  for (int64_t b = 0; b < B; ++b)
  for (int64_t g = 0; g < HKV; ++g) {{
    double* S = (double*)malloc((size_t)(DK * DV + DV) * sizeof(double));
    if (!S) {{
      #pragma omp atomic write
      failed = 1;
      continue;
    }}
    double* u = S + DK * DV;
    for (int64_t x = 0; x < DK * DV; ++x) S[x] = {init};
    for (int64_t i = 0; i < T; ++i) {{
      const int64_t bt = b * T + i;
      if ({gated}) for (int64_t d = 0; d < DK; ++d) {{
        const double a = exp((double){decay}[(bt * HKV + g) * DW + (DW == 1 ? 0 : d)]);
        for (int64_t m = 0; m < DV; ++m) S[d * DV + m] *= a;
      }}
      for (int64_t m = 0; m < DV; ++m) u[m] = (double){v}[(bt * HKV + g) * DV + m];
      if ({delta}) {{
        const double r = (double){beta}[bt * BH + (BH == 1 ? 0 : g)];
        for (int64_t m = 0; m < DV; ++m) {{
          double kv = 0;
          for (int64_t d = 0; d < DK; ++d) kv += S[d * DV + m] * (double){k}[(bt * HKV + g) * DK + d];
          u[m] = r * (u[m] - kv);
        }}
      }}
      for (int64_t d = 0; d < DK; ++d) {{
        const double kd = (double){k}[(bt * HKV + g) * DK + d];
        for (int64_t m = 0; m < DV; ++m) S[d * DV + m] += kd * u[m];
      }}
      for (int64_t h = g * G; h < (g + 1) * G; ++h)
        for (int64_t m = 0; m < DV; ++m) {{
          double acc = 0;
          for (int64_t d = 0; d < DK; ++d) acc += (double){q}[(bt * HQ + h) * DK + d] * S[d * DV + m];
          out0[(bt * HQ + h) * DV + m] = ({to})(scale * acc);
        }}
    }}
    for (int64_t x = 0; x < DK * DV; ++x) out1[(b * HKV + g) * DK * DV + x] = ({ts})S[x];
    free(S);
  }}
  return failed ? -1 : 0;
"""


@lowering("LinearAttention")
def _linear_attention_lower(ctx: LowerCtx, query, key, value, past_state=None, decay=None, beta=None):
    """The token-by-token recurrence as a C kernel: one (d_k, d_v) float64 state per
    (batch, K/V head), updated in order over the sequence, in parallel over heads."""
    gated, delta = _linear_attention_rule(ctx)
    hq, hkv = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
    nb, t = query.shape[0], query.shape[1]
    dk, dv = query.shape[2] // hq, value.shape[2] // hkv
    if past_state is not None and tuple(past_state.shape) != (nb, hkv, dk, dv):
        ctx.fail(f"past_state must have shape {(nb, hkv, dk, dv)}, got {tuple(past_state.shape)}")
    present = [x for x in (query, key, value, past_state, decay, beta) if x is not None]
    name = {id(x): f"in{present.index(x)}" for x in present}
    for x in present + [ctx.output_types[0], ctx.output_types[1]]:
        if x.dtype.c is None:
            ctx.fail(f"no native code for dtype {x.dtype}")
    scale = ctx.attr("scale", 0.0) or 1.0 / np.sqrt(dk)
    body = _LINEAR_ATTENTION_C.format(
        b=nb, t=t, hq=hq, hkv=hkv, dk=dk, dv=dv, par=PARALLEL_MIN_WORK, scale=float(scale).hex(),
        dw=decay.shape[-1] // hkv if gated else 1, bh=beta.shape[-1] if delta else 1,
        init=f"(double){name[id(past_state)]}[(b * HKV + g) * DK * DV + x]" if past_state is not None else "0.0",
        gated=int(gated), delta=int(delta), decay=name[id(decay)] if gated else name[id(query)],
        beta=name[id(beta)] if delta else name[id(query)], q=name[id(query)], k=name[id(key)], v=name[id(value)],
        to=ctx.out_dtype(0).c, ts=ctx.out_dtype(1).c)
    outs = [(ctx.out_shape(0), ctx.out_dtype(0)), ((nb, hkv, dk, dv), ctx.out_dtype(1))]
    return ctx.extern(body, present, outs)
