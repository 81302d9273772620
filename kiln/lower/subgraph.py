"""Inline a body graph (an op's function attribute, e.g. FlexAttention's score_mod) into the
compute definition of the op that calls it.

The body is cloned, inferred with the concrete types of the tensors it is applied to, and
each of its nodes is lowered by its own op's lowering, reading the caller's compute
Tensors: what the body computes becomes expressions in the caller's kernel, never a call
out. Every node that reads a value is lowered (a Range with known bounds is an index
expression, not a table); constants (Constant nodes, initializers), and the outputs of
nodes without a lowering that inference knows, enter as constant computes. A body node that lowers to a hand-written kernel cannot be inlined and fails.
"""

from __future__ import annotations

import numpy as np

from kiln.graph.ir import Graph
from kiln.graph.types import TensorType
from kiln.loops import Tensor
from kiln.ops.infer import Inferencer
from kiln.lower.context import ExternKernel, LowerCtx, lowering_of

# Constants inlined as select chains over their elements: beyond this, a body would need
# its own weights in the kernel, which inlining does not give.
MAX_INLINE_CONSTANT = 256


def inline_body(ctx: LowerCtx, graph: Graph, args: list[Tensor], what: str) -> list[Tensor]:
    """The outputs of `graph` applied to `args`, as compute Tensors (see the module doc).
    `what` names the body in errors (e.g. "score_mod")."""
    from kiln.lower.tensor import const_compute
    g = graph.clone()
    if len(g.inputs) != len(args):
        ctx.fail(f"{what} takes {len(g.inputs)} inputs, given {len(args)}", stage="lower")
    inf = Inferencer(g.opsets)
    inf.infer_graph(g, [TensorType(a.dtype, tuple(a.shape)) for a in args])
    tensors = {v.id: a for v, a in zip(g.inputs, args)}

    def tensor(v) -> Tensor:
        if v.id not in tensors:
            data = inf.known_value(v)
            if data is None:
                ctx.fail(f"{what}: value %{v.name} is neither computed in the body nor known",
                         stage="lower")
            if data.size > MAX_INLINE_CONSTANT:
                ctx.fail(f"{what}: constant %{v.name} has {data.size} elements; inlined bodies "
                         f"take constants of at most {MAX_INLINE_CONSTANT}", stage="lower")
            tensors[v.id] = const_compute(np.asarray(data), "body_const")
        return tensors[v.id]

    for node in g.nodes:
        lower_node = lowering_of(node)
        if (lower_node is None or not any(node.inputs)) and all(
                v is None or inf.known_value(v) is not None for v in node.outputs):
            continue  # a Constant, or known and not lowerable: enters as a constant where read
        if lower_node is None or list(node.subgraphs()):
            ctx.fail(f"{what}: {node.op} node {node.name!r} has no native lowering to inline",
                     stage="lower")
        for v in node.inputs + node.outputs:
            if v is not None and not (isinstance(v.type, TensorType) and v.type.is_static):
                ctx.fail(f"{what}: {node.op} node {node.name!r}: %{v.name} has no static "
                         f"shape ({v.type})", stage="lower")
        sub = LowerCtx(node, g.opset(node.domain), [None if v is None else v.type for v in node.inputs],
                       [None if v is None else v.type for v in node.outputs],
                       [inf.known_value(v) for v in node.inputs])
        res = lower_node(sub, *[None if v is None else tensor(v) for v in node.inputs])
        if isinstance(res, ExternKernel):
            ctx.fail(f"{what}: {node.op} node {node.name!r} lowers to a hand-written kernel, "
                     "which cannot be inlined", stage="lower")
        outs = list(res) if isinstance(res, (list, tuple)) else [res]
        for v, t in zip(node.outputs, outs):
            if v is not None:
                tensors[v.id] = t
    return [tensor(v) for v in g.outputs]
