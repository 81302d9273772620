"""The graph verifier: structural invariants every pass must keep.

Checks that every value read is defined before (SSA, topological order, which
also rules out cycles), produced once, and that graph outputs exist. Errors name
the graph, node and op. That each node's recorded output types agree with what
its op infers needs the op definitions: kiln.ops.verify adds that check.
"""

from __future__ import annotations

from kiln.errors import KilnError
from kiln.graph.ir import Graph


def verify(graph: Graph, *, stage: str = "verify") -> None:
    """Check the graph's structure (see the module doc); raises KilnError naming what is broken."""
    _verify(graph, set(), stage)


def _verify(g: Graph, outer: set[int], stage: str) -> None:
    defined = set(outer)
    for v in g.inputs:
        if v.id in defined:
            raise KilnError(f"graph {g.name!r}: input %{v.name} is defined twice", stage=stage)
        defined.add(v.id)
    for n in g.nodes:
        for k, v in enumerate(n.inputs):
            if v is None or v.is_const:
                continue
            if v.id not in defined:
                raise KilnError(f"input {k} (%{v.name}) is not defined before this node "
                                "(dangling value or cycle)", node=n.name, op=n.op, stage=stage)
        for sg in n.subgraphs():
            _verify(sg, defined, stage)
        for v in n.outputs:
            if v is None:
                continue
            if v.id in defined:
                raise KilnError(f"output %{v.name} is produced more than once", node=n.name,
                                op=n.op, stage=stage)
            if v.is_const:
                raise KilnError(f"output %{v.name} is a constant", node=n.name, op=n.op, stage=stage)
            defined.add(v.id)
    for v in g.outputs:
        if not v.is_const and v.id not in defined:
            raise KilnError(f"graph {g.name!r}: output %{v.name} is never produced", stage=stage)
