"""The graph-level IR: a typed SSA DAG of operator nodes.

- A `Value` is produced once: by a node, as a graph input, or as a constant
  (a value with `const` data attached; weights are constants, not inputs).
- `Graph.nodes` is kept in topological order.
- Subgraphs (If/Loop/Scan bodies) are `Graph`s stored in node attributes; they
  may read values of enclosing graphs directly (captures).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from kiln.graph.deferred import Deferred
from kiln.graph.types import TensorType, Type

_ids = itertools.count()


@dataclass(eq=False)
class Value:
    name: str
    type: Type
    # the data of a constant (else None); a kiln.graph.deferred.Deferred given here is made
    # when `const` is first read (`deferred`: it, while it is not made)
    const: np.ndarray | None = None
    id: int = field(default_factory=lambda: next(_ids), repr=False)

    @property
    def is_const(self) -> bool:
        return self._data is not None

    @property
    def deferred(self) -> Deferred | None:
        """The constant's Deferred data while the array is not made (else None)."""
        d = self._data
        return d if isinstance(d, Deferred) and d.made is None else None

    @property
    def data(self) -> np.ndarray | Deferred | None:
        """The constant's data as given: an array, or a Deferred left as it is (a copy of the
        Value keeps it deferred)."""
        return self._data

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


def _get_const(v: Value) -> np.ndarray | None:
    d = v._data
    return d.value() if isinstance(d, Deferred) else d


def _set_const(v: Value, data) -> None:
    v._data = data


# `const` is a dataclass field (Value(name, type, const) as before) read through a property:
# a Deferred is made on the first read
Value.const = property(_get_const, _set_const, doc="The constant's data (a Deferred made here), or None.")


@dataclass(eq=False)
class Node:
    op: str
    inputs: list[Value | None]
    outputs: list[Value]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    domain: str = ""

    @property
    def qualified_op(self) -> str:
        return f"{self.domain}::{self.op}" if self.domain else self.op

    def subgraphs(self) -> Iterator["Graph"]:
        for v in self.attrs.values():
            if isinstance(v, Graph):
                yield v
            elif isinstance(v, list) and v and isinstance(v[0], Graph):
                # attribute lists are homogeneous (ONNX GRAPHS): a list of numbers, such as a
                # tree ensemble's 100,000 node values, is skipped at its first element
                yield from (g for g in v if isinstance(g, Graph))

    def __repr__(self) -> str:
        ins = ", ".join("_" if v is None else f"%{v.name}" for v in self.inputs)
        outs = ", ".join(f"%{v.name}" for v in self.outputs)
        return f"{outs} = {self.qualified_op}({ins})  # {self.name}"


@dataclass(eq=False)
class Graph:
    name: str
    inputs: list[Value]
    outputs: list[Value]
    nodes: list[Node] = field(default_factory=list)
    opsets: dict[str, int] = field(default_factory=dict)

    def opset(self, domain: str = "") -> int:
        return self.opsets.get(domain, 0)

    def walk(self) -> Iterator[tuple["Graph", Node]]:
        """Every (graph, node) pair, subgraphs included, outer nodes first."""
        for n in self.nodes:
            yield self, n
            for g in n.subgraphs():
                yield from g.walk()

    def constants(self) -> list[Value]:
        """Constants read anywhere in this graph or its subgraphs, in first-use order."""
        seen: dict[int, Value] = {}

        def visit(g: Graph):
            for n in g.nodes:
                for v in n.inputs:
                    if v is not None and v.is_const:
                        seen.setdefault(v.id, v)
                for sg in n.subgraphs():
                    visit(sg)
            for v in g.outputs:
                if v.is_const:
                    seen.setdefault(v.id, v)

        visit(self)
        return list(seen.values())

    def producers(self) -> dict[int, Node]:
        return {v.id: n for n in self.nodes for v in n.outputs}

    def consumers(self) -> dict[int, list[Node]]:
        out: dict[int, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                if v is not None:
                    out.setdefault(v.id, []).append(n)
        return out

    def clone(self) -> "Graph":
        """A copy with fresh Values and Nodes (constant data shared), so inference or a
        pass may rewrite the copy's types and nodes without touching this graph."""
        return _clone(self, {})

    def __str__(self) -> str:
        return _PRINTER[0](self)


# How a Graph prints: kiln.graph.text, which imports this module, registers its printer here
# (`register_printer`) when it is imported, and the kiln.graph package imports it first, so it
# is in place whenever a Graph exists. The IR does not import its printer.
_PRINTER: list = []


def register_printer(fn) -> None:
    """Make `fn(graph) -> str` what `str(graph)` returns (kiln.graph.text's print_graph)."""
    _PRINTER[:] = [fn]


def _clone(g: Graph, vmap: dict[int, Value]) -> Graph:
    def val(v: Value | None) -> Value | None:
        if v is None:
            return None
        if v.id not in vmap:
            vmap[v.id] = Value(v.name, v.type, v.data)
        return vmap[v.id]

    def attr(a):
        if isinstance(a, Graph):
            return _clone(a, vmap)
        if isinstance(a, list):
            return [attr(x) for x in a] if a and isinstance(a[0], (Graph, list)) else list(a)
        return a

    inputs = [val(v) for v in g.inputs]
    nodes = [Node(n.op, [val(v) for v in n.inputs], [val(v) for v in n.outputs],
                  {k: attr(a) for k, a in n.attrs.items()}, n.name, n.domain) for n in g.nodes]
    return Graph(g.name, inputs, [val(v) for v in g.outputs], nodes, dict(g.opsets))


def const_value(name: str, data: np.ndarray | Deferred) -> Value:
    """A constant Value whose type is read off its data (a Deferred stays deferred)."""
    from kiln.dtypes import DType
    data = data if isinstance(data, Deferred) else np.asarray(data)
    return Value(name, TensorType(DType.from_numpy(data.dtype), tuple(data.shape)), data)
