"""Constant folding: a node whose inputs are all constants is evaluated now.

The node's own NumPy reference (`lookup(...).run`) computes the data, so folding
means exactly what running would; ops that can tell their result from types
alone (`Shape` or `Size` of a static tensor) are folded through their `value`
hook. The node's outputs become constants (same Values, so readers and names are
untouched) and the node goes.

Not folded: random ops (and Dropout, whose inference form NOP elimination
removes), nodes with subgraphs, nodes producing graph outputs (a graph output
stays the output of a node), and results that would duplicate weights: a result
above `SMALL` elements is folded only if it is at most `max_elements` and not
larger than its inputs together, and no large input is still read elsewhere.
"""

from __future__ import annotations

import math

import numpy as np

from kiln.dtypes import DType
from kiln.graph.ir import Graph, Node
from kiln.graph.types import TensorType
from kiln.ops.registry import InferCtx, RunCtx, lookup
from kiln.passes.edit import reads, refines, use_counts
from kiln.passes.registry import PassContext, graph_pass

NONDETERMINISTIC = {"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike",
                    "Bernoulli", "Multinomial", "Dropout"}
SMALL = 4096                 # results this small (shape arithmetic, scalars) always fold
MAX_ELEMENTS = 1 << 20       # the cap on any folded result


@graph_pass("fold_constants")
def fold_constants(graph: Graph, ctx: PassContext, max_elements: int = MAX_ELEMENTS) -> Graph:
    """Evaluate nodes whose inputs are all constants (size-capped so weights are not duplicated)."""
    counts = use_counts(graph)
    outputs = {v.id for v in graph.outputs}
    kept = []
    for n in graph.nodes:
        data = _evaluate(graph, n, outputs, counts, max_elements)
        if data is None:
            kept.append(n)
            continue
        for v, a in zip(n.outputs, data):
            if v is not None:
                v.const, v.type = a, TensorType(DType.from_numpy(a.dtype), tuple(a.shape))
        for v in reads(n):
            counts[v.id] -= 1
        ctx.tally({n.op: 1})
    graph.nodes = kept
    return graph


def _evaluate(graph: Graph, n: Node, outputs: set[int], counts, max_elements: int):
    """The node's output data if it may be folded, else None."""
    if (n.domain or n.op in NONDETERMINISTIC or any(True for _ in n.subgraphs())
            or any(v is not None and (v.id in outputs or not isinstance(v.type, TensorType))
                   for v in n.outputs)):
        return None
    if not _estimate_fits(n, max_elements):
        return None
    d = lookup(n.domain, n.op)
    opset = graph.opset(n.domain)
    values = [None if v is None else v.const for v in n.inputs]
    try:
        if all(v is None or a is not None for v, a in zip(n.inputs, values)):
            res = d.run(RunCtx(n, opset), *values)
            data = list(res) if isinstance(res, (tuple, list)) else [res]
        elif d.value is not None:
            types = [None if v is None else v.type for v in n.inputs]
            data = d.value(InferCtx(n, opset, types, values))
        else:
            return None
    except Exception:
        return None  # folding is opportunistic: running the model reports real errors
    if data is None or len(data) < len(n.outputs):
        return None
    data = data[:len(n.outputs)]
    for v, a in zip(n.outputs, data):
        if v is not None and not (isinstance(a, np.ndarray) and _fits(a, v.type)):
            return None
    return data if _small_enough(n, data, counts, max_elements) else None


def _estimate_fits(n: Node, max_elements: int) -> bool:
    """Whether the node's outputs, sized by their inferred types, may be folded at all:
    decided before computing, so a 100-byte ConstantOfShape of 2^30 floats allocates
    nothing. An output whose size inference could not pin down is not folded either."""
    size = 0
    for v in n.outputs:
        if v is None:
            continue
        if v.type.shape is None or not all(isinstance(d, int) for d in v.type.shape):
            return False
        size += math.prod(v.type.shape)
    return size <= max(max_elements, SMALL)


def _fits(a: np.ndarray, t: TensorType) -> bool:
    try:
        got = TensorType(DType.from_numpy(a.dtype), tuple(a.shape))
    except Exception:
        return False
    return refines(got, t)


def _small_enough(n: Node, data, counts, max_elements: int) -> bool:
    size = sum(a.size for v, a in zip(n.outputs, data) if v is not None)
    if size <= SMALL:
        return True
    consts = {v.id: v for v in n.inputs if v is not None and v.const is not None}
    if size > max_elements or size > sum(v.const.size for v in consts.values()):
        return False
    own = [v.id for v in n.inputs if v is not None]
    return all(v.const.size <= SMALL or counts[v.id] == own.count(v.id) for v in consts.values())
