"""A decoder's growing KV cache rewritten as a fixed-capacity cache written in place.

A decoder exported with past key/values takes `past_key` [B, H, past, D] and returns
`present_key` = concat(past_key, new) [B, H, past + seq, D], per layer. Run as it stands,
every step has a new past length, so a new input shape (a new specialisation), and
the concat copies the whole cache into a fresh output.

`static_cache(graph, capacity)` rewrites every ONNX `Attention` node fed by past inputs
into the form ONNX itself gives for a static cache (opset 24):

    past_key  [B, H, past, D]            ->  past_key  [B, H, capacity, D]   (a buffer)
    + one input `cache_length` int64 [B]:    the valid rows of each batch entry's buffer
    Attention(q, k, v, past_key=, past_value=) -> (y, present_key, present_value)
      ->  present_key   = TensorScatter(past_key, k, cache_length, axis=2)
          present_value = TensorScatter(past_value, v, cache_length, axis=2)
          y = Attention(q, present_key, present_value, nonpad_kv_seqlen=cache_length + seq)

Every shape is then fixed by (batch, seq, capacity): one module per new-token count,
whatever the past length. The TensorScatter kernel copies its input only when its output
is another buffer (kiln.lower.indexing): bound to the same array as its input
(kiln.decode.Decoder does this), it writes the seq new rows and nothing else, and the
fused attention kernel reads the first cache_length + seq rows of the buffer. The
causal mask of the original (offset: the past length) is nonpad_kv_seqlen's (offset:
the valid length minus seq), the same positions.

What it refuses, saying why (NotStaticCache): a past input read by anything but its
Attention node (a Shape of it would see the capacity), an attn_mask or
nonpad_kv_seqlen input (sized by the past length), the qk output, a present output the
graph does not return.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.graph.ir import Graph, Node, Value
from kiln.graph.types import TensorType
from kiln.passes.edit import Namer, new_const

OPSET = 24   # TensorScatter and Attention's nonpad_kv_seqlen


class NotStaticCache(KilnError):
    """The graph's past key/values cannot become a static cache (the message says why)."""


@dataclass(frozen=True)
class CachePair:
    """One cache tensor: the past input and the present output it becomes after a step."""
    past: str                # graph input name (a [B, H, capacity, D] buffer after the rewrite)
    present: str             # graph output name (the same buffer, rows appended)
    heads: int | str
    dim: int | str


@dataclass(frozen=True)
class StaticCache:
    graph: Graph             # the rewritten graph
    pairs: tuple             # CachePair per cache tensor, in graph input order
    length: str              # the name of the `cache_length` int64 [B] input
    capacity: int


def static_cache(graph: Graph, capacity: int) -> StaticCache:
    """`graph` (past key/values feeding ONNX Attention nodes) with a static cache of
    `capacity` rows per batch entry; see the module docstring."""
    if not isinstance(capacity, (int, np.integer)) or capacity < 1:
        raise KilnError(f"capacity must be a positive int, got {capacity!r}")
    g = graph.clone()
    consumers = g.consumers()
    inputs = {v.id: k for k, v in enumerate(g.inputs)}
    outputs = {v.id: k for k, v in enumerate(g.outputs)}
    sites = [n for n in g.nodes if n.op == "Attention" and not n.domain and _arg(n, 4) is not None]
    if not sites:
        concat = _outer_concat(g, set(inputs), set(outputs))
        where = (f"; the cache is concatenated outside the attention ({concat.op} node {concat.name!r}): "
                 "kiln.decode.concat_cache takes that form (kiln.Decoder does so)"
                 if concat is not None else "")
        raise NotStaticCache("no Attention node takes past_key/past_value inputs: nothing to make a static "
                             f"cache of{where}", stage="decode")
    namer = Namer(g)
    batch = _dims(sites[0], 4)[0]
    length = Value(namer.fresh("cache_length"), TensorType(DType.int64, (batch,)))
    new_inputs, pairs, swap, replace = list(g.inputs), [], {}, {}   # swap: value id -> value; replace: node
    for n in sites:
        _check_site(n, consumers, inputs, outputs)
        k, v = n.inputs[1], n.inputs[2]
        q = n.inputs[0]
        made: list[Node] = []
        if len(q.type.shape) == 3:   # (B, S, H*D): split heads, as the cache is (B, H, S, D)
            hq, hkv = n.attrs.get("q_num_heads"), n.attrs.get("kv_num_heads")
            q, k, v = (_split(namer, made, x, h, n) for x, h in ((q, hq), (k, hkv), (v, hkv)))
        presents = []
        for j, new in ((4, k), (5, v)):
            past = n.inputs[j]
            b, h, _, d = past.type.shape
            buf = Value(past.name, TensorType(past.type.dtype, (b, h, int(capacity), d)))
            new_inputs[inputs[past.id]] = buf
            out = n.outputs[j - 3]
            made.append(Node("TensorScatter", [buf, new, length], [Value(out.name, None)],
                             {"axis": 2, "mode": "linear"}, namer.fresh(f"{n.name}/cache_write")))
            presents.append(made[-1].outputs[0])
            pairs.append(CachePair(past.name, out.name, h, d))
            swap[out.id] = made[-1].outputs[0]
        seq = Node("Shape", [k], [Value(namer.fresh(f"{n.name}.seq"), None)], {"start": 2, "end": 3},
                   namer.fresh(f"{n.name}/seq"))
        valid = Node("Add", [length, seq.outputs[0]], [Value(namer.fresh(f"{n.name}.valid"), None)], {},
                     namer.fresh(f"{n.name}/valid"))
        attrs = {a: x for a, x in n.attrs.items() if a not in ("q_num_heads", "kv_num_heads")}
        y = n.outputs[0]
        three = len(n.inputs[0].type.shape) == 3
        att = Node("Attention", [q, presents[0], presents[1], None, None, None, valid.outputs[0]],
                   [Value(namer.fresh(f"{y.name}.heads"), None) if three else y], attrs, n.name)
        made += [seq, valid, att]
        if three:   # (B, H, S, Dv) back to (B, S, H*Dv)
            t = Node("Transpose", [att.outputs[0]], [Value(namer.fresh(f"{y.name}.t"), None)],
                     {"perm": [0, 2, 1, 3]}, namer.fresh(f"{n.name}/merge_t"))
            shape = new_const(namer, f"{n.name}.merge_shape", np.array([0, 0, -1], np.int64))
            made += [t, Node("Reshape", [t.outputs[0], shape], [y], {}, namer.fresh(f"{n.name}/merge"))]
        replace[id(n)] = made
    g.opsets[""] = max(g.opset(""), OPSET)
    g.inputs = new_inputs + [length]
    g.outputs = [swap.get(v.id, v) for v in g.outputs]
    g.nodes = [m for x in g.nodes for m in replace.get(id(x), [x])]
    from kiln.ops.infer import Inferencer  # noqa: PLC0415
    Inferencer(g.opsets).infer_graph(g)
    order = {name: k for k, name in enumerate(v.name for v in g.inputs)}
    return StaticCache(g, tuple(sorted(pairs, key=lambda p: order[p.past])), length.name, int(capacity))


def _outer_concat(g: Graph, inputs: set, outputs: set) -> Node | None:
    """A Concat of a graph input and another tensor along axis 2 (or -2) of 4-D tensors that is a
    graph output: a past/present pair concatenated in the graph (torch.onnx.export's form)."""
    for n in g.nodes:
        if n.op == "Concat" and not n.domain and len(n.inputs) == 2 and n.inputs[0] is not None \
                and n.inputs[0].id in inputs and n.outputs[0].id in outputs \
                and getattr(n.inputs[0].type, "rank", None) == 4 and n.attrs.get("axis") in (2, -2):
            return n
    return None


def _arg(n: Node, i: int) -> Value | None:
    return n.inputs[i] if len(n.inputs) > i else None


def _dims(n: Node, i: int) -> tuple:
    t = _arg(n, i).type
    if not isinstance(t, TensorType) or t.shape is None or len(t.shape) != 4:
        raise NotStaticCache(f"Attention node {n.name!r}: input {i} is {t}, not a 4-D cache", stage="decode")
    return t.shape


def _check_site(n: Node, consumers, inputs: dict, outputs: dict) -> None:
    where = f"Attention node {n.name!r}"
    for i, name in ((3, "attn_mask"), (6, "nonpad_kv_seqlen")):
        if _arg(n, i) is not None:
            raise NotStaticCache(f"{where}: its {name} is sized by the past length; the static cache takes "
                                 "causal attention (is_causal) without a mask", stage="decode")
    for i, name in ((4, "past_key"), (5, "past_value")):
        v = _arg(n, i)
        if v is None or v.id not in inputs:
            raise NotStaticCache(f"{where}: {name} is not a graph input", stage="decode")
        _dims(n, i)
        others = [c for c in consumers.get(v.id, []) if c is not n]
        if others:
            raise NotStaticCache(f"{where}: {name} %{v.name} is also read by {others[0].op} node "
                                 f"{others[0].name!r}, which would see the cache's capacity, not its length",
                                 stage="decode")
    for j, name in ((1, "present_key"), (2, "present_value")):
        if len(n.outputs) <= j or n.outputs[j] is None or n.outputs[j].id not in outputs:
            raise NotStaticCache(f"{where}: its {name} is not a graph output, so the cache cannot be carried "
                                 "to the next step", stage="decode")
    if len(n.outputs) > 3 and n.outputs[3] is not None:
        raise NotStaticCache(f"{where}: its qk output is sized by the past length", stage="decode")


def _split(namer: Namer, made: list, x: Value, heads, n: Node) -> Value:
    """(B, S, H*D) -> (B, H, S, D) for a 3-D Attention input."""
    if not isinstance(heads, int):
        raise NotStaticCache(f"Attention node {n.name!r}: 3-D inputs without q_num_heads/kv_num_heads",
                             stage="decode")
    last = x.type.shape[2] if isinstance(x.type, TensorType) and x.type.shape is not None else None
    dim = last // heads if isinstance(last, int) else -1     # an int keeps the head size known
    shape = new_const(namer, f"{n.name}.split_shape", np.array([0, 0, heads, dim], np.int64))
    r = Node("Reshape", [x, shape], [Value(namer.fresh(f"{x.name}.split"), None)], {},
             namer.fresh(f"{n.name}/split"))
    t = Node("Transpose", [r.outputs[0]], [Value(namer.fresh(f"{x.name}.heads"), None)], {"perm": [0, 2, 1, 3]},
             namer.fresh(f"{n.name}/heads"))
    made += [r, t]
    return t.outputs[0]
