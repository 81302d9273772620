"""SiLU-gated MLPs (Llama's `down(silu(gate(x)) * up(x))`): the gate fused into the GEMMs.

    g = MatMul(x, Wg);  u = MatMul(x, Wu);  p = Swish(g) * u

SiLU as exporters write it (g * Sigmoid(g)) is Swish by now (simplify_algebra). Each half
fuses into a GEMM's epilogue: Swish into the gate GEMM's, the product into the other GEMM's
(it reads the Swish's output as a second operand), so the gated MLP is three GEMM kernels
and neither the sigmoid's nor the gate's tensor is written. The partitioner joins a node to
its producer's kernel only when that kernel is the latest, so this pass puts each right
after its GEMM, whatever order the exporter wrote them in (both projections first, the up
projection first, ...). It only moves nodes: results are unchanged.
"""

from __future__ import annotations

from kiln.graph.ir import Graph
from kiln.passes.edit import hoist, producers, use_counts
from kiln.passes.pattern import Op, Var, match
from kiln.passes.registry import PassContext, graph_pass

GEMMS = ("MatMul", "Gemm")
GATED = Op("Mul", Op("Swish", Op(GEMMS, Var(), Var(), name="gate"), name="act"), Op(GEMMS, Var(), Var(), name="up"))


def _place(graph: Graph, mul) -> bool:
    """Move the gated product at `mul` (when it is one) so that it fuses; True if it moved."""
    made, counts = producers(graph), use_counts(graph)
    for env, _ in match(GATED, mul.outputs[0], {}, (), made):
        if any(counts[env[k].id] != 1 for k in ("gate", "act", "up")):
            continue   # a value read elsewhere is written anyway: nothing to gain
        pos = {id(n): i for i, n in enumerate(graph.nodes)}
        gate, act, up = (made[env[k].id] for k in ("gate", "act", "up"))
        if pos[id(act)] == pos[id(gate)] + 1 and pos[id(mul)] == max(pos[id(act)], pos[id(up)]) + 1:
            return False
        hoist(graph, act)
        hoist(graph, mul)
        return True
    return False


@graph_pass("recognize_swiglu")
def recognize_swiglu(graph: Graph, ctx: PassContext) -> Graph:
    """Place Swish(gate GEMM) * other GEMM so that both fuse into the GEMMs' epilogues."""
    moved = sum(_place(graph, n) for n in [n for n in graph.nodes if n.op == "Mul" and not n.domain])
    ctx.tally({"SwiGLU": moved} if moved else {})
    return graph
