"""The Concat form of a KV cache (torch.onnx.export of a Hugging Face decoder) rewritten to a
fixed-capacity cache written in place, with the cache length a symbol of one generic module.

An exported HF decoder carries its cache as plain tensors: per layer `past_key_values.i.key`
[B, H, past, D] comes in, `present.i.key` = Concat(past, new, axis=2) [B, H, past + seq, D]
goes out, the attention reads the Concat (through repeat_kv's Unsqueeze/Expand/Reshape),
and the positions and the causal mask are computed from Shape(past) (the past length) and
the sequence length. Run as it stands, every step copies the whole cache into a new
present, and every past length is a new input shape.

`concat_cache(graph, capacity)` makes each past input a buffer of `capacity` rows that the
step writes its new rows into, and gives the graph the past length as a symbol:

    past_key  [B, H, past, D]      ->  past_key  [B, H, capacity, D]   (a buffer)
    + `cache_length` int64 [B]:        the rows filled before the step (equal entries)
    + `cache_rows` uint8 [next]:       a carrier of past + 1 elements (its size is the
                                       symbol, >= 1 even for an empty cache; its bytes are
                                       never read)
    present = Concat(past, new)    ->  present = TensorScatter(past_key, new, cache_length)
                                       (the graph output, bound to the buffer: only the new
                                       rows are written)
    uses of the Concat             ->  Slice(present, 0, next - 1 + seq, axis 2)
    Shape(past)                    ->  [B, H, next - 1, D]

Every size is then a polynomial of the input symbols (kiln.lower.symbolic_shapes): one
shape-generic module (kiln.compile(shapes="generic")) runs every past length and every
new-token count, cache length 0 included, with no compile per step.

What it refuses, saying why (NotStaticCache): a past input read by anything but its
Concat (and Shape nodes), a Concat that is not along the sequence axis of 4-D tensors or
whose output is not a graph output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.graph.ir import Graph, Node, Value
from kiln.graph.types import TensorType
from kiln.passes.edit import Namer, new_const
from kiln.decode.static_cache import OPSET, CachePair, NotStaticCache


@dataclass(frozen=True)
class ConcatCache:
    graph: Graph             # the rewritten graph
    pairs: tuple             # CachePair per cache tensor, in graph input order
    length: str              # the `cache_length` int64 [B] input: rows filled before the step
    rows: str                # the `cache_rows` uint8 [total] input: its size is the rows after it
    capacity: int


def is_concat_form(graph: Graph) -> bool:
    """Whether some 4-D graph input reaches a graph output through a Concat along axis 2."""
    return bool(_sites(graph, strict=False))


def concat_cache(graph: Graph, capacity: int) -> ConcatCache:
    """`graph` (past key/values concatenated onto the new ones, the presents its outputs) with a
    cache of `capacity` rows per batch entry written in place; see the module docstring."""
    if not isinstance(capacity, (int, np.integer)) or capacity < 1:
        raise KilnError(f"capacity must be a positive int, got {capacity!r}")
    g = graph.clone()
    sites = _sites(g, strict=True)
    if not sites:
        raise NotStaticCache("no past input is concatenated onto new keys/values along axis 2 into a graph "
                             "output: nothing to make a KV cache of", stage="decode")
    namer = Namer(g)
    inputs = {v.id: k for k, v in enumerate(g.inputs)}
    batch = sites[0][0].type.shape[0]
    symbols = {d for v in g.inputs if isinstance(v.type, TensorType) and v.type.shape for d in v.type.shape
               if isinstance(d, str)}
    carrier = next(n for n in ("cache_next", *(f"cache_next_{k}" for k in range(1, 1000))) if n not in symbols)
    length = Value(namer.fresh("cache_length"), TensorType(DType.int64, (batch,)))
    rows = Value(namer.fresh("cache_rows"), TensorType(DType.uint8, (carrier,)))
    one = new_const(namer, "cache_rows.one", np.array([1], np.int64))
    rows_shape = Node("Shape", [rows], [Value(namer.fresh("cache_rows.shape"), None)], {},
                      namer.fresh("cache_rows/shape"))
    past_len = Node("Sub", [rows_shape.outputs[0], one], [Value(namer.fresh("cache_past"), None)], {},
                    namer.fresh("cache_rows/past"))
    made_first: list[Node] = [rows_shape, past_len]
    new_inputs, pairs, swap, replace, drop = list(g.inputs), [], {}, {}, set()
    for past, aliases, shapes, cat in sites:
        new = cat.inputs[1]
        b, h, _, d = past.type.shape
        buf = Value(past.name, TensorType(past.type.dtype, (b, h, int(capacity), d)))
        new_inputs[inputs[past.id]] = buf
        out = cat.outputs[0]
        write = Node("TensorScatter", [buf, new, length], [Value(out.name, None)], {"axis": 2, "mode": "linear"},
                     namer.fresh(f"{cat.name}/cache_write"))
        seq = _shape(namer, new, 2, 3, cat.name, "seq")
        total = Node("Add", [past_len.outputs[0], seq.outputs[0]], [Value(namer.fresh(f"{cat.name}.total"), None)],
                     {}, namer.fresh(f"{cat.name}/total"))
        zero = new_const(namer, f"{cat.name}.zero", np.array([0], np.int64))
        two = new_const(namer, f"{cat.name}.axis", np.array([2], np.int64))
        view = Node("Slice", [write.outputs[0], zero, total.outputs[0], two],
                    [Value(namer.fresh(f"{out.name}.rows"), None)], {}, namer.fresh(f"{cat.name}/cache_rows"))
        swap[out.id] = write.outputs[0]
        replace[id(cat)] = [write, seq, total, view]
        drop.update(id(n) for n in aliases)
        for s in shapes:
            replace[id(s)] = _past_shape(namer, s, buf, past_len.outputs[0])
        pairs.append(CachePair(past.name, out.name, h, d))
        _redirect(g, out, view.outputs[0], skip=cat)
    g.opsets[""] = max(g.opset(""), OPSET)
    g.inputs = new_inputs + [length, rows]
    g.outputs = [swap.get(v.id, v) for v in g.outputs]
    nodes = [m for x in g.nodes if id(x) not in drop for m in replace.get(id(x), [x])]
    g.nodes = made_first + nodes
    from kiln.ops.infer import Inferencer  # noqa: PLC0415
    Inferencer(g.opsets).infer_graph(g)
    order = {name: k for k, name in enumerate(v.name for v in g.inputs)}
    return ConcatCache(g, tuple(sorted(pairs, key=lambda p: order[p.past])), length.name, rows.name, int(capacity))


def _sites(g: Graph, strict: bool) -> list:
    """Per cache tensor (past input, the single-input Concats it passes through, the Shape
    nodes reading it, the Concat appending the new rows); `strict`: refuse what does not fit."""
    consumers = g.consumers()
    outputs = {v.id for v in g.outputs}
    found = []
    for past in g.inputs:
        t = past.type
        if not isinstance(t, TensorType) or t.shape is None or len(t.shape) != 4:
            continue
        v, aliases, shapes, cat, other = past, [], [], None, None
        while True:
            nexts = []
            for c in consumers.get(v.id, []):
                if c.op == "Shape" and not c.domain:
                    shapes.append(c)
                elif c.op == "Concat" and not c.domain and len([x for x in c.inputs if x is not None]) == 1:
                    nexts.append(c)
                elif c.op == "Concat" and not c.domain and len(c.inputs) == 2 and c.inputs[0] is v \
                        and c.attrs.get("axis") in (2, -2) and c.outputs[0].id in outputs and cat is None:
                    cat = c
                else:
                    other = c
            if len(nexts) != 1 or cat is not None or other is not None:
                if nexts and (len(nexts) > 1 or cat is not None):   # a second reader of the past
                    other = other or nexts[-1]
                break
            aliases.append(nexts[0])
            v = nexts[0].outputs[0]
        if cat is None:
            continue
        if other is not None:
            if strict:
                raise NotStaticCache(f"past input %{past.name} is also read by {other.op} node {other.name!r}, "
                                     "which would see the cache's capacity, not its rows", stage="decode")
            continue
        new = cat.inputs[1]
        if not isinstance(new.type, TensorType) or new.type.shape is None or len(new.type.shape) != 4:
            if strict:
                raise NotStaticCache(f"Concat node {cat.name!r}: the new rows %{new.name} are not a 4-D tensor",
                                     stage="decode")
            continue
        found.append((past, aliases, shapes, cat))
    return found


def _shape(namer: Namer, x: Value, start: int, end: int, where: str, tag: str) -> Node:
    return Node("Shape", [x], [Value(namer.fresh(f"{where}.{tag}"), None)], {"start": start, "end": end},
                namer.fresh(f"{where}/{tag}"))


def _past_shape(namer: Namer, s: Node, buf: Value, past_len: Value) -> list[Node]:
    """Nodes computing what Shape node `s` gave of the past: [B, H, past, D] (its start/end
    applied), the past rows from the carrier's size."""
    head, tail = _shape(namer, buf, 0, 2, s.name, "head"), _shape(namer, buf, 3, 4, s.name, "tail")
    start, end = int(s.attrs.get("start", 0)), s.attrs.get("end")
    whole = (start, end) in ((0, None), (0, 4), (-4, None))
    full = Node("Concat", [head.outputs[0], past_len, tail.outputs[0]],
                [s.outputs[0] if whole else Value(namer.fresh(f"{s.name}.full"), None)], {"axis": 0},
                namer.fresh(f"{s.name}/full"))
    made = [head, tail, full]
    if not whole:
        lo = new_const(namer, f"{s.name}.start", np.array([start], np.int64))
        hi = new_const(namer, f"{s.name}.end", np.array([4 if end is None else int(end)], np.int64))
        made.append(Node("Slice", [full.outputs[0], lo, hi], [s.outputs[0]], {}, s.name))
    return made


def _redirect(g: Graph, old: Value, new: Value, skip: Node) -> None:
    """Every node input reading `old` reads `new` instead (graph outputs unchanged)."""
    for n in g.nodes:
        if n is skip:
            continue
        n.inputs = [new if x is not None and x.id == old.id else x for x in n.inputs]
