"""Attention lowerings (cpu target): Attention, RotaryEmbedding, kiln::RotaryHalf, FlexAttention, LinearAttention.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.codegen.csource import c_instance
from kiln.dtypes import DType
from kiln.loops import call, cast, compute, const, max_, min_, reduce_axis, rmax, select, sum_
from kiln.lower.decisions import parallel_min_work
from kiln.lower.reduce import exp_shifted, schedule_injective, schedule_reduction
from kiln.lower.nnutil import bcast_load
from kiln.lower.tensor import checked_index, rows_schedule
from kiln.ops.attention import _flex_softmax_dtype, _linear_attention_rule
from kiln.lower.context import LowerCtx, lowering


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
    fused = _fused_attention(ctx, q, k, v, attn_mask, past_key, nonpad_kv_seqlen)
    if fused is not None:
        return fused
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


def _fused_attention(ctx: LowerCtx, q, k, v, mask, past_key, nonpad):
    """The fused kernel (kiln.lower.fused_attention) where it computes what the op asks: no
    past_key/past_value (nonpad_kv_seqlen, a static cache's valid lengths, is read at run
    time), no softcap or sliding window, only the output asked for, one float dtype, a mask
    as wide as the keys. None: the computes below."""
    from kiln.lower.fused_attention import FLOATS, MASK_FLOATS, FlashCall, flash_kernel, permuted_strides
    from kiln.ops.fused_attention import mask_strides
    if (past_key is not None or ctx.attr("softcap", 0.0) or ctx.num_outputs != 1
            or ctx.attr("left_window_size", -1) >= 0
            or ctx.attr("right_window_size", -1) >= 0 or ctx.attr("softmax_precision", 0) not in (0, 1)
            or q.dtype not in FLOATS or k.dtype is not q.dtype or v.dtype is not q.dtype
            or not all(isinstance(n, int) for x in (q, k, v, mask) if x is not None for n in x.shape)):
        return None
    if len(q.shape) == 4:
        (nb, hq, sq, d), (_, hkv, sk, _), dv = q.shape, k.shape, v.shape[3]
        strides = tuple(permuted_strides(x.shape, (0, 1, 2, 3)) for x in (q, k, v))
        strides += (permuted_strides((nb, hq, sq, dv), (0, 1, 2, 3)),)
    else:
        hq, hkv = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
        nb, sq, sk = q.shape[0], q.shape[1], k.shape[1]
        d, dv = q.shape[2] // hq, v.shape[2] // hkv

        def heads(s, h, e):  # (b, h, s, d) strides of a (B, S, H * E) tensor
            return (s * h * e, e, h * e, 1)
        strides = (heads(sq, hq, d), heads(sk, hkv, d), heads(sk, hkv, dv), heads(sq, hq, dv))
    kind, ms = 0, (0, 0, 0, 0)
    if mask is not None:
        ms = mask_strides(mask.shape, (nb, hq, sq, sk))
        ok = mask.dtype is DType.bool or (mask.dtype in MASK_FLOATS)
        if ms is None or not ok or mask.shape[-1] != sk:
            return None
        kind = 2 if mask.dtype is DType.bool else 1
    scale = ctx.attr("scale", None)
    call = FlashCall((nb, hq, hkv, sq, sk, d, dv), strides, float(1.0 / np.sqrt(d) if scale is None else scale),
                     kind, ms, -math.inf, 0 if ctx.attr("is_causal", 0) else -1, empty_nan=False)
    return flash_kernel(ctx, call, q, k, v, mask, ctx.out_shape(0), ctx.out_dtype(0), nonpad)


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
    work = math.prod(raw.shape) * qs.shape[3] >= parallel_min_work()

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


@lowering("RotaryHalf", domain="kiln")
def _rotary_half_lower(ctx: LowerCtx, x, cos, sin):
    """x * cos + rotate_half(x) * sin (kiln.ops.rotary), in x's dtype as the decomposed graph:
    feature e's partner is e + D/2 (negated) in the first half, e - D/2 in the second; one
    load of x at the partner's index, so no read leaves the row. (In a group with the head
    split in front of it, the default injective schedule tiles the kernel.)"""
    d = x.shape[-1]
    if not isinstance(d, int):
        ctx.fail(f"RotaryHalf needs a static last axis, got {tuple(x.shape)}", stage="lower")
    h = d // 2

    def body(*i):
        e = i[-1]
        first = e < h
        p = x[i[:-1] + (select(first, e + h, e - h),)]
        return x[i] * bcast_load(cos, i) + select(first, -p, p) * bcast_load(sin, i)
    y = compute(tuple(x.shape), body, "rotary")
    ctx.schedule(rows_schedule(1))
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


@lowering("LinearAttention")
def _linear_attention_lower(ctx: LowerCtx, query, key, value, past_state=None, decay=None, beta=None):
    """The token-by-token recurrence as a C kernel (kiln/codegen/c_src/linear_attention.c):
    one (d_k, d_v) float64 state per (batch, K/V head), updated in order over the sequence,
    in parallel over heads."""
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
    args = (query, key, value, past_state, decay, beta)
    types = [(x if x is not None else query).dtype for x in args] + [ctx.out_dtype(0), ctx.out_dtype(1)]
    fn = "kiln_linear_attention_" + "_".join(t.name for t in types)
    macros = {f"KILN_LA_{m}": t.c for m, t in zip(("Q", "K", "V", "S", "D", "B", "TO", "TS"), types)}
    preamble = c_instance("linear_attention.c", {**macros, "KILN_LA_FN": fn}, fn.upper())
    ptrs = ", ".join(name[id(x)] if x is not None else "NULL" for x in args)
    body = (f"  return {fn}({ptrs}, out0, out1, {nb}, {t}, {hq}, {hkv}, {dk}, {dv}, "
            f"{decay.shape[-1] // hkv if gated else 1}, {beta.shape[-1] if delta else 1}, {float(scale).hex()}, "
            f"{int(gated)}, {int(delta)}, {parallel_min_work()});")
    outs = [(ctx.out_shape(0), ctx.out_dtype(0)), ((nb, hkv, dk, dv), ctx.out_dtype(1))]
    return ctx.extern(body, present, outs, preamble=preamble)
