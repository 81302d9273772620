"""Attention fusion: Softmax(Q·Kᵀ·scale + mask)·V → one kiln::FusedAttention.

The decomposed form exporters emit (BERT, GPT-2, Llama, T5, ViT, Whisper) is two batched
MatMuls around a Softmax, with a constant scale (Mul or Div), a mask (Add of a float mask
or bias, or Where(bool, scores, fill)), head Transposes around it, and for grouped-query
attention K/V heads repeated by Unsqueeze + Expand + Reshape. Unfused, it stores the
scores (S x S per head) and copies every Transpose and repeat. The rewrite reads Q, K and
V where they are made (the Transposes become the op's permutations, the repeat its head
grouping), writes the output in the layout its Transpose asked for, and leaves one op that
the native kernel (kiln.lower.fused_attention) runs with an online softmax.

Each group found is a finding in the pass's report, with the decision and its reason:
fused, or why not (symbolic sizes — the pass runs again per input shape —, an
intermediate read elsewhere, a dtype or mask the kernel does not take, or the rule in
`fusion_pays`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kiln.dtypes import DType
from kiln.graph.ir import Graph, Node, Value, const_value
from kiln.graph.types import TensorType
from kiln.ops.fused_attention import DOMAIN
from kiln.passes.edit import Namer, const_scalar, new_node, use_counts
from kiln.passes.edit import producers as edit_producers
from kiln.passes.registry import PassContext, graph_pass
from kiln.targets.target import Target


@dataclass(frozen=True)
class AttentionGroup:
    nodes: tuple[str, ...]      # QK MatMul, scale, mask, Softmax, ·V MatMul (those present)
    scale: float | None         # what the scores are multiplied by, if a constant does it
    mask: str | None            # "additive", "where" (Where(c, s, fill)), "where_not" (Where(c, fill, s)) or None
    decision: str = ""          # "fused (...)" or "not fused: why"

    def __str__(self) -> str:
        scale = "none" if self.scale is None else f"{self.scale:.6g}"
        text = f"attention ({', '.join(self.nodes)}) scale {scale}, mask {self.mask or 'none'}"
        return f"{text}: {self.decision}" if self.decision else text


@dataclass
class _Match:
    qk: Node
    scale_node: Node | None
    scale: float | None
    mask_node: Node | None
    mask: str | None
    softmax: Node
    pv: Node
    bias_node: Node | None = None   # Add(Add(scores, bias), mask): the inner Add (T5's position bias)

    @property
    def nodes(self) -> list[Node]:
        return [n for n in (self.qk, self.scale_node, self.bias_node, self.mask_node, self.softmax, self.pv)
                if n is not None]


def fusion_pays(b: int, hq: int, sq: int, sk: int, d: int, target: Target) -> tuple[bool, str]:
    """Whether the fused kernel is expected to beat the decomposed kernels, and why. It does
    the same multiply-adds without storing and re-reading the scores (B x H x Sq x Sk floats),
    copying the head Transposes or repeating K/V heads, but it has a fixed cost per call
    (packing K and V, a tile of 24 query rows) that a handful of keys does not repay: fused
    from one vector of keys on (`benchmarks/attention.py --clock cpu`, 12 heads x 64, one
    thread of an AVX-512 Zen 4, load 15: fused / decomposed 1.84 at 4 keys, 1.57 at 8, 0.85
    at 16, 0.84 at 32, 0.95 at 512, 0.89 at 2048; causal 0.44 at 2048)."""
    lanes = target.vector_lanes(4)
    if not _ints(b, hq, sq, sk):   # sizes known at run time: fused (the decomposed kernels win below 16 keys)
        return True, f"fused: kiln::FusedAttention, scores of {b}x{hq}x{sq}x{sk} never stored"
    if sk < lanes:
        return False, f"{sk} keys, fewer than one {lanes}-float vector: the decomposed kernels are faster"
    mib = b * hq * sq * sk * 4 / 2**20
    return True, f"fused: kiln::FusedAttention, scores of {b}x{hq}x{sq}x{sk} ({mib:.3g} MiB) never stored"


@graph_pass("fuse_attention")
def fuse_attention(graph: Graph, ctx: PassContext) -> Graph:
    """Rewrite Softmax(Q·Kᵀ·scale + mask)·V groups to kiln::FusedAttention; report each."""
    producers, consumers, uses = edit_producers(graph), graph.consumers(), use_counts(graph)
    namer = Namer(graph)
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    replace: dict[int, list] = {}      # id(node) -> the nodes that take its place
    dead: set[int] = set()
    fused = 0
    for n in graph.nodes:
        if n.op != "Softmax" or n.domain:
            continue
        m = _attention_at(graph, n, producers, consumers)
        if m is None:
            continue
        made, why = _plan(graph, m, producers, consumers, uses, namer, ctx.target)
        names = tuple(x.name for x in sorted(m.nodes, key=lambda x: order[id(x)]))
        ctx.report(AttentionGroup(names, m.scale, m.mask, why))
        if not made:
            continue
        out = made[-1].outputs[0]
        absorbed = m.nodes + [x for x in consumers.get(m.pv.outputs[0].id, []) if x.outputs[0] is out]
        replace[id(m.pv)] = made   # Q, K, V and the mask are all made before the ·V MatMul
        dead.update(id(x) for x in absorbed)
        fused += 1
    if fused:
        graph.opsets.setdefault(DOMAIN, 1)
        graph.nodes = [y for x in graph.nodes if id(x) not in dead or id(x) in replace
                       for y in replace.get(id(x), [x])]
        ctx.tally({"FusedAttention": fused})
    return graph


def _attention_at(graph: Graph, sm: Node, producers, consumers) -> _Match | None:
    rank = getattr(sm.inputs[0].type, "rank", None)
    axis = sm.attrs.get("axis", -1 if graph.opset() >= 13 else 1)
    readers = consumers.get(sm.outputs[0].id, [])
    # a malformed axis (a list, a string) is not attention: the op's own check names it
    if (rank is None or not isinstance(axis, int) or axis % rank != rank - 1 or len(readers) != 1
            or readers[0].op != "MatMul" or readers[0].domain or readers[0].inputs[0] is not sm.outputs[0]):
        return None
    s, p = sm.inputs[0], producers.get(sm.inputs[0].id)
    candidates = [(s, None, None, None)]
    if p is not None and p.op == "Add" and not p.domain:
        candidates = [(u, "additive", p, None) for u in p.inputs]
        for u in p.inputs:   # a bias added, then the mask: Add(Add(scores, bias), mask)
            inner = producers.get(u.id)
            if inner is not None and inner.op == "Add" and not inner.domain:
                candidates += [(w, "additive", p, inner) for w in inner.inputs]
    elif p is not None and p.op == "Where" and not p.domain:
        candidates = [(p.inputs[1], "where", p, None), (p.inputs[2], "where_not", p, None)]
    for v, mask, mask_node, bias_node in candidates:
        found = _scores(v, producers)
        if found is not None:
            qk, scale_node, scale = found
            return _Match(qk, scale_node, scale, mask_node, mask, sm, readers[0], bias_node)
    return None


def _scores(v: Value, producers):
    """(MatMul, scale node, scale) if v is MatMul(Q, K), optionally times or divided by a constant."""
    p, node, scale = producers.get(v.id), None, None
    if p is not None and p.op in ("Mul", "Div") and not p.domain and len(p.inputs) == 2:
        k = 1 if const_scalar(p.inputs[1]) is not None else 0 if p.op == "Mul" else None
        c = None if k is None else const_scalar(p.inputs[k])
        if c is not None and c != 0:
            scale = c if p.op == "Mul" else 1 / c
            node = p
            p = producers.get(p.inputs[1 - k].id)
    if p is None or p.op != "MatMul" or p.domain:
        return None
    return p, node, scale


# -- the rewrite ----------------------------------------------------------------------------

def _plan(graph: Graph, m: _Match, producers, consumers, uses, namer: Namer, target: Target
          ) -> tuple[list[Node], str]:
    """The nodes replacing match `m` (the fused node, its inputs read through Transposes and
    GQA repeats, after an Add of bias and mask when both are added), or none, and why."""
    a, bt = m.qk.inputs
    vm = m.pv.inputs[1]
    y = m.pv.outputs[0]
    shapes = [_dims(x) for x in (a, bt, vm, y)]
    if any(s is None for s in shapes):
        return [], "not fused here: ranks unknown (decided again per input shape)"
    if any(len(s) != 4 for s in shapes):
        return [], "not fused: the fused kernel takes 4-D (batch, head, seq, dim) products"
    dt = a.type.dtype
    if dt is not DType.float32 or any(x.type.dtype is not dt for x in (bt, vm, y)):
        return [], f"not fused: {dt} scores (the fused kernel is used for float32 graphs)"
    outs = [m.qk, m.scale_node, m.bias_node, m.mask_node, m.softmax]
    for x in outs:
        if x is not None and (uses[x.outputs[0].id] != 1 or any(v is x.outputs[0] for v in graph.outputs)):
            return [], f"not fused: {x.name}'s result is read elsewhere"
    (b, hq, sq, d), (_, hk, _, sk), (_, hv, _, dv) = shapes[0], shapes[1], shapes[2]
    if shapes[1][:1] != (b,) or shapes[2][:1] != (b,) or hk != hv or not _ints(hq, hk) or hq % hk:
        return [], f"not fused: Q {shapes[0]}, Kᵀ {shapes[1]}, V {shapes[2]} batch dims do not line up"
    attrs = {"scale": float(1.0 if m.scale is None else m.scale)}
    mask, made = None, []
    if m.mask_node is not None:
        score_side = m.scale_node.outputs[0] if m.scale_node is not None else m.qk.outputs[0]
        if m.bias_node is not None:
            bias = next(x for x in m.bias_node.inputs if x is not score_side)
            later = next(x for x in m.mask_node.inputs if x is not m.bias_node.outputs[0])
            if any(x.type.dtype is not DType.float32 for x in (bias, later)):
                return [], "not fused: the bias and mask are not both float32"
            made.append(new_node(graph, "Add", [bias, later], namer.fresh(f"{m.bias_node.name}/bias_and_mask"),
                                 [namer.fresh(f"{m.bias_node.name}.bias_and_mask")]))
            score_side = m.bias_node.outputs[0]
        if m.mask in ("where", "where_not"):
            cond = m.mask_node.inputs[0]
            fill = const_scalar(m.mask_node.inputs[2 if m.mask == "where" else 1])
            if fill is None or cond.type.dtype is not DType.bool:
                return [], "not fused: Where's fill is not a constant scalar"
            mask = cond
            attrs.update(mask_kind="bool" if m.mask == "where" else "bool_not", fill=float(fill))
        else:
            mask = made[0].outputs[0] if made else next(x for x in m.mask_node.inputs if x is not score_side)
            if mask.type.dtype not in (DType.float32, DType.float16, DType.float64):
                return [], f"not fused: a {mask.type.dtype} additive mask"
            attrs["mask_kind"] = "add"
        ms = _dims(mask)
        if ms is None or not _broadcasts(ms, (b, hq, sq, sk)):
            return [], f"not fused: mask of shape {ms} does not broadcast to the scores"
    pays, why = fusion_pays(b, hq, sq, sk, d, target)
    if not pays:
        return [], "not fused: " + why
    q, qp = _source(a, (0, 1, 2, 3), producers, None)
    k, kp = _source(bt, (0, 1, 3, 2), producers, hq)
    v, vp = _source(vm, (0, 1, 2, 3), producers, hq)
    if _dims(k)[kp[1]] != _dims(v)[vp[1]]:   # one repeat recognised, not the other
        k, kp = _source(bt, (0, 1, 3, 2), producers, None)
        v, vp = _source(vm, (0, 1, 2, 3), producers, None)
    out, op_ = y, (0, 1, 2, 3)
    readers = consumers.get(y.id, [])
    if len(readers) == 1 and readers[0].op == "Transpose" and not readers[0].domain \
            and not any(o is y for o in graph.outputs):
        perm = _perm(readers[0])
        if perm is not None:
            out, op_ = readers[0].outputs[0], perm
    lens = None
    rows = _cache_rows(k, kp, producers), _cache_rows(v, vp, producers)
    if rows[0] is not None and rows[1] is not None and rows[0][2] == rows[1][2]:
        (k, ends, size), (v, _, _) = rows
        lens = _kv_lens(graph, namer, made, k, kp[0], ends, size)
        why += "; keys read in place from the rows sliced off a KV cache buffer"
    attrs.update(q_perm=list(qp), k_perm=list(kp), v_perm=list(vp), out_perm=list(op_), empty="nan")
    ins = [q, k, v] + ([mask] if mask is not None or lens is not None else []) + ([lens] if lens is not None else [])
    return made + [Node("FusedAttention", ins, [out], attrs, m.pv.name or m.softmax.name, DOMAIN)], why


def _cache_rows(x: Value, perm: tuple, producers) -> tuple | None:
    """(buffer, ends, rows) when x = Slice(buffer, 0, ends) along its key axis (perm[2]): a KV
    cache's filled rows (kiln.decode.concat_cache) that the kernel reads in place, bounded by
    run-time lengths, instead of a copy; `rows` the buffer's static size on that axis."""
    p = producers.get(x.id)
    if p is None or p.op != "Slice" or p.domain or len(p.inputs) < 4 or p.inputs[3] is None:
        return None
    data, starts, ends, axes = p.inputs[:4]
    steps = p.inputs[4] if len(p.inputs) > 4 else None
    ds = _dims(data)
    if ds is None or len(ds) != 4 or not isinstance(ds[perm[2]], int) or ends.type is None \
            or getattr(ends.type, "shape", None) != (1,):
        return None
    if starts.const is None or axes.const is None or (steps is not None and (steps.const is None
                                                                          or steps.const.tolist() != [1])):
        return None
    if starts.const.tolist() != [0] or [int(a) % 4 for a in axes.const.tolist()] != [perm[2]]:
        return None
    return data, ends, ds[perm[2]]


def _kv_lens(graph: Graph, namer: Namer, made: list, k: Value, batch_axis: int, ends: Value, size: int) -> Value:
    """int64 [B]: the Slice's end as the rows every batch entry reads (a negative end counts
    from `size`; the kernel clamps to [0, keys])."""
    def node(op, ins, tag, **attrs):
        made.append(new_node(graph, op, ins, namer.fresh(f"{k.name}/kv_lens_{tag}"),
                             [namer.fresh(f"{k.name}.kv_lens_{tag}")], attrs))
        return made[-1].outputs[0]
    e = ends if ends.type.dtype is DType.int64 else node("Cast", [ends], "cast", to=int(DType.int64.onnx))
    zero = const_value(namer.fresh(f"{k.name}.kv_lens_zero"), np.zeros(1, np.int64))
    e = node("Where", [node("Less", [e, zero], "neg"),
                       node("Add", [e, const_value(namer.fresh(f"{k.name}.kv_lens_size"),
                                                   np.array([size], np.int64))], "wrap"), e], "end")
    axis = const_value(namer.fresh(f"{k.name}.kv_lens_axis"), np.array([batch_axis], np.int64))
    return node("Expand", [e, node("Gather", [node("Shape", [k], "shape"), axis], "batch")], "lens")


def _perm(node: Node) -> tuple[int, ...] | None:
    p = node.attrs.get("perm")
    if p is None or len(p) != 4:
        return None
    p = tuple(int(i) for i in p)
    return p if sorted(p) == [0, 1, 2, 3] else None


def _source(v: Value, perm: tuple, producers, heads: int | None) -> tuple[Value, tuple]:
    """(x, perm') with numpy.transpose(x, perm') the logical tensor numpy.transpose(v, perm),
    x read through a Transpose and (K and V, with `heads` query heads) a head repeat."""
    for _ in range(3):
        p = producers.get(v.id)
        if p is None or p.domain:
            break
        tp = _perm(p) if p.op == "Transpose" else None
        if tp is not None and _dims(p.inputs[0]) is not None:
            v, perm = p.inputs[0], tuple(tp[i] for i in perm)
            continue
        src = _repeat_source(v, p, producers) if heads and perm[1] == 1 else None
        if src is not None:
            v = src
            continue
        break
    return v, perm


def _repeat_source(v: Value, p: Node, producers) -> Value | None:
    """y when v = Reshape(Expand(Unsqueeze(y, 2)), [B, Hkv * rep, S, D]): repeat_kv's K/V
    heads, each read `rep` times in place (y [B, Hkv, S, D])."""
    vs = _dims(v)
    if p.op != "Reshape" or vs is None or len(vs) != 4:
        return None
    e = producers.get(p.inputs[0].id)
    es = _dims(p.inputs[0])
    if e is None or e.op != "Expand" or e.domain or es is None or len(es) != 5 or not _ints(es[1], es[2]) \
            or (es[0], es[1] * es[2], es[3], es[4]) != vs:
        return None
    x = e.inputs[0]
    xs = _dims(x)
    u = producers.get(x.id)
    if xs != (es[0], es[1], 1, es[3], es[4]) or u is None or u.op not in ("Unsqueeze", "Reshape") or u.domain:
        return None
    y = u.inputs[0]
    return y if _dims(y) == (es[0], es[1], es[3], es[4]) else None


def _dims(v: Value) -> tuple | None:
    """v's shape when its rank is known: ints and symbol names (equal names, equal sizes; the
    fused kernel takes its sizes at run time, kiln.lower.generic)."""
    t = v.type
    return tuple(t.shape) if isinstance(t, TensorType) and t.shape is not None else None


def _ints(*dims) -> bool:
    return all(isinstance(d, int) for d in dims)


def _broadcasts(mask: tuple, scores: tuple) -> bool:
    """Does a mask of shape `mask` broadcast (right-aligned) to `scores` (b, h, sq, sk)?"""
    if len(mask) > 4:
        return False
    return all(m == 1 or m == s for m, s in zip((1,) * (4 - len(mask)) + tuple(mask), scores))
