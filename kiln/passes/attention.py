"""Attention recognition: find Softmax(Q·K^T·scale + mask)·V and report it.

Nothing is rewritten (node attributes are ONNX semantics, so groups are not
tagged in the graph): each group found is a finding in the pass's report,
naming its nodes in graph order, the scale and the kind of mask, for the fusion
work that will make it one kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.graph.ir import Graph, Node, Value
from kiln.passes.edit import const_scalar
from kiln.passes.edit import producers as edit_producers
from kiln.passes.registry import PassContext, graph_pass


@dataclass(frozen=True)
class AttentionGroup:
    nodes: tuple[str, ...]      # QK MatMul, scale, mask, Softmax, ·V MatMul (those present)
    scale: float | None         # what the scores are multiplied by, if a constant does it
    mask: str | None            # "additive", "where" or None

    def __str__(self) -> str:
        scale = "none" if self.scale is None else f"{self.scale:.6g}"
        return f"attention ({', '.join(self.nodes)}) scale {scale}, mask {self.mask or 'none'}"


@graph_pass("find_attention")
def find_attention(graph: Graph, ctx: PassContext) -> Graph:
    """Report Softmax(Q·K^T·scale + mask)·V groups (no rewrite)."""
    producers, consumers = edit_producers(graph), graph.consumers()
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    for n in graph.nodes:
        if n.op == "Softmax" and not n.domain:
            found = _attention_at(graph, n, producers, consumers)
            if found is not None:
                nodes, scale, mask = found
                names = tuple(m.name for m in sorted(nodes, key=lambda m: order[id(m)]))
                ctx.report(AttentionGroup(names, scale, mask))
    return graph


def _attention_at(graph: Graph, sm: Node, producers, consumers):
    rank = getattr(sm.inputs[0].type, "rank", None)
    axis = sm.attrs.get("axis", -1 if graph.opset() >= 13 else 1)
    readers = consumers.get(sm.outputs[0].id, [])
    # a malformed axis (a list, a string) is not attention: the op's own check names it
    if (rank is None or not isinstance(axis, int) or axis % rank != rank - 1 or len(readers) != 1
            or readers[0].op != "MatMul" or readers[0].inputs[0] is not sm.outputs[0]):
        return None
    s, p = sm.inputs[0], producers.get(sm.inputs[0].id)
    candidates = [(s, None, [])]
    if p is not None and p.op == "Add":
        candidates = [(u, "additive", [p]) for u in p.inputs]
    elif p is not None and p.op == "Where":
        candidates = [(p.inputs[1], "where", [p])]
    for v, mask, mask_nodes in candidates:
        found = _scores(v, producers)
        if found is not None:
            nodes, scale = found
            return nodes + mask_nodes + [sm, readers[0]], scale, mask
    return None


def _scores(v: Value, producers) -> tuple[list[Node], float | None] | None:
    """(nodes, scale) if v is MatMul(Q, K), optionally times or divided by a constant."""
    p, nodes, scale = producers.get(v.id), [], None
    if p is not None and p.op in ("Mul", "Div") and len(p.inputs) == 2:
        k = 1 if const_scalar(p.inputs[1]) is not None else 0 if p.op == "Mul" else None
        c = None if k is None else const_scalar(p.inputs[k])
        if c is not None and c != 0:
            scale = c if p.op == "Mul" else 1 / c
            nodes.append(p)
            p = producers.get(p.inputs[1 - k].id)
    if p is None or p.op != "MatMul":
        return None
    return [p] + nodes, scale
