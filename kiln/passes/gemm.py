"""MatMul + Add(bias) → Gemm, for 2-D operands.

`Add(MatMul(a, w), c)` with a and w matrices and c broadcasting into the product
(a bias row, a column, a scalar or a full matrix) is exactly `Gemm(a, w, c)`:
one op, whose bias the matmul kernel adds in its epilogue. N-D MatMuls (BERT's
[batch, seq, hidden] projections) are left as MatMul + Add; fusion joins them.
"""

from __future__ import annotations

from kiln.graph.ir import Graph
from kiln.passes.edit import same_type
from kiln.passes.pattern import Op, Rule, Var, apply_rules
from kiln.passes.registry import PassContext, graph_pass

GEMM_DTYPES = {"float16", "bfloat16", "float32", "float64"}


def _rank(v):
    return getattr(v.type, "rank", None)


def _to_gemm(m, b):
    a, w, c = m["a"], m["w"], m["c"]
    mm = m.node("mm")
    if (_rank(a) != 2 or _rank(w) != 2 or _rank(c) is None or _rank(c) > 2 or b.opset() < 7
            or a.type.dtype.name not in GEMM_DTYPES or not same_type(m.root.type, mm.outputs[0].type)):
        return None
    return b.op("Gemm", [a, w, c], name=mm.name)


RULES = [Rule("MatMul+Add", Op("Add", Op("MatMul", Var("a"), Var("w"), name="mm"), Var("c")),
              _to_gemm, private=True)]


@graph_pass("matmul_add_to_gemm")
def matmul_add_to_gemm(graph: Graph, ctx: PassContext) -> Graph:
    """Turn 2-D MatMul + bias Add into one Gemm."""
    ctx.tally(apply_rules(graph, RULES))
    return graph
