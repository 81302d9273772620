"""Type and shape inference over a whole graph, using each op's `infer`.

Alongside types, small tensors whose data is known at compile time (constants,
`Shape` of a static tensor, arithmetic on those) are propagated as *known
values*, so shape-computing subgraphs (`Reshape(x, Concat(Shape(x)[0], -1))`)
still give static shapes. Known values never change the graph; folding them
into constants is the constant-folding pass's job.
"""

from __future__ import annotations

import functools
import inspect
import math

import numpy as np

from kiln.errors import DTypeMismatchError, KilnError, UnsupportedOpsError
from kiln.graph.ir import Graph, Node, Value
from kiln.graph.types import OptionalType, SequenceType, TensorType, Type, types_compatible
from kiln.ops.registry import InferCtx, RunCtx, lookup
from kiln.ops.type_constraints import dtype_mismatches

# Known values are only computed for outputs at most this many elements.
_KNOWN_VALUE_LIMIT = 4096


def unsupported_ops(graph: Graph) -> list[tuple[str, str, str, int]]:
    """Every node (subgraphs included) whose op kiln has no definition for."""
    missing = []
    for g, n in graph.walk():
        if lookup(n.domain, n.op) is None:
            missing.append((n.domain, n.op, n.name, graph.opset(n.domain)))
    return missing


def check_supported(graph: Graph) -> None:
    missing = unsupported_ops(graph)
    if missing:
        raise UnsupportedOpsError(missing)


class Inferencer:
    """Walks a graph in order, assigning inferred types to every node output."""

    def __init__(self, opsets: dict[str, int], collect: bool = False):
        self.opsets = opsets
        self.known: dict[int, np.ndarray] = {}
        # inputs of the wrong element type (kiln.ops.type_constraints): raised at once, or, when
        # `collect`, gathered here for infer_types to list them all
        self.mismatches: list | None = [] if collect else None

    def known_value(self, v: Value | None) -> np.ndarray | None:
        if v is None:
            return None
        if v.is_const:   # (data still deferred, a weight transform's, is made where it is written)
            return v.const if v.deferred is None else None
        return self.known.get(v.id)

    def infer_graph(self, graph: Graph, input_types: list[Type] | None = None) -> list[Type]:
        if input_types is not None:
            if len(input_types) != len(graph.inputs):
                raise KilnError(f"subgraph {graph.name!r} takes {len(graph.inputs)} inputs, "
                                f"given {len(input_types)}")
            for v, t in zip(graph.inputs, input_types):
                v.type = t
        for node in graph.nodes:
            self.infer_node(node)
        return [v.type for v in graph.outputs]

    def infer_node(self, node: Node) -> None:
        d = lookup(node.domain, node.op)
        if d is None:
            raise UnsupportedOpsError([(node.domain, node.op, node.name,
                                        self.opsets.get(node.domain, 0))])
        opset = self.opsets.get(node.domain or "", 0)
        check_arity(d, node)
        types = [None if v is None else v.type for v in node.inputs]
        self._check_dtypes(node, opset, types)
        values = [self.known_value(v) for v in node.inputs]
        ctx = InferCtx(node, opset, types, values, self.infer_graph)
        try:
            out_types = d.infer(ctx)
        except KilnError:
            raise
        except Exception as e:  # an op's inference crashed: still name the node
            raise KilnError(f"type inference failed: {type(e).__name__}: {e}",
                            node=node.name, op=node.op, stage="infer") from e
        if len(out_types) < sum(1 for v in node.outputs if v is not None):
            ctx.fail(f"inference gave {len(out_types)} output types for "
                     f"{len(node.outputs)} outputs", stage="infer")
        for v, t in zip(node.outputs, out_types):
            if v is not None:
                v.type = t
        self._propagate_values(d, ctx, node, values)

    def _check_dtypes(self, node: Node, opset: int, types: list) -> None:
        bad = [(node.name, node.op, i, node.inputs[i].name, var, str(want), str(got), j, node.inputs[j].name)
               for i, var, want, got, j in dtype_mismatches(node, opset, types)]
        if bad and self.mismatches is None:
            raise DTypeMismatchError(bad)
        if bad:
            self.mismatches.extend(bad)   # (the op's own inference may still give a type: go on)

    def _propagate_values(self, d, ctx, node: Node, values) -> None:
        outs = None
        if d.value is not None:
            outs = d.value(ctx)
        elif (node.inputs and all(v is None or val is not None for v, val in zip(node.inputs, values))
              and not list(node.subgraphs()) and node.op not in _NONDETERMINISTIC
              and all(_small(v) for v in node.outputs)):
            try:
                res = d.run(RunCtx(node, ctx.opset), *values)
            except Exception:
                return  # inference of values is opportunistic; run time reports real errors
            outs = list(res) if isinstance(res, (tuple, list)) else [res]
        if outs:
            for v, val in zip(node.outputs, outs):
                if v is not None and isinstance(val, np.ndarray) and val.size <= _KNOWN_VALUE_LIMIT:
                    self.known[v.id] = val


@functools.lru_cache(maxsize=None)
def _arity(run) -> tuple[int, float]:
    """(fewest, most) inputs the reference function takes after its ctx."""
    params = list(inspect.signature(run).parameters.values())[1:]
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        most = math.inf
    else:
        most = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    fewest = sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                 for p in params)
    return fewest, most


def check_arity(d, node: Node) -> None:
    """A node with more inputs than its op takes, or fewer than it needs, is refused here
    (rather than as a TypeError wherever the op first runs)."""
    fewest, most = _arity(d.run)
    n = len(node.inputs)
    if n > most or n < fewest:
        want = f"{fewest} to {most}" if most != math.inf and most != fewest else (
            f"{fewest}" if most == fewest else f"at least {fewest}")
        raise KilnError(f"takes {want} inputs, the node has {n}", node=node.name, op=node.op,
                        stage="infer")


_NONDETERMINISTIC = {"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike",
                     "Bernoulli", "Multinomial", "Dropout"}


def _small(v: Value | None) -> bool:
    if v is None or not isinstance(v.type, TensorType) or not v.type.is_static:
        return False
    return math.prod(v.type.shape) <= _KNOWN_VALUE_LIMIT  # (np.prod would wrap for huge shapes)


def infer_types(graph: Graph, declared: dict[str, Type] | None = None) -> dict[int, np.ndarray]:
    """Infer every value's type in place; return the known compile-time values.

    `declared` maps graph-output names to the types the model declares; a
    declared type that contradicts the inferred one is an error (declared
    shapes are never trusted, only checked).
    """
    check_supported(graph)
    inf = Inferencer(graph.opsets, collect=True)
    try:
        inf.infer_graph(graph)
    except KilnError:
        if inf.mismatches:   # the first wrong input type is the cause: name them all
            raise DTypeMismatchError(inf.mismatches) from None
        raise
    if inf.mismatches:
        raise DTypeMismatchError(inf.mismatches)
    for v in graph.outputs:
        want = (declared or {}).get(v.name)
        if want is not None and not _declared_ok(v.type, want):
            raise KilnError(f"graph output {v.name!r} is declared as {want} but the model "
                            f"computes {v.type}", stage="infer")
    return inf.known


def _declared_ok(got: Type, want: Type) -> bool:
    if isinstance(got, TensorType) and isinstance(want, TensorType):
        return got.dtype == want.dtype  # shapes: declared ones are often stale; dtype must agree
    if isinstance(want, (SequenceType, OptionalType)):
        return True
    return types_compatible(got, want)
