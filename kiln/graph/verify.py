"""The graph verifier: structural invariants every pass must keep.

Checks that every value read is defined before (SSA, topological order, which
also rules out cycles), produced once, that graph outputs exist, and that each
node's recorded output types agree with what its op infers from its inputs.
Errors name the graph, node and op.
"""

from __future__ import annotations

from kiln.errors import KilnError
from kiln.graph.ir import Graph


def verify(graph: Graph, *, check_types: bool = True, stage: str = "verify") -> None:
    _verify(graph, set(), stage)
    if check_types:
        _check_types(graph, stage)


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


def _check_types(g: Graph, stage: str) -> None:
    """Re-infer every node and compare with the types recorded on its outputs."""
    from kiln.graph.types import TensorType
    from kiln.ops.infer import Inferencer, check_supported

    check_supported(g)
    recorded = {id(v): v.type for _, n in g.walk() for v in n.outputs if v is not None}
    inf = Inferencer(g.opsets)
    inf.infer_graph(g)
    for _, n in g.walk():
        for v in n.outputs:
            if v is None:
                continue
            want, got = recorded[id(v)], v.type
            v.type = want  # verification must not change the graph
            if want is None:
                continue
            bad = type(want) is not type(got)
            if not bad and isinstance(want, TensorType):
                bad = want.dtype != got.dtype or (
                    want.shape is not None and got.shape is not None and (
                        len(want.shape) != len(got.shape) or any(
                            isinstance(a, int) and isinstance(b, int) and a != b
                            for a, b in zip(want.shape, got.shape))))
            if bad:
                raise KilnError(f"output %{v.name} is recorded as {want} but its inputs give "
                                f"{got}", node=n.name, op=n.op, stage=stage)
