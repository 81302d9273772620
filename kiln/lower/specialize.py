"""Specialise a graph to concrete input shapes (and, where shapes need them, input values).

kiln compiles kernels for concrete shapes. A graph with symbolic dims is cloned
and re-inferred with the shapes of the first call (specialise-and-cache, like
torch.compile). When some shape still depends on an input's *data* (a Reshape
whose target shape is a graph input, a Slice with runtime starts), small integer
inputs are specialised to their values too; the cache key then includes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kiln.dtypes import DType
from kiln.errors import KilnError
from kiln.graph.ir import Graph, Node, Value
from kiln.graph.types import TensorType
from kiln.lower.module import is_runtime_op
from kiln.ops.infer import Inferencer

VALUE_INPUT_MAX_ELEMENTS = 64


def specialize(graph: Graph, shapes: list[tuple[int, ...]],
               values: dict[int, np.ndarray]) -> tuple[Graph, dict[int, np.ndarray]]:
    """A clone of `graph` with input i of shape `shapes[i]` (value `values[i]` if given),
    every type re-inferred; returns it with the compile-time known values."""
    g = graph.clone()
    for v, shape in zip(g.inputs, shapes):
        if isinstance(v.type, TensorType):
            v.type = TensorType(v.type.dtype, tuple(int(d) for d in shape))
    inf = Inferencer(g.opsets)
    for i, x in values.items():
        inf.known[g.inputs[i].id] = x
    inf.infer_graph(g)
    return g, inf.known


def dynamic_values(graph: Graph) -> list[Value]:
    """Values (node outputs and graph outputs) whose type is not a static tensor."""
    out = [v for _, n in graph.walk() for v in n.outputs
           if v is not None and not (isinstance(v.type, TensorType) and v.type.is_static)]
    return out + [v for v in graph.outputs if v not in out and not (
        isinstance(v.type, TensorType) and v.type.is_static)]


def value_inputs(inputs: list) -> tuple[int, ...]:
    """Indices of inputs small enough to specialise on their values (used only when some
    shape is still unknown: OneHot's depth, Range's bounds, Reshape's target...)."""
    return tuple(i for i, x in enumerate(inputs)
                 if isinstance(x, np.ndarray) and _numeric(x.dtype)
                 and x.size <= VALUE_INPUT_MAX_ELEMENTS)


def _numeric(dt: np.dtype) -> bool:
    """Integers, bools and floats, the storage-only ones (bfloat16, float8) included."""
    if dt.kind in "iubf":
        return True
    try:
        d = DType.from_numpy(dt)
    except KilnError:
        return False
    return d.is_float or d.is_int


@dataclass(frozen=True)
class Break:
    """A node that cannot join a static native module, so the graph runs in stages
    (kiln.targets.cpu.Staged): a runtime op (control flow, sequence/optional containers)
    or a node whose output sizes depend on data."""
    index: int          # in graph.nodes
    node: Node
    runtime: bool       # a runtime op (else: data-dependent output sizes)
    origin: bool        # the trouble starts here (a runtime op, or dynamic outputs from static inputs)

    def __str__(self) -> str:
        n = self.node
        if self.runtime:
            return f"{n.op} node {n.name!r} is control flow or a sequence op (the cpu target runs it in stages)"
        return f"{n.op} node {n.name!r} makes an output whose size depends on input values"


def stage_breaks(graph: Graph) -> list[Break]:
    """Every node of a specialised graph that breaks it into stages (empty: one native
    module runs it all). The one answer to "does this graph need stages?"."""
    dyn = {v.id for v in dynamic_values(graph)}
    out = []
    for k, n in enumerate(graph.nodes):
        runtime = is_runtime_op(n)
        if runtime or any(v is not None and v.id in dyn for v in n.outputs):
            origin = runtime or not any(v is not None and v.id in dyn for v in n.inputs)
            out.append(Break(k, n, runtime, origin))
    return out


def require_static(graph: Graph) -> None:
    dyn = dynamic_values(graph)
    if dyn:
        names = ", ".join(f"%{v.name}: {v.type}" for v in dyn[:8])
        raise KilnError(f"{len(dyn)} value(s) have shapes that depend on data at run time "
                        f"({names}{', ...' if len(dyn) > 8 else ''}); native code needs them "
                        "known when the model is specialised", stage="specialize")
