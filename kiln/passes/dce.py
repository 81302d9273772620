"""Dead code elimination: nodes whose outputs nothing reads are removed.

ONNX ops have no side effects, so a node is dead when none of its outputs is
read by a later node (at any depth) or is a graph output. One sweep from the
last node backwards frees whole dead chains; If/Loop/Scan bodies are swept too
(a body's outputs are what it must keep).
"""

from __future__ import annotations

from kiln.graph.ir import Graph
from kiln.passes.edit import reads, use_counts
from kiln.passes.registry import PassContext, graph_pass


@graph_pass("eliminate_dead_code")
def eliminate_dead_code(graph: Graph, ctx: PassContext) -> Graph:
    """Remove nodes whose outputs are never read (subgraph bodies included)."""
    removed = _sweep(graph, use_counts(graph))
    if removed:
        ctx.tally({"dead node": removed})
    return graph


def _sweep(g: Graph, counts) -> int:
    removed, keep = 0, []
    for n in reversed(g.nodes):
        if all(v is None or counts[v.id] == 0 for v in n.outputs):
            for v in reads(n):
                counts[v.id] -= 1
            removed += 1
            continue
        for sg in n.subgraphs():
            removed += _sweep(sg, counts)
        keep.append(n)
    g.nodes = keep[::-1]
    return removed
