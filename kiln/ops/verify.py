"""The full graph verifier: kiln.graph.verify's structural checks, then every node's
recorded output types against what its op infers from its inputs (which needs the op
definitions, so it lives here rather than in kiln.graph). Errors name the node and op.
"""

from __future__ import annotations

from kiln.errors import KilnError
from kiln.graph.ir import Graph
from kiln.graph.types import TensorType
from kiln.graph.verify import verify as verify_structure
from kiln.ops.infer import Inferencer, check_supported


def verify(graph: Graph, *, check_types: bool = True, stage: str = "verify") -> None:
    verify_structure(graph, stage=stage)
    if check_types:
        _check_types(graph, stage)


def _check_types(g: Graph, stage: str) -> None:
    """Re-infer every node and compare with the types recorded on its outputs."""
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
