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


import numpy as np

from kiln.dtypes import DType
from kiln.graph.types import TensorType
from kiln.ops.reduce import as_dtype, text, wide
from kiln.ops.registry import OPAQUE, InferCtx, RunCtx, op
from kiln.ops.shapes import dim_mul, expect_shape


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


def _refuse_empty(ctx, total, head_size) -> None:
    """Attention over no key (or with a head size of 0) is refused, as ONNX Runtime refuses it
    and as kiln's native kernels do: statically by inference, at run time by the reference."""
    if total == 0 or head_size == 0:
        ctx.fail(f"attention over an empty key sequence or head size: {total} keys (past and new), "
                 f"head size {head_size} (expected at least 1 of each)")


def _attention_infer(ctx: InferCtx):
    t = ctx.dtype(0)
    dims = _attention_dims(ctx)
    if dims is None:
        four = [TensorType(dt, ctx.unknown_shape(4)) for dt in (t, ctx.dtype(2), t)]
        return [TensorType(t, None), *four][:max(ctx.num_outputs, 1)]
    b, hq, hkv, sq, skv, d, dv = dims
    past = ctx.shape(4) if ctx.has_input(4) else None
    total = skv if not ctx.has_input(4) else (_add(ctx, past[2], skv) if past is not None else ctx.new_dim())
    _refuse_empty(ctx, total, d)
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


@op("Attention", infer=_attention_infer, fusion=OPAQUE)
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
    _refuse_empty(ctx, total, q.shape[3])
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


@op("RotaryEmbedding", infer=_rotary_infer, fusion=OPAQUE)
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


@op("LinearAttention", infer=_linear_attention_infer, fusion=OPAQUE)
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


@op("FlexAttention", infer=_flex_infer, domain="ai.onnx.preview", fusion=OPAQUE)
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
