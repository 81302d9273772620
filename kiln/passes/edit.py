"""Graph editing the passes share: use counts, value replacement, fresh names, new nodes.

Values are identified by object identity (`Value.id`); names are labels for
printing, kept unique so the text form parses back.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterator

import numpy as np

from kiln.graph.deferred import Deferred
from kiln.graph.ir import Graph, Node, Value, const_value
from kiln.graph.types import TensorType, Type, dims_compatible
from kiln.ops.infer import Inferencer


def reads(node: Node) -> Iterator[Value]:
    """Every value `node` reads: its inputs, and what its subgraphs read from outside them."""
    for v in node.inputs:
        if v is not None:
            yield v
    for g in node.subgraphs():
        for n in g.nodes:
            yield from reads(n)
        yield from g.outputs


def producers(graph: Graph) -> dict[int, Node]:
    """Value id -> the top-level node that produces it (absent outputs skipped)."""
    return {v.id: n for n in graph.nodes for v in n.outputs if v is not None}


def use_counts(graph: Graph) -> Counter:
    """Value id -> number of reads (node inputs at any depth, graph outputs count too)."""
    counts: Counter = Counter()
    for n in graph.nodes:
        counts.update(v.id for v in reads(n))
    counts.update(v.id for v in graph.outputs)
    return counts


def all_names(graph: Graph) -> set[str]:
    names = {v.name for v in graph.inputs} | {v.name for v in graph.constants()}
    for _, n in graph.walk():
        names.add(n.name)
        names.update(v.name for v in n.outputs if v is not None)
        for g in n.subgraphs():
            names.update(v.name for v in g.inputs)
    return names


class Namer:
    """Fresh value and node names that clash with nothing in the graph (subgraphs included)."""

    def __init__(self, graph: Graph):
        self.taken = all_names(graph)

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name


def new_node(graph: Graph, op: str, inputs: list[Value | None], name: str,
             out_names: list[str], attrs: dict | None = None, domain: str = "") -> Node:
    """A node with fresh output values whose types are inferred from its inputs (an op of
    another domain, kiln's own, at version 1 unless the graph imports that domain; a pass
    that commits one adds the import)."""
    node = Node(op, list(inputs), [Value(n, None) for n in out_names], dict(attrs or {}), name, domain)
    Inferencer(graph.opsets if not domain or domain in graph.opsets else {**graph.opsets, domain: 1}).infer_node(node)
    return node


def hoist(graph: Graph, node: Node) -> None:
    """Move `node` to just after the last producer of its inputs (the graph stays in
    topological order). The partitioner joins a node to its producer's group only when that
    group is the latest kernel, so a node that must fuse with its producer should follow it."""
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    made = {v.id: pos[id(n)] for n in graph.nodes for v in n.outputs if v is not None}
    at = max((made.get(v.id, -1) for v in node.inputs if v is not None), default=-1) + 1
    graph.nodes.remove(node)
    graph.nodes.insert(at, node)


def new_const(namer: Namer, base: str, data: np.ndarray | Deferred) -> Value:
    if isinstance(data, Deferred):     # (made C-contiguous, when it is made)
        return const_value(namer.fresh(base), data)
    data = np.asarray(data)
    return const_value(namer.fresh(base), data if data.flags.c_contiguous else data.copy(order="C"))


def same_type(a: Type | None, b: Type | None) -> bool:
    """Provably the same type: equal dtype and known rank and dims (a symbol equals only
    itself; two unknown shapes are not known to be equal)."""
    return a is not None and a == b and _known_shapes(a)


def _known_shapes(t: Type) -> bool:
    return t.shape is not None if isinstance(t, TensorType) else _known_shapes(t.elem)


def refines(new: Type | None, old: Type | None) -> bool:
    """Could a value of type `new` stand where `old` was recorded? (symbols match anything)"""
    if not isinstance(new, TensorType) or not isinstance(old, TensorType):
        return new is not None and new == old
    if new.dtype != old.dtype:
        return False
    if new.shape is None or old.shape is None:
        return new.shape is None and old.shape is None
    return len(new.shape) == len(old.shape) and all(map(dims_compatible, new.shape, old.shape))


def can_replace(graph: Graph, old: Value, new: Value) -> bool:
    """May every use of `old` read `new` instead? A graph output keeps its name, so it
    may only be handed to a value that a top-level node produces and that is not
    already a graph output (that value takes the output's name)."""
    if not any(v is old for v in graph.outputs):
        return True
    if new.is_const or any(v is new for v in graph.outputs):
        return False
    return any(v is new for n in graph.nodes for v in n.outputs)


def replace_value(graph: Graph, old: Value, new: Value) -> None:
    """Every read of `old` (subgraphs included) reads `new`; check `can_replace` first."""
    replace_values(graph, {old.id: new})


def replace_values(graph: Graph, mapping: dict[int, Value]) -> None:
    """Every read of a value whose id is in `mapping` reads its replacement instead, in one
    walk; a replaced graph output passes its name to its replacement."""
    for v in graph.outputs:
        if v.id in mapping:
            mapping[v.id].name = v.name
    _substitute(graph, mapping)


def _substitute(g: Graph, mapping: dict[int, Value]) -> None:
    g.outputs = [mapping.get(v.id, v) for v in g.outputs]
    for n in g.nodes:
        if any(v is not None and v.id in mapping for v in n.inputs):
            n.inputs = [v if v is None else mapping.get(v.id, v) for v in n.inputs]
        for sg in n.subgraphs():
            _substitute(sg, mapping)


def remove_nodes(graph: Graph, dead: set[int]) -> None:
    """Drop the nodes whose `id()` is in `dead`."""
    graph.nodes = [n for n in graph.nodes if id(n) not in dead]


def const_scalar(v: Value | None) -> float | None:
    """The number a one-element numeric constant holds, else None."""
    if v is None or v.const is None or v.const.size != 1 or v.const.dtype.kind in "OSU":
        return None
    return float(v.const.astype(np.float64).reshape(()))


def is_float(v: Value) -> bool:
    return isinstance(v.type, TensorType) and v.type.dtype.is_float


def static_shape(v: Value) -> tuple[int, ...] | None:
    t = v.type
    return tuple(t.shape) if isinstance(t, TensorType) and t.is_static else None


def per_image_shape(v: Value) -> tuple | None:
    """v's shape when its sizes are ints, but for a leading symbol (a batch): the layout is
    per image, so a symbolic batch stays a symbol through the rewrite (a shape-generic module,
    kiln.lower.generic), and decisions that would read the batch read one image."""
    t = v.type
    if not isinstance(t, TensorType) or t.shape is None or not t.shape:
        return None
    shape = tuple(t.shape)
    return shape if all(isinstance(d, int) for d in shape[1:]) and isinstance(shape[0], (int, str)) else None


def images(n) -> int:
    """The batch a decision reads: its size, or one image for a symbolic batch (its smallest)."""
    return n if isinstance(n, int) else 1
