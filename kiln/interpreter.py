"""The interpreter target: runs a Graph node by node with each op's NumPy reference.

It is the golden model for testing passes and lowerings, never what
`target="cpu"` gives a user. Every node's outputs are checked against the types
inference gave them, so an op whose inference and reference disagree is caught
at the node that disagrees.
"""

from __future__ import annotations

from collections import ChainMap

import numpy as np

from kiln.errors import KilnError
from kiln.graph.ir import Graph, Node
from kiln.limits import KilnResourceError
from kiln.graph.types import OptionalType, SequenceType, TensorType, Type
from kiln.ops.registry import RunCtx, lookup


class Interpreter:
    def __init__(self, graph: Graph, check_types: bool = True):
        self.graph = graph
        self.check_types = check_types

    def run(self, inputs: list) -> list:
        return self.run_graph(self.graph, inputs, ChainMap())

    def run_graph(self, graph: Graph, inputs: list, outer: ChainMap) -> list:
        env = outer.new_child()
        for v, x in zip(graph.inputs, inputs):
            env[v.id] = x
        for node in graph.nodes:
            self.run_node(node, env)
        return [v.const if v.const is not None else env[v.id] for v in graph.outputs]

    def run_node(self, node: Node, env: ChainMap) -> None:
        d = lookup(node.domain, node.op)
        if d is None:
            raise KilnError("no definition for this op", node=node.name, op=node.op)
        args = []
        for v in node.inputs:
            if v is None:
                args.append(None)
            elif v.const is not None:
                args.append(v.const)
            else:
                args.append(env[v.id])
        ctx = RunCtx(node, self.graph.opset(node.domain),
                     lambda g, xs: self.run_graph(g, xs, env))
        try:
            res = d.run(ctx, *args)
        except KilnError:
            raise
        except MemoryError as e:
            raise KilnResourceError(f"out of memory running the reference ({e})", node=node.name,
                                    op=node.op, stage="interpreter") from None
        except Exception as e:
            raise KilnError(f"reference failed: {type(e).__name__}: {e}", node=node.name,
                            op=node.op, stage="interpreter") from e
        outs = list(res) if isinstance(res, (tuple, list)) and not _single_seq(node) else [res]
        for k, v in enumerate(node.outputs):
            if v is None:
                continue
            if k >= len(outs):
                raise KilnError(f"reference returned {len(outs)} outputs, node has "
                                f"{len(node.outputs)}", node=node.name, op=node.op,
                                stage="interpreter")
            if self.check_types:
                check_value(outs[k], v.type, f"output {k} ({v.name!r})", node)
            env[v.id] = outs[k]


def _single_seq(node: Node) -> bool:
    """A sequence-typed single output is returned as a list, not as many outputs."""
    return len(node.outputs) == 1 and isinstance(node.outputs[0].type, (SequenceType, OptionalType))


def check_value(x, t: Type | None, what: str, node: Node | None = None) -> None:
    """Fail if runtime value `x` does not have type `t` (dtype, rank, static dims)."""
    where = dict(node=node.name, op=node.op, stage="interpreter") if node else {}
    if t is None:
        return
    if isinstance(t, OptionalType):
        if x is not None:
            check_value(x, t.elem, what, node)
        return
    if isinstance(t, SequenceType):
        if not isinstance(x, list):
            raise KilnError(f"{what} should be a sequence, got {type(x).__name__}", **where)
        for e in x:
            check_value(e, t.elem, what + " element", node)
        return
    if not isinstance(x, np.ndarray):
        raise KilnError(f"{what} should be a {t} array, got {type(x).__name__}", **where)
    if x.dtype != t.dtype.np and not (t.dtype.name == "string" and x.dtype.kind in "OU"):
        raise KilnError(f"{what} has dtype {x.dtype}, inferred {t.dtype}", **where)
    if t.shape is not None:
        if x.ndim != len(t.shape) or any(isinstance(d, int) and d != s
                                         for d, s in zip(t.shape, x.shape)):
            raise KilnError(f"{what} has shape {x.shape}, inferred {t}", **where)
